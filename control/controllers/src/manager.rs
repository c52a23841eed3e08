//! The controller manager: runs the enabled controllers in one process, sharing informers,
//! optionally only while holding the leader Lease.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use futures::future::join_all;
use skiff_client::Client;
use skiff_client::controller::{
    CancelToken, EventRecorder, Informers, LeaderElectionConfig, LeaderElectionError, LeaderElector,
};

use crate::deployment::DeploymentController;
use crate::endpoints::EndpointsController;
use crate::gc;
use crate::namespace::NamespaceController;
use crate::nodelifecycle::{NodeLifecycleConfig, NodeLifecycleController};
use crate::ranges::{
    CidrBlocks, DEFAULT_CLUSTER_CIDR, DEFAULT_NODE_PORTS, DEFAULT_SERVICE_CIDR, Ipv4Cidr,
    PortRange, RangeError,
};
use crate::replicaset::ReplicaSetController;
use crate::serviceip::ServiceRanges;
use crate::{nodeipam, serviceip};
use skiff_api::api::{ReplicaSet, ReplicationController};

/// The component name in Events and the default Lease name.
pub const COMPONENT: &str = "skiff-controller-manager";

/// A controller the manager can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ControllerName {
    ReplicaSet,
    ReplicationController,
    Deployment,
    DaemonSet,
    StatefulSet,
    Disruption,
    Job,
    CronJob,
    HorizontalPodAutoscaling,
    Endpoints,
    ServiceAllocator,
    NodeIpam,
    GarbageCollector,
    Namespace,
    NodeLifecycle,
    ServiceAccount,
    CertificateSigningRequest,
    RootCaCertPublisher,
    PersistentVolumeBinder,
    ClusterRoleAggregation,
    LbIpam,
}

impl ControllerName {
    pub const ALL: [ControllerName; 21] = [
        ControllerName::ReplicaSet,
        ControllerName::ReplicationController,
        ControllerName::Deployment,
        ControllerName::DaemonSet,
        ControllerName::StatefulSet,
        ControllerName::Disruption,
        ControllerName::Job,
        ControllerName::CronJob,
        ControllerName::HorizontalPodAutoscaling,
        ControllerName::Endpoints,
        ControllerName::ServiceAllocator,
        ControllerName::NodeIpam,
        ControllerName::GarbageCollector,
        ControllerName::Namespace,
        ControllerName::NodeLifecycle,
        ControllerName::ServiceAccount,
        ControllerName::CertificateSigningRequest,
        ControllerName::RootCaCertPublisher,
        ControllerName::PersistentVolumeBinder,
        ControllerName::ClusterRoleAggregation,
        ControllerName::LbIpam,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            ControllerName::ReplicaSet => "replicaset",
            ControllerName::ReplicationController => "replicationcontroller",
            ControllerName::Deployment => "deployment",
            ControllerName::DaemonSet => "daemonset",
            ControllerName::StatefulSet => "statefulset",
            ControllerName::Disruption => "disruption",
            ControllerName::Job => "job",
            ControllerName::CronJob => "cronjob",
            ControllerName::HorizontalPodAutoscaling => "horizontalpodautoscaling",
            ControllerName::Endpoints => "endpoints",
            ControllerName::ServiceAllocator => "service-allocator",
            ControllerName::NodeIpam => "nodeipam",
            ControllerName::GarbageCollector => "garbagecollector",
            ControllerName::Namespace => "namespace",
            ControllerName::NodeLifecycle => "nodelifecycle",
            ControllerName::ServiceAccount => "serviceaccount",
            ControllerName::CertificateSigningRequest => "certificatesigningrequest",
            ControllerName::RootCaCertPublisher => "root-ca-cert-publisher",
            ControllerName::PersistentVolumeBinder => "persistentvolume-binder",
            ControllerName::ClusterRoleAggregation => "clusterrole-aggregation",
            ControllerName::LbIpam => "lbipam",
        }
    }

    /// The `source.component` of this controller's Events (as in Kubernetes).
    pub fn component(&self) -> &'static str {
        match self {
            ControllerName::ReplicaSet => "replicaset-controller",
            ControllerName::ReplicationController => "replication-controller",
            ControllerName::Deployment => "deployment-controller",
            ControllerName::DaemonSet => "daemonset-controller",
            ControllerName::StatefulSet => "statefulset-controller",
            ControllerName::Disruption => "controllermanager",
            ControllerName::Job => "job-controller",
            ControllerName::CronJob => "cronjob-controller",
            ControllerName::HorizontalPodAutoscaling => "horizontal-pod-autoscaler",
            ControllerName::Endpoints => "endpoint-controller",
            ControllerName::ServiceAllocator => "service-ip-allocator",
            ControllerName::NodeIpam => "node-ipam-controller",
            ControllerName::GarbageCollector => "garbage-collector-controller",
            ControllerName::Namespace => "namespace-controller",
            ControllerName::NodeLifecycle => "node-controller",
            ControllerName::ServiceAccount => "serviceaccount-controller",
            ControllerName::CertificateSigningRequest => "certificate-controller",
            ControllerName::RootCaCertPublisher => "root-ca-cert-publisher",
            ControllerName::PersistentVolumeBinder => "persistentvolume-controller",
            ControllerName::ClusterRoleAggregation => "clusterrole-aggregation-controller",
            ControllerName::LbIpam => "lbipam-controller",
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
    /// Where Services' clusterIPs come from (`--service-cluster-ip-range`).
    pub service_cluster_ip_range: Ipv4Cidr,
    /// Where NodePort Services' nodePorts come from (`--service-node-port-range`).
    pub service_node_port_range: PortRange,
    /// Where Nodes' pod CIDRs come from (`--cluster-cidr`)...
    pub cluster_cidr: Ipv4Cidr,
    /// ...in blocks of this prefix length (`--node-cidr-mask-size`).
    pub node_cidr_mask_size: u8,
    /// The node lifecycle controller's grace and monitor periods and eviction rate (checked by
    /// `NodeLifecycleConfig::validate`).
    pub node_lifecycle: NodeLifecycleConfig,
    /// The CA that signs approved certificate requests (`--cluster-signing-cert-file` and
    /// `--cluster-signing-key-file`); `None`: requests are approved but not signed.
    pub signing_ca: Option<std::sync::Arc<skiff_pki::Ca>>,
    /// The CA published as `kube-root-ca.crt` in every namespace (`--root-ca-file`, else the
    /// CA the manager's kubeconfig trusts); `None`: nothing is published.
    pub root_ca_pem: Option<std::sync::Arc<str>>,
    /// Where the default StorageClass' local-path volumes live on the nodes
    /// (`--local-path-root`).
    pub local_path_root: String,
}

impl ManagerConfig {
    /// Every controller, 4 workers each, leader election on the default Lease, Kubernetes'
    /// default ranges (services 10.96.0.0/16, node ports 30000-32767, pods 10.244.0.0/16 in
    /// /24 blocks).
    pub fn new(identity: &str) -> Self {
        ManagerConfig {
            controllers: ControllerName::ALL.into_iter().collect(),
            workers: 4,
            identity: identity.to_string(),
            leader_election: Some(LeaderElectionConfig::new(COMPONENT, identity)),
            service_cluster_ip_range: DEFAULT_SERVICE_CIDR,
            service_node_port_range: DEFAULT_NODE_PORTS,
            cluster_cidr: DEFAULT_CLUSTER_CIDR,
            node_cidr_mask_size: 24,
            node_lifecycle: NodeLifecycleConfig::default(),
            signing_ca: None,
            root_ca_pem: None,
            local_path_root: crate::volumes::DEFAULT_NODE_PATH.into(),
        }
    }

    /// The ranges of the Service allocator; the service CIDR needs host addresses (a prefix
    /// length of at most 30).
    pub fn service_ranges(&self) -> Result<ServiceRanges, RangeError> {
        ServiceRanges::new(self.service_cluster_ip_range, self.service_node_port_range)
    }

    /// The pod CIDR blocks of node IPAM.
    pub fn pod_cidr_blocks(&self) -> Result<CidrBlocks, RangeError> {
        CidrBlocks::new(self.cluster_cidr, self.node_cidr_mask_size)
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
            ControllerName::ReplicaSet => Box::pin(ReplicaSetController::<ReplicaSet>::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::ReplicationController => {
                Box::pin(ReplicaSetController::<ReplicationController>::run(
                    &informers,
                    recorder(*c),
                    config.workers,
                    stop.clone(),
                ))
            }
            ControllerName::Deployment => Box::pin(DeploymentController::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::DaemonSet => Box::pin(crate::daemonset::DaemonSetController::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::Disruption => Box::pin(crate::disruption::DisruptionController::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::Job => Box::pin(crate::job::JobController::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::CronJob => Box::pin(crate::cronjob::CronJobController::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::StatefulSet => {
                Box::pin(crate::statefulset::StatefulSetController::run(
                    &informers,
                    recorder(*c),
                    config.workers,
                    stop.clone(),
                ))
            }
            ControllerName::HorizontalPodAutoscaling => Box::pin(crate::hpa::HpaController::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::Endpoints => Box::pin(EndpointsController::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::ServiceAccount => {
                Box::pin(crate::serviceaccount::ServiceAccountController::run(
                    &informers,
                    config.workers,
                    stop.clone(),
                ))
            }
            ControllerName::CertificateSigningRequest => {
                Box::pin(crate::certificates::CsrController::run(
                    &informers,
                    config.signing_ca.clone(),
                    config.workers,
                    stop.clone(),
                ))
            }
            ControllerName::RootCaCertPublisher => match &config.root_ca_pem {
                Some(ca) => Box::pin(crate::rootca::RootCaPublisher::run(
                    &informers,
                    std::sync::Arc::clone(ca),
                    config.workers,
                    stop.clone(),
                )),
                None => {
                    tracing::warn!(
                        "no root CA (--root-ca-file, or a kubeconfig with a CA): \
                         kube-root-ca.crt is not published"
                    );
                    continue;
                }
            },
            ControllerName::PersistentVolumeBinder => {
                Box::pin(crate::volumes::VolumeController::run(
                    &informers,
                    recorder(*c),
                    config.local_path_root.clone(),
                    config.workers,
                    stop.clone(),
                ))
            }
            ControllerName::ClusterRoleAggregation => Box::pin(
                crate::clusterroleaggregation::ClusterRoleAggregationController::run(
                    &informers,
                    config.workers,
                    stop.clone(),
                ),
            ),
            ControllerName::LbIpam => Box::pin(crate::lbipam::LbIpam::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::GarbageCollector => Box::pin(gc::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::Namespace => Box::pin(NamespaceController::run(
                &informers,
                recorder(*c),
                config.workers,
                stop.clone(),
            )),
            ControllerName::ServiceAllocator => match config.service_ranges() {
                Ok(ranges) => Box::pin(serviceip::run(
                    &informers,
                    recorder(*c),
                    ranges,
                    config.workers,
                    stop.clone(),
                )),
                Err(e) => {
                    tracing::error!(controller = %c, error = %e, "not starting");
                    continue;
                }
            },
            ControllerName::NodeIpam => match config.pod_cidr_blocks() {
                Ok(blocks) => Box::pin(nodeipam::run(
                    &informers,
                    recorder(*c),
                    blocks,
                    config.workers,
                    stop.clone(),
                )),
                Err(e) => {
                    tracing::error!(controller = %c, error = %e, "not starting");
                    continue;
                }
            },
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
        let all: BTreeSet<_> = ControllerName::ALL.into_iter().collect();
        assert_eq!(all.len(), 21);
        assert_eq!(parse_controllers("*").unwrap(), all);
        assert_eq!(parse_controllers("").unwrap(), all);
        assert_eq!(
            parse_controllers("replicaset").unwrap(),
            [ReplicaSet].into()
        );
        assert_eq!(
            parse_controllers("-deployment").unwrap(),
            [
                ReplicaSet,
                ReplicationController,
                DaemonSet,
                StatefulSet,
                Disruption,
                Job,
                CronJob,
                HorizontalPodAutoscaling,
                Endpoints,
                ServiceAllocator,
                NodeIpam,
                GarbageCollector,
                Namespace,
                NodeLifecycle,
                ServiceAccount,
                CertificateSigningRequest,
                RootCaCertPublisher,
                PersistentVolumeBinder,
                ClusterRoleAggregation,
                LbIpam
            ]
            .into()
        );
        assert_eq!(
            parse_controllers(
                "*,-replicaset,-replicationcontroller,-garbagecollector,-namespace,-nodelifecycle,-serviceaccount,\
                 -certificatesigningrequest,-root-ca-cert-publisher,-daemonset,-disruption,-job,-cronjob,-statefulset,-horizontalpodautoscaling,-persistentvolume-binder,\
                 -clusterrole-aggregation,-lbipam"
            )
            .unwrap(),
            [Deployment, Endpoints, ServiceAllocator, NodeIpam].into()
        );
        assert_eq!(
            parse_controllers(
                "ReplicaSet, replicationcontroller, deployment, daemonset, statefulset, disruption, job, cronjob, horizontalpodautoscaling, endpoints, service-allocator, nodeipam, garbagecollector, Namespace, NodeLifecycle, serviceaccount, certificatesigningrequest, root-ca-cert-publisher, persistentvolume-binder, clusterrole-aggregation, lbipam"
            )
            .unwrap(),
            all
        );
        assert_eq!(
            parse_controllers("endpoints,nodeipam,nodelifecycle").unwrap(),
            [Endpoints, NodeIpam, NodeLifecycle].into()
        );
        assert!(parse_controllers("replicaset,bogus").is_err());
    }
}
