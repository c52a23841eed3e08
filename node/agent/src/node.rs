//! The agent's Node object and Lease: registration, capacity, addresses, conditions, and the
//! heartbeat the node lifecycle controller watches.
//!
//! The Node is registered with its capacity, addresses, `--node-labels`, `Ready` and
//! `ResourceLimitsEnforced` (naming the cgroup controllers the host lacks); the Lease in
//! `kube-node-lease` is renewed from registration on. The pod CIDR comes from `spec.podCIDR`
//! (set by the node IPAM controller; the agent watches its Node until it is, unless
//! `--pod-cidr` was given). The node status is posted every `--status-interval`, at once when
//! the Node shows `Ready=Unknown` (the node lifecycle controller's mark while the agent was
//! unreachable), and after every image pull (`status.images`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::{
    Condition, DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, ObjectMeta,
};
use skiff_client::reflector::{Event, reflector};
use skiff_client::{Client, ClientError, ListParams};
use tracing::{info, warn};

use super::status::rfc3339;
use skiff_runtime::host::HostReport;

pub use super::status::LIMITS_CONDITION;
/// Node condition type saying whether the node's eBPF Service load balancer runs (absent when
/// it is switched off with `--no-service-lb`).
pub const SERVICE_LB_CONDITION: &str = "ServiceLoadBalancerReady";
/// Namespace of node leases, as in Kubernetes.
pub use skiff_client::node_lease::NAMESPACE as LEASE_NAMESPACE;

/// The node's memory in KiB (`MemTotal`).
pub(crate) fn meminfo_total_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn kernel_version() -> String {
    first_line("/proc/sys/kernel/osrelease")
}

/// The first line of a file, trimmed; "" when unreadable.
fn first_line(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.lines().next().unwrap_or("").trim().to_string())
        .unwrap_or_default()
}

/// The machine's identity as a kubelet reports it in `status.nodeInfo` (read from the same
/// files: machine-id, boot_id, the DMI product UUID, os-release's PRETTY_NAME).
fn host_identity() -> &'static (String, String, String, String) {
    static ID: std::sync::OnceLock<(String, String, String, String)> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let os_image = std::fs::read_to_string("/etc/os-release")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_default();
        (
            first_line("/etc/machine-id"),
            first_line("/proc/sys/kernel/random/boot_id"),
            first_line("/sys/class/dmi/id/product_uuid"),
            os_image,
        )
    })
}

/// The node's CPUs.
pub(crate) fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The Node's capacity: CPUs, memory and the pod limit.
pub fn capacity(max_pods: u32) -> BTreeMap<String, String> {
    let cpus = cpus();
    let mut c = BTreeMap::new();
    c.insert("cpu".into(), cpus.to_string());
    if let Some(kib) = meminfo_total_kib() {
        c.insert("memory".into(), format!("{kib}Ki"));
    }
    c.insert("pods".into(), max_pods.to_string());
    c
}

/// The node's conditions: Ready, which resource limits the host cannot enforce, and whether
/// the Service load balancer runs (`service_lb`: `None` when switched off).
pub fn conditions(
    host: &HostReport,
    service_lb: Option<&Result<(), String>>,
    previous: &[Condition],
    now: SystemTime,
) -> Vec<Condition> {
    let now_s = rfc3339(now);
    let keep_transition = |kind: &str, status: &str| {
        previous
            .iter()
            .find(|c| c.r#type == kind && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now_s.clone())
    };
    let ready = Condition {
        r#type: "Ready".into(),
        status: "True".into(),
        reason: "SkiffNodeReady".into(),
        message: "skiff-node is posting ready status".into(),
        last_heartbeat_time: now_s.clone(),
        last_transition_time: keep_transition("Ready", "True"),
        ..Default::default()
    };
    let (status, reason, message) = if host.missing_controllers.is_empty() {
        (
            "True",
            "CgroupControllersPresent",
            "cpu, memory and pids limits are enforced through cgroup v2".to_string(),
        )
    } else {
        (
            "False",
            "CgroupControllersMissing",
            format!(
                "the cgroup v2 tree at {} does not offer the {} controller(s): pod limits on \
                 them are not enforced",
                host.cgroup2_root.display(),
                host.missing_controllers.join(", ")
            ),
        )
    };
    let limits = Condition {
        r#type: LIMITS_CONDITION.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_heartbeat_time: now_s.clone(),
        last_transition_time: keep_transition(LIMITS_CONDITION, status),
        ..Default::default()
    };
    let mut out = vec![ready, limits];
    if let Some(lb) = service_lb {
        let (status, reason, message) = match lb {
            Ok(()) => (
                "True",
                "SocketLBAttached",
                "eBPF socket load balancing for ClusterIP Services is attached to the pods' \
                 cgroups"
                    .to_string(),
            ),
            Err(e) => (
                "False",
                "SocketLBUnavailable",
                format!("ClusterIP Services do not work from this node's pods: {e}"),
            ),
        };
        out.push(Condition {
            r#type: SERVICE_LB_CONDITION.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_heartbeat_time: now_s.clone(),
            last_transition_time: keep_transition(SERVICE_LB_CONDITION, status),
            ..Default::default()
        });
    }
    out
}

/// Everything the agent reports about its node.
pub struct NodeFacts {
    pub name: String,
    pub pod_cidr_flag: Option<String>,
    /// Labels the Node gets at registration (`--node-labels`), next to the well-known ones.
    pub labels: std::collections::BTreeMap<String, String>,
    pub host: HostReport,
    pub internal_ip: Option<String>,
    pub max_pods: u32,
    /// Whether the Service load balancer loaded (`None`: switched off).
    pub service_lb: Option<Result<(), String>>,
    /// Port of the agent's HTTP API (0: none), published as
    /// `status.daemonEndpoints.kubeletEndpoint.Port`.
    pub api_port: u16,
    /// The node's image store, published as `status.images`.
    pub images: Option<skiff_image::ImageStore>,
}

/// `status.images`: one entry per image (manifest digest) with every name it was pulled as
/// and `<repository>@<digest>`, biggest first, as the kubelet lists them.
fn images_of(store: &skiff_image::ImageStore) -> Vec<skiff_api::api::ContainerImage> {
    let Ok(records) = store.list() else {
        return Vec::new();
    };
    let mut by_digest: std::collections::BTreeMap<String, skiff_api::api::ContainerImage> =
        std::collections::BTreeMap::new();
    for r in records {
        let entry = by_digest.entry(r.digest.clone()).or_default();
        let repository = r
            .name
            .split('@')
            .next()
            .map(|n| match n.rsplit_once(':') {
                Some((repo, tag)) if !tag.contains('/') => repo,
                _ => n,
            })
            .unwrap_or(&r.name);
        for name in [format!("{repository}@{}", r.digest), r.name.clone()] {
            if !entry.names.contains(&name) {
                entry.names.push(name);
            }
        }
        entry.size_bytes = i64::try_from(r.size).unwrap_or(i64::MAX);
    }
    let mut images: Vec<_> = by_digest.into_values().collect();
    images.sort_by(|a, b| b.size_bytes.cmp(&a.size_bytes).then(a.names.cmp(&b.names)));
    images
}

impl NodeFacts {
    fn status(&self, previous: Option<&NodeStatus>) -> NodeStatus {
        let cap = capacity(self.max_pods);
        let mut addresses = vec![NodeAddress {
            r#type: "Hostname".into(),
            address: self.name.clone(),
        }];
        if let Some(ip) = &self.internal_ip {
            addresses.insert(
                0,
                NodeAddress {
                    r#type: "InternalIP".into(),
                    address: ip.clone(),
                },
            );
        }
        NodeStatus {
            allocatable: cap.clone(),
            capacity: cap,
            conditions: conditions(
                &self.host,
                self.service_lb.as_ref(),
                previous.map(|p| p.conditions.as_slice()).unwrap_or(&[]),
                SystemTime::now(),
            ),
            addresses,
            node_info: Some(NodeSystemInfo {
                machine_id: host_identity().0.clone(),
                boot_id: host_identity().1.clone(),
                system_uuid: host_identity().2.clone(),
                os_image: host_identity().3.clone(),
                kernel_version: kernel_version(),
                operating_system: "linux".into(),
                architecture: std::env::consts::ARCH.into(),
                kubelet_version: format!("skiff-node/{}", env!("CARGO_PKG_VERSION")),
                container_runtime_version: "skiff-native/1".into(),
                ..Default::default()
            }),
            phase: String::new(),
            daemon_endpoints: (self.api_port != 0).then(|| NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(self.api_port),
                }),
            }),
            images: self.images.as_ref().map(images_of).unwrap_or_default(),
        }
    }
}

/// Creates or updates this node's Node object and returns it (with `spec.podCIDR` as the
/// control plane set it, or from `--pod-cidr` when it set none).
pub async fn register(client: &Client, facts: &NodeFacts) -> Result<Node, ClientError> {
    let api = client.cluster::<Node>();
    loop {
        let existing = api.get_opt(&facts.name).await?;
        let result = match existing {
            None => {
                let node = Node {
                    metadata: Some(ObjectMeta {
                        name: facts.name.clone(),
                        labels: facts
                            .labels
                            .clone()
                            .into_iter()
                            .chain([
                                ("kubernetes.io/hostname".to_string(), facts.name.clone()),
                                ("kubernetes.io/os".to_string(), "linux".to_string()),
                            ])
                            .collect(),
                        ..Default::default()
                    }),
                    spec: Some(NodeSpec {
                        pod_cidr: facts.pod_cidr_flag.clone().unwrap_or_default(),
                        pod_cidrs: facts.pod_cidr_flag.iter().cloned().collect(),
                        ..Default::default()
                    }),
                    status: Some(facts.status(None)),
                    ..Default::default()
                };
                info!(node = %facts.name, "registering node");
                api.create(&node).await
            }
            Some(mut node) => {
                let mut changed = false;
                let meta = node.metadata.get_or_insert_with(Default::default);
                for (k, v) in &facts.labels {
                    if meta.labels.get(k) != Some(v) {
                        meta.labels.insert(k.clone(), v.clone());
                        changed = true;
                    }
                }
                let spec = node.spec.get_or_insert_with(Default::default);
                if spec.pod_cidr.is_empty()
                    && let Some(cidr) = &facts.pod_cidr_flag
                {
                    spec.pod_cidr = cidr.clone();
                    spec.pod_cidrs = vec![cidr.clone()];
                    changed = true;
                }
                if changed {
                    node = match api.update(&node).await {
                        Ok(n) => n,
                        Err(ClientError::Conflict { .. }) => continue,
                        Err(e) => return Err(e),
                    };
                }
                node.status = Some(facts.status(node.status.as_ref()));
                api.update_status(&node).await
            }
        };
        match result {
            Ok(node) => return Ok(node),
            Err(ClientError::Conflict { .. } | ClientError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The status of the Node's Ready condition ("" when it has none).
pub fn ready_status(node: &Node) -> &str {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == "Ready"))
        .map(|c| c.status.as_str())
        .unwrap_or("")
}

/// Refreshes the node's status (heartbeat and conditions).
pub async fn heartbeat(client: &Client, facts: &NodeFacts) -> Result<(), ClientError> {
    let api = client.cluster::<Node>();
    for _ in 0..5 {
        let mut node = api.get(&facts.name).await?;
        node.status = Some(facts.status(node.status.as_ref()));
        match api.update_status(&node).await {
            Ok(_) => return Ok(()),
            Err(ClientError::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits, watching the Node, until the node IPAM controller has set `spec.podCIDR` (the
/// agent was started without `--pod-cidr` and the Node had none).
pub(crate) async fn wait_for_pod_cidr(
    client: &Client,
    node_name: &str,
) -> Result<String, crate::AgentError> {
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
    Err(crate::AgentError::NoPodCidr(node_name.to_string()))
}

pub(crate) async fn lease_loop(client: Client, cfg: crate::AgentConfig) {
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
pub(crate) async fn heartbeat_loop(
    client: Client,
    facts: NodeFacts,
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
                let not_ready = nodes.iter().any(|n| ready_status(n) == "Unknown");
                if not_ready && last_post.elapsed() < Duration::from_secs(1) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                not_ready
            }
        };
        if due {
            if let Err(e) = heartbeat(&client, &facts).await {
                warn!(error = %e, "updating node status");
            }
            last_post = tokio::time::Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn status_images_group_names_by_digest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = skiff_image::ImageStore::open(dir.path()).expect("store");
        let image = |seed: &[u8], size: u64| skiff_image::Image {
            manifest: skiff_image::Digest::of(seed),
            config: serde_json::from_str(
                r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#,
            )
            .expect("config"),
            layers: Vec::new(),
            size,
        };
        let big = image(b"big", 900);
        store.remember("r:5000/big:v1", &big).expect("remember");
        store.remember("r:5000/big:latest", &big).expect("remember");
        store
            .remember("r:5000/small@sha256:00", &image(b"small", 10))
            .expect("remember");
        let images = images_of(&store);
        assert_eq!(images.len(), 2);
        assert_eq!(images[0].size_bytes, 900);
        let digest = skiff_image::Digest::of(b"big").to_string();
        assert_eq!(
            images[0].names,
            [
                format!("r:5000/big@{digest}"),
                "r:5000/big:latest".to_string(),
                "r:5000/big:v1".to_string()
            ]
        );
        assert!(
            images[1]
                .names
                .contains(&"r:5000/small@sha256:00".to_string())
        );
    }
    use super::*;
    use std::path::PathBuf;

    fn host(missing: &[&str]) -> HostReport {
        HostReport {
            cgroup2_root: PathBuf::from("/sys/fs/cgroup/unified"),
            controllers: vec![],
            missing_controllers: missing.iter().map(|s| s.to_string()).collect(),
            bpffs_mounted: true,
            btf_available: true,
        }
    }

    #[test]
    fn names_missing_controllers() {
        let c = conditions(&host(&["cpu", "memory"]), None, &[], SystemTime::UNIX_EPOCH);
        assert_eq!(c[0].r#type, "Ready");
        assert_eq!(c[1].status, "False");
        assert!(c[1].message.contains("cpu, memory"), "{}", c[1].message);
        assert_eq!(
            c.len(),
            2,
            "no Service LB condition when it is switched off"
        );
        let ok = conditions(&host(&[]), None, &c, SystemTime::UNIX_EPOCH);
        assert_eq!(ok[1].status, "True");
    }

    #[test]
    fn reports_the_service_load_balancer() {
        let failed = Err("loading the eBPF object: no BTF".to_string());
        let c = conditions(&host(&[]), Some(&failed), &[], SystemTime::UNIX_EPOCH);
        assert_eq!(c[2].r#type, SERVICE_LB_CONDITION);
        assert_eq!(
            (c[2].status.as_str(), c[2].reason.as_str()),
            ("False", "SocketLBUnavailable")
        );
        assert!(c[2].message.contains("no BTF"), "{}", c[2].message);
        let later = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(60);
        let ok = conditions(&host(&[]), Some(&Ok(())), &c, later);
        assert_eq!(ok[2].status, "True");
        assert_ne!(ok[2].last_transition_time, c[2].last_transition_time);
    }

    #[test]
    fn capacity_has_cpu_memory_pods() {
        let c = capacity(110);
        assert!(c["cpu"].parse::<u32>().unwrap() >= 1);
        assert!(c["memory"].ends_with("Ki"));
        assert_eq!(c["pods"], "110");
    }
}
