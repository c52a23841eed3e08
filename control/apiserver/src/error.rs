//! The API server's errors and their one mapping onto gRPC statuses.
//!
//! Every operation returns [`ApiError`]; [`ApiError::to_status`] is the only place that turns
//! one into a [`tonic::Status`], following the contract in `rpc.proto`: the gRPC code carries
//! the class of failure and the `skiff-reason` metadata key carries a Kubernetes-style reason
//! (`Conflict`, `AlreadyExists`, `NotFound`, `Invalid`, `Expired`, `BadRequest`, `Internal`,
//! and additionally `Forbidden` for writes into a terminating namespace and `Unavailable` for
//! a store that cannot be reached).

use std::fmt;

use skiff_api::KindInfo;
use skiff_store::StoreError;
use tonic::{Code, Status};

/// The metadata key holding the machine-readable reason of a failed call.
pub const REASON_KEY: &str = "skiff-reason";

/// The kind of problem with one field, as Kubernetes' `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`.
    Required,
    /// `Invalid value`.
    Invalid,
    /// `Unsupported value` (not one of a fixed set).
    NotSupported,
    /// `Duplicate value`.
    Duplicate,
    /// `Forbidden` (e.g. changing an immutable field).
    Forbidden,
    /// `Too long`.
    TooLong,
    /// `Not found` (a reference to something the object does not have).
    NotFound,
    /// `Too many` (a list or map longer than its schema allows).
    TooMany,
    /// `Invalid value` of the wrong type (`FieldValueTypeInvalid`).
    TypeInvalid,
}

/// One invalid field of an object, with the path of the field (`spec.containers[0].image`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub kind: FieldErrorKind,
    /// The offending value, already formatted (strings quoted, numbers bare), if any.
    pub value: Option<String>,
    pub detail: String,
}

impl FieldError {
    pub fn required(path: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::Required,
            value: None,
            detail: detail.into(),
        }
    }

    /// An invalid value. `value` is formatted with `{:?}`, so strings appear quoted and
    /// numbers bare, as in Kubernetes' messages.
    pub fn invalid(
        path: impl Into<String>,
        value: impl fmt::Debug,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::Invalid,
            value: Some(format!("{value:?}")),
            detail: detail.into(),
        }
    }

    pub fn not_supported(path: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::NotSupported,
            value: Some(format!("{value:?}")),
            detail: format!("supported values: {}", list.join(", ")),
        }
    }

    pub fn duplicate(path: impl Into<String>, value: impl fmt::Debug) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::Duplicate,
            value: Some(format!("{value:?}")),
            detail: String::new(),
        }
    }

    pub fn forbidden(path: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::Forbidden,
            value: None,
            detail: detail.into(),
        }
    }

    pub fn too_long(path: impl Into<String>, max: usize) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::TooLong,
            value: None,
            detail: format!("must have at most {max} bytes"),
        }
    }

    /// An invalid field without a value to show: renders as `path: detail`.
    pub fn message(path: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::Invalid,
            value: None,
            detail: detail.into(),
        }
    }

    pub fn not_found(path: impl Into<String>, value: impl fmt::Debug) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::NotFound,
            value: Some(format!("{value:?}")),
            detail: String::new(),
        }
    }

    /// The error for changing an immutable field.
    pub fn immutable(path: impl Into<String>, value: impl fmt::Debug) -> Self {
        Self::invalid(path, value, "field is immutable")
    }
}

impl FieldError {
    /// Kubernetes' `StatusCause.reason` for this field error (`FieldValueInvalid`, ...).
    pub fn cause_reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::NotFound => "FieldValueNotFound",
            FieldErrorKind::TooMany => "FieldValueTooMany",
            FieldErrorKind::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    /// The cause's message: this error without its path (`Invalid value: "x": detail`).
    pub fn cause_message(&self) -> String {
        let full = self.to_string();
        full.strip_prefix(&format!("{}: ", self.path))
            .map(str::to_string)
            .unwrap_or(full)
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == FieldErrorKind::Invalid && self.value.is_none() {
            return write!(f, "{}: {}", self.path, self.detail);
        }
        let what = match self.kind {
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Invalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::NotFound => "Not found",
            FieldErrorKind::TooMany => "Too many",
            FieldErrorKind::TypeInvalid => "Invalid value",
        };
        write!(f, "{}: {what}", self.path)?;
        if let Some(v) = &self.value {
            write!(f, ": {v}")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// `Deployment.apps`-style kind name used in "is invalid" messages.
pub(crate) fn group_kind(info: &KindInfo) -> String {
    match info.group() {
        "" => info.kind.to_string(),
        g => format!("{}.{g}", info.kind),
    }
}

/// Go's `ErrorList.ToAggregate()` text: one error as it is, several in brackets.
pub(crate) fn join_field_errors(errors: &[FieldError]) -> String {
    match errors {
        [one] => one.to_string(),
        many => {
            let parts: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

/// Every error an API operation can return.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// `pods "x" not found`.
    #[error("{resource} {name:?} not found")]
    NotFound { resource: String, name: String },
    /// `pods "x" already exists`.
    #[error("{resource} {name:?} already exists")]
    AlreadyExists { resource: String, name: String },
    /// A resourceVersion or UID precondition failed, or a state conflict (double bind).
    #[error("{0}")]
    Conflict(String),
    /// A server-side apply would change fields other managers own (`force` moves them).
    #[error("{message}")]
    ApplyConflict {
        message: String,
        /// (field path, cause message) per conflicting field.
        causes: Vec<(String, String)>,
    },
    /// Validation failed; `errors` names every bad field.
    #[error("{kind} {name:?} is invalid: {}", join_field_errors(.errors))]
    Invalid {
        /// `Deployment.apps`.
        kind: String,
        name: String,
        errors: Vec<FieldError>,
    },
    /// The request itself is malformed (undecodable object, unknown subresource, bad
    /// selector syntax, unsupported field selector).
    #[error("{0}")]
    BadRequest(String),
    /// The resource type is not served.
    #[error("the server could not find the requested resource {0:?}")]
    UnknownResource(String),
    /// The requested resourceVersion is outside the window the server can serve: relist.
    #[error("{0}")]
    Expired(String),
    /// The namespace of a namespaced request does not exist.
    #[error("namespaces {0:?} not found")]
    NamespaceNotFound(String),
    /// Admission refused the request (Pod Security): 403 with this whole message.
    #[error("{0}")]
    Forbidden(String),
    /// The namespace is being deleted; nothing new may be created in it.
    #[error("unable to create new content in namespace {0} because it is being terminated")]
    NamespaceTerminating(String),
    /// A patch that cannot be applied to the object (a JSON patch `test` that does not hold,
    /// a path that does not exist).
    #[error("{0}")]
    UnprocessablePatch(String),
    /// The body is in a format the server does not read.
    #[error(
        "the body of the request was in an unknown format ({0}) - accepted media types include: \
         application/json, application/yaml, application/vnd.kubernetes.protobuf, \
         application/json-patch+json, \
         application/merge-patch+json, application/strategic-merge-patch+json, \
         application/apply-patch+yaml"
    )]
    UnsupportedMediaType(String),
    /// Refused for now, may work later (an eviction a PodDisruptionBudget does not allow
    /// yet): 429 with `causes` (reason, message).
    #[error("{message}")]
    TooManyRequests {
        message: String,
        causes: Vec<(String, String)>,
    },
    /// The store could not be reached or failed.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A bug or corrupt data.
    #[error("internal error: {0}")]
    Internal(String),
    /// An answer someone else chose (an admission webhook's refusal, a failed webhook call):
    /// its HTTP code (400 or more), Kubernetes reason (a known reason or "") and message.
    #[error("{message}")]
    Status {
        code: u16,
        reason: &'static str,
        message: String,
    },
    /// A ValidatingAdmissionPolicy's denial, as kube-apiserver words it:
    /// `deployments.apps "web" is forbidden: <denial>`, with the validation's code and
    /// reason, and the denial as the one cause (what kubectl prints for an Invalid answer).
    #[error("{resource} {name:?} is forbidden: {denial}")]
    Denied {
        code: u16,
        reason: &'static str,
        /// `deployments.apps`.
        resource: String,
        name: String,
        denial: String,
    },
}

impl ApiError {
    /// kube-apiserver's `InternalError` answer for a failure outside the server (a webhook's):
    /// 500, `Internal error occurred: <message>`.
    pub fn internal_error(message: impl std::fmt::Display) -> ApiError {
        ApiError::Status {
            code: 500,
            reason: "InternalError",
            message: format!("Internal error occurred: {message}"),
        }
    }
}

/// Kubernetes' `StatusReason`s, for answers whose reason comes from outside.
const KNOWN_REASONS: &[&str] = &[
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "Gone",
    "Invalid",
    "ServerTimeout",
    "StoreReadError",
    "Timeout",
    "TooManyRequests",
    "BadRequest",
    "MethodNotAllowed",
    "NotAcceptable",
    "RequestEntityTooLarge",
    "UnsupportedMediaType",
    "InternalError",
    "Expired",
    "ServiceUnavailable",
];

/// `reason` as a known `StatusReason`, or "" (StatusReasonUnknown).
pub(crate) fn known_reason(reason: &str) -> &'static str {
    KNOWN_REASONS
        .iter()
        .find(|r| **r == reason)
        .copied()
        .unwrap_or("")
}

impl ApiError {
    /// The gRPC code of this error (see `rpc.proto`).
    pub fn code(&self) -> Code {
        match self {
            ApiError::NotFound { .. } | ApiError::UnknownResource(_) => Code::NotFound,
            ApiError::AlreadyExists { .. } => Code::AlreadyExists,
            ApiError::Conflict(_) | ApiError::ApplyConflict { .. } => Code::Aborted,
            ApiError::Invalid { .. }
            | ApiError::BadRequest(_)
            | ApiError::UnsupportedMediaType(_)
            | ApiError::UnprocessablePatch(_) => Code::InvalidArgument,
            ApiError::Expired(_) => Code::OutOfRange,
            ApiError::NamespaceNotFound(_) | ApiError::NamespaceTerminating(_) => {
                Code::FailedPrecondition
            }
            ApiError::Forbidden(_) => Code::PermissionDenied,
            ApiError::Unavailable(_) => Code::Unavailable,
            ApiError::TooManyRequests { .. } => Code::ResourceExhausted,
            ApiError::Internal(_) => Code::Internal,
            ApiError::Status { code, .. } | ApiError::Denied { code, .. } => match code {
                401 => Code::Unauthenticated,
                403 => Code::PermissionDenied,
                404 => Code::NotFound,
                409 => Code::Aborted,
                429 => Code::ResourceExhausted,
                503 => Code::Unavailable,
                504 => Code::DeadlineExceeded,
                500.. => Code::Internal,
                _ => Code::InvalidArgument,
            },
        }
    }

    /// The value of the `skiff-reason` metadata key.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::NotFound { .. }
            | ApiError::UnknownResource(_)
            | ApiError::NamespaceNotFound(_) => "NotFound",
            ApiError::AlreadyExists { .. } => "AlreadyExists",
            ApiError::Conflict(_) | ApiError::ApplyConflict { .. } => "Conflict",
            ApiError::Invalid { .. } => "Invalid",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            ApiError::UnprocessablePatch(_) => "Invalid",
            ApiError::Expired(_) => "Expired",
            ApiError::NamespaceTerminating(_) | ApiError::Forbidden(_) => "Forbidden",
            ApiError::Unavailable(_) => "Unavailable",
            ApiError::TooManyRequests { .. } => "TooManyRequests",
            ApiError::Internal(_) => "Internal",
            ApiError::Status { reason, .. } | ApiError::Denied { reason, .. } => reason,
        }
    }

    /// The HTTP status code and Kubernetes `Status.reason` of this error (the REST API's
    /// one mapping, as kube-apiserver answers the same failure).
    pub fn http(&self) -> (u16, &'static str) {
        match self {
            ApiError::NotFound { .. }
            | ApiError::UnknownResource(_)
            | ApiError::NamespaceNotFound(_) => (404, "NotFound"),
            ApiError::AlreadyExists { .. } => (409, "AlreadyExists"),
            ApiError::Conflict(_) | ApiError::ApplyConflict { .. } => (409, "Conflict"),
            ApiError::Invalid { .. } => (422, "Invalid"),
            ApiError::BadRequest(_) => (400, "BadRequest"),
            ApiError::UnsupportedMediaType(_) => (415, "UnsupportedMediaType"),
            ApiError::UnprocessablePatch(_) => (422, "Invalid"),
            ApiError::Expired(_) => (410, "Expired"),
            ApiError::NamespaceTerminating(_) | ApiError::Forbidden(_) => (403, "Forbidden"),
            ApiError::Unavailable(_) => (503, "ServiceUnavailable"),
            ApiError::TooManyRequests { .. } => (429, "TooManyRequests"),
            ApiError::Internal(_) => (500, "InternalError"),
            ApiError::Status { code, reason, .. } | ApiError::Denied { code, reason, .. } => {
                (*code, reason)
            }
        }
    }

    /// The one mapping of API errors onto gRPC statuses.
    pub fn to_status(&self) -> Status {
        let mut status = Status::new(self.code(), self.to_string());
        if let Ok(v) = self.reason().parse() {
            status.metadata_mut().insert(REASON_KEY, v);
        }
        status
    }

    pub(crate) fn not_found(info: &KindInfo, name: &str) -> Self {
        ApiError::NotFound {
            resource: info.qualified(),
            name: name.to_string(),
        }
    }

    pub(crate) fn already_exists(info: &KindInfo, name: &str) -> Self {
        ApiError::AlreadyExists {
            resource: info.qualified(),
            name: name.to_string(),
        }
    }

    /// Kubernetes' optimistic-concurrency message.
    pub(crate) fn modified(info: &KindInfo, name: &str) -> Self {
        ApiError::Conflict(format!(
            "Operation cannot be fulfilled on {} {name:?}: the object has been modified; \
             please apply your changes to the latest version and try again",
            info.qualified()
        ))
    }

    pub(crate) fn invalid(info: &KindInfo, name: &str, errors: Vec<FieldError>) -> Self {
        ApiError::Invalid {
            kind: group_kind(info),
            name: name.to_string(),
            errors,
        }
    }

    /// Maps a store error that the caller did not handle specifically.
    pub(crate) fn from_store(e: StoreError) -> Self {
        match e {
            StoreError::Backend(m) => ApiError::Unavailable(m),
            StoreError::Compacted {
                requested,
                compacted,
            } => ApiError::Expired(format!(
                "too old resource version: {requested} ({compacted})"
            )),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        e.to_status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::Resource;
    use skiff_api::api::{Deployment, Pod};

    #[test]
    fn invalid_message_names_the_field() {
        let e = ApiError::invalid(
            &Deployment::INFO,
            "web",
            vec![FieldError::invalid(
                "spec.replicas",
                -1,
                "must be greater than or equal to 0",
            )],
        );
        assert_eq!(
            e.to_string(),
            "Deployment.apps \"web\" is invalid: spec.replicas: Invalid value: -1: \
             must be greater than or equal to 0"
        );
        let s = e.to_status();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(
            s.metadata().get(REASON_KEY).and_then(|v| v.to_str().ok()),
            Some("Invalid")
        );
    }

    #[test]
    fn several_field_errors_are_listed() {
        let e = ApiError::invalid(
            &Pod::INFO,
            "p",
            vec![
                FieldError::required("spec.containers", ""),
                FieldError::not_supported("spec.restartPolicy", "Sometimes", &["Always"]),
            ],
        );
        assert_eq!(
            e.to_string(),
            "Pod \"p\" is invalid: [spec.containers: Required value, spec.restartPolicy: \
             Unsupported value: \"Sometimes\": supported values: \"Always\"]"
        );
    }

    #[test]
    fn conflict_message_is_kubernetes_like() {
        let e = ApiError::modified(&Deployment::INFO, "web");
        assert!(
            e.to_string().starts_with(
                "Operation cannot be fulfilled on deployments.apps \"web\": the object has been modified"
            ),
            "{e}"
        );
        assert_eq!(e.to_status().code(), Code::Aborted);
    }

    #[test]
    fn codes_follow_the_contract() {
        assert_eq!(
            ApiError::Expired("x".into()).to_status().code(),
            Code::OutOfRange
        );
        assert_eq!(
            ApiError::NamespaceNotFound("x".into()).to_status().code(),
            Code::FailedPrecondition
        );
        assert_eq!(
            ApiError::from_store(StoreError::Backend("down".into()))
                .to_status()
                .code(),
            Code::Unavailable
        );
        assert_eq!(
            ApiError::not_found(&Pod::INFO, "p").to_string(),
            "pods \"p\" not found"
        );
    }
}
