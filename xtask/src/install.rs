//! `cargo xtask install`: installs Skiff on a machine as systemd services, like k3s' install
//! script: the binaries into `--bin-dir`, the units of `deploy/systemd/` rendered with the
//! chosen flags into `/etc/systemd/system` (0644), their environment files into
//! `/etc/default` (0600), and `/var/lib/skiff` for the data; then `systemctl daemon-reload`
//! and `systemctl enable --now` (`restart` for a unit whose files changed).
//!
//! Every path is written below `--root` (default `/`), so a test installs into a temporary
//! directory; the units still name the paths of the installed machine. Each file prints one
//! line, `created`, `updated` or `unchanged`: a second run with the same flags changes
//! nothing. `--uninstall` stops, disables and removes the units and binaries and keeps the
//! data (`/var/lib/skiff`) and the environment files unless `--purge`.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use skiff_flags::{
    ApiServerFlags, ApiStore, ControllerManagerFlags, Election, EtcdClientTls, KubeconfigFlags,
    NodeFlags, NodeMode, NodePurgeFlags, SchedulerFlags, SigningCa,
};

use crate::util;

/// Where the units go (below `--root`).
const UNIT_DIR: &str = "/etc/systemd/system";
/// Where the units' environment files go (below `--root`).
const ENV_DIR: &str = "/etc/default";
/// Everything the services keep.
const DATA_DIR: &str = "/var/lib/skiff";
/// The cluster's PKI: CA, serving certificate, the components' kubeconfigs.
const PKI_DIR: &str = "/var/lib/skiff/pki";
/// The embedded store.
const STORE_DIR: &str = "/var/lib/skiff/data";
/// The node agent's state (`--state-dir`) and its kubeconfig.
const NODE_DIR: &str = "/var/lib/skiff/node";
/// The default StorageClass' volumes on the nodes.
const LOCAL_PATH_DIR: &str = "/var/lib/skiff/local-path";
/// The API server's address on a machine installed as a server.
const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::UNSPECIFIED), 7443);
/// How long a first start on a `--role all` machine waits for the API server's CA before it
/// starts the node agent (whose kubeconfig is signed with it).
const CA_TIMEOUT: Duration = Duration::from_secs(60);

/// The environment file template, shared by every unit.
const ENV_TEMPLATE: &str = include_str!("../../deploy/systemd/unit.env");

#[derive(Debug, Clone, clap::Args)]
pub struct InstallArgs {
    /// What runs on this machine: `server` (API server, scheduler, controller manager and the
    /// `skiff` CLI), `agent` (the node agent) or `all` (both).
    #[arg(long, value_enum, default_value_t = Role::All)]
    pub role: Role,
    /// The API server's URL, or a comma-separated list the clients fail over between
    /// (`https://HOST:PORT`). Required for `--role agent`; on a server, the scheduler,
    /// controller manager and node agent use it instead of the local API server.
    #[arg(long, value_name = "URL[,URL...]")]
    pub server: Option<String>,
    /// etcd client URLs (comma separated) for the API server's store, e.g. the distribution's
    /// `etcd` service [default: the embedded store in /var/lib/skiff/data].
    #[arg(long, value_name = "URL[,URL...]")]
    pub etcd_endpoints: Option<String>,
    /// TLS to etcd (https:// endpoints): the CA of the members' certificates, passed to the
    /// API server as --etcd-cafile; needs --etcd-certfile and --etcd-keyfile.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_endpoints", "etcd_certfile", "etcd_keyfile"])]
    pub etcd_cafile: Option<PathBuf>,
    /// The client certificate the API server presents to etcd (--etcd-certfile).
    #[arg(long, value_name = "FILE", requires_all = ["etcd_endpoints", "etcd_cafile", "etcd_keyfile"])]
    pub etcd_certfile: Option<PathBuf>,
    /// Its key (--etcd-keyfile; keep it 0600).
    #[arg(long, value_name = "FILE", requires_all = ["etcd_endpoints", "etcd_cafile", "etcd_certfile"])]
    pub etcd_keyfile: Option<PathBuf>,
    /// Address the API server listens on [default: 0.0.0.0:7443].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// More names or addresses the API server's certificate is valid for (comma separated):
    /// the ones agents name in --server, unless it is this machine's host name.
    #[arg(long, value_name = "NAME[,NAME...]")]
    pub tls_san: Option<String>,
    /// The node's name [default: the host name, lowercase, as skiff-node takes it].
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// The address the node's agent serves its API on and publishes as the Node's
    /// InternalIP (the agent's --address) [default: the machine's first global IPv4
    /// address, as the agent picks it]. The API server dials it and the cluster CA
    /// certifies it; never a loopback address.
    #[arg(long, value_name = "IP")]
    pub node_address: Option<std::net::IpAddr>,
    /// `--role agent`: the bootstrap token the agent joins with (`skiff token create
    /// --print-join-command` on a server prints it); kept in /etc/default/skiff-node (0600).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "SKIFF_JOIN_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// `--role agent`: the cluster CA's hash, `sha256:<hex>`, with --token.
    #[arg(long, value_name = "sha256:HEX")]
    pub ca_cert_hash: Option<String>,
    /// `--role agent`: a kubeconfig for the agent instead of a token (`skiff-apiserver
    /// kubeconfig --user system:node:<name> --group system:nodes` on a server), copied to
    /// /var/lib/skiff/node/kubeconfig. Not needed once the node has joined.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Directory holding the binaries to install [default: <repo>/target/release].
    #[arg(long, value_name = "DIR")]
    pub from: Option<PathBuf>,
    /// Where the binaries go (the path the units run them from).
    #[arg(long, value_name = "DIR", default_value = "/usr/local/bin")]
    pub bin_dir: PathBuf,
    /// Write everything below this directory instead of `/` (implies --no-start).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Print what would be done; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Run no command: no `systemctl` (daemon-reload, enable --now, disable --now) and no
    /// `skiff-node purge`; only files are written or removed.
    #[arg(long)]
    pub no_start: bool,
    /// Stop, disable and remove the role's units and binaries. Unlike k3s-uninstall.sh, keeps
    /// the data (/var/lib/skiff: store, PKI, node state) and the environment files; the
    /// node's pods keep running, and a new install adopts them.
    #[arg(long)]
    pub uninstall: bool,
    /// With --uninstall: also stop and remove the node's pods (`skiff-node purge`), delete
    /// the role's data under /var/lib/skiff and the environment files.
    #[arg(long, requires = "uninstall")]
    pub purge: bool,
}

/// What a machine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// API server, scheduler and controller manager.
    Server,
    /// The node agent.
    Agent,
    /// Both.
    All,
}

impl Role {
    fn server(self) -> bool {
        matches!(self, Role::Server | Role::All)
    }

    fn agent(self) -> bool {
        matches!(self, Role::Agent | Role::All)
    }
}

/// One unit of `deploy/systemd/`, as data.
#[derive(Debug, Clone, Copy)]
struct UnitSpec {
    /// Unit name without `.service`; also the binary's and the environment file's name.
    name: &'static str,
    template: &'static str,
    /// The environment variable of the environment file whose words end ExecStart.
    args_var: &'static str,
    /// Installed for a server (else for an agent).
    server: bool,
}

/// The units, in start order.
const UNITS: &[UnitSpec] = &[
    UnitSpec {
        name: "skiff-apiserver",
        template: include_str!("../../deploy/systemd/skiff-apiserver.service"),
        args_var: "SKIFF_APISERVER_ARGS",
        server: true,
    },
    UnitSpec {
        name: "skiff-scheduler",
        template: include_str!("../../deploy/systemd/skiff-scheduler.service"),
        args_var: "SKIFF_SCHEDULER_ARGS",
        server: true,
    },
    UnitSpec {
        name: "skiff-controller-manager",
        template: include_str!("../../deploy/systemd/skiff-controller-manager.service"),
        args_var: "SKIFF_CONTROLLER_MANAGER_ARGS",
        server: true,
    },
    UnitSpec {
        name: "skiff-node",
        template: include_str!("../../deploy/systemd/skiff-node.service"),
        args_var: "SKIFF_NODE_ARGS",
        server: false,
    },
];

/// Binaries a server gets besides its units' (the CLI, for `skiff token create` and the like).
const SERVER_EXTRA_BINS: &[&str] = &["skiff"];

impl UnitSpec {
    fn file_name(&self) -> String {
        format!("{}.service", self.name)
    }
}

/// How the API server stores the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StoreKind {
    Embedded,
    /// Endpoints, and the CA, client certificate and key files for TLS.
    Etcd(String, Option<[PathBuf; 3]>),
}

/// How the node agent gets its credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NodeAuth {
    /// `--role all`: a kubeconfig signed with the local cluster CA before every start.
    LocalCa,
    /// `skiff-node join` with a bootstrap token through the first server. Restart-safe: a
    /// joined node keeps its certificate (but each start checks that server's CA again).
    Join { token: String, ca_cert_hash: String },
    /// A kubeconfig in /var/lib/skiff/node (copied by this install or written by a join).
    Kubeconfig { copy_from: Option<PathBuf> },
}

/// The validated flags.
#[derive(Debug, Clone)]
struct InstallPlan {
    role: Role,
    servers: Vec<String>,
    store: StoreKind,
    listen: SocketAddr,
    tls_sans: Option<String>,
    node_name: String,
    node_address: Option<std::net::IpAddr>,
    node_auth: Option<NodeAuth>,
    from: PathBuf,
    bin_dir: PathBuf,
    root: PathBuf,
    dry_run: bool,
    /// Run systemctl (and `skiff-node purge`).
    start: bool,
}

impl InstallPlan {
    fn from_args(a: &InstallArgs) -> Result<InstallPlan> {
        let role = a.role;
        check_unit_path("--bin-dir", &a.bin_dir)?;
        let servers = match &a.server {
            Some(s) => parse_urls("--server", s, &["https"])?,
            None => Vec::new(),
        };
        let node_name = match &a.node_name {
            Some(n) => n.clone(),
            None => host_name()?,
        };
        check_node_name(&node_name)?;
        if let Some(ip) = a.node_address
            && (ip.is_loopback() || ip.is_unspecified() || ip.is_multicast())
        {
            bail!(
                "--node-address {ip}: must be an address other machines reach the node at \
                 (not loopback, unspecified or multicast)"
            );
        }
        if !a.uninstall {
            if !role.server() {
                for (flag, given) in [
                    ("--etcd-endpoints", a.etcd_endpoints.is_some()),
                    ("--listen", a.listen.is_some()),
                    ("--tls-san", a.tls_san.is_some()),
                ] {
                    if given {
                        bail!("{flag} is for the API server: it needs --role server or all");
                    }
                }
            }
            if role != Role::Agent {
                for (flag, given) in [
                    ("--token", a.token.is_some()),
                    ("--ca-cert-hash", a.ca_cert_hash.is_some()),
                    ("--kubeconfig", a.kubeconfig.is_some()),
                ] {
                    if given {
                        bail!(
                            "{flag} is for --role agent (with --role all the agent's kubeconfig \
                             is signed with this machine's cluster CA)"
                        );
                    }
                }
            }
            if role == Role::Agent && servers.is_empty() {
                bail!("--role agent needs --server https://HOST:PORT (the API server, or a list)");
            }
        }
        let store = match &a.etcd_endpoints {
            Some(e) => {
                let urls = parse_urls("--etcd-endpoints", e, &["http", "https"])?;
                let tls = match (&a.etcd_cafile, &a.etcd_certfile, &a.etcd_keyfile) {
                    (Some(ca), Some(cert), Some(key)) => {
                        for (flag, p) in [
                            ("--etcd-cafile", ca),
                            ("--etcd-certfile", cert),
                            ("--etcd-keyfile", key),
                        ] {
                            check_unit_path(flag, p)?;
                        }
                        if let Some(plain) = urls.iter().find(|u| !u.starts_with("https://")) {
                            bail!("--etcd-endpoints {plain}: with TLS files, use https://");
                        }
                        Some([ca.clone(), cert.clone(), key.clone()])
                    }
                    _ => None,
                };
                StoreKind::Etcd(e.clone(), tls)
            }
            None => StoreKind::Embedded,
        };
        if let Some(sans) = &a.tls_san
            && !sans.split(',').all(is_plain_word)
        {
            bail!("--tls-san {sans:?}: names or addresses separated by commas");
        }
        let node_auth = if a.uninstall || !role.agent() {
            None
        } else if role == Role::All {
            Some(NodeAuth::LocalCa)
        } else {
            Some(agent_auth(a, &servers)?)
        };
        let from = match &a.from {
            Some(f) => f.clone(),
            None => util::repo_root().join("target").join("release"),
        };
        let on_real_root = a.root == Path::new("/");
        Ok(InstallPlan {
            role,
            servers,
            store,
            listen: a.listen.unwrap_or(DEFAULT_LISTEN),
            tls_sans: a.tls_san.clone(),
            node_name,
            node_address: a.node_address,
            node_auth,
            from,
            bin_dir: a.bin_dir.clone(),
            root: a.root.clone(),
            dry_run: a.dry_run,
            start: on_real_root && !a.no_start,
        })
    }

    /// The units of the role, in start order.
    fn units(&self) -> Vec<&'static UnitSpec> {
        UNITS
            .iter()
            .filter(|u| {
                if u.server {
                    self.role.server()
                } else {
                    self.role.agent()
                }
            })
            .collect()
    }

    /// The binaries of the role.
    fn binaries(&self) -> Vec<&'static str> {
        let mut bins: Vec<&str> = self.units().iter().map(|u| u.name).collect();
        if self.role.server() {
            bins.extend(SERVER_EXTRA_BINS);
        }
        bins
    }

    /// `path` (absolute, as on the installed machine) below `--root`.
    fn host(&self, path: impl AsRef<Path>) -> PathBuf {
        below(&self.root, path.as_ref())
    }

    /// The URL of the API server on this machine.
    fn local_url(&self) -> String {
        format!("https://{}", crate::up::connect_addr(self.listen))
    }

    fn node_kubeconfig(&self) -> String {
        format!("{NODE_DIR}/kubeconfig")
    }
}

/// The agent's credentials from the flags: a token, a kubeconfig to copy, or the kubeconfig
/// an earlier join (or copy) left.
fn agent_auth(a: &InstallArgs, servers: &[String]) -> Result<NodeAuth> {
    match (&a.token, &a.ca_cert_hash, &a.kubeconfig) {
        (Some(_), _, Some(_)) => bail!("--token and --kubeconfig exclude each other"),
        (Some(token), Some(hash), None) => {
            check_token(token)?;
            check_ca_hash(hash)?;
            if servers.len() > 1 {
                println!(
                    "note: skiff-node join takes one API server: the node joins through {}; once \
                     it has joined, install again without --token to fail over between all",
                    servers[0]
                );
            }
            Ok(NodeAuth::Join {
                token: token.clone(),
                ca_cert_hash: hash.clone(),
            })
        }
        (Some(_), None, None) => bail!("--token needs --ca-cert-hash sha256:<hex>"),
        (None, Some(_), _) => bail!("--ca-cert-hash goes with --token"),
        (None, None, Some(file)) => Ok(NodeAuth::Kubeconfig {
            copy_from: Some(file.clone()),
        }),
        (None, None, None) => {
            let existing = below(&a.root, Path::new(NODE_DIR)).join("kubeconfig");
            if existing.is_file() {
                Ok(NodeAuth::Kubeconfig { copy_from: None })
            } else {
                bail!(
                    "--role agent needs credentials: --token and --ca-cert-hash (`skiff token \
                     create --print-join-command` on a server prints both), or --kubeconfig FILE \
                     ({} does not exist yet)",
                    existing.display()
                )
            }
        }
    }
}

/// `path` (absolute, as on the installed machine) below `root`.
fn below(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The host name as skiff-node takes it (`/proc/sys/kernel/hostname`, lowercase).
fn host_name() -> Result<String> {
    let h = fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the host name (pass --node-name)")?;
    Ok(h.trim().to_lowercase())
}

/// A word a unit file can hold unquoted: no spaces, quotes, `\`, `$` or `%` (systemd's
/// quoting, variable and specifier characters).
fn is_plain_word(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !"\"'\\$%;".contains(c))
}

/// Paths written into the units must be absolute plain words.
fn check_unit_path(flag: &str, p: &Path) -> Result<()> {
    let s = p.to_str().unwrap_or_default();
    if !p.is_absolute() || !is_plain_word(s) {
        bail!(
            "{flag} {}: must be an absolute path without spaces, quotes, `\\`, `$` or `%` (it \
             is written into the units)",
            p.display()
        );
    }
    Ok(())
}

/// Comma-separated `scheme://HOST[:PORT]` URLs; the error names the flag.
fn parse_urls(flag: &str, list: &str, schemes: &[&str]) -> Result<Vec<String>> {
    let want = schemes
        .iter()
        .map(|s| format!("{s}://HOST[:PORT]"))
        .collect::<Vec<_>>()
        .join(" or ");
    list.split(',')
        .map(|url| {
            let bad = |why: &str| anyhow::anyhow!("{flag} {url:?}: {why}; each URL is {want}");
            if !is_plain_word(url) {
                return Err(bad("not a URL"));
            }
            let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
            if !schemes.contains(&scheme) {
                return Err(bad(&format!("scheme {scheme:?} is not allowed")));
            }
            let authority = rest.strip_suffix('/').unwrap_or(rest);
            if authority.contains('/') || authority.contains('@') || authority.contains(',') {
                return Err(bad("a path or user is not allowed"));
            }
            let (host, port) = match authority.rsplit_once(':') {
                Some((h, p)) if !h.ends_with(':') && (h.starts_with('[') || !h.contains(':')) => {
                    (h, Some(p))
                }
                _ => (authority, None),
            };
            if host.is_empty() || host == "[]" {
                return Err(bad("no host"));
            }
            if let Some(p) = port {
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad(&format!("port {p:?} is not a port")))?;
            }
            Ok(url.to_string())
        })
        .collect()
}

/// A bootstrap token is `<6 chars>.<16 chars>` of `[a-z0-9]`, as Kubernetes' are.
fn check_token(t: &str) -> Result<()> {
    let ok = t.split_once('.').is_some_and(|(id, secret)| {
        id.len() == 6
            && secret.len() == 16
            && (id.chars().chain(secret.chars()))
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    });
    if !ok {
        bail!("--token: not a bootstrap token (`<6 characters>.<16 characters>` of [a-z0-9])");
    }
    Ok(())
}

fn check_ca_hash(h: &str) -> Result<()> {
    let ok = h
        .strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()));
    if !ok {
        bail!("--ca-cert-hash {h:?}: must be sha256:<64 hex digits>");
    }
    Ok(())
}

/// A Node name: a DNS-1123 subdomain.
fn check_node_name(n: &str) -> Result<()> {
    let ok = !n.is_empty()
        && n.len() <= 253
        && n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && n.starts_with(|c: char| c.is_ascii_alphanumeric())
        && n.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !ok {
        bail!("--node-name {n:?}: a node name is lowercase letters, digits, `-` and `.`");
    }
    Ok(())
}

/// ExecStart's arguments of a unit, built by `skiff_flags` (where each binary's flags are
/// spelled).
fn unit_flags(plan: &InstallPlan, unit: &UnitSpec) -> Vec<OsString> {
    let pki = Path::new(PKI_DIR);
    // Every server, for the clients that fail over between them (`join` takes one).
    let servers = (!plan.servers.is_empty()).then(|| plan.servers.join(","));
    let election = Election {
        server: servers.clone(),
        ..Election::default()
    };
    match unit.name {
        "skiff-apiserver" => ApiServerFlags {
            listen: plan.listen,
            pki_dir: pki.into(),
            store: match &plan.store {
                StoreKind::Embedded => ApiStore::Embedded {
                    data_dir: STORE_DIR.into(),
                },
                StoreKind::Etcd(endpoints, tls) => ApiStore::Etcd {
                    endpoints: endpoints.clone(),
                    tls: tls
                        .clone()
                        .map(|[ca, cert, key]| EtcdClientTls { ca, cert, key }),
                },
            },
            tls_sans: plan.tls_sans.clone(),
            extra: Vec::new(),
        }
        .args(),
        "skiff-scheduler" => SchedulerFlags {
            kubeconfig: pki.join("scheduler.kubeconfig"),
            election,
            extra: Vec::new(),
        }
        .args(),
        "skiff-controller-manager" => ControllerManagerFlags {
            kubeconfig: pki.join("controller-manager.kubeconfig"),
            signing: Some(SigningCa {
                cert: pki.join("ca.crt"),
                key: pki.join("ca.key"),
            }),
            local_path_root: Some(LOCAL_PATH_DIR.into()),
            election,
            extra: Vec::new(),
        }
        .args(),
        _ => {
            let mode = match &plan.node_auth {
                // `join` takes one URL; the token is in the environment file.
                Some(NodeAuth::Join { ca_cert_hash, .. }) => NodeMode::Join {
                    server: plan.servers.first().cloned().unwrap_or_default(),
                    ca_cert_hash: ca_cert_hash.clone(),
                    join_timeout: None,
                },
                _ => NodeMode::Run { server: servers },
            };
            NodeFlags {
                address: plan.node_address,
                ..NodeFlags::new(
                    mode,
                    plan.node_kubeconfig().into(),
                    plan.node_name.clone(),
                    NODE_DIR.into(),
                )
            }
            .args()
        }
    }
}

/// ExecStart's arguments of a unit: the subcommand and flag/value pairs, one per line.
fn exec_args(plan: &InstallPlan, unit: &UnitSpec) -> Vec<String> {
    skiff_flags::grouped(&unit_flags(plan, unit))
}

/// A unit's text: its template with the plan's values.
fn render_unit(plan: &InstallPlan, unit: &UnitSpec) -> Result<String> {
    let args = continued(&exec_args(plan, unit));
    let bin_dir = plan.bin_dir.display().to_string();
    let mut after = String::new();
    let mut wants = String::new();
    let mut pre = String::new();
    match unit.name {
        "skiff-apiserver" => {
            if matches!(plan.store, StoreKind::Etcd(..)) {
                // Ordering only: etcd may run on other machines, or be the distribution's
                // `etcd` service here (started with the API server when both are enabled).
                after.push_str(" etcd.service");
            }
        }
        "skiff-node" if plan.node_auth == Some(NodeAuth::LocalCa) => {
            after.push_str(" skiff-apiserver.service");
            wants.push_str(" skiff-apiserver.service");
            // A fresh client certificate for system:node:<name> at every start, signed with
            // the CA the API server made in the PKI directory.
            let server = plan
                .servers
                .first()
                .cloned()
                .unwrap_or_else(|| plan.local_url());
            let kubeconfig = KubeconfigFlags {
                pki_dir: PKI_DIR.into(),
                user: format!("system:node:{}", plan.node_name),
                groups: vec!["system:nodes".into()],
                server,
                out: plan.node_kubeconfig().into(),
            };
            // The subcommand on the first line, as ExecStart's binary.
            let lines = skiff_flags::grouped(&kubeconfig.args());
            let (sub, rest) = lines.split_first().unzip();
            pre = format!(
                "ExecStartPre={bin_dir}/skiff-apiserver {}{}",
                sub.map_or("", String::as_str),
                continued(rest.unwrap_or_default())
            );
        }
        _ => {}
    }
    render(
        unit.template,
        &[
            ("BIN_DIR", &bin_dir),
            ("ARGS", &args),
            ("AFTER", &after),
            ("WANTS", &wants),
            ("EXEC_START_PRE", &pre),
        ],
    )
    .with_context(|| format!("rendering deploy/systemd/{}", unit.file_name()))
}

/// Lines of a command, each after a ` \\` continuation.
fn continued(lines: &[String]) -> String {
    lines.iter().map(|l| format!(" \\\n    {l}")).collect()
}

/// Replaces `@NAME@` by its value; a line holding only a placeholder whose value is empty is
/// dropped. Fails on a placeholder left over.
fn render(template: &str, vars: &[(&str, &str)]) -> Result<String> {
    let mut out = String::with_capacity(template.len());
    for line in template.lines() {
        let alone = vars
            .iter()
            .find(|(name, _)| line.trim() == format!("@{name}@"));
        if let Some((_, "")) = alone {
            continue;
        }
        let mut l = line.to_string();
        for (name, value) in vars {
            l = l.replace(&format!("@{name}@"), value);
        }
        out.push_str(&l);
        out.push('\n');
    }
    if let Some(name) = leftover_placeholder(&out) {
        bail!("unknown placeholder {name}");
    }
    Ok(out)
}

/// The first `@NAME@` (capitals and `_`) in `s`.
fn leftover_placeholder(s: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(off) = s[from..].find('@') {
        let start = from + off;
        let rest = &s[start + 1..];
        let len = rest
            .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .unwrap_or(rest.len());
        if len > 0 && rest[len..].starts_with('@') {
            return Some(&s[start..start + len + 2]);
        }
        from = start + 1;
    }
    None
}

/// The lines `install` manages in a unit's environment file, as `(key, value)`; `None`
/// removes the key.
fn managed_env(plan: &InstallPlan, unit: &UnitSpec) -> Vec<(&'static str, Option<String>)> {
    if unit.server {
        return Vec::new();
    }
    match &plan.node_auth {
        Some(NodeAuth::Join { token, .. }) => vec![("SKIFF_JOIN_TOKEN", Some(token.clone()))],
        // Joined (or never joining): the token has no use left.
        _ => vec![("SKIFF_JOIN_TOKEN", None)],
    }
}

/// An environment file: the existing one (or the template) with the managed keys set.
fn merge_env(existing: Option<&str>, template: &str, managed: &[(&str, Option<String>)]) -> String {
    let base = existing.unwrap_or(template);
    let mut lines: Vec<String> = base.lines().map(str::to_string).collect();
    for (key, value) in managed {
        let prefix = format!("{key}=");
        let at = lines.iter().position(|l| l.starts_with(&prefix));
        match (at, value) {
            (Some(i), Some(v)) => lines[i] = format!("{prefix}{v}"),
            (None, Some(v)) => lines.push(format!("{prefix}{v}")),
            (Some(_), None) => lines.retain(|l| !l.starts_with(&prefix)),
            (None, None) => {}
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// What happened (or, with --dry-run, would happen) to one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallOutcome {
    Created,
    Updated,
    Unchanged,
    Removed,
    /// Nothing to remove.
    Absent,
    /// Left in place on purpose (data, environment files).
    Kept,
}

impl InstallOutcome {
    fn changed(self) -> bool {
        matches!(
            self,
            InstallOutcome::Created | InstallOutcome::Updated | InstallOutcome::Removed
        )
    }

    fn word(self, dry_run: bool) -> &'static str {
        match (self, dry_run) {
            (InstallOutcome::Created, false) => "created",
            (InstallOutcome::Created, true) => "would create",
            (InstallOutcome::Updated, false) => "updated",
            (InstallOutcome::Updated, true) => "would update",
            (InstallOutcome::Removed, false) => "removed",
            (InstallOutcome::Removed, true) => "would remove",
            (InstallOutcome::Unchanged, _) => "unchanged",
            (InstallOutcome::Absent, _) => "absent",
            (InstallOutcome::Kept, _) => "kept",
        }
    }
}

/// A command run after the files, or a wait between two.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Run(Vec<String>),
    /// Wait until the file exists (the API server's CA before the local node agent starts).
    WaitFor(PathBuf, Duration),
}

impl Step {
    fn run(args: &[&str]) -> Step {
        Step::Run(args.iter().map(|s| s.to_string()).collect())
    }

    fn describe(&self) -> String {
        match self {
            Step::Run(argv) => argv.join(" "),
            Step::WaitFor(p, t) => format!("wait up to {}s for {}", t.as_secs(), p.display()),
        }
    }
}

/// What a run did: one entry per path, the commands run (or that would run).
#[derive(Debug, Default)]
pub struct Report {
    pub files: Vec<(PathBuf, InstallOutcome)>,
    pub commands: Vec<String>,
}

impl Report {
    fn note(&mut self, plan: &InstallPlan, path: PathBuf, outcome: InstallOutcome) {
        println!("{:<12} {}", outcome.word(plan.dry_run), path.display());
        self.files.push((path, outcome));
    }

    fn outcome(&self, path: &Path) -> Option<InstallOutcome> {
        self.files.iter().find(|(p, _)| p == path).map(|(_, o)| *o)
    }
}

/// Entry point of `cargo xtask install`.
pub fn run(args: &InstallArgs) -> Result<()> {
    let report = execute(args)?;
    let changed = report.files.iter().filter(|(_, o)| o.changed()).count();
    println!(
        "{}: {changed} of {} paths {}",
        if args.uninstall {
            "uninstall"
        } else {
            "install"
        },
        report.files.len(),
        if args.dry_run {
            "would change"
        } else {
            "changed"
        }
    );
    Ok(())
}

/// Installs or uninstalls as the flags say.
pub fn execute(args: &InstallArgs) -> Result<Report> {
    let plan = InstallPlan::from_args(args)?;
    if plan.root == Path::new("/") && !plan.dry_run && !util::is_root() {
        bail!("installing into / needs root: run it as root (or pass --dry-run or --root DIR)");
    }
    if args.uninstall {
        uninstall(&plan, args.purge)
    } else {
        install(&plan)
    }
}

fn install(plan: &InstallPlan) -> Result<Report> {
    let mut report = Report::default();
    for bin in plan.binaries() {
        let src = plan.from.join(bin);
        if !util::is_executable(&src) {
            bail!(
                "no executable {} (build it: `cargo build --release --bin {bin}`, or pass --from \
                 DIR)",
                src.display()
            );
        }
    }
    let units = plan.units();
    let mut rendered = Vec::new();
    for unit in &units {
        rendered.push(render_unit(plan, unit)?);
    }
    let mut dirs = vec![
        (plan.bin_dir.clone(), 0o755),
        (PathBuf::from(UNIT_DIR), 0o755),
        (PathBuf::from(ENV_DIR), 0o755),
        // The services' state (PKI, store, encryption key, node credentials): root's only.
        (PathBuf::from(DATA_DIR), 0o700),
    ];
    if plan.role.agent() {
        dirs.push((PathBuf::from(NODE_DIR), 0o700));
    }
    for (dir, mode) in dirs {
        let path = plan.host(&dir);
        let outcome = ensure_dir(&path, mode, plan.dry_run)?;
        report.note(plan, path, outcome);
    }
    for bin in plan.binaries() {
        let dst = plan.host(plan.bin_dir.join(bin));
        let outcome = put_copy(&plan.from.join(bin), &dst, 0o755, plan.dry_run)?;
        report.note(plan, dst, outcome);
    }
    if let Some(NodeAuth::Kubeconfig {
        copy_from: Some(src),
    }) = &plan.node_auth
    {
        let dst = plan.host(plan.node_kubeconfig());
        let outcome = put_copy(src, &dst, 0o600, plan.dry_run)?;
        report.note(plan, dst, outcome);
    }
    let mut changed_units = Vec::new();
    for (unit, text) in units.iter().zip(&rendered) {
        let unit_path = plan.host(Path::new(UNIT_DIR).join(unit.file_name()));
        let u = put_file(&unit_path, text.as_bytes(), 0o644, plan.dry_run)?;
        report.note(plan, unit_path, u);

        let env_path = plan.host(Path::new(ENV_DIR).join(unit.name));
        let existing = read_optional(&env_path)?;
        let template = render(
            ENV_TEMPLATE,
            &[
                ("UNIT", &unit.file_name()),
                ("BIN", unit.name),
                ("VAR", unit.args_var),
            ],
        )?;
        let env = merge_env(existing.as_deref(), &template, &managed_env(plan, unit));
        let e = put_file(&env_path, env.as_bytes(), 0o600, plan.dry_run)?;
        report.note(plan, env_path, e);

        let bin = plan.host(plan.bin_dir.join(unit.name));
        let b = report.outcome(&bin).unwrap_or(InstallOutcome::Unchanged);
        changed_units.push((unit.file_name(), u.changed() || e.changed() || b.changed()));
    }
    let steps = start_steps(plan, &changed_units);
    run_steps(plan, &steps, &mut report)?;
    Ok(report)
}

/// After the files: reload systemd, then start each unit, or restart it when its unit,
/// environment file or binary changed. On a `--role all` machine the node agent waits for
/// the CA the API server makes on its first start.
fn start_steps(plan: &InstallPlan, units: &[(String, bool)]) -> Vec<Step> {
    let mut steps = vec![Step::run(&["systemctl", "daemon-reload"])];
    let (server, node): (Vec<_>, Vec<_>) =
        units.iter().partition(|(n, _)| n != "skiff-node.service");
    for (i, group) in [server, node].into_iter().enumerate() {
        if group.is_empty() {
            continue;
        }
        if i == 1 && plan.node_auth == Some(NodeAuth::LocalCa) {
            steps.push(Step::WaitFor(Path::new(PKI_DIR).join("ca.key"), CA_TIMEOUT));
        }
        let unchanged: Vec<&str> = group
            .iter()
            .filter(|(_, c)| !c)
            .map(|(n, _)| n.as_str())
            .collect();
        let changed: Vec<&str> = group
            .iter()
            .filter(|(_, c)| *c)
            .map(|(n, _)| n.as_str())
            .collect();
        if !unchanged.is_empty() {
            steps.push(Step::Run(
                ["systemctl", "enable", "--now"]
                    .into_iter()
                    .chain(unchanged)
                    .map(String::from)
                    .collect(),
            ));
        }
        if !changed.is_empty() {
            for verb in ["enable", "restart"] {
                steps.push(Step::Run(
                    ["systemctl", verb]
                        .into_iter()
                        .chain(changed.iter().copied())
                        .map(String::from)
                        .collect(),
                ));
            }
        }
    }
    steps
}

/// Runs the steps; with --dry-run, --no-start or a --root other than `/` only prints them.
fn run_steps(plan: &InstallPlan, steps: &[Step], report: &mut Report) -> Result<()> {
    for step in steps {
        let shown = step.describe();
        report.commands.push(shown.clone());
        if plan.dry_run {
            println!("would run    {shown}");
            continue;
        }
        if !plan.start {
            println!("not run      {shown} (--no-start, or --root is not /)");
            continue;
        }
        println!("running      {shown}");
        match step {
            Step::Run(argv) => {
                if let Some((program, args)) = argv.split_first() {
                    util::run_streaming(Command::new(program).args(args))?;
                }
            }
            Step::WaitFor(path, timeout) => {
                let path = plan.host(path);
                let start = Instant::now();
                while !path.exists() {
                    if start.elapsed() > *timeout {
                        bail!(
                            "{} did not appear within {}s: is the API server running? \
                             (journalctl -u skiff-apiserver)",
                            path.display(),
                            timeout.as_secs()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
    }
    Ok(())
}

fn uninstall(plan: &InstallPlan, purge: bool) -> Result<Report> {
    let mut report = Report::default();
    let units = plan.units();
    // Stop the node agent before the API server it may depend on.
    let present: Vec<String> = units
        .iter()
        .rev()
        .map(|u| u.file_name())
        .filter(|f| plan.host(Path::new(UNIT_DIR).join(f)).exists())
        .collect();
    let mut before = Vec::new();
    if !present.is_empty() {
        let mut argv = vec!["systemctl".to_string(), "disable".into(), "--now".into()];
        argv.extend(present.iter().cloned());
        before.push(Step::Run(argv));
    }
    let node_bin = plan.bin_dir.join("skiff-node");
    let node_state = plan.host(NODE_DIR);
    if purge && plan.role.agent() && !plan.host(&node_bin).exists() && node_state.exists() {
        println!(
            "note: {} is gone, so `skiff-node purge` cannot stop the node's pods; their \
             state in {} is removed all the same",
            node_bin.display(),
            node_state.display()
        );
    }
    if purge && plan.role.agent() && plan.host(&node_bin).exists() {
        let purge = NodePurgeFlags {
            node_name: plan.node_name.clone(),
            state_dir: NODE_DIR.into(),
        };
        let mut argv = vec![node_bin.display().to_string()];
        argv.extend(
            purge
                .args()
                .iter()
                .map(|a| a.to_string_lossy().into_owned()),
        );
        before.push(Step::Run(argv));
    }
    run_steps(plan, &before, &mut report)?;
    for unit in &units {
        let path = plan.host(Path::new(UNIT_DIR).join(unit.file_name()));
        let outcome = remove_path(&path, plan.dry_run)?;
        report.note(plan, path, outcome);
    }
    for bin in plan.binaries() {
        let path = plan.host(plan.bin_dir.join(bin));
        let outcome = remove_path(&path, plan.dry_run)?;
        report.note(plan, path, outcome);
    }
    for unit in &units {
        let path = plan.host(Path::new(ENV_DIR).join(unit.name));
        let outcome = if purge {
            remove_path(&path, plan.dry_run)?
        } else if path.exists() {
            InstallOutcome::Kept
        } else {
            InstallOutcome::Absent
        };
        report.note(plan, path, outcome);
    }
    let data: &[&str] = match plan.role {
        Role::All => &[DATA_DIR],
        Role::Server => &[PKI_DIR, STORE_DIR],
        Role::Agent => &[NODE_DIR, LOCAL_PATH_DIR],
    };
    for dir in data {
        let path = plan.host(dir);
        let outcome = if purge {
            remove_path(&path, plan.dry_run)?
        } else if path.exists() {
            InstallOutcome::Kept
        } else {
            InstallOutcome::Absent
        };
        report.note(plan, path, outcome);
    }
    // One role purged: the data directory goes too once the other role left nothing there.
    let top = plan.host(DATA_DIR);
    if purge && plan.role != Role::All && fs::read_dir(&top).is_ok_and(|mut d| d.next().is_none()) {
        let outcome = remove_path(&top, plan.dry_run)?;
        report.note(plan, top, outcome);
    }
    if !present.is_empty() {
        run_steps(
            plan,
            &[Step::run(&["systemctl", "daemon-reload"])],
            &mut report,
        )?;
    }
    if !purge && plan.role.agent() && !present.is_empty() {
        println!(
            "note: the node's pods keep running (a new install adopts them); `--uninstall \
             --purge` stops and removes them"
        );
    }
    Ok(report)
}

/// Reads a file that may not exist.
fn read_optional(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn mode_of(path: &Path) -> Result<u32> {
    Ok(fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode()
        & 0o7777)
}

/// Creates a directory (and its parents) with `mode` unless it exists; an existing private
/// one (`mode` 0700) that is open to others (an older install's 0755) is closed.
fn ensure_dir(path: &Path, mode: u32, dry_run: bool) -> Result<InstallOutcome> {
    if path.is_dir() {
        if mode == 0o700 && mode_of(path)? != mode {
            if !dry_run {
                fs::set_permissions(path, fs::Permissions::from_mode(mode))
                    .with_context(|| format!("setting the mode of {}", path.display()))?;
            }
            return Ok(InstallOutcome::Updated);
        }
        return Ok(InstallOutcome::Unchanged);
    }
    if !dry_run {
        fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the mode of {}", path.display()))?;
    }
    Ok(InstallOutcome::Created)
}

/// What writing `content` with `mode` to `path` would do.
fn compare(path: &Path, content: &[u8], mode: u32) -> Result<InstallOutcome> {
    match fs::read(path) {
        Ok(old) if old == content && mode_of(path)? == mode => Ok(InstallOutcome::Unchanged),
        Ok(_) => Ok(InstallOutcome::Updated),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(InstallOutcome::Created),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Writes `content` to `path` with `mode` unless it already holds exactly that.
fn put_file(path: &Path, content: &[u8], mode: u32, dry_run: bool) -> Result<InstallOutcome> {
    let outcome = compare(path, content, mode)?;
    if outcome != InstallOutcome::Unchanged && !dry_run {
        write_atomic(path, content, mode)?;
    }
    Ok(outcome)
}

/// Copies `src` to `dst` with `mode` unless `dst` already holds the same bytes.
fn put_copy(src: &Path, dst: &Path, mode: u32, dry_run: bool) -> Result<InstallOutcome> {
    let content = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
    put_file(dst, &content, mode, dry_run)
}

/// Writes a temporary file beside `path` and renames it over `path`: a running binary is
/// replaced, not written into (ETXTBSY), and a reader never sees half a file.
fn write_atomic(path: &Path, content: &[u8], mode: u32) -> Result<()> {
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let tmp = dir.join(format!(".{}.xtask-install", name.to_string_lossy()));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(content)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(f);
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
}

/// Removes a file or a directory tree.
fn remove_path(path: &Path, dry_run: bool) -> Result<InstallOutcome> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(InstallOutcome::Absent),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if !dry_run {
        if meta.is_dir() {
            fs::remove_dir_all(path)
        } else {
            fs::remove_file(path)
        }
        .with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(InstallOutcome::Removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    const HASH: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const TOKEN: &str = "abcdef.0123456789abcdef";

    #[derive(Debug, Parser)]
    struct TestCli {
        #[command(flatten)]
        args: InstallArgs,
    }

    fn parse(args: &[&str]) -> Result<InstallArgs, clap::Error> {
        TestCli::try_parse_from(std::iter::once("install").chain(args.iter().copied()))
            .map(|c| c.args)
    }

    /// A directory of its own, removed on drop, with stand-in executables in `bin/`.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("xtask-install-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            let bin = dir.join("bin");
            fs::create_dir_all(&bin).unwrap();
            for name in [
                "skiff-apiserver",
                "skiff-scheduler",
                "skiff-controller-manager",
                "skiff-node",
                "skiff",
            ] {
                let p = bin.join(name);
                fs::write(&p, format!("#!/bin/sh\n# stand-in for {name}\nexit 0\n")).unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
            }
            Scratch(dir)
        }

        fn root(&self) -> PathBuf {
            self.0.join("root")
        }

        fn bin(&self) -> PathBuf {
            self.0.join("bin")
        }

        /// `execute` with `--root` and `--from` in the scratch directory and a fixed node name.
        fn install(&self, extra: &[&str]) -> Result<Report> {
            let root = self.root().display().to_string();
            let from = self.bin().display().to_string();
            let mut argv = vec!["--root", &root, "--from", &from, "--node-name", "n1"];
            argv.extend(extra);
            execute(&parse(&argv)?)
        }

        fn read(&self, path: &str) -> String {
            fs::read_to_string(below(&self.root(), Path::new(path))).unwrap()
        }

        fn exists(&self, path: &str) -> bool {
            below(&self.root(), Path::new(path)).exists()
        }

        fn mode(&self, path: &str) -> u32 {
            mode_of(&below(&self.root(), Path::new(path))).unwrap()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// ExecStart's words (continuations joined), without the unit's `$..._ARGS`.
    fn exec_start(unit: &str) -> String {
        let joined = unit.replace("\\\n", " ");
        let line = joined
            .lines()
            .find(|l| l.starts_with("ExecStart="))
            .unwrap_or_default();
        line.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    fn has_line(unit: &str, line: &str) -> bool {
        unit.lines().any(|l| l == line)
    }

    #[test]
    fn server_role_installs_the_control_plane() {
        let s = Scratch::new("server");
        s.install(&["--role", "server"]).unwrap();
        for unit in [
            "skiff-apiserver",
            "skiff-scheduler",
            "skiff-controller-manager",
        ] {
            let path = format!("{UNIT_DIR}/{unit}.service");
            let text = s.read(&path);
            assert_eq!(s.mode(&path), 0o644, "{path}");
            assert_eq!(s.mode(&format!("{ENV_DIR}/{unit}")), 0o600, "{unit}'s env");
            assert_eq!(s.mode(&format!("/usr/local/bin/{unit}")), 0o755);
            assert_eq!(s.mode(DATA_DIR), 0o700, "the state directory is private");
            for line in [
                "Type=exec",
                "Restart=always",
                "RestartSec=5s",
                "WantedBy=multi-user.target",
            ] {
                assert!(has_line(&text, line), "{unit}: no {line}\n{text}");
            }
            assert!(
                has_line(&text, &format!("EnvironmentFile=-/etc/default/{unit}")),
                "{text}"
            );
            assert!(text.contains("Wants=network-online.target"), "{text}");
            assert!(text.contains("After=network-online.target"), "{text}");
            assert!(leftover_placeholder(&text).is_none(), "{text}");
        }
        assert!(
            s.exists("/usr/local/bin/skiff"),
            "the CLI goes with a server"
        );
        assert!(s.exists(DATA_DIR));
        assert!(!s.exists("/etc/systemd/system/skiff-node.service"));
        assert!(!s.exists("/usr/local/bin/skiff-node"));

        let api = s.read("/etc/systemd/system/skiff-apiserver.service");
        assert_eq!(
            exec_start(&api),
            "ExecStart=/usr/local/bin/skiff-apiserver --listen 0.0.0.0:7443 \
             --pki-dir /var/lib/skiff/pki --store embedded --data-dir /var/lib/skiff/data \
             --proxy-client-cert-file /var/lib/skiff/pki/front-proxy-client.crt \
             --proxy-client-key-file /var/lib/skiff/pki/front-proxy-client.key \
             --requestheader-client-ca-file /var/lib/skiff/pki/front-proxy-ca.crt \
             --requestheader-allowed-names front-proxy-client $SKIFF_APISERVER_ARGS"
        );
        assert!(
            !api.contains("etcd.service"),
            "embedded store: no etcd ordering"
        );
        let sched = s.read("/etc/systemd/system/skiff-scheduler.service");
        assert_eq!(
            exec_start(&sched),
            "ExecStart=/usr/local/bin/skiff-scheduler \
             --kubeconfig /var/lib/skiff/pki/scheduler.kubeconfig $SKIFF_SCHEDULER_ARGS"
        );
        let cm = s.read("/etc/systemd/system/skiff-controller-manager.service");
        assert_eq!(
            exec_start(&cm),
            "ExecStart=/usr/local/bin/skiff-controller-manager \
             --kubeconfig /var/lib/skiff/pki/controller-manager.kubeconfig \
             --cluster-signing-cert-file /var/lib/skiff/pki/ca.crt \
             --cluster-signing-key-file /var/lib/skiff/pki/ca.key \
             --local-path-root /var/lib/skiff/local-path $SKIFF_CONTROLLER_MANAGER_ARGS"
        );
        for text in [&sched, &cm] {
            assert!(
                has_line(text, "Wants=network-online.target skiff-apiserver.service")
                    && has_line(text, "After=network-online.target skiff-apiserver.service"),
                "{text}"
            );
        }
        let env = s.read("/etc/default/skiff-scheduler");
        assert!(has_line(&env, "SKIFF_SCHEDULER_ARGS="), "{env}");
    }

    #[test]
    fn agent_role_installs_the_node_agent() {
        let s = Scratch::new("agent");
        s.install(&[
            "--role",
            "agent",
            "--server",
            "https://cp.example:7443",
            "--token",
            TOKEN,
            "--ca-cert-hash",
            HASH,
        ])
        .unwrap();
        let node = s.read("/etc/systemd/system/skiff-node.service");
        for line in [
            "Type=exec",
            "User=root",
            "Restart=always",
            "RestartSec=5s",
            "KillMode=process",
            "Delegate=yes",
            "LimitNOFILE=1048576",
            "TasksMax=infinity",
            "Wants=network-online.target",
            "After=network-online.target",
            "EnvironmentFile=-/etc/default/skiff-node",
        ] {
            assert!(has_line(&node, line), "no {line}:\n{node}");
        }
        assert!(!node.contains("skiff-apiserver"), "{node}");
        assert_eq!(
            exec_start(&node),
            format!(
                "ExecStart=/usr/local/bin/skiff-node join --server https://cp.example:7443 \
                 --ca-cert-hash {HASH} --kubeconfig /var/lib/skiff/node/kubeconfig \
                 --node-name n1 --state-dir /var/lib/skiff/node $SKIFF_NODE_ARGS"
            )
        );
        assert!(!node.contains(TOKEN), "the token stays out of the unit");
        let env = s.read("/etc/default/skiff-node");
        assert!(
            has_line(&env, &format!("SKIFF_JOIN_TOKEN={TOKEN}")),
            "{env}"
        );
        assert_eq!(s.mode("/etc/default/skiff-node"), 0o600);
        assert_eq!(s.mode(NODE_DIR), 0o700, "the node's credentials' directory");
        for absent in [
            "/etc/systemd/system/skiff-apiserver.service",
            "/usr/local/bin/skiff-apiserver",
            "/usr/local/bin/skiff",
        ] {
            assert!(!s.exists(absent), "{absent}");
        }
    }

    #[test]
    fn all_role_signs_the_node_kubeconfig_with_the_local_ca() {
        let s = Scratch::new("all");
        let report = s.install(&[]).unwrap();
        for unit in UNITS {
            assert!(s.exists(&format!("{UNIT_DIR}/{}", unit.file_name())));
        }
        let node = s.read("/etc/systemd/system/skiff-node.service");
        assert!(
            has_line(&node, "After=network-online.target skiff-apiserver.service")
                && has_line(&node, "Wants=network-online.target skiff-apiserver.service"),
            "{node}"
        );
        let joined = node.replace("\\\n", " ");
        let pre = joined
            .lines()
            .find(|l| l.starts_with("ExecStartPre="))
            .unwrap();
        assert_eq!(
            pre.split_whitespace().collect::<Vec<_>>().join(" "),
            "ExecStartPre=/usr/local/bin/skiff-apiserver kubeconfig --pki-dir /var/lib/skiff/pki \
             --user system:node:n1 --group system:nodes --server https://127.0.0.1:7443 \
             --out /var/lib/skiff/node/kubeconfig"
        );
        assert_eq!(
            exec_start(&node),
            "ExecStart=/usr/local/bin/skiff-node run --kubeconfig /var/lib/skiff/node/kubeconfig \
             --node-name n1 --state-dir /var/lib/skiff/node $SKIFF_NODE_ARGS"
        );
        // Nothing runs below a --root; the first start waits for the CA before the agent.
        assert_eq!(
            report.commands,
            [
                "systemctl daemon-reload",
                "systemctl enable skiff-apiserver.service skiff-scheduler.service \
                 skiff-controller-manager.service",
                "systemctl restart skiff-apiserver.service skiff-scheduler.service \
                 skiff-controller-manager.service",
                "wait up to 60s for /var/lib/skiff/pki/ca.key",
                "systemctl enable skiff-node.service",
                "systemctl restart skiff-node.service",
            ]
        );
    }

    #[test]
    fn a_second_install_changes_nothing() {
        let s = Scratch::new("twice");
        let first = s.install(&[]).unwrap();
        assert!(
            first
                .files
                .iter()
                .all(|(_, o)| *o == InstallOutcome::Created)
        );
        let second = s.install(&[]).unwrap();
        assert_eq!(second.files.len(), first.files.len());
        for (path, outcome) in &second.files {
            assert_eq!(*outcome, InstallOutcome::Unchanged, "{}", path.display());
        }
        // Unchanged units are started, not restarted.
        assert!(
            second
                .commands
                .iter()
                .all(|c| !c.contains("restart") && !c.starts_with("systemctl enable skiff")),
            "{:?}",
            second.commands
        );

        // One changed flag rewrites one unit, restarts it, and keeps what the operator wrote.
        let env = below(&s.root(), Path::new("/etc/default/skiff-apiserver"));
        let edited = s.read("/etc/default/skiff-apiserver").replace(
            "SKIFF_APISERVER_ARGS=",
            "SKIFF_APISERVER_ARGS=--audit-log-path /var/log/skiff-audit.log",
        );
        fs::write(&env, &edited).unwrap();
        let third = s.install(&["--tls-san", "10.0.0.10,cp.example"]).unwrap();
        let changed: Vec<_> = third
            .files
            .iter()
            .filter(|(_, o)| *o != InstallOutcome::Unchanged)
            .collect();
        assert_eq!(changed.len(), 1, "{changed:?}");
        assert!(changed[0].0.ends_with("skiff-apiserver.service"));
        assert_eq!(changed[0].1, InstallOutcome::Updated);
        assert!(
            third
                .commands
                .contains(&"systemctl restart skiff-apiserver.service".to_string())
        );
        assert_eq!(s.read("/etc/default/skiff-apiserver"), edited);
        let api = s.read("/etc/systemd/system/skiff-apiserver.service");
        assert!(
            exec_start(&api).contains("--tls-san 10.0.0.10,cp.example"),
            "{api}"
        );
    }

    #[test]
    fn a_server_list_reaches_every_client() {
        let list = "https://a:7443,https://b:7443";
        let s = Scratch::new("list");
        s.install(&["--server", list]).unwrap();
        for unit in ["skiff-scheduler", "skiff-controller-manager", "skiff-node"] {
            let text = s.read(&format!("{UNIT_DIR}/{unit}.service"));
            assert!(
                exec_start(&text).contains(&format!("--server {list}")),
                "{unit}:\n{text}"
            );
        }
        let api = s.read("/etc/systemd/system/skiff-apiserver.service");
        assert!(!api.contains("--server"), "{api}");
        // The local kubeconfig names the first server.
        let node = s.read("/etc/systemd/system/skiff-node.service");
        assert!(
            node.contains("    --server https://a:7443 \\\n    --out"),
            "{node}"
        );

        // An agent with a kubeconfig (copied here, or left by a join) fails over too.
        let a = Scratch::new("list-agent");
        let kubeconfig = a.0.join("node.kubeconfig");
        fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
        a.install(&[
            "--role",
            "agent",
            "--server",
            list,
            "--kubeconfig",
            &kubeconfig.display().to_string(),
        ])
        .unwrap();
        let node = a.read("/etc/systemd/system/skiff-node.service");
        assert_eq!(
            exec_start(&node),
            format!(
                "ExecStart=/usr/local/bin/skiff-node run --kubeconfig /var/lib/skiff/node/kubeconfig \
                 --node-name n1 --state-dir /var/lib/skiff/node --server {list} $SKIFF_NODE_ARGS"
            )
        );
        assert_eq!(a.mode("/var/lib/skiff/node/kubeconfig"), 0o600);
        // Installed again without credentials: the kubeconfig is there, nothing changes.
        let again = a.install(&["--role", "agent", "--server", list]).unwrap();
        assert!(
            again
                .files
                .iter()
                .all(|(_, o)| *o == InstallOutcome::Unchanged)
        );
    }

    #[test]
    fn a_joined_agent_switches_to_run_and_forgets_the_token() {
        let s = Scratch::new("rejoin");
        let join = [
            "--role",
            "agent",
            "--server",
            "https://a:7443,https://b:7443",
        ];
        let mut first = join.to_vec();
        first.extend(["--token", TOKEN, "--ca-cert-hash", HASH]);
        s.install(&first).unwrap();
        let node = s.read("/etc/systemd/system/skiff-node.service");
        assert!(
            exec_start(&node).contains("join --server https://a:7443 --ca-cert-hash"),
            "join takes one server: {node}"
        );
        // What `skiff-node join` writes once the controller manager signed the certificate.
        fs::write(
            below(&s.root(), Path::new("/var/lib/skiff/node/kubeconfig")),
            "kubeconfig",
        )
        .unwrap();
        s.install(&join).unwrap();
        let node = s.read("/etc/systemd/system/skiff-node.service");
        assert!(
            exec_start(&node).contains("run --kubeconfig /var/lib/skiff/node/kubeconfig")
                && exec_start(&node).contains("--server https://a:7443,https://b:7443"),
            "{node}"
        );
        let env = s.read("/etc/default/skiff-node");
        assert!(
            !env.contains("SKIFF_JOIN_TOKEN=") && !env.contains(TOKEN),
            "{env}"
        );
    }

    #[test]
    fn etcd_endpoints_order_the_api_server_after_etcd() {
        let s = Scratch::new("etcd");
        s.install(&[
            "--role",
            "server",
            "--etcd-endpoints",
            "http://127.0.0.1:2379,http://10.0.0.2:2379",
        ])
        .unwrap();
        let api = s.read("/etc/systemd/system/skiff-apiserver.service");
        assert!(
            has_line(&api, "After=network-online.target etcd.service"),
            "{api}"
        );
        assert!(
            exec_start(&api).contains(
                "--store etcd --etcd-endpoints http://127.0.0.1:2379,http://10.0.0.2:2379"
            ),
            "{api}"
        );
        assert!(!api.contains("--data-dir"), "{api}");
        // etcd with TLS and a client certificate: the files go to the API server.
        let s = Scratch::new("etcd-tls");
        s.install(&[
            "--role",
            "server",
            "--etcd-endpoints",
            "https://10.0.0.2:2379",
            "--etcd-cafile",
            "/etc/etcd/ca.crt",
            "--etcd-certfile",
            "/etc/etcd/client.crt",
            "--etcd-keyfile",
            "/etc/etcd/client.key",
        ])
        .unwrap();
        let api = s.read("/etc/systemd/system/skiff-apiserver.service");
        assert!(
            exec_start(&api).contains(
                "--store etcd --etcd-endpoints https://10.0.0.2:2379 --etcd-cafile \
                 /etc/etcd/ca.crt --etcd-certfile /etc/etcd/client.crt --etcd-keyfile \
                 /etc/etcd/client.key"
            ),
            "{api}"
        );
        let plain = s
            .install(&[
                "--role",
                "server",
                "--etcd-endpoints",
                "http://10.0.0.2:2379",
                "--etcd-cafile",
                "/etc/etcd/ca.crt",
                "--etcd-certfile",
                "/etc/etcd/client.crt",
                "--etcd-keyfile",
                "/etc/etcd/client.key",
            ])
            .unwrap_err()
            .to_string();
        assert!(plain.contains("use https://"), "{plain}");
        let partial = s
            .install(&[
                "--etcd-endpoints",
                "https://10.0.0.2:2379",
                "--etcd-cafile",
                "/etc/etcd/ca.crt",
            ])
            .unwrap_err()
            .to_string();
        assert!(partial.contains("--etcd-certfile"), "{partial}");
    }

    #[test]
    fn the_agent_unit_takes_the_node_address_and_the_registration_address() {
        let a = Scratch::new("node-address");
        let kubeconfig = a.0.join("node.kubeconfig");
        fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
        a.install(&[
            "--role",
            "agent",
            "--server",
            "https://192.0.2.100:7443",
            "--node-address",
            "192.0.2.7",
            "--kubeconfig",
            &kubeconfig.display().to_string(),
        ])
        .unwrap();
        let node = exec_start(&a.read("/etc/systemd/system/skiff-node.service"));
        assert!(node.contains("--address 192.0.2.7"), "{node}");
        assert!(node.contains("--server https://192.0.2.100:7443"), "{node}");
    }

    #[test]
    fn bad_flags_are_errors_that_name_the_flag() {
        let role = parse(&["--role", "master"]).unwrap_err().to_string();
        assert!(role.contains("--role") && role.contains("master"), "{role}");

        let s = Scratch::new("bad");
        let err = |args: &[&str]| format!("{:#}", s.install(args).unwrap_err());
        for (args, flag) in [
            (&["--server", "http://a:7443"][..], "--server"),
            (&["--server", "https://a:7443,b:7443"], "--server"),
            (&["--server", "https://:7443"], "--server"),
            (&["--server", "https://a:port"], "--server"),
            (&["--server", "https://a b"], "--server"),
            (&["--role", "agent"], "--server"),
            (
                &[
                    "--role",
                    "agent",
                    "--server",
                    "https://a",
                    "--node-address",
                    "127.0.0.1",
                ],
                "--node-address",
            ),
            (&["--etcd-endpoints", "127.0.0.1:2379"], "--etcd-endpoints"),
            (
                &["--role", "agent", "--etcd-endpoints", "http://e:2379"],
                "--etcd-endpoints",
            ),
            (&["--token", TOKEN, "--ca-cert-hash", HASH], "--token"),
            (
                &["--role", "agent", "--server", "https://a", "--token", "x"],
                "--token",
            ),
            (
                &["--role", "agent", "--server", "https://a", "--token", TOKEN],
                "--ca-cert-hash",
            ),
            (
                &[
                    "--role",
                    "agent",
                    "--server",
                    "https://a",
                    "--token",
                    TOKEN,
                    "--ca-cert-hash",
                    "sha256:zz",
                ],
                "--ca-cert-hash",
            ),
            (&["--node-name", "Node_1"], "--node-name"),
            (&["--bin-dir", "relative/bin"], "--bin-dir"),
            (&["--bin-dir", "/opt/my bin"], "--bin-dir"),
            (&["--tls-san", "a b"], "--tls-san"),
        ] {
            let e = err(args);
            assert!(e.contains(flag), "{args:?}: {e}");
        }
        // A missing binary says how to build it.
        let e = format!(
            "{:#}",
            execute(
                &parse(&[
                    "--root",
                    &s.root().display().to_string(),
                    "--from",
                    &s.0.join("nowhere").display().to_string(),
                    "--node-name",
                    "n1",
                ])
                .unwrap()
            )
            .unwrap_err()
        );
        assert!(
            e.contains("cargo build --release --bin skiff-apiserver"),
            "{e}"
        );
        assert!(!s.exists(UNIT_DIR), "nothing is written after an error");
        assert!(
            parse(&["--purge"]).is_err(),
            "--purge goes with --uninstall"
        );
    }

    #[test]
    fn good_urls_pass() {
        for url in [
            "https://a",
            "https://a:7443",
            "https://a:7443/",
            "https://10.0.0.1:7443",
            "https://[::1]:7443",
            "https://[fd00::1]",
        ] {
            assert_eq!(parse_urls("--server", url, &["https"]).unwrap(), [url]);
        }
    }

    #[test]
    fn dry_run_writes_nothing() {
        let s = Scratch::new("dry");
        let report = s.install(&["--dry-run"]).unwrap();
        assert!(!report.files.is_empty());
        assert!(
            report
                .files
                .iter()
                .all(|(_, o)| *o == InstallOutcome::Created)
        );
        assert!(
            !s.root().exists(),
            "a dry run created {}",
            s.root().display()
        );
        s.install(&[]).unwrap();
        let report = s.install(&["--dry-run", "--uninstall", "--purge"]).unwrap();
        assert!(
            report
                .files
                .iter()
                .any(|(_, o)| *o == InstallOutcome::Removed)
        );
        assert!(s.exists("/etc/systemd/system/skiff-node.service"));
    }

    #[test]
    fn uninstall_keeps_the_data_unless_purge() {
        let s = Scratch::new("uninstall");
        s.install(&[]).unwrap();
        let pki = below(&s.root(), Path::new(PKI_DIR));
        fs::create_dir_all(&pki).unwrap();
        fs::write(pki.join("ca.key"), "key").unwrap();

        let report = s.install(&["--uninstall"]).unwrap();
        assert_eq!(
            report.commands,
            [
                "systemctl disable --now skiff-node.service skiff-controller-manager.service \
                 skiff-scheduler.service skiff-apiserver.service",
                "systemctl daemon-reload",
            ]
        );
        for unit in UNITS {
            assert!(!s.exists(&format!("{UNIT_DIR}/{}", unit.file_name())));
            assert!(!s.exists(&format!("/usr/local/bin/{}", unit.name)));
            assert!(
                s.exists(&format!("{ENV_DIR}/{}", unit.name)),
                "env files are kept"
            );
        }
        assert!(!s.exists("/usr/local/bin/skiff"));
        assert_eq!(s.read("/var/lib/skiff/pki/ca.key"), "key");

        let again = s.install(&["--uninstall"]).unwrap();
        assert!(again.commands.is_empty(), "{:?}", again.commands);
        assert!(
            again
                .files
                .iter()
                .all(|(_, o)| matches!(o, InstallOutcome::Absent | InstallOutcome::Kept))
        );

        s.install(&["--uninstall", "--purge"]).unwrap();
        assert!(!s.exists(DATA_DIR));
        assert!(!s.exists("/etc/default/skiff-node"));
    }

    #[test]
    fn purging_one_role_keeps_the_other_roles_data() {
        let s = Scratch::new("purge-role");
        s.install(&[]).unwrap();
        for dir in [PKI_DIR, NODE_DIR] {
            let d = below(&s.root(), Path::new(dir));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("f"), "x").unwrap();
        }
        let report = s
            .install(&["--role", "agent", "--uninstall", "--purge"])
            .unwrap();
        // The agent's data goes after `skiff-node purge` stopped its pods.
        assert_eq!(
            report.commands[1],
            format!("/usr/local/bin/skiff-node purge --node-name n1 --state-dir {NODE_DIR}")
        );
        assert!(!s.exists(NODE_DIR));
        assert!(s.exists("/var/lib/skiff/pki/f"));
        assert!(s.exists("/etc/systemd/system/skiff-apiserver.service"));
        s.install(&["--role", "server", "--uninstall", "--purge"])
            .unwrap();
        assert!(!s.exists(DATA_DIR), "empty once both roles are purged");
    }

    #[test]
    fn env_files_keep_the_operators_lines() {
        let template = "# comment\nSKIFF_NODE_ARGS=\n";
        let managed = [("SKIFF_JOIN_TOKEN", Some(TOKEN.to_string()))];
        let fresh = merge_env(None, template, &managed);
        assert_eq!(fresh, format!("{template}SKIFF_JOIN_TOKEN={TOKEN}\n"));
        let edited = fresh.replace("SKIFF_NODE_ARGS=", "SKIFF_NODE_ARGS=--node-labels a=b");
        let new_token = [(
            "SKIFF_JOIN_TOKEN",
            Some("zzzzzz.zzzzzzzzzzzzzzzz".to_string()),
        )];
        assert_eq!(
            merge_env(Some(&edited), template, &new_token),
            edited.replace(TOKEN, "zzzzzz.zzzzzzzzzzzzzzzz")
        );
        assert_eq!(
            merge_env(Some(&edited), template, &[("SKIFF_JOIN_TOKEN", None)]),
            "# comment\nSKIFF_NODE_ARGS=--node-labels a=b\n"
        );
    }

    #[test]
    fn placeholders_are_all_filled() {
        assert_eq!(
            render("a=@X@\n@Y@\nb\n", &[("X", "1"), ("Y", "")]).unwrap(),
            "a=1\nb\n"
        );
        let e = render("a=@NOPE@\n", &[("X", "1")]).unwrap_err().to_string();
        assert!(e.contains("@NOPE@"), "{e}");
        assert!(render("mail me@example.org @ home\n", &[]).is_ok());
    }

    /// `systemd-analyze verify` on every rendered unit (Debian package `systemd`). It
    /// checks that ExecStart's binary exists and is executable, so the units name `--bin-dir`
    /// = the scratch `bin/` of stand-ins (the copies below `--root` would be at
    /// `<root>/<bin-dir>`, a path the units do not name). It needs no running systemd.
    #[test]
    fn systemd_analyze_verifies_the_units() {
        let Some(analyze) = util::which("systemd-analyze") else {
            panic!("no systemd-analyze on this machine: apt-get install systemd");
        };
        for (tag, extra) in [
            (
                "verify-all",
                vec!["--etcd-endpoints", "http://127.0.0.1:2379"],
            ),
            (
                "verify-agent",
                vec![
                    "--role",
                    "agent",
                    "--server",
                    "https://a:7443,https://b:7443",
                    "--token",
                    TOKEN,
                    "--ca-cert-hash",
                    HASH,
                ],
            ),
        ] {
            let s = Scratch::new(tag);
            let bin = s.bin().display().to_string();
            let mut args = vec!["--bin-dir", &bin];
            args.extend(extra);
            s.install(&args).unwrap();
            let units: Vec<PathBuf> = fs::read_dir(below(&s.root(), Path::new(UNIT_DIR)))
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            assert!(!units.is_empty());
            let out = Command::new(&analyze)
                .arg("verify")
                .args(&units)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{tag}: {stderr}");
            // Warnings about our units (unknown keys, bad values) fail too.
            let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("skiff")).collect();
            assert!(ours.is_empty(), "{tag}: {ours:?}");
        }
    }
}
