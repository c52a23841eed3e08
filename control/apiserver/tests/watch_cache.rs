//! The watch cache: one store watch per resource however many watchers, the window of
//! servable revisions, slow watchers, compaction, and shutdown.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use futures::future::join_all;
use skiff_api::Resource;
use skiff_api::api::{Node, Pod};
use skiff_apiserver::ApiServerOptions;
use skiff_store::{KeyValue, Listing, Store, WatchStream};
use tonic::Code;

/// A real store that counts the watches opened per prefix.
struct CountingStore {
    inner: Arc<dyn Store>,
    watches: Mutex<BTreeMap<String, u64>>,
}

impl CountingStore {
    fn watches(&self, prefix: &str) -> u64 {
        self.watches
            .lock()
            .expect("lock")
            .get(prefix)
            .copied()
            .unwrap_or(0)
    }
}

#[async_trait]
impl Store for CountingStore {
    async fn get(&self, key: &str) -> skiff_store::Result<Option<KeyValue>> {
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str, revision: Option<i64>) -> skiff_store::Result<Listing> {
        self.inner.list(prefix, revision).await
    }
    async fn create(&self, key: &str, value: Vec<u8>) -> skiff_store::Result<KeyValue> {
        self.inner.create(key, value).await
    }
    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_revision: i64,
    ) -> skiff_store::Result<KeyValue> {
        self.inner.update(key, value, expected_revision).await
    }
    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<i64>,
    ) -> skiff_store::Result<(KeyValue, i64)> {
        self.inner.delete(key, expected_revision).await
    }
    async fn watch(&self, prefix: &str, after_revision: i64) -> skiff_store::Result<WatchStream> {
        *self
            .watches
            .lock()
            .expect("lock")
            .entry(prefix.to_string())
            .or_default() += 1;
        self.inner.watch(prefix, after_revision).await
    }
    async fn current_revision(&self) -> skiff_store::Result<i64> {
        self.inner.current_revision().await
    }
    async fn compact(&self, revision: i64) -> skiff_store::Result<()> {
        self.inner.compact(revision).await
    }
}

async fn thousand_watchers_share_one_store_watch(backend: Backend) {
    let (inner, _guard) = open_store(backend).await;
    let counting = Arc::new(CountingStore {
        inner,
        watches: Mutex::new(BTreeMap::new()),
    });
    let handle = serve(counting.clone(), ApiServerOptions::default()).await;
    // Ten connections, a hundred watch streams on each.
    let mut apis = Vec::new();
    for _ in 0..10 {
        apis.push(Api::connect(&handle.endpoint()).await);
    }
    let (_, rv) = apis[0].list::<Pod>("", "", "").await.expect("list");
    let streams = join_all((0..1000).map(|i| {
        let api = apis[i % apis.len()].clone();
        let rv = rv.clone();
        async move { api.watch::<Pod>("", "", "", &rv).await.expect("watch") }
    }))
    .await;
    assert_eq!(streams.len(), 1000);

    // Written after every watch started: all of them must see it.
    let created = apis[0]
        .create("default", &pod("ping", "", &[]))
        .await
        .expect("create");
    let events = join_all(streams.into_iter().map(|mut s| async move {
        let ev = next_event(&mut s, 30).await.expect("event");
        (ev.r#type, ev.resource_version)
    }))
    .await;
    for (ty, rv) in &events {
        assert_eq!(ty, "ADDED");
        assert_eq!(rv, created.resource_version());
    }
    assert_eq!(events.len(), 1000);

    assert_eq!(counting.watches("/registry/pods/"), 1);
    assert_eq!(handle.store_watches_for("pods"), Some(1));
    // One per resource type, nothing else.
    assert_eq!(handle.store_watches(), skiff_api::kinds().len() as u64);
    assert_eq!(
        counting.watches.lock().expect("lock").values().sum::<u64>(),
        skiff_api::kinds().len() as u64
    );
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_watchers_share_one_store_watch_embedded() {
    thousand_watchers_share_one_store_watch(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_watchers_share_one_store_watch_etcd() {
    thousand_watchers_share_one_store_watch(Backend::Etcd).await;
}

fn small_cache() -> ApiServerOptions {
    ApiServerOptions {
        watch_cache_capacity: 10,
        ..ApiServerOptions::default()
    }
}

async fn too_old_versions_are_out_of_range(backend: Backend) {
    let s = TestServer::start_with(backend, small_cache()).await;
    let api = &s.api;
    let mut p = api
        .create("default", &pod("p", "", &[]))
        .await
        .expect("create");
    let first = p.resource_version().to_string();
    let mut revisions = Vec::new();
    for i in 0..30 {
        p.metadata_mut().labels.insert("i".into(), i.to_string());
        p = api.update(&p, "").await.expect("update");
        revisions.push(p.resource_version().to_string());
    }
    // The first revision fell out of the 10-event window.
    assert_status(
        api.watch::<Pod>("", "", "", &first).await,
        Code::OutOfRange,
        "Expired",
        &["too old resource version"],
    );
    // Inside the window: served, with exactly the later events.
    let mut w = api
        .watch::<Pod>("", "", "", &revisions[24])
        .await
        .expect("watch inside window");
    for want in &revisions[25..] {
        assert_eq!(
            &next_event(&mut w, 5).await.expect("event").resource_version,
            want
        );
    }
    // A revision beyond the store's is refused too (relist).
    assert_status(
        api.watch::<Pod>("", "", "", "999999999").await,
        Code::OutOfRange,
        "Expired",
        &["too large resource version"],
    );
    // A revision the pod cache has not seen yet (a write to another resource) waits.
    let node = api
        .create(
            "",
            &Node {
                metadata: meta("n1", "", &[]),
                ..Default::default()
            },
        )
        .await
        .expect("create node");
    let mut later = api
        .watch::<Pod>("", "", "", node.resource_version())
        .await
        .expect("watch from another resource's revision");
    assert_quiet(&mut later, 200).await;
    p.metadata_mut().labels.insert("i".into(), "last".into());
    let p = api.update(&p, "").await.expect("update");
    assert_eq!(
        next_event(&mut later, 5)
            .await
            .expect("event")
            .resource_version,
        p.resource_version()
    );
    s.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_old_versions_are_out_of_range_embedded() {
    too_old_versions_are_out_of_range(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_old_versions_are_out_of_range_etcd() {
    too_old_versions_are_out_of_range(Backend::Etcd).await;
}

/// A watcher that does not read falls out of the window and ends with OutOfRange; what it
/// got before is in order without gaps. Others are not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_watcher_gets_out_of_range_without_blocking_others() {
    let s = TestServer::start_with(Backend::Embedded, small_cache()).await;
    let api = s.api.clone();
    let (_, rv) = api.list::<Pod>("", "", "").await.expect("list");
    // Separate connections: on a shared one, HTTP/2 flow control would let the unread
    // stream stall the other on the client side.
    // Small HTTP/2 windows keep the client from buffering much on the slow watcher's behalf.
    let channel = tonic::transport::Endpoint::from_shared(s.handle.endpoint())
        .expect("endpoint")
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .expect("connect");
    let slow_client = Api {
        client: skiff_api::rpc::api_client::ApiClient::new(channel),
    };
    let mut slow = slow_client
        .watch::<Pod>("", "", "", &rv)
        .await
        .expect("watch");
    let mut fast = api.watch::<Pod>("", "", "", &rv).await.expect("watch");
    let big = "x".repeat(4096);
    const N: usize = 600;
    let writer = {
        let api = api.clone();
        tokio::spawn(async move {
            for i in 0..N {
                let mut p = pod(&format!("p{i}"), "", &[]);
                p.metadata_mut()
                    .annotations
                    .insert("fill".into(), big.clone());
                api.create("default", &p).await.expect("create");
            }
        })
    };
    // The fast watcher keeps up with every event while the slow one reads nothing.
    let mut last = 0i64;
    for _ in 0..N {
        let ev = next_event(&mut fast, 20).await.expect("fast watcher event");
        let rv: i64 = ev.resource_version.parse().expect("rv");
        assert!(rv > last);
        last = rv;
    }
    writer.await.expect("writer");
    let mut got = 0;
    let mut prev = 0i64;
    let status = loop {
        match next_event(&mut slow, 20).await {
            Ok(ev) => {
                let rv: i64 = ev.resource_version.parse().expect("rv");
                assert!(rv > prev);
                prev = rv;
                got += 1;
            }
            Err(status) => break status,
        }
    };
    assert!(got < N, "the slow watcher was never cut off");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains("too old resource version"),
        "{status:?}"
    );
    s.handle.shutdown().await;
}

/// After the store compacted and the server restarted, revisions before the new server's
/// listing are out of range; the listing's revision is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_history_is_out_of_range_after_restart() {
    let (store, _guard) = open_store(Backend::Embedded).await;
    let first = serve(Arc::clone(&store), ApiServerOptions::default()).await;
    let api = Api::connect(&first.endpoint()).await;
    let p = api
        .create("default", &pod("p", "", &[]))
        .await
        .expect("create");
    let old = p.resource_version().to_string();
    for i in 0..5 {
        api.create("default", &pod(&format!("q{i}"), "", &[]))
            .await
            .expect("create");
    }
    first.shutdown().await;
    let current = store.current_revision().await.expect("revision");
    store.compact(current).await.expect("compact");

    let second = serve(Arc::clone(&store), ApiServerOptions::default()).await;
    let api = Api::connect(&second.endpoint()).await;
    assert_status(
        api.watch::<Pod>("", "", "", &old).await,
        Code::OutOfRange,
        "Expired",
        &["too old resource version"],
    );
    let (items, rv) = api.list::<Pod>("", "", "").await.expect("list");
    assert_eq!(items.len(), 6);
    let mut w = api
        .watch::<Pod>("", "", "", &rv)
        .await
        .expect("watch from list");
    api.delete::<Pod>("default", "p").await.expect("delete");
    assert_eq!(
        next_event(&mut w, 5).await.expect("event").r#type,
        "DELETED"
    );
    second.shutdown().await;
}

/// Shutdown ends open watches; dropping a handle stops its server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_watches_and_drop_stops_the_server() {
    let s = TestServer::start(Backend::Embedded).await;
    let mut w = s.api.watch::<Pod>("", "", "", "").await.expect("watch");
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), s.handle.shutdown())
        .await
        .expect("graceful shutdown returned within 10 s");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "graceful shutdown hung"
    );
    match tokio::time::timeout(Duration::from_secs(5), w.message()).await {
        Ok(Ok(None)) => {}
        Ok(Err(status)) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        other => panic!("watch still open after shutdown: {other:?}"),
    }

    let (store, _guard) = open_store(Backend::Embedded).await;
    let handle = serve(store, ApiServerOptions::default()).await;
    let api = tokio::time::timeout(Duration::from_secs(10), Api::connect(&handle.endpoint()))
        .await
        .expect("connect within 10 s");
    tokio::time::timeout(Duration::from_secs(10), api.list::<Pod>("", "", ""))
        .await
        .expect("list within 10 s")
        .expect("list");
    drop(handle);
    // Every call is bounded: a server that no longer answers (an error, or no answer within
    // 2 s on a connection nobody serves) counts as stopped; one that still lists does not.
    let mut failed = false;
    for _ in 0..50 {
        match tokio::time::timeout(Duration::from_secs(2), api.list::<Pod>("", "", "")).await {
            Ok(Ok(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(Err(_)) | Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "server still answers after its handle was dropped");
}

/// Which failure [`FaultyStore::inject`] ends the open store watches with.
#[derive(Clone, Copy)]
enum Fault {
    /// The history the watch needs is gone: the cache must relist.
    Compacted,
    /// A transient backend failure: the cache reopens the watch where it was.
    Backend,
}

/// A real store whose open watch streams can be made to fail on demand.
struct FaultyStore {
    inner: Arc<dyn Store>,
    faults: Mutex<Vec<tokio::sync::mpsc::UnboundedSender<Fault>>>,
}

impl FaultyStore {
    fn inject(&self, fault: Fault) {
        for tx in self.faults.lock().expect("lock").drain(..) {
            let _ = tx.send(fault);
        }
    }
}

#[async_trait]
impl Store for FaultyStore {
    async fn get(&self, key: &str) -> skiff_store::Result<Option<KeyValue>> {
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str, revision: Option<i64>) -> skiff_store::Result<Listing> {
        self.inner.list(prefix, revision).await
    }
    async fn create(&self, key: &str, value: Vec<u8>) -> skiff_store::Result<KeyValue> {
        self.inner.create(key, value).await
    }
    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_revision: i64,
    ) -> skiff_store::Result<KeyValue> {
        self.inner.update(key, value, expected_revision).await
    }
    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<i64>,
    ) -> skiff_store::Result<(KeyValue, i64)> {
        self.inner.delete(key, expected_revision).await
    }
    async fn watch(&self, prefix: &str, after_revision: i64) -> skiff_store::Result<WatchStream> {
        use futures::StreamExt;
        let inner = self.inner.watch(prefix, after_revision).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.faults.lock().expect("lock").push(tx);
        let faults = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(|f| {
            Err(match f {
                Fault::Compacted => skiff_store::StoreError::Compacted {
                    requested: 1,
                    compacted: 2,
                },
                Fault::Backend => skiff_store::StoreError::Backend("injected failure".into()),
            })
        });
        // Like a real store watch, the stream ends after its first error.
        let merged = futures::stream::select(inner, faults).scan(false, |failed, item| {
            let out = if *failed {
                None
            } else {
                *failed = item.is_err();
                Some(item)
            };
            futures::future::ready(out)
        });
        Ok(Box::pin(merged))
    }
    async fn current_revision(&self) -> skiff_store::Result<i64> {
        self.inner.current_revision().await
    }
    async fn compact(&self, revision: i64) -> skiff_store::Result<()> {
        self.inner.compact(revision).await
    }
}

/// A transient store-watch failure is invisible to watchers (the watch is reopened where it
/// stopped); a compacted one makes the cache relist and ends current watchers with
/// OutOfRange, since events may have been lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_watch_failures_reopen_or_relist() {
    let (inner, _guard) = open_store(Backend::Embedded).await;
    let faulty = Arc::new(FaultyStore {
        inner,
        faults: Mutex::new(Vec::new()),
    });
    let handle = serve(faulty.clone(), ApiServerOptions::default()).await;
    let api = Api::connect(&handle.endpoint()).await;
    let (_, rv) = api.list::<Pod>("", "", "").await.expect("list");
    let mut w = api.watch::<Pod>("", "", "", &rv).await.expect("watch");
    api.create("default", &pod("a", "", &[]))
        .await
        .expect("create");
    assert_eq!(next_event(&mut w, 5).await.expect("event").r#type, "ADDED");

    faulty.inject(Fault::Backend);
    // Written while the store watch is down or being reopened: still delivered, in order.
    let b = api
        .create("default", &pod("b", "", &[]))
        .await
        .expect("create");
    let ev = next_event(&mut w, 10)
        .await
        .expect("event after a transient failure");
    assert_eq!(ev.resource_version, b.resource_version());
    assert!(handle.store_watches_for("pods").expect("pods") >= 2);

    faulty.inject(Fault::Compacted);
    let status = next_event(&mut w, 10)
        .await
        .expect_err("watchers end after a relist");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    // The relisted cache serves new watches, including the objects written before.
    let mut fresh = api.watch::<Pod>("", "", "", "").await.expect("watch");
    let mut names = Vec::new();
    for _ in 0..2 {
        let ev = next_event(&mut fresh, 5).await.expect("event");
        names.push(decode::<Pod>(&ev.object).name().to_string());
    }
    names.sort();
    assert_eq!(names, vec!["a", "b"]);
    let c = api
        .create("default", &pod("c", "", &[]))
        .await
        .expect("create");
    let ev = next_event(&mut fresh, 10).await.expect("event");
    assert_eq!(ev.resource_version, c.resource_version());
    handle.shutdown().await;
}
