//! The agent API's TLS: its serving certificate (one of the cluster CA, [`super::serving`];
//! or, on loopback, a self-signed one kept in `<state>/pki`, made anew near expiry, its hash
//! published in the Node) and client certificates of the cluster CA.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

/// The agent API's TLS: its serving certificate and the CA client certificates must chain to.
#[derive(Clone)]
pub struct AgentTls {
    pub(super) acceptor: tokio_rustls::TlsAcceptor,
    pub(super) client_ca_pem: Arc<str>,
    /// `sha256:<hex>` of a self-signed serving certificate (published in the Node for
    /// clients to pin); `None` for one of the cluster CA.
    pub cert_hash: Option<String>,
    /// What is served; replaced on renewal.
    pub(super) serving: Arc<skiff_pki::tls::ServingCert>,
}

impl std::fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTls")
            .field("cert_hash", &self.cert_hash)
            .finish_non_exhaustive()
    }
}

impl AgentTls {
    /// The self-signed serving certificate of node `node` kept in `dir` (`agent-serving.crt`
    /// and `.key`, 0600), made anew when missing, unreadable or within 90 days of expiry, so
    /// the pin its Node publishes stays the same across restarts; clients must present
    /// certificates of `client_ca_pem`.
    pub fn load_or_create(
        dir: &Path,
        node: &str,
        client_ca_pem: &str,
    ) -> Result<AgentTls, skiff_pki::PkiError> {
        let (crt, key) = (dir.join("agent-serving.crt"), dir.join("agent-serving.key"));
        let current = match (std::fs::read_to_string(&crt), std::fs::read_to_string(&key)) {
            (Ok(cert_pem), Ok(key_pem)) => {
                skiff_pki::parse_pem(&cert_pem, "the agent's certificate")
                    .ok()
                    .filter(|info| {
                        info.common_name == format!("system:node:{node}")
                            && !info.expires_within(SystemTime::now(), skiff_pki::RENEW_BEFORE)
                    })
                    .map(|_| skiff_pki::Identity { cert_pem, key_pem })
            }
            _ => None,
        };
        let serving = match current {
            Some(id) => id,
            None => {
                let id = skiff_pki::self_signed(&skiff_pki::LeafSpec::server(
                    &format!("system:node:{node}"),
                    &["127.0.0.1".to_string(), "localhost".to_string()],
                ))?;
                std::fs::create_dir_all(dir).map_err(|source| skiff_pki::PkiError::Io {
                    action: "create",
                    path: dir.display().to_string(),
                    source,
                })?;
                skiff_pki::bootstrap::write_private(&key, id.key_pem.as_bytes())?;
                skiff_pki::bootstrap::write_private(&crt, id.cert_pem.as_bytes())?;
                id
            }
        };
        let der = skiff_pki::pem_certificates(&serving.cert_pem, "the agent's certificate")?
            .into_iter()
            .next()
            .ok_or_else(|| skiff_pki::PkiError::Tls("no certificate made".into()))?;
        let mut tls = AgentTls::serving(&serving, client_ca_pem)?;
        tls.cert_hash = Some(skiff_pki::cert_hash(&der));
        Ok(tls)
    }

    /// TLS serving `serving` (a certificate of the cluster CA: nothing is pinned), replaced
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
            cert_hash: None,
            serving: cert,
        })
    }

    /// What is served, for renewal to replace.
    pub fn serving_cert(&self) -> Arc<skiff_pki::tls::ServingCert> {
        Arc::clone(&self.serving)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serving_certificate_outlives_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let ca = skiff_pki::Ca::generate("ca").unwrap();
        let a = AgentTls::load_or_create(dir.path(), "n1", ca.cert_pem()).unwrap();
        let b = AgentTls::load_or_create(dir.path(), "n1", ca.cert_pem()).unwrap();
        assert_eq!(
            a.cert_hash, b.cert_hash,
            "a restart keeps the pinned certificate"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("agent-serving.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        // Another node's name (a reused state directory) gets a new one.
        let c = AgentTls::load_or_create(dir.path(), "n2", ca.cert_pem()).unwrap();
        assert_ne!(a.cert_hash, c.cert_hash);
        // So does a damaged file.
        std::fs::write(dir.path().join("agent-serving.crt"), "junk").unwrap();
        let d = AgentTls::load_or_create(dir.path(), "n2", ca.cert_pem()).unwrap();
        assert_ne!(c.cert_hash, d.cert_hash);
    }
}
