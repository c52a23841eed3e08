//! The garbage collector against a real API server, with the Deployment and ReplicaSet
//! controllers and a fake kubelet running too.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use skiff_api::api::{
    ConfigMap, CustomResourceDefinition, Deployment, DeploymentSpec, Endpoints,
    HorizontalPodAutoscaler, ObjectMeta, OwnerReference, PersistentVolumeClaim, Pod,
    PodDisruptionBudget, ReplicaSet, Secret, ServiceAccount,
};
use skiff_api::{FOREGROUND_FINALIZER, Resource};
use skiff_client::controller::{Informer, ObjectKey};
use skiff_client::{Client, DeleteParams, ListParams, PropagationPolicy, WatchEvent};
use skiff_controllers::gc::{OwnerState, owner_state};

fn deployment(name: &str, replicas: i32, node: &str) -> Deployment {
    let mut template = template(&[("app", name)], "1");
    if let Some(spec) = template.as_mut().and_then(|t| t.spec.as_mut()) {
        spec.node_name = node.into();
    }
    Deployment {
        metadata: meta(name),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: selector(&[("app", name)]),
            template,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn uid<T: Resource>(o: &T) -> String {
    o.metadata().map(|m| m.uid.clone()).unwrap_or_default()
}

fn owner_uids<T: Resource>(o: &T) -> Vec<String> {
    o.metadata()
        .map(|m| m.owner_references.iter().map(|r| r.uid.clone()).collect())
        .unwrap_or_default()
}

fn deleting<T: Resource>(o: &T) -> bool {
    o.metadata()
        .is_some_and(|m| !m.deletion_timestamp.is_empty())
}

fn has_finalizer<T: Resource>(o: &T, f: &str) -> bool {
    o.metadata()
        .is_some_and(|m| m.finalizers.iter().any(|x| x == f))
}

async fn list<T: Resource>(client: &Client, app: &str) -> Vec<T> {
    client
        .namespaced::<T>("default")
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("list")
        .items
}

/// Creates the deployment and waits until its ReplicaSet and `replicas` ready pods exist;
/// returns the deployment, its ReplicaSet and the pods.
async fn running(client: &Client, d: Deployment) -> (Deployment, ReplicaSet, Vec<Pod>) {
    let name = d.name().to_string();
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) as usize;
    let d = client
        .namespaced::<Deployment>("default")
        .create(&d)
        .await
        .expect("create deployment");
    let d_uid = uid(&d);
    let (rs, pods) = eventually(&format!("{name} running"), || async {
        let sets = list::<ReplicaSet>(client, &name).await;
        let [rs] = sets.as_slice() else {
            return None;
        };
        if owner_uids(rs) != [d_uid.clone()] {
            return None;
        }
        let pods = active_pods(client, &format!("app={name}")).await;
        (pods.len() == replicas
            && pods
                .iter()
                .all(|p| p.is_ready() && owner_uids(p) == [uid(rs)]))
        .then(|| (rs.clone(), pods))
    })
    .await;
    (d, rs, pods)
}

fn delete_with(policy: PropagationPolicy) -> DeleteParams {
    DeleteParams {
        propagation_policy: Some(policy),
        ..Default::default()
    }
}

#[tokio::test]
async fn background_delete_collects_replica_sets_and_pods() {
    let c = cluster().await;
    let _m = start_manager(&c.client, "gc-bg", None);
    let _k = fake_kubelet(&c.client, Duration::from_millis(20));
    running(&c.client, deployment("bg", 3, "")).await;
    c.client
        .namespaced::<Deployment>("default")
        .delete("bg", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        c.client
            .namespaced::<Deployment>("default")
            .get_opt("bg")
            .await
            .unwrap()
            .is_none(),
        "a background delete removes the owner at once"
    );
    eventually("replica sets and pods collected", || async {
        (list::<ReplicaSet>(&c.client, "bg").await.is_empty()
            && list::<Pod>(&c.client, "bg").await.is_empty())
        .then_some(())
    })
    .await;
}

/// The resourceVersions of the deletes of every `T` in `default`, recorded by a watch.
fn record_deletes<T: Resource>(
    client: &Client,
    from: String,
    out: Arc<Mutex<Vec<(String, String, u64)>>>,
) -> Task {
    let mut watch = client
        .namespaced::<T>("default")
        .watch(&ListParams::default(), &from);
    Task(tokio::spawn(async move {
        while let Some(Ok(ev)) = watch.next().await {
            if let WatchEvent::Deleted(o) = ev {
                let rv = o.resource_version().parse().unwrap_or(0);
                out.lock()
                    .unwrap()
                    .push((T::INFO.kind.to_string(), o.name().to_string(), rv));
            }
        }
    }))
}

#[tokio::test]
async fn foreground_delete_goes_bottom_up_and_waits_for_terminating_pods() {
    let c = cluster().await;
    let _m = start_manager(&c.client, "gc-fg", None);
    let _k = fake_kubelet(&c.client, Duration::from_millis(20));
    // Bound pods are deleted gracefully: they stay, terminating, until their kubelet (here:
    // the test) finishes the delete.
    let (d, rs, pods) = running(&c.client, deployment("fg", 2, "node-a")).await;
    let from = c
        .client
        .namespaced::<Pod>("default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .resource_version;
    let deletes = Arc::new(Mutex::new(Vec::new()));
    let _w = [
        record_deletes::<Pod>(&c.client, from.clone(), deletes.clone()),
        record_deletes::<ReplicaSet>(&c.client, from.clone(), deletes.clone()),
        record_deletes::<Deployment>(&c.client, from, deletes.clone()),
    ];

    let deployments = c.client.namespaced::<Deployment>("default");
    let marked = deployments
        .delete("fg", &delete_with(PropagationPolicy::Foreground))
        .await
        .expect("delete");
    assert!(deleting(&marked) && has_finalizer(&marked, FOREGROUND_FINALIZER));

    // The ReplicaSet is deleted in the foreground too, its pods start terminating.
    eventually("pods terminating", || async {
        let pods = list::<Pod>(&c.client, "fg").await;
        (pods.len() == 2 && pods.iter().all(deleting)).then_some(())
    })
    .await;
    // Terminating pods still block: nothing above them goes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let d_now = deployments.get("fg").await.expect("deployment kept");
    assert_eq!(uid(&d_now), uid(&d));
    assert!(has_finalizer(&d_now, FOREGROUND_FINALIZER));
    let rs_now = c
        .client
        .namespaced::<ReplicaSet>("default")
        .get(rs.name())
        .await
        .expect("replica set kept while its pods terminate");
    assert!(deleting(&rs_now) && has_finalizer(&rs_now, FOREGROUND_FINALIZER));
    assert_eq!(
        list::<Pod>(&c.client, "fg").await.len(),
        2,
        "no replacements"
    );

    // The kubelet finishes the pods.
    for p in &pods {
        c.client
            .namespaced::<Pod>("default")
            .delete(
                p.name(),
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await
            .expect("finish pod");
    }
    eventually("deployment gone", || async {
        deployments
            .get_opt("fg")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(list::<ReplicaSet>(&c.client, "fg").await.is_empty());
    let seen = eventually("four deletes recorded", || async {
        let d = deletes.lock().unwrap().clone();
        (d.len() == 4).then_some(d)
    })
    .await;
    let rv_of = |kind: &str| -> Vec<u64> {
        seen.iter()
            .filter(|(k, _, _)| k == kind)
            .map(|(_, _, rv)| *rv)
            .collect()
    };
    let (pod_rvs, rs_rvs, d_rvs) = (rv_of("Pod"), rv_of("ReplicaSet"), rv_of("Deployment"));
    assert_eq!(
        (pod_rvs.len(), rs_rvs.len(), d_rvs.len()),
        (2, 1, 1),
        "{seen:?}"
    );
    assert!(
        pod_rvs.iter().all(|p| *p < rs_rvs[0]) && rs_rvs[0] < d_rvs[0],
        "deletes must go pods, then replica set, then deployment: {seen:?}"
    );
}

#[tokio::test]
async fn orphan_delete_keeps_replica_sets_and_pods_without_the_reference() {
    let c = cluster().await;
    let _m = start_manager(&c.client, "gc-orphan", None);
    let _k = fake_kubelet(&c.client, Duration::from_millis(20));
    let (d, rs, pods) = running(&c.client, deployment("orph", 2, "")).await;
    let deployments = c.client.namespaced::<Deployment>("default");
    deployments
        .delete("orph", &delete_with(PropagationPolicy::Orphan))
        .await
        .expect("delete");
    eventually("deployment gone", || async {
        deployments
            .get_opt("orph")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let d_uid = uid(&d);
    let rs_now = c
        .client
        .namespaced::<ReplicaSet>("default")
        .get(rs.name())
        .await
        .expect("replica set kept");
    assert_eq!(uid(&rs_now), uid(&rs));
    assert!(
        !owner_uids(&rs_now).contains(&d_uid),
        "the reference to the deleted deployment is removed: {:?}",
        owner_uids(&rs_now)
    );
    // Still there a while later: nothing collects or replaces them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sets = list::<ReplicaSet>(&c.client, "orph").await;
    assert_eq!(sets.len(), 1);
    assert!(!deleting(&sets[0]));
    let now = active_pods(&c.client, "app=orph").await;
    let mut names: Vec<&str> = now.iter().map(|p| p.name()).collect();
    let mut before: Vec<&str> = pods.iter().map(|p| p.name()).collect();
    names.sort();
    before.sort();
    assert_eq!(names, before, "the same pods keep running");
    assert!(now.iter().all(|p| owner_uids(p) == [uid(&rs)]));
}

fn endpoints(name: &str) -> Endpoints {
    Endpoints {
        metadata: meta(name),
        ..Default::default()
    }
}

fn endpoints_ref(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Endpoints".into(),
        name: name.into(),
        uid: uid.into(),
        ..Default::default()
    }
}

fn owned_pod(name: &str, owners: Vec<OwnerReference>) -> Pod {
    Pod {
        metadata: Some(ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            owner_references: owners,
            ..Default::default()
        }),
        spec: template(&[("app", "owned")], "1").and_then(|t| t.spec),
        ..Default::default()
    }
}

/// An operator's configuration and credentials (kopf's `adopt`, a kube-rs controller's
/// owned ConfigMap) go with their owner, as every kind's dependents do in Kubernetes.
#[tokio::test]
async fn what_operators_make_for_a_workload_goes_with_its_owner() {
    let c = cluster().await;
    let _m = start_manager(&c.client, "gc-config", None);
    let eps = c.client.namespaced::<Endpoints>("default");
    let owner = eps.create(&endpoints("configured")).await.unwrap();
    let owned = || {
        Some(ObjectMeta {
            name: "configured".into(),
            namespace: "default".into(),
            owner_references: vec![endpoints_ref("configured", &uid(&owner))],
            ..Default::default()
        })
    };
    let maps = c.client.namespaced::<ConfigMap>("default");
    let secrets = c.client.namespaced::<Secret>("default");
    maps.create(&ConfigMap {
        metadata: owned(),
        ..Default::default()
    })
    .await
    .unwrap();
    secrets
        .create(&Secret {
            metadata: owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    // What a workload's operator also makes for it: an identity, a claim, a budget, an
    // autoscaler.
    let meta = serde_json::to_value(owned()).unwrap();
    let decode = |kind: &str, spec: serde_json::Value| serde_json::json!({"kind": kind, "metadata": meta.clone(), "spec": spec});
    let accounts = c.client.namespaced::<ServiceAccount>("default");
    let claims = c.client.namespaced::<PersistentVolumeClaim>("default");
    let budgets = c.client.namespaced::<PodDisruptionBudget>("default");
    let scalers = c.client.namespaced::<HorizontalPodAutoscaler>("default");
    accounts
        .create(
            &skiff_api::manifest::decode(serde_json::json!({"metadata": meta.clone()})).unwrap(),
        )
        .await
        .unwrap();
    claims
        .create(
            &skiff_api::manifest::decode(decode(
                "PersistentVolumeClaim",
                serde_json::json!({"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}),
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    budgets
        .create(
            &skiff_api::manifest::decode(decode(
                "PodDisruptionBudget",
                serde_json::json!({"minAvailable": 1,
                    "selector": {"matchLabels": {"app": "configured"}}}),
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    scalers
        .create(
            &skiff_api::manifest::decode(decode(
                "HorizontalPodAutoscaler",
                serde_json::json!({"maxReplicas": 3, "scaleTargetRef":
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "configured"}}),
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    // Kept while the owner lives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(maps.get_opt("configured").await.unwrap().is_some());
    assert!(accounts.get_opt("configured").await.unwrap().is_some());
    eps.delete("configured", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the owned objects collected", || async {
        (maps.get_opt("configured").await.unwrap().is_none()
            && secrets.get_opt("configured").await.unwrap().is_none()
            && accounts.get_opt("configured").await.unwrap().is_none()
            && claims.get_opt("configured").await.unwrap().is_none()
            && budgets.get_opt("configured").await.unwrap().is_none()
            && scalers.get_opt("configured").await.unwrap().is_none())
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_owner_recreated_under_the_same_name_does_not_keep_old_dependents() {
    let c = cluster().await;
    let _m = start_manager(&c.client, "gc-uid", None);
    let eps = c.client.namespaced::<Endpoints>("default");
    let old = eps.create(&endpoints("owner")).await.unwrap();
    eps.delete("owner", &DeleteParams::default()).await.unwrap();
    let new = eps.create(&endpoints("owner")).await.unwrap();
    assert_ne!(uid(&old), uid(&new));
    let pods = c.client.namespaced::<Pod>("default");
    pods.create(&owned_pod(
        "stale",
        vec![endpoints_ref("owner", &uid(&old))],
    ))
    .await
    .unwrap();
    pods.create(&owned_pod(
        "fresh",
        vec![endpoints_ref("owner", &uid(&new))],
    ))
    .await
    .unwrap();
    eventually("pod of the old owner collected", || async {
        pods.get_opt("stale").await.unwrap().is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fresh = pods.get("fresh").await.expect("pod of the live owner kept");
    assert_eq!(owner_uids(&fresh), [uid(&new)]);
}

#[tokio::test]
async fn a_dependent_with_a_live_and_a_dead_owner_keeps_only_the_live_reference() {
    let c = cluster().await;
    let _m = start_manager(&c.client, "gc-mixed", None);
    let eps = c.client.namespaced::<Endpoints>("default");
    let alive = eps.create(&endpoints("alive")).await.unwrap();
    let dead = eps.create(&endpoints("dead")).await.unwrap();
    let pods = c.client.namespaced::<Pod>("default");
    pods.create(&owned_pod(
        "shared",
        vec![
            endpoints_ref("alive", &uid(&alive)),
            endpoints_ref("dead", &uid(&dead)),
        ],
    ))
    .await
    .unwrap();
    // Both owners exist: nothing changes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        pods.get("shared")
            .await
            .unwrap()
            .metadata
            .unwrap()
            .owner_references
            .len(),
        2
    );
    eps.delete("dead", &DeleteParams::default()).await.unwrap();
    let pod = eventually("reference to the dead owner removed", || async {
        let p = pods.get("shared").await.expect("pod kept");
        (owner_uids(&p) == [uid(&alive)]).then_some(p)
    })
    .await;
    assert!(!deleting(&pod));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(pods.get_opt("shared").await.unwrap().is_some());
}

/// The check the collector makes before it deletes anything: an owner missing from a cache
/// that lags (here: an informer that never sees it) is looked up on the API server.
#[tokio::test]
async fn an_owner_missing_from_a_lagging_cache_is_not_gone() {
    let c = cluster().await;
    let eps = c.client.namespaced::<Endpoints>("default");
    let owner = eps.create(&endpoints("owner")).await.unwrap();
    let key = ObjectKey::new("default", "owner");
    let blind: Informer<Endpoints> = Informer::new(
        c.client.all::<Endpoints>(),
        ListParams::default().labels("never=matches"),
    );
    blind.wait_synced().await;
    assert!(blind.get(&key).is_none());
    let state = |uid: String| {
        let (blind, client, key) = (blind.clone(), c.client.clone(), key.clone());
        async move { owner_state(&blind, &client, &key, &uid).await.unwrap() }
    };
    assert_eq!(state(uid(&owner)).await, OwnerState::Solid);
    // Deleted in the foreground (no collector runs here, so it stays that way).
    eps.delete("owner", &delete_with(PropagationPolicy::Foreground))
        .await
        .unwrap();
    assert_eq!(state(uid(&owner)).await, OwnerState::Waiting);
    // Recreated under the same name: the old uid is gone, the new one is solid.
    let mut marked = eps.get("owner").await.unwrap();
    marked.metadata_mut().finalizers.clear();
    eps.update(&marked).await.unwrap();
    assert!(eps.get_opt("owner").await.unwrap().is_none());
    assert_eq!(state(uid(&owner)).await, OwnerState::Gone);
    let again = eps.create(&endpoints("owner")).await.unwrap();
    assert_eq!(state(uid(&owner)).await, OwnerState::Gone);
    assert_eq!(state(uid(&again)).await, OwnerState::Solid);
    // A cache that has the object answers without the API server.
    let seeing: Informer<Endpoints> =
        Informer::new(c.client.all::<Endpoints>(), ListParams::default());
    seeing.wait_synced().await;
    eventually("cache has the owner", || async { seeing.get(&key) }).await;
    assert_eq!(
        owner_state(&seeing, &c.client, &key, &uid(&again))
            .await
            .unwrap(),
        OwnerState::Solid
    );
}

#[tokio::test]
async fn a_pod_with_a_live_owner_is_never_collected() {
    let c = cluster().await;
    let _m = start_manager(&c.client, "gc-live", None);
    let eps = c.client.namespaced::<Endpoints>("default");
    let pods = c.client.namespaced::<Pod>("default");
    // Owner and dependent created back to back: the collector may see the pod before the
    // owner reaches its cache, and must ask the API server instead of deleting.
    for i in 0..10 {
        let name = format!("owner-{i}");
        let owner = eps.create(&endpoints(&name)).await.unwrap();
        pods.create(&owned_pod(
            &format!("dep-{i}"),
            vec![endpoints_ref(&name, &uid(&owner))],
        ))
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..10 {
        assert!(
            pods.get_opt(&format!("dep-{i}")).await.unwrap().is_some(),
            "dep-{i} was collected although its owner exists"
        );
    }
}

#[tokio::test]
async fn orphaning_a_replica_set_leaves_its_pods_unowned_and_not_readopted() {
    let c = cluster().await;
    let _m = start_manager(&c.client, "gc-orphan-rs", None);
    let sets = c.client.namespaced::<ReplicaSet>("default");
    let rs = sets
        .create(&ReplicaSet {
            metadata: meta("lone"),
            spec: Some(skiff_api::api::ReplicaSetSpec {
                replicas: Some(2),
                selector: selector(&[("app", "lone")]),
                template: template(&[("app", "lone")], "1"),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let pods = eventually("two pods of the replica set", || async {
        let pods = list::<Pod>(&c.client, "lone").await;
        (pods.len() == 2 && pods.iter().all(|p| owner_uids(p) == [uid(&rs)])).then_some(pods)
    })
    .await;
    sets.delete("lone", &delete_with(PropagationPolicy::Orphan))
        .await
        .unwrap();
    eventually("replica set gone", || async {
        sets.get_opt("lone").await.unwrap().is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let now = list::<Pod>(&c.client, "lone").await;
    let mut names: Vec<&str> = now.iter().map(|p| p.name()).collect();
    let mut before: Vec<&str> = pods.iter().map(|p| p.name()).collect();
    names.sort();
    before.sort();
    assert_eq!(names, before, "the pods stay");
    assert!(
        now.iter().all(|p| owner_uids(p).is_empty() && !deleting(p)),
        "no owner, not deleted: {now:?}"
    );
}

/// A namespaced custom kind `Widget` (`widgets.gc.example.com`) with an open schema, once
/// established and served.
async fn widget_kind(client: &Client) -> &'static dyn skiff_api::DynKind {
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.gc.example.com"},
        "spec": {
            "group": "gc.example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                      "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap();
    client
        .cluster::<CustomResourceDefinition>()
        .create(&crd)
        .await
        .unwrap();
    eventually("the Widget kind to be served", || async {
        client
            .custom_kinds()
            .await
            .ok()?
            .into_iter()
            .find(|k| k.info().kind == "Widget")
    })
    .await
}

fn owner_ref(
    api_version: &str,
    kind: &str,
    name: &str,
    uid: &str,
    block: bool,
) -> serde_json::Value {
    serde_json::json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
        "blockOwnerDeletion": block})
}

fn widget(name: &str, owners: Vec<serde_json::Value>, finalizers: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "gc.example.com/v1", "kind": "Widget",
        "metadata": {"name": name, "namespace": "default", "ownerReferences": owners,
                     "finalizers": finalizers},
        "spec": {"size": 1}
    })
}

fn json_uid(o: &serde_json::Value) -> String {
    o["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Custom objects are dependents as typed ones are (Kubernetes' collector follows every
/// kind): one owned by a ConfigMap goes with it; one owned by another custom object goes
/// with it, and blocks its Foreground deletion until it is gone; Orphan removes the
/// reference from it.
#[tokio::test]
async fn custom_objects_are_collected_as_dependents() {
    let c = cluster().await;
    let _m = start_manager(&c.client, "gc-custom", None);
    let kind = widget_kind(&c.client).await;
    let widgets = c.client.dynamic(kind, Some("default"));
    let maps = c.client.namespaced::<ConfigMap>("default");
    let gone = |name: &'static str| {
        let widgets = widgets.clone();
        move || {
            let widgets = widgets.clone();
            async move { widgets.get_opt(name).await.unwrap().is_none() }
        }
    };

    // A typed owner.
    let cfg = maps
        .create(&ConfigMap {
            metadata: meta("cfg"),
            ..Default::default()
        })
        .await
        .unwrap();
    let cfg_ref = owner_ref("v1", "ConfigMap", "cfg", &uid(&cfg), false);
    widgets
        .create(&widget("of-cfg", vec![cfg_ref], &[]))
        .await
        .unwrap();
    maps.delete("cfg", &delete_with(PropagationPolicy::Background))
        .await
        .unwrap();
    eventually(
        "the widget owned by the ConfigMap to be collected",
        gone("of-cfg"),
    )
    .await;

    // A custom owner deleted in the foreground: its custom dependent (held by a finalizer
    // of its own for now) and its ConfigMap go first; the owner waits for the blocking one.
    let parent = widgets
        .create(&widget("parent", vec![], &[]))
        .await
        .unwrap();
    let parent_ref = |block| {
        owner_ref(
            "gc.example.com/v1",
            "Widget",
            "parent",
            &json_uid(&parent),
            block,
        )
    };
    widgets
        .create(&widget(
            "child",
            vec![parent_ref(true)],
            &["gc.example.com/hold"],
        ))
        .await
        .unwrap();
    maps.create(&ConfigMap {
        metadata: Some(ObjectMeta {
            owner_references: vec![serde_json::from_value(parent_ref(false)).unwrap()],
            ..meta("of-parent").unwrap()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    widgets
        .delete("parent", &delete_with(PropagationPolicy::Foreground))
        .await
        .unwrap();
    eventually(
        "the child widget to be deleted and its ConfigMap collected",
        || async {
            let child = widgets.get("child").await.unwrap();
            let map_gone = maps.get_opt("of-parent").await.unwrap().is_none();
            (child["metadata"]["deletionTimestamp"].is_string() && map_gone).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting = widgets.get("parent").await.unwrap();
    assert!(
        waiting["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == FOREGROUND_FINALIZER)),
        "the owner waits while a blocking dependent exists: {waiting}"
    );
    let mut child = widgets.get("child").await.unwrap();
    child["metadata"]["finalizers"] = serde_json::json!([]);
    widgets.update(&child).await.unwrap();
    eventually("the child and then its owner to go", || async {
        gone("child")().await && gone("parent")().await
    })
    .await;

    // Orphan: the dependent stays, without the reference.
    let p2 = widgets.create(&widget("p2", vec![], &[])).await.unwrap();
    let p2_ref = owner_ref("gc.example.com/v1", "Widget", "p2", &json_uid(&p2), true);
    widgets
        .create(&widget("c2", vec![p2_ref], &[]))
        .await
        .unwrap();
    widgets
        .delete("p2", &delete_with(PropagationPolicy::Orphan))
        .await
        .unwrap();
    eventually("the orphaning owner to go", gone("p2")).await;
    let c2 = widgets.get("c2").await.unwrap();
    assert!(
        c2["metadata"]["ownerReferences"]
            .as_array()
            .is_none_or(|r| r.is_empty()),
        "the orphan keeps no reference to its owner: {c2}"
    );
    assert_eq!(c2["spec"]["size"], 1, "nothing else of it changed");
}
