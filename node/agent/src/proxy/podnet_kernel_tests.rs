//! The pod networking fast path against the real kernel: "node" namespaces whose pods are
//! connected by the agent's own code (`NodeNetwork::attach_pod`, `NodeNetwork::set_peer_route`,
//! `Proxy::attach_pod`), with forwarding dropped by netfilter in every node namespace
//! (`iptables -P FORWARD DROP`): pod-to-pod traffic works only if the tc program carries it
//! past the node's stack. Needs root.
//!
//! ```text
//!  same node:   pod a 10.230.1.x ── skv… ┐ node ns n (FORWARD DROP)
//!               pod b 10.230.1.y ── skv… ┘
//!  cross node:  pod a 10.232.1.x ── n1 (u1 10.231.0.1) ══ veth ══ (u2 10.231.0.2) n2 ── pod b 10.232.2.x
//! ```
//!
//! Safety: every namespace, veth, address and firewall rule lives in namespaces the test
//! created; nothing is configured in, or sent from, the root namespace. The guard kills the
//! servers by pid, removes the pins (detaching the programs, freeing the maps) and the
//! namespaces (with their veths and rules), also when a test fails.

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use crate::proxy::Proxy;
use skiff_datapath::lb::{FastPathCounters, ServiceLb, TcAttach};
use skiff_datapath::node_pin_dir;
use skiff_datapath::testing::{python, run, unique_name, wait_timeout};
use skiff_hostnet::{NodeNetwork, NodeNetworkConfig, PodAttachment};

const PORT: u16 = 8080;
/// Bytes the client sends (several segments, GSO on the veths).
const PAYLOAD: usize = 256 * 1024;

/// Server: per connection, reads until EOF and answers `<peer ip> <bytes read>`.
const SERVER: &str = r#"
import socket, sys
t = socket.socket()
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("0.0.0.0", int(sys.argv[1])))
t.listen(16)
print("ready", flush=True)
while True:
    c, src = t.accept()
    n = 0
    while True:
        d = c.recv(65536)
        if not d:
            break
        n += len(d)
    c.sendall(("%s %d\n" % (src[0], n)).encode())
    c.close()
"#;

/// Client: connects (3 s timeout), sends N bytes, half-closes, prints the answer; exit 1 on
/// any failure.
const CLIENT: &str = r#"
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    s.sendall(b"x" * int(sys.argv[3]))
    s.shutdown(socket.SHUT_WR)
    print(s.makefile("r").readline().strip(), flush=True)
except OSError as e:
    print("failed: %s" % e, flush=True)
    sys.exit(1)
"#;

struct TestPod {
    ns: String,
    uid: String,
    att: PodAttachment,
}

impl TestPod {
    fn ip(&self) -> IpAddr {
        self.att.pod_ip
    }
}

struct TestNode {
    ns: String,
    net: NodeNetwork,
    pin_dir: PathBuf,
    proxy: Option<Arc<Proxy>>,
    _state: tempfile::TempDir,
}

impl TestNode {
    fn netns(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.ns)
    }

    /// Loads the `skiff-lb` object for this node (the agent's `Proxy` around it).
    fn load(&mut self) -> Arc<Proxy> {
        let proxy = Proxy::new(
            skiff_datapath::testing::load_small(&self.pin_dir),
            "node-1",
            Vec::new(),
        );
        self.proxy = Some(proxy.clone());
        proxy
    }

    fn counters(&self) -> FastPathCounters {
        self.proxy
            .as_ref()
            .expect("loaded")
            .fast_path_counters()
            .expect("counters")
    }
}

/// Namespaces, nodes, servers of one test; all removed on drop.
struct PodnetFixture {
    suffix: String,
    namespaces: Vec<String>,
    nodes: Vec<TestNode>,
    servers: Vec<Child>,
}

impl PodnetFixture {
    fn new() -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        assert_eq!(unsafe { libc::geteuid() }, 0, "needs root");
        PodnetFixture {
            suffix: unique_name(),
            namespaces: Vec::new(),
            nodes: Vec::new(),
            servers: Vec::new(),
        }
    }

    fn netns(&mut self, role: &str) -> String {
        let ns = format!("skiff-test-pn{role}-{}", self.suffix);
        run("ip", &["netns", "add", &ns]);
        self.namespaces.push(ns.clone());
        run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        ns
    }

    /// A node namespace with the agent's pod networking for `pod_cidr`, forwarding dropped
    /// by netfilter.
    async fn node(&mut self, role: &str, pod_cidr: &str) -> usize {
        let ns = self.netns(role);
        let state = tempfile::tempdir().expect("tempdir");
        let net = NodeNetwork::new(NodeNetworkConfig {
            node_netns: Some(Path::new("/run/netns").join(&ns)),
            pod_cidr: pod_cidr.into(),
            state_dir: state.path().to_path_buf(),
        })
        .await
        .expect("node network");
        run(
            "ip",
            &["netns", "exec", &ns, "iptables", "-P", "FORWARD", "DROP"],
        );
        self.nodes.push(TestNode {
            ns,
            net,
            pin_dir: node_pin_dir(&format!("test-pn{role}-{}", self.suffix)),
            proxy: None,
            _state: state,
        });
        self.nodes.len() - 1
    }

    /// A pod namespace attached to node `node` by the agent's network code.
    async fn pod(&mut self, node: usize, role: &str) -> TestPod {
        let ns = self.netns(role);
        let uid = format!("pod-{role}-{}", self.suffix);
        let att = self.nodes[node]
            .net
            .attach_pod(&uid, &Path::new("/run/netns").join(&ns))
            .await
            .expect("attach pod");
        assert!(att.host_mac.is_some() && att.pod_mac.is_some(), "{att:?}");
        TestPod { ns, uid, att }
    }

    /// Connects `pod` to the eBPF data path, as the agent's pod worker does.
    fn attach(&self, node: usize, pod: &TestPod) -> TcAttach {
        let n = &self.nodes[node];
        n.proxy
            .as_ref()
            .expect("loaded")
            .attach_pod(Some(&n.netns()), &pod.uid, &pod.att)
            .expect("attach pod data path")
    }

    fn serve(&mut self, pod: &TestPod) {
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", pod.ns))
            .args([python(), "-c", SERVER, &PORT.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn server");
        let mut line = String::new();
        let out = child.stdout.take().expect("stdout");
        let _ = BufReader::new(out).read_line(&mut line);
        self.servers.push(child);
        assert_eq!(line, "ready\n", "server in {} did not start", pod.ns);
    }

    /// Connects from `from` to `to` and sends [`PAYLOAD`] bytes: `Ok((peer the server saw,
    /// bytes it read))` or `Err(why)`.
    fn connect(&self, from: &TestPod, to: &TestPod) -> Result<(String, usize), String> {
        self.connect_ip(from, to.ip())
    }

    fn connect_ip(&self, from: &TestPod, to: IpAddr) -> Result<(String, usize), String> {
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", from.ns))
            .args([python(), "-c", CLIENT, &to.to_string()])
            .args([PORT.to_string(), PAYLOAD.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn client");
        let status = wait_timeout(&mut child, "client");
        let mut out = String::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if !status.success() {
            return Err(out.trim().to_string());
        }
        let (peer, n) = out
            .trim()
            .split_once(' ')
            .ok_or_else(|| format!("answer {out:?}"))?;
        Ok((peer.to_string(), n.parse().map_err(|_| out.clone())?))
    }

    /// What `iptables-save` shows in node `node`'s namespace.
    fn firewall(&self, node: usize) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.nodes[node].ns, "iptables-save"])
            .output()
            .expect("iptables-save");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for PodnetFixture {
    fn drop(&mut self) {
        for child in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
        for n in &mut self.nodes {
            n.proxy = None;
            if let Err(e) = ServiceLb::remove_pins(&n.pin_dir) {
                eprintln!("cleanup: {e}");
            }
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

fn ok_from(result: Result<(String, usize), String>, from: &TestPod) {
    let (peer, n) = result.expect("pod to pod");
    assert_eq!(
        peer,
        from.ip().to_string(),
        "the server sees the client's own IP"
    );
    assert_eq!(n, PAYLOAD, "every byte arrived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_one_node_talk_past_a_forward_drop_through_redirect_peer() {
    let mut fx = PodnetFixture::new();
    let node = fx.node("n", "10.230.1.0/24").await;
    let a = fx.pod(node, "a").await;
    let b = fx.pod(node, "b").await;
    fx.serve(&b);
    assert!(
        fx.firewall(node).contains(":FORWARD DROP"),
        "{}",
        fx.firewall(node)
    );
    // Through the node's stack, the forward DROP stops it: the test can fail.
    let blocked = fx.connect(&a, &b);
    assert!(
        blocked.is_err(),
        "forwarding should be dropped: {blocked:?}"
    );

    let proxy = fx.nodes[node].load();
    assert_eq!(fx.attach(node, &a), TcAttach::Attached);
    assert_eq!(fx.attach(node, &b), TcAttach::Attached);
    let endpoints = proxy.pod_endpoints().expect("endpoints");
    for p in [&a, &b] {
        let e = endpoints
            .iter()
            .find(|e| e.ip == p.ip().to_string())
            .unwrap_or_else(|| panic!("no endpoint for {}: {endpoints:?}", p.ip()));
        assert_eq!(e.ifindex, p.att.host_ifindex);
        assert_eq!(e.uid.as_deref(), Some(p.uid.as_str()));
    }
    let before = fx.nodes[node].counters();
    ok_from(fx.connect(&a, &b), &a);
    ok_from(fx.connect(&a, &b), &a);
    let after = fx.nodes[node].counters();
    eprintln!("fast path counters: {before:?} → {after:?}");
    assert!(
        after.redirect_peer >= before.redirect_peer + 8,
        "both directions delivered with redirect_peer: {before:?} → {after:?}"
    );
    assert_eq!(after.fib_fail, before.fib_fail, "{after:?}");

    assert_api_shows_the_fast_path(&proxy, &a, &b).await;

    // An agent restart: the pinned endpoint map is kept; reconciling it against the pods
    // that still exist (b's address is no longer allocated) removes only b's entry.
    fx.nodes[node].proxy = None;
    let proxy = fx.nodes[node].load();
    assert_eq!(
        proxy.pod_endpoints().expect("endpoints").len(),
        2,
        "pins reused"
    );
    let allocations = [(a.ip(), a.uid.clone())].into();
    let netns = fx.nodes[node].netns();
    assert_eq!(
        proxy.reconcile_pod_endpoints(Some(&netns), &allocations),
        Ok(1)
    );
    let endpoints = proxy.pod_endpoints().expect("endpoints");
    assert_eq!(endpoints.len(), 1, "{endpoints:?}");
    assert_eq!(endpoints[0].ip, a.ip().to_string());
    assert_eq!(endpoints[0].uid.as_deref(), Some(a.uid.as_str()));
    // Without b's entry, a's packets to b take the FIB path on a's veth (still past the
    // DROP), b's replies are delivered into a with redirect_peer.
    let before = fx.nodes[node].counters();
    ok_from(fx.connect(&a, &b), &a);
    let after = fx.nodes[node].counters();
    eprintln!("without b's entry: {before:?} → {after:?}");
    assert!(after.redirect_neigh > before.redirect_neigh, "{after:?}");
    assert!(after.redirect_peer > before.redirect_peer, "{after:?}");

    // Detached (as a pod teardown does): entries gone, the stack (and its DROP) is back.
    proxy.detach_pod(&a.uid, Some(a.ip())).expect("detach a");
    proxy.detach_pod(&b.uid, Some(b.ip())).expect("detach b");
    assert!(proxy.pod_endpoints().expect("endpoints").is_empty());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut last = Ok((String::new(), 0));
    while std::time::Instant::now() < deadline {
        last = fx.connect(&a, &b);
        if last.is_err() {
            break;
        }
    }
    assert!(
        last.is_err(),
        "without the program the DROP applies: {last:?}"
    );
}

/// The agent API shows the same: `/bpf/pods` joins the endpoints with the pods (`a` the
/// client, `b` the server), `/metrics` has the counters, `/bpf/conntrack` answers (no
/// NodePort flow here).
async fn assert_api_shows_the_fast_path(proxy: &Arc<Proxy>, a: &TestPod, b: &TestPod) {
    let pods = crate::api::PodRegistry::default();
    for (p, name) in [(a, "client"), (b, "server")] {
        pods.publish(crate::api::PodInfo {
            uid: p.uid.clone(),
            namespace: "default".into(),
            name: name.into(),
            ..Default::default()
        });
    }
    let sources = crate::api::Sources {
        node: "node-x".into(),
        pods,
        accounting: None,
        proxy: Ok(proxy.clone()),
        network_policy: None,
    };
    let app = crate::api::bpf_router(sources.clone()).merge(crate::api::metrics_router(sources));
    let get = |path: &'static str| crate::api::test_http::get(app.clone(), path);
    let (status, _, body) = get("/bpf/pods").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let redirect_peer = proxy.fast_path_counters().expect("counters").redirect_peer;
    assert_eq!(
        v["fastPath"]["redirectPeer"].as_u64(),
        Some(redirect_peer),
        "{v}"
    );
    let server = v["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["ip"] == b.ip().to_string()))
        .unwrap_or_else(|| panic!("no server in {v}"));
    assert_eq!(server["name"], "server", "{v}");
    assert_eq!(
        server["ifindex"].as_u64(),
        Some(u64::from(b.att.host_ifindex))
    );
    let (status, _, body) = get("/metrics").await;
    assert_eq!(status, 200, "{body}");
    let line = format!("skiff_fastpath_packets_total{{action=\"redirect_peer\"}} {redirect_peer}");
    assert!(body.lines().any(|l| l == line), "no {line:?} in\n{body}");
    let (status, _, body) = get("/bpf/conntrack").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"entries\": []"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_two_nodes_talk_past_forward_drops_through_redirect_neigh() {
    let mut fx = PodnetFixture::new();
    let n1 = fx.node("n1", "10.232.1.0/24").await;
    let n2 = fx.node("n2", "10.232.2.0/24").await;
    let (ns1, ns2) = (fx.nodes[n1].ns.clone(), fx.nodes[n2].ns.clone());
    run(
        "ip",
        &[
            "-n", &ns1, "link", "add", "u1", "type", "veth", "peer", "name", "u2", "netns", &ns2,
        ],
    );
    run(
        "ip",
        &["-n", &ns1, "addr", "add", "10.231.0.1/24", "dev", "u1"],
    );
    run(
        "ip",
        &["-n", &ns2, "addr", "add", "10.231.0.2/24", "dev", "u2"],
    );
    run("ip", &["-n", &ns1, "link", "set", "u1", "up"]);
    run("ip", &["-n", &ns2, "link", "set", "u2", "up"]);
    // The routes controller's routes.
    fx.nodes[n1]
        .net
        .set_peer_route("10.232.2.0/24", Ipv4Addr::new(10, 231, 0, 2))
        .await
        .expect("route to n2");
    fx.nodes[n2]
        .net
        .set_peer_route("10.232.1.0/24", Ipv4Addr::new(10, 231, 0, 1))
        .await
        .expect("route to n1");
    let a = fx.pod(n1, "a").await;
    let b = fx.pod(n2, "b").await;
    fx.serve(&b);
    let blocked = fx.connect(&a, &b);
    assert!(
        blocked.is_err(),
        "forwarding should be dropped: {blocked:?}"
    );

    for (n, uplink, pod) in [(n1, "u1", &a), (n2, "u2", &b)] {
        let proxy = fx.nodes[n].load();
        proxy
            .attach_tc(Some(&fx.nodes[n].netns()), uplink)
            .expect("attach uplink");
        fx.attach(n, pod);
    }
    ok_from(fx.connect(&a, &b), &a);
    ok_from(fx.connect(&a, &b), &a);
    for (n, what) in [(n1, "node 1"), (n2, "node 2")] {
        let c = fx.nodes[n].counters();
        eprintln!("{what}: {c:?}");
        // Out of the pod: fib + redirect_neigh to the uplink; in from the uplink:
        // redirect_peer into the pod.
        assert!(c.redirect_neigh >= 4, "{what}: {c:?}");
        assert!(c.redirect_peer >= 4, "{what}: {c:?}");
        assert_eq!((c.pass, c.fib_fail), (0, 0), "{what}: {c:?}");
    }

    // What the fast path does not forward goes to node 1's stack: its own address (nothing
    // listens: the stack answers with a reset) and an unreachable route (the stack answers
    // with an ICMP error); both fail at once instead of timing out.
    run(
        "ip",
        &["-n", &ns1, "route", "add", "unreachable", "10.99.0.0/16"],
    );
    let before = fx.nodes[n1].counters();
    let local = fx.connect_ip(&a, IpAddr::V4(Ipv4Addr::new(10, 231, 0, 1)));
    assert!(
        local.as_ref().is_err_and(|e| e.contains("refused")),
        "{local:?}"
    );
    let unreachable = fx.connect_ip(&a, IpAddr::V4(Ipv4Addr::new(10, 99, 0, 1)));
    assert!(
        unreachable
            .as_ref()
            .is_err_and(|e| e.contains("No route to host")),
        "{unreachable:?}"
    );
    let after = fx.nodes[n1].counters();
    eprintln!("node 1, to itself and unreachable: {before:?} → {after:?}");
    assert!(after.pass > before.pass, "{after:?}");
    assert!(after.fib_fail > before.fib_fail, "{after:?}");
}
