//! Hollow nodes, as Kubernetes' kubemark: Node objects with capacity and a `Ready`
//! condition but no agent behind them, and optionally a [`FakeKubelet`] that "runs" the
//! pods bound to them by writing a Running/Ready status (and finishes their deletion). For
//! scheduler tests and benchmarks at a scale no machine could run for real.
//!
//! ```no_run
//! # async fn demo(client: skiff_client::Client) -> Result<(), skiff_testkit::hollow::HollowError> {
//! use skiff_testkit::hollow::HollowNodes;
//! let nodes = HollowNodes::new(1000);
//! nodes.register(&client).await?;
//! let kubelet = nodes.run_pods(&client); // optional: pods bound to them become Running
//! # drop(kubelet);
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use skiff_api::Resource;
use skiff_api::api::{
    Condition, Node, NodeAddress, NodeSpec, NodeStatus, NodeSystemInfo, ObjectMeta, Taint,
};
use skiff_client::{Client, ClientError, DeleteParams};

use crate::kubelet::{FakeKubelet, now};

pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The well-known zone label (the scheduler's topology spreading reads it).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Label on every hollow node, so they can be told apart (and cleaned up).
pub const HOLLOW_LABEL: &str = "skiff.io/hollow";

/// Parallel API calls while registering nodes.
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

    /// Starts a [`FakeKubelet`] for these nodes.
    pub fn run_pods(&self, client: &Client) -> FakeKubelet {
        FakeKubelet::for_nodes(client, self.names())
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
}
