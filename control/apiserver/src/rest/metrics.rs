//! The resource metrics API (`metrics.k8s.io/v1beta1`, what metrics-server serves and
//! `kubectl top` reads): NodeMetrics and PodMetrics, computed when read from the node agents'
//! `/stats/summary` (cgroup CPU time and memory working set per pod and container, the
//! node's `/proc` totals), never stored. CPU usage is the rate between two samples of the
//! same agent at least a second apart (kept per node; the first request waits one second for
//! its second sample), memory the later sample's working set. Served for `get` and `list`
//! only (with label selectors), under the same authentication and authorization as every
//! resource (RBAC on `pods`/`nodes` of `metrics.k8s.io`).
//!
//! Its two kinds are added to discovery only (they are not registry kinds: their plurals are
//! the core ones); `view` reads them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skiff_api::api::{Node, Pod};
use skiff_api::rpc::ListRequest;
use skiff_api::{KindInfo, Resource as _};
use skiff_client::node_api::{AgentEndpoint, StatsSummary};

use super::path::ResourcePath;
use super::query::Query;
use crate::error::ApiError;

pub const GROUP: &str = "metrics.k8s.io";
pub static NODE_METRICS: KindInfo = KindInfo {
    api_version: "metrics.k8s.io/v1beta1",
    kind: "NodeMetrics",
    plural: "nodes",
    short_names: &[],
    namespaced: false,
    has_status: false,
};
pub static POD_METRICS: KindInfo = KindInfo {
    api_version: "metrics.k8s.io/v1beta1",
    kind: "PodMetrics",
    plural: "pods",
    short_names: &[],
    namespaced: true,
    has_status: false,
};
/// The verbs the metrics resources serve.
pub const VERBS: [&str; 2] = ["get", "list"];
/// The shortest window a rate is computed over.
const MIN_WINDOW: Duration = Duration::from_secs(1);
/// An older sample is not used as the start of a window.
const MAX_WINDOW: Duration = Duration::from_secs(60);
/// How long one agent may take to answer.
const AGENT_TIMEOUT: Duration = Duration::from_secs(5);

struct Sample {
    at: Instant,
    summary: StatsSummary,
}

/// What the metrics API reads: the registry (nodes, pods), the agents (their counters, with
/// the API server's client certificate) and the last samples.
pub(crate) struct Sources<'a> {
    pub registry: &'a crate::registry::Registry,
    pub agent_client: Option<&'a super::agent_client::AgentClient>,
    pub metrics: &'a Sampler,
}

/// The last two samples of every node.
#[derive(Default)]
pub(crate) struct Sampler {
    nodes: Mutex<HashMap<String, (Option<Sample>, Sample)>>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").finish_non_exhaustive()
    }
}

async fn fetch(rest: &Sources<'_>, node: &Node) -> Option<StatsSummary> {
    let access = rest
        .agent_client
        .map(super::agent_client::AgentClient::access)
        .unwrap_or_default();
    let ep = AgentEndpoint::of_node_as(node, &access).ok()?;
    match tokio::time::timeout(AGENT_TIMEOUT, ep.stats_summary()).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(node = node.name(), error = %e, "metrics: agent summary");
            None
        }
        Err(_) => None,
    }
}

impl Sampler {
    /// A window (earlier, later summary) for `node`, fetching as needed.
    async fn window(
        &self,
        rest: &Sources<'_>,
        node: &Node,
    ) -> Option<(StatsSummary, StatsSummary)> {
        let name = node.name().to_string();
        let (fresh, usable) = {
            let map = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&name) {
                Some((Some(prev), last)) if last.at.elapsed() < MIN_WINDOW => {
                    return Some((prev.summary.clone(), last.summary.clone()));
                }
                Some((_, last)) => (false, last.at.elapsed() < MAX_WINDOW),
                None => (true, false),
            }
        };
        let first = fetch(rest, node).await?;
        let (prev, last) = if fresh || !usable {
            tokio::time::sleep(MIN_WINDOW).await;
            let second = fetch(rest, node).await?;
            (
                Sample {
                    at: Instant::now() - MIN_WINDOW,
                    summary: first,
                },
                Sample {
                    at: Instant::now(),
                    summary: second,
                },
            )
        } else {
            let mut map = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
            let old = map.remove(&name)?.1;
            (
                old,
                Sample {
                    at: Instant::now(),
                    summary: first,
                },
            )
        };
        let out = (prev.summary.clone(), last.summary.clone());
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, (Some(prev), last));
        Some(out)
    }
}

/// Seconds between two summaries' timestamps.
fn seconds(a: &StatsSummary, b: &StatsSummary) -> f64 {
    let t = |s: &str| chrono::DateTime::parse_from_rfc3339(s).ok();
    match (t(&a.timestamp), t(&b.timestamp)) {
        (Some(a), Some(b)) => (b - a).num_microseconds().unwrap_or(0) as f64 / 1e6,
        _ => 0.0,
    }
}

/// CPU nanocores from two cumulative microsecond counters over `secs`.
fn nanocores(before: u64, after: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "0".into();
    }
    let n = (after.saturating_sub(before) as f64 * 1000.0 / secs).round() as u64;
    format!("{n}n")
}

fn memory(bytes: u64) -> String {
    format!("{}Ki", bytes / 1024)
}

fn usage(cpu: String, mem: u64) -> Value {
    json!({"cpu": cpu, "memory": memory(mem)})
}

async fn list_decoded<T: skiff_api::Resource>(
    rest: &Sources<'_>,
    namespace: &str,
    labels: &str,
) -> Result<Vec<T>, ApiError> {
    let listed = rest
        .registry
        .handler(T::INFO.plural)?
        .list(
            &ListRequest {
                resource: T::INFO.plural.into(),
                namespace: namespace.into(),
                label_selector: labels.into(),
                ..Default::default()
            },
            None,
        )
        .await?;
    listed
        .items
        .iter()
        .map(|b| T::decode(b.as_slice()))
        .collect::<Result<_, _>>()
        .map_err(|e| ApiError::Internal(format!("decoding {}: {e}", T::INFO.kind)))
}

fn meta_of<T: skiff_api::Resource>(o: &T, now: &str) -> Value {
    let m = o.metadata().cloned().unwrap_or_default();
    let mut meta = json!({"name": m.name, "creationTimestamp": now, "labels": m.labels});
    if !m.namespace.is_empty() {
        meta["namespace"] = m.namespace.into();
    }
    meta
}

/// `GET /apis/metrics.k8s.io/v1beta1/...`: NodeMetrics or PodMetrics, one or a list.
pub(crate) async fn serve(
    rest: &Sources<'_>,
    p: &ResourcePath,
    query: &Query,
) -> Result<Value, ApiError> {
    let labels = query.get("labelSelector").unwrap_or("");
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let nodes =
        list_decoded::<Node>(rest, "", if p.resource == "nodes" { labels } else { "" }).await?;
    let windows =
        futures::future::join_all(nodes.iter().map(|n| rest.metrics.window(rest, n))).await;
    let windows: Vec<(&Node, (StatsSummary, StatsSummary))> = nodes
        .iter()
        .zip(windows)
        .filter_map(|(n, w)| w.map(|w| (n, w)))
        .collect();
    let (items, info) = match p.resource.as_str() {
        "nodes" => {
            let items: Vec<Value> = windows
                .iter()
                .filter(|(n, _)| p.name.as_deref().is_none_or(|want| n.name() == want))
                .filter_map(|(n, (a, b))| {
                    let (ua, ub) = (a.node?, b.node?);
                    let secs = seconds(a, b);
                    Some(json!({
                        "metadata": meta_of(*n, &now),
                        "timestamp": b.timestamp,
                        "window": format!("{secs:.3}s"),
                        "usage": usage(nanocores(ua.cpu_usage_usec, ub.cpu_usage_usec, secs), ub.memory_working_set_bytes),
                    }))
                })
                .collect();
            (items, &NODE_METRICS)
        }
        "pods" => {
            let ns = p.namespace.clone().unwrap_or_default();
            let pods = list_decoded::<Pod>(rest, &ns, labels).await?;
            let items: Vec<Value> = pods
                .iter()
                .filter(|pod| p.name.as_deref().is_none_or(|want| pod.name() == want))
                .filter_map(|pod| {
                    let uid = pod.metadata.as_ref().map(|m| m.uid.as_str())?;
                    let (a, b) = windows.iter().find_map(|(_, (a, b))| {
                        let pa = a.pods.iter().find(|s| s.uid == uid)?;
                        let pb = b.pods.iter().find(|s| s.uid == uid)?;
                        Some(((a, pa), (b, pb)))
                    })?;
                    let secs = seconds(a.0, b.0);
                    let containers: Vec<Value> = b
                        .1
                        .containers
                        .iter()
                        .map(|cb| {
                            let before =
                                a.1.containers
                                    .iter()
                                    .find(|ca| ca.name == cb.name)
                                    .map_or(cb.usage.cpu_usage_usec, |ca| ca.usage.cpu_usage_usec);
                            json!({
                                "name": cb.name,
                                "usage": usage(
                                    nanocores(before, cb.usage.cpu_usage_usec, secs),
                                    cb.usage.memory_working_set_bytes,
                                ),
                            })
                        })
                        .collect();
                    Some(json!({
                        "metadata": meta_of(pod, &now),
                        "timestamp": b.0.timestamp,
                        "window": format!("{secs:.3}s"),
                        "containers": containers,
                    }))
                })
                .collect();
            (items, &POD_METRICS)
        }
        other => return Err(ApiError::UnknownResource(format!("{other}.{GROUP}"))),
    };
    let kind = info.kind;
    match &p.name {
        Some(name) => {
            let mut item = items.into_iter().next().ok_or_else(|| ApiError::NotFound {
                resource: format!("{}.{GROUP}", kind.to_ascii_lowercase()),
                name: name.clone(),
            })?;
            item["kind"] = kind.into();
            item["apiVersion"] = info.api_version.into();
            Ok(item)
        }
        None => Ok(json!({
            "kind": format!("{kind}List"),
            "apiVersion": info.api_version,
            "metadata": {},
            "items": items.into_iter().map(|mut i| {
                i["kind"] = kind.into();
                i["apiVersion"] = info.api_version.into();
                i
            }).collect::<Vec<_>>(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_quantities() {
        assert_eq!(nanocores(1_000, 251_000, 1.0), "250000000n");
        assert_eq!(nanocores(1_000, 501_000, 2.0), "250000000n");
        assert_eq!(nanocores(5, 1, 1.0), "0n", "a reset counts as idle");
        assert_eq!(memory(10 * 1024 * 1024), "10240Ki");
        let a = StatsSummary {
            timestamp: "2026-11-26T10:00:00.000000Z".into(),
            ..Default::default()
        };
        let b = StatsSummary {
            timestamp: "2026-11-26T10:00:01.500000Z".into(),
            ..Default::default()
        };
        assert!((seconds(&a, &b) - 1.5).abs() < 1e-9);
    }
}
