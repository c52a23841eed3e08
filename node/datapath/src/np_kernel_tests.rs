//! NodePort from outside the node against the real kernel: the `skiff_np_ingress` tc program
//! on a "node" namespace's uplink and on its two "pod" host veths. Needs root.
//!
//! ```text
//!  client ns  c0 10.201.0.2, .3 ── n0 10.201.0.1 (node IP)   node ns (ip_forward=1)
//!                                  h1 10.202.1.1 ── p1 10.202.1.11   backend ns b1
//!                                  h2 10.202.2.1 ── p2 10.202.2.12   backend ns b2
//! ```
//!
//! Safety: every namespace, veth and address lives in namespaces the test created; nothing is
//! configured in, or sent from, the root namespace. The guard kills the servers by pid,
//! removes the pins (detaching the programs and freeing the maps) and the namespaces (with
//! their veths), also when a test fails.

use std::io::Read as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use skiff_common::lb::{NP_CT_FORWARD, NP_CT_REPLY, NP_NAT_PORT_MAX, NP_NAT_PORT_MIN};

use super::lb::{BackendAddr, Frontend, LbConfig, Protocol, ServiceLb, ServiceParams, TcAttach};
use super::*;
use crate::testing::{python, run, unique_name, wait_timeout};

const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
const TCP_NODE_PORT: u16 = 30080;
const UDP_NODE_PORT: u16 = 30053;
const BACKEND_PORT: u16 = 8080;

fn backend_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 202, i as u8, 10 + i as u8)
}

/// Backend: TCP answers `<name> <peer ip>:<peer port>` and closes; UDP answers the same.
const SERVER: &str = r#"
import socket, sys, threading
name, ip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((ip, port))
    while True:
        _, src = u.recvfrom(100)
        u.sendto(("%s %s:%d" % (name, src[0], src[1])).encode(), src)
threading.Thread(target=udp, daemon=True).start()
t = socket.socket()
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((ip, port))
t.listen(128)
print("ready", flush=True)
while True:
    c, src = t.accept()
    c.sendall(("%s %s:%d\n" % (name, src[0], src[1])).encode())
    c.close()
"#;

/// Client: `tcp N` connects N times, `udp N` sends N datagrams from fresh sockets, `collide`
/// connects from two client addresses with the same source port.
const CLIENT: &str = r#"
import json, socket, sys
mode, ip = sys.argv[1], sys.argv[2]
out = []
if mode == "tcp":
    for _ in range(int(sys.argv[4])):
        s = socket.create_connection((ip, int(sys.argv[3])), timeout=5)
        line = s.makefile("r").readline().strip()
        out.append({"answer": line, "peer": "%s:%d" % s.getpeername()})
        s.close()
elif mode == "udp":
    for _ in range(int(sys.argv[4])):
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.settimeout(5)
        u.sendto(b"ping", (ip, int(sys.argv[3])))
        data, src = u.recvfrom(100)
        out.append({"answer": data.decode(), "peer": "%s:%d" % src})
        u.close()
elif mode in ("tcp-ports", "udp-ports"):
    # From source address argv[4], ports argv[5] .. argv[5] + argv[6] - 1: one flow each.
    src, first, n = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    for sport in range(first, first + n):
        kind = socket.SOCK_STREAM if mode == "tcp-ports" else socket.SOCK_DGRAM
        s = socket.socket(socket.AF_INET, kind)
        s.settimeout(5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((src, sport))
        if kind == socket.SOCK_STREAM:
            s.connect((ip, int(sys.argv[3])))
            line = s.makefile("r").readline().strip()
        else:
            s.sendto(b"ping", (ip, int(sys.argv[3])))
            line = s.recvfrom(100)[0].decode()
        out.append({"answer": line, "sport": sport})
        s.close()
elif mode == "collide":
    socks = []
    for src in sys.argv[4:]:
        s = socket.socket()
        s.settimeout(5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((src, 40000))
        s.connect((ip, int(sys.argv[3])))
        socks.append(s)
    for s in socks:
        out.append({"answer": s.makefile("r").readline().strip(), "peer": "%s:%d" % s.getpeername()})
print(json.dumps(out), flush=True)
"#;

struct NpFixture {
    client_ns: String,
    node_ns: String,
    backend_ns: Vec<String>,
    pin_dir: PathBuf,
    servers: Vec<Child>,
    created: Vec<String>,
}

impl NpFixture {
    fn new() -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        assert_eq!(unsafe { libc::geteuid() }, 0, "needs root");
        let suffix = unique_name();
        let mut fx = NpFixture {
            client_ns: format!("skiff-test-npc-{suffix}"),
            node_ns: format!("skiff-test-npn-{suffix}"),
            backend_ns: (1..=2)
                .map(|i| format!("skiff-test-npb{i}-{suffix}"))
                .collect(),
            pin_dir: node_pin_dir(&format!("test-np-{suffix}")),
            servers: Vec::new(),
            created: Vec::new(),
        };
        let all: Vec<String> = [fx.client_ns.clone(), fx.node_ns.clone()]
            .into_iter()
            .chain(fx.backend_ns.iter().cloned())
            .collect();
        for ns in &all {
            run("ip", &["netns", "add", ns]);
            fx.created.push(ns.clone());
            run("ip", &["-n", ns, "link", "set", "lo", "up"]);
        }
        let (c, n) = (fx.client_ns.clone(), fx.node_ns.clone());
        run(
            "ip",
            &[
                "-n", &c, "link", "add", "c0", "type", "veth", "peer", "name", "n0", "netns", &n,
            ],
        );
        run(
            "ip",
            &["-n", &c, "addr", "add", "10.201.0.2/24", "dev", "c0"],
        );
        run(
            "ip",
            &["-n", &c, "addr", "add", "10.201.0.3/24", "dev", "c0"],
        );
        run("ip", &["-n", &c, "link", "set", "c0", "up"]);
        run(
            "ip",
            &["-n", &n, "addr", "add", "10.201.0.1/24", "dev", "n0"],
        );
        run("ip", &["-n", &n, "link", "set", "n0", "up"]);
        run(
            "ip",
            &[
                "netns",
                "exec",
                &n,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ],
        );
        for (i, b) in fx.backend_ns.clone().iter().enumerate() {
            let i = i + 1;
            let (h, p) = (format!("h{i}"), format!("p{i}"));
            run(
                "ip",
                &[
                    "-n", &n, "link", "add", &h, "type", "veth", "peer", "name", &p, "netns", b,
                ],
            );
            let gw = format!("10.202.{i}.1");
            run(
                "ip",
                &["-n", &n, "addr", "add", &format!("{gw}/24"), "dev", &h],
            );
            run("ip", &["-n", &n, "link", "set", &h, "up"]);
            let ip = backend_ip(i).to_string();
            run(
                "ip",
                &["-n", b, "addr", "add", &format!("{ip}/24"), "dev", &p],
            );
            run("ip", &["-n", b, "link", "set", &p, "up"]);
            run("ip", &["-n", b, "route", "add", "default", "via", &gw]);
            let mut child = Command::new("nsenter")
                .arg(format!("--net=/run/netns/{b}"))
                .args([python(), "-c", SERVER, &format!("b{i}"), &ip])
                .arg(BACKEND_PORT.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn server");
            let mut ready = [0u8; 6];
            let out = child.stdout.as_mut().expect("stdout");
            let _ = out.read_exact(&mut ready);
            fx.servers.push(child);
            assert_eq!(&ready, b"ready\n", "server b{i} did not start");
        }
        fx
    }

    fn load(&self) -> ServiceLb {
        crate::testing::load_small(&self.pin_dir)
    }

    /// Attaches the NodePort program to the uplink and both host veths, in the node netns.
    fn attach(&self, lb: &mut ServiceLb) -> Vec<TcAttach> {
        let path = Path::new("/run/netns").join(&self.node_ns);
        skiff_hostnet::run_in_netns_scoped(Some(&path), || {
            ["n0", "h1", "h2"]
                .iter()
                .map(|d| lb.attach_tc(d).expect("attach tc"))
                .collect()
        })
        .expect("node netns")
    }

    /// How many programs run at the TCX ingress of each of the node's devices.
    fn tcx_programs(&self) -> Vec<usize> {
        let path = Path::new("/run/netns").join(&self.node_ns);
        skiff_hostnet::run_in_netns_scoped(Some(&path), || {
            ["n0", "h1", "h2"]
                .iter()
                .map(|d| {
                    aya::programs::SchedClassifier::query_tcx(
                        d,
                        aya::programs::TcAttachType::Ingress,
                    )
                    .map(|(_, progs)| progs.len())
                    .unwrap_or(0)
                })
                .collect()
        })
        .expect("node netns")
    }

    fn client(&self, args: &[&str]) -> Vec<Value> {
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.client_ns))
            .args([python(), "-c", CLIENT])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn client");
        let status = wait_timeout(&mut child, "client");
        let (mut out, mut err) = (String::new(), String::new());
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        assert!(status.success(), "client {args:?}: {status}: {err}");
        serde_json::from_str::<Vec<Value>>(out.trim())
            .unwrap_or_else(|e| panic!("{out:?}: {e} ({err})"))
    }

    /// Forgets every NodePort flow (a new round starts from fresh flows).
    fn clear_conntrack_of(&self, lb: &mut ServiceLb) {
        lb.clear_conntrack().expect("clear conntrack");
    }

    /// What `nft list ruleset` / `iptables-save` show in the node namespace.
    fn firewall(&self) -> String {
        let mut all = String::new();
        for cmd in [&["nft", "list", "ruleset"][..], &["iptables-save"][..]] {
            if let Ok(out) = Command::new("ip")
                .args(["netns", "exec", &self.node_ns])
                .args(cmd)
                .output()
            {
                all.push_str(&String::from_utf8_lossy(&out.stdout));
            }
        }
        all.lines()
            .filter(|l| {
                let l = l.trim();
                !(l.is_empty() || l.starts_with('#'))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for NpFixture {
    fn drop(&mut self) {
        for child in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Err(e) = ServiceLb::remove_pins(&self.pin_dir) {
            eprintln!("cleanup: {e}");
        }
        for ns in &self.created {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

fn frontend(port: u16, protocol: Protocol) -> Frontend {
    Frontend::new(IpAddr::V4(NODE_IP), port, protocol)
}

fn backends(which: &[usize]) -> Vec<BackendAddr> {
    which
        .iter()
        .map(|i| BackendAddr {
            ip: IpAddr::V4(backend_ip(*i)),
            port: BACKEND_PORT,
        })
        .collect()
}

const NODE_PORT: ServiceParams = ServiceParams {
    affinity_timeout_s: None,
    node_port: true,
    local: false,
};

/// (answering backend, the source it saw, the peer the client saw).
fn split(v: &Value) -> (String, String, String) {
    let answer = v["answer"].as_str().unwrap_or_default();
    let mut it = answer.split_whitespace();
    let name = it.next().unwrap_or_default().to_string();
    let seen = it.next().unwrap_or_default().to_string();
    (
        name,
        seen,
        v["peer"].as_str().unwrap_or_default().to_string(),
    )
}

#[test]
fn nodeport_tcp_and_udp_from_outside_with_snat_and_conntrack() {
    let fx = NpFixture::new();
    let mut lb = fx.load();
    let before = fx.firewall();
    lb.sync_service(
        frontend(TCP_NODE_PORT, Protocol::Tcp),
        NODE_PORT,
        &backends(&[1, 2]),
    )
    .expect("program tcp");
    lb.sync_service(
        frontend(UDP_NODE_PORT, Protocol::Udp),
        NODE_PORT,
        &backends(&[1, 2]),
    )
    .expect("program udp");
    assert_eq!(fx.attach(&mut lb), vec![TcAttach::Attached; 3]);

    let node = NODE_IP.to_string();
    let tcp = fx.client(&["tcp", &node, &TCP_NODE_PORT.to_string(), "30"]);
    assert_eq!(tcp.len(), 30);
    let mut names = std::collections::BTreeMap::<String, u32>::new();
    for v in &tcp {
        let (name, seen, peer) = split(v);
        *names.entry(name).or_default() += 1;
        assert_eq!(peer, format!("{NODE_IP}:{TCP_NODE_PORT}"), "{v}");
        assert!(
            seen.starts_with(&format!("{NODE_IP}:")),
            "backend saw {seen}: no SNAT"
        );
    }
    assert_eq!(names.len(), 2, "both backends answer: {names:?}");

    let udp = fx.client(&["udp", &node, &UDP_NODE_PORT.to_string(), "10"]);
    assert_eq!(udp.len(), 10);
    for v in &udp {
        let (name, seen, peer) = split(v);
        assert!(name == "b1" || name == "b2", "{v}");
        assert_eq!(peer, format!("{NODE_IP}:{UDP_NODE_PORT}"), "{v}");
        assert!(
            seen.starts_with(&format!("{NODE_IP}:")),
            "backend saw {seen}: no SNAT"
        );
    }

    // Both directions of every flow are tracked; forward entries map to a backend.
    let ct = lb.conntrack().expect("conntrack");
    let fwd = ct.iter().filter(|(k, _)| k.dir == NP_CT_FORWARD).count();
    let rev = ct.iter().filter(|(k, _)| k.dir == NP_CT_REPLY).count();
    assert!(fwd >= 40 && rev >= 40, "forward {fwd}, reply {rev}");
    for (k, e) in ct.iter().filter(|(k, _)| k.dir == NP_CT_FORWARD) {
        assert_eq!(k.daddr, u32::from_ne_bytes(NODE_IP.octets()));
        assert_eq!(e.saddr, k.daddr, "SNAT to the node address");
        assert_eq!(e.dport, BACKEND_PORT);
    }
    // Counted per backend: 40 flows over the two frontends.
    let total: u64 = lb.dump().expect("dump").iter().map(|s| s.connects).sum();
    assert_eq!(total, 40);
    assert_eq!(fx.firewall(), before, "no firewall rule added");
    assert!(fx.firewall().is_empty(), "{}", fx.firewall());
}

#[test]
fn a_taken_nat_port_is_replaced_by_one_from_the_nat_range() {
    let fx = NpFixture::new();
    let mut lb = fx.load();
    lb.sync_service(
        frontend(TCP_NODE_PORT, Protocol::Tcp),
        NODE_PORT,
        &backends(&[1]),
    )
    .expect("program tcp");
    fx.attach(&mut lb);
    let out = fx.client(&[
        "collide",
        &NODE_IP.to_string(),
        &TCP_NODE_PORT.to_string(),
        "10.201.0.2",
        "10.201.0.3",
    ]);
    assert_eq!(out.len(), 2);
    let mut ports: Vec<u16> = out
        .iter()
        .map(|v| {
            let (name, seen, peer) = split(v);
            assert_eq!(name, "b1");
            assert_eq!(peer, format!("{NODE_IP}:{TCP_NODE_PORT}"));
            let (ip, port) = seen.split_once(':').expect("ip:port");
            assert_eq!(ip, NODE_IP.to_string());
            port.parse().expect("port")
        })
        .collect();
    ports.sort();
    assert_eq!(ports[0], 40000, "the first flow keeps the client's port");
    assert!(
        (NP_NAT_PORT_MIN..=NP_NAT_PORT_MAX).contains(&ports[1]),
        "the second gets one of the NAT range: {ports:?}"
    );
}

#[test]
fn a_new_agent_takes_over_the_pinned_tc_links() {
    let fx = NpFixture::new();
    let mut lb = fx.load();
    lb.sync_service(
        frontend(TCP_NODE_PORT, Protocol::Tcp),
        NODE_PORT,
        &backends(&[2]),
    )
    .expect("program tcp");
    fx.attach(&mut lb);
    drop(lb);
    // The links stay pinned while no agent runs: NodePort keeps working.
    let node = NODE_IP.to_string();
    let out = fx.client(&["tcp", &node, &TCP_NODE_PORT.to_string(), "3"]);
    assert!(out.iter().all(|v| split(v).0 == "b2"), "{out:?}");
    assert_eq!(fx.tcx_programs(), [1, 1, 1]);
    let mut lb = fx.load();
    assert_eq!(fx.attach(&mut lb), vec![TcAttach::Adopted; 3]);
    assert_eq!(
        fx.tcx_programs(),
        [1, 1, 1],
        "taken over, not attached twice"
    );
    let started = Instant::now();
    let out = fx.client(&["tcp", &node, &TCP_NODE_PORT.to_string(), "3"]);
    assert!(out.iter().all(|v| split(v).0 == "b2"), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    // Detaching unpins every link (the kernel detaches them once the pins are released).
    drop(lb);
    ServiceLb::detach_pinned(&fx.pin_dir).expect("detach");
    let deadline = Instant::now() + Duration::from_secs(10);
    while fx.tcx_programs() != [0, 0, 0] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fx.tcx_programs(), [0, 0, 0], "detached");
    let links = std::fs::read_dir(&fx.pin_dir)
        .expect("pin dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("link_"))
        .count();
    assert_eq!(links, 0);
}

/// The backend a Maglev table sends the flow `src:sport → NODE_IP:dport` to, as `b<i>`.
fn predicted(lb: &ServiceLb, f: &Frontend, src: Ipv4Addr, sport: u16) -> String {
    let table = lb.maglev_table(f).expect("a Maglev table");
    let h = skiff_common::lb::np_flow_hash(
        u32::from_ne_bytes(src.octets()),
        u32::from_ne_bytes(NODE_IP.octets()),
        sport,
        f.port,
        f.protocol.number(),
    );
    let id = table[(h % table.len() as u32) as usize];
    let b = lb.state().backend(id).expect("table names a backend");
    match b.addr.ip {
        IpAddr::V4(v4) => format!("b{}", v4.octets()[2]),
        IpAddr::V6(v6) => panic!("IPv6 backend {v6}"),
    }
}

/// New NodePort flows pick their backend through the service's Maglev table: many flows from
/// different source ports spread over the backends, each lands exactly where
/// `table[np_flow_hash(5-tuple) % m]` says, the same 5-tuple lands on the same backend again
/// once its conntrack entry is gone, and a backend change rewrites the table (once) so new
/// flows follow it. A reload finds the table as it was. With debug records on, each new flow
/// is logged with its client, frontend and backend.
#[test]
fn nodeport_new_flows_follow_the_maglev_table() {
    let fx = NpFixture::new();
    let mut lb = ServiceLb::load(
        &fx.pin_dir,
        LbConfig {
            debug: true,
            ..crate::testing::small_config()
        },
    )
    .expect("load with debug records");
    let records = crate::testing::Records::default();
    assert!(lb.start_debug_log(records.clone()).expect("debug reader"));
    let tcp = frontend(TCP_NODE_PORT, Protocol::Tcp);
    let udp = frontend(UDP_NODE_PORT, Protocol::Udp);
    lb.sync_service(tcp, NODE_PORT, &backends(&[1, 2]))
        .expect("program tcp");
    lb.sync_service(udp, NODE_PORT, &backends(&[1, 2]))
        .expect("program udp");
    let table = lb.maglev_table(&tcp).expect("table").to_vec();
    assert_eq!(table.len(), skiff_common::lb::LB_MAGLEV_DEFAULT_M as usize);
    fx.attach(&mut lb);

    const N: usize = 60;
    let src = Ipv4Addr::new(10, 201, 0, 2);
    let node = NODE_IP.to_string();
    let run = |mode: &str, port: u16, first: u16| {
        fx.client(&[
            mode,
            &node,
            &port.to_string(),
            &src.to_string(),
            &first.to_string(),
            &N.to_string(),
        ])
    };
    let check = |lb: &ServiceLb, f: &Frontend, out: &[Value]| -> Vec<String> {
        assert_eq!(out.len(), N);
        out.iter()
            .map(|v| {
                let (name, seen, _) = split(v);
                assert!(seen.starts_with(&format!("{NODE_IP}:")), "SNAT: {v}");
                let sport = v["sport"].as_u64().expect("sport") as u16;
                assert_eq!(name, predicted(lb, f, src, sport), "flow from port {sport}");
                name
            })
            .collect()
    };
    let tcp_names = check(&lb, &tcp, &run("tcp-ports", TCP_NODE_PORT, 42000));
    let per = |names: &[String], b: &str| names.iter().filter(|n| *n == b).count();
    for b in ["b1", "b2"] {
        assert!(per(&tcp_names, b) * 4 >= N, "{b}: {tcp_names:?}");
    }
    let i: usize = tcp_names[0][1..].parse().expect("b<i>");
    let logged = format!(
        "nodeport new flow: {src}:42000 -> {NODE_IP}:{TCP_NODE_PORT} to backend {}:{BACKEND_PORT}",
        backend_ip(i)
    );
    let all = records.wait_for(&[&logged]);
    assert!(
        all.iter().any(|r| r.contains(&logged)),
        "{logged:?} not in {all:#?}"
    );
    let udp_first = check(&lb, &udp, &run("udp-ports", UDP_NODE_PORT, 43000));
    for b in ["b1", "b2"] {
        assert!(per(&udp_first, b) * 4 >= N, "{b}: {udp_first:?}");
    }
    // The same 5-tuples without their conntrack entries: the same backends.
    lb.clear_conntrack().expect("clear conntrack");
    assert!(lb.conntrack().unwrap().is_empty());
    let udp_again = check(&lb, &udp, &run("udp-ports", UDP_NODE_PORT, 43000));
    assert_eq!(udp_again, udp_first, "same 5-tuple, same backend");

    // One backend gone: the table is rewritten without it, new flows avoid it.
    lb.set_backends(&udp, &backends(&[1])).expect("remove b2");
    let t = lb.maglev_table(&udp).expect("table").to_vec();
    let b1 = t[0];
    assert!(t.iter().all(|id| *id == b1), "only b1 left");
    lb.clear_conntrack().expect("clear conntrack");
    let after = check(&lb, &udp, &run("udp-ports", UDP_NODE_PORT, 43000));
    assert!(after.iter().all(|n| n == "b1"), "{after:?}");

    // Restart: the pinned tables are found as written; nothing is rewritten.
    drop(lb);
    let mut lb = fx.load();
    assert_eq!(lb.maglev_table(&tcp), Some(&table[..]));
    assert_eq!(
        lb.sync_service(tcp, NODE_PORT, &backends(&[1, 2])).unwrap(),
        0
    );
    // Not a NodePort frontend any more: its table goes (random choice, as ClusterIPs).
    lb.sync_service(tcp, ServiceParams::default(), &backends(&[1, 2]))
        .unwrap();
    assert_eq!(lb.maglev_table(&tcp), None);
    lb.remove_service(&udp).unwrap();
    assert_eq!(lb.maglev_table(&udp), None);
    let pressure = lb.pressure().unwrap();
    let maglev = pressure.iter().find(|p| p.map == "LB_MAGLEV").unwrap();
    assert_eq!(maglev.entries, 0);
}

/// externalTrafficPolicy Local: no SNAT. The backend (a pod of the node) sees the client's
/// own address, the client sees the NodePort frontend as its peer, TCP and UDP alike, and
/// conntrack keeps the client's address in the forward translation.
#[test]
fn external_traffic_policy_local_keeps_the_client_address() {
    let fx = NpFixture::new();
    let mut lb = fx.load();
    let local = ServiceParams {
        local: true,
        ..NODE_PORT
    };
    lb.sync_service(
        frontend(TCP_NODE_PORT, Protocol::Tcp),
        local,
        &backends(&[1]),
    )
    .expect("program tcp");
    lb.sync_service(
        frontend(UDP_NODE_PORT, Protocol::Udp),
        local,
        &backends(&[2]),
    )
    .expect("program udp");
    fx.attach(&mut lb);
    let node = NODE_IP.to_string();
    for (proto, port, want) in [("tcp", TCP_NODE_PORT, "b1"), ("udp", UDP_NODE_PORT, "b2")] {
        let out = fx.client(&[proto, &node, &port.to_string(), "5"]);
        assert_eq!(out.len(), 5);
        for v in &out {
            let (name, seen, peer) = split(v);
            assert_eq!(name, want, "{v}");
            assert_eq!(
                peer,
                format!("{NODE_IP}:{port}"),
                "{proto}: reply from the frontend"
            );
            assert!(
                seen.starts_with("10.201.0.2:"),
                "{proto}: the backend saw {seen}, not the client's address"
            );
        }
    }
    let ct = lb.conntrack().expect("conntrack");
    let fwd: Vec<_> = ct.iter().filter(|(k, _)| k.dir == NP_CT_FORWARD).collect();
    assert!(fwd.len() >= 10, "{}", fwd.len());
    for (k, e) in fwd {
        assert_eq!(e.saddr, k.saddr, "client address kept");
        assert_eq!(e.sport, k.sport, "client port kept");
    }
}

/// A LoadBalancer address (not the node's; the node answers ARP for it through
/// `L2_ANNOUNCE`) is served like a nodePort, and its flows are SNATed to the node address in
/// `NP_SNAT`, not to the LoadBalancer address (whose replies would otherwise go to whichever
/// node announces it).
#[test]
fn load_balancer_addresses_are_answered_and_snated_to_the_node_address() {
    use super::lb::l2::{L2_FLAG_ANNOUNCE, L2Announce, monotonic_ns};
    let fx = NpFixture::new();
    let mut lb = fx.load();
    let lb_ip = Ipv4Addr::new(10, 201, 0, 240);
    let front = Frontend::new(IpAddr::V4(lb_ip), 80, Protocol::Tcp);
    lb.sync_service(front, NODE_PORT, &backends(&[1, 2]))
        .expect("program the LoadBalancer frontend");
    fx.attach(&mut lb);
    let path = Path::new("/run/netns").join(&fx.node_ns);
    let (ifindex, mac) =
        skiff_hostnet::run_in_netns_scoped(Some(&path), || skiff_hostnet::garp::link("n0"))
            .expect("node netns")
            .expect("n0");
    let entry = L2Announce {
        deadline_ns: monotonic_ns() + Duration::from_secs(60).as_nanos() as u64,
        ifindex,
        flags: L2_FLAG_ANNOUNCE,
        mac,
        _pad: [0; 2],
    };
    lb.set_l2_announcement(lb_ip, entry).expect("announce");
    let ip = lb_ip.to_string();
    for (snat, seen_from) in [(Some(NODE_IP), NODE_IP), (None, lb_ip)] {
        lb.set_snat_address(snat).expect("snat address");
        fx.clear_conntrack_of(&mut lb);
        let answers = fx.client(&["tcp", &ip, "80", "10"]);
        assert_eq!(answers.len(), 10);
        for v in &answers {
            let (name, seen, peer) = split(v);
            assert!(name == "b1" || name == "b2", "{v}");
            assert_eq!(peer, format!("{lb_ip}:80"), "{v}");
            assert!(
                seen.starts_with(&format!("{seen_from}:")),
                "with SNAT address {snat:?} the backend saw {seen}"
            );
        }
    }
}
