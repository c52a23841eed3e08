//! The node agent: registers the Node, renews its Lease, and runs the pods bound to it.
//!
//! Observation is watch-driven: a reflector on the pods whose `spec.nodeName` is this node
//! feeds one [`worker::Worker`] per pod, and the runtime's exit notifications wake the
//! worker of the pod concerned. Each worker converges its pod level-triggered.
//!
//! The agent talks only to the API server (through `skiff-client`). It keeps the pods running
//! when it exits: a restarted agent adopts them (same processes) through the runtime's
//! on-disk state and resumes their status updates.
//!
//! It also serves a small read-only HTTP API ([`api`]: container logs, stats, the Service
//! load balancer's maps) on loopback, and publishes its port in the Node's
//! `status.daemonEndpoints.kubeletEndpoint.Port`.
//!
//! Service load balancing ([`proxy`]): the socket LB programs are attached to the node's pod
//! cgroup parent next to the accounting programs, and a controller on the shared runtime
//! programs them from Services and Endpoints. If they cannot be loaded the agent still runs
//! pods; it warns, reports `ServiceLoadBalancerReady=False` on its Node, and detaches programs
//! an earlier agent left attached (their maps would go stale); likewise with
//! `--no-service-lb`.
//!
//! Pod networking fast path: the same object's tc program runs on the uplink and on every
//! pod's host veth; a pod worker connects its pod through `Ctx::attach_pod_datapath` right
//! after the pod's network is set up and disconnects it through
//! `Ctx::detach_pod_datapath` before the network is torn down. At start the endpoint map an
//! earlier agent left is reconciled against the pod addresses still allocated.
//!
//! Device confinement (runc's default device allow list, `skiff_datapath::devices`): a pod
//! worker confines every pod that has no privileged container through
//! `Ctx::confine_pod_devices` as soon as its sandbox (the pod cgroup) exists and before any of
//! its containers starts, and releases it through `Ctx::release_pod_devices` once the sandbox
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
mod logs;
mod metrics;
pub mod netpol;
mod node;
mod probe;
pub mod proxy;
pub mod purge;
pub mod routes;
mod security;
mod status;
mod usage;
mod volumes;
mod worker;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::reflector::{Event, reflector};
use skiff_client::runtime::{CancelToken, EventRecorder, Informers};
use skiff_client::{Client, ListParams};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use skiff_datapath::Accounting;
use skiff_datapath::devices::{DeviceConfinement, DeviceFilter};
use skiff_datapath::lb::{LbConfig, ServiceLb, TcAttach};
use skiff_hostnet::{NodeNetwork, NodeNetworkConfig, PodNetwork};
use skiff_runtime::{NativeConfig, NativeRuntime, Runtime};

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
    /// Where the agent's HTTP API listens (port 0: a free one, published in the Node).
    pub api_listen: SocketAddr,
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
            api_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
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
    #[error("the agent API's TLS certificate: {0}")]
    ApiTls(#[source] skiff_pki::PkiError),
    #[error("the watch of node {0} ended while waiting for its spec.podCIDR")]
    NoPodCidr(String),
}

/// What every pod worker shares.
pub(crate) struct Ctx {
    pub client: Client,
    pub runtime: Arc<dyn Runtime>,
    pub net: Arc<dyn PodNetwork>,
    pub accounting: Option<Arc<Mutex<Accounting>>>,
    /// The Service load balancer, or why it is not running.
    pub proxy: Result<Arc<proxy::Proxy>, String>,
    /// NetworkPolicy enforcement, if it runs.
    pub network_policy: Option<Arc<netpol::NetworkPolicies>>,
    /// Device confinement of unprivileged pods, or why it is unavailable (such pods then do
    /// not start).
    pub devices: Result<Arc<Mutex<dyn DeviceConfinement>>, String>,
    pub host_ip: Option<String>,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// The pods this agent runs, as their workers publish them (for the HTTP API).
    pub pods: api::PodRegistry,
    /// Events about pods (Started, Killing, BackOff, Unhealthy, Failed).
    pub recorder: EventRecorder,
    /// Images and container root filesystems made from them, or why the store could not be
    /// opened (containers of registry images then wait with that reason).
    pub images: Result<Arc<images::ImageService>, String>,
    /// The pods' volumes and generated /etc files.
    pub volumes: volumes::Volumes,
    /// Every Service, for the containers' service environment variables.
    pub services: skiff_client::runtime::Informer<skiff_api::api::Service>,
}

impl Ctx {
    /// Connects a pod whose network was just set up (`att`) to the eBPF data path
    /// ([`proxy::Proxy::attach_pod`]: the tc program on its host veth, NodePort replies and
    /// the fast path, and its endpoint entry). Failures are logged: the pod still runs,
    /// through the node's stack.
    pub async fn attach_pod_datapath(&self, uid: &str, att: &skiff_hostnet::PodAttachment) {
        let Ok(p) = &self.proxy else { return };
        let (p, netns, uid_owned, att_owned) = (
            p.clone(),
            self.net.netns_path().map(std::path::Path::to_path_buf),
            uid.to_string(),
            att.clone(),
        );
        let attached = tokio::task::spawn_blocking(move || {
            p.attach_pod(netns.as_deref(), &uid_owned, &att_owned)
        })
        .await;
        match attached {
            Ok(Ok(how)) => debug!(device = %att.host_veth, ?how, "pod data path attached"),
            Ok(Err(e)) => warn!(device = %att.host_veth, error = %e, "attaching the pod data path"),
            Err(e) => warn!(device = %att.host_veth, error = %e, "attaching the pod data path"),
        }
    }

    /// Disconnects pod `uid` from the eBPF data path ([`proxy::Proxy::detach_pod`]); called
    /// before its network is torn down.
    pub fn detach_pod_datapath(&self, uid: &str) {
        if let Ok(p) = &self.proxy
            && let Err(e) = p.detach_pod(uid, self.net.pod_ip(uid))
        {
            warn!(pod_uid = %uid, error = %e, "detaching the pod data path");
        }
    }

    /// Attaches the NodePort tc program to device `ifname` of the node namespace (the
    /// uplink). Failures are logged: pods still run, only NodePort through it fails.
    pub async fn attach_nodeport(&self, ifname: &str) -> Option<TcAttach> {
        let Ok(p) = &self.proxy else { return None };
        let (p, netns, name) = (
            p.clone(),
            self.net.netns_path().map(std::path::Path::to_path_buf),
            ifname.to_string(),
        );
        let attached =
            tokio::task::spawn_blocking(move || p.attach_tc(netns.as_deref(), &name)).await;
        match attached {
            Ok(Ok(how)) => {
                debug!(device = %ifname, ?how, "NodePort program attached");
                return Some(how);
            }
            Ok(Err(e)) => warn!(device = %ifname, error = %e, "attaching the NodePort program"),
            Err(e) => warn!(device = %ifname, error = %e, "attaching the NodePort program"),
        }
        None
    }

    /// Confines pod `uid`, whose cgroup is `cgroup_dir`, to the default device allow list,
    /// unless it is `privileged` (a privileged container gets every device, as with runc).
    /// Called once the pod cgroup exists and before any container of the pod starts; an
    /// error means its containers must not start.
    pub async fn confine_pod_devices(
        &self,
        uid: &str,
        cgroup_dir: &std::path::Path,
        privileged: bool,
    ) -> Result<(), String> {
        if privileged {
            return Ok(());
        }
        let devices = self
            .devices
            .as_ref()
            .map_err(|why| format!("device confinement is unavailable: {why}"))?
            .clone();
        let (uid_owned, dir) = (uid.to_string(), cgroup_dir.to_path_buf());
        let confined = tokio::task::spawn_blocking(move || {
            let mut d = devices.lock().unwrap_or_else(|e| e.into_inner());
            d.confine(&uid_owned, &dir).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match confined {
            Ok(how) => {
                debug!(pod_uid = %uid, ?how, "pod confined to the default devices");
                Ok(())
            }
            Err(e) => Err(format!("confining the pod's device access: {e}")),
        }
    }

    /// Releases pod `uid`'s device confinement (its cgroup is gone). Failures are logged.
    pub fn release_pod_devices(&self, uid: &str) {
        if let Ok(d) = &self.devices
            && let Err(e) = d.lock().unwrap_or_else(|e| e.into_inner()).release(uid)
        {
            warn!(pod_uid = %uid, error = %e, "releasing the pod's device confinement");
        }
    }

    /// Drops the traffic counters of cgroups that no longer exist.
    pub fn forget_counters(&self, ids: &[u64]) {
        if let Some(acc) = &self.accounting {
            let mut acc = acc.lock().unwrap_or_else(|e| e.into_inner());
            for id in ids {
                if let Err(e) = acc.forget(*id) {
                    warn!(cgroup_id = id, error = %e, "forgetting traffic counters");
                }
            }
        }
    }
}

/// Runs the agent until `shutdown` resolves. Pods keep running after it returns.
pub async fn run(
    cfg: AgentConfig,
    client: Client,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), AgentError> {
    let host = skiff_runtime::host::report()?;
    if !host.missing_controllers.is_empty() {
        warn!(missing = ?host.missing_controllers, "cgroup v2 lacks controllers: their pod limits are not enforced");
    }
    let cgroup_parent = cfg
        .cgroup_parent
        .clone()
        .unwrap_or_else(|| host.cgroup2_root.join("skiff").join(&cfg.node_name));
    let runtime: Arc<dyn Runtime> = Arc::new(NativeRuntime::new(NativeConfig::new(
        cfg.state_dir.join("runtime"),
        cgroup_parent.clone(),
        cfg.shim_path.clone(),
    ))?);

    // Bound before registering, so the Node can carry the port from the start.
    let listener = api::bind(cfg.api_listen).await?;
    let api_port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let api_tls = match &cfg.client_ca_pem {
        Some(ca) => Some(
            api::AgentTls::load_or_create(&cfg.state_dir.join("pki"), &cfg.node_name, ca)
                .map_err(AgentError::ApiTls)?,
        ),
        None => None,
    };

    let mut facts = node::NodeFacts {
        name: cfg.node_name.clone(),
        pod_cidr_flag: cfg.pod_cidr.clone(),
        labels: cfg.node_labels.clone(),
        host: host.clone(),
        internal_ip: None,
        max_pods: cfg.max_pods,
        service_lb: None,
        api_port,
        serving_cert_hash: api_tls.as_ref().map(|t| t.cert_hash.clone()),
        images: skiff_image::ImageStore::open(&images::store_root(&cfg.state_dir)).ok(),
    };
    // Pulls post the node status at once, so `status.images` follows them.
    let image_changes = Arc::new(tokio::sync::Notify::new());
    let registered = node::register(&client, &facts).await?;
    // The Lease is renewed from now on, also while waiting for a pod CIDR, so the node
    // lifecycle controller sees a live node.
    let lease = AbortOnDrop(tokio::spawn(lease_loop(client.clone(), cfg.clone())));
    let registered_cidr = registered
        .spec
        .as_ref()
        .map(|s| s.pod_cidr.clone())
        .filter(|c| !c.is_empty())
        .or_else(|| cfg.pod_cidr.clone());
    let pod_cidr = match registered_cidr {
        Some(c) => c,
        None => wait_for_pod_cidr(&client, &cfg.node_name).await?,
    };
    let net = Arc::new(
        NodeNetwork::new(NodeNetworkConfig {
            node_netns: cfg.node_netns.clone(),
            pod_cidr: pod_cidr.clone(),
            state_dir: cfg.state_dir.join("net"),
        })
        .await?,
    );
    let host_ip = net.node_ip().await.map(|ip| ip.to_string());
    let uplink = match net.uplink().await {
        Ok(u) => u,
        Err(e) => {
            warn!(error = %e, "finding the node's uplink");
            None
        }
    };
    facts.internal_ip = host_ip.clone();
    // Loaded before the status goes out, so the Node says at once whether it balances
    // Services.
    let proxy = if cfg.service_lb {
        match load_service_lb(&cfg.node_name, &cgroup_parent, cfg.lb) {
            Ok(lb) => Ok(proxy::Proxy::new(
                lb,
                &cfg.node_name,
                uplink
                    .iter()
                    .map(|(_, ip)| std::net::IpAddr::V4(*ip))
                    .collect(),
            )),
            Err(e) => {
                warn!(error = %e, "eBPF Service load balancing unavailable: ClusterIP Services do not work from this node's pods");
                detach_stale_service_lb(&cfg.node_name);
                Err(e)
            }
        }
    } else {
        detach_stale_service_lb(&cfg.node_name);
        Err("disabled (--no-service-lb)".to_string())
    };
    // Pods reach the API server through this node: the `kubernetes` Service is sent to a
    // passthrough on the node's address.
    let api_proxy = match (&proxy, &host_ip, &cfg.api_server_url) {
        (Ok(p), Some(ip), Some(url)) if cfg.api_server_proxy_port != 0 => {
            match start_api_proxy(
                cfg.node_netns.as_deref(),
                ip,
                cfg.api_server_proxy_port,
                url,
            )
            .await
            {
                Ok(a) => {
                    p.route_locally(
                        skiff_client::runtime::ObjectKey::new(
                            skiff_api::wellknown::KUBERNETES_SERVICE_NAMESPACE,
                            skiff_api::wellknown::KUBERNETES_SERVICE_NAME,
                        ),
                        skiff_datapath::lb::BackendAddr {
                            ip: a.addr.ip(),
                            port: a.addr.port(),
                        },
                    );
                    Some(a)
                }
                Err(e) => {
                    warn!(error = %e, "pods cannot reach the API server through the kubernetes Service");
                    None
                }
            }
        }
        _ => None,
    };
    // Cluster DNS on the node's address; the load balancer sends kube-dns there.
    let informers = Informers::new(client.clone());
    let cluster_dns = match (&proxy, &host_ip) {
        (Ok(p), Some(ip)) if cfg.dns_port != 0 => start_cluster_dns(&cfg, &informers, ip, p).await,
        _ => None,
    };
    let network_policy = if cfg.network_policy {
        let mut host_ips: Vec<std::net::Ipv4Addr> = uplink.iter().map(|(_, ip)| *ip).collect();
        host_ips.extend(
            host_ip
                .as_deref()
                .and_then(|ip| ip.parse::<std::net::Ipv4Addr>().ok()),
        );
        host_ips.sort();
        host_ips.dedup();
        let host_services = cluster_dns
            .as_ref()
            .map(|d| netpol_dns_services(d.addr.port()))
            .unwrap_or_default();
        match load_network_policy(&cfg.node_name, &cgroup_parent) {
            Ok(mut enforcer) => {
                // Flow records go from the reader thread to the task that names them; a
                // full queue drops records rather than slowing the reader.
                let (flow_tx, flow_rx) = tokio::sync::mpsc::channel(8192);
                let reader = enforcer.start_flows(move |ev| {
                    let _ = flow_tx.try_send(ev);
                });
                let np = netpol::NetworkPolicies::new(
                    Box::new(enforcer),
                    &cfg.node_name,
                    host_ips,
                    host_services,
                );
                match reader {
                    Ok(r) => {
                        np.keep_flow_reader(r);
                        tokio::spawn(np.clone().record_flows(flow_rx, proxy.clone().ok()));
                    }
                    Err(e) => warn!(error = %e, "flow records unavailable"),
                }
                Some(np)
            }
            Err(e) => {
                warn!(error = %e, "eBPF NetworkPolicy enforcement unavailable: policies are not enforced on this node");
                detach_stale_network_policy(&cfg.node_name);
                None
            }
        }
    } else {
        detach_stale_network_policy(&cfg.node_name);
        None
    };
    facts.service_lb = cfg
        .service_lb
        .then(|| proxy.as_ref().map(|_| ()).map_err(Clone::clone));
    node::heartbeat(&client, &facts).await?;
    info!(node = %cfg.node_name, %pod_cidr, host_ip = ?host_ip, cgroup = %cgroup_parent.display(), "node registered");

    let accounting = if cfg.accounting {
        match load_accounting(&cfg.node_name, &cgroup_parent) {
            Ok(acc) => Some(Arc::new(Mutex::new(acc))),
            Err(e) => {
                warn!(error = %e, "eBPF traffic accounting unavailable");
                None
            }
        }
    } else {
        None
    };

    let devices = load_device_filter(&cfg.node_name, runtime.as_ref()).await;

    let ctx = Arc::new(Ctx {
        network_policy: network_policy.clone(),
        devices,
        services: informers.get::<skiff_api::api::Service>(),
        client: client.clone(),
        runtime: runtime.clone(),
        net: net.clone(),
        accounting,
        proxy: proxy.clone(),
        host_ip,
        backoff_initial: cfg.backoff_initial,
        backoff_max: cfg.backoff_max,
        pods: api::PodRegistry::default(),
        recorder: EventRecorder::new(client.clone(), EVENT_COMPONENT, &cfg.node_name),
        images: images::ImageService::open(
            &cfg.state_dir,
            &cfg.plain_http_registries,
            cfg.registry_config
                .clone()
                .unwrap_or_else(|| cfg.state_dir.join("config.json")),
            image_changes.clone(),
        )
        .map(Arc::new)
        .inspect_err(|e| warn!(error = %e, "the image store is unavailable")),
        volumes: volumes::Volumes::new(&cfg.state_dir).with_cluster_dns(cfg.cluster_dns.map(
            |ip| volumes::ClusterDnsConfig {
                ip,
                domain: cfg.cluster_domain.clone(),
            },
        )),
    });
    // The fast path's endpoint entries of an earlier agent: those of pods that are gone are
    // removed now; the running pods' workers rewrite theirs as they adopt them.
    if let Ok(p) = &ctx.proxy {
        let allocations = ctx.net.allocations().into_iter().collect();
        let netns = ctx.net.netns_path().map(std::path::Path::to_path_buf);
        let p = p.clone();
        match tokio::task::spawn_blocking(move || {
            p.reconcile_pod_endpoints(netns.as_deref(), &allocations)
        })
        .await
        {
            Ok(Ok(removed)) => info!(removed, "pod fast path endpoints reconciled"),
            Ok(Err(e)) => warn!(error = %e, "reconciling the pod fast path endpoints"),
            Err(e) => warn!(error = %e, "reconciling the pod fast path endpoints"),
        }
    }
    // NodePort from outside and the fast path into local pods: the tc program on the uplink
    // (pod veths get it as they attach).
    match &uplink {
        Some((name, ip)) => {
            if let Some(how) = ctx.attach_nodeport(name).await {
                info!(uplink = %name, %ip, ?how, "NodePort served on the uplink");
            }
        }
        None => warn!("no uplink with a global IPv4 address: NodePort Services are not served"),
    }
    let api_server = api::serve(listener, &cfg.node_name, ctx.clone(), api_tls);

    // The cluster-wide controllers of the agent share one set of informers (the pod loop
    // watches only this node's pods; workers read Services for the containers'
    // environment) and stop together.
    let stop_controllers = CancelToken::new();
    // Routes to the other nodes' pod CIDRs, from the Nodes they register.
    let routes = AbortOnDrop(tokio::spawn({
        let (name, net, stop, informers) = (
            cfg.node_name.clone(),
            net.clone(),
            stop_controllers.clone(),
            informers.clone(),
        );
        async move { routes::PeerRoutes::run(&name, net, &informers, stop).await }
    }));
    // Service load balancing, programmed from Services and Endpoints.
    let lb_task = proxy.ok().map(|p| {
        AbortOnDrop(tokio::spawn(
            p.run(informers.clone(), stop_controllers.clone()),
        ))
    });
    // NetworkPolicy enforcement, programmed from Policies, Pods and Namespaces.
    let policy_task = network_policy.map(|np| {
        AbortOnDrop(tokio::spawn(
            np.run(informers.clone(), stop_controllers.clone()),
        ))
    });
    // Node status on its own schedule (the Lease loop runs since registration).
    let heartbeat = tokio::spawn(heartbeat_loop(
        client.clone(),
        facts,
        cfg.status_interval,
        image_changes,
    ));

    let image_gc = ctx.images.clone().ok().map(|images| {
        let (pods, policy, period) = (ctx.pods.clone(), cfg.image_gc, cfg.image_gc_period);
        AbortOnDrop(tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                if let Err(e) = images.collect(&policy, &pods.images()).await {
                    warn!(error = %e, "image garbage collection");
                }
            }
        }))
    });

    let result = pod_loop(ctx, &cfg.node_name, shutdown).await;
    drop(image_gc);
    drop(api_proxy);
    drop(cluster_dns);
    stop_controllers.cancel();
    drop(routes);
    drop(lb_task);
    drop(policy_task);
    drop(lease);
    heartbeat.abort();
    api_server.abort();
    result
}

/// Starts the cluster DNS on `<host_ip>:<dns port>` in the node's namespace and routes the
/// `kube-system/kube-dns` Service to it.
async fn start_cluster_dns(
    cfg: &AgentConfig,
    informers: &Informers,
    host_ip: &str,
    proxy: &proxy::Proxy,
) -> Option<dns::ClusterDns> {
    let ip: std::net::IpAddr = match host_ip.parse() {
        Ok(ip) => ip,
        Err(e) => {
            warn!(error = %e, "node address {host_ip:?}: no cluster DNS");
            return None;
        }
    };
    let upstream = cfg.dns_upstream.clone().unwrap_or_else(|| {
        dns::upstream_from_resolv_conf(std::path::Path::new("/etc/resolv.conf"))
    });
    let view = dns::Informed {
        services: informers.get::<skiff_api::api::Service>(),
        endpoints: informers.get::<skiff_api::api::Endpoints>(),
    };
    let handler = dns::Handler::new(Box::new(view), &cfg.cluster_domain, &upstream);
    match dns::ClusterDns::start(
        cfg.node_netns.as_deref(),
        SocketAddr::new(ip, cfg.dns_port),
        handler,
    )
    .await
    {
        Ok(d) => {
            proxy.route_locally(
                skiff_client::runtime::ObjectKey::new("kube-system", "kube-dns"),
                skiff_datapath::lb::BackendAddr {
                    ip: d.addr.ip(),
                    port: d.addr.port(),
                },
            );
            Some(d)
        }
        Err(e) => {
            warn!(error = %e, "cluster DNS unavailable on this node");
            None
        }
    }
}

/// Starts the passthrough to the API server at `<host_ip>:<port>` in the node's namespace.
async fn start_api_proxy(
    netns: Option<&std::path::Path>,
    host_ip: &str,
    port: u16,
    url: &str,
) -> Result<apiproxy::ApiProxy, String> {
    let ip: std::net::IpAddr = host_ip
        .parse()
        .map_err(|e| format!("node address {host_ip:?}: {e}"))?;
    let upstreams = apiproxy::upstreams_of(url).map_err(|e| e.to_string())?;
    apiproxy::ApiProxy::start(netns, SocketAddr::new(ip, port), upstreams)
        .await
        .map_err(|e| e.to_string())
}

/// Aborts a background task when dropped (also on an early return).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits, watching the Node, until the node IPAM controller has set `spec.podCIDR` (the
/// agent was started without `--pod-cidr` and the Node had none).
async fn wait_for_pod_cidr(client: &Client, node_name: &str) -> Result<String, AgentError> {
    info!(node = %node_name, "no --pod-cidr and no spec.podCIDR yet: waiting for the node IPAM controller to assign one");
    let lp = ListParams::default().fields(&format!("metadata.name={node_name}"));
    let events = reflector(client.cluster::<skiff_api::api::Node>(), lp);
    tokio::pin!(events);
    let mut last_note = tokio::time::Instant::now();
    while let Some(ev) = events.next().await {
        let nodes = match ev {
            Event::Restarted(v) => v,
            Event::Applied(n) => vec![n],
            Event::Deleted(_) => continue,
        };
        if let Some(cidr) = nodes
            .iter()
            .filter(|n| n.name() == node_name)
            .filter_map(|n| n.spec.as_ref())
            .map(|s| s.pod_cidr.clone())
            .find(|c| !c.is_empty())
        {
            return Ok(cidr);
        }
        if last_note.elapsed() >= Duration::from_secs(30) {
            info!(node = %node_name, "still waiting for spec.podCIDR (is the controller manager's nodeipam controller running?)");
            last_note = tokio::time::Instant::now();
        }
    }
    Err(AgentError::NoPodCidr(node_name.to_string()))
}

/// Loads the device filter and releases the confinement an earlier agent left for pods that
/// are gone (their pins would otherwise stay). The running pods' workers confine theirs again,
/// taking the pinned links over.
async fn load_device_filter(
    node: &str,
    runtime: &dyn Runtime,
) -> Result<Arc<Mutex<dyn DeviceConfinement>>, String> {
    let mut filter = match DeviceFilter::load(&skiff_datapath::node_pin_dir(node)) {
        Ok(f) => f,
        Err(e) => {
            error!(error = %e, "eBPF device confinement unavailable: pods without a privileged container will not start");
            return Err(e.to_string());
        }
    };
    match (runtime.list_sandboxes().await, filter.confined()) {
        (Ok(sandboxes), Ok(confined)) => {
            for pod in confined {
                if !sandboxes.iter().any(|s| s.uid == pod)
                    && let Err(e) = filter.release(&pod)
                {
                    warn!(pod_uid = %pod, error = %e, "releasing a gone pod's device confinement");
                }
            }
        }
        (Err(e), _) => warn!(error = %e, "listing pods to release stale device confinement"),
        (_, Err(e)) => warn!(error = %e, "listing confined pods"),
    }
    info!("eBPF device confinement loaded");
    Ok(Arc::new(Mutex::new(filter)))
}

fn load_accounting(node: &str, cgroup_parent: &std::path::Path) -> Result<Accounting, String> {
    let mut acc =
        Accounting::load(&skiff_datapath::node_pin_dir(node)).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(cgroup_parent).map_err(|e| e.to_string())?;
    acc.attach(cgroup_parent).map_err(|e| e.to_string())?;
    Ok(acc)
}

/// Loads the Service load balancer (reusing the maps and links an earlier agent pinned) and
/// attaches it to the node's pod cgroup parent.
fn load_service_lb(
    node: &str,
    cgroup_parent: &std::path::Path,
    cfg: LbConfig,
) -> Result<ServiceLb, String> {
    let mut lb =
        ServiceLb::load(&skiff_datapath::node_pin_dir(node), cfg).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(cgroup_parent)
        .map_err(|e| format!("{}: {e}", cgroup_parent.display()))?;
    let (_, report) = lb.attach(cgroup_parent).map_err(|e| e.to_string())?;
    // --bpf-debug: the programs' per-translation records, as tracing debug events.
    if lb
        .start_debug_log(skiff_datapath::lb::debug::TracingLog)
        .map_err(|e| e.to_string())?
    {
        info!("eBPF Service load balancer debug records on (tracing target skiff_lb, debug)");
    }
    info!(
        attached = report.attached,
        adopted = report.adopted,
        replaced = report.replaced,
        services = lb.state().service_count(),
        backends = lb.state().backend_count(),
        "eBPF Service load balancer attached"
    );
    Ok(lb)
}

/// Loads NetworkPolicy enforcement (reusing the maps and links an earlier agent pinned) and
/// attaches it to the node's pod cgroup parent.
fn load_network_policy(
    node: &str,
    cgroup_parent: &std::path::Path,
) -> Result<skiff_datapath::policy::PolicyEnforcer, String> {
    use skiff_datapath::policy::{PolicyConfig, PolicyDatapath as _, PolicyEnforcer};
    let mut p = PolicyEnforcer::load(&skiff_datapath::node_pin_dir(node), PolicyConfig::default())
        .map_err(|e| e.to_string())?;
    std::fs::create_dir_all(cgroup_parent)
        .map_err(|e| format!("{}: {e}", cgroup_parent.display()))?;
    p.attach(cgroup_parent).map_err(|e| e.to_string())?;
    info!(
        endpoints = p.tables().endpoints.len(),
        rules = p.tables().rules.len(),
        "eBPF NetworkPolicy enforcement attached"
    );
    Ok(p)
}

/// The cluster DNS on the node's address stands for kube-dns' pods (port 53, UDP and TCP,
/// labelled `k8s-app=kube-dns` in `kube-system`, as CoreDNS' are), so egress policies
/// written for them allow it.
fn netpol_dns_services(node_port: u16) -> Vec<netpol::HostService> {
    let identity: netpol::LabelKey = (
        "kube-system".to_string(),
        std::collections::BTreeMap::from([("k8s-app".to_string(), "kube-dns".to_string())]),
    );
    [6u8, 17]
        .into_iter()
        .map(|protocol| netpol::HostService {
            node_port,
            protocol,
            port: 53,
            identity: identity.clone(),
        })
        .collect()
}

/// Without enforcement, programs an earlier agent left attached would keep enforcing tables
/// nobody updates: detach them (maps stay pinned).
fn detach_stale_network_policy(node: &str) {
    if let Err(e) =
        skiff_datapath::policy::PolicyEnforcer::detach_pinned(&skiff_datapath::node_pin_dir(node))
    {
        warn!(error = %e, "detaching the NetworkPolicy programs of an earlier agent");
    }
}

/// Without a running load balancer, programs an earlier agent left attached would keep
/// translating with maps nobody updates (backends that are gone, IPs since reused): detach
/// them. Their maps stay pinned (for inspection, and for a later agent to reuse).
fn detach_stale_service_lb(node: &str) {
    if let Err(e) = ServiceLb::detach_pinned(&skiff_datapath::node_pin_dir(node)) {
        warn!(error = %e, "detaching the Service load balancer of an earlier agent");
    }
}

async fn lease_loop(client: Client, cfg: AgentConfig) {
    let mut tick = tokio::time::interval(cfg.lease_renew);
    loop {
        tick.tick().await;
        if let Err(e) =
            skiff_client::node_lease::renew(&client, &cfg.node_name, cfg.lease_duration).await
        {
            warn!(error = %e, "renewing the node lease");
        }
    }
}

/// Posts the node status every `every`, after every image pull (`status.images`), and at
/// once (at most once a second) when the Node's Ready condition is Unknown while this agent
/// runs: the node lifecycle controller set it so during a partition, and the agent is back.
async fn heartbeat_loop(
    client: Client,
    facts: node::NodeFacts,
    every: Duration,
    image_changes: Arc<tokio::sync::Notify>,
) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    let lp = ListParams::default().fields(&format!("metadata.name={}", facts.name));
    let events = reflector(client.cluster::<skiff_api::api::Node>(), lp);
    tokio::pin!(events);
    let mut last_post = tokio::time::Instant::now();
    loop {
        let due = tokio::select! {
            _ = tick.tick() => true,
            () = image_changes.notified() => true,
            ev = events.next() => {
                let nodes = match ev {
                    Some(Event::Restarted(v)) => v,
                    Some(Event::Applied(n)) => vec![n],
                    Some(Event::Deleted(_)) | None => Vec::new(),
                };
                let not_ready = nodes.iter().any(|n| node::ready_status(n) == "Unknown");
                if not_ready && last_post.elapsed() < Duration::from_secs(1) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                not_ready
            }
        };
        if due {
            if let Err(e) = node::heartbeat(&client, &facts).await {
                warn!(error = %e, "updating node status");
            }
            last_post = tokio::time::Instant::now();
        }
    }
}

struct Workers {
    ctx: Arc<Ctx>,
    senders: HashMap<String, mpsc::UnboundedSender<worker::Msg>>,
    done_tx: mpsc::UnboundedSender<String>,
}

impl Workers {
    fn send(&mut self, uid: &str, pod: Option<&Pod>, msg: worker::Msg) {
        let msg = match self.senders.get(uid) {
            Some(tx) => match tx.send(msg) {
                Ok(()) => return,
                Err(mpsc::error::SendError(msg)) => msg,
            },
            None => msg,
        };
        drop(msg);
        // No live worker: start one (it reconciles at once, so the message is implied).
        let (tx, rx) = mpsc::unbounded_channel();
        let w = worker::Worker::new(self.ctx.clone(), uid.to_string(), pod.cloned());
        let done = self.done_tx.clone();
        let uid_owned = uid.to_string();
        tokio::spawn(async move {
            w.run(rx).await;
            let _ = done.send(uid_owned);
        });
        self.senders.insert(uid.to_string(), tx);
    }

    fn update(&mut self, pod: &Pod) {
        let uid = pod
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        if uid.is_empty() {
            return;
        }
        self.send(&uid, Some(pod), worker::Msg::Update(Box::new(pod.clone())));
    }

    fn gone(&mut self, uid: &str) {
        self.send(uid, None, worker::Msg::Gone);
    }
}

async fn pod_loop(
    ctx: Arc<Ctx>,
    node: &str,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), AgentError> {
    let api = ctx.client.all::<Pod>();
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let mut pods = Box::pin(reflector(api, lp));
    let mut exits = ctx.runtime.exits();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut workers = Workers {
        ctx: ctx.clone(),
        senders: HashMap::new(),
        done_tx,
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => {
                info!("agent stopping; pods keep running");
                return Ok(());
            }
            ev = pods.next() => match ev {
                Some(Event::Restarted(list)) => {
                    let live: std::collections::HashSet<String> = list
                        .iter()
                        .filter_map(|p| p.metadata.as_ref().map(|m| m.uid.clone()))
                        .collect();
                    for p in &list {
                        workers.update(p);
                    }
                    // Pods deleted while we were not watching, and sandboxes left on disk
                    // for pods that no longer exist: tear them down.
                    let stale: Vec<String> = workers
                        .senders
                        .keys()
                        .filter(|u| !live.contains(*u))
                        .cloned()
                        .collect();
                    for uid in stale {
                        workers.gone(&uid);
                    }
                    match ctx.runtime.list_sandboxes().await {
                        Ok(sandboxes) => {
                            for sb in sandboxes.iter().filter(|s| !live.contains(&s.uid)) {
                                info!(pod = %format!("{}/{}", sb.namespace, sb.name), "removing orphaned pod");
                                workers.gone(&sb.uid);
                            }
                        }
                        Err(e) => warn!(error = %e, "listing sandboxes"),
                    }
                }
                Some(Event::Applied(p)) => workers.update(&p),
                Some(Event::Deleted(p)) => {
                    if let Some(m) = &p.metadata {
                        workers.gone(&m.uid);
                    }
                }
                None => return Ok(()),
            },
            exit = exits.recv() => match exit {
                Ok((uid, container)) => {
                    tracing::debug!(%uid, %container, "container exited");
                    if let Some(tx) = workers.senders.get(&uid) {
                        let _ = tx.send(worker::Msg::Wake);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    warn!(missed = n, "exit notifications lagged; waking every pod");
                    for tx in workers.senders.values() {
                        let _ = tx.send(worker::Msg::Wake);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    exits = ctx.runtime.exits();
                }
            },
            Some(uid) = done_rx.recv() => {
                if workers.senders.get(&uid).is_some_and(|tx| tx.is_closed()) {
                    workers.senders.remove(&uid);
                }
            }
        }
    }
}

/// Name of a pod for logs.
pub fn pod_name(p: &Pod) -> String {
    format!("{}/{}", p.namespace(), p.name())
}
