//! The node lifecycle controller against a real API server: health from node Leases the tests
//! renew (standing in for node agents), Unknown conditions, unreachable taints, pods marked not
//! ready and evicted per their tolerations, recovery, the startup grace of a restarted
//! controller, and a Deployment whose pods on a dead node are replaced.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use skiff_testkit::build;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use common::*;
use skiff_api::Resource;
use skiff_api::api::{
    Condition, Deployment, DeploymentSpec, Event, Node, NodeSpec, NodeStatus, ObjectMeta, Pod,
    Taint, Toleration,
};
use skiff_api::taints::{NO_EXECUTE, NO_SCHEDULE, TAINT_UNREACHABLE};
use skiff_client::{Client, ListParams};
use skiff_controllers::manager::ManagerConfig;
use skiff_controllers::nodelifecycle::{
    EVENT_EVICTION, EVENT_NODE_NOT_READY, MESSAGE_STATUS_UNKNOWN, NodeLifecycleConfig,
    REASON_STATUS_UNKNOWN,
};

const GRACE: Duration = Duration::from_secs(3);
const RENEW_EVERY: Duration = Duration::from_millis(500);
const OTHER_TAINT: &str = "example.com/dedicated";

fn config(identity: &str) -> ManagerConfig {
    let mut c = ManagerConfig::new(identity);
    c.leader_election = None;
    c.node_lifecycle = NodeLifecycleConfig {
        grace_period: GRACE,
        monitor_period: Duration::from_secs(1),
        ..NodeLifecycleConfig::default()
    };
    c
}

fn now_secs() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn parse(t: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(t)
        .unwrap_or_else(|e| panic!("bad time {t:?}: {e}"))
        .with_timezone(&Utc)
}

fn condition(ty: &str, heartbeat: &str) -> Condition {
    Condition {
        r#type: ty.into(),
        status: "True".into(),
        reason: "SkiffNodeReady".into(),
        message: "skiff-node is posting ready status".into(),
        last_heartbeat_time: heartbeat.into(),
        last_transition_time: heartbeat.into(),
        ..Default::default()
    }
}

/// A Ready node as an agent registers it (plus one taint of someone else's); returns the
/// heartbeat it was created with.
async fn create_node(client: &Client, name: &str) -> String {
    let hb = now_secs();
    let node = Node {
        metadata: Some(ObjectMeta {
            name: name.into(),
            labels: labels(&[("kubernetes.io/hostname", name)]),
            ..Default::default()
        }),
        spec: Some(NodeSpec {
            taints: vec![Taint {
                key: OTHER_TAINT.into(),
                value: "x".into(),
                effect: NO_SCHEDULE.into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: vec![
                condition("Ready", &hb),
                condition("ResourceLimitsEnforced", &hb),
            ],
            ..Default::default()
        }),
        ..Default::default()
    };
    client
        .cluster::<Node>()
        .create(&node)
        .await
        .expect("create node");
    hb
}

/// Renews `kube-node-lease/<node>` every 500 ms, as an agent does, until dropped.
fn renew_lease(client: &Client, node: &str) -> Task {
    let (client, node) = (client.clone(), node.to_string());
    Task(tokio::spawn(async move {
        loop {
            let _ = skiff_client::node_lease::renew(&client, &node, Duration::from_secs(40)).await;
            tokio::time::sleep(RENEW_EVERY).await;
        }
    }))
}

/// The agent's status post: every condition True with a new heartbeat.
async fn post_ready(client: &Client, name: &str) {
    let api = client.cluster::<Node>();
    for _ in 0..20 {
        let mut node = api.get(name).await.expect("get node");
        let hb = now_secs();
        node.status = Some(NodeStatus {
            conditions: vec![
                condition("Ready", &hb),
                condition("ResourceLimitsEnforced", &hb),
            ],
            ..Default::default()
        });
        match api.update_status(&node).await {
            Ok(_) => return,
            Err(e) if e.is_conflict() => continue,
            Err(e) => panic!("post node status: {e}"),
        }
    }
    panic!("post node status: too many conflicts");
}

fn unreachable_for(seconds: Option<i64>) -> Toleration {
    Toleration {
        key: TAINT_UNREACHABLE.into(),
        operator: "Exists".into(),
        effect: NO_EXECUTE.into(),
        toleration_seconds: seconds,
        ..Default::default()
    }
}

/// A pod bound to `node` (created with `spec.nodeName`).
async fn bound_pod(client: &Client, name: &str, node: &str, tolerations: Vec<Toleration>) {
    let mut pod = build::bound(build::pod(name), node);
    build::spec_mut(&mut pod).tolerations = tolerations;
    client
        .namespaced::<Pod>("default")
        .create(&pod)
        .await
        .expect("create pod");
}

async fn get_node(client: &Client, name: &str) -> Node {
    client.cluster::<Node>().get(name).await.expect("get node")
}

async fn get_pod(client: &Client, name: &str) -> Pod {
    client
        .namespaced::<Pod>("default")
        .get(name)
        .await
        .expect("get pod")
}

fn ready(node: &Node) -> Condition {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == "Ready"))
        .cloned()
        .expect("a Ready condition")
}

fn taint<'a>(node: &'a Node, key: &str, effect: &str) -> Option<&'a Taint> {
    node.spec
        .as_ref()?
        .taints
        .iter()
        .find(|t| t.key == key && t.effect == effect)
}

fn unreachable(node: &Node) -> bool {
    ready(node).status == "Unknown"
        && taint(node, TAINT_UNREACHABLE, NO_SCHEDULE).is_some()
        && taint(node, TAINT_UNREACHABLE, NO_EXECUTE).is_some()
}

fn healthy(node: &Node) -> bool {
    ready(node).status == "True"
        && taint(node, TAINT_UNREACHABLE, NO_SCHEDULE).is_none()
        && taint(node, TAINT_UNREACHABLE, NO_EXECUTE).is_none()
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata()
        .is_some_and(|m| !m.deletion_timestamp.is_empty())
}

fn pod_ready_status(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready")
        .map(|c| c.status.clone())
}

/// When the server started deleting `pod` (deletionTimestamp minus the grace period).
fn deleted_at(pod: &Pod) -> DateTime<Utc> {
    let m = pod.metadata().expect("metadata");
    parse(&m.deletion_timestamp)
        - chrono::Duration::seconds(m.deletion_grace_period_seconds.unwrap_or(0))
}

async fn events(client: &Client, object: &str, reason: &str) -> Vec<Event> {
    client
        .namespaced::<Event>("default")
        .list(
            &ListParams::default().fields(&format!("involvedObject.name={object},reason={reason}")),
        )
        .await
        .expect("events")
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_node_is_tainted_and_its_pods_evicted_per_toleration() {
    let c = cluster().await;
    let heartbeat = create_node(&c.client, "n1").await;
    let renewer = renew_lease(&c.client, "n1");
    bound_pod(&c.client, "plain", "n1", vec![]).await;
    bound_pod(&c.client, "brief", "n1", vec![unreachable_for(Some(3))]).await;
    bound_pod(&c.client, "forever", "n1", vec![unreachable_for(None)]).await;
    let _kubelet = fake_kubelet(&c.client, Duration::ZERO);
    for name in ["plain", "brief", "forever"] {
        eventually(&format!("{name} ready"), || async {
            get_pod(&c.client, name).await.is_ready().then_some(())
        })
        .await;
    }
    let manager = start_manager_with(&c.client, config("m1"));

    // Two grace periods with the lease renewed: nothing happens.
    let until = Instant::now() + 2 * GRACE;
    while Instant::now() < until {
        let node = get_node(&c.client, "n1").await;
        assert!(healthy(&node), "a renewing node stays healthy: {node:?}");
        for name in ["plain", "brief", "forever"] {
            let pod = get_pod(&c.client, name).await;
            assert!(pod.is_ready() && !terminating(&pod), "{name}: {pod:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The agent stops: Unknown and tainted after the grace period, not before.
    drop(renewer);
    let stopped = Instant::now();
    let node = eventually("n1 unreachable", || async {
        let node = get_node(&c.client, "n1").await;
        unreachable(&node).then_some(node)
    })
    .await;
    let took = stopped.elapsed();
    assert!(
        took >= GRACE - RENEW_EVERY - Duration::from_millis(300)
            && took <= GRACE + Duration::from_secs(4),
        "declared unreachable {took:?} after the last renewal"
    );
    for cond in &node.status.as_ref().expect("status").conditions {
        assert_eq!(cond.status, "Unknown", "{cond:?}");
        assert_eq!(cond.reason, REASON_STATUS_UNKNOWN);
        assert_eq!(cond.message, MESSAGE_STATUS_UNKNOWN);
        assert_eq!(cond.last_heartbeat_time, heartbeat, "heartbeat kept");
        assert_ne!(cond.last_transition_time, heartbeat, "transition time set");
    }
    assert!(
        taint(&node, OTHER_TAINT, NO_SCHEDULE).is_some(),
        "other taints stay"
    );
    let added = parse(
        &taint(&node, TAINT_UNREACHABLE, NO_EXECUTE)
            .expect("NoExecute taint")
            .time_added,
    );
    eventually("NodeNotReady event", || async {
        (!events(&c.client, "n1", EVENT_NODE_NOT_READY)
            .await
            .is_empty())
        .then_some(())
    })
    .await;

    // Every pod on it is marked not ready; the intolerant one is evicted at once.
    for name in ["plain", "brief", "forever"] {
        eventually(&format!("{name} not ready"), || async {
            (pod_ready_status(&get_pod(&c.client, name).await).as_deref() == Some("False"))
                .then_some(())
        })
        .await;
    }
    let plain = eventually("plain evicted", || async {
        let p = get_pod(&c.client, "plain").await;
        terminating(&p).then_some(p)
    })
    .await;
    assert!(deleted_at(&plain) >= added, "evicted after the taint");
    let evictions = events(&c.client, "plain", EVENT_EVICTION).await;
    assert_eq!(evictions.len(), 1, "{evictions:?}");
    assert_eq!(
        evictions[0].message,
        "Marking for deletion Pod default/plain"
    );

    // The pod tolerating it for 3 s: not before 3 s after timeAdded, then evicted.
    let not_before = added + chrono::Duration::milliseconds(2800);
    while Utc::now() < not_before {
        let p = get_pod(&c.client, "brief").await;
        assert!(
            !terminating(&p),
            "brief evicted before its tolerationSeconds: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let brief = eventually("brief evicted", || async {
        let p = get_pod(&c.client, "brief").await;
        terminating(&p).then_some(p)
    })
    .await;
    assert!(
        deleted_at(&brief) >= added + chrono::Duration::seconds(3),
        "brief deleted at {} but its taint was added at {added}",
        deleted_at(&brief)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !terminating(&get_pod(&c.client, "forever").await),
        "a pod tolerating the taint forever stays"
    );

    // The agent is back: the controller removes the taints once it reports Ready.
    let _renewer = renew_lease(&c.client, "n1");
    post_ready(&c.client, "n1").await;
    let node = eventually("n1 untainted", || async {
        let node = get_node(&c.client, "n1").await;
        healthy(&node).then_some(node)
    })
    .await;
    assert!(taint(&node, OTHER_TAINT, NO_SCHEDULE).is_some());
    // ...and leaves the node alone while the lease is renewed.
    let until = Instant::now() + 2 * GRACE;
    while Instant::now() < until {
        let node = get_node(&c.client, "n1").await;
        assert!(healthy(&node), "a recovered node stays healthy: {node:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!terminating(&get_pod(&c.client, "forever").await));
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restarted_controller_gives_nodes_a_grace_period() {
    let c = cluster().await;
    create_node(&c.client, "n2").await;
    let renewer = renew_lease(&c.client, "n2");
    bound_pod(&c.client, "victim", "n2", vec![]).await;
    let first = start_manager_with(&c.client, config("m1"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.shutdown().await;

    // The lease goes stale while no controller runs.
    drop(renewer);
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;
    assert!(healthy(&get_node(&c.client, "n2").await));

    let started = Instant::now();
    let _second = start_manager_with(&c.client, config("m2"));
    while started.elapsed() < GRACE - Duration::from_millis(300) {
        let node = get_node(&c.client, "n2").await;
        assert!(
            healthy(&node),
            "declared dead {:?} after the controller started: {node:?}",
            started.elapsed()
        );
        assert!(!terminating(&get_pod(&c.client, "victim").await));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It still is dead: one grace period after the start, it is declared so.
    eventually("n2 unreachable", || async {
        unreachable(&get_node(&c.client, "n2").await).then_some(())
    })
    .await;
    eventually("victim evicted", || async {
        terminating(&get_pod(&c.client, "victim").await).then_some(())
    })
    .await;
    assert!(started.elapsed() >= GRACE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn evictions_are_rate_limited_per_node() {
    let c = cluster().await;
    create_node(&c.client, "n3").await;
    let renewer = renew_lease(&c.client, "n3");
    let names = ["p1", "p2", "p3"];
    for name in names {
        bound_pod(&c.client, name, "n3", vec![]).await;
    }
    let mut cfg = config("m");
    cfg.node_lifecycle.evictions_per_period = 1;
    let _manager = start_manager_with(&c.client, cfg);
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(renewer);
    let mut pods = Vec::new();
    for name in names {
        pods.push(
            eventually(&format!("{name} evicted"), || async {
                let p = get_pod(&c.client, name).await;
                terminating(&p).then_some(p)
            })
            .await,
        );
    }
    // One pod per monitor period (1 s): three distinct seconds on the server's clock.
    let mut at: Vec<DateTime<Utc>> = pods.iter().map(deleted_at).collect();
    at.sort();
    assert!(
        at.windows(2)
            .all(|w| w[1] - w[0] >= chrono::Duration::seconds(1)),
        "evictions not spread out: {at:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployment_pods_on_a_dead_node_are_replaced() {
    let c = cluster().await;
    create_node(&c.client, "a").await;
    create_node(&c.client, "b").await;
    let renew_a = renew_lease(&c.client, "a");
    let _renew_b = renew_lease(&c.client, "b");
    let _kubelet = fake_kubelet(&c.client, Duration::ZERO);
    let _manager = start_manager_with(&c.client, config("m"));
    let d = Deployment {
        metadata: meta("web"),
        spec: Some(DeploymentSpec {
            replicas: Some(4),
            selector: selector(&[("app", "web")]),
            template: template(&[("app", "web")], "1"),
            ..Default::default()
        }),
        ..Default::default()
    };
    c.client
        .namespaced::<Deployment>("default")
        .create(&d)
        .await
        .expect("create deployment");
    let mut pods = eventually("4 pods", || async {
        let pods = active_pods(&c.client, "app=web").await;
        (pods.len() == 4).then_some(pods)
    })
    .await;
    pods.sort_by(|x, y| x.name().cmp(y.name()));
    // The scheduler's part: two pods on each node.
    let api = c.client.namespaced::<Pod>("default");
    let on_a: Vec<String> = pods[..2].iter().map(|p| p.name().to_string()).collect();
    let on_b: Vec<String> = pods[2..].iter().map(|p| p.name().to_string()).collect();
    for name in &on_a {
        api.bind(name, "a").await.expect("bind to a");
    }
    for name in &on_b {
        api.bind(name, "b").await.expect("bind to b");
    }
    eventually("4 ready pods", || async {
        let pods = active_pods(&c.client, "app=web").await;
        (pods.len() == 4 && pods.iter().all(Pod::is_ready)).then_some(())
    })
    .await;

    drop(renew_a);
    eventually("a unreachable", || async {
        unreachable(&get_node(&c.client, "a").await).then_some(())
    })
    .await;
    let replacements = eventually("a's pods replaced", || async {
        for name in &on_a {
            if !terminating(&get_pod(&c.client, name).await) {
                return None;
            }
        }
        let active = active_pods(&c.client, "app=web").await;
        let new: Vec<Pod> = active
            .iter()
            .filter(|p| {
                !on_a.contains(&p.name().to_string()) && !on_b.contains(&p.name().to_string())
            })
            .cloned()
            .collect();
        (active.len() == 4 && new.len() == 2).then_some(new)
    })
    .await;
    // No scheduler runs: the replacements wait unbound; b and its pods are untouched.
    for p in &replacements {
        assert_eq!(p.spec.as_ref().map(|s| s.node_name.as_str()), Some(""));
    }
    for name in &on_a {
        assert_eq!(
            pod_ready_status(&get_pod(&c.client, name).await).as_deref(),
            Some("False")
        );
    }
    assert!(healthy(&get_node(&c.client, "b").await));
    for name in &on_b {
        let p = get_pod(&c.client, name).await;
        assert!(!terminating(&p) && p.is_ready(), "{p:?}");
    }
}
