//! The Node authorizer with NodeRestriction's rules, for users `system:node:<name>` in
//! `system:nodes` (kube-apiserver's `plugin/pkg/auth/authorizer/node` and
//! `plugin/pkg/admission/noderestriction`): a node reads what it needs to run the pods bound
//! to it and writes only its own Node, its own Lease and those pods.
//!
//! - Nodes: read any (routes to other nodes' pod CIDRs); create, update and patch only its
//!   own (`node "n1" is not allowed to modify node "n2"`).
//! - Leases in `kube-node-lease`: only its own. In `kube-system`: list and watch, and get,
//!   create, update and patch those named `skiff-l2-*` (the L2 announcement elections of
//!   LoadBalancer addresses, one per address, which any eligible node may hold); never
//!   delete, never another name (not the control plane's leader-election Leases). Not in
//!   Kubernetes' Node authorizer: MetalLB's and Cilium's speakers hold the like through
//!   their own ServiceAccounts.
//! - Pods: get, update (status), patch and delete only pods bound to it; list and watch
//!   with the field selector `spec.nodeName=<node>`, or as RBAC allows (the default policy
//!   binds `system:skiff:network-policy-agent` to every node: NetworkPolicy enforcement needs
//!   every pod's address and labels); never create.
//! - Secrets and ConfigMaps: get only those a pod bound to it names (volumes, projected
//!   sources, env, envFrom, imagePullSecrets); never list or watch.
//! - ServiceAccount tokens: create only for the ServiceAccounts its pods run as, and (the
//!   NodeRestriction check in the TokenRequest handler) only bound to such a pod.
//! - SubjectAccessReviews: create (its agent asks who may use its API). Not
//!   `nodes/<subresource>`: one node does not use another's agent API.
//! - PersistentVolumeClaims: get only those a pod bound to it names
//!   (`volumes[].persistentVolumeClaim.claimName`); PersistentVolumes: get only those bound
//!   (`spec.claimRef`) to such a claim. Other reads of them, and other nodes' claims and
//!   volumes, as RBAC allows (Kubernetes' Node authorizer has no opinion there either).
//! - Services, Endpoints, Namespaces: read (the service proxy). Events: create and update.
//! - NetworkPolicies: read. Not in Kubernetes' Node authorizer, where the network plugin
//!   reads them with its own identity; Skiff's node agent enforces them itself.
//!
//! Anything else gets no opinion here, so RBAC decides (nodes are in `system:authenticated`,
//! which reads discovery).

use skiff_api::api::Pod;
use skiff_api::selector::FieldSelector;

use super::mirror::Mirror;
use crate::request::UserInfo;
use crate::request::{Attributes, Decision, node_of};

/// What the Node authorizer reads: the pods and volumes the server mirrors, and RBAC's answer
/// where it defers to RBAC (as kube-apiserver's chain does after a "no opinion").
pub struct Graph<'a> {
    pub pods: &'a Mirror<Pod>,
    pub persistent_volumes: &'a Mirror<skiff_api::api::PersistentVolume>,
    pub rbac: &'a (dyn Fn(&UserInfo, &Attributes) -> bool + Sync),
}

impl std::fmt::Debug for Graph<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph").finish_non_exhaustive()
    }
}

/// Where the node agents' L2 announcement Leases live, and how their names start.
const L2_LEASE_NAMESPACE: &str = "kube-system";
const L2_LEASE_PREFIX: &str = "skiff-l2-";

fn no_relationship(node: &str) -> Decision {
    Decision::Deny(format!(
        "no relationship found between node '{node}' and this object"
    ))
}

/// Secrets a pod names.
pub fn pod_secrets(pod: &Pod) -> Vec<String> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let mut out: Vec<String> = spec
        .image_pull_secrets
        .iter()
        .map(|s| s.name.clone())
        .collect();
    for v in &spec.volumes {
        if let Some(s) = &v.secret {
            out.push(s.secret_name.clone());
        }
        out.extend(
            v.projected
                .iter()
                .flat_map(|p| p.sources.iter())
                .filter_map(|s| s.secret.as_ref().map(|s| s.name.clone())),
        );
    }
    for c in spec.init_containers.iter().chain(&spec.containers) {
        for e in &c.env_from {
            if let Some(s) = &e.secret_ref {
                out.push(s.name.clone());
            }
        }
        for e in &c.env {
            if let Some(s) = e
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
            {
                out.push(s.name.clone());
            }
        }
    }
    out
}

/// ConfigMaps a pod names (volumes, envFrom, configMapKeyRef).
pub fn pod_config_maps(pod: &Pod) -> Vec<String> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let mut out: Vec<String> = spec
        .volumes
        .iter()
        .filter_map(|v| v.config_map.as_ref().map(|c| c.name.clone()))
        .collect();
    out.extend(
        spec.volumes
            .iter()
            .flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter()))
            .filter_map(|s| s.config_map.as_ref().map(|c| c.name.clone())),
    );
    for c in spec.init_containers.iter().chain(&spec.containers) {
        out.extend(
            c.env_from
                .iter()
                .filter_map(|e| e.config_map_ref.as_ref().map(|r| r.name.clone())),
        );
        out.extend(c.env.iter().filter_map(|e| {
            e.value_from
                .as_ref()
                .and_then(|v| v.config_map_key_ref.as_ref())
                .map(|r| r.name.clone())
        }));
    }
    out
}

/// The ServiceAccount a pod runs as (`default` when it names none).
pub fn service_account_of(spec: &skiff_api::api::PodSpec) -> &str {
    if spec.service_account_name.is_empty() {
        "default"
    } else {
        &spec.service_account_name
    }
}

/// Allows when a pod bound to `node` in the request's namespace names the object (`names`:
/// what a pod names of that resource), else "no relationship".
fn own_pods_name(
    authz: &Graph<'_>,
    node: &str,
    a: &Attributes,
    names: impl Fn(&Pod) -> Vec<String>,
) -> Decision {
    let named = !authz
        .pods
        .filter(|p| {
            bound_to(p, node)
                && p.metadata
                    .as_ref()
                    .is_some_and(|m| m.namespace == a.namespace)
                && names(p).contains(&a.name)
        })
        .is_empty();
    if named {
        Decision::Allow
    } else {
        no_relationship(node)
    }
}

/// Whether a pod bound to `node` in `namespace` names the claim `claim`.
fn own_pods_claim(authz: &Graph<'_>, node: &str, namespace: &str, claim: &str) -> bool {
    !authz
        .pods
        .filter(|p| {
            bound_to(p, node)
                && p.metadata
                    .as_ref()
                    .is_some_and(|m| m.namespace == namespace)
                && p.claim_names().iter().any(|c| c == claim)
        })
        .is_empty()
}

/// A get of a claim or a volume: allowed when a pod bound to `node` uses it (a volume: is
/// bound to a claim such a pod names), else as RBAC allows, else "no relationship".
fn own_pods_storage(authz: &Graph<'_>, user: &UserInfo, node: &str, a: &Attributes) -> Decision {
    let related = a.subresource.is_empty()
        && match a.resource.as_str() {
            "persistentvolumeclaims" => own_pods_claim(authz, node, &a.namespace, &a.name),
            _ => authz
                .persistent_volumes
                .get("", &a.name)
                .and_then(|pv| pv.spec.as_ref().and_then(|s| s.claim_ref.clone()))
                .is_some_and(|r| own_pods_claim(authz, node, &r.namespace, &r.name)),
        };
    if related || (authz.rbac)(user, a) {
        Decision::Allow
    } else {
        no_relationship(node)
    }
}

fn bound_to(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| s.node_name == node)
}

/// The Node authorizer's decision.
pub fn decide(authz: &Graph<'_>, user: &UserInfo, a: &Attributes) -> Decision {
    let Some(node) = node_of(user) else {
        return Decision::NoOpinion;
    };
    if a.path.is_some() {
        return Decision::NoOpinion;
    }
    let read = matches!(a.verb.as_str(), "get" | "list" | "watch");
    let write = matches!(a.verb.as_str(), "create" | "update" | "patch");
    match (a.api_group.as_str(), a.resource.as_str()) {
        // Node objects, not their agents' APIs (`nodes/proxy`, `nodes/log`, `nodes/stats`,
        // `nodes/metrics`: one node does not read another's agent).
        ("", "nodes") if read && a.subresource.is_empty() => Decision::Allow,
        ("", "nodes") if write && matches!(a.subresource.as_str(), "" | "status") => {
            let target = if a.name.is_empty() {
                &a.object_name
            } else {
                &a.name
            };
            if target == node {
                Decision::Allow
            } else {
                Decision::Refuse(format!(
                    "nodes {target:?} is forbidden: node {node:?} is not allowed to modify node {target:?}"
                ))
            }
        }
        ("coordination.k8s.io", "leases") => {
            let target = if a.name.is_empty() {
                &a.object_name
            } else {
                &a.name
            };
            let l2_election = a.namespace == L2_LEASE_NAMESPACE
                && match a.verb.as_str() {
                    "list" | "watch" => true,
                    "get" | "create" | "update" | "patch" => target.starts_with(L2_LEASE_PREFIX),
                    _ => false,
                };
            if (a.namespace == "kube-node-lease" && target == node && a.verb != "deletecollection")
                || l2_election
            {
                Decision::Allow
            } else {
                Decision::NoOpinion
            }
        }
        ("", "pods") => match a.verb.as_str() {
            "list" | "watch" => {
                let own = FieldSelector::parse(&a.field_selector)
                    .ok()
                    .and_then(|f| f.equality("spec.nodeName").map(|n| n == node))
                    .unwrap_or(false);
                // Beyond its own pods, RBAC decides (as after kube-apiserver's Node authorizer
                // has no opinion): the default policy lets nodes list and watch every pod,
                // whose addresses and labels NetworkPolicy enforcement needs
                // (`system:skiff:network-policy-agent`); without that binding, the Node
                // authorizer's reason is the answer.
                if own || (authz.rbac)(user, a) {
                    Decision::Allow
                } else {
                    Decision::Deny(format!(
                        "node '{node}' can only list/watch pods with spec.nodeName={node} field selector"
                    ))
                }
            }
            "get" | "update" | "patch" | "delete" => {
                let on_node = authz
                    .pods
                    .get(&a.namespace, &a.name)
                    .is_some_and(|p| bound_to(&p, node));
                if on_node && (a.subresource.is_empty() || a.subresource == "status") {
                    Decision::Allow
                } else {
                    no_relationship(node)
                }
            }
            _ => Decision::NoOpinion,
        },
        // Tokens for the ServiceAccounts its pods run as (which pod: NodeRestriction, in the
        // TokenRequest handler).
        ("", "serviceaccounts") if a.subresource == "token" && a.verb == "create" => {
            own_pods_name(authz, node, a, |p| {
                p.spec
                    .as_ref()
                    .map(|s| vec![service_account_of(s).to_string()])
                    .unwrap_or_default()
            })
        }
        ("", "secrets") if a.verb == "get" => own_pods_name(authz, node, a, pod_secrets),
        ("", "configmaps") if a.verb == "get" => own_pods_name(authz, node, a, pod_config_maps),
        ("", "secrets" | "configmaps") => no_relationship(node),
        ("", "persistentvolumeclaims" | "persistentvolumes") if a.verb == "get" => {
            own_pods_storage(authz, user, node, a)
        }
        ("", "services" | "endpoints" | "namespaces") if read => Decision::Allow,
        ("networking.k8s.io", "networkpolicies") if read => Decision::Allow,
        ("" | "events.k8s.io", "events") if write => Decision::Allow,
        // The agent asks who may read its own API, as the kubelet's webhook authorizer does
        // (kube-apiserver's NodeRules: "Needed to check API access").
        ("authorization.k8s.io", "subjectaccessreviews") if a.verb == "create" => Decision::Allow,
        // Its agent renews its own client certificate (kube-apiserver's NodeRules: "Needed
        // for client certificate rotation").
        ("certificates.k8s.io", "certificatesigningrequests")
            if a.subresource.is_empty()
                && matches!(a.verb.as_str(), "create" | "get" | "list" | "watch") =>
        {
            Decision::Allow
        }
        _ => Decision::NoOpinion,
    }
}

#[cfg(test)]
mod tests {
    use crate::request::NODES_GROUP;
    use std::sync::Arc;

    use serde_json::json;
    use skiff_api::Resource;
    use skiff_api::api::{Namespace, PersistentVolume, PersistentVolumeClaim};

    use super::*;
    use crate::registry::{Registry, WriteOptions};

    async fn create<T: Resource>(registry: &Registry, namespace: &str, object: serde_json::Value) {
        let obj: T = serde_json::from_value(object).unwrap();
        registry
            .handler(T::INFO.plural)
            .unwrap()
            .create(
                namespace,
                skiff_api::Encoded::proto(&obj),
                WriteOptions::default(),
            )
            .await
            .unwrap();
    }

    fn pod(name: &str, node: &str, claim: &str) -> serde_json::Value {
        json!({"metadata": {"name": name, "namespace": "shop"},
               "spec": {"nodeName": node,
                        "containers": [{"name": "c", "image": "host",
                                        "volumeMounts": [{"name": "data", "mountPath": "/d"}]}],
                        "volumes": [{"name": "data",
                                     "persistentVolumeClaim": {"claimName": claim}}]}})
    }

    fn claim(name: &str) -> serde_json::Value {
        json!({"metadata": {"name": name, "namespace": "shop"},
               "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                        "resources": {"requests": {"storage": "1Gi"}}}})
    }

    fn volume(name: &str, claim: &str) -> serde_json::Value {
        json!({"metadata": {"name": name},
               "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                        "hostPath": {"path": "/srv"},
                        "claimRef": {"namespace": "shop", "name": claim}}})
    }

    /// A registry over an embedded store in a temporary directory (kept while it lives).
    async fn registry() -> (Registry, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = skiff_store::EmbeddedStore::open(
            &dir.path().join("s.redb"),
            skiff_store::EmbeddedOptions::default(),
        )
        .unwrap();
        (
            Registry::start(
                Arc::new(store),
                64,
                Arc::new(crate::admission::Chain::default()),
            )
            .await
            .unwrap(),
            dir,
        )
    }

    /// Node `name`'s identity, as its certificate gives it.
    fn node_user(name: &str) -> UserInfo {
        UserInfo {
            name: format!("system:node:{name}"),
            groups: vec![NODES_GROUP.into(), "system:authenticated".into()],
            ..Default::default()
        }
    }

    /// A node writes its own node Lease and the L2 announcement Leases, no other Lease.
    #[tokio::test]
    async fn nodes_write_only_their_lease_and_l2_announcement_leases() {
        let (registry, _dir) = registry().await;
        let full = crate::auth::authz::Authorizer::start(&registry)
            .await
            .unwrap();
        let rbac = |u: &UserInfo, a: &Attributes| full.rbac_allows(u, a);
        let authz = full.node_graph(&rbac);
        let n1 = node_user("n1");
        let may = |verb: &str, namespace: &str, name: &str| {
            decide(
                &authz,
                &n1,
                &Attributes::resource(verb, "coordination.k8s.io", "leases", "", namespace, name),
            ) == Decision::Allow
        };
        for verb in ["get", "create", "update", "patch"] {
            assert!(
                may(verb, "kube-system", "skiff-l2-192-168-100-240"),
                "{verb}"
            );
            assert!(!may(verb, "kube-system", "skiff-scheduler"), "{verb}");
            assert!(!may(verb, "default", "skiff-l2-192-168-100-240"), "{verb}");
            assert!(may(verb, "kube-node-lease", "n1"), "{verb}");
            assert!(!may(verb, "kube-node-lease", "n2"), "{verb}");
        }
        assert!(may("list", "kube-system", "") && may("watch", "kube-system", ""));
        assert!(!may("list", "default", ""));
        assert!(!may("delete", "kube-system", "skiff-l2-192-168-100-240"));
        assert!(!may("deletecollection", "kube-system", ""));
    }

    /// A node gets the claims its pods name and the volumes bound to them, nothing else.
    #[tokio::test]
    async fn nodes_get_the_claims_and_volumes_of_their_pods() {
        let (registry, _dir) = registry().await;
        create::<Namespace>(&registry, "", json!({"metadata": {"name": "shop"}})).await;
        create::<Pod>(&registry, "shop", pod("a", "n1", "data-a")).await;
        create::<Pod>(&registry, "shop", pod("b", "n2", "data-b")).await;
        for name in ["data-a", "data-b"] {
            create::<PersistentVolumeClaim>(&registry, "shop", claim(name)).await;
        }
        create::<PersistentVolume>(&registry, "", volume("pv-a", "data-a")).await;
        create::<PersistentVolume>(&registry, "", volume("pv-b", "data-b")).await;
        create::<PersistentVolume>(
            &registry,
            "",
            json!({"metadata": {"name": "pv-free"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": "/srv"}}}),
        )
        .await;
        let full = crate::auth::authz::Authorizer::start(&registry)
            .await
            .unwrap();
        let rbac = |u: &UserInfo, a: &Attributes| full.rbac_allows(u, a);
        let authz = full.node_graph(&rbac);
        let n1 = node_user("n1");
        let get = |resource: &str, namespace: &str, name: &str| {
            decide(
                &authz,
                &n1,
                &Attributes::resource("get", "", resource, "", namespace, name),
            )
        };
        assert_eq!(
            get("persistentvolumeclaims", "shop", "data-a"),
            Decision::Allow
        );
        assert_eq!(get("persistentvolumes", "", "pv-a"), Decision::Allow);
        let unrelated =
            Decision::Deny("no relationship found between node 'n1' and this object".into());
        for (resource, namespace, name) in [
            ("persistentvolumeclaims", "shop", "data-b"),
            ("persistentvolumeclaims", "other", "data-a"),
            ("persistentvolumes", "", "pv-b"),
            ("persistentvolumes", "", "pv-free"),
            ("persistentvolumes", "", "missing"),
        ] {
            assert_eq!(
                get(resource, namespace, name),
                unrelated,
                "{resource} {name}"
            );
        }
        // A subresource is no get of the object; lists are RBAC's (none here).
        let status = Attributes::resource(
            "get",
            "",
            "persistentvolumeclaims",
            "status",
            "shop",
            "data-a",
        );
        assert_eq!(decide(&authz, &n1, &status), unrelated);
        let list = Attributes::resource("list", "", "persistentvolumes", "", "", "");
        assert_eq!(decide(&authz, &n1, &list), Decision::NoOpinion);
        registry.stop();
    }

    /// A node reads Node objects and writes its own and its status, but another node's agent
    /// API (`nodes/stats`, `nodes/proxy`, ...) is not its to use; it may ask the API server
    /// who may use its own (SubjectAccessReviews).
    #[tokio::test]
    async fn nodes_read_node_objects_not_other_agents() {
        let (registry, _dir) = registry().await;
        let full = crate::auth::authz::Authorizer::start(&registry)
            .await
            .unwrap();
        let rbac = |u: &UserInfo, a: &Attributes| full.rbac_allows(u, a);
        let authz = full.node_graph(&rbac);
        let n1 = node_user("n1");
        let on = |verb: &str, group: &str, resource: &str, sub: &str, name: &str| {
            decide(
                &authz,
                &n1,
                &Attributes::resource(verb, group, resource, sub, "", name),
            )
        };
        assert_eq!(on("get", "", "nodes", "", "n2"), Decision::Allow);
        assert_eq!(on("update", "", "nodes", "status", "n1"), Decision::Allow);
        for sub in ["stats", "proxy", "log", "metrics"] {
            assert_eq!(
                on("get", "", "nodes", sub, "n2"),
                Decision::NoOpinion,
                "{sub}"
            );
            assert_eq!(
                on("create", "", "nodes", sub, "n1"),
                Decision::NoOpinion,
                "{sub}"
            );
        }
        assert_eq!(
            on(
                "create",
                "authorization.k8s.io",
                "subjectaccessreviews",
                "",
                ""
            ),
            Decision::Allow
        );
        assert_eq!(
            on(
                "create",
                "authorization.k8s.io",
                "selfsubjectrulesreviews",
                "",
                ""
            ),
            Decision::NoOpinion
        );
        // Certificate rotation: asks for and watches its requests, approves none.
        for verb in ["create", "get", "watch"] {
            assert_eq!(
                on(
                    verb,
                    "certificates.k8s.io",
                    "certificatesigningrequests",
                    "",
                    ""
                ),
                Decision::Allow,
                "{verb}"
            );
        }
        assert_eq!(
            on(
                "update",
                "certificates.k8s.io",
                "certificatesigningrequests",
                "approval",
                "x"
            ),
            Decision::NoOpinion
        );
        registry.stop();
    }
}
