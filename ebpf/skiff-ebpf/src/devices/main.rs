//! Device confinement (the `skiff-devices` object): one `cgroup_device` program that the agent
//! attaches to the cgroup of every unprivileged pod, so the kernel asks it before any process
//! of the pod creates a device node (`mknod`) or opens one for reading or writing. The policy
//! is runc's default device allow list, [`skiff_common::devices::allowed`]; a denied access
//! fails with `EPERM`.
//!
//! No maps, no helpers, no loops: three loads from the context and a comparison chain.
#![no_std]
#![no_main]

use aya_ebpf::{macros::cgroup_device, programs::DeviceContext};
use skiff_common::devices::allowed;

/// cgroup_device verdicts.
const ALLOW: i32 = 1;
const DENY: i32 = 0;

#[cgroup_device]
pub fn skiff_devices(ctx: DeviceContext) -> i32 {
    // SAFETY: `ctx.device` is the `bpf_cgroup_dev_ctx` the kernel passed to this program; the
    // verifier checks that the three 4-byte reads are within it.
    let (access_type, major, minor) = unsafe {
        let d = &*ctx.device;
        (d.access_type, d.major, d.minor)
    };
    if allowed(access_type, major, minor) {
        ALLOW
    } else {
        DENY
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
