//! Skiff's cluster PKI, the one place certificates and keys are made or read:
//!
//! - [`Ca`]: the cluster CA (ECDSA P-256, 10 years, as k3s makes it) and the leaf
//!   certificates it signs ([`LeafSpec`] → [`Identity`]): serving certificates with their SANs,
//!   client certificates whose CN is the user and whose O entries are the groups, as Kubernetes
//!   reads them.
//! - [`bootstrap`]: a cluster's PKI directory created in one step (CA, the API server's serving
//!   certificate, a kubeconfig per control-plane identity), leaf certificates renewed when they
//!   come within [`RENEW_BEFORE`] of expiry or lack a SAN that is now asked for.
//! - [`kubeconfig`]: the kubeconfig file format, read and written (kubectl's, so one file
//!   serves `kubectl` and every Skiff component).
//! - [`tls`]: rustls configurations: the API server's (client certificates requested, checked
//!   by the authenticator so a bad one is a 401 rather than a failed handshake), clients',
//!   and the serving certificate swapped in for new handshakes when it is renewed.
//! - Certificate requests: [`new_request`] (a key and a PEM CSR), [`new_server_request`]
//!   (the same with SANs, for a serving certificate), [`parse_request`]
//!   (signature checked; CN, O, SANs), [`Ca::sign_request`] (the signer's subject, usage and
//!   validity, never the request's).
//! - [`discovery`]: the CA of a presented chain taken only when its hash is the pinned one
//!   (`skiff-node join --ca-cert-hash`); [`sa_token`]: ServiceAccount tokens; [`etcd`]: the
//!   etcd PKI.
//! - [`files`]: private files (0600 in 0700 directories, whatever the umask; temporaries
//!   beside their destination with random names), for every key, store and snapshot file.
//!
//! Certificates are made by rcgen and parsed by x509-parser; nothing here does I/O except
//! [`bootstrap`], [`kubeconfig`] and [`files`] reading and writing their files. The crate
//! knows nothing of the API's types and does no network I/O (the join's handshake is the
//! agent's).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use sha2::{Digest, Sha256};

pub mod bootstrap;
pub mod discovery;
pub mod etcd;
pub mod files;
pub mod kubeconfig;
pub mod sa_token;
pub mod tls;

pub use bootstrap::{BootstrapOptions, ClusterPki};
pub use kubeconfig::{Kubeconfig, ResolvedKubeconfig};

/// How long the CA is valid (k3s: 10 years).
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a leaf certificate is valid (k3s: 1 year).
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// A leaf certificate this close to expiry is renewed (k3s: 90 days).
pub const RENEW_BEFORE: Duration = Duration::from_secs(90 * 24 * 3600);

/// Why certificate material could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot generate {what}: {source}")]
    Generate {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("{what} is not a valid PEM {kind}: {reason}")]
    BadPem {
        what: String,
        kind: &'static str,
        reason: String,
    },
    #[error("{what} is not a valid X.509 certificate: {reason}")]
    BadCertificate { what: String, reason: String },
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("cannot build the TLS configuration: {0}")]
    Tls(String),
    #[error("the certificate of {user:?} can carry at most {max} groups (O entries)")]
    TooManyGroups { user: String, max: usize },
    #[error("invalid certificate signing request: {reason}")]
    BadRequest { reason: String },
    #[error("{0}")]
    Discovery(String),
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// TLS server authentication (a serving certificate).
    Server,
    /// TLS client authentication (a user's certificate).
    Client,
    /// Both (an etcd member's certificate: it serves clients and peers and connects to its
    /// peers with the same certificate).
    Peer,
}

/// A leaf certificate to issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSpec {
    /// The subject's common name: for a client certificate, the user name.
    pub common_name: String,
    /// The subject's organizations: for a client certificate, the user's groups.
    pub organizations: Vec<String>,
    /// Subject alternative names: DNS names, or IP addresses written as such.
    pub sans: Vec<String>,
    pub usage: Usage,
    pub validity: Duration,
}

impl LeafSpec {
    /// A client certificate for `user` in `groups`, valid for [`LEAF_VALIDITY`].
    pub fn client(user: &str, groups: &[&str]) -> LeafSpec {
        LeafSpec {
            common_name: user.to_string(),
            organizations: groups.iter().map(|g| g.to_string()).collect(),
            sans: Vec::new(),
            usage: Usage::Client,
            validity: LEAF_VALIDITY,
        }
    }

    /// A serving certificate named `common_name` for `sans`, valid for [`LEAF_VALIDITY`].
    pub fn server(common_name: &str, sans: &[String]) -> LeafSpec {
        LeafSpec {
            common_name: common_name.to_string(),
            organizations: Vec::new(),
            sans: sans.to_vec(),
            usage: Usage::Server,
            validity: LEAF_VALIDITY,
        }
    }
}

/// A certificate and its private key, both PEM. `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// The cluster CA: its certificate and the key that signs leaves.
pub struct Ca {
    cert_pem: String,
    cert_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("hash", &spki_hash(&self.cert_der).unwrap_or_default())
            .finish_non_exhaustive()
    }
}

fn generate_err(what: &str) -> impl FnOnce(rcgen::Error) -> PkiError + '_ {
    move |source| PkiError::Generate {
        what: what.to_string(),
        source,
    }
}

/// `not_before` an hour ago (clocks of a cluster's machines differ a little) and `not_after`
/// `validity` from now.
fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + validity;
}

impl Ca {
    /// A new CA named `common_name`, valid for [`CA_VALIDITY`].
    pub fn generate(common_name: &str) -> Result<Ca, PkiError> {
        let key = KeyPair::generate().map_err(generate_err("the CA key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, CA_VALIDITY);
        let cert = params
            .self_signed(&key)
            .map_err(generate_err("the CA certificate"))?;
        Ca::from_pem(&cert.pem(), &key.serialize_pem())
    }

    /// The CA from its certificate and key, both PEM.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::BadPem {
            what: "the CA key".into(),
            kind: "private key",
            reason: e.to_string(),
        })?;
        let cert_der = pem_certificates(cert_pem, "the CA certificate")?
            .into_iter()
            .next()
            .ok_or_else(|| PkiError::BadPem {
                what: "the CA certificate".into(),
                kind: "certificate",
                reason: "no CERTIFICATE block".into(),
            })?;
        let issuer = Issuer::from_ca_cert_der(&cert_der.clone().into(), key).map_err(|e| {
            PkiError::BadCertificate {
                what: "the CA certificate".into(),
                reason: e.to_string(),
            }
        })?;
        Ok(Ca {
            cert_pem: cert_pem.to_string(),
            cert_der,
            issuer,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key, PEM (for writing it to its file).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// `sha256:<hex>` of the CA certificate's SubjectPublicKeyInfo: what `skiff-node join
    /// --ca-cert-hash` pins (kubeadm's `--discovery-token-ca-cert-hash`).
    pub fn hash(&self) -> Result<String, PkiError> {
        spki_hash(&self.cert_der)
    }

    /// Issues a leaf certificate with a new key.
    pub fn issue(&self, spec: &LeafSpec) -> Result<Identity, PkiError> {
        let key = KeyPair::generate().map_err(generate_err("a key"))?;
        let cert = leaf_params(spec)?
            .signed_by(&key, &self.issuer)
            .map_err(generate_err(&format!(
                "the certificate of {:?}",
                spec.common_name
            )))?;
        Ok(Identity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Signs the public key of a certificate signing request (PEM, its signature checked)
    /// with what `spec` says, not what the request asks for: the subject, usage and validity
    /// are the signer's decision (the caller checked the request against them).
    pub fn sign_request(&self, request_pem: &str, spec: &LeafSpec) -> Result<String, PkiError> {
        let mut csr =
            rcgen::CertificateSigningRequestParams::from_pem(request_pem).map_err(|e| {
                PkiError::BadRequest {
                    reason: e.to_string(),
                }
            })?;
        csr.params = leaf_params(spec)?;
        let cert = csr.signed_by(&self.issuer).map_err(generate_err(&format!(
            "the certificate of {:?}",
            spec.common_name
        )))?;
        Ok(cert.pem())
    }
}

/// The certificate parameters of a leaf: subject, SANs, usages, validity.
fn leaf_params(spec: &LeafSpec) -> Result<CertificateParams, PkiError> {
    let mut params =
        CertificateParams::new(spec.sans.clone()).map_err(generate_err("the SAN list"))?;
    params.distinguished_name = subject(&spec.common_name, &spec.organizations)?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = match spec.usage {
        Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
        Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        Usage::Peer => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    };
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, spec.validity);
    Ok(params)
}

/// A subject of `common_name` with `organizations` as O entries.
fn subject(common_name: &str, organizations: &[String]) -> Result<DistinguishedName, PkiError> {
    let mut dn = DistinguishedName::new();
    // rcgen keeps one value per attribute type, so a second O goes in under the same OID
    // spelled as a custom type; more than two groups cannot be written.
    let o_types = [
        DnType::OrganizationName,
        DnType::CustomDnType(vec![2, 5, 4, 10]),
    ];
    if organizations.len() > o_types.len() {
        return Err(PkiError::TooManyGroups {
            user: common_name.to_string(),
            max: o_types.len(),
        });
    }
    for (o, ty) in organizations.iter().zip(o_types) {
        dn.push(ty, o.as_str());
    }
    dn.push(DnType::CommonName, common_name);
    Ok(dn)
}

/// A self-signed serving certificate (a node agent's: its clients pin the
/// certificate's hash, [`cert_hash`], which the agent publishes in its Node object).
pub fn self_signed(spec: &LeafSpec) -> Result<Identity, PkiError> {
    let key = KeyPair::generate().map_err(generate_err("a key"))?;
    let cert = leaf_params(spec)?
        .self_signed(&key)
        .map_err(generate_err(&format!(
            "the certificate of {:?}",
            spec.common_name
        )))?;
    Ok(Identity {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// `sha256:<hex>` of a whole DER certificate (what a pinned client compares).
pub fn cert_hash(der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(der)))
}

/// A certificate signing request, read and its signature checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    pub common_name: String,
    pub organizations: Vec<String>,
    /// DNS names and IP addresses asked for.
    pub sans: Vec<String>,
    /// Whether the request asks to be a CA.
    pub is_ca: bool,
}

/// Reads a PEM certificate signing request (`CERTIFICATE REQUEST`), checking its signature.
pub fn parse_request(pem: &str) -> Result<RequestInfo, PkiError> {
    let bad = |reason: String| PkiError::BadRequest { reason };
    use x509_parser::prelude::FromDer;
    let der = rustls_pemfile::csr(&mut pem.as_bytes())
        .ok()
        .flatten()
        .ok_or_else(|| bad("no PEM CERTIFICATE REQUEST block".to_string()))?;
    let csr = rcgen::CertificateSigningRequestParams::from_der(&der).map_err(|e| {
        bad(match e {
            rcgen::Error::CouldNotParseCertificationRequest => {
                "not a valid CERTIFICATE REQUEST".to_string()
            }
            e => e.to_string(),
        })
    })?;
    // rcgen keeps one value per attribute type: read the subject with x509-parser.
    let (_, parsed) =
        x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
            .map_err(|e| bad(e.to_string()))?;
    let (common_name, organizations) = names_of(&parsed.certification_request_info.subject);
    let sans = csr
        .params
        .subject_alt_names
        .iter()
        .map(|s| match s {
            rcgen::SanType::DnsName(d) => d.to_string(),
            rcgen::SanType::IpAddress(ip) => ip.to_string(),
            other => format!("{other:?}"),
        })
        .collect();
    Ok(RequestInfo {
        common_name,
        organizations,
        sans,
        is_ca: !matches!(csr.params.is_ca, IsCa::NoCa | IsCa::ExplicitNoCa),
    })
}

/// A new key and a certificate signing request for `common_name` in `organizations`
/// (what `skiff-node join` sends): `(key PEM, request PEM)`.
pub fn new_request(
    common_name: &str,
    organizations: &[String],
) -> Result<(String, String), PkiError> {
    request(CertificateParams::default(), common_name, organizations)
}

/// A new key and a certificate signing request for a serving certificate: `common_name` in
/// `organizations` with the subject alternative names `sans` (an IP address written as such
/// becomes an IP SAN, anything else a DNS name): `(key PEM, request PEM)`. A node agent's
/// request to the `kubernetes.io/kubelet-serving` signer.
pub fn new_server_request(
    common_name: &str,
    organizations: &[String],
    sans: &[String],
) -> Result<(String, String), PkiError> {
    let params = CertificateParams::new(sans.to_vec()).map_err(generate_err("the SAN list"))?;
    request(params, common_name, organizations)
}

/// A new key and a certificate signing request of `params` with the subject `common_name`
/// in `organizations`.
fn request(
    mut params: CertificateParams,
    common_name: &str,
    organizations: &[String],
) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(generate_err("a key"))?;
    params.distinguished_name = subject(common_name, organizations)?;
    let csr = params
        .serialize_request(&key)
        .map_err(generate_err("the certificate signing request"))?;
    let pem = csr
        .pem()
        .map_err(generate_err("the certificate signing request"))?;
    Ok((key.serialize_pem(), pem))
}

/// Every CERTIFICATE block of a PEM text, DER.
pub fn pem_certificates(pem: &str, what: &str) -> Result<Vec<Vec<u8>>, PkiError> {
    rustls_pemfile::certs(&mut pem.as_bytes())
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::BadPem {
            what: what.to_string(),
            kind: "certificate",
            reason: e.to_string(),
        })
}

/// `sha256:<hex>` of a DER certificate's SubjectPublicKeyInfo.
pub fn spki_hash(cert_der: &[u8]) -> Result<String, PkiError> {
    let info = parse(cert_der, "the certificate")?;
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(&info.spki_der))
    ))
}

/// What Skiff reads off a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The subject's first common name.
    pub common_name: String,
    /// The subject's organizations, in order.
    pub organizations: Vec<String>,
    /// DNS names and IP addresses of the SAN extension (IPs in their text form).
    pub sans: Vec<String>,
    /// Seconds since the epoch.
    pub not_before: i64,
    pub not_after: i64,
    /// Whether the certificate is a CA.
    pub is_ca: bool,
    /// The DER SubjectPublicKeyInfo.
    pub spki_der: Vec<u8>,
}

impl CertInfo {
    /// Whether the certificate expires within `within` of `now`.
    pub fn expires_within(&self, now: SystemTime, within: Duration) -> bool {
        let now = now
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        self.not_after - now <= within.as_secs() as i64
    }
}

/// A subject's first common name and its organizations (a user and its groups).
fn names_of(subject: &x509_parser::x509::X509Name<'_>) -> (String, Vec<String>) {
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let organizations = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(String::from))
        .collect();
    (common_name, organizations)
}

/// Reads a DER certificate (`what` names it in errors).
pub fn parse(der: &[u8], what: &str) -> Result<CertInfo, PkiError> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| PkiError::BadCertificate {
            what: what.to_string(),
            reason: e.to_string(),
        })?;
    let (common_name, organizations) = names_of(cert.subject());
    let mut sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                GeneralName::DNSName(d) => sans.push(d.to_string()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => sans.push(std::net::Ipv4Addr::from([b[0], b[1], b[2], b[3]]).to_string()),
                    16 => {
                        let mut a = [0u8; 16];
                        a.copy_from_slice(b);
                        sans.push(std::net::Ipv6Addr::from(a).to_string())
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        common_name,
        organizations,
        sans,
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        is_ca: cert.is_ca(),
        spki_der: cert.public_key().raw.to_vec(),
    })
}

/// Reads the first certificate of a PEM text.
pub fn parse_pem(pem: &str, what: &str) -> Result<CertInfo, PkiError> {
    let der = pem_certificates(pem, what)?
        .into_iter()
        .next()
        .ok_or_else(|| PkiError::BadPem {
            what: what.to_string(),
            kind: "certificate",
            reason: "no CERTIFICATE block".into(),
        })?;
    parse(&der, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_checked_and_signed_as_the_signer_decides() {
        let ca = Ca::generate("skiff-ca").unwrap();
        let groups = vec!["system:nodes".to_string()];
        let (key, req) = new_request("system:node:n2", &groups).unwrap();
        let info = parse_request(&req).unwrap();
        assert_eq!(info.common_name, "system:node:n2");
        assert_eq!(info.organizations, groups);
        assert!(info.sans.is_empty() && !info.is_ca);
        let cert = ca
            .sign_request(&req, &LeafSpec::client("system:node:n2", &["system:nodes"]))
            .unwrap();
        let leaf = parse_pem(&cert, "leaf").unwrap();
        assert_eq!(leaf.common_name, "system:node:n2");
        assert_eq!(leaf.organizations, groups);
        let der = pem_certificates(&cert, "leaf").unwrap().remove(0);
        tls::verify_chain_for(
            ca.cert_pem(),
            &rustls::pki_types::CertificateDer::from(der),
            &[],
            Usage::Client,
        )
        .unwrap();
        // The certificate is for the request's key.
        let key_spki =
            rcgen::PublicKeyData::subject_public_key_info(&KeyPair::from_pem(&key).unwrap());
        assert_eq!(leaf.spki_der, key_spki);
        // Garbage and a tampered request are refused, naming why.
        let e = parse_request("hello").unwrap_err().to_string();
        assert!(e.contains("CERTIFICATE REQUEST"), "{e}");
        let mut der = rustls_pemfile::csr(&mut req.as_bytes())
            .unwrap()
            .unwrap()
            .as_ref()
            .to_vec();
        let n = der.len();
        der[n - 5] ^= 0xff;
        let tampered = format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &der)
        );
        assert!(parse_request(&tampered).is_err());
    }

    #[test]
    fn server_requests_carry_ip_and_dns_sans_into_the_certificate() {
        let ca = Ca::generate("skiff-ca").unwrap();
        let groups = vec!["system:nodes".to_string()];
        let sans = vec![
            "192.168.100.3".to_string(),
            "n1".to_string(),
            "fd00::3".to_string(),
        ];
        let (_, req) = new_server_request("system:node:n1", &groups, &sans).unwrap();
        let info = parse_request(&req).unwrap();
        assert_eq!(info.common_name, "system:node:n1");
        assert_eq!(info.organizations, groups);
        assert_eq!(info.sans, sans);
        assert!(!info.is_ca);
        // IP-looking SANs are IP SANs: a verifier accepts the certificate for the address.
        let cert = ca
            .sign_request(&req, &LeafSpec::server("system:node:n1", &info.sans))
            .unwrap();
        assert_eq!(parse_pem(&cert, "leaf").unwrap().sans, sans);
        let der = pem_certificates(&cert, "leaf").unwrap().remove(0);
        let ee = rustls::pki_types::CertificateDer::from(der);
        let ee = webpki::EndEntityCert::try_from(&ee).unwrap();
        for (name, ok) in [
            ("192.168.100.3", true),
            ("n1", true),
            ("192.168.100.4", false),
        ] {
            let name = rustls::pki_types::ServerName::try_from(name).unwrap();
            assert_eq!(
                ee.verify_is_valid_for_subject_name(&name).is_ok(),
                ok,
                "{name:?}"
            );
        }
        // Without SANs it is a plain request.
        let (_, plain) = new_server_request("x", &[], &[]).unwrap();
        assert!(parse_request(&plain).unwrap().sans.is_empty());
    }

    #[test]
    fn client_certificates_carry_user_and_groups() {
        let ca = Ca::generate("skiff-ca").unwrap();
        let id = ca
            .issue(&LeafSpec::client(
                "system:node:n1",
                &["system:nodes", "extra"],
            ))
            .unwrap();
        let info = parse_pem(&id.cert_pem, "leaf").unwrap();
        assert_eq!(info.common_name, "system:node:n1");
        assert_eq!(info.organizations, vec!["system:nodes", "extra"]);
        assert!(!info.is_ca);
        let ca_info = parse_pem(ca.cert_pem(), "ca").unwrap();
        assert!(ca_info.is_ca);
        assert_eq!(ca_info.common_name, "skiff-ca");
        // A CA reloaded from its PEM files signs leaves too, and keeps its hash.
        let again = Ca::from_pem(ca.cert_pem(), &ca.key_pem()).unwrap();
        assert_eq!(again.hash().unwrap(), ca.hash().unwrap());
        assert!(ca.hash().unwrap().starts_with("sha256:"));
        assert_eq!(ca.hash().unwrap().len(), "sha256:".len() + 64);
        again.issue(&LeafSpec::client("u", &[])).unwrap();
        let err = ca
            .issue(&LeafSpec::client("u", &["a", "b", "c"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 2 groups"), "{err}");
        assert!(!format!("{id:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn serving_certificates_have_dns_and_ip_sans_and_a_year() {
        let ca = Ca::generate("skiff-ca").unwrap();
        let id = ca
            .issue(&LeafSpec::server(
                "skiff-apiserver",
                &["localhost".into(), "127.0.0.1".into(), "::1".into()],
            ))
            .unwrap();
        let info = parse_pem(&id.cert_pem, "serving").unwrap();
        assert_eq!(info.sans, vec!["localhost", "127.0.0.1", "::1"]);
        let now = SystemTime::now();
        assert!(!info.expires_within(now, RENEW_BEFORE));
        assert!(info.expires_within(now, LEAF_VALIDITY + Duration::from_secs(60)));
    }

    #[test]
    fn bad_pem_names_what_it_was() {
        let err = Ca::from_pem("not pem", "also not").unwrap_err().to_string();
        assert!(err.contains("the CA key"), "{err}");
        let err = parse_pem("", "the client certificate")
            .unwrap_err()
            .to_string();
        assert!(err.contains("the client certificate"), "{err}");
    }
}
