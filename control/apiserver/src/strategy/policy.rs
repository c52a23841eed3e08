//! PodDisruptionBudgets: minAvailable or maxUnavailable (an integer or a percentage, not
//! both), a well-formed selector (empty selects every pod of the namespace, as in policy/v1),
//! the unhealthy pod eviction policy. The spec may change (policy/v1); the status is the
//! disruption controller's.
//!
//! [`eviction_decision`] is what `pods/eviction` asks first: a pod covered by a budget that
//! allows no disruption, or that the disruption controller has not processed yet, is refused
//! with kube-apiserver's 429 and cause; otherwise the budget's status is written first (one
//! disruption fewer, the pod recorded in `disruptedPods`, the read resourceVersion as
//! precondition), then the pod is deleted with the Eviction's options.

use skiff_api::api::{Pod, PodDisruptionBudget};
use skiff_api::selector::Selector;

use super::Strategy;
use super::apps::check_int_or_percent;
use crate::error::ApiError;
use crate::error::FieldError;
use crate::validation as v;

const POLICIES: &[&str] = &["AlwaysAllow", "IfHealthyBudget"];

impl Strategy for PodDisruptionBudget {
    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            return out;
        };
        if spec.min_available.is_some() && spec.max_unavailable.is_some() {
            out.push(FieldError::invalid(
                "spec",
                serde_json::to_string(spec).unwrap_or_default(),
                "minAvailable and maxUnavailable cannot be both set",
            ));
        }
        if let Some(m) = &spec.min_available {
            check_int_or_percent(&mut out, "spec.minAvailable", m);
        }
        if let Some(m) = &spec.max_unavailable {
            check_int_or_percent(&mut out, "spec.maxUnavailable", m);
        }
        if let Some(sel) = &spec.selector {
            v::check_label_selector(&mut out, "spec.selector", sel);
        }
        let policy = spec.unhealthy_pod_eviction_policy.as_str();
        if !policy.is_empty() && !POLICIES.contains(&policy) {
            out.push(FieldError::not_supported(
                "spec.unhealthyPodEvictionPolicy",
                policy,
                POLICIES,
            ));
        }
        out
    }
}

/// kube-apiserver's cap on evictions not yet confirmed by the disruption controller.
const MAX_DISRUPTED_PODS: usize = 2000;

/// Whether `pdb` covers `pod`: same namespace, selector matches (an empty selector matches
/// every pod, as in policy/v1; a malformed one none).
pub fn covers(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    let (Some(pm), Some(bm)) = (pod.metadata.as_ref(), pdb.metadata.as_ref()) else {
        return false;
    };
    if pm.namespace != bm.namespace {
        return false;
    }
    match pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) {
        None => false,
        Some(sel) => Selector::from_label_selector(sel).is_ok_and(|s| s.matches(&pm.labels)),
    }
}

/// What an eviction of `pod` may do given the budgets that cover it (kube-apiserver's
/// eviction REST): `Ok(None)` delete it without touching a budget (it is not running, no
/// budget covers it, or it is unhealthy and the budget allows that); `Ok(Some(pdb))` delete
/// it after writing this budget's status (one disruption fewer, the pod recorded as
/// disrupted at `now`); `Err` the refusal (429 while the budget allows no disruption or is
/// not processed yet, with Kubernetes' messages).
pub fn eviction_decision(
    pod: &Pod,
    pdbs: &[PodDisruptionBudget],
    now: &str,
) -> Result<Option<PodDisruptionBudget>, ApiError> {
    let terminating = pod
        .metadata
        .as_ref()
        .is_some_and(|m| !m.deletion_timestamp.is_empty());
    let phase = pod.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("");
    if terminating || matches!(phase, "Succeeded" | "Failed" | "Pending" | "") {
        return Ok(None);
    }
    let covering: Vec<&PodDisruptionBudget> = pdbs.iter().filter(|p| covers(p, pod)).collect();
    let pdb = match covering.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        _ => {
            return Err(ApiError::Internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource \
                 does not support."
                    .into(),
            ));
        }
    };
    let name = pdb.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
    let generation = pdb.metadata.as_ref().map(|m| m.generation).unwrap_or(0);
    let status = pdb.status.clone().unwrap_or_default();
    let refused = |cause: String| ApiError::TooManyRequests {
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        causes: vec![("DisruptionBudget".into(), cause)],
    };
    if !pod.is_ready() {
        let policy = pdb
            .spec
            .as_ref()
            .map(|s| s.unhealthy_pod_eviction_policy.as_str())
            .unwrap_or("");
        let healthy_enough = status.current_healthy >= status.desired_healthy
            && status.desired_healthy > 0
            && status.observed_generation >= generation;
        if policy == "AlwaysAllow" || healthy_enough {
            return Ok(None);
        }
    }
    if status.observed_generation < generation {
        return Err(refused(format!(
            "The disruption budget {name} is still being processed by the server."
        )));
    }
    if status.disruptions_allowed < 0 {
        return Err(ApiError::Forbidden(
            "pdb disruptions allowed is negative".into(),
        ));
    }
    if status.disrupted_pods.len() > MAX_DISRUPTED_PODS {
        return Err(ApiError::Forbidden(
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller".into(),
        ));
    }
    if status.disruptions_allowed == 0 {
        return Err(refused(format!(
            "The disruption budget {name} needs {} healthy pods and has {} currently",
            status.desired_healthy, status.current_healthy
        )));
    }
    let mut updated = pdb.clone();
    let st = updated.status.get_or_insert_with(Default::default);
    st.disruptions_allowed -= 1;
    let pod_name = pod
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    st.disrupted_pods.insert(pod_name, now.to_string());
    Ok(Some(updated))
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::PodDisruptionBudgetSpec;

    fn pdb(min: Option<&str>, max: Option<&str>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            spec: Some(PodDisruptionBudgetSpec {
                min_available: min.map(str::to_string),
                max_unavailable: max.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn running(name: &str, ready: bool) -> Pod {
        Pod {
            metadata: Some(skiff_api::api::ObjectMeta {
                name: name.into(),
                namespace: "shop".into(),
                labels: [("app".to_string(), "web".to_string())].into(),
                ..Default::default()
            }),
            status: Some(skiff_api::api::PodStatus {
                phase: "Running".into(),
                conditions: vec![skiff_api::api::Condition {
                    r#type: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn budget(allowed: i32, healthy: i32, desired: i32) -> PodDisruptionBudget {
        let mut p = pdb(Some("2"), None);
        p.metadata = Some(skiff_api::api::ObjectMeta {
            name: "web".into(),
            namespace: "shop".into(),
            generation: 1,
            ..Default::default()
        });
        p.spec.as_mut().unwrap().selector = Some(skiff_api::api::LabelSelector {
            match_labels: [("app".to_string(), "web".to_string())].into(),
            ..Default::default()
        });
        p.status = Some(skiff_api::api::PodDisruptionBudgetStatus {
            observed_generation: 1,
            disruptions_allowed: allowed,
            current_healthy: healthy,
            desired_healthy: desired,
            ..Default::default()
        });
        p
    }

    #[test]
    fn evictions_take_from_the_budget_until_it_is_spent() {
        let pod = running("web-1", true);
        let after = eviction_decision(&pod, &[budget(1, 3, 2)], "t")
            .unwrap()
            .expect("the budget is written");
        let st = after.status.unwrap();
        assert_eq!(st.disruptions_allowed, 0);
        assert_eq!(
            st.disrupted_pods.get("web-1").map(String::as_str),
            Some("t")
        );
        let err = eviction_decision(&pod, &[budget(0, 2, 2)], "t").unwrap_err();
        assert_eq!(err.http(), (429, "TooManyRequests"));
        assert_eq!(
            err.to_string(),
            "Cannot evict pod as it would violate the pod's disruption budget."
        );
        let ApiError::TooManyRequests { causes, .. } = err else {
            unreachable!()
        };
        assert_eq!(
            causes[0].1,
            "The disruption budget web needs 2 healthy pods and has 2 currently"
        );
        // Not processed yet.
        let mut stale = budget(1, 3, 2);
        stale.metadata.as_mut().unwrap().generation = 2;
        assert!(eviction_decision(&pod, &[stale], "t").is_err());
        // No budget, or a pod that is not running: no budget is touched.
        assert!(eviction_decision(&pod, &[], "t").unwrap().is_none());
        let mut pending = running("web-2", true);
        pending.status.as_mut().unwrap().phase = "Pending".into();
        assert!(
            eviction_decision(&pending, &[budget(0, 2, 2)], "t")
                .unwrap()
                .is_none()
        );
        // An unhealthy pod while the budget is met (IfHealthyBudget): allowed.
        assert!(
            eviction_decision(&running("web-3", false), &[budget(0, 2, 2)], "t")
                .unwrap()
                .is_none()
        );
        assert!(eviction_decision(&running("web-3", false), &[budget(0, 1, 2)], "t").is_err());
        // Two budgets: kube-apiserver's 500.
        let err = eviction_decision(&pod, &[budget(1, 3, 2), budget(1, 3, 2)], "t").unwrap_err();
        assert_eq!(err.http().0, 500);
    }

    #[test]
    fn one_of_min_available_or_max_unavailable() {
        assert!(pdb(Some("2"), None).validate().is_empty());
        assert!(pdb(None, Some("25%")).validate().is_empty());
        let both = pdb(Some("1"), Some("1")).validate();
        assert_eq!(both[0].path, "spec");
        assert!(
            both[0]
                .to_string()
                .contains("minAvailable and maxUnavailable cannot be both set")
        );
        let bad = pdb(Some("-1"), None).validate();
        assert_eq!(bad[0].path, "spec.minAvailable");
        let bad = pdb(None, Some("150%")).validate();
        assert_eq!(bad[0].path, "spec.maxUnavailable");
        let mut p = pdb(Some("1"), None);
        p.spec.as_mut().unwrap().unhealthy_pod_eviction_policy = "Sometimes".into();
        assert_eq!(p.validate()[0].path, "spec.unhealthyPodEvictionPolicy");
    }
}
