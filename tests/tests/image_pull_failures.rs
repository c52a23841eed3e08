//! Bad images and bad references, through the whole path (a real registry, the agent, the
//! API): a layer climbing out with `../`, a layer writing through an absolute symlink, a
//! truncated layer, a blob the registry serves corrupted, an unreachable registry and an
//! invalid name each leave the pod waiting with Kubernetes' reason and a Failed event that
//! says why, record nothing in the node's image store, leave no temporary files in it, and
//! never touch a file outside it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use serde_json::json;
use skiff_testkit::registry::{Registry, gz_layer, gz_layer_bytes, hostile_gz_layer, sha256_hex};
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_images_wait_with_the_reason_and_write_nothing() {
    let registry = Registry::start();
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static (cargo xtask setup)");
    let base = gz_layer_bytes(&[("bin/", b""), ("bin/busybox", &busybox)]);
    let config = json!({"architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox", "sleep", "3600"]}});
    let tag = skiff_testkit::unique();
    let escape = std::env::temp_dir().join(format!("skiff-escape-{tag}"));
    let planted_dir = tempfile::tempdir().unwrap();
    let planted = planted_dir.path().join("planted");
    let climb = format!("../../../../../../../..{}", escape.display());
    let images = [
        ("climb", hostile_gz_layer(&[(&climb, None)])),
        (
            "symlink",
            hostile_gz_layer(&[
                ("evil", Some(planted_dir.path().to_str().unwrap())),
                ("evil/planted", None),
            ]),
        ),
        ("truncated", {
            let whole = gz_layer(&[("data/", ""), ("data/file", &"x".repeat(100_000))]);
            whole[..whole.len() / 2].to_vec()
        }),
        (
            "corrupt",
            gz_layer(&[("data/", ""), ("data/file", "intact")]),
        ),
    ];
    for (name, layer) in &images {
        registry
            .push(
                &format!("bad/{name}:1"),
                &[base.clone(), layer.clone()],
                &config,
                None,
            )
            .await;
    }
    // The registry's stored copy of the corrupt image's layer changes under its digest.
    let corrupt = &images[3].1;
    let stored = registry.blob_path(&sha256_hex(corrupt));
    let mut bytes = std::fs::read(&stored).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0xff;
    std::fs::write(&stored, bytes).unwrap();

    let c = Cluster::start(1).await;
    let host = registry.host();
    let cases = [
        (
            "climb",
            format!("{host}/bad/climb:1"),
            "ErrImagePull",
            "'..' would leave the layer",
        ),
        (
            "symlink",
            format!("{host}/bad/symlink:1"),
            "ErrImagePull",
            "symlink",
        ),
        (
            "truncated",
            format!("{host}/bad/truncated:1"),
            "ErrImagePull",
            "truncated or corrupt",
        ),
        (
            "corrupt",
            format!("{host}/bad/corrupt:1"),
            "ErrImagePull",
            "digest",
        ),
        (
            "unreachable",
            "127.0.0.1:1/bad/none:1".to_string(),
            "ErrImagePull",
            "cannot be reached",
        ),
        (
            "badname",
            format!("{host}/Bad/Name:1"),
            "InvalidImageName",
            "invalid image name",
        ),
    ];
    let docs: Vec<String> = cases
        .iter()
        .map(|(name, image, _, _)| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                   "spec": {"terminationGracePeriodSeconds": 1,
                            "containers": [{"name": "app", "image": image}]}})
            .to_string()
        })
        .collect();
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&docs.join("\n")));
    assert!(ok, "{err}");
    for (name, _, reason, says) in &cases {
        let waiting = skiff_testkit::eventually_blocking(&format!("{name} waiting"), T, || {
            let (_, out, _) = c.kubectl(&[
                    "get",
                    "pod",
                    name,
                    "-o",
                    "jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}",
                ],
                None,
            );
            let ok = out.starts_with(&format!("{reason}|"))
                || (*reason == "ErrImagePull" && out.starts_with("ImagePullBackOff|"));
            (ok && out.contains(says)).then_some(out)
        });
        assert!(!waiting.is_empty());
        // The event is published as the status is written; either may be seen first.
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
    }
    // Nothing outside the stores, nothing recorded, nothing half-written.
    assert!(!escape.exists(), "{} was written", escape.display());
    assert!(!planted.exists(), "{} was written", planted.display());
    let store = c.nodes[0].state_dir.path().join("state/images");
    let index = std::fs::read_to_string(store.join("images.json")).unwrap_or_default();
    assert!(!index.contains("bad/"), "{index}");
    for dir in ["blobs/sha256", "layers/sha256"] {
        let temporaries: Vec<String> = std::fs::read_dir(store.join(dir))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        assert!(temporaries.is_empty(), "{dir}: {temporaries:?}");
    }
}
