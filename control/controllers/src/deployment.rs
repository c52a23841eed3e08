//! The Deployment controller: one ReplicaSet per pod template, rolled from old to new.
//!
//! The ReplicaSet whose template equals the Deployment's (ignoring the `pod-template-hash`
//! label) is the *new* one; it is created on demand, named `<deployment>-<hash>`, with the
//! hash in its labels, selector and template, so its pods are told apart from the others'.
//! Each reconcile takes one step and returns; the step's writes trigger the next reconcile:
//!
//! - **RollingUpdate**: scale the new ReplicaSet up while the pods of all ReplicaSets stay
//!   within `replicas + maxSurge`, and the old ones down while at least
//!   `replicas - maxUnavailable` pods stay available (surge rounds up, unavailable down).
//!   Pod counts use the larger of each ReplicaSet's desired and observed replicas, and
//!   availability the smaller of its desired and available replicas, so stale statuses
//!   never let the controller overshoot.
//! - **Recreate**: scale every old ReplicaSet to 0, wait until their pods are gone, then
//!   scale the new one up.
//! - **paused**, or a change of `replicas` alone: only scale (proportionally across the
//!   active ReplicaSets during a rollout), no rollout progress.
//!
//! ReplicaSets carry `deployment.kubernetes.io/revision` (the newest gets the highest; a
//! rollback to an old template re-numbers that ReplicaSet); old ReplicaSets scaled to 0 beyond
//! `revisionHistoryLimit` are deleted once a rollout is complete. The Deployment's annotations
//! (e.g. `kubernetes.io/change-cause`) are copied to its new ReplicaSet, except
//! [`NOT_COPIED_ANNOTATIONS`]; scaling is reported as `ScalingReplicaSet` events. The revision
//! and annotation rules live in [`skiff_api::wellknown`], which `skiff rollout` uses too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use skiff_api::Resource;
use skiff_api::api::{
    Condition, Deployment, DeploymentStatus, LabelSelector, ObjectMeta, Pod, ReplicaSet,
    ReplicaSetSpec,
};
use skiff_api::selector::Selector;
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, EventType, Informer, Informers, ObjectKey,
    Reconciler, controller_of,
};
use skiff_client::{Client, DeleteParams};

use skiff_api::wellknown::{
    DESIRED_REPLICAS, MAX_REPLICAS, NOT_COPIED_ANNOTATIONS, POD_TEMPLATE_HASH, REVISION,
    revision_of, templates_equal,
};

use crate::util::{
    self, annotation, controller_ref, format_time, is_terminating, labels, parse_time,
    pod_template_hash, resolve_fenceposts, workload_selector,
};
use crate::{Context, Error};

/// Copies `d`'s annotations (except [`NOT_COPIED_ANNOTATIONS`]) onto `rs`, as the
/// Kubernetes controller does for the new ReplicaSet; returns whether `rs` changed.
/// Annotations only `rs` has are kept.
fn copy_annotations(d: &Deployment, rs: &mut ReplicaSet) -> bool {
    let Some(from) = d.metadata().map(|m| &m.annotations) else {
        return false;
    };
    let to = &mut rs.metadata_mut().annotations;
    let mut changed = false;
    for (k, v) in from {
        if NOT_COPIED_ANNOTATIONS.contains(&k.as_str()) || to.get(k) == Some(v) {
            continue;
        }
        to.insert(k.clone(), v.clone());
        changed = true;
    }
    changed
}

/// How long a reconcile waits for the informer to show the ReplicaSet writes of the previous
/// one before going ahead with what it has.
const CATCH_UP: Duration = Duration::from_secs(2);

/// `spec.replicas` of a ReplicaSet (the API server defaults it to 1).
pub fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn observed_replicas(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().map(|s| s.replicas).unwrap_or(0)
}

/// Pods of `rs` that may exist: desired or observed, whichever is more.
fn pod_upper_bound(rs: &ReplicaSet) -> i32 {
    rs_replicas(rs).max(observed_replicas(rs))
}

/// Available pods of `rs` that will remain: available but no more than desired.
fn available_lower_bound(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .map(|s| s.available_replicas)
        .unwrap_or(0)
        .min(rs_replicas(rs))
        .max(0)
}

fn d_replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn is_recreate(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .is_some_and(|s| s.r#type == "Recreate")
}

fn is_paused(d: &Deployment) -> bool {
    d.spec.as_ref().is_some_and(|s| s.paused)
}

/// (maxSurge, maxUnavailable) of `d` as pod counts; Recreate has neither.
pub fn fenceposts(d: &Deployment) -> (i32, i32) {
    if is_recreate(d) {
        return (0, 0);
    }
    let ru = d
        .spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref());
    let surge = ru.and_then(|r| r.max_surge.as_deref()).or(Some("25%"));
    let unavailable = ru
        .and_then(|r| r.max_unavailable.as_deref())
        .or(Some("25%"));
    // The API server validated both; fall back to the defaults' effect if not.
    resolve_fenceposts(surge, unavailable, d_replicas(d)).unwrap_or((1, 0))
}

/// The ReplicaSets of a Deployment: the new one (if any) and the old ones, oldest first.
#[derive(Debug, Default)]
struct Sets {
    new: Option<ReplicaSet>,
    olds: Vec<ReplicaSet>,
}

impl Sets {
    fn all(&self) -> impl Iterator<Item = &ReplicaSet> {
        self.olds.iter().chain(self.new.iter())
    }
}

fn by_age(a: &ReplicaSet, b: &ReplicaSet) -> std::cmp::Ordering {
    (util::creation_timestamp(a), revision_of(a), a.name()).cmp(&(
        util::creation_timestamp(b),
        revision_of(b),
        b.name(),
    ))
}

/// The reconciler of Deployments.
pub struct DeploymentController {
    client: Client,
    recorder: EventRecorder,
    deployments: Informer<Deployment>,
    replica_sets: Informer<ReplicaSet>,
    pods: Informer<Pod>,
    /// The resourceVersion of the last ReplicaSet write per Deployment.
    last_write: Mutex<HashMap<ObjectKey, u64>>,
}

impl std::fmt::Debug for DeploymentController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeploymentController")
            .finish_non_exhaustive()
    }
}

impl DeploymentController {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        DeploymentController {
            client: informers.client().clone(),
            recorder,
            deployments: informers.get::<Deployment>(),
            replica_sets: informers.get::<ReplicaSet>(),
            pods: informers.get::<Pod>(),
            last_write: Mutex::default(),
        }
    }

    /// The controller: Deployments, their ReplicaSets, orphan ReplicaSets their selectors
    /// match, and (for Recreate) the pods of their ReplicaSets.
    pub fn controller(informers: &Informers) -> Controller<Deployment> {
        let deployments = informers.get::<Deployment>();
        let replica_sets = informers.get::<ReplicaSet>();
        let pods = informers.get::<Pod>();
        let orphan_owners = {
            let deployments = deployments.clone();
            move |rs: &ReplicaSet| {
                if controller_of(rs).is_some() {
                    return Vec::new();
                }
                deployments
                    .by_namespace(rs.namespace())
                    .iter()
                    .filter(|d| {
                        workload_selector(d.spec.as_ref().and_then(|s| s.selector.as_ref()))
                            .is_ok_and(|sel| sel.matches(labels(rs)))
                    })
                    .map(|d| ObjectKey::of(&**d))
                    .collect()
            }
        };
        let recreate_owner = move |pod: &Pod| {
            let Some(rs_ref) = controller_of(pod).filter(|r| r.kind == "ReplicaSet") else {
                return Vec::new();
            };
            let Some(rs) = replica_sets.get(&ObjectKey::new(pod.namespace(), &rs_ref.name)) else {
                return Vec::new();
            };
            controller_of(&*rs)
                .filter(|r| r.kind == "Deployment")
                .map(|r| ObjectKey::new(pod.namespace(), &r.name))
                .filter(|k| deployments.get(k).is_some_and(|d| is_recreate(&d)))
                .into_iter()
                .collect()
        };
        let rs_informer = informers.get::<ReplicaSet>();
        Controller::<Deployment>::new(informers)
            .named("deployment")
            .watches_owned::<ReplicaSet>()
            .watches(&rs_informer, orphan_owners)
            .watches(&pods, recreate_owner)
    }

    /// Runs the Deployment controller with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(DeploymentController::new(informers, recorder));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    fn wrote(&self, key: &ObjectKey, rs: &ReplicaSet) {
        if let Ok(rv) = rs.resource_version().parse::<u64>() {
            let mut w = self.last_write.lock().unwrap_or_else(|e| e.into_inner());
            let e = w.entry(key.clone()).or_insert(0);
            *e = (*e).max(rv);
        }
    }

    /// Waits (briefly) until the ReplicaSet informer shows our last writes for `key`.
    async fn catch_up(&self, key: &ObjectKey) {
        let rev = self
            .last_write
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied();
        if let Some(rev) = rev
            && self.replica_sets.revision() < rev
            && tokio::time::timeout(CATCH_UP, self.replica_sets.wait_for_revision(rev))
                .await
                .is_err()
        {
            tracing::debug!(deployment = %key, rev, "replica set informer is behind, going on");
        }
    }

    /// The ReplicaSets `d` controls, after adopting matching orphans and releasing those its
    /// selector no longer matches.
    async fn claim_replica_sets(
        &self,
        d: &Deployment,
        selector: &Selector,
    ) -> Result<Vec<ReplicaSet>, Error> {
        let ns = d.namespace();
        let api = self.client.namespaced::<ReplicaSet>(ns);
        let mut owned = Vec::new();
        for rs in self.replica_sets.by_owner(util::uid(d)) {
            if rs.namespace() != ns {
                continue;
            }
            if selector.matches(labels(&*rs)) {
                owned.push((*rs).clone());
            } else {
                let mut released = (*rs).clone();
                let d_uid = util::uid(d).to_string();
                released
                    .metadata_mut()
                    .owner_references
                    .retain(|o| o.uid != d_uid);
                match api.update(&released).await {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        return Err(e).during(|| format!("releasing replica set {}", rs.name()));
                    }
                }
            }
        }
        for rs in self.replica_sets.select(Some(ns), selector) {
            if controller_of(&*rs).is_some() || is_terminating(&*rs) {
                continue;
            }
            let mut adopted = (*rs).clone();
            adopted
                .metadata_mut()
                .owner_references
                .push(controller_ref(d));
            match api.update(&adopted).await {
                Ok(rs) => {
                    tracing::info!(deployment = d.name(), replicaset = rs.name(), "adopted");
                    owned.push(rs);
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    return Err(e).during(|| format!("adopting replica set {}", rs.name()));
                }
            }
        }
        owned.sort_by(by_age);
        Ok(owned)
    }

    /// Splits `list` into the new ReplicaSet and the old ones; creates the new one when
    /// `create` and it is missing; keeps revisions and the Deployment's revision annotation
    /// in step.
    async fn sets(
        &self,
        key: &ObjectKey,
        d: &mut Deployment,
        list: Vec<ReplicaSet>,
        create: bool,
    ) -> Result<Sets, Error> {
        let template = d.spec.as_ref().and_then(|s| s.template.as_ref());
        let mut new = None;
        let mut olds = Vec::new();
        for rs in list {
            let matches =
                templates_equal(rs.spec.as_ref().and_then(|s| s.template.as_ref()), template);
            if matches && new.is_none() {
                new = Some(rs);
            } else {
                olds.push(rs);
            }
        }
        let next_revision = olds.iter().map(revision_of).max().unwrap_or(0) + 1;
        let mut sets = Sets { new, olds };
        let api = self.client.namespaced::<ReplicaSet>(d.namespace());
        match sets.new.as_mut() {
            Some(rs) => {
                let min_ready = d.spec.as_ref().map(|s| s.min_ready_seconds).unwrap_or(0);
                let stale_revision = revision_of(rs) < next_revision;
                let stale_min_ready =
                    rs.spec.as_ref().map(|s| s.min_ready_seconds).unwrap_or(0) != min_ready;
                let mut updated = rs.clone();
                let stale_annotations = copy_annotations(d, &mut updated);
                if stale_revision || stale_min_ready || stale_annotations {
                    if stale_revision {
                        updated
                            .metadata_mut()
                            .annotations
                            .insert(REVISION.into(), next_revision.to_string());
                    }
                    updated
                        .spec
                        .get_or_insert_with(ReplicaSetSpec::default)
                        .min_ready_seconds = min_ready;
                    *rs = api
                        .update(&updated)
                        .await
                        .during(|| format!("updating replica set {}", rs.name()))?;
                    self.wrote(key, rs);
                }
            }
            None if create => {
                let rs = self.create_new(key, d, &sets, next_revision).await?;
                sets.new = Some(rs);
            }
            None => {}
        }
        if let Some(rs) = &sets.new {
            self.set_revision(d, revision_of(rs)).await?;
        }
        Ok(sets)
    }

    /// Sets the Deployment's revision annotation to `revision`.
    async fn set_revision(&self, d: &mut Deployment, revision: i64) -> Result<(), Error> {
        let value = revision.to_string();
        if annotation(d, REVISION) == Some(value.as_str()) {
            return Ok(());
        }
        let mut updated = d.clone();
        updated
            .metadata_mut()
            .annotations
            .insert(REVISION.into(), value);
        *d = self
            .client
            .namespaced::<Deployment>(d.namespace())
            .update(&updated)
            .await
            .during(|| format!("updating the revision of deployment {}", d.name()))?;
        Ok(())
    }

    /// Creates the ReplicaSet of `d`'s current template.
    async fn create_new(
        &self,
        key: &ObjectKey,
        d: &mut Deployment,
        sets: &Sets,
        revision: i64,
    ) -> Result<ReplicaSet, Error> {
        let spec = d.spec.clone().unwrap_or_default();
        let collisions = d.status.as_ref().and_then(|s| s.collision_count);
        let mut template = spec.template.clone().unwrap_or_default();
        let hash = pod_template_hash(&template, collisions);
        let tm = template.metadata.get_or_insert_with(ObjectMeta::default);
        tm.labels.insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let rs_labels = tm.labels.clone();
        let mut selector = spec.selector.clone().unwrap_or_default();
        selector
            .match_labels
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let replicas = self.new_replicas(d, sets, 0);
        let (surge, _) = fenceposts(d);
        let name = format!("{}-{hash}", d.name());
        let mut rs = ReplicaSet {
            metadata: Some(ObjectMeta {
                name: name.clone(),
                namespace: d.namespace().to_string(),
                labels: rs_labels,
                annotations: [
                    (REVISION.to_string(), revision.to_string()),
                    (DESIRED_REPLICAS.to_string(), d_replicas(d).to_string()),
                    (
                        MAX_REPLICAS.to_string(),
                        (d_replicas(d) + surge).to_string(),
                    ),
                ]
                .into(),
                owner_references: vec![controller_ref(d)],
                ..Default::default()
            }),
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                min_ready_seconds: spec.min_ready_seconds,
                selector: Some(LabelSelector {
                    match_labels: selector.match_labels,
                    match_expressions: selector.match_expressions,
                }),
                template: Some(template),
            }),
            ..Default::default()
        };
        copy_annotations(d, &mut rs);
        let api = self.client.namespaced::<ReplicaSet>(d.namespace());
        match api.create(&rs).await {
            Ok(created) => {
                self.wrote(key, &created);
                tracing::info!(deployment = %key, replicaset = %name, replicas, "created new replica set");
                if replicas > 0 {
                    self.recorder
                        .publish(
                            d,
                            EventType::Normal,
                            "ScalingReplicaSet",
                            &format!("Scaled up replica set {name} from 0 to {replicas}"),
                        )
                        .await;
                }
                Ok(created)
            }
            Err(e) if e.is_already_exists() => {
                let existing = api
                    .get(&name)
                    .await
                    .during(|| format!("reading replica set {name}"))?;
                let ours = controller_of(&existing).is_some_and(|r| r.uid == util::uid(d));
                let same = templates_equal(
                    existing.spec.as_ref().and_then(|s| s.template.as_ref()),
                    spec.template.as_ref(),
                );
                if ours && same {
                    // Our informer had not seen it yet.
                    return Ok(existing);
                }
                let mut updated = d.clone();
                let status = updated.status.get_or_insert_with(DeploymentStatus::default);
                status.collision_count = Some(collisions.unwrap_or(0).saturating_add(1));
                *d = self
                    .client
                    .namespaced::<Deployment>(d.namespace())
                    .update_status(&updated)
                    .await
                    .during(|| format!("updating the collision count of {key}"))?;
                Err(Error::HashCollision(name))
            }
            Err(e) => Err(e).during(|| format!("creating replica set {name}")),
        }
    }

    /// What the new ReplicaSet (now at `current`) may be scaled to.
    fn new_replicas(&self, d: &Deployment, sets: &Sets, current: i32) -> i32 {
        let replicas = d_replicas(d);
        if is_recreate(d) {
            return replicas;
        }
        let (surge, _) = fenceposts(d);
        let pods: i32 = sets.all().map(pod_upper_bound).sum();
        let max_total = replicas + surge;
        if pods >= max_total {
            return current;
        }
        current + (max_total - pods).min(replicas - current).max(0)
    }

    /// Sets `rs`'s replicas to `target` (and the scaling annotations); returns whether the
    /// replica count changed.
    async fn scale(
        &self,
        key: &ObjectKey,
        d: &Deployment,
        rs: &mut ReplicaSet,
        target: i32,
    ) -> Result<bool, Error> {
        let (surge, _) = fenceposts(d);
        let desired = d_replicas(d).to_string();
        let max = (d_replicas(d) + surge).to_string();
        let from = rs_replicas(rs);
        let resize = from != target;
        let annotate = annotation(rs, DESIRED_REPLICAS) != Some(desired.as_str())
            || annotation(rs, MAX_REPLICAS) != Some(max.as_str());
        if !resize && !annotate {
            return Ok(false);
        }
        let mut updated = rs.clone();
        updated
            .spec
            .get_or_insert_with(ReplicaSetSpec::default)
            .replicas = Some(target);
        let ann = &mut updated.metadata_mut().annotations;
        ann.insert(DESIRED_REPLICAS.into(), desired);
        ann.insert(MAX_REPLICAS.into(), max);
        *rs = self
            .client
            .namespaced::<ReplicaSet>(rs.namespace())
            .update(&updated)
            .await
            .during(|| format!("scaling replica set {}", rs.name()))?;
        self.wrote(key, rs);
        if resize {
            let dir = if target > from { "up" } else { "down" };
            tracing::info!(deployment = %key, replicaset = rs.name(), from, to = target, "scaled");
            self.recorder
                .publish(
                    d,
                    EventType::Normal,
                    "ScalingReplicaSet",
                    &format!(
                        "Scaled {dir} replica set {} from {from} to {target}",
                        rs.name()
                    ),
                )
                .await;
        }
        Ok(resize)
    }

    /// Whether `d.replicas` changed since the active ReplicaSets were last scaled.
    fn is_scaling_event(d: &Deployment, list: &[ReplicaSet]) -> bool {
        let want = d_replicas(d);
        list.iter().filter(|rs| rs_replicas(rs) > 0).any(|rs| {
            annotation(rs, DESIRED_REPLICAS)
                .and_then(|v| v.parse::<i32>().ok())
                .is_some_and(|desired| desired != want)
        })
    }

    /// Scaling without rollout progress (paused, or only `replicas` changed).
    async fn scale_only(
        &self,
        key: &ObjectKey,
        d: &Deployment,
        sets: &mut Sets,
    ) -> Result<(), Error> {
        let replicas = d_replicas(d);
        let active = sets.all().filter(|rs| rs_replicas(rs) > 0).count();
        if active <= 1 {
            // The one active ReplicaSet, or else the newest one, gets every replica.
            let target = match sets.new.as_mut() {
                Some(new) if active == 0 || rs_replicas(new) > 0 => Some(new),
                _ => {
                    let newest_old = sets.olds.iter_mut().rev();
                    let mut pick = None;
                    for rs in newest_old {
                        if active == 0 || rs_replicas(rs) > 0 {
                            pick = Some(rs);
                            break;
                        }
                    }
                    pick
                }
            };
            if let Some(rs) = target {
                self.scale(key, d, rs, replicas).await?;
            }
            return Ok(());
        }
        if let Some(new) = &sets.new
            && rs_replicas(new) == replicas
            && new.status.as_ref().map(|s| s.available_replicas) == Some(replicas)
        {
            for rs in &mut sets.olds {
                if rs_replicas(rs) > 0 {
                    self.scale(key, d, rs, 0).await?;
                }
            }
            return Ok(());
        }
        if is_recreate(d) {
            return Ok(());
        }
        // Spread the change over the active ReplicaSets in proportion to their sizes.
        let (surge, _) = fenceposts(d);
        let allowed = replicas + surge;
        let mut active: Vec<&mut ReplicaSet> = sets
            .olds
            .iter_mut()
            .chain(sets.new.iter_mut())
            .filter(|rs| rs_replicas(rs) > 0)
            .collect();
        let total: i32 = active.iter().map(|rs| rs_replicas(rs)).sum();
        let to_add = allowed - total;
        // Largest first; newer first when growing, older first when shrinking.
        active.reverse();
        active.sort_by_key(|rs| std::cmp::Reverse(rs_replicas(rs)));
        if to_add < 0 {
            active.sort_by(|a, b| rs_replicas(b).cmp(&rs_replicas(a)).then(by_age(a, b)));
        }
        let mut targets = Vec::with_capacity(active.len());
        let mut added = 0;
        for rs in &active {
            let share = if total > 0 {
                i32::try_from(i64::from(rs_replicas(rs)) * i64::from(to_add) / i64::from(total))
                    .unwrap_or(0)
            } else {
                0
            };
            let share = if to_add > 0 {
                share.min(to_add - added)
            } else {
                share.max(to_add - added)
            };
            added += share;
            targets.push(rs_replicas(rs) + share);
        }
        if let Some(first) = targets.first_mut() {
            *first += to_add - added;
        }
        for (rs, target) in active.into_iter().zip(targets) {
            self.scale(key, d, rs, target.max(0)).await?;
        }
        Ok(())
    }

    /// Scales the new ReplicaSet towards `replicas` within the surge budget.
    async fn reconcile_new(
        &self,
        key: &ObjectKey,
        d: &Deployment,
        sets: &mut Sets,
    ) -> Result<bool, Error> {
        let Some(current) = sets.new.as_ref().map(rs_replicas) else {
            return Ok(false);
        };
        let replicas = d_replicas(d);
        let target = if current > replicas {
            replicas
        } else {
            self.new_replicas(d, sets, current)
        };
        if target == current {
            return Ok(false);
        }
        match sets.new.as_mut() {
            Some(new) => self.scale(key, d, new, target).await,
            None => Ok(false),
        }
    }

    /// Scales old ReplicaSets down as far as availability allows: first their unavailable
    /// pods, then available ones down to `replicas - maxUnavailable`.
    async fn reconcile_old(
        &self,
        key: &ObjectKey,
        d: &Deployment,
        sets: &mut Sets,
    ) -> Result<bool, Error> {
        let old_pods: i32 = sets.olds.iter().map(rs_replicas).sum();
        if old_pods == 0 {
            return Ok(false);
        }
        let all_pods: i32 = sets.all().map(rs_replicas).sum();
        let (_, max_unavailable) = fenceposts(d);
        let min_available = d_replicas(d) - max_unavailable;
        let new_unavailable = sets
            .new
            .as_ref()
            .map(|n| rs_replicas(n) - available_lower_bound(n))
            .unwrap_or(0);
        let max_scaled_down = all_pods - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return Ok(false);
        }
        let mut done = 0;
        // Unhealthy pods first: removing them costs no availability.
        for rs in &mut sets.olds {
            if done >= max_scaled_down {
                break;
            }
            let r = rs_replicas(rs);
            let unhealthy = r - available_lower_bound(rs);
            if r == 0 || unhealthy <= 0 {
                continue;
            }
            let down = unhealthy.min(max_scaled_down - done);
            self.scale(key, d, rs, r - down).await?;
            done += down;
        }
        let available: i32 = sets.all().map(available_lower_bound).sum();
        let budget = (available - min_available).min(max_scaled_down - done);
        let mut scaled = 0;
        for rs in &mut sets.olds {
            if scaled >= budget {
                break;
            }
            let r = rs_replicas(rs);
            if r == 0 {
                continue;
            }
            let down = r.min(budget - scaled);
            self.scale(key, d, rs, r - down).await?;
            scaled += down;
        }
        Ok(done + scaled > 0)
    }

    /// Whether any pod of an old ReplicaSet still runs (Recreate waits for none).
    fn old_pods_running(&self, sets: &Sets) -> bool {
        sets.olds.iter().any(|rs| {
            observed_replicas(rs) > 0
                || self.pods.by_owner(util::uid(rs)).iter().any(|p| {
                    !matches!(
                        p.status.as_ref().map(|s| s.phase.as_str()),
                        Some("Succeeded" | "Failed")
                    )
                })
        })
    }

    /// Deletes old ReplicaSets scaled to 0 beyond `revisionHistoryLimit`, oldest first.
    async fn cleanup(&self, d: &Deployment, sets: &Sets) -> Result<(), Error> {
        let limit = d
            .spec
            .as_ref()
            .and_then(|s| s.revision_history_limit)
            .unwrap_or(10)
            .max(0);
        let mut idle: Vec<&ReplicaSet> = sets
            .olds
            .iter()
            .filter(|rs| {
                rs_replicas(rs) == 0
                    && observed_replicas(rs) == 0
                    && !is_terminating(*rs)
                    && rs
                        .status
                        .as_ref()
                        .map(|s| s.observed_generation)
                        .unwrap_or(0)
                        >= util::generation(*rs)
            })
            .collect();
        let excess = idle
            .len()
            .saturating_sub(usize::try_from(limit).unwrap_or(0));
        if excess == 0 {
            return Ok(());
        }
        idle.sort_by_key(|rs| (revision_of(*rs), util::creation_timestamp(*rs).to_string()));
        let api = self.client.namespaced::<ReplicaSet>(d.namespace());
        for rs in idle.into_iter().take(excess) {
            tracing::info!(
                deployment = d.name(),
                replicaset = rs.name(),
                "deleting old replica set"
            );
            match api.delete(rs.name(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e).during(|| format!("deleting replica set {}", rs.name())),
            }
        }
        Ok(())
    }

    /// Writes the Deployment's status; returns when to look again (progress deadline).
    async fn sync_status(&self, d: &Deployment, sets: &Sets) -> Result<Option<Duration>, Error> {
        let now = Utc::now();
        let replicas = d_replicas(d);
        let (_, max_unavailable) = fenceposts(d);
        let old = d.status.clone().unwrap_or_default();
        let mut status = DeploymentStatus {
            observed_generation: util::generation(d),
            replicas: sets.all().map(observed_replicas).sum(),
            updated_replicas: sets.new.as_ref().map(observed_replicas).unwrap_or(0),
            ready_replicas: sets
                .all()
                .map(|rs| rs.status.as_ref().map(|s| s.ready_replicas).unwrap_or(0))
                .sum(),
            available_replicas: sets
                .all()
                .map(|rs| {
                    rs.status
                        .as_ref()
                        .map(|s| s.available_replicas)
                        .unwrap_or(0)
                })
                .sum(),
            unavailable_replicas: 0,
            conditions: old.conditions.clone(),
            collision_count: old.collision_count,
        };
        let desired_pods: i32 = sets.all().map(rs_replicas).sum();
        status.unavailable_replicas = (desired_pods - status.available_replicas).max(0);
        let complete = status.updated_replicas == replicas
            && status.replicas == replicas
            && status.available_replicas == replicas
            && sets.olds.iter().all(|rs| rs_replicas(rs) == 0);
        let stamp = format_time(now);
        let available = status.available_replicas >= replicas - max_unavailable;
        util::set_condition(
            &mut status.conditions,
            Condition {
                r#type: "Available".into(),
                status: if available { "True" } else { "False" }.into(),
                reason: if available {
                    "MinimumReplicasAvailable"
                } else {
                    "MinimumReplicasUnavailable"
                }
                .into(),
                message: if available {
                    "Deployment has minimum availability."
                } else {
                    "Deployment does not have minimum availability."
                }
                .into(),
                last_transition_time: stamp.clone(),
                last_update_time: stamp.clone(),
                ..Default::default()
            },
        );
        let new_name = sets.new.as_ref().map(|rs| rs.name()).unwrap_or("");
        let deadline = d
            .spec
            .as_ref()
            .and_then(|s| s.progress_deadline_seconds)
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(s.unsigned_abs().into()));
        let progressed = (
            status.replicas,
            status.updated_replicas,
            status.ready_replicas,
            status.available_replicas,
        ) != (
            old.replicas,
            old.updated_replicas,
            old.ready_replicas,
            old.available_replicas,
        );
        let previous = old
            .conditions
            .iter()
            .find(|c| c.r#type == "Progressing")
            .cloned();
        let mut requeue = None;
        let (cstatus, reason, message) = if is_paused(d) {
            (
                "Unknown",
                "DeploymentPaused",
                "Deployment is paused".to_string(),
            )
        } else if complete {
            (
                "True",
                "NewReplicaSetAvailable",
                format!("ReplicaSet \"{new_name}\" has successfully progressed."),
            )
        } else {
            let since = previous
                .as_ref()
                .filter(|c| c.reason == "ReplicaSetUpdated" && !progressed)
                .and_then(|c| parse_time(&c.last_update_time));
            let elapsed = since.and_then(|t| (now - t).to_std().ok());
            match (deadline, elapsed) {
                (Some(limit), Some(e)) if e >= limit => (
                    "False",
                    "ProgressDeadlineExceeded",
                    format!("ReplicaSet \"{new_name}\" has timed out progressing."),
                ),
                (Some(limit), e) => {
                    requeue =
                        Some(limit.saturating_sub(e.unwrap_or_default()) + Duration::from_secs(1));
                    (
                        "True",
                        "ReplicaSetUpdated",
                        format!("ReplicaSet \"{new_name}\" is progressing."),
                    )
                }
                (None, _) => (
                    "True",
                    "ReplicaSetUpdated",
                    format!("ReplicaSet \"{new_name}\" is progressing."),
                ),
            }
        };
        let mut progressing = Condition {
            r#type: "Progressing".into(),
            status: cstatus.into(),
            reason: reason.into(),
            message,
            last_transition_time: stamp.clone(),
            last_update_time: stamp.clone(),
            ..Default::default()
        };
        let changed = util::set_condition(&mut status.conditions, progressing.clone());
        if progressed && !changed {
            // Progress was made: move lastUpdateTime, which the deadline counts from.
            if let Some(c) = status
                .conditions
                .iter_mut()
                .find(|c| c.r#type == "Progressing")
            {
                progressing.last_transition_time = c.last_transition_time.clone();
                *c = progressing;
            }
        }
        if d.status.as_ref() != Some(&status) {
            let mut updated = d.clone();
            updated.status = Some(status);
            self.client
                .namespaced::<Deployment>(d.namespace())
                .update_status(&updated)
                .await
                .during(|| format!("updating the status of deployment {}", d.name()))?;
        }
        Ok(requeue)
    }

    async fn rollout_rolling(
        &self,
        key: &ObjectKey,
        d: &mut Deployment,
        list: Vec<ReplicaSet>,
    ) -> Result<Option<Duration>, Error> {
        let mut sets = self.sets(key, d, list, true).await?;
        if self.reconcile_new(key, d, &mut sets).await? {
            return self.sync_status(d, &sets).await;
        }
        if self.reconcile_old(key, d, &mut sets).await? {
            return self.sync_status(d, &sets).await;
        }
        let requeue = self.sync_status(d, &sets).await?;
        if d_replicas(d) == sets.new.as_ref().map(observed_replicas).unwrap_or(-1)
            && sets.olds.iter().all(|rs| rs_replicas(rs) == 0)
        {
            self.cleanup(d, &sets).await?;
        }
        Ok(requeue)
    }

    async fn rollout_recreate(
        &self,
        key: &ObjectKey,
        d: &mut Deployment,
        list: Vec<ReplicaSet>,
    ) -> Result<Option<Duration>, Error> {
        let mut sets = self.sets(key, d, list, false).await?;
        let mut scaled = false;
        for rs in &mut sets.olds {
            if rs_replicas(rs) > 0 {
                scaled |= self.scale(key, d, rs, 0).await?;
            }
        }
        if scaled || self.old_pods_running(&sets) {
            return self.sync_status(d, &sets).await;
        }
        let olds = std::mem::take(&mut sets.olds);
        let mut list = olds;
        list.extend(sets.new.take());
        let mut sets = self.sets(key, d, list, true).await?;
        if let Some(new) = sets.new.as_mut() {
            let replicas = d_replicas(d);
            if rs_replicas(new) != replicas {
                self.scale(key, d, new, replicas).await?;
                return self.sync_status(d, &sets).await;
            }
        }
        let requeue = self.sync_status(d, &sets).await?;
        if d_replicas(d) == sets.new.as_ref().map(observed_replicas).unwrap_or(-1) {
            self.cleanup(d, &sets).await?;
        }
        Ok(requeue)
    }
}

impl Reconciler for DeploymentController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        self.catch_up(key).await;
        let Some(d) = self.deployments.get(key) else {
            self.last_write
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(key);
            return Ok(Action::Done);
        };
        let mut d = (*d).clone();
        if is_terminating(&d) {
            return Ok(Action::Done);
        }
        let selector = match workload_selector(d.spec.as_ref().and_then(|s| s.selector.as_ref())) {
            Ok(s) => s,
            Err(e) => {
                self.recorder
                    .publish(&d, EventType::Warning, "InvalidSelector", &e)
                    .await;
                return Ok(Action::Done);
            }
        };
        let list = self.claim_replica_sets(&d, &selector).await?;
        let requeue = if is_paused(&d) || Self::is_scaling_event(&d, &list) {
            let mut sets = self.sets(key, &mut d, list, false).await?;
            self.scale_only(key, &d, &mut sets).await?;
            let requeue = self.sync_status(&d, &sets).await?;
            if is_paused(&d) {
                self.cleanup(&d, &sets).await?;
            }
            requeue
        } else if is_recreate(&d) {
            self.rollout_recreate(key, &mut d, list).await?
        } else {
            self.rollout_rolling(key, &mut d, list).await?
        };
        Ok(requeue.map_or(Action::Done, Action::RequeueAfter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::wellknown::CHANGE_CAUSE;

    fn with_annotations<T: Resource + Default>(pairs: &[(&str, &str)]) -> T {
        let mut o = T::default();
        o.metadata_mut().annotations = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        o
    }

    #[test]
    fn annotations_copied_to_the_replica_set_except_its_own() {
        let d: Deployment = with_annotations(&[
            (CHANGE_CAUSE, "image v2"),
            (REVISION, "7"),
            ("skiff.io/last-applied-configuration", "{}"),
            ("team", "web"),
        ]);
        let mut rs: ReplicaSet = with_annotations(&[(REVISION, "2"), ("rs-only", "x")]);
        assert!(copy_annotations(&d, &mut rs));
        let got = &rs.metadata.as_ref().unwrap().annotations;
        assert_eq!(got[CHANGE_CAUSE], "image v2");
        assert_eq!(got["team"], "web");
        assert_eq!(got[REVISION], "2", "the revision is the replica set's own");
        assert_eq!(got["rs-only"], "x");
        assert!(!got.contains_key("skiff.io/last-applied-configuration"));
        assert!(!copy_annotations(&d, &mut rs), "nothing left to copy");
    }
}
