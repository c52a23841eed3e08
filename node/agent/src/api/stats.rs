//! What the API reports from local state: `/stats/summary` (CPU time and eBPF-counted
//! traffic per pod), `/bpf/*` (the Service load balancer's and fast path's maps) and
//! `/metrics`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use skiff_client::node_api::{
    BpfPod, BpfPods, ContainerStats, NetworkStats, PodStats, StatsSummary,
};
use skiff_datapath::Accounting;
use tracing::warn;

use super::pods::{PodInfo, PodRegistry};
use super::routes::{ApiState, error};
use crate::metrics;

/// `GET /bpf/services`, `/bpf/backends`, `/bpf/pods` and `/bpf/conntrack` (the shapes are in
/// [`crate::proxy`]).
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
    pub proxy: Result<Arc<crate::proxy::Proxy>, String>,
    pub network_policy: Option<Arc<crate::netpol::NetworkPolicies>>,
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
        let (lb, fast_path, l2) = match &src.proxy {
            Ok(proxy) => {
                let now = skiff_datapath::lb::l2::monotonic_ns();
                let l2 = proxy
                    .l2_announcements()?
                    .into_iter()
                    .map(|(ip, a)| {
                        (
                            ip,
                            a.flags & skiff_datapath::lb::l2::L2_FLAG_ANNOUNCE != 0
                                && a.deadline_ns > now,
                        )
                    })
                    .collect();
                (
                    Some(proxy.services_report(&src.node)?),
                    Some(proxy.fast_path_counters()?),
                    Some(l2),
                )
            }
            Err(_) => (None, None, None),
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
            l2,
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

pub(super) async fn stats_summary(State(st): State<ApiState>) -> Response {
    let src = &st.ctx.sources;
    let summary = summarize(&st.node, src.pods.snapshot(), src.accounting.as_deref());
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
    report: fn(&crate::proxy::Proxy, &Sources) -> Result<T, skiff_datapath::BpfError>,
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
    proxy: &crate::proxy::Proxy,
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
        fast_path: crate::proxy::fast_path(proxy.fast_path_counters()?),
    })
}

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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::SystemTime;

    use skiff_runtime::Sandbox;

    use super::*;
    use crate::api::cpu_usage_usec;
    use crate::api::test_http;

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
