//! Webhook conversion of custom objects: a CustomResourceDefinition with
//! `spec.conversion.strategy: Webhook` names a server that converts its objects between
//! versions, and every read in a version other than the stored one, and every write in a
//! version other than the storage version, goes through it.
//!
//! One `ConversionReview` (v1, or v1beta1 when that is all the definition lists) carries
//! every object of a call that is not already in the desired version, so a list costs one
//! round trip, as in kube-apiserver. The answer is checked as kube-apiserver checks it, with
//! its messages: the review's uid, `result.status`, the number of objects, each object's
//! apiVersion, kind, name, namespace and uid. The converter may change labels and
//! annotations and nothing else of the metadata: the rest is restored from the original.
//! What the target version's schema does not specify is pruned.
//!
//! Failures are `500 InternalError` answers, `conversion webhook for <group>/<version>,
//! Kind=<kind> failed: ...`. The webhook's answer is never logged or repeated (the
//! transport, [`crate::outbound`], reads nothing but a 200 and caps it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use skiff_api::api::WebhookClientConfig;
use skiff_store::Store;

use crate::error::{ApiError, FieldError};
use crate::outbound::{CallError, Outbound};

/// kube-apiserver gives conversion calls no timeout of their own; Skiff bounds each call by
/// the longest an admission webhook may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A definition's conversion webhook.
#[derive(Debug, Clone, PartialEq)]
pub struct Webhook {
    pub client: WebhookClientConfig,
    /// `conversionReviewVersions`, in the definition's order of preference.
    pub review_versions: Vec<String>,
}

/// Calls conversion webhooks (one per API server: it keeps their connections).
pub struct Converter {
    outbound: Outbound,
    store: Arc<dyn Store>,
}

impl std::fmt::Debug for Converter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Converter").finish_non_exhaustive()
    }
}

/// Go's `GroupVersionKind.String()`: `stable.example.com/v1, Kind=CronTab`.
fn gvk(api_version: &str, kind: &str) -> String {
    format!("{api_version}, Kind={kind}")
}

impl Converter {
    pub fn new(store: Arc<dyn Store>) -> Converter {
        Converter {
            outbound: Outbound::default(),
            store,
        }
    }

    /// Converts `objects` (JSON objects of one kind) to `to` (`<group>/<version>`); those
    /// already there are not sent. The answer keeps the order of `objects`.
    pub async fn convert(
        &self,
        hook: &Webhook,
        mut objects: Vec<Value>,
        to: &str,
    ) -> Result<Vec<Value>, ApiError> {
        let pending: Vec<usize> = (0..objects.len())
            .filter(|i| objects[*i]["apiVersion"].as_str() != Some(to))
            .collect();
        let Some(first) = pending.first() else {
            return Ok(objects);
        };
        let from = &objects[*first];
        let source = gvk(
            from["apiVersion"].as_str().unwrap_or(""),
            from["kind"].as_str().unwrap_or(""),
        );
        let failed = |why: String| {
            ApiError::internal_error(format!("conversion webhook for {source} failed: {why}"))
        };
        let review_version = hook
            .review_versions
            .iter()
            .find(|v| *v == "v1" || *v == "v1beta1")
            .ok_or_else(|| failed("no supported conversion review versions".into()))?;
        let uid = uuid::Uuid::new_v4().to_string();
        let sent: Vec<&Value> = pending.iter().map(|i| &objects[*i]).collect();
        let review = json!({
            "kind": "ConversionReview",
            "apiVersion": format!("apiextensions.k8s.io/{review_version}"),
            "request": {"uid": uid, "desiredAPIVersion": to, "objects": sent},
        });
        let body = Bytes::from(serde_json::to_vec(&review).map_err(|e| failed(e.to_string()))?);
        let answer = self
            .call(&hook.client, body)
            .await
            .map_err(|e| failed(e.reason()))?;
        let converted =
            converted_objects(&answer, review_version, &uid).map_err(|e| failed(e.clone()))?;
        if converted.len() != pending.len() {
            return Err(ApiError::internal_error(format!(
                "conversion webhook for {source} returned {} objects, expected {}",
                converted.len(),
                pending.len()
            )));
        }
        let single = objects.len() == 1;
        for (n, (i, out)) in pending.into_iter().zip(converted).enumerate() {
            let at = if single {
                "object".to_string()
            } else {
                format!("converted object at index {n}")
            };
            let out = check_converted(&objects[i], out, to).map_err(|why| {
                ApiError::internal_error(format!(
                    "conversion webhook for {source} returned invalid {at}: {why}"
                ))
            })?;
            objects[i] = out;
        }
        Ok(objects)
    }

    async fn call(&self, client: &WebhookClientConfig, body: Bytes) -> Result<Bytes, CallError> {
        let target = crate::outbound::resolve(self.store.as_ref(), client).await?;
        self.outbound
            .post(&target, &client.ca_bundle, body, CALL_TIMEOUT)
            .await
    }
}

/// The converted objects of a review's answer, checked as kube-apiserver checks them.
fn converted_objects(answer: &[u8], review_version: &str, uid: &str) -> Result<Vec<Value>, String> {
    let review: Value = serde_json::from_slice(answer)
        .map_err(|e| format!("the answer is not a ConversionReview: {e}"))?;
    if review_version == "v1" {
        let got = format!(
            "{}, Kind={}",
            review["apiVersion"].as_str().unwrap_or(""),
            review["kind"].as_str().unwrap_or("")
        );
        let want = "apiextensions.k8s.io/v1, Kind=ConversionReview";
        if got != want {
            return Err(format!("expected webhook response of {want}, got {got}"));
        }
    }
    let response = review
        .get("response")
        .filter(|r| r.is_object())
        .ok_or("no response provided")?;
    let got_uid = response["uid"].as_str().unwrap_or("");
    if review_version == "v1" && got_uid != uid {
        return Err(format!("expected response.uid={uid:?}, got {got_uid:?}"));
    }
    let status = response["result"]["status"].as_str().unwrap_or("");
    if status != "Success" {
        return Err(match response["result"]["message"].as_str() {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => format!("response.result.status was '{status}', not 'Success'"),
        });
    }
    Ok(response["convertedObjects"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Checks one converted object against its original and restores the original's metadata
/// but for labels and annotations (kube-apiserver's `validateConvertedObject` and
/// `restoreObjectMeta`).
fn check_converted(original: &Value, mut out: Value, to: &str) -> Result<Value, String> {
    let Some(obj) = out.as_object_mut() else {
        return Err("not a JSON object".into());
    };
    let got = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if got != to {
        return Err(format!(
            "invalid groupVersion (expected {to}, received {got})"
        ));
    }
    let s = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let out_view = Value::Object(obj.clone());
    for (what, pointer) in [
        ("kind", "/kind"),
        ("name", "/metadata/name"),
        ("namespace", "/metadata/namespace"),
        ("UID", "/metadata/uid"),
    ] {
        let (e, a) = (s(original, pointer), s(&out_view, pointer));
        if e != a {
            return Err(format!("must have the same {what}: {e} != {a}"));
        }
    }
    let returned = match obj.get("metadata") {
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(format!(
                "invalid metadata of type {} in converted object",
                json_type(other)
            ));
        }
        None => return Err("missing metadata in converted object".into()),
    };
    let mut meta = original
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for field in ["labels", "annotations"] {
        match returned.get(field) {
            None | Some(Value::Null) => {
                meta.remove(field);
            }
            Some(Value::Object(m)) => {
                let mut strings = BTreeMap::new();
                for (k, v) in m {
                    let Some(v) = v.as_str() else {
                        return Err(format!(
                            "metadata.{field}[{k}] must be a string, but is {} in converted \
                             object",
                            json_type(v)
                        ));
                    };
                    strings.insert(k.clone(), v.to_string());
                }
                let mut errs: Vec<FieldError> = Vec::new();
                if field == "labels" {
                    crate::validation::check_labels(&mut errs, "metadata.labels", &strings);
                } else {
                    crate::validation::check_annotations(
                        &mut errs,
                        "metadata.annotation",
                        &strings,
                    );
                }
                if !errs.is_empty() {
                    return Err(crate::error::join_field_errors(&errs));
                }
                meta.insert(field.into(), Value::Object(m.clone()));
            }
            Some(other) => {
                return Err(format!(
                    "invalid metadata.{field} of type {} in converted object",
                    json_type(other)
                ));
            }
        }
    }
    obj.insert("metadata".into(), Value::Object(meta));
    Ok(out)
}

/// The Go type a JSON value decodes to, for messages.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(_) => "int64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn original() -> Value {
        json!({
            "apiVersion": "stable.example.com/v1",
            "kind": "CronTab",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "labels": {"x": "1"}},
            "spec": {"size": "3"},
        })
    }

    fn answer(uid: &str, objects: Vec<Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "response": {"uid": uid, "result": {"status": "Success"}, "convertedObjects": objects},
        }))
        .unwrap()
    }

    #[test]
    fn a_review_answer_is_checked_as_kubernetes_does() {
        let ok = answer("u", vec![json!({})]);
        assert_eq!(converted_objects(&ok, "v1", "u").unwrap().len(), 1);
        assert_eq!(
            converted_objects(&ok, "v1", "other").unwrap_err(),
            "expected response.uid=\"other\", got \"u\""
        );
        // v1beta1 answers are not checked for their uid or kind.
        assert!(converted_objects(&ok, "v1beta1", "other").is_ok());
        let wrong_kind = br#"{"apiVersion":"v1","kind":"Status","response":{}}"#;
        assert_eq!(
            converted_objects(wrong_kind, "v1", "u").unwrap_err(),
            "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got \
             v1, Kind=Status"
        );
        let none = br#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview"}"#;
        assert_eq!(
            converted_objects(none, "v1", "u").unwrap_err(),
            "no response provided"
        );
        let failed = serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "u", "result": {"status": "Failure", "message": "no can do"}},
        }))
        .unwrap();
        assert_eq!(
            converted_objects(&failed, "v1", "u").unwrap_err(),
            "no can do"
        );
        let silent = serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "u", "result": {"status": "Failure"}},
        }))
        .unwrap();
        assert_eq!(
            converted_objects(&silent, "v1", "u").unwrap_err(),
            "response.result.status was 'Failure', not 'Success'"
        );
    }

    #[test]
    fn a_converter_may_change_labels_and_annotations_only() {
        let mut out = original();
        out["apiVersion"] = "stable.example.com/v2".into();
        out["spec"] = json!({"replicas": 3});
        out["metadata"] = json!({"name": "a", "namespace": "ns", "uid": "u1",
            "resourceVersion": "999", "finalizers": ["evil"], "labels": {"y": "2"},
            "annotations": {"converted": "yes"}});
        let got = check_converted(&original(), out, "stable.example.com/v2").unwrap();
        assert_eq!(got["spec"], json!({"replicas": 3}));
        let meta = got["metadata"].as_object().unwrap();
        assert_eq!(meta["resourceVersion"], "7", "restored from the original");
        assert!(
            !meta.contains_key("finalizers"),
            "not taken from the converter"
        );
        assert_eq!(meta["labels"], json!({"y": "2"}));
        assert_eq!(meta["annotations"], json!({"converted": "yes"}));

        // Dropping the labels drops them.
        let mut out = original();
        out["apiVersion"] = "stable.example.com/v2".into();
        out["metadata"] = json!({"name": "a", "namespace": "ns", "uid": "u1"});
        let got = check_converted(&original(), out, "stable.example.com/v2").unwrap();
        assert!(got["metadata"].get("labels").is_none());
    }

    #[test]
    fn identity_and_version_changes_are_refused_with_kubernetes_messages() {
        let to = "stable.example.com/v2";
        let with = |f: &dyn Fn(&mut Value)| {
            let mut out = original();
            out["apiVersion"] = to.into();
            f(&mut out);
            check_converted(&original(), out, to).unwrap_err()
        };
        assert_eq!(
            with(&|o| o["apiVersion"] = "stable.example.com/v1".into()),
            "invalid groupVersion (expected stable.example.com/v2, received stable.example.com/v1)"
        );
        assert_eq!(
            with(&|o| o["kind"] = "Other".into()),
            "must have the same kind: CronTab != Other"
        );
        assert_eq!(
            with(&|o| o["metadata"]["name"] = "b".into()),
            "must have the same name: a != b"
        );
        assert_eq!(
            with(&|o| o["metadata"]["namespace"] = "kube-system".into()),
            "must have the same namespace: ns != kube-system"
        );
        assert_eq!(
            with(&|o| o["metadata"]["uid"] = "u2".into()),
            "must have the same UID: u1 != u2"
        );
        assert_eq!(
            with(&|o| o["metadata"]["labels"] = json!({"x": 1})),
            "metadata.labels[x] must be a string, but is int64 in converted object"
        );
        assert!(
            with(&|o| o["metadata"]["labels"] = json!({"x": "not a valid value!"}))
                .starts_with("metadata.labels: Invalid value: \"not a valid value!\""),
        );
        assert_eq!(
            check_converted(
                &original(),
                json!({"apiVersion": to, "kind": "CronTab"}),
                to
            )
            .unwrap_err(),
            "must have the same name: a != "
        );
    }
}
