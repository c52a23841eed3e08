//! Clusters whose machines share nothing but a network. Each [`Machine`] is a network
//! namespace of its own (its own loopback) with one address on a [`Fabric`], and every
//! process of that machine runs inside its namespace (`nsenter --net`): etcd, the API server,
//! the scheduler and the controller manager on a `control` machine, each node agent on its
//! node's, kubectl on a `laptop` outside the cluster. Machines reach each other only through
//! fabric addresses; the test process itself reaches the API server through a
//! [`skiff_testnet::Forwarder`] (the harness's, as a user's port forward would be).
//! [`crate::cluster::Cluster`] puts such machines together.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Fabric, Netns, unique};

/// The port an API server on a machine listens on (every machine has its own ports).
pub const MACHINE_API_PORT: u16 = 6443;
/// etcd's client port on the control machine's own loopback.
pub(crate) const ETCD_CLIENT_PORT: u16 = 2379;

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

    /// Runs the future `f` makes to completion on this machine: on a thread of its own that
    /// enters the machine's namespace, with a runtime of its own, so every connection it
    /// opens leaves from the machine (a client of the test that must reach node addresses,
    /// which the test's own namespace never dials).
    pub fn block_on<T: Send, Fut: std::future::Future<Output = T>>(
        &self,
        f: impl FnOnce() -> Fut + Send,
    ) -> T {
        tokio::task::block_in_place(|| {
            skiff_testnet::run_in(&self.netns.path(), || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime")
                    .block_on(f())
            })
            .expect("entering the machine's namespace")
        })
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
pub(crate) struct Process {
    child: Child,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real etcd on `machine`'s own loopback (reached only by the API server beside it),
/// logging to `dir/etcd.log`; waits until it listens.
pub(crate) fn etcd_on(machine: &Machine, dir: &Path) -> Process {
    let ip = std::net::Ipv4Addr::LOCALHOST;
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
