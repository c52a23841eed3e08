//! The node lifecycle controller, with taint-based eviction (Kubernetes' node lifecycle
//! controller and taint eviction controller in one reconciler, keyed by Node).
//!
//! **Health.** Node agents renew a Lease `kube-node-lease/<node>` (and post the Node's
//! conditions with a `lastHeartbeatTime`). A node is healthy while this controller has seen
//! its lease's `renewTime` (or the `Ready` condition's `lastHeartbeatTime`) change within the
//! grace period. As in Kubernetes, the reference is the local time at which the controller
//! *observed* the change, not the timestamp written by the agent: clock skew between hosts does
//! not matter, and a freshly started controller (or new leader), which has observed nothing
//! yet, gives every node one grace period before declaring it dead, so a restart never
//! mass-evicts. Each node is looked at again when its lease or the node changes, at the moment
//! its lease would expire, and at least every monitor period.
//!
//! **Unhealthy node.** Its conditions become `Unknown` (`NodeStatusUnknown`, "Kubelet stopped
//! posting node status."), keeping `lastHeartbeatTime`, through the status subresource with a
//! compare-and-swap: before writing, the lease and the node are read again from the API
//! server, and a conflict re-reads the node, so a heartbeat the agent just posted is never
//! overwritten. A `NodeNotReady` event is recorded; the pods on the node are marked
//! `Ready=False` so endpoints drop them.
//!
//! **Taints.** `Ready=Unknown` → `node.kubernetes.io/unreachable` (NoSchedule and NoExecute),
//! `Ready=False` → `node.kubernetes.io/not-ready` (both effects), `Ready=True` → neither.
//! NoExecute taints get `timeAdded`. Other taints are left alone. The controller never writes
//! `Ready=True`: a recovered node is untainted once its agent reports it Ready again.
//!
//! **Eviction.** A pod on a node with NoExecute taints is deleted (gracefully, like any delete;
//! a `TaintManagerEviction` event on the pod) as soon as one of them is not tolerated, else
//! once the smallest `tolerationSeconds` among the tolerations matching a taint has passed
//! since that taint's `timeAdded` (a taint without `timeAdded` counts from when this controller
//! first saw it); a toleration without `tolerationSeconds` tolerates forever. Pods already
//! terminating are skipped. At most [`NodeLifecycleConfig::evictions_per_period`] pods are
//! deleted per node per monitor period; the rest follow in the next one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use skiff_api::Resource;
use skiff_api::api::{Condition, Lease, Node, NodeStatus, Pod, Taint};
use skiff_api::taints::{
    self, NO_EXECUTE, NO_SCHEDULE, TAINT_NOT_READY, TAINT_UNREACHABLE, Tolerance,
};
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, EventType, Informer, Informers, ObjectKey,
    Reconciler,
};
use skiff_client::{Client, DeleteParams, Preconditions};
use tokio::time::Instant;

use crate::util::{self, format_time, is_terminating, parse_time};
use crate::{Context, Error};

/// Where node agents keep their Leases (one per node, named after it), as in Kubernetes.
pub use skiff_client::node_lease::NAMESPACE as LEASE_NAMESPACE;
/// Reason of the conditions of a node whose agent stopped reporting.
pub const REASON_STATUS_UNKNOWN: &str = "NodeStatusUnknown";
pub const MESSAGE_STATUS_UNKNOWN: &str = "Kubelet stopped posting node status.";
/// Reason of the `Ready` condition added to a node whose agent never reported one.
pub const REASON_NEVER_UPDATED: &str = "NodeStatusNeverUpdated";
pub const MESSAGE_NEVER_UPDATED: &str = "Kubelet never posted node status.";
/// Event on a node declared unhealthy, and on a pod deleted for a NoExecute taint.
pub const EVENT_NODE_NOT_READY: &str = "NodeNotReady";
pub const EVENT_EVICTION: &str = "TaintManagerEviction";

/// How late after a deadline (lease expiry, end of a toleration) the node is looked at.
const SLACK: Duration = Duration::from_millis(100);
/// Conflicting status writes retried (each after reading the node again) before giving up.
const STATUS_ATTEMPTS: usize = 5;

/// Settings of the node lifecycle controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLifecycleConfig {
    /// `--node-monitor-grace-period`: how long a node may go without a lease renewal (or a
    /// heartbeat) seen before it is declared unhealthy.
    pub grace_period: Duration,
    /// `--node-monitor-period`: every node is looked at least this often.
    pub monitor_period: Duration,
    /// Most pods deleted per node per monitor period (the eviction rate limit).
    pub evictions_per_period: usize,
}

impl Default for NodeLifecycleConfig {
    /// Grace 20 s (a stopped agent, renewing every 10 s with a 40 s lease, is NotReady well
    /// within its lease duration), monitor period 2 s, at most 100 evictions per node per
    /// monitor period.
    fn default() -> Self {
        NodeLifecycleConfig {
            grace_period: Duration::from_secs(20),
            monitor_period: Duration::from_secs(2),
            evictions_per_period: 100,
        }
    }
}

/// An invalid [`NodeLifecycleConfig`]; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("--node-monitor-period must be longer than 0")]
    ZeroMonitorPeriod,
    #[error(
        "--node-monitor-grace-period ({grace:?}) must be longer than --node-monitor-period \
         ({period:?})"
    )]
    GraceNotLongerThanPeriod { grace: Duration, period: Duration },
    #[error("the number of evictions per node and monitor period must be at least 1")]
    ZeroEvictions,
}

impl NodeLifecycleConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.monitor_period.is_zero() {
            return Err(ConfigError::ZeroMonitorPeriod);
        }
        if self.grace_period <= self.monitor_period {
            return Err(ConfigError::GraceNotLongerThanPeriod {
                grace: self.grace_period,
                period: self.monitor_period,
            });
        }
        if self.evictions_per_period == 0 {
            return Err(ConfigError::ZeroEvictions);
        }
        Ok(())
    }
}

/// What the controller remembers about one node (lost on restart, by design).
#[derive(Debug)]
struct ObservedNode {
    /// The lease `renewTime` and `Ready` `lastHeartbeatTime` last seen.
    renew_time: Option<String>,
    heartbeat: Option<String>,
    /// When a change of either was last seen (or the node first seen).
    observed_at: Instant,
    /// When each NoExecute taint without `timeAdded` was first seen, by (key, value).
    untimed_taints: HashMap<(String, String), DateTime<Utc>>,
    /// Uids of the pods deleted, until the cache shows them terminating or gone.
    evicted: HashSet<String>,
    /// The current eviction window: when it started (after its first deletions completed)
    /// and how many pods were deleted in it.
    eviction_window: Option<(Instant, usize)>,
}

/// When a pod has to leave a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// It does not tolerate one of the NoExecute taints.
    Now,
    /// It tolerates all of them, the first for only until then.
    At(DateTime<Utc>),
    /// It tolerates all of them for as long as they stay.
    Never,
}

/// When a pod with `tolerations` must leave a node with `taints`, each NoExecute one with the
/// time it was added.
pub fn eviction(
    tolerations: &[skiff_api::api::Toleration],
    taints: &[(Taint, DateTime<Utc>)],
) -> Eviction {
    let mut out = Eviction::Never;
    for (taint, added) in taints {
        match taints::tolerance(tolerations, taint) {
            Tolerance::None => return Eviction::Now,
            Tolerance::Forever => {}
            Tolerance::Seconds(s) => {
                let at = *added + chrono::Duration::seconds(i64::try_from(s).unwrap_or(i64::MAX));
                out = match out {
                    Eviction::At(t) if t <= at => Eviction::At(t),
                    _ => Eviction::At(at),
                };
            }
        }
    }
    out
}

/// The node's conditions set to `Unknown` (every one the agent reported, plus `Ready` if it
/// never did), keeping heartbeats; `None` when they all are already.
pub fn unknown_status(status: &NodeStatus, created: &str, now: &str) -> Option<NodeStatus> {
    let mut out = status.clone();
    let mut changed = false;
    for c in &mut out.conditions {
        if c.status != "Unknown" {
            c.status = "Unknown".into();
            c.reason = REASON_STATUS_UNKNOWN.into();
            c.message = MESSAGE_STATUS_UNKNOWN.into();
            c.last_transition_time = now.into();
            changed = true;
        }
    }
    if !out.conditions.iter().any(|c| c.r#type == "Ready") {
        out.conditions.insert(
            0,
            Condition {
                r#type: "Ready".into(),
                status: "Unknown".into(),
                reason: REASON_NEVER_UPDATED.into(),
                message: MESSAGE_NEVER_UPDATED.into(),
                last_heartbeat_time: created.into(),
                last_transition_time: now.into(),
                ..Default::default()
            },
        );
        changed = true;
    }
    changed.then_some(out)
}

/// The node's taints with the lifecycle taints for its `Ready` status: `wanted` is the key of
/// the one that must be there (NoSchedule and NoExecute), every other lifecycle taint goes;
/// other taints stay as they are. `None` when nothing changes.
pub fn lifecycle_taints(current: &[Taint], wanted: Option<&str>, now: &str) -> Option<Vec<Taint>> {
    let managed = |t: &Taint| {
        (t.key == TAINT_UNREACHABLE || t.key == TAINT_NOT_READY)
            && (t.effect == NO_SCHEDULE || t.effect == NO_EXECUTE)
    };
    let mut out: Vec<Taint> = current
        .iter()
        .filter(|t| !managed(t) || Some(t.key.as_str()) == wanted)
        .cloned()
        .collect();
    if let Some(key) = wanted {
        for effect in [NO_SCHEDULE, NO_EXECUTE] {
            if !out.iter().any(|t| t.key == key && t.effect == effect) {
                out.push(Taint {
                    key: key.into(),
                    value: String::new(),
                    effect: effect.into(),
                    // Kubernetes writes timeAdded on NoExecute taints only.
                    time_added: if effect == NO_EXECUTE {
                        now.into()
                    } else {
                        String::new()
                    },
                });
            }
        }
    }
    (out != current).then_some(out)
}

fn ready_condition(node: &Node) -> Option<&Condition> {
    node.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready")
}

fn ready_status(node: &Node) -> &str {
    ready_condition(node).map_or("", |c| c.status.as_str())
}

fn renew_time(lease: Option<&Lease>) -> Option<String> {
    lease
        .and_then(|l| l.spec.as_ref())
        .map(|s| s.renew_time.clone())
        .filter(|t| !t.is_empty())
}

fn heartbeat(node: &Node) -> Option<String> {
    ready_condition(node)
        .map(|c| c.last_heartbeat_time.clone())
        .filter(|t| !t.is_empty())
}

fn taints_of(node: &Node) -> &[Taint] {
    node.spec.as_ref().map_or(&[], |s| s.taints.as_slice())
}

/// The reconciler of Nodes: health, conditions, lifecycle taints, and the eviction of the
/// pods that do not tolerate them.
pub struct NodeLifecycleController {
    client: Client,
    recorder: EventRecorder,
    config: NodeLifecycleConfig,
    nodes: Informer<Node>,
    leases: Informer<Lease>,
    pods: Informer<Pod>,
    state: Mutex<HashMap<String, ObservedNode>>,
}

impl std::fmt::Debug for NodeLifecycleController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLifecycleController")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What a pass over a node's pods left to do.
#[derive(Debug, Default)]
struct PodPass {
    errors: Vec<Error>,
    /// The earliest toleration deadline still ahead.
    next_eviction: Option<DateTime<Utc>>,
    /// More pods were due than the rate limit allowed: when the next ones may go.
    resume_at: Option<Instant>,
}

impl NodeLifecycleController {
    pub fn new(
        informers: &Informers,
        recorder: EventRecorder,
        config: NodeLifecycleConfig,
    ) -> Self {
        NodeLifecycleController {
            client: informers.client().clone(),
            recorder,
            config,
            nodes: informers.get::<Node>(),
            leases: informers.get::<Lease>(),
            pods: informers.get::<Pod>(),
            state: Mutex::new(HashMap::new()),
        }
    }

    /// The controller: Nodes, their Leases (`kube-node-lease/<node>` → `<node>`) and the
    /// pods bound to them (→ their node).
    pub fn controller(informers: &Informers) -> Controller<Node> {
        let leases = informers.get::<Lease>();
        let pods = informers.get::<Pod>();
        Controller::<Node>::new(informers)
            .named("nodelifecycle")
            .watches(&leases, |lease: &Lease| {
                if lease.namespace() == LEASE_NAMESPACE {
                    vec![ObjectKey::cluster(lease.name())]
                } else {
                    Vec::new()
                }
            })
            .watches(&pods, |pod: &Pod| {
                pod.spec
                    .as_ref()
                    .map(|s| s.node_name.as_str())
                    .filter(|n| !n.is_empty())
                    .map(ObjectKey::cluster)
                    .into_iter()
                    .collect()
            })
    }

    /// Runs the node lifecycle controller with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        config: NodeLifecycleConfig,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(NodeLifecycleController::new(informers, recorder, config));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    fn with_state<R>(&self, node: &str, f: impl FnOnce(&mut ObservedNode) -> R) -> R {
        let mut map = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = map.entry(node.to_string()).or_insert_with(|| ObservedNode {
            renew_time: None,
            heartbeat: None,
            observed_at: Instant::now(),
            untimed_taints: HashMap::new(),
            evicted: HashSet::new(),
            eviction_window: None,
        });
        f(state)
    }

    /// Records the node's current lease and heartbeat; returns when its health expires (the
    /// last time either was seen to change, plus the grace period).
    fn observe(&self, node: &Node, lease: Option<&Lease>) -> Instant {
        let (renew, beat) = (renew_time(lease), heartbeat(node));
        let grace = self.config.grace_period;
        self.with_state(node.name(), |s| {
            let renewed = renew.is_some() && renew != s.renew_time;
            let beaten = beat.is_some() && beat != s.heartbeat;
            if renewed || beaten {
                s.observed_at = Instant::now();
                s.renew_time = renew;
                s.heartbeat = beat;
            }
            s.observed_at + grace
        })
    }

    /// Checks the node's health and, when it is unhealthy, sets its conditions to `Unknown`.
    /// Returns the node as it now is and when its health expires (`None`: it is unhealthy),
    /// or `None` when the node is gone.
    async fn check_health(&self, cached: &Node) -> Result<Option<(Node, Option<Instant>)>, Error> {
        let name = cached.name().to_string();
        let lease = self.leases.get(&ObjectKey::new(LEASE_NAMESPACE, &name));
        let expires = self.observe(cached, lease.as_deref());
        if Instant::now() < expires {
            return Ok(Some((cached.clone(), Some(expires))));
        }
        let created = util::creation_timestamp(cached).to_string();
        let status = |n: &Node| n.status.clone().unwrap_or_default();
        if unknown_status(&status(cached), &created, "").is_none() {
            // Already declared unhealthy: nothing to write.
            return Ok(Some((cached.clone(), None)));
        }
        // About to declare it unhealthy: make sure with the API server's copies, not the
        // caches (a lagging watch must not kill a node).
        let nodes = self.client.cluster::<Node>();
        let leases = self.client.namespaced::<Lease>(LEASE_NAMESPACE);
        let lease = leases
            .get_opt(&name)
            .await
            .during(|| format!("reading the lease of node {name}"))?;
        for _ in 0..STATUS_ATTEMPTS {
            let Some(node) = nodes
                .get_opt(&name)
                .await
                .during(|| format!("reading node {name}"))?
            else {
                return Ok(None);
            };
            let expires = self.observe(&node, lease.as_ref());
            if Instant::now() < expires {
                return Ok(Some((node, Some(expires))));
            }
            let now = format_time(Utc::now());
            let Some(unknown) = unknown_status(&status(&node), &created, &now) else {
                return Ok(Some((node, None)));
            };
            let was_ready = ready_status(&node) == "True";
            let mut updated = node.clone();
            updated.status = Some(unknown);
            match nodes.update_status(&updated).await {
                Ok(written) => {
                    tracing::info!(node = %name, "node stopped reporting, status set to Unknown");
                    if was_ready {
                        self.recorder
                            .publish(
                                &written,
                                EventType::Normal,
                                EVENT_NODE_NOT_READY,
                                &format!("Node {name} status is now: {EVENT_NODE_NOT_READY}"),
                            )
                            .await;
                    }
                    return Ok(Some((written, None)));
                }
                // Someone (the agent?) wrote first: look again at the newer node.
                Err(e) if e.is_conflict() => continue,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => {
                    return Err(e).during(|| format!("setting the conditions of node {name}"));
                }
            }
        }
        Err(Error::Partial(format!(
            "the status of node {name} kept changing while it was being set to Unknown"
        )))
    }

    /// Puts the lifecycle taints that go with the node's `Ready` condition on it.
    async fn update_taints(&self, node: Node) -> Result<Node, Error> {
        let wanted = match ready_status(&node) {
            "True" => None,
            "False" => Some(TAINT_NOT_READY),
            "Unknown" => Some(TAINT_UNREACHABLE),
            // No Ready condition yet: wait for the agent (or the grace period) to set one.
            _ => return Ok(node),
        };
        let now = format_time(Utc::now());
        let Some(new_taints) = lifecycle_taints(taints_of(&node), wanted, &now) else {
            return Ok(node);
        };
        let mut updated = node.clone();
        updated.spec.get_or_insert_with(Default::default).taints = new_taints;
        let name = node.name().to_string();
        // A conflict fails the reconcile: it is retried with the newer node.
        let written = self
            .client
            .cluster::<Node>()
            .update(&updated)
            .await
            .during(|| format!("updating the taints of node {name}"))?;
        tracing::info!(node = %name, taint = wanted.unwrap_or("none"), "lifecycle taints updated");
        Ok(written)
    }

    /// Marks a pod `Ready=False` (Kubernetes' MarkPodsNotReady): its Ready condition, if it
    /// has one that is not False yet.
    async fn mark_not_ready(&self, pod: &Pod) -> Result<(), Error> {
        let api = self.client.namespaced::<Pod>(pod.namespace());
        let mut pod = pod.clone();
        for _ in 0..STATUS_ATTEMPTS {
            let Some(cond) = pod
                .status
                .as_mut()
                .and_then(|s| s.conditions.iter_mut().find(|c| c.r#type == "Ready"))
                .filter(|c| c.status != "False")
            else {
                return Ok(());
            };
            cond.status = "False".into();
            cond.last_transition_time = format_time(Utc::now());
            match api.update_status(&pod).await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) if e.is_conflict() => match api.get_opt(pod.name()).await {
                    Ok(Some(p)) if util::uid(&p) == util::uid(&pod) => pod = p,
                    Ok(_) => return Ok(()),
                    Err(e) => {
                        return Err(e).during(|| format!("reading pod {}", ObjectKey::of(&pod)));
                    }
                },
                Err(e) => {
                    return Err(e)
                        .during(|| format!("marking pod {} not ready", ObjectKey::of(&pod)));
                }
            }
        }
        Ok(())
    }

    /// Deletes a pod for a NoExecute taint it does not tolerate (any more).
    async fn evict(&self, pod: &Pod) -> Result<(), Error> {
        let key = ObjectKey::of(pod);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(util::uid(pod).to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self
            .client
            .namespaced::<Pod>(pod.namespace())
            .delete(pod.name(), &params)
            .await
        {
            Ok(_) => {
                tracing::info!(pod = %key, node = pod.field("spec.nodeName").unwrap_or_default(),
                    "evicted pod for a NoExecute taint");
                self.recorder
                    .publish(
                        pod,
                        EventType::Normal,
                        EVENT_EVICTION,
                        &format!("Marking for deletion Pod {key}"),
                    )
                    .await;
                Ok(())
            }
            // Gone, or replaced by another pod of the same name.
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
            Err(e) => Err(e).during(|| format!("evicting pod {key}")),
        }
    }

    /// The pods on a node: marked not ready unless the node is Ready, evicted per the node's
    /// NoExecute taints.
    async fn pods_pass(&self, node: &Node) -> PodPass {
        let name = node.name();
        let pods = self.pods.by_node(name);
        let mut pass = PodPass::default();
        if matches!(ready_status(node), "False" | "Unknown") {
            let results = join_all(pods.iter().map(|p| self.mark_not_ready(p))).await;
            pass.errors
                .extend(results.into_iter().filter_map(Result::err));
        }
        let now = Utc::now();
        let no_execute: Vec<&Taint> = taints_of(node)
            .iter()
            .filter(|t| t.effect == NO_EXECUTE)
            .collect();
        let period = self.config.monitor_period;
        let (timed, due, window) = self.with_state(name, |s| {
            let present: HashSet<(String, String)> = no_execute
                .iter()
                .map(|t| (t.key.clone(), t.value.clone()))
                .collect();
            s.untimed_taints.retain(|k, _| present.contains(k));
            let timed: Vec<(Taint, DateTime<Utc>)> = no_execute
                .iter()
                .map(|t| {
                    let added = parse_time(&t.time_added).unwrap_or_else(|| {
                        *s.untimed_taints
                            .entry((t.key.clone(), t.value.clone()))
                            .or_insert(now)
                    });
                    ((*t).clone(), added)
                })
                .collect();
            // Forget evictions the cache has caught up with.
            s.evicted.retain(|uid| {
                pods.iter()
                    .any(|p| util::uid(p.as_ref()) == uid && !is_terminating(p.as_ref()))
            });
            let due: Vec<Arc<Pod>> = pods
                .iter()
                .filter(|p| {
                    !is_terminating(p.as_ref()) && !s.evicted.contains(util::uid(p.as_ref()))
                })
                .cloned()
                .collect();
            if s.eviction_window
                .is_some_and(|(start, _)| start + period <= Instant::now())
            {
                s.eviction_window = None;
            }
            (timed, due, s.eviction_window)
        });
        if timed.is_empty() {
            return pass;
        }
        let budget = self
            .config
            .evictions_per_period
            .saturating_sub(window.map_or(0, |(_, n)| n));
        let mut victims = Vec::new();
        for pod in due {
            let tolerations = pod
                .spec
                .as_ref()
                .map_or(&[][..], |s| s.tolerations.as_slice());
            let evict_now = match eviction(tolerations, &timed) {
                Eviction::Now => true,
                Eviction::At(t) if t <= now => true,
                Eviction::At(t) => {
                    pass.next_eviction = Some(pass.next_eviction.map_or(t, |n| n.min(t)));
                    false
                }
                Eviction::Never => false,
            };
            if !evict_now {
                continue;
            }
            if victims.len() >= budget {
                pass.resume_at =
                    Some(window.map_or_else(Instant::now, |(start, _)| start) + period);
                continue;
            }
            victims.push(pod);
        }
        if victims.is_empty() {
            return pass;
        }
        let results = join_all(victims.iter().map(|p| self.evict(p))).await;
        self.with_state(name, |s| {
            for (pod, result) in victims.iter().zip(results) {
                match result {
                    Ok(()) => {
                        s.evicted.insert(util::uid(pod.as_ref()).to_string());
                    }
                    Err(e) => pass.errors.push(e),
                }
            }
            // Counted from when the deletions are done, so windows never overlap.
            let (start, n) = s.eviction_window.unwrap_or((Instant::now(), 0));
            s.eviction_window = Some((start, n + victims.len()));
            if pass.resume_at.is_some() {
                pass.resume_at = Some(start + period);
            }
        });
        if pass.resume_at.is_some() {
            tracing::info!(node = %name, evicted = victims.len(),
                "eviction rate limit reached, the rest follows in the next window");
        }
        pass
    }
}

impl Reconciler for NodeLifecycleController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let forget = || {
            self.state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key.name);
            Ok(Action::Done)
        };
        let Some(cached) = self.nodes.get(key) else {
            return forget();
        };
        let Some((node, expires)) = self.check_health(&cached).await? else {
            return forget();
        };
        let node = self.update_taints(node).await?;
        let pass = self.pods_pass(&node).await;
        let failed = pass.errors.len();
        if let Some(first) = pass.errors.into_iter().next() {
            return Err(if failed == 1 {
                first
            } else {
                Error::Partial(format!(
                    "{failed} pod updates on node {} failed, the first: {}",
                    node.name(),
                    crate::error_chain(&first)
                ))
            });
        }
        // Look again at the latest when the lease would expire, a toleration ends, more
        // evictions may be made, or the monitor period is over.
        let now = Instant::now();
        let mut next = self.config.monitor_period;
        if let Some(at) = expires {
            next = next.min(at.saturating_duration_since(now) + SLACK);
        }
        if let Some(at) = pass.next_eviction {
            let wait = (at - Utc::now()).to_std().unwrap_or(Duration::ZERO);
            next = next.min(wait + SLACK);
        }
        if let Some(at) = pass.resume_at {
            next = next.min(at.saturating_duration_since(now) + SLACK);
        }
        Ok(Action::RequeueAfter(next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::Toleration;

    fn taint(key: &str, effect: &str, added: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            time_added: added.into(),
            ..Default::default()
        }
    }

    fn tol(key: &str, effect: &str, seconds: Option<i64>) -> Toleration {
        Toleration {
            key: key.into(),
            operator: "Exists".into(),
            effect: effect.into(),
            toleration_seconds: seconds,
            ..Default::default()
        }
    }

    fn cond(ty: &str, status: &str) -> Condition {
        Condition {
            r#type: ty.into(),
            status: status.into(),
            reason: "AgentSaid".into(),
            last_heartbeat_time: "hb".into(),
            last_transition_time: "t0".into(),
            ..Default::default()
        }
    }

    #[test]
    fn config_validation_names_the_flags() {
        assert_eq!(NodeLifecycleConfig::default().validate(), Ok(()));
        let c = NodeLifecycleConfig {
            grace_period: Duration::from_secs(2),
            ..Default::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("--node-monitor-grace-period") && e.contains("--node-monitor-period"),
            "{e}"
        );
        let c = NodeLifecycleConfig {
            monitor_period: Duration::ZERO,
            ..Default::default()
        };
        assert_eq!(c.validate(), Err(ConfigError::ZeroMonitorPeriod));
    }

    #[test]
    fn unknown_conditions_keep_heartbeats() {
        let status = NodeStatus {
            conditions: vec![
                cond("Ready", "True"),
                cond("ResourceLimitsEnforced", "False"),
            ],
            ..Default::default()
        };
        let out = unknown_status(&status, "created", "now").expect("changes");
        for c in &out.conditions {
            assert_eq!(c.status, "Unknown");
            assert_eq!(c.reason, REASON_STATUS_UNKNOWN);
            assert_eq!(c.message, MESSAGE_STATUS_UNKNOWN);
            assert_eq!(c.last_heartbeat_time, "hb");
            assert_eq!(c.last_transition_time, "now");
        }
        assert_eq!(unknown_status(&out, "created", "later"), None);
        // An agent that never reported: Ready is added.
        let out = unknown_status(&NodeStatus::default(), "created", "now").expect("changes");
        assert_eq!(out.conditions.len(), 1);
        assert_eq!(out.conditions[0].reason, REASON_NEVER_UPDATED);
        assert_eq!(out.conditions[0].last_heartbeat_time, "created");
    }

    #[test]
    fn lifecycle_taints_follow_ready_and_leave_others() {
        let other = taint("dedicated", NO_SCHEDULE, "");
        let unreachable =
            lifecycle_taints(std::slice::from_ref(&other), Some(TAINT_UNREACHABLE), "t1")
                .expect("added");
        assert_eq!(unreachable.len(), 3);
        assert_eq!(unreachable[0], other);
        assert!(unreachable.contains(&taint(TAINT_UNREACHABLE, NO_SCHEDULE, "")));
        assert!(unreachable.contains(&taint(TAINT_UNREACHABLE, NO_EXECUTE, "t1")));
        // Stable: the same state later changes nothing (timeAdded kept).
        assert_eq!(
            lifecycle_taints(&unreachable, Some(TAINT_UNREACHABLE), "t2"),
            None
        );
        // Unknown → False swaps the key.
        let not_ready = lifecycle_taints(&unreachable, Some(TAINT_NOT_READY), "t3").expect("swap");
        assert_eq!(
            not_ready,
            vec![
                other.clone(),
                taint(TAINT_NOT_READY, NO_SCHEDULE, ""),
                taint(TAINT_NOT_READY, NO_EXECUTE, "t3")
            ]
        );
        // Ready: both go, other taints (even a PreferNoSchedule one with the same key) stay.
        let mut with_prefer = not_ready.clone();
        with_prefer.push(taint(TAINT_NOT_READY, "PreferNoSchedule", ""));
        assert_eq!(
            lifecycle_taints(&with_prefer, None, "t4"),
            Some(vec![
                other.clone(),
                taint(TAINT_NOT_READY, "PreferNoSchedule", "")
            ])
        );
        assert_eq!(lifecycle_taints(&[other], None, "t4"), None);
    }

    #[test]
    fn eviction_times() {
        let t0 = Utc::now();
        let unreachable = (taint(TAINT_UNREACHABLE, NO_EXECUTE, ""), t0);
        let other = (
            taint("maintenance", NO_EXECUTE, ""),
            t0 + chrono::Duration::seconds(10),
        );
        assert_eq!(
            eviction(&[], std::slice::from_ref(&unreachable)),
            Eviction::Now
        );
        assert_eq!(eviction(&[], &[]), Eviction::Never);
        let forever = tol(TAINT_UNREACHABLE, NO_EXECUTE, None);
        assert_eq!(
            eviction(
                std::slice::from_ref(&forever),
                std::slice::from_ref(&unreachable)
            ),
            Eviction::Never
        );
        let brief = tol(TAINT_UNREACHABLE, NO_EXECUTE, Some(3));
        assert_eq!(
            eviction(
                std::slice::from_ref(&brief),
                std::slice::from_ref(&unreachable)
            ),
            Eviction::At(t0 + chrono::Duration::seconds(3))
        );
        // A second taint nothing tolerates: now.
        assert_eq!(
            eviction(
                std::slice::from_ref(&brief),
                &[unreachable.clone(), other.clone()]
            ),
            Eviction::Now
        );
        // Each taint counts from its own timeAdded; the earliest end wins.
        let all = Toleration {
            operator: "Exists".into(),
            toleration_seconds: Some(5),
            ..Default::default()
        };
        assert_eq!(
            eviction(&[all], &[other, unreachable]),
            Eviction::At(t0 + chrono::Duration::seconds(5))
        );
        // A NoSchedule toleration does not help against NoExecute.
        assert_eq!(
            eviction(
                &[tol(TAINT_UNREACHABLE, NO_SCHEDULE, None)],
                &[(taint(TAINT_UNREACHABLE, NO_EXECUTE, ""), t0)]
            ),
            Eviction::Now
        );
    }
}
