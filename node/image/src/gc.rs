//! Image garbage collection, with the kubelet's policy: an image unused for longer than the
//! maximum age goes; when the disk holding the store is fuller than the high threshold,
//! unused images go, least recently used first, until it is below the low threshold. An
//! image a pod uses (by any of its names or its digest) never goes. Then every blob and
//! unpacked layer that no remaining image references is removed (temporary files of pulls
//! in progress are left alone: the caller keeps pulls and collections apart).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use crate::images::{ImageRecord, ImageStore, now_secs};
use crate::store::StoreError;

/// When images are collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcPolicy {
    /// Disk usage (percent) above which unused images are removed.
    pub high_percent: u8,
    /// Disk usage (percent) the removal aims for.
    pub low_percent: u8,
    /// Unused images older than this are removed whatever the disk usage (`None`: never).
    pub max_unused_age: Option<Duration>,
}

impl Default for GcPolicy {
    /// The kubelet's defaults: 85 % and 80 %, no maximum age.
    fn default() -> Self {
        GcPolicy {
            high_percent: 85,
            low_percent: 80,
            max_unused_age: None,
        }
    }
}

/// What a collection removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The names removed, with the reason (`unused for 3600s`, `disk 91% > 85%`).
    pub removed: Vec<(String, String)>,
    /// Bytes of blobs and layers deleted.
    pub freed_bytes: u64,
}

/// `(used, total)` bytes of the file system holding `path`.
pub fn disk_usage(path: &Path) -> std::io::Result<(u64, u64)> {
    let s = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    let frsize = s.fragment_size();
    let total = s.blocks() * frsize;
    let free = s.blocks_available() * frsize;
    Ok((total.saturating_sub(free), total))
}

fn size_of(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|rd| rd.flatten().map(|e| size_of(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

impl ImageStore {
    /// Collects garbage. `in_use` holds the image references pods use (names or manifest
    /// digests); `usage` reports `(used, total)` bytes of the store's disk and is asked again
    /// after each removal.
    pub fn gc(
        &self,
        policy: &GcPolicy,
        in_use: &HashSet<String>,
        mut usage: impl FnMut() -> std::io::Result<(u64, u64)>,
    ) -> Result<GcReport, StoreError> {
        let mut report = GcReport::default();
        let list = self.list()?;
        // Images by digest: all their names, and when any of them was last used.
        let mut by_digest: BTreeMap<String, Vec<ImageRecord>> = BTreeMap::new();
        for r in list {
            by_digest.entry(r.digest.clone()).or_default().push(r);
        }
        let used = |digest: &str, records: &[ImageRecord]| {
            in_use.contains(digest) || records.iter().any(|r| in_use.contains(&r.name))
        };
        let last_used = |records: &[ImageRecord]| {
            records
                .iter()
                .map(|r| r.last_used.unwrap_or(r.pulled_at))
                .max()
                .unwrap_or(0)
        };
        let mut candidates: Vec<(u64, String)> = by_digest
            .iter()
            .filter(|(d, rs)| !used(d, rs))
            .map(|(d, rs)| (last_used(rs), d.clone()))
            .collect();
        candidates.sort();
        let now = now_secs();
        let mut doomed: Vec<(String, String)> = Vec::new();
        if let Some(age) = policy.max_unused_age {
            candidates.retain(|(t, d)| {
                let idle = now.saturating_sub(*t);
                if idle > age.as_secs() {
                    doomed.push((d.clone(), format!("unused for {idle}s")));
                    false
                } else {
                    true
                }
            });
        }
        let percent =
            |(used, total): (u64, u64)| used.saturating_mul(100).checked_div(total).unwrap_or(0);
        for (d, why) in doomed {
            report.freed_bytes += self.remove_image(&d, &by_digest, &mut report, &why)?;
        }
        let start = usage().map_err(|source| StoreError::Io {
            path: self.root().to_path_buf(),
            source,
        })?;
        if percent(start) > u64::from(policy.high_percent) {
            let why = format!("disk {}% > {}%", percent(start), policy.high_percent);
            for (_, d) in candidates {
                let now_usage = usage().unwrap_or(start);
                if percent(now_usage) < u64::from(policy.low_percent) {
                    break;
                }
                report.freed_bytes += self.remove_image(&d, &by_digest, &mut report, &why)?;
            }
        }
        Ok(report)
    }

    /// Forgets every name of image `digest`, then deletes what nothing references any more.
    fn remove_image(
        &self,
        digest: &str,
        by_digest: &BTreeMap<String, Vec<ImageRecord>>,
        report: &mut GcReport,
        why: &str,
    ) -> Result<u64, StoreError> {
        for r in by_digest.get(digest).into_iter().flatten() {
            self.forget(&r.name)?;
            report.removed.push((r.name.clone(), why.to_string()));
        }
        self.sweep()
    }

    /// Deletes the blobs and layers that no remembered image references; returns the bytes
    /// freed.
    pub fn sweep(&self) -> Result<u64, StoreError> {
        let mut keep_blobs: HashSet<String> = HashSet::new();
        let mut keep_layers: HashSet<String> = HashSet::new();
        for r in self.list()? {
            keep_blobs.insert(hex(&r.digest));
            for l in &r.layers {
                keep_blobs.insert(hex(l));
                keep_layers.insert(hex(l));
            }
            if let Some(img) = self.image(&r.name)?
                && let Some(config) = self.config_digest(&img.manifest)
            {
                keep_blobs.insert(config);
            }
        }
        let mut freed = 0;
        for (dir, keep) in [
            (self.blobs.dir().to_path_buf(), &keep_blobs),
            (self.layers.dir().to_path_buf(), &keep_layers),
        ] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                // Temporaries of pulls and unpacks in progress, and anything not a digest.
                if name.starts_with('.') || name.len() != 64 || keep.contains(&name) {
                    continue;
                }
                let path = e.path();
                let bytes = size_of(&path);
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                match removed {
                    Ok(()) => freed += bytes,
                    Err(source) => return Err(StoreError::Io { path, source }),
                }
            }
        }
        Ok(freed)
    }
}

fn hex(digest: &str) -> String {
    digest.trim_start_matches("sha256:").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Digest;
    use crate::layout::Image;
    use crate::unpack::Compression;

    /// Stores an image of `layers` (names of fake layer contents) with config `tag`, with its
    /// layers "unpacked" (a directory each); returns its manifest digest.
    fn add(store: &ImageStore, name: &str, layers: &[&str]) -> Digest {
        let put = |bytes: &[u8]| {
            let d = Digest::of(bytes);
            store
                .blobs
                .put(&d, &mut &bytes[..], bytes.len() as u64)
                .unwrap();
            d
        };
        let config = format!(
            r#"{{"architecture":"amd64","os":"linux","config":{{"Labels":{{"n":"{name}"}}}},"rootfs":{{"type":"layers","diff_ids":[]}}}}"#
        );
        let config_d = put(config.as_bytes());
        let mut descs = Vec::new();
        for l in layers {
            let d = put(l.as_bytes());
            std::fs::create_dir_all(store.layers.path(&d).join("etc")).unwrap();
            descs.push(format!(
                r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{d}","size":{}}}"#,
                l.len()
            ));
        }
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_d}","size":{}}},"layers":[{}]}}"#,
            config.len(),
            descs.join(",")
        );
        let m = put(manifest.as_bytes());
        let image = Image {
            manifest: m.clone(),
            config: serde_json::from_str(&config).unwrap(),
            layers: layers
                .iter()
                .map(|l| (Digest::of(l.as_bytes()), Compression::Gzip))
                .collect(),
            size: 1,
        };
        store.remember(name, &image).unwrap();
        m
    }

    fn age(store: &ImageStore, name: &str, secs_ago: u64) {
        let mut list = store.list().unwrap();
        for r in list.iter_mut().filter(|r| r.name == name) {
            r.pulled_at = now_secs() - secs_ago;
            r.last_used = None;
        }
        store.save(&list).unwrap();
    }

    #[test]
    fn old_unused_images_go_and_shared_or_used_layers_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let a = add(&store, "r/a:1", &["base", "a-top"]);
        let b = add(&store, "r/b:1", &["base", "b-top"]);
        let c = add(&store, "r/c:1", &["c-only"]);
        for n in ["r/a:1", "r/b:1", "r/c:1"] {
            age(&store, n, 7200);
        }
        let in_use: HashSet<String> = ["r/b:1".to_string()].into();
        let policy = GcPolicy {
            max_unused_age: Some(Duration::from_secs(3600)),
            ..GcPolicy::default()
        };
        let report = store.gc(&policy, &in_use, || Ok((10, 100))).unwrap();
        let mut removed: Vec<&str> = report.removed.iter().map(|(n, _)| n.as_str()).collect();
        removed.sort();
        assert_eq!(removed, ["r/a:1", "r/c:1"]);
        assert!(
            report.removed[0].1.starts_with("unused for 7"),
            "{report:?}"
        );
        assert!(report.freed_bytes > 0);
        let names: Vec<String> = store.list().unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["r/b:1"]);
        let layer = |s: &str| store.layers.path(&Digest::of(s.as_bytes()));
        assert!(layer("base").is_dir() && layer("b-top").is_dir());
        assert!(!layer("a-top").exists() && !layer("c-only").exists());
        assert!(store.blobs.contains(&b) && !store.blobs.contains(&a) && !store.blobs.contains(&c));
        assert!(store.image("r/b:1").unwrap().is_some(), "b is whole");
        // A temporary of a pull in progress is left alone.
        std::fs::write(store.blobs.dir().join(".tmp-1-0-x"), b"partial").unwrap();
        store.sweep().unwrap();
        assert!(store.blobs.dir().join(".tmp-1-0-x").exists());
    }

    #[test]
    fn a_full_disk_removes_least_recently_used_first_down_to_the_low_mark() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        add(&store, "r/old:1", &["old"]);
        add(&store, "r/mid:1", &["mid"]);
        add(&store, "r/new:1", &["new"]);
        add(&store, "r/used:1", &["used"]);
        age(&store, "r/old:1", 300);
        age(&store, "r/mid:1", 200);
        age(&store, "r/new:1", 100);
        age(&store, "r/used:1", 900);
        let in_use: HashSet<String> = ["r/used:1".to_string()].into();
        // 95 % full; each removal frees 7 %; asked before each removal.
        let mut usage = [95, 88, 81, 74, 67].into_iter();
        let report = store
            .gc(&GcPolicy::default(), &in_use, || {
                Ok((usage.next().unwrap_or(0), 100))
            })
            .unwrap();
        let removed: Vec<&str> = report.removed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(removed, ["r/old:1", "r/mid:1"], "{report:?}");
        assert_eq!(report.removed[0].1, "disk 95% > 85%");
        let names: Vec<String> = store.list().unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["r/new:1", "r/used:1"]);
        // Below the high mark nothing goes.
        let report = store
            .gc(&GcPolicy::default(), &HashSet::new(), || Ok((50, 100)))
            .unwrap();
        assert!(report.removed.is_empty());
    }
}
