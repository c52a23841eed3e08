//! The only place that changes a thread's network namespace.
//!
//! Netlink sockets and `/proc/sys/net` files belong to the network namespace of the task that
//! creates or opens them. Every such operation runs here, on a fresh, short-lived std thread that
//! `setns(2)`s into the target namespace first and exits afterwards. Tokio worker threads are
//! never moved: a thread's namespace would leak into whatever task runs on it next.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;
use tokio::sync::oneshot;

use super::NetError;

/// A network namespace: a bind-mounted namespace file (`/run/netns/NAME`) or, for `None`, the
/// namespace the agent runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Netns(Option<PathBuf>);

impl Netns {
    pub(crate) fn new(path: Option<&Path>) -> Self {
        Self(path.map(Path::to_path_buf))
    }

    /// The namespace file, `None` for the agent's own namespace.
    pub(crate) fn path(&self) -> Option<&Path> {
        self.0.as_deref()
    }

    /// For error messages: the path, or the agent's own namespace file.
    pub(crate) fn display_path(&self) -> PathBuf {
        self.0
            .clone()
            .unwrap_or_else(|| PathBuf::from("/proc/self/ns/net"))
    }

    /// Opens the namespace file (read-only; enough for `setns` and for `IFLA_NET_NS_FD`).
    pub(crate) fn open(&self) -> Result<Option<File>, NetError> {
        self.0
            .as_ref()
            .map(|p| {
                File::open(p).map_err(|source| NetError::Netns {
                    path: p.clone(),
                    source,
                })
            })
            .transpose()
    }

    /// Runs `f` on a dedicated thread inside this namespace and returns its result. The thread
    /// exits when `f` returns, so its namespace never leaks.
    pub(crate) async fn run<R, F>(&self, f: F) -> Result<R, NetError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let file = self.open()?;
        let path = self.display_path();
        let (tx, rx) = oneshot::channel();
        let netns_err = |source: io::Error| NetError::Netns {
            path: path.clone(),
            source,
        };
        std::thread::Builder::new()
            .name("skiff-netns".into())
            .spawn(move || {
                let result = match file {
                    Some(file) => enter(&file).map(|()| f()),
                    None => Ok(f()),
                };
                // The receiver only disappears if the caller was cancelled; nothing to report.
                let _ = tx.send(result);
            })
            .map_err(netns_err)?;
        match rx.await {
            Ok(result) => result.map_err(netns_err),
            Err(_) => Err(netns_err(io::Error::other("netns worker thread panicked"))),
        }
    }
}

impl Netns {
    /// Like [`Netns::run`], but blocking and for a `f` that borrows from the caller (a scoped
    /// thread): e.g. attaching a tc program, which needs the loaded program and resolves the
    /// device in the calling thread's namespace.
    pub(crate) fn run_scoped<R, F>(&self, f: F) -> Result<R, NetError>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        let file = self.open()?;
        let path = self.display_path();
        let netns_err = |source: io::Error| NetError::Netns {
            path: path.clone(),
            source,
        };
        std::thread::scope(|s| {
            let worker = std::thread::Builder::new()
                .name("skiff-netns".into())
                .spawn_scoped(s, move || match file {
                    Some(file) => enter(&file).map(|()| f()),
                    None => Ok(f()),
                })
                .map_err(netns_err)?;
            match worker.join() {
                Ok(result) => result.map_err(netns_err),
                Err(_) => Err(netns_err(io::Error::other("netns worker thread panicked"))),
            }
        })
    }
}

impl fmt::Display for Netns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(p) => write!(f, "netns {}", p.display()),
            None => f.write_str("the agent's netns"),
        }
    }
}

/// Moves the calling thread into the network namespace `file` refers to.
fn enter(file: &File) -> io::Result<()> {
    // nix's `setns` wraps the raw syscall; it needs no `unsafe` here: the fd is borrowed from a
    // live `File` for the duration of the call, and only the calling thread's network
    // namespace changes (CLONE_NEWNET is allowed in multi-threaded processes).
    nix::sched::setns(file, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// Opens a TCP connection to `addr` from inside the network namespace bind-mounted at
/// `netns` (a pod's, for port forwarding to its `localhost`). The socket belongs to that
/// namespace for its whole life; the thread that made it exits.
pub async fn connect_in(
    netns: &Path,
    addr: std::net::SocketAddr,
    timeout: std::time::Duration,
) -> Result<std::net::TcpStream, NetError> {
    let ns = Netns::new(Some(netns));
    let path = ns.display_path();
    ns.run(move || std::net::TcpStream::connect_timeout(&addr, timeout))
        .await?
        .map_err(|source| NetError::Netns { path, source })
}

/// Opens a TCP listener on `addr` inside the network namespace bind-mounted at `netns`
/// (the current one for `None`): the node's, for the agent's API server passthrough. The
/// socket belongs to that namespace for its whole life (nonblocking, for tokio); the thread
/// that made it exits.
pub async fn listen_in(
    netns: Option<&Path>,
    addr: std::net::SocketAddr,
) -> Result<std::net::TcpListener, NetError> {
    let ns = Netns::new(netns);
    let path = ns.display_path();
    ns.run(move || -> std::io::Result<std::net::TcpListener> {
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .await?
    .map_err(|source| NetError::Netns { path, source })
}

/// Binds a UDP socket to `addr` inside the network namespace `netns` (the current one for
/// `None`), nonblocking for tokio: the node's DNS server.
pub async fn bind_udp_in(
    netns: Option<&Path>,
    addr: std::net::SocketAddr,
) -> Result<std::net::UdpSocket, NetError> {
    let ns = Netns::new(netns);
    let path = ns.display_path();
    ns.run(move || -> std::io::Result<std::net::UdpSocket> {
        let s = std::net::UdpSocket::bind(addr)?;
        s.set_nonblocking(true)?;
        Ok(s)
    })
    .await?
    .map_err(|source| NetError::Netns { path, source })
}

/// Writes a per-namespace sysctl under `/proc/sys/net` from inside `netns`.
pub(crate) async fn write_sysctl(netns: &Netns, key: &str, value: &str) -> Result<(), NetError> {
    let path = PathBuf::from("/proc/sys/net").join(key);
    let p = path.clone();
    let value = value.to_string();
    netns
        .run(move || std::fs::write(&p, value))
        .await?
        .map_err(|source| NetError::Sysctl {
            path,
            netns: netns.to_string(),
            source,
        })
}
