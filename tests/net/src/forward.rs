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

/// Listens on `127.0.0.1:<port>` of the namespace it was made in; every connection is
/// carried to `target` dialled from inside another namespace. Stops accepting when dropped
/// (connections already carried end when either side closes).
#[derive(Debug)]
pub struct Forwarder {
    local: SocketAddr,
    target: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Forwarder {
    /// Forwards a free loopback port to `target` inside the namespace bind-mounted at
    /// `netns` (`/run/netns/<name>`).
    pub fn start(netns: &Path, target: SocketAddr) -> Result<Forwarder, NetError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(NetError::Spawn)?;
        let local = listener.local_addr().map_err(NetError::Spawn)?;
        let ns = std::fs::File::open(netns).map_err(NetError::Spawn)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // setns(2) changes this thread's namespace only: sockets it opens from here on
            // belong to `netns`; the listener, opened before, stays in the caller's.
            let entered = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET);
            let failed = entered.is_err();
            let _ = ready_tx.send(entered.map_err(std::io::Error::from));
            if failed {
                return;
            }
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
        ready_rx
            .recv()
            .map_err(|_| NetError::Spawn(std::io::Error::other("the forwarder thread died")))?
            .map_err(NetError::Spawn)?;
        Ok(Forwarder {
            local,
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
        let _ = TcpStream::connect_timeout(&self.local, Duration::from_secs(1));
    }
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
