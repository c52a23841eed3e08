//! The kubelet's AtomicWriter (pkg/volume/util/atomic_writer.go): how the agent writes the
//! files of secret, configMap, projected and downwardAPI volumes, which containers mount
//! read-only and read while the agent updates them.
//!
//! Layout of a volume directory after [`write_payload`]:
//!
//! ```text
//! ..2026_11_27_07_30_00.123456789/   the payload, written once, never changed
//!     user
//!     nested/pass
//! ..data -> ..2026_11_27_07_30_00.123456789
//! user -> ..data/user                one symlink per top-level name of the payload
//! nested -> ..data/nested
//! ```
//!
//! An update writes a new timestamped directory, makes a symlink `..data_tmp` to it and
//! renames it over `..data` (one atomic step: a reader that opens `..data` sees the old
//! payload or the new one, never a mix), adds the visible symlinks of new names, then removes
//! every other entry of the volume directory (the previous timestamped directory, names no
//! longer in the payload, leftovers of an interrupted update). A payload equal to what
//! `..data` holds (paths, contents, modes, group) is not rewritten.
//!
//! The volume directory may hold anything (a container of an older agent could write
//! there; the fuzz target plants hostile trees): every step works from the volume's
//! directory descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_XDEV)` or single-component `*at` calls that do not follow a symlink
//! (`O_CREAT | O_EXCL | O_NOFOLLOW` for new files, `mkdirat`, `symlinkat`, `renameat`,
//! `unlinkat`), so nothing is ever written, chowned, chmodded or removed outside it; a
//! planted entry is removed (the link itself, never its target) or makes the write fail.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::Gid;

use super::{MAX_DEPTH, VolumeFsError, beneath, components, kind, list, lstat_at, open_dir_at};

/// The symlink to the current timestamped directory.
pub const DATA_LINK: &str = "..data";
/// The new `..data` before it is renamed over the old one.
const DATA_TMP: &str = "..data_tmp";

/// One file of a payload: its content and permission bits (masked to `0o777`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection<'a> {
    pub data: Cow<'a, [u8]>,
    pub mode: u32,
}

/// The files of a volume by relative path (see [`super::components`] for what is refused).
pub type Payload<'a> = BTreeMap<PathBuf, FileProjection<'a>>;

/// A validated payload: the path's components, its file.
type Files<'p, 'a> = BTreeMap<Vec<OsString>, &'p FileProjection<'a>>;

/// Writes `payload` into the volume directory `dir` (see the module documentation); with
/// `fs_group`, files and directories belong to that group. Returns whether the payload
/// changed (a new timestamped directory was swapped in).
pub fn write_payload(
    dir: &Path,
    payload: &Payload<'_>,
    fs_group: Option<u32>,
) -> Result<bool, VolumeFsError> {
    let fd = super::open_volume_dir(dir)?;
    write_payload_at(fd.as_fd(), payload, fs_group)
}

/// [`write_payload`] into the directory open as `vol`.
pub fn write_payload_at(
    vol: BorrowedFd<'_>,
    payload: &Payload<'_>,
    fs_group: Option<u32>,
) -> Result<bool, VolumeFsError> {
    let files = validate(payload)?;
    let current = current_data_dir(vol);
    let unchanged = match &current {
        Some(ts) => same_content(vol, ts, &files, fs_group),
        None => false,
    };
    let (ts, wrote) = match current {
        Some(ts) if unchanged => (ts, false),
        _ => {
            let (ts, fd) = new_data_dir(vol, fs_group)?;
            if let Err(e) = write_files(fd.as_fd(), &files, fs_group) {
                drop(fd);
                let _ = super::remove_at(vol, &ts, MAX_DEPTH);
                return Err(e);
            }
            drop(fd);
            swap_data_link(vol, &ts)?;
            (ts, true)
        }
    };
    let visible: BTreeSet<&OsString> = files.keys().filter_map(|p| p.first()).collect();
    for name in &visible {
        ensure_visible(vol, name)?;
    }
    // Everything else goes: the previous data directory, names no longer in the payload,
    // leftovers and anything planted.
    for name in list(vol).map_err(VolumeFsError::io("listing", "the volume"))? {
        if name == DATA_LINK || name == ts || visible.contains(&name) {
            continue;
        }
        super::remove_at(vol, &name, MAX_DEPTH).map_err(VolumeFsError::io(
            "removing",
            name.to_string_lossy().into_owned(),
        ))?;
    }
    Ok(wrote)
}

/// Checks every path of `payload` and that no two name the same file.
fn validate<'p, 'a>(payload: &'p Payload<'a>) -> Result<Files<'p, 'a>, VolumeFsError> {
    let mut files = Files::new();
    for (path, file) in payload {
        let parts = components(path.as_os_str().as_bytes())?;
        if parts[0].as_bytes().starts_with(b"..") {
            return Err(VolumeFsError::InvalidPath {
                path: path.display().to_string(),
                reason: "must not start with '..'",
            });
        }
        if files.insert(parts, file).is_some() {
            return Err(VolumeFsError::InvalidPath {
                path: path.display().to_string(),
                reason: "names the same file as another item",
            });
        }
    }
    Ok(files)
}

/// Whether `name` can be a timestamped data directory's name: one component starting with
/// `..` that is none of the writer's other names.
fn is_data_dir_name(name: &[u8]) -> bool {
    name.len() > 2
        && name.starts_with(b"..")
        && !name.contains(&b'/')
        && name != DATA_LINK.as_bytes()
        && name != DATA_TMP.as_bytes()
}

/// The timestamped directory `..data` names, when it is a symlink to one that exists.
fn current_data_dir(vol: BorrowedFd<'_>) -> Option<OsString> {
    let target = nix::fcntl::readlinkat(vol, DATA_LINK).ok()?;
    if !is_data_dir_name(target.as_bytes()) {
        return None;
    }
    let st = lstat_at(vol, &target).ok()?;
    (kind(&st) == SFlag::S_IFDIR).then_some(target)
}

/// Whether the data directory `ts` holds exactly `files` (contents, modes, group).
fn same_content(
    vol: BorrowedFd<'_>,
    ts: &OsStr,
    files: &Files<'_, '_>,
    fs_group: Option<u32>,
) -> bool {
    let Ok(dir) = open_dir_at(vol, ts) else {
        return false;
    };
    let mut seen = 0;
    let mut prefix = Vec::new();
    same_tree(dir.as_fd(), &mut prefix, files, fs_group, &mut seen) && seen == files.len()
}

fn same_tree(
    dir: BorrowedFd<'_>,
    prefix: &mut Vec<OsString>,
    files: &Files<'_, '_>,
    fs_group: Option<u32>,
    seen: &mut usize,
) -> bool {
    if prefix.len() > MAX_DEPTH {
        return false;
    }
    let Ok(names) = list(dir) else {
        return false;
    };
    for name in names {
        let Ok(st) = lstat_at(dir, &name) else {
            return false;
        };
        if fs_group.is_some_and(|g| st.st_gid != g) {
            return false;
        }
        prefix.push(name.clone());
        let same = match kind(&st) {
            SFlag::S_IFDIR => match open_dir_at(dir, &name) {
                Ok(sub) => same_tree(sub.as_fd(), prefix, files, fs_group, seen),
                Err(_) => false,
            },
            SFlag::S_IFREG => match files.get(prefix.as_slice()) {
                Some(want)
                    if st.st_mode & 0o7777 == want.mode & 0o777
                        && u64::try_from(st.st_size).ok() == Some(want.data.len() as u64) =>
                {
                    *seen += 1;
                    read_at(dir, &name).is_some_and(|data| data == *want.data)
                }
                _ => false,
            },
            _ => false,
        };
        prefix.pop();
        if !same {
            return false;
        }
    }
    true
}

/// The content of regular file `name` of `dir` (not following a symlink, not blocking on
/// a FIFO).
fn read_at(dir: BorrowedFd<'_>, name: &OsStr) -> Option<Vec<u8>> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)
        .resolve(beneath());
    let fd = nix::fcntl::openat2(dir, name, how).ok()?;
    let st = nix::sys::stat::fstat(&fd).ok()?;
    if kind(&st) != SFlag::S_IFREG {
        return None;
    }
    let mut out = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut out).ok()?;
    Some(out)
}

/// Makes a new, empty timestamped directory (`..YYYY_MM_DD_HH_MM_SS.NNNNNNNNN`, as the
/// kubelet names them) and opens it.
fn new_data_dir(
    vol: BorrowedFd<'_>,
    fs_group: Option<u32>,
) -> Result<(OsString, OwnedFd), VolumeFsError> {
    let stamp = chrono::Utc::now()
        .format("..%Y_%m_%d_%H_%M_%S.%9f")
        .to_string();
    for n in 0..100u32 {
        let name = if n == 0 {
            OsString::from(&stamp)
        } else {
            OsString::from(format!("{stamp}_{n}"))
        };
        match nix::sys::stat::mkdirat(vol, name.as_os_str(), Mode::from_bits_truncate(0o755)) {
            Ok(()) => {
                let fd = open_dir_at(vol, &name).map_err(VolumeFsError::io(
                    "opening",
                    name.to_string_lossy().into_owned(),
                ))?;
                own(fd.as_fd(), 0o755, fs_group, &name.to_string_lossy())?;
                return Ok((name, fd));
            }
            Err(Errno::EEXIST) => continue,
            Err(e) => {
                return Err(VolumeFsError::io("creating", name.to_string_lossy())(e));
            }
        }
    }
    Err(VolumeFsError::io("creating", stamp)(Errno::EEXIST))
}

/// Sets the group (when asked) and the mode of an opened file or directory.
fn own(
    fd: BorrowedFd<'_>,
    mode: u32,
    fs_group: Option<u32>,
    shown: &str,
) -> Result<(), VolumeFsError> {
    if let Some(g) = fs_group {
        nix::unistd::fchown(fd, None, Some(Gid::from_raw(g)))
            .map_err(VolumeFsError::io("chown", shown))?;
    }
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode & 0o7777))
        .map_err(VolumeFsError::io("chmod", shown))
}

/// Writes `files` into the new data directory `root`.
fn write_files(
    root: BorrowedFd<'_>,
    files: &Files<'_, '_>,
    fs_group: Option<u32>,
) -> Result<(), VolumeFsError> {
    for (parts, file) in files {
        let shown = super::shown(parts);
        let Some((name, parents)) = parts.split_last() else {
            continue;
        };
        let mut dir: Option<OwnedFd> = None;
        for p in parents {
            let here = dir.as_ref().map_or(root, |d| d.as_fd());
            let created =
                match nix::sys::stat::mkdirat(here, p.as_os_str(), Mode::from_bits_truncate(0o755))
                {
                    Ok(()) => true,
                    Err(Errno::EEXIST) => false,
                    Err(e) => return Err(VolumeFsError::io("creating a directory of", &*shown)(e)),
                };
            let sub = open_dir_at(here, p)
                .map_err(VolumeFsError::io("opening a directory of", &*shown))?;
            if created {
                own(sub.as_fd(), 0o755, fs_group, &shown)?;
            }
            dir = Some(sub);
        }
        let here = dir.as_ref().map_or(root, |d| d.as_fd());
        let how = OpenHow::new()
            .flags(
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
            )
            .mode(Mode::from_bits_truncate(0o600))
            .resolve(beneath());
        let fd = nix::fcntl::openat2(here, name.as_os_str(), how)
            .map_err(VolumeFsError::io("creating", &*shown))?;
        own(fd.as_fd(), file.mode & 0o777, fs_group, &shown)?;
        std::fs::File::from(fd)
            .write_all(&file.data)
            .map_err(|source| VolumeFsError::Io {
                op: "writing",
                path: shown.clone(),
                source,
            })?;
    }
    Ok(())
}

/// Points `..data` at `ts` in one step: a new symlink `..data_tmp` renamed over it.
fn swap_data_link(vol: BorrowedFd<'_>, ts: &OsStr) -> Result<(), VolumeFsError> {
    super::remove_at(vol, OsStr::new(DATA_TMP), MAX_DEPTH)
        .map_err(VolumeFsError::io("removing", DATA_TMP))?;
    nix::unistd::symlinkat(ts, vol, DATA_TMP).map_err(VolumeFsError::io("creating", DATA_TMP))?;
    match nix::fcntl::renameat(vol, DATA_TMP, vol, DATA_LINK) {
        Ok(()) => Ok(()),
        // Something that is not a symlink sits at `..data` (a directory): it goes.
        Err(Errno::EISDIR | Errno::ENOTEMPTY | Errno::EEXIST) => {
            super::remove_at(vol, OsStr::new(DATA_LINK), MAX_DEPTH)
                .map_err(VolumeFsError::io("removing", DATA_LINK))?;
            nix::fcntl::renameat(vol, DATA_TMP, vol, DATA_LINK)
                .map_err(VolumeFsError::io("renaming to", DATA_LINK))
        }
        Err(e) => Err(VolumeFsError::io("renaming to", DATA_LINK)(e)),
    }
}

/// Makes the visible name `name` a symlink `name -> ..data/name` (replacing whatever else is
/// there).
fn ensure_visible(vol: BorrowedFd<'_>, name: &OsStr) -> Result<(), VolumeFsError> {
    let mut want = OsString::from(DATA_LINK);
    want.push("/");
    want.push(name);
    let shown = name.to_string_lossy();
    match nix::fcntl::readlinkat(vol, name) {
        Ok(t) if t == want => return Ok(()),
        Err(Errno::ENOENT) => {}
        _ => super::remove_at(vol, name, MAX_DEPTH)
            .map_err(VolumeFsError::io("removing", &*shown))?,
    }
    nix::unistd::symlinkat(want.as_os_str(), vol, name)
        .map_err(VolumeFsError::io("creating the symlink", &*shown))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn payload(files: &[(&str, &str, u32)]) -> Payload<'static> {
        files
            .iter()
            .map(|(p, d, m)| {
                (
                    PathBuf::from(p),
                    FileProjection {
                        data: Cow::Owned(d.as_bytes().to_vec()),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    /// Every path below `dir` with what it is: `d` directory, `f:<content>` file,
    /// `l:<target>` symlink.
    fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
        let mut out = BTreeMap::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = fs::symlink_metadata(&p).unwrap();
                let what = if m.file_type().is_symlink() {
                    format!("l:{}", fs::read_link(&p).unwrap().display())
                } else if m.is_dir() {
                    todo.push(p.clone());
                    "d".into()
                } else {
                    format!(
                        "f:{}:{:o}",
                        String::from_utf8_lossy(&fs::read(&p).unwrap()),
                        m.mode()
                    )
                };
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), what);
            }
        }
        out
    }

    fn data_dirs(vol: &Path) -> Vec<String> {
        fs::read_dir(vol)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| is_data_dir_name(n.as_bytes()))
            .collect()
    }

    #[test]
    fn writes_the_kubelet_layout_and_updates_it() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path();
        let p = payload(&[
            ("user", "admin", 0o400),
            ("nested/pass", "s3", 0o644),
            ("z", "", 0o600),
        ]);
        assert!(write_payload(vol, &p, None).unwrap());
        assert_eq!(fs::read_to_string(vol.join("user")).unwrap(), "admin");
        assert_eq!(fs::read_to_string(vol.join("nested/pass")).unwrap(), "s3");
        assert_eq!(
            fs::read_link(vol.join("user")).unwrap(),
            Path::new("..data/user")
        );
        assert_eq!(
            fs::read_link(vol.join("nested")).unwrap(),
            Path::new("..data/nested")
        );
        let first = data_dirs(vol);
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(
            fs::read_link(vol.join(DATA_LINK)).unwrap(),
            Path::new(&first[0])
        );
        assert_eq!(
            fs::metadata(vol.join("user")).unwrap().permissions().mode() & 0o7777,
            0o400
        );
        // The same payload again: nothing rewritten.
        assert!(!write_payload(vol, &p, None).unwrap());
        assert_eq!(data_dirs(vol), first);
        // A mode change is a change.
        let p2 = payload(&[
            ("user", "admin", 0o440),
            ("nested/pass", "s3", 0o644),
            ("z", "", 0o600),
        ]);
        assert!(write_payload(vol, &p2, None).unwrap());
        assert_eq!(
            fs::metadata(vol.join("user")).unwrap().permissions().mode() & 0o7777,
            0o440
        );
        // A removed key loses its name; the old data directory goes.
        let p3 = payload(&[("user", "root", 0o400)]);
        assert!(write_payload(vol, &p3, None).unwrap());
        let names: BTreeSet<String> = fs::read_dir(vol)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let dirs = data_dirs(vol);
        assert_eq!(dirs.len(), 1);
        assert_ne!(dirs, first);
        assert_eq!(
            names,
            BTreeSet::from(["..data".into(), "user".into(), dirs[0].clone()])
        );
        assert_eq!(fs::read_to_string(vol.join("user")).unwrap(), "root");
        // An empty payload (an optional Secret that is missing): only `..data`.
        write_payload(vol, &Payload::new(), None).unwrap();
        assert_eq!(fs::read_dir(vol).unwrap().count(), 2);
    }

    #[test]
    fn the_fs_group_owns_files_and_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let gid = nix::unistd::getegid().as_raw();
        // Root may give files any group; others only their own.
        let group = if nix::unistd::geteuid().is_root() {
            4242
        } else {
            gid
        };
        let p = payload(&[("a/b", "x", 0o644)]);
        write_payload(tmp.path(), &p, Some(group)).unwrap();
        assert_eq!(fs::metadata(tmp.path().join("a/b")).unwrap().gid(), group);
        assert_eq!(fs::metadata(tmp.path().join("a")).unwrap().gid(), group);
        assert!(!write_payload(tmp.path(), &p, Some(group)).unwrap());
    }

    #[test]
    fn items_that_leave_the_volume_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/x", "a/../../x", "..data", "..x/y", "", "a/.."] {
            let e = write_payload(tmp.path(), &payload(&[(bad, "x", 0o644)]), None).unwrap_err();
            assert!(
                matches!(e, VolumeFsError::InvalidPath { .. }),
                "{bad:?}: {e}"
            );
        }
        let dup = payload(&[("a", "1", 0o644), ("./a", "2", 0o644)]);
        assert!(write_payload(tmp.path(), &dup, None).is_err());
        assert_eq!(
            fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "nothing written"
        );
        // A file and a directory of the same name: refused, the old payload stays.
        write_payload(tmp.path(), &payload(&[("k", "v", 0o644)]), None).unwrap();
        let clash = payload(&[("a", "1", 0o644), ("a/b", "2", 0o644)]);
        assert!(write_payload(tmp.path(), &clash, None).is_err());
        assert_eq!(fs::read_to_string(tmp.path().join("k")).unwrap(), "v");
        assert_eq!(data_dirs(tmp.path()).len(), 1);
    }

    /// Plants `link -> target` at `at` (replacing what is there).
    fn plant(at: &Path, target: &Path) {
        if fs::symlink_metadata(at).is_ok_and(|m| m.is_dir()) {
            fs::remove_dir_all(at).unwrap();
        } else {
            let _ = fs::remove_file(at);
        }
        if let Some(p) = at.parent() {
            fs::create_dir_all(p).unwrap();
        }
        symlink(target, at).unwrap();
    }

    #[test]
    fn a_planted_symlink_never_makes_a_write_land_outside() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("victim"), "untouched").unwrap();
        fs::create_dir(outside.path().join("dir")).unwrap();
        fs::write(outside.path().join("dir/inner"), "untouched").unwrap();
        let before = snapshot(outside.path());
        let target = outside.path().join("dir");
        let p = payload(&[
            ("user", "admin", 0o600),
            ("nested/pass", "s3", 0o600),
            ("nested/deep/x", "y", 0o600),
        ]);
        let p2 = payload(&[
            ("user", "root", 0o644),
            ("nested/pass", "s4", 0o644),
            ("nested/deep/x", "z", 0o644),
            ("new/f", "n", 0o644),
        ]);
        // Every name a container could have replaced: top-level names, `..data`,
        // `..data_tmp`, the timestamped directory and a directory inside it.
        type Hostile<'a> = Box<dyn Fn(&Path) + 'a>;
        let cases: Vec<Hostile<'_>> = vec![
            Box::new(|v: &Path| plant(&v.join("user"), &outside.path().join("victim"))),
            Box::new(|v: &Path| plant(&v.join("nested"), &target)),
            Box::new(|v: &Path| plant(&v.join("new"), &target)),
            Box::new(|v: &Path| plant(&v.join(DATA_LINK), &target)),
            Box::new(|v: &Path| plant(&v.join(DATA_TMP), &target)),
            Box::new(|v: &Path| {
                let ts = fs::read_link(v.join(DATA_LINK)).unwrap();
                plant(&v.join(ts), &target);
            }),
            Box::new(|v: &Path| {
                let ts = fs::read_link(v.join(DATA_LINK)).unwrap();
                plant(&v.join(ts).join("nested"), &target);
            }),
            Box::new(|v: &Path| {
                let ts = fs::read_link(v.join(DATA_LINK)).unwrap();
                plant(&v.join(&ts).join("nested/deep"), &target);
                plant(&v.join(ts).join("user"), &outside.path().join("victim"));
            }),
            // A relative link that climbs out, and a data link to a directory outside.
            Box::new(|v: &Path| plant(&v.join("user"), Path::new("../../../../../../tmp"))),
            Box::new(|v: &Path| {
                fs::remove_file(v.join(DATA_LINK)).unwrap();
                fs::create_dir(v.join(DATA_LINK)).unwrap();
                symlink(&target, v.join(DATA_LINK).join("nested")).unwrap();
            }),
        ];
        for (i, hostile) in cases.iter().enumerate() {
            let tmp = tempfile::tempdir().unwrap();
            let vol = tmp.path();
            write_payload(vol, &p, None).unwrap();
            hostile(vol);
            // Whatever happens (an update, a rewrite of the same payload), nothing outside
            // changes, and what the volume shows afterwards is the payload.
            for (n, next) in [&p2, &p, &p].into_iter().enumerate() {
                let r = write_payload(vol, next, None);
                assert_eq!(
                    snapshot(outside.path()),
                    before,
                    "case {i}, write {n}: {r:?}"
                );
                r.unwrap_or_else(|e| panic!("case {i}, write {n}: {e}"));
                for (path, f) in next {
                    assert_eq!(
                        fs::read(vol.join(path)).unwrap(),
                        *f.data,
                        "case {i}, {path:?}"
                    );
                    let real = fs::canonicalize(vol.join(path)).unwrap();
                    assert!(
                        real.starts_with(fs::canonicalize(vol).unwrap()),
                        "case {i}: {real:?}"
                    );
                }
            }
        }
        assert_eq!(
            fs::read_to_string(outside.path().join("victim")).unwrap(),
            "untouched"
        );
    }

    #[test]
    fn readers_never_see_a_mix_of_two_payloads() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().to_path_buf();
        let gen_payload = |n: u32| {
            let v = n.to_string();
            payload(&[
                ("a", &v, 0o644),
                ("dir/b", &v, 0o644),
                ("c", &v.repeat(1000), 0o644),
            ])
        };
        write_payload(&vol, &gen_payload(0), None).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (vol, stop) = (vol.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    // As a container reads a consistent view: through `..data` once.
                    let Ok(data) = fs::canonicalize(vol.join(DATA_LINK)) else {
                        continue;
                    };
                    let (Ok(a), Ok(b), Ok(c)) = (
                        fs::read_to_string(data.join("a")),
                        fs::read_to_string(data.join("dir/b")),
                        fs::read_to_string(data.join("c")),
                    ) else {
                        // The old directory was removed between the lookup and the read.
                        continue;
                    };
                    assert_eq!(a, b, "a mix of two payloads");
                    assert_eq!(c, a.repeat(1000), "a partly written file");
                    // A visible name always shows a whole value.
                    if let Ok(a) = fs::read_to_string(vol.join("a")) {
                        assert!(!a.is_empty() && a.parse::<u32>().is_ok(), "{a:?}");
                    }
                    reads += 1;
                }
                reads
            })
        };
        for n in 1..300 {
            write_payload(&vol, &gen_payload(n), None).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let reads = reader.join().unwrap();
        assert!(reads > 0);
        assert_eq!(fs::read_to_string(vol.join("a")).unwrap(), "299");
    }
}
