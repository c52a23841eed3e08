//! The node's passthrough to the API server: a TCP listener in the node's network namespace
//! (on its InternalIP, port `--apiserver-proxy-port`) whose connections the agent carries to
//! the API server it talks to itself. The Service load balancer sends the `kubernetes`
//! Service there, so pods reach the API server at 10.96.0.1:443 wherever it runs, also when
//! only the agent's own namespace can reach it (a control plane on loopback, as under
//! `cargo xtask up` and in the tests). Bytes only: TLS stays end to end between the pod
//! and the API server, which authenticates the pod's token itself; what this listener
//! exposes is what the API server's own port exposes. k3s' agent load balancer plays the
//! same part for its components.
//!
//! With several API servers (a `--server` list) a connection goes to the one that answered
//! last, and to the next ones in turn when it does not answer: a pod's connection fails over
//! at connect time, as the agent's own client does.
//!
//! Written by hand: a bounded accept loop and `copy_bidirectional` are all it needs.
//!
//! The port defaults to [`crate::DEFAULT_API_SERVER_PROXY_PORT`] (0 turns the passthrough
//! off); at most 1024 connections are carried at once; the connections are dialled from the
//! agent's own namespace. The proxy routes the `kubernetes` Service here
//! (`Proxy::route_locally`) instead of to its Endpoints.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

/// Connections carried at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 1024;
/// How long connecting to the API server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApiProxyError {
    #[error("the API server URL {0:?} has no host and port")]
    Upstream(String),
    #[error("listening on {addr} in the node's network namespace: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: Box<skiff_hostnet::NetError>,
    },
    #[error("listening on {addr}: {source}")]
    Tokio {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// `host:port` of an `https://host:port/...` URL (443 when the port is left out).
pub fn upstream_of(url: &str) -> Result<String, ApiProxyError> {
    let err = || ApiProxyError::Upstream(url.to_string());
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(err)?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(err());
    }
    let has_port = match authority.rsplit_once(':') {
        // `[::1]` alone has a colon but no port.
        Some((host, port)) => {
            !host.is_empty() && !port.contains(']') && port.parse::<u16>().is_ok()
        }
        None => false,
    };
    Ok(if has_port {
        authority.to_string()
    } else {
        let default = if url.starts_with("https://") { 443 } else { 80 };
        format!("{authority}:{default}")
    })
}

/// The `host:port` of every URL of a comma-separated list (what `--server` takes).
pub fn upstreams_of(urls: &str) -> Result<Vec<String>, ApiProxyError> {
    urls.split(',').map(|u| upstream_of(u.trim())).collect()
}

/// A running passthrough; stopped when dropped.
pub struct ApiProxy {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ApiProxy {
    /// Listens on `addr` in `netns` (the agent's own for `None`) and carries every
    /// connection to one of `upstreams` (`host:port`, resolved and dialled from the agent's
    /// namespace at each connection; the last one that answered first).
    pub async fn start(
        netns: Option<&Path>,
        addr: SocketAddr,
        upstreams: Vec<String>,
    ) -> Result<ApiProxy, ApiProxyError> {
        let std_listener = skiff_hostnet::listen_in(netns, addr)
            .await
            .map_err(|source| ApiProxyError::Listen {
                addr,
                source: Box::new(source),
            })?;
        let listener = TcpListener::from_std(std_listener)
            .map_err(|source| ApiProxyError::Tokio { addr, source })?;
        let addr = listener.local_addr().unwrap_or(addr);
        info!(%addr, upstreams = %upstreams.join(","), "API server passthrough listening for pods");
        let upstreams = Arc::new(Upstreams {
            all: upstreams,
            last_good: std::sync::atomic::AtomicUsize::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, upstreams));
        Ok(ApiProxy { addr, task })
    }
}

/// The API servers and the one that answered last.
struct Upstreams {
    all: Vec<String>,
    last_good: std::sync::atomic::AtomicUsize,
}

impl Upstreams {
    /// A connection to the server that answered last, else to the next ones in turn.
    async fn connect(&self, peer: SocketAddr) -> Option<TcpStream> {
        use std::sync::atomic::Ordering;
        let n = self.all.len();
        let first = self.last_good.load(Ordering::Relaxed);
        for i in (0..n).map(|k| (first + k) % n) {
            let upstream = &self.all[i];
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(upstream)).await {
                Ok(Ok(s)) => {
                    if i != first {
                        info!(%upstream, "pods' API server connections go here now");
                        self.last_good.store(i, Ordering::Relaxed);
                    }
                    return Some(s);
                }
                Ok(Err(e)) => {
                    warn!(%peer, %upstream, error = %e, "cannot reach the API server for a pod")
                }
                Err(_) => warn!(%peer, %upstream, "timed out reaching the API server for a pod"),
            }
        }
        None
    }
}

async fn accept_loop(listener: TcpListener, upstreams: Arc<Upstreams>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: wait a little rather than spin.
                warn!(error = %e, "accepting a connection for the API server");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let upstreams = Arc::clone(&upstreams);
        tokio::spawn(async move {
            let _permit = permit;
            carry(conn, peer, &upstreams).await;
        });
    }
}

async fn carry(mut conn: TcpStream, peer: SocketAddr, upstreams: &Upstreams) {
    let Some(mut server) = upstreams.connect(peer).await else {
        return;
    };
    let _ = conn.set_nodelay(true);
    let _ = server.set_nodelay(true);
    match tokio::io::copy_bidirectional(&mut conn, &mut server).await {
        Ok((up, down)) => debug!(%peer, up, down, "API server connection closed"),
        Err(e) => debug!(%peer, error = %e, "API server connection ended"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn upstream_is_the_urls_authority() {
        assert_eq!(
            upstream_of("https://127.0.0.1:7443").unwrap(),
            "127.0.0.1:7443"
        );
        assert_eq!(
            upstream_of("https://api.example:6443/").unwrap(),
            "api.example:6443"
        );
        assert_eq!(
            upstream_of("https://api.example").unwrap(),
            "api.example:443"
        );
        assert_eq!(upstream_of("https://[::1]:7443").unwrap(), "[::1]:7443");
        assert_eq!(upstream_of("https://[::1]").unwrap(), "[::1]:443");
        assert!(upstream_of("ftp://x").is_err());
        assert!(upstream_of("https://").is_err());
        assert!(upstream_of("https://user@host:1").is_err());
    }

    #[tokio::test]
    async fn bytes_go_both_ways() {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = server.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = server.accept().await.unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).await.unwrap();
            buf.reverse();
            s.write_all(&buf).await.unwrap();
        });
        let proxy = ApiProxy::start(None, "127.0.0.1:0".parse().unwrap(), vec![upstream])
            .await
            .unwrap();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(b"hello").await.unwrap();
        let mut back = [0u8; 5];
        c.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"olleh");
    }

    #[tokio::test]
    async fn an_unreachable_server_closes_the_connection() {
        // A port nothing listens on (bound, then freed).
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = free.local_addr().unwrap().to_string();
        drop(free);
        let proxy = ApiProxy::start(None, "127.0.0.1:0".parse().unwrap(), vec![upstream])
            .await
            .unwrap();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        let mut buf = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut buf))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    /// Several API servers: a dead first one is skipped, and the next connection goes
    /// straight to the one that answered.
    #[tokio::test]
    async fn a_dead_server_is_skipped() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = free.local_addr().unwrap().to_string();
        drop(free);
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let alive = server.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = server.accept().await.unwrap();
                s.write_all(b"up").await.unwrap();
            }
        });
        assert_eq!(
            upstreams_of(&format!("http://{dead}, http://{alive}")).unwrap(),
            [dead.clone(), alive.clone()]
        );
        let proxy = ApiProxy::start(None, "127.0.0.1:0".parse().unwrap(), vec![dead, alive])
            .await
            .unwrap();
        for _ in 0..2 {
            let mut c = TcpStream::connect(proxy.addr).await.unwrap();
            let mut got = [0u8; 2];
            tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut got))
                .await
                .expect("answered in time")
                .unwrap();
            assert_eq!(&got, b"up");
        }
    }
}
