//! Finding the cluster CA from nothing but the API server's address and the CA's pinned
//! hash (kubeadm's `--discovery-token-ca-cert-hash`, Skiff's `skiff-node join
//! --ca-cert-hash`): one TLS handshake that trusts nothing yet (it still checks that the
//! server holds its certificate's key), then the CA is taken from the presented chain only if
//! its SubjectPublicKeyInfo hashes to the pinned value and the server's certificate chains to
//! it for `server_name`. Nothing is sent over that first connection; credentials go only
//! over connections that verify against the CA found here. The handshake itself is the
//! caller's (this crate does no network I/O).

use rustls::pki_types::CertificateDer;

use crate::PkiError;

/// `sha256:<64 hex digits>`, lower-cased; an error naming the expected form otherwise.
pub fn parse_ca_hash(s: &str) -> Result<String, PkiError> {
    let hex_part = s.strip_prefix("sha256:").unwrap_or("");
    if hex_part.len() != 64 || !hex_part.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PkiError::Discovery(format!(
            "--ca-cert-hash {s:?} is not of the form sha256:<64 hex digits> (the CA's public key \
             hash, as `skiff-apiserver token create` prints it)"
        )));
    }
    Ok(format!("sha256:{}", hex_part.to_ascii_lowercase()))
}

/// A client configuration that accepts whatever certificate the server presents (the caller
/// then pins the CA with [`pinned_ca`]) but still checks the handshake signatures. Only for
/// fetching the chain; never send anything over such a connection.
pub fn unverified_client_config() -> Result<rustls::ClientConfig, PkiError> {
    crate::tls::pinned_client_config(None, None)
}

/// The CA (PEM) in `chain` whose public key hashes to `pinned` (from [`parse_ca_hash`]),
/// after checking that the chain's first certificate is a serving certificate for
/// `server_name` issued by it.
pub fn pinned_ca(
    chain: &[CertificateDer<'_>],
    pinned: &str,
    server_name: &str,
) -> Result<String, PkiError> {
    let mut seen = Vec::new();
    for cert in chain {
        let hash = crate::spki_hash(cert)?;
        if hash != pinned {
            seen.push(hash);
            continue;
        }
        let pem = format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, cert.as_ref())
                .as_bytes()
                .chunks(64)
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect::<Vec<_>>()
                .join("\n")
        );
        let (leaf, rest) = chain
            .split_first()
            .ok_or_else(|| PkiError::Discovery("the server presented no certificate".into()))?;
        crate::tls::verify_chain_for(&pem, leaf, rest, crate::Usage::Server).map_err(|e| {
            PkiError::Discovery(format!(
                "the server's certificate is not issued by the pinned CA: {e}"
            ))
        })?;
        let info = crate::parse(leaf, "the server's certificate")?;
        let name_ok = info
            .sans
            .iter()
            .any(|s| s.eq_ignore_ascii_case(server_name));
        if !name_ok {
            return Err(PkiError::Discovery(format!(
                "the server's certificate is not valid for {server_name:?} (it names {})",
                info.sans.join(", ")
            )));
        }
        return Ok(pem);
    }
    Err(PkiError::Discovery(format!(
        "the server's CA does not match --ca-cert-hash {pinned}: the server presented {}; \
         refusing to send it the token",
        if seen.is_empty() {
            "no certificate".to_string()
        } else {
            seen.join(", ")
        }
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Ca, LeafSpec, pem_certificates};

    fn chain(ca: &Ca, issuer: &Ca) -> Vec<CertificateDer<'static>> {
        let leaf = issuer
            .issue(&LeafSpec::server(
                "s",
                &["127.0.0.1".into(), "localhost".into()],
            ))
            .unwrap();
        [leaf.cert_pem.as_str(), ca.cert_pem()]
            .iter()
            .flat_map(|p| pem_certificates(p, "c").unwrap())
            .map(CertificateDer::from)
            .collect()
    }

    #[test]
    fn the_ca_is_taken_only_when_its_hash_and_the_chain_hold() {
        let ca = Ca::generate("skiff-ca").unwrap();
        let other = Ca::generate("evil-ca").unwrap();
        let hash = ca.hash().unwrap();
        let pem = pinned_ca(&chain(&ca, &ca), &hash, "127.0.0.1").unwrap();
        assert_eq!(
            pem_certificates(&pem, "a").unwrap(),
            pem_certificates(ca.cert_pem(), "b").unwrap()
        );
        // Another CA's chain: refused, naming what was presented.
        let e = pinned_ca(&chain(&other, &other), &hash, "127.0.0.1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not match --ca-cert-hash"), "{e}");
        assert!(e.contains(&other.hash().unwrap()), "{e}");
        // Our CA presented beside a leaf that another CA issued: refused.
        let e = pinned_ca(&chain(&ca, &other), &hash, "127.0.0.1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not issued by the pinned CA"), "{e}");
        // A name the certificate does not cover: refused.
        let e = pinned_ca(&chain(&ca, &ca), &hash, "example.com")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not valid for"), "{e}");
    }

    #[test]
    fn hashes_are_parsed_strictly() {
        let h = format!("sha256:{}", "AB".repeat(32));
        assert_eq!(parse_ca_hash(&h).unwrap(), h.to_lowercase());
        for bad in [
            "",
            "sha256:",
            "md5:00",
            &format!("sha256:{}", "g".repeat(64)),
        ] {
            assert!(parse_ca_hash(bad).is_err(), "{bad}");
        }
    }
}
