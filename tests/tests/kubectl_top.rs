//! The resource metrics API with the real `kubectl top`: a pod burning a CPU shows about one
//! core and an idle one next to none; a pod holding 64 MiB shows its memory, which matches
//! the resident memory the test reads itself from the pod's cgroup; `kubectl top nodes`
//! lists the node; a user with the `view` role may read metrics; the API is read-only.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use skiff_tests::cluster::Cluster;

const PODS: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: burner}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: burn
    image: host
    command: ["busybox", "sh", "-c", "while :; do :; done"]
---
apiVersion: v1
kind: Pod
metadata: {name: holder}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: hold
    image: host
    command: ["/usr/bin/python3", "-c", "b = bytearray(64 * 1024 * 1024); import time; time.sleep(3600)"]
"#;

/// The resident memory of every process in a cgroup and its descendants, in MiB.
fn rss_mib(dir: &std::path::Path) -> u64 {
    let mut kb = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for pid in std::fs::read_to_string(d.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
        {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            kb += status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    kb / 1024
}

/// `kubectl top pod <name> --no-headers`: (millicores, MiB).
fn top(c: &Cluster, pod: &str) -> Option<(u64, u64)> {
    let (ok, out, _) = c.kubectl(&["top", "pod", pod, "--no-headers"], None);
    if !ok {
        return None;
    }
    let cols: Vec<&str> = out.split_whitespace().collect();
    let cpu = cols.get(1)?.trim_end_matches('m').parse().ok()?;
    let mem = cols.get(2)?.trim_end_matches("Mi").parse().ok()?;
    Some((cpu, mem))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_top_shows_what_the_cgroups_count() {
    let c = Cluster::start(1).await;
    let k = |args: &[&str], stdin: Option<&str>| {
        let (ok, out, err) = c.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}\n{}", c.logs());
        out
    };
    k(&["apply", "-f", "-"], Some(PODS));
    for p in ["burner", "holder"] {
        k(
            &[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{p}"),
                "--timeout=60s",
            ],
            None,
        );
    }
    // A busy loop uses about one core (the machine may be shared: at least half of one).
    skiff_testkit::eventually_blocking("the burner near one core", Duration::from_secs(30), || {
        top(&c, "burner")
            .filter(|(cpu, _)| *cpu >= 500 && *cpu <= 1100)
            .map(|_| ())
    });
    let (idle_cpu, held) = top(&c, "holder").expect("kubectl top pod holder");
    assert!(idle_cpu < 100, "a sleeping pod: {idle_cpu}m");
    // 64 MiB held: kubectl's figure and the cgroup's processes agree (within 10%).
    let uid = k(
        &["get", "pod", "holder", "-o", "jsonpath={.metadata.uid}"],
        None,
    );
    let dir = c.nodes[0].cgroup_parent.join(format!("pod-{uid}"));
    let own = rss_mib(&dir);
    assert!(
        held >= 64 && own >= 64,
        "kubectl {held}Mi, cgroup processes {own}Mi"
    );
    assert!(
        held.abs_diff(own) * 10 <= own,
        "kubectl {held}Mi, cgroup processes {own}Mi"
    );

    // Containers, nodes.
    let containers = k(
        &["top", "pod", "burner", "--containers", "--no-headers"],
        None,
    );
    assert!(
        containers.contains("burner") && containers.contains("burn"),
        "{containers}"
    );
    let nodes = k(&["top", "nodes", "--no-headers"], None);
    assert!(nodes.contains(&c.nodes[0].name), "{nodes}");
    assert!(nodes.contains('%'), "{nodes}");

    // Read-only, and readable with the view role.
    let (ok, _, err) = c.kubectl(
        &[
            "delete",
            "--raw",
            "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/burner",
        ],
        None,
    );
    assert!(!ok && err.contains("MethodNotAllowed"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let viewer = c.server.user_kubeconfig(dir.path(), "viewer", &[]);
    k(
        &[
            "create",
            "rolebinding",
            "viewer-view",
            "--clusterrole=view",
            "--user=viewer",
        ],
        None,
    );
    skiff_testkit::eventually_blocking("the viewer reads metrics", Duration::from_secs(20), || {
        let out = c
            .server
            .kubectl_as(&viewer, &["top", "pods", "--no-headers"])
            .output()
            .unwrap();
        (out.status.success() && String::from_utf8_lossy(&out.stdout).contains("holder"))
            .then_some(())
    });
}
