//! Unpacking one OCI layer (a tarball, maybe gzip-compressed) into an empty directory that
//! an overlay mount can use as a lower layer.
//!
//! Safety, whatever the tarball holds:
//! - a path with `..` is refused; leading `/` and `./` are dropped (paths are relative to the
//!   layer);
//! - nothing is written through a symlink: every parent directory of an entry must be a real
//!   directory of this layer (an entry `etc -> /etc` followed by `etc/passwd` is refused);
//!   symlinks themselves are created as they are (an absolute target resolves inside the
//!   container's root, and this code never follows one);
//! - a hard link must name a path inside the layer by the same rules;
//! - character and block devices are refused (the container gets its own minimal /dev).
//!
//! OCI whiteouts become overlayfs ones: `.wh.<name>` a 0/0 character device `<name>`, and
//! `.wh..wh..opq` the xattr `trusted.overlay.opaque=y` on its directory.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, makedev, mknod};

/// How a layer blob is compressed (from its media type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

impl Compression {
    /// The compression of an OCI or Docker layer media type.
    pub fn of_media_type(media_type: &str) -> Result<Compression, UnpackError> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar" => Ok(Compression::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Ok(Compression::Gzip),
            other => Err(UnpackError::Unsupported(format!(
                "layer media type {other:?} (Skiff reads tar and tar+gzip layers)"
            ))),
        }
    }
}

/// Why a layer could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("{path:?}: {reason}; refused")]
    Escape { path: String, reason: &'static str },
    #[error("{path:?}: device nodes in layers are refused")]
    Device { path: String },
    #[error("unsupported {0}")]
    Unsupported(String),
    #[error("the layer is not a readable tarball (truncated or corrupt): {0}")]
    Tar(#[source] io::Error),
    #[error(
        "the uncompressed layer is {actual}, not the diff ID {expected} the image's configuration names"
    )]
    DiffId {
        expected: crate::Digest,
        actual: crate::Digest,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> UnpackError + '_ {
    move |source| UnpackError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The components of a path inside the layer; `..` is refused.
fn clean(raw: &Path) -> Result<Vec<OsString>, UnpackError> {
    let mut out = Vec::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n.to_os_string()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                return Err(UnpackError::Escape {
                    path: raw.display().to_string(),
                    reason: "a path with '..' would leave the layer",
                });
            }
        }
    }
    Ok(out)
}

/// Makes sure every directory of `parents` under `root` is a real directory (creating the
/// missing ones), never a symlink or a file; returns the deepest.
fn real_dirs(root: &Path, parents: &[OsString], entry: &Path) -> Result<PathBuf, UnpackError> {
    let mut cur = root.to_path_buf();
    for p in parents {
        cur.push(p);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                return Err(UnpackError::Escape {
                    path: entry.display().to_string(),
                    reason: "a parent directory is a symlink or a file in this layer, so \
                             writing there could leave the layer",
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&cur).map_err(io_at(&cur))?;
            }
            Err(e) => return Err(io_at(&cur)(e)),
        }
    }
    Ok(cur)
}

/// Removes whatever is at `path` (the entry replaces it), keeping a directory when `keep_dir`.
fn clear(path: &Path, keep_dir: bool) -> Result<(), UnpackError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => {
            if keep_dir {
                Ok(())
            } else {
                fs::remove_dir_all(path).map_err(io_at(path))
            }
        }
        Ok(_) => fs::remove_file(path).map_err(io_at(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_at(path)(e)),
    }
}

/// A reader that hashes what passes through it (a layer's uncompressed stream, for its diff
/// ID).
struct Hashing<R> {
    inner: R,
    hasher: sha2::Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use sha2::Digest as _;
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Unpacks the tarball `reader` (compressed as `compression`) into the directory `dest`.
pub fn unpack(reader: impl Read, compression: Compression, dest: &Path) -> Result<(), UnpackError> {
    unpack_verified(reader, compression, dest, None)
}

/// [`unpack`], and the uncompressed stream must have the digest `diff_id` (the image
/// configuration's `rootfs.diff_ids` entry of the layer), as containerd checks it.
pub fn unpack_verified(
    reader: impl Read,
    compression: Compression,
    dest: &Path,
    diff_id: Option<&crate::Digest>,
) -> Result<(), UnpackError> {
    let reader: Box<dyn Read> = match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(reader)),
    };
    let reader = Hashing {
        inner: reader,
        hasher: <sha2::Sha256 as sha2::Digest>::new(),
    };
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(UnpackError::Tar)? {
        let mut entry = entry.map_err(UnpackError::Tar)?;
        let raw = entry.path().map_err(UnpackError::Tar)?.into_owned();
        let parts = clean(&raw)?;
        let Some((name, parents)) = parts.split_last() else {
            continue; // "./": the layer's root
        };
        let parent = real_dirs(dest, parents, &raw)?;
        let name_str = name.to_string_lossy();
        if name_str == OPAQUE {
            xattr::set(&parent, OPAQUE_XATTR, b"y").map_err(io_at(&parent))?;
            continue;
        }
        if let Some(hidden) = name_str.strip_prefix(WHITEOUT_PREFIX) {
            let target = parent.join(hidden);
            clear(&target, false)?;
            mknod(&target, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0))
                .map_err(|e| io_at(&target)(io::Error::from(e)))?;
            continue;
        }
        let target = parent.join(name);
        let header = entry.header();
        let mode = header.mode().map_err(UnpackError::Tar)? & 0o7777;
        let (uid, gid) = (
            header.uid().map_err(UnpackError::Tar)?,
            header.gid().map_err(UnpackError::Tar)?,
        );
        let kind = header.entry_type();
        match kind {
            tar::EntryType::Directory => {
                clear(&target, true)?;
                if !target.is_dir() {
                    fs::create_dir(&target).map_err(io_at(&target))?;
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                clear(&target, false)?;
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&target)
                    .map_err(io_at(&target))?;
                io::copy(&mut entry, &mut file).map_err(UnpackError::Tar)?;
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name()
                    .map_err(UnpackError::Tar)?
                    .ok_or_else(|| {
                        UnpackError::Tar(io::Error::other("a symlink without target"))
                    })?;
                clear(&target, false)?;
                std::os::unix::fs::symlink(&link, &target).map_err(io_at(&target))?;
            }
            tar::EntryType::Link => {
                let link = entry
                    .link_name()
                    .map_err(UnpackError::Tar)?
                    .ok_or_else(|| {
                        UnpackError::Tar(io::Error::other("a hard link without target"))
                    })?;
                let link_parts = clean(&link)?;
                let Some((link_name, link_parents)) = link_parts.split_last() else {
                    return Err(UnpackError::Escape {
                        path: raw.display().to_string(),
                        reason: "a hard link to the layer's root",
                    });
                };
                let source = real_dirs(dest, link_parents, &link)?.join(link_name);
                clear(&target, false)?;
                fs::hard_link(&source, &target).map_err(io_at(&source))?;
                continue; // a hard link shares the source's mode and owner
            }
            tar::EntryType::Fifo => {
                clear(&target, false)?;
                nix::unistd::mkfifo(&target, Mode::from_bits_truncate(0o600))
                    .map_err(|e| io_at(&target)(io::Error::from(e)))?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(UnpackError::Device {
                    path: raw.display().to_string(),
                });
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            other => {
                return Err(UnpackError::Unsupported(format!(
                    "tar entry type {other:?} at {}",
                    raw.display()
                )));
            }
        }
        let uid = u32::try_from(uid).ok();
        let gid = u32::try_from(gid).ok();
        std::os::unix::fs::lchown(&target, uid, gid).map_err(io_at(&target))?;
        if kind != tar::EntryType::Symlink {
            fs::set_permissions(&target, fs::Permissions::from_mode(mode))
                .map_err(io_at(&target))?;
        }
    }
    // Read past the tar's end-of-archive blocks to the end of the stream, so a truncated or
    // corrupt gzip trailer (its CRC) is an error too.
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(UnpackError::Tar)?;
    let actual = crate::Digest::from_hasher(rest.hasher);
    match diff_id {
        Some(expected) if *expected != actual => Err(UnpackError::DiffId {
            expected: expected.clone(),
            actual,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

    use super::*;

    /// A tarball builder that writes names as they are (even `..`), as a hostile layer would.
    struct Layer(tar::Builder<Vec<u8>>);

    impl Layer {
        fn new() -> Self {
            Layer(tar::Builder::new(Vec::new()))
        }

        fn entry(
            &mut self,
            kind: tar::EntryType,
            name: &str,
            link: &str,
            data: &[u8],
        ) -> &mut Self {
            let mut h = tar::Header::new_gnu();
            {
                let gnu = h.as_gnu_mut().expect("gnu header");
                gnu.name[..name.len()].copy_from_slice(name.as_bytes());
                gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
            }
            h.set_entry_type(kind);
            h.set_mode(if kind == tar::EntryType::Directory {
                0o755
            } else {
                0o644
            });
            h.set_uid(0);
            h.set_gid(0);
            h.set_size(data.len() as u64);
            h.set_cksum();
            self.0.append(&h, data).expect("append");
            self
        }

        fn file(&mut self, name: &str, data: &str) -> &mut Self {
            self.entry(tar::EntryType::Regular, name, "", data.as_bytes())
        }

        fn dir(&mut self, name: &str) -> &mut Self {
            self.entry(tar::EntryType::Directory, name, "", b"")
        }

        fn bytes(&mut self) -> Vec<u8> {
            let b = std::mem::replace(&mut self.0, tar::Builder::new(Vec::new()));
            b.into_inner().expect("tar")
        }

        fn gzip(&mut self) -> Vec<u8> {
            use std::io::Write as _;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&self.bytes()).expect("gzip");
            gz.finish().expect("gzip")
        }
    }

    fn root() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "unpacking layers needs root (device nodes for whiteouts, chown, trusted xattrs)"
        );
    }

    #[test]
    fn files_links_whiteouts_and_opaque_directories() {
        root();
        let dir = tempfile::tempdir().unwrap();
        let layer = Layer::new()
            .dir("./etc/")
            .file("./etc/motd", "hello\n")
            .entry(
                tar::EntryType::Symlink,
                "etc/localtime",
                "/usr/share/zoneinfo/UTC",
                b"",
            )
            .entry(tar::EntryType::Link, "etc/motd.copy", "etc/motd", b"")
            .dir("var/")
            .file("var/.wh..wh..opq", "")
            .file("var/.wh.cache", "")
            .file("/abs/ok", "leading slash is relative")
            .gzip();
        unpack(&layer[..], Compression::Gzip, dir.path()).unwrap();
        let p = dir.path();
        assert_eq!(fs::read_to_string(p.join("etc/motd")).unwrap(), "hello\n");
        assert_eq!(
            fs::read_link(p.join("etc/localtime")).unwrap(),
            Path::new("/usr/share/zoneinfo/UTC")
        );
        let (a, b) = (
            fs::metadata(p.join("etc/motd")).unwrap(),
            fs::metadata(p.join("etc/motd.copy")).unwrap(),
        );
        assert_eq!(a.ino(), b.ino(), "a hard link");
        assert_eq!(a.mode() & 0o777, 0o644);
        let wh = fs::symlink_metadata(p.join("var/cache")).unwrap();
        assert!(
            wh.file_type().is_char_device() && wh.rdev() == 0,
            "overlay whiteout"
        );
        assert_eq!(
            xattr::get(p.join("var"), OPAQUE_XATTR).unwrap().as_deref(),
            Some(&b"y"[..])
        );
        assert!(!p.join("var/.wh..wh..opq").exists());
        assert!(p.join("abs/ok").is_file());
    }

    #[test]
    fn hostile_layers_never_write_outside() {
        root();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().to_string_lossy().into_owned();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("dot-dot", Layer::new().file("a/../../escape", "x").bytes()),
            (
                "absolute symlink then a file through it",
                Layer::new()
                    .entry(tar::EntryType::Symlink, "link", &target, b"")
                    .file("link/escape", "x")
                    .bytes(),
            ),
            (
                "relative symlink then a directory through it",
                Layer::new()
                    .entry(tar::EntryType::Symlink, "up", "../../../../../../..", b"")
                    .dir("up/tmp/")
                    .bytes(),
            ),
            (
                "hard link out",
                Layer::new()
                    .entry(tar::EntryType::Link, "passwd", "../../../etc/passwd", b"")
                    .bytes(),
            ),
            (
                "device node",
                Layer::new()
                    .entry(tar::EntryType::Block, "dev/sda", "", b"")
                    .bytes(),
            ),
        ];
        for (what, bytes) in cases {
            let dir = tempfile::tempdir().unwrap();
            let err = unpack(&bytes[..], Compression::None, dir.path()).expect_err(what);
            assert!(
                matches!(err, UnpackError::Escape { .. } | UnpackError::Device { .. }),
                "{what}: {err}"
            );
            assert_eq!(
                fs::read_dir(outside.path()).unwrap().count(),
                0,
                "{what} wrote outside"
            );
        }
    }

    #[test]
    fn truncated_and_corrupt_layers_are_errors() {
        let good = Layer::new().file("a", &"x".repeat(10_000)).gzip();
        for cut in [10, good.len() / 2, good.len() - 9] {
            let dir = tempfile::tempdir().unwrap();
            let err = unpack(&good[..cut], Compression::Gzip, dir.path()).unwrap_err();
            assert!(matches!(err, UnpackError::Tar(_)), "{err}");
        }
        assert!(Compression::of_media_type("application/vnd.oci.image.layer.v1.tar+zstd").is_err());
    }
}
