//! Containers of registry images are isolated as containerd's defaults isolate them, and
//! their securityContext and volumes work as in Kubernetes, checked from inside real
//! containers of a real cluster (a busybox image pushed to docker-registry on loopback):
//!
//! * a container sees only its own processes and mounts; its read-only root refuses writes;
//!   `runAsUser`/`runAsGroup`/`fsGroup`/`supplementalGroups` are its identity; it cannot
//!   mount; /sys is read-only; kernel files are masked; `allowPrivilegeEscalation: false`
//!   sets no_new_privs and RuntimeDefault installs a seccomp filter; `kubectl exec` runs
//!   with the same identity;
//! * dropped and added capabilities show in /proc/self/status;
//! * `shareProcessNamespace`: a container sees its pod's other containers' processes, and
//!   an emptyDir mounted by two containers is one directory;
//! * emptyDir (disk and Memory), hostPath (read-only), downwardAPI, secret (on tmpfs, items,
//!   modes, optional, updates) and subPath volumes, and the generated /etc/hosts and
//!   /etc/hostname;
//! * bad input: `runAsNonRoot` with a root image waits with CreateContainerConfigError, a
//!   hostPath of the wrong type gives a FailedMount event, an invalid spec is refused by the
//!   API server with the field named.
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

/// What the first container reports about itself, ending with `report-done`.
const REPORT: &str = r#"
echo uid=$(id -u) gid=$(id -g) groups=$(id -G)
grep -E '^(CapBnd|CapEff|NoNewPrivs|Seccomp):' /proc/self/status
echo pids=$(ls /proc | grep -c '^[0-9]')
echo mounts=$(cut -d' ' -f5 /proc/self/mountinfo | sort -u | tr '\n' ' ')
touch /rootfile 2>/dev/null && echo root=rw || echo root=ro
mount -t tmpfs none /scratch 2>/dev/null && echo mount=ok || echo mount=denied
echo sys=$(grep ' /sys sysfs ' /proc/self/mounts | cut -d' ' -f4 | cut -c1-2)
echo timer_list=$(wc -c < /proc/timer_list)
echo hello > /scratch/file && echo scratch=rw group=$(stat -c %g /scratch/file)
echo mem=$(grep ' /mem ' /proc/self/mounts | cut -d' ' -f3)
echo sub=$(ls -d /sub) && echo in-sub > /sub/f
echo podname=$(cat /etc/podinfo/name) podlabels=$(cat /etc/podinfo/labels)
echo host=$(cat /host/hello) && (touch /host/x 2>/dev/null && echo host=rw || echo host=ro)
echo hostname=$(cat /etc/hostname) hosts=$(grep -c confined /etc/hosts)
echo report-done
exec sleep 3600
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_are_isolated_and_use_security_contexts_and_volumes() {
    let registry = Registry::start();
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static (cargo xtask setup)");
    let base = gz_layer_bytes(&[
        ("bin/", b""),
        ("etc/", b""),
        ("tmp/", b""),
        ("bin/busybox", &busybox),
    ]);
    let etc = gz_layer(&[
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
        ),
        ("etc/group", "root:x:0:\napp:x:1000:\n"),
    ]);
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox", "sh", "-c"], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [
            "sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "sha256:1111111111111111111111111111111111111111111111111111111111111111"]},
    });
    registry
        .push("demo/iso:v1", &[base, etc], &config, None)
        .await;
    let image = format!("{}/demo/iso:v1", registry.host());

    let c = Cluster::start(1).await;
    let host_dir = tempfile::tempdir().unwrap();
    std::fs::write(host_dir.path().join("hello"), "from-the-node").unwrap();
    let pods = json!([
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "confined", "labels": {"app": "iso"}},
         "spec": {
            "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000,
                                "supplementalGroups": [4000]},
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                {"name": "node-dir", "hostPath": {"path": host_dir.path(), "type": "Directory"}}],
            "containers": [{
                "name": "app", "image": image, "args": [REPORT],
                "securityContext": {"readOnlyRootFilesystem": true,
                                    "allowPrivilegeEscalation": false,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "volumeMounts": [
                    {"name": "scratch", "mountPath": "/scratch"},
                    {"name": "scratch", "mountPath": "/sub", "subPath": "nested/dir"},
                    {"name": "mem", "mountPath": "/mem"},
                    {"name": "info", "mountPath": "/etc/podinfo", "readOnly": true},
                    {"name": "node-dir", "mountPath": "/host", "readOnly": true}]}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "caps"},
         "spec": {"containers": [{
            "name": "app", "image": image,
            "args": ["grep CapBnd /proc/self/status; \
                      mount -t tmpfs none /tmp 2>/dev/null && echo mount=ok || echo mount=denied; \
                      echo report-done; exec sleep 3600"],
            "securityContext": {"capabilities": {"drop": ["NET_RAW"], "add": ["NET_ADMIN"]}}}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sharing"},
         "spec": {"shareProcessNamespace": true,
                  "volumes": [{"name": "shared", "emptyDir": {}}],
                  "containers": [
            {"name": "a", "image": image, "args": ["echo from-a > /shared/x; exec sleep 4242"],
             "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]},
            {"name": "b", "image": image, "args": ["exec sleep 4343"],
             "volumeMounts": [{"name": "shared", "mountPath": "/data"}]}]}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
         "stringData": {"user": "admin", "pass": "t0p-s3cret", "unused": "x"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "secrets"},
         "spec": {"volumes": [
             {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 256,
                "items": [{"key": "user", "path": "user"}, {"key": "pass", "path": "nested/pass"}]}},
             {"name": "maybe", "secret": {"secretName": "absent", "optional": true}}],
          "containers": [{"name": "app", "image": image,
             "args": ["sleep 3600"],
             "envFrom": [{"prefix": "CREDS_", "secretRef": {"name": "creds"}}],
             "env": [
                 {"name": "USER_NAME", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}},
                 {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                 {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                 {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                 {"name": "MAYBE", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": true}}}],
             "resources": {"limits": {"memory": "64Mi"}},
             "volumeMounts": [{"name": "creds", "mountPath": "/creds", "readOnly": true},
                              {"name": "maybe", "mountPath": "/maybe"}]}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "badenv"},
         "spec": {"containers": [{"name": "app", "image": image, "args": ["sleep 3600"],
             "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nokey"}}}]}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nosecret"},
         "spec": {"volumes": [{"name": "creds", "secret": {"secretName": "nope"}}],
          "containers": [{"name": "app", "image": image, "args": ["sleep 3600"],
             "volumeMounts": [{"name": "creds", "mountPath": "/creds"}]}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nonroot"},
         "spec": {"securityContext": {"runAsNonRoot": true},
                  "containers": [{"name": "app", "image": image, "args": ["sleep 3600"]}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "badhost"},
         "spec": {"volumes": [{"name": "logs", "hostPath": {
                      "path": host_dir.path().join("hello"), "type": "Directory"}}],
                  "containers": [{"name": "app", "image": image, "args": ["sleep 3600"],
                                  "volumeMounts": [{"name": "logs", "mountPath": "/logs"}]}]}},
    ]);
    let docs: Vec<String> = pods
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.to_string())
        .collect();
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&docs.join("\n")));
    assert!(ok, "{err}");

    let report = |pod: &str| {
        skiff_testkit::eventually_blocking(&format!("the report of {pod}"), T, || {
            let (_, out, _) = c.kubectl(&["logs", pod], None);
            out.contains("report-done").then_some(out)
        })
    };
    let log = report("confined");
    let has = |line: &str| log.lines().any(|l| l.trim() == line);
    for line in [
        "uid=1000 gid=3000 groups=3000 2000 4000",
        "CapEff:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "root=ro",
        "mount=denied",
        "sys=ro",
        "timer_list=0",
        "scratch=rw group=2000",
        "mem=tmpfs",
        "sub=/sub",
        "podname=confined podlabels=app=\"iso\"",
        "host=from-the-node",
        "host=ro",
        "hostname=confined hosts=1",
    ] {
        assert!(has(line), "{line:?} in\n{log}\n{}", c.logs());
    }
    let pids: u32 = log
        .lines()
        .find_map(|l| l.strip_prefix("pids="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    assert!(
        pids <= 5,
        "the container sees only its own processes: {log}"
    );
    let mounts = log.lines().find_map(|l| l.strip_prefix("mounts=")).unwrap();
    for m in mounts.split_whitespace() {
        let expected = [
            "/",
            "/proc",
            "/dev",
            "/sys",
            "/scratch",
            "/sub",
            "/mem",
            "/etc/podinfo",
            "/host",
            "/etc/hosts",
            "/etc/hostname",
            "/etc/resolv.conf",
            // The ServiceAccount token volume the admission adds.
            "/var/run/secrets/kubernetes.io/serviceaccount",
        ]
        .iter()
        .any(|p| {
            m == *p || (["/proc", "/dev", "/sys"].contains(p) && m.starts_with(&format!("{p}/")))
        });
        assert!(expected, "a mount of the node is visible: {m} in {mounts}");
    }
    // The subPath directory was made inside the emptyDir, and the write landed there.
    let state = c.nodes[0].state_dir.path().join("state");
    let uid = {
        let (_, out, _) = c.kubectl(
            &["get", "pod", "confined", "-o", "jsonpath={.metadata.uid}"],
            None,
        );
        out
    };
    let nested = state
        .join("volumes")
        .join(&uid)
        .join("scratch/nested/dir/f");
    assert_eq!(std::fs::read_to_string(&nested).unwrap(), "in-sub\n");

    // kubectl exec runs with the container's identity and filter.
    let (ok, out, err) = c.kubectl(
        &[
            "exec",
            "confined",
            "--",
            "/bin/busybox",
            "sh",
            "-c",
            "id -u; grep Seccomp: /proc/self/status",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(out, "1000\nSeccomp:\t2\n");

    // Capabilities: containerd's default set without NET_RAW (bit 13), with NET_ADMIN (12).
    let log = report("caps");
    assert!(log.contains("CapBnd:\t00000000a80415fb"), "{log}");
    assert!(log.contains("mount=denied"), "{log}");

    // shareProcessNamespace: one container sees the other's processes.
    let (ok, _, err) = c.kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/sharing",
            "--timeout=60s",
        ],
        None,
    );
    assert!(ok, "{err}");
    let (ok, seen, err) = c.kubectl(
        &[
            "exec",
            "sharing",
            "-c",
            "b",
            "--",
            "/bin/busybox",
            "sh",
            "-c",
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert!(seen.contains("sleep 4242"), "b sees a's process: {seen}");
    assert!(
        seen.contains("--pause"),
        "PID 1 is the pod's holder: {seen}"
    );
    // An emptyDir is shared by the pod's containers.
    skiff_testkit::eventually_blocking("a's file seen by b", T, || {
        let (_, shared, err) = c.kubectl(
            &[
                "exec",
                "sharing",
                "-c",
                "b",
                "--",
                "/bin/busybox",
                "cat",
                "/data/x",
            ],
            None,
        );
        if shared == "from-a\n" {
            Ok(())
        } else {
            Err(format!("{shared:?} {err}"))
        }
    });

    // Secret volumes: the chosen keys as files with their mode, on a tmpfs; an optional
    // missing Secret is an empty volume; a change of the Secret reaches the file.
    let (ok, _, err) = c.kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/secrets",
            "--timeout=60s",
        ],
        None,
    );
    if !ok {
        let (_, pod, _) = c.kubectl(&["get", "pod", "secrets", "-o", "yaml"], None);
        let log = c.nodes[0].agent_log();
        let tail: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains("\"nope\" not found"))
            .rev()
            .take(30)
            .collect();
        panic!(
            "{err}\n{pod}\nagent log (newest first):\n{}",
            tail.join("\n")
        );
    }
    let script = "cat /creds/user; echo; cat /creds/nested/pass; echo; ls /creds; \
                  stat -L -c %a /creds/user; grep ' /creds ' /proc/self/mounts | cut -d' ' -f3; \
                  ls /maybe | wc -l";
    let (ok, out, err) = c.kubectl(
        &["exec", "secrets", "--", "/bin/busybox", "sh", "-c", script],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(
        out, "admin\nt0p-s3cret\nnested\nuser\n400\ntmpfs\n0\n",
        "{out}"
    );
    // Environment from the Secret, the pod's fields and its resources.
    let (ok, env, err) = c.kubectl(&["exec", "secrets", "--", "/bin/busybox", "env"], None);
    assert!(ok, "{err}");
    let vars: Vec<&str> = env.lines().collect();
    for want in [
        "CREDS_user=admin",
        "CREDS_pass=t0p-s3cret",
        "USER_NAME=admin",
        "POD_NAME=secrets",
        "MEM_MI=64",
    ] {
        assert!(vars.contains(&want), "{want} in {env}");
    }
    assert!(vars.iter().any(|v| v.starts_with("POD_IP=10.")), "{env}");
    assert!(!vars.iter().any(|v| v.starts_with("MAYBE=")), "{env}");
    let waiting = skiff_testkit::eventually_blocking("the missing key refused", T, || {
        let (_, out, _) = c.kubectl(
            &["get", "pod", "badenv", "-o",
              "jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}"],
            None,
        );
        out.starts_with("CreateContainerConfigError|")
            .then_some(out)
    });
    assert_eq!(
        waiting,
        "CreateContainerConfigError|couldn't find key nokey in Secret default/creds"
    );
    let changed = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
        "stringData": {"user": "root2", "pass": "t0p-s3cret", "unused": "x"}});
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&changed.to_string()));
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(&["label", "pod", "secrets", "touched=yes"], None);
    assert!(ok, "{err}");
    skiff_testkit::eventually_blocking("the changed secret in the file", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "exec",
                "secrets",
                "--",
                "/bin/busybox",
                "cat",
                "/creds/user",
            ],
            None,
        );
        (out == "root2").then_some(())
    });
    let event = skiff_testkit::eventually_blocking("the missing secret's FailedMount", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=nosecret,reason=FailedMount",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            None,
        );
        (!out.is_empty()).then_some(out)
    });
    assert_eq!(
        event,
        "MountVolume.SetUp failed for volume \"creds\" : secret \"nope\" not found"
    );
    let (_, events, _) = c.kubectl(&["get", "events", "-o", "json"], None);
    assert!(!events.contains("t0p-s3cret"), "a secret value in an event");
    assert!(
        !c.nodes[0].agent_log().contains("t0p-s3cret"),
        "a secret value in the log"
    );

    // runAsNonRoot with an image that runs as root: CreateContainerConfigError, said why.
    let waiting = skiff_testkit::eventually_blocking("the runAsNonRoot refusal", T, || {
        let (_, out, _) = c.kubectl(&[
                "get",
                "pod",
                "nonroot",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}",
            ],
            None,
        );
        out.starts_with("CreateContainerConfigError|")
            .then_some(out)
    });
    assert!(
        waiting.contains("container has runAsNonRoot and image will run as root"),
        "{waiting}"
    );
    // A hostPath that is not what its type says: a FailedMount event that says why.
    let event = skiff_testkit::eventually_blocking("the FailedMount event", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=badhost,reason=FailedMount",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            None,
        );
        (!out.is_empty()).then_some(out)
    });
    assert!(
        event.starts_with(
            "MountVolume.SetUp failed for volume \"logs\" : hostPath type check failed: "
        ) && event.contains("is not a directory"),
        "{event}"
    );
    // The API server refuses a mount of a volume the pod does not have, naming the field.
    let bad = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"},
        "spec": {"containers": [{"name": "app", "image": image,
                 "volumeMounts": [{"name": "ghost", "mountPath": "/g"}]}]}});
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&bad.to_string()));
    assert!(!ok);
    assert!(
        err.contains("spec.containers[0].volumeMounts[0].name: Not found: \"ghost\""),
        "{err}"
    );

    // Deleting the pods unmounts the Memory volume and removes the pods' volumes.
    let (ok, _, err) = c.kubectl(
        &[
            "delete",
            "pod",
            "confined",
            "caps",
            "sharing",
            "secrets",
            "nosecret",
            "badenv",
            "nonroot",
            "badhost",
            "--grace-period=1",
        ],
        None,
    );
    assert!(ok, "{err}");
    skiff_testkit::eventually_blocking("the volumes released", T, || {
        let mounted: Vec<_> = skiff_runtime::mountinfo::read()
            .unwrap()
            .into_iter()
            .filter(|m| m.mount_point.starts_with(state.join("volumes")))
            .map(|m| m.mount_point)
            .collect();
        let (_, pods, _) = c.kubectl(&[
                "get",
                "pods",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp} {.status.phase}{\"\\n\"}{end}",
            ],
            None,
        );
        if mounted.is_empty() && !state.join("volumes").join(&uid).exists() {
            Ok(())
        } else {
            let log = c.nodes[0].agent_log();
            let tail: Vec<&str> = log
                .lines()
                .filter(|l| !l.contains("not found"))
                .rev()
                .take(40)
                .collect();
            Err(format!(
                "still mounted: {mounted:?}; pods: {pods}; agent log (newest first):\n{}",
                tail.join("\n")
            ))
        }
    });
    assert_eq!(
        std::fs::read_to_string(host_dir.path().join("hello")).unwrap(),
        "from-the-node"
    );
}
