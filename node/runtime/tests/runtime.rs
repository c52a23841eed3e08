//! The native pod runtime against the real kernel: cgroup v2 groups, namespaces, the shim.
//!
//! Needs root. Every test works below its own `<v2 root>/skiff-test-…` cgroup and a temporary
//! state directory; network traffic stays on the loopback of the pods' own namespaces. The
//! [`Harness`] guard removes everything (processes, namespace mounts, cgroups) also when a
//! test fails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use skiff_runtime::{
    ContainerSpec, ContainerState, Image, Limits, Mount, NativeConfig, NativeRuntime, Runtime,
    RuntimeError, Sandbox, SandboxSpec, Seccomp, Security,
};
use skiff_testkit::eventually_within;
use tokio::sync::broadcast;

const SHIM: &str = env!("CARGO_BIN_EXE_skiff-shim");
const PYTHON: &str = "/usr/bin/python3";

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{tag}-{}-{:x}-{}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Owns a test's cgroup parent and state directory; its `Drop` cleans up everything.
struct Harness {
    tmp: tempfile::TempDir,
    v2_root: PathBuf,
    cgroup_parent: PathBuf,
}

impl Harness {
    fn new(tag: &str) -> Self {
        let v2_root = skiff_runtime::host::cgroup2_mount().expect("cgroup v2 must be mounted");
        let cgroup_parent = v2_root.join(format!("skiff-test-{}", unique(tag)));
        Harness {
            tmp: tempfile::tempdir().expect("tempdir"),
            v2_root,
            cgroup_parent,
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.tmp.path().join("state")
    }

    fn config(&self) -> NativeConfig {
        NativeConfig::new(
            self.state_dir(),
            self.cgroup_parent.clone(),
            PathBuf::from(SHIM),
        )
    }

    fn runtime(&self) -> NativeRuntime {
        NativeRuntime::new(self.config()).expect("native runtime")
    }

    fn sandbox_spec(&self, name: &str) -> SandboxSpec {
        SandboxSpec {
            uid: unique("uid"),
            namespace: "default".into(),
            name: name.into(),
            hostname: name.into(),
            pid_namespace: false,
            share_pid_namespace: false,
            mount_namespace: false,
            limits: Limits::default(),
        }
    }

    /// Every file system path this harness may have mounted something on.
    fn mounts_to_remove(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        // Network namespaces of our pods, from their sandbox records.
        if let Ok(pods) = std::fs::read_dir(self.state_dir().join("pods")) {
            for pod in pods.filter_map(Result::ok) {
                let Ok(text) = std::fs::read_to_string(pod.path().join("sandbox.json")) else {
                    continue;
                };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
                    continue;
                };
                if let Some(p) = v["sandbox"]["netns_path"].as_str() {
                    out.push(PathBuf::from(p));
                }
            }
        }
        // Everything mounted below the temporary directory (UTS/IPC namespace files).
        let tmp = self.tmp.path().to_string_lossy().into_owned();
        if let Ok(mounts) = skiff_runtime::mountinfo::read() {
            out.extend(
                mounts
                    .into_iter()
                    .map(|m| m.mount_point)
                    .filter(|mp| mp.starts_with(&tmp)),
            );
        }
        out
    }
}

fn cgroup_dirs_depth_first(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.filter_map(Result::ok) {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                cgroup_dirs_depth_first(&e.path(), out);
            }
        }
    }
    out.push(dir.to_path_buf());
}

fn populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map(|s| s.lines().any(|l| l.trim() == "populated 1"))
        .unwrap_or(false)
}

impl Drop for Harness {
    fn drop(&mut self) {
        // 1. Processes: shims that did not make it into our cgroup tree, by pid (only those
        //    whose command line names our state directory)...
        let marker = self.tmp.path().to_string_lossy().into_owned();
        let mut pid_files = Vec::new();
        if let Ok(pods) = std::fs::read_dir(self.state_dir().join("pods")) {
            for pod in pods.filter_map(Result::ok) {
                if let Ok(cs) = std::fs::read_dir(pod.path().join("containers")) {
                    pid_files.extend(
                        cs.filter_map(Result::ok)
                            .map(|c| c.path().join("pids.json")),
                    );
                }
            }
        }
        for f in pid_files {
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
                continue;
            };
            for key in ["shim_pid", "pid"] {
                let Some(pid) = v[key].as_u64().and_then(|p| i32::try_from(p).ok()) else {
                    continue;
                };
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let ours = key == "pid" || String::from_utf8_lossy(&cmdline).contains(&marker);
                let in_tree = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .map(|c| {
                        c.contains(
                            &self
                                .cgroup_parent
                                .strip_prefix(&self.v2_root)
                                .unwrap_or(&self.cgroup_parent)
                                .to_string_lossy()
                                .into_owned(),
                        )
                    })
                    .unwrap_or(false);
                if ours && (in_tree || key == "shim_pid") {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        // ...then everything in our cgroup tree (containers, exec helpers, shims).
        if self.cgroup_parent.exists() {
            let _ = std::fs::write(self.cgroup_parent.join("cgroup.kill"), "1");
            let deadline = Instant::now() + Duration::from_secs(5);
            while populated(&self.cgroup_parent) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // 2. Namespace mounts.
        for m in self.mounts_to_remove().into_iter().rev() {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
            if m.starts_with("/run/netns") {
                let _ = std::fs::remove_file(&m);
            }
        }
        // 3. Cgroups, leaves first.
        let mut dirs = Vec::new();
        cgroup_dirs_depth_first(&self.cgroup_parent, &mut dirs);
        for d in dirs {
            for _ in 0..50 {
                match std::fs::remove_dir(&d) {
                    Err(e) if e.raw_os_error() == Some(libc_ebusy()) => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => break,
                }
            }
        }
        // 4. The temporary directory goes with `tmp`.
    }
}

fn libc_ebusy() -> i32 {
    nix::errno::Errno::EBUSY as i32
}

fn host_container(name: &str, argv: &[&str]) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        image: Image::Host,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![],
        working_dir: None,
        limits: Limits::default(),
        mounts: vec![],
        security: Default::default(),
        stdio: Default::default(),
        target: None,
    }
}

fn sh(name: &str, script: &str) -> ContainerSpec {
    host_container(name, &["/bin/sh", "-c", script])
}

async fn wait_exit(
    rx: &mut broadcast::Receiver<(String, String)>,
    uid: &str,
    name: &str,
    timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok((u, n))) if u == uid && n == name => return,
            Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(e)) => panic!("exit channel closed: {e}"),
            Err(_) => panic!("no exit of {uid}/{name} within {timeout:?}"),
        }
    }
}

async fn state(rt: &NativeRuntime, sb: &Sandbox, name: &str) -> ContainerState {
    rt.container_state(sb, name)
        .await
        .expect("container_state")
        .unwrap_or_else(|| panic!("no state for {name}"))
}

fn running_pid(s: &ContainerState) -> u32 {
    match s {
        ContainerState::Running { pid, .. } => *pid,
        other => panic!("expected a running container, got {other:?}"),
    }
}

fn log_text(rt: &NativeRuntime, sb: &Sandbox, name: &str) -> String {
    std::fs::read_to_string(rt.log_path(&sb.uid, name)).unwrap_or_default()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
                .unwrap_or(false)
        })
        .unwrap_or(false)
}

fn ns_inode(path: &Path) -> u64 {
    std::fs::metadata(path).expect("namespace file").ino()
}

fn ip_netns_list() -> String {
    std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

const SERVER: &str = r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8080))
s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hello from " + socket.gethostname().encode() + b"\n")
    c.close()
"#;

const CLIENT: &str = r#"
import socket, time
for _ in range(200):
    try:
        c = socket.create_connection(("127.0.0.1", 8080), timeout=1)
        break
    except OSError:
        time.sleep(0.02)
else:
    raise SystemExit("server unreachable")
print("got: " + c.recv(100).decode().strip() + "; me: " + socket.gethostname(), flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_of_a_pod_share_network_and_hostname_and_exec_joins_them() {
    let h = Harness::new("share");
    let rt = h.runtime();
    let mut exits = rt.exits();
    let spec = h.sandbox_spec("web-pod");
    let sb = rt.create_sandbox(&spec).await.expect("create sandbox");
    // Idempotent.
    assert_eq!(rt.create_sandbox(&spec).await.expect("again"), sb);
    assert!(sb.cgroup_dir.starts_with(&h.cgroup_parent));
    assert_eq!(
        sb.cgroup_id,
        std::fs::metadata(&sb.cgroup_dir).unwrap().ino()
    );
    let netns_name = sb
        .netns_path
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(netns_name.starts_with("skiff-"), "{netns_name}");
    assert!(
        ip_netns_list().contains(&netns_name),
        "ip netns list shows the pod"
    );

    let server = rt
        .start_container(&sb, &host_container("server", &[PYTHON, "-c", SERVER]))
        .await
        .expect("start server");
    let server_pid = running_pid(&server);
    let ContainerState::Running { cgroup_id, .. } = server else {
        unreachable!()
    };
    // The process lives in its leaf cgroup, whose id the state reports.
    let leaf = sb.cgroup_dir.join("server");
    assert_eq!(cgroup_id, std::fs::metadata(&leaf).unwrap().ino());
    let own_cgroup = std::fs::read_to_string(format!("/proc/{server_pid}/cgroup")).unwrap();
    let rel = leaf
        .strip_prefix(&h.v2_root)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(own_cgroup.contains(&format!("0::/{rel}")), "{own_cgroup}");
    // Its network namespace is the pod's, not ours.
    let net = |pid: u32| ns_inode(Path::new(&format!("/proc/{pid}/ns/net")));
    assert_eq!(net(server_pid), ns_inode(&sb.netns_path));
    assert_ne!(net(server_pid), net(std::process::id()));
    // The shim stays outside the pod cgroup.
    let pids: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            h.state_dir()
                .join(format!("pods/{}/containers/server/pids.json", sb.uid)),
        )
        .unwrap(),
    )
    .unwrap();
    let shim_pid = pids["shim_pid"].as_u64().unwrap();
    let shim_cgroup = std::fs::read_to_string(format!("/proc/{shim_pid}/cgroup")).unwrap();
    assert!(shim_cgroup.trim_end().ends_with("/shims"), "{shim_cgroup}");

    let client = rt
        .start_container(&sb, &host_container("client", &[PYTHON, "-c", CLIENT]))
        .await
        .expect("start client");
    assert!(client.is_running() || matches!(client, ContainerState::Exited { .. }));
    wait_exit(&mut exits, &sb.uid, "client", Duration::from_secs(15)).await;
    match state(&rt, &sb, "client").await {
        ContainerState::Exited {
            exit_code, reason, ..
        } => assert_eq!(
            (exit_code, reason.as_str()),
            (0, "Completed"),
            "{}",
            log_text(&rt, &sb, "client")
        ),
        other => panic!("client: {other:?}"),
    }
    let client_log = log_text(&rt, &sb, "client");
    assert!(
        client_log.contains(" stdout got: hello from web-pod; me: web-pod"),
        "{client_log}"
    );

    // Exec probes run in the container's namespaces and cgroup.
    let out = rt
        .exec(&sb, "server", &["hostname".into()], Duration::from_secs(5))
        .await
        .expect("exec hostname");
    assert_eq!(
        (out.exit_code, String::from_utf8_lossy(&out.stdout).trim()),
        (0, "web-pod")
    );
    let out = rt
        .exec(
            &sb,
            "server",
            &[
                "/bin/sh".into(),
                "-c".into(),
                "cat /proc/self/cgroup; readlink /proc/self/ns/net; exit 4".into(),
            ],
            Duration::from_secs(5),
        )
        .await
        .expect("exec sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.exit_code, 4);
    assert!(stdout.contains(&format!("0::/{rel}")), "{stdout}");
    assert!(
        stdout.contains(&format!("net:[{}]", ns_inode(&sb.netns_path))),
        "{stdout}"
    );
    let out = rt
        .exec(
            &sb,
            "server",
            &["nosuchcmd-probe".into()],
            Duration::from_secs(5),
        )
        .await
        .expect("exec missing");
    assert_eq!(out.exit_code, 127);
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file or directory"));
    // A probe that overruns its timeout is killed.
    let t0 = Instant::now();
    let err = rt
        .exec(
            &sb,
            "server",
            &["sleep".into(), "30".into()],
            Duration::from_millis(300),
        )
        .await
        .expect_err("timeout");
    assert!(matches!(err, RuntimeError::ExecTimeout(_)), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    eventually_within(
        "the timed-out probe to be killed",
        Duration::from_secs(5),
        || async {
            std::fs::read_to_string(leaf.join("cgroup.procs"))
                .map(|p| p.split_whitespace().count() == 1)
                .unwrap_or(false)
        },
    )
    .await;

    rt.remove_sandbox(&sb, Duration::from_secs(2))
        .await
        .expect("remove");
    assert!(!alive(server_pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_args_and_working_dir_reach_the_process_and_exit_codes_are_recorded() {
    let h = Harness::new("env");
    let rt = h.runtime();
    let mut exits = rt.exits();
    let sb = rt.create_sandbox(&h.sandbox_spec("env-pod")).await.unwrap();
    let mut spec = host_container(
        "main",
        &[
            "/bin/sh",
            "-c",
            "echo \"foo=$FOO arg=$1 host=$HOSTNAME\"; pwd; echo oops >&2; exit 3",
            "sh",
            "first arg",
        ],
    );
    spec.env = vec![("FOO".into(), "bar baz".into())];
    spec.working_dir = Some("/tmp".into());
    let st = rt.start_container(&sb, &spec).await.unwrap();
    let pid = match st {
        ContainerState::Running { pid, .. } => Some(pid),
        _ => None,
    };
    wait_exit(&mut exits, &sb.uid, "main", Duration::from_secs(10)).await;
    match state(&rt, &sb, "main").await {
        ContainerState::Exited {
            exit_code,
            signal,
            reason,
            started_at,
            finished_at,
            ..
        } => {
            assert_eq!((exit_code, signal, reason.as_str()), (3, None, "Error"));
            assert!(finished_at >= started_at);
        }
        other => panic!("{other:?}"),
    }
    let log = log_text(&rt, &sb, "main");
    assert!(
        log.contains(" stdout foo=bar baz arg=first arg host=env-pod\n"),
        "{log}"
    );
    assert!(log.contains(" stdout /tmp\n"), "{log}");
    assert!(log.contains(" stderr oops\n"), "{log}");
    if let Some(pid) = pid {
        assert!(!alive(pid));
    }
    // Restarting an exited container starts a new process with a new log; the run before's
    // becomes the previous log.
    let st = rt
        .start_container(&sb, &sh("main", "echo second run; exit 0"))
        .await
        .unwrap();
    assert!(st.is_running() || matches!(st, ContainerState::Exited { .. }));
    wait_exit(&mut exits, &sb.uid, "main", Duration::from_secs(10)).await;
    assert!(matches!(
        state(&rt, &sb, "main").await,
        ContainerState::Exited { exit_code: 0, .. }
    ));
    let log = log_text(&rt, &sb, "main");
    let previous = std::fs::read_to_string(rt.previous_log_path(&sb.uid, "main")).unwrap();
    assert!(
        previous.contains(" stderr oops\n") && !log.contains("oops"),
        "the first run's log is kept as the previous one: {previous}"
    );
    assert!(log.contains(" stdout second run"), "{log}");
    rt.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_is_an_exit_and_a_restarted_runtime_adopts_running_pods() {
    let h = Harness::new("adopt");
    let rt = h.runtime();
    let mut exits = rt.exits();
    let sb = rt
        .create_sandbox(&h.sandbox_spec("adopt-pod"))
        .await
        .unwrap();
    let a = running_pid(
        &rt.start_container(&sb, &host_container("a", &["sleep", "1000"]))
            .await
            .unwrap(),
    );
    let b = running_pid(
        &rt.start_container(&sb, &host_container("b", &["sleep", "1000"]))
            .await
            .unwrap(),
    );

    // SIGKILL from outside is noticed as an exit with signal 9.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_exit(&mut exits, &sb.uid, "a", Duration::from_secs(5)).await;
    match state(&rt, &sb, "a").await {
        ContainerState::Exited {
            exit_code,
            signal,
            reason,
            ..
        } => assert_eq!(
            (exit_code, signal, reason.as_str()),
            (137, Some(9), "Error")
        ),
        other => panic!("{other:?}"),
    }

    // Simulated agent restart: a new runtime on the same state directory.
    drop(exits);
    drop(rt);
    let rt2 = h.runtime();
    let mut exits2 = rt2.exits();
    let listed = rt2.list_sandboxes().await.unwrap();
    assert_eq!(listed, vec![sb.clone()], "the sandbox is adopted as it was");
    assert_eq!(
        running_pid(&state(&rt2, &listed[0], "b").await),
        b,
        "same pid, not restarted"
    );
    assert!(matches!(
        state(&rt2, &listed[0], "a").await,
        ContainerState::Exited {
            signal: Some(9),
            ..
        }
    ));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(b as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_exit(&mut exits2, &sb.uid, "b", Duration::from_secs(5)).await;
    assert!(matches!(
        state(&rt2, &sb, "b").await,
        ContainerState::Exited {
            exit_code: 137,
            signal: Some(9),
            ..
        }
    ));
    rt2.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(rt2.list_sandboxes().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_waits_for_the_grace_period_then_kills() {
    let h = Harness::new("stop");
    let rt = h.runtime();
    let sb = rt
        .create_sandbox(&h.sandbox_spec("stop-pod"))
        .await
        .unwrap();
    // Ignores SIGTERM (the disposition is inherited by its sleep children too).
    let stubborn = rt
        .start_container(
            &sb,
            &sh(
                "stubborn",
                "trap '' TERM; echo ready; while :; do sleep 0.1; done",
            ),
        )
        .await
        .unwrap();
    let stubborn_pid = running_pid(&stubborn);
    let polite = running_pid(
        &rt.start_container(&sb, &host_container("polite", &["sleep", "1000"]))
            .await
            .unwrap(),
    );
    eventually_within("the trap to be set", Duration::from_secs(5), || async {
        log_text(&rt, &sb, "stubborn").contains("stdout ready")
    })
    .await;

    let grace = Duration::from_millis(1000);
    let t0 = Instant::now();
    rt.stop_container(&sb, "polite", grace).await.unwrap();
    assert!(
        t0.elapsed() < grace,
        "SIGTERM is enough for sleep: {:?}",
        t0.elapsed()
    );
    assert!(matches!(
        state(&rt, &sb, "polite").await,
        ContainerState::Exited {
            exit_code: 143,
            signal: Some(15),
            ..
        }
    ));
    assert!(!alive(polite));

    let t0 = Instant::now();
    rt.stop_container(&sb, "stubborn", grace).await.unwrap();
    let took = t0.elapsed();
    assert!(
        took >= grace,
        "killed before the grace period ended: {took:?}"
    );
    assert!(took < grace + Duration::from_secs(3), "took {took:?}");
    assert!(matches!(
        state(&rt, &sb, "stubborn").await,
        ContainerState::Exited {
            exit_code: 137,
            signal: Some(9),
            ..
        }
    ));
    assert!(!alive(stubborn_pid));
    assert!(!populated(&sb.cgroup_dir), "no process left in the pod");
    // Stopping an exited container is a no-op.
    rt.stop_container(&sb, "stubborn", grace).await.unwrap();
    rt.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_sandbox_leaves_no_process_cgroup_or_netns() {
    let h = Harness::new("remove");
    let rt = h.runtime();
    let sb = rt.create_sandbox(&h.sandbox_spec("rm-pod")).await.unwrap();
    let netns_name = sb
        .netns_path
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    // A container that leaves a background child behind, and one that ignores SIGTERM.
    let forker = running_pid(
        &rt.start_container(
            &sb,
            &sh("forker", "sleep 1000 & echo $! > /dev/null; sleep 1000"),
        )
        .await
        .unwrap(),
    );
    let stubborn = running_pid(
        &rt.start_container(
            &sb,
            &sh("stubborn", "trap '' TERM; while :; do sleep 0.1; done"),
        )
        .await
        .unwrap(),
    );
    let mut pids: Vec<u32> =
        eventually_within("the background child", Duration::from_secs(5), || async {
            let pids: Vec<u32> = std::fs::read_to_string(sb.cgroup_dir.join("forker/cgroup.procs"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            (pids.len() >= 3).then_some(pids)
        })
        .await;
    pids.push(stubborn);
    let shim_pids: Vec<u32> = ["forker", "stubborn"]
        .iter()
        .map(|c| {
            let v: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(
                    h.state_dir()
                        .join(format!("pods/{}/containers/{c}/pids.json", sb.uid)),
                )
                .unwrap(),
            )
            .unwrap();
            v["shim_pid"].as_u64().unwrap() as u32
        })
        .collect();
    assert!(pids.contains(&forker));

    let t0 = Instant::now();
    rt.remove_sandbox(&sb, Duration::from_millis(500))
        .await
        .expect("remove");
    assert!(t0.elapsed() < Duration::from_secs(5));
    for pid in pids.iter().chain(&shim_pids) {
        assert!(!alive(*pid), "process {pid} survived");
    }
    assert!(!sb.cgroup_dir.exists(), "pod cgroup removed");
    assert!(!sb.netns_path.exists(), "netns file removed");
    assert!(!ip_netns_list().contains(&netns_name));
    assert!(!sb.uts_path.exists() && !sb.ipc_path.exists());
    assert!(
        !h.state_dir().join("pods").join(&sb.uid).exists(),
        "state removed"
    );
    let tmp = h.tmp.path().to_string_lossy().into_owned();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains(&tmp),
        "nothing left mounted in the state dir"
    );
    assert!(!mountinfo.contains(&netns_name));
    // Idempotent; and the runtime no longer knows the pod.
    rt.remove_sandbox(&sb, Duration::from_millis(100))
        .await
        .expect("remove again");
    assert!(rt.list_sandboxes().await.unwrap().is_empty());
    assert!(matches!(
        rt.start_container(&sb, &sh("late", "true")).await,
        Err(RuntimeError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_failures_have_clear_reasons() {
    let h = Harness::new("fail");
    let rt = h.runtime();
    let sb = rt
        .create_sandbox(&h.sandbox_spec("fail-pod"))
        .await
        .unwrap();

    let t0 = Instant::now();
    match rt
        .start_container(&sb, &host_container("nocmd", &["nosuchcmd-xyz", "arg"]))
        .await
        .unwrap()
    {
        ContainerState::Exited {
            exit_code,
            reason,
            message,
            ..
        } => {
            assert_eq!((exit_code, reason.as_str()), (127, "StartError"));
            assert_eq!(message, "exec \"nosuchcmd-xyz\": No such file or directory");
        }
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5));

    let mut spec = host_container("nowd", &["true"]);
    spec.working_dir = Some("/nonexistent-skiff-dir".into());
    match rt.start_container(&sb, &spec).await.unwrap() {
        ContainerState::Exited {
            exit_code,
            reason,
            message,
            ..
        } => {
            assert_eq!((exit_code, reason.as_str()), (126, "StartError"));
            assert_eq!(
                message,
                "chdir \"/nonexistent-skiff-dir\": No such file or directory"
            );
        }
        other => panic!("{other:?}"),
    }

    let not_exec = h.tmp.path().join("not-executable");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    match rt
        .start_container(
            &sb,
            &host_container("noexec", &[not_exec.to_str().unwrap()]),
        )
        .await
        .unwrap()
    {
        ContainerState::Exited {
            exit_code, message, ..
        } => {
            assert_eq!(exit_code, 126);
            assert!(message.ends_with(": Permission denied"), "{message}");
        }
        other => panic!("{other:?}"),
    }

    let mut spec = host_container("web", &["/bin/sh"]);
    spec.image = Image::RootFs("/x-skiff-missing-root".into());
    let err = rt
        .start_container(&sb, &spec)
        .await
        .expect_err("missing rootfs");
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err}");
    assert!(
        err.to_string()
            .contains("containers[web].image: root directory /x-skiff-missing-root does not exist"),
        "{err}"
    );
    assert!(rt.container_state(&sb, "web").await.unwrap().is_none());
    rt.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
}

/// A root filesystem with a static busybox.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("busybox-static is required (apt-get install busybox-static)");
    let root = dir.join("rootfs");
    for d in ["bin", "proc", "dev", "tmp", "etc"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    for applet in ["sh", "echo", "ls", "cat", "hostname", "sleep", "ps"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("etc/marker"), "inside the rootfs\n").unwrap();
    root
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rootfs_container_with_its_own_pid_namespace() {
    let h = Harness::new("rootfs");
    let rt = h.runtime();
    let root = busybox_rootfs(h.tmp.path());
    let mut spec = h.sandbox_spec("rootfs-pod");
    spec.pid_namespace = true;
    let sb = rt.create_sandbox(&spec).await.unwrap();
    let c = ContainerSpec {
        name: "box".into(),
        image: Image::RootFs(root.clone()),
        argv: vec![
            "sh".into(),
            "-c".into(),
            "echo pid=$$; hostname; ls /; cat /etc/marker; exec sleep 1000".into(),
        ],
        env: vec![("PATH".into(), "/bin".into())],
        working_dir: Some("/tmp".into()),
        limits: Limits::default(),
        mounts: vec![],
        security: Default::default(),
        stdio: Default::default(),
        target: None,
    };
    let pid = running_pid(&rt.start_container(&sb, &c).await.unwrap());
    eventually_within("the container's output", Duration::from_secs(5), || async {
        log_text(&rt, &sb, "box").contains("inside the rootfs")
    })
    .await;
    let log = log_text(&rt, &sb, "box");
    assert!(
        log.contains(" stdout pid=1\n"),
        "PID 1 in its namespace: {log}"
    );
    assert!(log.contains(" stdout rootfs-pod\n"), "{log}");
    assert!(
        log.contains(" stdout bin\n") && !log.contains(" stdout usr\n"),
        "{log}"
    );
    // Exec joins the container's mount and PID namespaces.
    let out = rt
        .exec(
            &sb,
            "box",
            &[
                "sh".into(),
                "-c".into(),
                "cat /etc/marker; echo $$; pwd".into(),
            ],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.exit_code,
        0,
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "inside the rootfs");
    let exec_pid: u32 = lines[1].parse().unwrap();
    assert!(
        exec_pid < 100,
        "a pid of the container's namespace: {exec_pid}"
    );
    assert_eq!(lines[2], "/tmp");
    // Nothing the container mounted is visible on the host.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(root.to_str().unwrap()), "{mountinfo}");
    rt.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(!alive(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_rotate_at_the_size_limit() {
    let h = Harness::new("logs");
    let mut cfg = h.config();
    cfg.log_max_bytes = 2000;
    cfg.log_max_files = 3;
    let rt = NativeRuntime::new(cfg).unwrap();
    let mut exits = rt.exits();
    let sb = rt.create_sandbox(&h.sandbox_spec("log-pod")).await.unwrap();
    rt.start_container(
        &sb,
        &sh(
            "chatty",
            "i=0; while [ $i -lt 200 ]; do echo \"line $i\"; i=$((i+1)); done; echo bye >&2",
        ),
    )
    .await
    .unwrap();
    wait_exit(&mut exits, &sb.uid, "chatty", Duration::from_secs(10)).await;
    let path = rt.log_path(&sb.uid, "chatty");
    let rotated = |n: u32| PathBuf::from(format!("{}.{n}", path.display()));
    for p in [path.clone(), rotated(1), rotated(2)] {
        let len = std::fs::metadata(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .len();
        assert!(len > 0 && len <= 2000, "{}: {len} bytes", p.display());
    }
    assert!(!rotated(3).exists(), "at most log_max_files files");
    let current = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = current.lines().collect();
    assert!(lines.len() >= 2, "{current}");
    let last_out = lines[lines.len() - 2];
    let (ts, rest) = last_out.split_once(' ').unwrap();
    assert_eq!(rest, "stdout line 199");
    assert!(
        ts.len() == "2026-11-22T05:00:00.123Z".len()
            && ts.ends_with('Z')
            && ts.as_bytes()[10] == b'T',
        "{ts}"
    );
    assert!(lines[lines.len() - 1].ends_with(" stderr bye"));
    // Rotation keeps order: .1 ends where the current file starts.
    let older = std::fs::read_to_string(rotated(1)).unwrap();
    let last_older: u32 = older
        .lines()
        .last()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let first_current: u32 = lines[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(last_older + 1, first_current);
    rt.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_report_follows_the_v2_controllers() {
    let h = Harness::new("limits");
    let rt = h.runtime();
    let offered: Vec<String> = std::fs::read_to_string(h.v2_root.join("cgroup.controllers"))
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let limits = Limits {
        cpu_millis: Some(500),
        memory_bytes: Some(64 << 20),
        pids: Some(100),
    };
    let report = rt.limit_report(&limits);
    for kind in ["cpu", "memory", "pids"] {
        let prefix = format!("{kind}: ");
        let enforced = report.enforced.iter().any(|e| e.starts_with(&prefix));
        let not = report.not_enforced.iter().any(|e| e.starts_with(&prefix));
        if offered.iter().any(|c| c == kind) {
            assert!(
                enforced && !not,
                "{kind} is offered by cgroup v2: {report:?}"
            );
        } else {
            assert!(
                !enforced && not,
                "{kind} is missing from cgroup v2: {report:?}"
            );
            assert!(
                report
                    .not_enforced
                    .iter()
                    .any(|e| e.starts_with(&format!("{kind}: controller missing from cgroup v2"))),
                "{report:?}"
            );
        }
    }
    assert!(rt.limit_report(&Limits::default()).enforced.is_empty());
    assert!(rt.limit_report(&Limits::default()).not_enforced.is_empty());

    // Limits that cannot be enforced do not stop a pod from running.
    let mut spec = h.sandbox_spec("limited-pod");
    spec.limits = limits.clone();
    let sb = rt.create_sandbox(&spec).await.unwrap();
    let mut c = host_container("c", &["sleep", "1000"]);
    c.limits = limits;
    let st = rt.start_container(&sb, &c).await.unwrap();
    assert!(st.is_running());
    for (kind, file) in [
        ("cpu", "cpu.max"),
        ("memory", "memory.max"),
        ("pids", "pids.max"),
    ] {
        let has = offered.iter().any(|o| o == kind);
        assert_eq!(sb.cgroup_dir.join("c").join(file).exists(), has, "{file}");
    }
    rt.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
}

const AGENT_STATE_ENV: &str = "SKIFF_TEST_AGENT_STATE";
const AGENT_CGROUP_ENV: &str = "SKIFF_TEST_AGENT_CGROUP";

/// Not a test of its own: the "agent" process that `containers_survive_an_agent_kill_9`
/// starts (this test binary again) and SIGKILLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of containers_survive_an_agent_kill_9"]
async fn agent_process_for_kill_test() {
    let (Ok(state_dir), Ok(cgroup_parent)) = (
        std::env::var(AGENT_STATE_ENV),
        std::env::var(AGENT_CGROUP_ENV),
    ) else {
        panic!(
            "run only by containers_survive_an_agent_kill_9, which sets {AGENT_STATE_ENV} and {AGENT_CGROUP_ENV}"
        );
    };
    let rt = NativeRuntime::new(NativeConfig::new(
        state_dir.into(),
        cgroup_parent.into(),
        PathBuf::from(SHIM),
    ))
    .unwrap();
    let sb = rt
        .create_sandbox(&SandboxSpec {
            uid: unique("uid"),
            namespace: "default".into(),
            name: "kill9-pod".into(),
            hostname: "kill9-pod".into(),
            pid_namespace: false,
            share_pid_namespace: false,
            mount_namespace: false,
            limits: Limits::default(),
        })
        .await
        .unwrap();
    let pid = running_pid(
        &rt.start_container(&sb, &sh("c", "echo started; exec sleep 1000"))
            .await
            .unwrap(),
    );
    println!("READY {} {pid}", sb.uid);
    tokio::time::sleep(Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_survive_an_agent_kill_9() {
    use tokio::io::AsyncBufReadExt;
    let h = Harness::new("kill9");
    let mut agent = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "agent_process_for_kill_test",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(AGENT_STATE_ENV, h.state_dir())
        .env(AGENT_CGROUP_ENV, &h.cgroup_parent)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(agent.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            // libtest prints `test NAME ... ` before the helper's own output.
            if let Some((_, rest)) = line.split_once("READY ") {
                return rest.trim().to_string();
            }
        }
        panic!("the agent process ended without starting its pod");
    })
    .await
    .expect("agent process ready");
    let (uid, pid) = ready.split_once(' ').unwrap();
    let pid: u32 = pid.parse().unwrap();

    agent.start_kill().unwrap(); // SIGKILL
    agent.wait().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(alive(pid), "the container outlives the agent");

    let rt = h.runtime();
    let mut exits = rt.exits();
    let sandboxes = rt.list_sandboxes().await.unwrap();
    assert_eq!(sandboxes.len(), 1);
    let sb = &sandboxes[0];
    assert_eq!(sb.uid, uid);
    assert_eq!(running_pid(&state(&rt, sb, "c").await), pid);
    assert!(log_text(&rt, sb, "c").contains(" stdout started"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_exit(&mut exits, uid, "c", Duration::from_secs(5)).await;
    assert!(matches!(
        state(&rt, sb, "c").await,
        ContainerState::Exited {
            signal: Some(9),
            reason,
            ..
        } if reason == "Error"
    ));
    rt.remove_sandbox(sb, Duration::from_secs(1)).await.unwrap();
}

/// A root filesystem whose /usr is the node's, mounted read-only, so the node's tools (dash,
/// coreutils, util-linux mount, python3) run inside it.
fn host_tools_rootfs(dir: &Path) -> (PathBuf, Vec<Mount>) {
    let root = dir.join("tools-rootfs");
    for d in ["usr", "etc", "tmp", "data", "ro"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(to, root.join(link)).unwrap();
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
    let mounts = vec![Mount {
        source: "/usr".into(),
        destination: "/usr".into(),
        read_only: true,
        sub_path: None,
    }];
    (root, mounts)
}

/// Loads a two-instruction socket filter with bpf(BPF_PROG_LOAD); prints `bpf-ok` or
/// `bpf-denied <errno>`. Then keyctl(KEYCTL_GET_KEYRING_ID, session), which any user may
/// call unless seccomp refuses it.
const PROBE_PY: &str = r#"
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
insns = ctypes.create_string_buffer(struct.pack('<BBhiBBhi', 0xb7, 0, 0, 0, 0x95, 0, 0, 0))
lic = ctypes.create_string_buffer(b'GPL')
attr = ctypes.create_string_buffer(struct.pack('<IIQQ', 1, 2, ctypes.addressof(insns), ctypes.addressof(lic)), 128)
r = libc.syscall(321, 5, attr, 128)
print('bpf-ok' if r >= 0 else 'bpf-denied %d' % ctypes.get_errno())
r = libc.syscall(250, 0, -3, 1)
print('keyctl-ok' if r >= 0 else 'keyctl-denied %d' % ctypes.get_errno())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confinement_like_containerds_defaults() {
    let h = Harness::new("confine");
    let rt = h.runtime();
    let (root, usr) = host_tools_rootfs(h.tmp.path());
    let sb = rt
        .create_sandbox(&h.sandbox_spec("confined-pod"))
        .await
        .unwrap();
    let probe = h.tmp.path().join("probe.py");
    std::fs::write(&probe, PROBE_PY).unwrap();
    let probe_mount = Mount {
        source: probe.clone(),
        destination: "/probe.py".into(),
        read_only: true,
        sub_path: None,
    };
    let report = "grep -E '^(Cap(Bnd|Eff)|NoNewPrivs|Seccomp):' /proc/self/status; \
        id -u; id -g; id -G; \
        mount -t tmpfs none /tmp 2>/dev/null && echo mount-ok || echo mount-denied; \
        python3 /probe.py; \
        echo timer_list=$(wc -c < /proc/timer_list); \
        echo sys=$(grep ' /sys sysfs ' /proc/self/mounts | cut -d' ' -f4 | cut -c1-2); \
        echo pids=$(ls /proc | grep -c '^[0-9]'); \
        touch /rootfile 2>/dev/null && echo root-rw || echo root-ro; \
        touch /data/x 2>/dev/null && echo data-rw || echo data-ro; \
        touch /ro/x 2>/dev/null && echo ro-rw || echo ro-ro; \
        echo report-done; exec sleep 1000";
    let container = |name: &str, security: Security, mounts: Vec<Mount>| ContainerSpec {
        name: name.into(),
        image: Image::RootFs(root.clone()),
        argv: vec!["/bin/sh".into(), "-c".into(), report.into()],
        env: vec![],
        working_dir: Some("/".into()),
        limits: Limits::default(),
        mounts,
        security,
        stdio: Default::default(),
        target: None,
    };
    let run = |name: &'static str| {
        let (rt, sb) = (&rt, &sb);
        async move {
            eventually_within(name, Duration::from_secs(10), || async {
                log_text(rt, sb, name).contains("report-done")
            })
            .await;
            log_text(rt, sb, name)
        }
    };
    let has = |log: &str, line: &str| log.lines().any(|l| l.ends_with(&format!(" {line}")));

    // Privileged: every capability, nothing masked, BPF loads.
    let privileged = Security {
        pid_namespace: true,
        ..Security::default()
    };
    rt.start_container(
        &sb,
        &container(
            "privileged",
            privileged,
            vec![usr[0].clone(), probe_mount.clone()],
        ),
    )
    .await
    .unwrap();
    let log = run("privileged").await;
    assert!(has(&log, "bpf-ok"), "{log}");
    assert!(has(&log, "mount-ok"), "{log}");
    assert!(has(&log, "sys=rw"), "{log}");
    assert!(!has(&log, "timer_list=0"), "not masked: {log}");

    // containerd's default without NET_RAW, as root: the bounding and effective sets hold
    // exactly the 13 others; no mount, no BPF, masked /proc/timer_list, read-only /sys, only
    // its own processes.
    let mut restricted = Security::restricted();
    restricted
        .capabilities
        .as_mut()
        .unwrap()
        .retain(|c| c != "CAP_NET_RAW");
    rt.start_container(
        &sb,
        &container(
            "restricted",
            restricted,
            vec![usr[0].clone(), probe_mount.clone()],
        ),
    )
    .await
    .unwrap();
    let log = run("restricted").await;
    // CAP_CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6, SETUID 7,
    // SETPCAP 8, NET_BIND_SERVICE 10, SYS_CHROOT 18, MKNOD 27, AUDIT_WRITE 29, SETFCAP 31.
    let expected = "00000000a80405fb";
    assert!(has(&log, &format!("CapBnd:\t{expected}")), "{log}");
    assert!(has(&log, &format!("CapEff:\t{expected}")), "{log}");
    assert!(has(&log, "mount-denied"), "{log}");
    assert!(has(&log, "bpf-denied 1"), "{log}");
    assert!(has(&log, "keyctl-ok"), "no seccomp filter here: {log}");
    assert!(has(&log, "timer_list=0"), "{log}");
    assert!(has(&log, "sys=ro"), "{log}");
    let pids: u32 = log
        .lines()
        .find_map(|l| l.split(" pids=").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(999);
    assert!(pids <= 5, "only the container's own processes: {log}");

    // A user, groups, a read-only root, no_new_privs, the RuntimeDefault seccomp profile, and
    // volumes: one writable, one read-only.
    let data = h.tmp.path().join("data-volume");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let ro = h.tmp.path().join("ro-volume");
    std::fs::create_dir(&ro).unwrap();
    let user = Security {
        uid: Some(1000),
        gid: Some(1001),
        groups: vec![2000, 1001],
        no_new_privs: true,
        read_only_root: true,
        seccomp: Seccomp::RuntimeDefault,
        ..Security::restricted()
    };
    let mounts = vec![
        usr[0].clone(),
        probe_mount.clone(),
        Mount {
            source: data.clone(),
            destination: "/data".into(),
            read_only: false,
            sub_path: None,
        },
        Mount {
            source: ro.clone(),
            destination: "/ro".into(),
            read_only: true,
            sub_path: None,
        },
    ];
    rt.start_container(&sb, &container("user", user, mounts))
        .await
        .unwrap();
    let log = run("user").await;
    for line in [
        "1000",
        "1001",
        "CapEff:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "keyctl-denied 1",
        "root-ro",
        "data-rw",
        "ro-ro",
        "mount-denied",
    ] {
        assert!(has(&log, line), "{line:?} in {log}");
    }
    assert!(
        log.lines()
            .any(|l| l.ends_with(" 1001 2000") || l.ends_with(" 2000 1001")),
        "groups: {log}"
    );
    let written = std::fs::metadata(data.join("x")).unwrap();
    assert_eq!((written.uid(), written.gid()), (1000, 1001));

    // An exec runs with the container's identity and filter.
    let out = rt
        .exec(
            &sb,
            "user",
            &[
                "/bin/sh".into(),
                "-c".into(),
                "id -u; grep -E '^(Seccomp|CapEff):' /proc/self/status".into(),
            ],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout,
        "1000\nCapEff:\t0000000000000000\nSeccomp:\t2\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rt.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(root.to_str().unwrap()), "{mountinfo}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_pid_namespace_shows_every_container_of_the_pod() {
    let h = Harness::new("sharepid");
    let rt = h.runtime();
    let root = busybox_rootfs(h.tmp.path());
    let mut spec = h.sandbox_spec("shared-pid");
    spec.share_pid_namespace = true;
    let sb = rt.create_sandbox(&spec).await.unwrap();
    let holder = sb.pid_holder.clone().expect("a PID namespace holder");
    assert!(alive(holder.pid));
    let c = |name: &str, script: &str| ContainerSpec {
        name: name.into(),
        image: Image::RootFs(root.clone()),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), "/bin".into())],
        working_dir: None,
        limits: Limits::default(),
        mounts: vec![],
        security: Security {
            pid_namespace: true,
            ..Security::default()
        },
        stdio: Default::default(),
        target: None,
    };
    rt.start_container(&sb, &c("first", "exec sleep 1001"))
        .await
        .unwrap();
    rt.start_container(
        &sb,
        &c(
            "second",
            "echo self=$$; for p in /proc/[0-9]*; do echo cmd=$(cat $p/cmdline | tr '\\0' ' '); done; exec sleep 1002",
        ),
    )
    .await
    .unwrap();
    eventually_within(
        "the second container's listing",
        Duration::from_secs(5),
        || async {
            log_text(&rt, &sb, "second").contains("cmd=sleep 1002")
                || log_text(&rt, &sb, "second").contains("cmd=sh -c")
        },
    )
    .await;
    let log = log_text(&rt, &sb, "second");
    let lines: Vec<&str> = log.lines().collect();
    assert!(
        lines.iter().any(|l| l.ends_with(" stdout cmd=sleep 1001")),
        "sees the first container: {log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" stdout cmd=") && l.contains(" --pause ")),
        "the holder is there: {log}"
    );
    assert!(!log.contains(" stdout self=1\n"), "not PID 1 itself: {log}");
    // Teardown stops the holder with the containers.
    rt.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(!alive(holder.pid), "the holder is gone");
}

/// A subPath is mounted from the descriptor of a no-follow walk done by the container's
/// process itself right before the mount: a directory of the volume is mounted, a symlink
/// component (a container planted one, to a node directory) refuses the start and shows
/// nothing of the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subpath_mount_never_follows_a_symlink() {
    let h = Harness::new("subpath");
    let rt = h.runtime();
    let root = busybox_rootfs(h.tmp.path());
    let sb = rt
        .create_sandbox(&h.sandbox_spec("subpath-pod"))
        .await
        .unwrap();
    let node_dir = h.tmp.path().join("node-dir");
    std::fs::create_dir(&node_dir).unwrap();
    std::fs::write(node_dir.join("node-secret"), "node-only\n").unwrap();
    let vol = h.tmp.path().join("volume");
    std::fs::create_dir_all(vol.join("real")).unwrap();
    std::fs::write(vol.join("real/mine"), "mine\n").unwrap();
    std::os::unix::fs::symlink(&node_dir, vol.join("evil")).unwrap();
    std::fs::create_dir(vol.join("real/deeper")).unwrap();
    std::os::unix::fs::symlink(&node_dir, vol.join("real/deeper/link")).unwrap();
    let c = |name: &str, sub: &str| ContainerSpec {
        name: name.into(),
        image: Image::RootFs(root.clone()),
        argv: vec![
            "sh".into(),
            "-c".into(),
            "cat /vol/mine /vol/node-secret; echo done; exec sleep 1000".into(),
        ],
        env: vec![("PATH".into(), "/bin".into())],
        working_dir: None,
        limits: Limits::default(),
        mounts: vec![Mount {
            source: vol.clone(),
            destination: "/vol".into(),
            read_only: false,
            sub_path: Some(skiff_runtime::volume::SubPath {
                path: sub.into(),
                data_link: false,
            }),
        }],
        security: Default::default(),
        stdio: Default::default(),
        target: None,
    };
    assert!(
        rt.start_container(&sb, &c("ok", "real"))
            .await
            .unwrap()
            .is_running()
    );
    eventually_within("the container's output", Duration::from_secs(5), || async {
        log_text(&rt, &sb, "ok").contains("done")
    })
    .await;
    let log = log_text(&rt, &sb, "ok");
    assert!(
        log.contains(" stdout mine\n") && !log.contains("node-only"),
        "{log}"
    );
    for (name, sub) in [("evil", "evil"), ("deep", "real/deeper/link")] {
        match rt.start_container(&sb, &c(name, sub)).await.unwrap() {
            ContainerState::Exited {
                reason, message, ..
            } => {
                assert_eq!(reason, "StartError", "{message}");
                assert!(message.contains("is a symbolic link"), "{message}");
            }
            other => panic!("{sub}: the symlink was mounted: {other:?}"),
        }
        assert!(!log_text(&rt, &sb, name).contains("node-only"));
    }
    rt.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
}

/// Reads from `r` until what was read contains `want` (or 10 s pass).
async fn read_until(r: &mut skiff_runtime::exec::ExecReader, want: &str) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&got).contains(want) {
        match tokio::time::timeout_at(deadline, r.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            other => panic!(
                "never read {want:?} ({other:?}): {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_clients_share_a_containers_stdin_terminal_and_output() {
    use skiff_runtime::exec::ExecOptions;
    use tokio::io::AsyncWriteExt as _;
    let h = Harness::new("attach");
    let rt = h.runtime();
    let mut exits = rt.exits();
    let sb = rt
        .create_sandbox(&h.sandbox_spec("attach-pod"))
        .await
        .unwrap();
    let stdin = ExecOptions {
        stdin: true,
        tty: false,
    };

    // A pipe: two clients see the same output; stdinOnce closes it when the writer leaves.
    let mut echo = sh("echo", "while read l; do echo got:$l; done; echo closed");
    echo.stdio.stdin = true;
    echo.stdio.stdin_once = true;
    assert!(rt.start_container(&sb, &echo).await.unwrap().is_running());
    let cdir = h
        .state_dir()
        .join("pods")
        .join(&sb.uid)
        .join("containers/echo/attach.sock");
    let mode = std::fs::metadata(&cdir).unwrap().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket is root's only");
    let mut watcher = rt
        .attach(&sb, "echo", ExecOptions::default())
        .await
        .unwrap();
    assert!(watcher.stdin.is_none(), "asked without stdin, got none");
    let mut writer = rt.attach(&sb, "echo", stdin).await.unwrap();
    let mut input = writer.stdin.take().expect("stdin");
    input.write_all(b"one\n").await.unwrap();
    read_until(&mut writer.stdout, "got:one").await;
    read_until(&mut watcher.stdout, "got:one").await;
    drop(input);
    drop(writer);
    wait_exit(&mut exits, &sb.uid, "echo", Duration::from_secs(10)).await;
    read_until(&mut watcher.stdout, "closed").await;
    assert_eq!(
        (&mut watcher.exit).await.unwrap(),
        0,
        "the session ends with it"
    );
    assert!(log_text(&rt, &sb, "echo").contains(" stdout got:one\n"));
    assert!(!cdir.exists(), "the socket goes with the container");
    assert!(rt.attach(&sb, "echo", stdin).await.is_err());

    // A terminal: typed input echoed and answered, resizes seen, output logged; a client
    // that goes away leaves the container running.
    let mut term = sh("term", "exec /bin/sh -i");
    term.stdio = skiff_runtime::StdioSpec {
        stdin: true,
        stdin_once: false,
        tty: true,
    };
    // A PID namespace of its own, which the last container below joins.
    term.security.pid_namespace = true;
    assert!(rt.start_container(&sb, &term).await.unwrap().is_running());
    let mut s = rt.attach(&sb, "term", stdin).await.unwrap();
    assert!(s.stderr.is_none(), "a terminal has one output");
    s.terminal
        .as_ref()
        .expect("terminal")
        .resize(91, 17)
        .unwrap();
    let mut input = s.stdin.take().expect("stdin");
    input
        .write_all(b"stty size; echo $((6*7))x\n")
        .await
        .unwrap();
    let out = read_until(&mut s.stdout, "42x").await;
    assert!(
        out.contains("17 91"),
        "the resize reached the terminal: {out:?}"
    );
    drop(input);
    drop(s);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(state(&rt, &sb, "term").await.is_running());
    assert!(log_text(&rt, &sb, "term").contains("42x"));

    // An ephemeral-style container in the terminal's PID namespace sees its processes.
    let mut ps = sh(
        "ps",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
    );
    ps.target = Some("term".into());
    rt.start_container(&sb, &ps).await.unwrap();
    wait_exit(&mut exits, &sb.uid, "ps", Duration::from_secs(10)).await;
    let seen = log_text(&rt, &sb, "ps");
    assert!(seen.contains("/bin/sh -i"), "{seen}");
    assert!(
        !seen.contains("shim"),
        "only the target's namespace, not the node's (where the shims run): {seen}"
    );
    rt.remove_sandbox(&sb, Duration::from_secs(1))
        .await
        .unwrap();
}
