//! Skiff's eBPF programs, built for `bpfel-unknown-none` by `node/datapath/build.rs`
//! (aya-build, nightly toolchain, `-Z build-std=core`) and embedded in `skiff-datapath`. A Cargo
//! workspace of its own (aya-ebpf 0.2.1, aya-log-ebpf 0.2.0), excluded from the stable one.
//! Four objects: this one (accounting), `skiff-lb` (`src/lb/`), `skiff-policy`
//! (`src/policy/`) and `skiff-devices` (`src/devices/`). Every program stays small and
//! bounds-checked; logic userspace can do stays in userspace. Licensed "Dual MIT/GPL" for the
//! kernel's GPL-compatibility check.
//!
//! Per-pod traffic accounting: two `cgroup_skb` programs (ingress and egress) count the packets
//! and bytes of every socket buffer that passes through the cgroup they are attached to, keyed
//! by the cgroup v2 id of the socket's cgroup (`bpf_skb_cgroup_id`, i.e. the inode number of
//! the cgroup directory), in the per-CPU hash maps `POD_INGRESS` and `POD_EGRESS` (BTF-typed,
//! so `bpftool map dump pinned` shows `packets` and `bytes`). They never drop anything: both
//! always return 1 ("allow").
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    btf_maps::PerCpuHashMap,
    helpers::bpf_skb_cgroup_id,
    macros::{btf_map, cgroup_skb},
    programs::SkBuffContext,
};
use skiff_common::{MAX_PODS, TrafficCounters};

/// cgroup_skb verdict: let the packet through.
const ALLOW: i32 = 1;

/// cgroup id → packets/bytes (per CPU). The loader may resize it (`max_entries`).
type CounterMap = PerCpuHashMap<u64, TrafficCounters, { MAX_PODS as usize }>;

/// Ingress counters: what the sockets of a cgroup received.
#[btf_map]
static POD_INGRESS: CounterMap = CounterMap::new();

/// Egress counters: what the sockets of a cgroup sent.
#[btf_map]
static POD_EGRESS: CounterMap = CounterMap::new();

#[cgroup_skb(ingress)]
pub fn skiff_pod_ingress(ctx: SkBuffContext) -> i32 {
    count(&POD_INGRESS, &ctx);
    ALLOW
}

#[cgroup_skb(egress)]
pub fn skiff_pod_egress(ctx: SkBuffContext) -> i32 {
    count(&POD_EGRESS, &ctx);
    ALLOW
}

#[inline(always)]
fn count(map: &CounterMap, ctx: &SkBuffContext) {
    // SAFETY: `ctx.skb.skb` is the `__sk_buff` the kernel passed to this program;
    // bpf_skb_cgroup_id is allowed in cgroup_skb programs and only reads it.
    let cgroup_id = unsafe { bpf_skb_cgroup_id(ctx.skb.skb) };
    if cgroup_id == 0 {
        // No full socket (e.g. a request or timewait socket): nothing to attribute it to.
        return;
    }
    let len = u64::from(ctx.len());
    if let Some(counters) = map.get_ptr_mut(cgroup_id) {
        // SAFETY: the pointer comes from a successful lookup in a per-CPU map, so it points to
        // this CPU's value, which no other CPU writes; the verifier checks the bounds.
        unsafe { (*counters).record(len) };
        return;
    }
    let mut first = TrafficCounters::default();
    first.record(len);
    if map
        .insert(cgroup_id, first, u64::from(BPF_NOEXIST))
        .is_err()
    {
        // Lost a race with another CPU inserting the same key (or the map is full): add to
        // whatever is there now; if the map is full the packet goes uncounted.
        if let Some(counters) = map.get_ptr_mut(cgroup_id) {
            // SAFETY: as above.
            unsafe { (*counters).record(len) };
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
