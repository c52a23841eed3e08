//! [`LeaderElector`]: leader election through a `coordination.k8s.io/v1` Lease, so several
//! replicas of a component can run with one active.
//!
//! The algorithm is client-go's: a candidate takes the Lease when it has no holder or when
//! its record has not changed for `leaseDurationSeconds` *as observed by the candidate's own
//! clock* (no clock synchronisation is assumed); the leader renews it every
//! `retry_period`; every write is a compare-and-swap on the Lease's resourceVersion, so two
//! candidates can never both win. A leader that cannot renew within `renew_deadline`
//! (shorter than the lease duration) stops its work before anyone else may take over.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use skiff_api::api::{Lease, LeaseSpec, ObjectMeta};
use tokio::sync::watch;
use tokio::time::Instant;

use super::cancel::CancelToken;
use super::time;
use crate::{Api, Client, ClientError};

/// Settings of a [`LeaderElector`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// Namespace of the Lease (default `kube-system`).
    pub namespace: String,
    /// Name of the Lease (one per component, e.g. `skiff-controller-manager`).
    pub lease_name: String,
    /// This candidate's identity (`holderIdentity`); must be unique among candidates.
    pub identity: String,
    /// How long a lease holds without renewal (`leaseDurationSeconds`; whole seconds, at
    /// least 1). Default 15 s.
    pub lease_duration: Duration,
    /// A leader that could not renew for this long steps down. Default 2/3 of the lease.
    pub renew_deadline: Duration,
    /// How often the leader renews and candidates try to acquire. Default 1/3 of the lease.
    pub retry_period: Duration,
    /// Give the lease up when stopped through the shutdown token, so another candidate
    /// takes over at once. Default true.
    pub release_on_cancel: bool,
    /// How long the work gets to stop after leadership is lost before it is dropped.
    pub stop_grace: Duration,
}

impl LeaderElectionConfig {
    /// A 15 s lease in `kube-system`.
    pub fn new(lease_name: &str, identity: &str) -> Self {
        LeaderElectionConfig {
            namespace: "kube-system".into(),
            lease_name: lease_name.into(),
            identity: identity.into(),
            lease_duration: Duration::ZERO,
            renew_deadline: Duration::ZERO,
            retry_period: Duration::ZERO,
            release_on_cancel: true,
            stop_grace: Duration::from_secs(5),
        }
        .with_lease_duration(Duration::from_secs(15))
    }

    /// Sets the lease duration (rounded up to whole seconds, at least 1 s), with the renew
    /// deadline at 2/3 and the retry period at 1/3 of it.
    pub fn with_lease_duration(mut self, d: Duration) -> Self {
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        self.lease_duration = Duration::from_secs(secs.max(1));
        self.renew_deadline = self.lease_duration * 2 / 3;
        self.retry_period = self.lease_duration / 3;
        self
    }

    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.into();
        self
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// Why leader election could not run.
#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    #[error("invalid leader election config: {0}")]
    Config(String),
}

/// The Lease record as last seen, and when (by our clock) it last changed.
struct Observed {
    spec: LeaseSpec,
    at: Instant,
}

/// Runs work only while this process holds a Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    observed: Mutex<Option<Observed>>,
    leading: watch::Sender<bool>,
    shutdown: CancelToken,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .field("leading", &self.is_leader())
            .finish_non_exhaustive()
    }
}

enum Attempt {
    /// We hold the lease (acquired or renewed).
    Held,
    /// Someone else holds it, or we lost a race for it.
    NotHeld,
}

impl LeaderElector {
    pub fn new(client: &Client, config: LeaderElectionConfig) -> Self {
        LeaderElector {
            api: client.namespaced::<Lease>(&config.namespace),
            config,
            observed: Mutex::new(None),
            leading: watch::channel(false).0,
            shutdown: CancelToken::new(),
        }
    }

    /// Stops [`LeaderElector::run`] when `token` is cancelled (the work is stopped and, with
    /// `release_on_cancel`, the lease given up).
    pub fn with_shutdown(mut self, token: CancelToken) -> Self {
        self.shutdown = token;
        self
    }

    pub fn config(&self) -> &LeaderElectionConfig {
        &self.config
    }

    /// Whether this process currently leads.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Follows [`LeaderElector::is_leader`].
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Campaigns for the lease; each time it is won, runs `work(token)` until leadership is
    /// lost (then `token` is cancelled, the work gets `stop_grace` to return, and is dropped)
    /// and campaigns again. Returns when the shutdown token is cancelled, or when `work`
    /// returns while leading (the lease is then released).
    pub async fn run<F, Fut>(&self, mut work: F) -> Result<(), LeaderElectionError>
    where
        F: FnMut(CancelToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        let c = &self.config;
        if c.identity.is_empty() || c.lease_name.is_empty() {
            return Err(LeaderElectionError::Config(
                "identity and lease name must not be empty".into(),
            ));
        }
        if c.renew_deadline >= c.lease_duration || c.retry_period >= c.renew_deadline {
            return Err(LeaderElectionError::Config(format!(
                "need retry period ({:?}) < renew deadline ({:?}) < lease duration ({:?})",
                c.retry_period, c.renew_deadline, c.lease_duration
            )));
        }
        loop {
            if !self.acquire().await {
                return Ok(());
            }
            tracing::info!(lease = %c.lease_name, identity = %c.identity, "became leader");
            self.leading.send_replace(true);
            let token = self.shutdown.child();
            let fut = work(token.clone());
            tokio::pin!(fut);
            let finished = tokio::select! {
                _ = &mut fut => true,
                _ = self.renew_until_lost() => false,
            };
            token.cancel();
            if !finished && tokio::time::timeout(c.stop_grace, &mut fut).await.is_err() {
                tracing::warn!(lease = %c.lease_name, "work did not stop in time, dropping it");
            }
            self.leading.send_replace(false);
            if finished || self.shutdown.is_cancelled() {
                if c.release_on_cancel || finished {
                    self.release().await;
                }
                return Ok(());
            }
            tracing::warn!(lease = %c.lease_name, identity = %c.identity, "lost leadership");
        }
    }

    /// Tries until the lease is ours (true) or shutdown (false).
    async fn acquire(&self) -> bool {
        let mut logged = false;
        loop {
            if self.shutdown.is_cancelled() {
                return false;
            }
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => return true,
                Ok(Attempt::NotHeld) => {
                    if !logged {
                        tracing::info!(lease = %self.config.lease_name, holder = %self.holder(),
                            "waiting for the lease");
                        logged = true;
                    }
                }
                Err(e) => tracing::warn!(lease = %self.config.lease_name, error = %e,
                    "cannot get the lease"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.retry_period) => {}
                _ = self.shutdown.cancelled() => return false,
            }
        }
    }

    /// Renews every retry period; returns when a renewal did not succeed within the renew
    /// deadline, when someone else holds the lease, or on shutdown.
    async fn renew_until_lost(&self) {
        let c = &self.config;
        let mut last_renew = Instant::now();
        let fast_retry = (c.retry_period / 4).max(Duration::from_millis(50));
        let mut wait = c.retry_period;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.shutdown.cancelled() => return,
            }
            if last_renew.elapsed() >= c.renew_deadline {
                tracing::warn!(lease = %c.lease_name, "could not renew the lease in time");
                return;
            }
            let attempt = tokio::time::timeout(
                c.renew_deadline.saturating_sub(last_renew.elapsed()),
                self.try_acquire_or_renew(),
            )
            .await;
            match attempt {
                Ok(Ok(Attempt::Held)) => {
                    last_renew = Instant::now();
                    wait = c.retry_period;
                }
                Ok(Ok(Attempt::NotHeld)) => {
                    tracing::warn!(lease = %c.lease_name, holder = %self.holder(),
                        "the lease is held by someone else");
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(lease = %c.lease_name, error = %e, "renewing the lease failed");
                    wait = fast_retry;
                }
                Err(_) => wait = Duration::ZERO,
            }
        }
    }

    fn holder(&self) -> String {
        self.observed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|o| o.spec.holder_identity.clone())
            .unwrap_or_default()
    }

    fn observe(&self, spec: &LeaseSpec) {
        let mut obs = self.observed.lock().unwrap_or_else(|e| e.into_inner());
        if obs.as_ref().is_none_or(|o| o.spec != *spec) {
            *obs = Some(Observed {
                spec: spec.clone(),
                at: Instant::now(),
            });
        }
    }

    /// Whether the observed record is held by someone else and not expired.
    fn held_by_other(&self, spec: &LeaseSpec) -> bool {
        let holder = spec.holder_identity.as_deref().unwrap_or("");
        if holder.is_empty() || holder == self.config.identity {
            return false;
        }
        let obs = self.observed.lock().unwrap_or_else(|e| e.into_inner());
        let Some(o) = obs.as_ref() else { return true };
        let secs = spec
            .lease_duration_seconds
            .unwrap_or_else(|| self.config.lease_seconds())
            .max(1);
        o.at.elapsed() < Duration::from_secs(secs as u64)
    }

    async fn try_acquire_or_renew(&self) -> Result<Attempt, ClientError> {
        let c = &self.config;
        let now = time::now_micros();
        let Some(mut lease) = self.api.get_opt(&c.lease_name).await? else {
            let spec = LeaseSpec {
                holder_identity: Some(c.identity.clone()),
                lease_duration_seconds: Some(c.lease_seconds()),
                acquire_time: now.clone(),
                renew_time: now,
                lease_transitions: Some(0),
            };
            let lease = Lease {
                metadata: Some(ObjectMeta {
                    name: c.lease_name.clone(),
                    namespace: c.namespace.clone(),
                    ..Default::default()
                }),
                spec: Some(spec),
                ..Default::default()
            };
            return match self.api.create(&lease).await {
                Ok(created) => {
                    self.observe(&created.spec.unwrap_or_default());
                    Ok(Attempt::Held)
                }
                Err(e) if e.is_already_exists() || e.is_conflict() => Ok(Attempt::NotHeld),
                Err(e) => Err(e),
            };
        };
        let old = lease.spec.clone().unwrap_or_default();
        self.observe(&old);
        if self.held_by_other(&old) {
            return Ok(Attempt::NotHeld);
        }
        let ours = old.holder_identity.as_deref() == Some(c.identity.as_str());
        let mut spec = old.clone();
        spec.holder_identity = Some(c.identity.clone());
        spec.lease_duration_seconds = Some(c.lease_seconds());
        spec.renew_time = now.clone();
        if !ours {
            spec.acquire_time = now;
            spec.lease_transitions = Some(old.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        lease.spec = Some(spec);
        match self.api.update(&lease).await {
            Ok(updated) => {
                self.observe(&updated.spec.unwrap_or_default());
                if !ours {
                    tracing::debug!(lease = %c.lease_name, previous = ?old.holder_identity, "took the lease");
                }
                Ok(Attempt::Held)
            }
            Err(e) if e.is_conflict() || e.is_not_found() => Ok(Attempt::NotHeld),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up if we hold it (no holder, 1 s duration), so a candidate takes over
    /// at once.
    async fn release(&self) {
        let c = &self.config;
        let result = async {
            let Some(mut lease) = self.api.get_opt(&c.lease_name).await? else {
                return Ok(());
            };
            let Some(spec) = lease.spec.as_mut() else {
                return Ok(());
            };
            if spec.holder_identity.as_deref() != Some(c.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = time::now_micros();
            self.api.update(&lease).await.map(|_| ())
        }
        .await;
        match result {
            Ok(()) => tracing::info!(lease = %c.lease_name, "released the lease"),
            Err(e) => {
                tracing::warn!(lease = %c.lease_name, error = %e, "could not release the lease")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_derives_deadlines_from_the_lease() {
        let c = LeaderElectionConfig::new("l", "me");
        assert_eq!(c.namespace, "kube-system");
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(5));
        let c = c.with_lease_duration(Duration::from_millis(1500));
        assert_eq!(c.lease_duration, Duration::from_secs(2));
        assert_eq!(c.lease_seconds(), 2);
    }
}
