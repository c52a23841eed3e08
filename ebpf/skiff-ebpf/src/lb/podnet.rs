//! The pod networking fast path (the same tc program, after NodePort): a frame for a local pod
//! is handed into its namespace with `bpf_redirect_peer`; a frame from a local pod to
//! anything else is routed with `bpf_fib_lookup` and sent with `bpf_redirect_neigh`.
//! Everything else goes to the node's stack unchanged.
//!
//! `POD_ENDPOINTS` (pod address → host veth ifindex, pod `eth0` MAC, host veth MAC; written
//! only by the agent) names the local pods. An IPv4 unicast frame addressed to the host whose
//! destination is a local pod, from a pod's veth or the uplink, gets its TTL decremented and
//! its MACs rewritten (source the pod's host veth, destination its `eth0`) before
//! `bpf_redirect_peer`. A frame from a local pod (its source is a pod whose host veth is the
//! ingress device) to anything else is routed with `bpf_fib_lookup` (TTL decremented,
//! checksum fixed): cross-node traffic leaves through the uplink at once and the other node's
//! program delivers it. Non-IPv4 (ARP), frames for other hosts, broadcast and multicast, a
//! TTL that would expire, node addresses and unrouted destinations pass to the stack (counted
//! as `pass`); failed lookups (unreachable routes, fragmentation needed) too, counted as
//! `fib_fail`, and the stack then answers as forwarding would. `FP_COUNTERS` (per CPU) also
//! counts `redirect_peer` and `redirect_neigh`. The program rewrites nothing but MACs, TTL
//! and the checksum, and never takes a packet the stack must see.

use super::*;

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
    TC_ACT_OK
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
pub(super) fn fast_path(ctx: &TcContext) -> i32 {
    let skb = ctx.skb.skb;
    // SAFETY: `skb` is this program's `__sk_buff`; both fields are readable in tc programs.
    let (ingress, pkt_type) = unsafe { ((*skb).ingress_ifindex, (*skb).pkt_type) };
    let Ok(ethertype) = ctx.load::<u16>(12) else {
        return TC_ACT_OK;
    };
    if u16::from_be(ethertype) != ETH_P_IP {
        return TC_ACT_OK;
    }
    let (Ok(vihl), Ok(ttl), Ok(saddr), Ok(daddr)) = (
        ctx.load::<u8>(IP_OFF),
        ctx.load::<u8>(IP_TTL_OFF),
        ctx.load::<u32>(IP_SADDR_OFF),
        ctx.load::<u32>(IP_DADDR_OFF),
    ) else {
        return TC_ACT_OK;
    };
    if vihl >> 4 != 4 || vihl & 0x0f < 5 {
        return TC_ACT_OK;
    }
    // SAFETY: agent-written map, whole values replaced, copied out.
    let from_pod = unsafe { POD_ENDPOINTS.get(PodEndpointKey::v4(saddr)) }
        .is_some_and(|e| e.ifindex == ingress);
    if pkt_type != PACKET_HOST || ttl <= 1 {
        return pass(from_pod, Fp::Pass);
    }
    // SAFETY: as above.
    if let Some(ep) = unsafe { POD_ENDPOINTS.get(PodEndpointKey::v4(daddr)) }.copied() {
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
        return TC_ACT_OK;
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
