//! Custom resources: the kinds a CustomResourceDefinition adds, served by the same generic
//! handler as every typed kind.
//!
//! A definition becomes a [`CustomKind`] (its names, scope, and per served version the
//! structural schema, subresources, printer columns and selectable fields); its objects are
//! [`Unstructured`]: JSON with a typed `metadata`, stored as JSON under
//! `/registry/<group>/<plural>/` in the storage version, as kube-apiserver stores them. The
//! kind at a version is the codec of requests for that version: decoding prunes the fields
//! its schema does not specify (named as unknown fields, so `fieldValidation` Strict refuses
//! them and Warn names them) and converts to the storage version, encoding converts back
//! (the None strategy: only `apiVersion` changes). With the Webhook strategy the codec leaves
//! `apiVersion` alone and the REST layer's codec calls the definition's conversion webhook
//! ([`crate::conversion`]). The handler defaults and validates with the storage version's
//! schema.
//!
//! Kind facts are `&'static` in the registry; each distinct [`KindInfo`] a definition yields
//! is interned once ([`skiff_api::intern_kind`]), so updating or recreating a definition
//! leaks nothing new.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};
use skiff_api::api::{CustomResourceDefinition, ObjectMeta};
use skiff_api::manifest::ManifestError;
use skiff_api::{DynKind, Encoded, KindInfo};

use crate::error::FieldError;
use crate::object::Object;
use crate::strategy::Strategy;
use crate::strategy::apiextensions::schema_errors;

/// A printer column of a definition's storage version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub r#type: String,
    pub json_path: String,
    pub priority: i32,
}

/// One custom kind at one of its served versions (the handler's: the storage version), from
/// its definition; cheap to clone (objects carry it).
#[derive(Debug, Clone)]
pub struct CustomKind {
    def: Arc<Definition>,
    /// Index into `def.versions`.
    at: usize,
}

impl std::ops::Deref for CustomKind {
    type Target = Definition;
    fn deref(&self) -> &Definition {
        &self.def
    }
}

/// What a definition says about its kind.
pub struct Definition {
    /// `<plural>.<group>`.
    pub crd_name: String,
    pub crd_uid: String,
    pub group: String,
    pub categories: Vec<String>,
    pub singular: String,
    /// The served versions; `storage` indexes the one objects are stored in.
    versions: Vec<Version>,
    storage: usize,
    /// The conversion webhook (strategy `Webhook`); `None` for the None strategy.
    webhook: Option<crate::conversion::Webhook>,
}

/// One served version of a custom kind.
struct Version {
    name: String,
    served: bool,
    info: &'static KindInfo,
    schema: skiff_schema::Schema,
    columns: Vec<Column>,
    /// Field paths (`spec.color`) field selectors may name, besides metadata.name and
    /// metadata.namespace.
    selectable: Vec<String>,
    /// The scale subresource's paths (spec replicas, status replicas, label selector).
    scale: Option<(String, String, Option<String>)>,
}

impl std::fmt::Debug for Definition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Definition")
            .field("crd", &self.crd_name)
            .finish_non_exhaustive()
    }
}

impl CustomKind {
    /// The kind a definition defines, at its storage version; `None` when the definition has
    /// no served storage version or a schema does not compile (validation refuses such
    /// definitions, so this is only a stored object written by something else).
    pub fn from_crd(crd: &CustomResourceDefinition) -> Option<CustomKind> {
        let spec = crd.spec.as_ref()?;
        let names = spec.names.as_ref()?;
        let trim = |p: &str| p.trim_start_matches('.').to_string();
        let mut versions = Vec::new();
        let mut storage = None;
        for v in spec.versions.iter().filter(|v| v.served || v.storage) {
            let raw: Value = v
                .schema
                .as_ref()
                .map(|s| serde_json::from_str(&s.open_api_v3_schema))
                .transpose()
                .ok()?
                .unwrap_or_else(|| Value::Object(Map::new()));
            let subresources = v.subresources.clone().unwrap_or_default();
            if v.storage {
                storage = Some(versions.len());
            }
            versions.push(Version {
                name: v.name.clone(),
                served: v.served,
                info: skiff_api::intern_kind(
                    &format!("{}/{}", spec.group, v.name),
                    &names.kind,
                    &names.plural,
                    &names.short_names,
                    spec.scope == "Namespaced",
                    subresources.status.is_some(),
                ),
                schema: skiff_schema::Schema::new(&raw, "openAPIV3Schema").ok()?,
                columns: v
                    .additional_printer_columns
                    .iter()
                    .map(|c| Column {
                        name: c.name.clone(),
                        r#type: c.r#type.clone(),
                        json_path: c.json_path.clone(),
                        priority: c.priority,
                    })
                    .collect(),
                selectable: v
                    .selectable_fields
                    .iter()
                    .map(|f| trim(&f.json_path))
                    .collect(),
                scale: subresources.scale.map(|s| {
                    (
                        trim(&s.spec_replicas_path),
                        trim(&s.status_replicas_path),
                        s.label_selector_path.as_deref().map(trim),
                    )
                }),
            });
        }
        let storage = storage?;
        let meta = crd.metadata.clone().unwrap_or_default();
        Some(CustomKind {
            def: Arc::new(Definition {
                crd_name: meta.name,
                crd_uid: meta.uid,
                group: spec.group.clone(),
                categories: names.categories.clone(),
                singular: if names.singular.is_empty() {
                    names.kind.to_lowercase()
                } else {
                    names.singular.clone()
                },
                versions,
                storage,
                webhook: spec
                    .conversion
                    .as_ref()
                    .filter(|c| c.strategy == "Webhook")
                    .and_then(|c| c.webhook.as_ref())
                    .map(|w| crate::conversion::Webhook {
                        client: w.client_config.clone().unwrap_or_default(),
                        review_versions: w.conversion_review_versions.clone(),
                    }),
            }),
            at: storage,
        })
    }

    fn version(&self) -> &Version {
        &self.def.versions[self.at]
    }

    /// The kind's facts at this version.
    pub fn info(&self) -> &'static KindInfo {
        self.version().info
    }

    /// The kind at served version `name` (objects read through it are converted from the
    /// storage version, and written ones to it: the None strategy).
    pub fn at_version(&self, name: &str) -> Option<CustomKind> {
        let at = self
            .def
            .versions
            .iter()
            .position(|v| v.name == name && v.served)?;
        Some(CustomKind {
            def: Arc::clone(&self.def),
            at,
        })
    }

    /// The kind at each of its served versions.
    pub fn served_versions(&self) -> Vec<CustomKind> {
        (0..self.def.versions.len())
            .filter(|at| self.def.versions[*at].served)
            .map(|at| CustomKind {
                def: Arc::clone(&self.def),
                at,
            })
            .collect()
    }

    /// The kind at its storage version.
    pub fn storage(&self) -> CustomKind {
        CustomKind {
            def: Arc::clone(&self.def),
            at: self.def.storage,
        }
    }

    pub fn columns(&self) -> &[Column] {
        &self.version().columns
    }

    pub fn scale(&self) -> Option<&(String, String, Option<String>)> {
        self.version().scale.as_ref()
    }

    fn selectable(&self) -> &[String] {
        &self.version().selectable
    }

    pub fn schema(&self) -> &skiff_schema::Schema {
        &self.version().schema
    }

    /// The schema's OpenAPI v3 form, for publishing.
    pub fn openapi(&self) -> Value {
        self.schema().openapi()
    }

    /// Sets an object's apiVersion to this version's (the None conversion); objects of a
    /// kind a webhook converts keep theirs (the caller converts them, [`Self::webhook`]).
    fn convert(&self, value: &mut Value) {
        if self.def.webhook.is_some() {
            return;
        }
        if let Some(m) = value.as_object_mut() {
            m.insert("apiVersion".into(), Value::from(self.info().api_version));
        }
    }

    /// The conversion webhook, when the definition's strategy is `Webhook`.
    pub fn webhook(&self) -> Option<&crate::conversion::Webhook> {
        self.def.webhook.as_ref()
    }

    /// Whether this is the storage version.
    pub fn is_storage(&self) -> bool {
        self.at == self.def.storage
    }

    /// Removes what this version's schema does not specify, silently (a conversion
    /// webhook's answer is pruned so, as kube-apiserver prunes it).
    pub fn prune(&self, value: &mut Value) {
        self.schema().prune(value);
    }

    /// The string value at a dotted field path of an object, as field selectors compare it.
    fn value_at(obj: &Map<String, Value>, path: &str) -> Option<String> {
        let mut parts = path.split('.');
        let mut cur = obj.get(parts.next()?)?;
        for p in parts {
            cur = cur.get(p)?;
        }
        Some(match cur {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        })
    }
}

/// The codec of one version: a request's object is pruned by this version's schema and
/// converted to the storage version; a stored object is converted to this version.
impl DynKind for CustomKind {
    fn info(&self) -> &'static KindInfo {
        self.version().info
    }

    /// Prunes what the schema does not specify; the first pruned field is reported as an
    /// unknown field (the caller removes it, warns or refuses, by `fieldValidation`).
    fn json_to_proto(&self, value: Value) -> Result<Vec<u8>, ManifestError> {
        match self.json_to_proto_pruning(value)? {
            (_, unknown) if !unknown.is_empty() => {
                Err(ManifestError::new(unknown[0].clone(), "unknown field"))
            }
            (bytes, _) => Ok(bytes),
        }
    }

    fn prunes_unknown(&self) -> bool {
        true
    }

    /// Prunes what the schema does not specify (at the root, metadata to ObjectMeta's
    /// fields), checks the metadata, and converts this version's object to the storage
    /// version; returns the pruned fields.
    fn json_to_proto_pruning(&self, value: Value) -> Result<(Vec<u8>, Vec<String>), ManifestError> {
        let (stored, unknown) = self.json_to_stored_pruning(value)?;
        Ok((stored.into_bytes(), unknown))
    }

    /// The pruned, checked and converted object, handed over as the value it is.
    fn json_to_stored_pruning(
        &self,
        mut value: Value,
    ) -> Result<(Encoded, Vec<String>), ManifestError> {
        if !value.is_object() {
            return Err(ManifestError::new("", "expected an object"));
        }
        let unknown = self.schema().prune(&mut value);
        if let Some(meta) = value.get("metadata").filter(|m| !m.is_null()) {
            // Read in place; the path-naming decoder (which needs its own copy) runs only
            // to word an error.
            if <ObjectMeta as serde::Deserialize>::deserialize(meta).is_err() {
                skiff_api::manifest::decode::<ObjectMeta>(meta.clone()).map_err(|mut e| {
                    e.path = if e.path.is_empty() {
                        "metadata".into()
                    } else {
                        format!("metadata.{}", e.path)
                    };
                    e
                })?;
            }
        }
        // A kind and apiVersion of another kind are refused by the caller; only this
        // version's become the storage version's.
        if value["apiVersion"].as_str() == Some(self.info().api_version) {
            self.storage().convert(&mut value);
        }
        Ok((Encoded::Json(value), unknown))
    }

    fn proto_to_json(&self, bytes: &[u8]) -> Result<Value, prost::DecodeError> {
        let mut value = skiff_api::json_kind(self.info()).proto_to_json(bytes)?;
        self.convert(&mut value);
        Ok(value)
    }
}

/// A custom object read in one pass: the metadata straight into [`ObjectMeta`], every other
/// top-level field as JSON. Fails where the metadata needs the lenient decoder.
struct Parts {
    meta: ObjectMeta,
    rest: Map<String, Value>,
}

impl<'de> serde::Deserialize<'de> for Parts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Parts;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Parts, A::Error> {
                let mut meta = None;
                let mut rest = Map::new();
                while let Some(k) = a.next_key::<String>()? {
                    if k == "metadata" {
                        meta = Some(a.next_value::<ObjectMeta>()?);
                    } else {
                        rest.insert(k, a.next_value()?);
                    }
                }
                Ok(Parts {
                    meta: meta.unwrap_or_default(),
                    rest,
                })
            }
        }
        d.deserialize_map(Visit)
    }
}

/// An object of a custom kind: its metadata typed, the rest as JSON.
#[derive(Clone)]
pub struct Unstructured {
    kind: CustomKind,
    meta: ObjectMeta,
    /// Every top-level field but `metadata`: always a JSON object, held as a `Value` so the
    /// schema reads it in place ([`Unstructured::fields`] is the map).
    rest: Value,
}

impl std::fmt::Debug for Unstructured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unstructured")
            .field("kind", &self.kind.info().kind)
            .field("name", &self.meta.name)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Unstructured {
    fn eq(&self, other: &Self) -> bool {
        self.meta == other.meta && self.rest == other.rest
    }
}

impl Unstructured {
    fn new(kind: CustomKind, meta: ObjectMeta, rest: Map<String, Value>) -> Self {
        Unstructured {
            kind,
            meta,
            rest: Value::Object(rest),
        }
    }

    /// A custom object's JSON taken apart in place: its metadata read into [`ObjectMeta`]
    /// (by the path-naming decoder, which words errors and reads nulls as unset, when the
    /// plain one refuses it), the rest kept as it is.
    fn from_value(kind: CustomKind, value: Value) -> Result<Self, String> {
        let Value::Object(mut rest) = value else {
            return Err("expected an object".into());
        };
        let meta = match rest.remove("metadata") {
            None | Some(Value::Null) => ObjectMeta::default(),
            Some(m) => match <ObjectMeta as serde::Deserialize>::deserialize(&m) {
                Ok(meta) => meta,
                Err(_) => skiff_api::manifest::decode::<ObjectMeta>(m)
                    .map_err(|e| format!("metadata: {e}"))?,
            },
        };
        Ok(Unstructured::new(kind, meta, rest))
    }

    /// Every top-level field but `metadata`.
    fn fields(&self) -> &Map<String, Value> {
        static NONE: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);
        self.rest.as_object().unwrap_or(&NONE)
    }

    fn fields_mut(&mut self) -> &mut Map<String, Value> {
        if !self.rest.is_object() {
            self.rest = Value::Object(Map::new());
        }
        match &mut self.rest {
            Value::Object(m) => m,
            _ => unreachable!("the fields were made an object above"),
        }
    }

    /// The whole object as JSON.
    pub fn to_value(&self) -> Value {
        let mut map = self.fields().clone();
        map.insert("metadata".into(), self.meta_value());
        Value::Object(map)
    }

    fn meta_value(&self) -> Value {
        let mut meta = serde_json::to_value(&self.meta).unwrap_or(Value::Null);
        skiff_api::serde_util::prune_message("ObjectMeta", &mut meta);
        meta
    }

    /// The metadata as its schema sees it: only `name` and `generateName`, the only
    /// metadata a structural schema may constrain and CEL rules may read (as in Kubernetes);
    /// the rest of the metadata is validated as every kind's is.
    fn schema_metadata(&self) -> Value {
        let mut meta = Map::new();
        for (k, v) in [
            ("name", &self.meta.name),
            ("generateName", &self.meta.generate_name),
        ] {
            if !v.is_empty() {
                meta.insert(k.into(), Value::from(v.as_str()));
            }
        }
        Value::Object(meta)
    }

    /// The whole object as its schema sees it ([`Unstructured::schema_metadata`]).
    fn schema_view(&self) -> Value {
        let mut map = self.fields().clone();
        map.insert("metadata".into(), self.schema_metadata());
        Value::Object(map)
    }

    /// The schema's refusals of this object; `old` is the stored object (its view) for
    /// transition rules.
    fn schema_check(&self, old: Option<&Value>) -> Vec<skiff_schema::FieldError> {
        self.kind
            .schema()
            .validate_parts(&self.rest, &self.schema_metadata(), old)
    }

    fn status_is_subresource(&self) -> bool {
        self.kind.info().has_status
    }
}

impl Object for Unstructured {
    type Kind = CustomKind;

    fn decode(kind: &CustomKind, bytes: &[u8]) -> Result<Self, String> {
        let kind = kind.clone();
        if let Ok(Parts { meta, rest }) = serde_json::from_slice::<Parts>(bytes) {
            return Ok(Unstructured::new(kind, meta, rest));
        }
        // Worded with the path-naming decoder (nulls in the metadata are unset fields).
        let value: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        Unstructured::from_value(kind, value)
    }

    /// A value from the codec is taken apart in place ([`Unstructured::from_value`]).
    fn decode_encoded(kind: &CustomKind, encoded: Encoded) -> Result<Self, String> {
        match encoded {
            Encoded::Bytes(b) => Self::decode(kind, &b),
            Encoded::Json(v) => Unstructured::from_value(kind.clone(), v),
        }
    }

    fn encode(&self) -> Vec<u8> {
        // Written from the fields in place (the object is not copied into one `Value`
        // first), keys in the order `to_value` has them.
        struct Whole<'a> {
            rest: &'a Map<String, Value>,
            meta: &'a Value,
        }
        impl serde::Serialize for Whole<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = s.serialize_map(Some(self.rest.len() + 1))?;
                let mut meta = Some(self.meta);
                for (k, v) in self.rest {
                    if k.as_str() > "metadata"
                        && let Some(m) = meta.take()
                    {
                        map.serialize_entry("metadata", m)?;
                    }
                    map.serialize_entry(k, v)?;
                }
                if let Some(m) = meta {
                    map.serialize_entry("metadata", m)?;
                }
                map.end()
            }
        }
        serde_json::to_vec(&Whole {
            rest: self.fields(),
            meta: &self.meta_value(),
        })
        .unwrap_or_default()
    }

    /// The stored text with `"resourceVersion"` written into its metadata where
    /// [`Object::encode`] puts it (metadata keys in order), rather than the object written
    /// out again; the full encoding when the text is not laid out as expected.
    fn encode_at(&self, stored: &[u8], revision: i64) -> Vec<u8> {
        splice_revision(stored, revision).unwrap_or_else(|| self.encode())
    }

    fn metadata(&self) -> Option<&ObjectMeta> {
        Some(&self.meta)
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }

    fn api_version(&self) -> &str {
        self.fields()
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    fn kind(&self) -> &str {
        self.fields()
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    fn set_type_meta(&mut self) {
        let info = self.kind.info();
        let fields = self.fields_mut();
        fields.insert("apiVersion".into(), Value::from(info.api_version));
        fields.insert("kind".into(), Value::from(info.kind));
    }

    fn clear_status(&mut self) {
        if self.status_is_subresource() {
            self.fields_mut().remove("status");
        }
    }

    fn copy_status_from(&mut self, other: &Self) {
        if !self.status_is_subresource() {
            return;
        }
        match other.fields().get("status") {
            Some(s) => self.fields_mut().insert("status".into(), s.clone()),
            None => self.fields_mut().remove("status"),
        };
    }

    fn field(&self, path: &str) -> Option<String> {
        match path {
            "metadata.name" => Some(self.meta.name.clone()),
            "metadata.namespace" => Some(self.meta.namespace.clone()),
            p if self.kind.selectable().iter().any(|s| s == p) => {
                Some(CustomKind::value_at(self.fields(), p).unwrap_or_default())
            }
            _ => None,
        }
    }

    fn selectable(kind: &CustomKind, path: &str) -> bool {
        matches!(path, "metadata.name" | "metadata.namespace")
            || kind.selectable().iter().any(|s| s == path)
    }

    fn spec_eq(&self, other: &Self) -> bool {
        let strip = |o: &Self| {
            let mut m = o.fields().clone();
            m.remove("apiVersion");
            m.remove("kind");
            if o.status_is_subresource() {
                m.remove("status");
            }
            m
        };
        strip(self) == strip(other)
    }

    fn to_json(&self) -> Value {
        self.to_value()
    }

    /// Pruned by the schema (an unknown field is refused) and converted to the storage
    /// version, as a request body is.
    fn from_json(kind: &CustomKind, value: Value) -> Result<Self, String> {
        let bytes = skiff_api::DynKind::json_to_proto(kind, value).map_err(|e| e.to_string())?;
        Self::decode(kind, &bytes)
    }
}

/// `stored` (a custom object's compact JSON, written by [`Object::encode`] without a
/// resourceVersion) with `"resourceVersion":"<revision>"` inserted into its metadata
/// before the first key that sorts after it, as the encoder orders keys. `None` when
/// `stored` does not have that shape (the caller then encodes).
///
/// Written by hand because no JSON crate edits text in place; serde_json's borrowed
/// `RawValue`s give the offsets, so only the metadata's keys are scanned.
fn splice_revision(stored: &[u8], revision: i64) -> Option<Vec<u8>> {
    use serde_json::value::RawValue;

    #[derive(serde::Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        metadata: &'a RawValue,
    }
    /// The metadata's keys in order, each with its value's text.
    struct Keys<'a>(Vec<(&'a str, &'a RawValue)>);
    impl<'de> serde::Deserialize<'de> for Keys<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Keys<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut a: A,
                ) -> Result<Keys<'de>, A::Error> {
                    let mut keys = Vec::new();
                    while let Some(entry) = a.next_entry::<&str, &RawValue>()? {
                        keys.push(entry);
                    }
                    Ok(Keys(keys))
                }
            }
            d.deserialize_map(Visit)
        }
    }

    const KEY: &str = "resourceVersion";
    let text = std::str::from_utf8(stored).ok()?;
    let top: Top<'_> = serde_json::from_str(text).ok()?;
    let meta = top.metadata.get();
    let Keys(keys) = serde_json::from_str(meta).ok()?;
    let offset = |s: &str| (s.as_ptr() as usize).checked_sub(text.as_ptr() as usize);
    if keys.iter().any(|(k, _)| *k == KEY) || keys.windows(2).any(|w| w[0].0 >= w[1].0) {
        return None;
    }
    let field = format!("\"{KEY}\":\"{revision}\"");
    let (at, insert) = match keys.iter().find(|(k, _)| *k > KEY) {
        // Compact JSON: the key's opening quote sits just before its text.
        Some((k, _)) => (offset(k)?.checked_sub(1)?, format!("{field},")),
        None => {
            let close = offset(meta)? + meta.len() - 1;
            let sep = if keys.is_empty() { "" } else { "," };
            (close, format!("{sep}{field}"))
        }
    };
    if text.as_bytes().get(at) != Some(&if insert.ends_with(',') { b'"' } else { b'}' }) {
        return None;
    }
    let mut out = Vec::with_capacity(stored.len() + insert.len());
    out.extend_from_slice(&stored[..at]);
    out.extend_from_slice(insert.as_bytes());
    out.extend_from_slice(&stored[at..]);
    Some(out)
}

#[async_trait]
impl Strategy for Unstructured {
    /// The schema's defaults.
    fn default(&mut self) {
        self.kind.schema().apply_defaults(&mut self.rest);
    }

    /// The storage version's schema, with its CEL rules (transition rules see no old object
    /// on create).
    fn validate(&self) -> Vec<FieldError> {
        schema_errors(self.schema_check(None))
    }

    /// The schema again, with the stored object for transition rules.
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        // `validate` already reported the rules that need no old object; without rules there
        // is nothing else an old object changes.
        if !self.kind.schema().has_rules() {
            return Vec::new();
        }
        let with_old = self.schema_check(Some(&old.schema_view()));
        let without: HashSet<String> = self
            .schema_check(None)
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        schema_errors(
            with_old
                .into_iter()
                .filter(|e| !without.contains(&e.to_string()))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use skiff_api::api::{
        CustomResourceDefinitionNames, CustomResourceDefinitionSpec,
        CustomResourceDefinitionVersion, CustomResourceValidation,
    };

    fn kind() -> CustomKind {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "zzz": {"type": "string"}, "aaa": {"type": "string"}}});
        let crd = CustomResourceDefinition {
            metadata: Some(ObjectMeta {
                name: "widgets.example.com".into(),
                ..Default::default()
            }),
            spec: Some(CustomResourceDefinitionSpec {
                group: "example.com".into(),
                scope: "Namespaced".into(),
                names: Some(CustomResourceDefinitionNames {
                    plural: "widgets".into(),
                    kind: "Widget".into(),
                    ..Default::default()
                }),
                versions: vec![CustomResourceDefinitionVersion {
                    name: "v1".into(),
                    served: true,
                    storage: true,
                    schema: Some(CustomResourceValidation {
                        open_api_v3_schema: schema.to_string(),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        CustomKind::from_crd(&crd).expect("a served kind")
    }

    #[test]
    fn encoding_in_place_writes_what_to_value_holds() {
        let k = kind();
        let value = json!({"apiVersion": "example.com/v1", "kind": "Widget", "aaa": "a",
            "zzz": "z", "spec": {"b": [1, {"c": null}], "a": "x"},
            "metadata": {"name": "w", "namespace": "ns", "labels": {"l": "v"},
                         "managedFields": [{"manager": "m", "operation": "Update"}]}});
        let obj = Unstructured::decode(&k, &serde_json::to_vec(&value).unwrap()).unwrap();
        assert_eq!(
            obj.encode(),
            serde_json::to_vec(&obj.to_value()).unwrap(),
            "the same bytes, keys in the same order"
        );
    }

    #[test]
    fn schemas_see_only_the_name_and_generate_name_of_the_metadata() {
        let k = kind();
        let value = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "generateName": "w-", "namespace": "ns",
                         "labels": {"l": "v"}, "uid": "u"}});
        let obj = Unstructured::decode(&k, &serde_json::to_vec(&value).unwrap()).unwrap();
        assert_eq!(
            obj.schema_view()["metadata"],
            json!({"name": "w", "generateName": "w-"})
        );
        assert_eq!(obj.schema_view()["kind"], "Widget");
    }

    /// A custom kind prunes every unknown field in one pass: strict validation names them
    /// all (as kube-apiserver's strict decoding error does), Warn warns of each, Ignore
    /// drops them; bad metadata is still worded with its path.
    #[test]
    fn unknown_fields_are_found_in_one_pass() {
        use crate::rest::call::FieldValidation;
        use crate::rest::call::encode_with;
        let k = kind();
        let value = json!({"apiVersion": "example.com/v1", "kind": "Widget", "aaa": "a",
            "bogus": 1, "metadata": {"name": "w", "colour": "red"}});
        let err = encode_with(&k, value.clone(), FieldValidation::Strict).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Widget in version \"v1\" cannot be handled as a Widget: strict decoding error: \
             unknown field \"bogus\", unknown field \"metadata.colour\""
        );
        let (bytes, warnings) = encode_with(&k, value.clone(), FieldValidation::Warn).unwrap();
        assert_eq!(
            warnings,
            [
                "unknown field \"bogus\"",
                "unknown field \"metadata.colour\""
            ]
        );
        let stored: Value = serde_json::from_slice(&bytes.clone().into_bytes()).unwrap();
        assert_eq!(stored["metadata"], json!({"name": "w"}));
        assert!(stored.get("bogus").is_none());
        let (ignored, none) = encode_with(&k, value, FieldValidation::Ignore).unwrap();
        assert_eq!((ignored, none.len()), (bytes, 0));
        let bad = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "labels": {"l": 5}}});
        let err = encode_with(&k, bad, FieldValidation::Strict).unwrap_err();
        assert!(err.to_string().contains("metadata.labels.l"), "{err}");
    }

    /// The one-pass reader and the lenient one agree; metadata with nulls (unset fields in
    /// Kubernetes' JSON) still reads, and bad metadata is still refused with its path.
    #[test]
    fn objects_read_in_one_pass_as_the_lenient_decoder_reads_them() {
        let k = kind();
        let plain = json!({"apiVersion": "example.com/v1", "kind": "Widget", "aaa": "a",
            "metadata": {"name": "w", "labels": {"l": "v"}, "generation": 2}});
        let bytes = serde_json::to_vec(&plain).unwrap();
        let fast = serde_json::from_slice::<Parts>(&bytes).expect("one pass");
        let obj = Unstructured::decode(&k, &bytes).unwrap();
        assert_eq!((fast.meta, &fast.rest), (obj.meta.clone(), obj.fields()));
        assert_eq!(obj.to_value(), plain);
        // The codec's value is taken apart as its text is read.
        let handed = Unstructured::decode_encoded(&k, Encoded::Json(plain.clone())).unwrap();
        assert_eq!(handed, obj);
        let nulls = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "creationTimestamp": null}});
        let bytes = serde_json::to_vec(&nulls).unwrap();
        assert_eq!(Unstructured::decode(&k, &bytes).unwrap().meta.name, "w");
        let handed = Unstructured::decode_encoded(&k, Encoded::Json(nulls)).unwrap();
        assert_eq!(handed.meta.name, "w");
        let bad = br#"{"kind": "Widget", "metadata": {"name": "w", "labels": {"l": 5}}}"#;
        let err = Unstructured::decode(&k, bad).unwrap_err();
        assert!(err.starts_with("metadata: "), "{err}");
        let bad: Value = serde_json::from_slice(bad).unwrap();
        let err = Unstructured::decode_encoded(&k, Encoded::Json(bad)).unwrap_err();
        assert!(err.starts_with("metadata: "), "{err}");
    }

    /// A write's cached encoding is its stored text with the resourceVersion spliced in,
    /// byte for byte what encoding the object again writes, whatever metadata it has.
    #[test]
    fn the_revision_is_spliced_where_encoding_puts_it() {
        let k = kind();
        let metas = [
            json!({}),
            json!({"name": "w"}),
            json!({"name": "w", "namespace": "n", "uid": "u-1", "labels": {"a": "b"}}),
            json!({"name": "w", "annotations": {"k\"ey": "v}"}}),
            json!({"name": "w", "namespace": "n", "uid": "u", "generation": 3,
                "creationTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["f"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "x"}],
                "managedFields": [{"manager": "m", "operation": "Update", "apiVersion": "example.com/v1",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {".": {}, "f:x": {}}}}]}),
        ];
        let mut spliced = 0;
        for meta in metas {
            let value = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": meta,
                "spec": {"resourceVersion": "not this one", "z": [1, {"uid": "q"}]}, "zzz": "}"});
            let mut obj = Unstructured::decode_encoded(&k, Encoded::Json(value)).unwrap();
            let stored = crate::stored::encode_for_store(&mut obj);
            obj.meta.resource_version = "42".into();
            let direct = splice_revision(&stored, 42);
            spliced += usize::from(direct.is_some());
            assert_eq!(
                String::from_utf8(obj.encode_at(&stored, 42)).unwrap(),
                String::from_utf8(obj.encode()).unwrap()
            );
        }
        assert_eq!(spliced, 5, "every layout above is spliced, not re-encoded");
        // Text that already holds a resourceVersion, or is not an object, is not edited.
        assert!(splice_revision(br#"{"metadata":{"resourceVersion":"1"}}"#, 2).is_none());
        assert!(splice_revision(b"[1]", 2).is_none());
    }
}
