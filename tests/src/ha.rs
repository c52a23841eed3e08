//! A highly available cluster for fault tests, on machines that share only a network: two
//! `control` [`Machine`]s, each with an API server (one CA), a scheduler and a controller
//! manager electing leaders, and real nodes, each a machine of its own, on one [`Fabric`].
//! Every component and agent is given both API servers (`--server a,b`, their machines'
//! addresses) and fails over between them. The store is a real 3-member etcd cluster on the
//! test's loopback (so a test can kill and restart members); each control machine reaches
//! every member at the same address on its own loopback through the harness's forwarders.

use std::net::SocketAddr;
use std::path::Path;

use skiff_api::api::Lease;
use skiff_client::Client;

use crate::cluster::{LEASE_SECONDS, tail};
use crate::{ApiServer, Backend, Component, Election, EtcdCluster, Fabric, Machine, Node, unique};

/// The whole HA cluster. Dropped in field order: nodes and components before the servers,
/// the servers before their machines and etcd, the machines before the fabric.
#[derive(Debug)]
pub struct HaCluster {
    pub nodes: Vec<Node>,
    pub schedulers: Vec<Component>,
    pub managers: Vec<Component>,
    /// A client that fails over between the servers.
    pub client: Client,
    pub servers: Vec<ApiServer>,
    _etcd_forwards: Vec<skiff_testnet::Forwarder>,
    pub controls: Vec<Machine>,
    pub etcd: EtcdCluster,
    pub fabric: Fabric,
    pub id: String,
}

impl HaCluster {
    /// Starts everything with `nodes` nodes (`e2e-<id>-n<i>`) and waits until they are Ready
    /// with a pod CIDR.
    pub async fn start(nodes: usize) -> HaCluster {
        let fabric = crate::fabric();
        let controls = vec![
            Machine::on(&fabric, "control"),
            Machine::on(&fabric, "control"),
        ];
        let etcd = EtcdCluster::start(3).expect("a real etcd (run `cargo xtask setup`)");
        let endpoints = etcd.endpoints();
        let etcd_forwards = controls
            .iter()
            .flat_map(|m| endpoints.iter().map(move |e| (m, e)))
            .map(|(m, e)| {
                let addr: SocketAddr = e
                    .trim_start_matches("http://")
                    .parse()
                    .expect("etcd's client URL is http://<ip>:<port>");
                skiff_testnet::Forwarder::between(
                    Some(&m.netns.path()),
                    addr,
                    Path::new("/proc/thread-self/ns/net"),
                    addr,
                )
                .expect("forwarding an etcd member onto a control machine")
            })
            .collect();
        let backend = || Backend::Etcd(endpoints.join(","));
        let first = ApiServer::start_on(&controls[0], backend(), &[]);
        let second = first.start_beside_on(&controls[1], backend());
        let servers = vec![first, second];
        // Components and agents reach the servers at their machines' addresses; the test
        // process through each server's forwarder.
        let list = servers
            .iter()
            .map(|s| s.cluster_endpoint().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut config = servers[0].client_config();
        config.servers = servers.iter().map(|s| s.endpoint.clone()).collect();
        let client = Client::connect_with(&config)
            .await
            .expect("a client of both servers");
        // Replica i runs on control machine i, beside its own server.
        let component = |binary: &str, i: usize| {
            let election = Election {
                server: Some(list.clone()),
                lease_duration: LEASE_SECONDS.parse().ok(),
                identity: Some(format!(
                    "{}-{}",
                    if binary == "skiff-scheduler" {
                        "sched"
                    } else {
                        "cm"
                    },
                    i + 1
                )),
            };
            Component::start_elected(&servers[i], binary, election, &[])
        };
        let schedulers = vec![
            component("skiff-scheduler", 0),
            component("skiff-scheduler", 1),
        ];
        let managers = vec![
            component("skiff-controller-manager", 0),
            component("skiff-controller-manager", 1),
        ];
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
            client,
            servers,
            _etcd_forwards: etcd_forwards,
            controls,
            etcd,
            fabric,
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
