//! A whole cluster for end-to-end tests, on machines that share only a network: a `control`
//! [`Machine`] runs a real etcd (on its own loopback), the `skiff-apiserver` (on the machine's
//! address), `skiff-scheduler` and `skiff-controller-manager`; every node is a machine of its
//! own whose agent runs inside it and serves its API on the node's address with a certificate
//! the controller manager signed; a `laptop` machine outside the cluster runs kubectl as a
//! user would. All of them are on one [`Fabric`]. The test process reaches the API server
//! through a forwarder from its own loopback (the harness's, like a user's port forward).

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use skiff_api::api::Node as ApiNode;
use skiff_client::{Client, ListParams};

use crate::machines::{ETCD_CLIENT_PORT, Process, etcd_on, kubectl_with};
use crate::{
    ApiServer, Backend, Component, Election, Fabric, KUBECTL, Machine, Node, eventually_within, ok,
    unique,
};

const T: Duration = Duration::from_secs(90);

/// Lease duration of the control-plane components in these tests (a standby or a restarted
/// replica with a new identity takes over after this long).
pub const LEASE_SECONDS: &str = "4";

/// A whole cluster: a control machine (etcd, API server, scheduler, controller manager), `n`
/// node machines and a laptop.
#[derive(Debug)]
pub struct Cluster {
    // Dropped in field order: agents and components before the server, the server before
    // etcd, processes before the machines they run on, machines before the fabric.
    pub scheduler: Component,
    pub managers: Vec<Component>,
    pub nodes: Vec<Node>,
    pub client: Client,
    pub server: ApiServer,
    _etcd: Process,
    pub control: Machine,
    pub laptop: Machine,
    /// The laptop's kubeconfig: the administrator at the control machine's address.
    pub laptop_kubeconfig: PathBuf,
    pub fabric: Fabric,
    pub id: String,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts everything, with `nodes` nodes named `e2e-<id>-n<i>`, and waits for them to
    /// be Ready with a pod CIDR.
    pub async fn start(nodes: usize) -> Cluster {
        Cluster::start_with(nodes, &[]).await
    }

    /// Like [`Cluster::start`], each agent with the extra `agent_args`.
    pub async fn start_with(nodes: usize, agent_args: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let fabric = crate::fabric();
        let control = Machine::on(&fabric, "control");
        let laptop = Machine::on(&fabric, "laptop");
        let etcd = etcd_on(&control, dir.path());
        let server = ApiServer::start_on(
            &control,
            Backend::Etcd(format!("http://127.0.0.1:{ETCD_CLIENT_PORT}")),
            &[],
        );
        let client = server.client().await;
        let scheduler =
            Component::start_elected(&server, "skiff-scheduler", elected("sched-1"), &[]);
        let manager = start_manager(&server, "cm-1");
        let laptop_kubeconfig =
            server.machine_kubeconfig(dir.path(), "system:admin", &["system:masters"]);
        let mut c = Cluster {
            scheduler,
            managers: vec![manager],
            nodes: Vec::new(),
            client,
            server,
            _etcd: etcd,
            control,
            laptop,
            laptop_kubeconfig,
            fabric,
            id: unique(),
            dir,
        };
        for i in 0..nodes {
            c.add_node_with(&format!("n{i}"), &[], agent_args);
        }
        c.wait_nodes_ready().await;
        c
    }

    /// Starts a real agent for node `<suffix>-<id>`; its pod CIDR comes from the controller
    /// manager's node IPAM.
    pub fn add_node(&mut self, suffix: &str, labels: &[(&str, &str)]) -> String {
        self.add_node_with(suffix, labels, &[])
    }

    /// Like [`Cluster::add_node`], the agent with the extra `agent_args`.
    pub fn add_node_with(
        &mut self,
        suffix: &str,
        labels: &[(&str, &str)],
        agent_args: &[&str],
    ) -> String {
        let name = format!("e2e-{}-{suffix}", self.id);
        self.nodes.push(Node::start_machine(
            &self.server,
            &name,
            labels,
            &self.fabric,
            agent_args,
        ));
        name
    }

    pub fn node(&mut self, name: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .expect("a node of this cluster")
    }

    pub async fn wait_nodes_ready(&self) {
        wait_nodes_ready(&self.client, self.nodes.len(), || {
            format!("{}\n{}", self.logs(), self.agent_logs())
        })
        .await;
    }

    /// Gives the control machine a route to every node's pod CIDR through the node's fabric
    /// address, as the network under a cluster does (a cloud's route table, BGP): what the
    /// API server needs to call webhooks and extension servers running in pods. The control
    /// machine runs no agent, so it has no other way to pods.
    pub async fn route_pods_from_control(&self) {
        for node in &self.nodes {
            let n = self
                .client
                .cluster::<ApiNode>()
                .get(&node.name)
                .await
                .expect("reading the node");
            let cidr = n.spec.map(|s| s.pod_cidr).unwrap_or_default();
            assert!(!cidr.is_empty(), "node {} has no pod CIDR", node.name);
            let out = self
                .control
                .command("ip")
                .args(["route", "replace", &cidr, "via", &node.node_ip])
                .output()
                .expect("running ip");
            assert!(
                out.status.success(),
                "ip route replace {cidr} via {}: {}",
                node.node_ip,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// The components' logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = format!(
            "--- apiserver ---\n{}\n--- scheduler ---\n{}",
            tail(&self.server.log()),
            tail(&self.scheduler.log())
        );
        for m in &self.managers {
            out += &format!("\n--- {} ---\n{}", m.binary, tail(&m.log()));
        }
        out
    }

    /// The last 30 lines of every node agent's log, for failure messages.
    pub fn agent_logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- agent {} ---\n{}", n.name, tail(&n.agent_log())))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn skiff(&self, args: &[&str]) -> String {
        ok(&self.server.skiff(args))
    }

    /// Runs kubectl 1.32 against the cluster (with `stdin`, if any): whether it succeeded,
    /// its stdout and its stderr.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let out = match stdin {
            Some(s) => self.server.kubectl_stdin(args, s),
            None => self.server.kubectl(args),
        };
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Cluster {
    /// kubectl 1.32 on the laptop (outside every machine), with the laptop's kubeconfig.
    pub fn laptop_kubectl_cmd(&self, args: &[&str]) -> Command {
        kubectl_with(
            self.laptop.command(KUBECTL),
            &self.laptop_kubeconfig,
            &self.dir.path().join("kube-cache"),
            args,
        )
    }

    /// Runs kubectl on the laptop and waits for it.
    pub fn laptop_kubectl(&self, args: &[&str]) -> Output {
        self.laptop_kubectl_cmd(args)
            .output()
            .expect("running kubectl")
    }

    /// `kubectl apply -f -` of `manifest` on the laptop, which must succeed.
    pub fn laptop_apply(&self, manifest: &str) {
        let out = crate::run_with_stdin(self.laptop_kubectl_cmd(&["apply", "-f", "-"]), manifest);
        ok(&out);
    }

    /// `kubectl create -f - -o json` of `manifest` on the laptop (a server-side dry run when
    /// `dry`): success, stdout, stderr.
    pub fn laptop_create(&self, manifest: &str, dry: bool) -> (bool, String, String) {
        let mut args = vec!["create", "-f", "-", "-o", "json"];
        if dry {
            args.push("--dry-run=server");
        }
        let out = crate::run_with_stdin(self.laptop_kubectl_cmd(&args), manifest);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// A kubeconfig for `user` in `groups` (a client certificate of the cluster CA) at the
    /// control machine's address, for kubectl on the laptop.
    pub fn laptop_kubeconfig_for(&self, user: &str, groups: &[&str]) -> PathBuf {
        let dir = self.dir.path().join(format!("user-{user}"));
        std::fs::create_dir_all(&dir).expect("a kubeconfig directory");
        self.server.machine_kubeconfig(&dir, user, groups)
    }

    /// Runs kubectl on the laptop with `kubeconfig` (its own discovery cache) and waits.
    pub fn laptop_kubectl_as(&self, kubeconfig: &std::path::Path, args: &[&str]) -> Output {
        let cache = kubeconfig.with_extension("cache");
        kubectl_with(self.laptop.command(KUBECTL), kubeconfig, &cache, args)
            .output()
            .expect("running kubectl")
    }
}

/// Waits (up to 90 s) until `want` nodes are Ready with a pod CIDR; `logs` explains a
/// failure.
pub async fn wait_nodes_ready(client: &Client, want: usize, logs: impl Fn() -> String) {
    let api = client.cluster::<ApiNode>();
    eventually_within("every node Ready with a pod CIDR", T, || async {
        let nodes = api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let ready = nodes
            .items
            .iter()
            .filter(|n| node_condition(n, "Ready") == "True")
            .filter(|n| n.spec.as_ref().is_some_and(|s| !s.pod_cidr.is_empty()))
            .count();
        (ready == want)
            .then_some(())
            .ok_or_else(|| format!("{ready}/{want} ready; {}", logs()))
    })
    .await;
}

pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

pub fn start_manager(server: &ApiServer, identity: &str) -> Component {
    Component::start_elected(server, "skiff-controller-manager", elected(identity), &[])
}

/// Leader election with the short [`LEASE_SECONDS`], as `identity`.
pub fn elected(identity: &str) -> Election {
    Election {
        server: None,
        lease_duration: LEASE_SECONDS.parse().ok(),
        identity: Some(identity.into()),
    }
}

pub fn node_condition(n: &ApiNode, ty: &str) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == ty))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}
