//! A layer unpacked beside sentinels, for the unpacker's property test and `cargo fuzz`
//! (feature `fuzzing`; `tests/fuzz/fuzz_targets/image_layers.rs`).
//!
//! [`Sandbox`] is a temporary directory laid out like the node's layer store: sentinel files,
//! a directory, a symlink and another unpacked layer beside the directory the layer is
//! unpacked into (`layers/sha256/cur`). [`Sandbox::unpack`] unpacks any bytes there as a
//! layer (gzip when they start with gzip's magic) and panics when anything outside that
//! directory was created, removed or changed (type, mode, owner, size, content, link target,
//! xattrs, inode number, link count or ctime), whether the unpack succeeded or was refused.
//! Unpacking needs root (whiteouts are device nodes, owners are set), as the node agent has.
#![allow(
    clippy::expect_used,
    reason = "test support: a sandbox that cannot be made or read is the test's failure"
)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::unpack::{self, Compression, UnpackError};

/// The layer directory, relative to the sandbox.
pub const LAYER: &str = "layers/sha256/cur";

/// A temporary directory (under `/dev/shm` when there is one) holding sentinels and an empty
/// layer directory; removed on drop.
#[derive(Debug)]
pub struct Sandbox {
    dir: PathBuf,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::new()
    }
}

impl Sandbox {
    pub fn new() -> Sandbox {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // tmpfs when there is one: an ext4 directory made and removed for every input spends
        // most of the time allocating inodes.
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "skiff-unpack-sandbox-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("sdir/deep")).expect("sandbox");
        fs::write(dir.join("sentinel"), "keep").expect("sentinel");
        fs::write(dir.join("sdir/inner"), "keep").expect("sentinel");
        fs::write(dir.join("sdir/deep/f"), "keep").expect("sentinel");
        std::os::unix::fs::symlink("sdir", dir.join("link-out")).expect("sentinel");
        fs::create_dir_all(dir.join("layers/sha256/other/etc")).expect("sentinel");
        fs::write(dir.join("layers/sha256/other/etc/passwd"), "root").expect("sentinel");
        fs::create_dir_all(dir.join(LAYER)).expect("layer directory");
        Sandbox { dir }
    }

    /// The sandbox's directory (the "outside" of the layer).
    pub fn outside(&self) -> &Path {
        &self.dir
    }

    /// The layer's directory.
    pub fn layer(&self) -> PathBuf {
        self.dir.join(LAYER)
    }

    /// Unpacks `bytes` into the layer directory; panics when anything outside it changed.
    pub fn unpack(&self, bytes: &[u8]) -> Result<(), UnpackError> {
        let before = snapshot(&self.dir);
        let compression = if bytes.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else {
            Compression::None
        };
        let result = unpack::unpack(bytes, compression, &self.layer());
        let after = snapshot(&self.dir);
        if before != after {
            let changed: Vec<_> = before
                .iter()
                .filter(|(k, v)| after.get(*k) != Some(v))
                .map(|(k, v)| format!("changed or removed {k:?}: {v}"))
                .chain(
                    after
                        .keys()
                        .filter(|k| !before.contains_key(*k))
                        .map(|k| format!("created {k:?}")),
                )
                .collect();
            panic!(
                "unpacking ({result:?}) changed what is outside the layer:\n{}",
                changed.join("\n")
            );
        }
        result
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Everything under `root` but the layer's content, described, by path; never follows a
/// symlink.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let layer = root.join(LAYER);
    let mut todo = vec![root.to_path_buf()];
    while let Some(path) = todo.pop() {
        let Ok(m) = fs::symlink_metadata(&path) else {
            continue;
        };
        let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        if path == layer {
            // Its content is the layer's; it must stay the same directory.
            out.insert(rel, format!("dir ino {}", m.ino()));
            continue;
        }
        let kind = m.file_type();
        let mut desc = format!(
            "{kind:?} mode {:o} owner {}:{} size {} ino {} nlink {} ctime {}.{} mtime {}.{}",
            m.mode(),
            m.uid(),
            m.gid(),
            m.size(),
            m.ino(),
            m.nlink(),
            m.ctime(),
            m.ctime_nsec(),
            m.mtime(),
            m.mtime_nsec()
        );
        if kind.is_symlink() {
            desc.push_str(&format!(" -> {:?}", fs::read_link(&path).ok()));
        } else if kind.is_file() {
            desc.push_str(&format!(" content {:?}", fs::read(&path).ok()));
        }
        if let Ok(names) = xattr::list(&path) {
            let mut names: Vec<_> = names.collect();
            names.sort();
            desc.push_str(&format!(" xattrs {names:?}"));
        }
        if kind.is_dir() {
            let mut children: Vec<_> = fs::read_dir(&path)
                .expect("read a sandbox directory")
                .map(|e| e.expect("a sandbox directory entry").path())
                .collect();
            children.sort();
            todo.extend(children);
        }
        out.insert(rel, desc);
    }
    out
}
