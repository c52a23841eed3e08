//! `cargo xtask up`: build and run a local Skiff cluster.
//!
//! Components are data ([`COMPONENTS`]); the ones whose binaries exist in the workspace (per
//! `cargo metadata`) are built (`--prebuilt`: taken as built, with no setup or doctor first),
//! started in order as children with logs in `<state>/logs/<name>.log`, and stopped with
//! SIGTERM (then SIGKILL after 10 s) on Ctrl-C or SIGTERM. `<state>` is `--state-dir`
//! (default `<repo>/.skiff`): the PKI, the store, kubeconfigs and node credentials.
//!
//! Setup and the doctor run first. The API server fills `<state>/pki` on first start; the
//! scheduler and controller manager run with the kubeconfigs it wrote (the controller manager
//! with the cluster CA, to sign certificate requests); nodes join with a bootstrap token
//! (`skiff-node join`, the token in the environment), or without the controller manager get a
//! kubeconfig from `skiff-apiserver kubeconfig`. The admin kubeconfig is copied to the CLI's
//! config file and `<state>/kubeconfig`. A docker-registry listens on
//! 127.0.0.1:`--registry-port` (storage in `<state>/registry`).
//!
//! Machines that share only a network (with `--nodes N`, as root): a bridge in the namespace
//! `skiff-up-fabric` is the network; the control plane (API server, scheduler, controller
//! manager, registry) runs inside the `control` machine, the namespace `skiff-up-control` at
//! `192.168.100.250`, the API server on its port 6443; each agent runs inside its node's
//! namespace `skiff-up-node-<i>` (`192.168.100.<i>`) and serves its API on that address;
//! `skiff-up-outside` (`.254`) is a client outside the cluster. The host keeps today's
//! experience through forwarders (the harness's, not the product's): `--listen`
//! (127.0.0.1:7443) to the API server, and the registry's port to the registry, on the host
//! and on each node's own loopback (so images named `127.0.0.1:5000/...` pull everywhere, as
//! a per-machine registry mirror would serve them). With `--ha` there are three control
//! machines (`skiff-up-control-1..3`, `.251`-`.253`), each with an etcd member, an API
//! server, a scheduler, a controller manager and a `skiff-vip` holding the virtual address
//! `.240` while its API server answers; the host's forwarder and the nodes use that address.
//! Without nodes everything runs on the host (`--ha`: three etcd members on loopback and
//! three of each component on consecutive ports).
//!
//! A component that exits is started again with the same command line after 1 s, doubling to
//! 30 s while it keeps crashing (a minute of running starts over), its log appended, the others
//! untouched. Stopping runs `skiff-node purge` after stopping everything, so no pod, cgroup,
//! pin or namespace is left. Only one `up` with machines runs at a time on a host: the
//! namespaces' names are fixed, and a second one is refused (a lock in `/run`).

mod fabric;
mod files;
mod plan;
mod supervisor;

use std::ffi::OsString;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};
use skiff_flags::ApiStore;
use skiff_testnet::{Fabric, Netns};

use crate::doctor;
use crate::setup::{self, SetupOptions};
use crate::util;
use fabric::{
    FABRIC_NETNS, FABRIC_PREFIX, OUTSIDE_NETNS, control_netns, prepare_control_netns,
    prepare_fabric, prepare_node_netns,
};
use files::{
    CLI_PACKAGE, REGISTRY_BIN, config_path, copy_private, forget_node, join_token, kubeconfig_path,
    load_workspace, make_etcd_pki, private_dir, registry_config, write_admin_config,
    write_node_kubeconfig,
};
pub use plan::connect_addr;
use plan::{
    COMPONENTS, Component, HA_REPLICAS, MAX_NODES, NodeCredentials, NodePlan, Readiness, UpConfig,
    etcd_args, etcd_members, node_args, node_plans, select_components,
};
use supervisor::{
    POLL, Running, Signals, port_open, purge_node, restart_crashed, shutdown, spawn_process,
    wait_port,
};

const NODE_PACKAGE: &str = "skiff-node";
/// The virtual address holder of several control machines.
const VIP_PACKAGE: &str = "skiff-vip";
const VIP_BIN: &str = "skiff-vip";

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
    /// Data directory for the embedded store [default: <state-dir>/data].
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
    /// an etcd CA of their own in <state-dir>/pki/etcd), three API servers (the --listen port and the next two)
    /// over them sharing one PKI, and three schedulers and three controller managers electing
    /// leaders; every component and agent lists all three API servers and fails over.
    #[arg(long, conflicts_with_all = ["etcd", "data_dir"])]
    pub ha: bool,
    /// Where the cluster's state lives: PKI, store, logs, kubeconfigs, node credentials
    /// [default: <repo>/.skiff]. Another directory is another cluster.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Start the binaries already built in the target directory: no setup, doctor or build
    /// first (for scripts and tests that built the workspace themselves).
    #[arg(long)]
    pub prebuilt: bool,
}

pub fn run(args: UpArgs) -> Result<()> {
    // What `up` builds and starts needs the same prerequisites as the tests: install what is
    // missing, then prove each works, before any build can fail obscurely.
    if !args.prebuilt {
        setup::run(SetupOptions { skip_ebpf: false })
            .context("setup failed; nothing was started")?;
        doctor::run(&doctor::DoctorOptions::default()).context("nothing was started")?;
    }
    let root = util::repo_root();
    let cwd = std::env::current_dir().context("current directory")?;
    let state = args
        .state_dir
        .as_ref()
        .map_or_else(|| root.join(".skiff"), |d| cwd.join(d));
    let mut cfg = UpConfig::from_args(&args, &state, &cwd);

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
        node_plans(cfg.nodes, &state)
    };
    // Held until `up` exits: the machines' namespaces have fixed names, so a second `up`
    // with machines would replace the first one's.
    let _machines_lock = if nodes.is_empty() {
        None
    } else {
        Some(lock_machines()?)
    };
    if !nodes.is_empty() {
        let n = usize::from(cfg.instances());
        cfg.on_machines(fabric::control_ips(n), (n > 1).then(fabric::vip));
    }
    check_ports_free(&cfg, &state)?;
    let bin_dir = ws.target_dir.join("debug");
    let needed = needed_binaries(&components, !nodes.is_empty(), ws.cli_bin());
    if !args.prebuilt {
        build(&root, &needed)?;
    }
    check_built(&needed, &bin_dir, args.prebuilt)?;

    // The cluster's state (PKI, encryption key, store, snapshots, node credentials) is only
    // its owner's: `.skiff` and the data directory are 0700 (the API server keeps its own
    // directories and files private too).
    private_dir(&state)?;
    if let ApiStore::Embedded { data_dir } = &cfg.store {
        private_dir(data_dir)?;
    } else if args.data_dir.is_some() {
        println!("note: --data-dir is ignored with --etcd");
    }
    let log_dir = state.join("logs");
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
    rt.block_on(supervise(StartPlan {
        root: &root,
        state: &state,
        cfg: &cfg,
        components: &components,
        bin_dir: &bin_dir,
        log_dir: &log_dir,
        config_file: &config_file,
        cli_bin: ws.cli_bin(),
        nodes: &nodes,
    }))
}

/// The host-wide lock of `up`'s machines (`/run/skiff-up.lock`, released when the file is
/// closed, also when `up` is killed).
fn lock_machines() -> Result<fs::File> {
    let path = Path::new("/run/skiff-up.lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => bail!(
            "another `cargo xtask up` with machines is running on this host (it holds {}); \
             stop it first",
            path.display()
        ),
        Err(fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// Fails when something already listens where an API server, an etcd member or the
/// registry is to listen.
fn check_ports_free(cfg: &UpConfig, state: &Path) -> Result<()> {
    for i in 0..cfg.instances() {
        let api = connect_addr(cfg.listen_of(i));
        if port_open(api) {
            bail!("something is already listening on {api}: stop it or pass --listen");
        }
    }
    if cfg.ha && cfg.controls.is_empty() {
        for m in etcd_members(state, &cfg.controls) {
            for port in [m.client_port, m.peer_port] {
                let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                if port_open(addr) {
                    bail!(
                        "something is already listening on {addr} (for {}): stop it",
                        m.name
                    );
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
    Ok(())
}

/// The (package, binary) pairs `up` starts: the components, the CLI, and with nodes the
/// agent and the virtual address holder.
fn needed_binaries<'a>(
    components: &[&'a Component],
    nodes: bool,
    cli_bin: Option<&'a str>,
) -> Vec<(&'a str, &'a str)> {
    let mut needed: Vec<(&str, &str)> = components.iter().map(|c| (c.package, c.bin)).collect();
    if let Some(cli) = cli_bin {
        needed.push((CLI_PACKAGE, cli));
    }
    if nodes {
        // With nodes the control plane is on machines, and --ha's needs its virtual address.
        needed.push((NODE_PACKAGE, NODE_PACKAGE));
        needed.push((VIP_PACKAGE, VIP_BIN));
    }
    needed
}

/// Builds the packages of `needed`.
fn build(root: &Path, needed: &[(&str, &str)]) -> Result<()> {
    let mut build = Command::new("cargo");
    build.arg("build").current_dir(root);
    for (package, _) in needed {
        build.args(["-p", package]);
    }
    println!("==> {}", util::display_cmd(&build));
    util::run_streaming(&mut build).context(
        "building the control plane failed (see the compiler errors above); \
         nothing was started",
    )?;
    Ok(())
}

/// Every binary of `needed` is in `bin_dir`.
fn check_built(needed: &[(&str, &str)], bin_dir: &Path, prebuilt: bool) -> Result<()> {
    for (package, bin) in needed {
        let p = bin_dir.join(bin);
        if !util::is_executable(&p) {
            if prebuilt {
                bail!(
                    "--prebuilt: {} is missing: build it first (cargo build -p {package}), or \
                     run without --prebuilt",
                    p.display()
                );
            }
            bail!(
                "{bin} was not produced by the build (expected {})",
                p.display()
            );
        }
    }
    Ok(())
}

/// What `supervise` starts, with where.
struct StartPlan<'a> {
    root: &'a Path,
    /// The cluster's state: PKI, store, logs, kubeconfigs (`--state-dir`).
    state: &'a Path,
    cfg: &'a UpConfig,
    components: &'a [&'a Component],
    bin_dir: &'a Path,
    log_dir: &'a Path,
    config_file: &'a Path,
    cli_bin: Option<&'a str>,
    nodes: &'a [NodePlan],
}

/// Why the cluster stops.
enum Stop {
    Signal,
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(e: anyhow::Error) -> Self {
        Stop::Failed(e)
    }
}

impl From<skiff_testnet::NetError> for Stop {
    fn from(e: skiff_testnet::NetError) -> Self {
        Stop::Failed(anyhow!("setting up the machines' network: {e}"))
    }
}

/// Everything started so far, to stop and remove.
#[derive(Default)]
struct Started {
    running: Vec<Running>,
    /// The host's (and the nodes') ways in to the control machine.
    forwarders: Vec<skiff_testnet::Forwarder>,
    fabric: Option<Fabric>,
    /// The control machine's and the nodes' namespaces.
    node_nets: Vec<Netns>,
}

impl Started {
    fn push(&mut self, r: Running, what: &str) {
        println!(
            "started {} (pid {}{what}), log: {}",
            r.name,
            r.pid,
            r.log.display()
        );
        self.running.push(r);
    }
}

async fn supervise(plan: StartPlan<'_>) -> Result<()> {
    let mut signals = Signals::new()?;
    let mut started = Started::default();
    let stop = match start_cluster(&plan, &mut started, &mut signals).await {
        Ok(()) => {
            print_banner(&plan);
            watch(&mut started.running, &mut signals).await
        }
        Err(stop) => stop,
    };
    if let Stop::Signal = stop {
        println!("\nshutting down...");
    }
    shutdown(&mut started.running, &mut signals).await;
    for node in plan.nodes {
        purge_node(plan.bin_dir, node);
    }
    drop(started.forwarders);
    // Machine namespaces, then the fabric with the outside namespace.
    drop(started.node_nets);
    drop(started.fabric);
    match stop {
        Stop::Signal => {
            println!("stopped");
            Ok(())
        }
        Stop::Failed(e) => Err(e),
    }
}

/// Starts everything in order, each waited for when something after it needs it, and
/// writes the administrator's configs.
async fn start_cluster(
    plan: &StartPlan<'_>,
    started: &mut Started,
    signals: &mut Signals,
) -> Result<(), Stop> {
    let machines = plan.cfg.controls.len();
    if machines > 0 {
        let fabric = prepare_fabric()?;
        for i in 0..machines {
            started
                .node_nets
                .push(prepare_control_netns(&fabric, i, machines)?);
        }
        started.fabric = Some(fabric);
    }
    if plan.cfg.ha {
        start_etcd(plan, started, signals).await?;
    }
    if machines > 0 {
        // The host's way in: --listen to the registration address (the virtual one is
        // dialled from the outside client's namespace, through the network like any client).
        let (through, target) = match plan.cfg.vip {
            Some(vip) => (
                OUTSIDE_NETNS.to_string(),
                SocketAddr::new(vip, plan::MACHINE_API_PORT),
            ),
            None => (control_netns(0, machines), plan.cfg.api_addr(0)),
        };
        started.forwarders.push(skiff_testnet::Forwarder::between(
            None,
            connect_addr(plan.cfg.listen),
            &netns_path(&through),
            target,
        )?);
        println!(
            "forwarding {} to the API server at {target}",
            connect_addr(plan.cfg.listen)
        );
    }
    start_components(plan, started, signals).await?;
    if plan.cfg.vip.is_some() {
        start_vips(plan, started)?;
    }
    // The administrator's configs on the host, before the nodes (their join token is made
    // with them).
    if plan.cfg.ha || machines > 0 {
        // The host's URLs: --ha lists every API server for the CLI (kubectl's config keeps
        // the first: it takes one URL); machines are reached through the forwarder.
        write_admin_config(plan.cfg, plan.bin_dir, &kubeconfig_path(plan.state))?;
        copy_private(&kubeconfig_path(plan.state), plan.config_file)?;
    } else {
        let admin = plan.cfg.kubeconfig("admin");
        for dest in [plan.config_file.to_path_buf(), kubeconfig_path(plan.state)] {
            copy_private(&admin, &dest)?;
        }
    }
    if let Some(addr) = plan.cfg.registry {
        start_registry(plan, addr, started, signals).await?;
    }
    start_nodes(plan, started)?;
    Ok(())
}

/// `/run/netns/<name>`.
fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// `bin args...`, run inside the namespace `netns` when given (`nsenter --net`): a process
/// of that machine.
fn on_machine(netns: Option<&str>, bin: &Path, args: Vec<OsString>) -> (PathBuf, Vec<OsString>) {
    match netns {
        None => (bin.to_path_buf(), args),
        Some(ns) => {
            let mut all: Vec<OsString> = vec![
                format!("--net={}", netns_path(ns).display()).into(),
                "--".into(),
                bin.into(),
            ];
            all.extend(args);
            (PathBuf::from("nsenter"), all)
        }
    }
}

/// Until a signal: components that crashed are started again (with back-off); the others
/// go on.
async fn watch(running: &mut [Running], signals: &mut Signals) -> Stop {
    loop {
        tokio::select! {
            _ = signals.recv() => return Stop::Signal,
            _ = tokio::time::sleep(POLL * 2) => {}
        }
        if let Err(e) = restart_crashed(running) {
            return Stop::Failed(e);
        }
    }
}

/// Waits until `r` accepts connections on `addr` (dialled from inside `netns` when given),
/// or a signal.
async fn ready(
    r: &mut Running,
    addr: SocketAddr,
    netns: Option<&str>,
    signals: &mut Signals,
) -> Result<(), Stop> {
    let path = netns.map(netns_path);
    tokio::select! {
        res = wait_port(r, addr, path.as_deref()) => res.map_err(Stop::Failed),
        _ = signals.recv() => Err(Stop::Signal),
    }
}

/// --ha: the etcd members (with their PKI), all of them before any is waited for (one alone
/// has no quorum).
async fn start_etcd(
    plan: &StartPlan<'_>,
    started: &mut Started,
    signals: &mut Signals,
) -> Result<(), Stop> {
    let controls = &plan.cfg.controls;
    make_etcd_pki(plan.state, plan.bin_dir, controls)?;
    let members = etcd_members(plan.state, controls);
    for (i, m) in members.iter().enumerate() {
        let log = plan.log_dir.join(format!("{}.log", m.name));
        let dir = &m.data_dir;
        fs::create_dir_all(dir.parent().unwrap_or(dir))
            .with_context(|| format!("creating {}", dir.display()))?;
        let machine = machine_of(plan.cfg, i);
        let (bin, args) = on_machine(
            machine.as_deref(),
            Path::new("etcd"),
            etcd_args(plan.state, controls, m),
        );
        let r = spawn_process(plan.root, &bin, m.name.clone(), &args, &[], &log, false)?;
        started.push(r, "");
    }
    let first = started.running.len() - members.len();
    for (i, (r, m)) in started.running[first..]
        .iter_mut()
        .zip(&members)
        .enumerate()
    {
        let addr = SocketAddr::new(m.ip, m.client_port);
        let machine = machine_of(plan.cfg, i);
        ready(r, addr, machine.as_deref(), signals).await?;
        println!("{} is accepting connections on {addr}", m.name);
    }
    Ok(())
}

/// The control machine component instance `i` runs on (`None`: the host).
fn machine_of(cfg: &UpConfig, i: usize) -> Option<String> {
    (!cfg.controls.is_empty()).then(|| control_netns(i, cfg.controls.len()))
}

/// `skiff-vip` on every control machine, each with the identity `system:skiff-vip` (a
/// kubeconfig written for it) and its own API server to watch.
fn start_vips(plan: &StartPlan<'_>, started: &mut Started) -> Result<(), Stop> {
    let kubeconfig = plan.cfg.kubeconfig("vip");
    files::write_kubeconfig(
        plan.cfg,
        plan.bin_dir,
        "system:skiff-vip",
        "system:skiff-vips",
        &kubeconfig,
    )?;
    for i in 0..plan.cfg.instances() {
        let Some(args) = plan::vip_args(plan.cfg, i) else {
            continue;
        };
        let name = format!("vip-{}", i + 1);
        let log = plan.log_dir.join(format!("{name}.log"));
        let machine = machine_of(plan.cfg, usize::from(i));
        let (bin, args) = on_machine(machine.as_deref(), &plan.bin_dir.join(VIP_BIN), args);
        let r = spawn_process(plan.root, &bin, name, &args, &[], &log, false)?;
        started.push(
            r,
            ", holding the virtual address while its API server answers",
        );
    }
    Ok(())
}

/// The control plane, each instance of each component; API servers are waited for.
async fn start_components(
    plan: &StartPlan<'_>,
    started: &mut Started,
    signals: &mut Signals,
) -> Result<(), Stop> {
    for c in plan.components {
        for i in 0..plan.cfg.instances() {
            let name = if plan.cfg.ha {
                format!("{}-{}", c.name, i + 1)
            } else {
                c.name.to_string()
            };
            let log = plan.log_dir.join(format!("{name}.log"));
            let machine = machine_of(plan.cfg, usize::from(i));
            let (bin, args) = on_machine(
                machine.as_deref(),
                &plan.bin_dir.join(c.bin),
                (c.args)(plan.cfg, i),
            );
            let r = spawn_process(plan.root, &bin, name.clone(), &args, &[], &log, false)?;
            started.push(r, machine.as_ref().map_or("", |_| ", on a control machine"));
            if c.readiness == Readiness::ApiPort {
                let addr = plan.cfg.api_addr(i);
                let Some(r) = started.running.last_mut() else {
                    continue;
                };
                ready(r, addr, machine.as_deref(), signals).await?;
                println!("{name} is accepting connections on {addr}");
            }
        }
    }
    Ok(())
}

/// The local registry on `addr`, waited for.
async fn start_registry(
    plan: &StartPlan<'_>,
    addr: SocketAddr,
    started: &mut Started,
    signals: &mut Signals,
) -> Result<(), Stop> {
    let log = plan.log_dir.join("registry.log");
    // On the control machine it listens on the machine's address; the host and every node
    // reach it at `addr` on their own loopback through forwarders.
    let machine = machine_of(plan.cfg, 0);
    let serve = match plan.cfg.controls.first() {
        Some(ip) => SocketAddr::new(*ip, addr.port()),
        None => addr,
    };
    let config = registry_config(plan.state, serve)?;
    let (bin, args) = on_machine(
        machine.as_deref(),
        Path::new(REGISTRY_BIN),
        vec!["serve".into(), config.into_os_string()],
    );
    let r = spawn_process(plan.root, &bin, "registry".into(), &args, &[], &log, false)?;
    started.push(r, "");
    let Some(r) = started.running.last_mut() else {
        return Err(Stop::Failed(anyhow!("the registry did not start")));
    };
    ready(r, serve, machine.as_deref(), signals).await?;
    if let Some(ns) = machine {
        started.forwarders.push(skiff_testnet::Forwarder::between(
            None,
            addr,
            &netns_path(&ns),
            serve,
        )?);
    }
    Ok(())
}

/// The fabric and the node agents, each in its namespace. With the controller manager (it
/// signs the nodes' certificate requests) the nodes join with a bootstrap token; without it
/// (or with --ha: `skiff-node join` takes one server) they get kubeconfigs written for them.
fn start_nodes(plan: &StartPlan<'_>, started: &mut Started) -> Result<(), Stop> {
    if plan.nodes.is_empty() {
        return Ok(());
    }
    if started.fabric.is_none() {
        started.fabric = Some(prepare_fabric()?);
    }
    let signs = plan
        .components
        .iter()
        .any(|c| c.bin == "skiff-controller-manager");
    let mut token = String::new();
    let how = if signs && (!plan.cfg.ha || plan.cfg.vip.is_some()) {
        let cli = plan.cli_bin.context("the CLI was not built")?;
        let (t, ca_cert_hash) = join_token(&plan.bin_dir.join(cli), &kubeconfig_path(plan.state))?;
        token = t;
        NodeCredentials::Join { ca_cert_hash }
    } else {
        NodeCredentials::Kubeconfig
    };
    for (i, node) in plan.nodes.iter().enumerate() {
        let log = plan.log_dir.join(format!("{}.log", node.name));
        let host = u8::try_from(i + 1).unwrap_or(u8::MAX);
        let Some(fabric) = &started.fabric else { break };
        let ns = prepare_node_netns(fabric, node, host)?;
        started.node_nets.push(ns);
        let machine = (!plan.cfg.controls.is_empty()).then_some(node.netns.as_str());
        // The registry at the same loopback address on this machine as on the host.
        if let (Some(ns), Some(control), Some(addr)) = (
            machine,
            plan.cfg.controls.first().copied(),
            plan.cfg.registry,
        ) {
            started.forwarders.push(skiff_testnet::Forwarder::between(
                Some(&netns_path(ns)),
                addr,
                &netns_path(ns),
                SocketAddr::new(control, addr.port()),
            )?);
        }
        let env: &[(&str, &str)] = match &how {
            NodeCredentials::Kubeconfig => {
                write_node_kubeconfig(plan.cfg, plan.bin_dir, node)?;
                &[]
            }
            NodeCredentials::Join { .. } => {
                fs::create_dir_all(&node.state_dir)
                    .with_context(|| format!("creating {}", node.state_dir.display()))?;
                // A node without its credentials joins afresh: an earlier run's Node of
                // the same name goes first.
                if !plan::node_kubeconfig(node).exists()
                    && let Some(cli) = plan.cli_bin
                {
                    forget_node(
                        &plan.bin_dir.join(cli),
                        &kubeconfig_path(plan.state),
                        &node.name,
                    )?;
                }
                &[("SKIFF_JOIN_TOKEN", token.as_str())]
            }
        };
        let (bin, args) = on_machine(
            machine,
            &plan.bin_dir.join("skiff-node"),
            node_args(plan.cfg, node, &how),
        );
        let r = spawn_process(plan.root, &bin, node.name.clone(), &args, env, &log, false)?;
        let what = format!(", netns {}, pods {}", node.netns, node.pod_cidr);
        started.push(r, &what);
    }
    Ok(())
}

fn print_banner(plan: &StartPlan<'_>) {
    let url = plan.cfg.host_urls();
    println!();
    println!("Skiff control plane is up");
    println!("  api server: {url}");
    let machines = plan.cfg.controls.len();
    for (i, control) in plan.cfg.controls.iter().enumerate() {
        println!(
            "  control:    machine netns {}, address {control}, API server on {}",
            control_netns(i, machines),
            plan.cfg.api_addr(u16::try_from(i).unwrap_or(u16::MAX))
        );
    }
    if let Some(vip) = plan.cfg.vip {
        println!(
            "  address:    {vip} (virtual: one healthy control machine holds it; agents and the host's forwarder use it)"
        );
    }
    if plan.cfg.ha {
        println!(
            "  ha:         {n} etcd members, {n} API servers, {n} schedulers and {n} controller managers (leader election)",
            n = HA_REPLICAS
        );
    }
    match &plan.cfg.store {
        ApiStore::Embedded { data_dir } => {
            println!("  store:      embedded, {}", data_dir.display())
        }
        ApiStore::Etcd { endpoints, .. } => println!("  store:      etcd at {endpoints}"),
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
    println!("  kubeconfig: {}", kubeconfig_path(plan.state).display());
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
        kubeconfig_path(plan.state).display()
    );
    println!("  kubectl get nodes -o wide");
    println!();
    println!("Press Ctrl-C to stop.");
}
