//! The node agent: registers the Node, renews its Lease, and runs the pods bound to it.
//!
//! Observation is watch-driven: a reflector on the pods whose `spec.nodeName` is this node
//! feeds one [`worker::Worker`] per pod, and the runtime's exit notifications wake the
//! worker of the pod concerned. Each worker converges its pod level-triggered: sandbox,
//! device confinement, network, data path, volumes, images, containers per restart policy
//! with crash-loop back-off, startup/liveness/readiness probes (`probe`; network probes
//! connect from inside the pod's namespace), status written only when it changes (`status`,
//! compared with the API's copy, so a change by someone else is corrected). A container's
//! environment (`envvars`, then `envFrom` Secrets, then `env` with `valueFrom`) is read
//! through the API when it starts; its securityContext becomes the runtime's confinement
//! (`security`). A pod with a `deletionTimestamp` is stopped (SIGTERM, grace, kill), its
//! network, cgroups and counters released, and the delete finished with grace 0. Events
//! (Started, Failed, BackOff, Unhealthy, Killing) go through the shared `EventRecorder` as
//! component `skiff-node`.
//!
//! The agent talks only to the API server (through `skiff-client`). It keeps the pods running
//! when it exits: a restarted agent adopts them (same processes) through the runtime's
//! on-disk state, takes restart counts from the API and resumes their status updates.
//!
//! It also serves a small HTTP API ([`api`]: logs, stats, exec, port forwarding, the data
//! path's maps, flow records, metrics) that changes no cluster state, on loopback by default,
//! and publishes its port in the Node's `status.daemonEndpoints.kubeletEndpoint.Port`.
//!
//! Layers: the agent holds the runtime, the pod network and the data path behind their traits
//! (`Arc<dyn Runtime>`, `Arc<dyn PodNetwork>`, the proxy's `Box<dyn LbDatapath>`), so the pod
//! worker and the Service reconciler are unit-tested on the layers' in-memory fakes
//! (`worker/fake_tests.rs`, `proxy/fake_tests.rs`) without root; the kernel tests next to them
//! use the real layers. Other parts: `join` (joining with a bootstrap token, certificate
//! renewal), `node` (the Node and its Lease), [`netpol`] (NetworkPolicy enforcement and flow
//! records), [`routes`] (other nodes' pod CIDRs), [`dns`] (cluster DNS), `apiproxy` (the
//! node's passthrough to the API server), `images` and `volumes`, `metrics`, [`purge`].
//!
//! The agent process stays in the namespace it was started in (normally the root one, where
//! the API server is on loopback); the node's own network is the namespace `--node-netns`
//! names. It never talks to the Store, touches cgroup v1 hierarchies, moves a tokio worker
//! thread into another namespace, or reaches a layer's internals past its trait.
//!
//! Service load balancing ([`proxy`]): the socket LB programs are attached to the node's pod
//! cgroup parent next to the accounting programs, and a controller on the shared runtime
//! programs them from Services and Endpoints. If they cannot be loaded the agent still runs
//! pods; it warns, reports `ServiceLoadBalancerReady=False` on its Node, and detaches programs
//! an earlier agent left attached (their maps would go stale); likewise with
//! `--no-service-lb`.
//!
//! LoadBalancer addresses on bare metal ([`l2`]): the agent takes part in one Lease election
//! per address of the Services' `status.loadBalancer.ingress`, and while it holds one, the
//! tc program on the uplink answers ARP for that address (the load balancer serves it on
//! every node).
//!
//! Pod networking fast path: the same object's tc program runs on the uplink and on every
//! pod's host veth; a pod worker connects its pod through `PodDatapath::attach_pod` right
//! after the pod's network is set up and disconnects it through
//! `PodDatapath::detach_pod` before the network is torn down. At start the endpoint map an
//! earlier agent left is reconciled against the pod addresses still allocated.
//!
//! Device confinement (runc's default device allow list, `skiff_datapath::devices`): a pod
//! worker confines every pod that has no privileged container through
//! `PodDatapath::confine_devices` as soon as its sandbox (the pod cgroup) exists and before any of
//! its containers starts, and releases it through `PodDatapath::release_devices` once the sandbox
//! is removed. The program's links are pinned, so pods stay confined while the agent
//! restarts. If the program cannot be loaded, pods that would need it do not start (their
//! status says why): a pod never runs with the node's devices open to it by accident.

mod access;
pub mod api;
mod apiproxy;
pub mod dns;
mod envvars;
mod images;
pub mod join;
pub mod l2;
mod logs;
mod metrics;
pub mod netpol;
mod node;
mod pod_datapath;
mod pod_loop;
mod probe;
pub mod proxy;
pub mod purge;
pub mod routes;
mod security;
mod start;
mod status;
mod usage;
mod volumes;
mod worker;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::Client;
use skiff_client::controller::{EventRecorder, Informers};
use tracing::info;

use skiff_datapath::lb::LbConfig;

use start::{Running, Subsystem};

pub use node::{LEASE_NAMESPACE, LIMITS_CONDITION, SERVICE_LB_CONDITION};

/// `source.component` of the agent's Events (the kubelet's role).
pub const EVENT_COMPONENT: &str = "skiff-node";
pub use status::{pod_status, rfc3339};

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    /// Runtime state, IP allocations and logs live here.
    pub state_dir: PathBuf,
    /// The node's network namespace (`/run/netns/NAME`); `None` = the agent's own.
    pub node_netns: Option<PathBuf>,
    /// Used when the control plane has not set `Node.spec.podCIDR`.
    pub pod_cidr: Option<String>,
    /// Labels set on the Node at registration (kubelet's `--node-labels`).
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// Parent cgroup of this node's pods; default `<cgroup v2 root>/skiff/<node>`.
    pub cgroup_parent: Option<PathBuf>,
    /// The `skiff-node` binary, run as the container shim.
    pub shim_path: PathBuf,
    pub lease_duration: Duration,
    pub lease_renew: Duration,
    /// Node status refresh (conditions' heartbeat).
    pub status_interval: Duration,
    /// First crash-loop back-off; doubles up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Load the eBPF per-pod traffic accounting.
    pub accounting: bool,
    /// Load the eBPF Service load balancer (socket LB for ClusterIP Services).
    pub service_lb: bool,
    /// Enforce NetworkPolicies with the eBPF policy programs (`--no-network-policy` turns it
    /// off).
    pub network_policy: bool,
    /// Sizes of its maps (`--lb-max-services`, `--lb-max-backends`).
    pub lb: LbConfig,
    pub max_pods: u32,
    /// Where the agent's HTTP API listens (`None`: the node's InternalIP), with a certificate
    /// of the cluster CA for the node's addresses (`api::serving`).
    pub api_address: Option<IpAddr>,
    /// Its port (0: a free one); published in the Node either way.
    pub api_port: u16,
    /// The cluster CA (PEM, from the kubeconfig): with it the API speaks only TLS and
    /// requires client certificates of this CA; without it (tests' plain-HTTP servers) plain
    /// HTTP.
    pub client_ca_pem: Option<String>,
    /// Registries pulled from over plain HTTP (`host:port`), besides loopback ones.
    pub plain_http_registries: Vec<String>,
    /// Registry credentials, a Docker `config.json` read at every pull (default:
    /// `<state dir>/config.json`, as the kubelet reads its root directory's).
    pub registry_config: Option<PathBuf>,
    /// Image garbage collection: thresholds and maximum unused age.
    pub image_gc: skiff_image::gc::GcPolicy,
    /// How often images are garbage-collected.
    pub image_gc_period: Duration,
    /// The API servers' URLs (comma separated), which the passthrough for pods dials (`None`: no
    /// passthrough).
    pub api_server_url: Option<String>,
    /// The port of that passthrough on the node's InternalIP (0: none).
    pub api_server_proxy_port: u16,
    /// The cluster DNS address pods of dnsPolicy ClusterFirst get (the kube-dns Service's
    /// clusterIP; the kubelet's `--cluster-dns`), `None`: the node's resolvers.
    pub cluster_dns: Option<std::net::IpAddr>,
    /// The cluster domain (`cluster.local`).
    pub cluster_domain: String,
    /// The port of the agent's DNS server on the node's InternalIP (0: none).
    pub dns_port: u16,
    /// Where names outside the cluster are resolved (`None`: the nameservers of the node's
    /// /etc/resolv.conf).
    pub dns_upstream: Option<Vec<SocketAddr>>,
}

/// The default port of the agent's HTTP API (the kubelet's).
pub const DEFAULT_API_PORT: u16 = 10250;
/// The default port of the node's passthrough to the API server (k3s' agent balancer's).
pub const DEFAULT_API_SERVER_PROXY_PORT: u16 = 6444;
/// The default port of the node's DNS server (pods reach it as kube-dns:53 through the load
/// balancer; not 53, which a node's own resolver may hold).
pub const DEFAULT_DNS_PORT: u16 = 10053;

impl AgentConfig {
    pub fn new(node_name: &str, state_dir: PathBuf, shim_path: PathBuf) -> Self {
        AgentConfig {
            node_name: node_name.into(),
            state_dir,
            node_netns: None,
            pod_cidr: None,
            node_labels: Default::default(),
            cgroup_parent: None,
            shim_path,
            lease_duration: Duration::from_secs(40),
            lease_renew: Duration::from_secs(10),
            status_interval: Duration::from_secs(60),
            backoff_initial: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
            accounting: true,
            service_lb: true,
            network_policy: true,
            lb: LbConfig::default(),
            max_pods: 110,
            api_address: None,
            api_port: 0,
            client_ca_pem: None,
            plain_http_registries: Vec::new(),
            registry_config: None,
            image_gc: skiff_image::gc::GcPolicy::default(),
            image_gc_period: Duration::from_secs(300),
            api_server_url: None,
            api_server_proxy_port: DEFAULT_API_SERVER_PROXY_PORT,
            cluster_dns: Some(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 96, 0, 10))),
            cluster_domain: "cluster.local".into(),
            dns_port: DEFAULT_DNS_PORT,
            dns_upstream: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("inspecting the host: {0}")]
    Host(#[from] skiff_runtime::host::HostError),
    #[error("starting the runtime: {0}")]
    Runtime(#[from] skiff_runtime::RuntimeError),
    #[error("setting up pod networking: {0}")]
    Net(#[from] skiff_hostnet::NetError),
    #[error("talking to the API server: {0}")]
    Api(#[from] skiff_client::ClientError),
    #[error(transparent)]
    ApiListen(#[from] api::ListenError),
    #[error(
        "no --address for the agent API and the node has no global IPv4 address to serve it on"
    )]
    NoApiAddress,
    #[error("the watch of node {0} ended while waiting for its spec.podCIDR")]
    NoPodCidr(String),
}

/// Runs the agent until `shutdown` resolves. Pods keep running after it returns.
///
/// The subsystems start in dependency order; what runs next to the pod loop is gathered in
/// `start::Running`, dropped (in its field order, the teardown order) once the pod loop
/// returns.
pub async fn run(
    cfg: AgentConfig,
    client: Client,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), AgentError> {
    let host = start::start_runtime(&cfg)?;
    let node_ip = start::node_address(&cfg).await;
    let api_listener = start::bind_api(&cfg, node_ip).await?;
    let mut node = start::start_node(&cfg, &client, &host, &api_listener, node_ip).await?;
    let net = start::start_network(&cfg, &node.pod_cidr).await?;
    node.facts.internal_ip = net.host_ip.clone();
    let service_lb = start::start_service_lb(&cfg, &host.cgroup_parent, &net);
    let api_proxy = start::start_api_proxy(&cfg, &service_lb, &net).await;
    let informers = Informers::new(client.clone());
    let cluster_dns = start::start_cluster_dns(&cfg, &informers, &service_lb, &net).await;
    let network_policy =
        start::start_network_policy(&cfg, &host.cgroup_parent, &net, &cluster_dns, &service_lb);
    node.facts.service_lb = cfg.service_lb.then(|| match &service_lb {
        Subsystem::Running(_) => Ok(()),
        Subsystem::Off(why) => Err(why.clone()),
    });
    node::heartbeat(&client, &node.facts).await?;
    info!(node = %cfg.node_name, pod_cidr = %node.pod_cidr, host_ip = ?net.host_ip, cgroup = %host.cgroup_parent.display(), "node registered");

    let accounting = start::start_accounting(&cfg, &host.cgroup_parent);
    let devices = start::start_device_filter(&cfg.node_name, host.runtime.as_ref()).await;
    let datapath = pod_datapath::PodDatapath {
        net: net.net.clone(),
        proxy: service_lb.to_result(),
        devices: devices.to_result(),
        accounting: accounting.running().cloned(),
    };
    let ctx = Arc::new(worker_ctx(
        &cfg, &client, &host, &net, &informers, &node, datapath,
    ));
    ctx.datapath.reconcile_pod_endpoints().await;
    let nodeport = start::start_nodeport(&ctx.datapath, &net).await;
    let api_ctx = api::ApiCtx {
        client: client.clone(),
        runtime: host.runtime.clone(),
        sources: api::Sources {
            node: cfg.node_name.as_str().into(),
            pods: ctx.pods.clone(),
            accounting: accounting.running().cloned(),
            proxy: service_lb.to_result(),
            network_policy: network_policy.running().cloned(),
        },
    };
    let api_server = start::serve_api(&client, api_listener, api_ctx);
    let controllers =
        start::start_controllers(&cfg, &informers, &net, &service_lb, &network_policy);
    // Node status on its own schedule (the Lease loop runs since registration).
    let heartbeat = start::Task::spawn(node::heartbeat_loop(
        client.clone(),
        node.facts,
        cfg.status_interval,
        node.image_changes,
    ));
    let mut running = Running {
        image_gc: start::start_image_gc(&cfg, &ctx.images, &ctx.pods),
        api_proxy,
        cluster_dns,
        controllers,
        lease: node.lease,
        heartbeat,
        api_server,
        nodeport,
        accounting,
        devices,
        network_policy,
        service_lb,
    };
    running.log_off();
    let result = pod_loop::pod_loop(ctx, &cfg.node_name, shutdown).await;
    running.controllers.release_l2().await;
    drop(running);
    result
}

/// What the pod workers share.
fn worker_ctx(
    cfg: &AgentConfig,
    client: &Client,
    host: &start::Host,
    net: &start::Network,
    informers: &Informers,
    node: &start::Registered,
    datapath: pod_datapath::PodDatapath,
) -> worker::Ctx {
    worker::Ctx {
        client: client.clone(),
        runtime: host.runtime.clone(),
        datapath,
        host_ip: net.host_ip.clone(),
        backoff: worker::Backoff {
            initial: cfg.backoff_initial,
            max: cfg.backoff_max,
        },
        pods: api::PodRegistry::default(),
        recorder: EventRecorder::new(client.clone(), EVENT_COMPONENT, &cfg.node_name),
        images: images::ImageService::open(
            &cfg.state_dir,
            &cfg.plain_http_registries,
            cfg.registry_config
                .clone()
                .unwrap_or_else(|| cfg.state_dir.join("config.json")),
            node.image_changes.clone(),
        )
        .map(Arc::new)
        .inspect_err(|e| tracing::warn!(error = %e, "the image store is unavailable")),
        volumes: volumes::Volumes::new(&cfg.state_dir).with_cluster_dns(cfg.cluster_dns.map(
            |ip| volumes::ClusterDnsConfig {
                ip,
                domain: cfg.cluster_domain.clone(),
            },
        )),
        services: informers.get::<skiff_api::api::Service>(),
    }
}

/// Name of a pod for logs.
pub fn pod_name(p: &Pod) -> String {
    format!("{}/{}", p.namespace(), p.name())
}
