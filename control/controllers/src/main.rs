//! `skiff-controller-manager`: runs the controllers (ReplicaSet, Deployment, Endpoints, the
//! Service allocator, node IPAM, garbage collector, namespace, node lifecycle) against a
//! Skiff API server, with leader election so several replicas can run with one active.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{ArgAction, Parser};
use skiff_client::controller::LeaderElectionConfig;
use skiff_client::{Client, ClientConfig};
use skiff_controllers::manager::{self, COMPONENT, ManagerConfig, parse_controllers};
use skiff_controllers::nodelifecycle::NodeLifecycleConfig;
use skiff_controllers::ranges::{Ipv4Cidr, PortRange};

#[derive(Debug, Parser)]
#[command(name = "skiff-controller-manager", version, about)]
struct Args {
    /// API server URL, or a comma-separated list of API servers to fail over between
    /// [default: $SKIFF_SERVER, then the kubeconfig's].
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// The kubeconfig to use (default: $SKIFF_CONFIG, then ~/.config/skiff/config.yaml):
    /// the server, the CA to trust and the client certificate or token.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<std::path::PathBuf>,
    /// Controllers to run: names separated by commas, `*` for all, `-name` to switch one off
    /// (known: replicaset, deployment, endpoints, service-allocator, nodeipam,
    /// garbagecollector, namespace, nodelifecycle, serviceaccount, certificatesigningrequest,
    /// root-ca-cert-publisher).
    #[arg(long, value_name = "LIST", default_value = "*")]
    controllers: String,
    /// Run the controllers only while holding the leader Lease.
    #[arg(long, action = ArgAction::Set, default_value_t = true, value_name = "BOOL")]
    leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, default_value = COMPONENT, value_name = "NAME")]
    lease_name: String,
    /// Namespace of the leader Lease.
    #[arg(long, default_value = "kube-system", value_name = "NS")]
    lease_namespace: String,
    /// Lease duration in seconds (renewal every third of it).
    #[arg(long, default_value_t = 15, value_name = "SECONDS")]
    lease_duration: u64,
    /// This instance's identity [default: HOSTNAME_UUID].
    #[arg(long, value_name = "ID")]
    identity: Option<String>,
    /// Concurrent reconciles per controller.
    #[arg(long, default_value_t = 4, value_name = "N")]
    workers: usize,
    /// IPv4 CIDR Services' clusterIPs are allocated from (prefix length at most 30).
    #[arg(long, default_value = "10.96.0.0/16", value_name = "CIDR")]
    service_cluster_ip_range: Ipv4Cidr,
    /// Port range NodePort Services' nodePorts are allocated from (first-last; the API
    /// server accepts nodePorts within 30000-32767 only).
    #[arg(long, default_value = "30000-32767", value_name = "RANGE")]
    service_node_port_range: PortRange,
    /// IPv4 CIDR Nodes' pod CIDRs are allocated from.
    #[arg(long, default_value = "10.244.0.0/16", value_name = "CIDR")]
    cluster_cidr: Ipv4Cidr,
    /// Prefix length of each Node's pod CIDR (at least that of --cluster-cidr, at most 30).
    #[arg(long, default_value_t = 24, value_name = "BITS")]
    node_cidr_mask_size: u8,
    /// How long a node may go without renewing its Lease (or posting a heartbeat) before the
    /// node lifecycle controller marks it Unknown, taints it and evicts its pods.
    #[arg(long, default_value_t = 20, value_name = "SECONDS")]
    node_monitor_grace_period: u64,
    /// How often the node lifecycle controller looks at every node (at least; also when its
    /// lease would expire).
    #[arg(long, default_value_t = 2, value_name = "SECONDS")]
    node_monitor_period: u64,
    /// The cluster CA's certificate (PEM), with which approved CertificateSigningRequests of
    /// nodes and clients are signed (with --cluster-signing-key-file).
    #[arg(long, value_name = "PATH", requires = "cluster_signing_key_file")]
    cluster_signing_cert_file: Option<std::path::PathBuf>,
    /// The cluster CA's private key (PEM).
    #[arg(long, value_name = "PATH", requires = "cluster_signing_cert_file")]
    cluster_signing_key_file: Option<std::path::PathBuf>,
    /// The CA certificate (PEM) published as the ConfigMap kube-root-ca.crt in every
    /// namespace [default: the CA of the kubeconfig].
    #[arg(long, value_name = "PATH")]
    root_ca_file: Option<std::path::PathBuf>,
    /// Where the default StorageClass (`local-path`, made when the cluster has none) keeps
    /// its volumes on the nodes.
    #[arg(long, value_name = "DIR", default_value = skiff_controllers::volumes::DEFAULT_NODE_PATH)]
    local_path_root: String,
}

fn default_identity() -> String {
    skiff_client::controller::default_identity("skiff", uuid::Uuid::new_v4())
}

async fn run(args: Args) -> Result<()> {
    let controllers = parse_controllers(&args.controllers)
        .map_err(anyhow::Error::msg)
        .context("--controllers")?;
    let node_lifecycle = NodeLifecycleConfig {
        grace_period: Duration::from_secs(args.node_monitor_grace_period),
        monitor_period: Duration::from_secs(args.node_monitor_period),
        ..NodeLifecycleConfig::default()
    };
    node_lifecycle.validate()?;
    let signing_ca = match (
        &args.cluster_signing_cert_file,
        &args.cluster_signing_key_file,
    ) {
        (Some(cert), Some(key)) => {
            let read = |p: &std::path::Path| {
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
            };
            let ca = skiff_pki::Ca::from_pem(&read(cert)?, &read(key)?)
                .context("--cluster-signing-cert-file/--cluster-signing-key-file")?;
            Some(std::sync::Arc::new(ca))
        }
        _ => None,
    };
    let identity = args.identity.unwrap_or_else(default_identity);
    let config = ClientConfig::load(args.server.as_deref(), args.kubeconfig.as_deref())?;
    let client = Client::connect_lazy_with(&config)?;
    let root_ca_pem = match &args.root_ca_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading --root-ca-file {}", p.display()))?,
        ),
        None => config.ca_pem.clone(),
    }
    .map(std::sync::Arc::<str>::from);
    let leader_election = args.leader_elect.then(|| {
        LeaderElectionConfig::new(&args.lease_name, &identity)
            .in_namespace(&args.lease_namespace)
            .with_lease_duration(Duration::from_secs(args.lease_duration))
    });
    let manager_config = ManagerConfig {
        controllers,
        workers: args.workers.max(1),
        identity: identity.clone(),
        leader_election,
        service_cluster_ip_range: args.service_cluster_ip_range,
        service_node_port_range: args.service_node_port_range,
        cluster_cidr: args.cluster_cidr,
        node_cidr_mask_size: args.node_cidr_mask_size,
        node_lifecycle,
        signing_ca,
        root_ca_pem,
        local_path_root: args.local_path_root,
    };
    manager_config
        .service_ranges()
        .context("--service-cluster-ip-range")?;
    manager_config
        .pod_cidr_blocks()
        .context("--node-cidr-mask-size")?;
    tracing::info!(server = %config.server, %identity,
        controllers = ?manager_config.controllers.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
        leader_elect = args.leader_elect, "starting");
    let shutdown = skiff_client::controller::cancelled_on_termination();
    manager::run(client, manager_config, shutdown).await?;
    Ok(())
}

fn main() -> ExitCode {
    skiff_client::init_logging();
    let args = Args::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("skiff-controller-manager: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skiff-controller-manager: {e:#}");
            ExitCode::FAILURE
        }
    }
}
