//! Harness for the end-to-end tests in `tests/tests/`: starts the real `skiff-apiserver`
//! binary (embedded store or a real etcd) on a free loopback port and runs the real `skiff`
//! CLI against it. Processes are killed by pid when the harness is dropped, also when a test
//! fails.
//!
//! The end-to-end tests, one file per capability in `tests/tests/`, drive these real
//! processes: nodes run in network namespaces of their own (`skiff_testnet::Netns`) and
//! cgroups on one `Fabric`, all removed on drop; [`cluster`] is a whole cluster on real etcd,
//! [`ha`] a highly available one (for `api_servers_fail_over.rs` and
//! `control_plane_survives_chaos.rs`, with seeded kills during a rollout), [`rollout`] the
//! `Sampler` that checks a rollout at every revision. Control-plane binaries run as
//! `Component`s that can be started, killed with SIGKILL and restarted. Crate-level end-to-end
//! tests sit with their crate (`control/apiserver/tests/`, `node/image/tests/`,
//! `node/agent/tests/`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a failed setup step is the calling test's failure"
)]

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub mod cluster;
pub mod every_kind;
pub mod extension;
pub mod ha;
pub mod interactive;
pub mod machines;
pub mod python;
pub mod rollout;
pub mod up;

pub use machines::{MACHINE_API_PORT, Machine, OnMachine, on_machine};

pub use skiff_client::{Client, ClientConfig};
pub use skiff_flags::Election;
use skiff_flags::{
    ApiServerFlags, ApiStore, ControllerManagerFlags, NodeFlags, NodeMode, SchedulerFlags,
    SigningCa,
};
pub use skiff_store::testutil::{EtcdCluster, EtcdServer};
pub use skiff_testkit::{eventually_within, unique};
pub use skiff_testnet::{FABRIC_PREFIX, Fabric, Netns};

/// The seed of a randomized test: `$<var>` when set (to replay a run), else the clock's
/// nanoseconds; never 0 (xorshift generators need a non-zero state).
pub fn seed(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
        | 1
}

/// The directory holding the workspace's built binaries (`target/debug`).
pub fn bin_dir() -> PathBuf {
    // Test executables live in target/<profile>/deps/.
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary is inside target/<profile>/deps")
        .to_path_buf()
}

/// Path of a workspace binary, building it first if it is missing. A binary older than the
/// running test is used as it is (rebuilding here could resolve features differently from the
/// workspace build and recompile half of it), with a warning: `cargo test --workspace` and
/// `cargo xtask test` build every binary first; after `cargo test -p skiff-tests` alone, run
/// `cargo build --workspace` when a binary's code changed.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(bin), Some(test)) = (
        modified(&path),
        std::env::current_exe().ok().as_deref().and_then(modified),
    ) && bin < test
    {
        eprintln!(
            "warning: {} is older than this test executable; if its code changed, run \
             `cargo build --workspace` first",
            path.display()
        );
    }
    if !path.exists() {
        let package = match name {
            "skiff" => "skiff-cli",
            "skiff-controller-manager" => "skiff-controllers",
            other => other,
        };
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", package, "--bin", name])
            .status()
            .expect("running cargo build");
        assert!(status.success(), "building {name} failed");
    }
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral loopback port")
}

/// Which store the API server runs on.
#[derive(Debug)]
pub enum Backend {
    Embedded,
    /// The embedded store in this data directory (kept by the caller, e.g. a restored one).
    EmbeddedIn(PathBuf),
    Etcd(String),
}

/// Where an [`ApiServer`]'s PKI comes from.
enum Pki<'a> {
    /// Made by the server in its own directory.
    Own,
    /// Another server's directory, used as it is (servers on one machine).
    Shared(&'a Path),
    /// Another server's CA, service-account key and encryption configuration, copied to a
    /// directory of its own.
    CopyCa(&'a Path),
}

/// A running `skiff-apiserver` process (TLS; its PKI in its own directory).
#[derive(Debug)]
pub struct ApiServer {
    child: Child,
    /// How it was started (for [`ApiServer::restart`]).
    args: Vec<std::ffi::OsString>,
    /// The machine it runs on, when not the test's own ([`ApiServer::start_on`]).
    pub machine: Option<OnMachine>,
    /// `https://127.0.0.1:<port>`.
    pub endpoint: String,
    pub addr: SocketAddr,
    /// The PKI directory the server made on start (`ca.crt`, `ca.key`, kubeconfigs).
    pub pki_dir: PathBuf,
    /// The administrator's kubeconfig (`system:admin` in `system:masters`).
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl ApiServer {
    pub fn start(backend: Backend) -> ApiServer {
        ApiServer::start_with(backend, &[])
    }

    /// Like [`ApiServer::start`], with extra `skiff-apiserver` arguments.
    pub fn start_with(backend: Backend, extra: &[&str]) -> ApiServer {
        ApiServer::launch(backend, extra, Pki::Own, None)
    }

    /// Another API server of the same cluster: over `backend` (the same store) with this
    /// one's PKI (CA, serving certificate, keys), on its own port.
    pub fn start_beside(&self, backend: Backend) -> ApiServer {
        ApiServer::launch(backend, &[], Pki::Shared(&self.pki_dir), None)
    }

    /// An API server running on `machine` (inside its network namespace), listening on the
    /// machine's address. The test reaches it through a [`skiff_testnet::Forwarder`] from a
    /// loopback port of its own: [`ApiServer::endpoint`] and the administrator's kubeconfig
    /// name that port; [`OnMachine::endpoint`] is the address other machines use.
    pub fn start_on(machine: &Machine, backend: Backend, extra: &[&str]) -> ApiServer {
        ApiServer::launch(backend, extra, Pki::Own, Some(machine))
    }

    /// Another API server of the same cluster on `machine`: over `backend`, with this one's
    /// CA, service-account key and encryption configuration copied into a PKI directory of its own (so it issues its
    /// own serving certificate for its machine's address and writes its own kubeconfigs).
    pub fn start_beside_on(&self, machine: &Machine, backend: Backend) -> ApiServer {
        ApiServer::launch(backend, &[], Pki::CopyCa(&self.pki_dir), Some(machine))
    }

    fn launch(backend: Backend, extra: &[&str], pki: Pki, machine: Option<&Machine>) -> ApiServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr: SocketAddr = match machine {
            Some(m) => SocketAddr::new(m.ip, MACHINE_API_PORT),
            None => ([127, 0, 0, 1], free_port()).into(),
        };
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let pki_dir = match pki {
            Pki::Shared(p) => p.to_path_buf(),
            Pki::Own => dir.path().join("pki"),
            Pki::CopyCa(from) => {
                let to = dir.path().join("pki");
                std::fs::create_dir_all(&to).expect("a PKI directory");
                // Everything but what names a server: its certificate and its kubeconfigs.
                for entry in std::fs::read_dir(from)
                    .expect("the cluster's PKI")
                    .flatten()
                {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if name.starts_with("apiserver.") || name.ends_with(".kubeconfig") {
                        continue;
                    }
                    std::fs::copy(entry.path(), to.join(&name))
                        .unwrap_or_else(|e| panic!("copying {name} of the cluster's PKI: {e}"));
                }
                to
            }
        };
        let store = match &backend {
            Backend::Embedded => ApiStore::Embedded {
                data_dir: dir.path().join("data"),
            },
            Backend::EmbeddedIn(data) => ApiStore::Embedded {
                data_dir: data.clone(),
            },
            Backend::Etcd(endpoints) => ApiStore::Etcd {
                endpoints: endpoints.clone(),
                tls: None,
            },
        };
        let args = ApiServerFlags {
            listen: addr,
            pki_dir: pki_dir.clone(),
            store,
            tls_sans: None,
            extra: extra.iter().map(Into::into).collect(),
        }
        .args();
        let on = machine.map(|m| OnMachine {
            netns: m.netns.path(),
            endpoint: format!("https://{addr}"),
            forward: skiff_testnet::Forwarder::start(&m.netns.path(), addr)
                .expect("forwarding a loopback port to the API server's machine"),
        });
        let child = spawn_apiserver(&args, dir.path(), on.as_ref());
        let local = on.as_ref().map_or(addr, |o| o.forward.local());
        let mut server = ApiServer {
            child,
            args,
            machine: on,
            endpoint: format!("https://{local}"),
            addr: local,
            kubeconfig: pki_dir.join("admin.kubeconfig"),
            pki_dir,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !server.kubeconfig.exists() || !server.listening() {
            assert!(
                Instant::now() < deadline,
                "skiff-apiserver did not listen on {addr} within 30 s; log:\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        if server.machine.is_some() {
            // The server's own kubeconfig names its machine's address; the test's names the
            // forwarded port.
            let forwarded = server._dir.path().join("admin-forwarded.kubeconfig");
            let pki = skiff_pki::ClusterPki::new(&server.pki_dir);
            let ca = pki.load_ca().expect("the cluster CA");
            pki.write_kubeconfig(
                &ca,
                &forwarded,
                &server.endpoint,
                "system:admin",
                &["system:masters"],
            )
            .expect("writing the forwarded administrator's kubeconfig");
            server.kubeconfig = forwarded;
        }
        server
    }

    /// Whether it accepts connections (on its machine, when it runs on one).
    fn listening(&self) -> bool {
        match &self.machine {
            None => TcpStream::connect(self.addr).is_ok(),
            Some(m) => {
                let target = m.forward.target();
                let any = format!("0.0.0.0:{}", target.port());
                Command::new("ss")
                    .args(["-N", &m.netns_name(), "-Htln"])
                    .output()
                    .is_ok_and(|o| {
                        String::from_utf8_lossy(&o.stdout)
                            .split_whitespace()
                            .any(|w| w == target.to_string() || w == any)
                    })
            }
        }
    }

    /// The address the process listens on (its machine's, or a loopback one).
    pub fn listen(&self) -> SocketAddr {
        self.machine
            .as_ref()
            .map_or(self.addr, |m| m.forward.target())
    }

    /// The URL other machines reach it at: its machine's address, or its loopback one.
    pub fn cluster_endpoint(&self) -> &str {
        self.machine
            .as_ref()
            .map_or(self.endpoint.as_str(), |m| m.endpoint.as_str())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("apiserver.log")).unwrap_or_default()
    }

    /// Kills the server with SIGKILL (no shutdown of any kind) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again with the same arguments (store, port, PKI), its log appended,
    /// and waits until it listens.
    pub fn restart(&mut self) {
        self.kill();
        self.child = spawn_apiserver(&self.args, self._dir.path(), self.machine.as_ref());
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.listening() {
            assert!(
                Instant::now() < deadline,
                "skiff-apiserver did not listen again within 30 s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client configuration of the administrator's kubeconfig.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig::from_kubeconfig(&self.kubeconfig).expect("the admin kubeconfig")
    }

    /// A client connected as the administrator.
    pub async fn client(&self) -> Client {
        Client::connect_with(&self.client_config())
            .await
            .expect("connecting to the API server")
    }

    /// Writes a kubeconfig for `user` in `groups` with a certificate of the cluster CA
    /// (`skiff-apiserver kubeconfig`'s library call) and returns its path.
    pub fn user_kubeconfig(&self, dir: &Path, user: &str, groups: &[&str]) -> PathBuf {
        self.kubeconfig_at(dir, user, groups, &self.endpoint)
    }

    /// Like [`ApiServer::user_kubeconfig`], for a client on another machine: the server's
    /// [`ApiServer::cluster_endpoint`].
    pub fn machine_kubeconfig(&self, dir: &Path, user: &str, groups: &[&str]) -> PathBuf {
        self.kubeconfig_at(dir, user, groups, self.cluster_endpoint())
    }

    fn kubeconfig_at(&self, dir: &Path, user: &str, groups: &[&str], endpoint: &str) -> PathBuf {
        let pki = skiff_pki::ClusterPki::new(&self.pki_dir);
        let ca = pki.load_ca().expect("the cluster CA");
        let safe: String = user
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let path = dir.join(format!("{safe}.kubeconfig"));
        pki.write_kubeconfig(&ca, &path, endpoint, user, groups)
            .expect("writing a user kubeconfig");
        path
    }

    /// The kubeconfig the server wrote for a control-plane component
    /// (`scheduler`, `controller-manager`).
    pub fn component_kubeconfig(&self, component: &str) -> PathBuf {
        self.pki_dir.join(format!("{component}.kubeconfig"))
    }

    /// Runs `skiff ARGS` against this server and waits for it.
    pub fn skiff(&self, args: &[&str]) -> Output {
        self.skiff_cmd(args).output().expect("running skiff")
    }

    /// Like [`ApiServer::skiff`] but feeds `stdin`.
    pub fn skiff_stdin(&self, args: &[&str], stdin: &str) -> Output {
        run_with_stdin(self.skiff_cmd(args), stdin)
    }

    /// A `skiff` command with the server address set, for tests that stream its output.
    /// With the server on a machine it runs there, with the server's own kubeconfig (its
    /// machine's address): the CLI dials node agents at their node addresses, which only the
    /// machines on the fabric reach.
    pub fn skiff_cmd(&self, args: &[&str]) -> Command {
        let (mut cmd, kubeconfig) = match &self.machine {
            Some(m) => (
                on_machine(Some(&m.netns), binary("skiff")),
                self.pki_dir.join("admin.kubeconfig"),
            ),
            None => (Command::new(binary("skiff")), self.kubeconfig.clone()),
        };
        cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
        // Never pick up a developer's config file.
        cmd.env("SKIFF_CONFIG", "/nonexistent/skiff-config.yaml");
        cmd.env_remove("SKIFF_SERVER");
        cmd
    }
}

/// Runs `cmd` with `stdin` fed to it and waits for it.
pub fn run_with_stdin(mut cmd: Command, stdin: &str) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {:?}: {e}", cmd.get_program()));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("writing stdin");
    child.wait_with_output().expect("waiting for the command")
}

/// The real kubectl these machines carry (`/usr/bin/kubectl` is a version dispatcher).
pub const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.32";

impl ApiServer {
    /// A `kubectl` command against this server with the administrator's kubeconfig (the one
    /// the server generated), never the developer's, and a discovery cache of its own
    /// (ports are reused between runs).
    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        self.kubectl_as(&self.kubeconfig, args)
    }

    /// A `kubectl` command with the kubeconfig `kubeconfig`, run by the test process: the
    /// kubeconfig must name a loopback address (a machine's address is reached only from
    /// machines, never from the host's namespace).
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Command {
        assert_loopback_server(kubeconfig);
        let mut cmd = Command::new(KUBECTL);
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!(
                "--cache-dir={}",
                self._dir.path().join("kube-cache").display()
            ))
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("KUBE_EDITOR")
            .env_remove("EDITOR");
        cmd
    }

    /// Runs `kubectl ARGS` against this server and waits for it.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("running kubectl")
    }

    /// Like [`ApiServer::kubectl`] but feeds `stdin` (for `-f -`).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        run_with_stdin(self.kubectl_cmd(args), stdin)
    }
}

/// Panics unless the kubeconfig at `path` names a server on a loopback address: the test
/// process lives in the host's namespace, where a fabric address would leave the machine.
fn assert_loopback_server(path: &Path) {
    let Ok(k) = skiff_pki::kubeconfig::load(path) else {
        return; // kubectl reports an unreadable kubeconfig itself
    };
    let server = &k.server;
    let hostport = server
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default();
    let loopback = hostport.starts_with("localhost:")
        || hostport
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback());
    assert!(
        loopback,
        "{} names {server}: the test process reaches API servers only through loopback \
         (a kubeconfig of ApiServer::user_kubeconfig, or run it on a machine)",
        path.display()
    );
}

fn spawn_apiserver(args: &[std::ffi::OsString], dir: &Path, on: Option<&OnMachine>) -> Child {
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join("apiserver.log"))
        .expect("log file");
    on_machine(on.map(|o| o.netns.as_path()), binary("skiff-apiserver"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting skiff-apiserver")
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process whose stdout is read line by line in the background.
#[derive(Debug)]
pub struct Streaming {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Streaming {
    pub fn spawn(mut cmd: Command) -> Streaming {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning streaming command");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Streaming { child, lines }
    }

    /// Every line up to and including the first that contains `needle`, waiting up to
    /// `timeout` for it; `Err` with the lines read when it does not come.
    pub fn lines_until(&self, needle: &str, timeout: Duration) -> Result<Vec<String>, Vec<String>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let done = line.contains(needle);
                    seen.push(line);
                    if done {
                        return Ok(seen);
                    }
                }
                Err(_) => return Err(seen),
            }
        }
    }

    /// Waits up to `timeout` for a line containing all of `needles`; returns it.
    pub fn wait_for(&self, needles: &[&str], timeout: Duration) -> Result<String, Vec<String>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if needles.iter().all(|n| line.contains(n)) => return Ok(line),
                Ok(line) => seen.push(line),
                Err(_) => return Err(seen),
            }
        }
    }
}

impl Streaming {
    /// Waits up to `timeout` for the process to exit; its status and stderr, or `None` if
    /// it still runs (it is killed on drop).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<(std::process::ExitStatus, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    let mut err = String::new();
                    if let Some(mut e) = self.child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    return Some((status, err));
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => return None,
            }
        }
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// stdout of a finished command, asserting it succeeded.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "command failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// stderr of a finished command, asserting it failed.
pub fn fails(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "command unexpectedly succeeded:\nstdout:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The repository root (for examples/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repo")
        .to_path_buf()
}

fn run_ip(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().expect("running ip")
}

/// A node: a machine of its own (a network namespace with an address on a fabric, where its
/// agent runs), cgroup parent and state directory, and a running `skiff-node` agent process. Dropping it kills every process it started (the agent by
/// pid; the pods and their shims through `cgroup.kill` on the node's cgroup), removes the
/// pods' network namespaces, the cgroups and the node namespace — also when a test fails.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub netns: String,
    pub cgroup_parent: PathBuf,
    pub state_dir: tempfile::TempDir,
    pub pod_cidr: String,
    labels: String,
    /// The node's kubeconfig (`system:node:<name>` in `system:nodes`).
    pub kubeconfig: PathBuf,
    /// API servers the agent fails over between (`--server`; else its kubeconfig's).
    pub servers: Option<String>,
    /// Extra arguments of `skiff-node run`.
    pub agent_args: Vec<String>,
    /// `Some((server, token, CA hash))`: the agent is started with `skiff-node join` and
    /// gets its credentials through a bootstrap token (the kubeconfig is written by it).
    pub join: Option<(String, String, String)>,
    agent: Option<Child>,
    /// The node's address on the fabric.
    pub node_ip: String,
    /// The test's registries forwarded onto the node's loopback (see
    /// [`skiff_testkit::registry::running`]).
    _registries: Vec<skiff_testnet::Forwarder>,
    /// Deleted after everything in it (a field drops after `Drop::drop` has run).
    _ns: Netns,
}

impl Node {
    /// Starts a node that is a machine of its own on `fabric` (the API server on another
    /// machine, [`ApiServer::start_on`]), whose agent registers `pod_cidr` (empty: none, the
    /// agent waits for the controller manager's node IPAM).
    pub fn start(server: &ApiServer, fabric: &Fabric, name: &str, pod_cidr: &str) -> Node {
        Node::launch(server, name, pod_cidr, &[], fabric, None, &[])
    }

    /// A node that is a machine of its own on `fabric`, with `--node-labels` and the extra
    /// agent arguments `agent_args`: its agent runs inside the node's namespace, reaches the
    /// API server at its machine's address and serves its API on the node's address with a
    /// certificate of the cluster CA. Its pod CIDR comes from the controller manager's node
    /// IPAM.
    pub fn start_machine(
        server: &ApiServer,
        name: &str,
        labels: &[(&str, &str)],
        fabric: &Fabric,
        agent_args: &[&str],
    ) -> Node {
        Node::launch(server, name, "", labels, fabric, None, agent_args)
    }

    /// A node that is a machine of its own on `fabric` whose agent fails over between the
    /// API servers `servers` (URLs at their machines' addresses, comma separated), with a
    /// certificate of `server`'s CA and no pod CIDR of its own.
    pub fn start_failing_over(
        server: &ApiServer,
        name: &str,
        fabric: &Fabric,
        servers: &str,
    ) -> Node {
        Node::launch(server, name, "", &[], fabric, Some(servers), &[])
    }

    fn launch(
        server: &ApiServer,
        name: &str,
        pod_cidr: &str,
        labels: &[(&str, &str)],
        fabric: &Fabric,
        servers: Option<&str>,
        agent_args: &[&str],
    ) -> Node {
        let (user, groups) = (format!("system:node:{name}"), ["system:nodes"]);
        let mut node = Node::machine(name, pod_cidr, fabric, |dir| {
            server.machine_kubeconfig(dir, &user, &groups)
        });
        node.labels = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        node.servers = servers.map(String::from);
        node.agent_args = agent_args.iter().map(|a| a.to_string()).collect();
        node.start_agent();
        node
    }

    /// A node, a machine of its own on `fabric`, that joins with `skiff-node join --token
    /// TOKEN --ca-cert-hash HASH` at the server's machine address instead of being handed a
    /// certificate (the agent writes its kubeconfig at [`Node::kubeconfig`]).
    pub fn join(
        server: &ApiServer,
        fabric: &Fabric,
        name: &str,
        pod_cidr: &str,
        token: &str,
        hash: &str,
    ) -> Node {
        let mut node = Node::machine(name, pod_cidr, fabric, |dir| dir.join("kubelet.kubeconfig"));
        node.join = Some((
            server.cluster_endpoint().to_string(),
            token.to_string(),
            hash.to_string(),
        ));
        node.start_agent();
        node
    }

    /// The node's machine (its namespace on `fabric`, the test's registries on its
    /// loopback), cgroup parent and state directory, with the kubeconfig `kubeconfig` makes
    /// in the state directory; the agent is not started.
    fn machine(
        name: &str,
        pod_cidr: &str,
        fabric: &Fabric,
        kubeconfig: impl FnOnce(&Path) -> PathBuf,
    ) -> Node {
        let id = unique();
        let ns = Netns::create(&format!("skiff-e2e-{id}")).expect("creating the node's netns");
        let netns = ns.name().to_string();
        let node_ip = fabric
            .attach(&netns)
            .expect("attaching the node to the fabric");
        let state_dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = kubeconfig(state_dir.path());
        let mut node = Node {
            name: name.to_string(),
            netns,
            _ns: ns,
            cgroup_parent: cgroup2_root().join(format!("skiff-e2e-{id}")),
            state_dir,
            pod_cidr: pod_cidr.to_string(),
            labels: String::new(),
            kubeconfig,
            servers: None,
            agent_args: Vec::new(),
            join: None,
            agent: None,
            node_ip,
            _registries: Vec::new(),
        };
        node._registries = node.forward_registries();
        node
    }

    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.netns)
    }

    /// Each registry this test process runs on its loopback, reachable at the same address
    /// on the node's own loopback (as a per-machine registry mirror would serve it).
    fn forward_registries(&self) -> Vec<skiff_testnet::Forwarder> {
        skiff_testkit::registry::running()
            .into_iter()
            .map(|addr| {
                skiff_testnet::Forwarder::between(
                    Some(&self.netns_path()),
                    addr,
                    Path::new("/proc/thread-self/ns/net"),
                    addr,
                )
                .expect("forwarding a registry onto the node's loopback")
            })
            .collect()
    }

    /// Starts (or restarts) the agent process.
    pub fn start_agent(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state_dir.path().join("agent.log"))
            .expect("agent log");
        let mode = match &self.join {
            // The token goes by environment, as an operator keeps it out of `ps`.
            Some((server, _, hash)) => NodeMode::Join {
                server: server.clone(),
                ca_cert_hash: hash.clone(),
                join_timeout: Some(Duration::from_secs(60)),
            },
            None => NodeMode::Run {
                server: self.servers.clone(),
            },
        };
        // The agent is inside the node's namespace (its machine), with the default API
        // address (the node's) and port.
        let flags = NodeFlags {
            pod_cidr: Some(self.pod_cidr.clone()).filter(|c| !c.is_empty()),
            node_labels: Some(self.labels.clone()).filter(|l| !l.is_empty()),
            cgroup_parent: Some(self.cgroup_parent.clone()),
            backoff: Some(Duration::from_secs(1)),
            lease_duration: Some(Duration::from_secs(8)),
            extra: self.agent_args.iter().map(Into::into).collect(),
            ..NodeFlags::new(
                mode,
                self.kubeconfig.clone(),
                self.name.clone(),
                self.state_dir.path().join("state"),
            )
        };
        let mut cmd = on_machine(Some(&self.netns_path()), binary("skiff-node"));
        if let Some((_, token, _)) = &self.join {
            cmd.env("SKIFF_JOIN_TOKEN", token);
        }
        let child = cmd
            .args(flags.args())
            .env("RUST_LOG", "info,skiff_node=debug")
            .env("SKIFF_CONFIG", "/nonexistent")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting skiff-node");
        self.agent = Some(child);
    }

    /// The running agent's pid.
    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(Child::id)
    }

    /// SIGKILLs the agent (pods keep running).
    pub fn kill_agent(&mut self) {
        if let Some(mut c) = self.agent.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(self.state_dir.path().join("agent.log")).unwrap_or_default()
    }

    /// `ip -n <node netns> ARGS` output.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.netns.as_str()];
        full.extend_from_slice(args);
        String::from_utf8_lossy(&run_ip(&full).stdout).into_owned()
    }

    /// The iptables and nftables rules of the node's network namespace (`iptables-save` and
    /// `nft list ruleset` run inside it; comment lines dropped). Empty for a namespace nobody
    /// put rules in.
    pub fn firewall_rules(&self) -> String {
        let ns = format!("--net={}", self.netns_path().display());
        let mut out = String::new();
        for cmd in [
            vec!["iptables-save"],
            vec!["ip6tables-save"],
            vec!["nft", "list", "ruleset"],
        ] {
            let o = Command::new("nsenter")
                .arg(&ns)
                .args(&cmd)
                .output()
                .unwrap_or_else(|e| panic!("running {cmd:?} (cargo xtask setup installs it): {e}"));
            assert!(o.status.success(), "{cmd:?} in {}: {o:?}", self.netns);
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                let line = line.trim();
                if !line.is_empty() && !line.starts_with('#') {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }

    /// The runtime's records of this node's pod sandboxes (`<state>/runtime/pods/*/sandbox.json`).
    fn sandboxes(&self) -> Vec<serde_json::Value> {
        let pods = self.state_dir.path().join("state/runtime/pods");
        std::fs::read_dir(pods)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("sandbox.json")).ok())
            .filter_map(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .map(|v| v["sandbox"].clone())
            .collect()
    }

    /// Network namespaces under /run/netns that this node's pods use.
    pub fn pod_netns_names(&self) -> Vec<String> {
        self.sandboxes()
            .iter()
            .filter_map(|s| s["netns_path"].as_str())
            .filter_map(|p| Path::new(p).file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill_agent();
        // Every pod process and shim lives below the node's cgroup.
        let _ = std::fs::write(self.cgroup_parent.join("cgroup.kill"), "1");
        for name in self.pod_netns_names() {
            let _ = run_ip(&["netns", "del", &name]);
        }
        // The UTS and IPC namespaces are bind-mounted inside the state directory.
        for sb in self.sandboxes() {
            for key in ["uts_path", "ipc_path"] {
                if let Some(p) = sb[key].as_str() {
                    let _ = Command::new("umount").arg(p).output();
                }
            }
        }
        // Container root filesystems (overlays of image layers) and anything else still
        // mounted in the state directory, deepest first, before the directory goes.
        if let Ok(under) = skiff_runtime::mountinfo::under(self.state_dir.path()) {
            for p in under {
                let _ = Command::new("umount").arg("-l").arg(&p).output();
            }
        }
        // Wait for the cgroups to empty, then remove them bottom-up.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && skiff_runtime::remove_cgroup_tree(&self.cgroup_parent).is_err()
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        // The agent's pinned BPF maps and links (the pods' device links in `devices/`).
        let pins = Path::new("/sys/fs/bpf/skiff").join(&self.name);
        let _ = std::fs::remove_dir_all(&pins);
        let _ = std::fs::remove_dir("/sys/fs/bpf/skiff");
    }
}

/// A control-plane process (`skiff-scheduler`, `skiff-controller-manager`) talking to an
/// [`ApiServer`]; its stderr goes to a log file. Killed by pid on drop.
#[derive(Debug)]
pub struct Component {
    pub binary: String,
    args: Vec<OsString>,
    /// The network namespace of the machine it runs on (its API server's).
    machine: Option<PathBuf>,
    /// Its name in leader election, if it was given one.
    identity: Option<String>,
    child: Option<Child>,
    dir: tempfile::TempDir,
    starts: u32,
}

impl Component {
    /// Starts `skiff-scheduler` or `skiff-controller-manager` with the kubeconfig the server
    /// wrote for it (the controller manager also with the cluster CA) and the test's own
    /// flags `extra`.
    pub fn start(server: &ApiServer, binary: &str, extra: &[&str]) -> Component {
        Component::start_elected(server, binary, Election::default(), extra)
    }

    /// Like [`Component::start`], with the API servers to fail over between and leader
    /// election settings.
    pub fn start_elected(
        server: &ApiServer,
        binary: &str,
        election: Election,
        extra: &[&str],
    ) -> Component {
        let identity = election.identity.clone();
        let extra: Vec<OsString> = extra.iter().map(Into::into).collect();
        let args = match binary {
            "skiff-scheduler" => SchedulerFlags {
                kubeconfig: server.component_kubeconfig("scheduler"),
                election,
                extra,
            }
            .args(),
            // As k3s runs it: approved certificate requests are signed with the cluster CA.
            "skiff-controller-manager" => ControllerManagerFlags {
                kubeconfig: server.component_kubeconfig("controller-manager"),
                signing: Some(SigningCa {
                    cert: server.pki_dir.join("ca.crt"),
                    key: server.pki_dir.join("ca.key"),
                }),
                // The default StorageClass' volumes: beside the server's files, removed with
                // them.
                local_path_root: Some(server.pki_dir.with_file_name("local-path")),
                election,
                extra,
            }
            .args(),
            other => {
                panic!("Component runs skiff-scheduler or skiff-controller-manager, not {other}")
            }
        };
        let mut c = Component {
            binary: binary.to_string(),
            args,
            machine: server.machine.as_ref().map(|m| m.netns.clone()),
            identity,
            child: None,
            dir: tempfile::tempdir().expect("tempdir"),
            starts: 0,
        };
        c.restart();
        c
    }

    /// Starts the process (again, after [`Component::kill`]); each start logs to its own file.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "{} is still running", self.binary);
        self.starts += 1;
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", self.starts)))
            .expect("log file");
        let child = on_machine(self.machine.as_deref(), binary(&self.binary))
            .args(&self.args)
            .env("RUST_LOG", "info")
            .env("SKIFF_CONFIG", "/nonexistent")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.binary));
        self.child = Some(child);
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its name in leader election, if [`Component::start_elected`] gave it one.
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// SIGKILLs the process (`kill -9`: no clean-up, leases are left to expire).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Every start's log, concatenated.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|i| {
                std::fs::read_to_string(self.dir.path().join(format!("{i}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n--- restart ---\n")
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A fresh fabric in a uniquely named namespace (removed when dropped).
pub fn fabric() -> Fabric {
    Fabric::create(&format!("skiff-e2e-fab-{}", unique())).expect("creating the fabric")
}

/// A client namespace outside the cluster on `fabric` (to reach NodePorts, say): its name.
pub fn outside(fabric: &Fabric) -> String {
    let name = format!("skiff-e2e-out-{}", unique());
    fabric
        .outside(&name, None)
        .expect("attaching an outside namespace");
    name
}

/// The cgroup v2 mount point (hybrid hosts mount it at /sys/fs/cgroup/unified).
pub fn cgroup2_root() -> PathBuf {
    skiff_runtime::host::cgroup2_mount().expect("a cgroup2 mount")
}
