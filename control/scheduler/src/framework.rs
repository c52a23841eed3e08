//! The scheduling framework: filter and score plugin traits, the per-pod context, the
//! profile (which plugins with which weights) and the algorithm that picks a node.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use rand::Rng;
use skiff_api::api::{Pod, PodSpec};

use crate::cache::{NodeInfo, PodInfo, Snapshot};
use crate::plugins;

/// Highest score a score plugin gives a node (before its weight).
pub const MAX_NODE_SCORE: i64 = 100;

/// Below this many nodes every node is checked, whatever the percentage.
pub const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;

/// Why a node does not fit: one or more reasons, in Kubernetes' wording
/// (`Insufficient cpu`, `node(s) had untolerated taint {dedicated: gpu}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit(pub Vec<Cow<'static, str>>);

impl Unfit {
    pub fn new(reason: impl Into<Cow<'static, str>>) -> Unfit {
        Unfit(vec![reason.into()])
    }
}

/// Everything the plugins know about the pod being scheduled, computed once per attempt.
#[derive(Debug, Clone)]
pub struct PodContext {
    pub info: PodInfo,
    /// State the inter-pod affinity pre-filter computed.
    pub inter_pod: plugins::InterPodState,
    /// State the volume binding pre-filter computed.
    pub volumes: crate::volumes::VolumeState,
}

static NO_SPEC: std::sync::LazyLock<PodSpec> = std::sync::LazyLock::new(PodSpec::default);

impl PodContext {
    pub fn new(info: PodInfo) -> PodContext {
        PodContext {
            info,
            inter_pod: Default::default(),
            volumes: Default::default(),
        }
    }

    pub fn pod(&self) -> &Pod {
        &self.info.pod
    }

    pub fn spec(&self) -> &PodSpec {
        self.info.pod.spec.as_ref().unwrap_or(&NO_SPEC)
    }
}

/// A filter: can the pod go on this node?
pub trait FilterPlugin: Send + Sync {
    fn name(&self) -> &'static str;

    /// Runs once per attempt before any node is filtered; an error rejects the pod on every
    /// node with that reason.
    fn pre_filter(&self, _cx: &mut PodContext, _snapshot: &Snapshot) -> Result<(), String> {
        Ok(())
    }

    fn filter(&self, cx: &PodContext, node: &NodeInfo) -> Result<(), Unfit>;
}

/// A score: how good is this (feasible) node for the pod, 0..=[`MAX_NODE_SCORE`] after
/// normalization.
pub trait ScorePlugin: Send + Sync {
    fn name(&self) -> &'static str;

    fn score(&self, cx: &PodContext, node: &NodeInfo) -> i64;

    /// Rescales the raw scores of all feasible nodes (same order as `nodes`) to
    /// 0..=[`MAX_NODE_SCORE`]. The default leaves them as they are.
    fn normalize(&self, _cx: &PodContext, _nodes: &[&NodeInfo], _scores: &mut [i64]) {}
}

/// The plugins a scheduler runs, filters in order and scores with weights.
pub struct Profile {
    pub filters: Vec<Box<dyn FilterPlugin>>,
    pub scores: Vec<(Box<dyn ScorePlugin>, i64)>,
}

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profile")
            .field(
                "filters",
                &self.filters.iter().map(|p| p.name()).collect::<Vec<_>>(),
            )
            .field(
                "scores",
                &self
                    .scores
                    .iter()
                    .map(|(p, w)| (p.name(), *w))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Default for Profile {
    /// The default plugins: filters cheapest first; score weights as Kubernetes' defaults
    /// (taints 3, node affinity 2, spreading 2, resources 1 each).
    fn default() -> Self {
        Profile {
            filters: vec![
                Box::new(plugins::NodeUnschedulable),
                Box::new(plugins::NodeName),
                Box::new(plugins::NodeReady),
                Box::new(plugins::TaintToleration),
                Box::new(plugins::NodeSelector),
                Box::new(plugins::NodeAffinity),
                Box::new(plugins::NodeResourcesFit),
                Box::new(plugins::InterPodAffinity),
            ],
            scores: vec![
                (Box::new(plugins::LeastAllocated), 1),
                (Box::new(plugins::BalancedAllocation), 1),
                (Box::new(plugins::SelectorSpread), 2),
                (Box::new(plugins::TaintToleration), 3),
                (Box::new(plugins::NodeAffinity), 2),
            ],
        }
    }
}

/// The node picked for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    /// Nodes the filters ran on.
    pub evaluated: usize,
    /// Of those, the ones that fit.
    pub feasible: usize,
}

/// Why no node fits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FitError {
    /// Schedulable-candidate nodes in the snapshot.
    pub nodes: usize,
    /// Reason → number of nodes rejected for it.
    pub reasons: BTreeMap<String, usize>,
    /// The plugins that rejected some node (to know which cluster changes may help).
    pub plugins: BTreeSet<&'static str>,
}

impl FitError {
    fn everywhere(nodes: usize, plugin: &'static str, reason: String) -> FitError {
        FitError {
            nodes,
            reasons: [(reason, nodes)].into(),
            plugins: [plugin].into(),
        }
    }

    /// Kubernetes' message: `0/5 nodes are available: 2 Insufficient cpu, 3 node(s) had
    /// untolerated taint {dedicated: gpu}.` (reasons sorted).
    pub fn message(&self) -> String {
        if self.nodes == 0 {
            return "0/0 nodes are available: no nodes available to schedule pods.".into();
        }
        let reasons: Vec<String> = self
            .reasons
            .iter()
            .map(|(r, n)| format!("{n} {r}"))
            .collect();
        format!(
            "0/{} nodes are available: {}.",
            self.nodes,
            reasons.join(", ")
        )
    }
}

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

/// How many feasible nodes to look for before stopping (Kubernetes'
/// `percentageOfNodesToScore`; 0 is adaptive: 50% minus 1% per 125 nodes, at least 5%).
pub fn num_feasible_nodes_to_find(nodes: usize, percentage: u32) -> usize {
    if nodes < MIN_FEASIBLE_NODES_TO_FIND || percentage >= 100 {
        return nodes;
    }
    let pct = if percentage == 0 {
        (50 - (nodes / 125) as i64).max(5) as usize
    } else {
        percentage as usize
    };
    (nodes * pct / 100).max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// Picks nodes for pods: filters, scores, the best node with a random tie-break.
pub struct Algorithm {
    pub profile: Profile,
    pub percentage_of_nodes_to_score: u32,
    /// Where the next search starts, so that partial searches rotate over the nodes.
    next_start: usize,
}

impl fmt::Debug for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Algorithm")
            .field("profile", &self.profile)
            .field(
                "percentage_of_nodes_to_score",
                &self.percentage_of_nodes_to_score,
            )
            .finish()
    }
}

impl Algorithm {
    pub fn new(profile: Profile, percentage_of_nodes_to_score: u32) -> Algorithm {
        Algorithm {
            profile,
            percentage_of_nodes_to_score,
            next_start: 0,
        }
    }

    /// Picks a node for `pod` among `snapshot`'s nodes.
    pub fn schedule(&mut self, snapshot: &Snapshot, pod: Arc<Pod>) -> Result<Placement, FitError> {
        let n = snapshot.len();
        let (info, problems) = PodInfo::new(pod);
        if !problems.is_empty() {
            return Err(FitError::everywhere(n, "PreFilter", problems.join("; ")));
        }
        if n == 0 {
            return Err(FitError::default());
        }
        let mut cx = PodContext::new(info);
        for f in &self.profile.filters {
            if let Err(reason) = f.pre_filter(&mut cx, snapshot) {
                return Err(FitError::everywhere(n, f.name(), reason));
            }
        }
        let want = num_feasible_nodes_to_find(n, self.percentage_of_nodes_to_score);
        let nodes = snapshot.nodes();
        let start = self.next_start % n;
        let mut feasible: Vec<&NodeInfo> = Vec::with_capacity(want.min(n));
        let mut failed = FitError {
            nodes: n,
            ..Default::default()
        };
        let mut evaluated = 0;
        for i in 0..n {
            let node = &nodes[(start + i) % n];
            evaluated += 1;
            match self
                .profile
                .filters
                .iter()
                .find_map(|f| f.filter(&cx, node).err().map(|e| (f.name(), e)))
            {
                None => {
                    feasible.push(node);
                    if feasible.len() >= want {
                        break;
                    }
                }
                Some((plugin, unfit)) => {
                    failed.plugins.insert(plugin);
                    for r in unfit.0 {
                        *failed.reasons.entry(r.into_owned()).or_insert(0) += 1;
                    }
                }
            }
        }
        self.next_start = (start + evaluated) % n;
        if feasible.is_empty() {
            return Err(failed);
        }
        let count = feasible.len();
        if count == 1 {
            return Ok(Placement {
                node: feasible[0].name.clone(),
                evaluated,
                feasible: 1,
            });
        }
        let mut totals = vec![0i64; count];
        let mut scores = vec![0i64; count];
        for (plugin, weight) in &self.profile.scores {
            for (s, node) in scores.iter_mut().zip(&feasible) {
                *s = plugin.score(&cx, node);
            }
            plugin.normalize(&cx, &feasible, &mut scores);
            for (t, s) in totals.iter_mut().zip(&scores) {
                *t += weight * s;
            }
        }
        Ok(Placement {
            node: feasible[pick_best(&totals, &mut rand::rng())].name.clone(),
            evaluated,
            feasible: count,
        })
    }
}

/// The index of the highest score, a uniformly random one among equals.
pub fn pick_best(scores: &[i64], rng: &mut impl Rng) -> usize {
    let mut best = 0;
    let mut ties = 0u32;
    for (i, &s) in scores.iter().enumerate() {
        if i == 0 || s > scores[best] {
            best = i;
            ties = 1;
        } else if s == scores[best] {
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Cache;
    use skiff_testkit::build::{bound, node, pod_with_cpu, taint};

    #[test]
    fn feasible_nodes_to_find() {
        assert_eq!(num_feasible_nodes_to_find(50, 0), 50);
        // 100 nodes at 50% is 50, raised to the minimum of 100.
        assert_eq!(num_feasible_nodes_to_find(100, 0), 100);
        assert_eq!(num_feasible_nodes_to_find(1000, 0), 420);
        assert_eq!(num_feasible_nodes_to_find(5000, 0), 500);
        assert_eq!(num_feasible_nodes_to_find(1000, 100), 1000);
        assert_eq!(num_feasible_nodes_to_find(1000, 20), 200);
        assert_eq!(num_feasible_nodes_to_find(1000, 1), 100);
    }

    #[test]
    fn ties_are_broken_at_random() {
        let mut rng = rand::rng();
        let mut seen = [0; 3];
        for _ in 0..300 {
            seen[pick_best(&[1, 5, 5, 5, 2][1..4], &mut rng)] += 1;
        }
        assert!(seen.iter().all(|&c| c > 30), "{seen:?}");
        assert_eq!(pick_best(&[1, 9, 3], &mut rng), 1);
        assert_eq!(pick_best(&[7], &mut rng), 0);
    }

    #[test]
    fn message_counts_reasons() {
        let e = FitError {
            nodes: 5,
            reasons: [
                (
                    "node(s) had untolerated taint {dedicated: gpu}".to_string(),
                    3,
                ),
                ("Insufficient cpu".to_string(), 2),
            ]
            .into(),
            plugins: BTreeSet::new(),
        };
        assert_eq!(
            e.message(),
            "0/5 nodes are available: 2 Insufficient cpu, 3 node(s) had untolerated taint \
             {dedicated: gpu}."
        );
    }

    #[test]
    fn picks_a_fitting_node_or_says_why_not() {
        let mut c = Cache::new();
        c.set_node(node("small", "1", "1Gi"));
        c.set_node(node("big", "8", "32Gi"));
        let mut gpu = node("gpu", "16", "64Gi");
        if let Some(s) = gpu.spec.as_mut() {
            s.taints.push(taint("dedicated", "gpu", "NoSchedule"));
        }
        c.set_node(gpu);
        let mut s = Snapshot::new();
        c.update_snapshot(&mut s);
        let mut alg = Algorithm::new(Profile::default(), 0);
        let p = alg
            .schedule(&s, Arc::new(pod_with_cpu("a", "2")))
            .expect("fits on big");
        assert_eq!(p.node, "big");
        assert_eq!((p.evaluated, p.feasible), (3, 1));
        let e = alg
            .schedule(&s, Arc::new(pod_with_cpu("b", "10")))
            .unwrap_err();
        assert_eq!(
            e.message(),
            "0/3 nodes are available: 2 Insufficient cpu, 1 node(s) had untolerated taint \
             {dedicated: gpu}."
        );
        assert!(e.plugins.contains("NodeResourcesFit"));
        assert!(e.plugins.contains("TaintToleration"));
        let e = alg
            .schedule(&s, Arc::new(pod_with_cpu("c", "lots")))
            .unwrap_err();
        assert!(
            e.message().starts_with(
                "0/3 nodes are available: 3 invalid resource request: cpu: invalid quantity"
            ),
            "{}",
            e.message()
        );
        let e = alg
            .schedule(&Snapshot::new(), Arc::new(pod_with_cpu("d", "1")))
            .unwrap_err();
        assert_eq!(
            e.message(),
            "0/0 nodes are available: no nodes available to schedule pods."
        );
    }

    #[test]
    fn least_allocated_node_wins() {
        let mut c = Cache::new();
        c.set_node(node("busy", "4", "8Gi"));
        c.set_node(node("idle", "4", "8Gi"));
        c.set_bound_pod(Arc::new(bound(pod_with_cpu("x", "3"), "busy")));
        let mut s = Snapshot::new();
        c.update_snapshot(&mut s);
        let mut alg = Algorithm::new(Profile::default(), 0);
        for i in 0..10 {
            let p = alg
                .schedule(&s, Arc::new(pod_with_cpu(&format!("p{i}"), "500m")))
                .unwrap();
            assert_eq!(p.node, "idle");
        }
    }
}
