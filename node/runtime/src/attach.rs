//! Attach: the streams of a container's main process, served by its shim to any number of
//! clients at once (`kubectl attach`, `kubectl debug -it`).
//!
//! Every container's shim listens on `attach.sock` in the container's state directory (a
//! unix socket, mode 0600: root only; bound and reached through `/proc/self/fd/<dir>/`, so
//! the length of the state directory's path does not matter). A client writes one [`OPEN`]
//! frame (one byte: 1 when it wants to write the container's stdin), then frames in exec's
//! format (`[channel: u8][length: u32 BE][bytes]`, the channel numbers of
//! `v5.channel.k8s.io`): [`STDIN`] bytes, [`RESIZE`] (4 bytes: columns and rows, BE) and
//! [`CLOSE`] naming [`STDIN`]. The shim writes [`STDOUT`] and [`STDERR`] frames (a terminal
//! has only [`STDOUT`]) to every client as the container writes them, the same bytes that go
//! to the container's log, and closes every connection when the container exits.
//!
//! A container with `stdin` gets a pipe as its standard input, whose writing end the shim
//! keeps open; with `tty` a pseudo-terminal whose master the shim holds: its output is read
//! (and logged) whether or not anyone is attached. Input from the clients that asked for
//! stdin goes to the container in the order it arrives; a client whose output backs up past
//! [`MAX_PENDING`] bytes is disconnected, so a slow client never stalls the container or
//! the others. A client that closes its stdin is detached (as containerd detaches it); with
//! `stdinOnce` the container's stdin is closed when the first client that wrote it leaves (a
//! terminal gets its end-of-file character instead, as a typed Ctrl-D).
//!
//! `connect` is the agent's side ([`crate::Runtime::attach`]): it turns the connection into
//! an [`ExecSession`], so the agent serves attach with exec's code. Dropping the session's
//! guard ends its task and closes the connection; the container keeps running.

use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use nix::poll::PollFlags;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::RuntimeError;
use crate::exec::{ExecOptions, ExecReader, ExecSession, ExecWriter, SessionGuard, Terminal};
use crate::sys;

/// The socket's file name in the container's state directory.
pub(crate) const SOCKET_FILE: &str = "attach.sock";

/// The container's standard input.
pub const STDIN: u8 = 0;
/// Its standard output (with a terminal: everything it writes to the terminal).
pub const STDOUT: u8 = 1;
/// Its standard error (none with a terminal).
pub const STDERR: u8 = 2;
/// A new terminal size: columns and rows, two bytes each, big-endian.
pub const RESIZE: u8 = 4;
/// Closes the channel named by the frame's one byte (only [`STDIN`]).
pub const CLOSE: u8 = 255;
/// The first frame of a client: one byte, 1 when it writes stdin.
pub const OPEN: u8 = 0x80;

/// Largest frame either side accepts.
const MAX_FRAME: usize = 1 << 20;
/// Output queued for one client beyond which it is disconnected.
pub const MAX_PENDING: usize = 4 << 20;
/// Input queued for the container beyond which the clients are not read.
const MAX_STDIN_PENDING: usize = 1 << 20;
/// At most this many clients at once.
const MAX_CLIENTS: usize = 64;

fn frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(data.len() + 5);
    f.push(channel);
    f.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    f.extend_from_slice(data);
    f
}

/// Takes one complete frame off the front of `buf`; `Err` on a frame that is too long.
fn take_frame(buf: &mut Vec<u8>) -> Result<Option<(u8, Vec<u8>)>, ()> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_FRAME {
        return Err(());
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let ch = buf[0];
    let data = buf[5..5 + len].to_vec();
    buf.drain(..5 + len);
    Ok(Some((ch, data)))
}

/// `/proc/self/fd/<dir>/attach.sock`: a short path to the socket whatever the directory's.
fn socket_path(dir: &OwnedFd) -> String {
    format!("/proc/self/fd/{}/{SOCKET_FILE}", dir.as_raw_fd())
}

fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    nix::fcntl::open(
        dir,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// What the container reads its input from, as the shim holds it.
pub(crate) enum Input {
    /// No input (`/dev/null`).
    None,
    /// The writing end of the container's stdin pipe.
    Pipe(OwnedFd),
    /// The terminal's master (non-blocking); input is typed into it.
    Terminal(OwnedFd),
}

struct Client {
    stream: UnixStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// `None` until its OPEN frame; then whether it writes stdin.
    stdin: Option<bool>,
    /// Leaves once its queued output is written.
    leaving: bool,
    gone: bool,
}

/// The shim's attach server (single-threaded, driven by the shim's `poll` loop).
pub(crate) struct Server {
    listener: UnixListener,
    path: String,
    _dir: OwnedFd,
    clients: Vec<Client>,
    input: Input,
    /// Whether the container has a stdin clients may write (`stdin: true`).
    accepts_stdin: bool,
    stdin_once: bool,
    pending: Vec<u8>,
}

/// Where one of the server's descriptors is in the poll set.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Slot {
    Listener,
    Stdin,
    Client(usize),
}

impl Server {
    /// Listens on `<dir>/attach.sock` (replacing a stale one), mode 0600.
    pub(crate) fn bind(
        dir: &Path,
        input: Input,
        accepts_stdin: bool,
        stdin_once: bool,
    ) -> io::Result<Server> {
        let dfd = open_dir(dir)?;
        let path = socket_path(&dfd);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        // The shim is single-threaded: the umask covers exactly this bind.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
        let listener = UnixListener::bind(&path);
        nix::sys::stat::umask(old);
        let listener = listener?;
        listener.set_nonblocking(true)?;
        Ok(Server {
            listener,
            path,
            _dir: dfd,
            clients: Vec::new(),
            input,
            accepts_stdin,
            stdin_once,
            pending: Vec::new(),
        })
    }

    /// The descriptors to poll and for what, in a stable order.
    pub(crate) fn interest(&self) -> Vec<(BorrowedFd<'_>, PollFlags, Slot)> {
        let mut v = vec![(self.listener.as_fd(), PollFlags::POLLIN, Slot::Listener)];
        if !self.pending.is_empty()
            && let Some(fd) = self.input_fd()
        {
            v.push((fd, PollFlags::POLLOUT, Slot::Stdin));
        }
        let read_clients = self.pending.len() < MAX_STDIN_PENDING;
        for (i, c) in self.clients.iter().enumerate() {
            let mut flags = PollFlags::empty();
            if read_clients && !c.leaving {
                flags |= PollFlags::POLLIN;
            }
            if !c.out.is_empty() {
                flags |= PollFlags::POLLOUT;
            }
            v.push((c.stream.as_fd(), flags, Slot::Client(i)));
        }
        v
    }

    fn input_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.input {
            Input::None => None,
            Input::Pipe(fd) | Input::Terminal(fd) => Some(fd.as_fd()),
        }
    }

    /// Handles what `poll` reported for `slot`.
    pub(crate) fn ready(&mut self, slot: Slot, revents: PollFlags) {
        match slot {
            Slot::Listener => self.accept(),
            Slot::Stdin => self.write_input(),
            Slot::Client(i) => {
                if revents.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                    self.read_client(i);
                }
                if revents.contains(PollFlags::POLLOUT)
                    && let Some(c) = self.clients.get_mut(i)
                {
                    flush(c);
                }
            }
        }
    }

    /// Removes the clients that left; call once after handling a poll round.
    pub(crate) fn reap(&mut self) {
        let mut stdin_left = false;
        self.clients.retain(|c| {
            let done = c.gone || (c.leaving && c.out.is_empty());
            if done && c.stdin == Some(true) {
                stdin_left = true;
            }
            !done
        });
        if stdin_left && self.stdin_once {
            self.close_input();
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.clients.len() >= MAX_CLIENTS || stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    self.clients.push(Client {
                        stream,
                        inbuf: Vec::new(),
                        out: Vec::new(),
                        stdin: None,
                        leaving: false,
                        gone: false,
                    });
                }
                Err(_) => return,
            }
        }
    }

    fn read_client(&mut self, i: usize) {
        let mut buf = [0u8; 16 * 1024];
        let mut frames = Vec::new();
        {
            let Some(c) = self.clients.get_mut(i) else {
                return;
            };
            loop {
                match c.stream.read(&mut buf) {
                    Ok(0) => {
                        c.gone = true;
                        break;
                    }
                    Ok(n) => c.inbuf.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        c.gone = true;
                        break;
                    }
                }
                if c.inbuf.len() > MAX_FRAME + 5 {
                    break;
                }
            }
            loop {
                match take_frame(&mut c.inbuf) {
                    Ok(Some(f)) => frames.push(f),
                    Ok(None) => break,
                    Err(()) => {
                        c.gone = true;
                        break;
                    }
                }
            }
        }
        for (ch, data) in frames {
            self.client_frame(i, ch, &data);
        }
    }

    fn client_frame(&mut self, i: usize, ch: u8, data: &[u8]) {
        let accepts_stdin = self.accepts_stdin && !matches!(self.input, Input::None);
        let Some(c) = self.clients.get_mut(i) else {
            return;
        };
        match (ch, c.stdin) {
            (OPEN, None) => c.stdin = Some(data.first() == Some(&1) && accepts_stdin),
            (_, None) => c.gone = true,
            (STDIN, Some(true)) if !c.leaving => self.pending.extend_from_slice(data),
            (CLOSE, Some(stdin)) if data.first() == Some(&STDIN) => {
                c.leaving = true;
                if stdin {
                    // Written before the container's input may close.
                    self.write_input();
                }
            }
            (RESIZE, Some(_)) => {
                if let (Input::Terminal(fd), [c0, c1, r0, r1]) = (&self.input, data) {
                    let (cols, rows) = (
                        u16::from_be_bytes([*c0, *c1]),
                        u16::from_be_bytes([*r0, *r1]),
                    );
                    if cols > 0 && rows > 0 {
                        let _ = sys::set_window_size(fd.as_fd(), rows, cols);
                    }
                }
            }
            _ => {}
        }
    }

    fn write_input(&mut self) {
        while !self.pending.is_empty() {
            let Some(fd) = self.input_fd() else {
                self.pending.clear();
                return;
            };
            match nix::unistd::write(fd, &self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(_) => {
                    // The container closed its input: nothing more can reach it.
                    self.pending.clear();
                    if matches!(self.input, Input::Pipe(_)) {
                        self.input = Input::None;
                    }
                    return;
                }
            }
        }
    }

    /// `stdinOnce`: the container sees the end of its input.
    fn close_input(&mut self) {
        self.write_input();
        match &self.input {
            Input::Pipe(_) => self.input = Input::None,
            // A terminal's end of input is its EOF character (Ctrl-D at a line's start).
            Input::Terminal(fd) => {
                let _ = nix::unistd::write(fd, b"\x04");
            }
            Input::None => {}
        }
        self.pending.clear();
        self.accepts_stdin = false;
    }

    /// Sends `data`, output of `channel`, to every client.
    pub(crate) fn broadcast(&mut self, channel: u8, data: &[u8]) {
        if self.clients.is_empty() || data.is_empty() {
            return;
        }
        let f = frame(channel, data);
        for c in &mut self.clients {
            if c.gone || c.stdin.is_none() {
                continue;
            }
            c.out.extend_from_slice(&f);
            flush(c);
            if c.out.len() > MAX_PENDING {
                c.gone = true;
            }
        }
    }

    /// The container exited: what is queued goes out if it can without waiting, then every
    /// connection and the socket are closed.
    pub(crate) fn close(mut self) {
        let _ = std::fs::remove_file(&self.path);
        for c in &mut self.clients {
            flush(c);
        }
    }
}

fn flush(c: &mut Client) {
    while !c.out.is_empty() && !c.gone {
        match c.stream.write(&c.out) {
            Ok(0) => c.gone = true,
            Ok(n) => {
                c.out.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(_) => c.gone = true,
        }
    }
}

/// Attaches to the container whose state directory is `dir`: its output as readers, its
/// input (when `opts.stdin`) as a writer, the terminal (when it has one) for resizes. The
/// session's `exit` resolves (to 0) when the container has exited or the shim detached the
/// client; dropping the session disconnects, leaving the container running.
pub(crate) async fn connect(
    dir: &Path,
    opts: ExecOptions,
    tty: bool,
) -> Result<ExecSession, RuntimeError> {
    let sys_err = |op: &str| {
        let op = format!("{op} {}", dir.join(SOCKET_FILE).display());
        move |source: io::Error| RuntimeError::Sys { op, source }
    };
    let dfd = open_dir(dir).map_err(sys_err("opening the directory of"))?;
    let mut stream = tokio::net::UnixStream::connect(socket_path(&dfd))
        .await
        .map_err(sys_err("connecting to"))?;
    drop(dfd);
    stream
        .write_all(&frame(OPEN, &[u8::from(opts.stdin)]))
        .await
        .map_err(sys_err("writing to"))?;
    const PIPE: usize = 64 * 1024;
    let (mut out_w, out_r) = tokio::io::duplex(PIPE);
    let (err_w, err_r) = if tty {
        (None, None)
    } else {
        let (w, r) = tokio::io::duplex(PIPE);
        (Some(w), Some(r))
    };
    let (in_w, in_r) = if opts.stdin {
        let (w, r) = tokio::io::duplex(PIPE);
        (Some(w), Some(r))
    } else {
        (None, None)
    };
    let (resize_tx, mut resize_rx) = tokio::sync::mpsc::unbounded_channel::<(u16, u16)>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let (mut rd, mut wr) = stream.into_split();
        let mut err_w = err_w;
        let mut in_r = in_r;
        let mut inbuf = Vec::new();
        let mut buf = vec![0u8; PIPE];
        let mut input = vec![0u8; 16 * 1024];
        'outer: loop {
            let stdin_read = async {
                match in_r.as_mut() {
                    Some(r) => r.read(&mut input).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = rd.read(&mut buf) => match r {
                    Ok(n) if n > 0 => {
                        inbuf.extend_from_slice(&buf[..n]);
                        while let Ok(Some((ch, data))) = take_frame(&mut inbuf) {
                            let sent = match (ch, err_w.as_mut()) {
                                (STDOUT, _) => out_w.write_all(&data).await,
                                (STDERR, Some(w)) => w.write_all(&data).await,
                                _ => Ok(()),
                            };
                            if sent.is_err() {
                                break 'outer;
                            }
                        }
                    }
                    _ => break,
                },
                r = stdin_read => match r {
                    Ok(n) if n > 0 => {
                        if wr.write_all(&frame(STDIN, &input[..n])).await.is_err() {
                            break;
                        }
                    }
                    _ => {
                        in_r = None;
                        if wr.write_all(&frame(CLOSE, &[STDIN])).await.is_err() {
                            break;
                        }
                    }
                },
                Some((cols, rows)) = resize_rx.recv() => {
                    let mut size = cols.to_be_bytes().to_vec();
                    size.extend_from_slice(&rows.to_be_bytes());
                    if wr.write_all(&frame(RESIZE, &size)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = done_tx.send(());
    });
    let exit = Box::pin(async move {
        let _ = done_rx.await;
        Ok(0)
    });
    Ok(ExecSession {
        stdin: in_w.map(|w| Box::pin(w) as ExecWriter),
        stdout: Box::pin(out_r) as ExecReader,
        stderr: err_r.map(|r| Box::pin(r) as ExecReader),
        terminal: tty.then(|| Terminal::remote(resize_tx)),
        exit,
        session: SessionGuard::task(task.abort_handle()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_taken_whole() {
        let mut buf = frame(STDIN, b"abc");
        buf.extend_from_slice(&frame(CLOSE, &[STDIN])[..3]);
        assert_eq!(take_frame(&mut buf), Ok(Some((STDIN, b"abc".to_vec()))));
        assert_eq!(take_frame(&mut buf), Ok(None));
        let mut huge = vec![STDIN];
        huge.extend_from_slice(&(MAX_FRAME as u32 + 1).to_be_bytes());
        assert_eq!(take_frame(&mut huge), Err(()));
    }

    #[tokio::test]
    async fn clients_get_output_input_reaches_the_pipe_and_stdin_once_closes_it() {
        let dir = tempfile::tempdir().unwrap();
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let mut server = Server::bind(dir.path(), Input::Pipe(w), true, true).unwrap();
        let mode = std::fs::metadata(dir.path().join(SOCKET_FILE)).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(mode.permissions().mode() & 0o777, 0o600);
        let step = |server: &mut Server| {
            let ready: Vec<(Slot, PollFlags)> = {
                let interest = server.interest();
                let mut fds: Vec<nix::poll::PollFd<'_>> = interest
                    .iter()
                    .map(|(fd, flags, _)| nix::poll::PollFd::new(*fd, *flags))
                    .collect();
                nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10u8)).unwrap();
                fds.iter()
                    .zip(&interest)
                    .filter_map(|(f, (_, _, s))| {
                        f.revents().filter(|r| !r.is_empty()).map(|r| (*s, r))
                    })
                    .collect()
            };
            for (slot, r) in ready {
                server.ready(slot, r);
            }
            server.reap();
        };
        let dir_path = dir.path().to_path_buf();
        let client = tokio::spawn(async move {
            connect(
                &dir_path,
                ExecOptions {
                    stdin: true,
                    tty: false,
                },
                false,
            )
            .await
        });
        let mut session = loop {
            step(&mut server);
            if client.is_finished() {
                break client.await.unwrap().unwrap();
            }
            tokio::task::yield_now().await;
        };
        // The OPEN frame arrives, then output is fanned out.
        while server.clients.first().and_then(|c| c.stdin).is_none() {
            step(&mut server);
            tokio::task::yield_now().await;
        }
        server.broadcast(STDOUT, b"out");
        server.broadcast(STDERR, b"err");
        let mut got = [0u8; 3];
        session.stdout.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"out");
        session
            .stderr
            .as_mut()
            .unwrap()
            .read_exact(&mut got)
            .await
            .unwrap();
        assert_eq!(&got, b"err");
        let mut stdin = session.stdin.take().unwrap();
        stdin.write_all(b"typed").await.unwrap();
        stdin.shutdown().await.unwrap();
        drop(stdin);
        let mut reader = std::fs::File::from(r);
        let mut all = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // stdinOnce: the client leaves, the pipe's writing end closes, the reader sees EOF.
        while !matches!(server.input, Input::None) {
            assert!(std::time::Instant::now() < deadline, "stdin never closed");
            step(&mut server);
            tokio::task::yield_now().await;
        }
        reader.read_to_end(&mut all).unwrap();
        assert_eq!(all, b"typed");
        server.close();
        assert!(!dir.path().join(SOCKET_FILE).exists());
        assert_eq!(session.exit.await.unwrap(), 0);
    }
}
