//! Where the API server is and who to be: a kubeconfig (`--kubeconfig`, `$SKIFF_CONFIG`, or
//! `$HOME/.config/skiff/config.yaml`, which `cargo xtask up` writes), with the server URL
//! overridable by `--server` or `$SKIFF_SERVER`.
//!
//! A server address may be a comma-separated list of URLs
//! (`https://10.0.0.1:7443,https://10.0.0.2:7443`): several API servers over one store, which
//! the client fails over between ([`crate::api::Client`]). That holds for `--server`,
//! `$SKIFF_SERVER` and the kubeconfig's `clusters[].cluster.server` alike; the list in a
//! kubeconfig is Skiff's extension (kubectl takes one URL there).

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
    /// The (primary) API server URL, e.g. `https://127.0.0.1:7443`: the first of `servers`.
    pub server: String,
    /// Every API server URL, `server` first: more than one when the address was a
    /// comma-separated list. See [`ClientConfig::endpoints`].
    pub servers: Vec<String>,
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
            .field("servers", &self.servers)
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
    /// plain-HTTP servers of tests. A comma-separated list is split (and checked on connect).
    pub fn plain(server: &str) -> ClientConfig {
        let servers = split_servers(server);
        ClientConfig {
            server: servers.first().cloned().unwrap_or_default(),
            servers,
            source: ConfigSource::Flag,
            ca_pem: None,
            tls_server_name: None,
            identity: None,
            token: None,
            kubeconfig: None,
        }
    }

    /// Everything a kubeconfig file says (its current context). Its server may be a
    /// comma-separated list of URLs.
    pub fn from_kubeconfig(path: &Path) -> Result<ClientConfig, ClientError> {
        let r = skiff_pki::kubeconfig::load(path).map_err(|e| ClientError::Config {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let servers = parse_servers(&r.server)?;
        Ok(ClientConfig {
            server: servers[0].clone(),
            servers,
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
    /// either, [`DEFAULT_SERVER`]. Each may be a comma-separated list of URLs.
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

    /// [`ClientConfig::load`] with the environment passed in. Empty values count as unset;
    /// a list with an empty item, a duplicate or an item that is not a URL is
    /// [`ClientError::InvalidEndpoint`].
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
        let (value, source) = match (set(flag), set(server_env)) {
            (Some(v), _) => (v, ConfigSource::Flag),
            (None, Some(v)) => (v, ConfigSource::Env),
            (None, None) => return Ok(config),
        };
        config.servers = parse_servers(&value)?;
        config.server = config.servers[0].clone();
        config.source = source;
        Ok(config)
    }

    /// The (primary) API server URL.
    pub fn endpoint(&self) -> &str {
        &self.server
    }

    /// The API server URLs to use, the primary first: `servers` when it starts with
    /// `server`, else `server` split at commas (a configuration whose `server` was replaced
    /// directly).
    pub fn endpoints(&self) -> Vec<&str> {
        if self.servers.first() == Some(&self.server) {
            self.servers.iter().map(String::as_str).collect()
        } else {
            self.server.split(',').map(str::trim).collect()
        }
    }
}

/// The items of a comma-separated server list, trimmed (empty ones kept, for
/// [`check_servers`] to name).
fn split_servers(list: &str) -> Vec<String> {
    list.split(',').map(|s| s.trim().to_string()).collect()
}

/// A comma-separated list of API server URLs, checked: see [`check_servers`].
pub fn parse_servers(list: &str) -> Result<Vec<String>, ClientError> {
    let servers = split_servers(list);
    check_servers(&servers)?;
    Ok(servers)
}

/// Checks a list of API server URLs: none empty, none twice, each a URL (`host:port` alone
/// means `http://host:port`, as [`crate::Client::connect`] takes it). The error names the
/// offending item.
pub fn check_servers<S: AsRef<str>>(servers: &[S]) -> Result<(), ClientError> {
    let invalid = |endpoint: &str, reason: String| ClientError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let all = || {
        servers
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<_>>()
            .join(",")
    };
    if servers.is_empty() {
        return Err(invalid("", "no API server URL".into()));
    }
    for (i, s) in servers.iter().map(AsRef::as_ref).enumerate() {
        if s.is_empty() {
            return Err(invalid(
                &all(),
                format!("item {} of the comma-separated list is empty", i + 1),
            ));
        }
        if servers[..i].iter().any(|o| o.as_ref() == s) {
            return Err(invalid(s, "listed more than once".into()));
        }
        let url = crate::api::url_of(s);
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| invalid(s, crate::error::transport_reason(&e)))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(invalid(s, "the scheme must be http:// or https://".into()));
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(invalid(s, "no host".into()));
        }
    }
    Ok(())
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
    fn a_server_address_may_be_a_list() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_kubeconfig(dir.path(), "c.yaml", "https://a:1,https://b:2");
        let c = ClientConfig::from_kubeconfig(&cfg).unwrap();
        assert_eq!(c.server, "https://a:1");
        assert_eq!(c.servers, ["https://a:1", "https://b:2"]);
        assert_eq!(c.endpoints(), ["https://a:1", "https://b:2"]);
        // Spaces around the commas are fine; the flag's list replaces the file's.
        let c = ClientConfig::resolve(
            Some(" https://f:1 , 10.0.0.2:7443"),
            None,
            Some(&cfg),
            None,
            None,
        )
        .unwrap();
        assert_eq!(c.servers, ["https://f:1", "10.0.0.2:7443"]);
        assert_eq!(c.endpoint(), "https://f:1");
        assert_eq!(c.ca_pem.as_deref(), Some("CA"));
        let c =
            ClientConfig::resolve(None, Some("http://e:1,http://e:2"), None, None, None).unwrap();
        assert_eq!((c.servers.len(), &c.source), (2, &ConfigSource::Env));
        // One URL is a list of one.
        let c = ClientConfig::resolve(Some("https://one:1"), None, None, None, None).unwrap();
        assert_eq!(c.servers, ["https://one:1"]);
        assert_eq!(
            ClientConfig::plain("http://a:1,http://b:1")
                .endpoints()
                .len(),
            2
        );
        // A configuration whose `server` was replaced uses that.
        let mut c = ClientConfig::plain("http://a:1,http://b:1");
        c.server = "http://c:1".into();
        assert_eq!(c.endpoints(), ["http://c:1"]);
    }

    #[test]
    fn bad_server_lists_name_the_item() {
        let check = |list: &str| match ClientConfig::resolve(Some(list), None, None, None, None) {
            Err(ClientError::InvalidEndpoint { endpoint, reason }) => (endpoint, reason),
            other => panic!("{list}: {other:?}"),
        };
        let (item, reason) = check("https://a:1,,https://b:2");
        assert_eq!(item, "https://a:1,,https://b:2");
        assert_eq!(reason, "item 2 of the comma-separated list is empty");
        assert_eq!(
            check("https://a:1,").1,
            "item 2 of the comma-separated list is empty"
        );
        let (item, reason) = check("https://a:1,https://b:2,https://a:1");
        assert_eq!(
            (item.as_str(), reason.as_str()),
            ("https://a:1", "listed more than once")
        );
        let (item, reason) = check("https://a:1,http://bad host:1");
        assert_eq!(item, "http://bad host:1");
        assert!(!reason.is_empty());
        let (item, reason) = check("https://a:1,ftp://b:2");
        assert_eq!(item, "ftp://b:2");
        assert!(reason.contains("http:// or https://"), "{reason}");
        let (item, reason) = check("https://a:1,https://");
        assert_eq!(item, "https://");
        assert!(!reason.is_empty());
        // In a kubeconfig too.
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_kubeconfig(dir.path(), "c.yaml", "https://a:1,https://a:1");
        let err = ClientConfig::from_kubeconfig(&cfg).unwrap_err();
        assert!(
            err.to_string()
                .contains("invalid API server address \"https://a:1\": listed more than once"),
            "{err}"
        );
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
