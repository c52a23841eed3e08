//! `pod-density`: what the node agent costs with many pods on one node — its resident memory
//! and CPU time idle, while N pods start, and with all N Running — and how long the ramp
//! takes, against starting the same N processes with the kernel isolation alone.
//!
//! One run: the real API server (embedded store) and one real node agent (its node in a
//! network namespace of its own, pod CIDR a /22 so that 1,022 pod addresses are free; the
//! agent advertises 110 pods but does not refuse bound pods beyond that, and its eBPF
//! accounting maps hold 4,096 pods). First the baseline: N `unshare --net --uts --ipc sleep`
//! processes, each in a fresh cgroup (`baseline::Baseline::Isolated`), started with C in
//! flight, measured and killed. Then the agent idle for a while; then N pods bound to the
//! node, C starts (create → Running seen through a watch) in flight, the agent sampled every
//! 100 ms; then the steady state with all N Running; then every pod deleted and seen gone.
//! The harness removes the agent, the pods' processes, namespaces and cgroups, also on failure.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use serde_json::json;
use skiff_api::api::Pod;
use skiff_client::DeleteParams;
use tracing::{info, warn};

use super::Options;
use super::pod_start::{
    COMMAND, NAMESPACE, OneNode, RUN_LABEL, bench_pod, is_running, start_pods, with_agent_log,
};
use crate::baseline::{self, Baseline, Procs};
use crate::host;
use crate::pods::{PodWatch, delete_all};
use crate::procfs::{self, Usage, mib};
use crate::report::{Measured, Role, Series, SuiteReport};
use crate::stats::Summary;

pub const NAME: &str = "pod-density";
pub const TITLE: &str = "node agent cost with many pods on one node";

/// A /22: 1,022 pod addresses.
const POD_CIDR: &str = "10.244.12.0/22";
/// The most pods (with the warm-up pod) the bench puts on the node: inside the /22.
const MAX_PODS: usize = 1000;
const DEFAULT_PODS: usize = 500;
const QUICK_PODS: usize = 10;
/// How long the agent is watched idle (before) and at steady state (after the ramp).
const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
const QUICK_WINDOW: Duration = Duration::from_secs(1);
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

fn delete_timeout(pods: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(500) * pods as u32
}

/// The agent over one phase.
#[derive(Debug, Clone, Copy)]
struct Phase {
    wall: Duration,
    /// CPU time the agent used during the phase.
    cpu: Duration,
    /// Its RSS at the end of the phase, and the highest sampled during it.
    rss_end: u64,
    rss_peak: u64,
}

impl Phase {
    fn json(&self) -> serde_json::Value {
        json!({
            "wall_s": secs(self.wall),
            "cpu_s": secs(self.cpu),
            "cpu_share_of_one_core": (self.cpu.as_secs_f64() / self.wall.as_secs_f64().max(f64::EPSILON) * 1000.0).round() / 1000.0,
            "rss_end_mib": mib(self.rss_end),
            "rss_peak_mib": mib(self.rss_peak),
        })
    }

    fn describe(&self) -> String {
        format!(
            "{:.2} CPU s over {:.1} s ({:.1}% of one core), RSS {} MiB at the end (peak {} MiB)",
            self.cpu.as_secs_f64(),
            self.wall.as_secs_f64(),
            self.cpu.as_secs_f64() * 100.0 / self.wall.as_secs_f64().max(f64::EPSILON),
            mib(self.rss_end),
            mib(self.rss_peak)
        )
    }
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// Samples a process's RSS every [`SAMPLE_EVERY`] in a task, keeping the peak; stopped
/// when dropped.
struct RssSampler {
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let peak = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let peak = peak.clone();
            async move {
                let mut tick = tokio::time::interval(SAMPLE_EVERY);
                loop {
                    tick.tick().await;
                    if let Ok(u) = procfs::usage(pid) {
                        peak.fetch_max(u.rss_bytes, Ordering::Relaxed);
                    }
                }
            }
        });
        RssSampler { peak, task }
    }

    /// Ends the phase begun at `t0` with reading `before`.
    fn finish(self, pid: u32, t0: Instant, before: Usage) -> Result<Phase> {
        let after = procfs::usage(pid).context("reading the agent's usage")?;
        Ok(Phase {
            wall: t0.elapsed(),
            cpu: after.cpu.saturating_sub(before.cpu),
            rss_end: after.rss_bytes,
            rss_peak: self.peak.load(Ordering::Relaxed).max(after.rss_bytes),
        })
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches process `pid` for `window`.
async fn observe(pid: u32, window: Duration) -> Result<Phase> {
    let before = procfs::usage(pid).context("reading the agent's usage")?;
    let t0 = Instant::now();
    let sampler = RssSampler::start(pid);
    tokio::time::sleep(window).await;
    sampler.finish(pid, t0, before)
}

/// Memory of every process below cgroup `dir`: (processes, summed PSS).
fn cgroup_pss(dir: &Path) -> Result<(usize, u64)> {
    let pids = procfs::cgroup_pids(dir)?;
    let pss = pids.iter().filter_map(|p| procfs::pss(*p)).sum();
    Ok((pids.len(), pss))
}

async fn measure(opts: &Options) -> Result<SuiteReport> {
    host::require_root()?;
    let bin_dir = host::check_binaries(&["skiff-apiserver", "skiff-node"])?;
    let n = opts
        .pods
        .unwrap_or(if opts.quick { QUICK_PODS } else { DEFAULT_PODS });
    if n == 0 || n + 1 > MAX_PODS {
        bail!(
            "--pods must be between 1 and {} (the node's pod CIDR {POD_CIDR} holds 1,022 pods; \
             one warm-up pod)",
            MAX_PODS - 1
        );
    }
    let c = opts.concurrency.clamp(1, n);
    let window = if opts.quick {
        QUICK_WINDOW
    } else {
        DEFAULT_WINDOW
    };
    let started_at = chrono::Utc::now();
    let run_id = skiff_tests::unique();
    let node_name = format!("perf-{run_id}");
    let mut env = host::environment();

    info!(
        suite = NAME,
        pods = n,
        concurrency = c,
        "starting the API server and a node agent"
    );
    let OneNode {
        server,
        node,
        client,
        netns: node_netns,
        cgroup: node_cgroup,
        agent_pid,
        control: _control,
        fabric: _fabric,
    } = OneNode::start(&node_name, POD_CIDR, &bin_dir, &mut env).await?;

    // The baseline, while the API server and the agent are idle.
    info!(processes = n, "baseline");
    let b = Baseline::Isolated;
    let base_cgroup = skiff_tests::cgroup2_root().join(format!("skiff-perf-density-{run_id}"));
    let (base_samples, base_wall, base_cpu, base_mem) = {
        let procs = Procs::new(Some(base_cgroup.clone()))?;
        baseline::run(&procs, b, 0, 1, 1, COMMAND).context("baseline warm-up")?;
        let cpu0 = procfs::usage(std::process::id())?.cpu;
        let (samples, wall) = baseline::run(&procs, b, 1, n, c, COMMAND).context(b.name())?;
        let cpu = procfs::usage(std::process::id())?.cpu.saturating_sub(cpu0);
        let mem = cgroup_pss(&base_cgroup)?;
        (samples, wall, cpu, mem)
        // Dropping `procs` kills the processes and removes the cgroups.
    };

    // The agent idle, after it has settled from its start.
    tokio::time::sleep(window / 2).await;
    info!(window_s = window.as_secs_f64(), "agent idle");
    let idle = observe(agent_pid, window).await?;

    // The ramp.
    let pods = client.namespaced::<Pod>(NAMESPACE);
    let watch = PodWatch::start(pods.clone(), &format!("{RUN_LABEL}={run_id}"), is_running).await?;
    let make = |name: &String| bench_pod(name, &node_name, &run_id);
    let warm = vec![format!("warmup-{run_id}")];
    start_pods(&pods, &watch, &warm, 1, make)
        .await
        .map_err(|e| with_agent_log(e, &node))?;
    let names: Vec<String> = (0..n).map(|i| format!("pod-{run_id}-{i}")).collect();
    info!(pods = n, concurrency = c, "ramp");
    let before = procfs::usage(agent_pid)?;
    let (api_pid, _) = host::apiserver_pid(&server, &bin_dir)?;
    let api_before = procfs::usage(api_pid)?;
    let node_cpu0 = procfs::cgroup_cpu(&node_cgroup).ok();
    let t0 = Instant::now();
    let sampler = RssSampler::start(agent_pid);
    let starts = start_pods(&pods, &watch, &names, c, make)
        .await
        .map_err(|e| with_agent_log(e, &node))?;
    let ramp = sampler.finish(agent_pid, t0, before)?;
    let api_ramp_cpu = procfs::usage(api_pid)?.cpu.saturating_sub(api_before.cpu);
    let pods_ramp_cpu = node_cpu0
        .zip(procfs::cgroup_cpu(&node_cgroup).ok())
        .map(|(a, b)| b.saturating_sub(a));
    let samples: Vec<Duration> = names
        .iter()
        .map(|name| {
            starts[name]
                .running
                .saturating_duration_since(starts[name].create)
        })
        .collect();

    // Steady state.
    info!(window_s = window.as_secs_f64(), "steady state");
    let steady = observe(agent_pid, window).await?;
    let node_mem = cgroup_pss(&node_cgroup)?;

    // Delete everything and wait until the watch has seen it go.
    info!("deleting the pods");
    let all: Vec<String> = warm.iter().chain(&names).cloned().collect();
    let t_delete = Instant::now();
    delete_all(&pods, &all, &DeleteParams::default(), c).await?;
    watch
        .wait_deleted(&all, delete_timeout(all.len()))
        .await
        .map_err(|e| with_agent_log(e, &node))?;
    let delete_wall = t_delete.elapsed();
    let after_delete = procfs::usage(agent_pid)?;
    let watch_lists = watch.lists();

    info!("tearing down");
    drop(watch);
    drop(node);
    drop(server);
    if node_netns.exists() || node_cgroup.exists() || base_cgroup.exists() {
        warn!(netns = %node_netns.display(), cgroup = %node_cgroup.display(), "left behind after teardown");
    }

    let group = format!("{n} pods on one node · ramp");
    let series = vec![
        Series::new(
            "skiff",
            Role::Skiff,
            &format!(
                "ramp of {n} pods on one node with {c} starts in flight: per pod, create call \
                 start → the watch shows it Running (as in pod-start); wall time = the ramp \
                 (first create → last Running), pods/s over it"
            ),
            &samples,
            Some(starts_wall(&starts, &names)),
        )?
        .with_throughput(n, starts_wall(&starts, &names))
        .in_group(&group),
        Series::new(
            b.name(),
            Role::Baseline,
            &format!(
                "{} — {n} processes with {c} starts in flight; wall time = the ramp",
                b.measures(COMMAND)
            ),
            &base_samples,
            Some(base_wall),
        )?
        .with_throughput(n, base_wall)
        .in_group(&group),
    ];

    let per_pod = |bytes: u64, count: usize| mib(bytes / count.max(1) as u64);
    let (node_procs, node_pss) = node_mem;
    let (base_procs, base_pss) = base_mem;
    let mem_ratio = node_pss as f64 / base_pss.max(1) as f64;
    let notes = vec![
        format!(
            "One run on this machine: the baseline first (API server and agent idle), then the \
             agent {:.0} s idle (after {:.1} s to settle), then the ramp of {n} pods (plus one unmeasured warm-up pod \
             before it), then {:.0} s at steady state with all {} pods Running, then every \
             pod deleted.",
            window.as_secs_f64(),
            window.as_secs_f64() / 2.0,
            window.as_secs_f64(),
            n + 1
        ),
        format!(
            "Node: pod CIDR {POD_CIDR} (1,022 addresses; the default /24 would cap a node at \
             254 pods). The agent advertises capacity pods=110 but runs every pod bound to it \
             by name (spec.nodeName, no scheduler); its eBPF accounting maps hold 4,096 pods."
        ),
        format!(
            "Agent (skiff-node, pid {agent_pid}) RSS from /proc/<pid>/status VmRSS, CPU from \
             /proc/<pid>/stat utime+stime: idle: {}; ramp: {}; steady with {} pods: {}. After \
             deleting every pod: RSS {} MiB.",
            idle.describe(),
            ramp.describe(),
            n + 1,
            steady.describe(),
            mib(after_delete.rss_bytes)
        ),
        format!(
            "Agent memory per pod at steady state: {:.1} KiB ((steady RSS − idle RSS) / {} \
             pods).",
            (steady.rss_end as f64 - idle.rss_end as f64) / 1024.0 / (n + 1) as f64,
            n + 1
        ),
        format!(
            "During the ramp the API server used {:.2} CPU s{}; the baseline's spawning (the \
             bench process) used {:.2} CPU s for its {n} processes.",
            api_ramp_cpu.as_secs_f64(),
            pods_ramp_cpu.map_or_else(String::new, |d| format!(
                " and the pods' processes with their shims (the node cgroup's cpu.stat) {:.2} \
                 CPU s",
                d.as_secs_f64()
            )),
            base_cpu.as_secs_f64()
        ),
        format!(
            "Memory of the processes (summed PSS from /proc/<pid>/smaps_rollup; kernel memory \
             of namespaces, veths and cgroups is not included — this host has no cgroup v2 \
             memory controller): the node's pods with their shims {} MiB in {node_procs} \
             processes ({} MiB per pod); the baseline's {n} processes {} MiB in {base_procs} \
             processes ({} MiB each); ratio {mem_ratio:.1}x, plus the agent's {} MiB.",
            mib(node_pss),
            per_pod(node_pss, n + 1),
            mib(base_pss),
            per_pod(base_pss, n),
            mib(steady.rss_end)
        ),
        format!(
            "Deleting all {} pods took {:.2} s until the watch had seen every one deleted.",
            all.len(),
            delete_wall.as_secs_f64()
        ),
    ];
    let mut notes = notes;
    if watch_lists > 1 {
        notes.push(format!(
            "The pod watch was re-established {} times (relists): running times seen at a \
             relist may be late.",
            watch_lists - 1
        ));
    }
    let params = BTreeMap::from([
        ("pods".to_string(), json!(n)),
        ("concurrency".to_string(), json!(c)),
        ("window_s".to_string(), json!(window.as_secs_f64())),
        ("pod_cidr".to_string(), json!(POD_CIDR)),
        ("command".to_string(), json!(COMMAND)),
        (
            "cluster".to_string(),
            json!("skiff-apiserver (embedded redb store) + 1 skiff-node agent on loopback"),
        ),
    ]);
    let details = BTreeMap::from([
        (
            "agent".to_string(),
            json!({
                "idle": idle.json(),
                "ramp": ramp.json(),
                "steady": steady.json(),
                "rss_after_delete_mib": mib(after_delete.rss_bytes),
            }),
        ),
        (
            "memory_pss".to_string(),
            json!({
                "node_pods_and_shims_mib": mib(node_pss),
                "node_processes": node_procs,
                "baseline_mib": mib(base_pss),
                "baseline_processes": base_procs,
            }),
        ),
        (
            "ramp_cpu_s".to_string(),
            json!({
                "agent": secs(ramp.cpu),
                "apiserver": secs(api_ramp_cpu),
                "node_cgroup": pods_ramp_cpu.map(secs),
                "baseline_spawner": secs(base_cpu),
            }),
        ),
        ("delete_s".to_string(), json!(secs(delete_wall))),
        ("ramp_latency_ms".to_string(), json!(Summary::of(&samples))),
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

/// First create call → last Running seen, over `names`.
fn starts_wall(
    starts: &std::collections::HashMap<String, super::pod_start::Start>,
    names: &[String],
) -> Duration {
    let first = names.iter().map(|n| starts[n].create).min();
    let last = names.iter().map(|n| starts[n].running).max();
    first
        .zip(last)
        .map(|(f, l)| l.saturating_duration_since(f))
        .unwrap_or_default()
}
