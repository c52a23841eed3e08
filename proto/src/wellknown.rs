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
