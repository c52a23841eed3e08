//! ReplicaSets, Deployments, DaemonSets and StatefulSets: replicas, selector/template
//! agreement, rollout strategy, and the immutable selector.

use skiff_api::api::{
    DaemonSet, DaemonSetUpdateStrategy, Deployment, DeploymentStrategy, LabelSelector,
    PodTemplateSpec, ReplicaSet, ReplicationController, RollingUpdateDaemonSet,
    RollingUpdateDeployment, RollingUpdateStatefulSetStrategy, StatefulSet,
    StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec, StatefulSetUpdateStrategy,
};

use skiff_api::Resource;

use super::Strategy;
use super::pod::{default_pod_spec, validate_pod_spec_with_claims};
use crate::error::FieldError;
use crate::validation as v;

fn default_template(t: Option<&mut PodTemplateSpec>) {
    if let Some(spec) = t.and_then(|t| t.spec.as_mut()) {
        default_pod_spec(spec);
    }
}

/// What ReplicaSet and Deployment validation share: replicas, selector vs. template labels,
/// the template's pod spec (restartPolicy must be Always; `claims`: the volumes a
/// StatefulSet's claim templates add to its pods).
fn validate_replicated(
    out: &mut Vec<FieldError>,
    replicas: Option<i32>,
    selector: Option<&LabelSelector>,
    template: Option<&PodTemplateSpec>,
    min_ready_seconds: i32,
    claims: &[&str],
) {
    if let Some(r) = replicas {
        v::check_non_negative(out, "spec.replicas", r.into());
    }
    v::check_non_negative(out, "spec.minReadySeconds", min_ready_seconds.into());
    let Some(template) = template else {
        out.push(FieldError::required("spec.template", ""));
        if selector.is_none() {
            out.push(FieldError::required("spec.selector", ""));
        }
        return;
    };
    let labels = template
        .metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    v::check_labels(out, "spec.template.metadata.labels", &labels);
    v::check_selector_matches_template(out, selector, &labels);
    validate_pod_spec_with_claims(out, "spec.template.spec", template.spec.as_ref(), claims);
    if let Some(spec) = &template.spec {
        if spec.restart_policy != "Always" {
            out.push(FieldError::not_supported(
                "spec.template.spec.restartPolicy",
                &spec.restart_policy,
                &["Always"],
            ));
        }
        if spec.active_deadline_seconds.is_some() {
            out.push(FieldError::forbidden(
                "spec.template.spec.activeDeadlineSeconds",
                "activeDeadlineSeconds in ReplicaSet is not Supported",
            ));
        }
    }
}

fn selector_immutable(
    out: &mut Vec<FieldError>,
    new: Option<&LabelSelector>,
    old: Option<&LabelSelector>,
) {
    if new != old {
        out.push(FieldError::immutable(
            "spec.selector",
            new.cloned().unwrap_or_default(),
        ));
    }
}

impl Strategy for ReplicaSet {
    /// replicas 1; the template's pod spec gets pod defaults.
    fn default(&mut self) {
        if let Some(spec) = self.spec.as_mut() {
            spec.replicas.get_or_insert(1);
            default_template(spec.template.as_mut());
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        validate_replicated(
            &mut out,
            spec.replicas,
            spec.selector.as_ref(),
            spec.template.as_ref(),
            spec.min_ready_seconds,
            &[],
        );
        out
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        selector_immutable(
            &mut out,
            self.spec.as_ref().and_then(|s| s.selector.as_ref()),
            old.spec.as_ref().and_then(|s| s.selector.as_ref()),
        );
        out
    }
}

/// A ReplicationController: a ReplicaSet whose selector is a map of labels (and may change).
impl Strategy for ReplicationController {
    /// replicas 1; an empty selector, and empty labels, are the template's labels
    /// (SetDefaults_ReplicationController); the template's pod spec gets pod defaults.
    fn default(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        spec.replicas.get_or_insert(1);
        let template_labels = spec
            .template
            .as_ref()
            .and_then(|t| t.metadata.as_ref())
            .map(|m| m.labels.clone())
            .unwrap_or_default();
        if spec.selector.is_empty() {
            spec.selector = template_labels.clone();
        }
        default_template(spec.template.as_mut());
        if let Some(m) = self.metadata.as_mut()
            && m.labels.is_empty()
        {
            m.labels = template_labels;
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        if spec.selector.is_empty() {
            out.push(FieldError::required("spec.selector", ""));
        }
        v::check_labels(&mut out, "spec.selector", &spec.selector);
        let selector = LabelSelector {
            match_labels: spec.selector.clone(),
            ..Default::default()
        };
        validate_replicated(
            &mut out,
            spec.replicas,
            (!spec.selector.is_empty()).then_some(&selector),
            spec.template.as_ref(),
            spec.min_ready_seconds,
            &[],
        );
        out
    }
}

/// Checks a maxSurge/maxUnavailable value: a non-negative integer or a percentage; returns
/// whether it is zero.
pub(super) fn check_int_or_percent(out: &mut Vec<FieldError>, path: &str, value: &str) -> bool {
    let (number, percent) = match value.strip_suffix('%') {
        Some(n) => (n, true),
        None => (value, false),
    };
    match number.parse::<i64>() {
        Ok(n) if n < 0 => {
            out.push(FieldError::invalid(
                path,
                value,
                "must be greater than or equal to 0",
            ));
            false
        }
        Ok(n) if percent && n > 100 => {
            out.push(FieldError::invalid(
                path,
                value,
                "must not be greater than 100%",
            ));
            false
        }
        Ok(n) => n == 0,
        Err(_) => {
            out.push(FieldError::invalid(
                path,
                value,
                "must be an integer or percentage (e.g '5%')",
            ));
            false
        }
    }
}

/// A rolling update's maxSurge and maxUnavailable (Deployments and DaemonSets): each an
/// integer or percentage, not both zero.
fn check_rolling_update(
    out: &mut Vec<FieldError>,
    path: &str,
    max_surge: Option<&str>,
    max_unavailable: Option<&str>,
) {
    let surge_zero =
        max_surge.is_some_and(|m| check_int_or_percent(out, &format!("{path}.maxSurge"), m));
    let unavailable_zero = max_unavailable
        .is_some_and(|m| check_int_or_percent(out, &format!("{path}.maxUnavailable"), m));
    if surge_zero && unavailable_zero {
        out.push(FieldError::invalid(
            format!("{path}.maxUnavailable"),
            max_unavailable.unwrap_or_default(),
            "may not be 0 when `maxSurge` is 0",
        ));
    }
}

impl Strategy for DaemonSet {
    /// updateStrategy RollingUpdate with maxUnavailable 1 and maxSurge 0,
    /// revisionHistoryLimit 10; pod defaults for the template.
    fn default(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        spec.revision_history_limit.get_or_insert(10);
        let strategy = spec
            .update_strategy
            .get_or_insert_with(DaemonSetUpdateStrategy::default);
        if strategy.r#type.is_empty() {
            strategy.r#type = "RollingUpdate".into();
        }
        if strategy.r#type == "RollingUpdate" {
            let ru = strategy
                .rolling_update
                .get_or_insert_with(RollingUpdateDaemonSet::default);
            ru.max_unavailable.get_or_insert_with(|| "1".into());
            ru.max_surge.get_or_insert_with(|| "0".into());
        }
        default_template(spec.template.as_mut());
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        validate_replicated(
            &mut out,
            None,
            spec.selector.as_ref(),
            spec.template.as_ref(),
            spec.min_ready_seconds,
            &[],
        );
        if let Some(s) = &spec.update_strategy {
            match s.r#type.as_str() {
                "RollingUpdate" => {
                    if let Some(ru) = &s.rolling_update {
                        check_rolling_update(
                            &mut out,
                            "spec.updateStrategy.rollingUpdate",
                            ru.max_surge.as_deref(),
                            ru.max_unavailable.as_deref(),
                        );
                    }
                }
                "OnDelete" => {}
                other => out.push(FieldError::not_supported(
                    "spec.updateStrategy.type",
                    other,
                    &["OnDelete", "RollingUpdate"],
                )),
            }
        }
        if let Some(r) = spec.revision_history_limit {
            v::check_non_negative(&mut out, "spec.revisionHistoryLimit", r.into());
        }
        out
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        selector_immutable(
            &mut out,
            self.spec.as_ref().and_then(|s| s.selector.as_ref()),
            old.spec.as_ref().and_then(|s| s.selector.as_ref()),
        );
        out
    }
}

/// A StatefulSet's claim retention policies, in kube-apiserver's order.
const RETAIN: &str = "Retain";
const RETENTION_POLICIES: &[&str] = &[RETAIN, "Delete"];

impl Strategy for StatefulSet {
    /// replicas 1, podManagementPolicy OrderedReady, updateStrategy RollingUpdate with
    /// partition 0, revisionHistoryLimit 10, persistentVolumeClaimRetentionPolicy Retain
    /// when deleted and when scaled; pod defaults for the template, claim defaults for the
    /// volumeClaimTemplates.
    fn default(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        spec.replicas.get_or_insert(1);
        spec.revision_history_limit.get_or_insert(10);
        if spec.pod_management_policy.is_empty() {
            spec.pod_management_policy = "OrderedReady".into();
        }
        let strategy = spec
            .update_strategy
            .get_or_insert_with(StatefulSetUpdateStrategy::default);
        if strategy.r#type.is_empty() {
            strategy.r#type = "RollingUpdate".into();
        }
        if strategy.r#type == "RollingUpdate" {
            strategy
                .rolling_update
                .get_or_insert_with(RollingUpdateStatefulSetStrategy::default)
                .partition
                .get_or_insert(0);
        }
        default_template(spec.template.as_mut());
        // The claim templates get a claim's defaults (Kubernetes' defaulters reach into them:
        // volumeMode Filesystem, phase Pending); claims are kept unless said otherwise.
        for claim in &mut spec.volume_claim_templates {
            super::storage::default_claim(claim);
        }
        let retention = spec
            .persistent_volume_claim_retention_policy
            .get_or_insert_with(StatefulSetPersistentVolumeClaimRetentionPolicy::default);
        for when in [&mut retention.when_deleted, &mut retention.when_scaled] {
            if when.is_empty() {
                *when = RETAIN.into();
            }
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        let claims: Vec<&str> = spec
            .volume_claim_templates
            .iter()
            .map(|c| c.name())
            .filter(|n| !n.is_empty())
            .collect();
        validate_replicated(
            &mut out,
            spec.replicas,
            spec.selector.as_ref(),
            spec.template.as_ref(),
            spec.min_ready_seconds,
            &claims,
        );
        // Each template is a claim: a name and a claim's spec (Skiff checks at creation what
        // would otherwise fail when the controller creates the claims).
        for (i, claim) in spec.volume_claim_templates.iter().enumerate() {
            let path = format!("spec.volumeClaimTemplates[{i}]");
            let name = claim.name();
            if name.is_empty() {
                out.push(FieldError::required(format!("{path}.metadata.name"), ""));
            } else {
                v::check_dns_subdomain(&mut out, &format!("{path}.metadata.name"), name);
            }
            super::storage::validate_claim_spec(
                &mut out,
                &format!("{path}.spec"),
                claim.spec.as_ref(),
            );
        }
        if let Some(r) = &spec.persistent_volume_claim_retention_policy {
            let path = "spec.persistentVolumeClaimRetentionPolicy";
            for (field, value) in [
                ("whenDeleted", &r.when_deleted),
                ("whenScaled", &r.when_scaled),
            ] {
                if !RETENTION_POLICIES.contains(&value.as_str()) {
                    out.push(FieldError::not_supported(
                        format!("{path}.{field}"),
                        value,
                        RETENTION_POLICIES,
                    ));
                }
            }
        }
        let policy = spec.pod_management_policy.as_str();
        if !["OrderedReady", "Parallel"].contains(&policy) {
            out.push(FieldError::not_supported(
                "spec.podManagementPolicy",
                policy,
                &["OrderedReady", "Parallel"],
            ));
        }
        if let Some(o) = &spec.ordinals {
            v::check_non_negative(&mut out, "spec.ordinals.start", o.start.into());
        }
        if let Some(s) = &spec.update_strategy {
            match s.r#type.as_str() {
                "RollingUpdate" => {
                    if let Some(ru) = &s.rolling_update {
                        let p = "spec.updateStrategy.rollingUpdate";
                        if let Some(partition) = ru.partition {
                            v::check_non_negative(
                                &mut out,
                                &format!("{p}.partition"),
                                partition.into(),
                            );
                        }
                        if let Some(m) = &ru.max_unavailable
                            && check_int_or_percent(&mut out, &format!("{p}.maxUnavailable"), m)
                        {
                            out.push(FieldError::invalid(
                                format!("{p}.maxUnavailable"),
                                m.as_str(),
                                "must be greater than 0",
                            ));
                        }
                    }
                }
                "OnDelete" => {
                    if s.rolling_update.is_some() {
                        out.push(FieldError::invalid(
                            "spec.updateStrategy.rollingUpdate",
                            "",
                            "only allowed for updateStrategy 'RollingUpdate'",
                        ));
                    }
                }
                other => out.push(FieldError::not_supported(
                    "spec.updateStrategy.type",
                    other,
                    &["OnDelete", "RollingUpdate"],
                )),
            }
        }
        out
    }

    /// Only replicas, ordinals, template, updateStrategy, persistentVolumeClaimRetentionPolicy
    /// and minReadySeconds may change (Kubernetes 1.32's `ValidateStatefulSetUpdate`): the
    /// volumeClaimTemplates, among the rest, never do.
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        // The stored object with today's defaults, as kube-apiserver reads it back (it
        // defaults on every read), so that defaults added since it was written are no change.
        let mut old = old.clone();
        Strategy::default(&mut old);
        let fixed = |s: Option<&StatefulSetSpec>| {
            let mut s = s.cloned().unwrap_or_default();
            s.replicas = None;
            s.ordinals = None;
            s.template = None;
            s.update_strategy = None;
            s.persistent_volume_claim_retention_policy = None;
            s.min_ready_seconds = 0;
            s
        };
        if fixed(self.spec.as_ref()) != fixed(old.spec.as_ref()) {
            out.push(FieldError::forbidden(
                "spec",
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', \
                 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and \
                 'minReadySeconds' are forbidden",
            ));
        }
        out
    }
}

impl Strategy for Deployment {
    /// replicas 1, strategy RollingUpdate with maxSurge/maxUnavailable 25%,
    /// revisionHistoryLimit 10, progressDeadlineSeconds 600; pod defaults for the template.
    fn default(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        spec.replicas.get_or_insert(1);
        spec.revision_history_limit.get_or_insert(10);
        spec.progress_deadline_seconds.get_or_insert(600);
        let strategy = spec
            .strategy
            .get_or_insert_with(DeploymentStrategy::default);
        if strategy.r#type.is_empty() {
            strategy.r#type = "RollingUpdate".into();
        }
        if strategy.r#type == "RollingUpdate" {
            let ru = strategy
                .rolling_update
                .get_or_insert_with(RollingUpdateDeployment::default);
            ru.max_surge.get_or_insert_with(|| "25%".into());
            ru.max_unavailable.get_or_insert_with(|| "25%".into());
        }
        default_template(spec.template.as_mut());
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        validate_replicated(
            &mut out,
            spec.replicas,
            spec.selector.as_ref(),
            spec.template.as_ref(),
            spec.min_ready_seconds,
            &[],
        );
        if let Some(s) = &spec.strategy {
            match s.r#type.as_str() {
                "RollingUpdate" => {
                    if let Some(ru) = &s.rolling_update {
                        check_rolling_update(
                            &mut out,
                            "spec.strategy.rollingUpdate",
                            ru.max_surge.as_deref(),
                            ru.max_unavailable.as_deref(),
                        );
                    }
                }
                "Recreate" => {
                    if s.rolling_update.is_some() {
                        out.push(FieldError::forbidden(
                            "spec.strategy.rollingUpdate",
                            "may not be specified when strategy `type` is 'Recreate'",
                        ));
                    }
                }
                other => out.push(FieldError::not_supported(
                    "spec.strategy.type",
                    other,
                    &["Recreate", "RollingUpdate"],
                )),
            }
        }
        if let Some(r) = spec.revision_history_limit {
            v::check_non_negative(&mut out, "spec.revisionHistoryLimit", r.into());
        }
        if let Some(p) = spec.progress_deadline_seconds
            && p <= spec.min_ready_seconds
        {
            out.push(FieldError::invalid(
                "spec.progressDeadlineSeconds",
                p,
                "must be greater than minReadySeconds",
            ));
        }
        out
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        selector_immutable(
            &mut out,
            self.spec.as_ref().and_then(|s| s.selector.as_ref()),
            old.spec.as_ref().and_then(|s| s.selector.as_ref()),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{Container, DeploymentSpec, ObjectMeta, PodSpec};

    fn deployment(replicas: Option<i32>) -> Deployment {
        let labels: std::collections::BTreeMap<String, String> =
            [("app".to_string(), "web".to_string())].into();
        let mut d = Deployment {
            metadata: Some(ObjectMeta {
                name: "web".into(),
                ..Default::default()
            }),
            spec: Some(DeploymentSpec {
                replicas,
                selector: Some(LabelSelector {
                    match_labels: labels.clone(),
                    ..Default::default()
                }),
                template: Some(PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels,
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "c".into(),
                            image: "host".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        Strategy::default(&mut d);
        d
    }

    #[test]
    fn defaults() {
        let d = deployment(None);
        let spec = d.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.revision_history_limit, Some(10));
        let s = spec.strategy.as_ref().expect("strategy");
        assert_eq!(s.r#type, "RollingUpdate");
        let ru = s.rolling_update.as_ref().expect("rollingUpdate");
        assert_eq!(ru.max_surge.as_deref(), Some("25%"));
        assert_eq!(ru.max_unavailable.as_deref(), Some("25%"));
        assert!(d.validate().is_empty(), "{:?}", d.validate());
    }

    #[test]
    fn negative_replicas_and_mismatched_selector() {
        let mut d = deployment(Some(-1));
        let errs: Vec<String> = d.validate().iter().map(ToString::to_string).collect();
        assert_eq!(
            errs,
            vec!["spec.replicas: Invalid value: -1: must be greater than or equal to 0"]
        );
        if let Some(s) = d.spec.as_mut() {
            s.replicas = Some(1);
            s.selector = Some(LabelSelector {
                match_labels: [("app".to_string(), "db".to_string())].into(),
                ..Default::default()
            });
        }
        let errs: Vec<String> = d.validate().iter().map(ToString::to_string).collect();
        assert!(
            errs[0].starts_with("spec.template.metadata.labels: Invalid value"),
            "{errs:?}"
        );
    }

    fn stateful_set(claims: serde_json::Value) -> StatefulSet {
        let mut st: StatefulSet = match serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {
                "selector": {"matchLabels": {"app": "db"}},
                "serviceName": "db",
                "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [
                    {"name": "c", "image": "host",
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
                "volumeClaimTemplates": claims,
            }
        })) {
            Ok(st) => st,
            Err(e) => panic!("not a StatefulSet: {e}"),
        };
        Strategy::default(&mut st);
        st
    }

    fn data_claim() -> serde_json::Value {
        serde_json::json!([{"metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}}])
    }

    #[test]
    fn stateful_set_claim_templates_are_defaulted_and_mountable() {
        let st = stateful_set(data_claim());
        assert!(st.validate().is_empty(), "{:?}", st.validate());
        let spec = st.spec.as_ref().expect("spec");
        let claim = &spec.volume_claim_templates[0];
        assert_eq!(
            claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()),
            Some("Filesystem")
        );
        assert_eq!(
            claim.status.as_ref().map(|s| s.phase.as_str()),
            Some("Pending")
        );
        let retention = spec
            .persistent_volume_claim_retention_policy
            .as_ref()
            .expect("retention policy");
        assert_eq!(
            (
                retention.when_deleted.as_str(),
                retention.when_scaled.as_str()
            ),
            ("Retain", "Retain")
        );
        // Without the template, the mount names no volume.
        let bare = stateful_set(serde_json::json!([]));
        let errs: Vec<String> = bare.validate().iter().map(ToString::to_string).collect();
        assert_eq!(
            errs,
            ["spec.template.spec.containers[0].volumeMounts[0].name: Not found: \"data\""]
        );
    }

    #[test]
    fn stateful_set_claim_templates_are_claims() {
        let mut st = stateful_set(serde_json::json!([
            {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}},
            {"spec": {"accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": "1Gi"}}}},
        ]));
        if let Some(r) = st
            .spec
            .as_mut()
            .and_then(|s| s.persistent_volume_claim_retention_policy.as_mut())
        {
            r.when_scaled = "Keep".into();
        }
        let errs: Vec<String> = st.validate().iter().map(ToString::to_string).collect();
        assert_eq!(
            errs,
            [
                "spec.volumeClaimTemplates[0].spec.resources[storage]: Required value",
                "spec.volumeClaimTemplates[1].metadata.name: Required value",
                "spec.persistentVolumeClaimRetentionPolicy.whenScaled: Unsupported value: \
                 \"Keep\": supported values: \"Retain\", \"Delete\"",
            ]
        );
    }

    #[test]
    fn stateful_set_claim_templates_never_change() {
        let old = stateful_set(data_claim());
        // The retention policy, replicas and the template may change.
        let mut new = old.clone();
        if let Some(s) = new.spec.as_mut() {
            s.replicas = Some(3);
            if let Some(r) = s.persistent_volume_claim_retention_policy.as_mut() {
                r.when_deleted = "Delete".into();
            }
        }
        assert!(new.validate_update(&old).is_empty());
        // A stored object written before today's defaults is no change either.
        let mut stored = old.clone();
        if let Some(s) = stored.spec.as_mut() {
            s.persistent_volume_claim_retention_policy = None;
            s.volume_claim_templates[0].status = None;
            if let Some(c) = s.volume_claim_templates[0].spec.as_mut() {
                c.volume_mode = None;
            }
        }
        assert!(old.validate_update(&stored).is_empty());
        let mut bigger = old.clone();
        if let Some(r) = bigger
            .spec
            .as_mut()
            .and_then(|s| s.volume_claim_templates[0].spec.as_mut())
            .and_then(|c| c.resources.as_mut())
        {
            r.requests.insert("storage".into(), "2Gi".into());
        }
        let errs: Vec<String> = bigger
            .validate_update(&old)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errs,
            [
                "spec: Forbidden: updates to statefulset spec for fields other than 'replicas', \
                 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' \
                 and 'minReadySeconds' are forbidden"
            ]
        );
    }

    #[test]
    fn selector_is_immutable() {
        let old = deployment(None);
        let mut new = old.clone();
        assert!(new.validate_update(&old).is_empty());
        if let Some(s) = new.spec.as_mut() {
            s.selector = None;
        }
        assert_eq!(new.validate_update(&old).len(), 1);
    }
}
