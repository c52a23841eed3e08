//! The watch cache: one store watch per resource type, shared by every client watch.
//!
//! A [`WatchCache`] lists `/registry/<plural>/` once, then follows a single store watch from
//! the listing's revision. It keeps
//! - the current objects (for the synthetic ADDED events of a watch from resourceVersion ""
//!   or "0"), and
//! - a bounded ring buffer of the most recent decoded events (default 10,000).
//!
//! Every client watch is a task that copies events after its position out of the buffer
//! under a short read lock, filters them and sends them to its own bounded channel. A
//! `tokio::sync::watch` channel announces new events, so watchers never block each other
//! nor the feeder; a watcher whose client is too slow simply falls behind, and once its
//! position has been pushed out of the buffer it ends with `OutOfRange` ("too old resource
//! version", reason Expired), like Kubernetes' 410 Gone — the client relists.
//!
//! A watch from revision `R` is served if `R >= oldest`, where every event after `oldest` is
//! still in the buffer (at start `oldest` is the listing revision). A watch from an `R` the
//! cache has not seen yet just waits for later events (the events up to `R` were reflected in
//! the listing the client got `R` from); `R` beyond the store's current revision is refused.
//!
//! Objects are decoded and encoded once per event, not per watcher. The server's own writes
//! are not even decoded: the registry announces each write with the bytes it stores
//! ([`WatchCache::writing`]), and the writer and the event meet in one [`Pending`] slot:
//! whichever learns the revision first makes the cached object, which the other reuses
//! (the write's answer is its encoding). An event is matched by its bytes, so another
//! server's write, or a write that failed, is decoded as before.
//!
//! If the store watch fails it is reopened from the last revision seen (no gap). If the store
//! says that revision was compacted, the cache relists and every current watcher ends with
//! `OutOfRange`, since the events in between are lost.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use skiff_api::DynKind;
use skiff_api::rpc;
use skiff_api::selector::{FieldSelector, Selector};
use skiff_store::{Listing, Store, StoreError, WatchEvent as StoreEvent};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::Status;
use tracing::{debug, error, info, warn};

use crate::error::ApiError;
use crate::object::Object;
use crate::stored::{decode, key_prefix};

/// Events a watcher copies out of the buffer per lock acquisition.
const BATCH: usize = 256;
/// Events the feeder applies per write lock acquisition.
const FEED_BATCH: usize = 512;
/// Buffered events per client watch stream.
const WATCHER_CHANNEL: usize = 128;
/// Announced writes whose events the feed has not seen yet ([`WatchCache::writing`]); past
/// this many (failed writes, a store watch that fell behind) all are forgotten, and their
/// events decoded as anyone else's.
const WRITTEN_HINTS: usize = 4096;

/// The receiving end of a client watch.
pub type WatchReceiver = mpsc::Receiver<Result<rpc::WatchEvent, Status>>;

/// An object as the cache holds it: decoded (with resourceVersion and type meta set) and
/// encoded once for all watchers.
pub(crate) struct CachedObject<T> {
    pub obj: T,
    pub bytes: Vec<u8>,
    pub revision: i64,
}

impl<T: Object> CachedObject<T> {
    pub(crate) fn new(mut obj: T, revision: i64) -> Self {
        obj.metadata_mut().resource_version = revision.to_string();
        let bytes = obj.encode();
        CachedObject {
            obj,
            bytes,
            revision,
        }
    }

    /// The cached form of `obj` stored as `stored` in `revision` (its encoding derived from
    /// the stored one, [`Object::encode_at`]). `stored` must be `obj`'s own stored encoding
    /// (as a write announced it), not bytes read from the store, which another writer may
    /// have laid out differently.
    pub(crate) fn from_stored(mut obj: T, stored: &[u8], revision: i64) -> Self {
        obj.metadata_mut().resource_version = revision.to_string();
        let bytes = obj.encode_at(stored, revision);
        CachedObject {
            obj,
            bytes,
            revision,
        }
    }
}

/// A write in flight ([`WatchCache::writing`]): the object until the writer or the feed
/// learns its revision, then the cached object both use.
pub(crate) struct Pending<T> {
    stored: Vec<u8>,
    slot: Mutex<Slot<T>>,
}

enum Slot<T> {
    Waiting(T),
    Ready(Arc<CachedObject<T>>),
    Taken,
}

impl<T: Object> Pending<T> {
    /// The object stored in `revision`, as the cache holds it; `None` once the writer took
    /// it back (its write failed: the event is someone else's write of the same bytes).
    pub fn resolve(&self, revision: i64) -> Option<Arc<CachedObject<T>>> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        let cached = match std::mem::replace(&mut *slot, Slot::Taken) {
            Slot::Waiting(obj) => Arc::new(CachedObject::from_stored(obj, &self.stored, revision)),
            Slot::Ready(c) if c.revision == revision => c,
            // Someone else stored the same bytes in another revision first.
            Slot::Ready(c) => Arc::new(CachedObject::from_stored(
                c.obj.clone(),
                &self.stored,
                revision,
            )),
            Slot::Taken => return None,
        };
        *slot = Slot::Ready(Arc::clone(&cached));
        Some(cached)
    }

    fn take_back(&self) -> T {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *slot, Slot::Taken) {
            Slot::Waiting(obj) => obj,
            Slot::Ready(c) => {
                let mut obj = c.obj.clone();
                obj.metadata_mut().resource_version.clear();
                obj
            }
            // Only the writer takes back, once; the feed never empties the slot.
            Slot::Taken => unreachable!("a pending write is taken back only once"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventKind {
    Put,
    Delete,
}

struct CachedEvent<T> {
    revision: i64,
    kind: EventKind,
    /// Put: the new state. Delete: the last state, with resourceVersion = the delete revision.
    object: Arc<CachedObject<T>>,
    /// The state before this event, if the object existed.
    prev: Option<Arc<CachedObject<T>>>,
}

struct State<T> {
    /// Set on shutdown: watchers end.
    closed: bool,
    /// Bumped on a relist with a gap: watchers of an older epoch end with OutOfRange.
    epoch: u64,
    /// The revision the cache reflects (last event or listing).
    revision: i64,
    /// Every event with a revision greater than this is in `events`.
    oldest: i64,
    objects: HashMap<String, Arc<CachedObject<T>>>,
    events: VecDeque<Arc<CachedEvent<T>>>,
}

/// Which objects a list or watch wants.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    /// Empty: every namespace.
    pub namespace: String,
    pub labels: Selector,
    pub fields: FieldSelector,
}

const NO_LABELS: &BTreeMap<String, String> = &BTreeMap::new();

impl Filter {
    pub fn matches<T: Object>(&self, o: &T) -> bool {
        (self.namespace.is_empty() || o.namespace() == self.namespace)
            && self
                .labels
                .matches(o.metadata().map(|m| &m.labels).unwrap_or(NO_LABELS))
            && self.fields.matches(|p| o.field(p))
    }

    /// The client-facing event for a cache event, applying Kubernetes' rules for objects that
    /// start or stop matching: a change that makes an object match is ADDED, one that makes
    /// it stop matching is DELETED (carrying the previous state at the event's revision).
    fn convert<T: Object>(&self, ev: &CachedEvent<T>) -> Option<rpc::WatchEvent> {
        let now = self.matches(&ev.object.obj);
        let event = |ty: &str, object: Vec<u8>| rpc::WatchEvent {
            r#type: ty.to_string(),
            object,
            resource_version: ev.revision.to_string(),
        };
        match ev.kind {
            EventKind::Delete => now.then(|| event("DELETED", ev.object.bytes.clone())),
            EventKind::Put => {
                let before = ev.prev.as_ref().map(|p| self.matches(&p.obj));
                match (before, now) {
                    (Some(true), true) => Some(event("MODIFIED", ev.object.bytes.clone())),
                    (_, true) => Some(event("ADDED", ev.object.bytes.clone())),
                    (Some(true), false) => {
                        let prev = ev.prev.as_ref()?;
                        let mut last = prev.obj.clone();
                        last.metadata_mut().resource_version = ev.revision.to_string();
                        Some(event("DELETED", last.encode()))
                    }
                    _ => None,
                }
            }
        }
    }
}

/// Where a client watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// resourceVersion "" or "0": ADDED for every current object, then changes.
    Snapshot,
    /// Every change after this revision.
    After(i64),
}

/// The watch cache of one resource type. See the module documentation.
pub(crate) struct WatchCache<T: Object> {
    kind: Arc<T::Kind>,
    plural: &'static str,
    prefix: String,
    store: Arc<dyn Store>,
    capacity: usize,
    state: RwLock<State<T>>,
    changed: watch::Sender<u64>,
    store_watches: AtomicU64,
    feeder: Mutex<Option<JoinHandle<()>>>,
    /// Writes this server is making, by key ([`WatchCache::writing`]).
    written: Mutex<HashMap<String, Arc<Pending<T>>>>,
}

impl<T: Object> WatchCache<T> {
    /// Lists the resource's prefix and starts following it. Fails if the initial list fails.
    pub async fn start(
        kind: Arc<T::Kind>,
        store: Arc<dyn Store>,
        capacity: usize,
    ) -> Result<Arc<Self>, StoreError> {
        let info = kind.info();
        let prefix = key_prefix(info);
        let listing = store.list(&prefix, None).await?;
        let cache = Arc::new(WatchCache {
            kind,
            plural: info.plural,
            prefix,
            store,
            capacity: capacity.max(1),
            state: RwLock::new(State {
                closed: false,
                epoch: 0,
                revision: 0,
                oldest: 0,
                objects: HashMap::new(),
                events: VecDeque::new(),
            }),
            changed: watch::channel(0).0,
            store_watches: AtomicU64::new(0),
            feeder: Mutex::new(None),
            written: Mutex::new(HashMap::new()),
        });
        cache.replace(listing, false);
        let task = tokio::spawn(Arc::clone(&cache).feed());
        *cache.feeder.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        Ok(cache)
    }

    fn read(&self) -> RwLockReadGuard<'_, State<T>> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State<T>> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// How many store watches this cache has opened (1 unless the store watch failed).
    pub fn store_watches(&self) -> u64 {
        self.store_watches.load(Ordering::Relaxed)
    }

    /// Stops the feeder and ends every watcher.
    pub fn stop(&self) {
        self.write().closed = true;
        self.notify();
        if let Some(task) = self.feeder.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }

    /// Announces a write of `obj` (already encoded as `stored`) at `key`. The write's event
    /// and the writer meet in the returned [`Pending`]: whichever comes first turns the
    /// object into the cached one, so the store's copy is not decoded and the object is
    /// encoded once for the answer and every watcher. The event is recognised by its bytes.
    pub fn writing(&self, key: &str, stored: &[u8], obj: T) -> Arc<Pending<T>> {
        let pending = Arc::new(Pending {
            stored: stored.to_vec(),
            slot: Mutex::new(Slot::Waiting(obj)),
        });
        let mut hints = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if hints.len() >= WRITTEN_HINTS {
            // Writes whose events never came (failed writes, a store watch behind).
            hints.clear();
        }
        hints.insert(key.to_string(), Arc::clone(&pending));
        pending
    }

    /// A write announced with [`WatchCache::writing`] failed: its object back.
    pub fn abandon(&self, key: &str, pending: Arc<Pending<T>>) -> T {
        let mut hints = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if hints.get(key).is_some_and(|p| Arc::ptr_eq(p, &pending)) {
            hints.remove(key);
        }
        drop(hints);
        pending.take_back()
    }

    /// The announced write whose bytes this event carries, as the cached object.
    fn take_written(&self, key: &str, value: &[u8], revision: i64) -> Option<Arc<CachedObject<T>>> {
        let pending = {
            let mut hints = self.written.lock().unwrap_or_else(|e| e.into_inner());
            if hints.get(key)?.stored != value {
                return None;
            }
            hints.remove(key)?
        };
        pending.resolve(revision)
    }

    /// Replaces the cached state with a fresh listing. With `gap`, current watchers end.
    fn replace(&self, listing: Listing, gap: bool) {
        let mut objects = HashMap::with_capacity(listing.items.len());
        for kv in listing.items {
            match decode::<T>(self.kind.as_ref(), &kv.value, kv.mod_revision) {
                Ok(obj) => {
                    objects.insert(kv.key, Arc::new(CachedObject::new(obj, kv.mod_revision)));
                }
                Err(e) => error!(key = %kv.key, error = %e, "skipping undecodable object"),
            }
        }
        let mut st = self.write();
        st.objects = objects;
        st.events.clear();
        st.revision = listing.revision;
        st.oldest = listing.revision;
        if gap {
            st.epoch += 1;
        }
        drop(st);
        self.notify();
    }

    /// Applies store events in order. Objects are decoded and encoded before the write lock
    /// is taken, so watchers reading the buffer wait only for the bookkeeping.
    fn apply(&self, events: Vec<StoreEvent>) {
        let prepared: Vec<(String, EventKind, i64, Arc<CachedObject<T>>)> = events
            .into_iter()
            .filter_map(|ev| {
                let revision = ev.revision();
                let (kind, kv) = match ev {
                    StoreEvent::Put { kv, .. } => (EventKind::Put, kv),
                    StoreEvent::Delete { prev, .. } => (EventKind::Delete, prev),
                };
                // This server's own write of this revision: already decoded and encoded.
                if kind == EventKind::Put
                    && let Some(o) = self.take_written(&kv.key, &kv.value, revision)
                {
                    return Some((kv.key, kind, revision, o));
                }
                // A delete carries the last state, at the delete's revision.
                match decode::<T>(self.kind.as_ref(), &kv.value, revision) {
                    Ok(obj) => Some((
                        kv.key,
                        kind,
                        revision,
                        Arc::new(CachedObject::new(obj, revision)),
                    )),
                    Err(e) => {
                        error!(key = %kv.key, error = %e, "skipping undecodable object");
                        None
                    }
                }
            })
            .collect();
        let mut st = self.write();
        for (key, kind, revision, object) in prepared {
            if revision <= st.revision {
                continue;
            }
            st.revision = revision;
            let prev = match kind {
                EventKind::Put => st.objects.insert(key, Arc::clone(&object)),
                EventKind::Delete => st.objects.remove(&key),
            };
            st.events.push_back(Arc::new(CachedEvent {
                revision,
                kind,
                object,
                prev,
            }));
            while st.events.len() > self.capacity {
                if let Some(evicted) = st.events.pop_front() {
                    st.oldest = evicted.revision;
                }
            }
        }
        drop(st);
        self.notify();
    }

    /// The feeder: one store watch at a time, reopened on failure, relisting when the store
    /// compacted the revision the cache needs.
    async fn feed(self: Arc<Self>) {
        const MIN_DELAY: Duration = Duration::from_millis(50);
        const MAX_DELAY: Duration = Duration::from_secs(5);
        let mut delay = MIN_DELAY;
        let mut relist = false;
        loop {
            if relist {
                match self.store.list(&self.prefix, None).await {
                    Ok(listing) => {
                        info!(
                            resource = self.plural,
                            revision = listing.revision,
                            "watch cache relisted; ending current watchers"
                        );
                        self.replace(listing, true);
                        relist = false;
                    }
                    Err(e) => {
                        warn!(resource = self.plural, error = %e, "watch cache relist failed");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(MAX_DELAY);
                        continue;
                    }
                }
            }
            let from = self.read().revision;
            self.store_watches.fetch_add(1, Ordering::Relaxed);
            debug!(resource = self.plural, from, "opening store watch");
            let mut stream = match self.store.watch(&self.prefix, from).await {
                Ok(s) => s,
                Err(StoreError::Compacted { .. }) => {
                    relist = true;
                    continue;
                }
                Err(e) => {
                    warn!(resource = self.plural, error = %e, "store watch failed to open");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_DELAY);
                    continue;
                }
            };
            let mut ended = false;
            while !ended {
                let Some(first) = stream.next().await else {
                    break;
                };
                let mut batch = vec![first];
                while batch.len() < FEED_BATCH {
                    match stream.next().now_or_never() {
                        Some(Some(item)) => batch.push(item),
                        Some(None) => {
                            ended = true;
                            break;
                        }
                        None => break,
                    }
                }
                let mut events = Vec::with_capacity(batch.len());
                let mut failure = None;
                for item in batch {
                    match item {
                        Ok(ev) => events.push(ev),
                        Err(e) => {
                            failure = Some(e);
                            break;
                        }
                    }
                }
                if !events.is_empty() {
                    self.apply(events);
                    delay = MIN_DELAY;
                }
                match failure {
                    None => {}
                    Some(StoreError::Compacted { .. }) => {
                        relist = true;
                        ended = true;
                    }
                    Some(e) => {
                        warn!(resource = self.plural, error = %e, "store watch failed");
                        ended = true;
                    }
                }
            }
            if !relist {
                debug!(resource = self.plural, "store watch ended; reopening");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_DELAY);
            }
        }
    }

    /// Starts a client watch. The position is fixed when this returns, so every event
    /// written afterwards is delivered.
    pub async fn watch(
        self: &Arc<Self>,
        start: WatchStart,
        filter: Filter,
    ) -> Result<WatchReceiver, ApiError> {
        if let WatchStart::After(r) = start
            && r > self.read().revision
        {
            let current = self
                .store
                .current_revision()
                .await
                .map_err(ApiError::from_store)?;
            if r > current {
                return Err(ApiError::Expired(format!(
                    "too large resource version: {r}, current: {current}"
                )));
            }
        }
        // Subscribe before reading the state, so no notification after it is missed.
        let changed = self.changed.subscribe();
        let (snapshot, position, epoch) = {
            let st = self.read();
            if st.closed {
                return Err(ApiError::Unavailable(
                    "the API server is shutting down".into(),
                ));
            }
            match start {
                WatchStart::Snapshot => {
                    let mut snapshot: Vec<_> = st.objects.values().cloned().collect();
                    snapshot.sort_by_key(|o| o.revision);
                    (snapshot, st.revision, st.epoch)
                }
                WatchStart::After(r) if r < st.oldest => {
                    return Err(ApiError::Expired(format!(
                        "too old resource version: {r} ({})",
                        st.oldest
                    )));
                }
                WatchStart::After(r) => (Vec::new(), r, st.epoch),
            }
        };
        let (tx, rx) = mpsc::channel(WATCHER_CHANNEL);
        tokio::spawn(
            Arc::clone(self).serve_watcher(snapshot, position, epoch, filter, changed, tx),
        );
        Ok(rx)
    }

    async fn serve_watcher(
        self: Arc<Self>,
        snapshot: Vec<Arc<CachedObject<T>>>,
        mut position: i64,
        epoch: u64,
        filter: Filter,
        mut changed: watch::Receiver<u64>,
        tx: mpsc::Sender<Result<rpc::WatchEvent, Status>>,
    ) {
        for o in snapshot {
            if filter.matches(&o.obj) {
                let ev = rpc::WatchEvent {
                    r#type: "ADDED".into(),
                    object: o.bytes.clone(),
                    resource_version: o.revision.to_string(),
                };
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
        }
        loop {
            changed.borrow_and_update();
            let batch: Result<Vec<Arc<CachedEvent<T>>>, ApiError> = {
                let st = self.read();
                if st.closed {
                    Err(ApiError::Unavailable(
                        "the API server is shutting down".into(),
                    ))
                } else if st.epoch != epoch {
                    Err(ApiError::Expired(format!(
                        "too old resource version: {position} ({}): the watch cache was \
                         relisted",
                        st.oldest
                    )))
                } else if position < st.oldest {
                    Err(ApiError::Expired(format!(
                        "too old resource version: {position} ({}): the watcher fell behind",
                        st.oldest
                    )))
                } else {
                    let from = st.events.partition_point(|e| e.revision <= position);
                    Ok(st.events.range(from..).take(BATCH).cloned().collect())
                }
            };
            match batch {
                Err(e) => {
                    debug!(resource = self.plural, error = %e, "ending watcher");
                    let _ = tx.send(Err(e.to_status())).await;
                    return;
                }
                Ok(events) if events.is_empty() => {
                    tokio::select! {
                        r = changed.changed() => if r.is_err() { return },
                        _ = tx.closed() => return,
                    }
                }
                Ok(events) => {
                    for ev in events {
                        position = ev.revision;
                        if let Some(out) = filter.convert(&ev)
                            && tx.send(Ok(out)).await.is_err()
                        {
                            return;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ObjectMeta, Pod};

    fn pod(name: &str, labels: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: "ns".into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn event(kind: EventKind, now: Pod, prev: Option<Pod>) -> CachedEvent<Pod> {
        CachedEvent {
            revision: 9,
            kind,
            object: Arc::new(CachedObject::new(now, 9)),
            prev: prev.map(|p| Arc::new(CachedObject::new(p, 5))),
        }
    }

    #[test]
    fn filtered_events_follow_kubernetes_transitions() {
        let f = Filter {
            labels: Selector::parse("app=web").expect("selector"),
            ..Default::default()
        };
        let web = pod("a", &[("app", "web")]);
        let db = pod("a", &[("app", "db")]);
        let ty = |e: Option<rpc::WatchEvent>| e.map(|e| e.r#type);
        assert_eq!(
            ty(f.convert(&event(EventKind::Put, web.clone(), None))).as_deref(),
            Some("ADDED")
        );
        assert_eq!(
            ty(f.convert(&event(EventKind::Put, web.clone(), Some(web.clone())))).as_deref(),
            Some("MODIFIED")
        );
        assert_eq!(
            ty(f.convert(&event(EventKind::Put, web.clone(), Some(db.clone())))).as_deref(),
            Some("ADDED")
        );
        let gone = f
            .convert(&event(EventKind::Put, db.clone(), Some(web.clone())))
            .expect("deleted");
        assert_eq!(gone.r#type, "DELETED");
        let last = <Pod as prost::Message>::decode(gone.object.as_slice()).expect("decode");
        assert_eq!(
            last.metadata.as_ref().map(|m| m.labels["app"].as_str()),
            Some("web")
        );
        assert_eq!(last.resource_version(), "9");
        assert_eq!(
            f.convert(&event(EventKind::Put, db.clone(), Some(db.clone()))),
            None
        );
        assert_eq!(
            ty(f.convert(&event(EventKind::Delete, web, None))).as_deref(),
            Some("DELETED")
        );
        assert_eq!(f.convert(&event(EventKind::Delete, db, None)), None);
    }

    /// The writer and the feed meet in an announced write: the cache holds the writer's
    /// object (the same allocation), whichever of the two learns the revision first, and
    /// decodes writes that were not announced or were taken back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn announced_writes_are_not_decoded_again() {
        use skiff_api::KindOf;
        use skiff_store::{EmbeddedOptions, EmbeddedStore};
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(
            EmbeddedStore::open(&dir.path().join("db"), EmbeddedOptions::default()).expect("store"),
        );
        let cache =
            WatchCache::<Pod>::start(Arc::new(KindOf::<Pod>::default()), Arc::clone(&store), 100)
                .await
                .expect("cache");
        let held = |key: &str| cache.read().objects.get(key).cloned();
        let until_held = |key: String, revision: i64| {
            let cache = Arc::clone(&cache);
            async move {
                for _ in 0..500 {
                    if let Some(o) = cache.read().objects.get(&key).cloned()
                        && o.revision == revision
                    {
                        return o;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("{key} at {revision} never reached the cache");
            }
        };
        let written = |name: &str| {
            let mut p = pod(name, &[("app", name)]);
            let bytes = crate::stored::encode_for_store(&mut p);
            (format!("/registry/pods/ns/{name}"), bytes, p)
        };

        // The writer learns the revision first.
        let (key, bytes, p) = written("a");
        let pending = cache.writing(&key, &bytes, p);
        let kv = store.create(&key, bytes).await.expect("create");
        let mine = pending.resolve(kv.mod_revision).expect("resolved");
        let theirs = until_held(key.clone(), kv.mod_revision).await;
        assert!(
            Arc::ptr_eq(&mine, &theirs),
            "the feed decoded the writer's object again"
        );
        assert_eq!(
            mine.obj.metadata.as_ref().unwrap().resource_version,
            kv.mod_revision.to_string()
        );

        // The feed learns it first.
        let (key, bytes, p) = written("b");
        let pending = cache.writing(&key, &bytes, p);
        let kv = store.create(&key, bytes).await.expect("create");
        let theirs = until_held(key.clone(), kv.mod_revision).await;
        let mine = pending.resolve(kv.mod_revision).expect("resolved");
        assert!(
            Arc::ptr_eq(&mine, &theirs),
            "the writer encoded the object again"
        );

        // Taken back (the write failed); someone else's write of other bytes is decoded.
        let (key, bytes, p) = written("c");
        let pending = cache.writing(&key, &bytes, p.clone());
        assert_eq!(cache.abandon(&key, pending), p);
        let (_, other, _) = written("other");
        let kv = store.create(&key, other).await.expect("create");
        let theirs = until_held(key.clone(), kv.mod_revision).await;
        assert_eq!(theirs.obj.metadata.as_ref().unwrap().name, "other");
        assert!(held("/registry/pods/ns/missing").is_none());
        cache.stop();
    }
}
