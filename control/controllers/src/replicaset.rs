//! The ReplicaSet controller: keeps `spec.replicas` active pods for each ReplicaSet, and,
//! the same code run over [`Replicated`], for each ReplicationController (as Kubernetes runs
//! its ReplicaSet controller over ReplicationControllers converted to ReplicaSets).
//!
//! A pod belongs to a ReplicaSet when its controller ownerReference names it and the
//! ReplicaSet's selector matches its labels. Orphans that match are adopted; owned pods that
//! no longer match are released. Missing pods are created from the template (in batches of
//! 1, 2, 4, ... that stop at the first failure), excess ones deleted, least valuable first
//! (unscheduled, then pending, then not ready, then newest).
//!
//! The pod informer may lag behind the creates and deletes the controller just made; to not
//! create duplicates, in-flight creates and deletes are remembered per ReplicaSet
//! ([`crate::podcontrol::Expectations`]) and replicas are not managed again until the informer has caught up.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::sync::Arc;

use chrono::Utc;
use futures::future::join_all;
use skiff_api::Resource;
use skiff_api::api::{
    Condition, LabelSelector, ObjectMeta, Pod, PodTemplateSpec, ReplicaSet, ReplicaSetStatus,
    ReplicationController,
};
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, Informer, Informers, ObjectKey, Reconciler,
};

use crate::podcontrol::{PodControl, adopters};
use crate::util::{
    self, controller_ref, format_time, is_pod_active, is_pod_available, is_terminating, labels,
    ready_since,
};
use crate::{Context, Error};

/// Most pods created or deleted for one ReplicaSet in one reconcile.
const BURST: usize = 500;

/// What the controller reads and writes of a ReplicaSet or a ReplicationController.
pub trait Replicated: skiff_api::Resource + Clone + Send + Sync + 'static {
    /// The controller's name (for its queue and logs).
    const CONTROLLER: &'static str;
    fn replicas(&self) -> i32;
    fn min_ready_seconds(&self) -> i32;
    fn selector(&self) -> Option<Cow<'_, LabelSelector>>;
    fn template(&self) -> Option<&PodTemplateSpec>;
    fn replica_status(&self) -> Option<&ReplicaSetStatus>;
    fn set_replica_status(&mut self, status: ReplicaSetStatus);
}

/// The fields ReplicaSets and ReplicationControllers share (the same names and types).
macro_rules! replicated {
    ($ty:ty, $name:literal, |$o:ident| $selector:expr) => {
        impl Replicated for $ty {
            const CONTROLLER: &'static str = $name;
            fn replicas(&self) -> i32 {
                self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
            }
            fn min_ready_seconds(&self) -> i32 {
                self.spec.as_ref().map(|s| s.min_ready_seconds).unwrap_or(0)
            }
            fn selector(&self) -> Option<Cow<'_, LabelSelector>> {
                let $o = self.spec.as_ref()?;
                $selector
            }
            fn template(&self) -> Option<&PodTemplateSpec> {
                self.spec.as_ref().and_then(|s| s.template.as_ref())
            }
            fn replica_status(&self) -> Option<&ReplicaSetStatus> {
                self.status.as_ref()
            }
            fn set_replica_status(&mut self, status: ReplicaSetStatus) {
                self.status = Some(status);
            }
        }
    };
}

replicated!(ReplicaSet, "replicaset", |spec| spec
    .selector
    .as_ref()
    .map(Cow::Borrowed));
// The equality selector as a label selector (an empty one selects nothing here: validation
// refuses it).
replicated!(ReplicationController, "replicationcontroller", |spec| {
    (!spec.selector.is_empty()).then(|| {
        Cow::Owned(LabelSelector {
            match_labels: spec.selector.clone(),
            ..Default::default()
        })
    })
});

/// The reconciler of ReplicaSets (or, with `T` = ReplicationController, of those).
pub struct ReplicaSetController<T: Replicated = ReplicaSet> {
    replica_sets: Informer<T>,
    pods: PodControl,
}

impl<T: Replicated> std::fmt::Debug for ReplicaSetController<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaSetController")
            .finish_non_exhaustive()
    }
}

/// A pod of `rs` as its template describes it (the server picks the name).
pub fn pod_from_template<T: Replicated>(rs: &T) -> Pod {
    let template = rs.template().cloned().unwrap_or_default();
    let tm = template.metadata.unwrap_or_default();
    Pod {
        metadata: Some(ObjectMeta {
            generate_name: format!("{}-", rs.name()),
            namespace: rs.namespace().to_string(),
            labels: tm.labels,
            annotations: tm.annotations,
            finalizers: tm.finalizers,
            owner_references: vec![controller_ref(rs)],
            ..Default::default()
        }),
        spec: template.spec,
        ..Default::default()
    }
}

/// Orders pods so the ones to delete first come first: unscheduled before scheduled, pending
/// before unknown before running, not ready before ready, recently ready before long ready,
/// more restarts first, newer before older.
pub fn deletion_order(pods: &mut [Arc<Pod>]) {
    pods.sort_by_cached_key(|p| {
        let assigned = p.spec.as_ref().is_some_and(|s| !s.node_name.is_empty());
        let phase = match p.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("") {
            "Pending" | "" => 0,
            "Unknown" => 1,
            "Running" => 2,
            _ => 0,
        };
        let restarts: i32 = p
            .status
            .as_ref()
            .map(|s| s.container_statuses.iter().map(|c| c.restart_count).sum())
            .unwrap_or(0);
        (
            assigned,
            phase,
            p.is_ready(),
            Reverse(ready_since(p)),
            Reverse(restarts),
            Reverse(util::creation_timestamp(&**p).to_string()),
            Reverse(p.name().to_string()),
        )
    });
}

impl<T: Replicated> ReplicaSetController<T> {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        ReplicaSetController {
            replica_sets: informers.get::<T>(),
            pods: PodControl::new(informers.client().clone(), recorder, informers.get::<Pod>()),
        }
    }

    /// The controller: ReplicaSets, the pods they own, and orphan pods their selectors match.
    pub fn controller(informers: &Informers) -> Controller<T> {
        let replica_sets = informers.get::<T>();
        let pods = informers.get::<Pod>();
        Controller::<T>::new(informers)
            .named(T::CONTROLLER)
            .watches_owned::<Pod>()
            .watches(&pods, move |pod: &Pod| {
                adopters(&replica_sets, pod, |o| o.selector())
            })
    }

    /// Runs the ReplicaSet controller with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(ReplicaSetController::<T>::new(informers, recorder));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    /// Creates or deletes pods so `active` matches `spec.replicas`.
    async fn manage(&self, key: &ObjectKey, rs: &T, active: &[Arc<Pod>]) -> Result<(), Error> {
        let want = usize::try_from(rs.replicas()).unwrap_or(0);
        let have = active.len();
        if have < want {
            let mut remaining = (want - have).min(BURST);
            tracing::debug!(replicaset = %key, want, have, "creating pods");
            let pod = pod_from_template(rs);
            let mut batch = 1;
            while remaining > 0 {
                let size = batch.min(remaining);
                let results =
                    join_all((0..size).map(|_| self.pods.create_pod(key, rs, &pod))).await;
                let failed: Vec<Error> = results.into_iter().filter_map(Result::err).collect();
                if let Some(first) = failed.into_iter().next() {
                    // Skip the rest: the same error would most likely repeat.
                    return Err(first);
                }
                remaining -= size;
                batch *= 2;
            }
        } else if have > want {
            let mut victims = active.to_vec();
            deletion_order(&mut victims);
            victims.truncate((have - want).min(BURST));
            tracing::debug!(replicaset = %key, want, have, "deleting pods");
            let results = join_all(victims.iter().map(|p| self.pods.delete_pod(key, rs, p))).await;
            if let Some(first) = results.into_iter().find_map(Result::err) {
                return Err(first);
            }
        }
        Ok(())
    }

    async fn update_status(
        &self,
        rs: &T,
        active: &[Arc<Pod>],
        failure: Option<(&str, String)>,
    ) -> Result<(), Error> {
        let now = Utc::now();
        let template_labels = rs
            .template()
            .and_then(|t| t.metadata.as_ref())
            .map(|m| m.labels.clone())
            .unwrap_or_default();
        let count = |f: &dyn Fn(&Pod) -> bool| {
            i32::try_from(active.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX)
        };
        let mut status = rs.replica_status().cloned().unwrap_or_default();
        status.replicas = count(&|_| true);
        status.fully_labeled_replicas = count(&|p| {
            let l = labels(p);
            template_labels.iter().all(|(k, v)| l.get(k) == Some(v))
        });
        status.ready_replicas = count(&|p| p.is_ready());
        status.available_replicas = count(&|p| is_pod_available(p, rs.min_ready_seconds(), now));
        status.observed_generation = util::generation(rs);
        match failure {
            Some((reason, message)) => {
                util::set_condition(
                    &mut status.conditions,
                    Condition {
                        r#type: "ReplicaFailure".into(),
                        status: "True".into(),
                        reason: reason.into(),
                        message,
                        last_transition_time: format_time(now),
                        ..Default::default()
                    },
                );
            }
            None => {
                util::remove_condition(&mut status.conditions, "ReplicaFailure");
            }
        }
        if rs.replica_status() == Some(&status)
            || (rs.replica_status().is_none() && status == ReplicaSetStatus::default())
        {
            return Ok(());
        }
        let mut updated = rs.clone();
        updated.set_replica_status(status);
        self.pods
            .client
            .namespaced::<T>(rs.namespace())
            .update_status(&updated)
            .await
            .during(|| format!("updating the status of replica set {}", rs.name()))?;
        Ok(())
    }
}

impl<T: Replicated> Reconciler for ReplicaSetController<T> {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(rs) = self.replica_sets.get(key) else {
            self.pods.expectations.forget(key);
            return Ok(Action::Done);
        };
        let selector = rs.selector();
        let Some(owned) = self.pods.claim(&*rs, selector.as_deref()).await? else {
            return Ok(Action::Done);
        };
        let active: Vec<Arc<Pod>> = owned.into_iter().filter(|p| is_pod_active(p)).collect();
        let pending = self.pods.expectations.pending(key, &self.pods.pods);
        let mut managed = Ok(());
        if pending.is_none() && !is_terminating(&*rs) {
            managed = self.manage(key, &rs, &active).await;
        }
        let want = rs.replicas();
        let failure = managed.as_ref().err().map(|e| {
            let reason = if active.len() < usize::try_from(want).unwrap_or(0) {
                "FailedCreate"
            } else {
                "FailedDelete"
            };
            (reason, crate::error_chain(e))
        });
        self.update_status(&rs, &active, failure).await?;
        managed?;
        let min_ready = rs.min_ready_seconds();
        let next = util::requeue_for_availability(pending, &active, min_ready, Utc::now());
        Ok(next.map_or(Action::Done, Action::RequeueAfter))
    }
}
