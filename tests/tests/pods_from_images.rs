//! Pods from OCI images in a real registry (docker-registry on loopback): the agent pulls
//! the image (Pulling/Pulled events), mounts its layers as the container's own overlay root
//! filesystem, and runs the image's Entrypoint and Cmd with its Env and WorkingDir; the
//! container sees the image's files, not the node's. A tag that is not there waits with
//! ErrImagePull / ImagePullBackOff and says why. The Node lists the image in
//! `status.images`. Deleting the pods unmounts their roots.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use serde_json::json;
use skiff_testkit::registry::{Registry, gz_layer, gz_layer_bytes};
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(60);

fn overlay_mounts_under(dir: &std::path::Path) -> usize {
    skiff_runtime::mountinfo::read()
        .unwrap()
        .iter()
        .filter(|m| m.fstype == "overlay" && m.mount_point.starts_with(dir))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_from_registry_images() {
    let registry = Registry::start();
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static (cargo xtask setup)");
    let base = gz_layer_bytes(&[
        ("bin/", b""),
        ("proc/", b""),
        ("dev/", b""),
        ("tmp/", b""),
        ("etc/", b""),
        ("bin/busybox", &busybox),
    ]);
    let top = gz_layer(&[("etc/motd", "image-motd\n"), ("srv/", "")]);
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {
            "Entrypoint": ["/bin/busybox", "sh", "-c"],
            "Cmd": ["echo from-image in $(pwd) MODE=$MODE; cat /etc/motd; \
                     test -e /usr/bin/python3 || echo no-node-files; exec sleep 3600"],
            "Env": ["PATH=/bin", "MODE=image"],
            "WorkingDir": "/srv",
        },
        "rootfs": {"type": "layers", "diff_ids": [
            "sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "sha256:1111111111111111111111111111111111111111111111111111111111111111"]},
    });
    registry
        .push("demo/bb:v1", &[base, top], &config, None)
        .await;
    let image = format!("{}/demo/bb:v1", registry.host());

    let c = Cluster::start(1).await;
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: img}}\nspec:\n  containers:\n  - name: app\n    image: {image}\n    env: [{{name: MODE, value: pod}}]\n"
    );
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&pod));
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(
        &["wait", "--for=condition=Ready", "pod/img", "--timeout=60s"],
        None,
    );
    assert!(ok, "{err}\n{}", c.logs());
    let logs = skiff_testkit::eventually_blocking("the container's output", T, || {
        let (_, out, _) = c.kubectl(&["logs", "img"], None);
        (out.contains("image-motd") && out.contains("no-node-files")).then_some(out)
    });
    assert!(logs.contains("from-image in /srv MODE=pod"), "{logs}");
    let (_, events, _) = c.kubectl(
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=img",
            "-o",
            "jsonpath={.items[*].reason}",
        ],
        None,
    );
    assert!(
        events.contains("Pulling") && events.contains("Pulled"),
        "{events}"
    );
    // The node lists the image it pulled, by tag and by digest, with its size.
    let node = c.nodes[0].name.clone();
    let listed = skiff_testkit::eventually_blocking("the image in the node's status", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "get",
                "node",
                &node,
                "-o",
                "jsonpath={.status.images[*].names}|{.status.images[*].sizeBytes}",
            ],
            None,
        );
        out.contains(&image).then_some(out)
    });
    assert!(listed.contains("/demo/bb@sha256:"), "{listed}");
    let state = c.nodes[0].state_dir.path().join("state");
    assert_eq!(
        overlay_mounts_under(&state),
        1,
        "one root filesystem for the one container"
    );

    // Every run of a container gets a fresh writable layer: what a crashed run wrote is gone.
    let crashy = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: crashy}}\nspec:\n  containers:\n  - name: app\n    image: {image}\n    command: [/bin/busybox, sh, -c]\n    args: ['if [ -e /marker ]; then echo stale-layer; else echo fresh-layer; fi; touch /marker; sleep 1; exit 1']\n"
    );
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&crashy));
    assert!(ok, "{err}");
    skiff_testkit::eventually_blocking("a restart of the crashing container", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "get",
                "pod",
                "crashy",
                "-o",
                "jsonpath={.status.containerStatuses[0].restartCount}",
            ],
            None,
        );
        (out.trim().parse::<u32>().unwrap_or(0) >= 2).then_some(())
    });
    let (_, logs, _) = c.kubectl(&["logs", "crashy"], None);
    assert!(
        logs.contains("fresh-layer") && !logs.contains("stale-layer"),
        "{logs}"
    );
    assert_eq!(
        overlay_mounts_under(&c.nodes[0].state_dir.path().join("state")),
        2
    );

    // A tag the registry does not have.
    let missing = pod
        .replace("name: img", "name: nope")
        .replace(":v1", ":missing");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&missing));
    assert!(ok, "{err}");
    let waiting = skiff_testkit::eventually_blocking("the pull failure", T, || {
        let (_, out, _) = c.kubectl(&[
                "get",
                "pod",
                "nope",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}",
            ],
            None,
        );
        (out.starts_with("ErrImagePull|") || out.starts_with("ImagePullBackOff|")).then_some(out)
    });
    assert!(waiting.contains("not found in the registry"), "{waiting}");

    // Deleting the pods unmounts their root filesystems.
    let (ok, _, err) = c.kubectl(
        &["delete", "pod", "img", "nope", "crashy", "--grace-period=1"],
        None,
    );
    assert!(ok, "{err}");
    skiff_testkit::eventually_blocking("the root filesystem unmounted", T, || {
        (overlay_mounts_under(&state) == 0).then_some(())
    });
}

/// A private repository: without credentials, and with wrong ones in the node's config.json,
/// the pod waits with ErrImagePull/ImagePullBackOff saying the registry refused them (the
/// password in no status or event); with the right ones it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_images_pull_with_the_nodes_credentials() {
    use base64::Engine as _;
    let password = "pr1vate-pa55";
    let hash = bcrypt::hash(password, 4).unwrap();
    let registry = Registry::start_with(Some(&format!("ci:{hash}\n")));
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static (cargo xtask setup)");
    let layer = gz_layer_bytes(&[("bin/", b""), ("bin/busybox", &busybox)]);
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox", "sh", "-c", "echo private-image-ran; exec sleep 3600"]},
        "rootfs": {"type": "layers", "diff_ids": [
            "sha256:0000000000000000000000000000000000000000000000000000000000000000"]},
    });
    registry
        .push("team/secret:v1", &[layer], &config, Some(("ci", password)))
        .await;
    let image = format!("{}/team/secret:v1", registry.host());
    let c = Cluster::start(1).await;
    let config_json = c.nodes[0].state_dir.path().join("state/config.json");
    let write_config = |pass: &str| {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("ci:{pass}"));
        let body = json!({"auths": {registry.host(): {"auth": auth}}});
        std::fs::write(&config_json, body.to_string()).unwrap();
    };
    let waiting = |c: &Cluster| {
        let (_, out, _) = c.kubectl(&[
                "get",
                "pod",
                "private",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}",
            ],
            None,
        );
        out
    };
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: private}}\nspec:\n  containers:\n  - name: app\n    image: {image}\n"
    );
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&pod));
    assert!(ok, "{err}");
    let anonymous = skiff_testkit::eventually_blocking("the anonymous pull refused", T, || {
        let out = waiting(&c);
        out.contains("refused the credentials").then_some(out)
    });
    assert!(
        anonymous.starts_with("ErrImagePull|") || anonymous.starts_with("ImagePullBackOff|"),
        "{anonymous}"
    );
    write_config("not-the-password");
    std::thread::sleep(Duration::from_secs(3));
    let wrong = skiff_testkit::eventually_blocking("the wrong password refused", T, || {
        let out = waiting(&c);
        out.contains("refused the credentials").then_some(out)
    });
    assert!(!wrong.contains("not-the-password"), "{wrong}");
    write_config(password);
    let logs = skiff_testkit::eventually_blocking("the private image running", T, || {
        let (_, out, _) = c.kubectl(&["logs", "private"], None);
        out.contains("private-image-ran").then_some(out)
    });
    assert!(logs.contains("private-image-ran"));
    let (_, events, _) = c.kubectl(&["get", "events", "-o", "json"], None);
    assert!(events.contains("Pulled"), "{events}");
    assert!(
        !events.contains(password) && !events.contains("not-the-password"),
        "a password in an event: {events}"
    );
    let (_, pod_json, _) = c.kubectl(&["get", "pod", "private", "-o", "json"], None);
    assert!(!pod_json.contains(password), "{pod_json}");
}

/// Image garbage collection: an image no pod uses goes once it has been unused for the
/// maximum age (from the store, the node's status and `skiff images`); the image a running
/// pod uses stays, however old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_images_are_garbage_collected_used_ones_kept() {
    let registry = Registry::start();
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static (cargo xtask setup)");
    let base = gz_layer_bytes(&[("bin/", b""), ("bin/busybox", &busybox)]);
    for tag in ["keep", "drop"] {
        let top = gz_layer(&[(&format!("etc/{tag}"), tag)]);
        let config = json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": ["/bin/busybox", "sleep", "3600"]},
            "rootfs": {"type": "layers", "diff_ids": [
                "sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "sha256:1111111111111111111111111111111111111111111111111111111111111111"]},
        });
        registry
            .push(
                &format!("demo/gc:{tag}"),
                &[base.clone(), top],
                &config,
                None,
            )
            .await;
    }
    let c = Cluster::start_with(
        1,
        &["--image-maximum-gc-age", "3s", "--image-gc-period", "1s"],
    )
    .await;
    let pod = |name: &str, tag: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: {}/demo/gc:{tag}\n",
            registry.host()
        )
    };
    for (name, tag) in [("keeper", "keep"), ("dropper", "drop")] {
        let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&pod(name, tag)));
        assert!(ok, "{err}");
    }
    let (ok, _, err) = c.kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/keeper",
            "pod/dropper",
            "--timeout=60s",
        ],
        None,
    );
    assert!(ok, "{err}");
    let images = || c.skiff(&["images"]);
    // The node publishes its images in its status after the pulls, which may be after the
    // pods are Ready.
    skiff_testkit::eventually_blocking("both images listed", T, || {
        let listed = images();
        (listed.contains("demo/gc") && listed.contains("keep") && listed.contains("drop"))
            .then_some(())
    });
    let (ok, _, err) = c.kubectl(&["delete", "pod", "dropper"], None);
    assert!(ok, "{err}");
    let store = c.nodes[0].state_dir.path().join("state/images/images.json");
    let node = c.nodes[0].name.clone();
    skiff_testkit::eventually_blocking("the unused image collected", T, || {
        let (_, names, _) = c.kubectl(
            &[
                "get",
                "node",
                &node,
                "-o",
                "jsonpath={.status.images[*].names}",
            ],
            None,
        );
        let index = std::fs::read_to_string(&store).unwrap_or_default();
        (!names.contains(":drop") && names.contains(":keep") && !index.contains(":drop"))
            .then_some(())
    });
    // Well past the maximum age, the used image is still there, and `skiff images` says who
    // uses it.
    std::thread::sleep(Duration::from_secs(4));
    let listed = images();
    let row = listed
        .lines()
        .find(|l| l.contains("demo/gc") && l.contains(" keep "))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(row.ends_with("yes (1 pods)"), "{listed}");
    assert!(!listed.contains(" drop "), "{listed}");
    let agent_log = c.nodes[0].agent_log();
    assert!(agent_log.contains("image garbage-collected"), "{agent_log}");
}

/// imagePullSecrets: a Secret made by `kubectl create secret docker-registry` (sent as
/// protobuf) lets a pod pull from a private repository; a pod naming a Secret that does not
/// exist gets a FailedToRetrieveImagePullSecret event and waits with the registry's refusal.
/// The password is in no event, pod, log or `kubectl get` table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_images_pull_with_image_pull_secrets() {
    let password = "pu11-s3cret";
    let hash = bcrypt::hash(password, 4).unwrap();
    let registry = Registry::start_with(Some(&format!("ci:{hash}\n")));
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static (cargo xtask setup)");
    let layer = gz_layer_bytes(&[("bin/", b""), ("bin/busybox", &busybox)]);
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox", "sh", "-c", "echo pulled-with-secret; exec sleep 3600"]},
    });
    registry
        .push("team/app:v1", &[layer], &config, Some(("ci", password)))
        .await;
    let image = format!("{}/team/app:v1", registry.host());
    let c = Cluster::start(1).await;
    let (ok, out, err) = c.kubectl(
        &[
            "create",
            "secret",
            "docker-registry",
            "regcred",
            &format!("--docker-server={}", registry.host()),
            "--docker-username=ci",
            &format!("--docker-password={password}"),
        ],
        None,
    );
    assert!(ok, "{err}");
    assert!(out.contains("secret/regcred created"), "{out}");
    let (_, table, _) = c.kubectl(&["get", "secret", "regcred"], None);
    assert!(
        table.contains("kubernetes.io/dockerconfigjson") && !table.contains(password),
        "{table}"
    );
    // `Always`: a pod must not run the image another pod's credentials pulled onto the node
    // (with IfNotPresent it would, in Kubernetes too).
    let pod = |name: &str, secret: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"imagePullSecrets": [{"name": secret}],
                        "containers": [{"name": "app", "image": image,
                                        "imagePullPolicy": "Always"}]}})
        .to_string()
    };
    let docs = [pod("with-secret", "regcred"), pod("missing-secret", "nope")].join("\n");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&docs));
    assert!(ok, "{err}");
    let logs = skiff_testkit::eventually_blocking("the pod pulled with the secret", T, || {
        let (_, out, _) = c.kubectl(&["logs", "with-secret"], None);
        out.contains("pulled-with-secret").then_some(out)
    });
    assert!(logs.contains("pulled-with-secret"));
    let warning = skiff_testkit::eventually_blocking("the missing secret reported", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=missing-secret,reason=FailedToRetrieveImagePullSecret",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            None,
        );
        (!out.is_empty()).then_some(out)
    });
    assert!(
        warning.contains("Unable to retrieve some image pull secrets (nope)"),
        "{warning}"
    );
    skiff_testkit::eventually_blocking("the registry's refusal", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "get",
                "pod",
                "missing-secret",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.waiting.message}",
            ],
            None,
        );
        out.contains("refused the credentials").then_some(())
    });
    let (_, events, _) = c.kubectl(&["get", "events", "-o", "json"], None);
    let (_, pods, _) = c.kubectl(&["get", "pods", "-o", "json"], None);
    let agent = c.nodes[0].agent_log();
    for (what, text) in [("events", &events), ("pods", &pods), ("agent log", &agent)] {
        assert!(!text.contains(password), "the password in the {what}");
    }
}
