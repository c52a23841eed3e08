//! `type: LoadBalancer` on bare metal: one node at a time answers ARP for a Service's
//! LoadBalancer address (chosen by a Lease per address, the answer sent by the eBPF program
//! on its uplink) and the eBPF load balancer serves the address on every node. Machines that
//! share only a network (`skiff_tests::machines`): a `laptop` on the nodes' segment asks for
//! the address with a python `AF_PACKET` socket and connects to it.
//!
//! - `externalTrafficPolicy: Cluster`: a connection from the laptop reaches a pod, SNATed to
//!   the announcing node's address. The announcing node's agent is killed (by pid): another
//!   node answers ARP within 5 s after a gratuitous ARP, no ARP request is ever answered by
//!   two nodes (the dead agent's entry stops at its lease's expiry although its program
//!   stays attached), and new connections succeed. The new announcer's uplink is set down:
//!   a third node takes over the same way. The killed agent restarted and the announcer's
//!   agent stopped (SIGTERM): it releases its Lease and the restarted node takes over at
//!   once (well before the Lease's expiry).
//! - `externalTrafficPolicy: Local`: only nodes with a ready endpoint announce (the pod on
//!   the announcing node deleted: the other endpoint node takes over, never the node
//!   without one; no endpoint left: nobody answers), and the pod sees the laptop's address
//!   as the client's.
//!
//! The addresses come from a `LoadBalancerIPPool` through the controller manager's lbipam
//! controller (each Service asks for its own with `skiff.io/lb-ips`). The measured times are
//! printed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use skiff_api::api::{Endpoints, Lease, LoadBalancerIpPool, Pod, Service};
use skiff_client::Client;
use skiff_tests::cluster::Cluster;
use skiff_tests::eventually_within;

const T: Duration = Duration::from_secs(60);
/// Addresses on the fabric's subnet that no machine is given.
const CLUSTER_IP: &str = "192.168.100.240";
const LOCAL_IP: &str = "192.168.100.241";
/// How fast another node must take an address over.
const FAILOVER: Duration = Duration::from_secs(5);

/// On the laptop. `watch IP SECONDS ME`: asks for IP every 100 ms (ARP requests from ME
/// out of eth0) and prints, as JSON, each reply and each gratuitous ARP for IP with its time
/// and sender MAC (`seq`: the request a reply answers). `connect IP PORT N`: N TCP
/// connections, each reading one line (or the error).
const LAPTOP: &str = r#"
import json, select, socket, sys, time
if sys.argv[1] == "connect":
    out = []
    for _ in range(int(sys.argv[4])):
        try:
            c = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=2)
            c.settimeout(2)
            out.append(c.makefile("r").readline().strip())
            c.close()
        except OSError as e:
            out.append("error: %s" % e)
    print(json.dumps(out), flush=True)
    sys.exit(0)
ip, dur, me = socket.inet_aton(sys.argv[2]), float(sys.argv[3]), socket.inet_aton(sys.argv[4])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind(("eth0", 0))
mac = s.getsockname()[4]
req = b"\xff" * 6 + mac + b"\x08\x06" + bytes([0, 1, 8, 0, 6, 4, 0, 1]) + mac + me + b"\0" * 6 + ip
events, seq, next_ask = [], 0, 0.0
print("ready", flush=True)
end = time.time() + dur
while time.time() < end:
    if time.time() >= next_ask:
        seq += 1
        s.send(req)
        next_ask = time.time() + 0.1
    r, _, _ = select.select([s], [], [], max(0.0, min(next_ask, end) - time.time()))
    if not r:
        continue
    f = s.recv(100)
    if len(f) < 42 or f[12:14] != b"\x08\x06" or f[28:32] != ip:
        continue
    if f[20:22] == b"\0\2" and f[38:42] == me:
        events.append({"t": time.time(), "kind": "reply", "mac": f[22:28].hex(":"), "seq": seq})
    elif f[38:42] == ip:
        events.append({"t": time.time(), "kind": "garp", "mac": f[22:28].hex(":"), "seq": seq})
print(json.dumps(events), flush=True)
"#;

/// A pod on `node` answering each TCP connection on 8080 with `<name> <client ip>:<port>`.
fn pod(name: &str, app: &str, node: &str) -> Pod {
    let script = format!(
        "import socket\n\
         s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('0.0.0.0', 8080)); s.listen(64)\n\
         while True:\n    c, a = s.accept()\n    c.sendall(('{name} %s:%d\\n' % a).encode())\n    c.close()\n"
    );
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "app", "image": "host",
                "command": ["/usr/bin/python3", "-c", script],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
            }]
        }
    }))
    .expect("pod")
}

/// A LoadBalancer Service asking the lbipam controller for address `ip`.
fn service(name: &str, app: &str, policy: &str, ip: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default",
                     "annotations": {"skiff.io/lb-ips": ip}},
        "spec": {
            "type": "LoadBalancer",
            "externalTrafficPolicy": policy,
            "selector": {"app": app},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
        }
    }))
    .expect("service")
}

/// The pool the Services' addresses come from (the controller manager's lbipam controller
/// writes them to `status.loadBalancer.ingress`).
async fn address_pool(client: &Client) {
    let pool: LoadBalancerIpPool = serde_json::from_value(json!({
        "apiVersion": "skiff.io/v1", "kind": "LoadBalancerIPPool",
        "metadata": {"name": "l2-test"},
        "spec": {"blocks": [{"start": CLUSTER_IP, "stop": LOCAL_IP}]}
    }))
    .expect("pool");
    client
        .cluster::<LoadBalancerIpPool>()
        .create(&pool)
        .await
        .expect("create the address pool");
}

/// Waits until Service `name` has `ip` in `status.loadBalancer.ingress`.
async fn has_address(client: &Client, name: &str, ip: &str) {
    let api = client.namespaced::<Service>("default");
    eventually_within(&format!("{name} gets {ip}"), T, || async {
        let svc = api.get(name).await.map_err(|e| e.to_string())?;
        let ingress = svc
            .status
            .and_then(|s| s.load_balancer)
            .map(|lb| lb.ingress)
            .unwrap_or_default();
        ingress
            .iter()
            .any(|i| i.ip == ip)
            .then_some(())
            .ok_or(format!("{ingress:?}"))
    })
    .await;
}

/// The node holding the L2 announcement Lease of `ip`, once someone does.
async fn holder(client: &Client, ip: &str) -> String {
    let leases = client.namespaced::<Lease>("kube-system");
    let name = format!("skiff-l2-{}", ip.replace('.', "-"));
    eventually_within(&format!("a holder of {name}"), T, || async {
        let lease = leases.get_opt(&name).await.map_err(|e| e.to_string())?;
        lease
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
            .ok_or(format!("{name}: no holder"))
    })
    .await
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

struct Watch {
    child: std::process::Child,
}

impl Watch {
    /// Starts asking for `ip` from the laptop for `secs` seconds.
    fn start(c: &Cluster, ip: &str, secs: u32) -> Watch {
        let mut child = c
            .laptop
            .command("python3")
            .args(["-c", LAPTOP, "watch", ip, &secs.to_string()])
            .arg(c.laptop.ip.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the laptop's ARP watch");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("stdout"))
            .read_line(&mut line)
            .expect("ready line");
        assert_eq!(line.trim(), "ready");
        Watch { child }
    }

    fn events(self) -> Vec<Value> {
        let out = self
            .child
            .wait_with_output()
            .expect("the ARP watch's output");
        assert!(
            out.status.success(),
            "ARP watch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{text}: {e}"))
    }
}

/// `n` connections from the laptop to `ip`:80: each answer line or error.
fn connect(c: &Cluster, ip: &str, n: u32) -> Vec<String> {
    let out = c
        .laptop
        .command("python3")
        .args(["-c", LAPTOP, "connect", ip, "80", &n.to_string()])
        .output()
        .expect("the laptop's client");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// The MAC of each node's uplink (`eth0` of its machine).
fn node_macs(c: &Cluster) -> BTreeMap<String, String> {
    c.nodes
        .iter()
        .map(|n| {
            let j: Value =
                serde_json::from_str(&n.ip(&["-j", "link", "show", "eth0"])).expect("ip -j link");
            (
                n.name.clone(),
                j[0]["address"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// The replies (time, sender MAC) of a watch.
type Answers = Vec<(f64, String)>;
/// For each request of a watch, the MACs that answered it.
type ByRequest = BTreeMap<u64, BTreeSet<String>>;

/// Who answered: MACs of the replies, and for each request the MACs that answered it.
fn replies(events: &[Value]) -> (Answers, ByRequest) {
    let mut all = Vec::new();
    let mut by_request = ByRequest::new();
    for e in events.iter().filter(|e| e["kind"] == "reply") {
        let mac = e["mac"].as_str().unwrap_or_default().to_string();
        all.push((e["t"].as_f64().unwrap_or_default(), mac.clone()));
        by_request
            .entry(e["seq"].as_u64().unwrap_or_default())
            .or_default()
            .insert(mac);
    }
    (all, by_request)
}

/// A new connection from the laptop to `ip` reaches a pod (fresh source ports until one
/// does: Maglev may pick a backend on a node that is down); prints how long it took.
async fn new_connection(c: &Cluster, ip: &str, what: &str) {
    let started = std::time::Instant::now();
    let answer = eventually_within(&format!("{what}: a new connection"), T, || async {
        let a = connect(c, ip, 3);
        a.iter()
            .find(|a| a.starts_with("web-"))
            .cloned()
            .ok_or_else(|| format!("{a:?}\n{}", c.logs()))
    })
    .await;
    println!(
        "{what}: a new connection ({answer}) {:.2?} later",
        started.elapsed()
    );
}

/// Watches `ip` while `disrupt` takes its announcer `old` out; asserts another node answers
/// within [`FAILOVER`] after a gratuitous ARP and no request ever got two answers. Returns
/// the new announcer and how long it took.
async fn fails_over(
    c: &mut Cluster,
    ip: &str,
    old: &str,
    what: &str,
    disrupt: impl FnOnce(&mut Cluster),
) -> (String, Duration) {
    let macs = node_macs(c);
    let watch = Watch::start(c, ip, 10);
    std::thread::sleep(Duration::from_millis(500));
    let t0 = now_secs();
    disrupt(c);
    let events = watch.events();
    let (answers, by_request) = replies(&events);
    let twice: Vec<_> = by_request.iter().filter(|(_, m)| m.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "{what}: ARP requests answered by two nodes: {twice:?}\n{}",
        c.logs()
    );
    assert!(
        answers.iter().any(|(t, m)| *t < t0 && *m == macs[old]),
        "{what}: {old} answered before: {answers:?}"
    );
    let (t_new, new_mac) = answers
        .iter()
        .find(|(t, m)| *t > t0 && *m != macs[old])
        .cloned()
        .unwrap_or_else(|| panic!("{what}: nobody else answered: {answers:?}\n{}", c.logs()));
    let new = macs
        .iter()
        .find(|(_, m)| **m == new_mac)
        .map(|(n, _)| n.clone())
        .unwrap_or_else(|| panic!("{what}: {new_mac} is no node's"));
    let garp = events
        .iter()
        .find(|e| e["kind"] == "garp" && e["mac"] == new_mac.as_str())
        .and_then(|e| e["t"].as_f64());
    assert!(
        garp.is_some(),
        "{what}: no gratuitous ARP from {new}: {events:?}"
    );
    let took = Duration::from_secs_f64(t_new - t0);
    println!(
        "{what}: {old} -> {new}: ARP answered by {new} after {took:.2?}, gratuitous ARP after \
         {:.2?}",
        Duration::from_secs_f64(garp.unwrap_or(t0) - t0),
    );
    assert!(took < FAILOVER, "{what}: failover took {took:?}");
    assert!(
        answers.iter().all(|(t, m)| *t < t_new || *m != macs[old]),
        "{what}: {old} answered after {new} took over: {answers:?}"
    );
    assert_eq!(holder(&c.client, ip).await, new);
    (new, took)
}

async fn ready_endpoints(client: &Client, service: &str, n: usize) {
    let api = client.namespaced::<Endpoints>("default");
    eventually_within(&format!("{n} ready endpoints of {service}"), T, || async {
        let eps = api.get_opt(service).await.map_err(|e| e.to_string())?;
        let ready: usize = eps
            .iter()
            .flat_map(|e| &e.subsets)
            .map(|s| s.addresses.len())
            .sum();
        (ready == n).then_some(()).ok_or(format!("{ready} ready"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn load_balancer_addresses_are_announced_by_one_node_and_fail_over() {
    let mut c = Cluster::start(3).await;
    let names: Vec<String> = c.nodes.iter().map(|n| n.name.clone()).collect();
    let pods = c.client.namespaced::<Pod>("default");
    for (i, node) in names.iter().enumerate() {
        pods.create(&pod(&format!("web-{i}"), "web", node))
            .await
            .expect("web pod");
    }
    // Local: endpoints on the first two nodes only.
    for (i, node) in names.iter().take(2).enumerate() {
        pods.create(&pod(&format!("local-{i}"), "local", node))
            .await
            .expect("local pod");
    }
    address_pool(&c.client).await;
    let services = c.client.namespaced::<Service>("default");
    services
        .create(&service("web", "web", "Cluster", CLUSTER_IP))
        .await
        .expect("web service");
    services
        .create(&service("local", "local", "Local", LOCAL_IP))
        .await
        .expect("local service");
    ready_endpoints(&c.client, "web", 3).await;
    ready_endpoints(&c.client, "local", 2).await;
    has_address(&c.client, "web", CLUSTER_IP).await;
    has_address(&c.client, "local", LOCAL_IP).await;
    let macs = node_macs(&c);

    // Cluster: a connection from the laptop reaches a pod; one node answers ARP, the Lease's.
    let answer = eventually_within("a connection to the LoadBalancer address", T, || async {
        let a = connect(&c, CLUSTER_IP, 1);
        a.iter()
            .find(|a| a.starts_with("web-"))
            .cloned()
            .ok_or_else(|| format!("{a:?}\n{}", c.logs()))
    })
    .await;
    println!("{CLUSTER_IP}:80 from the laptop: {answer}");
    let first = holder(&c.client, CLUSTER_IP).await;
    // SNAT to the announcing node's own address (not to the LoadBalancer address).
    let first_ip = c
        .nodes
        .iter()
        .find(|n| n.name == first)
        .unwrap()
        .node_ip
        .clone();
    let seen = answer.split_whitespace().nth(1).unwrap_or_default();
    assert!(
        seen.starts_with(&format!("{first_ip}:")),
        "the pod saw {seen}, not {first}'s address"
    );
    let (answers, _) = replies(&Watch::start(&c, CLUSTER_IP, 1).events());
    assert!(!answers.is_empty(), "nobody answers ARP for {CLUSTER_IP}");
    assert!(
        answers.iter().all(|(_, m)| *m == macs[&first]),
        "{answers:?}: not only {first} ({})",
        macs[&first]
    );

    // Local: the announcer has an endpoint, the client's address reaches the pod.
    let local_holder = holder(&c.client, LOCAL_IP).await;
    assert_ne!(local_holder, names[2], "a node without endpoint announces");
    let laptop = c.laptop.ip.to_string();
    let answers = eventually_within("a connection to the Local address", T, || async {
        let a = connect(&c, LOCAL_IP, 5);
        a.iter()
            .all(|a| a.starts_with("local-"))
            .then_some(a.clone())
            .ok_or(format!("{a:?}"))
    })
    .await;
    println!("{LOCAL_IP}:80 (Local) from the laptop: {answers:?}");
    for a in &answers {
        let client = a.split_whitespace().nth(1).unwrap_or_default();
        assert!(
            client.starts_with(&format!("{laptop}:")),
            "the pod saw {client}, not the laptop's {laptop}"
        );
        // Only the announcer's own endpoint serves (no hop to another node).
        let i = names.iter().position(|n| *n == local_holder).unwrap();
        assert!(a.starts_with(&format!("local-{i} ")), "{a}");
    }
    // From a pod on the node without a local endpoint: the connection is made inside the
    // cluster, so it reaches an endpoint on another node (kube-proxy does the same).
    let from_inside = eventually_within("a pod connects to the Local address", T, || async {
        let (ok, out, err) = c.kubectl(
            &[
                "exec",
                "web-2",
                "--",
                "/usr/bin/python3",
                "-c",
                &format!(
                    "import socket; s = socket.create_connection(('{LOCAL_IP}', 80), 2); \
                     print(s.recv(100).decode().strip())"
                ),
            ],
            None,
        );
        (ok && out.starts_with("local-"))
            .then(|| out.trim().to_string())
            .ok_or(format!("{out} {err}"))
    })
    .await;
    println!(
        "{LOCAL_IP}:80 (Local) from a pod on {}: {from_inside}",
        names[2]
    );
    // Its endpoint gone, the other endpoint node takes over; the node without one never.
    let i = names.iter().position(|n| *n == local_holder).unwrap();
    let watch = Watch::start(&c, LOCAL_IP, 8);
    let t0 = now_secs();
    pods.delete(&format!("local-{i}"), &Default::default())
        .await
        .expect("delete the announcer's local pod");
    let (answers, by_request) = replies(&watch.events());
    let other = &names[1 - i];
    let moved = answers
        .iter()
        .find(|(t, m)| *t > t0 && *m == macs[other])
        .map(|(t, _)| Duration::from_secs_f64(t - t0));
    println!("{LOCAL_IP} (Local): {local_holder} -> {other} after {moved:?}");
    assert!(moved.is_some(), "{other} did not take over: {answers:?}");
    assert!(
        answers.iter().all(|(_, m)| *m != macs[&names[2]]),
        "{} (no endpoint) answered: {answers:?}",
        names[2]
    );
    assert!(by_request.values().all(|m| m.len() == 1), "{by_request:?}");
    // No endpoint left anywhere: nobody announces (not the node that never had one either).
    pods.delete(&format!("local-{}", 1 - i), &Default::default())
        .await
        .expect("delete the other local pod");
    ready_endpoints(&c.client, "local", 0).await;
    eventually_within("nobody answers for the Local address", T, || async {
        let (answers, _) = replies(&Watch::start(&c, LOCAL_IP, 1).events());
        answers
            .is_empty()
            .then_some(())
            .ok_or(format!("{answers:?}"))
    })
    .await;

    // Cluster: the announcer's agent killed (its program and map stay): another node.
    let killed = names.iter().position(|n| *n == first).unwrap();
    let (second, _) = fails_over(&mut c, CLUSTER_IP, &first, "agent killed", |c| {
        c.nodes[killed].kill_agent()
    })
    .await;
    new_connection(&c, CLUSTER_IP, "agent killed").await;

    // Cluster: the new announcer's uplink down: the third node.
    let down = names.iter().position(|n| *n == second).unwrap();
    let (third, _) = fails_over(&mut c, CLUSTER_IP, &second, "uplink down", |c| {
        c.nodes[down].ip(&["link", "set", "eth0", "down"]);
    })
    .await;
    new_connection(&c, CLUSTER_IP, "uplink down").await;
    assert!(third != first && third != second);

    // The killed agent back (its expired entry is removed), the announcer's agent stopped
    // with SIGTERM: it releases the Lease, and the other node takes over at once, without
    // waiting for the expiry (ARP only: after three disruptions which backends still run is
    // the node lifecycle's business, not this test's).
    c.nodes[killed].start_agent();
    eventually_within("the restarted agent announces again", T, || async {
        let log = c.nodes[killed].agent_log();
        (log.matches("L2 announcement of LoadBalancer addresses running")
            .count()
            >= 2)
            .then_some(())
            .ok_or("not yet".to_string())
    })
    .await;
    let stopped = names.iter().position(|n| *n == third).unwrap();
    let (fourth, took) = fails_over(&mut c, CLUSTER_IP, &third, "agent stopped", |c| {
        let pid = c.nodes[stopped].agent_pid().expect("the agent's pid");
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill -TERM");
        assert!(term.success());
    })
    .await;
    assert_eq!(fourth, first);
    assert!(
        took < Duration::from_millis(1500),
        "a released address took {took:?}"
    );
}
