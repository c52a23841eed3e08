//! What the allocators ([`crate::serviceip`], [`crate::nodeipam`]) share: a [`Ledger`] of
//! which object holds which value, mirrored from the informer of those objects, and
//! [`Allocator`], the one reconciler that hands out values through a [`Policy`] and writes them.
//!
//! The ledger is the allocation state: the used values of each pool (a [`RangeAllocator`]
//! per pool) and who holds them. It follows the informer's change feed, so it starts from the
//! complete, synced cache and sees every create, update and delete, whichever key is being
//! reconciled. All decisions are taken under one lock over the ledger, right after catching
//! up with the feed, so two objects are never handed the same value even when reconciled
//! concurrently. A value handed out is held at once (pending), before the write is sent, and
//! stays held while the informer still shows an older version of the object; it is dropped
//! only when the write fails or the object goes away. Values held by nobody any more are free
//! again, and objects that found a pool full are queued again when that happens.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use skiff_api::Resource;
use skiff_client::Client;
use skiff_client::controller::{
    Action, CancelToken, Change, Controller, EventRecorder, EventType, Informer, Informers,
    ObjectKey, Reconciler, Subscription, WorkQueue,
};

use crate::ranges::RangeAllocator;
use crate::util::creation_timestamp;
use crate::{Context, Error};

/// A value held by an object: (pool index, offset in the pool).
pub type Claim = (usize, u64);

fn revision<T: Resource>(o: &T) -> u64 {
    o.resource_version().parse().unwrap_or(0)
}

/// What the ledger knows about one object.
#[derive(Debug, Default)]
struct Entry {
    created: String,
    /// Order in which the ledger first saw the object (breaks creationTimestamp ties: the
    /// informer delivers creations in order).
    seq: u64,
    /// resourceVersion of the last state seen in the informer.
    revision: u64,
    /// What that state holds.
    observed: BTreeSet<Claim>,
    /// Values handed out by us that the informer does not show yet.
    pending: Option<PendingWrite>,
}

#[derive(Debug)]
struct PendingWrite {
    /// resourceVersion of our write; `u64::MAX` while it is in flight.
    revision: u64,
    claims: BTreeSet<Claim>,
}

impl Entry {
    fn effective(&self) -> BTreeSet<Claim> {
        let mut all = self.observed.clone();
        if let Some(p) = &self.pending {
            all.extend(p.claims.iter().copied());
        }
        all
    }
}

type ClaimsFn<T> = Box<dyn Fn(&T) -> BTreeSet<Claim> + Send + Sync>;

/// Who holds which value of each pool; see the module documentation.
pub struct Ledger<T> {
    pools: Vec<RangeAllocator>,
    holders: HashMap<Claim, BTreeSet<ObjectKey>>,
    entries: HashMap<ObjectKey, Entry>,
    /// Objects that found a pool full.
    parked: BTreeSet<ObjectKey>,
    claims_of: ClaimsFn<T>,
    changes: Option<Subscription<T>>,
    seq: u64,
}

impl<T> fmt::Debug for Ledger<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("pools", &self.pools)
            .field("objects", &self.entries.len())
            .field("parked", &self.parked)
            .finish_non_exhaustive()
    }
}

impl<T: Resource> Ledger<T> {
    /// An empty ledger over `pools`; `claims_of` says which values an object holds (values
    /// outside every pool are left out by it).
    pub fn new(
        pools: Vec<RangeAllocator>,
        claims_of: impl Fn(&T) -> BTreeSet<Claim> + Send + Sync + 'static,
    ) -> Self {
        Ledger {
            pools,
            holders: HashMap::new(),
            entries: HashMap::new(),
            parked: BTreeSet::new(),
            claims_of: Box::new(claims_of),
            changes: None,
            seq: 0,
        }
    }

    /// Follows `informer`: [`Ledger::catch_up`] applies its changes, starting with every
    /// object it already has.
    pub fn following(mut self, informer: &Informer<T>) -> Self {
        self.changes = Some(informer.subscribe());
        self
    }

    /// Applies the informer changes not seen yet. Returns the keys to reconcile again:
    /// parked ones when a value was freed, and every holder of a value that became held
    /// twice.
    pub fn catch_up(&mut self) -> BTreeSet<ObjectKey> {
        let mut requeue = BTreeSet::new();
        while let Some(change) = self.changes.as_mut().and_then(Subscription::try_recv) {
            self.apply(&change, &mut requeue);
        }
        requeue
    }

    /// Applies one change of the followed objects.
    pub fn apply(&mut self, change: &Change<T>, requeue: &mut BTreeSet<ObjectKey>) {
        match change {
            Change::Added(o) | Change::Updated { new: o, .. } => self.observe(o, requeue),
            Change::Deleted(o) => {
                let key = ObjectKey::of(&**o);
                self.parked.remove(&key);
                if let Some(entry) = self.entries.remove(&key) {
                    self.rehold(&key, &entry.effective(), &BTreeSet::new(), requeue);
                }
            }
        }
    }

    fn observe(&mut self, obj: &T, requeue: &mut BTreeSet<ObjectKey>) {
        let key = ObjectKey::of(obj);
        let rev = revision(obj);
        let claims = (self.claims_of)(obj);
        let entry = self.entry(&key);
        let before = entry.effective();
        entry.created = creation_timestamp(obj).to_string();
        entry.revision = rev;
        entry.observed = claims;
        if entry.pending.as_ref().is_some_and(|p| p.revision <= rev) {
            entry.pending = None;
        }
        let after = entry.effective();
        self.rehold(&key, &before, &after, requeue);
    }

    fn entry(&mut self, key: &ObjectKey) -> &mut Entry {
        let seq = &mut self.seq;
        self.entries.entry(key.clone()).or_insert_with(|| {
            *seq += 1;
            Entry {
                seq: *seq,
                ..Entry::default()
            }
        })
    }

    /// Moves `key` from holding `before` to holding `after`.
    fn rehold(
        &mut self,
        key: &ObjectKey,
        before: &BTreeSet<Claim>,
        after: &BTreeSet<Claim>,
        requeue: &mut BTreeSet<ObjectKey>,
    ) {
        let mut freed = false;
        for c in before.difference(after) {
            freed |= self.unhold(*c, key);
        }
        for c in after.difference(before) {
            self.hold(*c, key, requeue);
        }
        if freed && !self.parked.is_empty() {
            requeue.append(&mut self.parked);
        }
    }

    fn hold(&mut self, claim: Claim, key: &ObjectKey, requeue: &mut BTreeSet<ObjectKey>) {
        let Some(pool) = self.pools.get_mut(claim.0) else {
            return;
        };
        if claim.1 >= pool.size() {
            return;
        }
        let holders = self.holders.entry(claim).or_default();
        holders.insert(key.clone());
        if holders.len() == 1 {
            pool.reserve(claim.1);
        } else {
            // Held twice: the holders are looked at again (the later ones report it).
            requeue.extend(holders.iter().cloned());
        }
    }

    /// Returns whether the value became free.
    fn unhold(&mut self, claim: Claim, key: &ObjectKey) -> bool {
        let Some(holders) = self.holders.get_mut(&claim) else {
            return false;
        };
        holders.remove(key);
        if !holders.is_empty() {
            return false;
        }
        self.holders.remove(&claim);
        if let Some(pool) = self.pools.get_mut(claim.0) {
            pool.release(claim.1);
        }
        true
    }

    /// Whether the informer's `obj` is older than a write of ours to it (decide again once
    /// the informer has the write; its arrival queues the key).
    pub fn is_stale(&self, obj: &T) -> bool {
        self.entries
            .get(&ObjectKey::of(obj))
            .and_then(|e| e.pending.as_ref())
            .is_some_and(|p| p.revision > revision(obj))
    }

    /// Hands the next free value of `pool` to `key`; `None` when the pool is full. The value
    /// is held (pending) until [`Ledger::commit`] and the informer showing it, or
    /// [`Ledger::abort`].
    pub fn allocate(&mut self, key: &ObjectKey, pool: usize) -> Option<u64> {
        let value = self.pools.get_mut(pool)?.allocate_next()?;
        self.holders
            .entry((pool, value))
            .or_default()
            .insert(key.clone());
        let pending = self.entry(key).pending.get_or_insert_with(|| PendingWrite {
            revision: u64::MAX,
            claims: BTreeSet::new(),
        });
        pending.revision = u64::MAX;
        pending.claims.insert((pool, value));
        Some(value)
    }

    /// The write carrying `key`'s new values succeeded at `rev`.
    pub fn commit(&mut self, key: &ObjectKey, rev: u64) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let before = entry.effective();
        let Some(p) = entry.pending.as_mut() else {
            return;
        };
        p.revision = rev;
        if entry.revision >= rev {
            // The informer was faster than the reply.
            entry.pending = None;
            let after = entry.effective();
            self.rehold(key, &before, &after, &mut BTreeSet::new());
        }
    }

    /// The write failed (or was never sent): the values handed to `key` since its last
    /// commit are free again, unless its observed state holds them. Parked objects are not
    /// queued again for this: nothing they could have had was released.
    pub fn abort(&mut self, key: &ObjectKey) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let before = entry.effective();
        entry.pending = None;
        let after = entry.effective();
        for c in before.difference(&after) {
            self.unhold(*c, key);
        }
    }

    /// Remembers that `key` found a pool full: it is queued again once a value is freed.
    pub fn park(&mut self, key: &ObjectKey) {
        self.parked.insert(key.clone());
    }

    /// Another holder of `claim` created before `key` (by creationTimestamp; objects created
    /// in the same second by the order the ledger saw them).
    pub fn earlier_holder(&self, key: &ObjectKey, claim: Claim) -> Option<&ObjectKey> {
        let order = |k: &ObjectKey| self.entries.get(k).map(|e| (e.created.as_str(), e.seq));
        let mine = order(key);
        self.holders
            .get(&claim)?
            .iter()
            .filter(|k| *k != key)
            .find(|k| order(k) < mine)
    }

    /// Values of `pool` in use.
    pub fn used(&self, pool: usize) -> usize {
        self.pools.get(pool).map_or(0, RangeAllocator::used)
    }
}

/// What an allocator decided for one object.
#[derive(Debug)]
pub struct Allocation<T> {
    /// The object with its new values, to write with an update (`None`: nothing to write).
    pub update: Option<T>,
    /// Events about the object: type, reason, message.
    pub events: Vec<(EventType, &'static str, String)>,
}

impl<T> Default for Allocation<T> {
    fn default() -> Self {
        Allocation {
            update: None,
            events: Vec::new(),
        }
    }
}

/// What is particular to one allocator: which values an object holds and how missing ones
/// are handed out.
pub trait Policy: Send + Sync + 'static {
    type Object: Resource;

    /// The controller's name (logs).
    const NAME: &'static str;

    /// Empty pools, one per kind of value.
    fn pools(&self) -> Vec<RangeAllocator>;

    /// The values `obj` holds that lie inside a pool.
    fn claims(&self, obj: &Self::Object) -> BTreeSet<Claim>;

    /// Under the ledger's lock, after catching up: reports values `obj` shares with an earlier
    /// holder and hands out the ones it lacks (with [`Ledger::allocate`]). When a pool is
    /// full it calls [`Ledger::abort`] and [`Ledger::park`] and writes nothing: an object
    /// gets all its values at once or none.
    fn plan(
        &self,
        ledger: &mut Ledger<Self::Object>,
        key: &ObjectKey,
        obj: &Self::Object,
    ) -> Allocation<Self::Object>;
}

/// The reconciler of an allocator: one [`Ledger`] behind a lock, a [`Policy`].
pub struct Allocator<P: Policy> {
    client: Client,
    recorder: EventRecorder,
    objects: Informer<P::Object>,
    ledger: Mutex<Ledger<P::Object>>,
    queue: WorkQueue<ObjectKey>,
    policy: Arc<P>,
}

impl<P: Policy> fmt::Debug for Allocator<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocator")
            .field("name", &P::NAME)
            .finish_non_exhaustive()
    }
}

impl<P: Policy> Allocator<P> {
    /// The controller of `P::Object` and its allocator (which queues keys on the controller's
    /// queue when values are freed).
    pub fn new(
        informers: &Informers,
        recorder: EventRecorder,
        policy: P,
    ) -> (Controller<P::Object>, Self) {
        let controller = Controller::<P::Object>::new(informers).named(P::NAME);
        let objects = controller.informer().clone();
        let policy = Arc::new(policy);
        let claims = {
            let policy = Arc::clone(&policy);
            move |o: &P::Object| policy.claims(o)
        };
        let ledger = Ledger::new(policy.pools(), claims).following(&objects);
        let allocator = Allocator {
            client: informers.client().clone(),
            recorder,
            objects,
            ledger: Mutex::new(ledger),
            queue: controller.queue(),
            policy,
        };
        (controller, allocator)
    }

    /// Runs the allocator with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        policy: P,
        workers: usize,
        stop: CancelToken,
    ) {
        let (controller, allocator) = Self::new(informers, recorder, policy);
        controller
            .graceful_shutdown_on(stop)
            .run(Arc::new(allocator), workers)
            .await;
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger<P::Object>> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<P: Policy> Reconciler for Allocator<P> {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        // Read before catching up: the ledger then has seen at least this version.
        let obj = self.objects.get(key);
        let (plan, requeue) = {
            let mut ledger = self.ledger();
            let requeue = ledger.catch_up();
            let plan = obj
                .as_ref()
                .filter(|o| !ledger.is_stale(o))
                .map(|o| self.policy.plan(&mut ledger, key, o));
            (plan, requeue)
        };
        for k in requeue.into_iter().filter(|k| k != key) {
            self.queue.add(k);
        }
        let (Some(obj), Some(plan)) = (obj, plan) else {
            return Ok(Action::Done);
        };
        for (ty, reason, message) in &plan.events {
            self.recorder.publish(&*obj, *ty, reason, message).await;
        }
        let Some(update) = plan.update else {
            return Ok(Action::Done);
        };
        let result = self.client.all::<P::Object>().update(&update).await;
        match &result {
            Ok(written) => self.ledger().commit(key, revision(written)),
            Err(_) => self.ledger().abort(key),
        }
        match result {
            Ok(_) => Ok(Action::Done),
            Err(e) if e.is_not_found() => Ok(Action::Done),
            Err(e) => Err(e).during(|| format!("writing the values allocated to {}", key)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ObjectMeta, Service, ServicePort, ServiceSpec};

    /// Pool 0 from the clusterIP's last octet, pool 1 from nodePort - 30000.
    fn claims(s: &Service) -> BTreeSet<Claim> {
        let spec = s.spec.clone().unwrap_or_default();
        let mut out = BTreeSet::new();
        if let Ok(ip) = spec.cluster_ip.parse::<std::net::Ipv4Addr>() {
            out.insert((0, u64::from(ip.octets()[3])));
        }
        for p in &spec.ports {
            if p.node_port >= 30000 {
                out.insert((1, u64::try_from(p.node_port - 30000).unwrap()));
            }
        }
        out
    }

    fn svc(name: &str, rv: u64, created: &str, ip: &str, node_port: i32) -> Arc<Service> {
        Arc::new(Service {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: "ns".into(),
                resource_version: rv.to_string(),
                creation_timestamp: created.into(),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                cluster_ip: ip.into(),
                ports: vec![ServicePort {
                    port: 80,
                    node_port,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn ledger() -> Ledger<Service> {
        Ledger::new(vec![RangeAllocator::new(4), RangeAllocator::new(2)], claims)
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("ns", name)
    }

    #[test]
    fn observed_values_are_used_and_freed_on_delete() {
        let mut l = ledger();
        let mut requeue = BTreeSet::new();
        l.apply(
            &Change::Added(svc("a", 1, "t1", "10.0.0.0", 0)),
            &mut requeue,
        );
        l.apply(
            &Change::Added(svc("b", 2, "t2", "10.0.0.2", 30001)),
            &mut requeue,
        );
        assert!(requeue.is_empty());
        assert_eq!((l.used(0), l.used(1)), (2, 1));
        assert_eq!(l.allocate(&key("c"), 0), Some(1));
        assert_eq!(l.allocate(&key("c"), 1), Some(0));
        assert_eq!(l.allocate(&key("d"), 1), None, "pool 1 is full");
        l.abort(&key("d"));
        l.park(&key("d"));
        // Deleting b frees its port: the parked d is queued again.
        l.apply(
            &Change::Deleted(svc("b", 3, "t2", "10.0.0.2", 30001)),
            &mut requeue,
        );
        assert_eq!(requeue, [key("d")].into());
        assert_eq!((l.used(0), l.used(1)), (2, 1));
        // An update that drops a value frees it too.
        requeue.clear();
        l.apply(
            &Change::Updated {
                old: svc("a", 1, "t1", "10.0.0.0", 0),
                new: svc("a", 4, "t1", "", 0),
            },
            &mut requeue,
        );
        assert_eq!(l.used(0), 1);
        assert!(requeue.is_empty(), "nobody is parked any more");
    }

    #[test]
    fn pending_values_survive_stale_states_until_seen_or_aborted() {
        let mut l = ledger();
        let mut requeue = BTreeSet::new();
        l.apply(&Change::Added(svc("a", 5, "t1", "", 0)), &mut requeue);
        assert_eq!(l.allocate(&key("a"), 0), Some(0));
        // An older update arrives while our write is in flight: the value stays held.
        l.apply(&Change::Added(svc("a", 6, "t1", "", 0)), &mut requeue);
        assert_eq!(l.used(0), 1);
        l.commit(&key("a"), 7);
        assert!(l.is_stale(&svc("a", 6, "t1", "", 0)));
        assert!(!l.is_stale(&svc("a", 7, "t1", "10.0.0.0", 0)));
        l.apply(
            &Change::Added(svc("a", 7, "t1", "10.0.0.0", 0)),
            &mut requeue,
        );
        assert_eq!(l.used(0), 1);
        // Rolling: the next value is after the last one handed out.
        assert_eq!(l.allocate(&key("b"), 0), Some(1));
        l.abort(&key("b"));
        assert_eq!(l.used(0), 1);
        // The informer may show our write before the reply comes.
        assert_eq!(l.allocate(&key("c"), 0), Some(2));
        l.apply(
            &Change::Added(svc("c", 9, "t3", "10.0.0.2", 0)),
            &mut requeue,
        );
        l.commit(&key("c"), 9);
        assert!(!l.is_stale(&svc("c", 9, "t3", "10.0.0.2", 0)));
        assert_eq!(l.used(0), 2);
        // Deleting the object drops its pending values too.
        assert_eq!(l.allocate(&key("c"), 1), Some(0));
        l.apply(
            &Change::Deleted(svc("c", 10, "t3", "10.0.0.2", 0)),
            &mut requeue,
        );
        assert_eq!((l.used(0), l.used(1)), (1, 0));
    }

    #[test]
    fn a_value_held_twice_is_reported_by_the_later_holder() {
        let mut l = ledger();
        let mut requeue = BTreeSet::new();
        l.apply(
            &Change::Added(svc("late", 2, "t2", "10.0.0.3", 0)),
            &mut requeue,
        );
        l.apply(
            &Change::Added(svc("early", 3, "t1", "10.0.0.3", 0)),
            &mut requeue,
        );
        assert_eq!(requeue, [key("early"), key("late")].into());
        assert_eq!(l.earlier_holder(&key("late"), (0, 3)), Some(&key("early")));
        assert_eq!(l.earlier_holder(&key("early"), (0, 3)), None);
        // The value stays used while either holds it.
        l.apply(
            &Change::Deleted(svc("early", 4, "t1", "10.0.0.3", 0)),
            &mut requeue,
        );
        assert_eq!(l.used(0), 1);
        assert_eq!(l.earlier_holder(&key("late"), (0, 3)), None);
        // Created in the same second: the one seen first is the earlier.
        l.apply(
            &Change::Added(svc("b", 5, "t3", "10.0.0.1", 0)),
            &mut requeue,
        );
        l.apply(
            &Change::Added(svc("a", 6, "t3", "10.0.0.1", 0)),
            &mut requeue,
        );
        assert_eq!(l.earlier_holder(&key("a"), (0, 1)), Some(&key("b")));
        assert_eq!(l.earlier_holder(&key("b"), (0, 1)), None);
    }
}
