//! A container cannot use symlinks in its volumes to make the node agent (root) write, or
//! the runtime mount, outside the volume (Kubernetes' CVE-2017-1002102 AtomicWriter and
//! CVE-2017-1002101 / CVE-2021-25741 subPath classes), in a real cluster with busybox
//! containers:
//!
//! 1. a container of a pod with a secret volume tries to write into it and to replace an
//!    item's directory, `..data` and a directory inside the data directory with symlinks to a
//!    directory of the node; every attempt fails (the volume is read-only whatever the
//!    volumeMount says), and after the Secret changes (so the agent rewrites the volume) the
//!    node directory has no new file while the container sees the new values;
//! 2. a container replaces a directory of an emptyDir with a symlink to a node directory
//!    while another container of the pod mounts that directory as its subPath (the
//!    CVE-2021-25741 exploit; Skiff runs no init containers, so the planting container runs
//!    beside it): the other container's next start is refused (CreateContainerConfigError
//!    naming the symbolic link) and no run of it sees the node directory's files.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use skiff_testkit::registry::Registry;
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(90);

/// Tries each attack on the secret volume at /creds (`$TARGET` is the node directory) and
/// reports `<attack>=yes|no`, ending with `report-done`.
const ATTACKS: &str = r#"
try() { if sh -c "$1" 2>/dev/null; then echo "$2=yes"; else echo "$2=no"; fi; }
try 'echo x > /creds/planted' write
try "rm -rf /creds/nested && ln -s $TARGET /creds/nested" nested
try 'ts=$(readlink /creds/..data) && rm -rf "/creds/$ts/nested" && ln -s "$TARGET" "/creds/$ts/nested"' datadir
try "rm -rf /creds/..data && ln -s $TARGET /creds/..data" data
echo report-done
exec sleep 3600
"#;

/// The names in `dir`.
fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_symlink_escapes_are_stopped() {
    let registry = Registry::start();
    let image = registry.push_busybox("demo/volume-escapes:v1").await;
    let c = Cluster::start(1).await;

    // A directory of the node (the nodes share this machine's filesystem) the attacker
    // points its symlinks at, with a file only the node should see.
    let node_dir = tempfile::tempdir().unwrap();
    let target = node_dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(node_dir.path().join("node-secret"), "node-only").unwrap();
    let before = names(node_dir.path());
    let target_s = target.display().to_string();
    let node_s = node_dir.path().display().to_string();

    let docs = [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
               "stringData": {"user": "admin", "pass": "one"}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "atomic"},
               "spec": {
                 "volumes": [{"name": "creds", "secret": {"secretName": "creds",
                     "items": [{"key": "user", "path": "user"},
                               {"key": "pass", "path": "nested/pass"}]}}],
                 "containers": [{"name": "app", "image": image, "args": [ATTACKS],
                     "env": [{"name": "TARGET", "value": target_s}],
                     // Not readOnly: the agent mounts secret volumes read-only anyway.
                     "volumeMounts": [{"name": "creds", "mountPath": "/creds"}]}]}}),
        // CVE-2021-25741's exploit: one container swaps the subPath directory for a
        // symlink to a node directory, and the other's next start mounts its subPath.
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "subpath"},
               "spec": {
                 "volumes": [{"name": "work", "emptyDir": {}}],
                 "containers": [
                   {"name": "plant", "image": image,
                    "args": [format!("rm -rf /work/evil && ln -s {node_s} /work/evil && \
                                      echo planted; exec sleep 3600")],
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
                   {"name": "app", "image": image,
                    "args": ["cat /escape/node-secret; echo run-done; sleep 1; exit 1"],
                    "volumeMounts": [{"name": "work", "mountPath": "/escape",
                                      "subPath": "evil"}]}]}}),
    ]
    .map(|d| d.to_string());
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&docs.join("\n")));
    assert!(ok, "{err}");

    // 1. The AtomicWriter's volume.
    let report = skiff_testkit::eventually_blocking("the attacks' report", T, || {
        let (_, out, _) = c.kubectl(&["logs", "atomic"], None);
        out.contains("report-done").then_some(out)
    });
    // The Secret changes: the agent rewrites the volume (the label makes it look now).
    let changed = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                         "stringData": {"user": "root2", "pass": "two"}});
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&changed.to_string()));
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(&["label", "pod", "atomic", "touched=yes"], None);
    assert!(ok, "{err}");
    let seen = skiff_testkit::eventually_blocking("the new values in the volume", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "exec",
                "atomic",
                "--",
                "/bin/busybox",
                "sh",
                "-c",
                "cat /creds/user; echo; cat /creds/nested/pass",
            ],
            None,
        );
        out.starts_with("root2").then_some(out)
    });
    // Checked first: whatever the container managed, the agent wrote nothing into the node.
    assert_eq!(
        names(&target),
        BTreeSet::new(),
        "the agent wrote into the node directory; the attacks: {report}; the volume: {seen}"
    );
    assert_eq!(names(node_dir.path()), before, "{report}");
    assert_eq!(seen, "root2\ntwo", "the rewritten volume");
    for attack in ["write", "nested", "datadir", "data"] {
        assert!(
            report.lines().any(|l| l == format!("{attack}=no")),
            "{attack} succeeded in the secret volume:\n{report}"
        );
    }

    // 2. A subPath through a symlink another container planted: the app container's next
    // start is refused, and no run of it ever sees the node directory.
    let (waiting, log) = skiff_testkit::eventually_blocking("the subPath refused", T, || {
        let (_, out, _) = c.kubectl(
            &["get", "pod", "subpath", "-o",
              "jsonpath={.status.containerStatuses[?(@.name==\"app\")].state.waiting.reason}|{.status.containerStatuses[?(@.name==\"app\")].state.waiting.message}"],
            None,
        );
        let (_, log, _) = c.kubectl(&["logs", "subpath", "-c", "app"], None);
        (out.starts_with("CreateContainer") || log.contains("node-only")).then_some((out, log))
    });
    assert!(
        !log.contains("node-only"),
        "the container saw the node directory through its subPath: {log}"
    );
    assert!(
        waiting.starts_with("CreateContainerConfigError|")
            && waiting.contains("subPath")
            && waiting.contains("evil is a symbolic link"),
        "{waiting}"
    );
    // The other container did plant its symlink in the emptyDir on the node.
    let (_, uid, _) = c.kubectl(
        &["get", "pod", "subpath", "-o", "jsonpath={.metadata.uid}"],
        None,
    );
    let planted = c.nodes[0]
        .state_dir
        .path()
        .join("state/volumes")
        .join(&uid)
        .join("work/evil");
    assert_eq!(
        std::fs::read_link(&planted).ok().as_deref(),
        Some(node_dir.path()),
        "the plant container's symlink"
    );
    assert_eq!(names(node_dir.path()), before);
    assert_eq!(
        std::fs::read_to_string(node_dir.path().join("node-secret")).unwrap(),
        "node-only"
    );

    let (ok, _, err) = c.kubectl(
        &["delete", "pod", "atomic", "subpath", "--grace-period=1"],
        None,
    );
    assert!(ok, "{err}");
}
