//! Matching rules shared by the plugins: pod affinity terms against a pod. Node selector
//! terms are matched by [`skiff_api::nodeaffinity`] (shared with the DaemonSet controller),
//! taints and tolerations by [`skiff_api::taints`].

use std::collections::BTreeMap;

use skiff_api::api::PodAffinityTerm;
pub use skiff_api::nodeaffinity::{node_selector_matches, requirement_matches, term_matches};
use skiff_api::selector::{Selector, SelectorError};

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
