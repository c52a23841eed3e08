//! ReplicationControllers, the core/v1 kind older manifests and client examples still use,
//! driven by kubectl 1.32 on the laptop: the Kubernetes documentation's `nginx`
//! ReplicationController (its image taken from the test's registry, with a command, since
//! the registry holds busybox) converges to three ready pods it owns; kubectl shows its
//! columns and finds it in `get all`; `kubectl scale` goes through the scale subresource;
//! invalid controllers are refused with Kubernetes' messages; an orphaning delete leaves the
//! pods, which a new controller adopts; a cascading delete removes them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use skiff_api::api::Pod;
use skiff_client::ListParams;
use skiff_testkit::registry::Registry;
use skiff_tests::cluster::Cluster;
use skiff_tests::eventually_within;

const T: Duration = Duration::from_secs(90);

/// kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller/ (replication.yaml).
const DOCS_RC: &str = r#"apiVersion: v1
kind: ReplicationController
metadata:
  name: nginx
spec:
  replicas: 3
  selector:
    app: nginx
  template:
    metadata:
      name: nginx
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: nginx
        ports:
        - containerPort: 80
"#;

async fn pods_of(c: &Cluster, owner_uid: Option<&str>) -> Vec<Pod> {
    let pods = c
        .client
        .namespaced::<Pod>("default")
        .list(&ListParams::default().labels("app=nginx"))
        .await
        .expect("listing pods");
    pods.items
        .into_iter()
        .filter(|p| {
            p.metadata
                .as_ref()
                .is_some_and(|m| m.deletion_timestamp.is_empty())
        })
        .filter(|p| match owner_uid {
            None => true,
            Some(uid) => p
                .metadata
                .as_ref()
                .is_some_and(|m| m.owner_references.iter().any(|o| o.uid == uid)),
        })
        .collect()
}

fn kubectl(c: &Cluster, args: &[&str]) -> String {
    skiff_tests::ok(&c.laptop_kubectl(args))
}

async fn wait_ready(c: &Cluster, want: &str) {
    eventually_within(&format!("{want} ready replicas"), T, || async {
        let out = c.laptop_kubectl(&[
            "get",
            "rc",
            "nginx",
            "-o",
            "jsonpath={.status.replicas}/{.status.readyReplicas}",
        ]);
        let got = String::from_utf8_lossy(&out.stdout).into_owned();
        (got == format!("{want}/{want}"))
            .then_some(())
            .ok_or_else(|| {
                let pods = c.laptop_kubectl(&["get", "pods", "-o", "wide"]);
                let events = c.laptop_kubectl(&["get", "events"]);
                format!(
                    "{got}\n{}\n{}",
                    String::from_utf8_lossy(&pods.stdout),
                    String::from_utf8_lossy(&events.stdout)
                )
            })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_controllers_from_the_documentation_converge() {
    let registry = Registry::start();
    let image = registry.push_busybox("library/nginx:1").await;
    let c = Cluster::start(1).await;
    let manifest = DOCS_RC.replace(
        "        image: nginx\n",
        &format!(
            "        image: {image}\n        command: [\"/bin/busybox\", \"sleep\", \"3600\"]\n"
        ),
    );
    let out = skiff_tests::run_with_stdin(c.laptop_kubectl_cmd(&["apply", "-f", "-"]), &manifest);
    let applied = skiff_tests::ok(&out);
    assert!(
        applied.contains("replicationcontroller/nginx created"),
        "{applied}"
    );
    wait_ready(&c, "3").await;
    let uid = kubectl(
        &c,
        &["get", "rc", "nginx", "-o", "jsonpath={.metadata.uid}"],
    );
    let owned = pods_of(&c, Some(&uid)).await;
    assert_eq!(owned.len(), 3, "{owned:?}");
    for p in &owned {
        let m = p.metadata.as_ref().unwrap();
        assert!(m.name.starts_with("nginx-"), "{}", m.name);
        let owner = &m.owner_references[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("ReplicationController", Some(true))
        );
    }
    // Defaults as Kubernetes sets them: the controller's labels are the template's.
    let labels = kubectl(
        &c,
        &[
            "get",
            "rc",
            "nginx",
            "-o",
            "jsonpath={.metadata.labels.app}",
        ],
    );
    assert_eq!(labels, "nginx");

    let table = kubectl(&c, &["get", "rc", "-o", "wide"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "DESIRED",
            "CURRENT",
            "READY",
            "AGE",
            "CONTAINERS",
            "IMAGES",
            "SELECTOR"
        ],
        "{table}"
    );
    assert!(table.contains("app=nginx"), "{table}");
    let all = kubectl(&c, &["get", "all"]);
    assert!(all.contains("replicationcontroller/nginx"), "{all}");

    // kubectl scale goes through the scale subresource.
    let scaled = kubectl(&c, &["scale", "rc", "nginx", "--replicas=1"]);
    assert!(
        scaled.contains("replicationcontroller/nginx scaled"),
        "{scaled}"
    );
    wait_ready(&c, "1").await;
    eventually_within("two pods deleted", T, || async {
        let n = pods_of(&c, Some(&uid)).await.len();
        (n == 1).then_some(()).ok_or(n)
    })
    .await;

    // Invalid controllers are refused with Kubernetes' messages.
    let bad = "apiVersion: v1\nkind: ReplicationController\nmetadata: {name: bad}\nspec:\n  \
               replicas: -1\n  selector: {app: one}\n  template:\n    metadata: {labels: {app: \
               two}}\n    spec:\n      containers: [{name: c, image: x}]\n";
    let out = skiff_tests::run_with_stdin(c.laptop_kubectl_cmd(&["apply", "-f", "-"]), bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    for want in [
        "The ReplicationController \"bad\" is invalid",
        "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
        "spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"two\"}: `selector` does not match template `labels`",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }

    // An orphaning delete leaves the pod; a new controller with the same selector adopts it.
    kubectl(
        &c,
        &["delete", "rc", "nginx", "--cascade=orphan", "--timeout=60s"],
    );
    eventually_within("the pod orphaned", T, || async {
        let pods = pods_of(&c, None).await;
        let orphans = pods
            .iter()
            .filter(|p| p.metadata.as_ref().unwrap().owner_references.is_empty())
            .count();
        (pods.len() == 1 && orphans == 1)
            .then_some(())
            .ok_or(format!("{orphans} orphans of {}", pods.len()))
    })
    .await;
    let one = manifest.replace("replicas: 3", "replicas: 1");
    skiff_tests::ok(&skiff_tests::run_with_stdin(
        c.laptop_kubectl_cmd(&["apply", "-f", "-"]),
        &one,
    ));
    let uid = kubectl(
        &c,
        &["get", "rc", "nginx", "-o", "jsonpath={.metadata.uid}"],
    );
    eventually_within("the orphan adopted, nothing new made", T, || async {
        let owned = pods_of(&c, Some(&uid)).await.len();
        let all = pods_of(&c, None).await.len();
        (owned == 1 && all == 1)
            .then_some(())
            .ok_or(format!("{owned} owned of {all}"))
    })
    .await;

    // A cascading delete removes the pods with their controller.
    kubectl(&c, &["delete", "rc", "nginx", "--timeout=60s"]);
    eventually_within("the pods deleted with the controller", T, || async {
        let n = pods_of(&c, None).await.len();
        (n == 0).then_some(()).ok_or(n)
    })
    .await;
}
