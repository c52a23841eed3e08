//! ServiceAccount tokens over REST: the TokenRequest subresource (`POST
//! /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`, what `kubectl create token` sends)
//! and the issuer's OIDC discovery (`/.well-known/openid-configuration`,
//! `/openid/v1/jwks`), as kube-apiserver serves them.
//!
//! A token names the ServiceAccount's uid and, when bound (`boundObjectRef` of a Pod), the
//! pod's; the authenticator refuses it once either is gone or replaced.
//!
//! Tokens are ES256 JWTs signed with `<pki>/service-account.key` (`skiff_pki::sa_token`),
//! valid from 10 minutes to 48 hours (1 hour by default), for the audiences asked for.

use axum::http::{HeaderMap, Method};
use axum::response::Response;
use prost::Message;
use serde_json::{Value, json};
use skiff_api::api::{Pod, ServiceAccount};
use skiff_pki::sa_token::{Claims, ISSUER, KubernetesClaim, Ref};

use super::context::Rest;
use super::path::ResourcePath;
use crate::error::ApiError;
use crate::status::{Format, respond};

/// Default lifetime of a requested token (kube-apiserver: 1 hour).
const DEFAULT_EXPIRATION: i64 = 3600;
/// Shortest lifetime a client may ask for (kube-apiserver: 10 minutes).
const MIN_EXPIRATION: i64 = 600;
/// Longest (kube-apiserver caps at 2^32 s; Skiff at 48 h, kube-apiserver's cap when
/// extended tokens are off).
const MAX_EXPIRATION: i64 = 48 * 3600;

fn fail(e: &ApiError) -> Response {
    let (code, reason) = e.http();
    let (code, body) = crate::status::plain(code, reason, &e.to_string());
    respond(code, &body, Format::Json, &[])
}

fn invalid(name: &str, field: &str, value: &Value, detail: &str) -> ApiError {
    ApiError::Invalid {
        kind: "TokenRequest.authentication.k8s.io".into(),
        name: name.into(),
        errors: vec![crate::error::FieldError::invalid(field, value, detail)],
    }
}

/// Answers a TokenRequest for the ServiceAccount `p.name` in `p.namespace`.
pub(crate) async fn token_request(
    rest: &Rest,
    p: &ResourcePath,
    user: Option<&crate::request::UserInfo>,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    if *method != Method::POST {
        let (code, body) = crate::status::plain(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource (serviceaccounts/token)",
        );
        return respond(code, &body, Format::Json, &[]);
    }
    match issue(rest, p, user, headers, body).await {
        Ok(v) => respond(201, &v, Format::Json, &[]),
        Err(e) => fail(&e),
    }
}

async fn issue(
    rest: &Rest,
    p: &ResourcePath,
    user: Option<&crate::request::UserInfo>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ApiError> {
    let Some(key) = &rest.sa_key else {
        return Err(ApiError::UnknownResource("serviceaccounts/token".into()));
    };
    let ns = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let req = if body.is_empty() {
        json!({})
    } else {
        super::call::parse_body(headers, body)?
    };
    let spec = &req["spec"];
    let audiences: Vec<String> = match spec["audiences"].as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .filter_map(|x| x.as_str().map(String::from))
            .collect(),
        _ => vec![ISSUER.to_string()],
    };
    let expiration = match &spec["expirationSeconds"] {
        Value::Null => DEFAULT_EXPIRATION,
        v => v
            .as_i64()
            .ok_or_else(|| invalid(&name, "spec.expirationSeconds", v, "must be an integer"))?,
    };
    if expiration < MIN_EXPIRATION {
        return Err(invalid(
            &name,
            "spec.expirationSeconds",
            &json!(expiration),
            "may not specify a duration less than 10 minutes",
        ));
    }
    let expiration = expiration.min(MAX_EXPIRATION);
    let sa_bytes = rest
        .registry
        .handler("serviceaccounts")?
        .get(&ns, &name)
        .await?;
    let sa = ServiceAccount::decode(sa_bytes.as_slice())
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let sa_uid = sa.metadata.map(|m| m.uid).unwrap_or_default();
    let bound = &spec["boundObjectRef"];
    let pod = if bound.is_object() {
        let kind = bound["kind"].as_str().unwrap_or("");
        if kind != "Pod" {
            return Err(invalid(
                &name,
                "spec.boundObjectRef.kind",
                &json!(kind),
                "supported values: \"Pod\"",
            ));
        }
        let pod_name = bound["name"].as_str().unwrap_or("");
        let bytes = rest.registry.handler("pods")?.get(&ns, pod_name).await?;
        let pod = Pod::decode(bytes.as_slice()).map_err(|e| ApiError::Internal(e.to_string()))?;
        let uid = pod
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        if let Some(want) = bound["uid"].as_str().filter(|u| !u.is_empty())
            && want != uid
        {
            return Err(ApiError::Conflict(format!(
                "the UID in the bound object reference ({want}) does not match the UID in record. \
                 The object might have been deleted and then recreated"
            )));
        }
        Some(Ref {
            name: pod_name.to_string(),
            uid,
        })
    } else {
        None
    };
    // NodeRestriction: a node asks only for tokens bound to a pod bound to it that runs as
    // this ServiceAccount.
    if let Some(node) = user.and_then(crate::request::node_of) {
        let allowed = match &pod {
            Some(r) => {
                let bytes = rest.registry.handler("pods")?.get(&ns, &r.name).await?;
                let pod =
                    Pod::decode(bytes.as_slice()).map_err(|e| ApiError::Internal(e.to_string()))?;
                pod.spec.as_ref().is_some_and(|s| {
                    s.node_name == node && crate::auth::node::service_account_of(s) == name
                })
            }
            None => false,
        };
        if !allowed {
            return Err(ApiError::Forbidden(format!(
                "serviceaccounts \"{name}\" is forbidden: node requested token not bound to a \
                 pod scheduled on the same node and running as this service account"
            )));
        }
    }
    let now = chrono::Utc::now();
    let exp = now + chrono::Duration::seconds(expiration);
    let claims = Claims {
        aud: audiences.clone(),
        exp: exp.timestamp(),
        iat: now.timestamp(),
        nbf: now.timestamp(),
        iss: ISSUER.to_string(),
        sub: format!("system:serviceaccount:{ns}:{name}"),
        jti: uuid::Uuid::new_v4().to_string(),
        kubernetes: KubernetesClaim {
            namespace: ns.clone(),
            serviceaccount: Ref {
                name: name.clone(),
                uid: sa_uid,
            },
            pod: pod.clone(),
            node: None,
            warnafter: None,
        },
    };
    let token = key
        .sign(&claims)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let mut out_spec = json!({"audiences": audiences, "expirationSeconds": expiration});
    if let Some(p) = &pod {
        out_spec["boundObjectRef"] =
            json!({"kind": "Pod", "apiVersion": "v1", "name": p.name, "uid": p.uid});
    }
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": ns,
                     "creationTimestamp": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)},
        "spec": out_spec,
        "status": {"token": token,
                   "expirationTimestamp": exp.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)},
    }))
}

/// `/.well-known/openid-configuration`.
pub(crate) fn openid_configuration(rest: &Rest, host: &str) -> Response {
    if rest.sa_key.is_none() {
        let (code, body) = crate::status::plain(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        return respond(code, &body, Format::Json, &[]);
    }
    let body = json!({
        "issuer": ISSUER,
        "jwks_uri": format!("https://{host}/openid/v1/jwks"),
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["ES256"],
    });
    respond(200, &body, Format::Json, &[])
}

/// `/openid/v1/jwks`.
pub(crate) fn jwks(rest: &Rest) -> Response {
    match &rest.sa_key {
        Some(k) => respond(200, &k.jwks(), Format::Json, &[]),
        None => {
            let (code, body) = crate::status::plain(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
            respond(code, &body, Format::Json, &[])
        }
    }
}
