//! StatefulSets with the real kubectl on a real cluster: stable names and ordinals under a
//! headless Service, OrderedReady creation (checked on every pod event: a pod appears only
//! once every lower ordinal is ready), scale-down from the highest ordinal, a rolling update
//! that stops at the partition, `kubectl rollout status`, a deleted pod coming back under its
//! name, and Kubernetes' refusals.
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

const DB: &str = r#"apiVersion: v1
kind: Service
metadata: {name: db}
spec:
  clusterIP: None
  selector: {app: db}
  ports: [{port: 6379}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 3
  selector: {matchLabels: {app: db}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {partition: PARTITION}}
  template:
    metadata:
      labels: {app: db}
      annotations: {version: "VERSION"}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: db
        image: host
        command: ["busybox", "sh", "-c", "while true; do sleep 1; done"]
        readinessProbe:
          exec: {command: ["true"]}
          periodSeconds: 1
"#;

fn db(partition: u32, version: &str) -> String {
    DB.replace("PARTITION", &partition.to_string())
        .replace("VERSION", version)
}

fn ready(p: &Pod) -> bool {
    p.is_ready()
        && p.metadata
            .as_ref()
            .is_some_and(|m| m.deletion_timestamp.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_sets_keep_names_order_and_partitions() {
    let c = Cluster::start(2).await;
    let k = |args: &[&str], stdin: Option<&str>| {
        let (ok, out, err) = c.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}\n{}", c.logs());
        out
    };
    let api = c.client.namespaced::<Pod>("default");
    let lp = ListParams::default().labels("app=db");
    let listed = api.list(&lp).await.unwrap();
    let mut events = api.watch(&lp, &listed.resource_version);
    k(&["apply", "-f", "-"], Some(&db(0, "v1")));

    // OrderedReady: db-N appears only when db-0..db-(N-1) are ready.
    let mut state: BTreeMap<String, Pod> = BTreeMap::new();
    tokio::time::timeout(T, async {
        while state.values().filter(|p| ready(p)).count() < 3 {
            let ev = events.next().await.unwrap().unwrap();
            if let WatchEvent::Added(p) = &ev {
                let n: u32 = p.name().trim_start_matches("db-").parse().unwrap();
                for lower in 0..n {
                    let l = state.get(&format!("db-{lower}"));
                    assert!(
                        l.is_some_and(ready),
                        "db-{n} created before db-{lower} was ready"
                    );
                }
            }
            match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    state.insert(p.name().to_string(), p);
                }
                WatchEvent::Deleted(p) => {
                    state.remove(p.name());
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("3 ready pods: {:?}\n{}", state.keys(), c.logs()));
    assert_eq!(state.keys().collect::<Vec<_>>(), ["db-0", "db-1", "db-2"]);
    let table = k(&["get", "sts", "db"], None);
    assert!(table.starts_with("NAME   READY   AGE"), "{table}");
    assert!(table.contains("db     3/3"), "{table}");
    assert_eq!(
        k(
            &[
                "get",
                "pod",
                "db-1",
                "-o",
                "jsonpath={.spec.hostname}.{.spec.subdomain}"
            ],
            None
        ),
        "db-1.db"
    );
    assert_eq!(
        k(
            &[
                "get",
                "pod",
                "db-2",
                "-o",
                "jsonpath={.metadata.labels.apps\\.kubernetes\\.io/pod-index}"
            ],
            None
        ),
        "2"
    );

    // Scale down: the highest ordinal goes first.
    k(&["scale", "sts", "db", "--replicas=1"], None);
    let mut deleted = Vec::new();
    tokio::time::timeout(T, async {
        while deleted.len() < 2 {
            if let WatchEvent::Deleted(p) = events.next().await.unwrap().unwrap() {
                deleted.push(p.name().to_string());
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("scale-down: {deleted:?}\n{}", c.logs()));
    assert_eq!(deleted, ["db-2", "db-1"]);

    // A rolling update with partition 1: db-2 and db-1 take the new template, db-0 keeps
    // its revision; kubectl waits for the partitioned rollout.
    k(&["apply", "-f", "-"], Some(&db(1, "v2")));
    k(&["rollout", "status", "sts/db", "--timeout=90s"], None);
    let revisions = |c: &Cluster| {
        let (_, out, _) = c.kubectl(
            &["get", "pods", "-l", "app=db", "-o", "jsonpath={range .items[*]}{.metadata.name}={.metadata.labels.controller-revision-hash} {end}"],
            None,
        );
        out.split_whitespace()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            })
            .collect::<BTreeMap<String, String>>()
    };
    skiff_testkit::eventually_blocking("db-1 and db-2 updated, db-0 not", T, || {
        let r = revisions(&c);
        let update = k(
            &[
                "get",
                "sts",
                "db",
                "-o",
                "jsonpath={.status.updateRevision}",
            ],
            None,
        );
        (r.len() == 3 && r["db-1"] == update && r["db-2"] == update && r["db-0"] != update)
            .then_some(())
    });
    assert_eq!(
        k(
            &[
                "get",
                "sts",
                "db",
                "-o",
                "jsonpath={.status.updatedReplicas}"
            ],
            None
        ),
        "2"
    );

    // A deleted pod comes back under its own name.
    let uid = k(
        &["get", "pod", "db-1", "-o", "jsonpath={.metadata.uid}"],
        None,
    );
    k(&["delete", "pod", "db-1", "--wait=false"], None);
    skiff_testkit::eventually_blocking("db-1 back, a new pod", T, || {
        let (ok, out, _) = c.kubectl(
            &[
                "get",
                "pod",
                "db-1",
                "-o",
                "jsonpath={.metadata.uid} {.status.phase}",
            ],
            None,
        );
        (ok && !out.starts_with(&uid) && out.ends_with("Running")).then_some(())
    });

    // Refusals.
    let (ok, _, err) = c.kubectl(
        &[
            "patch",
            "sts",
            "db",
            "--type=merge",
            "-p",
            r#"{"spec":{"serviceName":"other"}}"#,
        ],
        None,
    );
    assert!(!ok);
    assert!(
        err.contains("spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"),
        "{err}"
    );
    let bad = db(0, "v1")
        .replace(
            "name: db}\nspec:\n  serviceName",
            "name: bad}\nspec:\n  serviceName",
        )
        .replace("matchLabels: {app: db}", "matchLabels: {app: other}");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&bad));
    assert!(!ok);
    assert!(
        err.contains("The StatefulSet \"bad\" is invalid")
            && err.contains("`selector` does not match template `labels`"),
        "{err}"
    );
}
