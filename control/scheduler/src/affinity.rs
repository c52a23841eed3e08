//! Matching rules shared by the plugins: node selector terms against a node, pod affinity
//! terms against a pod. (Taints and tolerations are matched by [`skiff_api::taints`].)

use std::collections::BTreeMap;

use skiff_api::api::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodAffinityTerm};
use skiff_api::selector::{Selector, SelectorError};

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

/// Which namespaces a pod affinity term looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    All,
    Only(Vec<String>),
}

/// A parsed pod (anti-)affinity term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinityTerm {
    /// `None`: the term had no label selector and matches no pod.
    pub selector: Option<Selector>,
    pub namespaces: Namespaces,
    pub topology_key: String,
}

impl AffinityTerm {
    /// Parses `term` of a pod in `pod_namespace`. Without `namespaces`, the term looks at the
    /// pod's own namespace; an empty `namespaceSelector` means all namespaces. (A non-empty
    /// namespace selector would need namespace labels, which the scheduler does not watch; it
    /// is treated as selecting only the listed namespaces.)
    pub fn parse(term: &PodAffinityTerm, pod_namespace: &str) -> Result<Self, SelectorError> {
        let selector = term
            .label_selector
            .as_ref()
            .map(Selector::from_label_selector)
            .transpose()?;
        let all_by_selector = term
            .namespace_selector
            .as_ref()
            .is_some_and(|s| s.match_labels.is_empty() && s.match_expressions.is_empty());
        let namespaces = if all_by_selector {
            Namespaces::All
        } else if term.namespaces.is_empty() && term.namespace_selector.is_none() {
            Namespaces::Only(vec![pod_namespace.to_string()])
        } else {
            Namespaces::Only(term.namespaces.clone())
        };
        Ok(AffinityTerm {
            selector,
            namespaces,
            topology_key: term.topology_key.clone(),
        })
    }

    /// Whether a pod in `namespace` with `labels` is one this term is about.
    pub fn matches(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        let ns_ok = match &self.namespaces {
            Namespaces::All => true,
            Namespaces::Only(list) => list.iter().any(|n| n == namespace),
        };
        ns_ok && self.selector.as_ref().is_some_and(|s| s.matches(labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::LabelSelector;

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
    fn affinity_terms() {
        let t = PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: labels(&[("app", "web")]),
                ..Default::default()
            }),
            topology_key: "kubernetes.io/hostname".into(),
            ..Default::default()
        };
        let parsed = AffinityTerm::parse(&t, "shop").unwrap();
        assert!(parsed.matches("shop", &labels(&[("app", "web")])));
        assert!(!parsed.matches("other", &labels(&[("app", "web")])));
        assert!(!parsed.matches("shop", &labels(&[("app", "db")])));
        let mut all = t.clone();
        all.namespace_selector = Some(LabelSelector::default());
        let parsed = AffinityTerm::parse(&all, "shop").unwrap();
        assert!(parsed.matches("other", &labels(&[("app", "web")])));
        let mut none = t;
        none.label_selector = None;
        let parsed = AffinityTerm::parse(&none, "shop").unwrap();
        assert!(!parsed.matches("shop", &labels(&[("app", "web")])));
    }
}
