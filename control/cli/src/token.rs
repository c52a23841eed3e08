//! `skiff token create|delete`: bootstrap tokens, as `kubeadm token` makes them. A token is
//! a Secret `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token`
//! holding its id, its secret and its expiry; the API server authenticates it as
//! `system:bootstrap:<id>` in `system:bootstrappers`, which may only ask for node
//! certificates. `--print-join-command` prints the `skiff-node join` line with the CA hash
//! of the kubeconfig's CA.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use rand::Rng;
use skiff_api::api::{ObjectMeta, Secret};
use skiff_client::{Client, ClientConfig, DeleteParams};

use skiff_api::wellknown::{
    BOOTSTRAP_TOKEN_NAMESPACE as NAMESPACE, BOOTSTRAP_TOKEN_PREFIX,
    BOOTSTRAP_TOKEN_SECRET_TYPE as TYPE,
};

/// A new random token `<id>.<secret>`: 6 and 16 characters of `[a-z0-9]`.
pub fn generate() -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let mut part = |n: usize| -> String {
        (0..n)
            .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
            .collect()
    };
    let id = part(6);
    format!("{id}.{}", part(16))
}

/// The Secret of `token`, expiring `ttl` from now (`None`: never).
pub fn secret_of(token: &str, ttl: Option<Duration>, description: &str) -> Result<Secret> {
    let (id, secret) = token
        .split_once('.')
        .filter(|(i, s)| i.len() == 6 && s.len() == 16)
        .context("a bootstrap token is <6 characters>.<16 characters>")?;
    let mut data = std::collections::BTreeMap::new();
    let mut put = |k: &str, v: String| data.insert(k.to_string(), v.into_bytes());
    put("token-id", id.to_string());
    put("token-secret", secret.to_string());
    put("usage-bootstrap-authentication", "true".into());
    put("usage-bootstrap-signing", "true".into());
    if let Some(ttl) = ttl {
        let at =
            chrono::Utc::now() + chrono::Duration::from_std(ttl).context("--ttl is too long")?;
        put(
            "expiration",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        );
    }
    if !description.is_empty() {
        put("description", description.to_string());
    }
    Ok(Secret {
        metadata: Some(ObjectMeta {
            name: format!("{BOOTSTRAP_TOKEN_PREFIX}{id}"),
            namespace: NAMESPACE.into(),
            ..Default::default()
        }),
        r#type: TYPE.into(),
        data,
        ..Default::default()
    })
}

/// `sha256:<hex>` of the first CA certificate of `config`.
pub fn ca_hash(config: &ClientConfig) -> Result<String> {
    let pem = config
        .ca_pem
        .as_deref()
        .context("the kubeconfig names no certificate authority")?;
    let der = skiff_pki::pem_certificates(pem, "the kubeconfig's CA")?
        .into_iter()
        .next()
        .context("the kubeconfig's CA holds no certificate")?;
    Ok(skiff_pki::spki_hash(&der)?)
}

/// Creates a token and prints it (or the whole join command).
pub async fn create(
    client: &Client,
    config: &ClientConfig,
    ttl: Option<Duration>,
    description: &str,
    print_join_command: bool,
) -> Result<()> {
    let token = generate();
    let secret = secret_of(&token, ttl, description)?;
    let hash = if print_join_command {
        Some(ca_hash(config)?)
    } else {
        None
    };
    client
        .namespaced::<Secret>(NAMESPACE)
        .create(&secret)
        .await
        .context("creating the bootstrap token's Secret")?;
    match hash {
        Some(h) => println!(
            "skiff-node join --server {} --token {token} --ca-cert-hash {h}",
            config.server
        ),
        None => println!("{token}"),
    }
    Ok(())
}

/// Deletes a token by its id or the whole token.
pub async fn delete(client: &Client, token_or_id: &str) -> Result<()> {
    let id = token_or_id.split('.').next().unwrap_or_default();
    if id.len() != 6 {
        bail!("{token_or_id:?} is neither a token id (6 characters) nor a token");
    }
    let name = format!("{BOOTSTRAP_TOKEN_PREFIX}{id}");
    client
        .namespaced::<Secret>(NAMESPACE)
        .delete(&name, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting the bootstrap token {id}"))?;
    println!("bootstrap token {id:?} deleted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_their_secrets() {
        let t = generate();
        assert_ne!(t, generate());
        let (id, secret) = t.split_once('.').unwrap();
        assert_eq!((id.len(), secret.len()), (6, 16));
        assert!(
            t.bytes()
                .all(|b| b == b'.' || b.is_ascii_lowercase() || b.is_ascii_digit())
        );
        let s = secret_of(&t, Some(Duration::from_secs(3600)), "for n2").unwrap();
        assert_eq!(s.metadata.unwrap().name, format!("bootstrap-token-{id}"));
        assert_eq!(s.r#type, TYPE);
        assert_eq!(s.data["token-secret"], secret.as_bytes());
        assert_eq!(s.data["usage-bootstrap-authentication"], b"true");
        assert!(s.data.contains_key("expiration"));
        assert!(secret_of("short.token", None, "").is_err());
    }
}
