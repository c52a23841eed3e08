//! The credential parsers on arbitrary input, for `cargo fuzz` (`tests/fuzz`,
//! target `auth_parsers`) and a unit test: the static token file, DER and PEM certificates,
//! a client certificate chain checked against a CA, `Authorization` and impersonation
//! headers, kubeconfigs, bootstrap tokens and certificate signing requests. None may panic whatever the bytes; a refusal is an error value.

use std::sync::OnceLock;

use axum::http::{HeaderMap, HeaderValue, header};
use rustls::pki_types::CertificateDer;

use super::{Authenticator, TokenFile, impersonate};

/// An authenticator with a CA and one token, made once (CA generation is slow).
fn authenticator() -> &'static Authenticator {
    static A: OnceLock<Authenticator> = OnceLock::new();
    A.get_or_init(|| Authenticator {
        client_ca_pem: skiff_pki::Ca::generate("fuzz-ca")
            .ok()
            .map(|ca| ca.cert_pem().to_string()),
        tokens: TokenFile::parse("good-token,alice,1,\"a,b\"\n", "fuzz").unwrap_or_default(),
        sa_key: skiff_pki::sa_token::SigningKey::generate_pem()
            .ok()
            .and_then(|pem| skiff_pki::sa_token::SigningKey::from_pem(&pem).ok())
            .map(std::sync::Arc::new),
        bootstrap: Default::default(),
    })
}

/// Runs one parser, chosen by the first byte, on the rest of `data`.
pub fn decode_credentials(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match which % 8 {
        0 => {
            let _ = TokenFile::parse(&text, "fuzz");
        }
        1 => {
            let _ = skiff_pki::parse(rest, "fuzz");
            let _ = skiff_pki::spki_hash(rest);
        }
        2 => {
            let _ = skiff_pki::parse_pem(&text, "fuzz");
            let _ = skiff_pki::pem_certificates(&text, "fuzz");
        }
        3 => {
            if let Ok(v) = HeaderValue::from_bytes(rest) {
                let mut h = HeaderMap::new();
                h.insert(header::AUTHORIZATION, v);
                let _ = authenticator().authenticate(None, &h, "/api");
            }
        }
        4 => {
            // A chain of one or two certificates split at the first byte's value.
            let cut = usize::from(rest.first().copied().unwrap_or(0)).min(rest.len());
            let (a, b) = rest.split_at(cut);
            let chain = [CertificateDer::from(a), CertificateDer::from(b)];
            let _ = authenticator().identify_certificate(&chain);
            let _ = authenticator().identify_certificate(&chain[1..]);
        }
        6 => {
            let _ = super::bootstrap::parse_token(&text);
            let _ = skiff_pki::parse_request(&text);
        }
        5 => {
            let _ = skiff_pki::Kubeconfig::parse(&text, "fuzz")
                .and_then(|k| k.resolve("fuzz", std::path::Path::new("/nonexistent")));
        }
        _ => {
            let mut h = HeaderMap::new();
            for (i, part) in rest.split(|b| *b == b'\n').take(8).enumerate() {
                if let Ok(v) = HeaderValue::from_bytes(part) {
                    let name = ["impersonate-user", "impersonate-group", "impersonate-uid"][i % 3];
                    h.append(name, v);
                }
            }
            let _ = impersonate(None, crate::request::UserInfo::default(), &h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The corpus seeds the fuzzer starts from run here on every test.
    #[test]
    fn seeds_decode_without_panicking() {
        let ca = skiff_pki::Ca::generate("seed").unwrap();
        let id = ca.issue(&skiff_pki::LeafSpec::client("u", &["g"])).unwrap();
        let der = skiff_pki::pem_certificates(&id.cert_pem, "seed")
            .unwrap()
            .remove(0);
        let mut inputs: Vec<Vec<u8>> = vec![
            b"\x00tok,alice,1,\"a,b\"\n,,\n\"unterminated".to_vec(),
            [&[1u8][..], &der].concat(),
            [&[1u8][..], &der[..der.len() / 2]].concat(),
            [b"\x02".as_slice(), id.cert_pem.as_bytes()].concat(),
            b"\x03Bearer good-token".to_vec(),
            b"\x03Bearer ".to_vec(),
            b"\x03Basic Zm9vOmJhcg==".to_vec(),
            b"\x03Bearer eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln".to_vec(),
            [&[4u8, 0][..], &der].concat(),
            b"\x05apiVersion: v1\nclusters: [{name: c, cluster: {server: x}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {client-key-data: '!!'}}]\n".to_vec(),
            b"\x06bob\nsystem:masters\nuid-1\n".to_vec(),
            b"\x06\ng-without-user".to_vec(),
        ];
        for e in std::fs::read_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fuzz/seeds/auth_parsers"
        ))
        .into_iter()
        .flatten()
        .flatten()
        {
            if let Ok(b) = std::fs::read(e.path()) {
                inputs.push(b);
            }
        }
        for i in inputs {
            decode_credentials(&i);
        }
    }
}
