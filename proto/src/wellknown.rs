//! Names Kubernetes fixes and several Skiff components share: the certificate signers and
//! where bootstrap tokens live. One definition for the API server, the controller manager,
//! the node agent and the CLI.

/// The signer of nodes' client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
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
