//! Pod networking against real namespaces and veths (needs root).
//!
//! Safety: every namespace used here is created by the test (`skiff-test-<random>-*`), every
//! address, route and packet lives inside them, and a [`World`] guard deletes the namespaces
//! (which destroys the veths in them) and kills the processes it started, also when a test
//! panics. Nothing is configured in the machine's root network namespace; one test checks that.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use skiff_hostnet::{NetError, NodeNetwork, NodeNetworkConfig, host_veth_name};

/// Namespaces and processes a test created; all removed on drop.
struct World {
    prefix: String,
    netns: Vec<String>,
    children: Vec<Child>,
}

impl World {
    fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let seed = nanos ^ std::process::id().rotate_left(16) ^ random_u32();
        Self {
            prefix: format!("skiff-test-{seed:08x}"),
            netns: Vec::new(),
            children: Vec::new(),
        }
    }

    /// Creates `skiff-test-<random>-<suffix>` and returns its name.
    fn add_netns(&mut self, suffix: &str) -> String {
        let name = format!("{}-{suffix}", self.prefix);
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        self.netns.push(name.clone());
        name
    }

    fn spawn(&mut self, cmd: &mut Command) -> &mut Child {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        self.children.push(child);
        self.children.last_mut().expect("just pushed")
    }

    /// A pod uid unique to this test run.
    fn uid(&self, pod: &str) -> String {
        format!("{}-{pod}", self.prefix)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for child in &mut self.children {
            // Killed by pid (the Child), never by name.
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in &self.netns {
            let out = Command::new("ip").args(["netns", "del", ns]).output();
            if !matches!(&out, Ok(o) if o.status.success()) {
                eprintln!("cleanup: ip netns del {ns} failed: {out:?}");
            }
        }
    }
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    u32::from_ne_bytes(b)
}

fn netns_path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip -n <ns> <args>` (inspection and test-only setup inside the test's namespaces).
fn ip_in(ns: &str, args: &[&str]) -> Output {
    run(Command::new("ip").arg("-n").arg(ns).args(args))
}

/// A command run inside the network namespace `ns` (setns via nsenter; no /sys remount).
fn in_ns(ns: &str, program: &str) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", netns_path(ns).display()))
        .arg("--")
        .arg(program);
    cmd
}

/// One ICMP echo from `ns` to `dst`, tried up to `attempts` times (1 s timeout each).
fn ping_attempts(ns: &str, dst: IpAddr, attempts: u32) -> bool {
    (0..attempts).any(|_| {
        run(in_ns(ns, "busybox").args(["ping", "-c", "1", "-W", "1", &dst.to_string()]))
            .status
            .success()
    })
}

fn ping(ns: &str, dst: IpAddr) -> bool {
    ping_attempts(ns, dst, 3)
}

fn unreachable(ns: &str, dst: IpAddr) -> bool {
    !ping_attempts(ns, dst, 1)
}

const TCP_SERVER: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
s.settimeout(10)
print("ready", flush=True)
c, peer = s.accept()
c.settimeout(5)
data = c.recv(64)
c.sendall(b"pong")
print(peer[0], data.decode(), flush=True)
"#;

const TCP_CLIENT: &str = r#"
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
c.sendall(b"ping")
print(c.recv(64).decode(), flush=True)
"#;

/// TCP from `client_ns` to `server_ip:port` served in `server_ns`; returns the source address
/// the server saw.
fn tcp_source_seen_by_server(
    world: &mut World,
    server_ns: &str,
    server_ip: IpAddr,
    client_ns: &str,
) -> String {
    let port = "18080";
    let server = world.spawn(in_ns(server_ns, "python3").args([
        "-c",
        TCP_SERVER,
        &server_ip.to_string(),
        port,
    ]));
    let mut lines = BufReader::new(server.stdout.take().expect("server stdout")).lines();
    let ready = lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(ready, "ready", "TCP server in {server_ns} did not start");
    let reply =
        run_ok(in_ns(client_ns, "python3").args(["-c", TCP_CLIENT, &server_ip.to_string(), port]));
    assert_eq!(reply.trim(), "pong");
    let seen = lines
        .next()
        .and_then(Result::ok)
        .expect("server reported its peer");
    let (source, data) = seen.split_once(' ').expect("'<peer> <data>'");
    assert_eq!(data, "ping");
    source.to_string()
}

fn link_exists(ns: &str, name: &str) -> bool {
    ip_in(ns, &["link", "show", "dev", name]).status.success()
}

fn routes(ns: &str, dst: IpAddr) -> String {
    String::from_utf8_lossy(&ip_in(ns, &["-4", "route", "show", &format!("{dst}/32")]).stdout)
        .into_owned()
}

fn config(node_ns: &str, cidr: &str, state: &tempfile::TempDir) -> NodeNetworkConfig {
    NodeNetworkConfig {
        node_netns: Some(netns_path(node_ns)),
        pod_cidr: cidr.to_string(),
        state_dir: state.path().to_path_buf(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_routed_addresses_reach_each_other_and_survive_restarts() {
    let started = Instant::now();
    let mut world = World::new();
    let node = world.add_netns("node");
    let ns_a = world.add_netns("a");
    let ns_b = world.add_netns("b");
    let ns_c = world.add_netns("c");
    let (uid_a, uid_b, uid_c) = (world.uid("a"), world.uid("b"), world.uid("c"));
    let state = tempfile::tempdir().expect("tempdir");

    // A stand-in uplink inside the node namespace (this kernel has no dummy driver): a veth
    // pair with both ends in the node namespace, a documentation address and a default route
    // towards a gateway nobody answers for. It gives the node an address to report and gives
    // proxy ARP a route to 169.254.1.1; whatever goes out of it stays in the node namespace.
    for args in [
        &[
            "link",
            "add",
            "uplink",
            "type",
            "veth",
            "peer",
            "name",
            "uplink-peer",
        ][..],
        &["addr", "add", "192.0.2.10/24", "dev", "uplink"],
        &["link", "set", "uplink-peer", "up"],
        &["link", "set", "uplink", "up"],
        &[
            "route",
            "add",
            "default",
            "via",
            "192.0.2.1",
            "dev",
            "uplink",
        ],
    ] {
        let out = ip_in(&node, args);
        assert!(out.status.success(), "ip -n {node} {args:?}: {out:?}");
    }

    let net = NodeNetwork::new(config(&node, "10.244.7.0/24", &state))
        .await
        .expect("node network");
    assert_eq!(net.node_ip().await, Some("192.0.2.10".parse().expect("ip")));
    let forwarding = run_ok(in_ns(&node, "cat").arg("/proc/sys/net/ipv4/ip_forward"));
    assert_eq!(forwarding.trim(), "1");

    // Two pods, distinct usable addresses from the CIDR.
    let a = net
        .attach_pod(&uid_a, &netns_path(&ns_a))
        .await
        .expect("attach a");
    let b = net
        .attach_pod(&uid_b, &netns_path(&ns_b))
        .await
        .expect("attach b");
    let cidr = net.pod_cidr();
    for att in [&a, &b] {
        assert!(cidr.contains(att.pod_ip), "{att:?}");
        assert_ne!(att.pod_ip, cidr.network());
        assert_ne!(att.pod_ip, cidr.reserved_first());
        assert_ne!(att.pod_ip, "10.244.7.255".parse::<IpAddr>().expect("ip"));
    }
    assert_ne!(a.pod_ip, b.pod_ip);
    assert_eq!(a.host_veth, host_veth_name(&uid_a));
    assert!(a.host_veth.len() <= 15);

    // The topology, as `ip` sees it.
    let eth0 =
        String::from_utf8_lossy(&ip_in(&ns_a, &["-4", "addr", "show", "dev", "eth0"]).stdout)
            .into_owned();
    assert!(eth0.contains(&format!("inet {}/32", a.pod_ip)), "{eth0}");
    let default =
        String::from_utf8_lossy(&ip_in(&ns_a, &["route", "show", "default"]).stdout).into_owned();
    assert!(
        default.contains("via 169.254.1.1 dev eth0") && default.contains("onlink"),
        "{default}"
    );
    assert!(routes(&node, a.pod_ip).contains(&format!("dev {}", a.host_veth)));
    let proxy_arp = run_ok(
        in_ns(&node, "cat").arg(format!("/proc/sys/net/ipv4/conf/{}/proxy_arp", a.host_veth)),
    );
    assert_eq!(proxy_arp.trim(), "1");
    // Nothing leaked into the root namespace.
    assert!(
        !run(Command::new("ip").args(["link", "show", "dev", &a.host_veth]))
            .status
            .success()
    );

    // A reaches B by pod IP, and B sees A's real address (no NAT).
    assert!(ping(&ns_a, b.pod_ip), "pod A cannot ping pod B");
    let source = tcp_source_seen_by_server(&mut world, &ns_b, b.pod_ip, &ns_a);
    assert_eq!(source, a.pod_ip.to_string(), "B must see A's pod IP");
    // The node namespace reaches pod A.
    assert!(ping(&node, a.pod_ip), "node cannot ping pod A");

    // Without the static neighbour entry the gateway still resolves, through proxy ARP.
    let out = ip_in(&ns_a, &["neigh", "del", "169.254.1.1", "dev", "eth0"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        ping(&ns_a, b.pod_ip),
        "pod A cannot reach B through proxy ARP"
    );

    // Attach is idempotent, and converges after partial damage.
    assert_eq!(
        net.attach_pod(&uid_a, &netns_path(&ns_a))
            .await
            .expect("again"),
        a
    );
    assert!(
        ip_in(&node, &["route", "del", &format!("{}/32", a.pod_ip)])
            .status
            .success()
    );
    assert!(
        ip_in(&node, &["link", "set", &a.host_veth, "down"])
            .status
            .success()
    );
    assert!(ip_in(&ns_a, &["route", "del", "default"]).status.success());
    assert!(
        ip_in(&ns_a, &["addr", "flush", "dev", "eth0"])
            .status
            .success()
    );
    assert!(unreachable(&ns_a, b.pod_ip), "the damage must break A");
    assert_eq!(
        net.attach_pod(&uid_a, &netns_path(&ns_a))
            .await
            .expect("repair"),
        a
    );
    assert!(ping(&ns_a, b.pod_ip), "pod A cannot reach B after repair");
    // A host veth that vanished is recreated.
    assert!(
        ip_in(&node, &["link", "del", &a.host_veth])
            .status
            .success()
    );
    let a2 = net
        .attach_pod(&uid_a, &netns_path(&ns_a))
        .await
        .expect("recreate");
    assert_eq!(a2.pod_ip, a.pod_ip);
    assert!(ping(&ns_b, a.pod_ip), "pod B cannot reach recreated pod A");

    // Agent restart: a new NodeNetwork over the same state keeps every allocation and never
    // hands out a live address.
    let before = net.allocations();
    drop(net);
    let net = NodeNetwork::new(config(&node, "10.244.7.0/24", &state))
        .await
        .expect("restarted node network");
    assert_eq!(net.allocations(), before);
    assert_eq!(net.pod_ip(&uid_a), Some(a.pod_ip));
    let c = net
        .attach_pod(&uid_c, &netns_path(&ns_c))
        .await
        .expect("attach c");
    assert!(c.pod_ip != a.pod_ip && c.pod_ip != b.pod_ip, "{c:?}");
    assert_eq!(
        net.attach_pod(&uid_a, &netns_path(&ns_a))
            .await
            .expect("a after restart"),
        a2
    );
    assert!(ping(&ns_c, a.pod_ip), "pod C cannot reach pod A");

    // Detach removes the host veth (and with it eth0), the route, and frees the address.
    net.detach_pod(&uid_b).await.expect("detach b");
    assert!(!link_exists(&node, &b.host_veth));
    assert!(!link_exists(&ns_b, "eth0"));
    assert_eq!(routes(&node, b.pod_ip).trim(), "");
    assert!(
        net.allocations()
            .iter()
            .all(|(ip, uid)| *ip != b.pod_ip && *uid != uid_b)
    );
    assert!(
        !state
            .path()
            .join("ipam")
            .join(b.pod_ip.to_string())
            .exists()
    );
    net.detach_pod(&uid_b).await.expect("detach b again");
    assert!(
        unreachable(&ns_a, b.pod_ip),
        "B must be unreachable after detach"
    );

    net.detach_pod(&uid_a).await.expect("detach a");
    net.detach_pod(&uid_c).await.expect("detach c");
    assert!(net.allocations().is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn invalid_cidr_is_a_clear_error() {
    // The CIDR is validated before the namespace is touched; the path does not exist anyway,
    // so a regression could not reach the root namespace.
    let state = tempfile::tempdir().expect("tempdir");
    for bad in ["10.244.7.1/24", "10.244.7.0/31", "banana", "fd00::/64"] {
        let cfg = NodeNetworkConfig {
            node_netns: Some(PathBuf::from("/run/netns/skiff-test-does-not-exist")),
            pod_cidr: bad.to_string(),
            state_dir: state.path().to_path_buf(),
        };
        match NodeNetwork::new(cfg).await {
            Err(e @ NetError::PodCidrInvalid { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(bad), "{msg}");
            }
            Err(other) => panic!("{bad}: expected PodCidrInvalid, got {other}"),
            Ok(_) => panic!("{bad}: accepted"),
        }
    }
}

/// Also runs on a current-thread runtime (the netns threads only register sockets with it).
#[tokio::test]
async fn a_slash_30_holds_one_pod_then_is_exhausted() {
    let mut world = World::new();
    let node = world.add_netns("node");
    let ns_1 = world.add_netns("p1");
    let ns_2 = world.add_netns("p2");
    let (uid_1, uid_2) = (world.uid("p1"), world.uid("p2"));
    let state = tempfile::tempdir().expect("tempdir");
    let net = NodeNetwork::new(config(&node, "10.244.9.0/30", &state))
        .await
        .expect("node network");
    assert_eq!(net.node_ip().await, None);

    let p1 = net
        .attach_pod(&uid_1, &netns_path(&ns_1))
        .await
        .expect("attach 1");
    assert_eq!(p1.pod_ip, IpAddr::V4(Ipv4Addr::new(10, 244, 9, 2)));
    match net.attach_pod(&uid_2, &netns_path(&ns_2)).await {
        Err(NetError::Exhausted { cidr }) => assert_eq!(cidr, "10.244.9.0/30"),
        other => panic!("expected Exhausted, got {other:?}"),
    }
    // Nothing was created for the pod that got no address.
    assert!(!link_exists(&node, &host_veth_name(&uid_2)));
    assert!(!link_exists(&ns_2, "eth0"));

    net.detach_pod(&uid_1).await.expect("detach 1");
    let p2 = net
        .attach_pod(&uid_2, &netns_path(&ns_2))
        .await
        .expect("attach 2");
    assert_eq!(p2.pod_ip, p1.pod_ip);

    net.detach_pod(&uid_2).await.expect("detach 2");

    // A pod namespace that does not exist is a Netns error naming it; detach cleans up after it.
    let ghost = world.uid("ghost");
    let missing = netns_path(&format!("{}-missing", world.prefix));
    match net.attach_pod(&ghost, &missing).await {
        Err(e @ NetError::Netns { .. }) => assert!(e.to_string().contains("missing"), "{e}"),
        other => panic!("expected Netns error, got {other:?}"),
    }
    net.detach_pod(&ghost).await.expect("detach ghost");
    assert!(net.allocations().is_empty());
}
