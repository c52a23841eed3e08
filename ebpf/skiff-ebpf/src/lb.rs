//! Skiff's socket-level Service load balancer (the `skiff-lb` object): four
//! `cgroup_sock_addr` programs the agent attaches to the node's pod cgroup parent, so they run
//! for the sockets of every pod, whatever network namespace the pod is in. Built like
//! `skiff-ebpf` by `node/build.rs`; the map layouts are in `skiff_common::lb`.
//!
//! - `connect4` (TCP, connected UDP): a destination that is a frontend in `LB_SERVICES` is
//!   rewritten to one of its backends (random slot, or the client netns' affinity entry when
//!   the service has ClientIP affinity and it has not expired); the socket cookie and backend
//!   are recorded in `LB_REVNAT`. A frontend with no backends fails the `connect()` at once
//!   with ECONNREFUSED (`bpf_set_retval`, then return 0).
//! - `sendmsg4` (unconnected UDP): the same per datagram.
//! - `recvmsg4`, `getpeername4`: a peer that is the backend recorded for this socket is shown
//!   as the frontend instead.
//!
//! Programs only read maps the agent writes, except `LB_REVNAT`/`LB_AFFINITY` (LRU) and the
//! per-CPU counters. Every loop is bounded.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{HashMap, LruHashMap, PerCpuHashMap},
    helpers::{
        bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_ktime_get_ns,
        bpf_set_retval,
    },
    macros::{btf_map, cgroup_sock_addr},
    programs::SockAddrContext,
};
use skiff_common::lb::{
    AF_INET, LB_DEFAULT_MAX_AFFINITY, LB_DEFAULT_MAX_BACKENDS, LB_DEFAULT_MAX_REVNAT,
    LB_DEFAULT_MAX_SERVICES, LB_FLAG_AFFINITY, LbAffinity, LbAffinityKey, LbBackend, LbCounters,
    LbRevNat, LbRevNatKey, LbService, LbServiceKey, LbSlotKey, v4_addr, v4_be,
};

/// cgroup_sock_addr verdict: go on (with whatever the program rewrote).
const ALLOW: i32 = 1;
/// cgroup_sock_addr verdict: fail the syscall (with the error set by `bpf_set_retval`).
const REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;
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

/// Which counter a translation adds to.
#[derive(Clone, Copy)]
enum Kind {
    Connect,
    Send,
}

#[cgroup_sock_addr(connect4)]
pub fn skiff_lb_connect4(ctx: SockAddrContext) -> i32 {
    forward(&ctx, Kind::Connect)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn skiff_lb_sendmsg4(ctx: SockAddrContext) -> i32 {
    forward(&ctx, Kind::Send)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn skiff_lb_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx);
    // recvmsg4 programs must return 1.
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn skiff_lb_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx);
    // getpeername4 programs must return 1.
    ALLOW
}

/// A backend picked for one translation.
struct Picked {
    id: u32,
    backend: LbBackend,
}

/// Frontend → backend for `connect4`/`sendmsg4`.
#[inline(always)]
fn forward(ctx: &SockAddrContext, kind: Kind) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: `sa` is the `bpf_sock_addr` context the kernel passed to this program; these
    // fields are readable in connect4 and sendmsg4 programs (the verifier checks each access).
    let (ip, port, proto) = unsafe { ((*sa).user_ip4, (*sa).user_port, (*sa).protocol) };
    let key = LbServiceKey::v4(ip, u16::from_be(port as u16), proto as u8);
    // SAFETY: only the agent writes LB_SERVICES, replacing whole values (never in place), so
    // the value read here is a consistent snapshot.
    let Some(svc) = (unsafe { LB_SERVICES.get(&key) }).copied() else {
        return ALLOW;
    };
    let Some(picked) = pick(ctx, &key, &svc) else {
        // No backend (none configured, or all vanished under concurrent updates): refuse at
        // once instead of letting the client wait for a virtual IP nobody answers.
        // SAFETY: bpf_set_retval is allowed in connect4/sendmsg4 programs (kernel >= 5.18); a
        // program returning 0 then fails the syscall with this error instead of EPERM.
        unsafe { bpf_set_retval(-ECONNREFUSED) };
        return REJECT;
    };
    let b = picked.backend;
    // SAFETY: as above; user_ip4 and user_port are writable in connect4 and sendmsg4.
    unsafe {
        (*sa).user_ip4 = v4_be(&b.addr);
        (*sa).user_port = u32::from(b.port.to_be());
    }
    remember(ctx, &key, &svc, &b);
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
                && let Some(b) = backend_of(a.backend_id, svc.id)
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
        if let Some(backend) = backend_of(id, svc.id) {
            return Some(Picked { id, backend });
        }
    }
    None
}

/// Backend `id`, if it exists and belongs to service `service_id`.
#[inline(always)]
fn backend_of(id: u32, service_id: u32) -> Option<LbBackend> {
    // SAFETY: agent-written map, value copied out.
    let b = unsafe { LB_BACKENDS.get(&id) }.copied()?;
    (b.service_id == service_id && b.family == AF_INET).then_some(b)
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
        family: AF_INET,
        _pad: [0; 5],
    };
    let value = LbRevNat {
        addr: key.addr,
        port: key.port,
        family: AF_INET,
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

/// Backend → frontend for `recvmsg4`/`getpeername4`.
#[inline(always)]
fn reverse(ctx: &SockAddrContext) {
    let sa = ctx.sock_addr;
    // SAFETY: readable fields of this program's context (recvmsg4/getpeername4).
    let (ip, port) = unsafe { ((*sa).user_ip4, (*sa).user_port) };
    // SAFETY: `ctx` is this program's context; bpf_get_socket_cookie accepts it.
    let cookie = unsafe { bpf_get_socket_cookie(sa.cast()) };
    let key = LbRevNatKey {
        cookie,
        addr: v4_addr(ip),
        port: u16::from_be(port as u16),
        family: AF_INET,
        _pad: [0; 5],
    };
    // SAFETY: LRU value, copied out.
    if let Some(v) = unsafe { LB_REVNAT.get(&key) }.copied() {
        // SAFETY: user_ip4 and user_port are writable in recvmsg4 and getpeername4.
        unsafe {
            (*sa).user_ip4 = v4_be(&v.addr);
            (*sa).user_port = u32::from(v.port.to_be());
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
