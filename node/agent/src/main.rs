//! `skiff-node`: the node agent (`run`), the container shim it starts (`shim`), a host
//! check (`check-host`), and the node's image store (`image pull|ls|rm`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "skiff-node", about = "Skiff node agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reports what this host offers the agent: cgroup v2 mount and controllers, bpffs, BTF.
    CheckHost,
    /// Runs the agent: registers the node and runs the pods bound to it.
    Run(Box<RunArgs>),
    /// Joins a cluster with a bootstrap token, then runs the agent: the cluster CA is pinned
    /// by --ca-cert-hash, a client certificate for system:node:<name> is asked for with a
    /// CertificateSigningRequest and written to a kubeconfig (<state-dir>/kubelet.kubeconfig
    /// unless --kubeconfig says where) once the controller manager signs it.
    Join(Box<JoinArgs>),
    /// Stops and removes every pod this node ran, its cgroups, pinned maps and state
    /// directory (for tearing down a local cluster; the agent must not be running).
    Purge(PurgeArgs),
    /// Pulls, lists and forgets images in the node's image store (as crictl does).
    #[command(subcommand)]
    Image(ImageCommand),
    /// Internal: supervises one container (started by the agent), or runs one command
    /// inside a running container (`--join-pid`, for exec probes).
    #[command(hide = true)]
    Shim(Box<skiff_runtime::shim::ShimArgs>),
}

/// Parses `10s`, `500ms`, `2m` or a plain number of seconds.
fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 10s, 500ms or 2m"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{s:?}: unknown unit {unit:?} (use ms, s or m)")),
    }
}

/// `--node-labels`: `k=v,k2=v2` (the API server validates keys and values at registration).
fn node_labels(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(format!("{p:?} is not a label like key=value")),
        })
        .collect()
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The API server URL, or a comma-separated list of API servers to fail over between
    /// (default: SKIFF_SERVER, then the kubeconfig's); `join` takes one URL, and pods reach
    /// the first through the `kubernetes` Service.
    #[arg(long)]
    server: Option<String>,
    /// The kubeconfig to use (default: $SKIFF_CONFIG, then ~/.config/skiff/config.yaml):
    /// the server, the CA to trust and the client certificate or token.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<std::path::PathBuf>,
    /// This node's name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// Where runtime state, IP allocations and container logs live
    /// (default: /var/lib/skiff/<node>).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// The node's network namespace (e.g. /run/netns/skiff-node-1); default: the agent's own.
    #[arg(long)]
    node_netns: Option<PathBuf>,
    /// A registry pulled from over plain HTTP (`host:port`); repeatable. Registries on
    /// loopback always are, as Docker treats them.
    #[arg(long = "plain-http-registry", value_name = "HOST:PORT")]
    plain_http_registries: Vec<String>,
    /// How often the node's client certificate (in its kubeconfig) is checked; within 90 days
    /// of expiry it is renewed through a CertificateSigningRequest and the agent starts again
    /// with it (its pods keep running and are adopted), as the kubelet rotates its
    /// certificate.
    #[arg(long, value_parser = duration, default_value = "60m")]
    cert_check_interval: Duration,
    /// Registry credentials: a Docker config.json (`docker login`, `skopeo login
    /// --authfile`), read at every pull (default: <state-dir>/config.json).
    #[arg(long, value_name = "FILE")]
    registry_config: Option<PathBuf>,
    /// Disk usage (percent) of the image store's file system above which unused images are
    /// removed, least recently used first.
    #[arg(long, default_value_t = 85, value_parser = clap::value_parser!(u8).range(1..=100))]
    image_gc_high_threshold: u8,
    /// Disk usage (percent) image garbage collection frees down to.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u8).range(0..=100))]
    image_gc_low_threshold: u8,
    /// Unused images older than this are removed whatever the disk usage (0 = never).
    #[arg(long, value_parser = duration, default_value = "0s")]
    image_maximum_gc_age: Duration,
    /// How often images are garbage-collected.
    #[arg(long, value_parser = duration, default_value = "5m")]
    image_gc_period: Duration,
    /// This node's pod CIDR, registered as Node.spec.podCIDR when the Node has none. Without
    /// it the agent waits for the controller manager's node IPAM to assign one.
    #[arg(long)]
    pod_cidr: Option<String>,
    /// Labels for the Node at registration: `key=value` pairs separated by commas (added to
    /// an existing Node's labels; existing keys are overwritten).
    #[arg(long, value_parser = node_labels, default_value = "")]
    node_labels: std::collections::BTreeMap<String, String>,
    /// Parent cgroup of this node's pods (default: <cgroup v2 root>/skiff/<node>).
    #[arg(long)]
    cgroup_parent: Option<PathBuf>,
    /// Lease duration; the lease is renewed every quarter of it.
    #[arg(long, value_parser = duration, default_value = "40s")]
    lease_duration: Duration,
    /// First crash-loop back-off (doubles up to 5 minutes).
    #[arg(long, value_parser = duration, default_value = "10s")]
    backoff: Duration,
    /// Node status refresh interval.
    #[arg(long, value_parser = duration, default_value = "60s")]
    status_interval: Duration,
    /// Do not load the eBPF per-pod traffic accounting.
    #[arg(long)]
    no_accounting: bool,
    /// Do not load the eBPF Service load balancer (ClusterIP Services then do not work from
    /// this node's pods).
    #[arg(long)]
    no_service_lb: bool,
    /// Do not enforce NetworkPolicies (the eBPF policy programs are detached; every pod may
    /// talk to every other, as without policies).
    #[arg(long)]
    no_network_policy: bool,
    /// Capacity of the Service load balancer's frontend map (Service ports), used when the
    /// maps are created (pinned maps keep their size until `skiff-node purge`).
    #[arg(long, default_value_t = skiff_datapath::lb::LbConfig::default().max_services,
          value_parser = clap::value_parser!(u32).range(1..))]
    lb_max_services: u32,
    /// Capacity of the Service load balancer's backend maps (backends over all Services).
    #[arg(long, default_value_t = skiff_datapath::lb::LbConfig::default().max_backends,
          value_parser = clap::value_parser!(u32).range(1..))]
    lb_max_backends: u32,
    /// Size of each NodePort Service's Maglev table (the consistent-hash table that picks the
    /// backend of a new NodePort flow): a prime up to 16381; larger tables spread more evenly
    /// over many backends (about 4 bytes per entry per NodePort Service port).
    #[arg(long, default_value_t = skiff_datapath::lb::LbConfig::default().maglev_table_size,
          value_parser = maglev_table_size)]
    lb_maglev_table_size: u32,
    /// Log every translation of the eBPF Service load balancer (socket connect/sendmsg
    /// rewrites, NodePort new flows) at debug level (tracing target `skiff_lb`; enable with
    /// e.g. RUST_LOG=info,skiff_lb=debug). Off by default: then it costs the data path nothing.
    #[arg(long)]
    bpf_debug: bool,
    /// The address the agent's HTTP API (logs, exec, port-forward, stats) listens on
    /// (default: the node's InternalIP, the first global IPv4 address of its network
    /// namespace). There it serves a certificate of the cluster CA for the node's addresses,
    /// asked for through a CertificateSigningRequest (signer kubernetes.io/kubelet-serving).
    /// The API server dials the Node's addresses, so an address it does not publish (a
    /// loopback one, say) leaves the node without logs, exec and port-forward.
    #[arg(long)]
    address: Option<std::net::IpAddr>,
    /// The port of that API (0 picks a free one); published in the Node's
    /// status.daemonEndpoints.kubeletEndpoint.Port.
    #[arg(long, default_value_t = skiff_node::DEFAULT_API_PORT)]
    port: u16,
    /// The port on the node's InternalIP (in its network namespace) where the agent carries
    /// pods' connections to the API server; the `kubernetes` Service (10.96.0.1:443) is
    /// sent there. 0 turns it off (pods then use the Service's Endpoints as they are).
    #[arg(long, default_value_t = skiff_node::DEFAULT_API_SERVER_PROXY_PORT)]
    apiserver_proxy_port: u16,
    /// The cluster DNS address written into pods' resolv.conf (dnsPolicy ClusterFirst): the
    /// kube-dns Service's clusterIP. Empty: pods use the node's resolvers.
    #[arg(long, default_value = "10.96.0.10")]
    cluster_dns: String,
    /// The cluster domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// The port of the agent's DNS server on the node's InternalIP (kube-dns is sent there;
    /// 0 turns it off).
    #[arg(long, default_value_t = skiff_node::DEFAULT_DNS_PORT)]
    dns_port: u16,
    /// Resolvers for names outside the cluster, `IP[:PORT]` (repeatable or comma
    /// separated; default: the nameservers of /etc/resolv.conf).
    #[arg(long, value_delimiter = ',', value_parser = dns_upstream)]
    dns_upstream: Vec<std::net::SocketAddr>,
}

/// `--dns-upstream`: `IP` (port 53) or `IP:PORT`.
fn dns_upstream(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse::<std::net::SocketAddr>()
        .or_else(|_| {
            s.parse::<std::net::IpAddr>()
                .map(|ip| std::net::SocketAddr::new(ip, 53))
        })
        .map_err(|_| format!("{s:?} is not an address or address:port"))
}

#[derive(Args, Debug)]
struct JoinArgs {
    /// The bootstrap token, `<id>.<secret>` (`skiff token create` makes one); read from
    /// $SKIFF_JOIN_TOKEN when not given (keeps it out of the process list).
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// The cluster CA's public key hash, `sha256:<hex>` (`skiff token create` prints it):
    /// the server must present this CA before the token is sent.
    #[arg(long, value_name = "sha256:HEX")]
    ca_cert_hash: String,
    /// How long to wait for the controller manager to sign the certificate.
    #[arg(long, value_parser = duration, default_value = "5m")]
    join_timeout: Duration,
    /// Everything `run` takes (--server is required).
    #[command(flatten)]
    run: RunArgs,
}

fn join(mut args: JoinArgs) -> anyhow::Result<()> {
    skiff_client::init_logging();
    let server = args
        .run
        .server
        .clone()
        .context("--server is required: the API server's https:// URL")?;
    let token = match args.token.take() {
        Some(t) => t,
        None => std::env::var("SKIFF_JOIN_TOKEN")
            .context("--token (or $SKIFF_JOIN_TOKEN) is required: a bootstrap token")?,
    };
    let node = args.run.node_name.clone().unwrap_or_else(hostname);
    let kubeconfig = args
        .run
        .kubeconfig
        .clone()
        .unwrap_or_else(|| state_dir_of(&args.run.state_dir, &node).join("kubelet.kubeconfig"));
    let opts = skiff_node::join::JoinOptions {
        server,
        token,
        ca_cert_hash: args.ca_cert_hash.clone(),
        node_name: node.clone(),
        kubeconfig: kubeconfig.clone(),
        timeout: args.join_timeout,
    };
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let joined = rt
        .block_on(skiff_node::join::join(&opts))
        .with_context(|| format!("joining {} as node {node}", opts.server))?;
    drop(rt);
    tracing::info!(?joined, kubeconfig = %kubeconfig.display(), "joined; starting the agent");
    args.run.kubeconfig = Some(kubeconfig);
    args.run.server = None;
    args.run.node_name = Some(node);
    run_agent(args.run)
}

fn state_dir_of(state_dir: &Option<PathBuf>, node: &str) -> PathBuf {
    state_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/lib/skiff").join(node))
}

/// `--lb-maglev-table-size`: a prime in range.
fn maglev_table_size(s: &str) -> Result<u32, String> {
    let m: u32 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    skiff_datapath::lb::maglev::check_table_size(m).map_err(|e| e.to_string())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "node".into())
}

/// The agent's configuration from its command line.
fn agent_config(args: &RunArgs, node: &str) -> anyhow::Result<skiff_node::AgentConfig> {
    let shim = std::env::current_exe().context("locating the skiff-node binary for the shim")?;
    let state_dir = state_dir_of(&args.state_dir, node);
    let mut cfg = skiff_node::AgentConfig::new(node, state_dir, shim);
    cfg.node_netns = args.node_netns.clone();
    cfg.plain_http_registries = args.plain_http_registries.clone();
    cfg.registry_config = args.registry_config.clone();
    if args.image_gc_low_threshold >= args.image_gc_high_threshold {
        anyhow::bail!(
            "--image-gc-low-threshold ({}) must be lower than --image-gc-high-threshold ({})",
            args.image_gc_low_threshold,
            args.image_gc_high_threshold
        );
    }
    cfg.image_gc = skiff_image::gc::GcPolicy {
        high_percent: args.image_gc_high_threshold,
        low_percent: args.image_gc_low_threshold,
        max_unused_age: (!args.image_maximum_gc_age.is_zero()).then_some(args.image_maximum_gc_age),
    };
    cfg.image_gc_period = args.image_gc_period;
    cfg.pod_cidr = args.pod_cidr.clone();
    cfg.node_labels = args.node_labels.clone();
    cfg.cgroup_parent = args.cgroup_parent.clone();
    cfg.lease_duration = args.lease_duration;
    cfg.lease_renew = args.lease_duration / 4;
    cfg.backoff_initial = args.backoff;
    cfg.status_interval = args.status_interval;
    cfg.accounting = !args.no_accounting;
    cfg.service_lb = !args.no_service_lb;
    cfg.network_policy = !args.no_network_policy;
    cfg.lb.max_services = args.lb_max_services;
    cfg.lb.max_backends = args.lb_max_backends;
    cfg.lb.maglev_table_size = args.lb_maglev_table_size;
    cfg.lb.debug = args.bpf_debug;
    cfg.api_address = args.address;
    cfg.api_port = args.port;
    cfg.api_server_proxy_port = args.apiserver_proxy_port;
    cfg.cluster_dns = if args.cluster_dns.is_empty() {
        None
    } else {
        Some(
            args.cluster_dns
                .parse()
                .with_context(|| format!("--cluster-dns {:?}", args.cluster_dns))?,
        )
    };
    cfg.cluster_domain = args.cluster_domain.trim_matches('.').to_string();
    cfg.dns_port = args.dns_port;
    cfg.dns_upstream = (!args.dns_upstream.is_empty()).then(|| args.dns_upstream.clone());
    Ok(cfg)
}

fn run_agent(args: RunArgs) -> anyhow::Result<()> {
    skiff_client::init_logging();
    let node = args.node_name.clone().unwrap_or_else(hostname);
    let mut cfg = agent_config(&args, &node)?;
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let renewed = rt.block_on(async move {
        let config =
            skiff_client::ClientConfig::load(args.server.as_deref(), args.kubeconfig.as_deref())?;
        let client = skiff_client::Client::connect_lazy_with(&config)?;
        cfg.api_server_url = Some(config.endpoints().join(","));
        // Without a client certificate the agent cannot be reached as itself anyway; with
        // one, its API requires certificates of the same CA.
        cfg.client_ca_pem = config.ca_pem.clone().filter(|_| config.identity.is_some());
        // A client certificate of a kubeconfig file is renewed when due.
        let renewable = config
            .kubeconfig
            .clone()
            .filter(|_| config.identity.is_some());
        let renewed = std::sync::atomic::AtomicBool::new(false);
        let shutdown = async {
            let renewal = async {
                match &renewable {
                    Some(path) => {
                        skiff_node::join::renew_when_due(
                            &client,
                            path,
                            &node,
                            args.cert_check_interval,
                        )
                        .await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = skiff_client::controller::terminated() => if let Err(e) = r {
                    tracing::error!(error = %e, "cannot watch for SIGTERM/SIGINT; stopping");
                },
                () = renewal => {
                    tracing::info!("starting again with the renewed certificate");
                    renewed.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        };
        skiff_node::run(cfg, client.clone(), shutdown)
            .await
            .with_context(|| format!("node agent {node}"))?;
        anyhow::Ok(renewed.load(std::sync::atomic::Ordering::SeqCst))
    })?;
    if renewed {
        // The same command line in this process (the pid stays, pods are adopted as after
        // any agent restart); it reads the renewed kubeconfig. Returns only on failure.
        use std::os::unix::process::CommandExt as _;
        let e = std::process::Command::new("/proc/self/exe")
            .args(std::env::args_os().skip(1))
            .exec();
        return Err(e).context("starting the agent again with the renewed certificate");
    }
    Ok(())
}

#[derive(Args, Debug)]
struct PurgeArgs {
    /// The node's name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// The agent's state directory (default: /var/lib/skiff/<node>).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// The agent's pod cgroup parent (default: <cgroup v2 root>/skiff/<node>).
    #[arg(long)]
    cgroup_parent: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum ImageCommand {
    /// Pulls an image from its registry into the node's store and unpacks its layers.
    Pull(ImagePullArgs),
    /// Lists the images this node has pulled.
    Ls(ImageStoreArgs),
    /// Forgets an image name (its layers stay until image garbage collection).
    Rm {
        #[command(flatten)]
        store: ImageStoreArgs,
        /// The name as it was pulled.
        name: String,
    },
}

#[derive(Args, Debug)]
struct ImageStoreArgs {
    /// The node's name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// The agent's state directory (default: /var/lib/skiff/<node>); images live in its
    /// `images/` directory.
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

impl ImageStoreArgs {
    fn open(&self) -> anyhow::Result<skiff_image::ImageStore> {
        let state = match &self.state_dir {
            Some(d) => d.clone(),
            None => PathBuf::from("/var/lib/skiff")
                .join(self.node_name.clone().unwrap_or_else(hostname)),
        };
        let root = state.join("images");
        skiff_image::ImageStore::open(&root)
            .with_context(|| format!("opening the image store in {}", root.display()))
    }
}

#[derive(Args, Debug)]
struct ImagePullArgs {
    #[command(flatten)]
    store: ImageStoreArgs,
    /// `registry/repository:tag` or `registry/repository@sha256:...`.
    name: String,
    /// A registry spoken to over plain HTTP (`host:port`, e.g. a local registry); repeatable.
    #[arg(long = "plain-http", value_name = "HOST:PORT")]
    plain_http: Vec<String>,
    /// A user name for the registry; the password is read from the first line of stdin
    /// (never from the command line).
    #[arg(long, conflicts_with = "registry_config")]
    username: Option<String>,
    /// Registry credentials from a Docker config.json (what `docker login` writes).
    #[arg(long, value_name = "FILE")]
    registry_config: Option<PathBuf>,
}

fn image(cmd: ImageCommand) -> anyhow::Result<()> {
    match cmd {
        ImageCommand::Pull(args) => {
            let store = args.store.open()?;
            let credentials = match &args.username {
                Some(user) => {
                    let mut password = String::new();
                    std::io::stdin()
                        .read_line(&mut password)
                        .context("reading the registry password from stdin")?;
                    Some(skiff_image::pull::Credentials {
                        username: user.clone(),
                        password: password.trim_end_matches(['\r', '\n']).to_string(),
                    })
                }
                None => None,
            };
            let auths = match &args.registry_config {
                Some(path) => skiff_image::auth::RegistryAuths::load(path)?,
                None => Default::default(),
            };
            let puller = skiff_image::pull::Puller::new(store.blobs.clone(), &args.plain_http);
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            let pulled = rt
                .block_on(async {
                    match &credentials {
                        Some(c) => puller.pull(&args.name, Some(c)).await,
                        None => puller.pull_with(&args.name, &auths).await,
                    }
                })
                .with_context(|| format!("pulling {}", args.name))?;
            let dirs = pulled
                .unpack(&store.blobs, &store.layers)
                .with_context(|| format!("unpacking {}", args.name))?;
            let record = store.remember(&args.name, &pulled)?;
            println!("pulled {}", record.name);
            println!("digest {}", record.digest);
            println!("size   {} bytes in {} layers", record.size, dirs.len());
        }
        ImageCommand::Ls(args) => {
            let list = args.open()?.list()?;
            println!("{:<50} {:<19} {:>12}", "IMAGE", "DIGEST", "SIZE");
            for r in list {
                let short = r.digest.trim_start_matches("sha256:");
                println!(
                    "{:<50} {:<19} {:>12}",
                    r.name,
                    format!("sha256:{}", &short[..short.len().min(12)]),
                    r.size
                );
            }
        }
        ImageCommand::Rm { store, name } => {
            if !store.open()?.forget(&name)? {
                anyhow::bail!("no image named {name:?} on this node (see `skiff-node image ls`)");
            }
            println!("forgot {name}");
        }
    }
    Ok(())
}

fn purge(args: PurgeArgs) -> anyhow::Result<()> {
    skiff_client::init_logging();
    let node = args.node_name.unwrap_or_else(hostname);
    let cgroup_parent = match args.cgroup_parent {
        Some(p) => p,
        None => skiff_runtime::host::cgroup2_mount()
            .context("finding the cgroup v2 mount")?
            .join("skiff")
            .join(&node),
    };
    let cfg = skiff_node::purge::PurgeConfig {
        state_dir: args
            .state_dir
            .unwrap_or_else(|| PathBuf::from("/var/lib/skiff").join(&node)),
        cgroup_parent,
        shim_path: std::env::current_exe().context("locating the skiff-node binary")?,
        grace: Duration::from_secs(5),
        node_name: node.clone(),
    };
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(skiff_node::purge::purge(&cfg))
        .with_context(|| format!("purging node {node}"))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run_agent(*args)?,
        Command::Join(args) => join(*args)?,
        Command::Purge(args) => purge(args)?,
        Command::Image(cmd) => image(cmd)?,
        // The shim must stay single-threaded until it forks: nothing else runs before it.
        Command::Shim(args) => std::process::exit(skiff_runtime::shim::run(*args)),
        Command::CheckHost => {
            let r = skiff_runtime::host::report().context("inspecting the host")?;
            println!("cgroup v2 root:      {}", r.cgroup2_root.display());
            println!("v2 controllers:      {}", r.controllers.join(" "));
            if r.missing_controllers.is_empty() {
                println!("missing controllers: none");
            } else {
                println!(
                    "missing controllers: {} (pod limits for these will be reported as not enforced)",
                    r.missing_controllers.join(" ")
                );
            }
            println!("bpffs mounted:       {}", r.bpffs_mounted);
            println!("kernel BTF:          {}", r.btf_available);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration("7"), Ok(Duration::from_secs(7)));
        assert!(duration("soon").is_err());
        assert!(duration("5h").is_err());
    }

    #[test]
    fn lb_sizes_have_defaults_and_must_be_positive() {
        let run = |extra: &[&str]| {
            Cli::try_parse_from(["skiff-node", "run"].iter().chain(extra)).map(|c| {
                match c.command {
                    Command::Run(a) => (a.lb_max_services, a.lb_max_backends, a.no_service_lb),
                    _ => unreachable!(),
                }
            })
        };
        assert_eq!(run(&[]).unwrap(), (65536, 65536, false));
        assert_eq!(
            run(&[
                "--lb-max-services",
                "10",
                "--lb-max-backends=20",
                "--no-service-lb"
            ])
            .unwrap(),
            (10, 20, true)
        );
        let err = run(&["--lb-max-services", "0"]).unwrap_err().to_string();
        assert!(err.contains("--lb-max-services"), "{err}");
    }

    #[test]
    fn the_certificate_is_checked_hourly_by_default() {
        let c = Cli::try_parse_from(["skiff-node", "run"]).unwrap();
        let Command::Run(a) = c.command else {
            unreachable!()
        };
        assert_eq!(a.cert_check_interval, Duration::from_secs(3600));
    }

    #[test]
    fn parses_node_labels() {
        assert_eq!(node_labels(""), Ok(Default::default()));
        let l = node_labels("disk=ssd, zone=a,empty=").expect("valid");
        assert_eq!(l.get("disk").map(String::as_str), Some("ssd"));
        assert_eq!(l.get("zone").map(String::as_str), Some("a"));
        assert_eq!(l.get("empty").map(String::as_str), Some(""));
        assert!(node_labels("disk").unwrap_err().contains("\"disk\""));
        assert!(node_labels("=x").is_err());
    }
}
