//! Types shared between Skiff's eBPF programs (built for `bpfel-unknown-none` with the nightly
//! toolchain) and the node agent (stable). Every type here is `#[repr(C)]`, has no padding
//! holes the verifier would complain about, and is plain old data, so the same bytes mean the
//! same thing on both sides of a BPF map.
//!
//! Per-pod traffic accounting (`skiff-ebpf`) is at the top level; the Service load balancer's
//! layouts (`skiff-lb`) are in [`lb`], the pod networking fast path's in [`podnet`], the L2
//! announcement of LoadBalancer addresses' in [`l2`],
//! NetworkPolicy enforcement's (`skiff-policy`) in [`policy`], the pods' device allow list
//! (`skiff-devices`) in [`devices`] (a pure function, unit-tested on the host). The crate is
//! `#![no_std]` and depends on nothing.
#![no_std]

pub mod devices;
pub mod l2;
pub mod lb;
pub mod podnet;
pub mod policy;

/// Traffic counters of one pod, one direction, one CPU (the map is per-CPU; userspace sums).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficCounters {
    pub packets: u64,
    pub bytes: u64,
}

impl TrafficCounters {
    /// Adds one packet of `len` bytes.
    pub fn record(&mut self, len: u64) {
        self.packets = self.packets.wrapping_add(1);
        self.bytes = self.bytes.wrapping_add(len);
    }

    /// Sums per-CPU values.
    pub fn sum<'a>(per_cpu: impl IntoIterator<Item = &'a TrafficCounters>) -> TrafficCounters {
        per_cpu
            .into_iter()
            .fold(TrafficCounters::default(), |mut acc, c| {
                acc.packets = acc.packets.wrapping_add(c.packets);
                acc.bytes = acc.bytes.wrapping_add(c.bytes);
                acc
            })
    }
}

/// Default capacity of the per-pod maps (pods per node). The loader may resize the maps.
pub const MAX_PODS: u32 = 4096;

/// Names of the per-pod traffic maps in the eBPF object (cgroup id `u64` → per-CPU
/// [`TrafficCounters`]), as the loader finds and pins them.
pub const POD_INGRESS_MAP: &str = "POD_INGRESS";
pub const POD_EGRESS_MAP: &str = "POD_EGRESS";

/// Names of the `cgroup_skb` programs that fill those maps.
pub const POD_INGRESS_PROG: &str = "skiff_pod_ingress";
pub const POD_EGRESS_PROG: &str = "skiff_pod_egress";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_two_u64s() {
        assert_eq!(core::mem::size_of::<TrafficCounters>(), 16);
        assert_eq!(core::mem::align_of::<TrafficCounters>(), 8);
    }

    #[test]
    fn sums_per_cpu_values() {
        let mut a = TrafficCounters::default();
        a.record(100);
        a.record(50);
        let b = TrafficCounters {
            packets: 1,
            bytes: 10,
        };
        assert_eq!(
            TrafficCounters::sum([&a, &b]),
            TrafficCounters {
                packets: 3,
                bytes: 160
            }
        );
    }
}
