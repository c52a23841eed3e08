//! Where the API server is: `--server` flag, `$SKIFF_SERVER`, the config file, or the default.

use std::path::{Path, PathBuf};

use crate::error::ClientError;

/// The API server address used when nothing else is configured.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7443";
/// Environment variable holding the API server address.
pub const SERVER_ENV: &str = "SKIFF_SERVER";
/// Environment variable holding the path of the config file.
pub const CONFIG_ENV: &str = "SKIFF_CONFIG";

/// Where the configured server address came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    Flag,
    Env,
    File(PathBuf),
    Default,
}

/// The resolved client configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// The API server URL, e.g. `http://127.0.0.1:7443`.
    pub server: String,
    pub source: ConfigSource,
}

impl ClientConfig {
    /// Resolves the server address from the process environment, in order of precedence:
    /// `flag` (the `--server` option), `$SKIFF_SERVER`, the config file (`$SKIFF_CONFIG`, else
    /// `$HOME/.config/skiff/config.yaml`, a YAML mapping with a `server:` key, written by
    /// `cargo xtask up`), and [`DEFAULT_SERVER`]. A missing config file is not an error; an
    /// unreadable or malformed one is.
    pub fn load(flag: Option<&str>) -> Result<ClientConfig, ClientError> {
        let env = |k: &str| std::env::var(k).ok();
        Self::resolve(
            flag,
            env(SERVER_ENV).as_deref(),
            env(CONFIG_ENV).as_deref(),
            env("HOME").as_deref(),
        )
    }

    /// [`ClientConfig::load`] with the environment passed in. Empty values count as unset.
    pub fn resolve(
        flag: Option<&str>,
        server_env: Option<&str>,
        config_env: Option<&str>,
        home: Option<&str>,
    ) -> Result<ClientConfig, ClientError> {
        let set = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(String::from);
        if let Some(server) = set(flag) {
            return Ok(ClientConfig {
                server,
                source: ConfigSource::Flag,
            });
        }
        if let Some(server) = set(server_env) {
            return Ok(ClientConfig {
                server,
                source: ConfigSource::Env,
            });
        }
        if let Some(path) = config_path(config_env, home)
            && let Some(server) = read_config_file(&path)?
        {
            return Ok(ClientConfig {
                server,
                source: ConfigSource::File(path),
            });
        }
        Ok(ClientConfig {
            server: DEFAULT_SERVER.to_string(),
            source: ConfigSource::Default,
        })
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

/// The `server` of a config file; `None` if the file does not exist or has no `server`.
fn read_config_file(path: &Path) -> Result<Option<String>, ClientError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ClientError::Config {
                path: path.display().to_string(),
                message: e.to_string(),
            });
        }
    };
    parse_config(&text).map_err(|message| ClientError::Config {
        path: path.display().to_string(),
        message,
    })
}

/// Parses the config file's text: a YAML mapping whose `server` key, if present, must be a
/// string. Other keys are ignored (later versions may add some).
pub fn parse_config(text: &str) -> Result<Option<String>, String> {
    let value: yaml_serde::Value =
        yaml_serde::from_str(text).map_err(|e| format!("invalid YAML: {e}"))?;
    match value {
        yaml_serde::Value::Null => Ok(None),
        yaml_serde::Value::Mapping(m) => match m.get("server") {
            None | Some(yaml_serde::Value::Null) => Ok(None),
            Some(yaml_serde::Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(yaml_serde::Value::String(s)) => Ok(Some(s.trim().to_string())),
            Some(_) => Err("server: must be a string such as http://127.0.0.1:7443".into()),
        },
        _ => Err("expected a mapping with a `server:` key".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> String {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    #[test]
    fn precedence_flag_env_file_default() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write(dir.path(), "c.yaml", "server: http://file:1\n");
        let c = ClientConfig::resolve(
            Some("http://flag:1"),
            Some("http://env:1"),
            Some(&cfg),
            None,
        )
        .unwrap();
        assert_eq!(
            (c.server.as_str(), &c.source),
            ("http://flag:1", &ConfigSource::Flag)
        );
        let c = ClientConfig::resolve(None, Some("http://env:1"), Some(&cfg), None).unwrap();
        assert_eq!(
            (c.server.as_str(), &c.source),
            ("http://env:1", &ConfigSource::Env)
        );
        let c = ClientConfig::resolve(Some(""), Some(""), Some(&cfg), None).unwrap();
        assert_eq!(c.server, "http://file:1");
        assert_eq!(c.source, ConfigSource::File(PathBuf::from(&cfg)));
        let c = ClientConfig::resolve(None, None, None, None).unwrap();
        assert_eq!(
            (c.server.as_str(), &c.source),
            (DEFAULT_SERVER, &ConfigSource::Default)
        );
    }

    #[test]
    fn home_config_file_is_used_without_skiff_config() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            ".config/skiff/config.yaml",
            "server: http://127.0.0.1:7999\n",
        );
        let home = dir.path().display().to_string();
        let c = ClientConfig::resolve(None, None, None, Some(&home)).unwrap();
        assert_eq!(c.server, "http://127.0.0.1:7999");
        // $SKIFF_CONFIG wins over $HOME, and a missing file falls through to the default.
        let missing = dir.path().join("nope.yaml").display().to_string();
        let c = ClientConfig::resolve(None, None, Some(&missing), Some(&home)).unwrap();
        assert_eq!(c.source, ConfigSource::Default);
    }

    #[test]
    fn malformed_config_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write(dir.path(), "c.yaml", "server: [1, 2]\n");
        let err = ClientConfig::resolve(None, None, Some(&cfg), None).unwrap_err();
        assert!(matches!(err, ClientError::Config { .. }), "{err}");
        assert_eq!(parse_config("").unwrap(), None);
        assert_eq!(parse_config("other: 1\n").unwrap(), None);
        assert!(parse_config("- a\n").is_err());
    }
}
