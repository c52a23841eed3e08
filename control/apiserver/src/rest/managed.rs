//! Field ownership (`metadata.managedFields`) and server-side apply, on the JSON form of an
//! object, for every kind through the types' schema ([`skiff_api::schema`]).
//!
//! A field set is the set of *members* of an object, spelled as Kubernetes' FieldsV1 paths:
//! `f:<field>` steps through structs and maps, `k:{"name":"web"}` selects an item of a list
//! that merges by key (containers by `name`, ports by `containerPort`, the lists strategic
//! merge patch merges by key), and a member is either a leaf (a scalar, an atomic list, an
//! empty object), an entry of a granular map (labels, annotations) or the map itself, or an
//! item of a keyed list. Structs are never members themselves, as in Kubernetes.
//!
//! - Every REST write that is not an apply (create, update, JSON/merge/strategic patch) gives
//!   its field manager (`?fieldManager=`, else the User-Agent up to its first `/`) the members
//!   it added or changed, under operation `Update`, and takes them from every other manager.
//! - An apply (`application/apply-patch+yaml`) declares the whole intent of its manager: the
//!   fields in it are merged into the live object, fields the manager applied before and
//!   leaves out now are removed when no other manager owns them, and a field whose applied
//!   value differs from the live one while another manager owns it is a conflict (409 with
//!   one cause per field) unless `force=true`, which moves the field to the applier.
//!
//! Kubernetes implements this in structured-merge-diff (Go), which has no Rust counterpart;
//! this is written here on the same schema the strategic merge patch uses.
//!
//! The shape of an object comes from its kind's schema ([`Shape`]): a typed kind's lists
//! merge by their strategic merge key; a custom kind's follow its structural schema:
//! `x-kubernetes-list-type: map` items by all their `x-kubernetes-list-map-keys`
//! (`k:{"port":80,"protocol":"TCP"}`), `set` items by value (`v:"a"`), `atomic` (the default)
//! as a whole; maps with `additionalProperties` entry by entry unless
//! `x-kubernetes-map-type: atomic`; an object's `metadata` as ObjectMeta.
//!
//! Known differences: a typed list merges by one key (Kubernetes' `listMapKeys` can be
//! several, e.g. container ports by port and protocol), typed lists of scalars are atomic
//! (Kubernetes' `listType=set` lists are granular), and writes through the gRPC API (Skiff's
//! own components) do not record managers.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};
use skiff_api::schema::{self, PatchStrategy, Ty};
use skiff_schema::ListShape;

use crate::error::ApiError;

/// A path of FieldsV1 steps (`f:spec`, `k:{"name":"web"}`).
pub(crate) type Path = Vec<String>;

/// A set of members.
pub(crate) type FieldSet = BTreeSet<Path>;

pub(crate) const APPLY: &str = "Apply";
pub(crate) const UPDATE: &str = "Update";

/// The longest field manager name Kubernetes accepts.
const MAX_MANAGER_LEN: usize = 128;

/// Metadata fields the server owns; never part of a field set.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "generateName",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: String,
    pub fields: FieldSet,
}

impl Entry {
    fn is(&self, manager: &str, operation: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource.is_empty()
    }
}

/// The field manager of a request: `fieldManager`, else the User-Agent's product (before
/// the first `/`), as kube-apiserver defaults it. Checked as Kubernetes checks it.
pub(crate) fn manager_of(
    field_manager: Option<&str>,
    user_agent: &str,
) -> Result<String, ApiError> {
    let name = match field_manager {
        Some(m) => m.to_string(),
        None => user_agent.split('/').next().unwrap_or("").to_string(),
    };
    if name.chars().count() > MAX_MANAGER_LEN {
        return Err(ApiError::BadRequest(format!(
            "fieldManager: Too long: may not be longer than {MAX_MANAGER_LEN}"
        )));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(ApiError::BadRequest(
            "fieldManager: Invalid value: must only contain printable characters".into(),
        ));
    }
    Ok(name)
}

// ---- field sets ----------------------------------------------------------------------------

/// What the schema says of a value, as field management needs it: a typed kind's message
/// (Skiff's schema, [`skiff_api::schema`]) or a node of a custom kind's structural schema
/// (with whether it is an object's root, whose `metadata` is an ObjectMeta); `Unknown` where
/// neither says (objects are then structs, lists atomic).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shape<'a> {
    Message(&'static str),
    Custom(skiff_schema::SchemaNode<'a>, bool),
    Unknown,
}

impl<'a> Shape<'a> {
    /// The shape of a custom kind's objects, by its schema.
    pub(crate) fn custom(schema: &'a skiff_schema::Schema) -> Self {
        Shape::Custom(schema.root(), true)
    }
}

impl From<&'static str> for Shape<'static> {
    fn from(message: &'static str) -> Self {
        Shape::Message(message)
    }
}

/// How a field's value divides into members.
#[derive(Debug, Clone, Copy)]
enum Members<'a> {
    /// A struct (its fields), or a leaf.
    Value,
    /// A granular map: the map itself, and each entry.
    Map,
    /// A list merged item by item, each item identified by the key fields.
    Keyed(Keys<'a>),
    /// A list of distinct values, each a member (`v:` steps): `x-kubernetes-list-type: set`.
    Set,
    /// A list (or an atomic object) replaced as a whole.
    Atomic,
}

/// The key fields of a keyed list: the strategic merge key of a typed list, or a custom
/// list's `x-kubernetes-list-map-keys`.
#[derive(Debug, Clone, Copy)]
enum Keys<'a> {
    One(&'static str),
    Many(&'a [String]),
}

impl Keys<'_> {
    fn iter(&self) -> impl Iterator<Item = &str> {
        let (one, many) = match self {
            Keys::One(k) => (Some(*k), None),
            Keys::Many(ks) => (None, Some(ks.iter().map(String::as_str))),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

impl<'a> Shape<'a> {
    /// The field `name` of this struct: how its value divides into members, and the shape of
    /// what is inside it (a struct's fields, a map's values, a list's items).
    fn field(self, name: &str) -> (Members<'a>, Shape<'a>) {
        match self {
            Shape::Message(message) => {
                let Some(f) = schema::message(message).and_then(|m| m.field(name)) else {
                    return (Members::Value, Shape::Unknown);
                };
                let sub = match f.ty {
                    Ty::Message(n) => Shape::Message(n),
                    _ => Shape::Unknown,
                };
                let members = if f.map {
                    Members::Map
                } else if f.list {
                    match schema::patch_strategy(message, name) {
                        Some(PatchStrategy::MergeByKey(k)) => Members::Keyed(Keys::One(k)),
                        _ => Members::Atomic,
                    }
                } else {
                    Members::Value
                };
                (members, sub)
            }
            Shape::Custom(_, true) if name == "metadata" => {
                (Members::Value, Shape::Message("ObjectMeta"))
            }
            Shape::Custom(node, _) => {
                let Some(f) = node.field(name) else {
                    return (Members::Value, Shape::Unknown);
                };
                let custom =
                    |n: skiff_schema::SchemaNode<'a>| Shape::Custom(n, n.is_embedded_resource());
                let items = || f.items().map_or(Shape::Unknown, custom);
                match f.list_shape() {
                    Some(ListShape::Map(keys)) if !keys.is_empty() => {
                        (Members::Keyed(Keys::Many(keys)), items())
                    }
                    Some(ListShape::Set) => (Members::Set, items()),
                    Some(_) => (Members::Atomic, items()),
                    None if f.is_granular_map() => {
                        (Members::Map, f.values().map_or(Shape::Unknown, custom))
                    }
                    None if f.is_atomic_object() => (Members::Atomic, Shape::Unknown),
                    None => (Members::Value, custom(f)),
                }
            }
            Shape::Unknown => (Members::Value, Shape::Unknown),
        }
    }
}

/// The `k:` step of a keyed list's item (`k:{"port":80,"protocol":"TCP"}`, keys in name
/// order as Kubernetes writes them), or `None` when the item lacks a key.
fn key_step(keys: Keys<'_>, item: &Value) -> Option<String> {
    let mut key = Map::new();
    for k in keys.iter() {
        let v = item.get(k).filter(|v| !v.is_null())?;
        key.insert(k.to_string(), v.clone());
    }
    Some(format!("k:{}", Value::Object(key)))
}

/// The `v:` step of a set's item (`v:"a"`).
fn value_step(item: &Value) -> String {
    format!("v:{item}")
}

/// The object without what the server owns (type meta, status, server metadata) and without
/// nulls: the part field managers own.
pub(crate) fn owned_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Value::Object(m) = &mut v {
        m.remove("apiVersion");
        m.remove("kind");
        m.remove("status");
        if let Some(Value::Object(meta)) = m.get_mut("metadata") {
            for k in SERVER_METADATA {
                meta.remove(*k);
            }
        }
    }
    drop_nulls(&mut v);
    v
}

fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// The members of `obj` (already [`owned_part`]) of message `kind`.
/// The field set of [`owned_part`] of `obj`, read from `obj` in place (a create's object is
/// not copied to leave out what nobody owns; nulls count as absent, as there).
fn owned_field_set(shape: Shape<'_>, obj: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    if let Value::Object(map) = obj {
        let skip =
            |k: &str, v: &Value| v.is_null() || matches!(k, "apiVersion" | "kind" | "status");
        let mut path = Vec::new();
        for (k, child) in map.iter().filter(|(k, v)| !skip(k, v)) {
            match child {
                Value::Object(meta) if k == "metadata" => {
                    let kept: Map<String, Value> = meta
                        .iter()
                        .filter(|(f, _)| !SERVER_METADATA.contains(&f.as_str()))
                        .map(|(f, v)| (f.clone(), v.clone()))
                        .collect();
                    let one = std::iter::once((k.clone(), Value::Object(kept))).collect();
                    collect_struct(shape, &one, &mut path, &mut out);
                }
                _ => {
                    // One member at a time, so that nothing is copied.
                    collect_member(shape, k, child, &mut path, &mut out);
                }
            }
        }
    }
    out
}

pub(crate) fn field_set(shape: Shape<'_>, obj: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    if let Value::Object(map) = obj {
        collect_struct(shape, map, &mut Vec::new(), &mut out);
    }
    out
}

/// A path step, `f:name` (not `format!`: this runs for every field of every write).
fn step(prefix: &str, name: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + name.len());
    s.push_str(prefix);
    s.push_str(name);
    s
}

fn collect_struct(shape: Shape<'_>, map: &Map<String, Value>, path: &mut Path, out: &mut FieldSet) {
    for (k, child) in map {
        collect_member(shape, k, child, path, out);
    }
}

/// One member of a struct; a null member is absent.
fn collect_member(shape: Shape<'_>, k: &str, child: &Value, path: &mut Path, out: &mut FieldSet) {
    if child.is_null() {
        return;
    }
    let (members, sub) = shape.field(k);
    path.push(step("f:", k));
    match (members, child) {
        (Members::Map, Value::Object(entries)) => {
            out.insert(path.clone());
            for (ek, ev) in entries.iter().filter(|(_, v)| !v.is_null()) {
                path.push(step("f:", ek));
                collect_value(sub, ev, path, out);
                path.pop();
            }
        }
        (Members::Keyed(keys), Value::Array(items))
            if items.iter().all(|i| key_step(keys, i).is_some()) =>
        {
            for item in items {
                let Some(step) = key_step(keys, item) else {
                    continue;
                };
                path.push(step);
                out.insert(path.clone());
                if let Value::Object(m) = item {
                    collect_struct(sub, m, path, out);
                }
                path.pop();
            }
        }
        (Members::Set, Value::Array(items)) => {
            for item in items {
                path.push(value_step(item));
                out.insert(path.clone());
                path.pop();
            }
        }
        (Members::Value, _) => collect_value(sub, child, path, out),
        _ => {
            out.insert(path.clone());
        }
    }
    path.pop();
}

fn collect_value(shape: Shape<'_>, v: &Value, path: &mut Path, out: &mut FieldSet) {
    match v {
        // An object of nulls only is empty once they are dropped.
        Value::Object(m) if m.values().any(|x| !x.is_null()) => collect_struct(shape, m, path, out),
        _ => {
            out.insert(path.clone());
        }
    }
}

// ---- navigating paths ------------------------------------------------------------------------

/// The item of `items` a `k:` step selects.
fn find_item(items: &[Value], step: &str) -> Option<usize> {
    if let Some(v) = step.strip_prefix("v:") {
        let value: Value = serde_json::from_str(v).ok()?;
        return items.iter().position(|item| *item == value);
    }
    let key: Map<String, Value> = serde_json::from_str(step.strip_prefix("k:")?).ok()?;
    items
        .iter()
        .position(|item| key.iter().all(|(k, v)| item.get(k) == Some(v)))
}

/// The value at `path`, if there is one.
pub(crate) fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for step in path {
        cur = if let Some(f) = step.strip_prefix("f:") {
            cur.as_object()?.get(f)?
        } else {
            let items = cur.as_array()?;
            &items[find_item(items, step)?]
        };
    }
    Some(cur)
}

/// Removes what `path` names from `obj` (nothing when it is not there).
fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for step in parent {
        let next = if let Some(f) = step.strip_prefix("f:") {
            cur.as_object_mut().and_then(|m| m.get_mut(f))
        } else {
            match cur.as_array_mut() {
                Some(items) => match find_item(items, step) {
                    Some(i) => items.get_mut(i),
                    None => None,
                },
                None => None,
            }
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(items) = cur.as_array_mut()
        && let Some(i) = find_item(items, last)
    {
        items.remove(i);
    }
}

/// Whether `set` has `path` or anything under it.
fn owns_under(set: &FieldSet, path: &[String]) -> bool {
    set.range(path.to_vec()..)
        .next()
        .is_some_and(|p| p.starts_with(path))
}

/// Whether `path` has members under it in `set` (it is not a leaf there).
fn has_children(set: &FieldSet, path: &Path) -> bool {
    set.range(path.clone()..)
        .nth(1)
        .is_some_and(|p| p.starts_with(path))
}

/// `.spec.template.spec.containers[name="web"].image`, as Kubernetes prints a field path.
pub(crate) fn display(path: &[String]) -> String {
    let mut s = String::new();
    for step in path {
        if let Some(f) = step.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = step.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = step.strip_prefix("v:") {
            // A set's item, as Kubernetes shows it: `[="a"]`.
            s.push_str(&format!("[={v}]"));
        } else {
            s.push_str(step);
        }
    }
    s
}

// ---- FieldsV1 ------------------------------------------------------------------------------

/// A set as FieldsV1 JSON: `{"f:spec":{"f:replicas":{}}}`, with `"."` marking a member that
/// also has members under it.
pub(crate) fn to_fields_v1(set: &FieldSet) -> Value {
    // The set is sorted, so the paths under one step are consecutive and a member comes
    // before the members under it: the JSON is written in one pass over the paths.
    fn write(paths: &[&Path], depth: usize) -> Value {
        let (member, rest) = match paths.split_first() {
            Some((p, rest)) if p.len() == depth => (true, rest),
            _ => (false, paths),
        };
        let mut m = Map::new();
        if member && !rest.is_empty() {
            m.insert(".".into(), json!({}));
        }
        let mut i = 0;
        while i < rest.len() {
            let step = &rest[i][depth];
            let n = rest[i..]
                .iter()
                .take_while(|p| p.get(depth) == Some(step))
                .count();
            m.insert(step.clone(), write(&rest[i..i + n], depth + 1));
            i += n;
        }
        Value::Object(m)
    }
    let paths: Vec<&Path> = set.iter().collect();
    write(&paths, 0)
}

/// The set a FieldsV1 value describes (what cannot be read is left out).
pub(crate) fn from_fields_v1(v: &Value) -> FieldSet {
    fn read(v: &Value, path: &mut Path, out: &mut FieldSet) {
        let Some(m) = v.as_object() else { return };
        if m.is_empty() && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, child) in m {
            if k == "." {
                out.insert(path.clone());
                continue;
            }
            path.push(k.clone());
            read(child, path, out);
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    read(v, &mut Vec::new(), &mut out);
    out
}

/// The entries of `obj.metadata.managedFields`.
pub(crate) fn entries_of(obj: &Value) -> Vec<Entry> {
    let Some(items) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let s = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    items
        .iter()
        .map(|e| Entry {
            manager: s(e, "manager"),
            operation: s(e, "operation"),
            api_version: s(e, "apiVersion"),
            time: s(e, "time"),
            subresource: s(e, "subresource"),
            fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
        })
        .collect()
}

/// Writes `entries` (those that still own something) as `obj.metadata.managedFields`.
pub(crate) fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = e.subresource.clone().into();
            }
            v
        })
        .collect();
    let Some(o) = obj.as_object_mut() else {
        return;
    };
    let meta = o.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    if let Some(m) = meta.as_object_mut() {
        m.insert("managedFields".into(), Value::Array(list));
    }
}

// ---- Update ----------------------------------------------------------------------------------

/// Who writes, as what, when.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub time: &'a str,
}

/// Records a non-apply write of `new` over `old` (`None` for a create) by `writer` in
/// `new.metadata.managedFields`: the writer's `Update` entry gains the members it added or
/// changed, every other entry loses them, and members that are gone leave every entry. The
/// entries start from those `new` carries (a client may send them back), else `old`'s.
pub(crate) fn record_update<'s>(
    shape: impl Into<Shape<'s>>,
    old: Option<&Value>,
    new: &mut Value,
    writer: Writer<'_>,
) {
    let shape = shape.into();
    let sent = entries_of(new);
    let mut entries = if sent.is_empty() {
        old.map(entries_of).unwrap_or_default()
    } else {
        sent
    };
    let (changed, gone): (FieldSet, FieldSet) = match old {
        // A create: every field is this writer's, read from the object in place.
        None => (owned_field_set(shape, new), FieldSet::new()),
        Some(o) => {
            let (new_part, old_part) = (owned_part(new), owned_part(o));
            let (new_set, old_set) = (field_set(shape, &new_part), field_set(shape, &old_part));
            let changed = new_set
                .iter()
                .filter(|p| {
                    !old_set.contains(*p)
                        || (!has_children(&new_set, p)
                            && value_at(&new_part, p) != value_at(&old_part, p))
                })
                .cloned()
                .collect();
            (changed, old_set.difference(&new_set).cloned().collect())
        }
    };
    if changed.is_empty() && gone.is_empty() {
        write_entries(new, &entries);
        return;
    }
    for e in &mut entries {
        e.fields.retain(|p| !gone.contains(p));
        if !e.is(writer.manager, UPDATE) {
            e.fields.retain(|p| !changed.contains(p));
        }
    }
    match entries.iter_mut().find(|e| e.is(writer.manager, UPDATE)) {
        Some(e) => {
            e.fields.extend(changed);
            e.time = writer.time.to_string();
            e.api_version = writer.api_version.to_string();
        }
        None => entries.push(Entry {
            manager: writer.manager.to_string(),
            operation: UPDATE.into(),
            api_version: writer.api_version.to_string(),
            time: writer.time.to_string(),
            subresource: String::new(),
            fields: changed,
        }),
    }
    write_entries(new, &entries);
}

// ---- Apply -----------------------------------------------------------------------------------

/// Merges `applied` into `live`: structs and maps field by field, keyed lists item by item
/// (new items appended), sets by value (new values appended), everything else replaced.
fn merge(shape: Shape<'_>, live: &mut Value, applied: &Value) {
    let (Value::Object(l), Value::Object(a)) = (&mut *live, applied) else {
        *live = applied.clone();
        return;
    };
    for (k, av) in a {
        let (members, sub) = shape.field(k);
        let Some(lv) = l.get_mut(k) else {
            l.insert(k.clone(), av.clone());
            continue;
        };
        match (members, &mut *lv, av) {
            (Members::Keyed(keys), Value::Array(li), Value::Array(ai))
                if ai
                    .iter()
                    .chain(li.iter())
                    .all(|i| key_step(keys, i).is_some()) =>
            {
                for item in ai {
                    let step = key_step(keys, item).unwrap_or_default();
                    match find_item(li, &step) {
                        Some(i) => merge(sub, &mut li[i], item),
                        None => li.push(item.clone()),
                    }
                }
            }
            (Members::Set, Value::Array(li), Value::Array(ai)) => {
                for item in ai {
                    if !li.contains(item) {
                        li.push(item.clone());
                    }
                }
            }
            (Members::Value | Members::Map, Value::Object(_), Value::Object(_)) => {
                merge(sub, lv, av)
            }
            _ => *lv = av.clone(),
        }
    }
}

/// One field another manager owns with a different value than the apply's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub manager: String,
    pub api_version: String,
    pub path: Path,
}

/// Kubernetes' apply conflict error: `Apply failed with 1 conflict: conflict with "m" using
/// apps/v1: .spec.replicas`, one cause per field.
pub(crate) fn conflict_error(conflicts: &[Conflict]) -> ApiError {
    let mut by_manager: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
    for c in conflicts {
        by_manager
            .entry((&c.manager, &c.api_version))
            .or_default()
            .push(display(&c.path));
    }
    let n = conflicts.len();
    let mut message = format!(
        "Apply failed with {n} conflict{}: ",
        if n == 1 { "" } else { "s" }
    );
    let parts: Vec<String> = by_manager
        .iter()
        .map(|((m, v), fields)| match fields.as_slice() {
            [one] => format!("conflict with {m:?} using {v}: {one}"),
            many => format!("conflicts with {m:?} using {v}:\n- {}", many.join("\n- ")),
        })
        .collect();
    message.push_str(&parts.join("\n"));
    let causes = conflicts
        .iter()
        .map(|c| {
            (
                display(&c.path),
                format!("conflict with {:?} using {}", c.manager, c.api_version),
            )
        })
        .collect();
    ApiError::ApplyConflict { message, causes }
}

/// Server-side apply of `applied` (the manager's whole intent) onto `live` (`None`: the
/// object does not exist, the apply creates it). Returns the object to write, with its
/// managedFields.
pub(crate) fn apply<'s>(
    shape: impl Into<Shape<'s>>,
    live: Option<&Value>,
    applied: &Value,
    writer: Writer<'_>,
    force: bool,
) -> Result<Value, ApiError> {
    if !applied.is_object() {
        return Err(ApiError::BadRequest(
            "the applied configuration must be an object".into(),
        ));
    }
    let shape = shape.into();
    let intent = owned_part(applied);
    let new_set = field_set(shape, &intent);
    let mine = |e: &Entry| e.is(writer.manager, APPLY);
    let Some(live) = live else {
        let mut obj = applied.clone();
        drop_nulls(&mut obj);
        write_entries(
            &mut obj,
            &[Entry {
                manager: writer.manager.to_string(),
                operation: APPLY.into(),
                api_version: writer.api_version.to_string(),
                time: writer.time.to_string(),
                subresource: String::new(),
                fields: new_set,
            }],
        );
        return Ok(obj);
    };
    let mut entries = entries_of(live);
    let live_part = owned_part(live);
    let mut conflicts = Vec::new();
    for p in new_set.iter().filter(|p| !has_children(&new_set, p)) {
        if value_at(&intent, p) == value_at(&live_part, p) {
            continue;
        }
        for e in entries.iter().filter(|e| !mine(e) && e.fields.contains(p)) {
            conflicts.push(Conflict {
                manager: e.manager.clone(),
                api_version: e.api_version.clone(),
                path: p.clone(),
            });
        }
    }
    if !conflicts.is_empty() {
        if !force {
            return Err(conflict_error(&conflicts));
        }
        for e in entries.iter_mut().filter(|e| !mine(e)) {
            e.fields.retain(|p| {
                !conflicts
                    .iter()
                    .any(|c| &c.path == p && c.manager == e.manager)
            });
        }
    }
    let mut result = live.clone();
    let before: FieldSet = entries
        .iter()
        .find(|e| mine(e))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    // What nobody owns any more goes; an item that goes takes its fields with it (they are
    // not removed one by one first: without its key fields the item could not be found).
    let removed: Vec<&Path> = before
        .difference(&new_set)
        .filter(|gone| {
            let others_own = entries
                .iter()
                .filter(|e| !mine(e))
                .any(|e| owns_under(&e.fields, gone));
            !others_own && !owns_under(&new_set, gone)
        })
        .collect();
    // Deepest first, so a list's later items are found by their steps after earlier go.
    for (i, gone) in removed.iter().enumerate().rev() {
        let under_removed = removed[..i].iter().any(|p| gone.starts_with(p));
        if !under_removed {
            remove_at(&mut result, gone);
        }
    }
    merge(shape, &mut result, &intent);
    entries.retain(|e| !mine(e));
    entries.push(Entry {
        manager: writer.manager.to_string(),
        operation: APPLY.into(),
        api_version: writer.api_version.to_string(),
        time: writer.time.to_string(),
        subresource: String::new(),
        fields: new_set,
    });
    write_entries(&mut result, &entries);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Writer<'static> = Writer {
        manager: "kubectl",
        api_version: "apps/v1",
        time: "2026-11-25T00:00:00Z",
    };

    fn writer(manager: &'static str) -> Writer<'static> {
        Writer { manager, ..T }
    }

    fn deployment(replicas: i64, image: &str) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": image}]},
                },
            },
        })
    }

    fn path(s: &[&str]) -> Path {
        s.iter().map(|x| x.to_string()).collect()
    }

    /// A create's field set, read in place, is the one of the owned part's copy: nulls
    /// absent (an object of nulls an empty leaf), server metadata, type meta and status
    /// nobody's.
    #[test]
    fn a_creates_field_set_is_the_owned_parts() {
        let mut with_nulls = deployment(2, "nginx");
        with_nulls["status"] = json!({"replicas": 2});
        with_nulls["metadata"]["uid"] = json!("u");
        with_nulls["metadata"]["annotations"] = json!({"a": null, "b": "x"});
        with_nulls["metadata"]["finalizers"] = json!(null);
        with_nulls["spec"]["paused"] = json!(null);
        with_nulls["spec"]["strategy"] = json!({"rollingUpdate": null, "type": null});
        with_nulls["spec"]["template"]["spec"]["containers"][0]["ports"] =
            json!([{"containerPort": 80, "name": null}, {"containerPort": 81}]);
        with_nulls["spec"]["template"]["spec"]["nodeSelector"] = json!({"zone": null});
        let bare = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "creationTimestamp": null}, "data": {"k": "v"}});
        let custom = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "labels": {"l": "v"}},
            "spec": {"a": [1, null, {"b": null}], "c": {"d": null}, "e": null}});
        for (kind, obj) in [
            ("Deployment", deployment(3, "web")),
            ("Deployment", with_nulls),
            ("ConfigMap", bare),
            ("Widget", custom),
        ] {
            assert_eq!(
                owned_field_set(kind.into(), &obj),
                field_set(kind.into(), &owned_part(&obj)),
                "{obj}"
            );
        }
    }

    #[test]
    fn field_sets_follow_the_schema() {
        let set = field_set("Deployment".into(), &owned_part(&deployment(2, "nginx")));
        let containers = path(&["f:spec", "f:template", "f:spec", "f:containers"]);
        let item = [containers.clone(), path(&[r#"k:{"name":"web"}"#])].concat();
        assert!(set.contains(&item), "{set:?}");
        assert!(set.contains(&[item.clone(), path(&["f:image"])].concat()));
        assert!(set.contains(&path(&["f:spec", "f:replicas"])));
        // A map is a member with its entries; structs are not members.
        assert!(set.contains(&path(&["f:metadata", "f:labels"])));
        assert!(set.contains(&path(&["f:metadata", "f:labels", "f:app"])));
        assert!(!set.contains(&path(&["f:spec"])));
        assert!(!set.contains(&containers));
        // Server metadata is nobody's.
        assert!(
            !set.iter()
                .any(|p| p.contains(&"f:name".to_string()) && p.len() == 2)
        );
    }

    #[test]
    fn fields_v1_round_trips_in_kubernetes_form() {
        let set = field_set("Deployment".into(), &owned_part(&deployment(2, "nginx")));
        let v1 = to_fields_v1(&set);
        assert_eq!(v1["f:spec"]["f:replicas"], json!({}));
        let item = &v1["f:spec"]["f:template"]["f:spec"]["f:containers"][r#"k:{"name":"web"}"#];
        assert_eq!(item["."], json!({}));
        assert_eq!(item["f:image"], json!({}));
        assert_eq!(v1["f:metadata"]["f:labels"]["."], json!({}));
        assert_eq!(from_fields_v1(&v1), set);
    }

    #[test]
    fn updates_move_changed_fields_to_their_writer() {
        let mut created = deployment(2, "nginx");
        record_update("Deployment", None, &mut created, writer("creator"));
        let mut scaled = created.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update("Deployment", Some(&created), &mut scaled, writer("scaler"));
        let entries = entries_of(&scaled);
        let scaler = entries.iter().find(|e| e.manager == "scaler").unwrap();
        let replicas = path(&["f:spec", "f:replicas"]);
        assert_eq!(scaler.fields, [replicas.clone()].into_iter().collect());
        assert_eq!(scaler.operation, UPDATE);
        let creator = entries.iter().find(|e| e.manager == "creator").unwrap();
        assert!(!creator.fields.contains(&replicas));
        assert!(creator.fields.len() > 3);
        // A write that changes nothing leaves the entries alone.
        let mut same = scaled.clone();
        record_update("Deployment", Some(&scaled), &mut same, writer("third"));
        assert!(!entries_of(&same).iter().any(|e| e.manager == "third"));
    }

    #[test]
    fn apply_creates_then_owns_and_conflicts() {
        let created = apply("Deployment", None, &deployment(2, "nginx"), T, false).unwrap();
        let e = entries_of(&created);
        assert_eq!((e.len(), e[0].operation.as_str()), (1, APPLY));
        // Another manager scales with an update...
        let mut scaled = created.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update("Deployment", Some(&created), &mut scaled, writer("hpa"));
        // ...so applying replicas 3 conflicts with it; the same value 5 does not.
        let err = apply(
            "Deployment",
            Some(&scaled),
            &deployment(3, "nginx"),
            T,
            false,
        )
        .unwrap_err();
        let ApiError::ApplyConflict { message, causes } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(
            message,
            "Apply failed with 1 conflict: conflict with \"hpa\" using apps/v1: .spec.replicas"
        );
        assert_eq!(causes[0].0, ".spec.replicas");
        assert_eq!(err.http(), (409, "Conflict"));
        assert!(
            apply(
                "Deployment",
                Some(&scaled),
                &deployment(5, "nginx"),
                T,
                false
            )
            .is_ok()
        );
        // Forced, the field moves to the applier.
        let forced = apply(
            "Deployment",
            Some(&scaled),
            &deployment(3, "nginx"),
            T,
            true,
        )
        .unwrap();
        assert_eq!(forced["spec"]["replicas"], 3);
        let entries = entries_of(&forced);
        assert!(!entries.iter().any(|e| e.manager == "hpa"), "{entries:?}");
    }

    #[test]
    fn apply_removes_what_its_manager_dropped_and_keeps_others() {
        let mut first = deployment(2, "nginx");
        first["metadata"]["labels"]["tier"] = json!("front");
        first["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "sidecar", "image": "envoy"}));
        let live = apply("Deployment", None, &first, T, false).unwrap();
        // Someone else adds an annotation.
        let mut annotated = live.clone();
        annotated["metadata"]["annotations"] = json!({"note": "keep"});
        record_update("Deployment", Some(&live), &mut annotated, writer("other"));
        // The applier drops the label and the sidecar.
        let second = deployment(2, "nginx:2");
        let out = apply("Deployment", Some(&annotated), &second, T, false).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"app": "web"}));
        let containers = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(containers.len(), 1, "{containers:?}");
        assert_eq!(containers[0]["image"], "nginx:2");
        assert_eq!(out["metadata"]["annotations"]["note"], "keep");
    }

    #[test]
    fn a_dropped_item_goes_whole_and_others_items_stay() {
        let mut first = deployment(2, "nginx");
        let containers = |d: &mut Value| {
            d["spec"]["template"]["spec"]["containers"]
                .as_array_mut()
                .unwrap()
                .clone()
        };
        first["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "sidecar", "image": "envoy"}));
        let live = apply("Deployment", None, &first, T, false).unwrap();
        // Another writer adds a container of its own.
        let mut added = live.clone();
        added["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "debug", "image": "busybox"}));
        record_update("Deployment", Some(&live), &mut added, writer("other"));
        // The applier drops its sidecar: it goes, whole; the other writer's stays.
        let mut out = apply(
            "Deployment",
            Some(&added),
            &deployment(2, "nginx"),
            T,
            false,
        )
        .unwrap();
        let names: Vec<Value> = containers(&mut out)
            .iter()
            .map(|c| c["name"].clone())
            .collect();
        assert_eq!(names, [json!("web"), json!("debug")]);
    }

    #[test]
    fn conflict_messages_group_by_manager() {
        let c = |m: &str, p: &[&str]| Conflict {
            manager: m.into(),
            api_version: "apps/v1".into(),
            path: path(p),
        };
        let err = conflict_error(&[
            c("a", &["f:spec", "f:replicas"]),
            c("a", &["f:spec", "f:paused"]),
            c(
                "b",
                &[
                    "f:spec",
                    "f:template",
                    "f:spec",
                    "f:containers",
                    r#"k:{"name":"web"}"#,
                    "f:image",
                ],
            ),
        ]);
        assert_eq!(
            err.to_string(),
            "Apply failed with 3 conflicts: conflicts with \"a\" using apps/v1:\n- .spec.replicas\n\
             - .spec.paused\nconflict with \"b\" using apps/v1: \
             .spec.template.spec.containers[name=\"web\"].image"
        );
    }

    #[test]
    fn managers_default_to_the_user_agent_and_are_checked() {
        assert_eq!(
            manager_of(None, "kubectl/v1.32.0 (linux/amd64)").unwrap(),
            "kubectl"
        );
        assert_eq!(manager_of(Some("flux"), "x").unwrap(), "flux");
        assert!(manager_of(Some(&"m".repeat(129)), "").is_err());
        assert!(manager_of(Some("a\u{7}"), "").is_err());
    }

    /// A custom kind's schema: ports a map list keyed by port and protocol, tags a set,
    /// selector a granular map, limits an atomic map.
    fn widget_schema() -> skiff_schema::Schema {
        let raw = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "ports": {"type": "array", "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["port", "protocol"],
                "items": {"type": "object", "required": ["port", "protocol"], "properties": {
                    "port": {"type": "integer"}, "protocol": {"type": "string"},
                    "name": {"type": "string"}}}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set",
                "items": {"type": "string"}},
            "plain": {"type": "array", "items": {"type": "string"}},
            "selector": {"type": "object", "additionalProperties": {"type": "string"}},
            "limits": {"type": "object", "x-kubernetes-map-type": "atomic",
                "additionalProperties": {"type": "string"}}}}}});
        skiff_schema::Schema::new(&raw, "openAPIV3Schema").unwrap()
    }

    fn widget(spec: Value) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "labels": {"app": "w"}}, "spec": spec})
    }

    #[test]
    fn custom_field_sets_follow_the_schemas_list_and_map_types() {
        let schema = widget_schema();
        let obj = widget(json!({
            "ports": [{"port": 80, "protocol": "TCP", "name": "http"}],
            "tags": ["a", "b"], "plain": ["x"],
            "selector": {"k": "v"}, "limits": {"cpu": "1"}}));
        let set = field_set(Shape::custom(&schema), &owned_part(&obj));
        let shown: BTreeSet<String> = set.iter().map(|p| display(p)).collect();
        for want in [
            r#".spec.ports[port=80,protocol="TCP"]"#,
            r#".spec.ports[port=80,protocol="TCP"].name"#,
            r#".spec.tags[="a"]"#,
            ".spec.plain",
            ".spec.selector",
            ".spec.selector.k",
            ".spec.limits",
            ".metadata.labels",
            ".metadata.labels.app",
        ] {
            assert!(shown.contains(want), "{want} missing from {shown:#?}");
        }
        assert!(
            !shown.contains(".spec.limits.cpu"),
            "an atomic map is one member"
        );
        let fields = to_fields_v1(&set);
        assert!(
            fields["f:spec"]["f:ports"]
                .get(r#"k:{"port":80,"protocol":"TCP"}"#)
                .is_some(),
            "{fields}"
        );
        assert!(
            fields["f:spec"]["f:tags"].get(r#"v:"a""#).is_some(),
            "{fields}"
        );
        // The typed form is what a create records in place, too.
        assert_eq!(owned_field_set(Shape::custom(&schema), &obj), set);
    }

    #[test]
    fn custom_map_lists_and_sets_merge_between_managers() {
        let schema = widget_schema();
        let shape = || Shape::custom(&schema);
        let a = |spec| widget(spec);
        let live = apply(
            shape(),
            None,
            &a(
                json!({"ports": [{"port": 80, "protocol": "TCP"}], "tags": ["a"],
                "plain": ["x"]}),
            ),
            writer("one"),
            false,
        )
        .unwrap();
        // Another manager adds its own port, tag and list: items merge; the atomic list
        // conflicts (another manager owns it with another value).
        let two = a(json!({"ports": [{"port": 80, "protocol": "UDP"}], "tags": ["b"]}));
        let live = apply(shape(), Some(&live), &two, writer("two"), false).unwrap();
        assert_eq!(
            live["spec"]["ports"],
            json!([{"port": 80, "protocol": "TCP"}, {"port": 80, "protocol": "UDP"}])
        );
        assert_eq!(live["spec"]["tags"], json!(["a", "b"]));
        let refused = apply(
            shape(),
            Some(&live),
            &a(json!({"plain": ["y"]})),
            writer("two"),
            false,
        );
        assert!(
            matches!(refused, Err(ApiError::ApplyConflict { .. })),
            "{refused:?}"
        );
        // The first manager drops its port and tag: only its own items go.
        let live = apply(
            shape(),
            Some(&live),
            &a(json!({"plain": ["x"]})),
            writer("one"),
            false,
        )
        .unwrap();
        assert_eq!(
            live["spec"]["ports"],
            json!([{"port": 80, "protocol": "UDP"}])
        );
        assert_eq!(live["spec"]["tags"], json!(["b"]));
    }
}
