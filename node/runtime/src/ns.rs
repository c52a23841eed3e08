//! Persistent pod namespaces: a dedicated std thread unshares new network, UTS and IPC
//! namespaces, sets the hostname, brings `lo` up and bind-mounts its
//! `/proc/thread-self/ns/*` files onto the given paths, then exits. The bind mounts keep the
//! namespaces alive; removing them (umount + unlink) lets the kernel free them once the last
//! process has left. Tokio worker threads never change namespace.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use tracing::{debug, info, warn};

use super::sys;

/// Where `ip netns` keeps its namespace files.
pub(crate) const NETNS_DIR: &str = "/run/netns";

/// The files the pod's namespaces are bound to.
#[derive(Debug, Clone)]
pub(crate) struct PodNsPaths {
    pub net: PathBuf,
    pub uts: PathBuf,
    pub ipc: PathBuf,
}

fn sys_err(op: String) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{op}: {e}"))
}

/// Makes sure `/run/netns` exists and, as `ip netns add` does, is a shared mount point (a
/// bind mount of itself), so namespace mounts made there propagate into mount namespaces
/// created later and unmounts propagate too. Returns whether a mount was made.
pub(crate) fn ensure_netns_dir() -> io::Result<bool> {
    let dir = Path::new(NETNS_DIR);
    fs::create_dir_all(dir)?;
    let is_mount = crate::mountinfo::read()?
        .iter()
        .any(|m| m.mount_point == dir);
    if is_mount {
        return Ok(false);
    }
    nix::mount::mount(
        Some(dir),
        dir,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| sys_err(format!("bind-mounting {NETNS_DIR} onto itself"))(e.into()))?;
    nix::mount::mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| sys_err(format!("making {NETNS_DIR} a shared mount"))(e.into()))?;
    info!("made {NETNS_DIR} a shared bind mount of itself (as `ip netns add` does)");
    Ok(true)
}

/// Creates the pod namespaces on a dedicated thread and binds them to `paths`. On failure
/// nothing is left mounted.
pub(crate) fn create(paths: &PodNsPaths, hostname: &str) -> io::Result<()> {
    let paths = paths.clone();
    let hostname = hostname.to_string();
    std::thread::Builder::new()
        .name("skiff-podns".into())
        .spawn(move || create_on_this_thread(&paths, &hostname))?
        .join()
        .map_err(|_| io::Error::other("namespace creation thread panicked"))?
}

fn create_on_this_thread(paths: &PodNsPaths, hostname: &str) -> io::Result<()> {
    // Only this thread changes namespace; it exits right after. CLONE_NEWNET, CLONE_NEWUTS
    // and CLONE_NEWIPC may be unshared by one thread of a multi-threaded process.
    nix::sched::unshare(
        CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWIPC,
    )
    .map_err(|e| sys_err("unshare(NEWNET|NEWUTS|NEWIPC)".into())(e.into()))?;
    nix::unistd::sethostname(hostname)
        .map_err(|e| sys_err(format!("sethostname({hostname:?})"))(e.into()))?;
    sys::set_link_up("lo").map_err(sys_err("setting lo up".into()))?;

    let mut done: Vec<&Path> = Vec::new();
    let binds = [
        ("net", &paths.net),
        ("uts", &paths.uts),
        ("ipc", &paths.ipc),
    ];
    for (kind, target) in binds {
        if let Err(e) = bind_ns(kind, target) {
            for d in done {
                remove(d);
            }
            return Err(e);
        }
        done.push(target);
    }
    debug!(netns = %paths.net.display(), hostname, "pod namespaces created");
    Ok(())
}

fn bind_ns(kind: &str, target: &Path) -> io::Result<()> {
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent)?;
    }
    // create_new: never mount over a file some other pod (or `ip netns add`) owns.
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(target)
        .map_err(sys_err(format!("creating {}", target.display())))?;
    let source = PathBuf::from(format!("/proc/thread-self/ns/{kind}"));
    if let Err(e) = nix::mount::mount(
        Some(&source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    ) {
        let _ = fs::remove_file(target);
        return Err(sys_err(format!(
            "bind-mounting {} onto {}",
            source.display(),
            target.display()
        ))(e.into()));
    }
    Ok(())
}

/// Whether `path` is a bind-mounted namespace file (nsfs).
pub(crate) fn is_ns_mount(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .map(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
        .unwrap_or(false)
}

/// Unmounts (lazily) and unlinks a namespace file. Missing files are fine; failures are
/// logged, and reported through the return value.
pub(crate) fn remove(path: &Path) -> bool {
    let mut ok = true;
    // Unmount every layer (a crash could have left more than one).
    for _ in 0..8 {
        if !is_ns_mount(path) {
            break;
        }
        if let Err(e) = nix::mount::umount2(path, MntFlags::MNT_DETACH) {
            warn!(path = %path.display(), error = %e, "cannot unmount namespace file");
            ok = false;
            break;
        }
    }
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot remove namespace file");
            ok = false;
        }
    }
    ok
}
