//! Every verb on every kind: get, list, watch, create, update, patch, delete,
//! deletecollection, and the `status`, `scale` and `binding` subresources, once for all kinds
//! through the registry's object-safe handler and the kind's `DynKind` codec.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, header};
use axum::response::Response;
use base64::Engine as _;
use serde_json::{Value, json};
use skiff_api::rpc::{DeleteRequest, ListRequest};
use skiff_api::{DynKind, KindInfo, kinds};

use super::path::ResourcePath;
use super::status::Subject;
use super::{Format, Query, Rest, fail, managed, patch, plain_failure, respond, table, watch};
use crate::error::{ApiError, FieldError};
use crate::registry::{ResourceHandler, WriteOptions};

/// How unknown fields of a written object are treated (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    Strict,
    Warn,
    Ignore,
}

impl FieldValidation {
    pub(crate) fn parse(q: &Query) -> Result<Self, ApiError> {
        match q.get("fieldValidation") {
            None | Some("" | "Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(ApiError::BadRequest(format!(
                "fieldValidation {other:?} is invalid: must be one of Ignore, Warn or Strict"
            ))),
        }
    }
}

/// One request on one kind.
pub(crate) struct Call<'a> {
    pub handler: &'a Arc<dyn ResourceHandler>,
    pub registry: &'a Arc<crate::registry::Registry>,
    /// Who asks, and the authorizer (RBAC escalation checks on RBAC writes); `None` on
    /// servers without authentication.
    pub user: Option<&'a crate::auth::UserInfo>,
    pub authorizer: Option<&'a Arc<crate::auth::authz::Authorizer>>,
    /// The request's audit record (admission refusals are noted in it).
    pub audit: Option<crate::audit::AuditSlot>,
    pub info: &'static KindInfo,
    pub kind: &'static dyn DynKind,
    /// The request's namespace ("" for cluster-scoped kinds and all-namespace lists).
    pub namespace: String,
    pub name: String,
    pub query: &'a Query,
    pub format: Format,
    pub headers: &'a HeaderMap,
}

impl std::fmt::Debug for Call<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("resource", &self.info.plural)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Call<'_> {
    pub fn subject(&self) -> Subject<'_> {
        Subject {
            name: &self.name,
            group: self.info.group(),
            resource: self.info.plural,
        }
    }

    pub fn fail(&self, err: &ApiError) -> Response {
        fail(err, &self.subject(), self.format.errors())
    }

    pub fn write_options(&self) -> Result<WriteOptions, ApiError> {
        Ok(WriteOptions {
            requester: self.user.cloned(),
            audit: self.audit.clone(),
            ..dry_run(self.query.get("dryRun"))?
        })
    }

    /// Authorizes `verb` on this request's object too (a server-side apply that creates);
    /// `Forbidden` with the authorizer's message otherwise, noted in the audit record.
    pub fn authorize_also(&self, verb: &str) -> Result<(), ApiError> {
        let (Some(authz), Some(user)) = (self.authorizer, self.user) else {
            return Ok(());
        };
        let attrs = crate::auth::authz::Attributes::resource(
            verb,
            self.info.group(),
            self.info.plural,
            "",
            &self.namespace,
            &self.name,
        );
        let result = authz.authorize(user, &attrs);
        if result.is_err() {
            crate::audit::note(self.audit.as_ref(), &attrs, &result);
        }
        result.map_err(ApiError::Forbidden)
    }

    /// This request's field manager (`fieldManager`, else the User-Agent's product).
    pub fn field_manager(&self) -> Result<String, ApiError> {
        let agent = self
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        managed::manager_of(self.query.get("fieldManager"), agent)
    }

    /// Records this request's write of `new` over `old` (`None`: a create) in
    /// `new.metadata.managedFields` ([`managed::record_update`]).
    pub fn record_write(&self, old: Option<&Value>, new: &mut Value) -> Result<(), ApiError> {
        let manager = self.field_manager()?;
        let time = crate::registry::now_rfc3339();
        managed::record_update(
            self.info.kind,
            old,
            new,
            managed::Writer {
                manager: &manager,
                api_version: self.info.api_version,
                time: &time,
            },
        );
        Ok(())
    }

    /// The object as Kubernetes JSON.
    pub fn to_json(&self, bytes: &[u8]) -> Result<Value, ApiError> {
        self.kind
            .proto_to_json(bytes)
            .map_err(|e| ApiError::Internal(format!("encoding a {}: {e}", self.info.kind)))
    }

    /// An object answer: JSON, YAML, a one-row Table or the object's metadata.
    pub fn object(&self, code: u16, obj: &Value, warnings: &[String]) -> Response {
        match self.format {
            Format::Table => respond(
                code,
                &table::of(self.info, std::slice::from_ref(obj), "", self.query),
                Format::Json,
                warnings,
            ),
            Format::Metadata {
                list: false,
                v1beta1,
            } => respond(
                code,
                &partial_metadata(obj, v1beta1),
                Format::Json,
                warnings,
            ),
            Format::Metadata { list: true, .. } => not_acceptable(&format!(
                "you requested PartialObjectMetadataList, but the requested object is not a \
                 list ({})",
                go_type(self.info, false)
            )),
            f => respond(code, obj, f, warnings),
        }
    }

    /// A collection answer (list, deletecollection): `<Kind>List`, a Table, or a
    /// `PartialObjectMetadataList`, with `meta` as the list metadata.
    pub fn collection(&self, items: Vec<Value>, meta: Value) -> Response {
        match self.format {
            Format::Table => {
                let mut t = table::of(self.info, &items, &self.namespace, self.query);
                t["metadata"] = meta;
                respond(200, &t, Format::Json, &[])
            }
            Format::Metadata {
                list: true,
                v1beta1,
            } => {
                let items: Vec<Value> =
                    items.iter().map(|o| partial_metadata(o, v1beta1)).collect();
                let body = json!({
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": meta_api_version(v1beta1),
                    "metadata": meta,
                    "items": items,
                });
                respond(200, &body, Format::Json, &[])
            }
            Format::Metadata { list: false, .. } => not_acceptable(&format!(
                "you requested PartialObjectMetadata, but the requested object is a list ({})",
                go_type(self.info, true)
            )),
            f => {
                let body = json!({
                    "kind": format!("{}List", self.info.kind),
                    "apiVersion": self.info.api_version,
                    "metadata": meta,
                    "items": items,
                });
                respond(200, &body, f.errors(), &[])
            }
        }
    }

    /// Reads a written object (JSON or YAML, by Content-Type) and checks its kind.
    pub fn decode(&self, body: &[u8]) -> Result<Value, ApiError> {
        let value = parse_body(self.headers, body)?;
        self.check_type(&value)?;
        Ok(value)
    }

    fn check_type(&self, value: &Value) -> Result<(), ApiError> {
        let Some(obj) = value.as_object() else {
            return Err(ApiError::BadRequest(
                "the body of the request must be a JSON object".into(),
            ));
        };
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if !kind.is_empty() && kind != self.info.kind {
            return Err(ApiError::BadRequest(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                self.info.kind
            )));
        }
        if !api_version.is_empty() && api_version != self.info.api_version {
            return Err(ApiError::BadRequest(format!(
                "the API version in the data ({api_version}) does not match the expected API \
                 version ({})",
                self.info.api_version
            )));
        }
        Ok(())
    }

    /// `value` as protobuf, with unknown fields handled per `fieldValidation`.
    pub fn encode(&self, value: Value) -> Result<(Vec<u8>, Vec<String>), ApiError> {
        let mode = FieldValidation::parse(self.query)?;
        encode_with(self.kind, value, mode)
    }
}

/// The one kind with an `approval` subresource.
const CSRS: &str = "certificatesigningrequests";

fn meta_api_version(v1beta1: bool) -> &'static str {
    if v1beta1 {
        "meta.k8s.io/v1beta1"
    } else {
        "meta.k8s.io/v1"
    }
}

/// An object as `meta.k8s.io` `PartialObjectMetadata`: its metadata only.
pub(crate) fn partial_metadata(obj: &Value, v1beta1: bool) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": meta_api_version(v1beta1),
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// The Go type kube-apiserver names in its NotAcceptable messages (`*apps.Deployment`,
/// `*core.PodList`): the internal package is the group's first label, `core` for "".
fn go_type(info: &KindInfo, list: bool) -> String {
    let package = match info.group() {
        "" => "core",
        g => g.split('.').next().unwrap_or(g),
    };
    format!("*{package}.{}{}", info.kind, if list { "List" } else { "" })
}

/// 406 NotAcceptable, as kube-apiserver's `errNotAcceptable`.
pub(crate) fn not_acceptable(message: &str) -> Response {
    plain_failure(406, "NotAcceptable", message)
}

impl Format {
    /// Errors are JSON or YAML `Status` objects, never Tables.
    fn errors(self) -> Format {
        match self {
            Format::Yaml => Format::Yaml,
            _ => Format::Json,
        }
    }
}

/// `dryRun=All` (the only value Kubernetes accepts besides none).
pub(crate) fn dry_run(v: Option<&str>) -> Result<WriteOptions, ApiError> {
    match v {
        None | Some("") => Ok(WriteOptions::default()),
        Some("All") => Ok(WriteOptions {
            dry_run: true,
            ..Default::default()
        }),
        Some(other) => Err(ApiError::BadRequest(format!(
            "Invalid dry run value: {other:?}: supported values: \"All\""
        ))),
    }
}

/// The request body as JSON, from JSON or YAML by Content-Type.
pub(crate) fn parse_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let media = content_type.split(';').next().unwrap_or("").trim();
    match media {
        "application/json" | "" => serde_json::from_slice(body).map_err(|e| {
            ApiError::BadRequest(format!("the body of the request is not valid JSON: {e}"))
        }),
        "application/yaml" | "application/x-yaml" | "text/yaml" => yaml_serde::from_slice(body)
            .map_err(|e| {
                ApiError::BadRequest(format!("the body of the request is not valid YAML: {e}"))
            }),
        skiff_api::k8s_wire::CONTENT_TYPE => skiff_api::k8s_wire::decode(body).map_err(|e| {
            ApiError::BadRequest(format!(
                "the protobuf body of the request cannot be read: {e}"
            ))
        }),
        other => Err(ApiError::UnsupportedMediaType(other.to_string())),
    }
}

/// Encodes `value` as `kind`: strict decoding, and for `Warn`/`Ignore` each unknown field is
/// dropped (and named in a warning for `Warn`) until the rest decodes.
pub(crate) fn encode_with(
    kind: &dyn DynKind,
    mut value: Value,
    mode: FieldValidation,
) -> Result<(Vec<u8>, Vec<String>), ApiError> {
    let info = kind.info();
    let version = info
        .api_version
        .rsplit_once('/')
        .map_or(info.api_version, |(_, v)| v);
    let mut warnings = Vec::new();
    // Each round removes one unknown field; an object has far fewer than this many.
    for _ in 0..1000 {
        match kind.json_to_proto(value.clone()) {
            Ok(bytes) => return Ok((bytes, warnings)),
            Err(e) if e.message == "unknown field" && mode != FieldValidation::Strict => {
                if !remove_path(&mut value, &e.path) {
                    return Err(ApiError::BadRequest(format!(
                        "{} in version {version:?} cannot be handled as a {}: unknown field {:?}",
                        info.kind, info.kind, e.path
                    )));
                }
                if mode == FieldValidation::Warn {
                    warnings.push(format!("unknown field {:?}", e.path));
                }
            }
            Err(e) if e.message == "unknown field" => {
                return Err(ApiError::BadRequest(format!(
                    "{} in version {version:?} cannot be handled as a {}: strict decoding \
                     error: unknown field {:?}",
                    info.kind, info.kind, e.path
                )));
            }
            Err(e) => {
                return Err(ApiError::BadRequest(format!(
                    "{} in version {version:?} cannot be handled as a {}: {e}",
                    info.kind, info.kind
                )));
            }
        }
    }
    Err(ApiError::BadRequest(format!(
        "{} in version {version:?} cannot be handled as a {}: too many unknown fields",
        info.kind, info.kind
    )))
}

/// Removes the field at `path` (`spec.template.spec.containers[0].imagee`); false if absent.
pub(crate) fn remove_path(value: &mut Value, path: &str) -> bool {
    let mut segments: Vec<PathSegment> = Vec::new();
    for part in path.split('.') {
        let (field, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !field.is_empty() {
            segments.push(PathSegment::Field(field.to_string()));
        }
        while let Some(stripped) = rest.strip_prefix('[') {
            let Some(end) = stripped.find(']') else {
                return false;
            };
            let Ok(i) = stripped[..end].parse::<usize>() else {
                return false;
            };
            segments.push(PathSegment::Index(i));
            rest = &stripped[end + 1..];
        }
    }
    let Some((last, parents)) = segments.split_last() else {
        return false;
    };
    let mut cur = value;
    for s in parents {
        let next = match s {
            PathSegment::Field(f) => cur.get_mut(f.as_str()),
            PathSegment::Index(i) => cur.get_mut(*i),
        };
        match next {
            Some(n) => cur = n,
            None => return false,
        }
    }
    match (last, cur) {
        (PathSegment::Field(f), Value::Object(m)) => m.remove(f).is_some(),
        _ => false,
    }
}

enum PathSegment {
    Field(String),
    Index(usize),
}

/// The kind a registry resource is served as.
fn dyn_kind(plural: &str) -> Option<&'static dyn DynKind> {
    kinds().iter().copied().find(|k| k.info().plural == plural)
}

/// Serves one resource request.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    rest: &Rest,
    user: Option<&crate::auth::UserInfo>,
    audit: Option<crate::audit::AuditSlot>,
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
    let Ok(handler) = rest.registry.handler(&p.resource) else {
        return not_found();
    };
    let info = handler.info();
    let gv = if p.group.is_empty() {
        p.version.clone()
    } else {
        format!("{}/{}", p.group, p.version)
    };
    let Some(kind) = dyn_kind(info.plural).filter(|_| gv == info.api_version) else {
        return not_found();
    };
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
        (_, Some(_), Some("scale")) if super::discovery::scalable(info) => {
            patch::scale(&call, &method, &body).await
        }
        (&Method::POST, Some(_), Some("binding")) if info.plural == "pods" => {
            bind(&call, &body).await
        }
        (&Method::POST, Some(_), Some("eviction")) if info.plural == "pods" => {
            evict(&call, &body).await
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

async fn get(call: &Call<'_>) -> Result<Response, ApiError> {
    let bytes = call.handler.get(&call.namespace, &call.name).await?;
    Ok(call.object(200, &call.to_json(&bytes)?, &[]))
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
    let mut items = Vec::with_capacity(listing.items.len());
    for bytes in &listing.items {
        items.push(call.to_json(bytes)?);
    }
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
    let (bytes, mut warnings) = call.encode(value)?;
    warnings.extend(pod_security_warning(call, &bytes).await);
    let created = call.handler.create(&call.namespace, &bytes, opts).await?;
    Ok(call.object(201, &call.to_json(&created)?, &warnings))
}

/// Pod Security's warning for a new pod, or a Deployment's or ReplicaSet's pod template, in
/// a namespace whose `pod-security.kubernetes.io/warn` level it violates.
async fn pod_security_warning(call: &Call<'_>, bytes: &[u8]) -> Option<String> {
    use prost::Message as _;
    use skiff_api::api::{Deployment, Namespace, Pod, ReplicaSet};
    let spec = match call.info.plural {
        "pods" => Pod::decode(bytes).ok()?.spec?,
        "deployments" => Deployment::decode(bytes).ok()?.spec?.template?.spec?,
        "replicasets" => ReplicaSet::decode(bytes).ok()?.spec?.template?.spec?,
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
        let current = call.to_json(&current)?;
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
        let (bytes, warnings) = call.encode(value)?;
        match call
            .handler
            .update(&call.namespace, &bytes, sub, opts.clone())
            .await
        {
            Ok(updated) => return Ok(call.object(200, &call.to_json(&updated)?, &warnings)),
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
    let obj = call.to_json(&last)?;
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
    for bytes in &listing.items {
        let obj = call.to_json(bytes)?;
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
            Ok(last) => items.push(call.to_json(&last)?),
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
                &updated.encode_to_vec(),
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
        Some(k) => encode_with(k, value, FieldValidation::Strict)?.0,
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
        &super::status::success(json!({"name": call.name, "kind": "pods"})),
        Format::Json,
        &[],
    ))
}

#[cfg(test)]
mod tests {
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
        let kind = dyn_kind("deployments").expect("deployments");
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
