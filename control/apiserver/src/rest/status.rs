//! Errors as Kubernetes writes them: a `Status` object with the HTTP code, the reason
//! (`NotFound`, `Invalid`, ...) and, for invalid objects, one cause per bad field.

use serde_json::{Value, json};

use crate::error::ApiError;

/// What a failed request was about, for `Status.details`.
#[derive(Debug, Clone, Default)]
pub struct Subject<'a> {
    pub name: &'a str,
    pub group: &'a str,
    /// The resource (plural), as kube-apiserver reports it in `details.kind`.
    pub resource: &'a str,
}

/// `{"kind":"Status","status":"Failure","reason":...,"code":...}` for `err`.
pub fn failure(err: &ApiError, subject: &Subject<'_>) -> (u16, Value) {
    let (code, reason) = err.http();
    let mut details = serde_json::Map::new();
    let mut put = |k: &str, v: &str| {
        if !v.is_empty() {
            details.insert(k.into(), Value::String(v.into()));
        }
    };
    match err {
        ApiError::NotFound { name, .. } | ApiError::AlreadyExists { name, .. } => {
            put("name", name);
            put("group", subject.group);
            put("kind", subject.resource);
        }
        ApiError::NamespaceNotFound(name) => {
            put("name", name);
            put("kind", "namespaces");
        }
        ApiError::Invalid { kind, name, .. } => {
            // `Deployment.apps`, `Pod`, `ListOptions.meta.k8s.io`: the group is the kind's
            // (for options it is not the resource's).
            let (kind, group) = kind.split_once('.').unwrap_or((kind, ""));
            put("name", name);
            put("group", group);
            put("kind", kind);
        }
        ApiError::Conflict(_) | ApiError::ApplyConflict { .. } => {
            put("name", subject.name);
            put("group", subject.group);
            put("kind", subject.resource);
        }
        _ => {}
    }
    if let ApiError::Invalid { errors, .. } = err {
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| {
                json!({
                    "reason": e.cause_reason(),
                    "message": e.cause_message(),
                    "field": e.path,
                })
            })
            .collect();
        details.insert("causes".into(), Value::Array(causes));
    }
    if let ApiError::TooManyRequests { causes, .. } = err {
        let causes: Vec<Value> = causes
            .iter()
            .map(|(reason, message)| json!({"reason": reason, "message": message}))
            .collect();
        details.insert("causes".into(), Value::Array(causes));
    }
    if let ApiError::ApplyConflict { causes, .. } = err {
        let causes: Vec<Value> = causes
            .iter()
            .map(|(field, message)| {
                json!({"reason": "FieldManagerConflict", "message": message, "field": field})
            })
            .collect();
        details.insert("causes".into(), Value::Array(causes));
    }
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": err.to_string(),
        "reason": reason,
        "code": code,
    });
    if !details.is_empty() {
        status["details"] = Value::Object(details);
    }
    (code, status)
}

/// A failure that is not an [`ApiError`] of an operation (bad content type, body too large,
/// unsupported media type, method not allowed).
pub fn plain(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }),
    )
}

/// `{"kind":"Status","status":"Success"}` with `details`, as a delete of a whole object.
pub fn success(details: Value) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FieldError;

    #[test]
    fn invalid_objects_list_their_fields() {
        let err = ApiError::Invalid {
            kind: "Deployment.apps".into(),
            name: "web".into(),
            errors: vec![
                FieldError::required("spec.selector", ""),
                FieldError::invalid("spec.replicas", -1, "must be greater than or equal to 0"),
            ],
        };
        let (code, s) = failure(
            &err,
            &Subject {
                name: "web",
                group: "apps",
                resource: "deployments",
            },
        );
        assert_eq!(code, 422);
        assert_eq!(s["reason"], "Invalid");
        assert_eq!(s["details"]["kind"], "Deployment");
        assert_eq!(s["details"]["group"], "apps");
        assert_eq!(s["details"]["causes"][0]["field"], "spec.selector");
        assert_eq!(s["details"]["causes"][0]["reason"], "FieldValueRequired");
        assert_eq!(
            s["details"]["causes"][1]["message"],
            "Invalid value: -1: must be greater than or equal to 0"
        );
        assert!(
            s["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Deployment.apps \"web\" is invalid: ")
        );
    }

    #[test]
    fn invalid_options_name_their_own_group() {
        let err = ApiError::Invalid {
            kind: "ListOptions.meta.k8s.io".into(),
            name: String::new(),
            errors: vec![FieldError::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )],
        };
        let subject = Subject {
            name: "",
            group: "apps",
            resource: "deployments",
        };
        let (code, s) = failure(&err, &subject);
        assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")));
        assert_eq!(
            s["message"],
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
             sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
        );
        assert_eq!(s["details"]["group"], "meta.k8s.io");
        assert_eq!(s["details"]["kind"], "ListOptions");
        assert!(s["details"].get("name").is_none());
        assert_eq!(s["details"]["causes"][0]["field"], "resourceVersionMatch");
        assert_eq!(s["details"]["causes"][0]["reason"], "FieldValueForbidden");
    }

    #[test]
    fn not_found_and_conflict() {
        let subject = Subject {
            name: "x",
            group: "",
            resource: "pods",
        };
        let (code, s) = failure(
            &ApiError::NotFound {
                resource: "pods".into(),
                name: "x".into(),
            },
            &subject,
        );
        assert_eq!((code, s["reason"].as_str()), (404, Some("NotFound")));
        assert_eq!(s["message"], "pods \"x\" not found");
        assert_eq!(s["details"]["kind"], "pods");
        assert!(s["details"].get("group").is_none());
        let (code, s) = failure(
            &ApiError::Expired("too old resource version: 1 (5)".into()),
            &subject,
        );
        assert_eq!((code, s["reason"].as_str()), (410, Some("Expired")));
    }
}
