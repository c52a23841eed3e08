//! A real API server (in-process, embedded store in a tempdir) and a real scheduler, for the
//! integration tests.
#![allow(dead_code)]

use skiff_apiserver::testing::TestServer;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use skiff_api::Resource;
use skiff_api::api::{
    Container, Event, Node, ObjectMeta, OwnerReference, Pod, PodSpec, ResourceRequirements,
};
use skiff_apiserver::ApiServerOptions;
use skiff_client::{Client, ListParams};
use skiff_scheduler::hollow::{HollowNodes, NodeShape, node_object};
use skiff_scheduler::queue::BackoffPolicy;
use skiff_scheduler::{Scheduler, SchedulerConfig, SchedulerHandle};

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
    let _ = tracing_subscriber_init();
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

fn tracing_subscriber_init() -> Option<()> {
    // Logs only when asked (RUST_LOG), once per test binary.
    std::env::var("RUST_LOG").ok()?;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init()
        .ok()
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
        wait(
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
        wait(
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
        wait(
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

/// Polls `probe` every 50 ms until it returns `Some`, failing after `timeout`.
pub async fn wait<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn pod(name: &str) -> Pod {
    Pod {
        metadata: Some(ObjectMeta {
            name: name.into(),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: "host".into(),
                command: vec!["sleep".into(), "1000".into()],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn spec_mut(p: &mut Pod) -> &mut PodSpec {
    p.spec.get_or_insert_with(Default::default)
}

pub fn requesting(mut p: Pod, cpu: &str, memory: &str) -> Pod {
    let mut requests = BTreeMap::new();
    requests.insert("cpu".to_string(), cpu.to_string());
    requests.insert("memory".to_string(), memory.to_string());
    spec_mut(&mut p).containers[0].resources = Some(ResourceRequirements {
        requests,
        ..Default::default()
    });
    p
}

pub fn labeled(mut p: Pod, k: &str, v: &str) -> Pod {
    p.metadata_mut().labels.insert(k.into(), v.into());
    p
}

pub fn owned_by(mut p: Pod, uid: &str) -> Pod {
    p.metadata_mut().owner_references.push(OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "web-rs".into(),
        uid: uid.into(),
        controller: Some(true),
        ..Default::default()
    });
    p
}
