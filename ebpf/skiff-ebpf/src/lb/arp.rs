//! L2 announcement of LoadBalancer addresses: ARP answered from the tc ingress program on the
//! node's uplink (the program already attached there for NodePort, so no second attachment,
//! link pin or program type is needed; XDP would only save work on ARP, which is rare).
//!
//! An Ethernet/IPv4 ARP request (`oper` 1) whose target address is in `L2_ANNOUNCE` with a
//! deadline still ahead of `bpf_ktime_get_ns()` and the ingress device as its `ifindex` is
//! turned into the reply in place (Ethernet destination and target = the asker, Ethernet
//! source and sender = the entry's MAC, sender address = the asked address) and sent back
//! out of the same device with `bpf_redirect`. Everything else, gratuitous ARP included
//! (sender address = target address: an announcement, not a question), goes on unchanged.
//! Reads `L2_ANNOUNCE` only; fixed offsets, every load bounds-checked by the helper.

use aya_ebpf::helpers::bpf_redirect;
use skiff_common::l2::l2_answers;

use super::*;

const ETH_P_ARP: u16 = 0x0806;
/// The ARP header after Ethernet: hardware type, protocol type, lengths, operation.
const ARP_OFF: usize = ETH_HLEN;
const ARP_OPER_OFF: usize = ARP_OFF + 6;
const ARP_SHA_OFF: usize = ARP_OFF + 8;
const ARP_SPA_OFF: usize = ARP_OFF + 14;
const ARP_THA_OFF: usize = ARP_OFF + 18;
const ARP_TPA_OFF: usize = ARP_OFF + 24;
/// htype 1 (Ethernet), ptype 0x0800 (IPv4), hlen 6, plen 4, in wire order.
const ARP_ETH_IPV4: [u8; 6] = [0, 1, 0x08, 0x00, 6, 4];
const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;

/// The verdict for an ARP request this node announces the target of (the reply, redirected
/// out of the ingress device); `None` for any other packet, which goes on untouched.
#[inline(always)]
pub(super) fn answer_arp(ctx: &TcContext) -> Option<i32> {
    if u16::from_be(ctx.load::<u16>(12).ok()?) != ETH_P_ARP {
        return None;
    }
    if ctx.load::<[u8; 6]>(ARP_OFF).ok()? != ARP_ETH_IPV4
        || u16::from_be(ctx.load::<u16>(ARP_OPER_OFF).ok()?) != ARP_REQUEST
    {
        return None;
    }
    let tpa: u32 = ctx.load(ARP_TPA_OFF).ok()?;
    let spa: u32 = ctx.load(ARP_SPA_OFF).ok()?;
    if spa == tpa {
        return None;
    }
    // SAFETY: agent-written map, whole values replaced, copied out.
    let entry = unsafe { L2_ANNOUNCE.get(tpa) }.copied()?;
    // SAFETY: `ctx.skb.skb` is this program's `__sk_buff`.
    let ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if !l2_answers(&entry, ifindex, now) {
        return None;
    }
    let sha: [u8; 6] = ctx.load(ARP_SHA_OFF).ok()?;
    let eth_src: [u8; 6] = ctx.load(6).ok()?;
    if reply(ctx, &eth_src, &sha, spa, tpa, &entry.mac).is_err() {
        return Some(TC_ACT_SHOT);
    }
    if debug_on() {
        debug!(
            ctx,
            "l2: answered ARP for {:i} from {:i}",
            tpa.to_ne_bytes(),
            spa.to_ne_bytes()
        );
    }
    // SAFETY: no pointers; redirects this skb to the egress of `ifindex`.
    Some(unsafe { bpf_redirect(ifindex, 0) } as i32)
}

/// Rewrites the request (Ethernet source `eth_src`, from `sha`/`spa`, for `tpa`) into the
/// reply giving `mac`.
#[inline(always)]
fn reply(
    ctx: &TcContext,
    eth_src: &[u8; 6],
    sha: &[u8; 6],
    spa: u32,
    tpa: u32,
    mac: &[u8; 6],
) -> Result<(), i64> {
    ctx.store(0, eth_src, 0)?;
    ctx.store(6, mac, 0)?;
    ctx.store(ARP_OPER_OFF, &ARP_REPLY.to_be(), 0)?;
    ctx.store(ARP_SHA_OFF, mac, 0)?;
    ctx.store(ARP_SPA_OFF, &tpa, 0)?;
    ctx.store(ARP_THA_OFF, sha, 0)?;
    ctx.store(ARP_TPA_OFF, &spa, 0)?;
    Ok(())
}
