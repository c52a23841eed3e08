//! The files `up` reads and writes: the workspace's binaries (`cargo metadata`), the
//! kubeconfigs and PKI the API server's binary writes for it, the admin kubeconfig copied
//! where the CLI and kubectl look, the registry's configuration, and log tails.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};

use super::plan::{NodePlan, UpConfig, etcd_certs_args, etcd_pki_dir, node_kubeconfig_args};
use crate::util;

pub const CLI_PACKAGE: &str = "skiff-cli";
/// Debian's docker-registry (the CNCF distribution registry), installed by `cargo xtask setup`.
pub const REGISTRY_BIN: &str = "docker-registry";

/// Workspace facts from `cargo metadata --no-deps`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Workspace {
    pub target_dir: PathBuf,
    /// package name -> names of its bin targets
    pub bins: BTreeMap<String, Vec<String>>,
}

pub fn parse_metadata(json: &serde_json::Value) -> Result<Workspace> {
    let target_dir = json["target_directory"]
        .as_str()
        .context("cargo metadata: no target_directory")?
        .into();
    let mut bins = BTreeMap::new();
    for pkg in json["packages"]
        .as_array()
        .context("cargo metadata: no packages")?
    {
        let name = pkg["name"]
            .as_str()
            .context("cargo metadata: package without name")?;
        let pkg_bins: Vec<String> = pkg["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "bin"))
            })
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect();
        bins.insert(name.to_string(), pkg_bins);
    }
    Ok(Workspace { target_dir, bins })
}

impl Workspace {
    pub fn has_bin(&self, package: &str, bin: &str) -> bool {
        self.bins
            .get(package)
            .is_some_and(|b| b.iter().any(|n| n == bin))
    }

    /// Name of the CLI binary (`skiff` once the CLI crate names it so).
    pub fn cli_bin(&self) -> Option<&str> {
        let bins = self.bins.get(CLI_PACKAGE)?;
        bins.iter()
            .find(|b| *b == "skiff")
            .or_else(|| bins.first())
            .map(String::as_str)
    }
}

pub fn load_workspace(root: &Path) -> Result<Workspace> {
    let out = util::run_capture(
        Command::new("cargo")
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(root),
    )?;
    if !out.status.success() {
        bail!(
            "`cargo metadata` failed:\n{}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing `cargo metadata` output")?;
    parse_metadata(&json)
}

/// The CLI config path: `$SKIFF_CONFIG`, else `$HOME/.config/skiff/config.yaml`.
pub fn config_path(skiff_config: Option<&str>, home: Option<&str>) -> Result<PathBuf> {
    if let Some(p) = skiff_config.filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let home = home.filter(|h| !h.is_empty()).ok_or_else(|| {
        anyhow!("neither SKIFF_CONFIG nor HOME is set: cannot place the CLI config")
    })?;
    Ok(Path::new(home)
        .join(".config")
        .join("skiff")
        .join("config.yaml"))
}

/// Where `up` writes the kubeconfig for kubectl and other Kubernetes clients: inside the
/// checkout (`.skiff/kubeconfig`), never over the user's own `~/.kube/config`.
pub fn kubeconfig_path(state: &Path) -> PathBuf {
    state.join("kubeconfig")
}

/// The last `n` lines of `text`.
pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The last lines of a log file, for a message about its process.
pub fn log_tail(path: &Path) -> String {
    match fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => {
            format!("last lines of {}:\n{}", path.display(), tail_lines(&t, 20))
        }
        Ok(_) => format!("{} is empty", path.display()),
        Err(e) => format!("could not read {}: {e}", path.display()),
    }
}

/// Creates `dir` (and missing parents) and sets it to mode 0700, whatever the umask.
pub fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod 700 {}", dir.display()))
}

/// Copies the admin kubeconfig to where the CLI and kubectl look (mode 0600 from its
/// creation on: it holds the administrator's key): a temporary beside `to` made with
/// `O_EXCL` and mode 0600, renamed over `to`. A missing parent is created 0700.
pub fn copy_private(from: &Path, to: &Path) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let dir = match to.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let text = fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    let name = to.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(
        ".{}.{}-{:x}",
        name.unwrap_or_default(),
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.set_permissions(fs::Permissions::from_mode(0o600))?;
            f.write_all(&text)?;
            f.sync_all()
        })
        .and_then(|()| fs::rename(&tmp, to));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", to.display()))
}

/// Runs `skiff-apiserver ARGS` (one of its file-writing subcommands) to completion; `what`
/// names the job in errors, with the tool's stderr.
fn apiserver_tool(bin_dir: &Path, args: &[OsString], what: &str) -> Result<()> {
    let bin = bin_dir.join("skiff-apiserver");
    let out = Command::new(&bin)
        .args(args)
        .output()
        .with_context(|| format!("running {} {}", bin.display(), skiff_flags::display(args)))?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Has the API server's binary make the `--ha` etcd PKI (once; later runs reuse it).
pub fn make_etcd_pki(state: &Path, bin_dir: &Path, controls: &[std::net::IpAddr]) -> Result<()> {
    let data = state.join("etcd");
    if data.exists() && !etcd_pki_dir(state).exists() {
        bail!(
            "{} holds etcd members an older `up --ha` started with plain HTTP; remove it (the \
             --ha cluster's data) to start them with TLS",
            data.display()
        );
    }
    apiserver_tool(
        bin_dir,
        &etcd_certs_args(state, controls),
        "making the etcd PKI",
    )
}

/// Has the API server's binary write a node's kubeconfig with a certificate of the cluster
/// CA (the PKI exists: the API server made it before it listened).
pub fn write_node_kubeconfig(cfg: &UpConfig, bin_dir: &Path, node: &NodePlan) -> Result<()> {
    fs::create_dir_all(&node.state_dir)
        .with_context(|| format!("creating {}", node.state_dir.display()))?;
    apiserver_tool(
        bin_dir,
        &node_kubeconfig_args(cfg, node),
        &format!("writing {}'s kubeconfig", node.name),
    )
}

/// Writes a kubeconfig for `user` in `group` with every API server (as the cluster's
/// processes reach them) to `dest`.
pub fn write_kubeconfig(
    cfg: &UpConfig,
    bin_dir: &Path,
    user: &str,
    group: &str,
    dest: &Path,
) -> Result<()> {
    apiserver_tool(
        bin_dir,
        &cfg.kubeconfig_args(user, group, dest, cfg.server_urls()),
        "skiff-apiserver kubeconfig",
    )
}

/// Writes the administrator's kubeconfig with every API server as its server (Skiff's
/// clients fail over between them) to `dest`.
pub fn write_admin_config(cfg: &UpConfig, bin_dir: &Path, dest: &Path) -> Result<()> {
    apiserver_tool(
        bin_dir,
        &cfg.kubeconfig_args("system:admin", "system:masters", dest, cfg.host_urls()),
        "skiff-apiserver kubeconfig",
    )
}

/// Deletes the Node `name` if it exists (`skiff delete node --ignore-not-found` with the
/// administrator's kubeconfig): a node joining afresh with a bootstrap token is refused while
/// a Node of its name is registered, and the store keeps the Nodes of an earlier run.
pub fn forget_node(cli: &Path, admin_kubeconfig: &Path, name: &str) -> Result<()> {
    let out = Command::new(cli)
        .arg("--kubeconfig")
        .arg(admin_kubeconfig)
        .args(["delete", "node", name, "--ignore-not-found"])
        .output()
        .with_context(|| format!("running {} delete node", cli.display()))?;
    if !out.status.success() {
        bail!(
            "deleting the stale Node {name} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A bootstrap token for the nodes (valid an hour) and the cluster CA's hash, made by
/// `skiff token create --print-join-command` with the administrator's kubeconfig: the nodes
/// join as any new machine would.
pub fn join_token(cli: &Path, admin_kubeconfig: &Path) -> Result<(String, String)> {
    let out = Command::new(cli)
        .arg("--kubeconfig")
        .arg(admin_kubeconfig)
        .args([
            "token",
            "create",
            "--ttl",
            "1h",
            "--description",
            "cargo xtask up",
        ])
        .arg("--print-join-command")
        .output()
        .with_context(|| format!("running {} token create", cli.display()))?;
    if !out.status.success() {
        bail!(
            "creating a bootstrap token failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    parse_join_command(&String::from_utf8_lossy(&out.stdout))
}

/// `(token, CA hash)` of a printed `skiff-node join` command.
pub fn parse_join_command(line: &str) -> Result<(String, String)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1))
            .map(|w| w.to_string())
            .with_context(|| format!("no {flag} in the join command"))
    };
    Ok((after("--token")?, after("--ca-cert-hash")?))
}

/// Writes the local registry's configuration (storage under `.skiff/registry`, listening on
/// `addr`, deletes allowed); returns its path.
pub fn registry_config(state: &Path, addr: SocketAddr) -> Result<PathBuf> {
    let dir = state.join("registry");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("config.yml");
    fs::write(&path, registry_config_content(&dir.join("storage"), addr))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The registry's config.yml.
pub fn registry_config_content(storage: &Path, addr: SocketAddr) -> String {
    format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
        storage.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_location_and_content() {
        assert_eq!(
            config_path(Some("/tmp/x.yaml"), Some("/root")).unwrap(),
            PathBuf::from("/tmp/x.yaml")
        );
        assert_eq!(
            config_path(None, Some("/home/u")).unwrap(),
            PathBuf::from("/home/u/.config/skiff/config.yaml")
        );
        assert_eq!(
            config_path(Some(""), Some("/home/u")).unwrap(),
            PathBuf::from("/home/u/.config/skiff/config.yaml")
        );
        assert!(config_path(None, None).is_err());
        assert_eq!(
            kubeconfig_path(Path::new("/src/skiff/.skiff")),
            PathBuf::from("/src/skiff/.skiff/kubeconfig")
        );
    }

    #[test]
    fn metadata_parsing() {
        let json = serde_json::json!({
            "target_directory": "/repo/target",
            "packages": [
                {"name": "skiff-apiserver", "targets": [
                    {"name": "skiff_apiserver", "kind": ["lib"]},
                    {"name": "skiff-apiserver", "kind": ["bin"]}
                ]},
                {"name": "skiff-cli", "targets": [{"name": "skiff", "kind": ["bin"]}]},
                {"name": "skiff-store", "targets": [{"name": "skiff_store", "kind": ["lib"]}]}
            ]
        });
        let w = parse_metadata(&json).unwrap();
        assert_eq!(w.target_dir, PathBuf::from("/repo/target"));
        assert!(w.has_bin("skiff-apiserver", "skiff-apiserver"));
        assert!(!w.has_bin("skiff-store", "skiff_store"));
        assert_eq!(w.bins["skiff-store"], Vec::<String>::new());
        assert_eq!(w.cli_bin(), Some("skiff"));
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail_lines("a", 5), "a");
        assert_eq!(tail_lines("", 5), "");
    }
}
