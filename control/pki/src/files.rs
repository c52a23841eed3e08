//! Private files: every key, store, snapshot and credential file Skiff writes is created
//! mode 0600 in a directory of mode 0700, whatever the process's umask (the mode is given at
//! `open(2)`/`mkdir(2)` and set again with `fchmod`/`chmod`, since a umask can only take
//! bits away and one of 0277 would leave a file its owner cannot write).
//!
//! Temporaries never go to a shared temporary directory: [`temp_beside`] makes one next to
//! its destination, with a random name, `O_EXCL` and mode 0600, to be renamed into place
//! ([`persist_new`] refuses to replace an existing destination).

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mode of a private file.
pub const FILE_MODE: u32 = 0o600;
/// The mode of a private directory.
pub const DIR_MODE: u32 = 0o700;

/// Creates `dir` (and missing parents, each 0700) and sets `dir` itself to 0700, also when
/// it already existed: a state directory (PKI, store data, snapshots) only its owner may
/// list or enter. Refuses a symbolic link at `dir`.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(p) = at {
        if p.as_os_str().is_empty() || std::fs::symlink_metadata(p).is_ok() {
            break;
        }
        missing.push(p);
        at = p.parent();
    }
    for p in missing.into_iter().rev() {
        match DirBuilder::new().mode(DIR_MODE).create(p) {
            Ok(()) => std::fs::set_permissions(p, Permissions::from_mode(DIR_MODE))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a directory", dir.display()),
        ));
    }
    if meta.permissions().mode() & 0o7777 != DIR_MODE {
        std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// Creates missing parents of `path` with mode 0700 (an existing parent is left as it is:
/// it may be a home or working directory).
pub fn parent_dirs(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() && std::fs::symlink_metadata(p).is_err() => {
            private_dir(p)
        }
        _ => Ok(()),
    }
}

/// Creates the new file `path` (`O_CREAT|O_EXCL`, no symbolic link followed) with mode
/// 0600, for writing.
pub fn create_new(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)?;
    f.set_permissions(Permissions::from_mode(FILE_MODE))?;
    Ok(f)
}

/// Opens `path` for reading and writing, creating it mode 0600 if missing, and sets an
/// existing file to 0600 too (a store file written by an older version). A symbolic link at
/// `path` is refused (`O_NOFOLLOW`).
pub fn open_private(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    if f.metadata()?.permissions().mode() & 0o7777 != FILE_MODE {
        f.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(f)
}

/// A new temporary file beside `dest` (same directory, so a rename moves it into place):
/// a hidden random name (`.<dest name>.<random>.tmp`), created with `O_EXCL`, mode 0600.
/// It is removed when dropped unless persisted.
pub fn temp_beside(dest: &Path) -> io::Result<tempfile::NamedTempFile> {
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "skiff".into());
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(Permissions::from_mode(FILE_MODE))
        .tempfile_in(dir)?;
    tmp.as_file()
        .set_permissions(Permissions::from_mode(FILE_MODE))?;
    Ok(tmp)
}

/// Moves `tmp` to `dest`, which must not exist (no existing file is replaced, atomically).
pub fn persist_new(tmp: tempfile::NamedTempFile, dest: &Path) -> io::Result<File> {
    tmp.persist_noclobber(dest).map_err(|e| e.error)
}

/// Moves `tmp` to `dest`, replacing it atomically.
pub fn persist_replace(tmp: tempfile::NamedTempFile, dest: &Path) -> io::Result<File> {
    tmp.persist(dest).map_err(|e| e.error)
}

/// Writes `bytes` to `path` atomically (a private temporary beside it, synced, renamed over
/// it), the file 0600; missing parents are created 0700.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_with_mode(path, bytes, FILE_MODE)
}

/// Like [`write_private`] with another mode for the final file (0644 for a certificate).
pub fn write_with_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write as _;
    parent_dirs(path)?;
    let mut tmp = temp_beside(path)?;
    tmp.write_all(bytes)?;
    if mode != FILE_MODE {
        tmp.as_file()
            .set_permissions(Permissions::from_mode(mode))?;
    }
    tmp.as_file().sync_all()?;
    persist_replace(tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::{Mode, umask};

    /// Serializes the tests that change the process's umask.
    static UMASK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// Runs `f` under each umask (022, 000 and 0277), restoring the old one.
    fn under_umasks(f: impl Fn(&Path)) {
        let _g = UMASK.lock().unwrap_or_else(|e| e.into_inner());
        for m in [0o022, 0o000, 0o277] {
            let dir = tempfile::tempdir().unwrap();
            let old = umask(Mode::from_bits_truncate(m));
            f(dir.path());
            umask(old);
        }
    }

    /// The entries of `dir` (not recursive).
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn directories_are_0700_whatever_the_umask() {
        under_umasks(|base| {
            let d = base.join("a/b/state");
            private_dir(&d).unwrap();
            assert_eq!(mode(&d), 0o700);
            assert_eq!(mode(&base.join("a")) & 0o077, 0, "a parent is private too");
            // An existing, open directory is closed.
            let open = base.join("open");
            std::fs::create_dir(&open).unwrap();
            std::fs::set_permissions(&open, Permissions::from_mode(0o755)).unwrap();
            private_dir(&open).unwrap();
            assert_eq!(mode(&open), 0o700);
        });
    }

    #[test]
    fn private_files_are_0600_whatever_the_umask() {
        under_umasks(|base| {
            let f = base.join("new");
            drop(create_new(&f).unwrap());
            assert_eq!(mode(&f), 0o600);
            assert_eq!(
                create_new(&f).unwrap_err().kind(),
                io::ErrorKind::AlreadyExists,
                "O_EXCL"
            );
            let g = base.join("opened");
            drop(open_private(&g).unwrap());
            assert_eq!(mode(&g), 0o600);
            // An existing file written world-readable is closed.
            let h = base.join("old");
            std::fs::write(&h, b"x").unwrap();
            std::fs::set_permissions(&h, Permissions::from_mode(0o644)).unwrap();
            drop(open_private(&h).unwrap());
            assert_eq!(mode(&h), 0o600);
            // A symbolic link is not followed.
            let link = base.join("link");
            std::os::unix::fs::symlink(&h, &link).unwrap();
            assert!(open_private(&link).is_err());
            let k = base.join("sub/key");
            write_private(&k, b"secret").unwrap();
            assert_eq!(mode(&k), 0o600);
            assert_eq!(mode(&base.join("sub")), 0o700);
            assert_eq!(std::fs::read(&k).unwrap(), b"secret");
            write_with_mode(&base.join("ca.crt"), b"cert", 0o644).unwrap();
            assert_eq!(mode(&base.join("ca.crt")), 0o644);
        });
    }

    #[test]
    fn temporaries_are_beside_their_destination_random_and_private() {
        under_umasks(|base| {
            let dest = base.join("snap.db");
            let a = temp_beside(&dest).unwrap();
            let b = temp_beside(&dest).unwrap();
            assert_ne!(a.path(), b.path(), "random names");
            assert_eq!(a.path().parent(), Some(base));
            assert!(
                a.path()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(".snap.db.")
            );
            assert_eq!(mode(a.path()), 0o600);
            drop(b);
            persist_new(a, &dest).unwrap();
            assert_eq!(mode(&dest), 0o600);
            assert_eq!(
                names(base),
                vec!["snap.db".to_string()],
                "no temporary left"
            );
            // An existing destination is never replaced by persist_new.
            let c = temp_beside(&dest).unwrap();
            assert_eq!(
                persist_new(c, &dest).unwrap_err().kind(),
                io::ErrorKind::AlreadyExists
            );
            assert_eq!(names(base), vec!["snap.db".to_string()]);
        });
    }
}
