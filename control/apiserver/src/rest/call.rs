//! One request on one kind ([`Call`]) and what every verb shares: decoding a body (JSON,
//! YAML, protobuf), encoding an answer in the negotiated representation (object, Table,
//! metadata only), dry runs and field validation.

use std::sync::Arc;

use axum::http::{HeaderMap, header};
use axum::response::Response;
use serde_json::{Value, json};
use skiff_api::{DynKind, Encoded, KindInfo};

use super::query::Query;
use super::{managed, table};
use crate::error::ApiError;
use crate::registry::{ResourceHandler, WriteOptions};
use crate::status::Subject;
use crate::status::{Format, fail, plain_failure, respond};

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
    pub user: Option<&'a crate::request::UserInfo>,
    pub authorizer: Option<&'a Arc<crate::auth::authz::Authorizer>>,
    /// The request's audit record (admission refusals are noted in it).
    pub audit: Option<crate::request::AuditSlot>,
    pub info: &'static KindInfo,
    /// The codec of the kind at the request's version.
    pub kind: std::sync::Arc<dyn DynKind>,
    /// The custom kind, when the request is for one.
    pub custom: Option<crate::custom::CustomKind>,
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
        let attrs = crate::request::Attributes::resource(
            verb,
            self.info.group(),
            self.info.plural,
            "",
            &self.namespace,
            &self.name,
        );
        crate::pipeline::authorize(
            self.authorizer.map(|a| a.as_ref()),
            self.user,
            self.audit.as_ref(),
            &attrs,
        )
        .map_err(|d| match d {
            // The front end has already refused a request without a user.
            crate::pipeline::Denied::Unauthenticated => ApiError::Forbidden("Unauthorized".into()),
            crate::pipeline::Denied::Forbidden(m) => ApiError::Forbidden(m),
        })
    }

    /// The kind's shape for field management: its custom schema at the request's version,
    /// else its typed message.
    pub fn shape(&self) -> managed::Shape<'_> {
        match &self.custom {
            Some(c) => managed::Shape::custom(c.schema()),
            None => managed::Shape::Message(self.info.kind),
        }
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
        let time = crate::strategy::now_rfc3339();
        managed::record_update(
            self.shape(),
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

    /// How objects are read and written at the request's version.
    pub fn codec(&self) -> Codec {
        Codec {
            kind: Arc::clone(&self.kind),
            webhook: self.custom.as_ref().and_then(|c| {
                c.webhook()
                    .map(|_| (c.clone(), Arc::clone(self.registry.converter())))
            }),
        }
    }

    /// The object as Kubernetes JSON.
    pub async fn to_json(&self, bytes: &[u8]) -> Result<Value, ApiError> {
        self.codec().to_json(bytes).await
    }

    /// Objects as Kubernetes JSON (one conversion call for all).
    pub async fn to_json_many(&self, items: &[Vec<u8>]) -> Result<Vec<Value>, ApiError> {
        self.codec().to_json_many(items).await
    }

    /// A custom kind's printer columns (`None` for typed kinds).
    pub fn printer_columns(&self) -> Option<&[crate::custom::Column]> {
        self.custom.as_ref().map(|c| c.columns())
    }

    /// `warnings` and those admission noted for the client.
    fn all_warnings(&self, warnings: &[String]) -> Vec<String> {
        let mut all = warnings.to_vec();
        all.extend(crate::request::noted_warnings(self.audit.as_ref()));
        all
    }

    /// An object answer: JSON, YAML, a one-row Table or the object's metadata.
    /// A handler's answer (a stored object) as this request's answer. A custom kind's
    /// object read at its storage version, without a webhook, is already the JSON
    /// [`Call::object`] would write: it is sent as it is rather than parsed and written again.
    pub async fn stored_object(
        &self,
        code: u16,
        stored: Vec<u8>,
        warnings: &[String],
    ) -> Result<Response, ApiError> {
        if self.format == Format::Json
            && self
                .custom
                .as_ref()
                .is_some_and(|c| c.is_storage() && c.webhook().is_none())
        {
            let warnings = &self.all_warnings(warnings)[..];
            return Ok(crate::status::respond_json_bytes(code, stored, warnings));
        }
        Ok(self.object(code, &self.to_json(&stored).await?, warnings))
    }

    pub fn object(&self, code: u16, obj: &Value, warnings: &[String]) -> Response {
        let warnings = &self.all_warnings(warnings)[..];
        match self.format {
            Format::Table => respond(
                code,
                &table::of(
                    self.info,
                    self.printer_columns(),
                    std::slice::from_ref(obj),
                    self.query,
                ),
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
        let warnings = &self.all_warnings(&[])[..];
        match self.format {
            Format::Table => {
                let mut t = table::of(self.info, self.printer_columns(), &items, self.query);
                t["metadata"] = meta;
                respond(200, &t, Format::Json, warnings)
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
                respond(200, &body, Format::Json, warnings)
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
                respond(200, &body, f.errors(), warnings)
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

    /// `value` as the registry takes it, with unknown fields handled per `fieldValidation`.
    pub async fn encode(&self, value: Value) -> Result<(Encoded, Vec<String>), ApiError> {
        let mode = FieldValidation::parse(self.query)?;
        self.codec().encode(value, mode).await
    }
}

/// How objects of one kind are read and written at one version: the version's codec, and
/// for a custom kind whose versions a webhook converts, the conversion
/// ([`crate::conversion`]). Cheap to clone (a watch keeps one).
#[derive(Clone)]
pub(crate) struct Codec {
    kind: Arc<dyn DynKind>,
    webhook: Option<(crate::custom::CustomKind, Arc<crate::conversion::Converter>)>,
}

impl Codec {
    /// A stored object as Kubernetes JSON at this version.
    pub async fn to_json(&self, bytes: &[u8]) -> Result<Value, ApiError> {
        let mut all = self.to_json_many(std::slice::from_ref(&bytes)).await?;
        all.pop()
            .ok_or_else(|| ApiError::Internal("conversion returned nothing".into()))
    }

    /// Stored objects as Kubernetes JSON at this version, converted in one call.
    pub async fn to_json_many<B: AsRef<[u8]>>(&self, items: &[B]) -> Result<Vec<Value>, ApiError> {
        let info = self.kind.info();
        let values = items
            .iter()
            .map(|b| {
                self.kind
                    .proto_to_json(b.as_ref())
                    .map_err(|e| ApiError::Internal(format!("encoding a {}: {e}", info.kind)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let Some((view, converter)) = &self.webhook else {
            return Ok(values);
        };
        let Some(hook) = view.webhook() else {
            return Ok(values);
        };
        let mut out = converter.convert(hook, values, info.api_version).await?;
        for v in &mut out {
            view.prune(v);
        }
        Ok(out)
    }

    /// A written object (at this version) as the stored bytes, with unknown fields handled
    /// per `mode`; a webhook converts it to the storage version, and what the storage
    /// version does not specify is dropped.
    pub async fn encode(
        &self,
        value: Value,
        mode: FieldValidation,
    ) -> Result<(Encoded, Vec<String>), ApiError> {
        let (encoded, warnings) = encode_with(self.kind.as_ref(), value, mode)?;
        let Some((view, converter)) = &self.webhook else {
            return Ok((encoded, warnings));
        };
        if view.is_storage() {
            return Ok((encoded, warnings));
        }
        let Some(hook) = view.webhook() else {
            return Ok((encoded, warnings));
        };
        let value: Value = match encoded {
            Encoded::Json(v) => v,
            Encoded::Bytes(b) => serde_json::from_slice(&b).map_err(|e| {
                ApiError::Internal(format!("re-reading a {}: {e}", view.info().kind))
            })?,
        };
        let storage = view.storage();
        let converted = converter
            .convert(hook, vec![value], storage.info().api_version)
            .await?
            .pop()
            .ok_or_else(|| ApiError::Internal("conversion returned nothing".into()))?;
        let (encoded, _) = encode_with(&storage, converted, FieldValidation::Ignore)?;
        Ok((encoded, warnings))
    }
}

/// The one kind with an `approval` subresource.
pub(crate) const CSRS: &str = "certificatesigningrequests";

pub(crate) fn meta_api_version(v1beta1: bool) -> &'static str {
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
pub(crate) fn go_type(info: &KindInfo, list: bool) -> String {
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
) -> Result<(Encoded, Vec<String>), ApiError> {
    let info = kind.info();
    let version = info
        .api_version
        .rsplit_once('/')
        .map_or(info.api_version, |(_, v)| v);
    // Every refusal is worded as kube-apiserver's decoder words it.
    let refuse = |detail: String| {
        ApiError::BadRequest(format!(
            "{} in version {version:?} cannot be handled as a {}: {detail}",
            info.kind, info.kind
        ))
    };
    let mut warnings = Vec::new();
    if kind.prunes_unknown() {
        // Every unknown field is known at once (and the value is not copied for a retry).
        let (encoded, unknown) = kind
            .json_to_stored_pruning(value)
            .map_err(|e| refuse(e.to_string()))?;
        return match mode {
            FieldValidation::Strict if !unknown.is_empty() => {
                let fields: Vec<String> = unknown
                    .iter()
                    .map(|f| format!("unknown field {f:?}"))
                    .collect();
                Err(refuse(format!(
                    "strict decoding error: {}",
                    fields.join(", ")
                )))
            }
            FieldValidation::Warn => {
                warnings.extend(unknown.iter().map(|f| format!("unknown field {f:?}")));
                Ok((encoded, warnings))
            }
            _ => Ok((encoded, warnings)),
        };
    }
    // Each round removes one unknown field; an object has far fewer than this many.
    for _ in 0..1000 {
        match kind.json_to_proto(value.clone()) {
            Ok(bytes) => return Ok((Encoded::Bytes(bytes), warnings)),
            Err(e) if e.message == "unknown field" && mode != FieldValidation::Strict => {
                if !remove_path(&mut value, &e.path) {
                    return Err(refuse(format!("unknown field {:?}", e.path)));
                }
                if mode == FieldValidation::Warn {
                    warnings.push(format!("unknown field {:?}", e.path));
                }
            }
            Err(e) if e.message == "unknown field" => {
                return Err(refuse(format!(
                    "strict decoding error: unknown field {:?}",
                    e.path
                )));
            }
            Err(e) => return Err(refuse(e.to_string())),
        }
    }
    Err(refuse("too many unknown fields".into()))
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

pub(crate) enum PathSegment {
    Field(String),
    Index(usize),
}
