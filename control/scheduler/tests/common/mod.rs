//! A real API server (in-process, embedded store in a tempdir) and a real scheduler, for the
//! integration tests.
#![allow(
    dead_code,
    unused_imports,
    reason = "each test binary uses a different part"
)]

use skiff_testkit::server::TestServer;
use std::time::Duration;

use skiff_api::api::{Event, Node, Pod};
use skiff_apiserver::ApiServerOptions;
use skiff_client::{Client, ListParams};
use skiff_scheduler::queue::BackoffPolicy;
use skiff_scheduler::{Scheduler, SchedulerConfig, SchedulerHandle};
pub use skiff_testkit::eventually_within;
use skiff_testkit::hollow::{HollowNodes, NodeShape, node_object};

pub struct Cluster {
    pub client: Client,
    pub scheduler: Option<SchedulerHandle>,
    _server: TestServer,
}

pub fn test_config() -> SchedulerConfig {
    SchedulerConfig {
        backoff: BackoffPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
        },
        ..Default::default()
    }
}

/// An API server and a scheduler with `config`.
pub async fn cluster_with(config: SchedulerConfig) -> Cluster {
    let mut c = api_server().await;
    c.start_scheduler(config);
    c
}

/// An API server without a scheduler.
pub async fn api_server() -> Cluster {
    let server = TestServer::start(ApiServerOptions::default()).await;
    let client = Client::connect(&server.endpoint()).await.expect("connect");
    Cluster {
        client,
        scheduler: None,
        _server: server,
    }
}

pub async fn cluster() -> Cluster {
    cluster_with(test_config()).await
}

pub fn shape(cpu: &str, memory: &str) -> NodeShape {
    NodeShape {
        cpu: cpu.into(),
        memory: memory.into(),
        ..Default::default()
    }
}

impl Cluster {
    pub fn start_scheduler(&mut self, config: SchedulerConfig) {
        self.scheduler = Some(Scheduler::new(self.client.clone(), config).spawn());
    }

    pub fn pods(&self) -> skiff_client::Api<Pod> {
        self.client.namespaced::<Pod>("default")
    }

    /// Registers a node `name` of `shape`, changed by `edit`.
    pub async fn node(&self, name: &str, shape: &NodeShape, edit: impl FnOnce(&mut Node)) {
        let mut n = node_object(name, shape, Some("zone-0"));
        edit(&mut n);
        self.client
            .cluster::<Node>()
            .create(&n)
            .await
            .expect("create node");
    }

    pub async fn hollow(&self, count: usize) -> HollowNodes {
        let nodes = HollowNodes::new(count);
        nodes.register(&self.client).await.expect("register");
        nodes
    }

    pub async fn create(&self, pod: Pod) -> Pod {
        self.pods().create(&pod).await.expect("create pod")
    }

    pub async fn get(&self, name: &str) -> Pod {
        self.pods().get(name).await.expect("get pod")
    }

    /// Waits until pod `name` is bound; returns its node.
    pub async fn bound_node(&self, name: &str) -> String {
        let pods = self.pods();
        eventually_within(
            &format!("pod {name} bound"),
            Duration::from_secs(10),
            || {
                let pods = pods.clone();
                let name = name.to_string();
                async move {
                    let p = pods.get(&name).await.ok()?;
                    Some(node_of(&p)).filter(|n| !n.is_empty())
                }
            },
        )
        .await
    }

    /// Waits until pod `name` has PodScheduled=False; returns the condition's message.
    pub async fn unschedulable_message(&self, name: &str) -> String {
        let pods = self.pods();
        eventually_within(
            &format!("pod {name} PodScheduled=False"),
            Duration::from_secs(10),
            || {
                let pods = pods.clone();
                let name = name.to_string();
                async move {
                    let p = pods.get(&name).await.ok()?;
                    let c = p
                        .status
                        .as_ref()?
                        .conditions
                        .iter()
                        .find(|c| c.r#type == "PodScheduled")?
                        .clone();
                    assert!(node_of(&p).is_empty(), "pod {name} is bound");
                    (c.status == "False").then(|| {
                        assert_eq!(c.reason, "Unschedulable");
                        c.message
                    })
                }
            },
        )
        .await
    }

    /// Events about pod `name`.
    pub async fn events_of(&self, name: &str) -> Vec<Event> {
        self.client
            .namespaced::<Event>("default")
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await
            .expect("list events")
            .items
    }

    /// Waits for an event with `reason` about pod `name`; returns its message.
    pub async fn event(&self, name: &str, reason: &str) -> String {
        eventually_within(
            &format!("{reason} event for {name}"),
            Duration::from_secs(10),
            || async {
                self.events_of(name)
                    .await
                    .into_iter()
                    .find(|e| e.reason == reason)
                    .map(|e| e.message)
            },
        )
        .await
    }
}

pub fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .map(|s| s.node_name.clone())
        .unwrap_or_default()
}

pub use skiff_testkit::build::{labeled_pod, owned, pod, spec_mut, with_requests};

/// `p` requesting `cpu` and `memory`.
pub fn requesting(p: Pod, cpu: &str, memory: &str) -> Pod {
    with_requests(p, &[("cpu", cpu), ("memory", memory)])
}
