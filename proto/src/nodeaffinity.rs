//! Node selection rules, as the scheduler and the DaemonSet controller both apply them: a
//! node selector term's `matchExpressions` (labels) and `matchFields` (`metadata.name`), and a
//! pod's `nodeSelector` with its required node affinity.

use std::collections::BTreeMap;

use crate::api::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec};

/// One requirement of a node selector term against the node's labels (or, for
/// `matchFields`, its fields). Malformed requirements (unknown operator, `Gt` without one
/// integer) match nothing, as in Kubernetes.
pub fn requirement_matches(
    req: &NodeSelectorRequirement,
    value_of: impl Fn(&str) -> Option<String>,
) -> bool {
    let value = value_of(&req.key);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| req.values.contains(&v)),
        "NotIn" => value.is_none_or(|v| !req.values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        op @ ("Gt" | "Lt") => {
            let [bound] = req.values.as_slice() else {
                return false;
            };
            let (Ok(bound), Some(Ok(v))) = (
                bound.trim().parse::<i64>(),
                value.map(|v| v.trim().parse::<i64>()),
            ) else {
                return false;
            };
            if op == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

/// A node selector term: all its expressions (labels) and fields (`metadata.name`) hold. A
/// term with neither matches nothing.
pub fn term_matches(
    term: &NodeSelectorTerm,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    if term.match_expressions.is_empty() && term.match_fields.is_empty() {
        return false;
    }
    term.match_expressions
        .iter()
        .all(|r| requirement_matches(r, |k| labels.get(k).cloned()))
        && term.match_fields.iter().all(|r| {
            requirement_matches(r, |k| (k == "metadata.name").then(|| node_name.to_string()))
        })
}

/// A node selector: any of its terms matches.
pub fn node_selector_matches(
    sel: &NodeSelector,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    sel.node_selector_terms
        .iter()
        .any(|t| term_matches(t, node_name, labels))
}

/// Whether a pod of `spec` may go to node `node_name` with `labels` by its `nodeSelector`
/// and its required node affinity (taints aside).
pub fn pod_fits_node(spec: &PodSpec, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
    if !spec
        .node_selector
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    match spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        }) {
        Some(sel) => node_selector_matches(sel, node_name, labels),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn requirements() {
        let l = labels(&[("zone", "a"), ("cores", "8")]);
        let m = |r: NodeSelectorRequirement| requirement_matches(&r, |k| l.get(k).cloned());
        assert!(m(req("zone", "In", &["a", "b"])));
        assert!(!m(req("zone", "In", &["b"])));
        assert!(m(req("zone", "NotIn", &["b"])));
        assert!(m(req("missing", "NotIn", &["b"])));
        assert!(m(req("zone", "Exists", &[])));
        assert!(m(req("missing", "DoesNotExist", &[])));
        assert!(!m(req("zone", "DoesNotExist", &[])));
        assert!(m(req("cores", "Gt", &["4"])));
        assert!(!m(req("cores", "Gt", &["8"])));
        assert!(m(req("cores", "Lt", &["9"])));
        assert!(!m(req("zone", "Gt", &["1"])), "non-integer label");
        assert!(!m(req("cores", "Gt", &["1", "2"])), "Gt takes one value");
        assert!(!m(req("missing", "Lt", &["1"])));
        assert!(!m(req("zone", "Near", &["a"])));
    }

    #[test]
    fn terms_and_selectors() {
        let l = labels(&[("zone", "a"), ("disk", "ssd")]);
        let term = |exprs: Vec<NodeSelectorRequirement>, fields: Vec<NodeSelectorRequirement>| {
            NodeSelectorTerm {
                match_expressions: exprs,
                match_fields: fields,
            }
        };
        assert!(term_matches(
            &term(
                vec![req("zone", "In", &["a"]), req("disk", "In", &["ssd"])],
                vec![]
            ),
            "n1",
            &l
        ));
        assert!(!term_matches(
            &term(
                vec![req("zone", "In", &["a"]), req("disk", "In", &["hdd"])],
                vec![]
            ),
            "n1",
            &l
        ));
        assert!(!term_matches(&term(vec![], vec![]), "n1", &l));
        assert!(term_matches(
            &term(vec![], vec![req("metadata.name", "In", &["n1"])]),
            "n1",
            &l
        ));
        assert!(!term_matches(
            &term(vec![], vec![req("metadata.name", "In", &["n1"])]),
            "n2",
            &l
        ));
        let sel = NodeSelector {
            node_selector_terms: vec![
                term(vec![req("zone", "In", &["b"])], vec![]),
                term(vec![req("disk", "Exists", &[])], vec![]),
            ],
        };
        assert!(node_selector_matches(&sel, "n1", &l), "terms are ORed");
        assert!(!node_selector_matches(&NodeSelector::default(), "n1", &l));
    }

    #[test]
    fn pods_fit_by_selector_and_required_affinity() {
        let l = labels(&[("disk", "ssd")]);
        let mut spec = PodSpec {
            node_selector: labels(&[("disk", "ssd")]),
            ..Default::default()
        };
        assert!(pod_fits_node(&spec, "n1", &l));
        assert!(!pod_fits_node(&spec, "n1", &labels(&[])));
        spec.affinity = Some(crate::api::Affinity {
            node_affinity: Some(crate::api::NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: vec![req("metadata.name", "In", &["n2"])],
                        ..Default::default()
                    }],
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(!pod_fits_node(&spec, "n1", &l));
        assert!(pod_fits_node(&spec, "n2", &l));
    }
}
