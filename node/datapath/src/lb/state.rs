//! The pure half of the Service load balancer: an exact in-memory mirror of the agent-written
//! LB maps (`LB_SERVICES`, `LB_SLOTS`, `LB_BACKENDS`), the planner that turns a desired state
//! into an ordered list of single-entry map writes ([`Op`]), id allocation, and the recovery
//! of the mirror from the maps an earlier agent left pinned.
//!
//! The kernel side ([`super::ServiceLb`]) executes a plan one op at a time and applies each op
//! to the mirror only once the kernel write succeeded, so the mirror is always what the maps
//! hold (the counters map is not mirrored; the LRU maps are the programs' own).
//!
//! Ordering rules the planner follows, so that a `connect()` running concurrently on another
//! CPU never picks a slot below `count` that points at nothing, and never sees zero backends
//! while the service has some before and after the change:
//!
//! - adding a backend: `PutCounters`, `PutBackend`, `PutSlot(count)`, then one `PutService`
//!   with the new count for all the added slots;
//! - all adds come before any removal (replacing every backend never passes through 0);
//! - removing the backend in slot `j` (highest `j` first): `PutSlot(j ← last)` (if `j` is not
//!   the last), `PutService(count - 1)`, `DeleteSlot(last)`, then `DeleteBackend` and
//!   `DeleteCounters` when no slot references it any more;
//! - removing a service: `DeleteService` first (the frontend stops being translated at once),
//!   then its slots, then its backends.
//!
//! The programs re-read the service on each of their (bounded) pick attempts, so the short
//! window in which a reader holds an old count after `PutService(count - 1)` only costs a
//! retry.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use skiff_common::lb::{
    AF_INET, AF_INET6, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, LB_FAMILY_IN_CLUSTER,
    LB_FLAG_AFFINITY, LB_FLAG_LOCAL, LB_FLAG_NODEPORT, LbAddr, LbBackend, LbService, LbServiceKey,
    LbSlotKey,
};

/// A transport protocol of a Service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Parses a Kubernetes protocol name (`TCP`, `UDP`, `SCTP`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The IP protocol number stored in the maps.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => IPPROTO_TCP,
            Protocol::Udp => IPPROTO_UDP,
            Protocol::Sctp => IPPROTO_SCTP,
        }
    }

    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            IPPROTO_TCP => Some(Protocol::Tcp),
            IPPROTO_UDP => Some(Protocol::Udp),
            IPPROTO_SCTP => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One ServicePort of a Service as the data path sees it: virtual IP, port, protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frontend {
    pub ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    /// The in-cluster view of an externalTrafficPolicy `Local` frontend (same address, port
    /// and protocol; every ready backend), which only the socket programs use
    /// ([`LB_FAMILY_IN_CLUSTER`]).
    pub in_cluster: bool,
}

impl Frontend {
    /// The frontend `ip:port/protocol`.
    pub const fn new(ip: IpAddr, port: u16, protocol: Protocol) -> Frontend {
        Frontend {
            ip,
            port,
            protocol,
            in_cluster: false,
        }
    }

    /// Its in-cluster view.
    pub const fn in_cluster_view(self) -> Frontend {
        Frontend {
            in_cluster: true,
            ..self
        }
    }
}

impl fmt::Display for Frontend {
    /// `10.96.0.10:80/TCP`, `[fd00::1]:53/UDP`; an in-cluster view ends in ` (in-cluster)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}/{}", self.port, self.protocol)?,
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}/{}", self.port, self.protocol)?,
        }
        if self.in_cluster {
            f.write_str(" (in-cluster)")?;
        }
        Ok(())
    }
}

/// A backend address (its protocol is its frontend's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendAddr {
    pub ip: IpAddr,
    pub port: u16,
}

impl fmt::Display for BackendAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// How a frontend balances: `affinity_timeout_s` is `Some` for `sessionAffinity: ClientIP`;
/// `node_port` marks a NodePort frontend (node address, nodePort), which the tc NodePort
/// program translates for packets from outside the node too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServiceParams {
    pub affinity_timeout_s: Option<u32>,
    pub node_port: bool,
    /// With `node_port`: externalTrafficPolicy `Local` (node-local backends, no SNAT).
    pub local: bool,
}

impl ServiceParams {
    fn value(self, id: u32, count: u32) -> LbService {
        LbService {
            id,
            count,
            flags: if self.affinity_timeout_s.is_some() {
                LB_FLAG_AFFINITY
            } else {
                0
            } | if self.node_port { LB_FLAG_NODEPORT } else { 0 }
                | if self.local { LB_FLAG_LOCAL } else { 0 },
            affinity_timeout_s: self.affinity_timeout_s.unwrap_or(0),
        }
    }

    fn of(value: &LbService) -> Self {
        ServiceParams {
            affinity_timeout_s: (value.flags & LB_FLAG_AFFINITY != 0)
                .then_some(value.affinity_timeout_s),
            node_port: value.flags & LB_FLAG_NODEPORT != 0,
            local: value.flags & LB_FLAG_LOCAL != 0,
        }
    }
}

/// A backend entry: which service it serves and where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    pub service_id: u32,
    pub addr: BackendAddr,
    pub protocol: Protocol,
}

/// One map write. Each is a single kernel map update or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    PutService {
        frontend: Frontend,
        value: LbService,
    },
    DeleteService {
        frontend: Frontend,
    },
    PutSlot {
        key: LbSlotKey,
        backend_id: u32,
    },
    DeleteSlot {
        key: LbSlotKey,
    },
    PutBackend {
        id: u32,
        backend: Backend,
    },
    DeleteBackend {
        id: u32,
    },
    /// Creates the backend's per-CPU counters, zeroed (also resetting a reused id's).
    PutCounters {
        id: u32,
    },
    DeleteCounters {
        id: u32,
    },
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no free {what} id: all {max} are in use (raise --lb-max-{what}s)")]
    Full { what: &'static str, max: u32 },
    #[error("backend {backend} is not an address of the family of frontend {frontend}")]
    FamilyMismatch {
        frontend: Frontend,
        backend: BackendAddr,
    },
}

/// Allocates ids in `1..=max`, rolling (the next id after the last one handed out), so an id
/// just freed is not reused at once.
#[derive(Debug, Clone)]
struct IdCursor {
    next: u32,
    max: u32,
}

impl IdCursor {
    fn new(max: u32) -> Self {
        IdCursor {
            next: 1,
            max: max.max(1),
        }
    }

    /// `n` distinct ids for which `used` is false, without reserving them (the cursor moves
    /// past them).
    fn take(
        &mut self,
        n: usize,
        what: &'static str,
        used: impl Fn(u32) -> bool,
    ) -> Result<Vec<u32>, PlanError> {
        let mut out = Vec::with_capacity(n);
        let mut id = self.next;
        let mut scanned: u64 = 0;
        while out.len() < n {
            if scanned >= u64::from(self.max) {
                return Err(PlanError::Full {
                    what,
                    max: self.max,
                });
            }
            if !used(id) && !out.contains(&id) {
                out.push(id);
            }
            id = if id >= self.max { 1 } else { id + 1 };
            scanned += 1;
        }
        self.next = id;
        Ok(out)
    }
}

/// The mirror of the agent-written LB maps.
#[derive(Debug, Clone)]
pub struct LbState {
    services: BTreeMap<Frontend, LbService>,
    by_id: BTreeMap<u32, Frontend>,
    slots: BTreeMap<LbSlotKey, u32>,
    backends: BTreeMap<u32, Backend>,
    /// Slots plus backends that name each service id (a service id stays taken while anything
    /// names it, e.g. after a removal that failed half-way).
    refs: BTreeMap<u32, u32>,
    /// How many slots name each backend id.
    backend_refs: BTreeMap<u32, u32>,
    service_ids: IdCursor,
    backend_ids: IdCursor,
}

/// A service as [`LbState::service`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceView {
    pub frontend: Frontend,
    pub id: u32,
    pub params: ServiceParams,
    /// Backend ids in slot order (`0..count`; a hole, which only a damaged map could have, is
    /// left out).
    pub slots: Vec<u32>,
}

fn bump(map: &mut BTreeMap<u32, u32>, key: u32, up: bool) {
    if up {
        *map.entry(key).or_insert(0) += 1;
    } else if let Some(n) = map.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            map.remove(&key);
        }
    }
}

impl LbState {
    /// An empty mirror with room for `max_services` service ids and `max_backends` backend ids
    /// (the maps' capacities).
    pub fn new(max_services: u32, max_backends: u32) -> Self {
        LbState {
            services: BTreeMap::new(),
            by_id: BTreeMap::new(),
            slots: BTreeMap::new(),
            backends: BTreeMap::new(),
            refs: BTreeMap::new(),
            backend_refs: BTreeMap::new(),
            service_ids: IdCursor::new(max_services),
            backend_ids: IdCursor::new(max_backends),
        }
    }

    /// Records a kernel write that succeeded.
    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::PutService { frontend, value } => {
                if let Some(old) = self.services.insert(*frontend, *value)
                    && old.id != value.id
                {
                    self.by_id.remove(&old.id);
                }
                self.by_id.insert(value.id, *frontend);
            }
            Op::DeleteService { frontend } => {
                if let Some(old) = self.services.remove(frontend) {
                    self.by_id.remove(&old.id);
                }
            }
            Op::PutSlot { key, backend_id } => {
                if let Some(old) = self.slots.insert(*key, *backend_id) {
                    bump(&mut self.backend_refs, old, false);
                } else {
                    bump(&mut self.refs, key.service_id, true);
                }
                bump(&mut self.backend_refs, *backend_id, true);
            }
            Op::DeleteSlot { key } => {
                if let Some(old) = self.slots.remove(key) {
                    bump(&mut self.backend_refs, old, false);
                    bump(&mut self.refs, key.service_id, false);
                }
            }
            Op::PutBackend { id, backend } => {
                if let Some(old) = self.backends.insert(*id, *backend) {
                    bump(&mut self.refs, old.service_id, false);
                }
                bump(&mut self.refs, backend.service_id, true);
            }
            Op::DeleteBackend { id } => {
                if let Some(old) = self.backends.remove(id) {
                    bump(&mut self.refs, old.service_id, false);
                }
            }
            Op::PutCounters { .. } | Op::DeleteCounters { .. } => {}
        }
    }

    /// Every service of the mirror with its backends in slot order, and the counters
    /// `counters(backend id)` gives (the kernel's per-CPU sums, or zeros for a fake).
    pub fn dump<E>(
        &self,
        counters: impl Fn(u32) -> Result<super::Counters, E>,
    ) -> Result<Vec<super::ServiceDump>, E> {
        let mut out = Vec::new();
        for view in self.services() {
            let mut backends = Vec::with_capacity(view.slots.len());
            for (slot, id) in view.slots.iter().enumerate() {
                let Some(b) = self.backend(*id) else {
                    continue;
                };
                let c = counters(*id)?;
                backends.push(super::BackendDump {
                    id: *id,
                    slot: u32::try_from(slot).unwrap_or(u32::MAX),
                    ip: b.addr.ip,
                    port: b.addr.port,
                    address: b.addr.to_string(),
                    connects: c.connects,
                    sends: c.sends,
                });
            }
            let f = view.frontend;
            out.push(super::ServiceDump {
                id: view.id,
                frontend: f.to_string(),
                ip: f.ip,
                port: f.port,
                protocol: f.protocol.as_str(),
                in_cluster: f.in_cluster,
                session_affinity: if view.params.affinity_timeout_s.is_some() {
                    "ClientIP"
                } else {
                    "None"
                },
                affinity_timeout_seconds: view.params.affinity_timeout_s,
                connects: backends.iter().map(|b| b.connects).sum(),
                sends: backends.iter().map(|b| b.sends).sum(),
                backends,
            });
        }
        Ok(out)
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }

    pub fn frontends(&self) -> impl Iterator<Item = &Frontend> {
        self.services.keys()
    }

    pub fn backend(&self, id: u32) -> Option<&Backend> {
        self.backends.get(&id)
    }

    /// The service of `frontend`, its slots in order.
    pub fn service(&self, frontend: &Frontend) -> Option<ServiceView> {
        let value = self.services.get(frontend)?;
        let slots = (0..value.count)
            .filter_map(|slot| {
                self.slots
                    .get(&LbSlotKey {
                        service_id: value.id,
                        slot,
                    })
                    .copied()
            })
            .collect();
        Some(ServiceView {
            frontend: *frontend,
            id: value.id,
            params: ServiceParams::of(value),
            slots,
        })
    }

    /// Every service, in frontend order.
    pub fn services(&self) -> Vec<ServiceView> {
        self.services
            .keys()
            .filter_map(|f| self.service(f))
            .collect()
    }

    fn service_id_used(&self, id: u32) -> bool {
        self.by_id.contains_key(&id) || self.refs.contains_key(&id)
    }

    /// The writes that make `frontend` a service with `params` and exactly the backends
    /// `desired` (duplicates ignored; order decides which new backend gets which id). A new
    /// frontend gets a fresh service id; an existing one keeps its id, and backends it keeps
    /// keep their ids and slots. Empty when nothing changes.
    ///
    /// Ids are taken from rolling cursors but only reserved when the ops are applied.
    pub fn plan_set(
        &mut self,
        frontend: Frontend,
        params: ServiceParams,
        desired: &[BackendAddr],
    ) -> Result<Vec<Op>, PlanError> {
        for b in desired {
            if b.ip.is_ipv4() != frontend.ip.is_ipv4() {
                return Err(PlanError::FamilyMismatch {
                    frontend,
                    backend: *b,
                });
            }
        }
        let mut ops = Vec::new();
        let (id, mut slots, mut value) = match self.service(&frontend) {
            Some(view) => {
                let value = self.services[&frontend];
                (view.id, view.slots, value)
            }
            None => {
                let id = {
                    let Self {
                        service_ids,
                        by_id,
                        refs,
                        ..
                    } = self;
                    service_ids.take(1, "service", |id| {
                        by_id.contains_key(&id) || refs.contains_key(&id)
                    })?[0]
                };
                debug_assert!(!self.service_id_used(id));
                let value = params.value(id, 0);
                ops.push(Op::PutService { frontend, value });
                (id, Vec::new(), value)
            }
        };
        // A damaged service (a hole below count) is rewritten compactly first.
        let compact = self.plan_compact(&frontend);
        if !compact.is_empty() {
            value = self.services[&frontend];
            value.count = slots.len() as u32;
            ops.extend(compact);
        }

        let mut wanted: Vec<BackendAddr> = Vec::with_capacity(desired.len());
        for b in desired {
            if !wanted.contains(b) {
                wanted.push(*b);
            }
        }
        // Which slots to keep: the first slot of every wanted address of this service.
        let mut kept = BTreeSet::new();
        let mut keep: Vec<bool> = slots
            .iter()
            .map(|backend_id| match self.backends.get(backend_id) {
                Some(b) if b.service_id == id && b.protocol == frontend.protocol => {
                    wanted.contains(&b.addr) && kept.insert(b.addr)
                }
                _ => false,
            })
            .collect();
        let to_add: Vec<BackendAddr> = wanted
            .iter()
            .filter(|a| !kept.contains(*a))
            .copied()
            .collect();
        let new_ids = {
            let Self {
                backend_ids,
                backends,
                backend_refs,
                ..
            } = self;
            backend_ids.take(to_add.len(), "backend", |id| {
                backends.contains_key(&id) || backend_refs.contains_key(&id)
            })?
        };

        // Adds first: a connect never sees the count drop when backends are replaced.
        for (addr, backend_id) in to_add.iter().zip(&new_ids) {
            ops.push(Op::PutCounters { id: *backend_id });
            ops.push(Op::PutBackend {
                id: *backend_id,
                backend: Backend {
                    service_id: id,
                    addr: *addr,
                    protocol: frontend.protocol,
                },
            });
        }
        for backend_id in &new_ids {
            ops.push(Op::PutSlot {
                key: LbSlotKey {
                    service_id: id,
                    slot: slots.len() as u32,
                },
                backend_id: *backend_id,
            });
            slots.push(*backend_id);
            keep.push(true);
        }
        let after_adds = params.value(id, slots.len() as u32);
        if after_adds != value {
            value = after_adds;
            ops.push(Op::PutService { frontend, value });
        }

        // Removals, highest slot first: the last slot is always one to keep by then.
        for j in (0..slots.len()).rev() {
            if keep[j] {
                continue;
            }
            let last = slots.len() - 1;
            let removed = slots[j];
            if j != last {
                ops.push(Op::PutSlot {
                    key: LbSlotKey {
                        service_id: id,
                        slot: j as u32,
                    },
                    backend_id: slots[last],
                });
                slots[j] = slots[last];
                keep[j] = keep[last];
            }
            slots.pop();
            keep.pop();
            value = params.value(id, slots.len() as u32);
            ops.push(Op::PutService { frontend, value });
            ops.push(Op::DeleteSlot {
                key: LbSlotKey {
                    service_id: id,
                    slot: last as u32,
                },
            });
            if !slots.contains(&removed)
                && self
                    .backends
                    .get(&removed)
                    .is_some_and(|b| b.service_id == id)
            {
                ops.push(Op::DeleteBackend { id: removed });
                ops.push(Op::DeleteCounters { id: removed });
            }
        }
        Ok(ops)
    }

    /// The writes that close the holes in the slots of `frontend`'s service (only a damaged map
    /// has holes): the surviving backends move down to slots `0..n`, then the count drops to
    /// `n`, then the slots above go. Empty for a healthy service.
    fn plan_compact(&self, frontend: &Frontend) -> Vec<Op> {
        let (Some(view), Some(value)) = (self.service(frontend), self.services.get(frontend))
        else {
            return Vec::new();
        };
        if view.slots.len() == value.count as usize {
            return Vec::new();
        }
        let key = |slot: u32| LbSlotKey {
            service_id: view.id,
            slot,
        };
        let mut ops = Vec::new();
        for (slot, backend_id) in view.slots.iter().enumerate() {
            let slot = slot as u32;
            if self.slots.get(&key(slot)) != Some(backend_id) {
                ops.push(Op::PutSlot {
                    key: key(slot),
                    backend_id: *backend_id,
                });
            }
        }
        let n = view.slots.len() as u32;
        ops.push(Op::PutService {
            frontend: *frontend,
            value: LbService { count: n, ..*value },
        });
        for slot in n..value.count {
            if self.slots.contains_key(&key(slot)) {
                ops.push(Op::DeleteSlot { key: key(slot) });
            }
        }
        ops
    }

    /// The writes that remove `frontend` and everything of its service. Empty if it is not a
    /// service.
    pub fn plan_remove(&self, frontend: &Frontend) -> Vec<Op> {
        let Some(value) = self.services.get(frontend) else {
            return Vec::new();
        };
        let mut ops = vec![Op::DeleteService {
            frontend: *frontend,
        }];
        ops.extend(self.plan_purge(value.id));
        ops
    }

    /// Deletes the slots and backends of service id `id` (which no frontend should name).
    fn plan_purge(&self, id: u32) -> Vec<Op> {
        let mut ops = Vec::new();
        let range = LbSlotKey {
            service_id: id,
            slot: 0,
        }..=LbSlotKey {
            service_id: id,
            slot: u32::MAX,
        };
        for key in self.slots.range(range).map(|(k, _)| *k) {
            ops.push(Op::DeleteSlot { key });
        }
        for (backend_id, _) in self.backends.iter().filter(|(_, b)| b.service_id == id) {
            ops.push(Op::DeleteBackend { id: *backend_id });
            ops.push(Op::DeleteCounters { id: *backend_id });
        }
        ops
    }

    /// The writes that delete what no service names: slots and backends of service ids without
    /// a frontend (left by a removal that failed half-way, or by a crash).
    pub fn plan_gc(&self) -> Vec<Op> {
        self.refs
            .keys()
            .filter(|id| !self.by_id.contains_key(id))
            .flat_map(|id| self.plan_purge(*id))
            .collect()
    }
}

/// An [`LbAddr`] and family for `ip`.
pub fn lb_addr(ip: IpAddr) -> (LbAddr, u8) {
    match ip {
        IpAddr::V4(v4) => {
            let mut a = [0u8; 16];
            a[..4].copy_from_slice(&v4.octets());
            (a, AF_INET)
        }
        IpAddr::V6(v6) => (v6.octets(), AF_INET6),
    }
}

/// The IP address in an [`LbAddr`] of family `family`.
pub fn ip_of(addr: &LbAddr, family: u8) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::from([addr[0], addr[1], addr[2], addr[3]])),
        AF_INET6 => Some(IpAddr::from(*addr)),
        _ => None,
    }
}

impl Frontend {
    pub fn key(&self) -> LbServiceKey {
        let (addr, family) = lb_addr(self.ip);
        LbServiceKey {
            addr,
            port: self.port,
            proto: self.protocol.number(),
            family: if self.in_cluster {
                family | LB_FAMILY_IN_CLUSTER
            } else {
                family
            },
        }
    }

    pub fn from_key(key: &LbServiceKey) -> Option<Self> {
        Some(Frontend {
            ip: ip_of(&key.addr, key.family & !LB_FAMILY_IN_CLUSTER)?,
            port: key.port,
            protocol: Protocol::from_number(key.proto)?,
            in_cluster: key.family & LB_FAMILY_IN_CLUSTER != 0,
        })
    }
}

impl Backend {
    pub fn value(&self) -> LbBackend {
        let (addr, family) = lb_addr(self.addr.ip);
        LbBackend {
            addr,
            port: self.addr.port,
            proto: self.protocol.number(),
            family,
            service_id: self.service_id,
        }
    }

    pub fn from_value(v: &LbBackend) -> Option<Self> {
        Some(Backend {
            service_id: v.service_id,
            addr: BackendAddr {
                ip: ip_of(&v.addr, v.family)?,
                port: v.port,
            },
            protocol: Protocol::from_number(v.proto)?,
        })
    }
}

/// What [`recover`] found in the maps.
#[derive(Debug)]
pub struct Recovered {
    /// The mirror of the maps once `repair` is applied.
    pub state: LbState,
    /// Writes that delete unreadable, dangling or unreferenced entries and rewrite damaged
    /// services compactly. Run them before anything else.
    pub repair: Vec<Op>,
    /// Entries that could not be read at all (unknown protocol or family), deleted by
    /// `repair` through their raw keys.
    pub unreadable_services: Vec<LbServiceKey>,
}

/// Rebuilds the mirror from the contents of the pinned maps (as an agent restart finds them),
/// and plans the repair of whatever a crash or a failed write left behind: services with a
/// hole in their slots, slots and backends of no service, backends without counters, counters
/// without a backend.
pub fn recover(
    max_services: u32,
    max_backends: u32,
    services: Vec<(LbServiceKey, LbService)>,
    slots: Vec<(LbSlotKey, u32)>,
    backends: Vec<(u32, LbBackend)>,
    counters: Vec<u32>,
) -> Recovered {
    let mut raw = LbState::new(max_services, max_backends);
    let mut unreadable_services = Vec::new();
    let mut repair = Vec::new();
    for (key, value) in services {
        match Frontend::from_key(&key) {
            Some(frontend) if value.id != 0 && !raw.by_id.contains_key(&value.id) => {
                raw.apply(&Op::PutService { frontend, value });
            }
            // Unreadable, or a second frontend with the same id: drop the frontend.
            _ => unreadable_services.push(key),
        }
    }
    let mut unreadable_backends = Vec::new();
    for (id, value) in backends {
        match Backend::from_value(&value) {
            Some(backend) => raw.apply(&Op::PutBackend { id, backend }),
            None => unreadable_backends.push(id),
        }
    }
    for (key, backend_id) in slots {
        raw.apply(&Op::PutSlot { key, backend_id });
    }
    for id in unreadable_backends {
        repair.push(Op::DeleteBackend { id });
        repair.push(Op::DeleteCounters { id });
    }

    let mut state = raw.clone();
    // Slots that point at a missing backend or at another service's, or that belong to no
    // service or lie at or above its count, go; a service left with a hole is compacted.
    let mut plan: Vec<Op> = raw
        .slots
        .iter()
        .filter(|(key, backend_id)| {
            let in_range = raw
                .by_id
                .get(&key.service_id)
                .is_some_and(|f| key.slot < raw.services[f].count);
            let valid_backend = raw
                .backends
                .get(backend_id)
                .is_some_and(|b| b.service_id == key.service_id);
            !(in_range && valid_backend)
        })
        .map(|(key, _)| Op::DeleteSlot { key: *key })
        .collect();
    for op in &plan {
        state.apply(op);
    }
    repair.append(&mut plan);
    // Each service's compaction touches only its own slots.
    let compact: Vec<Op> = raw
        .services
        .keys()
        .flat_map(|f| state.plan_compact(f))
        .collect();
    for op in &compact {
        state.apply(op);
    }
    repair.extend(compact);
    // What belongs to no service, and backends no slot names.
    let mut ops = state.plan_gc();
    let unreferenced: Vec<u32> = state
        .backends
        .keys()
        .filter(|id| !state.backend_refs.contains_key(id))
        .copied()
        .collect();
    for id in unreferenced {
        let op = Op::DeleteBackend { id };
        if !ops.contains(&op) {
            ops.push(op);
            ops.push(Op::DeleteCounters { id });
        }
    }
    for op in &ops {
        state.apply(op);
    }
    repair.extend(ops);
    // Counters: one per backend.
    let counters: BTreeSet<u32> = counters.into_iter().collect();
    for id in state.backends.keys() {
        if !counters.contains(id) {
            repair.push(Op::PutCounters { id: *id });
        }
    }
    for id in &counters {
        if !state.backends.contains_key(id) && !repair.contains(&Op::DeleteCounters { id: *id }) {
            repair.push(Op::DeleteCounters { id: *id });
        }
    }
    // Start the cursors after the highest ids in use, so ids are not reused at once.
    if let Some(max) = state.by_id.keys().next_back() {
        state.service_ids.next = max.saturating_add(1).min(state.service_ids.max).max(1);
    }
    if let Some(max) = state.backends.keys().next_back() {
        state.backend_ids.next = max.saturating_add(1).min(state.backend_ids.max).max(1);
    }
    Recovered {
        state,
        repair,
        unreadable_services,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn fe(last: u8, port: u16) -> Frontend {
        Frontend::new(
            IpAddr::V4(Ipv4Addr::new(10, 96, 0, last)),
            port,
            Protocol::Tcp,
        )
    }

    fn be(last: u8) -> BackendAddr {
        BackendAddr {
            ip: IpAddr::V4(Ipv4Addr::new(10, 244, 0, last)),
            port: 8080,
        }
    }

    /// What a concurrent `connect()` may rely on after every single write: each slot below
    /// `count` names an existing backend of that service.
    fn assert_readers_safe(s: &LbState, after: &Op) {
        for (frontend, value) in &s.services {
            for slot in 0..value.count {
                let key = LbSlotKey {
                    service_id: value.id,
                    slot,
                };
                let backend = s.slots.get(&key).and_then(|id| s.backends.get(id));
                assert!(
                    backend.is_some_and(|b| b.service_id == value.id),
                    "after {after:?}: slot {slot} of {frontend} (count {}) names no backend \
                     of service {}",
                    value.count,
                    value.id
                );
            }
        }
    }

    /// Applies `ops` one at a time, checking the reader invariant after each, and returns the
    /// counts of `frontend` seen along the way.
    fn run(s: &mut LbState, ops: &[Op], frontend: &Frontend) -> Vec<u32> {
        let mut counts = Vec::new();
        for op in ops {
            s.apply(op);
            assert_readers_safe(s, op);
            if let Some(v) = s.services.get(frontend) {
                counts.push(v.count);
            }
        }
        counts
    }

    fn addrs(s: &LbState, f: &Frontend) -> Vec<BackendAddr> {
        s.service(f)
            .unwrap()
            .slots
            .iter()
            .map(|id| s.backend(*id).unwrap().addr)
            .collect()
    }

    fn set(s: &mut LbState, f: Frontend, backends: &[BackendAddr]) -> Vec<Op> {
        let ops = s
            .plan_set(f, ServiceParams::default(), backends)
            .expect("plan");
        run(s, &ops, &f);
        ops
    }

    #[test]
    fn a_new_service_gets_ids_slots_and_one_count_write() {
        let mut s = LbState::new(16, 16);
        let f = fe(1, 80);
        let ops = s
            .plan_set(f, ServiceParams::default(), &[be(1), be(2), be(2), be(3)])
            .unwrap();
        // PutService(0), 3 × (counters, backend), 3 slots, PutService(3).
        assert_eq!(ops.len(), 1 + 6 + 3 + 1, "{ops:#?}");
        assert!(
            matches!(ops[0], Op::PutService { value, .. } if value.count == 0 && value.id == 1)
        );
        assert!(
            matches!(ops.last(), Some(Op::PutService { value, .. }) if value.count == 3),
            "{ops:#?}"
        );
        let counts = run(&mut s, &ops, &f);
        assert_eq!(counts.first(), Some(&0));
        assert_eq!(addrs(&s, &f), [be(1), be(2), be(3)]);
        assert_eq!(s.service(&f).unwrap().slots, [1, 2, 3]);
        // Programmed already: nothing to write.
        assert!(
            s.plan_set(f, ServiceParams::default(), &[be(3), be(1), be(2)])
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn removing_a_backend_moves_the_last_slot_into_the_hole() {
        let mut s = LbState::new(16, 16);
        let f = fe(1, 80);
        set(&mut s, f, &[be(1), be(2), be(3)]);
        let ops = s
            .plan_set(f, ServiceParams::default(), &[be(1), be(3)])
            .unwrap();
        let b2 = s.service(&f).unwrap().slots[1];
        assert_eq!(
            ops,
            [
                Op::PutSlot {
                    key: LbSlotKey {
                        service_id: 1,
                        slot: 1
                    },
                    backend_id: 3
                },
                Op::PutService {
                    frontend: f,
                    value: ServiceParams::default().value(1, 2)
                },
                Op::DeleteSlot {
                    key: LbSlotKey {
                        service_id: 1,
                        slot: 2
                    }
                },
                Op::DeleteBackend { id: b2 },
                Op::DeleteCounters { id: b2 },
            ]
        );
        // The removed backend is out of every slot below count from the first write on.
        let mut t = s.clone();
        t.apply(&ops[0]);
        let v = t.services[&f];
        assert!((0..v.count).all(|slot| t.slots[&LbSlotKey {
            service_id: 1,
            slot
        }] != b2));
        run(&mut s, &ops, &f);
        assert_eq!(addrs(&s, &f), [be(1), be(3)]);
        assert!(s.backend(b2).is_none());
    }

    #[test]
    fn replacing_every_backend_never_drops_to_zero() {
        let mut s = LbState::new(16, 64);
        let f = fe(1, 80);
        set(&mut s, f, &[be(1), be(2), be(3)]);
        let ops = s
            .plan_set(f, ServiceParams::default(), &[be(4), be(5)])
            .unwrap();
        let counts = run(&mut s, &ops, &f);
        assert!(counts.iter().all(|c| *c > 0), "{counts:?}");
        assert_eq!(
            addrs(&s, &f).into_iter().collect::<BTreeSet<_>>(),
            [be(4), be(5)].into_iter().collect()
        );
        assert_eq!(s.backend_count(), 2);
        assert_eq!(s.slot_count(), 2);
    }

    #[test]
    fn random_changes_keep_readers_safe_and_reach_the_desired_set() {
        // A deterministic pseudo-random walk over backend sets.
        let mut s = LbState::new(8, 64);
        let fronts = [fe(1, 80), fe(2, 53)];
        let mut x: u32 = 12345;
        for _ in 0..300 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let f = fronts[(x >> 7) as usize % 2];
            let want: Vec<BackendAddr> = (1..=10u8)
                .filter(|i| x >> (i + 8) & 1 == 1)
                .map(be)
                .collect();
            if x.is_multiple_of(11) {
                let ops = s.plan_remove(&f);
                run(&mut s, &ops, &f);
                assert!(s.service(&f).is_none());
                continue;
            }
            let before = s.service(&f).map(|v| v.slots.len()).unwrap_or(0);
            let ops = s.plan_set(f, ServiceParams::default(), &want).unwrap();
            let counts = run(&mut s, &ops, &f);
            if before > 0 && !want.is_empty() {
                assert!(counts.iter().all(|c| *c > 0), "{counts:?}");
            }
            let got: BTreeSet<_> = addrs(&s, &f).into_iter().collect();
            assert_eq!(got, want.iter().copied().collect::<BTreeSet<_>>());
            assert_eq!(addrs(&s, &f).len(), want.len(), "no duplicate slots");
            assert!(s.plan_gc().is_empty());
        }
        // Everything any service has is accounted for.
        let total: usize = fronts
            .iter()
            .filter_map(|f| s.service(f))
            .map(|v| v.slots.len())
            .sum();
        assert_eq!(s.backend_count(), total);
        assert_eq!(s.slot_count(), total);
    }

    #[test]
    fn parameters_change_in_one_write() {
        let mut s = LbState::new(16, 16);
        let f = fe(1, 80);
        set(&mut s, f, &[be(1)]);
        let sticky = ServiceParams {
            affinity_timeout_s: Some(30),
            ..Default::default()
        };
        let ops = s.plan_set(f, sticky, &[be(1)]).unwrap();
        assert_eq!(
            ops,
            [Op::PutService {
                frontend: f,
                value: LbService {
                    id: 1,
                    count: 1,
                    flags: LB_FLAG_AFFINITY,
                    affinity_timeout_s: 30
                }
            }]
        );
        run(&mut s, &ops, &f);
        assert_eq!(s.service(&f).unwrap().params, sticky);
    }

    #[test]
    fn node_port_and_affinity_flags_round_trip_through_the_map_value() {
        for params in [
            ServiceParams {
                affinity_timeout_s: None,
                node_port: true,
                local: false,
            },
            ServiceParams {
                affinity_timeout_s: Some(9),
                node_port: true,
                local: false,
            },
            ServiceParams {
                affinity_timeout_s: None,
                node_port: true,
                local: true,
            },
            ServiceParams::default(),
        ] {
            let value = params.value(3, 2);
            assert_eq!(
                value.flags & LB_FLAG_NODEPORT != 0,
                params.node_port,
                "{value:?}"
            );
            // What a restarted agent reads back from the pinned map is what was written.
            assert_eq!(ServiceParams::of(&value), params);
        }
    }

    #[test]
    fn removing_a_service_deletes_the_frontend_first_and_frees_everything() {
        let mut s = LbState::new(16, 16);
        let (a, b) = (fe(1, 80), fe(2, 80));
        set(&mut s, a, &[be(1), be(2)]);
        set(&mut s, b, &[be(1)]);
        let ops = s.plan_remove(&a);
        assert_eq!(ops[0], Op::DeleteService { frontend: a });
        run(&mut s, &ops, &a);
        assert!(s.service(&a).is_none());
        assert_eq!(s.backend_count(), 1, "b's own backend stays");
        assert_eq!(addrs(&s, &b), [be(1)]);
        assert!(s.plan_remove(&a).is_empty());
        assert!(s.plan_gc().is_empty());
    }

    #[test]
    fn a_half_done_removal_is_collected() {
        let mut s = LbState::new(16, 16);
        let f = fe(1, 80);
        set(&mut s, f, &[be(1), be(2)]);
        let ops = s.plan_remove(&f);
        // Only the frontend went; slots and backends of id 1 stay behind.
        s.apply(&ops[0]);
        let gc = s.plan_gc();
        assert_eq!(gc.len(), ops.len() - 1);
        // The id stays taken until they are gone.
        let g = fe(2, 80);
        let new = s.plan_set(g, ServiceParams::default(), &[]).unwrap();
        assert!(matches!(new[0], Op::PutService { value, .. } if value.id != 1));
        run(&mut s, &gc, &f);
        assert_eq!((s.slot_count(), s.backend_count()), (0, 0));
    }

    #[test]
    fn ids_roll_and_run_out() {
        let mut s = LbState::new(2, 3);
        set(&mut s, fe(1, 80), &[be(1), be(2)]);
        set(&mut s, fe(2, 80), &[be(3)]);
        assert_eq!(
            s.plan_set(fe(3, 80), ServiceParams::default(), &[]),
            Err(PlanError::Full {
                what: "service",
                max: 2
            })
        );
        assert_eq!(
            s.plan_set(fe(2, 80), ServiceParams::default(), &[be(3), be(4)]),
            Err(PlanError::Full {
                what: "backend",
                max: 3
            })
        );
        // Freed ids are reused only after the cursor went round.
        let ops = s.plan_remove(&fe(1, 80));
        run(&mut s, &ops, &fe(1, 80));
        let ops = s
            .plan_set(fe(2, 80), ServiceParams::default(), &[be(3), be(4), be(5)])
            .unwrap();
        run(&mut s, &ops, &fe(2, 80));
        assert_eq!(s.service(&fe(2, 80)).unwrap().slots, [3, 1, 2]);
    }

    #[test]
    fn backends_must_match_the_frontends_family() {
        let mut s = LbState::new(4, 4);
        let v6 = BackendAddr {
            ip: "fd00::1".parse().unwrap(),
            port: 80,
        };
        assert!(matches!(
            s.plan_set(fe(1, 80), ServiceParams::default(), &[v6]),
            Err(PlanError::FamilyMismatch { .. })
        ));
    }

    /// The map contents an agent would find for `s`.
    type Dump = (
        Vec<(LbServiceKey, LbService)>,
        Vec<(LbSlotKey, u32)>,
        Vec<(u32, LbBackend)>,
        Vec<u32>,
    );

    fn dump(s: &LbState) -> Dump {
        (
            s.services.iter().map(|(f, v)| (f.key(), *v)).collect(),
            s.slots.iter().map(|(k, v)| (*k, *v)).collect(),
            s.backends.iter().map(|(k, v)| (*k, v.value())).collect(),
            s.backends.keys().copied().collect(),
        )
    }

    fn recover_dump(d: Dump) -> Recovered {
        recover(16, 16, d.0, d.1, d.2, d.3)
    }

    #[test]
    fn recovers_a_clean_state_without_writes() {
        let mut s = LbState::new(16, 16);
        set(&mut s, fe(1, 80), &[be(1), be(2)]);
        let udp = Frontend {
            protocol: Protocol::Udp,
            ..fe(1, 53)
        };
        let sticky = ServiceParams {
            affinity_timeout_s: Some(10),
            ..Default::default()
        };
        let ops = s.plan_set(udp, sticky, &[be(3)]).unwrap();
        run(&mut s, &ops, &udp);
        let r = recover_dump(dump(&s));
        assert!(r.repair.is_empty(), "{:#?}", r.repair);
        assert!(r.unreadable_services.is_empty());
        assert_eq!(r.state.services(), s.services());
        let mut rs = r.state;
        // Nothing to do for the same desired state; new ids do not reuse existing ones.
        assert!(
            rs.plan_set(fe(1, 80), ServiceParams::default(), &[be(1), be(2)])
                .unwrap()
                .is_empty()
        );
        assert!(rs.plan_set(udp, sticky, &[be(3)]).unwrap().is_empty());
        let ops = rs
            .plan_set(fe(2, 80), ServiceParams::default(), &[be(9)])
            .unwrap();
        assert!(matches!(ops[0], Op::PutService { value, .. } if value.id == 3));
        assert!(ops.contains(&Op::PutBackend {
            id: 4,
            backend: Backend {
                service_id: 3,
                addr: be(9),
                protocol: Protocol::Tcp
            }
        }));
    }

    #[test]
    fn repairs_a_crash_in_the_middle_of_an_add() {
        let mut s = LbState::new(16, 16);
        let f = fe(1, 80);
        set(&mut s, f, &[be(1)]);
        let ops = s
            .plan_set(f, ServiceParams::default(), &[be(1), be(2)])
            .unwrap();
        // Crash before the count write: backend and slot 1 exist, count is still 1.
        for op in &ops[..ops.len() - 1] {
            s.apply(op);
        }
        let r = recover_dump(dump(&s));
        assert_eq!(
            r.repair,
            [
                Op::DeleteSlot {
                    key: LbSlotKey {
                        service_id: 1,
                        slot: 1
                    }
                },
                Op::DeleteBackend { id: 2 },
                Op::DeleteCounters { id: 2 },
            ]
        );
        let mut rs = r.state;
        assert_eq!(addrs(&rs, &f), [be(1)]);
        let again = rs
            .plan_set(f, ServiceParams::default(), &[be(1), be(2)])
            .unwrap();
        run(&mut rs, &again, &f);
        assert_eq!(addrs(&rs, &f), [be(1), be(2)]);
    }

    #[test]
    fn a_crash_in_the_middle_of_a_removal_leaves_a_duplicate_that_is_resolved() {
        let mut s = LbState::new(16, 16);
        let f = fe(1, 80);
        set(&mut s, f, &[be(1), be(2), be(3)]);
        let ops = s
            .plan_set(f, ServiceParams::default(), &[be(2), be(3)])
            .unwrap();
        // Crash after moving the last backend into slot 0: slots [3, 2, 3], count 3.
        s.apply(&ops[0]);
        let r = recover_dump(dump(&s));
        // Backend 1 is in no slot any more: it goes; the duplicate is a valid state.
        assert_eq!(
            r.repair,
            [Op::DeleteBackend { id: 1 }, Op::DeleteCounters { id: 1 }]
        );
        let mut rs = r.state;
        assert_eq!(addrs(&rs, &f), [be(3), be(2), be(3)]);
        let fix = rs
            .plan_set(f, ServiceParams::default(), &[be(2), be(3)])
            .unwrap();
        run(&mut rs, &fix, &f);
        assert_eq!(addrs(&rs, &f), [be(3), be(2)]);
        assert_eq!(rs.backend_count(), 2, "the duplicate's backend stays");
    }

    #[test]
    fn repairs_holes_strays_orphans_and_counters() {
        let mut s = LbState::new(16, 16);
        let f = fe(1, 80);
        set(&mut s, f, &[be(1), be(2), be(3)]);
        let (mut services, mut slots, mut backends, mut counters) = dump(&s);
        // A hole: slot 0's backend is gone.
        backends.retain(|(id, _)| *id != 1);
        // Slots and a backend of a service id nobody has.
        slots.push((
            LbSlotKey {
                service_id: 9,
                slot: 0,
            },
            7,
        ));
        backends.push((
            7,
            Backend {
                service_id: 9,
                addr: be(7),
                protocol: Protocol::Tcp,
            }
            .value(),
        ));
        // Counters of nothing, and backend 3 without counters.
        counters.retain(|id| *id != 3);
        counters.push(12);
        // An unreadable frontend.
        let mut bad = fe(5, 80).key();
        bad.proto = 99;
        services.push((bad, ServiceParams::default().value(5, 0)));

        let r = recover(16, 16, services, slots, backends, counters);
        assert_eq!(r.unreadable_services, [bad]);
        let st = &r.state;
        assert_eq!(addrs(st, &f), [be(2), be(3)], "compacted, in order");
        assert_eq!(st.slot_count(), 2);
        assert_eq!(st.backend_count(), 2);
        assert!(r.repair.contains(&Op::DeleteBackend { id: 7 }));
        assert!(r.repair.contains(&Op::DeleteCounters { id: 12 }));
        assert!(r.repair.contains(&Op::PutCounters { id: 3 }));
        assert!(st.plan_gc().is_empty());
        // Applying the repair to the raw maps yields the same mirror (checked op by op).
        let mut raw = LbState::new(16, 16);
        let (sv, sl, bk, _) = dump(&s);
        for (k, v) in sv {
            raw.apply(&Op::PutService {
                frontend: Frontend::from_key(&k).unwrap(),
                value: v,
            });
        }
        for (id, v) in bk.into_iter().filter(|(id, _)| *id != 1) {
            raw.apply(&Op::PutBackend {
                id,
                backend: Backend::from_value(&v).unwrap(),
            });
        }
        for (k, v) in sl {
            raw.apply(&Op::PutSlot {
                key: k,
                backend_id: v,
            });
        }
        for op in &r.repair {
            raw.apply(op);
        }
        assert_eq!(raw.services(), st.services());
    }

    #[test]
    fn display_and_keys_round_trip() {
        let f = fe(10, 443);
        assert_eq!(f.to_string(), "10.96.0.10:443/TCP");
        assert_eq!(Frontend::from_key(&f.key()), Some(f));
        let v6 = Frontend::new("fd00::a".parse().unwrap(), 53, Protocol::Udp);
        assert_eq!(v6.to_string(), "[fd00::a]:53/UDP");
        assert_eq!(Frontend::from_key(&v6.key()), Some(v6));
        assert_eq!(Protocol::parse("SCTP"), Some(Protocol::Sctp));
        assert_eq!(Protocol::parse("tcp"), None);
        let b = Backend {
            service_id: 4,
            addr: be(3),
            protocol: Protocol::Udp,
        };
        assert_eq!(Backend::from_value(&b.value()), Some(b));
    }
}
