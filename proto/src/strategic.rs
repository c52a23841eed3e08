//! Strategic merge patch, as kubectl sends it (`application/strategic-merge-patch+json`):
//! a merge patch whose lists merge by the type's merge key (containers by `name`, ports by
//! `containerPort`, ...) or as sets, instead of being replaced, with the `$patch`,
//! `$retainKeys`, `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>`
//! directives. The types' structure comes from [`crate::schema`]; no crate implements this
//! (it is Kubernetes-specific), so it is written here.

use serde_json::{Map, Value};

use crate::schema::{self, PatchStrategy, Ty};

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// Applies `patch` to `original`, an object of message `message` (e.g. `Deployment`; an
/// unknown name merges without list strategies). Errors name what is malformed.
pub fn merge(message: &str, original: &Value, patch: &Value) -> Result<Value, String> {
    let Value::Object(p) = patch else {
        return Err("a strategic merge patch must be a JSON object".into());
    };
    match original {
        Value::Object(o) => {
            merge_map(Some(message), o.clone(), p).map(|m| m.map_or(Value::Null, Value::Object))
        }
        _ => merge_map(Some(message), Map::new(), p).map(|m| m.map_or(Value::Null, Value::Object)),
    }
}

/// Merges `patch` into `original`; `None` when the patch deletes the whole map.
fn merge_map(
    message: Option<&str>,
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<Option<Map<String, Value>>, String> {
    match patch.get(PATCH).map(|v| v.as_str()) {
        None | Some(Some("merge")) => {}
        Some(Some("replace")) => {
            let mut p = patch.clone();
            p.remove(PATCH);
            return Ok(Some(strip(p)));
        }
        Some(Some("delete")) => return Ok(None),
        Some(other) => return Err(format!("unknown $patch directive {other:?}")),
    }
    let msg = message.and_then(schema::message);
    if let Some(keys) = patch.get(RETAIN_KEYS) {
        let keys: Vec<&str> = keys
            .as_array()
            .ok_or("$retainKeys must be a list")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        original.retain(|k, _| keys.contains(&k.as_str()));
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE) {
            let gone = v
                .as_array()
                .ok_or("$deleteFromPrimitiveList must be a list")?;
            if let Some(Value::Array(items)) = original.get_mut(field) {
                items.retain(|i| !gone.contains(i));
            }
            continue;
        }
        if k.starts_with(SET_ELEMENT_ORDER) || k == PATCH || k == RETAIN_KEYS {
            continue;
        }
        if v.is_null() {
            original.remove(k);
            continue;
        }
        let field = msg.and_then(|m| m.field(k));
        let merged = match (field, v) {
            // A nested message: merge recursively.
            (Some(f), Value::Object(pv)) if !f.list && !f.map => {
                let sub = match f.ty {
                    Ty::Message(n) => Some(n),
                    _ => None,
                };
                let base = match original.remove(k) {
                    Some(Value::Object(o)) => o,
                    _ => Map::new(),
                };
                match merge_map(sub, base, pv)? {
                    Some(m) => Value::Object(m),
                    None => continue,
                }
            }
            // A map (labels, annotations, ...): keys merge, null deletes.
            (Some(f), Value::Object(pv)) if f.map => {
                let mut base = match original.remove(k) {
                    Some(Value::Object(o)) => o,
                    _ => Map::new(),
                };
                for (mk, mv) in pv {
                    if mv.is_null() {
                        base.remove(mk);
                    } else {
                        base.insert(mk.clone(), mv.clone());
                    }
                }
                Value::Object(base)
            }
            (Some(f), Value::Array(pv)) if f.list => {
                let strategy = message.and_then(|m| schema::patch_strategy(m, k));
                let sub = match f.ty {
                    Ty::Message(n) => Some(n),
                    _ => None,
                };
                let base = match original.remove(k) {
                    Some(Value::Array(a)) => a,
                    _ => Vec::new(),
                };
                Value::Array(merge_list(strategy, sub, base, pv)?)
            }
            (_, Value::Object(pv)) => {
                // A field the schema does not know: a plain merge.
                let base = match original.remove(k) {
                    Some(Value::Object(o)) => o,
                    _ => Map::new(),
                };
                match merge_map(None, base, pv)? {
                    Some(m) => Value::Object(m),
                    None => continue,
                }
            }
            (_, other) => other.clone(),
        };
        original.insert(k.clone(), merged);
    }
    Ok(Some(original))
}

fn merge_list(
    strategy: Option<PatchStrategy>,
    element: Option<&str>,
    mut original: Vec<Value>,
    patch: &[Value],
) -> Result<Vec<Value>, String> {
    let replace = patch
        .iter()
        .any(|e| e.get(PATCH).and_then(Value::as_str) == Some("replace"));
    match strategy {
        _ if replace => Ok(patch
            .iter()
            .filter(|e| e.get(PATCH).is_none())
            .cloned()
            .map(strip_value)
            .collect()),
        None => Ok(patch.iter().cloned().map(strip_value).collect()),
        Some(PatchStrategy::MergePrimitives) => {
            for v in patch {
                if !original.contains(v) {
                    original.push(v.clone());
                }
            }
            Ok(original)
        }
        Some(PatchStrategy::MergeByKey(key)) => {
            for pe in patch {
                let Value::Object(pm) = pe else {
                    return Err(format!("list elements merged by {key:?} must be objects"));
                };
                let Some(kv) = pm.get(key) else {
                    return Err(format!("a list element has no merge key {key:?}"));
                };
                let pos = original.iter().position(|o| o.get(key) == Some(kv));
                if pm.get(PATCH).and_then(Value::as_str) == Some("delete") {
                    if let Some(i) = pos {
                        original.remove(i);
                    }
                    continue;
                }
                match pos {
                    Some(i) => {
                        let base = match original[i].take() {
                            Value::Object(o) => o,
                            _ => Map::new(),
                        };
                        match merge_map(element, base, pm)? {
                            Some(m) => original[i] = Value::Object(m),
                            None => {
                                original.remove(i);
                            }
                        }
                    }
                    None => original.push(Value::Object(strip(pm.clone()))),
                }
            }
            Ok(original)
        }
    }
}

/// A patch value without directives, as stored.
fn strip(mut m: Map<String, Value>) -> Map<String, Value> {
    m.retain(|k, _| !k.starts_with('$'));
    for v in m.values_mut() {
        *v = strip_value(v.take());
    }
    m
}

fn strip_value(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip(m)),
        Value::Array(a) => Value::Array(a.into_iter().map(strip_value).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment() -> Value {
        json!({"metadata": {"name": "web", "labels": {"app": "web", "tier": "fe"},
                     "finalizers": ["a"]},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [
            {"name": "web", "image": "v1", "ports": [{"containerPort": 80}],
             "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
             "args": ["x", "y"]},
            {"name": "sidecar", "image": "s1"}
        ]}}}})
    }

    #[test]
    fn containers_merge_by_name_and_keep_the_rest() {
        let patched = merge(
            "Deployment",
            &deployment(),
            &json!({"spec": {"template": {"spec": {"containers": [
                {"name": "web", "image": "v2", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]}
            ]}}}}),
        )
        .unwrap();
        let c = &patched["spec"]["template"]["spec"]["containers"];
        assert_eq!(c.as_array().map(Vec::len), Some(2), "sidecar kept: {c}");
        assert_eq!(c[0]["image"], "v2");
        assert_eq!(
            c[0]["ports"],
            json!([{"containerPort": 80}]),
            "untouched fields stay"
        );
        assert_eq!(
            c[0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}])
        );
        assert_eq!(c[1]["image"], "s1");
        assert_eq!(patched["spec"]["replicas"], 2);
    }

    #[test]
    fn lists_without_strategy_are_replaced_and_maps_merge() {
        let patched = merge(
            "Deployment",
            &deployment(),
            &json!({"metadata": {"labels": {"tier": null, "v": "2"}, "finalizers": ["b"]},
                    "spec": {"template": {"spec": {"containers": [{"name": "web", "args": ["z"]}]}}}}),
        )
        .unwrap();
        assert_eq!(
            patched["metadata"]["labels"],
            json!({"app": "web", "v": "2"})
        );
        assert_eq!(
            patched["metadata"]["finalizers"],
            json!(["a", "b"]),
            "a set union"
        );
        assert_eq!(
            patched["spec"]["template"]["spec"]["containers"][0]["args"],
            json!(["z"])
        );
    }

    #[test]
    fn directives() {
        let d = deployment();
        let deleted = merge(
            "Deployment",
            &d,
            &json!({"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}],
                     "$setElementOrder/containers": [{"name": "web"}]}}},
                    "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(
            deleted["spec"]["template"]["spec"]["containers"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
        assert_eq!(deleted["metadata"]["finalizers"], json!([]));
        let replaced = merge(
            "Deployment",
            &d,
            &json!({"spec": {"template": {"spec": {"containers": [{"name": "only"}, {"$patch": "replace"}]}}}}),
        )
        .unwrap();
        assert_eq!(
            replaced["spec"]["template"]["spec"]["containers"],
            json!([{"name": "only"}])
        );
        let retained = merge(
            "Deployment",
            &d,
            &json!({"metadata": {"$retainKeys": ["name"], "name": "web"}}),
        )
        .unwrap();
        assert_eq!(retained["metadata"], json!({"name": "web"}));
        assert!(merge("Deployment", &d, &json!([1])).is_err());
        assert!(merge("Deployment", &d, &json!({"metadata": {"$patch": "bogus"}})).is_err());
        assert!(
            merge(
                "Deployment",
                &d,
                &json!({"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}})
            )
            .unwrap_err()
            .contains("merge key")
        );
    }

    #[test]
    fn service_ports_merge_by_port() {
        let svc = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443}]}});
        let p = merge(
            "Service",
            &svc,
            &json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}]}}),
        )
        .unwrap();
        assert_eq!(
            p["spec"]["ports"],
            json!([{"port": 80, "targetPort": 9090}, {"port": 443}])
        );
    }
}
