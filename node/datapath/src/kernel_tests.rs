//! Tests against the real kernel: BPF programs and maps, a cgroup v2 directory, a network
//! namespace of their own. They need root (as every Skiff host and CI run has). All traffic
//! stays on the loopback device of a namespace created for the test, and a guard removes the
//! cgroup, the namespace and the pins again, also when a test fails.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use super::*;
use crate::testing::{python, run, unique_name, wait_timeout};

/// Accepts one connection on 127.0.0.1 (ephemeral port, printed first), reads argv[1] bytes,
/// replies with argv[2] bytes, waits for the client to close, prints how much it read.
const SERVER: &str = r#"
import socket, sys
want, reply = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
got = 0
while got < want:
    b = c.recv(65536)
    if not b:
        break
    got += len(b)
c.sendall(b"r" * reply)
c.shutdown(socket.SHUT_WR)
while c.recv(65536):
    pass
c.close()
print(got, flush=True)
sys.exit(0 if got == want else 1)
"#;

/// Connects to 127.0.0.1:argv[1], sends argv[2] bytes, reads argv[3] bytes, closes.
const CLIENT: &str = r#"
import socket, sys
port, send, want = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"s" * send)
got = 0
while got < want:
    b = c.recv(65536)
    if not b:
        break
    got += len(b)
c.close()
sys.exit(0 if got == want else 1)
"#;

/// A cgroup, a network namespace and a pin directory of one test; removed on drop.
struct LbKernelFixture {
    name: String,
    cgroup: PathBuf,
    cgroup_created: bool,
    /// Child cgroups created below `cgroup` (removed first).
    children_cgroups: Vec<PathBuf>,
    netns_created: bool,
    pin_dir: PathBuf,
    children: Vec<Child>,
}

impl LbKernelFixture {
    fn new() -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "these tests load BPF programs and need root");
        let suffix = unique_name();
        let name = format!("skiff-test-{suffix}");
        let root = skiff_runtime::host::cgroup2_mount().expect("cgroup v2 must be mounted");
        let mut fx = LbKernelFixture {
            cgroup: root.join(&name),
            cgroup_created: false,
            children_cgroups: Vec::new(),
            netns_created: false,
            pin_dir: node_pin_dir(&format!("test-{suffix}")),
            children: Vec::new(),
            name,
        };
        std::fs::create_dir(&fx.cgroup).expect("create test cgroup");
        fx.cgroup_created = true;
        run("ip", &["netns", "add", &fx.name]);
        fx.netns_created = true;
        run("ip", &["-n", &fx.name, "link", "set", "lo", "up"]);
        fx
    }

    fn nsenter(&self) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.name));
        cmd
    }

    /// Creates the child cgroup `name` below the test cgroup (removed on drop).
    fn child_cgroup(&mut self, name: &str) -> PathBuf {
        let dir = self.cgroup.join(name);
        std::fs::create_dir(&dir).expect("create child cgroup");
        self.children_cgroups.push(dir.clone());
        dir
    }

    /// A client in the test cgroup sends `send` bytes over TCP to a server outside the cgroup
    /// (same namespace, 127.0.0.1), which replies with `reply` bytes.
    fn transfer(&mut self, send: usize, reply: usize) {
        let cgroup = self.cgroup.clone();
        self.transfer_in(&cgroup, send, reply);
    }

    /// [`LbKernelFixture::transfer`] with the client in `cgroup` (the test cgroup or a child of it).
    fn transfer_in(&mut self, cgroup: &Path, send: usize, reply: usize) {
        let mut server = self
            .nsenter()
            .args([
                python(),
                "-c",
                SERVER,
                &send.to_string(),
                &reply.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn server");
        let stdout = server.stdout.take().expect("server stdout");
        self.children.push(server);
        let mut lines = BufReader::new(stdout).lines();
        let port = lines
            .next()
            .and_then(Result::ok)
            .expect("server did not print its port");

        // The shell moves itself into the cgroup before python creates the socket, so the
        // socket (and its traffic) belongs to the cgroup. `nsenter`, not `ip netns exec`,
        // which would remount /sys and hide the cgroup mount.
        let procs = cgroup.join("cgroup.procs");
        let procs = procs.to_str().expect("UTF-8 cgroup path");
        let client = self
            .nsenter()
            .args([
                "sh",
                "-c",
                r#"echo $$ > "$0" && exec "$1" -c "$2" "$3" "$4" "$5""#,
                procs,
                python(),
                CLIENT,
                &port,
                &send.to_string(),
                &reply.to_string(),
            ])
            .spawn()
            .expect("spawn client");
        self.children.push(client);
        let n = self.children.len();
        let client_status = wait_timeout(&mut self.children[n - 1], "client");
        let server_status = wait_timeout(&mut self.children[n - 2], "server");
        let got = lines.next().and_then(Result::ok).unwrap_or_default();
        assert!(client_status.success(), "client failed: {client_status}");
        assert!(
            server_status.success(),
            "server failed: {server_status} (read {got} bytes)"
        );
    }
}

impl Drop for LbKernelFixture {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut dirs = std::mem::take(&mut self.children_cgroups);
        dirs.reverse();
        if self.cgroup_created {
            dirs.push(self.cgroup.clone());
        }
        for dir in &dirs {
            // A process that just exited can take a moment to leave the cgroup (EBUSY).
            for _ in 0..100 {
                match std::fs::remove_dir(dir) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        eprintln!("cleanup: rmdir {}: {e}", dir.display());
                        break;
                    }
                    _ => break,
                }
            }
        }
        if self.netns_created {
            let _ = Command::new("ip")
                .args(["netns", "delete", &self.name])
                .status();
        }
        if let Err(e) = Accounting::remove_pins(&self.pin_dir) {
            eprintln!("cleanup: {e}");
        }
    }
}

/// The payload plus the IP and TCP headers of its segments and retransmissions: ~3 % with
/// full-size segments, up to ~16 % seen on a loaded machine (small segments). At most 25 %
/// over still catches missing, partial and double counting.
fn assert_close(what: &str, measured: u64, payload: usize) {
    let payload = payload as u64;
    let limit = payload + payload / 4;
    assert!(
        (payload..=limit).contains(&measured),
        "{what}: {measured} bytes counted for a {payload}-byte payload (want {payload}..={limit})"
    );
}

#[test]
fn counts_a_pods_tcp_traffic_per_direction() {
    const SEND: usize = 1_000_000;
    const REPLY: usize = 500_000;
    let mut fx = LbKernelFixture::new();
    let mut acct = Accounting::load(&fx.pin_dir).expect("load");
    assert!(is_bpffs(Path::new(BPFFS_ROOT)).unwrap());
    assert!(fx.pin_dir.join(POD_INGRESS_MAP).exists());
    assert!(fx.pin_dir.join(POD_EGRESS_MAP).exists());

    let id = acct.attach(&fx.cgroup).expect("attach");
    assert_eq!(id, cgroup_id(&fx.cgroup).unwrap());
    assert!(acct.is_attached(id));
    assert_eq!(acct.attach(&fx.cgroup).expect("attach again"), id);
    assert_eq!(acct.counters(id).unwrap(), Default::default());

    fx.transfer(SEND, REPLY);
    let (ingress, egress) = acct.counters(id).expect("counters");
    eprintln!("sent {SEND} B, received {REPLY} B: egress {egress:?}, ingress {ingress:?}");
    assert_close("egress", egress.bytes, SEND);
    assert_close("ingress", ingress.bytes, REPLY);
    assert!(egress.packets > 0 && ingress.packets > 0);
    assert!(acct.cgroup_ids().unwrap().contains(&id));

    // Detached: more traffic, same counters.
    acct.detach(id).expect("detach");
    assert!(!acct.is_attached(id));
    assert!(matches!(acct.detach(id), Err(BpfError::NotAttached(_))));
    fx.transfer(100_000, 100_000);
    assert_eq!(acct.counters(id).unwrap(), (ingress, egress));

    acct.forget(id).expect("forget");
    acct.forget(id).expect("forget is idempotent");
    assert_eq!(acct.counters(id).unwrap(), Default::default());
    assert!(!acct.cgroup_ids().unwrap().contains(&id));

    acct.unpin().expect("unpin");
    assert!(!fx.pin_dir.exists());
}

/// The agent attaches once, to the node's cgroup parent, and reads counters per container
/// leaf cgroup: programs attached to an ancestor run for the sockets of every descendant, and
/// the counters land on the socket's own (leaf) cgroup id, not on the attach point.
#[test]
fn attached_to_a_parent_counts_descendants_under_their_own_id() {
    const SEND: usize = 300_000;
    const REPLY: usize = 200_000;
    let mut fx = LbKernelFixture::new();
    let mut acct = Accounting::load(&fx.pin_dir).expect("load");
    let parent_id = acct.attach(&fx.cgroup).expect("attach to the parent");
    let pod = fx.child_cgroup("pod-x");
    let leaf = fx.child_cgroup("pod-x/app");
    let (pod_id, leaf_id) = (cgroup_id(&pod).unwrap(), cgroup_id(&leaf).unwrap());

    fx.transfer_in(&leaf, SEND, REPLY);
    let (ingress, egress) = acct.counters(leaf_id).expect("counters");
    eprintln!("leaf {leaf_id}: egress {egress:?}, ingress {ingress:?}");
    assert_close("egress of the leaf", egress.bytes, SEND);
    assert_close("ingress of the leaf", ingress.bytes, REPLY);
    for (what, id) in [("parent", parent_id), ("pod", pod_id)] {
        assert_eq!(
            acct.counters(id).unwrap(),
            Default::default(),
            "nothing is counted on the {what} cgroup"
        );
    }
}

#[test]
fn bpftool_shows_named_fields() {
    let mut fx = LbKernelFixture::new();
    let mut acct = Accounting::load(&fx.pin_dir).expect("load");
    let id = acct.attach(&fx.cgroup).expect("attach");
    fx.transfer(10_000, 10_000);

    let pin = fx.pin_dir.join(POD_EGRESS_MAP);
    let out = Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(&pin)
        .output()
        .expect("run bpftool");
    let dump = String::from_utf8_lossy(&out.stdout);
    eprintln!("bpftool map dump pinned {}:\n{dump}", pin.display());
    assert!(
        out.status.success(),
        "bpftool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dump.contains("\"packets\""), "no named fields in:\n{dump}");
    assert!(dump.contains("\"bytes\""), "no named fields in:\n{dump}");
    assert!(
        dump.contains(&format!("\"key\": {id}")),
        "cgroup {id} missing in:\n{dump}"
    );

    let out = Command::new("bpftool")
        .args(["map", "show", "pinned"])
        .arg(&pin)
        .output()
        .expect("run bpftool");
    let show = String::from_utf8_lossy(&out.stdout);
    assert!(
        show.contains("percpu_hash") && show.contains("POD_EGRESS"),
        "{show}"
    );
    assert!(
        show.contains("max_entries 4096") && show.contains("btf_id"),
        "{show}"
    );
}

#[test]
fn pinned_counters_survive_a_reload() {
    let mut fx = LbKernelFixture::new();
    let mut acct = Accounting::load_with_capacity(&fx.pin_dir, 16).expect("load");
    let id = acct.attach(&fx.cgroup).expect("attach");
    fx.transfer(20_000, 0);
    let before = acct.counters(id).unwrap();
    assert!(before.1.bytes >= 20_000);
    drop(acct); // detaches and unloads the programs; the pins stay

    let acct = Accounting::load(&fx.pin_dir).expect("reload");
    assert!(acct.attached().next().is_none());
    assert_eq!(acct.counters(id).unwrap(), before);
}

#[test]
fn attach_refuses_a_directory_that_is_no_cgroup() {
    let fx = LbKernelFixture::new();
    let mut acct = Accounting::load(&fx.pin_dir).expect("load");
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        acct.attach(dir.path()),
        Err(BpfError::NotCgroup2(_))
    ));
    assert!(matches!(
        acct.attach(&dir.path().join("absent")),
        Err(BpfError::Io { .. })
    ));
    assert!(matches!(
        Accounting::load_with_capacity(&fx.pin_dir, 0),
        Err(BpfError::ZeroCapacity)
    ));
}
