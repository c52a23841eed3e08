//! The client against a real API server (in-process, embedded store in a tempdir).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::time::Duration;

use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::{
    Container, Deployment, DeploymentSpec, DeploymentStatus, LabelSelector, Namespace, ObjectMeta,
    Pod, PodSpec, PodTemplateSpec,
};
use skiff_apiserver::ApiServerOptions;
use skiff_client::{Client, ClientError, DeleteParams, ListParams, WatchEvent, WatchStream};
use skiff_testkit::server::TestServer;

async fn server_with(opts: ApiServerOptions) -> TestServer {
    TestServer::start(opts).await
}

async fn server() -> TestServer {
    server_with(ApiServerOptions::default()).await
}

fn meta(name: &str, labels: &[(&str, &str)]) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    })
}

fn pod_spec() -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: "main".into(),
            image: "host".into(),
            command: vec!["sleep".into(), "3600".into()],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn pod(name: &str, labels: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: meta(name, labels),
        spec: Some(pod_spec()),
        ..Default::default()
    }
}

fn deployment(name: &str, replicas: i32) -> Deployment {
    Deployment {
        metadata: meta(name, &[("app", name)]),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: Some(LabelSelector {
                match_labels: [("app".to_string(), name.to_string())].into(),
                ..Default::default()
            }),
            template: Some(PodTemplateSpec {
                metadata: meta("", &[("app", name)]),
                spec: Some(pod_spec()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn next<T>(w: &mut WatchStream<T>) -> WatchEvent<T> {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("watch event in time")
        .expect("watch still open")
        .expect("watch event, not an error")
}

#[tokio::test]
async fn crud_and_error_mapping() {
    let s = server().await;
    let client = Client::connect(&s.handle.endpoint()).await.unwrap();
    let api = client.namespaced::<Deployment>("default");

    let created = api.create(&deployment("web", 2)).await.unwrap();
    assert_eq!(created.kind, "Deployment");
    assert_eq!(created.api_version, "apps/v1");
    assert_eq!(created.namespace(), "default");
    assert!(!created.resource_version().is_empty());
    let uid = created.metadata().unwrap().uid.clone();
    assert!(!uid.is_empty());

    let got = api.get("web").await.unwrap();
    assert_eq!(got, created);
    assert!(api.get_opt("nope").await.unwrap().is_none());

    let err = api.create(&deployment("web", 1)).await.unwrap_err();
    assert!(err.is_already_exists(), "{err:?}");
    assert_eq!(err.to_string(), "deployments.apps \"web\" already exists");

    let err = api.get("nope").await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    assert_eq!(err.to_string(), "deployments.apps \"nope\" not found");

    // Validation errors keep the server's message, which names the field.
    let mut bad = deployment("bad", 1);
    bad.spec.as_mut().unwrap().replicas = Some(-1);
    let err = api.create(&bad).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Invalid { message } if message.contains("spec.replicas")),
        "{err:?}"
    );

    // Update bumps the generation; a stale resourceVersion is a conflict.
    let mut changed = got.clone();
    changed.spec.as_mut().unwrap().replicas = Some(3);
    let updated = api.update(&changed).await.unwrap();
    assert_eq!(updated.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(updated.metadata().unwrap().generation, 2);
    assert_ne!(updated.resource_version(), got.resource_version());
    let err = api.update(&changed).await.unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    assert!(
        err.to_string().contains("the object has been modified"),
        "{err}"
    );

    // The status goes through its own subresource; a spec update keeps it.
    let mut with_status = updated.clone();
    with_status.status = Some(DeploymentStatus {
        replicas: 3,
        ready_replicas: 1,
        ..Default::default()
    });
    let st = api.update_status(&with_status).await.unwrap();
    assert_eq!(st.status.as_ref().unwrap().ready_replicas, 1);
    let mut relabelled = st.clone();
    relabelled.status = None;
    relabelled
        .metadata_mut()
        .labels
        .insert("tier".into(), "front".into());
    let kept = api.update(&relabelled).await.unwrap();
    assert_eq!(kept.status.as_ref().unwrap().ready_replicas, 1);

    // Lists with selectors, across namespaces too.
    api.create(&deployment("api", 1)).await.unwrap();
    let all = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 2);
    assert!(!all.resource_version.is_empty());
    let web = api
        .list(&ListParams::default().labels("tier=front"))
        .await
        .unwrap();
    assert_eq!(
        web.items.iter().map(|d| d.name()).collect::<Vec<_>>(),
        vec!["web"]
    );
    let everywhere = client
        .all::<Deployment>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(everywhere.items.len(), 2);
    let err = api
        .list(&ListParams::default().labels("a in (b"))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Invalid { .. }), "{err:?}");

    // Cluster-scoped types.
    let ns = client.cluster::<Namespace>();
    let names: Vec<String> = ns
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.name().to_string())
        .collect();
    assert!(names.contains(&"default".to_string()), "{names:?}");

    // Delete returns the last state; a precondition on a stale version is a conflict.
    let err = api
        .delete(
            "api",
            &DeleteParams {
                preconditions: Some(skiff_client::Preconditions {
                    resource_version: Some("1".into()),
                    uid: None,
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    let gone = api.delete("web", &DeleteParams::default()).await.unwrap();
    assert_eq!(gone.name(), "web");
    assert!(api.get("web").await.unwrap_err().is_not_found());

    s.handle.shutdown().await;
}

#[tokio::test]
async fn watch_streams_changes() {
    let s = server().await;
    let client = Client::connect(&s.handle.endpoint()).await.unwrap();
    let pods = client.namespaced::<Pod>("default");
    pods.create(&pod("existing", &[("app", "a")]))
        .await
        .unwrap();

    // From "": ADDED for what exists, then changes.
    let mut w = pods.watch(&ListParams::default(), "");
    match next(&mut w).await {
        WatchEvent::Added(p) => assert_eq!(p.name(), "existing"),
        other => panic!("want ADDED existing, got {other:?}"),
    }
    let created = pods.create(&pod("new", &[("app", "b")])).await.unwrap();
    match next(&mut w).await {
        WatchEvent::Added(p) => {
            assert_eq!(p.name(), "new");
            assert_eq!(p.kind, "Pod");
        }
        other => panic!("want ADDED new, got {other:?}"),
    }
    let mut changed = created.clone();
    changed.metadata_mut().labels.insert("x".into(), "y".into());
    let changed = pods.update(&changed).await.unwrap();
    match next(&mut w).await {
        WatchEvent::Modified(p) => assert_eq!(p.resource_version(), changed.resource_version()),
        other => panic!("want MODIFIED, got {other:?}"),
    }
    pods.delete("new", &DeleteParams::default()).await.unwrap();
    match next(&mut w).await {
        WatchEvent::Deleted(p) => {
            assert_eq!(p.name(), "new");
            // The last state.
            assert_eq!(
                p.metadata().unwrap().labels.get("x").map(String::as_str),
                Some("y")
            );
        }
        other => panic!("want DELETED, got {other:?}"),
    }

    // From a list's resourceVersion with a selector: only later, matching changes.
    let list = pods.list(&ListParams::default()).await.unwrap();
    let mut w = pods.watch(
        &ListParams::default().labels("app=c"),
        &list.resource_version,
    );
    pods.create(&pod("other", &[("app", "other")]))
        .await
        .unwrap();
    pods.create(&pod("c1", &[("app", "c")])).await.unwrap();
    match next(&mut w).await {
        WatchEvent::Added(p) => assert_eq!(p.name(), "c1"),
        other => panic!("want ADDED c1, got {other:?}"),
    }

    // Binding a pod shows up as a modification with the node set.
    let bound = pods.bind("c1", "node-1").await.unwrap();
    assert_eq!(bound.spec.as_ref().unwrap().node_name, "node-1");
    match next(&mut w).await {
        WatchEvent::Modified(p) => assert_eq!(p.spec.unwrap().node_name, "node-1"),
        other => panic!("want MODIFIED c1, got {other:?}"),
    }
    s.handle.shutdown().await;
}

#[tokio::test]
async fn too_old_watch_is_expired() {
    let s = server_with(ApiServerOptions {
        watch_cache_capacity: 4,
        ..Default::default()
    })
    .await;
    let client = Client::connect(&s.handle.endpoint()).await.unwrap();
    let pods = client.namespaced::<Pod>("default");
    let first = pods.create(&pod("p0", &[])).await.unwrap();
    for i in 1..20 {
        pods.create(&pod(&format!("p{i}"), &[])).await.unwrap();
    }
    let mut w = pods.watch(&ListParams::default(), first.resource_version());
    let err = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("answer in time")
        .expect("an item")
        .unwrap_err();
    assert!(err.is_expired(), "{err:?}");
    s.handle.shutdown().await;
}

#[tokio::test]
async fn dynamic_api_speaks_json() {
    let s = server().await;
    let client = Client::connect(&s.handle.endpoint()).await.unwrap();
    let kind = skiff_api::find_kind("svc").unwrap();
    let api = client.dynamic(kind, Some("default"));
    let created = api
        .create(&serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
        }))
        .await
        .unwrap();
    assert_eq!(created["metadata"]["namespace"], "default");
    assert_eq!(created["spec"]["type"], "ClusterIP");
    assert_eq!(created["spec"]["ports"][0]["protocol"], "TCP");

    let mut w = api.watch(&ListParams::default(), "");
    match next(&mut w).await {
        WatchEvent::Added(v) => assert_eq!(v["metadata"]["name"], "web"),
        other => panic!("want ADDED, got {other:?}"),
    }
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    // An object that does not fit the kind is refused before anything is sent.
    let err = api
        .create(&serde_json::json!({"metadata": {"name": "x"}, "spec": {"portz": []}}))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Encode(_)), "{err:?}");
    assert!(err.to_string().contains("spec.portz"), "{err}");
    let deleted = api.delete("web", &DeleteParams::default()).await.unwrap();
    assert_eq!(deleted["metadata"]["name"], "web");
    s.handle.shutdown().await;
}

#[tokio::test]
async fn discovery_lists_every_kind() {
    let s = server().await;
    let client = Client::connect(&s.handle.endpoint()).await.unwrap();
    let infos = client.discovery().await.unwrap();
    for plural in ["pods", "deployments", "services", "namespaces", "events"] {
        assert!(infos.iter().any(|i| i.plural == plural), "{plural} missing");
    }
    s.handle.shutdown().await;
}

#[tokio::test]
async fn stopped_server_is_unreachable() {
    let s = server().await;
    let endpoint = s.handle.endpoint();
    let client = Client::connect(&endpoint).await.unwrap();
    s.handle.shutdown().await;
    let err = client
        .namespaced::<Pod>("default")
        .get("x")
        .await
        .unwrap_err();
    assert!(err.is_unreachable(), "{err:?}");
    assert!(err.to_string().starts_with(&format!(
        "cannot reach the Skiff API server at {endpoint}: "
    )));
    let err = Client::connect(&endpoint).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot reach the Skiff API server at {endpoint}: connection refused \
             (is it running? start one with `cargo xtask up`)"
        )
    );
}
