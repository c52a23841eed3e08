//! The controller manager: runs the enabled controllers in one process, sharing informers,
//! optionally only while holding the leader Lease.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use futures::future::join_all;
use skiff_client::Client;
use skiff_client::runtime::{
    CancelToken, EventRecorder, Informers, LeaderElectionConfig, LeaderElectionError, LeaderElector,
};

use crate::deployment::DeploymentController;
use crate::nodelifecycle::{NodeLifecycleConfig, NodeLifecycleController};
use crate::replicaset::ReplicaSetController;

/// The component name in Events and the default Lease name.
pub const COMPONENT: &str = "skiff-controller-manager";

/// A controller the manager can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ControllerName {
    ReplicaSet,
    Deployment,
    NodeLifecycle,
}

impl ControllerName {
    pub const ALL: [ControllerName; 3] = [
        ControllerName::ReplicaSet,
        ControllerName::Deployment,
        ControllerName::NodeLifecycle,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            ControllerName::ReplicaSet => "replicaset",
            ControllerName::Deployment => "deployment",
            ControllerName::NodeLifecycle => "nodelifecycle",
        }
    }

    /// The `source.component` of this controller's Events (as in Kubernetes).
    pub fn component(&self) -> &'static str {
        match self {
            ControllerName::ReplicaSet => "replicaset-controller",
            ControllerName::Deployment => "deployment-controller",
            ControllerName::NodeLifecycle => "node-controller",
        }
    }
}

impl fmt::Display for ControllerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ControllerName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ControllerName::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                let known: Vec<&str> = ControllerName::ALL.iter().map(|c| c.as_str()).collect();
                format!("unknown controller {s:?} (known: {})", known.join(", "))
            })
    }
}

/// Parses `--controllers`: a comma-separated list of names; `*` means every controller,
/// `-name` switches one off. A list of only `-name`s starts from every controller
/// (`-deployment` = all but the Deployment controller).
pub fn parse_controllers(spec: &str) -> Result<BTreeSet<ControllerName>, String> {
    let items: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let only_negative = items.iter().all(|i| i.starts_with('-'));
    let mut on: BTreeSet<ControllerName> = if only_negative {
        ControllerName::ALL.into_iter().collect()
    } else {
        BTreeSet::new()
    };
    for item in items {
        if item == "*" {
            on.extend(ControllerName::ALL);
        } else if let Some(name) = item.strip_prefix('-') {
            on.remove(&name.parse()?);
        } else {
            on.insert(item.parse()?);
        }
    }
    Ok(on)
}

/// What the manager runs and how.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    pub controllers: BTreeSet<ControllerName>,
    /// Concurrent reconciles per controller.
    pub workers: usize,
    /// This instance's name (Events' `source.host`, the Lease holder).
    pub identity: String,
    /// `None`: run the controllers without leader election.
    pub leader_election: Option<LeaderElectionConfig>,
    /// The node lifecycle controller's grace and monitor periods and eviction rate (checked by
    /// `NodeLifecycleConfig::validate`).
    pub node_lifecycle: NodeLifecycleConfig,
}

impl ManagerConfig {
    /// Every controller, 4 workers each, leader election on the default Lease.
    pub fn new(identity: &str) -> Self {
        ManagerConfig {
            controllers: ControllerName::ALL.into_iter().collect(),
            workers: 4,
            identity: identity.to_string(),
            leader_election: Some(LeaderElectionConfig::new(COMPONENT, identity)),
            node_lifecycle: NodeLifecycleConfig::default(),
        }
    }
}

/// Runs the enabled controllers until `stop` is cancelled; they share one set of informers,
/// which stop when this returns.
pub async fn run_controllers(client: Client, config: &ManagerConfig, stop: CancelToken) {
    let informers = Informers::new(client.clone());
    let recorder =
        |c: ControllerName| EventRecorder::new(client.clone(), c.component(), &config.identity);
    let mut running = Vec::new();
    for c in &config.controllers {
        tracing::info!(controller = %c, "starting controller");
        let fut: futures::future::BoxFuture<'_, ()> = match c {
            ControllerName::ReplicaSet => Box::pin(ReplicaSetController::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::Deployment => Box::pin(DeploymentController::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::NodeLifecycle => Box::pin(NodeLifecycleController::run(
                &informers,
                recorder(*c),
                config.node_lifecycle.clone(),
                config.workers,
                stop.clone(),
            )),
        };
        running.push(fut);
    }
    if running.is_empty() {
        tracing::warn!("no controller enabled");
        stop.cancelled().await;
        return;
    }
    join_all(running).await;
    tracing::info!("controllers stopped");
}

/// Runs the manager until `shutdown` is cancelled: under leader election (the controllers run
/// only while this instance holds the Lease) or, without it, at once.
pub async fn run(
    client: Client,
    config: ManagerConfig,
    shutdown: CancelToken,
) -> Result<(), LeaderElectionError> {
    match &config.leader_election {
        Some(le) => {
            let elector = LeaderElector::new(&client, le.clone()).with_shutdown(shutdown);
            elector
                .run(|leading| run_controllers(client.clone(), &config, leading))
                .await
        }
        None => {
            run_controllers(client, &config, shutdown).await;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_lists() {
        use ControllerName::*;
        let all: BTreeSet<_> = [ReplicaSet, Deployment, NodeLifecycle].into();
        assert_eq!(parse_controllers("*").unwrap(), all);
        assert_eq!(parse_controllers("").unwrap(), all);
        assert_eq!(
            parse_controllers("replicaset").unwrap(),
            [ReplicaSet].into()
        );
        assert_eq!(
            parse_controllers("-deployment").unwrap(),
            [ReplicaSet, NodeLifecycle].into()
        );
        assert_eq!(
            parse_controllers("*,-replicaset").unwrap(),
            [Deployment, NodeLifecycle].into()
        );
        assert_eq!(
            parse_controllers("ReplicaSet, deployment, NodeLifecycle").unwrap(),
            all
        );
        assert_eq!(
            parse_controllers("nodelifecycle").unwrap(),
            [NodeLifecycle].into()
        );
        assert!(parse_controllers("replicaset,bogus").is_err());
    }
}
