//! Device confinement of pods (the `skiff-devices` object: one `cgroup_device` program the
//! agent attaches to every unprivileged pod's cgroup): the policy, shared with the agent
//! (`node/datapath/src/devices.rs`) so it is unit-tested on the host and the program only
//! calls [`allowed`].
//!
//! The policy is runc's default device allow list (`libcontainer/specconv`'s
//! `AllowedDevices`), which containerd applies to every unprivileged container:
//!
//! - `c *:* m` and `b *:* m`: creating any device node is allowed (runc does so; a node alone
//!   grants nothing, every open of it is checked again);
//! - `rwm` on the character devices null (1:3), zero (1:5), full (1:7), random (1:8),
//!   urandom (1:9), tty (5:0), ptmx (5:2) and every pseudo-terminal (136:*);
//! - everything else is denied: reading or writing any block device (the node's disks,
//!   loop devices) and any other character device (`/dev/mem`, `/dev/kmsg`, `/dev/kvm`,
//!   `/dev/net/tun`, ...). The kernel then fails the `open(2)` with `EPERM`.
//!
//! No map: the list is fixed, and privileged pods simply get no program.

/// The program's name in the object.
pub const DEVICES_PROG: &str = "skiff_devices";

/// `bpf_cgroup_dev_ctx.access_type`: the device type in the low 16 bits, the access (a set of
/// `ACC_*` bits) in the high 16 bits (`include/uapi/linux/bpf.h`).
pub const DEV_BLOCK: u32 = 1;
pub const DEV_CHAR: u32 = 2;
pub const ACC_MKNOD: u32 = 1;
pub const ACC_READ: u32 = 2;
pub const ACC_WRITE: u32 = 4;

/// The character devices containers may read and write: `(major, minor)`, `None` = any minor.
pub const ALLOWED_CHAR_DEVICES: [(u32, Option<u32>); 8] = [
    (1, Some(3)), // null
    (1, Some(5)), // zero
    (1, Some(7)), // full
    (1, Some(8)), // random
    (1, Some(9)), // urandom
    (5, Some(0)), // tty
    (5, Some(2)), // ptmx
    (136, None),  // pts/*
];

/// Whether an access described by a `bpf_cgroup_dev_ctx` (`access_type`, `major`, `minor`) is
/// allowed. Unknown device types and access bits are denied.
#[inline(always)]
pub fn allowed(access_type: u32, major: u32, minor: u32) -> bool {
    let dev_type = access_type & 0xffff;
    let access = access_type >> 16;
    if dev_type != DEV_BLOCK && dev_type != DEV_CHAR {
        return false;
    }
    if access & !(ACC_MKNOD | ACC_READ | ACC_WRITE) != 0 {
        return false;
    }
    // `c *:* m`, `b *:* m`.
    if access == ACC_MKNOD {
        return true;
    }
    if dev_type != DEV_CHAR {
        return false;
    }
    // Written out rather than a loop over the table, so the verifier sees straight code.
    matches!(
        (major, minor),
        (1, 3) | (1, 5) | (1, 7) | (1, 8) | (1, 9) | (5, 0) | (5, 2) | (136, _)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(dev_type: u32, access: u32) -> u32 {
        (access << 16) | dev_type
    }

    #[test]
    fn allows_the_runc_default_character_devices() {
        for (major, minor) in ALLOWED_CHAR_DEVICES {
            let minor = minor.unwrap_or(7);
            for access in [ACC_READ, ACC_WRITE, ACC_READ | ACC_WRITE, ACC_MKNOD] {
                assert!(
                    allowed(ctx(DEV_CHAR, access), major, minor),
                    "{major}:{minor}"
                );
            }
        }
        assert!(allowed(ctx(DEV_CHAR, ACC_READ), 136, 0));
        assert!(allowed(ctx(DEV_CHAR, ACC_WRITE), 136, 4095));
    }

    #[test]
    fn reads_and_writes_exactly_the_listed_character_devices() {
        let listed = |major: u32, minor: u32| {
            ALLOWED_CHAR_DEVICES
                .iter()
                .any(|(ma, mi)| *ma == major && mi.is_none_or(|mi| mi == minor))
        };
        for major in 0..600 {
            for minor in (0..300).chain([4095, 1 << 19]) {
                assert_eq!(
                    allowed(ctx(DEV_CHAR, ACC_READ | ACC_WRITE), major, minor),
                    listed(major, minor),
                    "{major}:{minor}"
                );
            }
        }
    }

    #[test]
    fn denies_reading_and_writing_block_devices() {
        for (major, minor) in [(254, 0), (8, 0), (7, 0), (259, 1), (1, 3)] {
            for access in [
                ACC_READ,
                ACC_WRITE,
                ACC_READ | ACC_WRITE,
                ACC_READ | ACC_MKNOD,
            ] {
                assert!(
                    !allowed(ctx(DEV_BLOCK, access), major, minor),
                    "{major}:{minor}"
                );
            }
        }
    }

    #[test]
    fn denies_other_character_devices() {
        // mem, kmem, port, kmsg, tty1, console, tun, kvm, fuse.
        for (major, minor) in [
            (1, 1),
            (1, 2),
            (1, 4),
            (1, 11),
            (4, 1),
            (5, 1),
            (10, 200),
            (10, 232),
            (10, 229),
        ] {
            for access in [ACC_READ, ACC_WRITE, ACC_READ | ACC_WRITE] {
                assert!(
                    !allowed(ctx(DEV_CHAR, access), major, minor),
                    "{major}:{minor}"
                );
            }
        }
    }

    #[test]
    fn allows_mknod_of_any_device_as_runc_does() {
        assert!(allowed(ctx(DEV_BLOCK, ACC_MKNOD), 254, 0));
        assert!(allowed(ctx(DEV_CHAR, ACC_MKNOD), 1, 1));
    }

    #[test]
    fn denies_unknown_types_and_access_bits() {
        assert!(!allowed(ctx(0, ACC_READ), 1, 3));
        assert!(!allowed(ctx(3, ACC_READ), 1, 3));
        assert!(!allowed(ctx(DEV_CHAR, 8), 1, 3));
        assert!(!allowed(ctx(DEV_CHAR, ACC_READ | 8), 1, 3));
        assert!(!allowed(ctx(DEV_BLOCK, 8), 7, 0));
    }
}
