//! IP networks written as CIDRs (`10.244.1.0/24`, `fd00::/64`): the one place Skiff parses
//! and computes them. The API server validates `Node.spec.podCIDR(s)` with [`Cidr`], the
//! controller manager's allocators cut and hand out [`Ipv4Cidr`] ranges, and the node agent's
//! IPAM allocates pod addresses from its [`Ipv4Cidr`], so all three agree on what a valid
//! CIDR is.
//!
//! The rule: `<address>/<prefix length>` with the host bits of the address zero (the
//! canonical form). `10.244.1.5/24` is refused with a message naming `10.244.1.0/24`: a
//! non-canonical CIDR is almost always a typo, and accepting it in one component while
//! another refuses it is how a node ends up with a pod CIDR its agent cannot use. (Kubernetes
//! 1.32 accepted it silently; its newer strict IP/CIDR validation refuses it, as here.)
//! The one exception is [`Cidr::parse_lenient`], for fields where Kubernetes 1.32 accepts
//! any CIDR its sloppy parser reads (NetworkPolicy `ipBlock`s), so Skiff accepts the same
//! objects; it still gives the canonical network.
//!
//! [`Cidr`] holds either family, [`Ipv4Cidr`] adds the n-th address and host addresses;
//! `strictly_contains` is NetworkPolicy's `except` ⊂ `cidr` rule. The crate depends on nothing
//! but std and thiserror.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Why a text is not a usable CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {value:?}: {reason}")]
pub struct CidrError {
    /// The text as given.
    pub value: String,
    /// What is wrong, e.g. `host bits are set (the network is 10.244.1.0/24)`.
    pub reason: String,
}

impl CidrError {
    fn new(value: &str, reason: impl Into<String>) -> Self {
        CidrError {
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// An IPv4 or IPv6 network in canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cidr {
    V4(Ipv4Cidr),
    V6 { network: Ipv6Addr, prefix: u8 },
}

impl Cidr {
    pub fn network(&self) -> IpAddr {
        match self {
            Cidr::V4(c) => IpAddr::V4(c.network()),
            Cidr::V6 { network, .. } => IpAddr::V6(*network),
        }
    }

    pub fn prefix_len(&self) -> u8 {
        match self {
            Cidr::V4(c) => c.prefix_len(),
            Cidr::V6 { prefix, .. } => *prefix,
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self, ip) {
            (Cidr::V4(c), IpAddr::V4(ip)) => c.contains(ip),
            (Cidr::V6 { network, prefix }, IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(*prefix) == u128::from(*network)
            }
            _ => false,
        }
    }

    /// Whether `inner` is a proper part of this network: of the same family, inside it, and
    /// smaller (a longer prefix). A network is not a strict subset of itself.
    pub fn strictly_contains(&self, inner: &Cidr) -> bool {
        self.contains(inner.network()) && self.prefix_len() < inner.prefix_len()
    }

    /// Reads a CIDR the way Kubernetes reads its legacy fields (`netutils.ParseCIDRSloppy`,
    /// which kube-apiserver 1.32 validates NetworkPolicy `ipBlock`s with), and gives the
    /// network it names. Unlike [`FromStr`], the host bits may be set (`10.0.0.1/24` is
    /// the network `10.0.0.0/24`) and IPv4 numbers may have leading zeros, read as decimal
    /// (`010.0.0.0/8` is `10.0.0.0/8`), as may the prefix length. Objects Kubernetes accepts
    /// must be accepted here too, or they could not be moved to Skiff or read back; the
    /// canonical network is what consumers should use.
    ///
    /// Not like Go: an IPv4 address embedded in an IPv6 one must not have leading zeros,
    /// and an IPv4-mapped IPv6 network stays IPv6 (Go compares it as IPv4).
    pub fn parse_lenient(s: &str) -> Result<Cidr, CidrError> {
        let (ip, bits) = s.split_once('/').ok_or_else(|| {
            CidrError::new(s, "expected <address>/<prefix length>, e.g. 10.96.0.0/16")
        })?;
        let addr = match lenient_ipv4(ip) {
            Some(a) => IpAddr::V4(a),
            None => ip
                .parse::<Ipv6Addr>()
                .map(IpAddr::V6)
                .map_err(|_| CidrError::new(s, format!("{ip:?} is not an IP address")))?,
        };
        let max: u8 = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = decimal(bits)
            .and_then(|b| u8::try_from(b).ok())
            .filter(|b| *b <= max)
            .ok_or_else(|| {
                CidrError::new(s, format!("prefix length {bits:?} is not in 0-{max}"))
            })?;
        Ok(match addr {
            IpAddr::V4(a) => Cidr::V4(
                Ipv4Cidr::new(a, prefix)
                    .ok_or_else(|| CidrError::new(s, "prefix length above 32"))?,
            ),
            IpAddr::V6(a) => Cidr::V6 {
                network: Ipv6Addr::from(u128::from(a) & mask128(prefix)),
                prefix,
            },
        })
    }
}

/// A text of decimal digits only (at least one, leading zeros allowed) as a number; `None`
/// for anything else or a number too large to be an octet or a prefix length anyway.
fn decimal(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.bytes().try_fold(0u32, |n, b| {
        let n = n * 10 + u32::from(b - b'0');
        (n <= 0xFFFF).then_some(n)
    })
}

/// Four dot-separated decimal numbers of 0-255, leading zeros allowed (read as decimal, as
/// Go's parser before 1.17 and Kubernetes' `ParseIPSloppy` do).
fn lenient_ipv4(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        *o = u8::try_from(decimal(parts.next()?)?).ok()?;
    }
    parts.next().is_none().then(|| Ipv4Addr::from(octets))
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, bits) = split(s)?;
        match addr {
            IpAddr::V4(a) => {
                let prefix = prefix_of(s, bits, 32)?;
                Ipv4Cidr::canonical(s, a, prefix).map(Cidr::V4)
            }
            IpAddr::V6(a) => {
                let prefix = prefix_of(s, bits, 128)?;
                let network = Ipv6Addr::from(u128::from(a) & mask128(prefix));
                if network != a {
                    return Err(CidrError::new(
                        s,
                        format!("host bits are set (the network is {network}/{prefix})"),
                    ));
                }
                Ok(Cidr::V6 { network, prefix })
            }
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cidr::V4(c) => c.fmt(f),
            Cidr::V6 { network, prefix } => write!(f, "{network}/{prefix}"),
        }
    }
}

/// An IPv4 network: an address whose host bits are zero, and a prefix length (0..=32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Cidr {
    network: u32,
    prefix: u8,
}

fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

/// `<address>/<prefix>` split and the address parsed.
fn split(s: &str) -> Result<(IpAddr, &str), CidrError> {
    let (ip, bits) = s.trim().split_once('/').ok_or_else(|| {
        CidrError::new(s, "expected <address>/<prefix length>, e.g. 10.96.0.0/16")
    })?;
    let addr = ip
        .parse::<IpAddr>()
        .map_err(|_| CidrError::new(s, format!("{ip:?} is not an IP address")))?;
    Ok((addr, bits))
}

fn prefix_of(s: &str, bits: &str, max: u8) -> Result<u8, CidrError> {
    bits.parse::<u8>()
        .ok()
        .filter(|b| *b <= max)
        .ok_or_else(|| CidrError::new(s, format!("prefix length {bits:?} is not in 0-{max}")))
}

impl Ipv4Cidr {
    /// `a.b.c.d/prefix` for constants; the address must already be the network address.
    pub const fn from_octets(octets: [u8; 4], prefix: u8) -> Self {
        Ipv4Cidr {
            network: u32::from_be_bytes(octets),
            prefix,
        }
    }

    /// The network of `addr`/`prefix` (host bits cleared); `None` if `prefix` > 32.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Option<Self> {
        (prefix <= 32).then(|| Ipv4Cidr {
            network: u32::from(addr) & mask(prefix),
            prefix,
        })
    }

    fn canonical(s: &str, addr: Ipv4Addr, prefix: u8) -> Result<Self, CidrError> {
        let cidr = Ipv4Cidr::new(addr, prefix)
            .ok_or_else(|| CidrError::new(s, "prefix length above 32"))?;
        if cidr.network() != addr {
            return Err(CidrError::new(
                s,
                format!("host bits are set (the network is {cidr})"),
            ));
        }
        Ok(cidr)
    }

    pub fn network(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.network)
    }

    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Number of addresses, network and broadcast included.
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.prefix))
    }

    /// The network address as a number.
    pub fn first_u32(&self) -> u32 {
        self.network
    }

    /// The last (broadcast) address as a number.
    pub fn last_u32(&self) -> u32 {
        self.network | !mask(self.prefix)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.prefix) == self.network
    }

    /// The `n`-th address (0 is the network address).
    pub fn nth(&self, n: u64) -> Option<Ipv4Addr> {
        (n < self.size())
            .then(|| u32::try_from(n).ok())
            .flatten()
            .map(|n| Ipv4Addr::from(self.network + n))
    }

    /// Which address of the network `ip` is (`None` if outside).
    pub fn offset_of(&self, ip: Ipv4Addr) -> Option<u64> {
        self.contains(ip)
            .then(|| u64::from(u32::from(ip) - self.network))
    }

    /// Number of host addresses: every address but the network and broadcast ones (0 for
    /// /31 and /32).
    pub fn hosts(&self) -> u64 {
        self.size().saturating_sub(2)
    }

    /// The `n`-th host address (0 is the first after the network address).
    pub fn host(&self, n: u64) -> Option<Ipv4Addr> {
        (n < self.hosts()).then(|| self.nth(n + 1)).flatten()
    }

    /// Which host address `ip` is (`None` outside the network, or for the network and
    /// broadcast addresses).
    pub fn host_index(&self, ip: Ipv4Addr) -> Option<u64> {
        let off = self.offset_of(ip)?;
        (off >= 1 && off <= self.hosts()).then(|| off - 1)
    }
}

/// Strict: host bits must be zero (`10.96.0.1/16` is an error naming `10.96.0.0/16`), and
/// only IPv4.
impl FromStr for Ipv4Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.parse::<Cidr>() {
            Ok(Cidr::V4(c)) => Ok(c),
            Ok(Cidr::V6 { .. }) => Err(CidrError::new(s, "IPv6 is not supported here, only IPv4")),
            // An IPv6 text with another problem still gets told that it is IPv6.
            Err(e) if split(s).is_ok_and(|(a, _)| a.is_ipv6()) => Err(CidrError::new(
                s,
                format!("{}; IPv6 is not supported here, only IPv4", e.reason),
            )),
            Err(e) => Err(e),
        }
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Ipv4Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_strictly_with_a_reason() {
        let c = cidr("10.96.0.0/16");
        assert_eq!(c.network(), Ipv4Addr::new(10, 96, 0, 0));
        assert_eq!(c.prefix_len(), 16);
        assert_eq!(c.size(), 65536);
        assert_eq!(c.to_string(), "10.96.0.0/16");
        assert_eq!(cidr("0.0.0.0/0").size(), 1 << 32);
        assert_eq!(cidr("10.0.0.7/32").size(), 1);
        assert_eq!(Ipv4Cidr::from_octets([10, 96, 0, 0], 16), c);
        let err = |s: &str| s.parse::<Ipv4Cidr>().unwrap_err().to_string();
        assert!(err("10.96.0.1/16").contains("host bits are set (the network is 10.96.0.0/16)"));
        assert!(err("fd00::/64").contains("IPv6 is not supported"));
        assert!(err("fd00::1/64").contains("IPv6 is not supported"));
        assert!(err("10.96.0.0/33").contains("prefix length \"33\" is not in 0-32"));
        assert!(err("10.96.0.0").contains("expected <address>/<prefix length>"));
        assert!(err("10.960.0.0/16").contains("is not an IP address"));
        assert!(err("").contains("expected"));
        assert!(err("10.96.0.0/").contains("prefix length"));
        assert_eq!(
            "10.96.0.1/16".parse::<Ipv4Cidr>().unwrap_err().value,
            "10.96.0.1/16"
        );
    }

    #[test]
    fn both_families_in_canonical_form() {
        let v6: Cidr = "fd00:10::/64".parse().unwrap();
        assert_eq!(v6.to_string(), "fd00:10::/64");
        assert_eq!(v6.prefix_len(), 64);
        assert!(v6.contains("fd00:10::5".parse().unwrap()));
        assert!(!v6.contains("fd00:11::5".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        let e = "fd00:10::1/64".parse::<Cidr>().unwrap_err();
        assert!(
            e.reason
                .contains("host bits are set (the network is fd00:10::/64)"),
            "{e}"
        );
        assert!(
            "fd00::/129"
                .parse::<Cidr>()
                .unwrap_err()
                .reason
                .contains("0-128")
        );
        let v4: Cidr = "10.244.1.0/24".parse().unwrap();
        assert_eq!(v4.network(), "10.244.1.0".parse::<IpAddr>().unwrap());
        assert!(v4.contains("10.244.1.9".parse().unwrap()));
        assert!(
            "10.244.1.5/24"
                .parse::<Cidr>()
                .unwrap_err()
                .reason
                .contains("10.244.1.0/24")
        );
    }

    #[test]
    fn lenient_as_kubernetes_legacy_fields() {
        let l = |s: &str| Cidr::parse_lenient(s).map(|c| c.to_string());
        assert_eq!(l("10.0.0.0/24").unwrap(), "10.0.0.0/24");
        assert_eq!(l("10.0.0.1/24").unwrap(), "10.0.0.0/24");
        assert_eq!(l("010.000.001.002/08").unwrap(), "10.0.0.0/8");
        assert_eq!(l("0.0.0.0/0").unwrap(), "0.0.0.0/0");
        assert_eq!(l("fd00::1/64").unwrap(), "fd00::/64");
        assert_eq!(l("::ffff:10.0.0.1/128").unwrap(), "::ffff:10.0.0.1/128");
        for bad in [
            "",
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/+8",
            "10.0.0.0/8/9",
            " 10.0.0.0/8",
            "10.0.0.256/8",
            "10.0.0/8",
            "10.0.0.0.0/8",
            "10..0.0/8",
            "fd00::/129",
            "fd00::g/64",
            "10.0.0.0/99999999999",
        ] {
            assert!(l(bad).is_err(), "{bad}");
        }
        assert!(
            Cidr::parse_lenient("10.0.0.0/33")
                .unwrap_err()
                .reason
                .contains("0-32")
        );
    }

    #[test]
    fn strict_subsets() {
        let c = |s: &str| s.parse::<Cidr>().unwrap();
        assert!(c("10.0.0.0/8").strictly_contains(&c("10.1.0.0/16")));
        assert!(c("10.0.0.0/8").strictly_contains(&c("10.255.255.255/32")));
        assert!(!c("10.0.0.0/8").strictly_contains(&c("10.0.0.0/8")));
        assert!(!c("10.0.0.0/16").strictly_contains(&c("10.0.0.0/8")));
        assert!(!c("10.0.0.0/8").strictly_contains(&c("11.0.0.0/16")));
        assert!(!c("10.0.0.0/8").strictly_contains(&c("fd00::/64")));
        assert!(c("fd00::/48").strictly_contains(&c("fd00:0:0:1::/64")));
        assert!(c("0.0.0.0/0").strictly_contains(&c("192.168.0.0/16")));
    }

    #[test]
    fn addresses_and_hosts() {
        let c = cidr("10.96.0.0/29");
        assert_eq!(c.nth(0), Some(Ipv4Addr::new(10, 96, 0, 0)));
        assert_eq!(c.nth(7), Some(Ipv4Addr::new(10, 96, 0, 7)));
        assert_eq!(c.nth(8), None);
        assert_eq!(c.offset_of(Ipv4Addr::new(10, 96, 0, 5)), Some(5));
        assert_eq!(c.offset_of(Ipv4Addr::new(10, 96, 0, 8)), None);
        assert_eq!(c.hosts(), 6);
        assert_eq!(c.host(0), Some(Ipv4Addr::new(10, 96, 0, 1)));
        assert_eq!(c.host(5), Some(Ipv4Addr::new(10, 96, 0, 6)));
        assert_eq!(c.host(6), None);
        assert_eq!(c.host_index(Ipv4Addr::new(10, 96, 0, 0)), None);
        assert_eq!(c.host_index(Ipv4Addr::new(10, 96, 0, 7)), None);
        assert_eq!(c.host_index(Ipv4Addr::new(10, 96, 0, 6)), Some(5));
        assert_eq!(c.host_index(Ipv4Addr::new(10, 97, 0, 6)), None);
        assert_eq!(cidr("10.0.0.0/31").hosts(), 0);
        assert_eq!(cidr("10.0.0.0/32").host(0), None);
        let all = cidr("0.0.0.0/0");
        assert_eq!(all.nth((1 << 32) - 1), Some(Ipv4Addr::BROADCAST));
        assert_eq!(
            all.host_index(Ipv4Addr::new(255, 255, 255, 254)),
            Some((1 << 32) - 3)
        );
        assert_eq!(c.first_u32(), u32::from(Ipv4Addr::new(10, 96, 0, 0)));
        assert_eq!(c.last_u32(), u32::from(Ipv4Addr::new(10, 96, 0, 7)));
    }
}
