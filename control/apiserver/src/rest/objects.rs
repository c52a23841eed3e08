//! Every verb on every kind: get, list, watch, create, update, patch, delete,
//! deletecollection, and the `status`, `scale`, `binding` and pods' `ephemeralcontainers`
//! subresources, once for all kinds
//! through the registry's object-safe handler and the kind's `DynKind` codec.

use axum::body::Bytes;
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use base64::Engine as _;
use serde_json::{Value, json};
use std::sync::Arc;

use skiff_api::rpc::{DeleteRequest, ListRequest};
use skiff_api::{DynKind, KindInfo, kinds};

use super::call::{CSRS, Call, FieldValidation, dry_run, encode_with, not_acceptable, parse_body};
use super::context::Rest;
use super::path::ResourcePath;
use super::query::Query;
use super::{patch, watch};
use crate::error::{ApiError, FieldError};
use crate::registry::WriteOptions;
use crate::status::{Format, plain_failure, respond};

/// Serves one resource request.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    rest: &Rest,
    user: Option<&crate::request::UserInfo>,
    audit: Option<crate::request::AuditSlot>,
    method: Method,
    headers: &HeaderMap,
    p: ResourcePath,
    query: Query,
    format: Format,
    body: Bytes,
) -> Response {
    let not_found = || {
        plain_failure(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    let Some(handler) = rest.registry.resolve(&p.group, &p.resource) else {
        return not_found();
    };
    let handler = &handler;
    // A custom kind is served at each of its served versions (its codec converts); a typed
    // kind at its one version.
    let custom = match rest.registry.custom_kind(&p.group, &p.resource) {
        Some(k) => match k.at_version(&p.version) {
            Some(view) => Some(view),
            None => return not_found(),
        },
        None => None,
    };
    let (info, kind): (&'static KindInfo, Arc<dyn DynKind>) = match &custom {
        Some(view) => (view.info(), Arc::new(view.clone())),
        None => {
            let info = handler.info();
            let gv = if p.group.is_empty() {
                p.version.clone()
            } else {
                format!("{}/{}", p.group, p.version)
            };
            if gv != info.api_version {
                return not_found();
            }
            (info, handler.codec())
        }
    };
    let scalable = custom
        .as_ref()
        .map_or(super::discovery::scalable(info), |c| c.scale().is_some());
    if !info.namespaced && p.namespace.is_some() {
        return not_found();
    }
    if format == Format::NotAcceptable {
        return not_acceptable(
            "only the following media types are accepted: application/json, application/yaml",
        );
    }
    let call = Call {
        handler,
        registry: &rest.registry,
        user,
        authorizer: rest.authorizer.as_ref(),
        audit,
        info,
        kind,
        custom,
        namespace: p.namespace.clone().unwrap_or_default(),
        name: p.name.clone().unwrap_or_default(),
        query: &query,
        format,
        headers,
    };
    let result = match (&method, p.name.as_deref(), p.subresource.as_deref()) {
        (&Method::GET, None, None) if query.flag("watch") => {
            return watch::serve(&call).await;
        }
        (&Method::GET, None, None) => list(&call).await,
        (&Method::POST, None, None) => create(&call, &body).await,
        (&Method::DELETE, None, None) => delete_collection(&call, &body).await,
        (&Method::GET, Some(_), None | Some("status")) => get(&call).await,
        (&Method::GET, Some(_), Some("approval")) if info.plural == CSRS => get(&call).await,
        (&Method::PUT, Some(_), Some("approval")) if info.plural == CSRS => {
            update(&call, &body, "approval").await
        }
        (&Method::PUT, Some(_), None) => update(&call, &body, "").await,
        (&Method::PUT, Some(_), Some("status")) if info.has_status => {
            update(&call, &body, "status").await
        }
        (&Method::PATCH, Some(_), None) => patch::serve(&call, &body, "").await,
        (&Method::PATCH, Some(_), Some("status")) if info.has_status => {
            patch::serve(&call, &body, "status").await
        }
        (&Method::DELETE, Some(_), None) => delete(&call, &body).await,
        (_, Some(_), Some("scale")) if scalable => patch::scale(&call, &method, &body).await,
        (&Method::POST, Some(_), Some("binding")) if info.plural == "pods" => {
            bind(&call, &body).await
        }
        (&Method::POST, Some(_), Some("eviction")) if info.plural == "pods" => {
            evict(&call, &body).await
        }
        (&Method::GET, Some(_), Some(EPHEMERAL)) if info.plural == "pods" => get(&call).await,
        (&Method::PUT, Some(_), Some(EPHEMERAL)) if info.plural == "pods" => {
            update(&call, &body, EPHEMERAL).await
        }
        (&Method::PATCH, Some(_), Some(EPHEMERAL)) if info.plural == "pods" => {
            patch::serve(&call, &body, EPHEMERAL).await
        }
        (&Method::GET, Some(_), Some("log")) if info.plural == "pods" => {
            super::node_proxy::log(rest, &call).await
        }
        (_, Some(_), Some(_)) => return not_found(),
        _ => {
            return plain_failure(
                405,
                "MethodNotAllowed",
                &format!(
                    "the server does not allow this method on the requested resource ({method})"
                ),
            );
        }
    };
    match result {
        Ok(resp) => resp,
        Err(e) => call.fail(&e),
    }
}

/// `pods/<name>/ephemeralcontainers`: the pod, of which a write may only add ephemeral
/// containers (`crate::strategy::pod`).
const EPHEMERAL: &str = "ephemeralcontainers";

async fn get(call: &Call<'_>) -> Result<Response, ApiError> {
    let bytes = call.handler.get(&call.namespace, &call.name).await?;
    call.stored_object(200, bytes, &[]).await
}

/// A `continue` token: the list's revision and the last key returned.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub(crate) struct Continue {
    rv: i64,
    start: String,
}

fn encode_continue(c: &Continue) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(c).unwrap_or_default())
}

pub(crate) fn decode_continue(token: &str) -> Result<Continue, ApiError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| ApiError::BadRequest(format!("continue key is not valid: {token:?}")))
}

/// The store-order key of an object JSON (`namespace/name`).
fn sort_key(obj: &Value) -> String {
    format!(
        "{}/{}",
        obj.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or(""),
        obj.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
    )
}

/// A list's options, checked as kube-apiserver's `ValidateListOptions` (422 on
/// `ListOptions.meta.k8s.io`) and `ListReadConsistency` (400 for a resourceVersion beside a
/// continue token) check them.
pub(crate) fn validate_list_options(q: &Query) -> Result<(), ApiError> {
    let rv = q.get("resourceVersion").unwrap_or("");
    let cont = q.get("continue").unwrap_or("");
    let matching = q.get("resourceVersionMatch").unwrap_or("");
    let mut errors = Vec::new();
    if !matching.is_empty() {
        let forbidden = |detail: &str| FieldError::forbidden("resourceVersionMatch", detail);
        if rv.is_empty() {
            errors.push(forbidden(
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if !cont.is_empty() {
            errors.push(forbidden(
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if matching != "Exact" && matching != "NotOlderThan" {
            errors.push(FieldError::not_supported(
                "resourceVersionMatch",
                matching,
                &["Exact", "NotOlderThan", ""],
            ));
        }
        if matching == "Exact" && rv == "0" {
            errors.push(forbidden(
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if q.get("sendInitialEvents").is_some() {
        errors.push(FieldError::forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    if !errors.is_empty() {
        return Err(ApiError::Invalid {
            kind: "ListOptions.meta.k8s.io".into(),
            name: String::new(),
            errors,
        });
    }
    if !cont.is_empty() && !rv.is_empty() && rv != "0" {
        return Err(ApiError::BadRequest(
            "specifying resource version is not allowed when using continue".into(),
        ));
    }
    Ok(())
}

async fn list(call: &Call<'_>) -> Result<Response, ApiError> {
    let q = call.query;
    validate_list_options(q)?;
    let cont = q
        .get("continue")
        .filter(|c| !c.is_empty())
        .map(decode_continue)
        .transpose()?;
    let exact = match (q.get("resourceVersion"), q.get("resourceVersionMatch")) {
        (Some(rv), Some("Exact")) => Some(
            rv.parse::<i64>()
                .map_err(|_| ApiError::BadRequest(format!("invalid resourceVersion {rv:?}")))?,
        ),
        (_, Some("Exact" | "NotOlderThan") | None) => None,
        (_, Some(other)) => {
            return Err(ApiError::BadRequest(format!(
                "resourceVersionMatch {other:?} is invalid: must be Exact or NotOlderThan"
            )));
        }
    };
    let at = cont.as_ref().map(|c| c.rv).or(exact);
    let req = ListRequest {
        resource: call.info.plural.to_string(),
        namespace: call.namespace.clone(),
        label_selector: q.get("labelSelector").unwrap_or("").to_string(),
        field_selector: q.get("fieldSelector").unwrap_or("").to_string(),
    };
    let listing = match call.handler.list(&req, at).await {
        Err(ApiError::Expired(_)) if cont.is_some() => {
            return Err(ApiError::Expired(
                "The provided continue parameter is too old to display a consistent list \
                 result. You can start a new list without the continue parameter."
                    .into(),
            ));
        }
        other => other?,
    };
    let mut items = call.to_json_many(&listing.items).await?;
    if let Some(c) = &cont {
        items.retain(|o| sort_key(o) > c.start);
    }
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let mut meta = json!({"resourceVersion": listing.resource_version});
    if let Some(limit) = limit
        && items.len() > limit
    {
        let remaining = items.len() - limit;
        items.truncate(limit);
        let rv = listing.resource_version.parse().unwrap_or(0);
        let start = items.last().map(sort_key).unwrap_or_default();
        meta["continue"] = encode_continue(&Continue { rv, start }).into();
        meta["remainingItemCount"] = remaining.into();
    }
    Ok(call.collection(items, meta))
}

async fn create(call: &Call<'_>, body: &[u8]) -> Result<Response, ApiError> {
    let opts = call.write_options()?;
    let mut value = call.decode(body)?;
    call.record_write(None, &mut value)?;
    let (bytes, mut warnings) = call.encode(value).await?;
    if let Some(typed) = bytes.as_bytes() {
        warnings.extend(pod_security_warning(call, typed).await);
    }
    let created = call.handler.create(&call.namespace, bytes, opts).await?;
    call.stored_object(201, created, &warnings).await
}

/// Pod Security's warning for a new pod, or a Deployment's or ReplicaSet's pod template, in
/// a namespace whose `pod-security.kubernetes.io/warn` level it violates.
async fn pod_security_warning(call: &Call<'_>, bytes: &[u8]) -> Option<String> {
    use prost::Message as _;
    use skiff_api::api::{Deployment, Namespace, Pod, ReplicaSet, ReplicationController};
    let spec = match call.info.plural {
        "pods" => Pod::decode(bytes).ok()?.spec?,
        "deployments" => Deployment::decode(bytes).ok()?.spec?.template?.spec?,
        "replicasets" => ReplicaSet::decode(bytes).ok()?.spec?.template?.spec?,
        "replicationcontrollers" => {
            ReplicationController::decode(bytes)
                .ok()?
                .spec?
                .template?
                .spec?
        }
        _ => return None,
    };
    let ns = call
        .registry
        .handler("namespaces")
        .ok()?
        .get("", &call.namespace)
        .await
        .ok()?;
    let ns = Namespace::decode(ns.as_slice()).ok()?;
    crate::strategy::pod_security::warning(&ns.metadata?.labels, &spec)
}

/// PUT: a full replacement. Without `metadata.resourceVersion` it is unconditional (the
/// current version is used, retried on conflicts), as Kubernetes allows for its kinds.
async fn update(call: &Call<'_>, body: &[u8], sub: &str) -> Result<Response, ApiError> {
    let opts = call.write_options()?;
    let mut value = call.decode(body)?;
    let body_name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if body_name.is_empty() {
        value["metadata"]["name"] = call.name.clone().into();
    } else if body_name != call.name {
        return Err(ApiError::BadRequest(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({})",
            call.name
        )));
    }
    let unconditional = value
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    for _ in 0..5 {
        // The current object: the version an unconditional update replaces, and what the
        // field managers' changes are measured against (a stale one fails the CAS anyway).
        let current = call.handler.get(&call.namespace, &call.name).await?;
        let current = call.to_json(&current).await?;
        if unconditional {
            value["metadata"]["resourceVersion"] = current
                .pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(Value::Null);
        }
        let mut value = value.clone();
        if sub.is_empty() {
            call.record_write(Some(&current), &mut value)?;
        }
        let (bytes, warnings) = call.encode(value).await?;
        match call
            .handler
            .update(&call.namespace, bytes, sub, opts.clone())
            .await
        {
            Ok(updated) => return call.stored_object(200, updated, &warnings).await,
            Err(ApiError::Conflict(_)) if unconditional => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::modified(call.info, &call.name))
}

/// The DeleteOptions of the body (JSON, YAML or protobuf; `{}` when empty).
fn delete_body(call: &Call<'_>, body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        Ok(Value::Object(Default::default()))
    } else {
        parse_body(call.headers, body)
    }
}

/// DeleteOptions from the body (JSON or YAML) and the query.
fn delete_request(
    call: &Call<'_>,
    body: &[u8],
    name: &str,
) -> Result<(DeleteRequest, WriteOptions), ApiError> {
    delete_options(call, &delete_body(call, body)?, name)
}

/// A delete of `name` with the DeleteOptions `opts` (JSON), the query's options filling in.
fn delete_options(
    call: &Call<'_>,
    opts: &Value,
    name: &str,
) -> Result<(DeleteRequest, WriteOptions), ApiError> {
    let q = call.query;
    let grace = match opts.get("gracePeriodSeconds").and_then(Value::as_i64) {
        Some(g) => Some(g),
        None => q
            .get("gracePeriodSeconds")
            .map(|g| {
                g.parse::<i64>()
                    .map_err(|_| ApiError::BadRequest(format!("invalid gracePeriodSeconds {g:?}")))
            })
            .transpose()?,
    };
    let mut policy = opts
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or(q.get("propagationPolicy"))
        .unwrap_or("")
        .to_string();
    if policy.is_empty() && opts.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
        policy = "Orphan".into();
    }
    let dry = opts
        .get("dryRun")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .or(q.get("dryRun"));
    let pre = |k: &str| {
        opts.pointer(&format!("/preconditions/{k}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    Ok((
        DeleteRequest {
            resource: call.info.plural.to_string(),
            namespace: call.namespace.clone(),
            name: name.to_string(),
            grace_period_seconds: grace,
            propagation_policy: policy,
            precondition_uid: pre("uid"),
            precondition_resource_version: pre("resourceVersion"),
        },
        dry_run(dry)?,
    ))
}

async fn delete(call: &Call<'_>, body: &[u8]) -> Result<Response, ApiError> {
    let options = delete_body(call, body)?;
    let (req, opts) = delete_options(call, &options, &call.name)?;
    let last = call.handler.delete(&req, opts).await?;
    let obj = call.to_json(&last).await?;
    let pending = obj
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty());
    Ok(call.object(delete_code(pending, call, &options), &obj, &[]))
}

/// The status of a DELETE that succeeded: 200, also when the object is only marked for
/// deletion (finalizers, a graceful pod, a namespace), except that a marked object answers
/// 202 when the client set the deprecated `orphanDependents: false`, as kube-apiserver's
/// delete handler does ("We want to do this always if resource was not deleted immediately,
/// but that will break existing clients").
fn delete_code(pending: bool, call: &Call<'_>, options: &Value) -> u16 {
    let from_body = options.get("orphanDependents").and_then(Value::as_bool);
    let orphan = from_body.or_else(|| match call.query.get("orphanDependents") {
        Some("false") => Some(false),
        Some("true") => Some(true),
        _ => None,
    });
    if pending && orphan == Some(false) {
        202
    } else {
        200
    }
}

async fn delete_collection(call: &Call<'_>, body: &[u8]) -> Result<Response, ApiError> {
    let q = call.query;
    let req = ListRequest {
        resource: call.info.plural.to_string(),
        namespace: call.namespace.clone(),
        label_selector: q.get("labelSelector").unwrap_or("").to_string(),
        field_selector: q.get("fieldSelector").unwrap_or("").to_string(),
    };
    let listing = call.handler.list(&req, None).await?;
    let mut items = Vec::new();
    for obj in call.to_json_many(&listing.items).await? {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let (mut del, opts) = delete_request(call, body, &name)?;
        del.namespace = ns;
        match call.handler.delete(&del, opts).await {
            Ok(last) => items.push(call.to_json(&last).await?),
            Err(ApiError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(call.collection(items, json!({"resourceVersion": listing.resource_version})))
}

/// `pods/<name>/eviction`: a `policy/v1` Eviction deletes the pod with its DeleteOptions and
/// answers 201 with a success Status, as kube-apiserver does, unless the
/// PodDisruptionBudget that covers the pod allows no disruption now (429, which `kubectl
/// drain` retries): the budget's status is written first (one disruption fewer, the pod
/// recorded as disrupted, with the read resourceVersion as precondition, read again on a
/// conflict), then the pod is deleted.
async fn evict(call: &Call<'_>, body: &[u8]) -> Result<Response, ApiError> {
    let eviction = parse_body(call.headers, body)?;
    let kind = eviction.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "Eviction" {
        return Err(ApiError::BadRequest(format!(
            "the body of a pod eviction must be a policy/v1 Eviction, not {kind:?}"
        )));
    }
    let named = eviction
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !named.is_empty() && named != call.name {
        return Err(ApiError::BadRequest(
            "name in URL does not match name in Eviction object".into(),
        ));
    }
    let opts = eviction
        .get("deleteOptions")
        .filter(|o| o.is_object())
        .cloned()
        .unwrap_or_else(|| json!({}));
    let (req, write) = delete_options(call, &opts, &call.name)?;
    take_from_budget(call, write.dry_run).await?;
    call.handler.delete(&req, write).await?;
    Ok(respond(
        201,
        &json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }),
        call.format.errors(),
        &[],
    ))
}

/// The budget side of an eviction: refuses it, or writes the budget it takes from.
async fn take_from_budget(call: &Call<'_>, dry_run: bool) -> Result<(), ApiError> {
    use prost::Message as _;
    use skiff_api::Resource as _;
    use skiff_api::api::{Pod, PodDisruptionBudget};
    let pdbs = call.registry.handler(PodDisruptionBudget::INFO.plural)?;
    for _ in 0..5 {
        let pod = Pod::decode(
            call.handler
                .get(&call.namespace, &call.name)
                .await?
                .as_slice(),
        )
        .map_err(|e| ApiError::Internal(format!("decoding pod: {e}")))?;
        let listed = pdbs
            .list(
                &skiff_api::rpc::ListRequest {
                    resource: PodDisruptionBudget::INFO.plural.into(),
                    namespace: call.namespace.clone(),
                    ..Default::default()
                },
                None,
            )
            .await?;
        let budgets = listed
            .items
            .iter()
            .map(|b| PodDisruptionBudget::decode(b.as_slice()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ApiError::Internal(format!("decoding a PodDisruptionBudget: {e}")))?;
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let Some(updated) = crate::strategy::policy::eviction_decision(&pod, &budgets, &now)?
        else {
            return Ok(());
        };
        if dry_run {
            return Ok(());
        }
        match pdbs
            .update(
                &call.namespace,
                skiff_api::Encoded::proto(&updated),
                "status",
                WriteOptions::default(),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(ApiError::Conflict(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::TooManyRequests {
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        causes: vec![(
            "DisruptionBudget".into(),
            "The disruption budget changed while the eviction was decided; try again".into(),
        )],
    })
}

async fn bind(call: &Call<'_>, body: &[u8]) -> Result<Response, ApiError> {
    let mut value = parse_body(call.headers, body)?;
    // The name authorized is the URL's: a Binding naming another pod is refused
    // (kube-apiserver's BindingREST).
    match value.pointer("/metadata/name").and_then(Value::as_str) {
        None | Some("") => value["metadata"]["name"] = call.name.clone().into(),
        Some(n) if n != call.name => {
            return Err(ApiError::BadRequest(
                "name in URL does not match name in Binding object".into(),
            ));
        }
        Some(_) => {}
    }
    let binding_kind = kinds().iter().copied().find(|k| k.info().kind == "Binding");
    let bytes = match binding_kind {
        Some(k) => encode_with(k, value, FieldValidation::Strict)?
            .0
            .into_bytes(),
        None => {
            let b: skiff_api::api::Binding = skiff_api::manifest::decode(value)
                .map_err(|e| ApiError::BadRequest(format!("Binding: {e}")))?;
            prost::Message::encode_to_vec(&b)
        }
    };
    call.handler
        .bind(&call.namespace, &bytes, call.write_options()?)
        .await?;
    Ok(respond(
        201,
        &crate::status::success(json!({"name": call.name, "kind": "pods"})),
        Format::Json,
        &[],
    ))
}

#[cfg(test)]
mod tests {
    use super::super::call::remove_path;
    use super::*;

    #[test]
    fn unknown_fields_are_removed_by_path() {
        let mut v = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "imagee": "x"}, {"name": "b"}
        ]}}}, "extra": 1});
        assert!(remove_path(
            &mut v,
            "spec.template.spec.containers[0].imagee"
        ));
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0],
            json!({"name": "a"})
        );
        assert!(remove_path(&mut v, "extra"));
        assert!(!remove_path(&mut v, "extra"));
        assert!(!remove_path(&mut v, "spec.nope[3].x"));
    }

    #[test]
    fn field_validation_modes() {
        let kind = skiff_api::find_kind("deployments").expect("deployments");
        let body = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 1, "replicass": 2}});
        let err = encode_with(kind, body.clone(), FieldValidation::Strict).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding \
             error: unknown field \"spec.replicass\""
        );
        let (_, warnings) = encode_with(kind, body.clone(), FieldValidation::Warn).unwrap();
        assert_eq!(warnings, ["unknown field \"spec.replicass\""]);
        let (_, warnings) = encode_with(kind, body, FieldValidation::Ignore).unwrap();
        assert!(warnings.is_empty());
        let bad = json!({"spec": {"replicas": "three"}});
        let err = encode_with(kind, bad, FieldValidation::Ignore).unwrap_err();
        assert!(err.to_string().contains("spec.replicas"), "{err}");
    }

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let c = Continue {
            rv: 42,
            start: "shop/web-1".into(),
        };
        assert_eq!(decode_continue(&encode_continue(&c)).unwrap(), c);
        assert!(decode_continue("not base64!").is_err());
    }
}
