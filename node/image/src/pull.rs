//! Pulling images from OCI distribution registries into the [`BlobStore`], with `oci-client`
//! for the protocol (anonymous, basic and bearer-token auth, manifests, blob streams).
//!
//! Every manifest and blob is verified against its digest before it gets its name in the
//! store (a digest reference must match the manifest exactly); an index resolves to its
//! linux/amd64 manifest; blobs already in the store are not fetched again; concurrent pulls
//! of one reference wait for each other instead of downloading twice. Errors say which
//! Kubernetes waiting reason they are ([`PullError::reason`]). Credentials never appear in
//! errors or logs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest};
use tracing::{debug, info};

use crate::digest::Digest;
use crate::layout::{Blob, Image};
use crate::store::{BlobStore, StoreError};

/// The manifest media types a pull accepts (OCI and Docker, single and multi-platform).
const ACCEPTED: [&str; 4] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// How often a large blob's progress is logged.
const PROGRESS_EVERY: u64 = 16 * 1024 * 1024;
/// The largest manifest read.
const MAX_MANIFEST: u64 = 4 * 1024 * 1024;

/// A user name and password for a registry. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("invalid image name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("{image}: not found in the registry")]
    NotFound { image: String },
    #[error("{image}: the registry refused the credentials: {reason}")]
    Unauthorized { image: String, reason: String },
    #[error("{image}: the registry cannot be reached: {reason}")]
    Unreachable { image: String, reason: String },
    #[error("{image}: {reason}")]
    Registry { image: String, reason: String },
    #[error("{image}: {reason}")]
    Invalid { image: String, reason: String },
    #[error("{image}: {source}")]
    Store {
        image: String,
        #[source]
        source: StoreError,
    },
}

impl PullError {
    /// The waiting reason Kubernetes shows for this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            PullError::InvalidName { .. } => "InvalidImageName",
            _ => "ErrImagePull",
        }
    }
}

/// Pulls images into a blob store.
pub struct Puller {
    /// A client is made per pull: oci-client keeps the first credentials it saw for a
    /// registry, and pulls may come with different ones.
    plain_http: Vec<String>,
    blobs: BlobStore,
    /// One lock per reference being pulled.
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Puller")
            .field("blobs", &self.blobs)
            .finish_non_exhaustive()
    }
}

impl Puller {
    /// A puller into `blobs`; the registries in `plain_http` (`host:port`) and those on
    /// loopback (`localhost`, `127.0.0.0/8`, `[::1]`, as Docker treats them) are spoken to
    /// over HTTP, every other one over HTTPS.
    pub fn new(blobs: BlobStore, plain_http: &[String]) -> Puller {
        // rustls needs one process-wide crypto provider; a second install is refused, fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Puller {
            plain_http: plain_http.to_vec(),
            blobs,
            inflight: Mutex::new(HashMap::new()),
        }
    }

    /// Pulls `name` with the credentials `auths` has for its registry, or anonymously.
    pub async fn pull_with(
        &self,
        name: &str,
        auths: &crate::auth::RegistryAuths,
    ) -> Result<Image, PullError> {
        let reference = parse_reference(name)?;
        self.pull(name, auths.for_registry(reference.registry()))
            .await
    }

    /// Pulls `name` (`registry/repository:tag` or `@sha256:...`; Docker Hub's defaults
    /// apply to short names) with `credentials`, or anonymously.
    pub async fn pull(
        &self,
        name: &str,
        credentials: Option<&Credentials>,
    ) -> Result<Image, PullError> {
        let reference = parse_reference(name)?;
        let lock = {
            let mut map = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(reference.whole())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
                .clone()
        };
        let _guard = lock.lock().await;
        let auth = match credentials {
            Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
            None => RegistryAuth::Anonymous,
        };
        let image = name.to_string();
        let started = std::time::Instant::now();
        let mut plain = self.plain_http.clone();
        if is_loopback(reference.registry()) {
            plain.push(reference.registry().to_string());
        }
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(plain),
            ..Default::default()
        });
        let (manifest_digest, bytes) = self.manifest(&client, &reference, &auth, &image).await?;
        let top: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| invalid(&image, e))?;
        let (manifest_digest, bytes) = if top.get("manifests").is_some() {
            let index: ImageIndex =
                serde_json::from_slice(&bytes).map_err(|e| invalid(&image, e))?;
            let chosen = crate::layout::linux_amd64(&index).ok_or_else(|| PullError::Invalid {
                image: image.clone(),
                reason: format!("index {manifest_digest} has no linux/amd64 image"),
            })?;
            let at = reference.clone_with_digest(chosen.digest().to_string());
            self.manifest(&client, &at, &auth, &image).await?
        } else {
            (manifest_digest, bytes)
        };
        let manifest: ImageManifest =
            serde_json::from_slice(&bytes).map_err(|e| invalid(&image, e))?;
        let mut size = bytes.len() as u64;
        let (config_blob, layer_blobs) =
            crate::layout::blobs_of(&manifest).map_err(|reason| PullError::Invalid {
                image: image.clone(),
                reason,
            })?;
        self.blob(&client, &reference, &config_blob, &image).await?;
        size += config_blob.size;
        let config_bytes =
            self.blobs
                .read(&config_blob.digest)
                .map_err(|source| PullError::Store {
                    image: image.clone(),
                    source,
                })?;
        let config: ImageConfiguration =
            serde_json::from_slice(&config_bytes).map_err(|e| invalid(&image, e))?;
        let mut layers = Vec::new();
        for (blob, compression) in layer_blobs {
            self.blob(&client, &reference, &blob, &image).await?;
            size += blob.size;
            layers.push((blob.digest, compression));
        }
        info!(%image, digest = %manifest_digest, size, elapsed = ?started.elapsed(), "pulled");
        Ok(Image {
            manifest: manifest_digest,
            config,
            layers,
            size,
        })
    }

    /// Fetches a manifest, verifies it against its digest (the reference's, when it names
    /// one) and stores it.
    async fn manifest(
        &self,
        client: &Client,
        reference: &Reference,
        auth: &RegistryAuth,
        image: &str,
    ) -> Result<(Digest, Vec<u8>), PullError> {
        let (bytes, _) = client
            .pull_manifest_raw(reference, auth, &ACCEPTED)
            .await
            .map_err(|e| classify(e, image))?;
        if bytes.len() as u64 > MAX_MANIFEST {
            return Err(PullError::Invalid {
                image: image.to_string(),
                reason: format!("a manifest of {} bytes is too large", bytes.len()),
            });
        }
        let actual = Digest::of(&bytes);
        if let Some(want) = reference.digest() {
            let want: Digest = want.parse().map_err(|e| PullError::InvalidName {
                name: image.to_string(),
                reason: format!("{e}"),
            })?;
            if want != actual {
                return Err(PullError::Store {
                    image: image.to_string(),
                    source: StoreError::DigestMismatch {
                        expected: want,
                        actual,
                    },
                });
            }
        }
        self.blobs
            .put(&actual, &mut &bytes[..], bytes.len() as u64)
            .map_err(|source| PullError::Store {
                image: image.to_string(),
                source,
            })?;
        Ok((actual, bytes.to_vec()))
    }

    /// Fetches `blob` unless it is stored already.
    async fn blob(
        &self,
        client: &Client,
        reference: &Reference,
        blob: &Blob,
        image: &str,
    ) -> Result<(), PullError> {
        let store_err = |source| PullError::Store {
            image: image.to_string(),
            source,
        };
        let expected = &blob.digest;
        if self.blobs.contains(expected) {
            debug!(%image, blob = %expected, "blob already stored");
            return Ok(());
        }
        let started = std::time::Instant::now();
        let mut stream = client
            .pull_blob_stream(reference, expected.to_string().as_str())
            .await
            .map_err(|e| classify(e, image))?;
        let mut writer = self.blobs.writer(expected, blob.size).map_err(store_err)?;
        // Progress in the log every 16 MiB of a large blob.
        let (mut got, mut next_report) = (0u64, PROGRESS_EVERY);
        while let Some(chunk) = stream.stream.next().await {
            let chunk = chunk.map_err(|e| stream_error(e, expected, image))?;
            writer.write(&chunk).map_err(store_err)?;
            got += chunk.len() as u64;
            if got >= next_report {
                info!(%image, blob = %expected, bytes = got, of = blob.size, "pulling");
                next_report += PROGRESS_EVERY;
            }
        }
        writer.finish().map_err(store_err)?;
        let secs = started.elapsed().as_secs_f64();
        info!(%image, blob = %expected, bytes = got, mb_per_s = got as f64 / 1e6 / secs.max(1e-6),
            "blob pulled and verified");
        Ok(())
    }
}

/// A failure while a blob streams in: oci-client checks the digest as the bytes arrive and
/// ends the stream with a verification error; anything else is the connection.
fn stream_error(e: std::io::Error, expected: &Digest, image: &str) -> PullError {
    let verification = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<oci_client::errors::DigestError>())
        .and_then(|d| match d {
            oci_client::errors::DigestError::VerificationError { actual, .. } => {
                actual.parse::<Digest>().ok()
            }
            _ => None,
        });
    match verification {
        Some(actual) => PullError::Store {
            image: image.to_string(),
            source: StoreError::DigestMismatch {
                expected: expected.clone(),
                actual,
            },
        },
        None => PullError::Unreachable {
            image: image.to_string(),
            reason: format!("reading blob {expected}: {e}"),
        },
    }
}

/// An image reference, or InvalidImageName.
fn parse_reference(name: &str) -> Result<Reference, PullError> {
    name.parse()
        .map_err(|e: oci_client::ParseError| PullError::InvalidName {
            name: name.to_string(),
            reason: e.to_string(),
        })
}

/// Whether a registry (`host[:port]`) is on this machine's loopback.
fn is_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => registry.split(':').next().unwrap_or(registry),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn invalid(image: &str, e: impl std::fmt::Display) -> PullError {
    PullError::Invalid {
        image: image.to_string(),
        reason: e.to_string(),
    }
}

/// Sorts oci-client's errors into what a user can act on.
fn classify(e: OciDistributionError, image: &str) -> PullError {
    let image = image.to_string();
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => PullError::NotFound { image },
        OciDistributionError::AuthenticationFailure(reason) => {
            PullError::Unauthorized { image, reason }
        }
        OciDistributionError::UnauthorizedError { .. } => PullError::Unauthorized {
            image,
            reason: "401 Unauthorized".into(),
        },
        OciDistributionError::RequestError(err) => PullError::Unreachable {
            image,
            reason: err.to_string(),
        },
        OciDistributionError::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::NameUnknown
                        | oci_client::errors::OciErrorCode::BlobUnknown
                )
            }) =>
        {
            PullError::NotFound { image }
        }
        OciDistributionError::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::Unauthorized
                        | oci_client::errors::OciErrorCode::Denied
                )
            }) =>
        {
            PullError::Unauthorized {
                image,
                reason: "the registry denied access".into(),
            }
        }
        other => PullError::Registry {
            image,
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_registries() {
        for r in [
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
            "localhost",
        ] {
            assert!(super::is_loopback(r), "{r}");
        }
        for r in [
            "registry.example:5000",
            "10.0.0.1:5000",
            "docker.io",
            "localhost.example",
        ] {
            assert!(!super::is_loopback(r), "{r}");
        }
    }
}
