//! The kubeconfig file (kubectl's `~/.kube/config` format), read and written, so the one file
//! `cargo xtask up` or `skiff-apiserver` writes serves kubectl, client libraries and every
//! Skiff component alike.
//!
//! Written by hand over serde rather than taken from kube-rs' `kube-client`: that crate
//! brings its own HTTP and TLS stack for what is here a few structs; unknown fields
//! (preferences, extensions) are ignored as kubectl does.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};

use crate::{Identity, PkiError};

/// A kubeconfig file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kubeconfig {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub clusters: Vec<NamedCluster>,
    #[serde(default)]
    pub users: Vec<NamedUser>,
    #[serde(default)]
    pub contexts: Vec<NamedContext>,
    #[serde(rename = "current-context", default)]
    pub current_context: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedCluster {
    pub name: String,
    pub cluster: Cluster,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    pub server: String,
    #[serde(
        rename = "certificate-authority",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub certificate_authority: Option<String>,
    #[serde(
        rename = "certificate-authority-data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub certificate_authority_data: Option<String>,
    #[serde(
        rename = "insecure-skip-tls-verify",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub insecure_skip_tls_verify: bool,
    #[serde(
        rename = "tls-server-name",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub tls_server_name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedUser {
    pub name: String,
    #[serde(default)]
    pub user: User,
}

/// A user's credentials. `Debug` shows which kinds are set, never their values.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    #[serde(
        rename = "client-certificate",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_certificate: Option<String>,
    #[serde(
        rename = "client-certificate-data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_certificate_data: Option<String>,
    #[serde(
        rename = "client-key",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_key: Option<String>,
    #[serde(
        rename = "client-key-data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_key_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(rename = "tokenFile", default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// Present only to refuse it by name: Skiff's clients do not run credential plugins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<yaml_serde::Value>,
    #[serde(
        rename = "auth-provider",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub auth_provider: Option<yaml_serde::Value>,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("client_certificate", &self.client_certificate)
            .field(
                "client_certificate_data",
                &self.client_certificate_data.is_some(),
            )
            .field("client_key", &self.client_key)
            .field("client_key_data", &self.client_key_data.is_some())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedContext {
    pub name: String,
    pub context: Context,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    pub cluster: String,
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// What a client needs from a kubeconfig: where the server is, whom to trust, who to be.
/// `Debug` never shows keys or tokens.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ResolvedKubeconfig {
    pub server: String,
    /// PEM of the CA(s) that sign the server's certificate.
    pub ca_pem: Option<String>,
    /// The name to check the server's certificate against, when not the URL's host.
    pub tls_server_name: Option<String>,
    /// A client certificate and key.
    pub identity: Option<Identity>,
    /// A bearer token.
    pub token: Option<String>,
    /// The context's namespace, if it names one.
    pub namespace: Option<String>,
}

impl std::fmt::Debug for ResolvedKubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedKubeconfig")
            .field("server", &self.server)
            .field("ca", &self.ca_pem.is_some())
            .field("tls_server_name", &self.tls_server_name)
            .field("client_certificate", &self.identity.is_some())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Kubeconfig {
    /// A kubeconfig with one cluster, one user and one context, everything embedded:
    /// `server`, trusting `ca_pem`, authenticating with `identity` or `token`.
    pub fn single(
        name: &str,
        server: &str,
        ca_pem: &str,
        user: &str,
        identity: Option<&Identity>,
        token: Option<&str>,
    ) -> Kubeconfig {
        Kubeconfig {
            api_version: "v1".into(),
            kind: "Config".into(),
            clusters: vec![NamedCluster {
                name: name.into(),
                cluster: Cluster {
                    server: server.into(),
                    certificate_authority_data: Some(B64.encode(ca_pem)),
                    ..Cluster::default()
                },
            }],
            users: vec![NamedUser {
                name: user.into(),
                user: User {
                    client_certificate_data: identity.map(|i| B64.encode(&i.cert_pem)),
                    client_key_data: identity.map(|i| B64.encode(&i.key_pem)),
                    token: token.map(String::from),
                    ..User::default()
                },
            }],
            contexts: vec![NamedContext {
                name: name.into(),
                context: Context {
                    cluster: name.into(),
                    user: user.into(),
                    namespace: None,
                },
            }],
            current_context: name.into(),
        }
    }

    /// Parses a kubeconfig's text (`path` names it in errors).
    pub fn parse(text: &str, path: &str) -> Result<Kubeconfig, PkiError> {
        yaml_serde::from_str(text).map_err(|e| PkiError::Kubeconfig {
            path: path.into(),
            reason: format!("invalid kubeconfig: {e}"),
        })
    }

    /// Reads and parses a kubeconfig file.
    pub fn read(path: &Path) -> Result<Kubeconfig, PkiError> {
        let text = std::fs::read_to_string(path).map_err(|source| PkiError::Io {
            action: "read",
            path: path.display().to_string(),
            source,
        })?;
        Kubeconfig::parse(&text, &path.display().to_string())
    }

    /// The YAML text.
    pub fn to_yaml(&self) -> String {
        yaml_serde::to_string(self).unwrap_or_default()
    }

    /// Writes the file (mode 0600: it holds credentials), replacing it atomically.
    pub fn write(&self, path: &Path) -> Result<(), PkiError> {
        crate::bootstrap::write_private(path, self.to_yaml().as_bytes())
    }

    /// The current context's server, CA and credentials. Paths in the file are relative to
    /// `base` (the kubeconfig's directory), as kubectl reads them.
    pub fn resolve(&self, path: &str, base: &Path) -> Result<ResolvedKubeconfig, PkiError> {
        let err = |reason: String| PkiError::Kubeconfig {
            path: path.to_string(),
            reason,
        };
        let context = if self.current_context.is_empty() {
            match self.contexts.as_slice() {
                [only] => only,
                [] => return Err(err("no context".into())),
                _ => return Err(err("current-context is not set".into())),
            }
        } else {
            self.contexts
                .iter()
                .find(|c| c.name == self.current_context)
                .ok_or_else(|| {
                    err(format!(
                        "current-context {:?} names no context",
                        self.current_context
                    ))
                })?
        };
        let cluster = self
            .clusters
            .iter()
            .find(|c| c.name == context.context.cluster)
            .ok_or_else(|| {
                err(format!(
                    "context {:?}: cluster {:?} is not in the file",
                    context.name, context.context.cluster
                ))
            })?;
        let user = self
            .users
            .iter()
            .find(|u| u.name == context.context.user)
            .map(|u| u.user.clone())
            .unwrap_or_default();
        let c = &cluster.cluster;
        if c.server.is_empty() {
            return Err(err(format!("cluster {:?}: server is empty", cluster.name)));
        }
        if c.insecure_skip_tls_verify {
            return Err(err(format!(
                "cluster {:?}: insecure-skip-tls-verify is not supported; give the CA with \
                 certificate-authority-data",
                cluster.name
            )));
        }
        if user.exec.is_some() || user.auth_provider.is_some() {
            return Err(err(format!(
                "user {:?}: credential plugins (exec, auth-provider) are not supported",
                context.context.user
            )));
        }
        let field = |data: &Option<String>,
                     file: &Option<String>,
                     name: &str|
         -> Result<Option<String>, PkiError> {
            if let Some(d) = data {
                let bytes = B64
                    .decode(d.trim())
                    .map_err(|e| err(format!("{name}-data: not base64: {e}")))?;
                return String::from_utf8(bytes)
                    .map(Some)
                    .map_err(|_| err(format!("{name}-data: not PEM text")));
            }
            if let Some(f) = file {
                let p = resolve_path(base, f);
                return std::fs::read_to_string(&p)
                    .map(Some)
                    .map_err(|e| err(format!("{name}: cannot read {}: {e}", p.display())));
            }
            Ok(None)
        };
        let ca_pem = field(
            &c.certificate_authority_data,
            &c.certificate_authority,
            "certificate-authority",
        )?;
        let cert = field(
            &user.client_certificate_data,
            &user.client_certificate,
            "client-certificate",
        )?;
        let key = field(&user.client_key_data, &user.client_key, "client-key")?;
        let identity = match (cert, key) {
            (Some(cert_pem), Some(key_pem)) => Some(Identity { cert_pem, key_pem }),
            (None, None) => None,
            (Some(_), None) => return Err(err("client-certificate without client-key".into())),
            (None, Some(_)) => return Err(err("client-key without client-certificate".into())),
        };
        let token = match (&user.token, &user.token_file) {
            (Some(t), _) => Some(t.trim().to_string()),
            (None, Some(f)) => {
                let p = resolve_path(base, f);
                Some(
                    std::fs::read_to_string(&p)
                        .map_err(|e| err(format!("tokenFile: cannot read {}: {e}", p.display())))?
                        .trim()
                        .to_string(),
                )
            }
            (None, None) => None,
        };
        Ok(ResolvedKubeconfig {
            server: c.server.clone(),
            ca_pem,
            tls_server_name: c.tls_server_name.clone(),
            identity,
            token,
            namespace: context.context.namespace.clone(),
        })
    }
}

fn resolve_path(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// Reads the kubeconfig at `path` and resolves its current context.
pub fn load(path: &Path) -> Result<ResolvedKubeconfig, PkiError> {
    let kc = Kubeconfig::read(path)?;
    kc.resolve(
        &path.display().to_string(),
        path.parent().unwrap_or(Path::new(".")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_kubeconfig_resolves_to_its_credentials() {
        let id = Identity {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        };
        let kc = Kubeconfig::single(
            "skiff",
            "https://127.0.0.1:1",
            "CA",
            "admin",
            Some(&id),
            None,
        );
        let text = kc.to_yaml();
        assert!(text.contains("certificate-authority-data"), "{text}");
        assert!(text.contains("current-context: skiff"), "{text}");
        let back = Kubeconfig::parse(&text, "k").unwrap();
        let r = back.resolve("k", Path::new("/")).unwrap();
        assert_eq!(r.server, "https://127.0.0.1:1");
        assert_eq!(r.ca_pem.as_deref(), Some("CA"));
        assert_eq!(r.identity, Some(id));
        assert!(!format!("{r:?}").contains("KEY"));
    }

    #[test]
    fn kubectl_style_files_with_paths_and_tokens() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), "CAFILE").unwrap();
        std::fs::write(dir.path().join("tok"), "secret-token\n").unwrap();
        let text = "apiVersion: v1\nkind: Config\npreferences: {}\nclusters:\n- name: c\n  cluster:\n    server: https://h:6443\n    certificate-authority: ca.crt\n    extensions: []\nusers:\n- name: u\n  user:\n    tokenFile: tok\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: shop\ncurrent-context: x\n";
        std::fs::write(dir.path().join("config"), text).unwrap();
        let r = load(&dir.path().join("config")).unwrap();
        assert_eq!(r.ca_pem.as_deref(), Some("CAFILE"));
        assert_eq!(r.token.as_deref(), Some("secret-token"));
        assert_eq!(r.namespace.as_deref(), Some("shop"));
        assert!(!format!("{r:?}").contains("secret-token"));
    }

    #[test]
    fn unusable_kubeconfigs_say_why() {
        let base = "apiVersion: v1\nclusters:\n- name: c\n  cluster:\n    server: https://h\n";
        let cases = [
            (format!("{base}contexts: []\n"), "no context"),
            (
                format!(
                    "{base}contexts:\n- name: x\n  context: {{cluster: nope, user: u}}\ncurrent-context: x\n"
                ),
                "cluster \"nope\" is not in the file",
            ),
            (
                format!(
                    "{base}users:\n- name: u\n  user:\n    exec: {{command: x}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\n"
                ),
                "credential plugins",
            ),
            (
                format!(
                    "{base}users:\n- name: u\n  user:\n    client-certificate-data: Q0VSVA==\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\n"
                ),
                "client-certificate without client-key",
            ),
        ];
        for (text, want) in cases {
            let e = Kubeconfig::parse(&text, "f")
                .and_then(|k| k.resolve("f", Path::new("/")))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e} should contain {want}");
        }
    }
}
