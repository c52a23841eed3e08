//! The Deployment controller against a real API server, with the ReplicaSet controller and a
//! fake kubelet that marks pods ready.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::{
    Deployment, DeploymentSpec, DeploymentStrategy, Event, Pod, ReplicaSet, RollingUpdateDeployment,
};
use skiff_api::wellknown::{POD_TEMPLATE_HASH, REVISION};
use skiff_client::reflector::{Store, reflect, reflector};
use skiff_client::{Client, ListParams};

fn deployment(name: &str, replicas: i32, strategy: DeploymentStrategy) -> Deployment {
    Deployment {
        metadata: meta(name),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: selector(&[("app", name)]),
            template: template(&[("app", name)], "1"),
            strategy: Some(strategy),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn rolling(surge: &str, unavailable: &str) -> DeploymentStrategy {
    DeploymentStrategy {
        r#type: "RollingUpdate".into(),
        rolling_update: Some(RollingUpdateDeployment {
            max_surge: Some(surge.into()),
            max_unavailable: Some(unavailable.into()),
        }),
    }
}

/// Changes deployment `name` with `f`, retrying on conflicts.
async fn edit(client: &Client, name: &str, f: impl Fn(&mut DeploymentSpec)) {
    let api = client.namespaced::<Deployment>("default");
    for _ in 0..20 {
        let mut d = api.get(name).await.expect("get");
        if let Some(s) = d.spec.as_mut() {
            f(s);
        }
        match api.update(&d).await {
            Ok(_) => return,
            Err(e) if e.is_conflict() => continue,
            Err(e) => panic!("edit: {e}"),
        }
    }
    panic!("edit: too many conflicts");
}

fn set_version(version: &'static str) -> impl Fn(&mut DeploymentSpec) {
    move |s| {
        if let Some(c) = s
            .template
            .as_mut()
            .and_then(|t| t.spec.as_mut())
            .and_then(|p| p.containers.first_mut())
        {
            c.env[0].value = version.into();
        }
    }
}

fn version_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.env.first())
        .map(|e| e.value.clone())
        .unwrap_or_default()
}

/// Waits until the deployment finished rolling out: every replica updated and available,
/// the status current, and exactly `replicas` pods, all of `version`.
async fn wait_rolled_out(client: &Client, name: &str, replicas: i32, version: &str) -> Vec<Pod> {
    let api = client.namespaced::<Deployment>("default");
    eventually(
        &format!("{name} rolled out to {version} x{replicas}"),
        || async {
            let d = api.get(name).await.ok()?;
            let generation = d.metadata().map(|m| m.generation).unwrap_or(0);
            let s = d.status?;
            let done = s.observed_generation == generation
                && s.replicas == replicas
                && s.updated_replicas == replicas
                && s.available_replicas == replicas
                && s.ready_replicas == replicas;
            if !done {
                return None;
            }
            let pods = active_pods(client, &format!("app={name}")).await;
            (pods.len() == replicas as usize
                && pods
                    .iter()
                    .all(|p| version_of(p) == version && p.is_ready()))
            .then_some(pods)
        },
    )
    .await
}

async fn replica_sets(client: &Client, app: &str) -> Vec<ReplicaSet> {
    client
        .namespaced::<ReplicaSet>("default")
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("list replica sets")
        .items
}

fn annotation<'a>(o: &'a impl Resource, key: &str) -> Option<&'a str> {
    o.metadata()
        .and_then(|m| m.annotations.get(key))
        .map(String::as_str)
}

/// Watches the pods of `app` and records, after every change, the number of pods and of
/// ready pods: the extremes over the whole run.
struct Sampler {
    extremes: Arc<Mutex<Extremes>>,
    _task: Task,
}

#[derive(Debug, Clone, Default)]
struct Extremes {
    samples: usize,
    max_pods: usize,
    min_ready: usize,
    /// (versions present at once) e.g. for Recreate: never old and new together.
    max_versions: usize,
}

impl Sampler {
    async fn start(client: &Client, app: &str) -> Sampler {
        let extremes = Arc::new(Mutex::new(Extremes {
            min_ready: usize::MAX,
            ..Default::default()
        }));
        let store = Store::<Pod>::default();
        let events = reflect(
            store.clone(),
            reflector(
                client.namespaced::<Pod>("default"),
                ListParams::default().labels(&format!("app={app}")),
            ),
        );
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn({
            let extremes = extremes.clone();
            async move {
                tokio::pin!(events);
                let mut ready_tx = Some(ready_tx);
                while events.next().await.is_some() {
                    let pods: Vec<_> = store
                        .list()
                        .into_iter()
                        .filter(|p| {
                            p.metadata()
                                .is_some_and(|m| m.deletion_timestamp.is_empty())
                        })
                        .collect();
                    let ready = pods.iter().filter(|p| p.is_ready()).count();
                    let versions: BTreeSet<String> = pods.iter().map(|p| version_of(p)).collect();
                    let mut e = extremes.lock().unwrap();
                    e.samples += 1;
                    e.max_pods = e.max_pods.max(pods.len());
                    e.min_ready = e.min_ready.min(ready);
                    e.max_versions = e.max_versions.max(versions.len());
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                    }
                }
            }
        });
        ready_rx.await.expect("sampler listed the pods");
        Sampler {
            extremes,
            _task: Task(task),
        }
    }

    fn extremes(&self) -> Extremes {
        self.extremes.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scales_to_ten_to_three_and_back() {
    let c = cluster().await;
    let _kubelet = fake_kubelet(&c.client, Duration::from_millis(20));
    let _manager = start_manager(&c.client, "deploy-test", None);
    let api = c.client.namespaced::<Deployment>("default");
    api.create(&deployment("web", 10, rolling("25%", "25%")))
        .await
        .expect("create");

    let pods = wait_rolled_out(&c.client, "web", 10, "1").await;
    let sets = replica_sets(&c.client, "web").await;
    assert_eq!(sets.len(), 1, "one replica set");
    let rs = &sets[0];
    let hash = rs
        .metadata()
        .and_then(|m| m.labels.get(POD_TEMPLATE_HASH))
        .cloned()
        .expect("hash label");
    assert_eq!(rs.name(), format!("web-{hash}"));
    assert_eq!(annotation(rs, REVISION), Some("1"));
    assert!(
        pods.iter()
            .all(|p| { p.metadata().and_then(|m| m.labels.get(POD_TEMPLATE_HASH)) == Some(&hash) })
    );
    let d = api.get("web").await.expect("get");
    assert_eq!(annotation(&d, REVISION), Some("1"));
    let conditions = d.status.expect("status").conditions;
    let cond = |ty: &str| {
        conditions
            .iter()
            .find(|c| c.r#type == ty)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    assert_eq!(
        cond("Available"),
        Some(("True".into(), "MinimumReplicasAvailable".into()))
    );
    assert_eq!(
        cond("Progressing"),
        Some(("True".into(), "NewReplicaSetAvailable".into()))
    );

    edit(&c.client, "web", |s| s.replicas = Some(3)).await;
    wait_rolled_out(&c.client, "web", 3, "1").await;
    edit(&c.client, "web", |s| s.replicas = Some(10)).await;
    wait_rolled_out(&c.client, "web", 10, "1").await;
    assert_eq!(replica_sets(&c.client, "web").await.len(), 1);

    let events = c
        .client
        .namespaced::<Event>("default")
        .list(&ListParams::default().fields("involvedObject.name=web,reason=ScalingReplicaSet"))
        .await
        .expect("events")
        .items;
    let messages: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("Scaled down replica set web-") && m.ends_with("from 10 to 3")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("Scaled up replica set web-") && m.ends_with("from 3 to 10")),
        "{messages:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_update_stays_within_surge_and_unavailable_and_rolls_back() {
    let c = cluster().await;
    // New pods become ready a little after they appear, like real ones.
    let _kubelet = fake_kubelet(&c.client, Duration::from_millis(150));
    let _manager = start_manager(&c.client, "deploy-test", None);
    let api = c.client.namespaced::<Deployment>("default");
    // 25% of 10: surge 3 (rounded up), unavailable 2 (rounded down).
    api.create(&deployment("roll", 10, rolling("25%", "25%")))
        .await
        .expect("create");
    wait_rolled_out(&c.client, "roll", 10, "1").await;

    let sampler = Sampler::start(&c.client, "roll").await;
    edit(&c.client, "roll", set_version("2")).await;
    wait_rolled_out(&c.client, "roll", 10, "2").await;
    let e = sampler.extremes();
    eprintln!("rolling update 1 -> 2: {e:?}");
    assert!(e.samples > 10, "the sampler saw the rollout: {e:?}");
    assert!(
        e.max_pods <= 13,
        "more than replicas + maxSurge pods: {e:?}"
    );
    assert!(
        e.min_ready >= 8,
        "fewer than replicas - maxUnavailable ready: {e:?}"
    );
    assert!(
        e.max_versions == 2,
        "old and new pods ran side by side: {e:?}"
    );

    let sets = replica_sets(&c.client, "roll").await;
    assert_eq!(sets.len(), 2);
    let by_rev = |rev: &str| {
        sets.iter()
            .find(|rs| annotation(*rs, REVISION) == Some(rev))
            .cloned()
            .unwrap_or_else(|| panic!("no replica set of revision {rev}"))
    };
    let (v1, v2) = (by_rev("1"), by_rev("2"));
    assert_eq!(v1.spec.as_ref().and_then(|s| s.replicas), Some(0));
    assert_eq!(v2.spec.as_ref().and_then(|s| s.replicas), Some(10));
    let d = api.get("roll").await.expect("get");
    assert_eq!(annotation(&d, REVISION), Some("2"));

    // Roll back: the template goes back to version 1; its replica set becomes the new one
    // (revision 3) and no third replica set appears.
    let sampler = Sampler::start(&c.client, "roll").await;
    edit(&c.client, "roll", set_version("1")).await;
    wait_rolled_out(&c.client, "roll", 10, "1").await;
    let e = sampler.extremes();
    eprintln!("rollback 2 -> 1: {e:?}");
    assert!(e.max_pods <= 13 && e.min_ready >= 8, "{e:?}");
    let sets = replica_sets(&c.client, "roll").await;
    assert_eq!(sets.len(), 2);
    let back = sets
        .iter()
        .find(|rs| rs.name() == v1.name())
        .expect("old replica set reused");
    assert_eq!(annotation(back, REVISION), Some("3"));
    assert_eq!(back.spec.as_ref().and_then(|s| s.replicas), Some(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_deployment_does_not_roll() {
    let c = cluster().await;
    let _kubelet = fake_kubelet(&c.client, Duration::from_millis(20));
    let _manager = start_manager(&c.client, "deploy-test", None);
    let api = c.client.namespaced::<Deployment>("default");
    api.create(&deployment("calm", 3, rolling("1", "0")))
        .await
        .expect("create");
    wait_rolled_out(&c.client, "calm", 3, "1").await;

    edit(&c.client, "calm", |s| s.paused = true).await;
    eventually("the Progressing condition says paused", || async {
        let d = api.get("calm").await.ok()?;
        d.status?
            .conditions
            .iter()
            .any(|c| c.r#type == "Progressing" && c.reason == "DeploymentPaused")
            .then_some(())
    })
    .await;
    edit(&c.client, "calm", set_version("2")).await;
    // Scaling still works while paused; the template change does not roll out.
    edit(&c.client, "calm", |s| s.replicas = Some(4)).await;
    eventually("4 pods of version 1 while paused", || async {
        let s = api.get("calm").await.ok()?.status?;
        let pods = active_pods(&c.client, "app=calm").await;
        (s.replicas == 4
            && s.available_replicas == 4
            && s.updated_replicas == 0
            && pods.len() == 4
            && pods.iter().all(|p| version_of(p) == "1"))
        .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        replica_sets(&c.client, "calm").await.len(),
        1,
        "no new replica set"
    );
    assert!(
        active_pods(&c.client, "app=calm")
            .await
            .iter()
            .all(|p| version_of(p) == "1")
    );

    edit(&c.client, "calm", |s| s.paused = false).await;
    wait_rolled_out(&c.client, "calm", 4, "2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recreate_never_mixes_versions_and_history_is_limited() {
    let c = cluster().await;
    let _kubelet = fake_kubelet(&c.client, Duration::from_millis(20));
    let _manager = start_manager(&c.client, "deploy-test", None);
    let api = c.client.namespaced::<Deployment>("default");
    let mut d = deployment(
        "batch",
        3,
        DeploymentStrategy {
            r#type: "Recreate".into(),
            rolling_update: None,
        },
    );
    if let Some(s) = d.spec.as_mut() {
        s.revision_history_limit = Some(1);
    }
    api.create(&d).await.expect("create");
    wait_rolled_out(&c.client, "batch", 3, "1").await;

    let sampler = Sampler::start(&c.client, "batch").await;
    for v in ["2", "3", "4"] {
        edit(&c.client, "batch", set_version(v)).await;
        wait_rolled_out(&c.client, "batch", 3, v).await;
    }
    let e = sampler.extremes();
    assert_eq!(
        e.max_versions, 1,
        "Recreate ran two versions at once: {e:?}"
    );
    assert!(e.max_pods <= 3, "{e:?}");
    // The current replica set plus at most one old one.
    let sets = eventually("old replica sets cleaned up", || async {
        let sets = replica_sets(&c.client, "batch").await;
        (sets.len() == 2).then_some(sets)
    })
    .await;
    let mut revisions: Vec<&str> = sets
        .iter()
        .filter_map(|rs| annotation(rs, REVISION))
        .collect();
    revisions.sort();
    assert_eq!(revisions, ["3", "4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_update_edge_budgets() {
    let c = cluster().await;
    let _kubelet = fake_kubelet(&c.client, Duration::from_millis(60));
    let _manager = start_manager(&c.client, "deploy-test", None);
    let api = c.client.namespaced::<Deployment>("default");
    // (name, replicas, maxSurge, maxUnavailable, most pods, fewest ready)
    for (name, replicas, surge, unavailable, max_pods, min_ready) in [
        ("surge-only", 5, "2", "0", 7, 5),
        ("unavailable-only", 5, "0", "40%", 5, 3),
        ("one-replica", 1, "0", "10%", 1, 0),
    ] {
        api.create(&deployment(name, replicas, rolling(surge, unavailable)))
            .await
            .expect("create");
        wait_rolled_out(&c.client, name, replicas, "1").await;
        let sampler = Sampler::start(&c.client, name).await;
        edit(&c.client, name, set_version("2")).await;
        wait_rolled_out(&c.client, name, replicas, "2").await;
        let e = sampler.extremes();
        eprintln!("{name}: {e:?}");
        assert!(e.max_pods <= max_pods, "{name}: {e:?}");
        assert!(e.min_ready >= min_ready, "{name}: {e:?}");
    }
}
