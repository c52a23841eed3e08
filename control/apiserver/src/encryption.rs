//! Encryption at rest (`--encryption-provider-config`), as kube-apiserver's
//! EncryptionConfiguration (`apiserver.config.k8s.io/v1`): for each listed resource, the
//! first provider encrypts what is written and every provider may read. Providers: `aesgcm`
//! (AES-GCM with a random 96-bit nonce per write, the store key as additional authenticated
//! data so a value cannot be moved to another key; values stored as
//! `k8s:enc:aesgcm:v1:<key name>:<nonce><ciphertext+tag>`, Kubernetes' layout) and `identity`
//! (plain, to read what was written before encryption was turned on). `aescbc`, `secretbox`
//! and `kms` are refused by name. AES comes from `ring`, which TLS already links.
//!
//! It sits between the registry and the store ([`EncryptingStore`], a [`Store`]), so every
//! read and write of the resource goes through it: nothing else sees ciphertext, and the
//! store never sees plaintext of an encrypted resource. Keys are never logged.
//!
//! Without `--encryption-provider-config`, the `skiff-apiserver` binary encrypts Secrets
//! anyway (as k3s's `--secrets-encryption` does), with the configuration
//! [`ensure_generated`] writes once in its PKI directory ([`GENERATED_CONFIG`]: a random
//! 256-bit aesgcm key, then `identity` so what an older start wrote in plain stays readable),
//! mode 0600, and reuses on every later start. Servers of one cluster share that file as they
//! share the PKI.

use std::sync::Arc;

use base64::Engine as _;
use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::Deserialize;
use skiff_store::{KeyValue, Listing, Store, StoreError, WatchEvent, WatchStream};

/// Why a configuration was refused; names the field, never a key.
#[derive(Debug, thiserror::Error)]
pub enum EncryptionConfigError {
    #[error("cannot read the encryption configuration {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the encryption configuration {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {field}: {reason}")]
    Invalid {
        path: String,
        field: String,
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConfigFile {
    api_version: String,
    kind: String,
    #[serde(default)]
    resources: Vec<ResourceConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceConfig {
    resources: Vec<String>,
    providers: Vec<ProviderConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderConfig {
    aesgcm: Option<KeysConfig>,
    identity: Option<empty::Empty>,
    aescbc: Option<serde_json::Value>,
    secretbox: Option<serde_json::Value>,
    kms: Option<serde_json::Value>,
}

/// `identity: {}`.
mod empty {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Empty {}
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysConfig {
    keys: Vec<KeyConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyConfig {
    name: String,
    secret: String,
}

/// One way to store a value.
enum Provider {
    AesGcm { name: String, key: Box<LessSafeKey> },
    Identity,
}

/// The providers of one resource: the first writes, all read.
struct Transformer {
    providers: Vec<Provider>,
    rng: SystemRandom,
}

const AESGCM_PREFIX: &str = "k8s:enc:aesgcm:v1:";

impl Transformer {
    fn write(&self, store_key: &str, plain: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        match self.providers.first() {
            Some(Provider::AesGcm { name, key }) => {
                let mut nonce = [0u8; NONCE_LEN];
                self.rng
                    .fill(&mut nonce)
                    .map_err(|_| StoreError::Backend("no randomness for a nonce".into()))?;
                let mut sealed = plain;
                key.seal_in_place_append_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(store_key.as_bytes()),
                    &mut sealed,
                )
                .map_err(|_| StoreError::Backend(format!("encrypting {store_key} failed")))?;
                let mut out = format!("{AESGCM_PREFIX}{name}:").into_bytes();
                out.extend_from_slice(&nonce);
                out.extend_from_slice(&sealed);
                Ok(out)
            }
            Some(Provider::Identity) | None => Ok(plain),
        }
    }

    fn read(&self, store_key: &str, stored: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        if let Some(rest) = stored.strip_prefix(AESGCM_PREFIX.as_bytes()) {
            for p in &self.providers {
                let Provider::AesGcm { name, key } = p else {
                    continue;
                };
                let Some(body) = rest
                    .strip_prefix(name.as_bytes())
                    .and_then(|r| r.strip_prefix(b":"))
                else {
                    continue;
                };
                if body.len() < NONCE_LEN {
                    break;
                }
                let (nonce, sealed) = body.split_at(NONCE_LEN);
                let mut nonce_bytes = [0u8; NONCE_LEN];
                nonce_bytes.copy_from_slice(nonce);
                let mut buf = sealed.to_vec();
                let plain = key
                    .open_in_place(
                        Nonce::assume_unique_for_key(nonce_bytes),
                        Aad::from(store_key.as_bytes()),
                        &mut buf,
                    )
                    .map_err(|_| {
                        StoreError::Backend(format!(
                            "{store_key}: the value does not decrypt with key {name:?} (a wrong \
                             key, or a value moved from another key)"
                        ))
                    })?;
                return Ok(plain.to_vec());
            }
            return Err(StoreError::Backend(format!(
                "{store_key} is encrypted with an aesgcm key the configuration does not hold"
            )));
        }
        if self
            .providers
            .iter()
            .any(|p| matches!(p, Provider::Identity))
        {
            return Ok(stored);
        }
        Err(StoreError::Backend(format!(
            "{store_key} is not encrypted and the configuration has no identity provider to \
             read it"
        )))
    }
}

/// The parsed configuration: store key prefixes and their transformers.
pub struct EncryptionConfig {
    rules: Vec<(String, Arc<Transformer>)>,
}

impl std::fmt::Debug for EncryptionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptionConfig")
            .field(
                "prefixes",
                &self.rules.iter().map(|(p, _)| p).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl EncryptionConfig {
    /// Reads a configuration file.
    pub fn read(path: &std::path::Path) -> Result<EncryptionConfig, EncryptionConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| EncryptionConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        EncryptionConfig::parse(&text, &path.display().to_string())
    }

    /// Parses a configuration's text (`path` names it in errors). Resources are named as
    /// Kubernetes names them (`secrets`, `configmaps`, `deployments.apps`).
    pub fn parse(text: &str, path: &str) -> Result<EncryptionConfig, EncryptionConfigError> {
        let invalid = |field: &str, reason: &str| EncryptionConfigError::Invalid {
            path: path.to_string(),
            field: field.to_string(),
            reason: reason.to_string(),
        };
        let file: ConfigFile =
            yaml_serde::from_str(text).map_err(|e| invalid("", &format!("invalid YAML: {e}")))?;
        if file.api_version != "apiserver.config.k8s.io/v1" {
            return Err(invalid("apiVersion", "must be apiserver.config.k8s.io/v1"));
        }
        if file.kind != "EncryptionConfiguration" {
            return Err(invalid("kind", "must be EncryptionConfiguration"));
        }
        let mut rules = Vec::new();
        for (i, r) in file.resources.iter().enumerate() {
            let mut providers = Vec::new();
            for (j, p) in r.providers.iter().enumerate() {
                let field = format!("resources[{i}].providers[{j}]");
                let set = usize::from(p.aesgcm.is_some())
                    + usize::from(p.identity.is_some())
                    + usize::from(p.aescbc.is_some())
                    + usize::from(p.secretbox.is_some())
                    + usize::from(p.kms.is_some());
                if set != 1 {
                    return Err(invalid(&field, "exactly one provider type must be set"));
                }
                for (name, given) in [
                    ("aescbc", &p.aescbc),
                    ("secretbox", &p.secretbox),
                    ("kms", &p.kms),
                ] {
                    if given.is_some() {
                        return Err(invalid(
                            &format!("{field}.{name}"),
                            "not supported by Skiff (use aesgcm or identity)",
                        ));
                    }
                }
                if p.identity.is_some() {
                    providers.push(Provider::Identity);
                }
                if let Some(k) = &p.aesgcm {
                    if k.keys.is_empty() {
                        return Err(invalid(&format!("{field}.aesgcm.keys"), "Required value"));
                    }
                    for (n, key) in k.keys.iter().enumerate() {
                        let kf = format!("{field}.aesgcm.keys[{n}]");
                        if key.name.is_empty() || key.name.contains(':') {
                            return Err(invalid(
                                &format!("{kf}.name"),
                                "must be a non-empty name without ':'",
                            ));
                        }
                        let bytes = base64::engine::general_purpose::STANDARD
                            .decode(key.secret.trim())
                            .map_err(|_| {
                                invalid(&format!("{kf}.secret"), "must be base64 (value not shown)")
                            })?;
                        let alg = match bytes.len() {
                            16 => &AES_128_GCM,
                            32 => &AES_256_GCM,
                            n => {
                                return Err(invalid(
                                    &format!("{kf}.secret"),
                                    &format!("must be 16 or 32 bytes, got {n} (value not shown)"),
                                ));
                            }
                        };
                        let unbound = UnboundKey::new(alg, &bytes).map_err(|_| {
                            invalid(&format!("{kf}.secret"), "not a usable AES key")
                        })?;
                        providers.push(Provider::AesGcm {
                            name: key.name.clone(),
                            key: Box::new(LessSafeKey::new(unbound)),
                        });
                    }
                }
            }
            if providers.is_empty() {
                return Err(invalid(
                    &format!("resources[{i}].providers"),
                    "Required value",
                ));
            }
            let t = Arc::new(Transformer {
                providers,
                rng: SystemRandom::new(),
            });
            for (j, name) in r.resources.iter().enumerate() {
                let info = skiff_api::kinds()
                    .iter()
                    .map(|k| k.info())
                    .find(|info| {
                        let qualified = if info.group().is_empty() {
                            info.plural.to_string()
                        } else {
                            format!("{}.{}", info.plural, info.group())
                        };
                        *name == qualified
                    })
                    .ok_or_else(|| {
                        invalid(
                            &format!("resources[{i}].resources[{j}]"),
                            &format!("{name:?} is not a resource Skiff serves"),
                        )
                    })?;
                rules.push((crate::stored::key_prefix(info), Arc::clone(&t)));
            }
        }
        Ok(EncryptionConfig { rules })
    }

    fn transformer(&self, key: &str) -> Option<&Arc<Transformer>> {
        self.rules
            .iter()
            .find(|(prefix, _)| key.starts_with(prefix.as_str()))
            .map(|(_, t)| t)
    }
}

/// The file name of the configuration [`ensure_generated`] writes in the PKI directory.
pub const GENERATED_CONFIG: &str = "encryption-config.yaml";

/// The name of a key [`ensure_generated`] makes (stored values name it): this prefix and
/// the first 4 bytes of the key's SHA-256 in hex, so a server given another cluster's
/// store says that it lacks the key instead of failing to decrypt with a key of that name.
const GENERATED_KEY_PREFIX: &str = "skiff-generated-";

/// The default encryption at rest: `<pki_dir>/encryption-config.yaml`, written on first use
/// (a random 256-bit aesgcm key for `secrets`, then `identity`; mode 0600 in the 0700 PKI
/// directory) and read as it is on later starts, so the key never changes by itself. Two
/// servers starting at once over one PKI directory end up with the same file (the second
/// one's write does not replace the first's). Returns the file's path.
pub fn ensure_generated(
    pki_dir: &std::path::Path,
) -> Result<std::path::PathBuf, EncryptionConfigError> {
    let path = pki_dir.join(GENERATED_CONFIG);
    let write_err = |source| EncryptionConfigError::Write {
        path: path.display().to_string(),
        source,
    };
    skiff_pki::files::private_dir(pki_dir).map_err(write_err)?;
    if path.exists() {
        return Ok(path);
    }
    let mut key = [0u8; 32];
    SystemRandom::new().fill(&mut key).map_err(|_| {
        write_err(std::io::Error::other(
            "no randomness for the encryption key",
        ))
    })?;
    let secret = base64::engine::general_purpose::STANDARD.encode(key);
    let digest = ring::digest::digest(&ring::digest::SHA256, &key);
    let name = format!(
        "{GENERATED_KEY_PREFIX}{}",
        digest.as_ref()[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let text = format!(
        "# Written by skiff-apiserver on first start: encryption at rest of Secrets.\n\
         # Keep it with the store's backups: without this key, Secrets cannot be read.\n\
         apiVersion: apiserver.config.k8s.io/v1\n\
         kind: EncryptionConfiguration\n\
         resources:\n\
         - resources: [secrets]\n  \
           providers:\n  \
           - aesgcm:\n      \
               keys:\n      \
               - name: {name}\n        \
                 secret: {secret}\n  \
           - identity: {{}}\n"
    );
    use std::io::Write as _;
    let mut tmp = skiff_pki::files::temp_beside(&path).map_err(write_err)?;
    tmp.write_all(text.as_bytes()).map_err(write_err)?;
    tmp.as_file().sync_all().map_err(write_err)?;
    match skiff_pki::files::persist_new(tmp, &path) {
        Ok(_) => {
            tracing::info!(path = %path.display(), "generated an encryption key for Secrets at rest");
            Ok(path)
        }
        // Another server of the cluster wrote it first: use that one.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(path),
        Err(e) => Err(write_err(e)),
    }
}

/// A [`Store`] that encrypts the values of the configured resources on the way in and
/// decrypts them on the way out.
pub struct EncryptingStore {
    inner: Arc<dyn Store>,
    config: Arc<EncryptionConfig>,
}

impl std::fmt::Debug for EncryptingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptingStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EncryptingStore {
    pub fn new(inner: Arc<dyn Store>, config: EncryptionConfig) -> EncryptingStore {
        EncryptingStore {
            inner,
            config: Arc::new(config),
        }
    }
}

fn open_kv(config: &EncryptionConfig, mut kv: KeyValue) -> Result<KeyValue, StoreError> {
    if let Some(t) = config.transformer(&kv.key) {
        kv.value = t.read(&kv.key, std::mem::take(&mut kv.value))?;
    }
    Ok(kv)
}

fn seal(config: &EncryptionConfig, key: &str, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
    match config.transformer(key) {
        Some(t) => t.write(key, value),
        None => Ok(value),
    }
}

#[async_trait::async_trait]
impl Store for EncryptingStore {
    async fn get(&self, key: &str) -> skiff_store::Result<Option<KeyValue>> {
        match self.inner.get(key).await? {
            Some(kv) => open_kv(&self.config, kv).map(Some),
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &str, revision: Option<i64>) -> skiff_store::Result<Listing> {
        let listing = self.inner.list(prefix, revision).await?;
        Ok(Listing {
            items: listing
                .items
                .into_iter()
                .map(|kv| open_kv(&self.config, kv))
                .collect::<Result<_, _>>()?,
            revision: listing.revision,
        })
    }

    async fn create(&self, key: &str, value: Vec<u8>) -> skiff_store::Result<KeyValue> {
        let mut kv = self
            .inner
            .create(key, seal(&self.config, key, value.clone())?)
            .await?;
        kv.value = value;
        Ok(kv)
    }

    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_revision: i64,
    ) -> skiff_store::Result<KeyValue> {
        let mut kv = self
            .inner
            .update(
                key,
                seal(&self.config, key, value.clone())?,
                expected_revision,
            )
            .await?;
        kv.value = value;
        Ok(kv)
    }

    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<i64>,
    ) -> skiff_store::Result<(KeyValue, i64)> {
        let (kv, revision) = self.inner.delete(key, expected_revision).await?;
        Ok((open_kv(&self.config, kv)?, revision))
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> skiff_store::Result<WatchStream> {
        use futures::StreamExt;
        let config = Arc::clone(&self.config);
        let stream = self.inner.watch(prefix, after_revision).await?;
        Ok(Box::pin(stream.map(move |ev| {
            ev.and_then(|ev| match ev {
                WatchEvent::Put { kv, prev } => Ok(WatchEvent::Put {
                    kv: open_kv(&config, kv)?,
                    prev: prev.map(|p| open_kv(&config, p)).transpose()?,
                }),
                WatchEvent::Delete { prev, revision } => Ok(WatchEvent::Delete {
                    prev: open_kv(&config, prev)?,
                    revision,
                }),
            })
        })))
    }

    async fn current_revision(&self) -> skiff_store::Result<i64> {
        self.inner.current_revision().await
    }

    async fn compact(&self, revision: i64) -> skiff_store::Result<()> {
        self.inner.compact(revision).await
    }

    /// The inner store's snapshot: values stay encrypted in it, as in the store.
    async fn snapshot(&self, dest: &std::path::Path) -> skiff_store::Result<skiff_store::Snapshot> {
        self.inner.snapshot(dest).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::Resource;

    fn config(providers: &str) -> String {
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
             - resources: [secrets]\n  providers:\n{providers}"
        )
    }

    #[test]
    fn the_generated_configuration_is_private_made_once_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        let path = ensure_generated(&pki).unwrap();
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&pki), 0o700);
        let first = std::fs::read_to_string(&path).unwrap();
        let config = EncryptionConfig::read(&path).unwrap();
        let t = config
            .transformer(&crate::stored::key_prefix(&skiff_api::api::Secret::INFO))
            .unwrap();
        let sealed = t.write("/k", b"plain".to_vec()).unwrap();
        assert!(sealed.starts_with(b"k8s:enc:aesgcm:v1:skiff-generated-"));
        assert_eq!(t.read("/k", sealed).unwrap(), b"plain");
        // Later starts reuse it; another directory gets another key.
        assert_eq!(ensure_generated(&pki).unwrap(), path);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
        let other = ensure_generated(&dir.path().join("other")).unwrap();
        assert_ne!(std::fs::read_to_string(other).unwrap(), first);
        let names: Vec<_> = std::fs::read_dir(&pki)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [GENERATED_CONFIG], "no temporary left");
    }

    const KEY: &str = "    - aesgcm:\n        keys:\n        - name: key1\n          secret: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n";

    #[tokio::test]
    async fn secrets_are_encrypted_in_the_store_and_plain_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn Store> = Arc::new(
            skiff_store::embedded::EmbeddedStore::open(&dir.path().join("db"), Default::default())
                .unwrap(),
        );
        let cfg =
            EncryptionConfig::parse(&config(&format!("{KEY}    - identity: {{}}\n")), "c").unwrap();
        let store = EncryptingStore::new(Arc::clone(&inner), cfg);
        let secret_key = format!(
            "{}default/s",
            crate::stored::key_prefix(&skiff_api::api::Secret::INFO)
        );
        let cm_key = format!(
            "{}default/c",
            crate::stored::key_prefix(&skiff_api::api::ConfigMap::INFO)
        );
        store
            .create(&secret_key, b"top-secret".to_vec())
            .await
            .unwrap();
        store
            .create(&cm_key, b"plain-config".to_vec())
            .await
            .unwrap();
        // Below: ciphertext for the Secret, plain for the ConfigMap.
        let raw = inner.get(&secret_key).await.unwrap().unwrap().value;
        assert!(raw.starts_with(b"k8s:enc:aesgcm:v1:key1:"));
        assert!(!raw.windows(10).any(|w| w == b"top-secret"));
        assert_eq!(
            inner.get(&cm_key).await.unwrap().unwrap().value,
            b"plain-config"
        );
        // Above: plain.
        assert_eq!(
            store.get(&secret_key).await.unwrap().unwrap().value,
            b"top-secret"
        );
        let listed = store
            .list(
                &crate::stored::key_prefix(&skiff_api::api::Secret::INFO),
                None,
            )
            .await
            .unwrap();
        assert_eq!(listed.items[0].value, b"top-secret");
        // A value written before encryption is read through the identity provider.
        let old_key = format!(
            "{}default/old",
            crate::stored::key_prefix(&skiff_api::api::Secret::INFO)
        );
        inner
            .create(&old_key, b"from-before".to_vec())
            .await
            .unwrap();
        assert_eq!(
            store.get(&old_key).await.unwrap().unwrap().value,
            b"from-before"
        );
        // A ciphertext moved to another key does not decrypt (the key is authenticated).
        let moved = format!(
            "{}default/moved",
            crate::stored::key_prefix(&skiff_api::api::Secret::INFO)
        );
        inner.create(&moved, raw).await.unwrap();
        let e = store.get(&moved).await.unwrap_err().to_string();
        assert!(e.contains("does not decrypt"), "{e}");
    }

    #[test]
    fn bad_configurations_name_the_field_and_never_the_key() {
        let err = |text: &str| {
            EncryptionConfig::parse(text, "enc.yaml")
                .unwrap_err()
                .to_string()
        };
        let e = err(&config(
            "    - aesgcm:\n        keys:\n        - name: k\n          secret: c2hvcnQ=\n",
        ));
        assert!(
            e.contains("resources[0].providers[0].aesgcm.keys[0].secret: must be 16 or 32 bytes"),
            "{e}"
        );
        assert!(!e.contains("c2hvcnQ="), "{e}");
        let e = err(&config("    - aescbc:\n        keys: []\n"));
        assert!(
            e.contains("resources[0].providers[0].aescbc: not supported by Skiff"),
            "{e}"
        );
        let e = err(&config("    - identity: {}\n").replace("[secrets]", "[widgets]"));
        assert!(
            e.contains("resources[0].resources[0]: \"widgets\" is not a resource Skiff serves"),
            "{e}"
        );
        let e = err(&config("    - identity: {}\n").replace("apiserver.config.k8s.io/v1", "v1"));
        assert!(
            e.contains("apiVersion: must be apiserver.config.k8s.io/v1"),
            "{e}"
        );
    }
}
