//! Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable Software Network
//! Load Balancer", NSDI 2016, section 3.4) for the NodePort tc program's choice of a backend
//! for a new flow: pure, no I/O.
//!
//! Every backend gets a permutation of the table positions `0..m` (`m` prime) from two hashes
//! of its *stable identity* (address family, address, port; never the agent's backend id, so
//! every node computes the same table for the same backends and a flow keeps its backend when
//! it arrives at another node): `offset = h1 % m`, `skip = h2 % (m - 1) + 1`, position `j` of
//! the permutation is `(offset + j * skip) % m`. Backends then take turns (in identity
//! order), each claiming the next still-free position of its permutation, until the table is
//! full. So each backend owns `⌊m/n⌋` or `⌈m/n⌉` entries, and removing one backend moves
//! its entries plus only a few others.
//!
//! The table holds backend ids (the entries of `LB_BACKENDS` of that service); the program
//! picks `table[np_flow_hash(5-tuple) % m]`.

use skiff_common::lb::{LB_MAGLEV_MAX_M, fmix64};

/// Why a table size is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableSizeError {
    #[error("Maglev table size {0} is not a prime")]
    NotPrime(u32),
    #[error("Maglev table size {got} is above the maximum {max}")]
    TooLarge { got: u32, max: u32 },
}

/// Checks a table size: a prime in `2..=LB_MAGLEV_MAX_M`.
pub fn check_table_size(m: u32) -> Result<u32, TableSizeError> {
    if m > LB_MAGLEV_MAX_M {
        return Err(TableSizeError::TooLarge {
            got: m,
            max: LB_MAGLEV_MAX_M,
        });
    }
    if !is_prime(m) {
        return Err(TableSizeError::NotPrime(m));
    }
    Ok(m)
}

fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2u32;
    while u64::from(d) * u64::from(d) <= u64::from(n) {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

/// Two independent 64-bit hashes of `identity` (FNV-1a with two seeds, each finalised).
fn hashes(identity: &[u8]) -> (u64, u64) {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x8422_2325_cbf2_9ce4 ^ 0x5bd1_e995;
    for byte in identity {
        a = (a ^ u64::from(*byte)).wrapping_mul(PRIME);
        b = (b ^ u64::from(*byte)).wrapping_mul(PRIME).rotate_left(29);
    }
    (fmix64(a), fmix64(b ^ 0x9e37_79b9_7f4a_7c15))
}

/// The Maglev lookup table of size `m` for `backends` (`(id, stable identity)`; ids and
/// identities unique), as backend ids. Empty when there are no backends. The result does not
/// depend on the order of `backends`. `m` must be a prime (see [`check_table_size`]).
pub fn table(backends: &[(u32, Vec<u8>)], m: u32) -> Vec<u32> {
    if backends.is_empty() || m == 0 {
        return Vec::new();
    }
    let mut order: Vec<&(u32, Vec<u8>)> = backends.iter().collect();
    order.sort_by(|x, y| x.1.cmp(&y.1).then(x.0.cmp(&y.0)));
    let m64 = u64::from(m);
    let perms: Vec<(u64, u64)> = order
        .iter()
        .map(|(_, identity)| {
            let (h1, h2) = hashes(identity);
            let offset = h1 % m64;
            let skip = if m > 1 { h2 % (m64 - 1) + 1 } else { 1 };
            (offset, skip)
        })
        .collect();
    let mut next = vec![0u64; order.len()];
    let mut entry: Vec<Option<u32>> = vec![None; m as usize];
    let mut filled = 0usize;
    'fill: loop {
        for (i, (offset, skip)) in perms.iter().enumerate() {
            // Each permutation visits every position once (m prime, 0 < skip < m), and at
            // least one position is free, so this ends within m steps.
            let mut c = ((offset + next[i] * skip) % m64) as usize;
            while entry[c].is_some() {
                next[i] += 1;
                c = ((offset + next[i] * skip) % m64) as usize;
            }
            entry[c] = Some(order[i].0);
            next[i] += 1;
            filled += 1;
            if filled == m as usize {
                break 'fill;
            }
        }
    }
    entry.into_iter().map(|e| e.unwrap_or(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_common::lb::LB_MAGLEV_DEFAULT_M;
    use std::collections::BTreeMap;

    fn backends(n: u32) -> Vec<(u32, Vec<u8>)> {
        (1..=n)
            .map(|i| {
                (
                    i,
                    format!("10.244.{}.{}:8080", i / 200, i % 200).into_bytes(),
                )
            })
            .collect()
    }

    fn shares(t: &[u32]) -> BTreeMap<u32, usize> {
        let mut out = BTreeMap::new();
        for id in t {
            *out.entry(*id).or_default() += 1;
        }
        out
    }

    #[test]
    fn sizes_must_be_primes_up_to_the_maximum() {
        assert_eq!(check_table_size(LB_MAGLEV_DEFAULT_M), Ok(1021));
        assert_eq!(check_table_size(LB_MAGLEV_MAX_M), Ok(16381));
        assert_eq!(check_table_size(4093), Ok(4093));
        assert_eq!(check_table_size(1000), Err(TableSizeError::NotPrime(1000)));
        assert_eq!(check_table_size(1), Err(TableSizeError::NotPrime(1)));
        assert!(matches!(
            check_table_size(65537),
            Err(TableSizeError::TooLarge { .. })
        ));
    }

    #[test]
    fn every_backend_gets_its_share() {
        for m in [LB_MAGLEV_DEFAULT_M, 4093, LB_MAGLEV_MAX_M] {
            for n in [1u32, 2, 3, 7, 10, 25] {
                let t = table(&backends(n), m);
                assert_eq!(t.len(), m as usize);
                let s = shares(&t);
                assert_eq!(
                    s.len(),
                    n as usize,
                    "every backend has entries (m {m}, n {n})"
                );
                // Turn by turn: each backend owns ⌊m/n⌋ or ⌈m/n⌉ entries, i.e. 1/n within
                // far less than 1 % for these sizes.
                for (id, c) in &s {
                    let (lo, hi) = (m / n, m.div_ceil(n));
                    assert!(
                        (lo..=hi).contains(&(*c as u32)),
                        "backend {id}: {c} entries of {m}, n {n}"
                    );
                }
            }
        }
    }

    #[test]
    fn order_of_the_input_does_not_matter() {
        let b = backends(9);
        let mut rev = b.clone();
        rev.reverse();
        assert_eq!(table(&b, 1021), table(&rev, 1021));
        assert!(table(&[], 1021).is_empty());
    }

    /// Removing one of n backends moves its entries, and only few of the others: about 1/n
    /// of the table on top (the paper's Figure 10 measures this).
    #[test]
    fn removing_a_backend_disrupts_little() {
        for (m, n) in [
            (LB_MAGLEV_DEFAULT_M, 10u32),
            (4093, 10),
            (LB_MAGLEV_MAX_M, 20),
        ] {
            let all = backends(n);
            let before = table(&all, m);
            for gone in [1, n / 2, n] {
                let rest: Vec<_> = all.iter().filter(|b| b.0 != gone).cloned().collect();
                let after = table(&rest, m);
                let mut own = 0;
                let mut others = 0;
                for (x, y) in before.iter().zip(&after) {
                    if *x == gone {
                        own += 1;
                        assert_ne!(*y, gone);
                    } else if x != y {
                        others += 1;
                    }
                }
                assert!(own >= (m / n) as usize, "{own}");
                // Remapped entries of backends that stayed: at most ~1/n of the table.
                assert!(
                    others <= (m / n) as usize,
                    "m {m}, n {n}, removed {gone}: {others} other entries moved (own {own})"
                );
                // And adding it back restores the original table exactly.
                assert_eq!(table(&all, m), before);
            }
        }
    }

    #[test]
    fn identities_not_ids_decide_the_positions() {
        // Same identities under other ids (another node's numbering): the same table, with
        // ids renamed.
        let b = backends(5);
        let renamed: Vec<_> = b.iter().map(|(id, x)| (id + 100, x.clone())).collect();
        let t1 = table(&b, 1021);
        let t2 = table(&renamed, 1021);
        assert!(t1.iter().zip(&t2).all(|(x, y)| x + 100 == *y));
    }
}
