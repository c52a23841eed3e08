//! The scheduling queue: pods waiting for a node.
//!
//! - **active**: ready to be tried, highest `spec.priority` first, then oldest;
//! - **backoff**: failed for a transient reason (or while the cluster changed under them);
//!   retried after 1 s, doubling per attempt up to 10 s;
//! - **unschedulable**: no node fits; parked until a cluster change that may help
//!   ([`SchedulingQueue::move_on`]) or the periodic flush
//!   ([`SchedulingQueue::flush_unschedulable`]).
//!
//! A pod being scheduled is *in flight*: updates to it are kept for when it comes back.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use skiff_api::api::Pod;
use skiff_client::reflector::object_key;
use tokio::sync::Notify;

use crate::cache::pod_labels;

/// What changed in the cluster, for moving parked pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterChange {
    NodeAdded,
    NodeUpdated,
    /// A bound pod was deleted or finished: resources and anti-affinity may be free.
    PodDeleted,
    /// A pod was bound or its labels changed: pod affinity may now be met.
    PodAssigned,
    /// A PersistentVolumeClaim, PersistentVolume or StorageClass changed.
    VolumeChanged,
}

impl ClusterChange {
    /// Whether a pod rejected by `plugins` may fit after this change.
    fn may_help(&self, plugins: &BTreeSet<&'static str>) -> bool {
        match self {
            ClusterChange::NodeAdded | ClusterChange::NodeUpdated => true,
            ClusterChange::PodDeleted => {
                plugins.is_empty()
                    || plugins.contains("NodeResourcesFit")
                    || plugins.contains("InterPodAffinity")
            }
            ClusterChange::VolumeChanged => plugins.is_empty() || plugins.contains("VolumeBinding"),
            ClusterChange::PodAssigned => {
                plugins.is_empty() || plugins.contains("InterPodAffinity")
            }
        }
    }
}

/// Back-off before retry.
#[derive(Debug, Clone, Copy)]
pub struct BackoffPolicy {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
        }
    }
}

impl BackoffPolicy {
    fn after(&self, attempts: u32) -> Duration {
        let shift = attempts.saturating_sub(1).min(16);
        (self.initial * (1u32 << shift)).min(self.max)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    Active,
    Backoff(Instant),
    Unschedulable(Instant),
    InFlight,
}

#[derive(Debug)]
struct Entry {
    pod: Arc<Pod>,
    place: Where,
    /// Identifies the entry's current heap item (older items are stale).
    seq: u64,
    attempts: u32,
    last_failure: Option<Instant>,
    unschedulable_plugins: BTreeSet<&'static str>,
}

/// Order of the active heap: priority, then creation time, then arrival.
#[derive(Debug, PartialEq, Eq)]
struct ActiveItem {
    priority: i32,
    created: String,
    seq: u64,
    key: String,
}

impl Ord for ActiveItem {
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.created.cmp(&self.created))
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for ActiveItem {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Keys of the entries in `Where::Unschedulable`.
    parked: HashSet<String>,
    active: BinaryHeap<ActiveItem>,
    backoff: BinaryHeap<Reverse<(Instant, u64, String)>>,
    seq: u64,
    scheduling_cycle: u64,
    move_request_cycle: u64,
    closed: bool,
}

/// A pod taken from the queue to be scheduled.
#[derive(Debug, Clone)]
pub struct QueuedPod {
    pub key: String,
    pub pod: Arc<Pod>,
    /// Attempts before this one.
    pub attempts: u32,
    /// The scheduling cycle this attempt belongs to.
    pub cycle: u64,
}

/// Counts per sub-queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub active: usize,
    pub backoff: usize,
    pub unschedulable: usize,
    pub in_flight: usize,
}

/// See the module documentation. Cheap operations under one mutex; [`SchedulingQueue::pop`]
/// waits without holding it.
#[derive(Debug, Default)]
pub struct SchedulingQueue {
    inner: Mutex<Inner>,
    notify: Notify,
    backoff: BackoffPolicy,
}

/// Whether an update of a parked pod may change the scheduling outcome (spec or labels, not
/// status or resourceVersion).
fn spec_or_labels_changed(old: &Pod, new: &Pod) -> bool {
    old.spec != new.spec || pod_labels(old) != pod_labels(new)
}

impl Inner {
    fn push_active(&mut self, key: &str) {
        self.seq += 1;
        let seq = self.seq;
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        e.place = Where::Active;
        e.seq = seq;
        self.parked.remove(key);
        let spec = e.pod.spec.as_ref();
        self.active.push(ActiveItem {
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            created: e
                .pod
                .metadata
                .as_ref()
                .map(|m| m.creation_timestamp.clone())
                .unwrap_or_default(),
            seq,
            key: key.to_string(),
        });
    }

    fn push_backoff(&mut self, key: &str, until: Instant) {
        self.seq += 1;
        let seq = self.seq;
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        e.place = Where::Backoff(until);
        e.seq = seq;
        self.parked.remove(key);
        self.backoff.push(Reverse((until, seq, key.to_string())));
    }

    /// Active now, or in backoff if its last failure is too recent.
    fn reactivate(&mut self, key: &str, policy: &BackoffPolicy, now: Instant) {
        let until = self.entries.get(key).and_then(|e| {
            e.last_failure
                .map(|t| t + policy.after(e.attempts))
                .filter(|u| *u > now)
        });
        match until {
            Some(u) => self.push_backoff(key, u),
            None => self.push_active(key),
        }
    }
}

impl SchedulingQueue {
    pub fn new(backoff: BackoffPolicy) -> SchedulingQueue {
        SchedulingQueue {
            inner: Mutex::default(),
            notify: Notify::new(),
            backoff,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a pending pod, or updates the one with its key.
    pub fn add_or_update(&self, pod: Arc<Pod>) {
        let key = object_key(&*pod);
        let mut q = self.lock();
        let now = Instant::now();
        match q.entries.get_mut(&key) {
            None => {
                q.entries.insert(
                    key.clone(),
                    Entry {
                        pod,
                        place: Where::Active,
                        seq: 0,
                        attempts: 0,
                        last_failure: None,
                        unschedulable_plugins: BTreeSet::new(),
                    },
                );
                q.push_active(&key);
                drop(q);
                self.notify.notify_one();
            }
            Some(e) => {
                let changed = spec_or_labels_changed(&e.pod, &pod);
                e.pod = pod;
                if changed && matches!(e.place, Where::Unschedulable(_)) {
                    q.reactivate(&key, &self.backoff, now);
                    drop(q);
                    self.notify.notify_one();
                }
            }
        }
    }

    /// Forgets a pod (deleted, bound, or no longer ours).
    pub fn remove(&self, key: &str) {
        let mut q = self.lock();
        q.entries.remove(key);
        q.parked.remove(key);
    }

    pub fn contains(&self, key: &str) -> bool {
        self.lock().entries.contains_key(key)
    }

    /// Waits for the next pod to schedule; `None` once the queue is closed.
    pub async fn pop(&self) -> Option<QueuedPod> {
        loop {
            let notified = self.notify.notified();
            if let Some(p) = self.try_pop() {
                return Some(p);
            }
            if self.lock().closed {
                return None;
            }
            notified.await;
        }
    }

    /// The next pod to schedule, if one is active.
    pub fn try_pop(&self) -> Option<QueuedPod> {
        let mut q = self.lock();
        while let Some(item) = q.active.pop() {
            let live = q
                .entries
                .get(&item.key)
                .is_some_and(|e| e.place == Where::Active && e.seq == item.seq);
            if !live {
                continue;
            }
            q.scheduling_cycle += 1;
            let cycle = q.scheduling_cycle;
            let e = q.entries.get_mut(&item.key)?;
            e.place = Where::InFlight;
            return Some(QueuedPod {
                key: item.key,
                pod: e.pod.clone(),
                attempts: e.attempts,
                cycle,
            });
        }
        None
    }

    /// The in-flight pod was assumed on a node: it leaves the queue. Returns false if it
    /// was removed meanwhile (deleted), in which case the caller should not bind it.
    pub fn done(&self, key: &str) -> bool {
        let mut q = self.lock();
        q.parked.remove(key);
        q.entries.remove(key).is_some()
    }

    /// The latest version of a queued pod.
    pub fn pod(&self, key: &str) -> Option<Arc<Pod>> {
        self.lock().entries.get(key).map(|e| e.pod.clone())
    }

    /// No node fits the in-flight pod of `cycle`: park it, unless the cluster changed since
    /// the cycle began, in which case it is retried after its back-off.
    pub fn unschedulable(&self, key: &str, cycle: u64, plugins: BTreeSet<&'static str>) {
        let mut q = self.lock();
        let now = Instant::now();
        let moved_meanwhile = q.move_request_cycle >= cycle;
        let Some(e) = q.entries.get_mut(key) else {
            return;
        };
        e.attempts += 1;
        e.last_failure = Some(now);
        e.unschedulable_plugins = plugins;
        if moved_meanwhile {
            let until = now + self.backoff.after(e.attempts);
            q.push_backoff(key, until);
        } else {
            e.place = Where::Unschedulable(now);
            q.parked.insert(key.to_string());
        }
    }

    /// Retries a pod after its back-off (binding failed, transient error). The pod is
    /// re-added if it had left the queue.
    pub fn retry_after_error(&self, pod: Arc<Pod>) {
        let key = object_key(&*pod);
        let mut q = self.lock();
        let now = Instant::now();
        let e = q.entries.entry(key.clone()).or_insert_with(|| Entry {
            pod: pod.clone(),
            place: Where::InFlight,
            seq: 0,
            attempts: 0,
            last_failure: None,
            unschedulable_plugins: BTreeSet::new(),
        });
        e.pod = pod;
        e.attempts += 1;
        e.last_failure = Some(now);
        e.unschedulable_plugins.clear();
        let until = now + self.backoff.after(e.attempts);
        q.push_backoff(&key, until);
    }

    /// The cluster changed: parked pods it may help are retried (after their back-off).
    /// Returns how many moved.
    pub fn move_on(&self, change: ClusterChange) -> usize {
        let mut q = self.lock();
        q.move_request_cycle = q.scheduling_cycle;
        let now = Instant::now();
        let keys: Vec<String> = q
            .parked
            .iter()
            .filter(|k| {
                q.entries
                    .get(*k)
                    .is_some_and(|e| change.may_help(&e.unschedulable_plugins))
            })
            .cloned()
            .collect();
        for k in &keys {
            q.reactivate(k, &self.backoff, now);
        }
        drop(q);
        if !keys.is_empty() {
            self.notify.notify_one();
        }
        keys.len()
    }

    /// Moves pods whose back-off has passed to active. Returns how many moved.
    pub fn flush_backoff(&self, now: Instant) -> usize {
        let mut q = self.lock();
        let mut moved = 0;
        while let Some(Reverse((until, seq, key))) = q.backoff.peek().cloned() {
            if until > now {
                break;
            }
            q.backoff.pop();
            let live = q
                .entries
                .get(&key)
                .is_some_and(|e| e.seq == seq && matches!(e.place, Where::Backoff(_)));
            if live {
                q.push_active(&key);
                moved += 1;
            }
        }
        drop(q);
        if moved > 0 {
            self.notify.notify_one();
        }
        moved
    }

    /// The periodic flush: pods parked for at least `max_age` are retried. Returns how many.
    pub fn flush_unschedulable(&self, now: Instant, max_age: Duration) -> usize {
        let mut q = self.lock();
        let keys: Vec<String> = q
            .parked
            .iter()
            .filter(|k| {
                q.entries.get(*k).is_some_and(|e| {
                    matches!(e.place, Where::Unschedulable(t) if now.duration_since(t) >= max_age)
                })
            })
            .cloned()
            .collect();
        for k in &keys {
            q.push_active(k);
        }
        drop(q);
        if !keys.is_empty() {
            self.notify.notify_one();
        }
        keys.len()
    }

    /// Keeps only the pods whose keys are in `keep` (after a relist).
    pub fn retain(&self, keep: &HashSet<String>) {
        let mut q = self.lock();
        q.entries.retain(|k, _| keep.contains(k));
        q.parked.retain(|k| keep.contains(k));
    }

    /// Wakes [`SchedulingQueue::pop`] for good.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    pub fn counts(&self) -> QueueCounts {
        let q = self.lock();
        let mut c = QueueCounts::default();
        for e in q.entries.values() {
            match e.place {
                Where::Active => c.active += 1,
                Where::Backoff(_) => c.backoff += 1,
                Where::Unschedulable(_) => c.unschedulable += 1,
                Where::InFlight => c.in_flight += 1,
            }
        }
        c
    }

    /// The earliest back-off expiry, to know when to flush next.
    pub fn next_backoff(&self) -> Option<Instant> {
        self.lock().backoff.peek().map(|Reverse((t, _, _))| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_testkit::build::{pod, spec_mut};

    fn queued(name: &str, priority: i32, created: &str) -> Arc<Pod> {
        let mut p = pod(name);
        spec_mut(&mut p).priority = Some(priority);
        if let Some(m) = p.metadata.as_mut() {
            m.creation_timestamp = created.into();
        }
        Arc::new(p)
    }

    fn fast() -> SchedulingQueue {
        SchedulingQueue::new(BackoffPolicy {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(1),
        })
    }

    #[test]
    fn priority_then_age() {
        let q = fast();
        q.add_or_update(queued("late", 0, "2024-01-01T00:00:05Z"));
        q.add_or_update(queued("early", 0, "2024-01-01T00:00:01Z"));
        q.add_or_update(queued("urgent", 10, "2024-01-01T00:00:09Z"));
        let order: Vec<String> = std::iter::from_fn(|| q.try_pop().map(|p| p.key)).collect();
        assert_eq!(order, ["default/urgent", "default/early", "default/late"]);
        assert_eq!(q.counts().in_flight, 3);
    }

    #[test]
    fn unschedulable_pods_wait_for_a_helpful_change() {
        let q = fast();
        q.add_or_update(queued("p", 0, "t"));
        let p = q.try_pop().unwrap();
        q.unschedulable(&p.key, p.cycle, ["NodeResourcesFit"].into());
        assert_eq!(q.counts().unschedulable, 1);
        assert!(q.try_pop().is_none());
        // A status-only update (our own condition write) does not move it.
        let mut same = (*p.pod).clone();
        same.status = Some(Default::default());
        q.add_or_update(Arc::new(same));
        assert_eq!(q.counts().unschedulable, 1);
        // A pod being assigned does not help a resource failure; a deletion does.
        assert_eq!(q.move_on(ClusterChange::PodAssigned), 0);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(q.move_on(ClusterChange::PodDeleted), 1);
        assert_eq!(q.try_pop().map(|p| p.attempts), Some(1));
    }

    #[test]
    fn change_during_the_cycle_is_not_missed() {
        let q = fast();
        q.add_or_update(queued("p", 0, "t"));
        let p = q.try_pop().unwrap();
        // A node appears while the pod is being scheduled against the old snapshot.
        q.move_on(ClusterChange::NodeAdded);
        q.unschedulable(&p.key, p.cycle, ["NodeResourcesFit"].into());
        assert_eq!(q.counts().backoff, 1, "goes to backoff, not parked");
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(q.flush_backoff(Instant::now()), 1);
        assert!(q.try_pop().is_some());
    }

    #[test]
    fn periodic_flush_and_updates() {
        let q = fast();
        q.add_or_update(queued("p", 0, "t"));
        let p = q.try_pop().unwrap();
        q.unschedulable(&p.key, p.cycle, ["NodeAffinity"].into());
        assert_eq!(
            q.flush_unschedulable(Instant::now(), Duration::from_secs(60)),
            0
        );
        assert_eq!(
            q.flush_unschedulable(
                Instant::now() + Duration::from_secs(61),
                Duration::from_secs(60)
            ),
            1
        );
        let p = q.try_pop().unwrap();
        q.unschedulable(&p.key, p.cycle, ["NodeAffinity"].into());
        // A spec change (e.g. a toleration added) makes it worth another try.
        let mut changed = (*p.pod).clone();
        spec_mut(&mut changed).tolerations.push(Default::default());
        std::thread::sleep(Duration::from_millis(5));
        q.add_or_update(Arc::new(changed));
        assert!(q.try_pop().is_some());
    }

    #[test]
    fn removal_and_done() {
        let q = fast();
        q.add_or_update(queued("a", 0, "t"));
        q.add_or_update(queued("b", 0, "t"));
        q.remove("default/a");
        let p = q.try_pop().unwrap();
        assert_eq!(p.key, "default/b");
        assert!(q.try_pop().is_none());
        // Updates while in flight are kept but do not requeue.
        q.add_or_update(queued("b", 0, "t"));
        assert!(q.try_pop().is_none());
        assert!(q.done("default/b"));
        assert!(!q.done("default/b"));
        q.retry_after_error(p.pod.clone());
        assert_eq!(q.counts().backoff, 1);
        std::thread::sleep(Duration::from_millis(5));
        q.flush_backoff(Instant::now());
        assert_eq!(q.try_pop().map(|p| p.attempts), Some(1));
    }

    #[tokio::test]
    async fn pop_waits_and_close_ends_it() {
        let q = Arc::new(fast());
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.pop().await.map(|p| p.key) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.add_or_update(queued("x", 0, "t"));
        assert_eq!(waiter.await.unwrap().as_deref(), Some("default/x"));
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.pop().await.is_none() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.close();
        assert!(waiter.await.unwrap());
    }
}
