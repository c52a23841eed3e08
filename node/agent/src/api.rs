//! The agent's small HTTP API, served on loopback by default (`--api-listen`), its
//! port published in the Node's `status.daemonEndpoints.kubeletEndpoint.Port`:
//!
//! - `GET /logs/{namespace}/{pod}/{container}?tail=N&follow=true&timestamps=true`: the
//!   container's output as text, one line per line it printed (the time and stream prefix
//!   of the log records stripped; `timestamps=true` keeps the time). `tail=N` gives the last
//!   N lines across the rotated files; `follow=true` then streams new lines (the file is
//!   polled every 200 ms) until the client disconnects or the pod is gone.
//! - `POST /exec/{namespace}/{pod}/{container}`: runs an `ExecRequest`'s command in the
//!   container to completion; answers an `ExecResult` (exit code, base64 output).
//! - `GET /stats/summary`: JSON [`StatsSummary`]: per pod the CPU time of its cgroup and the
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
//!     `redirect_peer`, `redirect_neigh`, `pass`, `fib_fail`), as in `/bpf/pods`.
//!
//!   A failure to read the LB maps fails the scrape (500), as it fails `/bpf/services`.
//!
//! With the cluster CA (from the agent's kubeconfig) it speaks only TLS, with a self-signed
//! certificate kept in `<state>/pki` (made anew near expiry) whose SHA-256 the Node publishes in the annotation
//! `skiff.io/agent-serving-cert-sha256` (clients trust exactly that certificate), and it
//! requires a client certificate of the cluster CA: none, or one that does not verify, is a
//! 401. The API server (`system:kube-apiserver`) and `system:masters` pass; other callers
//! pass when the API server allows them `<verb>` on `nodes/<subresource>` (`log` for
//! `/logs`, `stats`, `metrics`, `proxy` for the rest) of this node by a SubjectAccessReview
//! ([`super::access`]), else get the kubelet's 403 (`Forbidden (user=..., verb=...,
//! resource=nodes, subresource=...)`).
//!
//! It reads only local state: the runtime's log files, the pods' cgroups, the pinned
//! counters and LB maps, and the [`PodRegistry`] the pod workers keep up to date. Cluster state stays in
//! the API server.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use skiff_client::node_api::{
    BpfPod, BpfPods, ContainerStats, ExecRequest, ExecResult, LogOptions, NetworkStats,
    PORT_FORWARD_UPGRADE, PodStats, StatsSummary,
};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types as rustls_types;
use tracing::{debug, info, warn};

use super::Ctx;
use super::access;
use super::logs::LogReader;
use super::metrics;
use skiff_datapath::Accounting;
use skiff_runtime::Sandbox;

/// How often a followed log file is checked for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// What the API knows about one pod the agent runs, published by its worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub sandbox: Option<Sandbox>,
    /// Container names, in spec order.
    pub containers: Vec<String>,
    /// The images its containers name (garbage collection keeps them).
    pub images: Vec<String>,
    /// Every leaf cgroup id the pod's containers have run in (traffic is counted per id).
    pub cgroup_ids: BTreeSet<u64>,
}

/// The pods of this node, by uid, as their workers last saw them.
#[derive(Debug, Clone, Default)]
pub struct PodRegistry(Arc<RwLock<HashMap<String, PodInfo>>>);

impl PodRegistry {
    /// Records `info`, keeping the cgroup ids seen before.
    pub fn publish(&self, mut info: PodInfo) {
        let mut pods = self.0.write().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = pods.get(&info.uid) {
            if *old == info {
                return;
            }
            info.cgroup_ids.extend(old.cgroup_ids.iter().copied());
        }
        pods.insert(info.uid.clone(), info);
    }

    /// Every image a pod of this node names.
    pub fn images(&self) -> std::collections::HashSet<String> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .flat_map(|p| p.images.iter().cloned())
            .collect()
    }

    pub fn remove(&self, uid: &str) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(uid)
    }

    /// The pod `namespace/name` (if two share the name, one being replaced, the newest).
    pub fn find(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|p| p.namespace == namespace && p.name == name)
            .max_by_key(|p| p.sandbox.as_ref().map(|s| s.created_at))
            .cloned()
    }

    /// Every pod, sorted by namespace and name.
    pub fn snapshot(&self) -> Vec<PodInfo> {
        let mut pods: Vec<PodInfo> = self
            .0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }
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

#[derive(Clone)]
struct ApiState {
    node: Arc<str>,
    ctx: Arc<Ctx>,
    /// The API server's answers about callers of this API.
    access: Arc<access::AccessCache>,
}

fn router(state: ApiState) -> Router {
    let sources = Sources {
        node: state.node.clone(),
        pods: state.ctx.pods.clone(),
        accounting: state.ctx.accounting.clone(),
        proxy: state.ctx.proxy.clone(),
        network_policy: state.ctx.network_policy.clone(),
    };
    let bpf = bpf_router(sources.clone());
    let metrics = metrics_router(sources);
    Router::new()
        .route("/logs/{namespace}/{pod}/{container}", get(logs))
        .route("/stats/summary", get(stats_summary))
        .route("/exec/{namespace}/{pod}/{container}", post(exec))
        .route("/portforward/{namespace}/{pod}/{port}", post(port_forward))
        .route(skiff_client::node_api::FLOWS_PATH, get(flows))
        .with_state(state)
        .merge(bpf)
        .merge(metrics)
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such endpoint; the agent serves GET /logs/{namespace}/{pod}/{container}, \
                 POST /exec/{namespace}/{pod}/{container}, POST /portforward/{namespace}/{pod}/{port} \
                 (an HTTP upgrade), GET /stats/summary, GET /bpf/services, GET /bpf/backends, GET /bpf/pods, \
                 GET /bpf/conntrack, GET /flows and GET /metrics"
                    .into(),
            )
        })
}

/// `GET /bpf/services`, `/bpf/backends`, `/bpf/pods` and `/bpf/conntrack` (the shapes are in
/// [`super::proxy`]).
pub(crate) fn bpf_router(sources: Sources) -> Router {
    Router::new()
        .route("/bpf/services", get(bpf_services))
        .route("/bpf/backends", get(bpf_backends))
        .route("/bpf/pods", get(bpf_pods))
        .route("/bpf/conntrack", get(bpf_conntrack))
        .with_state(sources)
}

/// What the `/bpf/*` endpoints and `GET /metrics` read: the pods, the traffic accounting and
/// the Service load balancer (or why it is not running).
#[derive(Clone)]
pub(crate) struct Sources {
    pub node: Arc<str>,
    pub pods: PodRegistry,
    pub accounting: Option<Arc<Mutex<Accounting>>>,
    pub proxy: Result<Arc<super::proxy::Proxy>, String>,
    pub network_policy: Option<Arc<super::netpol::NetworkPolicies>>,
}

/// `GET /metrics` (the metrics are listed in the module documentation).
pub(crate) fn metrics_router(sources: Sources) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(sources)
}

async fn metrics_handler(State(src): State<Sources>) -> Response {
    // Reads maps: a blocking thread.
    let scrape = tokio::task::spawn_blocking(move || {
        let pods = src.pods.snapshot();
        let pods_running = pods.iter().filter(|p| p.sandbox.is_some()).count();
        let (lb, fast_path) = match &src.proxy {
            Ok(proxy) => (
                Some(proxy.services_report(&src.node)?),
                Some(proxy.fast_path_counters()?),
            ),
            Err(_) => (None, None),
        };
        let summary = summarize(&src.node, pods, src.accounting.as_deref());
        let policy = match &src.network_policy {
            Some(np) => Some(np.counters()?),
            None => None,
        };
        Ok::<_, skiff_datapath::BpfError>(metrics::Scrape {
            summary,
            pods_running,
            lb,
            fast_path,
            policy,
        })
    })
    .await;
    match scrape {
        Ok(Ok(s)) => (
            [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
            metrics::render(s),
        )
            .into_response(),
        Ok(Err(e)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading the Service load balancer's maps: {e}"),
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The API server's user when it calls agents (logs, exec, port-forward).
pub const API_SERVER_USER: &str = "system:kube-apiserver";
const MASTERS_GROUP: &str = "system:masters";
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The agent API's TLS: its self-signed serving certificate and the CA client certificates
/// must chain to.
#[derive(Clone)]
pub struct AgentTls {
    acceptor: tokio_rustls::TlsAcceptor,
    client_ca_pem: Arc<str>,
    /// `sha256:<hex>` of the serving certificate (published in the Node).
    pub cert_hash: String,
}

impl std::fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTls")
            .field("cert_hash", &self.cert_hash)
            .finish_non_exhaustive()
    }
}

impl AgentTls {
    /// The self-signed serving certificate of node `node` kept in `dir` (`agent-serving.crt`
    /// and `.key`, 0600), made anew when missing, unreadable or within 90 days of expiry, so
    /// the pin its Node publishes stays the same across restarts; clients must present
    /// certificates of `client_ca_pem`.
    pub fn load_or_create(
        dir: &Path,
        node: &str,
        client_ca_pem: &str,
    ) -> Result<AgentTls, skiff_pki::PkiError> {
        let (crt, key) = (dir.join("agent-serving.crt"), dir.join("agent-serving.key"));
        let current = match (std::fs::read_to_string(&crt), std::fs::read_to_string(&key)) {
            (Ok(cert_pem), Ok(key_pem)) => {
                skiff_pki::parse_pem(&cert_pem, "the agent's certificate")
                    .ok()
                    .filter(|info| {
                        info.common_name == format!("system:node:{node}")
                            && !info.expires_within(SystemTime::now(), skiff_pki::RENEW_BEFORE)
                    })
                    .map(|_| skiff_pki::Identity { cert_pem, key_pem })
            }
            _ => None,
        };
        let serving = match current {
            Some(id) => id,
            None => {
                let id = skiff_pki::self_signed(&skiff_pki::LeafSpec::server(
                    &format!("system:node:{node}"),
                    &["127.0.0.1".to_string(), "localhost".to_string()],
                ))?;
                std::fs::create_dir_all(dir).map_err(|source| skiff_pki::PkiError::Io {
                    action: "create",
                    path: dir.display().to_string(),
                    source,
                })?;
                skiff_pki::bootstrap::write_private(&key, id.key_pem.as_bytes())?;
                skiff_pki::bootstrap::write_private(&crt, id.cert_pem.as_bytes())?;
                id
            }
        };
        AgentTls::with(&serving, client_ca_pem)
    }

    fn with(
        serving: &skiff_pki::Identity,
        client_ca_pem: &str,
    ) -> Result<AgentTls, skiff_pki::PkiError> {
        let der = skiff_pki::pem_certificates(&serving.cert_pem, "the agent's certificate")?
            .into_iter()
            .next()
            .ok_or_else(|| skiff_pki::PkiError::Tls("no certificate made".into()))?;
        let mut config = skiff_pki::tls::server_config(serving, Some(client_ca_pem))?;
        // The agent serves HTTP/1.1 only (port-forward is an HTTP/1.1 upgrade).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(AgentTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            client_ca_pem: client_ca_pem.into(),
            cert_hash: skiff_pki::cert_hash(&der),
        })
    }
}

/// Who called, from the connection's client certificate: `(user, groups)`, or why not.
#[derive(Debug, Clone)]
struct Caller(Result<(String, Vec<String>), String>);

fn identify(
    ca_pem: &str,
    chain: Option<&[rustls_types::CertificateDer<'_>]>,
) -> Result<(String, Vec<String>), String> {
    let chain = chain
        .filter(|c| !c.is_empty())
        .ok_or("no client certificate")?;
    let (leaf, rest) = chain.split_first().ok_or("no client certificate")?;
    skiff_pki::tls::verify_chain_for(ca_pem, leaf, rest, skiff_pki::Usage::Client)?;
    let info = skiff_pki::parse(leaf, "the client certificate").map_err(|e| e.to_string())?;
    Ok((info.common_name, info.organizations))
}

/// 401 without a verified client certificate. The API server and `system:masters` pass;
/// anyone else passes when the API server's SubjectAccessReview allows `<verb>` on
/// `nodes/<subresource>` of this node ([`super::access`]), else gets the kubelet's 403. A
/// review that fails is the kubelet's 500. Plain-HTTP agents (no CA configured) have no
/// caller: allowed.
async fn authorize(
    State(st): State<ApiState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(Caller(caller)) = req.extensions().get::<Caller>().cloned() else {
        return next.run(req).await;
    };
    let (user, groups) = match caller {
        Err(reason) => {
            debug!(%reason, "agent API: authentication failed");
            return (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
        }
        Ok(who) => who,
    };
    if user == API_SERVER_USER || groups.iter().any(|g| g == MASTERS_GROUP) {
        return next.run(req).await;
    }
    let asked = access::Request {
        user,
        groups,
        verb: access::verb_of(req.method()),
        subresource: access::subresource_of(req.uri().path()),
    };
    // (The kubelet's wording of the request, made only for a refusal.)
    let attrs = || {
        format!(
            "user={}, verb={}, resource=nodes, subresource={}",
            asked.user, asked.verb, asked.subresource
        )
    };
    match st.access.allowed(&st.ctx.client, &st.node, &asked).await {
        Ok(true) => next.run(req).await,
        Ok(false) => (StatusCode::FORBIDDEN, format!("Forbidden ({})\n", attrs())).into_response(),
        Err(reason) => {
            warn!(%reason, user = %asked.user, "agent API: the access review failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Authorization error ({})\n", attrs()),
            )
                .into_response()
        }
    }
}

/// Serves the API on `listener` until the task is aborted: TLS with client certificates of
/// the cluster CA. Without `tls` (no cluster CA to check callers against) nothing is served:
/// there is no plain-HTTP API.
pub(crate) fn serve(
    listener: tokio::net::TcpListener,
    node: &str,
    ctx: Arc<Ctx>,
    tls: Option<AgentTls>,
) -> tokio::task::JoinHandle<()> {
    let state = ApiState {
        node: node.into(),
        ctx,
        access: Arc::new(access::AccessCache::default()),
    };
    let app = router(state.clone()).layer(axum::middleware::from_fn_with_state(state, authorize));
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

/// Longest an exec may run when the request names no timeout.
const EXEC_TIMEOUT: Duration = Duration::from_secs(300);

/// `POST /exec/{namespace}/{pod}/{container}`: runs the command in the container (its
/// namespaces and cgroup, as a probe's exec) to completion.
async fn exec(
    State(st): State<ApiState>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    body: Bytes,
) -> Response {
    use base64::Engine as _;
    let req: ExecRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("exec request: {e}")),
    };
    if req.command.is_empty() {
        return error(StatusCode::BAD_REQUEST, "exec: empty command".into());
    }
    let info = match find_container(&st, &namespace, &pod, &container) {
        Ok(info) => info,
        Err(resp) => return *resp,
    };
    let Some(sandbox) = info.sandbox else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("pod {namespace}/{pod} has no sandbox yet: it is not running"),
        );
    };
    let timeout = req
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(EXEC_TIMEOUT);
    // The command itself is not logged: it may carry secrets.
    debug!(pod = %format!("{namespace}/{pod}"), %container, "exec");
    match st
        .ctx
        .runtime
        .exec(&sandbox, &container, &req.command, timeout)
        .await
    {
        Ok(out) => {
            let b64 = base64::engine::general_purpose::STANDARD;
            let result = ExecResult {
                exit_code: out.exit_code,
                stdout: b64.encode(&out.stdout),
                stderr: b64.encode(&out.stderr),
            };
            match serde_json::to_vec(&result) {
                Ok(json) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    json,
                )
                    .into_response(),
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        Err(skiff_runtime::RuntimeError::InvalidSpec(m)) => error(StatusCode::BAD_REQUEST, m),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The pod `namespace/pod` of this node, if it has `container`; else the 404 to answer.
fn find_container(
    st: &ApiState,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Result<PodInfo, Box<Response>> {
    let Some(info) = st.ctx.pods.find(namespace, pod) else {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod} is not running on node {}", st.node),
        )));
    };
    if !info.containers.iter().any(|c| c == container) {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!(
                "pod {namespace}/{pod} has no container {container:?} (containers: {})",
                info.containers.join(", ")
            ),
        )));
    }
    Ok(info)
}

/// How long connecting to a pod's port may take.
const PORT_FORWARD_CONNECT: Duration = Duration::from_secs(5);

/// `POST /portforward/{namespace}/{pod}/{port}` with `Upgrade: skiff-portforward`: connects
/// to `localhost:<port>` inside the pod's network namespace (as the kubelet does), then
/// answers 101 and carries bytes both ways until either side closes. A port nothing listens
/// on is a 502 naming it, before the upgrade.
async fn port_forward(
    State(st): State<ApiState>,
    UrlPath((namespace, pod, port)): UrlPath<(String, String, u16)>,
    mut req: axum::extract::Request,
) -> Response {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !upgrade.eq_ignore_ascii_case(PORT_FORWARD_UPGRADE) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("port forwarding needs `Upgrade: {PORT_FORWARD_UPGRADE}`"),
        );
    }
    if port == 0 {
        return error(StatusCode::BAD_REQUEST, "port 0 is not a port".into());
    }
    let Some(info) = st.ctx.pods.find(&namespace, &pod) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod} is not running on node {}", st.node),
        );
    };
    let Some(sandbox) = info.sandbox else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("pod {namespace}/{pod} has no sandbox yet: it is not running"),
        );
    };
    let local = SocketAddr::from(([127, 0, 0, 1], port));
    let stream =
        match skiff_hostnet::connect_in(&sandbox.netns_path, local, PORT_FORWARD_CONNECT).await {
            Ok(s) => s,
            Err(e) => {
                let why = match &e {
                    skiff_hostnet::NetError::Netns { source, .. } => source.to_string(),
                    other => other.to_string(),
                };
                return error(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "failed to connect to localhost:{port} inside the network namespace of \
                         pod {namespace}/{pod}: {why}"
                    ),
                );
            }
        };
    let stream = match stream
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpStream::from_std(stream))
    {
        Ok(s) => s,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    debug!(pod = %format!("{namespace}/{pod}"), port, "port forward");
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                debug!(error = %e, "port forward upgrade");
                return;
            }
        };
        let mut client = hyper_util::rt::TokioIo::new(upgraded);
        let mut pod_side = stream;
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut pod_side).await {
            debug!(error = %e, "port forward ended");
        }
    });
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, "Upgrade"),
            (header::UPGRADE, PORT_FORWARD_UPGRADE),
        ],
    )
        .into_response()
}

fn error(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}

/// `GET /flows`: the node's flow records matching the query, as JSON lines; with
/// `follow=true` new ones follow until the client goes away.
async fn flows(State(st): State<ApiState>, RawQuery(raw): RawQuery) -> Response {
    let q = match skiff_client::node_api::FlowQuery::parse_query(raw.as_deref()) {
        Ok(q) => q,
        Err(msg) => return error(StatusCode::BAD_REQUEST, msg),
    };
    let Some(np) = st.ctx.network_policy.clone() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "NetworkPolicy enforcement (and with it flow records) does not run on this node".into(),
        );
    };
    let (kept, live) = np.flows.read(&q);
    let line = |r: &skiff_client::node_api::FlowRecord| {
        let mut b = serde_json::to_vec(r).unwrap_or_default();
        b.push(b'\n');
        Ok::<Bytes, std::io::Error>(Bytes::from(b))
    };
    let first = futures::stream::iter(kept.iter().map(line).collect::<Vec<_>>());
    let body: futures::stream::BoxStream<'static, Result<Bytes, std::io::Error>> = if q.follow {
        let later = futures::stream::unfold((live, q), move |(mut rx, q)| async move {
            loop {
                match rx.recv().await {
                    Ok(r) if q.matches(&r) => return Some((line(&r), (rx, q))),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        futures::StreamExt::boxed(futures::StreamExt::chain(first, later))
    } else {
        futures::StreamExt::boxed(first)
    };
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response()
}

async fn logs(
    State(st): State<ApiState>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = match LogOptions::parse_query(raw.as_deref()) {
        Ok(q) => q,
        Err(msg) => return error(StatusCode::BAD_REQUEST, msg),
    };
    let info = match find_container(&st, &namespace, &pod, &container) {
        Ok(info) => info,
        Err(resp) => return *resp,
    };
    let reader = LogReader::new(st.ctx.runtime.log_path(&info.uid, &container), q.timestamps);
    if !reader.exists() && !q.follow {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "container {container:?} in pod {namespace}/{pod} has not started yet: no logs"
            ),
        );
    }
    debug!(pod = %format!("{namespace}/{pod}"), %container, ?q, "serving logs");
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let pods = st.ctx.pods.clone();
    let what = format!("{namespace}/{pod}/{container}");
    tokio::task::spawn_blocking(move || {
        let why = stream_logs(reader, q, tx, pods, info.uid);
        debug!(container = %what, why, "log stream ended");
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(body),
    )
        .into_response()
}

/// Feeds the log to `tx`: what is there, then (following) what gets appended, until the
/// client goes away (the body, and with it the receiver, is dropped) or the pod is gone.
/// Returns why it stopped.
///
/// Runs on a blocking thread: it reads local files in 64 KiB chunks and hands each over
/// before reading the next, so a slow client slows the reading down.
fn stream_logs(
    mut reader: LogReader,
    q: LogOptions,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    pods: PodRegistry,
    uid: String,
) -> &'static str {
    let send = |chunk: Vec<u8>| tx.blocking_send(Ok(Bytes::from(chunk))).is_ok();
    let tail = q.tail.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if let Err(e) = reader.initial(tail, send) {
        let _ = tx.blocking_send(Err(e));
        return "read error";
    }
    if !q.follow {
        return "end of log";
    }
    loop {
        if tx.is_closed() {
            return "client gone";
        }
        if !pods.contains(&uid) {
            return "pod gone";
        }
        std::thread::sleep(FOLLOW_POLL);
        match reader.poll(send) {
            Ok(true) => {}
            Ok(false) => return "client gone",
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return "read error";
            }
        }
    }
}

async fn stats_summary(State(st): State<ApiState>) -> Response {
    let summary = summarize(
        &st.node,
        st.ctx.pods.snapshot(),
        st.ctx.accounting.as_deref(),
    );
    json(&summary)
}

fn json(value: &impl serde::Serialize) -> Response {
    match serde_json::to_vec_pretty(value) {
        Ok(body) => (
            [(header::CONTENT_TYPE, "application/json")],
            Body::from(body),
        )
            .into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Runs `report` on the Service load balancer (reading maps: a blocking thread), as JSON.
async fn lb_report<T: serde::Serialize + Send + 'static>(
    st: Sources,
    report: fn(&super::proxy::Proxy, &Sources) -> Result<T, skiff_datapath::BpfError>,
) -> Response {
    let proxy = match &st.proxy {
        Ok(p) => p.clone(),
        Err(why) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the Service load balancer is not running on node {}: {why}",
                    st.node
                ),
            );
        }
    };
    match tokio::task::spawn_blocking(move || report(&proxy, &st)).await {
        Ok(Ok(r)) => json(&r),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn bpf_services(State(st): State<Sources>) -> Response {
    lb_report(st, |p, s| p.services_report(&s.node)).await
}

async fn bpf_backends(State(st): State<Sources>) -> Response {
    lb_report(st, |p, s| p.backends_report(&s.node)).await
}

async fn bpf_pods(State(st): State<Sources>) -> Response {
    lb_report(st, pods_report).await
}

async fn bpf_conntrack(State(st): State<Sources>) -> Response {
    lb_report(st, |p, s| p.conntrack_report(&s.node)).await
}

/// `GET /bpf/pods`: the fast path's endpoints joined with the pods they were written for and
/// those pods' traffic (the `/stats/summary` numbers), plus the fast path's counters.
fn pods_report(
    proxy: &super::proxy::Proxy,
    src: &Sources,
) -> Result<BpfPods, skiff_datapath::BpfError> {
    let endpoints = proxy.pod_endpoints()?;
    let summary = summarize(&src.node, src.pods.snapshot(), src.accounting.as_deref());
    let pods = endpoints
        .into_iter()
        .map(|endpoint| {
            let stats = endpoint
                .uid
                .as_ref()
                .and_then(|uid| summary.pods.iter().find(|p| &p.uid == uid));
            BpfPod {
                namespace: stats.map(|p| p.namespace.clone()),
                name: stats.map(|p| p.name.clone()),
                network: stats.and_then(|p| p.network),
                ..endpoint
            }
        })
        .collect();
    Ok(BpfPods {
        node: src.node.to_string(),
        pods,
        fast_path: super::proxy::fast_path(proxy.fast_path_counters()?),
    })
}

pub use crate::usage::cpu_usage_usec;

/// The cgroup ids to account a pod's traffic to: those its worker saw, plus the leaf
/// cgroups of its containers that exist now (a container the agent never saw running).
fn pod_cgroup_ids(info: &PodInfo) -> BTreeSet<u64> {
    let mut ids = info.cgroup_ids.clone();
    if let Some(sb) = &info.sandbox {
        for c in &info.containers {
            let leaf: PathBuf = sb.cgroup_dir.join(c);
            if let Ok(id) = skiff_datapath::cgroup_id(&leaf) {
                ids.insert(id);
            }
        }
    }
    ids
}

/// `/stats/summary` of `pods` (also what `/metrics` reports of them).
fn summarize(
    node: &str,
    pods: Vec<PodInfo>,
    accounting: Option<&Mutex<Accounting>>,
) -> StatsSummary {
    let timestamp = chrono::DateTime::<chrono::Utc>::from(SystemTime::now())
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let pods = pods
        .into_iter()
        .map(|info| {
            let pod_usage = info
                .sandbox
                .as_ref()
                .map(|sb| crate::usage::cgroup(&sb.cgroup_dir))
                .unwrap_or_default();
            let containers = info
                .sandbox
                .as_ref()
                .map(|sb| {
                    info.containers
                        .iter()
                        .map(|c| ContainerStats {
                            name: c.clone(),
                            usage: crate::usage::cgroup(&sb.cgroup_dir.join(c)),
                        })
                        .collect()
                })
                .unwrap_or_default();
            let network = accounting.map(|acc| {
                let acc = acc.lock().unwrap_or_else(|e| e.into_inner());
                let mut n = NetworkStats::default();
                for id in pod_cgroup_ids(&info) {
                    match acc.counters(id) {
                        Ok((ingress, egress)) => {
                            n.rx_bytes += ingress.bytes;
                            n.rx_packets += ingress.packets;
                            n.tx_bytes += egress.bytes;
                            n.tx_packets += egress.packets;
                        }
                        Err(e) => warn!(cgroup_id = id, error = %e, "reading traffic counters"),
                    }
                }
                n
            });
            PodStats {
                namespace: info.namespace,
                name: info.name,
                uid: info.uid,
                cpu_usage_usec: pod_usage.cpu_usage_usec,
                network,
                memory_working_set_bytes: pod_usage.memory_working_set_bytes,
                containers,
            }
        })
        .collect();
    StatsSummary {
        node_name: node.to_string(),
        timestamp,
        pods,
        node: crate::usage::node(),
    }
}

/// Serving a router on loopback in tests.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serving_certificate_outlives_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let ca = skiff_pki::Ca::generate("ca").unwrap();
        let a = AgentTls::load_or_create(dir.path(), "n1", ca.cert_pem()).unwrap();
        let b = AgentTls::load_or_create(dir.path(), "n1", ca.cert_pem()).unwrap();
        assert_eq!(
            a.cert_hash, b.cert_hash,
            "a restart keeps the pinned certificate"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("agent-serving.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        // Another node's name (a reused state directory) gets a new one.
        let c = AgentTls::load_or_create(dir.path(), "n2", ca.cert_pem()).unwrap();
        assert_ne!(a.cert_hash, c.cert_hash);
        // So does a damaged file.
        std::fs::write(dir.path().join("agent-serving.crt"), "junk").unwrap();
        let d = AgentTls::load_or_create(dir.path(), "n2", ca.cert_pem()).unwrap();
        assert_ne!(c.cert_hash, d.cert_hash);
    }

    #[test]
    fn registry_keeps_cgroup_ids_and_finds_by_name() {
        let r = PodRegistry::default();
        let info = |ids: &[u64]| PodInfo {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "web".into(),
            containers: vec!["c".into()],
            cgroup_ids: ids.iter().copied().collect(),
            ..Default::default()
        };
        r.publish(info(&[1]));
        r.publish(info(&[2]));
        let found = r.find("default", "web").unwrap();
        assert_eq!(found.cgroup_ids, [1, 2].into());
        assert!(r.find("other", "web").is_none());
        assert!(r.contains("u1"));
        r.remove("u1");
        assert!(r.snapshot().is_empty());
    }

    #[test]
    fn cpu_stat_usage() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cpu.stat"),
            "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n",
        )
        .unwrap();
        assert_eq!(cpu_usage_usec(dir.path()), Some(1234));
        assert_eq!(cpu_usage_usec(&dir.path().join("absent")), None);
    }

    #[tokio::test]
    async fn metrics_over_http_without_lb_or_accounting() {
        let pods = PodRegistry::default();
        let sandbox = Sandbox {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "web-1".into(),
            hostname: "web-1".into(),
            cgroup_dir: "/nonexistent/skiff-test".into(),
            cgroup_id: 1,
            netns_path: PathBuf::new(),
            uts_path: PathBuf::new(),
            ipc_path: PathBuf::new(),
            pid_namespace: false,
            mount_namespace: false,
            limits: Default::default(),
            created_at: SystemTime::now(),
            pid_holder: None,
        };
        pods.publish(PodInfo {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "web-1".into(),
            sandbox: Some(sandbox),
            ..Default::default()
        });
        // Not started yet: no sandbox, not running.
        pods.publish(PodInfo {
            uid: "u2".into(),
            namespace: "default".into(),
            name: "web-2".into(),
            ..Default::default()
        });
        let app = metrics_router(Sources {
            node: "node-x".into(),
            pods,
            accounting: None,
            proxy: Err("disabled (--no-service-lb)".into()),
            network_policy: None,
        });
        let (status, head, body) = test_http::get(app, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        let content_type = head
            .lines()
            .find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            })
            .map(|(_, v)| v.trim().to_string())
            .expect("a content type");
        assert!(
            content_type.starts_with("application/openmetrics-text; version=1.0.0"),
            "{content_type}"
        );
        let lines: Vec<&str> = body.lines().collect();
        let version = env!("CARGO_PKG_VERSION");
        let info = format!("skiff_agent_info{{node=\"node-x\",version=\"{version}\"}} 1");
        for want in [
            info.as_str(),
            "# TYPE skiff_pods_running gauge",
            "skiff_pods_running 1",
            "# TYPE skiff_lb_up gauge",
            "skiff_lb_up 0",
        ] {
            assert!(lines.contains(&want), "no {want:?} in\n{body}");
        }
        assert!(
            !body.contains("skiff_lb_frontends") && !body.contains("skiff_pod_network"),
            "LB and traffic metrics are absent when they do not run:\n{body}"
        );
    }
}
