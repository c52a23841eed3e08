//! A volumeMount's subPath, resolved so that what is mounted is what was checked
//! (CVE-2017-1002101, CVE-2021-25741).
//!
//! A container can rename and symlink inside its writable volumes, so a path lookup that
//! follows symlinks (a check of the path, then `mount(2)` of the path) can be raced into
//! mounting any node directory. Here the subPath is walked from the volume's directory
//! descriptor one component at a time with `O_PATH | O_NOFOLLOW`: a component that is a
//! symlink is refused, and the walk ends on a descriptor of the checked file or directory.
//! The runtime mounts from that descriptor (`open_tree(fd, "", AT_EMPTY_PATH)`, the
//! equivalent of the kubelet's bind mount of `/proc/<pid>/fd/<fd>` without the magic link):
//! a symlink swapped in after the walk changes nothing, the descriptor still names the
//! directory that was checked.
//!
//! **Who walks.** The bind mount is made by the shim's child in the container's new mount
//! namespace, a process forked long after the agent prepared the spec, so a descriptor the
//! agent opened would have to travel through the shim's command line or a socket. Instead the
//! agent does the walk once to create missing directories and to report a bad subPath as
//! CreateContainerConfigError ([`prepare`]), and the runtime's mount step does the same walk
//! again, without creating anything, right before it mounts ([`open`], called from
//! `confine::open_sources`), and mounts from the descriptor it ends on. The second walk is
//! the one that decides what is mounted, so a container racing the first one gains nothing.
//!
//! **Projected volumes.** The visible names of a volume the [`super::writer`] wrote are
//! symlinks (`key -> ..data/key`), so for those ([`SubPath::data_link`]) the walk first
//! reads the `..data` link (which must name a timestamped directory next to it, one
//! component) and walks the subPath inside that directory: a subPath of a configMap key
//! works as in Kubernetes, and it does not see later updates, as in Kubernetes.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};
use serde::{Deserialize, Serialize};

use super::writer::DATA_LINK;
use super::{VolumeFsError, components, kind, shown};

/// A path beneath a mount's source to mount instead of the source (a volumeMount's
/// subPath).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubPath {
    /// Relative, without `..`.
    pub path: PathBuf,
    /// The source is a volume of the [`super::writer`]: resolve through its `..data` link.
    #[serde(default)]
    pub data_link: bool,
}

/// Opens `sub` beneath the directory `base` (a volume's directory, trusted: the agent's own
/// path or an administrator's hostPath) without following a symlink in `sub`; returns an
/// `O_PATH` descriptor of what it names. Nothing is created.
pub fn open(base: &Path, sub: &SubPath) -> Result<OwnedFd, VolumeFsError> {
    walk(base, sub, false)
}

/// [`open`], creating missing directories on the way (with the mode of `base`, as the
/// kubelet's `SafeMakeDir` does), except in a projected volume ([`SubPath::data_link`]),
/// whose files only the writer makes.
pub fn prepare(base: &Path, sub: &SubPath) -> Result<OwnedFd, VolumeFsError> {
    walk(base, sub, !sub.data_link)
}

fn walk(base: &Path, sub: &SubPath, create: bool) -> Result<OwnedFd, VolumeFsError> {
    let parts = components(sub.path.as_os_str().as_bytes())?;
    let base_fd = nix::fcntl::open(
        base,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(VolumeFsError::io("opening", base.display().to_string()))?;
    let base_mode = nix::sys::stat::fstat(&base_fd)
        .map_err(VolumeFsError::io("stat", base.display().to_string()))?
        .st_mode
        & 0o7777;
    let mut cur = base_fd;
    if sub.data_link {
        let target = nix::fcntl::readlinkat(&cur, DATA_LINK)
            .map_err(VolumeFsError::io("reading", DATA_LINK))?;
        let t = target.as_bytes();
        if t.len() <= 2 || !t.starts_with(b"..") || t.contains(&b'/') {
            return Err(VolumeFsError::InvalidPath {
                path: DATA_LINK.into(),
                reason: "does not name a data directory of the volume",
            });
        }
        cur = step(&cur, &target, DATA_LINK)?;
    }
    for (i, part) in parts.iter().enumerate() {
        let at = shown(&parts[..=i]);
        let next = match step(&cur, part, &at) {
            Err(VolumeFsError::Io { source, .. })
                if create && source.raw_os_error() == Some(Errno::ENOENT as i32) =>
            {
                make_dir(&cur, part, base_mode, &at)?;
                step(&cur, part, &at)?
            }
            r => r?,
        };
        if i + 1 < parts.len() {
            let st = nix::sys::stat::fstat(&next).map_err(VolumeFsError::io("stat", &*at))?;
            if kind(&st) != SFlag::S_IFDIR {
                return Err(VolumeFsError::io("opening", at)(Errno::ENOTDIR));
            }
        }
        cur = next;
    }
    Ok(cur)
}

/// Opens the single component `name` of `dir` with `O_PATH | O_NOFOLLOW` and refuses a
/// symlink.
fn step(dir: &OwnedFd, name: &OsStr, shown: &str) -> Result<OwnedFd, VolumeFsError> {
    let fd = nix::fcntl::openat(
        dir.as_fd(),
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(VolumeFsError::io("opening", shown))?;
    let st = nix::sys::stat::fstat(&fd).map_err(VolumeFsError::io("stat", shown))?;
    if kind(&st) == SFlag::S_IFLNK {
        return Err(VolumeFsError::Symlink {
            path: shown.to_string(),
        });
    }
    Ok(fd)
}

/// `mkdirat` of `name` in `dir`, then its mode set on the new directory's own descriptor
/// (opened without following a symlink: one swapped in meanwhile fails the walk).
fn make_dir(dir: &OwnedFd, name: &OsStr, mode: u32, shown: &str) -> Result<(), VolumeFsError> {
    match nix::sys::stat::mkdirat(dir.as_fd(), name, Mode::from_bits_truncate(0o700)) {
        Ok(()) => {}
        Err(Errno::EEXIST) => return Ok(()),
        Err(e) => return Err(VolumeFsError::io("creating", shown)(e)),
    }
    let fd = nix::fcntl::openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(VolumeFsError::io("opening", shown))?;
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode))
        .map_err(VolumeFsError::io("chmod", shown))
}

/// The node path a descriptor names now (for messages and tests).
pub fn fd_path(fd: &OwnedFd) -> std::io::Result<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn sp(p: &str) -> SubPath {
        SubPath {
            path: p.into(),
            data_link: false,
        }
    }

    #[test]
    fn directories_are_made_and_opened_inside_the_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        fs::create_dir(&vol).unwrap();
        fs::set_permissions(&vol, fs::Permissions::from_mode(0o777)).unwrap();
        let fd = prepare(&vol, &sp("a/b")).unwrap();
        assert_eq!(fd_path(&fd).unwrap(), vol.join("a/b"));
        assert_eq!(
            fs::metadata(vol.join("a/b")).unwrap().permissions().mode() & 0o7777,
            0o777
        );
        assert_eq!(
            fd_path(&open(&vol, &sp("./a//b")).unwrap()).unwrap(),
            vol.join("a/b")
        );
        fs::write(vol.join("a/file"), "x").unwrap();
        assert_eq!(
            fd_path(&open(&vol, &sp("a/file")).unwrap()).unwrap(),
            vol.join("a/file")
        );
        // `open` creates nothing; a file is no directory.
        assert!(open(&vol, &sp("c")).is_err());
        assert!(!vol.join("c").exists());
        assert!(prepare(&vol, &sp("a/file/x")).is_err());
        for bad in ["../x", "/etc", "a/../../x", ""] {
            assert!(
                matches!(
                    prepare(&vol, &sp(bad)),
                    Err(VolumeFsError::InvalidPath { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_symlink_at_any_component_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir_all(outside.join("x")).unwrap();
        let vol = tmp.path().join("vol");
        fs::create_dir_all(vol.join("a/b")).unwrap();
        symlink(&outside, vol.join("evil")).unwrap();
        symlink(&outside, vol.join("a/evil")).unwrap();
        symlink("b", vol.join("a/inside")).unwrap();
        symlink("../../outside", vol.join("a/b/up")).unwrap();
        for p in [
            "evil", "evil/x", "a/evil", "a/evil/x", "a/inside", "a/b/up/x",
        ] {
            for r in [open(&vol, &sp(p)), prepare(&vol, &sp(p))] {
                match r {
                    Err(VolumeFsError::Symlink { path }) => {
                        assert!(p.starts_with(&path), "{p}: {path}")
                    }
                    other => panic!("{p}: {other:?}"),
                }
            }
        }
        assert_eq!(
            fs::read_dir(&outside).unwrap().count(),
            1,
            "nothing made outside"
        );
    }

    #[test]
    fn a_symlink_swapped_in_after_the_walk_changes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("node-secret"), "x").unwrap();
        let vol = tmp.path().join("vol");
        fs::create_dir_all(vol.join("a/b")).unwrap();
        fs::write(vol.join("a/b/mine"), "y").unwrap();
        let fd = open(&vol, &sp("a/b")).unwrap();
        // The container renames the checked directory away and plants a symlink to a node
        // directory in its place, between the check and the use.
        fs::rename(vol.join("a/b"), vol.join("a/moved")).unwrap();
        symlink(&outside, vol.join("a/b")).unwrap();
        // The descriptor still names the directory that was checked, not the node's.
        assert_eq!(fd_path(&fd).unwrap(), vol.join("a/moved"));
        let names: Vec<_> = fs::read_dir(format!("/proc/self/fd/{}", {
            use std::os::fd::AsRawFd;
            fd.as_raw_fd()
        }))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
        assert_eq!(names, ["mine"]);
        // And a walk now refuses it.
        assert!(matches!(
            open(&vol, &sp("a/b")),
            Err(VolumeFsError::Symlink { .. })
        ));
    }

    #[test]
    fn projected_volumes_resolve_through_their_data_link() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path();
        let payload: super::super::Payload<'_> = [(
            PathBuf::from("conf/app.yaml"),
            super::super::FileProjection {
                data: b"k: v".as_slice().into(),
                mode: 0o644,
            },
        )]
        .into();
        super::super::writer::write_payload(vol, &payload, None).unwrap();
        let sub = SubPath {
            path: "conf/app.yaml".into(),
            data_link: true,
        };
        let fd = prepare(vol, &sub).unwrap();
        let ts = fs::read_link(vol.join(DATA_LINK)).unwrap();
        assert_eq!(fd_path(&fd).unwrap(), vol.join(ts).join("conf/app.yaml"));
        // Without the data link the visible name is a symlink, refused.
        assert!(matches!(
            open(vol, &sp("conf/app.yaml")),
            Err(VolumeFsError::Symlink { .. })
        ));
        // Nothing is made in a projected volume; a `..data` naming something else is refused.
        assert!(
            prepare(
                vol,
                &SubPath {
                    path: "nope".into(),
                    data_link: true
                }
            )
            .is_err()
        );
        assert!(!vol.join("nope").exists());
        fs::remove_file(vol.join(DATA_LINK)).unwrap();
        symlink("/etc", vol.join(DATA_LINK)).unwrap();
        assert!(matches!(
            open(vol, &sub),
            Err(VolumeFsError::InvalidPath { .. })
        ));
    }
}
