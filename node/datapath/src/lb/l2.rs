//! L2 announcement of LoadBalancer addresses: the `L2_ANNOUNCE` map of the `skiff-lb` object
//! (pinned with the LB maps), which the tc program on the uplink reads to answer ARP (see
//! `skiff_common::l2` and `ebpf/skiff-ebpf/src/lb/arp.rs`). The agent writes an entry while
//! it holds an address's lease, with the lease's expiry as deadline on the program's clock
//! ([`monotonic_ns`]), and removes it when it stops announcing.

use std::net::Ipv4Addr;

use skiff_common::l2::L2_ANNOUNCE_MAP;
pub use skiff_common::l2::{L2_FLAG_ANNOUNCE, L2Announce};

use super::ServiceLb;
use super::bpf::{entries, remove};
use super::pod::P;
use crate::BpfError;

/// Now on the clock of `bpf_ktime_get_ns` (`CLOCK_MONOTONIC`), in nanoseconds.
pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64),
        // CLOCK_MONOTONIC always exists; 0 would only make every deadline look far away.
        Err(_) => 0,
    }
}

/// The map key of `ip`: the address as the kernel stores it (network order in memory).
fn key(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

impl ServiceLb {
    /// Answers ARP for `ip` as `entry` says (device, MAC, deadline), replacing what was there.
    pub fn set_l2_announcement(&mut self, ip: Ipv4Addr, entry: L2Announce) -> Result<(), BpfError> {
        self.maps
            .l2_announce
            .insert(key(ip), P(entry), 0)
            .map_err(BpfError::map(L2_ANNOUNCE_MAP))
    }

    /// Stops answering ARP for `ip` (missing is not an error).
    pub fn remove_l2_announcement(&mut self, ip: Ipv4Addr) -> Result<(), BpfError> {
        remove(&mut self.maps.l2_announce, L2_ANNOUNCE_MAP, &key(ip))
    }

    /// Every entry of `L2_ANNOUNCE`, expired ones included.
    pub fn l2_announcements(&self) -> Result<Vec<(Ipv4Addr, L2Announce)>, BpfError> {
        Ok(entries(&self.maps.l2_announce, L2_ANNOUNCE_MAP)?
            .into_iter()
            .map(|(k, v)| (Ipv4Addr::from(k.to_ne_bytes()), v.0))
            .collect())
    }
}
