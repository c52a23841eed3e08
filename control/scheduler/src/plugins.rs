//! The filter and score plugins, named as in Kubernetes.

use std::collections::HashMap;

use skiff_api::taints::{
    self, NO_EXECUTE, NO_SCHEDULE, PREFER_NO_SCHEDULE, TAINT_NOT_READY, TAINT_UNSCHEDULABLE,
};

use crate::affinity;
use crate::cache::{NodeInfo, Snapshot};
use crate::framework::{FilterPlugin, MAX_NODE_SCORE, PodContext, ScorePlugin, Unfit};
use crate::resources::{CPU, MEMORY};

/// The label zone spreading looks at.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

pub const REASON_UNSCHEDULABLE: &str = "node(s) were unschedulable";
pub const REASON_NOT_READY: &str = "node(s) were not ready";
pub const REASON_NODE_NAME: &str = "node(s) didn't match the requested node name";
pub const REASON_NODE_SELECTOR: &str = "node(s) didn't match Pod's node affinity/selector";
pub const REASON_TOO_MANY_PODS: &str = "Too many pods";
pub const REASON_POD_AFFINITY: &str = "node(s) didn't match pod affinity rules";
pub const REASON_POD_ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
pub const REASON_EXISTING_ANTI_AFFINITY: &str =
    "node(s) didn't satisfy existing pods anti-affinity rules";

/// Cordoned nodes (`spec.unschedulable`) take only pods tolerating
/// `node.kubernetes.io/unschedulable`.
#[derive(Debug)]
pub struct NodeUnschedulable;

impl FilterPlugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        "NodeUnschedulable"
    }

    fn filter(&self, cx: &PodContext, node: &NodeInfo) -> Result<(), Unfit> {
        if node.unschedulable && !taints::tolerates_key(&cx.spec().tolerations, TAINT_UNSCHEDULABLE)
        {
            return Err(Unfit::new(REASON_UNSCHEDULABLE));
        }
        Ok(())
    }
}

/// `spec.nodeName` set on an unbound pod: only that node.
#[derive(Debug)]
pub struct NodeName;

impl FilterPlugin for NodeName {
    fn name(&self) -> &'static str {
        "NodeName"
    }

    fn filter(&self, cx: &PodContext, node: &NodeInfo) -> Result<(), Unfit> {
        let want = &cx.spec().node_name;
        if !want.is_empty() && *want != node.name {
            return Err(Unfit::new(REASON_NODE_NAME));
        }
        Ok(())
    }
}

/// Only nodes whose `Ready` condition is `True` (unless the pod tolerates
/// `node.kubernetes.io/not-ready`).
#[derive(Debug)]
pub struct NodeReady;

impl FilterPlugin for NodeReady {
    fn name(&self) -> &'static str {
        "NodeReady"
    }

    fn filter(&self, cx: &PodContext, node: &NodeInfo) -> Result<(), Unfit> {
        if !node.ready && !taints::tolerates_key(&cx.spec().tolerations, TAINT_NOT_READY) {
            return Err(Unfit::new(REASON_NOT_READY));
        }
        Ok(())
    }
}

/// Filter: every `NoSchedule`/`NoExecute` taint must be tolerated. Score: fewer untolerated
/// `PreferNoSchedule` taints is better.
#[derive(Debug)]
pub struct TaintToleration;

impl FilterPlugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    fn filter(&self, cx: &PodContext, node: &NodeInfo) -> Result<(), Unfit> {
        let tolerations = &cx.spec().tolerations;
        match taints::find_untolerated(node.taints(), tolerations, |e| {
            e == NO_SCHEDULE || e == NO_EXECUTE
        }) {
            Some(t) => Err(Unfit::new(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                t.key, t.value
            ))),
            None => Ok(()),
        }
    }
}

impl ScorePlugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    /// Raw: the number of untolerated `PreferNoSchedule` taints.
    fn score(&self, cx: &PodContext, node: &NodeInfo) -> i64 {
        let tolerations: Vec<_> = cx
            .spec()
            .tolerations
            .iter()
            .filter(|t| t.effect.is_empty() || t.effect == PREFER_NO_SCHEDULE)
            .cloned()
            .collect();
        node.taints()
            .iter()
            .filter(|t| t.effect == PREFER_NO_SCHEDULE && !taints::tolerated(&tolerations, t))
            .count() as i64
    }

    fn normalize(&self, _cx: &PodContext, _nodes: &[&NodeInfo], scores: &mut [i64]) {
        normalize(scores, true);
    }
}

/// Scales scores to 0..=MAX_NODE_SCORE by the largest; `reverse` makes the largest worst.
fn normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    for s in scores.iter_mut() {
        *s = if max == 0 {
            if reverse { MAX_NODE_SCORE } else { 0 }
        } else {
            let v = *s * MAX_NODE_SCORE / max;
            if reverse { MAX_NODE_SCORE - v } else { v }
        };
    }
}

/// `spec.nodeSelector`: every label must be on the node.
#[derive(Debug)]
pub struct NodeSelector;

impl FilterPlugin for NodeSelector {
    fn name(&self) -> &'static str {
        "NodeSelector"
    }

    fn filter(&self, cx: &PodContext, node: &NodeInfo) -> Result<(), Unfit> {
        let labels = node.labels();
        if cx
            .spec()
            .node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
        {
            Ok(())
        } else {
            Err(Unfit::new(REASON_NODE_SELECTOR))
        }
    }
}

/// Filter: the required node affinity terms (any term; all expressions of a term). Score: the
/// sum of the weights of the preferred terms the node matches.
#[derive(Debug)]
pub struct NodeAffinity;

impl FilterPlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn filter(&self, cx: &PodContext, node: &NodeInfo) -> Result<(), Unfit> {
        let required = cx
            .spec()
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            });
        match required {
            Some(sel) if !affinity::node_selector_matches(sel, &node.name, node.labels()) => {
                Err(Unfit::new(REASON_NODE_SELECTOR))
            }
            _ => Ok(()),
        }
    }
}

impl ScorePlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn score(&self, cx: &PodContext, node: &NodeInfo) -> i64 {
        let Some(na) = cx
            .spec()
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
        else {
            return 0;
        };
        na.preferred_during_scheduling_ignored_during_execution
            .iter()
            .filter(|p| {
                p.weight > 0
                    && p.preference
                        .as_ref()
                        .is_some_and(|t| affinity::term_matches(t, &node.name, node.labels()))
            })
            .map(|p| i64::from(p.weight))
            .sum()
    }

    fn normalize(&self, _cx: &PodContext, _nodes: &[&NodeInfo], scores: &mut [i64]) {
        normalize(scores, false);
    }
}

/// The node's allocatable minus what its pods request must cover the pod's requests, and
/// the node must have room for one more pod.
#[derive(Debug)]
pub struct NodeResourcesFit;

impl FilterPlugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    fn filter(&self, cx: &PodContext, node: &NodeInfo) -> Result<(), Unfit> {
        let mut reasons = Vec::new();
        let (alloc, used) = (&node.allocatable, &node.requested);
        if used.pods + 1 > alloc.pods {
            reasons.push(REASON_TOO_MANY_PODS.into());
        }
        let req = &cx.info.requests.requests;
        if req.milli_cpu > 0 && req.milli_cpu > alloc.milli_cpu - used.milli_cpu {
            reasons.push(format!("Insufficient {CPU}").into());
        }
        if req.memory > 0 && req.memory > alloc.memory - used.memory {
            reasons.push(format!("Insufficient {MEMORY}").into());
        }
        for (name, &want) in &req.scalar {
            if want > 0 && want > alloc.get(name) - used.get(name) {
                reasons.push(format!("Insufficient {name}").into());
            }
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(Unfit(reasons))
        }
    }
}

fn fraction(requested: i64, capacity: i64) -> f64 {
    if capacity <= 0 {
        return 1.0;
    }
    (requested as f64 / capacity as f64).min(1.0)
}

/// Prefers nodes with the most CPU and memory left after the pod (requests with defaults for
/// containers that request none).
#[derive(Debug)]
pub struct LeastAllocated;

impl ScorePlugin for LeastAllocated {
    fn name(&self) -> &'static str {
        "NodeResourcesLeastAllocated"
    }

    fn score(&self, cx: &PodContext, node: &NodeInfo) -> i64 {
        let least = |requested: i64, capacity: i64| {
            if capacity <= 0 || requested > capacity {
                0
            } else {
                (capacity - requested) * MAX_NODE_SCORE / capacity
            }
        };
        let r = &cx.info.requests;
        let cpu = least(
            node.non_zero_milli_cpu + r.non_zero_milli_cpu,
            node.allocatable.milli_cpu,
        );
        let mem = least(
            node.non_zero_memory + r.non_zero_memory,
            node.allocatable.memory,
        );
        (cpu + mem) / 2
    }
}

/// Prefers nodes where CPU and memory would be used in similar proportions.
#[derive(Debug)]
pub struct BalancedAllocation;

impl ScorePlugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        "NodeResourcesBalancedAllocation"
    }

    fn score(&self, cx: &PodContext, node: &NodeInfo) -> i64 {
        let r = &cx.info.requests;
        let cpu = fraction(
            node.non_zero_milli_cpu + r.non_zero_milli_cpu,
            node.allocatable.milli_cpu,
        );
        let mem = fraction(
            node.non_zero_memory + r.non_zero_memory,
            node.allocatable.memory,
        );
        let std = (cpu - mem).abs() / 2.0;
        ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
    }
}

/// Spreads the pods of one owner (ReplicaSet, ...) over nodes and zones: fewer pods of the
/// same owner on a node (and in its zone, weighted 2/3) is better.
#[derive(Debug)]
pub struct SelectorSpread;

const ZONE_WEIGHTING: f64 = 2.0 / 3.0;

impl ScorePlugin for SelectorSpread {
    fn name(&self) -> &'static str {
        "SelectorSpread"
    }

    /// Raw: pods of the same owner on the node.
    fn score(&self, cx: &PodContext, node: &NodeInfo) -> i64 {
        match &cx.info.owner_uid {
            Some(o) => i64::from(node.owner_count(o)),
            None => 0,
        }
    }

    fn normalize(&self, cx: &PodContext, nodes: &[&NodeInfo], scores: &mut [i64]) {
        if cx.info.owner_uid.is_none() {
            scores.fill(0);
            return;
        }
        let max_node = scores.iter().copied().max().unwrap_or(0);
        let mut zones: HashMap<&str, i64> = HashMap::new();
        for (n, s) in nodes.iter().zip(scores.iter()) {
            if let Some(z) = n.labels().get(ZONE_LABEL) {
                *zones.entry(z.as_str()).or_insert(0) += s;
            }
        }
        let max_zone = zones.values().copied().max().unwrap_or(0);
        let max = MAX_NODE_SCORE as f64;
        for (n, s) in nodes.iter().zip(scores.iter_mut()) {
            let mut f = if max_node > 0 {
                max * (max_node - *s) as f64 / max_node as f64
            } else {
                max
            };
            if !zones.is_empty()
                && let Some(z) = n.labels().get(ZONE_LABEL)
            {
                let zc = zones.get(z.as_str()).copied().unwrap_or(0);
                let zone_score = if max_zone > 0 {
                    max * (max_zone - zc) as f64 / max_zone as f64
                } else {
                    max
                };
                f = f * (1.0 - ZONE_WEIGHTING) + ZONE_WEIGHTING * zone_score;
            }
            *s = f as i64;
        }
    }
}

/// What [`InterPodAffinity`]'s pre-filter computed for one pod.
#[derive(Debug, Clone, Default)]
pub struct InterPodState {
    /// (topology key, value) pairs where an existing pod's required anti-affinity matches
    /// this pod.
    pub existing_anti: HashMap<(String, String), u32>,
    /// Per required affinity term of the pod: matching pods per topology value.
    pub affinity: Vec<HashMap<String, u32>>,
    /// Per required anti-affinity term of the pod: matching pods per topology value.
    pub anti_affinity: Vec<HashMap<String, u32>>,
    /// No pod matches the affinity terms but the pod matches them itself (the first pod of a
    /// group with affinity to itself may go anywhere the topology keys exist).
    pub self_affinity_only: bool,
}

/// Required pod affinity and anti-affinity (the pod's own and, symmetrically, that of the
/// pods already placed), by topology key over node labels.
#[derive(Debug)]
pub struct InterPodAffinity;

impl FilterPlugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        "InterPodAffinity"
    }

    fn pre_filter(&self, cx: &mut PodContext, snapshot: &Snapshot) -> Result<(), String> {
        let info = &cx.info;
        let (ns, labels) = (info.namespace(), info.labels());
        let mut state = InterPodState {
            affinity: vec![HashMap::new(); info.required_affinity.len()],
            anti_affinity: vec![HashMap::new(); info.required_anti_affinity.len()],
            ..Default::default()
        };
        let own_terms =
            !info.required_affinity.is_empty() || !info.required_anti_affinity.is_empty();
        for node in snapshot.nodes() {
            if node.pods_with_required_anti_affinity == 0 && !own_terms {
                continue;
            }
            let node_labels = node.labels();
            for p in node.pods.values() {
                for term in &p.required_anti_affinity {
                    if let Some(v) = node_labels.get(&term.topology_key)
                        && term.matches(ns, labels)
                    {
                        *state
                            .existing_anti
                            .entry((term.topology_key.clone(), v.clone()))
                            .or_insert(0) += 1;
                    }
                }
                if !own_terms {
                    continue;
                }
                let (pns, plabels) = (p.namespace(), p.labels());
                for (i, term) in info.required_affinity.iter().enumerate() {
                    if let Some(v) = node_labels.get(&term.topology_key)
                        && term.matches(pns, plabels)
                    {
                        *state.affinity[i].entry(v.clone()).or_insert(0) += 1;
                    }
                }
                for (i, term) in info.required_anti_affinity.iter().enumerate() {
                    if let Some(v) = node_labels.get(&term.topology_key)
                        && term.matches(pns, plabels)
                    {
                        *state.anti_affinity[i].entry(v.clone()).or_insert(0) += 1;
                    }
                }
            }
        }
        state.self_affinity_only = !info.required_affinity.is_empty()
            && state.affinity.iter().all(|m| m.is_empty())
            && info.required_affinity.iter().all(|t| t.matches(ns, labels));
        cx.inter_pod = state;
        Ok(())
    }

    fn filter(&self, cx: &PodContext, node: &NodeInfo) -> Result<(), Unfit> {
        let state = &cx.inter_pod;
        let labels = node.labels();
        // Kubernetes' order: the pod's affinity, its anti-affinity, then existing pods'.
        for (term, counts) in cx.info.required_affinity.iter().zip(&state.affinity) {
            let Some(v) = labels.get(&term.topology_key) else {
                return Err(Unfit::new(REASON_POD_AFFINITY));
            };
            if !state.self_affinity_only && counts.get(v).copied().unwrap_or(0) == 0 {
                return Err(Unfit::new(REASON_POD_AFFINITY));
            }
        }
        for (term, counts) in cx
            .info
            .required_anti_affinity
            .iter()
            .zip(&state.anti_affinity)
        {
            if let Some(v) = labels.get(&term.topology_key)
                && counts.get(v).copied().unwrap_or(0) > 0
            {
                return Err(Unfit::new(REASON_POD_ANTI_AFFINITY));
            }
        }
        if state
            .existing_anti
            .keys()
            .any(|(k, v)| labels.get(k) == Some(v))
        {
            return Err(Unfit::new(REASON_EXISTING_ANTI_AFFINITY));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cache::{Cache, PodInfo};
    use skiff_api::api::{
        Affinity, LabelSelector, NodeAffinity as NodeAffinitySpec, NodeSelectorTerm, PodAffinity,
        PodAffinityTerm, PreferredSchedulingTerm, Toleration,
    };
    use skiff_testkit::build::*;

    fn cx(pod: skiff_api::api::Pod) -> PodContext {
        let (info, problems) = PodInfo::new(Arc::new(pod));
        assert!(problems.is_empty(), "{problems:?}");
        PodContext::new(info)
    }

    fn info_of(c: &Cache, name: &str) -> NodeInfo {
        (**c.node(name).expect("node")).clone()
    }

    fn one_node(n: skiff_api::api::Node) -> NodeInfo {
        let mut c = Cache::new();
        let name = skiff_api::Resource::name(&n).to_string();
        c.set_node(n);
        info_of(&c, &name)
    }

    fn reason(r: Result<(), Unfit>) -> String {
        match r {
            Ok(()) => "fits".into(),
            Err(u) => u.0.join("; "),
        }
    }

    #[test]
    fn resources_fit() {
        let mut c = Cache::new();
        c.set_node(node("n", "2", "4Gi"));
        c.set_bound_pod(Arc::new(bound(pod_with_cpu("a", "1500m"), "n")));
        let n = info_of(&c, "n");
        assert_eq!(
            reason(NodeResourcesFit.filter(&cx(pod_with_cpu("p", "500m")), &n)),
            "fits"
        );
        assert_eq!(
            reason(NodeResourcesFit.filter(&cx(pod_with_cpu("p", "501m")), &n)),
            "Insufficient cpu"
        );
        let big = with_requests(pod("p"), &[("cpu", "3"), ("memory", "5Gi"), ("x/gpu", "1")]);
        assert_eq!(
            reason(NodeResourcesFit.filter(&cx(big), &n)),
            "Insufficient cpu; Insufficient memory; Insufficient x/gpu"
        );
        let mut full = node("full", "2", "4Gi");
        if let Some(s) = full.status.as_mut() {
            s.allocatable.insert("pods".into(), "1".into());
        }
        let mut c = Cache::new();
        c.set_node(full);
        c.set_bound_pod(Arc::new(bound(pod("a"), "full")));
        assert_eq!(
            reason(NodeResourcesFit.filter(&cx(pod("p")), &info_of(&c, "full"))),
            "Too many pods"
        );
    }

    #[test]
    fn node_name_selector_ready_unschedulable() {
        let n = one_node(labeled_node(node("n1", "4", "8Gi"), &[("disk", "ssd")]));
        let mut p = pod("p");
        spec_mut(&mut p).node_name = "n2".into();
        assert_eq!(reason(NodeName.filter(&cx(p), &n)), REASON_NODE_NAME);
        assert_eq!(reason(NodeName.filter(&cx(pod("p")), &n)), "fits");

        let mut p = pod("p");
        spec_mut(&mut p).node_selector = [("disk".to_string(), "ssd".to_string())].into();
        assert_eq!(reason(NodeSelector.filter(&cx(p.clone()), &n)), "fits");
        spec_mut(&mut p).node_selector = [("disk".to_string(), "hdd".to_string())].into();
        assert_eq!(
            reason(NodeSelector.filter(&cx(p), &n)),
            REASON_NODE_SELECTOR
        );

        let mut nr = node("nr", "4", "8Gi");
        if let Some(s) = nr.status.as_mut() {
            s.conditions[0].status = "False".into();
        }
        let nr = one_node(nr);
        assert_eq!(
            reason(NodeReady.filter(&cx(pod("p")), &nr)),
            REASON_NOT_READY
        );
        assert_eq!(reason(NodeReady.filter(&cx(pod("p")), &n)), "fits");
        let mut tolerant = pod("p");
        spec_mut(&mut tolerant).tolerations.push(Toleration {
            key: TAINT_NOT_READY.into(),
            operator: "Exists".into(),
            ..Default::default()
        });
        assert_eq!(reason(NodeReady.filter(&cx(tolerant), &nr)), "fits");

        let mut cordoned = node("c", "4", "8Gi");
        if let Some(s) = cordoned.spec.as_mut() {
            s.unschedulable = true;
        }
        let cordoned = one_node(cordoned);
        assert_eq!(
            reason(NodeUnschedulable.filter(&cx(pod("p")), &cordoned)),
            REASON_UNSCHEDULABLE
        );
        assert_eq!(reason(NodeUnschedulable.filter(&cx(pod("p")), &n)), "fits");
    }

    #[test]
    fn taints() {
        let mut t = node("g", "4", "8Gi");
        if let Some(s) = t.spec.as_mut() {
            s.taints.push(taint("dedicated", "gpu", "NoSchedule"));
            s.taints.push(taint("soft", "", "PreferNoSchedule"));
        }
        let t = one_node(t);
        assert_eq!(
            reason(TaintToleration.filter(&cx(pod("p")), &t)),
            "node(s) had untolerated taint {dedicated: gpu}"
        );
        let mut p = pod("p");
        spec_mut(&mut p).tolerations.push(Toleration {
            key: "dedicated".into(),
            operator: "Equal".into(),
            value: "gpu".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
        assert_eq!(reason(TaintToleration.filter(&cx(p.clone()), &t)), "fits");
        // PreferNoSchedule is only scored.
        let plain = one_node(node("plain", "4", "8Gi"));
        let c = cx(p);
        let mut scores = vec![
            ScorePlugin::score(&TaintToleration, &c, &t),
            ScorePlugin::score(&TaintToleration, &c, &plain),
        ];
        assert_eq!(scores, [1, 0]);
        ScorePlugin::normalize(&TaintToleration, &c, &[&t, &plain], &mut scores);
        assert_eq!(scores, [0, 100]);
    }

    fn node_affinity_pod(
        required: Vec<NodeSelectorTerm>,
        preferred: Vec<(i32, NodeSelectorTerm)>,
    ) -> skiff_api::api::Pod {
        let mut p = pod("p");
        spec_mut(&mut p).affinity = Some(Affinity {
            node_affinity: Some(NodeAffinitySpec {
                required_during_scheduling_ignored_during_execution: if required.is_empty() {
                    None
                } else {
                    Some(skiff_api::api::NodeSelector {
                        node_selector_terms: required,
                    })
                },
                preferred_during_scheduling_ignored_during_execution: preferred
                    .into_iter()
                    .map(|(weight, t)| PreferredSchedulingTerm {
                        weight,
                        preference: Some(t),
                    })
                    .collect(),
            }),
            ..Default::default()
        });
        p
    }

    #[test]
    fn node_affinity() {
        let a = one_node(labeled_node(
            node("a", "4", "8Gi"),
            &[("zone", "a"), ("cores", "8")],
        ));
        let b = one_node(labeled_node(
            node("b", "4", "8Gi"),
            &[("zone", "b"), ("cores", "2")],
        ));
        let p = node_affinity_pod(vec![expr_term("cores", "Gt", &["4"])], vec![]);
        let c = cx(p);
        assert_eq!(reason(NodeAffinity.filter(&c, &a)), "fits");
        assert_eq!(reason(NodeAffinity.filter(&c, &b)), REASON_NODE_SELECTOR);
        let p = node_affinity_pod(
            vec![
                expr_term("zone", "NotIn", &["a"]),
                expr_term("gpu", "Exists", &[]),
            ],
            vec![],
        );
        let c = cx(p);
        assert_eq!(reason(NodeAffinity.filter(&c, &a)), REASON_NODE_SELECTOR);
        assert_eq!(reason(NodeAffinity.filter(&c, &b)), "fits");
        let p = node_affinity_pod(
            vec![],
            vec![
                (10, expr_term("zone", "In", &["b"])),
                (5, expr_term("cores", "Lt", &["4"])),
            ],
        );
        let c = cx(p);
        let mut s = vec![
            ScorePlugin::score(&NodeAffinity, &c, &a),
            ScorePlugin::score(&NodeAffinity, &c, &b),
        ];
        assert_eq!(s, [0, 15]);
        ScorePlugin::normalize(&NodeAffinity, &c, &[&a, &b], &mut s);
        assert_eq!(s, [0, 100]);
    }

    fn anti_affinity_pod(name: &str, app: &str, key: &str) -> skiff_api::api::Pod {
        let mut p = labeled_pod(pod(name), &[("app", app)]);
        spec_mut(&mut p).affinity = Some(Affinity {
            pod_anti_affinity: Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: vec![PodAffinityTerm {
                    label_selector: Some(LabelSelector {
                        match_labels: [("app".to_string(), app.to_string())].into(),
                        ..Default::default()
                    }),
                    topology_key: key.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        });
        p
    }

    fn affinity_pod(
        name: &str,
        labels: &[(&str, &str)],
        to_app: &str,
        key: &str,
    ) -> skiff_api::api::Pod {
        let mut p = labeled_pod(pod(name), labels);
        spec_mut(&mut p).affinity = Some(Affinity {
            pod_affinity: Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: vec![PodAffinityTerm {
                    label_selector: Some(LabelSelector {
                        match_labels: [("app".to_string(), to_app.to_string())].into(),
                        ..Default::default()
                    }),
                    topology_key: key.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        });
        p
    }

    fn run_inter_pod(
        c: &mut Cache,
        s: &mut Snapshot,
        p: skiff_api::api::Pod,
    ) -> Vec<(String, String)> {
        c.update_snapshot(s);
        let mut ctx = cx(p);
        InterPodAffinity
            .pre_filter(&mut ctx, s)
            .expect("pre_filter");
        let mut out: Vec<(String, String)> = s
            .nodes()
            .iter()
            .map(|n| (n.name.clone(), reason(InterPodAffinity.filter(&ctx, n))))
            .collect();
        out.sort();
        out
    }

    fn zoned(name: &str, zone: &str) -> skiff_api::api::Node {
        labeled_node(
            node(name, "4", "8Gi"),
            &[("kubernetes.io/hostname", name), (ZONE_LABEL, zone)],
        )
    }

    #[test]
    fn pod_anti_affinity() {
        let mut c = Cache::new();
        let mut snap = Snapshot::new();
        c.set_node(zoned("h1", "z1"));
        c.set_node(zoned("h2", "z1"));
        c.set_node(zoned("h3", "z2"));
        c.set_bound_pod(Arc::new(bound(
            labeled_pod(pod("web-0"), &[("app", "web")]),
            "h1",
        )));
        // The pod's own anti-affinity by hostname: not next to web-0.
        let r = run_inter_pod(
            &mut c,
            &mut snap,
            anti_affinity_pod("web-1", "web", "kubernetes.io/hostname"),
        );
        assert_eq!(r[0].1, REASON_POD_ANTI_AFFINITY);
        assert_eq!((r[1].1.as_str(), r[2].1.as_str()), ("fits", "fits"));
        // By zone: not in z1.
        let r = run_inter_pod(
            &mut c,
            &mut snap,
            anti_affinity_pod("web-1", "web", ZONE_LABEL),
        );
        assert_eq!(
            r.iter().map(|x| x.1.as_str()).collect::<Vec<_>>(),
            [REASON_POD_ANTI_AFFINITY, REASON_POD_ANTI_AFFINITY, "fits"]
        );
        // Symmetry: an existing pod's anti-affinity keeps matching pods away from it.
        c.set_bound_pod(Arc::new(bound(
            anti_affinity_pod("db-0", "db", "kubernetes.io/hostname"),
            "h2",
        )));
        let r = run_inter_pod(
            &mut c,
            &mut snap,
            labeled_pod(pod("db-1"), &[("app", "db")]),
        );
        assert_eq!(r[1].1, REASON_EXISTING_ANTI_AFFINITY);
        assert_eq!((r[0].1.as_str(), r[2].1.as_str()), ("fits", "fits"));
        // Other namespaces are not affected.
        let mut other = labeled_pod(pod("db-1"), &[("app", "db")]);
        if let Some(m) = other.metadata.as_mut() {
            m.namespace = "other".into();
        }
        assert!(
            run_inter_pod(&mut c, &mut snap, other)
                .iter()
                .all(|x| x.1 == "fits")
        );
    }

    #[test]
    fn pod_affinity() {
        let mut c = Cache::new();
        let mut snap = Snapshot::new();
        c.set_node(zoned("h1", "z1"));
        c.set_node(zoned("h2", "z1"));
        c.set_node(zoned("h3", "z2"));
        // Nothing matches yet and the pod does not match itself: nowhere.
        let r = run_inter_pod(
            &mut c,
            &mut snap,
            affinity_pod("p", &[("app", "cache")], "db", ZONE_LABEL),
        );
        assert!(r.iter().all(|x| x.1 == REASON_POD_AFFINITY), "{r:?}");
        // The first pod of a self-affine group may go anywhere.
        let r = run_inter_pod(
            &mut c,
            &mut snap,
            affinity_pod("p", &[("app", "db")], "db", ZONE_LABEL),
        );
        assert!(r.iter().all(|x| x.1 == "fits"), "{r:?}");
        c.set_bound_pod(Arc::new(bound(
            labeled_pod(pod("db-0"), &[("app", "db")]),
            "h3",
        )));
        let r = run_inter_pod(
            &mut c,
            &mut snap,
            affinity_pod("p", &[("app", "cache")], "db", ZONE_LABEL),
        );
        assert_eq!(
            r.iter().map(|x| x.1.as_str()).collect::<Vec<_>>(),
            [REASON_POD_AFFINITY, REASON_POD_AFFINITY, "fits"]
        );
    }

    #[test]
    fn resource_scores() {
        let mut c = Cache::new();
        c.set_node(node("busy", "4", "8Gi"));
        c.set_node(node("idle", "4", "8Gi"));
        c.set_node(node("lopsided", "4", "8Gi"));
        c.set_bound_pod(Arc::new(bound(
            with_requests(pod("x"), &[("cpu", "2"), ("memory", "4Gi")]),
            "busy",
        )));
        c.set_bound_pod(Arc::new(bound(
            with_requests(pod("y"), &[("cpu", "3"), ("memory", "100Mi")]),
            "lopsided",
        )));
        let p = cx(with_requests(pod("p"), &[("cpu", "1"), ("memory", "2Gi")]));
        let (busy, idle, lop) = (
            info_of(&c, "busy"),
            info_of(&c, "idle"),
            info_of(&c, "lopsided"),
        );
        // idle: cpu (4-1)/4=75, mem (8-2)/8=75.
        assert_eq!(LeastAllocated.score(&p, &idle), 75);
        // busy: cpu 25, mem 25.
        assert_eq!(LeastAllocated.score(&p, &busy), 25);
        assert_eq!(BalancedAllocation.score(&p, &idle), 100);
        assert_eq!(BalancedAllocation.score(&p, &busy), 100);
        assert!(
            BalancedAllocation.score(&p, &lop) < 70,
            "{}",
            BalancedAllocation.score(&p, &lop)
        );
    }

    #[test]
    fn spreading_by_owner() {
        let mut c = Cache::new();
        c.set_node(zoned("h1", "z1"));
        c.set_node(zoned("h2", "z1"));
        c.set_node(zoned("h3", "z2"));
        c.set_bound_pod(Arc::new(bound(owned(pod("a"), "rs-1"), "h1")));
        c.set_bound_pod(Arc::new(bound(owned(pod("b"), "rs-1"), "h1")));
        c.set_bound_pod(Arc::new(bound(owned(pod("c"), "rs-1"), "h3")));
        c.set_bound_pod(Arc::new(bound(owned(pod("z"), "rs-2"), "h2")));
        let nodes = [info_of(&c, "h1"), info_of(&c, "h2"), info_of(&c, "h3")];
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let p = cx(owned(pod("p"), "rs-1"));
        let mut s: Vec<i64> = refs.iter().map(|n| SelectorSpread.score(&p, n)).collect();
        assert_eq!(s, [2, 0, 1]);
        SelectorSpread.normalize(&p, &refs, &mut s);
        // h1: node 0, zone z1 (2 pods) 0 → 0. h2: node 100, zone z1 0 → 33. h3: node 50,
        // zone z2 (1 pod) 50 → 50.
        assert_eq!(s, [0, 33, 50]);
        let lone = cx(pod("q"));
        let mut s = vec![5, 5, 5];
        SelectorSpread.normalize(&lone, &refs, &mut s);
        assert_eq!(s, [0, 0, 0]);
    }
}
