//! A highly available cluster for fault tests: a real 3-member etcd cluster, two API servers
//! over it (one PKI), two schedulers and two controller managers electing leaders, and real
//! nodes on one [`Fabric`]. Every component and agent is given both API servers
//! (`--server a,b`) and fails over between them.

use skiff_api::api::Lease;
use skiff_client::Client;

use crate::cluster::{LEASE_SECONDS, tail};
use crate::{ApiServer, Backend, Component, Election, EtcdCluster, Fabric, Node, unique};

/// The whole HA cluster. Dropped in field order: nodes and components before the servers,
/// the servers before etcd.
#[derive(Debug)]
pub struct HaCluster {
    pub nodes: Vec<Node>,
    pub schedulers: Vec<Component>,
    pub managers: Vec<Component>,
    pub fabric: Fabric,
    /// A client that fails over between the servers.
    pub client: Client,
    pub servers: Vec<ApiServer>,
    pub etcd: EtcdCluster,
    pub id: String,
}

impl HaCluster {
    /// Starts everything with `nodes` nodes (`e2e-<id>-n<i>`) and waits until they are Ready
    /// with a pod CIDR.
    pub async fn start(nodes: usize) -> HaCluster {
        let etcd = EtcdCluster::start(3).expect("a real etcd (run `cargo xtask setup`)");
        let endpoints = etcd.endpoints().join(",");
        let first = ApiServer::start(Backend::Etcd(endpoints.clone()));
        let second = first.start_beside(Backend::Etcd(endpoints));
        let servers = vec![first, second];
        let list = servers
            .iter()
            .map(|s| s.endpoint.clone())
            .collect::<Vec<_>>()
            .join(",");
        let mut config = servers[0].client_config();
        config.servers = servers.iter().map(|s| s.endpoint.clone()).collect();
        let client = Client::connect_with(&config)
            .await
            .expect("a client of both servers");
        let component = |binary: &str, identity: &str| {
            let election = Election {
                server: Some(list.clone()),
                lease_duration: LEASE_SECONDS.parse().ok(),
                identity: Some(identity.into()),
            };
            Component::start_elected(&servers[0], binary, election, &[])
        };
        let schedulers = vec![
            component("skiff-scheduler", "sched-1"),
            component("skiff-scheduler", "sched-2"),
        ];
        let managers = vec![
            component("skiff-controller-manager", "cm-1"),
            component("skiff-controller-manager", "cm-2"),
        ];
        let fabric = crate::fabric();
        let id = unique();
        let nodes = (0..nodes)
            .map(|i| {
                Node::start_failing_over(&servers[0], &format!("e2e-{id}-n{i}"), &fabric, &list)
            })
            .collect();
        let c = HaCluster {
            nodes,
            schedulers,
            managers,
            fabric,
            client,
            servers,
            etcd,
            id,
        };
        c.wait_nodes_ready().await;
        c
    }

    pub async fn wait_nodes_ready(&self) {
        crate::cluster::wait_nodes_ready(&self.client, self.nodes.len(), || self.logs()).await;
    }

    /// The index in `components` of the one holding Lease `kube-system/<lease>` now.
    pub async fn leader(&self, lease: &str, components: &[Component]) -> Option<usize> {
        let l = self
            .client
            .namespaced::<Lease>("kube-system")
            .get(lease)
            .await
            .ok()?;
        let holder = l.spec?.holder_identity?;
        components
            .iter()
            .position(|c| c.identity().is_some_and(|id| id == holder))
    }

    /// Every component's and agent's log tail, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.servers.iter().enumerate() {
            out += &format!("\n--- apiserver {i} ---\n{}", tail(&s.log()));
        }
        for c in self.schedulers.iter().chain(&self.managers) {
            out += &format!("\n--- {} ---\n{}", c.binary, tail(&c.log()));
        }
        for n in &self.nodes {
            out += &format!("\n--- agent {} ---\n{}", n.name, tail(&n.agent_log()));
        }
        out
    }
}
