//! kubectl's streaming commands over SPDY/3.1, as kube-apiserver serves them to clients that
//! do not speak the WebSocket protocols (kubectl before 1.30/1.31, client-go's
//! `remotecommand.NewSPDYExecutor` and `portforward.New`): kubectl 1.32 on a laptop outside
//! the cluster (`skiff_tests::machines`) with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false` and
//! `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`, which make it upgrade to `SPDY/3.1` directly.
//!
//! `exec -i` with stdin, the command's exit code as kubectl's, output that streams while the
//! command runs, `exec -it` through a real terminal (tmux: a typed command's output, `stty
//! size` following a resize), `kubectl cp` of 10 MB both ways, `attach -i` to a stdin
//! container, a port-forwarded HTTP round trip, and a lost SPDY exec (kubectl killed) that
//! leaves no process of the session behind. kubectl has no fallback from SPDY to a WebSocket,
//! and its debug log shows the server's `101` answer with `Upgrade: SPDY/3.1`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use skiff_tests::cluster::Cluster;
use skiff_tests::interactive::{Laptop, PortForward, Tmux, cp_both_ways, exec_streams, processes};
use skiff_tests::{eventually_within, ok, run_with_stdin};

const T: Duration = Duration::from_secs(30);

/// The laptop's kubectl, told to use SPDY for exec, attach, cp and port-forward.
struct Spdy<'a>(&'a Cluster);

fn spdy_only(cmd: &mut Command) {
    cmd.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false");
}

impl Laptop for Spdy<'_> {
    fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = self.0.laptop_kubectl_cmd(args);
        spdy_only(&mut cmd);
        cmd
    }
    // tmux's server (started by this command) passes its environment to kubectl.
    fn on_laptop(&self, program: &str) -> Command {
        let mut cmd = self.0.laptop.command(program);
        spdy_only(&mut cmd);
        cmd
    }
    fn laptop_netns(&self) -> std::path::PathBuf {
        self.0.laptop.netns.path()
    }
}

fn pod(node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: streams}}
spec:
  nodeName: {node}
  restartPolicy: Never
  containers:
  - name: app
    image: host
    command: ["/bin/sleep", "100000"]
  - name: echo
    image: host
    stdin: true
    command: ["/bin/sh", "-c", "while read l; do echo got:$l; done; sleep 100000"]
  - name: http
    image: host
    command: ["/usr/bin/python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"]
    readinessProbe:
      tcpSocket: {{port: 8080}}
      periodSeconds: 1
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_streams_over_spdy() {
    let cluster = Cluster::start(1).await;
    let c = Spdy(&cluster);
    ok(&run_with_stdin(
        c.kubectl_cmd(&["apply", "-f", "-"]),
        &pod(&cluster.nodes[0].name),
    ));
    eventually_within("the pod runs, ready", T, || async {
        let s = c.jsonpath(
            &["pod", "streams"],
            "{.status.phase} {.status.containerStatuses[*].ready}",
        );
        (s == "Running true true true").then_some(()).ok_or(s)
    })
    .await;

    // stdin reaches the command; its output comes back.
    // It went over SPDY: kubectl's debug log shows the server's answer to the upgrade.
    let out = run_with_stdin(
        c.kubectl_cmd(&["exec", "-v=8", "-i", "streams", "-c", "app", "--", "cat"]),
        "hi\n",
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("101 Switching Protocols")
            && log.contains("Upgrade: SPDY/3.1")
            && log.contains("X-Stream-Protocol-Version: v4.channel.k8s.io"),
        "kubectl upgraded to SPDY/3.1:\n{log}"
    );

    // stdin reaches the command, the exit code is kubectl's (v4's Status on the error
    // stream), output streams while the command runs.
    let first_after = exec_streams(&c, "streams", "app");
    println!("exec over SPDY: first line after {first_after:?}");

    // kubectl cp, 10 MB both ways (a tar over exec each way, and a checksum).
    let dir = tempfile::tempdir().unwrap();
    let (up, down) = cp_both_ways(&c, "streams", "app", dir.path());
    println!("cp 10 MB over SPDY: to the pod {up:?}, back {down:?}");

    // A terminal: a typed command's output, and the window size following a resize.
    let echo = {
        let tmux = Tmux::running(
            &c,
            dir.path(),
            "tmux.sock",
            c.kubectl_cmd(&["exec", "-it", "streams", "-c", "app", "--", "sh"]),
        );
        let echo = tmux.shell_answers_and_follows_resizes("s");
        tmux.type_and_see("exit", "kubectl exited 0");
        echo
    };
    println!("exec -it over SPDY: a typed command's output after {echo:?}");

    // attach -i: the line reaches the container's stdin (its answer is in its log).
    let out = run_with_stdin(
        c.kubectl_cmd(&["attach", "-i", "streams", "-c", "echo"]),
        "hi\n",
    );
    assert!(out.status.success(), "{out:?}");
    eventually_within("the attached line is logged", T, || async {
        let logs = ok(&c.kubectl(&["logs", "streams", "-c", "echo"]));
        logs.contains("got:hi").then_some(()).ok_or(logs)
    })
    .await;

    // port-forward: an HTTP round trip to the pod's port.
    let forward = PortForward::start(&c, "pod/streams", 8080);
    let local = forward.local();
    let answer = tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(local)?;
        conn.set_read_timeout(Some(Duration::from_secs(20)))?;
        conn.write_all(b"GET / HTTP/1.0\r\nHost: streams\r\n\r\n")?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)?;
        Ok::<_, std::io::Error>(answer)
    })
    .await
    .unwrap()
    .expect("a round trip through the port-forward");
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.contains("Directory listing"), "{answer}");
    drop(forward);

    // A lost exec (kubectl killed while the command runs): nothing of the session stays.
    let mut piped = {
        let piped = c
            .kubectl_cmd(&["exec", "-i", "streams", "-c", "app", "--", "sleep", "6161"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + T;
        while processes(&["sleep", "6161"]).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        piped
    };
    assert_eq!(processes(&["sleep", "6161"]).len(), 1, "the command runs");
    piped.kill().unwrap();
    piped.wait().unwrap();
    eventually_within("the lost session's command is gone", T, || async {
        let left = processes(&["sleep", "6161"]);
        left.is_empty()
            .then_some(())
            .ok_or(format!("still running: {left:?}"))
    })
    .await;
}
