//! The Service load balancer against the real kernel: the `skiff-lb` programs attached to a
//! cgroup created for the test, a client process in that cgroup and in a network namespace of
//! its own, backends in a second namespace reached over a veth pair. Needs root.
//!
//! Safety: both namespaces, the veth pair and every address (10.200.0.0/24 on the veth, the
//! "virtual IPs" 10.96.0.x that only exist as map keys) live inside namespaces the test
//! created; nothing is configured in, or sent from, the root namespace. The fixture's guard
//! stops the backend threads, kills the clients by pid, removes the pins (which detaches the
//! programs), the cgroup and the namespaces (with the veths in them), also when a test fails.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use super::kernel_tests::{python, run, unique_name, wait_timeout};
use super::lb::{BackendAddr, Frontend, LbConfig, Protocol, ServiceLb, ServiceParams};
use super::*;

pub(crate) const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The IPv6 "virtual IP" (only a map key, like [`VIP`]).
pub(crate) const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
pub(crate) const TCP_PORT: u16 = 80;
pub(crate) const UDP_PORT: u16 = 53;
pub(crate) const BACKEND_TCP_PORT: u16 = 8080;
pub(crate) const BACKEND_UDP_PORT: u16 = 5353;
/// Backend `i` (1-based) is `b<i>` at 10.200.0.1<i>.
pub(crate) const BACKENDS: usize = 3;

pub(crate) fn backend_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, 10 + i as u8)
}

/// Backend `i` (1-based) also is `b<i>` at fd00:200::1<i> (hex).
pub(crate) fn backend_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, 0, 0x10 + i as u16)
}

pub(crate) fn backend_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("b{}", v4.octets()[3] - 10),
        IpAddr::V6(v6) => format!("b{}", v6.segments()[7] - 0x10),
    }
}

pub(crate) fn tcp_frontend() -> Frontend {
    Frontend {
        ip: IpAddr::V4(VIP),
        port: TCP_PORT,
        protocol: Protocol::Tcp,
    }
}

pub(crate) fn udp_frontend() -> Frontend {
    Frontend {
        ip: IpAddr::V4(VIP),
        port: UDP_PORT,
        protocol: Protocol::Udp,
    }
}

fn frontend6(port: u16, protocol: Protocol) -> Frontend {
    Frontend {
        ip: IpAddr::V6(VIP6),
        port,
        protocol,
    }
}

fn backends6(which: &[usize], port: u16) -> Vec<BackendAddr> {
    which
        .iter()
        .map(|i| BackendAddr {
            ip: IpAddr::V6(backend_ip6(*i)),
            port,
        })
        .collect()
}

fn tcp_backends(which: &[usize]) -> Vec<BackendAddr> {
    which
        .iter()
        .map(|i| BackendAddr {
            ip: IpAddr::V4(backend_ip(*i)),
            port: BACKEND_TCP_PORT,
        })
        .collect()
}

fn udp_backends(which: &[usize]) -> Vec<BackendAddr> {
    which
        .iter()
        .map(|i| BackendAddr {
            ip: IpAddr::V4(backend_ip(*i)),
            port: BACKEND_UDP_PORT,
        })
        .collect()
}

/// The client: one mode per scenario, one JSON line of results (several for `hold`).
const CLIENT: &str = r#"
import json, socket, sys, time
mode, vip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam = socket.AF_INET6 if ":" in vip else socket.AF_INET
def fmt(a):
    return ("[%s]:%d" if ":" in a[0] else "%s:%d") % a[:2]
def peer(s):
    return fmt(s.getpeername())
if mode == "tcp":
    names, peers = {}, set()
    for _ in range(int(sys.argv[4])):
        s = socket.create_connection((vip, port), timeout=5)
        name = s.makefile("r").readline().strip()
        names[name] = names.get(name, 0) + 1
        peers.add(peer(s))
        s.close()
    print(json.dumps({"names": names, "peers": sorted(peers)}), flush=True)
elif mode == "refused":
    s = socket.socket(fam)
    s.settimeout(5)
    t = time.monotonic()
    try:
        s.connect((vip, port))
        err = 0
    except OSError as e:
        err = e.errno
    print(json.dumps({"errno": err, "ms": (time.monotonic() - t) * 1000}), flush=True)
elif mode == "udp-refused":
    out = {}
    u = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        u.sendto(b"ping", (vip, port))
        out["sendto"] = 0
    except OSError as e:
        out["sendto"] = e.errno
    c = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        c.connect((vip, port))
        out["connect"] = 0
    except OSError as e:
        out["connect"] = e.errno
    print(json.dumps(out), flush=True)
elif mode == "udp":
    out = {}
    c = socket.socket(fam, socket.SOCK_DGRAM)
    c.settimeout(5)
    c.connect((vip, port))
    c.send(b"ping")
    data, src = c.recvfrom(100)
    out["connected"] = {"name": data.decode(), "from": fmt(src), "peer": peer(c)}
    u = socket.socket(fam, socket.SOCK_DGRAM)
    u.settimeout(5)
    u.sendto(b"ping", (vip, port))
    data, src = u.recvfrom(100)
    out["unconnected"] = {"name": data.decode(), "from": fmt(src)}
    print(json.dumps(out), flush=True)
elif mode == "hold":
    s = socket.create_connection((vip, port), timeout=20)
    f = s.makefile("rw")
    print(json.dumps({"name": f.readline().strip(), "peer": peer(s)}), flush=True)
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        f.write(line)
        f.flush()
        print(json.dumps({"echo": f.readline().strip(), "peer": peer(s)}), flush=True)
"#;

/// Backends in the server namespace: per address a TCP listener (sends its name, then echoes
/// lines) and a UDP socket (answers every datagram with its name). Threads stop on drop.
struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// TCP connections accepted, per backend (index 0 = b1).
    accepted: Vec<Arc<AtomicU32>>,
}

impl Servers {
    fn start(netns: &str) -> Self {
        let path = PathBuf::from("/run/netns").join(netns);
        // Sockets belong to the namespace of the thread that creates them: bind them on a
        // thread that joined the server namespace (and then exits), serve them from others.
        let sockets = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open server netns");
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            (1..=BACKENDS)
                .flat_map(|i| [IpAddr::V4(backend_ip(i)), IpAddr::V6(backend_ip6(i))])
                .map(|ip| {
                    let tcp = TcpListener::bind((ip, BACKEND_TCP_PORT)).expect("bind tcp");
                    let udp = UdpSocket::bind((ip, BACKEND_UDP_PORT)).expect("bind udp");
                    (backend_name(ip), tcp, udp)
                })
                .collect::<Vec<_>>()
        })
        .join()
        .expect("socket thread");
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut accepted = Vec::new();
        for (name, tcp, udp) in sockets {
            // Both families of backend `i` count into one counter.
            let i: usize = name[1..].parse().expect("backend name");
            if accepted.len() < i {
                accepted.push(Arc::new(AtomicU32::new(0)));
            }
            let count = accepted[i - 1].clone();
            tcp.set_nonblocking(true).expect("nonblocking");
            let (stop_t, name_t) = (stop.clone(), name.clone());
            threads.push(std::thread::spawn(move || {
                while !stop_t.load(Ordering::Relaxed) {
                    match tcp.accept() {
                        Ok((conn, _)) => {
                            count.fetch_add(1, Ordering::Relaxed);
                            let name = name_t.clone();
                            std::thread::spawn(move || serve_tcp(conn, &name));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }));
            udp.set_read_timeout(Some(Duration::from_millis(50)))
                .expect("timeout");
            let stop_u = stop.clone();
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; 100];
                while !stop_u.load(Ordering::Relaxed) {
                    if let Ok((_, from)) = udp.recv_from(&mut buf) {
                        let _ = udp.send_to(name.as_bytes(), from);
                    }
                }
            }));
        }
        Servers {
            stop,
            threads,
            accepted,
        }
    }

    fn accepted(&self) -> Vec<u32> {
        self.accepted
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

/// Sends the backend's name, then echoes lines until EOF (or 30 s of silence).
fn serve_tcp(conn: TcpStream, name: &str) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut w = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    if writeln!(w, "{name}").is_err() {
        return;
    }
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    while matches!(r.read_line(&mut line), Ok(n) if n > 0) {
        if w.write_all(line.as_bytes()).is_err() {
            return;
        }
        line.clear();
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A client that keeps one TCP connection through the VIP open and echoes on request.
pub(crate) struct Held {
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Held {
    fn next(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(20))
            .expect("held client answered");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    /// Sends `msg` over the held connection; returns (echo, peer).
    pub(crate) fn echo(&mut self, msg: &str) -> (String, String) {
        writeln!(self.stdin, "{msg}").expect("write to held client");
        self.stdin.flush().expect("flush");
        let v = self.next();
        (
            v["echo"].as_str().unwrap_or_default().to_string(),
            v["peer"].as_str().unwrap_or_default().to_string(),
        )
    }
}

/// Two namespaces joined by a veth pair, a cgroup for the client, a pin directory.
/// Loads the LB with small maps pinned in `pin_dir` (the kernel tests' size).
pub(crate) fn load_small(pin_dir: &std::path::Path) -> ServiceLb {
    ServiceLb::load(pin_dir, small_config()).expect("load the LB")
}

/// The kernel tests' map sizes.
pub(crate) fn small_config() -> LbConfig {
    LbConfig {
        max_services: 64,
        max_backends: 256,
        max_revnat: 1024,
        max_affinity: 1024,
        max_np_ct: 1024,
        ..LbConfig::default()
    }
}

pub(crate) struct LbFixture {
    client_ns: String,
    server_ns: String,
    cgroup: PathBuf,
    pin_dir: PathBuf,
    children: Vec<Child>,
    servers: Option<Servers>,
    created: Vec<String>,
    cgroup_created: bool,
}

impl LbFixture {
    pub(crate) fn new() -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        assert_eq!(unsafe { libc::geteuid() }, 0, "needs root");
        let suffix = unique_name();
        let root = crate::host::cgroup2_mount().expect("cgroup v2 must be mounted");
        let mut fx = LbFixture {
            client_ns: format!("skiff-test-lbc-{suffix}"),
            server_ns: format!("skiff-test-lbs-{suffix}"),
            cgroup: root.join(format!("skiff-test-lb-{suffix}")),
            pin_dir: node_pin_dir(&format!("test-lb-{suffix}")),
            children: Vec::new(),
            servers: None,
            created: Vec::new(),
            cgroup_created: false,
        };
        std::fs::create_dir(&fx.cgroup).expect("create test cgroup");
        fx.cgroup_created = true;
        for ns in [fx.client_ns.clone(), fx.server_ns.clone()] {
            run("ip", &["netns", "add", &ns]);
            fx.created.push(ns.clone());
            run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        }
        let (c, s) = (fx.client_ns.as_str(), fx.server_ns.as_str());
        // Created inside the client namespace, the peer moved straight into the server's.
        run(
            "ip",
            &[
                "-n", c, "link", "add", "c0", "type", "veth", "peer", "name", "s0", "netns", s,
            ],
        );
        run(
            "ip",
            &["-n", c, "addr", "add", "10.200.0.1/24", "dev", "c0"],
        );
        // IPv6 on the same veth, without duplicate address detection (usable at once).
        run(
            "ip",
            &[
                "-n",
                c,
                "addr",
                "add",
                "fd00:200::1/64",
                "dev",
                "c0",
                "nodad",
            ],
        );
        run("ip", &["-n", c, "link", "set", "c0", "up"]);
        run(
            "ip",
            &["-n", s, "addr", "add", "10.200.0.2/24", "dev", "s0"],
        );
        for i in 1..=BACKENDS {
            let a = format!("{}/24", backend_ip(i));
            run("ip", &["-n", s, "addr", "add", &a, "dev", "s0"]);
            let a = format!("{}/64", backend_ip6(i));
            run("ip", &["-n", s, "addr", "add", &a, "dev", "s0", "nodad"]);
        }
        run("ip", &["-n", s, "link", "set", "s0", "up"]);
        fx.servers = Some(Servers::start(s));
        fx
    }

    fn servers(&self) -> &Servers {
        self.servers.as_ref().expect("servers")
    }

    /// The client, in the client namespace (nsenter: setns, no /sys remount) and in the test
    /// cgroup (the shell moves itself there before python creates any socket).
    fn client_cmd(&self, args: &[&str]) -> Command {
        let procs = self.cgroup.join("cgroup.procs");
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.client_ns))
            .args([
                "sh",
                "-c",
                r#"echo $$ > "$0" && exec "$@""#,
                procs.to_str().expect("UTF-8 path"),
                python(),
                "-c",
                CLIENT,
            ])
            .args(args);
        cmd
    }

    /// Runs the client to completion and returns its JSON line.
    pub(crate) fn client(&mut self, args: &[&str]) -> Value {
        let child = self
            .client_cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn client");
        self.children.push(child);
        let child = self.children.last_mut().expect("just pushed");
        let status = wait_timeout(child, "client");
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        assert!(status.success(), "client {args:?}: {status}: {err}");
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{out:?}: {e} ({err})"))
    }

    /// `n` TCP connects to the VIP: backend name → count, and the peers getpeername showed.
    pub(crate) fn connects(&mut self, n: usize) -> (BTreeMap<String, u64>, Vec<String>) {
        self.connects_to(IpAddr::V4(VIP), n)
    }

    /// `n` TCP connects to `vip`:[`TCP_PORT`], as [`LbFixture::connects`].
    pub(crate) fn connects_to(
        &mut self,
        vip: IpAddr,
        n: usize,
    ) -> (BTreeMap<String, u64>, Vec<String>) {
        let v = self.client(&[
            "tcp",
            &vip.to_string(),
            &TCP_PORT.to_string(),
            &n.to_string(),
        ]);
        let names = v["names"]
            .as_object()
            .expect("names")
            .iter()
            .map(|(k, c)| (k.clone(), c.as_u64().unwrap_or(0)))
            .collect();
        let peers = v["peers"]
            .as_array()
            .expect("peers")
            .iter()
            .filter_map(|p| p.as_str().map(String::from))
            .collect();
        (names, peers)
    }

    pub(crate) fn hold(&mut self) -> (Held, String) {
        let mut child = self
            .client_cmd(&["hold", &VIP.to_string(), &TCP_PORT.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn held client");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        self.children.push(child);
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let held = Held { stdin, lines };
        let first = held.next();
        assert_eq!(first["peer"], format!("{VIP}:{TCP_PORT}"), "{first}");
        let name = first["name"].as_str().expect("name").to_string();
        (held, name)
    }

    pub(crate) fn load(&self) -> ServiceLb {
        load_small(&self.pin_dir)
    }

    pub(crate) fn load_attached(&self) -> ServiceLb {
        let mut lb = self.load();
        let (id, report) = lb.attach(&self.cgroup).expect("attach");
        assert_eq!(id, cgroup_id(&self.cgroup).unwrap());
        assert_eq!(report.attached + report.adopted, 8, "{report:?}");
        lb
    }

    /// The ids of the programs `bpftool cgroup show` lists on the test cgroup for `hook` (its
    /// attach type as bpftool names it, e.g. `cgroup_inet4_connect`).
    fn attached_programs(&self, hook: &str) -> Vec<u32> {
        let out = Command::new("bpftool")
            .args(["cgroup", "show"])
            .arg(&self.cgroup)
            .output()
            .expect("run bpftool");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some(hook))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    }

    /// Whether no program is attached to `hook`, waiting up to 2 s: a link whose last pin is
    /// removed is released after an RCU grace period, not at once.
    fn detached_soon(&self, hook: &str) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            if self.attached_programs(hook).is_empty() {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for LbFixture {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.servers.take();
        if let Err(e) = ServiceLb::remove_pins(&self.pin_dir) {
            eprintln!("cleanup: {e}");
        }
        if self.cgroup_created {
            for _ in 0..100 {
                match std::fs::remove_dir(&self.cgroup) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        eprintln!("cleanup: rmdir {}: {e}", self.cgroup.display());
                        break;
                    }
                    _ => break,
                }
            }
        }
        for ns in &self.created {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

/// (a) spread over all backends, (b) getpeername shows the VIP, counters match.
#[test]
fn spreads_tcp_connects_over_every_backend_and_counts_them() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    let writes = lb
        .sync_service(
            tcp_frontend(),
            ServiceParams::default(),
            &tcp_backends(&[1, 2, 3]),
        )
        .expect("program");
    assert!(writes > 0);
    assert_eq!(
        lb.sync_service(
            tcp_frontend(),
            ServiceParams::default(),
            &tcp_backends(&[3, 2, 1])
        )
        .unwrap(),
        0,
        "unchanged: no writes"
    );

    const N: u64 = 300;
    let (names, peers) = fx.connects(N as usize);
    eprintln!("{N} connects: {names:?}");
    assert_eq!(
        peers,
        [format!("{VIP}:{TCP_PORT}")],
        "getpeername shows the VIP"
    );
    assert_eq!(names.values().sum::<u64>(), N);
    for b in ["b1", "b2", "b3"] {
        let got = names.get(b).copied().unwrap_or(0);
        assert!(got * 5 >= N, "{b} got {got} of {N} (< 20 %): {names:?}");
    }
    // The backends saw exactly those connections, and so did the counters.
    let accepted = fx.servers().accepted();
    let dump = lb.dump().expect("dump");
    assert_eq!(dump.len(), 1);
    let svc = &dump[0];
    assert_eq!(svc.frontend, format!("{VIP}:{TCP_PORT}/TCP"));
    assert_eq!(svc.connects, N);
    for b in &svc.backends {
        let name = backend_name(b.ip);
        let i: usize = name[1..].parse().unwrap();
        assert_eq!(b.connects, names[&name], "counter of {name}");
        assert_eq!(
            u64::from(accepted[i - 1]),
            names[&name],
            "accepted by {name}"
        );
        assert_eq!(b.sends, 0);
    }
    let pressure = lb.pressure().expect("pressure");
    let of = |m: &str| pressure.iter().find(|p| p.map == m).unwrap().clone();
    assert_eq!(of("LB_SERVICES").entries, 1);
    assert_eq!(of("LB_SERVICES").max_entries, 64);
    assert_eq!(of("LB_BACKENDS").entries, 3);
    assert_eq!(of("LB_COUNTERS").entries, 3);
    assert!(of("LB_REVNAT").entries >= 1 && of("LB_REVNAT").max_entries == 1024);
}

/// (c) UDP through the VIP, connected and unconnected: replies come from the VIP.
#[test]
fn udp_replies_come_from_the_vip() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    lb.sync_service(
        udp_frontend(),
        ServiceParams::default(),
        &udp_backends(&[1, 2, 3]),
    )
    .expect("program");
    let v = fx.client(&["udp", &VIP.to_string(), &UDP_PORT.to_string()]);
    eprintln!("udp: {v}");
    let vip = format!("{VIP}:{UDP_PORT}");
    assert_eq!(v["connected"]["from"], vip.as_str());
    assert_eq!(v["connected"]["peer"], vip.as_str());
    assert_eq!(v["unconnected"]["from"], vip.as_str());
    for mode in ["connected", "unconnected"] {
        assert!(
            v[mode]["name"].as_str().is_some_and(|n| n.starts_with('b')),
            "{v}"
        );
    }
    let dump = lb.dump().unwrap();
    let (connects, sends): (u64, u64) = (dump[0].connects, dump[0].sends);
    assert_eq!(
        (connects, sends),
        (1, 1),
        "one connected socket, one datagram"
    );
}

/// (d) no backends: connect (and a UDP send) fails at once with ECONNREFUSED; a removed
/// service is plain unroutable again.
#[test]
fn a_service_without_backends_refuses_at_once() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    lb.upsert_service(tcp_frontend(), ServiceParams::default())
        .expect("program");
    for _ in 0..3 {
        let v = fx.client(&["refused", &VIP.to_string(), &TCP_PORT.to_string()]);
        eprintln!("refused: {v}");
        assert_eq!(v["errno"], libc::ECONNREFUSED, "{v}");
        assert!(v["ms"].as_f64().unwrap() < 100.0, "took {v}");
    }
    // UDP: unconnected datagrams (sendmsg4) and connected sockets (connect4) alike.
    lb.upsert_service(udp_frontend(), ServiceParams::default())
        .expect("program");
    let v = fx.client(&["udp-refused", &VIP.to_string(), &UDP_PORT.to_string()]);
    assert_eq!(v["sendto"], libc::ECONNREFUSED, "{v}");
    assert_eq!(v["connect"], libc::ECONNREFUSED, "{v}");
    lb.remove_service(&udp_frontend()).expect("remove");
    lb.remove_service(&tcp_frontend()).expect("remove");
    let v = fx.client(&["refused", &VIP.to_string(), &TCP_PORT.to_string()]);
    assert_eq!(
        v["errno"],
        libc::ENETUNREACH,
        "no service: the VIP is just an address nobody routes: {v}"
    );
    assert!(lb.dump().unwrap().is_empty());
    assert_eq!(lb.state().backend_count(), 0);
}

/// (e) a removed backend gets no new connections; its established one keeps working.
#[test]
fn a_removed_backend_keeps_its_connections_and_gets_no_new_ones() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    lb.sync_service(
        tcp_frontend(),
        ServiceParams::default(),
        &tcp_backends(&[1, 2, 3]),
    )
    .unwrap();
    let (mut held, name) = fx.hold();
    let gone: usize = name[1..].parse().unwrap();
    let rest: Vec<usize> = (1..=BACKENDS).filter(|i| *i != gone).collect();
    lb.set_backends(&tcp_frontend(), &tcp_backends(&rest))
        .expect("remove one");
    let before = fx.servers().accepted()[gone - 1];

    let (names, _) = fx.connects(60);
    eprintln!("after removing {name}: {names:?}");
    assert!(!names.contains_key(&name), "{name} got new connections");
    assert_eq!(fx.servers().accepted()[gone - 1], before);
    let (echo, peer) = held.echo("still-there");
    assert_eq!(echo, "still-there");
    assert_eq!(peer, format!("{VIP}:{TCP_PORT}"));
    let dump = lb.dump().unwrap();
    assert_eq!(dump[0].backends.len(), 2);
    assert_eq!(
        dump[0].connects, 60,
        "removed backend's counters went with it"
    );
}

/// (f) an agent restart: the data path runs without the agent, a reload takes the pinned
/// maps and links over (nothing attached twice), established connections live on, and later
/// changes take effect.
#[test]
fn a_reload_from_the_pins_keeps_connections_and_programming() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    lb.sync_service(
        tcp_frontend(),
        ServiceParams::default(),
        &tcp_backends(&[1, 2, 3]),
    )
    .unwrap();
    let before = lb.dump().unwrap();
    let (mut held, name) = fx.hold();
    let old_prog = fx.attached_programs("cgroup_inet4_connect");
    assert_eq!(old_prog.len(), 1);
    drop(lb);

    // No agent: the pinned links keep translating.
    let (names, peers) = fx.connects(10);
    assert_eq!(names.values().sum::<u64>(), 10);
    assert_eq!(peers, [format!("{VIP}:{TCP_PORT}")]);

    let mut lb = fx.load();
    assert_eq!(
        lb.state().services().len(),
        1,
        "the mirror is rebuilt from the maps"
    );
    let (_, report) = lb.attach(&fx.cgroup).expect("attach again");
    assert_eq!(report.adopted, 8, "{report:?}");
    assert_eq!(report.attached, 0, "{report:?}");
    for hook in [
        "cgroup_inet4_connect",
        "cgroup_udp4_sendmsg",
        "cgroup_udp4_recvmsg",
        "cgroup_inet4_getpeername",
        "cgroup_inet6_connect",
        "cgroup_udp6_sendmsg",
        "cgroup_udp6_recvmsg",
        "cgroup_inet6_getpeername",
    ] {
        assert_eq!(fx.attached_programs(hook).len(), 1, "{hook} attached once");
    }
    let new_prog = fx.attached_programs("cgroup_inet4_connect");
    assert_ne!(new_prog, old_prog, "the link now runs this agent's program");
    let after = lb.dump().unwrap();
    assert_eq!(after[0].id, before[0].id);
    let ids = |d: &[lb::ServiceDump]| {
        d[0].backends
            .iter()
            .map(|b| (b.id, b.ip))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&after), ids(&before), "same ids and slots");
    assert_eq!(
        after[0].connects, 11,
        "counters survived (10 + the held one)"
    );
    assert_eq!(
        lb.sync_service(
            tcp_frontend(),
            ServiceParams::default(),
            &tcp_backends(&[1, 2, 3])
        )
        .unwrap(),
        0,
        "nothing rewritten"
    );

    let (echo, peer) = held.echo("across-restart");
    assert_eq!(echo, "across-restart");
    assert_eq!(peer, format!("{VIP}:{TCP_PORT}"), "reverse NAT survived");

    // Later changes take effect through the adopted links.
    let gone: usize = name[1..].parse().unwrap();
    let rest: Vec<usize> = (1..=BACKENDS).filter(|i| *i != gone).collect();
    lb.set_backends(&tcp_frontend(), &tcp_backends(&rest))
        .unwrap();
    let (names, _) = fx.connects(40);
    assert!(!names.contains_key(&name), "{names:?}");
    assert_eq!(held.echo("still").0, "still");
}

/// (g) ClientIP affinity: one client netns sticks to one backend, until that backend goes.
#[test]
fn client_ip_affinity_sticks_to_one_backend() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    let sticky = ServiceParams {
        affinity_timeout_s: Some(60),
        ..Default::default()
    };
    lb.sync_service(tcp_frontend(), sticky, &tcp_backends(&[1, 2, 3]))
        .unwrap();
    let (names, _) = fx.connects(30);
    eprintln!("sticky: {names:?}");
    assert_eq!(names.len(), 1, "one backend for one client: {names:?}");
    let (first, n) = names.iter().next().map(|(k, v)| (k.clone(), *v)).unwrap();
    assert_eq!(n, 30);
    // Another process of the same netns sticks too.
    let (again, _) = fx.connects(5);
    assert_eq!(again.keys().collect::<Vec<_>>(), [&first]);

    let gone: usize = first[1..].parse().unwrap();
    let rest: Vec<usize> = (1..=BACKENDS).filter(|i| *i != gone).collect();
    lb.set_backends(&tcp_frontend(), &tcp_backends(&rest))
        .unwrap();
    let (moved, _) = fx.connects(20);
    eprintln!("after removing {first}: {moved:?}");
    assert_eq!(moved.len(), 1, "sticks to the new choice: {moved:?}");
    assert!(!moved.contains_key(&first));
    let dump = lb.dump().unwrap();
    assert_eq!(dump[0].session_affinity, "ClientIP");
    assert_eq!(dump[0].affinity_timeout_seconds, Some(60));
}

#[test]
fn bpftool_shows_named_fields_of_the_lb_maps() {
    let fx = LbFixture::new();
    let mut lb = fx.load();
    lb.sync_service(
        tcp_frontend(),
        ServiceParams {
            affinity_timeout_s: Some(7),
            ..Default::default()
        },
        &tcp_backends(&[1]),
    )
    .unwrap();
    for (map, fields) in [
        (
            "LB_SERVICES",
            &["\"addr\"", "\"count\"", "\"affinity_timeout_s\""][..],
        ),
        ("LB_BACKENDS", &["\"service_id\"", "\"port\": 8080"][..]),
        ("LB_SLOTS", &["\"slot\""][..]),
    ] {
        let pin = fx.pin_dir.join(map);
        let out = Command::new("bpftool")
            .args(["map", "dump", "pinned"])
            .arg(&pin)
            .output()
            .expect("run bpftool");
        let dump = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for f in fields {
            assert!(dump.contains(f), "{map}: no {f} in\n{dump}");
        }
    }
}

#[test]
fn refuses_pins_of_another_layout_and_cleans_up() {
    let fx = LbFixture::new();
    // A map of another layout where LB_SLOTS should be.
    std::fs::create_dir_all(&fx.pin_dir).unwrap();
    let acct = Accounting::load_with_capacity(&fx.pin_dir, 4).expect("load accounting");
    std::fs::rename(
        fx.pin_dir.join(skiff_common::POD_INGRESS_MAP),
        fx.pin_dir.join("LB_SLOTS"),
    )
    .unwrap();
    let err = ServiceLb::load(&fx.pin_dir, LbConfig::default()).unwrap_err();
    assert!(matches!(err, BpfError::IncompatiblePin { .. }), "{err}");
    drop(acct);
    std::fs::remove_file(fx.pin_dir.join("LB_SLOTS")).unwrap();
    Accounting::remove_pins(&fx.pin_dir).unwrap();

    let mut lb = fx.load_attached();
    lb.upsert_service(tcp_frontend(), ServiceParams::default())
        .unwrap();
    drop(lb);
    assert_eq!(fx.attached_programs("cgroup_inet4_connect").len(), 1);
    ServiceLb::detach_pinned(&fx.pin_dir).unwrap();
    assert!(fx.detached_soon("cgroup_inet4_connect"), "detached");
    assert!(fx.pin_dir.join("LB_SERVICES").exists(), "maps stay");
    ServiceLb::remove_pins(&fx.pin_dir).unwrap();
    assert!(!fx.pin_dir.exists());
    assert!(
        fx.detached_soon("cgroup_inet4_connect"),
        "unpinned links detach"
    );
}

/// IPv6: connect6 spreads over the backends and getpeername6 shows the VIP; UDP through
/// sendmsg6/recvmsg6 (and connected UDP) answers from the VIP; a frontend without backends
/// refuses at once; the IPv4 programs leave IPv6 alone and vice versa (same maps).
#[test]
fn ipv6_frontends_are_balanced_reverse_translated_and_refused() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    let tcp6 = frontend6(TCP_PORT, Protocol::Tcp);
    let udp6 = frontend6(UDP_PORT, Protocol::Udp);
    lb.sync_service(
        tcp6,
        ServiceParams::default(),
        &backends6(&[1, 2, 3], BACKEND_TCP_PORT),
    )
    .expect("program tcp6");
    lb.sync_service(
        udp6,
        ServiceParams::default(),
        &backends6(&[1, 2, 3], BACKEND_UDP_PORT),
    )
    .expect("program udp6");
    // An IPv4 service with one backend next to it: its translations stay IPv4.
    lb.sync_service(
        tcp_frontend(),
        ServiceParams::default(),
        &tcp_backends(&[2]),
    )
    .expect("program tcp4");

    const N: u64 = 150;
    let (names, peers) = fx.connects_to(IpAddr::V6(VIP6), N as usize);
    eprintln!("{N} connects over IPv6: {names:?}");
    assert_eq!(
        peers,
        [format!("[{VIP6}]:{TCP_PORT}")],
        "getpeername6 shows the VIP"
    );
    assert_eq!(names.values().sum::<u64>(), N);
    for b in ["b1", "b2", "b3"] {
        let got = names.get(b).copied().unwrap_or(0);
        assert!(got * 5 >= N, "{b} got {got} of {N} (< 20 %): {names:?}");
    }
    let (names4, _) = fx.connects(5);
    assert_eq!(names4.keys().collect::<Vec<_>>(), ["b2"], "IPv4 untouched");
    let of = |lb: &ServiceLb, f: &Frontend| {
        let dump = lb.dump().expect("dump");
        dump.iter()
            .find(|d| d.frontend == f.to_string())
            .unwrap_or_else(|| panic!("{f} not in {dump:?}"))
            .clone()
    };
    let d = of(&lb, &tcp6);
    assert_eq!(d.connects, N, "per-backend counters of the IPv6 frontend");
    assert!(d.backends.iter().all(|b| b.ip.is_ipv6()), "{d:?}");

    let v = fx.client(&["udp", &VIP6.to_string(), &UDP_PORT.to_string()]);
    eprintln!("udp6: {v}");
    let vip = format!("[{VIP6}]:{UDP_PORT}");
    assert_eq!(v["connected"]["from"], vip.as_str(), "recvmsg6 (connected)");
    assert_eq!(v["connected"]["peer"], vip.as_str(), "getpeername6 (UDP)");
    assert_eq!(
        v["unconnected"]["from"],
        vip.as_str(),
        "recvmsg6 (sendmsg6)"
    );
    for mode in ["connected", "unconnected"] {
        assert!(
            v[mode]["name"].as_str().is_some_and(|n| n.starts_with('b')),
            "{v}"
        );
    }
    let d = of(&lb, &udp6);
    assert_eq!((d.connects, d.sends), (1, 1), "one connect6, one sendmsg6");

    // No backends: refused at once, TCP and UDP alike.
    lb.set_backends(&tcp6, &[]).expect("empty tcp6");
    lb.set_backends(&udp6, &[]).expect("empty udp6");
    let v = fx.client(&["refused", &VIP6.to_string(), &TCP_PORT.to_string()]);
    assert_eq!(v["errno"], libc::ECONNREFUSED, "{v}");
    assert!(v["ms"].as_f64().unwrap() < 100.0, "took {v}");
    let v = fx.client(&["udp-refused", &VIP6.to_string(), &UDP_PORT.to_string()]);
    assert_eq!(v["sendto"], libc::ECONNREFUSED, "sendmsg6: {v}");
    assert_eq!(v["connect"], libc::ECONNREFUSED, "connect6: {v}");
    // Removed: the VIP is just an address nobody routes.
    lb.remove_service(&tcp6).expect("remove");
    let v = fx.client(&["refused", &VIP6.to_string(), &TCP_PORT.to_string()]);
    assert_eq!(v["errno"], libc::ENETUNREACH, "{v}");
}

/// A `log` sink keeping every record's message.
#[derive(Clone, Default)]
pub(crate) struct Records(Arc<std::sync::Mutex<Vec<String>>>);

impl log::Log for Records {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("{} {}", record.level(), record.args()));
    }

    fn flush(&self) {}
}

impl Records {
    /// Waits up to 10 s for a record containing each of `wanted`; returns all records.
    pub(crate) fn wait_for(&self, wanted: &[&str]) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let all = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let found = wanted.iter().all(|w| all.iter().any(|r| r.contains(w)));
            if found || std::time::Instant::now() >= deadline {
                return all;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `--bpf-debug`: a translated connect (and sendmsg) leaves a debug record naming the VIP
/// and the backend, read by the reader thread into the sink (the agent's sink forwards to
/// tracing, see `debug::tests`). Without the flag nothing is started.
#[test]
fn debug_records_name_the_vip_and_the_backend() {
    let mut fx = LbFixture::new();
    assert!(
        !fx.load().start_debug_log(Records::default()).unwrap(),
        "off by default"
    );
    let mut lb = ServiceLb::load(
        &fx.pin_dir,
        LbConfig {
            debug: true,
            ..small_config()
        },
    )
    .expect("load with debug records");
    lb.attach(&fx.cgroup).expect("attach");
    lb.sync_service(
        tcp_frontend(),
        ServiceParams::default(),
        &tcp_backends(&[2]),
    )
    .expect("program");
    lb.sync_service(
        udp_frontend(),
        ServiceParams::default(),
        &udp_backends(&[3]),
    )
    .expect("program");
    let records = Records::default();
    assert!(lb.start_debug_log(records.clone()).expect("reader"));
    let (names, _) = fx.connects(2);
    assert_eq!(names.get("b2"), Some(&2));
    let v = fx.client(&["udp", &VIP.to_string(), &UDP_PORT.to_string()]);
    assert_eq!(v["unconnected"]["name"], "b3", "{v}");

    let connect = format!(
        "socket lb connect: {VIP}:{TCP_PORT} -> backend {}:{BACKEND_TCP_PORT}",
        backend_ip(2)
    );
    let sendmsg = format!(
        "socket lb sendmsg: {VIP}:{UDP_PORT} -> backend {}:{BACKEND_UDP_PORT}",
        backend_ip(3)
    );
    let all = records.wait_for(&[&connect, &sendmsg]);
    eprintln!("{all:#?}");
    let connects: Vec<&String> = all.iter().filter(|r| r.contains(&connect)).collect();
    assert_eq!(connects.len(), 2, "one per TCP connect: {all:#?}");
    assert!(connects.iter().all(|r| r.starts_with("DEBUG")), "{all:#?}");
    assert!(all.iter().any(|r| r.contains(&sendmsg)), "{all:#?}");

    // Off, the verifier removed the logging code (DEBUG is a read-only global it knows):
    // the hot path is what it was before debug records existed.
    let off = fx.load();
    for prog in [
        skiff_common::lb::LB_CONNECT4_PROG,
        skiff_common::lb::LB_SENDMSG6_PROG,
        skiff_common::lb::NP_INGRESS_PROG,
    ] {
        let (without, with) = (off.translated_size(prog), lb.translated_size(prog));
        eprintln!("{prog}: {without:?} bytes translated without debug, {with:?} with");
        assert!(
            matches!((without, with), (Some(a), Some(b)) if a < b),
            "{prog}: {without:?} vs {with:?}"
        );
    }
    drop(lb);
}
