//! Failed authentications are answered slower the more a source address fails: up to
//! [`FREE_PER_SECOND`] failures a second from one address are answered at once, each one
//! beyond that waits one more millisecond than the last (at most [`MAX_DELAY`]) before its
//! 401. A client with one connection that keeps guessing is slowed to a crawl, and a flood
//! of bad credentials from one address no longer takes the CPU from clients that do
//! authenticate. Successful requests are never delayed. (kube-apiserver has no such brake;
//! its API Priority and Fairness plays this role there, and Skiff has no APF.)

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures per address and second answered without delay.
pub const FREE_PER_SECOND: u32 = 20;
/// The longest a failure waits.
pub const MAX_DELAY: Duration = Duration::from_millis(250);
/// Addresses remembered at most (older windows are dropped first).
const MAX_SOURCES: usize = 10_000;
const WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    failures: u32,
}

/// Failures per source address in the current one-second window.
#[derive(Debug, Default)]
pub struct FailureThrottle {
    windows: Mutex<HashMap<IpAddr, Window>>,
}

impl FailureThrottle {
    /// Records a failed authentication from `source`; how long to wait before answering it.
    pub fn failed(&self, source: Option<IpAddr>, now: Instant) -> Duration {
        let Some(ip) = source else {
            return Duration::ZERO;
        };
        let Ok(mut windows) = self.windows.lock() else {
            return Duration::ZERO;
        };
        if windows.len() >= MAX_SOURCES {
            windows.retain(|_, w| now.duration_since(w.start) < WINDOW);
        }
        let w = windows.entry(ip).or_insert(Window {
            start: now,
            failures: 0,
        });
        if now.duration_since(w.start) >= WINDOW {
            *w = Window {
                start: now,
                failures: 0,
            };
        }
        w.failures = w.failures.saturating_add(1);
        let over = w.failures.saturating_sub(FREE_PER_SECOND);
        (Duration::from_millis(1) * over).min(MAX_DELAY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_per_source_and_reset_each_second() {
        let t = FailureThrottle::default();
        let now = Instant::now();
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        let b = Some(IpAddr::from([10, 0, 0, 2]));
        for _ in 0..FREE_PER_SECOND {
            assert_eq!(t.failed(a, now), Duration::ZERO);
        }
        assert_eq!(t.failed(a, now), Duration::from_millis(1));
        assert_eq!(t.failed(a, now), Duration::from_millis(2));
        // Another address is not affected.
        assert_eq!(t.failed(b, now), Duration::ZERO);
        for _ in 0..1000 {
            t.failed(a, now);
        }
        assert_eq!(t.failed(a, now), MAX_DELAY);
        // A new second starts afresh.
        assert_eq!(t.failed(a, now + WINDOW), Duration::ZERO);
        assert_eq!(t.failed(None, now), Duration::ZERO);
    }
}
