//! Percentiles of latency samples.

use std::time::Duration;

use serde::Serialize;

/// Order statistics of one series, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// `None` for an empty series.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        if ms.is_empty() {
            return None;
        }
        ms.sort_by(f64::total_cmp);
        Some(Summary {
            n: ms.len(),
            p50: percentile(&ms, 50.0),
            p90: percentile(&ms, 90.0),
            p99: percentile(&ms, 99.0),
            max: ms[ms.len() - 1],
            mean: ms.iter().sum::<f64>() / ms.len() as f64,
        })
    }
}

/// Nearest-rank percentile of an ascending, non-empty slice: the smallest sample such that
/// at least `p` % of the samples are less than or equal to it. With 50 samples p99 is the
/// maximum.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    assert!(!sorted.is_empty(), "percentile of an empty series");
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median item by `key` (the lower one of the middle two for an even count), e.g. the
/// median run of a repeated measurement by its throughput; `None` when `items` is empty.
pub fn median_by<T>(items: &[T], key: impl Fn(&T) -> f64) -> Option<&T> {
    let mut sorted: Vec<&T> = items.iter().collect();
    sorted.sort_by(|a, b| key(a).total_cmp(&key(b)));
    sorted.get(sorted.len().saturating_sub(1) / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&s, 50.0), 50.0);
        assert_eq!(percentile(&s, 90.0), 90.0);
        assert_eq!(percentile(&s, 99.0), 99.0);
        assert_eq!(percentile(&s, 100.0), 100.0);
        assert_eq!(percentile(&s, 0.0), 1.0);
        let fifty: Vec<f64> = (1..=50).map(f64::from).collect();
        assert_eq!(percentile(&fifty, 50.0), 25.0);
        assert_eq!(percentile(&fifty, 99.0), 50.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn summary_sorts_and_converts() {
        let s = Summary::of(&ms(&[30, 10, 20])).unwrap();
        assert_eq!(s.n, 3);
        assert_eq!(s.p50, 20.0);
        assert_eq!(s.p99, 30.0);
        assert_eq!(s.max, 30.0);
        assert_eq!(s.mean, 20.0);
        assert!(Summary::of(&[]).is_none());
    }
}
