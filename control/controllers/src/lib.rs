//! The Skiff controller manager's controllers, all built on the one controller runtime of
//! [`skiff_client::runtime`] (shared informers, work queue, reconcile loop, leader election,
//! events).
//!
//! - [`replicaset`]: keeps `spec.replicas` pods of each ReplicaSet (creates from the
//!   template, deletes the excess, adopts orphans, releases pods it no longer selects) and
//!   reports their readiness and availability.
//! - [`deployment`]: one ReplicaSet per template revision; rolls from the old ones to the new
//!   one honouring maxSurge/maxUnavailable (RollingUpdate) or all at once (Recreate); pause,
//!   revision history, status and conditions.
//! - [`manager`]: runs the enabled controllers in one process, under leader election.
//! - `testing` (feature `testing`): a fake kubelet that makes pods Ready, for tests that run
//!   controllers without node agents.
//!
//! Controllers read only from informers and write only through the API server; every
//! decision is recomputed from the current state (level-triggered), so a controller can be
//! restarted, or lose its leadership, at any point.

pub mod deployment;
pub mod manager;
pub mod replicaset;
#[cfg(feature = "testing")]
pub mod testing;
pub mod util;

use skiff_client::runtime::EventRecorder;
use skiff_client::{Client, ClientError};

/// Why a reconcile failed (the key is retried with back-off).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("{action}")]
    Api {
        action: String,
        #[source]
        source: ClientError,
    },
    /// Some of the pods or ReplicaSets could not be created or deleted.
    #[error("{0}")]
    Partial(String),
    /// The name a new ReplicaSet must have is taken by one with another template.
    #[error("replica set name {0} is taken by a different template (hash collision)")]
    HashCollision(String),
}

/// `error: cause: cause ...`, for messages that show one string.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Adds what was being done to a [`ClientError`].
pub(crate) trait Context<T> {
    fn during(self, action: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T> Context<T> for Result<T, ClientError> {
    fn during(self, action: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|source| Error::Api {
            action: action(),
            source,
        })
    }
}

/// What every controller gets: the client and an event recorder.
#[derive(Debug, Clone)]
pub struct Shared {
    pub client: Client,
    pub recorder: EventRecorder,
}
