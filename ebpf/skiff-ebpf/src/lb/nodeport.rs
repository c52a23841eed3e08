//! NodePort from outside the node (tc, TCX ingress on the node's uplink and every pod host
//! veth): DNAT to a backend picked by Maglev, SNAT to the node (externalTrafficPolicy
//! Cluster) or not (Local), both directions recorded in `NP_CT`, replies translated back and
//! everything sent through `bpf_fib_lookup` + `bpf_redirect_neigh`. Packets that are not
//! NodePort traffic go on to the pod networking fast path ([`super::podnet`]).
//!
//! The agent programs one frontend `<node IP>:<nodePort>` with `LB_FLAG_NODEPORT` per
//! ServicePort with a `nodePort` (NodePort and LoadBalancer Services), and one
//! `<LoadBalancer ingress IP>:<port>` per ServicePort of a LoadBalancer Service, in the same
//! `LB_SERVICES`/`LB_SLOTS`/`LB_BACKENDS` maps, so pods dialling it are balanced by the socket
//! programs too. A first packet to such a frontend takes entry `np_flow_hash(5-tuple) % m` of
//! the service's table in `LB_MAGLEV` (service id → `LbMaglev`, a hash map whose value holds
//! up to 16381 backend ids: one `BPF_MAP_UPDATE_ELEM` replaces a whole table atomically, and
//! aya needs no inner-map support, unlike an array of maps), or a random slot when the table
//! is missing or names a backend already removed. SNAT is to the node address in `NP_SNAT`
//! (the frontend's own address when it is unset). With SNAT the client's port is kept as the
//! NAT port unless another flow holds it towards that backend (then a random port of
//! 61000-65535, claimed atomically, at most 8 tries). externalTrafficPolicy `Local`
//! (`LB_FLAG_LOCAL`): the frontend has only this node's ready endpoints and the program only
//! DNATs; the reply entry, keyed backend → client, rewrites the source back to the frontend on
//! the pod's host veth. Translated packets never reach the node's stack (no RST, no martian
//! drop).
//!
//! IPv4 only, option-less unfragmented headers only; no TCP state tracking (entries age out
//! by LRU only). Reads `LB_MAGLEV` for a new flow; writes only `NP_CT` and the counters. Never
//! translates a packet that is not to a NodePort frontend or of a recorded flow.

use super::arp::answer_arp;
use super::podnet::fast_path;
use super::*;

/// How many NAT ports to try (the client's own, then random ones) before giving up a flow.
const NAT_PORT_ATTEMPTS: u32 = 8;

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
/// Packets that are not NodePort traffic go on to the pod networking [`fast_path`]. Before
/// all that, ARP requests for an address this node announces are answered ([`answer_arp`]).
#[classifier]
pub fn skiff_np_ingress(ctx: TcContext) -> i32 {
    if let Some(verdict) = answer_arp(&ctx) {
        return verdict;
    }
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
    if let Some(e) = unsafe { NP_CT.get(fwd_key) }.copied()
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
    if let Some(e) = unsafe { NP_CT.get(reply_key) }.copied() {
        return Some(translate(ctx, &t, &e));
    }
    let svc_key = LbServiceKey::v4(t.daddr, t.dport, t.proto);
    // SAFETY: agent-written map, whole values replaced, copied out.
    if let Some(svc) = unsafe { LB_SERVICES.get(svc_key) }.copied()
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
    let table = unsafe { LB_MAGLEV.get(svc.id) }?;
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

/// The address a SNATed flow to frontend address `frontend` gets: the node address in
/// `NP_SNAT`, else the frontend's own (a NodePort frontend is a node address).
#[inline(always)]
fn snat_addr(frontend: u32) -> u32 {
    match NP_SNAT.get(0) {
        Some(a) if *a != 0 => *a,
        _ => frontend,
    }
}

/// externalTrafficPolicy Cluster: records a flow DNATed to `picked` and SNATed to the node
/// address ([`snat_addr`]), with a NAT port (the client's, else a random free one of the NAT range) that
/// tells its replies apart. Returns the forward translation; `None`: no port, drop.
#[inline(always)]
fn record_snat_flow(t: &Tuple, fwd_key: &NpCtKey, picked: &Picked) -> Option<NpCtEntry> {
    let b = picked.backend;
    let backend_ip = v4_be(&b.addr);
    let snat = snat_addr(t.daddr);
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
        daddr: snat,
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
            .insert(reply_key, back, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            claimed = true;
            break;
        }
        // Taken: by this very flow (a retransmitted first packet after its forward entry
        // was evicted, or a backend change) it is ours again.
        // SAFETY: LRU value, copied out.
        if let Some(old) = unsafe { NP_CT.get(reply_key) }.copied()
            && old.daddr == t.saddr
            && old.dport == t.sport
            && old.sport == t.dport
        {
            let _ = NP_CT.insert(reply_key, back, 0);
            claimed = true;
            break;
        }
    }
    if !claimed {
        return None;
    }
    let fwd = NpCtEntry {
        saddr: snat,
        daddr: backend_ip,
        sport: reply_key.dport,
        dport: b.port,
        backend_id: picked.id,
        service_id: b.service_id,
    };
    if NP_CT.insert(fwd_key, fwd, 0).is_err() {
        let _ = NP_CT.remove(reply_key);
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
    NP_CT.insert(reply_key, back, 0).ok()?;
    let fwd = NpCtEntry {
        saddr: t.saddr,
        daddr: backend_ip,
        sport: t.sport,
        dport: b.port,
        backend_id: picked.id,
        service_id: b.service_id,
    };
    if NP_CT.insert(fwd_key, fwd, 0).is_err() {
        let _ = NP_CT.remove(reply_key);
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
