//! Registry credentials from a Docker `config.json` (`{"auths": {"HOST": {"auth":
//! "base64(user:password)"}}}`, or `username`/`password` fields): the file `docker login`,
//! `podman login` and `skopeo login` write, and the one the kubelet reads from its root
//! directory. Keys may be a bare `host[:port]` or a URL (`https://index.docker.io/v1/`);
//! Docker Hub's names are one registry. Errors name the entry and the field, never a secret.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use crate::pull::Credentials;

/// Why a credentials file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("registry credentials {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("registry credentials {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// Credentials by registry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryAuths {
    by_registry: BTreeMap<String, Credentials>,
}

/// `https://host:port/v1/` → `host:port`; Docker Hub's names → `docker.io`.
fn normalize(key: &str) -> String {
    let k = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = k.split('/').next().unwrap_or(k).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".into()
        }
        _ => host,
    }
}

impl RegistryAuths {
    /// Parses a config.json; the message names the entry and field at fault.
    pub fn parse(data: &[u8]) -> Result<RegistryAuths, String> {
        let file: File = serde_json::from_slice(data).map_err(|e| {
            // serde_json's message quotes no values for these types, only positions.
            format!("not a Docker config.json: {e}")
        })?;
        let mut by_registry = BTreeMap::new();
        for (key, e) in file.auths {
            let field = |f: &str| format!("auths[{key:?}].{f}");
            let creds = match (&e.auth, &e.username, &e.password) {
                (Some(a), _, _) if !a.is_empty() => {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(a.trim())
                        .map_err(|_| format!("{}: not valid base64", field("auth")))?;
                    let text = String::from_utf8(raw)
                        .map_err(|_| format!("{}: not UTF-8", field("auth")))?;
                    let (u, p) = text.split_once(':').ok_or_else(|| {
                        format!("{}: not base64 of \"user:password\"", field("auth"))
                    })?;
                    Credentials {
                        username: u.to_string(),
                        password: p.to_string(),
                    }
                }
                (_, Some(u), Some(p)) => Credentials {
                    username: u.clone(),
                    password: p.clone(),
                },
                _ => {
                    return Err(format!(
                        "{}: neither \"auth\" nor \"username\" and \"password\"",
                        format_args!("auths[{key:?}]")
                    ));
                }
            };
            by_registry.insert(normalize(&key), creds);
        }
        Ok(RegistryAuths { by_registry })
    }

    /// Reads `path`; a missing file is no credentials.
    pub fn load(path: &Path) -> Result<RegistryAuths, AuthError> {
        match std::fs::read(path) {
            Ok(data) => RegistryAuths::parse(&data).map_err(|message| AuthError::Invalid {
                path: path.to_path_buf(),
                message,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RegistryAuths::default()),
            Err(source) => Err(AuthError::Io {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// The credentials for `registry` (`host[:port]`, as an image reference names it).
    pub fn for_registry(&self, registry: &str) -> Option<&Credentials> {
        self.by_registry.get(&normalize(registry))
    }

    /// These credentials, then `other`'s for registries these have none for (a pod's
    /// imagePullSecrets before the node's file, as the kubelet orders them).
    pub fn or(mut self, other: &RegistryAuths) -> RegistryAuths {
        for (k, v) in &other.by_registry {
            self.by_registry
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
        self
    }

    pub fn is_empty(&self) -> bool {
        self.by_registry.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_files_are_read() {
        let auths = RegistryAuths::parse(
            br#"{"auths": {
                "https://index.docker.io/v1/": {"auth": "aHViOmh1Yi1wYXNz"},
                "127.0.0.1:5000": {"username": "ci", "password": "s3cret"},
                "quay.io": {"auth": "cXVheTpxLXBhc3M=", "email": "x@y"}
            }, "credsStore": "desktop"}"#,
        )
        .unwrap();
        let hub = auths.for_registry("docker.io").unwrap();
        assert_eq!(
            (hub.username.as_str(), hub.password.as_str()),
            ("hub", "hub-pass")
        );
        assert_eq!(auths.for_registry("index.docker.io"), Some(hub));
        assert_eq!(auths.for_registry("127.0.0.1:5000").unwrap().username, "ci");
        assert_eq!(auths.for_registry("quay.io").unwrap().password, "q-pass");
        assert_eq!(auths.for_registry("ghcr.io"), None);
    }

    #[test]
    fn bad_entries_are_named_without_their_secrets() {
        let e = RegistryAuths::parse(br#"{"auths": {"r.example": {"auth": "!!!s3cret"}}}"#)
            .unwrap_err();
        assert_eq!(e, "auths[\"r.example\"].auth: not valid base64");
        let e =
            RegistryAuths::parse(br#"{"auths": {"r.example": {"auth": "czNjcmV0"}}}"#).unwrap_err();
        assert_eq!(
            e,
            "auths[\"r.example\"].auth: not base64 of \"user:password\""
        );
        assert!(!e.contains("s3cret"));
        let e =
            RegistryAuths::parse(br#"{"auths": {"r.example": {"username": "u"}}}"#).unwrap_err();
        assert!(e.starts_with("auths[\"r.example\"]: neither"), "{e}");
        let missing = RegistryAuths::load(Path::new("/nonexistent/config.json")).unwrap();
        assert!(missing.is_empty());
        let pod =
            RegistryAuths::parse(br#"{"auths": {"r.example": {"auth": "cG9kOnAx"}}}"#).unwrap();
        let node = RegistryAuths::parse(
            br#"{"auths": {"r.example": {"auth": "bm9kZTpuMQ=="}, "q.example": {"auth": "bm9kZTpuMQ=="}}}"#,
        )
        .unwrap();
        let both = pod.or(&node);
        assert_eq!(both.for_registry("r.example").unwrap().username, "pod");
        assert_eq!(both.for_registry("q.example").unwrap().username, "node");
    }
}
