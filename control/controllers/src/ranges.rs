//! The arithmetic of the allocators ([`crate::serviceip`], [`crate::nodeipam`]): IPv4 CIDRs
//! (parsing, the n-th address, host addresses, fixed-size blocks), port ranges, and
//! [`RangeAllocator`], which hands out the values `0..size` of a range in rolling order.
//!
//! Values are handled as offsets into their range (the n-th host address of a CIDR, the n-th
//! block, the n-th port), so one allocator serves every kind of range. IPv4 only: an IPv6
//! CIDR is rejected with an error that says so.

use std::collections::BTreeSet;
use std::fmt;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::str::FromStr;

pub use skiff_cidr::{CidrError, Ipv4Cidr};

/// Why a CIDR, a block size or a port range is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error(transparent)]
    Cidr(#[from] CidrError),
    #[error("invalid block size /{mask} for {cidr}: {reason}")]
    BlockSize {
        cidr: Ipv4Cidr,
        mask: u8,
        reason: String,
    },
    #[error("invalid port range {value:?}: {reason}")]
    Ports { value: String, reason: String },
}

/// Kubernetes' default service CIDR, 10.96.0.0/16.
pub const DEFAULT_SERVICE_CIDR: Ipv4Cidr = Ipv4Cidr::from_octets([10, 96, 0, 0], 16);
/// The usual cluster (pod) CIDR, 10.244.0.0/16.
pub const DEFAULT_CLUSTER_CIDR: Ipv4Cidr = Ipv4Cidr::from_octets([10, 244, 0, 0], 16);
/// Kubernetes' default node port range, 30000-32767.
pub const DEFAULT_NODE_PORTS: PortRange = PortRange {
    first: 30000,
    last: 32767,
};

/// A CIDR cut into blocks of prefix length `mask` (a cluster CIDR cut into node pod CIDRs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CidrBlocks {
    cidr: Ipv4Cidr,
    mask: u8,
}

impl CidrBlocks {
    /// Blocks of `/mask` in `cidr`; `mask` must be at least `cidr`'s prefix length and at most
    /// 30 (a block needs addresses for pods besides its network and broadcast addresses).
    pub fn new(cidr: Ipv4Cidr, mask: u8) -> Result<Self, RangeError> {
        let reason = if mask < cidr.prefix_len() {
            format!(
                "smaller than the prefix length {} of the CIDR",
                cidr.prefix_len()
            )
        } else if mask > 30 {
            "larger than 30".to_string()
        } else {
            return Ok(CidrBlocks { cidr, mask });
        };
        Err(RangeError::BlockSize { cidr, mask, reason })
    }

    pub fn cidr(&self) -> Ipv4Cidr {
        self.cidr
    }

    pub fn mask(&self) -> u8 {
        self.mask
    }

    /// Number of blocks.
    pub fn count(&self) -> u64 {
        1u64 << (self.mask - self.cidr.prefix_len())
    }

    fn shift(&self) -> u32 {
        32 - u32::from(self.mask)
    }

    /// The `n`-th block.
    pub fn block(&self, n: u64) -> Option<Ipv4Cidr> {
        if n >= self.count() {
            return None;
        }
        let n = u32::try_from(n).ok()?;
        Ipv4Cidr::new(
            Ipv4Addr::from(self.cidr.first_u32() + (n << self.shift())),
            self.mask,
        )
    }

    /// The blocks `other` overlaps (`None` if it lies outside the CIDR): one block for a
    /// CIDR of the block size or smaller, several for a larger one.
    pub fn overlapping(&self, other: Ipv4Cidr) -> Option<RangeInclusive<u64>> {
        let lo = other.first_u32().max(self.cidr.first_u32());
        let hi = other.last_u32().min(self.cidr.last_u32());
        let index = |a: u32| u64::from((a - self.cidr.first_u32()) >> self.shift());
        (lo <= hi).then(|| index(lo)..=index(hi))
    }
}

/// An inclusive range of ports, within 1-65535.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    first: u16,
    last: u16,
}

impl PortRange {
    /// `first..=last`; both within 1-65535, `first` not above `last`.
    pub fn new(first: u16, last: u16) -> Result<Self, RangeError> {
        let err = |reason: &str| RangeError::Ports {
            value: format!("{first}-{last}"),
            reason: reason.to_string(),
        };
        if first == 0 {
            return Err(err("ports must be within 1-65535"));
        }
        if first > last {
            return Err(err("the first port is above the last"));
        }
        Ok(PortRange { first, last })
    }

    pub fn first(&self) -> u16 {
        self.first
    }

    pub fn last(&self) -> u16 {
        self.last
    }

    /// Number of ports.
    pub fn size(&self) -> u64 {
        u64::from(self.last - self.first) + 1
    }

    /// The `n`-th port.
    pub fn nth(&self, n: u64) -> Option<u16> {
        (n < self.size())
            .then(|| u16::try_from(n).ok())
            .flatten()
            .map(|n| self.first + n)
    }

    /// Which port of the range `port` is (`None` outside).
    pub fn offset_of(&self, port: i32) -> Option<u64> {
        let port = u16::try_from(port).ok()?;
        (self.first..=self.last)
            .contains(&port)
            .then(|| u64::from(port - self.first))
    }
}

/// `first-last`, e.g. `30000-32767`.
impl FromStr for PortRange {
    type Err = RangeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| RangeError::Ports {
            value: s.to_string(),
            reason,
        };
        let (a, b) = s
            .trim()
            .split_once('-')
            .ok_or_else(|| err("want first-last, e.g. 30000-32767".into()))?;
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .map_err(|_| err(format!("{p:?} is not a port within 1-65535")))
        };
        PortRange::new(port(a)?, port(b)?).map_err(|e| match e {
            RangeError::Ports { reason, .. } => err(reason),
            other => other,
        })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// The used values of a range `0..size`. New values are handed out in rolling order: the
/// search for a free one starts after the last one handed out and wraps around (as
/// Kubernetes' allocators do), so a value just released is not handed out again at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeAllocator {
    size: u64,
    used: BTreeSet<u64>,
    next: u64,
}

impl RangeAllocator {
    pub fn new(size: u64) -> Self {
        RangeAllocator {
            size,
            used: BTreeSet::new(),
            next: 0,
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn used(&self) -> usize {
        self.used.len()
    }

    pub fn is_used(&self, value: u64) -> bool {
        self.used.contains(&value)
    }

    /// The first free value in `lo..hi`.
    fn first_free(&self, lo: u64, hi: u64) -> Option<u64> {
        let mut candidate = lo;
        for &u in self.used.range(lo..hi) {
            if u != candidate {
                break;
            }
            candidate += 1;
        }
        (candidate < hi).then_some(candidate)
    }

    /// Hands out the next free value, `None` when every value is used.
    pub fn allocate_next(&mut self) -> Option<u64> {
        let value = self
            .first_free(self.next, self.size)
            .or_else(|| self.first_free(0, self.next.min(self.size)))?;
        self.used.insert(value);
        self.next = (value + 1) % self.size;
        Some(value)
    }

    /// Marks `value` used; false if it already was, or is outside the range.
    pub fn reserve(&mut self, value: u64) -> bool {
        value < self.size && self.used.insert(value)
    }

    /// Frees `value`; false if it was not used.
    pub fn release(&mut self, value: u64) -> bool {
        self.used.remove(&value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Ipv4Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn defaults() {
        assert_eq!(DEFAULT_SERVICE_CIDR, cidr("10.96.0.0/16"));
        assert_eq!(DEFAULT_CLUSTER_CIDR, cidr("10.244.0.0/16"));
        assert_eq!(DEFAULT_NODE_PORTS, "30000-32767".parse().unwrap());
    }

    #[test]
    fn blocks() {
        let b = CidrBlocks::new(cidr("10.244.0.0/16"), 24).unwrap();
        assert_eq!(b.count(), 256);
        assert_eq!(b.block(0), Some(cidr("10.244.0.0/24")));
        assert_eq!(b.block(255), Some(cidr("10.244.255.0/24")));
        assert_eq!(b.block(256), None);
        assert_eq!(b.overlapping(cidr("10.244.7.0/24")), Some(7..=7));
        assert_eq!(b.overlapping(cidr("10.244.7.128/25")), Some(7..=7));
        assert_eq!(b.overlapping(cidr("10.244.6.0/23")), Some(6..=7));
        assert_eq!(b.overlapping(cidr("10.0.0.0/8")), Some(0..=255));
        assert_eq!(b.overlapping(cidr("10.245.0.0/24")), None);
        let whole = CidrBlocks::new(cidr("10.0.0.0/24"), 24).unwrap();
        assert_eq!(whole.count(), 1);
        assert_eq!(whole.block(0), Some(cidr("10.0.0.0/24")));
        let err = |c: &str, m: u8| CidrBlocks::new(cidr(c), m).unwrap_err().to_string();
        assert!(err("10.244.0.0/16", 8).contains("smaller than the prefix length 16"));
        assert!(err("10.244.0.0/16", 31).contains("larger than 30"));
    }

    #[test]
    fn port_ranges() {
        let r: PortRange = "30000-32767".parse().unwrap();
        assert_eq!((r.first(), r.last(), r.size()), (30000, 32767, 2768));
        assert_eq!(r.nth(0), Some(30000));
        assert_eq!(r.nth(2767), Some(32767));
        assert_eq!(r.nth(2768), None);
        assert_eq!(r.offset_of(30005), Some(5));
        assert_eq!(r.offset_of(29999), None);
        assert_eq!(r.offset_of(70000), None);
        assert_eq!(r.to_string(), "30000-32767");
        assert_eq!("80-80".parse::<PortRange>().unwrap().size(), 1);
        let err = |s: &str| s.parse::<PortRange>().unwrap_err().to_string();
        assert!(err("32767-30000").contains("the first port is above the last"));
        assert!(err("0-100").contains("within 1-65535"));
        assert!(err("30000-70000").contains("\"70000\" is not a port within 1-65535"));
        assert!(err("30000").contains("want first-last"));
    }

    #[test]
    fn rolling_allocation() {
        let mut a = RangeAllocator::new(4);
        assert!(a.reserve(1));
        assert!(!a.reserve(1), "already used");
        assert!(!a.reserve(4), "outside the range");
        assert_eq!(a.allocate_next(), Some(0));
        // Skips the reserved 1.
        assert_eq!(a.allocate_next(), Some(2));
        assert!(a.release(0));
        // Rolls on past the last one handed out rather than reusing 0 at once.
        assert_eq!(a.allocate_next(), Some(3));
        // Wraps around to the freed value.
        assert_eq!(a.allocate_next(), Some(0));
        assert_eq!(a.allocate_next(), None, "full");
        assert_eq!(a.used(), 4);
        assert!(a.release(2));
        assert!(!a.release(2));
        assert_eq!(a.allocate_next(), Some(2));
        assert!(a.is_used(2));
        assert_eq!(RangeAllocator::new(0).allocate_next(), None);
    }

    #[test]
    fn allocation_in_a_large_sparse_range() {
        let mut a = RangeAllocator::new(1 << 32);
        for v in 0..1000 {
            assert!(a.reserve(v));
        }
        assert_eq!(a.allocate_next(), Some(1000));
        assert!(a.reserve((1 << 32) - 1));
        assert_eq!(a.allocate_next(), Some(1001));
    }
}
