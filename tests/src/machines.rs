//! Clusters whose machines share nothing but a network. Each [`Machine`] is a network
//! namespace of its own (its own loopback) with one address on a [`Fabric`], and every
//! process of that machine runs inside its namespace (`nsenter --net`): etcd, the API server,
//! the scheduler and the controller manager on a `control` machine, each node agent on its
//! node's, kubectl on a `laptop` outside the cluster. Machines reach each other only through
//! fabric addresses; the test process itself reaches the API server through a
//! [`skiff_testnet::Forwarder`] (the harness's, as a user's port forward would be).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use skiff_client::Client;

use crate::cluster::{elected, start_manager, wait_nodes_ready};
use crate::{ApiServer, Backend, Component, Fabric, KUBECTL, Netns, Node, unique};

/// The port an API server on a machine listens on (every machine has its own ports).
pub const MACHINE_API_PORT: u16 = 6443;
/// etcd's client port on the control machine's own loopback.
const ETCD_CLIENT_PORT: u16 = 2379;

/// `program`, run inside the network namespace at `netns` when given (see
/// [`Netns::command`]), else in the test's own.
pub fn on_machine(netns: Option<&Path>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match netns {
        Some(path) => skiff_testnet::command_in(path, program),
        None => Command::new(program),
    }
}

/// `kubectl` (a command for kubectl 1.32 on some machine) with `kubeconfig`, its discovery
/// cache in `cache` and `args`; `$KUBECONFIG` is not inherited.
pub fn kubectl_with(
    mut kubectl: Command,
    kubeconfig: &Path,
    cache: &Path,
    args: &[&str],
) -> Command {
    kubectl
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--cache-dir={}", cache.display()))
        .args(args)
        .env_remove("KUBECONFIG");
    kubectl
}

/// A machine: a network namespace with an address on a fabric.
#[derive(Debug)]
pub struct Machine {
    pub ip: IpAddr,
    pub netns: Netns,
}

impl Machine {
    /// A new machine `skiff-e2e-<role>-<id>` on `fabric`.
    pub fn on(fabric: &Fabric, role: &str) -> Machine {
        let netns = Netns::create(&format!("skiff-e2e-{role}-{}", unique()))
            .expect("creating the machine's namespace");
        let ip = fabric
            .attach(netns.name())
            .expect("attaching the machine to the fabric")
            .parse()
            .expect("the fabric hands out IP addresses");
        Machine { ip, netns }
    }

    /// `program` run on this machine.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.netns.command(program)
    }

    /// `ss ARGS` of this machine's sockets.
    pub fn ss(&self, args: &[&str]) -> String {
        ss(self.netns.name(), args)
    }
}

/// `ss -N <netns> ARGS`: the sockets of the namespace `/run/netns/<netns>`.
pub fn ss(netns: &str, args: &[&str]) -> String {
    let out = Command::new("ss")
        .arg("-N")
        .arg(netns)
        .args(args)
        .output()
        .expect("running ss (iproute2)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Where a process of the harness runs when it is on a machine: the machine's namespace,
/// the address other machines reach it at, and the forwarder the test reaches it through.
#[derive(Debug)]
pub struct OnMachine {
    pub netns: PathBuf,
    /// `https://<machine address>:<port>`.
    pub endpoint: String,
    pub forward: skiff_testnet::Forwarder,
}

impl OnMachine {
    /// The namespace's name (`/run/netns/<name>`).
    pub fn netns_name(&self) -> String {
        self.netns
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// A process the harness started; SIGKILLed and reaped on drop.
#[derive(Debug)]
struct Process {
    child: Child,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real etcd on `machine`, on that machine's loopback (reached only by the API server
/// beside it), logging to `dir/etcd.log`; waits until it listens.
fn etcd_on(machine: &Machine, dir: &Path) -> Process {
    etcd_at(machine, dir, "127.0.0.1".parse().expect("an address"))
}

/// A real etcd on `machine` listening on `ip` (the machine's loopback, or its fabric address
/// for API servers on other machines).
fn etcd_at(machine: &Machine, dir: &Path, ip: IpAddr) -> Process {
    let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log");
    let client_url = format!("http://{ip}:{ETCD_CLIENT_PORT}");
    let peer_url = format!("http://{ip}:{}", ETCD_CLIENT_PORT + 1);
    let flags = skiff_flags::EtcdFlags {
        name: "control".into(),
        data_dir: dir.join("etcd"),
        client_url,
        initial_cluster: format!("control={peer_url}"),
        peer_url,
        initial_cluster_token: format!("skiff-e2e-{}", unique()),
        tls: None,
        log_to_stderr: true,
    };
    let mut cmd = machine.command("etcd");
    for (name, _) in std::env::vars_os() {
        // etcd refuses to start when an ETCD_* variable shadows a flag.
        if name.to_string_lossy().starts_with("ETCD_") {
            cmd.env_remove(name);
        }
    }
    let child = cmd
        .args(flags.args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting etcd (run `cargo xtask setup`)");
    let etcd = Process { child };
    let deadline = Instant::now() + Duration::from_secs(20);
    let wanted = format!("{ip}:{ETCD_CLIENT_PORT}");
    while !machine
        .ss(&["-Htln"])
        .split_whitespace()
        .any(|w| w == wanted)
    {
        assert!(
            Instant::now() < deadline,
            "etcd did not listen within 20 s; log:\n{}",
            std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    etcd
}

/// A whole cluster of machines: one `control` machine (etcd, API server, scheduler,
/// controller manager), `n` node machines, and a `laptop` on the same network outside the
/// cluster.
#[derive(Debug)]
pub struct MachineCluster {
    // Dropped in field order: agents and components before the API server, the server before
    // etcd, processes before the machines they run on, machines before the fabric.
    pub nodes: Vec<Node>,
    pub scheduler: Component,
    pub manager: Component,
    pub client: Client,
    pub server: ApiServer,
    _etcd: Process,
    pub control: Machine,
    pub laptop: Machine,
    /// The laptop's kubeconfig: the administrator at the control machine's address.
    pub laptop_kubeconfig: PathBuf,
    pub fabric: Fabric,
    pub id: String,
    dir: tempfile::TempDir,
}

impl MachineCluster {
    /// Starts everything and waits until the `nodes` nodes (`e2e-<id>-n<i>`) are Ready with
    /// a pod CIDR.
    pub async fn start(nodes: usize) -> MachineCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let fabric = crate::fabric();
        let control = Machine::on(&fabric, "control");
        let laptop = Machine::on(&fabric, "laptop");
        let etcd = etcd_on(&control, dir.path());
        let server = ApiServer::start_on(
            &control,
            Backend::Etcd(format!("http://127.0.0.1:{ETCD_CLIENT_PORT}")),
            &[],
        );
        let client = server.client().await;
        let scheduler =
            Component::start_elected(&server, "skiff-scheduler", elected("sched-1"), &[]);
        let manager = start_manager(&server, "cm-1");
        let laptop_kubeconfig =
            server.machine_kubeconfig(dir.path(), "system:admin", &["system:masters"]);
        let id = unique();
        let nodes = (0..nodes)
            .map(|i| Node::start_machine(&server, &format!("e2e-{id}-n{i}"), &fabric, &[]))
            .collect::<Vec<_>>();
        let c = MachineCluster {
            nodes,
            scheduler,
            manager,
            client,
            server,
            _etcd: etcd,
            control,
            laptop,
            laptop_kubeconfig,
            fabric,
            id,
            dir,
        };
        wait_nodes_ready(&c.client, c.nodes.len(), || c.logs()).await;
        c
    }

    /// kubectl 1.32 on the laptop, with the laptop's kubeconfig.
    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        kubectl_with(
            self.laptop.command(KUBECTL),
            &self.laptop_kubeconfig,
            &self.dir.path().join("kube-cache"),
            args,
        )
    }

    /// Runs kubectl on the laptop and waits for it.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("running kubectl")
    }

    /// Every component's and agent's log tail, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = format!(
            "--- apiserver ---\n{}\n--- scheduler ---\n{}\n--- controller manager ---\n{}",
            crate::cluster::tail(&self.server.log()),
            crate::cluster::tail(&self.scheduler.log()),
            crate::cluster::tail(&self.manager.log()),
        );
        for n in &self.nodes {
            out += &format!(
                "\n--- agent {} ---\n{}",
                n.name,
                crate::cluster::tail(&n.agent_log())
            );
        }
        out
    }
}
