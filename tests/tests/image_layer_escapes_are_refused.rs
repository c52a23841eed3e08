//! Image layers that try to leave their directory, through the whole path (a real registry,
//! the agent, the API): a layer holding the whiteout `.wh...` (a whiteout of `..`, which once
//! removed the node's whole layer store), one climbing out with a `../` path and one writing
//! through a `..` symlink it planted are refused. Each pod waits with ErrImagePull and a Failed
//! event naming the refusal; the node's image store keeps every layer and image it held
//! (a pod of another image keeps running, and a new pod of it starts), records nothing of the
//! bad images, keeps no temporary, and nothing outside the store is written.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use skiff_testkit::registry::{Registry, gz_layer_bytes, hostile_gz_layer};
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(60);

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn pod(name: &str, image: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "app", "image": image}]}})
    .to_string()
}

fn phase(c: &Cluster, name: &str) -> String {
    c.kubectl(
        &["get", "pod", name, "-o", "jsonpath={.status.phase}"],
        None,
    )
    .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_layers_are_refused_and_the_store_survives() {
    let registry = Registry::start();
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static (cargo xtask setup)");
    let base = gz_layer_bytes(&[("bin/", b""), ("bin/busybox", &busybox)]);
    let config = json!({"architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox", "sleep", "3600"]}});
    let tag = skiff_testkit::unique();
    registry
        .push("good/app:1", std::slice::from_ref(&base), &config, None)
        .await;
    // A planted file next to the store would be the climb's and the symlink's target.
    let escape = format!("skiff-layer-escape-{tag}");
    let images = [
        (
            "whiteout-dotdot",
            hostile_gz_layer(&[("data", None), (".wh...", None)]),
            "whiteout \".wh...\"",
        ),
        (
            "climb",
            hostile_gz_layer(&[(&format!("../{escape}"), None)]),
            "'..' would leave the layer",
        ),
        (
            "symlink",
            hostile_gz_layer(&[("up", Some("..")), (&format!("up/{escape}"), None)]),
            "a parent directory is a symlink",
        ),
    ];
    for (name, layer, _) in &images {
        registry
            .push(
                &format!("bad/{name}:1"),
                &[base.clone(), layer.clone()],
                &config,
                None,
            )
            .await;
    }

    let c = Cluster::start(1).await;
    let host = registry.host();
    let good = format!("{host}/good/app:1");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&pod("good", &good)));
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(
        &["wait", "--for=condition=Ready", "pod/good", "--timeout=60s"],
        None,
    );
    assert!(ok, "{err}\n{}", c.logs());
    let store = c.nodes[0].state_dir.path().join("state/images");
    let layers_dir = store.join("layers/sha256");
    let layers_before = names(&layers_dir);
    assert!(
        !layers_before.is_empty(),
        "the good image's layer is unpacked"
    );
    let busybox_in = |layers: &BTreeSet<String>| {
        layers
            .iter()
            .filter(|l| layers_dir.join(l).join("bin/busybox").is_file())
            .count()
    };
    assert_eq!(busybox_in(&layers_before), 1);

    let docs: Vec<String> = images
        .iter()
        .map(|(name, _, _)| pod(name, &format!("{host}/bad/{name}:1")))
        .collect();
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&docs.join("\n")));
    assert!(ok, "{err}");
    for (name, _, says) in &images {
        skiff_testkit::eventually_blocking(&format!("{name} waiting"), T, || {
            let (_, out, _) = c.kubectl(
                &[
                    "get",
                    "pod",
                    name,
                    "-o",
                    "jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}",
                ],
                None,
            );
            let ok = out.starts_with("ErrImagePull|") || out.starts_with("ImagePullBackOff|");
            if ok && out.contains(says) {
                Ok(out)
            } else {
                Err(format!("waiting: {out:?}"))
            }
        });
        skiff_testkit::eventually_blocking(&format!("{name}: a Failed event"), T, || {
            let (_, events, _) = c.kubectl(
                &[
                    "get",
                    "events",
                    "--field-selector",
                    &format!("involvedObject.name={name},reason=Failed"),
                    "-o",
                    "jsonpath={.items[*].message}",
                ],
                None,
            );
            if events.contains(says) {
                Ok(())
            } else {
                Err(format!("events: {events:?}"))
            }
        });
        assert_eq!(phase(&c, name), "Pending", "{name} never starts");
    }

    // The store keeps what it had: every layer (the base layer the bad images share too),
    // the good image's record; nothing of the bad images, no temporaries.
    let layers_after = names(&layers_dir);
    assert!(
        layers_after.is_superset(&layers_before),
        "layers gone: before {layers_before:?}, after {layers_after:?}"
    );
    assert_eq!(busybox_in(&layers_after), 1, "{layers_after:?}");
    let index = std::fs::read_to_string(store.join("images.json")).unwrap_or_default();
    assert!(index.contains("good/app"), "{index}");
    assert!(!index.contains("bad/"), "{index}");
    for dir in ["blobs/sha256", "layers/sha256"] {
        let temporaries: Vec<String> = names(&store.join(dir))
            .into_iter()
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(temporaries.is_empty(), "{dir}: {temporaries:?}");
    }
    // Nothing planted beside the layers, the store or the node's state.
    for dir in [
        layers_dir.clone(),
        store.join("layers"),
        store.clone(),
        store.join(".."),
    ] {
        assert!(
            !dir.join(&escape).exists(),
            "{} was written",
            dir.join(&escape).display()
        );
    }
    // The good image's pod runs on, and a new pod of it starts from the store.
    assert_eq!(phase(&c, "good"), "Running");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&pod("good-again", &good)));
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/good-again",
            "--timeout=60s",
        ],
        None,
    );
    assert!(ok, "{err}\n{}", c.logs());
    assert_eq!(names(&layers_dir), layers_after);
}
