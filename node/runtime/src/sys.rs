//! The runtime's only `unsafe` code and raw syscalls (pidfd, close_range, fork, signal
//! dispositions, `_exit`, an interface ioctl, `pre_exec`, the new mount API's `open_tree`
//! (of a path or of a descriptor) and `move_mount`, `no_new_privs`, installing a seccomp
//! filter, and the two terminal ioctls exec's pseudo-terminals need (`TIOCSCTTY`,
//! `TIOCSWINSZ`). Everything else goes through nix's safe wrappers.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal};
use nix::unistd::ForkResult;

/// `pidfd_open(2)`: a file descriptor that refers to process `pid` (pollable: readable once
/// the process has exited) and cannot be confused with a later process that reuses the pid.
pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1; no memory is
    // passed to the kernel.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(ret).map_err(|_| io::Error::other("pidfd out of range"))?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `pidfd_send_signal(2)`: signals exactly the process the pidfd refers to.
pub(crate) fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: Signal) -> io::Result<()> {
    // SAFETY: the descriptor is borrowed and open for the duration of the call; the siginfo
    // pointer is NULL, which the kernel accepts (it then fills in the info itself).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_uint,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Marks every descriptor from `first` upwards close-on-exec (`close_range(2)` with
/// `CLOSE_RANGE_CLOEXEC`), so a container inherits only its stdio.
pub(crate) fn cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range only changes descriptor flags of this process; no memory is passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Number of threads of this process (from `/proc/self/stat`).
fn thread_count() -> io::Result<usize> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after_comm = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| io::Error::other("malformed /proc/self/stat"))?;
    // Fields after the command: state(3) ppid(4) ... num_threads(20).
    after_comm
        .split_whitespace()
        .nth(17)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::other("malformed /proc/self/stat"))
}

/// Proof that the process was single-threaded when it was checked. Not `Send`: it cannot
/// leave the thread that made the check, and the shim starts no threads after it.
pub(crate) struct SingleThreaded(std::marker::PhantomData<*const ()>);

impl SingleThreaded {
    /// Checks that this process has exactly one thread (reads `/proc/self/stat`, so call it
    /// before joining a mount namespace whose `/proc` belongs to another PID namespace).
    pub(crate) fn check() -> io::Result<Self> {
        let threads = thread_count()?;
        if threads != 1 {
            return Err(io::Error::other(format!(
                "refusing to fork a process with {threads} threads"
            )));
        }
        Ok(Self(std::marker::PhantomData))
    }
}

/// `fork(2)` of a process known to be single-threaded (the shim).
pub(crate) fn fork(_proof: &SingleThreaded) -> io::Result<ForkResult> {
    // SAFETY: the process has exactly one thread (`SingleThreaded` was checked on this
    // thread and the shim never starts another), so the child is a complete copy: no lock
    // can be held by a thread missing in the child, and the child may allocate and run
    // ordinary code before it execs or `_exit`s.
    unsafe { nix::unistd::fork() }.map_err(io::Error::from)
}

/// Restores default dispositions for every catchable signal and unblocks all signals (Rust
/// ignores SIGPIPE; ignored dispositions would otherwise survive `execve`).
pub(crate) fn reset_signals() -> io::Result<()> {
    for signal in Signal::iterator() {
        if matches!(signal, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: installing SIG_DFL runs no handler code in this process, so no
        // async-signal-safety requirement arises.
        unsafe { nix::sys::signal::signal(signal, SigHandler::SigDfl) }.map_err(io::Error::from)?;
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(io::Error::from)
}

/// Ignores `signal` in this process.
pub(crate) fn ignore_signal(signal: Signal) -> io::Result<()> {
    // SAFETY: SIG_IGN installs no handler code.
    unsafe { nix::sys::signal::signal(signal, SigHandler::SigIgn) }
        .map(drop)
        .map_err(io::Error::from)
}

/// `_exit(2)`: ends a forked child without running atexit handlers or flushing buffers that
/// belong to the parent.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no memory of ours.
    unsafe { libc::_exit(code) }
}

/// Sets interface `name` up in the calling thread's network namespace (SIOCGIFFLAGS /
/// SIOCSIFFLAGS on a datagram socket).
pub(crate) fn set_link_up(name: &str) -> io::Result<()> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: socket takes integers and returns a new descriptor or -1.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value (empty name, zero union).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: ifr is a valid, writable ifreq that outlives the call; SIOCGIFFLAGS writes
    // only ifru_flags within it.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so ifru_flags is the initialised union member.
    unsafe { ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads the ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the spawned process the leader of a new session (no controlling terminal, its own
/// process group), so that signals aimed at the agent's group or terminal never reach it.
pub(crate) fn new_session_on_spawn(cmd: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls setsid(2),
    // which is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(drop).map_err(io::Error::from));
    }
}

/// Registers an owned descriptor (a pidfd) with the Tokio reactor for readability.
pub(crate) fn async_readable(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    async_fd(fd, tokio::io::Interest::READABLE)
}

/// Registers an owned, non-blocking descriptor with the Tokio reactor for `interest`.
pub(crate) fn async_fd(
    fd: OwnedFd,
    interest: tokio::io::Interest,
) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd takes ownership of the OwnedFd, so the descriptor stays open and
    // refers to the same file description for the AsyncFd's whole lifetime, and
    // OwnedFd::as_raw_fd always returns that same descriptor.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }
        .map_err(|e| e.into_parts().1)
}

/// `ioctl(fd, TIOCSCTTY, 0)`: makes the terminal `fd` the calling session leader's
/// controlling terminal.
pub(crate) fn take_controlling_terminal(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal from another session)
    // and reads or writes no memory of this process; `fd` is a valid open descriptor.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSCTTY, 0) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `ioctl(fd, TIOCSWINSZ, …)`: the terminal's window size (the kernel sends `SIGWINCH` to
/// its foreground process group).
pub(crate) fn set_window_size(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `struct winsize` through the pointer, which points at a
    // live, initialized local of exactly that type; `fd` is a valid open descriptor.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `open_tree(2)` with `OPEN_TREE_CLONE | AT_RECURSIVE`: a detached copy of the mount tree at
/// `path`, which [`move_mount`] attaches elsewhere later, even after this process has
/// changed its root (a bind mount from a path would need the old root still attached).
pub(crate) fn open_tree_clone(path: &std::path::Path) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as u32;
    // SAFETY: `c` is a NUL-terminated string that outlives the call; the other arguments are
    // integers. The kernel returns a new descriptor or -1.
    let ret = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(ret).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `open_tree(2)` of what the descriptor `fd` names (`AT_EMPTY_PATH`), with
/// `OPEN_TREE_CLONE | AT_RECURSIVE`: a detached bind mount of exactly that file or directory,
/// whatever its path has become (a subPath resolved without following symlinks).
pub(crate) fn open_tree_clone_fd(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let empty = c"";
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_RECURSIVE as u32
        | libc::AT_EMPTY_PATH as u32;
    // SAFETY: `empty` is a NUL-terminated string that outlives the call and `fd` is open for
    // its duration; the other arguments are integers. The kernel returns a new descriptor or
    // -1.
    let ret = unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), empty.as_ptr(), flags) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(ret).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `move_mount(2)`: attaches the detached tree `tree` (from [`open_tree_clone`]) at `target`.
pub(crate) fn move_mount(tree: BorrowedFd<'_>, target: &std::path::Path) -> io::Result<()> {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str()))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let empty = c"";
    // SAFETY: both strings are NUL-terminated and outlive the call; `tree` is open for its
    // duration. No memory is written.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)`.
pub(crate) fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only; no memory is passed.
    let ret = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Installs the classic-BPF seccomp `filter` on the calling thread (`prctl(PR_SET_SECCOMP,
/// SECCOMP_MODE_FILTER)`); needs `no_new_privs` or `CAP_SYS_ADMIN`.
pub(crate) fn install_seccomp(filter: &[libc::sock_filter]) -> io::Result<()> {
    let len = u16::try_from(filter.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    let prog = libc::sock_fprog {
        len,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `len` valid instructions that outlive the call; the kernel
    // copies them and writes nothing back.
    let ret = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

extern "C" fn ignore_signal_handler(_: libc::c_int) {}

/// Installs a handler that does nothing for each of `signals`: a PID namespace's init only
/// receives the signals it has handlers for (pid_namespaces(7)); blocked, they then wait for
/// `sigwait`.
pub(crate) fn install_noop_handlers(signals: &[Signal]) -> io::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction};
    let action = SigAction::new(
        SigHandler::Handler(ignore_signal_handler),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in signals {
        // SAFETY: the handler is an empty function: it touches no state, so it is
        // async-signal-safe.
        unsafe { nix::sys::signal::sigaction(*s, &action) }.map_err(io::Error::from)?;
    }
    Ok(())
}
