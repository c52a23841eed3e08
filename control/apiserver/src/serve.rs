//! The accept loop of the API server's one port: plain TCP (in-process servers of tests and
//! benchmarks) or TLS, each connection served by hyper (HTTP/1.1 with upgrades for
//! WebSocket, or HTTP/2 for gRPC and REST) with the connection's [`PeerIdentity`] in every
//! request's extensions. Handshakes run in the connection's own task, bounded in time, so a
//! slow or hostile client never holds up others.
//!
//! A client that trickles its request headers is cut off after
//! `--request-header-timeout-seconds`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tracing::debug;

use crate::auth::{Authenticator, PeerIdentity};

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS and the authenticator whose certificate check runs once per connection.
#[derive(Clone)]
pub(crate) struct TlsSetup {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub authn: Arc<Authenticator>,
}

/// Serves `app` on `listener` until `shutdown` fires, then waits for open connections to
/// finish (the caller bounds how long).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsSetup>,
    header_read_timeout: Duration,
    shutdown: oneshot::Receiver<()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let mut shutdown = shutdown;
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let tls = tls.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let mut builder = Builder::new(TokioExecutor::new());
            // A client that trickles its request headers (slowloris) is cut off.
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            match tls {
                None => {
                    let first = Arc::new(tokio::sync::Notify::new());
                    let svc = with_peer(
                        app,
                        PeerIdentity {
                            remote: Some(peer),
                            cert: None,
                        },
                        Arc::clone(&first),
                    );
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), svc);
                    until_first_request(
                        watcher.watch(conn.into_owned()),
                        &first,
                        header_read_timeout,
                    )
                    .await;
                }
                Some(tls) => {
                    let stream =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(tcp))
                            .await
                        {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                debug!(%peer, "TLS handshake timed out");
                                return;
                            }
                        };
                    let identity = PeerIdentity {
                        remote: Some(peer),
                        cert: stream
                            .get_ref()
                            .1
                            .peer_certificates()
                            .filter(|c| !c.is_empty())
                            .map(|chain| tls.authn.identify_certificate(chain)),
                    };
                    let first = Arc::new(tokio::sync::Notify::new());
                    let svc = with_peer(app, identity, Arc::clone(&first));
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
                    until_first_request(
                        watcher.watch(conn.into_owned()),
                        &first,
                        header_read_timeout,
                    )
                    .await;
                }
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Serves a connection, dropping it when no request has arrived within `limit`: hyper's
/// header timeout starts only once it has told HTTP/1 from HTTP/2, so a client that sends
/// nothing, or trickles the HTTP/2 preface, would otherwise hold its connection for ever.
async fn until_first_request<F: std::future::Future>(
    conn: F,
    first: &tokio::sync::Notify,
    limit: Duration,
) {
    tokio::pin!(conn);
    tokio::select! {
        _ = &mut conn => return,
        _ = first.notified() => {}
        _ = tokio::time::sleep(limit) => {
            debug!("no request within the header timeout: connection closed");
            return;
        }
    }
    let _ = conn.await;
}

/// The router with the connection's identity put into each request.
#[derive(Clone)]
struct WithPeer {
    app: Router,
    identity: PeerIdentity,
    /// Told when the connection's first request arrives.
    first: Arc<tokio::sync::Notify>,
}

fn with_peer(app: Router, identity: PeerIdentity, first: Arc<tokio::sync::Notify>) -> WithPeer {
    WithPeer {
        app,
        identity,
        first,
    }
}

impl hyper::service::Service<Request<Incoming>> for WithPeer {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = <Router as tower::Service<Request<Incoming>>>::Future;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(self.identity.clone());
        self.first.notify_one();
        // A Router is always ready (axum's own server calls it the same way).
        tower::Service::call(&mut self.app.clone(), req)
    }
}
