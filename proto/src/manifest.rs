//! Reading Kubernetes-style manifests: multi-document YAML or JSON, decoded strictly (an
//! unknown field is an error that names its path, like `kubectl --validate=strict`).

use serde::de::DeserializeOwned;

use crate::resource::{DynKind, find_kind, kinds};

/// A manifest that could not be decoded. `path` is the JSON path of the offending field
/// (`spec.template.spec.containers[0].imagee`), empty when the problem is the document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct ManifestError {
    pub path: String,
    pub message: String,
}

impl ManifestError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ManifestError {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// One document of a manifest file, checked and encoded.
pub struct Document {
    pub kind: &'static dyn DynKind,
    /// The object as protobuf, ready to send to the API server.
    pub object: Vec<u8>,
    pub name: String,
    pub namespace: String,
}

impl std::fmt::Debug for Document {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Document")
            .field("kind", &self.kind.info().kind)
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .finish()
    }
}

/// An error in one document of a multi-document input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("document {index}: {error}")]
pub struct DocumentError {
    /// 1-based position of the document in the input.
    pub index: usize,
    pub error: ManifestError,
}

/// Strictly decodes a JSON value into `T`, reporting the path of the first bad field.
pub fn decode<T: DeserializeOwned>(mut value: serde_json::Value) -> Result<T, ManifestError> {
    drop_nulls(&mut value);
    serde_path_to_error::deserialize(value).map_err(|e| {
        let mut path = e.path().to_string();
        if path == "." {
            path.clear();
        }
        let message = e.inner().to_string();
        // serde reports an unknown field at its parent; name the field itself.
        if let Some(field) = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
        {
            if path.is_empty() {
                path = field.to_string();
            } else if !path.ends_with(&format!(".{field}")) && path != field {
                path = format!("{path}.{field}");
            }
            return ManifestError::new(path, "unknown field");
        }
        ManifestError::new(path, message)
    })
}

/// Removes object members whose value is null, recursively: in Kubernetes' JSON a null is an
/// unset field (kubectl sends `"creationTimestamp": null` in pod templates, and YAML's
/// `key:` with no value is a null).
fn drop_nulls(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// Checks `apiVersion` and `kind` of a document and returns its resource type.
pub fn kind_of(value: &serde_json::Value) -> Result<&'static dyn DynKind, ManifestError> {
    let obj = value
        .as_object()
        .ok_or_else(|| ManifestError::new("", "a manifest document must be a mapping"))?;
    let kind = match obj.get("kind") {
        Some(serde_json::Value::String(k)) if !k.is_empty() => k,
        _ => return Err(ManifestError::new("kind", "required field is missing")),
    };
    let api_version = match obj.get("apiVersion") {
        Some(serde_json::Value::String(v)) if !v.is_empty() => v,
        _ => {
            return Err(ManifestError::new(
                "apiVersion",
                "required field is missing",
            ));
        }
    };
    let found = kinds()
        .iter()
        .copied()
        .find(|k| k.info().kind == kind)
        .or_else(|| find_kind(kind).filter(|k| k.info().kind.eq_ignore_ascii_case(kind)))
        .ok_or_else(|| {
            ManifestError::new(
                "kind",
                format!("unknown kind {kind:?}: supported kinds are {}", supported()),
            )
        })?;
    if found.info().kind != kind {
        return Err(ManifestError::new(
            "kind",
            format!(
                "unknown kind {kind:?}: did you mean {:?}?",
                found.info().kind
            ),
        ));
    }
    if found.info().api_version != api_version {
        return Err(ManifestError::new(
            "apiVersion",
            format!(
                "kind {kind} is served as apiVersion {:?}, not {api_version:?}",
                found.info().api_version
            ),
        ));
    }
    Ok(found)
}

fn supported() -> String {
    kinds()
        .iter()
        .map(|k| format!("{} ({})", k.info().kind, k.info().api_version))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses YAML (one or more `---`-separated documents) or JSON into checked documents.
/// Empty documents are skipped. Every document is checked before any is returned, so a
/// caller can refuse the whole input when one document is bad.
pub fn parse(text: &str) -> Result<Vec<Document>, DocumentError> {
    use serde::Deserialize;
    let mut docs = Vec::new();
    for (i, de) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let yaml = yaml_serde::Value::deserialize(de).map_err(|e| DocumentError {
            index,
            error: ManifestError::new("", format!("invalid YAML: {e}")),
        })?;
        if yaml.is_null() {
            continue;
        }
        let value: serde_json::Value = serde_json::to_value(&yaml).map_err(|e| DocumentError {
            index,
            error: ManifestError::new("", format!("not representable as JSON: {e}")),
        })?;
        let doc = document(value).map_err(|error| DocumentError { index, error })?;
        docs.push(doc);
    }
    Ok(docs)
}

/// Checks and encodes one decoded document.
pub fn document(value: serde_json::Value) -> Result<Document, ManifestError> {
    let kind = kind_of(&value)?;
    let meta = value.get("metadata");
    let field = |f: &str| {
        meta.and_then(|m| m.get(f))
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string()
    };
    let (name, namespace) = (field("name"), field("namespace"));
    let object = kind.json_to_proto(value)?;
    Ok(Document {
        kind,
        object,
        name,
        namespace,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Resource;
    use crate::api::Deployment;
    use prost::Message;

    const DEPLOY: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: shop
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
  labels: {app: web}
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxSurge: 25%, maxUnavailable: 0}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: host
        command: ["python3", "-m", "http.server", "8080"]
        ports: [{containerPort: 8080, protocol: TCP}]
        resources:
          requests: {cpu: 100m, memory: 64Mi}
          limits: {cpu: 1}
        readinessProbe:
          httpGet: {path: /, port: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  selector: {app: web}
  ports:
  - {port: 80, targetPort: 8080, protocol: TCP}
"#;

    /// kubectl's `rollout undo` patch carries `"creationTimestamp": null` in the template.
    #[test]
    fn nulls_are_unset_fields() {
        let d: Deployment = decode(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": null},
            "spec": {"replicas": null, "template": {"metadata": {"creationTimestamp": null}}}
        }))
        .unwrap();
        let spec = d.spec.unwrap();
        assert_eq!(spec.replicas, None);
        assert!(
            spec.template
                .unwrap()
                .metadata
                .unwrap()
                .creation_timestamp
                .is_empty()
        );
    }

    #[test]
    fn parses_a_kubernetes_manifest() {
        let docs = parse(DEPLOY).unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[1].kind.info().kind, "Deployment");
        assert_eq!(
            (docs[1].name.as_str(), docs[1].namespace.as_str()),
            ("web", "shop")
        );
        let d = Deployment::decode(docs[1].object.as_slice()).unwrap();
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        let c = &spec
            .template
            .as_ref()
            .unwrap()
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        assert_eq!(c.resources.as_ref().unwrap().limits["cpu"], "1");
        assert_eq!(
            c.readiness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .port,
            "8080"
        );
        // And back to Kubernetes JSON.
        let json = d.to_json();
        assert_eq!(json["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(
            json["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
            0
        );
        assert!(json["status"].is_null());
    }

    #[test]
    fn unknown_field_is_rejected_with_its_path() {
        let text = DEPLOY.replace("image: host", "imagee: host");
        let err = parse(&text).unwrap_err();
        assert_eq!(err.index, 2);
        assert_eq!(err.error.path, "spec.template.spec.containers[0].imagee");
        assert_eq!(err.error.message, "unknown field");
    }

    #[test]
    fn wrong_api_version_for_kind_is_rejected() {
        let err =
            document(serde_json::json!({"apiVersion": "v1", "kind": "Deployment"})).unwrap_err();
        assert_eq!(err.path, "apiVersion");
        assert!(err.message.contains("apps/v1"), "{err}");
        let err = document(serde_json::json!({"apiVersion": "v1", "kind": "Widget"})).unwrap_err();
        assert_eq!(err.path, "kind");
        let err = document(serde_json::json!({"kind": "Pod"})).unwrap_err();
        assert_eq!(err.path, "apiVersion");
    }

    #[test]
    fn node_daemon_endpoint_port_is_spelled_like_kubernetes() {
        let value = serde_json::json!({"daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}});
        let status: crate::api::NodeStatus = serde_json::from_value(value.clone()).unwrap();
        let port = status
            .daemon_endpoints
            .as_ref()
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .map(|e| e.port);
        assert_eq!(port, Some(10250));
        assert_eq!(
            serde_json::to_value(&status).unwrap()["daemonEndpoints"],
            value["daemonEndpoints"]
        );
        let lower = serde_json::json!({"daemonEndpoints": {"kubeletEndpoint": {"port": 1}}});
        assert!(serde_json::from_value::<crate::api::NodeStatus>(lower).is_err());
    }

    #[test]
    fn wrong_type_names_the_field() {
        let err = document(
            serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "spec": {"replicas": "three"}}),
        )
        .unwrap_err();
        assert_eq!(err.path, "spec.replicas");
    }
}
