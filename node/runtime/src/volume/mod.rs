//! Filesystem code for pod volumes that must not be turned against the node by what a
//! container can put into a volume (Kubernetes' CVE-2017-1002101, CVE-2017-1002102 and
//! CVE-2021-25741 classes): pure file-descriptor work, no mounts, no pod types, so that it is
//! unit-tested here and fuzzed (`tests/fuzz`, target `volume_paths`) without the agent.
//!
//! * [`writer`]: the kubelet's AtomicWriter for secret, configMap, projected and downwardAPI
//!   volumes: every update goes into a new `..<timestamp>` directory, a `..data` symlink to
//!   it is swapped atomically, and the visible names are symlinks `<name> -> ..data/<name>`.
//! * [`subpath`]: a volumeMount's subPath, resolved from the volume's directory one
//!   component at a time without following a symlink, ending on a descriptor the runtime
//!   mounts from.
//!
//! Every lookup below a volume's directory is relative to a directory descriptor, through
//! `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (or `O_NOFOLLOW` on a single
//! component), so a symlink planted anywhere inside a volume is never followed; ownership
//! and modes are set on opened descriptors (`fchown`, `fchmod`), never through a path.

pub mod subpath;
pub mod writer;

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;

pub use subpath::SubPath;
pub use writer::{FileProjection, Payload};

/// Why a volume's files could not be written or a subPath not resolved. Messages name
/// paths inside the volume, never file contents.
#[derive(Debug, thiserror::Error)]
pub enum VolumeFsError {
    /// An item path or a subPath that could leave the volume or is not a path at all.
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    /// A symbolic link where a directory or file of the volume was expected.
    #[error("{path} is a symbolic link")]
    Symlink { path: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

impl VolumeFsError {
    pub(crate) fn io(op: &'static str, path: impl Into<String>) -> impl FnOnce(Errno) -> Self {
        let path = path.into();
        move |e| VolumeFsError::Io {
            op,
            path,
            source: io::Error::from(e),
        }
    }
}

/// How deep a tree below a volume may be (payload paths, subPaths, and the trees the
/// writer compares or removes): bounds recursion and open descriptors.
pub const MAX_DEPTH: usize = 128;

/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`: stays below the directory
/// descriptor, follows no symlink (magic links included), crosses no mount.
fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_XDEV
}

/// Opens the directory `name` (one component) of `dir` for reading and as a base for more
/// `*at` calls; fails on a symlink (`ELOOP`), on anything but a directory (`ENOTDIR`) and on
/// a mount point (`EXDEV`).
pub(crate) fn open_dir_at(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(beneath());
    nix::fcntl::openat2(dir, name, how)
}

/// `lstat` of `name` in `dir`.
pub(crate) fn lstat_at(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<FileStat> {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

/// The file type bits of `st`.
pub(crate) fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// The names in directory `dir` (without `.` and `..`).
pub(crate) fn list(dir: BorrowedFd<'_>) -> nix::Result<Vec<OsString>> {
    // A new open file description: iterating must not move `dir`'s offset.
    let fd = nix::fcntl::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut d = nix::dir::Dir::from_fd(fd)?;
    let mut out = Vec::new();
    for entry in d.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    Ok(out)
}

/// Removes `name` from `dir`: a symlink or file is unlinked (a symlink's target is never
/// touched), a directory is emptied the same way and removed. Never follows a symlink, never
/// descends into a mount point (`EXDEV`) or deeper than `depth` levels (`ELOOP`). A
/// missing `name` is not an error.
pub(crate) fn remove_at(dir: BorrowedFd<'_>, name: &OsStr, depth: usize) -> nix::Result<()> {
    let st = match lstat_at(dir, name) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    if kind(&st) != SFlag::S_IFDIR {
        return match nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Err(Errno::ENOENT) => Ok(()),
            r => r,
        };
    }
    if depth == 0 {
        return Err(Errno::ELOOP);
    }
    let sub = open_dir_at(dir, name)?;
    for child in list(sub.as_fd())? {
        remove_at(sub.as_fd(), &child, depth - 1)?;
    }
    drop(sub);
    match nix::unistd::unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
        Err(Errno::ENOENT) => Ok(()),
        r => r,
    }
}

/// The components of a relative path given as bytes (an item path, a subPath): `/`-separated,
/// empty and `.` components dropped. Refuses an empty path, an absolute one, a `..`
/// component, a NUL byte, more than 4096 bytes, a name over 255 bytes and more than
/// [`MAX_DEPTH`] components (the kubelet's `validatePath`, plus the NUL and depth bounds).
pub(crate) fn components(path: &[u8]) -> Result<Vec<OsString>, VolumeFsError> {
    let bad = |reason| VolumeFsError::InvalidPath {
        path: String::from_utf8_lossy(path).into_owned(),
        reason,
    };
    if path.is_empty() {
        return Err(bad("must not be empty"));
    }
    if path.starts_with(b"/") {
        return Err(bad("must be a relative path"));
    }
    if path.len() > 4096 {
        return Err(bad("must be at most 4096 characters"));
    }
    if path.contains(&0) {
        return Err(bad("must not contain a NUL byte"));
    }
    let mut out = Vec::new();
    for c in path.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(bad("must not contain '..'")),
            c if c.len() > 255 => return Err(bad("file names must be at most 255 characters")),
            c => out.push(OsStr::from_bytes(c).to_os_string()),
        }
    }
    if out.is_empty() {
        return Err(bad("must name a file"));
    }
    if out.len() > MAX_DEPTH {
        return Err(bad("too many directories deep"));
    }
    Ok(out)
}

/// `a/b/c` of components, for messages.
pub(crate) fn shown(parts: &[OsString]) -> String {
    let mut s = String::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            s.push('/');
        }
        s.push_str(&p.to_string_lossy());
    }
    s
}

/// Opens directory `path` (an absolute node path the caller trusts, e.g. the agent's own
/// volume directory) without following a symlink in its last component.
pub(crate) fn open_volume_dir(path: &std::path::Path) -> Result<OwnedFd, VolumeFsError> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(VolumeFsError::io("opening", path.display().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_leave_the_volume_are_refused() {
        let ok = |p: &str| shown(&components(p.as_bytes()).unwrap());
        assert_eq!(ok("a"), "a");
        assert_eq!(ok("./a//b/."), "a/b");
        assert_eq!(ok("a/..b"), "a/..b");
        for bad in [
            "",
            "/etc/passwd",
            "..",
            "../x",
            "a/../../x",
            "a/..",
            ".",
            "./",
            "a\0b",
        ] {
            assert!(
                matches!(
                    components(bad.as_bytes()),
                    Err(VolumeFsError::InvalidPath { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(components(&[b'x'; 256]).is_err());
        assert!(components("a/".repeat(MAX_DEPTH + 1).as_bytes()).is_err());
    }

    #[test]
    fn removal_never_follows_a_symlink() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "x").unwrap();
        let vol = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(vol.path().join("d/e")).unwrap();
        std::os::unix::fs::symlink(outside.path(), vol.path().join("d/e/link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("keep"), vol.path().join("d/f")).unwrap();
        let fd = open_volume_dir(vol.path()).unwrap();
        remove_at(fd.as_fd(), OsStr::new("d"), MAX_DEPTH).unwrap();
        assert!(!vol.path().join("d").exists());
        assert_eq!(std::fs::read(outside.path().join("keep")).unwrap(), b"x");
        remove_at(fd.as_fd(), OsStr::new("missing"), MAX_DEPTH).unwrap();
    }
}
