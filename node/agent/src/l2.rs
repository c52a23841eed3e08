//! L2 announcement of LoadBalancer addresses (bare-metal `type: LoadBalancer`, as MetalLB's
//! and Cilium's L2 modes): for each IPv4 address of a Service's `status.loadBalancer.ingress`,
//! one node at a time answers ARP for it on its uplink, so the segment sends that address's
//! traffic to it; the eBPF load balancer (the address is a frontend on every node, see
//! [`crate::proxy`]) then serves it.
//!
//! One election per address: a `coordination.k8s.io/v1` Lease `kube-system/skiff-l2-<ip with
//! dashes>` (label `skiff.io/l2-announcement=true`), holder the node name, for Services
//! without a `loadBalancerClass` or of class `skiff.io/lb`. Eligible nodes:
//! with `externalTrafficPolicy: Cluster`, every node whose Node is Ready and does not carry
//! `node.kubernetes.io/exclude-from-external-load-balancers`; with `Local`, only those with
//! a ready endpoint of the Service on the node (Cilium's rule). The holder renews every
//! second with a 3 s duration; a candidate takes the Lease over when it has no holder, or
//! when its record has not changed for its duration as observed by the candidate (client-go's
//! rule, no clock synchronisation assumed): a dead holder is replaced within about 3 s. Every
//! write is a compare-and-swap on the Lease's resourceVersion, so two nodes never both win.
//!
//! The holder writes the address into the `L2_ANNOUNCE` map (`skiff_datapath::lb::l2`) with
//! the Lease's expiry as deadline (the start of the successful write + the duration, on the
//! program's clock) and refreshes it at every renewal; on becoming holder it also sends three
//! gratuitous ARPs (`skiff_hostnet::garp`, from the node's namespace). A lost Lease removes
//! the entry at once, and a holder that could not renew for 2 s steps down and removes it,
//! both before the expiry others wait for; an agent that died leaves its entry, which the
//! program stops answering at the deadline. A stopped agent releases its Leases (a
//! candidate takes over at once). Entries no election of this agent holds are removed.
//!
//! Level-triggered and watch-driven: informers on Services, Endpoints, Nodes and these
//! Leases wake the loop, which recomputes everything; the renewals and the expiries of other
//! holders are its only timers.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use skiff_api::api::{Endpoints, Lease, LeaseSpec, Node, ObjectMeta, Service};
use skiff_client::controller::{CancelToken, Informer, Informers, ObjectKey};
use skiff_client::{Api, Client, ClientError, ListParams};
use skiff_datapath::lb::l2::{L2_FLAG_ANNOUNCE, L2Announce, monotonic_ns};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::proxy::{Proxy, load_balancer_ips};

/// Where the election Leases live.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// Every election Lease's name starts with this (the Node authorizer lets nodes write only
/// such Leases there).
pub const LEASE_PREFIX: &str = "skiff-l2-";
/// The label every election Lease carries (the agents watch only those).
pub const LEASE_LABEL: &str = "skiff.io/l2-announcement";
/// The `spec.loadBalancerClass` Skiff implements (also: none). Services of another class are
/// some other implementation's to announce.
pub const LB_CLASS: &str = "skiff.io/lb";
/// Nodes with this label never announce (Kubernetes' well-known label).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// How long a Lease holds without renewal.
const LEASE_DURATION: Duration = Duration::from_secs(3);
/// How often the holder renews.
const RENEW_PERIOD: Duration = Duration::from_secs(1);
/// A holder that could not renew for this long stops announcing (before the expiry).
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
/// How soon a failed write is tried again.
const RETRY: Duration = Duration::from_millis(250);
/// Bound of one API call.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Gratuitous ARPs sent when an address is taken, and their spacing.
const GARP_COUNT: u32 = 3;
const GARP_GAP: Duration = Duration::from_millis(100);

/// The election Lease of `ip`: `skiff-l2-192-168-100-240`.
pub fn lease_name(ip: Ipv4Addr) -> String {
    format!("{LEASE_PREFIX}{}", ip.to_string().replace('.', "-"))
}

/// Whether node `node` (with its Node object) may announce LoadBalancer addresses at all.
pub fn node_eligible(node: Option<&Node>) -> bool {
    let Some(node) = node else { return false };
    let excluded = node
        .metadata
        .as_ref()
        .is_some_and(|m| m.labels.contains_key(EXCLUDE_LABEL));
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == "Ready"))
        .is_some_and(|c| c.status == "True");
    ready && !excluded
}

/// The addresses node `node` is a candidate for (pure): every IPv4 LoadBalancer ingress
/// address of `services` without a `loadBalancerClass` or of [`LB_CLASS`], except those of `externalTrafficPolicy: Local` Services without a
/// ready endpoint on `node` (`endpoints_of` a Service's key). None when the node is not
/// eligible ([`node_eligible`]).
pub fn candidate_addresses(
    services: &[Arc<Service>],
    endpoints_of: impl Fn(&ObjectKey) -> Option<Arc<Endpoints>>,
    node: &str,
    eligible: bool,
) -> BTreeSet<Ipv4Addr> {
    let mut out = BTreeSet::new();
    if !eligible {
        return out;
    }
    for svc in services {
        let ips = load_balancer_ips(svc);
        let ours = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_class.as_deref())
            .is_none_or(|c| c == LB_CLASS);
        if ips.is_empty() || !ours {
            continue;
        }
        let local = svc
            .spec
            .as_ref()
            .is_some_and(|s| s.external_traffic_policy == "Local");
        if local {
            let eps = endpoints_of(&ObjectKey::of(&**svc));
            let here = eps.as_deref().is_some_and(|e| {
                e.subsets
                    .iter()
                    .flat_map(|s| &s.addresses)
                    .any(|a| a.node_name.as_deref() == Some(node))
            });
            if !here {
                continue;
            }
        }
        out.extend(ips);
    }
    out
}

/// Whether `spec`, last seen changing at `observed` (our clock), is held by someone other
/// than `me` and not expired at `now`.
fn held_by_other(spec: &LeaseSpec, me: &str, observed: Instant, now: Instant) -> bool {
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder.is_empty() || holder == me {
        return false;
    }
    let secs = spec.lease_duration_seconds.unwrap_or(1).max(1);
    now < observed + Duration::from_secs(secs as u64)
}

/// An API call that failed or did not answer within [`CALL_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error(transparent)]
    Api(#[from] ClientError),
    #[error("no answer from the API server within {0:?}")]
    Timeout(Duration),
}

impl CallError {
    /// Someone else wrote (or removed) the Lease meanwhile.
    fn lost_race(&self) -> bool {
        matches!(self, CallError::Api(e) if e.is_conflict() || e.is_already_exists() || e.is_not_found())
    }
}

/// `f`, bounded by [`CALL_TIMEOUT`].
async fn call<T>(f: impl Future<Output = Result<T, ClientError>>) -> Result<T, CallError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r.map_err(CallError::Api),
        Err(_) => Err(CallError::Timeout(CALL_TIMEOUT)),
    }
}

fn now_micros() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// An address this agent holds.
struct Held {
    /// The Lease as our last write returned it (the next renewal's compare-and-swap base).
    lease: Lease,
    /// When the last successful write started.
    renewed_at: Instant,
    /// When to renew (or retry) next.
    next: Instant,
}

/// The announcer: elections for the addresses this node is a candidate for.
pub struct L2Announcer {
    node: String,
    api: Api<Lease>,
    proxy: Arc<Proxy>,
    /// The node's namespace (`None`: the agent's) and its uplink.
    netns: Option<PathBuf>,
    uplink: String,
    held: BTreeMap<Ipv4Addr, Held>,
    /// When each Lease (name → resourceVersion) was last seen changing.
    observed: BTreeMap<String, (String, Instant)>,
}

impl std::fmt::Debug for L2Announcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("L2Announcer")
            .field("node", &self.node)
            .field("uplink", &self.uplink)
            .field("held", &self.held.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

enum Attempt {
    Held(Box<Lease>),
    NotHeld,
}

impl L2Announcer {
    pub fn new(
        client: &Client,
        node: &str,
        proxy: Arc<Proxy>,
        netns: Option<PathBuf>,
        uplink: &str,
    ) -> Self {
        L2Announcer {
            node: node.to_string(),
            api: client.namespaced::<Lease>(LEASE_NAMESPACE),
            proxy,
            netns,
            uplink: uplink.to_string(),
            held: BTreeMap::new(),
            observed: BTreeMap::new(),
        }
    }

    /// Runs until `shutdown` is cancelled, then releases what it holds.
    pub async fn run(mut self, informers: Informers, shutdown: CancelToken) {
        let services = informers.get::<Service>();
        let endpoints = informers.get::<Endpoints>();
        let nodes = informers.get::<Node>();
        let leases = Informer::new(
            informers.client().api::<Lease>(Some(LEASE_NAMESPACE)),
            ListParams::default().labels(&format!("{LEASE_LABEL}=true")),
        );
        tokio::select! {
            () = async {
                informers.wait_synced().await;
                leases.wait_synced().await;
            } => {}
            () = shutdown.cancelled() => return,
        }
        let (mut s, mut e, mut n, mut l) = (
            services.subscribe(),
            endpoints.subscribe(),
            nodes.subscribe(),
            leases.subscribe(),
        );
        info!(uplink = %self.uplink, "L2 announcement of LoadBalancer addresses running");
        loop {
            // Catch up with every change so far; the pass below reads the caches.
            while s.try_recv().is_some() || e.try_recv().is_some() {}
            while n.try_recv().is_some() || l.try_recv().is_some() {}
            let eligible = node_eligible(nodes.get(&ObjectKey::new("", &self.node)).as_deref());
            let want =
                candidate_addresses(&services.list(), |k| endpoints.get(k), &self.node, eligible);
            let wake = self.pass(&want, &leases).await;
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = s.recv() => {}
                _ = e.recv() => {}
                _ = n.recv() => {}
                _ = l.recv() => {}
                () = shutdown.cancelled() => break,
            }
        }
        let held: Vec<Ipv4Addr> = self.held.keys().copied().collect();
        for ip in held {
            self.give_up(ip, true).await;
        }
    }

    /// One pass over the elections: renew, take or wait for each wanted address, give up
    /// the others, remove map entries nobody holds. Returns when to wake at the latest.
    async fn pass(&mut self, want: &BTreeSet<Ipv4Addr>, leases: &Informer<Lease>) -> Instant {
        let now = Instant::now();
        let mut wake = now + Duration::from_secs(60);
        for lease in leases.list() {
            let Some(m) = lease.metadata.as_ref() else {
                continue;
            };
            let seen = self.observed.get(&m.name).map(|(rv, _)| rv.as_str());
            if seen != Some(m.resource_version.as_str()) {
                self.observed
                    .insert(m.name.clone(), (m.resource_version.clone(), now));
            }
        }
        for ip in want {
            let name = lease_name(*ip);
            if let Some(h) = self.held.get(ip) {
                if now >= h.next {
                    self.renew(*ip).await;
                }
            } else {
                let cached = leases.get(&ObjectKey::new(LEASE_NAMESPACE, &name));
                let taken = cached.as_ref().and_then(|l| {
                    let spec = l.spec.as_ref()?;
                    let (_, at) = self.observed.get(&name)?;
                    held_by_other(spec, &self.node, *at, now).then(|| {
                        let secs = spec.lease_duration_seconds.unwrap_or(1).max(1) as u64;
                        *at + Duration::from_secs(secs)
                    })
                });
                match taken {
                    Some(expiry) => wake = wake.min(expiry),
                    None => {
                        if !self.acquire(*ip).await {
                            wake = wake.min(Instant::now() + RETRY);
                        }
                    }
                }
            }
            if let Some(h) = self.held.get(ip) {
                wake = wake.min(h.next);
            }
        }
        let gone: Vec<Ipv4Addr> = self
            .held
            .keys()
            .filter(|ip| !want.contains(ip))
            .copied()
            .collect();
        for ip in gone {
            self.give_up(ip, true).await;
        }
        self.observed
            .retain(|name, _| leases.get(&ObjectKey::new(LEASE_NAMESPACE, name)).is_some());
        self.remove_stale_entries();
        wake
    }

    /// Tries to take `ip`'s Lease (free, expired, or ours from an earlier run). Returns
    /// false when the API server did not answer (try again soon).
    async fn acquire(&mut self, ip: Ipv4Addr) -> bool {
        let started = Instant::now();
        let started_ns = monotonic_ns();
        match self.try_take(ip).await {
            Ok(Attempt::Held(lease)) => {
                info!(address = %ip, "took the L2 announcement lease");
                self.held.insert(
                    ip,
                    Held {
                        lease: *lease,
                        renewed_at: started,
                        next: started + RENEW_PERIOD,
                    },
                );
                if self.announce(ip, started_ns) {
                    self.gratuitous_arp(ip);
                }
                true
            }
            Ok(Attempt::NotHeld) => {
                debug!(address = %ip, "L2 announcement lease held elsewhere");
                true
            }
            Err(e) => {
                warn!(address = %ip, error = %e, "cannot take the L2 announcement lease");
                false
            }
        }
    }

    /// Renews `ip`'s Lease; a lost Lease, or no renewal for [`RENEW_DEADLINE`], stops the
    /// announcement.
    async fn renew(&mut self, ip: Ipv4Addr) {
        let Some(h) = self.held.get(&ip) else { return };
        let mut lease = h.lease.clone();
        let started = Instant::now();
        let started_ns = monotonic_ns();
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = now_micros();
            spec.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
        }
        match call(self.api.update(&lease)).await {
            Ok(updated) => {
                if let Some(h) = self.held.get_mut(&ip) {
                    h.lease = updated;
                    h.renewed_at = started;
                    h.next = started + RENEW_PERIOD;
                }
                self.announce(ip, started_ns);
            }
            Err(e) if e.lost_race() => {
                // Someone else wrote it: see whether it is still ours.
                match self.try_take(ip).await {
                    Ok(Attempt::Held(l)) => {
                        if let Some(h) = self.held.get_mut(&ip) {
                            h.lease = *l;
                            h.renewed_at = started;
                            h.next = started + RENEW_PERIOD;
                        }
                        self.announce(ip, started_ns);
                    }
                    _ => {
                        warn!(address = %ip, "lost the L2 announcement lease");
                        self.give_up(ip, false).await;
                    }
                }
            }
            Err(e) => {
                let since = started.duration_since(h_renewed(&self.held, ip));
                if since >= RENEW_DEADLINE {
                    warn!(address = %ip, error = %e, "could not renew the L2 announcement lease in time; stopping");
                    self.give_up(ip, false).await;
                } else {
                    debug!(address = %ip, error = %e, "renewing the L2 announcement lease failed");
                    if let Some(h) = self.held.get_mut(&ip) {
                        h.next = Instant::now() + RETRY;
                    }
                }
            }
        }
    }

    /// Takes the Lease if nobody else holds it (as observed), with a compare-and-swap.
    async fn try_take(&mut self, ip: Ipv4Addr) -> Result<Attempt, CallError> {
        let name = lease_name(ip);
        let now = now_micros();
        let seconds = LEASE_DURATION.as_secs() as i32;
        let current = call(self.api.get_opt(&name)).await?;
        let result = match current {
            None => {
                let lease = Lease {
                    metadata: Some(ObjectMeta {
                        name: name.clone(),
                        namespace: LEASE_NAMESPACE.into(),
                        labels: [(LEASE_LABEL.to_string(), "true".to_string())].into(),
                        ..Default::default()
                    }),
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.node.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: now.clone(),
                        renew_time: now,
                        lease_transitions: Some(0),
                    }),
                    ..Default::default()
                };
                call(self.api.create(&lease)).await
            }
            Some(mut lease) => {
                let old = lease.spec.clone().unwrap_or_default();
                let rv = lease
                    .metadata
                    .as_ref()
                    .map(|m| m.resource_version.clone())
                    .unwrap_or_default();
                let at = match self.observed.get(&name) {
                    Some((seen, at)) if *seen == rv => *at,
                    _ => {
                        let at = Instant::now();
                        self.observed.insert(name.clone(), (rv, at));
                        at
                    }
                };
                if held_by_other(&old, &self.node, at, Instant::now()) {
                    return Ok(Attempt::NotHeld);
                }
                let ours = old.holder_identity.as_deref() == Some(self.node.as_str());
                let spec = lease.spec.get_or_insert_with(Default::default);
                spec.holder_identity = Some(self.node.clone());
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = now.clone();
                if !ours {
                    spec.acquire_time = now;
                    spec.lease_transitions =
                        Some(old.lease_transitions.unwrap_or(0).saturating_add(1));
                }
                if let Some(m) = lease.metadata.as_mut() {
                    m.labels.insert(LEASE_LABEL.into(), "true".into());
                }
                call(self.api.update(&lease)).await
            }
        };
        match result {
            Ok(lease) => Ok(Attempt::Held(Box::new(lease))),
            Err(e) if e.lost_race() => Ok(Attempt::NotHeld),
            Err(e) => Err(e),
        }
    }

    /// Writes `ip`'s map entry with the deadline `started_ns` + the lease duration. Returns
    /// whether it was written.
    fn announce(&self, ip: Ipv4Addr, started_ns: u64) -> bool {
        let link = skiff_hostnet::run_in_netns_scoped(self.netns.as_deref(), || {
            skiff_hostnet::garp::link(&self.uplink)
        });
        let (ifindex, mac) = match link {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                warn!(uplink = %self.uplink, error = %e, "L2 announcement: reading the uplink");
                return false;
            }
            Err(e) => {
                warn!(error = %e, "L2 announcement: entering the node's namespace");
                return false;
            }
        };
        let entry = L2Announce {
            deadline_ns: started_ns.saturating_add(LEASE_DURATION.as_nanos() as u64),
            ifindex,
            flags: L2_FLAG_ANNOUNCE,
            mac,
            _pad: [0; 2],
        };
        match self.proxy.set_l2_announcement(ip, entry) {
            Ok(()) => true,
            Err(e) => {
                warn!(address = %ip, error = %e, "L2 announcement: writing the map");
                false
            }
        }
    }

    /// Sends the gratuitous ARPs for `ip` in the background.
    fn gratuitous_arp(&self, ip: Ipv4Addr) {
        let (netns, uplink) = (self.netns.clone(), self.uplink.clone());
        tokio::task::spawn_blocking(move || {
            let sent = skiff_hostnet::run_in_netns_scoped(netns.as_deref(), || {
                let (ifindex, mac) = skiff_hostnet::garp::link(&uplink)?;
                skiff_hostnet::garp::announce(ifindex, mac, ip, GARP_COUNT, GARP_GAP)
            });
            match sent {
                Ok(Ok(())) => debug!(address = %ip, %uplink, "sent gratuitous ARP"),
                Ok(Err(e)) => warn!(address = %ip, error = %e, "gratuitous ARP"),
                Err(e) => warn!(address = %ip, error = %e, "gratuitous ARP: node namespace"),
            }
        });
    }

    /// Stops announcing `ip` (the map entry first), releasing its Lease when `release`.
    async fn give_up(&mut self, ip: Ipv4Addr, release: bool) {
        if let Err(e) = self.proxy.remove_l2_announcement(ip) {
            warn!(address = %ip, error = %e, "L2 announcement: removing the map entry");
        }
        let Some(h) = self.held.remove(&ip) else {
            return;
        };
        info!(address = %ip, "stopped announcing");
        if !release {
            return;
        }
        let mut lease = h.lease;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = now_micros();
        }
        match call(self.api.update(&lease)).await {
            Ok(_) => debug!(address = %ip, "released the L2 announcement lease"),
            Err(e) => debug!(address = %ip, error = %e, "releasing the L2 announcement lease"),
        }
    }

    /// Removes map entries of addresses this agent does not hold (an earlier agent's).
    fn remove_stale_entries(&self) {
        let entries = match self.proxy.l2_announcements() {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, "L2 announcement: reading the map");
                return;
            }
        };
        for (ip, _) in entries {
            if !self.held.contains_key(&ip)
                && let Err(e) = self.proxy.remove_l2_announcement(ip)
            {
                warn!(address = %ip, error = %e, "L2 announcement: removing a stale entry");
            }
        }
    }
}

/// When `ip`'s Lease was last renewed (now if it is not held).
fn h_renewed(held: &BTreeMap<Ipv4Addr, Held>, ip: Ipv4Addr) -> Instant {
    held.get(&ip).map_or_else(Instant::now, |h| h.renewed_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        Condition, EndpointAddress, EndpointSubset, LoadBalancerIngress, LoadBalancerStatus,
        NodeStatus, ServiceSpec, ServiceStatus,
    };

    fn lb_service(name: &str, ip: &str, policy: &str) -> Arc<Service> {
        Arc::new(Service {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: "default".into(),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                r#type: "LoadBalancer".into(),
                external_traffic_policy: policy.into(),
                ..Default::default()
            }),
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: vec![LoadBalancerIngress {
                        ip: ip.into(),
                        ..Default::default()
                    }],
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn endpoints_on(nodes: &[&str]) -> Arc<Endpoints> {
        Arc::new(Endpoints {
            subsets: vec![EndpointSubset {
                addresses: nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| EndpointAddress {
                        ip: format!("10.244.0.{}", i + 2),
                        node_name: Some(n.to_string()),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    #[test]
    fn lease_names_are_valid_object_names() {
        assert_eq!(
            lease_name(Ipv4Addr::new(192, 168, 100, 240)),
            "skiff-l2-192-168-100-240"
        );
    }

    #[test]
    fn local_services_are_announced_only_by_nodes_with_an_endpoint() {
        let services = vec![
            lb_service("cluster", "192.168.100.240", "Cluster"),
            lb_service("local", "192.168.100.241", "Local"),
            lb_service("pending", "", "Cluster"),
        ];
        let eps = |k: &ObjectKey| (k.name == "local").then(|| endpoints_on(&["n1"]));
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            candidate_addresses(&services, eps, "n1", true),
            [ip("192.168.100.240"), ip("192.168.100.241")].into()
        );
        assert_eq!(
            candidate_addresses(&services, eps, "n2", true),
            [ip("192.168.100.240")].into()
        );
        assert!(candidate_addresses(&services, eps, "n1", false).is_empty());
        // Another implementation's class: not ours to announce.
        let mut other = (*lb_service("other", "192.168.100.242", "Cluster")).clone();
        if let Some(spec) = other.spec.as_mut() {
            spec.load_balancer_class = Some("example.com/lb".into());
        }
        assert!(candidate_addresses(&[Arc::new(other)], eps, "n1", true).is_empty());
    }

    #[test]
    fn only_ready_nodes_without_the_exclusion_label_are_eligible() {
        let node = |ready: &str, excluded: bool| Node {
            metadata: Some(ObjectMeta {
                name: "n1".into(),
                labels: if excluded {
                    [(EXCLUDE_LABEL.to_string(), String::new())].into()
                } else {
                    Default::default()
                },
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: vec![Condition {
                    r#type: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(node_eligible(Some(&node("True", false))));
        assert!(!node_eligible(Some(&node("False", false))));
        assert!(!node_eligible(Some(&node("True", true))));
        assert!(!node_eligible(None));
    }

    #[test]
    fn a_lease_is_taken_over_once_unchanged_for_its_duration() {
        let spec = |holder: Option<&str>| LeaseSpec {
            holder_identity: holder.map(String::from),
            lease_duration_seconds: Some(3),
            ..Default::default()
        };
        let t0 = Instant::now();
        assert!(held_by_other(&spec(Some("n2")), "n1", t0, t0));
        assert!(held_by_other(
            &spec(Some("n2")),
            "n1",
            t0,
            t0 + Duration::from_millis(2900)
        ));
        assert!(!held_by_other(
            &spec(Some("n2")),
            "n1",
            t0,
            t0 + Duration::from_secs(3)
        ));
        assert!(!held_by_other(&spec(Some("n1")), "n1", t0, t0), "ours");
        assert!(!held_by_other(&spec(None), "n1", t0, t0), "released");
    }
}
