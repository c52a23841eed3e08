//! The BPF filesystem (bpffs) that holds the agent's pinned maps: checking for it and mounting
//! it at `/sys/fs/bpf` when the host has not (this machine's init does not mount it).

use std::{
    ffi::CString,
    fs::File,
    io,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use super::BpfError;

/// Where bpffs lives by convention (systemd, libbpf, bpftool all assume it).
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// Serialises check-and-mount across processes (parallel test binaries, an agent restarting
/// while the old one still runs): two racing mounts would stack, and the lower one, with
/// whatever got pinned there in between, would vanish from sight.
const MOUNT_LOCK: &str = "/run/skiff-bpffs.lock";

/// Whether the filesystem magic (`statfs.f_type`) of `path` is `magic`.
fn fs_is(path: &Path, magic: libc::c_long) -> io::Result<bool> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call and `st` points to
    // writable memory of the size statfs(2) fills in.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statfs returned 0, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    Ok(st.f_type == magic)
}

/// Whether `path` is on a BPF filesystem.
pub fn is_bpffs(path: &Path) -> io::Result<bool> {
    fs_is(path, libc::BPF_FS_MAGIC)
}

/// Whether `path` is on a cgroup v2 filesystem.
pub fn is_cgroup2(path: &Path) -> io::Result<bool> {
    fs_is(path, libc::CGROUP2_SUPER_MAGIC)
}

/// Makes sure a BPF filesystem is mounted at `mount_point`, mounting one (mode 0700, like
/// systemd does) if the directory is on some other filesystem. Needs CAP_SYS_ADMIN for the
/// mount; a no-op when bpffs is already there.
pub fn ensure_bpffs(mount_point: &Path) -> Result<(), BpfError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BpfError::Io { path, source }
    };
    if is_bpffs(mount_point).map_err(io_err(mount_point))? {
        return Ok(());
    }
    let lock_path = Path::new(MOUNT_LOCK);
    let lock = File::create(lock_path).map_err(io_err(lock_path))?;
    lock.lock().map_err(io_err(lock_path))?;
    // Someone may have mounted it while we waited for the lock.
    if is_bpffs(mount_point).map_err(io_err(mount_point))? {
        return Ok(());
    }
    mount_bpffs(mount_point).map_err(|source| BpfError::MountBpffs {
        path: mount_point.to_path_buf(),
        source,
    })
    // `lock` is released when dropped.
}

fn mount_bpffs(mount_point: &Path) -> io::Result<()> {
    let target = CString::new(mount_point.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call; mount(2) does not
    // keep them.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            flags,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Prepares `pin_dir` for pinning: mounts bpffs at [`BPFFS_ROOT`] if `pin_dir` is below it and
/// it is not mounted yet, creates the directory, and checks that it is on bpffs.
pub(super) fn prepare_pin_dir(pin_dir: &Path) -> Result<(), BpfError> {
    let root = Path::new(BPFFS_ROOT);
    if pin_dir.starts_with(root) {
        ensure_bpffs(root)?;
    }
    std::fs::create_dir_all(pin_dir).map_err(|source| BpfError::Io {
        path: pin_dir.to_path_buf(),
        source,
    })?;
    match is_bpffs(pin_dir) {
        Ok(true) => Ok(()),
        Ok(false) => Err(BpfError::NotBpffs(pin_dir.to_path_buf())),
        Err(source) => Err(BpfError::Io {
            path: pin_dir.to_path_buf(),
            source,
        }),
    }
}

/// The pin paths of the accounting maps under `pin_dir`.
pub(super) fn pin_path(pin_dir: &Path, map: &str) -> PathBuf {
    pin_dir.join(map)
}

/// Removes `pin_dir` if it is empty. Absent, or holding pins that are not the caller's to
/// remove (the other object's), is not an error.
pub(super) fn remove_dir_if_empty(pin_dir: &Path) -> Result<(), BpfError> {
    match std::fs::remove_dir(pin_dir) {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty
            ) =>
        {
            Ok(())
        }
        Err(source) => Err(BpfError::Io {
            path: pin_dir.to_path_buf(),
            source,
        }),
    }
}
