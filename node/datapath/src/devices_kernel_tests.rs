//! Device confinement against the real kernel: the `skiff-devices` program attached to a test
//! "pod" cgroup, a probe process in a container-like leaf cgroup below it that creates device
//! nodes in a temporary directory and opens them. Nothing is read from a real disk: the loop
//! device 7:0 (unbound, so reading it yields nothing) stands for a block device whose open the
//! host allows, and the node's root disk is opened only to see it refused. The guard removes
//! the cgroups and pins, also when a test fails.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::devices::{DeviceConfinement as _, DeviceFilter, pin_dir};
use crate::lb::TcAttach;
use crate::node_pin_dir;
use crate::testing::{python, unique_name};

/// Creates device nodes in argv[1] and opens them; prints one JSON object: the errno of each
/// step (0: it worked).
const PROBE: &str = r#"
import json, os, stat, sys
d = sys.argv[1]
disk_major, disk_minor = int(sys.argv[2]), int(sys.argv[3])
out = {}
def step(name, f):
    try:
        f(); out[name] = 0
    except OSError as e:
        out[name] = e.errno
def read(path, n):
    fd = os.open(path, os.O_RDONLY)
    try: os.read(fd, n)
    finally: os.close(fd)
def write(path):
    fd = os.open(path, os.O_WRONLY)
    try: os.write(fd, b"x")
    finally: os.close(fd)
def node(name, kind, major, minor):
    p = os.path.join(d, name)
    if os.path.lexists(p): os.unlink(p)
    os.mknod(p, 0o600 | kind, os.makedev(major, minor))
    return p
step("read /dev/null", lambda: read("/dev/null", 1))
step("write /dev/null", lambda: write("/dev/null"))
step("read /dev/zero", lambda: read("/dev/zero", 1))
step("mknod b 7:0", lambda: node("loop", stat.S_IFBLK, 7, 0))
step("open b 7:0", lambda: read(os.path.join(d, "loop"), 512))
step("mknod c 1:1", lambda: node("mem", stat.S_IFCHR, 1, 1))
step("open c 1:1", lambda: read(os.path.join(d, "mem"), 1))
step("mknod disk", lambda: node("disk", stat.S_IFBLK, disk_major, disk_minor))
step("open disk", lambda: read(os.path.join(d, "disk"), 512))
print(json.dumps(out), flush=True)
"#;

struct DevicesFixture {
    cgroup: PathBuf,
    node_pins: PathBuf,
    nodes: tempfile::TempDir,
}

impl DevicesFixture {
    fn new() -> Self {
        let suffix = unique_name();
        let root = skiff_runtime::host::cgroup2_mount().expect("cgroup v2 must be mounted");
        let fx = DevicesFixture {
            cgroup: root.join(format!("skiff-devtest-{suffix}")),
            node_pins: node_pin_dir(&format!("devtest-{suffix}")),
            nodes: tempfile::tempdir().expect("tempdir"),
        };
        std::fs::create_dir_all(fx.cgroup.join("pod").join("ctr")).expect("test cgroups");
        fx
    }

    fn pod(&self) -> PathBuf {
        self.cgroup.join("pod")
    }

    /// Runs the probe in the pod's leaf cgroup; errno by step.
    fn probe(&self) -> BTreeMap<String, i32> {
        let procs = self.pod().join("ctr").join("cgroup.procs");
        let root_dev = std::fs::metadata("/").expect("stat /").dev();
        let (major, minor) = (libc::major(root_dev), libc::minor(root_dev));
        let out = Command::new("sh")
            .args(["-c", r#"echo $$ > "$0" && shift && exec "$@""#])
            .arg(&procs)
            .args(["--", python(), "-c", PROBE])
            .arg(self.nodes.path())
            .args([major.to_string(), minor.to_string()])
            .output()
            .expect("run the probe");
        assert!(
            out.status.success(),
            "probe failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("probe output")
    }
}

impl Drop for DevicesFixture {
    fn drop(&mut self) {
        for dir in [self.pod().join("ctr"), self.pod(), self.cgroup.clone()] {
            for _ in 0..100 {
                match std::fs::remove_dir(&dir) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => break,
                }
            }
        }
        if let Err(e) = DeviceFilter::remove_pins(&self.node_pins) {
            eprintln!("cleanup: {e}");
        }
        let _ = std::fs::remove_dir(&self.node_pins);
    }
}

const EPERM: i32 = libc::EPERM;

/// Without the program the kernel lets the probe open the loop block device it made; with it
/// attached to the pod cgroup, that open (and one of `/dev/mem`'s number, and of the node's
/// root disk) fails with EPERM while `/dev/null` and `/dev/zero` work and `mknod` is allowed
/// as runc allows it. Released, the pod is unconfined again; an agent restart (a new
/// `DeviceFilter` on the same pins) keeps the pod confined throughout.
#[test]
fn device_filter_denies_block_devices_and_allows_the_default_list() {
    let fx = DevicesFixture::new();

    let open = fx.probe();
    assert_eq!(open["read /dev/null"], 0, "{open:?}");
    assert_eq!(open["mknod b 7:0"], 0, "{open:?}");
    assert_eq!(
        open["open b 7:0"], 0,
        "without the device filter the host must let the loop device open: {open:?}"
    );

    let mut filter = DeviceFilter::load(&fx.node_pins).expect("load the device filter");
    let pod = "pod-under-test";
    assert_eq!(
        filter.confine(pod, &fx.pod()).expect("attach"),
        TcAttach::Attached
    );
    assert_eq!(filter.confined().expect("confined"), vec![pod.to_string()]);

    let confined = fx.probe();
    for allowed in [
        "read /dev/null",
        "write /dev/null",
        "read /dev/zero",
        "mknod b 7:0",
        "mknod c 1:1",
        "mknod disk",
    ] {
        assert_eq!(confined[allowed], 0, "{allowed}: {confined:?}");
    }
    for denied in ["open b 7:0", "open c 1:1", "open disk"] {
        assert_eq!(confined[denied], EPERM, "{denied}: {confined:?}");
    }

    // The agent restarts: its pinned link keeps the pod confined, and the new agent takes
    // it over instead of attaching a second program.
    drop(filter);
    assert_eq!(fx.probe()["open b 7:0"], EPERM);
    let mut filter = DeviceFilter::load(&fx.node_pins).expect("reload");
    assert_eq!(
        filter.confine(pod, &fx.pod()).expect("adopt"),
        TcAttach::Adopted
    );
    assert_eq!(fx.probe()["open b 7:0"], EPERM);

    filter.release(pod).expect("release");
    assert!(filter.confined().expect("confined").is_empty());
    assert_eq!(
        fx.probe()["open b 7:0"],
        0,
        "release left the filter attached"
    );
    assert!(pin_dir(&fx.node_pins).is_dir());
}
