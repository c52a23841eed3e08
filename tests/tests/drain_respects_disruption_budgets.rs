//! `kubectl drain` evicts pods only as far as their PodDisruptionBudget allows: the real
//! kubectl 1.32 drains a node of a Deployment's pods while a watch checks, after every pod
//! event, that the budget's minAvailable ready pods never drop below it; a budget that
//! allows nothing makes the drain time out with Kubernetes' 429 message and every pod
//! stays. Budgets through `kubectl create pdb`, `kubectl get pdb` columns, bad input refused.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::{ListParams, WatchEvent};
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(90);

const WEB: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 4
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: host
        command: ["busybox", "sh", "-c", "while true; do sleep 1; done"]
        readinessProbe:
          exec: {command: ["true"]}
          periodSeconds: 1
"#;

fn live(p: &Pod) -> bool {
    p.is_ready()
        && p.metadata
            .as_ref()
            .is_some_and(|m| m.deletion_timestamp.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_the_budget_and_never_goes_below_it() {
    let c = Cluster::start(2).await;
    let k = |args: &[&str], stdin: Option<&str>| {
        let (ok, out, err) = c.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}");
        out
    };
    k(&["apply", "-f", "-"], Some(WEB));
    k(
        &[
            "create",
            "pdb",
            "web",
            "--selector=app=web",
            "--min-available=3",
        ],
        None,
    );
    skiff_testkit::eventually_blocking("4 ready pods and one allowed disruption", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "get",
                "pdb",
                "web",
                "-o",
                "jsonpath={.status.currentHealthy}/{.status.disruptionsAllowed}",
            ],
            None,
        );
        (out == "4/1").then_some(())
    });
    let table = k(&["get", "pdb"], None);
    assert!(
        table.starts_with("NAME   MIN AVAILABLE   MAX UNAVAILABLE   ALLOWED DISRUPTIONS   AGE"),
        "{table}"
    );
    assert!(
        table.contains("web    3               N/A               1    "),
        "{table}"
    );

    // The node with the most web pods.
    let api = c.client.namespaced::<Pod>("default");
    let lp = ListParams::default().labels("app=web");
    let listed = api.list(&lp).await.unwrap();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in &listed.items {
        *per_node
            .entry(p.spec.as_ref().unwrap().node_name.clone())
            .or_default() += 1;
    }
    let (node, on_node) = per_node
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(n, c)| (n.clone(), *c))
        .unwrap();

    // Drain it while watching every pod event.
    let mut state: BTreeMap<String, Pod> = listed
        .items
        .into_iter()
        .map(|p| (p.name().to_string(), p))
        .collect();
    let mut events = api.watch(&lp, &listed.resource_version);
    let drain = c
        .server
        .kubectl_cmd(&["drain", &node, "--ignore-daemonsets", "--timeout=80s"])
        .output();
    let drain = tokio::task::spawn_blocking(move || drain);
    let watched_node = node.clone();
    let watcher = tokio::spawn(async move {
        let mut lowest = usize::MAX;
        let mut seen = 0;
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let next = tokio::time::timeout_at(deadline, events.next()).await;
            let Ok(Some(Ok(ev))) = next else { break };
            seen += 1;
            match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    state.insert(p.name().to_string(), p);
                }
                WatchEvent::Deleted(p) => {
                    state.remove(p.name());
                }
            }
            let ready = state.values().filter(|p| live(p)).count();
            lowest = lowest.min(ready);
            // Done: 4 ready again and no pod left on the drained node.
            let on_node = state
                .values()
                .any(|p| p.spec.as_ref().is_some_and(|s| s.node_name == watched_node));
            if ready == 4 && !on_node {
                break;
            }
        }
        (lowest, seen)
    });
    let out = drain.await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "drain failed:\n{stdout}\n{stderr}\n{}",
        c.logs()
    );
    assert!(stdout.contains(&format!("node/{node} drained")), "{stdout}");
    if on_node >= 2 {
        // The second eviction had to wait for the first pod's replacement.
        assert!(
            stderr.contains("Cannot evict pod as it would violate the pod's disruption budget."),
            "{stderr}"
        );
    }
    let (lowest, seen) = watcher.await.unwrap();
    assert!(
        lowest >= 3,
        "{lowest} ready pods at one point ({seen} events)"
    );
    let (_, on_drained, _) = c.kubectl(
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "--field-selector",
            &format!("spec.nodeName={node}"),
            "-o",
            "name",
        ],
        None,
    );
    assert_eq!(on_drained, "", "the drained node still runs web pods");

    // A budget that allows nothing: the drain times out, every pod stays.
    k(&["uncordon", &node], None);
    k(
        &[
            "patch",
            "pdb",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"minAvailable":4}}"#,
        ],
        None,
    );
    skiff_testkit::eventually_blocking("the budget allows nothing", T, || {
        let (_, out, _) = c.kubectl(
            &["get", "pdb", "web", "-o", "jsonpath={.status.observedGeneration}/{.metadata.generation}/{.status.disruptionsAllowed}"],
            None,
        );
        (out == "2/2/0").then_some(())
    });
    let other = per_node
        .keys()
        .find(|n| **n != node)
        .cloned()
        .unwrap_or_else(|| {
            c.nodes
                .iter()
                .map(|n| n.name.clone())
                .find(|n| *n != node)
                .unwrap()
        });
    let out = c
        .server
        .kubectl_cmd(&["drain", &other, "--ignore-daemonsets", "--timeout=8s"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(
        stderr.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{stderr}"
    );
    let ready = api
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| live(p))
        .count();
    assert_eq!(ready, 4, "no pod was evicted past the budget");
    k(&["uncordon", &other], None);

    // Bad input: both fields, a negative number, a percentage over 100.
    let bad = r#"{"apiVersion":"policy/v1","kind":"PodDisruptionBudget","metadata":{"name":"bad"},
        "spec":{"minAvailable":1,"maxUnavailable":1,"selector":{"matchLabels":{"app":"web"}}}}"#;
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(bad));
    assert!(!ok);
    assert!(
        err.contains("The PodDisruptionBudget \"bad\" is invalid")
            && err.contains("minAvailable and maxUnavailable cannot be both set"),
        "{err}"
    );
    let bad = bad.replace(
        r#""minAvailable":1,"maxUnavailable":1"#,
        r#""maxUnavailable":"150%""#,
    );
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&bad));
    assert!(!ok);
    assert!(
        err.contains("spec.maxUnavailable: Invalid value: \"150%\""),
        "{err}"
    );
}
