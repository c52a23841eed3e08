//! What the controller tests share: a real API server in-process (embedded store in a
//! tempdir), the controller manager in-process, the stand-in for node agents that marks pods
//! Running and Ready, builders and the bounded wait (all from `skiff_testkit`).
#![allow(
    dead_code,
    unused_imports,
    reason = "each test binary uses a different part"
)]

use skiff_testkit::server::TestServer;
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_apiserver::ApiServerOptions;
use skiff_client::controller::{CancelToken, LeaderElectionConfig};
use skiff_client::{Client, ListParams};
use skiff_controllers::manager::{self, ManagerConfig};
use skiff_testkit::kubelet::FakeKubelet;
use tokio::task::JoinHandle;

pub use skiff_testkit::build::{labels, meta, selector, template};
pub use skiff_testkit::{WAIT, eventually};

/// A running API server and a client of it.
pub struct Cluster {
    pub client: Client,
    pub server: TestServer,
}

pub async fn cluster() -> Cluster {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
    let server = TestServer::start(ApiServerOptions::default()).await;
    let client = Client::connect(&server.endpoint()).await.expect("connect");
    Cluster { client, server }
}

/// Aborts a task when dropped.
pub struct Task(pub JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A controller manager running in this process (aborted when dropped).
pub struct Manager {
    handle: Option<JoinHandle<()>>,
    pub stop: CancelToken,
}

impl Manager {
    /// Stops it gracefully (the lease is released) and waits for it.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(WAIT, h)
                .await
                .expect("manager stops")
                .expect("manager task");
        }
    }

    /// Kills it: no clean-up, the lease is left to expire (a crashed process).
    pub async fn kill(mut self) {
        if let Some(h) = self.handle.take() {
            h.abort();
            let _ = h.await;
        }
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.abort();
        }
    }
}

/// Starts a controller manager with every controller; `lease`: leader election on it.
pub fn start_manager(
    client: &Client,
    identity: &str,
    lease: Option<LeaderElectionConfig>,
) -> Manager {
    let mut config = ManagerConfig::new(identity);
    config.leader_election = lease;
    start_manager_with(client, config)
}

/// Starts a controller manager with `config`.
pub fn start_manager_with(client: &Client, config: ManagerConfig) -> Manager {
    let stop = CancelToken::new();
    let task = tokio::spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            if let Err(e) = manager::run(client, config, stop).await {
                panic!("manager failed: {e}");
            }
        }
    });
    Manager {
        handle: Some(task),
        stop,
    }
}

/// Stands in for node agents: every pod becomes Running and Ready `delay` after it appears.
pub fn fake_kubelet(client: &Client, delay: Duration) -> FakeKubelet {
    FakeKubelet::all_pods(client, delay)
}

/// Active (not terminating, not finished) pods with label `key=value`.
pub async fn active_pods(client: &Client, selector: &str) -> Vec<Pod> {
    client
        .namespaced::<Pod>("default")
        .list(&ListParams::default().labels(selector))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| {
            p.metadata()
                .is_some_and(|m| m.deletion_timestamp.is_empty())
                && !matches!(
                    p.status.as_ref().map(|s| s.phase.as_str()),
                    Some("Succeeded" | "Failed")
                )
        })
        .collect()
}

/// Waits for an Event in `namespace` about the object named `name` with `reason`.
pub async fn wait_for_event(
    client: &Client,
    namespace: &str,
    name: &str,
    reason: &str,
) -> skiff_api::api::Event {
    eventually(&format!("a {reason} event about {name}"), || async {
        client
            .namespaced::<skiff_api::api::Event>(namespace)
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason == reason && e.involved_object.as_ref().is_some_and(|o| o.name == name)
            })
    })
    .await
}
