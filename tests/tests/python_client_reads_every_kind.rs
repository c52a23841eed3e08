//! The official Kubernetes Python client (`kubernetes` from PyPI, pinned in
//! `tests/python/requirements.txt`, client-side validation on as by default) reads every
//! object kind Skiff serves back into its models, writes the models back and reads them
//! again (`tests/python/read_every_kind.py`), and watches pods: a cluster with one node holds
//! an object of every kind (`skiff_tests::every_kind`, running pods with real container
//! statuses, a bound volume, the node's own serving-certificate request, a custom kind), and
//! the script, run as a user bound to `cluster-admin`, goes through what the API's discovery
//! lists. A served kind without an object, a field a model refuses (a required field left
//! null), drops or changes, and a kind discovery leaves out all fail the test, naming the
//! kind.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::BTreeSet;

use skiff_tests::cluster::Cluster;
use skiff_tests::every_kind::{CLUSTER_SCOPED, NAMESPACED, WIDGET};
use skiff_tests::python;

/// The namespace of the namespaced objects (its Event names it).
const NS: &str = "everything";

fn kubectl(c: &Cluster, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, out, err) = c.kubectl(args, stdin);
    assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}\n{}", c.logs());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_reads_every_kind_back_into_its_models() {
    // Before anything starts: a missing venv is one clear failure naming the fix.
    python::interpreter();
    let c = Cluster::start(1).await;

    kubectl(&c, &["create", "namespace", NS], None);
    kubectl(&c, &["apply", "-n", NS, "-f", "-"], Some(NAMESPACED));
    kubectl(&c, &["apply", "-f", "-"], Some(CLUSTER_SCOPED));
    kubectl(
        &c,
        &[
            "wait",
            "--for=condition=Established",
            "crd/widgets.every.skiff.io",
            "--timeout=60s",
        ],
        None,
    );
    kubectl(&c, &["apply", "-n", NS, "-f", "-"], Some(WIDGET));
    // Running pods carry container statuses (image, imageID, state) for the models to read.
    kubectl(
        &c,
        &[
            "wait",
            "-n",
            NS,
            "--for=condition=Ready",
            "pod/p",
            "--timeout=90s",
        ],
        None,
    );

    // A user of its own, with the rights of the role Kubernetes gives administrators.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = c.server.user_kubeconfig(dir.path(), "python-client", &[]);
    kubectl(
        &c,
        &[
            "create",
            "clusterrolebinding",
            "every-python-client",
            "--clusterrole=cluster-admin",
            "--user=python-client",
        ],
        None,
    );

    let started = std::time::Instant::now();
    let out = python::run(&kubeconfig, "read_every_kind.py", &[NS]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the Python client failed on some kinds ({:?}):\n{stdout}\n{stderr}\n{}",
        started.elapsed(),
        c.logs()
    );

    // Every kind Skiff serves was checked: discovery may not leave one out.
    let checked: BTreeSet<String> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("KINDS "))
        .map(|json| serde_json::from_str(json).expect("the KINDS line"))
        .expect("the script lists the kinds it checked");
    let mut served: BTreeSet<String> = skiff_api::kinds()
        .iter()
        .map(|k| k.info())
        .map(|i| format!("{}/{}", i.api_version, i.kind))
        .collect();
    served.insert("every.skiff.io/v1/Widget".into());
    let missing: Vec<_> = served.difference(&checked).collect();
    assert!(
        missing.is_empty(),
        "kinds Skiff serves that the client never read: {missing:?}\n{stdout}"
    );
}
