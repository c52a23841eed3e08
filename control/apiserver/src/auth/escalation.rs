//! RBAC's escalation prevention (kube-apiserver's `rbac/validation`): a user may write a Role
//! or ClusterRole only with permissions it already holds where the role applies (or the
//! `escalate` verb on it), and may bind a role only if it holds the role's permissions there
//! (or the `bind` verb on it). Otherwise anyone allowed to write RBAC objects could grant
//! itself anything.
//!
//! Checked on every write of an RBAC object by the admission plug-in `RBACEscalation`, in the
//! object's own namespace, with kube-apiserver's "attempting to grant RBAC permissions not
//! currently held" message. A ClusterRole with an `aggregationRule` needs `escalate` ("must
//! have cluster-admin privileges to use the aggregationRule"), since its selectors could lend
//! any role's rules.

use std::any::Any;

use skiff_api::api::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef};

use super::authz::Authorizer;
use crate::request::UserInfo;
use crate::request::{Attributes, Decision, MASTERS_GROUP};
use crate::strategy::rbac::RBAC_GROUP;

/// One verb on one resource (or URL) and name: the unit a rule is broken down into.
fn simple_rules(r: &PolicyRule) -> Vec<PolicyRule> {
    let one = |v: &str| vec![v.to_string()];
    let mut out = Vec::new();
    for verb in &r.verbs {
        for url in &r.non_resource_urls {
            out.push(PolicyRule {
                verbs: one(verb),
                non_resource_urls: one(url),
                ..PolicyRule::default()
            });
        }
        for group in &r.api_groups {
            for resource in &r.resources {
                let names: Vec<String> = if r.resource_names.is_empty() {
                    vec![String::new()]
                } else {
                    r.resource_names.clone()
                };
                for name in names {
                    out.push(PolicyRule {
                        verbs: one(verb),
                        api_groups: one(group),
                        resources: one(resource),
                        resource_names: if name.is_empty() { vec![] } else { vec![name] },
                        non_resource_urls: Vec::new(),
                    });
                }
            }
        }
    }
    out
}

fn has(list: &[String], v: &str) -> bool {
    list.iter().any(|x| x == "*" || x == v)
}

/// Whether `owner` allows everything `simple` (one verb, group, resource or URL, name) does.
fn rule_covers(owner: &PolicyRule, simple: &PolicyRule) -> bool {
    let verb = &simple.verbs[0];
    if !has(&owner.verbs, verb) {
        return false;
    }
    if let Some(url) = simple.non_resource_urls.first() {
        return owner.non_resource_urls.iter().any(|u| {
            u == "*" || u == url || (u.ends_with('*') && url.starts_with(u.trim_end_matches('*')))
        });
    }
    let (group, resource) = (&simple.api_groups[0], &simple.resources[0]);
    if !has(&owner.api_groups, group) {
        return false;
    }
    let resource_ok = owner.resources.iter().any(|o| {
        o == "*"
            || o == resource
            || resource
                .split_once('/')
                .is_some_and(|(_, sub)| *o == format!("*/{sub}"))
    });
    resource_ok
        && (owner.resource_names.is_empty()
            || simple
                .resource_names
                .first()
                .is_some_and(|n| owner.resource_names.contains(n)))
}

/// The parts of `wanted` no rule of `held` covers, in kube-apiserver's notation.
pub fn uncovered(held: &[PolicyRule], wanted: &[PolicyRule]) -> Vec<String> {
    let mut out = Vec::new();
    for w in wanted {
        for s in simple_rules(w) {
            if held.iter().any(|h| rule_covers(h, &s)) {
                continue;
            }
            let q = |l: &[String]| {
                l.iter()
                    .map(|x| format!("{x:?}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let text = if s.non_resource_urls.is_empty() {
                let mut t = format!(
                    "{{APIGroups:[{}], Resources:[{}]",
                    q(&s.api_groups),
                    q(&s.resources)
                );
                if !s.resource_names.is_empty() {
                    t.push_str(&format!(", ResourceNames:[{}]", q(&s.resource_names)));
                }
                format!("{t}, Verbs:[{}]}}", q(&s.verbs))
            } else {
                format!(
                    "{{NonResourceURLs:[{}], Verbs:[{}]}}",
                    q(&s.non_resource_urls),
                    q(&s.verbs)
                )
            };
            if !out.contains(&text) {
                out.push(text);
            }
        }
    }
    out
}

fn may(
    authz: &Authorizer,
    user: &UserInfo,
    verb: &str,
    resource: &str,
    ns: &str,
    name: &str,
) -> bool {
    authz.decide(
        user,
        &Attributes::resource(verb, RBAC_GROUP, resource, "", ns, name),
    ) == Decision::Allow
}

/// Checks a write of an RBAC object (Role, ClusterRole, RoleBinding, ClusterRoleBinding)
/// by `user`; `namespace` is the object's own (never the request URL's: a binding written
/// through the all-namespaces collection still grants in its own namespace). `Err` is the
/// 403 message. Objects of other kinds pass.
pub fn check(
    authz: &Authorizer,
    user: &UserInfo,
    object: &dyn Any,
    namespace: &str,
) -> Result<(), String> {
    if user.groups.iter().any(|g| g == MASTERS_GROUP) {
        return Ok(());
    }
    let name_of = |m: &Option<skiff_api::api::ObjectMeta>| {
        m.as_ref().map(|m| m.name.clone()).unwrap_or_default()
    };
    let binding =
        |plural: &'static str,
         meta: &Option<skiff_api::api::ObjectMeta>,
         role_ref: &Option<RoleRef>| { (plural, name_of(meta), role_ref.clone()) };
    // (resource, object name, the rules it grants, where they apply)
    let (plural, name, rules, scope) = if let Some(r) = object.downcast_ref::<Role>() {
        let name = name_of(&r.metadata);
        if may(authz, user, "escalate", "roles", namespace, &name) {
            return Ok(());
        }
        ("roles", name, r.rules.clone(), namespace.to_string())
    } else if let Some(r) = object.downcast_ref::<ClusterRole>() {
        let plural = "clusterroles";
        let name = name_of(&r.metadata);
        if may(authz, user, "escalate", plural, "", &name) {
            return Ok(());
        }
        // Its selectors could lend any role's rules (cluster-admin's too).
        if r.aggregation_rule
            .as_ref()
            .is_some_and(|a| !a.cluster_role_selectors.is_empty())
        {
            return Err(format!(
                "{plural}.{RBAC_GROUP} {name:?} is forbidden: must have cluster-admin \
                 privileges to use the aggregationRule"
            ));
        }
        (plural, name, r.rules.clone(), String::new())
    } else {
        let (plural, name, role_ref) = if let Some(b) = object.downcast_ref::<RoleBinding>() {
            binding("rolebindings", &b.metadata, &b.role_ref)
        } else if let Some(b) = object.downcast_ref::<ClusterRoleBinding>() {
            binding("clusterrolebindings", &b.metadata, &b.role_ref)
        } else {
            return Ok(());
        };
        let Some(r) = role_ref else { return Ok(()) };
        let (role_resource, role_ns) = match r.kind.as_str() {
            "Role" => ("roles", namespace),
            _ => ("clusterroles", ""),
        };
        if may(authz, user, "bind", role_resource, role_ns, &r.name) {
            return Ok(());
        }
        let rules = authz.role_rules(&r.kind, namespace, &r.name);
        let scope = if plural == "rolebindings" {
            namespace.to_string()
        } else {
            String::new()
        };
        (plural, name, rules, scope)
    };
    let held = authz.rules_for(user, &scope);
    let missing = uncovered(&held, &rules);
    if missing.is_empty() {
        return Ok(());
    }
    let groups = user
        .groups
        .iter()
        .map(|g| format!("{g:?}"))
        .collect::<Vec<_>>()
        .join(" ");
    Err(format!(
        "{plural}.{RBAC_GROUP} {name:?} is forbidden: user {:?} (groups=[{groups}]) is \
         attempting to grant RBAC permissions not currently held:\n{}",
        user.name,
        missing.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::auth::policy::rule;

    #[test]
    fn coverage_is_checked_per_verb_resource_and_name() {
        let held = vec![
            rule(&["get", "list"], &[""], &["pods", "pods/log"]),
            rule(&["*"], &["apps"], &["deployments"]),
        ];
        assert!(uncovered(&held, &[rule(&["get"], &[""], &["pods"])]).is_empty());
        assert!(uncovered(&held, &[rule(&["delete"], &["apps"], &["deployments"])]).is_empty());
        assert_eq!(
            uncovered(
                &held,
                &[rule(&["get", "delete"], &[""], &["pods", "secrets"])]
            ),
            vec![
                "{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\"]}",
                "{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"delete\"]}",
                "{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"delete\"]}",
            ]
        );
        // A wildcard is granted only by a wildcard.
        assert_eq!(uncovered(&held, &[rule(&["get"], &[""], &["*"])]).len(), 1);
        let mut named = rule(&["get"], &[""], &["secrets"]);
        named.resource_names = vec!["a".into()];
        let mut owner = rule(&["get"], &[""], &["secrets"]);
        owner.resource_names = vec!["a".into(), "b".into()];
        assert!(uncovered(&[owner.clone()], &[named]).is_empty());
        assert_eq!(
            uncovered(&[owner], &[rule(&["get"], &[""], &["secrets"])]).len(),
            1
        );
    }
}
