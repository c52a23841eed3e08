//! `pod-start`: pod start latency, from the create call to the watch event that shows the pod
//! Running with its container running, against starting the same command without Skiff.
//!
//! One run: the real API server (embedded store) and one real node agent (its node in a network
//! namespace of its own, pod CIDR a /22) from the `skiff-tests` harness, and one watch on the
//! bench's pods, opened before the first create. Then one comparison group per pod count N
//! (default 1, 50 and 200; `--pods N` for one): the baselines while the cluster is idle; then
//! N pods bound to the node (`spec.nodeName`), with at most `concurrency` pod starts (create →
//! Running) in flight, as the baselines have at most `concurrency` process starts; then every
//! pod of the group is deleted and the bench waits (bounded) until the watch has seen them all
//! go. The harness then removes the agent, the pods' processes, namespaces and cgroups, also
//! on failure.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use futures::{StreamExt, TryStreamExt};
use skiff_api::api::{Node as ApiNode, Pod};
use skiff_client::{Api, Client, DeleteParams, ListParams};
use skiff_tests::{ApiServer, Backend, Fabric, Machine, Node};
use tracing::{info, warn};

use super::Options;
use crate::baseline::{self, Baseline, Procs};
use crate::host;
use crate::pods::{PodWatch, delete_all};
use crate::report::{Environment, Measured, Role, Series, SuiteReport};

pub const NAME: &str = "pod-start";
pub const TITLE: &str = "pod start latency";

/// The command every pod (and every baseline process) runs.
pub(crate) const COMMAND: &[&str] = &["sleep", "3600"];
/// A /22: room for 1,022 pod addresses; a group's pods are deleted before the next.
const POD_CIDR: &str = "10.244.8.0/22";
/// The largest group (pods plus warm-up pods) the bench accepts: well inside the /22.
const MAX_PODS: usize = 1000;
pub(crate) const NAMESPACE: &str = "default";
/// Label on every pod of a run (value: the run id); the watch selects on it.
pub(crate) const RUN_LABEL: &str = "skiff-perf-run";
/// Pod counts, one comparison group each.
const DEFAULT_SIZES: &[usize] = &[1, 50, 200];
const QUICK_SIZES: &[usize] = &[1, 3];
/// The "1 pod" group starts a lone pod this many times, one at a time.
const DEFAULT_SINGLE_STARTS: usize = 20;
const QUICK_SINGLE_STARTS: usize = 3;

const NODE_READY_TIMEOUT: Duration = Duration::from_secs(30);
const DELETE_TIMEOUT: Duration = Duration::from_secs(120);

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// Generous bound for `pods` pods to reach Running.
fn running_timeout(pods: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_secs(2) * pods as u32
}

/// The pod counts to measure, one comparison group each: `--pods` alone, or the default list.
fn sizes(opts: &Options) -> Vec<usize> {
    match opts.pods {
        Some(n) => vec![n],
        None if opts.quick => QUICK_SIZES.to_vec(),
        None => DEFAULT_SIZES.to_vec(),
    }
}

/// The comparison group of one size.
fn group(n: usize) -> String {
    if n == 1 {
        "1 pod".into()
    } else {
        format!("{n} pods")
    }
}

/// The API server (embedded store) on a control machine and one node agent on its own
/// machine, which the pod suites run against, checked to be the expected binaries (recorded
/// in `env`) and Ready.
pub(crate) struct OneNode {
    pub server: ApiServer,
    pub node: Node,
    pub client: Client,
    /// The node's network namespace and cgroup parent (checked gone after teardown).
    pub netns: PathBuf,
    pub cgroup: PathBuf,
    pub agent_pid: u32,
    /// Bind both to names (not `..`): they must outlive the server and the node.
    pub control: Machine,
    pub fabric: Fabric,
}

impl OneNode {
    pub(crate) async fn start(
        node_name: &str,
        pod_cidr: &str,
        bin_dir: &Path,
        env: &mut Environment,
    ) -> Result<OneNode> {
        let fabric = skiff_tests::fabric();
        let control = Machine::on(&fabric, "control");
        let server = ApiServer::start_on(&control, Backend::Embedded, &[]);
        let node = Node::start(&server, &fabric, node_name, pod_cidr);
        let (netns, cgroup) = (node.netns_path(), node.cgroup_parent.clone());
        let listen = server.listen().to_string();
        let apiserver_exe =
            host::verify_process("skiff-apiserver", &["--listen", &listen], bin_dir)?;
        let needles = ["run", "--node-name", node_name];
        let agent_exe = host::verify_process("skiff-node agent", &needles, bin_dir)?;
        let agent_pid = host::processes_with_args(&needles)
            .first()
            .map(|(pid, _)| *pid)
            .context("the agent process is gone")?;
        env.binaries.insert(
            "skiff-apiserver".into(),
            apiserver_exe.display().to_string(),
        );
        env.binaries
            .insert("skiff-node".into(), agent_exe.display().to_string());
        let client = Client::connect_with(&server.client_config())
            .await
            .context("connecting to the API server")?;
        wait_node_ready(&client, node_name)
            .await
            .map_err(|e| with_agent_log(e, &node))?;
        Ok(OneNode {
            server,
            node,
            client,
            netns,
            cgroup,
            agent_pid,
            control,
            fabric,
        })
    }
}

async fn measure(opts: &Options) -> Result<SuiteReport> {
    host::require_root()?;
    let bin_dir = host::check_binaries(&["skiff-apiserver", "skiff-node"])?;
    let sizes = sizes(opts);
    let single = if opts.quick {
        QUICK_SINGLE_STARTS
    } else {
        DEFAULT_SINGLE_STARTS
    };
    let warmup = opts.warmup;
    for &n in &sizes {
        if n == 0 || n + warmup > MAX_PODS {
            bail!(
                "--pods must be between 1 and {} (the node's pod CIDR {POD_CIDR} minus {warmup} \
                 warm-up pods)",
                MAX_PODS - warmup
            );
        }
    }
    let started_at = chrono::Utc::now();
    let run_id = skiff_tests::unique();
    let node_name = format!("perf-{run_id}");
    let mut env = host::environment();

    info!(
        suite = NAME,
        ?sizes,
        "starting the API server and a node agent"
    );
    let OneNode {
        server,
        node,
        client,
        netns: node_netns,
        cgroup: node_cgroup,
        agent_pid: _,
        control: _control,
        fabric: _fabric,
    } = OneNode::start(&node_name, POD_CIDR, &bin_dir, &mut env).await?;
    let pods = client.namespaced::<Pod>(NAMESPACE);
    let watch = PodWatch::start(pods.clone(), &format!("{RUN_LABEL}={run_id}"), is_running).await?;

    let mut series = Vec::new();
    let mut notes = Vec::new();
    let mut concurrency = BTreeMap::new();
    for &n in &sizes {
        // A lone pod is started `single` times, one at a time, for a distribution.
        let (count, c) = if n == 1 {
            (single, 1)
        } else {
            (n, opts.concurrency.clamp(1, n))
        };
        concurrency.insert(group(n), c);
        let cluster = SizeRun {
            pods: &pods,
            watch: &watch,
            node: &node,
            node_name: &node_name,
            run_id: &run_id,
        };
        let (s, delete_wall) = cluster
            .measure(n, count, c, warmup)
            .await
            .with_context(|| group(n))?;
        series.extend(s);
        notes.push(format!(
            "{}: deleting all {} pods took {:.2} s until the watch had seen every one deleted.",
            group(n),
            count + warmup,
            delete_wall.as_secs_f64()
        ));
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
        ("pods".to_string(), serde_json::json!(sizes)),
        ("concurrency".to_string(), serde_json::json!(concurrency)),
        ("warmup".to_string(), serde_json::json!(warmup)),
        ("command".to_string(), serde_json::json!(COMMAND)),
        ("pod_cidr".to_string(), serde_json::json!(POD_CIDR)),
        (
            "cluster".to_string(),
            serde_json::json!(
                "skiff-apiserver (embedded redb store) + 1 skiff-node agent on loopback"
            ),
        ),
    ]);
    let mut all_notes = vec![
        format!(
            "All series ran in this one run on this machine, one group per pod count ({}), on \
             one API server and one node agent. Per group: the baselines first (with the API \
             server and the agent up and idle), then Skiff; each series starts its N items \
             with at most min(N, {}) starts in flight (a start ends when the process runs / \
             the watch shows the pod Running), after {warmup} unmeasured warm-up start(s); \
             then the group's pods are deleted (seen gone) and its processes killed before \
             the next group. The \"1 pod\" group starts a lone pod {single} times, one at a \
             time (each start alone in flight), for a distribution.",
            sizes
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            opts.concurrency
        ),
        format!(
            "Pods: one container, image `host`, command `{}`, spec.nodeName set (no scheduler).",
            COMMAND.join(" ")
        ),
        "Percentiles are nearest-rank (with 50 samples p99 is the maximum).".into(),
    ];
    all_notes.extend(notes);
    if watch_lists > 1 {
        all_notes.push(format!(
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
            notes: all_notes,
            details: BTreeMap::new(),
        },
    ))
}

/// The cluster one size is measured on.
struct SizeRun<'a> {
    pods: &'a Api<Pod>,
    watch: &'a PodWatch,
    node: &'a Node,
    node_name: &'a str,
    run_id: &'a str,
}

impl SizeRun<'_> {
    /// The baselines and Skiff of group `n` with `count` items, `c` in flight; then deletes
    /// the pods (and kills the baselines' processes). Returns the group's series and how long
    /// the delete took.
    async fn measure(
        &self,
        n: usize,
        count: usize,
        c: usize,
        warmup: usize,
    ) -> Result<(Vec<Series>, Duration)> {
        let group = group(n);
        // The baselines, while the API server and the agent are idle.
        let mut baselines = Vec::new();
        for b in [Baseline::ForkExec, Baseline::Isolated] {
            let cgroup = (b == Baseline::Isolated).then(|| {
                skiff_tests::cgroup2_root().join(format!("skiff-perf-{}-{n}", self.run_id))
            });
            let procs = Procs::new(cgroup)?;
            baseline::run(&procs, b, 0, warmup, 1, COMMAND).with_context(|| b.name())?;
            let (samples, wall) =
                baseline::run(&procs, b, warmup, count, c, COMMAND).with_context(|| b.name())?;
            info!(series = b.name(), processes = procs.len(), "baseline done");
            baselines.push(
                Series::new(
                    b.name(),
                    Role::Baseline,
                    &b.measures(COMMAND),
                    &samples,
                    Some(wall),
                )?
                .in_group(&group),
            );
            // Dropping `procs` kills its processes before the next series.
        }

        let warm: Vec<String> = (0..warmup)
            .map(|i| format!("warmup-{}-{n}-{i}", self.run_id))
            .collect();
        let measured: Vec<String> = (0..count)
            .map(|i| format!("pod-{}-{n}-{i}", self.run_id))
            .collect();
        let make = |name: &String| bench_pod(name, self.node_name, self.run_id);

        info!(pods = warmup, "warm-up pods");
        start_pods(self.pods, self.watch, &warm, 1, make)
            .await
            .map_err(|e| with_agent_log(e, self.node))?;

        info!(pods = count, concurrency = c, "measured pods");
        let t0 = Instant::now();
        let starts = start_pods(self.pods, self.watch, &measured, c, make)
            .await
            .map_err(|e| with_agent_log(e, self.node))?;
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
        let mut series = vec![
            Series::new(
                "skiff",
                Role::Skiff,
                "Pod create call (client side, just before the gRPC call) → the first event \
                 of one pod watch (a skiff_client reflector opened before the first create) \
                 with status.phase Running and every container state running, timestamped \
                 when the bench receives it",
                &samples,
                Some(wall),
            )?
            .in_group(&group),
        ];
        series.extend(baselines);
        series.push(
            Series::new(
                "skiff create call",
                Role::Detail,
                "the create call alone: just before the gRPC call → its response (the pod is \
                 stored); part of the skiff series",
                &create_calls,
                None,
            )?
            .in_group(&group),
        );

        // Delete everything of this size and wait until the watch has seen it go.
        info!("deleting the pods");
        let all: Vec<String> = warm.iter().chain(&measured).cloned().collect();
        let t_delete = Instant::now();
        delete_all(self.pods, &all, &DeleteParams::default(), c).await?;
        self.watch
            .wait_deleted(&all, DELETE_TIMEOUT)
            .await
            .map_err(|e| with_agent_log(e, self.node))?;
        let delete_wall = t_delete.elapsed();
        let left = self
            .pods
            .list(&ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run_id)))
            .await
            .context("listing the bench's pods after the delete")?;
        if !left.items.is_empty() {
            bail!("{} pods still exist after the delete", left.items.len());
        }
        Ok((series, delete_wall))
    }
}

/// The pod the bench creates.
pub(crate) fn bench_pod(name: &str, node: &str, run_id: &str) -> Result<Pod> {
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
pub(crate) fn is_running(p: &Pod) -> bool {
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
pub(crate) struct Start {
    /// Just before the create call.
    pub create: Instant,
    /// The create call returned.
    pub created: Instant,
    /// The watch delivered the pod Running.
    pub running: Instant,
}

/// Starts the pods `names` with at most `concurrency` starts (create → Running) in flight,
/// like the baselines' process starts; fails if they take longer than [`running_timeout`].
pub(crate) async fn start_pods(
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
    fn sizes_and_groups() {
        assert_eq!(sizes(&Options::default()), [1, 50, 200]);
        let quick = Options {
            quick: true,
            ..Default::default()
        };
        assert_eq!(sizes(&quick), [1, 3]);
        let one = Options {
            pods: Some(7),
            ..quick
        };
        assert_eq!(sizes(&one), [7]);
        assert_eq!(group(1), "1 pod");
        assert_eq!(group(200), "200 pods");
        assert!(DEFAULT_SIZES.iter().all(|n| *n < MAX_PODS));
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
