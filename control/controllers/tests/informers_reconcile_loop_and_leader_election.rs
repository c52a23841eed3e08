//! `skiff_client::controller` against a real API server: informer
//! indexes and notifications, the controller loop (owned objects, retries, one key at a
//! time), and leader election between two electors.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use skiff_api::Resource;
use skiff_api::api::{Namespace, ObjectMeta, OwnerReference, Pod, ReplicaSet, ReplicaSetSpec};
use skiff_api::selector::Selector;
use skiff_client::ListParams;
use skiff_client::controller::{
    Action, CancelToken, Change, Controller, EventRecorder, EventType, Informer, Informers,
    LeaderElectionConfig, LeaderElector, ObjectKey, Reconciler,
};

fn pod(ns: &str, name: &str, app: &str) -> Pod {
    Pod {
        metadata: Some(ObjectMeta {
            name: name.into(),
            namespace: ns.into(),
            labels: labels(&[("app", app)]),
            ..Default::default()
        }),
        spec: template(&[], "1").and_then(|t| t.spec),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn informer_indexes_and_notifies() {
    let c = cluster().await;
    c.client
        .cluster::<Namespace>()
        .create(&Namespace {
            metadata: Some(ObjectMeta {
                name: "other".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("namespace");
    let pods = c.client.all::<Pod>();
    pods.create(&pod("default", "a", "web")).await.expect("a");
    pods.create(&pod("default", "b", "db")).await.expect("b");
    pods.create(&pod("other", "c", "web")).await.expect("c");
    c.client
        .namespaced::<Pod>("other")
        .bind("c", "node-1")
        .await
        .expect("bind");

    let informer = Informer::new(c.client.all::<Pod>(), ListParams::default());
    tokio::time::timeout(WAIT, informer.wait_synced())
        .await
        .expect("synced");
    assert!(informer.has_synced());
    assert_eq!(informer.len(), 3);
    let names = |v: Vec<Arc<Pod>>| v.iter().map(|p| p.name().to_string()).collect::<Vec<_>>();
    assert_eq!(names(informer.by_namespace("default")), ["a", "b"]);
    assert_eq!(names(informer.by_label("app", "web")), ["a", "c"]);
    assert_eq!(names(informer.by_node("node-1")), ["c"]);
    let web = Selector::parse("app in (web)").expect("selector");
    assert_eq!(names(informer.select(Some("other"), &web)), ["c"]);
    assert_eq!(names(informer.select(None, &web)), ["a", "c"]);

    // A subscriber first gets every object, then the changes.
    let mut sub = informer.subscribe();
    let mut seen = HashSet::new();
    for _ in 0..3 {
        match sub.recv().await {
            Some(Change::Added(p)) => seen.insert(p.name().to_string()),
            other => panic!("want the initial objects, got {other:?}"),
        };
    }
    assert_eq!(seen.len(), 3);
    let created = pods.create(&pod("default", "d", "web")).await.expect("d");
    match tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("change")
    {
        Some(Change::Added(p)) => assert_eq!(p.name(), "d"),
        other => panic!("want d added, got {other:?}"),
    }
    let rv: u64 = created.resource_version().parse().expect("rv");
    tokio::time::timeout(WAIT, informer.wait_for_revision(rv))
        .await
        .expect("revision");
    assert!(informer.revision() >= rv);
    let mut relabelled = created.clone();
    relabelled
        .metadata_mut()
        .labels
        .insert("app".into(), "db".into());
    pods.update(&relabelled).await.expect("relabel");
    match tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("change")
    {
        Some(Change::Updated { old, new }) => {
            assert_eq!(
                old.metadata().map(|m| m.labels["app"].as_str()),
                Some("web")
            );
            assert_eq!(new.metadata().map(|m| m.labels["app"].as_str()), Some("db"));
        }
        other => panic!("want d updated, got {other:?}"),
    }
    assert_eq!(names(informer.by_label("app", "db")), ["b", "d"]);
    c.client
        .namespaced::<Pod>("default")
        .delete("d", &Default::default())
        .await
        .expect("delete");
    match tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("change")
    {
        Some(Change::Deleted(p)) => assert_eq!(p.name(), "d"),
        other => panic!("want d deleted, got {other:?}"),
    }
    assert!(informer.get(&ObjectKey::new("default", "d")).is_none());

    // Informers share one informer per type.
    let shared = Informers::new(c.client.clone());
    let one = shared.get::<Pod>();
    let two = shared.get::<Pod>();
    tokio::time::timeout(WAIT, shared.wait_synced())
        .await
        .expect("synced");
    assert_eq!(one.len(), 3);
    assert_eq!(two.len(), 3);
}

/// Records reconciles; fails the first `failures` reconciles of every key.
struct Recorder {
    failures: usize,
    calls: Mutex<Vec<ObjectKey>>,
    active: Mutex<HashSet<ObjectKey>>,
    overlaps: AtomicUsize,
}

#[derive(Debug, thiserror::Error)]
#[error("planned failure")]
struct Planned;

impl Reconciler for Recorder {
    type Error = Planned;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Planned> {
        if !self.active.lock().unwrap().insert(key.clone()) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let n = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(key.clone());
            calls.iter().filter(|k| *k == key).count()
        };
        self.active.lock().unwrap().remove(key);
        if n <= self.failures {
            Err(Planned)
        } else {
            Ok(Action::Done)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controller_maps_owned_objects_and_retries_failures() {
    let c = cluster().await;
    let rs_api = c.client.namespaced::<ReplicaSet>("default");
    let rs = rs_api
        .create(&ReplicaSet {
            metadata: meta("owner"),
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                selector: selector(&[("app", "x")]),
                template: template(&[("app", "x")], "1"),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("rs");
    let informers = Informers::new(c.client.clone());
    let reconciler = Arc::new(Recorder {
        failures: 3,
        calls: Mutex::default(),
        active: Mutex::default(),
        overlaps: AtomicUsize::new(0),
    });
    let stop = CancelToken::new();
    let controller = Controller::<ReplicaSet>::new(&informers)
        .watches_owned::<Pod>()
        .graceful_shutdown_on(stop.clone());
    let queue = controller.queue();
    let run = tokio::spawn({
        let r = reconciler.clone();
        async move { controller.run(r, 4).await }
    });
    let key = ObjectKey::new("default", "owner");
    let calls = |k: &ObjectKey| {
        reconciler
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| *c == k)
            .count()
    };
    // Three failures, retried with back-off, then success.
    eventually("owner reconciled after its failures", || async {
        (calls(&key) >= 4).then_some(())
    })
    .await;
    // A pod it controls queues the owner; hammer the queue too: never two at once.
    let before = calls(&key);
    let mut owned = pod("default", "child", "x");
    owned.metadata_mut().owner_references = vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "owner".into(),
        uid: rs.metadata().map(|m| m.uid.clone()).unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }];
    c.client
        .namespaced::<Pod>("default")
        .create(&owned)
        .await
        .expect("child");
    for _ in 0..50 {
        queue.add(key.clone());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    eventually("the owner reconciled for its child", || async {
        (calls(&key) > before).then_some(())
    })
    .await;
    assert_eq!(reconciler.overlaps.load(Ordering::SeqCst), 0);
    stop.cancel();
    tokio::time::timeout(WAIT, run)
        .await
        .expect("controller stops")
        .expect("task");
    assert!(queue.is_shut_down());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_elector_leads_and_hands_over_on_shutdown() {
    let c = cluster().await;
    let config = |id: &str| {
        LeaderElectionConfig::new("runtime-test", id)
            .in_namespace("default")
            .with_lease_duration(Duration::from_secs(2))
    };
    let leaders = Arc::new(AtomicUsize::new(0));
    let max_leaders = Arc::new(AtomicUsize::new(0));
    let spawn = |id: &'static str, stop: CancelToken| {
        let (client, leaders, max_leaders) =
            (c.client.clone(), leaders.clone(), max_leaders.clone());
        let elector = LeaderElector::new(&client, config(id)).with_shutdown(stop);
        let leading = elector.leading();
        let task = tokio::spawn(async move {
            elector
                .run(|token| {
                    let (leaders, max_leaders) = (leaders.clone(), max_leaders.clone());
                    async move {
                        let now = leaders.fetch_add(1, Ordering::SeqCst) + 1;
                        max_leaders.fetch_max(now, Ordering::SeqCst);
                        token.cancelled().await;
                        leaders.fetch_sub(1, Ordering::SeqCst);
                    }
                })
                .await
                .expect("elector");
        });
        (task, leading)
    };
    let (stop_a, stop_b) = (CancelToken::new(), CancelToken::new());
    let (task_a, mut leading_a) = spawn("a", stop_a.clone());
    tokio::time::timeout(WAIT, leading_a.wait_for(|l| *l))
        .await
        .expect("a leads")
        .expect("watch");
    let (task_b, mut leading_b) = spawn("b", stop_b.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!*leading_b.borrow(), "b must not lead while a renews");
    // a steps down gracefully: b takes over well within a lease duration.
    let start = std::time::Instant::now();
    stop_a.cancel();
    tokio::time::timeout(WAIT, task_a)
        .await
        .expect("a stops")
        .expect("task");
    tokio::time::timeout(WAIT, leading_b.wait_for(|l| *l))
        .await
        .expect("b leads")
        .expect("watch");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    stop_b.cancel();
    tokio::time::timeout(WAIT, task_b)
        .await
        .expect("b stops")
        .expect("task");
    assert_eq!(max_leaders.load(Ordering::SeqCst), 1, "never two leaders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_aggregated() {
    let c = cluster().await;
    let rs = c
        .client
        .namespaced::<ReplicaSet>("default")
        .create(&ReplicaSet {
            metadata: meta("noisy"),
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                selector: selector(&[("app", "n")]),
                template: template(&[("app", "n")], "1"),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("rs");
    let recorder = EventRecorder::new(c.client.clone(), "test-controller", "instance-1");
    for _ in 0..3 {
        recorder
            .record(&rs, EventType::Warning, "Flapping", "same thing again")
            .await
            .expect("record");
    }
    recorder
        .record(&rs, EventType::Normal, "Other", "something else")
        .await
        .expect("record");
    let events = c
        .client
        .namespaced::<skiff_api::api::Event>("default")
        .list(&ListParams::default().fields("involvedObject.name=noisy"))
        .await
        .expect("events")
        .items;
    assert_eq!(events.len(), 2);
    let flapping = events
        .iter()
        .find(|e| e.reason == "Flapping")
        .expect("flapping");
    assert_eq!(flapping.count, 3);
    assert_eq!(flapping.r#type, "Warning");
    let source = flapping.source.as_ref().expect("source");
    assert_eq!(
        (source.component.as_str(), source.host.as_str()),
        ("test-controller", "instance-1")
    );
    let obj = flapping.involved_object.as_ref().expect("involvedObject");
    assert_eq!(
        (obj.kind.as_str(), obj.api_version.as_str()),
        ("ReplicaSet", "apps/v1")
    );
    assert_eq!(
        obj.uid,
        rs.metadata().map(|m| m.uid.clone()).unwrap_or_default()
    );
}
