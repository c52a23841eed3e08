//! A cluster whose machines share nothing but a network, started as a user starts one:
//! `cargo xtask up --nodes 3` (`skiff_tests::up`). The control plane runs on its `control`
//! machine, each node agent on its node's machine, kubectl on the laptop (`up`'s client
//! namespace outside the cluster), each machine its own network namespace with its own
//! loopback. The agents serve their API on the node's address with a certificate of the
//! cluster CA (asked for through a `kubernetes.io/kubelet-serving` CertificateSigningRequest,
//! approved only for the node's own addresses), and the API server dials those addresses and
//! verifies those certificates. On a pod of every node, from the laptop: `logs` and
//! `logs -f` (each line within 1 s of being written), `exec` with stdin, `exec -it` and
//! `attach -it` driven through a real terminal (tmux: a typed command's output, `stty size`
//! following a resize), `cp` of 10 MB both ways, `port-forward`, `debug` with an ephemeral
//! container in the target's process namespace, and `top pods` / `top nodes`. No agent
//! listens on loopback, the API server's connections to agents go to node addresses, and a
//! stranger at a node's address without such a certificate gets no request. (Which requests
//! the controller manager approves: `node_serving_certificates.rs`; the edge cases of the
//! interactive commands: `kubectl_interactive_commands.rs`.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::io::{Read, Write};
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;

use skiff_api::api::CertificateSigningRequest;
use skiff_client::ListParams;
use skiff_tests::interactive::{Laptop as _, PortForward, Tmux, cp_both_ways, debug_ps};
use skiff_tests::machines::ss;
use skiff_tests::up::UpCluster;
use skiff_tests::{Streaming, eventually_within, ok, run_with_stdin};

/// The node machines `up` starts.
const NODES: usize = 3;
const T: Duration = Duration::from_secs(60);
const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// A pod on `node`: `app` serves HTTP on 8080 (and says hello first), `term` is a shell on
/// a terminal for `attach`, `ticker` stamps a line every 250 ms with the shared clock.
fn pod(name: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeName: {node}
  containers:
  - name: app
    image: host
    command: ["/usr/bin/python3", "-c", "print('hello from {name}', flush=True); import http.server as h; h.HTTPServer(('0.0.0.0', 8080), h.SimpleHTTPRequestHandler).serve_forever()"]
    readinessProbe:
      tcpSocket: {{port: 8080}}
      periodSeconds: 1
  - name: term
    image: host
    stdin: true
    tty: true
    command: ["/bin/sh"]
  - name: ticker
    image: host
    command: ["/usr/bin/python3", "-c", "import time\nwhile True:\n  print('tick', int(time.time() * 1000), flush=True)\n  time.sleep(0.25)"]
"#
    )
}

fn issued_for(csrs: &[CertificateSigningRequest], node: &str) -> bool {
    csrs.iter().any(|r| {
        let spec = r.spec.as_ref();
        spec.is_some_and(|s| {
            s.signer_name == SERVING_SIGNER && s.username == format!("system:node:{node}")
        }) && r
            .status
            .as_ref()
            .is_some_and(|st| !st.certificate.is_empty())
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn machines_share_only_a_network() {
    let c = UpCluster::start(NODES, false).await;
    let client = c.client().await;
    let csrs = client.cluster::<CertificateSigningRequest>();

    // Every agent got a serving certificate through a CSR, serves on its node's address and
    // on nothing else, and its Node pins nothing.
    for i in 1..=NODES {
        let (name, netns) = (UpCluster::node_name(i), UpCluster::node_netns(i));
        let listening = format!("{}:10250", UpCluster::node_ip(i));
        eventually_within("the agent serves on its node's address", T, || async {
            let sockets = ss(&netns, &["-Htln"]);
            if sockets.split_whitespace().any(|w| w == listening) {
                Ok(())
            } else {
                Err(format!("listening:\n{sockets}\n{}", c.logs()))
            }
        })
        .await;
        let sockets = ss(&netns, &["-Htln"]);
        for loopback in ["127.0.0.1:10250", "0.0.0.0:10250", "*:10250", "[::]:10250"] {
            assert!(
                !sockets.split_whitespace().any(|w| w == loopback),
                "the agent API must not listen on {loopback}:\n{sockets}"
            );
        }
        eventually_within("a serving certificate is issued to the node", T, || async {
            let all = csrs
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items;
            issued_for(&all, &name)
                .then_some(())
                .ok_or_else(|| format!("{all:?}\n{}", c.logs()))
        })
        .await;
    }

    let endpoints = c.jsonpath(
        &["endpoints", "kubernetes"],
        "{.subsets[0].addresses[*].ip}:{.subsets[0].ports[0].port}",
    );
    assert_eq!(
        endpoints, "192.168.100.250:6443",
        "the API server's fabric address"
    );

    // A pod on every node, and every interactive command on each, from the laptop.
    let dir = tempfile::tempdir().unwrap();
    for i in 1..=NODES {
        let node = UpCluster::node_name(i);
        let name = format!("web-{i}");
        ok(&run_with_stdin(
            c.kubectl_cmd(&["apply", "-f", "-"]),
            &pod(&name, &node),
        ));
        ok(&c.kubectl(&[
            "wait",
            "--for=condition=Ready",
            &format!("pod/{name}"),
            "--timeout=60s",
        ]));
        let logs = ok(&c.kubectl(&["logs", &name, "-c", "app"]));
        assert!(logs.contains(&format!("hello from {name}")), "{logs}");
        let exec = ok(&c.kubectl(&["exec", &name, "--", "busybox", "echo", "exec-ok"]));
        assert_eq!(exec.trim(), "exec-ok");
        let out = run_with_stdin(
            c.kubectl_cmd(&["exec", "-i", &name, "-c", "app", "--", "cat"]),
            "hi\n",
        );
        assert_eq!(ok(&out), "hi\n");

        // The pod reaches the API server as in-cluster clients do: the `kubernetes` Service
        // from its environment, whose endpoint is the control machine's fabric address, with
        // a token of its service account. (The `host` image gets no volumes: the token comes
        // from `kubectl create token`, the CA from the host's filesystem, which is the pod's.)
        let token = ok(&c.kubectl(&["create", "token", "default"]));
        let script = format!(
            "curl -sS --max-time 10 --cacert {ca} -H 'Authorization: Bearer {token}' \
             -o /dev/null -w '%{{http_code}}' \
             https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api",
            ca = c.state.join("pki").join("ca.crt").display(),
            token = token.trim(),
        );
        let api = ok(&c.kubectl(&[
            "exec",
            &name,
            "-c",
            "app",
            "--",
            "/bin/busybox",
            "sh",
            "-c",
            &script,
        ]));
        assert_eq!(
            api, "200",
            "GET /api from {name} through the kubernetes Service"
        );

        // Terminals: exec -it and attach -it, through tmux.
        let exec_it = Tmux::running(
            &c,
            dir.path(),
            &format!("exec-{i}.sock"),
            c.kubectl_cmd(&["exec", "-it", &name, "-c", "app", "--", "sh"]),
        )
        .shell_answers_and_follows_resizes(&format!("e{i}"));
        let attach_it = Tmux::running(
            &c,
            dir.path(),
            &format!("attach-{i}.sock"),
            c.kubectl_cmd(&["attach", "-it", &name, "-c", "term"]),
        )
        .shell_answers_and_follows_resizes(&format!("a{i}"));

        let (up, down) = cp_both_ways(&c, &name, "app", dir.path());
        port_forward(&c, &name, i).await;
        // debug: an ephemeral container in `app`'s process namespace sees its command.
        let (_, ps) = debug_ps(&c, &name, "app").await;
        assert!(
            ps.contains(&format!("hello from {name}")),
            "ps in the target's process namespace shows its command:\n{ps}"
        );
        let delays = follow(&c, &name);
        println!(
            "{node}: exec -it answered after {exec_it:?}, attach -it after {attach_it:?}; \
             cp 10 MB up {up:?}, down {down:?}; logs -f delays (ms) {delays:?}"
        );
    }

    // `kubectl top` from the laptop: the metrics API samples every agent at its address.
    for what in ["nodes", "pods"] {
        eventually_within("kubectl top lists every node and pod", T, || async {
            let out = c.kubectl(&["top", what, "--no-headers"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let want = |i: usize| match what {
                "nodes" => UpCluster::node_name(i),
                _ => format!("web-{i}"),
            };
            (out.status.success() && (1..=NODES).all(|i| text.contains(&want(i))))
                .then_some(())
                .ok_or_else(|| format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
        })
        .await;
    }

    // Whoever takes over a node's address without a certificate of the cluster CA for it
    // (here: the agent is killed and a stranger serves a self-signed certificate for the
    // address before `up` starts the agent again) gets no request from the API server: the
    // handshake fails, nothing is sent.
    let agent = UpCluster::agent_pid(2).expect("node-2's agent runs");
    ok(&std::process::Command::new("kill")
        .args(["-KILL", &agent.to_string()])
        .output()
        .unwrap());
    eventually_within("the agent is dead", T, || async {
        let state = std::fs::read_to_string(format!("/proc/{agent}/stat")).unwrap_or_default();
        // Gone, or a zombie `up` has not reaped yet: its sockets are closed either way.
        let dead = state.is_empty()
            || state
                .rsplit(") ")
                .next()
                .is_some_and(|r| r.starts_with('Z'));
        dead.then_some(()).ok_or(state)
    })
    .await;
    let ip = UpCluster::node_ip(2);
    let rogue = rogue_agent(
        &std::path::Path::new("/run/netns").join(UpCluster::node_netns(2)),
        &ip,
    );
    let out = c.kubectl(&["logs", "web-2", "-c", "app"]);
    assert!(
        !out.status.success(),
        "logs through a stranger's certificate must fail"
    );
    let received = rogue.join().unwrap();
    assert!(
        received.is_empty(),
        "the API server sent a request to a server it could not verify: {}",
        String::from_utf8_lossy(&received)
    );
}

/// `kubectl port-forward` from the laptop to pod `name` on node `i`: an HTTP round trip,
/// with the API server's connection to the agent going to the node's address.
async fn port_forward(c: &UpCluster, name: &str, i: usize) {
    let forward = PortForward::start(c, &format!("pod/{name}"), 8080);
    let local = forward.local();
    let control = c.control_netns(0);
    let ip = UpCluster::node_ip(i);
    let wanted = format!("{ip}:10250");
    let (answer, established) = tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(local)?;
        conn.set_read_timeout(Some(Duration::from_secs(20)))?;
        conn.write_all(b"GET / HTTP/1.0\r\n")?;
        // While the tunnel is open, the API server holds a connection to the agent.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut established = ss(&control, &["-Htn", "state", "established"]);
        while !established.contains(&wanted) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            established = ss(&control, &["-Htn", "state", "established"]);
        }
        conn.write_all(b"\r\n")?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)?;
        Ok::<_, std::io::Error>((answer, established))
    })
    .await
    .unwrap()
    .expect("a round trip through the port-forward");
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    // The API server dials the agent at the node's address, never at a loopback one.
    assert!(
        established.contains(&format!("{ip}:10250")),
        "the API server dials the agent at {ip}:10250:\n{established}"
    );
    assert!(
        !established.contains("127.0.0.1:10250"),
        "nothing dials an agent on loopback:\n{established}"
    );
}

/// `kubectl logs -f` of pod `name`'s ticker: each line reaches the laptop within a second
/// of being written on another machine (the pod stamps it with the shared clock). Returns
/// the delays in ms.
fn follow(c: &UpCluster, name: &str) -> Vec<u128> {
    let follow = Streaming::spawn(c.kubectl_cmd(&["logs", "-f", name, "-c", "ticker"]));
    let since = now_ms() + 500;
    let mut delays = Vec::new();
    while delays.len() < 8 {
        let line = follow
            .wait_for(&["tick "], T)
            .expect("kubectl logs -f streams the ticker's lines");
        let arrived = now_ms();
        let written: u128 = line
            .trim_start_matches("tick ")
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("a stamped line: {line:?}"));
        if written > since {
            delays.push(arrived.saturating_sub(written));
        }
    }
    drop(follow);
    assert!(
        delays.iter().all(|d| *d < 1000),
        "lines must reach kubectl within 1 s; delays (ms): {delays:?}"
    );
    delays
}

/// A TLS server on `ip:10250` inside the namespace at `netns` with a self-signed
/// certificate for `ip`: returns what its first client sent after the handshake (nothing
/// when the handshake fails).
fn rogue_agent(netns: &std::path::Path, ip: &str) -> std::thread::JoinHandle<Vec<u8>> {
    let id = skiff_pki::self_signed(&skiff_pki::LeafSpec::server(
        "system:node:rogue",
        &[ip.to_string()],
    ))
    .unwrap();
    let netns = std::fs::File::open(netns).unwrap();
    let addr: std::net::SocketAddr = format!("{ip}:10250").parse().unwrap();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        // The killed agent's socket goes with its last reference: try for 2 s.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let listener = loop {
            match std::net::TcpListener::bind(addr) {
                Ok(l) => break l,
                Err(e) if std::time::Instant::now() > deadline => panic!("binding {addr}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        ready_tx.send(()).unwrap();
        let certs = skiff_pki::pem_certificates(&id.cert_pem, "rogue")
            .unwrap()
            .into_iter()
            .map(rustls::pki_types::CertificateDer::from)
            .collect();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let (tcp, _) = listener.accept().unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let conn = rustls::ServerConnection::new(std::sync::Arc::new(config)).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let mut got = vec![0u8; 4096];
        match tls.read(&mut got) {
            Ok(n) => got[..n].to_vec(),
            Err(_) => Vec::new(),
        }
    });
    ready.recv().unwrap();
    handle
}

/// Milliseconds since the epoch (the clock the pods share with the test).
fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}
