//! ConfigMaps reach pods as Kubernetes delivers them, driven by real kubectl on a real
//! cluster (a busybox image pushed to a registry on loopback): `kubectl create configmap`
//! (`--from-literal`, and a binary `--from-file` that kubectl puts in `binaryData`), shown
//! as kubectl shows it; `configMapKeyRef` and `envFrom.configMapRef` variables; a configMap
//! volume (all keys, `items` with modes, binary content, `optional`) whose files follow a
//! change of the ConfigMap; a missing key or ConfigMap named the kubelet's way; bad
//! ConfigMaps refused with the field named; an immutable one stays as it is.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use serde_json::json;
use skiff_testkit::registry::Registry;
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_maps_reach_pods_as_variables_and_files() {
    let registry = Registry::start();
    let image = registry.push_busybox("demo/cm:v1").await;
    let c = Cluster::start(1).await;

    // kubectl makes them: text keys in data, bytes that are not UTF-8 in binaryData.
    let dir = tempfile::tempdir().unwrap();
    let blob = dir.path().join("blob");
    std::fs::write(&blob, [0xff_u8, 0x00, 0xfe, 0x01]).unwrap();
    let (ok, _, err) = c.kubectl(
        &[
            "create",
            "configmap",
            "app",
            "--from-literal=greeting=hello",
            "--from-literal=color=blue",
        ],
        None,
    );
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(
        &[
            "create",
            "configmap",
            "bin",
            &format!("--from-file=blob={}", blob.display()),
        ],
        None,
    );
    assert!(ok, "{err}");
    let (ok, out, err) = c.kubectl(
        &[
            "get",
            "configmap",
            "bin",
            "-o",
            "jsonpath={.binaryData.blob}",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(out, "/wD+AQ==");
    let (ok, table, err) = c.kubectl(&["get", "cm"], None);
    assert!(ok, "{err}");
    let row = table
        .lines()
        .find(|l| l.starts_with("app "))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[..2], ["app", "2"], "{table}");

    let pods = json!([
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reader"},
         "spec": {
            "volumes": [
                {"name": "all", "configMap": {"name": "app"}},
                {"name": "some", "configMap": {"name": "app", "defaultMode": 256,
                    "items": [{"key": "greeting", "path": "nested/hi", "mode": 288}]}},
                {"name": "bin", "configMap": {"name": "bin"}},
                {"name": "maybe", "configMap": {"name": "absent", "optional": true}}],
            "containers": [{"name": "app", "image": image, "args": ["exec sleep 3600"],
                "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "app"}}],
                "env": [
                    {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "greeting"}}},
                    {"name": "MAYBE", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": true}}}],
                "volumeMounts": [{"name": "all", "mountPath": "/cfg", "readOnly": true},
                                 {"name": "some", "mountPath": "/some"},
                                 {"name": "bin", "mountPath": "/bin-cfg"},
                                 {"name": "maybe", "mountPath": "/maybe"}]}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nokey"},
         "spec": {"containers": [{"name": "app", "image": image, "args": ["exec sleep 3600"],
             "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "nope"}}}]}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nocm"},
         "spec": {"volumes": [{"name": "cfg", "configMap": {"name": "missing"}}],
          "containers": [{"name": "app", "image": image, "args": ["exec sleep 3600"],
             "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}]}},
    ]);
    let docs: Vec<String> = pods
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.to_string())
        .collect();
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&docs.join("\n")));
    assert!(ok, "{err}");
    skiff_testkit::eventually_blocking("reader running", T, || {
        let (_, out, _) = c.kubectl(
            &["get", "pod", "reader", "-o", "jsonpath={.status.phase}"],
            None,
        );
        (out == "Running").then_some(())
    });

    // Variables: one key, and every key with a prefix; an optional missing one is left out.
    let (ok, env, err) = c.kubectl(&["exec", "reader", "--", "/bin/busybox", "env"], None);
    assert!(ok, "{err}");
    let vars: Vec<&str> = env.lines().collect();
    for want in ["GREETING=hello", "CFG_greeting=hello", "CFG_color=blue"] {
        assert!(vars.contains(&want), "{want} in {env}");
    }
    assert!(!vars.iter().any(|v| v.starts_with("MAYBE=")), "{env}");
    // Files: every key, chosen items with their modes, bytes as they are, optional empty.
    let script = "cat /cfg/greeting; echo; cat /cfg/color; echo; cat /some/nested/hi; echo; \
                  stat -c %a /some/nested/hi; ls /some | wc -l; od -An -tx1 /bin-cfg/blob; \
                  ls /maybe | wc -l";
    let (ok, out, err) = c.kubectl(
        &["exec", "reader", "--", "/bin/busybox", "sh", "-c", script],
        None,
    );
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    assert_eq!(
        lines,
        ["hello", "blue", "hello", "440", "1", "ff 00 fe 01", "0"],
        "{out}"
    );

    // A change of the ConfigMap reaches the files of the running pod.
    let changed = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"},
        "data": {"greeting": "bonjour", "color": "blue"}});
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&changed.to_string()));
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(&["label", "pod", "reader", "touched=yes"], None);
    assert!(ok, "{err}");
    skiff_testkit::eventually_blocking("the changed ConfigMap in the file", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "exec",
                "reader",
                "--",
                "/bin/busybox",
                "cat",
                "/cfg/greeting",
            ],
            None,
        );
        (out == "bonjour").then_some(())
    });

    // A missing key and a missing ConfigMap: the kubelet's messages.
    let waiting = skiff_testkit::eventually_blocking("the missing key refused", T, || {
        let (_, out, _) = c.kubectl(
            &["get", "pod", "nokey", "-o",
              "jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}"],
            None,
        );
        out.starts_with("CreateContainerConfigError|")
            .then_some(out)
    });
    assert_eq!(
        waiting,
        "CreateContainerConfigError|couldn't find key nope in ConfigMap default/app"
    );
    let event =
        skiff_testkit::eventually_blocking("the missing ConfigMap's FailedMount", T, || {
            let (_, out, _) = c.kubectl(
                &[
                    "get",
                    "events",
                    "--field-selector",
                    "involvedObject.name=nocm,reason=FailedMount",
                    "-o",
                    "jsonpath={.items[*].message}",
                ],
                None,
            );
            (!out.is_empty()).then_some(out)
        });
    assert_eq!(
        event,
        "MountVolume.SetUp failed for volume \"cfg\" : configmap \"missing\" not found"
    );

    // Bad ConfigMaps are refused with the field named; immutable ones stay.
    let bad = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bad"},
        "data": {"a b": "x", "dup": "1"}, "binaryData": {"dup": "AA=="}});
    let (ok, _, err) = c.kubectl(&["create", "-f", "-"], Some(&bad.to_string()));
    assert!(!ok);
    assert!(err.contains("data[a b]: Invalid value: \"a b\": a valid config key must consist of alphanumeric characters"), "{err}");
    assert!(
        err.contains("binaryData[dup]: Invalid value: \"dup\": duplicate of key present in data"),
        "{err}"
    );
    let frozen = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "frozen"},
        "data": {"k": "v"}, "immutable": true});
    let (ok, _, err) = c.kubectl(&["create", "-f", "-"], Some(&frozen.to_string()));
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(
        &[
            "patch",
            "configmap",
            "frozen",
            "--type=merge",
            "-p",
            "{\"data\":{\"k\":\"w\"}}",
        ],
        None,
    );
    assert!(!ok);
    assert!(
        err.contains("field is immutable when `immutable` is set"),
        "{err}"
    );
}
