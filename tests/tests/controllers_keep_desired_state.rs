//! Controllers keep the declared state, end to end: a real etcd, the real `skiff-apiserver`,
//! `skiff-scheduler` and `skiff-controller-manager` binaries, and real `skiff-node` agents
//! (each node in a network namespace of its own, pods as cgroup v2 process groups). Components
//! are killed with SIGKILL where the acceptance says `kill -9`.  The tests share the machine's
//! two cores with many processes, so they run one at a time (a process-wide lock) and wait with
//! generous, bounded timeouts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use skiff_api::Resource;
use skiff_api::api::{Deployment, Event, Lease, Node as ApiNode, Pod, ReplicaSet};
use skiff_client::{Client, ListParams};
use skiff_tests::cluster::{Cluster, LEASE_SECONDS, node_condition, start_manager};
use skiff_tests::rollout::{Sampler, active, terminating};
use skiff_tests::{Component, eventually_within};

const T: Duration = Duration::from_secs(90);
/// One test at a time (an async mutex: each test has its own runtime and holds it across
/// awaits; a failed test does not poison it).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn node_of(p: &Pod) -> &str {
    p.spec.as_ref().map(|s| s.node_name.as_str()).unwrap_or("")
}

fn version_of(p: &Pod) -> String {
    p.metadata()
        .and_then(|m| m.annotations.get("e2e/version"))
        .cloned()
        .unwrap_or_default()
}

/// A Deployment whose pods run `sleep`; `version` goes into a template annotation, so a new
/// version is a new template.
fn deployment(name: &str, replicas: i32, surge: &str, unavailable: &str, version: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: {replicas}
  minReadySeconds: 1
  selector:
    matchLabels:
      app: {name}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: {surge}
      maxUnavailable: {unavailable}
  template:
    metadata:
      labels:
        app: {name}
      annotations:
        e2e/version: "{version}"
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: main
          image: host
          command: ["sleep", "3600"]
          resources:
            requests:
              cpu: 10m
"#
    )
}

async fn pods_of(client: &Client, app: &str) -> Vec<Pod> {
    client
        .namespaced::<Pod>("default")
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// Waits until the app has exactly `n` active pods, all Running and Ready with version
/// `version` (any version if empty); returns them.
async fn wait_running(c: &Cluster, app: &str, n: usize, version: &str) -> Vec<Pod> {
    eventually_within(
        &format!("{n} running pods of {app} v{version}"),
        T,
        || async {
            let pods: Vec<Pod> = pods_of(&c.client, app)
                .await
                .into_iter()
                .filter(active)
                .collect();
            let good = pods
                .iter()
                .filter(|p| {
                    p.status.as_ref().is_some_and(|s| s.phase == "Running")
                        && p.is_ready()
                        && (version.is_empty() || version_of(p) == version)
                })
                .count();
            if pods.len() == n && good == n {
                Ok(pods)
            } else {
                Err(format!("{} active, {good} good; {}", pods.len(), c.logs()))
            }
        },
    )
    .await
}

async fn deployment_obj(c: &Cluster, name: &str) -> Deployment {
    c.client
        .namespaced::<Deployment>("default")
        .get(name)
        .await
        .expect("get deployment")
}

/// Waits until the Deployment reports a finished rollout of its current generation.
async fn wait_rolled_out(c: &Cluster, name: &str, replicas: i32) {
    eventually_within(&format!("deployment {name} rolled out"), T, || async {
        let d = c
            .client
            .namespaced::<Deployment>("default")
            .get(name)
            .await
            .map_err(|e| e.to_string())?;
        let generation = d.metadata().map(|m| m.generation).unwrap_or(0);
        let s = d.status.clone().unwrap_or_default();
        let done = s.observed_generation >= generation
            && s.updated_replicas == replicas
            && s.replicas == replicas
            && s.available_replicas == replicas;
        done.then_some(())
            .ok_or_else(|| format!("status {s:?}; {}", c.logs()))
    })
    .await;
}

fn per_node(pods: &[Pod]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for p in pods {
        *m.entry(node_of(p).to_string()).or_insert(0) += 1;
    }
    m
}

/// 10 replicas on three real nodes: scheduled, Running, spread; scaled to 3 and back with
/// `skiff scale`; a rolling update sampled at every revision never goes over maxSurge nor
/// under replicas − maxUnavailable ready pods; `skiff rollout undo` brings the previous
/// template back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_spreads_scales_rolls_and_undoes() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3).await;
    c.server
        .skiff_stdin(&["apply", "-f", "-"], &deployment("web", 10, "2", "1", "1"));
    let pods = wait_running(&c, "web", 10, "1").await;
    let spread = per_node(&pods);
    assert_eq!(spread.len(), 3, "pods on every node: {spread:?}");
    assert!(
        spread.values().all(|n| *n >= 3),
        "10 pods spread over 3 nodes: {spread:?}"
    );

    // Scale down and up with the CLI.
    let out = c.skiff(&["scale", "deployment/web", "--replicas=3"]);
    assert!(out.contains("scaled"), "{out}");
    wait_running(&c, "web", 3, "1").await;
    let out = c.skiff(&["scale", "deploy", "web", "--replicas", "10"]);
    assert!(out.contains("scaled"), "{out}");
    wait_running(&c, "web", 10, "1").await;
    wait_rolled_out(&c, "web", 10).await;

    // Rolling update to version 2, sampled continuously.
    let sampler = Sampler::start(&c.client, "web").await;
    c.server
        .skiff_stdin(&["apply", "-f", "-"], &deployment("web", 10, "2", "1", "2"));
    wait_rolled_out(&c, "web", 10).await;
    wait_running(&c, "web", 10, "2").await;
    let s = sampler.get();
    assert!(s.samples > 10, "the sampler saw the rollout: {s:?}");
    assert!(s.max_active <= 12, "maxSurge 2 over 10 replicas: {s:?}");
    assert!(
        s.max_rs_replicas <= 12,
        "maxSurge 2 over 10 replicas: {s:?}"
    );
    assert!(s.min_ready >= 9, "maxUnavailable 1 of 10: {s:?}");
    drop(sampler);

    let history = c.skiff(&["rollout", "history", "deployment/web"]);
    assert!(
        history
            .lines()
            .filter(|l| l.trim_start().starts_with(['1', '2']))
            .count()
            >= 2,
        "two revisions: {history}"
    );

    // Undo: back to version 1's template, again within the bounds.
    let sampler = Sampler::start(&c.client, "web").await;
    let out = c.skiff(&["rollout", "undo", "deployment/web"]);
    assert!(out.contains("rolled back"), "{out}");
    wait_rolled_out(&c, "web", 10).await;
    wait_running(&c, "web", 10, "1").await;
    let d = deployment_obj(&c, "web").await;
    let annotations = d
        .spec
        .and_then(|s| s.template)
        .and_then(|t| t.metadata)
        .map(|m| m.annotations)
        .unwrap_or_default();
    assert_eq!(
        annotations.get("e2e/version").map(String::as_str),
        Some("1")
    );
    let s = sampler.get();
    assert!(s.max_active <= 12 && s.max_rs_replicas <= 12, "{s:?}");
    assert!(s.min_ready >= 9, "{s:?}");
    let status = c.skiff(&["rollout", "status", "deployment/web", "--timeout=30s"]);
    assert!(status.contains("successfully rolled out"), "{status}");
}

/// kill -9 of the controller manager and the scheduler in the middle of a rollout; started
/// again (new identities, so they must wait for the old leases), the rollout completes and
/// never went over maxSurge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_survives_kill_9_of_manager_and_scheduler() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(2).await;
    // minReadySeconds 1 and maxSurge 1 / maxUnavailable 0 make the rollout take several
    // seconds, so there is a middle to kill it in.
    c.server
        .skiff_stdin(&["apply", "-f", "-"], &deployment("api", 6, "1", "0", "1"));
    wait_running(&c, "api", 6, "1").await;
    wait_rolled_out(&c, "api", 6).await;

    let sampler = Sampler::start(&c.client, "api").await;
    c.server
        .skiff_stdin(&["apply", "-f", "-"], &deployment("api", 6, "1", "0", "2"));
    // The middle: some pods of version 2 are running, some of version 1 are left.
    eventually_within("rollout half way", T, || async {
        let pods: Vec<Pod> = pods_of(&c.client, "api")
            .await
            .into_iter()
            .filter(active)
            .collect();
        let new = pods
            .iter()
            .filter(|p| version_of(p) == "2" && p.is_ready())
            .count();
        let old = pods.iter().filter(|p| version_of(p) == "1").count();
        (new >= 1 && old >= 2)
            .then_some(())
            .ok_or_else(|| format!("new {new}, old {old}"))
    })
    .await;
    c.managers[0].kill();
    c.scheduler.kill();
    let at_kill: Vec<Pod> = pods_of(&c.client, "api").await;
    let old_left = at_kill
        .iter()
        .filter(|p| active(p) && version_of(p) == "1")
        .count();
    assert!(old_left >= 1, "killed before the end of the rollout");

    // Nothing acts while they are down.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rs_sum_down = sampler.get().max_rs_replicas;

    let mut manager = start_manager(&c.server, "cm-2");
    let mut scheduler = Component::start(
        &c.server,
        "skiff-scheduler",
        &["--lease-duration", LEASE_SECONDS, "--identity", "sched-2"],
    );
    wait_rolled_out(&c, "api", 6).await;
    wait_running(&c, "api", 6, "2").await;
    let s = sampler.get();
    assert!(s.max_active <= 7, "maxSurge 1 over 6 replicas: {s:?}");
    assert!(s.max_rs_replicas <= 7, "maxSurge 1 over 6 replicas: {s:?}");
    assert!(s.min_ready >= 6, "maxUnavailable 0: {s:?}");
    assert!(rs_sum_down <= 7);
    // The new instances hold the leases.
    let leases = c.client.namespaced::<Lease>("kube-system");
    for (lease, holder) in [
        ("skiff-controller-manager", "cm-2"),
        ("skiff-scheduler", "sched-2"),
    ] {
        let l = leases.get(lease).await.expect("lease");
        let h = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        assert_eq!(h, holder, "{lease}");
    }
    assert!(manager.running() && scheduler.running());
    manager.kill();
    scheduler.kill();
}

/// Two controller-manager replicas: only the Lease holder acts (every controller Event comes
/// from it); after a kill -9 of the leader the standby takes over within the lease time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_manager_takes_over_after_kill_9() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(1).await;
    let leases = c.client.namespaced::<Lease>("kube-system");
    let holder = || async {
        leases
            .get("skiff-controller-manager")
            .await
            .ok()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default()
    };
    eventually_within("cm-1 leads", T, || async {
        let h = holder().await;
        (h == "cm-1").then_some(()).ok_or(h)
    })
    .await;
    c.managers.push(start_manager(&c.server, "cm-2"));

    c.server
        .skiff_stdin(&["apply", "-f", "-"], &deployment("db", 2, "1", "0", "1"));
    wait_running(&c, "db", 2, "1").await;
    let reporters = |events: Vec<Event>| {
        events
            .iter()
            .filter(|e| {
                e.source
                    .as_ref()
                    .is_some_and(|s| s.component.ends_with("-controller"))
            })
            .map(|e| e.reporting_instance.clone())
            .collect::<std::collections::BTreeSet<_>>()
    };
    let events = c
        .client
        .namespaced::<Event>("default")
        .list(&ListParams::default())
        .await
        .expect("events")
        .items;
    assert_eq!(
        reporters(events),
        ["cm-1".to_string()].into(),
        "only the leader acts"
    );
    assert_eq!(holder().await, "cm-1");

    let killed_at = Instant::now();
    c.managers[0].kill();
    eventually_within("cm-2 leads", T, || async {
        let h = holder().await;
        (h == "cm-2").then_some(()).ok_or(h)
    })
    .await;
    let took = killed_at.elapsed();
    // The lease is 4 s; the standby retries every third of it.
    assert!(
        took <= Duration::from_secs(4 + 3),
        "take-over within the lease time, took {took:?}"
    );
    c.skiff(&["scale", "deployment/db", "--replicas=4"]);
    wait_running(&c, "db", 4, "1").await;
    let events = c
        .client
        .namespaced::<Event>("default")
        .list(&ListParams::default())
        .await
        .expect("events")
        .items;
    assert!(reporters(events).contains("cm-2"), "the new leader acts");
}

/// A pod no node fits says why (condition and event); it is scheduled as soon as a node that
/// fits joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unschedulable_pod_waits_for_a_fitting_node() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(1).await;
    c.server.skiff_stdin(
        &["apply", "-f", "-"],
        r#"apiVersion: v1
kind: Pod
metadata:
  name: picky
spec:
  nodeSelector:
    disk: ssd
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: host
      command: ["sleep", "3600"]
"#,
    );
    let pods = c.client.namespaced::<Pod>("default");
    let message = eventually_within("picky unschedulable", T, || async {
        let p = pods.get("picky").await.map_err(|e| e.to_string())?;
        p.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.r#type == "PodScheduled"))
            .filter(|c| c.status == "False" && c.reason == "Unschedulable")
            .map(|c| c.message.clone())
            .ok_or_else(|| format!("{:?}", p.status))
    })
    .await;
    assert!(
        message.contains("0/1 nodes are available") && message.contains("node affinity/selector"),
        "{message}"
    );
    let described = c.skiff(&["describe", "pod", "picky"]);
    assert!(described.contains("FailedScheduling"), "{described}");

    let fitting = c.add_node("ssd", &[("disk", "ssd")]);
    let p = eventually_within("picky running on the new node", T, || async {
        let p = pods.get("picky").await.map_err(|e| e.to_string())?;
        let running = p.status.as_ref().is_some_and(|s| s.phase == "Running");
        (running && node_of(&p) == fitting)
            .then_some(p.clone())
            .ok_or_else(|| format!("{:?} {:?}", p.spec.map(|s| s.node_name), p.status))
    })
    .await;
    assert_eq!(node_of(&p), fitting);
}

/// Stopping a node's agent: the node turns NotReady (Ready=Unknown) within 40 s, gets the
/// unreachable taints, and its pods are replaced on the other nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_node_goes_not_ready_and_its_pods_are_replaced() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3).await;
    c.server
        .skiff_stdin(&["apply", "-f", "-"], &deployment("svc", 6, "1", "0", "1"));
    let pods = wait_running(&c, "svc", 6, "1").await;
    let spread = per_node(&pods);
    let (victim, lost) = spread
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(name, n)| (name.clone(), *n))
        .expect("pods on some node");
    assert!(lost >= 1);

    let stopped_at = Instant::now();
    c.node(&victim).kill_agent();
    let nodes = c.client.cluster::<ApiNode>();
    eventually_within(
        "the stopped node is NotReady",
        Duration::from_secs(45),
        || async {
            let n = nodes.get(&victim).await.map_err(|e| e.to_string())?;
            let ready = node_condition(&n, "Ready");
            (ready == "Unknown" || ready == "False")
                .then_some(())
                .ok_or_else(|| format!("Ready={ready}"))
        },
    )
    .await;
    let took = stopped_at.elapsed();
    assert!(took <= Duration::from_secs(40), "NotReady after {took:?}");
    // The taints follow the condition (a separate write of the node lifecycle controller).
    eventually_within("the unreachable NoExecute taint", T, || async {
        let n = nodes.get(&victim).await.map_err(|e| e.to_string())?;
        let taints: Vec<String> = n
            .spec
            .map(|s| {
                s.taints
                    .iter()
                    .map(|t| format!("{}:{}", t.key, t.effect))
                    .collect()
            })
            .unwrap_or_default();
        taints
            .contains(&"node.kubernetes.io/unreachable:NoExecute".to_string())
            .then_some(())
            .ok_or(format!("{taints:?}"))
    })
    .await;

    // Replaced: 6 active, running pods, none on the dead node.
    let replaced = eventually_within("pods replaced on live nodes", T, || async {
        let pods: Vec<Pod> = pods_of(&c.client, "svc")
            .await
            .into_iter()
            .filter(active)
            .collect();
        let good = pods
            .iter()
            .filter(|p| p.is_ready() && node_of(p) != victim)
            .count();
        if pods.len() == 6 && good == 6 {
            Ok(pods)
        } else {
            Err(format!(
                "{} active, {good} ready elsewhere; {}",
                pods.len(),
                c.logs()
            ))
        }
    })
    .await;
    assert!(replaced.iter().all(|p| node_of(p) != victim));

    // The agent comes back: the node is Ready and untainted again, and the pods evicted from
    // it finish terminating (the agent stops them and completes their deletion).
    c.node(&victim).start_agent();
    eventually_within("the node recovers", T, || async {
        let n = nodes.get(&victim).await.map_err(|e| e.to_string())?;
        let tainted = n.spec.as_ref().is_some_and(|s| {
            s.taints
                .iter()
                .any(|t| t.key.starts_with("node.kubernetes.io/"))
        });
        let on_victim = pods_of(&c.client, "svc")
            .await
            .iter()
            .filter(|p| node_of(p) == victim)
            .count();
        (node_condition(&n, "Ready") == "True" && !tainted && on_victim == 0)
            .then_some(())
            .ok_or_else(|| {
                format!(
                    "Ready={} tainted={tainted} pods left={on_victim}",
                    node_condition(&n, "Ready")
                )
            })
    })
    .await;
}

/// Deleting a Deployment removes its ReplicaSets and pods (the processes stop); with
/// `--cascade=orphan` they stay, without owner; `--cascade=foreground` removes the
/// Deployment only after its dependents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_deployment_cascades_or_orphans() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(1).await;
    let rs_of = |app: &'static str| {
        let api = c.client.namespaced::<ReplicaSet>("default");
        async move {
            api.list(&ListParams::default().labels(&format!("app={app}")))
                .await
                .map(|l| l.items)
                .unwrap_or_default()
        }
    };

    // Background (the default).
    c.server
        .skiff_stdin(&["apply", "-f", "-"], &deployment("bg", 2, "1", "0", "1"));
    wait_running(&c, "bg", 2, "1").await;
    c.skiff(&["delete", "deployment", "bg"]);
    eventually_within("bg's replica sets and pods gone", T, || async {
        let (rs, pods) = (
            rs_of("bg").await.len(),
            pods_of(&c.client, "bg").await.len(),
        );
        (rs == 0 && pods == 0)
            .then_some(())
            .ok_or_else(|| format!("{rs} replica sets, {pods} pods"))
    })
    .await;
    // Every component reported what it did.
    let reasons = eventually_within("events of the whole flow", T, || async {
        let events = c
            .client
            .namespaced::<Event>("default")
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let reasons: std::collections::BTreeSet<String> = events
            .iter()
            .map(|e| {
                let from = e
                    .source
                    .as_ref()
                    .map(|s| s.component.as_str())
                    .unwrap_or("");
                format!("{from}/{}", e.reason)
            })
            .collect();
        let want = [
            "deployment-controller/ScalingReplicaSet",
            "replicaset-controller/SuccessfulCreate",
            "default-scheduler/Scheduled",
            "skiff-node/Started",
            "skiff-node/Killing",
        ];
        want.iter()
            .all(|w| reasons.contains(*w))
            .then_some(reasons.clone())
            .ok_or_else(|| format!("{reasons:?}"))
    })
    .await;
    assert!(!reasons.is_empty());

    // Orphan.
    c.server
        .skiff_stdin(&["apply", "-f", "-"], &deployment("orph", 2, "1", "0", "1"));
    let before = wait_running(&c, "orph", 2, "1").await;
    c.skiff(&["delete", "deployment", "orph", "--cascade=orphan"]);
    let deployments = c.client.namespaced::<Deployment>("default");
    eventually_within("orph deleted", T, || async {
        match deployments.get_opt("orph").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let sets = eventually_within("orph's replica set orphaned", T, || async {
        let sets = rs_of("orph").await;
        let orphaned = sets
            .iter()
            .all(|rs| rs.metadata().is_some_and(|m| m.owner_references.is_empty()));
        (sets.len() == 1 && orphaned)
            .then_some(sets)
            .ok_or_else(|| "not orphaned yet".to_string())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = wait_running(&c, "orph", 2, "1").await;
    let names = |p: &[Pod]| {
        let mut v: Vec<String> = p.iter().map(|p| p.name().to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&before), names(&after), "the same pods keep running");
    assert_eq!(sets.len(), 1);

    // Foreground.
    c.server
        .skiff_stdin(&["apply", "-f", "-"], &deployment("fg", 2, "1", "0", "1"));
    wait_running(&c, "fg", 2, "1").await;
    c.skiff(&["delete", "deployment", "fg", "--cascade=foreground"]);
    let saw_waiting = std::sync::atomic::AtomicBool::new(false);
    eventually_within("fg and its dependents gone", T, || async {
        let d = deployments.get_opt("fg").await.map_err(|e| e.to_string())?;
        let (rs, pods) = (
            rs_of("fg").await.len(),
            pods_of(&c.client, "fg").await.len(),
        );
        if let Some(d) = &d {
            assert!(terminating(d), "a foreground delete marks the owner first");
            if rs + pods > 0 {
                saw_waiting.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        } else {
            assert_eq!(rs + pods, 0, "the owner goes last");
        }
        (d.is_none() && rs == 0 && pods == 0)
            .then_some(())
            .ok_or_else(|| format!("deployment {}, {rs} rs, {pods} pods", d.is_some()))
    })
    .await;
    assert!(
        saw_waiting.load(std::sync::atomic::Ordering::Relaxed),
        "the deployment waited for its dependents"
    );
}
