//! Bootstrap tokens (`<id>.<secret>`, kubeadm's and k3s' way for a new node to join): a
//! Secret `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token` makes
//! the token authenticate as `system:bootstrap:<id>` in `system:bootstrappers` (plus its
//! `auth-extra-groups`) until its `expiration`, as kube-apiserver's bootstrap token
//! authenticator does. The Secrets are read from an in-process mirror; the token's secret
//! half is compared in constant time and never logged.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use skiff_api::api::Secret;
use subtle::ConstantTimeEq;

use super::mirror::Mirror;
use crate::error::ApiError;
use crate::registry::Registry;
use crate::request::UserInfo;

use crate::request::BOOTSTRAP_GROUP;
use skiff_api::wellknown::{
    BOOTSTRAP_TOKEN_NAMESPACE as NAMESPACE, BOOTSTRAP_TOKEN_PREFIX as NAME_PREFIX,
    BOOTSTRAP_TOKEN_SECRET_TYPE as SECRET_TYPE,
};

/// `<id>.<secret>`: 6 and 16 characters of `[a-z0-9]`; `None` for anything else.
pub fn parse_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// Why a token was refused (for the debug log; never the secret).
fn check(
    secret: &Secret,
    id: &str,
    token_secret: &str,
    now: DateTime<Utc>,
) -> Result<UserInfo, &'static str> {
    if secret.r#type != SECRET_TYPE {
        return Err("the Secret is not of type bootstrap.kubernetes.io/token");
    }
    if secret
        .metadata
        .as_ref()
        .is_some_and(|m| !m.deletion_timestamp.is_empty())
    {
        return Err("the token's Secret is being deleted");
    }
    let data = |k: &str| {
        secret
            .data
            .get(k)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    if data("token-id") != id {
        return Err("the Secret's token-id does not match its name");
    }
    let stored = data("token-secret");
    if !bool::from(stored.as_bytes().ct_eq(token_secret.as_bytes())) {
        return Err("wrong token secret");
    }
    if data("usage-bootstrap-authentication") != "true" {
        return Err("the token is not for authentication (usage-bootstrap-authentication)");
    }
    let expiration = data("expiration");
    if !expiration.is_empty() {
        match DateTime::parse_from_rfc3339(&expiration) {
            Ok(t) if t.with_timezone(&Utc) > now => {}
            Ok(_) => return Err("the token has expired"),
            Err(_) => return Err("the token's expiration is not an RFC 3339 time"),
        }
    }
    let mut groups = vec![BOOTSTRAP_GROUP.to_string()];
    for g in data("auth-extra-groups")
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
    {
        let valid = g.strip_prefix("system:bootstrappers:").is_some_and(|rest| {
            !rest.is_empty()
                && rest.len() <= 256
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
                && !rest.ends_with([':', '-'])
        });
        if !valid {
            return Err("auth-extra-groups holds a group outside system:bootstrappers:");
        }
        groups.push(g.to_string());
    }
    Ok(UserInfo::authenticated(
        format!("system:bootstrap:{id}"),
        String::new(),
        groups,
    ))
}

/// The bootstrap tokens of the cluster, as their Secrets say now.
pub struct BootstrapTokens {
    secrets: Arc<Mirror<Secret>>,
}

impl std::fmt::Debug for BootstrapTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootstrapTokens").finish_non_exhaustive()
    }
}

impl BootstrapTokens {
    /// Starts the Secret mirror (complete when this returns).
    pub async fn start(registry: &Registry) -> Result<Arc<BootstrapTokens>, ApiError> {
        Ok(Arc::new(BootstrapTokens {
            secrets: Mirror::start(registry).await?,
        }))
    }

    /// The user of a bootstrap token; `None` if it is not a valid, current one.
    pub fn authenticate(&self, token: &str) -> Option<UserInfo> {
        let (id, token_secret) = parse_token(token)?;
        let secret = self.secrets.get(NAMESPACE, &format!("{NAME_PREFIX}{id}"))?;
        match check(&secret, id, token_secret, Utc::now()) {
            Ok(user) => Some(user),
            Err(reason) => {
                tracing::debug!(token_id = id, reason, "bootstrap token refused");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(pairs: &[(&str, &str)]) -> Secret {
        Secret {
            r#type: SECRET_TYPE.into(),
            data: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn tokens_are_parsed_strictly() {
        assert_eq!(
            parse_token("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        for bad in [
            "abcdef0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde",
            "abcdef.0123456789abcdef.",
        ] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
    }

    #[test]
    fn secrets_decide_who_a_token_is() {
        let now = Utc::now();
        let good = [
            ("token-id", "abcdef"),
            ("token-secret", "0123456789abcdef"),
            ("usage-bootstrap-authentication", "true"),
            ("auth-extra-groups", "system:bootstrappers:worker"),
        ];
        let user = check(&secret(&good), "abcdef", "0123456789abcdef", now).unwrap();
        assert_eq!(user.name, "system:bootstrap:abcdef");
        assert!(user.groups.iter().any(|g| g == BOOTSTRAP_GROUP));
        assert!(
            user.groups
                .iter()
                .any(|g| g == "system:bootstrappers:worker")
        );
        assert!(user.groups.iter().any(|g| g == "system:authenticated"));
        let refused = |pairs: &[(&str, &str)], secret_half: &str| {
            check(&secret(pairs), "abcdef", secret_half, now).unwrap_err()
        };
        assert_eq!(refused(&good, "0123456789abcdee"), "wrong token secret");
        let mut expired = good.to_vec();
        expired.push(("expiration", "2020-01-01T00:00:00Z"));
        assert_eq!(
            refused(&expired, "0123456789abcdef"),
            "the token has expired"
        );
        let mut later = good.to_vec();
        later.push(("expiration", "2999-01-01T00:00:00Z"));
        assert!(check(&secret(&later), "abcdef", "0123456789abcdef", now).is_ok());
        let no_usage = &good[..2];
        assert!(refused(no_usage, "0123456789abcdef").contains("usage"));
        let mut masters = good.to_vec();
        masters[3] = ("auth-extra-groups", "system:masters");
        assert!(refused(&masters, "0123456789abcdef").contains("auth-extra-groups"));
        let mut other_type = secret(&good);
        other_type.r#type = "Opaque".into();
        assert!(check(&other_type, "abcdef", "0123456789abcdef", now).is_err());
    }
}
