//! The agent's subsystems, how each starts (or why it is off) and the order they stop in.
//!
//! [`crate::run`] calls the `start_*` steps below in order; every optional subsystem is a
//! [`Subsystem`], running or off with the reason. What runs is gathered in [`Running`], whose
//! field order is the teardown order.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skiff_client::Client;
use skiff_client::controller::{CancelToken, Informers, ObjectKey};
use skiff_datapath::Accounting;
use skiff_datapath::devices::{DeviceConfinement, DeviceFilter};
use skiff_datapath::lb::{BackendAddr, LbConfig, ServiceLb, TcAttach};
use skiff_hostnet::{NodeNetwork, NodeNetworkConfig};
use skiff_runtime::{NativeConfig, NativeRuntime, Runtime};
use tracing::{error, info, warn};

use crate::{AgentConfig, AgentError, api, apiproxy, dns, images, l2, netpol, node, proxy, routes};

/// An optional part of the agent: running, or off and why.
pub(crate) enum Subsystem<T> {
    Running(T),
    Off(String),
}

impl<T> Subsystem<T> {
    pub fn running(&self) -> Option<&T> {
        match self {
            Subsystem::Running(t) => Some(t),
            Subsystem::Off(_) => None,
        }
    }

    /// Why it is off.
    pub fn off(&self) -> Option<&str> {
        match self {
            Subsystem::Running(_) => None,
            Subsystem::Off(why) => Some(why),
        }
    }

    /// A copy of what runs, or why it does not.
    pub fn to_result(&self) -> Result<T, String>
    where
        T: Clone,
    {
        match self {
            Subsystem::Running(t) => Ok(t.clone()),
            Subsystem::Off(why) => Err(why.clone()),
        }
    }
}

impl<T> From<Result<T, String>> for Subsystem<T> {
    fn from(r: Result<T, String>) -> Self {
        match r {
            Ok(t) => Subsystem::Running(t),
            Err(why) => Subsystem::Off(why),
        }
    }
}

/// A background task, aborted when dropped (also on an early return).
pub(crate) struct Task(pub tokio::task::JoinHandle<()>);

impl Task {
    pub fn spawn(f: impl Future<Output = ()> + Send + 'static) -> Task {
        Task(tokio::spawn(f))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Cancels the token when dropped: the controllers sharing it stop.
pub(crate) struct CancelOnDrop(pub CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The cluster-wide controllers of the agent: they share one set of informers and stop
/// together (the token is cancelled first, then their tasks are aborted).
#[allow(dead_code, reason = "held for their Drop, in declaration order")]
pub(crate) struct Controllers {
    pub stop: CancelOnDrop,
    /// Routes to the other nodes' pod CIDRs.
    pub routes: Task,
    /// Service load balancing, programmed from Services and Endpoints.
    pub service_lb: Subsystem<Task>,
    /// NetworkPolicy enforcement, programmed from Policies, Pods and Namespaces.
    pub network_policy: Subsystem<Task>,
    /// L2 announcement of LoadBalancer addresses (ARP from the uplink's tc program), and
    /// its own stop token ([`Controllers::release_l2`]).
    pub l2_announcer: Subsystem<Task>,
    pub l2_stop: CancelToken,
}

/// How long a stopping agent waits for the L2 announcer to give its addresses up.
const L2_RELEASE_WAIT: Duration = Duration::from_secs(2);

impl Controllers {
    /// Stops the L2 announcer and waits (bounded) until it has removed its ARP entries and
    /// released its Leases, so other nodes take its addresses over at once instead of after
    /// the Leases expire.
    pub async fn release_l2(&mut self) {
        self.l2_stop.cancel();
        if let Subsystem::Running(task) = &mut self.l2_announcer
            && tokio::time::timeout(L2_RELEASE_WAIT, &mut task.0)
                .await
                .is_err()
        {
            warn!("the L2 announcer did not release its addresses in time");
        }
    }
}

/// Everything the agent runs next to its pod loop. Rust drops fields in declaration order:
/// this order IS the teardown (the pod loop has returned by then; pods keep running).
#[allow(dead_code, reason = "held for their Drop, in declaration order")]
pub(crate) struct Running {
    pub image_gc: Subsystem<Task>,
    /// The passthrough to the API server on the node's address.
    pub api_proxy: Subsystem<apiproxy::ApiProxy>,
    pub cluster_dns: Subsystem<dns::ClusterDns>,
    pub controllers: Controllers,
    pub lease: Task,
    pub heartbeat: Task,
    pub api_server: Task,
    /// The eBPF parts the workers and the API share; their programs and maps stay pinned
    /// (and attached) when the agent exits.
    pub nodeport: Subsystem<TcAttach>,
    pub accounting: Subsystem<Arc<Mutex<Accounting>>>,
    pub devices: Subsystem<Arc<Mutex<dyn DeviceConfinement>>>,
    pub network_policy: Subsystem<Arc<netpol::NetworkPolicies>>,
    pub service_lb: Subsystem<Arc<proxy::Proxy>>,
}

impl Running {
    /// Logs the subsystems that are off, and why.
    pub fn log_off(&self) {
        let off = [
            ("image garbage collection", self.image_gc.off()),
            ("API server passthrough", self.api_proxy.off()),
            ("cluster DNS", self.cluster_dns.off()),
            ("NodePort", self.nodeport.off()),
            ("traffic accounting", self.accounting.off()),
            ("device confinement", self.devices.off()),
            ("NetworkPolicy enforcement", self.network_policy.off()),
            ("Service load balancer", self.service_lb.off()),
            (
                "L2 announcement of LoadBalancer addresses",
                self.controllers.l2_announcer.off(),
            ),
        ];
        for (what, why) in off {
            if let Some(why) = why {
                info!(subsystem = what, reason = why, "subsystem off");
            }
        }
    }
}

/// The host, the pods' cgroup parent and the runtime.
pub(crate) struct Host {
    pub report: skiff_runtime::host::HostReport,
    pub cgroup_parent: PathBuf,
    pub runtime: Arc<dyn Runtime>,
}

pub(crate) fn start_runtime(cfg: &AgentConfig) -> Result<Host, AgentError> {
    let report = skiff_runtime::host::report()?;
    if !report.missing_controllers.is_empty() {
        warn!(missing = ?report.missing_controllers, "cgroup v2 lacks controllers: their pod limits are not enforced");
    }
    let cgroup_parent = cfg
        .cgroup_parent
        .clone()
        .unwrap_or_else(|| report.cgroup2_root.join("skiff").join(&cfg.node_name));
    let runtime: Arc<dyn Runtime> = Arc::new(NativeRuntime::new(NativeConfig::new(
        cfg.state_dir.join("runtime"),
        cgroup_parent.clone(),
        cfg.shim_path.clone(),
    ))?);
    Ok(Host {
        report,
        cgroup_parent,
        runtime,
    })
}

/// The agent API's listener (bound before registering, so the Node carries its port from
/// the start) and its TLS.
pub(crate) struct ApiListener {
    pub listener: tokio::net::TcpListener,
    pub port: u16,
    pub tls: ApiTls,
}

/// How the agent API speaks TLS.
pub(crate) enum ApiTls {
    /// No cluster CA to check callers against: nothing is served.
    None,
    /// A certificate of the cluster CA for the node's addresses, asked for once the Node
    /// (with those addresses) is registered.
    ClusterCa(api::ServingSpec),
}

/// The node's InternalIP: the first global IPv4 address of its network namespace.
pub(crate) async fn node_address(cfg: &AgentConfig) -> Option<Ipv4Addr> {
    match skiff_hostnet::node_address(cfg.node_netns.as_deref()).await {
        Ok(ip) => ip,
        Err(e) => {
            warn!(error = %e, "reading the node's addresses");
            None
        }
    }
}

pub(crate) async fn bind_api(
    cfg: &AgentConfig,
    node_ip: Option<Ipv4Addr>,
) -> Result<ApiListener, AgentError> {
    let address = cfg
        .api_address
        .or(node_ip.map(IpAddr::V4))
        .ok_or(AgentError::NoApiAddress)?;
    if address.is_loopback() {
        // Callers dial the Node's addresses and verify the certificate against them; there
        // is no loopback exception (no self-signed pin).
        warn!(
            %address,
            "the agent API listens on a loopback address: the API server reaches agents at \
             their Node's addresses, so logs, exec and port-forward will not reach this node"
        );
    }
    let listener = api::bind(SocketAddr::new(address, cfg.api_port)).await?;
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let tls = match &cfg.client_ca_pem {
        None => ApiTls::None,
        Some(ca) => ApiTls::ClusterCa(api::ServingSpec {
            dir: cfg.state_dir.join("pki"),
            node: cfg.node_name.clone(),
            // The addresses the Node publishes (node::NodeFacts::status), which the
            // approver checks the request against.
            sans: node_ip
                .iter()
                .map(ToString::to_string)
                .chain([cfg.node_name.clone()])
                .collect(),
            ca_pem: ca.as_str().into(),
        }),
    };
    Ok(ApiListener {
        listener,
        port,
        tls,
    })
}

/// How often the API's serving certificate is checked for renewal.
const SERVING_CERT_CHECK: Duration = Duration::from_secs(600);
/// How long to wait between requests for a serving certificate that was not issued.
const SERVING_CERT_RETRY: Duration = Duration::from_secs(5);

/// Serves the agent API. With a certificate of the cluster CA to get, the listener starts
/// serving once it is issued (the pods do not wait for it), and it is renewed in the
/// background.
pub(crate) fn serve_api(client: &Client, api: ApiListener, ctx: api::ApiCtx) -> Task {
    match api.tls {
        ApiTls::None => Task(api::serve(api.listener, ctx, None)),
        ApiTls::ClusterCa(spec) => {
            let client = client.clone();
            Task::spawn(async move {
                let id = spec.obtain(&client, SERVING_CERT_RETRY).await;
                let tls = match api::AgentTls::serving(&id, &spec.ca_pem) {
                    Ok(tls) => tls,
                    Err(e) => {
                        warn!(error = %e, "the agent API's serving certificate is unusable; not serving");
                        return;
                    }
                };
                // Aborting this task drops both, which aborts them.
                let _renew = Task::spawn(api::renew_when_due(
                    spec,
                    client,
                    tls.serving_cert(),
                    SERVING_CERT_CHECK,
                ));
                let _server = Task(api::serve(api.listener, ctx, Some(tls)));
                std::future::pending::<()>().await;
            })
        }
    }
}

/// The registered Node: what its status is made from, its Lease renewal and its pod CIDR.
pub(crate) struct Registered {
    pub facts: node::NodeFacts,
    pub lease: Task,
    pub pod_cidr: String,
    /// Pulls post the node status at once, so `status.images` follows them.
    pub image_changes: Arc<tokio::sync::Notify>,
}

pub(crate) async fn start_node(
    cfg: &AgentConfig,
    client: &Client,
    host: &Host,
    api: &ApiListener,
    node_ip: Option<Ipv4Addr>,
) -> Result<Registered, AgentError> {
    let facts = node::NodeFacts {
        name: cfg.node_name.clone(),
        pod_cidr_flag: cfg.pod_cidr.clone(),
        labels: cfg.node_labels.clone(),
        host: host.report.clone(),
        // Published from the first status on: the serving certificate's request is approved
        // only for the Node's own addresses.
        internal_ip: node_ip.map(|ip| ip.to_string()),
        max_pods: cfg.max_pods,
        service_lb: None,
        api_port: api.port,
        images: skiff_image::ImageStore::open(&images::store_root(&cfg.state_dir)).ok(),
    };
    let image_changes = Arc::new(tokio::sync::Notify::new());
    let registered = node::register(client, &facts).await?;
    // The Lease is renewed from now on, also while waiting for a pod CIDR, so the node
    // lifecycle controller sees a live node.
    let lease = Task::spawn(node::lease_loop(client.clone(), cfg.clone()));
    let registered_cidr = registered
        .spec
        .as_ref()
        .map(|s| s.pod_cidr.clone())
        .filter(|c| !c.is_empty())
        .or_else(|| cfg.pod_cidr.clone());
    let pod_cidr = match registered_cidr {
        Some(c) => c,
        None => node::wait_for_pod_cidr(client, &cfg.node_name).await?,
    };
    Ok(Registered {
        facts,
        lease,
        pod_cidr,
        image_changes,
    })
}

/// The node's network: the pod network, the node's address and its uplink.
pub(crate) struct Network {
    pub net: Arc<NodeNetwork>,
    pub host_ip: Option<String>,
    /// The uplink device and its global IPv4 address.
    pub uplink: Option<(String, Ipv4Addr)>,
}

pub(crate) async fn start_network(
    cfg: &AgentConfig,
    pod_cidr: &str,
) -> Result<Network, AgentError> {
    let net = Arc::new(
        NodeNetwork::new(NodeNetworkConfig {
            node_netns: cfg.node_netns.clone(),
            pod_cidr: pod_cidr.to_string(),
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
    Ok(Network {
        net,
        host_ip,
        uplink,
    })
}

/// The Service load balancer (loaded before the Node's status goes out, so the Node says at
/// once whether it balances Services). Without it, programs an earlier agent left attached
/// are detached.
pub(crate) fn start_service_lb(
    cfg: &AgentConfig,
    cgroup_parent: &Path,
    net: &Network,
) -> Subsystem<Arc<proxy::Proxy>> {
    if !cfg.service_lb {
        detach_stale_service_lb(&cfg.node_name);
        return Subsystem::Off("disabled (--no-service-lb)".to_string());
    }
    match load_service_lb(&cfg.node_name, cgroup_parent, cfg.lb) {
        Ok(mut lb) => {
            // SNATed flows to LoadBalancer addresses come back to this node's own address.
            let snat = net.uplink.as_ref().map(|(_, ip)| *ip);
            if let Err(e) = lb.set_snat_address(snat) {
                warn!(error = %e, "NodePort SNAT address not set: SNAT to each frontend's own");
            }
            Subsystem::Running(proxy::Proxy::new(
                lb,
                &cfg.node_name,
                net.uplink.iter().map(|(_, ip)| IpAddr::V4(*ip)).collect(),
            ))
        }
        Err(e) => {
            warn!(error = %e, "eBPF Service load balancing unavailable: ClusterIP Services do not work from this node's pods");
            detach_stale_service_lb(&cfg.node_name);
            Subsystem::Off(e)
        }
    }
}

/// The passthrough to the API server on the node's address, to which the load balancer
/// sends the `kubernetes` Service: pods reach the API server through this node.
pub(crate) async fn start_api_proxy(
    cfg: &AgentConfig,
    lb: &Subsystem<Arc<proxy::Proxy>>,
    net: &Network,
) -> Subsystem<apiproxy::ApiProxy> {
    let (p, ip, url) = match (lb, &net.host_ip, &cfg.api_server_url) {
        (_, _, None) => return Subsystem::Off("no API server URL".into()),
        _ if cfg.api_server_proxy_port == 0 => return Subsystem::Off("port 0".into()),
        (Subsystem::Off(_), _, _) => return Subsystem::Off("no Service load balancer".into()),
        (_, None, _) => return Subsystem::Off("the node has no address".into()),
        (Subsystem::Running(p), Some(ip), Some(url)) => (p, ip, url),
    };
    match listen_api_proxy(
        cfg.node_netns.as_deref(),
        ip,
        cfg.api_server_proxy_port,
        url,
    )
    .await
    {
        Ok(a) => {
            p.route_locally(
                ObjectKey::new(
                    skiff_api::wellknown::KUBERNETES_SERVICE_NAMESPACE,
                    skiff_api::wellknown::KUBERNETES_SERVICE_NAME,
                ),
                BackendAddr {
                    ip: a.addr.ip(),
                    port: a.addr.port(),
                },
            );
            Subsystem::Running(a)
        }
        Err(e) => {
            warn!(error = %e, "pods cannot reach the API server through the kubernetes Service");
            Subsystem::Off(e)
        }
    }
}

/// Starts the passthrough to the API server at `<host_ip>:<port>` in the node's namespace.
async fn listen_api_proxy(
    netns: Option<&Path>,
    host_ip: &str,
    port: u16,
    url: &str,
) -> Result<apiproxy::ApiProxy, String> {
    let ip: IpAddr = host_ip
        .parse()
        .map_err(|e| format!("node address {host_ip:?}: {e}"))?;
    let upstreams = apiproxy::upstreams_of(url).map_err(|e| e.to_string())?;
    apiproxy::ApiProxy::start(netns, SocketAddr::new(ip, port), upstreams)
        .await
        .map_err(|e| e.to_string())
}

/// The cluster DNS on `<host_ip>:<dns port>` in the node's namespace; the load balancer
/// sends the `kube-system/kube-dns` Service there.
pub(crate) async fn start_cluster_dns(
    cfg: &AgentConfig,
    informers: &Informers,
    lb: &Subsystem<Arc<proxy::Proxy>>,
    net: &Network,
) -> Subsystem<dns::ClusterDns> {
    let (proxy, host_ip) = match (lb, &net.host_ip) {
        _ if cfg.dns_port == 0 => return Subsystem::Off("port 0".into()),
        (Subsystem::Off(_), _) => return Subsystem::Off("no Service load balancer".into()),
        (_, None) => return Subsystem::Off("the node has no address".into()),
        (Subsystem::Running(p), Some(ip)) => (p, ip),
    };
    let ip: IpAddr = match host_ip.parse() {
        Ok(ip) => ip,
        Err(e) => {
            warn!(error = %e, "node address {host_ip:?}: no cluster DNS");
            return Subsystem::Off(format!("node address {host_ip:?}: {e}"));
        }
    };
    let upstream = cfg
        .dns_upstream
        .clone()
        .unwrap_or_else(|| dns::upstream_from_resolv_conf(Path::new("/etc/resolv.conf")));
    let view = dns::Informed {
        services: informers.get::<skiff_api::api::Service>(),
        endpoints: informers.get::<skiff_api::api::Endpoints>(),
    };
    let handler = dns::Handler::new(Box::new(view), &cfg.cluster_domain, &upstream);
    let addr = SocketAddr::new(ip, cfg.dns_port);
    match dns::ClusterDns::start(cfg.node_netns.as_deref(), addr, handler).await {
        Ok(d) => {
            proxy.route_locally(
                ObjectKey::new("kube-system", "kube-dns"),
                BackendAddr {
                    ip: d.addr.ip(),
                    port: d.addr.port(),
                },
            );
            Subsystem::Running(d)
        }
        Err(e) => {
            warn!(error = %e, "cluster DNS unavailable on this node");
            Subsystem::Off(e.to_string())
        }
    }
}

/// NetworkPolicy enforcement and its flow records. Without it, programs an earlier agent
/// left attached are detached.
pub(crate) fn start_network_policy(
    cfg: &AgentConfig,
    cgroup_parent: &Path,
    net: &Network,
    cluster_dns: &Subsystem<dns::ClusterDns>,
    lb: &Subsystem<Arc<proxy::Proxy>>,
) -> Subsystem<Arc<netpol::NetworkPolicies>> {
    if !cfg.network_policy {
        detach_stale_network_policy(&cfg.node_name);
        return Subsystem::Off("disabled (--no-network-policy)".into());
    }
    let mut host_ips: Vec<Ipv4Addr> = net.uplink.iter().map(|(_, ip)| *ip).collect();
    host_ips.extend(
        net.host_ip
            .as_deref()
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok()),
    );
    host_ips.sort();
    host_ips.dedup();
    let host_services = cluster_dns
        .running()
        .map(|d| netpol_dns_services(d.addr.port()))
        .unwrap_or_default();
    let mut enforcer = match load_network_policy(&cfg.node_name, cgroup_parent) {
        Ok(e) => e,
        Err(e) => {
            warn!(error = %e, "eBPF NetworkPolicy enforcement unavailable: policies are not enforced on this node");
            detach_stale_network_policy(&cfg.node_name);
            return Subsystem::Off(e);
        }
    };
    // Flow records go from the reader thread to the task that names them; a full queue drops
    // records rather than slowing the reader.
    let (flow_tx, flow_rx) = tokio::sync::mpsc::channel(8192);
    let reader = enforcer.start_flows(move |ev| {
        let _ = flow_tx.try_send(ev);
    });
    let np =
        netpol::NetworkPolicies::new(Box::new(enforcer), &cfg.node_name, host_ips, host_services);
    match reader {
        Ok(r) => {
            np.keep_flow_reader(r);
            tokio::spawn(np.clone().record_flows(flow_rx, lb.running().cloned()));
        }
        Err(e) => warn!(error = %e, "flow records unavailable"),
    }
    Subsystem::Running(np)
}

/// The eBPF per-pod traffic accounting, attached to the pods' cgroup parent.
pub(crate) fn start_accounting(
    cfg: &AgentConfig,
    cgroup_parent: &Path,
) -> Subsystem<Arc<Mutex<Accounting>>> {
    if !cfg.accounting {
        return Subsystem::Off("disabled".into());
    }
    match load_accounting(&cfg.node_name, cgroup_parent) {
        Ok(acc) => Subsystem::Running(Arc::new(Mutex::new(acc))),
        Err(e) => {
            warn!(error = %e, "eBPF traffic accounting unavailable");
            Subsystem::Off(e)
        }
    }
}

/// NodePort from outside and the fast path into local pods: the tc program on the uplink
/// (pod veths get it as they attach).
pub(crate) async fn start_nodeport(
    datapath: &crate::pod_datapath::PodDatapath,
    net: &Network,
) -> Subsystem<TcAttach> {
    let Some((name, ip)) = &net.uplink else {
        warn!("no uplink with a global IPv4 address: NodePort Services are not served");
        return Subsystem::Off("no uplink with a global IPv4 address".into());
    };
    match datapath.attach_nodeport(name).await {
        Some(how) => {
            info!(uplink = %name, %ip, ?how, "NodePort served on the uplink");
            Subsystem::Running(how)
        }
        None => Subsystem::Off(format!("attaching to {name} failed")),
    }
}

/// The cluster-wide controllers, sharing `informers`.
pub(crate) fn start_controllers(
    cfg: &AgentConfig,
    informers: &Informers,
    network: &Network,
    lb: &Subsystem<Arc<proxy::Proxy>>,
    network_policy: &Subsystem<Arc<netpol::NetworkPolicies>>,
) -> Controllers {
    let stop = CancelToken::new();
    let l2_stop = stop.child();
    let net = network.net.clone();
    let l2_announcer = match (lb, &network.uplink) {
        (Subsystem::Off(why), _) => Subsystem::Off(format!("no Service load balancer: {why}")),
        (_, None) => Subsystem::Off("no uplink with a global IPv4 address".into()),
        (Subsystem::Running(p), Some((uplink, _))) => {
            let announcer = l2::L2Announcer::new(
                informers.client(),
                &cfg.node_name,
                p.clone(),
                cfg.node_netns.clone(),
                uplink,
            );
            Subsystem::Running(Task::spawn(
                announcer.run(informers.clone(), l2_stop.clone()),
            ))
        }
    };
    let routes = Task::spawn({
        let (name, stop, informers) = (cfg.node_name.clone(), stop.clone(), informers.clone());
        async move { routes::PeerRoutes::run(&name, net, &informers, stop).await }
    });
    let spawn_lb =
        |p: &Arc<proxy::Proxy>| Task::spawn(p.clone().run(informers.clone(), stop.clone()));
    let spawn_np = |np: &Arc<netpol::NetworkPolicies>| {
        Task::spawn(np.clone().run(informers.clone(), stop.clone()))
    };
    let service_lb = match lb {
        Subsystem::Running(p) => Subsystem::Running(spawn_lb(p)),
        Subsystem::Off(why) => Subsystem::Off(why.clone()),
    };
    let network_policy = match network_policy {
        Subsystem::Running(np) => Subsystem::Running(spawn_np(np)),
        Subsystem::Off(why) => Subsystem::Off(why.clone()),
    };
    Controllers {
        stop: CancelOnDrop(stop),
        routes,
        service_lb,
        network_policy,
        l2_announcer,
        l2_stop,
    }
}

/// Image garbage collection every `image_gc_period`, keeping the images the node's pods name.
pub(crate) fn start_image_gc(
    cfg: &AgentConfig,
    images: &Result<Arc<images::ImageService>, String>,
    pods: &api::PodRegistry,
) -> Subsystem<Task> {
    let images = match images {
        Ok(i) => i.clone(),
        Err(why) => return Subsystem::Off(format!("no image store: {why}")),
    };
    let (pods, policy, period) = (pods.clone(), cfg.image_gc, cfg.image_gc_period);
    Subsystem::Running(Task::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            if let Err(e) = images.collect(&policy, &pods.images()).await {
                warn!(error = %e, "image garbage collection");
            }
        }
    }))
}

/// Loads the device filter and releases the confinement an earlier agent left for pods that
/// are gone (their pins would otherwise stay). The running pods' workers confine theirs again,
/// taking the pinned links over.
pub(crate) async fn start_device_filter(
    node: &str,
    runtime: &dyn Runtime,
) -> Subsystem<Arc<Mutex<dyn DeviceConfinement>>> {
    let mut filter = match DeviceFilter::load(&skiff_datapath::node_pin_dir(node)) {
        Ok(f) => f,
        Err(e) => {
            error!(error = %e, "eBPF device confinement unavailable: pods without a privileged container will not start");
            return Subsystem::Off(e.to_string());
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
    Subsystem::Running(Arc::new(Mutex::new(filter)))
}

fn load_accounting(node: &str, cgroup_parent: &Path) -> Result<Accounting, String> {
    let mut acc =
        Accounting::load(&skiff_datapath::node_pin_dir(node)).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(cgroup_parent).map_err(|e| e.to_string())?;
    acc.attach(cgroup_parent).map_err(|e| e.to_string())?;
    Ok(acc)
}

/// Loads the Service load balancer (reusing the maps and links an earlier agent pinned) and
/// attaches it to the node's pod cgroup parent.
fn load_service_lb(node: &str, cgroup_parent: &Path, cfg: LbConfig) -> Result<ServiceLb, String> {
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
    cgroup_parent: &Path,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subsystem_is_running_or_off_with_its_reason() {
        let on: Subsystem<u8> = Ok(1).into();
        let off: Subsystem<u8> = Err("disabled (--no-service-lb)".to_string()).into();
        assert_eq!((on.running(), on.off()), (Some(&1), None));
        assert_eq!(
            (off.running(), off.off()),
            (None, Some("disabled (--no-service-lb)"))
        );
        assert_eq!(off.to_result(), Err("disabled (--no-service-lb)".into()));
    }
}
