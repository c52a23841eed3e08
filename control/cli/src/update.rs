//! Read-modify-write of one object: every write is a compare-and-swap on the
//! resourceVersion read, retried from a fresh read when someone else wrote in between.

use std::future::Future;
use std::time::Duration;

use anyhow::{Result, anyhow};
use skiff_client::ClientError;

/// Attempts (each a fresh read, change and write) before giving up on an object that keeps
/// changing.
pub const CONFLICT_ATTEMPTS: u32 = 10;

fn is_conflict(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<ClientError>()
            .is_some_and(|ce| ce.is_conflict())
    })
}

/// Runs `attempt` (get, change, update with the resourceVersion that was read) until it does
/// not fail with a Conflict, at most [`CONFLICT_ATTEMPTS`] times, with a short growing pause
/// between tries. Other errors end it at once; `attempt` checks its own preconditions on
/// every fresh read, so a precondition that stopped holding fails instead of being retried.
pub async fn retry_on_conflict<T, F, Fut>(what: &str, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut last = None;
    for i in 0..CONFLICT_ATTEMPTS {
        match attempt().await {
            Err(e) if is_conflict(&e) => {
                tracing::debug!(what, attempt = i, "conflict; reading again");
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(10 * u64::from(i + 1))).await;
            }
            other => return other,
        }
    }
    Err(anyhow!(
        "{what}: the object kept changing ({CONFLICT_ATTEMPTS} conflicting writes); try again{}",
        last.map(|e| format!(" (last: {e})")).unwrap_or_default()
    ))
}

/// The line for a failed change of `name`: the server's message (which names the object)
/// for API errors, else the error chain.
pub fn error_line(e: &anyhow::Error, name: &str) -> String {
    match e.downcast_ref::<ClientError>() {
        Some(ce) => crate::server_message(ce, name),
        None => format!("{e:#}"),
    }
}

/// Whether `e` is (or was caused by) an unreachable server, which ends a whole command.
pub fn is_unreachable(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<ClientError>()
            .is_some_and(ClientError::is_unreachable)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn conflict() -> anyhow::Error {
        anyhow!(ClientError::Conflict {
            message: "the object has been modified".into(),
        })
    }

    #[tokio::test]
    async fn retries_conflicts_only() {
        let tries = Cell::new(0);
        let got = retry_on_conflict("x", || {
            tries.set(tries.get() + 1);
            let n = tries.get();
            async move { if n < 3 { Err(conflict()) } else { Ok(n) } }
        })
        .await
        .unwrap();
        assert_eq!(got, 3);

        tries.set(0);
        let err = retry_on_conflict("x", || {
            tries.set(tries.get() + 1);
            async { Err::<(), _>(anyhow!("precondition failed")) }
        })
        .await
        .unwrap_err();
        assert_eq!(tries.get(), 1);
        assert_eq!(err.to_string(), "precondition failed");

        tries.set(0);
        let err = retry_on_conflict("deployment.apps/web", || {
            tries.set(tries.get() + 1);
            async { Err::<(), _>(conflict()) }
        })
        .await
        .unwrap_err();
        assert_eq!(tries.get(), CONFLICT_ATTEMPTS);
        assert!(
            err.to_string()
                .starts_with("deployment.apps/web: the object kept changing"),
            "{err}"
        );
    }
}
