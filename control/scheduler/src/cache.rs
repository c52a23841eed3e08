//! The scheduler's view of the cluster: one [`NodeInfo`] per node with the pods bound (or
//! assumed bound) to it and the sum of their requests, kept current from node and pod watch
//! events. Nothing is recomputed per scheduling attempt: [`Cache::update_snapshot`] copies
//! only the nodes that changed since the last snapshot (copy-on-write `Arc`s).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use skiff_api::Resource;
use skiff_api::api::{Node, Pod, Taint};
use skiff_client::reflector::object_key;

use crate::affinity::AffinityTerm;
use crate::resources::{PodRequests, Resources, pod_requests};

static NO_LABELS: LazyLock<BTreeMap<String, String>> = LazyLock::new(BTreeMap::new);

/// A pod's labels (empty if it has none).
pub fn pod_labels(pod: &Pod) -> &BTreeMap<String, String> {
    pod.metadata
        .as_ref()
        .map(|m| &m.labels)
        .unwrap_or(&NO_LABELS)
}

/// The uid of the pod's controlling owner (its ReplicaSet, ...), if any.
pub fn controller_uid(pod: &Pod) -> Option<&str> {
    let refs = &pod.metadata.as_ref()?.owner_references;
    refs.iter()
        .find(|r| r.controller == Some(true))
        .or_else(|| refs.first())
        .map(|r| r.uid.as_str())
        .filter(|u| !u.is_empty())
}

/// A pod with what the scheduler derives from it, computed once.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub key: String,
    pub pod: Arc<Pod>,
    pub requests: PodRequests,
    pub owner_uid: Option<String>,
    pub required_affinity: Vec<AffinityTerm>,
    pub required_anti_affinity: Vec<AffinityTerm>,
}

impl PodInfo {
    /// Derives the pod's requests and affinity terms. What cannot be read is left out and
    /// described in the returned problems (for a pod to schedule, a reason not to; for a pod
    /// already on a node, a warning).
    pub fn new(pod: Arc<Pod>) -> (PodInfo, Vec<String>) {
        let mut problems = Vec::new();
        let spec = pod.spec.clone().unwrap_or_default();
        let requests = match pod_requests(&spec) {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("invalid resource request: {e}"));
                PodRequests::default()
            }
        };
        let ns = pod.namespace().to_string();
        let mut parse_terms = |terms: Option<&Vec<skiff_api::api::PodAffinityTerm>>, what: &str| {
            let mut out = Vec::new();
            for (i, t) in terms.into_iter().flatten().enumerate() {
                match AffinityTerm::parse(t, &ns) {
                    Ok(t) => out.push(t),
                    Err(e) => problems.push(format!("invalid {what} term {i}: {e}")),
                }
            }
            out
        };
        let affinity = spec.affinity.as_ref();
        let required_affinity = parse_terms(
            affinity
                .and_then(|a| a.pod_affinity.as_ref())
                .map(|a| &a.required_during_scheduling_ignored_during_execution),
            "pod affinity",
        );
        let required_anti_affinity = parse_terms(
            affinity
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .map(|a| &a.required_during_scheduling_ignored_during_execution),
            "pod anti-affinity",
        );
        let info = PodInfo {
            key: object_key(&*pod),
            owner_uid: controller_uid(&pod).map(str::to_string),
            pod,
            requests,
            required_affinity,
            required_anti_affinity,
        };
        (info, problems)
    }

    pub fn namespace(&self) -> &str {
        self.pod.namespace()
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        pod_labels(&self.pod)
    }
}

/// Whether a node condition of `type` is `True`.
fn condition_true(node: &Node, kind: &str) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == kind))
        .is_some_and(|c| c.status == "True")
}

/// One node and what runs on it.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    pub name: String,
    /// `None` while the cache knows pods bound to a node it has not seen (or no longer sees).
    pub node: Option<Arc<Node>>,
    pub allocatable: Resources,
    /// Sum of the pods' requests; `pods` is their number.
    pub requested: Resources,
    /// CPU and memory requested with the scoring defaults for request-less containers.
    pub non_zero_milli_cpu: i64,
    pub non_zero_memory: i64,
    pub pods: HashMap<String, Arc<PodInfo>>,
    /// How many pods here have required pod anti-affinity terms.
    pub pods_with_required_anti_affinity: usize,
    /// Pods here per controlling owner uid.
    pub owner_counts: HashMap<String, u32>,
    pub ready: bool,
    pub unschedulable: bool,
    /// Bumped on every change.
    pub generation: u64,
}

impl NodeInfo {
    fn new(name: &str) -> NodeInfo {
        NodeInfo {
            name: name.to_string(),
            ..Default::default()
        }
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        self.node
            .as_ref()
            .and_then(|n| n.metadata.as_ref())
            .map(|m| &m.labels)
            .unwrap_or(&NO_LABELS)
    }

    pub fn taints(&self) -> &[Taint] {
        self.node
            .as_ref()
            .and_then(|n| n.spec.as_ref())
            .map(|s| s.taints.as_slice())
            .unwrap_or(&[])
    }

    fn set_node(&mut self, node: Arc<Node>) {
        let (allocatable, errors) = Resources::from_list(
            node.status
                .as_ref()
                .map(|s| {
                    if s.allocatable.is_empty() {
                        &s.capacity
                    } else {
                        &s.allocatable
                    }
                })
                .unwrap_or(&BTreeMap::new()),
        );
        for e in errors {
            tracing::warn!(node = %self.name, error = %e, "node allocatable entry ignored");
        }
        self.allocatable = allocatable;
        self.ready = condition_true(&node, "Ready");
        self.unschedulable = node.spec.as_ref().is_some_and(|s| s.unschedulable);
        self.node = Some(node);
    }

    fn add_pod(&mut self, info: Arc<PodInfo>) {
        self.requested.add(&info.requests.requests);
        self.requested.pods += 1;
        self.non_zero_milli_cpu += info.requests.non_zero_milli_cpu;
        self.non_zero_memory += info.requests.non_zero_memory;
        if !info.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity += 1;
        }
        if let Some(o) = &info.owner_uid {
            *self.owner_counts.entry(o.clone()).or_insert(0) += 1;
        }
        if let Some(old) = self.pods.insert(info.key.clone(), info) {
            // Replaced: undo the old one's accounting.
            self.unaccount(&old);
        }
    }

    fn unaccount(&mut self, info: &PodInfo) {
        self.requested.sub(&info.requests.requests);
        self.requested.pods -= 1;
        self.non_zero_milli_cpu -= info.requests.non_zero_milli_cpu;
        self.non_zero_memory -= info.requests.non_zero_memory;
        if !info.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity -= 1;
        }
        if let Some(o) = &info.owner_uid
            && let Some(c) = self.owner_counts.get_mut(o)
        {
            *c -= 1;
            if *c == 0 {
                self.owner_counts.remove(o);
            }
        }
    }

    fn remove_pod(&mut self, key: &str) -> bool {
        match self.pods.remove(key) {
            Some(old) => {
                self.unaccount(&old);
                true
            }
            None => false,
        }
    }

    /// Pods here whose controlling owner is `owner_uid`.
    pub fn owner_count(&self, owner_uid: &str) -> u32 {
        self.owner_counts.get(owner_uid).copied().unwrap_or(0)
    }
}

/// What a node change means for pods waiting for a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeChange {
    Added,
    /// Something the filters look at changed (allocatable, labels, taints, readiness,
    /// unschedulable).
    Updated,
    /// Nothing the filters look at (a heartbeat).
    Unchanged,
}

/// Whether two versions of a node differ in anything scheduling looks at.
fn scheduling_relevant_change(old: &Node, new: &Node) -> bool {
    let labels = |n: &Node| n.metadata.as_ref().map(|m| m.labels.clone());
    let spec = |n: &Node| n.spec.as_ref().map(|s| (s.unschedulable, s.taints.clone()));
    let alloc = |n: &Node| {
        n.status
            .as_ref()
            .map(|s| (s.allocatable.clone(), s.capacity.clone()))
    };
    labels(old) != labels(new)
        || spec(old) != spec(new)
        || alloc(old) != alloc(new)
        || condition_true(old, "Ready") != condition_true(new, "Ready")
}

#[derive(Debug)]
struct PodState {
    node: String,
    assumed: bool,
    /// For an assumed pod whose binding call returned: forget it then if the watch has not
    /// confirmed it by that time.
    deadline: Option<Instant>,
}

/// The node and pod bookkeeping. Not thread-safe by itself: the scheduler keeps it behind
/// one lock.
#[derive(Debug, Default)]
pub struct Cache {
    nodes: HashMap<String, Arc<NodeInfo>>,
    pods: HashMap<String, PodState>,
    /// Nodes changed since the last snapshot.
    dirty: HashSet<String>,
    generation: u64,
    /// Nodes whose Node object the cache has.
    node_count: usize,
}

impl Cache {
    pub fn new() -> Cache {
        Cache::default()
    }

    fn node_mut(&mut self, name: &str) -> &mut NodeInfo {
        self.generation += 1;
        let generation = self.generation;
        self.dirty.insert(name.to_string());
        let entry = self
            .nodes
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(NodeInfo::new(name)));
        let info = Arc::make_mut(entry);
        info.generation = generation;
        info
    }

    /// Adds or updates a node.
    pub fn set_node(&mut self, node: Node) -> NodeChange {
        let name = node.name().to_string();
        let change = match self.nodes.get(&name).and_then(|n| n.node.as_ref()) {
            None => NodeChange::Added,
            Some(old) if scheduling_relevant_change(old, &node) => NodeChange::Updated,
            Some(_) => NodeChange::Unchanged,
        };
        if change == NodeChange::Added {
            self.node_count += 1;
        }
        if change == NodeChange::Unchanged {
            // Keep the newest object without bumping the snapshot.
            if let Some(info) = self.nodes.get_mut(&name) {
                Arc::make_mut(info).node = Some(Arc::new(node));
            }
            return change;
        }
        self.node_mut(&name).set_node(Arc::new(node));
        change
    }

    /// Removes a node. Its pods stay accounted (under a node-less entry) until they go.
    pub fn remove_node(&mut self, name: &str) {
        let Some(info) = self.nodes.get(name) else {
            return;
        };
        if info.node.is_some() {
            self.node_count -= 1;
        }
        if info.pods.is_empty() {
            self.nodes.remove(name);
            self.dirty.insert(name.to_string());
        } else {
            let n = self.node_mut(name);
            n.node = None;
        }
    }

    /// Makes the node set exactly `nodes` (after a relist).
    pub fn replace_nodes(&mut self, nodes: Vec<Node>) {
        let names: HashSet<String> = nodes.iter().map(|n| n.name().to_string()).collect();
        let gone: Vec<String> = self
            .nodes
            .iter()
            .filter(|(k, v)| v.node.is_some() && !names.contains(*k))
            .map(|(k, _)| k.clone())
            .collect();
        for name in gone {
            self.remove_node(&name);
        }
        for n in nodes {
            self.set_node(n);
        }
    }

    /// Nodes with a Node object.
    pub fn node_count(&self) -> usize {
        self.node_count
    }

    pub fn node(&self, name: &str) -> Option<&Arc<NodeInfo>> {
        self.nodes.get(name)
    }

    pub fn is_assumed(&self, key: &str) -> bool {
        self.pods.get(key).is_some_and(|p| p.assumed)
    }

    /// Whether the cache accounts for the pod (bound or assumed).
    pub fn has_pod(&self, key: &str) -> bool {
        self.pods.contains_key(key)
    }

    /// Adds or updates a pod that is bound to a node (as seen by the watch). Confirms it if
    /// it was assumed. Returns whether the pod is new to the cache (not a confirmation or
    /// an update).
    pub fn set_bound_pod(&mut self, pod: Arc<Pod>) -> bool {
        let node = pod
            .spec
            .as_ref()
            .map(|s| s.node_name.clone())
            .unwrap_or_default();
        let (info, problems) = PodInfo::new(pod);
        if !problems.is_empty() {
            tracing::warn!(pod = %info.key, ?problems, "bound pod accounted without the parts that do not parse");
        }
        let key = info.key.clone();
        let previous = self.pods.insert(
            key.clone(),
            PodState {
                node: node.clone(),
                assumed: false,
                deadline: None,
            },
        );
        let new = previous.is_none();
        if let Some(prev) = previous
            && prev.node != node
        {
            // Assumed on one node, bound to another (another scheduler won, or a relist).
            self.node_mut(&prev.node).remove_pod(&key);
            self.drop_empty_ghost(&prev.node);
        }
        self.node_mut(&node).add_pod(Arc::new(info));
        new
    }

    /// Removes a pod (deleted, finished, or forgotten). Returns whether it was accounted.
    pub fn remove_pod(&mut self, key: &str) -> bool {
        let Some(state) = self.pods.remove(key) else {
            return false;
        };
        self.node_mut(&state.node).remove_pod(key);
        self.drop_empty_ghost(&state.node);
        true
    }

    fn drop_empty_ghost(&mut self, node: &str) {
        if self
            .nodes
            .get(node)
            .is_some_and(|n| n.node.is_none() && n.pods.is_empty())
        {
            self.nodes.remove(node);
            self.dirty.insert(node.to_string());
        }
    }

    /// Accounts `info` on `node` before the binding is confirmed, so the next pods see it.
    pub fn assume_pod(&mut self, info: PodInfo, node: &str) {
        let key = info.key.clone();
        if self.pods.contains_key(&key) {
            self.remove_pod(&key);
        }
        self.pods.insert(
            key,
            PodState {
                node: node.to_string(),
                assumed: true,
                deadline: None,
            },
        );
        self.node_mut(node).add_pod(Arc::new(info));
    }

    /// The binding call for an assumed pod returned: expire the assumption after `ttl`
    /// unless the watch confirms it first.
    pub fn finish_binding(&mut self, key: &str, ttl: Duration) {
        if let Some(p) = self.pods.get_mut(key)
            && p.assumed
        {
            p.deadline = Some(Instant::now() + ttl);
        }
    }

    /// Drops an assumed pod (its binding failed).
    pub fn forget_pod(&mut self, key: &str) {
        if self.is_assumed(key) {
            self.remove_pod(key);
        }
    }

    /// Drops assumed pods whose binding returned more than their ttl ago without the watch
    /// confirming them. Returns their keys.
    pub fn cleanup_expired(&mut self, now: Instant) -> Vec<String> {
        let expired: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, p)| p.assumed && p.deadline.is_some_and(|d| d <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &expired {
            tracing::warn!(pod = %k, "assumed pod expired without the watch confirming its binding");
            self.remove_pod(k);
        }
        expired
    }

    /// Makes the bound pods exactly `pods` (after a relist); assumed pods not in the list
    /// are kept (their binding may not be visible yet).
    pub fn replace_bound_pods(&mut self, pods: Vec<Arc<Pod>>) {
        let keys: HashSet<String> = pods.iter().map(|p| object_key(&**p)).collect();
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(k, p)| !p.assumed && !keys.contains(*k))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.remove_pod(&k);
        }
        for p in pods {
            self.set_bound_pod(p);
        }
    }

    /// Brings `snapshot` up to date, copying only the nodes that changed since the last call.
    pub fn update_snapshot(&mut self, snapshot: &mut Snapshot) {
        for name in self.dirty.drain() {
            match self.nodes.get(&name) {
                Some(info) if info.node.is_some() => snapshot.upsert(info.clone()),
                _ => snapshot.remove(&name),
            }
        }
        snapshot.generation = self.generation;
    }
}

/// An immutable-per-cycle view of the schedulable nodes, updated incrementally.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    nodes: Vec<Arc<NodeInfo>>,
    index: HashMap<String, usize>,
    generation: u64,
}

impl Snapshot {
    pub fn new() -> Snapshot {
        Snapshot::default()
    }

    fn upsert(&mut self, info: Arc<NodeInfo>) {
        match self.index.get(&info.name) {
            Some(&i) => self.nodes[i] = info,
            None => {
                self.index.insert(info.name.clone(), self.nodes.len());
                self.nodes.push(info);
            }
        }
    }

    fn remove(&mut self, name: &str) {
        if let Some(i) = self.index.remove(name) {
            self.nodes.swap_remove(i);
            if let Some(moved) = self.nodes.get(i) {
                self.index.insert(moved.name.clone(), i);
            }
        }
    }

    pub fn nodes(&self) -> &[Arc<NodeInfo>] {
        &self.nodes
    }

    pub fn get(&self, name: &str) -> Option<&Arc<NodeInfo>> {
        self.index.get(name).map(|&i| &self.nodes[i])
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The cache generation this snapshot reflects.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_testkit::build::{bound, node, pod_with_cpu};

    #[test]
    fn accounting_follows_pods() {
        let mut c = Cache::new();
        assert_eq!(c.set_node(node("n1", "4", "8Gi")), NodeChange::Added);
        assert!(c.set_bound_pod(Arc::new(bound(pod_with_cpu("a", "1"), "n1"))));
        assert!(!c.set_bound_pod(Arc::new(bound(pod_with_cpu("a", "1"), "n1"))));
        c.set_bound_pod(Arc::new(bound(pod_with_cpu("b", "500m"), "n1")));
        let n = c.node("n1").unwrap();
        assert_eq!(n.requested.milli_cpu, 1500);
        assert_eq!(n.requested.pods, 2);
        assert_eq!(n.allocatable.milli_cpu, 4000);
        assert!(c.remove_pod("default/a"));
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 500);
        assert!(!c.remove_pod("default/a"));
    }

    #[test]
    fn assumed_pods_are_confirmed_or_forgotten() {
        let mut c = Cache::new();
        c.set_node(node("n1", "4", "8Gi"));
        c.set_node(node("n2", "4", "8Gi"));
        let (info, _) = PodInfo::new(Arc::new(pod_with_cpu("a", "1")));
        c.assume_pod(info, "n1");
        assert!(c.is_assumed("default/a"));
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 1000);
        // The watch shows it bound elsewhere: moved, confirmed.
        assert!(!c.set_bound_pod(Arc::new(bound(pod_with_cpu("a", "1"), "n2"))));
        assert!(!c.is_assumed("default/a"));
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 0);
        assert_eq!(c.node("n2").unwrap().requested.milli_cpu, 1000);

        let (info, _) = PodInfo::new(Arc::new(pod_with_cpu("b", "1")));
        c.assume_pod(info, "n1");
        c.forget_pod("default/b");
        assert_eq!(c.node("n1").unwrap().requested.pods, 0);

        let (info, _) = PodInfo::new(Arc::new(pod_with_cpu("c", "1")));
        c.assume_pod(info, "n1");
        c.finish_binding("default/c", Duration::ZERO);
        assert_eq!(c.cleanup_expired(Instant::now()), vec!["default/c"]);
        assert!(!c.has_pod("default/c"));
    }

    #[test]
    fn snapshot_is_incremental() {
        let mut c = Cache::new();
        for i in 0..5 {
            c.set_node(node(&format!("n{i}"), "4", "8Gi"));
        }
        let mut s = Snapshot::new();
        c.update_snapshot(&mut s);
        assert_eq!(s.len(), 5);
        let before: Vec<Arc<NodeInfo>> = s.nodes().to_vec();
        c.set_bound_pod(Arc::new(bound(pod_with_cpu("a", "1"), "n3")));
        c.update_snapshot(&mut s);
        // Only n3 was replaced; the others are the same allocations.
        for (old, new) in before.iter().zip(s.nodes()) {
            assert_eq!(Arc::ptr_eq(old, new), new.name != "n3", "{}", new.name);
        }
        assert_eq!(s.get("n3").unwrap().requested.milli_cpu, 1000);
        // The snapshot taken before is unchanged (copy on write).
        assert_eq!(before[3].requested.milli_cpu, 0);
        c.remove_node("n1");
        c.update_snapshot(&mut s);
        assert_eq!(s.len(), 4);
        assert!(s.get("n1").is_none());
        for n in s.nodes() {
            assert_eq!(
                s.get(&n.name).map(|x| x.name.as_str()),
                Some(n.name.as_str())
            );
        }
        // A node removed while pods are bound to it: kept as a ghost, not schedulable.
        c.remove_node("n3");
        c.update_snapshot(&mut s);
        assert!(s.get("n3").is_none());
        assert_eq!(c.node_count(), 3);
        assert!(c.remove_pod("default/a"));
        assert!(c.node("n3").is_none());
    }

    #[test]
    fn heartbeats_are_not_relevant() {
        let mut c = Cache::new();
        let mut n = node("n1", "4", "8Gi");
        c.set_node(n.clone());
        if let Some(s) = n.status.as_mut() {
            s.conditions[0].last_heartbeat_time = "later".into();
        }
        assert_eq!(c.set_node(n.clone()), NodeChange::Unchanged);
        if let Some(s) = n.spec.as_mut() {
            s.unschedulable = true;
        }
        assert_eq!(c.set_node(n), NodeChange::Updated);
        assert!(c.node("n1").unwrap().unschedulable);
    }
}
