//! LoadBalancer address pools (`LoadBalancerIPPool`, `skiff.io/v1`): what the API server's
//! validation and the controller manager's `lbipam` controller both need to agree on, in one
//! place.
//!
//! - A pool block is a CIDR or a `start`-`stop` range of one family ([`block`]). Its
//!   [`Block::full`] range is what may not overlap another pool, the service CIDR or the
//!   cluster CIDR; its [`Block::usable`] range is what is handed out: a CIDR of four
//!   addresses or more loses its first and last address (an IPv4 network's network and
//!   broadcast address, as Cilium's LB-IPAM does by default), a range keeps every address.
//! - A Service is Skiff's to serve ([`is_managed`]) when it is of type LoadBalancer with no
//!   `spec.loadBalancerClass` or with [`CLASS`]. It may ask for addresses
//!   ([`requested`]): the annotation [`REQUEST_ANNOTATION`] (comma-separated, one per
//!   family), else the deprecated `spec.loadBalancerIP`.
//! - A pool serves the Services its `serviceSelector` matches ([`selects`]; empty or absent:
//!   every Service).
//! - The pool status conditions: [`IPS_TOTAL`], [`IPS_AVAILABLE`], [`IPS_USED`] (status
//!   `Unknown`, the count in `message`, as Cilium writes them) and [`POOL_CONFLICT`].

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use skiff_cidr::Cidr;

use crate::api::{Endpoints, LoadBalancerIpPool, LoadBalancerIpPoolBlock, Node, Service};
use crate::selector::Selector;

/// The `spec.loadBalancerClass` of Services the lbipam controller serves (as does none).
pub const CLASS: &str = "skiff.io/lb";
/// The annotation with which a Service asks for its addresses: comma-separated, at most one
/// per IP family (`192.168.100.240` or `192.168.100.240,fd00:100::240`).
pub const REQUEST_ANNOTATION: &str = "skiff.io/lb-ips";
/// Pool condition: how many addresses the pool's blocks hand out.
pub const IPS_TOTAL: &str = "skiff.io/IPsTotal";
/// Pool condition: how many of them no Service holds.
pub const IPS_AVAILABLE: &str = "skiff.io/IPsAvailable";
/// Pool condition: how many of them Services hold.
pub const IPS_USED: &str = "skiff.io/IPsUsed";
/// Pool condition: `True` when a block overlaps an older pool's (the pool hands out nothing).
pub const POOL_CONFLICT: &str = "skiff.io/PoolConflict";

/// An inclusive range of addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddrRange {
    v6: bool,
    first: u128,
    last: u128,
}

fn bits(ip: IpAddr) -> (bool, u128) {
    match ip {
        IpAddr::V4(a) => (false, u128::from(u32::from(a))),
        IpAddr::V6(a) => (true, u128::from(a)),
    }
}

fn addr(v6: bool, n: u128) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(n))
    } else {
        IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX)))
    }
}

impl AddrRange {
    /// `first..=last`; `None` when they are of different families or `first` > `last`.
    pub fn new(first: IpAddr, last: IpAddr) -> Option<Self> {
        let ((v6, a), (v6b, b)) = (bits(first), bits(last));
        (v6 == v6b && a <= b).then_some(AddrRange {
            v6,
            first: a,
            last: b,
        })
    }

    /// Every address of a CIDR.
    pub fn of_cidr(c: &Cidr) -> Self {
        let (v6, first) = bits(c.network());
        let width = if v6 { 128 } else { 32 };
        let host_bits = width - u32::from(c.prefix_len());
        let span = u128::MAX.checked_shr(128 - host_bits).unwrap_or(0);
        AddrRange {
            v6,
            first,
            last: first | span,
        }
    }

    pub fn is_ipv6(&self) -> bool {
        self.v6
    }

    pub fn first(&self) -> IpAddr {
        addr(self.v6, self.first)
    }

    pub fn last(&self) -> IpAddr {
        addr(self.v6, self.last)
    }

    /// How many addresses (saturating at `u128::MAX`).
    pub fn len(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }

    /// Never: a range holds at least one address.
    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let (v6, n) = bits(ip);
        v6 == self.v6 && (self.first..=self.last).contains(&n)
    }

    pub fn overlaps(&self, other: &AddrRange) -> bool {
        self.v6 == other.v6 && self.first <= other.last && other.first <= self.last
    }

    /// The lowest address of the range not in `taken`.
    pub fn first_free(&self, taken: &BTreeSet<IpAddr>) -> Option<IpAddr> {
        let mut n = self.first;
        // Each step skips a taken address, so this ends after at most |taken| + 1 steps.
        loop {
            let ip = addr(self.v6, n);
            if !taken.contains(&ip) {
                return Some(ip);
            }
            if n == self.last {
                return None;
            }
            n += 1;
        }
    }
}

impl fmt::Display for AddrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first(), self.last())
    }
}

/// The family of an address as `spec.ipFamilies` names it.
pub fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv6() { "IPv6" } else { "IPv4" }
}

/// One valid pool block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Every address the block names.
    pub full: AddrRange,
    /// The addresses it hands out.
    pub usable: AddrRange,
}

/// Why a block is invalid: the field (relative to the block: `cidr`, `start`, `stop`, or ""
/// for the block itself), the value and the reason, in Kubernetes' words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockError {
    /// The field must be set.
    Required(&'static str),
    /// The field's value is wrong.
    Invalid {
        field: &'static str,
        value: String,
        reason: String,
    },
}

fn invalid(field: &'static str, value: &str, reason: impl Into<String>) -> BlockError {
    BlockError::Invalid {
        field,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Addresses no LoadBalancer address may be: a node cannot answer ARP or neighbour
/// solicitations for them, and Kubernetes refuses them as endpoints (unspecified, loopback,
/// link-local, multicast, broadcast).
const SPECIAL: &[(&str, &str)] = &[
    ("0.0.0.0/8", "unspecified"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("fe80::/10", "link-local"),
    ("ff00::/8", "multicast"),
];

/// The special range `full` overlaps, if any, as an error reason.
fn special(full: &AddrRange) -> Option<String> {
    SPECIAL.iter().find_map(|(cidr, what)| {
        let c: Cidr = cidr.parse().ok()?;
        full.overlaps(&AddrRange::of_cidr(&c))
            .then(|| format!("must not contain {what} addresses ({cidr})"))
    })
}

/// Reads a block: either `cidr` (canonical, host bits zero), or `start` and `stop` (one
/// family, `start` not after `stop`); no unspecified, loopback, link-local, multicast or
/// broadcast address in it.
pub fn block(b: &LoadBalancerIpPoolBlock) -> Result<Block, BlockError> {
    let ranged = !b.start.is_empty() || !b.stop.is_empty();
    if !b.cidr.is_empty() {
        if ranged {
            return Err(invalid(
                "cidr",
                &b.cidr,
                "must not be set together with start and stop",
            ));
        }
        let c: Cidr = b.cidr.parse().map_err(|e: skiff_cidr::CidrError| {
            invalid(
                "cidr",
                &b.cidr,
                format!("must be a valid CIDR: {}", e.reason),
            )
        })?;
        let full = AddrRange::of_cidr(&c);
        if let Some(why) = special(&full) {
            return Err(invalid("cidr", &b.cidr, why));
        }
        let usable = if full.len() >= 4 {
            AddrRange {
                first: full.first + 1,
                last: full.last - 1,
                ..full
            }
        } else {
            full
        };
        return Ok(Block { full, usable });
    }
    if b.start.is_empty() && b.stop.is_empty() {
        return Err(BlockError::Required("cidr"));
    }
    let parse = |field: &'static str, s: &str| {
        if s.is_empty() {
            return Err(BlockError::Required(field));
        }
        s.parse::<IpAddr>()
            .map_err(|_| invalid(field, s, "must be a valid IP address"))
    };
    let start = parse("start", &b.start)?;
    let stop = parse("stop", &b.stop)?;
    if start.is_ipv6() != stop.is_ipv6() {
        return Err(invalid(
            "stop",
            &b.stop,
            format!(
                "must be of the same IP family as start ({} is {})",
                b.start,
                family(start)
            ),
        ));
    }
    let full = AddrRange::new(start, stop).ok_or_else(|| {
        invalid(
            "stop",
            &b.stop,
            format!("must not be before start ({start})"),
        )
    })?;
    if let Some(why) = special(&full) {
        return Err(invalid("start", &b.start, why));
    }
    Ok(Block { full, usable: full })
}

/// The valid blocks of a pool (invalid ones, which the API server refuses, are left out).
pub fn blocks(pool: &LoadBalancerIpPool) -> Vec<Block> {
    pool.spec
        .iter()
        .flat_map(|s| &s.blocks)
        .filter_map(|b| block(b).ok())
        .collect()
}

/// Whether `pool` serves `svc`: its serviceSelector (empty or absent: every Service)
/// matches the Service's labels. A selector that does not parse matches nothing.
pub fn selects(pool: &LoadBalancerIpPool, svc: &Service) -> bool {
    let Some(sel) = pool.spec.as_ref().and_then(|s| s.service_selector.as_ref()) else {
        return true;
    };
    let labels = svc.metadata.as_ref().map(|m| &m.labels);
    let empty = Default::default();
    Selector::from_label_selector(sel).is_ok_and(|s| s.matches(labels.unwrap_or(&empty)))
}

/// Whether `svc` is a LoadBalancer Service Skiff gives addresses to.
pub fn is_managed(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|s| {
        s.r#type == "LoadBalancer"
            && s.load_balancer_class
                .as_deref()
                .is_none_or(|c| c.is_empty() || c == CLASS)
    })
}

/// Where a Service's request for addresses is written, for field errors.
pub fn request_field(svc: &Service) -> String {
    if request_annotation(svc).is_some() {
        format!("metadata.annotations[{REQUEST_ANNOTATION}]")
    } else {
        "spec.loadBalancerIP".into()
    }
}

fn request_annotation(svc: &Service) -> Option<&str> {
    svc.metadata
        .as_ref()
        .and_then(|m| m.annotations.get(REQUEST_ANNOTATION))
        .map(String::as_str)
        .filter(|v| !v.trim().is_empty())
}

/// The addresses `svc` asks for ([`REQUEST_ANNOTATION`], else `spec.loadBalancerIP`), in
/// order; empty when it asks for none. An entry that is not an address is an error naming
/// it.
pub fn requested(svc: &Service) -> Result<Vec<IpAddr>, String> {
    let text = match request_annotation(svc) {
        Some(t) => t,
        None => svc
            .spec
            .as_ref()
            .map(|s| s.load_balancer_ip.as_str())
            .unwrap_or(""),
    };
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let ip = part
            .parse::<IpAddr>()
            .map_err(|_| format!("{part:?} is not a valid IP address"))?;
        if out.iter().any(|o: &IpAddr| o.is_ipv6() == ip.is_ipv6()) {
            return Err(format!(
                "at most one address per IP family ({part} is a second {} address)",
                family(ip)
            ));
        }
        out.push(ip);
    }
    Ok(out)
}

/// The IP families a Service wants addresses of: its requested addresses' families when it
/// asks for some, else `spec.ipFamilies` (IPv4 when empty).
pub fn wanted_families(svc: &Service) -> Vec<&'static str> {
    if let Ok(req) = requested(svc)
        && !req.is_empty()
    {
        return req.into_iter().map(family).collect();
    }
    let mut out: Vec<&'static str> = svc
        .spec
        .iter()
        .flat_map(|s| &s.ip_families)
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some("IPv4"),
            "IPv6" => Some("IPv6"),
            _ => None,
        })
        .collect();
    out.dedup();
    if out.is_empty() {
        out.push("IPv4");
    }
    out
}

/// The addresses no Service may have, whatever the pools say, with whose they are: every
/// Node's addresses (InternalIP, ExternalIP) and the API servers' (the endpoints of the
/// `default/kubernetes` Service, passed as `api_servers`). A LoadBalancer address is
/// answered for on the nodes' network (ARP) and served on every node: one equal to a node's
/// or an API server's address would take that machine's traffic.
pub fn reserved(
    nodes: &[impl std::ops::Deref<Target = Node>],
    api_servers: Option<&Endpoints>,
) -> std::collections::BTreeMap<IpAddr, String> {
    let mut out = std::collections::BTreeMap::new();
    for node in nodes {
        let name = node.metadata.as_ref().map_or("", |m| m.name.as_str());
        for a in node.status.iter().flat_map(|s| &s.addresses) {
            if matches!(a.r#type.as_str(), "InternalIP" | "ExternalIP")
                && let Ok(ip) = a.address.parse::<IpAddr>()
            {
                out.insert(ip, format!("node {name}'s address ({})", a.r#type));
            }
        }
    }
    for a in api_servers
        .iter()
        .flat_map(|e| &e.subsets)
        .flat_map(|s| &s.addresses)
    {
        if let Ok(ip) = a.ip.parse::<IpAddr>() {
            out.entry(ip)
                .or_insert_with(|| "an API server's address".to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LabelSelector, LoadBalancerIpPoolSpec, ObjectMeta, ServiceSpec};

    #[test]
    fn nodes_and_api_servers_addresses_are_reserved() {
        use crate::api::{EndpointAddress, EndpointSubset, NodeAddress, NodeStatus};
        let node = Node {
            metadata: Some(ObjectMeta {
                name: "node-2".into(),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: vec![
                    NodeAddress {
                        r#type: "InternalIP".into(),
                        address: "192.168.100.2".into(),
                    },
                    NodeAddress {
                        r#type: "Hostname".into(),
                        address: "node-2".into(),
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let api = Endpoints {
            subsets: vec![EndpointSubset {
                addresses: vec![EndpointAddress {
                    ip: "192.168.100.250".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = reserved(&[std::sync::Arc::new(node)], Some(&api));
        assert_eq!(
            r.get(&ip("192.168.100.2")).map(String::as_str),
            Some("node node-2's address (InternalIP)")
        );
        assert_eq!(
            r.get(&ip("192.168.100.250")).map(String::as_str),
            Some("an API server's address")
        );
        assert_eq!(r.len(), 2);
    }

    fn cidr(c: &str) -> LoadBalancerIpPoolBlock {
        LoadBalancerIpPoolBlock {
            cidr: c.into(),
            ..Default::default()
        }
    }

    fn range(a: &str, b: &str) -> LoadBalancerIpPoolBlock {
        LoadBalancerIpPoolBlock {
            start: a.into(),
            stop: b.into(),
            ..Default::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_lose_their_first_and_last_address() {
        let b = block(&cidr("192.168.100.200/29")).unwrap();
        assert_eq!(b.full.to_string(), "192.168.100.200-192.168.100.207");
        assert_eq!(b.usable.to_string(), "192.168.100.201-192.168.100.206");
        assert_eq!(b.usable.len(), 6);
        let b = block(&cidr("192.168.100.240/31")).unwrap();
        assert_eq!(b.usable.len(), 2);
        let b = block(&cidr("192.168.100.240/32")).unwrap();
        assert_eq!(b.usable.first(), ip("192.168.100.240"));
        let b = block(&cidr("fd00:100::/120")).unwrap();
        assert_eq!(b.usable.first(), ip("fd00:100::1"));
        assert_eq!(b.usable.len(), 254);
        let b = block(&cidr("2001:db8::/32")).unwrap();
        assert_eq!(b.full.len(), 1 << 96);
        let b = block(&range("10.1.0.5", "10.1.0.5")).unwrap();
        assert_eq!((b.usable.len(), b.usable.first()), (1, ip("10.1.0.5")));
    }

    #[test]
    fn bad_blocks_name_the_field_and_the_reason() {
        let shown = |b| match block(&b) {
            Err(BlockError::Invalid { field, reason, .. }) => format!("{field}: {reason}"),
            Err(BlockError::Required(f)) => format!("{f}: required"),
            Ok(b) => format!("ok {}", b.full),
        };
        assert_eq!(
            shown(cidr("192.168.100.201/29")),
            "cidr: must be a valid CIDR: host bits are set (the network is 192.168.100.200/29)"
        );
        assert!(shown(cidr("192.168.100.0/33")).starts_with("cidr: must be a valid CIDR"));
        assert_eq!(
            shown(range("10.0.0.9", "10.0.0.1")),
            "stop: must not be before start (10.0.0.9)"
        );
        assert_eq!(
            shown(range("10.0.0.1", "fd00::1")),
            "stop: must be of the same IP family as start (10.0.0.1 is IPv4)"
        );
        assert_eq!(shown(range("10.0.0.1", "")), "stop: required");
        assert_eq!(
            shown(range("10.0.0.x", "10.0.0.2")),
            "start: must be a valid IP address"
        );
        assert_eq!(shown(LoadBalancerIpPoolBlock::default()), "cidr: required");
        assert_eq!(
            shown(cidr("127.0.0.0/30")),
            "cidr: must not contain loopback addresses (127.0.0.0/8)"
        );
        assert_eq!(
            shown(cidr("0.0.0.0/0")),
            "cidr: must not contain unspecified addresses (0.0.0.0/8)"
        );
        assert_eq!(
            shown(range("fe80::1", "fe80::9")),
            "start: must not contain link-local addresses (fe80::/10)"
        );
        assert_eq!(
            shown(range("224.0.0.1", "224.0.0.1")),
            "start: must not contain multicast addresses (224.0.0.0/4)"
        );
        let mut both = cidr("10.0.0.0/24");
        both.start = "10.0.0.1".into();
        assert!(shown(both).starts_with("cidr: must not be set together"));
    }

    #[test]
    fn ranges_overlap_only_within_a_family_and_hand_out_the_lowest_free_address() {
        let a = block(&cidr("10.0.0.0/29")).unwrap().full;
        let b = block(&range("10.0.0.7", "10.0.0.9")).unwrap().full;
        let c = block(&range("10.0.0.8", "10.0.0.9")).unwrap().full;
        let v6 = block(&cidr("2001:db8::/32")).unwrap().full;
        assert!(a.overlaps(&b) && b.overlaps(&a) && !a.overlaps(&c) && !a.overlaps(&v6));
        let taken: BTreeSet<IpAddr> = [ip("10.0.0.7"), ip("10.0.0.8")].into();
        assert_eq!(b.first_free(&taken), Some(ip("10.0.0.9")));
        assert_eq!(c.first_free(&taken), Some(ip("10.0.0.9")));
        let all: BTreeSet<IpAddr> = [ip("10.0.0.8"), ip("10.0.0.9")].into();
        assert_eq!(c.first_free(&all), None);
    }

    fn svc(labels: &[(&str, &str)], annotation: Option<&str>, lb_ip: &str) -> Service {
        Service {
            metadata: Some(ObjectMeta {
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                annotations: annotation
                    .map(|a| (REQUEST_ANNOTATION.to_string(), a.to_string()))
                    .into_iter()
                    .collect(),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                r#type: "LoadBalancer".into(),
                load_balancer_ip: lb_ip.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn requests_selectors_and_classes() {
        let s = svc(&[("app", "web")], Some("10.0.0.5, fd00::5"), "10.0.0.9");
        assert_eq!(requested(&s).unwrap(), [ip("10.0.0.5"), ip("fd00::5")]);
        assert_eq!(wanted_families(&s), ["IPv4", "IPv6"]);
        assert_eq!(request_field(&s), "metadata.annotations[skiff.io/lb-ips]");
        let s = svc(&[], None, "10.0.0.9");
        assert_eq!(requested(&s).unwrap(), [ip("10.0.0.9")]);
        assert_eq!(request_field(&s), "spec.loadBalancerIP");
        assert!(requested(&svc(&[], Some("10.0.0.1,10.0.0.2"), "")).is_err());
        assert!(requested(&svc(&[], Some("nope"), "")).is_err());

        let mut pool = LoadBalancerIpPool::default();
        assert!(selects(&pool, &s));
        pool.spec = Some(LoadBalancerIpPoolSpec {
            service_selector: Some(LabelSelector {
                match_labels: [("app".to_string(), "web".to_string())].into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(!selects(&pool, &s));
        assert!(selects(&pool, &svc(&[("app", "web")], None, "")));

        let mut s = svc(&[], None, "");
        assert!(is_managed(&s));
        if let Some(spec) = s.spec.as_mut() {
            spec.load_balancer_class = Some(CLASS.into());
        }
        assert!(is_managed(&s));
        if let Some(spec) = s.spec.as_mut() {
            spec.load_balancer_class = Some("example.com/other".into());
        }
        assert!(!is_managed(&s));
        if let Some(spec) = s.spec.as_mut() {
            spec.load_balancer_class = None;
            spec.r#type = "NodePort".into();
            spec.ip_families = vec!["IPv6".into()];
        }
        assert!(!is_managed(&s));
        assert_eq!(wanted_families(&s), ["IPv6"]);
    }
}
