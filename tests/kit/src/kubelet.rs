//! The one stand-in for node agents in tests that run no agent: it watches pods and writes
//! what a kubelet would once it has started them (phase Running, every container running and
//! ready, the Ready conditions, a pod IP).
//!
//! Two scopes: [`FakeKubelet::all_pods`] takes every pod, bound or not (controller tests run
//! no scheduler), after a delay; [`FakeKubelet::for_nodes`] takes only the pods bound to a
//! set of hollow nodes, finishes their graceful deletion as a kubelet does, and renews those
//! nodes' Leases so the node lifecycle controller sees them alive.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::{
    Condition, ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodIp, PodStatus,
};
use skiff_client::reflector::{Event, object_key, reflector};
use skiff_client::{Client, ClientError, DeleteParams, ListParams};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Parallel status writes.
const CONCURRENCY: usize = 32;
/// Status writes attempted per pod before giving up on conflicts.
const ATTEMPTS: usize = 20;

/// How long a hollow node's Lease is valid, and how often it is renewed (an agent's
/// defaults).
pub const LEASE_DURATION: Duration = Duration::from_secs(40);
pub const LEASE_RENEW: Duration = Duration::from_secs(10);

pub(crate) fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Which pods a [`FakeKubelet`] runs.
#[derive(Debug)]
enum Scope {
    /// Every pod, `delay` after it first appears.
    AllPods { delay: Duration },
    /// The pods bound to these nodes.
    Nodes(HashSet<String>),
}

/// A running fake kubelet; it stops when dropped.
#[derive(Debug)]
pub struct FakeKubelet {
    task: JoinHandle<()>,
    leases: Option<JoinHandle<()>>,
    started: Arc<AtomicU64>,
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(l) = &self.leases {
            l.abort();
        }
    }
}

impl FakeKubelet {
    /// Stands in for every node agent: each pod (in any namespace, bound or not) that is not
    /// being deleted becomes Running and Ready `delay` after it first appears.
    pub fn all_pods(client: &Client, delay: Duration) -> FakeKubelet {
        FakeKubelet::spawn(client, Scope::AllPods { delay })
    }

    /// The kubelet of `nodes`: runs the pods bound to them, finishes their deletion, and
    /// renews the nodes' Leases every [`LEASE_RENEW`].
    pub fn for_nodes(client: &Client, nodes: Vec<String>) -> FakeKubelet {
        let leases = tokio::spawn(renew_leases(client.clone(), nodes.clone()));
        let mut k = FakeKubelet::spawn(client, Scope::Nodes(nodes.into_iter().collect()));
        k.leases = Some(leases);
        k
    }

    fn spawn(client: &Client, scope: Scope) -> FakeKubelet {
        let started = Arc::new(AtomicU64::new(0));
        let state = Arc::new(State {
            client: client.clone(),
            scope,
            started: started.clone(),
            ips: AtomicU64::new(0),
            in_flight: Mutex::new(HashSet::new()),
            done: Mutex::new(HashSet::new()),
            permits: Semaphore::new(CONCURRENCY),
        });
        let task = tokio::spawn(async move {
            let mut events = Box::pin(reflector(state.client.all::<Pod>(), ListParams::default()));
            while let Some(ev) = events.next().await {
                match ev {
                    Event::Restarted(pods) => {
                        for p in pods {
                            state.clone().observe(p);
                        }
                    }
                    Event::Applied(p) => state.clone().observe(p),
                    Event::Deleted(_) => {}
                }
            }
        });
        FakeKubelet {
            task,
            leases: None,
            started,
        }
    }

    /// Pods this kubelet has marked Running so far.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }
}

/// Renews every node's Lease in `kube-node-lease`, as agents do.
async fn renew_leases(client: Client, nodes: Vec<String>) {
    let mut tick = tokio::time::interval(LEASE_RENEW);
    loop {
        tick.tick().await;
        futures::stream::iter(&nodes)
            .for_each_concurrent(CONCURRENCY, |node| {
                let client = &client;
                async move {
                    if let Err(e) =
                        skiff_client::node_lease::renew(client, node, LEASE_DURATION).await
                    {
                        tracing::debug!(node, error = %e, "renewing a hollow node's lease");
                    }
                }
            })
            .await;
    }
}

#[derive(Debug)]
struct State {
    client: Client,
    scope: Scope,
    started: Arc<AtomicU64>,
    ips: AtomicU64,
    /// Pods with a write under way.
    in_flight: Mutex<HashSet<String>>,
    /// Pods (by uid) already started: each is started once, as a kubelet starts it once.
    done: Mutex<HashSet<String>>,
    permits: Semaphore,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Run,
    FinishDelete,
}

impl State {
    fn observe(self: Arc<Self>, pod: Pod) {
        let node = pod
            .spec
            .as_ref()
            .map(|s| s.node_name.clone())
            .unwrap_or_default();
        let (ours, delay, finishes_deletes) = match &self.scope {
            Scope::AllPods { delay } => (true, *delay, false),
            Scope::Nodes(nodes) => (nodes.contains(&node), Duration::ZERO, true),
        };
        if !ours {
            return;
        }
        let deleting = pod
            .metadata
            .as_ref()
            .is_some_and(|m| !m.deletion_timestamp.is_empty());
        let phase = pod.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("");
        let uid = pod
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        let action = if deleting {
            if !finishes_deletes {
                return;
            }
            Action::FinishDelete
        } else if !pod.is_ready()
            && !matches!(phase, "Succeeded" | "Failed")
            && !self.lock_done().contains(&uid)
        {
            Action::Run
        } else {
            return;
        };
        let key = object_key(&pod);
        if !self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone())
        {
            return;
        }
        tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let Ok(_permit) = self.permits.acquire().await else {
                return;
            };
            let api = self.client.namespaced::<Pod>(pod.namespace());
            let result = match action {
                Action::FinishDelete => api
                    .delete(
                        pod.name(),
                        &DeleteParams {
                            grace_period_seconds: Some(0),
                            ..Default::default()
                        },
                    )
                    .await
                    .map(|_| ()),
                Action::Run => self.run(&api, pod, &node, uid).await,
            };
            match result {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::warn!(pod = %key, error = %e, "fake kubelet write failed"),
            }
            self.in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
        });
    }

    fn lock_done(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.done.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn run(
        &self,
        api: &skiff_client::Api<Pod>,
        pod: Pod,
        node: &str,
        uid: String,
    ) -> Result<(), ClientError> {
        let n = self.ips.fetch_add(1, Ordering::Relaxed);
        let ip = format!("10.{}.{}.{}", 64 + (n >> 16) % 64, (n >> 8) % 256, n % 256);
        // Start from the live object: the one observed may be old by now.
        let mut pod = pod;
        for _ in 0..ATTEMPTS {
            let deleting = pod
                .metadata
                .as_ref()
                .is_some_and(|m| !m.deletion_timestamp.is_empty());
            if pod.is_ready() || deleting {
                return Ok(());
            }
            pod.status = Some(running_status(&pod, &ip, node));
            match api.update_status(&pod).await {
                Ok(_) => {
                    self.lock_done().insert(uid);
                    self.started.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if e.is_conflict() => pod = api.get(pod.name()).await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A Running status with every container running and ready.
fn running_status(pod: &Pod, ip: &str, node: &str) -> PodStatus {
    let now = now();
    let previous = pod.status.clone().unwrap_or_default();
    let scheduled = previous
        .conditions
        .iter()
        .find(|c| c.r#type == "PodScheduled")
        .cloned()
        .unwrap_or_else(|| condition("PodScheduled", &now));
    let mut conditions = vec![scheduled];
    for kind in ["Initialized", "ContainersReady", "Ready"] {
        conditions.push(condition(kind, &now));
    }
    let uid = pod.metadata.as_ref().map(|m| m.uid.as_str()).unwrap_or("");
    let host = node
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let host_ip = format!("192.0.2.{}", host % 250 + 1);
    PodStatus {
        phase: "Running".into(),
        conditions,
        host_ip: host_ip.clone(),
        host_ips: vec![PodIp { ip: host_ip }],
        pod_ip: ip.into(),
        pod_ips: vec![PodIp { ip: ip.into() }],
        start_time: now.clone(),
        container_statuses: pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| ContainerStatus {
                name: c.name.clone(),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: now.clone(),
                    }),
                    ..Default::default()
                }),
                ready: true,
                image: c.image.clone(),
                container_id: format!("fake://{uid}/{}", c.name),
                started: Some(true),
                ..Default::default()
            })
            .collect(),
        qos_class: previous.qos_class,
        ..Default::default()
    }
}

fn condition(kind: &str, now: &str) -> Condition {
    Condition {
        r#type: kind.into(),
        status: "True".into(),
        last_transition_time: now.into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::PodSpec;

    #[test]
    fn running_status_keeps_pod_scheduled() {
        let mut p = crate::build::pod("p");
        p.status = Some(PodStatus {
            phase: "Pending".into(),
            conditions: vec![Condition {
                r#type: "PodScheduled".into(),
                status: "True".into(),
                reason: "kept".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let s = running_status(&p, "10.64.0.1", "n");
        assert_eq!(s.phase, "Running");
        let kinds: Vec<&str> = s.conditions.iter().map(|c| c.r#type.as_str()).collect();
        assert_eq!(
            kinds,
            ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
        );
        assert_eq!(s.conditions[0].reason, "kept");
        assert!(s.container_statuses[0].ready);
        assert_eq!(s.pod_ip, "10.64.0.1");
        let mut ready = p.clone();
        ready.status = Some(s);
        assert!(ready.is_ready());
    }

    #[test]
    fn unscheduled_pods_get_pod_scheduled_too() {
        let p = Pod {
            spec: Some(PodSpec::default()),
            ..Default::default()
        };
        let s = running_status(&p, "10.64.0.2", "");
        assert_eq!(s.conditions[0].r#type, "PodScheduled");
        assert_eq!(s.conditions[0].status, "True");
    }
}
