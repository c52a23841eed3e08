//! The DaemonSet controller: one pod of each DaemonSet on every eligible node, as Kubernetes'
//! `daemon` controller does it.
//!
//! - A node is eligible when the template's `nodeSelector` and required node affinity match
//!   it and its NoSchedule and NoExecute taints are tolerated (by the template's tolerations
//!   plus the ones every daemon pod gets: not-ready, unreachable, the pressure taints,
//!   unschedulable). A pod keeps running on a node that only gained a NoSchedule taint; an
//!   untolerated NoExecute taint, a label change that no longer matches or a deleted node
//!   removes it.
//! - Pods are created with their node's name as their only required node affinity term
//!   (`matchFields metadata.name`), so the scheduler binds them (resources and ports counted)
//!   as it does since Kubernetes 1.12, and carry the `controller-revision-hash` of the
//!   template they were made from.
//! - Rolling updates (`RollingUpdate`): with `maxSurge` 0, old pods are deleted while at most
//!   `maxUnavailable` of the desired nodes are without an available pod, and replaced by the
//!   create step; with `maxSurge` > 0, new pods start beside the old ones on at most `maxSurge`
//!   nodes at a time and an old pod goes once its replacement is available. `OnDelete`: new
//!   pods only where a pod is missing.
//! - Pods are claimed, created and deleted through the shared [`PodControl`] (adoption,
//!   release, events, expectations).
//!
//! Not built: ControllerRevision objects (so `kubectl rollout history/undo` of a DaemonSet
//! has nothing to show), failed-pod back-off.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use skiff_api::Resource;
use skiff_api::api::{
    Affinity, DaemonSet, DaemonSetStatus, Node, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, ObjectMeta, Pod, PodSpec, Toleration,
};
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, Informer, Informers, ObjectKey, Reconciler,
};

use crate::podcontrol::{PodControl, adopters};
use crate::util::{
    self, controller_ref, is_pod_available, is_terminating, labels, pod_template_hash, scaled_value,
};
use crate::{Context, Error};

/// The label naming the template revision a daemon pod was made from.
pub const REVISION_HASH: &str = "controller-revision-hash";
/// The label with the DaemonSet generation a pod was made at (kept for compatibility).
const TEMPLATE_GENERATION: &str = "pod-template-generation";

/// The tolerations every daemon pod gets, as Kubernetes adds them: `(key, effect)`, operator
/// Exists.
const DAEMON_TOLERATIONS: [(&str, &str); 6] = [
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];

/// The template's tolerations plus the daemon ones it does not have.
fn daemon_tolerations(spec: &PodSpec) -> Vec<Toleration> {
    let mut out = spec.tolerations.clone();
    let mut extra: Vec<(&str, &str)> = DAEMON_TOLERATIONS.to_vec();
    if spec.host_network {
        extra.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    for (key, effect) in extra {
        if !out.iter().any(|t| t.key == key && t.effect == effect) {
            out.push(Toleration {
                key: key.into(),
                operator: "Exists".into(),
                effect: effect.into(),
                ..Default::default()
            });
        }
    }
    out
}

/// Whether a daemon pod of `spec` should run on `node` (a new one be placed there), and
/// whether one already there may keep running.
pub fn should_run(spec: &PodSpec, node: &Node) -> (bool, bool) {
    let name = node.name();
    if !spec.node_name.is_empty() && spec.node_name != name {
        return (false, false);
    }
    if !skiff_api::nodeaffinity::pod_fits_node(spec, name, labels(node)) {
        return (false, false);
    }
    let tolerations = daemon_tolerations(spec);
    let mut run = true;
    for taint in node
        .spec
        .as_ref()
        .map(|s| s.taints.as_slice())
        .unwrap_or_default()
    {
        if skiff_api::taints::tolerated(&tolerations, taint) {
            continue;
        }
        match taint.effect.as_str() {
            "NoExecute" => return (false, false),
            "NoSchedule" => run = false,
            _ => {}
        }
    }
    (run, true)
}

/// The node a daemon pod is for: its `nodeName` once bound, else its `metadata.name`
/// affinity term.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if !spec.node_name.is_empty() {
        return Some(spec.node_name.clone());
    }
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| &t.match_fields)
        .find(|r| r.key == "metadata.name" && r.operator == "In" && r.values.len() == 1)
        .map(|r| r.values[0].clone())
}

/// A pod of `ds` for `node`, from its template (the server picks the name).
pub fn pod_for_node(ds: &DaemonSet, node: &str, hash: &str) -> Pod {
    let template = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default();
    let tm = template.metadata.unwrap_or_default();
    let mut spec = template.spec.unwrap_or_default();
    spec.tolerations = daemon_tolerations(&spec);
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: vec![node.to_string()],
            }],
            ..Default::default()
        }],
    });
    let mut pod_labels = tm.labels;
    pod_labels.insert(REVISION_HASH.into(), hash.into());
    pod_labels.insert(TEMPLATE_GENERATION.into(), util::generation(ds).to_string());
    Pod {
        metadata: Some(ObjectMeta {
            generate_name: format!("{}-", ds.name()),
            namespace: ds.namespace().to_string(),
            labels: pod_labels,
            annotations: tm.annotations,
            finalizers: tm.finalizers,
            owner_references: vec![controller_ref(ds)],
            ..Default::default()
        }),
        spec: Some(spec),
        ..Default::default()
    }
}

/// The template revision of `ds`.
pub fn revision_hash(ds: &DaemonSet) -> String {
    let spec = ds.spec.clone().unwrap_or_default();
    pod_template_hash(&spec.template.unwrap_or_default(), None)
}

/// One node as the planner sees it.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub name: String,
    pub should_run: bool,
    pub should_continue: bool,
    /// The daemon pods there that are not being deleted, oldest first.
    pub pods: Vec<Arc<Pod>>,
}

/// What one reconcile does: nodes to create a pod on, pods to delete.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DaemonSetPlan {
    pub create: Vec<String>,
    pub delete: Vec<String>,
}

/// How the DaemonSet updates its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    OnDelete,
    /// Resolved against the desired node count (maxSurge, maxUnavailable).
    Rolling {
        surge: i32,
        unavailable: i32,
    },
}

fn is_updated(pod: &Pod, hash: &str) -> bool {
    labels(pod).get(REVISION_HASH).map(String::as_str) == Some(hash)
}

fn is_failed(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| s.phase == "Failed")
}

/// The planner (pure): Kubernetes' `podsShouldBeOnNode` for every node, then its rolling
/// update step.
pub fn plan(
    nodes: &[NodeState],
    hash: &str,
    update: Update,
    min_ready_seconds: i32,
    now: DateTime<Utc>,
) -> DaemonSetPlan {
    let mut out = DaemonSetPlan::default();
    let available = |p: &Pod| is_pod_available(p, min_ready_seconds, now);
    let surge_allowed = matches!(update, Update::Rolling { surge, .. } if surge > 0);
    for n in nodes {
        let (failed, running): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) =
            n.pods.iter().partition(|p| is_failed(p));
        out.delete
            .extend(failed.iter().map(|p| p.name().to_string()));
        if !n.should_continue {
            out.delete
                .extend(running.iter().map(|p| p.name().to_string()));
            continue;
        }
        if running.is_empty() {
            if n.should_run {
                out.create.push(n.name.clone());
            }
            continue;
        }
        // More than one: keep the oldest (with surge, the oldest old and oldest new one).
        let mut kept_old = false;
        let mut kept_new = false;
        for p in &running {
            let keep = if !surge_allowed {
                !std::mem::replace(&mut kept_old, true)
            } else if is_updated(p, hash) {
                !std::mem::replace(&mut kept_new, true)
            } else {
                !std::mem::replace(&mut kept_old, true)
            };
            if !keep {
                out.delete.push(p.name().to_string());
            }
        }
    }
    let Update::Rolling { surge, unavailable } = update else {
        return out;
    };
    let deleted: HashSet<String> = out.delete.iter().cloned().collect();
    // (old, new) on each eligible node after the step above.
    let pairs = nodes.iter().filter(|n| n.should_continue).map(|n| {
        let live: Vec<&Arc<Pod>> = n
            .pods
            .iter()
            .filter(|p| !deleted.contains(p.name()) && !is_failed(p))
            .collect();
        let old = live.iter().find(|p| !is_updated(p, hash)).copied();
        let new = live.iter().find(|p| is_updated(p, hash)).copied();
        (n, old, new)
    });
    if surge == 0 {
        let mut unavailable_now = 0;
        let mut candidates = Vec::new();
        for (_, old, new) in pairs {
            match (old, new) {
                (None, None) | (Some(_), Some(_)) => unavailable_now += 1,
                (None, Some(new)) => {
                    if !available(new) {
                        unavailable_now += 1;
                    }
                }
                (Some(old), None) => {
                    if !available(old) {
                        // Not serving anyway: replace it at once.
                        out.delete.push(old.name().to_string());
                    } else {
                        candidates.push(old.name().to_string());
                    }
                }
            }
        }
        let budget = usize::try_from((unavailable - unavailable_now).max(0)).unwrap_or(0);
        out.delete.extend(candidates.into_iter().take(budget));
    } else {
        let mut surging = 0;
        let mut allowed = Vec::new();
        let mut candidates = Vec::new();
        for (n, old, new) in pairs {
            match (old, new) {
                (None, _) => {}
                (Some(old), None) => {
                    if !n.should_run {
                        continue;
                    }
                    if available(old) {
                        candidates.push(n.name.clone());
                    } else {
                        allowed.push(n.name.clone());
                    }
                }
                (Some(old), Some(new)) => {
                    if available(new) {
                        out.delete.push(old.name().to_string());
                    } else {
                        surging += 1;
                    }
                }
            }
        }
        let budget = usize::try_from((surge - surging).max(0)).unwrap_or(0);
        out.create.extend(allowed);
        out.create.extend(candidates.into_iter().take(budget));
    }
    out
}

/// The status the nodes give (Kubernetes' counting: per desired node its oldest pod, the
/// updated one where there is one).
pub fn status_of(
    ds: &DaemonSet,
    nodes: &[NodeState],
    hash: &str,
    now: DateTime<Utc>,
) -> DaemonSetStatus {
    let min_ready = ds.spec.as_ref().map(|s| s.min_ready_seconds).unwrap_or(0);
    let mut st = ds.status.clone().unwrap_or_default();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let desired: Vec<&NodeState> = nodes.iter().filter(|n| n.should_run).collect();
    let scheduled: Vec<&NodeState> = desired
        .iter()
        .copied()
        .filter(|n| !n.pods.is_empty())
        .collect();
    let shown = |n: &NodeState| -> Option<Arc<Pod>> {
        n.pods
            .iter()
            .find(|p| is_updated(p, hash))
            .or_else(|| n.pods.first())
            .cloned()
    };
    st.desired_number_scheduled = count(desired.len());
    st.current_number_scheduled = count(scheduled.len());
    st.number_misscheduled = count(
        nodes
            .iter()
            .filter(|n| !n.should_run && !n.pods.is_empty())
            .count(),
    );
    st.number_ready = count(
        scheduled
            .iter()
            .filter(|n| shown(n).is_some_and(|p| p.is_ready()))
            .count(),
    );
    st.number_available = count(
        scheduled
            .iter()
            .filter(|n| shown(n).is_some_and(|p| is_pod_available(&p, min_ready, now)))
            .count(),
    );
    st.updated_number_scheduled = count(
        scheduled
            .iter()
            .filter(|n| n.pods.iter().any(|p| is_updated(p, hash)))
            .count(),
    );
    st.number_unavailable = (st.desired_number_scheduled - st.number_available).max(0);
    st.observed_generation = util::generation(ds);
    st
}

/// The reconciler of DaemonSets.
pub struct DaemonSetController {
    daemon_sets: Informer<DaemonSet>,
    nodes: Informer<Node>,
    pods: PodControl,
}

impl std::fmt::Debug for DaemonSetController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonSetController")
            .finish_non_exhaustive()
    }
}

impl DaemonSetController {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        DaemonSetController {
            daemon_sets: informers.get::<DaemonSet>(),
            nodes: informers.get::<Node>(),
            pods: PodControl::new(informers.client().clone(), recorder, informers.get::<Pod>()),
        }
    }

    /// The controller: DaemonSets, the pods they own, orphan pods their selectors match, and
    /// every Node (a node change can change every DaemonSet's plan).
    pub fn controller(informers: &Informers) -> Controller<DaemonSet> {
        let daemon_sets = informers.get::<DaemonSet>();
        let for_nodes = daemon_sets.clone();
        let pods = informers.get::<Pod>();
        let nodes = informers.get::<Node>();
        Controller::<DaemonSet>::new(informers)
            .named("daemonset")
            .watches_owned::<Pod>()
            .watches(&pods, move |pod: &Pod| {
                adopters(&daemon_sets, pod, |o| {
                    o.spec
                        .as_ref()
                        .and_then(|s| s.selector.as_ref())
                        .map(std::borrow::Cow::Borrowed)
                })
            })
            .watches(&nodes, move |_: &Node| {
                for_nodes
                    .list()
                    .iter()
                    .map(|ds| ObjectKey::of(&**ds))
                    .collect()
            })
    }

    /// Runs the DaemonSet controller with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(DaemonSetController::new(informers, recorder));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    /// Every node with its eligibility and the daemon pods there (pods for nodes that no
    /// longer exist are listed under their node name, with nothing allowed).
    fn node_states(&self, ds: &DaemonSet, owned: &[Arc<Pod>]) -> Vec<NodeState> {
        let template = ds
            .spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .and_then(|t| t.spec.clone())
            .unwrap_or_default();
        let mut by_node: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for p in owned.iter().filter(|p| !is_terminating(&***p)) {
            if let Some(n) = target_node(p) {
                by_node.entry(n).or_default().push(Arc::clone(p));
            }
        }
        for pods in by_node.values_mut() {
            pods.sort_by(|a, b| {
                util::creation_timestamp(&**a)
                    .cmp(util::creation_timestamp(&**b))
                    .then_with(|| a.name().cmp(b.name()))
            });
        }
        let mut out = Vec::new();
        for node in self.nodes.list() {
            let (should_run, should_continue) = should_run(&template, &node);
            out.push(NodeState {
                name: node.name().to_string(),
                should_run,
                should_continue,
                pods: by_node.remove(node.name()).unwrap_or_default(),
            });
        }
        out.extend(by_node.into_iter().map(|(name, pods)| NodeState {
            name,
            should_run: false,
            should_continue: false,
            pods,
        }));
        out
    }
}

impl Reconciler for DaemonSetController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(ds) = self.daemon_sets.get(key) else {
            self.pods.expectations.forget(key);
            return Ok(Action::Done);
        };
        let spec = ds.spec.clone().unwrap_or_default();
        let Some(owned) = self.pods.claim(&*ds, spec.selector.as_ref()).await? else {
            return Ok(Action::Done);
        };
        let hash = revision_hash(&ds);
        let nodes = self.node_states(&ds, &owned);
        let now = Utc::now();
        let pending = self.pods.expectations.pending(key, &self.pods.pods);
        let mut applied = Ok(());
        if pending.is_none() && !is_terminating(&*ds) {
            let desired =
                i32::try_from(nodes.iter().filter(|n| n.should_run).count()).unwrap_or(i32::MAX);
            let strategy = spec.update_strategy.clone().unwrap_or_default();
            let update = if strategy.r#type == "OnDelete" {
                Update::OnDelete
            } else {
                let ru = strategy.rolling_update.unwrap_or_default();
                // Both round up (Kubernetes' daemon controller); both 0 would stall.
                let surge = scaled_value(ru.max_surge.as_deref(), desired, true).unwrap_or(0);
                let mut unavailable =
                    scaled_value(ru.max_unavailable.as_deref(), desired, true).unwrap_or(1);
                if surge <= 0 && unavailable <= 0 {
                    unavailable = 1;
                }
                Update::Rolling {
                    surge: surge.max(0),
                    unavailable,
                }
            };
            let plan = plan(&nodes, &hash, update, spec.min_ready_seconds, now);
            if plan != DaemonSetPlan::default() {
                tracing::debug!(daemonset = %key, create = ?plan.create, delete = ?plan.delete, "daemon pods");
                let create: Vec<Pod> = plan
                    .create
                    .iter()
                    .map(|node| pod_for_node(&ds, node, &hash))
                    .collect();
                applied = self.pods.apply(key, &*ds, &plan.delete, &create).await;
            }
        }
        let status = status_of(&ds, &nodes, &hash, now);
        if ds.status.as_ref() != Some(&status)
            && !(ds.status.is_none() && status == DaemonSetStatus::default())
        {
            let mut updated = (*ds).clone();
            updated.status = Some(status);
            self.pods
                .client
                .namespaced::<DaemonSet>(ds.namespace())
                .update_status(&updated)
                .await
                .during(|| format!("updating the status of daemon set {key}"))?;
        }
        applied?;
        let next = util::requeue_for_availability(
            pending,
            nodes.iter().flat_map(|n| &n.pods),
            spec.min_ready_seconds,
            now,
        );
        Ok(next.map_or(Action::Done, Action::RequeueAfter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{Condition, DaemonSetSpec, NodeSpec, PodStatus, PodTemplateSpec, Taint};

    fn node(name: &str, labels: &[(&str, &str)], taints: &[(&str, &str)]) -> Node {
        Node {
            metadata: Some(ObjectMeta {
                name: name.into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }),
            spec: Some(NodeSpec {
                taints: taints
                    .iter()
                    .map(|(k, e)| Taint {
                        key: k.to_string(),
                        effect: e.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(name: &str, hash: &str, ready_for_s: Option<i64>) -> Arc<Pod> {
        let mut conditions = Vec::new();
        if let Some(s) = ready_for_s {
            conditions.push(Condition {
                r#type: "Ready".into(),
                status: "True".into(),
                last_transition_time: util::format_time(Utc::now() - chrono::TimeDelta::seconds(s)),
                ..Default::default()
            });
        }
        Arc::new(Pod {
            metadata: Some(ObjectMeta {
                name: name.into(),
                labels: [(REVISION_HASH.to_string(), hash.to_string())].into(),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: "Running".into(),
                conditions,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn state(name: &str, run: bool, pods: Vec<Arc<Pod>>) -> NodeState {
        NodeState {
            name: name.into(),
            should_run: run,
            should_continue: run,
            pods,
        }
    }

    #[test]
    fn eligibility_follows_selector_affinity_and_taints() {
        let spec = PodSpec {
            node_selector: [("disk".to_string(), "ssd".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            should_run(&spec, &node("a", &[("disk", "ssd")], &[])),
            (true, true)
        );
        assert_eq!(should_run(&spec, &node("b", &[], &[])), (false, false));
        let any = PodSpec::default();
        // NoSchedule: no new pod, an existing one stays; NoExecute: gone.
        assert_eq!(
            should_run(&any, &node("c", &[], &[("dedicated", "NoSchedule")])),
            (false, true)
        );
        assert_eq!(
            should_run(&any, &node("d", &[], &[("dedicated", "NoExecute")])),
            (false, false)
        );
        // The daemon tolerations: a not-ready or cordoned node keeps its daemons.
        assert_eq!(
            should_run(
                &any,
                &node("e", &[], &[("node.kubernetes.io/not-ready", "NoExecute")])
            ),
            (true, true)
        );
        assert_eq!(
            should_run(
                &any,
                &node(
                    "f",
                    &[],
                    &[("node.kubernetes.io/unschedulable", "NoSchedule")]
                )
            ),
            (true, true)
        );
        let tolerant = PodSpec {
            tolerations: vec![Toleration {
                key: "dedicated".into(),
                operator: "Exists".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            should_run(&tolerant, &node("g", &[], &[("dedicated", "NoExecute")])),
            (true, true)
        );
    }

    #[test]
    fn pods_are_pinned_to_their_node_by_affinity() {
        let ds = DaemonSet {
            metadata: Some(ObjectMeta {
                name: "agent".into(),
                namespace: "kube-system".into(),
                uid: "u1".into(),
                generation: 3,
                ..Default::default()
            }),
            spec: Some(DaemonSetSpec {
                template: Some(PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: [("app".to_string(), "agent".to_string())].into(),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec::default()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let p = pod_for_node(&ds, "node-2", "abc");
        assert_eq!(target_node(&p).as_deref(), Some("node-2"));
        assert_eq!(
            labels(&p).get(REVISION_HASH).map(String::as_str),
            Some("abc")
        );
        assert_eq!(labels(&p).get("app").map(String::as_str), Some("agent"));
        assert_eq!(p.metadata.as_ref().unwrap().generate_name, "agent-");
        let tolerations = &p.spec.as_ref().unwrap().tolerations;
        assert!(
            tolerations
                .iter()
                .any(|t| t.key == "node.kubernetes.io/unreachable")
        );
        assert_eq!(
            skiff_client::controller::controller_of(&p).map(|o| o.uid.as_str()),
            Some("u1")
        );
    }

    #[test]
    fn creates_where_missing_and_removes_where_not_wanted() {
        let nodes = [
            state("a", true, vec![]),
            state("b", true, vec![pod("b1", "h", Some(100))]),
            state("c", false, vec![pod("c1", "h", Some(100))]),
            NodeState {
                name: "d".into(),
                should_run: false,
                should_continue: true,
                pods: vec![pod("d1", "h", Some(100))],
            },
            state(
                "e",
                true,
                vec![pod("e1", "h", Some(100)), pod("e2", "h", Some(50))],
            ),
        ];
        let p = plan(&nodes, "h", Update::OnDelete, 0, Utc::now());
        assert_eq!(p.create, ["a"]);
        // c: not wanted; d: only NoSchedule, stays; e: the newer of two goes.
        assert_eq!(p.delete, ["c1", "e2"]);
    }

    #[test]
    fn rolling_update_never_exceeds_max_unavailable() {
        let nodes: Vec<NodeState> = (0..5)
            .map(|i| {
                state(
                    &format!("n{i}"),
                    true,
                    vec![pod(&format!("old{i}"), "v1", Some(100))],
                )
            })
            .collect();
        let update = Update::Rolling {
            surge: 0,
            unavailable: 2,
        };
        let p = plan(&nodes, "v2", update, 0, Utc::now());
        assert_eq!(p.delete, ["old0", "old1"]);
        assert!(p.create.is_empty());
        // Next pass: n0 has a new pod that is not ready yet, n1 none: nothing more goes.
        let mut next = nodes.clone();
        next[0].pods = vec![pod("new0", "v2", None)];
        next[1].pods = vec![];
        let p = plan(&next, "v2", update, 0, Utc::now());
        assert_eq!(p.create, ["n1"]);
        assert!(p.delete.is_empty(), "{p:?}");
        // n0's new pod ready: one more may go.
        next[0].pods = vec![pod("new0", "v2", Some(1))];
        let p = plan(&next, "v2", update, 0, Utc::now());
        assert_eq!(p.delete, ["old2"]);
        // minReadySeconds: ready for 1 s is not available yet.
        let p = plan(&next, "v2", update, 30, Utc::now());
        assert!(p.delete.is_empty(), "{p:?}");
        // An old pod that is not available is replaced at once.
        next[3].pods = vec![pod("old3", "v1", None)];
        let p = plan(&next, "v2", update, 0, Utc::now());
        assert!(p.delete.contains(&"old3".to_string()), "{p:?}");
    }

    #[test]
    fn rolling_update_with_surge_starts_new_pods_beside_old_ones() {
        let nodes: Vec<NodeState> = (0..3)
            .map(|i| {
                state(
                    &format!("n{i}"),
                    true,
                    vec![pod(&format!("old{i}"), "v1", Some(100))],
                )
            })
            .collect();
        let update = Update::Rolling {
            surge: 1,
            unavailable: 0,
        };
        let p = plan(&nodes, "v2", update, 0, Utc::now());
        assert_eq!(p.create, ["n0"]);
        assert!(p.delete.is_empty());
        let mut next = nodes.clone();
        next[0].pods.push(pod("new0", "v2", None));
        let p = plan(&next, "v2", update, 0, Utc::now());
        assert_eq!(p, DaemonSetPlan::default(), "waits for the new pod");
        next[0].pods[1] = pod("new0", "v2", Some(1));
        let p = plan(&next, "v2", update, 0, Utc::now());
        assert_eq!(p.delete, ["old0"]);
        // new0 is available: old0 goes and the surge slot is free for the next node.
        assert_eq!(p.create, ["n1"]);
    }

    #[test]
    fn status_counts_desired_current_ready_updated() {
        let ds = DaemonSet {
            metadata: Some(ObjectMeta {
                generation: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let nodes = [
            state("a", true, vec![pod("a1", "v2", Some(10))]),
            state("b", true, vec![pod("b1", "v1", None)]),
            state("c", true, vec![]),
            state("d", false, vec![pod("d1", "v1", Some(10))]),
        ];
        let st = status_of(&ds, &nodes, "v2", Utc::now());
        assert_eq!(st.desired_number_scheduled, 3);
        assert_eq!(st.current_number_scheduled, 2);
        assert_eq!(st.number_misscheduled, 1);
        assert_eq!(st.number_ready, 1);
        assert_eq!(st.number_available, 1);
        assert_eq!(st.updated_number_scheduled, 1);
        assert_eq!(st.number_unavailable, 2);
        assert_eq!(st.observed_generation, 2);
    }
}
