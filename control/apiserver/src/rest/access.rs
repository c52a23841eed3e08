//! Authorization of REST requests and the access reviews (`authorization.k8s.io/v1`
//! SelfSubjectAccessReview and SubjectAccessReview) that `kubectl auth can-i` sends.
//!
//! A request's [`Attributes`] are read as kube-apiserver's `RequestInfoFactory` reads them:
//! the verb from the method (GET on a name `get`, on a collection `list`, or `watch` with
//! `?watch=true`; POST `create`; PUT `update`; PATCH `patch`; DELETE `delete` or
//! `deletecollection`), a list whose field selector names one object carries that name,
//! and exec, attach and port-forward are `create` on their subresource (Kubernetes 1.35's
//! rule: the WebSocket GET is no longer enough).
//!
//! It also answers LocalSubjectAccessReview and SelfSubjectReview (`kubectl auth whoami`).
//! A refusal is a 403 `Status` with kube-apiserver's message.

use axum::http::{HeaderMap, Method};
use serde_json::{Value, json};

use super::context::Rest;
use super::path::{ResourcePath, Target};
use super::query::Query;
use crate::pipeline::{Denied, authorize};
use crate::request::{Attributes, Decision};
use crate::request::{AuditSlot, UserInfo};
use crate::status::{Format, respond};

/// The attributes of a REST request.
pub(crate) fn attributes(
    method: &Method,
    target: &Target,
    query: &Query,
    path: &str,
) -> Attributes {
    let Target::Resource(p) = target else {
        return Attributes::non_resource(&method.as_str().to_ascii_lowercase(), path);
    };
    resource_attributes(method, p, query)
}

fn resource_attributes(method: &Method, p: &ResourcePath, query: &Query) -> Attributes {
    let sub = p.subresource.as_deref().unwrap_or("");
    let verb = if matches!(sub, "exec" | "attach" | "portforward") {
        "create"
    } else {
        match *method {
            Method::GET | Method::HEAD => {
                if query.flag("watch") {
                    "watch"
                } else if p.name.is_some() {
                    "get"
                } else {
                    "list"
                }
            }
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if p.name.is_some() => "delete",
            Method::DELETE => "deletecollection",
            _ => "unknown",
        }
    };
    // A namespace's own requests are in that namespace (kube-apiserver's rule), so a
    // RoleBinding can let a user read the namespace it grants.
    let namespace = match (&p.namespace, p.resource.as_str(), &p.name) {
        (Some(ns), _, _) => ns.clone(),
        (None, "namespaces", Some(n)) => n.clone(),
        _ => String::new(),
    };
    let name = p.name.clone().unwrap_or_default();
    Attributes::resource(verb, &p.group, &p.resource, sub, &namespace, &name)
        .selecting(query.get("fieldSelector").unwrap_or(""))
}

/// Authorizes a request ([`crate::pipeline::authorize`]); `Err` is the 401 or 403 answer.
pub(crate) fn check(
    rest: &Rest,
    slot: Option<&AuditSlot>,
    user: Option<&UserInfo>,
    attrs: &mut Attributes,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), Box<axum::response::Response>> {
    if rest.authorizer.is_some()
        && attrs.verb == "create"
        && attrs.name.is_empty()
        && !body.is_empty()
    {
        attrs.object_name = body_name(headers, body);
    }
    let denied = match authorize(rest.authorizer.as_deref(), user, slot, attrs) {
        Ok(()) => return Ok(()),
        Err(d) => d,
    };
    let (code, mut body) = match denied {
        Denied::Unauthenticated => crate::status::plain(401, "Unauthorized", "Unauthorized"),
        Denied::Forbidden(message) => crate::status::plain(403, "Forbidden", &message),
    };
    if code == 403 && attrs.path.is_none() {
        body["details"] =
            json!({"name": attrs.name, "group": attrs.api_group, "kind": attrs.resource});
    }
    Err(Box::new(respond(code, &body, Format::Json, &[])))
}

/// `metadata.name` of a JSON, YAML or protobuf body ("" when it has none or does not
/// parse: the handler then refuses the body itself).
fn body_name(headers: &HeaderMap, body: &[u8]) -> String {
    super::call::parse_body(headers, body)
        .ok()
        .and_then(|v| v["metadata"]["name"].as_str().map(String::from))
        .unwrap_or_default()
}

/// Whether a path is a review this module answers (access reviews, and the
/// `authentication.k8s.io` SelfSubjectReview of `kubectl auth whoami`).
pub(crate) fn is_review(p: &ResourcePath) -> bool {
    p.name.is_none()
        && ((p.group == "authorization.k8s.io"
            && matches!(
                p.resource.as_str(),
                "selfsubjectaccessreviews" | "subjectaccessreviews" | "localsubjectaccessreviews"
            ))
            || (p.group == "authentication.k8s.io" && p.resource == "selfsubjectreviews"))
}

/// `kubectl auth whoami`: who the server thinks the requester is.
fn whoami(p: &ResourcePath, user: Option<&UserInfo>) -> axum::response::Response {
    let user = user.cloned().unwrap_or_default();
    let mut info = json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    let body = json!({
        "kind": "SelfSubjectReview",
        "apiVersion": format!("authentication.k8s.io/{}", p.version),
        "metadata": {"creationTimestamp": null},
        "status": {"userInfo": info},
    });
    respond(201, &body, Format::Json, &[])
}

fn bad_request(message: &str) -> axum::response::Response {
    let (code, body) = crate::status::plain(400, "BadRequest", message);
    respond(code, &body, Format::Json, &[])
}

/// Answers an access review: the chain's decision for the spec's attributes, for the
/// requester (SelfSubjectAccessReview) or for the user the spec names.
pub(crate) fn review(
    rest: &Rest,
    p: &ResourcePath,
    method: &Method,
    headers: &HeaderMap,
    user: Option<&UserInfo>,
    body: &[u8],
) -> axum::response::Response {
    if *method != Method::POST {
        let (code, body) = crate::status::plain(
            405,
            "MethodNotAllowed",
            &format!(
                "the server does not allow this method on the requested resource ({})",
                p.resource
            ),
        );
        return respond(code, &body, Format::Json, &[]);
    }
    if p.group == "authentication.k8s.io" {
        return whoami(p, user);
    }
    let mut review: Value = match super::call::parse_body(headers, body) {
        Ok(v) => v,
        Err(e) => return bad_request(&e.to_string()),
    };
    let spec = review["spec"].clone();
    let subject = match p.resource.as_str() {
        "selfsubjectaccessreviews" => match user {
            Some(u) => u.clone(),
            None => UserInfo {
                name: crate::request::ANONYMOUS_USER.into(),
                ..UserInfo::default()
            },
        },
        _ => {
            let name = spec["user"].as_str().unwrap_or("").to_string();
            let groups: Vec<String> = spec["groups"]
                .as_array()
                .map(|g| {
                    g.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            if name.is_empty() && groups.is_empty() {
                let (code, body) = crate::status::plain(
                    422,
                    "Invalid",
                    &format!(
                        "{}.authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified",
                        kind_of(&p.resource)
                    ),
                );
                return respond(code, &body, Format::Json, &[]);
            }
            UserInfo {
                name,
                uid: spec["uid"].as_str().unwrap_or("").to_string(),
                groups,
                ..UserInfo::default()
            }
        }
    };
    let attrs = if let Some(r) = spec.get("resourceAttributes").filter(|v| v.is_object()) {
        let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
        let namespace = if p.resource == "localsubjectaccessreviews" {
            p.namespace.clone().unwrap_or_default()
        } else {
            s("namespace")
        };
        let mut a = Attributes::resource(
            &s("verb"),
            &s("group"),
            &s("resource"),
            &s("subresource"),
            &namespace,
            &s("name"),
        );
        a.field_selector = r["fieldSelector"]["rawSelector"]
            .as_str()
            .unwrap_or("")
            .to_string();
        a
    } else if let Some(n) = spec.get("nonResourceAttributes").filter(|v| v.is_object()) {
        Attributes::non_resource(
            n["verb"].as_str().unwrap_or(""),
            n["path"].as_str().unwrap_or(""),
        )
    } else {
        return bad_request(
            "spec: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        );
    };
    let decision = match &rest.authorizer {
        Some(a) => a.decide(&subject, &attrs),
        None => Decision::Allow,
    };
    let (allowed, denied, reason) = match decision {
        Decision::Allow => (true, false, String::new()),
        Decision::Deny(r) => (false, !r.is_empty(), r),
        Decision::Refuse(m) => (false, true, m),
        Decision::NoOpinion => (false, false, String::new()),
    };
    let mut status = json!({"allowed": allowed});
    if denied {
        status["denied"] = json!(true);
    }
    if !reason.is_empty() {
        status["reason"] = json!(reason);
    } else if allowed {
        status["reason"] = json!("");
    }
    review["status"] = status;
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!(kind_of(&p.resource));
    if review["metadata"].is_null() {
        review["metadata"] = json!({});
    }
    respond(201, &review, Format::Json, &[])
}

fn kind_of(resource: &str) -> &'static str {
    match resource {
        "selfsubjectaccessreviews" => "SelfSubjectAccessReview",
        "localsubjectaccessreviews" => "LocalSubjectAccessReview",
        _ => "SubjectAccessReview",
    }
}
