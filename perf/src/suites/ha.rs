//! `ha`: what high availability costs the create path. Three API servers over a 3-member etcd
//! cluster (3×3) against one API server over one etcd member (1×1), in one run.
//!
//! - **1×1**: one real `etcd` (a single member on loopback, its own temporary data directory)
//!   and one `skiff-apiserver --store etcd --etcd-endpoints URL` (TLS; it makes its PKI);
//! - **3×3**: a 3-member etcd cluster on loopback (three `etcd` processes, each its own client
//!   and peer ports and data directory, healthy before use: `skiff_store::testutil::
//!   EtcdCluster`) and three `skiff-apiserver` processes, each over all three members
//!   (`--etcd-endpoints URL0,URL1,URL2`), sharing one `--pki-dir`: the first makes it, the
//!   other two start once its `admin.kubeconfig` exists, each on its own loopback port.
//!
//! Both setups get the same load: [`CREATE_CONCURRENCY`] workers, each with a client (one
//! connection) of its own to one API server (worker w → server w mod n: all on the one server
//! of 1×1, 6/5/5 over the three of 3×3), each creating pods one at a time from a shared list
//! ([`timed_by_workers`]); warm-up creates first, then N creates timed: creates/s over first
//! call start → last response, and per-call latency.
//!
//! The run is `--runs` rounds (3; 1 with `--quick`); each round starts both setups fresh, one
//! after the other, the order alternating between rounds so drifting machine noise hits both
//! alike, and removes every process of a setup (by pid, also on failure) before the next
//! starts. Each setup's round with the median creates/s is reported, every round in the JSON.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::future::LocalBoxFuture;
use serde_json::json;
use skiff_api::api::Pod;
use skiff_client::{Api, Client, ClientConfig, ListParams};
use skiff_tests::{ApiServer, Backend, EtcdCluster};
use tracing::info;

use super::Options;
use super::control_plane::{RUN_LABEL, bench_pod};
use crate::apiload::{CREATE_CONCURRENCY, timed_by_workers};
use crate::report::{Environment, Measured, Role, Series, SuiteReport};
use crate::stats::Summary;
use crate::{host, procfs};

pub const NAME: &str = "ha";
pub const TITLE: &str =
    "3 API servers over a 3-member etcd cluster against 1 API server over 1 etcd member";

const NAMESPACE: &str = "default";
const DEFAULT_CREATES: usize = 2000;
const QUICK_CREATES: usize = 50;
/// Unmeasured creates first: two per worker, so every connection has made calls.
const WARMUP: usize = 2 * CREATE_CONCURRENCY;
const DEFAULT_RUNS: usize = 3;
const QUICK_RUNS: usize = 1;
/// API servers and etcd members of the highly available setup.
const HA_SIZE: usize = 3;
/// How long every API server may take to list every pod created through any of them.
const LIST_DEADLINE: Duration = Duration::from_secs(10);

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// The two setups compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// One API server over one etcd member.
    Single,
    /// [`HA_SIZE`] API servers over an etcd cluster of [`HA_SIZE`] members.
    Replicated,
}

impl Setup {
    /// API servers, and etcd members.
    fn size(self) -> usize {
        match self {
            Setup::Single => 1,
            Setup::Replicated => HA_SIZE,
        }
    }

    /// `1x1`, `3x3`: in object names and the JSON.
    fn tag(self) -> String {
        format!("{0}x{0}", self.size())
    }

    fn series_name(self) -> String {
        match self {
            Setup::Single => "skiff 1×1 (1 API server, 1 etcd member)".into(),
            Setup::Replicated => {
                format!("skiff {HA_SIZE}×{HA_SIZE} ({HA_SIZE} API servers, {HA_SIZE} etcd members)")
            }
        }
    }
}

/// The processes of one setup. Dropping it kills them by pid, the API servers first (fields
/// drop in order), and removes their directories.
struct HaCluster {
    servers: Vec<ApiServer>,
    /// Running until dropped, after the API servers.
    _etcd: EtcdCluster,
    /// Every API server's and etcd member's pid, for their CPU time.
    pids: Vec<u32>,
}

impl HaCluster {
    /// Starts `size` etcd members, healthy, then `size` API servers over all of them: the
    /// first makes the PKI, the others start with it. Checks every API server runs a binary
    /// from `bin_dir`, and records the executables in `env`.
    fn start(size: usize, bin_dir: &Path, env: &mut Environment) -> Result<HaCluster> {
        let etcd = EtcdCluster::start(size)
            .map_err(|e| anyhow!("starting {size} etcd member(s): {}", e.0))?;
        let backend = || Backend::Etcd(etcd.endpoints().join(","));
        let mut servers = vec![ApiServer::start(backend())];
        for _ in 1..size {
            let next = servers[0].start_beside(backend());
            servers.push(next);
        }
        let mut pids = Vec::with_capacity(2 * size);
        for server in &servers {
            let (pid, exe) = host::apiserver_pid(server, bin_dir)?;
            env.binaries.insert("skiff-apiserver".into(), exe);
            pids.push(pid);
        }
        for member in &etcd.members {
            let pid = member.pid().context("an etcd member is not running")?;
            if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
                env.binaries
                    .insert("etcd".into(), exe.display().to_string());
            }
            pids.push(pid);
        }
        Ok(HaCluster {
            servers,
            _etcd: etcd,
            pids,
        })
    }

    /// The administrator's client configuration, for API server `i` alone.
    fn config_for(&self, i: usize) -> Result<ClientConfig> {
        let endpoint = &self.servers.get(i).context("no such API server")?.endpoint;
        let mut config = self.servers[0].client_config();
        config.server.clone_from(endpoint);
        config.servers = vec![endpoint.clone()];
        Ok(config)
    }
}

/// One setup's measurement in one round.
#[derive(Debug, Clone)]
struct HaRun {
    setup: Setup,
    round: usize,
    /// Create call durations, in create order.
    calls: Vec<Duration>,
    /// First create call start → last create call end.
    wall: Duration,
    /// Measured creates each API server served.
    per_server: Vec<usize>,
    /// CPU time of the setup's etcd members and API servers during the measured creates.
    cpu: Duration,
    /// Starting the setup (etcd healthy, every API server listening).
    startup: Duration,
}

impl HaRun {
    fn rate(&self) -> f64 {
        self.calls.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    fn summary(&self) -> Option<Summary> {
        Summary::of(&self.calls)
    }

    fn cpu_ms_per_create(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e3 / self.calls.len().max(1) as f64
    }
}

/// Starts `setup` fresh, runs the warm-up and `creates` measured creates over it, checks every
/// API server lists every pod, and stops it.
async fn measure_setup(
    setup: Setup,
    round: usize,
    creates: usize,
    bin_dir: &Path,
    env: &mut Environment,
) -> Result<HaRun> {
    let size = setup.size();
    info!(
        suite = NAME,
        setup = setup.tag(),
        round = round + 1,
        "starting {size} etcd member(s) and {size} API server(s)"
    );
    let t0 = Instant::now();
    let cluster = HaCluster::start(size, bin_dir, env)?;
    let startup = t0.elapsed();
    let mut workers: Vec<Api<Pod>> = Vec::with_capacity(CREATE_CONCURRENCY);
    for w in 0..CREATE_CONCURRENCY {
        let config = cluster.config_for(w % size)?;
        let client = Client::connect_with(&config)
            .await
            .with_context(|| format!("connecting worker {w} to {}", config.server))?;
        workers.push(client.namespaced(NAMESPACE));
    }
    let run_id = skiff_tests::unique();
    let tag = format!("{}-r{round}", setup.tag());
    let make = |n: usize, prefix: &str| -> Result<Vec<Pod>> {
        (0..n)
            .map(|i| bench_pod(&format!("{tag}-{prefix}-{i}"), &run_id, &tag))
            .collect()
    };
    let workers = &workers;
    let create = |w: usize, pod: Pod| async move {
        workers[w]
            .create(&pod)
            .await
            .map(|_| ())
            .with_context(|| format!("worker {w} creating a pod"))
    };
    timed_by_workers(make(WARMUP, "warm")?, CREATE_CONCURRENCY, create)
        .await
        .context("warm-up creates")?;
    info!(setup = setup.tag(), creates, "measuring creates");
    let cpu0 = procfs::cpu_of(&cluster.pids)?;
    let (times, per_worker) = timed_by_workers(make(creates, "m")?, CREATE_CONCURRENCY, create)
        .await
        .context("measured creates")?;
    let cpu = procfs::cpu_of(&cluster.pids)?.saturating_sub(cpu0);
    let mut per_server = vec![0; size];
    for (w, n) in per_worker.iter().enumerate() {
        per_server[w % size] += n;
    }
    // One store behind every API server: each lists every pod, whichever server created it
    // (worker s, for s < size, is connected to API server s).
    let lp = ListParams::default().labels(&format!("{RUN_LABEL}={run_id}"));
    for (s, api) in workers.iter().enumerate().take(size) {
        let want = WARMUP + creates;
        let deadline = Instant::now() + LIST_DEADLINE;
        loop {
            let got = api
                .list(&lp)
                .await
                .with_context(|| format!("listing the pods through API server {s}"))?
                .items
                .len();
            if got == want {
                break;
            }
            if Instant::now() > deadline {
                bail!("API server {s} lists {got} of the {want} pods created");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(cluster);
    let first = times.first().map(|t| t.0).context("no creates")?;
    let last = times.iter().map(|t| t.1).max().context("no creates")?;
    Ok(HaRun {
        setup,
        round,
        calls: times.iter().map(|(s, e)| *e - *s).collect(),
        wall: last.saturating_duration_since(first),
        per_server,
        cpu,
        startup,
    })
}

async fn measure(opts: &Options) -> Result<SuiteReport> {
    let bin_dir = host::check_binaries(&["skiff-apiserver"])?;
    let creates = opts.pods.unwrap_or(if opts.quick {
        QUICK_CREATES
    } else {
        DEFAULT_CREATES
    });
    if creates == 0 {
        bail!("--pods must be at least 1");
    }
    let runs = opts
        .runs
        .unwrap_or(if opts.quick { QUICK_RUNS } else { DEFAULT_RUNS });
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let started_at = chrono::Utc::now();
    let mut env = host::environment();
    let mut all = Vec::with_capacity(2 * runs);
    for round in 0..runs {
        let order = if round.is_multiple_of(2) {
            [Setup::Single, Setup::Replicated]
        } else {
            [Setup::Replicated, Setup::Single]
        };
        for setup in order {
            let run = measure_setup(setup, round, creates, &bin_dir, &mut env)
                .await
                .with_context(|| format!("{} in round {}", setup.tag(), round + 1))?;
            info!(
                setup = setup.tag(),
                round = round + 1,
                creates_per_s = format!("{:.0}", run.rate()),
                "measured"
            );
            all.push(run);
        }
    }
    report(opts, started_at, env, creates, runs, &all)
}

/// How `workers` workers spread over `servers` servers (worker w → server w mod n), e.g.
/// `6/5/5`.
fn spread(workers: usize, servers: usize) -> String {
    (0..servers)
        .map(|s| {
            (0..workers)
                .filter(|w| w % servers == s)
                .count()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The reported round of `setup`: the one with the median creates/s.
fn median_run(all: &[HaRun], setup: Setup) -> Result<HaRun> {
    let runs: Vec<HaRun> = all.iter().filter(|r| r.setup == setup).cloned().collect();
    crate::stats::median_by(&runs, HaRun::rate)
        .cloned()
        .with_context(|| format!("no {} runs", setup.tag()))
}

fn report(
    opts: &Options,
    started_at: chrono::DateTime<chrono::Utc>,
    env: Environment,
    creates: usize,
    runs: usize,
    all: &[HaRun],
) -> Result<SuiteReport> {
    let single = median_run(all, Setup::Single)?;
    let ha = median_run(all, Setup::Replicated)?;
    let (Some(s1), Some(s3)) = (single.summary(), ha.summary()) else {
        bail!("no creates measured");
    };
    let what = format!(
        "Pod create call through skiff-client (gRPC), {creates} creates by {CREATE_CONCURRENCY} \
         workers (one call in flight each, a connection each to one API server: worker w → \
         server w mod n) after {WARMUP} warm-up creates; pods/s over first call start → last \
         response; the median of {runs} round(s) by pods/s"
    );
    let group = format!("{HA_SIZE}×{HA_SIZE} vs 1×1");
    let series_of = |r: &HaRun, role: Role, how: &str| -> Result<Series> {
        Ok(Series::new(
            &r.setup.series_name(),
            role,
            &format!("{what}; {how}"),
            &r.calls,
            Some(r.wall),
        )?
        .with_throughput(r.calls.len(), r.wall)
        .in_group(group.clone()))
    };
    let series = vec![
        series_of(
            &ha,
            Role::Skiff,
            &format!(
                "{HA_SIZE} skiff-apiserver processes, each over all {HA_SIZE} members of one etcd \
                 cluster, one PKI; workers per API server {}",
                spread(CREATE_CONCURRENCY, HA_SIZE)
            ),
        )?,
        series_of(
            &single,
            Role::Baseline,
            "one skiff-apiserver over one single-member etcd; every worker on it",
        )?,
    ];

    let rate_ratio = ha.rate() / single.rate().max(1e-9);
    let p50_ratio = s3.p50 / s1.p50;
    let p99_ratio = s3.p99 / s1.p99;
    let cpu_ratio = ha.cpu_ms_per_create() / single.cpu_ms_per_create().max(1e-9);
    let fs = host::fs_type(&std::env::temp_dir()).unwrap_or_else(|| "unknown".into());
    let rounds = |setup: Setup| {
        all.iter()
            .filter(|r| r.setup == setup)
            .map(|r| format!("{:.0}", r.rate()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let per_server = ha
        .per_server
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("/");
    let notes = vec![
        format!(
            "Both setups ran in this one run on this machine ({} CPUs), in {runs} round(s); each \
             round started each setup fresh (real etcd and skiff-apiserver processes, every \
             address on 127.0.0.1), measured it and stopped it before starting the other; the \
             order alternated between rounds. The bench's clients share the CPUs with the \
             servers. etcd's data directories were on {fs}{}.",
            env.cpus,
            if fs == "tmpfs" {
                " (in memory: an fsync costs next to nothing)"
            } else {
                " (each write-ahead log append is fsynced to the disk)"
            }
        ),
        format!(
            "Ratios {HA_SIZE}×{HA_SIZE} / 1×1 of the reported rounds: creates/s {rate_ratio:.2}x \
             ({:.0}/s against {:.0}/s), p50 {p50_ratio:.2}x ({:.2} ms against {:.2} ms), p99 \
             {p99_ratio:.2}x ({:.2} ms against {:.2} ms). Creates/s of every round: 1×1 {}; \
             {HA_SIZE}×{HA_SIZE} {}.",
            ha.rate(),
            single.rate(),
            s3.p50,
            s1.p50,
            s3.p99,
            s1.p99,
            rounds(Setup::Single),
            rounds(Setup::Replicated),
        ),
        format!(
            "CPU time of the setup's etcd and API server processes during the measured creates: \
             {:.2} ms per create for 1×1, {:.2} ms for {HA_SIZE}×{HA_SIZE} ({cpu_ratio:.1}x). \
             In the reported {HA_SIZE}×{HA_SIZE} round the API servers served {per_server} of \
             the creates. Every API server listed every pod of its setup afterwards (one store \
             behind them).",
            single.cpu_ms_per_create(),
            ha.cpu_ms_per_create(),
        ),
        format!(
            "Interpretation: on one machine with {} cores, the {HA_SIZE} API servers and \
             {HA_SIZE} etcd members of {HA_SIZE}×{HA_SIZE} share the same CPUs that 1×1's two \
             processes had, and every write is replicated: the etcd leader appends it to its \
             log and sends it to both followers, each member fsyncs it to its write-ahead log \
             on the same {fs} filesystem, and the leader answers once a majority has it (a request that \
             reaches a follower is forwarded to the leader first). So {HA_SIZE}×{HA_SIZE} is \
             expected to be slower here{} {:.0}% of 1×1's creates/s, p99 {p99_ratio:.1}x, \
             {cpu_ratio:.1}x the CPU per create. This measures what \
             replication costs when there is no more hardware to spread it over; it cannot show \
             what three machines would do. High availability is there to survive the loss of \
             an API server or an etcd member, not to be faster.",
            env.cpus,
            if rate_ratio < 1.0 {
                ", and it was:"
            } else {
                "; it was not:"
            },
            rate_ratio * 100.0,
        ),
    ];

    let round_json = |r: &HaRun| {
        let s = r.summary();
        json!({
            "setup": r.setup.tag(),
            "round": r.round + 1,
            "creates_per_s": r.rate(),
            "p50_ms": s.as_ref().map(|s| s.p50),
            "p99_ms": s.as_ref().map(|s| s.p99),
            "wall_ms": r.wall.as_secs_f64() * 1e3,
            "cpu_ms_per_create": r.cpu_ms_per_create(),
            "creates_per_api_server": r.per_server,
            "startup_ms": r.startup.as_secs_f64() * 1e3,
        })
    };
    let details = BTreeMap::from([
        (
            "rounds".to_string(),
            json!(all.iter().map(round_json).collect::<Vec<_>>()),
        ),
        (
            "ratios_3x3_over_1x1".to_string(),
            json!({"creates_per_s": rate_ratio, "p50": p50_ratio, "p99": p99_ratio,
                   "cpu_per_create": cpu_ratio}),
        ),
        ("etcd_data_fs".to_string(), json!(fs)),
    ]);
    let params = BTreeMap::from([
        ("creates".to_string(), json!(creates)),
        ("workers".to_string(), json!(CREATE_CONCURRENCY)),
        ("warmup".to_string(), json!(WARMUP)),
        ("runs".to_string(), json!(runs)),
        ("ha_size".to_string(), json!(HA_SIZE)),
    ]);
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
            details,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(setup: Setup, round: usize, wall_ms: u64) -> HaRun {
        HaRun {
            setup,
            round,
            calls: vec![Duration::from_millis(2), Duration::from_millis(4)],
            wall: Duration::from_millis(wall_ms),
            per_server: vec![2; setup.size()],
            cpu: Duration::from_millis(10),
            startup: Duration::from_millis(100),
        }
    }

    #[test]
    fn reports_the_median_round_and_the_ratios() {
        let all = vec![
            run(Setup::Single, 0, 10),
            run(Setup::Replicated, 0, 40),
            run(Setup::Replicated, 1, 20),
            run(Setup::Single, 1, 30),
            run(Setup::Single, 2, 20),
            run(Setup::Replicated, 2, 30),
        ];
        assert_eq!(median_run(&all, Setup::Single).unwrap().round, 2);
        assert_eq!(median_run(&all, Setup::Replicated).unwrap().round, 2);
        let r = report(
            &Options::default(),
            chrono::Utc::now(),
            Environment::default(),
            2,
            3,
            &all,
        )
        .unwrap();
        assert_eq!(r.series.len(), 2);
        assert_eq!(r.ratios.len(), 1);
        let ratio = &r.ratios[0];
        assert!(ratio.skiff.contains("3×3") && ratio.baseline.contains("1×1"));
        // 2 creates in 30 ms against 2 in 20 ms.
        let t = ratio.throughput.unwrap();
        assert!((t - 20.0 / 30.0).abs() < 1e-9, "{t}");
        assert_eq!(r.details["rounds"].as_array().unwrap().len(), 6);
        assert!(r.notes.iter().any(|n| n.starts_with("Interpretation")));
        assert_eq!(Setup::Replicated.tag(), "3x3");
        assert_eq!(spread(16, 3), "6/5/5");
        assert_eq!(spread(16, 1), "16");
        assert!(median_run(&[], Setup::Single).is_err());
    }
}
