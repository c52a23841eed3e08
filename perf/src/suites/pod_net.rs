//! `pod-net`: pod-to-pod networking. TCP stream throughput (`iperf3`) and TCP request/response
//! rate and round-trip latency (the bench's own `__rr` helper, netperf `TCP_RR`-style), from a
//! client pod to a server pod on the same node and across two nodes, for Skiff and two
//! baselines built by the suite in namespaces of its own (see [`crate::topology`]):
//!
//! - **skiff**: a real cluster from the `skiff-tests` harness: the API server (embedded store)
//!   and two real `skiff-node` agents, each node in its own network namespace with an `eth0` on
//!   the harness' [`Fabric`] (a bridge in another namespace). The agents give the pods their
//!   IPs, veths, routes and whatever eBPF data path they attach. The server pod runs
//!   `iperf3 -s` and the RR server as its two containers; the client pods run `sleep`, and
//!   each client process is started inside a client pod: it joins the pod container's cgroup
//!   (so the agent's cgroup eBPF programs see it as the pod's) and its network namespace
//!   (`/proc/<pod pid>/ns/net`).
//! - **bridge+veth+iptables**: Docker / flannel host-gw (bridge per node, conntrack rules).
//! - **plain veth**: the limit (one veth pair; across nodes one router namespace between).
//!
//! Rounds run every (placement, test) for each of the three in turn, the order rotated per
//! round; each series collects every round. Everything the suite starts is a guard: the
//! servers are killed by pid, the baseline namespaces deleted, the cluster removed by the
//! harness, also on error or interruption.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use serde_json::json;
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::{Api, Client};
use skiff_tests::{ApiServer, Backend, Machine, Node};
use tracing::{info, warn};

use super::Options;
use super::pod_start::{wait_node_ready, with_agent_log};
use crate::baseline::Procs;
use crate::host;
use crate::iperf::{self, StreamResult};
use crate::report::{Measured, Role, Series, SuiteReport};
use crate::rr::{self, RrResult};
use crate::topology::{self, Namespaces};

pub const NAME: &str = "pod-net";
pub const TITLE: &str = "pod-to-pod TCP throughput and request/response latency";

const NAMESPACE: &str = "default";
const POD_CIDR_A: &str = "10.244.20.0/24";
const POD_CIDR_B: &str = "10.244.21.0/24";
/// The RR server's port (iperf3's is [`iperf::PORT`]).
const RR_PORT: u16 = 5300;
/// iperf3 reporting interval: one stream sample per interval.
const INTERVAL_S: f64 = 0.5;
/// Round-trip times kept per RR run (every k-th transaction).
const RR_SAMPLES_PER_RUN: usize = 300;
/// Tries of one client run (a server may still be starting or resetting after a test).
const TRIES: usize = 3;

const POD_RUNNING_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the first connection of a path may take (routes still being programmed).
const FIRST_CONNECT_TIMEOUT: Duration = Duration::from_secs(45);

/// How long each measurement runs, and how many rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PodNetSizes {
    /// Whole seconds (iperf3's `-t`).
    stream_s: u32,
    rr_s: f64,
    rounds: usize,
}

/// Many short rounds rather than a few long ones: on a shared machine the load drifts, and
/// interleaving the implementations finely spreads that drift over all of them.
const FULL: PodNetSizes = PodNetSizes {
    stream_s: 2,
    rr_s: 2.0,
    rounds: 6,
};
const QUICK: PodNetSizes = PodNetSizes {
    stream_s: 1,
    rr_s: 1.0,
    rounds: 1,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Placement {
    Same,
    Cross,
}

impl Placement {
    const ALL: [Placement; 2] = [Placement::Same, Placement::Cross];

    fn label(self) -> &'static str {
        match self {
            Placement::Same => "same node",
            Placement::Cross => "cross node",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Test {
    Stream,
    Rr,
}

impl Test {
    const ALL: [Test; 2] = [Test::Stream, Test::Rr];

    fn label(self) -> &'static str {
        match self {
            Test::Stream => "stream",
            Test::Rr => "RR",
        }
    }
}

/// The comparison a series belongs to, e.g. `same node · stream`.
fn group(p: Placement, t: Test) -> String {
    format!("{} · {}", p.label(), t.label())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Impl {
    Skiff,
    Bridge,
    Plain,
}

impl Impl {
    const ALL: [Impl; 3] = [Impl::Skiff, Impl::Bridge, Impl::Plain];

    fn series(self) -> &'static str {
        match self {
            Impl::Skiff => "skiff",
            Impl::Bridge => "bridge+veth+iptables",
            Impl::Plain => "plain veth",
        }
    }

    fn role(self) -> Role {
        match self {
            Impl::Skiff => Role::Skiff,
            Impl::Bridge | Impl::Plain => Role::Baseline,
        }
    }

    fn path(self, p: Placement) -> &'static str {
        match (self, p) {
            (Impl::Skiff, Placement::Same) => {
                "client pod eth0 → veth → node netns (routed, /32 host routes, proxy ARP) → \
                 veth → server pod eth0, through whatever eBPF the agent attaches"
            }
            (Impl::Skiff, Placement::Cross) => {
                "client pod → veth → node B netns → eth0 veth → fabric bridge (own netns) → \
                 veth → node A netns (direct route to B's pod CIDR, no encapsulation) → veth → \
                 server pod"
            }
            (Impl::Bridge, Placement::Same) => {
                "client netns → veth → Linux bridge cbr0 in node A netns (bridged, \
                 bridge-nf-call-iptables=1 so FORWARD + conntrack run) → veth → server netns"
            }
            (Impl::Bridge, Placement::Cross) => {
                "client netns → veth → cbr0 in node B netns (routed, FORWARD + conntrack) → \
                 eth0 veth → fabric bridge (own netns) → veth → node A netns (route to B's \
                 subnet, FORWARD + conntrack) → cbr0 → veth → server netns"
            }
            (Impl::Plain, Placement::Same) => {
                "client netns → one veth pair → server netns (no bridge, no routing hop, no \
                 netfilter rules)"
            }
            (Impl::Plain, Placement::Cross) => {
                "client netns → veth → router netns (ip_forward, no rules) → veth → server \
                 netns: one routing hop, no bridge"
            }
        }
    }
}

/// Where a client process runs.
#[derive(Debug, Clone, PartialEq)]
enum ClientAt {
    /// A namespace of the suite's own (`/run/netns/<name>`).
    Netns(String),
    /// Inside a pod: joins its container's cgroup, enters its network namespace.
    Pod {
        cgroup_procs: PathBuf,
        netns: PathBuf,
    },
}

impl ClientAt {
    /// The command line that runs `argv` there.
    fn command(&self, argv: &[String]) -> Vec<String> {
        let mut out: Vec<String> = match self {
            ClientAt::Netns(ns) => vec![
                "nsenter".into(),
                format!("--net={}", topology::netns_path(ns).display()),
            ],
            // The shell moves itself into the pod's cgroup, then becomes (exec, same pid)
            // nsenter, which becomes the client in the pod's network namespace.
            ClientAt::Pod {
                cgroup_procs,
                netns,
                ..
            } => vec![
                "sh".into(),
                "-c".into(),
                r#"echo $$ > "$1" && ns="$2" && shift 2 && exec nsenter --net="$ns" "$@""#.into(),
                "sh".into(),
                cgroup_procs.display().to_string(),
                netns.display().to_string(),
            ],
        };
        out.extend(argv.iter().cloned());
        out
    }
}

/// One client → server path.
#[derive(Debug, Clone)]
struct NetPath {
    client: ClientAt,
    server: Ipv4Addr,
}

/// Every measured run of one series.
#[derive(Debug, Default)]
struct Acc {
    streams: Vec<StreamResult>,
    rrs: Vec<RrResult>,
    retries: usize,
}

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// Fails unless every program in `tools` is on the PATH.
fn require_tools(tools: &[&str]) -> Result<()> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| !std::env::split_paths(&path).any(|d| d.join(t).is_file()))
        .collect();
    if !missing.is_empty() {
        bail!(
            "{NAME} needs {} on the PATH: run `cargo xtask setup` (or `apt-get install {}`)",
            missing.join(", "),
            missing
                .iter()
                .map(|t| match *t {
                    "iptables-restore" => "iptables",
                    "nsenter" => "util-linux",
                    "sysctl" => "procps",
                    other => other,
                })
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(())
}

async fn measure(opts: &Options) -> Result<SuiteReport> {
    host::require_root()?;
    let bin_dir = host::check_binaries(&["skiff-apiserver", "skiff-node"])?;
    require_tools(&["iperf3", "nsenter", "iptables-restore", "sysctl", "ip"])?;
    let mut sizes = if opts.quick { QUICK } else { FULL };
    if let Some(r) = opts.runs {
        if r == 0 {
            bail!("--runs must be at least 1");
        }
        sizes.rounds = r;
    }
    let bench = std::env::current_exe()
        .context("locating the bench executable")?
        .display()
        .to_string();
    let started_at = chrono::Utc::now();
    let mut env = host::environment();
    let rr_server = |listen: &str| -> Vec<String> {
        [bench.as_str(), rr::HELPER_ARG, "server", "--listen", listen]
            .map(String::from)
            .to_vec()
    };
    let any = format!("0.0.0.0:{RR_PORT}");

    // Baselines: namespaces, then one iperf3 and one RR server in each server namespace.
    // Declared before the servers so they are dropped (deleted) after the servers are killed.
    info!(suite = NAME, ?sizes, "building the baseline namespaces");
    let namespaces = Namespaces::new(NAME);
    let bridge = topology::bridge(&namespaces, &[iperf::PORT, RR_PORT]);
    let plain = topology::plain(&namespaces);
    bridge
        .build(&namespaces)
        .context("building the bridge baseline")?;
    plain
        .build(&namespaces)
        .context("building the plain veth baseline")?;
    let servers = Procs::new(None)?;
    for plan in [&bridge, &plain] {
        let at = ClientAt::Netns(plan.server_ns.clone());
        for argv in [iperf::server_command(), rr_server(&any)] {
            let cmd = at.command(&argv);
            servers.spawn(std::process::Command::new(&cmd[0]).args(&cmd[1..]))?;
        }
    }

    // Skiff: API server, fabric, two nodes with real agents; dropped in reverse order.
    let run_id = skiff_tests::unique();
    let (name_a, name_b) = (
        format!("perf-net-{run_id}-a"),
        format!("perf-net-{run_id}-b"),
    );
    info!(nodes = ?[&name_a, &name_b], "starting the API server and two node agents on a fabric");
    let fabric = skiff_tests::fabric();
    let control = Machine::on(&fabric, "control");
    let server = ApiServer::start_on(&control, Backend::Embedded, &[]);
    let node_a = Node::start(&server, &fabric, &name_a, POD_CIDR_A);
    let node_b = Node::start(&server, &fabric, &name_b, POD_CIDR_B);
    let listen = server.listen().to_string();
    env.binaries.insert(
        "skiff-apiserver".into(),
        host::verify_process("skiff-apiserver", &["--listen", &listen], &bin_dir)?
            .display()
            .to_string(),
    );
    for name in [&name_a, &name_b] {
        let exe =
            host::verify_process("skiff-node agent", &["run", "--node-name", name], &bin_dir)?;
        env.binaries
            .insert(format!("skiff-node ({name})"), exe.display().to_string());
    }
    let client = Client::connect_with(&server.client_config())
        .await
        .context("connecting to the API server")?;
    for node in [&node_a, &node_b] {
        wait_node_ready(&client, &node.name)
            .await
            .map_err(|e| with_agent_log(e, node))?;
    }
    let pods = client.namespaced::<Pod>(NAMESPACE);
    let server_pod = pod(
        &format!("net-server-{run_id}"),
        &name_a,
        &[("iperf3", iperf::server_command()), ("rr", rr_server(&any))],
    )?;
    let same_pod = pod(
        &format!("net-client-same-{run_id}"),
        &name_a,
        &[("main", sleep())],
    )?;
    let cross_pod = pod(
        &format!("net-client-cross-{run_id}"),
        &name_b,
        &[("main", sleep())],
    )?;
    for p in [&server_pod, &same_pod, &cross_pod] {
        pods.create(p)
            .await
            .with_context(|| format!("creating pod {}", p.name()))?;
    }
    let on_a = |e| with_agent_log(e, &node_a);
    let on_b = |e| with_agent_log(e, &node_b);
    let server_ip = pod_ip(&running(&pods, server_pod.name()).await.map_err(on_a)?)?;
    let same = in_pod(
        &running(&pods, same_pod.name()).await.map_err(on_a)?,
        &node_a,
        server_ip,
    )?;
    let cross = in_pod(
        &running(&pods, cross_pod.name()).await.map_err(on_b)?,
        &node_b,
        server_ip,
    )?;
    let datapath = node_datapath(&node_a);

    let paths: BTreeMap<(Impl, Placement), NetPath> = BTreeMap::from([
        ((Impl::Skiff, Placement::Same), same),
        ((Impl::Skiff, Placement::Cross), cross),
        (
            (Impl::Bridge, Placement::Same),
            baseline_path(&bridge.same_node),
        ),
        (
            (Impl::Bridge, Placement::Cross),
            baseline_path(&bridge.cross_node),
        ),
        (
            (Impl::Plain, Placement::Same),
            baseline_path(&plain.same_node),
        ),
        (
            (Impl::Plain, Placement::Cross),
            baseline_path(&plain.cross_node),
        ),
    ]);

    // Warm-up: proves every path works both ways (the first connection waits for routes and
    // servers) and warms ARP/neighbour and route caches. Not measured.
    info!("warm-up: one short RR and stream run per path");
    let mut warmup_retries = 0;
    for ((imp, p), path) in &paths {
        let what = format!("warm-up {} · {}", imp.series(), p.label());
        retry(&what, &mut warmup_retries, || {
            rr_run(&bench, path, 0.3, FIRST_CONNECT_TIMEOUT)
        })
        .await?;
        retry(&what, &mut warmup_retries, || stream_run(path, 1)).await?;
    }

    let mut acc: BTreeMap<(Impl, Placement, Test), Acc> = BTreeMap::new();
    let t_measure = Instant::now();
    for round in 0..sizes.rounds {
        info!(round = round + 1, of = sizes.rounds, "measuring");
        for p in Placement::ALL {
            for t in Test::ALL {
                for imp in rotated(round) {
                    let path = &paths[&(imp, p)];
                    let a = acc.entry((imp, p, t)).or_default();
                    let what = format!("{} · {} (round {})", imp.series(), group(p, t), round + 1);
                    match t {
                        Test::Stream => {
                            let s =
                                retry(&what, &mut a.retries, || stream_run(path, sizes.stream_s))
                                    .await?;
                            a.streams.push(s);
                        }
                        Test::Rr => {
                            let r = retry(&what, &mut a.retries, || {
                                rr_run(&bench, path, sizes.rr_s, Duration::from_secs(5))
                            })
                            .await?;
                            a.rrs.push(r);
                        }
                    }
                }
            }
        }
    }
    let measure_wall = t_measure.elapsed();

    info!("tearing down");
    drop(pods);
    drop(client);
    drop(node_b);
    drop(node_a);
    drop(fabric);
    drop(server);
    drop(servers);
    drop(namespaces);

    let mut congestion: Vec<String> = acc
        .values()
        .flat_map(|a| a.streams.iter().map(|s| s.congestion.clone()))
        .collect();
    congestion.sort();
    congestion.dedup();
    let congestion = congestion.join(", ");
    let mut series = Vec::new();
    let mut per_run = BTreeMap::new();
    for p in Placement::ALL {
        for t in Test::ALL {
            for imp in Impl::ALL {
                let a = acc.remove(&(imp, p, t)).unwrap_or_default();
                let g = group(p, t);
                series.push(build_series(imp, p, t, &a)?.in_group(&g));
                per_run.insert(
                    format!("{g} · {}", imp.series()),
                    json!({
                        "retries": a.retries,
                        "runs": match t {
                            Test::Stream => a.streams.iter().map(|s| json!({
                                "gbit_per_s": s.gbit_per_s(),
                                "received_bytes": s.received_bytes,
                                "seconds": s.received_seconds,
                                "retransmits": s.retransmits,
                                "cpu_client_percent": s.cpu_client_percent,
                                "cpu_server_percent": s.cpu_server_percent,
                                "congestion": s.congestion,
                            })).collect::<Vec<_>>(),
                            Test::Rr => a.rrs.iter().map(|r| json!({
                                "transactions": r.transactions,
                                "seconds": r.seconds,
                                "per_s": r.rate(),
                                "p50_us": r.p50_ns as f64 / 1e3,
                                "p90_us": r.p90_ns as f64 / 1e3,
                                "p99_us": r.p99_ns as f64 / 1e3,
                                "max_us": r.max_ns as f64 / 1e3,
                            })).collect::<Vec<_>>(),
                        },
                    }),
                );
            }
        }
    }

    let params = BTreeMap::from([
        ("rounds".to_string(), json!(sizes.rounds)),
        ("stream_seconds_per_run".to_string(), json!(sizes.stream_s)),
        ("stream_interval_seconds".to_string(), json!(INTERVAL_S)),
        ("rr_seconds_per_run".to_string(), json!(sizes.rr_s)),
        ("rr_request_response_bytes".to_string(), json!([1, 1])),
        (
            "rr_samples_kept_per_run".to_string(),
            json!(RR_SAMPLES_PER_RUN),
        ),
        (
            "cluster".to_string(),
            json!(
                "skiff-apiserver (embedded store) + 2 skiff-node agents, nodes on one fabric bridge"
            ),
        ),
        (
            "iperf3".to_string(),
            json!(tool_version(&["iperf3", "--version"])),
        ),
        (
            "iptables".to_string(),
            json!(tool_version(&["iptables", "--version"])),
        ),
    ]);
    let mut notes = vec![
        format!(
            "Each round runs, for same node then cross node, stream then RR, the three \
             implementations one after another (order rotated every round, so none always \
             goes first); {} round(s). Only one client runs at a time; everything shares this \
             machine's CPUs with the client and server processes.",
            sizes.rounds
        ),
        format!(
            "Stream: `iperf3 -c <server> -t {} -i {INTERVAL_S} -J`, one TCP stream, client \
             sends (iperf3's default 128 KiB writes; TCP congestion control: the \
             namespaces' default, {}). The `per s` column is Mbit/s \
             received by the server over all rounds (bytes × 8 / 10^6 / seconds, iperf3's \
             `end.sum_received`), so the throughput ratio is Skiff's share of the baseline's \
             bandwidth. Each sample is one {INTERVAL_S} s interval of the sender, expressed as \
             the time it would take to move 1 GB (10^9 bytes) at that interval's rate: lower \
             is better, and p50/p99 ratios compare typical and slow intervals.",
            sizes.stream_s, congestion
        ),
        format!(
            "RR: the bench's own `skiff-bench __rr client` (Rust, blocking sockets, \
             TCP_NODELAY): one connection, a 1-byte request, a 1-byte response, next request \
             after the response, for {} s per run (netperf TCP_RR's shape). A sample is one \
             transaction's round-trip time, client side; every k-th transaction is kept (at \
             most {RR_SAMPLES_PER_RUN} per run, evenly spread over the run), the exact \
             per-run percentiles over every transaction are in the JSON's details.runs. The \
             `per s` column is transactions per second over all rounds.",
            sizes.rr_s
        ),
        "The clients of the Skiff series run inside a client pod: a shell joins the pod \
         container's cgroup (`<node cgroup>/pod-<uid>/main/cgroup.procs`, so cgroup eBPF \
         programs on the node's pod cgroup see the client as the pod) and execs `nsenter \
         --net=/proc/<pod pid>/ns/net`. The servers are the server pod's two containers. \
         Baseline clients and servers run in the suite's own namespaces via `nsenter`, in no \
         particular cgroup."
            .into(),
        "Docker/flannel baseline rules per node netns (iptables-restore, FORWARD policy \
         DROP): FORWARD → DOCKER-USER, DOCKER-ISOLATION-STAGE-1/2 (RETURN for this \
         traffic), `-o cbr0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`, `-o cbr0 \
         -j DOCKER` with per-pod `-d <server pod>/32 -o cbr0 -p tcp --dport <port> -j \
         ACCEPT` for both server ports, `-i cbr0 ! -o cbr0 -j ACCEPT`, `-i cbr0 -o cbr0 -j \
         ACCEPT`; nat: flannel's `POSTROUTING -s 10.201.0.0/16 ! -d 10.201.0.0/16 -j \
         MASQUERADE` (so conntrack and the nat hooks are active; pod-to-pod is not \
         translated). Every packet of a flow after the first is accepted by the conntrack \
         rule."
            .into(),
        format!(
            "Veth pairs on the path: skiff and bridge 2 same node / 4 cross node, plain veth \
             1 / 2. Routing hops: skiff 1 / 2, bridge 0 (bridged) / 2, plain 0 / 1. \
             Bridges: skiff 0 / 1 (fabric), bridge 1 / 3, plain 0 / 0. MTU 1500 everywhere. \
             Measured phase: {:.0} s.",
            measure_wall.as_secs_f64()
        ),
    ];
    for imp in Impl::ALL {
        for p in Placement::ALL {
            notes.push(format!(
                "Path {} · {}: {}.",
                imp.series(),
                p.label(),
                imp.path(p)
            ));
        }
    }
    notes.push(format!(
        "Skiff's eBPF on the server's node at measurement time: {datapath}."
    ));
    Ok(SuiteReport::new(
        NAME,
        TITLE,
        started_at,
        env,
        Measured {
            quick: opts.quick,
            params,
            series,
            notes,
            details: BTreeMap::from([
                ("runs".to_string(), json!(per_run)),
                ("skiff_node_datapath".to_string(), json!(datapath)),
                ("warmup_retries".to_string(), json!(warmup_retries)),
            ]),
        },
    ))
}

/// `f()` until it succeeds, at most [`TRIES`] times, 1 s apart; counts the retries.
async fn retry<T, F, Fut>(what: &str, retries: &mut usize, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tries < TRIES => {
                warn!(run = %what, error = %format!("{e:#}"), "retrying");
                *retries += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.context(what.to_string())),
        }
    }
}

/// The implementations in the order of round `round` (rotated by one per round).
fn rotated(round: usize) -> [Impl; 3] {
    let mut order = Impl::ALL;
    order.rotate_left(round % Impl::ALL.len());
    order
}

fn baseline_path((ns, server): &(String, Ipv4Addr)) -> NetPath {
    NetPath {
        client: ClientAt::Netns(ns.clone()),
        server: *server,
    }
}

fn sleep() -> Vec<String> {
    vec!["sleep".into(), "3600".into()]
}

/// A pod bound to `node` with one container per `(name, command)`, image `host`.
fn pod(name: &str, node: &str, containers: &[(&str, Vec<String>)]) -> Result<Pod> {
    let containers: Vec<serde_json::Value> = containers
        .iter()
        .map(|(n, cmd)| json!({"name": n, "image": "host", "command": cmd}))
        .collect();
    skiff_api::manifest::decode(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"skiff-perf": NAME}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": containers,
        },
    }))
    .with_context(|| format!("building pod {name}"))
}

/// Waits until pod `name` is Running with every container running and an IP.
async fn running(pods: &Api<Pod>, name: &str) -> Result<Pod> {
    let deadline = Instant::now() + POD_RUNNING_TIMEOUT;
    loop {
        let p = pods
            .get(name)
            .await
            .with_context(|| format!("reading pod {name}"))?;
        let ready = p.status.as_ref().is_some_and(|s| {
            s.phase == "Running"
                && !s.pod_ip.is_empty()
                && !s.container_statuses.is_empty()
                && s.container_statuses
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
        });
        if ready {
            return Ok(p);
        }
        if Instant::now() >= deadline {
            bail!(
                "pod {name} not Running within {POD_RUNNING_TIMEOUT:?}: {:?}",
                p.status
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pod_ip(p: &Pod) -> Result<Ipv4Addr> {
    let ip = p.status.as_ref().map(|s| s.pod_ip.as_str()).unwrap_or("");
    ip.parse().with_context(|| {
        format!(
            "pod {}: status.podIP {ip:?} is not an IPv4 address",
            p.name()
        )
    })
}

/// The path from a client inside pod `p` (container `main`) on `node` to `server`.
fn in_pod(p: &Pod, node: &Node, server: Ipv4Addr) -> Result<NetPath> {
    let uid = p.metadata().map(|m| m.uid.as_str()).unwrap_or_default();
    if uid.is_empty() {
        bail!("pod {} has no uid", p.name());
    }
    let cgroup_procs = node
        .cgroup_parent
        .join(format!("pod-{uid}"))
        .join("main")
        .join("cgroup.procs");
    let procs = std::fs::read_to_string(&cgroup_procs)
        .with_context(|| format!("reading {}", cgroup_procs.display()))?;
    let pid: u32 = procs
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .with_context(|| format!("no process in {}", cgroup_procs.display()))?;
    Ok(NetPath {
        client: ClientAt::Pod {
            cgroup_procs,
            netns: PathBuf::from(format!("/proc/{pid}/ns/net")),
        },
        server,
    })
}

/// What eBPF the agent of `node` has put on the data path: the names of its pins under
/// `/sys/fs/bpf/skiff/<node>/` (maps and links, e.g. `link_np_<ifname>`), and `bpftool net
/// show` in the node's namespace (tc and XDP programs on its interfaces; this bpftool may not
/// list TCX links, which the pins name).
fn node_datapath(node: &Node) -> String {
    let pins_dir = std::path::Path::new("/sys/fs/bpf/skiff").join(&node.name);
    let mut pins: Vec<String> = std::fs::read_dir(&pins_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    pins.sort();
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", node.netns_path().display()))
        .args(["bpftool", "net", "show"])
        .output();
    let net = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        Ok(o) => format!("failed: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => format!("not run: {e}"),
    };
    format!(
        "pins in {}: {}; bpftool net show: {net}",
        pins_dir.display(),
        if pins.is_empty() {
            "none".to_string()
        } else {
            pins.join(", ")
        }
    )
}

fn tool_version(argv: &[&str]) -> String {
    std::process::Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// Runs `argv` to completion within `timeout` (killed by pid if it takes longer, or if this
/// future is dropped); returns its stdout, or fails with its stderr.
async fn capture(argv: &[String], timeout: Duration) -> Result<String> {
    let out = tokio::time::timeout(
        timeout,
        tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("{} did not finish within {timeout:?}", argv.join(" ")))?
    .with_context(|| format!("running {}", argv[0]))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {} {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            stdout.trim()
        );
    }
    Ok(stdout)
}

async fn stream_run(path: &NetPath, seconds: u32) -> Result<StreamResult> {
    let argv = path.client.command(&iperf::client_command(
        &path.server.to_string(),
        seconds,
        INTERVAL_S,
    ));
    let timeout = Duration::from_secs(u64::from(seconds)) + Duration::from_secs(20);
    StreamResult::parse(&capture(&argv, timeout).await?)
}

async fn rr_run(
    bench: &str,
    path: &NetPath,
    seconds: f64,
    connect_timeout: Duration,
) -> Result<RrResult> {
    let argv = path.client.command(&rr_client_command(
        bench,
        path.server,
        seconds,
        connect_timeout,
    ));
    let timeout = Duration::from_secs_f64(seconds) + connect_timeout + Duration::from_secs(15);
    let out = capture(&argv, timeout).await?;
    serde_json::from_str(out.trim()).with_context(|| format!("parsing the RR client's {out:?}"))
}

fn rr_client_command(
    bench: &str,
    server: Ipv4Addr,
    seconds: f64,
    connect_timeout: Duration,
) -> Vec<String> {
    vec![
        bench.into(),
        rr::HELPER_ARG.into(),
        "client".into(),
        "--connect".into(),
        format!("{server}:{RR_PORT}"),
        "--seconds".into(),
        format!("{seconds}"),
        "--max-samples".into(),
        RR_SAMPLES_PER_RUN.to_string(),
        "--connect-timeout-secs".into(),
        format!("{}", connect_timeout.as_secs_f64()),
    ]
}

/// One series from every run of (`imp`, `p`, `t`).
fn build_series(imp: Impl, p: Placement, t: Test, a: &Acc) -> Result<Series> {
    let name = imp.series();
    match t {
        Test::Stream => {
            let samples: Vec<Duration> = a
                .streams
                .iter()
                .flat_map(|s| &s.intervals)
                .filter(|i| i.bytes > 0 && i.seconds > 0.0)
                .map(|i| Duration::from_secs_f64(i.seconds * 1e9 / i.bytes as f64))
                .collect();
            let bytes: u64 = a.streams.iter().map(|s| s.received_bytes).sum();
            let secs: f64 = a.streams.iter().map(|s| s.received_seconds).sum();
            let wall = Duration::from_secs_f64(secs);
            let measures = format!(
                "TCP stream, {}: one iperf3 interval's time per GB (10^9 bytes) at its rate; \
                 `per s` = Mbit/s received",
                p.label()
            );
            Ok(
                Series::new(name, imp.role(), &measures, &samples, Some(wall))?
                    .with_throughput((bytes as f64 * 8.0 / 1e6).round() as usize, wall),
            )
        }
        Test::Rr => {
            let samples: Vec<Duration> = a
                .rrs
                .iter()
                .flat_map(|r| &r.samples_ns)
                .map(|&ns| Duration::from_nanos(ns))
                .collect();
            let transactions: usize = a.rrs.iter().map(|r| r.transactions).sum();
            let wall = Duration::from_secs_f64(a.rrs.iter().map(|r| r.seconds).sum());
            let measures = format!(
                "TCP RR (1-byte request, 1-byte response, one connection), {}: one \
                 transaction's round-trip time at the client; `per s` = transactions/s",
                p.label()
            );
            Ok(
                Series::new(name, imp.role(), &measures, &samples, Some(wall))?
                    .with_throughput(transactions, wall),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iperf::Interval;

    #[test]
    fn client_commands_enter_the_right_place() {
        let argv = vec!["iperf3".to_string(), "-c".into(), "10.0.0.1".into()];
        let ns = ClientAt::Netns("skiff-bench-pod-net-1-x".into()).command(&argv);
        assert_eq!(
            ns.join(" "),
            "nsenter --net=/run/netns/skiff-bench-pod-net-1-x iperf3 -c 10.0.0.1"
        );
        let pod = ClientAt::Pod {
            cgroup_procs: "/cg/pod-u/main/cgroup.procs".into(),
            netns: "/proc/42/ns/net".into(),
        }
        .command(&argv);
        assert_eq!(pod[..2], ["sh", "-c"]);
        assert_eq!(
            pod[3..],
            [
                "sh",
                "/cg/pod-u/main/cgroup.procs",
                "/proc/42/ns/net",
                "iperf3",
                "-c",
                "10.0.0.1"
            ]
        );
        // The script joins the cgroup before it execs into the namespace and the client.
        let script = &pod[2];
        assert!(script.find(r#"echo $$ > "$1""#).unwrap() < script.find("exec nsenter").unwrap());
        assert!(script.ends_with(r#""$@""#));
    }

    #[test]
    fn rotation_gives_each_implementation_each_position() {
        assert_eq!(rotated(0), [Impl::Skiff, Impl::Bridge, Impl::Plain]);
        assert_eq!(rotated(1), [Impl::Bridge, Impl::Plain, Impl::Skiff]);
        assert_eq!(rotated(2), [Impl::Plain, Impl::Skiff, Impl::Bridge]);
        assert_eq!(rotated(3), rotated(0));
    }

    #[test]
    fn groups_and_rr_command() {
        assert_eq!(group(Placement::Same, Test::Stream), "same node · stream");
        assert_eq!(group(Placement::Cross, Test::Rr), "cross node · RR");
        let c = rr_client_command(
            "/b",
            Ipv4Addr::new(10, 0, 0, 9),
            2.0,
            Duration::from_secs(5),
        );
        assert_eq!(
            c.join(" "),
            "/b __rr client --connect 10.0.0.9:5300 --seconds 2 --max-samples 300 \
             --connect-timeout-secs 5"
        );
    }

    fn stream(bytes_per_interval: &[u64]) -> StreamResult {
        StreamResult {
            intervals: bytes_per_interval
                .iter()
                .map(|&bytes| Interval {
                    seconds: 0.5,
                    bytes,
                })
                .collect(),
            received_bytes: bytes_per_interval.iter().sum(),
            received_seconds: 0.5 * bytes_per_interval.len() as f64,
            retransmits: 0,
            cpu_client_percent: 0.0,
            cpu_server_percent: 0.0,
            congestion: "cubic".into(),
        }
    }

    #[test]
    fn stream_series_time_per_gb_and_mbit_per_s() {
        // 1.25 GB in 0.5 s = 20 Gbit/s → 0.4 s per GB; 0.25 GB in 0.5 s → 2 s per GB.
        let a = Acc {
            streams: vec![
                stream(&[1_250_000_000, 250_000_000]),
                stream(&[0, 1_250_000_000]),
            ],
            ..Acc::default()
        };
        let s = build_series(Impl::Bridge, Placement::Same, Test::Stream, &a).unwrap();
        assert_eq!(s.role, Role::Baseline);
        assert_eq!(s.samples_ms.len(), 3, "the empty interval is no sample");
        assert!((s.samples_ms[0] - 400.0).abs() < 1e-6, "{:?}", s.samples_ms);
        assert!((s.samples_ms[1] - 2000.0).abs() < 1e-6);
        // 2.75 GB over 2 s = 11 Gbit/s = 11000 Mbit/s.
        let mbit = s.throughput_per_s.unwrap();
        assert!((mbit - 11_000.0).abs() < 1.0, "{mbit}");
        assert_eq!(s.wall_ms, Some(2000.0));
    }

    #[test]
    fn rr_series_keeps_samples_and_rate() {
        let rtts: Vec<u64> = (1..=10).map(|i| i * 10_000).collect();
        let a = Acc {
            rrs: vec![
                RrResult::of(&rtts, 1.0, 5).unwrap(),
                RrResult::of(&rtts, 1.0, 5).unwrap(),
            ],
            ..Acc::default()
        };
        let s = build_series(Impl::Skiff, Placement::Cross, Test::Rr, &a).unwrap();
        assert_eq!(s.role, Role::Skiff);
        assert_eq!(s.samples_ms.len(), 10);
        assert_eq!(s.samples_ms[0], 0.01);
        assert_eq!(s.throughput_per_s, Some(10.0));
        assert!(build_series(Impl::Skiff, Placement::Cross, Test::Rr, &Acc::default()).is_err());
    }

    #[test]
    fn bench_pods() {
        let p = pod(
            "s",
            "node-a",
            &[("iperf3", iperf::server_command()), ("rr", sleep())],
        )
        .unwrap();
        let spec = p.spec.unwrap();
        assert_eq!(spec.node_name, "node-a");
        assert_eq!(spec.containers.len(), 2);
        assert_eq!(spec.containers[0].command, iperf::server_command());
        assert_eq!(spec.containers[1].image, "host");
    }

    #[test]
    fn missing_tools_are_named() {
        let err = require_tools(&["sh", "skiff-no-such-tool"]).unwrap_err();
        assert!(err.to_string().contains("skiff-no-such-tool"), "{err}");
        require_tools(&["sh"]).unwrap();
    }
}
