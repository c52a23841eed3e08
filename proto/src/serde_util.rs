//! Serde helpers for Kubernetes' loosely typed fields.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serializer};

/// A YAML/JSON scalar accepted where Kubernetes takes an IntOrString or a Quantity.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Int(i64),
    Float(f64),
    Str(String),
}

impl Scalar {
    fn into_string(self) -> String {
        match self {
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Str(s) => s,
        }
    }
}

fn write_int_or_string<S: Serializer>(value: &str, s: S) -> Result<S::Ok, S::Error> {
    match value.parse::<i64>() {
        Ok(i) => s.serialize_i64(i),
        Err(_) => s.serialize_str(value),
    }
}

/// IntOrString stored as a string: `8080` and `"http"` both deserialize; a string holding an
/// integer serializes back as a number.
pub mod int_or_string {
    use super::*;

    pub fn serialize<S: Serializer>(value: &str, s: S) -> Result<S::Ok, S::Error> {
        write_int_or_string(value, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Ok(Option::<Scalar>::deserialize(d)?
            .map(Scalar::into_string)
            .unwrap_or_default())
    }
}

/// Optional IntOrString (`maxSurge: 25%`, `maxUnavailable: 1`).
pub mod opt_int_or_string {
    use super::*;

    pub fn serialize<S: Serializer>(value: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => write_int_or_string(v, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        Ok(Option::<Scalar>::deserialize(d)?.map(Scalar::into_string))
    }
}

/// A map of resource quantities; values may be YAML numbers (`cpu: 1`) or strings.
pub fn quantity_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let raw = Option::<BTreeMap<String, Scalar>>::deserialize(d)?.unwrap_or_default();
    Ok(raw.into_iter().map(|(k, v)| (k, v.into_string())).collect())
}

/// A string field holding JSON text, written and read as that JSON (FieldsV1). Reading
/// accepts any JSON value and keeps its compact text.
pub mod raw_json {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(text: &str, s: S) -> Result<S::Ok, S::Error> {
        if text.is_empty() {
            return serde_json::Map::new().serialize(s);
        }
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(serde::ser::Error::custom)?;
        value.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Ok(value.to_string())
    }
}

/// A map of bytes as JSON strings of standard base64 (a Secret's `data`); a value that is not
/// base64 is an error naming its key.
pub mod base64_map {
    use std::collections::BTreeMap;

    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<String, Vec<u8>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let text: BTreeMap<&str, String> = map
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    base64::engine::general_purpose::STANDARD.encode(v),
                )
            })
            .collect();
        text.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, Vec<u8>>, D::Error> {
        let raw = Option::<BTreeMap<String, String>>::deserialize(d)?.unwrap_or_default();
        raw.into_iter()
            .map(|(k, v)| {
                base64::engine::general_purpose::STANDARD
                    .decode(v.as_bytes())
                    .map(|b| (k.clone(), b))
                    .map_err(|_| {
                        serde::de::Error::custom(format!(
                            "data[{k:?}]: illegal base64 data (values of data are base64)"
                        ))
                    })
            })
            .collect()
    }
}

/// The JSON names whose values are opaque JSON that [`prune`] leaves as they are (a FieldsV1
/// set is made of empty objects).
const OPAQUE: &[&str] = &["fieldsV1"];

/// For `skip_serializing_if` on the numbers and booleans Kubernetes omits when zero.
/// Bytes as one base64 string (a certificate request's PEM).
pub mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = Option::<String>::deserialize(d)?.unwrap_or_default();
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(|e| serde::de::Error::custom(format!("illegal base64 data: {e}")))
    }
}

pub fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Removes nulls, empty strings, empty lists and empty maps from a JSON value, recursively,
/// the way Kubernetes omits unset (`omitempty`) fields. Numbers and booleans are kept.
pub fn prune(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if !OPAQUE.contains(&k.as_str()) {
                    prune(v);
                }
            }
            map.retain(|k, v| OPAQUE.contains(&k.as_str()) || !is_empty(v));
        }
        Value::Array(items) => items.iter_mut().for_each(prune),
        _ => {}
    }
}

/// [`prune`] for an object of the message `message` (its Kind), reading its shape from
/// [`crate::schema`]: the same, except that a present LabelSelector stays even when empty.
/// There absent and empty differ (a NetworkPolicy peer's `podSelector: {}` is every pod of
/// the namespace, a peer without one is no pod peer; a PodDisruptionBudget's `selector: {}`
/// covers every pod, none covers none), so the JSON must keep the difference for clients
/// and for the API server's own patches, which start from this JSON; Kubernetes writes
/// `{}` for them too. Likewise a set `optional` field stays when it is the empty text. A
/// message the schema does not know is pruned as [`prune`] does.
pub fn prune_message(message: &str, value: &mut serde_json::Value) {
    prune_in(crate::schema::message(message), value);
}

fn prune_in(msg: Option<&'static crate::schema::Message>, value: &mut serde_json::Value) {
    use crate::schema::Ty;
    use serde_json::Value;
    let Some(msg) = msg else {
        prune(value);
        return;
    };
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if OPAQUE.contains(&k.as_str()) {
                    continue;
                }
                let field = msg.field(k);
                let sub = field.and_then(|f| match f.ty {
                    Ty::Message(n) => crate::schema::message(n),
                    _ => None,
                });
                match (v, field.is_some_and(|f| f.map)) {
                    // A map's entries are data, not unset fields: `tier: ""` is a label (and
                    // a selector's requirement) like any other, kept as Kubernetes keeps it.
                    (Value::Object(entries), true) => {
                        entries.values_mut().for_each(|e| prune_in(sub, e));
                        entries.retain(|_, e| !e.is_null());
                    }
                    (v, _) => prune_in(sub, v),
                }
            }
            // A set `optional` text stays even when empty (Kubernetes' `*string`): a claim's
            // `storageClassName: ""` (no class) is not an absent one (the default class).
            let kept_empty = |k: &str, v: &Value| {
                msg.field(k).is_some_and(|f| {
                    !f.list
                        && !f.map
                        && ((v.is_object() && f.ty == Ty::Message("LabelSelector"))
                            || (v.is_string() && f.optional))
                })
            };
            map.retain(|k, v| {
                OPAQUE.contains(&k.as_str())
                    || !is_empty(v)
                    || kept_empty(k, v)
                    || msg.field(k).is_some_and(|f| f.always)
            });
            fill_always(msg, map);
            fill_meta_conditions(msg, map);
        }
        Value::Array(items) => items.iter_mut().for_each(|i| prune_in(Some(msg), i)),
        _ => {}
    }
}

/// Writes the fields Kubernetes always writes ([`crate::schema::Field::always`]) that are
/// absent or null: "" for text, `{}` (with its own such fields) for a message.
fn fill_always(
    msg: &'static crate::schema::Message,
    map: &mut serde_json::Map<String, serde_json::Value>,
) {
    use crate::schema::Ty;
    use serde_json::Value;
    for f in msg.fields.iter().filter(|f| f.always && !f.list && !f.map) {
        let present = map.get(f.json).filter(|v| !v.is_null());
        match (f.ty, present) {
            (Ty::String, None) => {
                map.insert(f.json.into(), Value::String(String::new()));
            }
            (Ty::Message(name), None | Some(Value::Object(_))) => {
                let slot = map
                    .entry(f.json)
                    .and_modify(|v| {
                        if v.is_null() {
                            *v = Value::Object(serde_json::Map::new());
                        }
                    })
                    .or_insert_with(|| Value::Object(serde_json::Map::new()));
                if let (Some(m), Value::Object(inner)) = (crate::schema::message(name), slot) {
                    fill_always(m, inner);
                }
            }
            _ => {}
        }
    }
}

/// Lists whose items are Kubernetes' `metav1.Condition` (message, list field). Skiff's one
/// `Condition` message serves every kind, and most kinds' own condition types omit an empty
/// `reason` and `message`; `metav1.Condition` has no `omitempty` on them, so Kubernetes writes
/// them as "" and the Python client's `V1Condition` requires them.
const META_CONDITIONS: [(&str, &str); 1] = [("PodDisruptionBudgetStatus", "conditions")];

/// The text fields of `metav1.Condition` written even when empty.
const META_CONDITION_ALWAYS: [&str; 2] = ["reason", "message"];

fn fill_meta_conditions(
    msg: &'static crate::schema::Message,
    map: &mut serde_json::Map<String, serde_json::Value>,
) {
    use serde_json::Value;
    for (_, list) in META_CONDITIONS.iter().filter(|(m, _)| *m == msg.name) {
        if let Some(Value::Array(items)) = map.get_mut(*list) {
            for item in items.iter_mut().filter_map(Value::as_object_mut) {
                for f in META_CONDITION_ALWAYS {
                    item.entry(f)
                        .or_insert_with(|| Value::String(String::new()));
                }
            }
        }
    }
}

fn is_empty(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{RollingUpdateDeployment, ServicePort};

    /// A PodDisruptionBudget's conditions are `metav1.Condition`s: `reason` and `message`
    /// are written even when empty (the Python client's `V1Condition` requires them), while
    /// other kinds' conditions omit them as Kubernetes does.
    #[test]
    fn disruption_budget_conditions_keep_empty_reason_and_message() {
        use crate::Resource;
        use crate::api::{Condition, PodDisruptionBudget, PodDisruptionBudgetStatus};
        let condition = Condition {
            r#type: "DisruptionAllowed".into(),
            status: "True".into(),
            last_transition_time: "2026-11-28T07:00:00Z".into(),
            ..Default::default()
        };
        let pdb = PodDisruptionBudget {
            status: Some(PodDisruptionBudgetStatus {
                conditions: vec![condition.clone()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = pdb.to_json();
        let c = &v["status"]["conditions"][0];
        assert_eq!(
            (&c["reason"], &c["message"]),
            (&serde_json::json!(""), &serde_json::json!("")),
            "{v}"
        );
        assert_eq!(c["type"], "DisruptionAllowed", "{v}");
        let deployment = crate::api::Deployment {
            status: Some(crate::api::DeploymentStatus {
                conditions: vec![condition],
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = deployment.to_json();
        let c = &v["status"]["conditions"][0];
        assert!(
            c.get("message").is_none() && c.get("reason").is_none(),
            "omitempty: {v}"
        );
    }

    /// Kubernetes writes these even when empty (Go fields without omitempty, structs); the
    /// Python client's models refuse objects without them.
    #[test]
    fn fields_kubernetes_always_writes_are_written_empty() {
        use crate::Resource;
        use crate::api::{ContainerStatus, Node, NodeStatus, NodeSystemInfo, Pod, PodStatus};
        let svc = crate::api::Service::default();
        let v = svc.to_json();
        assert_eq!(v["status"], serde_json::json!({"loadBalancer": {}}), "{v}");
        let pod = Pod {
            status: Some(PodStatus {
                container_statuses: vec![ContainerStatus {
                    name: "web".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = pod.to_json();
        let cs = &v["status"]["containerStatuses"][0];
        assert_eq!(
            (&cs["imageID"], &cs["image"]),
            (&serde_json::json!(""), &serde_json::json!("")),
            "{v}"
        );
        assert!(
            cs.get("containerID").is_none(),
            "omitempty in Kubernetes: {v}"
        );
        let node = Node {
            status: Some(NodeStatus {
                node_info: Some(NodeSystemInfo::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = node.to_json();
        assert_eq!(v["status"]["nodeInfo"]["kubeProxyVersion"], "", "{v}");
        assert_eq!(v["status"]["nodeInfo"]["systemUUID"], "", "{v}");
    }

    #[test]
    fn int_or_string_round_trips() {
        let p: ServicePort = serde_json::from_str(r#"{"port":80,"targetPort":8080}"#).unwrap();
        assert_eq!(p.target_port, "8080");
        assert_eq!(serde_json::to_value(&p).unwrap()["targetPort"], 8080);
        let p: ServicePort = serde_json::from_str(r#"{"port":80,"targetPort":"http"}"#).unwrap();
        assert_eq!(p.target_port, "http");
        assert_eq!(serde_json::to_value(&p).unwrap()["targetPort"], "http");
        let r: RollingUpdateDeployment =
            serde_json::from_str(r#"{"maxSurge":"25%","maxUnavailable":0}"#).unwrap();
        assert_eq!(r.max_surge.as_deref(), Some("25%"));
        assert_eq!(r.max_unavailable.as_deref(), Some("0"));
    }

    #[test]
    fn a_condition_without_observed_generation_omits_it() {
        let mut c = crate::api::Condition {
            r#type: "Available".into(),
            status: "True".into(),
            ..Default::default()
        };
        let v = serde_json::to_value(&c).unwrap();
        assert!(v.get("observedGeneration").is_none(), "{v}");
        c.observed_generation = 3;
        assert_eq!(serde_json::to_value(&c).unwrap()["observedGeneration"], 3);
        // Kubernetes' omitempty numbers and booleans go; its non-omitempty ones stay.
        let spec = crate::api::PodSpec::default();
        let v = serde_json::to_value(&spec).unwrap();
        assert!(
            v.get("hostNetwork").is_none() && v.get("hostPID").is_none(),
            "{v}"
        );
        let st = crate::api::ContainerStatus::default();
        let v = serde_json::to_value(&st).unwrap();
        assert_eq!(
            (&v["restartCount"], &v["ready"]),
            (&serde_json::json!(0), &serde_json::json!(false))
        );
    }

    #[test]
    fn set_optional_texts_are_kept_when_empty() {
        let claim = crate::api::PersistentVolumeClaim {
            spec: Some(crate::api::PersistentVolumeClaimSpec {
                storage_class_name: Some(String::new()),
                volume_name: String::new(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut v = serde_json::to_value(&claim).unwrap();
        prune_message("PersistentVolumeClaim", &mut v);
        assert_eq!(v, serde_json::json!({"spec": {"storageClassName": ""}}));
        let mut v = serde_json::to_value(crate::api::PersistentVolumeClaim::default()).unwrap();
        prune_message("PersistentVolumeClaim", &mut v);
        assert_eq!(v, serde_json::json!({}));
    }

    #[test]
    fn present_empty_selectors_are_kept() {
        use crate::api::NetworkPolicy;
        let p: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "labels": {}},
            "spec": {"podSelector": {}, "ingress": [{"from": [
                {"podSelector": {}}, {"namespaceSelector": {}, "podSelector": {"matchLabels": {}}},
            ], "ports": []}], "policyTypes": ["Ingress"]}
        }))
        .unwrap();
        let mut v = serde_json::to_value(&p).unwrap();
        prune_message("NetworkPolicy", &mut v);
        assert_eq!(
            v,
            serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"podSelector": {}, "ingress": [{"from": [
                    {"podSelector": {}}, {"namespaceSelector": {}, "podSelector": {}},
                ]}], "policyTypes": ["Ingress"]}
            })
        );
        // A label with an empty value is a requirement, not an unset field.
        let p: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "spec": {"podSelector": {"matchLabels": {"tier": ""}}}
        }))
        .unwrap();
        let mut v = serde_json::to_value(&p).unwrap();
        prune_message("NetworkPolicy", &mut v);
        assert_eq!(
            v,
            serde_json::json!({"spec": {"podSelector": {"matchLabels": {"tier": ""}}}})
        );
        // Absent stays absent; an unknown message is pruned plainly.
        let mut v = serde_json::json!({"spec": {"ingress": [{}]}});
        prune_message("NetworkPolicy", &mut v);
        assert_eq!(v, serde_json::json!({"spec": {"ingress": [{}]}}));
        let mut v = serde_json::json!({"podSelector": {}, "a": ""});
        prune_message("NoSuchKind", &mut v);
        assert_eq!(v, serde_json::json!({}));
    }

    #[test]
    fn prune_keeps_zero_and_false() {
        let mut v = serde_json::json!({"a": null, "b": "", "c": [], "d": {}, "e": 0, "f": false,
            "g": {"h": null}, "i": [{"j": ""}]});
        prune(&mut v);
        assert_eq!(v, serde_json::json!({"e": 0, "f": false, "i": [{}]}));
    }
}
