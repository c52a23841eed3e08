//! Pods: defaulting and validation of pod specs (shared with the templates of ReplicaSets and
//! Deployments), the immutability of a pod's spec, graceful deletion and binding.
//!
//! Ephemeral containers (`kubectl debug`) are written only through the `ephemeralcontainers`
//! subresource ([`EPHEMERAL_CONTAINERS`]), which copies `spec.ephemeralContainers` into the
//! stored pod and nothing else; a create drops them and the main update keeps the stored
//! ones, as only that subresource may change them. As in Kubernetes they may only be added:
//! an existing one may not change or go, a new one is validated as a container without
//! ports, probes or resources, its name unique among all the pod's containers, its
//! `targetContainerName` one of `spec.containers`. Admission (Pod Security included) sees the
//! write as an update of the pod through that subresource.
//!
//! The ServiceAccount admission (`service_account_admission`, the chain's `ServiceAccount`
//! plug-in, before validation) defaults `serviceAccountName`, refuses a named ServiceAccount
//! that does not exist (a missing `default` only means no token) and, when the account exists
//! and automounting is not off, adds the `kube-api-access-*` projected volume and its mount to
//! every container with an image.

use std::collections::BTreeSet;

use async_trait::async_trait;
use skiff_api::Resource;
use skiff_api::api::{
    Binding, Condition, Container, EphemeralContainer, Pod, PodSpec, PodStatus, Probe,
};

use super::{DeleteContext, DeleteDecision, PROTOCOLS, Strategy};
use crate::error::{ApiError, FieldError};
use crate::validation as v;

/// The subresource through which ephemeral containers are added.
pub const EPHEMERAL_CONTAINERS: &str = "ephemeralcontainers";

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;
const RESTART_POLICIES: &[&str] = &["Always", "OnFailure", "Never"];

fn default_probe(p: &mut Probe) {
    if p.timeout_seconds == 0 {
        p.timeout_seconds = 1;
    }
    if p.period_seconds == 0 {
        p.period_seconds = 10;
    }
    if p.success_threshold == 0 {
        p.success_threshold = 1;
    }
    if p.failure_threshold == 0 {
        p.failure_threshold = 3;
    }
}

fn default_container(c: &mut Container) {
    for p in &mut c.ports {
        // 0 is Kubernetes' "no host port" (an omitempty int32), as kubectl's protobuf
        // bodies send it.
        if p.host_port == Some(0) {
            p.host_port = None;
        }
        if p.protocol.is_empty() {
            p.protocol = "TCP".into();
        }
    }
    for p in [
        &mut c.liveness_probe,
        &mut c.readiness_probe,
        &mut c.startup_probe,
    ]
    .into_iter()
    .flatten()
    {
        default_probe(p);
    }
}

/// Kubernetes' pod-spec defaults: restartPolicy Always, schedulerName default-scheduler,
/// terminationGracePeriodSeconds 30, container ports TCP, probe timings.
pub(crate) fn default_pod_spec(spec: &mut PodSpec) {
    if spec.restart_policy.is_empty() {
        spec.restart_policy = "Always".into();
    }
    if spec.scheduler_name.is_empty() {
        spec.scheduler_name = "default-scheduler".into();
    }
    if spec.termination_grace_period_seconds.is_none() {
        spec.termination_grace_period_seconds = Some(DEFAULT_GRACE_SECONDS);
    }
    if spec.dns_policy.is_empty() {
        spec.dns_policy = "ClusterFirst".into();
    }
    spec.enable_service_links.get_or_insert(true);
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut())
    {
        default_container(c);
    }
}

fn validate_probe(out: &mut Vec<FieldError>, path: &str, p: &Probe) {
    let handlers = usize::from(p.exec.is_some())
        + usize::from(p.http_get.is_some())
        + usize::from(p.tcp_socket.is_some());
    match handlers {
        0 => out.push(FieldError::required(path, "must specify a handler type")),
        1 => {}
        _ => out.push(FieldError::forbidden(
            path,
            "may not specify more than 1 handler type",
        )),
    }
    if let Some(e) = &p.exec
        && e.command.is_empty()
    {
        out.push(FieldError::required(format!("{path}.exec.command"), ""));
    }
    if let Some(h) = &p.http_get {
        v::check_port_or_name(out, &format!("{path}.httpGet.port"), &h.port);
        if !matches!(h.scheme.as_str(), "" | "HTTP" | "HTTPS") {
            out.push(FieldError::not_supported(
                format!("{path}.httpGet.scheme"),
                &h.scheme,
                &["HTTP", "HTTPS"],
            ));
        }
    }
    if let Some(t) = &p.tcp_socket {
        v::check_port_or_name(out, &format!("{path}.tcpSocket.port"), &t.port);
    }
    if p.period_seconds <= 0 {
        out.push(FieldError::invalid(
            format!("{path}.periodSeconds"),
            p.period_seconds,
            "must be greater than 0",
        ));
    }
    for (field, value) in [
        ("initialDelaySeconds", p.initial_delay_seconds),
        ("timeoutSeconds", p.timeout_seconds),
        ("successThreshold", p.success_threshold),
        ("failureThreshold", p.failure_threshold),
    ] {
        v::check_non_negative(out, &format!("{path}.{field}"), value.into());
    }
}

fn validate_container(out: &mut Vec<FieldError>, path: &str, c: &Container) {
    if c.name.is_empty() {
        out.push(FieldError::required(format!("{path}.name"), ""));
    } else {
        v::check_dns_label(out, &format!("{path}.name"), &c.name);
    }
    if c.image.trim().is_empty() {
        out.push(FieldError::required(format!("{path}.image"), ""));
    }
    let mut port_names = BTreeSet::new();
    for (i, p) in c.ports.iter().enumerate() {
        let pp = format!("{path}.ports[{i}]");
        v::check_port_number(out, &format!("{pp}.containerPort"), p.container_port.into());
        if let Some(h) = p.host_port {
            v::check_port_number(out, &format!("{pp}.hostPort"), h.into());
        }
        if !PROTOCOLS.contains(&p.protocol.as_str()) {
            out.push(FieldError::not_supported(
                format!("{pp}.protocol"),
                &p.protocol,
                PROTOCOLS,
            ));
        }
        if !p.name.is_empty() {
            v::check_port_name(out, &format!("{pp}.name"), &p.name);
            if !port_names.insert(p.name.as_str()) {
                out.push(FieldError::duplicate(format!("{pp}.name"), &p.name));
            }
        }
    }
    for (i, e) in c.env.iter().enumerate() {
        if e.name.is_empty() {
            out.push(FieldError::required(format!("{path}.env[{i}].name"), ""));
        }
        super::pod_volumes::validate_env_source(out, &format!("{path}.env[{i}]"), e);
    }
    for (i, f) in c.env_from.iter().enumerate() {
        let fp = format!("{path}.envFrom[{i}]");
        match (&f.secret_ref, &f.config_map_ref) {
            (Some(r), None) if r.name.is_empty() => {
                out.push(FieldError::required(format!("{fp}.secretRef.name"), ""))
            }
            (None, Some(r)) if r.name.is_empty() => {
                out.push(FieldError::required(format!("{fp}.configMapRef.name"), ""))
            }
            (Some(_), None) | (None, Some(_)) => {}
            (Some(_), Some(_)) => out.push(FieldError::forbidden(
                fp,
                "may not have more than one field specified at a time",
            )),
            (None, None) => out.push(FieldError::required(
                fp,
                "must specify one of: `configMapRef` or `secretRef`",
            )),
        }
    }
    for (field, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(p) = probe {
            validate_probe(out, &format!("{path}.{field}"), p);
            if field != "readinessProbe" && p.success_threshold != 1 {
                out.push(FieldError::invalid(
                    format!("{path}.{field}.successThreshold"),
                    p.success_threshold,
                    "must be 1",
                ));
            }
        }
    }
}

/// Validates a pod spec found at `path` (`spec`, `spec.template.spec`).
pub(crate) fn validate_pod_spec(out: &mut Vec<FieldError>, path: &str, spec: Option<&PodSpec>) {
    validate_pod_spec_with_claims(out, path, spec, &[]);
}

/// [`validate_pod_spec`] for a StatefulSet's template, whose pods also get a volume for each
/// of its `volumeClaimTemplates` (named `claims`), which containers may mount.
pub(crate) fn validate_pod_spec_with_claims(
    out: &mut Vec<FieldError>,
    path: &str,
    spec: Option<&PodSpec>,
    claims: &[&str],
) {
    let Some(spec) = spec else {
        out.push(FieldError::required(path, ""));
        return;
    };
    if spec.containers.is_empty() {
        out.push(FieldError::required(format!("{path}.containers"), ""));
    }
    let mut volumes = super::pod_volumes::validate_volumes(out, path, spec);
    volumes.extend(claims.iter().copied());
    super::pod_volumes::validate_pod_security_context(out, path, spec.security_context.as_ref());
    for (i, s) in spec.image_pull_secrets.iter().enumerate() {
        if s.name.is_empty() {
            out.push(FieldError::required(
                format!("{path}.imagePullSecrets[{i}].name"),
                "",
            ));
        }
    }
    let mut names = BTreeSet::new();
    for (field, list) in [
        ("containers", &spec.containers),
        ("initContainers", &spec.init_containers),
    ] {
        for (i, c) in list.iter().enumerate() {
            let cp = format!("{path}.{field}[{i}]");
            validate_container(out, &cp, c);
            super::pod_volumes::validate_container_extras(out, &cp, c, &volumes);
            if !c.name.is_empty() && !names.insert(c.name.clone()) {
                out.push(FieldError::duplicate(format!("{cp}.name"), &c.name));
            }
        }
    }
    if path != "spec" && !spec.ephemeral_containers.is_empty() {
        out.push(FieldError::forbidden(
            format!("{path}.ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
    for (i, e) in spec.ephemeral_containers.iter().enumerate() {
        let ep = format!("{path}.ephemeralContainers[{i}]");
        validate_ephemeral(out, &ep, e, spec);
        let c = e.to_container();
        validate_container(out, &ep, &c);
        super::pod_volumes::validate_container_extras(out, &ep, &c, &volumes);
        if !e.name.is_empty() && !names.insert(e.name.clone()) {
            out.push(FieldError::duplicate(format!("{ep}.name"), &e.name));
        }
    }
    if !RESTART_POLICIES.contains(&spec.restart_policy.as_str()) {
        out.push(FieldError::not_supported(
            format!("{path}.restartPolicy"),
            &spec.restart_policy,
            RESTART_POLICIES,
        ));
    }
    if let Some(g) = spec.termination_grace_period_seconds {
        v::check_non_negative(out, &format!("{path}.terminationGracePeriodSeconds"), g);
    }
    if let Some(d) = spec.active_deadline_seconds
        && d <= 0
    {
        out.push(FieldError::invalid(
            format!("{path}.activeDeadlineSeconds"),
            d,
            "must be greater than 0",
        ));
    }
    if !spec.node_name.is_empty() {
        v::check_dns_subdomain(out, &format!("{path}.nodeName"), &spec.node_name);
    }
    v::check_labels(out, &format!("{path}.nodeSelector"), &spec.node_selector);
    for (i, t) in spec.tolerations.iter().enumerate() {
        let tp = format!("{path}.tolerations[{i}]");
        if !matches!(t.operator.as_str(), "" | "Equal" | "Exists") {
            out.push(FieldError::not_supported(
                format!("{tp}.operator"),
                &t.operator,
                &["Equal", "Exists"],
            ));
        }
        if t.operator == "Exists" && !t.value.is_empty() {
            out.push(FieldError::invalid(
                format!("{tp}.operator"),
                &t.value,
                "value must be empty when `operator` is 'Exists'",
            ));
        }
        if !matches!(
            t.effect.as_str(),
            "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute"
        ) {
            out.push(FieldError::not_supported(
                format!("{tp}.effect"),
                &t.effect,
                &["NoSchedule", "PreferNoSchedule", "NoExecute"],
            ));
        }
    }
}

/// Kubernetes' rules for an ephemeral container beyond a container's: no ports, probes or
/// resources (it is never restarted and gets nothing reserved), a target among
/// `spec.containers`.
fn validate_ephemeral(
    out: &mut Vec<FieldError>,
    path: &str,
    e: &EphemeralContainer,
    spec: &PodSpec,
) {
    if !e.ports.is_empty() {
        out.push(FieldError::forbidden(
            format!("{path}.ports"),
            "cannot be set for an Ephemeral Container",
        ));
    }
    for (field, set) in [
        ("livenessProbe", e.liveness_probe.is_some()),
        ("readinessProbe", e.readiness_probe.is_some()),
        ("startupProbe", e.startup_probe.is_some()),
        (
            "resources",
            e.resources
                .as_ref()
                .is_some_and(|r| !r.limits.is_empty() || !r.requests.is_empty()),
        ),
    ] {
        if set {
            out.push(FieldError::forbidden(
                format!("{path}.{field}"),
                "cannot be set for an Ephemeral Container",
            ));
        }
    }
    let t = &e.target_container_name;
    if !t.is_empty() && !spec.containers.iter().any(|c| &c.name == t) {
        out.push(FieldError::not_found(
            format!("{path}.targetContainerName"),
            t,
        ));
    }
}

/// Ephemeral containers may only be added: each of `old`'s is still there, unchanged.
fn validate_ephemeral_update(out: &mut Vec<FieldError>, new: &PodSpec, old: &PodSpec) {
    for (i, o) in old.ephemeral_containers.iter().enumerate() {
        let path = format!("spec.ephemeralContainers[{i}]");
        match new.ephemeral_containers.iter().find(|n| n.name == o.name) {
            None => out.push(FieldError::forbidden(
                path,
                format!(
                    "existing ephemeral containers {:?} may not be removed",
                    o.name
                ),
            )),
            Some(n) if significant(n) != significant(o) => out.push(FieldError::forbidden(
                path,
                format!(
                    "existing ephemeral containers {:?} may not be changed",
                    o.name
                ),
            )),
            Some(_) => {}
        }
    }
}

/// An ephemeral container as JSON without its empty fields: what a client that read it
/// sends back (an empty `resources: {}` and none are the same).
fn significant(e: &EphemeralContainer) -> serde_json::Value {
    fn prune(v: serde_json::Value) -> Option<serde_json::Value> {
        use serde_json::Value;
        match v {
            Value::Null | Value::Bool(false) => None,
            Value::String(s) if s.is_empty() => None,
            Value::Array(a) if a.is_empty() => None,
            Value::Array(a) => Some(Value::Array(
                a.into_iter()
                    .map(|x| prune(x).unwrap_or(Value::Null))
                    .collect(),
            )),
            Value::Object(m) => {
                let m: serde_json::Map<String, Value> = m
                    .into_iter()
                    .filter_map(|(k, v)| prune(v).map(|v| (k, v)))
                    .collect();
                (!m.is_empty()).then_some(Value::Object(m))
            }
            other => Some(other),
        }
    }
    serde_json::to_value(e)
        .ok()
        .and_then(prune)
        .unwrap_or_default()
}

/// The spec with every field a pod update may change blanked out (ephemeral containers are
/// checked on their own: only their subresource changes them).
fn immutable_part(spec: Option<&PodSpec>) -> PodSpec {
    let mut s = spec.cloned().unwrap_or_default();
    s.ephemeral_containers.clear();
    for c in s.containers.iter_mut().chain(s.init_containers.iter_mut()) {
        c.image.clear();
    }
    s.active_deadline_seconds = None;
    s.termination_grace_period_seconds = None;
    s.tolerations.clear();
    s.node_name.clear();
    s
}

/// Sets (or replaces) the condition of `cond.type_`, keeping the transition time when the
/// status does not change.
fn set_condition(conditions: &mut Vec<Condition>, cond: Condition) {
    match conditions.iter_mut().find(|c| c.r#type == cond.r#type) {
        Some(existing) => {
            let keep_time = existing.status == cond.status;
            let time = existing.last_transition_time.clone();
            *existing = cond;
            if keep_time && !time.is_empty() {
                existing.last_transition_time = time;
            }
        }
        None => conditions.push(cond),
    }
}

/// Where the ServiceAccount admission mounts the token volume.
pub const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The token volume's name prefix (kube-apiserver's `kube-api-access-<5 characters>`).
const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";

/// The volume Kubernetes' ServiceAccount admission adds: a token (bound to the pod, an hour
/// and 7 seconds), the cluster CA from `kube-root-ca.crt`, the namespace.
fn token_volume(name: &str) -> skiff_api::api::Volume {
    use skiff_api::api::{
        ConfigMapProjection, DownwardApiProjection, DownwardApiVolumeFile, KeyToPath,
        ObjectFieldSelector, ProjectedVolumeSource, ServiceAccountTokenProjection, Volume,
        VolumeProjection,
    };
    Volume {
        name: name.to_string(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o644),
            sources: vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        audience: String::new(),
                        expiration_seconds: Some(3607),
                        path: "token".into(),
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: vec![KeyToPath {
                            key: "ca.crt".into(),
                            path: "ca.crt".into(),
                            mode: None,
                        }],
                        optional: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardApiProjection {
                        items: vec![DownwardApiVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: "v1".into(),
                                field_path: "metadata.namespace".into(),
                            }),
                            ..Default::default()
                        }],
                    }),
                    ..Default::default()
                },
            ],
        }),
        ..Default::default()
    }
}

/// The ServiceAccount admission: `serviceAccountName` defaults to `default`; when that
/// ServiceAccount exists and neither it nor the pod turns `automountServiceAccountToken`
/// off, a `kube-api-access-*` token volume is added and mounted read-only at
/// [`SERVICE_ACCOUNT_MOUNT`] in every container that runs an image and does not mount
/// something there already (`host` containers take no volumes). A pod naming a
/// ServiceAccount that does not exist is refused with Kubernetes' message; unlike
/// Kubernetes, a missing `default` is no refusal, the pod gets no token (clusters without
/// the controller manager have none).
/// `service_account` reads a ServiceAccount (namespace, name) as the store has it now.
pub(crate) async fn service_account_admission(
    pod: &mut Pod,
    service_account: impl AsyncFnOnce(
        String,
        String,
    ) -> Result<Option<skiff_api::api::ServiceAccount>, ApiError>,
) -> Result<(), ApiError> {
    let namespace = pod.namespace().to_string();
    let Some(spec) = pod.spec.as_mut() else {
        return Ok(());
    };
    if spec.service_account_name.is_empty() {
        spec.service_account_name = "default".into();
    }
    let sa = service_account(namespace.clone(), spec.service_account_name.clone()).await?;
    // A ServiceAccount the pod names must exist (`default` may be missing: clusters
    // without the controller manager have none, and such pods get no token).
    if sa.is_none() && spec.service_account_name != "default" {
        return Err(ApiError::Forbidden(format!(
            "pods {:?} is forbidden: error looking up service account {namespace}/{}: \
             serviceaccount {:?} not found",
            pod.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or(""),
            spec.service_account_name,
            spec.service_account_name
        )));
    }
    if spec.automount_service_account_token == Some(false)
        || spec
            .volumes
            .iter()
            .any(|v| v.name.starts_with(TOKEN_VOLUME_PREFIX))
    {
        return Ok(());
    }
    let wants = |c: &skiff_api::api::Container| {
        c.image != super::pod_security::HOST_IMAGE
            && !c
                .volume_mounts
                .iter()
                .any(|m| m.mount_path == SERVICE_ACCOUNT_MOUNT)
    };
    if !spec
        .containers
        .iter()
        .chain(&spec.init_containers)
        .any(wants)
    {
        return Ok(());
    }
    let Some(sa) = sa else {
        return Ok(());
    };
    if sa.automount_service_account_token == Some(false)
        && spec.automount_service_account_token != Some(true)
    {
        return Ok(());
    }
    let name = format!("{TOKEN_VOLUME_PREFIX}{}", super::random_suffix());
    spec.volumes.push(token_volume(&name));
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut())
    {
        if wants(c) {
            c.volume_mounts.push(skiff_api::api::VolumeMount {
                name: name.clone(),
                mount_path: SERVICE_ACCOUNT_MOUNT.into(),
                read_only: true,
                ..Default::default()
            });
        }
    }
    Ok(())
}

#[async_trait]
impl Strategy for Pod {
    fn default(&mut self) {
        if let Some(spec) = self.spec.as_mut() {
            default_pod_spec(spec);
        }
    }

    /// Writes through `ephemeralcontainers` change `spec.ephemeralContainers` only.
    fn copy_subresource_from(&mut self, new: &Self, subresource: &str) -> bool {
        if subresource != EPHEMERAL_CONTAINERS {
            return false;
        }
        let added = new
            .spec
            .as_ref()
            .map(|s| s.ephemeral_containers.clone())
            .unwrap_or_default();
        if let Some(spec) = self.spec.as_mut() {
            spec.ephemeral_containers = added;
        }
        true
    }

    /// The main update keeps the stored ephemeral containers: only their subresource
    /// changes them.
    fn prepare_update(&mut self, old: &Self) {
        let kept = old
            .spec
            .as_ref()
            .map(|s| s.ephemeral_containers.clone())
            .unwrap_or_default();
        if let Some(spec) = self.spec.as_mut() {
            spec.ephemeral_containers = kept;
        }
    }

    /// A new pod is Pending, without ephemeral containers (they are added to a running pod).
    fn prepare_create(&mut self) {
        if let Some(spec) = self.spec.as_mut() {
            spec.ephemeral_containers.clear();
        }
        let status = self.status.get_or_insert_with(PodStatus::default);
        if status.phase.is_empty() {
            status.phase = "Pending".into();
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        validate_pod_spec(&mut out, "spec", self.spec.as_ref());
        if let Some(s) = &self.status
            && !matches!(
                s.phase.as_str(),
                "" | "Pending" | "Running" | "Succeeded" | "Failed" | "Unknown"
            )
        {
            out.push(FieldError::not_supported(
                "status.phase",
                &s.phase,
                &["Pending", "Running", "Succeeded", "Failed", "Unknown"],
            ));
        }
        out
    }

    /// A pod's spec is immutable except container images, activeDeadlineSeconds,
    /// terminationGracePeriodSeconds and additions to tolerations; nodeName is set only by
    /// the binding subresource.
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let node = |p: &Pod| {
            p.spec
                .as_ref()
                .map(|s| s.node_name.clone())
                .unwrap_or_default()
        };
        let (old_node, new_node) = (node(old), node(self));
        if old_node != new_node {
            out.push(FieldError::invalid(
                "spec.nodeName",
                &new_node,
                "field is immutable (use the binding subresource to assign a node)",
            ));
        }
        if immutable_part(self.spec.as_ref()) != immutable_part(old.spec.as_ref()) {
            out.push(FieldError::forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`, \
                 `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, \
                 `spec.tolerations` (only additions to existing tolerations), \
                 `spec.terminationGracePeriodSeconds`",
            ));
        }
        if let (Some(new), Some(old)) = (self.spec.as_ref(), old.spec.as_ref()) {
            validate_ephemeral_update(&mut out, new, old);
        }
        let tolerations = |p: &Pod| {
            p.spec
                .as_ref()
                .map(|s| s.tolerations.clone())
                .unwrap_or_default()
        };
        let new_tol = tolerations(self);
        if tolerations(old).iter().any(|t| !new_tol.contains(t)) {
            out.push(FieldError::forbidden(
                "spec.tolerations",
                "existing toleration can not be modified except its tolerationSeconds",
            ));
        }
        out
    }

    /// Graceful deletion: a pod bound to a node is marked (deletionTimestamp, grace period
    /// from the request or `spec.terminationGracePeriodSeconds`) and kept until its node agent
    /// deletes it with grace 0. Unbound and finished pods go at once.
    async fn delete_decision(
        &mut self,
        ctx: &DeleteContext<'_>,
    ) -> Result<DeleteDecision, ApiError> {
        let bound = self.spec.as_ref().is_some_and(|s| !s.node_name.is_empty());
        let finished = self
            .status
            .as_ref()
            .is_some_and(|s| matches!(s.phase.as_str(), "Succeeded" | "Failed"));
        if !bound || finished {
            return Ok(DeleteDecision::Now);
        }
        let grace = ctx.grace_period_seconds.unwrap_or_else(|| {
            self.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(DEFAULT_GRACE_SECONDS)
        });
        if grace <= 0 {
            Ok(DeleteDecision::Now)
        } else {
            Ok(DeleteDecision::Defer {
                grace_period_seconds: grace,
            })
        }
    }

    /// Assigns an unbound pod to the binding's target node and marks it PodScheduled.
    fn bind(&mut self, binding: &Binding, now: &str) -> Result<(), ApiError> {
        let name = self.name().to_string();
        let target = binding.target.clone().unwrap_or_default();
        let mut errors = Vec::new();
        if !matches!(target.kind.as_str(), "" | "Node") {
            errors.push(FieldError::not_supported(
                "target.kind",
                &target.kind,
                &["Node"],
            ));
        }
        if target.name.is_empty() {
            errors.push(FieldError::required("target.name", ""));
        } else {
            v::check_dns_subdomain(&mut errors, "target.name", &target.name);
        }
        if !errors.is_empty() {
            return Err(ApiError::Invalid {
                kind: "Binding".into(),
                name,
                errors,
            });
        }
        if self
            .metadata
            .as_ref()
            .is_some_and(|m| !m.deletion_timestamp.is_empty())
        {
            return Err(ApiError::Conflict(format!(
                "pod {name} is being deleted, cannot be assigned to a host"
            )));
        }
        let spec = self.spec.get_or_insert_with(PodSpec::default);
        if !spec.node_name.is_empty() {
            return Err(ApiError::Conflict(format!(
                "pod {name} is already assigned to node {:?}",
                spec.node_name
            )));
        }
        spec.node_name = target.name;
        let status = self.status.get_or_insert_with(PodStatus::default);
        set_condition(
            &mut status.conditions,
            Condition {
                r#type: "PodScheduled".into(),
                status: "True".into(),
                last_transition_time: now.to_string(),
                ..Default::default()
            },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ContainerPort, ExecAction, HttpGetAction, ObjectMeta, ObjectReference};

    fn pod(containers: Vec<Container>) -> Pod {
        let mut p = Pod {
            metadata: Some(ObjectMeta {
                name: "p".into(),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers,
                ..Default::default()
            }),
            ..Default::default()
        };
        Strategy::default(&mut p);
        p
    }

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: "host".into(),
            ..Default::default()
        }
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn defaults() {
        let mut c = container("a");
        c.ports.push(ContainerPort {
            container_port: 80,
            host_port: Some(0),
            ..Default::default()
        });
        c.liveness_probe = Some(Probe {
            exec: Some(ExecAction {
                command: vec!["true".into()],
            }),
            ..Default::default()
        });
        let p = pod(vec![c]);
        let spec = p.spec.as_ref().expect("spec");
        assert_eq!(spec.restart_policy, "Always");
        assert_eq!(spec.scheduler_name, "default-scheduler");
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.containers[0].ports[0].protocol, "TCP");
        assert_eq!(
            spec.containers[0].ports[0].host_port, None,
            "0 is no host port"
        );
        assert_eq!(
            spec.containers[0]
                .liveness_probe
                .as_ref()
                .map(|p| p.period_seconds),
            Some(10)
        );
        assert!(p.validate().is_empty(), "{:?}", p.validate());
    }

    #[test]
    fn validation_errors_name_fields() {
        let mut bad = container("Web");
        bad.image.clear();
        bad.ports.push(ContainerPort {
            container_port: 70000,
            ..Default::default()
        });
        bad.readiness_probe = Some(Probe {
            exec: Some(ExecAction {
                command: vec!["x".into()],
            }),
            http_get: Some(HttpGetAction {
                port: "80".into(),
                ..Default::default()
            }),
            period_seconds: -1,
            ..Default::default()
        });
        let mut p = pod(vec![bad, container("a"), container("a")]);
        if let Some(s) = p.spec.as_mut() {
            s.restart_policy = "Sometimes".into();
        }
        let errs = messages(&p.validate());
        for want in [
            "spec.containers[0].name: Invalid value: \"Web\"",
            "spec.containers[0].image: Required value",
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000",
            "spec.containers[0].readinessProbe: Forbidden: may not specify more than 1 handler type",
            "spec.containers[0].readinessProbe.periodSeconds: Invalid value: -1",
            "spec.containers[2].name: Duplicate value: \"a\"",
            "spec.restartPolicy: Unsupported value: \"Sometimes\"",
        ] {
            assert!(
                errs.iter().any(|e| e.starts_with(want)),
                "{want} not in {errs:#?}"
            );
        }
        assert_eq!(
            messages(&pod(vec![]).validate()),
            vec!["spec.containers: Required value".to_string()]
        );
    }

    #[test]
    fn spec_is_immutable_except_images() {
        let old = pod(vec![container("a")]);
        let mut new = old.clone();
        if let Some(s) = new.spec.as_mut() {
            s.containers[0].image = "/other".into();
        }
        assert!(new.validate_update(&old).is_empty());
        if let Some(s) = new.spec.as_mut() {
            s.containers.push(container("b"));
        }
        assert_eq!(new.validate_update(&old).len(), 1);
        let mut moved = old.clone();
        if let Some(s) = moved.spec.as_mut() {
            s.node_name = "n1".into();
        }
        assert!(messages(&moved.validate_update(&old))[0].starts_with("spec.nodeName"));
    }

    #[test]
    fn bind_sets_node_once() {
        let mut p = pod(vec![container("a")]);
        let binding = Binding {
            target: Some(ObjectReference {
                kind: "Node".into(),
                name: "n1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.bind(&binding, "2024-01-01T00:00:00Z").expect("bind");
        assert_eq!(p.spec.as_ref().map(|s| s.node_name.as_str()), Some("n1"));
        let conds = &p.status.as_ref().expect("status").conditions;
        assert_eq!(conds[0].r#type, "PodScheduled");
        assert_eq!(conds[0].status, "True");
        let err = p.bind(&binding, "x").expect_err("double bind");
        assert_eq!(err.to_string(), "pod p is already assigned to node \"n1\"");
    }

    fn ephemeral(name: &str, target: &str) -> EphemeralContainer {
        EphemeralContainer {
            name: name.into(),
            image: "host".into(),
            command: vec!["sh".into()],
            target_container_name: target.into(),
            ..Default::default()
        }
    }

    /// The stored pod `old` written through the ephemeralcontainers subresource with `new`'s
    /// list, as the registry does it.
    fn through_subresource(old: &Pod, list: Vec<EphemeralContainer>) -> Pod {
        let mut new = old.clone();
        new.spec.as_mut().expect("spec").ephemeral_containers = list;
        let mut written = old.clone();
        assert!(written.copy_subresource_from(&new, EPHEMERAL_CONTAINERS));
        written
    }

    #[test]
    fn ephemeral_containers_may_only_be_added() {
        let old = pod(vec![container("app")]);
        let added = through_subresource(&old, vec![ephemeral("debugger", "app")]);
        assert!(
            added.validate().is_empty(),
            "{:?}",
            messages(&added.validate())
        );
        assert!(added.validate_update(&old).is_empty());

        // Changing one that exists, or removing it, is refused.
        let mut changed = ephemeral("debugger", "app");
        changed.image = "/srv/root".into();
        let errs = through_subresource(&added, vec![changed]).validate_update(&added);
        assert!(
            messages(&errs).iter().any(
                |m| m.contains("existing ephemeral containers \"debugger\" may not be changed")
            ),
            "{:?}",
            messages(&errs)
        );
        let errs = through_subresource(&added, vec![]).validate_update(&added);
        assert!(
            messages(&errs)
                .iter()
                .any(|m| m.contains("may not be removed")),
            "{:?}",
            messages(&errs)
        );
        // Read back and sent again, an empty field that came back absent is no change.
        let mut stored = ephemeral("debugger", "app");
        stored.resources = Some(Default::default());
        let before = through_subresource(&old, vec![stored]);
        let same = through_subresource(&before, vec![ephemeral("debugger", "app")]);
        assert!(same.validate_update(&before).is_empty());
        // A second one next to the first is fine.
        let two = through_subresource(
            &added,
            vec![ephemeral("debugger", "app"), ephemeral("debugger-2", "")],
        );
        assert!(two.validate().is_empty() && two.validate_update(&added).is_empty());
    }

    #[test]
    fn ephemeral_containers_are_validated_as_kubernetes_does() {
        let old = pod(vec![container("app")]);
        let mut bad = ephemeral("app", "nosuch");
        bad.ports.push(ContainerPort {
            container_port: 80,
            protocol: "TCP".into(),
            ..Default::default()
        });
        bad.readiness_probe = Some(Probe {
            exec: Some(ExecAction {
                command: vec!["true".into()],
            }),
            ..Default::default()
        });
        let errs = messages(&through_subresource(&old, vec![bad]).validate());
        for want in [
            "spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container",
            "spec.ephemeralContainers[0].readinessProbe: Forbidden",
            "spec.ephemeralContainers[0].targetContainerName: Not found: \"nosuch\"",
            "spec.ephemeralContainers[0].name: Duplicate value: \"app\"",
        ] {
            assert!(errs.iter().any(|e| e.contains(want)), "{want} in {errs:?}");
        }
    }

    #[test]
    fn only_the_subresource_changes_ephemeral_containers() {
        let stored = through_subresource(
            &pod(vec![container("app")]),
            vec![ephemeral("debugger", "app")],
        );
        // The main update keeps the stored list whatever it sends.
        let mut update = stored.clone();
        update.spec.as_mut().expect("spec").ephemeral_containers = vec![];
        update.prepare_update(&stored);
        assert_eq!(
            update.spec.as_ref().expect("spec").ephemeral_containers,
            stored.spec.as_ref().expect("spec").ephemeral_containers
        );
        // A create drops them.
        let mut created = stored.clone();
        created.prepare_create();
        assert!(created.spec.expect("spec").ephemeral_containers.is_empty());
        // The subresource copies only the list: the rest of the sent pod is ignored.
        let mut sneaky = stored.clone();
        let spec = sneaky.spec.as_mut().expect("spec");
        spec.containers[0].image = "/".into();
        spec.ephemeral_containers.push(ephemeral("two", ""));
        let mut written = stored.clone();
        assert!(written.copy_subresource_from(&sneaky, EPHEMERAL_CONTAINERS));
        let spec = written.spec.expect("spec");
        assert_eq!(spec.containers[0].image, "host");
        assert_eq!(spec.ephemeral_containers.len(), 2);
        assert!(
            !<Pod as std::default::Default>::default().copy_subresource_from(&sneaky, "approval")
        );
    }

    #[test]
    fn pod_security_checks_ephemeral_containers() {
        use super::super::pod_security::{Level, verdict};
        let mut app = container("app");
        app.image = "registry.example/app:1".into();
        let stored = pod(vec![app]);
        let spec = stored.spec.as_ref().expect("spec");
        assert_eq!(verdict(Level::Baseline, spec), None);
        let debugged = through_subresource(&stored, vec![ephemeral("debugger", "app")]);
        let v = verdict(Level::Baseline, debugged.spec.as_ref().expect("spec"))
            .expect("an ephemeral host container violates baseline");
        assert!(v.contains("host image (container \"debugger\""), "{v}");
        assert!(super::super::pod_security::significant_update(
            debugged.spec.as_ref().expect("spec"),
            spec
        ));
    }
}
