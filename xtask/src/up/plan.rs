//! What `up` starts: the resolved settings ([`UpConfig`]), the control-plane components as
//! data ([`COMPONENTS`]) with each instance's command line, the `--ha` etcd members and the
//! node agents ([`NodePlan`]). Command lines come from `skiff_flags`, the one place each
//! binary's flags are spelled.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use skiff_flags::{
    ApiServerFlags, ApiStore, ControllerManagerFlags, Election, EtcdCertsFlags, EtcdClientTls,
    EtcdFlags, EtcdMemberTls, KubeconfigFlags, NodeFlags, NodeMode, SchedulerFlags, SigningCa,
    VipFlags,
};

use super::UpArgs;
use super::files::Workspace;
use skiff_testnet::FABRIC_PREFIX;

/// Members of the `--ha` etcd cluster and API servers (and schedulers, controller managers).
pub const HA_REPLICAS: u16 = 3;
/// The `--ha` etcd members' client ports (peer port: the next one).
pub const HA_ETCD_CLIENT_PORTS: [u16; HA_REPLICAS as usize] = [2379, 2381, 2383];
/// The port an API server on the control machine listens on.
pub const MACHINE_API_PORT: u16 = 6443;
/// Most nodes `up` will start (their pod CIDRs are 10.244.1.0/24 ..= 10.244.200.0/24).
pub const MAX_NODES: u32 = 200;

/// The `--ha` etcd members' PKI (an etcd CA of its own, made by `skiff-apiserver
/// etcd-certs` before the members start).
pub fn etcd_pki_dir(state: &Path) -> PathBuf {
    state.join("pki").join("etcd")
}

/// Resolved settings shared by every component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpConfig {
    pub listen: SocketAddr,
    /// The cluster's PKI, made by the API server on first start (`<repo>/.skiff/pki`).
    pub pki_dir: PathBuf,
    /// The store, with TLS to etcd (`--ha`'s own PKI, or the files given with --etcd).
    pub store: ApiStore,
    pub nodes: u32,
    /// The local registry's address, if one is started.
    pub registry: Option<SocketAddr>,
    /// `--ha`: three of everything in the control plane.
    pub ha: bool,
    /// Machines that share only a network: the control plane runs on `control` machines
    /// (namespaces of their own) at these fabric addresses (one, or three with `--ha`), each
    /// agent inside its node's namespace; the host reaches the API server through a
    /// forwarder on `listen`. Empty: everything on the host.
    pub controls: Vec<IpAddr>,
    /// `--ha` on machines: the API servers' virtual registration address, held by one
    /// control machine at a time (`skiff-vip`).
    pub vip: Option<IpAddr>,
}

impl UpConfig {
    pub fn from_args(args: &UpArgs, state: &Path, cwd: &Path) -> Self {
        let from_cwd = |p: &PathBuf| {
            if p.is_absolute() {
                p.clone()
            } else {
                cwd.join(p)
            }
        };
        let store = if args.ha {
            let dir = etcd_pki_dir(state);
            ApiStore::Etcd {
                endpoints: HA_ETCD_CLIENT_PORTS
                    .iter()
                    .map(|p| format!("https://127.0.0.1:{p}"))
                    .collect::<Vec<_>>()
                    .join(","),
                tls: Some(EtcdClientTls {
                    ca: dir.join("ca.crt"),
                    cert: dir.join("apiserver-etcd-client.crt"),
                    key: dir.join("apiserver-etcd-client.key"),
                }),
            }
        } else if let Some(url) = &args.etcd {
            let tls = match (&args.etcd_cafile, &args.etcd_certfile, &args.etcd_keyfile) {
                (Some(ca), Some(cert), Some(key)) => Some(EtcdClientTls {
                    ca: from_cwd(ca),
                    cert: from_cwd(cert),
                    key: from_cwd(key),
                }),
                _ => None,
            };
            ApiStore::Etcd {
                endpoints: url.clone(),
                tls,
            }
        } else {
            ApiStore::Embedded {
                data_dir: match &args.data_dir {
                    Some(d) => from_cwd(d),
                    None => state.join("data"),
                },
            }
        };
        UpConfig {
            listen: args.listen,
            pki_dir: state.join("pki"),
            store,
            nodes: args.nodes,
            registry: (args.registry_port != 0)
                .then(|| SocketAddr::from((Ipv4Addr::LOCALHOST, args.registry_port))),
            ha: args.ha,
            controls: Vec::new(),
            vip: None,
        }
    }

    /// Puts the control plane on machines at `controls` (one per instance), with the
    /// virtual address `vip` when there are several; etcd members go on the machines too.
    pub fn on_machines(&mut self, controls: Vec<IpAddr>, vip: Option<IpAddr>) {
        if self.ha {
            let dir = match &self.store {
                ApiStore::Etcd { tls, .. } => tls.clone(),
                ApiStore::Embedded { .. } => None,
            };
            self.store = ApiStore::Etcd {
                endpoints: controls
                    .iter()
                    .map(|ip| format!("https://{}", SocketAddr::new(*ip, HA_ETCD_CLIENT_PORTS[0])))
                    .collect::<Vec<_>>()
                    .join(","),
                tls: dir,
            };
        }
        self.controls = controls;
        self.vip = vip;
    }

    /// The store API server `i` uses. With `--ha` on machines, only its own machine's etcd
    /// member (the stacked topology, as kubeadm sets it up): a machine cut off from the
    /// others takes only its own API server down with its member, while the other servers
    /// keep a quorum through theirs instead of waiting on a connection to the lost one.
    pub fn store_of(&self, i: u16) -> ApiStore {
        match (&self.store, self.controls.get(usize::from(i))) {
            (ApiStore::Etcd { tls, .. }, Some(own)) if self.ha => ApiStore::Etcd {
                endpoints: format!("https://{}", SocketAddr::new(*own, HA_ETCD_CLIENT_PORTS[0])),
                tls: tls.clone(),
            },
            (store, _) => store.clone(),
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

    /// Where API server `i` itself listens: on its control machine (on every address of
    /// it when there is a virtual address to serve too), or (all on the host)
    /// [`UpConfig::listen_of`].
    pub fn api_listen(&self, i: u16) -> SocketAddr {
        match (self.controls.get(usize::from(i)), self.vip) {
            (Some(_), Some(_)) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, MACHINE_API_PORT)),
            (Some(ip), None) => SocketAddr::new(*ip, MACHINE_API_PORT),
            (None, _) => self.listen_of(i),
        }
    }

    /// Where API server `i` is reached from inside the cluster (its machine's address).
    pub fn api_addr(&self, i: u16) -> SocketAddr {
        match self.controls.get(usize::from(i)) {
            Some(ip) => SocketAddr::new(*ip, MACHINE_API_PORT),
            None => connect_addr(self.listen_of(i)),
        }
    }

    /// The registration URL: what agents join and the host's forwarder reach (the virtual
    /// address, else the first API server).
    pub fn server_url(&self) -> String {
        match self.vip {
            Some(vip) => format!("https://{}", SocketAddr::new(vip, MACHINE_API_PORT)),
            None => format!("https://{}", self.api_addr(0)),
        }
    }

    /// Every API server's URL as the cluster's processes reach them, comma separated (what
    /// Skiff's clients fail over between).
    pub fn server_urls(&self) -> String {
        self.server_urls_from(0)
    }

    /// [`Self::server_urls`] starting with API server `own`, then the others: what the
    /// components of control machine `own` use, so that each talks to its own machine's
    /// server (as kubeadm's do) and fails over to the others only when it is down. A
    /// machine cut off from the network then takes only its own components' server away.
    pub fn server_urls_from(&self, own: u16) -> String {
        let n = self.instances();
        (0..n)
            .map(|k| format!("https://{}", self.api_addr((own % n + k) % n)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The URLs agents are given: the virtual address when there is one (it survives the
    /// loss of any server), else every server.
    pub fn node_urls(&self) -> String {
        match self.vip {
            Some(_) => self.server_url(),
            None => self.server_urls(),
        }
    }

    /// Every API server's URL as the host reaches them: through the one forwarder when the
    /// control plane is on machines, else each --listen port.
    pub fn host_urls(&self) -> String {
        let n = if self.controls.is_empty() {
            self.instances()
        } else {
            1
        };
        (0..n)
            .map(|i| format!("https://{}", connect_addr(self.listen_of(i))))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The kubeconfig the API server wrote for `who` (`admin`, `scheduler`,
    /// `controller-manager`).
    pub fn kubeconfig(&self, who: &str) -> PathBuf {
        self.pki_dir.join(format!("{who}.kubeconfig"))
    }

    /// `skiff-apiserver kubeconfig` writing a certificate of the cluster CA for `user` in
    /// `group`, listing every API server, to `out`.
    pub fn kubeconfig_args(
        &self,
        user: &str,
        group: &str,
        out: &Path,
        server: String,
    ) -> Vec<OsString> {
        KubeconfigFlags {
            pki_dir: self.pki_dir.clone(),
            user: user.into(),
            groups: vec![group.into()],
            server,
            out: out.to_path_buf(),
        }
        .args()
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
    pub args: fn(&UpConfig, u16) -> Vec<OsString>,
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

pub fn apiserver_args(cfg: &UpConfig, i: u16) -> Vec<OsString> {
    // Serving the virtual address too: the server advertises its machine's own and its
    // certificate names both.
    let (tls_sans, extra) = match (cfg.vip, cfg.controls.get(usize::from(i))) {
        (Some(vip), Some(own)) => (
            Some(vip.to_string()),
            vec!["--advertise-address".into(), own.to_string().into()],
        ),
        _ => (None, Vec::new()),
    };
    ApiServerFlags {
        listen: cfg.api_listen(i),
        pki_dir: cfg.pki_dir.clone(),
        store: cfg.store_of(i),
        tls_sans,
        extra,
    }
    .args()
}

/// `skiff-vip` on control machine `i`: holds the virtual address while its API server
/// answers.
pub fn vip_args(cfg: &UpConfig, i: u16) -> Option<Vec<OsString>> {
    let vip = cfg.vip?;
    Some(
        VipFlags {
            kubeconfig: cfg.kubeconfig("vip"),
            server: cfg.server_urls_from(i),
            address: format!("{vip}/24"),
            interface: "eth0".into(),
            health: cfg.api_addr(i).to_string(),
            identity: format!("control-{}", i + 1),
            lease_duration_seconds: 1,
        }
        .args(),
    )
}

/// With `--ha`, instance `i` of a leader-electing component lists every API server, its own
/// machine's first, and has its own identity.
fn election(cfg: &UpConfig, name: &str, i: u16) -> Election {
    if !cfg.ha {
        return Election::default();
    }
    Election {
        server: Some(cfg.server_urls_from(i)),
        lease_duration: None,
        identity: Some(format!("{name}-{}", i + 1)),
    }
}

/// The scheduler runs as `system:kube-scheduler` with the kubeconfig the API server wrote.
pub fn scheduler_args(cfg: &UpConfig, i: u16) -> Vec<OsString> {
    SchedulerFlags {
        kubeconfig: cfg.kubeconfig("scheduler"),
        election: election(cfg, "scheduler", i),
        extra: Vec::new(),
    }
    .args()
}

/// The controller manager runs as `system:kube-controller-manager` and signs approved
/// certificate requests (nodes joining with `skiff-node join`) with the cluster CA.
pub fn controller_manager_args(cfg: &UpConfig, i: u16) -> Vec<OsString> {
    ControllerManagerFlags {
        kubeconfig: cfg.kubeconfig("controller-manager"),
        signing: Some(SigningCa {
            cert: cfg.pki_dir.join("ca.crt"),
            key: cfg.pki_dir.join("ca.key"),
        }),
        // The default StorageClass' volumes, in the state directory beside the PKI.
        local_path_root: Some(cfg.pki_dir.with_file_name("local-path")),
        election: election(cfg, "controller-manager", i),
        extra: Vec::new(),
    }
    .args()
}

/// One `--ha` etcd member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMember {
    pub name: String,
    /// Where it listens: loopback, or its control machine's address.
    pub ip: IpAddr,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
}

/// The `--ha` etcd members: on loopback ports of the host, or one on each control machine at
/// `controls` (each machine has its own ports).
pub fn etcd_members(state: &Path, controls: &[IpAddr]) -> Vec<EtcdMember> {
    HA_ETCD_CLIENT_PORTS
        .iter()
        .enumerate()
        .map(|(i, &client)| {
            let name = format!("etcd-{}", i + 1);
            let data_dir = state.join("etcd").join(&name);
            let (ip, client) = match controls.get(i) {
                Some(ip) => (*ip, HA_ETCD_CLIENT_PORTS[0]),
                None => (IpAddr::V4(Ipv4Addr::LOCALHOST), client),
            };
            EtcdMember {
                name,
                ip,
                client_port: client,
                peer_port: client + 1,
                data_dir,
            }
        })
        .collect()
}

/// `etcd` arguments of one `--ha` member: TLS for clients and peers, with certificates of
/// the etcd CA only.
pub fn etcd_args(state: &Path, controls: &[IpAddr], member: &EtcdMember) -> Vec<OsString> {
    let cluster = etcd_members(state, controls)
        .iter()
        .map(|m| format!("{}=https://{}", m.name, SocketAddr::new(m.ip, m.peer_port)))
        .collect::<Vec<_>>()
        .join(",");
    let pki = etcd_pki_dir(state);
    EtcdFlags {
        name: member.name.clone(),
        data_dir: member.data_dir.clone(),
        client_url: format!("https://{}", SocketAddr::new(member.ip, member.client_port)),
        peer_url: format!("https://{}", SocketAddr::new(member.ip, member.peer_port)),
        initial_cluster: cluster,
        initial_cluster_token: "skiff-up-ha".into(),
        tls: Some(EtcdMemberTls {
            cert: pki.join(format!("{}.crt", member.name)),
            key: pki.join(format!("{}.key", member.name)),
            ca: pki.join("ca.crt"),
        }),
        log_to_stderr: false,
    }
    .args()
}

/// `skiff-apiserver etcd-certs` arguments that make (once) the `--ha` etcd PKI: the etcd
/// CA, a certificate per member, the API server's client certificate.
pub fn etcd_certs_args(state: &Path, controls: &[IpAddr]) -> Vec<OsString> {
    let mut sans: Vec<String> = controls.iter().map(ToString::to_string).collect();
    if !sans.is_empty() {
        sans.extend(["127.0.0.1".to_string(), "localhost".to_string()]);
    }
    EtcdCertsFlags {
        dir: etcd_pki_dir(state),
        members: etcd_members(state, controls)
            .into_iter()
            .map(|m| m.name)
            .collect(),
        sans,
    }
    .args()
}

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

/// The nodes `up` starts: `node-1` .. `node-N`.
pub fn node_plans(n: u32, state: &Path) -> Vec<NodePlan> {
    (1..=n.min(MAX_NODES))
        .map(|i| NodePlan {
            name: format!("node-{i}"),
            netns: format!("skiff-up-node-{i}"),
            pod_cidr: format!("10.244.{i}.0/24"),
            state_dir: state.join("nodes").join(format!("node-{i}")),
            node_ip: format!("{FABRIC_PREFIX}.{i}"),
        })
        .collect()
}

/// The kubeconfig of a node's agent (`system:node:<name>` in `system:nodes`).
pub fn node_kubeconfig(node: &NodePlan) -> PathBuf {
    node.state_dir.join("kubeconfig")
}

/// Arguments of `skiff-apiserver kubeconfig` that write a node's kubeconfig.
pub fn node_kubeconfig_args(cfg: &UpConfig, node: &NodePlan) -> Vec<OsString> {
    cfg.kubeconfig_args(
        &format!("system:node:{}", node.name),
        "system:nodes",
        &node_kubeconfig(node),
        cfg.node_urls(),
    )
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
pub fn node_args(cfg: &UpConfig, node: &NodePlan, how: &NodeCredentials) -> Vec<OsString> {
    let mode = match how {
        NodeCredentials::Kubeconfig => NodeMode::Run { server: None },
        NodeCredentials::Join { ca_cert_hash } => NodeMode::Join {
            server: cfg.server_url(),
            ca_cert_hash: ca_cert_hash.clone(),
            join_timeout: None,
        },
    };
    // The agent runs inside its node's namespace (a machine of its own) and serves its API
    // on the node's address (the defaults).
    NodeFlags {
        pod_cidr: Some(node.pod_cidr.clone()),
        ..NodeFlags::new(
            mode,
            node_kubeconfig(node),
            node.name.clone(),
            node.state_dir.clone(),
        )
    }
    .args()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::up::files::{parse_join_command, registry_config_content};

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
            state_dir: None,
            prebuilt: false,
        }
    }

    /// A command line as strings, to compare.
    fn s(v: Vec<OsString>) -> Vec<String> {
        v.into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// `--ha`: three etcd members in one cluster, three API servers on consecutive ports over
    /// all three, the leader-electing components listing every server with their own
    /// identities, node kubeconfigs with every server.
    #[test]
    fn ha_runs_three_of_everything_and_lists_every_server() {
        let mut a = args(None, None);
        a.ha = true;
        let cfg = UpConfig::from_args(&a, Path::new("/repo/.skiff"), Path::new("/"));
        assert_eq!(cfg.instances(), 3);
        let all = "https://127.0.0.1:7443,https://127.0.0.1:7444,https://127.0.0.1:7445";
        assert_eq!(cfg.server_urls(), all);
        let etcd = "https://127.0.0.1:2379,https://127.0.0.1:2381,https://127.0.0.1:2383";
        assert!(
            matches!(&cfg.store, ApiStore::Etcd { endpoints, tls: Some(_) } if endpoints == etcd),
            "{:?}",
            cfg.store
        );
        let api = s(apiserver_args(&cfg, 2));
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
        let sched = s(scheduler_args(&cfg, 1));
        // Every server, its own first.
        assert!(
            sched.windows(2).any(|w| w
                == [
                    "--server",
                    "https://127.0.0.1:7444,https://127.0.0.1:7445,https://127.0.0.1:7443"
                ]),
            "{sched:?}"
        );
        assert!(
            sched.windows(2).any(|w| w == ["--identity", "scheduler-2"]),
            "{sched:?}"
        );
        let cm = s(controller_manager_args(&cfg, 0));
        assert!(
            cm.windows(2)
                .any(|w| w == ["--identity", "controller-manager-1"]),
            "{cm:?}"
        );
        let plans = node_plans(1, Path::new("/repo/.skiff"));
        let k = s(node_kubeconfig_args(&cfg, &plans[0]));
        assert!(k.windows(2).any(|w| w == ["--server", all]), "{k:?}");
        let members = etcd_members(Path::new("/repo/.skiff"), &[]);
        let e = s(etcd_args(Path::new("/repo/.skiff"), &[], &members[1]));
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
            s(etcd_certs_args(Path::new("/repo/.skiff"), &[])),
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
        let one = UpConfig::from_args(&args(None, None), Path::new("/repo/.skiff"), Path::new("/"));
        assert_eq!(one.instances(), 1);
        assert_eq!(one.server_urls(), "https://127.0.0.1:7443");
        assert!(!s(scheduler_args(&one, 0)).contains(&"--server".to_string()));
    }

    #[test]
    fn the_local_registry_listens_on_loopback_and_stores_under_skiff() {
        let cfg = UpConfig::from_args(&args(None, None), Path::new("/repo/.skiff"), Path::new("/"));
        assert_eq!(cfg.registry, Some("127.0.0.1:5000".parse().unwrap()));
        let mut none = args(None, None);
        none.registry_port = 0;
        let cfg = UpConfig::from_args(&none, Path::new("/repo/.skiff"), Path::new("/"));
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

    /// Machines: the API server listens on the control machine's address, the cluster's
    /// processes dial it there, the host through --listen; agents run in their node's
    /// namespace with the default address (the node's) and port, never on loopback.
    #[test]
    fn machines_listen_on_fabric_addresses_and_the_host_uses_the_forwarder() {
        let mut cfg =
            UpConfig::from_args(&args(None, None), Path::new("/repo/.skiff"), Path::new("/"));
        cfg.on_machines(vec!["192.168.100.250".parse().unwrap()], None);
        let api = s(apiserver_args(&cfg, 0));
        assert!(
            api.windows(2)
                .any(|w| w == ["--listen", "192.168.100.250:6443"]),
            "{api:?}"
        );
        assert_eq!(cfg.server_urls(), "https://192.168.100.250:6443");
        assert_eq!(cfg.host_urls(), "https://127.0.0.1:7443");
        let plans = node_plans(1, Path::new("/repo/.skiff"));
        let join = s(node_args(
            &cfg,
            &plans[0],
            &NodeCredentials::Join {
                ca_cert_hash: "sha256:ab".into(),
            },
        ));
        assert!(
            join.windows(2)
                .any(|w| w == ["--server", "https://192.168.100.250:6443"]),
            "{join:?}"
        );
        for flag in ["--node-netns", "--address", "--port"] {
            assert!(!join.iter().any(|a| a == flag), "{flag} in {join:?}");
        }
        let k = s(node_kubeconfig_args(&cfg, &plans[0]));
        assert!(
            k.windows(2)
                .any(|w| w == ["--server", "https://192.168.100.250:6443"]),
            "{k:?}"
        );
    }

    /// `--ha` on machines: three control machines, each with an etcd member on its address
    /// (certificates naming every machine), an API server on every address of its machine
    /// (the virtual one too) advertising its own, a `skiff-vip`; agents use the virtual
    /// address alone.
    #[test]
    fn ha_machines_share_a_virtual_address() {
        let mut a = args(None, None);
        a.ha = true;
        let mut cfg = UpConfig::from_args(&a, Path::new("/repo/.skiff"), Path::new("/"));
        let controls: Vec<IpAddr> = ["192.168.100.251", "192.168.100.252", "192.168.100.253"]
            .iter()
            .map(|ip| ip.parse().unwrap())
            .collect();
        cfg.on_machines(controls.clone(), Some("192.168.100.240".parse().unwrap()));
        let etcd = "https://192.168.100.251:2379,https://192.168.100.252:2379,https://192.168.100.253:2379";
        assert!(
            matches!(&cfg.store, ApiStore::Etcd { endpoints, tls: Some(_) } if endpoints == etcd),
            "{:?}",
            cfg.store
        );
        let api = s(apiserver_args(&cfg, 1));
        for pair in [
            ["--listen", "0.0.0.0:6443"],
            ["--advertise-address", "192.168.100.252"],
            ["--tls-san", "192.168.100.240"],
            // Its own machine's etcd member alone (stacked, as kubeadm).
            ["--etcd-endpoints", "https://192.168.100.252:2379"],
        ] {
            assert!(api.windows(2).any(|w| w == pair), "{pair:?} in {api:?}");
        }
        assert_eq!(cfg.server_url(), "https://192.168.100.240:6443");
        assert_eq!(cfg.node_urls(), "https://192.168.100.240:6443");
        assert_eq!(cfg.host_urls(), "https://127.0.0.1:7443");
        let vip = s(vip_args(&cfg, 2).unwrap());
        for pair in [
            [
                "--server",
                "https://192.168.100.253:6443,https://192.168.100.251:6443,https://192.168.100.252:6443",
            ],
            ["--address", "192.168.100.240/24"],
            ["--health", "192.168.100.253:6443"],
            ["--identity", "control-3"],
        ] {
            assert!(vip.windows(2).any(|w| w == pair), "{pair:?} in {vip:?}");
        }
        let members = etcd_members(Path::new("/repo/.skiff"), &controls);
        let e = s(etcd_args(Path::new("/repo/.skiff"), &controls, &members[0]));
        assert!(
            e.iter()
                .any(|w| w == "--listen-client-urls=https://192.168.100.251:2379"),
            "{e:?}"
        );
        let certs = s(etcd_certs_args(Path::new("/repo/.skiff"), &controls));
        assert!(
            certs.windows(2).any(|w| w
                == [
                    "--san",
                    "192.168.100.251,192.168.100.252,192.168.100.253,127.0.0.1,localhost"
                ]),
            "{certs:?}"
        );
    }

    #[test]
    fn nodes_get_their_own_netns_cidr_and_state() {
        let plans = node_plans(2, Path::new("/repo/.skiff"));
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[1].name, "node-2");
        assert_eq!(plans[1].netns, "skiff-up-node-2");
        assert_eq!(plans[1].pod_cidr, "10.244.2.0/24");
        assert_eq!(plans[1].state_dir, Path::new("/repo/.skiff/nodes/node-2"));
        let cfg = UpConfig::from_args(
            &args(None, None),
            Path::new("/repo/.skiff"),
            Path::new("/cwd"),
        );
        let a = s(node_args(&cfg, &plans[0], &NodeCredentials::Kubeconfig));
        assert_eq!(a[0], "run");
        let j = s(node_args(
            &cfg,
            &plans[0],
            &NodeCredentials::Join {
                ca_cert_hash: "sha256:ab".into(),
            },
        ));
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
        for flag in ["--node-netns", "--address", "--port"] {
            assert!(
                !a.iter().any(|x| x == flag),
                "the agent runs on its machine and serves on the node's address: {a:?}"
            );
        }
        assert_eq!(a[pos("--pod-cidr")], "10.244.1.0/24");
        assert_eq!(
            a[pos("--kubeconfig")],
            "/repo/.skiff/nodes/node-1/kubeconfig"
        );
        let k = s(node_kubeconfig_args(&cfg, &plans[0]));
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
        let cfg = UpConfig::from_args(
            &args(None, None),
            Path::new("/repo/.skiff"),
            Path::new("/cwd"),
        );
        assert_eq!(
            s(apiserver_args(&cfg, 0)),
            [
                "--listen",
                "127.0.0.1:7443",
                "--pki-dir",
                "/repo/.skiff/pki",
                "--store",
                "embedded",
                "--data-dir",
                "/repo/.skiff/data",
                "--proxy-client-cert-file",
                "/repo/.skiff/pki/front-proxy-client.crt",
                "--proxy-client-key-file",
                "/repo/.skiff/pki/front-proxy-client.key",
                "--requestheader-client-ca-file",
                "/repo/.skiff/pki/front-proxy-ca.crt",
                "--requestheader-allowed-names",
                "front-proxy-client"
            ]
        );
    }

    #[test]
    fn relative_data_dir_is_from_cwd() {
        let cfg = UpConfig::from_args(
            &args(None, Some("d")),
            Path::new("/repo/.skiff"),
            Path::new("/cwd"),
        );
        assert_eq!(
            cfg.store,
            ApiStore::Embedded {
                data_dir: "/cwd/d".into()
            }
        );
        let cfg = UpConfig::from_args(
            &args(None, Some("/abs")),
            Path::new("/repo/.skiff"),
            Path::new("/cwd"),
        );
        assert_eq!(
            cfg.store,
            ApiStore::Embedded {
                data_dir: "/abs".into()
            }
        );
    }

    #[test]
    fn etcd_store_args() {
        let cfg = UpConfig::from_args(
            &args(Some("http://127.0.0.1:2379"), Some("ignored")),
            Path::new("/repo/.skiff"),
            Path::new("/cwd"),
        );
        assert_eq!(
            s(apiserver_args(&cfg, 0)),
            [
                "--listen",
                "127.0.0.1:7443",
                "--pki-dir",
                "/repo/.skiff/pki",
                "--store",
                "etcd",
                "--etcd-endpoints",
                "http://127.0.0.1:2379",
                "--proxy-client-cert-file",
                "/repo/.skiff/pki/front-proxy-client.crt",
                "--proxy-client-key-file",
                "/repo/.skiff/pki/front-proxy-client.key",
                "--requestheader-client-ca-file",
                "/repo/.skiff/pki/front-proxy-ca.crt",
                "--requestheader-allowed-names",
                "front-proxy-client"
            ]
        );
        // An etcd with TLS: the files go to the API server, relative ones from the cwd.
        let mut a = args(Some("https://10.0.0.5:2379"), None);
        a.etcd_cafile = Some("etcd/ca.crt".into());
        a.etcd_certfile = Some("/abs/client.crt".into());
        a.etcd_keyfile = Some("etcd/client.key".into());
        let cfg = UpConfig::from_args(&a, Path::new("/repo/.skiff"), Path::new("/cwd"));
        assert_eq!(
            s(apiserver_args(&cfg, 0))[6..],
            [
                "--etcd-endpoints",
                "https://10.0.0.5:2379",
                "--etcd-cafile",
                "/cwd/etcd/ca.crt",
                "--etcd-certfile",
                "/abs/client.crt",
                "--etcd-keyfile",
                "/cwd/etcd/client.key",
                "--proxy-client-cert-file",
                "/repo/.skiff/pki/front-proxy-client.crt",
                "--proxy-client-key-file",
                "/repo/.skiff/pki/front-proxy-client.key",
                "--requestheader-client-ca-file",
                "/repo/.skiff/pki/front-proxy-ca.crt",
                "--requestheader-allowed-names",
                "front-proxy-client"
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
}
