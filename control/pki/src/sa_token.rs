//! ServiceAccount tokens: ES256 JWTs signed by the API server's service-account key, with
//! Kubernetes' claims (`iss`, `aud`, `exp`, `nbf`, `iat`, `sub =
//! system:serviceaccount:<ns>:<name>`, and the `kubernetes.io` claim naming the namespace, the
//! ServiceAccount and, for a bound token, the pod), and the key as a JWKS for
//! `/openid/v1/jwks`. Signing and checking are jsonwebtoken's; whether the ServiceAccount and
//! pod still exist is the API server's question.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::PkiError;

/// The issuer and default audience of every token (kube-apiserver's default).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// A name and uid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

/// The `kubernetes.io` claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct KubernetesClaim {
    pub namespace: String,
    pub serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warnafter: Option<i64>,
}

/// A token's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub nbf: i64,
    pub iss: String,
    pub sub: String,
    #[serde(default)]
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaim,
}

/// The service-account key: signs and checks tokens.
pub struct SigningKey {
    encoding: EncodingKey,
    decoding: DecodingKey,
    kid: String,
    x: String,
    y: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

fn err(what: &str) -> impl FnOnce(String) -> PkiError + '_ {
    move |reason| PkiError::BadPem {
        what: what.to_string(),
        kind: "private key",
        reason,
    }
}

impl SigningKey {
    /// A new ECDSA P-256 key, PEM (PKCS#8).
    pub fn generate_pem() -> Result<String, PkiError> {
        rcgen::KeyPair::generate()
            .map(|k| k.serialize_pem())
            .map_err(|source| PkiError::Generate {
                what: "the service-account key".into(),
                source,
            })
    }

    /// The key from its PEM.
    pub fn from_pem(pem: &str) -> Result<SigningKey, PkiError> {
        let what = "the service-account key";
        let pair = rcgen::KeyPair::from_pem(pem).map_err(|e| err(what)(e.to_string()))?;
        let raw = pair.public_key_raw();
        if raw.len() != 65 || raw[0] != 4 {
            return Err(err(what)("not an uncompressed P-256 public key".into()));
        }
        let (x, y) = (B64URL.encode(&raw[1..33]), B64URL.encode(&raw[33..65]));
        let kid = B64URL.encode(Sha256::digest(
            rcgen::PublicKeyData::subject_public_key_info(&pair),
        ));
        let encoding =
            EncodingKey::from_ec_pem(pem.as_bytes()).map_err(|e| err(what)(e.to_string()))?;
        let decoding =
            DecodingKey::from_ec_components(&x, &y).map_err(|e| err(what)(e.to_string()))?;
        Ok(SigningKey {
            encoding,
            decoding,
            kid,
            x,
            y,
        })
    }

    /// Signs `claims`.
    pub fn sign(&self, claims: &Claims) -> Result<String, PkiError> {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding)
            .map_err(|e| PkiError::Tls(format!("cannot sign a token: {e}")))
    }

    /// The claims of a token this key signed, issued by [`ISSUER`], for one of `audiences`,
    /// not expired (no leeway) and already valid; the error says why not (never the token).
    pub fn verify(&self, token: &str, audiences: &[&str]) -> Result<Claims, String> {
        let mut v = Validation::new(Algorithm::ES256);
        v.set_issuer(&[ISSUER]);
        v.set_audience(audiences);
        v.leeway = 0;
        v.validate_nbf = true;
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub", "nbf"]);
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &v)
            .map(|d| d.claims)
            .map_err(|e| format!("{:?}", e.kind()))
    }

    /// The JWKS of the public key (`/openid/v1/jwks`).
    pub fn jwks(&self) -> serde_json::Value {
        serde_json::json!({"keys": [{
            "use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256",
            "x": self.x, "y": self.y,
        }]})
    }
}

/// Whether a bearer token looks like a JWT (three base64url parts).
pub fn looks_like_jwt(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(exp_in: i64) -> Claims {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        Claims {
            aud: vec![ISSUER.into()],
            exp: now + exp_in,
            iat: now,
            nbf: now,
            iss: ISSUER.into(),
            sub: "system:serviceaccount:shop:robot".into(),
            jti: "j".into(),
            kubernetes: KubernetesClaim {
                namespace: "shop".into(),
                serviceaccount: Ref {
                    name: "robot".into(),
                    uid: "u1".into(),
                },
                pod: Some(Ref {
                    name: "p".into(),
                    uid: "u2".into(),
                }),
                ..Default::default()
            },
        }
    }

    #[test]
    fn tokens_verify_only_with_their_key_audience_and_time() {
        let key = SigningKey::from_pem(&SigningKey::generate_pem().unwrap()).unwrap();
        let other = SigningKey::from_pem(&SigningKey::generate_pem().unwrap()).unwrap();
        let t = key.sign(&claims(3600)).unwrap();
        assert!(looks_like_jwt(&t));
        assert_eq!(key.verify(&t, &[ISSUER]).unwrap(), claims(3600));
        assert_eq!(other.verify(&t, &[ISSUER]).unwrap_err(), "InvalidSignature");
        assert_eq!(key.verify(&t, &["vault"]).unwrap_err(), "InvalidAudience");
        let expired = key.sign(&claims(-10)).unwrap();
        assert_eq!(
            key.verify(&expired, &[ISSUER]).unwrap_err(),
            "ExpiredSignature"
        );
        assert!(key.verify("a.b.c", &[ISSUER]).is_err());
        let jwks = key.jwks();
        assert_eq!(jwks["keys"][0]["alg"], "ES256");
        assert_eq!(jwks["keys"][0]["kid"].as_str().unwrap().len(), 43);
    }
}
