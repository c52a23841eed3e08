//! [`Controller`]: the one reconcile loop every controller runs. Informers feed keys into a
//! [`WorkQueue`] (the primary objects themselves, and the owners of objects they control);
//! workers hand each key to a [`Reconciler`]; errors are retried with per-key back-off.
//! Level-triggered: a reconciler gets only a key and reads the current state from informers.

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use skiff_api::Resource;
use tokio::task::JoinSet;

use super::cancel::CancelToken;
use super::informer::{Change, Informer, Informers, controller_of};
use super::key::ObjectKey;
use super::queue::{RateLimiter, WorkQueue};

/// What to do with a key after a successful reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until something changes.
    Done,
    /// Look again after this long even if nothing changes (e.g. waiting for a pod to have
    /// been ready for `minReadySeconds`).
    RequeueAfter(Duration),
}

/// The logic of one controller: bring the object named by `key` (and what it owns) to its
/// desired state. It may be called at any time, any number of times, for objects that no
/// longer exist; one key is never reconciled twice concurrently.
pub trait Reconciler: Send + Sync + 'static {
    type Error: std::error::Error + Send + Sync + 'static;

    fn reconcile(
        &self,
        key: &ObjectKey,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send;
}

type Source = Box<dyn FnOnce(WorkQueue<ObjectKey>) -> BoxFuture<'static, ()> + Send>;
type SyncWait = BoxFuture<'static, ()>;

/// A controller of resource `T`: its informer, what else it watches, and its work queue.
pub struct Controller<T: Resource> {
    name: String,
    informers: Informers,
    primary: Informer<T>,
    queue: WorkQueue<ObjectKey>,
    sources: Vec<Source>,
    syncs: Vec<SyncWait>,
    shutdown: Option<CancelToken>,
    resync: Option<Duration>,
}

impl<T: Resource> fmt::Debug for Controller<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("primary", &T::INFO.plural)
            .field("sources", &self.sources.len())
            .finish_non_exhaustive()
    }
}

/// Keys of the objects a change involves (both states of an update), deduplicated.
fn keys_of<C>(change: &Change<C>, map: &impl Fn(&C) -> Vec<ObjectKey>) -> BTreeSet<ObjectKey> {
    change.objects().flat_map(|o| map(o)).collect()
}

impl<T: Resource> Controller<T> {
    /// A controller of `T`, using (and sharing) the informers of `informers`. It watches every
    /// `T` (each change queues the object's key).
    pub fn new(informers: &Informers) -> Self {
        let primary = informers.get::<T>();
        let mut c = Controller {
            name: T::INFO.plural.to_string(),
            informers: informers.clone(),
            primary: primary.clone(),
            queue: WorkQueue::new(RateLimiter::default()),
            sources: Vec::new(),
            syncs: Vec::new(),
            shutdown: None,
            resync: None,
        };
        c = c.watches(&primary, |o: &T| vec![ObjectKey::of(o)]);
        c
    }

    /// The name used in logs (default: the plural of `T`).
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Uses `limiter` for the back-off of failed keys.
    pub fn rate_limiter(mut self, limiter: RateLimiter) -> Self {
        self.queue = WorkQueue::new(limiter);
        self
    }

    /// Stop when `token` is cancelled: no new keys are handed out, keys being reconciled
    /// finish, then [`Controller::run`] returns.
    pub fn graceful_shutdown_on(mut self, token: CancelToken) -> Self {
        self.shutdown = Some(token);
        self
    }

    /// Queues every `T` again every `period` (a safety net; controllers should not need it).
    pub fn resync_every(mut self, period: Duration) -> Self {
        self.resync = Some(period);
        self
    }

    /// Watches `informer`'s objects: each change queues the keys `map` returns for the
    /// object's old and new state.
    pub fn watches<C: Resource>(
        mut self,
        informer: &Informer<C>,
        map: impl Fn(&C) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) -> Self {
        let informer = informer.clone();
        let waiter = informer.clone();
        self.syncs
            .push(async move { waiter.wait_synced().await }.boxed());
        self.sources
            .push(Box::new(move |queue: WorkQueue<ObjectKey>| {
                async move {
                    let mut changes = informer.subscribe();
                    while let Some(change) = changes.recv().await {
                        for key in keys_of(&change, &map) {
                            queue.add(key);
                        }
                    }
                }
                .boxed()
            }));
        self
    }

    /// Watches objects of type `C` controlled by a `T` (their ownerReference with
    /// `controller: true` names a `T`): a change queues the owner. Uses the shared informer
    /// of `C`.
    pub fn watches_owned<C: Resource>(self) -> Self {
        let informer = self.informers.get::<C>();
        self.watches_owned_by(&informer)
    }

    /// Like [`Controller::watches_owned`], with a given informer.
    pub fn watches_owned_by<C: Resource>(self, informer: &Informer<C>) -> Self {
        self.watches(informer, owner_key::<T, C>)
    }

    /// The informer of the primary type.
    pub fn informer(&self) -> &Informer<T> {
        &self.primary
    }

    /// The shared informers this controller uses.
    pub fn informers(&self) -> &Informers {
        &self.informers
    }

    /// The work queue (to queue keys from elsewhere).
    pub fn queue(&self) -> WorkQueue<ObjectKey> {
        self.queue.clone()
    }

    /// Runs the controller with `workers` concurrent reconciles: starts the watches, waits
    /// for every informer to sync, then reconciles keys until the shutdown token (if any) is
    /// cancelled. Without a token it runs until dropped (dropping aborts everything).
    pub async fn run<R: Reconciler>(self, reconciler: Arc<R>, workers: usize) {
        let Controller {
            name,
            primary,
            queue,
            sources,
            syncs,
            shutdown,
            resync,
            ..
        } = self;
        let shutdown = shutdown.unwrap_or_default();
        let mut feeders = JoinSet::new();
        for source in sources {
            feeders.spawn(source(queue.clone()));
        }
        tokio::select! {
            _ = futures::future::join_all(syncs) => {}
            _ = shutdown.cancelled() => {
                queue.shut_down();
                return;
            }
        }
        tracing::info!(controller = %name, workers, "caches synced, starting workers");
        if let Some(period) = resync {
            let (primary, queue) = (primary.clone(), queue.clone());
            feeders.spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    for o in primary.list() {
                        queue.add(ObjectKey::of(&*o));
                    }
                }
            });
        }
        let stop = async {
            shutdown.cancelled().await;
            tracing::info!(controller = %name, "shutting down");
            queue.shut_down();
            feeders.abort_all();
        };
        futures::future::join(run_workers(&name, queue.clone(), reconciler, workers), stop).await;
    }
}

/// The key of the `T` that controls `child`, if one does (a namespaced owner is in the
/// child's namespace; a cluster-scoped one has none).
pub fn owner_key<T: Resource, C: Resource>(child: &C) -> Vec<ObjectKey> {
    let namespace = if T::INFO.namespaced {
        child.namespace()
    } else {
        ""
    };
    controller_of(child)
        .filter(|r| r.kind == T::INFO.kind && api_group(&r.api_version) == T::INFO.group())
        .map(|r| ObjectKey::new(namespace, r.name.clone()))
        .into_iter()
        .collect()
}

fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

/// Runs `workers` workers reconciling the keys of `queue` with `reconciler` until the queue
/// is shut down: the loop every [`Controller`] runs, for reconcilers whose keys come from
/// elsewhere (a kind known only at run time).
pub async fn run_workers<R: Reconciler>(
    name: &str,
    queue: WorkQueue<ObjectKey>,
    reconciler: Arc<R>,
    workers: usize,
) {
    let mut pool = JoinSet::new();
    for _ in 0..workers.max(1) {
        pool.spawn(worker(
            name.to_string(),
            queue.clone(),
            Arc::clone(&reconciler),
        ));
    }
    while pool.join_next().await.is_some() {}
}

async fn worker<R: Reconciler>(name: String, queue: WorkQueue<ObjectKey>, reconciler: Arc<R>) {
    while let Some(key) = queue.next().await {
        let result = AssertUnwindSafe(reconciler.reconcile(&key))
            .catch_unwind()
            .await;
        match result {
            Ok(Ok(Action::Done)) => queue.forget(&key),
            Ok(Ok(Action::RequeueAfter(d))) => {
                queue.forget(&key);
                queue.add_after(key.clone(), d);
            }
            Ok(Err(e)) => {
                let retries = queue.num_requeues(&key);
                let error = error_chain(&e);
                // Conflicts with a stale cache are routine; persistent failures are not.
                if retries < 5 {
                    tracing::info!(controller = %name, %key, retries, %error, "reconcile failed, retrying");
                } else {
                    tracing::warn!(controller = %name, %key, retries, %error, "reconcile failed, retrying");
                }
                queue.add_rate_limited(key.clone());
            }
            Err(_) => {
                tracing::error!(controller = %name, %key, "reconcile panicked, retrying");
                queue.add_rate_limited(key.clone());
            }
        }
        queue.done(&key);
    }
}

/// `error: cause: cause` for logs.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ObjectMeta, OwnerReference, Pod, ReplicaSet};

    #[test]
    fn owner_keys_need_a_controller_reference_of_the_right_kind() {
        let mut pod = Pod {
            metadata: Some(ObjectMeta {
                name: "p".into(),
                namespace: "ns".into(),
                owner_references: vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "ReplicaSet".into(),
                    name: "web".into(),
                    uid: "u".into(),
                    controller: Some(true),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            owner_key::<ReplicaSet, Pod>(&pod),
            [ObjectKey::new("ns", "web")]
        );
        pod.metadata_mut().owner_references[0].kind = "Node".into();
        pod.metadata_mut().owner_references[0].api_version = "v1".into();
        assert_eq!(
            owner_key::<skiff_api::api::Node, Pod>(&pod),
            [ObjectKey::cluster("web")]
        );
        pod.metadata_mut().owner_references[0].kind = "ReplicaSet".into();
        pod.metadata_mut().owner_references[0].api_version = "apps/v1".into();
        pod.metadata_mut().owner_references[0].controller = None;
        assert!(owner_key::<ReplicaSet, Pod>(&pod).is_empty());
        pod.metadata_mut().owner_references[0].controller = Some(true);
        pod.metadata_mut().owner_references[0].api_version = "v1".into();
        assert!(owner_key::<ReplicaSet, Pod>(&pod).is_empty());
    }
}
