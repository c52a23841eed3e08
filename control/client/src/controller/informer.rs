//! [`Informer`]: a reflector feeding a shared, indexed cache of one resource type, with change
//! notifications; [`Informers`]: one informer per type, shared by every controller of a
//! process.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::{Stream, StreamExt};
use skiff_api::Resource;
use skiff_api::api::OwnerReference;
use skiff_api::selector::{Requirement, Selector};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::key::ObjectKey;
use crate::reflector::{Event, reflector};
use crate::{Api, Client, ListParams};

/// Index of objects by namespace.
pub const NAMESPACE_INDEX: &str = "namespace";
/// Index of objects by label, with values `key=value`.
pub const LABEL_INDEX: &str = "label";
/// Index of objects by the uid of their controller (the ownerReference with
/// `controller: true`).
pub const OWNER_INDEX: &str = "owner";
/// Index of objects by the uid of every owner they reference (any ownerReference, controller
/// or not): an owner's dependents, as the garbage collector sees them.
pub const OWNER_REF_INDEX: &str = "ownerRef";
/// Index of objects by `spec.nodeName` (pods; objects without the field are not indexed).
pub const NODE_INDEX: &str = "node";

/// Computes the values under which an object is indexed.
pub type IndexFn<T> = Arc<dyn Fn(&T) -> Vec<String> + Send + Sync>;

/// The ownerReference of `obj` that has `controller: true`, if any.
pub fn controller_of<T: Resource>(obj: &T) -> Option<&OwnerReference> {
    obj.metadata()?
        .owner_references
        .iter()
        .find(|o| o.controller == Some(true))
}

/// The indexes every informer keeps.
fn default_indexes<T: Resource>() -> Vec<(&'static str, IndexFn<T>)> {
    vec![
        (
            NAMESPACE_INDEX,
            Arc::new(|o: &T| vec![o.namespace().to_string()]),
        ),
        (
            LABEL_INDEX,
            Arc::new(|o: &T| {
                o.metadata()
                    .map(|m| m.labels.iter().map(|(k, v)| format!("{k}={v}")).collect())
                    .unwrap_or_default()
            }),
        ),
        (
            OWNER_INDEX,
            Arc::new(|o: &T| {
                controller_of(o)
                    .map(|r| r.uid.clone())
                    .into_iter()
                    .collect()
            }),
        ),
        (
            OWNER_REF_INDEX,
            Arc::new(|o: &T| {
                let mut uids: Vec<String> = o
                    .metadata()
                    .map(|m| m.owner_references.iter().map(|r| r.uid.clone()).collect())
                    .unwrap_or_default();
                uids.sort();
                uids.dedup();
                uids
            }),
        ),
        (
            NODE_INDEX,
            Arc::new(|o: &T| {
                o.field("spec.nodeName")
                    .filter(|n| !n.is_empty())
                    .into_iter()
                    .collect()
            }),
        ),
    ]
}

/// A change to the cache, as seen by subscribers.
#[derive(Debug, Clone)]
pub enum Change<T> {
    Added(Arc<T>),
    Updated { old: Arc<T>, new: Arc<T> },
    Deleted(Arc<T>),
}

impl<T> Change<T> {
    /// The object's current state (its last state for a delete).
    pub fn object(&self) -> &Arc<T> {
        match self {
            Change::Added(o) | Change::Deleted(o) => o,
            Change::Updated { new, .. } => new,
        }
    }

    /// The object's states this change involves: the old one too for an update (a controller
    /// may care about both, e.g. when a pod's owner or labels changed).
    pub fn objects(&self) -> impl Iterator<Item = &Arc<T>> {
        let (a, b) = match self {
            Change::Added(o) | Change::Deleted(o) => (o, None),
            Change::Updated { old, new } => (new, Some(old)),
        };
        std::iter::once(a).chain(b)
    }
}

struct Cache<T> {
    objects: BTreeMap<ObjectKey, Arc<T>>,
    /// index name → value → keys.
    indexes: HashMap<&'static str, HashMap<String, BTreeSet<ObjectKey>>>,
    subscribers: Vec<mpsc::UnboundedSender<Change<T>>>,
}

struct InformerInner<T> {
    cache: RwLock<Cache<T>>,
    indexers: Vec<(&'static str, IndexFn<T>)>,
    synced: watch::Sender<bool>,
    /// The highest resourceVersion the cache reflects; raised only after the cache has it.
    revision: watch::Sender<u64>,
    resource: &'static str,
}

fn revision_of<T: Resource>(o: &T) -> u64 {
    o.resource_version().parse().unwrap_or(0)
}

impl<T: Resource> InformerInner<T> {
    fn read(&self) -> RwLockReadGuard<'_, Cache<T>> {
        self.cache.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Cache<T>> {
        self.cache.write().unwrap_or_else(|e| e.into_inner())
    }

    fn unindex(&self, cache: &mut Cache<T>, key: &ObjectKey, obj: &T) {
        for (name, f) in &self.indexers {
            let Some(index) = cache.indexes.get_mut(name) else {
                continue;
            };
            for v in f(obj) {
                if let Some(keys) = index.get_mut(&v) {
                    keys.remove(key);
                    if keys.is_empty() {
                        index.remove(&v);
                    }
                }
            }
        }
    }

    fn index(&self, cache: &mut Cache<T>, key: &ObjectKey, obj: &T) {
        for (name, f) in &self.indexers {
            let index = cache.indexes.entry(name).or_default();
            for v in f(obj) {
                index.entry(v).or_default().insert(key.clone());
            }
        }
    }

    /// Stores `obj`; returns the change, `None` if the cache already had this version.
    fn upsert(&self, cache: &mut Cache<T>, obj: T) -> Option<Change<T>> {
        let key = ObjectKey::of(&obj);
        let new = Arc::new(obj);
        let old = cache.objects.insert(key.clone(), new.clone());
        if let Some(old) = &old {
            self.unindex(cache, &key, old);
        }
        self.index(cache, &key, &new);
        match old {
            None => Some(Change::Added(new)),
            Some(old) if old.resource_version() == new.resource_version() && *old == *new => None,
            Some(old) => Some(Change::Updated { old, new }),
        }
    }

    fn remove(&self, cache: &mut Cache<T>, key: &ObjectKey) -> Option<Arc<T>> {
        let old = cache.objects.remove(key)?;
        self.unindex(cache, key, &old);
        Some(old)
    }

    fn apply(&self, event: Event<T>) {
        let mut cache = self.write();
        let mut changes = Vec::new();
        let revision: u64;
        match event {
            Event::Restarted(items) => {
                let fresh: BTreeSet<ObjectKey> = items.iter().map(ObjectKey::of).collect();
                let gone: Vec<ObjectKey> = cache
                    .objects
                    .keys()
                    .filter(|k| !fresh.contains(k))
                    .cloned()
                    .collect();
                for k in gone {
                    if let Some(old) = self.remove(&mut cache, &k) {
                        changes.push(Change::Deleted(old));
                    }
                }
                // The reflector does not pass the list's revision on; the newest object's is a
                // lower bound.
                revision = items.iter().map(revision_of).max().unwrap_or(0);
                for o in items {
                    changes.extend(self.upsert(&mut cache, o));
                }
            }
            Event::Applied(o) => {
                revision = revision_of(&o);
                changes.extend(self.upsert(&mut cache, o));
            }
            Event::Deleted(o) => {
                revision = revision_of(&o);
                if let Some(old) = self.remove(&mut cache, &ObjectKey::of(&o)) {
                    changes.push(Change::Deleted(old));
                }
            }
        }
        if !changes.is_empty() {
            cache
                .subscribers
                .retain(|s| changes.iter().all(|c| s.send(c.clone()).is_ok()));
        }
        self.revision.send_if_modified(|r| {
            let raise = revision > *r;
            if raise {
                *r = revision;
            }
            raise
        });
        drop(cache);
        self.synced
            .send_if_modified(|s| !std::mem::replace(s, true));
    }
}

/// Aborts the reflector task when the last clone of the informer goes away.
struct TaskGuard(JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The objects of one type (all namespaces, or those `ListParams` select), kept current by a
/// reflector, with indexes. Cheap to clone; clones share the cache and the watch. The watch
/// stops when the last clone is dropped.
pub struct Informer<T> {
    shared: Arc<InformerInner<T>>,
    _task: Arc<TaskGuard>,
}

impl<T> Clone for Informer<T> {
    fn clone(&self) -> Self {
        Informer {
            shared: Arc::clone(&self.shared),
            _task: Arc::clone(&self._task),
        }
    }
}

impl<T: Resource> fmt::Debug for Informer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Informer")
            .field("resource", &self.shared.resource)
            .field("objects", &self.len())
            .field("synced", &self.has_synced())
            .finish()
    }
}

impl<T: Resource> Informer<T> {
    /// Starts an informer on the objects `api` and `lp` select, with the default indexes
    /// ([`NAMESPACE_INDEX`], [`LABEL_INDEX`], [`OWNER_INDEX`], [`OWNER_REF_INDEX`],
    /// [`NODE_INDEX`]). Must be called
    /// within a tokio runtime.
    pub fn new(api: Api<T>, lp: ListParams) -> Self {
        Self::with_indexes(api, lp, Vec::new())
    }

    /// Like [`Informer::new`] with extra indexes.
    pub fn with_indexes(
        api: Api<T>,
        lp: ListParams,
        extra: Vec<(&'static str, IndexFn<T>)>,
    ) -> Self {
        let mut indexers = default_indexes::<T>();
        indexers.extend(extra);
        let shared = Arc::new(InformerInner {
            cache: RwLock::new(Cache {
                objects: BTreeMap::new(),
                indexes: HashMap::new(),
                subscribers: Vec::new(),
            }),
            indexers,
            synced: watch::channel(false).0,
            revision: watch::channel(0).0,
            resource: T::INFO.plural,
        });
        let task = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                let events = reflector(api, lp);
                tokio::pin!(events);
                while let Some(ev) = events.next().await {
                    shared.apply(ev);
                }
            }
        });
        Informer {
            shared,
            _task: Arc::new(TaskGuard(task)),
        }
    }

    /// Whether the first list has been loaded (the cache is a complete view).
    pub fn has_synced(&self) -> bool {
        *self.shared.synced.borrow()
    }

    /// Waits until [`Informer::has_synced`].
    pub async fn wait_synced(&self) {
        let mut rx = self.shared.synced.subscribe();
        // The sender lives as long as `self`, so this only ends when synced.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The highest resourceVersion the cache reflects (0 before the first list). Once it is at
    /// least the revision of a write to an object of this type, the cache has seen the write.
    pub fn revision(&self) -> u64 {
        *self.shared.revision.borrow()
    }

    /// Waits until [`Informer::revision`] is at least `revision`, e.g. the resourceVersion a
    /// write of ours returned: the cache then reflects that write (or a later state). Every
    /// write to an object the informer selects raises its revision, so this completes once the
    /// watch delivers the write; bound it with a timeout anyway (a relist only raises the
    /// revision to its newest object's).
    pub async fn wait_for_revision(&self, revision: u64) {
        let mut rx = self.shared.revision.subscribe();
        let _ = rx.wait_for(|r| *r >= revision).await;
    }

    pub fn get(&self, key: &ObjectKey) -> Option<Arc<T>> {
        self.shared.read().objects.get(key).cloned()
    }

    /// Every object, in key order.
    pub fn list(&self) -> Vec<Arc<T>> {
        self.shared.read().objects.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.shared.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects indexed under `value` in index `index`, in key order.
    pub fn by_index(&self, index: &str, value: &str) -> Vec<Arc<T>> {
        let cache = self.shared.read();
        cache
            .indexes
            .get(index)
            .and_then(|i| i.get(value))
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| cache.objects.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn by_namespace(&self, namespace: &str) -> Vec<Arc<T>> {
        self.by_index(NAMESPACE_INDEX, namespace)
    }

    pub fn by_label(&self, key: &str, value: &str) -> Vec<Arc<T>> {
        self.by_index(LABEL_INDEX, &format!("{key}={value}"))
    }

    /// The objects whose controller has uid `uid`.
    pub fn by_owner(&self, uid: &str) -> Vec<Arc<T>> {
        self.by_index(OWNER_INDEX, uid)
    }

    /// The objects with any ownerReference (controller or not) to uid `uid`: the owner's
    /// dependents.
    pub fn by_owner_ref(&self, uid: &str) -> Vec<Arc<T>> {
        self.by_index(OWNER_REF_INDEX, uid)
    }

    /// The objects (pods) bound to node `node`.
    pub fn by_node(&self, node: &str) -> Vec<Arc<T>> {
        self.by_index(NODE_INDEX, node)
    }

    /// The objects in `namespace` (every namespace for `None`) whose labels `selector`
    /// matches. Uses the label index when the selector has an equality requirement.
    pub fn select(&self, namespace: Option<&str>, selector: &Selector) -> Vec<Arc<T>> {
        let candidates = selector
            .requirements
            .iter()
            .find_map(|r| match r {
                Requirement::Equals(k, v) => Some(self.by_label(k, v)),
                _ => None,
            })
            .unwrap_or_else(|| match namespace {
                Some(ns) => self.by_namespace(ns),
                None => self.list(),
            });
        candidates
            .into_iter()
            .filter(|o| namespace.is_none_or(|ns| o.namespace() == ns))
            .filter(|o| {
                let empty = BTreeMap::new();
                selector.matches(o.metadata().map(|m| &m.labels).unwrap_or(&empty))
            })
            .collect()
    }

    /// A stream of the changes to the cache from now on, preceded by an `Added` for every
    /// object already in it, so a subscriber misses nothing whenever it subscribes.
    pub fn subscribe(&self) -> Subscription<T> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut cache = self.shared.write();
        for o in cache.objects.values() {
            let _ = tx.send(Change::Added(o.clone()));
        }
        cache.subscribers.push(tx);
        Subscription { rx }
    }
}

/// Changes of an informer's cache; see [`Informer::subscribe`].
pub struct Subscription<T> {
    rx: mpsc::UnboundedReceiver<Change<T>>,
}

impl<T> fmt::Debug for Subscription<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl<T: Send + Sync + 'static> Subscription<T> {
    /// The next change; `None` once the informer is gone.
    pub async fn recv(&mut self) -> Option<Change<T>> {
        self.rx.recv().await
    }

    /// The next change if one is already there, without waiting: a consumer that keeps a view
    /// derived from the cache (e.g. an allocator's used values) catches up with it before
    /// deciding, without a task of its own.
    pub fn try_recv(&mut self) -> Option<Change<T>> {
        self.rx.try_recv().ok()
    }

    pub fn into_stream(self) -> impl Stream<Item = Change<T>> + Send {
        futures::stream::unfold(
            self.rx,
            |mut rx| async move { rx.recv().await.map(|c| (c, rx)) },
        )
    }
}

/// One informer per resource type, created on first use and shared: every controller of a
/// process that asks for `Informers::get::<Pod>()` uses the same cache and the same watch.
/// Cheap to clone.
#[derive(Clone)]
pub struct Informers {
    client: Client,
    namespace: Option<String>,
    started: Arc<Mutex<HashMap<TypeId, Started>>>,
}

struct Started {
    informer: Box<dyn Any + Send + Sync>,
    synced: watch::Receiver<bool>,
}

impl fmt::Debug for Informers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Informers")
            .field("client", &self.client)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Informers {
    /// Informers over every namespace.
    pub fn new(client: Client) -> Self {
        Informers {
            client,
            namespace: None,
            started: Arc::default(),
        }
    }

    /// Informers limited to one namespace (cluster-scoped types are unaffected).
    pub fn namespaced(client: Client, namespace: &str) -> Self {
        Informers {
            namespace: Some(namespace.to_string()),
            ..Informers::new(client)
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The shared informer of `T`, started on first use.
    pub fn get<T: Resource>(&self) -> Informer<T> {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = started
            .get(&TypeId::of::<T>())
            .and_then(|s| s.informer.downcast_ref::<Informer<T>>())
        {
            return i.clone();
        }
        let api = self.client.api::<T>(self.namespace.as_deref());
        let informer = Informer::new(api, ListParams::default());
        started.insert(
            TypeId::of::<T>(),
            Started {
                informer: Box::new(informer.clone()),
                synced: informer.shared.synced.subscribe(),
            },
        );
        informer
    }

    /// Waits until every informer started so far has synced.
    pub async fn wait_synced(&self) {
        let receivers: Vec<watch::Receiver<bool>> = self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|s| s.synced.clone())
            .collect();
        for mut rx in receivers {
            let _ = rx.wait_for(|s| *s).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ObjectMeta, Pod, PodSpec};

    fn pod(ns: &str, name: &str, rv: &str, labels: &[(&str, &str)], node: &str) -> Pod {
        Pod {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: ns.into(),
                resource_version: rv.into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                owner_references: vec![OwnerReference {
                    uid: format!("owner-of-{name}"),
                    controller: Some(name.starts_with('c')),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            spec: Some(PodSpec {
                node_name: node.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn shared() -> InformerInner<Pod> {
        InformerInner {
            cache: RwLock::new(Cache {
                objects: BTreeMap::new(),
                indexes: HashMap::new(),
                subscribers: Vec::new(),
            }),
            indexers: default_indexes(),
            synced: watch::channel(false).0,
            revision: watch::channel(0).0,
            resource: "pods",
        }
    }

    #[tokio::test]
    async fn indexes_follow_changes_and_subscribers_see_diffs() {
        let s = shared();
        let (tx, mut rx) = mpsc::unbounded_channel();
        s.write().subscribers.push(tx);
        s.apply(Event::Restarted(vec![
            pod("a", "c1", "5", &[("app", "web")], "n1"),
            pod("a", "x2", "6", &[("app", "db")], ""),
            pod("b", "c3", "7", &[("app", "web")], "n2"),
        ]));
        assert!(*s.synced.borrow());
        assert_eq!(*s.revision.borrow(), 7);
        for _ in 0..3 {
            assert!(matches!(rx.try_recv(), Ok(Change::Added(_))));
        }
        let inf_like = |idx: &str, v: &str| -> Vec<String> {
            let c = s.read();
            c.indexes
                .get(idx)
                .and_then(|i| i.get(v))
                .map(|k| k.iter().map(ToString::to_string).collect())
                .unwrap_or_default()
        };
        assert_eq!(inf_like(NAMESPACE_INDEX, "a"), ["a/c1", "a/x2"]);
        assert_eq!(inf_like(LABEL_INDEX, "app=web"), ["a/c1", "b/c3"]);
        assert_eq!(inf_like(OWNER_INDEX, "owner-of-c1"), ["a/c1"]);
        assert!(inf_like(OWNER_INDEX, "owner-of-x2").is_empty());
        // Every reference counts for the dependents index, controller or not.
        assert_eq!(inf_like(OWNER_REF_INDEX, "owner-of-x2"), ["a/x2"]);
        assert_eq!(inf_like(NODE_INDEX, "n2"), ["b/c3"]);
        // Relabel c1; relist drops x2 and keeps c3 unchanged (no event).
        s.apply(Event::Applied(pod("a", "c1", "8", &[("app", "db")], "n1")));
        assert!(matches!(rx.try_recv(), Ok(Change::Updated { .. })));
        assert_eq!(inf_like(LABEL_INDEX, "app=web"), ["b/c3"]);
        s.apply(Event::Restarted(vec![
            pod("a", "c1", "8", &[("app", "db")], "n1"),
            pod("b", "c3", "7", &[("app", "web")], "n2"),
        ]));
        match rx.try_recv() {
            Ok(Change::Deleted(o)) => assert_eq!(o.name(), "x2"),
            other => panic!("want the delete of x2, got {other:?}"),
        }
        assert!(rx.try_recv().is_err(), "unchanged objects are not reported");
        assert_eq!(inf_like(LABEL_INDEX, "app=db"), ["a/c1"]);
        s.apply(Event::Deleted(pod("a", "c1", "9", &[], "")));
        assert!(inf_like(LABEL_INDEX, "app=db").is_empty());
        assert!(inf_like(NODE_INDEX, "n1").is_empty());
        assert_eq!(*s.revision.borrow(), 9);
    }
}
