//! Structural pruning (pkg/apiserver/schema/pruning/algorithm.go) and
//! defaulting (pkg/apiserver/schema/defaulting/algorithm.go).

use serde_json::Value;

use crate::error::Name;
use crate::node::{AddProps, Node};

/// ObjectMeta's JSON fields: what survives of `metadata` at a resource root.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Prunes `x` (a resource root when `embedded`), recording removed paths.
pub(crate) fn prune(
    x: &mut Value,
    s: Option<&Node>,
    embedded: bool,
    parent: &Name<'_>,
    out: &mut Vec<String>,
) {
    if let Some(s) = s
        && s.preserve_unknown
    {
        skip_prune(x, s, embedded, parent, out);
        return;
    }
    match x {
        Value::Object(m) => {
            let Some(s) = s else {
                out.extend(m.keys().map(|k| Name::Field(parent, k).to_string()));
                m.clear();
                return;
            };
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                if embedded && embedded_meta(m, &k, parent, out) {
                    continue;
                }
                let Some(v) = m.get_mut(&k) else { continue };
                if let Some(p) = s.properties.get(&k) {
                    prune(v, Some(p), p.embedded, &Name::Field(parent, &k), out);
                } else if let Some(ap) = &s.additional_properties {
                    if let AddProps::Schema(ap) = ap {
                        prune(v, Some(ap), ap.embedded, &Name::Field(parent, &k), out);
                    }
                } else {
                    out.push(Name::Field(parent, &k).to_string());
                    m.remove(&k);
                }
            }
        }
        Value::Array(items) => {
            let is = s.and_then(|s| s.items.as_deref());
            for (i, v) in items.iter_mut().enumerate() {
                prune(
                    v,
                    is,
                    is.is_some_and(|s| s.embedded),
                    &Name::Index(parent, i),
                    out,
                );
            }
        }
        _ => {}
    }
}

/// apiVersion and kind (strings) and metadata (an object, pruned to
/// ObjectMeta) at an embedded-resource level. True if `k` was handled.
fn embedded_meta(
    m: &mut serde_json::Map<String, Value>,
    k: &str,
    parent: &Name<'_>,
    out: &mut Vec<String>,
) -> bool {
    match (k, m.get_mut(k)) {
        ("apiVersion" | "kind", Some(Value::String(_))) => true,
        ("metadata", Some(Value::Object(meta))) => {
            let mp = Name::Field(parent, "metadata");
            let unknown: Vec<String> = meta
                .keys()
                .filter(|f| !OBJECT_META_FIELDS.contains(&f.as_str()))
                .cloned()
                .collect();
            for f in unknown {
                out.push(Name::Field(&mp, &f).to_string());
                meta.remove(&f);
            }
            true
        }
        _ => false,
    }
}

/// Under x-kubernetes-preserve-unknown-fields: unknown fields stay, known
/// ones are pruned by their schemas.
fn skip_prune(x: &mut Value, s: &Node, embedded: bool, parent: &Name<'_>, out: &mut Vec<String>) {
    match x {
        Value::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                if embedded && embedded_meta(m, &k, parent, out) {
                    continue;
                }
                let Some(v) = m.get_mut(&k) else { continue };
                if let Some(p) = s.properties.get(&k) {
                    prune(v, Some(p), p.embedded, &Name::Field(parent, &k), out);
                } else if let Some(ap) = s.additional_schema() {
                    prune(v, Some(ap), ap.embedded, &Name::Field(parent, &k), out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.items.as_deref() {
                for (i, v) in items.iter_mut().enumerate() {
                    skip_prune(v, is, is.embedded, &Name::Index(parent, i), out);
                }
            }
        }
        _ => {}
    }
}

fn non_nullable_null(v: &Value, s: &Node) -> bool {
    v.is_null() && !s.nullable
}

/// Applies defaults: absent fields (and nulls of non-nullable fields) get
/// their default, then each value is defaulted by its own schema.
pub(crate) fn apply_defaults(x: &mut Value, s: &Node) {
    match x {
        Value::Object(m) => {
            for (k, p) in &s.properties {
                let Some(d) = &p.default else { continue };
                match m.get(k) {
                    None => {
                        m.insert(k.clone(), d.clone());
                    }
                    Some(v) if non_nullable_null(v, p) => {
                        m.insert(k.clone(), d.clone());
                    }
                    _ => {}
                }
            }
            for (k, v) in m.iter_mut() {
                if let Some(p) = s.properties.get(k) {
                    apply_defaults(v, p);
                } else if let Some(ap) = s.additional_schema() {
                    if let Some(d) = &ap.default
                        && non_nullable_null(v, ap)
                    {
                        *v = d.clone();
                    }
                    apply_defaults(v, ap);
                }
            }
        }
        Value::Array(items) => {
            let Some(is) = s.items.as_deref() else { return };
            for v in items.iter_mut() {
                if let Some(d) = &is.default
                    && non_nullable_null(v, is)
                {
                    *v = d.clone();
                }
                apply_defaults(v, is);
            }
        }
        _ => {}
    }
}
