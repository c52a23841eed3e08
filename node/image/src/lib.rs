//! The image store of a node: OCI blobs kept by digest and verified while they are written
//! ([`BlobStore`]), layers unpacked once each into a directory an overlay mount can stack
//! ([`LayerStore`], [`unpack`]), and images read from an OCI image layout ([`layout`]) or
//! pulled from a registry ([`pull`]).
//!
//! Nothing is ever half-written: a blob is streamed into a temporary file and renamed into
//! place only when its digest matches; a layer is unpacked into a temporary directory and
//! renamed into place only when the whole tarball unpacked. A layer can never write outside
//! its directory: every path is resolved from a directory fd without following symlinks, and
//! paths with `..`, links through symlinks, device nodes and whiteouts of `..`, `.` or an
//! empty name are refused ([`unpack`]; property-tested and fuzzed in the `fuzzing` module's
//! sandbox). OCI whiteouts become overlayfs whiteouts (a 0/0 character device) and opaque
//! directories get `trusted.overlay.opaque`, so the kernel's overlay merges the layers
//! exactly as the OCI spec says.
//!
//! Garbage collection ([`gc`]) removes unused images with the kubelet's policy.
//!
//! [`process`] holds Kubernetes' rules for what a container of an image runs; [`auth`] reads
//! registry credentials from a Docker `config.json`; [`ImageStore`] puts the two stores under
//! one root with the names pulled into them, and `skiff-node image pull|ls|rm` is its command
//! line. Manifest and configuration types are `oci-spec`'s. The store knows nothing of the
//! API's types, pods or the runtime, and writes nothing outside its root.

pub mod auth;
mod digest;
/// A layer unpacked beside sentinels, for the property test and `cargo fuzz` (feature
/// `fuzzing`).
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod gc;
mod images;
pub mod layout;
pub mod process;
pub mod pull;
mod store;
pub mod unpack;

pub use digest::{Digest, DigestError};
pub use images::{ImageRecord, ImageStore};
pub use layout::Image;
pub use store::{BlobStore, BlobWriter, LayerStore, StoreError};
