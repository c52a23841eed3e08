//! The agent API's TLS: its serving certificate (one of the cluster CA for the node's
//! addresses, [`super::serving`]; there is no self-signed or pinned one) and client
//! certificates of the cluster CA.

use std::sync::Arc;

/// The agent API's TLS: its serving certificate and the CA client certificates must chain to.
#[derive(Clone)]
pub struct AgentTls {
    pub(super) acceptor: tokio_rustls::TlsAcceptor,
    pub(super) client_ca_pem: Arc<str>,
    /// What is served; replaced on renewal.
    pub(super) serving: Arc<skiff_pki::tls::ServingCert>,
}

impl std::fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTls").finish_non_exhaustive()
    }
}

impl AgentTls {
    /// TLS serving `serving` (a certificate of the cluster CA), replaced
    /// through [`AgentTls::replace`].
    pub fn serving(
        serving: &skiff_pki::Identity,
        client_ca_pem: &str,
    ) -> Result<AgentTls, skiff_pki::PkiError> {
        let cert = skiff_pki::tls::ServingCert::new(serving)?;
        let mut config =
            skiff_pki::tls::server_config_with(Arc::clone(&cert), Some(client_ca_pem))?;
        // The agent serves HTTP/1.1 only (port-forward is an HTTP/1.1 upgrade).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(AgentTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            client_ca_pem: client_ca_pem.into(),
            serving: cert,
        })
    }

    /// What is served, for renewal to replace.
    pub fn serving_cert(&self) -> Arc<skiff_pki::tls::ServingCert> {
        Arc::clone(&self.serving)
    }
}
