//! A pod cannot reach the node's devices (the Kubernetes "device access" class of attacks):
//! a default (Pod Security baseline) container keeps CAP_MKNOD, so it can make a block device
//! node of the node's disk anywhere in its writable root and open it. Skiff confines every
//! unprivileged pod with runc's default device allow list (a `cgroup_device` eBPF program on
//! the pod's cgroup), so the node refuses the open with EPERM, while /dev/null and /dev/zero
//! work; a privileged pod (in a privileged namespace) still gets every device.
//!
//! /dev and its submounts carry containerd's default mount options (checked too).
//!
//! The block device read is of two nodes: the node's root disk (whose open this machine's
//! host may refuse on its own) and the loop device 7:0, whose open only Skiff refuses (it is
//! unbound: reading it yields nothing), so the test fails if Skiff does not confine the pod.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::os::unix::fs::MetadataExt as _;
use std::time::Duration;

use serde_json::json;
use skiff_testkit::registry::Registry;
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(90);

/// Makes device nodes of the node's disk (`$1:$2`) and of loop 7:0 in /tmp, reads them and
/// /dev/null and /dev/zero, and reports one line per step, ending with `report-done`.
const PROBE: &str = r#"
probe() {
  mknod /tmp/$1 b $2 $3 && echo "mknod-$1=ok" || echo "mknod-$1=failed"
  if dd if=/tmp/$1 of=/dev/null bs=512 count=1 2>/tmp/$1.err; then
    echo "read-$1=ok"
  else
    echo "read-$1=$(cat /tmp/$1.err)"
  fi
}
probe disk DISK_MAJOR DISK_MINOR
probe loop 7 0
head -c1 /dev/null && echo null=ok
echo zero=$(head -c 1 /dev/zero | wc -c)
for m in dev dev/pts dev/shm dev/mqueue; do
  echo "mount-$m=$(grep " /$m " /proc/self/mounts | cut -d' ' -f3,4)"
done
echo report-done
exec sleep 3600
"#;

fn pod(name: &str, ns: &str, image: &str, script: &str, privileged: bool) -> serde_json::Value {
    let mut container = json!({"name": "app", "image": image, "args": [script]});
    if privileged {
        container["securityContext"] = json!({"privileged": true});
    }
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"containers": [container]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_access_is_denied() {
    let registry = Registry::start();
    let image = registry.push_busybox("demo/devices:v1").await;

    // The node's disk: the device / is on (the nodes share this machine's filesystem).
    let dev = std::fs::metadata("/").unwrap().dev();
    let script = PROBE
        .replace("DISK_MAJOR", &libc_major(dev).to_string())
        .replace("DISK_MINOR", &libc_minor(dev).to_string());

    let c = Cluster::start(1).await;
    let docs = [
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "devices-baseline",
                            "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}),
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "devices-privileged",
                            "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
        pod("attacker", "devices-baseline", &image, &script, false),
        pod("admin", "devices-privileged", &image, &script, true),
    ]
    .map(|d| d.to_string());
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&docs.join("\n")));
    assert!(ok, "{err}");

    let report = |ns: &str, pod: &str| {
        skiff_testkit::eventually_blocking(&format!("the report of {ns}/{pod}"), T, || {
            let (_, out, _) = c.kubectl(&["logs", "-n", ns, pod], None);
            out.contains("report-done").then_some(out)
        })
    };
    let line = |log: &str, key: &str| -> String {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in\n{log}"))
            .to_string()
    };

    // The baseline pod: mknod is allowed (as runc allows it), every open of a block device
    // node is refused by the node, the default character devices work.
    let log = report("devices-baseline", "attacker");
    let context = || format!("{log}\n{}", c.logs());
    assert_eq!(line(&log, "mknod-disk"), "ok", "{}", context());
    assert_eq!(line(&log, "mknod-loop"), "ok", "{}", context());
    for dev in ["read-disk", "read-loop"] {
        let read = line(&log, dev);
        assert!(
            read.contains("Operation not permitted"),
            "{dev}: the pod opened a block device: {read}\n{}",
            context()
        );
    }
    assert_eq!(line(&log, "null"), "ok", "{}", context());
    assert_eq!(line(&log, "zero"), "1", "{}", context());
    // /dev and what is below it are mounted with containerd's default options.
    for (mount, fs, options) in [
        ("dev", "tmpfs", &["nosuid", "mode=755"][..]),
        (
            "dev/pts",
            "devpts",
            &["nosuid", "noexec", "gid=5", "mode=620", "ptmxmode=666"],
        ),
        ("dev/shm", "tmpfs", &["nosuid", "nodev", "noexec"]),
        ("dev/mqueue", "mqueue", &["nosuid", "nodev", "noexec"]),
    ] {
        let got = line(&log, &format!("mount-{mount}"));
        let (got_fs, got_options) = got.split_once(' ').unwrap_or((&got, ""));
        let got_options: Vec<&str> = got_options.split(',').collect();
        assert_eq!(got_fs, fs, "/{mount}: {got}");
        for o in options {
            assert!(got_options.contains(o), "/{mount} lacks {o}: {got}");
        }
    }

    // `kubectl exec` runs in the same cgroup: just as confined.
    let (ok, out, err) = c.kubectl(
        &[
            "exec",
            "-n",
            "devices-baseline",
            "attacker",
            "--",
            "/bin/busybox",
            "sh",
            "-c",
            "dd if=/tmp/loop of=/dev/null bs=512 count=1 2>&1 && echo opened; head -c 1 /dev/zero | wc -c",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("Operation not permitted") && !out.contains("opened"),
        "exec opened a block device: {out}"
    );
    assert!(
        out.trim_end().ends_with('1'),
        "exec could not read /dev/zero: {out}"
    );

    // The privileged pod gets every device: the loop device opens (the node's disk is this
    // machine's host's to refuse, so it is not checked here).
    let log = report("devices-privileged", "admin");
    assert_eq!(line(&log, "mknod-loop"), "ok", "{log}");
    assert_eq!(line(&log, "read-loop"), "ok", "{log}\n{}", c.logs());
    assert_eq!(line(&log, "null"), "ok", "{log}");
    assert_eq!(line(&log, "zero"), "1", "{log}");
}

/// `major(3)` of a `st_dev` (glibc's encoding).
fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)
}

/// `minor(3)` of a `st_dev` (glibc's encoding).
fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)
}
