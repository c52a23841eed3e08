//! Skiff's scheduler: assigns pending pods to nodes, as Kubernetes' kube-scheduler does.
//!
//! It talks only to the API server. Cluster state comes in as [`ClusterEvent`]s (node and pod
//! reflectors today, [`watch_cluster`]); the [`cache::Cache`] turns them into per-node
//! accounting incrementally, and each scheduling attempt works on a [`cache::Snapshot`] that
//! copies only what changed since the previous attempt. Pods wait in the
//! [`queue::SchedulingQueue`] (priority, then age); the [`framework::Algorithm`] filters
//! nodes and scores the feasible ones with the [`plugins`]; the winner is assumed in the
//! cache and bound through `pods/binding` asynchronously. A pod no node fits gets
//! `PodScheduled=False` with Kubernetes' per-reason message and a `FailedScheduling` event,
//! and is retried when nodes or pods change (or after `unschedulable_timeout`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), skiff_client::ClientError> {
//! use skiff_scheduler::{Scheduler, SchedulerConfig};
//! let client = skiff_client::Client::connect("http://127.0.0.1:7443").await?;
//! let handle = Scheduler::new(client, SchedulerConfig::default()).spawn();
//! // ... later
//! println!("{:?}", handle.stats());
//! handle.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Filters: NodeUnschedulable, NodeName, NodeReady, TaintToleration, NodeSelector,
//! NodeAffinity, NodeResourcesFit, InterPodAffinity and [`volumes::VolumeBinding`]; weighted
//! scores: LeastAllocated, BalancedAllocation, SelectorSpread, PreferNoSchedule taints,
//! preferred node affinity. On large clusters only enough feasible nodes are looked for
//! (Kubernetes' `percentageOfNodesToScore`). Leader election: see the binary's docs
//! (`control/scheduler/src/main.rs`).
//!
//! The scheduler never moves a bound pod and ignores pods of another `schedulerName`.

pub mod affinity;
pub mod cache;
pub mod framework;
pub mod plugins;
/// Quantities are parsed by the API crate, shared with the node agent.
pub use skiff_api::quantity;
pub mod queue;
pub mod resources;
pub mod scheduler;
pub mod volumes;

pub use scheduler::{
    ClusterEvent, DEFAULT_SCHEDULER_NAME, Scheduler, SchedulerConfig, SchedulerError,
    SchedulerHandle, SchedulerStats, watch_cluster,
};
