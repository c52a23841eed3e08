//! The API's routes: logs, exec, attach, port forwarding, flow records; the statistics, the data
//! path's maps and the metrics are in [`super::stats`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use skiff_client::node_api::{LogOptions, PORT_FORWARD_UPGRADE};
use tokio::sync::mpsc;
use tracing::debug;

use super::ApiCtx;
use super::pods::{PodInfo, PodRegistry};
use super::stats::{bpf_router, metrics_router, stats_summary};
use crate::access;
use crate::logs::LogReader;

/// How often a followed log file is checked for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

#[derive(Clone)]
pub(super) struct ApiState {
    pub node: Arc<str>,
    pub ctx: Arc<ApiCtx>,
    /// The API server's answers about callers of this API.
    pub access: Arc<access::AccessCache>,
}

pub(super) fn router(state: ApiState) -> Router {
    let sources = state.ctx.sources.clone();
    let bpf = bpf_router(sources.clone());
    let metrics = metrics_router(sources);
    Router::new()
        .route("/logs/{namespace}/{pod}/{container}", get(logs))
        .route("/stats/summary", get(stats_summary))
        .route(
            "/exec/{namespace}/{pod}/{container}",
            post(super::exec::exec),
        )
        .route(
            "/attach/{namespace}/{pod}/{container}",
            post(super::attach::attach),
        )
        .route("/portforward/{namespace}/{pod}/{port}", post(port_forward))
        .route(skiff_client::node_api::FLOWS_PATH, get(flows))
        .with_state(state)
        .merge(bpf)
        .merge(metrics)
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such endpoint; the agent serves GET /logs/{namespace}/{pod}/{container}, \
                 POST /exec/{namespace}/{pod}/{container}, POST /attach/{namespace}/{pod}/{container} \
                 and POST /portforward/{namespace}/{pod}/{port} \
                 (HTTP upgrades), GET /stats/summary, GET /bpf/services, GET /bpf/backends, GET /bpf/pods, \
                 GET /bpf/conntrack, GET /flows and GET /metrics"
                    .into(),
            )
        })
}

/// The pod `namespace/pod` of this node, if it has `container`; else the 404 to answer.
pub(super) fn find_container(
    st: &ApiState,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Result<PodInfo, Box<Response>> {
    let Some(info) = st.ctx.sources.pods.find(namespace, pod) else {
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
    let Some(info) = st.ctx.sources.pods.find(&namespace, &pod) else {
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

pub(super) fn error(status: StatusCode, message: String) -> Response {
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
    let Some(np) = st.ctx.sources.network_policy.clone() else {
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
    if q.previous {
        let path = st.ctx.runtime.previous_log_path(&info.uid, &container);
        let reader = LogReader::new(path, q.timestamps);
        if !reader.exists() {
            return error(
                StatusCode::BAD_REQUEST,
                format!("previous terminated container {container:?} in pod {pod:?} not found"),
            );
        }
        // A run that has ended: what it wrote, never followed.
        let q = LogOptions { follow: false, ..q };
        return serve_log(
            reader,
            q,
            &st,
            info.uid,
            format!("{namespace}/{pod}/{container}"),
        );
    }
    let reader = LogReader::new(st.ctx.runtime.log_path(&info.uid, &container), q.timestamps);
    if !reader.exists() && !q.follow {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "container {container:?} in pod {namespace}/{pod} has not started yet: no logs"
            ),
        );
    }
    serve_log(
        reader,
        q,
        &st,
        info.uid,
        format!("{namespace}/{pod}/{container}"),
    )
}

/// The log `reader` reads, as the response body (streamed from a blocking thread).
fn serve_log(
    reader: LogReader,
    q: LogOptions,
    st: &ApiState,
    uid: String,
    what: String,
) -> Response {
    debug!(container = %what, ?q, "serving logs");
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let pods = st.ctx.sources.pods.clone();
    tokio::task::spawn_blocking(move || {
        let why = stream_logs(reader, q, tx, pods, uid);
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
