//! What every layer of a request knows about it: who asks ([`UserInfo`] and the well-known
//! users and groups), what they ask to do ([`Attributes`], kube-apiserver's
//! `authorizer.Attributes`), an authorizer's [`Decision`], and the request's audit record
//! ([`AuditRecord`]), which the pipeline opens, authorization and admission fill and the
//! audit log writes.
//!
//! A leaf: it imports nothing else from this crate, so the registry, admission and the
//! front ends can all name a request without depending on authentication.

use std::sync::{Arc, Mutex};

/// The group every authenticated user is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The anonymous user and its group.
pub const ANONYMOUS_USER: &str = "system:anonymous";
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";

/// An authenticated user, as Kubernetes' `user.Info`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    /// Kubernetes' `user.Info` extra: a bound ServiceAccount token's pod
    /// (`authentication.kubernetes.io/pod-name`, `.../pod-uid`).
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// The extra keys of a token bound to a pod.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// The groups of every ServiceAccount.
pub const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

impl UserInfo {
    pub(crate) fn authenticated(name: String, uid: String, mut groups: Vec<String>) -> UserInfo {
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.to_string());
        }
        UserInfo {
            name,
            uid,
            groups,
            extra: Default::default(),
        }
    }

    pub(crate) fn anonymous() -> UserInfo {
        UserInfo {
            name: ANONYMOUS_USER.into(),
            groups: vec![UNAUTHENTICATED_GROUP.into()],
            ..UserInfo::default()
        }
    }
}

/// The group whose members may do anything.
pub const MASTERS_GROUP: &str = "system:masters";

/// What a request asks to do, as kube-apiserver's `authorizer.Attributes`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attributes {
    pub verb: String,
    pub namespace: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// A non-resource request (`/healthz`, `/apis`): its path. `None` for resources.
    pub path: Option<String>,
    /// A list or watch's field selector (the Node authorizer reads `spec.nodeName`).
    pub field_selector: String,
    /// The name in a create's body (RBAC never sees it, as in Kubernetes; NodeRestriction
    /// checks it).
    pub object_name: String,
}

impl Attributes {
    /// A resource request.
    pub fn resource(
        verb: &str,
        api_group: &str,
        resource: &str,
        subresource: &str,
        namespace: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            verb: verb.into(),
            namespace: namespace.into(),
            api_group: api_group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            name: name.into(),
            path: None,
            field_selector: String::new(),
            object_name: String::new(),
        }
    }

    /// A non-resource request.
    pub fn non_resource(verb: &str, path: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            path: Some(path.into()),
            ..Attributes::default()
        }
    }

    /// With a list's or watch's field selector; a list or watch of one object by
    /// `metadata.name=<name>` carries that name (kube-apiserver's request-info rule).
    pub fn selecting(mut self, field_selector: &str) -> Attributes {
        if self.name.is_empty()
            && matches!(self.verb.as_str(), "list" | "watch")
            && let Ok(f) = skiff_api::selector::FieldSelector::parse(field_selector)
            && let Some(n) = f.equality("metadata.name")
        {
            self.name = n.to_string();
        }
        self.field_selector = field_selector.to_string();
        self
    }

    /// `pods/exec` for a subresource request, else the resource.
    pub fn full_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// One authorizer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused, with the reason kube-apiserver appends to its message (may be empty).
    Deny(String),
    /// Refused with this whole message (NodeRestriction's admission errors).
    Refuse(String),
    NoOpinion,
}

/// The nodes' group.
pub const NODES_GROUP: &str = "system:nodes";
/// Prefix of a node's user name.
pub const NODE_USER_PREFIX: &str = "system:node:";

/// The node a user is, if it is one.
pub fn node_of(user: &UserInfo) -> Option<&str> {
    let name = user.name.strip_prefix(NODE_USER_PREFIX)?;
    (!name.is_empty() && user.groups.iter().any(|g| g == NODES_GROUP)).then_some(name)
}

/// The group of every bootstrap token.
pub const BOOTSTRAP_GROUP: &str = "system:bootstrappers";

/// What the request handlers learn about a request, for its audit event: filled by the
/// authorization step, read when the response is done.
#[derive(Debug, Default)]
pub struct AuditRecord {
    pub attributes: Option<Attributes>,
    /// `allow` or `forbid`, and the authorizer's reason.
    pub decision: Option<(&'static str, String)>,
    /// The admission plug-in that refused the request, and its message.
    pub admission: Option<(&'static str, String)>,
    /// Warnings for the client (`Warning` headers), from admission webhooks.
    pub warnings: Vec<String>,
    /// Annotations for the audit event (`<webhook name>/<key>`: an admission webhook's
    /// `auditAnnotations`).
    pub annotations: Vec<(String, String)>,
}

/// Shared by a request's layers.
pub type AuditSlot = Arc<Mutex<AuditRecord>>;

/// Records a request's attributes and the authorization decision for its audit event.
pub fn note_authorization(
    slot: Option<&AuditSlot>,
    attrs: &Attributes,
    result: &Result<(), String>,
) {
    if let Some(s) = slot
        && let Ok(mut r) = s.lock()
    {
        r.attributes = Some(attrs.clone());
        r.decision = Some(match result {
            Ok(()) => ("allow", String::new()),
            Err(m) => ("forbid", m.clone()),
        });
    }
}

/// Records that admission plug-in `plugin` refused the request (after authorization allowed
/// it), for its audit event.
pub fn note_admission(slot: Option<&AuditSlot>, plugin: &'static str, message: &str) {
    if let Some(s) = slot
        && let Ok(mut r) = s.lock()
    {
        r.admission = Some((plugin, message.to_string()));
    }
}

/// Adds a warning for the client and annotations for the audit event.
pub fn note_for_client(
    slot: Option<&AuditSlot>,
    warnings: impl IntoIterator<Item = String>,
    annotations: impl IntoIterator<Item = (String, String)>,
) {
    if let Some(s) = slot
        && let Ok(mut r) = s.lock()
    {
        r.warnings.extend(warnings);
        r.annotations.extend(annotations);
    }
}

/// The warnings noted for the client so far.
pub fn noted_warnings(slot: Option<&AuditSlot>) -> Vec<String> {
    slot.and_then(|s| s.lock().ok().map(|r| r.warnings.clone()))
        .unwrap_or_default()
}

/// Whether a request is a gRPC call.
pub fn is_grpc(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}
