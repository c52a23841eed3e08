//! Socket-level load balancing for Services ("socket LB", as Cilium's kube-proxy replacement):
//! the map layouts shared by the `cgroup_sock_addr` programs of `skiff-lb` and the agent's
//! loader (`node/datapath/src/lb/`).
//!
//! A *frontend* is one ServicePort of a Service: (virtual IP, port, protocol). The agent gives
//! every frontend a service id and every (frontend, backend address) pair a backend id of its
//! own (a backend id belongs to exactly one service), and programs:
//!
//! - [`LB_SERVICES_MAP`]: [`LbServiceKey`] → [`LbService`] (id, number of backend slots in
//!   use, flags, affinity timeout);
//! - [`LB_SLOTS_MAP`]: [`LbSlotKey`] (service id, slot) → backend id, slots `0..count`;
//! - [`LB_BACKENDS_MAP`]: backend id → [`LbBackend`] (address, port, protocol, service id);
//! - [`LB_COUNTERS_MAP`]: backend id → per-CPU [`LbCounters`];
//! - [`LB_REVNAT_MAP`] (LRU): [`LbRevNatKey`] (socket cookie, backend address) →
//!   [`LbRevNat`] (the frontend the socket asked for), for `getpeername` and `recvmsg`;
//! - [`LB_AFFINITY_MAP`] (LRU): [`LbAffinityKey`] (client netns cookie, service id) →
//!   [`LbAffinity`] (backend id, last use) for `sessionAffinity: ClientIP`;
//! - [`NP_CT_MAP`] (LRU): [`NpCtKey`] → [`NpCtEntry`], NodePort connection tracking (the
//!   tc program's translations of packets from outside the node, both directions);
//! - [`LB_MAGLEV_MAP`]: NodePort service id → [`LbMaglev`], the service's Maglev lookup table
//!   (backend ids), which the tc program indexes with [`np_flow_hash`] of a new flow;
//! - [`NP_SNAT_MAP`]: the node address SNATed flows get (one entry).
//!
//! Addresses are 16 bytes ([`LbAddr`]) with a family field, so the same maps hold IPv4 and
//! IPv6 frontends and backends (the IPv6 socket programs use them): an IPv4 address is its
//! four octets in network order followed by twelve zero bytes, an IPv6 address its sixteen.
//! Ports are in host byte order (readable in `bpftool map dump`); the programs convert.
//!
//! Every type is `#[repr(C)]` with explicit padding fields (always zero), so keys hash the same
//! on both sides and the verifier never sees uninitialised stack bytes in a key.

/// A 16-byte address: IPv4 in the first four bytes (network order), the rest zero.
pub type LbAddr = [u8; 16];

/// `AF_INET` / `AF_INET6` as stored in the `family` fields.
pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

/// IP protocol numbers as stored in the `proto` fields.
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_SCTP: u8 = 132;

/// [`LbService::flags`]: `sessionAffinity: ClientIP` (per client network namespace).
pub const LB_FLAG_AFFINITY: u32 = 1;
/// [`LbService::flags`]: a NodePort frontend (node address, nodePort, protocol). Only such
/// frontends are translated by the tc NodePort program for packets arriving from outside;
/// the socket programs translate them too (a pod connecting to `<node IP>:<nodePort>`).
pub const LB_FLAG_NODEPORT: u32 = 2;
/// [`LbService::flags`], with [`LB_FLAG_NODEPORT`]: externalTrafficPolicy `Local`. The
/// frontend's backends are this node's pods only, and the tc program does not SNAT: the
/// backend sees the client's address, and its replies (which come back through its host veth)
/// are translated back to the NodePort frontend.
pub const LB_FLAG_LOCAL: u32 = 4;
/// A bit of [`LbServiceKey::family`]: the in-cluster view of a frontend with
/// [`LB_FLAG_LOCAL`]. Such a frontend keeps only this node's backends for traffic from
/// outside; the socket programs, which only connections made on the node pass, look up the
/// same key with this bit set and, when present, balance over its backends, every ready
/// backend of the cluster (kube-proxy sends traffic from inside the cluster to a `Local`
/// Service's external addresses to every endpoint as well). The tc programs never look it up.
pub const LB_FAMILY_IN_CLUSTER: u8 = 0x80;

/// The [`LbAddr`] of an IPv4 address given as the kernel stores it (`user_ip4`: network byte
/// order in memory).
#[inline(always)]
pub const fn v4_addr(ip_be: u32) -> LbAddr {
    let b = ip_be.to_ne_bytes();
    [b[0], b[1], b[2], b[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
}

/// The IPv4 address in `addr` as the kernel stores it (network byte order in memory).
#[inline(always)]
pub const fn v4_be(addr: &LbAddr) -> u32 {
    u32::from_ne_bytes([addr[0], addr[1], addr[2], addr[3]])
}

/// A frontend: virtual IP, port, protocol.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LbServiceKey {
    pub addr: LbAddr,
    /// Host byte order.
    pub port: u16,
    pub proto: u8,
    pub family: u8,
}

impl LbServiceKey {
    /// The key of an IPv4 frontend (`ip_be` as the kernel stores it, `port` in host order).
    #[inline(always)]
    pub const fn v4(ip_be: u32, port: u16, proto: u8) -> Self {
        LbServiceKey {
            addr: v4_addr(ip_be),
            port,
            proto,
            family: AF_INET,
        }
    }
}

/// What a frontend maps to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbService {
    /// The service id (never 0): key of its slots and affinity entries.
    pub id: u32,
    /// Backend slots in use: `0..count` of [`LbSlotKey::slot`]. 0 = refuse connections.
    pub count: u32,
    /// [`LB_FLAG_AFFINITY`].
    pub flags: u32,
    /// ClientIP affinity timeout in seconds (with [`LB_FLAG_AFFINITY`]).
    pub affinity_timeout_s: u32,
}

/// One backend slot of a service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LbSlotKey {
    pub service_id: u32,
    pub slot: u32,
}

/// A backend of one service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbBackend {
    pub addr: LbAddr,
    /// Host byte order.
    pub port: u16,
    pub proto: u8,
    pub family: u8,
    /// The service this backend belongs to (checked before an affinity entry is honoured).
    pub service_id: u32,
}

/// Per-backend, per-CPU counters of translations.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbCounters {
    /// `connect()` calls sent to this backend (TCP connections, connected UDP sockets).
    pub connects: u64,
    /// Unconnected UDP datagrams (`sendmsg` with an address) sent to this backend.
    pub sends: u64,
}

impl LbCounters {
    /// Sums per-CPU values.
    pub fn sum<'a>(per_cpu: impl IntoIterator<Item = &'a LbCounters>) -> LbCounters {
        per_cpu
            .into_iter()
            .fold(LbCounters::default(), |mut acc, c| {
                acc.connects = acc.connects.wrapping_add(c.connects);
                acc.sends = acc.sends.wrapping_add(c.sends);
                acc
            })
    }
}

/// Reverse translation key: the socket and the backend it was sent to. Keyed by the backend
/// too, so an unconnected UDP socket that talks to several services (or to a service and to
/// other peers) gets each reply's source right.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LbRevNatKey {
    /// `bpf_get_socket_cookie` of the client socket.
    pub cookie: u64,
    pub addr: LbAddr,
    /// Host byte order.
    pub port: u16,
    pub family: u8,
    pub _pad: [u8; 5],
}

/// The frontend a socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbRevNat {
    pub addr: LbAddr,
    /// Host byte order.
    pub port: u16,
    pub family: u8,
    pub _pad: u8,
    pub service_id: u32,
}

/// NodePort connection tracking ([`NP_CT_MAP`], LRU): one entry per direction of a flow.
///
/// - [`NP_CT_FORWARD`]: (client, client port) → (node address, nodePort), as it arrives;
/// - [`NP_CT_REPLY`]: (backend, backend port) → (node address, NAT port), as the reply arrives.
///
/// Addresses as the kernel stores them (network byte order in memory), ports in host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NpCtKey {
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// [`NP_CT_FORWARD`] or [`NP_CT_REPLY`].
    pub dir: u8,
    pub _pad: [u8; 2],
}

/// [`NpCtKey::dir`] of a client → node packet.
pub const NP_CT_FORWARD: u8 = 0;
/// [`NpCtKey::dir`] of a backend → node reply.
pub const NP_CT_REPLY: u8 = 1;

/// What a packet matching an [`NpCtKey`] is rewritten to: its whole 4-tuple. Forward:
/// (node address, backend, NAT port, backend port); reply: (node address, client, nodePort,
/// client port).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NpCtEntry {
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
    /// The backend the flow was sent to (checked on every forward packet: a flow whose
    /// backend was removed is balanced again).
    pub backend_id: u32,
    /// The NodePort service id.
    pub service_id: u32,
}

/// NAT ports tried when the client's own port is taken towards the same backend: random
/// ports in `NP_NAT_PORT_MIN..=NP_NAT_PORT_MAX`, above Linux's default ephemeral range
/// (32768-60999), so the node's own connections do not collide with them.
pub const NP_NAT_PORT_MIN: u16 = 61000;
pub const NP_NAT_PORT_MAX: u16 = 65535;

/// The largest Maglev table size (a prime): a table value always has room for this many
/// entries, of which the first [`LbMaglev::m`] are used. 16381 × 4 bytes ≈ 64 KiB per
/// NodePort service (hash map without preallocation: only programmed services cost memory).
pub const LB_MAGLEV_MAX_M: u32 = 16381;
/// The default Maglev table size (a prime, ≥ 100 × a typical backend count).
pub const LB_MAGLEV_DEFAULT_M: u32 = 1021;

/// One NodePort service's Maglev lookup table ([`LB_MAGLEV_MAP`] value), written whole by the
/// agent (one map update per change of the service's backends: the program sees the old or
/// the new table, never a mix).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LbMaglev {
    /// Entries in use (`table[0..m]`), a prime ≤ [`LB_MAGLEV_MAX_M`]; 0 = no table.
    pub m: u32,
    pub _pad: u32,
    /// Backend ids (of this service, in `LB_BACKENDS`).
    pub table: [u32; LB_MAGLEV_MAX_M as usize],
}

/// The hash of a NodePort flow's 5-tuple (addresses as the kernel stores them, ports in host
/// order) that picks its Maglev table entry: `np_flow_hash(..) % m`. Shared by the tc
/// program and the agent's tests, so both compute the same entry.
#[inline(always)]
pub const fn np_flow_hash(saddr: u32, daddr: u32, sport: u16, dport: u16, proto: u8) -> u32 {
    let a = ((saddr as u64) << 32) | daddr as u64;
    let b = ((sport as u64) << 24) | ((dport as u64) << 8) | proto as u64;
    let h = fmix64(a ^ fmix64(b.wrapping_add(0x9e37_79b9_7f4a_7c15)));
    (h ^ (h >> 32)) as u32
}

/// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
#[inline(always)]
pub const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// ClientIP affinity key: the client's network namespace (`bpf_get_netns_cookie`: every
/// socket of a pod shares it, as they share the pod's IP) and the service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LbAffinityKey {
    pub netns_cookie: u64,
    pub service_id: u32,
    pub _pad: u32,
}

/// The backend a client was last sent to, and when (`bpf_ktime_get_ns`, monotonic).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbAffinity {
    pub last_used_ns: u64,
    pub backend_id: u32,
    pub _pad: u32,
}

/// Default map sizes (the loader resizes them from the agent's flags).
pub const LB_DEFAULT_MAX_SERVICES: u32 = 65536;
pub const LB_DEFAULT_MAX_BACKENDS: u32 = 65536;
pub const LB_DEFAULT_MAX_REVNAT: u32 = 65536;
pub const LB_DEFAULT_MAX_AFFINITY: u32 = 65536;
/// NodePort conntrack entries (two per flow).
pub const LB_DEFAULT_MAX_NP_CT: u32 = 131072;

/// Map names in the `skiff-lb` object (kernel object names are at most 15 characters).
pub const LB_SERVICES_MAP: &str = "LB_SERVICES";
pub const LB_SLOTS_MAP: &str = "LB_SLOTS";
pub const LB_BACKENDS_MAP: &str = "LB_BACKENDS";
pub const LB_COUNTERS_MAP: &str = "LB_COUNTERS";
pub const LB_REVNAT_MAP: &str = "LB_REVNAT";
pub const LB_AFFINITY_MAP: &str = "LB_AFFINITY";
pub const NP_CT_MAP: &str = "NP_CT";
pub const LB_MAGLEV_MAP: &str = "LB_MAGLEV";
/// One `u32` (index 0): the node address the tc program SNATs flows of frontends without
/// externalTrafficPolicy Local to (as the kernel stores it; 0 = the frontend's own address).
/// A NodePort frontend is a node address already; a LoadBalancer address is not the node's,
/// and its backends' replies must come back to this node, not to whichever node announces
/// the address by then.
pub const NP_SNAT_MAP: &str = "NP_SNAT";

/// Every map of the `skiff-lb` object, in the order the loader pins them (then the pod
/// networking fast path's two, see [`crate::podnet`], and the L2 announcements', see
/// [`crate::l2`]).
pub const LB_MAPS: [&str; 12] = [
    LB_SERVICES_MAP,
    LB_SLOTS_MAP,
    LB_BACKENDS_MAP,
    LB_COUNTERS_MAP,
    LB_REVNAT_MAP,
    LB_AFFINITY_MAP,
    NP_CT_MAP,
    LB_MAGLEV_MAP,
    crate::podnet::POD_ENDPOINTS_MAP,
    crate::podnet::FP_COUNTERS_MAP,
    crate::l2::L2_ANNOUNCE_MAP,
    NP_SNAT_MAP,
];

/// The `skiff-lb` global (a `u8`) that switches the programs' aya-log debug records on.
pub const LB_DEBUG_GLOBAL: &str = "DEBUG";

/// Program names in the `skiff-lb` object.
pub const LB_CONNECT4_PROG: &str = "skiff_lb_connect4";
pub const LB_SENDMSG4_PROG: &str = "skiff_lb_sendmsg4";
pub const LB_RECVMSG4_PROG: &str = "skiff_lb_recvmsg4";
pub const LB_GETPEERNAME4_PROG: &str = "skiff_lb_getpeername4";
pub const LB_CONNECT6_PROG: &str = "skiff_lb_connect6";
pub const LB_SENDMSG6_PROG: &str = "skiff_lb_sendmsg6";
pub const LB_RECVMSG6_PROG: &str = "skiff_lb_recvmsg6";
pub const LB_GETPEERNAME6_PROG: &str = "skiff_lb_getpeername6";
/// The tc (TCX ingress) NodePort and pod networking fast path program, on the node's uplink
/// and on every pod host veth.
pub const NP_INGRESS_PROG: &str = "skiff_np_ingress";

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn layouts_have_no_implicit_padding() {
        // Sum of the field sizes == size of the struct: no hidden holes.
        assert_eq!(size_of::<LbServiceKey>(), 16 + 2 + 1 + 1);
        assert_eq!(size_of::<LbService>(), 16);
        assert_eq!(size_of::<LbSlotKey>(), 8);
        assert_eq!(size_of::<LbBackend>(), 16 + 2 + 1 + 1 + 4);
        assert_eq!(size_of::<LbCounters>(), 16);
        assert_eq!(size_of::<LbRevNatKey>(), 8 + 16 + 2 + 1 + 5);
        assert_eq!(size_of::<LbRevNat>(), 16 + 2 + 1 + 1 + 4);
        assert_eq!(size_of::<LbAffinityKey>(), 16);
        assert_eq!(size_of::<LbAffinity>(), 16);
        assert_eq!(size_of::<NpCtKey>(), 4 + 4 + 2 + 2 + 1 + 1 + 2);
        assert_eq!(size_of::<NpCtEntry>(), 4 + 4 + 2 + 2 + 4 + 4);
        assert_eq!(size_of::<LbMaglev>(), 8 + 4 * LB_MAGLEV_MAX_M as usize);
        assert!(align_of::<LbRevNatKey>() <= 8 && align_of::<LbAffinity>() <= 8);
    }

    #[test]
    fn v4_addresses_round_trip_in_network_order() {
        // 10.96.0.10 as the kernel stores it: bytes 10, 96, 0, 10 in memory.
        let ip_be = u32::from_ne_bytes([10, 96, 0, 10]);
        let a = v4_addr(ip_be);
        assert_eq!(&a[..4], &[10, 96, 0, 10]);
        assert!(a[4..].iter().all(|b| *b == 0));
        assert_eq!(v4_be(&a), ip_be);
        let k = LbServiceKey::v4(ip_be, 80, IPPROTO_TCP);
        assert_eq!((k.port, k.proto, k.family), (80, 6, AF_INET));
    }

    #[test]
    fn flow_hash_depends_on_every_field() {
        let base = np_flow_hash(1, 2, 3, 4, IPPROTO_TCP);
        assert_eq!(base, np_flow_hash(1, 2, 3, 4, IPPROTO_TCP));
        for other in [
            np_flow_hash(9, 2, 3, 4, IPPROTO_TCP),
            np_flow_hash(1, 9, 3, 4, IPPROTO_TCP),
            np_flow_hash(1, 2, 9, 4, IPPROTO_TCP),
            np_flow_hash(1, 2, 3, 9, IPPROTO_TCP),
            np_flow_hash(1, 2, 3, 4, IPPROTO_UDP),
        ] {
            assert_ne!(base, other);
        }
        // Consecutive source ports spread over a prime table.
        let m = LB_MAGLEV_DEFAULT_M;
        let mut hit = [0u32; 4];
        for port in 40000..44000u16 {
            hit[(np_flow_hash(1, 2, port, 80, IPPROTO_TCP) % m % 4) as usize] += 1;
        }
        assert!(hit.iter().all(|h| (900..1100).contains(h)), "{hit:?}");
    }

    #[test]
    fn sums_counters() {
        let a = LbCounters {
            connects: 2,
            sends: 1,
        };
        let b = LbCounters {
            connects: 3,
            sends: 0,
        };
        assert_eq!(
            LbCounters::sum([&a, &b]),
            LbCounters {
                connects: 5,
                sends: 1
            }
        );
    }
}
