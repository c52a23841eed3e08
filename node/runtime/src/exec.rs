//! Streaming exec: a command started in a running container with its standard streams
//! handed to the caller ([`ExecSession`]), on pipes or on a pseudo-terminal ([`Pty`]).
//!
//! The exec helper (the shim in exec mode) is started as the leader of a new session, and
//! with a terminal it makes the terminal that session's controlling one before it forks the
//! command, so everything the command starts (a shell's jobs included) belongs to that
//! session. Dropping the session's [`SessionGuard`] kills every process still in it (the
//! helper's process group first, then any member found in `/proc`), so a lost connection
//! leaves nothing running in the container and, with the terminal's master closed, no
//! pseudo-terminal either. A process that starts a session of its own (a daemon) leaves
//! the exec's, as it would leave a terminal's; Kubernetes' runtimes do not follow it either.
//!
//! The terminal is allocated on the node (`openpty`) and only its slave side is passed into
//! the container, as the command's stdin, stdout and stderr; the container never sees the
//! node's `/dev/pts`, only the one descriptor.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd as _, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::RuntimeError;
use crate::sys;

/// What a streaming exec connects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecOptions {
    /// Give the command a standard input the caller writes (else `/dev/null`).
    pub stdin: bool,
    /// Run it on a pseudo-terminal: stdout and stderr become the one terminal stream.
    pub tty: bool,
}

/// A reader of the command's output.
pub type ExecReader = Pin<Box<dyn AsyncRead + Send>>;
/// A writer to the command's input; dropping it closes the command's stdin.
pub type ExecWriter = Pin<Box<dyn AsyncWrite + Send>>;

/// A command running in a container, its streams connected to the caller.
pub struct ExecSession {
    /// The command's standard input, when asked for.
    pub stdin: Option<ExecWriter>,
    /// Its standard output (with a terminal: everything it writes to the terminal).
    pub stdout: ExecReader,
    /// Its standard error; `None` with a terminal.
    pub stderr: Option<ExecReader>,
    /// The terminal, for window resizes; `None` without one.
    pub terminal: Option<Terminal>,
    /// The command's exit code once it ends (`128 + signal` when killed).
    pub exit: Pin<Box<dyn Future<Output = Result<i32, RuntimeError>> + Send>>,
    /// Kills whatever is left of the session when dropped.
    pub session: SessionGuard,
}

impl std::fmt::Debug for ExecSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecSession")
            .field("stdin", &self.stdin.is_some())
            .field("tty", &self.terminal.is_some())
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// Ends what is left of a session when dropped: every process of an exec's session, or the
/// task carrying an attach connection (the container itself keeps running).
#[derive(Debug)]
pub struct SessionGuard {
    what: Guarded,
}

#[derive(Debug)]
enum Guarded {
    Session(i32),
    Task(tokio::task::AbortHandle),
}

impl SessionGuard {
    pub(crate) fn new(sid: i32) -> SessionGuard {
        SessionGuard {
            what: Guarded::Session(sid),
        }
    }

    pub(crate) fn task(task: tokio::task::AbortHandle) -> SessionGuard {
        SessionGuard {
            what: Guarded::Task(task),
        }
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        match &self.what {
            Guarded::Session(sid) => {
                let sid = *sid;
                // The /proc scan reads every process's stat: off the async workers when
                // dropped on one.
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn_blocking(move || kill_session(sid));
                    }
                    Err(_) => kill_session(sid),
                }
            }
            Guarded::Task(t) => t.abort(),
        }
    }
}

/// SIGKILL to process group `sid` and to every process whose session is `sid`.
fn kill_session(sid: i32) {
    use nix::sys::signal::{Signal, kill, killpg};
    use nix::unistd::Pid;
    if sid <= 1 {
        return;
    }
    let _ = killpg(Pid::from_raw(sid), Signal::SIGKILL);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if session_of(pid) == Some(sid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Field 6 (`session`) of `/proc/<pid>/stat`.
fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // state ppid pgrp session
    rest.split_whitespace().nth(3)?.parse().ok()
}

/// A pseudo-terminal's master side, registered with Tokio.
#[derive(Debug, Clone)]
pub struct Pty {
    fd: Arc<AsyncFd<OwnedFd>>,
}

/// Resizes a session's terminal: an exec's own, or (attach) a container's, through its shim.
#[derive(Debug, Clone)]
pub struct Terminal {
    to: Resize,
}

#[derive(Debug, Clone)]
enum Resize {
    Pty(Pty),
    Remote(tokio::sync::mpsc::UnboundedSender<(u16, u16)>),
}

impl Terminal {
    /// A terminal resized by sending `(columns, rows)` to whoever holds it.
    pub(crate) fn remote(to: tokio::sync::mpsc::UnboundedSender<(u16, u16)>) -> Terminal {
        Terminal {
            to: Resize::Remote(to),
        }
    }

    /// Sets the window size (the command gets `SIGWINCH`).
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        match &self.to {
            Resize::Pty(pty) => sys::set_window_size(pty.fd.get_ref().as_fd(), rows, cols),
            Resize::Remote(tx) => tx
                .send((cols, rows))
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe)),
        }
    }
}

/// A new pseudo-terminal: its master (non-blocking, for Tokio) and its slave.
pub(crate) fn open_pty() -> io::Result<(Pty, OwnedFd)> {
    let pair = nix::pty::openpty(None, None).map_err(io::Error::from)?;
    let flags = nix::fcntl::fcntl(&pair.master, nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags)
        | nix::fcntl::OFlag::O_NONBLOCK
        | nix::fcntl::OFlag::O_CLOEXEC;
    nix::fcntl::fcntl(&pair.master, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    nix::fcntl::fcntl(
        &pair.master,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    let fd = sys::async_fd(
        pair.master,
        tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
    )?;
    Ok((Pty { fd: Arc::new(fd) }, pair.slave))
}

impl Pty {
    pub(crate) fn terminal(&self) -> Terminal {
        Terminal {
            to: Resize::Pty(self.clone()),
        }
    }
}

impl AsyncRead for Pty {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard
                .try_io(|fd| nix::unistd::read(fd.get_ref(), unfilled).map_err(io::Error::from))
            {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Every slave descriptor is closed: the terminal hung up, the end of output.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Pty {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test]
    async fn a_pty_carries_bytes_both_ways_and_ends_when_the_slave_closes() {
        let (mut master, slave) = open_pty().unwrap();
        let mut slave = std::fs::File::from(slave);
        // Raw mode would be the command's business; the line discipline echoes by default.
        master.write_all(b"hi\n").await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while !got.windows(2).any(|w| w == b"hi") {
            let n = master.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        use std::io::{Read as _, Write as _};
        let mut line = [0u8; 3];
        slave.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"hi\n");
        slave.write_all(b"out").unwrap();
        master.terminal().resize(100, 30).unwrap();
        drop(slave);
        let mut rest = Vec::new();
        master.read_to_end(&mut rest).await.unwrap();
        assert!(rest.ends_with(b"out"), "{rest:?}");
    }

    #[test]
    fn sessions_are_read_from_proc() {
        let me = i32::try_from(std::process::id()).unwrap();
        assert_eq!(
            session_of(me),
            Some(nix::unistd::getsid(None).unwrap().as_raw())
        );
    }
}
