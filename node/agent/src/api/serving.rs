//! The agent API's serving certificate from the cluster CA, as the kubelet's
//! `serverTLSBootstrap` gets it: a new key and a CertificateSigningRequest for
//! `system:node:<node>` (signer `kubernetes.io/kubelet-serving`) whose subject alternative
//! names are the addresses the Node publishes, sent as the node itself. The controller
//! manager approves it only for that Node's own addresses and signs it; callers (the API
//! server, `skiff`) verify it against the cluster CA and the address they dial, so no
//! certificate is pinned anywhere.
//!
//! The certificate and key are kept in `<state>/pki/agent-serving.{crt,key}` (0600) and
//! reused across restarts while they chain to the cluster CA, name this node and exactly these
//! addresses, and are not within [`skiff_pki::RENEW_BEFORE`] of expiry. [`renew_when_due`]
//! replaces them in the background; the listener serves the new one from the next handshake.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use skiff_client::Client;
use skiff_pki::Identity;
use skiff_pki::tls::ServingCert;

use crate::join::{self, JoinError, NodeCert};

const CERT_FILE: &str = "agent-serving.crt";
const KEY_FILE: &str = "agent-serving.key";

/// Where the serving certificate is kept and what it must say.
#[derive(Debug, Clone)]
pub(crate) struct ServingSpec {
    /// `<state>/pki`.
    pub dir: PathBuf,
    pub node: String,
    /// The node's addresses: the certificate's subject alternative names.
    pub sans: Vec<String>,
    /// The cluster CA the certificate must chain to.
    pub ca_pem: Arc<str>,
}

impl ServingSpec {
    /// The kept certificate, if it is still the right one (see the module docs).
    pub fn current(&self) -> Option<Identity> {
        let cert_pem = std::fs::read_to_string(self.dir.join(CERT_FILE)).ok()?;
        let key_pem = std::fs::read_to_string(self.dir.join(KEY_FILE)).ok()?;
        let identity = Identity { cert_pem, key_pem };
        self.is_current(&identity).then_some(identity)
    }

    fn is_current(&self, id: &Identity) -> bool {
        let Ok(info) = skiff_pki::parse_pem(&id.cert_pem, "the agent's serving certificate") else {
            return false;
        };
        let Some(der) = skiff_pki::pem_certificates(&id.cert_pem, "the serving certificate")
            .ok()
            .and_then(|c| c.into_iter().next())
        else {
            return false;
        };
        let mut have = info.sans.clone();
        let mut want = self.sans.clone();
        have.sort();
        want.sort();
        info.common_name == format!("system:node:{}", self.node)
            && have == want
            && !info.expires_within(SystemTime::now(), skiff_pki::RENEW_BEFORE)
            && skiff_pki::tls::verify_chain_for(&self.ca_pem, &der, &[], skiff_pki::Usage::Server)
                .is_ok()
    }

    fn write(&self, id: &Identity) -> Result<(), JoinError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| {
            JoinError::Pki(skiff_pki::PkiError::Io {
                action: "create",
                path: self.dir.display().to_string(),
                source,
            })
        })?;
        skiff_pki::bootstrap::write_private(&self.dir.join(KEY_FILE), id.key_pem.as_bytes())?;
        skiff_pki::bootstrap::write_private(&self.dir.join(CERT_FILE), id.cert_pem.as_bytes())?;
        Ok(())
    }

    /// A new certificate through a CertificateSigningRequest sent by `client` (the node's
    /// own identity), written to the state directory; the request's name with it.
    pub async fn request(
        &self,
        client: &Client,
        timeout: Duration,
    ) -> Result<(Identity, String), JoinError> {
        let (id, name) = join::request_certificate(
            client,
            &self.node,
            NodeCert::Serving { sans: &self.sans },
            timeout,
        )
        .await?;
        self.write(&id)?;
        Ok((id, name))
    }

    /// The kept certificate, or a new one: requests are retried every `retry` until one is
    /// issued (the controller manager may start after the agent).
    pub async fn obtain(&self, client: &Client, retry: Duration) -> Identity {
        if let Some(id) = self.current() {
            return id;
        }
        loop {
            match self.request(client, join::RENEW_TIMEOUT).await {
                Ok((id, request)) => {
                    tracing::info!(%request, sans = ?self.sans, "got the agent API's serving certificate");
                    return id;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "asking for the agent API's serving certificate failed; trying again")
                }
            }
            tokio::time::sleep(retry).await;
        }
    }
}

/// Checks every `every` whether the served certificate is still current and replaces it
/// with a new one when it is not (near expiry, or the kept files changed). Runs until
/// aborted.
pub(crate) async fn renew_when_due(
    spec: ServingSpec,
    client: Client,
    serving: Arc<ServingCert>,
    every: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        if spec.current().is_some() {
            continue;
        }
        match spec.request(&client, join::RENEW_TIMEOUT).await {
            Ok((id, request)) => match serving.replace(&id) {
                Ok(()) => tracing::info!(%request, "renewed the agent API's serving certificate"),
                Err(e) => tracing::warn!(error = %e, "the renewed serving certificate is unusable"),
            },
            Err(e) => {
                tracing::warn!(error = %e, "renewing the agent API's serving certificate failed; trying again later")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn spec(dir: &Path, ca: &skiff_pki::Ca, sans: &[&str]) -> ServingSpec {
        ServingSpec {
            dir: dir.to_path_buf(),
            node: "n1".into(),
            sans: sans.iter().map(|s| s.to_string()).collect(),
            ca_pem: ca.cert_pem().into(),
        }
    }

    fn issued(ca: &skiff_pki::Ca, cn: &str, sans: &[&str]) -> Identity {
        ca.issue(&skiff_pki::LeafSpec::server(
            cn,
            &sans.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        ))
        .unwrap()
    }

    #[test]
    fn a_kept_certificate_is_reused_only_while_it_is_the_right_one() {
        let dir = tempfile::tempdir().unwrap();
        let ca = skiff_pki::Ca::generate("cluster").unwrap();
        let s = spec(dir.path(), &ca, &["192.168.100.3"]);
        assert!(s.current().is_none(), "nothing kept yet");
        s.write(&issued(&ca, "system:node:n1", &["192.168.100.3"]))
            .unwrap();
        assert!(s.current().is_some());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        // The node moved to another address: a new certificate is needed.
        assert!(
            spec(dir.path(), &ca, &["192.168.100.4"])
                .current()
                .is_none()
        );
        // Another node's name in a reused state directory.
        s.write(&issued(&ca, "system:node:n2", &["192.168.100.3"]))
            .unwrap();
        assert!(s.current().is_none());
        // Signed by another CA, or self-signed.
        let other = skiff_pki::Ca::generate("other").unwrap();
        s.write(&issued(&other, "system:node:n1", &["192.168.100.3"]))
            .unwrap();
        assert!(s.current().is_none());
        let own = skiff_pki::self_signed(&skiff_pki::LeafSpec::server(
            "system:node:n1",
            &["192.168.100.3".to_string()],
        ))
        .unwrap();
        s.write(&own).unwrap();
        assert!(s.current().is_none());
    }
}
