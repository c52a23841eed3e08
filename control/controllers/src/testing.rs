//! For tests that run controllers without node agents (feature `testing`): a stand-in for
//! the kubelets that makes every pod Running and Ready, so ReplicaSets and Deployments see
//! their pods become available. Used by this crate's tests and by the CLI's rollout tests.
//!
//! Unlike the scheduler's hollow kubelet it does not care about nodes: a pod counts as
//! started whether or not it is bound, since these tests run no scheduler.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a failed setup step is the calling test's failure"
)]

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::{Condition, Pod, PodStatus};
use skiff_client::reflector::{Event, reflector};
use skiff_client::{Client, ListParams};
use tokio::task::JoinHandle;

use crate::util::{format_time, is_pod_ready};

/// Status writes attempted per pod before giving up on conflicts.
const ATTEMPTS: usize = 20;

/// A running fake kubelet; it stops when dropped.
#[derive(Debug)]
pub struct FakeKubelet {
    task: JoinHandle<()>,
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Stands in for node agents: every pod (in any namespace) that is not being deleted becomes
/// Running and Ready `delay` after it first appears.
pub fn fake_kubelet(client: &Client, delay: Duration) -> FakeKubelet {
    let client = client.clone();
    let task = tokio::spawn(async move {
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
                if is_pod_ready(&p) || terminating || !seen.insert(uid) {
                    continue;
                }
                let (client, ns, name) = (
                    client.clone(),
                    p.namespace().to_string(),
                    p.name().to_string(),
                );
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    mark_ready(&client, &ns, &name).await;
                });
            }
        }
    });
    FakeKubelet { task }
}

/// Marks pod `namespace/name` Running and Ready through the status subresource (a pod gone
/// meanwhile is left alone).
pub async fn mark_ready(client: &Client, namespace: &str, name: &str) {
    let api = client.namespaced::<Pod>(namespace);
    for _ in 0..ATTEMPTS {
        let Ok(mut pod) = api.get(name).await else {
            return;
        };
        if is_pod_ready(&pod) {
            return;
        }
        let t = format_time(Utc::now());
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
            Err(e) if e.is_conflict() => continue,
            _ => return,
        }
    }
}
