//! Names Kubernetes fixes and several Skiff components share: the certificate signers, where
//! bootstrap tokens live, the default StorageClass annotations, and the Deployment revision
//! and template rules the Deployment controller and `skiff rollout` both follow. One
//! definition for the API server, the controller manager, the node agent and the CLI.

/// The signer of nodes' client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The signer of nodes' serving certificates (the agent's HTTPS API: logs, exec,
/// port-forward, stats), for the node's own addresses.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The signer of other client certificates of the API server.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";

/// The Secret type of bootstrap tokens.
pub const BOOTSTRAP_TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Where bootstrap token Secrets live.
pub const BOOTSTRAP_TOKEN_NAMESPACE: &str = "kube-system";
/// Their names: this prefix and the token id.
pub const BOOTSTRAP_TOKEN_PREFIX: &str = "bootstrap-token-";

/// The Service (and Endpoints) through which pods reach the API server, `default/kubernetes`:
/// the API server keeps it, the node agents route it and name it in every container's
/// KUBERNETES_SERVICE_HOST/_PORT.
pub const KUBERNETES_SERVICE_NAMESPACE: &str = "default";
pub const KUBERNETES_SERVICE_NAME: &str = "kubernetes";

/// The annotation that makes a StorageClass the default one (value `"true"`): a new claim
/// that names no class gets it (the API server's DefaultStorageClass admission), and kubectl
/// prints ` (default)` after its name.
pub const DEFAULT_STORAGE_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
/// Its beta spelling, still honoured by Kubernetes 1.32.
pub const BETA_DEFAULT_STORAGE_CLASS_ANNOTATION: &str =
    "storageclass.beta.kubernetes.io/is-default-class";
/// The beta annotation that named a claim's or a volume's class before `storageClassName`;
/// it still wins over the field where both are set (Kubernetes' `GetPersistentVolumeClass`).
pub const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

/// Whether annotations mark a StorageClass as the default one (either spelling, `"true"`).
pub fn is_default_storage_class(annotations: &std::collections::BTreeMap<String, String>) -> bool {
    [
        DEFAULT_STORAGE_CLASS_ANNOTATION,
        BETA_DEFAULT_STORAGE_CLASS_ANNOTATION,
    ]
    .iter()
    .any(|k| annotations.get(*k).is_some_and(|v| v == "true"))
}

/// The revision of a ReplicaSet (and of its Deployment: the revision of the new one).
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// The Deployment's `replicas` when the controller last scaled a ReplicaSet.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// `replicas + maxSurge` when the controller last scaled a ReplicaSet.
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// Why the template was changed (set by the user); copied to the ReplicaSet of that template,
/// where `skiff rollout history` reads it.
pub const CHANGE_CAUSE: &str = "kubernetes.io/change-cause";
/// Annotations that belong to one object and are not copied between a Deployment and its
/// ReplicaSets (neither by the controller nor by a rollback), as Kubernetes'
/// `annotationsToSkip`, plus Skiff's own last-applied annotation.
pub const NOT_COPIED_ANNOTATIONS: &[&str] = &[
    REVISION,
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    "deployment.kubernetes.io/revision-history",
    "deprecated.deployment.rollback.to",
    "kubectl.kubernetes.io/last-applied-configuration",
    "skiff.io/last-applied-configuration",
];
/// The label that ties a Deployment's ReplicaSets and their pods to one template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// The [`REVISION`] annotation of an object; 0 when absent or not a number.
pub fn revision_of<T: crate::Resource>(o: &T) -> i64 {
    o.metadata()
        .and_then(|m| m.annotations.get(REVISION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// Whether two templates are the same apart from the [`POD_TEMPLATE_HASH`] label.
pub fn templates_equal(
    a: Option<&crate::api::PodTemplateSpec>,
    b: Option<&crate::api::PodTemplateSpec>,
) -> bool {
    let strip = |t: Option<&crate::api::PodTemplateSpec>| {
        let mut t = t.cloned().unwrap_or_default();
        let m = t.metadata.get_or_insert_with(Default::default);
        m.labels.remove(POD_TEMPLATE_HASH);
        t
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ObjectMeta, PodTemplateSpec, ReplicaSet};

    #[test]
    fn a_revision_is_read_from_its_annotation() {
        let with = |revision: &str| ReplicaSet {
            metadata: Some(ObjectMeta {
                annotations: [(REVISION.to_string(), revision.to_string())].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(revision_of(&ReplicaSet::default()), 0);
        assert_eq!(revision_of(&with("7")), 7);
        assert_eq!(revision_of(&with("seven")), 0);
    }

    #[test]
    fn templates_differ_by_more_than_their_hash_label() {
        let labelled = |labels: &[(&str, &str)]| PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let a = labelled(&[("app", "web")]);
        let hashed = labelled(&[("app", "web"), (POD_TEMPLATE_HASH, "abc")]);
        assert!(templates_equal(Some(&a), Some(&hashed)));
        assert!(!templates_equal(
            Some(&a),
            Some(&labelled(&[("app", "db")]))
        ));
        assert!(templates_equal(None, Some(&PodTemplateSpec::default())));
    }
}
