//! A conformance suite every [`Store`] backend must pass (feature `conformance`).
//!
//! Each check is a public async function taking the store and a key prefix that no other
//! check uses; it panics (like an `assert!`) when the backend misbehaves. [`run_all`] runs every
//! check that needs nothing but a store, one after the other, ending with the compaction check
//! (compaction is store-wide). [`revisions_survive_restart`] additionally needs a way to
//! restart the backend.
//!
//! ```ignore
//! #[tokio::test]
//! async fn my_backend_conforms() {
//!     let store = MyStore::new();
//!     skiff_store::conformance::run_all(&store, "/conformance").await;
//! }
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a failed setup step is the calling test's failure"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use futures::{FutureExt, StreamExt};

use crate::{KeyValue, Store, StoreError, WatchEvent, WatchStream};

/// How long a check waits for an expected watch event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs every store-only check in sequence, each under its own sub-prefix of `prefix`.
pub async fn run_all(store: &dyn Store, prefix: &str) {
    let p = |name: &str| format!("{prefix}/{name}");
    create_and_get(store, &p("create_and_get")).await;
    create_existing_fails(store, &p("create_existing")).await;
    update_compare_and_swap(store, &p("update_cas")).await;
    concurrent_updates_one_wins(store, &p("concurrent_updates")).await;
    missing_keys(store, &p("missing_keys")).await;
    delete_compare_and_swap(store, &p("delete_cas")).await;
    list_by_prefix(store, &p("list_prefix")).await;
    list_at_old_revision(store, &p("list_old")).await;
    watch_sees_prev_values(store, &p("watch_prev")).await;
    watch_live(store, &p("watch_live")).await;
    watch_many_writes_in_order(store, &p("watch_many")).await;
    // Last: compaction discards history store-wide.
    compaction(store, &p("compaction")).await;
}

/// Waits for the next event of `stream`, failing on errors, the end of the stream or a timeout.
pub async fn next_event(stream: &mut WatchStream) -> WatchEvent {
    match tokio::time::timeout(EVENT_TIMEOUT, stream.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(e))) => panic!("watch failed: {e}"),
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("no watch event within {EVENT_TIMEOUT:?}"),
    }
}

/// Asserts that `stream` yields nothing for a short while.
pub async fn assert_quiet(stream: &mut WatchStream) {
    if let Ok(item) = tokio::time::timeout(Duration::from_millis(300), stream.next()).await {
        panic!("unexpected watch item: {item:?}");
    }
}

/// Asserts that watching `prefix` after `after` fails with [`StoreError::Compacted`], either
/// from `watch` itself or as the stream's first item.
pub async fn assert_watch_compacted(store: &dyn Store, prefix: &str, after: i64) {
    match store.watch(prefix, after).await {
        Err(StoreError::Compacted { .. }) => {}
        Err(e) => panic!("watch after {after}: expected Compacted, got {e}"),
        Ok(mut stream) => match tokio::time::timeout(EVENT_TIMEOUT, stream.next()).await {
            Ok(Some(Err(StoreError::Compacted { .. }))) => {
                assert!(
                    stream.next().await.is_none(),
                    "stream goes on after Compacted"
                );
            }
            other => panic!("watch after {after}: expected Compacted, got {other:?}"),
        },
    }
}

/// `create` returns the new key's revisions and `get` reads it back.
pub async fn create_and_get(store: &dyn Store, prefix: &str) {
    let key = format!("{prefix}/a");
    assert_eq!(store.get(&key).await.unwrap(), None);
    let before = store.current_revision().await.unwrap();
    let kv = store.create(&key, b"v1".to_vec()).await.unwrap();
    assert_eq!(kv.key, key);
    assert_eq!(kv.value, b"v1");
    assert_eq!(kv.create_revision, kv.mod_revision);
    assert!(kv.mod_revision > before, "revision did not advance");
    assert_eq!(store.get(&key).await.unwrap(), Some(kv.clone()));
    assert!(store.current_revision().await.unwrap() >= kv.mod_revision);

    let other = store
        .create(&format!("{prefix}/b"), Vec::new())
        .await
        .unwrap();
    assert!(
        other.mod_revision > kv.mod_revision,
        "revisions are not increasing"
    );
    assert_eq!(other.value, Vec::<u8>::new());
}

/// Creating an existing key fails with [`StoreError::AlreadyExists`] and changes nothing.
pub async fn create_existing_fails(store: &dyn Store, prefix: &str) {
    let key = format!("{prefix}/a");
    let kv = store.create(&key, b"first".to_vec()).await.unwrap();
    match store.create(&key, b"second".to_vec()).await {
        Err(StoreError::AlreadyExists { key: k }) => assert_eq!(k, key),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(store.get(&key).await.unwrap(), Some(kv));
}

/// `update` succeeds with the current revision and fails with [`StoreError::Conflict`] with a
/// stale one.
pub async fn update_compare_and_swap(store: &dyn Store, prefix: &str) {
    let key = format!("{prefix}/a");
    let v1 = store.create(&key, b"v1".to_vec()).await.unwrap();
    let v2 = store
        .update(&key, b"v2".to_vec(), v1.mod_revision)
        .await
        .unwrap();
    assert_eq!(v2.key, key);
    assert_eq!(v2.value, b"v2");
    assert_eq!(v2.create_revision, v1.create_revision);
    assert!(v2.mod_revision > v1.mod_revision);
    assert_eq!(store.get(&key).await.unwrap(), Some(v2.clone()));

    match store.update(&key, b"stale".to_vec(), v1.mod_revision).await {
        Err(StoreError::Conflict {
            key: k,
            expected,
            actual,
        }) => {
            assert_eq!(k, key);
            assert_eq!(expected, v1.mod_revision);
            assert_eq!(actual, v2.mod_revision);
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(store.get(&key).await.unwrap(), Some(v2.clone()));

    // Revision 0 is never a key's revision: it must not create or overwrite anything.
    assert!(matches!(
        store.update(&key, b"zero".to_vec(), 0).await,
        Err(StoreError::Conflict { .. })
    ));
    assert!(matches!(
        store
            .update(&format!("{prefix}/absent"), b"zero".to_vec(), 0)
            .await,
        Err(StoreError::NotFound { .. })
    ));
}

/// Two concurrent updates from the same revision: exactly one wins.
pub async fn concurrent_updates_one_wins(store: &dyn Store, prefix: &str) {
    for round in 0..5 {
        let key = format!("{prefix}/k{round}");
        let base = store.create(&key, b"base".to_vec()).await.unwrap();
        let (a, b) = tokio::join!(
            store.update(&key, b"a".to_vec(), base.mod_revision),
            store.update(&key, b"b".to_vec(), base.mod_revision),
        );
        let winner = match (a, b) {
            (Ok(kv), Err(StoreError::Conflict { actual, .. }))
            | (Err(StoreError::Conflict { actual, .. }), Ok(kv)) => {
                assert_eq!(actual, kv.mod_revision);
                kv
            }
            other => panic!("expected exactly one success and one Conflict, got {other:?}"),
        };
        assert_eq!(store.get(&key).await.unwrap(), Some(winner));
    }
}

/// Updating or deleting a missing key fails with [`StoreError::NotFound`].
pub async fn missing_keys(store: &dyn Store, prefix: &str) {
    let key = format!("{prefix}/missing");
    assert_eq!(store.get(&key).await.unwrap(), None);
    match store.update(&key, b"x".to_vec(), 1).await {
        Err(StoreError::NotFound { key: k }) => assert_eq!(k, key),
        other => panic!("update: expected NotFound, got {other:?}"),
    }
    match store.delete(&key, None).await {
        Err(StoreError::NotFound { key: k }) => assert_eq!(k, key),
        other => panic!("delete: expected NotFound, got {other:?}"),
    }
    match store.delete(&key, Some(1)).await {
        Err(StoreError::NotFound { key: k }) => assert_eq!(k, key),
        other => panic!("conditional delete: expected NotFound, got {other:?}"),
    }
    assert_eq!(store.get(&key).await.unwrap(), None);
}

/// `delete` is compare-and-swap when given a revision and returns the deleted value.
pub async fn delete_compare_and_swap(store: &dyn Store, prefix: &str) {
    let key = format!("{prefix}/a");
    let v1 = store.create(&key, b"v1".to_vec()).await.unwrap();
    let v2 = store
        .update(&key, b"v2".to_vec(), v1.mod_revision)
        .await
        .unwrap();
    match store.delete(&key, Some(v1.mod_revision)).await {
        Err(StoreError::Conflict {
            key: k,
            expected,
            actual,
        }) => {
            assert_eq!(k, key);
            assert_eq!(expected, v1.mod_revision);
            assert_eq!(actual, v2.mod_revision);
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(store.get(&key).await.unwrap(), Some(v2.clone()));

    let (prev, revision) = store.delete(&key, Some(v2.mod_revision)).await.unwrap();
    assert_eq!(prev, v2);
    assert!(revision > v2.mod_revision);
    assert_eq!(store.get(&key).await.unwrap(), None);
    assert!(store.current_revision().await.unwrap() >= revision);

    // Unconditional delete, and re-creation starts a new incarnation.
    let again = store.create(&key, b"v3".to_vec()).await.unwrap();
    assert!(again.create_revision > revision);
    let (prev, revision2) = store.delete(&key, None).await.unwrap();
    assert_eq!(prev, again);
    assert!(revision2 > again.mod_revision);
}

/// `list` returns exactly the keys under the prefix, in key order.
pub async fn list_by_prefix(store: &dyn Store, prefix: &str) {
    let keys = ["/a/b/2", "/a/b/1", "/a/bc/1", "/a/b/10", "/a/b", "/b/1"];
    let mut created = BTreeMap::new();
    for k in keys {
        let key = format!("{prefix}{k}");
        let kv = store.create(&key, k.as_bytes().to_vec()).await.unwrap();
        created.insert(key, kv);
    }
    let max_revision = created.values().map(|kv| kv.mod_revision).max().unwrap();

    let listing = store.list(&format!("{prefix}/a/b/"), None).await.unwrap();
    let got: Vec<&str> = listing.items.iter().map(|kv| kv.key.as_str()).collect();
    let want: Vec<String> = ["/a/b/1", "/a/b/10", "/a/b/2"]
        .iter()
        .map(|k| format!("{prefix}{k}"))
        .collect();
    assert_eq!(got, want, "sibling prefix leaked or wrong order");
    assert!(listing.revision >= max_revision);
    for kv in &listing.items {
        assert_eq!(Some(kv), created.get(&kv.key));
    }

    let listing = store.list(&format!("{prefix}/a/"), Some(0)).await.unwrap();
    let got: Vec<String> = listing.items.iter().map(|kv| kv.key.clone()).collect();
    let want: Vec<String> = ["/a/b", "/a/b/1", "/a/b/10", "/a/b/2", "/a/bc/1"]
        .iter()
        .map(|k| format!("{prefix}{k}"))
        .collect();
    assert_eq!(got, want);

    let empty = store.list(&format!("{prefix}/none/"), None).await.unwrap();
    assert!(empty.items.is_empty());
    assert!(empty.revision >= max_revision);
}

/// `list` at an older revision returns the state as it was then.
pub async fn list_at_old_revision(store: &dyn Store, prefix: &str) {
    let a1 = store
        .create(&format!("{prefix}/a"), b"a1".to_vec())
        .await
        .unwrap();
    let b1 = store
        .create(&format!("{prefix}/b"), b"b1".to_vec())
        .await
        .unwrap();
    let then = store.current_revision().await.unwrap();

    let a2 = store
        .update(&a1.key, b"a2".to_vec(), a1.mod_revision)
        .await
        .unwrap();
    store.delete(&b1.key, None).await.unwrap();
    let c1 = store
        .create(&format!("{prefix}/c"), b"c1".to_vec())
        .await
        .unwrap();

    let old = store.list(&format!("{prefix}/"), Some(then)).await.unwrap();
    assert_eq!(old.revision, then);
    assert_eq!(old.items, vec![a1.clone(), b1.clone()]);

    let between = store
        .list(&format!("{prefix}/"), Some(a2.mod_revision))
        .await
        .unwrap();
    assert_eq!(between.items, vec![a2.clone(), b1]);

    let now = store.list(&format!("{prefix}/"), None).await.unwrap();
    assert_eq!(now.items, vec![a2, c1.clone()]);
    assert!(now.revision >= c1.mod_revision);

    let current = store.current_revision().await.unwrap();
    match store
        .list(&format!("{prefix}/"), Some(current + 1000))
        .await
    {
        Err(StoreError::FutureRevision {
            requested,
            current: c,
        }) => {
            assert_eq!(requested, current + 1000);
            assert!(c >= current);
        }
        other => panic!("expected FutureRevision, got {other:?}"),
    }
}

/// Watch events carry the previous value: `Put` after an update, `Delete` always.
pub async fn watch_sees_prev_values(store: &dyn Store, prefix: &str) {
    let start = store.current_revision().await.unwrap();
    let mut watch = store.watch(&format!("{prefix}/"), start).await.unwrap();
    let key = format!("{prefix}/a");
    let v1 = store.create(&key, b"v1".to_vec()).await.unwrap();
    let v2 = store
        .update(&key, b"v2".to_vec(), v1.mod_revision)
        .await
        .unwrap();
    let (_, deleted_at) = store.delete(&key, None).await.unwrap();

    assert_eq!(
        next_event(&mut watch).await,
        WatchEvent::Put {
            kv: v1.clone(),
            prev: None
        }
    );
    assert_eq!(
        next_event(&mut watch).await,
        WatchEvent::Put {
            kv: v2.clone(),
            prev: Some(v1)
        }
    );
    let delete = next_event(&mut watch).await;
    assert_eq!(
        delete,
        WatchEvent::Delete {
            prev: v2,
            revision: deleted_at
        }
    );
    assert_eq!(delete.revision(), deleted_at);
    assert_eq!(delete.key(), key);
    assert_quiet(&mut watch).await;
}

/// A watch started before writes sees them as they happen, and only under its prefix.
pub async fn watch_live(store: &dyn Store, prefix: &str) {
    let old = store
        .create(&format!("{prefix}/w/old"), b"old".to_vec())
        .await
        .unwrap();
    let listing = store.list(&format!("{prefix}/w/"), None).await.unwrap();
    let mut watch = store
        .watch(&format!("{prefix}/w/"), listing.revision)
        .await
        .unwrap();
    let mut sibling = store
        .watch(&format!("{prefix}/wx/"), listing.revision)
        .await
        .unwrap();
    // Nothing at or before the start revision is replayed.
    assert_quiet(&mut watch).await;

    for i in 0..5 {
        let kv = store
            .create(&format!("{prefix}/w/{i}"), vec![i])
            .await
            .unwrap();
        assert_eq!(
            next_event(&mut watch).await,
            WatchEvent::Put { kv, prev: None },
            "live event {i}"
        );
        // A write outside the prefix, and in the sibling prefix `{prefix}/wx/`.
        store
            .create(&format!("{prefix}/x{i}"), vec![i])
            .await
            .unwrap();
        let s = store
            .create(&format!("{prefix}/wx/{i}"), vec![i])
            .await
            .unwrap();
        assert_eq!(
            next_event(&mut sibling).await,
            WatchEvent::Put { kv: s, prev: None }
        );
    }
    let (prev, revision) = store.delete(&old.key, None).await.unwrap();
    assert_eq!(
        next_event(&mut watch).await,
        WatchEvent::Delete { prev, revision }
    );
    assert_quiet(&mut watch).await;
}

/// What a write did, to compare with what watches report.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Change {
    revision: i64,
    key: String,
    /// `None` for a delete.
    value: Option<Vec<u8>>,
}

impl From<&WatchEvent> for Change {
    fn from(event: &WatchEvent) -> Self {
        match event {
            WatchEvent::Put { kv, .. } => Change {
                revision: kv.mod_revision,
                key: kv.key.clone(),
                value: Some(kv.value.clone()),
            },
            WatchEvent::Delete { prev, revision } => Change {
                revision: *revision,
                key: prev.key.clone(),
                value: None,
            },
        }
    }
}

async fn collect_changes(stream: &mut WatchStream, n: usize) -> Vec<Change> {
    let mut changes = Vec::with_capacity(n);
    for _ in 0..n {
        let event = next_event(stream).await;
        if let Some(last) = changes.last() {
            let last: &Change = last;
            assert!(
                event.revision() > last.revision,
                "revisions not strictly increasing: {} after {}",
                event.revision(),
                last.revision
            );
        }
        changes.push(Change::from(&event));
    }
    changes
}

/// 1 000 rapid writes from concurrent writers: watches (live, replayed from the start and
/// from the middle) see every change exactly once, in revision order, without gaps.
pub async fn watch_many_writes_in_order(store: &dyn Store, prefix: &str) {
    const WRITERS: usize = 4;
    const OPS_PER_WRITER: usize = 250;
    const KEYS_PER_WRITER: usize = 5;
    let total = WRITERS * OPS_PER_WRITER;

    let start = store.current_revision().await.unwrap();
    let mut live = store.watch(&format!("{prefix}/"), start).await.unwrap();

    let writer = |w: usize| async move {
        let mut changes = Vec::with_capacity(OPS_PER_WRITER);
        let mut state: BTreeMap<usize, KeyValue> = BTreeMap::new();
        for op in 0..OPS_PER_WRITER {
            let k = op % KEYS_PER_WRITER;
            let key = format!("{prefix}/w{w}/k{k}");
            let value = format!("{w}-{op}").into_bytes();
            let change = match state.remove(&k) {
                None => {
                    let kv = store.create(&key, value.clone()).await.unwrap();
                    state.insert(k, kv.clone());
                    Change {
                        revision: kv.mod_revision,
                        key,
                        value: Some(value),
                    }
                }
                Some(current) if (op / KEYS_PER_WRITER) % 4 == 3 => {
                    let (_, revision) = store
                        .delete(&key, Some(current.mod_revision))
                        .await
                        .unwrap();
                    Change {
                        revision,
                        key,
                        value: None,
                    }
                }
                Some(current) => {
                    let kv = store
                        .update(&key, value.clone(), current.mod_revision)
                        .await
                        .unwrap();
                    state.insert(k, kv.clone());
                    Change {
                        revision: kv.mod_revision,
                        key,
                        value: Some(value),
                    }
                }
            };
            changes.push(change);
        }
        changes
    };
    let (a, b, c, d) = tokio::join!(writer(0), writer(1), writer(2), writer(3));
    let mut written: Vec<Change> = [a, b, c, d].concat();
    written.sort();
    let revisions: BTreeSet<i64> = written.iter().map(|c| c.revision).collect();
    assert_eq!(revisions.len(), total, "two writes got the same revision");

    let got_live = collect_changes(&mut live, total).await;
    assert_eq!(got_live, written, "live watch differs from the writes");
    assert_quiet(&mut live).await;

    let mut replay = store.watch(&format!("{prefix}/"), start).await.unwrap();
    let got_replay = collect_changes(&mut replay, total).await;
    assert_eq!(
        got_replay, written,
        "replayed watch differs from the writes"
    );
    assert_quiet(&mut replay).await;

    // From the middle: exactly the changes after that revision.
    let middle = written[total / 2].revision;
    let mut from_middle = store.watch(&format!("{prefix}/"), middle).await.unwrap();
    let expected: Vec<Change> = written
        .iter()
        .filter(|c| c.revision > middle)
        .cloned()
        .collect();
    let got = collect_changes(&mut from_middle, expected.len()).await;
    assert_eq!(got, expected);

    // One writer's keys only.
    let mut one = store.watch(&format!("{prefix}/w1/"), start).await.unwrap();
    let expected: Vec<Change> = written
        .iter()
        .filter(|c| c.key.starts_with(&format!("{prefix}/w1/")))
        .cloned()
        .collect();
    assert_eq!(expected.len(), OPS_PER_WRITER);
    let got = collect_changes(&mut one, expected.len()).await;
    assert_eq!(got, expected);
}

/// After `compact(rev)`, listings older than `rev` and watches after revisions older than `rev`
/// fail with [`StoreError::Compacted`]; listing at `rev` and watching after `rev` keep working.
/// Compacts the whole store.
pub async fn compaction(store: &dyn Store, prefix: &str) {
    let key = format!("{prefix}/a");
    let v1 = store.create(&key, b"v1".to_vec()).await.unwrap();
    let v2 = store
        .update(&key, b"v2".to_vec(), v1.mod_revision)
        .await
        .unwrap();
    let v3 = store
        .update(&key, b"v3".to_vec(), v2.mod_revision)
        .await
        .unwrap();
    let v4 = store
        .update(&key, b"v4".to_vec(), v3.mod_revision)
        .await
        .unwrap();

    store.compact(v3.mod_revision).await.unwrap();

    match store
        .list(&format!("{prefix}/"), Some(v1.mod_revision))
        .await
    {
        Err(StoreError::Compacted {
            requested,
            compacted,
        }) => {
            assert_eq!(requested, v1.mod_revision);
            assert_eq!(compacted, v3.mod_revision);
        }
        other => panic!("expected Compacted, got {other:?}"),
    }
    let at = store
        .list(&format!("{prefix}/"), Some(v3.mod_revision))
        .await
        .unwrap();
    assert_eq!(at.items, vec![v3.clone()]);
    let now = store.list(&format!("{prefix}/"), None).await.unwrap();
    assert_eq!(now.items, vec![v4.clone()]);

    assert_watch_compacted(store, &format!("{prefix}/"), v1.mod_revision).await;
    // The change at v3 itself needs v2 for its previous value, which is gone.
    assert_watch_compacted(store, &format!("{prefix}/"), v3.mod_revision - 1).await;
    // Watching after v3 works: it needs only v3 and later.
    let mut watch = store
        .watch(&format!("{prefix}/"), v3.mod_revision)
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut watch).await,
        WatchEvent::Put {
            kv: v4,
            prev: Some(v3.clone())
        }
    );

    // Compacting again at or below the compacted revision is a no-op.
    store.compact(v3.mod_revision).await.unwrap();
    store.compact(v1.mod_revision).await.unwrap();
    let current = store.current_revision().await.unwrap();
    match store.compact(current + 1000).await {
        Err(StoreError::FutureRevision { requested, .. }) => assert_eq!(requested, current + 1000),
        other => panic!("expected FutureRevision, got {other:?}"),
    }
}

/// Revisions and data survive a restart of the backend, and new writes continue above them.
/// `restart` must shut `store` down and return a fresh handle on the same data.
pub async fn revisions_survive_restart<F, Fut>(store: Box<dyn Store>, prefix: &str, restart: F)
where
    F: FnOnce(Box<dyn Store>) -> Fut,
    Fut: Future<Output = Box<dyn Store>>,
{
    let key = format!("{prefix}/a");
    let v1 = store.create(&key, b"v1".to_vec()).await.unwrap();
    let v2 = store
        .update(&key, b"v2".to_vec(), v1.mod_revision)
        .await
        .unwrap();
    let gone = store
        .create(&format!("{prefix}/gone"), b"x".to_vec())
        .await
        .unwrap();
    store.delete(&gone.key, None).await.unwrap();
    let before = store.current_revision().await.unwrap();

    let store = restart(store).await;

    assert_eq!(store.current_revision().await.unwrap(), before);
    assert_eq!(store.get(&key).await.unwrap(), Some(v2.clone()));
    assert_eq!(store.get(&gone.key).await.unwrap(), None);
    let v3 = store
        .update(&key, b"v3".to_vec(), v2.mod_revision)
        .await
        .unwrap();
    assert!(
        v3.mod_revision > before,
        "revision went backwards after restart"
    );
    let old = store
        .list(&format!("{prefix}/"), Some(v1.mod_revision))
        .await
        .unwrap();
    assert_eq!(old.items, vec![v1.clone()]);

    // History from before the restart is still watchable.
    let mut watch = store
        .watch(&format!("{prefix}/"), v1.mod_revision)
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut watch).await,
        WatchEvent::Put {
            kv: v2.clone(),
            prev: Some(v1)
        }
    );
}

/// A snapshot taken while writers run holds exactly the writes up to its revision: restored
/// (by `restore`, which gets the snapshot's path and returns a store over it), every key a
/// writer saw acknowledged at or below that revision is there with its value and revisions,
/// none above it, and the restored store is at that revision and takes new writes above it.
/// `dir` holds the snapshot file.
pub async fn snapshot_during_writes<F, Fut>(
    store: &dyn Store,
    prefix: &str,
    dir: &std::path::Path,
    restore: F,
) where
    F: FnOnce(std::path::PathBuf) -> Fut,
    Fut: Future<Output = Box<dyn Store>>,
{
    const WRITERS: usize = 4;
    const PER_WRITER: usize = 150;
    let acked = std::sync::Mutex::new(Vec::<KeyValue>::new());
    let writers = futures::future::join_all((0..WRITERS).map(|w| {
        let acked = &acked;
        async move {
            for i in 0..PER_WRITER {
                let key = format!("{prefix}/w{w}-{i:04}");
                let kv = store.create(&key, key.as_bytes().to_vec()).await.unwrap();
                acked.lock().unwrap().push(kv);
            }
        }
    }));
    let path = dir.join("snapshot.db");
    let snapshotter = async {
        // Mid-way through the writes.
        while acked.lock().unwrap().len() < WRITERS * PER_WRITER / 2 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        store.snapshot(&path).await.unwrap()
    };
    let ((), snapshot) = futures::join!(writers.map(|_| ()), snapshotter);
    let acked = acked.into_inner().unwrap();
    assert!(snapshot.bytes > 0, "{snapshot:?}");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600, "the snapshot file's mode");
        // Written beside its destination and renamed: no temporary left.
        let left: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.') || n.ends_with(".tmp"))
            .collect();
        assert!(
            left.is_empty(),
            "temporaries left beside the snapshot: {left:?}"
        );
        // A snapshot never replaces a file.
        let e = store.snapshot(&path).await.unwrap_err();
        assert!(e.to_string().contains("exists"), "{e}");
    }
    let restored = restore(path).await;
    // The store's revision after the restore is the snapshot's (which a backend may not
    // name).
    let revision = restored.current_revision().await.unwrap();
    if let Some(r) = snapshot.revision {
        assert_eq!(revision, r, "the restored store's revision");
    }
    let (before, after): (Vec<_>, Vec<_>) =
        acked.iter().partition(|kv| kv.mod_revision <= revision);
    assert!(
        !before.is_empty() && !after.is_empty(),
        "the snapshot (revision {revision}) was not taken during the writes"
    );
    let listing = restored.list(&format!("{prefix}/"), None).await.unwrap();
    let got: BTreeMap<&str, &KeyValue> = listing
        .items
        .iter()
        .map(|kv| (kv.key.as_str(), kv))
        .collect();
    for kv in &before {
        assert_eq!(
            got.get(kv.key.as_str()),
            Some(kv),
            "acknowledged before the snapshot"
        );
    }
    for kv in &after {
        assert!(
            !got.contains_key(kv.key.as_str()),
            "{} was written after the snapshot",
            kv.key
        );
    }
    assert_eq!(got.len(), before.len(), "keys nobody wrote");
    let next = restored
        .create(&format!("{prefix}/after-restore"), b"x".to_vec())
        .await
        .unwrap();
    assert!(next.mod_revision > revision);
}
