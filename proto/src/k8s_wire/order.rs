//! JSON in Kubernetes' field order: kube-apiserver writes each object's fields in its Go
//! struct's order (`kind`, `apiVersion`, `metadata`, `spec`, `status`; a container's `name`
//! before its `image`), which clients that print, diff or compare the bytes see. The order is
//! the one the vendored `generated.proto` files declare (go-to-protobuf writes the struct's
//! fields in order), kept by the table. Map entries, and fields the table does not know (a
//! kind outside it, a custom object), are written in name order, as Go writes maps.
//!
//! Written by hand over `serde_json`: the objects are `Value`s (maps sorted by key), and a
//! serializer that takes the order from a table at run time is what no crate offers.

use serde_json::Value;

use super::{Field, Ty, messages, root_message};

const LIST_META: &str = "apimachinery.pkg.apis.meta.v1.ListMeta";

/// `value` as kube-apiserver writes it: an object of a kind the table has, a list of such
/// objects (`<Kind>List` with `items`), or a watch event (`type`, `object`); `None` for
/// anything else (the caller writes it as it is).
pub fn to_json_in_order(value: &Value) -> Option<Vec<u8>> {
    let map = value.as_object()?;
    let mut out = Vec::with_capacity(512);
    if map.len() == 2
        && map.get("type").is_some_and(Value::is_string)
        && let Some(object) = map.get("object")
    {
        // A watch event: `{"type":..,"object":..}`.
        out.extend_from_slice(b"{\"type\":");
        write_leaf(&map["type"], &mut out);
        out.extend_from_slice(b",\"object\":");
        match to_json_in_order(object) {
            Some(inner) => out.extend_from_slice(&inner),
            None => write_leaf(object, &mut out),
        }
        out.push(b'}');
        return Some(out);
    }
    let api_version = map.get("apiVersion")?.as_str()?;
    let kind = map.get("kind")?.as_str()?;
    if let Some(message) = root_message(api_version, kind) {
        write_message(map, messages().get(message).copied(), &mut out);
        return Some(out);
    }
    let item = root_message(api_version, kind.strip_suffix("List")?)?;
    map.get("items")?.as_array()?;
    // A list: kind, apiVersion, metadata (ListMeta), items (each of the item's kind).
    let fields = [
        Field {
            num: 1,
            json: "metadata",
            ty: Ty::Msg(LIST_META),
            repeated: false,
            map: false,
        },
        Field {
            num: 2,
            json: "items",
            ty: Ty::Msg(item),
            repeated: true,
            map: false,
        },
    ];
    write_message(map, Some(&fields), &mut out);
    Some(out)
}

fn write_leaf(v: &Value, out: &mut Vec<u8>) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
}

fn write_key(first: &mut bool, key: &str, out: &mut Vec<u8>) {
    if !*first {
        out.push(b',');
    }
    *first = false;
    let _ = serde_json::to_writer(&mut *out, key);
    out.push(b':');
}

/// An object of a message: `kind` and `apiVersion` first (TypeMeta, when the message has no
/// fields of those names), then the message's fields in order, then any others by name.
fn write_message(
    map: &serde_json::Map<String, Value>,
    fields: Option<&[Field]>,
    out: &mut Vec<u8>,
) {
    let Some(fields) = fields else {
        return write_leaf(&Value::Object(map.clone()), out);
    };
    let known = |k: &str| fields.iter().any(|f| f.json == k);
    let type_meta = ["kind", "apiVersion"].into_iter().filter(|k| !known(k));
    out.push(b'{');
    let mut first = true;
    for k in type_meta.clone() {
        if let Some(v) = map.get(k) {
            write_key(&mut first, k, out);
            write_leaf(v, out);
        }
    }
    for f in fields {
        if let Some(v) = map.get(f.json) {
            write_key(&mut first, f.json, out);
            write_field(f, v, out);
        }
    }
    for (k, v) in map {
        if !known(k) && !type_meta.clone().any(|t| t == k) {
            write_key(&mut first, k, out);
            write_leaf(v, out);
        }
    }
    out.push(b'}');
}

/// A field's value: a message, a list of them, or a map of them by its `ty`.
fn write_field(f: &Field, v: &Value, out: &mut Vec<u8>) {
    let Ty::Msg(name) = f.ty else {
        return write_leaf(v, out);
    };
    let fields = messages().get(name).copied();
    let one = |v: &Value, out: &mut Vec<u8>| match v {
        Value::Object(m) => write_message(m, fields, out),
        other => write_leaf(other, out),
    };
    match v {
        Value::Array(items) if f.repeated && !f.map => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                one(item, out);
            }
            out.push(b']');
        }
        Value::Object(entries) if f.map => {
            out.push(b'{');
            let mut first = true;
            for (k, item) in entries {
                write_key(&mut first, k, out);
                one(item, out);
            }
            out.push(b'}');
        }
        _ => one(v, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(v: &Value) -> String {
        String::from_utf8(to_json_in_order(v).expect("a known kind")).unwrap()
    }

    #[test]
    fn objects_come_in_kubernetes_field_order() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"uid": "u", "name": "p", "namespace": "ns",
                "labels": {"b": "2", "a": "1"}},
            "spec": {"restartPolicy": "Always",
                "containers": [{"image": "nginx", "name": "web",
                    "ports": [{"protocol": "TCP", "containerPort": 80}]}]},
            "status": {"phase": "Running"},
            "zz": 1
        });
        assert_eq!(
            text(&pod),
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","uid":"u","labels":{"a":"1","b":"2"}},"spec":{"containers":[{"name":"web","image":"nginx","ports":[{"containerPort":80,"protocol":"TCP"}]}],"restartPolicy":"Always"},"status":{"phase":"Running"},"zz":1}"#
        );
        // The same value, whatever order it came in.
        let back: Value = serde_json::from_slice(&to_json_in_order(&pod).unwrap()).unwrap();
        assert_eq!(back, pod);
    }

    #[test]
    fn status_lists_and_watch_events_too() {
        let status = json!({"apiVersion": "v1", "kind": "Status", "code": 404,
            "details": {"name": "x", "kind": "pods"}, "message": "m", "metadata": {},
            "reason": "NotFound", "status": "Failure"});
        assert_eq!(
            text(&status),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"m","reason":"NotFound","details":{"name":"x","kind":"pods"},"code":404}"#
        );
        let list = json!({"apiVersion": "apps/v1", "kind": "DeploymentList",
            "items": [{"spec": {"template": {}, "selector": {}, "replicas": 1},
                "metadata": {"name": "d"}}],
            "metadata": {"resourceVersion": "7", "continue": "c"}});
        assert_eq!(
            text(&list),
            r#"{"kind":"DeploymentList","apiVersion":"apps/v1","metadata":{"resourceVersion":"7","continue":"c"},"items":[{"metadata":{"name":"d"},"spec":{"replicas":1,"selector":{},"template":{}}}]}"#
        );
        let event = json!({"object": {"kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"name": "c"}, "data": {"k": "v"}}, "type": "ADDED"});
        assert_eq!(
            text(&event),
            r#"{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c"},"data":{"k":"v"}}}"#
        );
        // Kinds outside the table are the caller's to write.
        assert!(
            to_json_in_order(&json!({"apiVersion": "example.com/v1", "kind": "Widget"})).is_none()
        );
    }
}
