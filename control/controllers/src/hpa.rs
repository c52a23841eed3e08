//! The horizontal pod autoscaler: scales a Deployment, ReplicaSet or StatefulSet by the
//! resource metrics of its pods (the API server's `metrics.k8s.io`), as Kubernetes'
//! `horizontalpodautoscaling` controller does, every 15 s.
//!
//! For each Resource metric: Utilization is the pods' summed usage over their summed
//! requests (a pod without a request for the resource makes the metric unusable, as in
//! Kubernetes), AverageValue the mean usage; the replica count it asks for is
//! `ceil(ratio × pods measured)`, or no change while the ratio is within Kubernetes'
//! tolerance of 10%; several metrics: the largest. The recommendation is stabilized as
//! Kubernetes does (`behavior.scaleUp/scaleDown.stabilizationWindowSeconds`, 0 and 300 by
//! default: the highest recommendation of the scale-down window, the lowest of the scale-up
//! one), then limited by the scaling policies (`behavior.scaleUp/scaleDown.policies`: Pods
//! or Percent per period, measured from the count at the start of the period as the scale
//! events of this controller tell it; `selectPolicy` Max, Min or Disabled; Kubernetes'
//! defaults: up by max(4 pods, 100%) per 15 s, down by 100% per 15 s) and kept within
//! min/maxReplicas (the `ScalingLimited` condition says which bound). Then the target's
//! `spec.replicas` is updated, with a `SuccessfulRescale` event and the status's current
//! metrics and conditions. Scale events are kept in memory: a new leader starts with none, as
//! kube-controller-manager does. Not built: Pods / Object / External metrics, the special
//! handling of unready and unmeasured pods.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use skiff_api::Resource;
use skiff_api::api::{
    Condition, CrossVersionObjectReference, Deployment, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerStatus, LabelSelector, MetricStatus, MetricValueStatus, Pod, ReplicaSet,
    ResourceMetricStatus, StatefulSet,
};
use skiff_api::selector::Selector;
use skiff_client::Client;
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, EventType, Informer, Informers, ObjectKey,
    Reconciler,
};
use tokio::time::Instant;

use crate::util::{self, format_time};
use crate::{Context, Error};

/// How often each autoscaler is evaluated (`--horizontal-pod-autoscaler-sync-period`).
pub const SYNC_PERIOD: Duration = Duration::from_secs(15);
/// Kubernetes' tolerance: a ratio within 10% of 1 changes nothing.
const TOLERANCE: f64 = 0.1;
/// The default scale-down stabilization window.
const DEFAULT_DOWN_WINDOW_S: i32 = 300;

/// One pod's usage and request of a resource (millicores or bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PodSample {
    pub usage: i64,
    pub request: Option<i64>,
}

/// The replica count one metric asks for, and its current value for the status
/// (`(utilization %, average value)`); `Err` when it cannot be computed.
pub fn metric_replicas(
    samples: &[PodSample],
    utilization_target: Option<i32>,
    average_target: Option<i64>,
    current: i32,
) -> Result<(i32, Option<i32>, i64), String> {
    if samples.is_empty() {
        return Err("no pods with metrics".into());
    }
    let n = samples.len() as f64;
    let usage: i64 = samples.iter().map(|s| s.usage).sum();
    let average = (usage as f64 / n).round() as i64;
    let (ratio, utilization) = match (utilization_target, average_target) {
        (Some(target), _) => {
            let mut requests = 0;
            for s in samples {
                requests += s
                    .request
                    .filter(|r| *r > 0)
                    .ok_or("missing request for a pod's resource")?;
            }
            let util = (usage as f64 * 100.0 / requests as f64).round() as i32;
            (f64::from(util) / f64::from(target.max(1)), Some(util))
        }
        (None, Some(target)) => (average as f64 / target.max(1) as f64, None),
        (None, None) => return Err("no target".into()),
    };
    if (ratio - 1.0).abs() <= TOLERANCE {
        return Ok((current, utilization, average));
    }
    let want = (ratio * n).ceil() as i32;
    Ok((want, utilization, average))
}

/// Kubernetes' stabilization: with the recommendations of the windows (`up`: of the last
/// scale-up window, `down`: of the last scale-down window, each including `desired`), the
/// count moves up only to the lowest of `up` and down only to the highest of `down`.
pub fn stabilize(current: i32, up: &[i32], down: &[i32]) -> i32 {
    let up_floor = up.iter().copied().min().unwrap_or(current);
    let down_ceiling = down.iter().copied().max().unwrap_or(current);
    if current < up_floor {
        up_floor
    } else if current > down_ceiling {
        down_ceiling
    } else {
        current
    }
}

/// A scale this controller made: when, and by how many replicas (positive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleEvent {
    pub at: Instant,
    pub change: i32,
}

/// An autoscaler's recent scale-ups and scale-downs.
type ScaleEvents = (Vec<ScaleEvent>, Vec<ScaleEvent>);

/// The scaling policies of `rules` as (`Pods` or `Percent`, value, period seconds), or
/// Kubernetes' defaults for the direction.
fn policies_or_default(
    rules: Option<&skiff_api::api::HpaScalingRules>,
    up: bool,
) -> Vec<(String, i32, i32)> {
    match rules.map(|r| &r.policies) {
        Some(p) if !p.is_empty() => p
            .iter()
            .map(|p| (p.r#type.clone(), p.value, p.period_seconds))
            .collect(),
        _ if up => vec![("Pods".into(), 4, 15), ("Percent".into(), 100, 15)],
        _ => vec![("Percent".into(), 100, 15)],
    }
}

/// Replicas added (or removed) by `events` within the last `period` seconds.
fn change_in(events: &[ScaleEvent], now: Instant, period: i32) -> i32 {
    let period = Duration::from_secs(u64::try_from(period.max(0)).unwrap_or(0));
    events
        .iter()
        .filter(|e| now.duration_since(e.at) <= period)
        .map(|e| e.change)
        .sum()
}

/// The count the policies allow from `current` (Kubernetes'
/// `calculateScaleUpLimitWithScalingRules` and `calculateScaleDownLimitWithBehaviors`):
/// each policy measures from the count at the start of its period (undoing this
/// controller's scale events within it); Max picks the policy allowing the biggest change,
/// Min the smallest, Disabled none.
pub fn policy_limit(
    current: i32,
    up: bool,
    rules: Option<&skiff_api::api::HpaScalingRules>,
    ups: &[ScaleEvent],
    downs: &[ScaleEvent],
    now: Instant,
) -> i32 {
    let select = rules
        .and_then(|r| r.select_policy.as_deref())
        .unwrap_or("Max");
    if select == "Disabled" {
        return current;
    }
    let biggest_change = select != "Min";
    let mut out: Option<i32> = None;
    for (kind, value, period) in policies_or_default(rules, up) {
        let start = current - change_in(ups, now, period) + change_in(downs, now, period);
        let proposed = match (kind.as_str(), up) {
            ("Pods", true) => start.saturating_add(value),
            ("Percent", true) => {
                (f64::from(start) * (1.0 + f64::from(value) / 100.0)).ceil() as i32
            }
            ("Pods", false) => start.saturating_sub(value),
            ("Percent", false) => (f64::from(start) * (1.0 - f64::from(value) / 100.0)) as i32,
            _ => continue,
        };
        // Up: the biggest change is the highest count; down: the lowest.
        let pick_higher = up == biggest_change;
        out = Some(match out {
            None => proposed,
            Some(o) if pick_higher => o.max(proposed),
            Some(o) => o.min(proposed),
        });
    }
    out.unwrap_or(current)
}

/// The stabilized recommendation limited by the policies and min/maxReplicas, with the
/// ScalingLimited condition's (limited, reason, message), as Kubernetes'
/// `convertDesiredReplicasWithBehaviorRate`.
#[allow(clippy::too_many_arguments)]
pub fn limit(
    current: i32,
    desired: i32,
    min: i32,
    max: i32,
    behavior: &skiff_api::api::HorizontalPodAutoscalerBehavior,
    ups: &[ScaleEvent],
    downs: &[ScaleEvent],
    now: Instant,
) -> (i32, bool, &'static str, &'static str) {
    if desired > current {
        let policy =
            policy_limit(current, true, behavior.scale_up.as_ref(), ups, downs, now).max(current);
        let (ceiling, reason, message) = if max > policy {
            (
                policy,
                "ScaleUpLimit",
                "the desired replica count is increasing faster than the maximum scale rate",
            )
        } else {
            (
                max,
                "TooManyReplicas",
                "the desired replica count is more than the maximum replica count",
            )
        };
        if desired > ceiling {
            return (ceiling, true, reason, message);
        }
    } else if desired < current {
        let policy = policy_limit(
            current,
            false,
            behavior.scale_down.as_ref(),
            ups,
            downs,
            now,
        )
        .min(current);
        let (floor, reason, message) = if min < policy {
            (
                policy,
                "ScaleDownLimit",
                "the desired replica count is decreasing faster than the maximum scale rate",
            )
        } else {
            (
                min,
                "TooFewReplicas",
                "the desired replica count is less than the minimum replica count",
            )
        };
        if desired < floor {
            return (floor, true, reason, message);
        }
    }
    // Also when nothing moves: never outside min/max.
    if desired > max {
        return (
            max,
            true,
            "TooManyReplicas",
            "the desired replica count is more than the maximum replica count",
        );
    }
    if desired < min {
        return (
            min,
            true,
            "TooFewReplicas",
            "the desired replica count is less than the minimum replica count",
        );
    }
    (
        desired,
        false,
        "DesiredWithinRange",
        "the desired count is within the acceptable range",
    )
}

/// The reconciler of HorizontalPodAutoscalers.
pub struct HpaController {
    client: Client,
    recorder: EventRecorder,
    hpas: Informer<HorizontalPodAutoscaler>,
    pods: Informer<Pod>,
    /// Recent recommendations per autoscaler.
    history: Mutex<HashMap<ObjectKey, Vec<(Instant, i32)>>>,
    /// This controller's recent scale-ups and scale-downs per autoscaler (the policies'
    /// periods are measured against them).
    events: Mutex<HashMap<ObjectKey, ScaleEvents>>,
}

impl std::fmt::Debug for HpaController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HpaController").finish_non_exhaustive()
    }
}

fn quantity(text: &str, cpu: bool) -> Option<i64> {
    if cpu {
        skiff_api::quantity::parse_milli(text).ok()
    } else {
        skiff_api::quantity::parse_value(text).ok()
    }
}

impl HpaController {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        HpaController {
            client: informers.client().clone(),
            recorder,
            hpas: informers.get::<HorizontalPodAutoscaler>(),
            pods: informers.get::<Pod>(),
            history: Mutex::default(),
            events: Mutex::default(),
        }
    }

    pub fn controller(informers: &Informers) -> Controller<HorizontalPodAutoscaler> {
        Controller::<HorizontalPodAutoscaler>::new(informers).named("horizontalpodautoscaling")
    }

    /// Runs the autoscaler with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(HpaController::new(informers, recorder));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    /// The target's replicas and selector.
    async fn target(
        &self,
        ns: &str,
        r: &CrossVersionObjectReference,
    ) -> Result<(i32, LabelSelector), String> {
        let err = |e: skiff_client::ClientError| format!("getting {} {}: {e}", r.kind, r.name);
        let (replicas, selector) = match r.kind.as_str() {
            "Deployment" => {
                let d = self
                    .client
                    .namespaced::<Deployment>(ns)
                    .get(&r.name)
                    .await
                    .map_err(err)?;
                let s = d.spec.unwrap_or_default();
                (s.replicas, s.selector)
            }
            "ReplicaSet" => {
                let d = self
                    .client
                    .namespaced::<ReplicaSet>(ns)
                    .get(&r.name)
                    .await
                    .map_err(err)?;
                let s = d.spec.unwrap_or_default();
                (s.replicas, s.selector)
            }
            "StatefulSet" => {
                let d = self
                    .client
                    .namespaced::<StatefulSet>(ns)
                    .get(&r.name)
                    .await
                    .map_err(err)?;
                let s = d.spec.unwrap_or_default();
                (s.replicas, s.selector)
            }
            other => return Err(format!("kind {other} cannot be scaled")),
        };
        Ok((
            replicas.unwrap_or(1),
            selector.ok_or("the target has no selector")?,
        ))
    }

    async fn scale(&self, ns: &str, r: &CrossVersionObjectReference, to: i32) -> Result<(), Error> {
        let what = || format!("scaling {} {} to {to}", r.kind, r.name);
        match r.kind.as_str() {
            "Deployment" => {
                let api = self.client.namespaced::<Deployment>(ns);
                let mut d = api.get(&r.name).await.during(what)?;
                d.spec.get_or_insert_with(Default::default).replicas = Some(to);
                api.update(&d).await.during(what)?;
            }
            "ReplicaSet" => {
                let api = self.client.namespaced::<ReplicaSet>(ns);
                let mut d = api.get(&r.name).await.during(what)?;
                d.spec.get_or_insert_with(Default::default).replicas = Some(to);
                api.update(&d).await.during(what)?;
            }
            _ => {
                let api = self.client.namespaced::<StatefulSet>(ns);
                let mut d = api.get(&r.name).await.during(what)?;
                d.spec.get_or_insert_with(Default::default).replicas = Some(to);
                api.update(&d).await.during(what)?;
            }
        }
        Ok(())
    }

    /// The recommendation and the metric statuses.
    async fn recommend(
        &self,
        hpa: &HorizontalPodAutoscaler,
        current: i32,
        selector: &LabelSelector,
    ) -> Result<(i32, Vec<MetricStatus>, String), String> {
        let ns = hpa.namespace();
        let sel = Selector::from_label_selector(selector).map_err(|e| e.to_string())?;
        let path = format!(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods?labelSelector={}",
            sel.to_string().replace(' ', "%20")
        );
        let metrics = self
            .client
            .get_json(&path)
            .await
            .map_err(|e| format!("unable to get metrics for resource: {e}"))?;
        let pods: HashMap<String, Arc<Pod>> = self
            .pods
            .select(Some(ns), &sel)
            .into_iter()
            .filter(|p| !util::is_terminating(&**p))
            .map(|p| (p.name().to_string(), p))
            .collect();
        let spec = hpa.spec.clone().unwrap_or_default();
        let mut best: Option<(i32, String)> = None;
        let mut statuses = Vec::new();
        for m in spec.metrics.iter().filter_map(|m| m.resource.as_ref()) {
            let cpu = m.name == "cpu";
            let mut samples = Vec::new();
            for item in metrics["items"].as_array().into_iter().flatten() {
                let Some(pod) = item["metadata"]["name"].as_str().and_then(|n| pods.get(n)) else {
                    continue;
                };
                let usage: i64 = item["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["usage"][m.name.as_str()].as_str())
                    .filter_map(|q| quantity(q, cpu))
                    .sum();
                let request: Option<i64> = pod
                    .spec
                    .as_ref()
                    .map(|s| {
                        s.containers
                            .iter()
                            .map(|c| {
                                c.resources
                                    .as_ref()
                                    .and_then(|r| r.requests.get(&m.name))
                                    .and_then(|q| quantity(q, cpu))
                            })
                            .sum::<Option<i64>>()
                    })
                    .unwrap_or(None);
                samples.push(PodSample { usage, request });
            }
            let t = m.target.clone().unwrap_or_default();
            let average_target = t.average_value.as_deref().and_then(|v| quantity(v, cpu));
            let (want, util, avg) =
                metric_replicas(&samples, t.average_utilization, average_target, current)
                    .map_err(|e| format!("{} metric: {e}", m.name))?;
            statuses.push(MetricStatus {
                r#type: "Resource".into(),
                resource: Some(ResourceMetricStatus {
                    name: m.name.clone(),
                    current: Some(MetricValueStatus {
                        average_utilization: util,
                        average_value: Some(if cpu {
                            format!("{avg}m")
                        } else {
                            avg.to_string()
                        }),
                        value: None,
                    }),
                }),
            });
            let reason = match util {
                Some(u) => format!(
                    "{} resource utilization (percentage of request) {u}%",
                    m.name
                ),
                None => format!("{} resource average value", m.name),
            };
            if best.as_ref().is_none_or(|(b, _)| want > *b) {
                best = Some((want, reason));
            }
        }
        let (want, reason) = best.ok_or("no resource metric")?;
        Ok((want, statuses, reason))
    }
}

fn set_cond(
    st: &mut HorizontalPodAutoscalerStatus,
    ty: &str,
    ok: bool,
    reason: &str,
    message: &str,
) {
    util::set_condition(
        &mut st.conditions,
        Condition {
            r#type: ty.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: format_time(Utc::now()),
            ..Default::default()
        },
    );
}

impl Reconciler for HpaController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(hpa) = self.hpas.get(key) else {
            self.history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(key);
            self.events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(key);
            return Ok(Action::Done);
        };
        let spec = hpa.spec.clone().unwrap_or_default();
        let target_ref = spec.scale_target_ref.clone().unwrap_or_default();
        let mut st = hpa.status.clone().unwrap_or_default();
        st.observed_generation = Some(util::generation(&*hpa));
        let ns = hpa.namespace().to_string();
        match self.target(&ns, &target_ref).await {
            Err(e) => {
                set_cond(&mut st, "AbleToScale", false, "FailedGetScale", &e);
            }
            Ok((current, selector)) => {
                st.current_replicas = current;
                set_cond(
                    &mut st,
                    "AbleToScale",
                    true,
                    "SucceededGetScale",
                    "the HPA controller was able to get the target's current scale",
                );
                match self.recommend(&hpa, current, &selector).await {
                    Err(e) => {
                        set_cond(
                            &mut st,
                            "ScalingActive",
                            false,
                            "FailedGetResourceMetric",
                            &e,
                        );
                        self.recorder
                            .publish(&*hpa, EventType::Warning, "FailedGetResourceMetric", &e)
                            .await;
                        st.desired_replicas = current;
                    }
                    Ok((want, metrics, reason)) => {
                        st.current_metrics = metrics;
                        set_cond(
                            &mut st,
                            "ScalingActive",
                            true,
                            "ValidMetricFound",
                            "the HPA was able to successfully calculate a replica count",
                        );
                        let now = Instant::now();
                        let behavior = spec.behavior.clone().unwrap_or_default();
                        let window = |rules: Option<&skiff_api::api::HpaScalingRules>,
                                      default: i32| {
                            Duration::from_secs(
                                u64::try_from(
                                    rules
                                        .and_then(|r| r.stabilization_window_seconds)
                                        .unwrap_or(default)
                                        .max(0),
                                )
                                .unwrap_or(0),
                            )
                        };
                        let up_w = window(behavior.scale_up.as_ref(), 0);
                        let down_w = window(behavior.scale_down.as_ref(), DEFAULT_DOWN_WINDOW_S);
                        let (up, down) = {
                            let mut hist = self.history.lock().unwrap_or_else(|e| e.into_inner());
                            let h = hist.entry(key.clone()).or_default();
                            h.push((now, want));
                            let keep = up_w.max(down_w);
                            h.retain(|(t, _)| now.duration_since(*t) <= keep);
                            let within = |w: Duration| -> Vec<i32> {
                                h.iter()
                                    .filter(|(t, _)| now.duration_since(*t) <= w)
                                    .map(|(_, r)| *r)
                                    .collect()
                            };
                            (within(up_w), within(down_w))
                        };
                        let min = spec.min_replicas.unwrap_or(1);
                        let stabilized = stabilize(current, &up, &down);
                        let (ups, downs) = {
                            let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
                            let (ups, downs) = ev.entry(key.clone()).or_default();
                            // The longest period of any policy (at most Kubernetes' 30 min).
                            let keep = Duration::from_secs(1800);
                            ups.retain(|e| now.duration_since(e.at) <= keep);
                            downs.retain(|e| now.duration_since(e.at) <= keep);
                            (ups.clone(), downs.clone())
                        };
                        let (desired, limited, limit_reason, limit_message) = limit(
                            current,
                            stabilized,
                            min,
                            spec.max_replicas.max(min),
                            &behavior,
                            &ups,
                            &downs,
                            now,
                        );
                        set_cond(
                            &mut st,
                            "ScalingLimited",
                            limited,
                            limit_reason,
                            limit_message,
                        );
                        st.desired_replicas = desired;
                        if desired != current {
                            self.scale(&ns, &target_ref, desired).await?;
                            {
                                let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
                                let (ups, downs) = ev.entry(key.clone()).or_default();
                                let change = ScaleEvent {
                                    at: now,
                                    change: (desired - current).abs(),
                                };
                                if desired > current {
                                    ups.push(change);
                                } else {
                                    downs.push(change);
                                }
                            }
                            st.current_replicas = desired;
                            st.last_scale_time = Some(format_time(Utc::now()));
                            let direction = if desired > current { "above" } else { "below" };
                            self.recorder
                                .publish(
                                    &*hpa,
                                    EventType::Normal,
                                    "SuccessfulRescale",
                                    &format!(
                                        "New size: {desired}; reason: {reason} {direction} target"
                                    ),
                                )
                                .await;
                        }
                    }
                }
            }
        }
        if hpa.status.as_ref() != Some(&st) {
            let mut updated = (*hpa).clone();
            updated.status = Some(st);
            self.client
                .namespaced::<HorizontalPodAutoscaler>(hpa.namespace())
                .update_status(&updated)
                .await
                .during(|| format!("updating the status of horizontal pod autoscaler {key}"))?;
        }
        Ok(Action::RequeueAfter(SYNC_PERIOD))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(usage: i64, request: i64) -> PodSample {
        PodSample {
            usage,
            request: Some(request),
        }
    }

    #[test]
    fn utilization_and_tolerance() {
        // Two pods at 900m of 100m requested, target 50%: 900% / 50% × 2 = 36.
        assert_eq!(
            metric_replicas(&[s(900, 100), s(900, 100)], Some(50), None, 2),
            Ok((36, Some(900), 900))
        );
        // Within 10%: no change.
        assert_eq!(
            metric_replicas(&[s(52, 100)], Some(50), None, 3),
            Ok((3, Some(52), 52))
        );
        // Idle: down to ceil(0.1 × 4) = 1.
        assert_eq!(
            metric_replicas(&[s(5, 100); 4], Some(50), None, 4)
                .unwrap()
                .0,
            1
        );
        assert!(
            metric_replicas(
                &[PodSample {
                    usage: 5,
                    request: None
                }],
                Some(50),
                None,
                1
            )
            .is_err()
        );
        // AverageValue: 300m average against 100m: 3 × pods.
        assert_eq!(
            metric_replicas(&[s(300, 0), s(300, 0)], None, Some(100), 2)
                .unwrap()
                .0,
            6
        );
    }

    #[test]
    fn stabilization_windows() {
        // Scale-up window empty of lower recommendations: go up.
        assert_eq!(stabilize(2, &[5], &[5]), 5);
        // Scale down only to the highest recommendation of the window.
        assert_eq!(stabilize(5, &[1], &[1, 4, 2]), 4);
        assert_eq!(stabilize(5, &[1], &[1]), 1);
        // Between: stay.
        assert_eq!(stabilize(3, &[2], &[4]), 3);
    }

    fn rules(
        select: Option<&str>,
        policies: &[(&str, i32, i32)],
    ) -> skiff_api::api::HpaScalingRules {
        skiff_api::api::HpaScalingRules {
            stabilization_window_seconds: None,
            select_policy: select.map(str::to_string),
            policies: policies
                .iter()
                .map(|(t, v, p)| skiff_api::api::HpaScalingPolicy {
                    r#type: t.to_string(),
                    value: *v,
                    period_seconds: *p,
                })
                .collect(),
        }
    }

    #[test]
    fn default_policies_as_kubernetes() {
        let now = Instant::now();
        let b = skiff_api::api::HorizontalPodAutoscalerBehavior::default();
        // Up from 1: max(1 + 4 pods, 1 × 200%) = 5.
        assert_eq!(
            limit(1, 10, 1, 20, &b, &[], &[], now),
            (
                5,
                true,
                "ScaleUpLimit",
                "the desired replica count is increasing faster than the maximum scale rate"
            )
        );
        // Up from 5: max(9, 10) = 10; maxReplicas 8 is the tighter limit.
        assert_eq!(limit(5, 20, 1, 30, &b, &[], &[], now).0, 10);
        assert_eq!(limit(5, 20, 1, 8, &b, &[], &[], now).2, "TooManyReplicas");
        // Down by 100%: to minReplicas at once.
        assert_eq!(
            limit(10, 1, 1, 20, &b, &[], &[], now),
            (
                1,
                false,
                "DesiredWithinRange",
                "the desired count is within the acceptable range"
            )
        );
        assert_eq!(limit(10, 0, 2, 20, &b, &[], &[], now).2, "TooFewReplicas");
    }

    #[test]
    fn policies_measure_from_the_start_of_their_period() {
        let now = Instant::now();
        let b = skiff_api::api::HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(Some("Min"), &[("Pods", 2, 60), ("Percent", 50, 60)])),
            scale_down: Some(rules(None, &[("Pods", 1, 60)])),
        };
        // Down one pod a minute: 10 -> 9.
        assert_eq!(limit(10, 2, 1, 20, &b, &[], &[], now).0, 9);
        // Having just removed one, the period started at 10: nothing more yet.
        let downs = [ScaleEvent { at: now, change: 1 }];
        let (n, limited, reason, _) = limit(9, 2, 1, 20, &b, &[], &downs, now);
        assert_eq!((n, limited, reason), (9, true, "ScaleDownLimit"));
        // Min of (4 + 2, ceil(4 × 1.5)) = 6.
        assert_eq!(limit(4, 20, 1, 20, &b, &[], &[], now).0, 6);
        // Disabled: no scaling up at all.
        let off = skiff_api::api::HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(Some("Disabled"), &[])),
            scale_down: None,
        };
        assert_eq!(limit(4, 20, 1, 20, &off, &[], &[], now).0, 4);
        // Events older than the period do not count.
        let old = [ScaleEvent {
            at: now - Duration::from_secs(61),
            change: 1,
        }];
        assert_eq!(
            policy_limit(9, false, b.scale_down.as_ref(), &[], &old, now),
            8
        );
    }
}
