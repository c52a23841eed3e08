//! Kubernetes' apiextensions.k8s.io/v1 *structural schemas* for
//! CustomResourceDefinitions, as a pure library for the API server.
//!
//! A [`Schema`] is built from one CRD version's `schema.openAPIV3Schema`
//! with [`Schema::new`], which makes the checks Kubernetes 1.32 makes when a
//! CRD is written and reports every problem with Kubernetes' field paths and
//! messages:
//!
//! - only JSONSchemaProps fields, with the right JSON types;
//! - `ValidateCustomResourceDefinitionOpenAPISchema`: no `$ref`, `id`,
//!   `definitions`, `dependencies`, `patternProperties`, `additionalItems`,
//!   item arrays or `uniqueItems: true`; `additionalProperties` and
//!   `properties` are mutually exclusive; the `x-kubernetes-list-type`,
//!   `-list-map-keys` and `-map-type` rules; no defaults in top-level
//!   metadata; the rule fields of `x-kubernetes-validations`;
//! - `ValidateStructural`: every specified field and array item has a type
//!   (unless int-or-string or preserve-unknown-fields), the root is an object
//!   whose metadata may only restrict name and generateName, value
//!   validations in `allOf`/`anyOf`/`oneOf`/`not` specify no type, default,
//!   description, ... and speak only about fields of the structural spine,
//!   embedded resources are objects;
//! - defaults must validate against their schema and be pruned already;
//! - CEL rules must compile (syntax, only `self`/`oldSelf`, `oldSelf` only
//!   where old values can be correlated, a valid `fieldPath`).
//!
//! A `Schema` then validates objects ([`Schema::validate`]: kube-openapi's
//! checks and messages, list-type uniqueness, embedded resources, CEL rules
//! with a cost budget), defaults them ([`Schema::apply_defaults`]) and prunes
//! unknown fields ([`Schema::prune`]) as the API server does, in that order:
//! prune, default, validate.
//!
//! Hostile input: schemas deeper than 64 levels are refused; objects deeper
//! than 128 levels are reported invalid without being walked; CEL rules are
//! parsed and evaluated on a thread with a large stack, their syntax trees
//! are limited in depth, and every evaluation is cut off by a cost limit
//! (1,000,000 per rule evaluation, 10,000,000 per object).

mod cel;
mod error;
mod formats;
mod gofmt;
mod node;
mod ops;
mod validate;

use serde_json::Value;

pub use cel::Expression;
use error::{At, FPath, Name};
pub use error::{ErrorKind, FieldError};
use node::Node;

/// Objects nested deeper than this are reported invalid and not walked.
const MAX_OBJECT_DEPTH: usize = 128;

/// The list semantics of an array field (`x-kubernetes-list-type`), for
/// server-side apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListType {
    /// The list is replaced as a whole (the default).
    Atomic,
    /// Items are unique scalars (or atomic values), merged by value.
    Set,
    /// Items are objects identified by these key fields.
    Map(Vec<String>),
}

/// [`ListType`], borrowed from the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListShape<'a> {
    Atomic,
    Set,
    Map(&'a [String]),
}

/// One node of a [`Schema`]: what server-side apply needs to know of a value's shape.
#[derive(Debug, Clone, Copy)]
pub struct SchemaNode<'a>(&'a Node);

impl<'a> SchemaNode<'a> {
    /// The schema of an object's field `name` (a property, else `additionalProperties`).
    pub fn field(self, name: &str) -> Option<SchemaNode<'a>> {
        self.0.field_schema(name).map(SchemaNode)
    }

    /// The schema of an array's items.
    pub fn items(self) -> Option<SchemaNode<'a>> {
        self.0.items.as_deref().map(SchemaNode)
    }

    /// Whether this is a map whose entries are separate members: an object with
    /// `additionalProperties` and no properties, not `x-kubernetes-map-type: atomic`.
    pub fn is_granular_map(self) -> bool {
        let n = self.0;
        n.ty == "object"
            && n.properties.is_empty()
            && n.additional_schema().is_some()
            && n.map_type.as_deref() != Some("atomic")
    }

    /// Whether this object is one member as a whole (`x-kubernetes-map-type: atomic`).
    pub fn is_atomic_object(self) -> bool {
        self.0.ty == "object" && self.0.map_type.as_deref() == Some("atomic")
    }

    /// Whether this is an embedded object (`x-kubernetes-embedded-resource`): it has
    /// apiVersion, kind and metadata of its own.
    pub fn is_embedded_resource(self) -> bool {
        self.0.embedded
    }

    /// The schema of a granular map's values.
    pub fn values(self) -> Option<SchemaNode<'a>> {
        self.0.additional_schema().map(SchemaNode)
    }

    /// The list semantics of an array, borrowed (`None` if this is not an array).
    pub fn list_shape(self) -> Option<ListShape<'a>> {
        let n = self.0;
        if n.ty != "array" {
            return None;
        }
        Some(match n.list_type.as_deref() {
            Some("set") => ListShape::Set,
            Some("map") => ListShape::Map(&n.list_map_keys),
            _ => ListShape::Atomic,
        })
    }

    /// The list semantics of an array (`None` if this is not an array).
    pub fn list_type(self) -> Option<ListType> {
        let n = self.0;
        if n.ty != "array" {
            return None;
        }
        Some(match n.list_type.as_deref() {
            Some("set") => ListType::Set,
            Some("map") => ListType::Map(n.list_map_keys.clone()),
            _ => ListType::Atomic,
        })
    }
}

/// A checked structural schema of one CRD version.
#[derive(Debug, Clone)]
pub struct Schema {
    root: Node,
    raw: Value,
    has_rules: bool,
}

impl Schema {
    /// Parses a CRD version's `schema.openAPIV3Schema` JSON and checks it as
    /// Kubernetes does when the CRD is created or updated. `path` is where
    /// the schema sits in the CRD, e.g.
    /// `spec.versions[0].schema.openAPIV3Schema`; every error's path starts
    /// with it. Returns all errors, not just the first.
    pub fn new(raw: &Value, path: &str) -> Result<Schema, Vec<FieldError>> {
        let path = FPath::parse(path);
        if !raw.is_object() {
            return Err(vec![FieldError::invalid(
                &path,
                gofmt::bad_value(raw),
                "must be an object",
            )]);
        }
        let mut parse_errs = Vec::new();
        let mut root = node::parse(raw, &path, 0, &mut parse_errs);
        let structural = check_structural_if_parsed(&root, &path, &parse_errs);
        let mut schema_errs = Vec::new();
        node::check_openapi(raw, &path, true, &mut schema_errs);

        let mut errs = parse_errs;
        errs.extend(structural);
        if !errs.is_empty() || !schema_errs.is_empty() {
            errs.extend(schema_errs);
            return Err(errs);
        }
        let cel_errs = cel::compile_all(&mut root, &path);
        let has_rules = has_any_rules(&root);
        let schema = Schema {
            root,
            raw: raw.clone(),
            has_rules,
        };
        let mut default_errs = Vec::new();
        if cel_errs.is_empty() {
            schema.validate_defaults(&schema.root, &path, true, &mut default_errs);
        }
        errs.extend(default_errs);
        errs.extend(cel_errs);
        if errs.is_empty() {
            Ok(schema)
        } else {
            Err(errs)
        }
    }

    /// Validates a whole custom object (the root is the object itself; its
    /// apiVersion, kind and metadata are left to the server, except what the
    /// schema says about metadata.name and generateName). `old` is the stored
    /// object on update: transition rules (those using `oldSelf`) run only
    /// where an old value correlates.
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
        self.validate_at_root(obj, None, old)
    }

    /// As [`Schema::validate`], for an object given as its members other than
    /// `metadata` (`fields`) and the metadata its schema sees (`metadata`):
    /// a server holding the metadata apart need not assemble the object.
    /// Only CEL rules and composite root schemas (which see the whole object)
    /// get it assembled, here.
    pub fn validate_parts(
        &self,
        fields: &Value,
        metadata: &Value,
        old: Option<&Value>,
    ) -> Vec<FieldError> {
        let r = &self.root;
        let whole_needed = self.has_rules
            || !(r.all_of.is_empty() && r.any_of.is_empty() && r.one_of.is_empty())
            || r.not.is_some()
            || r.enum_.is_some();
        match fields {
            Value::Object(m) if whole_needed || m.contains_key("metadata") => {
                let mut whole = m.clone();
                whole.insert("metadata".into(), metadata.clone());
                self.validate(&Value::Object(whole), old)
            }
            Value::Object(_) => self.validate_at_root(fields, Some(metadata), old),
            _ => self.validate(fields, old),
        }
    }

    fn validate_at_root(
        &self,
        obj: &Value,
        root_meta: Option<&Value>,
        old: Option<&Value>,
    ) -> Vec<FieldError> {
        let root = FPath::root();
        if too_deep(obj) {
            return vec![FieldError::invalid(
                &root,
                gofmt::quote("object"),
                format!("object nesting exceeds the maximum depth of {MAX_OBJECT_DEPTH}"),
            )];
        }
        let mut out = Vec::new();
        validate::openapi(
            &self.root,
            obj,
            &Name::Root,
            &root,
            true,
            root_meta,
            &mut out,
        );
        validate::lists_and_embedded(&self.root, obj, &At::Path(&root), true, &mut out);
        if self.has_rules {
            let old = old.filter(|o| !too_deep(o));
            out.extend(cel::Evaluator::run(&self.root, obj, old, &root, true));
        }
        out
    }

    /// Whether the schema has CEL rules (which see whole objects, old ones too).
    pub fn has_rules(&self) -> bool {
        self.has_rules
    }

    /// Applies `default`s as Kubernetes' structural defaulting does: absent
    /// fields, and nulls of non-nullable fields, get their default; defaults
    /// nest (a defaulted object gets the defaults of its own fields).
    pub fn apply_defaults(&self, obj: &mut Value) {
        if too_deep(obj) {
            return;
        }
        ops::apply_defaults(obj, &self.root);
    }

    /// Removes the fields the schema does not specify, honouring
    /// `x-kubernetes-preserve-unknown-fields` and embedded resources (whose
    /// apiVersion and kind stay, and whose metadata is pruned to ObjectMeta's
    /// fields, as at the root). Returns the removed fields' paths as
    /// Kubernetes' "unknown field" warnings name them (`spec.foo`,
    /// `spec.items[0].bar`), sorted.
    pub fn prune(&self, obj: &mut Value) -> Vec<String> {
        let mut out = Vec::new();
        ops::prune(obj, Some(&self.root), true, &Name::Root, &mut out);
        out.sort();
        out
    }

    /// The list semantics of the array at a field path (e.g.
    /// `["spec", "ports"]`); `None` if the path is not a specified array.
    pub fn list_type(&self, path: &[&str]) -> Option<ListType> {
        SchemaNode(self.node_at(path)?).list_type()
    }

    /// The root of the schema, to walk an object along it.
    pub fn root(&self) -> SchemaNode<'_> {
        SchemaNode(&self.root)
    }

    /// The schema as OpenAPI v3 JSON for publishing (`kubectl explain`):
    /// the schema as written, vendor extensions and validations included.
    pub fn openapi(&self) -> Value {
        self.raw.clone()
    }

    /// The type of the field at a path (`"string"`, `"integer"`, `"number"`,
    /// `"boolean"`, `"array"`, `"object"`, `"int-or-string"`, or `""` for a
    /// field without a type), if the path is specified.
    pub fn type_at(&self, path: &[&str]) -> Option<&str> {
        let n = self.node_at(path)?;
        if n.int_or_string {
            return Some("int-or-string");
        }
        Some(n.ty.as_str())
    }

    fn node_at(&self, path: &[&str]) -> Option<&Node> {
        let mut n = &self.root;
        for seg in path {
            n = n.field_schema(seg)?;
        }
        Some(n)
    }

    /// structuraldefaulting.ValidateDefaults: each default validates against
    /// its schema and is already pruned.
    fn validate_defaults(&self, n: &Node, path: &FPath, is_root: bool, errs: &mut Vec<FieldError>) {
        if let Some(d) = &n.default {
            let dp = path.child("default");
            let before = errs.len();
            validate::openapi(n, d, &Name::Root, &dp, false, None, errs);
            validate::lists_and_embedded(n, d, &At::Path(&dp), n.embedded, errs);
            let mut pruned = d.clone();
            ops::prune(
                &mut pruned,
                Some(n),
                n.embedded,
                &Name::Root,
                &mut Vec::new(),
            );
            if &pruned != d {
                errs.push(FieldError::invalid(
                    &dp,
                    gofmt::bad_value(d),
                    "must not have unknown fields",
                ));
            }
            if errs.len() == before && has_any_rules(n) {
                errs.extend(cel::Evaluator::run(n, d, None, &dp, n.embedded));
            }
        }
        for (k, p) in &n.properties {
            if is_root && k == "metadata" {
                continue;
            }
            self.validate_defaults(p, &path.child("properties").key(k), false, errs);
        }
        if let Some(ap) = n.additional_schema() {
            self.validate_defaults(ap, &path.child("additionalProperties"), false, errs);
        }
        if let Some(items) = n.items.as_deref() {
            self.validate_defaults(items, &path.child("items"), false, errs);
        }
    }
}

fn check_structural_if_parsed(
    root: &Node,
    path: &FPath,
    parse_errs: &[FieldError],
) -> Vec<FieldError> {
    if parse_errs.is_empty() {
        node::check_structural(root, path)
    } else {
        Vec::new()
    }
}

fn has_any_rules(n: &Node) -> bool {
    !n.rules.is_empty()
        || n.properties.values().any(has_any_rules)
        || n.additional_schema().is_some_and(has_any_rules)
        || n.items.as_deref().is_some_and(has_any_rules)
}

/// True if `v` nests deeper than [`MAX_OBJECT_DEPTH`]. The walk recurses at
/// most `MAX_OBJECT_DEPTH + 1` levels (it stops below that), and allocates
/// nothing: it runs on every object written.
fn too_deep(v: &Value) -> bool {
    fn below(v: &Value, d: usize) -> bool {
        if d > MAX_OBJECT_DEPTH {
            return true;
        }
        match v {
            Value::Array(a) => a.iter().any(|c| below(c, d + 1)),
            Value::Object(m) => m.values().any(|c| below(c, d + 1)),
            _ => false,
        }
    }
    below(v, 0)
}

#[cfg(test)]
mod tests;
