//! Unpacking one OCI layer (a tarball, maybe gzip-compressed) into an empty directory that
//! an overlay mount can use as a lower layer.
//!
//! A layer comes from a registry and is hostile until proven otherwise (the container
//! runtimes' "image unpacking" CVE class: `../` paths, writes through a symlink an earlier
//! entry planted, hard links out, whiteouts of `..`). So no entry can create, modify,
//! chmod, chown or delete anything outside the layer directory:
//!
//! - every path is resolved one component at a time relative to a file descriptor of its
//!   parent directory with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_MAGICLINKS)` and `O_NOFOLLOW`, and every change is an `*at` call on that
//!   descriptor and one final name (`mkdirat`, `symlinkat`, `linkat`, `unlinkat`, ...) or an
//!   `fchown`/`fchmod` on a descriptor of the new file. No path string is ever handed to the
//!   kernel whole, and nothing is followed through a symlink, whatever the layer planted;
//! - a path with a `..` component is refused; a leading `/` and `.` components are dropped
//!   (paths are relative to the layer, GNU long names and PAX paths alike); a path of more
//!   than [`MAX_DEPTH`] components is refused (it bounds the recursion of a whiteout's
//!   removal);
//! - a parent directory of an entry must be a real directory of this layer (created when
//!   missing): an entry `etc -> /etc` followed by `etc/passwd` is refused;
//! - symlinks are created as they are (an absolute target resolves inside the container's
//!   root, and this code never follows one);
//! - a hard link must name an existing entry of this layer by the same rules; it is made
//!   without following a symlink (a link to a symlink is a second name of that symlink);
//! - character and block devices are refused (the container gets its own minimal /dev).
//!
//! OCI whiteouts become overlayfs ones: `.wh.<name>` a 0/0 character device `<name>`, and
//! `.wh..wh..opq` the xattr `trusted.overlay.opaque=y` on its directory. A whiteout is
//! refused ([`UnpackError::Whiteout`]) when the name it hides is empty, `.`, `..`, holds a
//! `/` or is itself a `.wh.` name (a `.wh...` entry would otherwise remove the layer's parent,
//! the whole layer store), when it is a directory, or when it is the parent of another entry
//! (a whiteout has no children); an opaque marker is refused at the layer's root (it would
//! mark the layer directory itself, hiding every layer below) and as a directory. Other
//! `.wh..wh.` names (AUFS metadata) are refused too.
//!
//! A refused layer is an error and the caller discards the directory: the
//! [`crate::LayerStore`] unpacks into a temporary directory and renames it into place only
//! after the whole tarball unpacked and its diff ID matched.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{Mode, SFlag, fchmod, fstatat, mkdirat, mknodat};
use nix::unistd::{
    Gid, Uid, UnlinkatFlags, fchown, fchownat, linkat, mkfifoat, symlinkat, unlinkat,
};

/// The most path components an entry may have.
pub const MAX_DEPTH: usize = 256;

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
    #[error("whiteout {path:?}: {reason}; refused")]
    Whiteout { path: String, reason: &'static str },
    #[error("{path:?}: device nodes in layers are refused")]
    Device { path: String },
    #[error("{path:?}: more than {MAX_DEPTH} path components; refused")]
    TooDeep { path: String },
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

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// An [`UnpackError::Io`] about the entry `path` (its path in the layer).
fn io_at(path: &Path) -> impl FnOnce(Errno) -> UnpackError + '_ {
    move |errno| UnpackError::Io {
        path: path.to_path_buf(),
        source: io::Error::from(errno),
    }
}

fn shown(path: &Path) -> String {
    path.display().to_string()
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
                    path: shown(raw),
                    reason: "a path with '..' would leave the layer",
                });
            }
        }
    }
    if out.len() > MAX_DEPTH {
        return Err(UnpackError::TooDeep { path: shown(raw) });
    }
    Ok(out)
}

fn is_whiteout(name: &OsStr) -> bool {
    name.as_bytes().starts_with(WHITEOUT_PREFIX)
}

/// The name a whiteout entry `name` (`.wh.<hidden>`, not the opaque marker) hides, if it
/// is one a layer may hide: a plain name of its directory.
fn hidden_name<'a>(name: &'a OsStr, entry: &Path) -> Result<&'a OsStr, UnpackError> {
    let bad = |reason| UnpackError::Whiteout {
        path: shown(entry),
        reason,
    };
    let hidden = name
        .as_bytes()
        .strip_prefix(WHITEOUT_PREFIX)
        .unwrap_or_default();
    match hidden {
        b"" => Err(bad("it hides an empty name (its own directory)")),
        b"." => Err(bad("it hides '.' (its own directory)")),
        b".." => Err(bad("it hides '..' (outside its directory)")),
        h if h.contains(&b'/') || h.contains(&0) => Err(bad("it hides a name with a separator")),
        h if h.starts_with(WHITEOUT_PREFIX) => Err(bad(
            "'.wh..wh.' names other than the opaque marker are AUFS metadata",
        )),
        h => Ok(OsStr::from_bytes(h)),
    }
}

/// Opens `name` in `dir` without following a symlink, beneath `dir` only.
fn open_beneath(dir: BorrowedFd<'_>, name: &OsStr, flags: OFlag) -> nix::Result<OwnedFd> {
    let mut how = OpenHow::new()
        .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    if flags.contains(OFlag::O_CREAT) {
        // openat2 refuses a mode without O_CREAT.
        how = how.mode(Mode::from_bits_truncate(0o600));
    }
    openat2(dir, name, how)
}

/// The layer directory being written.
struct Layer {
    root: OwnedFd,
}

impl Layer {
    fn open(dest: &Path) -> Result<Layer, UnpackError> {
        let root = nix::fcntl::open(
            dest,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_at(dest))?;
        Ok(Layer { root })
    }

    /// The directory `parents` (components under the layer's root) of `entry`, each one a
    /// real directory of this layer, never a symlink or a file; missing ones are created
    /// when `create`.
    fn dir(
        &self,
        parents: &[OsString],
        entry: &Path,
        create: bool,
    ) -> Result<OwnedFd, UnpackError> {
        let mut cur: Option<OwnedFd> = None;
        for p in parents {
            let at = cur.as_ref().map_or(self.root.as_fd(), |f| f.as_fd());
            let next = match open_beneath(at, p, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
                Err(Errno::ENOENT) if create => {
                    mkdirat(at, p.as_os_str(), Mode::from_bits_truncate(0o755))
                        .map_err(io_at(entry))?;
                    open_beneath(at, p, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
                }
                r => r,
            };
            cur = Some(next.map_err(|e| match e {
                Errno::ELOOP | Errno::ENOTDIR | Errno::EXDEV => UnpackError::Escape {
                    path: shown(entry),
                    reason: "a parent directory is a symlink or a file in this layer, so \
                             writing there could leave the layer",
                },
                e => io_at(entry)(e),
            })?);
        }
        match cur {
            Some(fd) => Ok(fd),
            None => self.root.try_clone().map_err(|source| UnpackError::Io {
                path: entry.to_path_buf(),
                source,
            }),
        }
    }
}

/// Removes whatever is at `name` in `dir` (the entry replaces it), keeping a directory when
/// `keep_dir`; a directory goes with everything in it, nothing followed through a symlink.
fn clear(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    keep_dir: bool,
    entry: &Path,
) -> Result<(), UnpackError> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(io_at(entry)(e)),
        Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR => {
            if keep_dir {
                Ok(())
            } else {
                remove_tree(dir, name, 0).map_err(io_at(entry))
            }
        }
        Ok(_) => unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).map_err(io_at(entry)),
    }
}

/// Removes the directory `name` of `dir` and everything in it (at most [`MAX_DEPTH`] deep:
/// no entry path is deeper).
fn remove_tree(dir: BorrowedFd<'_>, name: &OsStr, depth: usize) -> nix::Result<()> {
    if depth > MAX_DEPTH {
        return Err(Errno::ELOOP);
    }
    let fd = open_beneath(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    let mut children = Vec::new();
    {
        let mut listing = nix::dir::Dir::from_fd(fd.try_clone().map_err(|_| Errno::EMFILE)?)?;
        for e in listing.iter() {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                children.push(OsStr::from_bytes(n).to_os_string());
            }
        }
    }
    for child in &children {
        let st = fstatat(&fd, child.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
            remove_tree(fd.as_fd(), child, depth + 1)?;
        } else {
            unlinkat(&fd, child.as_os_str(), UnlinkatFlags::NoRemoveDir)?;
        }
    }
    unlinkat(dir, name, UnlinkatFlags::RemoveDir)
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
    let layer = Layer::open(dest)?;
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(UnpackError::Tar)? {
        let mut entry = entry.map_err(UnpackError::Tar)?;
        unpack_entry(&layer, &mut entry)?;
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

/// Writes one tar entry into the layer.
fn unpack_entry(layer: &Layer, entry: &mut tar::Entry<'_, impl Read>) -> Result<(), UnpackError> {
    let kind = entry.header().entry_type();
    if matches!(
        kind,
        tar::EntryType::XGlobalHeader | tar::EntryType::XHeader
    ) {
        return Ok(());
    }
    let raw = entry.path().map_err(UnpackError::Tar)?.into_owned();
    let parts = clean(&raw)?;
    let Some((name, parents)) = parts.split_last() else {
        return Ok(()); // "./": the layer's root
    };
    if parents.iter().any(|p| is_whiteout(p)) {
        return Err(UnpackError::Whiteout {
            path: shown(&raw),
            reason: "a whiteout or opaque marker cannot hold entries",
        });
    }
    let name = name.as_os_str();
    if is_whiteout(name) {
        if kind == tar::EntryType::Directory {
            return Err(UnpackError::Whiteout {
                path: shown(&raw),
                reason: "a whiteout or opaque marker is a directory",
            });
        }
        if name.as_bytes() == OPAQUE {
            if parents.is_empty() {
                return Err(UnpackError::Whiteout {
                    path: shown(&raw),
                    reason: "an opaque marker at the layer's root",
                });
            }
            let dir = File::from(layer.dir(parents, &raw, true)?);
            return xattr::FileExt::set_xattr(&dir, OPAQUE_XATTR, b"y").map_err(|source| {
                UnpackError::Io {
                    path: raw.clone(),
                    source,
                }
            });
        }
        let hidden = hidden_name(name, &raw)?;
        let dir = layer.dir(parents, &raw, true)?;
        clear(dir.as_fd(), hidden, false, &raw)?;
        return mknodat(&dir, hidden, SFlag::S_IFCHR, Mode::empty(), 0).map_err(io_at(&raw));
    }
    let header = entry.header();
    let mode = Mode::from_bits_truncate(header.mode().map_err(UnpackError::Tar)? & 0o7777);
    let uid = header.uid().map_err(UnpackError::Tar)?;
    let gid = header.gid().map_err(UnpackError::Tar)?;
    let owner = u32::try_from(uid).ok().map(Uid::from_raw);
    let group = u32::try_from(gid).ok().map(Gid::from_raw);
    let dir = layer.dir(parents, &raw, true)?;
    let created: OwnedFd = match kind {
        tar::EntryType::Directory => {
            clear(dir.as_fd(), name, true, &raw)?;
            match mkdirat(&dir, name, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(io_at(&raw)(e)),
            }
            open_beneath(dir.as_fd(), name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
                .map_err(io_at(&raw))?
        }
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            clear(dir.as_fd(), name, false, &raw)?;
            let fd = open_beneath(
                dir.as_fd(),
                name,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            )
            .map_err(io_at(&raw))?;
            let mut file = File::from(fd);
            io::copy(entry, &mut file).map_err(UnpackError::Tar)?;
            OwnedFd::from(file)
        }
        tar::EntryType::Symlink => {
            let link = entry
                .link_name()
                .map_err(UnpackError::Tar)?
                .ok_or_else(|| UnpackError::Tar(io::Error::other("a symlink without target")))?;
            clear(dir.as_fd(), name, false, &raw)?;
            symlinkat(link.as_os_str(), &dir, name).map_err(io_at(&raw))?;
            // A symlink's own owner; its mode means nothing on Linux.
            return fchownat(&dir, name, owner, group, AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(io_at(&raw));
        }
        tar::EntryType::Link => {
            let link = entry
                .link_name()
                .map_err(UnpackError::Tar)?
                .ok_or_else(|| UnpackError::Tar(io::Error::other("a hard link without target")))?;
            let link_parts = clean(&link)?;
            let Some((link_name, link_parents)) = link_parts.split_last() else {
                return Err(UnpackError::Escape {
                    path: shown(&raw),
                    reason: "a hard link to the layer's root",
                });
            };
            let source_dir = layer.dir(link_parents, &link, false)?;
            // The source must exist before the target's old entry goes (a link to itself).
            fstatat(
                &source_dir,
                link_name.as_os_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(io_at(&link))?;
            clear(dir.as_fd(), name, false, &raw)?;
            // Flags 0: a symlink source is linked itself, never followed.
            return linkat(
                &source_dir,
                link_name.as_os_str(),
                &dir,
                name,
                AtFlags::empty(),
            )
            .map_err(io_at(&raw)); // a hard link shares the source's mode and owner
        }
        tar::EntryType::Fifo => {
            clear(dir.as_fd(), name, false, &raw)?;
            mkfifoat(&dir, name, Mode::from_bits_truncate(0o600)).map_err(io_at(&raw))?;
            // Opening a FIFO for reading without waiting for a writer.
            open_beneath(dir.as_fd(), name, OFlag::O_RDONLY | OFlag::O_NONBLOCK)
                .map_err(io_at(&raw))?
        }
        tar::EntryType::Char | tar::EntryType::Block => {
            return Err(UnpackError::Device { path: shown(&raw) });
        }
        other => {
            return Err(UnpackError::Unsupported(format!(
                "tar entry type {other:?} at {}",
                raw.display()
            )));
        }
    };
    // Owner first: a chown clears the set-user-ID and set-group-ID bits the mode sets.
    fchown(&created, owner, group).map_err(io_at(&raw))?;
    fchmod(&created, mode).map_err(io_at(&raw))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

    use super::*;

    /// A tarball builder that writes names as they are (even `..`), as a hostile layer would.
    struct TarLayer(tar::Builder<Vec<u8>>);

    impl TarLayer {
        fn new() -> Self {
            TarLayer(tar::Builder::new(Vec::new()))
        }

        fn entry(
            &mut self,
            kind: tar::EntryType,
            name: &str,
            link: &str,
            data: &[u8],
        ) -> &mut Self {
            self.long_entry(kind, name, link, data, LongNames::Gnu)
        }

        /// An entry whose name and link target, when longer than a header holds, are carried
        /// by GNU long-name and long-link entries or by a PAX header before it.
        fn long_entry(
            &mut self,
            kind: tar::EntryType,
            name: &str,
            link: &str,
            data: &[u8],
            long: LongNames,
        ) -> &mut Self {
            let (name, link) = (name.as_bytes(), link.as_bytes());
            let fits = |s: &[u8]| s.len() <= 100;
            match long {
                LongNames::Gnu => {
                    for (value, kind) in [
                        (name, tar::EntryType::GNULongName),
                        (link, tar::EntryType::GNULongLink),
                    ] {
                        if !fits(value) {
                            let mut v = value.to_vec();
                            v.push(0);
                            self.meta(kind, &v);
                        }
                    }
                }
                LongNames::Pax if !fits(name) || !fits(link) => {
                    let mut records = Vec::new();
                    for (key, value) in [("path", name), ("linkpath", link)] {
                        if !fits(value) {
                            records.extend(pax_record(key, value));
                        }
                    }
                    self.meta(tar::EntryType::XHeader, &records);
                }
                LongNames::Pax => {}
            }
            let mut h = tar::Header::new_gnu();
            {
                let gnu = h.as_gnu_mut().expect("gnu header");
                let (n, l) = (name.len().min(100), link.len().min(100));
                gnu.name[..n].copy_from_slice(&name[..n]);
                gnu.linkname[..l].copy_from_slice(&link[..l]);
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

        /// A GNU long-name/long-link or PAX entry of `data`.
        fn meta(&mut self, kind: tar::EntryType, data: &[u8]) {
            let mut h = tar::Header::new_gnu();
            h.as_gnu_mut().expect("gnu header").name[..13].copy_from_slice(b"././@LongLink");
            h.set_entry_type(kind);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            h.set_cksum();
            self.0.append(&h, data).expect("append");
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

    #[derive(Debug, Clone, Copy)]
    enum LongNames {
        Gnu,
        Pax,
    }

    /// A PAX record: `<length> <key>=<value>\n`, the length counting itself.
    fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
        let body = [b" ", key.as_bytes(), b"=", value, b"\n"].concat();
        let mut len = body.len();
        while (len.to_string().len() + body.len()) != len {
            len = len.to_string().len() + body.len();
        }
        [len.to_string().as_bytes(), &body].concat()
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
        let layer = TarLayer::new()
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
            (
                "dot-dot",
                TarLayer::new().file("a/../../escape", "x").bytes(),
            ),
            (
                "absolute symlink then a file through it",
                TarLayer::new()
                    .entry(tar::EntryType::Symlink, "link", &target, b"")
                    .file("link/escape", "x")
                    .bytes(),
            ),
            (
                "relative symlink then a directory through it",
                TarLayer::new()
                    .entry(tar::EntryType::Symlink, "up", "../../../../../../..", b"")
                    .dir("up/tmp/")
                    .bytes(),
            ),
            (
                "hard link out",
                TarLayer::new()
                    .entry(tar::EntryType::Link, "passwd", "../../../etc/passwd", b"")
                    .bytes(),
            ),
            (
                "device node",
                TarLayer::new()
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
    fn bad_whiteouts_are_refused_by_name_and_touch_nothing() {
        root();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (".wh...", TarLayer::new().file(".wh...", "").bytes()),
            (
                "a/.wh...",
                TarLayer::new().dir("a/").file("a/.wh...", "").bytes(),
            ),
            (".wh.", TarLayer::new().file("./.wh.", "").bytes()),
            (
                "a/.wh..",
                TarLayer::new().dir("a/").file("a/.wh..", "").bytes(),
            ),
            (
                ".wh..wh..opq",
                TarLayer::new().file(".wh..wh..opq", "").bytes(),
            ),
            (
                "a/.wh..wh.plnk",
                TarLayer::new().file("a/.wh..wh.plnk", "").bytes(),
            ),
            ("a/.wh.b", TarLayer::new().dir("a/.wh.b/").bytes()),
            (
                "a/.wh..wh..opq",
                TarLayer::new().dir("a/.wh..wh..opq/").bytes(),
            ),
            (
                ".wh.x/child",
                TarLayer::new()
                    .file(".wh.x", "")
                    .file(".wh.x/child", "")
                    .bytes(),
            ),
            (
                ".wh..wh..opq/child",
                TarLayer::new().file(".wh..wh..opq/child", "").bytes(),
            ),
        ];
        for (entry, bytes) in cases {
            let sandbox = crate::fuzzing::Sandbox::new();
            // Sandbox::unpack panics when anything outside the layer changed.
            let err = sandbox.unpack(&bytes).expect_err(entry);
            match &err {
                UnpackError::Whiteout { path, .. } => {
                    assert!(
                        path.trim_end_matches('/').ends_with(entry),
                        "{entry}: {err}"
                    )
                }
                other => panic!("{entry}: {other}"),
            }
            assert!(err.to_string().contains(entry), "{err}");
        }
    }

    #[test]
    fn a_refused_layer_leaves_nothing_in_the_store_and_spares_the_others() {
        root();
        let dir = tempfile::tempdir().unwrap();
        let blobs = crate::BlobStore::open(dir.path()).unwrap();
        let layers = crate::LayerStore::open(dir.path()).unwrap();
        let store = |bytes: &[u8]| {
            let d = crate::Digest::of(bytes);
            blobs.put(&d, &mut &bytes[..], bytes.len() as u64).unwrap();
            d
        };
        let good = store(&TarLayer::new().file("etc/motd", "hi").gzip());
        let good_dir = layers
            .unpack(&blobs, &good, Compression::Gzip, None)
            .unwrap();
        for hostile in [
            TarLayer::new().file("a", "x").file(".wh...", "").gzip(),
            TarLayer::new()
                .file("a", "x")
                .entry(tar::EntryType::Symlink, "l", "..", b"")
                .file("l/escape", "x")
                .gzip(),
        ] {
            let d = store(&hostile);
            let err = layers
                .unpack(&blobs, &d, Compression::Gzip, None)
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    crate::StoreError::Unpack {
                        source: UnpackError::Whiteout { .. } | UnpackError::Escape { .. },
                        ..
                    }
                ),
                "{err}"
            );
            let names: Vec<_> = fs::read_dir(layers.dir())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                names,
                [std::ffi::OsString::from(good.hex())],
                "only the good layer"
            );
            assert_eq!(fs::read_to_string(good_dir.join("etc/motd")).unwrap(), "hi");
            assert!(blobs.contains(&good));
        }
    }

    /// The fuzz target's seeds (`tests/fuzz/seeds/image_layers`), unpacked beside the sandbox's
    /// sentinels on every test run.
    #[test]
    fn fuzz_seeds_unpack_or_are_refused_and_touch_nothing_outside() {
        root();
        let seeds =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz/seeds/image_layers");
        let mut seen = 0;
        for e in fs::read_dir(&seeds).unwrap() {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let result = crate::fuzzing::Sandbox::new().unpack(&fs::read(&path).unwrap());
            let good = [
                "rootfs.tar.gz",
                "whiteouts.tar",
                "long-names-gnu.tar",
                "long-names-pax.tar.gz",
            ];
            assert_eq!(
                result.is_ok(),
                good.contains(&name.as_str()),
                "{name}: {result:?}"
            );
            seen += 1;
        }
        assert!(seen >= 9, "{seen} seeds");
    }

    #[test]
    fn truncated_and_corrupt_layers_are_errors() {
        let good = TarLayer::new().file("a", &"x".repeat(10_000)).gzip();
        for cut in [10, good.len() / 2, good.len() - 9] {
            let dir = tempfile::tempdir().unwrap();
            let err = unpack(&good[..cut], Compression::Gzip, dir.path()).unwrap_err();
            assert!(matches!(err, UnpackError::Tar(_)), "{err}");
        }
        assert!(Compression::of_media_type("application/vnd.oci.image.layer.v1.tar+zstd").is_err());
    }

    /// Generated layers: random sequences of every entry type, with names and link targets
    /// drawn from an alphabet of `..`, `.`, empty components, `/`, `.wh.` names, long names
    /// (GNU long names and PAX paths), the sentinels' names and absolute paths to them.
    mod generated {
        use proptest::prelude::*;

        use super::*;
        use crate::fuzzing::Sandbox;

        fn component() -> impl Strategy<Value = String> {
            let mut names: Vec<String> = [
                "a",
                "b",
                "..",
                ".",
                "",
                "sentinel",
                "sdir",
                "deep",
                "inner",
                "link-out",
                "other",
                "layers",
                "sha256",
                "cur",
                "etc",
                "passwd",
                ".wh.",
                ".wh..",
                ".wh...",
                ".wh.a",
                ".wh.b",
                ".wh.sentinel",
                ".wh.sdir",
                ".wh.cur",
                ".wh.other",
                ".wh..wh..opq",
                ".wh..wh.plnk",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            names.push("l".repeat(150));
            names.push(format!(".wh.{}", "l".repeat(150)));
            prop::sample::select(names)
        }

        fn path() -> impl Strategy<Value = String> {
            (
                prop::sample::select(vec!["", "/", "./", "../", "//"]),
                prop::collection::vec(component(), 1..5),
                prop::sample::select(vec!["", "/"]),
            )
                .prop_map(|(pre, parts, post)| format!("{pre}{}{post}", parts.join("/")))
        }

        fn target() -> impl Strategy<Value = String> {
            prop_oneof![
                path(),
                prop::sample::select(vec![
                    "..",
                    "../..",
                    "../../..",
                    "/",
                    "@OUT",
                    "@OUT/sdir",
                    "@OUT/sentinel",
                    "@OUT/layers/sha256/other",
                    "/etc",
                    "../sentinel",
                    "../other/etc/passwd",
                    "../../../sdir",
                ])
                .prop_map(String::from),
            ]
        }

        fn kind() -> impl Strategy<Value = tar::EntryType> {
            prop::sample::select(vec![
                tar::EntryType::Regular,
                tar::EntryType::Directory,
                tar::EntryType::Symlink,
                tar::EntryType::Symlink,
                tar::EntryType::Link,
                tar::EntryType::Link,
                tar::EntryType::Fifo,
                tar::EntryType::Char,
                tar::EntryType::Block,
            ])
        }

        type Op = (tar::EntryType, String, String, bool);

        fn ops() -> impl Strategy<Value = (Vec<Op>, bool)> {
            (
                prop::collection::vec((kind(), path(), target(), any::<bool>()), 1..10),
                any::<bool>(),
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 1024,
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            #[test]
            fn nothing_outside_the_layer_changes((ops, gzip) in ops()) {
                root();
                let sandbox = Sandbox::new();
                let outside = sandbox.outside().to_string_lossy().into_owned();
                let mut layer = TarLayer::new();
                for (kind, name, target, pax) in &ops {
                    let link = match kind {
                        tar::EntryType::Symlink | tar::EntryType::Link => {
                            target.replace("@OUT", &outside)
                        }
                        _ => String::new(),
                    };
                    let long = if *pax { LongNames::Pax } else { LongNames::Gnu };
                    layer.long_entry(*kind, name, &link, b"x", long);
                }
                let bytes = if gzip { layer.gzip() } else { layer.bytes() };
                // Panics when anything outside the layer directory changed.
                let _ = sandbox.unpack(&bytes);
            }
        }
    }
}
