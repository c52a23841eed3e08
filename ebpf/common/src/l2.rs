//! L2 announcement of LoadBalancer addresses (the tc program `skiff_np_ingress` of the
//! `skiff-lb` object answers ARP on the node's uplink): the map layout shared with the agent
//! (`node/datapath/src/lb/l2.rs`).
//!
//! - [`L2_ANNOUNCE_MAP`]: IPv4 address (as the kernel stores it: network byte order in
//!   memory) → [`L2Announce`]. An ARP request arriving on device `ifindex` for an address in
//!   the map whose `deadline_ns` is still ahead of `bpf_ktime_get_ns()` is answered with an
//!   ARP reply carrying `mac`, sent back out of the same device. The agent that holds the
//!   address's lease writes the entry with the lease's expiry as deadline and refreshes it at
//!   each renewal, so a node whose agent is gone stops answering by itself.

/// One announced address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct L2Announce {
    /// Until when to answer, on the `bpf_ktime_get_ns` clock (`CLOCK_MONOTONIC`).
    pub deadline_ns: u64,
    /// The device requests must arrive on (the node's uplink), in the node's namespace.
    pub ifindex: u32,
    /// [`L2_FLAG_ANNOUNCE`]; other bits are reserved (zero).
    pub flags: u32,
    /// The MAC the reply gives for the address (the uplink's).
    pub mac: [u8; 6],
    pub _pad: [u8; 2],
}

/// [`L2Announce::flags`]: answer ARP for this address (an entry without it is ignored).
pub const L2_FLAG_ANNOUNCE: u32 = 1;

/// Default capacity of [`L2_ANNOUNCE_MAP`] (LoadBalancer addresses this node may announce).
pub const L2_ANNOUNCE_DEFAULT_MAX: u32 = 4096;

/// Map name in the `skiff-lb` object.
pub const L2_ANNOUNCE_MAP: &str = "L2_ANNOUNCE";

/// Whether entry `e` answers a request that arrived on `ifindex` at `now_ns`
/// (`bpf_ktime_get_ns`). Shared by the program and the agent's tests.
#[inline(always)]
pub const fn l2_answers(e: &L2Announce, ifindex: u32, now_ns: u64) -> bool {
    e.flags & L2_FLAG_ANNOUNCE != 0 && e.ifindex == ifindex && e.deadline_ns > now_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_has_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<L2Announce>(), 8 + 4 + 4 + 6 + 2);
    }

    #[test]
    fn answers_only_before_the_deadline_on_its_device() {
        let e = L2Announce {
            deadline_ns: 100,
            ifindex: 3,
            flags: L2_FLAG_ANNOUNCE,
            ..Default::default()
        };
        assert!(l2_answers(&e, 3, 99));
        assert!(!l2_answers(&e, 3, 100), "expired");
        assert!(!l2_answers(&e, 4, 50), "another device");
        assert!(!l2_answers(&L2Announce { flags: 0, ..e }, 3, 50), "no flag");
    }
}
