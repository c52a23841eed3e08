//! The agent's small HTTP API, served on the node's address (`--address`, `--port`), its
//! port published in the Node's `status.daemonEndpoints.kubeletEndpoint.Port`:
//!
//! - `GET /logs/{namespace}/{pod}/{container}?tail=N&follow=true&timestamps=true`: the
//!   container's output as text, one line per line it printed (the time and stream prefix
//!   of the log records stripped; `timestamps=true` keeps the time). `tail=N` gives the last
//!   N lines across the rotated files; `follow=true` then streams new lines (the file is
//!   polled every 200 ms) until the client disconnects or the pod is gone.
//! - `POST /exec/{namespace}/{pod}/{container}` with `Upgrade: skiff-exec`: an
//!   `ExecRequest`'s command in the container, its streams carried as channel frames
//!   ([`exec`]).
//! - `POST /attach/{namespace}/{pod}/{container}`, the same upgrade: an `AttachRequest`
//!   attaches to the container's main process with exec's frames ([`attach`]); the
//!   connection's loss only detaches.
//! - `GET /stats/summary`: JSON [`StatsSummary`](skiff_client::node_api::StatsSummary): per pod the CPU time of its cgroup and the
//!   traffic the eBPF accounting counted for its containers' cgroups.
//! - `GET /bpf/services`, `GET /bpf/backends`: JSON of the Service load balancer's maps
//!   (frontends, backends, per-backend counters, map pressure, programming latency);
//!   `GET /bpf/pods`: the pod fast path's endpoint map joined with the pods' traffic, and its
//!   counters; `GET /bpf/conntrack`: the NodePort conntrack map. The shapes are documented
//!   in [`super::proxy`]. 503 when the load balancer (whose object holds the fast path) is
//!   not running on this node.
//! - `GET /metrics`: the same numbers for Prometheus, in the OpenMetrics text format
//!   (`Content-Type: application/openmetrics-text; version=1.0.0`, written by the
//!   `prometheus-client` crate), read at scrape time (in
//!   [`super::metrics`]):
//!   - `skiff_agent_info{node,version}` 1; `skiff_pods_running` (pods with a sandbox);
//!   - `skiff_pod_network_{receive,transmit}_{bytes,packets}_total{namespace,pod}`: the
//!     `/stats/summary` traffic (absent when the eBPF accounting is not loaded);
//!   - `skiff_lb_up`: 1 when the Service load balancer runs, else 0 and no other `skiff_lb_`
//!     metric; `skiff_lb_frontends`; `skiff_lb_map_entries{map}`,
//!     `skiff_lb_map_max_entries{map}` (map pressure); `skiff_lb_map_writes_total`;
//!     `skiff_lb_programming_latency_seconds` (histogram);
//!     `skiff_lb_backend_connects_total` and `skiff_lb_backend_sends_total`
//!     `{service,port_name,frontend,backend}` (`service`/`port_name` empty for a frontend no
//!     Service owns), all as in `/bpf/services`;
//!   - `skiff_fastpath_packets_total{action}`: the pod fast path's counters (`action` =
//!     `redirect_peer`, `redirect_neigh`, `pass`, `fib_fail`), as in `/bpf/pods`;
//!   - `skiff_l2_announcing{address}`: the LoadBalancer addresses this node announces (the
//!     load balancer's L2 entries), 1 while it answers ARP for one, 0 past its deadline.
//!
//!   A failure to read the LB maps fails the scrape (500), as it fails `/bpf/services`.
//!
//! With the cluster CA (from the agent's kubeconfig) it speaks only TLS: on the node's
//! address with a certificate of the cluster CA for the node's addresses ([`serving`]), which
//! callers verify against the CA and the address they dial (no self-signed certificate, no
//! pin, no loopback exception). It requires a client certificate of the cluster CA: none, or one that does not verify, is a
//! 401. The API server (`system:kube-apiserver`) and `system:masters` pass; other callers
//! pass when the API server allows them `<verb>` on `nodes/<subresource>` (`log` for
//! `/logs`, `stats`, `metrics`, `proxy` for the rest) of this node by a SubjectAccessReview
//! ([`super::access`]), else get the kubelet's 403 (`Forbidden (user=..., verb=...,
//! resource=nodes, subresource=...)`).
//!
//! It reads only local state: the runtime's log files, the pods' cgroups, the pinned
//! counters and LB maps, and the [`PodRegistry`] the pod workers keep up to date. Cluster state stays in
//! the API server.

mod attach;
mod authz;
mod exec;
mod pods;
mod routes;
mod serving;
mod stats;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use skiff_client::Client;
use skiff_runtime::Runtime;
use tracing::{debug, info, warn};

pub use authz::API_SERVER_USER;
pub use pods::{PodInfo, PodRegistry};
pub(crate) use serving::{ServingSpec, renew_when_due};
pub(crate) use stats::Sources;
#[cfg(test)]
pub(crate) use stats::{bpf_router, metrics_router};
pub use tls::AgentTls;

use crate::access;
use authz::{Caller, identify};
use routes::{ApiState, router};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the API serves from: the API server (for access reviews), the runtime (logs, exec)
/// and the local state it reports.
pub(crate) struct ApiCtx {
    pub client: Client,
    pub runtime: Arc<dyn Runtime>,
    pub sources: Sources,
}

#[derive(Debug, thiserror::Error)]
#[error("listening on {addr} for the agent API: {source}")]
pub struct ListenError {
    addr: SocketAddr,
    #[source]
    source: std::io::Error,
}

/// Binds the API's listener (port 0 picks a free one; see `local_addr`).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, ListenError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError { addr, source })
}

/// Serves the API on `listener` until the task is aborted: TLS with client certificates of
/// the cluster CA. Without `tls` (no cluster CA to check callers against) nothing is served:
/// there is no plain-HTTP API.
pub(crate) fn serve(
    listener: tokio::net::TcpListener,
    ctx: ApiCtx,
    tls: Option<AgentTls>,
) -> tokio::task::JoinHandle<()> {
    let state = ApiState {
        node: ctx.sources.node.clone(),
        ctx: Arc::new(ctx),
        access: Arc::new(access::AccessCache::default()),
    };
    let app = router(state.clone()).layer(axum::middleware::from_fn_with_state(
        state,
        authz::authorize,
    ));
    tokio::spawn(async move {
        let addr = listener.local_addr().ok();
        info!(?addr, tls = tls.is_some(), "agent API listening");
        let Some(tls) = tls else {
            warn!(
                "agent API not served: the kubeconfig names no cluster CA to check callers \
                 against (logs, exec and port-forward will not reach this node)"
            );
            drop(listener);
            return;
        };
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    debug!(error = %e, "agent API: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (app, tls) = (app.clone(), tls.clone());
            tokio::spawn(async move {
                let stream =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "agent API: TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                let caller = Caller(identify(
                    &tls.client_ca_pem,
                    stream.get_ref().1.peer_certificates(),
                ));
                let svc = hyper_util::service::TowerToHyperService::new(
                    app.layer(axum::Extension(caller)),
                );
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .with_upgrades();
                if let Err(e) = conn.await {
                    debug!(%peer, error = %e, "agent API connection");
                }
            });
        }
    })
}

pub use crate::usage::cpu_usage_usec;

#[cfg(test)]
pub(crate) mod test_http {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// Serves `app` on a loopback port and GETs `path` (HTTP/1.1): status, head, body.
    pub(crate) async fn get(app: axum::Router, path: &str) -> (u16, String, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        conn.write_all(req.as_bytes()).await.unwrap();
        let mut raw = String::new();
        tokio::time::timeout(Duration::from_secs(20), conn.read_to_string(&mut raw))
            .await
            .expect("response in time")
            .unwrap();
        server.abort();
        let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP response");
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status");
        (status, head.to_string(), body.to_string())
    }
}
