//! Skiff's socket-level Service load balancer (the `skiff-lb` object): eight
//! `cgroup_sock_addr` programs (four per address family) the agent attaches to the node's pod
//! cgroup parent, so they run for the sockets of every pod, whatever network namespace the pod
//! is in. Built like `skiff-ebpf` by `node/build.rs`; the map layouts are in
//! `skiff_common::lb`.
//!
//! - `connect4`/`connect6` (TCP, connected UDP): a destination that is a frontend in
//!   `LB_SERVICES` is rewritten to one of its backends (random slot, or the client netns'
//!   affinity entry when the service has ClientIP affinity and it has not expired); the socket
//!   cookie and backend are recorded in `LB_REVNAT`. A frontend with no backends fails the
//!   `connect()` at once with ECONNREFUSED (`bpf_set_retval`, then return 0).
//! - `sendmsg4`/`sendmsg6` (unconnected UDP): the same per datagram.
//! - `recvmsg4/6`, `getpeername4/6`: a peer that is the backend recorded for this socket is
//!   shown as the frontend instead.
//!
//! The IPv4 and IPv6 programs share one generic body per hook ([`forward`], [`reverse`]); the
//! family only decides where the address sits in `bpf_sock_addr` ([`Family`]) and the
//! `family` field of the keys, so both families live in the same maps. IPv4-mapped IPv6
//! destinations (`::ffff:a.b.c.d` on an IPv6 socket) are looked up as IPv6 keys, i.e. not
//! translated.
//!
//! - `skiff_np_ingress` (tc, TCX ingress on the node's uplink and on every pod host veth):
//!   NodePort from outside the node, see [`np_ingress`], then the pod networking fast path,
//!   see [`fast_path`].
//!
//! Programs only read maps the agent writes, except `LB_REVNAT`/`LB_AFFINITY`/`NP_CT` (LRU)
//! and the per-CPU counters. Every loop is bounded.
#![no_std]
#![no_main]

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya_ebpf::{
    Global,
    bindings::{
        BPF_F_MARK_MANGLED_0, BPF_F_NO_PREALLOC, BPF_F_PSEUDO_HDR, BPF_NOEXIST, TC_ACT_OK,
        bpf_fib_lookup as FibParams, bpf_sock_addr,
    },
    btf_maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    helpers::{
        bpf_fib_lookup, bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie,
        bpf_ktime_get_ns, bpf_redirect_neigh, bpf_redirect_peer, bpf_set_retval,
    },
    macros::{btf_map, cgroup_sock_addr, classifier},
    programs::{SockAddrContext, TcContext},
};
use aya_log_ebpf::debug;
use skiff_common::lb::{
    AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, LB_DEFAULT_MAX_AFFINITY, LB_DEFAULT_MAX_BACKENDS,
    LB_DEFAULT_MAX_NP_CT, LB_DEFAULT_MAX_REVNAT, LB_DEFAULT_MAX_SERVICES, LB_FLAG_AFFINITY,
    LB_FLAG_LOCAL, LB_FLAG_NODEPORT, LB_MAGLEV_MAX_M, LbAddr, LbAffinity, LbAffinityKey, LbBackend,
    LbCounters, LbMaglev, LbRevNat, LbRevNatKey, LbService, LbServiceKey, LbSlotKey, NP_CT_FORWARD,
    NP_CT_REPLY, NP_NAT_PORT_MAX, NP_NAT_PORT_MIN, NpCtEntry, NpCtKey, np_flow_hash, v4_addr,
    v4_be,
};
use skiff_common::podnet::{
    FastPathCounters, POD_ENDPOINTS_DEFAULT_MAX, PodEndpoint, PodEndpointKey,
};

/// cgroup_sock_addr verdict: go on (with whatever the program rewrote).
const ALLOW: i32 = 1;
/// cgroup_sock_addr verdict: fail the syscall (with the error set by `bpf_set_retval`).
const REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;
/// Debug records of every translation (aya-log, read by the agent with `--bpf-debug`): 0 =
/// off. Set by the loader before the programs are verified (a read-only global), so with 0
/// the verifier drops the logging code and the hot path is unchanged.
#[unsafe(no_mangle)]
static DEBUG: Global<u8> = Global::new(0);

/// Whether translations are logged ([`DEBUG`]).
#[inline(always)]
fn debug_on() -> bool {
    DEBUG.load() != 0
}

/// An address of `family` for a log record.
#[inline(always)]
fn log_ip(a: &LbAddr, family: u8) -> IpAddr {
    if family == AF_INET6 {
        IpAddr::V6(Ipv6Addr::from(*a))
    } else {
        IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))
    }
}

/// How many random slots to try when a slot or backend vanishes under a concurrent update.
const PICK_ATTEMPTS: u32 = 3;
const NO_PREALLOC: usize = BPF_F_NO_PREALLOC as usize;

/// Written by the agent only; allocated on demand (most nodes use a fraction of the maximum).
#[btf_map]
static LB_SERVICES: HashMap<
    LbServiceKey,
    LbService,
    { LB_DEFAULT_MAX_SERVICES as usize },
    NO_PREALLOC,
> = HashMap::new();

#[btf_map]
static LB_SLOTS: HashMap<LbSlotKey, u32, { LB_DEFAULT_MAX_BACKENDS as usize }, NO_PREALLOC> =
    HashMap::new();

#[btf_map]
static LB_BACKENDS: HashMap<u32, LbBackend, { LB_DEFAULT_MAX_BACKENDS as usize }, NO_PREALLOC> =
    HashMap::new();

/// Created (zeroed) and deleted by the agent with its backend; the programs only add.
#[btf_map]
static LB_COUNTERS: PerCpuHashMap<
    u32,
    LbCounters,
    { LB_DEFAULT_MAX_BACKENDS as usize },
    NO_PREALLOC,
> = PerCpuHashMap::new();

#[btf_map]
static LB_REVNAT: LruHashMap<LbRevNatKey, LbRevNat, { LB_DEFAULT_MAX_REVNAT as usize }> =
    LruHashMap::new();

#[btf_map]
static LB_AFFINITY: LruHashMap<LbAffinityKey, LbAffinity, { LB_DEFAULT_MAX_AFFINITY as usize }> =
    LruHashMap::new();

/// Maglev tables of the NodePort services (service id → backend ids), written whole by the
/// agent; read by [`maglev_backend`] only.
#[btf_map]
static LB_MAGLEV: HashMap<u32, LbMaglev, { LB_DEFAULT_MAX_SERVICES as usize }, NO_PREALLOC> =
    HashMap::new();

/// NodePort connection tracking, both directions of every flow (see `skiff_common::lb`).
#[btf_map]
static NP_CT: LruHashMap<NpCtKey, NpCtEntry, { LB_DEFAULT_MAX_NP_CT as usize }> = LruHashMap::new();

/// The local pods (address → host veth, MACs), written by the agent only.
#[btf_map]
static POD_ENDPOINTS: HashMap<
    PodEndpointKey,
    PodEndpoint,
    { POD_ENDPOINTS_DEFAULT_MAX as usize },
    NO_PREALLOC,
> = HashMap::new();

/// The fast path's per-CPU counters (index 0); the program only adds.
#[btf_map]
static FP_COUNTERS: PerCpuArray<FastPathCounters, 1> = PerCpuArray::new();

/// Which counter a translation adds to.
#[derive(Clone, Copy)]
enum Kind {
    Connect,
    Send,
}

// ---------------------------------------------------------------------------------------------
// Socket LB (cgroup_sock_addr), IPv4 and IPv6: one generic body per hook kind, instantiated
// per address family through [`Family`].
// ---------------------------------------------------------------------------------------------

#[cgroup_sock_addr(connect4)]
pub fn skiff_lb_connect4(ctx: SockAddrContext) -> i32 {
    forward::<V4>(&ctx, Kind::Connect)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn skiff_lb_sendmsg4(ctx: SockAddrContext) -> i32 {
    forward::<V4>(&ctx, Kind::Send)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn skiff_lb_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse::<V4>(&ctx);
    // recvmsg4 programs must return 1.
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn skiff_lb_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse::<V4>(&ctx);
    // getpeername4 programs must return 1.
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn skiff_lb_connect6(ctx: SockAddrContext) -> i32 {
    forward::<V6>(&ctx, Kind::Connect)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn skiff_lb_sendmsg6(ctx: SockAddrContext) -> i32 {
    forward::<V6>(&ctx, Kind::Send)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn skiff_lb_recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse::<V6>(&ctx);
    // recvmsg6 programs must return 1.
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
pub fn skiff_lb_getpeername6(ctx: SockAddrContext) -> i32 {
    reverse::<V6>(&ctx);
    // getpeername6 programs must return 1.
    ALLOW
}

/// An address family of the socket programs: where `bpf_sock_addr` keeps the user address
/// (`user_ip4`, or `user_ip6` as four 32-bit words, both in network order in memory).
trait Family {
    /// `AF_INET` / `AF_INET6`, as stored in the map keys and values.
    const AF: u8;
    /// The user address (destination at connect/sendmsg, peer at recvmsg/getpeername).
    ///
    /// # Safety
    /// `sa` is the context of a program of this family.
    unsafe fn load(sa: *const bpf_sock_addr) -> LbAddr;
    /// Overwrites the user address.
    ///
    /// # Safety
    /// As [`Family::load`], in a hook where the address is writable (all four are).
    unsafe fn store(sa: *mut bpf_sock_addr, addr: &LbAddr);
}

struct V4;
struct V6;

impl Family for V4 {
    const AF: u8 = AF_INET;

    #[inline(always)]
    unsafe fn load(sa: *const bpf_sock_addr) -> LbAddr {
        // SAFETY: per the trait contract; the verifier checks the context access.
        v4_addr(unsafe { (*sa).user_ip4 })
    }

    #[inline(always)]
    unsafe fn store(sa: *mut bpf_sock_addr, addr: &LbAddr) {
        // SAFETY: per the trait contract.
        unsafe { (*sa).user_ip4 = v4_be(addr) };
    }
}

impl Family for V6 {
    const AF: u8 = AF_INET6;

    #[inline(always)]
    unsafe fn load(sa: *const bpf_sock_addr) -> LbAddr {
        // SAFETY: per the trait contract. Four 32-bit loads at constant offsets: the only
        // access the verifier allows for `user_ip6`.
        let w = unsafe {
            [
                (*sa).user_ip6[0].to_ne_bytes(),
                (*sa).user_ip6[1].to_ne_bytes(),
                (*sa).user_ip6[2].to_ne_bytes(),
                (*sa).user_ip6[3].to_ne_bytes(),
            ]
        };
        [
            w[0][0], w[0][1], w[0][2], w[0][3], w[1][0], w[1][1], w[1][2], w[1][3], w[2][0],
            w[2][1], w[2][2], w[2][3], w[3][0], w[3][1], w[3][2], w[3][3],
        ]
    }

    #[inline(always)]
    unsafe fn store(sa: *mut bpf_sock_addr, a: &LbAddr) {
        // SAFETY: per the trait contract; four 32-bit stores at constant offsets.
        unsafe {
            (*sa).user_ip6[0] = u32::from_ne_bytes([a[0], a[1], a[2], a[3]]);
            (*sa).user_ip6[1] = u32::from_ne_bytes([a[4], a[5], a[6], a[7]]);
            (*sa).user_ip6[2] = u32::from_ne_bytes([a[8], a[9], a[10], a[11]]);
            (*sa).user_ip6[3] = u32::from_ne_bytes([a[12], a[13], a[14], a[15]]);
        }
    }
}

/// A backend picked for one translation.
struct Picked {
    id: u32,
    backend: LbBackend,
}

/// Frontend → backend for `connect4/6`/`sendmsg4/6`.
#[inline(always)]
fn forward<F: Family>(ctx: &SockAddrContext, kind: Kind) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: `sa` is the `bpf_sock_addr` context the kernel passed to this program of family
    // `F`; these fields are readable in connect and sendmsg programs (the verifier checks
    // each access).
    let (addr, port, proto) = unsafe { (F::load(sa), (*sa).user_port, (*sa).protocol) };
    let key = LbServiceKey {
        addr,
        port: u16::from_be(port as u16),
        proto: proto as u8,
        family: F::AF,
    };
    // SAFETY: only the agent writes LB_SERVICES, replacing whole values (never in place), so
    // the value read here is a consistent snapshot.
    let Some(svc) = (unsafe { LB_SERVICES.get(&key) }).copied() else {
        return ALLOW;
    };
    let Some(picked) = pick(ctx, &key, &svc) else {
        // No backend (none configured, or all vanished under concurrent updates): refuse at
        // once instead of letting the client wait for a virtual IP nobody answers.
        // SAFETY: bpf_set_retval is allowed in connect/sendmsg programs (kernel >= 5.18); a
        // program returning 0 then fails the syscall with this error instead of EPERM.
        unsafe { bpf_set_retval(-ECONNREFUSED) };
        return REJECT;
    };
    let b = picked.backend;
    // SAFETY: as above; the user address and port are writable in connect and sendmsg.
    unsafe {
        F::store(sa, &b.addr);
        (*sa).user_port = u32::from(b.port.to_be());
    }
    remember(ctx, &key, &svc, &b);
    if debug_on() {
        let what = match kind {
            Kind::Connect => "connect",
            Kind::Send => "sendmsg",
        };
        debug!(
            ctx,
            "socket lb {}: {:i}:{} -> backend {:i}:{} (service {}, backend id {})",
            what,
            log_ip(&key.addr, F::AF),
            key.port,
            log_ip(&b.addr, F::AF),
            b.port,
            svc.id,
            picked.id
        );
    }
    if let Some(c) = LB_COUNTERS.get_ptr_mut(picked.id) {
        // SAFETY: a per-CPU map value: this CPU's copy, written by nobody else meanwhile.
        unsafe {
            match kind {
                Kind::Connect => (*c).connects = (*c).connects.wrapping_add(1),
                Kind::Send => (*c).sends = (*c).sends.wrapping_add(1),
            }
        }
    }
    ALLOW
}

/// Chooses a backend: the client's affinity entry if the service has ClientIP affinity and
/// the entry is fresh and still names a backend of this service, else a random slot.
#[inline(always)]
fn pick(ctx: &SockAddrContext, key: &LbServiceKey, svc: &LbService) -> Option<Picked> {
    if svc.count == 0 {
        return None;
    }
    let affinity = svc.flags & LB_FLAG_AFFINITY != 0;
    let mut aff_key = LbAffinityKey::default();
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if affinity {
        // SAFETY: `ctx` is this program's context; bpf_get_netns_cookie accepts it.
        aff_key.netns_cookie = unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) };
        aff_key.service_id = svc.id;
        // SAFETY: LRU value, copied out at once; a concurrent update at worst gives the
        // other CPU's choice, which is as valid.
        if let Some(a) = unsafe { LB_AFFINITY.get(&aff_key) }.copied() {
            let timeout_ns = u64::from(svc.affinity_timeout_s) * 1_000_000_000;
            if now.wrapping_sub(a.last_used_ns) <= timeout_ns
                && let Some(b) = backend_of(a.backend_id, svc.id, key.family)
            {
                touch(&aff_key, a.backend_id, now);
                return Some(Picked {
                    id: a.backend_id,
                    backend: b,
                });
            }
        }
    }
    let picked = random_backend(key)?;
    if affinity {
        touch(&aff_key, picked.id, now);
    }
    Some(picked)
}

/// A random backend of the service behind `key`. The service is read again on every attempt:
/// the agent may be moving slots around, and a fresh count never covers an empty slot.
#[inline(always)]
fn random_backend(key: &LbServiceKey) -> Option<Picked> {
    for _ in 0..PICK_ATTEMPTS {
        // SAFETY: as in `forward`.
        let svc = unsafe { LB_SERVICES.get(key) }.copied()?;
        if svc.count == 0 {
            return None;
        }
        // SAFETY: bpf_get_prandom_u32 has no preconditions.
        let slot = unsafe { bpf_get_prandom_u32() } % svc.count;
        let slot_key = LbSlotKey {
            service_id: svc.id,
            slot,
        };
        // SAFETY: agent-written map, value copied out.
        let Some(id) = unsafe { LB_SLOTS.get(&slot_key) }.copied() else {
            continue;
        };
        if let Some(backend) = backend_of(id, svc.id, key.family) {
            return Some(Picked { id, backend });
        }
    }
    None
}

/// Backend `id`, if it exists, belongs to service `service_id` and is of `family`.
#[inline(always)]
fn backend_of(id: u32, service_id: u32, family: u8) -> Option<LbBackend> {
    // SAFETY: agent-written map, value copied out.
    let b = unsafe { LB_BACKENDS.get(&id) }.copied()?;
    (b.service_id == service_id && b.family == family).then_some(b)
}

#[inline(always)]
fn touch(key: &LbAffinityKey, backend_id: u32, now: u64) {
    let value = LbAffinity {
        last_used_ns: now,
        backend_id,
        _pad: 0,
    };
    // Best effort: without the entry the next connect picks at random.
    let _ = LB_AFFINITY.insert(key, value, 0);
}

/// Records which frontend this socket asked for when it was sent to `b`.
#[inline(always)]
fn remember(ctx: &SockAddrContext, key: &LbServiceKey, svc: &LbService, b: &LbBackend) {
    // SAFETY: `ctx` is this program's context; bpf_get_socket_cookie accepts it.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    let rev_key = LbRevNatKey {
        cookie,
        addr: b.addr,
        port: b.port,
        family: key.family,
        _pad: [0; 5],
    };
    let value = LbRevNat {
        addr: key.addr,
        port: key.port,
        family: key.family,
        _pad: 0,
        service_id: svc.id,
    };
    // SAFETY: LRU value, compared by copy.
    if unsafe { LB_REVNAT.get(&rev_key) }.copied() == Some(value) {
        // Unconnected UDP sends the same datagram route again and again: no rewrite.
        return;
    }
    // Best effort: without the entry getpeername/recvmsg show the backend.
    let _ = LB_REVNAT.insert(&rev_key, value, 0);
}

/// Backend → frontend for `recvmsg4/6`/`getpeername4/6`.
#[inline(always)]
fn reverse<F: Family>(ctx: &SockAddrContext) {
    let sa = ctx.sock_addr;
    // SAFETY: readable fields of this program's context (recvmsg/getpeername of family `F`).
    let (addr, port) = unsafe { (F::load(sa), (*sa).user_port) };
    // SAFETY: `ctx` is this program's context; bpf_get_socket_cookie accepts it.
    let cookie = unsafe { bpf_get_socket_cookie(sa.cast()) };
    let key = LbRevNatKey {
        cookie,
        addr,
        port: u16::from_be(port as u16),
        family: F::AF,
        _pad: [0; 5],
    };
    // SAFETY: LRU value, copied out.
    if let Some(v) = unsafe { LB_REVNAT.get(&key) }.copied() {
        // SAFETY: the user address and port are writable in recvmsg and getpeername.
        unsafe {
            F::store(sa, &v.addr);
            (*sa).user_port = u32::from(v.port.to_be());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// NodePort (tc)
// ---------------------------------------------------------------------------------------------

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const IP_OFF: usize = ETH_HLEN;
const IP_CSUM_OFF: usize = IP_OFF + 10;
const IP_SADDR_OFF: usize = IP_OFF + 12;
const IP_DADDR_OFF: usize = IP_OFF + 16;
/// Only option-less IPv4 headers are translated (IHL 5): the L4 header is at a fixed offset.
const L4_OFF: usize = IP_OFF + 20;
const TCP_CSUM_OFF: usize = L4_OFF + 16;
const UDP_CSUM_OFF: usize = L4_OFF + 6;
/// How many NAT ports to try (the client's own, then random ones) before giving up a flow.
const NAT_PORT_ATTEMPTS: u32 = 8;
const TC_ACT_SHOT: i32 = 2;
const BPF_FIB_LKUP_RET_SUCCESS: i64 = 0;
const BPF_FIB_LKUP_RET_NO_NEIGH: i64 = 7;

/// A parsed IPv4 TCP/UDP packet: its 4-tuple (addresses as stored, ports in host order).
#[derive(Clone, Copy)]
struct Tuple {
    saddr: u32,
    daddr: u32,
    sport: u16,
    dport: u16,
    proto: u8,
}

/// NodePort for clients outside the node, on the ingress of the node's uplink and of every
/// pod host veth (externalTrafficPolicy `Cluster`; a frontend with `LB_FLAG_LOCAL` is
/// `Local`: its backends are this node's pods and only the destination is translated, see
/// [`record_local_flow`]):
///
/// 1. A packet of a known flow (`NP_CT` forward entry) whose backend still exists, or a new
///    packet to a frontend with `LB_FLAG_NODEPORT` (node address, nodePort, protocol), is
///    rewritten to (node address → backend, NAT port → backend port): DNAT to a backend
///    picked by the service's Maglev table (`LB_MAGLEV`, [`maglev_backend`]; a random slot
///    when it has none), SNAT to the node address. The NAT port is the
///    client's port when no other flow uses it towards that backend, else a random port in
///    `NP_NAT_PORT_MIN..=NP_NAT_PORT_MAX` (claimed atomically with `BPF_NOEXIST` on the reply
///    entry; up to `NAT_PORT_ATTEMPTS` tries, then the packet is dropped).
/// 2. A packet matching a reply entry (backend → node address:NAT port) is rewritten to
///    (node address:nodePort → client). Checked before step 1's frontend lookup.
///
/// Translated packets are routed with `bpf_fib_lookup` and sent with `bpf_redirect_neigh`
/// (the kernel fills in the L2 header), bypassing the node's stack: it never sees a packet
/// to a nodePort nobody listens on (no RST), nor one whose source is its own address (no
/// martian drop).
///
/// Packets that are not NodePort traffic go on to the pod networking [`fast_path`].
#[classifier]
pub fn skiff_np_ingress(ctx: TcContext) -> i32 {
    if let Some(t) = parse(&ctx)
        && let Some(verdict) = np_ingress(&ctx, &t)
    {
        return verdict;
    }
    fast_path(&ctx)
}

/// The NodePort verdict for `t`, `None` when it is no NodePort traffic.
#[inline(always)]
fn np_ingress(ctx: &TcContext, t: &Tuple) -> Option<i32> {
    let t = *t;
    let fwd_key = NpCtKey {
        saddr: t.saddr,
        daddr: t.daddr,
        sport: t.sport,
        dport: t.dport,
        proto: t.proto,
        dir: NP_CT_FORWARD,
        _pad: [0; 2],
    };
    // SAFETY: LRU value, copied out.
    if let Some(e) = unsafe { NP_CT.get(&fwd_key) }.copied()
        && backend_still(&e)
    {
        return Some(translate(ctx, &t, &e));
    }
    // Replies before new flows: a reply's destination port (the NAT port) may also be a
    // nodePort.
    let reply_key = NpCtKey {
        dir: NP_CT_REPLY,
        ..fwd_key
    };
    // SAFETY: LRU value, copied out.
    if let Some(e) = unsafe { NP_CT.get(&reply_key) }.copied() {
        return Some(translate(ctx, &t, &e));
    }
    let svc_key = LbServiceKey::v4(t.daddr, t.dport, t.proto);
    // SAFETY: agent-written map, whole values replaced, copied out.
    if let Some(svc) = unsafe { LB_SERVICES.get(&svc_key) }.copied()
        && svc.flags & LB_FLAG_NODEPORT != 0
    {
        return Some(new_flow(ctx, &t, &svc_key, &svc, &fwd_key));
    }
    None
}

/// The IPv4 TCP/UDP 4-tuple of an unfragmented, option-less packet.
#[inline(always)]
fn parse(ctx: &TcContext) -> Option<Tuple> {
    let ethertype = u16::from_be(ctx.load::<u16>(12).ok()?);
    if ethertype != ETH_P_IP {
        return None;
    }
    let vihl: u8 = ctx.load(IP_OFF).ok()?;
    if vihl != 0x45 {
        return None;
    }
    // More-fragments flag or a fragment offset: only whole datagrams are translated.
    let frag = u16::from_be(ctx.load::<u16>(IP_OFF + 6).ok()?);
    if frag & 0x3fff != 0 {
        return None;
    }
    let proto: u8 = ctx.load(IP_OFF + 9).ok()?;
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return None;
    }
    Some(Tuple {
        saddr: ctx.load(IP_SADDR_OFF).ok()?,
        daddr: ctx.load(IP_DADDR_OFF).ok()?,
        sport: u16::from_be(ctx.load::<u16>(L4_OFF).ok()?),
        dport: u16::from_be(ctx.load::<u16>(L4_OFF + 2).ok()?),
        proto,
    })
}

/// The backend of a new NodePort flow from the service's Maglev table: entry
/// `np_flow_hash(5-tuple) % m`, so the same 5-tuple gets the same backend (on every node with
/// the same backends) and a backend change moves few flows. `None` when the service has no
/// table (yet) or the entry names a backend that is gone (the table is rewritten after a
/// removal): the caller then picks at random.
#[inline(always)]
fn maglev_backend(svc: &LbService, t: &Tuple) -> Option<Picked> {
    // SAFETY: agent-written map; the agent replaces whole values (a hash map update swaps the
    // element), so this reference sees one table, old or new.
    let table = unsafe { LB_MAGLEV.get(&svc.id) }?;
    let m = table.m;
    if m == 0 || m > LB_MAGLEV_MAX_M {
        return None;
    }
    let i = np_flow_hash(t.saddr, t.daddr, t.sport, t.dport, t.proto) % m;
    // The verifier does not derive `i < m` from the modulo, and the compiler drops a bounds
    // check it can prove redundant: read `i` back opaquely so the check below stays.
    // SAFETY: reading a local through a valid pointer to it.
    let i = unsafe { core::ptr::read_volatile(&i) } as usize;
    if i >= LB_MAGLEV_MAX_M as usize {
        return None;
    }
    let id = *table.table.get(i)?;
    let backend = backend_of(id, svc.id, AF_INET)?;
    Some(Picked { id, backend })
}

/// Whether the backend of a forward entry is still the same backend (not removed, its id
/// not reused for another address).
#[inline(always)]
fn backend_still(e: &NpCtEntry) -> bool {
    match backend_of(e.backend_id, e.service_id, AF_INET) {
        Some(b) => v4_be(&b.addr) == e.daddr && b.port == e.dport,
        None => false,
    }
}

/// A first packet towards a NodePort frontend: pick a backend (Maglev, else at random), claim
/// a NAT port, record both directions, translate.
#[inline(always)]
fn new_flow(
    ctx: &TcContext,
    t: &Tuple,
    svc_key: &LbServiceKey,
    svc: &LbService,
    fwd_key: &NpCtKey,
) -> i32 {
    let Some(picked) = maglev_backend(svc, t).or_else(|| random_backend(svc_key)) else {
        // No backend: drop (a TCP client sees its connect time out, like with kube-proxy's
        // REJECT-less NodePort rules for services without endpoints).
        return TC_ACT_SHOT;
    };
    let recorded = if svc.flags & LB_FLAG_LOCAL != 0 {
        record_local_flow(t, fwd_key, &picked)
    } else {
        record_snat_flow(t, fwd_key, &picked)
    };
    let Some(fwd) = recorded else {
        return TC_ACT_SHOT;
    };
    let b = picked.backend;
    if let Some(c) = LB_COUNTERS.get_ptr_mut(picked.id) {
        // SAFETY: a per-CPU map value: this CPU's copy, written by nobody else meanwhile.
        unsafe { (*c).connects = (*c).connects.wrapping_add(1) };
    }
    if debug_on() {
        debug!(
            ctx,
            "nodeport new flow: {:i}:{} -> {:i}:{} to backend {:i}:{} (service {}, backend id {}, nat port {})",
            t.saddr.to_ne_bytes(),
            t.sport,
            t.daddr.to_ne_bytes(),
            t.dport,
            fwd.daddr.to_ne_bytes(),
            fwd.dport,
            b.service_id,
            picked.id,
            fwd.sport
        );
    }
    translate(ctx, t, &fwd)
}

/// externalTrafficPolicy Cluster: records a flow DNATed to `picked` and SNATed to the node
/// address, with a NAT port (the client's, else a random free one of the NAT range) that
/// tells its replies apart. Returns the forward translation; `None`: no port, drop.
#[inline(always)]
fn record_snat_flow(t: &Tuple, fwd_key: &NpCtKey, picked: &Picked) -> Option<NpCtEntry> {
    let b = picked.backend;
    let backend_ip = v4_be(&b.addr);
    let back = NpCtEntry {
        saddr: t.daddr,
        daddr: t.saddr,
        sport: t.dport,
        dport: t.sport,
        backend_id: picked.id,
        service_id: b.service_id,
    };
    let mut reply_key = NpCtKey {
        saddr: backend_ip,
        daddr: t.daddr,
        sport: b.port,
        dport: t.sport,
        proto: t.proto,
        dir: NP_CT_REPLY,
        _pad: [0; 2],
    };
    let mut claimed = false;
    for attempt in 0..NAT_PORT_ATTEMPTS {
        if attempt > 0 {
            // SAFETY: bpf_get_prandom_u32 has no preconditions.
            let r = unsafe { bpf_get_prandom_u32() };
            let span = u32::from(NP_NAT_PORT_MAX - NP_NAT_PORT_MIN) + 1;
            reply_key.dport = NP_NAT_PORT_MIN + (r % span) as u16;
        }
        if NP_CT
            .insert(&reply_key, back, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            claimed = true;
            break;
        }
        // Taken: by this very flow (a retransmitted first packet after its forward entry
        // was evicted, or a backend change) it is ours again.
        // SAFETY: LRU value, copied out.
        if let Some(old) = unsafe { NP_CT.get(&reply_key) }.copied()
            && old.daddr == t.saddr
            && old.dport == t.sport
            && old.sport == t.dport
        {
            let _ = NP_CT.insert(&reply_key, back, 0);
            claimed = true;
            break;
        }
    }
    if !claimed {
        return None;
    }
    let fwd = NpCtEntry {
        saddr: t.daddr,
        daddr: backend_ip,
        sport: reply_key.dport,
        dport: b.port,
        backend_id: picked.id,
        service_id: b.service_id,
    };
    if NP_CT.insert(fwd_key, fwd, 0).is_err() {
        let _ = NP_CT.remove(&reply_key);
        return None;
    }
    Some(fwd)
}

/// externalTrafficPolicy Local: records a flow DNATed to `picked` (a pod of this node) with
/// the client's address and port kept, so the backend sees the client. Its replies (backend →
/// client, seen at the pod's host veth) are sent from the NodePort frontend again. Returns the
/// forward translation; `None`: the conntrack map refused it, drop.
#[inline(always)]
fn record_local_flow(t: &Tuple, fwd_key: &NpCtKey, picked: &Picked) -> Option<NpCtEntry> {
    let b = picked.backend;
    let backend_ip = v4_be(&b.addr);
    let reply_key = NpCtKey {
        saddr: backend_ip,
        daddr: t.saddr,
        sport: b.port,
        dport: t.sport,
        proto: t.proto,
        dir: NP_CT_REPLY,
        _pad: [0; 2],
    };
    let back = NpCtEntry {
        saddr: t.daddr,
        daddr: t.saddr,
        sport: t.dport,
        dport: t.sport,
        backend_id: picked.id,
        service_id: b.service_id,
    };
    NP_CT.insert(&reply_key, back, 0).ok()?;
    let fwd = NpCtEntry {
        saddr: t.saddr,
        daddr: backend_ip,
        sport: t.sport,
        dport: b.port,
        backend_id: picked.id,
        service_id: b.service_id,
    };
    if NP_CT.insert(fwd_key, fwd, 0).is_err() {
        let _ = NP_CT.remove(&reply_key);
        return None;
    }
    Some(fwd)
}

/// Rewrites the packet's 4-tuple `t` to `e`'s (fixing the IP and L4 checksums) and sends it
/// where the FIB routes the new destination.
#[inline(always)]
fn translate(ctx: &TcContext, t: &Tuple, e: &NpCtEntry) -> i32 {
    if rewrite(ctx, t, e).is_err() {
        return TC_ACT_SHOT;
    }
    forward_to_fib(ctx, t.proto, e)
}

#[inline(always)]
fn rewrite(ctx: &TcContext, t: &Tuple, e: &NpCtEntry) -> Result<(), i64> {
    let (csum_off, mangled) = if t.proto == IPPROTO_TCP {
        (TCP_CSUM_OFF, 0)
    } else {
        (UDP_CSUM_OFF, u64::from(BPF_F_MARK_MANGLED_0))
    };
    let pseudo = u64::from(BPF_F_PSEUDO_HDR) | mangled;
    if t.saddr != e.saddr {
        ctx.l4_csum_replace(csum_off, u64::from(t.saddr), u64::from(e.saddr), pseudo | 4)?;
        ctx.l3_csum_replace(IP_CSUM_OFF, u64::from(t.saddr), u64::from(e.saddr), 4)?;
        ctx.store(IP_SADDR_OFF, &e.saddr, 0)?;
    }
    if t.daddr != e.daddr {
        ctx.l4_csum_replace(csum_off, u64::from(t.daddr), u64::from(e.daddr), pseudo | 4)?;
        ctx.l3_csum_replace(IP_CSUM_OFF, u64::from(t.daddr), u64::from(e.daddr), 4)?;
        ctx.store(IP_DADDR_OFF, &e.daddr, 0)?;
    }
    if t.sport != e.sport {
        let (from, to) = (t.sport.to_be(), e.sport.to_be());
        ctx.l4_csum_replace(csum_off, u64::from(from), u64::from(to), mangled | 2)?;
        ctx.store(L4_OFF, &to, 0)?;
    }
    if t.dport != e.dport {
        let (from, to) = (t.dport.to_be(), e.dport.to_be());
        ctx.l4_csum_replace(csum_off, u64::from(from), u64::from(to), mangled | 2)?;
        ctx.store(L4_OFF + 2, &to, 0)?;
    }
    Ok(())
}

/// Routes the rewritten packet: the egress interface from the FIB, the L2 header from the
/// neighbour table (`bpf_redirect_neigh`). Without a route the packet is dropped.
#[inline(always)]
fn forward_to_fib(ctx: &TcContext, proto: u8, e: &NpCtEntry) -> i32 {
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = proto;
    p.sport = e.sport.to_be();
    p.dport = e.dport.to_be();
    // SAFETY: `ctx.skb.skb` is this program's `__sk_buff`.
    p.ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    p.__bindgen_anon_1.tot_len = 0;
    p.__bindgen_anon_3.ipv4_src = e.saddr;
    p.__bindgen_anon_4.ipv4_dst = e.daddr;
    // SAFETY: `p` is a bpf_fib_lookup on this stack of the size passed; the context is this
    // program's skb.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb.cast(),
            &mut p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    if rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH {
        return TC_ACT_SHOT;
    }
    // SAFETY: no parameters: the kernel looks the next hop up itself for `p.ifindex`.
    unsafe { bpf_redirect_neigh(p.ifindex, core::ptr::null_mut(), 0, 0) as i32 }
}

// ---------------------------------------------------------------------------------------------
// Pod networking fast path (tc)
// ---------------------------------------------------------------------------------------------

/// `skb->pkt_type` of a frame addressed to this host's MAC.
const PACKET_HOST: u32 = 0;
const IP_TTL_OFF: usize = IP_OFF + 8;
const BPF_FIB_LKUP_RET_NOT_FWDED: i64 = 4;

/// Which [`FastPathCounters`] field to add to.
#[derive(Clone, Copy)]
enum Fp {
    RedirectPeer,
    RedirectNeigh,
    Pass,
    FibFail,
}

#[inline(always)]
fn count(which: Fp) {
    if let Some(c) = FP_COUNTERS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array value: this CPU's copy, written by nobody else meanwhile.
        unsafe {
            match which {
                Fp::RedirectPeer => (*c).redirect_peer = (*c).redirect_peer.wrapping_add(1),
                Fp::RedirectNeigh => (*c).redirect_neigh = (*c).redirect_neigh.wrapping_add(1),
                Fp::Pass => (*c).pass = (*c).pass.wrapping_add(1),
                Fp::FibFail => (*c).fib_fail = (*c).fib_fail.wrapping_add(1),
            }
        }
    }
}

/// Hands the packet to the node's stack unchanged (counted when it came from a pod).
#[inline(always)]
fn pass(from_pod: bool, which: Fp) -> i32 {
    if from_pod {
        count(which);
    }
    TC_ACT_OK as i32
}

/// Pod-to-pod and pod-to-elsewhere forwarding without the node's IP stack (so without its
/// netfilter hooks), for IPv4 unicast frames addressed to this host:
///
/// - destination a local pod (`POD_ENDPOINTS`), from a pod's host veth or from the uplink:
///   TTL decremented, MACs rewritten (source = that pod's host veth, destination = the pod's
///   `eth0`), `bpf_redirect_peer` to its host veth: the packet appears on the pod's `eth0`
///   inside the pod's namespace at once;
/// - from a local pod (its source is a pod whose host veth is the ingress device) to anything
///   else: `bpf_fib_lookup` as forwarding would (ingress device, policy routing), TTL
///   decremented, `bpf_redirect_neigh` to the egress device (the kernel fills in the L2
///   header from its neighbour table): cross-node traffic leaves through the uplink at once.
///
/// Everything else goes on to the stack unchanged: non-IPv4 (ARP), frames for other hosts,
/// broadcast and multicast, a TTL that would expire (the stack sends the ICMP error), local
/// node addresses and destinations without a route (`NOT_FWDED`), and failed lookups
/// (unreachable routes, fragmentation needed: the stack answers them as forwarding would).
#[inline(always)]
fn fast_path(ctx: &TcContext) -> i32 {
    let skb = ctx.skb.skb;
    // SAFETY: `skb` is this program's `__sk_buff`; both fields are readable in tc programs.
    let (ingress, pkt_type) = unsafe { ((*skb).ingress_ifindex, (*skb).pkt_type) };
    let Ok(ethertype) = ctx.load::<u16>(12) else {
        return TC_ACT_OK as i32;
    };
    if u16::from_be(ethertype) != ETH_P_IP {
        return TC_ACT_OK as i32;
    }
    let (Ok(vihl), Ok(ttl), Ok(saddr), Ok(daddr)) = (
        ctx.load::<u8>(IP_OFF),
        ctx.load::<u8>(IP_TTL_OFF),
        ctx.load::<u32>(IP_SADDR_OFF),
        ctx.load::<u32>(IP_DADDR_OFF),
    ) else {
        return TC_ACT_OK as i32;
    };
    if vihl >> 4 != 4 || vihl & 0x0f < 5 {
        return TC_ACT_OK as i32;
    }
    // SAFETY: agent-written map, whole values replaced, copied out.
    let from_pod = unsafe { POD_ENDPOINTS.get(&PodEndpointKey::v4(saddr)) }
        .is_some_and(|e| e.ifindex == ingress);
    if pkt_type != PACKET_HOST || ttl <= 1 {
        return pass(from_pod, Fp::Pass);
    }
    // SAFETY: as above.
    if let Some(ep) = unsafe { POD_ENDPOINTS.get(&PodEndpointKey::v4(daddr)) }.copied() {
        if ep.ifindex == ingress {
            // Back where it came from: the stack's business.
            return pass(from_pod, Fp::Pass);
        }
        if decrement_ttl(ctx, ttl).is_err()
            || ctx.store(0, &ep.pod_mac, 0).is_err()
            || ctx.store(6, &ep.host_mac, 0).is_err()
        {
            return TC_ACT_SHOT;
        }
        count(Fp::RedirectPeer);
        // SAFETY: no pointers; the kernel checks that `ifindex` is a veth of this namespace.
        return unsafe { bpf_redirect_peer(ep.ifindex, 0) as i32 };
    }
    if !from_pod {
        return TC_ACT_OK as i32;
    }
    // Multicast, class E and the limited broadcast: 224.0.0.0 and up.
    if daddr.to_ne_bytes()[0] >= 224 {
        return pass(true, Fp::Pass);
    }
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = ctx.load::<u8>(IP_OFF + 9).unwrap_or(0);
    p.ifindex = ingress;
    // tot_len 0: the kernel checks the skb (GSO aware) against the egress device's MTU.
    p.__bindgen_anon_1.tot_len = 0;
    p.__bindgen_anon_2.tos = ctx.load::<u8>(IP_OFF + 1).unwrap_or(0);
    p.__bindgen_anon_3.ipv4_src = saddr;
    p.__bindgen_anon_4.ipv4_dst = daddr;
    // SAFETY: `p` is a bpf_fib_lookup on this stack of the size passed; the context is this
    // program's skb.
    let rc = unsafe {
        bpf_fib_lookup(
            skb.cast(),
            &mut p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    if rc == BPF_FIB_LKUP_RET_NOT_FWDED {
        return pass(true, Fp::Pass);
    }
    if rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH {
        return pass(true, Fp::FibFail);
    }
    if decrement_ttl(ctx, ttl).is_err() {
        return TC_ACT_SHOT;
    }
    count(Fp::RedirectNeigh);
    // SAFETY: no parameters: the kernel looks the next hop up itself for `p.ifindex`.
    unsafe { bpf_redirect_neigh(p.ifindex, core::ptr::null_mut(), 0, 0) as i32 }
}

/// TTL - 1, with the IP header checksum fixed (the TTL shares a 16-bit word with the protocol).
#[inline(always)]
fn decrement_ttl(ctx: &TcContext, ttl: u8) -> Result<(), i64> {
    let proto: u8 = ctx.load(IP_TTL_OFF + 1)?;
    let old = u16::from_ne_bytes([ttl, proto]);
    let new = u16::from_ne_bytes([ttl - 1, proto]);
    ctx.l3_csum_replace(IP_CSUM_OFF, u64::from(old), u64::from(new), 2)?;
    ctx.store(IP_TTL_OFF, &(ttl - 1), 0)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
