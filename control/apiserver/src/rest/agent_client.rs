//! How the API server speaks to node agents (logs, exec, port-forward, metrics).

use std::sync::Arc;

/// How the API server speaks to node agents: as `system:kube-apiserver` with a client
/// certificate made at start (never written to disk), verifying the agents' serving
/// certificates against the cluster CA, dialling the Node address types in the order of
/// `--kubelet-preferred-address-types`.
#[derive(Clone)]
pub struct AgentClient {
    pub identity: Arc<skiff_pki::Identity>,
    pub ca_pem: Arc<str>,
    /// Empty: the default order (`skiff_client::node_api::DEFAULT_PREFERRED_ADDRESS_TYPES`).
    pub preferred_address_types: Arc<[String]>,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("preferred_address_types", &self.preferred_address_types)
            .finish_non_exhaustive()
    }
}

impl AgentClient {
    /// What [`skiff_client::node_api::AgentEndpoint::of_node_as`] takes.
    pub fn access(&self) -> skiff_client::node_api::AgentAccess<'_> {
        skiff_client::node_api::AgentAccess {
            ca_pem: Some(&self.ca_pem),
            identity: Some(&self.identity),
            preferred_address_types: (!self.preferred_address_types.is_empty())
                .then_some(&self.preferred_address_types[..]),
        }
    }
}
