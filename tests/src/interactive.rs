//! kubectl's interactive commands as a user drives them from a laptop: a real terminal
//! (a tmux server of the test's own), `kubectl cp` both ways, and what is left of a session
//! on the node. Shared by the tests that run them on a [`crate::cluster::Cluster`]
//! and on a cluster `cargo xtask up` started ([`crate::up::UpCluster`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::ok;

/// How long a typed line's answer, or a copy, may take.
const T: Duration = Duration::from_secs(30);

/// A cluster with a laptop outside it, where kubectl runs.
pub trait Laptop {
    /// kubectl 1.32 on the laptop, with the laptop's kubeconfig.
    fn kubectl_cmd(&self, args: &[&str]) -> Command;
    /// `program` on the laptop.
    fn on_laptop(&self, program: &str) -> Command;
    /// The laptop's network namespace.
    fn laptop_netns(&self) -> PathBuf;

    /// Runs kubectl on the laptop and waits for it.
    fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("running kubectl")
    }

    /// `kubectl get <args> -o jsonpath=<path>`'s output.
    fn jsonpath(&self, args: &[&str], path: &str) -> String {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        let p = format!("jsonpath={path}");
        a.extend_from_slice(&["-o", &p]);
        String::from_utf8_lossy(&self.kubectl(&a).stdout).into_owned()
    }
}

impl Laptop for crate::cluster::Cluster {
    fn kubectl_cmd(&self, args: &[&str]) -> Command {
        self.laptop_kubectl_cmd(args)
    }
    fn on_laptop(&self, program: &str) -> Command {
        self.laptop.command(program)
    }
    fn laptop_netns(&self) -> PathBuf {
        self.laptop.netns.path()
    }
}

impl Laptop for crate::up::UpCluster {
    fn kubectl_cmd(&self, args: &[&str]) -> Command {
        crate::up::UpCluster::kubectl_cmd(self, args)
    }
    fn on_laptop(&self, program: &str) -> Command {
        self.laptop(program)
    }
    fn laptop_netns(&self) -> PathBuf {
        Path::new("/run/netns").join(crate::up::OUTSIDE)
    }
}

/// A tmux server of the test's own (its socket in a temporary directory) on the laptop,
/// with one session `t`.
#[derive(Debug)]
pub struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    /// A session `t` on the laptop running `kubectl`, 80x24. The screen keeps kubectl's
    /// last words when it exits.
    pub fn running(c: &impl Laptop, dir: &Path, name: &str, kubectl: Command) -> Tmux {
        let tmux = Tmux {
            socket: dir.join(name),
        };
        let mut line = vec![format!("{:?}", kubectl.get_program())];
        line.extend(kubectl.get_args().map(|a| format!("{a:?}")));
        let mut server = c.on_laptop("tmux");
        server
            .arg("-S")
            .arg(&tmux.socket)
            .args(["new-session", "-d", "-s", "t", "-x", "80", "-y", "24"])
            .arg(format!(
                "{}; echo kubectl exited $?; sleep 1000",
                line.join(" ")
            ));
        ok(&server.output().expect("running tmux"));
        tmux
    }

    /// Runs a tmux command against this server.
    pub fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("running tmux")
    }

    /// What the session's window shows.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "t"]).stdout).into_owned()
    }

    /// Types `line` and Enter, then waits until the screen shows `expect`.
    pub fn type_and_see(&self, line: &str, expect: &str) -> Duration {
        let start = Instant::now();
        ok(&self.cmd(&["send-keys", "-t", "t", line, "Enter"]));
        loop {
            let screen = self.screen();
            if screen.contains(expect) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < T,
                "typed {line:?}, never saw {expect:?}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A shell on the session's terminal answers a typed command (`tag` makes its answer
    /// unique on the screen) and sees the window's size follow a resize from 80x24 to
    /// 100x30. Returns how long the typed command's answer took.
    pub fn shell_answers_and_follows_resizes(&self, tag: &str) -> Duration {
        let echo = self.type_and_see(&format!("echo $((6 * 7)){tag}"), &format!("42{tag}"));
        self.type_and_see("stty size", "24 80");
        ok(&self.cmd(&["resize-window", "-t", "t", "-x", "100", "-y", "30"]));
        self.type_and_see("stty size", "30 100");
        echo
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

/// `kubectl cp` of a 10 MB file of pseudo-random bytes into `pod`'s `container` (whose
/// filesystem is the host's: the `host` image) under `dir`, and back; both copies are
/// checked byte for byte (sha256 in the pod). Returns the two copies' durations.
pub fn cp_both_ways(
    c: &impl Laptop,
    pod: &str,
    container: &str,
    dir: &Path,
) -> (Duration, Duration) {
    let in_pod = dir.join(format!("in-{pod}"));
    std::fs::create_dir_all(&in_pod).expect("a directory for the pod's copy");
    let in_pod_file = in_pod.join("copy.bin");
    let in_pod_file = in_pod_file.to_str().expect("a UTF-8 path");
    let original = dir.join(format!("original-{pod}.bin"));
    let mut data = vec![0u8; 10 * 1024 * 1024];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in &mut data {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x.to_le_bytes()[0];
    }
    std::fs::write(&original, &data).expect("writing the original");
    let start = Instant::now();
    ok(&c.kubectl(&[
        "cp",
        original.to_str().expect("a UTF-8 path"),
        &format!("{pod}:{in_pod_file}"),
        "-c",
        container,
    ]));
    let up = start.elapsed();
    let sum = ok(&c.kubectl(&["exec", pod, "-c", container, "--", "sha256sum", in_pod_file]));
    let local = ok(&Command::new("sha256sum")
        .arg(&original)
        .output()
        .expect("running sha256sum"));
    assert_eq!(
        sum.split_whitespace().next(),
        local.split_whitespace().next(),
        "the copy in {pod} differs"
    );
    let back = dir.join(format!("back-{pod}.bin"));
    let start = Instant::now();
    ok(&c.kubectl(&[
        "cp",
        &format!("{pod}:{in_pod_file}"),
        back.to_str().expect("a UTF-8 path"),
        "-c",
        container,
    ]));
    let down = start.elapsed();
    assert!(
        std::fs::read(&back).expect("the copy back") == data,
        "the copy back from {pod} differs"
    );
    (up, down)
}

/// `kubectl exec` of `container` in `pod` from the laptop: stdin reaches the command
/// (`cat` answers `hi`), the command's exit code is kubectl's (`exit 4`), and output streams
/// while the command runs (the first line long before it ends). Returns how long the first
/// line took.
pub fn exec_streams(c: &impl Laptop, pod: &str, container: &str) -> Duration {
    use std::io::BufRead as _;
    let out = crate::run_with_stdin(
        c.kubectl_cmd(&["exec", "-i", pod, "-c", container, "--", "cat"]),
        "hi\n",
    );
    assert_eq!(ok(&out), "hi\n");
    let out = crate::run_with_stdin(
        c.kubectl_cmd(&[
            "exec",
            "-i",
            pod,
            "-c",
            container,
            "--",
            "sh",
            "-c",
            "wc -c; exit 4",
        ]),
        "twelve bytes",
    );
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "12");
    let start = Instant::now();
    let mut streaming = c
        .kubectl_cmd(&[
            "exec",
            pod,
            "-c",
            container,
            "--",
            "sh",
            "-c",
            "echo first; sleep 5; echo second",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("running kubectl");
    let mut lines = std::io::BufReader::new(streaming.stdout.take().expect("kubectl's stdout"));
    let mut first = String::new();
    lines.read_line(&mut first).expect("the first line");
    let first_after = start.elapsed();
    assert_eq!(first, "first\n");
    assert!(
        first_after < Duration::from_secs(4),
        "the first line came only after {first_after:?}"
    );
    let mut second = String::new();
    lines.read_line(&mut second).expect("the second line");
    assert_eq!(second, "second\n");
    assert!(streaming.wait().expect("kubectl ends").success());
    first_after
}

/// A running `kubectl port-forward <target> :<port>` on the laptop, reachable from the test
/// at [`PortForward::local`] (kubectl listens on the laptop's own loopback).
#[derive(Debug)]
pub struct PortForward {
    _kubectl: crate::Streaming,
    into_laptop: skiff_testnet::Forwarder,
}

impl PortForward {
    pub fn start(c: &impl Laptop, target: &str, port: u16) -> PortForward {
        let kubectl =
            crate::Streaming::spawn(c.kubectl_cmd(&["port-forward", target, &format!(":{port}")]));
        let line = kubectl
            .wait_for(&["Forwarding from 127.0.0.1:", &format!("-> {port}")], T)
            .expect("kubectl port-forward listening on the laptop");
        let local_port: u16 = line
            .split("127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .expect("kubectl names its local port");
        let into_laptop =
            skiff_testnet::Forwarder::start(&c.laptop_netns(), ([127, 0, 0, 1], local_port).into())
                .expect("a forwarder into the laptop");
        PortForward {
            _kubectl: kubectl,
            into_laptop,
        }
    }

    /// Where the test connects to reach the forwarded port.
    pub fn local(&self) -> std::net::SocketAddr {
        self.into_laptop.local()
    }
}

/// `kubectl debug <pod> --image=host --target=<target> -- ps -e -o args`: an ephemeral
/// container in the target's process namespace runs to completion. Returns its name and
/// what `ps` printed (its log).
pub async fn debug_ps(c: &impl Laptop, pod: &str, target: &str) -> (String, String) {
    let out = c.kubectl(&[
        "debug",
        pod,
        "--image=host",
        &format!("--target={target}"),
        "--",
        "ps",
        "-e",
        "-o",
        "args",
    ]);
    assert!(out.status.success(), "{out:?}");
    let name = c.jsonpath(&["pod", pod], "{.spec.ephemeralContainers[0].name}");
    assert!(name.starts_with("debugger-"), "{name}");
    crate::eventually_within("the ephemeral container ran", T, || async {
        let s = c.jsonpath(
            &["pod", pod],
            "{.status.ephemeralContainerStatuses[0].state.terminated.reason}",
        );
        (s == "Completed").then_some(()).ok_or(s)
    })
    .await;
    let ps = ok(&c.kubectl(&["logs", pod, "-c", &name]));
    (name, ps)
}

/// Pids of host processes whose command line is exactly `argv`.
pub fn processes(argv: &[&str]) -> Vec<u32> {
    let want = argv.join("\0") + "\0";
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want.as_bytes())
        })
        .collect()
}

/// How many pseudo-terminal masters process `pid` holds.
pub fn pty_masters(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().contains("ptmx"))
                })
                .count()
        })
        .unwrap_or(0)
}
