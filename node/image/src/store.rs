//! The two content-addressed stores: blobs (`<root>/blobs/sha256/<hex>`) and unpacked layers
//! (`<root>/layers/sha256/<hex>/`, named by the layer blob's digest). Writes go to a
//! temporary name in the same directory and are renamed into place when complete and
//! verified, so a crash or a bad input never leaves a half-written entry under a real name.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::digest::Digest;
use crate::unpack::{self, Compression, UnpackError};

/// What can go wrong storing a blob or a layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("blob {expected}: its content has digest {actual} (corrupt or not what was asked)")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error("blob {digest}: {size} bytes, more than the {limit} expected")]
    TooLarge {
        digest: Digest,
        size: u64,
        limit: u64,
    },
    #[error("blob {0} is not in the store")]
    Missing(Digest),
    #[error("layer {digest}: {source}")]
    Unpack {
        digest: Digest,
        #[source]
        source: UnpackError,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A unique temporary name next to `final_path`.
fn temp_name(final_path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = final_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    final_path.with_file_name(format!(".tmp-{}-{n}-{name}", std::process::id()))
}

/// Blobs by digest.
#[derive(Debug, Clone)]
pub struct BlobStore {
    dir: PathBuf,
}

impl BlobStore {
    /// The store under `root` (created when missing).
    pub fn open(root: &Path) -> Result<BlobStore, StoreError> {
        let dir = root.join("blobs").join("sha256");
        fs::create_dir_all(&dir).map_err(io_at(&dir))?;
        Ok(BlobStore { dir })
    }

    /// The directory of the blobs (files named by their hex digest).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the blob `digest` is (whether or not it is there).
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(digest.hex())
    }

    pub fn contains(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    /// Reads a stored blob whole (manifests and configs; layers are streamed).
    pub fn read(&self, digest: &Digest) -> Result<Vec<u8>, StoreError> {
        let path = self.path(digest);
        fs::read(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => StoreError::Missing(digest.clone()),
            _ => StoreError::Io { path, source: e },
        })
    }

    /// Streams `content` into the store as `expected`, at most `limit` bytes (the size a
    /// descriptor announced). The blob appears under its name only if its digest matches;
    /// otherwise nothing is left behind. A blob already present is not written again.
    pub fn put(
        &self,
        expected: &Digest,
        content: &mut dyn Read,
        limit: u64,
    ) -> Result<PathBuf, StoreError> {
        if self.contains(expected) {
            return Ok(self.path(expected));
        }
        let mut writer = self.writer(expected, limit)?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = content.read(&mut buf).map_err(|e| io_at(&writer.tmp)(e))?;
            if n == 0 {
                break;
            }
            writer.write(&buf[..n])?;
        }
        writer.finish()
    }

    /// A writer of the blob `expected` (at most `limit` bytes), for content that arrives in
    /// chunks (a registry's stream). Dropped without [`BlobWriter::finish`], it leaves nothing.
    pub fn writer(&self, expected: &Digest, limit: u64) -> Result<BlobWriter, StoreError> {
        let final_path = self.path(expected);
        let tmp = temp_name(&final_path);
        let file = File::create(&tmp).map_err(io_at(&tmp))?;
        Ok(BlobWriter {
            file: Some(file),
            tmp,
            final_path,
            expected: expected.clone(),
            hasher: Sha256::new(),
            size: 0,
            limit,
        })
    }
}

/// A blob being written: hashed and counted as it goes, renamed into place by
/// [`BlobWriter::finish`] only when its digest matches.
#[derive(Debug)]
pub struct BlobWriter {
    file: Option<File>,
    tmp: PathBuf,
    final_path: PathBuf,
    expected: Digest,
    hasher: Sha256,
    size: u64,
    limit: u64,
}

impl BlobWriter {
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), StoreError> {
        self.size += chunk.len() as u64;
        if self.size > self.limit {
            return Err(StoreError::TooLarge {
                digest: self.expected.clone(),
                size: self.size,
                limit: self.limit,
            });
        }
        self.hasher.update(chunk);
        match self.file.as_mut() {
            Some(f) => f.write_all(chunk).map_err(io_at(&self.tmp)),
            None => Ok(()),
        }
    }

    /// Checks the digest and moves the blob to its name.
    pub fn finish(mut self) -> Result<PathBuf, StoreError> {
        let actual = Digest::from_hasher(std::mem::take(&mut self.hasher));
        if actual != self.expected {
            return Err(StoreError::DigestMismatch {
                expected: self.expected.clone(),
                actual,
            });
        }
        if let Some(f) = self.file.take() {
            f.sync_all().map_err(io_at(&self.tmp))?;
        }
        fs::rename(&self.tmp, &self.final_path).map_err(io_at(&self.final_path))?;
        Ok(self.final_path.clone())
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        // Finished: the temporary name is gone already; otherwise remove what was written.
        let _ = fs::remove_file(&self.tmp);
    }
}

/// Unpacked layers by the digest of their blob.
#[derive(Debug, Clone)]
pub struct LayerStore {
    dir: PathBuf,
}

impl LayerStore {
    pub fn open(root: &Path) -> Result<LayerStore, StoreError> {
        let dir = root.join("layers").join("sha256");
        fs::create_dir_all(&dir).map_err(io_at(&dir))?;
        Ok(LayerStore { dir })
    }

    /// The directory of the unpacked layers (named by their blob's hex digest).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of layer `digest` (an overlay lower directory once unpacked).
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(digest.hex())
    }

    /// Unpacks the stored blob `digest` (a tarball, compressed as `compression`) once: a
    /// layer already unpacked is returned as it is. With `diff_id`, the uncompressed stream
    /// must have that digest. On any error nothing is left.
    pub fn unpack(
        &self,
        blobs: &BlobStore,
        digest: &Digest,
        compression: Compression,
        diff_id: Option<&Digest>,
    ) -> Result<PathBuf, StoreError> {
        let final_path = self.path(digest);
        if final_path.is_dir() {
            return Ok(final_path);
        }
        let blob = blobs.path(digest);
        let file = File::open(&blob).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => StoreError::Missing(digest.clone()),
            _ => StoreError::Io {
                path: blob.clone(),
                source: e,
            },
        })?;
        let tmp = temp_name(&final_path);
        fs::create_dir(&tmp).map_err(io_at(&tmp))?;
        let result = unpack::unpack_verified(file, compression, &tmp, diff_id)
            .map_err(|source| StoreError::Unpack {
                digest: digest.clone(),
                source,
            })
            .and_then(|()| match fs::rename(&tmp, &final_path) {
                Ok(()) => Ok(()),
                // Another pull unpacked the same layer meanwhile (images share layers): its
                // directory is the same content, verified the same way; ours goes.
                Err(_) if final_path.is_dir() => {
                    let _ = fs::remove_dir_all(&tmp);
                    Ok(())
                }
                Err(e) => Err(io_at(&final_path)(e)),
            });
        if result.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        result.map(|()| final_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_unpacks_of_one_layer_all_succeed() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobStore::open(dir.path()).unwrap();
        let layers = LayerStore::open(dir.path()).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        for i in 0..200 {
            let data = vec![b'x'; 4096];
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            b.append_data(&mut h, format!("f{i}"), &data[..]).unwrap();
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&b.into_inner().unwrap()).unwrap();
        let blob = gz.finish().unwrap();
        let d = Digest::of(&blob);
        blobs.put(&d, &mut &blob[..], blob.len() as u64).unwrap();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..6)
                .map(|_| s.spawn(|| layers.unpack(&blobs, &d, Compression::Gzip, None)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in &results {
            assert_eq!(r.as_ref().unwrap(), &layers.path(&d));
        }
        assert_eq!(fs::read_dir(layers.path(&d)).unwrap().count(), 200);
        let left: Vec<_> = fs::read_dir(dir.path().join("layers/sha256"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_blob_is_stored_only_when_its_digest_matches() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let good = Digest::of(b"hello");
        let path = store.put(&good, &mut &b"hello"[..], 5).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"hello");
        // Wrong content: refused, nothing under the name, no temporary left.
        let other = Digest::of(b"other");
        let err = store.put(&other, &mut &b"hello"[..], 5).unwrap_err();
        assert!(matches!(err, StoreError::DigestMismatch { .. }), "{err}");
        assert!(!store.contains(&other));
        // More than announced: refused as soon as it passes the size.
        let big = Digest::of(b"hello world");
        let err = store.put(&big, &mut &b"hello world"[..], 5).unwrap_err();
        assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
        let names: Vec<_> = fs::read_dir(dir.path().join("blobs/sha256"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from(good.hex())]);
    }
}
