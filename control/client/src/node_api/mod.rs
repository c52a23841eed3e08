//! The node agent's HTTP API: container logs, resource stats, exec, port forwarding, the
//! data path's maps and flow records.
//!
//! Every node agent (`skiff-node run`) serves, on loopback by default:
//!
//! - `GET /logs/{namespace}/{pod}/{container}?tail=N&follow=true&timestamps=true`: the
//!   container's output, one line per line it printed (`timestamps=true` prefixes each with
//!   its RFC 3339 time); `follow=true` keeps streaming new lines until the client goes away.
//! - `GET /stats/summary`: a [`StatsSummary`] as JSON.
//! - `POST /exec/{namespace}/{pod}/{container}` with `Upgrade: skiff-exec`: an
//!   [`ExecRequest`] starts a command in the container (stdin and a terminal when asked);
//!   after 101 the connection carries its channels ([`exec`]; [`AgentEndpoint::exec`]).
//!   The API server's `pods/exec` uses it.
//! - `POST /attach/{namespace}/{pod}/{container}`, the same upgrade: an [`AttachRequest`]
//!   attaches to the container's main process, the same frames ([`AgentEndpoint::attach`]);
//!   the API server's `pods/attach` uses it.
//! - `GET /bpf/services`, `GET /bpf/backends`: the node's Service load balancer maps
//!   ([`BpfServices`], [`BpfBackends`]), with per-backend connection counters;
//!   `GET /bpf/pods`: the pod fast path's endpoints and counters ([`BpfPods`]);
//!   `GET /bpf/conntrack`: the NodePort conntrack map ([`BpfConntrack`]). All through
//!   [`AgentEndpoint::bpf`].
//! - `POST /portforward/{namespace}/{pod}/{port}` with `Upgrade: skiff-portforward`: a byte
//!   tunnel to `localhost:<port>` inside the pod's network namespace
//!   ([`AgentEndpoint::port_forward`]; a refused port is a 502 before the upgrade).
//! - `GET /flows`: the node's flow records as JSON lines ([`FlowQuery`] filters;
//!   `follow=true` streams), what `skiff observe` merges.
//! - `GET /metrics`: the same numbers for Prometheus (OpenMetrics text format;
//!   scraped, not read by this client).
//!
//! The agent publishes the port in its Node's `status.daemonEndpoints.kubeletEndpoint.Port`
//! (as the kubelet does). Cluster state still comes only from the API server: a pod's agent
//! is found through the pod's `spec.nodeName` and that Node's status ([`AgentEndpoint`]).
//!
//! Which address is dialled: the Node's first address of the caller's preferred types
//! ([`AgentAccess::preferred_address_types`], the API server's
//! `--kubelet-preferred-address-types`; default [`DEFAULT_PREFERRED_ADDRESS_TYPES`]) whose
//! value is an IP address. The agent serves there a certificate of the cluster CA for the
//! node's addresses, which the caller verifies against the CA and the dialled address (no
//! pin, no plain-HTTP fallback: a node that could make the API server speak plain HTTP would
//! get the API server's requests, and their credentials, unauthenticated), and it requires a
//! client certificate of the cluster CA ([`AgentAccess::identity`]).
//! A Node without such an address is not spoken to at all; nothing a Node publishes makes
//! a caller dial loopback or trust a certificate outside the CA.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use skiff_api::Resource;
use skiff_api::api::{Node, Pod};
use tokio::net::TcpStream;

use crate::{Client, ClientError};

pub mod exec;

/// Path prefix of the logs endpoint.
pub const LOGS_PATH: &str = "/logs";
/// Path prefix of the exec endpoint.
pub const EXEC_PATH: &str = "/exec";
/// Path prefix of the attach endpoint (`POST /attach/{namespace}/{pod}/{container}`, the
/// exec upgrade and frames).
pub const ATTACH_PATH: &str = "/attach";
/// Path prefix of the port-forward endpoint (`POST /portforward/{namespace}/{pod}/{port}`).
pub const PORT_FORWARD_PATH: &str = "/portforward";
/// The `Upgrade` protocol of a port-forward request: after 101, the connection is a raw TCP
/// tunnel to the pod's port.
pub const PORT_FORWARD_UPGRADE: &str = "skiff-portforward";
/// The `Upgrade` protocol of an exec request: after 101, the connection carries the
/// session's channel frames ([`exec`]).
pub const EXEC_UPGRADE: &str = "skiff-exec";
/// Largest exec request body the agent reads.
pub const MAX_EXEC_REQUEST: usize = 1 << 20;

/// `POST /exec/{namespace}/{pod}/{container}`: what to run, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecRequest {
    /// The argv; the first word is looked up in the container's PATH.
    pub command: Vec<String>,
    /// Connect the command's standard input (else it reads `/dev/null`).
    #[serde(default)]
    pub stdin: bool,
    /// Run it on a pseudo-terminal (stdout and stderr are then one stream).
    #[serde(default)]
    pub tty: bool,
}

/// `POST /attach/{namespace}/{pod}/{container}`: whether the caller writes the container's
/// stdin (the terminal is the container's own `tty`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachRequest {
    #[serde(default)]
    pub stdin: bool,
}

/// Path of the stats endpoint.
pub const STATS_SUMMARY_PATH: &str = "/stats/summary";
/// Paths of the load balancer map dumps.
pub const BPF_SERVICES_PATH: &str = "/bpf/services";
pub const BPF_BACKENDS_PATH: &str = "/bpf/backends";
pub const BPF_PODS_PATH: &str = "/bpf/pods";
pub const BPF_CONNTRACK_PATH: &str = "/bpf/conntrack";
/// `GET /flows`: the node's flow records as JSON lines ([`FlowRecord`], [`FlowQuery`]).
pub const FLOWS_PATH: &str = "/flows";

/// A dump of one of the agent's eBPF maps and where it is served.
pub trait BpfDump: serde::de::DeserializeOwned + Serialize {
    const PATH: &'static str;
}

impl BpfDump for BpfServices {
    const PATH: &'static str = BPF_SERVICES_PATH;
}

impl BpfDump for BpfBackends {
    const PATH: &'static str = BPF_BACKENDS_PATH;
}

impl BpfDump for BpfPods {
    const PATH: &'static str = BPF_PODS_PATH;
}

impl BpfDump for BpfConntrack {
    const PATH: &'static str = BPF_CONNTRACK_PATH;
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest error body read from the agent.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Largest stats summary accepted.
const MAX_SUMMARY: usize = 64 * 1024 * 1024;

// The types below are the agent's HTTP API: the agent serializes exactly these, and clients
// (the CLI, tests) read them. One definition for both sides.

/// `GET /bpf/services`: the frontends programmed in a node's socket load balancer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfServices {
    pub node: String,
    #[serde(default)]
    pub services: Vec<BpfService>,
    /// How full each map is.
    #[serde(default)]
    pub maps: Vec<BpfMapPressure>,
    /// Programming statistics: writes and the latency from a change seen to maps written.
    #[serde(default)]
    pub programming: BpfProgramming,
}

/// One frontend (clusterIP:port/protocol, or nodeIP:nodePort) and its backends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfService {
    pub id: u32,
    /// `ip:port/PROTOCOL`.
    pub frontend: String,
    #[serde(default)]
    pub ip: String,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub protocol: String,
    /// The in-cluster view of an externalTrafficPolicy `Local` frontend (every ready
    /// backend, for connections made on the node); the frontend string ends in
    /// ` (in-cluster)`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_cluster: bool,
    /// `None` or `ClientIP`.
    #[serde(default)]
    pub session_affinity: String,
    #[serde(default)]
    pub affinity_timeout_seconds: Option<u32>,
    /// `namespace/name` of the Service (none for a frontend about to be removed).
    #[serde(default)]
    pub service: Option<String>,
    #[serde(default)]
    pub port_name: Option<String>,
    #[serde(default)]
    pub backends: Vec<BpfBackend>,
    /// connect() calls translated to a backend (TCP, connected UDP), summed over backends.
    #[serde(default)]
    pub connects: u64,
    /// Unconnected UDP datagrams translated, summed over backends.
    #[serde(default)]
    pub sends: u64,
}

/// One backend: in a [`BpfService`] (where the frontend fields are left out, being the
/// service's), or in the flat [`BpfBackends`] list (with them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfBackend {
    pub id: u32,
    #[serde(default)]
    pub slot: u32,
    #[serde(default)]
    pub ip: String,
    #[serde(default)]
    pub port: u16,
    /// `ip:port` (`[ip]:port` for IPv6).
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontend: Option<String>,
    /// `namespace/name` of the Service (absent for a frontend no Service owns, only until it
    /// is removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_name: Option<String>,
    #[serde(default)]
    pub connects: u64,
    #[serde(default)]
    pub sends: u64,
}

/// How full one map is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfMapPressure {
    pub map: String,
    pub entries: u64,
    pub max_entries: u64,
}

/// Map writes since the agent started and how long programming took.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfProgramming {
    pub writes: u64,
    /// From a Service or Endpoints change seen by the agent to its maps written.
    pub latency_micros: LatencyHistogram,
}

/// A histogram with cumulative buckets, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LatencyHistogram {
    pub count: u64,
    /// Sum of the observations, in microseconds.
    pub sum: u64,
    pub buckets: Vec<HistogramBucket>,
}

/// One cumulative bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistogramBucket {
    /// Upper bound in microseconds; `None` is +Inf.
    pub le: Option<u64>,
    /// Observations at or below `le`.
    pub count: u64,
}

/// `GET /bpf/backends`: every backend of a node's socket load balancer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfBackends {
    pub node: String,
    #[serde(default)]
    pub backends: Vec<BpfBackend>,
}

/// `GET /bpf/pods`: the local pods of a node's fast path and its counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfPods {
    pub node: String,
    #[serde(default)]
    pub pods: Vec<BpfPod>,
    #[serde(default)]
    pub fast_path: BpfFastPath,
}

/// One endpoint of the fast path, with the pod's traffic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfPod {
    pub ip: String,
    /// The pod's host veth, in the node namespace.
    #[serde(default)]
    pub ifindex: u32,
    #[serde(default)]
    pub pod_mac: String,
    #[serde(default)]
    pub host_mac: String,
    /// The pod it was written for (`None`: an entry this agent has not (re)written).
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// `None` without the agent's traffic accounting.
    #[serde(default)]
    pub network: Option<NetworkStats>,
}

/// The fast path's packet counters (summed over CPUs, since the maps were created).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfFastPath {
    /// Delivered into a local pod with `bpf_redirect_peer`.
    pub redirect_peer: u64,
    /// Forwarded from a pod to the FIB's next hop with `bpf_redirect_neigh`.
    pub redirect_neigh: u64,
    /// From a pod, handed to the node's stack unchanged (for the node, no route, broadcast,
    /// ...).
    pub pass: u64,
    /// From a pod, FIB lookup failed (unreachable, fragmentation needed, ...), handed to the
    /// node's stack.
    pub fib_fail: u64,
}

/// `GET /bpf/conntrack`: a node's NodePort translations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfConntrack {
    pub node: String,
    #[serde(default)]
    pub entries: Vec<BpfConntrackEntry>,
}

/// One direction of a NodePort flow: packets matching `packet` become `rewritten`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpfConntrackEntry {
    /// `forward` (client → node) or `reply` (backend → node).
    pub direction: String,
    pub protocol: String,
    /// `src:port -> dst:port`.
    pub packet: String,
    pub rewritten: String,
    #[serde(default)]
    pub backend_id: u32,
    #[serde(default)]
    pub service_id: u32,
}

/// `GET /stats/summary`: what a node's pods use, at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSummary {
    pub node_name: String,
    /// When the numbers were read (RFC 3339, microseconds, UTC).
    pub timestamp: String,
    pub pods: Vec<PodStats>,
    /// The node as a whole (`/proc/stat`, `/proc/meminfo`); absent from older agents.
    #[serde(default)]
    pub node: Option<Usage>,
}

/// Cumulative CPU time and the current memory working set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub cpu_usage_usec: u64,
    pub memory_working_set_bytes: u64,
}

/// One container's usage (its leaf cgroup).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerStats {
    pub name: String,
    #[serde(flatten)]
    pub usage: Usage,
}

/// One pod's cumulative usage since its containers' cgroups were created.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodStats {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// CPU time of every process of the pod (`usage_usec` of the pod cgroup's `cpu.stat`).
    pub cpu_usage_usec: u64,
    /// Traffic of the pod's sockets; `None` when the node has no eBPF accounting.
    pub network: Option<NetworkStats>,
    /// The pod's memory working set: the cgroup's `memory.current` less inactive file pages
    /// where the node has the memory controller, else the resident memory of its processes.
    #[serde(default)]
    pub memory_working_set_bytes: u64,
    /// Per container (absent from older agents).
    #[serde(default)]
    pub containers: Vec<ContainerStats>,
}

/// IP-level traffic (bytes from the IP header on) of a pod's sockets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkStats {
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
}

/// One end of a flow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlowEndpoint {
    pub ip: String,
    pub port: u16,
    /// The pod at `ip`, when it is one; otherwise empty, with `identity` saying what it is
    /// (`host`: the node itself, `world`: outside the cluster).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
}

impl FlowEndpoint {
    /// `namespace/pod`, or the address with what it is.
    pub fn name(&self) -> String {
        if self.pod.is_empty() {
            if self.identity.is_empty() {
                self.ip.clone()
            } else {
                format!("{} ({})", self.ip, self.identity)
            }
        } else {
            format!("{}/{}", self.namespace, self.pod)
        }
    }
}

/// A flow a pod started or accepted (its first packet), or a packet NetworkPolicy dropped,
/// as the node's eBPF policy programs saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlowRecord {
    /// RFC 3339 with microseconds.
    pub time: String,
    pub node: String,
    /// `ingress` (to a pod of the node) or `egress` (from one).
    pub direction: String,
    /// `allowed` or `denied`.
    pub verdict: String,
    /// Why: `allowed-by-rule`, `allowed-unisolated` (no policy isolates the pod that way),
    /// `denied` (isolated, no rule allows it).
    pub reason: String,
    /// `TCP`, `UDP`, `SCTP`, `ICMP` or the protocol number.
    pub protocol: String,
    pub source: FlowEndpoint,
    pub destination: FlowEndpoint,
    /// `namespace/name:port` of the Service a socket-balanced flow was sent to (the pod
    /// dialled its ClusterIP), from the load balancer's record of that socket.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// `namespace/name` of the policy that allowed the flow or, for a drop, that isolates
    /// the pod.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub policy: String,
    /// Bytes of the packet recorded.
    pub bytes: u64,
}

/// Which flow records to return: every given filter must match (namespace and pod: either
/// end; service: the Service's `namespace/name`; verdict: `allowed` or `denied`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowQuery {
    pub follow: bool,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub service: Option<String>,
    pub verdict: Option<String>,
}

impl FlowQuery {
    /// Whether `r` passes every filter. A pod filter `ns/name` names one pod; a bare name
    /// matches that pod name in any namespace.
    pub fn matches(&self, r: &FlowRecord) -> bool {
        let ends = [&r.source, &r.destination];
        self.namespace
            .as_ref()
            .is_none_or(|ns| ends.iter().any(|e| &e.namespace == ns))
            && self.pod.as_ref().is_none_or(|p| {
                ends.iter().any(|e| match p.split_once('/') {
                    Some((ns, name)) => e.namespace == ns && e.pod == name,
                    None => &e.pod == p,
                })
            })
            && self.service.as_ref().is_none_or(|s| {
                r.service == *s || r.service.split_once(':').is_some_and(|(svc, _)| svc == s)
            })
            && self.verdict.as_ref().is_none_or(|v| &r.verdict == v)
    }

    /// The query string (`""` or `?…`).
    pub fn query(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if self.follow {
            q.append_pair("follow", "true");
        }
        for (k, v) in [
            ("namespace", &self.namespace),
            ("pod", &self.pod),
            ("service", &self.service),
            ("verdict", &self.verdict),
        ] {
            if let Some(v) = v {
                q.append_pair(k, v);
            }
        }
        let q = q.finish();
        if q.is_empty() { q } else { format!("?{q}") }
    }

    /// The agent's side of [`FlowQuery::query`].
    pub fn parse_query(raw: Option<&str>) -> Result<FlowQuery, String> {
        let mut q = FlowQuery::default();
        for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            match k.as_ref() {
                "follow" => {
                    q.follow = match v.as_ref() {
                        "" | "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(format!("follow={v}: expected true or false")),
                    }
                }
                "namespace" => q.namespace = Some(v.into_owned()),
                "pod" => q.pod = Some(v.into_owned()),
                "service" => q.service = Some(v.into_owned()),
                "verdict" => match v.as_ref() {
                    "allowed" | "denied" => q.verdict = Some(v.into_owned()),
                    _ => return Err(format!("verdict={v}: expected allowed or denied")),
                },
                other => {
                    return Err(format!(
                        "unknown parameter {other:?} (follow, namespace, pod, service, verdict)"
                    ));
                }
            }
        }
        Ok(q)
    }
}

/// What to fetch from a container's log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Only the last N lines (across rotated files).
    pub tail: Option<u64>,
    /// Keep streaming lines as they are written.
    pub follow: bool,
    /// Prefix each line with the RFC 3339 time it was written.
    pub timestamps: bool,
    /// The container's previous run (the one before its last restart) instead.
    pub previous: bool,
}

impl LogOptions {
    /// Parses the query string of the logs endpoint (`tail=N&follow=true&timestamps=true`);
    /// the agent's side of [`LogOptions::query`]. `tail=-1` means everything, as kubectl's
    /// `--tail=-1`.
    pub fn parse_query(raw: Option<&str>) -> Result<LogOptions, String> {
        fn flag(key: &str, v: &str) -> Result<bool, String> {
            match v {
                "" | "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(format!("{key}={v}: expected true or false")),
            }
        }
        let mut q = LogOptions::default();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "tail" => {
                    let n: i64 = v
                        .parse()
                        .map_err(|_| format!("tail={v}: expected a number of lines"))?;
                    q.tail = u64::try_from(n).ok();
                }
                "follow" => q.follow = flag(k, v)?,
                "timestamps" => q.timestamps = flag(k, v)?,
                "previous" => q.previous = flag(k, v)?,
                other => {
                    return Err(format!(
                        "unknown parameter {other:?} (tail, follow, timestamps, previous)"
                    ));
                }
            }
        }
        Ok(q)
    }

    /// The query string for these options (`""` or `?…`).
    pub fn query(&self) -> String {
        let mut q = Vec::new();
        if let Some(n) = self.tail {
            q.push(format!("tail={n}"));
        }
        if self.follow {
            q.push("follow=true".into());
        }
        if self.timestamps {
            q.push("timestamps=true".into());
        }
        if self.previous {
            q.push("previous=true".into());
        }
        if q.is_empty() {
            String::new()
        } else {
            format!("?{}", q.join("&"))
        }
    }
}

/// Why a call to a node agent failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeApiError {
    /// Looking up the pod or node in the API server failed.
    #[error(transparent)]
    Api(#[from] ClientError),
    /// The pod has no `spec.nodeName`.
    #[error("pod {pod} is not running on a node yet")]
    NotScheduled { pod: String },
    /// The node's status has no agent port.
    #[error(
        "node {node} publishes no agent endpoint (status.daemonEndpoints.kubeletEndpoint.Port): \
         its agent has not registered yet or is too old"
    )]
    NoEndpoint { node: String },
    /// Nothing answers at the agent's address.
    #[error("cannot reach the node agent of {node} at {addr}: {reason} (is skiff-node running?)")]
    Unreachable {
        node: String,
        addr: SocketAddr,
        reason: String,
    },
    /// The agent answered with an error status; `message` is its explanation.
    #[error("node agent of {node}: {message}")]
    Status {
        node: String,
        status: u16,
        message: String,
    },
    /// The connection broke or the agent sent something unreadable.
    #[error("node agent of {node}: {reason}")]
    Protocol { node: String, reason: String },
}

impl NodeApiError {
    /// The agent answered 404 (no such pod or container on that node).
    pub fn is_not_found(&self) -> bool {
        matches!(self, NodeApiError::Status { status: 404, .. })
    }
}

/// Where a node's agent serves its HTTP API, and how to speak TLS to it.
#[derive(Clone)]
pub struct AgentEndpoint {
    pub node: String,
    pub addr: SocketAddr,
    /// Trusts only the agent's published certificate; presents the caller's client
    /// certificate. `None`: plain HTTP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for AgentEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentEndpoint")
            .field("node", &self.node)
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Anything a request can be sent over: a TCP stream or TLS on one.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Percent-encodes one path segment (names are DNS labels; this only guards odd input).
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The Node address types dialled, in order, when the caller names none (kubeadm's
/// `--kubelet-preferred-address-types`).
pub const DEFAULT_PREFERRED_ADDRESS_TYPES: &[&str] = &["InternalIP", "ExternalIP", "Hostname"];

/// How a caller speaks to node agents.
#[derive(Clone, Copy, Default)]
pub struct AgentAccess<'a> {
    /// The cluster CA, which signs the agents' serving certificates.
    pub ca_pem: Option<&'a str>,
    /// The client certificate presented (one of the cluster CA).
    pub identity: Option<&'a skiff_pki::Identity>,
    /// Node address types in the order they are tried (`None`:
    /// [`DEFAULT_PREFERRED_ADDRESS_TYPES`]).
    pub preferred_address_types: Option<&'a [String]>,
}

impl std::fmt::Debug for AgentAccess<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentAccess")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some())
            .field("preferred_address_types", &self.preferred_address_types)
            .finish()
    }
}

impl<'a> AgentAccess<'a> {
    /// What `client` connects with: its CA and client certificate.
    pub fn of_client(client: &'a Client) -> AgentAccess<'a> {
        AgentAccess {
            ca_pem: client.ca_pem(),
            identity: client.identity(),
            preferred_address_types: None,
        }
    }

    /// The node's address to dial: the first of the preferred types that is an IP address.
    fn address_of(&self, node: &Node) -> Option<std::net::IpAddr> {
        let addresses = node.status.as_ref().map(|s| s.addresses.as_slice())?;
        let pick = |ty: &str| {
            addresses
                .iter()
                .filter(|a| a.r#type == ty)
                .find_map(|a| a.address.parse().ok())
        };
        match self.preferred_address_types {
            Some(types) => types.iter().find_map(|t| pick(t)),
            None => DEFAULT_PREFERRED_ADDRESS_TYPES.iter().find_map(|t| pick(t)),
        }
    }
}

impl AgentEndpoint {
    /// The endpoint a Node publishes, spoken to as `access` says (see the module docs).
    pub fn of_node_as(
        node: &Node,
        access: &AgentAccess<'_>,
    ) -> Result<AgentEndpoint, NodeApiError> {
        let name = node.name().to_string();
        let port = node
            .status
            .as_ref()
            .and_then(|s| s.daemon_endpoints.as_ref())
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .map(|e| e.port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
            .ok_or_else(|| NodeApiError::NoEndpoint { node: name.clone() })?;
        let tls_err = |e: skiff_pki::PkiError| NodeApiError::Protocol {
            node: name.clone(),
            reason: format!("TLS configuration: {e}"),
        };
        let (addr, config) = {
            let ip = access
                .address_of(node)
                .ok_or_else(|| NodeApiError::Protocol {
                    node: name.clone(),
                    reason: format!(
                        "the Node publishes no IP address of the types {} to reach its agent at",
                        access
                            .preferred_address_types
                            .map(|t| t.join(", "))
                            .unwrap_or_else(|| DEFAULT_PREFERRED_ADDRESS_TYPES.join(", "))
                    ),
                })?;
            let ca = access.ca_pem.ok_or_else(|| NodeApiError::Protocol {
                node: name.clone(),
                reason: "no cluster CA to verify the agent's serving certificate against; its \
                         agent is not spoken to without one"
                    .into(),
            })?;
            let config = skiff_pki::tls::client_config(ca, access.identity).map_err(tls_err)?;
            (SocketAddr::new(ip, port), config)
        };
        Ok(AgentEndpoint {
            node: name,
            addr,
            tls: Some(Arc::new(config)),
        })
    }

    /// The agent of node `node`, from its Node object, spoken to with the client
    /// certificate `client` connects with.
    pub async fn for_node(client: &Client, node: &str) -> Result<AgentEndpoint, NodeApiError> {
        let node = client.cluster::<Node>().get(node).await?;
        AgentEndpoint::of_node_as(&node, &AgentAccess::of_client(client))
    }

    /// The agent of the node `pod` is bound to.
    pub async fn for_pod(client: &Client, pod: &Pod) -> Result<AgentEndpoint, NodeApiError> {
        let node = pod
            .spec
            .as_ref()
            .map(|s| s.node_name.as_str())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| NodeApiError::NotScheduled {
                pod: pod.name().to_string(),
            })?;
        AgentEndpoint::for_node(client, node).await
    }

    /// `GET /stats/summary`.
    pub async fn stats_summary(&self) -> Result<StatsSummary, NodeApiError> {
        self.get_json(STATS_SUMMARY_PATH).await
    }

    /// `GET` of the eBPF map dump `T` (`/bpf/services`, `/bpf/pods`, ...).
    pub async fn bpf<T: BpfDump>(&self) -> Result<T, NodeApiError> {
        self.get_json(T::PATH).await
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T, NodeApiError> {
        let resp = self.get(path).await?;
        let body = self.read_body(resp, MAX_SUMMARY).await?;
        serde_json::from_slice(&body).map_err(|e| self.protocol(format!("{path}: {e}")))
    }

    /// `GET /logs/{namespace}/{pod}/{container}`: the log as a stream of chunks (whole lines,
    /// each ending in `\n`, possibly several per chunk). With `follow` the stream ends only
    /// when the agent ends it (pod deleted) or it is dropped.
    pub async fn logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        opts: &LogOptions,
    ) -> Result<BoxStream<'static, Result<Bytes, NodeApiError>>, NodeApiError> {
        let path = format!(
            "{LOGS_PATH}/{}/{}/{}{}",
            segment(namespace),
            segment(pod),
            segment(container),
            opts.query()
        );
        let resp = self.get(&path).await?;
        Ok(self.body_stream(resp, "the log stream"))
    }

    /// A response body as a stream of chunks; errors name `what` was being read.
    fn body_stream(
        &self,
        resp: Response<Incoming>,
        what: &'static str,
    ) -> BoxStream<'static, Result<Bytes, NodeApiError>> {
        let node = self.node.clone();
        resp.into_body()
            .into_data_stream()
            .map(move |r| {
                r.map_err(|e| NodeApiError::Protocol {
                    node: node.clone(),
                    reason: format!("reading {what}: {e}"),
                })
            })
            .boxed()
    }

    /// `GET /flows`: the node's flow records matching `q`, as chunks of JSON lines (one
    /// [`FlowRecord`] each); with `q.follow` the stream goes on with new records until
    /// dropped.
    pub async fn flows(
        &self,
        q: &FlowQuery,
    ) -> Result<BoxStream<'static, Result<Bytes, NodeApiError>>, NodeApiError> {
        let resp = self.get(&format!("{FLOWS_PATH}{}", q.query())).await?;
        Ok(self.body_stream(resp, "the flow stream"))
    }

    /// `POST /exec/{namespace}/{pod}/{container}` with `Upgrade: skiff-exec`: starts
    /// `req.command` in the container and returns the connection carrying its channels
    /// ([`exec`]). Errors (no such container, one that has exited) come before the upgrade.
    pub async fn exec(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        req: &ExecRequest,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, NodeApiError> {
        self.session(EXEC_PATH, [namespace, pod, container], req, "exec")
            .await
    }

    /// `POST /attach/{namespace}/{pod}/{container}` with `Upgrade: skiff-exec`: attaches to
    /// the container's main process and returns the connection carrying its channels, as
    /// [`AgentEndpoint::exec`] does (the end frame comes when the container exits). Errors
    /// (no such container, one that is not running) come before the upgrade.
    pub async fn attach(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        req: &AttachRequest,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, NodeApiError> {
        self.session(ATTACH_PATH, [namespace, pod, container], req, "attach")
            .await
    }

    /// Posts a session request (`req` as JSON) to `base/{namespace}/{pod}/{container}` and
    /// takes the connection over once the agent upgrades it.
    async fn session(
        &self,
        base: &str,
        [namespace, pod, container]: [&str; 3],
        req: &impl serde::Serialize,
        what: &str,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, NodeApiError> {
        let path = format!(
            "{base}/{}/{}/{}",
            segment(namespace),
            segment(pod),
            segment(container)
        );
        let body = serde_json::to_vec(req)
            .map_err(|e| self.protocol(format!("encoding the {what} request: {e}")))?;
        let path = path.as_str();
        let resp = self
            .request(
                hyper::Method::POST,
                path,
                Bytes::from(body),
                Some(EXEC_UPGRADE),
            )
            .await?;
        let upgraded = hyper::upgrade::on(resp)
            .await
            .map_err(|e| self.protocol(format!("{what} upgrade: {e}")))?;
        Ok(TokioIo::new(upgraded))
    }

    fn protocol(&self, reason: String) -> NodeApiError {
        NodeApiError::Protocol {
            node: self.node.clone(),
            reason,
        }
    }

    /// Sends `GET path` on a new connection; a non-2xx answer becomes
    /// [`NodeApiError::Status`] with the body as message.
    async fn get(&self, path: &str) -> Result<Response<Incoming>, NodeApiError> {
        self.send(hyper::Method::GET, path, Bytes::new()).await
    }

    /// Sends `METHOD path` with `body` (JSON when not empty) on a new connection; a non-2xx
    /// answer becomes [`NodeApiError::Status`] with the body as message.
    /// A raw byte tunnel to `localhost:<port>` inside the pod's network namespace, through
    /// the agent (an HTTP upgrade); errors (nothing listening, pod not on that node) come
    /// before the tunnel.
    pub async fn port_forward(
        &self,
        namespace: &str,
        pod: &str,
        port: u16,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, NodeApiError> {
        let path = format!(
            "{PORT_FORWARD_PATH}/{}/{}/{port}",
            segment(namespace),
            segment(pod)
        );
        let resp = self
            .request(
                hyper::Method::POST,
                &path,
                Bytes::new(),
                Some(PORT_FORWARD_UPGRADE),
            )
            .await?;
        let upgraded = hyper::upgrade::on(resp)
            .await
            .map_err(|e| self.protocol(format!("port forward upgrade: {e}")))?;
        Ok(TokioIo::new(upgraded))
    }

    async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        body: Bytes,
    ) -> Result<Response<Incoming>, NodeApiError> {
        self.request(method, path, body, None).await
    }

    /// One request on a fresh connection; with `upgrade`, a 101 answer is the success.
    async fn request(
        &self,
        method: hyper::Method,
        path: &str,
        body: Bytes,
        upgrade: Option<&str>,
    ) -> Result<Response<Incoming>, NodeApiError> {
        let unreachable = |reason: String| NodeApiError::Unreachable {
            node: self.node.clone(),
            addr: self.addr,
            reason,
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(self.addr))
            .await
            .map_err(|_| unreachable(format!("no answer within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| unreachable(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let stream: Box<dyn Io> = match &self.tls {
            None => Box::new(stream),
            Some(tls) => {
                let name = rustls::pki_types::ServerName::IpAddress(self.addr.ip().into());
                let tls = tokio_rustls::TlsConnector::from(Arc::clone(tls));
                let handshake = tls.connect(name, stream);
                Box::new(
                    tokio::time::timeout(CONNECT_TIMEOUT, handshake)
                        .await
                        .map_err(|_| unreachable("TLS handshake timed out".into()))?
                        .map_err(|e| unreachable(format!("TLS: {e}")))?,
                )
            }
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        // Drives the connection; it ends when the response (body included) is done or dropped.
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "node agent connection");
            }
        });
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(hyper::header::HOST, self.addr.to_string());
        if let Some(protocol) = upgrade {
            req = req
                .header(hyper::header::CONNECTION, "Upgrade")
                .header(hyper::header::UPGRADE, protocol);
        }
        if !body.is_empty() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(http_body_util::Full::new(body))
            .map_err(|e| self.protocol(format!("building the request for {path}: {e}")))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| self.protocol(format!("{method} {path}: {e}")))?;
        let status = resp.status();
        let expected = match upgrade {
            Some(_) => status == StatusCode::SWITCHING_PROTOCOLS,
            None => status.is_success(),
        };
        if expected {
            return Ok(resp);
        }
        let body = self
            .read_body(resp, MAX_ERROR_BODY)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body).trim().to_string();
        let message = if text.is_empty() {
            status_text(status)
        } else {
            text
        };
        Err(NodeApiError::Status {
            node: self.node.clone(),
            status: status.as_u16(),
            message,
        })
    }

    async fn read_body(&self, resp: Response<Incoming>, max: usize) -> Result<Bytes, NodeApiError> {
        let limited = http_body_util::Limited::new(resp.into_body(), max);
        limited
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| self.protocol(format!("reading the answer: {e}")))
    }
}

fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(r) => format!("{} {r}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{DaemonEndpoint, NodeDaemonEndpoints, NodeStatus, ObjectMeta, PodSpec};

    fn node(port: i32) -> Node {
        Node {
            metadata: Some(ObjectMeta {
                name: "n1".into(),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                daemon_endpoints: Some(NodeDaemonEndpoints {
                    kubelet_endpoint: Some(DaemonEndpoint { port }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn with_addresses(mut n: Node, addresses: &[(&str, &str)]) -> Node {
        n.status.get_or_insert_with(Default::default).addresses = addresses
            .iter()
            .map(|(t, a)| skiff_api::api::NodeAddress {
                r#type: (*t).into(),
                address: (*a).into(),
            })
            .collect();
        n
    }

    fn ca() -> skiff_pki::Ca {
        skiff_pki::Ca::generate("cluster").unwrap()
    }

    #[test]
    fn the_agent_is_dialled_at_the_first_preferred_address_that_is_an_ip() {
        let ca = ca();
        let access = AgentAccess {
            ca_pem: Some(ca.cert_pem()),
            ..Default::default()
        };
        let n = with_addresses(
            node(10250),
            &[
                ("Hostname", "n1"),
                ("ExternalIP", "203.0.113.9"),
                ("InternalIP", "192.168.100.3"),
            ],
        );
        let ep = AgentEndpoint::of_node_as(&n, &access).unwrap();
        assert_eq!(ep.addr, "192.168.100.3:10250".parse().unwrap());
        assert_eq!(ep.node, "n1");
        let types = vec!["ExternalIP".to_string(), "InternalIP".to_string()];
        let external = AgentAccess {
            preferred_address_types: Some(&types),
            ..access
        };
        let ep = AgentEndpoint::of_node_as(&n, &external).unwrap();
        assert_eq!(ep.addr, "203.0.113.9:10250".parse().unwrap());
        // A hostname that is not an IP is never dialled; nothing else: refused, named.
        let only_name = with_addresses(node(10250), &[("Hostname", "n1")]);
        let e = AgentEndpoint::of_node_as(&only_name, &access).unwrap_err();
        assert!(
            e.to_string()
                .contains("no IP address of the types InternalIP, ExternalIP, Hostname"),
            "{e}"
        );
        for bad in [0, -1, 70000] {
            let e = AgentEndpoint::of_node_as(
                &with_addresses(node(bad), &[("InternalIP", "10.0.0.1")]),
                &access,
            )
            .unwrap_err();
            assert!(matches!(e, NodeApiError::NoEndpoint { .. }), "{e}");
        }
        let mut bare = node(1);
        bare.status = None;
        assert!(AgentEndpoint::of_node_as(&bare, &access).is_err());
    }

    #[test]
    fn an_agent_is_not_spoken_to_without_a_ca_to_verify_it() {
        let n = with_addresses(node(10250), &[("InternalIP", "192.168.100.3")]);
        let e = AgentEndpoint::of_node_as(&n, &AgentAccess::default()).unwrap_err();
        assert!(e.to_string().contains("no cluster CA"), "{e}");
    }

    #[test]
    fn no_annotation_makes_a_caller_dial_loopback_or_trust_a_pin() {
        // The annotation agents once published to be dialled on loopback with a pinned
        // self-signed certificate: a hostile node setting it gains nothing.
        let mut n = with_addresses(node(10250), &[("InternalIP", "192.168.100.3")]);
        n.metadata
            .get_or_insert_with(Default::default)
            .annotations
            .insert(
                "skiff.io/agent-serving-cert-sha256".into(),
                "sha256:00".into(),
            );
        let e = AgentEndpoint::of_node_as(&n, &AgentAccess::default()).unwrap_err();
        assert!(e.to_string().contains("no cluster CA"), "{e}");
        let ca = ca();
        let access = AgentAccess {
            ca_pem: Some(ca.cert_pem()),
            ..AgentAccess::default()
        };
        let ep = AgentEndpoint::of_node_as(&n, &access).unwrap();
        assert_eq!(ep.addr, "192.168.100.3:10250".parse().unwrap());
    }

    #[tokio::test]
    async fn unscheduled_pod_is_reported_as_such() {
        let client = Client::connect_lazy("http://127.0.0.1:1").unwrap();
        let pod = Pod {
            metadata: Some(ObjectMeta {
                name: "web".into(),
                ..Default::default()
            }),
            spec: Some(PodSpec::default()),
            ..Default::default()
        };
        let e = AgentEndpoint::for_pod(&client, &pod).await.unwrap_err();
        assert_eq!(e.to_string(), "pod web is not running on a node yet");
    }

    #[tokio::test]
    async fn unreachable_agent_is_one_clear_line() {
        // A port nobody listens on: bind, note it, close.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap();
        let ep = AgentEndpoint {
            node: "n1".into(),
            addr,
            tls: None,
        };
        let e = ep.stats_summary().await.unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("cannot reach the node agent of n1 at {addr}: ")),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn log_query_and_path_segments() {
        assert_eq!(LogOptions::default().query(), "");
        let o = LogOptions {
            tail: Some(2),
            follow: true,
            timestamps: true,
            previous: true,
        };
        assert_eq!(
            o.query(),
            "?tail=2&follow=true&timestamps=true&previous=true"
        );
        // The agent parses what the client writes.
        assert_eq!(LogOptions::parse_query(Some(&o.query()[1..])), Ok(o));
        assert_eq!(
            LogOptions::parse_query(Some("tail=-1&follow")),
            Ok(LogOptions {
                tail: None,
                follow: true,
                timestamps: false,
                previous: false,
            })
        );
        assert!(
            LogOptions::parse_query(Some("tail=x"))
                .unwrap_err()
                .contains("tail=x")
        );
        assert!(
            LogOptions::parse_query(Some("since=1h"))
                .unwrap_err()
                .contains("unknown parameter \"since\"")
        );
        assert!(LogOptions::parse_query(Some("follow=maybe")).is_err());
        assert_eq!(LogOptions::parse_query(None), Ok(LogOptions::default()));
        assert_eq!(segment("web-1.a"), "web-1.a");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn summary_json_shape() {
        let s = StatsSummary {
            node_name: "n1".into(),
            timestamp: "2026-01-01T00:00:00.000000Z".into(),
            pods: vec![PodStats {
                namespace: "default".into(),
                name: "web".into(),
                uid: "u".into(),
                cpu_usage_usec: 5,
                network: Some(NetworkStats {
                    rx_bytes: 1,
                    rx_packets: 2,
                    tx_bytes: 3,
                    tx_packets: 4,
                }),
                ..Default::default()
            }],
            node: None,
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["pods"][0]["network"]["tx_bytes"], 3);
        assert_eq!(v["pods"][0]["cpu_usage_usec"], 5);
        assert_eq!(serde_json::from_value::<StatsSummary>(v).unwrap(), s);
    }
}
