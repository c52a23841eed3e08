//! `pod-start`: pod start latency, from the create call to the watch event that shows the pod
//! Running with its container running, against starting the same command without Skiff.
//!
//! One run: the real API server (embedded store) and one real node agent (its node in a network
//! namespace of its own) from the `skiff-tests` harness; the baselines while that cluster is
//! idle; then one watch on the bench's pods, opened before the first create, and N pods bound
//! to the node (`spec.nodeName`), with at most `concurrency` pod starts (create → Running) in
//! flight, as the baselines have at most `concurrency` process starts. Afterwards every pod is
//! deleted and the bench waits (bounded) until the watch has seen them all go; the harness
//! then removes the agent, the pods' processes, namespaces and cgroups, also on failure.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use futures::{StreamExt, TryStreamExt};
use skiff_api::api::{Node as ApiNode, Pod};
use skiff_client::{Api, Client, DeleteParams, ListParams};
use skiff_tests::{ApiServer, Backend, Node};
use tracing::{info, warn};

use super::Options;
use crate::baseline::{self, Baseline, Procs};
use crate::host;
use crate::pods::{PodWatch, delete_all};
use crate::report::{Measured, Role, Series, SuiteReport};

pub const NAME: &str = "pod-start";
pub const TITLE: &str = "pod start latency";

/// The command every pod (and every baseline process) runs.
const COMMAND: &[&str] = &["sleep", "3600"];
const POD_CIDR: &str = "10.244.9.0/24";
/// Addresses the node's /24 offers pods.
const MAX_PODS: usize = 250;
const NAMESPACE: &str = "default";
/// Label on every pod of a run (value: the run id); the watch selects on it.
const RUN_LABEL: &str = "skiff-perf-run";
const DEFAULT_PODS: usize = 50;
const QUICK_PODS: usize = 3;

const NODE_READY_TIMEOUT: Duration = Duration::from_secs(30);
const DELETE_TIMEOUT: Duration = Duration::from_secs(120);

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// Generous bound for `pods` pods to reach Running.
fn running_timeout(pods: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_secs(2) * pods as u32
}

async fn measure(opts: &Options) -> Result<SuiteReport> {
    host::require_root()?;
    let bin_dir = host::check_binaries(&["skiff-apiserver", "skiff-node"])?;
    let n = opts
        .pods
        .unwrap_or(if opts.quick { QUICK_PODS } else { DEFAULT_PODS });
    let c = opts.concurrency.clamp(1, n.max(1));
    let warmup = opts.warmup;
    if n == 0 || n + warmup > MAX_PODS {
        bail!(
            "--pods must be between 1 and {} (the node's /24 minus {warmup} warm-up pods)",
            MAX_PODS - warmup
        );
    }
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
    let server = ApiServer::start(Backend::Embedded);
    let node = Node::start(&server, &node_name, POD_CIDR);
    let (node_netns, node_cgroup) = (node.netns_path(), node.cgroup_parent.clone());

    let listen = server.addr.to_string();
    let apiserver_exe = host::verify_process("skiff-apiserver", &["--listen", &listen], &bin_dir)?;
    let agent_exe = host::verify_process(
        "skiff-node agent",
        &["run", "--node-name", &node_name],
        &bin_dir,
    )?;
    env.binaries.insert(
        "skiff-apiserver".into(),
        apiserver_exe.display().to_string(),
    );
    env.binaries
        .insert("skiff-node".into(), agent_exe.display().to_string());

    let client = Client::connect(&server.endpoint)
        .await
        .context("connecting to the API server")?;
    wait_node_ready(&client, &node_name)
        .await
        .map_err(|e| with_agent_log(e, &node))?;

    // The baselines, while the API server and the agent are idle.
    let mut series = Vec::new();
    for b in [Baseline::ForkExec, Baseline::Isolated] {
        let cgroup = (b == Baseline::Isolated)
            .then(|| skiff_tests::cgroup2_root().join(format!("skiff-perf-{run_id}")));
        let procs = Procs::new(cgroup)?;
        baseline::run(&procs, b, 0, warmup, 1, COMMAND).with_context(|| b.name())?;
        let (samples, wall) =
            baseline::run(&procs, b, warmup, n, c, COMMAND).with_context(|| b.name())?;
        info!(series = b.name(), processes = procs.len(), "baseline done");
        series.push(Series::new(
            b.name(),
            Role::Baseline,
            &b.measures(COMMAND),
            &samples,
            Some(wall),
        )?);
    }

    // Skiff.
    let pods = client.namespaced::<Pod>(NAMESPACE);
    let watch = PodWatch::start(pods.clone(), &format!("{RUN_LABEL}={run_id}"), is_running).await?;
    let warm: Vec<String> = (0..warmup)
        .map(|i| format!("warmup-{run_id}-{i}"))
        .collect();
    let measured: Vec<String> = (0..n).map(|i| format!("pod-{run_id}-{i}")).collect();
    let make = |name: &String| bench_pod(name, &node_name, &run_id);

    info!(pods = warmup, "warm-up pods");
    start_pods(&pods, &watch, &warm, 1, make)
        .await
        .map_err(|e| with_agent_log(e, &node))?;

    info!(pods = n, concurrency = c, "measured pods");
    let t0 = Instant::now();
    let starts = start_pods(&pods, &watch, &measured, c, make)
        .await
        .map_err(|e| with_agent_log(e, &node))?;
    let wall = t0.elapsed();
    let samples: Vec<Duration> = measured
        .iter()
        .map(|name| {
            starts[name]
                .running
                .saturating_duration_since(starts[name].create)
        })
        .collect();
    let create_calls: Vec<Duration> = measured
        .iter()
        .map(|name| {
            starts[name]
                .created
                .saturating_duration_since(starts[name].create)
        })
        .collect();
    series.insert(
        0,
        Series::new(
            "skiff",
            Role::Skiff,
            "Pod create call (client side, just before the gRPC call) → the first event of \
             one pod watch (a skiff_client reflector opened before the first create) with \
             status.phase Running and every container state running, timestamped when the \
             bench receives it",
            &samples,
            Some(wall),
        )?,
    );
    series.push(Series::new(
        "skiff create call",
        Role::Detail,
        "the create call alone: just before the gRPC call → its response (the pod is \
         stored); part of the skiff series",
        &create_calls,
        None,
    )?);

    // Delete everything the bench created and wait until the watch has seen it go.
    info!("deleting the pods");
    let all: Vec<String> = warm.iter().chain(&measured).cloned().collect();
    let t_delete = Instant::now();
    delete_all(&pods, &all, &DeleteParams::default(), c).await?;
    watch
        .wait_deleted(&all, DELETE_TIMEOUT)
        .await
        .map_err(|e| with_agent_log(e, &node))?;
    let delete_wall = t_delete.elapsed();
    let left = pods
        .list(&ListParams::default().labels(&format!("{RUN_LABEL}={run_id}")))
        .await
        .context("listing the bench's pods after the delete")?;
    if !left.items.is_empty() {
        bail!("{} pods still exist after the delete", left.items.len());
    }
    let watch_lists = watch.lists();

    info!("tearing down");
    drop(watch);
    drop(node);
    drop(server);
    if node_netns.exists() || node_cgroup.exists() {
        warn!(netns = %node_netns.display(), cgroup = %node_cgroup.display(), "left behind after teardown");
    }

    let params = BTreeMap::from([
        ("pods".to_string(), serde_json::json!(n)),
        ("concurrency".to_string(), serde_json::json!(c)),
        ("warmup".to_string(), serde_json::json!(warmup)),
        ("command".to_string(), serde_json::json!(COMMAND)),
        (
            "cluster".to_string(),
            serde_json::json!(
                "skiff-apiserver (embedded redb store) + 1 skiff-node agent on loopback"
            ),
        ),
    ]);
    let mut notes = vec![
        format!(
            "All series ran in this one run on this machine: the baselines first (with the API \
             server and the agent up and idle), then Skiff. Each series starts its {n} items \
             with at most {c} starts in flight (a start ends when the process runs / the watch \
             shows the pod Running), after {warmup} unmeasured warm-up start(s)."
        ),
        format!(
            "Pods: one container, image `host`, command `{}`, spec.nodeName set (no scheduler).",
            COMMAND.join(" ")
        ),
        "Percentiles are nearest-rank (with 50 samples p99 is the maximum).".into(),
        format!(
            "Deleting all {} pods took {:.2} s until the watch had seen every one deleted.",
            all.len(),
            delete_wall.as_secs_f64()
        ),
    ];
    if watch_lists > 1 {
        notes.push(format!(
            "The pod watch was re-established {} times (relists): running times seen at a \
             relist may be late.",
            watch_lists - 1
        ));
    }
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
            details: BTreeMap::new(),
        },
    ))
}

/// The pod the bench creates.
fn bench_pod(name: &str, node: &str, run_id: &str) -> Result<Pod> {
    skiff_api::manifest::decode(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {RUN_LABEL: run_id}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "host", "command": COMMAND}],
        },
    }))
    .context("building the benchmark pod")
}

/// Running, with every container running.
fn is_running(p: &Pod) -> bool {
    let Some(st) = &p.status else {
        return false;
    };
    st.phase == "Running"
        && !st.container_statuses.is_empty()
        && st
            .container_statuses
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// `err` followed by the end of the agent's log.
pub(crate) fn with_agent_log(err: anyhow::Error, node: &Node) -> anyhow::Error {
    let log = node.agent_log();
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(30)..].join("\n");
    anyhow::anyhow!("{err:#}\nagent log (last 30 lines):\n{tail}")
}

pub(crate) async fn wait_node_ready(client: &Client, name: &str) -> Result<()> {
    let nodes = client.cluster::<ApiNode>();
    let deadline = Instant::now() + NODE_READY_TIMEOUT;
    loop {
        let ready = nodes.get_opt(name).await.ok().flatten().is_some_and(|n| {
            n.status.is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.r#type == "Ready" && c.status == "True")
            })
        });
        if ready {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("node {name} not Ready within {NODE_READY_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The instants of one pod start.
struct Start {
    /// Just before the create call.
    create: Instant,
    /// The create call returned.
    created: Instant,
    /// The watch delivered the pod Running.
    running: Instant,
}

/// Starts the pods `names` with at most `concurrency` starts (create → Running) in flight,
/// like the baselines' process starts; fails if they take longer than [`running_timeout`].
async fn start_pods(
    pods: &Api<Pod>,
    watch: &PodWatch,
    names: &[String],
    concurrency: usize,
    make: impl Fn(&String) -> Result<Pod>,
) -> Result<HashMap<String, Start>> {
    let objects: Vec<(String, Pod)> = names
        .iter()
        .map(|n| Ok((n.clone(), make(n)?)))
        .collect::<Result<_>>()?;
    let timeout = running_timeout(names.len());
    let deadline = Instant::now() + timeout;
    let all = futures::stream::iter(objects)
        .map(|(name, pod)| async move {
            let create = Instant::now();
            pods.create(&pod)
                .await
                .with_context(|| format!("creating pod {name}"))?;
            let created = Instant::now();
            let running = match watch.reached(&name, deadline).await {
                Ok(at) => at,
                Err(e) => {
                    let status = pods.get(&name).await.map(|p| p.status);
                    return Err(e.context(format!("pod {name} status: {status:?}")));
                }
            };
            Ok::<_, anyhow::Error>((
                name,
                Start {
                    create,
                    created,
                    running,
                },
            ))
        })
        .buffer_unordered(concurrency)
        .try_collect();
    tokio::time::timeout_at(deadline.into(), all)
        .await
        .with_context(|| format!("{} pods not all Running within {timeout:?}", names.len()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_status(status: serde_json::Value) -> Pod {
        let mut p = bench_pod("p", "n", "r").unwrap();
        let full: Pod = skiff_api::manifest::decode(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "status": status,
        }))
        .unwrap();
        p.status = full.status;
        p
    }

    #[test]
    fn bench_pod_is_bound_and_labelled() {
        let p = bench_pod("pod-x-1", "node-a", "x").unwrap();
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name, "node-a");
        assert_eq!(spec.containers[0].command, COMMAND);
        assert_eq!(spec.containers[0].image, "host");
        assert_eq!(p.metadata.as_ref().unwrap().labels[RUN_LABEL], "x");
    }

    #[test]
    fn running_needs_phase_and_every_container() {
        assert!(!is_running(&bench_pod("p", "n", "r").unwrap()));
        assert!(!is_running(&with_status(
            serde_json::json!({"phase": "Pending"})
        )));
        assert!(!is_running(&with_status(
            serde_json::json!({"phase": "Running"})
        )));
        assert!(!is_running(&with_status(serde_json::json!({
            "phase": "Running",
            "containerStatuses": [
                {"name": "a", "state": {"running": {}}},
                {"name": "b", "state": {"waiting": {"reason": "ContainerCreating"}}},
            ],
        }))));
        assert!(is_running(&with_status(serde_json::json!({
            "phase": "Running",
            "containerStatuses": [{"name": "main", "state": {"running": {}}}],
        }))));
    }
}
