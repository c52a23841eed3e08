//! `skiff apply`: create or update objects from manifests, like `kubectl apply`.
//!
//! The applied configuration is recorded in an annotation; on re-apply the new configuration
//! is merged into the live object (fields from the manifest win, fields that were in the last
//! applied configuration but are gone from the manifest are removed, fields set by the server
//! are kept), and nothing is sent when the merge changes nothing.

use std::process::ExitCode;

use anyhow::{Result, anyhow};
use serde_json::{Map, Value};
use skiff_client::{Client, ClientError};

use crate::resources::{self, Loaded, object_ref};

/// The annotation holding the last applied configuration.
pub const LAST_APPLIED: &str = "skiff.io/last-applied-configuration";
/// Attempts of an update that keeps losing resourceVersion races.
const CONFLICT_RETRIES: usize = 5;

/// What apply did to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Created,
    Configured,
    Unchanged,
}

impl Action {
    pub fn as_str(&self) -> &'static str {
        match self {
            Action::Created => "created",
            Action::Configured => "configured",
            Action::Unchanged => "unchanged",
        }
    }
}

/// Namespaces first, then everything else in file order.
pub fn apply_order(docs: &[Loaded]) -> Vec<usize> {
    let (mut ns, rest): (Vec<usize>, Vec<usize>) =
        (0..docs.len()).partition(|&i| docs[i].doc.kind.info().kind == "Namespace");
    ns.extend(rest);
    ns
}

/// Metadata the server owns; never part of an applied configuration.
const SERVER_METADATA: &[&str] = &[
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// Removes from `normalized` (the manifest decoded and re-encoded, which spells out every
/// zero and `false`) the zeros and `false`s the manifest did not write (`raw`), so that
/// they don't override what the server defaulted.
pub fn prune_unwritten_zeros(normalized: &mut Value, raw: &Value) {
    match normalized {
        Value::Object(m) => {
            m.retain(|k, v| {
                let written = raw.get(k);
                match (written, &*v) {
                    (None, Value::Bool(false)) => false,
                    (None, Value::Number(n)) => n.as_f64() != Some(0.0),
                    _ => true,
                }
            });
            for (k, v) in m.iter_mut() {
                prune_unwritten_zeros(v, raw.get(k).unwrap_or(&Value::Null));
            }
            m.retain(|k, v| raw.get(k).is_some() || !v.as_object().is_some_and(Map::is_empty));
        }
        Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                prune_unwritten_zeros(v, raw.get(i).unwrap_or(&Value::Null));
            }
        }
        _ => {}
    }
}

/// The object to send: the manifest's object with its namespace set (or removed for
/// cluster-scoped kinds), any status dropped, and the configuration recorded in
/// [`LAST_APPLIED`].
pub fn desired_object(mut config: Value, namespace: &str) -> Value {
    if let Some(obj) = config.as_object_mut() {
        obj.remove("status");
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(meta) = meta.as_object_mut() {
            for f in SERVER_METADATA {
                meta.remove(*f);
            }
            if namespace.is_empty() {
                meta.remove("namespace");
            } else {
                meta.insert("namespace".into(), Value::String(namespace.into()));
            }
            if let Some(Value::Object(ann)) = meta.get_mut("annotations") {
                ann.remove(LAST_APPLIED);
                if ann.is_empty() {
                    meta.remove("annotations");
                }
            }
        }
    }
    let recorded = config.to_string();
    if let Some(meta) = config.get_mut("metadata").and_then(Value::as_object_mut) {
        let ann = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(ann) = ann.as_object_mut() {
            ann.insert(LAST_APPLIED.into(), Value::String(recorded));
        }
    }
    config
}

/// The last applied configuration recorded on a live object.
pub fn last_applied(live: &Value) -> Option<Value> {
    let text = live
        .pointer("/metadata/annotations")?
        .get(LAST_APPLIED)?
        .as_str()?;
    serde_json::from_str(text).ok()
}

fn all_objects(a: &[Value]) -> bool {
    a.iter().all(Value::is_object)
}

/// Three-way merge of `desired` into `live`, with `last` the previously applied
/// configuration: mappings merge key by key (a key in `last` but not in `desired` is
/// removed), lists of mappings of unchanged length merge element by element (so values the
/// server filled in, like a container's defaults or a service's nodePort, survive), anything
/// else takes the desired value.
pub fn merge(live: &Value, desired: &Value, last: Option<&Value>) -> Value {
    match (live, desired) {
        (Value::Object(cur), Value::Object(des)) => {
            let mut out = cur.clone();
            for (k, dv) in des {
                let merged = match cur.get(k) {
                    Some(cv) => merge(cv, dv, last.and_then(|l| l.get(k))),
                    None => dv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            if let Some(Value::Object(l)) = last {
                for k in l.keys() {
                    if !des.contains_key(k) {
                        out.remove(k);
                    }
                }
            }
            Value::Object(out)
        }
        (Value::Array(cur), Value::Array(des))
            if cur.len() == des.len() && all_objects(cur) && all_objects(des) =>
        {
            let last = last
                .and_then(Value::as_array)
                .filter(|l| l.len() == des.len());
            Value::Array(
                cur.iter()
                    .zip(des)
                    .enumerate()
                    .map(|(i, (c, d))| merge(c, d, last.map(|l| &l[i])))
                    .collect(),
            )
        }
        _ => desired.clone(),
    }
}

/// Applies one document; returns what happened.
pub async fn apply_one(
    client: &Client,
    loaded: &Loaded,
    namespace: &str,
) -> Result<Action, ClientError> {
    let kind = loaded.doc.kind;
    let api = client.dynamic(kind, Some(namespace));
    let mut config = kind
        .proto_to_json(&loaded.doc.object)
        .map_err(|e| ClientError::Invalid {
            message: format!("cannot re-read the manifest object: {e}"),
        })?;
    prune_unwritten_zeros(&mut config, &loaded.raw);
    let desired = desired_object(config, namespace);
    let name = loaded.doc.name.as_str();
    for attempt in 0..CONFLICT_RETRIES {
        let live = match api.get_opt(name).await? {
            None => match api.create(&desired).await {
                Ok(_) => return Ok(Action::Created),
                // Someone created it meanwhile: update it instead.
                Err(e) if e.is_already_exists() => continue,
                Err(e) => return Err(e),
            },
            Some(live) => live,
        };
        let merged = merge(&live, &desired, last_applied(&live).as_ref());
        if merged == live {
            return Ok(Action::Unchanged);
        }
        match api.update(&merged).await {
            Ok(_) => return Ok(Action::Configured),
            Err(e) if e.is_conflict() && attempt + 1 < CONFLICT_RETRIES => {
                tracing::debug!(name, attempt, "conflict on apply; retrying");
            }
            Err(e) => return Err(e),
        }
    }
    Err(ClientError::Conflict {
        message: format!(
            "{}: the object kept changing while being applied; try again",
            object_ref(kind.info(), name)
        ),
    })
}

/// `skiff apply -f ...`.
pub async fn run(
    client: &Client,
    files: &[String],
    namespace_flag: Option<&str>,
) -> Result<ExitCode> {
    // Everything is read and checked before anything is sent.
    let inputs = resources::read_inputs(files)?;
    let docs = resources::parse_inputs(&inputs)?;
    let namespaces = docs
        .iter()
        .map(|d| resources::document_namespace(d, namespace_flag))
        .collect::<Result<Vec<_>>>()?;
    let mut failed = false;
    for i in apply_order(&docs) {
        let d = &docs[i];
        let what = object_ref(d.doc.kind.info(), &d.doc.name);
        match apply_one(client, d, &namespaces[i]).await {
            Ok(action) => println!("{what} {}", action.as_str()),
            Err(e) if e.is_unreachable() => return Err(anyhow!(e)),
            Err(e) => {
                // The server's messages name the object; add it where one does not.
                let msg = e.to_string();
                if msg.contains(&format!("{:?}", d.doc.name)) {
                    eprintln!("error: {msg}");
                } else {
                    eprintln!("error: {what}: {msg}");
                }
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn desired_records_the_configuration() {
        let d = desired_object(
            json!({"kind": "Service", "metadata": {"name": "web",
                "annotations": {LAST_APPLIED: "old"}}, "spec": {"a": 1}, "status": {"x": 1}}),
            "shop",
        );
        assert_eq!(d["metadata"]["namespace"], "shop");
        assert!(d.get("status").is_none());
        let recorded = last_applied(&d).unwrap();
        assert_eq!(
            recorded,
            json!({"kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
                   "spec": {"a": 1}})
        );
        let ns = desired_object(json!({"metadata": {"name": "n", "namespace": "x"}}), "");
        assert!(ns["metadata"].get("namespace").is_none());
    }

    #[test]
    fn merge_keeps_server_fields_and_removes_dropped_ones() {
        let live = json!({
            "metadata": {"name": "web", "resourceVersion": "7", "uid": "u",
                         "labels": {"app": "web", "old": "x", "added-by-someone": "y"}},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.3",
                     "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]},
            "status": {"s": 1}
        });
        let last = json!({"metadata": {"name": "web", "labels": {"app": "web", "old": "x"}},
                          "spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        let desired = json!({"metadata": {"name": "web", "labels": {"app": "web"}},
                             "spec": {"type": "NodePort", "ports": [{"port": 81}]}});
        let m = merge(&live, &desired, Some(&last));
        assert_eq!(m["metadata"]["resourceVersion"], "7");
        assert_eq!(
            m["metadata"]["labels"],
            json!({"app": "web", "added-by-someone": "y"})
        );
        assert_eq!(m["spec"]["clusterIP"], "10.96.0.3");
        assert_eq!(
            m["spec"]["ports"],
            json!([{"port": 81, "nodePort": 30080, "protocol": "TCP"}])
        );
        assert_eq!(m["status"], json!({"s": 1}));
    }

    #[test]
    fn merge_of_unchanged_config_is_identity() {
        let desired = desired_object(
            json!({"metadata": {"name": "web"}, "spec": {"replicas": 2,
                "template": {"spec": {"containers": [{"name": "c", "image": "host"}]}}}}),
            "default",
        );
        // The live object: the desired one plus server-set fields and defaults.
        let mut live = desired.clone();
        live["metadata"]["resourceVersion"] = json!("9");
        live["spec"]["strategy"] = json!({"type": "RollingUpdate"});
        live["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] =
            json!("IfNotPresent");
        live["status"] = json!({"replicas": 2});
        assert_eq!(merge(&live, &desired, last_applied(&live).as_ref()), live);
        // A changed replica count is a change.
        let mut changed = desired.clone();
        changed["spec"]["replicas"] = json!(3);
        let changed = desired_object(changed, "default");
        let m = merge(&live, &changed, last_applied(&live).as_ref());
        assert_ne!(m, live);
        assert_eq!(m["spec"]["replicas"], 3);
        assert_eq!(m["spec"]["strategy"]["type"], "RollingUpdate");
    }

    #[test]
    fn unwritten_zeros_are_pruned() {
        let mut normalized = json!({"metadata": {"name": "w", "generation": 0},
            "spec": {"replicas": 0, "paused": false, "minReadySeconds": 0,
                     "template": {"spec": {"hostNetwork": false,
                        "containers": [{"name": "c", "readinessProbe": {"timeoutSeconds": 0}}]}}}});
        let raw = json!({"metadata": {"name": "w"},
            "spec": {"replicas": 0, "template": {"spec": {"containers": [{"name": "c",
                "readinessProbe": {}}]}}}});
        prune_unwritten_zeros(&mut normalized, &raw);
        assert_eq!(
            normalized,
            json!({"metadata": {"name": "w"}, "spec": {"replicas": 0,
                "template": {"spec": {"containers": [{"name": "c", "readinessProbe": {}}]}}}})
        );
    }

    #[test]
    fn lists_of_different_length_are_replaced() {
        let live = json!({"c": [{"name": "a", "x": 1}]});
        let desired = json!({"c": [{"name": "a"}, {"name": "b"}]});
        assert_eq!(merge(&live, &desired, None), desired);
        let live = json!({"args": ["a", "b"]});
        let desired = json!({"args": ["c", "d"]});
        assert_eq!(merge(&live, &desired, None), desired);
    }

    #[test]
    fn namespaces_are_applied_first() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n\
                    apiVersion: v1\nkind: Namespace\nmetadata: {name: n}\n---\n\
                    apiVersion: v1\nkind: Endpoints\nmetadata: {name: s}\n";
        let docs = resources::parse_inputs(&[("x".into(), text.into())]).unwrap();
        assert_eq!(apply_order(&docs), vec![1, 0, 2]);
    }
}
