//! Runs the conformance suite against both backends: the embedded store on a temporary file
//! and the etcd store on a real etcd server (which must be installed: this test fails, not
//! skips, without it).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::time::Duration;

use skiff_store::conformance;
use skiff_store::testutil::EtcdServer;
use skiff_store::{EmbeddedOptions, EmbeddedStore, EtcdStore, Store};

fn embedded_options() -> EmbeddedOptions {
    EmbeddedOptions {
        // The suite compacts explicitly; automatic compaction would race with it.
        compact_interval: Duration::ZERO,
        ..EmbeddedOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("store.redb"), embedded_options()).unwrap();
    conformance::run_all(&store, "/conformance").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = EmbeddedStore::open(&path, embedded_options()).unwrap();
    conformance::revisions_survive_restart(Box::new(store), "/restart", |store| async move {
        drop(store);
        Box::new(EmbeddedStore::open(&path, embedded_options()).unwrap()) as Box<dyn Store>
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store_conforms() {
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    let store = EtcdStore::connect(&etcd.endpoints()).await.unwrap();
    conformance::run_all(&store, "/conformance").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store_survives_restart() {
    let mut etcd = EtcdServer::start().unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    let store = EtcdStore::connect(&etcd.endpoints()).await.unwrap();
    let etcd_ref = &mut etcd;
    conformance::revisions_survive_restart(Box::new(store), "/restart", |store| async move {
        drop(store);
        etcd_ref.restart().unwrap();
        Box::new(EtcdStore::connect(&etcd_ref.endpoints()).await.unwrap()) as Box<dyn Store>
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_snapshots_restore_consistently() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("store.redb"), embedded_options()).unwrap();
    let restored = dir.path().join("restored.redb");
    conformance::snapshot_during_writes(&store, "/snap", dir.path(), |snapshot| async move {
        // A restore never overwrites a store file.
        std::fs::write(&restored, b"in use").unwrap();
        let e = skiff_store::restore_snapshot(&snapshot, &restored).unwrap_err();
        assert!(e.to_string().contains("exists"), "{e}");
        std::fs::remove_file(&restored).unwrap();
        // Nor restores what is no snapshot, leaving nothing behind.
        let junk = snapshot.with_extension("junk");
        std::fs::write(&junk, b"not a database").unwrap();
        let e = skiff_store::restore_snapshot(&junk, &restored).unwrap_err();
        assert!(
            e.to_string().contains("is not an embedded-store snapshot"),
            "{e}"
        );
        assert!(!restored.exists());
        let s = skiff_store::restore_snapshot(&snapshot, &restored).unwrap();
        assert_eq!(s.format, skiff_store::EMBEDDED_SNAPSHOT_FORMAT);
        Box::new(EmbeddedStore::open(&restored, embedded_options()).unwrap()) as Box<dyn Store>
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store_snapshots_restore_consistently() {
    let mut etcd = EtcdServer::start().unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    let store = EtcdStore::connect(&etcd.endpoints()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let etcd_ref = &mut etcd;
    conformance::snapshot_during_writes(&store, "/snap", dir.path(), |snapshot| async move {
        etcd_ref.restore(&snapshot).unwrap();
        Box::new(EtcdStore::connect(&etcd_ref.endpoints()).await.unwrap()) as Box<dyn Store>
    })
    .await;
}

#[tokio::test]
async fn etcd_connect_to_nothing_fails() {
    // A port nobody listens on: connect must fail, not hang.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let result = EtcdStore::connect(&[format!("http://127.0.0.1:{port}")]).await;
    assert!(result.is_err());
}
