//! rustls configurations (ring provider) for Skiff's listeners and clients.
//!
//! A server built by [`server_config`] *asks* for a client certificate and checks only that
//! the client holds its key (the handshake signature); whether the certificate chains to the
//! cluster CA is the authenticator's question ([`verify_chain`]), so a certificate of another
//! CA, or an expired one, gets Kubernetes' 401 instead of a failed handshake, and a client
//! without a certificate can still use a bearer token.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::{Identity, PkiError, Usage, pem_certificates};

/// The crypto provider every Skiff TLS configuration uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn algorithms() -> WebPkiSupportedAlgorithms {
    rustls::crypto::ring::default_provider().signature_verification_algorithms
}

/// The certificates of a PEM text, for rustls.
pub fn certs(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    Ok(pem_certificates(pem, what)?
        .into_iter()
        .map(CertificateDer::from)
        .collect())
}

/// The first private key of a PEM text, for rustls.
pub fn key(pem: &str, what: &str) -> Result<PrivateKeyDer<'static>, PkiError> {
    rustls_pemfile::private_key(&mut pem.as_bytes())
        .map_err(|e| PkiError::BadPem {
            what: what.into(),
            kind: "private key",
            reason: e.to_string(),
        })?
        .ok_or_else(|| PkiError::BadPem {
            what: what.into(),
            kind: "private key",
            reason: "no PRIVATE KEY block".into(),
        })
}

/// Checks that `end_entity` (DER) chains to a CA of `ca_pem` through `intermediates`, is
/// valid now and is allowed for `usage`; the error is webpki's reason (`UnknownIssuer`,
/// `CertExpired`, …).
pub fn verify_chain_for(
    ca_pem: &str,
    end_entity: &[u8],
    intermediates: &[CertificateDer<'_>],
    usage: Usage,
) -> Result<(), String> {
    let roots = certs(ca_pem, "the CA").map_err(|e| e.to_string())?;
    let anchors = roots
        .iter()
        .map(|r| webpki::anchor_from_trusted_cert(r).map_err(|e| format!("{e:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    let der = CertificateDer::from(end_entity);
    let ee = webpki::EndEntityCert::try_from(&der).map_err(|e| format!("{e:?}"))?;
    let usage = match usage {
        Usage::Client => webpki::KeyUsage::client_auth(),
        Usage::Server | Usage::Peer => webpki::KeyUsage::server_auth(),
    };
    ee.verify_for_usage(
        algorithms().all,
        &anchors,
        intermediates,
        UnixTime::now(),
        usage,
        None,
        None,
    )
    .map(|_| ())
    .map_err(|e| format!("{e:?}"))
}

/// [`verify_chain_for`] of a certificate of either usage (the bootstrap's "is this leaf ours").
pub fn verify_chain(
    ca_pem: &str,
    end_entity: &[u8],
    intermediates: &[CertificateDer<'_>],
) -> Result<(), String> {
    verify_chain_for(ca_pem, end_entity, intermediates, Usage::Client)
        .or_else(|_| verify_chain_for(ca_pem, end_entity, intermediates, Usage::Server))
}

/// Asks for a client certificate, accepts any whose key the client proves it holds, and
/// leaves the chain to the authenticator (see the module docs).
#[derive(Debug)]
struct RequestClientCert {
    hints: Vec<DistinguishedName>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The serving certificate a server presents, replaceable while it runs (renewal): every new
/// handshake gets the current one.
#[derive(Debug)]
pub struct ServingCert {
    current: std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>,
}

fn certified(serving: &Identity) -> Result<Arc<rustls::sign::CertifiedKey>, PkiError> {
    rustls::sign::CertifiedKey::from_der(
        certs(&serving.cert_pem, "the serving certificate")?,
        key(&serving.key_pem, "the serving key")?,
        &provider(),
    )
    .map(Arc::new)
    .map_err(|e| PkiError::Tls(e.to_string()))
}

impl ServingCert {
    pub fn new(serving: &Identity) -> Result<Arc<ServingCert>, PkiError> {
        Ok(Arc::new(ServingCert {
            current: std::sync::RwLock::new(certified(serving)?),
        }))
    }

    /// Serves `serving` from the next handshake on.
    pub fn replace(&self, serving: &Identity) -> Result<(), PkiError> {
        let new = certified(serving)?;
        if let Ok(mut c) = self.current.write() {
            *c = new;
        }
        Ok(())
    }
}

impl rustls::server::ResolvesServerCert for ServingCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.current.read().ok().map(|c| Arc::clone(&c))
    }
}

/// A server configuration serving `serving`, offering HTTP/2 and HTTP/1.1, and asking for a
/// client certificate with the CAs of `client_ca_pem` as hints (none: no client
/// certificates).
pub fn server_config(
    serving: &Identity,
    client_ca_pem: Option<&str>,
) -> Result<rustls::ServerConfig, PkiError> {
    server_config_with(ServingCert::new(serving)?, client_ca_pem)
}

/// [`server_config`] presenting whatever `serving` holds at each handshake.
pub fn server_config_with(
    serving: Arc<ServingCert>,
    client_ca_pem: Option<&str>,
) -> Result<rustls::ServerConfig, PkiError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| PkiError::Tls(e.to_string()))?;
    let builder = match client_ca_pem {
        Some(ca) => {
            let hints = pem_certificates(ca, "the client CA")?
                .iter()
                .map(|der| {
                    crate::parse(der, "the client CA").map(|_| {
                        // The subject's DER, as a hint of whom to ask certificates of.
                        x509_parser::parse_x509_certificate(der)
                            .map(|(_, c)| DistinguishedName::from(c.subject().as_raw().to_vec()))
                            .unwrap_or_else(|_| DistinguishedName::from(Vec::new()))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            builder.with_client_cert_verifier(Arc::new(RequestClientCert {
                hints,
                algorithms: algorithms(),
            }))
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(serving);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// A client configuration trusting only `ca_pem`, presenting `identity` if given.
pub fn client_config(
    ca_pem: &str,
    identity: Option<&Identity>,
) -> Result<rustls::ClientConfig, PkiError> {
    let mut roots = rustls::RootCertStore::empty();
    let cas = certs(ca_pem, "the CA")?;
    if cas.is_empty() {
        return Err(PkiError::BadPem {
            what: "the CA".into(),
            kind: "certificate",
            reason: "no CERTIFICATE block".into(),
        });
    }
    for c in cas {
        roots
            .add(c)
            .map_err(|e| PkiError::Tls(format!("the CA: {e}")))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| PkiError::Tls(e.to_string()))?
        .with_root_certificates(roots);
    match identity {
        Some(id) => builder
            .with_client_auth_cert(
                certs(&id.cert_pem, "the client certificate")?,
                key(&id.key_pem, "the client key")?,
            )
            .map_err(|e| PkiError::Tls(e.to_string())),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// A server certificate check by pin instead of by CA: `Some(hash)` trusts exactly the
/// certificate whose [`crate::cert_hash`] it is (a node agent's, as its Node publishes it);
/// `None` accepts any certificate, for fetching a chain whose CA the caller then pins
/// (`skiff-node join`). Either way the handshake signatures are checked, so the server holds
/// the key of the certificate it presented.
#[derive(Debug)]
struct ServerPin {
    pinned: Option<String>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for ServerPin {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match &self.pinned {
            Some(pin) if crate::cert_hash(end_entity) != *pin => {
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::ApplicationVerificationFailure,
                ))
            }
            _ => Ok(rustls::client::danger::ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A client configuration that trusts only the server certificate hashing to `pinned`
/// (`sha256:<hex>`), or any certificate when `pinned` is `None` (see [`ServerPin`]),
/// presenting `identity` if given: how the API server and the CLI talk to a node agent, and
/// how `skiff-node join` fetches the chain it pins.
pub fn pinned_client_config(
    pinned: Option<&str>,
    identity: Option<&Identity>,
) -> Result<rustls::ClientConfig, PkiError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| PkiError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ServerPin {
            pinned: pinned.map(String::from),
            algorithms: algorithms(),
        }));
    match identity {
        Some(id) => builder
            .with_client_auth_cert(
                certs(&id.cert_pem, "the client certificate")?,
                key(&id.key_pem, "the client key")?,
            )
            .map_err(|e| PkiError::Tls(e.to_string())),
        None => Ok(builder.with_no_client_auth()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Ca, LeafSpec};

    #[test]
    fn chains_are_checked_against_the_right_ca_and_usage() {
        let ca = Ca::generate("a").unwrap();
        let other = Ca::generate("b").unwrap();
        let client = ca.issue(&LeafSpec::client("u", &[])).unwrap();
        let der = pem_certificates(&client.cert_pem, "c").unwrap().remove(0);
        verify_chain_for(ca.cert_pem(), &der, &[], Usage::Client).unwrap();
        let e = verify_chain_for(other.cert_pem(), &der, &[], Usage::Client).unwrap_err();
        assert!(e.contains("UnknownIssuer"), "{e}");
        let e = verify_chain_for(ca.cert_pem(), &der, &[], Usage::Server).unwrap_err();
        assert!(!e.is_empty());
        verify_chain(ca.cert_pem(), &der, &[]).unwrap();
    }

    #[test]
    fn configs_build_from_issued_material() {
        let ca = Ca::generate("a").unwrap();
        let serving = ca
            .issue(&LeafSpec::server("s", &["localhost".into()]))
            .unwrap();
        let s = server_config(&serving, Some(ca.cert_pem())).unwrap();
        assert_eq!(s.alpn_protocols[0], b"h2");
        server_config(&serving, None).unwrap();
        let id = ca.issue(&LeafSpec::client("u", &[])).unwrap();
        client_config(ca.cert_pem(), Some(&id)).unwrap();
        client_config(ca.cert_pem(), None).unwrap();
        assert!(client_config("junk", None).is_err());
    }
}
