//! Workloads from registry images, as users run them: a Deployment of a busybox-based image
//! (two layers: the top one deletes a file with a whiteout and replaces a directory with an
//! opaque one; pushed as a two-platform index) serves HTTP through a ClusterIP Service from
//! pods on two nodes; its root filesystem is exactly the merged layers; a rollout to a new
//! tag serves the new content; a digest reference runs exactly that digest, shown in the
//! containers' `imageID`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use serde_json::json;
use skiff_testkit::registry::{Registry, gz_layer, gz_layer_bytes};
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(90);

fn config(arch: &str, layers: usize) -> serde_json::Value {
    json!({
        "architecture": arch, "os": "linux",
        "config": {
            "Entrypoint": ["/bin/busybox", "sh", "-c"],
            "Cmd": ["hostname > /www/host; exec /bin/busybox httpd -f -p 8080 -h /www"],
            "Env": ["PATH=/bin"],
        },
        "rootfs": {"type": "layers", "diff_ids": vec![
            "sha256:0000000000000000000000000000000000000000000000000000000000000000"; layers]},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_of_an_image_serves_rolls_out_and_pins_digests() {
    let registry = Registry::start();
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static (cargo xtask setup)");
    let base = gz_layer_bytes(&[
        ("bin/", b""),
        ("bin/busybox", &busybox),
        ("www/", b""),
        ("www/index.html", b"v1\n"),
        ("www/old.txt", b"deleted by the next layer\n"),
        ("conf/", b""),
        ("conf/a", b"replaced by the opaque directory\n"),
    ]);
    let top = gz_layer(&[
        ("www/.wh.old.txt", ""),
        ("conf/", ""),
        ("conf/.wh..wh..opq", ""),
        ("conf/b", "from the top layer\n"),
    ]);
    // linux/amd64 and a linux/arm64 decoy behind one index tag.
    let (amd64, amd64_size) = registry
        .push(
            "demo/web:v1-amd64",
            &[base.clone(), top.clone()],
            &config("amd64", 2),
            None,
        )
        .await;
    let decoy = gz_layer(&[("www/", ""), ("www/index.html", "wrong platform\n")]);
    let (arm64, arm64_size) = registry
        .push(
            "demo/web:v1-arm64",
            &[base.clone(), decoy],
            &config("arm64", 2),
            None,
        )
        .await;
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": arm64,
             "size": arm64_size, "platform": {"architecture": "arm64", "os": "linux"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": amd64,
             "size": amd64_size, "platform": {"architecture": "amd64", "os": "linux"}},
        ],
    });
    registry
        .push_manifest(
            "demo/web:v1",
            "application/vnd.oci.image.index.v1+json",
            index.to_string().as_bytes(),
        )
        .await;
    let v2 = gz_layer(&[("www/index.html", "v2\n")]);
    registry
        .push("demo/web:v2", &[base, top, v2], &config("amd64", 3), None)
        .await;
    let repo = format!("{}/demo/web", registry.host());

    let c = Cluster::start(2).await;
    let manifests = json!([
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
         "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
           // One pod per node (two nodes): a rollout replaces one at a time, no surge.
           "strategy": {"rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
           "template": {"metadata": {"labels": {"app": "web"}},
             "spec": {"terminationGracePeriodSeconds": 1,
               "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                   {"labelSelector": {"matchLabels": {"app": "web"}},
                    "topologyKey": "kubernetes.io/hostname"}]}},
               "containers": [{"name": "web", "image": format!("{repo}:v1"),
                               "ports": [{"containerPort": 8080}]}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}},
    ]);
    let docs: Vec<String> = manifests
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.to_string())
        .collect();
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&docs.join("\n")));
    assert!(ok, "{err}");
    let rollout = |c: &Cluster| {
        let (ok, out, err) = c.kubectl(&["rollout", "status", "deploy/web", "--timeout=90s"], None);
        assert!(ok, "{out}{err}\n{}", c.logs());
    };
    rollout(&c);
    let (_, cluster_ip, _) = c.kubectl(
        &["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"],
        None,
    );
    let pods = |c: &Cluster| {
        let (_, out, _) = c.kubectl(&[
                "get",
                "pods",
                "-l",
                "app=web",
                "--field-selector=status.phase=Running",
                "-o",
                // A terminating pod has a fourth field and is left out.
                "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.containerStatuses[0].imageID} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
            ],
            None,
        );
        out.lines()
            .map(|l| {
                l.split_whitespace()
                    .map(String::from)
                    .collect::<Vec<String>>()
            })
            .filter(|f| f.len() == 3)
            .collect::<Vec<_>>()
    };
    let running = pods(&c);
    assert_eq!(running.len(), 2, "{running:?}");
    assert_ne!(
        running[0][1], running[1][1],
        "one pod per node: {running:?}"
    );
    // The linux/amd64 manifest of the index runs.
    for p in &running {
        assert_eq!(p[2], format!("{repo}@{amd64}"), "{running:?}");
    }
    let exec = |c: &Cluster, pod: &str, script: &str| {
        let (ok, out, err) = c.kubectl(
            &["exec", pod, "--", "/bin/busybox", "sh", "-c", script],
            None,
        );
        assert!(ok, "{script}: {err}");
        out
    };
    // Exactly the merged layers: the whiteout removed old.txt, the opaque directory hid a.
    let listing = exec(&c, &running[0][0], "ls /www; echo --; ls /conf");
    assert_eq!(listing, "host\nindex.html\n--\nb\n", "{listing}");
    // Through the ClusterIP, from a pod on one node, both pods (one on each node) answer.
    let hosts = exec(
        &c,
        &running[0][0],
        &format!("for i in $(seq 1 24); do wget -qO- http://{cluster_ip}/host; done"),
    );
    for p in &running {
        assert!(hosts.contains(&p[0]), "{} never answered: {hosts}", p[0]);
    }
    assert_eq!(
        exec(
            &c,
            &running[1][0],
            &format!("wget -qO- http://{cluster_ip}/index.html")
        ),
        "v1\n"
    );

    // A rollout to a new tag.
    let (ok, _, err) = c.kubectl(
        &["set", "image", "deploy/web", &format!("web={repo}:v2")],
        None,
    );
    assert!(ok, "{err}");
    rollout(&c);
    let served = skiff_testkit::eventually_blocking("v2 served by every pod", T, || {
        let now = pods(&c);
        (now.len() == 2 && now.iter().all(|p| !p[2].ends_with(&amd64))).then_some(now)
    });
    for p in &served {
        assert_eq!(exec(&c, &p[0], "cat /www/index.html"), "v2\n");
    }
    let out = exec(
        &c,
        &served[0][0],
        &format!("for i in 1 2 3 4 5 6; do wget -qO- http://{cluster_ip}/index.html; done"),
    );
    assert_eq!(out, "v2\n".repeat(6));

    // A digest reference runs exactly that digest.
    let (ok, _, err) = c.kubectl(
        &["set", "image", "deploy/web", &format!("web={repo}@{amd64}")],
        None,
    );
    assert!(ok, "{err}");
    rollout(&c);
    let pinned = skiff_testkit::eventually_blocking("the digest running everywhere", T, || {
        let now = pods(&c);
        (now.len() == 2 && now.iter().all(|p| p[2] == format!("{repo}@{amd64}"))).then_some(now)
    });
    assert_eq!(exec(&c, &pinned[0][0], "cat /www/index.html"), "v1\n");
}
