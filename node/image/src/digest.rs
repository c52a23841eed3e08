//! Content digests (`sha256:<64 hex>`), the only algorithm OCI registries require.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A validated `sha256:` digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest {
    hex: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("digest {0:?} is not sha256:<64 lowercase hex digits>")]
    Malformed(String),
}

impl Digest {
    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        let mut h = Sha256::new();
        h.update(bytes);
        Digest::from_hasher(h)
    }

    pub(crate) fn from_hasher(h: Sha256) -> Digest {
        let sum = h.finalize();
        Digest {
            hex: sum.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
            .ok_or_else(|| DigestError::Malformed(s.to_string()))?;
        Ok(Digest {
            hex: hex.to_string(),
        })
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_compute() {
        let d = Digest::of(b"");
        assert_eq!(
            d.to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        for bad in [
            "sha256:abc",
            "md5:00",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:../../etc/passwd",
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad}");
        }
    }
}
