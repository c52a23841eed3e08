//! A TCP forwarder from a loopback port of the caller's network namespace to an address
//! inside another namespace: how a test process (or `cargo xtask up` on the host) reaches
//! the API server on its machine, the way a user's laptop reaches a cluster through a port
//! forward. It belongs to the harness, not to the product: nothing of Skiff uses it.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::NetError;

/// Listens on a loopback port (of the namespace it was made in, or of another one); every
/// connection is carried to `target` dialled from inside a namespace. Stops accepting when
/// dropped (connections already carried end when either side closes).
#[derive(Debug)]
pub struct Forwarder {
    local: SocketAddr,
    /// The namespace the listener is in, when not the caller's.
    local_netns: Option<std::path::PathBuf>,
    target: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Forwarder {
    /// Forwards a free loopback port to `target` inside the namespace bind-mounted at
    /// `netns` (`/run/netns/<name>`).
    pub fn start(netns: &Path, target: SocketAddr) -> Result<Forwarder, NetError> {
        Forwarder::between(None, ([127, 0, 0, 1], 0).into(), netns, target)
    }

    /// Forwards `listen` (in namespace `listen_netns`, or the caller's) to `target` dialled
    /// from inside namespace `target_netns`.
    pub fn between(
        listen_netns: Option<&Path>,
        listen: SocketAddr,
        target_netns: &Path,
        target: SocketAddr,
    ) -> Result<Forwarder, NetError> {
        let listen_ns = listen_netns
            .map(std::fs::File::open)
            .transpose()
            .map_err(NetError::Spawn)?;
        let target_ns = std::fs::File::open(target_netns).map_err(NetError::Spawn)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // setns(2) changes this thread's namespace only: the listener is opened in the
            // listening namespace, then sockets opened afterwards belong to the target's.
            let listener = (|| {
                if let Some(ns) = &listen_ns {
                    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
                }
                let l = TcpListener::bind(listen)?;
                nix::sched::setns(&target_ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
                Ok::<_, std::io::Error>(l)
            })();
            let listener = match listener.and_then(|l| Ok((l.local_addr()?, l))) {
                Ok((local, l)) => {
                    let _ = ready_tx.send(Ok(local));
                    l
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            for client in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                splice(client, server);
            }
        });
        let local = ready_rx
            .recv()
            .map_err(|_| NetError::Spawn(std::io::Error::other("the forwarder thread died")))?
            .map_err(NetError::Spawn)?;
        Ok(Forwarder {
            local,
            local_netns: listen_netns.map(Path::to_path_buf),
            target,
            stop,
        })
    }

    /// The loopback address it listens on.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// Where it forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accepting thread so it sees the flag.
        let _ = match &self.local_netns {
            Some(ns) => connect_in(ns, self.local, Duration::from_secs(1)).map(drop),
            None => TcpStream::connect_timeout(&self.local, Duration::from_secs(1)).map(drop),
        };
    }
}

/// A TCP connection to `addr` made from inside the namespace at `netns` ([`run_in`]).
pub fn connect_in(netns: &Path, addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    run_in(netns, || TcpStream::connect_timeout(&addr, timeout))?
}

/// Runs `f` on a thread of its own that first enters the network namespace at `netns`: every
/// socket `f` makes belongs to that namespace (and stays there whichever thread uses it). A
/// panic in `f` is resumed in the caller.
pub fn run_in<T: Send>(netns: &Path, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    let ns = std::fs::File::open(netns)?;
    std::thread::scope(|s| {
        s.spawn(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A UDP socket bound to `addr` inside the namespace at `netns` ([`run_in`]): a server of
/// the test process that only a machine's processes reach.
pub fn udp_bind_in(netns: &Path, addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    run_in(netns, || std::net::UdpSocket::bind(addr))?
}

/// Copies both ways until either side closes, each direction on a thread of its own.
fn splice(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    std::thread::spawn(move || copy(a, b2));
    std::thread::spawn(move || copy(b, a2));
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Netns;

    #[test]
    fn a_loopback_port_reaches_a_server_on_another_namespaces_loopback() {
        let ns = Netns::create(&format!("skiff-fwd-test-{}", std::process::id())).unwrap();
        // A server on the other namespace's own loopback: `nc`-free, a thread that setns'es.
        let path = ns.path();
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            let mut got = [0u8; 5];
            c.read_exact(&mut got).unwrap();
            c.write_all(&got.map(|b| b.to_ascii_uppercase())).unwrap();
        });
        let target = rx.recv().unwrap();
        // Unreachable from here: the port is on the other namespace's loopback.
        assert!(TcpStream::connect_timeout(&target, Duration::from_millis(200)).is_err());
        let fwd = Forwarder::start(&ns.path(), target).unwrap();
        let mut c = TcpStream::connect(fwd.local()).unwrap();
        c.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        c.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"HELLO");
        server.join().unwrap();
    }
}
