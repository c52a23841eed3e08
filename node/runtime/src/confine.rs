//! Confinement of a container's process, done by the shim in the forked child before
//! `execve` (and by the exec helper for every exec), as runc does for containerd's default
//! spec:
//!
//! * [`open_sources`] takes a detached copy of every bind mount's source (`open_tree`)
//!   while the node's root is still visible; a subPath is walked from its volume's
//!   directory without following symlinks and mounted from the descriptor the walk ends on
//!   (see [`volume::subpath`]);
//! * [`enter_rootfs`] `pivot_root`s into the root filesystem, detaches the node's root, and
//!   only then creates and mounts what the container sees, so that every path (and every
//!   symlink an image carries) resolves inside the container: `proc`, a minimal `/dev` with
//!   `pts`, `shm`, `mqueue` and the usual device nodes, `sysfs` (read-only unless
//!   privileged), the bind mounts (volumes, /etc/hosts, ...), the masked and read-only kernel
//!   paths, and at last a read-only root when asked. The mount options are containerd's
//!   default spec's (see [`mount_dev`]);
//! * [`drop_privileges`] sets the groups, the user, the capability sets, `no_new_privs` and
//!   the seccomp filter.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::{Gid, Uid};

use super::sys;
use super::volume;
use super::{Mount, Seccomp, Security};

/// A step of the confinement that failed, and why.
#[derive(Debug)]
pub(crate) struct ConfineError {
    pub what: String,
    pub source: io::Error,
}

fn fail<E: Into<io::Error>>(what: impl Into<String>) -> impl FnOnce(E) -> ConfineError {
    let what = what.into();
    move |e| ConfineError {
        what,
        source: e.into(),
    }
}

/// A bind mount's source, taken before the root changes.
pub(crate) struct Source<'a> {
    mount: &'a Mount,
    tree: OwnedFd,
    is_dir: bool,
}

/// Detached copies of the sources of `mounts` (fails on a missing source).
pub(crate) fn open_sources(mounts: &[Mount]) -> Result<Vec<Source<'_>>, ConfineError> {
    mounts
        .iter()
        .map(|m| {
            let what = || format!("volume source {}", m.source.display());
            if let Some(sub) = &m.sub_path {
                // What is mounted is what the no-follow walk checked: the descriptor it
                // ends on, not a path a container could have swapped meanwhile.
                let fd = volume::subpath::open(&m.source, sub).map_err(|e| ConfineError {
                    what: format!("{}: subPath {}", what(), sub.path.display()),
                    source: io::Error::other(e.to_string()),
                })?;
                let st = nix::sys::stat::fstat(&fd).map_err(fail(what()))?;
                let tree = sys::open_tree_clone_fd(fd.as_fd()).map_err(fail(what()))?;
                return Ok(Source {
                    mount: m,
                    tree,
                    is_dir: volume::kind(&st) == SFlag::S_IFDIR,
                });
            }
            let meta = fs::metadata(&m.source).map_err(fail(what()))?;
            let tree = sys::open_tree_clone(&m.source).map_err(fail(what()))?;
            Ok(Source {
                mount: m,
                tree,
                is_dir: meta.is_dir(),
            })
        })
        .collect()
}

fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), ConfineError> {
    nix::mount::mount(source, target, fstype, flags, data).map_err(fail(format!(
        "mounting {} on {}",
        fstype.or(source).unwrap_or("bind"),
        target.display()
    )))
}

/// `mkdir -p` inside the (new) root.
fn mkdir_all(dir: &Path) -> Result<(), ConfineError> {
    fs::create_dir_all(dir).map_err(fail(format!("creating {}", dir.display())))
}

/// Device nodes every container gets: `(name, major, minor)`, all mode 0666.
const DEVICES: [(&str, u64, u64); 6] = [
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

/// containerd's masked paths: files get /dev/null over them, directories an empty
/// read-only tmpfs.
const MASKED: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// containerd's read-only paths.
const READ_ONLY: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Makes `rootfs` the root of the calling process's (private) mount namespace and mounts
/// what the container sees (see the module documentation).
pub(crate) fn enter_rootfs(
    rootfs: &Path,
    sec: &Security,
    sources: &[Source<'_>],
    workdir: &Path,
) -> Result<(), ConfineError> {
    if !rootfs.is_dir() {
        return Err(ConfineError {
            what: format!("rootfs \"{}\"", rootfs.display()),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        });
    }
    let rootfs_s = rootfs.to_string_lossy();
    mount(
        Some(&rootfs_s),
        rootfs,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )?;
    nix::unistd::chdir(rootfs).map_err(fail(format!("chdir \"{}\"", rootfs.display())))?;
    nix::unistd::pivot_root(".", ".").map_err(fail("pivot_root"))?;
    // The old root is now stacked on top of the new one; detach it. From here on every path
    // resolves inside the container.
    nix::mount::umount2(".", MntFlags::MNT_DETACH).map_err(fail("detaching the old root"))?;
    nix::unistd::chdir("/").map_err(fail("chdir \"/\""))?;

    let nosuid_nodev_noexec = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mkdir_all(Path::new("/proc"))?;
    mount(
        Some("proc"),
        Path::new("/proc"),
        Some("proc"),
        nosuid_nodev_noexec,
        None,
    )?;
    mount_dev()?;
    mkdir_all(Path::new("/sys"))?;
    let mut sys_flags = nosuid_nodev_noexec;
    if sec.read_only_sys {
        sys_flags |= MsFlags::MS_RDONLY;
    }
    mount(
        Some("sysfs"),
        Path::new("/sys"),
        Some("sysfs"),
        sys_flags,
        None,
    )?;
    for s in sources {
        bind(s)?;
    }
    if sec.mask_paths {
        mask_paths()?;
    }
    // As runc does: the working directory is created when the image lacks it.
    if !workdir.exists() {
        mkdir_all(workdir)?;
    }
    if sec.read_only_root {
        mount(
            None,
            Path::new("/"),
            None,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None,
        )?;
    }
    Ok(())
}

/// A tmpfs `/dev` with the standard device nodes and links, `/dev/pts` (a private devpts
/// instance), `/dev/shm` and `/dev/mqueue`, with containerd's default spec's options:
/// `/dev` nosuid,strictatime,mode=755,size=65536k; `/dev/pts`
/// nosuid,noexec,newinstance,ptmxmode=0666,mode=0620,gid=5; `/dev/shm`
/// nosuid,nodev,noexec,mode=1777,size=65536k; `/dev/mqueue` nosuid,nodev,noexec. (`/dev`
/// itself cannot be nodev: it holds the device nodes. Which devices a pod may open is the
/// agent's device cgroup program's business, not the mounts'.)
fn mount_dev() -> Result<(), ConfineError> {
    let dev = Path::new("/dev");
    mkdir_all(dev)?;
    mount(
        Some("tmpfs"),
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_STRICTATIME,
        Some("mode=755,size=65536k"),
    )?;
    for (name, major, minor) in DEVICES {
        let path = dev.join(name);
        nix::sys::stat::mknod(
            &path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(major, minor),
        )
        .map_err(fail(format!("creating {}", path.display())))?;
        // mknod is subject to the umask.
        nix::sys::stat::fchmodat(
            nix::fcntl::AT_FDCWD,
            &path,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .map_err(fail(format!("chmod {}", path.display())))?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
        ("core", "/proc/kcore"),
    ] {
        let path = dev.join(link);
        std::os::unix::fs::symlink(to, &path)
            .map_err(fail(format!("linking {}", path.display())))?;
    }
    let pts = dev.join("pts");
    mkdir_all(&pts)?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )?;
    let shm = dev.join("shm");
    mkdir_all(&shm)?;
    mount(
        Some("shm"),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=1777,size=65536k"),
    )?;
    // The POSIX message queues of the pod's IPC namespace (joined before this runs).
    let mqueue = dev.join("mqueue");
    mkdir_all(&mqueue)?;
    mount(
        Some("mqueue"),
        &mqueue,
        Some("mqueue"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    Ok(())
}

/// Attaches a bind mount's source at its destination (created like the source when
/// missing), read-only when asked.
fn bind(s: &Source<'_>) -> Result<(), ConfineError> {
    let target = &s.mount.destination;
    if !target.is_absolute() {
        return Err(ConfineError {
            what: format!("mount destination {}", target.display()),
            source: io::Error::new(io::ErrorKind::InvalidInput, "not an absolute path"),
        });
    }
    if s.is_dir {
        mkdir_all(target)?;
    } else if fs::symlink_metadata(target).is_err() {
        if let Some(parent) = target.parent() {
            mkdir_all(parent)?;
        }
        File::create(target).map_err(fail(format!("creating {}", target.display())))?;
    }
    sys::move_mount(s.tree.as_fd(), target)
        .map_err(fail(format!("mounting a volume on {}", target.display())))?;
    if s.mount.read_only {
        mount(
            None,
            target,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None,
        )?;
    }
    Ok(())
}

fn mask_paths() -> Result<(), ConfineError> {
    for p in MASKED.map(Path::new) {
        match fs::metadata(p) {
            Err(_) => continue,
            Ok(m) if m.is_dir() => mount(
                Some("tmpfs"),
                p,
                Some("tmpfs"),
                MsFlags::MS_RDONLY,
                Some("size=0"),
            )?,
            Ok(_) => mount(Some("/dev/null"), p, None, MsFlags::MS_BIND, None)?,
        }
    }
    for p in READ_ONLY.map(Path::new) {
        if fs::symlink_metadata(p).is_err() {
            continue;
        }
        let p_s = p.to_string_lossy();
        mount(
            Some(&p_s),
            p,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        )?;
        mount(
            None,
            p,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None,
        )?;
    }
    Ok(())
}

/// Validates capability names (`CAP_NET_ADMIN`); the error names the first unknown one.
pub fn capability_names(names: &[String]) -> Result<caps::CapsHashSet, String> {
    names
        .iter()
        .map(|n| {
            n.parse::<caps::Capability>()
                .map_err(|_| format!("unknown capability {n:?}"))
        })
        .collect()
}

/// Every capability this kernel knows, by name (`ALL` in securityContext.capabilities.add).
pub fn all_capabilities() -> Vec<String> {
    caps::all().iter().map(|c| c.to_string()).collect()
}

/// Sets the process identity and privileges `sec` asks for, in the order that keeps the
/// needed privileges until the last step: seccomp first when `no_new_privs` is off (the
/// filter then needs CAP_SYS_ADMIN), groups, gid, uid (keeping the permitted set), the
/// capability sets, `no_new_privs`, seccomp last when it is on.
pub(crate) fn drop_privileges(sec: &Security) -> Result<(), ConfineError> {
    let filter = match sec.seccomp {
        Seccomp::Unconfined => None,
        Seccomp::RuntimeDefault => Some(seccomp::program().map_err(|e| ConfineError {
            what: "compiling the seccomp profile".into(),
            source: io::Error::other(e),
        })?),
    };
    if !sec.no_new_privs
        && let Some(f) = &filter
    {
        sys::install_seccomp(f).map_err(fail("installing the seccomp filter"))?;
    }
    let wanted = sec
        .capabilities
        .as_deref()
        .map(capability_names)
        .transpose()
        .map_err(|m| ConfineError {
            what: "capabilities".into(),
            source: io::Error::new(io::ErrorKind::InvalidInput, m),
        })?;
    if let Some(wanted) = &wanted {
        for cap in caps::all() {
            if !wanted.contains(&cap) {
                caps::drop(None, caps::CapSet::Bounding, cap).map_err(|e| ConfineError {
                    what: format!("dropping {cap} from the bounding set"),
                    source: io::Error::other(e.to_string()),
                })?;
            }
        }
    }
    if sec.uid.is_some() || sec.gid.is_some() {
        let groups: Vec<Gid> = sec.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        nix::unistd::setgroups(&groups).map_err(fail("setgroups"))?;
    }
    if let Some(gid) = sec.gid {
        let g = Gid::from_raw(gid);
        nix::unistd::setresgid(g, g, g).map_err(fail(format!("setting group {gid}")))?;
    }
    if let Some(uid) = sec.uid {
        caps::securebits::set_keepcaps(true).map_err(|e| ConfineError {
            what: "keeping capabilities across setuid".into(),
            source: io::Error::other(e.to_string()),
        })?;
        let u = Uid::from_raw(uid);
        nix::unistd::setresuid(u, u, u).map_err(fail(format!("setting user {uid}")))?;
    }
    if let Some(wanted) = &wanted {
        let set = |which: caps::CapSet, value: &caps::CapsHashSet| {
            caps::set(None, which, value).map_err(|e| ConfineError {
                what: format!("setting the {which:?} capabilities"),
                source: io::Error::other(e.to_string()),
            })
        };
        set(caps::CapSet::Inheritable, &caps::CapsHashSet::new())?;
        // Effective before permitted shrinks, so the call that shrinks it is allowed.
        let permitted = caps::read(None, caps::CapSet::Permitted).unwrap_or_default();
        let keep: caps::CapsHashSet = wanted.intersection(&permitted).copied().collect();
        set(caps::CapSet::Effective, &keep)?;
        set(caps::CapSet::Permitted, &keep)?;
        caps::clear(None, caps::CapSet::Ambient).map_err(|e| ConfineError {
            what: "clearing the ambient capabilities".into(),
            source: io::Error::other(e.to_string()),
        })?;
    }
    if sec.no_new_privs {
        sys::set_no_new_privs().map_err(fail("setting no_new_privs"))?;
        if let Some(f) = &filter {
            sys::install_seccomp(f).map_err(fail("installing the seccomp filter"))?;
        }
    }
    Ok(())
}

/// The `RuntimeDefault` seccomp profile. Docker's and containerd's default profiles are
/// allow-lists of some 350 syscalls; this is the complement they amount to for an
/// unprivileged container on this kernel: the syscalls those profiles refuse (kernel
/// modules, kexec, reboot, the mount APIs, namespaces, keyrings, BPF, perf, raw I/O,
/// clock setting, `userfaultfd`, io_uring, ...) fail with `EPERM`; everything else is
/// allowed. seccompiler compiles it (no libseccomp needed).
pub mod seccomp {
    use super::*;

    /// The syscalls the profile refuses, by name and number on this architecture.
    pub fn denied() -> Vec<(&'static str, i64)> {
        let mut v: Vec<(&'static str, i64)> = vec![
            ("acct", libc::SYS_acct),
            ("add_key", libc::SYS_add_key),
            ("bpf", libc::SYS_bpf),
            ("clock_adjtime", libc::SYS_clock_adjtime),
            ("clock_settime", libc::SYS_clock_settime),
            ("delete_module", libc::SYS_delete_module),
            ("finit_module", libc::SYS_finit_module),
            ("fsconfig", libc::SYS_fsconfig),
            ("fsmount", libc::SYS_fsmount),
            ("fsopen", libc::SYS_fsopen),
            ("fspick", libc::SYS_fspick),
            ("get_mempolicy", libc::SYS_get_mempolicy),
            ("init_module", libc::SYS_init_module),
            ("io_uring_enter", libc::SYS_io_uring_enter),
            ("io_uring_register", libc::SYS_io_uring_register),
            ("io_uring_setup", libc::SYS_io_uring_setup),
            ("kcmp", libc::SYS_kcmp),
            ("kexec_file_load", libc::SYS_kexec_file_load),
            ("kexec_load", libc::SYS_kexec_load),
            ("keyctl", libc::SYS_keyctl),
            ("lookup_dcookie", libc::SYS_lookup_dcookie),
            ("mbind", libc::SYS_mbind),
            ("mount", libc::SYS_mount),
            ("mount_setattr", libc::SYS_mount_setattr),
            ("move_mount", libc::SYS_move_mount),
            ("move_pages", libc::SYS_move_pages),
            ("name_to_handle_at", libc::SYS_name_to_handle_at),
            ("open_by_handle_at", libc::SYS_open_by_handle_at),
            ("open_tree", libc::SYS_open_tree),
            ("perf_event_open", libc::SYS_perf_event_open),
            ("pivot_root", libc::SYS_pivot_root),
            ("process_vm_readv", libc::SYS_process_vm_readv),
            ("process_vm_writev", libc::SYS_process_vm_writev),
            ("quotactl", libc::SYS_quotactl),
            ("reboot", libc::SYS_reboot),
            ("request_key", libc::SYS_request_key),
            ("set_mempolicy", libc::SYS_set_mempolicy),
            ("setns", libc::SYS_setns),
            ("settimeofday", libc::SYS_settimeofday),
            ("swapoff", libc::SYS_swapoff),
            ("swapon", libc::SYS_swapon),
            ("umount2", libc::SYS_umount2),
            ("unshare", libc::SYS_unshare),
            ("userfaultfd", libc::SYS_userfaultfd),
        ];
        #[cfg(target_arch = "x86_64")]
        v.extend([
            ("ioperm", libc::SYS_ioperm),
            ("iopl", libc::SYS_iopl),
            ("nfsservctl", libc::SYS_nfsservctl),
            ("_sysctl", libc::SYS__sysctl),
            ("sysfs", libc::SYS_sysfs),
            ("uselib", libc::SYS_uselib),
            ("ustat", libc::SYS_ustat),
        ]);
        v
    }

    /// The profile as a classic BPF program for this architecture.
    pub(crate) fn program() -> Result<Vec<libc::sock_filter>, String> {
        let arch: seccompiler::TargetArch = std::env::consts::ARCH
            .try_into()
            .map_err(|e| format!("seccomp on {}: {e:?}", std::env::consts::ARCH))?;
        let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
            denied().into_iter().map(|(_, nr)| (nr, vec![])).collect();
        let filter = seccompiler::SeccompFilter::new(
            rules,
            seccompiler::SeccompAction::Allow,
            seccompiler::SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )
        .map_err(|e| format!("{e}"))?;
        let prog: seccompiler::BpfProgram = filter.try_into().map_err(|e| format!("{e:?}"))?;
        Ok(prog
            .into_iter()
            .map(|i| libc::sock_filter {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: i.k,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_default_profile_compiles_for_this_machine() {
        let prog = seccomp::program().expect("profile");
        assert!(prog.len() > seccomp::denied().len());
        let names: Vec<&str> = seccomp::denied().iter().map(|d| d.0).collect();
        for must in [
            "mount",
            "bpf",
            "unshare",
            "kexec_load",
            "init_module",
            "keyctl",
        ] {
            assert!(names.contains(&must), "{must}");
        }
        for allowed in ["read", "execve", "clone", "setuid", "capset", "ptrace"] {
            assert!(!names.contains(&allowed), "{allowed}");
        }
    }

    #[test]
    fn capability_names_are_checked() {
        let ok = capability_names(&["CAP_NET_ADMIN".into(), "CAP_CHOWN".into()]).unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(
            capability_names(&["CAP_NOPE".into()]).unwrap_err(),
            "unknown capability \"CAP_NOPE\""
        );
        let defaults: Vec<String> = Security::DEFAULT_CAPABILITIES
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(capability_names(&defaults).unwrap().len(), 14);
    }
}
