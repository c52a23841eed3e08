//! Images from an OCI image layout (a directory with `oci-layout`, `index.json` and
//! `blobs/sha256/`, as `skopeo copy ... oci:DIR:TAG` or `umoci` write it): the manifest a
//! tag names (through an index, the `linux/amd64` one), every blob copied into the
//! [`BlobStore`] and verified on the way, and the layers unpacked into the [`LayerStore`].

use std::fs::File;
use std::path::{Path, PathBuf};

use oci_spec::image::{
    Arch, Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType, Os,
};

use crate::digest::Digest;
use crate::store::{BlobStore, LayerStore, StoreError};
use crate::unpack::{Compression, UnpackError};

/// The annotation naming a tag in an image layout's index.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Why an image could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("{path}: not an OCI image layout: {reason}")]
    NotALayout { path: PathBuf, reason: String },
    #[error("no image tagged {tag:?} in {path} (tags: {tags})")]
    NoSuchTag {
        path: PathBuf,
        tag: String,
        tags: String,
    },
    #[error("{what} {digest}: {reason}")]
    Invalid {
        what: &'static str,
        digest: String,
        reason: String,
    },
    #[error("image index {0} has no linux/amd64 manifest")]
    NoPlatform(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Unpack(#[from] UnpackError),
}

/// An image whose blobs are in the blob store.
#[derive(Debug, Clone)]
pub struct Image {
    /// The digest of its manifest (what a digest reference names).
    pub manifest: Digest,
    pub config: ImageConfiguration,
    /// Layer blobs, bottom first.
    pub layers: Vec<(Digest, Compression)>,
    /// Bytes of all its blobs (manifest, config, layers).
    pub size: u64,
}

impl Image {
    /// Unpacks every layer (once each, shared with other images) and returns the
    /// directories, bottom first: the lower directories of an overlay mount.
    pub fn unpack(
        &self,
        blobs: &BlobStore,
        layers: &LayerStore,
    ) -> Result<Vec<PathBuf>, LayoutError> {
        let diff_ids = self.config.rootfs().diff_ids();
        if diff_ids.len() != self.layers.len() {
            return Err(LayoutError::Invalid {
                what: "image",
                digest: self.manifest.to_string(),
                reason: format!(
                    "its configuration lists {} diff IDs for {} layers",
                    diff_ids.len(),
                    self.layers.len()
                ),
            });
        }
        self.layers
            .iter()
            .zip(diff_ids)
            .map(|((d, c), diff_id)| {
                let diff_id: Digest = diff_id.parse().map_err(|e| LayoutError::Invalid {
                    what: "image",
                    digest: self.manifest.to_string(),
                    reason: format!("its configuration's diff ID: {e}"),
                })?;
                layers
                    .unpack(blobs, d, *c, Some(&diff_id))
                    .map_err(LayoutError::from)
            })
            .collect()
    }
}

/// The linux/amd64 manifest of an index, the one Skiff's nodes run.
pub(crate) fn linux_amd64(index: &ImageIndex) -> Option<&Descriptor> {
    index.manifests().iter().find(|d| {
        d.platform()
            .as_ref()
            .is_some_and(|p| *p.os() == Os::Linux && *p.architecture() == Arch::Amd64)
    })
}

/// A blob a manifest names: its digest and announced size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blob {
    pub digest: Digest,
    pub size: u64,
}

/// The blobs of a manifest, checked once for every way an image arrives (layout, registry,
/// the store): the config, and the layers bottom first with their compression.
pub(crate) fn blobs_of(
    manifest: &ImageManifest,
) -> Result<(Blob, Vec<(Blob, Compression)>), String> {
    let blob = |d: &Descriptor, what: &str| -> Result<Blob, String> {
        let digest = d
            .digest()
            .to_string()
            .parse()
            .map_err(|e| format!("{what} {}: {e}", d.digest()))?;
        Ok(Blob {
            digest,
            size: d.size(),
        })
    };
    let config = blob(manifest.config(), "config")?;
    let layers = manifest
        .layers()
        .iter()
        .map(|l| {
            let compression =
                Compression::of_media_type(l.media_type().as_ref()).map_err(|e| e.to_string())?;
            Ok((blob(l, "layer")?, compression))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((config, layers))
}

fn digest_of(d: &Descriptor, what: &'static str) -> Result<Digest, LayoutError> {
    d.digest()
        .to_string()
        .parse()
        .map_err(|e| LayoutError::Invalid {
            what,
            digest: d.digest().to_string(),
            reason: format!("{e}"),
        })
}

/// Copies the blob `d` from the layout into the store (verifying it) and returns it whole if
/// `read`.
fn import(
    layout: &Path,
    blobs: &BlobStore,
    d: &Descriptor,
    what: &'static str,
) -> Result<Digest, LayoutError> {
    let digest = digest_of(d, what)?;
    import_blob(
        layout,
        blobs,
        &Blob {
            digest,
            size: d.size(),
        },
        what,
    )
}

/// Copies `blob` from the layout into the store, verifying it.
fn import_blob(
    layout: &Path,
    blobs: &BlobStore,
    blob: &Blob,
    what: &'static str,
) -> Result<Digest, LayoutError> {
    let digest = blob.digest.clone();
    let path = layout.join("blobs").join("sha256").join(digest.hex());
    let mut file = File::open(&path).map_err(|e| LayoutError::Invalid {
        what,
        digest: digest.to_string(),
        reason: format!("{}: {e}", path.display()),
    })?;
    blobs.put(&digest, &mut file, blob.size)?;
    Ok(digest)
}

fn parse<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
    digest: &Digest,
) -> Result<T, LayoutError> {
    serde_json::from_slice(bytes).map_err(|e| LayoutError::Invalid {
        what,
        digest: digest.to_string(),
        reason: e.to_string(),
    })
}

/// Reads the image tagged `tag` (or the only one, for `None`) from the layout at `layout`
/// into `blobs`.
pub fn import_image(
    layout: &Path,
    tag: Option<&str>,
    blobs: &BlobStore,
) -> Result<Image, LayoutError> {
    let not_layout = |reason: String| LayoutError::NotALayout {
        path: layout.to_path_buf(),
        reason,
    };
    let marker = std::fs::read_to_string(layout.join("oci-layout"))
        .map_err(|e| not_layout(format!("oci-layout: {e}")))?;
    if !marker.contains("imageLayoutVersion") {
        return Err(not_layout("oci-layout names no imageLayoutVersion".into()));
    }
    let index_bytes = std::fs::read(layout.join("index.json"))
        .map_err(|e| not_layout(format!("index.json: {e}")))?;
    let index: ImageIndex =
        serde_json::from_slice(&index_bytes).map_err(|e| not_layout(format!("index.json: {e}")))?;
    let tag_of = |d: &Descriptor| {
        d.annotations()
            .as_ref()
            .and_then(|a| a.get(REF_NAME))
            .cloned()
    };
    let manifests = index.manifests();
    let chosen = match tag {
        Some(t) => manifests.iter().find(|d| tag_of(d).as_deref() == Some(t)),
        None if manifests.len() == 1 => manifests.first(),
        None => None,
    };
    let Some(chosen) = chosen else {
        return Err(LayoutError::NoSuchTag {
            path: layout.to_path_buf(),
            tag: tag.unwrap_or("").to_string(),
            tags: manifests
                .iter()
                .filter_map(tag_of)
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    let mut size = 0;
    let mut descriptor = chosen.clone();
    // An index: the linux/amd64 manifest.
    if *descriptor.media_type() == MediaType::ImageIndex {
        let digest = import(layout, blobs, &descriptor, "image index")?;
        size += descriptor.size();
        let nested: ImageIndex = parse(&blobs.read(&digest)?, "image index", &digest)?;
        descriptor = linux_amd64(&nested)
            .cloned()
            .ok_or_else(|| LayoutError::NoPlatform(digest.to_string()))?;
    }
    let manifest_digest = import(layout, blobs, &descriptor, "manifest")?;
    size += descriptor.size();
    let manifest: ImageManifest =
        parse(&blobs.read(&manifest_digest)?, "manifest", &manifest_digest)?;
    let (config_blob, layer_blobs) =
        blobs_of(&manifest).map_err(|reason| LayoutError::Invalid {
            what: "manifest",
            digest: manifest_digest.to_string(),
            reason,
        })?;
    let config_digest = import_blob(layout, blobs, &config_blob, "config")?;
    size += config_blob.size;
    let config: ImageConfiguration = parse(&blobs.read(&config_digest)?, "config", &config_digest)?;
    let mut layers = Vec::new();
    for (blob, compression) in &layer_blobs {
        layers.push((import_blob(layout, blobs, blob, "layer")?, *compression));
        size += blob.size;
    }
    Ok(Image {
        manifest: manifest_digest,
        config,
        layers,
        size,
    })
}
