//! Service load balancing on this node: programs the socket LB ([`skiff_datapath::lb`]) from the
//! cluster's Services and Endpoints, as kube-proxy programs iptables, incrementally.
//!
//! A [`Reconciler`] on the shared controller runtime, keyed by Service (`namespace/name`):
//! the Service and Endpoints informers (Endpoints have their Service's name) queue the key,
//! and a reconcile computes the desired frontends of that Service ([`desired`]) and applies
//! the difference to the maps. The programmed state lives in the loader's mirror of the maps
//! ([`skiff_datapath::lb::LbState`], rebuilt from the pinned maps when the agent starts), plus
//! which Service owns which frontend (rebuilt from the Services once the informers synced;
//! frontends no Service wants any more are removed then). A restart therefore rewrites
//! nothing that did not change.
//!
//! Desired state: for each ServicePort of a Service with a clusterIP (not `None`), one
//! frontend per cluster IP (`clusterIPs`, else `clusterIP`) with the ready addresses of the
//! Endpoints subsets whose port of the same name (and protocol) gives the backend port.
//! `notReadyAddresses` get no new connections (terminating pods are not in Endpoints at all).
//! `sessionAffinity: ClientIP` becomes per-client-netns affinity with the Service's timeout.
//!
//! Two Services that claim the same frontend (a duplicate user-chosen clusterIP): the one
//! that programmed it first keeps it; the other is retried every 30 s and logs a warning.
//!
//! It is also the agent's one way to connect a pod to the eBPF data path
//! ([`Proxy::attach_pod`] / [`Proxy::detach_pod`]: the tc program on the pod's host veth and
//! its entry in the fast path's endpoint map, see `skiff_datapath::lb`), and reconciles that map
//! after a restart ([`Proxy::reconcile_pod_endpoints`]).
//!
//! Programming latency (a change seen by the informer → the maps written, back-off of failed
//! attempts included) is kept in a histogram, reported by `GET /bpf/services` and logged at
//! debug level. "Seen" is when the change reached this controller's informer subscription (or
//! the start of the reconcile, if the runtime's own subscription queued the key first).
//!
//! JSON served by the agent API (see [`super::api`]):
//!
//! `GET /bpf/services`:
//! ```json
//! {
//!   "node": "node-1",
//!   "services": [{
//!     "id": 1, "frontend": "10.96.0.10:80/TCP", "ip": "10.96.0.10", "port": 80,
//!     "protocol": "TCP", "sessionAffinity": "None", "affinityTimeoutSeconds": null,
//!     "service": "default/web", "portName": "http",
//!     "connects": 12, "sends": 0,
//!     "backends": [{"id": 3, "slot": 0, "ip": "10.244.1.5", "port": 8080,
//!                   "address": "10.244.1.5:8080", "connects": 7, "sends": 0}]
//!   }],
//!   "maps": [{"map": "LB_SERVICES", "entries": 1, "maxEntries": 65536}, …],
//!   "programming": {"writes": 42, "latencyMicros": {"count": 5, "sum": 1234,
//!                   "buckets": [{"le": 100, "count": 1}, …, {"le": null, "count": 5}]}}
//! }
//! ```
//! `GET /bpf/backends`:
//! ```json
//! {
//!   "node": "node-1",
//!   "backends": [{"id": 3, "ip": "10.244.1.5", "port": 8080, "address": "10.244.1.5:8080",
//!                 "protocol": "TCP", "serviceId": 1, "frontend": "10.96.0.10:80/TCP",
//!                 "service": "default/web", "portName": "http", "slot": 0,
//!                 "connects": 7, "sends": 0}]
//! }
//! ```
//! `GET /bpf/pods` (the pod fast path; `uid`/`namespace`/`name`/`network` are `null` for an
//! entry no pod of this agent claimed yet, `network` also without the traffic accounting):
//! ```json
//! {
//!   "node": "node-1",
//!   "pods": [{"ip": "10.244.1.5", "ifindex": 12, "podMac": "9a:…", "hostMac": "2e:…",
//!             "uid": "…", "namespace": "default", "name": "web-1",
//!             "network": {"rx_bytes": 1200, "rx_packets": 10, "tx_bytes": 800, "tx_packets": 9}}],
//!   "fastPath": {"redirectPeer": 41, "redirectNeigh": 17, "pass": 3, "fibFail": 0}
//! }
//! ```
//! `GET /bpf/conntrack` (NodePort translations, both directions of every flow):
//! ```json
//! {"node": "node-1", "entries": [{"direction": "forward", "protocol": "TCP",
//!   "packet": "10.0.0.9:40000 -> 192.168.100.2:30080",
//!   "rewritten": "192.168.100.2:40000 -> 10.244.1.5:8080", "backendId": 3, "serviceId": 2}]}
//! ```
//! `service`/`portName` are `null` for a frontend no Service owns (only until it is removed).
//! `connects` counts `connect()` calls sent to a backend (TCP, connected UDP), `sends`
//! unconnected UDP datagrams; both count since the backend was added (they survive agent
//! restarts). Histogram buckets are cumulative, `le` in microseconds (`null` = +Inf).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use skiff_api::api::{Endpoints, Service};
use skiff_client::runtime::{
    Action, CancelToken, Controller, Informer, Informers, ObjectKey, Reconciler,
};
use tracing::{debug, info, warn};

use skiff_datapath::BpfError;
use skiff_datapath::lb::{
    BackendAddr, BackendDump, FastPathCounters, Frontend, MapPressure, PodEndpoint, Protocol,
    ServiceDump, ServiceLb, ServiceParams, TcAttach,
};
use skiff_hostnet::PodAttachment;

/// Kubernetes' default ClientIP affinity timeout (3 h).
const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10800;
/// How often a Service whose frontend another Service holds is looked at again.
const CONFLICT_RETRY: Duration = Duration::from_secs(30);

/// One frontend a Service wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredPort {
    pub frontend: Frontend,
    pub port_name: String,
    pub params: ServiceParams,
    pub backends: Vec<BackendAddr>,
}

/// The frontends `svc` wants, with their ready backends from `eps` (pure; `None` = absent),
/// without NodePort frontends: [`desired_on`] for a node without addresses.
pub fn desired(svc: Option<&Service>, eps: Option<&Endpoints>) -> Vec<DesiredPort> {
    desired_on(svc, eps, "", &[])
}

/// Whether a Service of this `type` gets node ports (`LoadBalancer` includes `NodePort`).
fn has_node_ports(service_type: &str) -> bool {
    matches!(service_type, "NodePort" | "LoadBalancer")
}

/// The frontends `svc` wants on a node with addresses `node_ips`: one per ServicePort and
/// cluster IP, plus, for a Service of type NodePort (or LoadBalancer), one per ServicePort
/// with a `nodePort` and IPv4 node address, `<node IP>:<nodePort>` with
/// [`ServiceParams::node_port`] set (the tc NodePort program serves only IPv4). NodePort
/// frontends balance over every ready backend of the cluster (externalTrafficPolicy
/// `Cluster`), or with `externalTrafficPolicy: Local` over the ready backends whose
/// Endpoints address has `nodeName` = `node` only, without SNAT ([`ServiceParams::local`];
/// no local backend: the frontend drops new flows, as kube-proxy does).
pub fn desired_on(
    svc: Option<&Service>,
    eps: Option<&Endpoints>,
    node: &str,
    node_ips: &[IpAddr],
) -> Vec<DesiredPort> {
    let Some(spec) = svc.and_then(|s| s.spec.as_ref()) else {
        return Vec::new();
    };
    let mut ips: Vec<IpAddr> = Vec::new();
    let listed = if spec.cluster_ips.is_empty() {
        std::slice::from_ref(&spec.cluster_ip)
    } else {
        spec.cluster_ips.as_slice()
    };
    for ip in listed {
        // "" (not allocated yet), "None" (headless) and anything unparsable: no frontend.
        if let Ok(ip) = ip.parse::<IpAddr>()
            && !ips.contains(&ip)
        {
            ips.push(ip);
        }
    }
    let params = ServiceParams {
        affinity_timeout_s: (spec.session_affinity == "ClientIP").then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .filter(|t| *t > 0)
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_S)
        }),
        node_port: false,
        local: false,
    };
    let node_ports = has_node_ports(&spec.r#type);
    let local = spec.external_traffic_policy == "Local";
    let mut out = Vec::new();
    for sp in &spec.ports {
        let protocol = if sp.protocol.is_empty() {
            Some(Protocol::Tcp)
        } else {
            Protocol::parse(&sp.protocol)
        };
        let (Some(protocol), Ok(port)) = (protocol, u16::try_from(sp.port)) else {
            continue;
        };
        if port == 0 {
            continue;
        }
        let mut backends = Vec::new();
        let mut local_backends = Vec::new();
        for subset in eps.map(|e| e.subsets.as_slice()).unwrap_or_default() {
            // Endpoints ports match ServicePorts by name (and protocol).
            let Some(target) = subset.ports.iter().find(|p| {
                p.name == sp.name
                    && (if p.protocol.is_empty() {
                        protocol == Protocol::Tcp
                    } else {
                        Protocol::parse(&p.protocol) == Some(protocol)
                    })
            }) else {
                continue;
            };
            let Ok(target_port) = u16::try_from(target.port) else {
                continue;
            };
            if target_port == 0 {
                continue;
            }
            for a in &subset.addresses {
                if let Ok(ip) = a.ip.parse::<IpAddr>() {
                    let b = BackendAddr {
                        ip,
                        port: target_port,
                    };
                    if !backends.contains(&b) {
                        backends.push(b);
                    }
                    if a.node_name.as_deref() == Some(node) && !local_backends.contains(&b) {
                        local_backends.push(b);
                    }
                }
            }
        }
        for ip in &ips {
            out.push(DesiredPort {
                frontend: Frontend {
                    ip: *ip,
                    port,
                    protocol,
                },
                port_name: sp.name.clone(),
                params,
                // A frontend gets the backends of its own family.
                backends: backends
                    .iter()
                    .filter(|b| b.ip.is_ipv4() == ip.is_ipv4())
                    .copied()
                    .collect(),
            });
        }
        let node_port = u16::try_from(sp.node_port).unwrap_or(0);
        if !node_ports || node_port == 0 {
            continue;
        }
        for ip in node_ips.iter().filter(|ip| ip.is_ipv4()) {
            out.push(DesiredPort {
                frontend: Frontend {
                    ip: *ip,
                    port: node_port,
                    protocol,
                },
                port_name: sp.name.clone(),
                params: ServiceParams {
                    node_port: true,
                    local,
                    ..params
                },
                backends: if local { &local_backends } else { &backends }
                    .iter()
                    .filter(|b| b.ip.is_ipv4())
                    .copied()
                    .collect(),
            });
        }
    }
    out
}

/// Latency histogram with fixed buckets (microseconds).
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: [u64; BUCKETS_US.len() + 1],
    count: u64,
    sum_us: u64,
}

/// Upper bounds of the buckets, in microseconds (the last bucket is +Inf).
const BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Upper bound in microseconds; `None` is +Inf.
    pub le: Option<u64>,
    /// Observations at or below `le` (cumulative).
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistogramSnapshot {
    pub count: u64,
    /// Sum of the observations, in microseconds.
    pub sum: u64,
    pub buckets: Vec<Bucket>,
}

impl Histogram {
    pub fn observe(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(BUCKETS_US.len());
        self.counts[i] += 1;
        self.count += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut acc = 0;
        let buckets = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                acc += c;
                Bucket {
                    le: BUCKETS_US.get(i).copied(),
                    count: acc,
                }
            })
            .collect();
        HistogramSnapshot {
            count: self.count,
            sum: self.sum_us,
            buckets,
        }
    }
}

/// Which ServicePort programmed a frontend.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    key: ObjectKey,
    port_name: String,
}

struct Inner {
    lb: ServiceLb,
    /// This node's name (externalTrafficPolicy Local: its own backends) and addresses
    /// (NodePort frontends are programmed for each).
    node_name: String,
    node_ips: Vec<IpAddr>,
    owners: BTreeMap<Frontend, Owner>,
    /// The pods given to the fast path by this agent: address → pod uid.
    pods: BTreeMap<IpAddr, String>,
    writes: u64,
    latency: Histogram,
}

/// The node's Service load balancing: the loaded [`ServiceLb`] and who owns which frontend.
pub struct Proxy {
    inner: Mutex<Inner>,
    /// When a change to a Service (or its Endpoints) was first seen, until reconciled.
    seen: Arc<Mutex<HashMap<ObjectKey, Instant>>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").finish_non_exhaustive()
    }
}

/// `GET /bpf/services`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicesReport {
    pub node: String,
    pub services: Vec<ServiceEntry>,
    pub maps: Vec<MapPressure>,
    pub programming: ProgrammingStats,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEntry {
    #[serde(flatten)]
    pub lb: ServiceDump,
    /// `namespace/name` of the Service that owns the frontend.
    pub service: Option<String>,
    pub port_name: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgrammingStats {
    /// Map writes since the agent started.
    pub writes: u64,
    pub latency_micros: HistogramSnapshot,
}

/// `GET /bpf/pods`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodsReport {
    pub node: String,
    pub pods: Vec<PodEntry>,
    pub fast_path: FastPathReport,
}

/// A local pod of the fast path, with its traffic (eBPF accounting, as `/stats/summary`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodEntry {
    #[serde(flatten)]
    pub endpoint: PodEndpointEntry,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub network: Option<skiff_client::node_api::NetworkStats>,
}

/// The fast path's packet counters, summed over CPUs (see `skiff_common::podnet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FastPathReport {
    pub redirect_peer: u64,
    pub redirect_neigh: u64,
    pub pass: u64,
    pub fib_fail: u64,
}

impl From<FastPathCounters> for FastPathReport {
    fn from(c: FastPathCounters) -> Self {
        FastPathReport {
            redirect_peer: c.redirect_peer,
            redirect_neigh: c.redirect_neigh,
            pass: c.pass,
            fib_fail: c.fib_fail,
        }
    }
}

/// One entry of the fast path's endpoint map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodEndpointEntry {
    pub ip: IpAddr,
    /// The pod's host veth, in the node namespace.
    pub ifindex: u32,
    pub pod_mac: String,
    pub host_mac: String,
    /// The pod it was written for (`None`: an entry this agent has not (re)written).
    pub uid: Option<String>,
}

/// `GET /bpf/conntrack`: the NodePort translations.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConntrackReport {
    pub node: String,
    pub entries: Vec<ConntrackEntry>,
}

/// One direction of a NodePort flow: packets matching `packet` are rewritten to `rewritten`
/// (both `src:port -> dst:port`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConntrackEntry {
    /// `forward` (client → node) or `reply` (backend → node).
    pub direction: &'static str,
    pub protocol: &'static str,
    pub packet: String,
    pub rewritten: String,
    pub backend_id: u32,
    pub service_id: u32,
}

impl ConntrackEntry {
    fn of(k: &skiff_common::lb::NpCtKey, e: &skiff_common::lb::NpCtEntry) -> Self {
        let ip = |be: u32| std::net::Ipv4Addr::from(be.to_ne_bytes());
        ConntrackEntry {
            direction: if k.dir == skiff_common::lb::NP_CT_REPLY {
                "reply"
            } else {
                "forward"
            },
            protocol: match k.proto {
                skiff_common::lb::IPPROTO_TCP => "TCP",
                skiff_common::lb::IPPROTO_UDP => "UDP",
                _ => "?",
            },
            packet: format!("{}:{} -> {}:{}", ip(k.saddr), k.sport, ip(k.daddr), k.dport),
            rewritten: format!("{}:{} -> {}:{}", ip(e.saddr), e.sport, ip(e.daddr), e.dport),
            backend_id: e.backend_id,
            service_id: e.service_id,
        }
    }
}

fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The endpoint entries to remove: addresses not allocated to a pod, or whose pod's host
/// veth (`ifindex_of` its name) is not the recorded device (pure).
fn stale_endpoints(
    entries: &[(IpAddr, PodEndpoint)],
    allocations: &BTreeMap<IpAddr, String>,
    ifindex_of: impl Fn(&str) -> Option<u32>,
) -> Vec<IpAddr> {
    entries
        .iter()
        .filter(|(ip, ep)| {
            allocations.get(ip).is_none_or(|uid| {
                ifindex_of(&skiff_hostnet::host_veth_name(uid)) != Some(ep.ifindex)
            })
        })
        .map(|(ip, _)| *ip)
        .collect()
}

/// `GET /bpf/backends`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendsReport {
    pub node: String,
    pub backends: Vec<BackendEntry>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendEntry {
    pub id: u32,
    pub ip: IpAddr,
    pub port: u16,
    pub address: String,
    pub protocol: &'static str,
    pub service_id: u32,
    pub frontend: String,
    pub service: Option<String>,
    pub port_name: Option<String>,
    pub slot: u32,
    pub connects: u64,
    pub sends: u64,
}

impl Proxy {
    /// A proxy programming `lb` on node `node_name`, with NodePort frontends on `node_ips`.
    pub fn new(lb: ServiceLb, node_name: &str, node_ips: Vec<IpAddr>) -> Arc<Self> {
        Arc::new(Proxy {
            inner: Mutex::new(Inner {
                lb,
                node_name: node_name.to_string(),
                node_ips,
                owners: BTreeMap::new(),
                pods: BTreeMap::new(),
                writes: 0,
                latency: Histogram::default(),
            }),
            seen: Arc::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attaches the NodePort tc program to device `ifname` of the network namespace `netns`
    /// (`None`: the agent's): the node's uplink, or a pod's host veth.
    pub fn attach_tc(
        &self,
        netns: Option<&std::path::Path>,
        ifname: &str,
    ) -> Result<TcAttach, String> {
        let mut inner = self.lock();
        let lb = &mut inner.lb;
        skiff_hostnet::run_in_netns_scoped(netns, || lb.attach_tc(ifname))
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{ifname}: {e}"))
    }

    /// Connects a pod's network to the data path, the one way the agent does it: the
    /// NodePort/fast path tc program on its host veth (in the node namespace `netns`), then
    /// its entry in the fast path's endpoint map (packets for it are delivered straight into
    /// its namespace from then on). Idempotent (the agent calls it again after a restart).
    pub fn attach_pod(
        &self,
        netns: Option<&std::path::Path>,
        uid: &str,
        att: &PodAttachment,
    ) -> Result<TcAttach, String> {
        let how = self.attach_tc(netns, &att.host_veth)?;
        let (IpAddr::V4(ip), Some(host_mac), Some(pod_mac)) =
            (att.pod_ip, att.host_mac, att.pod_mac)
        else {
            return Err(format!(
                "pod {uid}: no fast path (only IPv4 pods with MACs on both veth ends have one)"
            ));
        };
        let ep = PodEndpoint {
            ifindex: att.host_ifindex,
            pod_mac,
            host_mac,
        };
        let mut inner = self.lock();
        inner
            .lb
            .set_pod_endpoint(ip, ep)
            .map_err(|e| format!("pod {uid}: {e}"))?;
        inner.pods.insert(att.pod_ip, uid.to_string());
        Ok(how)
    }

    /// Disconnects pod `uid` (address `ip`, if known) from the data path: removes its
    /// endpoint entry (before its veth and address go, so a reused address never points at a
    /// stale device) and detaches the tc program from its host veth.
    pub fn detach_pod(&self, uid: &str, ip: Option<IpAddr>) -> Result<(), String> {
        let mut inner = self.lock();
        let mut ips: Vec<IpAddr> = inner
            .pods
            .iter()
            .filter(|(_, u)| *u == uid)
            .map(|(ip, _)| *ip)
            .collect();
        ips.extend(ip);
        for ip in ips {
            inner.pods.remove(&ip);
            if let IpAddr::V4(v4) = ip {
                inner
                    .lb
                    .remove_pod_endpoint(v4)
                    .map_err(|e| format!("pod {uid}: {e}"))?;
            }
        }
        let ifname = skiff_hostnet::host_veth_name(uid);
        ServiceLb::detach_tc(inner.lb.pin_dir(), &ifname).map_err(|e| format!("{ifname}: {e}"))
    }

    /// Removes the endpoint entries (left by an earlier agent) that are not pods this node
    /// runs: an address not allocated (`allocations`: address → pod uid), or whose host veth
    /// in the node namespace `netns` is not the device recorded. Returns how many it removed.
    pub fn reconcile_pod_endpoints(
        &self,
        netns: Option<&std::path::Path>,
        allocations: &BTreeMap<IpAddr, String>,
    ) -> Result<usize, String> {
        let mut inner = self.lock();
        let entries = inner.lb.pod_endpoints().map_err(|e| e.to_string())?;
        let stale = skiff_hostnet::run_in_netns_scoped(netns, || {
            stale_endpoints(&entries, allocations, |name| {
                skiff_datapath::lb::ifindex(name).ok()
            })
        })
        .map_err(|e| e.to_string())?;
        for ip in &stale {
            inner.pods.remove(ip);
            if let IpAddr::V4(v4) = ip {
                inner
                    .lb
                    .remove_pod_endpoint(*v4)
                    .map_err(|e| e.to_string())?;
            }
        }
        for (ip, uid) in allocations {
            if entries.iter().any(|(e, _)| e == ip) && !stale.contains(ip) {
                inner.pods.insert(*ip, uid.clone());
            }
        }
        Ok(stale.len())
    }

    /// The fast path's counters, summed over CPUs.
    pub fn fast_path_counters(&self) -> Result<FastPathCounters, BpfError> {
        self.lock().lb.fast_path_counters()
    }

    /// The fast path's endpoints with the pod (uid) each was written for, for `GET /bpf/pods`.
    pub fn pod_endpoints(&self) -> Result<Vec<PodEndpointEntry>, BpfError> {
        let inner = self.lock();
        Ok(inner
            .lb
            .pod_endpoints()?
            .into_iter()
            .map(|(ip, ep)| PodEndpointEntry {
                ip,
                ifindex: ep.ifindex,
                pod_mac: mac_string(&ep.pod_mac),
                host_mac: mac_string(&ep.host_mac),
                uid: inner.pods.get(&ip).cloned(),
            })
            .collect())
    }

    /// The NodePort conntrack entries, for `GET /bpf/conntrack`.
    pub fn conntrack_report(&self, node: &str) -> Result<ConntrackReport, BpfError> {
        let mut entries: Vec<ConntrackEntry> = self
            .lock()
            .lb
            .conntrack()?
            .into_iter()
            .map(|(k, e)| ConntrackEntry::of(&k, &e))
            .collect();
        entries.sort_by(|a, b| (&a.direction, &a.packet).cmp(&(&b.direction, &b.packet)));
        Ok(ConntrackReport {
            node: node.to_string(),
            entries,
        })
    }

    /// Map writes since this proxy was created.
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    pub fn latency(&self) -> HistogramSnapshot {
        self.lock().latency.snapshot()
    }

    /// Runs until `shutdown` is cancelled: waits for the Service and Endpoints informers of
    /// `informers` to sync, takes ownership of the frontends that are already programmed
    /// (removing those no Service wants), then reconciles every change.
    pub async fn run(self: Arc<Self>, informers: Informers, shutdown: CancelToken) {
        let services = informers.get::<Service>();
        let endpoints = informers.get::<Endpoints>();
        tokio::select! {
            () = informers.wait_synced() => {}
            () = shutdown.cancelled() => return,
        }
        match self.adopt(&services) {
            Ok((owned, removed)) => {
                info!(
                    owned,
                    removed, "service load balancer: took over the programmed frontends"
                )
            }
            Err(e) => warn!(error = %e, "service load balancer: removing stale frontends"),
        }
        let mark = |seen: Arc<Mutex<HashMap<ObjectKey, Instant>>>| {
            move |key: ObjectKey| {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(key.clone())
                    .or_insert_with(Instant::now);
                vec![key]
            }
        };
        let (on_service, on_endpoints) = (mark(self.seen.clone()), mark(self.seen.clone()));
        let reconciler = Arc::new(ServiceReconciler {
            proxy: self,
            services: services.clone(),
            endpoints: endpoints.clone(),
        });
        Controller::<Service>::new(&informers)
            .named("service-lb")
            .watches(&services, move |s: &Service| on_service(ObjectKey::of(s)))
            .watches(&endpoints, move |e: &Endpoints| {
                on_endpoints(ObjectKey::of(e))
            })
            .graceful_shutdown_on(shutdown)
            .run(reconciler, 1)
            .await;
    }

    /// Assigns the frontends found programmed to the Services that want them; removes the
    /// rest. Returns (owned, removed).
    fn adopt(&self, services: &Informer<Service>) -> Result<(usize, usize), BpfError> {
        let mut inner = self.lock();
        let Inner {
            lb,
            owners,
            node_name,
            node_ips,
            ..
        } = &mut *inner;
        for svc in services.list() {
            let key = ObjectKey::of(&*svc);
            for d in desired_on(Some(&svc), None, node_name, node_ips) {
                if lb.state().service(&d.frontend).is_some() && !owners.contains_key(&d.frontend) {
                    owners.insert(
                        d.frontend,
                        Owner {
                            key: key.clone(),
                            port_name: d.port_name,
                        },
                    );
                }
            }
        }
        let orphans: Vec<Frontend> = lb
            .state()
            .frontends()
            .filter(|f| !owners.contains_key(f))
            .copied()
            .collect();
        let mut writes = 0;
        for f in &orphans {
            writes += lb.remove_service(f)?;
            debug!(frontend = %f, "removed a frontend no Service wants");
        }
        inner.writes += writes as u64;
        Ok((inner.owners.len(), orphans.len()))
    }

    /// The programmed services and map pressure, for `GET /bpf/services`.
    pub fn services_report(&self, node: &str) -> Result<ServicesReport, BpfError> {
        let inner = self.lock();
        let services = inner
            .lb
            .dump()?
            .into_iter()
            .map(|lb| {
                let owner = inner.owners.get(&frontend_of(&lb));
                ServiceEntry {
                    service: owner.map(|o| o.key.to_string()),
                    port_name: owner.map(|o| o.port_name.clone()),
                    lb,
                }
            })
            .collect();
        Ok(ServicesReport {
            node: node.to_string(),
            services,
            maps: inner.lb.pressure()?,
            programming: ProgrammingStats {
                writes: inner.writes,
                latency_micros: inner.latency.snapshot(),
            },
        })
    }

    /// Every backend, for `GET /bpf/backends`.
    pub fn backends_report(&self, node: &str) -> Result<BackendsReport, BpfError> {
        let inner = self.lock();
        let mut backends = Vec::new();
        for svc in inner.lb.dump()? {
            let owner = inner.owners.get(&frontend_of(&svc));
            for b in &svc.backends {
                let BackendDump {
                    id,
                    slot,
                    ip,
                    port,
                    address,
                    connects,
                    sends,
                } = b.clone();
                backends.push(BackendEntry {
                    id,
                    ip,
                    port,
                    address,
                    protocol: svc.protocol,
                    service_id: svc.id,
                    frontend: svc.frontend.clone(),
                    service: owner.map(|o| o.key.to_string()),
                    port_name: owner.map(|o| o.port_name.clone()),
                    slot,
                    connects,
                    sends,
                });
            }
        }
        backends.sort_by_key(|b| b.id);
        Ok(BackendsReport {
            node: node.to_string(),
            backends,
        })
    }
}

fn frontend_of(d: &ServiceDump) -> Frontend {
    Frontend {
        ip: d.ip,
        port: d.port,
        protocol: Protocol::parse(d.protocol).unwrap_or(Protocol::Tcp),
    }
}

/// The reconciler: one Service key at a time.
struct ServiceReconciler {
    proxy: Arc<Proxy>,
    services: Informer<Service>,
    endpoints: Informer<Endpoints>,
}

impl ServiceReconciler {
    fn desired_of(&self, key: &ObjectKey) -> Vec<DesiredPort> {
        let (node, node_ips) = {
            let inner = self.proxy.lock();
            (inner.node_name.clone(), inner.node_ips.clone())
        };
        desired_on(
            self.services.get(key).as_deref(),
            self.endpoints.get(key).as_deref(),
            &node,
            &node_ips,
        )
    }
}

impl Reconciler for ServiceReconciler {
    type Error = BpfError;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, BpfError> {
        // When the change was seen: our subscription's mark, or now if the controller's own
        // subscription queued the key first (then the mark follows within microseconds, and
        // its reconcile finds nothing left to write).
        let now = Instant::now();
        let seen = self
            .proxy
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
            .map_or(now, |t| t.min(now));
        let want = self.desired_of(key);
        let mut inner = self.proxy.lock();
        let mut writes = 0;
        let mut action = Action::Done;
        let result = (|| {
            let Inner { lb, owners, .. } = &mut *inner;
            let stale: Vec<Frontend> = owners
                .iter()
                .filter(|(f, o)| o.key == *key && !want.iter().any(|d| d.frontend == **f))
                .map(|(f, _)| *f)
                .collect();
            for f in stale {
                writes += lb.remove_service(&f)?;
                owners.remove(&f);
            }
            for d in &want {
                if let Some(other) = owners.get(&d.frontend)
                    && other.key != *key
                    && self
                        .desired_of(&other.key)
                        .iter()
                        .any(|o| o.frontend == d.frontend)
                {
                    warn!(service = %key, frontend = %d.frontend, holder = %other.key,
                        "frontend already programmed for another Service; not taking it");
                    action = Action::RequeueAfter(CONFLICT_RETRY);
                    continue;
                }
                writes += lb.sync_service(d.frontend, d.params, &d.backends)?;
                owners.insert(
                    d.frontend,
                    Owner {
                        key: key.clone(),
                        port_name: d.port_name.clone(),
                    },
                );
            }
            Ok::<(), BpfError>(())
        })();
        inner.writes += writes as u64;
        if writes > 0 {
            let latency = seen.elapsed();
            inner.latency.observe(latency);
            debug!(service = %key, writes, ?latency, "service load balancer programmed");
        }
        result.map(|()| action)
    }
}

#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod podnet_kernel_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        ClientIpConfig, EndpointAddress, EndpointPort, EndpointSubset, ObjectMeta, ServicePort,
        ServiceSpec, SessionAffinityConfig,
    };

    fn svc(cluster_ip: &str, ports: &[(&str, i32, &str)]) -> Service {
        Service {
            metadata: Some(ObjectMeta {
                name: "web".into(),
                namespace: "default".into(),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                cluster_ip: cluster_ip.into(),
                ports: ports
                    .iter()
                    .map(|(name, port, proto)| ServicePort {
                        name: name.to_string(),
                        port: *port,
                        protocol: proto.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn subset(ready: &[&str], not_ready: &[&str], ports: &[(&str, i32, &str)]) -> EndpointSubset {
        let addr = |ip: &&str| EndpointAddress {
            ip: ip.to_string(),
            ..Default::default()
        };
        EndpointSubset {
            addresses: ready.iter().map(addr).collect(),
            not_ready_addresses: not_ready.iter().map(addr).collect(),
            ports: ports
                .iter()
                .map(|(name, port, proto)| EndpointPort {
                    name: name.to_string(),
                    port: *port,
                    protocol: proto.to_string(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn eps(subsets: Vec<EndpointSubset>) -> Endpoints {
        Endpoints {
            subsets,
            ..Default::default()
        }
    }

    fn b(ip: &str, port: u16) -> BackendAddr {
        BackendAddr {
            ip: ip.parse().unwrap(),
            port,
        }
    }

    #[test]
    fn node_port_services_get_a_frontend_per_node_address() {
        let mut s = svc("10.96.0.20", &[("http", 80, "TCP"), ("dns", 53, "UDP")]);
        let spec = s.spec.as_mut().unwrap();
        spec.r#type = "NodePort".into();
        spec.ports[0].node_port = 30080;
        // No nodePort allocated yet for "dns": no NodePort frontend for it.
        let e = eps(vec![subset(
            &["10.244.0.5", "10.244.1.6"],
            &[],
            &[("http", 8080, "TCP"), ("dns", 5353, "UDP")],
        )]);
        let nodes: Vec<IpAddr> = vec!["192.168.100.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        let d = desired_on(Some(&s), Some(&e), "node-1", &nodes);
        let names: Vec<String> = d.iter().map(|d| d.frontend.to_string()).collect();
        assert_eq!(
            names,
            [
                "10.96.0.20:80/TCP",
                "192.168.100.2:30080/TCP",
                "10.96.0.20:53/UDP"
            ]
        );
        assert!(d[1].params.node_port && !d[0].params.node_port);
        assert_eq!(
            d[1].backends,
            [b("10.244.0.5", 8080), b("10.244.1.6", 8080)]
        );
        // ClusterIP Services, and nodes without addresses, get none.
        s.spec.as_mut().unwrap().r#type = "ClusterIP".into();
        assert_eq!(desired_on(Some(&s), Some(&e), "node-1", &nodes).len(), 2);
        s.spec.as_mut().unwrap().r#type = "LoadBalancer".into();
        assert_eq!(desired_on(Some(&s), Some(&e), "node-1", &nodes).len(), 3);
        assert_eq!(desired(Some(&s), Some(&e)).len(), 2);
    }

    #[test]
    fn external_traffic_policy_local_keeps_this_nodes_backends_only() {
        let mut s = svc("10.96.0.21", &[("http", 80, "TCP")]);
        let spec = s.spec.as_mut().unwrap();
        spec.r#type = "NodePort".into();
        spec.ports[0].node_port = 30081;
        spec.external_traffic_policy = "Local".into();
        let mut sub = subset(
            &["10.244.0.5", "10.244.1.6", "10.244.0.7"],
            &[],
            &[("http", 8080, "TCP")],
        );
        for (a, node) in sub.addresses.iter_mut().zip(["node-1", "node-2", "node-1"]) {
            a.node_name = Some(node.to_string());
        }
        let e = eps(vec![sub]);
        let nodes: Vec<IpAddr> = vec!["192.168.100.2".parse().unwrap()];
        let d = desired_on(Some(&s), Some(&e), "node-1", &nodes);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].backends.len(), 3, "the clusterIP keeps every backend");
        assert!(d[1].params.node_port && d[1].params.local);
        assert_eq!(
            d[1].backends,
            [b("10.244.0.5", 8080), b("10.244.0.7", 8080)],
            "the nodePort only this node's"
        );
        let other = desired_on(Some(&s), Some(&e), "node-3", &nodes);
        assert!(other[1].backends.is_empty(), "no local backend: none");
        s.spec.as_mut().unwrap().external_traffic_policy = "Cluster".into();
        let d = desired_on(Some(&s), Some(&e), "node-1", &nodes);
        assert!(!d[1].params.local);
        assert_eq!(d[1].backends.len(), 3);
    }

    #[test]
    fn ready_addresses_per_named_port() {
        let s = svc("10.96.0.10", &[("http", 80, "TCP"), ("dns", 53, "UDP")]);
        let e = eps(vec![
            subset(
                &["10.244.0.5", "10.244.0.6"],
                &["10.244.0.7"],
                &[("http", 8080, "TCP"), ("dns", 5353, "UDP")],
            ),
            // Another subset where the pods listen elsewhere.
            subset(&["10.244.1.9"], &[], &[("http", 9090, "TCP")]),
        ]);
        let d = desired(Some(&s), Some(&e));
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].frontend.to_string(), "10.96.0.10:80/TCP");
        assert_eq!(d[0].port_name, "http");
        assert_eq!(
            d[0].backends,
            [
                b("10.244.0.5", 8080),
                b("10.244.0.6", 8080),
                b("10.244.1.9", 9090)
            ]
        );
        assert_eq!(d[1].frontend.to_string(), "10.96.0.10:53/UDP");
        assert_eq!(
            d[1].backends,
            [b("10.244.0.5", 5353), b("10.244.0.6", 5353)],
            "not-ready addresses get no traffic"
        );
        assert_eq!(d[0].params, ServiceParams::default());
    }

    #[test]
    fn ports_match_by_name_and_protocol() {
        // A single unnamed port matches the unnamed Endpoints port.
        let s = svc("10.96.0.11", &[("", 80, "TCP")]);
        let e = eps(vec![subset(&["10.244.0.5"], &[], &[("", 8080, "")])]);
        assert_eq!(
            desired(Some(&s), Some(&e))[0].backends,
            [b("10.244.0.5", 8080)]
        );
        // Same name, other protocol: no backend.
        let e = eps(vec![subset(&["10.244.0.5"], &[], &[("", 8080, "UDP")])]);
        assert!(desired(Some(&s), Some(&e))[0].backends.is_empty());
        // No Endpoints yet: the frontend exists (and refuses connections).
        let d = desired(Some(&s), None);
        assert_eq!(d.len(), 1);
        assert!(d[0].backends.is_empty());
    }

    #[test]
    fn headless_unallocated_and_missing_services_have_no_frontends() {
        let e = eps(vec![subset(&["10.244.0.5"], &[], &[("", 80, "TCP")])]);
        for ip in ["None", "", "not-an-ip"] {
            assert!(desired(Some(&svc(ip, &[("", 80, "TCP")])), Some(&e)).is_empty());
        }
        assert!(desired(None, Some(&e)).is_empty());
        // An unsupported protocol or a bad port is skipped, the rest stays.
        let s = svc(
            "10.96.0.12",
            &[("a", 80, "QUIC"), ("b", 70000, "TCP"), ("c", 81, "")],
        );
        let d = desired(Some(&s), None);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].frontend.to_string(), "10.96.0.12:81/TCP");
    }

    #[test]
    fn client_ip_affinity_and_dual_stack() {
        let mut s = svc("10.96.0.13", &[("", 80, "TCP")]);
        let spec = s.spec.as_mut().unwrap();
        spec.session_affinity = "ClientIP".into();
        spec.cluster_ips = vec!["10.96.0.13".into(), "fd00::13".into()];
        let e = eps(vec![subset(
            &["10.244.0.5", "fd00:244::5"],
            &[],
            &[("", 8080, "TCP")],
        )]);
        let d = desired(Some(&s), Some(&e));
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].params.affinity_timeout_s, Some(10800), "default 3 h");
        assert_eq!(d[0].backends, [b("10.244.0.5", 8080)]);
        assert_eq!(d[1].frontend.to_string(), "[fd00::13]:80/TCP");
        assert_eq!(d[1].backends, [b("fd00:244::5", 8080)]);
        s.spec.as_mut().unwrap().session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIpConfig {
                timeout_seconds: Some(60),
            }),
        });
        assert_eq!(
            desired(Some(&s), None)[0].params.affinity_timeout_s,
            Some(60)
        );
    }

    #[test]
    fn stale_endpoints_are_unallocated_or_on_another_device() {
        let ep = |ifindex| PodEndpoint {
            ifindex,
            ..Default::default()
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let entries = vec![
            (ip("10.244.1.2"), ep(7)),
            (ip("10.244.1.3"), ep(8)),
            (ip("10.244.1.4"), ep(9)),
        ];
        let allocations: BTreeMap<IpAddr, String> = [
            (ip("10.244.1.2"), "a".to_string()),
            (ip("10.244.1.3"), "b".to_string()),
        ]
        .into();
        let devices = [
            (skiff_hostnet::host_veth_name("a"), 7),
            (skiff_hostnet::host_veth_name("b"), 12),
        ];
        let ifindex_of = |name: &str| devices.iter().find(|(n, _)| n == name).map(|(_, i)| *i);
        // .2 is a's and on a's veth; .3 is b's but b's veth is another device now; .4 is
        // nobody's.
        assert_eq!(
            stale_endpoints(&entries, &allocations, ifindex_of),
            [ip("10.244.1.3"), ip("10.244.1.4")]
        );
    }

    #[test]
    fn conntrack_entries_read_as_addresses() {
        let be = |a: [u8; 4]| u32::from_ne_bytes(a);
        let k = skiff_common::lb::NpCtKey {
            saddr: be([10, 201, 0, 2]),
            daddr: be([10, 201, 0, 1]),
            sport: 40000,
            dport: 30080,
            proto: skiff_common::lb::IPPROTO_TCP,
            dir: skiff_common::lb::NP_CT_FORWARD,
            _pad: [0; 2],
        };
        let e = skiff_common::lb::NpCtEntry {
            saddr: be([10, 201, 0, 1]),
            daddr: be([10, 202, 1, 11]),
            sport: 40000,
            dport: 8080,
            backend_id: 3,
            service_id: 1,
        };
        let c = ConntrackEntry::of(&k, &e);
        assert_eq!(c.direction, "forward");
        assert_eq!(c.protocol, "TCP");
        assert_eq!(c.packet, "10.201.0.2:40000 -> 10.201.0.1:30080");
        assert_eq!(c.rewritten, "10.201.0.1:40000 -> 10.202.1.11:8080");
        assert_eq!(mac_string(&[0, 0x1b, 2, 3, 4, 0xff]), "00:1b:02:03:04:ff");
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(700));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.sum, 60_000_750);
        assert_eq!(
            s.buckets[0],
            Bucket {
                le: Some(100),
                count: 1
            }
        );
        assert_eq!(
            s.buckets[3],
            Bucket {
                le: Some(1000),
                count: 2
            }
        );
        assert_eq!(s.buckets.last(), Some(&Bucket { le: None, count: 3 }));
    }
}
