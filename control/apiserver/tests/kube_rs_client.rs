//! A second real client written by others: kube-rs (`kube` 4 with `k8s-openapi` for
//! Kubernetes 1.32) against Skiff's REST API on a real etcd, over plain HTTP on loopback. `Api` creates,
//! gets, lists (label and field selectors, `limit`/`continue` pages), patches (merge,
//! strategic, JSON), replaces and deletes; its errors are checked as kube decodes them
//! (`Error::Api` with code and reason); `kube::runtime::watcher` and a small
//! `kube::runtime::Controller` run against the real watch.
//!
//! The watcher is checked with list-watch and streaming lists, and delivers every change
//! exactly once, in order, from one of two API servers over one etcd while the other stops
//! and etcd compacts. Status and scale subresources, metadata-only calls, deletecollection
//! and discovery are covered too.
//!
//! Leases (`coordination.k8s.io/v1`, a plain namespaced object without status) are the
//! simple kind; Deployments are the typed kind with a strategic-merge container list.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config, ResourceExt};
use serde_json::json;
use skiff_apiserver::{ApiServerOptions, ServerHandle};
use skiff_store::testutil::EtcdServer;
use skiff_store::{EtcdStore, Store};

/// How long any single wait in these tests may take.
const WAIT: Duration = Duration::from_secs(20);

/// A real API server on a throwaway etcd, and a kube-rs client of it.
struct Server {
    client: Client,
    _handle: ServerHandle,
    _etcd: EtcdServer,
}

async fn start() -> Server {
    let etcd = EtcdServer::start().expect("starting etcd");
    let store = EtcdStore::connect(&etcd.endpoints())
        .await
        .expect("connecting to etcd");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let handle = skiff_apiserver::spawn(Arc::new(store), listener, ApiServerOptions::default())
        .await
        .expect("starting the API server");
    // Only the endpoint: no kubeconfig, no TLS, no credentials.
    let mut config = Config::new(handle.endpoint().parse().unwrap());
    config.default_namespace = "default".into();
    config.read_timeout = Some(WAIT);
    let client = Client::try_from(config).expect("kube client");
    Server {
        client,
        _handle: handle,
        _etcd: etcd,
    }
}

/// `fut`, failing the test after [`WAIT`].
async fn bounded<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result within {WAIT:?}"))
}

/// Polls `check` until it gives `Some`, for at most [`WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    bounded(what, async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn lease(name: &str, holder: &str, label_pairs: &[(&str, &str)]) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels(label_pairs)),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    }
}

fn container(name: &str, image: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(image.into()),
        command: Some(vec!["sleep".into(), "3600".into()]),
        ..Default::default()
    }
}

fn deployment(name: &str, containers: Vec<Container>) -> Deployment {
    let app = labels(&[("app", name)]);
    Deployment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(app.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(app),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers,
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn create_namespace(client: &Client, name: &str) -> Namespace {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace")
}

/// The `Status` kube decoded from a failed request.
#[track_caller]
fn api_error<T: std::fmt::Debug>(r: kube::Result<T>) -> Box<kube::core::Status> {
    match r {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected kube::Error::Api, got {other:?}"),
    }
}

fn sorted_names<K: ResourceExt>(items: &[K]) -> Vec<String> {
    let mut names: Vec<String> = items.iter().map(ResourceExt::name_any).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_list_with_selectors_and_pages() {
    let s = start().await;
    let ns = create_namespace(&s.client, "kube-rs").await;
    assert_eq!(ns.name_any(), "kube-rs");
    assert!(ns.uid().is_some(), "{ns:?}");
    assert!(ns.creation_timestamp().is_some(), "{ns:?}");
    let fetched = Api::<Namespace>::all(s.client.clone())
        .get("kube-rs")
        .await
        .unwrap();
    assert_eq!(fetched.uid(), ns.uid());

    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "kube-rs");
    for i in 0..7 {
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        let created = leases
            .create(
                &PostParams::default(),
                &lease(&format!("l{i}"), &format!("holder-{i}"), &[("tier", tier)]),
            )
            .await
            .unwrap();
        assert_eq!(created.namespace().as_deref(), Some("kube-rs"));
        assert!(created.resource_version().is_some());
    }
    let got = leases.get("l3").await.unwrap();
    assert_eq!(
        got.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("holder-3")
    );
    assert_eq!(got.labels().get("tier").map(String::as_str), Some("odd"));
    assert_eq!(leases.get_opt("nope").await.unwrap(), None);

    // Label selectors: equality, set-based, and none.
    let odd = leases
        .list(&ListParams::default().labels("tier=odd"))
        .await
        .unwrap();
    assert_eq!(sorted_names(&odd.items), ["l1", "l3", "l5"]);
    let both = leases
        .list(&ListParams::default().labels("tier in (odd,even),tier!=even"))
        .await
        .unwrap();
    assert_eq!(sorted_names(&both.items), ["l1", "l3", "l5"]);
    assert!(odd.metadata.resource_version.is_some());
    // Field selector on metadata.name (what kubectl wait and rollout status use).
    let one = leases
        .list(&ListParams::default().fields("metadata.name=l4"))
        .await
        .unwrap();
    assert_eq!(sorted_names(&one.items), ["l4"]);
    let not_one = leases
        .list(
            &ListParams::default()
                .fields("metadata.name!=l4")
                .labels("tier=even"),
        )
        .await
        .unwrap();
    assert_eq!(sorted_names(&not_one.items), ["l0", "l2", "l6"]);

    // Pages of 3 with continue tokens: every object once, the same list revision.
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(3);
    let mut pages = 0;
    let mut revision = None;
    loop {
        let page = leases.list(&lp).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 3);
        seen.extend(page.items.iter().map(ResourceExt::name_any));
        match revision {
            None => revision = page.metadata.resource_version.clone(),
            Some(ref rv) => assert_eq!(page.metadata.resource_version.as_ref(), Some(rv)),
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => {
                assert!(page.metadata.remaining_item_count.unwrap_or(0) > 0);
                lp = lp.continue_token(&token);
            }
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, ["l0", "l1", "l2", "l3", "l4", "l5", "l6"]);
    // The whole list of all namespaces has the same objects.
    let all: Api<Lease> = Api::all(s.client.clone());
    assert_eq!(
        sorted_names(&all.list(&ListParams::default()).await.unwrap().items),
        ["l0", "l1", "l2", "l3", "l4", "l5", "l6"]
    );

    // A Deployment (apps/v1), typed end to end, with the server's defaults visible.
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), "kube-rs");
    let d = deployments
        .create(
            &PostParams::default(),
            &deployment("web", vec![container("app", "busybox:1")]),
        )
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert!(spec.strategy.is_some(), "defaulted strategy: {spec:?}");
    let listed = deployments
        .list(&ListParams::default().fields("metadata.name=web"))
        .await
        .unwrap();
    assert_eq!(sorted_names(&listed.items), ["web"]);
    assert_eq!(listed.items[0].uid(), d.uid());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_strategic_and_json_patches() {
    let s = start().await;
    create_namespace(&s.client, "patches").await;
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), "patches");
    deployments
        .create(
            &PostParams::default(),
            &deployment(
                "web",
                vec![container("app", "app:1"), container("sidecar", "proxy:1")],
            ),
        )
        .await
        .unwrap();
    let pp = PatchParams::default();

    // Merge patch: maps merge, a list would be replaced whole.
    let merged = deployments
        .patch(
            "web",
            &pp,
            &Patch::Merge(json!({
                "metadata": {"labels": {"team": "blue"}, "annotations": {"note": "merged"}},
                "spec": {"replicas": 3},
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.labels().get("team").map(String::as_str),
        Some("blue")
    );
    assert_eq!(
        merged.annotations().get("note").map(String::as_str),
        Some("merged")
    );
    assert_eq!(merged.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(merged.metadata.generation, Some(2));

    // Strategic merge patch: containers are merged by name, so one changes, one is added
    // and the other is untouched.
    let strategic = deployments
        .patch(
            "web",
            &pp,
            &Patch::Strategic(json!({
                "spec": {"template": {"spec": {"containers": [
                    {"name": "app", "image": "app:2"},
                    {"name": "logger", "image": "logger:1"},
                ]}}},
            })),
        )
        .await
        .unwrap();
    let containers = &strategic
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers;
    let images: BTreeMap<&str, &str> = containers
        .iter()
        .map(|c| (c.name.as_str(), c.image.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(
        images,
        BTreeMap::from([
            ("app", "app:2"),
            ("logger", "logger:1"),
            ("sidecar", "proxy:1")
        ])
    );
    let app = containers.iter().find(|c| c.name == "app").unwrap();
    assert_eq!(
        app.command.as_deref(),
        Some(&["sleep".to_string(), "3600".to_string()][..]),
        "fields the patch does not name are kept"
    );
    // `$patch: delete` removes one element by its key.
    let deleted = deployments
        .patch(
            "web",
            &pp,
            &Patch::Strategic(json!({
                "spec": {"template": {"spec": {"containers": [
                    {"name": "sidecar", "$patch": "delete"},
                ]}}},
            })),
        )
        .await
        .unwrap();
    let names: Vec<&str> = deleted
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["app", "logger"]);

    // JSON patch: test, replace, add and remove by pointer.
    let patched = deployments
        .patch(
            "web",
            &pp,
            &Patch::<()>::Json(
                serde_json::from_value(json!([
                    {"op": "test", "path": "/spec/replicas", "value": 3},
                    {"op": "replace", "path": "/spec/replicas", "value": 5},
                    {"op": "add", "path": "/metadata/labels/color", "value": "green"},
                    {"op": "remove", "path": "/metadata/annotations/note"},
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.as_ref().unwrap().replicas, Some(5));
    assert_eq!(
        patched.labels().get("color").map(String::as_str),
        Some("green")
    );
    assert!(!patched.annotations().contains_key("note"));
    // A failing `test` operation changes nothing and is a 422.
    let failed = api_error(
        deployments
            .patch(
                "web",
                &pp,
                &Patch::<()>::Json(
                    serde_json::from_value(json!([
                        {"op": "test", "path": "/spec/replicas", "value": 1},
                        {"op": "replace", "path": "/spec/replicas", "value": 9},
                    ]))
                    .unwrap(),
                ),
            )
            .await,
    );
    assert_eq!(failed.code, 422, "{failed:?}");
    let now = deployments.get("web").await.unwrap();
    assert_eq!(now.spec.as_ref().unwrap().replicas, Some(5));
    assert_eq!(now.resource_version(), patched.resource_version());

    // Patches on a Lease too: the same code path for every kind.
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "patches");
    leases
        .create(&PostParams::default(), &lease("l", "a", &[]))
        .await
        .unwrap();
    let l = leases
        .patch(
            "l",
            &pp,
            &Patch::Merge(json!({"spec": {"holderIdentity": "b", "leaseTransitions": 1}})),
        )
        .await
        .unwrap();
    let spec = l.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(1));
    assert_eq!(spec.lease_duration_seconds, Some(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_kubernetes_statuses() {
    let s = start().await;
    create_namespace(&s.client, "errors").await;
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "errors");
    let first = leases
        .create(&PostParams::default(), &lease("l", "a", &[]))
        .await
        .unwrap();

    // A replace from a stale copy: 409 Conflict, nothing written.
    let mut newer = first.clone();
    newer.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let newer = leases
        .replace("l", &PostParams::default(), &newer)
        .await
        .unwrap();
    assert_ne!(newer.resource_version(), first.resource_version());
    let mut stale = first.clone();
    stale.spec.as_mut().unwrap().holder_identity = Some("c".into());
    let conflict = api_error(leases.replace("l", &PostParams::default(), &stale).await);
    assert_eq!(conflict.code, 409, "{conflict:?}");
    assert_eq!(conflict.reason, "Conflict");
    assert!(conflict.is_failure(), "{conflict:?}");
    assert!(
        conflict
            .message
            .contains("the object has been modified; please apply your changes"),
        "{}",
        conflict.message
    );
    let details = conflict.details.as_ref().expect("details");
    assert_eq!(details.name, "l");
    assert_eq!(details.group, "coordination.k8s.io");
    assert_eq!(details.kind, "leases");
    assert_eq!(
        leases
            .get("l")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("b")
    );

    // A second create of the same name: 409 AlreadyExists.
    let exists = api_error(
        leases
            .create(&PostParams::default(), &lease("l", "a", &[]))
            .await,
    );
    assert_eq!(
        (exists.code, exists.reason.as_str()),
        (409, "AlreadyExists")
    );

    // A missing object: 404 NotFound, in kube's terms too.
    let missing = leases.get("missing").await;
    let not_found = api_error(missing);
    assert_eq!(
        (not_found.code, not_found.reason.as_str()),
        (404, "NotFound")
    );
    assert_eq!(
        not_found.message,
        "leases.coordination.k8s.io \"missing\" not found"
    );
    assert!(not_found.is_not_found());
    // ... and a missing namespace.
    let nowhere: Api<Lease> = Api::namespaced(s.client.clone(), "nowhere");
    let no_ns = api_error(
        nowhere
            .create(&PostParams::default(), &lease("l", "a", &[]))
            .await,
    );
    assert_eq!((no_ns.code, no_ns.reason.as_str()), (404, "NotFound"));

    // Invalid objects: 422 Invalid with a cause per field, nothing written.
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), "errors");
    let mut bad = deployment("bad", vec![container("app", "app:1")]);
    bad.spec.as_mut().unwrap().replicas = Some(-1);
    let invalid = api_error(deployments.create(&PostParams::default(), &bad).await);
    assert_eq!((invalid.code, invalid.reason.as_str()), (422, "Invalid"));
    assert!(
        invalid
            .message
            .starts_with("Deployment.apps \"bad\" is invalid: "),
        "{}",
        invalid.message
    );
    let details = invalid.details.as_ref().expect("details");
    assert_eq!(details.kind, "Deployment");
    assert_eq!(details.group, "apps");
    assert!(
        details
            .causes
            .iter()
            .any(|c| c.field == "spec.replicas" && c.reason == "FieldValueInvalid"),
        "{details:?}"
    );
    let bad_lease = api_error(
        leases
            .create(&PostParams::default(), &lease("Not_A_Name", "a", &[]))
            .await,
    );
    assert_eq!(
        (bad_lease.code, bad_lease.reason.as_str()),
        (422, "Invalid")
    );
    assert!(deployments.get_opt("bad").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_sees_creates_and_deletes() {
    let s = start().await;
    create_namespace(&s.client, "watched").await;
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "watched");
    leases
        .create(&PostParams::default(), &lease("before", "a", &[]))
        .await
        .unwrap();

    let mut events = watcher(leases.clone(), watcher::Config::default()).boxed();
    // The initial list: Init, the existing object, InitDone.
    let mut initial = Vec::new();
    loop {
        match bounded("initial list", events.try_next()).await.unwrap() {
            Some(watcher::Event::Init) => {}
            Some(watcher::Event::InitApply(l)) => initial.push(l.name_any()),
            Some(watcher::Event::InitDone) => break,
            other => panic!("unexpected event during the initial list: {other:?}"),
        }
    }
    assert_eq!(initial, ["before"]);

    leases
        .create(&PostParams::default(), &lease("new", "a", &[]))
        .await
        .unwrap();
    match bounded("create event", events.try_next()).await.unwrap() {
        Some(watcher::Event::Apply(l)) => assert_eq!(l.name_any(), "new"),
        other => panic!("expected Apply for the create, got {other:?}"),
    }
    leases
        .patch(
            "new",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "b"}})),
        )
        .await
        .unwrap();
    match bounded("update event", events.try_next()).await.unwrap() {
        Some(watcher::Event::Apply(l)) => {
            assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("b"));
        }
        other => panic!("expected Apply for the patch, got {other:?}"),
    }
    leases
        .delete("new", &DeleteParams::default())
        .await
        .unwrap();
    match bounded("delete event", events.try_next()).await.unwrap() {
        Some(watcher::Event::Delete(l)) => assert_eq!(l.name_any(), "new"),
        other => panic!("expected Delete, got {other:?}"),
    }

    // A watcher with a label selector only sees matching objects.
    let mut labelled = watcher(
        leases.clone(),
        watcher::Config::default().labels("app=watched"),
    )
    .applied_objects()
    .boxed();
    leases
        .create(&PostParams::default(), &lease("other", "a", &[]))
        .await
        .unwrap();
    leases
        .create(
            &PostParams::default(),
            &lease("mine", "a", &[("app", "watched")]),
        )
        .await
        .unwrap();
    let first = bounded("labelled event", labelled.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.name_any(), "mine");
}

/// Two API servers over one etcd (as in an HA control plane): a kube-rs `watcher` on the
/// second sees every change exactly once, in order, with the store's resourceVersions,
/// while the first (through which half the writes went) is stopped and etcd compacts its
/// history in between; it never relists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_sees_every_change_once_across_a_server_stop_and_a_compaction() {
    let etcd = EtcdServer::start().expect("starting etcd");
    let serve = |store: EtcdStore| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        skiff_apiserver::spawn(Arc::new(store), listener, ApiServerOptions::default())
            .await
            .expect("starting an API server")
    };
    let connect = || async { EtcdStore::connect(&etcd.endpoints()).await.unwrap() };
    let first = serve(connect().await).await;
    let second = serve(connect().await).await;
    let client_of = |handle: &ServerHandle| {
        let mut config = Config::new(handle.endpoint().parse().unwrap());
        config.default_namespace = "default".into();
        config.read_timeout = Some(WAIT);
        Client::try_from(config).expect("kube client")
    };
    let (to_first, to_second) = (client_of(&first), client_of(&second));
    create_namespace(&to_second, "ha").await;
    let watched: Api<Lease> = Api::namespaced(to_second.clone(), "ha");
    let mut events = watcher(watched.clone(), watcher::Config::default()).boxed();
    loop {
        match bounded("initial list", events.try_next()).await.unwrap() {
            Some(watcher::Event::InitDone) => break,
            Some(watcher::Event::Init) => {}
            other => panic!("unexpected event during the initial list: {other:?}"),
        }
    }
    let mut written = Vec::new();
    let through_first: Api<Lease> = Api::namespaced(to_first, "ha");
    for i in 0..10 {
        let l = through_first
            .create(
                &PostParams::default(),
                &lease(&format!("l{i:02}"), "a", &[]),
            )
            .await
            .unwrap();
        written.push((l.name_any(), l.resource_version().unwrap()));
    }
    drop(first);
    let store = connect().await;
    let revision = store.current_revision().await.unwrap();
    store.compact(revision).await.unwrap();
    for i in 10..20 {
        let l = watched
            .create(
                &PostParams::default(),
                &lease(&format!("l{i:02}"), "a", &[]),
            )
            .await
            .unwrap();
        written.push((l.name_any(), l.resource_version().unwrap()));
    }
    let mut seen = Vec::new();
    while seen.len() < written.len() {
        match bounded("a watch event", events.try_next()).await.unwrap() {
            Some(watcher::Event::Apply(l)) => {
                seen.push((l.name_any(), l.resource_version().unwrap()));
            }
            other => panic!("only Apply events expected (no relist), got {other:?}"),
        }
    }
    assert_eq!(seen, written, "every change once, in order");
    drop(second);
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct ReconcileError(#[from] kube::Error);

/// What the controller under test writes: the holder, as an annotation.
const SEEN: &str = "kube-rs.skiff.io/seen-holder";

async fn reconcile(lease: Arc<Lease>, client: Arc<Client>) -> Result<Action, ReconcileError> {
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default();
    if lease.annotations().get(SEEN) != Some(&holder) {
        let api: Api<Lease> =
            Api::namespaced((*client).clone(), &lease.namespace().unwrap_or_default());
        api.patch(
            &lease.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {SEEN: holder}}})),
        )
        .await?;
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(_: Arc<Lease>, err: &ReconcileError, _: Arc<Client>) -> Action {
    tracing::warn!(%err, "reconcile failed");
    Action::requeue(Duration::from_millis(100))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_converges() {
    let s = start().await;
    create_namespace(&s.client, "ctl").await;
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "ctl");
    leases
        .create(&PostParams::default(), &lease("early", "h1", &[]))
        .await
        .unwrap();

    let controller = Controller::new(leases.clone(), watcher::Config::default())
        .run(reconcile, error_policy, Arc::new(s.client.clone()))
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::warn!(error = %e, "controller");
            }
        });
    let controller = tokio::spawn(controller);

    let seen = |name: &'static str, want: &'static str| {
        let leases = leases.clone();
        async move {
            eventually(&format!("{name} annotated with {want}"), || {
                let leases = leases.clone();
                async move {
                    let l = leases.get(name).await.ok()?;
                    (l.annotations().get(SEEN).map(String::as_str) == Some(want)).then_some(l)
                }
            })
            .await
        }
    };
    // An object that existed before the controller started, and one created after.
    seen("early", "h1").await;
    leases
        .create(&PostParams::default(), &lease("late", "h2", &[]))
        .await
        .unwrap();
    seen("late", "h2").await;
    // A change is reconciled again.
    leases
        .patch(
            "early",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "h3"}})),
        )
        .await
        .unwrap();
    let converged = seen("early", "h3").await;
    // Converged: the controller's own write triggers a reconcile that writes nothing more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        leases.get("early").await.unwrap().resource_version(),
        converged.resource_version()
    );
    controller.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_with_options_and_collections() {
    let s = start().await;
    create_namespace(&s.client, "deletes").await;
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "deletes");
    for i in 0..5 {
        let batch = if i < 3 { "a" } else { "b" };
        leases
            .create(
                &PostParams::default(),
                &lease(&format!("l{i}"), "h", &[("batch", batch)]),
            )
            .await
            .unwrap();
    }

    // One object, background propagation: deleted at once, the last state returned.
    let gone = leases
        .delete("l0", &DeleteParams::background())
        .await
        .unwrap();
    let last = gone.left().expect("the deleted object");
    assert_eq!(last.name_any(), "l0");
    assert!(leases.get_opt("l0").await.unwrap().is_none());
    // Foreground propagation and a matching uid precondition: with no garbage collector
    // running, the object stays, marked and holding the `foregroundDeletion` finalizer, until
    // the finalizer is removed (what the collector does once no dependent is left).
    let l1 = leases.get("l1").await.unwrap();
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: l1.uid(),
            resource_version: None,
        }),
        ..DeleteParams::foreground()
    };
    let marked = leases
        .delete("l1", &dp)
        .await
        .unwrap()
        .left()
        .expect("the marked object");
    assert!(marked.metadata.deletion_timestamp.is_some(), "{marked:?}");
    assert_eq!(marked.finalizers(), ["foregroundDeletion"]);
    assert!(leases.get_opt("l1").await.unwrap().is_some());
    leases
        .patch(
            "l1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(leases.get_opt("l1").await.unwrap().is_none());
    // A precondition that does not hold: 409 Conflict, nothing deleted.
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let conflict = api_error(leases.delete("l2", &dp).await);
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    assert!(leases.get_opt("l2").await.unwrap().is_some());
    // Dry run: nothing deleted.
    let dry = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    leases.delete("l2", &dry).await.unwrap();
    assert!(leases.get_opt("l2").await.unwrap().is_some());
    // A missing object: 404.
    let missing = api_error(leases.delete("l0", &DeleteParams::default()).await);
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));

    // deletecollection with a label selector.
    let deleted = leases
        .delete_collection(
            &DeleteParams::background(),
            &ListParams::default().labels("batch=b"),
        )
        .await
        .unwrap();
    let list = deleted.left().expect("the deleted objects");
    assert_eq!(sorted_names(&list.items), ["l3", "l4"]);
    assert_eq!(
        sorted_names(&leases.list(&ListParams::default()).await.unwrap().items),
        ["l2"]
    );

    // A Deployment deleted with a propagation policy.
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), "deletes");
    deployments
        .create(
            &PostParams::default(),
            &deployment("web", vec![container("app", "app:1")]),
        )
        .await
        .unwrap();
    deployments
        .delete("web", &DeleteParams::background())
        .await
        .unwrap();
    assert!(deployments.get_opt("web").await.unwrap().is_none());

    // A namespace with content is marked Terminating (202 and the object), not removed.
    let namespaces: Api<Namespace> = Api::all(s.client.clone());
    let terminating = namespaces
        .delete("deletes", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("the namespace");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_only_get_list_and_watch() {
    let s = start().await;
    create_namespace(&s.client, "meta").await;
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "meta");
    let created = leases
        .create(&PostParams::default(), &lease("l", "a", &[("app", "m")]))
        .await
        .unwrap();
    let m = leases.get_metadata("l").await.unwrap();
    let types = m.types.as_ref().expect("type meta");
    assert_eq!(
        (types.api_version.as_str(), types.kind.as_str()),
        ("meta.k8s.io/v1", "PartialObjectMetadata")
    );
    assert_eq!(m.metadata.uid, created.metadata.uid);
    assert_eq!(m.labels().get("app").map(String::as_str), Some("m"));
    let list = leases.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(
        (list.types.api_version.as_str(), list.types.kind.as_str()),
        ("meta.k8s.io/v1", "PartialObjectMetadataList")
    );
    assert_eq!(sorted_names(&list.items), ["l"]);
    assert_eq!(
        list.items[0].types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata")
    );
    let mut events = watcher(
        Api::<kube::core::PartialObjectMeta<Lease>>::namespaced(s.client.clone(), "meta"),
        watcher::Config::default(),
    )
    .touched_objects()
    .boxed();
    let first = bounded("metadata watch", events.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.name_any(), "l");
    leases
        .create(&PostParams::default(), &lease("l2", "a", &[]))
        .await
        .unwrap();
    let second = bounded("metadata watch", events.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.name_any(), "l2");
    assert_eq!(
        second.types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_watcher() {
    let s = start().await;
    create_namespace(&s.client, "stream").await;
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "stream");
    for name in ["a", "b"] {
        leases
            .create(&PostParams::default(), &lease(name, "h", &[]))
            .await
            .unwrap();
    }
    let mut events = watcher(leases.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match bounded("streaming initial list", events.try_next())
            .await
            .unwrap()
        {
            Some(watcher::Event::Init) => {}
            Some(watcher::Event::InitApply(l)) => initial.push(l.name_any()),
            Some(watcher::Event::InitDone) => break,
            other => panic!("unexpected event during the initial list: {other:?}"),
        }
    }
    initial.sort();
    assert_eq!(initial, ["a", "b"]);
    leases
        .create(&PostParams::default(), &lease("c", "h", &[]))
        .await
        .unwrap();
    match bounded("create event", events.try_next()).await.unwrap() {
        Some(watcher::Event::Apply(l)) => assert_eq!(l.name_any(), "c"),
        other => panic!("expected Apply, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_scale_and_discovery() {
    let s = start().await;
    let version = s.client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "32")
    );
    create_namespace(&s.client, "sub").await;
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), "sub");
    deployments
        .create(
            &PostParams::default(),
            &deployment("web", vec![container("app", "app:1")]),
        )
        .await
        .unwrap();
    let st = deployments
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 2, "readyReplicas": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(st.status.as_ref().unwrap().ready_replicas, Some(1));
    assert_eq!(st.metadata.generation, Some(1));
    let got = deployments.get_status("web").await.unwrap();
    assert_eq!(got.status.unwrap().replicas, Some(2));
    let scale = deployments.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.as_ref().unwrap().replicas, Some(2));
    let scaled = deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(4));
    assert_eq!(
        deployments.get("web").await.unwrap().spec.unwrap().replicas,
        Some(4)
    );

    for discovery in [
        kube::Discovery::new(s.client.clone()).run().await.unwrap(),
        kube::Discovery::new(s.client.clone())
            .run_aggregated()
            .await
            .unwrap(),
    ] {
        assert!(discovery.has_group("apps"));
        let (ar, caps) = discovery
            .resolve_gvk(&kube::api::GroupVersionKind::gvk(
                "coordination.k8s.io",
                "v1",
                "Lease",
            ))
            .expect("leases discovered");
        assert_eq!(ar.plural, "leases");
        assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
        let dyn_api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(s.client.clone(), "sub", &ar);
        assert!(
            dyn_api
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_with_field_managers() {
    let s = start().await;
    let leases: Api<Lease> = Api::default_namespaced(s.client.clone());
    let mut intent = lease("ssa", "alpha", &[("app", "ssa")]);
    intent.metadata.resource_version = None;
    // Apply creates, and records the manager.
    let created = bounded(
        "apply",
        leases.patch(
            "ssa",
            &PatchParams::apply("deployer"),
            &Patch::Apply(&intent),
        ),
    )
    .await
    .unwrap();
    let managed = created.metadata.managed_fields.clone().unwrap_or_default();
    assert_eq!(managed.len(), 1, "{managed:?}");
    assert_eq!(managed[0].manager.as_deref(), Some("deployer"));
    assert_eq!(managed[0].operation.as_deref(), Some("Apply"));
    // Another manager applying a different holder conflicts: 409 Conflict, nothing written.
    let mut other = intent.clone();
    other.spec.as_mut().unwrap().holder_identity = Some("beta".into());
    other.metadata.labels = None;
    let err = api_error(
        bounded(
            "conflicting apply",
            leases.patch("ssa", &PatchParams::apply("rival"), &Patch::Apply(&other)),
        )
        .await,
    );
    assert_eq!(
        (err.code, err.reason.as_str()),
        (409, "Conflict"),
        "{err:?}"
    );
    assert!(
        err.message.contains(
            "conflict with \"deployer\" using coordination.k8s.io/v1: .spec.holderIdentity"
        ),
        "{}",
        err.message
    );
    let live = leases.get("ssa").await.unwrap();
    assert_eq!(live.spec.unwrap().holder_identity.as_deref(), Some("alpha"));
    // Forced, the rival owns the field; the deployer's labels stay.
    let forced = bounded(
        "forced apply",
        leases.patch(
            "ssa",
            &PatchParams::apply("rival").force(),
            &Patch::Apply(&other),
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        forced.spec.unwrap().holder_identity.as_deref(),
        Some("beta")
    );
    assert_eq!(forced.metadata.labels.unwrap()["app"], "ssa");
    let managers: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["deployer", "rival"]);
}
