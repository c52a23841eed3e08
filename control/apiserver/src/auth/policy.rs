//! The default RBAC policy, created at start when missing (kube-apiserver's bootstrap
//! policy, `plugin/pkg/auth/authorizer/rbac/bootstrappolicy`, cut to the kinds Skiff serves):
//! the user-facing ClusterRoles `cluster-admin`, `admin`, `edit` and `view`; `system:basic-user`,
//! `system:discovery` and `system:public-info-viewer` for everyone; `system:node` (unbound:
//! nodes are authorized by the Node authorizer, as in Kubernetes); and each Skiff component's
//! least-privilege role, bound to its user. Objects that exist are never overwritten, so an
//! operator's edits stay.

use skiff_api::api::{ClusterRole, ClusterRoleBinding, ObjectMeta, PolicyRule, RoleRef, Subject};

use crate::request::UNAUTHENTICATED_GROUP;
use crate::strategy::rbac::RBAC_GROUP;

/// Read verbs.
const READ: &[&str] = &["get", "list", "watch"];
/// Write verbs.
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

/// Every verb of a resource (not `escalate`, `bind` or `impersonate`).
const ALL_VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// A resource rule.
pub(crate) fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
    PolicyRule {
        verbs: v(verbs),
        api_groups: v(groups),
        resources: v(resources),
        resource_names: Vec::new(),
        non_resource_urls: Vec::new(),
    }
}

fn urls(verbs: &[&str], paths: &[&str]) -> PolicyRule {
    let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
    PolicyRule {
        verbs: v(verbs),
        non_resource_urls: v(paths),
        ..PolicyRule::default()
    }
}

fn meta(name: &str) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: name.to_string(),
        labels: [(
            "kubernetes.io/bootstrapping".to_string(),
            "rbac-defaults".to_string(),
        )]
        .into(),
        ..ObjectMeta::default()
    })
}

fn role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: meta(name),
        rules,
        ..ClusterRole::default()
    }
}

/// What `view` may read: everything in the namespace but Secrets (and RBAC).
const VIEWABLE: &[&str] = &[
    "configmaps",
    "replicationcontrollers",
    "replicationcontrollers/scale",
    "replicationcontrollers/status",
    "pods",
    "pods/log",
    "pods/status",
    "services",
    "services/status",
    "endpoints",
    "events",
    "namespaces",
    "namespaces/status",
    "serviceaccounts",
    "persistentvolumeclaims",
    "persistentvolumeclaims/status",
];
const APPS: &[&str] = &[
    "daemonsets",
    "daemonsets/status",
    "statefulsets",
    "statefulsets/scale",
    "statefulsets/status",
    "deployments",
    "deployments/scale",
    "deployments/status",
    "replicasets",
    "replicasets/scale",
    "replicasets/status",
];

fn view_rules() -> Vec<PolicyRule> {
    vec![
        rule(READ, &[""], VIEWABLE),
        rule(READ, &["apps"], APPS),
        rule(
            READ,
            &["policy"],
            &["poddisruptionbudgets", "poddisruptionbudgets/status"],
        ),
        rule(READ, &["batch"], BATCH),
        rule(READ, &["autoscaling"], AUTOSCALING),
        rule(READ, &[NETWORKING_GROUP], &["networkpolicies"]),
        // system:aggregated-metrics-reader's rules, aggregated into view in Kubernetes.
        rule(READ, &["metrics.k8s.io"], &["pods", "nodes"]),
    ]
}

const BATCH: &[&str] = &["jobs", "jobs/status", "cronjobs", "cronjobs/status"];
/// The networking API group (NetworkPolicies).
const NETWORKING_GROUP: &str = "networking.k8s.io";
/// The storage API group (StorageClasses).
const STORAGE_GROUP: &str = "storage.k8s.io";
/// Skiff's own kinds (LoadBalancerIPPools).
const SKIFF_GROUP: &str = "skiff.io";
const AUTOSCALING: &[&str] = &[
    "horizontalpodautoscalers",
    "horizontalpodautoscalers/status",
];

fn edit_rules() -> Vec<PolicyRule> {
    let mut r = view_rules();
    r.extend([
        rule(
            WRITE,
            &[""],
            &[
                "configmaps",
                "pods",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "services",
                "endpoints",
                "secrets",
                "serviceaccounts",
                "persistentvolumeclaims",
            ],
        ),
        rule(&["create"], &[""], &["serviceaccounts/token"]),
        rule(READ, &[""], &["secrets"]),
        rule(
            &["create", "get"],
            &[""],
            &["pods/exec", "pods/portforward", "pods/attach"],
        ),
        rule(&["create"], &[""], &["pods/eviction"]),
        rule(WRITE, &["policy"], &["poddisruptionbudgets"]),
        rule(WRITE, &["batch"], &["jobs", "cronjobs"]),
        rule(WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
        rule(WRITE, &[NETWORKING_GROUP], &["networkpolicies"]),
        rule(
            WRITE,
            &["apps"],
            &[
                "daemonsets",
                "statefulsets",
                "statefulsets/scale",
                "deployments",
                "deployments/scale",
                "replicasets",
                "replicasets/scale",
            ],
        ),
    ]);
    r
}

fn admin_rules() -> Vec<PolicyRule> {
    let mut r = edit_rules();
    r.extend([
        rule(READ, &[RBAC_GROUP], &["roles", "rolebindings"]),
        rule(WRITE, &[RBAC_GROUP], &["roles", "rolebindings"]),
        rule(
            &["create"],
            &["authorization.k8s.io"],
            &["localsubjectaccessreviews"],
        ),
    ]);
    r
}

/// What the namespace controller needs to empty a terminating namespace: to list and delete
/// every namespaced kind the API serves. Derived from the one list of kinds, so a kind added
/// later is never left behind (a namespace would stay Terminating for ever); custom kinds
/// come through [`CUSTOM_KINDS_ROLE`].
fn namespace_deleter_rules() -> Vec<PolicyRule> {
    let typed: Vec<(String, String)> = skiff_api::kinds()
        .iter()
        .map(|k| k.info())
        .filter(|info| info.namespaced)
        .map(|info| (info.group().to_string(), info.plural.to_string()))
        .collect();
    kind_rules(
        &["get", "list", "watch", "delete", "deletecollection"],
        &typed,
    )
}

/// The ClusterRole through which the controller manager's namespace controller and garbage
/// collector reach the custom kinds; its rules follow the served custom kinds (the API
/// server's definitions loop writes them: [`custom_kind_rules`]), so the controller manager
/// gets no more than the kinds that exist.
pub const CUSTOM_KINDS_ROLE: &str = "system:controller:custom-kinds";

/// `verbs` on the `(group, plural)` kinds, one rule per group.
fn kind_rules(verbs: &[&str], kinds: &[(String, String)]) -> Vec<PolicyRule> {
    let mut by_group: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (group, plural) in kinds {
        by_group.entry(group).or_default().push(plural);
    }
    by_group
        .into_iter()
        .map(|(group, plurals)| rule(verbs, &[group], &plurals))
        .collect()
}

/// The rules of [`CUSTOM_KINDS_ROLE`] for the `(group, plural)` custom kinds: reading and
/// deleting them (emptying a namespace, collecting garbage) and updating them (the garbage
/// collector removes the Orphan and Foreground finalizers of custom owners and the references
/// of custom dependents to owners that are gone).
pub fn custom_kind_rules(kinds: &[(String, String)]) -> Vec<PolicyRule> {
    kind_rules(
        &[
            "get",
            "list",
            "watch",
            "update",
            "delete",
            "deletecollection",
        ],
        kinds,
    )
}

/// `r` limited to the objects named `names`.
fn named(mut r: PolicyRule, names: &[&str]) -> PolicyRule {
    r.resource_names = names.iter().map(|n| n.to_string()).collect();
    r
}

/// The default ClusterRoles.
pub fn cluster_roles() -> Vec<ClusterRole> {
    let all = |v: &[&str]| rule(v, &["*"], &["*"]);
    vec![
        role("cluster-admin", vec![all(&["*"]), urls(&["*"], &["*"])]),
        role(CUSTOM_KINDS_ROLE, Vec::new()),
        role("admin", admin_rules()),
        role("edit", edit_rules()),
        role("view", view_rules()),
        role(
            "system:basic-user",
            vec![
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                rule(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
            ],
        ),
        role(
            "system:discovery",
            vec![urls(
                &["get"],
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/readyz",
                    "/openapi",
                    "/openapi/*",
                    "/version",
                    "/version/",
                ],
            )],
        ),
        role(
            "system:service-account-issuer-discovery",
            vec![urls(
                &["get"],
                &["/.well-known/openid-configuration", "/openid/v1/jwks"],
            )],
        ),
        role(
            "system:public-info-viewer",
            vec![urls(
                &["get"],
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
            )],
        ),
        // What the Node authorizer gives nodes, as RBAC rules (unbound by default).
        role(
            "system:node",
            vec![
                rule(
                    READ,
                    &[""],
                    &["nodes", "services", "endpoints", "namespaces"],
                ),
                rule(
                    &["create", "update", "patch"],
                    &[""],
                    &["nodes", "nodes/status"],
                ),
                rule(
                    &["get", "list", "watch", "update", "patch", "delete"],
                    &[""],
                    &["pods", "pods/status"],
                ),
                rule(&["get"], &[""], &["secrets", "configmaps"]),
                rule(
                    &["get"],
                    &[""],
                    &["persistentvolumeclaims", "persistentvolumes"],
                ),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
                rule(
                    &["create", "get", "list", "watch"],
                    &[CERTIFICATES_GROUP],
                    &["certificatesigningrequests"],
                ),
                // Skiff's node agents enforce NetworkPolicies themselves (Kubernetes leaves
                // that to the network plugin's own identity).
                rule(READ, &[NETWORKING_GROUP], &["networkpolicies"]),
                rule(
                    &["create", "update", "patch"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
                rule(
                    &["get", "create", "update", "patch", "delete"],
                    &["coordination.k8s.io"],
                    &["leases"],
                ),
            ],
        ),
        // Full use of the node agents' API (Kubernetes' role for the kubelet's API): bind it
        // to a user to let them read any agent's logs, stats and metrics and exec in pods
        // through it. Narrower roles name `nodes/metrics`, `nodes/stats`, `nodes/log` or
        // `nodes/proxy` (what every other agent path is).
        role(
            "system:kubelet-api-admin",
            vec![
                rule(&["get", "list", "watch", "proxy"], &[""], &["nodes"]),
                rule(
                    &["*"],
                    &[""],
                    &[
                        "nodes/log",
                        "nodes/metrics",
                        "nodes/proxy",
                        "nodes/spec",
                        "nodes/stats",
                    ],
                ),
            ],
        ),
        // skiff-scheduler: reads pods and nodes, binds, reports, holds its Lease.
        role(
            "system:kube-scheduler",
            vec![
                rule(READ, &[""], &["pods", "nodes", "namespaces", "services"]),
                rule(READ, &["apps"], &["replicasets"]),
                // Volume binding (Kubernetes' system:volume-scheduler): claims and volumes
                // are read and updated (the selected node, a volume's claimRef), classes
                // read (their binding mode).
                rule(
                    &["get", "list", "watch", "update", "patch"],
                    &[""],
                    &["persistentvolumeclaims", "persistentvolumes"],
                ),
                rule(READ, &[STORAGE_GROUP], &["storageclasses"]),
                rule(&["create"], &[""], &["pods/binding"]),
                rule(&["update", "patch"], &[""], &["pods/status"]),
                rule(
                    &["create", "update", "patch"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
                rule(
                    &["get", "list", "watch", "create", "update"],
                    &["coordination.k8s.io"],
                    &["leases"],
                ),
            ],
        ),
        // skiff-vip: holds the API servers' virtual address through its one Lease, nothing
        // else (creating cannot be limited by name; reading and renewing are).
        role(
            "system:skiff-vip",
            vec![
                rule(&["create"], &["coordination.k8s.io"], &["leases"]),
                named(
                    rule(&["get", "update"], &["coordination.k8s.io"], &["leases"]),
                    &["skiff-apiserver-vip"],
                ),
            ],
        ),
        // skiff-controller-manager: its controllers own workloads, endpoints, allocations,
        // node health, garbage collection and namespace deletion (which removes every
        // namespaced kind, RBAC objects and Secrets included). No subresource that reaches
        // into a pod (exec, portforward, attach), no bind or impersonate; escalate only on
        // ClusterRoles, for their aggregation.
        role(
            "system:kube-controller-manager",
            vec![
                rule(
                    ALL_VERBS,
                    &[""],
                    &[
                        "pods",
                        "pods/status",
                        "replicationcontrollers",
                        "replicationcontrollers/status",
                        "services",
                        "services/status",
                        "endpoints",
                        "events",
                        "namespaces",
                        "namespaces/status",
                        "namespaces/finalize",
                        "nodes",
                        "nodes/status",
                        "secrets",
                        "configmaps",
                        "serviceaccounts",
                        "persistentvolumes",
                        "persistentvolumes/status",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                    ],
                ),
                // The garbage collector follows the custom kinds their definitions add (the
                // kinds themselves: `CUSTOM_KINDS_ROLE`).
                rule(
                    &["get", "list", "watch"],
                    &["apiextensions.k8s.io"],
                    &["customresourcedefinitions"],
                ),
                // The volume controllers read classes (and may create the default one).
                rule(
                    &["get", "list", "watch", "create"],
                    &[STORAGE_GROUP],
                    &["storageclasses"],
                ),
                rule(ALL_VERBS, &["apps"], APPS),
                rule(
                    ALL_VERBS,
                    &["policy"],
                    &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                ),
                rule(ALL_VERBS, &["batch"], BATCH),
                rule(ALL_VERBS, &["autoscaling"], AUTOSCALING),
                // The horizontal pod autoscaler reads the metrics API.
                rule(READ, &["metrics.k8s.io"], &["pods", "nodes"]),
                rule(ALL_VERBS, &["coordination.k8s.io"], &["leases"]),
                rule(ALL_VERBS, &["events.k8s.io"], &["events"]),
                rule(
                    &["get", "list", "watch", "delete", "deletecollection"],
                    &[RBAC_GROUP],
                    &["roles", "rolebindings"],
                ),
                // The clusterrole-aggregation controller writes aggregated ClusterRoles'
                // rules, which it need not hold itself: escalate, as Kubernetes grants it.
                rule(
                    &["get", "list", "watch", "update", "escalate"],
                    &[RBAC_GROUP],
                    &["clusterroles"],
                ),
                // The certificatesigningrequest controller approves nodes' client and
                // serving certificates, signs approved requests with the cluster CA, and
                // deletes requests that are done with (csrcleaner's rules).
                rule(
                    &["get", "list", "watch", "delete"],
                    &[CERTIFICATES_GROUP],
                    &["certificatesigningrequests"],
                ),
                rule(
                    &["update"],
                    &[CERTIFICATES_GROUP],
                    &[
                        "certificatesigningrequests/approval",
                        "certificatesigningrequests/status",
                    ],
                ),
                // The lbipam controller reads LoadBalancerIPPools and writes their status
                // (Services' status through services/status above).
                rule(READ, &[SKIFF_GROUP], &["loadbalancerippools"]),
                rule(&["update"], &[SKIFF_GROUP], &["loadbalancerippools/status"]),
                // The signers it approves for and signs as (kube-controller-manager's
                // csrapproving and csrsigning roles); the admission chain checks these.
                named(
                    rule(&["approve"], &[CERTIFICATES_GROUP], &["signers"]),
                    &[
                        skiff_api::wellknown::KUBELET_CLIENT_SIGNER,
                        skiff_api::wellknown::KUBELET_SERVING_SIGNER,
                    ],
                ),
                named(
                    rule(&["sign"], &[CERTIFICATES_GROUP], &["signers"]),
                    &[
                        skiff_api::wellknown::KUBELET_CLIENT_SIGNER,
                        skiff_api::wellknown::KUBELET_SERVING_SIGNER,
                        skiff_api::wellknown::CLIENT_SIGNER,
                    ],
                ),
            ]
            .into_iter()
            .chain(namespace_deleter_rules())
            .collect(),
        ),
        // A joining node's bootstrap token: ask for a certificate and watch for it
        // (kubeadm's and k3s' binding of this role to system:bootstrappers).
        role(
            "system:node-bootstrapper",
            vec![rule(
                &["create", "get", "list", "watch"],
                &[CERTIFICATES_GROUP],
                &["certificatesigningrequests"],
            )],
        ),
        // Every node agent enforces NetworkPolicy for its pods, so it reads every policy and
        // every pod's address and labels (Cilium's agent has the like through its own
        // ServiceAccount). Bound to all nodes; an operator who removes the binding keeps the
        // Node authorizer's narrower rule and loses enforcement.
        role(
            NETWORK_POLICY_AGENT,
            vec![
                rule(&["list", "watch"], &[""], &["pods"]),
                rule(READ, &["networking.k8s.io"], &["networkpolicies"]),
            ],
        ),
    ]
}

/// The ClusterRole (and its binding to `system:nodes`) of NetworkPolicy enforcement.
pub const NETWORK_POLICY_AGENT: &str = "system:skiff:network-policy-agent";

/// The certificates API group.
const CERTIFICATES_GROUP: &str = "certificates.k8s.io";

fn binding(name: &str, role: &str, subjects: &[(&str, &str)]) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(name),
        role_ref: Some(RoleRef {
            api_group: RBAC_GROUP.into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        }),
        subjects: subjects
            .iter()
            .map(|(kind, name)| Subject {
                kind: kind.to_string(),
                api_group: RBAC_GROUP.into(),
                name: name.to_string(),
                namespace: String::new(),
            })
            .collect(),
        ..ClusterRoleBinding::default()
    }
}

/// The default ClusterRoleBindings.
pub fn cluster_role_bindings() -> Vec<ClusterRoleBinding> {
    vec![
        binding(
            "cluster-admin",
            "cluster-admin",
            &[("Group", crate::request::MASTERS_GROUP)],
        ),
        binding(
            "system:basic-user",
            "system:basic-user",
            &[("Group", crate::request::AUTHENTICATED_GROUP)],
        ),
        binding(
            "system:discovery",
            "system:discovery",
            &[("Group", crate::request::AUTHENTICATED_GROUP)],
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &[
                ("Group", crate::request::AUTHENTICATED_GROUP),
                ("Group", UNAUTHENTICATED_GROUP),
            ],
        ),
        binding(
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            &[("Group", crate::request::SERVICE_ACCOUNTS_GROUP)],
        ),
        binding(
            "system:kube-scheduler",
            "system:kube-scheduler",
            &[("User", "system:kube-scheduler")],
        ),
        binding(
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            &[("User", "system:kube-controller-manager")],
        ),
        binding(
            CUSTOM_KINDS_ROLE,
            CUSTOM_KINDS_ROLE,
            &[("User", "system:kube-controller-manager")],
        ),
        binding(
            "system:skiff-vip",
            "system:skiff-vip",
            &[("User", "system:skiff-vip")],
        ),
        binding(
            "system:node-bootstrapper",
            "system:node-bootstrapper",
            &[("Group", crate::request::BOOTSTRAP_GROUP)],
        ),
        binding(
            NETWORK_POLICY_AGENT,
            NETWORK_POLICY_AGENT,
            &[("Group", crate::request::NODES_GROUP)],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::authz::rule_allows;
    use crate::request::Attributes;

    fn allows(role: &str, verb: &str, group: &str, resource: &str) -> bool {
        let roles = cluster_roles();
        let Some(r) = roles
            .iter()
            .find(|r| r.metadata.as_ref().is_some_and(|m| m.name == role))
        else {
            panic!("no ClusterRole {role}");
        };
        let a = Attributes::resource(verb, group, resource, "", "default", "");
        r.rules.iter().any(|rule| rule_allows(rule, &a))
    }

    #[test]
    fn the_controller_manager_may_empty_a_namespace_of_every_kind() {
        for info in skiff_api::kinds().iter().map(|k| k.info()) {
            if !info.namespaced {
                continue;
            }
            for verb in ["list", "delete", "deletecollection"] {
                assert!(
                    allows(
                        "system:kube-controller-manager",
                        verb,
                        info.group(),
                        info.plural
                    ),
                    "{verb} {}",
                    info.qualified()
                );
            }
        }
    }

    /// An APIService points the API server at any Service with the callers' identities
    /// (SSRF, and every request of its group): only cluster-admin may write one.
    #[test]
    fn only_cluster_admin_writes_apiservices() {
        let group = "apiregistration.k8s.io";
        assert!(allows("cluster-admin", "create", group, "apiservices"));
        for role in cluster_roles() {
            let name = role.metadata.as_ref().map_or("", |m| m.name.as_str());
            if name == "cluster-admin" {
                continue;
            }
            for verb in WRITE {
                assert!(
                    !allows(name, verb, group, "apiservices"),
                    "{name} may {verb} apiservices"
                );
            }
        }
    }

    #[test]
    fn network_policies_in_the_default_roles() {
        let np = |role: &str, verb: &str| allows(role, verb, NETWORKING_GROUP, "networkpolicies");
        for verb in READ {
            for role in ["view", "edit", "admin", "system:node"] {
                assert!(np(role, verb), "{role} {verb}");
            }
        }
        for verb in WRITE {
            assert!(np("edit", verb) && np("admin", verb), "{verb}");
            assert!(!np("view", verb) && !np("system:node", verb), "{verb}");
        }
        // The group matters: there are no core networkpolicies.
        assert!(!allows("view", "get", "", "networkpolicies"));
    }

    #[test]
    fn storage_in_the_default_roles() {
        let claims = |role: &str, verb: &str| allows(role, verb, "", "persistentvolumeclaims");
        for verb in READ {
            for role in ["view", "edit", "admin"] {
                assert!(claims(role, verb), "{role} {verb}");
                assert!(
                    allows(role, verb, "", "persistentvolumeclaims/status"),
                    "{role} {verb}"
                );
            }
        }
        for verb in WRITE {
            assert!(claims("edit", verb) && claims("admin", verb), "{verb}");
            assert!(!claims("view", verb), "{verb}");
        }
        // Volumes and classes are cluster-scoped: not in the namespaced roles.
        for role in ["view", "edit", "admin"] {
            assert!(!allows(role, "get", "", "persistentvolumes"), "{role}");
            assert!(
                !allows(role, "get", STORAGE_GROUP, "storageclasses"),
                "{role}"
            );
        }
        assert!(allows(
            "cluster-admin",
            "delete",
            STORAGE_GROUP,
            "storageclasses"
        ));
        let cm = "system:kube-controller-manager";
        for verb in ALL_VERBS {
            for resource in [
                "persistentvolumes",
                "persistentvolumes/status",
                "persistentvolumeclaims",
                "persistentvolumeclaims/status",
            ] {
                assert!(allows(cm, verb, "", resource), "{verb} {resource}");
            }
        }
        for verb in ["get", "list", "watch", "create"] {
            assert!(allows(cm, verb, STORAGE_GROUP, "storageclasses"), "{verb}");
        }
        assert!(!allows(cm, "delete", STORAGE_GROUP, "storageclasses"));
        let sched = "system:kube-scheduler";
        for verb in READ {
            assert!(allows(sched, verb, "", "persistentvolumeclaims"), "{verb}");
            assert!(allows(sched, verb, "", "persistentvolumes"), "{verb}");
            assert!(
                allows(sched, verb, STORAGE_GROUP, "storageclasses"),
                "{verb}"
            );
        }
        for verb in ["update", "patch"] {
            assert!(allows(sched, verb, "", "persistentvolumeclaims"), "{verb}");
        }
        assert!(!allows(sched, "create", "", "persistentvolumeclaims"));
        assert!(!allows(sched, "delete", "", "persistentvolumes"));
        assert!(!allows(sched, "update", STORAGE_GROUP, "storageclasses"));
        assert!(allows("system:node", "get", "", "persistentvolumes"));
        assert!(!allows("system:node", "list", "", "persistentvolumeclaims"));
    }

    #[test]
    fn the_controller_manager_reads_address_pools_and_writes_only_their_status() {
        let cm = "system:kube-controller-manager";
        for verb in READ {
            assert!(
                allows(cm, verb, SKIFF_GROUP, "loadbalancerippools"),
                "{verb}"
            );
        }
        assert!(allows(
            cm,
            "update",
            SKIFF_GROUP,
            "loadbalancerippools/status"
        ));
        for verb in ["create", "update", "patch", "delete", "deletecollection"] {
            assert!(
                !allows(cm, verb, SKIFF_GROUP, "loadbalancerippools"),
                "{verb}"
            );
        }
        assert!(!allows(
            cm,
            "patch",
            SKIFF_GROUP,
            "loadbalancerippools/status"
        ));
        assert!(allows(
            "cluster-admin",
            "create",
            SKIFF_GROUP,
            "loadbalancerippools"
        ));
    }

    #[test]
    fn the_controller_manager_aggregates_cluster_roles() {
        let cm = "system:kube-controller-manager";
        for verb in ["get", "list", "watch", "update", "escalate"] {
            assert!(allows(cm, verb, RBAC_GROUP, "clusterroles"), "{verb}");
        }
        for verb in ["create", "patch", "delete", "deletecollection", "bind"] {
            assert!(!allows(cm, verb, RBAC_GROUP, "clusterroles"), "{verb}");
        }
        for resource in ["roles", "rolebindings", "clusterrolebindings"] {
            assert!(!allows(cm, "escalate", RBAC_GROUP, resource), "{resource}");
            assert!(!allows(cm, "bind", RBAC_GROUP, resource), "{resource}");
        }
        assert!(!allows(cm, "update", RBAC_GROUP, "clusterrolebindings"));
        assert!(!allows(cm, "impersonate", "", "users"));
    }

    #[test]
    fn the_controller_manager_approves_and_signs_as_the_node_signers() {
        use skiff_api::wellknown::{CLIENT_SIGNER, KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER};
        let roles = cluster_roles();
        let Some(cm) = roles.iter().find(|r| {
            r.metadata
                .as_ref()
                .is_some_and(|m| m.name == "system:kube-controller-manager")
        }) else {
            panic!("no controller manager role");
        };
        let may = |verb: &str, signer: &str| {
            let a = Attributes::resource(verb, CERTIFICATES_GROUP, "signers", "", "", signer);
            cm.rules.iter().any(|rule| rule_allows(rule, &a))
        };
        for signer in [KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER] {
            assert!(may("approve", signer), "{signer}");
            assert!(may("sign", signer), "{signer}");
        }
        assert!(!may("approve", CLIENT_SIGNER) && may("sign", CLIENT_SIGNER));
        for signer in ["kubernetes.io/legacy-unknown", "example.com/serving"] {
            assert!(!may("approve", signer) && !may("sign", signer), "{signer}");
        }
    }
}
