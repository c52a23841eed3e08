//! `skiff-bench`: runs benchmark suites, each a baseline and Skiff side by side, prints a table
//! and writes `<date>-<suite>.md` and `.json` reports.
//!
//! ```text
//! skiff-bench                      # every suite, results in perf/results/
//! skiff-bench pod-start --pods 50 --concurrency 10
//! skiff-bench scheduler --nodes 1000,5000 --pods 3000 --runs 3
//! skiff-bench service-lb lb-programming   # load balancing: Skiff eBPF vs kube-proxy rules
//! skiff-bench pod-net --runs 6
//! skiff-bench rest-api             # REST (JSON, HTTP/1.1) vs gRPC vs etcd: creates, lists, watch
//! skiff-bench ha                   # 3 API servers over 3 etcd members vs 1 over 1: creates
//! skiff-bench --quick              # smoke check: small sizes, results in $TMPDIR/skiff-perf-quick
//! ```
//!
//! `skiff-bench __rr server|client …` is the pod-net suite's request/response helper, which the
//! suite starts in pods' and baselines' network namespaces (not for direct use).
//!
//! pod-start and pod-net need root. Prefer `cargo xtask bench`, which builds it and the binaries it
//! starts in release first.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use skiff_perf::report::{IndexEntry, index_markdown};
use skiff_perf::suites::{self, Options, SUITES, Suite};
use skiff_perf::{host, lbnet, rr};
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;
use tracing_subscriber::EnvFilter;

/// Skiff's benchmarks: each suite runs baselines and Skiff in one run and reports ratios.
#[derive(Debug, Parser)]
#[command(name = "skiff-bench", version, about)]
struct Args {
    /// Suites to run (default: all; see --list).
    suites: Vec<String>,
    /// Smoke check: a few items per series, results outside the repository.
    #[arg(long)]
    quick: bool,
    /// Pods per series [pod-start: groups of 1, 50 and 200 (1 and 3 with --quick), this one
    /// size instead when given; pod-density: 500, 10 with --quick; scheduler: 3000, 300 with
    /// --quick; control-plane and rest-api: creates per measurement and path, 2000, 50 with
    /// --quick; auth and ha: creates per side, 2000, 40 and 50 with --quick].
    #[arg(long, value_name = "N")]
    pods: Option<usize>,
    /// Starts in flight at once, the same for Skiff (a pod start: create → Running) and the
    /// baselines (a process start: spawn → running the command).
    #[arg(long, value_name = "C", default_value_t = 10)]
    concurrency: usize,
    /// Unmeasured starts before each series.
    #[arg(long, value_name = "W", default_value_t = 1)]
    warmup: usize,
    /// Hollow node counts for the scheduler suite, comma-separated, one comparison each
    /// [default: 1000,5000; 100 with --quick].
    #[arg(long, value_name = "N[,N…]", value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Repetitions: of each scheduler, control-plane, rest-api and ha measurement, the median
    /// reported (rest-api's lists and watches: every run's samples); of the pod-net suite's
    /// rounds, every round reported [default: 3, pod-net 6; 1 with --quick].
    #[arg(long, value_name = "N")]
    runs: Option<usize>,
    /// Scheduler suite: run the API server on a real etcd (started on loopback) instead of
    /// the embedded store.
    #[arg(long)]
    etcd: bool,
    /// service-lb and lb-programming: load kube-proxy's iptables and nftables rules for
    /// service counts up to N (larger counts measure Skiff and the direct connection only).
    /// 50000 adds the rule-based methods at 50k services, which takes well over 15 minutes
    /// more on 2 cores (one iptables-restore of that ruleset alone took 7 minutes).
    #[arg(long, value_name = "N", default_value_t = suites::service_lb::RULES_MAX)]
    rules_max: usize,
    /// Directory for the reports [default: perf/results, or $TMPDIR/skiff-perf-quick with
    /// --quick].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// List the suites and exit.
    #[arg(long)]
    list: bool,
}

/// A hidden subcommand's entry point: the arguments after its name.
type HelperMain = fn(&[String]) -> Result<()>;

fn main() -> ExitCode {
    // Some suites re-execute the bench as their clients and servers (hidden subcommands).
    let argv: Vec<String> = std::env::args().collect();
    let helper: Option<HelperMain> = match argv.get(1).map(String::as_str) {
        Some(lbnet::CLIENT_CMD) => Some(lbnet::client_main),
        Some(lbnet::SERVER_CMD) => Some(lbnet::server_main),
        Some(rr::HELPER_ARG) => {
            Some(|args: &[String]| rr::helper_main(args.iter().map(Into::into)))
        }
        _ => None,
    };
    if let Some(helper) = helper {
        return match helper(&argv[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err:#}");
                ExitCode::FAILURE
            }
        };
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("warn,skiff_perf=info,skiff_bench=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

fn selected(names: &[String]) -> Result<Vec<&'static Suite>> {
    if names.is_empty() {
        return Ok(SUITES.iter().collect());
    }
    names
        .iter()
        .map(|n| {
            suites::find(n).ok_or_else(|| {
                let known: Vec<&str> = SUITES.iter().map(|s| s.name).collect();
                anyhow!("unknown suite {n:?} (known: {})", known.join(", "))
            })
        })
        .collect()
}

fn run(args: Args) -> Result<()> {
    if args.list {
        for s in SUITES {
            println!("{:<12} {}", s.name, s.title);
        }
        return Ok(());
    }
    let chosen = selected(&args.suites)?;
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    // Only returns once running from target/<profile>/skiff-perf/ (see its docs).
    host::run_from_profile_subdir()?;

    let opts = Options {
        quick: args.quick,
        pods: args.pods,
        concurrency: args.concurrency,
        warmup: args.warmup,
        nodes: args.nodes,
        runs: args.runs,
        etcd: args.etcd,
        rules_max: args.rules_max,
    };
    let out = args.out.clone().unwrap_or_else(|| {
        if args.quick {
            std::env::temp_dir().join("skiff-perf-quick")
        } else {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results")
        }
    });
    if host::profile() != "release" {
        eprintln!(
            "warning: a {} build: numbers are not representative",
            host::profile()
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let every_suite = chosen.len() == SUITES.len();
    let mut tables = Vec::new();
    let mut reports = Vec::new();
    for suite in chosen {
        info!(suite = suite.name, "running");
        // On SIGINT/SIGTERM the suite's future is dropped, and with it everything it started.
        let report = rt.block_on(async {
            tokio::select! {
                r = (suite.run)(&opts) => r,
                s = interrupted() => Err(anyhow!("{s}: stopped; what the suite started was removed")),
            }
        })?;
        let table = report.table();
        println!("\n{table}");
        let (md, json) = report.write(&out)?;
        println!("report: {}\nraw:    {}", md.display(), json.display());
        tables.push(table);
        let md_name = md
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        reports.push((suite.section, report, md_name));
    }
    // The whole report, only when every suite ran (a partial run keeps the last whole one).
    if every_suite && let Some((_, first, _)) = reports.first() {
        let entries: Vec<IndexEntry<'_>> = reports
            .iter()
            .map(|(section, report, md)| IndexEntry {
                section: *section,
                report,
                markdown: md.clone(),
            })
            .collect();
        let path = out.join(format!("{}-report.md", first.date));
        std::fs::write(&path, index_markdown(&first.date, &entries))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\nwhole report: {}", path.display());
    }
    if tables.len() > 1 {
        println!("\n{}", tables.join("\n"));
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM, naming it.
async fn interrupted() -> &'static str {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "interrupted (SIGINT)",
        _ = term.recv() => "terminated (SIGTERM)",
    }
}
