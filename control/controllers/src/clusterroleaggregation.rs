//! The ClusterRole aggregation controller (kube-controller-manager's
//! `clusterrole-aggregation` controller): a ClusterRole with an `aggregationRule` gets as its
//! `rules` the union of the rules of the other ClusterRoles its selectors match (selectors in
//! order, roles in name order, each rule once). Keyed by ClusterRole; a ClusterRole's change
//! wakes every aggregated ClusterRole whose selectors match its old or new labels.
//!
//! Selectors are read as the API server's authorizer reads them when it lends aggregated
//! rules: an empty or invalid selector matches nothing. The manager holds `escalate` on
//! ClusterRoles, as Kubernetes grants its aggregation controller.

use std::sync::Arc;

use skiff_api::Resource;
use skiff_api::api::{ClusterRole, PolicyRule};
use skiff_api::selector::Selector;
use skiff_client::Client;
use skiff_client::controller::{
    Action, CancelToken, Controller, Informer, Informers, ObjectKey, Reconciler,
};

use crate::util::labels;
use crate::{Context, Error};

/// The controller: the client it updates ClusterRoles with and the ClusterRole informer.
#[derive(Debug)]
pub struct ClusterRoleAggregationController {
    client: Client,
    roles: Informer<ClusterRole>,
}

/// The selectors of `role`'s aggregation rule that select something (none without a rule).
pub fn role_selectors(role: &ClusterRole) -> Vec<Selector> {
    let Some(rule) = &role.aggregation_rule else {
        return Vec::new();
    };
    rule.cluster_role_selectors
        .iter()
        .filter_map(|s| Selector::from_label_selector(s).ok())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The rules ClusterRole `name` aggregates with `selectors` from `roles`: for each selector in
/// order, the rules of the roles it matches (but `name` itself) in name order, each rule
/// only the first time it appears (Kubernetes' `syncClusterRole`).
pub fn aggregate(
    name: &str,
    selectors: &[Selector],
    roles: &[Arc<ClusterRole>],
) -> Vec<PolicyRule> {
    let mut sorted: Vec<&ClusterRole> = roles.iter().map(|r| &**r).collect();
    sorted.sort_by(|a, b| a.name().cmp(b.name()));
    let mut rules: Vec<PolicyRule> = Vec::new();
    for selector in selectors {
        for role in sorted
            .iter()
            .filter(|r| r.name() != name && selector.matches(labels(**r)))
        {
            for rule in &role.rules {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
        }
    }
    rules
}

/// The keys of the aggregated ClusterRoles of `roles` whose selectors match `changed`.
pub fn aggregating(roles: &[Arc<ClusterRole>], changed: &ClusterRole) -> Vec<ObjectKey> {
    roles
        .iter()
        .filter(|r| role_selectors(r).iter().any(|s| s.matches(labels(changed))))
        .map(|r| ObjectKey::of(&**r))
        .collect()
}

impl ClusterRoleAggregationController {
    /// The controller on `informers`' client and ClusterRole informer.
    pub fn new(informers: &Informers) -> Self {
        ClusterRoleAggregationController {
            client: informers.client().clone(),
            roles: informers.get::<ClusterRole>(),
        }
    }

    /// ClusterRoles, each also woken by the ClusterRoles it aggregates.
    pub fn controller(informers: &Informers) -> Controller<ClusterRole> {
        let roles = informers.get::<ClusterRole>();
        let lookup = roles.clone();
        Controller::<ClusterRole>::new(informers)
            .named("clusterrole-aggregation")
            .watches(&roles, move |changed: &ClusterRole| {
                aggregating(&lookup.list(), changed)
            })
    }

    /// Runs it with `workers` workers until `stop` is cancelled.
    pub async fn run(informers: &Informers, workers: usize, stop: CancelToken) {
        let reconciler = Arc::new(ClusterRoleAggregationController::new(informers));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }
}

impl Reconciler for ClusterRoleAggregationController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(role) = self.roles.get(key) else {
            return Ok(Action::Done);
        };
        let Some(rule) = role
            .aggregation_rule
            .as_ref()
            .filter(|r| !r.cluster_role_selectors.is_empty())
        else {
            return Ok(Action::Done);
        };
        for e in rule
            .cluster_role_selectors
            .iter()
            .filter_map(|s| Selector::from_label_selector(s).err())
        {
            tracing::warn!(
                clusterrole = %key.name,
                error = %e,
                "a clusterRoleSelector that matches nothing"
            );
        }
        let rules = aggregate(&key.name, &role_selectors(&role), &self.roles.list());
        if rules == role.rules {
            return Ok(Action::Done);
        }
        let mut updated = (*role).clone();
        updated.rules = rules;
        // A stale resourceVersion is a conflict: the error retries the key with the cache
        // caught up.
        match self.client.cluster::<ClusterRole>().update(&updated).await {
            Ok(_) => {
                tracing::debug!(
                    clusterrole = %key.name,
                    rules = updated.rules.len(),
                    "aggregated rules"
                );
                Ok(Action::Done)
            }
            Err(e) if e.is_not_found() => Ok(Action::Done),
            Err(e) => Err(e).during(|| format!("updating the rules of ClusterRole {}", key.name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use skiff_api::api::{AggregationRule, LabelSelector, LabelSelectorRequirement, ObjectMeta};

    use super::*;

    fn rule(verbs: &[&str], resources: &[&str]) -> PolicyRule {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        PolicyRule {
            verbs: v(verbs),
            api_groups: vec![String::new()],
            resources: v(resources),
            ..PolicyRule::default()
        }
    }

    fn role(name: &str, labels: &[(&str, &str)], rules: Vec<PolicyRule>) -> Arc<ClusterRole> {
        Arc::new(ClusterRole {
            metadata: Some(ObjectMeta {
                name: name.into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..ObjectMeta::default()
            }),
            rules,
            ..ClusterRole::default()
        })
    }

    fn match_labels(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: BTreeMap::from([(k.to_string(), v.to_string())]),
            ..LabelSelector::default()
        }
    }

    fn aggregated(name: &str, selectors: Vec<LabelSelector>) -> ClusterRole {
        ClusterRole {
            aggregation_rule: Some(AggregationRule {
                cluster_role_selectors: selectors,
            }),
            ..(*role(name, &[], Vec::new())).clone()
        }
    }

    fn rules_of(target: &ClusterRole, roles: &[Arc<ClusterRole>]) -> Vec<PolicyRule> {
        aggregate(target.name(), &role_selectors(target), roles)
    }

    #[test]
    fn rules_in_name_order_each_once_without_self() {
        let (get, list, del) = (
            rule(&["get"], &["pods"]),
            rule(&["list"], &["pods"]),
            rule(&["delete"], &["pods"]),
        );
        let target = aggregated("monitoring", vec![match_labels("agg", "true")]);
        let mut me = target.clone();
        me.metadata = role("monitoring", &[("agg", "true")], Vec::new())
            .metadata
            .clone();
        me.rules = vec![del.clone()];
        let roles = vec![
            role("b", &[("agg", "true")], vec![list.clone(), get.clone()]),
            role("a", &[("agg", "true")], vec![get.clone()]),
            role("c", &[("agg", "false")], vec![del.clone()]),
            role("d", &[], vec![del.clone()]),
            // Itself, selected by its own selector: not a source.
            Arc::new(me),
        ];
        assert_eq!(rules_of(&target, &roles), vec![get.clone(), list.clone()]);
        // Semantic equality: the same rule written twice in one role appears once.
        let twice = vec![role(
            "x",
            &[("agg", "true")],
            vec![del.clone(), del.clone()],
        )];
        assert_eq!(rules_of(&target, &twice), vec![del]);
        assert!(rules_of(&target, &[]).is_empty());
    }

    #[test]
    fn several_selectors_in_order() {
        let (a, b, c) = (
            rule(&["get"], &["a"]),
            rule(&["get"], &["b"]),
            rule(&["get"], &["c"]),
        );
        let roles = vec![
            role("first", &[("x", "1")], vec![a.clone(), c.clone()]),
            role("second", &[("y", "1")], vec![b.clone(), a.clone()]),
        ];
        let yx = aggregated("t", vec![match_labels("y", "1"), match_labels("x", "1")]);
        assert_eq!(rules_of(&yx, &roles), vec![b.clone(), a.clone(), c.clone()]);
        let xy = aggregated("t", vec![match_labels("x", "1"), match_labels("y", "1")]);
        assert_eq!(rules_of(&xy, &roles), vec![a, c, b]);
    }

    #[test]
    fn match_expressions_and_selectors_that_match_nothing() {
        let (r1, r2) = (rule(&["get"], &["one"]), rule(&["get"], &["two"]));
        let roles = vec![
            role("one", &[("tier", "gold")], vec![r1.clone()]),
            role("two", &[("tier", "silver")], vec![r2.clone()]),
            role("three", &[], vec![rule(&["*"], &["*"])]),
        ];
        let expr = |key: &str, operator: &str, values: &[&str]| LabelSelector {
            match_expressions: vec![LabelSelectorRequirement {
                key: key.into(),
                operator: operator.into(),
                values: values.iter().map(|v| v.to_string()).collect(),
            }],
            ..LabelSelector::default()
        };
        let t = aggregated("t", vec![expr("tier", "In", &["silver", "gold"])]);
        assert_eq!(rules_of(&t, &roles), vec![r1, r2.clone()]);
        let t = aggregated("t", vec![expr("tier", "NotIn", &["gold"])]);
        // NotIn also matches roles without the label, as in Kubernetes.
        assert_eq!(rules_of(&t, &roles), vec![rule(&["*"], &["*"]), r2]);
        // Empty and invalid selectors match nothing (as the authorizer reads them).
        let t = aggregated("t", vec![LabelSelector::default(), expr("tier", "In", &[])]);
        assert!(role_selectors(&t).is_empty());
        assert!(rules_of(&t, &roles).is_empty());
        // Without an aggregation rule there is nothing to aggregate.
        assert!(role_selectors(&role("plain", &[], Vec::new())).is_empty());
    }

    #[test]
    fn a_change_wakes_the_roles_that_select_it() {
        let roles = vec![
            Arc::new(aggregated("by-x", vec![match_labels("x", "1")])),
            Arc::new(aggregated(
                "by-x-or-y",
                vec![match_labels("y", "1"), match_labels("x", "1")],
            )),
            Arc::new(aggregated("by-z", vec![match_labels("z", "1")])),
            role("plain", &[("x", "1")], Vec::new()),
        ];
        let keys = |labels: &[(&str, &str)]| -> Vec<String> {
            aggregating(&roles, &role("changed", labels, Vec::new()))
                .into_iter()
                .map(|k| k.name)
                .collect()
        };
        assert_eq!(keys(&[("x", "1")]), ["by-x", "by-x-or-y"]);
        assert_eq!(keys(&[("y", "1")]), ["by-x-or-y"]);
        assert!(keys(&[("x", "2")]).is_empty());
    }
}
