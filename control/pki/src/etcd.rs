//! The PKI of a cluster's etcd, made once and reused (as kubeadm lays out `pki/etcd`):
//!
//! ```text
//! <dir>/ca.crt, ca.key                    the etcd CA (its own: not the cluster CA, so no
//!                                         user's or node's certificate reaches etcd)
//! <dir>/<member>.crt, <member>.key        a member's certificate, for clients and peers
//!                                         alike (server and client usage; SANs given)
//! <dir>/apiserver-etcd-client.crt, .key   the API server's client certificate
//! ```
//!
//! Keys are 0600 in a 0700 directory ([`crate::files`]). A member's certificate is issued
//! again when missing, not signed by the CA, due for renewal or lacking a SAN now asked for;
//! the CA is never replaced.

use std::path::{Path, PathBuf};

use crate::bootstrap::{write_private, write_public};
use crate::{Ca, Identity, LeafSpec, PkiError, Usage};

/// The CN of the API server's etcd client certificate.
pub const CLIENT_NAME: &str = "apiserver-etcd-client";

/// An etcd PKI directory.
#[derive(Debug, Clone)]
pub struct EtcdPki {
    dir: PathBuf,
}

/// The files of one identity (a member or the client), with the CA's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl EtcdPki {
    pub fn new(dir: impl Into<PathBuf>) -> EtcdPki {
        EtcdPki { dir: dir.into() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn files(&self, name: &str) -> EtcdFiles {
        EtcdFiles {
            ca: self.path("ca.crt"),
            cert: self.path(&format!("{name}.crt")),
            key: self.path(&format!("{name}.key")),
        }
    }

    /// The API server's client files.
    pub fn client(&self) -> EtcdFiles {
        self.files(CLIENT_NAME)
    }

    /// A member's files.
    pub fn member(&self, name: &str) -> EtcdFiles {
        self.files(name)
    }

    /// Creates what is missing: the CA, a certificate per member in `members` (valid for
    /// `sans`), the API server's client certificate; renews what is due. Returns the paths
    /// written.
    pub fn ensure(&self, members: &[&str], sans: &[String]) -> Result<Vec<PathBuf>, PkiError> {
        crate::files::private_dir(&self.dir).map_err(|source| PkiError::Io {
            action: "create",
            path: self.dir.display().to_string(),
            source,
        })?;
        let mut written = Vec::new();
        let (ca_crt, ca_key) = (self.path("ca.crt"), self.path("ca.key"));
        let ca = if ca_crt.exists() || ca_key.exists() {
            Ca::from_pem(&read(&ca_crt)?, &read(&ca_key)?)?
        } else {
            let ca = Ca::generate("skiff-etcd-ca")?;
            write_private(&ca_key, ca.key_pem().as_bytes())?;
            write_public(&ca_crt, ca.cert_pem().as_bytes())?;
            written.extend([ca_key, ca_crt]);
            ca
        };
        let mut leaves: Vec<(String, LeafSpec)> = members
            .iter()
            .map(|m| {
                let mut spec = LeafSpec::server(m, sans);
                spec.usage = Usage::Peer;
                (m.to_string(), spec)
            })
            .collect();
        leaves.push((CLIENT_NAME.into(), LeafSpec::client(CLIENT_NAME, &[])));
        for (name, spec) in leaves {
            let files = self.files(&name);
            let current = match (
                std::fs::read_to_string(&files.cert),
                std::fs::read_to_string(&files.key),
            ) {
                (Ok(cert_pem), Ok(_)) => {
                    crate::bootstrap::leaf_is_current(&ca, &cert_pem)
                        && (spec.usage == Usage::Client
                            || crate::bootstrap::covers(&cert_pem, &spec.sans))
                }
                _ => false,
            };
            if current {
                continue;
            }
            let Identity { cert_pem, key_pem } = ca.issue(&spec)?;
            write_private(&files.key, key_pem.as_bytes())?;
            write_public(&files.cert, cert_pem.as_bytes())?;
            written.extend([files.key, files.cert]);
        }
        Ok(written)
    }
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Io {
        action: "read",
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_etcd_pki_of_its_own_made_once_private_and_extended() {
        let dir = tempfile::tempdir().unwrap();
        let pki = EtcdPki::new(dir.path().join("etcd"));
        let sans = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        let first = pki.ensure(&["etcd-1", "etcd-2"], &sans).unwrap();
        assert_eq!(first.len(), 2 + 2 * 3);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir.path().join("etcd")), 0o700);
        for f in [pki.member("etcd-1"), pki.client()] {
            assert_eq!(mode(&f.key), 0o600);
            let cert = std::fs::read_to_string(&f.cert).unwrap();
            let ca = std::fs::read_to_string(&f.ca).unwrap();
            let der = crate::pem_certificates(&cert, "leaf").unwrap().remove(0);
            crate::tls::verify_chain_for(
                &ca,
                &rustls::pki_types::CertificateDer::from(der),
                &[],
                Usage::Client,
            )
            .unwrap();
        }
        // A member's certificate also serves; the client's does not.
        let member = std::fs::read_to_string(pki.member("etcd-1").cert).unwrap();
        let ca = std::fs::read_to_string(pki.client().ca).unwrap();
        let der = crate::pem_certificates(&member, "m").unwrap().remove(0);
        crate::tls::verify_chain_for(
            &ca,
            &rustls::pki_types::CertificateDer::from(der),
            &[],
            Usage::Server,
        )
        .unwrap();
        let client = std::fs::read_to_string(pki.client().cert).unwrap();
        let der = crate::pem_certificates(&client, "c").unwrap().remove(0);
        assert!(
            crate::tls::verify_chain_for(
                &ca,
                &rustls::pki_types::CertificateDer::from(der),
                &[],
                Usage::Server,
            )
            .is_err()
        );
        // Nothing changes on a second run; a new member gets its own certificate only.
        assert!(pki.ensure(&["etcd-1", "etcd-2"], &sans).unwrap().is_empty());
        let third = pki.ensure(&["etcd-1", "etcd-2", "etcd-3"], &sans).unwrap();
        assert_eq!(
            third,
            vec![pki.member("etcd-3").key, pki.member("etcd-3").cert]
        );
    }
}
