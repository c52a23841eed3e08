//! The lbipam controller: gives LoadBalancer Services their addresses from
//! LoadBalancerIPPools (`skiff.io/v1`), as Cilium's LB-IPAM and MetalLB's controller do, and
//! keeps the pools' status.
//!
//! - A Service of type LoadBalancer with no `spec.loadBalancerClass` (or
//!   `skiff.io/lb`) gets one address of each family of `spec.ipFamilies` (IPv4 when empty),
//!   written to `status.loadBalancer.ingress[] {ip, ipMode: VIP}` through the status
//!   subresource. It comes from the first pool by name that selects the Service
//!   (`serviceSelector`), is enabled and is not in conflict: the lowest address no other
//!   Service holds.
//! - A Service that asks for addresses (the `skiff.io/lb-ips` annotation, else
//!   `spec.loadBalancerIP`) gets exactly those, when a pool that selects it holds them and
//!   no earlier Service has them; else nothing of that family, and a Warning.
//! - Services' status is the record: which Service holds which address is read from the
//!   Services themselves every time, so a restarted controller (or a new leader) hands out
//!   nothing twice and moves nobody. An address two Services claim belongs to the one created
//!   first (then by namespace/name); the other gets a new one. A Service keeps its address
//!   while its pool still selects it (also when the pool is disabled).
//! - An address is free again when its Service is deleted, stops being a LoadBalancer
//!   (its ingress is cleared) or moves to another class; Services that waited for one are
//!   tried again then.
//! - When nothing can be given, the Service gets a Warning Event `AllocationFailed` saying
//!   why (no pool selects it, its pools are full, its address is another Service's).
//! - Each pool's status: conditions `skiff.io/IPsTotal`, `skiff.io/IPsAvailable`,
//!   `skiff.io/IPsUsed` (status `Unknown`, the count in `message`) and
//!   `skiff.io/PoolConflict` (`True` when a block overlaps a pool created earlier, which
//!   keeps the addresses; the newer pool then hands out nothing). The API server refuses
//!   overlapping pools; a conflict needs two creates racing.
//!
//! Decisions are taken one at a time, under one lock, from the informers plus the writes of
//! this controller the informer does not show yet, so two Services are never given the same
//! address even with several workers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::{
    Condition, Endpoints, LoadBalancerIngress, LoadBalancerIpPool, LoadBalancerIpPoolStatus,
    LoadBalancerStatus, Node, Service, ServiceStatus,
};
use skiff_api::lb_pool::{self, Block};
use skiff_client::Client;
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, EventType, Informer, Informers, ObjectKey,
    Reconciler,
};

use crate::util::{creation_timestamp, generation, set_condition};
use crate::{Context, Error};

/// The Event reason when a Service gets no address (or not all it needs).
pub const ALLOCATION_FAILED: &str = "AllocationFailed";
/// The `ipMode` written with every address: the nodes deliver traffic to it as is.
pub const IP_MODE: &str = "VIP";

/// How long a reconcile waits for the informer to show its own write.
const OBSERVE_WRITE: Duration = Duration::from_secs(5);

/// A pool as allocation sees it.
#[derive(Debug, Clone)]
pub struct Pool {
    pub object: Arc<LoadBalancerIpPool>,
    pub blocks: Vec<Block>,
    /// The older pool it overlaps, if any.
    pub conflict: Option<String>,
}

impl Pool {
    fn name(&self) -> &str {
        self.object.name()
    }

    fn disabled(&self) -> bool {
        self.object.spec.as_ref().is_some_and(|s| s.disabled)
    }

    fn holds(&self, ip: IpAddr) -> bool {
        self.blocks.iter().any(|b| b.usable.contains(ip))
    }
}

/// Every pool, sorted by name, with its conflict: a pool conflicts when a block overlaps
/// a block of a pool created before it (creationTimestamp, then name).
pub fn pools(objects: &[Arc<LoadBalancerIpPool>]) -> Vec<Pool> {
    let mut by_age: Vec<&Arc<LoadBalancerIpPool>> = objects.iter().collect();
    by_age.sort_by(|a, b| {
        (creation_timestamp(&***a), a.name()).cmp(&(creation_timestamp(&***b), b.name()))
    });
    let mut out: Vec<Pool> = Vec::new();
    for o in by_age {
        let blocks = lb_pool::blocks(o);
        let conflict = out
            .iter()
            .find(|p| {
                p.blocks
                    .iter()
                    .any(|a| blocks.iter().any(|b| a.full.overlaps(&b.full)))
            })
            .map(|p| p.name().to_string());
        out.push(Pool {
            object: Arc::clone(o),
            blocks,
            conflict,
        });
    }
    out.sort_by(|a, b| a.name().cmp(b.name()));
    out
}

/// The addresses in a Service's status.
pub fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .iter()
        .flat_map(|s| &s.load_balancer)
        .flat_map(|lb| &lb.ingress)
        .filter_map(|i| i.ip.parse().ok())
        .collect()
}

/// Which Service holds each address: every LoadBalancer Service's status (any class: a
/// foreign implementation's addresses are not handed out either), with `pending` (writes
/// not in the informer yet) in place of what the informer shows. An address claimed twice
/// is the earliest-created Service's (then by namespace/name).
pub fn holders(
    services: &[Arc<Service>],
    pending: &HashMap<ObjectKey, Vec<IpAddr>>,
) -> BTreeMap<IpAddr, ObjectKey> {
    let mut claims: BTreeMap<IpAddr, Vec<(String, ObjectKey)>> = BTreeMap::new();
    for svc in services {
        let key = ObjectKey::of(&**svc);
        let is_lb = svc
            .spec
            .as_ref()
            .is_some_and(|s| s.r#type == "LoadBalancer");
        let ips = match pending.get(&key) {
            Some(ips) => ips.clone(),
            None if is_lb => ingress_ips(svc),
            None => Vec::new(),
        };
        for ip in ips {
            claims
                .entry(ip)
                .or_default()
                .push((creation_timestamp(&**svc).to_string(), key.clone()));
        }
    }
    claims
        .into_iter()
        .filter_map(|(ip, mut c)| {
            c.sort();
            c.into_iter().next().map(|(_, k)| (ip, k))
        })
        .collect()
}

/// Whether `e` is the API servers' Endpoints (`default/kubernetes`).
fn is_api_servers(e: &Endpoints) -> bool {
    e.metadata
        .as_ref()
        .is_some_and(|m| m.namespace == "default" && m.name == "kubernetes")
}

/// What a Service is to get.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    /// Its addresses, in the order of its families.
    pub ips: Vec<IpAddr>,
    /// Why a family got none.
    pub failures: Vec<String>,
}

/// The addresses `svc` (key `key`) is to have, given the pools, who holds what, and the
/// addresses no Service may have ([`lb_pool::reserved`]: nodes' and API servers', with
/// whose they are).
pub fn decide(
    svc: &Service,
    key: &ObjectKey,
    pools: &[Pool],
    holders: &BTreeMap<IpAddr, ObjectKey>,
    reserved: &BTreeMap<IpAddr, String>,
) -> Decision {
    let mut d = Decision::default();
    let requested = match lb_pool::requested(svc) {
        Ok(r) => r,
        Err(why) => {
            d.failures.push(format!(
                "cannot read the requested addresses ({}): {why}",
                lb_pool::request_field(svc)
            ));
            return d;
        }
    };
    let serving: Vec<&Pool> = pools
        .iter()
        .filter(|p| p.conflict.is_none() && lb_pool::selects(&p.object, svc))
        .collect();
    let current = ingress_ips(svc);
    let other = |ip: &IpAddr| holders.get(ip).filter(|k| *k != key);
    // An address it may have: in a pool that serves it and no one else's.
    let keepable = |ip: IpAddr| {
        serving.iter().any(|p| p.holds(ip)) && other(&ip).is_none() && !reserved.contains_key(&ip)
    };
    for family in lb_pool::wanted_families(svc) {
        let of_family = |ip: &&IpAddr| lb_pool::family(**ip) == family;
        if let Some(want) = requested.iter().find(of_family) {
            let fits = serving
                .iter()
                .any(|p| p.holds(*want) && (!p.disabled() || current.contains(want)));
            if let Some(whose) = reserved.get(want) {
                d.failures.push(format!(
                    "the requested address {want} is {whose}: no Service may have it"
                ));
            } else if let Some(holder) = other(want) {
                d.failures.push(format!(
                    "the requested address {want} is already allocated to service {holder}"
                ));
            } else if !fits {
                d.failures.push(format!(
                    "the requested address {want} is not in an enabled LoadBalancerIPPool \
                     that selects the service"
                ));
            } else {
                d.ips.push(*want);
            }
            continue;
        }
        if let Some(keep) = current.iter().find(of_family).filter(|ip| keepable(**ip)) {
            d.ips.push(*keep);
            continue;
        }
        let mut taken: BTreeSet<IpAddr> = holders
            .iter()
            .filter(|(_, k)| *k != key)
            .map(|(ip, _)| *ip)
            .collect();
        taken.extend(d.ips.iter().copied());
        taken.extend(reserved.keys().copied());
        let v6 = family == "IPv6";
        let enabled: Vec<&&Pool> = serving.iter().filter(|p| !p.disabled()).collect();
        let free = enabled.iter().find_map(|p| {
            p.blocks
                .iter()
                .filter(|b| b.usable.is_ipv6() == v6)
                .find_map(|b| b.usable.first_free(&taken))
        });
        match free {
            Some(ip) => d.ips.push(ip),
            None if enabled.is_empty() => d.failures.push(format!(
                "no enabled LoadBalancerIPPool selects the service (for an {family} address)"
            )),
            None => {
                let names: Vec<&str> = enabled.iter().map(|p| p.name()).collect();
                d.failures.push(format!(
                    "no free {family} address in the LoadBalancerIPPools that select the \
                     service ({})",
                    names.join(", ")
                ));
            }
        }
    }
    d
}

/// The status `svc` should have with `ips`: its ingress replaced, everything else kept.
fn with_ingress(svc: &Service, ips: &[IpAddr]) -> Service {
    let mut out = svc.clone();
    let status = out.status.get_or_insert_with(ServiceStatus::default);
    let lb = status
        .load_balancer
        .get_or_insert_with(LoadBalancerStatus::default);
    lb.ingress = ips
        .iter()
        .map(|ip| LoadBalancerIngress {
            ip: ip.to_string(),
            ip_mode: Some(IP_MODE.into()),
            ..Default::default()
        })
        .collect();
    if lb.ingress.is_empty() {
        status.load_balancer = None;
    }
    out
}

/// The counts and conflict of one pool as its status conditions (times and generation
/// left to [`set_condition`] and the caller).
pub fn pool_conditions(pool: &Pool, holders: &BTreeMap<IpAddr, ObjectKey>) -> Vec<Condition> {
    let total = pool
        .blocks
        .iter()
        .fold(0u128, |n, b| n.saturating_add(b.usable.len()));
    let used = holders.keys().filter(|ip| pool.holds(**ip)).count() as u128;
    let count = |ty: &str, n: u128| Condition {
        r#type: ty.into(),
        status: "Unknown".into(),
        reason: "Counted".into(),
        message: n.to_string(),
        ..Default::default()
    };
    let conflict = match &pool.conflict {
        Some(older) => Condition {
            r#type: lb_pool::POOL_CONFLICT.into(),
            status: "True".into(),
            reason: "Overlap".into(),
            message: format!(
                "a block overlaps LoadBalancerIPPool {older:?}, created earlier: no address \
                 of this pool is handed out"
            ),
            ..Default::default()
        },
        None => Condition {
            r#type: lb_pool::POOL_CONFLICT.into(),
            status: "False".into(),
            reason: "NoConflict".into(),
            ..Default::default()
        },
    };
    vec![
        count(lb_pool::IPS_TOTAL, total),
        count(lb_pool::IPS_AVAILABLE, total.saturating_sub(used)),
        count(lb_pool::IPS_USED, used),
        conflict,
    ]
}

/// The Services that might get something from a freed address or a pool change: managed
/// ones without all the addresses they want.
fn waiting(services: &Informer<Service>) -> Vec<ObjectKey> {
    services
        .list()
        .iter()
        .filter(|s| {
            lb_pool::is_managed(s) && ingress_ips(s).len() < lb_pool::wanted_families(s).len()
        })
        .map(|s| ObjectKey::of(&**s))
        .collect()
}

/// The Services holding one of `addresses`, and those waiting for addresses.
fn holding_or_waiting(
    services: &Informer<Service>,
    addresses: &BTreeMap<IpAddr, String>,
) -> Vec<ObjectKey> {
    let mut keys: Vec<ObjectKey> = services
        .list()
        .iter()
        .filter(|s| ingress_ips(s).iter().any(|ip| addresses.contains_key(ip)))
        .map(|s| ObjectKey::of(&**s))
        .collect();
    keys.extend(waiting(services));
    keys
}

/// The Service half: addresses of Services.
pub struct LbIpam {
    client: Client,
    recorder: EventRecorder,
    services: Informer<Service>,
    pools: Informer<LoadBalancerIpPool>,
    /// Whose addresses are reserved: the nodes', and the API servers' (`default/kubernetes`).
    nodes: Informer<Node>,
    endpoints: Informer<Endpoints>,
    /// Our writes of each Service's addresses (and their resourceVersion) until the
    /// informer shows them; held while deciding, so decisions happen one at a time.
    pending: tokio::sync::Mutex<HashMap<ObjectKey, (u64, Vec<IpAddr>)>>,
}

impl std::fmt::Debug for LbIpam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LbIpam").finish_non_exhaustive()
    }
}

impl LbIpam {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        LbIpam {
            client: informers.client().clone(),
            recorder,
            services: informers.get::<Service>(),
            pools: informers.get::<LoadBalancerIpPool>(),
            nodes: informers.get::<Node>(),
            endpoints: informers.get::<Endpoints>(),
            pending: tokio::sync::Mutex::default(),
        }
    }

    /// Services; every pool change, and every change of a Service holding addresses (which
    /// may free one), queues the Services still waiting for addresses; a Node or the API
    /// servers' Endpoints changing queues the Services holding one of their addresses (it is
    /// theirs now) and those waiting.
    pub fn controller(informers: &Informers) -> Controller<Service> {
        let services = informers.get::<Service>();
        let pools = informers.get::<LoadBalancerIpPool>();
        let (for_pools, for_services) = (services.clone(), services.clone());
        let (for_nodes, for_endpoints) = (services.clone(), services.clone());
        Controller::<Service>::new(informers)
            .named("lbipam")
            .watches(&pools, move |_: &LoadBalancerIpPool| {
                for_pools
                    .list()
                    .iter()
                    .filter(|s| lb_pool::is_managed(s) || !ingress_ips(s).is_empty())
                    .map(|s| ObjectKey::of(&**s))
                    .collect()
            })
            // A Node changes often (its status): only the Services holding one of its
            // addresses, and those waiting (an address it gave up may be free now).
            .watches(&informers.get::<Node>(), move |node: &Node| {
                holding_or_waiting(&for_nodes, &lb_pool::reserved(&[node], None))
            })
            .watches(&informers.get::<Endpoints>(), move |e: &Endpoints| {
                if is_api_servers(e) {
                    holding_or_waiting(&for_endpoints, &lb_pool::reserved(&[] as &[&Node], Some(e)))
                } else {
                    Vec::new()
                }
            })
            .watches(&services, move |svc: &Service| {
                if ingress_ips(svc).is_empty() {
                    Vec::new()
                } else {
                    waiting(&for_services)
                }
            })
    }

    /// The pool half: each pool's status.
    pub fn pool_controller(informers: &Informers) -> Controller<LoadBalancerIpPool> {
        let pools = informers.get::<LoadBalancerIpPool>();
        let services = informers.get::<Service>();
        let for_services = pools.clone();
        let all = move |p: &Informer<LoadBalancerIpPool>| {
            p.list().iter().map(|o| ObjectKey::of(&**o)).collect()
        };
        let for_pools = pools.clone();
        Controller::<LoadBalancerIpPool>::new(informers)
            .named("lbipam-pools")
            // A pool's conflict depends on the others.
            .watches(&pools, move |_: &LoadBalancerIpPool| all(&for_pools))
            .watches(&services, move |svc: &Service| {
                if ingress_ips(svc).is_empty() {
                    Vec::new()
                } else {
                    for_services
                        .list()
                        .iter()
                        .map(|o| ObjectKey::of(&**o))
                        .collect()
                }
            })
    }

    /// Runs both halves with `workers` workers each until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(LbIpam::new(informers, recorder));
        let services = Self::controller(informers)
            .graceful_shutdown_on(stop.clone())
            .run(Arc::clone(&reconciler), workers);
        let pools = Self::pool_controller(informers)
            .graceful_shutdown_on(stop)
            .run(Arc::new(PoolStatus(reconciler)), workers);
        futures::future::join(services, pools).await;
    }

    /// Our writes the informer does not show yet, dropping those it does.
    fn pending_view(
        &self,
        pending: &mut HashMap<ObjectKey, (u64, Vec<IpAddr>)>,
    ) -> HashMap<ObjectKey, Vec<IpAddr>> {
        pending.retain(|k, (rev, _)| {
            self.services
                .get(k)
                .is_some_and(|s| s.resource_version().parse::<u64>().unwrap_or(0) < *rev)
        });
        pending
            .iter()
            .map(|(k, (_, ips))| (k.clone(), ips.clone()))
            .collect()
    }

    fn all_pools(&self) -> Vec<Pool> {
        pools(&self.pools.list())
    }

    fn reserved(&self) -> BTreeMap<IpAddr, String> {
        let api = self.endpoints.get(&ObjectKey::new("default", "kubernetes"));
        lb_pool::reserved(&self.nodes.list(), api.as_deref())
    }
}

impl Reconciler for LbIpam {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let mut pending = self.pending.lock().await;
        let Some(svc) = self.services.get(key) else {
            pending.remove(key);
            return Ok(Action::Done);
        };
        let is_lb = svc
            .spec
            .as_ref()
            .is_some_and(|s| s.r#type == "LoadBalancer");
        if is_lb && !lb_pool::is_managed(&svc) {
            // Another implementation's Service.
            return Ok(Action::Done);
        }
        let view = self.pending_view(&mut pending);
        let current = view.get(key).cloned().unwrap_or_else(|| ingress_ips(&svc));
        let decision = if is_lb {
            let holders = holders(&self.services.list(), &view);
            decide(&svc, key, &self.all_pools(), &holders, &self.reserved())
        } else {
            // No longer a LoadBalancer: its addresses are given back.
            Decision::default()
        };
        if !decision.failures.is_empty() {
            let message = format!(
                "Failed to allocate a load balancer address: {}",
                decision.failures.join("; ")
            );
            tracing::info!(service = %key, %message, "lbipam");
            self.recorder
                .publish(&*svc, EventType::Warning, ALLOCATION_FAILED, &message)
                .await;
        }
        let modes_ok = svc
            .status
            .iter()
            .flat_map(|s| &s.load_balancer)
            .flat_map(|lb| &lb.ingress)
            .all(|i| i.ip_mode.as_deref() == Some(IP_MODE));
        // Nothing to write, or our write is on its way to the informer.
        if decision.ips == current && (modes_ok || view.contains_key(key)) {
            return Ok(Action::Done);
        }
        let updated = with_ingress(&svc, &decision.ips);
        let written = self
            .client
            .namespaced::<Service>(&key.namespace)
            .update_status(&updated)
            .await
            .during(|| format!("writing the load balancer status of service {key}"))?;
        let rev = written.resource_version().parse().unwrap_or(0);
        pending.insert(key.clone(), (rev, decision.ips.clone()));
        tracing::info!(service = %key, ips = ?decision.ips, "load balancer addresses written");
        // Keep deciding alone until the informer shows the write (bounded), so the next
        // decision sees it without the pending copy.
        let _ = tokio::time::timeout(OBSERVE_WRITE, self.services.wait_for_revision(rev)).await;
        Ok(Action::Done)
    }
}

/// The pool half's reconciler (shares the Service half's informers).
struct PoolStatus(Arc<LbIpam>);

impl Reconciler for PoolStatus {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let me = &self.0;
        let all = me.all_pools();
        let Some(pool) = all.iter().find(|p| p.name() == key.name) else {
            return Ok(Action::Done);
        };
        let view = {
            let mut pending = me.pending.lock().await;
            me.pending_view(&mut pending)
        };
        let holders = holders(&me.services.list(), &view);
        let mut object = (*pool.object).clone();
        let status = object
            .status
            .get_or_insert_with(LoadBalancerIpPoolStatus::default);
        let now = crate::util::format_time(chrono::Utc::now());
        let observed = generation(&*pool.object);
        let mut changed = false;
        for mut c in pool_conditions(pool, &holders) {
            c.last_transition_time = now.clone();
            c.observed_generation = observed;
            let stale = status
                .conditions
                .iter()
                .find(|o| o.r#type == c.r#type)
                .is_some_and(|o| o.observed_generation != observed);
            changed |= set_condition(&mut status.conditions, c) || stale;
        }
        if !changed {
            return Ok(Action::Done);
        }
        let written = me
            .client
            .cluster::<LoadBalancerIpPool>()
            .update_status(&object)
            .await
            .during(|| format!("writing the status of LoadBalancerIPPool {}", key.name))?;
        let rev = written.resource_version().parse().unwrap_or(0);
        let _ = tokio::time::timeout(OBSERVE_WRITE, me.pools.wait_for_revision(rev)).await;
        Ok(Action::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        LabelSelector, LoadBalancerIpPoolBlock, LoadBalancerIpPoolSpec, ObjectMeta, ServiceSpec,
    };

    fn pool(name: &str, created: &str, blocks: &[&str]) -> Arc<LoadBalancerIpPool> {
        Arc::new(LoadBalancerIpPool {
            metadata: Some(ObjectMeta {
                name: name.into(),
                creation_timestamp: created.into(),
                ..Default::default()
            }),
            spec: Some(LoadBalancerIpPoolSpec {
                blocks: blocks
                    .iter()
                    .map(|b| match b.split_once('-') {
                        Some((start, stop)) => LoadBalancerIpPoolBlock {
                            start: start.into(),
                            stop: stop.into(),
                            ..Default::default()
                        },
                        None => LoadBalancerIpPoolBlock {
                            cidr: b.to_string(),
                            ..Default::default()
                        },
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn svc(name: &str, created: &str, ips: &[&str]) -> Service {
        let mut s = Service {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: "ns".into(),
                creation_timestamp: created.into(),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                r#type: "LoadBalancer".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ips: Vec<IpAddr> = ips.iter().map(|i| ip(i)).collect();
        s = with_ingress(&s, &ips);
        s
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("ns", name)
    }

    fn decide_all(services: &[Service], pools: &[Pool], name: &str) -> Decision {
        let arcs: Vec<Arc<Service>> = services.iter().cloned().map(Arc::new).collect();
        let h = holders(&arcs, &HashMap::new());
        let s = services.iter().find(|s| s.name() == name).unwrap();
        decide(s, &key(name), pools, &h, &BTreeMap::new())
    }

    /// A node's or an API server's address is never handed out, kept or given on request,
    /// whatever the pool covers (a pool over the whole LAN, say): the node answering ARP for
    /// it would take that machine's traffic.
    #[test]
    fn nodes_and_api_servers_addresses_are_never_given() {
        let p = pools(&[pool("lan", "t1", &["192.168.100.1-192.168.100.3"])]);
        let reserved: BTreeMap<IpAddr, String> = [
            ("192.168.100.1", "node node-1's address (InternalIP)"),
            ("192.168.100.3", "an API server's address"),
        ]
        .iter()
        .map(|(ip, w)| (ip.parse().unwrap(), (*w).to_string()))
        .collect();
        let none = HashMap::new();
        let fresh = svc("fresh", "t1", &[]);
        let d = decide(&fresh, &key("fresh"), &p, &holders(&[], &none), &reserved);
        assert_eq!(shown(&d), ["192.168.100.2"]);
        // Holding a node's address (the node joined later): it is taken back.
        let holding = svc("holding", "t1", &["192.168.100.1"]);
        let arcs = [Arc::new(holding.clone())];
        let d = decide(
            &holding,
            &key("holding"),
            &p,
            &holders(&arcs, &none),
            &reserved,
        );
        assert_eq!(shown(&d), ["192.168.100.2"]);
        // Asking for the API server's address: refused, and why.
        let mut asking = svc("asking", "t1", &[]);
        asking.spec.as_mut().unwrap().load_balancer_ip = "192.168.100.3".into();
        let d = decide(&asking, &key("asking"), &p, &holders(&[], &none), &reserved);
        assert!(d.ips.is_empty());
        assert_eq!(
            d.failures,
            [
                "the requested address 192.168.100.3 is an API server's address: no Service may \
              have it"
            ]
        );
    }

    fn shown(d: &Decision) -> Vec<String> {
        d.ips.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn hands_out_the_lowest_free_usable_address_and_keeps_what_services_have() {
        let p = pools(&[pool("lan", "t1", &["192.168.100.200/30"])]);
        // /30: .201 and .202 are usable; network .200 and broadcast .203 are not.
        assert_eq!(
            shown(&decide_all(&[svc("a", "t1", &[])], &p, "a")),
            ["192.168.100.201"]
        );
        let a = svc("a", "t1", &["192.168.100.202"]);
        let b = svc("b", "t2", &[]);
        let all = [a.clone(), b.clone()];
        assert_eq!(shown(&decide_all(&all, &p, "a")), ["192.168.100.202"]);
        assert_eq!(shown(&decide_all(&all, &p, "b")), ["192.168.100.201"]);
        // Full: the third gets nothing and a reason.
        let b = svc("b", "t2", &["192.168.100.201"]);
        let c = svc("c", "t3", &[]);
        let d = decide_all(&[a, b, c], &p, "c");
        assert!(d.ips.is_empty());
        assert_eq!(
            d.failures,
            ["no free IPv4 address in the LoadBalancerIPPools that select the service (lan)"]
        );
    }

    #[test]
    fn an_address_claimed_twice_stays_with_the_older_service() {
        let p = pools(&[pool("lan", "t1", &["10.1.0.1-10.1.0.3"])]);
        let old = svc("old", "t1", &["10.1.0.2"]);
        let new = svc("new", "t2", &["10.1.0.2"]);
        let all = [new.clone(), old.clone()];
        assert_eq!(shown(&decide_all(&all, &p, "old")), ["10.1.0.2"]);
        assert_eq!(shown(&decide_all(&all, &p, "new")), ["10.1.0.1"]);
        // Same creation time: by namespace/name.
        let x = svc("x", "t1", &["10.1.0.2"]);
        let all = [x, old];
        assert_eq!(shown(&decide_all(&all, &p, "x")), ["10.1.0.1"]);
        assert_eq!(shown(&decide_all(&all, &p, "old")), ["10.1.0.2"]);
    }

    #[test]
    fn requested_addresses_selectors_families_and_disabled_pools() {
        let mut lan = (*pool("lan", "t1", &["192.168.100.240/29", "fd00:100::/120"])).clone();
        if let Some(s) = lan.spec.as_mut() {
            s.service_selector = Some(LabelSelector {
                match_labels: [("lb".to_string(), "lan".to_string())].into(),
                ..Default::default()
            });
        }
        let p = pools(&[Arc::new(lan.clone()), pool("zz", "t1", &["10.9.0.0/29"])]);
        let mut s = svc("s", "t1", &[]);
        s.metadata_mut().labels.insert("lb".into(), "lan".into());
        if let Some(spec) = s.spec.as_mut() {
            spec.ip_families = vec!["IPv6".into(), "IPv4".into()];
        }
        // The first pool by name that selects it: lan, both families.
        assert_eq!(
            shown(&decide_all(&[s.clone()], &p, "s")),
            ["fd00:100::1", "192.168.100.241"]
        );
        // Without the label only zz serves it, which has no IPv6 block.
        let mut unlabeled = s.clone();
        unlabeled.metadata_mut().labels.clear();
        let d = decide_all(&[unlabeled], &p, "s");
        assert_eq!(shown(&d), ["10.9.0.1"]);
        assert_eq!(
            d.failures,
            ["no free IPv6 address in the LoadBalancerIPPools that select the service (zz)"]
        );
        // A requested address: granted, or refused when another Service holds it.
        let mut req = s.clone();
        if let Some(spec) = req.spec.as_mut() {
            spec.load_balancer_ip = "192.168.100.245".into();
        }
        assert_eq!(
            shown(&decide_all(&[req.clone()], &p, "s")),
            ["192.168.100.245"]
        );
        let holder = svc("h", "t0", &["192.168.100.245"]);
        let d = decide_all(&[req.clone(), holder], &p, "s");
        assert!(d.ips.is_empty());
        assert_eq!(
            d.failures,
            ["the requested address 192.168.100.245 is already allocated to service ns/h"]
        );
        // A disabled pool hands out nothing new, but its Services keep their addresses.
        let mut off = lan.clone();
        if let Some(s) = off.spec.as_mut() {
            s.disabled = true;
        }
        let p = pools(&[Arc::new(off)]);
        let d = decide_all(&[s.clone()], &p, "s");
        assert!(d.ips.is_empty());
        assert_eq!(d.failures.len(), 2, "{:?}", d.failures);
        assert!(d.failures[0].starts_with("no enabled LoadBalancerIPPool selects the service"));
        let mut kept = with_ingress(&s, &[ip("fd00:100::9")]);
        if let Some(spec) = kept.spec.as_mut() {
            spec.ip_families = vec!["IPv6".into()];
        }
        assert_eq!(shown(&decide_all(&[kept], &p, "s")), ["fd00:100::9"]);
    }

    #[test]
    fn a_newer_overlapping_pool_conflicts_and_hands_out_nothing() {
        let p = pools(&[
            pool("b-old", "2024-01-01T00:00:00Z", &["10.1.0.0/29"]),
            pool("a-new", "2024-01-02T00:00:00Z", &["10.1.0.4-10.1.0.20"]),
        ]);
        assert_eq!(p[0].name(), "a-new");
        assert_eq!(p[0].conflict.as_deref(), Some("b-old"));
        assert_eq!(p[1].conflict, None);
        // a-new comes first by name but is in conflict: b-old's addresses are used.
        assert_eq!(
            shown(&decide_all(&[svc("s", "t", &[])], &p, "s")),
            ["10.1.0.1"]
        );
        let conds = pool_conditions(&p[0], &BTreeMap::new());
        assert_eq!(conds[3].r#type, lb_pool::POOL_CONFLICT);
        assert_eq!(conds[3].status, "True");
        assert!(
            conds[3].message.contains("\"b-old\""),
            "{}",
            conds[3].message
        );
    }

    #[test]
    fn pool_counts() {
        let p = pools(&[pool(
            "lan",
            "t1",
            &["192.168.100.200/29", "10.1.0.1-10.1.0.2"],
        )]);
        let services: Vec<Arc<Service>> = vec![
            Arc::new(svc("a", "t1", &["192.168.100.201"])),
            Arc::new(svc("b", "t1", &["10.1.0.2", "fd00::1"])),
            Arc::new(svc("c", "t1", &["10.2.0.1"])),
        ];
        let h = holders(&services, &HashMap::new());
        let conds = pool_conditions(&p[0], &h);
        let counts: Vec<(&str, &str, &str)> = conds
            .iter()
            .map(|c| (c.r#type.as_str(), c.status.as_str(), c.message.as_str()))
            .collect();
        assert_eq!(
            counts,
            [
                (lb_pool::IPS_TOTAL, "Unknown", "8"),
                (lb_pool::IPS_AVAILABLE, "Unknown", "6"),
                (lb_pool::IPS_USED, "Unknown", "2"),
                (lb_pool::POOL_CONFLICT, "False", ""),
            ]
        );
        // A write of ours the informer does not show yet counts instead of its old state.
        let pending: HashMap<ObjectKey, Vec<IpAddr>> = [(key("a"), vec![])].into();
        let h = holders(&services, &pending);
        assert_eq!(pool_conditions(&p[0], &h)[2].message, "1");
    }

    #[test]
    fn services_that_are_not_load_balancers_hold_nothing() {
        let mut s = svc("a", "t1", &["10.1.0.1"]);
        if let Some(spec) = s.spec.as_mut() {
            spec.r#type = "ClusterIP".into();
        }
        assert!(holders(&[Arc::new(s)], &HashMap::new()).is_empty());
    }
}
