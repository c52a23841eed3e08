//! Per-kind logic: defaulting, validation, delete and bind hooks.
//!
//! The registry ([`crate::registry::Handler`]) implements every operation once, generically;
//! what differs between kinds lives here, in one small [`Strategy`] impl per kind whose
//! methods all default to "nothing special".

use async_trait::async_trait;
use skiff_api::Resource;
use skiff_api::api::{Binding, Endpoints, Event, Lease, Namespace, NamespaceStatus, Node};
use skiff_store::Store;

use crate::error::{ApiError, FieldError};
use chrono::{SecondsFormat, Utc};
use rand::Rng;

use crate::stored::key_prefix;
use crate::validation::{self as v, NameRule};

pub mod admissionregistration;
pub mod apiextensions;
pub mod apiregistration;
mod apps;
mod autoscaling;
pub mod batch;
pub mod certificates;
mod lb_pool;
mod networking;
pub(crate) mod pod;
pub mod pod_security;
mod pod_volumes;
pub(crate) mod policy;
pub mod rbac;
mod secret;
mod service;
pub(crate) mod storage;

/// What a delete hook decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteDecision {
    /// Remove the object now (unless finalizers keep it).
    Now,
    /// Keep the object, marked with `deletionTimestamp` and this grace period, until a later
    /// delete decides otherwise (a pod's node agent deletes with grace 0 once it stopped the
    /// containers; a namespace is removed by a delete once it is empty).
    Defer { grace_period_seconds: i64 },
}

/// The store key prefixes of the namespaced custom kinds being served (the registry keeps
/// it current; a namespace is not empty while any holds an object in it).
pub type CustomPrefixes = std::sync::Arc<std::sync::RwLock<Vec<String>>>;

/// What a delete hook may consult.
pub struct DeleteContext<'a> {
    pub(crate) store: &'a dyn Store,
    pub(crate) custom_prefixes: &'a CustomPrefixes,
    /// The grace period the client asked for, if any.
    pub grace_period_seconds: Option<i64>,
}

impl std::fmt::Debug for DeleteContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeleteContext")
            .field("grace_period_seconds", &self.grace_period_seconds)
            .finish_non_exhaustive()
    }
}

impl DeleteContext<'_> {
    /// Whether any namespaced resource, typed or custom, has an object in `namespace`.
    pub async fn namespace_has_content(&self, namespace: &str) -> Result<bool, ApiError> {
        let mut prefixes: Vec<String> = skiff_api::kinds()
            .iter()
            .map(|k| k.info())
            .filter(|info| info.namespaced)
            .map(key_prefix)
            .collect();
        prefixes.extend(
            self.custom_prefixes
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned(),
        );
        for kind_prefix in prefixes {
            let prefix = format!("{kind_prefix}{namespace}/");
            let listing = self
                .store
                .list(&prefix, None)
                .await
                .map_err(ApiError::from_store)?;
            if !listing.items.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Per-kind behaviour. Every method has a no-op default.
///
/// Called by the generic handler in this order — create: [`Strategy::prepare_create`],
/// [`Strategy::default`], generic metadata validation + [`Strategy::validate`]; update:
/// (status carried over from the stored object), [`Strategy::prepare_update`],
/// [`Strategy::default`], [`Strategy::validate`] + [`Strategy::validate_update`]; a write of
/// the status subresource: (the stored object with the new status),
/// [`Strategy::prepare_status_update`], then as an update.
#[async_trait]
pub trait Strategy: crate::object::Object {
    /// Which DNS rule names of this kind follow.
    const NAME_RULE: NameRule = NameRule::Subdomain;

    /// Whether a create drops the status the client sent (kube-apiserver's strategies do,
    /// so no one can create a pod that claims an IP, or a workload that claims progress);
    /// `false` for kinds whose creator reports their status (a Node registering itself).
    const RESET_STATUS_ON_CREATE: bool = true;

    /// Fills in defaults (runs on create and on every update).
    fn default(&mut self) {}

    /// Adjusts a new object before defaulting (e.g. a new pod's phase is Pending).
    fn prepare_create(&mut self) {}

    /// Records who creates the object, for kinds that carry their requester (a
    /// CertificateSigningRequest's username and groups); runs after
    /// [`Strategy::prepare_create`] when the request was authenticated.
    fn stamp_requester(&mut self, _user: &crate::request::UserInfo) {}

    /// A write through a subresource other than `status` (a CertificateSigningRequest's
    /// `approval`): copies from `new` into `self` (the stored object) what that subresource
    /// may change; `false` when the kind has no such subresource.
    fn copy_subresource_from(&mut self, _new: &Self, _subresource: &str) -> bool {
        false
    }

    /// Adjusts an updated object before defaulting, given the stored one (e.g. a Service
    /// keeps its allocated clusterIP when the update leaves it empty).
    fn prepare_update(&mut self, _old: &Self) {}

    /// Adjusts an object written through the status subresource (the stored object with the
    /// client's status) before defaulting, given the stored one (a PersistentVolume's
    /// `lastPhaseTransitionTime` follows its phase).
    fn prepare_status_update(&mut self, _old: &Self) {}

    /// Kind-specific validation of the whole object.
    fn validate(&self) -> Vec<FieldError> {
        Vec::new()
    }

    /// Kind-specific update rules (immutable fields).
    fn validate_update(&self, _old: &Self) -> Vec<FieldError> {
        Vec::new()
    }

    /// Decides whether a delete removes the object now or marks it and keeps it. May modify
    /// the object (it is written back when kept).
    async fn delete_decision(
        &mut self,
        _ctx: &DeleteContext<'_>,
    ) -> Result<DeleteDecision, ApiError> {
        Ok(DeleteDecision::Now)
    }

    /// The binding subresource. `now` is the RFC 3339 time of the request.
    fn bind(&mut self, _binding: &Binding, _now: &str) -> Result<(), ApiError> {
        Err(ApiError::BadRequest(format!(
            "{} does not support binding",
            self.kind()
        )))
    }
}

#[async_trait]
impl Strategy for Namespace {
    const NAME_RULE: NameRule = NameRule::Label;

    /// `status.phase` is Active, or Terminating once a delete started; the label
    /// `kubernetes.io/metadata.name` is the namespace's name (set on every write, as
    /// Kubernetes does, so selectors can pick namespaces by name: NetworkPolicy's
    /// namespaceSelector).
    fn default(&mut self) {
        if let Some(m) = self.metadata.as_mut()
            && !m.name.is_empty()
        {
            m.labels
                .insert("kubernetes.io/metadata.name".into(), m.name.clone());
        }
        let terminating = self
            .metadata
            .as_ref()
            .is_some_and(|m| !m.deletion_timestamp.is_empty());
        let status = self.status.get_or_insert_with(NamespaceStatus::default);
        if terminating {
            status.phase = "Terminating".into();
        } else if status.phase.is_empty() {
            status.phase = "Active".into();
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        if let Some(m) = &self.metadata {
            out.extend(pod_security::check_labels(m));
        }
        if let Some(spec) = &self.spec {
            for (i, f) in spec.finalizers.iter().enumerate() {
                v::check_qualified_name(&mut out, &format!("spec.finalizers[{i}]"), f);
            }
        }
        if let Some(s) = &self.status
            && !matches!(s.phase.as_str(), "Active" | "Terminating")
        {
            out.push(FieldError::not_supported(
                "status.phase",
                &s.phase,
                &["Active", "Terminating"],
            ));
        }
        out
    }

    /// A namespace that still holds objects becomes Terminating (nothing new can be created in
    /// it) and stays until a delete finds it empty; an empty one is deleted at once. The
    /// namespace controller (in the controller manager) empties a terminating namespace and
    /// deletes it again.
    async fn delete_decision(
        &mut self,
        ctx: &DeleteContext<'_>,
    ) -> Result<DeleteDecision, ApiError> {
        if ctx.namespace_has_content(self.name()).await? {
            self.status
                .get_or_insert_with(NamespaceStatus::default)
                .phase = "Terminating".into();
            Ok(DeleteDecision::Defer {
                grace_period_seconds: 0,
            })
        } else {
            Ok(DeleteDecision::Now)
        }
    }
}

const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// Why `s` is not a CIDR the node agent and the allocators can use (the one parser they all
/// share), or `None`.
fn cidr_problem(s: &str) -> Option<String> {
    s.parse::<skiff_cidr::Cidr>()
        .err()
        .map(|e| format!("must be a valid CIDR: {}", e.reason))
}

impl Strategy for Node {
    /// An agent registers its Node with the status it observed.
    const RESET_STATUS_ON_CREATE: bool = false;

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            return out;
        };
        let mut seen = std::collections::BTreeSet::new();
        for (i, t) in spec.taints.iter().enumerate() {
            let p = format!("spec.taints[{i}]");
            if t.key.is_empty() {
                out.push(FieldError::required(format!("{p}.key"), ""));
            } else {
                v::check_qualified_name(&mut out, &format!("{p}.key"), &t.key);
            }
            for e in v::label_value(&t.value) {
                out.push(FieldError::invalid(format!("{p}.value"), &t.value, e));
            }
            if t.effect.is_empty() {
                out.push(FieldError::required(format!("{p}.effect"), ""));
            } else if !TAINT_EFFECTS.contains(&t.effect.as_str()) {
                out.push(FieldError::not_supported(
                    format!("{p}.effect"),
                    &t.effect,
                    TAINT_EFFECTS,
                ));
            }
            if !seen.insert((t.key.clone(), t.effect.clone())) {
                out.push(FieldError::duplicate(p, format!("{}:{}", t.key, t.effect)));
            }
        }
        if !spec.pod_cidr.is_empty()
            && let Some(why) = cidr_problem(&spec.pod_cidr)
        {
            out.push(FieldError::invalid("spec.podCIDR", &spec.pod_cidr, why));
        }
        for (i, c) in spec.pod_cidrs.iter().enumerate() {
            if let Some(why) = cidr_problem(c) {
                out.push(FieldError::invalid(format!("spec.podCIDRs[{i}]"), c, why));
            }
        }
        out
    }

    /// podCIDR may go from empty to set, never change afterwards.
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let cidr = |n: &Node| {
            n.spec
                .as_ref()
                .map(|s| s.pod_cidr.clone())
                .unwrap_or_default()
        };
        let (old_cidr, new_cidr) = (cidr(old), cidr(self));
        if !old_cidr.is_empty() && old_cidr != new_cidr {
            vec![FieldError::forbidden(
                "spec.podCIDR",
                "node updates may not change podCIDR except from \"\" to valid",
            )]
        } else {
            Vec::new()
        }
    }
}

impl Strategy for skiff_api::api::ServiceAccount {}

impl Strategy for Lease {
    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        if let Some(spec) = &self.spec {
            if let Some(d) = spec.lease_duration_seconds
                && d <= 0
            {
                out.push(FieldError::invalid(
                    "spec.leaseDurationSeconds",
                    d,
                    "must be greater than 0",
                ));
            }
            if let Some(t) = spec.lease_transitions {
                v::check_non_negative(&mut out, "spec.leaseTransitions", t.into());
            }
        }
        out
    }
}

const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];

impl Strategy for Endpoints {
    fn default(&mut self) {
        for s in &mut self.subsets {
            for p in &mut s.ports {
                if p.protocol.is_empty() {
                    p.protocol = "TCP".into();
                }
            }
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        for (i, s) in self.subsets.iter().enumerate() {
            let p = format!("subsets[{i}]");
            for (field, addrs) in [
                ("addresses", &s.addresses),
                ("notReadyAddresses", &s.not_ready_addresses),
            ] {
                for (j, a) in addrs.iter().enumerate() {
                    if a.ip.parse::<std::net::IpAddr>().is_err() {
                        out.push(FieldError::invalid(
                            format!("{p}.{field}[{j}].ip"),
                            &a.ip,
                            "must be a valid IP address",
                        ));
                    }
                }
            }
            let mut names = std::collections::BTreeSet::new();
            for (j, port) in s.ports.iter().enumerate() {
                let pp = format!("{p}.ports[{j}]");
                if s.ports.len() > 1 && port.name.is_empty() {
                    out.push(FieldError::required(format!("{pp}.name"), ""));
                } else if !port.name.is_empty() {
                    v::check_dns_label(&mut out, &format!("{pp}.name"), &port.name);
                    if !names.insert(port.name.clone()) {
                        out.push(FieldError::duplicate(format!("{pp}.name"), &port.name));
                    }
                }
                v::check_port_number(&mut out, &format!("{pp}.port"), port.port.into());
                if !PROTOCOLS.contains(&port.protocol.as_str()) {
                    out.push(FieldError::not_supported(
                        format!("{pp}.protocol"),
                        &port.protocol,
                        PROTOCOLS,
                    ));
                }
            }
        }
        out
    }
}

impl Strategy for Event {
    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        if let Some(o) = &self.involved_object
            && !o.namespace.is_empty()
            && o.namespace != self.namespace()
        {
            out.push(FieldError::invalid(
                "involvedObject.namespace",
                &o.namespace,
                "does not match event.namespace",
            ));
        }
        if !self.r#type.is_empty() && !matches!(self.r#type.as_str(), "Normal" | "Warning") {
            out.push(FieldError::not_supported(
                "type",
                &self.r#type,
                &["Normal", "Warning"],
            ));
        }
        out
    }
}

/// Kubernetes' alphabet for generated names (no vowels, no confusable characters).
pub(crate) const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// RFC 3339 UTC with seconds precision, e.g. `2024-05-01T12:00:00Z`.
pub(crate) fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// RFC 3339 UTC `seconds` from now.
pub(crate) fn rfc3339_in(seconds: i64) -> String {
    (Utc::now() + chrono::Duration::seconds(seconds)).to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Five characters for `generateName` and generated volume names.
pub(crate) fn random_suffix() -> String {
    let mut rng = rand::rng();
    (0..5)
        .map(|_| char::from(NAME_ALPHABET[rng.random_range(0..NAME_ALPHABET.len())]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{NodeSpec, ObjectMeta, Taint};

    #[test]
    fn node_taint_effects() {
        let mut n = Node {
            spec: Some(NodeSpec {
                taints: vec![
                    Taint {
                        key: "k".into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    },
                    Taint {
                        key: "k2".into(),
                        effect: "Sometimes".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let errs = n.validate();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0]
                .to_string()
                .starts_with("spec.taints[1].effect: Unsupported value")
        );
        if let Some(s) = n.spec.as_mut() {
            s.taints.truncate(1);
            s.pod_cidr = "10.0.0.0/24".into();
        }
        assert!(n.validate().is_empty());
        let mut changed = n.clone();
        if let Some(s) = changed.spec.as_mut() {
            s.pod_cidr = "10.0.1.0/24".into();
        }
        assert_eq!(changed.validate_update(&n).len(), 1);
    }

    /// The API accepts exactly the pod CIDRs the node agent and the allocators accept (one
    /// parser): host bits set is refused naming the network, IPv6 is valid syntax.
    #[test]
    fn pod_cidrs_are_validated_by_the_shared_parser() {
        let node = |cidr: &str, cidrs: &[&str]| Node {
            metadata: Some(ObjectMeta {
                name: "n".into(),
                ..Default::default()
            }),
            spec: Some(NodeSpec {
                pod_cidr: cidr.into(),
                pod_cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(
            node("10.244.1.0/24", &["10.244.1.0/24", "fd00:1::/64"])
                .validate()
                .is_empty()
        );
        let errs = node("10.244.1.5/24", &["fd00:1::1/64", "10.244.1.0"]).validate();
        let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 3, "{shown:?}");
        assert!(
            shown[0].starts_with("spec.podCIDR: Invalid value"),
            "{shown:?}"
        );
        assert!(
            shown[0].contains("(the network is 10.244.1.0/24)"),
            "{shown:?}"
        );
        assert!(
            shown[1].starts_with("spec.podCIDRs[0]: Invalid value"),
            "{shown:?}"
        );
        assert!(shown[1].contains("fd00:1::/64"), "{shown:?}");
        assert!(
            shown[2].contains("expected <address>/<prefix length>"),
            "{shown:?}"
        );
    }

    #[test]
    fn namespace_defaults_to_active_and_terminating_when_deleted() {
        let mut ns = <Namespace as Default>::default();
        Strategy::default(&mut ns);
        assert_eq!(ns.status.as_ref().map(|s| s.phase.as_str()), Some("Active"));
        ns.metadata_mut().deletion_timestamp = "2024-01-01T00:00:00Z".into();
        Strategy::default(&mut ns);
        assert_eq!(
            ns.status.as_ref().map(|s| s.phase.as_str()),
            Some("Terminating")
        );
    }
}
