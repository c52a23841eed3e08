//! `scheduler`: scheduler throughput, as pods bound per second from the first create to the
//! last binding seen through a watch, against a trivial binder on the same cluster.
//!
//! One comparison group per node count (default 1,000 and 5,000; `--nodes 1000,5000`), each on
//! a fresh API server (release binary; embedded store, or etcd with `--etcd`) with N hollow
//! nodes (Node objects, Ready, no agent: `skiff_testkit::hollow`), and per round:
//!
//! - **baseline**: a round-robin binder in the bench process (its own client connection, the
//!   same `pods/binding` call and as many bindings in flight as the scheduler), with no
//!   filtering or scoring: the rate the API server can bind at, the ceiling for a scheduler;
//! - **skiff**: the real `skiff-scheduler` process (release), started for the round and
//!   killed after it, so it never runs while the baseline does.
//!
//! Each round warms up with one pod (which also proves the binder is up), then creates P pods
//! with resource requests, `CREATE_CONCURRENCY` creates in flight, and waits until one pod
//! watch (opened before the first create) has seen every pod bound. Then the pods are deleted
//! and the bench waits until the watch has seen them go. Rounds alternate baseline and Skiff;
//! each series reports its median round (by throughput). Every process the suite starts is a
//! guard that kills and reaps it by pid when dropped, on success, error or interruption.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use skiff_api::Resource;
use skiff_api::api::{Node as ApiNode, Pod};
use skiff_client::reflector::{Event, reflector};
use skiff_client::{Api, Client, DeleteParams, ListParams};
use skiff_testkit::hollow::{HOLLOW_LABEL, HollowNodes};
use skiff_tests::{ApiServer, Backend, EtcdServer};
use tracing::{info, warn};

use super::Options;
use crate::host;
use crate::pods::{PodWatch, delete_all};
use crate::report::{Measured, Role, Series, SuiteReport, fmt_ms};
use crate::stats::Summary;

pub const NAME: &str = "scheduler";
pub const TITLE: &str = "scheduler throughput";

const NAMESPACE: &str = "default";
/// On every pod of the suite run (value: the run id); the baseline binder selects on it.
const RUN_LABEL: &str = "skiff-perf-run";
/// On every pod of one batch (value: the batch id); the measuring watch selects on it.
const BATCH_LABEL: &str = "skiff-perf-batch";
/// Hollow node counts, one comparison group each.
const DEFAULT_NODES: &[usize] = &[1000, 5000];
const QUICK_NODES: &[usize] = &[100];
const DEFAULT_PODS: usize = 3000;
const QUICK_PODS: usize = 300;
const DEFAULT_RUNS: usize = 3;
const QUICK_RUNS: usize = 1;
/// Pod creates in flight at once.
const CREATE_CONCURRENCY: usize = 64;
/// Bindings in flight at once: the scheduler's `--bind-concurrency` (its default) and the
/// baseline binder's.
const BIND_CONCURRENCY: usize = 64;
const CPU_REQUEST: &str = "100m";
const MEMORY_REQUEST: &str = "128Mi";

const DELETE_TIMEOUT: Duration = Duration::from_secs(120);

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// Generous bound for `pods` pods to be created and bound.
fn bound_timeout(pods: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(50) * pods as u32
}

/// Who binds the pods of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Binder {
    Baseline,
    Skiff,
}

impl Binder {
    fn series(self) -> &'static str {
        match self {
            Binder::Baseline => "baseline round-robin binder",
            Binder::Skiff => "skiff-scheduler",
        }
    }

    /// In pod names.
    fn short(self) -> &'static str {
        match self {
            Binder::Baseline => "base",
            Binder::Skiff => "skiff",
        }
    }
}

/// What one round measured.
#[derive(Debug, Clone)]
struct Round {
    /// Create call (just before it) → the watch shows the pod bound, per pod, in create order.
    samples: Vec<Duration>,
    /// First create → last binding seen.
    wall: Duration,
    /// First create → last create call returned.
    create_wall: Duration,
    /// Pods per node over every hollow node: (max, min), and how many nodes got any.
    max_per_node: usize,
    min_per_node: usize,
    nodes_used: usize,
    /// Lists of the measuring watch (more than 1: it had to relist).
    watch_lists: usize,
}

impl Round {
    fn throughput(&self) -> f64 {
        self.samples.len() as f64 / self.wall.as_secs_f64().max(f64::EPSILON)
    }

    /// The round's numbers (rounded: they are for reading, the samples are in the series).
    fn json(&self, binder: Binder, run: usize) -> serde_json::Value {
        let s = Summary::of(&self.samples);
        let ms = |d: Duration| (d.as_secs_f64() * 1e5).round() / 100.0;
        let round2 = |v: f64| (v * 100.0).round() / 100.0;
        json!({
            "series": binder.series(),
            "run": run,
            "pods_per_s": self.throughput().round(),
            "wall_ms": ms(self.wall),
            "create_wall_ms": ms(self.create_wall),
            "p50_ms": s.map(|s| round2(s.p50)),
            "p99_ms": s.map(|s| round2(s.p99)),
            "max_pods_per_node": self.max_per_node,
            "min_pods_per_node": self.min_per_node,
            "nodes_used": self.nodes_used,
            "watch_lists": self.watch_lists,
        })
    }
}

/// The cluster every round runs on.
struct SchedulerCluster {
    endpoint: String,
    /// The administrator's client configuration (the baseline binder's).
    config: skiff_client::ClientConfig,
    /// The kubeconfig the API server wrote for the scheduler.
    scheduler_kubeconfig: PathBuf,
    bin_dir: PathBuf,
    logs: tempfile::TempDir,
    pods: Api<Pod>,
    nodes: Vec<String>,
    run_id: String,
}

fn bound(p: &Pod) -> bool {
    p.spec.as_ref().is_some_and(|s| !s.node_name.is_empty())
}

fn node_of(p: &Pod) -> &str {
    p.spec.as_ref().map(|s| s.node_name.as_str()).unwrap_or("")
}

/// An unbound pod with resource requests, labelled with the run and the batch.
fn bench_pod(name: &str, run_id: &str, batch: &str) -> Result<Pod> {
    skiff_api::manifest::decode(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {RUN_LABEL: run_id, BATCH_LABEL: batch}},
        "spec": {
            "containers": [{
                "name": "main", "image": "host", "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": CPU_REQUEST, "memory": MEMORY_REQUEST}},
            }],
        },
    }))
    .context("building the benchmark pod")
}

/// Fails unless the pods fit: 110 pods and 4 CPUs (default hollow node shape) per node.
fn check_sizes(nodes: usize, pods: usize) -> Result<()> {
    if nodes == 0 || pods == 0 {
        bail!("--nodes and --pods must be at least 1");
    }
    let max_pods = nodes * 110;
    let max_cpu = nodes * 4000 / 100; // 100m each
    if pods + 1 > max_pods.min(max_cpu) {
        bail!(
            "--pods {pods} do not fit on {nodes} hollow nodes (at most {} with the warm-up pod)",
            max_pods.min(max_cpu) - 1
        );
    }
    Ok(())
}

/// Pods per node over `nodes` (every hollow node, also those that got none): (max, min,
/// nodes used). Fails if a pod is bound to something else.
fn spread(pods: &[Pod], nodes: &[String]) -> Result<(usize, usize, usize)> {
    let mut per: HashMap<&str, usize> = nodes.iter().map(|n| (n.as_str(), 0)).collect();
    for p in pods {
        match per.get_mut(node_of(p)) {
            Some(c) => *c += 1,
            None => bail!(
                "pod {} bound to {:?}, not a hollow node",
                p.name(),
                node_of(p)
            ),
        }
    }
    let max = per.values().copied().max().unwrap_or(0);
    let min = per.values().copied().min().unwrap_or(0);
    let used = per.values().filter(|c| **c > 0).count();
    Ok((max, min, used))
}

/// The node counts to measure: `--nodes` (each must be at least 1) or the default list.
fn node_counts(opts: &Options) -> Vec<usize> {
    if !opts.nodes.is_empty() {
        opts.nodes.clone()
    } else if opts.quick {
        QUICK_NODES.to_vec()
    } else {
        DEFAULT_NODES.to_vec()
    }
}

/// The comparison group of one node count.
fn group(n_nodes: usize) -> String {
    format!("{n_nodes} nodes")
}

/// What one node count contributes to the report.
struct NodesResult {
    series: Vec<Series>,
    notes: Vec<String>,
    rounds: Vec<serde_json::Value>,
    ready: usize,
    register_wall: Duration,
    shape: serde_json::Value,
}

async fn measure(opts: &Options) -> Result<SuiteReport> {
    let bin_dir = host::check_binaries(&["skiff-apiserver", "skiff-scheduler"])?;
    let counts = node_counts(opts);
    let n_pods = opts
        .pods
        .unwrap_or(if opts.quick { QUICK_PODS } else { DEFAULT_PODS });
    let runs = opts
        .runs
        .unwrap_or(if opts.quick { QUICK_RUNS } else { DEFAULT_RUNS });
    for &n in &counts {
        check_sizes(n, n_pods)?;
    }
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let started_at = chrono::Utc::now();
    let mut env = host::environment();
    let store = if opts.etcd {
        "etcd"
    } else {
        "embedded redb store"
    };

    let mut series = Vec::new();
    let mut notes = Vec::new();
    let mut rounds = Vec::new();
    let mut ready = serde_json::Map::new();
    let mut shape = serde_json::Value::Null;
    for &n_nodes in &counts {
        let r = measure_nodes(opts, &bin_dir, &mut env, n_nodes, n_pods, runs)
            .await
            .with_context(|| group(n_nodes))?;
        series.extend(r.series);
        notes.push(format!(
            "{}: a fresh API server with {n_nodes} hollow nodes (all {} Ready; registered in \
             {:.2} s).",
            group(n_nodes),
            r.ready,
            r.register_wall.as_secs_f64()
        ));
        notes.extend(
            r.notes
                .into_iter()
                .map(|n| format!("{}: {n}", group(n_nodes))),
        );
        rounds.extend(r.rounds);
        ready.insert(group(n_nodes), json!(format!("{}/{n_nodes}", r.ready)));
        shape = r.shape;
    }

    let params = BTreeMap::from([
        ("nodes".to_string(), json!(counts)),
        ("pods".to_string(), json!(n_pods)),
        ("runs".to_string(), json!(runs)),
        ("create_concurrency".to_string(), json!(CREATE_CONCURRENCY)),
        ("bind_concurrency".to_string(), json!(BIND_CONCURRENCY)),
        (
            "pod_requests".to_string(),
            json!({"cpu": CPU_REQUEST, "memory": MEMORY_REQUEST}),
        ),
        ("node_shape".to_string(), shape),
        ("hollow_nodes_ready".to_string(), json!(ready)),
        (
            "cluster".to_string(),
            json!(format!(
                "skiff-apiserver ({store}) on loopback + N hollow nodes (no agents), a fresh \
                 API server per node count"
            )),
        ),
    ]);
    let mut all_notes = vec![
        format!(
            "All series ran in this one run on this machine. Each node count ({}) is a \
             comparison group of its own, on its own API server: rounds alternate baseline, \
             then skiff-scheduler, {runs} time(s); each series shows its median round by \
             throughput (every round is listed below and in the JSON's details.rounds).",
            counts
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        format!(
            "Each round: one warm-up pod bound (unmeasured; it also shows the binder is up), \
             then {n_pods} unbound pods (one container, requests cpu {CPU_REQUEST} / memory \
             {MEMORY_REQUEST}) created with {CREATE_CONCURRENCY} creates in flight, then all \
             deleted (grace 0) and seen gone before the next round. The scheduler process is \
             started for its rounds only and killed after them; the baseline binder runs only \
             in its rounds."
        ),
        "Per-pod latency includes waiting behind the other pods of the batch: all are \
         created at once, so it grows with the pod count. Percentiles are nearest-rank."
            .into(),
    ];
    all_notes.extend(notes);
    all_notes.push(
        "The bench (creates, watch, baseline binder), the API server and the scheduler share \
         this machine's CPUs: while the pods are being created, scheduling competes with \
         creating for CPU."
            .into(),
    );
    Ok(SuiteReport::new(
        NAME,
        TITLE,
        started_at,
        env,
        Measured {
            quick: opts.quick,
            params,
            series,
            notes: all_notes,
            details: BTreeMap::from([("rounds".to_string(), json!(rounds))]),
        },
    ))
}

/// The rounds on one API server with `n_nodes` hollow nodes.
async fn measure_nodes(
    opts: &Options,
    bin_dir: &std::path::Path,
    env: &mut crate::report::Environment,
    n_nodes: usize,
    n_pods: usize,
    runs: usize,
) -> Result<NodesResult> {
    let run_id = skiff_tests::unique();
    info!(
        suite = NAME,
        nodes = n_nodes,
        pods = n_pods,
        runs,
        etcd = opts.etcd,
        "starting the API server"
    );
    let etcd = if opts.etcd {
        Some(EtcdServer::start().map_err(|e| anyhow::anyhow!("starting etcd: {}", e.0))?)
    } else {
        None
    };
    let backend = match &etcd {
        Some(e) => Backend::Etcd(e.endpoint.clone()),
        None => Backend::Embedded,
    };
    let server = ApiServer::start(backend);
    let listen = server.addr.to_string();
    let apiserver_exe = host::verify_process("skiff-apiserver", &["--listen", &listen], bin_dir)?;
    env.binaries.insert(
        "skiff-apiserver".into(),
        apiserver_exe.display().to_string(),
    );
    let client = Client::connect_with(&server.client_config())
        .await
        .context("connecting to the API server")?;

    info!(nodes = n_nodes, "registering hollow nodes");
    let hollow = HollowNodes::new(n_nodes);
    let t_register = Instant::now();
    let nodes = hollow
        .register(&client)
        .await
        .context("registering hollow nodes")?;
    let register_wall = t_register.elapsed();
    let ready = ready_hollow_nodes(&client).await?;
    if ready != n_nodes {
        bail!("{ready} of {n_nodes} hollow nodes are Ready");
    }

    let cluster = SchedulerCluster {
        endpoint: server.endpoint.clone(),
        config: server.client_config(),
        scheduler_kubeconfig: server.component_kubeconfig("scheduler"),
        bin_dir: bin_dir.to_path_buf(),
        logs: tempfile::Builder::new()
            .prefix("skiff-perf-scheduler-")
            .tempdir()
            .context("creating a directory for the scheduler's logs")?,
        pods: client.namespaced::<Pod>(NAMESPACE),
        nodes,
        run_id,
    };
    let mut rounds: BTreeMap<Binder, Vec<Round>> = BTreeMap::new();
    let mut scheduler_exe = None;
    for r in 0..runs {
        for binder in [Binder::Baseline, Binder::Skiff] {
            info!(
                series = binder.series(),
                nodes = n_nodes,
                run = r + 1,
                pods = n_pods,
                "round"
            );
            let (round, exe) = run_round(&cluster, binder, r, n_pods)
                .await
                .with_context(|| format!("{}, run {}", binder.series(), r + 1))?;
            info!(
                series = binder.series(),
                run = r + 1,
                pods_per_s = format!("{:.0}", round.throughput()),
                wall_s = format!("{:.2}", round.wall.as_secs_f64()),
                max_per_node = round.max_per_node,
                min_per_node = round.min_per_node,
                "round done"
            );
            scheduler_exe = scheduler_exe.or(exe);
            rounds.entry(binder).or_default().push(round);
        }
    }
    if let Some(exe) = scheduler_exe {
        env.binaries
            .insert("skiff-scheduler".into(), exe.display().to_string());
    }

    info!("tearing down");
    drop(cluster);
    drop(server);
    drop(etcd);

    let mut series = Vec::new();
    let mut per_run = Vec::new();
    for (binder, list) in &rounds {
        for (i, r) in list.iter().enumerate() {
            let mut j = r.json(*binder, i + 1);
            j["nodes"] = json!(n_nodes);
            per_run.push(j);
        }
        let median = median_round(list).context("no rounds")?;
        let (role, measures) = match binder {
            Binder::Skiff => (
                Role::Skiff,
                "pod create call (client side, just before it) → the first event of one pod \
                 watch (opened before the first create) showing spec.nodeName set by the \
                 skiff-scheduler process; wall time and pods/s from the first create to the \
                 last binding seen",
            ),
            Binder::Baseline => (
                Role::Baseline,
                "the same, with pods bound by a round-robin binder in the bench process \
                 (reflector on the pods, `pods/binding` to node i mod N, as many bindings in \
                 flight as the scheduler, no filtering or scoring): the API server's ceiling",
            ),
        };
        series.push(
            Series::new(
                binder.series(),
                role,
                measures,
                &median.samples,
                Some(median.wall),
            )?
            .with_throughput(median.samples.len(), median.wall)
            .in_group(group(n_nodes)),
        );
    }
    // Skiff first, as in the other suites.
    series.sort_by_key(|s| s.role != Role::Skiff);

    let skiff = rounds.get(&Binder::Skiff).and_then(|l| median_round(l));
    let base = rounds.get(&Binder::Baseline).and_then(|l| median_round(l));
    let mut notes = Vec::new();
    for (name, r) in [("skiff-scheduler", &skiff), ("baseline", &base)] {
        if let Some(r) = r {
            notes.push(format!(
                "{name} (median round): pods per node max {} / min {} over {n_nodes} nodes, \
                 {} nodes used; the creates alone took {:.2} s of the {:.2} s wall time.",
                r.max_per_node,
                r.min_per_node,
                r.nodes_used,
                r.create_wall.as_secs_f64(),
                r.wall.as_secs_f64()
            ));
        }
    }
    for run in 0..runs {
        let line: Vec<String> = rounds
            .iter()
            .filter_map(|(binder, list)| Some((binder, list.get(run)?)))
            .map(|(binder, r)| {
                let s = Summary::of(&r.samples);
                format!(
                    "{} {:.0} pods/s (p50 {} ms, p99 {} ms, pods per node {}–{})",
                    binder.series(),
                    r.throughput(),
                    s.map_or_else(|| "–".into(), |s| fmt_ms(s.p50)),
                    s.map_or_else(|| "–".into(), |s| fmt_ms(s.p99)),
                    r.min_per_node,
                    r.max_per_node
                )
            })
            .collect();
        notes.push(format!("Round {}: {}.", run + 1, line.join("; ")));
    }
    if rounds.values().flatten().any(|r| r.watch_lists > 1) {
        notes.push(
            "A measuring watch had to relist in some round: bindings seen at a relist are \
             timestamped late."
                .into(),
        );
    }
    Ok(NodesResult {
        series,
        notes,
        rounds: per_run,
        ready,
        register_wall,
        shape: json!({"cpu": hollow.shape.cpu, "memory": hollow.shape.memory, "pods": hollow.shape.pods, "zones": hollow.zones}),
    })
}

/// The round with the median throughput (the lower middle one of an even count).
fn median_round(rounds: &[Round]) -> Option<&Round> {
    crate::stats::median_by(rounds, Round::throughput)
}

/// Hollow nodes with `Ready=True`.
async fn ready_hollow_nodes(client: &Client) -> Result<usize> {
    let nodes = client
        .cluster::<ApiNode>()
        .list(&ListParams::default().labels(&format!("{HOLLOW_LABEL}=true")))
        .await
        .context("listing the hollow nodes")?;
    Ok(nodes
        .items
        .iter()
        .filter(|n| {
            n.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.r#type == "Ready" && c.status == "True")
            })
        })
        .count())
}

/// What binds pods during a round; stopped (the process killed and reaped, the tasks
/// aborted) when dropped.
enum Running {
    Scheduler(SchedulerProcess),
    Baseline(RoundRobinBinder),
}

/// One round: start the binder, warm up, measure, stop the binder. Returns the scheduler's
/// executable for the report in Skiff rounds.
async fn run_round(
    c: &SchedulerCluster,
    binder: Binder,
    run: usize,
    n_pods: usize,
) -> Result<(Round, Option<PathBuf>)> {
    let batch = format!("{}-{}-{run}", c.run_id, binder.short());
    let mut exe = None;
    let running = match binder {
        Binder::Baseline => {
            no_scheduler_running(&c.endpoint)?;
            Running::Baseline(
                RoundRobinBinder::start(
                    &c.config,
                    &format!("{RUN_LABEL}={}", c.run_id),
                    c.nodes.clone(),
                    BIND_CONCURRENCY,
                )
                .await?,
            )
        }
        Binder::Skiff => {
            let p = SchedulerProcess::start(c, &batch)?;
            exe = Some(p.exe.clone());
            Running::Scheduler(p)
        }
    };
    let with_log = |e: anyhow::Error| match &running {
        Running::Scheduler(p) => e.context(format!(
            "skiff-scheduler log (last 30 lines):\n{}",
            p.log_tail(30)
        )),
        Running::Baseline(b) => e.context(format!(
            "baseline binder: {} bindings made, {} failed",
            b.bound.load(Ordering::Relaxed),
            b.failed.load(Ordering::Relaxed)
        )),
    };
    bind_batch(c, &format!("{batch}-warmup"), 1)
        .await
        .context("warm-up pod")
        .map_err(with_log)?;
    let round = bind_batch(c, &batch, n_pods).await.map_err(with_log)?;
    drop(running);
    Ok((round, exe))
}

/// Creates `count` pods of batch `batch`, waits until all are seen bound, deletes them and
/// waits until they are seen gone.
async fn bind_batch(c: &SchedulerCluster, batch: &str, count: usize) -> Result<Round> {
    let watch = PodWatch::start(c.pods.clone(), &format!("{BATCH_LABEL}={batch}"), bound).await?;
    let objects: Vec<(String, Pod)> = (0..count)
        .map(|i| {
            let name = format!("{batch}-{i}");
            let pod = bench_pod(&name, &c.run_id, batch)?;
            Ok((name, pod))
        })
        .collect::<Result<_>>()?;
    let names: Vec<String> = objects.iter().map(|(n, _)| n.clone()).collect();
    let timeout = bound_timeout(count);
    let deadline = Instant::now() + timeout;
    let t0 = Instant::now();
    let mut creates: Vec<(String, Instant)> = futures::stream::iter(objects)
        .map(|(name, pod)| {
            let pods = c.pods.clone();
            async move {
                let at = Instant::now();
                pods.create(&pod)
                    .await
                    .with_context(|| format!("creating pod {name}"))?;
                Ok::<_, anyhow::Error>((name, at))
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect()
        .await?;
    let create_wall = t0.elapsed();
    watch
        .wait(deadline, |s| s.reached.len() >= count)
        .await
        .with_context(|| {
            let seen = watch.reached_all().len();
            format!("only {seen} of {count} pods seen bound within {timeout:?}")
        })?;
    let reached = watch.reached_all();
    creates.sort_by_key(|(_, at)| *at);
    let first = creates.first().map(|(_, at)| *at).unwrap_or(t0);
    let mut samples = Vec::with_capacity(count);
    let mut last = first;
    for (name, at) in &creates {
        let Some(b) = reached.get(name) else {
            bail!("pod {name} not seen bound");
        };
        samples.push(b.saturating_duration_since(*at));
        last = last.max(*b);
    }
    let listed = c
        .pods
        .list(&ListParams::default().labels(&format!("{BATCH_LABEL}={batch}")))
        .await
        .context("listing the batch's pods")?;
    if listed.items.len() != count || !listed.items.iter().all(bound) {
        bail!(
            "expected {count} bound pods, the server has {} ({} bound)",
            listed.items.len(),
            listed.items.iter().filter(|p| bound(p)).count()
        );
    }
    let (max_per_node, min_per_node, nodes_used) = spread(&listed.items, &c.nodes)?;

    let zero = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    delete_all(&c.pods, &names, &zero, CREATE_CONCURRENCY).await?;
    watch.wait_deleted(&names, DELETE_TIMEOUT).await?;
    Ok(Round {
        samples,
        wall: last.saturating_duration_since(first),
        create_wall,
        max_per_node,
        min_per_node,
        nodes_used,
        watch_lists: watch.lists(),
    })
}

/// Fails if a `skiff-scheduler` process talks to this API server (the baseline must run
/// alone).
fn no_scheduler_running(endpoint: &str) -> Result<()> {
    let running: Vec<u32> = host::processes_with_args(&["--server", endpoint])
        .into_iter()
        .filter(|(_, exe)| exe.file_name().is_some_and(|n| n == "skiff-scheduler"))
        .map(|(pid, _)| pid)
        .collect();
    if !running.is_empty() {
        bail!("skiff-scheduler still runs (pids {running:?}) before a baseline round");
    }
    Ok(())
}

/// A `skiff-scheduler` process (release binary next to the bench), killed and reaped by pid
/// when dropped.
struct SchedulerProcess {
    child: Child,
    log: PathBuf,
    exe: PathBuf,
}

impl SchedulerProcess {
    fn start(c: &SchedulerCluster, batch: &str) -> Result<SchedulerProcess> {
        let identity = format!("skiff-perf-{batch}");
        let log = c.logs.path().join(format!("{identity}.log"));
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let bin = c.bin_dir.join("skiff-scheduler");
        let child = Command::new(&bin)
            .args(["--server", &c.endpoint, "--leader-elect=false"])
            .arg("--kubeconfig")
            .arg(&c.scheduler_kubeconfig)
            .args(["--bind-concurrency", &BIND_CONCURRENCY.to_string()])
            .args(["--identity", &identity])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut p = SchedulerProcess {
            child,
            log,
            exe: bin,
        };
        p.exe = host::verify_process(
            "skiff-scheduler",
            &["--server", &c.endpoint, "--identity", &identity],
            &c.bin_dir,
        )?;
        Ok(p)
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for SchedulerProcess {
    fn drop(&mut self) {
        let pid = self.child.id();
        if let Err(e) = self.child.kill() {
            warn!(pid, error = %e, "killing skiff-scheduler");
        }
        if let Err(e) = self.child.wait() {
            warn!(pid, error = %e, "reaping skiff-scheduler");
        }
    }
}

/// The baseline: binds every unbound pod it sees to the next node in turn, with `concurrency`
/// `pods/binding` calls in flight; no filtering, no scoring. Stops when dropped.
struct RoundRobinBinder {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    bound: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
}

impl RoundRobinBinder {
    async fn start(
        config: &skiff_client::ClientConfig,
        label_selector: &str,
        nodes: Vec<String>,
        concurrency: usize,
    ) -> Result<RoundRobinBinder> {
        if nodes.is_empty() {
            bail!("no nodes to bind to");
        }
        // Its own connection, as the scheduler process has.
        let client = Client::connect_with(config)
            .await
            .context("connecting the baseline binder")?;
        let pods = client.namespaced::<Pod>(NAMESPACE);
        let (tx, rx) = futures::channel::mpsc::unbounded::<String>();
        let lp = ListParams::default().labels(label_selector);
        let watcher = tokio::spawn({
            let pods = pods.clone();
            async move {
                let mut queued = HashSet::new();
                let mut events = std::pin::pin!(reflector(pods, lp));
                while let Some(ev) = events.next().await {
                    let items = match ev {
                        Event::Restarted(items) => items,
                        Event::Applied(p) => vec![p],
                        Event::Deleted(p) => {
                            queued.remove(p.name());
                            continue;
                        }
                    };
                    for p in items {
                        if !bound(&p)
                            && queued.insert(p.name().to_string())
                            && tx.unbounded_send(p.name().to_string()).is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
        let bound_count = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let binder = tokio::spawn({
            let (bound_count, failed) = (bound_count.clone(), failed.clone());
            async move {
                let next = AtomicUsize::new(0);
                rx.map(|name| {
                    let node = nodes[next.fetch_add(1, Ordering::Relaxed) % nodes.len()].clone();
                    let (pods, bound_count, failed) =
                        (pods.clone(), bound_count.clone(), failed.clone());
                    async move {
                        match pods.bind(&name, &node).await {
                            Ok(_) => {
                                bound_count.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                warn!(pod = %name, %node, error = %e, "baseline binding failed");
                            }
                        }
                    }
                })
                .buffer_unordered(concurrency)
                .for_each(|()| async {})
                .await;
            }
        });
        Ok(RoundRobinBinder {
            tasks: vec![watcher, binder],
            bound: bound_count,
            failed,
        })
    }
}

impl Drop for RoundRobinBinder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::PodSpec;

    fn on(node: &str) -> Pod {
        Pod {
            spec: Some(PodSpec {
                node_name: node.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn bench_pod_is_unbound_with_requests_and_labels() {
        let p = bench_pod("b-1", "run", "b").unwrap();
        let spec = p.spec.as_ref().unwrap();
        assert!(spec.node_name.is_empty());
        assert!(!bound(&p));
        let req = &spec.containers[0].resources.as_ref().unwrap().requests;
        assert_eq!(req["cpu"], CPU_REQUEST);
        assert_eq!(req["memory"], MEMORY_REQUEST);
        let labels = &p.metadata.as_ref().unwrap().labels;
        assert_eq!(
            (labels[RUN_LABEL].as_str(), labels[BATCH_LABEL].as_str()),
            ("run", "b")
        );
        assert!(bound(&on("n")));
    }

    #[test]
    fn spread_counts_every_node() {
        let nodes: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let pods = vec![on("a"), on("a"), on("b")];
        assert_eq!(spread(&pods, &nodes).unwrap(), (2, 0, 2));
        assert!(spread(&[on("elsewhere")], &nodes).is_err());
    }

    #[test]
    fn node_counts_default_quick_and_given() {
        assert_eq!(node_counts(&Options::default()), [1000, 5000]);
        let quick = Options {
            quick: true,
            ..Default::default()
        };
        assert_eq!(node_counts(&quick), [100]);
        let given = Options {
            nodes: vec![10, 20],
            ..quick
        };
        assert_eq!(node_counts(&given), [10, 20]);
        assert_eq!(group(5000), "5000 nodes");
        for n in DEFAULT_NODES {
            assert!(check_sizes(*n, DEFAULT_PODS).is_ok());
        }
    }

    #[test]
    fn sizes_must_fit() {
        assert!(check_sizes(1000, 3000).is_ok());
        assert!(check_sizes(100, 300).is_ok());
        assert!(check_sizes(1, 40).is_err(), "40 x 100m + warm-up > 4 CPUs");
        assert!(check_sizes(0, 1).is_err());
    }

    fn round(pods_per_s: u64) -> Round {
        Round {
            samples: vec![Duration::from_millis(1); pods_per_s as usize],
            wall: Duration::from_secs(1),
            create_wall: Duration::from_secs(1),
            max_per_node: 1,
            min_per_node: 1,
            nodes_used: 1,
            watch_lists: 1,
        }
    }

    #[test]
    fn median_by_throughput() {
        let rounds = vec![round(30), round(10), round(20)];
        assert_eq!(median_round(&rounds).unwrap().samples.len(), 20);
        assert_eq!(median_round(&rounds[..1]).unwrap().samples.len(), 30);
        assert!(median_round(&[]).is_none());
    }
}
