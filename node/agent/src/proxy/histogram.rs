//! The programming latency histogram (fixed buckets, microseconds), reported by
//! `GET /bpf/services` as [`LatencyHistogram`] and by `/metrics`.

use std::time::Duration;

use skiff_client::node_api::{HistogramBucket, LatencyHistogram};

/// Latency histogram with fixed buckets (microseconds).
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: [u64; BUCKETS_US.len() + 1],
    count: u64,
    sum_us: u64,
}

/// Upper bounds of the buckets, in microseconds (the last bucket is +Inf).
pub const BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

impl Histogram {
    pub fn observe(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(BUCKETS_US.len());
        self.counts[i] += 1;
        self.count += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    pub fn snapshot(&self) -> LatencyHistogram {
        let mut acc = 0;
        let buckets = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                acc += c;
                HistogramBucket {
                    le: BUCKETS_US.get(i).copied(),
                    count: acc,
                }
            })
            .collect();
        LatencyHistogram {
            count: self.count,
            sum: self.sum_us,
            buckets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(700));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.sum, 60_000_750);
        assert_eq!(
            s.buckets[0],
            HistogramBucket {
                le: Some(100),
                count: 1
            }
        );
        assert_eq!(
            s.buckets[3],
            HistogramBucket {
                le: Some(1000),
                count: 2
            }
        );
        assert_eq!(
            s.buckets.last(),
            Some(&HistogramBucket { le: None, count: 3 })
        );
    }
}
