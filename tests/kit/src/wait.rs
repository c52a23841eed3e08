//! The one bounded wait every test uses: poll a check until it succeeds or a deadline
//! passes, then fail with what was awaited and the last thing seen.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// How long [`eventually`] waits.
pub const WAIT: Duration = Duration::from_secs(20);

/// How often a check is retried.
const POLL: Duration = Duration::from_millis(25);

/// What a check returns: `Some`/`Ok`/`true` is done; `None`/`Err(why)`/`false` means not yet
/// (and `why` is reported if time runs out).
pub trait Attempt {
    type Output;
    fn into_result(self) -> Result<Self::Output, String>;
}

impl<T> Attempt for Option<T> {
    type Output = T;
    fn into_result(self) -> Result<T, String> {
        self.ok_or_else(|| "not yet".to_string())
    }
}

/// A condition: `true` is done.
impl Attempt for bool {
    type Output = ();
    fn into_result(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("still false".to_string())
        }
    }
}

impl<T, E: Display> Attempt for Result<T, E> {
    type Output = T;
    fn into_result(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// Polls `check` until it succeeds, at most [`WAIT`]; panics naming `what` after that.
pub async fn eventually<A, F, Fut>(what: &str, check: F) -> A::Output
where
    A: Attempt,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    eventually_within(what, WAIT, check).await
}

/// [`eventually`] with a bound of `timeout`. Uses tokio's clock, so it also works (and
/// advances) under `start_paused` tests.
pub async fn eventually_within<A, F, Fut>(what: &str, timeout: Duration, mut check: F) -> A::Output
where
    A: Attempt,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match check().await.into_result() {
            Ok(v) => return v,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                panic!("{what}: not within {timeout:?}; last: {last}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// [`eventually_within`] for synchronous tests (blocks the thread between tries).
pub fn eventually_blocking<A: Attempt>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> A,
) -> A::Output {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match check().into_result() {
            Ok(v) => return v,
            Err(last) if std::time::Instant::now() >= deadline => {
                panic!("{what}: not within {timeout:?}; last: {last}")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_success() {
        let mut n = 0;
        let v = eventually_within("n reaches 3", Duration::from_secs(5), || {
            n += 1;
            let v = n;
            async move { (v >= 3).then_some(v) }
        })
        .await;
        assert_eq!(v, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "never: not within 100ms; last: still 0")]
    async fn times_out_with_the_last_reason() {
        eventually_within("never", Duration::from_millis(100), || async {
            Err::<(), _>("still 0")
        })
        .await;
    }

    #[test]
    fn blocking_variant() {
        let mut n = 0;
        let v = eventually_blocking("n reaches 2", Duration::from_secs(5), || {
            n += 1;
            (n >= 2).then_some(n)
        });
        assert_eq!(v, 2);
    }
}
