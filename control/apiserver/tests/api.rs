//! The main API suite, over real gRPC, against both store backends (embedded redb in a
//! tempdir and a real etcd).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::collections::BTreeSet;

use common::*;
use skiff_api::Resource;
use skiff_api::api::{
    Binding, Deployment, DeploymentStatus, Namespace, Node, ObjectMeta, ObjectReference, Pod,
    PodSpec, PodStatus, Service, ServicePort, ServiceSpec,
};
use skiff_api::rpc::{BindRequest, DeleteRequest, DiscoveryRequest};
use tonic::Code;

/// Runs each listed `async fn(TestServer)` against a fresh server on each backend.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::common::{Backend, TestServer};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                super::$name(TestServer::start(Backend::Embedded).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn etcd() {
                super::$name(TestServer::start(Backend::Etcd).await).await;
            }
        }
    )*};
}

both_backends!(
    crud_and_selectors,
    concurrent_updates_one_wins,
    status_subresource_and_generation,
    watch_delivers_every_change_in_order,
    watch_filters_and_transitions,
    invalid_objects_are_rejected_and_not_written,
    namespaces_must_exist_and_terminate,
    finalizers_and_graceful_pod_delete,
    generate_name,
    bind_and_double_bind,
);

fn bind_request(pod: &str, node: &str) -> BindRequest {
    let binding = Binding {
        metadata: Some(ObjectMeta {
            name: pod.into(),
            ..Default::default()
        }),
        target: Some(ObjectReference {
            kind: "Node".into(),
            name: node.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    BindRequest {
        namespace: "default".into(),
        binding: prost::Message::encode_to_vec(&binding),
    }
}

async fn crud_and_selectors(s: TestServer) {
    let api = &s.api;
    let created = api
        .create(
            "default",
            &pod("a", "", &[("app", "web"), ("tier", "front")]),
        )
        .await
        .expect("create a");
    let m = created.metadata.as_ref().expect("metadata");
    assert_eq!(m.namespace, "default");
    assert_eq!(m.generation, 1);
    assert_eq!(m.uid.len(), 36);
    assert!(chrono::DateTime::parse_from_rfc3339(&m.creation_timestamp).is_ok());
    assert!(m.resource_version.parse::<i64>().is_ok());
    assert_eq!(created.kind, "Pod");
    assert_eq!(created.api_version, "v1");
    // Defaulting.
    let spec = created.spec.as_ref().expect("spec");
    assert_eq!(spec.restart_policy, "Always");
    assert_eq!(spec.scheduler_name, "default-scheduler");
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(
        created.status.as_ref().map(|s| s.phase.as_str()),
        Some("Pending")
    );

    api.create(
        "default",
        &pod("b", "default", &[("app", "web"), ("tier", "back")]),
    )
    .await
    .expect("create b");
    api.create("default", &pod("c", "", &[("app", "db")]))
        .await
        .expect("create c");
    api.create("kube-system", &pod("d", "", &[]))
        .await
        .expect("create d");

    let got: Pod = api.get("default", "a").await.expect("get");
    assert_eq!(got, created);
    assert_status(
        api.get::<Pod>("default", "zzz").await,
        Code::NotFound,
        "NotFound",
        &["pods \"zzz\" not found"],
    );
    assert_status(
        api.create("default", &pod("a", "", &[])).await,
        Code::AlreadyExists,
        "AlreadyExists",
        &["pods \"a\" already exists"],
    );

    // Label selectors.
    for (sel, want) in [
        ("", vec!["a", "b", "c"]),
        ("app=web", vec!["a", "b"]),
        ("app==web", vec!["a", "b"]),
        ("app!=web", vec!["c"]),
        ("tier in (front,back)", vec!["a", "b"]),
        ("app notin (web)", vec!["c"]),
        ("tier", vec!["a", "b"]),
        ("!tier", vec!["c"]),
        ("app=web,tier!=front", vec!["b"]),
    ] {
        assert_eq!(api.names::<Pod>("default", sel, "").await, want, "{sel}");
    }
    // Every namespace.
    assert_eq!(api.names::<Pod>("", "", "").await, vec!["a", "b", "c", "d"]);

    // Field selectors.
    let mut bound = pod("e", "", &[]);
    if let Some(spec) = bound.spec.as_mut() {
        spec.node_name = "node-1".into();
    }
    api.create("default", &bound).await.expect("create e");
    let mut running: Pod = api.get("default", "c").await.expect("get c");
    running.status = Some(PodStatus {
        phase: "Running".into(),
        ..Default::default()
    });
    api.update(&running, "status").await.expect("status update");
    for (ns, sel, want) in [
        ("", "metadata.name=a", vec!["a"]),
        ("", "metadata.namespace=kube-system", vec!["d"]),
        (
            "",
            "metadata.namespace!=kube-system",
            vec!["a", "b", "c", "e"],
        ),
        ("default", "spec.nodeName=node-1", vec!["e"]),
        ("default", "spec.nodeName=", vec!["a", "b", "c"]),
        ("default", "status.phase=Running", vec!["c"]),
        (
            "default",
            "status.phase!=Running,metadata.name!=a",
            vec!["b", "e"],
        ),
    ] {
        assert_eq!(api.names::<Pod>(ns, "", sel).await, want, "{sel}");
    }
    assert_eq!(
        api.names::<Pod>("default", "app=web", "metadata.name=b")
            .await,
        vec!["b"]
    );
    assert_status(
        api.list::<Deployment>("", "", "spec.nodeName=x").await,
        Code::InvalidArgument,
        "BadRequest",
        &["spec.nodeName"],
    );
    assert_status(
        api.list::<Pod>("", "app in (", "").await,
        Code::InvalidArgument,
        "BadRequest",
        &["app in ("],
    );
    let (_, rv) = api.list::<Pod>("", "", "").await.expect("list");
    assert!(rv.parse::<i64>().expect("numeric rv") >= 1);

    // Cluster-scoped resources and discovery.
    let node = Node {
        metadata: meta("node-1", "", &[("zone", "a")]),
        ..Default::default()
    };
    api.create("", &node).await.expect("create node");
    assert_eq!(api.names::<Node>("", "zone=a", "").await, vec!["node-1"]);
    let nss = api.names::<Namespace>("", "", "").await;
    assert_eq!(nss, vec!["default", "kube-node-lease", "kube-system"]);
    let d = s
        .api
        .client
        .clone()
        .discovery(DiscoveryRequest {})
        .await
        .expect("discovery")
        .into_inner();
    let plurals: Vec<&str> = d.resources.iter().map(|r| r.plural.as_str()).collect();
    assert_eq!(
        plurals,
        vec![
            "namespaces",
            "nodes",
            "pods",
            "services",
            "endpoints",
            "configmaps",
            "secrets",
            "serviceaccounts",
            "events",
            "replicasets",
            "deployments",
            "daemonsets",
            "statefulsets",
            "poddisruptionbudgets",
            "jobs",
            "cronjobs",
            "horizontalpodautoscalers",
            "networkpolicies",
            "persistentvolumes",
            "persistentvolumeclaims",
            "storageclasses",
            "leases",
            "roles",
            "clusterroles",
            "rolebindings",
            "clusterrolebindings",
            "certificatesigningrequests",
            "loadbalancerippools",
            "customresourcedefinitions",
            "validatingwebhookconfigurations",
            "mutatingwebhookconfigurations",
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
            "replicationcontrollers",
            "apiservices"
        ]
    );

    // Delete of an unbound pod is immediate; the last state comes back.
    let gone: Pod = api.delete("default", "b").await.expect("delete");
    assert_eq!(gone.name(), "b");
    assert_status(
        api.get::<Pod>("default", "b").await,
        Code::NotFound,
        "NotFound",
        &[],
    );
    assert_status(
        api.delete::<Pod>("default", "b").await,
        Code::NotFound,
        "NotFound",
        &[],
    );
    s.handle.shutdown().await;
}

async fn concurrent_updates_one_wins(s: TestServer) {
    let api = &s.api;
    let d = api
        .create("default", &deployment("web", "default", 1))
        .await
        .expect("create");
    for round in 0..5 {
        let current: Deployment = api.get("default", "web").await.expect("get");
        let mut a = current.clone();
        let mut b = current.clone();
        if let Some(spec) = a.spec.as_mut() {
            spec.replicas = Some(10 + round);
        }
        if let Some(spec) = b.spec.as_mut() {
            spec.replicas = Some(20 + round);
        }
        let (ra, rb) = tokio::join!(api.update(&a, ""), api.update(&b, ""));
        let (winner, loser) = match (ra, rb) {
            (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w, l),
            (ra, rb) => panic!("expected exactly one winner: {ra:?} / {rb:?}"),
        };
        assert_status::<()>(
            Err(loser),
            Code::Aborted,
            "Conflict",
            &[
                "Operation cannot be fulfilled on deployments.apps \"web\": the object has been \
                 modified; please apply your changes to the latest version and try again",
            ],
        );
        let stored: Deployment = api.get("default", "web").await.expect("get");
        assert_eq!(stored, winner);
    }
    // A stale resourceVersion also loses when not concurrent.
    assert_status(
        api.update(&d, "").await,
        Code::Aborted,
        "Conflict",
        &["modified"],
    );
    s.handle.shutdown().await;
}

async fn status_subresource_and_generation(s: TestServer) {
    let api = &s.api;
    let created = api
        .create("default", &deployment("web", "default", 1))
        .await
        .expect("create");
    assert_eq!(created.metadata.as_ref().map(|m| m.generation), Some(1));
    let spec = created.spec.as_ref().expect("spec");
    assert_eq!(spec.revision_history_limit, Some(10));
    let strategy = spec.strategy.as_ref().expect("strategy");
    assert_eq!(strategy.r#type, "RollingUpdate");

    // Metadata-only change: allowed, generation unchanged.
    let mut labelled = created.clone();
    labelled
        .metadata_mut()
        .labels
        .insert("team".into(), "a".into());
    let labelled = api.update(&labelled, "").await.expect("label update");
    assert_eq!(labelled.metadata.as_ref().map(|m| m.generation), Some(1));
    assert_eq!(
        labelled
            .metadata
            .as_ref()
            .map(|m| m.labels["team"].as_str()),
        Some("a")
    );
    assert_ne!(labelled.resource_version(), created.resource_version());

    // Spec change bumps generation; the status sent with it is ignored.
    let mut scaled = labelled.clone();
    if let Some(spec) = scaled.spec.as_mut() {
        spec.replicas = Some(3);
    }
    scaled.status = Some(DeploymentStatus {
        replicas: 99,
        ..Default::default()
    });
    let scaled = api.update(&scaled, "").await.expect("spec update");
    assert_eq!(scaled.metadata.as_ref().map(|m| m.generation), Some(2));
    assert_eq!(scaled.spec.as_ref().and_then(|s| s.replicas), Some(3));
    assert_eq!(scaled.status, None);
    // uid and creationTimestamp cannot be changed through an update.
    let mut forged = scaled.clone();
    forged.metadata_mut().creation_timestamp = "2000-01-01T00:00:00Z".into();
    let kept = api.update(&forged, "").await.expect("update");
    assert_eq!(
        kept.metadata.as_ref().map(|m| m.creation_timestamp.clone()),
        created
            .metadata
            .as_ref()
            .map(|m| m.creation_timestamp.clone())
    );

    // Status update: only the status changes, generation stays.
    let mut status = kept.clone();
    status.status = Some(DeploymentStatus {
        replicas: 3,
        observed_generation: 2,
        ..Default::default()
    });
    if let Some(spec) = status.spec.as_mut() {
        spec.replicas = Some(7);
    }
    let after = api.update(&status, "status").await.expect("status update");
    assert_eq!(after.status.as_ref().map(|s| s.replicas), Some(3));
    assert_eq!(after.spec.as_ref().and_then(|s| s.replicas), Some(3));
    assert_eq!(after.metadata.as_ref().map(|m| m.generation), Some(2));
    let stored: Deployment = api.get("default", "web").await.expect("get");
    assert_eq!(stored, after);

    // An update needs a resourceVersion.
    let mut no_rv = after.clone();
    no_rv.metadata_mut().resource_version.clear();
    assert_status(
        api.update(&no_rv, "").await,
        Code::InvalidArgument,
        "Invalid",
        &["metadata.resourceVersion: must be specified for an update"],
    );
    // Immutable selector.
    let mut moved = after.clone();
    if let Some(spec) = moved.spec.as_mut()
        && let Some(sel) = spec.selector.as_mut()
    {
        sel.match_labels.insert("x".into(), "y".into());
    }
    assert_status(
        api.update(&moved, "").await,
        Code::InvalidArgument,
        "Invalid",
        &["spec.selector", "field is immutable"],
    );
    // Unknown subresource; types without status have no status subresource.
    assert_status(
        api.update(&after, "scale").await,
        Code::InvalidArgument,
        "BadRequest",
        &["scale"],
    );
    s.handle.shutdown().await;
}

async fn watch_delivers_every_change_in_order(s: TestServer) {
    let api = s.api.clone();
    api.create("default", &pod("before", "", &[]))
        .await
        .expect("create");
    let (_, rv) = api.list::<Pod>("", "", "").await.expect("list");
    let mut watch = api.watch::<Pod>("", "", "", &rv).await.expect("watch");

    // 1,000 rapid writes from 8 concurrent writers: creates, then updates of each object.
    const N: usize = 1000;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            for i in (w..N / 2).step_by(8) {
                let p = api
                    .create("default", &pod(&format!("p{i}"), "", &[]))
                    .await
                    .expect("create");
                revisions.push(p.resource_version().parse::<i64>().expect("rv"));
                let mut changed = p.clone();
                changed
                    .metadata_mut()
                    .labels
                    .insert("n".into(), i.to_string());
                let p = api.update(&changed, "").await.expect("update");
                revisions.push(p.resource_version().parse::<i64>().expect("rv"));
            }
            revisions
        }));
    }
    let mut written = BTreeSet::new();
    for t in tasks {
        written.extend(t.await.expect("writer"));
    }
    assert_eq!(written.len(), N);

    let mut seen = Vec::new();
    let (mut added, mut modified) = (0, 0);
    while seen.len() < N {
        let ev = next_event(&mut watch, 20).await.expect("event");
        let obj: Pod = decode(&ev.object);
        assert_eq!(obj.resource_version(), ev.resource_version);
        match ev.r#type.as_str() {
            "ADDED" => added += 1,
            "MODIFIED" => {
                modified += 1;
                assert!(
                    obj.metadata
                        .as_ref()
                        .is_some_and(|m| m.labels.contains_key("n"))
                );
            }
            other => panic!("unexpected {other}"),
        }
        seen.push(ev.resource_version.parse::<i64>().expect("rv"));
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "events out of order");
    assert_eq!(
        seen.iter().copied().collect::<BTreeSet<_>>(),
        written,
        "gap or extra event"
    );
    assert_eq!((added, modified), (N / 2, N / 2));
    assert_quiet(&mut watch, 200).await;

    // A second watch from the middle gets exactly the suffix.
    let mid = seen[N / 2 - 1];
    let mut suffix = api
        .watch::<Pod>("default", "", "", &mid.to_string())
        .await
        .expect("watch from middle");
    for want in &seen[N / 2..] {
        let ev = next_event(&mut suffix, 20).await.expect("event");
        assert_eq!(ev.resource_version, want.to_string());
    }
    assert_quiet(&mut suffix, 200).await;

    // Deletes carry the last state with the delete revision.
    let deleted: Pod = api.delete("default", "p0").await.expect("delete");
    let ev = next_event(&mut watch, 10).await.expect("event");
    assert_eq!(ev.r#type, "DELETED");
    assert_eq!(ev.resource_version, deleted.resource_version());
    let last: Pod = decode(&ev.object);
    assert_eq!(last.name(), "p0");
    assert_eq!(last.resource_version(), deleted.resource_version());

    // From "0": a synthetic ADDED for every current object, then live events.
    let mut fresh = api
        .watch::<Pod>("default", "", "", "0")
        .await
        .expect("watch 0");
    let mut names = BTreeSet::new();
    for _ in 0..N / 2 {
        let ev = next_event(&mut fresh, 10).await.expect("event");
        assert_eq!(ev.r#type, "ADDED");
        names.insert(decode::<Pod>(&ev.object).name().to_string());
    }
    assert_eq!(names.len(), N / 2);
    assert!(names.contains("before") && !names.contains("p0"));
    assert_quiet(&mut fresh, 200).await;
    api.create("default", &pod("late", "", &[]))
        .await
        .expect("create");
    let ev = next_event(&mut fresh, 10).await.expect("event");
    assert_eq!(
        (ev.r#type.as_str(), decode::<Pod>(&ev.object).name()),
        ("ADDED", "late")
    );
    s.handle.shutdown().await;
}

async fn watch_filters_and_transitions(s: TestServer) {
    let api = &s.api;
    let mut web = api
        .watch::<Pod>("default", "app=web", "", "")
        .await
        .expect("watch");
    let mut on_node = api
        .watch::<Pod>("", "", "spec.nodeName=n1", "")
        .await
        .expect("watch");
    let mut other_ns = api
        .watch::<Pod>("kube-system", "", "", "")
        .await
        .expect("watch");

    let p = api
        .create("default", &pod("a", "", &[("app", "web")]))
        .await
        .expect("create");
    let ev = next_event(&mut web, 5).await.expect("event");
    assert_eq!(ev.r#type, "ADDED");
    // Stops matching: DELETED with the previous state.
    let mut db = p.clone();
    db.metadata_mut().labels.insert("app".into(), "db".into());
    let db = api.update(&db, "").await.expect("update");
    let ev = next_event(&mut web, 5).await.expect("event");
    assert_eq!(ev.r#type, "DELETED");
    assert_eq!(ev.resource_version, db.resource_version());
    let last: Pod = decode(&ev.object);
    assert_eq!(
        last.metadata.as_ref().map(|m| m.labels["app"].as_str()),
        Some("web")
    );
    // Starts matching again: ADDED.
    let mut back = db.clone();
    back.metadata_mut()
        .labels
        .insert("app".into(), "web".into());
    let back = api.update(&back, "").await.expect("update");
    let ev = next_event(&mut web, 5).await.expect("event");
    assert_eq!(
        (ev.r#type.as_str(), ev.resource_version.as_str()),
        ("ADDED", back.resource_version())
    );
    // Binding makes it match spec.nodeName=n1.
    let mut client = api.client.clone();
    client.bind(bind_request("a", "n1")).await.expect("bind");
    let ev = next_event(&mut web, 5).await.expect("event");
    assert_eq!(ev.r#type, "MODIFIED");
    let ev = next_event(&mut on_node, 5).await.expect("event");
    assert_eq!(ev.r#type, "ADDED");
    assert_eq!(
        decode::<Pod>(&ev.object).spec.map(|s| s.node_name),
        Some("n1".to_string())
    );
    // Nothing reached the other namespace's watch.
    assert_quiet(&mut other_ns, 200).await;
    // Unsupported field selectors and bad versions are refused up front.
    assert_status(
        api.watch::<Service>("", "", "spec.nodeName=x", "").await,
        Code::InvalidArgument,
        "BadRequest",
        &["spec.nodeName"],
    );
    assert_status(
        api.watch::<Pod>("", "", "", "abc").await,
        Code::InvalidArgument,
        "BadRequest",
        &[],
    );
    s.handle.shutdown().await;
}

async fn invalid_objects_are_rejected_and_not_written(s: TestServer) {
    let api = &s.api;
    let (before_pods, _) = api.list::<Pod>("", "", "").await.expect("list");
    let (before_deps, _) = api.list::<Deployment>("", "", "").await.expect("list");

    assert_status(
        api.create("default", &pod("", "", &[])).await,
        Code::InvalidArgument,
        "Invalid",
        &["metadata.name: Required value"],
    );
    assert_status(
        api.create("default", &pod("ok", "", &[("bad key!", "v")]))
            .await,
        Code::InvalidArgument,
        "Invalid",
        &[
            "Pod \"ok\" is invalid",
            "metadata.labels: Invalid value: \"bad key!\"",
        ],
    );
    assert_status(
        api.create("default", &pod("Bad_Name", "", &[])).await,
        Code::InvalidArgument,
        "Invalid",
        &["metadata.name: Invalid value: \"Bad_Name\""],
    );
    assert_status(
        api.create("default", &deployment("web", "", -1)).await,
        Code::InvalidArgument,
        "Invalid",
        &[
            "Deployment.apps \"web\" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0",
        ],
    );
    let mut wrong_kind = pod("p", "", &[]);
    wrong_kind.api_version = "apps/v1".into();
    wrong_kind.kind = "Deployment".into();
    assert_status(
        api.create("default", &wrong_kind).await,
        Code::InvalidArgument,
        "Invalid",
        &[
            "apiVersion: Invalid value: \"apps/v1\"",
            "kind: Invalid value: \"Deployment\"",
        ],
    );
    let mut no_containers = pod("p", "", &[]);
    no_containers.spec = Some(PodSpec::default());
    assert_status(
        api.create("default", &no_containers).await,
        Code::InvalidArgument,
        "Invalid",
        &["spec.containers: Required value"],
    );
    let svc = Service {
        metadata: meta("svc", "", &[]),
        spec: Some(ServiceSpec {
            ports: vec![ServicePort {
                port: 70000,
                ..Default::default()
            }],
            r#type: "Bogus".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_status(
        api.create("default", &svc).await,
        Code::InvalidArgument,
        "Invalid",
        &[
            "spec.type: Unsupported value: \"Bogus\"",
            "spec.ports[0].port: Invalid value: 70000",
        ],
    );
    // Namespace mismatch between request and object.
    assert_status(
        api.create("kube-system", &pod("p", "default", &[])).await,
        Code::InvalidArgument,
        "BadRequest",
        &["does not match"],
    );
    // Nothing was written.
    let (after_pods, _) = api.list::<Pod>("", "", "").await.expect("list");
    let (after_deps, _) = api.list::<Deployment>("", "", "").await.expect("list");
    assert_eq!(after_pods, before_pods);
    assert_eq!(after_deps, before_deps);
    assert!(after_pods.is_empty() && after_deps.is_empty());

    // A failed update leaves the object unchanged.
    let d = api
        .create("default", &deployment("web", "", 1))
        .await
        .expect("create");
    let mut bad = d.clone();
    if let Some(spec) = bad.spec.as_mut() {
        spec.replicas = Some(-5);
    }
    assert_status(
        api.update(&bad, "").await,
        Code::InvalidArgument,
        "Invalid",
        &["spec.replicas"],
    );
    let stored: Deployment = api.get("default", "web").await.expect("get");
    assert_eq!(stored, d);
    s.handle.shutdown().await;
}

async fn namespaces_must_exist_and_terminate(s: TestServer) {
    let api = &s.api;
    assert_status(
        api.create("nope", &pod("p", "", &[])).await,
        Code::FailedPrecondition,
        "NotFound",
        &["namespaces \"nope\" not found"],
    );
    assert_status(
        api.create("", &pod("p", "", &[])).await,
        Code::InvalidArgument,
        "Invalid",
        &["metadata.namespace: Required value"],
    );
    let ns = Namespace {
        metadata: meta("team", "", &[]),
        ..Default::default()
    };
    let ns = api.create("", &ns).await.expect("create namespace");
    assert_eq!(ns.status.as_ref().map(|s| s.phase.as_str()), Some("Active"));
    let bad_ns = Namespace {
        metadata: meta("a.b", "", &[]),
        ..Default::default()
    };
    assert_status(
        api.create("", &bad_ns).await,
        Code::InvalidArgument,
        "Invalid",
        &["metadata.name"],
    );
    api.create("team", &pod("p", "", &[]))
        .await
        .expect("create pod");

    // Not empty: Terminating, kept.
    let terminating: Namespace = api.delete("", "team").await.expect("delete");
    assert_eq!(
        terminating.status.as_ref().map(|s| s.phase.as_str()),
        Some("Terminating")
    );
    assert!(
        terminating
            .metadata
            .as_ref()
            .is_some_and(|m| !m.deletion_timestamp.is_empty())
    );
    let stored: Namespace = api.get("", "team").await.expect("still there");
    assert_eq!(
        stored.status.as_ref().map(|s| s.phase.as_str()),
        Some("Terminating")
    );
    assert_status(
        api.create("team", &pod("q", "", &[])).await,
        Code::FailedPrecondition,
        "Forbidden",
        &["being terminated"],
    );
    // Empty: deleted.
    api.delete::<Pod>("team", "p").await.expect("delete pod");
    api.delete::<Namespace>("", "team")
        .await
        .expect("delete namespace");
    assert_status(
        api.get::<Namespace>("", "team").await,
        Code::NotFound,
        "NotFound",
        &[],
    );

    // A finalizer removed from a terminating namespace that still has content does not
    // delete it.
    let mut fin = Namespace {
        metadata: meta("fin", "", &[]),
        ..Default::default()
    };
    fin.metadata_mut().finalizers = vec!["example.com/x".into()];
    api.create("", &fin).await.expect("create namespace");
    api.create("fin", &pod("p", "", &[]))
        .await
        .expect("create pod");
    let mut fin: Namespace = api.delete("", "fin").await.expect("delete");
    fin.metadata_mut().finalizers.clear();
    let fin = api.update(&fin, "").await.expect("remove finalizer");
    assert_eq!(
        fin.status.as_ref().map(|s| s.phase.as_str()),
        Some("Terminating")
    );
    assert!(api.get::<Namespace>("", "fin").await.is_ok());
    api.delete::<Pod>("fin", "p").await.expect("delete pod");
    api.delete::<Namespace>("", "fin")
        .await
        .expect("delete namespace");
    assert_status(
        api.get::<Namespace>("", "fin").await,
        Code::NotFound,
        "NotFound",
        &[],
    );
    s.handle.shutdown().await;
}

async fn finalizers_and_graceful_pod_delete(s: TestServer) {
    let api = &s.api;
    // Finalizers keep an object until they are removed.
    let mut held = deployment("held", "", 1);
    held.metadata_mut().finalizers = vec!["example.com/hold".into()];
    let held = api.create("default", &held).await.expect("create");
    let marked: Deployment = api.delete("default", "held").await.expect("delete");
    let m = marked.metadata.as_ref().expect("meta");
    assert!(!m.deletion_timestamp.is_empty());
    assert_eq!(m.deletion_grace_period_seconds, Some(0));
    assert_ne!(marked.resource_version(), held.resource_version());
    let stored: Deployment = api.get("default", "held").await.expect("still there");
    assert_eq!(stored, marked);
    // No new finalizers on an object being deleted.
    let mut more = stored.clone();
    more.metadata_mut()
        .finalizers
        .push("example.com/other".into());
    assert_status(
        api.update(&more, "").await,
        Code::InvalidArgument,
        "Invalid",
        &["metadata.finalizers"],
    );
    // Removing the last finalizer deletes it.
    let mut released = stored.clone();
    released.metadata_mut().finalizers.clear();
    api.update(&released, "").await.expect("remove finalizer");
    assert_status(
        api.get::<Deployment>("default", "held").await,
        Code::NotFound,
        "NotFound",
        &[],
    );

    // Propagation policies add the garbage collector's finalizers.
    api.create("default", &deployment("fg", "", 1))
        .await
        .expect("create");
    let fg: Deployment = api
        .delete_with(DeleteRequest {
            namespace: "default".into(),
            name: "fg".into(),
            propagation_policy: "Foreground".into(),
            ..Default::default()
        })
        .await
        .expect("delete");
    assert_eq!(
        fg.metadata.as_ref().map(|m| m.finalizers.clone()),
        Some(vec!["foregroundDeletion".to_string()])
    );
    assert_status(
        api.delete_with::<Deployment>(DeleteRequest {
            namespace: "default".into(),
            name: "fg".into(),
            propagation_policy: "Sideways".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "BadRequest",
        &["Sideways"],
    );

    // Preconditions.
    let p = api
        .create("default", &pod("pre", "", &[]))
        .await
        .expect("create");
    assert_status(
        api.delete_with::<Pod>(DeleteRequest {
            namespace: "default".into(),
            name: "pre".into(),
            precondition_uid: "other".into(),
            ..Default::default()
        })
        .await,
        Code::Aborted,
        "Conflict",
        &["Precondition failed: UID"],
    );
    assert_status(
        api.delete_with::<Pod>(DeleteRequest {
            namespace: "default".into(),
            name: "pre".into(),
            precondition_resource_version: "1".into(),
            ..Default::default()
        })
        .await,
        Code::Aborted,
        "Conflict",
        &["Precondition failed: ResourceVersion"],
    );
    // Unbound pods go at once.
    api.delete_with::<Pod>(DeleteRequest {
        namespace: "default".into(),
        name: "pre".into(),
        precondition_uid: p
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default(),
        precondition_resource_version: p.resource_version().into(),
        ..Default::default()
    })
    .await
    .expect("delete unbound pod");
    assert_status(
        api.get::<Pod>("default", "pre").await,
        Code::NotFound,
        "NotFound",
        &[],
    );

    // Bound pods are deleted gracefully: marked, then removed by a grace-0 delete.
    let mut bound = pod("bound", "", &[]);
    if let Some(spec) = bound.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(45);
    }
    api.create("default", &bound).await.expect("create");
    api.client
        .clone()
        .bind(bind_request("bound", "n1"))
        .await
        .expect("bind");
    let marked: Pod = api
        .delete("default", "bound")
        .await
        .expect("graceful delete");
    let m = marked.metadata.as_ref().expect("meta");
    assert!(!m.deletion_timestamp.is_empty());
    assert_eq!(m.deletion_grace_period_seconds, Some(45));
    // A repeated delete changes nothing; a shorter grace period shortens it.
    let again: Pod = api.delete("default", "bound").await.expect("delete again");
    assert_eq!(again, marked);
    let shorter: Pod = api
        .delete_with(DeleteRequest {
            namespace: "default".into(),
            name: "bound".into(),
            grace_period_seconds: Some(10),
            ..Default::default()
        })
        .await
        .expect("shorter");
    assert_eq!(
        shorter
            .metadata
            .as_ref()
            .and_then(|m| m.deletion_grace_period_seconds),
        Some(10)
    );
    // The node agent may still update status while the pod terminates.
    let mut status = shorter.clone();
    status.status.get_or_insert_with(Default::default).phase = "Running".into();
    api.update(&status, "status")
        .await
        .expect("status update while terminating");
    assert!(api.get::<Pod>("default", "bound").await.is_ok());
    let final_state: Pod = api
        .delete_with(DeleteRequest {
            namespace: "default".into(),
            name: "bound".into(),
            grace_period_seconds: Some(0),
            ..Default::default()
        })
        .await
        .expect("grace-0 delete");
    assert_eq!(final_state.name(), "bound");
    assert_status(
        api.get::<Pod>("default", "bound").await,
        Code::NotFound,
        "NotFound",
        &[],
    );
    s.handle.shutdown().await;
}

async fn generate_name(s: TestServer) {
    let api = &s.api;
    let mut names = BTreeSet::new();
    for _ in 0..5 {
        let mut p = pod("", "", &[]);
        p.metadata_mut().generate_name = "web-".into();
        let created = api.create("default", &p).await.expect("create");
        let name = created.name().to_string();
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
        assert!(
            name[4..]
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        names.insert(name);
    }
    assert_eq!(names.len(), 5);
    let mut bad = pod("", "", &[]);
    bad.metadata_mut().generate_name = "Web_".into();
    assert_status(
        api.create("default", &bad).await,
        Code::InvalidArgument,
        "Invalid",
        &["metadata.generateName"],
    );
    s.handle.shutdown().await;
}

async fn bind_and_double_bind(s: TestServer) {
    let api = &s.api;
    let mut client = api.client.clone();
    api.create("default", &pod("p", "", &[]))
        .await
        .expect("create");
    let before: Pod = api.get("default", "p").await.expect("get");
    let r = client
        .bind(bind_request("p", "node-1"))
        .await
        .expect("bind")
        .into_inner();
    let bound: Pod = decode(&r.object);
    assert_eq!(
        bound.spec.as_ref().map(|s| s.node_name.as_str()),
        Some("node-1")
    );
    let cond = bound
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == "PodScheduled"))
        .expect("PodScheduled");
    assert_eq!(cond.status, "True");
    // Generation bumps (spec.nodeName changed), the status was kept.
    assert_eq!(bound.metadata.as_ref().map(|m| m.generation), Some(2));
    assert_eq!(
        bound.status.as_ref().map(|s| s.phase.as_str()),
        Some("Pending")
    );
    assert_ne!(bound.resource_version(), before.resource_version());

    assert_status(
        client.bind(bind_request("p", "node-2")).await,
        Code::Aborted,
        "Conflict",
        &["pod p is already assigned to node \"node-1\""],
    );
    assert_status(
        client.bind(bind_request("nope", "node-1")).await,
        Code::NotFound,
        "NotFound",
        &[],
    );
    assert_status(
        client.bind(bind_request("p", "")).await,
        Code::InvalidArgument,
        "Invalid",
        &["target.name: Required value"],
    );
    // nodeName cannot be changed by an update.
    let mut moved = bound.clone();
    if let Some(spec) = moved.spec.as_mut() {
        spec.node_name = "node-2".into();
    }
    assert_status(
        api.update(&moved, "").await,
        Code::InvalidArgument,
        "Invalid",
        &["spec.nodeName"],
    );

    // Concurrent binds of one pod: exactly one wins.
    api.create("default", &pod("race", "", &[]))
        .await
        .expect("create");
    let (mut c1, mut c2) = (client.clone(), client.clone());
    let (a, b) = tokio::join!(
        c1.bind(bind_request("race", "n-a")),
        c2.bind(bind_request("race", "n-b"))
    );
    assert_eq!(u8::from(a.is_ok()) + u8::from(b.is_ok()), 1, "{a:?} {b:?}");
    assert_eq!(
        api.names::<Pod>("default", "", "spec.nodeName=node-1")
            .await,
        vec!["p"]
    );
    s.handle.shutdown().await;
}
