//! Pod networking fast path (the tc program `skiff_np_ingress` of the `skiff-lb` object, on
//! the ingress of every pod host veth and of the node's uplink): the map layouts shared with
//! the agent (`node/datapath/src/lb/`).
//!
//! - [`POD_ENDPOINTS_MAP`]: [`PodEndpointKey`] (pod address) → [`PodEndpoint`] (host veth
//!   ifindex, pod and host veth MACs), one entry per local pod, written by the agent when it
//!   sets a pod's network up and deleted before it tears it down;
//! - [`FP_COUNTERS_MAP`]: one per-CPU [`FastPathCounters`] (index 0) that the program adds to.
//!
//! Addresses are 16 bytes with a family (as in [`crate::lb`]), so IPv6 fits the same map; the
//! program handles IPv4 only.

use crate::lb::{AF_INET, LbAddr, v4_addr};

/// A local pod's address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodEndpointKey {
    pub addr: LbAddr,
    pub family: u8,
    pub _pad: [u8; 3],
}

impl PodEndpointKey {
    /// The key of an IPv4 pod address (`ip_be` as the kernel stores it).
    #[inline(always)]
    pub const fn v4(ip_be: u32) -> Self {
        PodEndpointKey {
            addr: v4_addr(ip_be),
            family: AF_INET,
            _pad: [0; 3],
        }
    }
}

/// Where a local pod is: packets for it get `src MAC = host_mac`, `dst MAC = pod_mac` and are
/// sent with `bpf_redirect_peer(ifindex)` straight into the pod's network namespace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodEndpoint {
    /// ifindex of the pod's host-side veth, in the node namespace.
    pub ifindex: u32,
    /// MAC of the pod's `eth0`.
    pub pod_mac: [u8; 6],
    /// MAC of the host-side veth (the pod's gateway).
    pub host_mac: [u8; 6],
}

/// Per-CPU packet counters of the fast path.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastPathCounters {
    /// Packets delivered into a local pod with `bpf_redirect_peer` (from a pod or the uplink).
    pub redirect_peer: u64,
    /// Packets from a pod sent to the FIB's next hop with `bpf_redirect_neigh`.
    pub redirect_neigh: u64,
    /// IPv4 packets from a pod handed to the node's stack unchanged: for the node itself or
    /// without any route (the FIB's `NOT_FWDED`), broadcast or multicast, not addressed to
    /// the host's MAC, TTL about to expire.
    pub pass: u64,
    /// IPv4 packets from a pod whose FIB lookup failed otherwise (unreachable, blackhole or
    /// prohibit routes, fragmentation needed, forwarding disabled), handed to the node's
    /// stack, which answers them as forwarding would.
    pub fib_fail: u64,
}

impl FastPathCounters {
    /// Sums per-CPU values.
    pub fn sum<'a>(per_cpu: impl IntoIterator<Item = &'a FastPathCounters>) -> FastPathCounters {
        per_cpu
            .into_iter()
            .fold(FastPathCounters::default(), |mut acc, c| {
                acc.redirect_peer = acc.redirect_peer.wrapping_add(c.redirect_peer);
                acc.redirect_neigh = acc.redirect_neigh.wrapping_add(c.redirect_neigh);
                acc.pass = acc.pass.wrapping_add(c.pass);
                acc.fib_fail = acc.fib_fail.wrapping_add(c.fib_fail);
                acc
            })
    }
}

/// Default capacity of [`POD_ENDPOINTS_MAP`] (pods per node).
pub const POD_ENDPOINTS_DEFAULT_MAX: u32 = 4096;

/// Map names in the `skiff-lb` object.
pub const POD_ENDPOINTS_MAP: &str = "POD_ENDPOINTS";
pub const FP_COUNTERS_MAP: &str = "FP_COUNTERS";

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<PodEndpointKey>(), 16 + 1 + 3);
        assert_eq!(size_of::<PodEndpoint>(), 4 + 6 + 6);
        assert_eq!(size_of::<FastPathCounters>(), 4 * 8);
        let k = PodEndpointKey::v4(u32::from_ne_bytes([10, 244, 1, 5]));
        assert_eq!(&k.addr[..4], &[10, 244, 1, 5]);
        assert_eq!(k.family, AF_INET);
    }

    #[test]
    fn sums_counters() {
        let a = FastPathCounters {
            redirect_peer: 1,
            redirect_neigh: 2,
            pass: 3,
            fib_fail: 4,
        };
        assert_eq!(
            FastPathCounters::sum([&a, &a]),
            FastPathCounters {
                redirect_peer: 2,
                redirect_neigh: 4,
                pass: 6,
                fib_fail: 8
            }
        );
    }
}
