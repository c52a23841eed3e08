//! Value validation of an object against its schema, with kube-openapi's
//! semantics and messages (k8s.io/kube-openapi/pkg/validation/validate and
//! .../errors/schema.go), converted into field errors as
//! `kubeOpenAPIResultToFieldErrors` does in
//! staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/validation/validation.go;
//! list-type uniqueness (pkg/apiserver/schema/listtype/validation.go) and
//! embedded resources (pkg/apiserver/schema/objectmeta/validation.go).

use serde_json::{Map, Number, Value};

use crate::error::{At, FPath, FieldError, Name};
use crate::formats;
use crate::gofmt::{self, quote};
use crate::node::{AddProps, Node};

/// kube-openapi validation of `data` (named `name`, kube-openapi style:
/// `spec.items[0].name`, `.key` at the root) against `n`. `base` is the
/// field path the names are relative to (`kubeOpenAPIResultToFieldErrors`'s
/// fldPath). `root` is true at a custom resource's root: apiVersion, kind
/// and metadata are then skipped except metadata.name/generateName, read from
/// `root_meta` when the root object is given without its metadata.
pub(crate) fn openapi(
    n: &Node,
    data: &Value,
    name: &Name<'_>,
    base: &FPath,
    root: bool,
    root_meta: Option<&Value>,
    out: &mut Vec<FieldError>,
) {
    let v = V { base, root_meta };
    v.value(n, data, name, root, out);
}

struct V<'a> {
    base: &'a FPath,
    /// The root's metadata when the root object does not hold it.
    root_meta: Option<&'a Value>,
}

impl V<'_> {
    fn path(&self, name: &Name<'_>) -> FPath {
        let name = name.to_string();
        if name.is_empty() || name == "." {
            self.base.clone()
        } else {
            self.base.child(name.strip_prefix('.').unwrap_or(&name))
        }
    }

    /// A composite (anyOf, allOf, ...) error: not a `*Validation`, so it is
    /// reported at the base path with an empty value.
    fn composite(&self, msg: String) -> FieldError {
        FieldError::invalid(self.base, quote(""), msg)
    }

    fn value(
        &self,
        n: &Node,
        data: &Value,
        name: &Name<'_>,
        root: bool,
        out: &mut Vec<FieldError>,
    ) {
        if data.is_null() {
            self.type_check(n, data, name, out);
            if !n.nullable {
                self.enum_check(n, data, name, out);
            }
            return;
        }
        self.type_check(n, data, name, out);
        self.schema_props(n, data, name, out);
        if let Value::String(s) = data {
            self.string(n, s, name, out);
            self.format(n, s, name, out);
        }
        if let Value::Number(num) = data {
            self.number(n, num, name, out);
        }
        if let Value::Array(items) = data {
            self.slice(n, items, name, out);
        }
        self.enum_check(n, data, name, out);
        if let Value::Object(m) = data {
            self.object(n, m, name, root, out);
        }
    }

    /// typeValidator (validate/type.go).
    fn type_check(&self, n: &Node, data: &Value, name: &Name<'_>, out: &mut Vec<FieldError>) {
        // Every value passes here: nothing is allocated unless it is refused.
        let one = [n.ty.as_str()];
        let types: &[&str] = if n.int_or_string {
            &["integer", "string"]
        } else if n.ty.is_empty() {
            return;
        } else {
            &one
        };
        let joined = || types.join(",");
        let sch = match data {
            Value::Null => {
                if !n.nullable {
                    out.push(FieldError::type_invalid(
                        &self.path(name),
                        quote("null"),
                        format!("{name} in body must be of type {}: \"null\"", joined()),
                    ));
                }
                return;
            }
            Value::Bool(_) => "boolean",
            Value::Number(num) if is_int(num) => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        let float_int = match data {
            Value::Number(num) if sch == "number" => num.as_f64().is_some_and(is_json_integer),
            _ => false,
        };
        let ok = types.contains(&sch)
            || (float_int && types.contains(&"integer"))
            || (sch == "integer" && types.contains(&"number"));
        if !ok {
            out.push(FieldError::type_invalid(
                &self.path(name),
                quote(sch),
                format!(
                    "{name} in body must be of type {}: {}",
                    joined(),
                    quote(sch)
                ),
            ));
        }
    }

    /// schemaPropsValidator (validate/schema_props.go): allOf, anyOf, oneOf, not.
    fn schema_props(&self, n: &Node, data: &Value, name: &Name<'_>, out: &mut Vec<FieldError>) {
        let run = |sub: &Node| {
            let mut r = Vec::new();
            self.value(sub, data, name, false, &mut r);
            r
        };
        if !n.any_of.is_empty() {
            let mut best: Option<Vec<FieldError>> = None;
            let mut ok = false;
            for sub in &n.any_of {
                let r = run(sub);
                if r.is_empty() {
                    ok = true;
                    best = None;
                    break;
                }
                if best.as_ref().is_none_or(|b| r.len() < b.len()) {
                    best = Some(r);
                }
            }
            if !ok {
                out.push(self.composite(format!(
                    "{} must validate at least one schema (anyOf)",
                    quote(&name.to_string())
                )));
                out.extend(best.unwrap_or_default());
            }
        }
        if !n.one_of.is_empty() {
            let mut best: Option<Vec<FieldError>> = None;
            let mut valid = 0;
            for sub in &n.one_of {
                let r = run(sub);
                if r.is_empty() {
                    valid += 1;
                    best = None;
                    continue;
                }
                if valid == 0 && best.as_ref().is_none_or(|b| r.len() < b.len()) {
                    best = Some(r);
                }
            }
            if valid != 1 {
                let extra = if valid == 0 {
                    "Found none valid".to_string()
                } else {
                    format!("Found {valid} valid alternatives")
                };
                out.push(self.composite(format!(
                    "{} must validate one and only one schema (oneOf). {extra}",
                    quote(&name.to_string())
                )));
                out.extend(best.unwrap_or_default());
            }
        }
        if !n.all_of.is_empty() {
            let mut valid = 0;
            let mut errs = Vec::new();
            for sub in &n.all_of {
                let r = run(sub);
                if r.is_empty() {
                    valid += 1;
                }
                errs.extend(r);
            }
            out.extend(errs);
            if valid != n.all_of.len() {
                let extra = if valid == 0 { ". None validated" } else { "" };
                out.push(self.composite(format!(
                    "{} must validate all the schemas (allOf){extra}",
                    quote(&name.to_string())
                )));
            }
        }
        if let Some(not) = &n.not
            && run(not).is_empty()
        {
            out.push(self.composite(format!(
                "{} must not validate the schema (not)",
                quote(&name.to_string())
            )));
        }
    }

    /// stringValidator: the first failing check only.
    fn string(&self, n: &Node, s: &str, name: &Name<'_>, out: &mut Vec<FieldError>) {
        let len = s.chars().count() as i64;
        if let Some(max) = n.max_length
            && len > max
        {
            out.push(FieldError::too_long(&self.path(name), max));
            return;
        }
        if let Some(min) = n.min_length
            && len < min
        {
            out.push(FieldError::invalid_str(
                &self.path(name),
                s,
                format!("{name} in body should be at least {min} chars long"),
            ));
            return;
        }
        if let Some((pat, re)) = &n.pattern
            && !re.is_match(s)
        {
            out.push(FieldError::invalid_str(
                &self.path(name),
                s,
                format!("{name} in body should match '{pat}'"),
            ));
        }
    }

    /// formatValidator, with the formats apiextensions keeps
    /// (pkg/apiserver/validation/formats.go).
    fn format(&self, n: &Node, s: &str, name: &Name<'_>, out: &mut Vec<FieldError>) {
        if n.format.is_empty() || n.int_or_string {
            return;
        }
        if !formats::is_valid(&n.format, s) {
            out.push(FieldError::type_invalid(
                &self.path(name),
                quote(s),
                format!("{name} in body must be of type {}: {}", n.format, quote(s)),
            ));
        }
    }

    /// numberValidator: multipleOf, maximum, minimum; the first failing only.
    fn number(&self, n: &Node, num: &Number, name: &Name<'_>, out: &mut Vec<FieldError>) {
        // Worded only for an error (this runs for every number of every object).
        let value = || gofmt::number(num);
        let int = if is_int(num) { num.as_i64() } else { None };
        let f = num.as_f64().unwrap_or(0.0);
        let path = || self.path(name);
        if let Some(m) = n.multiple_of {
            if m <= 0.0 {
                out.push(FieldError::invalid(
                    &path(),
                    gofmt::float(m),
                    format!(
                        "factor MultipleOf declared for {name} must be positive: {}",
                        gofmt::float(m)
                    ),
                ));
                return;
            }
            let bad = match int {
                Some(i) if m.fract() == 0.0 && m < 9.2e18 => {
                    let mi = m as i64;
                    (mi != 0 && i % mi != 0).then(|| mi.to_string())
                }
                _ => (!is_json_integer(f / m)).then(|| gofmt::float(m)),
            };
            if let Some(shown) = bad {
                out.push(FieldError::invalid(
                    &path(),
                    value(),
                    format!("{name} in body should be a multiple of {shown}"),
                ));
                return;
            }
        }
        // kube-openapi's MaximumNumber / MinimumNumber: integers compared as integers, the
        // bound shown the way Go prints it; the first bound broken is reported.
        let bounds = [
            (n.maximum, n.exclusive_maximum, true),
            (n.minimum, n.exclusive_minimum, false),
        ];
        for (bound, exclusive, upper) in bounds {
            let Some(b) = bound else {
                continue;
            };
            fn beyond<N: PartialOrd>(x: N, b: N, upper: bool, exclusive: bool) -> bool {
                match (upper, exclusive) {
                    (true, true) => x >= b,
                    (true, false) => x > b,
                    (false, true) => x <= b,
                    (false, false) => x < b,
                }
            }
            let (fails, shown) = match int {
                Some(i) => {
                    let bi = b.trunc().clamp(i64::MIN as f64, i64::MAX as f64) as i64;
                    (beyond(i, bi, upper, exclusive), bi.to_string())
                }
                None => (beyond(f, b, upper, exclusive), gofmt::float(b)),
            };
            if fails {
                let word = match (upper, exclusive) {
                    (true, true) => "less than",
                    (true, false) => "less than or equal to",
                    (false, true) => "greater than",
                    (false, false) => "greater than or equal to",
                };
                out.push(FieldError::invalid(
                    &path(),
                    value(),
                    format!("{name} in body should be {word} {shown}"),
                ));
                return;
            }
        }
    }

    /// schemaSliceValidator: items, minItems, maxItems.
    fn slice(&self, n: &Node, items: &[Value], name: &Name<'_>, out: &mut Vec<FieldError>) {
        if let Some(is) = &n.items {
            for (i, item) in items.iter().enumerate() {
                self.value(is, item, &Name::Index(name, i), false, out);
            }
        }
        let size = items.len() as i64;
        if let Some(min) = n.min_items
            && size < min
        {
            out.push(FieldError::invalid(
                &self.path(name),
                size.to_string(),
                format!("{name} in body should have at least {min} items"),
            ));
        }
        if let Some(max) = n.max_items
            && size > max
        {
            out.push(FieldError::too_many(&self.path(name), size, max));
        }
        if n.unique_items {
            let dup = items
                .iter()
                .enumerate()
                .any(|(i, a)| items[..i].iter().any(|b| json_eq(a, b)));
            if dup {
                out.push(FieldError::invalid(
                    &self.path(name),
                    quote(""),
                    format!("{name} in body shouldn't contain duplicates"),
                ));
            }
        }
    }

    /// basicCommonValidator: enum.
    fn enum_check(&self, n: &Node, data: &Value, name: &Name<'_>, out: &mut Vec<FieldError>) {
        let Some(values) = &n.enum_ else { return };
        if values.iter().any(|e| json_eq(e, data)) {
            return;
        }
        let supported: Vec<String> = values
            .iter()
            .map(|e| match e {
                Value::String(s) => s.clone(),
                other => gofmt::json(other),
            })
            .collect();
        out.push(FieldError::not_supported(
            &self.path(name),
            gofmt::bad_value(data),
            &supported,
        ));
    }

    /// objectValidator (validate/object_validator.go).
    fn object(
        &self,
        n: &Node,
        m: &Map<String, Value>,
        name: &Name<'_>,
        root: bool,
        out: &mut Vec<FieldError>,
    ) {
        // The metadata given beside the root object counts as one of its properties.
        let root_meta = self
            .root_meta
            .filter(|_| root && !m.contains_key("metadata"));
        let count = (m.len() + usize::from(root_meta.is_some())) as i64;
        if let Some(min) = n.min_properties
            && count < min
        {
            out.push(FieldError::invalid(
                &self.path(name),
                min.to_string(),
                format!("{name} in body should have at least {min} properties"),
            ));
            return;
        }
        if let Some(max) = n.max_properties
            && count > max
        {
            out.push(FieldError::too_many(&self.path(name), count, max));
            return;
        }
        let mut keys: Vec<&String> = m.keys().collect();
        keys.sort();
        match &n.additional_properties {
            Some(AddProps::Bool(false)) => {
                for k in &keys {
                    if !(n.properties.contains_key(*k) || (root && is_meta_field(k))) {
                        out.push(FieldError::invalid_str(
                            &self.path(name),
                            k,
                            format!("{name}.{k} in body is a forbidden property"),
                        ));
                    }
                }
            }
            Some(AddProps::Schema(ap)) => {
                for k in &keys {
                    if !(n.properties.contains_key(*k) || (root && is_meta_field(k)))
                        && let Some(v) = m.get(*k)
                    {
                        self.value(ap, v, &Name::Key(name, k), false, out);
                    }
                }
            }
            _ => {}
        }
        for (k, ps) in &n.properties {
            let Some(v) = m.get(k).or(root_meta.filter(|_| k == "metadata")) else {
                continue;
            };
            if root && (k == "apiVersion" || k == "kind") {
                continue;
            }
            if root && k == "metadata" {
                // Only what the schema says about name and generateName.
                let metadata = Name::Field(&Name::Root, "metadata");
                for f in ["name", "generateName"] {
                    if let (Some(fs), Some(fv)) = (ps.properties.get(f), v.get(f)) {
                        self.value(fs, fv, &Name::Field(&metadata, f), false, out);
                    }
                }
                continue;
            }
            self.value(ps, v, &Name::Field(name, k), false, out);
        }
        for k in &n.required {
            if root && is_meta_field(k) {
                continue;
            }
            if !m.contains_key(k) {
                out.push(FieldError::required(&self.path(&Name::Key(name, k)), ""));
            }
        }
    }
}

fn is_meta_field(k: &str) -> bool {
    matches!(k, "apiVersion" | "kind" | "metadata")
}

/// An integer as Go's JSON decoding into unstructured content yields
/// (int64); larger integers become float64.
pub(crate) fn is_int(n: &Number) -> bool {
    n.is_i64()
}

/// swag.IsFloat64AJSONInteger.
fn is_json_integer(f: f64) -> bool {
    f.is_finite() && f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0 * 1024.0
}

/// Equality of JSON values where an integer equals the same float
/// (reflect conversion in kube-openapi's enum check).
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

// ---------------------------------------------------------------------------
// x-kubernetes-list-type (listtype/validation.go) and embedded resources
// (objectmeta/validation.go); paths are field.Paths (keys as `[key]`).
// ---------------------------------------------------------------------------

/// List sets and maps must not have duplicates; embedded resources need
/// apiVersion and kind.
pub(crate) fn lists_and_embedded(
    n: &Node,
    data: &Value,
    path: &At<'_>,
    is_root: bool,
    out: &mut Vec<FieldError>,
) {
    match data {
        Value::Array(items) => {
            match n.list_type.as_deref() {
                Some("set") => list_set(items, path, out),
                Some("map") => list_map(items, &n.list_map_keys, path, out),
                _ => {}
            }
            if let Some(is) = &n.items {
                for (i, item) in items.iter().enumerate() {
                    lists_and_embedded(is, item, &At::Index(path, i), false, out);
                }
            }
        }
        Value::Object(m) => {
            if n.embedded && !is_root {
                embedded(m, path, out);
            }
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for k in keys {
                let Some(v) = m.get(k) else { continue };
                if let Some(ps) = n.properties.get(k) {
                    if is_root && is_meta_field(k) {
                        continue;
                    }
                    lists_and_embedded(ps, v, &At::Child(path, k), false, out);
                } else if let Some(ap) = n.additional_schema() {
                    lists_and_embedded(ap, v, &At::Key(path, k), false, out);
                }
            }
        }
        _ => {}
    }
}

fn list_set(items: &[Value], path: &At<'_>, out: &mut Vec<FieldError>) {
    for (i, x) in items.iter().enumerate() {
        // Go map keys: int64 and float64 differ, so exact JSON equality.
        if items[..i].iter().any(|y| y == x) {
            out.push(FieldError::duplicate(
                &path.path().index(i),
                gofmt::bad_value(x),
            ));
        }
    }
}

fn list_map(items: &[Value], keys: &[String], path: &At<'_>, out: &mut Vec<FieldError>) {
    let mut seen: Vec<Map<String, Value>> = Vec::new();
    for (i, x) in items.iter().enumerate() {
        let Some(obj) = x.as_object() else {
            out.push(FieldError::invalid(
                &path.path().index(i),
                gofmt::bad_value(x),
                "must be an object for an array of list-type map",
            ));
            continue;
        };
        let mut key = Map::new();
        for k in keys {
            if let Some(v) = obj.get(k) {
                key.insert(k.clone(), v.clone());
            }
        }
        if seen.contains(&key) {
            out.push(FieldError::duplicate(
                &path.path().index(i),
                gofmt::bad_value(&Value::Object(key)),
            ));
        } else {
            seen.push(key);
        }
    }
}

fn embedded(m: &Map<String, Value>, path: &At<'_>, out: &mut Vec<FieldError>) {
    let path = &path.path();
    if !m.contains_key("apiVersion") {
        out.push(FieldError::required(
            &path.child("apiVersion"),
            "must not be empty",
        ));
    }
    if !m.contains_key("kind") {
        out.push(FieldError::required(
            &path.child("kind"),
            "must not be empty",
        ));
    }
    if let Some(v) = m.get("apiVersion") {
        let p = path.child("apiVersion");
        match v.as_str() {
            None => out.push(FieldError::invalid(
                &p,
                gofmt::bad_value(v),
                "must be a string",
            )),
            Some("") => out.push(FieldError::invalid_str(&p, "", "must not be empty")),
            Some(av) if av.matches('/').count() > 1 => out.push(FieldError::invalid_str(
                &p,
                av,
                format!("unexpected GroupVersion string: {av}"),
            )),
            Some(_) => {}
        }
    }
    if let Some(v) = m.get("kind") {
        let p = path.child("kind");
        match v.as_str() {
            None => out.push(FieldError::invalid(
                &p,
                gofmt::bad_value(v),
                "must be a string",
            )),
            Some("") => out.push(FieldError::invalid_str(&p, "", "must not be empty")),
            Some(kind) => {
                if let Some(err) = dns1035_label_error(&kind.to_lowercase()) {
                    out.push(FieldError::invalid_str(
                        &p,
                        kind,
                        format!("may have mixed case, but should otherwise match: {err}"),
                    ));
                }
            }
        }
    }
}

/// utilvalidation.IsDNS1035Label's messages.
fn dns1035_label_error(s: &str) -> Option<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.last()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !ok {
        errs.push(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
                .to_string(),
        );
    }
    if errs.is_empty() {
        None
    } else {
        Some(errs.join(","))
    }
}
