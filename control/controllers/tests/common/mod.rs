//! What the controller tests share: a real API server in-process (embedded store in a
//! tempdir), the controller manager in-process, a stand-in for node agents that marks pods
//! Running and Ready, and bounded waits.
#![allow(dead_code)]

use skiff_apiserver::testing::TestServer;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::{
    Condition, Container, LabelSelector, ObjectMeta, Pod, PodSpec, PodStatus, PodTemplateSpec,
};
use skiff_apiserver::ApiServerOptions;
use skiff_client::reflector::{Event, reflector};
use skiff_client::runtime::{CancelToken, LeaderElectionConfig};
use skiff_client::{Client, ListParams};
use skiff_controllers::manager::{self, ManagerConfig};
use tokio::task::JoinHandle;

pub const WAIT: Duration = Duration::from_secs(20);

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

/// Starts a controller manager configured by `config`.
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

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn is_ready(p: &Pod) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == "Ready" && c.status == "True")
    })
}

/// Marks pod `name` Running and Ready through the status subresource.
async fn mark_ready(client: Client, namespace: String, name: String) {
    let api = client.namespaced::<Pod>(&namespace);
    for _ in 0..20 {
        let mut pod = match api.get(&name).await {
            Ok(p) => p,
            Err(_) => return,
        };
        if is_ready(&pod) {
            return;
        }
        let t = now();
        let cond = |ty: &str| Condition {
            r#type: ty.into(),
            status: "True".into(),
            last_transition_time: t.clone(),
            ..Default::default()
        };
        pod.status = Some(PodStatus {
            phase: "Running".into(),
            conditions: vec![cond("PodScheduled"), cond("ContainersReady"), cond("Ready")],
            pod_ip: "10.0.0.1".into(),
            start_time: t.clone(),
            ..Default::default()
        });
        match api.update_status(&pod).await {
            Ok(_) => return,
            Err(e) if e.is_conflict() => continue,
            Err(_) => return,
        }
    }
}

/// Stands in for node agents: every pod becomes Running and Ready `delay` after it appears.
pub fn fake_kubelet(client: &Client, delay: Duration) -> Task {
    let client = client.clone();
    Task(tokio::spawn(async move {
        let mut seen = HashSet::new();
        let events = reflector(client.all::<Pod>(), ListParams::default());
        tokio::pin!(events);
        while let Some(ev) = events.next().await {
            let pods = match ev {
                Event::Restarted(v) => v,
                Event::Applied(p) => vec![p],
                Event::Deleted(_) => continue,
            };
            for p in pods {
                let uid = p.metadata().map(|m| m.uid.clone()).unwrap_or_default();
                let terminating = p
                    .metadata()
                    .is_some_and(|m| !m.deletion_timestamp.is_empty());
                if is_ready(&p) || terminating || !seen.insert(uid) {
                    continue;
                }
                let (client, ns, name) = (
                    client.clone(),
                    p.namespace().to_string(),
                    p.name().to_string(),
                );
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    mark_ready(client, ns, name).await;
                });
            }
        }
    }))
}

/// Polls `check` until it returns `Some`, at most `WAIT`.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {WAIT:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn selector(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: labels(pairs),
        ..Default::default()
    })
}

/// A pod template with `labels` and one container whose env holds `version`.
pub fn template(pairs: &[(&str, &str)], version: &str) -> Option<PodTemplateSpec> {
    Some(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: labels(pairs),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: "host".into(),
                command: vec!["sleep".into(), "3600".into()],
                env: vec![skiff_api::api::EnvVar {
                    name: "VERSION".into(),
                    value: version.into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
    })
}

pub fn meta(name: &str) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: name.into(),
        namespace: "default".into(),
        ..Default::default()
    })
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

pub fn pod_is_ready(p: &Pod) -> bool {
    is_ready(p)
}
