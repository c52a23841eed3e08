//! DaemonSets with the real kubectl on a real cluster: one pod per eligible node, following
//! nodes as they join, get tainted (NoExecute removes the pod, NoSchedule keeps it) and
//! leave; a rolling update that never has more than maxUnavailable nodes without a ready
//! pod, checked by watching the pods throughout; `kubectl rollout status`; bad input refused
//! with Kubernetes' messages.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::{ListParams, WatchEvent};
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(90);

const DS: &str = r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  template:
    metadata:
      labels: {app: agent}
      annotations: {version: "VERSION"}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: agent
        image: host
        command: ["busybox", "sh", "-c", "while true; do sleep 1; done"]
        readinessProbe:
          exec: {command: ["true"]}
          periodSeconds: 1
"#;

/// The agent pods: (name, node, ready, terminating, revision hash).
fn pods(c: &Cluster) -> Vec<(String, String, bool, bool, String)> {
    let (ok, out, err) = c.kubectl(&["get", "pods", "-l", "app=agent", "-o", "json"], None);
    assert!(ok, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let ready = p["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            let node = p["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (
                p["metadata"]["name"].as_str().unwrap().to_string(),
                node,
                ready,
                !p["metadata"]["deletionTimestamp"].is_null(),
                p["metadata"]["labels"]["controller-revision-hash"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

fn labels_of(p: &Pod) -> BTreeMap<String, String> {
    p.metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default()
}

/// The nodes with a live (not terminating) agent pod.
fn nodes_with_pods(c: &Cluster) -> BTreeSet<String> {
    pods(c)
        .into_iter()
        .filter(|p| !p.3 && !p.1.is_empty())
        .map(|p| p.1)
        .collect()
}

fn status(c: &Cluster) -> String {
    let (_, out, _) = c.kubectl(
        &[
            "get",
            "ds",
            "agent",
            "-o",
            "jsonpath={.status.desiredNumberScheduled} {.status.currentNumberScheduled} \
             {.status.numberReady} {.status.numberMisscheduled}",
        ],
        None,
    );
    out
}

fn wait_status(c: &Cluster, what: &str, want: &str) {
    let deadline = Instant::now() + T;
    loop {
        let s = status(c);
        if s == want {
            return;
        }
        if Instant::now() > deadline {
            let (_, ev, _) = c.kubectl(&["get", "events"], None);
            panic!(
                "{what}: status {s:?}, want {want:?}\n{:?}\n{ev}\n{}",
                pods(c),
                c.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemonsets_follow_nodes_and_roll_within_max_unavailable() {
    let mut c = Cluster::start(2).await;
    let k = |c: &Cluster, args: &[&str], stdin: Option<&str>| {
        let (ok, out, err) = c.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}");
        out
    };
    k(
        &c,
        &["apply", "-f", "-"],
        Some(&DS.replace("VERSION", "v1")),
    );
    wait_status(&c, "on both nodes", "2 2 2 0");
    let all: BTreeSet<String> = c.nodes.iter().map(|n| n.name.clone()).collect();
    assert_eq!(nodes_with_pods(&c), all);
    let table = k(&c, &["get", "ds", "agent"], None);
    assert!(
        table.starts_with(
            "NAME    DESIRED   CURRENT   READY   UP-TO-DATE   AVAILABLE   NODE SELECTOR   AGE"
        ),
        "{table}"
    );
    assert!(
        table.contains("agent   2         2         2       2            2           <none>"),
        "{table}"
    );

    // A node joins: it gets its pod.
    let joined = c.add_node("n2", &[]);
    c.wait_nodes_ready().await;
    wait_status(&c, "on the new node", "3 3 3 0");
    assert!(nodes_with_pods(&c).contains(&joined));

    // NoExecute that the pods do not tolerate: the pod goes; untainted, it comes back.
    k(
        &c,
        &["taint", "nodes", &joined, "dedicated=infra:NoExecute"],
        None,
    );
    wait_status(&c, "off the NoExecute node", "2 2 2 0");
    skiff_testkit::eventually_blocking("no live pod on the tainted node", T, || {
        (!nodes_with_pods(&c).contains(&joined)).then_some(())
    });
    k(
        &c,
        &["taint", "nodes", &joined, "dedicated:NoExecute-"],
        None,
    );
    wait_status(&c, "back after the taint went", "3 3 3 0");

    // NoSchedule: not a node for new pods, but the one there stays (misscheduled).
    let first = c.nodes[0].name.clone();
    k(
        &c,
        &["taint", "nodes", &first, "dedicated=infra:NoSchedule"],
        None,
    );
    wait_status(&c, "NoSchedule counted", "2 2 2 1");
    assert!(nodes_with_pods(&c).contains(&first), "{:?}", pods(&c));
    k(
        &c,
        &["taint", "nodes", &first, "dedicated:NoSchedule-"],
        None,
    );
    wait_status(&c, "NoSchedule gone", "3 3 3 0");

    // A rolling update, watched event by event from the state before it: after every pod
    // event, at most maxUnavailable (1) of the 3 nodes lack a ready pod that is not being
    // deleted.
    let before: BTreeSet<String> = pods(&c).into_iter().map(|p| p.4).collect();
    assert_eq!(before.len(), 1);
    let api = c.client.namespaced::<Pod>("default");
    let lp = ListParams::default().labels("app=agent");
    let listed = api.list(&lp).await.unwrap();
    let mut state: BTreeMap<String, Pod> = listed
        .items
        .into_iter()
        .map(|p| (p.name().to_string(), p))
        .collect();
    let mut events = api.watch(&lp, &listed.resource_version);
    k(
        &c,
        &["apply", "-f", "-"],
        Some(&DS.replace("VERSION", "v2")),
    );
    let live = |p: &Pod| {
        p.is_ready()
            && p.metadata
                .as_ref()
                .is_some_and(|m| m.deletion_timestamp.is_empty())
    };
    let serving = |state: &BTreeMap<String, Pod>| -> BTreeSet<String> {
        state
            .values()
            .filter(|p| live(p))
            .filter_map(|p| p.spec.as_ref().map(|s| s.node_name.clone()))
            .collect()
    };
    let updated = |state: &BTreeMap<String, Pod>| {
        state
            .values()
            .filter(|p| live(p))
            .filter(|p| {
                !before.contains(
                    labels_of(p)
                        .get("controller-revision-hash")
                        .map(String::as_str)
                        .unwrap_or(""),
                )
            })
            .count()
    };
    let mut seen = 0;
    let mut worst = 0;
    tokio::time::timeout(T, async {
        while updated(&state) < 3 {
            let ev = events
                .next()
                .await
                .expect("the watch goes on")
                .expect("a watch event");
            seen += 1;
            match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    state.insert(p.name().to_string(), p);
                }
                WatchEvent::Deleted(p) => {
                    state.remove(p.name());
                }
            }
            let unavailable = 3 - serving(&state).len();
            worst = worst.max(unavailable);
            assert!(
                unavailable <= 1,
                "{unavailable} nodes without a ready pod after event {seen}"
            );
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the rollout did not finish: {:?}\n{}", pods(&c), c.logs()));
    assert_eq!(worst, 1, "the old pods were replaced ({seen} events)");
    k(
        &c,
        &["rollout", "status", "ds/agent", "--timeout=60s"],
        None,
    );
    wait_status(&c, "rolled", "3 3 3 0");
    let updated = k(
        &c,
        &[
            "get",
            "ds",
            "agent",
            "-o",
            "jsonpath={.status.updatedNumberScheduled}",
        ],
        None,
    );
    assert_eq!(updated, "3");

    // A node leaves: its pod is removed from the DaemonSet's count and deleted.
    c.node(&joined).kill_agent();
    k(&c, &["delete", "node", &joined], None);
    wait_status(&c, "node gone", "2 2 2 0");
    skiff_testkit::eventually_blocking("no live pod for the deleted node", T, || {
        (!nodes_with_pods(&c).contains(&joined)).then_some(())
    });

    // Bad input, refused with field paths and Kubernetes' messages.
    let bad = DS
        .replace("VERSION", "v1")
        .replace("name: agent}", "name: bad}")
        .replace("matchLabels: {app: agent}", "matchLabels: {app: other}");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&bad));
    assert!(!ok);
    assert!(
        err.contains("The DaemonSet \"bad\" is invalid")
            && err.contains("`selector` does not match template `labels`"),
        "{err}"
    );
    let bad = DS
        .replace("VERSION", "v1")
        .replace("name: agent}", "name: bad}")
        .replace(
            "type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}",
            "type: Sometimes",
        );
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&bad));
    assert!(!ok);
    assert!(
        err.contains("spec.updateStrategy.type: Unsupported value: \"Sometimes\""),
        "{err}"
    );
    let by_node: BTreeMap<String, usize> =
        pods(&c)
            .into_iter()
            .filter(|p| !p.3)
            .fold(BTreeMap::new(), |mut m, p| {
                *m.entry(p.1).or_default() += 1;
                m
            });
    assert!(
        by_node.values().all(|n| *n == 1),
        "one pod per node: {by_node:?}"
    );

    // Deleting the DaemonSet removes its pods (garbage collector).
    k(&c, &["delete", "ds", "agent"], None);
    skiff_testkit::eventually_blocking("pods gone with their DaemonSet", T, || {
        nodes_with_pods(&c).is_empty().then_some(())
    });
}
