//! OpenAPI v3 documents, one per group-version, generated from the same type definitions
//! the API serves ([`skiff_api::schema`], itself generated from the `.proto` files) and the
//! registry's kinds: every path and verb with `x-kubernetes-group-version-kind` and
//! `x-kubernetes-action`, the `fieldValidation`, `dryRun` and `fieldManager` parameters on
//! writes (kubectl's default `--validate=strict` looks for `fieldValidation` on PATCH and
//! then trusts the server), and every message's schema with its patch strategy and merge
//! key, which `kubectl explain` reads.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};
use skiff_api::KindInfo;
use skiff_api::schema::{self, Field, PatchStrategy, Ty};

use super::discovery::{Served, groups, subresources};

/// The component name of a message.
fn component(message: &str) -> String {
    format!("skiff.api.{message}")
}

fn reference(message: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{}", component(message))})
}

/// The schema of one value of type `ty`.
fn value_schema(ty: Ty) -> Value {
    match ty {
        Ty::String => json!({"type": "string"}),
        Ty::Bool => json!({"type": "boolean"}),
        Ty::Int32 => json!({"type": "integer", "format": "int32"}),
        Ty::Int64 => json!({"type": "integer", "format": "int64"}),
        Ty::Double => json!({"type": "number", "format": "double"}),
        Ty::Bytes => json!({"type": "string", "format": "byte"}),
        Ty::IntOrString => json!({"x-kubernetes-int-or-string": true, "anyOf": [
            {"type": "integer"}, {"type": "string"}
        ]}),
        Ty::Quantity => json!({"x-kubernetes-int-or-string": true, "anyOf": [
            {"type": "integer"}, {"type": "string"}
        ]}),
        Ty::Json => json!({"type": "object"}),
        Ty::Message(m) => reference(m),
    }
}

fn field_schema(owner: &str, f: &Field) -> Value {
    let mut s = if f.list {
        json!({"type": "array", "items": value_schema(f.ty)})
    } else if f.map {
        json!({"type": "object", "additionalProperties": value_schema(f.ty)})
    } else if let Ty::Message(m) = f.ty {
        // Kubernetes wraps references in allOf so a field can carry its own description.
        json!({"allOf": [reference(m)]})
    } else {
        value_schema(f.ty)
    };
    if !f.doc.is_empty() {
        s["description"] = f.doc.into();
    }
    if f.list {
        match schema::patch_strategy(owner, f.json) {
            Some(PatchStrategy::MergeByKey(key)) => {
                s["x-kubernetes-patch-strategy"] = "merge".into();
                s["x-kubernetes-patch-merge-key"] = key.into();
                s["x-kubernetes-list-type"] = "map".into();
                s["x-kubernetes-list-map-keys"] = json!([key]);
            }
            Some(PatchStrategy::MergePrimitives) => {
                s["x-kubernetes-patch-strategy"] = "merge".into();
                s["x-kubernetes-list-type"] = "set".into();
            }
            None => s["x-kubernetes-list-type"] = "atomic".into(),
        }
    }
    s
}

/// Every message reachable from `roots`, by name.
fn reachable(roots: &[&str]) -> BTreeSet<&'static str> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&str> = roots.to_vec();
    while let Some(n) = todo.pop() {
        let Some(m) = schema::message(n) else {
            continue;
        };
        if !seen.insert(m.name) {
            continue;
        }
        for f in m.fields {
            if let Ty::Message(sub) = f.ty {
                todo.push(sub);
            }
        }
    }
    seen
}

fn gvk(info: &KindInfo) -> Value {
    let (group, version) = info
        .api_version
        .rsplit_once('/')
        .unwrap_or(("", info.api_version));
    json!({"group": group, "version": version, "kind": info.kind})
}

fn query_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description,
           "schema": {"type": "string", "uniqueItems": true}})
}

fn path_param(name: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}})
}

/// The parameters of a write.
fn write_params() -> Vec<Value> {
    vec![
        query_param(
            "dryRun",
            "When present, indicates that modifications should not be persisted. Valid values: All.",
        ),
        query_param(
            "fieldManager",
            "A name associated with the actor or entity that is making these changes.",
        ),
        query_param(
            "fieldValidation",
            "How the server treats unknown or duplicate fields of the object: Ignore, Warn or Strict.",
        ),
    ]
}

fn read_params(list: bool) -> Vec<Value> {
    let mut p = vec![query_param(
        "pretty",
        "If 'true', the output is pretty printed.",
    )];
    if list {
        for (n, d) in [
            (
                "labelSelector",
                "A selector to restrict the list of returned objects by their labels.",
            ),
            (
                "fieldSelector",
                "A selector to restrict the list of returned objects by their fields.",
            ),
            (
                "limit",
                "The maximum number of responses to return for a list call.",
            ),
            ("continue", "The continue token of the previous page."),
            (
                "resourceVersion",
                "The resourceVersion to list or watch from.",
            ),
            (
                "resourceVersionMatch",
                "How resourceVersion is applied to list calls: Exact or NotOlderThan.",
            ),
            (
                "watch",
                "Watch for changes and return them as a stream of events.",
            ),
            (
                "allowWatchBookmarks",
                "Request watch events with type BOOKMARK.",
            ),
            ("timeoutSeconds", "Timeout for the list/watch call."),
        ] {
            p.push(query_param(n, d));
        }
    }
    p
}

fn op(
    info: &KindInfo,
    action: &str,
    id: String,
    params: Vec<Value>,
    body: Option<&Value>,
    response: &Value,
    gvk_override: Option<Value>,
) -> Value {
    let mut o = json!({
        "operationId": id,
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {
            "application/json": {"schema": response},
            "application/yaml": {"schema": response},
        }}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk_override.unwrap_or_else(|| gvk(info)),
    });
    if let Some(b) = body {
        o["requestBody"] = json!({"content": {"*/*": {"schema": b}}, "required": true});
    }
    o
}

fn patch_body() -> Value {
    json!({"type": "object", "description": "A JSON patch, merge patch, strategic merge patch or apply configuration."})
}

/// The component name of a kind's schema: its message's for a typed kind, the reversed
/// group, version and kind for a custom one (`com.example.v1.Widget`, as kube-apiserver
/// names them).
fn kind_component(served: &Served) -> String {
    let info = served.info;
    if served.schema.is_none() {
        return component(info.kind);
    }
    let (group, version) = info
        .api_version
        .rsplit_once('/')
        .unwrap_or(("", info.api_version));
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{}", reversed.join("."), info.kind)
}

/// The paths of one kind.
fn kind_paths(served: &Served, paths: &mut Map<String, Value>) {
    let info = served.info;
    let (group, version) = info
        .api_version
        .rsplit_once('/')
        .unwrap_or(("", info.api_version));
    let base = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let scope = if info.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", info.plural)
    } else {
        format!("{base}/{}", info.plural)
    };
    let id = |verb: &str, suffix: &str| {
        let ns = if info.namespaced { "Namespaced" } else { "" };
        format!("{verb}{ns}{}{suffix}", info.kind)
    };
    let obj = json!({"$ref": format!("#/components/schemas/{}", kind_component(served))});
    let list_schema = json!({"type": "object", "properties": {
        "items": {"type": "array", "items": obj.clone()}
    }});
    let ns_param = |mut v: Vec<Value>| {
        if info.namespaced {
            v.insert(0, path_param("namespace"));
        }
        v
    };
    let mut collection = Map::new();
    collection.insert(
        "get".into(),
        op(
            info,
            "list",
            id("list", ""),
            ns_param(read_params(true)),
            None,
            &list_schema,
            None,
        ),
    );
    collection.insert(
        "post".into(),
        op(
            info,
            "post",
            id("create", ""),
            ns_param(write_params()),
            Some(&obj),
            &obj,
            None,
        ),
    );
    collection.insert(
        "delete".into(),
        op(
            info,
            "deletecollection",
            id("deleteCollection", ""),
            ns_param(read_params(true)),
            None,
            &json!({"type": "object"}),
            None,
        ),
    );
    paths.insert(scope.clone(), Value::Object(collection));

    let named = |mut v: Vec<Value>| {
        v.insert(0, path_param("name"));
        ns_param(v)
    };
    let mut item = Map::new();
    item.insert(
        "get".into(),
        op(
            info,
            "get",
            id("read", ""),
            named(read_params(false)),
            None,
            &obj,
            None,
        ),
    );
    item.insert(
        "put".into(),
        op(
            info,
            "put",
            id("replace", ""),
            named(write_params()),
            Some(&obj),
            &obj,
            None,
        ),
    );
    item.insert(
        "patch".into(),
        op(
            info,
            "patch",
            id("patch", ""),
            named(write_params()),
            Some(&patch_body()),
            &obj,
            None,
        ),
    );
    item.insert("delete".into(), op(info, "delete", id("delete", ""), named(vec![
        query_param("dryRun", "When present, indicates that modifications should not be persisted."),
        query_param("gracePeriodSeconds", "The duration in seconds before the object should be deleted."),
        query_param("propagationPolicy", "Whether and how garbage collection will be performed: Orphan, Background or Foreground."),
    ]), None, &obj, None));
    paths.insert(format!("{scope}/{{name}}"), Value::Object(item));

    for sub in subresources(served) {
        if sub.name == "binding" {
            continue;
        }
        let (schema_ref, sub_gvk) = match sub.response {
            Some((g, v, k)) => (
                json!({"type": "object"}),
                Some(json!({"group": g, "version": v, "kind": k})),
            ),
            None => (obj.clone(), None),
        };
        let title = |s: &str| {
            let mut c = s.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        };
        let suffix = title(sub.name);
        let mut m = Map::new();
        m.insert(
            "get".into(),
            op(
                info,
                "get",
                id("read", &suffix),
                named(read_params(false)),
                None,
                &schema_ref,
                sub_gvk.clone(),
            ),
        );
        m.insert(
            "put".into(),
            op(
                info,
                "put",
                id("replace", &suffix),
                named(write_params()),
                Some(&schema_ref),
                &schema_ref,
                sub_gvk.clone(),
            ),
        );
        m.insert(
            "patch".into(),
            op(
                info,
                "patch",
                id("patch", &suffix),
                named(write_params()),
                Some(&patch_body()),
                &schema_ref,
                sub_gvk,
            ),
        );
        paths.insert(format!("{scope}/{{name}}/{}", sub.name), Value::Object(m));
    }
    // The list over every namespace.
    if info.namespaced {
        let mut all = Map::new();
        all.insert(
            "get".into(),
            op(
                info,
                "list",
                format!("list{}ForAllNamespaces", info.kind),
                read_params(true),
                None,
                &list_schema,
                None,
            ),
        );
        paths.insert(format!("{base}/{}", info.plural), Value::Object(all));
    }
}

/// The document of one group-version, `None` if it is not served.
pub fn document(infos: &[Served], group: &str, version: &str) -> Option<Value> {
    let all = groups(infos);
    let kinds = all.get(group)?.get(version)?;
    let mut paths = Map::new();
    for served in kinds {
        kind_paths(served, &mut paths);
    }
    let mut roots: Vec<&str> = kinds
        .iter()
        .filter(|s| s.schema.is_none())
        .map(|s| s.info.kind)
        .collect();
    let mut schemas = Map::new();
    // A custom kind's schema as its definition gives it, with the type meta and the
    // metadata every object has.
    for served in kinds {
        let Some(schema) = &served.schema else {
            continue;
        };
        roots.push("ObjectMeta");
        let mut s = schema.clone();
        if let Some(props) = s
            .as_object_mut()
            .map(|o| o.entry("properties").or_insert_with(|| json!({})))
            .and_then(Value::as_object_mut)
        {
            props.insert("apiVersion".into(), json!({"type": "string"}));
            props.insert("kind".into(), json!({"type": "string"}));
            props.insert("metadata".into(), reference("ObjectMeta"));
        }
        s["x-kubernetes-group-version-kind"] = json!([gvk(served.info)]);
        schemas.insert(kind_component(served), s);
    }
    let by_kind: BTreeMap<&str, &KindInfo> = kinds
        .iter()
        .filter(|s| s.schema.is_none())
        .map(|s| (s.info.kind, s.info))
        .collect();
    for name in reachable(&roots) {
        let Some(m) = schema::message(name) else {
            continue;
        };
        let mut props = Map::new();
        for f in m.fields {
            props.insert(f.json.to_string(), field_schema(m.name, f));
        }
        let mut s = json!({"type": "object", "properties": props});
        if !m.doc.is_empty() {
            s["description"] = m.doc.into();
        }
        if let Some(info) = by_kind.get(name) {
            s["x-kubernetes-group-version-kind"] = json!([gvk(info)]);
            if s.get("description").is_none() {
                s["description"] =
                    format!("{} is a {} resource.", info.kind, info.api_version).into();
            }
        }
        schemas.insert(component(name), s);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", super::discovery::KUBERNETES_MAJOR, super::discovery::KUBERNETES_MINOR)},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// The content type kube-apiserver answers an OpenAPI v2 document in gnostic's protobuf form
/// with (clients ask for `…spec.v2@v1.0+protobuf`; `@` is not valid in a served media type).
pub const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// `GET /openapi/v2`: a document with no definitions, in protobuf (gnostic's
/// `openapi.v2.Document`: swagger = 1, info = 2 {title = 1, version = 2}, paths = 8,
/// definitions = 9) or JSON. kubectl reads schemas from v3 (which has every kind) and fetches
/// v2 only for what v3 does not describe, such as a `kind: List` manifest, whose items it then
/// validates each by itself; without a v2 document it refuses the whole file. An empty one
/// tells it there is no v2 schema to check against. No crate has gnostic's messages, and four
/// fields do not warrant one: they are written with prost's primitives.
pub fn v2_document(protobuf: bool) -> (Vec<u8>, &'static str) {
    use prost::encoding::{WireType, encode_key, encode_varint};
    let version = format!(
        "v{}.{}.0",
        crate::rest::discovery::KUBERNETES_MAJOR,
        crate::rest::discovery::KUBERNETES_MINOR
    );
    if !protobuf {
        let doc = json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": version},
            "paths": {},
            "definitions": {},
        });
        return (doc.to_string().into_bytes(), "application/json");
    }
    fn bytes_field(out: &mut Vec<u8>, tag: u32, value: &[u8]) {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(value.len() as u64, out);
        out.extend_from_slice(value);
    }
    let mut info = Vec::new();
    bytes_field(&mut info, 1, b"Kubernetes");
    bytes_field(&mut info, 2, version.as_bytes());
    let mut doc = Vec::new();
    bytes_field(&mut doc, 1, b"2.0");
    bytes_field(&mut doc, 2, &info);
    bytes_field(&mut doc, 8, &[]);
    bytes_field(&mut doc, 9, &[]);
    (doc, V2_PROTOBUF)
}

/// `GET /openapi/v3`: where each group-version's document is: the local ones, then
/// `remote`, the aggregated group-versions whose documents their servers answer (proxied).
/// A local document's URL carries a hash of its content, so clients that cache documents by
/// URL (kubectl) see a custom kind's new schema; a remote one's carries none (its server's
/// document is not known here), so it is read again each time.
pub fn index(infos: &[Served], remote: &[(String, String)]) -> Value {
    use sha2::Digest as _;
    let mut paths = Map::new();
    for (group, versions) in groups(infos) {
        for version in versions.keys() {
            let key = if group.is_empty() {
                format!("api/{version}")
            } else {
                format!("apis/{group}/{version}")
            };
            let doc = document(infos, group, version).unwrap_or_default();
            let digest = sha2::Sha256::digest(doc.to_string().as_bytes());
            let hash: String = digest[..16].iter().map(|b| format!("{b:02X}")).collect();
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
            );
        }
    }
    for (group, version) in remote {
        let key = format!("apis/{group}/{version}");
        let url = format!("/openapi/v3/{key}");
        paths
            .entry(key)
            .or_insert_with(|| json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infos() -> Vec<Served> {
        skiff_api::kinds()
            .iter()
            .map(|k| Served::typed(k.info()))
            .collect()
    }

    /// What kubectl's query-param verifier looks for: every PATCH of the GVK carries
    /// `fieldValidation`.
    #[test]
    fn every_patch_of_a_kind_offers_field_validation() {
        let doc = document(&infos(), "apps", "v1").expect("apps/v1");
        let mut found = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            if let Some(patch) = item.get("patch") {
                found += 1;
                let params = patch["parameters"].as_array().unwrap();
                assert!(
                    params.iter().any(|p| p["name"] == "fieldValidation"),
                    "{path}"
                );
                assert!(
                    patch["x-kubernetes-group-version-kind"].is_object(),
                    "{path}"
                );
            }
        }
        assert!(
            found >= 4,
            "deployments, replicasets, their status and scale"
        );
        let item =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(
            item["x-kubernetes-group-version-kind"]["kind"],
            "Deployment"
        );
    }

    #[test]
    fn schemas_carry_kinds_and_patch_strategies() {
        let doc = document(&infos(), "", "v1").expect("v1");
        let s = &doc["components"]["schemas"];
        assert_eq!(
            s["skiff.api.Pod"]["x-kubernetes-group-version-kind"][0]["kind"],
            "Pod"
        );
        let containers = &s["skiff.api.PodSpec"]["properties"]["containers"];
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(
            containers["items"]["$ref"],
            "#/components/schemas/skiff.api.Container"
        );
        assert_eq!(
            s["skiff.api.ServicePort"]["properties"]["targetPort"]["x-kubernetes-int-or-string"],
            true
        );
        // Every reference resolves.
        let text = doc.to_string();
        for r in text.split("#/components/schemas/").skip(1) {
            let name = r.split('"').next().unwrap();
            assert!(s.get(name).is_some(), "dangling reference {name}");
        }
        assert!(document(&infos(), "apps", "v9").is_none());
    }

    #[test]
    fn index_lists_every_group_version() {
        let i = index(
            &infos(),
            &[("wardle.example.com".into(), "v1alpha1".into())],
        );
        assert!(
            i["paths"]["api/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/api/v1")
        );
        assert!(i["paths"].get("apis/apps/v1").is_some());
        // An aggregated group-version's document is its server's, read through the proxy.
        assert_eq!(
            i["paths"]["apis/wardle.example.com/v1alpha1"]["serverRelativeURL"],
            "/openapi/v3/apis/wardle.example.com/v1alpha1"
        );
    }
}
