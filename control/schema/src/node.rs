//! The parsed schema tree and the checks Kubernetes makes on a CRD's
//! `openAPIV3Schema` before accepting it.
//!
//! Three passes, as the API server makes them (messages cited per check):
//! 1. parsing: the JSONSchemaProps fields and their JSON types, patterns;
//! 2. `ValidateCustomResourceDefinitionOpenAPISchema` and
//!    `specStandardValidatorV3` of
//!    staging/src/k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation/validation.go;
//! 3. `ValidateStructural` of
//!    staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/validation.go
//!    (structural invariants and completeness), then defaults
//!    (pkg/apiserver/schema/defaulting/validation.go) and CEL rule compilation.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use crate::cel::RuleSpec;
use crate::error::{FPath, FieldError};
use crate::gofmt;

/// Schemas nested deeper than this are refused, so that no recursion over a
/// schema (or over an object along it) can exhaust the stack.
pub(crate) const MAX_SCHEMA_DEPTH: usize = 64;

/// `additionalProperties`: a boolean or a schema.
#[derive(Debug, Clone)]
pub(crate) enum AddProps {
    Bool(bool),
    Schema(Box<Node>),
}

/// One node of a JSONSchemaProps tree (structural spine or value validation).
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    pub ty: String,
    pub format: String,
    pub has_title: bool,
    pub has_description: bool,
    pub has_external_docs: bool,
    pub nullable: bool,
    pub default: Option<Value>,
    pub enum_: Option<Vec<Value>>,
    pub maximum: Option<f64>,
    pub exclusive_maximum: bool,
    pub minimum: Option<f64>,
    pub exclusive_minimum: bool,
    pub multiple_of: Option<f64>,
    pub max_length: Option<i64>,
    pub min_length: Option<i64>,
    pub pattern: Option<(String, Regex)>,
    pub max_items: Option<i64>,
    pub min_items: Option<i64>,
    pub unique_items: bool,
    pub max_properties: Option<i64>,
    pub min_properties: Option<i64>,
    pub required: Vec<String>,
    pub properties: BTreeMap<String, Node>,
    pub additional_properties: Option<AddProps>,
    pub items: Option<Box<Node>>,
    pub all_of: Vec<Node>,
    pub any_of: Vec<Node>,
    pub one_of: Vec<Node>,
    pub not: Option<Box<Node>>,
    pub preserve_unknown: bool,
    pub embedded: bool,
    pub int_or_string: bool,
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
    pub map_type: Option<String>,
    pub rule_specs: Vec<RuleSpec>,
    pub rules: Vec<crate::cel::Rule>,
}

impl Node {
    /// The schema of an additionalProperties value, if one is given.
    pub(crate) fn additional_schema(&self) -> Option<&Node> {
        match &self.additional_properties {
            Some(AddProps::Schema(s)) => Some(s),
            _ => None,
        }
    }

    /// The schema for the value of the field `k` of an object.
    pub(crate) fn field_schema(&self, k: &str) -> Option<&Node> {
        self.properties.get(k).or_else(|| self.additional_schema())
    }

    /// True if this node specifies nothing but value validations (no
    /// structure): used for the int-or-string `anyOf` pattern.
    fn is_bare_type(&self, ty: &str) -> bool {
        self.ty == ty
            && self.format.is_empty()
            && !self.has_title
            && !self.has_description
            && !self.nullable
            && self.default.is_none()
            && self.enum_.is_none()
            && self.maximum.is_none()
            && self.minimum.is_none()
            && self.multiple_of.is_none()
            && self.max_length.is_none()
            && self.min_length.is_none()
            && self.pattern.is_none()
            && self.max_items.is_none()
            && self.min_items.is_none()
            && self.max_properties.is_none()
            && self.min_properties.is_none()
            && self.required.is_empty()
            && self.properties.is_empty()
            && self.additional_properties.is_none()
            && self.items.is_none()
            && self.all_of.is_empty()
            && self.any_of.is_empty()
            && self.one_of.is_empty()
            && self.not.is_none()
            && !self.preserve_unknown
            && !self.embedded
            && !self.int_or_string
            && self.list_type.is_none()
            && self.map_type.is_none()
            && self.rule_specs.is_empty()
    }

    fn is_int_or_string_any_of(any_of: &[Node]) -> bool {
        any_of.len() == 2 && any_of[0].is_bare_type("integer") && any_of[1].is_bare_type("string")
    }
}

const KNOWN_FIELDS: &[&str] = &[
    "id",
    "$schema",
    "$ref",
    "description",
    "type",
    "format",
    "title",
    "default",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "multipleOf",
    "enum",
    "maxProperties",
    "minProperties",
    "required",
    "items",
    "allOf",
    "oneOf",
    "anyOf",
    "not",
    "properties",
    "additionalProperties",
    "patternProperties",
    "dependencies",
    "additionalItems",
    "definitions",
    "externalDocs",
    "example",
    "nullable",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
];

fn depth_error(path: &FPath) -> FieldError {
    FieldError::forbidden(
        path,
        format!("schema nesting exceeds the maximum depth of {MAX_SCHEMA_DEPTH}"),
    )
}

/// Parsing: builds the node tree; reports unknown fields and fields of the
/// wrong JSON type (Kubernetes reports those while decoding the CRD).
pub(crate) fn parse(v: &Value, path: &FPath, depth: usize, errs: &mut Vec<FieldError>) -> Node {
    let mut n = Node::default();
    if depth > MAX_SCHEMA_DEPTH {
        errs.push(depth_error(path));
        return n;
    }
    let Some(obj) = v.as_object() else {
        errs.push(FieldError::invalid(
            path,
            gofmt::bad_value(v),
            "must be an object",
        ));
        return n;
    };
    let mut keys: Vec<&String> = obj.keys().collect();
    keys.sort();
    for k in keys {
        if !KNOWN_FIELDS.contains(&k.as_str()) {
            errs.push(FieldError::forbidden(&path.child(k), "unknown field"));
        }
    }
    let mut p = Parser { obj, path, errs };
    n.ty = p.string("type").unwrap_or_default();
    n.format = p.string("format").unwrap_or_default();
    n.has_title = p.string("title").is_some_and(|s| !s.is_empty());
    n.has_description = p.string("description").is_some_and(|s| !s.is_empty());
    n.has_external_docs = obj.contains_key("externalDocs");
    n.nullable = p.boolean("nullable").unwrap_or(false);
    n.default = obj.get("default").cloned();
    if let Some(e) = obj.get("enum") {
        match e {
            Value::Array(a) => n.enum_ = Some(a.clone()),
            other => p.type_error("enum", other, "must be an array"),
        }
    }
    n.maximum = p.number("maximum");
    n.minimum = p.number("minimum");
    n.multiple_of = p.number("multipleOf");
    n.exclusive_maximum = p.boolean("exclusiveMaximum").unwrap_or(false);
    n.exclusive_minimum = p.boolean("exclusiveMinimum").unwrap_or(false);
    n.unique_items = p.boolean("uniqueItems").unwrap_or(false);
    n.max_length = p.count("maxLength");
    n.min_length = p.count("minLength");
    n.max_items = p.count("maxItems");
    n.min_items = p.count("minItems");
    n.max_properties = p.count("maxProperties");
    n.min_properties = p.count("minProperties");
    n.required = p.strings("required");
    n.list_map_keys = p.strings("x-kubernetes-list-map-keys");
    n.list_type = p.string("x-kubernetes-list-type");
    n.map_type = p.string("x-kubernetes-map-type");
    n.preserve_unknown = p
        .boolean("x-kubernetes-preserve-unknown-fields")
        .unwrap_or(false);
    n.embedded = p.boolean("x-kubernetes-embedded-resource").unwrap_or(false);
    n.int_or_string = p.boolean("x-kubernetes-int-or-string").unwrap_or(false);
    if let Some(pat) = p.string("pattern") {
        // validateValueValidation in pkg/apiserver/schema/validation.go.
        match regex::RegexBuilder::new(&pat).size_limit(1 << 22).build() {
            Ok(re) => n.pattern = Some((pat, re)),
            Err(e) => {
                let msg = match e {
                    regex::Error::Syntax(s) => s.lines().last().unwrap_or("").trim().to_string(),
                    other => other.to_string(),
                };
                errs.push(FieldError::invalid_str(
                    &path.child("pattern"),
                    &pat,
                    format!(
                        "must be a valid regular expression, but isn't: error parsing regexp: {msg}"
                    ),
                ));
            }
        }
    }
    if let Some(rv) = obj.get("x-kubernetes-validations") {
        n.rule_specs =
            crate::cel::parse_rule_specs(rv, &path.child("x-kubernetes-validations"), errs);
    }
    if let Some(props) = obj.get("properties") {
        match props {
            Value::Object(m) => {
                for (k, sub) in m {
                    let sp = path.child("properties").key(k);
                    n.properties
                        .insert(k.clone(), parse(sub, &sp, depth + 1, errs));
                }
            }
            other => errs.push(FieldError::invalid(
                &path.child("properties"),
                gofmt::bad_value(other),
                "must be an object",
            )),
        }
    }
    match obj.get("additionalProperties") {
        None => {}
        Some(Value::Bool(b)) => n.additional_properties = Some(AddProps::Bool(*b)),
        Some(sub) => {
            let sp = path.child("additionalProperties");
            n.additional_properties =
                Some(AddProps::Schema(Box::new(parse(sub, &sp, depth + 1, errs))));
        }
    }
    match obj.get("items") {
        None | Some(Value::Array(_)) => {}
        Some(sub) => n.items = Some(Box::new(parse(sub, &path.child("items"), depth + 1, errs))),
    }
    for (key, target) in [
        ("allOf", &mut n.all_of),
        ("anyOf", &mut n.any_of),
        ("oneOf", &mut n.one_of),
    ] {
        match obj.get(key) {
            None => {}
            Some(Value::Array(a)) => {
                for (i, sub) in a.iter().enumerate() {
                    target.push(parse(sub, &path.child(key).index(i), depth + 1, errs));
                }
            }
            Some(other) => errs.push(FieldError::invalid(
                &path.child(key),
                gofmt::bad_value(other),
                "must be an array",
            )),
        }
    }
    if let Some(sub) = obj.get("not") {
        n.not = Some(Box::new(parse(sub, &path.child("not"), depth + 1, errs)));
    }
    n
}

struct Parser<'a> {
    obj: &'a Map<String, Value>,
    path: &'a FPath,
    errs: &'a mut Vec<FieldError>,
}

impl Parser<'_> {
    fn type_error(&mut self, key: &str, v: &Value, detail: &str) {
        self.errs.push(FieldError::invalid(
            &self.path.child(key),
            gofmt::bad_value(v),
            detail,
        ));
    }
    fn string(&mut self, key: &str) -> Option<String> {
        match self.obj.get(key)? {
            Value::String(s) => Some(s.clone()),
            other => {
                self.type_error(key, other, "must be a string");
                None
            }
        }
    }
    fn boolean(&mut self, key: &str) -> Option<bool> {
        match self.obj.get(key)? {
            Value::Bool(b) => Some(*b),
            other => {
                self.type_error(key, other, "must be a boolean");
                None
            }
        }
    }
    fn number(&mut self, key: &str) -> Option<f64> {
        match self.obj.get(key)? {
            Value::Number(n) => n.as_f64(),
            other => {
                self.type_error(key, other, "must be a number");
                None
            }
        }
    }
    fn count(&mut self, key: &str) -> Option<i64> {
        let v = self.obj.get(key)?;
        match v.as_i64() {
            Some(i) => Some(i),
            None => {
                self.type_error(key, v, "must be an integer");
                None
            }
        }
    }
    fn strings(&mut self, key: &str) -> Vec<String> {
        match self.obj.get(key) {
            None => Vec::new(),
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
                .iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect(),
            Some(other) => {
                self.type_error(key, other, "must be an array of strings");
                Vec::new()
            }
        }
    }
}

// ---------------------------------------------------------------------------
// ValidateCustomResourceDefinitionOpenAPISchema (apis/apiextensions/validation/validation.go)
// ---------------------------------------------------------------------------

/// specStandardValidatorV3 state while descending.
#[derive(Clone, Default)]
struct Ssv {
    disallow_defaults: Option<String>,
    inside_resource_meta: bool,
}

const OPENAPI_V3_TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];
const META_FIELDS: &[&str] = &["metadata", "kind", "apiVersion"];

/// Checks of ValidateCustomResourceDefinitionOpenAPISchema on the raw JSON.
pub(crate) fn check_openapi(v: &Value, path: &FPath, is_root: bool, errs: &mut Vec<FieldError>) {
    if is_root && v.get("nullable") == Some(&Value::Bool(true)) {
        errs.push(FieldError::forbidden(
            &path.child("nullable"),
            "nullable cannot be true at the root",
        ));
    }
    check_openapi_node(v, path, &Ssv::default(), is_root, 0, errs);
}

fn check_openapi_node(
    v: &Value,
    path: &FPath,
    ssv: &Ssv,
    is_root: bool,
    depth: usize,
    errs: &mut Vec<FieldError>,
) {
    let Some(obj) = v.as_object() else { return };
    if depth > MAX_SCHEMA_DEPTH {
        return; // reported while parsing
    }
    let ty = obj.get("type").and_then(Value::as_str).unwrap_or("");
    // specStandardValidatorV3.validate
    if !ty.is_empty() && !OPENAPI_V3_TYPES.contains(&ty) {
        let supported: Vec<String> = OPENAPI_V3_TYPES.iter().map(|s| s.to_string()).collect();
        errs.push(FieldError::not_supported(
            &path.child("type"),
            gofmt::quote(ty),
            &supported,
        ));
    }
    if obj.contains_key("default")
        && let Some(reason) = &ssv.disallow_defaults
    {
        let mut detail = "must not be set".to_string();
        if !reason.is_empty() {
            detail.push(' ');
            detail.push_str(reason);
        }
        errs.push(FieldError::forbidden(&path.child("default"), detail));
    }
    if obj
        .get("id")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        errs.push(FieldError::forbidden(
            &path.child("id"),
            "id is not supported",
        ));
    }
    if obj.contains_key("additionalItems") {
        errs.push(FieldError::forbidden(
            &path.child("additionalItems"),
            "additionalItems is not supported",
        ));
    }
    if obj
        .get("patternProperties")
        .and_then(Value::as_object)
        .is_some_and(|m| !m.is_empty())
    {
        errs.push(FieldError::forbidden(
            &path.child("patternProperties"),
            "patternProperties is not supported",
        ));
    }
    if obj
        .get("definitions")
        .and_then(Value::as_object)
        .is_some_and(|m| !m.is_empty())
    {
        errs.push(FieldError::forbidden(
            &path.child("definitions"),
            "definitions is not supported",
        ));
    }
    if obj.contains_key("dependencies") {
        errs.push(FieldError::forbidden(
            &path.child("dependencies"),
            "dependencies is not supported",
        ));
    }
    if obj.contains_key("$ref") {
        errs.push(FieldError::forbidden(
            &path.child("$ref"),
            "$ref is not supported",
        ));
    }
    if ty == "null" {
        errs.push(FieldError::forbidden(
            &path.child("type"),
            "type cannot be set to null, use nullable as an alternative",
        ));
    }
    if obj.get("items").is_some_and(Value::is_array) {
        errs.push(FieldError::forbidden(
            &path.child("items"),
            "items must be a schema object and not an array",
        ));
    }
    let embedded = obj.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
    if ssv.inside_resource_meta && embedded {
        errs.push(FieldError::forbidden(
            &path.child("x-kubernetes-embedded-resource"),
            "must not be used inside of resource meta",
        ));
    }
    if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
        errs.push(FieldError::forbidden(
            &path.child("uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    let props = obj.get("properties").and_then(Value::as_object);
    let has_props = props.is_some_and(|m| !m.is_empty());
    if let Some(ap) = obj.get("additionalProperties") {
        if has_props && ap != &Value::Bool(true) {
            errs.push(FieldError::forbidden(
                &path.child("additionalProperties"),
                "additionalProperties and properties are mutual exclusive",
            ));
        }
        let mut sub = ssv.clone();
        if ssv.inside_resource_meta {
            sub.disallow_defaults =
                Some("inside additionalProperties applying to object metadata".into());
        }
        if ap.is_object() {
            check_openapi_node(
                ap,
                &path.child("additionalProperties"),
                &sub,
                false,
                depth + 1,
                errs,
            );
        }
    }
    if let Some(props) = props {
        let mut keys: Vec<&String> = props.keys().collect();
        keys.sort();
        for k in keys {
            let mut sub = ssv.clone();
            if (is_root || embedded) && META_FIELDS.contains(&k.as_str()) {
                sub.inside_resource_meta = true;
                if is_root {
                    sub.disallow_defaults = Some(format!("in top-level {k}"));
                }
            }
            if let Some(pv) = props.get(k) {
                check_openapi_node(
                    pv,
                    &path.child("properties").key(k),
                    &sub,
                    false,
                    depth + 1,
                    errs,
                );
            }
        }
    }
    if let Some(not) = obj.get("not") {
        check_openapi_node(not, &path.child("not"), ssv, false, depth + 1, errs);
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        if let Some(Value::Array(a)) = obj.get(key) {
            for (i, sub) in a.iter().enumerate() {
                check_openapi_node(sub, &path.child(key).index(i), ssv, false, depth + 1, errs);
            }
        }
    }
    let items = obj.get("items").filter(|i| i.is_object());
    if let Some(items) = items {
        check_openapi_node(items, &path.child("items"), ssv, false, depth + 1, errs);
    }
    if obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(false)) {
        errs.push(FieldError::invalid(
            &path.child("x-kubernetes-preserve-unknown-fields"),
            "false".into(),
            "must be true or undefined",
        ));
    }
    let map_type = obj.get("x-kubernetes-map-type").and_then(Value::as_str);
    if let Some(mt) = map_type {
        if ty != "object" {
            if ty.is_empty() {
                errs.push(FieldError::required(
                    &path.child("type"),
                    "must be object if x-kubernetes-map-type is specified",
                ));
            } else {
                errs.push(FieldError::invalid_str(
                    &path.child("type"),
                    ty,
                    "must be object if x-kubernetes-map-type is specified",
                ));
            }
        }
        if mt != "atomic" && mt != "granular" {
            errs.push(FieldError::not_supported(
                &path.child("x-kubernetes-map-type"),
                gofmt::quote(mt),
                &["atomic".into(), "granular".into()],
            ));
        }
    }
    let list_type = obj.get("x-kubernetes-list-type").and_then(Value::as_str);
    if let Some(lt) = list_type {
        if ty != "array" {
            if ty.is_empty() {
                errs.push(FieldError::required(
                    &path.child("type"),
                    "must be array if x-kubernetes-list-type is specified",
                ));
            } else {
                errs.push(FieldError::invalid_str(
                    &path.child("type"),
                    ty,
                    "must be array if x-kubernetes-list-type is specified",
                ));
            }
        } else if lt == "set"
            && let Some(is) = items
        {
            let ity = is.get("type").and_then(Value::as_str).unwrap_or("");
            let ilt = is.get("x-kubernetes-list-type").and_then(Value::as_str);
            let imt = is.get("x-kubernetes-map-type").and_then(Value::as_str);
            match ity {
                "array" if ilt.is_some_and(|l| l != "atomic") => errs.push(FieldError::invalid(
                    &path.child("items").child("x-kubernetes-list-type"),
                    ilt.map(gofmt::quote).unwrap_or_else(|| "null".into()),
                    "must be atomic as item of a list with x-kubernetes-list-type=set",
                )),
                "object" if imt != Some("atomic") => errs.push(FieldError::invalid(
                    &path.child("items").child("x-kubernetes-map-type"),
                    ilt.map(gofmt::quote).unwrap_or_else(|| "null".into()),
                    "must be atomic as item of a list with x-kubernetes-list-type=set",
                )),
                _ => {}
            }
        }
        if lt != "atomic" && lt != "set" && lt != "map" {
            errs.push(FieldError::not_supported(
                &path.child("x-kubernetes-list-type"),
                gofmt::quote(lt),
                &["atomic".into(), "set".into(), "map".into()],
            ));
        }
    }
    let map_keys: Vec<&str> = obj
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let keys_value = || {
        let v: Vec<Value> = map_keys
            .iter()
            .map(|k| Value::String(k.to_string()))
            .collect();
        format!(
            "[]string{{{}}}",
            v.iter()
                .map(gofmt::bad_value)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    if !map_keys.is_empty() {
        match list_type {
            None => errs.push(FieldError::required(
                &path.child("x-kubernetes-list-type"),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
            Some(lt) if lt != "map" => errs.push(FieldError::invalid_str(
                &path.child("x-kubernetes-list-type"),
                lt,
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
            _ => {}
        }
    }
    if list_type == Some("map") {
        if map_keys.is_empty() {
            errs.push(FieldError::required(
                &path.child("x-kubernetes-list-map-keys"),
                "must not be empty if x-kubernetes-list-type is map",
            ));
        }
        match items {
            None => errs.push(FieldError::required(
                &path.child("items"),
                "must have a schema if x-kubernetes-list-type is map",
            )),
            Some(is) => {
                let ity = is.get("type").and_then(Value::as_str).unwrap_or("");
                if ity != "object" {
                    errs.push(FieldError::invalid_str(
                        &path.child("items").child("type"),
                        ity,
                        "must be object if parent array's x-kubernetes-list-type is map",
                    ));
                } else {
                    let iprops = is.get("properties").and_then(Value::as_object);
                    let mut seen: Vec<&str> = Vec::new();
                    for k in &map_keys {
                        match iprops.and_then(|m| m.get(*k)) {
                            Some(s) => {
                                let st = s.get("type").and_then(Value::as_str).unwrap_or("");
                                if st == "array" || st == "object" {
                                    errs.push(FieldError::invalid_str(
                                        &path.child("items").child("properties").key(k).child("type"),
                                        ity,
                                        "must be a scalar type if parent array's x-kubernetes-list-type is map",
                                    ));
                                }
                            }
                            None => errs.push(FieldError::invalid(
                                &path.child("x-kubernetes-list-map-keys"),
                                keys_value(),
                                "entries must all be names of item properties",
                            )),
                        }
                        if seen.contains(k) {
                            errs.push(FieldError::invalid(
                                &path.child("x-kubernetes-list-map-keys"),
                                keys_value(),
                                "must not contain duplicate entries",
                            ));
                        }
                        seen.push(k);
                    }
                }
            }
        }
    }
    // validateMapListKeysMapSet
    if let (Some(lt @ ("set" | "map")), Some(is)) = (list_type, items) {
        if is.get("nullable") == Some(&Value::Bool(true)) {
            errs.push(FieldError::forbidden(
                &path.child("items").child("nullable"),
                format!("cannot be nullable when x-kubernetes-list-type is {lt}"),
            ));
        }
        if lt == "map" {
            let required: Vec<&str> = is
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for k in &map_keys {
                let Some(prop) = is.get("properties").and_then(|p| p.get(*k)) else {
                    continue;
                };
                if !required.contains(k) && prop.get("default").is_none() {
                    errs.push(FieldError::required(
                        &path.child("items").child("properties").key(k).child("default"),
                        "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                    ));
                }
                if prop.get("nullable") == Some(&Value::Bool(true)) {
                    errs.push(FieldError::forbidden(
                        &path
                            .child("items")
                            .child("properties")
                            .key(k)
                            .child("nullable"),
                        "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                    ));
                }
            }
        }
    }
    crate::cel::check_rule_specs(obj.get("x-kubernetes-validations"), path, errs);
}

// ---------------------------------------------------------------------------
// ValidateStructural (pkg/apiserver/schema/validation.go)
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Root,
    Item,
    Field,
}

/// Structural invariants and completeness; sorted by message like Kubernetes.
pub(crate) fn check_structural(root: &Node, path: &FPath) -> Vec<FieldError> {
    let mut errs = Vec::new();
    invariants(root, Level::Root, path, &mut errs);
    completeness(root, path, &mut errs);
    errs.sort_by_key(|e| e.to_string());
    errs
}

fn invariants(s: &Node, lvl: Level, path: &FPath, errs: &mut Vec<FieldError>) {
    if s.ty == "array" && s.items.is_none() {
        errs.push(FieldError::required(
            &path.child("items"),
            "must be specified",
        ));
    }
    if let Some(items) = &s.items {
        invariants(items, Level::Item, &path.child("items"), errs);
    }
    for (k, v) in &s.properties {
        invariants(v, Level::Field, &path.child("properties").key(k), errs);
    }
    if let Some(ap) = &s.additional_properties {
        if lvl == Level::Root {
            errs.push(FieldError::forbidden(
                &path.child("additionalProperties"),
                "must not be used at the root",
            ));
        }
        if let AddProps::Schema(sub) = ap {
            invariants(sub, Level::Field, &path.child("additionalProperties"), errs);
        }
    }
    if s.int_or_string && s.preserve_unknown {
        errs.push(FieldError::invalid(
            &path.child("x-kubernetes-preserve-unknown-fields"),
            "true".into(),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if s.int_or_string && s.embedded {
        errs.push(FieldError::invalid(
            &path.child("x-kubernetes-embedded-resource"),
            "true".into(),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    let skip_any_of = Node::is_int_or_string_any_of(&s.any_of);
    let skip_first_all_of_any_of = s
        .all_of
        .first()
        .is_some_and(|a| Node::is_int_or_string_any_of(&a.any_of));
    value_validation(s, skip_any_of, skip_first_all_of_any_of, path, errs);

    let check_metadata = lvl == Level::Root || s.embedded;
    if s.embedded && s.ty != "object" {
        if s.ty.is_empty() {
            errs.push(FieldError::required(
                &path.child("type"),
                "must be object if x-kubernetes-embedded-resource is true",
            ));
        } else {
            errs.push(FieldError::invalid_str(
                &path.child("type"),
                &s.ty,
                "must be object if x-kubernetes-embedded-resource is true",
            ));
        }
    } else if s.ty.is_empty() && !s.int_or_string && !s.preserve_unknown {
        let detail = match lvl {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errs.push(FieldError::required(&path.child("type"), detail));
    }
    if s.embedded && s.additional_properties.is_some() {
        errs.push(FieldError::forbidden(
            &path.child("additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if lvl == Level::Root && !s.ty.is_empty() && s.ty != "object" {
        errs.push(FieldError::invalid_str(
            &path.child("type"),
            &s.ty,
            "must be object at the root",
        ));
    }
    if check_metadata {
        for k in ["kind", "apiVersion"] {
            if let Some(p) = s.properties.get(k)
                && p.ty != "string"
            {
                errs.push(FieldError::invalid_str(
                    &path.child("properties").key(k).child("type"),
                    &p.ty,
                    "must be string",
                ));
            }
        }
    }
    if let Some(meta) = s.properties.get("metadata") {
        let mpath = path.child("properties").key("metadata");
        if check_metadata && meta.ty != "object" {
            errs.push(FieldError::invalid_str(
                &mpath.child("type"),
                &meta.ty,
                "must be object",
            ));
        }
        if lvl == Level::Root && !metadata_only_name(meta) {
            errs.push(FieldError::forbidden(
                &mpath,
                "must not specify anything other than name and generateName, but metadata is implicitly specified",
            ));
        }
    }
    if s.embedded && !s.preserve_unknown && s.properties.is_empty() {
        errs.push(FieldError::required(
            &path.child("properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ));
    }
}

/// validateStructuralMetadataInvariants at the root: metadata may only say
/// something about name and generateName (and have a type and default).
fn metadata_only_name(m: &Node) -> bool {
    let props_ok = m
        .properties
        .keys()
        .all(|k| k == "name" || k == "generateName");
    let mut rest = m.clone();
    rest.ty.clear();
    rest.default = None;
    rest.properties.clear();
    props_ok && rest.is_bare_type("")
}

fn value_validation(
    s: &Node,
    skip_any_of: bool,
    skip_first_all_of_any_of: bool,
    path: &FPath,
    errs: &mut Vec<FieldError>,
) {
    if !skip_any_of {
        for (i, v) in s.any_of.iter().enumerate() {
            nested(v, false, &path.child("anyOf").index(i), errs);
        }
    }
    for (i, v) in s.all_of.iter().enumerate() {
        nested(
            v,
            skip_first_all_of_any_of && i == 0,
            &path.child("allOf").index(i),
            errs,
        );
    }
    for (i, v) in s.one_of.iter().enumerate() {
        nested(v, false, &path.child("oneOf").index(i), errs);
    }
    if let Some(v) = &s.not {
        nested(v, false, &path.child("not"), errs);
    }
}

/// validateNestedValueValidation: what value validations may not say.
fn nested(v: &Node, skip_any_of: bool, path: &FPath, errs: &mut Vec<FieldError>) {
    value_validation(v, skip_any_of, false, path, errs);
    if let Some(items) = &v.items {
        nested(items, false, &path.child("items"), errs);
    }
    for (k, f) in &v.properties {
        nested(f, false, &path.child("properties").key(k), errs);
    }
    // What a nested value validation may not say, with the word Kubernetes uses for each.
    const EMPTY: &str = "must be empty to be structural";
    const UNDEFINED: &str = "must be undefined to be structural";
    const FALSE: &str = "must be false to be structural";
    let forbidden = [
        (!v.ty.is_empty(), "type", EMPTY),
        (
            v.additional_properties.is_some(),
            "additionalProperties",
            UNDEFINED,
        ),
        (v.default.is_some(), "default", UNDEFINED),
        (v.has_title, "title", EMPTY),
        (v.has_description, "description", EMPTY),
        (v.nullable, "nullable", FALSE),
        (v.has_external_docs, "externalDocs", UNDEFINED),
        (
            v.preserve_unknown,
            "x-kubernetes-preserve-unknown-fields",
            FALSE,
        ),
        (v.embedded, "x-kubernetes-embedded-resource", FALSE),
        (v.int_or_string, "x-kubernetes-int-or-string", FALSE),
        (
            !v.list_map_keys.is_empty(),
            "x-kubernetes-list-map-keys",
            EMPTY,
        ),
        (v.list_type.is_some(), "x-kubernetes-list-type", UNDEFINED),
        (v.map_type.is_some(), "x-kubernetes-map-type", UNDEFINED),
        (!v.rule_specs.is_empty(), "x-kubernetes-validations", EMPTY),
    ];
    for (set, field, detail) in forbidden {
        if set {
            errs.push(FieldError::forbidden(&path.child(field), detail));
        }
    }
    if v.properties.contains_key("metadata") {
        errs.push(FieldError::forbidden(
            &path.child("properties").key("metadata"),
            "must not be specified in a nested context",
        ));
    }
}

/// validateStructuralCompleteness: every property and items a value
/// validation speaks about must be specified in the structural spine.
fn completeness(s: &Node, path: &FPath, errs: &mut Vec<FieldError>) {
    for (i, v) in s.any_of.iter().enumerate() {
        nested_completeness(v, Some(s), path, &path.child("anyOf").index(i), errs);
    }
    for (i, v) in s.all_of.iter().enumerate() {
        nested_completeness(v, Some(s), path, &path.child("allOf").index(i), errs);
    }
    for (i, v) in s.one_of.iter().enumerate() {
        nested_completeness(v, Some(s), path, &path.child("oneOf").index(i), errs);
    }
    if let Some(v) = &s.not {
        nested_completeness(v, Some(s), path, &path.child("not"), errs);
    }
    if let Some(items) = &s.items {
        completeness(items, &path.child("items"), errs);
    }
    for (k, v) in &s.properties {
        completeness(v, &path.child("properties").key(k), errs);
    }
    if let Some(ap) = s.additional_schema() {
        completeness(ap, &path.child("additionalProperties"), errs);
    }
}

fn nested_completeness(
    v: &Node,
    s: Option<&Node>,
    spath: &FPath,
    vpath: &FPath,
    errs: &mut Vec<FieldError>,
) {
    let Some(s) = s else {
        errs.push(FieldError::required(
            spath,
            format!("because it is defined in {}", vpath.render()),
        ));
        return;
    };
    for (i, sub) in v.any_of.iter().enumerate() {
        nested_completeness(sub, Some(s), spath, &vpath.child("anyOf").index(i), errs);
    }
    for (i, sub) in v.all_of.iter().enumerate() {
        nested_completeness(sub, Some(s), spath, &vpath.child("allOf").index(i), errs);
    }
    for (i, sub) in v.one_of.iter().enumerate() {
        nested_completeness(sub, Some(s), spath, &vpath.child("oneOf").index(i), errs);
    }
    if let Some(sub) = &v.not {
        nested_completeness(sub, Some(s), spath, &vpath.child("not"), errs);
    }
    if let Some(items) = &v.items {
        nested_completeness(
            items,
            s.items.as_deref(),
            &spath.child("items"),
            &vpath.child("items"),
            errs,
        );
    }
    for (k, sub) in &v.properties {
        let sp = spath.child("properties").key(k);
        let vp = vpath.child("properties").key(k);
        match s.properties.get(k) {
            Some(sf) => nested_completeness(sub, Some(sf), &sp, &vp, errs),
            None => errs.push(FieldError::required(
                &sp,
                format!("because it is defined in {}", vp.render()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn int_or_string_any_of_pattern_is_recognised() {
        let mut errs = Vec::new();
        let n = parse(
            &json!({"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]}),
            &FPath::root(),
            0,
            &mut errs,
        );
        assert!(errs.is_empty());
        assert!(Node::is_int_or_string_any_of(&n.any_of));
    }
}
