//! The StatefulSet controller: pods with stable names and ordinals, as Kubernetes'
//! `statefulset` controller makes them.
//!
//! - Pod `<set>-<ordinal>` for each ordinal from `spec.ordinals.start`, with hostname = its
//!   name and subdomain = `serviceName` (its DNS name under the governing headless Service),
//!   the `statefulset.kubernetes.io/pod-name`, `apps.kubernetes.io/pod-index` and
//!   `controller-revision-hash` (`<set>-<template hash>`) labels.
//! - `OrderedReady` (default): one pod at a time, in ordinal order, each created only when
//!   every lower one is Running and Ready; scale-down removes the highest ordinal first, one
//!   at a time, only while the others are healthy. `Parallel`: all at once.
//! - `RollingUpdate`: once every pod is Running and Ready, the highest ordinal not on the
//!   update revision and at or above `partition` is deleted (and recreated on it by the
//!   create step), at most `maxUnavailable` (default 1) at a time. `OnDelete`: pods take
//!   the new template only when deleted. A failed pod is deleted and recreated.
//! - `volumeClaimTemplates`: before a pod is made, its claims `<template>-<set>-<ordinal>`
//!   ([`claims_for`]: the template's spec, its labels plus the selector's, no owner) are
//!   created when missing, and the pod gets a `persistentVolumeClaim` volume of each
//!   template's name. Claims are kept when pods or the set go (the retention policy's Delete
//!   is not built).
//! - Pods are claimed, created and deleted through the shared [`PodControl`].
//! - [`status_of`]: replicas, ready, available, current and updated counts and revisions
//!   (current becomes the update revision once all pods are on it).
//!
//! The API server lets only replicas, ordinals, template, updateStrategy and minReadySeconds
//! change, and serves `scale` for StatefulSets. Not built: ControllerRevisions (rollout
//! history and undo).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use skiff_api::Resource;
use skiff_api::api::{ObjectMeta, Pod, StatefulSet, StatefulSetStatus};
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, Informer, Informers, ObjectKey, Reconciler,
};

use crate::podcontrol::{PodControl, adopters};
use crate::util::{
    self, controller_ref, is_pod_available, is_terminating, labels, pod_template_hash, scaled_value,
};
use crate::{Context, Error};

/// The labels of a StatefulSet's pods.
pub const POD_NAME: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX: &str = "apps.kubernetes.io/pod-index";
pub const REVISION: &str = "controller-revision-hash";

/// The update revision of `set`: `<name>-<template hash>`.
pub fn revision(set: &StatefulSet) -> String {
    let template = set
        .spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default();
    format!(
        "{}-{}",
        set.name(),
        pod_template_hash(
            &template,
            set.status.as_ref().and_then(|s| s.collision_count)
        )
    )
}

/// The ordinal of a pod named `<set>-<n>`.
pub fn ordinal_of(set: &StatefulSet, pod: &Pod) -> Option<i32> {
    pod.name()
        .strip_prefix(set.name())?
        .strip_prefix('-')?
        .parse()
        .ok()
        .filter(|n: &i32| *n >= 0)
}

/// The pod of `set` for `ordinal`, on `revision`.
pub fn pod_for(set: &StatefulSet, ordinal: i32, revision: &str) -> Pod {
    let spec = set.spec.clone().unwrap_or_default();
    let template = spec.template.unwrap_or_default();
    let tm = template.metadata.unwrap_or_default();
    let name = format!("{}-{ordinal}", set.name());
    let mut pod_labels = tm.labels;
    pod_labels.insert(POD_NAME.into(), name.clone());
    pod_labels.insert(POD_INDEX.into(), ordinal.to_string());
    pod_labels.insert(REVISION.into(), revision.to_string());
    let mut pod_spec = template.spec.unwrap_or_default();
    // Each claim template is the pod's volume of that name (Kubernetes' `updateStorage`).
    for tpl in &spec.volume_claim_templates {
        let tname = tpl
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        pod_spec.volumes.retain(|v| v.name != tname);
        pod_spec.volumes.push(skiff_api::api::Volume {
            name: tname.clone(),
            persistent_volume_claim: Some(skiff_api::api::PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&tname, set, ordinal),
                read_only: false,
            }),
            ..Default::default()
        });
    }
    pod_spec.hostname = name.clone();
    if !spec.service_name.is_empty() {
        pod_spec.subdomain = spec.service_name.clone();
    }
    Pod {
        metadata: Some(ObjectMeta {
            name,
            namespace: set.namespace().to_string(),
            labels: pod_labels,
            annotations: tm.annotations,
            finalizers: tm.finalizers,
            owner_references: vec![controller_ref(set)],
            ..Default::default()
        }),
        spec: Some(pod_spec),
        ..Default::default()
    }
}

/// The claim of template `template` for `set`'s pod `ordinal`: `<template>-<set>-<ordinal>`.
pub fn claim_name(template: &str, set: &StatefulSet, ordinal: i32) -> String {
    format!("{template}-{}-{ordinal}", set.name())
}

/// The PersistentVolumeClaims of `set`'s pod `ordinal`, one per claim template: the
/// template's spec, its labels plus the set's selector labels (as Kubernetes makes them;
/// no owner: claims outlive their pods and, by default, the set).
pub fn claims_for(set: &StatefulSet, ordinal: i32) -> Vec<skiff_api::api::PersistentVolumeClaim> {
    let spec = set.spec.clone().unwrap_or_default();
    let selector_labels = spec
        .selector
        .as_ref()
        .map(|s| s.match_labels.clone())
        .unwrap_or_default();
    spec.volume_claim_templates
        .iter()
        .map(|tpl| {
            let tm = tpl.metadata.clone().unwrap_or_default();
            let mut labels = tm.labels;
            labels.extend(selector_labels.clone());
            skiff_api::api::PersistentVolumeClaim {
                metadata: Some(ObjectMeta {
                    name: claim_name(&tm.name, set, ordinal),
                    namespace: set.namespace().to_string(),
                    labels,
                    annotations: tm.annotations,
                    ..Default::default()
                }),
                spec: tpl.spec.clone(),
                ..Default::default()
            }
        })
        .collect()
}

fn phase(p: &Pod) -> &str {
    p.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("")
}

fn healthy(p: &Pod) -> bool {
    !is_terminating(p) && phase(p) == "Running" && p.is_ready()
}

fn on_revision(p: &Pod, rev: &str) -> bool {
    labels(p).get(REVISION).map(String::as_str) == Some(rev)
}

/// What one reconcile does.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StatefulSetPlan {
    /// Ordinals to create.
    pub create: Vec<i32>,
    /// Pods to delete, by name.
    pub delete: Vec<String>,
}

/// The planner (pure): Kubernetes' StatefulSet update for `set`'s pods by ordinal.
pub fn plan(set: &StatefulSet, pods: &BTreeMap<i32, Arc<Pod>>, revision: &str) -> StatefulSetPlan {
    let spec = set.spec.clone().unwrap_or_default();
    let start = spec.ordinals.as_ref().map(|o| o.start).unwrap_or(0);
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let end = start + replicas;
    let ordered = spec.pod_management_policy != "Parallel";
    let mut out = StatefulSetPlan::default();
    // Failed pods go first (recreated on a later pass).
    for p in pods.values() {
        if phase(p) == "Failed" && !is_terminating(&**p) {
            out.delete.push(p.name().to_string());
        }
    }
    if ordered && !out.delete.is_empty() {
        return out;
    }
    // Create the missing ordinals (OrderedReady: the first missing one, once all below are
    // healthy).
    for ordinal in start..end {
        match pods.get(&ordinal) {
            None => {
                out.create.push(ordinal);
                if ordered {
                    return out;
                }
            }
            Some(p) if ordered && !healthy(p) => return out,
            Some(_) => {}
        }
    }
    // Condemned: ordinals outside the range, highest first.
    let condemned: Vec<&Arc<Pod>> = pods
        .iter()
        .rev()
        .filter(|(o, _)| **o < start || **o >= end)
        .map(|(_, p)| p)
        .collect();
    if !condemned.is_empty() {
        if ordered {
            let others_healthy = pods
                .iter()
                .filter(|(o, _)| (start..end).contains(*o))
                .all(|(_, p)| healthy(p));
            if let Some(first) = condemned.first()
                && !is_terminating(&***first)
                && others_healthy
                && !condemned.iter().any(|p| is_terminating(&***p))
            {
                out.delete.push(first.name().to_string());
            }
        } else {
            out.delete.extend(
                condemned
                    .iter()
                    .filter(|p| !is_terminating(&****p))
                    .map(|p| p.name().to_string()),
            );
        }
        return out;
    }
    // Rolling update, highest ordinal first, down to the partition.
    let strategy = spec.update_strategy.clone().unwrap_or_default();
    if strategy.r#type == "OnDelete" {
        return out;
    }
    let ru = strategy.rolling_update.unwrap_or_default();
    let partition = ru.partition.unwrap_or(0);
    let max_unavailable = scaled_value(ru.max_unavailable.as_deref(), replicas, true)
        .unwrap_or(1)
        .max(1);
    let unavailable = (start..end)
        .filter(|o| pods.get(o).is_none_or(|p| !healthy(p)))
        .count();
    let mut budget = usize::try_from(max_unavailable)
        .unwrap_or(1)
        .saturating_sub(unavailable);
    for ordinal in (start..end).rev() {
        if budget == 0 || ordinal - start < partition {
            break;
        }
        let Some(p) = pods.get(&ordinal) else {
            continue;
        };
        if !on_revision(p, revision) && !is_terminating(&**p) {
            out.delete.push(p.name().to_string());
            budget -= 1;
        }
    }
    out
}

/// The status the pods give.
pub fn status_of(
    set: &StatefulSet,
    pods: &BTreeMap<i32, Arc<Pod>>,
    revision: &str,
    now: DateTime<Utc>,
) -> StatefulSetStatus {
    let spec = set.spec.clone().unwrap_or_default();
    let mut st = set.status.clone().unwrap_or_default();
    let live: Vec<&Arc<Pod>> = pods.values().filter(|p| !is_terminating(&***p)).collect();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let current = if st.current_revision.is_empty() {
        revision.to_string()
    } else {
        st.current_revision.clone()
    };
    st.replicas = count(live.len());
    st.ready_replicas = count(live.iter().filter(|p| p.is_ready()).count());
    st.available_replicas = count(
        live.iter()
            .filter(|p| is_pod_available(p, spec.min_ready_seconds, now))
            .count(),
    );
    st.updated_replicas = count(live.iter().filter(|p| on_revision(p, revision)).count());
    st.current_replicas = count(live.iter().filter(|p| on_revision(p, &current)).count());
    st.update_revision = revision.to_string();
    let want = spec.replicas.unwrap_or(1);
    // Once every pod is on the update revision, it is the current one.
    st.current_revision = if st.updated_replicas == want && st.ready_replicas == want {
        st.current_replicas = st.updated_replicas;
        revision.to_string()
    } else {
        current
    };
    st.observed_generation = util::generation(set);
    st
}

/// The reconciler of StatefulSets.
pub struct StatefulSetController {
    sets: Informer<StatefulSet>,
    pods: PodControl,
}

impl std::fmt::Debug for StatefulSetController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatefulSetController")
            .finish_non_exhaustive()
    }
}

impl StatefulSetController {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        StatefulSetController {
            sets: informers.get::<StatefulSet>(),
            pods: PodControl::new(informers.client().clone(), recorder, informers.get::<Pod>()),
        }
    }

    /// The controller: StatefulSets, the pods they own, orphans their selectors match.
    pub fn controller(informers: &Informers) -> Controller<StatefulSet> {
        let sets = informers.get::<StatefulSet>();
        let pods = informers.get::<Pod>();
        Controller::<StatefulSet>::new(informers)
            .named("statefulset")
            .watches_owned::<Pod>()
            .watches(&pods, move |pod: &Pod| {
                adopters(&sets, pod, |s| {
                    s.spec
                        .as_ref()
                        .and_then(|s| s.selector.as_ref())
                        .map(std::borrow::Cow::Borrowed)
                })
            })
    }

    /// Runs the StatefulSet controller with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(StatefulSetController::new(informers, recorder));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }
}

impl StatefulSetController {
    /// Creates the claims of pod `ordinal` that do not exist yet.
    async fn ensure_claims(&self, set: &StatefulSet, ordinal: i32) -> Result<(), Error> {
        let api = self
            .pods
            .client
            .namespaced::<skiff_api::api::PersistentVolumeClaim>(set.namespace());
        for claim in claims_for(set, ordinal) {
            let name = claim
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            match api.create(&claim).await {
                Ok(_) | Err(skiff_client::ClientError::AlreadyExists { .. }) => {}
                Err(e) => {
                    return Err(e).during(|| {
                        format!(
                            "creating claim {}/{name} of stateful set {}",
                            set.namespace(),
                            set.name()
                        )
                    });
                }
            }
        }
        Ok(())
    }
}

impl Reconciler for StatefulSetController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(set) = self.sets.get(key) else {
            self.pods.expectations.forget(key);
            return Ok(Action::Done);
        };
        let spec = set.spec.clone().unwrap_or_default();
        let Some(owned) = self.pods.claim(&*set, spec.selector.as_ref()).await? else {
            return Ok(Action::Done);
        };
        let by_ordinal: BTreeMap<i32, Arc<Pod>> = owned
            .iter()
            .filter_map(|p| ordinal_of(&set, p).map(|o| (o, Arc::clone(p))))
            .collect();
        let rev = revision(&set);
        let pending = self.pods.expectations.pending(key, &self.pods.pods);
        let mut applied = Ok(());
        if pending.is_none() && !is_terminating(&*set) {
            let plan = plan(&set, &by_ordinal, &rev);
            // A pod's claims exist before it does (kept when it goes).
            for o in &plan.create {
                self.ensure_claims(&set, *o).await?;
            }
            let create: Vec<Pod> = plan
                .create
                .iter()
                .map(|o| pod_for(&set, *o, &rev))
                .collect();
            applied = self.pods.apply(key, &*set, &plan.delete, &create).await;
        }
        let now = Utc::now();
        let status = status_of(&set, &by_ordinal, &rev, now);
        if set.status.as_ref() != Some(&status) {
            let mut updated = (*set).clone();
            updated.status = Some(status);
            self.pods
                .client
                .namespaced::<StatefulSet>(set.namespace())
                .update_status(&updated)
                .await
                .during(|| format!("updating the status of stateful set {key}"))?;
        }
        applied?;
        let next = util::requeue_for_availability(
            pending,
            by_ordinal.values(),
            spec.min_ready_seconds,
            now,
        );
        Ok(next.map_or(Action::Done, Action::RequeueAfter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        Condition, PodStatus, RollingUpdateStatefulSetStrategy, StatefulSetSpec,
        StatefulSetUpdateStrategy,
    };

    fn set(replicas: i32, policy: &str, partition: i32) -> StatefulSet {
        StatefulSet {
            metadata: Some(ObjectMeta {
                name: "db".into(),
                namespace: "default".into(),
                uid: "s1".into(),
                ..Default::default()
            }),
            spec: Some(StatefulSetSpec {
                replicas: Some(replicas),
                service_name: "db".into(),
                pod_management_policy: policy.into(),
                update_strategy: Some(StatefulSetUpdateStrategy {
                    r#type: "RollingUpdate".into(),
                    rolling_update: Some(RollingUpdateStatefulSetStrategy {
                        partition: Some(partition),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(o: i32, rev: &str, ready: bool) -> (i32, Arc<Pod>) {
        (
            o,
            Arc::new(Pod {
                metadata: Some(ObjectMeta {
                    name: format!("db-{o}"),
                    labels: [(REVISION.to_string(), rev.to_string())].into(),
                    ..Default::default()
                }),
                status: Some(PodStatus {
                    phase: "Running".into(),
                    conditions: vec![Condition {
                        r#type: "Ready".into(),
                        status: if ready { "True" } else { "False" }.into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            }),
        )
    }

    #[test]
    fn ordered_ready_creates_one_at_a_time() {
        let s = set(3, "OrderedReady", 0);
        assert_eq!(plan(&s, &BTreeMap::new(), "r1").create, [0]);
        let one: BTreeMap<_, _> = [pod(0, "r1", false)].into();
        assert_eq!(
            plan(&s, &one, "r1"),
            StatefulSetPlan::default(),
            "waits for db-0 to be ready"
        );
        let one: BTreeMap<_, _> = [pod(0, "r1", true)].into();
        assert_eq!(plan(&s, &one, "r1").create, [1]);
        let parallel = set(3, "Parallel", 0);
        assert_eq!(plan(&parallel, &BTreeMap::new(), "r1").create, [0, 1, 2]);
        let p = pod_for(&s, 2, "r1");
        assert_eq!(p.name(), "db-2");
        let spec = p.spec.unwrap();
        assert_eq!(
            (spec.hostname.as_str(), spec.subdomain.as_str()),
            ("db-2", "db")
        );
    }

    #[test]
    fn scale_down_removes_the_highest_first() {
        let s = set(1, "OrderedReady", 0);
        let pods: BTreeMap<_, _> =
            [pod(0, "r1", true), pod(1, "r1", true), pod(2, "r1", true)].into();
        assert_eq!(plan(&s, &pods, "r1").delete, ["db-2"]);
        let parallel = set(1, "Parallel", 0);
        assert_eq!(plan(&parallel, &pods, "r1").delete, ["db-2", "db-1"]);
    }

    #[test]
    fn rolling_update_goes_down_from_the_highest_to_the_partition() {
        let s = set(3, "OrderedReady", 1);
        let pods: BTreeMap<_, _> =
            [pod(0, "r1", true), pod(1, "r1", true), pod(2, "r1", true)].into();
        assert_eq!(plan(&s, &pods, "r2").delete, ["db-2"]);
        // db-2 recreated on r2 but not ready: wait.
        let pods2: BTreeMap<_, _> =
            [pod(0, "r1", true), pod(1, "r1", true), pod(2, "r2", false)].into();
        assert_eq!(plan(&s, &pods2, "r2"), StatefulSetPlan::default());
        let pods3: BTreeMap<_, _> =
            [pod(0, "r1", true), pod(1, "r1", true), pod(2, "r2", true)].into();
        assert_eq!(plan(&s, &pods3, "r2").delete, ["db-1"]);
        // The partition keeps db-0 on the old revision.
        let pods4: BTreeMap<_, _> =
            [pod(0, "r1", true), pod(1, "r2", true), pod(2, "r2", true)].into();
        assert_eq!(plan(&s, &pods4, "r2"), StatefulSetPlan::default());
        let st = status_of(&s, &pods4, "r2", Utc::now());
        assert_eq!(
            (st.updated_replicas, st.ready_replicas, st.replicas),
            (2, 3, 3)
        );
        assert_eq!(st.update_revision, "r2");
    }

    #[test]
    fn claim_templates_become_claims_and_pod_volumes() {
        let mut s = set(3, "OrderedReady", 0);
        let spec = s.spec.as_mut().unwrap();
        spec.selector = Some(skiff_api::api::LabelSelector {
            match_labels: [("app".to_string(), "db".to_string())].into(),
            ..Default::default()
        });
        spec.volume_claim_templates = vec![skiff_api::api::PersistentVolumeClaim {
            metadata: Some(ObjectMeta {
                name: "data".into(),
                labels: [("tier".to_string(), "storage".to_string())].into(),
                ..Default::default()
            }),
            spec: Some(skiff_api::api::PersistentVolumeClaimSpec {
                access_modes: vec!["ReadWriteOnce".into()],
                ..Default::default()
            }),
            ..Default::default()
        }];
        let claims = claims_for(&s, 2);
        assert_eq!(claims.len(), 1);
        let m = claims[0].metadata.as_ref().unwrap();
        assert_eq!(
            (m.name.as_str(), m.namespace.as_str()),
            ("data-db-2", "default")
        );
        assert_eq!(m.labels["app"], "db");
        assert_eq!(m.labels["tier"], "storage");
        assert!(m.owner_references.is_empty(), "claims outlive the set");
        assert_eq!(
            claims[0].spec.as_ref().unwrap().access_modes,
            ["ReadWriteOnce"]
        );
        let pod = pod_for(&s, 2, "r1");
        let vols = &pod.spec.as_ref().unwrap().volumes;
        assert_eq!(vols.len(), 1);
        assert_eq!(vols[0].name, "data");
        assert_eq!(
            vols[0].persistent_volume_claim.as_ref().unwrap().claim_name,
            "data-db-2"
        );
    }
}
