//! [`WorkQueue`]: the keys controllers have to look at, deduplicated, with delayed and
//! rate-limited (per-key exponential back-off) re-adds. A key that is being processed is never
//! handed out a second time until [`WorkQueue::done`]; adding it meanwhile makes it come out
//! again afterwards (client-go's workqueue semantics).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Per-key exponential back-off: `base * 2^failures`, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimiter {
    pub base: Duration,
    pub max: Duration,
}

impl Default for RateLimiter {
    /// 5 ms doubling to 1000 s, like client-go's default controller rate limiter.
    fn default() -> Self {
        RateLimiter {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
        }
    }
}

impl RateLimiter {
    /// The delay after `failures` earlier failures of a key.
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }
}

/// A key due at a later time. Ordered by (deadline, insertion) only, reversed for a min-heap.
struct Delayed<K> {
    at: Instant,
    seq: u64,
    key: K,
}

impl<K> PartialEq for Delayed<K> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<K> Eq for Delayed<K> {}
impl<K> PartialOrd for Delayed<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Delayed<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct QueueState<K> {
    /// Keys ready to be handed out, in order.
    queue: VecDeque<K>,
    /// Keys that need processing (queued, or added again while being processed).
    dirty: HashSet<K>,
    /// Keys handed out and not yet `done`.
    processing: HashSet<K>,
    /// Keys added with a delay; `waiting_at` holds each key's earliest deadline (heap entries
    /// that do not match it are stale).
    waiting: BinaryHeap<Delayed<K>>,
    waiting_at: HashMap<K, Instant>,
    failures: HashMap<K, u32>,
    seq: u64,
    shut_down: bool,
}

struct QueueInner<K> {
    state: Mutex<QueueState<K>>,
    notify: Notify,
    limiter: RateLimiter,
}

/// A deduplicating work queue of keys, shared by clones.
pub struct WorkQueue<K> {
    shared: Arc<QueueInner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K> fmt::Debug for WorkQueue<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkQueue")
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Default for WorkQueue<K> {
    fn default() -> Self {
        WorkQueue::new(RateLimiter::default())
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    pub fn new(limiter: RateLimiter) -> Self {
        WorkQueue {
            shared: Arc::new(QueueInner {
                state: Mutex::new(QueueState {
                    queue: VecDeque::new(),
                    dirty: HashSet::new(),
                    processing: HashSet::new(),
                    waiting: BinaryHeap::new(),
                    waiting_at: HashMap::new(),
                    failures: HashMap::new(),
                    seq: 0,
                    shut_down: false,
                }),
                notify: Notify::new(),
                limiter,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState<K>> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `key` unless it is already waiting to be processed.
    pub fn add(&self, key: K) {
        let mut st = self.lock();
        if self.add_locked(&mut st, key) {
            drop(st);
            self.shared.notify.notify_one();
        }
    }

    /// Returns whether a key became ready.
    fn add_locked(&self, st: &mut QueueState<K>, key: K) -> bool {
        if st.shut_down || st.dirty.contains(&key) {
            return false;
        }
        st.dirty.insert(key.clone());
        if st.processing.contains(&key) {
            // Handed out again after `done`.
            return false;
        }
        st.queue.push_back(key);
        true
    }

    /// Adds `key` once `delay` has passed (at once for a zero delay). A key already waiting
    /// keeps the earlier of the two deadlines.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let at = Instant::now() + delay;
        let mut st = self.lock();
        if st.shut_down || st.waiting_at.get(&key).is_some_and(|t| *t <= at) {
            return;
        }
        st.waiting_at.insert(key.clone(), at);
        st.seq += 1;
        let seq = st.seq;
        st.waiting.push(Delayed { at, seq, key });
        drop(st);
        // A waiting `next` may have to wake up earlier than it planned.
        self.shared.notify.notify_waiters();
    }

    /// Adds `key` after its back-off delay, and lengthens the delay for the next time.
    pub fn add_rate_limited(&self, key: K) {
        let delay = {
            let mut st = self.lock();
            let n = st.failures.entry(key.clone()).or_insert(0);
            let delay = self.shared.limiter.delay(*n);
            *n = n.saturating_add(1);
            delay
        };
        self.add_after(key, delay);
    }

    /// Resets `key`'s back-off (call after it was processed successfully).
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// How many rate-limited re-adds `key` had since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Moves due delayed keys to the queue; returns the next deadline.
    fn promote(&self, st: &mut QueueState<K>) -> Option<Instant> {
        let now = Instant::now();
        while let Some(top) = st.waiting.peek() {
            if top.at > now {
                return Some(top.at);
            }
            let Some(d) = st.waiting.pop() else { break };
            if st.waiting_at.get(&d.key) == Some(&d.at) {
                st.waiting_at.remove(&d.key);
                self.add_locked(st, d.key);
            }
        }
        None
    }

    /// The next key to process, waiting for one; `None` once the queue is shut down. The
    /// caller must call [`WorkQueue::done`] with it when finished.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let deadline = {
                let mut st = self.lock();
                if st.shut_down {
                    return None;
                }
                let deadline = self.promote(&mut st);
                if let Some(key) = st.queue.pop_front() {
                    st.dirty.remove(&key);
                    st.processing.insert(key.clone());
                    let more = !st.queue.is_empty();
                    drop(st);
                    if more {
                        self.shared.notify.notify_one();
                    }
                    return Some(key);
                }
                deadline
            };
            match deadline {
                Some(at) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `key` as processed; if it was added meanwhile it is queued again.
    pub fn done(&self, key: &K) {
        let mut st = self.lock();
        st.processing.remove(key);
        if st.dirty.contains(key) && !st.shut_down {
            st.queue.push_back(key.clone());
            drop(st);
            self.shared.notify.notify_one();
        }
    }

    /// Keys ready to be handed out now.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys waiting for a delay to pass.
    pub fn delayed_len(&self) -> usize {
        self.lock().waiting_at.len()
    }

    /// Stops handing out keys: every `next` returns `None`, adds are ignored.
    pub fn shut_down(&self) {
        let mut st = self.lock();
        st.shut_down = true;
        st.queue.clear();
        st.waiting.clear();
        st.waiting_at.clear();
        drop(st);
        self.shared.notify.notify_waiters();
    }

    pub fn is_shut_down(&self) -> bool {
        self.lock().shut_down
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn next_within(q: &WorkQueue<String>, ms: u64) -> Option<String> {
        tokio::time::timeout(Duration::from_millis(ms), q.next())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn deduplicates_keys() {
        let q = WorkQueue::<String>::default();
        q.add("a".into());
        q.add("b".into());
        q.add("a".into());
        assert_eq!(q.len(), 2);
        assert_eq!(next_within(&q, 100).await.as_deref(), Some("a"));
        assert_eq!(next_within(&q, 100).await.as_deref(), Some("b"));
        assert_eq!(next_within(&q, 50).await, None);
    }

    #[tokio::test]
    async fn a_key_is_not_handed_out_twice_concurrently() {
        let q = WorkQueue::<String>::default();
        q.add("a".into());
        let k = next_within(&q, 100).await.expect("a");
        // Added again while processing: held back until done.
        q.add("a".into());
        q.add("a".into());
        assert_eq!(next_within(&q, 50).await, None);
        q.done(&k);
        assert_eq!(next_within(&q, 100).await.as_deref(), Some("a"));
        q.done(&k);
        assert_eq!(next_within(&q, 50).await, None);
    }

    #[tokio::test]
    async fn concurrent_workers_never_share_a_key() {
        let q = WorkQueue::<String>::default();
        let active = Arc::new(Mutex::new(HashSet::<String>::new()));
        let mut workers = Vec::new();
        for _ in 0..4 {
            let (q, active) = (q.clone(), active.clone());
            workers.push(tokio::spawn(async move {
                let mut seen = 0;
                while let Some(k) = q.next().await {
                    assert!(
                        active.lock().unwrap().insert(k.clone()),
                        "{k} handed out twice"
                    );
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    active.lock().unwrap().remove(&k);
                    q.done(&k);
                    seen += 1;
                }
                seen
            }));
        }
        for round in 0..50 {
            for k in ["x", "y", "z"] {
                q.add(k.to_string());
            }
            if round % 10 == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        q.shut_down();
        let mut total = 0;
        for w in workers {
            total += w.await.expect("worker");
        }
        assert!(total >= 3, "processed {total}");
    }

    #[tokio::test]
    async fn add_after_delays_and_keeps_the_earliest_deadline() {
        let q = WorkQueue::<String>::default();
        let start = Instant::now();
        q.add_after("a".into(), Duration::from_millis(300));
        q.add_after("a".into(), Duration::from_millis(60));
        assert_eq!(q.delayed_len(), 1);
        assert_eq!(next_within(&q, 2000).await.as_deref(), Some("a"));
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(60), "{took:?}");
        assert!(took < Duration::from_millis(300), "{took:?}");
    }

    #[test]
    fn back_off_doubles_caps_and_resets() {
        let l = RateLimiter::default();
        assert_eq!(l.delay(0), Duration::from_millis(5));
        assert_eq!(l.delay(1), Duration::from_millis(10));
        assert_eq!(l.delay(10), Duration::from_millis(5 * 1024));
        assert_eq!(l.delay(40), Duration::from_secs(1000));
        assert_eq!(l.delay(u32::MAX), Duration::from_secs(1000));
    }

    #[tokio::test]
    async fn rate_limited_adds_back_off_per_key() {
        let q = WorkQueue::<String>::new(RateLimiter {
            base: Duration::from_millis(20),
            max: Duration::from_secs(10),
        });
        for expected in [20u64, 40, 80] {
            let start = Instant::now();
            q.add_rate_limited("a".into());
            let k = next_within(&q, 2000).await.expect("a");
            let took = start.elapsed();
            assert!(
                took >= Duration::from_millis(expected),
                "{took:?} < {expected}ms"
            );
            q.done(&k);
        }
        assert_eq!(q.num_requeues(&"a".to_string()), 3);
        q.forget(&"a".to_string());
        assert_eq!(q.num_requeues(&"a".to_string()), 0);
        // Other keys have their own back-off.
        let start = Instant::now();
        q.add_rate_limited("b".into());
        assert_eq!(next_within(&q, 2000).await.as_deref(), Some("b"));
        assert!(start.elapsed() < Duration::from_millis(80));
    }

    #[tokio::test]
    async fn shut_down_wakes_waiters() {
        let q = WorkQueue::<String>::default();
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.shut_down();
        let got = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(got, None);
        q.add("x".into());
        assert_eq!(next_within(&q, 20).await, None);
    }
}
