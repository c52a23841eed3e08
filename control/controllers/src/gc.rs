//! The garbage collector: deletes objects whose owners are gone and carries out the
//! Foreground and Orphan propagation policies, with Kubernetes' semantics.
//!
//! The object graph is the shared informers of every kind that can own or be owned
//! ([`GraphKind`], one generic implementation instantiated per kind); an owner's dependents
//! are the objects whose ownerReferences name its uid (the informers' `ownerRef` index). One
//! [`Collector<T>`] per kind runs as a controller over the shared informers; its key is an
//! object of that kind:
//!
//! - **Dependents** (objects with ownerReferences, not being deleted): each owner is
//!   *solid* (exists with the referenced uid), *waiting* (exists, being deleted in the
//!   foreground) or *gone*. Gone is never concluded from the cache alone: an owner absent
//!   from its informer (or cached with another uid) is looked up on the API server, and only
//!   a NotFound or a different uid there counts. With a solid owner, references to gone and
//!   waiting owners are removed; without one, the object is deleted (uid and
//!   resourceVersion preconditions, so a changed object is looked at again rather than
//!   deleted): in the foreground when an owner is waiting and the object has dependents
//!   itself in the cache (so Deployment → ReplicaSets → Pods goes bottom-up), else in the
//!   background (as Kubernetes; a leaf such as a pod gets no finalizer).
//! - **Owners deleted with Foreground** (`foregroundDeletion` finalizer): their dependents
//!   are deleted through the rule above (an owner's change queues its dependents); once no
//!   dependent with `blockOwnerDeletion: true` remains (gracefully terminating pods count
//!   until they are gone), the finalizer is removed and the API server removes the owner.
//! - **Owners deleted with Orphan** (`orphan` finalizer): the references to them are removed
//!   from every dependent (read, edit, update with the resourceVersion read; a conflict is
//!   retried through the work queue), then the finalizer.
//!
//! Custom kinds (a CustomResourceDefinition's) are members of the graph as built-in kinds
//! are, as owners and as dependents: each established definition's kind is followed by a
//! reflector over the dynamic API that keeps the metadata of its objects ([`CustomGraph`]),
//! and the same [`Collector`] works through that kind's queue. Changes cross between typed
//! and custom kinds both ways ([`Graph::queue_related`]): a Deployment owned by a custom
//! object, a custom object owned by a Deployment or by another custom object are collected
//! alike. An owner of a custom kind not (yet) followed is looked up through discovery
//! ([`CustomOwners`]).
//!
//! Before a finalizer is removed, kinds whose informer has not yet seen the owner's
//! resourceVersion are listed on the API server too, so a lagging cache cannot hide a
//! dependent. A dependent's change queues its owners that are being deleted; an owner that is
//! being deleted or is gone queues its dependents.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, OnceLock, RwLock};

use futures::StreamExt as _;
use futures::future::{BoxFuture, FutureExt, join_all};
use serde::Deserialize as _;
use skiff_api::api::{
    ConfigMap, CronJob, CustomResourceDefinition, DaemonSet, Deployment, Endpoints,
    HorizontalPodAutoscaler, Job, ObjectMeta, ObjectReference, OwnerReference,
    PersistentVolumeClaim, Pod, PodDisruptionBudget, ReplicaSet, ReplicationController, Secret,
    Service, ServiceAccount, StatefulSet,
};
use skiff_api::{DynKind, FOREGROUND_FINALIZER, KindInfo, ORPHAN_FINALIZER, Resource};
use skiff_client::controller::{
    Action, CancelToken, Change, Controller, EventRecorder, EventType, Informer, Informers,
    ObjectKey, RateLimiter, Reconciler, WorkQueue, run_workers,
};
use skiff_client::reflector::{Event, reflector};
use skiff_client::{
    Api, Client, ClientError, DeleteParams, DynamicApi, ListParams, Preconditions,
    PropagationPolicy,
};

use crate::{Context, Error};

/// What the owner an ownerReference names turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerState {
    /// It exists with the referenced uid and is not waiting for its dependents.
    Solid,
    /// It exists with the referenced uid and is being deleted in the foreground.
    Waiting,
    /// The API server confirmed it does not exist, or exists with another uid.
    Gone,
    /// Its kind is not one the collector knows, so it cannot be checked: it counts as solid.
    Unknown,
}

fn has_finalizer(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().any(|f| f == finalizer)
}

fn is_deleting(meta: &ObjectMeta) -> bool {
    !meta.deletion_timestamp.is_empty()
}

/// Being deleted in the foreground: dependents go first.
fn is_waiting_for_dependents(meta: &ObjectMeta) -> bool {
    is_deleting(meta) && has_finalizer(meta, FOREGROUND_FINALIZER)
}

fn revision(meta: &ObjectMeta) -> u64 {
    meta.resource_version.parse().unwrap_or(u64::MAX)
}

fn key_of(meta: &ObjectMeta) -> ObjectKey {
    ObjectKey::new(&meta.namespace, &meta.name)
}

fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

/// Whether `r` names an object of kind `info`.
fn refers_to(r: &OwnerReference, info: &KindInfo) -> bool {
    r.kind == info.kind && api_group(&r.api_version) == info.group()
}

/// The key of the owner `r` names, for a dependent in `namespace` (a namespaced owner is in
/// its dependent's namespace); `None` for a namespaced owner of a cluster-scoped dependent,
/// which cannot exist.
fn owner_key(info: &KindInfo, namespace: &str, r: &OwnerReference) -> Option<ObjectKey> {
    match (info.namespaced, namespace.is_empty()) {
        (true, true) => None,
        (true, false) => Some(ObjectKey::new(namespace, &r.name)),
        (false, _) => Some(ObjectKey::cluster(&r.name)),
    }
}

fn api_for<T: Resource>(client: &Client, namespace: &str) -> Api<T> {
    client.api::<T>(T::INFO.namespaced.then_some(namespace))
}

/// The state of the owner with uid `uid` at `key`: from `cache` when it holds that object,
/// else from the API server (the cache may lag behind it, so absence there proves nothing).
/// Only a NotFound or another uid on the API server makes an owner [`OwnerState::Gone`].
pub async fn owner_state<T: Resource>(
    cache: &Informer<T>,
    client: &Client,
    key: &ObjectKey,
    uid: &str,
) -> Result<OwnerState, ClientError> {
    let meta = match cache
        .get(key)
        .and_then(|o| o.metadata().cloned())
        .filter(|m| m.uid == uid)
    {
        Some(m) => m,
        None => match api_for::<T>(client, &key.namespace)
            .get_opt(&key.name)
            .await?
            .and_then(|o| o.metadata().cloned())
            .filter(|m| m.uid == uid)
        {
            Some(m) => m,
            None => return Ok(OwnerState::Gone),
        },
    };
    Ok(state_of(Some(&meta)))
}

/// The state of an owner found as `meta` (`None`: not found with the referenced uid).
fn state_of(meta: Option<&ObjectMeta>) -> OwnerState {
    match meta {
        None => OwnerState::Gone,
        Some(m) if is_waiting_for_dependents(m) => OwnerState::Waiting,
        Some(_) => OwnerState::Solid,
    }
}

/// The metadata of an object in its JSON form.
fn meta_of(obj: &serde_json::Value) -> Option<ObjectMeta> {
    ObjectMeta::deserialize(&obj["metadata"]).ok()
}

/// A delete of the object `meta` describes, only if it is still that version.
fn delete_params(meta: &ObjectMeta, policy: PropagationPolicy) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: None,
        propagation_policy: Some(policy),
        preconditions: Some(Preconditions {
            uid: Some(meta.uid.clone()),
            resource_version: Some(meta.resource_version.clone()).filter(|rv| !rv.is_empty()),
        }),
    }
}

/// A delete's outcome: an object already gone counts as deleted.
fn deleted_or_gone<T>(result: Result<T, ClientError>) -> Result<(), ClientError> {
    match result {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// An update's outcome for `edit_metadata`: whether it wrote (an object gone meanwhile did
/// not need it).
fn written<T>(result: Result<T, ClientError>) -> Result<bool, ClientError> {
    match result {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// A reference to the object `meta` of kind `info`, for events about it.
fn reference(info: &KindInfo, meta: &ObjectMeta) -> ObjectReference {
    ObjectReference {
        kind: info.kind.to_string(),
        namespace: meta.namespace.clone(),
        name: meta.name.clone(),
        uid: meta.uid.clone(),
        api_version: info.api_version.to_string(),
        resource_version: meta.resource_version.clone(),
        field_path: String::new(),
    }
}

/// Owners of custom kinds (a CustomResourceDefinition's): found through discovery and read
/// through the dynamic API, never cached, so a dependent's custom owner is Gone only when
/// the API server says so. A kind discovery does not know (its definition is gone) is
/// [`OwnerState::Unknown`]: its dependents stay, as Kubernetes keeps dependents of owners
/// it cannot resolve.
pub struct CustomOwners {
    client: Client,
    kinds: tokio::sync::Mutex<Discovered>,
}

/// When discovery was last asked, and the custom kinds it listed by `(apiVersion, kind)`.
type Discovered = (
    Option<std::time::Instant>,
    HashMap<(String, String), &'static dyn skiff_api::DynKind>,
);

impl std::fmt::Debug for CustomOwners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomOwners").finish_non_exhaustive()
    }
}

/// How often a lookup that misses may ask discovery again.
const DISCOVERY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl CustomOwners {
    pub fn new(client: Client) -> Self {
        CustomOwners {
            client,
            kinds: tokio::sync::Mutex::new((None, HashMap::new())),
        }
    }

    /// The served custom kind `(api_version, kind)`, asking discovery again on a miss.
    async fn kind(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<&'static dyn skiff_api::DynKind>, ClientError> {
        let key = (api_version.to_string(), kind.to_string());
        let mut state = self.kinds.lock().await;
        if let Some(k) = state.1.get(&key) {
            return Ok(Some(*k));
        }
        if state.0.is_some_and(|at| at.elapsed() < DISCOVERY_EVERY) {
            return Ok(None);
        }
        let served = self.client.custom_kinds().await?;
        state.0 = Some(std::time::Instant::now());
        state.1 = served
            .into_iter()
            .map(|k| {
                let info = k.info();
                ((info.api_version.to_string(), info.kind.to_string()), k)
            })
            .collect();
        Ok(state.1.get(&key).copied())
    }

    /// The state of the custom owner `r` of a dependent in `namespace`.
    async fn owner_state(
        &self,
        namespace: &str,
        r: &OwnerReference,
    ) -> Result<OwnerState, ClientError> {
        let Some(kind) = self.kind(&r.api_version, &r.kind).await? else {
            return Ok(OwnerState::Unknown);
        };
        let Some(key) = owner_key(kind.info(), namespace, r) else {
            return Ok(OwnerState::Unknown);
        };
        let api = self.client.dynamic(
            kind,
            kind.info().namespaced.then_some(key.namespace.as_str()),
        );
        let meta = api
            .get_opt(&key.name)
            .await?
            .as_ref()
            .and_then(meta_of)
            .filter(|m| m.uid == r.uid);
        Ok(state_of(meta.as_ref()))
    }
}

/// Whether `r` names a kind Skiff has types for (so not a custom kind).
fn typed_kind(r: &OwnerReference) -> bool {
    skiff_api::kinds().iter().any(|k| refers_to(r, k.info()))
}

/// One kind's part of the object graph. Object-safe, so the collector can reach owners and
/// dependents of any kind; implemented once, generically, by [`KindGraph`].
pub trait GraphKind: Send + Sync {
    fn info(&self) -> &'static KindInfo;
    /// The cached object at `key`.
    fn cached(&self, key: &ObjectKey) -> Option<ObjectMeta>;
    /// The cached objects with an ownerReference to `uid`.
    fn cached_dependents(&self, uid: &str) -> Vec<ObjectMeta>;
    /// Whether the cache reflects every write to this kind up to `revision`.
    fn has_seen(&self, revision: u64) -> bool;
    /// See [`owner_state`].
    fn owner_state<'a>(
        &'a self,
        key: &'a ObjectKey,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<OwnerState, ClientError>>;
    /// The object at `key` as the API server has it now.
    fn live<'a>(
        &'a self,
        key: &'a ObjectKey,
    ) -> BoxFuture<'a, Result<Option<ObjectMeta>, ClientError>>;
    /// The objects with an ownerReference to `uid`, listed on the API server (in
    /// `namespace`, or everywhere).
    fn live_dependents<'a>(
        &'a self,
        namespace: Option<&'a str>,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ObjectMeta>, ClientError>>;
    /// Deletes the object `meta` describes if it is still that version (NotFound is success).
    fn delete<'a>(
        &'a self,
        meta: &'a ObjectMeta,
        policy: PropagationPolicy,
    ) -> BoxFuture<'a, Result<(), ClientError>>;
    /// Reads the object at `key`; if it still has `uid`, applies `edit` to its metadata and,
    /// when `edit` reports a change, writes it back (an update with the resourceVersion
    /// read, so a concurrent change is a Conflict). Returns whether it wrote.
    fn edit_metadata<'a>(
        &'a self,
        key: &'a ObjectKey,
        uid: &'a str,
        edit: &'a (dyn Fn(&mut ObjectMeta) -> bool + Send + Sync),
    ) -> BoxFuture<'a, Result<bool, ClientError>>;
}

/// [`GraphKind`] for `T`: its shared informer and its API.
pub struct KindGraph<T> {
    informer: Informer<T>,
    client: Client,
}

impl<T: Resource> std::fmt::Debug for KindGraph<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindGraph")
            .field("kind", &T::INFO.kind)
            .finish_non_exhaustive()
    }
}

impl<T: Resource> KindGraph<T> {
    pub fn new(informers: &Informers) -> Self {
        KindGraph {
            informer: informers.get::<T>(),
            client: informers.client().clone(),
        }
    }
}

impl<T: Resource> GraphKind for KindGraph<T> {
    fn info(&self) -> &'static KindInfo {
        &T::INFO
    }

    fn cached(&self, key: &ObjectKey) -> Option<ObjectMeta> {
        self.informer.get(key).and_then(|o| o.metadata().cloned())
    }

    fn cached_dependents(&self, uid: &str) -> Vec<ObjectMeta> {
        self.informer
            .by_owner_ref(uid)
            .iter()
            .filter_map(|o| o.metadata().cloned())
            .collect()
    }

    fn has_seen(&self, revision: u64) -> bool {
        self.informer.revision() >= revision
    }

    fn owner_state<'a>(
        &'a self,
        key: &'a ObjectKey,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<OwnerState, ClientError>> {
        owner_state(&self.informer, &self.client, key, uid).boxed()
    }

    fn live<'a>(
        &'a self,
        key: &'a ObjectKey,
    ) -> BoxFuture<'a, Result<Option<ObjectMeta>, ClientError>> {
        async move {
            Ok(api_for::<T>(&self.client, &key.namespace)
                .get_opt(&key.name)
                .await?
                .and_then(|o| o.metadata().cloned()))
        }
        .boxed()
    }

    fn live_dependents<'a>(
        &'a self,
        namespace: Option<&'a str>,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ObjectMeta>, ClientError>> {
        async move {
            let api = self
                .client
                .api::<T>(namespace.filter(|_| T::INFO.namespaced));
            Ok(api
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|o| o.metadata().cloned())
                .filter(|m| m.owner_references.iter().any(|r| r.uid == uid))
                .collect())
        }
        .boxed()
    }

    fn delete<'a>(
        &'a self,
        meta: &'a ObjectMeta,
        policy: PropagationPolicy,
    ) -> BoxFuture<'a, Result<(), ClientError>> {
        async move {
            let deleted = api_for::<T>(&self.client, &meta.namespace)
                .delete(&meta.name, &delete_params(meta, policy))
                .await;
            deleted_or_gone(deleted)
        }
        .boxed()
    }

    fn edit_metadata<'a>(
        &'a self,
        key: &'a ObjectKey,
        uid: &'a str,
        edit: &'a (dyn Fn(&mut ObjectMeta) -> bool + Send + Sync),
    ) -> BoxFuture<'a, Result<bool, ClientError>> {
        async move {
            let api = api_for::<T>(&self.client, &key.namespace);
            let Some(mut obj) = api.get_opt(&key.name).await? else {
                return Ok(false);
            };
            if obj.metadata().map(|m| m.uid.as_str()) != Some(uid) || !edit(obj.metadata_mut()) {
                return Ok(false);
            }
            written(api.update(&obj).await)
        }
        .boxed()
    }
}

/// [`GraphKind`] for a custom kind (a CustomResourceDefinition's): the metadata of its
/// objects, kept current by a reflector over the dynamic API ([`follow_custom_kind`]), its
/// dynamic API, and its collector's work queue.
pub struct CustomGraph {
    kind: &'static dyn DynKind,
    client: Client,
    cache: RwLock<MetaCache>,
    queue: WorkQueue<ObjectKey>,
}

/// The metadata of one custom kind's objects, indexed by the uids of their owners.
#[derive(Default)]
struct MetaCache {
    objects: HashMap<ObjectKey, ObjectMeta>,
    by_owner: HashMap<String, BTreeSet<ObjectKey>>,
    /// The highest resourceVersion seen.
    revision: u64,
}

impl MetaCache {
    fn remove(&mut self, key: &ObjectKey) -> Option<ObjectMeta> {
        let old = self.objects.remove(key)?;
        for r in &old.owner_references {
            if let Some(keys) = self.by_owner.get_mut(&r.uid) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_owner.remove(&r.uid);
                }
            }
        }
        Some(old)
    }

    fn insert(&mut self, meta: ObjectMeta) {
        let key = key_of(&meta);
        self.remove(&key);
        for r in &meta.owner_references {
            self.by_owner
                .entry(r.uid.clone())
                .or_default()
                .insert(key.clone());
        }
        self.revision = self.revision.max(revision(&meta));
        self.objects.insert(key, meta);
    }
}

impl std::fmt::Debug for CustomGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomGraph")
            .field("kind", &self.kind.info().kind)
            .finish_non_exhaustive()
    }
}

impl CustomGraph {
    fn new(kind: &'static dyn DynKind, client: Client) -> Self {
        CustomGraph {
            kind,
            client,
            cache: RwLock::default(),
            queue: WorkQueue::new(RateLimiter::default()),
        }
    }

    fn api(&self, namespace: Option<&str>) -> DynamicApi {
        let namespace = namespace.filter(|_| self.kind.info().namespaced);
        self.client.dynamic(self.kind, namespace)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, MetaCache> {
        self.cache.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, MetaCache> {
        self.cache.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies one reflector event to the cache and queues what the change concerns.
    fn apply(&self, graph: &Graph, event: Event<serde_json::Value>) {
        let info = self.kind.info();
        match event {
            Event::Restarted(items) => {
                let metas: Vec<ObjectMeta> = items.iter().filter_map(meta_of).collect();
                let gone: Vec<ObjectMeta> = {
                    let mut cache = self.write();
                    let listed: HashSet<ObjectKey> = metas.iter().map(key_of).collect();
                    let missing: Vec<ObjectKey> = cache
                        .objects
                        .keys()
                        .filter(|k| !listed.contains(*k))
                        .cloned()
                        .collect();
                    let gone = missing.iter().filter_map(|k| cache.remove(k)).collect();
                    for m in &metas {
                        cache.insert(m.clone());
                    }
                    gone
                };
                for m in &gone {
                    graph.queue_related(info, m, true, false);
                }
                for m in &metas {
                    self.changed(graph, m);
                }
            }
            Event::Applied(obj) => {
                if let Some(m) = meta_of(&obj) {
                    self.write().insert(m.clone());
                    self.changed(graph, &m);
                }
            }
            Event::Deleted(obj) => {
                if let Some(m) = meta_of(&obj) {
                    {
                        let mut cache = self.write();
                        cache.remove(&key_of(&m));
                        cache.revision = cache.revision.max(revision(&m));
                    }
                    graph.queue_related(info, &m, true, false);
                }
            }
        }
    }

    /// An object of this kind was added or changed: it is queued when its collector has
    /// something to do with it (it has owners, or is being deleted with a policy finalizer),
    /// and so is what the change concerns in other kinds.
    fn changed(&self, graph: &Graph, m: &ObjectMeta) {
        let finishing = is_deleting(m)
            && (has_finalizer(m, ORPHAN_FINALIZER) || has_finalizer(m, FOREGROUND_FINALIZER));
        if finishing || (!m.owner_references.is_empty() && !is_deleting(m)) {
            self.queue.add(key_of(m));
        }
        graph.queue_related(self.kind.info(), m, is_deleting(m), false);
    }
}

impl GraphKind for CustomGraph {
    fn info(&self) -> &'static KindInfo {
        self.kind.info()
    }

    fn cached(&self, key: &ObjectKey) -> Option<ObjectMeta> {
        self.read().objects.get(key).cloned()
    }

    fn cached_dependents(&self, uid: &str) -> Vec<ObjectMeta> {
        let cache = self.read();
        cache
            .by_owner
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|k| cache.objects.get(k).cloned())
            .collect()
    }

    fn has_seen(&self, revision: u64) -> bool {
        self.read().revision >= revision
    }

    fn owner_state<'a>(
        &'a self,
        key: &'a ObjectKey,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<OwnerState, ClientError>> {
        async move {
            let meta = match self.cached(key).filter(|m| m.uid == uid) {
                Some(m) => Some(m),
                None => self.live(key).await?.filter(|m| m.uid == uid),
            };
            Ok(state_of(meta.as_ref()))
        }
        .boxed()
    }

    fn live<'a>(
        &'a self,
        key: &'a ObjectKey,
    ) -> BoxFuture<'a, Result<Option<ObjectMeta>, ClientError>> {
        async move {
            Ok(self
                .api(Some(&key.namespace))
                .get_opt(&key.name)
                .await?
                .as_ref()
                .and_then(meta_of))
        }
        .boxed()
    }

    fn live_dependents<'a>(
        &'a self,
        namespace: Option<&'a str>,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ObjectMeta>, ClientError>> {
        async move {
            Ok(self
                .api(namespace)
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter_map(meta_of)
                .filter(|m| m.owner_references.iter().any(|r| r.uid == uid))
                .collect())
        }
        .boxed()
    }

    fn delete<'a>(
        &'a self,
        meta: &'a ObjectMeta,
        policy: PropagationPolicy,
    ) -> BoxFuture<'a, Result<(), ClientError>> {
        async move {
            let deleted = self
                .api(Some(&meta.namespace))
                .delete(&meta.name, &delete_params(meta, policy))
                .await;
            deleted_or_gone(deleted)
        }
        .boxed()
    }

    /// Writes back only what the collector edits (ownerReferences and finalizers), so
    /// nothing of the object's own metadata is rewritten through the typed form.
    fn edit_metadata<'a>(
        &'a self,
        key: &'a ObjectKey,
        uid: &'a str,
        edit: &'a (dyn Fn(&mut ObjectMeta) -> bool + Send + Sync),
    ) -> BoxFuture<'a, Result<bool, ClientError>> {
        async move {
            let api = self.api(Some(&key.namespace));
            let Some(mut obj) = api.get_opt(&key.name).await? else {
                return Ok(false);
            };
            let Some(mut meta) = meta_of(&obj).filter(|m| m.uid == uid) else {
                return Ok(false);
            };
            if !edit(&mut meta) {
                return Ok(false);
            }
            // Plain lists of strings and string-keyed records: their JSON cannot fail.
            let (Ok(refs), Ok(finalizers)) = (
                serde_json::to_value(&meta.owner_references),
                serde_json::to_value(&meta.finalizers),
            ) else {
                return Ok(false);
            };
            let fields = [
                ("ownerReferences", refs, meta.owner_references.is_empty()),
                ("finalizers", finalizers, meta.finalizers.is_empty()),
            ];
            let Some(m) = obj["metadata"].as_object_mut() else {
                return Ok(false);
            };
            for (name, value, empty) in fields {
                if empty {
                    m.remove(name);
                } else {
                    m.insert(name.to_string(), value);
                }
            }
            written(api.update(&obj).await)
        }
        .boxed()
    }
}

/// A dependent found in the graph, with its kind.
struct Dependent {
    kind: Arc<dyn GraphKind>,
    meta: ObjectMeta,
}

impl Dependent {
    fn blocks(&self, owner_uid: &str) -> bool {
        self.meta
            .owner_references
            .iter()
            .any(|r| r.uid == owner_uid && r.block_owner_deletion == Some(true))
    }
}

/// The object graph: every kind the collector handles.
pub struct Graph {
    /// The typed kinds.
    kinds: Vec<Arc<dyn GraphKind>>,
    /// The typed kinds' collectors' queues, in the order of `kinds`, once they exist.
    queues: OnceLock<Vec<WorkQueue<ObjectKey>>>,
    /// The custom kinds followed now (one per established definition).
    followed: RwLock<Vec<Arc<CustomGraph>>>,
    /// Owners of custom kinds not followed (yet).
    custom: CustomOwners,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("kinds", &self.kinds.len())
            .field("custom", &self.followed().len())
            .finish()
    }
}

impl Graph {
    fn followed(&self) -> Vec<Arc<CustomGraph>> {
        self.followed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every kind of the graph: the typed ones and the custom ones followed now.
    fn all_kinds(&self) -> Vec<Arc<dyn GraphKind>> {
        let mut all = self.kinds.clone();
        all.extend(self.followed().into_iter().map(|k| k as Arc<dyn GraphKind>));
        all
    }

    /// The kind `r` names, if the collector handles it.
    fn kind_of(&self, r: &OwnerReference) -> Option<Arc<dyn GraphKind>> {
        if let Some(k) = self.kinds.iter().find(|k| refers_to(r, k.info())) {
            return Some(Arc::clone(k));
        }
        self.followed()
            .into_iter()
            .find(|k| refers_to(r, k.info()))
            .map(|k| k as Arc<dyn GraphKind>)
    }

    /// Every kind with its collector's queue: the typed kinds (unless `custom_only`, and once
    /// their collectors exist) and the followed custom kinds.
    fn queued(&self, custom_only: bool) -> Vec<(Arc<dyn GraphKind>, WorkQueue<ObjectKey>)> {
        let mut out = Vec::new();
        if let Some(queues) = self.queues.get().filter(|_| !custom_only) {
            out.extend(self.kinds.iter().cloned().zip(queues.iter().cloned()));
        }
        out.extend(self.followed().into_iter().map(|k| {
            let queue = k.queue.clone();
            (k as Arc<dyn GraphKind>, queue)
        }));
        out
    }

    /// A change of the object `meta` of kind `info` (`going`: deleted or being deleted):
    /// queues in their collectors the objects it concerns: its dependents when it goes, and
    /// its owners that are being deleted (they wait for, or orphan, it). With `custom_only`
    /// only the custom kinds' collectors are told (a typed collector's controller watches
    /// the typed kinds itself).
    fn queue_related(&self, info: &KindInfo, meta: &ObjectMeta, going: bool, custom_only: bool) {
        let kinds = self.queued(custom_only);
        if kinds.is_empty() {
            return;
        }
        if going && !meta.uid.is_empty() {
            for (kind, queue) in &kinds {
                for d in kind.cached_dependents(&meta.uid) {
                    if !info.namespaced || d.namespace == meta.namespace {
                        queue.add(key_of(&d));
                    }
                }
            }
        }
        for r in &meta.owner_references {
            let Some((kind, queue)) = kinds.iter().find(|(k, _)| refers_to(r, k.info())) else {
                continue;
            };
            let Some(key) = owner_key(kind.info(), &meta.namespace, r) else {
                continue;
            };
            if kind
                .cached(&key)
                .is_some_and(|o| o.uid == r.uid && is_deleting(&o))
            {
                queue.add(key);
            }
        }
    }

    /// The state of the owner `r` of a dependent in `namespace` (cache, then API server).
    pub async fn owner_state(
        &self,
        namespace: &str,
        r: &OwnerReference,
    ) -> Result<OwnerState, ClientError> {
        let Some(kind) = self.kind_of(r) else {
            if typed_kind(r) {
                return Ok(OwnerState::Unknown);
            }
            return self.custom.owner_state(namespace, r).await;
        };
        let Some(key) = owner_key(kind.info(), namespace, r) else {
            return Ok(OwnerState::Unknown);
        };
        kind.owner_state(&key, &r.uid).await
    }

    /// The state of the owner `r` of a dependent in `namespace` from the caches only; `None`
    /// when the caches cannot tell (the owner is not cached with that uid, or is of a custom
    /// kind not followed).
    fn cached_owner_state(&self, namespace: &str, r: &OwnerReference) -> Option<OwnerState> {
        let Some(kind) = self.kind_of(r) else {
            return typed_kind(r).then_some(OwnerState::Unknown);
        };
        let Some(key) = owner_key(kind.info(), namespace, r) else {
            return Some(OwnerState::Unknown);
        };
        let meta = kind.cached(&key).filter(|m| m.uid == r.uid)?;
        Some(if is_waiting_for_dependents(&meta) {
            OwnerState::Waiting
        } else {
            OwnerState::Solid
        })
    }

    /// The cached dependents of the owner `owner` of kind `info` (a namespaced owner's
    /// dependents are in its namespace).
    fn cached_dependents(&self, info: &KindInfo, owner: &ObjectMeta) -> Vec<Dependent> {
        let mut out = Vec::new();
        for kind in &self.all_kinds() {
            for meta in kind.cached_dependents(&owner.uid) {
                if info.namespaced && meta.namespace != owner.namespace {
                    continue;
                }
                out.push(Dependent {
                    kind: Arc::clone(kind),
                    meta,
                });
            }
        }
        out
    }

    /// The cached dependents plus, for every kind whose cache has not yet seen the owner's
    /// last write, the dependents the API server lists (so a lagging cache hides none).
    async fn all_dependents(
        &self,
        info: &KindInfo,
        owner: &ObjectMeta,
    ) -> Result<Vec<Dependent>, ClientError> {
        let mut out = self.cached_dependents(info, owner);
        let mut seen: BTreeSet<String> = out.iter().map(|d| d.meta.uid.clone()).collect();
        let rev = revision(owner);
        let scope = info.namespaced.then_some(owner.namespace.as_str());
        for kind in self.all_kinds().iter().filter(|k| !k.has_seen(rev)) {
            for meta in kind.live_dependents(scope, &owner.uid).await? {
                if seen.insert(meta.uid.clone()) {
                    out.push(Dependent {
                        kind: Arc::clone(kind),
                        meta,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// The reconciler of one kind's objects, as owners and as dependents: the same for every
/// kind, typed or custom.
pub struct Collector {
    graph: Arc<Graph>,
    own: Arc<dyn GraphKind>,
    recorder: EventRecorder,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector").finish_non_exhaustive()
    }
}

/// The keys a change of `c` (kind `C`) queues in the collector of kind `T`: `c`'s owners of
/// kind `T` that are being deleted (they wait for, or orphan, their dependents), and, when
/// `c` is being deleted or is gone, its dependents of kind `T`.
fn related_keys<T: Resource, C: Resource>(
    c: &C,
    owners: &Informer<T>,
    of_c: &Informer<C>,
) -> Vec<ObjectKey> {
    let Some(meta) = c.metadata() else {
        return Vec::new();
    };
    let mut keys: Vec<ObjectKey> = meta
        .owner_references
        .iter()
        .filter(|r| refers_to(r, &T::INFO))
        .filter_map(|r| owner_key(&T::INFO, &meta.namespace, r))
        .filter(|k| {
            owners
                .get(k)
                .and_then(|o| o.metadata().map(is_deleting))
                .unwrap_or(false)
        })
        .collect();
    let current = of_c.get(&key_of(meta));
    let gone_or_deleting = current.as_ref().is_none_or(|o| {
        o.metadata()
            .is_none_or(|m| m.uid != meta.uid || is_deleting(m))
    });
    if gone_or_deleting && !meta.uid.is_empty() {
        keys.extend(
            owners
                .by_owner_ref(&meta.uid)
                .iter()
                .filter(|d| !C::INFO.namespaced || d.namespace() == meta.namespace)
                .map(|d| ObjectKey::of(&**d)),
        );
    }
    keys
}

/// Makes the collector of `T` watch the objects of `C` (see [`related_keys`]).
fn watch_kind<T: Resource, C: Resource>(
    controller: Controller<T>,
    informers: &Informers,
) -> Controller<T> {
    let (owners, of_c) = (informers.get::<T>(), informers.get::<C>());
    controller.watches(&of_c.clone(), move |c: &C| related_keys(c, &owners, &of_c))
}

/// The codec of a definition's kind, once it is established.
fn established_kind(crd: &CustomResourceDefinition) -> Option<&'static dyn skiff_api::DynKind> {
    let status = crd.status.as_ref()?;
    if !status
        .conditions
        .iter()
        .any(|c| c.r#type == "Established" && c.status == "True")
    {
        return None;
    }
    let spec = crd.spec.as_ref()?;
    let names = status.accepted_names.as_ref()?;
    let storage = spec.versions.iter().find(|v| v.storage)?;
    let has_status = storage
        .subresources
        .as_ref()
        .is_some_and(|s| s.status.is_some());
    Some(skiff_api::json_kind(skiff_api::intern_kind(
        &format!("{}/{}", spec.group, storage.name),
        &names.kind,
        &names.plural,
        &names.short_names,
        spec.scope == "Namespaced",
        has_status,
    )))
}

/// Whether two codecs are the same kind (a definition's storage version or names changed
/// otherwise).
fn same_kind(a: &dyn DynKind, b: &dyn DynKind) -> bool {
    let (a, b) = (a.info(), b.info());
    (a.api_version, a.kind, a.plural, a.namespaced)
        == (b.api_version, b.kind, b.plural, b.namespaced)
}

/// Follows every established custom kind ([`follow_custom_kind`], one task each, started and
/// stopped as the definitions come and go), and keeps the graph's list of them current.
async fn follow_custom_kinds(
    definitions: Informer<CustomResourceDefinition>,
    client: Client,
    graph: Arc<Graph>,
    recorder: EventRecorder,
    workers: usize,
    stop: CancelToken,
) {
    let mut changes = definitions.subscribe();
    let mut following: HashMap<String, (Arc<CustomGraph>, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    loop {
        let wanted: HashMap<String, &'static dyn DynKind> = definitions
            .list()
            .iter()
            .filter_map(|crd| Some((crd.name().to_string(), established_kind(crd)?)))
            .collect();
        following.retain(|name, (kind, task)| {
            let keep =
                wanted.get(name).is_some_and(|k| same_kind(*k, kind.kind)) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for (name, kind) in wanted {
            following.entry(name).or_insert_with(|| {
                let kind = Arc::new(CustomGraph::new(kind, client.clone()));
                let task = tokio::spawn(follow_custom_kind(
                    Arc::clone(&graph),
                    Arc::clone(&kind),
                    recorder.clone(),
                    workers,
                ));
                (kind, task)
            });
        }
        *graph.followed.write().unwrap_or_else(|e| e.into_inner()) =
            following.values().map(|(k, _)| Arc::clone(k)).collect();
        tokio::select! {
            () = stop.cancelled() => break,
            change = changes.recv() => if change.is_none() { break },
        }
    }
    for (kind, task) in following.values() {
        kind.queue.shut_down();
        task.abort();
    }
}

/// Follows one custom kind: a reflector over the dynamic API keeps its metadata cache
/// current and queues what each change concerns ([`CustomGraph::apply`]); the kind's
/// [`Collector`] works through its queue with `workers` workers.
async fn follow_custom_kind(
    graph: Arc<Graph>,
    kind: Arc<CustomGraph>,
    recorder: EventRecorder,
    workers: usize,
) {
    let info = kind.kind.info();
    let name = format!("garbagecollector/{}.{}", info.plural, info.group());
    let collector = Arc::new(Collector {
        graph: Arc::clone(&graph),
        own: Arc::clone(&kind) as Arc<dyn GraphKind>,
        recorder,
    });
    let work = run_workers(&name, kind.queue.clone(), collector, workers);
    let reflect = async {
        let mut events = std::pin::pin!(reflector(kind.api(None), ListParams::default()));
        while let Some(event) = events.next().await {
            kind.apply(&graph, event);
        }
    };
    futures::future::join(work, reflect).await;
}

/// Queues, in the custom kinds' collectors, what a change of a `T` concerns (each typed
/// collector's controller watches the typed kinds itself).
async fn follow_typed_changes<T: Resource>(
    informer: Informer<T>,
    graph: Arc<Graph>,
    stop: CancelToken,
) {
    let mut changes = informer.subscribe();
    loop {
        let change = tokio::select! {
            () = stop.cancelled() => break,
            change = changes.recv() => match change {
                Some(change) => change,
                None => break,
            },
        };
        if graph
            .followed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            continue;
        }
        let deleted = matches!(change, Change::Deleted(_));
        for obj in change.objects() {
            if let Some(meta) = obj.metadata() {
                graph.queue_related(&T::INFO, meta, deleted || is_deleting(meta), true);
            }
        }
    }
}

/// The kinds the collector handles: the one list, used for the graph, the watches and the
/// collectors.
macro_rules! graph_kinds {
    ($($t:ty),* $(,)?) => {
        /// The graph over every kind the collector handles.
        pub fn graph(informers: &Informers) -> Graph {
            Graph {
                kinds: vec![$(Arc::new(KindGraph::<$t>::new(informers)) as Arc<dyn GraphKind>),*],
                queues: OnceLock::new(),
                followed: RwLock::default(),
                custom: CustomOwners::new(informers.client().clone()),
            }
        }

        /// `controller` watching every kind of the graph.
        fn watch_graph<T: Resource>(controller: Controller<T>, informers: &Informers) -> Controller<T> {
            $(let controller = watch_kind::<T, $t>(controller, informers);)*
            controller
        }

        /// One collector per typed kind, the custom kinds' followers, and what carries the
        /// typed kinds' changes to the custom kinds' collectors.
        fn collectors(
            informers: &Informers,
            graph: &Arc<Graph>,
            recorder: &EventRecorder,
            workers: usize,
            stop: &CancelToken,
        ) -> Vec<BoxFuture<'static, ()>> {
            let mut queues = Vec::new();
            let mut runs: Vec<BoxFuture<'static, ()>> = Vec::new();
            $(
                let controller = Collector::controller::<$t>(informers)
                    .graceful_shutdown_on(stop.clone());
                queues.push(controller.queue());
                let reconciler = Arc::new(Collector {
                    graph: Arc::clone(graph),
                    own: Arc::new(KindGraph::<$t>::new(informers)),
                    recorder: recorder.clone(),
                });
                runs.push(controller.run(reconciler, workers).boxed());
                runs.push(
                    follow_typed_changes(informers.get::<$t>(), Arc::clone(graph), stop.clone())
                        .boxed(),
                );
            )*
            if graph.queues.set(queues).is_err() {
                tracing::warn!("the graph's collectors were started twice");
            }
            runs.push(
                follow_custom_kinds(
                    informers.get::<CustomResourceDefinition>(),
                    informers.client().clone(),
                    Arc::clone(graph),
                    recorder.clone(),
                    workers,
                    stop.clone(),
                )
                .boxed(),
            );
            runs
        }
    };
}

graph_kinds!(
    Deployment,
    DaemonSet,
    StatefulSet,
    CronJob,
    Job,
    ReplicaSet,
    ReplicationController,
    Pod,
    Service,
    Endpoints,
    // What operators most often make for what they own (configuration, credentials, an
    // identity, claims, budgets, autoscalers): Kubernetes' collector follows every kind, so
    // these are collected as any other dependent. RBAC objects are not: orphaning one means
    // updating it, which RBAC's escalation check rightly refuses the controller manager.
    ConfigMap,
    Secret,
    ServiceAccount,
    PersistentVolumeClaim,
    PodDisruptionBudget,
    HorizontalPodAutoscaler
);

/// Runs the garbage collector (one collector per kind, `workers` workers each) until `stop`
/// is cancelled.
pub async fn run(
    informers: &Informers,
    recorder: EventRecorder,
    workers: usize,
    stop: CancelToken,
) {
    let graph = Arc::new(graph(informers));
    join_all(collectors(informers, &graph, &recorder, workers, &stop)).await;
}

impl Collector {
    /// The controller of the typed kind `T`'s collector: every `T`, plus the related objects
    /// of every typed kind of the graph.
    pub fn controller<T: Resource>(informers: &Informers) -> Controller<T> {
        let controller =
            Controller::<T>::new(informers).named(&format!("garbagecollector/{}", T::INFO.plural));
        watch_graph(controller, informers)
    }

    /// A dependent: delete it when no owner is solid; drop references to gone and waiting
    /// owners when one is.
    async fn collect_if_orphaned(&self, cached: &ObjectMeta) -> Result<(), Error> {
        let info = self.own.info();
        let ns = cached.namespace.as_str();
        // Every owner cached, and solid: nothing to do (no API call).
        if cached.owner_references.iter().all(|r| {
            matches!(
                self.graph.cached_owner_state(ns, r),
                Some(OwnerState::Solid | OwnerState::Unknown)
            )
        }) {
            return Ok(());
        }
        let key = key_of(cached);
        let what = || format!("{} {key}", info.kind);
        // Decide on the object as it is now, not as cached.
        let Some(latest) = self
            .own
            .live(&key)
            .await
            .during(|| format!("reading {}", what()))?
        else {
            return Ok(());
        };
        if latest.uid != cached.uid || is_deleting(&latest) || latest.owner_references.is_empty() {
            return Ok(());
        }
        let mut solid = false;
        let mut waiting = false;
        let mut drop_uids = BTreeSet::new();
        for r in &latest.owner_references {
            let state = self
                .graph
                .owner_state(ns, r)
                .await
                .during(|| format!("checking owner {} {} of {}", r.kind, r.name, what()))?;
            match state {
                OwnerState::Solid | OwnerState::Unknown => solid = true,
                OwnerState::Waiting => {
                    waiting = true;
                    drop_uids.insert(r.uid.clone());
                }
                OwnerState::Gone => {
                    drop_uids.insert(r.uid.clone());
                }
            }
        }
        if solid {
            if drop_uids.is_empty() {
                return Ok(());
            }
            let edit = |m: &mut ObjectMeta| {
                let before = m.owner_references.len();
                m.owner_references.retain(|r| !drop_uids.contains(&r.uid));
                m.owner_references.len() != before
            };
            if self
                .own
                .edit_metadata(&key, &latest.uid, &edit)
                .await
                .during(|| format!("removing owner references from {}", what()))?
            {
                tracing::info!(kind = info.kind, object = %key, owners = ?drop_uids,
                    "removed references to owners that are gone or being deleted");
            }
            return Ok(());
        }
        // Kubernetes' choice: in the foreground when it has dependents of its own (they go
        // first, so the waiting owner waits for them too), else in the background.
        let policy = if waiting && !self.graph.cached_dependents(info, &latest).is_empty() {
            PropagationPolicy::Foreground
        } else {
            PropagationPolicy::Background
        };
        self.own
            .delete(&latest, policy)
            .await
            .during(|| format!("deleting {}", what()))?;
        tracing::info!(kind = info.kind, object = %key, policy = policy.as_str(),
            "deleted: every owner is gone or waiting for its dependents");
        Ok(())
    }

    /// An owner deleted in the foreground: once no dependent blocks it any more, remove the
    /// finalizer (its dependents are deleted by their own collectors).
    async fn finish_foreground(&self, owner: &ObjectMeta) -> Result<(), Error> {
        let info = self.own.info();
        let blocking = |deps: &[Dependent]| deps.iter().filter(|d| d.blocks(&owner.uid)).count();
        let cached = self.graph.cached_dependents(info, owner);
        let key = key_of(owner);
        if blocking(&cached) > 0 {
            tracing::debug!(kind = info.kind, object = %key, blocking = blocking(&cached),
                "waiting for dependents");
            return Ok(());
        }
        let all = self
            .graph
            .all_dependents(info, owner)
            .await
            .during(|| format!("listing the dependents of {} {key}", info.kind))?;
        if blocking(&all) > 0 {
            return Ok(());
        }
        self.remove_finalizer(owner, FOREGROUND_FINALIZER).await
    }

    /// An owner deleted with Orphan: remove the references to it from every dependent, then
    /// the finalizer.
    async fn orphan_dependents(&self, owner: &ObjectMeta) -> Result<(), Error> {
        let info = self.own.info();
        let key = key_of(owner);
        let dependents = self
            .graph
            .all_dependents(info, owner)
            .await
            .during(|| format!("listing the dependents of {} {key}", info.kind))?;
        let edit = |m: &mut ObjectMeta| {
            let before = m.owner_references.len();
            m.owner_references.retain(|r| r.uid != owner.uid);
            m.owner_references.len() != before
        };
        let results = join_all(dependents.iter().map(|d| async {
            let dkey = key_of(&d.meta);
            d.kind
                .edit_metadata(&dkey, &d.meta.uid, &edit)
                .await
                .during(|| format!("orphaning {} {dkey}", d.kind.info().kind))
        }))
        .await;
        let failed: Vec<Error> = results.into_iter().filter_map(Result::err).collect();
        if let Some(first) = failed.into_iter().next() {
            return Err(first);
        }
        tracing::info!(kind = info.kind, object = %key, dependents = dependents.len(),
            "orphaned dependents");
        self.remove_finalizer(owner, ORPHAN_FINALIZER).await
    }

    async fn remove_finalizer(&self, owner: &ObjectMeta, finalizer: &str) -> Result<(), Error> {
        let info = self.own.info();
        let key = key_of(owner);
        let edit = |m: &mut ObjectMeta| {
            let before = m.finalizers.len();
            m.finalizers.retain(|f| f != finalizer);
            m.finalizers.len() != before
        };
        if self
            .own
            .edit_metadata(&key, &owner.uid, &edit)
            .await
            .during(|| format!("removing finalizer {finalizer} from {} {key}", info.kind))?
        {
            tracing::info!(kind = info.kind, object = %key, finalizer, "removed finalizer");
        }
        Ok(())
    }
}

impl Reconciler for Collector {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(meta) = self.own.cached(key) else {
            return Ok(Action::Done);
        };
        let result = if is_deleting(&meta) {
            if has_finalizer(&meta, ORPHAN_FINALIZER) {
                self.orphan_dependents(&meta).await
            } else if has_finalizer(&meta, FOREGROUND_FINALIZER) {
                self.finish_foreground(&meta).await
            } else {
                // Being deleted: its owners no longer matter.
                Ok(())
            }
        } else if meta.owner_references.is_empty() {
            Ok(())
        } else {
            self.collect_if_orphaned(&meta).await
        };
        if let Err(e) = &result {
            let routine = matches!(e, Error::Api { source, .. } if source.is_conflict());
            if !routine {
                self.recorder
                    .publish_about(
                        reference(self.own.info(), &meta),
                        EventType::Warning,
                        "GarbageCollectionFailed",
                        &crate::error_chain(e),
                    )
                    .await;
            }
        }
        result.map(|()| Action::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oref(api_version: &str, kind: &str, name: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            ..Default::default()
        }
    }

    #[test]
    fn references_match_kind_and_group() {
        assert!(refers_to(
            &oref("apps/v1", "ReplicaSet", "a"),
            &ReplicaSet::INFO
        ));
        assert!(!refers_to(
            &oref("v1", "ReplicaSet", "a"),
            &ReplicaSet::INFO
        ));
        assert!(!refers_to(
            &oref("apps/v1", "Deployment", "a"),
            &ReplicaSet::INFO
        ));
        assert!(refers_to(&oref("v1", "Pod", "a"), &Pod::INFO));
    }

    #[test]
    fn owner_keys_follow_scope() {
        let r = oref("apps/v1", "ReplicaSet", "web");
        assert_eq!(
            owner_key(&ReplicaSet::INFO, "shop", &r),
            Some(ObjectKey::new("shop", "web"))
        );
        // A namespaced owner cannot own a cluster-scoped object.
        assert_eq!(owner_key(&ReplicaSet::INFO, "", &r), None);
        let n = oref("v1", "Node", "n1");
        assert_eq!(
            owner_key(&skiff_api::api::Node::INFO, "shop", &n),
            Some(ObjectKey::cluster("n1"))
        );
    }

    #[test]
    fn waiting_needs_deletion_and_the_foreground_finalizer() {
        let mut m = ObjectMeta {
            finalizers: vec![FOREGROUND_FINALIZER.into()],
            ..Default::default()
        };
        assert!(!is_waiting_for_dependents(&m));
        m.deletion_timestamp = "2024-01-01T00:00:00Z".into();
        assert!(is_waiting_for_dependents(&m));
        m.finalizers = vec![ORPHAN_FINALIZER.into()];
        assert!(!is_waiting_for_dependents(&m));
    }
}
