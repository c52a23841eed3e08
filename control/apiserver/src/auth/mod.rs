//! Who is asking: authentication of every request on the API server's port, REST and gRPC
//! alike, as kube-apiserver's authenticator chain does it.
//!
//! - x509 client certificates (verified once per connection against the client CA: CN is the
//!   user, each O a group);
//! - bearer tokens from a static token file (`--token-auth-file`, kube-apiserver's CSV:
//!   `token,user,uid,"group1,group2"`).
//!
//! Credentials that are presented but do not verify are a 401, whatever else the request
//! carries (kube-apiserver's union fails on error). A request with no credentials at all is
//! anonymous, which is allowed only on the public health and version paths
//! ([`ANONYMOUS_PATHS`], kube-apiserver's `system:public-info-viewer`); elsewhere it is a 401.
//! Every authenticated user is also in `system:authenticated`. Tokens are compared by their
//! SHA-256 and never logged.
//!
//! Impersonation (`Impersonate-User`, `Impersonate-Group`, `Impersonate-Uid` headers, what
//! `kubectl --as` sends): the authenticated user must be allowed the `impersonate` verb on
//! each (`users`, `groups`, `serviceaccounts` in the core group, `uids` in
//! `authentication.k8s.io`); the request then runs as the impersonated user.
//!
//! Also: ServiceAccount tokens (ES256 JWTs of `skiff_pki::sa_token`: signature, issuer,
//! audience and expiry checked here, then the pipeline checks against the authorizers' mirrors
//! that the ServiceAccount and a bound pod still exist with the token's uids, else 401);
//! bootstrap tokens ([`bootstrap`]). Failed authentications are delayed per source address
//! ([`throttle`]). The user ([`crate::request::UserInfo`]) rides in the request's extensions.
//! Both authorizers read in-memory mirrors (`mirror`) of the registry, relisted on "too old".

pub mod authz;
pub mod bootstrap;
pub mod escalation;
/// The credential parsers for `cargo fuzz` (feature `fuzzing`).
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub(crate) mod mirror;
pub mod node;
pub mod policy;
pub mod throttle;
mod tokens;

use std::sync::Arc;

use crate::request::{EXTRA_POD_NAME, EXTRA_POD_UID, SERVICE_ACCOUNTS_GROUP, UserInfo};
use axum::http::{HeaderMap, header};
use rustls::pki_types::CertificateDer;
use skiff_pki::Usage;

pub use tokens::{TokenFile, TokenFileError};

/// Paths anyone may read without credentials.
pub const ANONYMOUS_PATHS: &[&str] = &["/healthz", "/livez", "/readyz", "/version", "/version/"];

/// What a connection's TLS handshake established, attached to each of its requests by the
/// server loop.
#[derive(Debug, Clone, Default)]
pub struct PeerIdentity {
    /// The client's address.
    pub remote: Option<std::net::SocketAddr>,
    /// `None`: no client certificate; `Some(Err)`: one that did not verify (why, for the
    /// log); `Some(Ok)`: the certificate's user.
    pub cert: Option<Result<UserInfo, String>>,
}

/// The authenticators the server was configured with.
#[derive(Debug, Default)]
pub struct Authenticator {
    /// PEM of the CA(s) client certificates must chain to (none: client certificates are
    /// not accepted).
    pub client_ca_pem: Option<String>,
    pub tokens: TokenFile,
    /// Checks ServiceAccount tokens (JWTs); `None`: they are not accepted.
    pub sa_key: Option<Arc<skiff_pki::sa_token::SigningKey>>,
    /// Bootstrap tokens, once the server has started their Secret mirror.
    pub bootstrap: std::sync::OnceLock<Arc<bootstrap::BootstrapTokens>>,
}

/// Why a request was refused authentication (for the log; the client sees only 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("client certificate: {0}")]
    Certificate(String),
    #[error("invalid bearer token")]
    Token,
    #[error("ServiceAccount token: {0}")]
    ServiceAccountToken(String),
    #[error("ServiceAccount token of a ServiceAccount or pod that no longer exists")]
    Revoked,
    #[error("malformed Authorization header")]
    Header,
    #[error("no credentials")]
    Anonymous,
}

impl Authenticator {
    /// The user of a connection's client certificate chain (DER, leaf first): checked against
    /// the client CA, its CN and O entries as user and groups.
    pub fn identify_certificate(&self, chain: &[CertificateDer<'_>]) -> Result<UserInfo, String> {
        let Some(ca) = &self.client_ca_pem else {
            return Err("client certificates are not accepted".into());
        };
        let (leaf, intermediates) = chain.split_first().ok_or("empty chain")?;
        skiff_pki::tls::verify_chain_for(ca, leaf, intermediates, Usage::Client)?;
        let info = skiff_pki::parse(leaf, "the client certificate").map_err(|e| e.to_string())?;
        if info.common_name.is_empty() {
            return Err("the certificate has no common name".into());
        }
        Ok(UserInfo::authenticated(
            info.common_name,
            String::new(),
            info.organizations,
        ))
    }

    /// Who sent a request: its connection's certificate, else its bearer token, else
    /// anonymous (only on [`ANONYMOUS_PATHS`]).
    pub fn authenticate(
        &self,
        peer: Option<&PeerIdentity>,
        headers: &HeaderMap,
        path: &str,
    ) -> Result<UserInfo, AuthError> {
        if let Some(cert) = peer.and_then(|p| p.cert.as_ref()) {
            return cert.clone().map_err(AuthError::Certificate);
        }
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let value = value.to_str().map_err(|_| AuthError::Header)?;
            let token = match value.split_once(' ') {
                Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
                _ => return Err(AuthError::Header),
            };
            if token.is_empty() {
                return Err(AuthError::Header);
            }
            if skiff_pki::sa_token::looks_like_jwt(token)
                && let Some(key) = &self.sa_key
            {
                return service_account_user(key, token);
            }
            if let Some(user) = self.tokens.lookup(token) {
                return Ok(user);
            }
            return self
                .bootstrap
                .get()
                .and_then(|b| b.authenticate(token))
                .ok_or(AuthError::Token);
        }
        if ANONYMOUS_PATHS.contains(&path) {
            return Ok(UserInfo::anonymous());
        }
        Err(AuthError::Anonymous)
    }
}

/// The user of a ServiceAccount token: signature, issuer, audience and time checked here;
/// whether its ServiceAccount and pod still exist is checked by the middleware.
fn service_account_user(
    key: &skiff_pki::sa_token::SigningKey,
    token: &str,
) -> Result<UserInfo, AuthError> {
    let c = key
        .verify(token, &[skiff_pki::sa_token::ISSUER])
        .map_err(AuthError::ServiceAccountToken)?;
    let k = &c.kubernetes;
    let name = format!(
        "system:serviceaccount:{}:{}",
        k.namespace, k.serviceaccount.name
    );
    if c.sub != name {
        return Err(AuthError::ServiceAccountToken(
            "sub does not name the ServiceAccount".into(),
        ));
    }
    let mut user = UserInfo::authenticated(
        name,
        k.serviceaccount.uid.clone(),
        vec![
            SERVICE_ACCOUNTS_GROUP.to_string(),
            format!("{SERVICE_ACCOUNTS_GROUP}:{}", k.namespace),
        ],
    );
    if let Some(p) = &k.pod {
        user.extra
            .insert(EXTRA_POD_NAME.into(), vec![p.name.clone()]);
        user.extra.insert(EXTRA_POD_UID.into(), vec![p.uid.clone()]);
    }
    Ok(user)
}

const IMPERSONATE_USER: &str = "impersonate-user";
const IMPERSONATE_GROUP: &str = "impersonate-group";
const IMPERSONATE_UID: &str = "impersonate-uid";

/// Why an impersonation was refused: the status code and message kube-apiserver answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImpersonationError {
    pub code: u16,
    pub message: String,
}

/// The user a request runs as: `user`, or the one its impersonation headers name if `user`
/// may impersonate it.
pub fn impersonate(
    authz: Option<&authz::Authorizer>,
    user: UserInfo,
    headers: &HeaderMap,
) -> Result<UserInfo, ImpersonationError> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect()
    };
    let users = values(IMPERSONATE_USER);
    let groups = values(IMPERSONATE_GROUP);
    let uids = values(IMPERSONATE_UID);
    if users.is_empty() {
        if groups.is_empty() && uids.is_empty() {
            return Ok(user);
        }
        return Err(ImpersonationError {
            code: 400,
            message: "requested impersonation of groups or a uid without impersonating a user"
                .into(),
        });
    }
    let name = users[0].clone();
    let Some(authz) = authz else {
        return Err(ImpersonationError {
            code: 403,
            message: "impersonation is not enabled".into(),
        });
    };
    let mut checks = Vec::new();
    match name
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        Some((ns, sa)) => checks.push(crate::request::Attributes::resource(
            "impersonate",
            "",
            "serviceaccounts",
            "",
            ns,
            sa,
        )),
        None => checks.push(crate::request::Attributes::resource(
            "impersonate",
            "",
            "users",
            "",
            "",
            &name,
        )),
    }
    let extra = groups
        .iter()
        .map(|g| ("", "groups", g))
        .chain(uids.iter().map(|u| ("authentication.k8s.io", "uids", u)));
    for (group, resource, name) in extra {
        checks.push(crate::request::Attributes::resource(
            "impersonate",
            group,
            resource,
            "",
            "",
            name,
        ));
    }
    for a in &checks {
        authz
            .authorize(&user, a)
            .map_err(|message| ImpersonationError { code: 403, message })?;
    }
    let mut groups = groups;
    if let Some((ns, _)) = name
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        for g in [
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{ns}"),
        ] {
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
    }
    Ok(UserInfo::authenticated(
        name,
        uids.first().cloned().unwrap_or_default(),
        groups,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{ANONYMOUS_USER, AUTHENTICATED_GROUP};
    use skiff_pki::{Ca, LeafSpec};

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from(skiff_pki::pem_certificates(pem, "c").unwrap().remove(0))
    }

    #[test]
    fn certificates_tokens_and_anonymous() {
        let ca = Ca::generate("ca").unwrap();
        let other = Ca::generate("other").unwrap();
        let tokens = TokenFile::parse("s3cret,alice,u-1,\"dev,ops\"\n", "f").unwrap();
        let a = Authenticator {
            client_ca_pem: Some(ca.cert_pem().to_string()),
            tokens,
            sa_key: None,
            bootstrap: Default::default(),
        };
        let id = ca
            .issue(&LeafSpec::client("system:node:n1", &["system:nodes"]))
            .unwrap();
        let user = a.identify_certificate(&[der(&id.cert_pem)]).unwrap();
        assert_eq!(user.name, "system:node:n1");
        assert_eq!(user.groups, vec!["system:nodes", AUTHENTICATED_GROUP]);
        let foreign = other.issue(&LeafSpec::client("mallory", &[])).unwrap();
        let e = a
            .identify_certificate(&[der(&foreign.cert_pem)])
            .unwrap_err();
        assert!(e.contains("UnknownIssuer"), "{e}");

        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
        let u = a.authenticate(None, &h, "/api").unwrap();
        assert_eq!((u.name.as_str(), u.uid.as_str()), ("alice", "u-1"));
        assert_eq!(u.groups, vec!["dev", "ops", AUTHENTICATED_GROUP]);
        h.insert(header::AUTHORIZATION, "Bearer wrong".parse().unwrap());
        assert_eq!(a.authenticate(None, &h, "/healthz"), Err(AuthError::Token));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(a.authenticate(None, &h, "/api"), Err(AuthError::Header));
        // A bad certificate fails even with a good token.
        let bad = PeerIdentity {
            remote: None,
            cert: Some(Err("UnknownIssuer".into())),
        };
        h.insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
        assert!(matches!(
            a.authenticate(Some(&bad), &h, "/api"),
            Err(AuthError::Certificate(_))
        ));
        let none = HeaderMap::new();
        assert_eq!(
            a.authenticate(None, &none, "/api/v1/pods"),
            Err(AuthError::Anonymous)
        );
        let anon = a.authenticate(None, &none, "/healthz").unwrap();
        assert_eq!(anon.name, ANONYMOUS_USER);
    }
}
