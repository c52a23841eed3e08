//! The node's images: the blob and layer stores under one root, and the names pulled into
//! them (`<root>/images.json`, replaced atomically), as `crictl images` lists them.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::layout::Image;
use crate::store::{BlobStore, LayerStore, StoreError};

/// One name the node has pulled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    /// As it was pulled (`registry/repository:tag` or `@sha256:...`).
    pub name: String,
    /// The manifest digest it resolved to.
    pub digest: String,
    /// Bytes of its blobs.
    pub size: u64,
    /// Its layer digests, bottom first.
    pub layers: Vec<String>,
    /// Seconds since the epoch.
    pub pulled_at: u64,
    /// When a container last started from it (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used: Option<u64>,
}

/// Seconds since the epoch.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Blobs, layers and the names of a node's images.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
    pub blobs: BlobStore,
    pub layers: LayerStore,
}

impl ImageStore {
    pub fn open(root: &Path) -> Result<ImageStore, StoreError> {
        Ok(ImageStore {
            root: root.to_path_buf(),
            blobs: BlobStore::open(root)?,
            layers: LayerStore::open(root)?,
        })
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Records that a container starts from image `digest` now (for garbage collection).
    pub fn mark_used(&self, digest: &crate::Digest) -> Result<(), StoreError> {
        let d = digest.to_string();
        let now = now_secs();
        self.update(|list| {
            let mut changed = false;
            for r in list.iter_mut().filter(|r| r.digest == d) {
                r.last_used = Some(now);
                changed = true;
            }
            (changed, ())
        })
    }

    /// Reads the index, lets `change` edit it and saves it when `change` says it changed, as
    /// one step: pods pull (and start) concurrently, and two read-modify-writes of the one
    /// index file that overlap would lose one of the records.
    fn update<R>(
        &self,
        change: impl FnOnce(&mut Vec<ImageRecord>) -> (bool, R),
    ) -> Result<R, StoreError> {
        // One lock for the process: an agent has one store, and index writes are rare.
        static INDEX: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _alone = INDEX.lock().unwrap_or_else(|e| e.into_inner());
        let mut list = self.list()?;
        let (changed, out) = change(&mut list);
        if changed {
            self.save(&list)?;
        }
        Ok(out)
    }

    /// The config digest (hex) named by the stored manifest `manifest`.
    pub(crate) fn config_digest(&self, manifest: &crate::Digest) -> Option<String> {
        let bytes = self.blobs.read(manifest).ok()?;
        let m: oci_spec::image::ImageManifest = serde_json::from_slice(&bytes).ok()?;
        Some(m.config().digest().digest().to_string())
    }

    fn index(&self) -> PathBuf {
        self.root.join("images.json")
    }

    /// The names pulled, sorted.
    pub fn list(&self) -> Result<Vec<ImageRecord>, StoreError> {
        let path = self.index();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        let mut list: Vec<ImageRecord> =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::Io {
                path: path.clone(),
                source: std::io::Error::other(e),
            })?;
        list.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(list)
    }

    pub(crate) fn save(&self, list: &[ImageRecord]) -> Result<(), StoreError> {
        let path = self.index();
        let tmp = self
            .root
            .join(format!(".images.json.{}", std::process::id()));
        let io = |source| StoreError::Io {
            path: tmp.clone(),
            source,
        };
        let json = serde_json::to_vec_pretty(list).map_err(|e| io(std::io::Error::other(e)))?;
        std::fs::write(&tmp, json).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(|source| StoreError::Io { path, source })
    }

    /// Records that `name` is `image` (replacing what the name was before).
    pub fn remember(&self, name: &str, image: &Image) -> Result<ImageRecord, StoreError> {
        let record = ImageRecord {
            name: name.to_string(),
            digest: image.manifest.to_string(),
            size: image.size,
            layers: image.layers.iter().map(|(d, _)| d.to_string()).collect(),
            pulled_at: now_secs(),
            last_used: None,
        };
        self.update(|list| {
            list.retain(|r| r.name != name);
            list.push(record.clone());
            (true, ())
        })?;
        Ok(record)
    }

    /// The image `name` was pulled as, rebuilt from the stored manifest and config (`None`
    /// when the name was never pulled or a blob has gone).
    pub fn image(&self, name: &str) -> Result<Option<Image>, StoreError> {
        let Some(record) = self.list()?.into_iter().find(|r| r.name == name) else {
            return Ok(None);
        };
        let Ok(digest) = record.digest.parse::<crate::Digest>() else {
            return Ok(None);
        };
        let Ok(bytes) = self.blobs.read(&digest) else {
            return Ok(None);
        };
        let bad = |what: &str, e: &dyn std::fmt::Display| StoreError::Io {
            path: self.blobs.path(&digest),
            source: std::io::Error::other(format!("{what}: {e}")),
        };
        let manifest: oci_spec::image::ImageManifest =
            serde_json::from_slice(&bytes).map_err(|e| bad("manifest", &e))?;
        let (config_blob, layer_blobs) =
            crate::layout::blobs_of(&manifest).map_err(|e| bad("manifest", &e))?;
        let Ok(config_bytes) = self.blobs.read(&config_blob.digest) else {
            return Ok(None);
        };
        let config = serde_json::from_slice(&config_bytes).map_err(|e| bad("config", &e))?;
        if layer_blobs
            .iter()
            .any(|(b, _)| !self.blobs.contains(&b.digest))
        {
            return Ok(None);
        }
        let layers = layer_blobs
            .into_iter()
            .map(|(b, c)| (b.digest, c))
            .collect();
        Ok(Some(Image {
            manifest: digest,
            config,
            layers,
            size: record.size,
        }))
    }

    /// Forgets `name`; whether it was there. Its blobs and layers stay until garbage
    /// collection (not yet written) removes what no image names.
    pub fn forget(&self, name: &str) -> Result<bool, StoreError> {
        self.update(|list| {
            let before = list.len();
            list.retain(|r| r.name != name);
            let changed = list.len() != before;
            (changed, changed)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Digest;
    use crate::unpack::Compression;

    #[test]
    fn names_are_remembered_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        assert!(store.list().unwrap().is_empty());
        let image = Image {
            manifest: Digest::of(b"m"),
            config: serde_json::from_str(
                r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#,
            )
            .unwrap(),
            layers: vec![(Digest::of(b"l"), Compression::Gzip)],
            size: 42,
        };
        store.remember("r/a:1", &image).unwrap();
        store.remember("r/b:1", &image).unwrap();
        store.remember("r/a:1", &image).unwrap();
        let names: Vec<String> = store.list().unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["r/a:1", "r/b:1"]);
        assert!(store.forget("r/a:1").unwrap());
        assert!(!store.forget("r/a:1").unwrap());
        assert_eq!(store.list().unwrap().len(), 1);
    }

    /// Pods pull at the same time: every name pulled concurrently is remembered (the index's
    /// read-modify-writes do not overlap and lose records).
    #[test]
    fn concurrent_pulls_keep_every_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let image = Image {
            manifest: Digest::of(b"m"),
            config: serde_json::from_str(
                r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#,
            )
            .unwrap(),
            layers: vec![],
            size: 1,
        };
        std::thread::scope(|s| {
            for t in 0..8 {
                let (root, image) = (root.clone(), image.clone());
                s.spawn(move || {
                    // Each its own handle, as the agent's status and pulls have.
                    let store = ImageStore::open(&root).unwrap();
                    for i in 0..10 {
                        store.remember(&format!("r/t{t}:{i}"), &image).unwrap();
                        store.mark_used(&image.manifest).unwrap();
                    }
                });
            }
        });
        let store = ImageStore::open(&root).unwrap();
        assert_eq!(store.list().unwrap().len(), 80);
    }
}
