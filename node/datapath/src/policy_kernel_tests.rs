//! NetworkPolicy enforcement against the real kernel: the `skiff-policy` programs attached to
//! a test cgroup, two "pods" (child cgroups whose sockets use their own addresses on the loopback
//! device of a network namespace made for the test), real TCP and UDP. All traffic stays in
//! that namespace; the guard removes cgroups, namespace and pins also when a test fails.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::policy::*;
use crate::testing::{python, run, unique_name};
use crate::{node_pin_dir, policy};

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 2);
const OTHER_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 3);

/// Serves TCP (echo, many connections) and UDP (echo) on argv[1] ports 80 and 81.
const SERVER: &str = r#"
import socket, sys, threading
ip = sys.argv[1]
def tcp(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port)); s.listen(64)
    while True:
        c, _ = s.accept()
        def echo(c=c):
            while True:
                b = c.recv(1024)
                if not b: break
                c.sendall(b)
            c.close()
        threading.Thread(target=echo, daemon=True).start()
def udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((ip, port))
    while True:
        b, a = s.recvfrom(1024); s.sendto(b, a)
for p in (80, 81):
    threading.Thread(target=tcp, args=(p,), daemon=True).start()
    threading.Thread(target=udp, args=(p,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"#;

/// Reads commands from stdin, one per line: `tcp PORT` / `udp PORT` (a new flow from
/// argv[1] to argv[2]:PORT, answered `ok` or `fail`), `open PORT` (a TCP connection kept),
/// `send` (a round trip on the kept connection).
const CLIENT: &str = r#"
import socket, sys
src, dst = sys.argv[1], sys.argv[2]
kept = None
for line in sys.stdin:
    cmd, *arg = line.split()
    try:
        if cmd == "tcp" or cmd == "open":
            c = socket.socket(); c.settimeout(0.5); c.bind((src, 0))
            c.connect((dst, int(arg[0]))); c.sendall(b"x"); assert c.recv(10) == b"x"
            if cmd == "open": kept = c
            else: c.close()
        elif cmd == "udp":
            c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(0.5)
            c.bind((src, 0)); c.sendto(b"u", (dst, int(arg[0])))
            assert c.recvfrom(10)[0] == b"u"; c.close()
        elif cmd == "send":
            kept.sendall(b"y"); assert kept.recv(10) == b"y"
        print("ok", flush=True)
    except Exception as e:
        print("fail", flush=True)
"#;

struct PolicyFixture {
    name: String,
    cgroup: PathBuf,
    pin_dir: PathBuf,
    children: Vec<Child>,
    client: Option<(
        std::process::ChildStdin,
        std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    )>,
}

impl PolicyFixture {
    fn new() -> Self {
        let suffix = unique_name();
        let name = format!("skiff-poltest-{suffix}");
        let root = skiff_runtime::host::cgroup2_mount().expect("cgroup v2 must be mounted");
        let fx = PolicyFixture {
            cgroup: root.join(&name),
            pin_dir: node_pin_dir(&format!("poltest-{suffix}")),
            children: Vec::new(),
            client: None,
            name,
        };
        std::fs::create_dir(&fx.cgroup).expect("create test cgroup");
        for sub in ["server", "client"] {
            std::fs::create_dir(fx.cgroup.join(sub)).expect("child cgroup");
        }
        run("ip", &["netns", "add", &fx.name]);
        run("ip", &["-n", &fx.name, "link", "set", "lo", "up"]);
        for ip in [SERVER_IP, CLIENT_IP, OTHER_IP] {
            let addr = format!("{ip}/32");
            run("ip", &["-n", &fx.name, "addr", "add", &addr, "dev", "lo"]);
        }
        fx
    }

    /// `python -c script args` in the namespace, in child cgroup `sub`.
    fn spawn_in(&mut self, sub: &str, script: &str, args: &[&str]) -> Child {
        let procs = self.cgroup.join(sub).join("cgroup.procs");
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.name))
            .args(["sh", "-c", r#"echo $$ > "$0" && shift && exec "$@""#])
            .arg(&procs)
            .arg("--")
            .args([python(), "-c", script])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        cmd.spawn().expect("spawn")
    }

    fn start(&mut self) {
        use std::io::BufRead as _;
        let mut server = self.spawn_in("server", SERVER, &[&SERVER_IP.to_string()]);
        let mut lines = std::io::BufReader::new(server.stdout.take().expect("stdout")).lines();
        assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
        self.children.push(server);
        let mut client = self.spawn_in(
            "client",
            CLIENT,
            &[&CLIENT_IP.to_string(), &SERVER_IP.to_string()],
        );
        let stdin = client.stdin.take().expect("stdin");
        let out = std::io::BufReader::new(client.stdout.take().expect("stdout")).lines();
        self.children.push(client);
        self.client = Some((stdin, out));
    }

    /// Runs one client command; whether it succeeded.
    fn probe(&mut self, cmd: &str) -> bool {
        use std::io::Write as _;
        let (stdin, out) = self.client.as_mut().expect("started");
        writeln!(stdin, "{cmd}").expect("client stdin");
        match out.next().and_then(Result::ok).as_deref() {
            Some("ok") => true,
            Some("fail") => false,
            other => panic!("client said {other:?}"),
        }
    }
}

impl Drop for PolicyFixture {
    fn drop(&mut self) {
        self.client = None;
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for dir in [
            self.cgroup.join("server"),
            self.cgroup.join("client"),
            self.cgroup.clone(),
        ] {
            for _ in 0..100 {
                match std::fs::remove_dir(&dir) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => break,
                }
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
        if let Err(e) = policy::PolicyEnforcer::remove_pins(&self.pin_dir) {
            eprintln!("cleanup: {e}");
        }
    }
}

const SERVER_EP: u32 = 1;
const CLIENT_EP: u32 = 2;
const CLIENT_IDENTITY: u32 = 300;
const POLICY: u32 = 7;

fn endpoints(server_flags: u32, client_flags: u32) -> PolicyTables {
    let mut t = PolicyTables::default();
    let ep = |id, flags| PolEndpoint {
        id,
        flags,
        ingress_policy: POLICY,
        egress_policy: POLICY,
    };
    t.endpoints.insert(SERVER_IP, ep(SERVER_EP, server_flags));
    t.endpoints.insert(CLIENT_IP, ep(CLIENT_EP, client_flags));
    t.ipcache.insert(CLIENT_IP, CLIENT_IDENTITY);
    t.ipcache.insert(SERVER_IP, CLIENT_IDENTITY + 1);
    t
}

fn allow(t: &mut PolicyTables, ep: u32, dir: u8, identity: u32, port: Option<PortMatch>) {
    for k in rule_keys(ep, dir, identity, port) {
        t.rules.insert(k, POLICY);
    }
}

fn tcp(port: u16) -> Option<PortMatch> {
    Some(PortMatch {
        proto: 6,
        ports: Some((port, port)),
    })
}

fn denied(p: &PolicyEnforcer, dir: u8) -> u64 {
    p.counters()
        .expect("counters")
        .into_iter()
        .filter(|(k, _)| k.reason == REASON_DENIED && k.dir == dir && k.policy == POLICY)
        .map(|(_, c)| c.packets)
        .sum()
}

/// Isolation, rules by identity, port and protocol, ipBlock identities, replies and
/// established connections, and the drop counters, on one pair of "pods".
#[test]
fn policy_programs_enforce_rules_by_identity_and_keep_established_flows() {
    let mut fx = PolicyFixture::new();
    let mut p = PolicyEnforcer::load(&fx.pin_dir, PolicyConfig::default()).expect("load");
    p.attach(&fx.cgroup).expect("attach");
    let (tx, flows) = std::sync::mpsc::channel();
    let _reader = p
        .start_flows(move |ev| {
            let _ = tx.send(ev);
        })
        .expect("flow reader");
    fx.start();

    // No policy: everything flows.
    p.apply(&endpoints(0, 0)).expect("apply");
    assert!(fx.probe("tcp 80") && fx.probe("udp 81"));

    // The server isolated for ingress with no rule: nothing new gets in, and the drop is
    // counted against the isolating policy.
    fx.probe("open 80"); // an established connection, kept across the changes below
    p.apply(&endpoints(EP_INGRESS_ISOLATED, 0)).expect("apply");
    assert!(!fx.probe("tcp 80"));
    assert!(!fx.probe("udp 80"));
    assert!(denied(&p, DIR_INGRESS) > 0);
    assert!(fx.probe("send"), "an established connection broke");
    // The drops were recorded as flow records, from the server's side, blaming the policy.
    let records: Vec<PolFlowEvent> = flows.try_iter().collect();
    let dropped = records
        .iter()
        .find(|e| e.reason == REASON_DENIED && e.proto == 17)
        .unwrap_or_else(|| panic!("no UDP drop among {records:?}"));
    assert_eq!(
        (
            dropped.dir,
            dropped.local,
            dropped.peer,
            dropped.local_port,
            dropped.policy
        ),
        (
            DIR_INGRESS,
            u32::from_ne_bytes(SERVER_IP.octets()),
            u32::from_ne_bytes(CLIENT_IP.octets()),
            80,
            POLICY
        )
    );
    assert!(
        records.iter().any(|e| e.reason == REASON_ALLOWED_UNISOLATED
            && e.dir == DIR_EGRESS
            && e.peer_port == 80),
        "the allowed flows were not recorded: {records:?}"
    );

    // Allow the client's identity on TCP 80 only.
    let mut t = endpoints(EP_INGRESS_ISOLATED, 0);
    allow(&mut t, SERVER_EP, DIR_INGRESS, CLIENT_IDENTITY, tcp(80));
    p.apply(&t).expect("apply");
    assert!(fx.probe("tcp 80"));
    assert!(!fx.probe("tcp 81"));
    assert!(!fx.probe("udp 80"));

    // A UDP port range (endPort) 80-81.
    allow(
        &mut t,
        SERVER_EP,
        DIR_INGRESS,
        CLIENT_IDENTITY,
        Some(PortMatch {
            proto: 17,
            ports: Some((80, 81)),
        }),
    );
    p.apply(&t).expect("apply");
    assert!(fx.probe("udp 80") && fx.probe("udp 81"));

    // Egress isolation of the client: only an ipBlock holding the server's address, except
    // 10.201.0.0/31 (which holds the server): denied; with the except on another /31: allowed.
    let mut t = endpoints(0, EP_EGRESS_ISOLATED);
    t.ipcache.remove(&SERVER_IP);
    let (block, except) = (ID_FIRST_CIDR, ID_FIRST_CIDR + 1);
    t.cidrs.insert((Ipv4Addr::new(10, 201, 0, 0), 24), block);
    t.cidrs.insert((Ipv4Addr::new(10, 201, 0, 0), 31), except);
    allow(&mut t, CLIENT_EP, DIR_EGRESS, block, None);
    p.apply(&t).expect("apply");
    assert!(!fx.probe("tcp 80"), "the except was not honoured");
    assert!(denied(&p, DIR_EGRESS) > 0);
    t.cidrs.remove(&(Ipv4Addr::new(10, 201, 0, 0), 31));
    t.cidrs.insert((Ipv4Addr::new(10, 201, 0, 2), 31), except);
    p.apply(&t).expect("apply");
    assert!(fx.probe("tcp 80") && fx.probe("udp 81"));
    assert!(fx.probe("send"), "an established connection broke");

    // Traffic from the node itself (the client's address is one of the node's) gets into an
    // isolated pod without any rule.
    let mut t2 = endpoints(EP_INGRESS_ISOLATED, 0);
    t2.ipcache.insert(CLIENT_IP, ID_HOST);
    p.apply(&t2).expect("apply");
    assert!(fx.probe("tcp 81") && fx.probe("udp 80"));
    t2.ipcache.insert(CLIENT_IP, CLIENT_IDENTITY);
    p.apply(&t2).expect("apply");
    assert!(!fx.probe("tcp 81"), "isolation did not come back");

    // Everything off again: the tables are empty and traffic flows.
    p.apply(&PolicyTables::default()).expect("apply");
    assert!(fx.probe("tcp 81"));

    // A new agent reads back what the pins hold.
    p.apply(&t).expect("apply");
    drop(p);
    let p = PolicyEnforcer::load(&fx.pin_dir, PolicyConfig::default()).expect("reload");
    assert_eq!(p.tables(), &t);
}
