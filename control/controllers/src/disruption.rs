//! The disruption controller: the status of every PodDisruptionBudget, which the API
//! server's eviction subresource reads (Kubernetes' `disruption` controller).
//!
//! For a budget: the pods its selector picks in its namespace (an empty selector picks them
//! all, as in policy/v1); `expectedPods` is their number for an integer `minAvailable`, else
//! the scale of their controllers (a Deployment's replicas for its ReplicaSets' pods, a
//! ReplicaSet's or StatefulSet's replicas, a DaemonSet's desired count; an orphan or an
//! unknown controller is `CalculateExpectedPodCountFailed`, nothing allowed); `desiredHealthy`
//! is `minAvailable` (a percentage rounded up) or expected minus `maxUnavailable` (rounded
//! up);
//! `currentHealthy` counts the ready pods not being deleted and not just evicted
//! (`disruptedPods`, kept until the pod is seen going, at most 2 minutes);
//! `disruptionsAllowed` is the difference, never negative, with the `DisruptionAllowed`
//! condition. Level-triggered from the budgets, the pods and their controllers.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use skiff_api::Resource;
use skiff_api::api::{
    Condition, DaemonSet, Deployment, Pod, PodDisruptionBudget, PodDisruptionBudgetStatus,
    ReplicaSet, StatefulSet,
};
use skiff_api::selector::Selector;
use skiff_client::Client;
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, EventType, Informer, Informers, ObjectKey,
    Reconciler, controller_of,
};

use crate::util::{self, format_time, is_terminating, labels, parse_time, scaled_value};
use crate::{Context, Error};

/// How long an eviction counts against the budget before the pod is seen going.
const DISRUPTION_TIMEOUT: Duration = Duration::from_secs(120);

/// The pods a budget's selector picks, in its namespace; `Err` for a malformed selector.
fn selected(pdb: &PodDisruptionBudget, pods: &Informer<Pod>) -> Result<Vec<Arc<Pod>>, String> {
    let sel = pdb
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .map(Selector::from_label_selector)
        .transpose()
        .map_err(|e| e.to_string())?;
    Ok(match sel {
        Some(sel) => pods.select(Some(pdb.namespace()), &sel),
        None => Vec::new(),
    })
}

/// How many pods a budget expects and how many must stay healthy, given its pods and the
/// scale of their controllers (`scale_of`: controller uid → replicas).
pub fn expected_and_desired(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    scale_of: impl Fn(&Pod) -> Result<(String, i32), String>,
) -> Result<(i32, i32), String> {
    let spec = pdb.spec.clone().unwrap_or_default();
    let count = i32::try_from(pods.len()).unwrap_or(i32::MAX);
    let controllers_scale = || -> Result<i32, String> {
        let mut seen = HashSet::new();
        let mut total = 0;
        for p in pods {
            let (uid, scale) = scale_of(p)?;
            if seen.insert(uid) {
                total += scale;
            }
        }
        Ok(total)
    };
    match (
        spec.min_available.as_deref(),
        spec.max_unavailable.as_deref(),
    ) {
        (Some(min), None) if !min.trim().ends_with('%') => {
            Ok((count, scaled_value(Some(min), count, true)?))
        }
        (Some(min), None) => {
            let expected = controllers_scale()?;
            Ok((expected, scaled_value(Some(min), expected, true)?))
        }
        (None, Some(max)) => {
            let expected = controllers_scale()?;
            let unavailable = scaled_value(Some(max), expected, true)?;
            Ok((expected, (expected - unavailable).max(0)))
        }
        // Neither (or both, which validation refuses): nothing is required.
        _ => Ok((count, 0)),
    }
}

/// The budget's status from its pods at `now` (pure): the disrupted pods still pending,
/// healthy count, allowed disruptions, the condition; and when the earliest disrupted pod
/// entry expires.
pub fn status_of(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    expected: i32,
    desired: i32,
    now: DateTime<Utc>,
) -> (PodDisruptionBudgetStatus, Option<Duration>) {
    let old = pdb.status.clone().unwrap_or_default();
    let by_name: BTreeMap<&str, &Arc<Pod>> = pods.iter().map(|p| (p.name(), p)).collect();
    let mut disrupted = BTreeMap::new();
    let mut next_expiry: Option<Duration> = None;
    for (name, at) in &old.disrupted_pods {
        let Some(pod) = by_name.get(name.as_str()) else {
            continue;
        };
        if is_terminating(&***pod) {
            continue;
        }
        let Some(at_t) = parse_time(at) else {
            continue;
        };
        let age = (now - at_t).to_std().unwrap_or_default();
        if age >= DISRUPTION_TIMEOUT {
            continue;
        }
        let left = DISRUPTION_TIMEOUT - age;
        next_expiry = Some(next_expiry.map_or(left, |n| n.min(left)));
        disrupted.insert(name.clone(), at.clone());
    }
    let healthy = pods
        .iter()
        .filter(|p| p.is_ready() && !is_terminating(&***p) && !disrupted.contains_key(p.name()))
        .count();
    let current_healthy = i32::try_from(healthy).unwrap_or(i32::MAX);
    let allowed = (current_healthy - desired).max(0);
    let mut st = PodDisruptionBudgetStatus {
        observed_generation: util::generation(pdb),
        disrupted_pods: disrupted,
        disruptions_allowed: allowed,
        current_healthy,
        desired_healthy: desired,
        expected_pods: expected,
        conditions: old.conditions.clone(),
    };
    let (status, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    util::set_condition(
        &mut st.conditions,
        Condition {
            r#type: "DisruptionAllowed".into(),
            status: status.into(),
            reason: reason.into(),
            last_transition_time: format_time(now),
            observed_generation: util::generation(pdb),
            ..Default::default()
        },
    );
    (st, next_expiry)
}

/// The reconciler of PodDisruptionBudgets.
pub struct DisruptionController {
    client: Client,
    recorder: EventRecorder,
    pdbs: Informer<PodDisruptionBudget>,
    pods: Informer<Pod>,
    replica_sets: Informer<ReplicaSet>,
    deployments: Informer<Deployment>,
    daemon_sets: Informer<DaemonSet>,
    stateful_sets: Informer<StatefulSet>,
}

impl std::fmt::Debug for DisruptionController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisruptionController")
            .finish_non_exhaustive()
    }
}

/// Every budget of `namespace`.
fn all_in(pdbs: &Informer<PodDisruptionBudget>, namespace: &str) -> Vec<ObjectKey> {
    pdbs.by_namespace(namespace)
        .iter()
        .map(|p| ObjectKey::of(&**p))
        .collect()
}

impl DisruptionController {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        DisruptionController {
            client: informers.client().clone(),
            recorder,
            pdbs: informers.get::<PodDisruptionBudget>(),
            pods: informers.get::<Pod>(),
            replica_sets: informers.get::<ReplicaSet>(),
            deployments: informers.get::<Deployment>(),
            daemon_sets: informers.get::<DaemonSet>(),
            stateful_sets: informers.get::<StatefulSet>(),
        }
    }

    /// The controller: budgets, the pods they may pick (any pod change in a namespace wakes
    /// its budgets whose selector matches), and the scale of pods' controllers.
    pub fn controller(informers: &Informers) -> Controller<PodDisruptionBudget> {
        let pdbs = informers.get::<PodDisruptionBudget>();
        let (for_pods, for_rs, for_deploy, for_ds, for_sts) = (
            pdbs.clone(),
            pdbs.clone(),
            pdbs.clone(),
            pdbs.clone(),
            pdbs.clone(),
        );
        Controller::<PodDisruptionBudget>::new(informers)
            .named("disruption")
            .watches(&informers.get::<Pod>(), move |pod: &Pod| {
                for_pods
                    .by_namespace(pod.namespace())
                    .iter()
                    .filter(|b| {
                        b.spec
                            .as_ref()
                            .and_then(|s| s.selector.as_ref())
                            .and_then(|s| Selector::from_label_selector(s).ok())
                            .is_some_and(|s| s.matches(labels(pod)))
                    })
                    .map(|b| ObjectKey::of(&**b))
                    .collect()
            })
            .watches(&informers.get::<ReplicaSet>(), move |rs: &ReplicaSet| {
                all_in(&for_rs, rs.namespace())
            })
            .watches(&informers.get::<Deployment>(), move |d: &Deployment| {
                all_in(&for_deploy, d.namespace())
            })
            .watches(&informers.get::<DaemonSet>(), move |d: &DaemonSet| {
                all_in(&for_ds, d.namespace())
            })
            .watches(&informers.get::<StatefulSet>(), move |s: &StatefulSet| {
                all_in(&for_sts, s.namespace())
            })
    }

    /// Runs the disruption controller with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(DisruptionController::new(informers, recorder));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    /// The scale of a pod's controller: (its uid, its replicas). A ReplicaSet owned by a
    /// Deployment counts as the Deployment.
    fn scale_of(&self, pod: &Pod) -> Result<(String, i32), String> {
        let ns = pod.namespace();
        let owner = controller_of(pod)
            .ok_or_else(|| format!("found no controllers for pod {:?}", pod.name()))?;
        let missing = || {
            format!(
                "the controller of pod {:?} ({} {}) was not found",
                pod.name(),
                owner.kind,
                owner.name
            )
        };
        match owner.kind.as_str() {
            "ReplicaSet" => {
                let rs = self
                    .replica_sets
                    .get(&ObjectKey::new(ns, &owner.name))
                    .filter(|r| util::uid(&**r) == owner.uid)
                    .ok_or_else(missing)?;
                if let Some(d) = controller_of(&*rs).filter(|o| o.kind == "Deployment") {
                    let dep = self
                        .deployments
                        .get(&ObjectKey::new(ns, &d.name))
                        .filter(|x| util::uid(&**x) == d.uid)
                        .ok_or_else(missing)?;
                    let replicas = dep.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    return Ok((d.uid.clone(), replicas));
                }
                Ok((
                    owner.uid.clone(),
                    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                ))
            }
            "StatefulSet" => {
                let set = self
                    .stateful_sets
                    .get(&ObjectKey::new(ns, &owner.name))
                    .filter(|x| util::uid(&**x) == owner.uid)
                    .ok_or_else(missing)?;
                let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                Ok((owner.uid.clone(), replicas))
            }
            "DaemonSet" => {
                let ds = self
                    .daemon_sets
                    .get(&ObjectKey::new(ns, &owner.name))
                    .filter(|x| util::uid(&**x) == owner.uid)
                    .ok_or_else(missing)?;
                let desired = ds
                    .status
                    .as_ref()
                    .map(|s| s.desired_number_scheduled)
                    .unwrap_or(0);
                Ok((owner.uid.clone(), desired))
            }
            other => Err(format!("pods of a {other} have no known scale")),
        }
    }
}

impl Reconciler for DisruptionController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(pdb) = self.pdbs.get(key) else {
            return Ok(Action::Done);
        };
        let pods = match selected(&pdb, &self.pods) {
            Ok(p) => p,
            Err(e) => {
                self.recorder
                    .publish(&*pdb, EventType::Warning, "InvalidSelector", &e)
                    .await;
                return Ok(Action::Done);
            }
        };
        let now = Utc::now();
        let (expected, desired) = match expected_and_desired(&pdb, &pods, |p| self.scale_of(p)) {
            Ok(v) => v,
            Err(e) => {
                // Kubernetes' CalculateExpectedPodCountFailed: no disruption is allowed.
                self.recorder
                    .publish(
                        &*pdb,
                        EventType::Warning,
                        "CalculateExpectedPodCountFailed",
                        &e,
                    )
                    .await;
                (0, i32::MAX)
            }
        };
        let (mut status, expiry) = status_of(&pdb, &pods, expected, desired, now);
        if desired == i32::MAX {
            status.desired_healthy = 0;
            status.disruptions_allowed = 0;
        }
        let unchanged = pdb.status.as_ref().is_some_and(|old| {
            let mut a = old.clone();
            let mut b = status.clone();
            // A condition's transition time alone is no change.
            for c in a.conditions.iter_mut().chain(b.conditions.iter_mut()) {
                c.last_transition_time.clear();
            }
            a == b
        });
        if !unchanged {
            let mut updated = (*pdb).clone();
            updated.status = Some(status);
            self.client
                .namespaced::<PodDisruptionBudget>(pdb.namespace())
                .update_status(&updated)
                .await
                .during(|| format!("updating the status of pod disruption budget {key}"))?;
        }
        Ok(expiry.map_or(Action::Done, |d| {
            Action::RequeueAfter(d + Duration::from_millis(100))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ObjectMeta, PodDisruptionBudgetSpec, PodStatus};

    fn pod(name: &str, ready: bool) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: Some(ObjectMeta {
                name: name.into(),
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
        })
    }

    fn pdb(min: Option<&str>, max: Option<&str>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: Some(ObjectMeta {
                generation: 1,
                ..Default::default()
            }),
            spec: Some(PodDisruptionBudgetSpec {
                min_available: min.map(str::to_string),
                max_unavailable: max.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn expected_and_desired_follow_kubernetes() {
        let pods = vec![pod("a", true), pod("b", true), pod("c", false)];
        let scale = |_: &Pod| Ok(("deploy-uid".to_string(), 4));
        assert_eq!(
            expected_and_desired(&pdb(Some("2"), None), &pods, scale),
            Ok((3, 2))
        );
        // Percentages and maxUnavailable use the controllers' scale, rounded up.
        assert_eq!(
            expected_and_desired(&pdb(Some("50%"), None), &pods, scale),
            Ok((4, 2))
        );
        assert_eq!(
            expected_and_desired(&pdb(Some("60%"), None), &pods, scale),
            Ok((4, 3))
        );
        assert_eq!(
            expected_and_desired(&pdb(None, Some("1")), &pods, scale),
            Ok((4, 3))
        );
        assert_eq!(
            expected_and_desired(&pdb(None, Some("30%")), &pods, scale),
            Ok((4, 2))
        );
        let orphan = |_: &Pod| Err("found no controllers".to_string());
        assert!(expected_and_desired(&pdb(None, Some("1")), &pods, orphan).is_err());
    }

    #[test]
    fn allowed_disruptions_and_pending_evictions() {
        let now = Utc::now();
        let pods = vec![pod("a", true), pod("b", true), pod("c", true)];
        let (st, expiry) = status_of(&pdb(Some("2"), None), &pods, 3, 2, now);
        assert_eq!((st.current_healthy, st.disruptions_allowed), (3, 1));
        assert_eq!(st.conditions[0].reason, "SufficientPods");
        assert!(expiry.is_none());
        // Just evicted (not yet seen going): not healthy, and wakes us when it expires.
        let mut b = pdb(Some("2"), None);
        b.status = Some(PodDisruptionBudgetStatus {
            disrupted_pods: [("a".to_string(), format_time(now))].into(),
            ..Default::default()
        });
        let (st, expiry) = status_of(&b, &pods, 3, 2, now);
        assert_eq!((st.current_healthy, st.disruptions_allowed), (2, 0));
        assert_eq!(st.conditions[0].reason, "InsufficientPods");
        assert!(expiry.is_some_and(|d| d <= DISRUPTION_TIMEOUT));
        // Expired after two minutes.
        let later = now + chrono::TimeDelta::seconds(121);
        let (st, _) = status_of(&b, &pods, 3, 2, later);
        assert!(st.disrupted_pods.is_empty());
        assert_eq!(st.disruptions_allowed, 1);
    }
}
