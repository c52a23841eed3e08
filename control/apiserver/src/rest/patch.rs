//! PATCH of objects and of their `status` and `scale` subresources: JSON patch (RFC 6902)
//! and JSON merge patch (RFC 7396) with the `json-patch` crate, strategic merge patch with
//! the kinds' patch strategies ([`skiff_api::strategic`]). The patched object is written as
//! an update of the version it was computed from; a conflict (someone else wrote in between)
//! recomputes the patch on the new version, as kube-apiserver does, unless the patch itself
//! names a resourceVersion.

use axum::http::{Method, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::call::{Call, parse_body};
use super::managed;
use crate::error::ApiError;
use crate::registry::WriteOptions;
use crate::status::respond;

/// How many times a patch is recomputed on a newer version after a conflict.
const RETRIES: usize = 5;

/// The patch formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    fn of(call: &Call<'_>) -> Result<PatchType, ApiError> {
        let ct = call
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        match ct.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchType::Apply),
            other => Err(ApiError::UnsupportedMediaType(other.to_string())),
        }
    }
}

/// Applies `patch` of `kind` to `original` (a JSON view of what is patched).
pub(crate) fn apply(
    kind_message: &str,
    original: &Value,
    patch: &Value,
    ty: PatchType,
) -> Result<Value, ApiError> {
    let mut doc = original.clone();
    match ty {
        PatchType::Json => {
            let p: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::BadRequest(format!("the JSON patch is invalid: {e}")))?;
            apply_json_patch(&mut doc, p)?;
        }
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(ApiError::BadRequest(
                    "a merge patch must be a JSON object".into(),
                ));
            }
            json_patch::merge(&mut doc, patch);
        }
        PatchType::Strategic => {
            doc = skiff_api::strategic::merge(kind_message, original, patch).map_err(|e| {
                ApiError::BadRequest(format!("the strategic merge patch is invalid: {e}"))
            })?;
        }
        PatchType::Apply => {
            return Err(ApiError::UnsupportedMediaType(
                "application/apply-patch+yaml".into(),
            ));
        }
    }
    Ok(doc)
}

/// Most operations one JSON patch may have (kube-apiserver's limit).
const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;
/// Most bytes a JSON patch's `copy` operations may copy in all: without a bound, a few
/// dozen copies of a path into itself double the object each time (CVE-2019-1002100).
const MAX_COPIED_BYTES: usize = crate::limits::MAX_REQUEST_BYTES;

/// Applies a JSON patch operation by operation, refusing one with too many operations or
/// whose copies add up to more than [`MAX_COPIED_BYTES`].
fn apply_json_patch(doc: &mut Value, p: json_patch::Patch) -> Result<(), ApiError> {
    if p.0.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(ApiError::BadRequest(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, \
             got {}",
            p.0.len()
        )));
    }
    let cannot =
        |e: String| ApiError::UnprocessablePatch(format!("the JSON patch cannot be applied: {e}"));
    let mut copied = 0usize;
    for op in p.0 {
        if let json_patch::PatchOperation::Copy(c) = &op {
            let size = doc
                .pointer(&c.from.to_string())
                .map(|v| serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX))
                .unwrap_or(0);
            copied = copied.saturating_add(size);
            if copied > MAX_COPIED_BYTES {
                return Err(cannot(format!(
                    "its copy operations would copy more than {MAX_COPIED_BYTES} bytes"
                )));
            }
        }
        json_patch::patch(doc, &json_patch::Patch(vec![op])).map_err(|e| cannot(e.to_string()))?;
    }
    Ok(())
}

fn rv_of(v: &Value) -> Option<String> {
    v.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(String::from)
}

/// PATCH of an object (`sub` "") or of its status.
pub(crate) async fn serve(call: &Call<'_>, body: &[u8], sub: &str) -> Result<Response, ApiError> {
    let ty = PatchType::of(call)?;
    let opts = call.write_options()?;
    let patch: Value = serde_json::from_slice(body)
        .or_else(|_| yaml_serde::from_slice(body))
        .map_err(|e| ApiError::BadRequest(format!("the patch is not valid JSON: {e}")))?;
    if call.query.get("force").is_some() && ty != PatchType::Apply {
        return Err(ApiError::Invalid {
            kind: "PatchOptions.meta.k8s.io".into(),
            name: String::new(),
            errors: vec![crate::error::FieldError::forbidden(
                "force",
                "may not be specified for non-apply patch",
            )],
        });
    }
    if ty == PatchType::Apply {
        return server_side_apply(call, patch, sub, opts).await;
    }
    let pinned = rv_of(&patch);
    for _ in 0..RETRIES {
        let current = call
            .to_json(&call.handler.get(&call.namespace, &call.name).await?)
            .await?;
        let mut patched = apply(call.info.kind, &current, &patch, ty)?;
        // The patch may not move the object elsewhere.
        for (k, want) in [
            ("name", call.name.as_str()),
            ("namespace", call.namespace.as_str()),
        ] {
            let got = patched
                .pointer(&format!("/metadata/{k}"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if !want.is_empty() && got != want {
                return Err(ApiError::BadRequest(format!(
                    "metadata.{k}: the {k} of the patched object ({got:?}) does not match the \
                     {k} on the URL ({want:?})"
                )));
            }
        }
        if sub.is_empty() {
            call.record_write(Some(&current), &mut patched)?;
        }
        if pinned.is_none() {
            patched["metadata"]["resourceVersion"] = current
                .pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(Value::Null);
        }
        let (bytes, warnings) = call.encode(patched).await?;
        match call
            .handler
            .update(&call.namespace, bytes, sub, opts.clone())
            .await
        {
            Ok(updated) => return call.stored_object(200, updated, &warnings).await,
            Err(ApiError::Conflict(_)) if pinned.is_none() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::modified(call.info, &call.name))
}

/// PATCH with `application/apply-patch+yaml`: server-side apply of the body, the manager's
/// whole intent for the object ([`managed::apply`]); creates the object when it does not
/// exist (201). Recomputed on a newer version after a write conflict, unless the body names a
/// resourceVersion.
async fn server_side_apply(
    call: &Call<'_>,
    applied: Value,
    sub: &str,
    opts: WriteOptions,
) -> Result<Response, ApiError> {
    if !sub.is_empty() {
        return Err(ApiError::BadRequest(format!(
            "server-side apply of the {sub} subresource is not supported; apply the object"
        )));
    }
    let Some(manager) = call.query.get("fieldManager") else {
        return Err(ApiError::BadRequest(
            "fieldManager is required for apply requests".into(),
        ));
    };
    let manager = managed::manager_of(Some(manager), "")?;
    let force = match call.query.get("force") {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "force: Invalid value: {other:?}: must be true or false"
            )));
        }
    };
    let mut applied = applied;
    let Some(body) = applied.as_object_mut() else {
        return Err(ApiError::BadRequest(
            "the applied configuration must be an object".into(),
        ));
    };
    for (field, want) in [
        ("apiVersion", call.info.api_version),
        ("kind", call.info.kind),
    ] {
        match body.get(field).and_then(Value::as_str) {
            Some(got) if got == want => {}
            Some(got) => {
                return Err(ApiError::BadRequest(format!(
                    "{field}: the applied configuration is a {got:?}, not a {want:?} (the \
                     resource on the URL)"
                )));
            }
            None => {
                return Err(ApiError::BadRequest(format!(
                    "{field} must be set in the applied configuration"
                )));
            }
        }
    }
    let meta = body.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        return Err(ApiError::BadRequest("metadata must be an object".into()));
    }
    for (k, want) in [
        ("name", call.name.as_str()),
        ("namespace", call.namespace.as_str()),
    ] {
        match meta.get(k).and_then(Value::as_str) {
            Some(got) if !got.is_empty() && got != want => {
                return Err(ApiError::BadRequest(format!(
                    "metadata.{k}: the {k} of the applied configuration ({got:?}) does not \
                     match the {k} on the URL ({want:?})"
                )));
            }
            _ if !want.is_empty() => meta[k] = want.into(),
            _ => {}
        }
    }
    let pinned = rv_of(&applied);
    for _ in 0..RETRIES {
        let time = crate::strategy::now_rfc3339();
        let writer = managed::Writer {
            manager: &manager,
            api_version: call.info.api_version,
            time: &time,
        };
        let current = match call.handler.get(&call.namespace, &call.name).await {
            Ok(bytes) => Some(call.to_json(&bytes).await?),
            Err(ApiError::NotFound { .. }) if pinned.is_none() => None,
            Err(e) => return Err(e),
        };
        let mut result = managed::apply(call.shape(), current.as_ref(), &applied, writer, force)?;
        let Some(current) = current else {
            // Applying a missing object creates it: that takes `create`, not only the
            // `patch` the request was authorized for (kube-apiserver's check).
            call.authorize_also("create")?;
            let (bytes, warnings) = call.encode(result).await?;
            match call
                .handler
                .create(&call.namespace, bytes, opts.clone())
                .await
            {
                Ok(created) => {
                    return call.stored_object(201, created, &warnings).await;
                }
                Err(ApiError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e),
            }
        };
        result["metadata"]["resourceVersion"] = match &pinned {
            Some(rv) => rv.clone().into(),
            None => current
                .pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(Value::Null),
        };
        let (bytes, warnings) = call.encode(result).await?;
        match call
            .handler
            .update(&call.namespace, bytes, "", opts.clone())
            .await
        {
            Ok(updated) => return call.stored_object(200, updated, &warnings).await,
            Err(ApiError::Conflict(_)) if pinned.is_none() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::modified(call.info, &call.name))
}

/// The `autoscaling/v1` Scale view of a Deployment or ReplicaSet.
/// Where a kind keeps what its Scale shows: JSON pointers of the wanted and the current
/// replica count and of the selector (a typed kind's `matchLabels`, a custom kind's string).
struct ScalePaths {
    spec: String,
    status: String,
    selector: Option<String>,
    typed: bool,
}

impl ScalePaths {
    fn of(call: &Call<'_>) -> ScalePaths {
        let pointer = |p: &str| format!("/{}", p.replace('.', "/"));
        match call.custom.as_ref().and_then(|c| c.scale().cloned()) {
            Some((spec, status, selector)) => ScalePaths {
                spec: pointer(&spec),
                status: pointer(&status),
                selector: selector.as_deref().map(pointer),
                typed: false,
            },
            // A ReplicationController's selector is a plain map.
            None => ScalePaths {
                spec: "/spec/replicas".into(),
                status: "/status/replicas".into(),
                selector: Some(if call.info.plural == "replicationcontrollers" {
                    "/spec/selector".into()
                } else {
                    "/spec/selector/matchLabels".into()
                }),
                typed: true,
            },
        }
    }
}

/// Sets the value at a JSON pointer, making the objects on its way.
fn set_pointer(value: &mut Value, pointer: &str, v: Value) {
    let mut cur = value;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let Some(map) = cur.as_object_mut() else {
            return;
        };
        if i == parts.len() - 1 {
            map.insert((*part).to_string(), v);
            return;
        }
        cur = map.entry((*part).to_string()).or_insert_with(|| json!({}));
    }
}

fn scale_of(obj: &Value, paths: &ScalePaths) -> Value {
    let selector = match &paths.selector {
        Some(p) if paths.typed => obj
            .pointer(p)
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default(),
        Some(p) => obj
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        None => String::new(),
    };
    let meta = obj.get("metadata").cloned().unwrap_or(Value::Null);
    let pick = |k: &str| meta.get(k).cloned().unwrap_or(Value::Null);
    let unset = if paths.typed { json!(1) } else { json!(0) };
    let mut scale = json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": pick("name"),
            "namespace": pick("namespace"),
            "uid": pick("uid"),
            "resourceVersion": pick("resourceVersion"),
            "creationTimestamp": pick("creationTimestamp"),
        },
        "spec": {"replicas": obj.pointer(&paths.spec).cloned().unwrap_or(unset)},
        "status": {
            "replicas": obj.pointer(&paths.status).cloned().unwrap_or(json!(0)),
        },
    });
    if !selector.is_empty() {
        scale["status"]["selector"] = selector.into();
    }
    scale
}

/// GET, PUT and PATCH of `<deployments|replicasets|statefulsets>/<name>/scale`, and of a
/// custom kind's scale subresource (through its definition's paths).
pub(crate) async fn scale(
    call: &Call<'_>,
    method: &Method,
    body: &[u8],
) -> Result<Response, ApiError> {
    let paths = ScalePaths::of(call);
    if method == Method::GET {
        let obj = call
            .to_json(&call.handler.get(&call.namespace, &call.name).await?)
            .await?;
        return Ok(respond(200, &scale_of(&obj, &paths), call.format, &[]));
    }
    let opts = call.write_options()?;
    let (ty, input) = match *method {
        Method::PUT => (None, parse_body(call.headers, body)?),
        Method::PATCH => (
            Some(PatchType::of(call)?),
            serde_json::from_slice::<Value>(body)
                .map_err(|e| ApiError::BadRequest(format!("the patch is not valid JSON: {e}")))?,
        ),
        _ => {
            return Err(ApiError::BadRequest(format!(
                "scale does not support {method}"
            )));
        }
    };
    for _ in 0..RETRIES {
        let current = call
            .to_json(&call.handler.get(&call.namespace, &call.name).await?)
            .await?;
        let view = scale_of(&current, &paths);
        let wanted = match ty {
            None => input.clone(),
            Some(PatchType::Strategic) => apply("Scale", &view, &input, PatchType::Merge)?,
            Some(t) => apply("Scale", &view, &input, t)?,
        };
        let replicas = wanted
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .ok_or_else(|| ApiError::BadRequest("spec.replicas: a number is required".into()))?;
        let pinned = rv_of(&wanted).filter(|rv| Some(rv) != rv_of(&current).as_ref());
        if let Some(rv) = &pinned {
            return Err(ApiError::Conflict(format!(
                "Operation cannot be fulfilled on {} {:?}: the object has been modified \
                 (resourceVersion {rv} is not the current one); please apply your changes to the \
                 latest version and try again",
                call.info.qualified(),
                call.name
            )));
        }
        let mut updated = current.clone();
        set_pointer(&mut updated, &paths.spec, replicas.into());
        call.record_write(Some(&current), &mut updated)?;
        let (bytes, _) = call.encode(updated).await?;
        match call
            .handler
            .update(&call.namespace, bytes, "", opts.clone())
            .await
        {
            Ok(obj) => {
                return Ok(respond(
                    200,
                    &scale_of(&call.to_json(&obj).await?, &paths),
                    call.format,
                    &[],
                ));
            }
            Err(ApiError::Conflict(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::Conflict(format!(
        "Operation cannot be fulfilled on {} {:?}: the object has been modified",
        call.info.qualified(),
        call.name
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_merge_patches() {
        let orig =
            json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"replicas": 1}});
        let merged = apply(
            "Deployment",
            &orig,
            &json!({"metadata": {"labels": {"x": null, "y": "2"}}}),
            PatchType::Merge,
        )
        .unwrap();
        assert_eq!(merged["metadata"]["labels"], json!({"y": "2"}));
        let patched = apply(
            "Deployment",
            &orig,
            &json!([{"op": "replace", "path": "/spec/replicas", "value": 3}]),
            PatchType::Json,
        )
        .unwrap();
        assert_eq!(patched["spec"]["replicas"], 3);
        let failed = apply(
            "Deployment",
            &orig,
            &json!([{"op": "test", "path": "/spec/replicas", "value": 9}]),
            PatchType::Json,
        )
        .unwrap_err();
        assert_eq!(failed.http().0, 422);
        assert!(apply("Deployment", &orig, &json!({"op": 1}), PatchType::Json).is_err());
        // Copies of a path into itself double it each time: refused past the bound.
        let mut bomb =
            vec![json!({"op": "add", "path": "/data", "value": {"a": ["x".repeat(1000)]}})];
        for _ in 0..40 {
            bomb.push(json!({"op": "copy", "from": "/data/a", "path": "/data/a/-"}));
        }
        let e = apply("ConfigMap", &json!({}), &json!(bomb), PatchType::Json).unwrap_err();
        assert!(e.to_string().contains("would copy more than"), "{e}");
        let many: Vec<Value> = (0..10_001)
            .map(|_| json!({"op": "test", "path": "", "value": {}}))
            .collect();
        let e = apply("ConfigMap", &json!({}), &json!(many), PatchType::Json).unwrap_err();
        assert!(e.to_string().contains("maximum operations"), "{e}");
        assert!(apply("Deployment", &orig, &json!([1]), PatchType::Merge).is_err());
    }

    #[test]
    fn scale_view() {
        let d = json!({"metadata": {"name": "web", "namespace": "shop", "resourceVersion": "7"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"replicas": 2}});
        let typed = ScalePaths {
            spec: "/spec/replicas".into(),
            status: "/status/replicas".into(),
            selector: Some("/spec/selector/matchLabels".into()),
            typed: true,
        };
        let s = scale_of(&d, &typed);
        assert_eq!(s["kind"], "Scale");
        assert_eq!(s["spec"]["replicas"], 3);
        assert_eq!(s["status"]["replicas"], 2);
        assert_eq!(s["status"]["selector"], "app=web");
        assert_eq!(s["metadata"]["resourceVersion"], "7");
        // A custom kind's paths, its selector a string; unset replicas are 0.
        let custom = ScalePaths {
            spec: "/spec/size".into(),
            status: "/status/ready".into(),
            selector: Some("/status/selector".into()),
            typed: false,
        };
        let w = json!({"metadata": {"name": "w"}, "status": {"ready": 1, "selector": "app=w"}});
        let s = scale_of(&w, &custom);
        assert_eq!(s["spec"]["replicas"], 0);
        assert_eq!(s["status"]["replicas"], 1);
        assert_eq!(s["status"]["selector"], "app=w");
        let mut w = w;
        set_pointer(&mut w, "/spec/size", json!(4));
        assert_eq!(w["spec"]["size"], 4);
    }
}
