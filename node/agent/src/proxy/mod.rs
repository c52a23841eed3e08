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
//! NodePort and LoadBalancer Services also get frontends served from outside by the tc
//! program: `<node IP>:<nodePort>`, and `<ingress IP>:<port>` for each IPv4 address of a
//! LoadBalancer Service's `status.loadBalancer.ingress` (on every node; which node the
//! traffic reaches is the L2 announcement's choice, [`crate::l2`]). With
//! `externalTrafficPolicy: Local` those keep this node's backends only, and each gets an
//! in-cluster view over every backend, which the socket programs use for connections made on
//! the node (as kube-proxy sends pods' traffic to such addresses to every endpoint).
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
//! JSON served by the agent API (see [`crate::api`]; the types are
//! [`skiff_client::node_api`]'s):
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

mod desired;
mod histogram;
mod reconciler;
mod report;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use skiff_api::api::{Endpoints, Service};
use skiff_client::controller::{CancelToken, Controller, Informer, Informers, ObjectKey};
use skiff_client::node_api::LatencyHistogram;
use skiff_datapath::BpfError;
use skiff_datapath::lb::l2::L2Announce;
use skiff_datapath::lb::{
    BackendAddr, FastPathCounters, Frontend, LbDatapath, PodEndpoint, Protocol, TcAttach,
};
use skiff_hostnet::PodAttachment;
use tracing::{debug, info, warn};

pub use desired::{DesiredPort, desired, desired_on, load_balancer_ips, to_local};
pub use histogram::{BUCKETS_US, Histogram};
use reconciler::ServiceReconciler;
pub use report::fast_path;

/// Which ServicePort programmed a frontend.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    key: ObjectKey,
    port_name: String,
}

struct ProxyState {
    lb: Box<dyn LbDatapath>,
    /// This node's name (externalTrafficPolicy Local: its own backends) and addresses
    /// (NodePort frontends are programmed for each).
    node_name: String,
    node_ips: Vec<IpAddr>,
    owners: BTreeMap<Frontend, Owner>,
    /// The pods given to the fast path by this agent: address → pod uid.
    pods: BTreeMap<IpAddr, String>,
    /// Services the agent serves itself on this node, and where: `kubernetes` (the API
    /// server passthrough), `kube-dns` (the cluster DNS).
    local: BTreeMap<ObjectKey, BackendAddr>,
    writes: u64,
    latency: Histogram,
}

/// The node's Service load balancing: the data path ([`LbDatapath`]: the loaded
/// `ServiceLb`, or a fake in tests) and who owns which frontend.
pub struct Proxy {
    inner: Mutex<ProxyState>,
    /// When a change to a Service (or its Endpoints) was first seen, until reconciled.
    seen: Arc<Mutex<HashMap<ObjectKey, Instant>>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy programming `lb` on node `node_name`, with NodePort frontends on `node_ips`.
    pub fn new(lb: impl LbDatapath + 'static, node_name: &str, node_ips: Vec<IpAddr>) -> Arc<Self> {
        Arc::new(Proxy {
            inner: Mutex::new(ProxyState {
                lb: Box::new(lb),
                node_name: node_name.to_string(),
                node_ips,
                owners: BTreeMap::new(),
                pods: BTreeMap::new(),
                local: BTreeMap::new(),
                writes: 0,
                latency: Histogram::default(),
            }),
            seen: Arc::default(),
        })
    }

    /// Sends Service `service` to `addr`, served by the agent on this node, from the next
    /// reconcile of that Service on; set before [`Proxy::run`].
    pub fn route_locally(&self, service: ObjectKey, addr: BackendAddr) {
        self.lock().local.insert(service, addr);
    }

    fn lock(&self) -> MutexGuard<'_, ProxyState> {
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
        // The address the network knows is usually the one recorded: remove it once.
        ips.sort_unstable();
        ips.dedup();
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
        inner
            .lb
            .detach_tc(&ifname)
            .map_err(|e| format!("{ifname}: {e}"))
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

    /// Answers ARP for the LoadBalancer address `ip` on the uplink as `entry` says (see
    /// [`crate::l2`]).
    pub fn set_l2_announcement(&self, ip: Ipv4Addr, entry: L2Announce) -> Result<(), BpfError> {
        self.lock().lb.set_l2_announcement(ip, entry)
    }

    /// Stops answering ARP for `ip` (missing is not an error).
    pub fn remove_l2_announcement(&self, ip: Ipv4Addr) -> Result<(), BpfError> {
        self.lock().lb.remove_l2_announcement(ip)
    }

    /// Every L2 announcement entry, expired ones included.
    pub fn l2_announcements(&self) -> Result<Vec<(Ipv4Addr, L2Announce)>, BpfError> {
        self.lock().lb.l2_announcements()
    }

    /// The fast path's counters, summed over CPUs.
    pub fn fast_path_counters(&self) -> Result<FastPathCounters, BpfError> {
        self.lock().lb.fast_path_counters()
    }

    /// `namespace/name:port` of the Service whose frontend the socket `cookie` asked for
    /// when it was balanced to `backend:port` (`proto`: IP protocol number), while the load
    /// balancer remembers the socket.
    pub fn service_of(&self, cookie: u64, backend: IpAddr, port: u16, proto: u8) -> Option<String> {
        let inner = self.lock();
        let (ip, fport) = inner.lb.frontend_of(cookie, backend, port)?;
        let protocol = Protocol::from_number(proto)?;
        let owner = inner.owners.get(&Frontend::new(ip, fport, protocol))?;
        Some(format!(
            "{}/{}:{fport}",
            owner.key.namespace, owner.key.name
        ))
    }

    /// Map writes since this proxy was created.
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    pub fn latency(&self) -> LatencyHistogram {
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
        let ProxyState {
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

#[cfg(test)]
mod fake_tests;
#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod podnet_kernel_tests;

#[cfg(test)]
mod tests {
    use super::*;

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
}
