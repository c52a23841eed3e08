//! `cargo xtask up`: build and run a local Skiff control plane.
//!
//! Components are data ([`COMPONENTS`]); the ones whose binaries exist in the
//! workspace (per `cargo metadata`) are built, started in order as children
//! with logs in `.skiff/logs/<name>.log`, and stopped with SIGTERM (then
//! SIGKILL after 10 s) on Ctrl-C.

use std::collections::BTreeMap;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::doctor;
use crate::setup::{self, SetupOptions};
use crate::util;
use skiff_testnet::{Fabric, Netns};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(100);
const CLI_PACKAGE: &str = "skiff-cli";

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Use etcd at this URL (e.g. http://127.0.0.1:2379) instead of the embedded store.
    #[arg(long, value_name = "URL")]
    pub etcd: Option<String>,
    /// With --etcd https://...: the CA of the etcd members' certificates (the API server's
    /// --etcd-cafile); needs --etcd-certfile and --etcd-keyfile.
    #[arg(long, value_name = "FILE", requires_all = ["etcd", "etcd_certfile", "etcd_keyfile"])]
    pub etcd_cafile: Option<PathBuf>,
    /// The client certificate the API server presents to etcd.
    #[arg(long, value_name = "FILE", requires_all = ["etcd", "etcd_cafile", "etcd_keyfile"])]
    pub etcd_certfile: Option<PathBuf>,
    /// The client certificate's key.
    #[arg(long, value_name = "FILE", requires_all = ["etcd", "etcd_cafile", "etcd_certfile"])]
    pub etcd_keyfile: Option<PathBuf>,
    /// Address the API server listens on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7443")]
    pub listen: SocketAddr,
    /// Data directory for the embedded store [default: <repo>/.skiff/data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Number of node agents, each with its node in a network namespace of its own
    /// (`skiff-up-node-<i>`, pod CIDR 10.244.<i>.0/24). Needs root; 0 = control plane only.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub nodes: u32,
    /// Port of the local OCI registry (docker-registry on 127.0.0.1) every node pulls from;
    /// 0 = no registry.
    #[arg(long, value_name = "PORT", default_value_t = 5000)]
    pub registry_port: u16,
    /// A highly available control plane on this machine: three etcd members (loopback
    /// client ports 2379, 2381, 2383; TLS for clients and peers with client certificates of
    /// an etcd CA of their own in .skiff/pki/etcd), three API servers (the --listen port and the next two)
    /// over them sharing one PKI, and three schedulers and three controller managers electing
    /// leaders; every component and agent lists all three API servers and fails over.
    #[arg(long, conflicts_with_all = ["etcd", "data_dir"])]
    pub ha: bool,
}

/// Members of the `--ha` etcd cluster and API servers (and schedulers, controller managers).
pub const HA_REPLICAS: u16 = 3;
/// The `--ha` etcd members' client ports (peer port: the next one).
pub const HA_ETCD_CLIENT_PORTS: [u16; HA_REPLICAS as usize] = [2379, 2381, 2383];

/// TLS to etcd: the API server's --etcd-cafile, --etcd-certfile and --etcd-keyfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The `--ha` etcd members' PKI (an etcd CA of its own, made by `skiff-apiserver
/// etcd-certs` before the members start).
pub fn etcd_pki_dir(root: &Path) -> PathBuf {
    root.join(".skiff").join("pki").join("etcd")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    Embedded { data_dir: PathBuf },
    Etcd { endpoints: String },
}

/// Resolved settings shared by every component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpConfig {
    pub listen: SocketAddr,
    /// The cluster's PKI, made by the API server on first start (`<repo>/.skiff/pki`).
    pub pki_dir: PathBuf,
    pub store: Store,
    pub nodes: u32,
    /// The local registry's address, if one is started.
    pub registry: Option<SocketAddr>,
    /// `--ha`: three of everything in the control plane.
    pub ha: bool,
    /// TLS to etcd (`--ha`'s own PKI, or the files given with --etcd).
    pub etcd_tls: Option<EtcdTlsFiles>,
}

impl UpConfig {
    pub fn from_args(args: &UpArgs, root: &Path, cwd: &Path) -> Self {
        let store = match &args.etcd {
            _ if args.ha => Store::Etcd {
                endpoints: HA_ETCD_CLIENT_PORTS
                    .iter()
                    .map(|p| format!("https://127.0.0.1:{p}"))
                    .collect::<Vec<_>>()
                    .join(","),
            },
            Some(url) => Store::Etcd {
                endpoints: url.clone(),
            },
            None => Store::Embedded {
                data_dir: match &args.data_dir {
                    Some(d) if d.is_absolute() => d.clone(),
                    Some(d) => cwd.join(d),
                    None => root.join(".skiff").join("data"),
                },
            },
        };
        let from_cwd = |p: &PathBuf| {
            if p.is_absolute() {
                p.clone()
            } else {
                cwd.join(p)
            }
        };
        let etcd_tls = if args.ha {
            let dir = etcd_pki_dir(root);
            Some(EtcdTlsFiles {
                ca: dir.join("ca.crt"),
                cert: dir.join("apiserver-etcd-client.crt"),
                key: dir.join("apiserver-etcd-client.key"),
            })
        } else {
            match (&args.etcd_cafile, &args.etcd_certfile, &args.etcd_keyfile) {
                (Some(ca), Some(cert), Some(key)) => Some(EtcdTlsFiles {
                    ca: from_cwd(ca),
                    cert: from_cwd(cert),
                    key: from_cwd(key),
                }),
                _ => None,
            }
        };
        UpConfig {
            listen: args.listen,
            pki_dir: root.join(".skiff").join("pki"),
            etcd_tls,
            store,
            nodes: args.nodes,
            registry: (args.registry_port != 0)
                .then(|| SocketAddr::from((Ipv4Addr::LOCALHOST, args.registry_port))),
            ha: args.ha,
        }
    }

    /// How many instances of each control-plane component run.
    pub fn instances(&self) -> u16 {
        if self.ha { HA_REPLICAS } else { 1 }
    }

    /// Where API server `i` listens: the --listen port plus `i`.
    pub fn listen_of(&self, i: u16) -> SocketAddr {
        SocketAddr::new(self.listen.ip(), self.listen.port().saturating_add(i))
    }

    /// URL clients use to reach the (first) API server.
    pub fn server_url(&self) -> String {
        format!("https://{}", connect_addr(self.listen))
    }

    /// Every API server's URL, comma separated (what Skiff's clients fail over between).
    pub fn server_urls(&self) -> String {
        (0..self.instances())
            .map(|i| format!("https://{}", connect_addr(self.listen_of(i))))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The kubeconfig the API server wrote for `who` (`admin`, `scheduler`,
    /// `controller-manager`).
    pub fn kubeconfig(&self, who: &str) -> PathBuf {
        self.pki_dir.join(format!("{who}.kubeconfig"))
    }
}

/// Where to connect for a listen address: wildcard addresses become loopback.
pub fn connect_addr(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// How to tell that a started component is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// The API server's listen port accepts TCP connections.
    ApiPort,
    /// Considered ready once started.
    Started,
}

/// One process of the local cluster, as data.
#[derive(Debug, Clone, Copy)]
pub struct Component {
    pub name: &'static str,
    pub package: &'static str,
    pub bin: &'static str,
    /// Fail if the binary does not exist (otherwise the component is skipped).
    pub required: bool,
    /// The arguments of instance `i` (0 unless `--ha`).
    pub args: fn(&UpConfig, u16) -> Vec<String>,
    pub readiness: Readiness,
}

/// Components in start order. Entries whose binary is not in the workspace
/// yet are skipped; give them real arguments when their crates land.
pub const COMPONENTS: &[Component] = &[
    Component {
        name: "apiserver",
        package: "skiff-apiserver",
        bin: "skiff-apiserver",
        required: true,
        args: apiserver_args,
        readiness: Readiness::ApiPort,
    },
    Component {
        name: "scheduler",
        package: "skiff-scheduler",
        bin: "skiff-scheduler",
        required: false,
        args: scheduler_args,
        readiness: Readiness::Started,
    },
    Component {
        name: "controller-manager",
        package: "skiff-controllers",
        bin: "skiff-controller-manager",
        required: false,
        args: controller_manager_args,
        readiness: Readiness::Started,
    },
];

pub fn apiserver_args(cfg: &UpConfig, i: u16) -> Vec<String> {
    let mut a = vec![
        "--listen".to_string(),
        cfg.listen_of(i).to_string(),
        "--pki-dir".into(),
        cfg.pki_dir.display().to_string(),
    ];
    match &cfg.store {
        Store::Embedded { data_dir } => a.extend([
            "--store".into(),
            "embedded".into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
        ]),
        Store::Etcd { endpoints } => a.extend([
            "--store".into(),
            "etcd".into(),
            "--etcd-endpoints".into(),
            endpoints.clone(),
        ]),
    }
    if let Some(t) = &cfg.etcd_tls {
        for (flag, path) in [
            ("--etcd-cafile", &t.ca),
            ("--etcd-certfile", &t.cert),
            ("--etcd-keyfile", &t.key),
        ] {
            a.extend([flag.to_string(), path.display().to_string()]);
        }
    }
    a
}

/// With `--ha`, instance `i` of a leader-electing component lists every API server and has
/// its own identity.
fn ha_args(cfg: &UpConfig, name: &str, i: u16) -> Vec<String> {
    if !cfg.ha {
        return Vec::new();
    }
    vec![
        "--server".into(),
        cfg.server_urls(),
        "--identity".into(),
        format!("{name}-{}", i + 1),
    ]
}

/// The scheduler runs as `system:kube-scheduler` with the kubeconfig the API server wrote.
pub fn scheduler_args(cfg: &UpConfig, i: u16) -> Vec<String> {
    let mut a = vec![
        "--kubeconfig".into(),
        cfg.kubeconfig("scheduler").display().to_string(),
    ];
    a.extend(ha_args(cfg, "scheduler", i));
    a
}

/// The controller manager runs as `system:kube-controller-manager` and signs approved
/// certificate requests (nodes joining with `skiff-node join`) with the cluster CA.
pub fn controller_manager_args(cfg: &UpConfig, i: u16) -> Vec<String> {
    let mut a = vec![
        "--kubeconfig".into(),
        cfg.kubeconfig("controller-manager").display().to_string(),
        "--cluster-signing-cert-file".into(),
        cfg.pki_dir.join("ca.crt").display().to_string(),
        "--cluster-signing-key-file".into(),
        cfg.pki_dir.join("ca.key").display().to_string(),
        // The default StorageClass' volumes, in the state directory beside the PKI.
        "--local-path-root".into(),
        cfg.pki_dir
            .with_file_name("local-path")
            .display()
            .to_string(),
    ];
    a.extend(ha_args(cfg, "controller-manager", i));
    a
}

/// The `--ha` etcd members: `(name, client port, peer port, data dir)`.
pub fn etcd_members(root: &Path) -> Vec<(String, u16, u16, PathBuf)> {
    HA_ETCD_CLIENT_PORTS
        .iter()
        .enumerate()
        .map(|(i, &client)| {
            let name = format!("etcd-{}", i + 1);
            let dir = root.join(".skiff").join("etcd").join(&name);
            (name, client, client + 1, dir)
        })
        .collect()
}

/// `etcd` arguments of one `--ha` member (an existing data directory keeps its cluster; the
/// initial flags only matter on first start).
pub fn etcd_args(root: &Path, member: usize) -> Vec<String> {
    let members = etcd_members(root);
    let cluster = members
        .iter()
        .map(|(n, _, peer, _)| format!("{n}=https://127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let (name, client, peer, dir) = &members[member];
    let pki = etcd_pki_dir(root);
    let (ca, cert, key) = (
        pki.join("ca.crt").display().to_string(),
        pki.join(format!("{name}.crt")).display().to_string(),
        pki.join(format!("{name}.key")).display().to_string(),
    );
    vec![
        format!("--name={name}"),
        format!("--data-dir={}", dir.display()),
        format!("--listen-client-urls=https://127.0.0.1:{client}"),
        format!("--advertise-client-urls=https://127.0.0.1:{client}"),
        format!("--listen-peer-urls=https://127.0.0.1:{peer}"),
        format!("--initial-advertise-peer-urls=https://127.0.0.1:{peer}"),
        format!("--initial-cluster={cluster}"),
        "--initial-cluster-state=new".into(),
        "--initial-cluster-token=skiff-up-ha".into(),
        // Clients and peers speak TLS and must present a certificate of the etcd CA.
        format!("--cert-file={cert}"),
        format!("--key-file={key}"),
        format!("--trusted-ca-file={ca}"),
        "--client-cert-auth".into(),
        format!("--peer-cert-file={cert}"),
        format!("--peer-key-file={key}"),
        format!("--peer-trusted-ca-file={ca}"),
        "--peer-client-cert-auth".into(),
    ]
}

/// `skiff-apiserver etcd-certs` arguments that make (once) the `--ha` etcd PKI: the etcd
/// CA, a certificate per member, the API server's client certificate.
pub fn etcd_certs_args(root: &Path) -> Vec<String> {
    let mut a = vec![
        "etcd-certs".to_string(),
        "--dir".into(),
        etcd_pki_dir(root).display().to_string(),
    ];
    for (name, _, _, _) in etcd_members(root) {
        a.extend(["--member".into(), name]);
    }
    a
}

/// Most nodes `up` will start (their pod CIDRs are 10.244.1.0/24 ..= 10.244.200.0/24).
pub const MAX_NODES: u32 = 200;
const NODE_PACKAGE: &str = "skiff-node";

/// One node agent of the local cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    pub name: String,
    /// Network namespace holding the node's own network (`/run/netns/<netns>`).
    pub netns: String,
    pub pod_cidr: String,
    pub state_dir: PathBuf,
    /// The node's address on the fabric (`eth0` in its namespace).
    pub node_ip: String,
}

/// The namespace holding the bridge that joins the nodes (their shared L2 segment).
pub const FABRIC_NETNS: &str = "skiff-up-fabric";
/// A client namespace on the fabric, outside the cluster (for NodePort and the like).
pub const OUTSIDE_NETNS: &str = "skiff-up-outside";
/// The fabric's subnet; nodes are .1 .. .N, the outside namespace .254.
pub use skiff_testnet::FABRIC_PREFIX;

/// The nodes `up` starts: `node-1` .. `node-N`.
pub fn node_plans(n: u32, root: &Path) -> Vec<NodePlan> {
    (1..=n.min(MAX_NODES))
        .map(|i| NodePlan {
            name: format!("node-{i}"),
            netns: format!("skiff-up-node-{i}"),
            pod_cidr: format!("10.244.{i}.0/24"),
            state_dir: root.join(".skiff").join("nodes").join(format!("node-{i}")),
            node_ip: format!("{FABRIC_PREFIX}.{i}"),
        })
        .collect()
}

/// The kubeconfig of a node's agent (`system:node:<name>` in `system:nodes`).
pub fn node_kubeconfig(node: &NodePlan) -> PathBuf {
    node.state_dir.join("kubeconfig")
}

/// Arguments of `skiff-apiserver kubeconfig` that write a node's kubeconfig.
pub fn node_kubeconfig_args(cfg: &UpConfig, node: &NodePlan) -> Vec<String> {
    vec![
        "kubeconfig".into(),
        "--pki-dir".into(),
        cfg.pki_dir.display().to_string(),
        "--user".into(),
        format!("system:node:{}", node.name),
        "--group".into(),
        "system:nodes".into(),
        "--server".into(),
        cfg.server_urls(),
        "--out".into(),
        node_kubeconfig(node).display().to_string(),
    ]
}

/// How a node gets its credentials: a kubeconfig written for it, or `skiff-node join` with a
/// bootstrap token (its kubeconfig is then written by the agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeCredentials {
    Kubeconfig,
    /// The CA hash; the token goes in the environment (`SKIFF_JOIN_TOKEN`), not the
    /// command line.
    Join {
        ca_cert_hash: String,
    },
}

/// Arguments of `skiff-node run` (or `join`) for one node.
pub fn node_args(cfg: &UpConfig, node: &NodePlan, how: &NodeCredentials) -> Vec<String> {
    let mut a: Vec<String> = match how {
        NodeCredentials::Kubeconfig => vec!["run".into()],
        NodeCredentials::Join { ca_cert_hash } => vec![
            "join".into(),
            "--server".into(),
            cfg.server_url(),
            "--ca-cert-hash".into(),
            ca_cert_hash.clone(),
        ],
    };
    a.extend([
        "--kubeconfig".into(),
        node_kubeconfig(node).display().to_string(),
        "--node-name".into(),
        node.name.clone(),
        "--node-netns".into(),
        format!("/run/netns/{}", node.netns),
        "--pod-cidr".into(),
        node.pod_cidr.clone(),
        "--state-dir".into(),
        node.state_dir.display().to_string(),
    ]);
    a
}

/// A bootstrap token for the nodes (valid an hour) and the cluster CA's hash, made by
/// `skiff token create --print-join-command` with the administrator's kubeconfig: the nodes
/// join as any new machine would.
fn join_token(plan: &Plan<'_>) -> Result<(String, String)> {
    let cli = plan.cli_bin.context("the CLI was not built")?;
    let bin = plan.bin_dir.join(cli);
    let out = Command::new(&bin)
        .arg("--kubeconfig")
        .arg(plan.cfg.kubeconfig("admin"))
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
        .with_context(|| format!("running {} token create", bin.display()))?;
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

/// The fabric: a bridge in namespace [`FABRIC_NETNS`], and the outside client namespace
/// attached to it as `.254` (stale ones from an earlier crash are replaced). Nothing is
/// created in the root namespace; dropping it removes both.
fn prepare_fabric() -> Result<Fabric> {
    let fabric = Fabric::create(FABRIC_NETNS)?;
    fabric.outside(OUTSIDE_NETNS, Some(254))?;
    Ok(fabric)
}

/// A fresh network namespace for a node (a stale one from an earlier crash is replaced),
/// attached to the fabric as host `.i`.
fn prepare_node_netns(fabric: &Fabric, node: &NodePlan, host: u8) -> Result<Netns> {
    let ns = Netns::create(&node.netns)?;
    let peer = node.name.replace("node-", "n");
    fabric.attach_as(ns.name(), host, &peer)?;
    Ok(ns)
}

/// Removes everything a node ran (`skiff-node purge`); its namespace goes when its [`Netns`]
/// is dropped.
fn purge_node(bin_dir: &Path, node: &NodePlan) {
    let out = Command::new(bin_dir.join("skiff-node"))
        .args(["purge", "--node-name", &node.name, "--state-dir"])
        .arg(&node.state_dir)
        .output();
    match out {
        Ok(o) if o.status.success() => println!("removed {}'s pods", node.name),
        Ok(o) => eprintln!(
            "purging {}: {}",
            node.name,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => eprintln!("purging {}: {e}", node.name),
    }
}

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

fn load_workspace(root: &Path) -> Result<Workspace> {
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

/// Components to start, and the names (with reasons) of those skipped.
pub fn select_components<'a>(
    components: &'a [Component],
    ws: &Workspace,
) -> Result<(Vec<&'a Component>, Vec<String>)> {
    let mut start = Vec::new();
    let mut skipped = Vec::new();
    for c in components {
        if ws.has_bin(c.package, c.bin) {
            start.push(c);
        } else if c.required {
            let why = if ws.bins.contains_key(c.package) {
                format!(
                    "package {} has no `{}` binary target yet (no src/main.rs?)",
                    c.package, c.bin
                )
            } else {
                format!("package {} is not in the workspace", c.package)
            };
            bail!("cannot start {}: {why}", c.name);
        } else {
            skipped.push(format!(
                "{} (no {} binary in the workspace yet)",
                c.name, c.bin
            ));
        }
    }
    Ok((start, skipped))
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
pub fn kubeconfig_path(root: &Path) -> PathBuf {
    root.join(".skiff").join("kubeconfig")
}

/// The last `n` lines of `text`.
pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn log_tail(path: &Path) -> String {
    match fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => {
            format!("last lines of {}:\n{}", path.display(), tail_lines(&t, 20))
        }
        Ok(_) => format!("{} is empty", path.display()),
        Err(e) => format!("could not read {}: {e}", path.display()),
    }
}

fn port_open(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

pub fn run(args: UpArgs) -> Result<()> {
    // What `up` builds and starts needs the same prerequisites as the tests: install what is
    // missing, then prove each works, before any build can fail obscurely.
    setup::run(SetupOptions { skip_ebpf: false }).context("setup failed; nothing was started")?;
    doctor::run(&doctor::DoctorOptions::default()).context("nothing was started")?;
    let root = util::repo_root();
    let cwd = std::env::current_dir().context("current directory")?;
    let cfg = UpConfig::from_args(&args, &root, &cwd);

    let ws = load_workspace(&root)?;
    let (components, skipped) = select_components(COMPONENTS, &ws)?;
    for s in &skipped {
        println!("skip: {s}");
    }
    let nodes = if cfg.nodes == 0 {
        Vec::new()
    } else if !util::is_root() {
        println!("skip: node agents (they need root for namespaces, cgroups and BPF)");
        Vec::new()
    } else {
        if cfg.nodes > MAX_NODES {
            bail!("--nodes {} is more than {MAX_NODES}", cfg.nodes);
        }
        node_plans(cfg.nodes, &root)
    };

    for i in 0..cfg.instances() {
        let api = connect_addr(cfg.listen_of(i));
        if port_open(api) {
            bail!("something is already listening on {api}: stop it or pass --listen");
        }
    }
    if cfg.ha {
        for (name, client, peer, _) in etcd_members(&root) {
            for port in [client, peer] {
                let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                if port_open(addr) {
                    bail!("something is already listening on {addr} (for {name}): stop it");
                }
            }
        }
    }
    if let Some(r) = cfg.registry
        && port_open(r)
    {
        bail!(
            "something is already listening on {r}: stop it, or pass --registry-port (0: no registry)"
        );
    }

    // Build everything we start, plus the CLI.
    let mut build = Command::new("cargo");
    build.arg("build").current_dir(&root);
    for c in &components {
        build.args(["-p", c.package]);
    }
    build.args(["-p", CLI_PACKAGE]);
    if !nodes.is_empty() {
        build.args(["-p", NODE_PACKAGE]);
    }
    println!("==> {}", util::display_cmd(&build));
    util::run_streaming(&mut build).context(
        "building the control plane failed (see the compiler errors above); \
         nothing was started",
    )?;

    let bin_dir = ws.target_dir.join("debug");
    for c in &components {
        let p = bin_dir.join(c.bin);
        if !util::is_executable(&p) {
            bail!(
                "{} was not produced by the build (expected {})",
                c.bin,
                p.display()
            );
        }
    }

    // The cluster's state (PKI, encryption key, store, snapshots, node credentials) is only
    // its owner's: `.skiff` and the data directory are 0700 (the API server keeps its own
    // directories and files private too).
    private_dir(&root.join(".skiff"))?;
    if let Store::Embedded { data_dir } = &cfg.store {
        private_dir(data_dir)?;
    } else if args.data_dir.is_some() {
        println!("note: --data-dir is ignored with --etcd");
    }
    let log_dir = root.join(".skiff").join("logs");
    fs::create_dir_all(&log_dir).with_context(|| format!("creating {}", log_dir.display()))?;

    let config_file = config_path(
        std::env::var("SKIFF_CONFIG").ok().as_deref(),
        std::env::var("HOME").ok().as_deref(),
    )?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting tokio runtime")?;
    rt.block_on(supervise(Plan {
        root: &root,
        cfg: &cfg,
        components: &components,
        bin_dir: &bin_dir,
        log_dir: &log_dir,
        config_file: &config_file,
        cli_bin: ws.cli_bin(),
        nodes: &nodes,
    }))
}

struct Plan<'a> {
    root: &'a Path,
    cfg: &'a UpConfig,
    components: &'a [&'a Component],
    bin_dir: &'a Path,
    log_dir: &'a Path,
    config_file: &'a Path,
    cli_bin: Option<&'a str>,
    nodes: &'a [NodePlan],
}

struct Running {
    name: String,
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
    /// How it was started, to start it again after a crash.
    spec: SpawnSpec,
    /// Crash restarts with back-off.
    restarts: Restarts,
}

/// A process's command line, environment and log, as `spawn_process` got them.
#[derive(Debug, Clone)]
struct SpawnSpec {
    root: PathBuf,
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// When a crashed component is started again: after 1 s, doubling up to 30 s while it keeps
/// crashing; a run of a minute or more starts the back-off over (systemd's and k3s'
/// supervisors behave alike).
#[derive(Debug, Clone, Default)]
struct Restarts {
    count: u32,
    delay: Duration,
    started: Option<Instant>,
    due: Option<Instant>,
}

const RESTART_FIRST: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(30);
const RESTART_RESET_AFTER: Duration = Duration::from_secs(60);

impl Restarts {
    /// The process exited at `now`: when to start it again.
    fn exited(&mut self, now: Instant) -> Duration {
        let ran = self.started.map(|s| now.saturating_duration_since(s));
        self.delay = match ran {
            Some(r) if r >= RESTART_RESET_AFTER => RESTART_FIRST,
            _ if self.delay.is_zero() => RESTART_FIRST,
            _ => (self.delay * 2).min(RESTART_MAX),
        };
        self.due = Some(now + self.delay);
        self.delay
    }

    fn started(&mut self, now: Instant) {
        self.started = Some(now);
        self.due = None;
    }
}

/// Restarts the components that exited, each after its back-off, saying so. Errors only
/// when a process cannot be checked; a start that fails is tried again later.
fn restart_crashed(running: &mut [Running]) -> Result<()> {
    let now = Instant::now();
    for r in running.iter_mut() {
        if let Some(due) = r.restarts.due {
            if now < due {
                continue;
            }
            match spawn_process(
                &r.spec.root,
                &r.spec.bin,
                r.name.clone(),
                &r.spec.args,
                &r.spec
                    .env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect::<Vec<_>>(),
                &r.log,
                true,
            ) {
                Ok(fresh) => {
                    r.restarts.count += 1;
                    println!(
                        "restarted {} (pid {}, restart {}), log: {}",
                        r.name,
                        fresh.pid,
                        r.restarts.count,
                        r.log.display()
                    );
                    r.child = fresh.child;
                    r.pid = fresh.pid;
                    r.restarts.started(now);
                }
                Err(e) => {
                    let d = r.restarts.exited(now);
                    println!("starting {} again failed: {e:#}; next try in {d:?}", r.name);
                }
            }
            continue;
        }
        match r.child.try_wait() {
            Ok(Some(status)) => {
                let d = r.restarts.exited(now);
                println!(
                    "{} exited unexpectedly ({status}); restarting in {d:?}\n{}",
                    r.name,
                    log_tail(&r.log)
                );
            }
            Ok(None) => {}
            Err(e) => bail!("checking {}: {e}", r.name),
        }
    }
    Ok(())
}

/// SIGINT or SIGTERM delivered to xtask.
struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    fn new() -> Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

enum Stop {
    Signal,
    Failed(anyhow::Error),
}

async fn supervise(plan: Plan<'_>) -> Result<()> {
    let mut signals = Signals::new()?;
    let mut running: Vec<Running> = Vec::new();
    let mut fabric: Option<Fabric> = None;
    let mut node_nets: Vec<Netns> = Vec::new();

    let stop = 'run: {
        // --ha: the etcd members first, all of them (one alone has no quorum), then each
        // waited for.
        if plan.cfg.ha {
            if let Err(e) = make_etcd_pki(&plan) {
                break 'run Stop::Failed(e);
            }
            let members = etcd_members(plan.root);
            for (i, (name, _, _, dir)) in members.iter().enumerate() {
                let log = plan.log_dir.join(format!("{name}.log"));
                let started = fs::create_dir_all(dir.parent().unwrap_or(dir))
                    .with_context(|| format!("creating {}", dir.display()))
                    .and_then(|()| {
                        spawn_process(
                            plan.root,
                            Path::new("etcd"),
                            name.clone(),
                            &etcd_args(plan.root, i),
                            &[],
                            &log,
                            false,
                        )
                    });
                match started {
                    Ok(r) => {
                        println!("started {name} (pid {}), log: {}", r.pid, log.display());
                        running.push(r);
                    }
                    Err(e) => break 'run Stop::Failed(e),
                }
            }
            let first = running.len() - members.len();
            for (r, (name, client, _, _)) in running[first..].iter_mut().zip(&members) {
                let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, *client));
                tokio::select! {
                    res = wait_port(r, addr) => if let Err(e) = res { break 'run Stop::Failed(e) },
                    _ = signals.recv() => break 'run Stop::Signal,
                }
                println!("{name} is accepting connections on {addr}");
            }
        }
        for c in plan.components {
            for i in 0..plan.cfg.instances() {
                let name = if plan.cfg.ha {
                    format!("{}-{}", c.name, i + 1)
                } else {
                    c.name.to_string()
                };
                let log = plan.log_dir.join(format!("{name}.log"));
                match spawn(&plan, c, i, &name, &log) {
                    Ok(r) => {
                        println!("started {name} (pid {}), log: {}", r.pid, log.display());
                        running.push(r);
                    }
                    Err(e) => break 'run Stop::Failed(e),
                }
                if c.readiness == Readiness::ApiPort {
                    let addr = connect_addr(plan.cfg.listen_of(i));
                    let Some(r) = running.last_mut() else {
                        continue;
                    };
                    tokio::select! {
                        res = wait_port(r, addr) => if let Err(e) = res { break 'run Stop::Failed(e) },
                        _ = signals.recv() => break 'run Stop::Signal,
                    }
                    println!("{name} is accepting connections on {addr}");
                }
            }
        }

        if let Some(addr) = plan.cfg.registry {
            let log = plan.log_dir.join("registry.log");
            let started = registry_config(plan.root, addr).and_then(|config| {
                spawn_process(
                    plan.root,
                    Path::new(REGISTRY_BIN),
                    "registry".into(),
                    &["serve".into(), config.display().to_string()],
                    &[],
                    &log,
                    false,
                )
            });
            match started {
                Ok(r) => {
                    println!("started registry (pid {}), log: {}", r.pid, log.display());
                    running.push(r);
                }
                Err(e) => break 'run Stop::Failed(e),
            }
            let Some(r) = running.last_mut() else {
                break 'run Stop::Failed(anyhow!("the registry did not start"));
            };
            tokio::select! {
                res = wait_port(r, addr) => if let Err(e) = res { break 'run Stop::Failed(e) },
                _ = signals.recv() => break 'run Stop::Signal,
            }
        }

        if !plan.nodes.is_empty() {
            match prepare_fabric() {
                Ok(f) => fabric = Some(f),
                Err(e) => break 'run Stop::Failed(e),
            }
        }
        // With the controller manager (it signs the nodes' certificate requests) the nodes
        // join with a bootstrap token; without it they get kubeconfigs written for them.
        let signs = plan
            .components
            .iter()
            .any(|c| c.bin == "skiff-controller-manager");
        let mut token = String::new();
        // (--ha: kubeconfigs listing every API server; `skiff-node join` takes one.)
        let how = if signs && !plan.nodes.is_empty() && !plan.cfg.ha {
            match join_token(&plan) {
                Ok((t, ca_cert_hash)) => {
                    token = t;
                    NodeCredentials::Join { ca_cert_hash }
                }
                Err(e) => break 'run Stop::Failed(e),
            }
        } else {
            NodeCredentials::Kubeconfig
        };
        for (i, node) in plan.nodes.iter().enumerate() {
            let log = plan.log_dir.join(format!("{}.log", node.name));
            let Some(fab) = &fabric else { break };
            let host = u8::try_from(i + 1).unwrap_or(u8::MAX);
            let started = prepare_node_netns(fab, node, host).and_then(|ns| {
                node_nets.push(ns);
                let env: &[(&str, &str)] = match &how {
                    NodeCredentials::Kubeconfig => {
                        write_node_kubeconfig(&plan, node)?;
                        &[]
                    }
                    NodeCredentials::Join { .. } => {
                        fs::create_dir_all(&node.state_dir)
                            .with_context(|| format!("creating {}", node.state_dir.display()))?;
                        &[("SKIFF_JOIN_TOKEN", token.as_str())]
                    }
                };
                spawn_process(
                    plan.root,
                    &plan.bin_dir.join("skiff-node"),
                    node.name.clone(),
                    &node_args(plan.cfg, node, &how),
                    env,
                    &log,
                    false,
                )
            });
            match started {
                Ok(r) => {
                    println!(
                        "started {} (pid {}, netns {}, pods {}), log: {}",
                        node.name,
                        r.pid,
                        node.netns,
                        node.pod_cidr,
                        log.display()
                    );
                    running.push(r);
                }
                Err(e) => break 'run Stop::Failed(e),
            }
        }

        let admin = plan.cfg.kubeconfig("admin");
        for dest in [plan.config_file.to_path_buf(), kubeconfig_path(plan.root)] {
            if let Err(e) = copy_private(&admin, &dest) {
                break 'run Stop::Failed(e);
            }
        }
        // --ha: the CLI's config lists every API server (kubectl's keeps the first: it takes
        // one URL).
        if plan.cfg.ha
            && let Err(e) = write_admin_config(&plan, plan.config_file)
        {
            break 'run Stop::Failed(e);
        }
        print_banner(&plan);

        loop {
            tokio::select! {
                _ = signals.recv() => break 'run Stop::Signal,
                _ = tokio::time::sleep(POLL * 2) => {}
            }
            // A crashed component is started again (with back-off); the others go on.
            if let Err(e) = restart_crashed(&mut running) {
                break 'run Stop::Failed(e);
            }
        }
    };

    if let Stop::Signal = stop {
        println!("\nshutting down...");
    }
    shutdown(&mut running, &mut signals).await;
    for node in plan.nodes {
        purge_node(plan.bin_dir, node);
    }
    // Node namespaces, then the fabric with the outside namespace.
    drop(node_nets);
    drop(fabric);

    match stop {
        Stop::Signal => {
            println!("stopped");
            Ok(())
        }
        Stop::Failed(e) => Err(e),
    }
}

/// Starts instance `instance` of component `c` as `name`, logging to `log`.
fn spawn(plan: &Plan<'_>, c: &Component, instance: u16, name: &str, log: &Path) -> Result<Running> {
    spawn_process(
        plan.root,
        &plan.bin_dir.join(c.bin),
        name.to_string(),
        &(c.args)(plan.cfg, instance),
        &[],
        log,
        false,
    )
}

/// Writes the administrator's kubeconfig with every API server as its server (Skiff's
/// clients fail over between them) to `dest`.
fn write_admin_config(plan: &Plan<'_>, dest: &Path) -> Result<()> {
    let args = [
        "kubeconfig".to_string(),
        "--pki-dir".into(),
        plan.cfg.pki_dir.display().to_string(),
        "--user".into(),
        "system:admin".into(),
        "--group".into(),
        "system:masters".into(),
        "--server".into(),
        plan.cfg.server_urls(),
        "--out".into(),
        dest.display().to_string(),
    ];
    let out = Command::new(plan.bin_dir.join("skiff-apiserver"))
        .args(&args)
        .output()
        .context("running skiff-apiserver kubeconfig")?;
    if !out.status.success() {
        bail!(
            "skiff-apiserver kubeconfig: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn spawn_process(
    root: &Path,
    bin: &Path,
    name: String,
    args: &[String],
    env: &[(&str, &str)],
    log: &Path,
    append: bool,
) -> Result<Running> {
    // A restart appends to the log of the run that crashed.
    let out = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(args)
        .envs(env.iter().copied())
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Own process group: a terminal Ctrl-C reaches only xtask, which then
        // stops the children in order.
        .process_group(0)
        // Safety net if xtask itself errors out before shutdown.
        .kill_on_drop(true);
    // RUST_LOG and the rest of the environment are inherited.
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {} {}", bin.display(), args.join(" ")))?;
    let pid = child.id().context("child has no pid")?;
    let mut restarts = Restarts::default();
    restarts.started(Instant::now());
    Ok(Running {
        name,
        child,
        pid,
        log: log.to_path_buf(),
        spec: SpawnSpec {
            root: root.to_path_buf(),
            bin: bin.to_path_buf(),
            args: args.to_vec(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
        restarts,
    })
}

async fn wait_port(r: &mut Running, addr: SocketAddr) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = r.child.try_wait()? {
            bail!(
                "{} exited during startup ({status})\n{}",
                r.name,
                log_tail(&r.log)
            );
        }
        let open = tokio::task::spawn_blocking(move || port_open(addr)).await?;
        if open {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "{} did not accept connections on {addr} within {}s\n{}",
                r.name,
                READY_TIMEOUT.as_secs(),
                log_tail(&r.log)
            );
        }
        tokio::time::sleep(POLL).await;
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
fn copy_private(from: &Path, to: &Path) -> Result<()> {
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

/// Has the API server's binary make the `--ha` etcd PKI (once; later runs reuse it).
fn make_etcd_pki(plan: &Plan<'_>) -> Result<()> {
    let data = plan.root.join(".skiff").join("etcd");
    if data.exists() && !etcd_pki_dir(plan.root).exists() {
        bail!(
            "{} holds etcd members an older `up --ha` started with plain HTTP; remove it (the \
             --ha cluster's data) to start them with TLS",
            data.display()
        );
    }
    let bin = plan.bin_dir.join("skiff-apiserver");
    let out = Command::new(&bin)
        .args(etcd_certs_args(plan.root))
        .output()
        .with_context(|| format!("running {} etcd-certs", bin.display()))?;
    if !out.status.success() {
        bail!(
            "making the etcd PKI failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Has the API server's binary write a node's kubeconfig with a certificate of the cluster
/// CA (the PKI exists: the API server made it before it listened).
fn write_node_kubeconfig(plan: &Plan<'_>, node: &NodePlan) -> Result<()> {
    fs::create_dir_all(&node.state_dir)
        .with_context(|| format!("creating {}", node.state_dir.display()))?;
    let bin = plan.bin_dir.join("skiff-apiserver");
    let out = Command::new(&bin)
        .args(node_kubeconfig_args(plan.cfg, node))
        .output()
        .with_context(|| format!("running {} kubeconfig", bin.display()))?;
    if !out.status.success() {
        bail!(
            "writing {}'s kubeconfig failed: {}",
            node.name,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Debian's docker-registry (the CNCF distribution registry), installed by `cargo xtask setup`.
const REGISTRY_BIN: &str = "docker-registry";

/// Writes the local registry's configuration (storage under `.skiff/registry`, listening on
/// `addr`, deletes allowed); returns its path.
fn registry_config(root: &Path, addr: SocketAddr) -> Result<PathBuf> {
    let dir = root.join(".skiff").join("registry");
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

fn print_banner(plan: &Plan<'_>) {
    let url = plan.cfg.server_urls();
    println!();
    println!("Skiff control plane is up");
    println!("  api server: {url}");
    if plan.cfg.ha {
        println!(
            "  ha:         {n} etcd members, {n} API servers, {n} schedulers and {n} controller managers (leader election)",
            n = HA_REPLICAS
        );
    }
    match &plan.cfg.store {
        Store::Embedded { data_dir } => println!("  store:      embedded, {}", data_dir.display()),
        Store::Etcd { endpoints } => println!("  store:      etcd at {endpoints}"),
    }
    println!("  logs:       {}", plan.log_dir.display());
    for node in plan.nodes {
        println!(
            "  node:       {} (netns {}, address {}, pods {})",
            node.name, node.netns, node.node_ip, node.pod_cidr
        );
    }
    if !plan.nodes.is_empty() {
        println!(
            "  fabric:     bridge in netns {FABRIC_NETNS}; outside client netns {OUTSIDE_NETNS} ({FABRIC_PREFIX}.254)"
        );
    }
    println!(
        "  CLI config: {} (server: {url})",
        plan.config_file.display()
    );
    println!("  kubeconfig: {}", kubeconfig_path(plan.root).display());
    if let Some(r) = plan.cfg.registry {
        println!("  registry:   {r} (every node pulls from it over plain HTTP)");
    }
    println!();
    println!("From another shell:");
    println!("  export PATH={}:$PATH", plan.bin_dir.display());
    if let Some(r) = plan.cfg.registry {
        println!("  export SKIFF_REGISTRY={r}");
    }
    if let Ok(p) = std::env::var("SKIFF_CONFIG") {
        println!("  export SKIFF_CONFIG={p}");
    }
    match plan.cli_bin {
        Some(cli) => {
            println!("  {cli} get ns");
        }
        None => println!("  (the {CLI_PACKAGE} crate has no binary target yet)"),
    }
    println!("or with kubectl:");
    println!(
        "  export KUBECONFIG={}",
        kubeconfig_path(plan.root).display()
    );
    println!("  kubectl get nodes -o wide");
    println!();
    println!("Press Ctrl-C to stop.");
}

fn send_signal(pid: u32, sig: &str) {
    // `kill` is a shell builtin in dash, so this works without procps.
    let res = Command::new("sh")
        .args(["-c", &format!("kill -{sig} {pid}")])
        .stderr(Stdio::null())
        .status();
    if let Err(e) = res {
        eprintln!("could not send SIG{sig} to {pid}: {e}");
    }
}

/// SIGTERM every running child (in reverse start order), wait up to
/// [`STOP_TIMEOUT`] (a second Ctrl-C cuts this short), then SIGKILL the rest.
async fn shutdown(running: &mut [Running], signals: &mut Signals) {
    for r in running.iter_mut().rev() {
        // try_wait reaps; until we reap, the pid cannot be reused.
        if let Ok(None) = r.child.try_wait() {
            println!("stopping {} (pid {})", r.name, r.pid);
            send_signal(r.pid, "TERM");
        }
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        let mut alive = 0;
        for r in running.iter_mut() {
            if matches!(r.child.try_wait(), Ok(None)) {
                alive += 1;
            }
        }
        if alive == 0 || Instant::now() >= deadline {
            break;
        }
        tokio::select! {
            _ = signals.recv() => {
                println!("second signal: killing now");
                break;
            }
            _ = tokio::time::sleep(POLL) => {}
        }
    }
    for r in running.iter_mut() {
        match r.child.try_wait() {
            Ok(Some(status)) => println!("{} exited ({status})", r.name),
            _ => {
                println!("{} did not stop: sending SIGKILL", r.name);
                let _ = r.child.start_kill();
                match r.child.wait().await {
                    Ok(status) => println!("{} killed ({status})", r.name),
                    Err(e) => eprintln!("waiting for {}: {e}", r.name),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(etcd: Option<&str>, data_dir: Option<&str>) -> UpArgs {
        UpArgs {
            etcd: etcd.map(String::from),
            listen: "127.0.0.1:7443".parse().unwrap(),
            data_dir: data_dir.map(PathBuf::from),
            nodes: 0,
            registry_port: 5000,
            ha: false,
            etcd_cafile: None,
            etcd_certfile: None,
            etcd_keyfile: None,
        }
    }

    /// `--ha`: three etcd members in one cluster, three API servers on consecutive ports over
    /// all three, the leader-electing components listing every server with their own
    /// identities, node kubeconfigs with every server.
    #[test]
    fn ha_runs_three_of_everything_and_lists_every_server() {
        let mut a = args(None, None);
        a.ha = true;
        let cfg = UpConfig::from_args(&a, Path::new("/repo"), Path::new("/"));
        assert_eq!(cfg.instances(), 3);
        let all = "https://127.0.0.1:7443,https://127.0.0.1:7444,https://127.0.0.1:7445";
        assert_eq!(cfg.server_urls(), all);
        let etcd = "https://127.0.0.1:2379,https://127.0.0.1:2381,https://127.0.0.1:2383";
        assert_eq!(
            cfg.store,
            Store::Etcd {
                endpoints: etcd.into()
            }
        );
        let api = apiserver_args(&cfg, 2);
        assert!(
            api.windows(2).any(|w| w == ["--listen", "127.0.0.1:7445"]),
            "{api:?}"
        );
        assert!(
            api.windows(2).any(|w| w == ["--etcd-endpoints", etcd]),
            "{api:?}"
        );
        assert!(
            api.windows(2)
                .any(|w| w == ["--pki-dir", "/repo/.skiff/pki"]),
            "{api:?}"
        );
        let sched = scheduler_args(&cfg, 1);
        assert!(
            sched.windows(2).any(|w| w == ["--server", all]),
            "{sched:?}"
        );
        assert!(
            sched.windows(2).any(|w| w == ["--identity", "scheduler-2"]),
            "{sched:?}"
        );
        let cm = controller_manager_args(&cfg, 0);
        assert!(
            cm.windows(2)
                .any(|w| w == ["--identity", "controller-manager-1"]),
            "{cm:?}"
        );
        let plans = node_plans(1, Path::new("/repo"));
        let k = node_kubeconfig_args(&cfg, &plans[0]);
        assert!(k.windows(2).any(|w| w == ["--server", all]), "{k:?}");
        let e = etcd_args(Path::new("/repo"), 1);
        assert!(e.contains(&"--name=etcd-2".to_string()), "{e:?}");
        assert!(
            e.contains(&"--listen-client-urls=https://127.0.0.1:2381".to_string()),
            "{e:?}"
        );
        assert!(
            e.contains(
                &"--initial-cluster=etcd-1=https://127.0.0.1:2380,etcd-2=https://127.0.0.1:2382,etcd-3=https://127.0.0.1:2384"
                    .to_string()
            ),
            "{e:?}"
        );
        // TLS both ways, with the etcd CA's certificates only.
        for flag in [
            "--cert-file=/repo/.skiff/pki/etcd/etcd-2.crt",
            "--key-file=/repo/.skiff/pki/etcd/etcd-2.key",
            "--trusted-ca-file=/repo/.skiff/pki/etcd/ca.crt",
            "--client-cert-auth",
            "--peer-cert-file=/repo/.skiff/pki/etcd/etcd-2.crt",
            "--peer-trusted-ca-file=/repo/.skiff/pki/etcd/ca.crt",
            "--peer-client-cert-auth",
        ] {
            assert!(e.contains(&flag.to_string()), "{flag}: {e:?}");
        }
        for (flag, file) in [
            ("--etcd-cafile", "/repo/.skiff/pki/etcd/ca.crt"),
            (
                "--etcd-certfile",
                "/repo/.skiff/pki/etcd/apiserver-etcd-client.crt",
            ),
            (
                "--etcd-keyfile",
                "/repo/.skiff/pki/etcd/apiserver-etcd-client.key",
            ),
        ] {
            assert!(api.windows(2).any(|w| w == [flag, file]), "{api:?}");
        }
        assert_eq!(
            etcd_certs_args(Path::new("/repo")),
            [
                "etcd-certs",
                "--dir",
                "/repo/.skiff/pki/etcd",
                "--member",
                "etcd-1",
                "--member",
                "etcd-2",
                "--member",
                "etcd-3"
            ]
        );
        // Without --ha: one of each, no --server or --identity added.
        let one = UpConfig::from_args(&args(None, None), Path::new("/repo"), Path::new("/"));
        assert_eq!(one.instances(), 1);
        assert_eq!(one.server_urls(), "https://127.0.0.1:7443");
        assert!(!scheduler_args(&one, 0).contains(&"--server".to_string()));
    }

    #[test]
    fn the_local_registry_listens_on_loopback_and_stores_under_skiff() {
        let cfg = UpConfig::from_args(&args(None, None), Path::new("/repo"), Path::new("/"));
        assert_eq!(cfg.registry, Some("127.0.0.1:5000".parse().unwrap()));
        let mut none = args(None, None);
        none.registry_port = 0;
        let cfg = UpConfig::from_args(&none, Path::new("/repo"), Path::new("/"));
        assert_eq!(cfg.registry, None);
        let conf = registry_config_content(
            Path::new("/repo/.skiff/registry/storage"),
            "127.0.0.1:5000".parse().unwrap(),
        );
        assert!(
            conf.contains("rootdirectory: /repo/.skiff/registry/storage\n"),
            "{conf}"
        );
        assert!(conf.contains("addr: 127.0.0.1:5000\n"), "{conf}");
    }

    #[test]
    fn nodes_get_their_own_netns_cidr_and_state() {
        let plans = node_plans(2, Path::new("/repo"));
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[1].name, "node-2");
        assert_eq!(plans[1].netns, "skiff-up-node-2");
        assert_eq!(plans[1].pod_cidr, "10.244.2.0/24");
        assert_eq!(plans[1].state_dir, Path::new("/repo/.skiff/nodes/node-2"));
        let cfg = UpConfig::from_args(&args(None, None), Path::new("/repo"), Path::new("/cwd"));
        let a = node_args(&cfg, &plans[0], &NodeCredentials::Kubeconfig);
        assert_eq!(a[0], "run");
        let j = node_args(
            &cfg,
            &plans[0],
            &NodeCredentials::Join {
                ca_cert_hash: "sha256:ab".into(),
            },
        );
        let jpos = |flag: &str| j.iter().position(|x| x == flag).unwrap() + 1;
        assert_eq!(j[0], "join");
        assert_eq!(j[jpos("--server")], "https://127.0.0.1:7443");
        assert_eq!(j[jpos("--ca-cert-hash")], "sha256:ab");
        assert!(
            !j.iter().any(|x| x == "--token"),
            "the token goes by environment"
        );
        assert_eq!(
            parse_join_command(
                "skiff-node join --server https://h:1 --token a.b --ca-cert-hash sha256:c\n"
            )
            .unwrap(),
            ("a.b".to_string(), "sha256:c".to_string())
        );
        let pos = |flag: &str| a.iter().position(|x| x == flag).unwrap() + 1;
        assert_eq!(a[pos("--node-netns")], "/run/netns/skiff-up-node-1");
        assert_eq!(
            a[pos("--kubeconfig")],
            "/repo/.skiff/nodes/node-1/kubeconfig"
        );
        let k = node_kubeconfig_args(&cfg, &plans[0]);
        let kpos = |flag: &str| k.iter().position(|x| x == flag).unwrap() + 1;
        assert_eq!(k[kpos("--user")], "system:node:node-1");
        assert_eq!(k[kpos("--group")], "system:nodes");
        assert_eq!(k[kpos("--server")], "https://127.0.0.1:7443");
        assert_eq!(k[kpos("--pki-dir")], "/repo/.skiff/pki");
        assert_eq!(
            node_plans(MAX_NODES + 5, Path::new("/r")).len(),
            MAX_NODES as usize
        );
    }

    #[test]
    fn embedded_store_defaults_under_repo() {
        let cfg = UpConfig::from_args(&args(None, None), Path::new("/repo"), Path::new("/cwd"));
        assert_eq!(
            apiserver_args(&cfg, 0),
            [
                "--listen",
                "127.0.0.1:7443",
                "--pki-dir",
                "/repo/.skiff/pki",
                "--store",
                "embedded",
                "--data-dir",
                "/repo/.skiff/data"
            ]
        );
    }

    #[test]
    fn relative_data_dir_is_from_cwd() {
        let cfg = UpConfig::from_args(
            &args(None, Some("d")),
            Path::new("/repo"),
            Path::new("/cwd"),
        );
        assert_eq!(
            cfg.store,
            Store::Embedded {
                data_dir: "/cwd/d".into()
            }
        );
        let cfg = UpConfig::from_args(
            &args(None, Some("/abs")),
            Path::new("/repo"),
            Path::new("/cwd"),
        );
        assert_eq!(
            cfg.store,
            Store::Embedded {
                data_dir: "/abs".into()
            }
        );
    }

    #[test]
    fn etcd_store_args() {
        let cfg = UpConfig::from_args(
            &args(Some("http://127.0.0.1:2379"), Some("ignored")),
            Path::new("/repo"),
            Path::new("/cwd"),
        );
        assert_eq!(
            apiserver_args(&cfg, 0),
            [
                "--listen",
                "127.0.0.1:7443",
                "--pki-dir",
                "/repo/.skiff/pki",
                "--store",
                "etcd",
                "--etcd-endpoints",
                "http://127.0.0.1:2379"
            ]
        );
        // An etcd with TLS: the files go to the API server, relative ones from the cwd.
        let mut a = args(Some("https://10.0.0.5:2379"), None);
        a.etcd_cafile = Some("etcd/ca.crt".into());
        a.etcd_certfile = Some("/abs/client.crt".into());
        a.etcd_keyfile = Some("etcd/client.key".into());
        let cfg = UpConfig::from_args(&a, Path::new("/repo"), Path::new("/cwd"));
        assert_eq!(
            apiserver_args(&cfg, 0)[6..],
            [
                "--etcd-endpoints",
                "https://10.0.0.5:2379",
                "--etcd-cafile",
                "/cwd/etcd/ca.crt",
                "--etcd-certfile",
                "/abs/client.crt",
                "--etcd-keyfile",
                "/cwd/etcd/client.key"
            ]
        );
    }

    #[test]
    fn server_url_maps_wildcards_to_loopback() {
        let mut cfg = UpConfig::from_args(&args(None, None), Path::new("/r"), Path::new("/r"));
        assert_eq!(cfg.server_url(), "https://127.0.0.1:7443");
        cfg.listen = "0.0.0.0:8000".parse().unwrap();
        assert_eq!(cfg.server_url(), "https://127.0.0.1:8000");
        cfg.listen = "[::]:8000".parse().unwrap();
        assert_eq!(cfg.server_url(), "https://[::1]:8000");
        cfg.listen = "10.1.2.3:9".parse().unwrap();
        assert_eq!(cfg.server_url(), "https://10.1.2.3:9");
    }

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
            kubeconfig_path(Path::new("/src/skiff")),
            PathBuf::from("/src/skiff/.skiff/kubeconfig")
        );
    }

    #[test]
    fn component_list_shape() {
        assert_eq!(COMPONENTS[0].name, "apiserver");
        assert_eq!(COMPONENTS[0].bin, "skiff-apiserver");
        assert!(COMPONENTS[0].required);
        assert_eq!(COMPONENTS[0].readiness, Readiness::ApiPort);
        let mut names: Vec<_> = COMPONENTS.iter().map(|c| c.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), COMPONENTS.len());
        assert!(COMPONENTS[1..].iter().all(|c| !c.required));
    }

    fn ws(bins: &[(&str, &[&str])]) -> Workspace {
        Workspace {
            target_dir: "/repo/target".into(),
            bins: bins
                .iter()
                .map(|(p, b)| (p.to_string(), b.iter().map(|s| s.to_string()).collect()))
                .collect(),
        }
    }

    #[test]
    fn only_existing_binaries_are_started() {
        let w = ws(&[
            ("skiff-apiserver", &["skiff-apiserver"]),
            ("skiff-cli", &["skiff"]),
        ]);
        let (start, skipped) = select_components(COMPONENTS, &w).unwrap();
        assert_eq!(
            start.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["apiserver"]
        );
        assert_eq!(skipped.len(), COMPONENTS.len() - 1);
        assert_eq!(w.cli_bin(), Some("skiff"));

        let w = ws(&[
            ("skiff-apiserver", &["skiff-apiserver"]),
            ("skiff-scheduler", &["skiff-scheduler"]),
        ]);
        let (start, _) = select_components(COMPONENTS, &w).unwrap();
        assert_eq!(
            start.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["apiserver", "scheduler"]
        );
        assert_eq!(w.cli_bin(), None);
    }

    #[test]
    fn missing_apiserver_binary_is_a_clear_error() {
        let err = select_components(COMPONENTS, &ws(&[("skiff-apiserver", &[])]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no `skiff-apiserver` binary target"), "{err}");
        let err = select_components(COMPONENTS, &ws(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not in the workspace"), "{err}");
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

    #[test]
    fn restart_back_off_doubles_and_starts_over_after_a_good_run() {
        let t0 = Instant::now();
        let mut r = Restarts::default();
        r.started(t0);
        assert_eq!(
            r.exited(t0 + Duration::from_secs(2)),
            Duration::from_secs(1)
        );
        r.started(t0 + Duration::from_secs(3));
        assert_eq!(
            r.exited(t0 + Duration::from_secs(4)),
            Duration::from_secs(2)
        );
        r.started(t0 + Duration::from_secs(6));
        assert_eq!(
            r.exited(t0 + Duration::from_secs(7)),
            Duration::from_secs(4)
        );
        for _ in 0..10 {
            r.exited(t0 + Duration::from_secs(8));
        }
        assert_eq!(r.delay, RESTART_MAX);
        // A minute of running: the next crash waits one second again.
        r.started(t0 + Duration::from_secs(10));
        assert_eq!(r.exited(t0 + Duration::from_secs(75)), RESTART_FIRST);
    }

    /// Real processes: one killed with SIGKILL is started again (new pid, same command, its
    /// log appended), the other keeps running untouched.
    #[tokio::test]
    async fn a_killed_component_is_restarted_and_the_others_keep_running() {
        let dir = std::env::temp_dir().join(format!("skiff-up-restart-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let start = |name: &str| {
            spawn_process(
                &dir,
                Path::new("/bin/sh"),
                name.into(),
                &["-c".into(), format!("echo {name} up; exec sleep 60")],
                &[],
                &dir.join(format!("{name}.log")),
                false,
            )
            .unwrap()
        };
        let mut running = vec![start("victim"), start("bystander")];
        let (victim, bystander) = (running[0].pid, running[1].pid);
        // The first run has spoken before it is killed (else its line would be missing).
        let log = dir.join("victim.log");
        let deadline = Instant::now() + Duration::from_secs(20);
        while fs::read_to_string(&log).unwrap_or_default() != "victim up\n"
            && Instant::now() < deadline
        {
            tokio::time::sleep(POLL).await;
        }
        // SIGKILL to the pid this test started (not reaped yet, so not reused).
        let killed = Command::new("kill")
            .args(["-9", &victim.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        while running[0].restarts.count == 0 && Instant::now() < deadline {
            restart_crashed(&mut running).unwrap();
            tokio::time::sleep(POLL).await;
        }
        assert_eq!(running[0].restarts.count, 1, "not restarted");
        assert_ne!(running[0].pid, victim);
        assert_eq!(running[1].pid, bystander);
        assert!(
            matches!(running[1].child.try_wait(), Ok(None)),
            "bystander stopped"
        );
        // Both runs are in the log (a loaded machine may take a while to start `sh`).
        let deadline = Instant::now() + Duration::from_secs(20);
        while fs::read_to_string(&log).unwrap_or_default() != "victim up\nvictim up\n"
            && Instant::now() < deadline
        {
            tokio::time::sleep(POLL).await;
        }
        assert_eq!(fs::read_to_string(&log).unwrap(), "victim up\nvictim up\n");
        for r in &mut running {
            let _ = r.child.start_kill();
            let _ = r.child.wait().await;
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
