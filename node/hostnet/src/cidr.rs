//! Parsing and arithmetic of the node's pod CIDR.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use skiff_cidr::{CidrError, Ipv4Cidr};

use super::NetError;

/// The largest prefix length accepted: a /30 still has one usable pod address once the
/// network address, the reserved first address and the broadcast address are skipped.
pub const MAX_POD_PREFIX_V4: u8 = 30;

/// A validated pod CIDR: a canonical IPv4 CIDR (the shared [`skiff_cidr`] rules, the same the
/// API server validates `spec.podCIDR` with) with at least one pod address. IPv4 only today;
/// the public surface speaks [`IpAddr`] so that an IPv6 range can be added without changing
/// callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCidr(Ipv4Cidr);

impl PodCidr {
    /// Parses `a.b.c.d/len`. The address must be the network address (no host bits set) and
    /// `len` at most [`MAX_POD_PREFIX_V4`].
    pub fn parse(cidr: &str) -> Result<Self, NetError> {
        let invalid = |reason: String| NetError::PodCidrInvalid {
            cidr: cidr.to_string(),
            reason,
        };
        let c: Ipv4Cidr = cidr.parse().map_err(|e: CidrError| {
            invalid(if e.reason.contains("IPv6") {
                "IPv6 pod CIDRs are not supported yet".into()
            } else {
                e.reason
            })
        })?;
        if c.prefix_len() > MAX_POD_PREFIX_V4 {
            return Err(invalid(format!(
                "prefix length {} leaves no pod address (at most /{MAX_POD_PREFIX_V4})",
                c.prefix_len()
            )));
        }
        Ok(Self(c))
    }

    pub fn network(&self) -> IpAddr {
        IpAddr::V4(self.0.network())
    }

    pub fn prefix_len(&self) -> u8 {
        self.0.prefix_len()
    }

    /// Whether `ip` lies inside this CIDR (including its reserved addresses).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => self.0.contains(v4),
            IpAddr::V6(_) => false,
        }
    }

    /// The address reserved for the node (gateway use later): network + 1. Never handed to pods.
    pub fn reserved_first(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(self.0.first_u32() + 1))
    }

    /// The addresses pods may get, in order: everything except the network address, the first
    /// address and the broadcast address.
    pub(crate) fn pod_range_v4(&self) -> std::ops::RangeInclusive<u32> {
        // prefix <= 30, so last - first >= 3 and the range below is never empty.
        (self.0.first_u32() + 2)..=(self.0.last_u32() - 1)
    }

    /// Number of addresses pods may get.
    pub fn capacity(&self) -> u64 {
        let r = self.pod_range_v4();
        u64::from(*r.end() - *r.start()) + 1
    }
}

impl fmt::Display for PodCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
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
