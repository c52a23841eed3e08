//! kubectl's interactive commands against pods on a node machine, from a laptop outside the
//! cluster (`skiff_tests::machines`): `exec -i` with stdin, output that streams while the
//! command runs, `exec -it` driven through a real terminal (tmux: a typed command's output,
//! `stty size` following a window resize), `cp` of a 10 MB file both ways, and the errors
//! and cleanup around them: an exec into a container that has exited is refused with
//! Kubernetes' error, and a lost exec connection (kubectl killed) leaves no process of the
//! session in the container and no pseudo-terminal open on the node. `logs -f` follows a
//! container across its restart, and `logs --previous` shows the run before.
//!
//! `attach`: to a `stdin`/`tty` container's terminal through tmux (a typed line answered, a
//! resize seen), `echo hi | kubectl attach -i` to a plain-stdin container (the line in its
//! log), a lost attach connection that leaves the container running and its shim with no
//! client. `debug`: an ephemeral container in the target's process namespace (`ps` shows
//! the target's command, `status.ephemeralContainerStatuses` reports it, never restarted),
//! and `debug -it` attached to its terminal; in a restricted namespace Pod Security refuses
//! an ephemeral `host` container (the attack).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use skiff_tests::cluster::Cluster;
use skiff_tests::interactive::{
    Laptop as _, Tmux, cp_both_ways, debug_ps, exec_streams, processes, pty_masters,
};
use skiff_tests::{eventually_within, fails, ok, run_with_stdin};

const T: Duration = Duration::from_secs(30);

fn pod(node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: shell}}
spec:
  nodeName: {node}
  restartPolicy: Never
  containers:
  - name: app
    image: host
    command: ["/bin/sleep", "100000"]
  - name: done
    image: host
    command: ["/bin/true"]
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_interactive_commands() {
    let c = Cluster::start(1).await;
    let node = &c.nodes[0];
    ok(&run_with_stdin(
        c.laptop_kubectl_cmd(&["apply", "-f", "-"]),
        &pod(&node.name),
    ));
    eventually_within("the pod runs and its second container has exited", T, || async {
        let out = c.laptop_kubectl(&[
            "get",
            "pod",
            "shell",
            "-o",
            "jsonpath={.status.phase} {.status.containerStatuses[?(@.name==\"done\")].state.terminated.reason} {.status.containerStatuses[?(@.name==\"app\")].started}",
        ]);
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        (s == "Running Completed true").then_some(()).ok_or(s)
    })
    .await;

    // stdin reaches the command, the exit code is kubectl's, output streams while the
    // command runs.
    let first_after = exec_streams(&c, "shell", "app");
    println!("exec: first line after {first_after:?}");

    // kubectl cp, 10 MB both ways, checksums equal (the `host` image's filesystem is the
    // host's: the copy goes to a directory of the test's own).
    let dir = tempfile::tempdir().unwrap();
    let (up, down) = cp_both_ways(&c, "shell", "app", dir.path());
    println!("cp 10 MB: to the pod {up:?}, back {down:?}");

    // A terminal: a typed command's output, and the window size following resizes.
    let tmux = Tmux::running(
        &c,
        dir.path(),
        "tmux.sock",
        c.laptop_kubectl_cmd(&["exec", "-it", "shell", "-c", "app", "--", "sh"]),
    );
    let echo = tmux.shell_answers_and_follows_resizes("x");
    println!("exec -it: a typed command's output after {echo:?}");

    // A lost connection: kubectl killed while the session runs a command; nothing of the
    // session stays, in the container or on the node.
    tmux.type_and_see("sleep 4343 & sleep 4242", "sleep 4242");
    eventually_within("the terminal's commands run", T, || async {
        (processes(&["sleep", "4242"]).len() == 1 && processes(&["sleep", "4343"]).len() == 1)
            .then_some(())
            .ok_or("not running yet")
    })
    .await;
    let agent = node.agent_pid().unwrap();
    assert_eq!(
        pty_masters(agent),
        1,
        "the agent holds the session's terminal"
    );
    let mut piped = c
        .kubectl_cmd(&["exec", "-i", "shell", "-c", "app", "--", "sleep", "4141"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually_within("the piped command runs", T, || async {
        (processes(&["sleep", "4141"]).len() == 1)
            .then_some(())
            .ok_or("not running yet")
    })
    .await;
    piped.kill().unwrap();
    piped.wait().unwrap();
    drop(tmux);
    eventually_within("the sessions' processes are gone", T, || async {
        let left: Vec<_> = ["4141", "4242", "4343"]
            .iter()
            .flat_map(|n| processes(&["sleep", n]))
            .collect();
        left.is_empty()
            .then_some(())
            .ok_or(format!("still running: {left:?}"))
    })
    .await;
    assert_eq!(pty_masters(agent), 0, "the terminal is closed");

    // Logs across a restart: the first run exits, the second stays.
    let marker = dir.path().join("first-run-done");
    let script = format!(
        "if [ -e {m} ]; then echo run 1; exec sleep 100000; else touch {m}; echo run 0; sleep 3; exit 1; fi",
        m = marker.display()
    );
    let restarts = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: restarts}}
spec:
  nodeName: {node}
  containers:
  - name: app
    image: host
    command: ["/bin/sh", "-c", {script:?}]
"#,
        node = node.name
    );
    let no_previous = fails(&c.laptop_kubectl(&["logs", "shell", "-c", "app", "--previous"]));
    assert!(
        no_previous.contains("previous terminated container \"app\" in pod \"shell\" not found"),
        "{no_previous}"
    );
    ok(&run_with_stdin(
        c.laptop_kubectl_cmd(&["apply", "-f", "-"]),
        &restarts,
    ));
    // As Kubernetes, logs of a container that has not started are an error, not a wait:
    // follow once the first run has written its line (it ends 3 s later).
    eventually_within("the first run writes", T, || async {
        let out = c.laptop_kubectl(&["logs", "restarts"]);
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        (s == "run 0\n").then_some(()).ok_or(s)
    })
    .await;
    let mut follow = c
        .kubectl_cmd(&["logs", "-f", "restarts"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let followed = BufReader::new(follow.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in followed.lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                return;
            }
        }
    });
    let seen: Vec<String> = (0..2).filter_map(|_| rx.recv_timeout(T).ok()).collect();
    assert_eq!(
        seen,
        ["run 0", "run 1"],
        "logs -f follows across the restart\n{}\n{}",
        String::from_utf8_lossy(
            &c.laptop_kubectl(&["get", "pod", "restarts", "-o", "yaml"])
                .stdout
        ),
        c.logs()
    );
    follow.kill().unwrap();
    follow.wait().unwrap();
    assert_eq!(ok(&c.laptop_kubectl(&["logs", "restarts"])), "run 1\n");
    assert_eq!(
        ok(&c.laptop_kubectl(&["logs", "restarts", "--previous"])),
        "run 0\n"
    );

    // An exec into a container that has exited: Kubernetes' error, nothing started.
    let err = fails(&c.laptop_kubectl(&["exec", "shell", "-c", "done", "--", "true"]));
    assert!(
        err.contains(
            "Internal error occurred: error executing command in container: container \"done\" is not running: it has exited"
        ),
        "{err}"
    );

    attach(&c, &node.name, &dir).await;
    debug(&c, &dir).await;
    ephemeral_containers_obey_pod_security(&c);
}

/// The attach pod: a shell on a terminal, and a line echoer reading a plain stdin.
fn attach_pod(node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: attached}}
spec:
  nodeName: {node}
  containers:
  - name: term
    image: host
    stdin: true
    tty: true
    command: ["/bin/sh"]
  - name: echo
    image: host
    stdin: true
    command: ["/bin/sh", "-c", "while read l; do echo got:$l; done; echo stdin closed; sleep 100000"]
"#
    )
}

/// The shim of container `name` of pod `uid` (its `--state` directory names both).
fn shim_of(uid: &str, name: &str) -> u32 {
    let want = format!("/pods/{uid}/containers/{name}");
    let found: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.iter().any(|a| *a == b"shim")
                    && args.windows(2).any(|w| {
                        w[0] == b"--state" && String::from_utf8_lossy(w[1]).ends_with(&want)
                    })
            })
        })
        .collect();
    assert_eq!(found.len(), 1, "one shim for {uid}/{name}: {found:?}");
    found[0]
}

/// How many sockets process `pid` holds.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// `kubectl attach`: to a terminal (typed input, its answer, resizes), with a piped stdin
/// (`echo hi | kubectl attach -i`, also in the logs), and a lost connection that leaves the
/// container running and nothing of the session open.
async fn attach(c: &Cluster, node: &str, dir: &tempfile::TempDir) {
    ok(&run_with_stdin(
        c.laptop_kubectl_cmd(&["apply", "-f", "-"]),
        &attach_pod(node),
    ));
    eventually_within("the attach pod runs", T, || async {
        let s = c.jsonpath(
            &["pod", "attached"],
            "{.status.phase} {.status.containerStatuses[*].started}",
        );
        (s == "Running true true").then_some(()).ok_or(s)
    })
    .await;
    let uid = c.jsonpath(&["pod", "attached"], "{.metadata.uid}");

    // A piped stdin: the line reaches the container, its answer is in the container's log.
    let out = run_with_stdin(
        c.laptop_kubectl_cmd(&["attach", "-i", "attached", "-c", "echo"]),
        "hi\n",
    );
    assert!(out.status.success(), "{out:?}");
    eventually_within("the echoed line is logged", T, || async {
        let logs =
            String::from_utf8_lossy(&c.laptop_kubectl(&["logs", "attached", "-c", "echo"]).stdout)
                .into_owned();
        logs.contains("got:hi").then_some(()).ok_or(logs)
    })
    .await;
    // stdin is not stdinOnce: it stays open for the next client.
    assert!(
        !ok(&c.laptop_kubectl(&["logs", "attached", "-c", "echo"])).contains("stdin closed"),
        "the container's stdin closed with the first client"
    );
    // Asking stdin of a container without `stdin: true` is refused before anything starts.
    let err = fails(&c.laptop_kubectl(&["attach", "-i", "shell", "-c", "app"]));
    assert!(err.contains("was not started with stdin: true"), "{err}");

    // A terminal: the shell answers a typed line, and sees the window's size.
    let shim = shim_of(&uid, "term");
    let idle_sockets = sockets(shim);
    let tmux = Tmux::running(
        c,
        dir.path(),
        "attach.sock",
        c.laptop_kubectl_cmd(&["attach", "-it", "attached", "-c", "term"]),
    );
    let echo = tmux.shell_answers_and_follows_resizes("y");
    println!("attach -it: a typed command's output after {echo:?}");
    assert_eq!(
        sockets(shim),
        idle_sockets + 1,
        "the shim serves the client"
    );
    let logged = ok(&c.laptop_kubectl(&["logs", "attached", "-c", "term"]));
    assert!(
        logged.contains("42y"),
        "the terminal's output is logged: {logged}"
    );

    // The connection lost (kubectl killed): the container runs on, the shim lets the client
    // go, and the session is gone from the agent.
    drop(tmux);
    eventually_within("the shim lets the lost client go", T, || async {
        let n = sockets(shim);
        (n == idle_sockets).then_some(()).ok_or(n)
    })
    .await;
    let state = c.jsonpath(&["pod", "attached"],
        "{.status.containerStatuses[?(@.name==\"term\")].restartCount} {.status.containerStatuses[?(@.name==\"term\")].state.running.startedAt}",
    );
    assert!(
        state.starts_with("0 ") && state.len() > 2,
        "still running: {state}"
    );
    assert_eq!(shim_of(&uid, "term"), shim, "the same run");
    let again = run_with_stdin(
        c.laptop_kubectl_cmd(&["attach", "-i", "attached", "-c", "term"]),
        "echo again$((1+1))\n",
    );
    assert!(again.status.success(), "{again:?}");
    eventually_within("a later client still reaches the shell", T, || async {
        let logs = ok(&c.laptop_kubectl(&["logs", "attached", "-c", "term"]));
        logs.contains("again2").then_some(()).ok_or(logs)
    })
    .await;
}

/// `kubectl debug`: an ephemeral container in the target container's process namespace,
/// without a terminal (its output in its log) and with one (kubectl attaches).
async fn debug(c: &Cluster, dir: &tempfile::TempDir) {
    let (name, ps) = debug_ps(c, "shell", "app").await;
    let statuses = c.jsonpath(&["pod", "shell"], "{.status.ephemeralContainerStatuses}");
    assert!(statuses.contains(&name), "{statuses}");
    assert!(
        ps.lines().any(|l| l.trim() == "/bin/sleep 100000"),
        "ps in the target's process namespace shows its command:\n{ps}"
    );
    // Never restarted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.jsonpath(
            &["pod", "shell"],
            "{.status.ephemeralContainerStatuses[0].restartCount}"
        ),
        "0"
    );

    // -it: kubectl waits for the container, then attaches to its terminal.
    let tmux = Tmux::running(
        c,
        dir.path(),
        "debug.sock",
        c.laptop_kubectl_cmd(&[
            "debug",
            "-it",
            "shell",
            "--image=host",
            "--target=app",
            "--",
            "sh",
        ]),
    );
    let echo = tmux.type_and_see("echo $((6 * 7))z", "42z");
    println!("debug -it: a typed command's output after {echo:?}");
    tmux.type_and_see("exit", "");
    drop(tmux);
    eventually_within("the second ephemeral container ended", T, || async {
        let s = c.jsonpath(
            &["pod", "shell"],
            "{.status.ephemeralContainerStatuses[*].state.terminated.reason}",
        );
        (s == "Completed Completed").then_some(()).ok_or(s)
    })
    .await;
}

/// An attacker who may add ephemeral containers to a pod of a restricted namespace must not
/// get a `host` container (the node's own commands) that way: Pod Security checks them as
/// any other container.
fn ephemeral_containers_obey_pod_security(c: &Cluster) {
    ok(&run_with_stdin(
        c.laptop_kubectl_cmd(&["apply", "-f", "-"]),
        r#"apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata:
    name: locked
    labels: {pod-security.kubernetes.io/enforce: restricted}
- apiVersion: v1
  kind: Pod
  metadata: {name: tidy, namespace: locked}
  spec:
    securityContext:
      runAsNonRoot: true
      seccompProfile: {type: RuntimeDefault}
    containers:
    - name: app
      image: registry.invalid/app:1
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
"#,
    ));
    let err =
        fails(&c.laptop_kubectl(&["debug", "-n", "locked", "tidy", "--image=host", "--", "sh"]));
    assert!(
        err.contains("violates PodSecurity \"restricted:latest\"") && err.contains("host image"),
        "{err}"
    );
    assert_eq!(
        c.jsonpath(
            &["pod", "tidy", "-n", "locked"],
            "{.spec.ephemeralContainers}"
        ),
        "",
        "no ephemeral container was added"
    );
}
