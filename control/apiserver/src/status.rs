//! Every answer the HTTP front end writes: errors as Kubernetes writes them (a `Status`
//! object with the HTTP code, the reason (`NotFound`, `Invalid`, ...) and, for invalid
//! objects, one cause per bad field), the representation the client asked for ([`Format`],
//! [`negotiate`]: JSON, YAML, Table, metadata only), and the response itself ([`respond`],
//! with kube-apiserver's `Warning` headers). The authentication middleware, the request
//! limits, the REST API and the access reviews all answer through here.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
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
        ApiError::Denied { name, .. } => {
            put("name", name);
            put("group", subject.group);
            put("kind", subject.resource);
        }
        _ => {}
    }
    if let ApiError::Denied { denial, .. } = err {
        details.insert("causes".into(), json!([{"message": denial}]));
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

/// How the client wants the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Json,
    Yaml,
    Table,
    /// Only the metadata (`as=PartialObjectMetadata` for one object, `as=PartialObjectMetadataList`
    /// for a list; `meta.k8s.io` `v1` or `v1beta1`), as kube-rs' `get_metadata`,
    /// `list_metadata` and `metadata_watcher` and client-go's metadata client ask.
    Metadata {
        list: bool,
        v1beta1: bool,
    },
    /// Aggregated discovery (`apidiscovery.k8s.io/v2`).
    AggregatedDiscovery,
    /// Every representation the Accept header names is a conversion Skiff does not serve
    /// (`as=<something else>`): 406, as kube-apiserver answers.
    NotAcceptable,
}

impl Format {
    /// Errors are JSON or YAML `Status` objects, never Tables.
    pub(crate) fn errors(self) -> Format {
        match self {
            Format::Yaml => Format::Yaml,
            _ => Format::Json,
        }
    }
}

/// The first representation the Accept header asks for that Skiff serves. A clause asking
/// for a conversion (`as=...`) that Skiff does not serve is skipped, as kube-apiserver does;
/// when every clause was such a conversion, the answer is [`Format::NotAcceptable`]. Other
/// media types (protobuf) get JSON.
pub(crate) fn negotiate(headers: &HeaderMap) -> Format {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut refused_conversion = false;
    for part in accept.split(',') {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        let media = params.first().copied().unwrap_or("");
        let has = |p: &str| params.iter().any(|x| x.replace(' ', "") == p);
        if media == "application/json" || media == "*/*" || media.is_empty() {
            let conversion = params
                .iter()
                .find_map(|x| x.replace(' ', "").strip_prefix("as=").map(str::to_string));
            let meta_v1 = has("g=meta.k8s.io") && has("v=v1");
            let meta_v1beta1 = has("g=meta.k8s.io") && has("v=v1beta1");
            match conversion.as_deref() {
                None => return Format::Json,
                Some("Table") if meta_v1 || meta_v1beta1 => return Format::Table,
                Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                    if meta_v1 || meta_v1beta1 =>
                {
                    return Format::Metadata {
                        list: conversion.as_deref() == Some("PartialObjectMetadataList"),
                        v1beta1: meta_v1beta1,
                    };
                }
                Some("APIGroupDiscoveryList") if has("g=apidiscovery.k8s.io") && has("v=v2") => {
                    return Format::AggregatedDiscovery;
                }
                Some(_) => refused_conversion = true,
            }
            continue;
        }
        if media == "application/yaml" {
            return Format::Yaml;
        }
    }
    if refused_conversion {
        Format::NotAcceptable
    } else {
        Format::Json
    }
}

/// A JSON answer.
pub(crate) fn respond_json(code: u16, body: &Value) -> Response {
    respond(code, body, Format::Json, &[])
}

/// A JSON (or YAML) answer.
pub(crate) fn respond(code: u16, body: &Value, format: Format, warnings: &[String]) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let (content_type, text) = match format {
        Format::Yaml => (
            "application/yaml",
            yaml_serde::to_string(body).unwrap_or_default().into_bytes(),
        ),
        _ => ("application/json", json_in_order(body)),
    };
    respond_text(status, content_type, text, warnings)
}

/// JSON that is already written (a stored custom object at its storage version).
pub(crate) fn respond_json_bytes(code: u16, body: Vec<u8>, warnings: &[String]) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    respond_text(status, "application/json", body, warnings)
}

fn respond_text(
    status: StatusCode,
    content_type: &'static str,
    text: Vec<u8>,
    warnings: &[String],
) -> Response {
    let mut resp = (status, [(header::CONTENT_TYPE, content_type)], text).into_response();
    for w in bounded_warnings(warnings) {
        // RFC 7234 warning, as kube-apiserver sends them: 299 - "text".
        let value = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&value) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

/// Warnings within kube-apiserver's bounds (its warning recorder's): when together they
/// exceed 4,096 characters each is cut to 256, and what then still does not fit is dropped.
/// (Webhooks write warnings; a hostile one must not fill the answer's headers.)
fn bounded_warnings(warnings: &[String]) -> Vec<String> {
    const TOTAL: usize = 4 * 1024;
    const ITEM: usize = 256;
    let total: usize = warnings.iter().map(|w| w.chars().count()).sum();
    if total <= TOTAL {
        return warnings.to_vec();
    }
    let mut out = Vec::new();
    let mut used = 0;
    for w in warnings {
        let cut: String = w.chars().take(ITEM).collect();
        let n = cut.chars().count();
        if used + n > TOTAL {
            break;
        }
        used += n;
        out.push(cut);
    }
    out
}

/// JSON as kube-apiserver writes it: a built-in kind's fields (a `Status`'s, a list's, a
/// watch event's) in Kubernetes' order ([`skiff_api::k8s_wire::to_json_in_order`]), which
/// clients that print or compare the bytes see; anything else as it is (maps by key, as Go
/// writes a custom object's).
pub(crate) fn json_in_order(body: &Value) -> Vec<u8> {
    skiff_api::k8s_wire::to_json_in_order(body)
        // Not `to_string`: Display goes through the formatter, a third slower.
        .unwrap_or_else(|| serde_json::to_vec(body).unwrap_or_default())
}

/// A `Status` failure as the answer.
pub(crate) fn fail(err: &crate::ApiError, subject: &Subject<'_>, format: Format) -> Response {
    let (code, body) = failure(err, subject);
    respond(code, &body, format, &[])
}

pub(crate) fn plain_failure(code: u16, reason: &str, message: &str) -> Response {
    let (code, body) = plain(code, reason, message);
    respond(code, &body, Format::Json, &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FieldError;

    #[test]
    fn statuses_are_written_in_kubernetes_field_order() {
        let (_, body) = failure(
            &ApiError::NotFound {
                resource: "pods".into(),
                name: "web".into(),
            },
            &Subject {
                name: "web",
                group: "",
                resource: "pods",
            },
        );
        let text = String::from_utf8(json_in_order(&body)).expect("UTF-8");
        assert_eq!(
            text,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"web\" not found","reason":"NotFound","details":{"name":"web","kind":"pods"},"code":404}"#
        );
        let back: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(back, body);
    }

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

    #[test]
    fn warnings_are_bounded_as_kube_apiserver_bounds_them() {
        let few = vec!["a".repeat(300), "b".into()];
        assert_eq!(
            bounded_warnings(&few),
            few,
            "under 4,096 characters: as they are"
        );
        let many: Vec<String> = (0..40).map(|i| format!("{i}{}", "x".repeat(500))).collect();
        let kept = bounded_warnings(&many);
        assert_eq!(kept.len(), 16, "4,096 / 256");
        assert!(kept.iter().all(|w| w.chars().count() == 256));
        assert!(kept[0].starts_with('0') && kept[15].starts_with("15"));
    }
}
