//! Fixtures of the kernel tests, shared with the agent's (feature `testing`): the LB test bed
//! (a client namespace and cgroup, backends in a second namespace over a veth pair, small
//! maps pinned in a throwaway directory) and small process helpers. Needs root.
//!
//! Safety: both namespaces, the veth pair and every address (10.200.0.0/24 on the veth, the
//! "virtual IPs" 10.96.0.x that only exist as map keys) live inside namespaces the fixture
//! created; nothing is configured in, or sent from, the root namespace. The fixture's guard
//! stops the backend threads, kills the clients by pid, removes the pins (which detaches the
//! programs), the cgroup and the namespaces (with the veths in them), also when a test fails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures: a failed setup step is the test's failure"
)]

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::lb::{BackendAddr, Frontend, LbConfig, Protocol, ServiceLb};
use crate::{cgroup_id, node_pin_dir};

const TIMEOUT: Duration = Duration::from_secs(60);

pub fn unique_name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{:x}-{:x}{}",
        std::process::id(),
        nanos,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

pub fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn wait_timeout(child: &mut Child, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "{what} did not finish in {TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The IPv6 "virtual IP" (only a map key, like [`VIP`]).
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
pub const TCP_PORT: u16 = 80;
pub const UDP_PORT: u16 = 53;
pub const BACKEND_TCP_PORT: u16 = 8080;
pub const BACKEND_UDP_PORT: u16 = 5353;
/// Backend `i` (1-based) is `b<i>` at 10.200.0.1<i>.
pub const BACKENDS: usize = 3;

pub fn backend_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, 10 + i as u8)
}

/// Backend `i` (1-based) also is `b<i>` at fd00:200::1<i> (hex).
pub fn backend_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, 0, 0x10 + i as u16)
}

pub fn backend_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("b{}", v4.octets()[3] - 10),
        IpAddr::V6(v6) => format!("b{}", v6.segments()[7] - 0x10),
    }
}

pub fn tcp_frontend() -> Frontend {
    Frontend::new(IpAddr::V4(VIP), TCP_PORT, Protocol::Tcp)
}

pub fn udp_frontend() -> Frontend {
    Frontend::new(IpAddr::V4(VIP), UDP_PORT, Protocol::Udp)
}

pub fn frontend6(port: u16, protocol: Protocol) -> Frontend {
    Frontend::new(IpAddr::V6(VIP6), port, protocol)
}

pub fn backends6(which: &[usize], port: u16) -> Vec<BackendAddr> {
    which
        .iter()
        .map(|i| BackendAddr {
            ip: IpAddr::V6(backend_ip6(*i)),
            port,
        })
        .collect()
}

pub fn tcp_backends(which: &[usize]) -> Vec<BackendAddr> {
    which
        .iter()
        .map(|i| BackendAddr {
            ip: IpAddr::V4(backend_ip(*i)),
            port: BACKEND_TCP_PORT,
        })
        .collect()
}

pub fn udp_backends(which: &[usize]) -> Vec<BackendAddr> {
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
#[derive(Debug)]
pub struct Servers {
    pub stop: Arc<AtomicBool>,
    pub threads: Vec<JoinHandle<()>>,
    /// TCP connections accepted, per backend (index 0 = b1).
    pub accepted: Vec<Arc<AtomicU32>>,
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

    pub fn accepted(&self) -> Vec<u32> {
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
#[derive(Debug)]
pub struct Held {
    pub stdin: ChildStdin,
    pub lines: mpsc::Receiver<String>,
}

impl Held {
    pub fn next(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(20))
            .expect("held client answered");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    /// Sends `msg` over the held connection; returns (echo, peer).
    pub fn echo(&mut self, msg: &str) -> (String, String) {
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
pub fn load_small(pin_dir: &std::path::Path) -> ServiceLb {
    ServiceLb::load(pin_dir, small_config()).expect("load the LB")
}

/// The kernel tests' map sizes.
pub fn small_config() -> LbConfig {
    LbConfig {
        max_services: 64,
        max_backends: 256,
        max_revnat: 1024,
        max_affinity: 1024,
        max_np_ct: 1024,
        ..LbConfig::default()
    }
}

#[derive(Debug)]
pub struct LbFixture {
    pub client_ns: String,
    pub server_ns: String,
    pub cgroup: PathBuf,
    pub pin_dir: PathBuf,
    pub children: Vec<Child>,
    pub servers: Option<Servers>,
    pub created: Vec<String>,
    pub cgroup_created: bool,
}

impl LbFixture {
    #[allow(
        clippy::new_without_default,
        reason = "creates namespaces, a cgroup and servers: not a default value"
    )]
    pub fn new() -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        assert_eq!(unsafe { libc::geteuid() }, 0, "needs root");
        let suffix = unique_name();
        let root = skiff_runtime::host::cgroup2_mount().expect("cgroup v2 must be mounted");
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

    pub fn servers(&self) -> &Servers {
        self.servers.as_ref().expect("servers")
    }

    /// The client, in the client namespace (nsenter: setns, no /sys remount) and in the test
    /// cgroup (the shell moves itself there before python creates any socket).
    pub fn client_cmd(&self, args: &[&str]) -> Command {
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
    pub fn client(&mut self, args: &[&str]) -> Value {
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
    pub fn connects(&mut self, n: usize) -> (BTreeMap<String, u64>, Vec<String>) {
        self.connects_to(IpAddr::V4(VIP), n)
    }

    /// `n` TCP connects to `vip`:[`TCP_PORT`], as [`LbFixture::connects`].
    pub fn connects_to(&mut self, vip: IpAddr, n: usize) -> (BTreeMap<String, u64>, Vec<String>) {
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

    pub fn hold(&mut self) -> (Held, String) {
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

    pub fn load(&self) -> ServiceLb {
        load_small(&self.pin_dir)
    }

    pub fn load_attached(&self) -> ServiceLb {
        let mut lb = self.load();
        let (id, report) = lb.attach(&self.cgroup).expect("attach");
        assert_eq!(id, cgroup_id(&self.cgroup).unwrap());
        assert_eq!(report.attached + report.adopted, 8, "{report:?}");
        lb
    }

    /// The ids of the programs `bpftool cgroup show` lists on the test cgroup for `hook` (its
    /// attach type as bpftool names it, e.g. `cgroup_inet4_connect`).
    pub fn attached_programs(&self, hook: &str) -> Vec<u32> {
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
    pub fn detached_soon(&self, hook: &str) -> bool {
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
/// A `log` sink keeping every record's message.
#[derive(Debug, Clone, Default)]
pub struct Records(Arc<std::sync::Mutex<Vec<String>>>);

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
    pub fn wait_for(&self, wanted: &[&str]) -> Vec<String> {
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
