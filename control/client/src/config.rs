//! Where the API server is and who to be: a kubeconfig (`--kubeconfig`, `$SKIFF_CONFIG`, or
//! `$HOME/.config/skiff/config.yaml`, which `cargo xtask up` writes), with the server URL
//! overridable by `--server` or `$SKIFF_SERVER`.

use std::path::{Path, PathBuf};

pub use skiff_pki::Identity;

use crate::error::ClientError;

/// The API server address used when nothing else is configured.
pub const DEFAULT_SERVER: &str = "https://127.0.0.1:7443";
/// Environment variable holding the API server address.
pub const SERVER_ENV: &str = "SKIFF_SERVER";
/// Environment variable holding the path of the kubeconfig file.
pub const CONFIG_ENV: &str = "SKIFF_CONFIG";

/// Where the configured server address came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    Flag,
    Env,
    File(PathBuf),
    Default,
}

/// The resolved client configuration. `Debug` never shows keys or tokens.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// The API server URL, e.g. `https://127.0.0.1:7443`.
    pub server: String,
    pub source: ConfigSource,
    /// The CA(s) the server's certificate must chain to (PEM); required for `https`.
    pub ca_pem: Option<String>,
    /// The name the server's certificate is checked against, when not the URL's host.
    pub tls_server_name: Option<String>,
    /// A client certificate and key.
    pub identity: Option<Identity>,
    /// A bearer token.
    pub token: Option<String>,
    /// The kubeconfig file the credentials came from.
    pub kubeconfig: Option<PathBuf>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("server", &self.server)
            .field("source", &self.source)
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("kubeconfig", &self.kubeconfig)
            .finish()
    }
}

impl ClientConfig {
    /// A configuration with only a server URL (no TLS trust, no credentials): for in-process
    /// plain-HTTP servers of tests.
    pub fn plain(server: &str) -> ClientConfig {
        ClientConfig {
            server: server.to_string(),
            source: ConfigSource::Flag,
            ca_pem: None,
            tls_server_name: None,
            identity: None,
            token: None,
            kubeconfig: None,
        }
    }

    /// Everything a kubeconfig file says (its current context).
    pub fn from_kubeconfig(path: &Path) -> Result<ClientConfig, ClientError> {
        let r = skiff_pki::kubeconfig::load(path).map_err(|e| ClientError::Config {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(ClientConfig {
            server: r.server,
            source: ConfigSource::File(path.to_path_buf()),
            ca_pem: r.ca_pem,
            tls_server_name: r.tls_server_name,
            identity: r.identity,
            token: r.token,
            kubeconfig: Some(path.to_path_buf()),
        })
    }

    /// Resolves the configuration from the process environment: the kubeconfig of
    /// `kubeconfig` (the `--kubeconfig` option; it must exist), else `$SKIFF_CONFIG`, else
    /// `$HOME/.config/skiff/config.yaml` (those two may be missing); then the server URL of
    /// `server` (the `--server` option) or `$SKIFF_SERVER` replaces the file's; without
    /// either, [`DEFAULT_SERVER`].
    pub fn load(
        server: Option<&str>,
        kubeconfig: Option<&Path>,
    ) -> Result<ClientConfig, ClientError> {
        let env = |k: &str| std::env::var(k).ok();
        Self::resolve(
            server,
            env(SERVER_ENV).as_deref(),
            kubeconfig,
            env(CONFIG_ENV).as_deref(),
            env("HOME").as_deref(),
        )
    }

    /// [`ClientConfig::load`] with the environment passed in. Empty values count as unset.
    pub fn resolve(
        flag: Option<&str>,
        server_env: Option<&str>,
        kubeconfig: Option<&Path>,
        config_env: Option<&str>,
        home: Option<&str>,
    ) -> Result<ClientConfig, ClientError> {
        let set = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(String::from);
        let mut config = match kubeconfig.filter(|p| !p.as_os_str().is_empty()) {
            Some(path) => ClientConfig::from_kubeconfig(path)?,
            None => match config_path(config_env, home).filter(|p| p.exists()) {
                Some(path) => ClientConfig::from_kubeconfig(&path)?,
                None => ClientConfig {
                    source: ConfigSource::Default,
                    ..ClientConfig::plain(DEFAULT_SERVER)
                },
            },
        };
        if let Some(server) = set(flag) {
            config.server = server;
            config.source = ConfigSource::Flag;
        } else if let Some(server) = set(server_env) {
            config.server = server;
            config.source = ConfigSource::Env;
        }
        Ok(config)
    }

    /// The API server URL.
    pub fn endpoint(&self) -> &str {
        &self.server
    }
}

/// `$SKIFF_CONFIG`, else `$HOME/.config/skiff/config.yaml`; `None` without either.
pub fn config_path(config_env: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    if let Some(p) = config_env.filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    home.filter(|h| !h.is_empty()).map(|h| {
        Path::new(h)
            .join(".config")
            .join("skiff")
            .join("config.yaml")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_kubeconfig(dir: &Path, name: &str, server: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let id = Identity {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        };
        skiff_pki::Kubeconfig::single("skiff", server, "CA", "admin", Some(&id), None)
            .write(&p)
            .unwrap();
        p
    }

    #[test]
    fn precedence_flag_env_file_default() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_kubeconfig(dir.path(), "c.yaml", "https://file:1");
        let cfg_s = cfg.display().to_string();
        let c = ClientConfig::resolve(
            Some("https://flag:1"),
            Some("https://env:1"),
            None,
            Some(&cfg_s),
            None,
        )
        .unwrap();
        assert_eq!(
            (c.server.as_str(), &c.source),
            ("https://flag:1", &ConfigSource::Flag)
        );
        // The URL is overridden, the credentials stay.
        assert_eq!(c.ca_pem.as_deref(), Some("CA"));
        assert!(c.identity.is_some());
        let c =
            ClientConfig::resolve(None, Some("https://env:1"), None, Some(&cfg_s), None).unwrap();
        assert_eq!(
            (c.server.as_str(), &c.source),
            ("https://env:1", &ConfigSource::Env)
        );
        let c = ClientConfig::resolve(Some(""), Some(""), None, Some(&cfg_s), None).unwrap();
        assert_eq!(c.server, "https://file:1");
        assert_eq!(c.source, ConfigSource::File(cfg.clone()));
        let c = ClientConfig::resolve(None, None, None, None, None).unwrap();
        assert_eq!(
            (c.server.as_str(), &c.source),
            (DEFAULT_SERVER, &ConfigSource::Default)
        );
        // --kubeconfig wins over $SKIFF_CONFIG.
        let other = write_kubeconfig(dir.path(), "o.yaml", "https://other:1");
        let c = ClientConfig::resolve(None, None, Some(&other), Some(&cfg_s), None).unwrap();
        assert_eq!(c.server, "https://other:1");
        assert!(!format!("{c:?}").contains("KEY"));
    }

    #[test]
    fn home_config_file_is_used_without_skiff_config() {
        let dir = tempfile::tempdir().unwrap();
        write_kubeconfig(
            dir.path(),
            ".config/skiff/config.yaml",
            "https://127.0.0.1:7999",
        );
        let home = dir.path().display().to_string();
        let c = ClientConfig::resolve(None, None, None, None, Some(&home)).unwrap();
        assert_eq!(c.server, "https://127.0.0.1:7999");
        // $SKIFF_CONFIG wins over $HOME, and a missing file falls through to the default.
        let missing = dir.path().join("nope.yaml").display().to_string();
        let c = ClientConfig::resolve(None, None, None, Some(&missing), Some(&home)).unwrap();
        assert_eq!(c.source, ConfigSource::Default);
    }

    #[test]
    fn malformed_or_missing_explicit_config_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        std::fs::write(&p, "clusters: [1, 2]\n").unwrap();
        let err = ClientConfig::resolve(None, None, None, Some(&p.display().to_string()), None)
            .unwrap_err();
        assert!(matches!(err, ClientError::Config { .. }), "{err}");
        let err = ClientConfig::resolve(None, None, Some(&dir.path().join("none")), None, None)
            .unwrap_err();
        assert!(err.to_string().contains("none"), "{err}");
    }
}
