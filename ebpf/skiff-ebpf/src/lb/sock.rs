//! The socket load balancer: the eight `cgroup_sock_addr` programs (connect, sendmsg,
//! recvmsg, getpeername for IPv4 and IPv6). One generic body per hook ([`forward`],
//! [`reverse`]) is instantiated per address family through [`Family`], which only says where
//! `bpf_sock_addr` keeps the address. A frontend with `LB_FLAG_LOCAL` is balanced over its
//! in-cluster view (`LB_FAMILY_IN_CLUSTER`) when the agent wrote one: connections made on the
//! node reach every ready backend, not only this node's.

use super::*;

/// Which counter a translation adds to.
#[derive(Clone, Copy)]
enum Kind {
    Connect,
    Send,
}

#[cgroup_sock_addr(connect4)]
pub fn skiff_lb_connect4(ctx: SockAddrContext) -> i32 {
    forward::<V4>(&ctx, Kind::Connect)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn skiff_lb_sendmsg4(ctx: SockAddrContext) -> i32 {
    forward::<V4>(&ctx, Kind::Send)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn skiff_lb_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse::<V4>(&ctx);
    // recvmsg4 programs must return 1.
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn skiff_lb_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse::<V4>(&ctx);
    // getpeername4 programs must return 1.
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn skiff_lb_connect6(ctx: SockAddrContext) -> i32 {
    forward::<V6>(&ctx, Kind::Connect)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn skiff_lb_sendmsg6(ctx: SockAddrContext) -> i32 {
    forward::<V6>(&ctx, Kind::Send)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn skiff_lb_recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse::<V6>(&ctx);
    // recvmsg6 programs must return 1.
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
pub fn skiff_lb_getpeername6(ctx: SockAddrContext) -> i32 {
    reverse::<V6>(&ctx);
    // getpeername6 programs must return 1.
    ALLOW
}

/// An address family of the socket programs: where `bpf_sock_addr` keeps the user address
/// (`user_ip4`, or `user_ip6` as four 32-bit words, both in network order in memory).
trait Family {
    /// `AF_INET` / `AF_INET6`, as stored in the map keys and values.
    const AF: u8;
    /// The user address (destination at connect/sendmsg, peer at recvmsg/getpeername).
    ///
    /// # Safety
    /// `sa` is the context of a program of this family.
    unsafe fn load(sa: *const bpf_sock_addr) -> LbAddr;
    /// Overwrites the user address.
    ///
    /// # Safety
    /// As [`Family::load`], in a hook where the address is writable (all four are).
    unsafe fn store(sa: *mut bpf_sock_addr, addr: &LbAddr);
}

struct V4;
struct V6;

impl Family for V4 {
    const AF: u8 = AF_INET;

    #[inline(always)]
    unsafe fn load(sa: *const bpf_sock_addr) -> LbAddr {
        // SAFETY: per the trait contract; the verifier checks the context access.
        v4_addr(unsafe { (*sa).user_ip4 })
    }

    #[inline(always)]
    unsafe fn store(sa: *mut bpf_sock_addr, addr: &LbAddr) {
        // SAFETY: per the trait contract.
        unsafe { (*sa).user_ip4 = v4_be(addr) };
    }
}

impl Family for V6 {
    const AF: u8 = AF_INET6;

    #[inline(always)]
    unsafe fn load(sa: *const bpf_sock_addr) -> LbAddr {
        // SAFETY: per the trait contract. Four 32-bit loads at constant offsets: the only
        // access the verifier allows for `user_ip6`.
        let w = unsafe {
            [
                (*sa).user_ip6[0].to_ne_bytes(),
                (*sa).user_ip6[1].to_ne_bytes(),
                (*sa).user_ip6[2].to_ne_bytes(),
                (*sa).user_ip6[3].to_ne_bytes(),
            ]
        };
        [
            w[0][0], w[0][1], w[0][2], w[0][3], w[1][0], w[1][1], w[1][2], w[1][3], w[2][0],
            w[2][1], w[2][2], w[2][3], w[3][0], w[3][1], w[3][2], w[3][3],
        ]
    }

    #[inline(always)]
    unsafe fn store(sa: *mut bpf_sock_addr, a: &LbAddr) {
        // SAFETY: per the trait contract; four 32-bit stores at constant offsets.
        unsafe {
            (*sa).user_ip6[0] = u32::from_ne_bytes([a[0], a[1], a[2], a[3]]);
            (*sa).user_ip6[1] = u32::from_ne_bytes([a[4], a[5], a[6], a[7]]);
            (*sa).user_ip6[2] = u32::from_ne_bytes([a[8], a[9], a[10], a[11]]);
            (*sa).user_ip6[3] = u32::from_ne_bytes([a[12], a[13], a[14], a[15]]);
        }
    }
}

/// Frontend → backend for `connect4/6`/`sendmsg4/6`.
#[inline(always)]
fn forward<F: Family>(ctx: &SockAddrContext, kind: Kind) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: `sa` is the `bpf_sock_addr` context the kernel passed to this program of family
    // `F`; these fields are readable in connect and sendmsg programs (the verifier checks
    // each access).
    let (addr, port, proto) = unsafe { (F::load(sa), (*sa).user_port, (*sa).protocol) };
    let key = LbServiceKey {
        addr,
        port: u16::from_be(port as u16),
        proto: proto as u8,
        family: F::AF,
    };
    // SAFETY: only the agent writes LB_SERVICES, replacing whole values (never in place), so
    // the value read here is a consistent snapshot.
    let Some(mut svc) = (unsafe { LB_SERVICES.get(key) }).copied() else {
        return ALLOW;
    };
    // A `Local` frontend: connections made on the node balance over its in-cluster view
    // (every ready backend), when the agent wrote one.
    let mut pick_key = key;
    if svc.flags & LB_FLAG_LOCAL != 0 {
        let view = LbServiceKey {
            family: key.family | LB_FAMILY_IN_CLUSTER,
            ..key
        };
        // SAFETY: as above.
        if let Some(s) = (unsafe { LB_SERVICES.get(view) }).copied() {
            svc = s;
            pick_key = view;
        }
    }
    let Some(picked) = pick(ctx, &pick_key, &svc) else {
        // No backend (none configured, or all vanished under concurrent updates): refuse at
        // once instead of letting the client wait for a virtual IP nobody answers.
        // SAFETY: bpf_set_retval is allowed in connect/sendmsg programs (kernel >= 5.18); a
        // program returning 0 then fails the syscall with this error instead of EPERM.
        unsafe { bpf_set_retval(-ECONNREFUSED) };
        return REJECT;
    };
    let b = picked.backend;
    // SAFETY: as above; the user address and port are writable in connect and sendmsg.
    unsafe {
        F::store(sa, &b.addr);
        (*sa).user_port = u32::from(b.port.to_be());
    }
    remember(ctx, &key, &svc, &b);
    if debug_on() {
        let what = match kind {
            Kind::Connect => "connect",
            Kind::Send => "sendmsg",
        };
        debug!(
            ctx,
            "socket lb {}: {:i}:{} -> backend {:i}:{} (service {}, backend id {})",
            what,
            log_ip(&key.addr, F::AF),
            key.port,
            log_ip(&b.addr, F::AF),
            b.port,
            svc.id,
            picked.id
        );
    }
    if let Some(c) = LB_COUNTERS.get_ptr_mut(picked.id) {
        // SAFETY: a per-CPU map value: this CPU's copy, written by nobody else meanwhile.
        unsafe {
            match kind {
                Kind::Connect => (*c).connects = (*c).connects.wrapping_add(1),
                Kind::Send => (*c).sends = (*c).sends.wrapping_add(1),
            }
        }
    }
    ALLOW
}

/// Chooses a backend: the client's affinity entry if the service has ClientIP affinity and
/// the entry is fresh and still names a backend of this service, else a random slot.
#[inline(always)]
fn pick(ctx: &SockAddrContext, key: &LbServiceKey, svc: &LbService) -> Option<Picked> {
    if svc.count == 0 {
        return None;
    }
    let affinity = svc.flags & LB_FLAG_AFFINITY != 0;
    let mut aff_key = LbAffinityKey::default();
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if affinity {
        // SAFETY: `ctx` is this program's context; bpf_get_netns_cookie accepts it.
        aff_key.netns_cookie = unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) };
        aff_key.service_id = svc.id;
        // SAFETY: LRU value, copied out at once; a concurrent update at worst gives the
        // other CPU's choice, which is as valid.
        if let Some(a) = unsafe { LB_AFFINITY.get(aff_key) }.copied() {
            let timeout_ns = u64::from(svc.affinity_timeout_s) * 1_000_000_000;
            if now.wrapping_sub(a.last_used_ns) <= timeout_ns
                && let Some(b) =
                    backend_of(a.backend_id, svc.id, key.family & !LB_FAMILY_IN_CLUSTER)
            {
                touch(&aff_key, a.backend_id, now);
                return Some(Picked {
                    id: a.backend_id,
                    backend: b,
                });
            }
        }
    }
    let picked = random_backend(key)?;
    if affinity {
        touch(&aff_key, picked.id, now);
    }
    Some(picked)
}

#[inline(always)]
fn touch(key: &LbAffinityKey, backend_id: u32, now: u64) {
    let value = LbAffinity {
        last_used_ns: now,
        backend_id,
        _pad: 0,
    };
    // Best effort: without the entry the next connect picks at random.
    let _ = LB_AFFINITY.insert(key, value, 0);
}

/// Records which frontend this socket asked for when it was sent to `b`.
#[inline(always)]
fn remember(ctx: &SockAddrContext, key: &LbServiceKey, svc: &LbService, b: &LbBackend) {
    // SAFETY: `ctx` is this program's context; bpf_get_socket_cookie accepts it.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    let rev_key = LbRevNatKey {
        cookie,
        addr: b.addr,
        port: b.port,
        family: key.family,
        _pad: [0; 5],
    };
    let value = LbRevNat {
        addr: key.addr,
        port: key.port,
        family: key.family,
        _pad: 0,
        service_id: svc.id,
    };
    // SAFETY: LRU value, compared by copy.
    if unsafe { LB_REVNAT.get(rev_key) }.copied() == Some(value) {
        // Unconnected UDP sends the same datagram route again and again: no rewrite.
        return;
    }
    // Best effort: without the entry getpeername/recvmsg show the backend.
    let _ = LB_REVNAT.insert(rev_key, value, 0);
}

/// Backend → frontend for `recvmsg4/6`/`getpeername4/6`.
#[inline(always)]
fn reverse<F: Family>(ctx: &SockAddrContext) {
    let sa = ctx.sock_addr;
    // SAFETY: readable fields of this program's context (recvmsg/getpeername of family `F`).
    let (addr, port) = unsafe { (F::load(sa), (*sa).user_port) };
    // SAFETY: `ctx` is this program's context; bpf_get_socket_cookie accepts it.
    let cookie = unsafe { bpf_get_socket_cookie(sa.cast()) };
    let key = LbRevNatKey {
        cookie,
        addr,
        port: u16::from_be(port as u16),
        family: F::AF,
        _pad: [0; 5],
    };
    // SAFETY: LRU value, copied out.
    if let Some(v) = unsafe { LB_REVNAT.get(key) }.copied() {
        // SAFETY: the user address and port are writable in recvmsg and getpeername.
        unsafe {
            F::store(sa, &v.addr);
            (*sa).user_port = u32::from(v.port.to_be());
        }
    }
}
