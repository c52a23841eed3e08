//! What a user may do: kube-apiserver's authorizer chain over request [`Attributes`].
//!
//! 1. `system:masters` may do anything (kube-apiserver's privileged group).
//! 2. The Node authorizer ([`super::node`]) decides for `system:node:<name>` users in
//!    `system:nodes`: what a node needs, only for objects related to pods bound to it.
//! 3. RBAC: the rules of every Role and ClusterRole bound to the user (by name, by a group,
//!    or as a ServiceAccount), additive, never denying; ClusterRoles with an
//!    `aggregationRule` lend the rules of the ClusterRoles their selectors match.
//!
//! Nothing allowing is a 403 with kube-apiserver's message ([`forbidden_message`]).

use std::sync::Arc;

use skiff_api::api::{
    ClusterRole, ClusterRoleBinding, Pod, PolicyRule, Role, RoleBinding, Subject,
};
use skiff_api::selector::Selector;

use super::mirror::Mirror;
use crate::error::ApiError;
use crate::registry::Registry;
use crate::request::UserInfo;
use crate::request::{Attributes, Decision, MASTERS_GROUP};

/// kube-apiserver's 403 message (`apiserver/pkg/endpoints/handlers/responsewriters`):
/// `pods "web" is forbidden: User "alice" cannot get resource "pods" in API group "" in the
/// namespace "default"`, with `: <reason>` when an authorizer gave one.
pub fn forbidden_message(user: &str, a: &Attributes, reason: &str) -> String {
    let mut msg = match &a.path {
        Some(path) => format!("forbidden: User {user:?} cannot {} path {path:?}", a.verb),
        None => {
            let qualified = if a.api_group.is_empty() {
                a.resource.clone()
            } else {
                format!("{}.{}", a.resource, a.api_group)
            };
            let what = if a.name.is_empty() {
                format!("{qualified} is forbidden")
            } else {
                format!("{qualified} {:?} is forbidden", a.name)
            };
            let scope = if a.namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace {:?}", a.namespace)
            };
            format!(
                "{what}: User {user:?} cannot {} resource {:?} in API group {:?} {scope}",
                a.verb,
                a.full_resource(),
                a.api_group
            )
        }
    };
    if !reason.is_empty() {
        msg.push_str(": ");
        msg.push_str(reason);
    }
    msg
}

/// Whether one rule allows `a` (kube-apiserver's `RuleAllows`).
pub fn rule_allows(rule: &PolicyRule, a: &Attributes) -> bool {
    let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
    if !has(&rule.verbs, &a.verb) {
        return false;
    }
    match &a.path {
        Some(path) => rule.non_resource_urls.iter().any(|u| {
            u == "*" || u == path || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
        }),
        None => {
            if !has(&rule.api_groups, &a.api_group) {
                return false;
            }
            let combined = a.full_resource();
            let resource_ok = rule.resources.iter().any(|r| {
                r == "*"
                    || *r == combined
                    || (!a.subresource.is_empty() && *r == format!("*/{}", a.subresource))
            });
            resource_ok
                && (rule.resource_names.is_empty()
                    || (!a.name.is_empty() && rule.resource_names.contains(&a.name)))
        }
    }
}

/// Whether a binding's subject is this user (kube-apiserver's `appliesToUser`).
pub fn subject_matches(s: &Subject, user: &UserInfo, binding_namespace: &str) -> bool {
    match s.kind.as_str() {
        "User" => s.name == user.name,
        "Group" => user.groups.contains(&s.name),
        "ServiceAccount" => {
            let ns = if s.namespace.is_empty() {
                binding_namespace
            } else {
                &s.namespace
            };
            user.name == format!("system:serviceaccount:{ns}:{}", s.name)
        }
        _ => false,
    }
}

/// The chain, over in-process mirrors of the RBAC kinds, of pods and of PersistentVolumes.
pub struct Authorizer {
    roles: Arc<Mirror<Role>>,
    cluster_roles: Arc<Mirror<ClusterRole>>,
    role_bindings: Arc<Mirror<RoleBinding>>,
    cluster_role_bindings: Arc<Mirror<ClusterRoleBinding>>,
    pub(crate) pods: Arc<Mirror<Pod>>,
    /// The Node authorizer's way from a volume to its claim (`spec.claimRef`).
    pub(crate) persistent_volumes: Arc<Mirror<skiff_api::api::PersistentVolume>>,
    service_accounts: Arc<Mirror<skiff_api::api::ServiceAccount>>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer").finish_non_exhaustive()
    }
}

impl Authorizer {
    /// Starts the mirrors (complete when this returns).
    pub async fn start(registry: &Registry) -> Result<Arc<Authorizer>, ApiError> {
        Ok(Arc::new(Authorizer {
            roles: Mirror::start(registry).await?,
            cluster_roles: Mirror::start(registry).await?,
            role_bindings: Mirror::start(registry).await?,
            cluster_role_bindings: Mirror::start(registry).await?,
            pods: Mirror::start(registry).await?,
            persistent_volumes: Mirror::start(registry).await?,
            service_accounts: Mirror::start(registry).await?,
        }))
    }

    /// For a ServiceAccount token's user: whether its ServiceAccount (same uid) and, for a
    /// bound token, its pod (same uid) still exist. Other users: true.
    pub fn token_subject_alive(&self, user: &UserInfo) -> bool {
        let Some(rest) = user.name.strip_prefix("system:serviceaccount:") else {
            return true;
        };
        if user.uid.is_empty() {
            // Not from a token (impersonation is applied later): nothing to check.
            return true;
        }
        let Some((ns, name)) = rest.split_once(':') else {
            return false;
        };
        let uid_of = |m: &Option<skiff_api::api::ObjectMeta>| {
            m.as_ref().map(|m| m.uid.clone()).unwrap_or_default()
        };
        let sa_ok = self
            .service_accounts
            .get(ns, name)
            .is_some_and(|sa| uid_of(&sa.metadata) == user.uid);
        let pod_ok = match (
            user.extra
                .get(crate::request::EXTRA_POD_NAME)
                .and_then(|v| v.first()),
            user.extra
                .get(crate::request::EXTRA_POD_UID)
                .and_then(|v| v.first()),
        ) {
            (Some(pod), Some(uid)) => self
                .pods
                .get(ns, pod)
                .is_some_and(|p| uid_of(&p.metadata) == *uid),
            _ => true,
        };
        sa_ok && pod_ok
    }

    /// Allows, or refuses with kube-apiserver's 403 message.
    pub fn authorize(&self, user: &UserInfo, a: &Attributes) -> Result<(), String> {
        match self.decide(user, a) {
            Decision::Allow => Ok(()),
            Decision::Deny(reason) => Err(forbidden_message(&user.name, a, &reason)),
            Decision::Refuse(message) => Err(message),
            Decision::NoOpinion => Err(forbidden_message(&user.name, a, "")),
        }
    }

    /// The chain's decision (for access reviews, which report it rather than fail).
    pub fn decide(&self, user: &UserInfo, a: &Attributes) -> Decision {
        if user.groups.iter().any(|g| g == MASTERS_GROUP) {
            return Decision::Allow;
        }
        let rbac = |u: &UserInfo, a: &Attributes| self.rbac_allows(u, a);
        let graph = self.node_graph(&rbac);
        match super::node::decide(&graph, user, a) {
            Decision::NoOpinion => {}
            d => return d,
        }
        if self.rbac_allows(user, a) {
            Decision::Allow
        } else {
            Decision::NoOpinion
        }
    }

    /// The rules of a ClusterRole, with those its aggregation rule lends it.
    fn cluster_role_rules(&self, name: &str) -> Vec<PolicyRule> {
        let Some(cr) = self.cluster_roles.get("", name) else {
            return Vec::new();
        };
        let mut rules = cr.rules.clone();
        if let Some(agg) = &cr.aggregation_rule {
            let selectors: Vec<Selector> = agg
                .cluster_role_selectors
                .iter()
                .filter_map(|s| Selector::from_label_selector(s).ok())
                .filter(|s| !s.is_empty())
                .collect();
            for other in self.cluster_roles.filter(|o| {
                let labels = o.metadata.as_ref().map(|m| &m.labels);
                labels.is_some_and(|l| selectors.iter().any(|s| s.matches(l)))
            }) {
                if other.metadata.as_ref().is_some_and(|m| m.name != name) {
                    rules.extend(other.rules.iter().cloned());
                }
            }
        }
        rules
    }

    /// The rules of the role a binding in `namespace` names (`Role` or `ClusterRole`).
    pub fn role_rules(&self, kind: &str, namespace: &str, name: &str) -> Vec<PolicyRule> {
        match kind {
            "ClusterRole" => self.cluster_role_rules(name),
            "Role" => self
                .roles
                .get(namespace, name)
                .map(|r| r.rules.clone())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Every rule that applies to `user` in `namespace` ("" : only cluster-wide ones).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<PolicyRule> {
        let mut rules = Vec::new();
        for b in self
            .cluster_role_bindings
            .filter(|b| b.subjects.iter().any(|s| subject_matches(s, user, "")))
        {
            if let Some(r) = &b.role_ref
                && r.kind == "ClusterRole"
            {
                rules.extend(self.cluster_role_rules(&r.name));
            }
        }
        if !namespace.is_empty() {
            for b in self.role_bindings.filter(|b| {
                b.metadata
                    .as_ref()
                    .is_some_and(|m| m.namespace == namespace)
                    && b.subjects
                        .iter()
                        .any(|s| subject_matches(s, user, namespace))
            }) {
                let Some(r) = &b.role_ref else { continue };
                match r.kind.as_str() {
                    "ClusterRole" => rules.extend(self.cluster_role_rules(&r.name)),
                    "Role" => {
                        if let Some(role) = self.roles.get(namespace, &r.name) {
                            rules.extend(role.rules.iter().cloned());
                        }
                    }
                    _ => {}
                }
            }
        }
        rules
    }

    /// What the Node authorizer reads of this authorizer: its pod and volume mirrors, and
    /// `rbac` where it defers to RBAC.
    pub(crate) fn node_graph<'a>(
        &'a self,
        rbac: &'a (dyn Fn(&UserInfo, &Attributes) -> bool + Sync),
    ) -> super::node::Graph<'a> {
        super::node::Graph {
            pods: &self.pods,
            persistent_volumes: &self.persistent_volumes,
            rbac,
        }
    }

    pub(crate) fn rbac_allows(&self, user: &UserInfo, a: &Attributes) -> bool {
        let ns = if a.path.is_some() { "" } else { &a.namespace };
        self.rules_for(user, ns).iter().any(|r| rule_allows(r, a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> PolicyRule {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        PolicyRule {
            verbs: v(verbs),
            api_groups: v(groups),
            resources: v(resources),
            resource_names: v(names),
            non_resource_urls: Vec::new(),
        }
    }

    #[test]
    fn rules_match_like_kube_apiservers() {
        let get_pods = Attributes::resource("get", "", "pods", "", "default", "web");
        assert!(rule_allows(
            &rule(&["get"], &[""], &["pods"], &[]),
            &get_pods
        ));
        assert!(rule_allows(&rule(&["*"], &["*"], &["*"], &[]), &get_pods));
        assert!(!rule_allows(
            &rule(&["list"], &[""], &["pods"], &[]),
            &get_pods
        ));
        assert!(!rule_allows(
            &rule(&["get"], &["apps"], &["pods"], &[]),
            &get_pods
        ));
        assert!(rule_allows(
            &rule(&["get"], &[""], &["pods"], &["web"]),
            &get_pods
        ));
        assert!(!rule_allows(
            &rule(&["get"], &[""], &["pods"], &["db"]),
            &get_pods
        ));
        // A subresource needs its own entry (or */sub); "pods" does not cover "pods/exec".
        let exec = Attributes::resource("create", "", "pods", "exec", "default", "web");
        assert!(!rule_allows(
            &rule(&["create"], &[""], &["pods"], &[]),
            &exec
        ));
        assert!(rule_allows(
            &rule(&["create"], &[""], &["pods/exec"], &[]),
            &exec
        ));
        assert!(rule_allows(
            &rule(&["create"], &[""], &["*/exec"], &[]),
            &exec
        ));
        // resourceNames never match a request without a name (list, create).
        let list = Attributes::resource("list", "", "pods", "", "default", "");
        assert!(!rule_allows(
            &rule(&["list"], &[""], &["pods"], &["web"]),
            &list
        ));
        let health = Attributes::non_resource("get", "/healthz");
        let mut nr = rule(&["get"], &[], &[], &[]);
        nr.non_resource_urls = vec!["/healthz".into()];
        assert!(rule_allows(&nr, &health));
        nr.non_resource_urls = vec!["/apis/*".into()];
        assert!(!rule_allows(&nr, &health));
        assert!(rule_allows(
            &nr,
            &Attributes::non_resource("get", "/apis/apps")
        ));
    }

    #[test]
    fn subjects_match_users_groups_and_service_accounts() {
        let user = UserInfo {
            name: "system:serviceaccount:shop:robot".into(),
            uid: String::new(),
            groups: vec!["system:serviceaccounts".into()],
            ..UserInfo::default()
        };
        let s = |kind: &str, name: &str, ns: &str| Subject {
            kind: kind.into(),
            name: name.into(),
            namespace: ns.into(),
            api_group: String::new(),
        };
        assert!(subject_matches(
            &s("ServiceAccount", "robot", "shop"),
            &user,
            ""
        ));
        assert!(subject_matches(
            &s("ServiceAccount", "robot", ""),
            &user,
            "shop"
        ));
        assert!(!subject_matches(
            &s("ServiceAccount", "robot", "other"),
            &user,
            ""
        ));
        assert!(subject_matches(
            &s("Group", "system:serviceaccounts", ""),
            &user,
            ""
        ));
        assert!(!subject_matches(&s("User", "robot", ""), &user, ""));
    }

    #[test]
    fn forbidden_messages_are_kube_apiservers() {
        let a = Attributes::resource("get", "", "pods", "", "default", "web");
        assert_eq!(
            forbidden_message("alice", &a, ""),
            "pods \"web\" is forbidden: User \"alice\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        let a = Attributes::resource("list", "apps", "deployments", "", "", "");
        assert_eq!(
            forbidden_message("bob", &a, ""),
            "deployments.apps is forbidden: User \"bob\" cannot list resource \"deployments\" in API group \"apps\" at the cluster scope"
        );
        let a = Attributes::resource("create", "", "pods", "exec", "default", "web");
        assert!(forbidden_message("v", &a, "").contains("cannot create resource \"pods/exec\""));
        let a = Attributes::non_resource("get", "/metrics");
        assert_eq!(
            forbidden_message("x", &a, "nope"),
            "forbidden: User \"x\" cannot get path \"/metrics\": nope"
        );
    }
}
