//! The Skiff controller manager's controllers, all built on [`skiff_client::controller`]
//! (shared informers, work queue, reconcile loop, leader election, events).
//!
//! - [`replicaset`]: keeps `spec.replicas` pods of each ReplicaSet (creates from the
//!   template, deletes the excess, adopts orphans, releases pods it no longer selects) and
//!   reports their readiness and availability.
//! - [`deployment`]: one ReplicaSet per template revision; rolls from the old ones to the new
//!   one honouring maxSurge/maxUnavailable (RollingUpdate) or all at once (Recreate); pause,
//!   revision history, status and conditions.
//! - [`daemonset`]: one pod of each DaemonSet on every node its template's selector,
//!   affinity and tolerations allow; rolling updates within maxUnavailable/maxSurge, or
//!   OnDelete; status counts.
//! - [`disruption`]: the status of every PodDisruptionBudget (expected and healthy pods,
//!   allowed disruptions), which the API server's eviction subresource honours.
//! - [`cronjob`]: a Job for each scheduled time of a CronJob (time zones, concurrency
//!   policy, starting deadline, suspend, history limits).
//! - [`hpa`]: HorizontalPodAutoscalers: scales Deployments, ReplicaSets and StatefulSets
//!   by their pods' resource metrics (the metrics API), with Kubernetes' tolerance and
//!   stabilization windows.
//! - [`job`]: runs Jobs' pods to completion (parallelism, completions, Indexed, back-off,
//!   backoffLimit, activeDeadlineSeconds, podFailurePolicy, suspend, TTL after finished).
//! - [`podcontrol`]: what the controllers that own pods directly share (claiming, creating
//!   and deleting pods with events, expectations).
//! - [`statefulset`]: pods with stable names and ordinals (OrderedReady or Parallel),
//!   rolling updates from the highest ordinal down to the partition, OnDelete.
//! - [`endpoints`]: keeps an Endpoints object per Service with a selector, listing the
//!   selected pods' addresses (ready and not ready) and their resolved target ports.
//! - [`serviceip`]: the Service allocator: hands out `spec.clusterIP` from the service CIDR
//!   and `nodePort`s from the node port range, unique across Services.
//! - [`nodeipam`]: hands out `spec.podCIDR` blocks of the cluster CIDR to Nodes.
//! - [`lbipam`]: gives LoadBalancer Services their `status.loadBalancer.ingress` addresses
//!   from LoadBalancerIPPools, and keeps the pools' counts and conflicts.
//! - [`allocator`] and [`ranges`]: what both allocators share (the ledger of who holds which
//!   value, mirrored from an informer; CIDR and port arithmetic, the rolling range allocator).
//! - [`gc`]: the garbage collector: deletes objects whose owners are all gone (an owner is
//!   gone only once the API server confirms it, never on the cache's word alone), deletes the
//!   dependents of owners deleted in the foreground before their `foregroundDeletion`
//!   finalizer is removed, and removes the references to owners deleted with Orphan before
//!   their `orphan` finalizer is. One generic collector per kind (Deployment, DaemonSet,
//!   StatefulSet, CronJob, Job, ReplicaSet, Pod, Service, Endpoints).
//! - [`namespace`]: empties a terminating namespace (every namespaced kind), then deletes it.
//! - [`nodelifecycle`]: node health from the agents' Leases; conditions `Unknown` and pods
//!   not ready when a node stops reporting; `unreachable`/`not-ready` taints; eviction of the
//!   pods that do not tolerate a NoExecute taint (or only for `tolerationSeconds`).
//! - [`clusterroleaggregation`]: fills the `rules` of every ClusterRole with an
//!   `aggregationRule` with the rules of the ClusterRoles its selectors match.
//! - [`serviceaccount`], [`rootca`], [`certificates`], [`volumes`]: a `default`
//!   ServiceAccount and the `kube-root-ca.crt` ConfigMap in every namespace; approving and
//!   signing CertificateSigningRequests; binding PersistentVolumeClaims, with a local-path
//!   provisioner.
//! - [`manager`]: runs the enabled controllers in one process (`--controllers`), under
//!   leader election through a Lease (`--leader-elect`, default on).
//!
//! Controllers read only from informers and write only through the API server; every
//! decision is recomputed from the current state (level-triggered), so a controller can be
//! restarted, or lose its leadership, at any point.
//!
//! No controller talks to anything but the API server, keeps its own copy of controller logic,
//! writes `Ready=True` or other node status the agent owns, allocates inside the API server
//! (which only validates, keeps allocated values on update and refuses a changed clusterIP),
//! deletes on the cache's word alone, or touches a namespace that is not terminating.

pub mod allocator;
pub mod certificates;
pub mod clusterroleaggregation;
pub mod cronjob;
pub mod csrcleaner;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod gc;
pub mod hpa;
pub mod job;
pub mod lbipam;
pub mod manager;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod podcontrol;
pub mod ranges;
pub mod replicaset;
pub mod rootca;
pub mod serviceaccount;
pub mod serviceip;
pub mod statefulset;
pub mod util;
pub mod volumes;

use skiff_client::controller::EventRecorder;
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
