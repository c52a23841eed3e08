//! NetworkPolicy enforcement, the agent's side: watches every NetworkPolicy, Pod and
//! Namespace of the cluster (shared informers), compiles them into the enforcement tables
//! ([`compile`], pure) and programs only the difference ([`skiff_datapath::policy`]). One
//! reconciler on the shared controller runtime; every change recompiles the whole set, which
//! keeps the result independent of the order changes arrive in (level-triggered), and the
//! datapath's planner writes only what differs.
//!
//! The informers are cluster-wide, which the default policy's
//! `system:skiff:network-policy-agent` ClusterRole (bound to `system:nodes`) allows;
//! `--no-network-policy` detaches enforcement. Identity numbers are kept across compilations
//! and seeded from the pinned maps after a restart; policy indexes are a stable hash of
//! `namespace/name`. The cluster DNS on the node's address stands for kube-dns' pods
//! (`kube-system`, `k8s-app=kube-dns`, port 53), so DNS egress rules written for CoreDNS
//! apply. `/metrics` has `skiff_policy_up` and `skiff_policy_packets`/`_bytes` by direction,
//! reason (allowed by a rule, unisolated, established; denied) and policy.

pub mod compile;
pub mod flows;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use skiff_api::api::{Namespace, NetworkPolicy, Pod};
use skiff_client::controller::{
    Action, CancelToken, Controller, Informer, Informers, ObjectKey, Reconciler,
};
use skiff_datapath::BpfError;
use skiff_datapath::policy::{
    DIR_INGRESS, PolCounterKey, PolCounters, PolicyDatapath, REASON_ALLOWED_ESTABLISHED,
    REASON_ALLOWED_RULE, REASON_ALLOWED_UNISOLATED, REASON_DENIED,
};
use tracing::{debug, info, warn};

pub use compile::{HostService, Identities, LabelKey};

struct PolicyState {
    datapath: Box<dyn PolicyDatapath>,
    ids: Identities,
    /// Policy index → `namespace/name`, of the last compilation and every earlier one (an
    /// index in the counters may be of a policy deleted since).
    names: BTreeMap<u32, String>,
    writes: u64,
    compiles: u64,
    seeded: bool,
}

/// The agent's NetworkPolicy enforcement.
pub struct NetworkPolicies {
    inner: Mutex<PolicyState>,
    /// Flow records (`GET /flows`) and what names their addresses.
    pub flows: flows::FlowLog,
    names: Mutex<flows::Names>,
    /// The thread reading the programs' flow records (stops when dropped).
    reader: Mutex<Option<skiff_datapath::lb::debug::Reader>>,
    node: String,
    host_ips: Vec<Ipv4Addr>,
    host_services: Vec<HostService>,
}

/// One verdict counter with the policy it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerdictCount {
    /// `namespace/name`, empty when no policy was involved.
    pub policy: String,
    /// `ingress` or `egress`.
    pub direction: &'static str,
    /// `allowed-by-rule`, `allowed-unisolated`, `allowed-established` or `denied`.
    pub reason: &'static str,
    pub packets: u64,
    pub bytes: u64,
}

/// The words of a verdict reason.
pub fn reason_name(reason: u8) -> &'static str {
    match reason {
        REASON_ALLOWED_RULE => "allowed-by-rule",
        REASON_ALLOWED_UNISOLATED => "allowed-unisolated",
        REASON_ALLOWED_ESTABLISHED => "allowed-established",
        REASON_DENIED => "denied",
        _ => "unknown",
    }
}

impl std::fmt::Debug for NetworkPolicies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkPolicies")
            .field("node", &self.node)
            .field("host_ips", &self.host_ips)
            .finish_non_exhaustive()
    }
}

impl NetworkPolicies {
    pub fn new(
        datapath: Box<dyn PolicyDatapath>,
        node: &str,
        host_ips: Vec<Ipv4Addr>,
        host_services: Vec<HostService>,
    ) -> Arc<Self> {
        Arc::new(NetworkPolicies {
            inner: Mutex::new(PolicyState {
                datapath,
                ids: Identities::default(),
                names: BTreeMap::new(),
                writes: 0,
                compiles: 0,
                seeded: false,
            }),
            flows: flows::FlowLog::default(),
            names: Mutex::new(flows::Names {
                host: host_ips.clone(),
                ..Default::default()
            }),
            reader: Mutex::new(None),
            node: node.to_string(),
            host_ips,
            host_services,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PolicyState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Compiles the cluster's policies, pods and namespaces and programs the result; returns
    /// the number of map writes.
    pub fn sync(
        &self,
        policies: &[Arc<NetworkPolicy>],
        pods: &[Arc<Pod>],
        namespaces: &[Arc<Namespace>],
    ) -> Result<usize, BpfError> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        if !inner.seeded {
            seed(&mut inner.ids, inner.datapath.tables(), pods);
            inner.seeded = true;
        }
        let compiled = compile::compile(
            &compile::Inputs {
                node: &self.node,
                policies,
                pods,
                namespaces,
                host_ips: &self.host_ips,
                host_services: &self.host_services,
            },
            &mut inner.ids,
        );
        inner.names.extend(compiled.policies);
        {
            let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            names.policies = inner.names.iter().map(|(k, v)| (*k, v.clone())).collect();
            names.pods = pods
                .iter()
                .filter_map(|p| {
                    let ip = p.status.as_ref()?.pod_ip.parse::<Ipv4Addr>().ok()?;
                    let m = p.metadata.as_ref()?;
                    Some((ip, (m.namespace.clone(), m.name.clone())))
                })
                .collect();
        }
        let writes = inner.datapath.apply(&compiled.tables)?;
        inner.writes += writes as u64;
        inner.compiles += 1;
        Ok(writes)
    }

    /// Verdict counters by policy, direction and reason.
    pub fn counters(&self) -> Result<Vec<VerdictCount>, BpfError> {
        let inner = self.lock();
        let raw: Vec<(PolCounterKey, PolCounters)> = inner.datapath.counters()?;
        Ok(raw
            .into_iter()
            .map(|(k, c)| VerdictCount {
                policy: inner.names.get(&k.policy).cloned().unwrap_or_default(),
                direction: if k.dir == DIR_INGRESS {
                    "ingress"
                } else {
                    "egress"
                },
                reason: reason_name(k.reason),
                packets: c.packets,
                bytes: c.bytes,
            })
            .collect())
    }

    /// (local endpoints, rules, identities in the ipcache, map writes so far).
    pub fn sizes(&self) -> (usize, usize, usize, u64) {
        let inner = self.lock();
        let t = inner.datapath.tables();
        (
            t.endpoints.len(),
            t.rules.len(),
            t.ipcache.len(),
            inner.writes,
        )
    }

    /// Keeps the thread reading the programs' flow records alive as long as this is.
    pub fn keep_flow_reader(&self, reader: skiff_datapath::lb::debug::Reader) {
        *self.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(reader);
    }

    /// Names every flow record from `events` and adds it to [`NetworkPolicies::flows`],
    /// until the sender is gone. `proxy` tells which Service a balanced socket asked for.
    pub async fn record_flows(
        self: Arc<Self>,
        mut events: tokio::sync::mpsc::Receiver<skiff_datapath::policy::PolFlowEvent>,
        proxy: Option<Arc<crate::proxy::Proxy>>,
    ) {
        while let Some(ev) = events.recv().await {
            let record = {
                let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
                flows::describe(
                    &self.node,
                    &names,
                    &ev,
                    chrono::Utc::now(),
                    |cookie, backend, port, proto| {
                        proxy
                            .as_ref()
                            .and_then(|p| p.service_of(cookie, backend, port, proto))
                    },
                )
            };
            self.flows.push(record);
        }
    }

    /// Runs until `shutdown`: waits for the informers, then reconciles every change.
    pub async fn run(self: Arc<Self>, informers: Informers, shutdown: CancelToken) {
        let pods = informers.get::<Pod>();
        let namespaces = informers.get::<Namespace>();
        let policies = informers.get::<NetworkPolicy>();
        tokio::select! {
            () = informers.wait_synced() => {}
            () = shutdown.cancelled() => return,
        }
        info!("network policy enforcement: informers synced");
        let reconciler = Arc::new(PolicyReconciler {
            agent: self,
            pods: pods.clone(),
            namespaces: namespaces.clone(),
            policies,
        });
        Controller::<NetworkPolicy>::new(&informers)
            .named("network-policy")
            .watches(&pods, |_: &Pod| vec![all()])
            .watches(&namespaces, |_: &Namespace| vec![all()])
            .graceful_shutdown_on(shutdown)
            .run(reconciler, 1)
            .await;
    }
}

/// The one key every change maps to: every reconcile compiles everything.
fn all() -> ObjectKey {
    ObjectKey::new("", "*")
}

/// Takes over the identity numbers an earlier agent left in the pinned maps, so a restart
/// rewrites nothing that did not change.
fn seed(ids: &mut Identities, tables: &skiff_datapath::policy::PolicyTables, pods: &[Arc<Pod>]) {
    for pod in pods {
        let Some(ip) = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.parse::<Ipv4Addr>().ok())
        else {
            continue;
        };
        if let Some(id) = tables.ipcache.get(&ip) {
            let m = pod.metadata.clone().unwrap_or_default();
            ids.labels.seed((m.namespace, m.labels), *id);
        }
    }
    for (prefix, id) in &tables.cidrs {
        ids.cidrs.seed(*prefix, *id);
    }
}

struct PolicyReconciler {
    agent: Arc<NetworkPolicies>,
    pods: Informer<Pod>,
    namespaces: Informer<Namespace>,
    policies: Informer<NetworkPolicy>,
}

impl Reconciler for PolicyReconciler {
    type Error = BpfError;

    async fn reconcile(&self, _key: &ObjectKey) -> Result<Action, BpfError> {
        let start = Instant::now();
        let (policies, pods, namespaces) = (
            self.policies.list(),
            self.pods.list(),
            self.namespaces.list(),
        );
        match self.agent.sync(&policies, &pods, &namespaces) {
            Ok(writes) => {
                debug!(
                    writes,
                    policies = policies.len(),
                    elapsed_us = start.elapsed().as_micros() as u64,
                    "network policy tables synced"
                );
                Ok(Action::Done)
            }
            Err(e) => {
                warn!(error = %e, "programming network policy");
                Err(e)
            }
        }
    }
}
