//! Persistent storage the way k3s ships it: the default StorageClass `local-path`
//! (WaitForFirstConsumer), a StatefulSet of 3 with volumeClaimTemplates, applied unchanged
//! with the real kubectl: each pod gets its claim `data-db-<i>`, bound to a volume the
//! local-path provisioner made on the node the scheduler chose; data a pod writes survives
//! its deletion and is there for its replacement (on the same node, by the volume's node
//! affinity); claims stay when the set scales down, and a deleted claim's volume goes
//! (reclaim policy Delete).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use skiff_testkit::registry::Registry;
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(120);

/// Waits for `check`, else fails with what the cluster looks like.
fn wait(c: &Cluster, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + T;
    while std::time::Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let (_, state, _) = c.kubectl(&["get", "pods,pvc,pv,sc", "-o", "wide"], None);
    let (_, events, _) = c.kubectl(&["get", "events"], None);
    panic!(
        "{what}: not within {T:?}\n{state}\n{events}\n{}\n{}",
        c.logs(),
        c.agent_logs()
    );
}

fn jsonpath(c: &Cluster, args: &[&str]) -> String {
    let (ok, out, err) = c.kubectl(args, None);
    assert!(ok, "{err}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_set_data_survives_its_pods() {
    let registry = Registry::start();
    let image = registry.push_busybox("demo/db:v1").await;
    let c = Cluster::start(2).await;
    // The manager made the default class, as k3s ships it.
    skiff_testkit::eventually_blocking("the default StorageClass", T, || {
        let (_, table, _) = c.kubectl(&["get", "storageclass"], None);
        table.contains("local-path (default)").then_some(())
    });
    let manifest = format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: db}}
spec:
  clusterIP: None
  selector: {{app: db}}
  ports: [{{port: 6379}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: db}}
spec:
  serviceName: db
  replicas: 3
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata: {{labels: {{app: db}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: db
        image: {image}
        command: ["/bin/busybox", "sh", "-c", "echo started >> /data/log; exec /bin/busybox sleep 3600"]
        volumeMounts: [{{name: data, mountPath: /data}}]
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {{requests: {{storage: 1Gi}}}}
"#
    );
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&manifest));
    assert!(ok, "{err}");
    wait(&c, "three pods Ready with bound claims", || {
        let ready = jsonpath(
            &c,
            &[
                "get",
                "statefulset",
                "db",
                "-o",
                "jsonpath={.status.readyReplicas}",
            ],
        );
        let phases = jsonpath(
            &c,
            &["get", "pvc", "-o", "jsonpath={.items[*].status.phase}"],
        );
        ready == "3" && phases == "Bound Bound Bound"
    });
    let (_, pvcs, _) = c.kubectl(&["get", "pvc"], None);
    for i in 0..3 {
        assert!(
            pvcs.lines().any(|l| l.starts_with(&format!("data-db-{i} "))
                && l.contains("Bound")
                && l.contains("1Gi")
                && l.contains("RWO")
                && l.contains("local-path")),
            "{pvcs}"
        );
    }
    // Each claim's volume lives on its pod's node.
    for i in 0..3 {
        let node = jsonpath(
            &c,
            &[
                "get",
                "pod",
                &format!("db-{i}"),
                "-o",
                "jsonpath={.spec.nodeName}",
            ],
        );
        let pv = jsonpath(
            &c,
            &[
                "get",
                "pvc",
                &format!("data-db-{i}"),
                "-o",
                "jsonpath={.spec.volumeName}",
            ],
        );
        let affinity = jsonpath(
            &c,
            &[
                "get",
                "pv",
                &pv,
                "-o",
                "jsonpath={.spec.nodeAffinity.required.nodeSelectorTerms[0].matchFields[0].values[0]}",
            ],
        );
        assert_eq!(affinity, node, "volume {pv} of db-{i}");
    }
    // Data written by db-1 ...
    let (ok, _, err) = c.kubectl(
        &[
            "exec",
            "db-1",
            "--",
            "/bin/busybox",
            "sh",
            "-c",
            "echo precious > /data/value",
        ],
        None,
    );
    assert!(ok, "{err}");
    let node_before = jsonpath(
        &c,
        &["get", "pod", "db-1", "-o", "jsonpath={.spec.nodeName}"],
    );
    let uid_before = jsonpath(
        &c,
        &["get", "pod", "db-1", "-o", "jsonpath={.metadata.uid}"],
    );
    let (ok, _, err) = c.kubectl(&["delete", "pod", "db-1", "--wait=true"], None);
    assert!(ok, "{err}");
    // ... is there for its replacement, on the same node.
    wait(&c, "db-1 replaced and Ready", || {
        // The pod may be gone for a moment: no answer is "not yet".
        let get = |args: &[&str]| c.kubectl(args, None).1;
        let uid = get(&["get", "pod", "db-1", "-o", "jsonpath={.metadata.uid}"]);
        let ready = get(&[
            "get",
            "pod",
            "db-1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        !uid.is_empty() && uid != uid_before && ready == "True"
    });
    let node_after = jsonpath(
        &c,
        &["get", "pod", "db-1", "-o", "jsonpath={.spec.nodeName}"],
    );
    assert_eq!(node_after, node_before);
    let (ok, out, err) = c.kubectl(
        &[
            "exec",
            "db-1",
            "--",
            "/bin/busybox",
            "cat",
            "/data/value",
            "/data/log",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(out, "precious\nstarted\nstarted\n");
    // Scaling down keeps the claims.
    let (ok, _, err) = c.kubectl(&["scale", "statefulset", "db", "--replicas=1"], None);
    assert!(ok, "{err}");
    wait(&c, "scaled down to one pod", || {
        let pods = jsonpath(&c, &["get", "pods", "-l", "app=db", "-o", "name"]);
        pods.trim() == "pod/db-0"
    });
    let claims = jsonpath(&c, &["get", "pvc", "-o", "name"]);
    assert_eq!(
        claims.trim(),
        "persistentvolumeclaim/data-db-0\npersistentvolumeclaim/data-db-1\npersistentvolumeclaim/data-db-2"
    );
    // A deleted claim's volume goes with it (Delete).
    let pv2 = jsonpath(
        &c,
        &[
            "get",
            "pvc",
            "data-db-2",
            "-o",
            "jsonpath={.spec.volumeName}",
        ],
    );
    let (ok, _, err) = c.kubectl(&["delete", "pvc", "data-db-2"], None);
    assert!(ok, "{err}");
    wait(&c, "the volume of a deleted claim removed", || {
        let (_, names, _) = c.kubectl(&["get", "pv", "-o", "name"], None);
        !names.contains(&pv2)
    });
}
