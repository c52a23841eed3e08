//! The load-balancing benchmarks' private network: a client and a server network namespace
//! (`skiff-bench-<suite>-<pid>-c`/`-s`) joined by a veth pair (`c0` 10.200.0.1/24, `s0`
//! 10.200.0.2/24 plus one address per backend), a cgroup v2 directory for the client, a BPF
//! pin directory `/sys/fs/bpf/skiff-bench-<pid>/`, and the processes on both sides:
//!
//! - the server (`skiff-bench __lb-server`, in the server namespace): per backend address a
//!   listener with a few threads, each serving one connection at a time, answering every
//!   request line with its own address;
//! - the client (`skiff-bench __lb-client`, in the client namespace, moved into the cgroup
//!   before it opens a socket): sequential TCP_CRR-like transactions (connect, one request and
//!   response, close), then TCP_RR-like ones (request and response on one kept connection),
//!   bounded by count and time; prints its samples as JSON.
//!
//! The load-balancing methods program only the client namespace (iptables/nftables rules) or
//! the cgroup (Skiff's socket LB). Every packet stays between the two namespaces. The
//! [`Topology`] guard kills the processes it started (by pid), removes the pins (detaching
//! the programs), the cgroup and both namespaces (the veths go with them), also on error or
//! panic.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde::{Deserialize, Serialize};
use skiff_datapath::lb::{BackendAddr, Frontend, LbConfig, Protocol, ServiceLb, ServiceParams};

use crate::kproxy::{BACKEND_PORT, SERVICE_PORT, ServiceSet};

/// First argument that makes `skiff-bench` the benchmark client.
pub const CLIENT_CMD: &str = "__lb-client";
/// First argument that makes `skiff-bench` the benchmark server.
pub const SERVER_CMD: &str = "__lb-server";

pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
/// Backends with a server behind them.
pub const REAL_BACKENDS: usize = 3;
/// Threads serving each backend address (the client holds one connection at a time).
const SERVER_THREADS: usize = 3;
const SERVER_READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Silence after which a server thread drops a connection.
const SERVER_IDLE: Duration = Duration::from_secs(30);
/// Per socket operation in the client.
const CLIENT_IO_TIMEOUT: Duration = Duration::from_secs(5);

pub fn real_backends() -> Vec<Ipv4Addr> {
    (0..REAL_BACKENDS)
        .map(|i| Ipv4Addr::new(10, 200, 0, 11 + i as u8))
        .collect()
}

/// Runs `program args` in `netns` (setns through `nsenter`, no mount namespace: the cgroup
/// and BPF file systems stay visible), with `stdin` from a file; fails with its stderr.
/// Returns how long it took, spawn to exit.
pub fn in_netns(
    netns: &str,
    program: &str,
    args: &[&str],
    stdin: Option<&Path>,
) -> Result<Duration> {
    Ok(in_netns_output(netns, program, args, stdin)?.1)
}

/// [`in_netns`], also returning stdout.
pub fn in_netns_output(
    netns: &str,
    program: &str,
    args: &[&str],
    stdin: Option<&Path>,
) -> Result<(String, Duration)> {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{netns}"))
        .arg(program)
        .args(args);
    match stdin {
        Some(p) => {
            let f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
            cmd.stdin(f);
        }
        None => {
            cmd.stdin(Stdio::null());
        }
    }
    let t0 = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("running {program} in {netns}"))?;
    let took = t0.elapsed();
    if !out.status.success() {
        bail!(
            "{program} {} in {netns}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), took))
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The two namespaces, the cgroup, the pin directory and the server; removed on drop.
#[derive(Debug)]
pub struct Topology {
    pub client_ns: String,
    pub server_ns: String,
    pub cgroup: PathBuf,
    pub pin_dir: PathBuf,
    created_ns: Vec<String>,
    cgroup_created: bool,
    server: Option<(Child, ChildStdin)>,
    /// Scratch files (rule sets).
    pub scratch: tempfile::TempDir,
}

impl Topology {
    /// Creates the namespaces, veth pair, addresses and the cgroup; starts the server.
    pub fn new(suite: &str) -> Result<Topology> {
        let pid = std::process::id();
        let mut t = Topology {
            client_ns: format!("skiff-bench-{suite}-{pid}-c"),
            server_ns: format!("skiff-bench-{suite}-{pid}-s"),
            cgroup: skiff_tests::cgroup2_root().join(format!("skiff-bench-{suite}-{pid}")),
            pin_dir: PathBuf::from(skiff_datapath::BPFFS_ROOT).join(format!("skiff-bench-{pid}")),
            created_ns: Vec::new(),
            cgroup_created: false,
            server: None,
            scratch: tempfile::Builder::new()
                .prefix("skiff-bench-lb-")
                .tempdir()
                .context("creating a scratch directory")?,
        };
        std::fs::create_dir(&t.cgroup)
            .with_context(|| format!("creating cgroup {}", t.cgroup.display()))?;
        t.cgroup_created = true;
        for ns in [t.client_ns.clone(), t.server_ns.clone()] {
            ip(&["netns", "add", &ns])?;
            t.created_ns.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let (c, s) = (t.client_ns.clone(), t.server_ns.clone());
        // Made inside the client namespace, the peer moved straight into the server's.
        ip(&[
            "-n", &c, "link", "add", "c0", "type", "veth", "peer", "name", "s0", "netns", &s,
        ])?;
        ip(&[
            "-n",
            &c,
            "addr",
            "add",
            &format!("{CLIENT_IP}/24"),
            "dev",
            "c0",
        ])?;
        ip(&["-n", &c, "link", "set", "c0", "up"])?;
        ip(&[
            "-n",
            &s,
            "addr",
            "add",
            &format!("{SERVER_IP}/24"),
            "dev",
            "s0",
        ])?;
        for b in real_backends() {
            ip(&["-n", &s, "addr", "add", &format!("{b}/24"), "dev", "s0"])?;
        }
        ip(&["-n", &s, "link", "set", "s0", "up"])?;
        // A node has a default route: the VIPs must be routable before OUTPUT's DNAT.
        ip(&[
            "-n",
            &c,
            "route",
            "add",
            "default",
            "via",
            &SERVER_IP.to_string(),
            "dev",
            "c0",
        ])?;
        // Many short connections: let the client reuse ports in TIME_WAIT (namespace-local).
        in_netns(&c, "sysctl", &["-q", "-w", "net.ipv4.tcp_tw_reuse=1"], None)?;
        in_netns(
            &c,
            "sysctl",
            &["-q", "-w", "net.ipv4.ip_local_port_range=10000 65000"],
            None,
        )?;
        t.start_server()?;
        Ok(t)
    }

    fn start_server(&mut self) -> Result<()> {
        let exe = std::env::current_exe().context("locating skiff-bench")?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.server_ns))
            .arg(&exe)
            .arg(SERVER_CMD);
        for b in real_backends() {
            cmd.arg("--listen").arg(format!("{b}:{BACKEND_PORT}"));
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the benchmark server")?;
        let stdin = child.stdin.take().context("server stdin")?;
        let stdout = child.stdout.take().context("server stdout")?;
        self.server = Some((child, stdin));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        match rx.recv_timeout(SERVER_READY_TIMEOUT) {
            Ok(l) if l.trim() == "ready" => Ok(()),
            Ok(l) => bail!("the benchmark server did not start: {l:?}"),
            Err(_) => bail!("the benchmark server was not ready in {SERVER_READY_TIMEOUT:?}"),
        }
    }

    /// A scratch file holding `text`.
    pub fn file(&self, name: &str, text: &str) -> Result<PathBuf> {
        let p = self.scratch.path().join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        Ok(p)
    }

    /// Runs the client against `target` in the client namespace and the cgroup.
    pub fn client(
        &self,
        target: SocketAddrV4,
        crr: usize,
        rr: usize,
        limit: Duration,
    ) -> Result<ClientOutput> {
        let exe = std::env::current_exe().context("locating skiff-bench")?;
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.client_ns))
            .arg(&exe)
            .arg(CLIENT_CMD)
            .args(["--cgroup", &self.cgroup.display().to_string()])
            .args(["--target", &target.to_string()])
            .args(["--crr", &crr.to_string(), "--rr", &rr.to_string()])
            .args(["--limit-ms", &limit.as_millis().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the benchmark client")?;
        // Read both pipes on threads so the deadline below holds whatever the child does.
        let mut out = child.stdout.take().context("client stdout")?;
        let mut err = child.stderr.take().context("client stderr")?;
        let out_t = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let err_t = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        // The client stops itself at `limit`; this is the backstop.
        let deadline = Instant::now() + limit + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait().context("waiting for the client")? {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the benchmark client did not finish in time");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let out = out_t.join().unwrap_or_default();
        let err = err_t.join().unwrap_or_default();
        if !status.success() {
            bail!("the benchmark client failed ({status}): {}", err.trim());
        }
        serde_json::from_str(out.trim()).with_context(|| format!("client output {out:?}"))
    }

    /// Removes every rule of the client namespace (both the iptables-nft tables and
    /// kube-proxy's nftables table) and checks nothing is left.
    pub fn flush_rules(&self) -> Result<()> {
        in_netns(&self.client_ns, "nft", &["flush", "ruleset"], None)?;
        let (left, _) = in_netns_output(&self.client_ns, "nft", &["list", "ruleset"], None)?;
        if !left.trim().is_empty() {
            bail!("rules left in {} after the flush:\n{left}", self.client_ns);
        }
        Ok(())
    }

    /// Detaches and unpins Skiff's LB (after the [`ServiceLb`] itself was dropped).
    pub fn remove_lb(&self) -> Result<()> {
        ServiceLb::remove_pins(&self.pin_dir).context("removing the LB pins")
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.server.take() {
            drop(stdin);
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = ServiceLb::remove_pins(&self.pin_dir);
        let _ = std::fs::remove_dir(&self.pin_dir);
        for ns in self.created_ns.drain(..) {
            let _ = ip(&["netns", "del", &ns]);
        }
        if self.cgroup_created {
            let _ = std::fs::write(self.cgroup.join("cgroup.kill"), "1");
            let deadline = Instant::now() + Duration::from_secs(5);
            while skiff_runtime::remove_cgroup_tree(&self.cgroup).is_err()
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Set when the suite's future is dropped (SIGINT/SIGTERM): the blocking work checks it
/// between steps and stops, so its guards run before the process exits (dropping the tokio
/// runtime waits for blocking tasks).
#[derive(Debug, Clone)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Fails once the run was cancelled.
    pub fn check(&self) -> Result<()> {
        if self.0.load(Ordering::Relaxed) {
            bail!("cancelled");
        }
        Ok(())
    }
}

struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `f` on tokio's blocking pool; dropping the returned future cancels it (see
/// [`Cancel`]).
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce(Cancel) -> Result<T> + Send + 'static,
) -> Result<T> {
    let flag = Arc::new(AtomicBool::new(false));
    let _guard = CancelOnDrop(flag.clone());
    tokio::task::spawn_blocking(move || f(Cancel(flag)))
        .await
        .context("the suite panicked")?
}

/// Map sizes for `set` (plus room for the one-change measurements).
pub fn lb_config(set: &ServiceSet) -> LbConfig {
    let d = LbConfig::default();
    LbConfig {
        max_services: (set.services.len() as u32 + 1024).max(d.max_services),
        max_backends: (set.endpoint_count() as u32 + 4096).max(d.max_backends),
        ..d
    }
}

pub fn frontend(vip: Ipv4Addr) -> Frontend {
    Frontend::new(vip.into(), SERVICE_PORT, Protocol::Tcp)
}

pub fn backend_addrs(ips: &[Ipv4Addr]) -> Vec<BackendAddr> {
    ips.iter()
        .map(|ip| BackendAddr {
            ip: (*ip).into(),
            port: BACKEND_PORT,
        })
        .collect()
}

/// Programs every service of `set` into `lb`, one `sync_service` each.
pub fn program_lb(lb: &mut ServiceLb, set: &ServiceSet) -> Result<()> {
    for s in &set.services {
        lb.sync_service(
            frontend(s.vip),
            ServiceParams::default(),
            &backend_addrs(&s.backends),
        )
        .with_context(|| format!("programming service {}", s.vip))?;
    }
    Ok(())
}

/// What the client measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClientOutput {
    /// Per TCP_CRR transaction, nanoseconds.
    pub crr_ns: Vec<u64>,
    pub crr_wall_ns: u64,
    /// Per TCP_RR transaction, nanoseconds.
    pub rr_ns: Vec<u64>,
    pub rr_wall_ns: u64,
    /// Answers per backend (the address the server answered with).
    pub backends: BTreeMap<String, u64>,
}

#[derive(Debug, Parser)]
#[command(name = "skiff-bench __lb-client")]
struct ClientArgs {
    /// cgroup v2 directory to join before opening any socket.
    #[arg(long)]
    cgroup: PathBuf,
    #[arg(long)]
    target: SocketAddrV4,
    #[arg(long)]
    crr: usize,
    #[arg(long)]
    rr: usize,
    /// Stop (with what was measured) after this long.
    #[arg(long)]
    limit_ms: u64,
}

/// Unmeasured transactions of each kind first.
const CLIENT_WARMUP: usize = 20;

/// The client process (`skiff-bench __lb-client …`): prints one JSON [`ClientOutput`].
pub fn client_main(args: &[String]) -> Result<()> {
    let a = ClientArgs::try_parse_from(
        std::iter::once(CLIENT_CMD.to_string()).chain(args.iter().cloned()),
    )?;
    std::fs::write(
        a.cgroup.join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .with_context(|| format!("joining cgroup {}", a.cgroup.display()))?;
    let deadline = Instant::now() + Duration::from_millis(a.limit_ms);
    let mut out = ClientOutput::default();
    let mut count = |name: String| *out.backends.entry(name).or_insert(0) += 1;
    let mut crr = Vec::with_capacity(a.crr);
    let t_crr = Instant::now();
    for i in 0..CLIENT_WARMUP + a.crr {
        if Instant::now() >= deadline {
            break;
        }
        let t0 = Instant::now();
        let name = crr_once(a.target, i)?;
        let took = t0.elapsed();
        if i >= CLIENT_WARMUP {
            crr.push(took.as_nanos() as u64);
            count(name);
        }
    }
    let crr_wall = t_crr.elapsed();
    let mut rr = Vec::with_capacity(a.rr);
    let (mut r, mut w) = connect(a.target)?;
    let mut line = String::new();
    let mut t_rr = Instant::now();
    for i in 0..CLIENT_WARMUP + a.rr {
        if Instant::now() >= deadline {
            break;
        }
        if i == CLIENT_WARMUP {
            t_rr = Instant::now();
        }
        let t0 = Instant::now();
        line.clear();
        request(&mut r, &mut w, i, &mut line)?;
        let took = t0.elapsed();
        if i >= CLIENT_WARMUP {
            rr.push(took.as_nanos() as u64);
        }
    }
    count(line.trim().to_string());
    out.crr_wall_ns = crr_wall.as_nanos() as u64;
    out.rr_wall_ns = t_rr.elapsed().as_nanos() as u64;
    out.crr_ns = crr;
    out.rr_ns = rr;
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

fn connect(target: SocketAddrV4) -> Result<(BufReader<TcpStream>, TcpStream)> {
    let s = TcpStream::connect_timeout(&target.into(), CLIENT_IO_TIMEOUT)
        .with_context(|| format!("connecting to {target}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(CLIENT_IO_TIMEOUT))?;
    s.set_write_timeout(Some(CLIENT_IO_TIMEOUT))?;
    let w = s.try_clone()?;
    Ok((BufReader::new(s), w))
}

fn request(
    r: &mut BufReader<TcpStream>,
    w: &mut TcpStream,
    i: usize,
    line: &mut String,
) -> Result<()> {
    // 32 bytes: a small request.
    w.write_all(format!("req {i:027}\n").as_bytes())
        .context("sending a request")?;
    if r.read_line(line).context("reading a response")? == 0 {
        bail!("the server closed the connection");
    }
    Ok(())
}

/// Connect, one request and response, close; the backend that answered.
fn crr_once(target: SocketAddrV4, i: usize) -> Result<String> {
    let (mut r, mut w) = connect(target)?;
    let mut line = String::new();
    request(&mut r, &mut w, i, &mut line)?;
    Ok(line.trim().to_string())
}

#[derive(Debug, Parser)]
#[command(name = "skiff-bench __lb-server")]
struct ServerArgs {
    /// Address to serve; repeat for each backend.
    #[arg(long, required = true)]
    listen: Vec<SocketAddrV4>,
}

/// The server process (`skiff-bench __lb-server --listen ip:port …`): prints `ready` once
/// listening, serves until its stdin closes.
pub fn server_main(args: &[String]) -> Result<()> {
    let a = ServerArgs::try_parse_from(
        std::iter::once(SERVER_CMD.to_string()).chain(args.iter().cloned()),
    )?;
    for addr in &a.listen {
        let l = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
        let answer = format!("{}\n", addr.ip());
        for _ in 0..SERVER_THREADS {
            let l = l.try_clone()?;
            let answer = answer.clone();
            std::thread::spawn(move || {
                while let Ok((conn, _)) = l.accept() {
                    serve(conn, answer.as_bytes());
                }
            });
        }
    }
    println!("ready");
    std::io::stdout().flush()?;
    // Until the bench closes our stdin (or kills us).
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    Ok(())
}

/// Answers every request line with `answer` until EOF or [`SERVER_IDLE`].
fn serve(conn: TcpStream, answer: &[u8]) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(SERVER_IDLE));
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    while matches!(r.read_line(&mut line), Ok(n) if n > 0) {
        if w.write_all(answer).is_err() {
            return;
        }
        line.clear();
    }
}
