//! Skiff's socket-level Service load balancer (the `skiff-lb` object): eight
//! `cgroup_sock_addr` programs (four per address family) the agent attaches to the node's pod
//! cgroup parent, so they run for the sockets of every pod, whatever network namespace the pod
//! is in. Built like `skiff-ebpf` by `node/datapath/build.rs`; the map layouts are in
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
//! The IPv4 and IPv6 programs ([`sock`]) share one generic body per hook; the
//! family only decides where the address sits in `bpf_sock_addr` and the
//! `family` field of the keys, so both families live in the same maps. IPv4-mapped IPv6
//! destinations (`::ffff:a.b.c.d` on an IPv6 socket) are looked up as IPv6 keys, i.e. not
//! translated.
//!
//! - `skiff_np_ingress` (tc, TCX ingress on the node's uplink and on every pod host veth):
//!   ARP for the LoadBalancer addresses this node announces ([`arp`]), NodePort and
//!   LoadBalancer addresses from outside the node ([`nodeport`]), then the pod networking
//!   fast path ([`podnet`]).
//!
//! Programs only read maps the agent writes, except `LB_REVNAT`/`LB_AFFINITY`/`NP_CT` (LRU)
//! and the per-CPU counters. Every loop is bounded. aya-log records are emitted only when the
//! loader set the read-only global `DEBUG` (`--bpf-debug`); otherwise the verifier removes the
//! logging code.
//!
//! This file holds what the three share: the maps, backend selection and the packet layout.
#![no_std]
#![no_main]

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya_ebpf::{
    Global,
    bindings::{
        BPF_F_MARK_MANGLED_0, BPF_F_NO_PREALLOC, BPF_F_PSEUDO_HDR, BPF_NOEXIST, TC_ACT_OK,
        bpf_fib_lookup as FibParams, bpf_sock_addr,
    },
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    helpers::{
        bpf_fib_lookup, bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie,
        bpf_ktime_get_ns, bpf_redirect_neigh, bpf_redirect_peer, bpf_set_retval,
    },
    macros::{btf_map, cgroup_sock_addr, classifier},
    programs::{SockAddrContext, TcContext},
};
use aya_log_ebpf::debug;
use skiff_common::l2::{L2_ANNOUNCE_DEFAULT_MAX, L2Announce};
use skiff_common::lb::{
    AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, LB_DEFAULT_MAX_AFFINITY, LB_DEFAULT_MAX_BACKENDS,
    LB_DEFAULT_MAX_NP_CT, LB_DEFAULT_MAX_REVNAT, LB_DEFAULT_MAX_SERVICES, LB_FAMILY_IN_CLUSTER,
    LB_FLAG_AFFINITY, LB_FLAG_LOCAL, LB_FLAG_NODEPORT, LB_MAGLEV_MAX_M, LbAddr, LbAffinity,
    LbAffinityKey, LbBackend, LbCounters, LbMaglev, LbRevNat, LbRevNatKey, LbService, LbServiceKey,
    LbSlotKey, NP_CT_FORWARD, NP_CT_REPLY, NP_NAT_PORT_MAX, NP_NAT_PORT_MIN, NpCtEntry, NpCtKey,
    np_flow_hash, v4_addr, v4_be,
};
use skiff_common::podnet::{
    FastPathCounters, POD_ENDPOINTS_DEFAULT_MAX, PodEndpoint, PodEndpointKey,
};

mod arp;
mod nodeport;
mod podnet;
mod sock;

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

/// The LoadBalancer addresses this node answers ARP for (IPv4 address as the kernel stores
/// it → device, MAC, deadline), written by the agent only (see `skiff_common::l2`).
#[btf_map]
static L2_ANNOUNCE: HashMap<u32, L2Announce, { L2_ANNOUNCE_DEFAULT_MAX as usize }, NO_PREALLOC> =
    HashMap::new();

/// The address SNATed NodePort and LoadBalancer flows get (index 0; 0 = the frontend's),
/// written by the agent only.
#[btf_map]
static NP_SNAT: Array<u32, 1> = Array::new();

/// The fast path's per-CPU counters (index 0); the program only adds.
#[btf_map]
static FP_COUNTERS: PerCpuArray<FastPathCounters, 1> = PerCpuArray::new();

// Packet layout of the tc program (IPv4 over Ethernet).
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
const TC_ACT_SHOT: i32 = 2;
const BPF_FIB_LKUP_RET_SUCCESS: i64 = 0;
const BPF_FIB_LKUP_RET_NO_NEIGH: i64 = 7;

/// A backend picked for one translation.
struct Picked {
    id: u32,
    backend: LbBackend,
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
        let Some(id) = unsafe { LB_SLOTS.get(slot_key) }.copied() else {
            continue;
        };
        // An in-cluster view's backends are of the frontend's own family.
        if let Some(backend) = backend_of(id, svc.id, key.family & !LB_FAMILY_IN_CLUSTER) {
            return Some(Picked { id, backend });
        }
    }
    None
}

/// Backend `id`, if it exists, belongs to service `service_id` and is of `family`.
#[inline(always)]
fn backend_of(id: u32, service_id: u32, family: u8) -> Option<LbBackend> {
    // SAFETY: agent-written map, value copied out.
    let b = unsafe { LB_BACKENDS.get(id) }.copied()?;
    (b.service_id == service_id && b.family == family).then_some(b)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
