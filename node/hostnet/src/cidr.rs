//! Parsing and arithmetic of the node's pod CIDR.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use super::NetError;

/// The largest prefix length accepted: a /30 still has one usable pod address once the
/// network address, the reserved first address and the broadcast address are skipped.
pub const MAX_POD_PREFIX_V4: u8 = 30;

/// A validated pod CIDR. IPv4 only today; the public surface speaks [`IpAddr`] so that an IPv6
/// range can be added without changing callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCidr {
    network: Ipv4Addr,
    prefix: u8,
}

impl PodCidr {
    /// Parses `a.b.c.d/len`. The address must be the network address (no host bits set) and
    /// `len` at most [`MAX_POD_PREFIX_V4`].
    pub fn parse(cidr: &str) -> Result<Self, NetError> {
        let invalid = |reason: String| NetError::PodCidrInvalid {
            cidr: cidr.to_string(),
            reason,
        };
        let (addr, prefix) = cidr
            .trim()
            .split_once('/')
            .ok_or_else(|| invalid("expected <address>/<prefix length>".into()))?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| invalid(format!("{addr:?} is not an IP address")))?;
        let IpAddr::V4(network) = addr else {
            return Err(invalid("IPv6 pod CIDRs are not supported yet".into()));
        };
        let prefix: u8 =
            prefix.parse().ok().filter(|p| *p <= 32).ok_or_else(|| {
                invalid(format!("{prefix:?} is not a prefix length from 0 to 32"))
            })?;
        if prefix > MAX_POD_PREFIX_V4 {
            return Err(invalid(format!(
                "prefix length {prefix} leaves no pod address (at most /{MAX_POD_PREFIX_V4})"
            )));
        }
        let canonical = Ipv4Addr::from(u32::from(network) & mask(prefix));
        if canonical != network {
            return Err(invalid(format!(
                "host bits are set (the network address is {canonical}/{prefix})"
            )));
        }
        Ok(Self { network, prefix })
    }

    pub fn network(&self) -> IpAddr {
        IpAddr::V4(self.network)
    }

    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` lies inside this CIDR (including its reserved addresses).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => u32::from(v4) & mask(self.prefix) == u32::from(self.network),
            IpAddr::V6(_) => false,
        }
    }

    /// The address reserved for the node (gateway use later): network + 1. Never handed to pods.
    pub fn reserved_first(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(u32::from(self.network) + 1))
    }

    /// The addresses pods may get, in order: everything except the network address, the first
    /// address and the broadcast address.
    pub(crate) fn pod_range_v4(&self) -> std::ops::RangeInclusive<u32> {
        let first = u32::from(self.network);
        let last = first | !mask(self.prefix);
        // prefix <= 30, so last - first >= 3 and the range below is never empty.
        (first + 2)..=(last - 1)
    }

    /// Number of addresses pods may get.
    pub fn capacity(&self) -> u64 {
        let r = self.pod_range_v4();
        u64::from(*r.end() - *r.start()) + 1
    }
}

impl fmt::Display for PodCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_computes_the_pod_range() {
        let c = PodCidr::parse("10.244.1.0/24").expect("valid");
        assert_eq!(c.to_string(), "10.244.1.0/24");
        assert_eq!(c.capacity(), 253);
        let r = c.pod_range_v4();
        assert_eq!(Ipv4Addr::from(*r.start()), Ipv4Addr::new(10, 244, 1, 2));
        assert_eq!(Ipv4Addr::from(*r.end()), Ipv4Addr::new(10, 244, 1, 254));
        assert!(c.contains("10.244.1.77".parse().expect("ip")));
        assert!(!c.contains("10.244.2.1".parse().expect("ip")));
        assert_eq!(
            c.reserved_first(),
            "10.244.1.1".parse::<IpAddr>().expect("ip")
        );

        let s = PodCidr::parse("192.168.0.4/30").expect("valid");
        assert_eq!(s.capacity(), 1);
        assert_eq!(
            PodCidr::parse("0.0.0.0/0").expect("valid").capacity(),
            (1 << 32) - 3
        );
    }

    #[test]
    fn rejects_bad_cidrs_with_a_reason() {
        for (bad, why) in [
            ("10.244.1.0", "expected"),
            ("10.244.1.0/", "prefix length"),
            ("10.244.1.0/33", "prefix length"),
            ("10.244.1.0/31", "at most /30"),
            ("10.244.1.0/32", "at most /30"),
            ("10.244.1.1/24", "host bits"),
            ("10.244.1/24", "not an IP"),
            ("fd00::/64", "IPv6"),
            ("", "expected"),
        ] {
            match PodCidr::parse(bad) {
                Err(NetError::PodCidrInvalid { cidr, reason }) => {
                    assert_eq!(cidr, bad);
                    assert!(reason.contains(why), "{bad}: {reason}");
                }
                other => panic!("{bad}: expected PodCidrInvalid, got {other:?}"),
            }
        }
    }
}
