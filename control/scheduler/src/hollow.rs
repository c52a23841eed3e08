//! Hollow nodes, as Kubernetes' kubemark: Node objects with capacity and a `Ready`
//! condition but no agent behind them, and optionally a [`HollowKubelet`] that "runs" the
//! pods bound to them by writing a Running/Ready status (and finishes their deletion). For
//! scheduler tests and benchmarks at a scale no machine could run for real.
//!
//! ```no_run
//! # async fn demo(client: skiff_client::Client) -> Result<(), skiff_scheduler::hollow::HollowError> {
//! use skiff_scheduler::hollow::HollowNodes;
//! let nodes = HollowNodes::new(1000);
//! nodes.register(&client).await?;
//! let kubelet = nodes.run_pods(&client); // optional: pods bound to them become Running
//! # drop(kubelet);
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use futures::{StreamExt, TryStreamExt};
use skiff_api::Resource;
use skiff_api::api::{
    Condition, ContainerState, ContainerStateRunning, ContainerStatus, Node, NodeAddress, NodeSpec,
    NodeStatus, NodeSystemInfo, ObjectMeta, Pod, PodIp, PodStatus, Taint,
};
use skiff_client::reflector::{Event, object_key, reflector};
use skiff_client::{Client, ClientError, DeleteParams, ListParams};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
pub const ZONE_LABEL: &str = crate::plugins::ZONE_LABEL;
/// Label on every hollow node, so they can be told apart (and cleaned up).
pub const HOLLOW_LABEL: &str = "skiff.io/hollow";

/// Parallel API calls while registering nodes or writing pod statuses.
const CONCURRENCY: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum HollowError {
    #[error("registering hollow node {node}: {source}")]
    Register {
        node: String,
        #[source]
        source: ClientError,
    },
    #[error("deleting hollow node {node}: {source}")]
    Delete {
        node: String,
        #[source]
        source: ClientError,
    },
}

/// What one hollow node offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeShape {
    pub cpu: String,
    pub memory: String,
    pub pods: String,
    /// Extra labels (besides hostname, zone and [`HOLLOW_LABEL`]).
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
}

impl Default for NodeShape {
    /// 4 CPUs, 16Gi, 110 pods.
    fn default() -> Self {
        NodeShape {
            cpu: "4".into(),
            memory: "16Gi".into(),
            pods: "110".into(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
        }
    }
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// A Ready node named `name` shaped like `shape`, in `zone` if given.
pub fn node_object(name: &str, shape: &NodeShape, zone: Option<&str>) -> Node {
    let mut labels = shape.labels.clone();
    labels.insert(HOSTNAME_LABEL.into(), name.into());
    labels.insert(HOLLOW_LABEL.into(), "true".into());
    if let Some(z) = zone {
        labels.insert(ZONE_LABEL.into(), z.into());
    }
    let resources: BTreeMap<String, String> = [
        ("cpu", &shape.cpu),
        ("memory", &shape.memory),
        ("pods", &shape.pods),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.clone()))
    .collect();
    let now = now();
    Node {
        api_version: "v1".into(),
        kind: "Node".into(),
        metadata: Some(ObjectMeta {
            name: name.into(),
            labels,
            ..Default::default()
        }),
        spec: Some(NodeSpec {
            taints: shape.taints.clone(),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            capacity: resources.clone(),
            allocatable: resources,
            conditions: vec![Condition {
                r#type: "Ready".into(),
                status: "True".into(),
                reason: "HollowNodeReady".into(),
                message: "hollow node (no agent)".into(),
                last_heartbeat_time: now.clone(),
                last_transition_time: now,
                ..Default::default()
            }],
            addresses: vec![NodeAddress {
                r#type: "Hostname".into(),
                address: name.into(),
            }],
            node_info: Some(NodeSystemInfo {
                operating_system: "linux".into(),
                architecture: std::env::consts::ARCH.into(),
                kubelet_version: "hollow".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// A set of hollow nodes: `<prefix><i>` for i in 0..count, in zones `zone-<i % zones>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HollowNodes {
    pub prefix: String,
    pub count: usize,
    /// Number of zones (0: no zone label).
    pub zones: usize,
    pub shape: NodeShape,
}

impl HollowNodes {
    /// `count` nodes `hollow-node-<i>` of the default shape in 3 zones.
    pub fn new(count: usize) -> HollowNodes {
        HollowNodes {
            prefix: "hollow-node-".into(),
            count,
            zones: 3,
            shape: NodeShape::default(),
        }
    }

    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.into();
        self
    }

    pub fn with_shape(mut self, shape: NodeShape) -> Self {
        self.shape = shape;
        self
    }

    pub fn name(&self, i: usize) -> String {
        format!("{}{i}", self.prefix)
    }

    pub fn names(&self) -> Vec<String> {
        (0..self.count).map(|i| self.name(i)).collect()
    }

    /// The Node object of node `i`.
    pub fn node(&self, i: usize) -> Node {
        let zone = (self.zones > 0).then(|| format!("zone-{}", i % self.zones));
        node_object(&self.name(i), &self.shape, zone.as_deref())
    }

    /// Creates the nodes (32 at a time); a node that exists already gets this status.
    /// Returns their names.
    pub async fn register(&self, client: &Client) -> Result<Vec<String>, HollowError> {
        let api = client.cluster::<Node>();
        futures::stream::iter(0..self.count)
            .map(|i| {
                let api = api.clone();
                let node = self.node(i);
                async move {
                    let name = node.name().to_string();
                    let wrap = |source| HollowError::Register {
                        node: name.clone(),
                        source,
                    };
                    match api.create(&node).await {
                        Ok(_) => {}
                        Err(e) if e.is_already_exists() => {
                            let mut live = api.get(&name).await.map_err(wrap)?;
                            live.status = node.status.clone();
                            api.update_status(&live).await.map_err(wrap)?;
                        }
                        Err(e) => return Err(wrap(e)),
                    }
                    Ok(name)
                }
            })
            .buffered(CONCURRENCY)
            .try_collect()
            .await
    }

    /// Deletes the nodes (missing ones are fine).
    pub async fn delete(&self, client: &Client) -> Result<(), HollowError> {
        let api = client.cluster::<Node>();
        futures::stream::iter(self.names())
            .map(|name| {
                let api = api.clone();
                async move {
                    match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => Ok(()),
                        Err(e) if e.is_not_found() => Ok(()),
                        Err(source) => Err(HollowError::Delete { node: name, source }),
                    }
                }
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// Starts a [`HollowKubelet`] for these nodes.
    pub fn run_pods(&self, client: &Client) -> HollowKubelet {
        HollowKubelet::spawn(client, self.names())
    }
}

/// "Runs" the pods bound to a set of hollow nodes: writes status Running with Ready
/// conditions, a fake pod IP and running containers, and finishes the deletion of pods being
/// deleted; renews the nodes' Leases. Stops when dropped.
#[derive(Debug)]
pub struct HollowKubelet {
    task: JoinHandle<()>,
    leases: JoinHandle<()>,
    started: Arc<AtomicU64>,
}

impl Drop for HollowKubelet {
    fn drop(&mut self) {
        self.task.abort();
        self.leases.abort();
    }
}

/// How long a hollow node's Lease is valid, and how often it is renewed (an agent's
/// defaults).
pub const LEASE_DURATION: Duration = Duration::from_secs(40);
pub const LEASE_RENEW: Duration = Duration::from_secs(10);

/// Renews every node's Lease in `kube-node-lease` every [`LEASE_RENEW`], as agents do, so
/// the node lifecycle controller sees the hollow nodes alive.
async fn renew_leases(client: Client, nodes: Vec<String>) {
    let mut tick = tokio::time::interval(LEASE_RENEW);
    loop {
        tick.tick().await;
        futures::stream::iter(&nodes)
            .for_each_concurrent(CONCURRENCY, |node| {
                let client = &client;
                async move {
                    if let Err(e) =
                        skiff_client::node_lease::renew(client, node, LEASE_DURATION).await
                    {
                        tracing::debug!(node, error = %e, "renewing a hollow node's lease");
                    }
                }
            })
            .await;
    }
}

struct KubeletState {
    client: Client,
    nodes: HashSet<String>,
    started: Arc<AtomicU64>,
    ips: AtomicU64,
    in_flight: Mutex<HashSet<String>>,
    permits: Semaphore,
}

impl HollowKubelet {
    pub fn spawn(client: &Client, nodes: Vec<String>) -> HollowKubelet {
        let started = Arc::new(AtomicU64::new(0));
        let leases = tokio::spawn(renew_leases(client.clone(), nodes.clone()));
        let state = Arc::new(KubeletState {
            client: client.clone(),
            nodes: nodes.into_iter().collect(),
            started: started.clone(),
            ips: AtomicU64::new(0),
            in_flight: Mutex::new(HashSet::new()),
            permits: Semaphore::new(CONCURRENCY),
        });
        let task = tokio::spawn(async move {
            let mut events = Box::pin(reflector(client_all(&state.client), ListParams::default()));
            while let Some(ev) = events.next().await {
                match ev {
                    Event::Restarted(pods) => {
                        for p in pods {
                            state.clone().observe(p);
                        }
                    }
                    Event::Applied(p) => state.clone().observe(p),
                    Event::Deleted(_) => {}
                }
            }
        });
        HollowKubelet {
            task,
            leases,
            started,
        }
    }

    /// Pods this kubelet has marked Running so far.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }
}

fn client_all(client: &Client) -> skiff_client::Api<Pod> {
    client.all::<Pod>()
}

enum Action {
    Run,
    FinishDelete,
}

impl KubeletState {
    fn observe(self: Arc<Self>, pod: Pod) {
        let Some(node) = pod.spec.as_ref().map(|s| s.node_name.clone()) else {
            return;
        };
        if !self.nodes.contains(&node) {
            return;
        }
        let deleting = pod
            .metadata
            .as_ref()
            .is_some_and(|m| !m.deletion_timestamp.is_empty());
        let phase = pod.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("");
        let action = if deleting {
            Action::FinishDelete
        } else if phase.is_empty() || phase == "Pending" {
            Action::Run
        } else {
            return;
        };
        let key = object_key(&pod);
        {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            if !in_flight.insert(key.clone()) {
                return;
            }
        }
        tokio::spawn(async move {
            let Ok(_permit) = self.permits.acquire().await else {
                return;
            };
            let api = self.client.namespaced::<Pod>(pod.namespace());
            let result = match action {
                Action::FinishDelete => api
                    .delete(
                        pod.name(),
                        &DeleteParams {
                            grace_period_seconds: Some(0),
                            ..Default::default()
                        },
                    )
                    .await
                    .map(|_| ()),
                Action::Run => self.run(&api, pod, &node).await,
            };
            match result {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::warn!(pod = %key, error = %e, "hollow kubelet write failed"),
            }
            self.in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
        });
    }

    async fn run(
        &self,
        api: &skiff_client::Api<Pod>,
        mut pod: Pod,
        node: &str,
    ) -> Result<(), ClientError> {
        let n = self.ips.fetch_add(1, Ordering::Relaxed);
        let ip = format!("10.{}.{}.{}", 64 + (n >> 16) % 64, (n >> 8) % 256, n % 256);
        for _ in 0..5 {
            pod.status = Some(running_status(&pod, &ip, node));
            match api.update_status(&pod).await {
                Ok(_) => {
                    self.started.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if e.is_conflict() => pod = api.get(pod.name()).await?,
                Err(e) => return Err(e),
            }
            let phase = pod.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("");
            if !(phase.is_empty() || phase == "Pending") {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// A Running status with every container running and ready.
fn running_status(pod: &Pod, ip: &str, node: &str) -> PodStatus {
    let now = now();
    let previous = pod.status.clone().unwrap_or_default();
    let mut conditions: Vec<Condition> = previous
        .conditions
        .iter()
        .filter(|c| c.r#type == "PodScheduled")
        .cloned()
        .collect();
    for kind in ["Initialized", "ContainersReady", "Ready"] {
        conditions.push(Condition {
            r#type: kind.into(),
            status: "True".into(),
            last_transition_time: now.clone(),
            ..Default::default()
        });
    }
    let uid = pod.metadata.as_ref().map(|m| m.uid.as_str()).unwrap_or("");
    let host = node
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let host_ip = format!("192.0.2.{}", host % 250 + 1);
    PodStatus {
        phase: "Running".into(),
        conditions,
        host_ip: host_ip.clone(),
        host_ips: vec![PodIp { ip: host_ip }],
        pod_ip: ip.into(),
        pod_ips: vec![PodIp { ip: ip.into() }],
        start_time: now.clone(),
        container_statuses: pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| ContainerStatus {
                name: c.name.clone(),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: now.clone(),
                    }),
                    ..Default::default()
                }),
                ready: true,
                image: c.image.clone(),
                container_id: format!("hollow://{uid}/{}", c.name),
                started: Some(true),
                ..Default::default()
            })
            .collect(),
        qos_class: previous.qos_class,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_shape() {
        let nodes = HollowNodes::new(5);
        let n = nodes.node(4);
        assert_eq!(n.name(), "hollow-node-4");
        let labels = &n.metadata.as_ref().unwrap().labels;
        assert_eq!(labels[ZONE_LABEL], "zone-1");
        assert_eq!(labels[HOSTNAME_LABEL], "hollow-node-4");
        let status = n.status.as_ref().unwrap();
        assert_eq!(status.allocatable["cpu"], "4");
        assert_eq!(status.allocatable["memory"], "16Gi");
        assert_eq!(status.allocatable["pods"], "110");
        assert_eq!(status.conditions[0].r#type, "Ready");
        assert_eq!(status.conditions[0].status, "True");
        assert_eq!(nodes.names().len(), 5);
    }

    #[test]
    fn running_status_keeps_pod_scheduled() {
        let mut p = crate::testutil::pod("p");
        p.status = Some(PodStatus {
            phase: "Pending".into(),
            conditions: vec![Condition {
                r#type: "PodScheduled".into(),
                status: "True".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let s = running_status(&p, "10.64.0.1", "n");
        assert_eq!(s.phase, "Running");
        let kinds: Vec<&str> = s.conditions.iter().map(|c| c.r#type.as_str()).collect();
        assert_eq!(
            kinds,
            ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
        );
        assert!(s.container_statuses[0].ready);
        assert_eq!(s.pod_ip, "10.64.0.1");
    }
}
