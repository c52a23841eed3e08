//! The image store of a node: OCI blobs kept by digest and verified while they are written
//! ([`BlobStore`]), layers unpacked once each into a directory an overlay mount can stack
//! ([`LayerStore`], [`unpack`]), and images read from an OCI image layout ([`layout`]).
//!
//! Nothing is ever half-written: a blob is streamed into a temporary file and renamed into
//! place only when its digest matches; a layer is unpacked into a temporary directory and
//! renamed into place only when the whole tarball unpacked. A layer can never write outside
//! its directory: paths with `..`, links through symlinks and device nodes are refused
//! ([`unpack`]). OCI whiteouts become overlayfs whiteouts (a 0/0 character device) and
//! opaque directories get `trusted.overlay.opaque`, so the kernel's overlay merges the
//! layers exactly as the OCI spec says.
//!
//! Not yet here: pulling from registries, the runtime's use of the layers, garbage
//! collection (see issue M2-B).

mod digest;
pub mod layout;
mod store;
pub mod unpack;

pub use digest::{Digest, DigestError};
pub use store::{BlobStore, LayerStore, StoreError};
