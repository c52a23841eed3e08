//! NetworkPolicy enforcement (the `skiff-policy` object): two `cgroup_skb` programs the agent
//! attaches to the node's pod cgroup parent, so they see every packet a pod's sockets send or
//! receive, whatever network namespace the pod is in and whatever path the packet took (the
//! tc fast path, the node's stack, loopback). Map layouts and the identity model are in
//! `skiff_common::policy`.
//!
//! A packet of a flow in `POL_CT` passes. A new flow of a pod that no policy isolates in that
//! direction passes; so do a pod's packets to itself and, on ingress, packets from this
//! node's own addresses. Otherwise the peer's identities (its pod identity from `POL_IPCACHE`,
//! its ipBlock identity from `POL_CIDRS`, and the wildcard) are looked up in `POL_RULES` with
//! the protocol and destination port; the first match allows, none drops. An allowed new flow
//! is remembered in `POL_CT` (both directions share the entry), so replies pass and a later
//! policy change leaves established connections alone. Every verdict is counted in
//! `POL_COUNTERS` by (policy, reason, direction).
//!
//! `POL_RULES` is an LPM trie keyed endpoint | direction | identity | protocol | port
//! (big-endian), so "any port" and `endPort` ranges are prefixes. Egress to a node port in
//! `POL_HOST_PORTS` (the agent's cluster DNS) is judged as the identity and port it stands
//! for. The first packet of every flow a pod starts or accepts, and every dropped packet, also
//! goes to the `POL_FLOWS` ring buffer as a `PolFlowEvent` (addresses, ports, protocol,
//! direction, reason, policy, the socket's cookie, bytes).
//!
//! IPv4 only (other packets pass). Bounded: at most five map lookups, one insert and one ring
//! record per new flow, no loops. Writes only `POL_CT`, the counters and the ring.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    btf_maps::{HashMap, LpmTrie, LruHashMap, PerCpuHashMap, RingBuf, lpm_trie::Key},
    helpers::{bpf_get_socket_cookie, bpf_ktime_get_ns},
    macros::{btf_map, cgroup_skb},
    programs::SkBuffContext,
};
use skiff_common::lb::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};
use skiff_common::policy::{
    DIR_EGRESS, DIR_INGRESS, EP_EGRESS_ISOLATED, EP_INGRESS_ISOLATED, ID_ANY, ID_HOST, ID_WORLD,
    POL_DEFAULT_MAX_CIDRS, POL_DEFAULT_MAX_COUNTERS, POL_DEFAULT_MAX_CT, POL_DEFAULT_MAX_ENDPOINTS,
    POL_DEFAULT_MAX_HOST_PORTS, POL_DEFAULT_MAX_IPCACHE, POL_DEFAULT_MAX_RULES, POL_FLOWS_BYTES,
    PolCounterKey, PolCounters, PolCtEntry, PolCtKey, PolEndpoint, PolFlowEvent, PolHostPort,
    PolHostPortKey, PolRuleKey, REASON_ALLOWED_ESTABLISHED, REASON_ALLOWED_RULE,
    REASON_ALLOWED_UNISOLATED, REASON_DENIED, RULE_PREFIX_FULL,
};

/// cgroup_skb verdicts.
const ALLOW: i32 = 1;
const DROP: i32 = 0;

const ETH_P_IP: u16 = 0x0800;

#[btf_map]
static POL_ENDPOINTS: HashMap<u32, PolEndpoint, { POL_DEFAULT_MAX_ENDPOINTS as usize }> =
    HashMap::new();
#[btf_map]
static POL_IPCACHE: HashMap<u32, u32, { POL_DEFAULT_MAX_IPCACHE as usize }> = HashMap::new();
#[btf_map]
static POL_CIDRS: LpmTrie<[u8; 4], u32, { POL_DEFAULT_MAX_CIDRS as usize }> = LpmTrie::new();
#[btf_map]
static POL_RULES: LpmTrie<PolRuleKey, u32, { POL_DEFAULT_MAX_RULES as usize }> = LpmTrie::new();
#[btf_map]
static POL_HOST_PORTS: HashMap<
    PolHostPortKey,
    PolHostPort,
    { POL_DEFAULT_MAX_HOST_PORTS as usize },
> = HashMap::new();
#[btf_map]
static POL_CT: LruHashMap<PolCtKey, PolCtEntry, { POL_DEFAULT_MAX_CT as usize }> =
    LruHashMap::new();
#[btf_map]
static POL_COUNTERS: PerCpuHashMap<
    PolCounterKey,
    PolCounters,
    { POL_DEFAULT_MAX_COUNTERS as usize },
> = PerCpuHashMap::new();

#[btf_map]
static POL_FLOWS: RingBuf<PolFlowEvent, { POL_FLOWS_BYTES as usize }> = RingBuf::new();

#[cgroup_skb(ingress)]
pub fn skiff_policy_ingress(ctx: SkBuffContext) -> i32 {
    verdict(&ctx, DIR_INGRESS)
}

#[cgroup_skb(egress)]
pub fn skiff_policy_egress(ctx: SkBuffContext) -> i32 {
    verdict(&ctx, DIR_EGRESS)
}

/// What decided a new flow.
struct Decision {
    allow: bool,
    reason: u8,
    policy: u32,
}

#[inline(always)]
fn verdict(ctx: &SkBuffContext, dir: u8) -> i32 {
    if u16::from_be(ctx.skb.protocol() as u16) != ETH_P_IP {
        return ALLOW;
    }
    // cgroup_skb data starts at the IP header.
    let (Ok(vihl), Ok(proto), Ok(saddr), Ok(daddr)) = (
        ctx.load::<u8>(0),
        ctx.load::<u8>(9),
        ctx.load::<u32>(12),
        ctx.load::<u32>(16),
    ) else {
        return ALLOW;
    };
    if vihl >> 4 != 4 {
        return ALLOW;
    }
    let (local, peer) = if dir == DIR_INGRESS {
        (daddr, saddr)
    } else {
        (saddr, daddr)
    };
    // SAFETY: agent-written map, whole values replaced; copied out at once.
    let Some(ep) = (unsafe { POL_ENDPOINTS.get(local) }).copied() else {
        // Not a pod under policy enforcement (host network, not yet set up).
        return ALLOW;
    };
    let (mut sport, mut dport) = (0u16, 0u16);
    if proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP {
        let l4 = usize::from(vihl & 0x0f) * 4;
        // Ports start every one of the three headers.
        if let (Ok(s), Ok(d)) = (ctx.load::<u16>(l4), ctx.load::<u16>(l4 + 2)) {
            sport = u16::from_be(s);
            dport = u16::from_be(d);
        }
    }
    let (local_port, peer_port) = if dir == DIR_INGRESS {
        (dport, sport)
    } else {
        (sport, dport)
    };
    let ct = PolCtKey {
        local,
        peer,
        local_port,
        peer_port,
        proto,
        _pad: [0; 3],
    };
    let len = u64::from(ctx.len());
    // SAFETY: an LRU map value copied out.
    if let Some(entry) = unsafe { POL_CT.get(ct) }.copied() {
        count(entry.policy, REASON_ALLOWED_ESTABLISHED, dir, len);
        return ALLOW;
    }
    let d = decide(&ep, dir, local, peer, proto, dport);
    count(d.policy, d.reason, dir, len);
    // SAFETY: the context's skb, which the helper only reads.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.skb.skb.cast()) };
    let event = PolFlowEvent {
        // SAFETY: no arguments.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        cookie,
        local,
        peer,
        local_port,
        peer_port,
        policy: d.policy,
        bytes: ctx.len(),
        proto,
        dir,
        reason: d.reason,
        _pad: 0,
    };
    // A full ring loses the record (the agent counts what it reads, not what it missed).
    let _ = POL_FLOWS.output(event, 0);
    if !d.allow {
        return DROP;
    }
    let entry = PolCtEntry {
        policy: d.policy,
        dir,
        _pad: [0; 3],
    };
    // Full map: the LRU evicts the oldest flow; a lost race keeps the other CPU's entry.
    let _ = POL_CT.insert(ct, entry, u64::from(BPF_NOEXIST));
    ALLOW
}

/// The verdict on the first packet of a flow of local endpoint `ep`; `dport` is the
/// destination port of the packet (the local pod's on ingress, the peer's on egress).
#[inline(always)]
fn decide(ep: &PolEndpoint, dir: u8, local: u32, peer: u32, proto: u8, dport: u16) -> Decision {
    let (isolated, blame) = if dir == DIR_INGRESS {
        (ep.flags & EP_INGRESS_ISOLATED != 0, ep.ingress_policy)
    } else {
        (ep.flags & EP_EGRESS_ISOLATED != 0, ep.egress_policy)
    };
    let unisolated = Decision {
        allow: true,
        reason: REASON_ALLOWED_UNISOLATED,
        policy: 0,
    };
    if !isolated || local == peer {
        return unisolated;
    }
    // SAFETY: agent-written map, copied out.
    let mut identity = unsafe { POL_IPCACHE.get(peer) }
        .copied()
        .unwrap_or(ID_WORLD);
    let mut port = dport;
    if identity == ID_HOST {
        if dir == DIR_INGRESS {
            return unisolated;
        }
        // A node port that stands for a Service's pods (the node's cluster DNS).
        let key = PolHostPortKey {
            port: dport,
            proto,
            _pad: 0,
        };
        // SAFETY: agent-written map, copied out.
        if let Some(hp) = unsafe { POL_HOST_PORTS.get(key) }.copied() {
            identity = hp.identity;
            port = hp.port;
        }
    }
    if let Some(policy) = rule(ep.id, dir, identity, proto, port) {
        return allowed(policy);
    }
    let cidr = Key::new(32, peer.to_ne_bytes());
    if let Some(cidr_identity) = POL_CIDRS.get(&cidr).copied()
        && let Some(policy) = rule(ep.id, dir, cidr_identity, proto, port)
    {
        return allowed(policy);
    }
    if let Some(policy) = rule(ep.id, dir, ID_ANY, proto, port) {
        return allowed(policy);
    }
    Decision {
        allow: false,
        reason: REASON_DENIED,
        policy: blame,
    }
}

#[inline(always)]
fn allowed(policy: u32) -> Decision {
    Decision {
        allow: true,
        reason: REASON_ALLOWED_RULE,
        policy,
    }
}

/// The allowing policy of the longest rule prefix matching this peer, protocol and port.
#[inline(always)]
fn rule(endpoint: u32, dir: u8, identity: u32, proto: u8, port: u16) -> Option<u32> {
    let key = Key::new(
        RULE_PREFIX_FULL,
        PolRuleKey::new(endpoint, dir, identity, proto, port),
    );
    POL_RULES.get(&key).copied()
}

#[inline(always)]
fn count(policy: u32, reason: u8, dir: u8, len: u64) {
    let key = PolCounterKey {
        policy,
        reason,
        dir,
        _pad: [0; 2],
    };
    if let Some(c) = POL_COUNTERS.get_ptr_mut(key) {
        // SAFETY: this CPU's value of a per-CPU map, written by nobody else meanwhile.
        unsafe {
            (*c).packets = (*c).packets.wrapping_add(1);
            (*c).bytes = (*c).bytes.wrapping_add(len);
        }
        return;
    }
    let first = PolCounters {
        packets: 1,
        bytes: len,
    };
    // A lost race or a full map loses this one count.
    let _ = POL_COUNTERS.insert(key, first, u64::from(BPF_ANY));
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
