//! How each Skiff component is launched: one typed struct per binary (or subcommand) with the
//! options its launchers set, and `args()` giving the exact command line the binary takes.
//!
//! `cargo xtask up` (processes on this machine), `cargo xtask install` (the `ExecStart` lines
//! of `deploy/systemd/`) and the end-to-end harness (`tests/src`, `skiff_store::testutil`)
//! all build their command lines here, so a flag is spelled once. Each struct mirrors the
//! clap definition in the binary's `main.rs` (`control/apiserver`, `control/scheduler`,
//! `control/controllers`, `node/agent`) or etcd's documented flags; options a launcher does
//! not set are left to the binary's defaults. Flags only a test needs go in `extra`, after
//! the typed ones.
//!
//! [`python`] is the one place that says where the end-to-end tests' Python venv lives and
//! which packages it pins, for `cargo xtask setup`, `cargo xtask doctor` and the harness.
//!
//! std only: xtask builds this before `cargo xtask setup` has installed anything.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub mod python;

/// A command line being built.
#[derive(Debug, Default)]
struct Line(Vec<OsString>);

impl Line {
    fn word(&mut self, w: impl Into<OsString>) -> &mut Self {
        self.0.push(w.into());
        self
    }

    /// `--flag value`.
    fn pair(&mut self, flag: &str, value: impl Into<OsString>) -> &mut Self {
        self.word(flag).word(value)
    }

    /// `--flag value` when there is a value.
    fn opt<V: Into<OsString>>(&mut self, flag: &str, value: Option<V>) -> &mut Self {
        if let Some(v) = value {
            self.pair(flag, v);
        }
        self
    }

    /// `--flag=value`, the form etcd's documentation uses.
    fn eq(&mut self, flag: &str, value: impl Into<OsString>) -> &mut Self {
        let mut w = OsString::from(flag);
        w.push("=");
        w.push(value.into());
        self.word(w)
    }

    fn extra(&mut self, extra: &[OsString]) -> Vec<OsString> {
        self.0.extend(extra.iter().cloned());
        std::mem::take(&mut self.0)
    }
}

/// A duration as `skiff-node` parses it (`500ms`, `8s`).
fn node_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Where the API server keeps the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiStore {
    /// `--store embedded --data-dir DIR`.
    Embedded { data_dir: PathBuf },
    /// `--store etcd --etcd-endpoints URL[,URL]`, with TLS files when given.
    Etcd {
        endpoints: String,
        tls: Option<EtcdClientTls>,
    },
}

/// The API server's TLS to etcd: `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdClientTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `skiff-apiserver` (serving).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServerFlags {
    pub listen: SocketAddr,
    /// Made on first start: CA, serving certificate, component kubeconfigs.
    pub pki_dir: PathBuf,
    pub store: ApiStore,
    /// `--tls-san`: more names or addresses for the serving certificate, comma separated.
    pub tls_sans: Option<String>,
    pub extra: Vec<OsString>,
}

impl ApiServerFlags {
    pub fn args(&self) -> Vec<OsString> {
        let mut l = Line::default();
        l.pair("--listen", self.listen.to_string())
            .pair("--pki-dir", &self.pki_dir);
        match &self.store {
            ApiStore::Embedded { data_dir } => {
                l.pair("--store", "embedded").pair("--data-dir", data_dir);
            }
            ApiStore::Etcd { endpoints, tls } => {
                l.pair("--store", "etcd")
                    .pair("--etcd-endpoints", endpoints);
                if let Some(t) = tls {
                    l.pair("--etcd-cafile", &t.ca)
                        .pair("--etcd-certfile", &t.cert)
                        .pair("--etcd-keyfile", &t.key);
                }
            }
        }
        l.opt("--tls-san", self.tls_sans.as_ref());
        // The front proxy's client certificate towards aggregated API servers, which the
        // server's first start makes in its PKI directory.
        l.pair(
            "--proxy-client-cert-file",
            self.pki_dir.join("front-proxy-client.crt"),
        )
        .pair(
            "--proxy-client-key-file",
            self.pki_dir.join("front-proxy-client.key"),
        )
        .pair(
            "--requestheader-client-ca-file",
            self.pki_dir.join("front-proxy-ca.crt"),
        )
        .pair("--requestheader-allowed-names", "front-proxy-client");
        l.extra(&self.extra)
    }
}

/// `skiff-apiserver kubeconfig`: a kubeconfig with a client certificate of the cluster CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeconfigFlags {
    pub pki_dir: PathBuf,
    pub user: String,
    pub groups: Vec<String>,
    /// The API server URL, or several comma separated.
    pub server: String,
    pub out: PathBuf,
}

impl KubeconfigFlags {
    pub fn args(&self) -> Vec<OsString> {
        let mut l = Line::default();
        l.word("kubeconfig")
            .pair("--pki-dir", &self.pki_dir)
            .pair("--user", &self.user);
        for g in &self.groups {
            l.pair("--group", g);
        }
        l.pair("--server", &self.server).pair("--out", &self.out);
        l.extra(&[])
    }
}

/// `skiff-apiserver etcd-certs`: an etcd CA, a certificate per member and the API server's
/// client certificate, made once in `dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdCertsFlags {
    pub dir: PathBuf,
    pub members: Vec<String>,
    /// Names and addresses the members' certificates are valid for (`--san`; the tool's
    /// default, loopback, when empty).
    pub sans: Vec<String>,
}

impl EtcdCertsFlags {
    pub fn args(&self) -> Vec<OsString> {
        let mut l = Line::default();
        l.word("etcd-certs").pair("--dir", &self.dir);
        for m in &self.members {
            l.pair("--member", m);
        }
        if !self.sans.is_empty() {
            l.pair("--san", self.sans.join(","));
        }
        l.extra(&[])
    }
}

/// `skiff-vip`: holds the API servers' virtual address on one healthy control machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipFlags {
    pub kubeconfig: PathBuf,
    /// `--server`: the API servers to fail over between.
    pub server: String,
    /// `IP/PREFIX`.
    pub address: String,
    pub interface: String,
    /// This machine's API server, `host:port`.
    pub health: String,
    pub identity: String,
    pub lease_duration_seconds: u64,
}

impl VipFlags {
    pub fn args(&self) -> Vec<OsString> {
        let mut l = Line::default();
        l.pair("--kubeconfig", &self.kubeconfig)
            .pair("--server", &self.server)
            .pair("--address", &self.address)
            .pair("--interface", &self.interface)
            .pair("--health", &self.health)
            .pair("--identity", &self.identity)
            .pair("--lease-duration", self.lease_duration_seconds.to_string());
        l.extra(&[])
    }
}

/// What the scheduler and the controller manager share: the API servers to fail over
/// between (else the kubeconfig's) and leader election.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Election {
    /// `--server`: API server URLs, comma separated.
    pub server: Option<String>,
    /// `--lease-duration`, in seconds.
    pub lease_duration: Option<u64>,
    /// `--identity`: this instance's name in leader election.
    pub identity: Option<String>,
}

impl Election {
    fn push(&self, l: &mut Line) {
        l.opt("--server", self.server.as_ref())
            .opt(
                "--lease-duration",
                self.lease_duration.map(|s| s.to_string()),
            )
            .opt("--identity", self.identity.as_ref());
    }
}

/// `skiff-scheduler`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerFlags {
    pub kubeconfig: PathBuf,
    pub election: Election,
    pub extra: Vec<OsString>,
}

impl SchedulerFlags {
    pub fn args(&self) -> Vec<OsString> {
        let mut l = Line::default();
        l.pair("--kubeconfig", &self.kubeconfig);
        self.election.push(&mut l);
        l.extra(&self.extra)
    }
}

/// The CA the controller manager signs approved certificate requests with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningCa {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `skiff-controller-manager`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerManagerFlags {
    pub kubeconfig: PathBuf,
    /// `--cluster-signing-cert-file` and `--cluster-signing-key-file`.
    pub signing: Option<SigningCa>,
    /// `--local-path-root`: where the default StorageClass' volumes live on nodes.
    pub local_path_root: Option<PathBuf>,
    pub election: Election,
    pub extra: Vec<OsString>,
}

impl ControllerManagerFlags {
    pub fn args(&self) -> Vec<OsString> {
        let mut l = Line::default();
        l.pair("--kubeconfig", &self.kubeconfig);
        if let Some(ca) = &self.signing {
            l.pair("--cluster-signing-cert-file", &ca.cert)
                .pair("--cluster-signing-key-file", &ca.key);
        }
        l.opt("--local-path-root", self.local_path_root.as_ref());
        self.election.push(&mut l);
        l.extra(&self.extra)
    }
}

/// How `skiff-node` starts: with the kubeconfig it has, or joining with a bootstrap token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeMode {
    /// `skiff-node run`; `server`: API server URLs to fail over between (else the
    /// kubeconfig's).
    Run { server: Option<String> },
    /// `skiff-node join` through one API server. The token goes in the environment
    /// (`SKIFF_JOIN_TOKEN`), never on the command line.
    Join {
        server: String,
        ca_cert_hash: String,
        join_timeout: Option<Duration>,
    },
}

/// `skiff-node run` or `skiff-node join`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFlags {
    pub mode: NodeMode,
    /// The agent's kubeconfig (written by a join).
    pub kubeconfig: PathBuf,
    pub node_name: String,
    pub state_dir: PathBuf,
    /// The network namespace holding the node's own network (`/run/netns/NAME`).
    pub node_netns: Option<PathBuf>,
    /// Where the agent API listens (`None`: the node's InternalIP); loopback for agents that
    /// share the API server's machine.
    pub address: Option<std::net::IpAddr>,
    /// The agent API's port (`None`: 10250; 0: a free one).
    pub port: Option<u16>,
    pub pod_cidr: Option<String>,
    /// `k=v,k2=v2`.
    pub node_labels: Option<String>,
    pub cgroup_parent: Option<PathBuf>,
    pub backoff: Option<Duration>,
    pub lease_duration: Option<Duration>,
    pub extra: Vec<OsString>,
}

impl NodeFlags {
    /// Flags of a node with only the required settings (and `skiff-node`'s defaults).
    pub fn new(mode: NodeMode, kubeconfig: PathBuf, node_name: String, state_dir: PathBuf) -> Self {
        NodeFlags {
            mode,
            kubeconfig,
            node_name,
            state_dir,
            node_netns: None,
            address: None,
            port: None,
            pod_cidr: None,
            node_labels: None,
            cgroup_parent: None,
            backoff: None,
            lease_duration: None,
            extra: Vec::new(),
        }
    }

    pub fn args(&self) -> Vec<OsString> {
        let mut l = Line::default();
        match &self.mode {
            NodeMode::Run { .. } => {
                l.word("run");
            }
            NodeMode::Join {
                server,
                ca_cert_hash,
                join_timeout,
            } => {
                l.word("join")
                    .pair("--server", server)
                    .pair("--ca-cert-hash", ca_cert_hash)
                    .opt("--join-timeout", join_timeout.map(node_duration));
            }
        }
        l.pair("--kubeconfig", &self.kubeconfig)
            .pair("--node-name", &self.node_name)
            .pair("--state-dir", &self.state_dir)
            .opt("--node-netns", self.node_netns.as_ref())
            .opt("--address", self.address.map(|a| a.to_string()))
            .opt("--port", self.port.map(|p| p.to_string()))
            .opt("--pod-cidr", self.pod_cidr.as_ref())
            .opt("--node-labels", self.node_labels.as_ref())
            .opt("--cgroup-parent", self.cgroup_parent.as_ref())
            .opt("--backoff", self.backoff.map(node_duration))
            .opt("--lease-duration", self.lease_duration.map(node_duration));
        if let NodeMode::Run { server } = &self.mode {
            l.opt("--server", server.as_ref());
        }
        l.extra(&self.extra)
    }
}

/// `skiff-node purge`: removes everything a node ran (pods, cgroups, BPF pins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePurgeFlags {
    pub node_name: String,
    pub state_dir: PathBuf,
}

impl NodePurgeFlags {
    pub fn args(&self) -> Vec<OsString> {
        let mut l = Line::default();
        l.word("purge")
            .pair("--node-name", &self.node_name)
            .pair("--state-dir", &self.state_dir);
        l.extra(&[])
    }
}

/// TLS of an etcd member: its certificate for clients and peers, and the CA both must
/// present certificates of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMemberTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// One `etcd` member of a new cluster (an existing data directory keeps its cluster; the
/// initial flags only matter on first start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdFlags {
    pub name: String,
    pub data_dir: PathBuf,
    /// Listened on and advertised to clients.
    pub client_url: String,
    /// Listened on and advertised to peers.
    pub peer_url: String,
    /// `name=peer-url,...` of every member.
    pub initial_cluster: String,
    pub initial_cluster_token: String,
    pub tls: Option<EtcdMemberTls>,
    /// `--logger=zap --log-outputs=stderr`.
    pub log_to_stderr: bool,
}

impl EtcdFlags {
    pub fn args(&self) -> Vec<OsString> {
        let mut l = Line::default();
        l.eq("--name", &self.name)
            .eq("--data-dir", &self.data_dir)
            .eq("--listen-client-urls", &self.client_url)
            .eq("--advertise-client-urls", &self.client_url)
            .eq("--listen-peer-urls", &self.peer_url)
            .eq("--initial-advertise-peer-urls", &self.peer_url)
            .eq("--initial-cluster", &self.initial_cluster)
            .eq("--initial-cluster-state", "new")
            .eq("--initial-cluster-token", &self.initial_cluster_token);
        if self.log_to_stderr {
            l.eq("--logger", "zap").eq("--log-outputs", "stderr");
        }
        if let Some(t) = &self.tls {
            // Clients and peers speak TLS and must present a certificate of the CA.
            l.eq("--cert-file", &t.cert)
                .eq("--key-file", &t.key)
                .eq("--trusted-ca-file", &t.ca)
                .word("--client-cert-auth")
                .eq("--peer-cert-file", &t.cert)
                .eq("--peer-key-file", &t.key)
                .eq("--peer-trusted-ca-file", &t.ca)
                .word("--peer-client-cert-auth");
        }
        l.extra(&[])
    }
}

/// `args` as one line for messages and unit files (words joined by spaces, lossily).
pub fn display(args: &[OsString]) -> String {
    args.iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `args` grouped as a unit file lays them out: a subcommand alone, each flag with its value.
pub fn grouped(args: &[OsString]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut open = false;
    for a in args.iter().map(|a| a.to_string_lossy()) {
        match lines.last_mut() {
            Some(last) if open && !a.starts_with("--") => {
                last.push(' ');
                last.push_str(&a);
                open = false;
            }
            _ => {
                open = a.starts_with("--") && !a.contains('=');
                lines.push(a.into_owned());
            }
        }
    }
    lines
}

#[cfg(test)]
mod tests;
