//! HorizontalPodAutoscalers (autoscaling/v2): Kubernetes' defaults (minReplicas 1, CPU at 80%
//! utilization when no metric is given, the scale-down stabilization window of 300 s) and
//! validation of the target, the replica bounds and the resource metrics Skiff serves.

use skiff_api::api::{HorizontalPodAutoscaler, MetricSpec, MetricTarget, ResourceMetricSource};

use super::Strategy;
use crate::error::FieldError;

const TARGET_KINDS: &[&str] = &["Deployment", "ReplicaSet", "StatefulSet"];
const RESOURCES: &[&str] = &["cpu", "memory"];

impl Strategy for HorizontalPodAutoscaler {
    fn default(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        spec.min_replicas.get_or_insert(1);
        if spec.metrics.is_empty() {
            spec.metrics.push(MetricSpec {
                r#type: "Resource".into(),
                resource: Some(ResourceMetricSource {
                    name: "cpu".into(),
                    target: Some(MetricTarget {
                        r#type: "Utilization".into(),
                        average_utilization: Some(80),
                        ..Default::default()
                    }),
                }),
            });
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        match &spec.scale_target_ref {
            None => out.push(FieldError::required("spec.scaleTargetRef", "")),
            Some(t) => {
                if t.name.is_empty() {
                    out.push(FieldError::required("spec.scaleTargetRef.name", ""));
                }
                if !TARGET_KINDS.contains(&t.kind.as_str()) {
                    out.push(FieldError::not_supported(
                        "spec.scaleTargetRef.kind",
                        &t.kind,
                        TARGET_KINDS,
                    ));
                }
            }
        }
        let min = spec.min_replicas.unwrap_or(1);
        if min < 1 {
            out.push(FieldError::invalid(
                "spec.minReplicas",
                min,
                "must be greater than or equal to 1",
            ));
        }
        if spec.max_replicas < 1 {
            out.push(FieldError::invalid(
                "spec.maxReplicas",
                spec.max_replicas,
                "must be greater than 0",
            ));
        } else if min > spec.max_replicas {
            out.push(FieldError::invalid(
                "spec.maxReplicas",
                spec.max_replicas,
                "must be greater than or equal to `minReplicas`",
            ));
        }
        for (i, m) in spec.metrics.iter().enumerate() {
            let p = format!("spec.metrics[{i}]");
            if m.r#type != "Resource" {
                out.push(FieldError::not_supported(
                    format!("{p}.type"),
                    &m.r#type,
                    &["Resource"],
                ));
                continue;
            }
            let Some(r) = &m.resource else {
                out.push(FieldError::required(format!("{p}.resource"), ""));
                continue;
            };
            if !RESOURCES.contains(&r.name.as_str()) {
                out.push(FieldError::not_supported(
                    format!("{p}.resource.name"),
                    &r.name,
                    RESOURCES,
                ));
            }
            let t = r.target.clone().unwrap_or_default();
            match t.r#type.as_str() {
                "Utilization" => match t.average_utilization {
                    Some(u) if u > 0 => {}
                    Some(u) => out.push(FieldError::invalid(
                        format!("{p}.resource.target.averageUtilization"),
                        u,
                        "must be greater than 0",
                    )),
                    None => out.push(FieldError::required(
                        format!("{p}.resource.target.averageUtilization"),
                        "must set either a target raw value or a target utilization",
                    )),
                },
                "AverageValue" => {
                    if t.average_value.is_none() {
                        out.push(FieldError::required(
                            format!("{p}.resource.target.averageValue"),
                            "must set either a target raw value or a target utilization",
                        ));
                    }
                }
                other => out.push(FieldError::not_supported(
                    format!("{p}.resource.target.type"),
                    other,
                    &["AverageValue", "Utilization"],
                )),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{CrossVersionObjectReference, HorizontalPodAutoscalerSpec};

    #[test]
    fn defaults_and_bounds() {
        let mut h = HorizontalPodAutoscaler {
            spec: Some(HorizontalPodAutoscalerSpec {
                scale_target_ref: Some(CrossVersionObjectReference {
                    kind: "Deployment".into(),
                    name: "web".into(),
                    api_version: "apps/v1".into(),
                }),
                max_replicas: 5,
                ..Default::default()
            }),
            ..Default::default()
        };
        Strategy::default(&mut h);
        assert!(h.validate().is_empty(), "{:?}", h.validate());
        let spec = h.spec.as_ref().unwrap();
        assert_eq!(spec.min_replicas, Some(1));
        assert_eq!(
            spec.metrics[0]
                .resource
                .as_ref()
                .unwrap()
                .target
                .as_ref()
                .unwrap()
                .average_utilization,
            Some(80)
        );
        h.spec.as_mut().unwrap().min_replicas = Some(6);
        assert_eq!(h.validate()[0].path, "spec.maxReplicas");
    }
}
