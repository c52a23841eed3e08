//! The scheduler: keeps the [`Cache`] and the [`SchedulingQueue`] current from cluster
//! events, takes pods from the queue one at a time, runs the [`Algorithm`] on an
//! incrementally updated [`Snapshot`], assumes the pod on the chosen node and binds it
//! asynchronously; or reports why it does not fit and parks it until the cluster changes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{SecondsFormat, Utc};
use futures::{Stream, StreamExt};
use skiff_api::Resource;
use skiff_api::api::{Condition, Node, Pod, PodStatus};
use skiff_client::reflector::{Event, object_key, reflector};
use skiff_client::{Client, ClientError, ListParams};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;

use crate::cache::{Cache, NodeChange, PodInfo, Snapshot};
use crate::framework::{Algorithm, Profile};
use crate::queue::{BackoffPolicy, ClusterChange, QueueCounts, SchedulingQueue};
use skiff_client::controller::{EventRecorder, EventType};

/// The scheduler name pods get by default.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// How the scheduler behaves.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Pods whose `spec.schedulerName` is this (an empty one counts as
    /// [`DEFAULT_SCHEDULER_NAME`]) are scheduled; others are left alone.
    pub scheduler_name: String,
    /// Percentage of nodes to find feasible before scoring (0: adaptive, as Kubernetes; 100:
    /// all). Clusters under 100 nodes are always searched fully.
    pub percentage_of_nodes_to_score: u32,
    /// Pods parked as unschedulable for this long are retried even without a cluster change.
    pub unschedulable_timeout: Duration,
    /// Back-off of retries after errors.
    pub backoff: BackoffPolicy,
    /// Binding and status calls in flight at once.
    pub bind_concurrency: usize,
    /// An assumed pod is forgotten if the watch has not confirmed its binding this long after
    /// the binding call returned.
    pub assumed_ttl: Duration,
    /// `reportingInstance` of the Events written.
    pub instance: String,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            scheduler_name: DEFAULT_SCHEDULER_NAME.into(),
            percentage_of_nodes_to_score: 0,
            unschedulable_timeout: Duration::from_secs(60),
            backoff: BackoffPolicy::default(),
            bind_concurrency: 64,
            assumed_ttl: Duration::from_secs(30),
            instance: "skiff-scheduler".into(),
        }
    }
}

/// Something the scheduler failed at.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("the cluster event stream ended")]
    EventsEnded,
}

/// One change seen by the informers the scheduler is fed from.
///
/// The scheduler only consumes these; [`watch_cluster`] makes them from two reflectors today.
/// A shared informer can feed the same events instead (see [`Scheduler::run`]).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // Both are large; each event is moved once.
pub enum ClusterEvent {
    Node(Event<Node>),
    Pod(Event<Pod>),
}

/// Node and pod events from the API server: a reflector on all nodes and one on all pods.
pub fn watch_cluster(client: &Client) -> impl Stream<Item = ClusterEvent> + Send + 'static {
    let nodes = reflector(client.cluster::<Node>(), ListParams::default()).map(ClusterEvent::Node);
    let pods = reflector(client.all::<Pod>(), ListParams::default()).map(ClusterEvent::Pod);
    futures::stream::select(nodes, pods)
}

/// Counters since the start.
#[derive(Debug, Default)]
struct Stats {
    attempts: AtomicU64,
    scheduled: AtomicU64,
    unschedulable: AtomicU64,
    bind_errors: AtomicU64,
    algorithm_nanos: AtomicU64,
}

/// What the scheduler has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Scheduling attempts (one per pod taken from the queue).
    pub attempts: u64,
    /// Pods bound.
    pub scheduled: u64,
    /// Attempts where no node fit.
    pub unschedulable: u64,
    /// Binding calls that failed.
    pub bind_errors: u64,
    /// Time spent filtering and scoring.
    pub algorithm_time: Duration,
}

/// Everything the tasks of one scheduler share.
struct Shared {
    client: Client,
    config: SchedulerConfig,
    cache: Mutex<Cache>,
    queue: SchedulingQueue,
    stats: Stats,
    events: EventRecorder,
    calls: Arc<Semaphore>,
    /// Volume binding's informers (the scheduler made with [`Scheduler::new`] has them).
    volumes: Option<crate::volumes::VolumeBinding>,
}

impl Shared {
    /// The cache lock. Lock order: cache, then the queue's.
    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stats(&self) -> SchedulerStats {
        let s = &self.stats;
        SchedulerStats {
            attempts: s.attempts.load(Ordering::Relaxed),
            scheduled: s.scheduled.load(Ordering::Relaxed),
            unschedulable: s.unschedulable.load(Ordering::Relaxed),
            bind_errors: s.bind_errors.load(Ordering::Relaxed),
            algorithm_time: Duration::from_nanos(s.algorithm_nanos.load(Ordering::Relaxed)),
        }
    }

    fn responsible_for(&self, pod: &Pod) -> bool {
        let name = pod
            .spec
            .as_ref()
            .map(|s| s.scheduler_name.as_str())
            .unwrap_or("");
        let name = if name.is_empty() {
            DEFAULT_SCHEDULER_NAME
        } else {
            name
        };
        name == self.config.scheduler_name
    }
}

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .map(|s| s.node_name.as_str())
        .unwrap_or("")
}

fn terminal(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .is_some_and(|s| s.phase == "Succeeded" || s.phase == "Failed")
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata
        .as_ref()
        .is_some_and(|m| !m.deletion_timestamp.is_empty())
}

/// Aborts a task when dropped.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A scheduler, before it runs.
pub struct Scheduler {
    shared: Arc<Shared>,
    algorithm: Algorithm,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.shared.config)
            .field("algorithm", &self.algorithm)
            .finish()
    }
}

impl Scheduler {
    /// A scheduler with the default plugins, volume binding included (it reads
    /// PersistentVolumeClaims, PersistentVolumes and StorageClasses through informers).
    pub fn new(client: Client, config: SchedulerConfig) -> Scheduler {
        let informers = skiff_client::controller::Informers::new(client.clone());
        let volumes = crate::volumes::VolumeBinding::new(&informers);
        let mut profile = Profile::default();
        profile.filters.push(Box::new(volumes.clone()));
        Scheduler::build(client, config, profile, Some(volumes))
    }

    pub fn with_profile(client: Client, config: SchedulerConfig, profile: Profile) -> Scheduler {
        Scheduler::build(client, config, profile, None)
    }

    fn build(
        client: Client,
        config: SchedulerConfig,
        profile: Profile,
        volumes: Option<crate::volumes::VolumeBinding>,
    ) -> Scheduler {
        let algorithm = Algorithm::new(profile, config.percentage_of_nodes_to_score);
        let shared = Arc::new(Shared {
            events: EventRecorder::new(client.clone(), &config.scheduler_name, &config.instance),
            client,
            cache: Mutex::new(Cache::new()),
            queue: SchedulingQueue::new(config.backoff),
            stats: Stats::default(),
            calls: Arc::new(Semaphore::new(config.bind_concurrency.max(1))),
            config,
            volumes,
        });
        Scheduler { shared, algorithm }
    }

    /// Starts the scheduler on its own task, fed by [`watch_cluster`]. It stops when the
    /// handle is dropped or shut down.
    pub fn spawn(self) -> SchedulerHandle {
        let shared = self.shared.clone();
        let events = watch_cluster(&shared.client);
        SchedulerHandle {
            shared,
            task: Some(tokio::spawn(self.run(events))),
        }
    }

    /// Runs until `events` ends: applies the events to the cache and the queue, and
    /// schedules once the first node list and pod list have been seen.
    ///
    /// `events` must carry, for nodes and for pods, a `Restarted` list first and then every
    /// change (what [`watch_cluster`] and any informer give).
    pub async fn run(
        self,
        events: impl Stream<Item = ClusterEvent> + Send,
    ) -> Result<(), SchedulerError> {
        let shared = self.shared;
        let (synced_tx, synced_rx) = watch::channel(false);
        let _loop = AbortOnDrop(tokio::spawn(schedule_loop(
            shared.clone(),
            self.algorithm,
            synced_rx,
        )));
        let _timers = AbortOnDrop(tokio::spawn(timers(shared.clone())));
        // Claims, volumes and classes read by volume binding: listed before the first
        // decision, and each change retries the pods they parked.
        let _volume_changes = match shared.volumes.clone() {
            Some(v) => {
                v.wait_synced().await;
                let s = shared.clone();
                Some(AbortOnDrop(tokio::spawn(async move {
                    let mut changes = std::pin::pin!(v.changes());
                    while changes.next().await.is_some() {
                        s.queue.move_on(crate::queue::ClusterChange::VolumeChanged);
                    }
                })))
            }
            None => None,
        };
        tracing::info!(scheduler_name = %shared.config.scheduler_name, "scheduler started");
        let (mut nodes_listed, mut pods_listed) = (false, false);
        let mut events = std::pin::pin!(events);
        while let Some(ev) = events.next().await {
            match ev {
                ClusterEvent::Node(ev) => {
                    nodes_listed |= matches!(ev, Event::Restarted(_));
                    on_node_event(&shared, ev);
                }
                ClusterEvent::Pod(ev) => {
                    pods_listed |= matches!(ev, Event::Restarted(_));
                    on_pod_event(&shared, ev);
                }
            }
            if nodes_listed && pods_listed && !*synced_tx.borrow() {
                tracing::info!(
                    nodes = shared.cache().node_count(),
                    pending = shared.queue.counts().active,
                    "cache synced, scheduling"
                );
                synced_tx.send_replace(true);
            }
        }
        shared.queue.close();
        Err(SchedulerError::EventsEnded)
    }
}

/// A running scheduler. Dropping it stops the scheduler.
pub struct SchedulerHandle {
    shared: Arc<Shared>,
    task: Option<JoinHandle<Result<(), SchedulerError>>>,
}

impl std::fmt::Debug for SchedulerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerHandle")
            .field("stats", &self.stats())
            .finish()
    }
}

impl SchedulerHandle {
    pub fn stats(&self) -> SchedulerStats {
        self.shared.stats()
    }

    /// Pods waiting, per sub-queue.
    pub fn queue(&self) -> QueueCounts {
        self.shared.queue.counts()
    }

    /// Stops the scheduler (binding calls already made complete on their own).
    pub async fn shutdown(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for SchedulerHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn on_node_event(shared: &Shared, ev: Event<Node>) {
    let mut cache = shared.cache();
    match ev {
        Event::Restarted(nodes) => {
            cache.replace_nodes(nodes);
            shared.queue.move_on(ClusterChange::NodeAdded);
        }
        Event::Applied(node) => match cache.set_node(node) {
            NodeChange::Added => {
                shared.queue.move_on(ClusterChange::NodeAdded);
            }
            NodeChange::Updated => {
                shared.queue.move_on(ClusterChange::NodeUpdated);
            }
            NodeChange::Unchanged => {}
        },
        Event::Deleted(node) => cache.remove_node(node.name()),
    }
}

fn on_pod_event(shared: &Shared, ev: Event<Pod>) {
    match ev {
        Event::Restarted(pods) => {
            let mut cache = shared.cache();
            let mut bound = Vec::new();
            let mut pending = HashSet::new();
            for p in pods {
                if !node_name(&p).is_empty() {
                    if !terminal(&p) {
                        bound.push(Arc::new(p));
                    }
                } else if shared.responsible_for(&p) && !terminating(&p) && !terminal(&p) {
                    let key = object_key(&p);
                    if !cache.is_assumed(&key) {
                        pending.insert(key);
                        shared.queue.add_or_update(Arc::new(p));
                    }
                }
            }
            cache.replace_bound_pods(bound);
            shared.queue.retain(&pending);
            shared.queue.move_on(ClusterChange::PodDeleted);
        }
        Event::Applied(p) => apply_pod(shared, p),
        Event::Deleted(p) => {
            let key = object_key(&p);
            let mut cache = shared.cache();
            shared.queue.remove(&key);
            if cache.remove_pod(&key) {
                shared.queue.move_on(ClusterChange::PodDeleted);
            }
        }
    }
}

fn apply_pod(shared: &Shared, pod: Pod) {
    let key = object_key(&pod);
    let mut cache = shared.cache();
    if !node_name(&pod).is_empty() {
        shared.queue.remove(&key);
        if terminal(&pod) {
            if cache.remove_pod(&key) {
                shared.queue.move_on(ClusterChange::PodDeleted);
            }
        } else if cache.set_bound_pod(Arc::new(pod)) {
            shared.queue.move_on(ClusterChange::PodAssigned);
        }
        return;
    }
    if cache.is_assumed(&key) {
        // Ours, being bound; the watch has not shown the binding yet.
        return;
    }
    if shared.responsible_for(&pod) && !terminating(&pod) && !terminal(&pod) {
        shared.queue.add_or_update(Arc::new(pod));
    } else {
        shared.queue.remove(&key);
    }
}

/// Back-off and unschedulable flushes, and expiry of assumed pods.
async fn timers(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_slow = Instant::now();
    loop {
        tick.tick().await;
        let now = Instant::now();
        shared.queue.flush_backoff(now);
        if now.duration_since(last_slow) >= Duration::from_secs(1) {
            last_slow = now;
            let moved = shared
                .queue
                .flush_unschedulable(now, shared.config.unschedulable_timeout);
            if moved > 0 {
                tracing::debug!(moved, "retrying pods parked as unschedulable");
            }
            let expired = shared.cache().cleanup_expired(now);
            if !expired.is_empty() {
                shared.queue.move_on(ClusterChange::PodDeleted);
            }
        }
    }
}

async fn schedule_loop(
    shared: Arc<Shared>,
    mut algorithm: Algorithm,
    mut synced: watch::Receiver<bool>,
) {
    if synced.wait_for(|s| *s).await.is_err() {
        return;
    }
    let mut snapshot = Snapshot::new();
    while let Some(qp) = shared.queue.pop().await {
        shared.stats.attempts.fetch_add(1, Ordering::Relaxed);
        shared.cache().update_snapshot(&mut snapshot);
        let started = Instant::now();
        let result = algorithm.schedule(&snapshot, qp.pod.clone());
        shared.stats.algorithm_nanos.fetch_add(
            u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        match result {
            Ok(placement) => {
                let mut assumed = (*qp.pod).clone();
                assumed.spec.get_or_insert_with(Default::default).node_name =
                    placement.node.clone();
                let (info, _) = PodInfo::new(Arc::new(assumed));
                {
                    let mut cache = shared.cache();
                    if !shared.queue.done(&qp.key) {
                        // Deleted (or bound elsewhere) while we were choosing.
                        continue;
                    }
                    cache.assume_pod(info, &placement.node);
                }
                tracing::debug!(pod = %qp.key, node = %placement.node,
                    evaluated = placement.evaluated, feasible = placement.feasible, "assumed");
                let Ok(permit) = shared.calls.clone().acquire_owned().await else {
                    return;
                };
                tokio::spawn(bind(shared.clone(), qp.pod.clone(), placement.node, permit));
            }
            Err(fit) => {
                shared.stats.unschedulable.fetch_add(1, Ordering::Relaxed);
                let message = fit.message();
                tracing::info!(pod = %qp.key, attempts = qp.attempts + 1, %message, "unschedulable");
                let latest = shared.queue.pod(&qp.key).unwrap_or(qp.pod);
                shared.queue.unschedulable(&qp.key, qp.cycle, fit.plugins);
                let Ok(permit) = shared.calls.clone().acquire_owned().await else {
                    return;
                };
                tokio::spawn(report_unschedulable(
                    shared.clone(),
                    latest,
                    message,
                    permit,
                ));
            }
        }
    }
}

async fn bind(shared: Arc<Shared>, pod: Arc<Pod>, node: String, permit: OwnedSemaphorePermit) {
    let key = object_key(&*pod);
    let api = shared.client.namespaced::<Pod>(pod.namespace());
    if let Some(v) = &shared.volumes
        && let Err(e) = v.pre_bind(&shared.client, &pod, &node).await
    {
        // The provisioner also follows the bound pod's node; binding goes on.
        tracing::warn!(pod = %key, error = %e, "marking the pod's claims with its node");
    }
    let result = api.bind(pod.name(), &node).await;
    drop(permit);
    match result {
        Ok(_) => {
            shared
                .cache()
                .finish_binding(&key, shared.config.assumed_ttl);
            shared.stats.scheduled.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(pod = %key, %node, "bound");
            let message = format!("Successfully assigned {key} to {node}");
            shared
                .events
                .publish(&*pod, EventType::Normal, "Scheduled", &message)
                .await;
        }
        Err(e) => {
            shared.cache().forget_pod(&key);
            shared.stats.bind_errors.fetch_add(1, Ordering::Relaxed);
            if e.is_not_found() {
                tracing::debug!(pod = %key, "pod deleted before it was bound");
                return;
            }
            if e.is_conflict() {
                // Already bound (by someone else) or being deleted: the watch will tell.
                match api.get_opt(pod.name()).await {
                    Ok(Some(live)) if node_name(&live).is_empty() && !terminating(&live) => {}
                    Ok(_) => return,
                    Err(err) => {
                        tracing::debug!(pod = %key, error = %err, "re-reading pod after a failed binding")
                    }
                }
            }
            tracing::warn!(pod = %key, %node, error = %e, "binding failed, will retry");
            let message = format!("Binding rejected: {e}");
            shared
                .events
                .publish(&*pod, EventType::Warning, "FailedScheduling", &message)
                .await;
            let cache = shared.cache();
            if !cache.has_pod(&key) {
                shared.queue.retry_after_error(pod);
            }
            drop(cache);
        }
    }
}

/// Sets `PodScheduled=False` (reason `Unschedulable`) with `message` and records a
/// `FailedScheduling` event.
async fn report_unschedulable(
    shared: Arc<Shared>,
    pod: Arc<Pod>,
    message: String,
    _permit: OwnedSemaphorePermit,
) {
    let key = object_key(&*pod);
    shared
        .events
        .publish(&*pod, EventType::Warning, "FailedScheduling", &message)
        .await;
    if let Err(e) = set_unschedulable_condition(&shared.client, (*pod).clone(), &message).await {
        tracing::warn!(pod = %key, error = %e, "could not set PodScheduled=False");
    }
}

/// The pod's status with `PodScheduled=False, reason Unschedulable, message`; `None` if it
/// already says so.
pub fn unschedulable_status(pod: &Pod, message: &str) -> Option<PodStatus> {
    let mut status = pod.status.clone().unwrap_or_default();
    let now = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    match status
        .conditions
        .iter_mut()
        .find(|c| c.r#type == "PodScheduled")
    {
        Some(c) if c.status == "False" && c.reason == "Unschedulable" && c.message == message => {
            return None;
        }
        Some(c) => {
            if c.status != "False" {
                c.last_transition_time = now.clone();
            }
            c.status = "False".into();
            c.reason = "Unschedulable".into();
            c.message = message.into();
            c.last_probe_time = now;
        }
        None => status.conditions.push(Condition {
            r#type: "PodScheduled".into(),
            status: "False".into(),
            reason: "Unschedulable".into(),
            message: message.into(),
            last_transition_time: now.clone(),
            last_probe_time: now,
            ..Default::default()
        }),
    }
    if status.phase.is_empty() {
        status.phase = "Pending".into();
    }
    Some(status)
}

async fn set_unschedulable_condition(
    client: &Client,
    mut pod: Pod,
    message: &str,
) -> Result<(), ClientError> {
    let api = client.namespaced::<Pod>(pod.namespace());
    for _ in 0..3 {
        if !node_name(&pod).is_empty() || terminating(&pod) {
            return Ok(());
        }
        let Some(status) = unschedulable_status(&pod, message) else {
            return Ok(());
        };
        pod.status = Some(status);
        match api.update_status(&pod).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) if e.is_conflict() => match api.get_opt(pod.name()).await? {
                Some(live) => pod = live,
                None => return Ok(()),
            },
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_testkit::build::pod;

    #[test]
    fn unschedulable_condition() {
        let p = pod("p");
        let s = unschedulable_status(&p, "0/1 nodes are available: 1 Insufficient cpu.").unwrap();
        let c = &s.conditions[0];
        assert_eq!(
            (c.r#type.as_str(), c.status.as_str(), c.reason.as_str()),
            ("PodScheduled", "False", "Unschedulable")
        );
        assert_eq!(s.phase, "Pending");
        let mut p2 = p.clone();
        p2.status = Some(s);
        assert!(
            unschedulable_status(&p2, "0/1 nodes are available: 1 Insufficient cpu.").is_none()
        );
        let s2 = unschedulable_status(&p2, "0/2 nodes are available: 2 Insufficient cpu.").unwrap();
        assert_eq!(s2.conditions.len(), 1);
        assert_eq!(
            s2.conditions[0].message,
            "0/2 nodes are available: 2 Insufficient cpu."
        );
    }
}
