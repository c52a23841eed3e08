//! What every REST request shares: the registry, the authorizer, the keys and clients the
//! handlers need ([`Rest`], the router's state).

use std::sync::Arc;

use crate::registry::Registry;

/// What every REST request shares.
#[derive(Debug, Clone)]
pub(crate) struct Rest {
    pub registry: Arc<Registry>,
    /// `None`: every request is allowed (in-process servers without authentication).
    pub authorizer: Option<Arc<crate::auth::authz::Authorizer>>,
    /// Signs ServiceAccount tokens (TokenRequest) and is published as the JWKS.
    pub sa_key: Option<Arc<skiff_pki::sa_token::SigningKey>>,
    /// How node agents are spoken to.
    pub agent_client: Option<super::agent_client::AgentClient>,
    /// The metrics API's samples of the agents' counters.
    pub metrics: Arc<super::metrics::Sampler>,
    /// Where snapshots are written before they are sent (`None`: refused).
    pub snapshot_dir: Option<std::path::PathBuf>,
    /// Aggregated APIs (`None` in tests that build a router alone).
    pub aggregator: Option<Arc<crate::aggregator::Aggregator>>,
}
