//! NetworkPolicy enforcement (the `skiff-policy` object: two `cgroup_skb` programs, ingress
//! and egress, on the node's pod cgroup parent): the map layouts shared with the agent
//! (`node/datapath/src/policy.rs`).
//!
//! Peers are *identities*, not addresses: every pod gets the identity of its (namespace,
//! label set), shared by all pods with the same labels in the same namespace (the agent
//! allocates them), and every prefix an `ipBlock` names (its `cidr` and each `except`) gets a
//! CIDR identity. So a pod's rules grow with the number of distinct peers, not of pods:
//!
//! - [`POL_ENDPOINTS_MAP`]: local pod IPv4 address → [`PolEndpoint`] (its endpoint id, which
//!   directions a policy isolates, and the policy to blame for a drop);
//! - [`POL_IPCACHE_MAP`]: every pod address of the cluster (and this node's own addresses,
//!   [`ID_HOST`]) → identity;
//! - [`POL_CIDRS_MAP`] (LPM trie): ipBlock prefixes → CIDR identity; the longest match is the
//!   smallest listed prefix holding the address, which decides `cidr`/`except` exactly
//!   (see the agent's compiler);
//! - [`POL_RULES_MAP`] (LPM trie): [`PolRuleKey`] (endpoint, direction, peer identity,
//!   protocol, destination port) → the index of the allowing policy. Port ranges (`endPort`)
//!   are stored as port prefixes, "every port" as a key ending before the protocol;
//! - [`POL_HOST_PORTS_MAP`]: a port of this node that stands for a Service's pods (the agent's
//!   cluster DNS on `<node IP>:10053` is `kube-dns`'s port 53), so egress rules see the
//!   identity and port the user wrote them for;
//! - [`POL_CT_MAP`] (LRU): every flow a pod was allowed to start or accept ([`PolCtKey`], from
//!   the local pod's side), so replies pass and a policy change does not break established
//!   connections;
//! - [`POL_COUNTERS_MAP`] (per-CPU): packets and bytes by (policy, verdict reason, direction);
//! - [`POL_FLOWS_MAP`] (ring buffer): a [`PolFlowEvent`] for the first packet of every flow a
//!   pod starts or accepts and for every dropped packet, which the agent reads, names (pods,
//!   the Service of a socket-balanced flow, the policy) and serves to `skiff observe`.
//!
//! Addresses are IPv4 in network order (as in the packet); ports in host order. IPv4 only.

/// Directions, as in [`PolRuleKey`] and [`PolCounterKey`].
pub const DIR_INGRESS: u8 = 0;
pub const DIR_EGRESS: u8 = 1;

/// Reserved identities. Label identities start at [`ID_FIRST_LABELS`], CIDR identities at
/// [`ID_FIRST_CIDR`].
pub const ID_UNKNOWN: u32 = 0;
/// This node's own addresses (the kubelet's probes, NodePort traffic SNATed to the node).
pub const ID_HOST: u32 = 1;
/// An address that is no pod of the cluster and no address of this node.
pub const ID_WORLD: u32 = 2;
/// The wildcard of a rule without peers (every source or destination).
pub const ID_ANY: u32 = u32::MAX;
pub const ID_FIRST_LABELS: u32 = 256;
pub const ID_FIRST_CIDR: u32 = 1 << 24;

/// [`PolEndpoint::flags`]: some policy selects the pod for ingress / egress.
pub const EP_INGRESS_ISOLATED: u32 = 1;
pub const EP_EGRESS_ISOLATED: u32 = 2;

/// [`PolCounterKey::reason`]: why a packet was let through or dropped.
pub const REASON_ALLOWED_RULE: u8 = 1;
/// Not isolated in that direction, from the node itself, or to itself.
pub const REASON_ALLOWED_UNISOLATED: u8 = 2;
/// A packet of a flow already allowed (conntrack).
pub const REASON_ALLOWED_ESTABLISHED: u8 = 3;
/// Dropped: isolated and no rule allows it.
pub const REASON_DENIED: u8 = 4;

/// A local pod under policy.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolEndpoint {
    /// The endpoint id of its rules ([`PolRuleKey`]).
    pub id: u32,
    /// [`EP_INGRESS_ISOLATED`] | [`EP_EGRESS_ISOLATED`].
    pub flags: u32,
    /// Index of a policy that isolates it for ingress / egress (blamed for drops).
    pub ingress_policy: u32,
    pub egress_policy: u32,
}

/// Bits of [`PolRuleKey`] up to and including the identity: a rule for every protocol and
/// port.
pub const RULE_PREFIX_ANY_PORT: u32 = 72;
/// Bits up to and including the protocol: every port of one protocol.
pub const RULE_PREFIX_ANY_PORT_OF_PROTO: u32 = 80;
/// Every bit: one port.
pub const RULE_PREFIX_FULL: u32 = 96;

/// The data of a [`POL_RULES_MAP`] key: endpoint id (4 bytes, big-endian), direction (1),
/// peer identity (4, big-endian), protocol (1), destination port (2, big-endian). Big-endian
/// so that the trie's most-significant-bit-first prefixes follow the fields' order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolRuleKey(pub [u8; 12]);

impl PolRuleKey {
    #[inline(always)]
    pub const fn new(endpoint: u32, dir: u8, identity: u32, proto: u8, port: u16) -> Self {
        let e = endpoint.to_be_bytes();
        let i = identity.to_be_bytes();
        let p = port.to_be_bytes();
        PolRuleKey([
            e[0], e[1], e[2], e[3], dir, i[0], i[1], i[2], i[3], proto, p[0], p[1],
        ])
    }

    pub const fn endpoint(&self) -> u32 {
        u32::from_be_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }
    pub const fn dir(&self) -> u8 {
        self.0[4]
    }
    pub const fn identity(&self) -> u32 {
        u32::from_be_bytes([self.0[5], self.0[6], self.0[7], self.0[8]])
    }
    pub const fn proto(&self) -> u8 {
        self.0[9]
    }
    pub const fn port(&self) -> u16 {
        u16::from_be_bytes([self.0[10], self.0[11]])
    }
}

/// A flow from the local pod's side (both directions of a flow share the key).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PolCtKey {
    pub local: u32,
    pub peer: u32,
    pub local_port: u16,
    pub peer_port: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

/// What a conntrack entry remembers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolCtEntry {
    /// The policy that allowed it (0: none was needed).
    pub policy: u32,
    /// Direction of its first packet.
    pub dir: u8,
    pub _pad: [u8; 3],
}

/// A port of this node standing for a Service's pods (see the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PolHostPortKey {
    pub port: u16,
    pub proto: u8,
    pub _pad: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolHostPort {
    pub identity: u32,
    pub port: u16,
    pub _pad: [u8; 2],
}

/// Key of [`POL_COUNTERS_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolCounterKey {
    /// The allowing policy ([`REASON_ALLOWED_RULE`]) or the isolating one
    /// ([`REASON_DENIED`]); 0 otherwise.
    pub policy: u32,
    pub reason: u8,
    pub dir: u8,
    pub _pad: [u8; 2],
}

/// Per-CPU packet and byte counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolCounters {
    pub packets: u64,
    pub bytes: u64,
}

impl PolCounters {
    pub fn sum<'a>(per_cpu: impl IntoIterator<Item = &'a PolCounters>) -> PolCounters {
        per_cpu
            .into_iter()
            .fold(PolCounters::default(), |acc, c| PolCounters {
                packets: acc.packets.wrapping_add(c.packets),
                bytes: acc.bytes.wrapping_add(c.bytes),
            })
    }
}

/// One flow record of [`POL_FLOWS_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolFlowEvent {
    /// `bpf_ktime_get_ns` (monotonic, since boot).
    pub ts_ns: u64,
    /// The socket's cookie (the Service load balancer's reverse translation is keyed by it).
    pub cookie: u64,
    pub local: u32,
    pub peer: u32,
    pub local_port: u16,
    pub peer_port: u16,
    /// As in [`PolCounterKey::policy`].
    pub policy: u32,
    /// Bytes of this packet.
    pub bytes: u32,
    pub proto: u8,
    pub dir: u8,
    pub reason: u8,
    pub _pad: u8,
}

/// Bytes of the flow ring buffer (a power of two, a multiple of the page size).
pub const POL_FLOWS_BYTES: u32 = 1 << 20;

/// Default map sizes.
pub const POL_DEFAULT_MAX_ENDPOINTS: u32 = 4096;
pub const POL_DEFAULT_MAX_IPCACHE: u32 = 65536;
pub const POL_DEFAULT_MAX_CIDRS: u32 = 16384;
pub const POL_DEFAULT_MAX_RULES: u32 = 262144;
pub const POL_DEFAULT_MAX_CT: u32 = 262144;
pub const POL_DEFAULT_MAX_HOST_PORTS: u32 = 64;
pub const POL_DEFAULT_MAX_COUNTERS: u32 = 16384;

/// Map and program names in the `skiff-policy` object.
pub const POL_ENDPOINTS_MAP: &str = "POL_ENDPOINTS";
pub const POL_IPCACHE_MAP: &str = "POL_IPCACHE";
pub const POL_CIDRS_MAP: &str = "POL_CIDRS";
pub const POL_RULES_MAP: &str = "POL_RULES";
pub const POL_HOST_PORTS_MAP: &str = "POL_HOST_PORTS";
pub const POL_CT_MAP: &str = "POL_CT";
pub const POL_COUNTERS_MAP: &str = "POL_COUNTERS";
/// Not pinned: the records are for the agent that reads them.
pub const POL_FLOWS_MAP: &str = "POL_FLOWS";
pub const POL_MAPS: [&str; 7] = [
    POL_ENDPOINTS_MAP,
    POL_IPCACHE_MAP,
    POL_CIDRS_MAP,
    POL_RULES_MAP,
    POL_HOST_PORTS_MAP,
    POL_CT_MAP,
    POL_COUNTERS_MAP,
];
pub const POL_INGRESS_PROG: &str = "skiff_policy_ingress";
pub const POL_EGRESS_PROG: &str = "skiff_policy_egress";

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<PolEndpoint>(), 16);
        assert_eq!(size_of::<PolRuleKey>(), 12);
        assert_eq!(size_of::<PolCtKey>(), 4 + 4 + 2 + 2 + 1 + 3);
        assert_eq!(size_of::<PolCtEntry>(), 8);
        assert_eq!(size_of::<PolHostPortKey>(), 4);
        assert_eq!(size_of::<PolHostPort>(), 8);
        assert_eq!(size_of::<PolCounterKey>(), 8);
        assert_eq!(size_of::<PolCounters>(), 16);
        assert_eq!(size_of::<PolFlowEvent>(), 8 + 8 + 4 + 4 + 2 + 2 + 4 + 4 + 4);
    }

    #[test]
    fn rule_keys_are_big_endian_in_field_order() {
        let k = PolRuleKey::new(0x0102_0304, DIR_EGRESS, 0x0a0b_0c0d, 6, 0x1f90);
        assert_eq!(k.0, [1, 2, 3, 4, 1, 0x0a, 0x0b, 0x0c, 0x0d, 6, 0x1f, 0x90]);
        assert_eq!(
            (k.endpoint(), k.dir(), k.identity(), k.proto(), k.port()),
            (0x0102_0304, DIR_EGRESS, 0x0a0b_0c0d, 6, 0x1f90)
        );
        // The prefix lengths end exactly at the identity and at the protocol.
        assert_eq!(RULE_PREFIX_ANY_PORT, (4 + 1 + 4) * 8);
        assert_eq!(RULE_PREFIX_ANY_PORT_OF_PROTO, (4 + 1 + 4 + 1) * 8);
        assert_eq!(RULE_PREFIX_FULL as usize, size_of::<PolRuleKey>() * 8);
    }
}
