//! `control-plane`: the API server's create throughput and watch delivery latency (with 1 and
//! with many watchers), against raw etcd puts and etcd watches through `etcd-client` in the
//! same run, and the API server on its embedded store against the API server on etcd.
//!
//! One run, three sides measured the same way, one after the other:
//!
//! 1. **skiff on etcd**: a throwaway etcd on loopback and the real `skiff-apiserver` on it;
//! 2. **etcd**: the same etcd, the API server stopped, driven directly with `etcd-client`
//!    (puts of the very bytes the API server stored for a pod; prefix watches);
//! 3. **skiff embedded**: a fresh `skiff-apiserver` on its embedded redb store.
//!
//! Each side: (a) one watcher opened, a warm-up item created and seen, then N items created
//! with C creates in flight — the create calls give the throughput and the call latency, the
//! watcher the delivery latency (create call start → event received); (b) W watchers opened
//! over W/100 connections, a warm-up item seen by all, then M items created the same way —
//! per item, create call start → the event received by the last of the W watchers. The three
//! sides run R times (default 3), each time on fresh servers; each side reports its median run
//! by create throughput. Every process started is killed by pid when its guard drops, also on
//! error.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use futures::future::LocalBoxFuture;
use serde_json::json;
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::{Api, Client, ListParams};
use skiff_tests::{ApiServer, Backend, EtcdServer};
use tracing::info;

use super::Options;
use crate::apiload::{
    self, CREATE_CONCURRENCY, Names, Receipts, WATCHERS_PER_CONNECTION, deliveries,
    delivery_timeout,
};
use crate::host;
use crate::procfs;
use crate::report::{Measured, Role, Series, SuiteReport, fmt_ms};
use crate::stats::Summary;

pub const NAME: &str = "control-plane";
pub const TITLE: &str = "API server create throughput and watch fan-out, against etcd";

const NAMESPACE: &str = "default";
/// On every pod of the run (value: the run id).
pub(crate) const RUN_LABEL: &str = "skiff-perf-run";
/// On every pod of one batch (value: the batch); the watchers select on it.
const BATCH_LABEL: &str = "skiff-perf-batch";
/// Creates (or puts) of the throughput measurement.
const DEFAULT_CREATES: usize = 2000;
const QUICK_CREATES: usize = 50;
/// Creates (or puts) while the many watchers watch.
const DEFAULT_FANOUT_CREATES: usize = 500;
const QUICK_FANOUT_CREATES: usize = 10;
const DEFAULT_WATCHERS: usize = 1000;
const QUICK_WATCHERS: usize = 10;
/// Repetitions of the whole measurement; each side reports its median run.
const DEFAULT_RUNS: usize = 3;
const QUICK_RUNS: usize = 1;

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// The sizes of one run.
#[derive(Debug, Clone, Copy)]
struct ControlPlaneSizes {
    creates: usize,
    fanout_creates: usize,
    watchers: usize,
}

impl ControlPlaneSizes {
    fn of(opts: &Options) -> Result<ControlPlaneSizes> {
        let creates = opts.pods.unwrap_or(if opts.quick {
            QUICK_CREATES
        } else {
            DEFAULT_CREATES
        });
        let sizes = if opts.quick {
            ControlPlaneSizes {
                creates,
                fanout_creates: QUICK_FANOUT_CREATES,
                watchers: QUICK_WATCHERS,
            }
        } else {
            ControlPlaneSizes {
                creates,
                fanout_creates: DEFAULT_FANOUT_CREATES,
                watchers: DEFAULT_WATCHERS,
            }
        };
        if sizes.creates == 0 {
            bail!("--pods must be at least 1");
        }
        Ok(sizes)
    }
}

/// What one side is: an API server (on some store), or etcd itself.
enum Target {
    Api {
        config: Box<skiff_client::ClientConfig>,
        pods: Box<Api<Pod>>,
        run_id: String,
    },
    Etcd {
        endpoint: String,
        client: Box<etcd_client::Client>,
        /// Keys are `<prefix><batch>/<name>`.
        prefix: String,
        /// The bytes put under every key.
        value: Vec<u8>,
    },
}

/// One item to create.
enum Item {
    Pod(Box<Pod>),
    Kv(String, Vec<u8>),
}

impl Target {
    fn items(&self, batch: &str, names: &[String]) -> Result<Vec<Item>> {
        names
            .iter()
            .map(|name| match self {
                Target::Api { run_id, .. } => {
                    Ok(Item::Pod(Box::new(bench_pod(name, run_id, batch)?)))
                }
                Target::Etcd { prefix, value, .. } => {
                    Ok(Item::Kv(format!("{prefix}{batch}/{name}"), value.clone()))
                }
            })
            .collect()
    }

    async fn create(&self, item: Item) -> Result<()> {
        match (self, item) {
            (Target::Api { pods, .. }, Item::Pod(p)) => {
                pods.create(&p)
                    .await
                    .with_context(|| format!("creating pod {}", p.name()))?;
            }
            (Target::Etcd { client, .. }, Item::Kv(key, value)) => {
                client
                    .kv_client()
                    .put(key.clone(), value, None)
                    .await
                    .with_context(|| format!("etcd put {key}"))?;
            }
            _ => bail!("an item of the other side"),
        }
        Ok(())
    }

    /// `count` watchers of batch `batch`, [`WATCHERS_PER_CONNECTION`] per connection (none
    /// shared with the creates).
    async fn watch(&self, batch: &str, count: usize) -> Result<Vec<Names>> {
        match self {
            Target::Api { config, .. } => {
                let lp = ListParams::default().labels(&format!("{BATCH_LABEL}={batch}"));
                apiload::api_watchers::<Pod>(config, NAMESPACE, &lp, count).await
            }
            Target::Etcd {
                endpoint, prefix, ..
            } => {
                let key_prefix = format!("{prefix}{batch}/");
                let mut streams = Vec::with_capacity(count);
                let mut client = None;
                for i in 0..count {
                    if i % WATCHERS_PER_CONNECTION == 0 {
                        client = Some(
                            etcd_client::Client::connect([endpoint.as_str()], None)
                                .await
                                .context("connecting a watcher to etcd")?,
                        );
                    }
                    let c = client.as_mut().context("no watcher connection")?;
                    let stream = c
                        .watch(
                            key_prefix.clone(),
                            Some(etcd_client::WatchOptions::new().with_prefix()),
                        )
                        .await
                        .context("starting an etcd watch")?;
                    let strip = key_prefix.clone();
                    streams.push(
                        stream
                            .map(move |resp| {
                                let resp = resp.context("etcd watch")?;
                                Ok(resp
                                    .events()
                                    .iter()
                                    .filter(|e| e.event_type() == etcd_client::EventType::Put)
                                    .filter_map(|e| e.kv())
                                    .filter(|kv| kv.version() == 1)
                                    .filter_map(|kv| {
                                        let key = std::str::from_utf8(kv.key()).ok()?;
                                        Some(key.strip_prefix(&strip)?.to_string())
                                    })
                                    .collect())
                            })
                            .boxed(),
                    );
                }
                Ok(streams)
            }
        }
    }
}

/// An unbound pod (nothing acts on it: no scheduler, no node), labelled with run and batch.
pub(crate) fn bench_pod(name: &str, run_id: &str, batch: &str) -> Result<Pod> {
    skiff_api::manifest::decode(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {RUN_LABEL: run_id, BATCH_LABEL: batch}},
        "spec": {
            "containers": [{"name": "main", "image": "host", "command": ["sleep", "3600"]}],
        },
    }))
    .context("building the benchmark pod")
}

/// What one side measured.
#[derive(Debug, Clone)]
struct ControlPlaneSide {
    /// Create call durations, in create order.
    create_calls: Vec<Duration>,
    /// First create call start → last create call end.
    create_wall: Duration,
    /// Create call start → the one watcher received the event.
    one_watcher: Vec<Duration>,
    one_wall: Duration,
    /// Per item: create call start → the last of the many watchers received the event.
    fanout_last: Vec<Duration>,
    /// First create call start → last delivery.
    fanout_wall: Duration,
    /// Over every (item, watcher) pair: create call start → received.
    fanout_pairs: Option<Summary>,
    /// CPU seconds of the side's server processes (API server and etcd, or etcd) during
    /// the side's measurements, and their RSS afterwards.
    cpu: Duration,
    rss_bytes: u64,
}

impl ControlPlaneSide {
    fn create_throughput(&self) -> f64 {
        self.create_calls.len() as f64 / self.create_wall.as_secs_f64().max(f64::EPSILON)
    }
}

/// Creates `items` with [`CREATE_CONCURRENCY`] in flight; (call start, call end) per item.
async fn create_all(target: &Target, items: Vec<Item>) -> Result<Vec<(Instant, Instant)>> {
    apiload::timed_all(items, CREATE_CONCURRENCY, |item| target.create(item)).await
}

/// One measurement: `watchers` watchers, a warm-up item, then `count` items.
async fn watched_creates(
    target: &Target,
    batch: &str,
    watchers: usize,
    count: usize,
) -> Result<(Vec<String>, Vec<(Instant, Instant)>, Receipts)> {
    let mut receipts = Receipts::spawn(target.watch(batch, watchers).await?);
    let warm = vec![format!("{batch}-warmup")];
    create_all(target, target.items(batch, &warm)?).await?;
    receipts
        .wait_all(&warm, Instant::now() + delivery_timeout(watchers))
        .await
        .context("the warm-up item")?;
    let names: Vec<String> = (0..count).map(|i| format!("{batch}-{i}")).collect();
    let items = target.items(batch, &names)?;
    let starts = create_all(target, items).await?;
    receipts
        .wait_all(&names, Instant::now() + delivery_timeout(count * watchers))
        .await
        .with_context(|| format!("{count} items to {watchers} watchers"))?;
    Ok((names, starts, receipts))
}

/// Measures one side; `pids` are its server processes (for their CPU time).
async fn measure_side(
    target: &Target,
    tag: &str,
    sizes: ControlPlaneSizes,
    pids: &[u32],
) -> Result<ControlPlaneSide> {
    let cpu0 = procfs::cpu_of(pids)?;
    info!(
        side = tag,
        creates = sizes.creates,
        "creates with 1 watcher"
    );
    let (names, starts, receipts) =
        watched_creates(target, &format!("{tag}-one"), 1, sizes.creates).await?;
    let create_calls = starts.iter().map(|(s, e)| *e - *s).collect();
    let create_wall = starts
        .iter()
        .map(|s| s.1)
        .max()
        .context("no creates")?
        .saturating_duration_since(starts[0].0);
    let (one_watcher, _, last) = deliveries(&names, &starts, &receipts.got)?;
    let one_wall = last.saturating_duration_since(starts[0].0);
    drop(receipts);

    info!(
        side = tag,
        creates = sizes.fanout_creates,
        watchers = sizes.watchers,
        "creates with many watchers"
    );
    let (names, starts, receipts) = watched_creates(
        target,
        &format!("{tag}-many"),
        sizes.watchers,
        sizes.fanout_creates,
    )
    .await?;
    let (fanout_last, pairs, last) = deliveries(&names, &starts, &receipts.got)?;
    drop(receipts);
    let cpu = procfs::cpu_of(pids)?.saturating_sub(cpu0);
    let rss_bytes = pids
        .iter()
        .map(|p| procfs::usage(*p).map(|u| u.rss_bytes))
        .sum::<Result<u64>>()?;
    Ok(ControlPlaneSide {
        create_calls,
        create_wall,
        one_watcher,
        one_wall,
        fanout_last,
        fanout_wall: last.saturating_duration_since(starts[0].0),
        fanout_pairs: Summary::of(&pairs),
        cpu,
        rss_bytes,
    })
}

async fn api_target(server: &ApiServer, run_id: &str) -> Result<Target> {
    let config = server.client_config();
    let client = Client::connect_with(&config)
        .await
        .context("connecting to the API server")?;
    Ok(Target::Api {
        config: Box::new(config),
        pods: Box::new(client.namespaced::<Pod>(NAMESPACE)),
        run_id: run_id.to_string(),
    })
}

async fn measure(opts: &Options) -> Result<SuiteReport> {
    let bin_dir = host::check_binaries(&["skiff-apiserver"])?;
    let sizes = ControlPlaneSizes::of(opts)?;
    let runs = opts
        .runs
        .unwrap_or(if opts.quick { QUICK_RUNS } else { DEFAULT_RUNS });
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let started_at = chrono::Utc::now();
    let mut env = host::environment();
    let mut all: [Vec<ControlPlaneSide>; 3] = Default::default();
    let mut value_bytes = 0;
    for r in 0..runs {
        info!(run = r + 1, runs, "control-plane run");
        let (sides, bytes) = measure_once(&bin_dir, sizes, &mut env)
            .await
            .with_context(|| format!("run {}", r + 1))?;
        value_bytes = bytes;
        for (list, side) in all.iter_mut().zip(sides) {
            list.push(side);
        }
    }
    report(opts, started_at, env, sizes, value_bytes, &all)
}

/// The run with the median create throughput (the lower middle one of an even count).
fn median_run(runs: &[ControlPlaneSide]) -> Option<&ControlPlaneSide> {
    crate::stats::median_by(runs, ControlPlaneSide::create_throughput)
}

/// One run of the three sides, each on fresh servers; also the size of the stored pod.
async fn measure_once(
    bin_dir: &std::path::Path,
    sizes: ControlPlaneSizes,
    env: &mut crate::report::Environment,
) -> Result<([ControlPlaneSide; 3], usize)> {
    let run_id = skiff_tests::unique();

    // 1. The API server on etcd.
    info!(
        suite = NAME,
        ?sizes,
        "starting etcd and the API server on it"
    );
    let etcd = EtcdServer::start().map_err(|e| anyhow::anyhow!("starting etcd: {}", e.0))?;
    let etcd_pid = etcd.pid().context("etcd is not running")?;
    let server = ApiServer::start(Backend::Etcd(etcd.endpoint.clone()));
    let (api_pid, exe) = host::apiserver_pid(&server, bin_dir)?;
    env.binaries.insert("skiff-apiserver".into(), exe);
    if let Ok(exe) = std::fs::read_link(format!("/proc/{etcd_pid}/exe")) {
        env.binaries
            .insert("etcd".into(), exe.display().to_string());
    }
    let target = api_target(&server, &run_id).await?;
    let on_etcd = measure_side(
        &target,
        &format!("{run_id}-api-etcd"),
        sizes,
        &[api_pid, etcd_pid],
    )
    .await
    .context("skiff-apiserver on etcd")?;
    drop(target);

    // The bytes the API server stored for one pod: what the raw puts write.
    let stored_key = format!("/registry/pods/{NAMESPACE}/{run_id}-api-etcd-one-0");
    let mut kv = etcd_client::Client::connect([etcd.endpoint.as_str()], None)
        .await
        .context("connecting to etcd")?;
    let value = kv
        .get(stored_key.clone(), None)
        .await
        .context("reading a stored pod from etcd")?
        .kvs()
        .first()
        .map(|kv| kv.value().to_vec())
        .with_context(|| format!("{stored_key} not in etcd"))?;
    drop(server);

    // 2. etcd alone.
    info!("etcd directly");
    let target = Target::Etcd {
        endpoint: etcd.endpoint.clone(),
        client: Box::new(kv),
        prefix: format!("/skiff-bench/{run_id}/"),
        value: value.clone(),
    };
    let raw = measure_side(&target, &format!("{run_id}-etcd"), sizes, &[etcd_pid])
        .await
        .context("etcd")?;
    drop(target);
    drop(etcd);

    // 3. The API server on its embedded store.
    info!("the API server on its embedded store");
    let server = ApiServer::start(Backend::Embedded);
    let (api_pid, _) = host::apiserver_pid(&server, bin_dir)?;
    let target = api_target(&server, &run_id).await?;
    let embedded = measure_side(&target, &format!("{run_id}-api-emb"), sizes, &[api_pid])
        .await
        .context("skiff-apiserver on the embedded store")?;
    drop(target);
    drop(server);

    Ok(([on_etcd, raw, embedded], value.len()))
}

/// The series of the three sides, the notes and the details.
fn report(
    opts: &Options,
    started_at: chrono::DateTime<chrono::Utc>,
    env: crate::report::Environment,
    sizes: ControlPlaneSizes,
    value_bytes: usize,
    all: &[Vec<ControlPlaneSide>; 3],
) -> Result<SuiteReport> {
    let [on_etcd, raw, embedded] = [0, 1, 2].map(|i| median_run(&all[i]));
    let (Some(on_etcd), Some(raw), Some(embedded)) = (on_etcd, raw, embedded) else {
        bail!("no runs");
    };
    let runs = all[0].len();
    let w = sizes.watchers;
    let (n, m) = (sizes.creates, sizes.fanout_creates);
    let create =
        |name: &str, role, measures: &str, s: &ControlPlaneSide, group: &str| -> Result<Series> {
            Ok(
                Series::new(name, role, measures, &s.create_calls, Some(s.create_wall))?
                    .with_throughput(s.create_calls.len(), s.create_wall)
                    .in_group(group),
            )
        };
    let one =
        |name: &str, role, measures: &str, s: &ControlPlaneSide, group: &str| -> Result<Series> {
            Ok(
                Series::new(name, role, measures, &s.one_watcher, Some(s.one_wall))?
                    .in_group(group),
            )
        };
    let many =
        |name: &str, role, measures: &str, s: &ControlPlaneSide, group: &str| -> Result<Series> {
            Ok(
                Series::new(name, role, measures, &s.fanout_last, Some(s.fanout_wall))?
                    .in_group(group),
            )
        };
    let api_create = format!(
        "Pod create call through skiff-client (just before the gRPC call → its response, the \
         pod stored), {n} creates with {CREATE_CONCURRENCY} in flight; pods/s over first call \
         start → last response"
    );
    let put = format!(
        "etcd put through etcd-client of the bytes the API server stored for one pod \
         ({value_bytes} B) under a fresh key, {n} puts with {CREATE_CONCURRENCY} in flight; \
         puts/s over first call start → last response: etcd's limit for the API server's \
         writes"
    );
    let api_one = "create call start → the ADDED event received by one watcher (skiff-client \
                   Api::watch on the batch's label, its own connection, the pod decoded), \
                   during the creates above";
    let etcd_one = "put call start → the put event received by one etcd-client prefix watch \
                    (its own connection), during the puts above";
    let api_many = format!(
        "{w} watchers ({WATCHERS_PER_CONNECTION} per connection) of the batch's label, then \
         {m} creates with {CREATE_CONCURRENCY} in flight: per pod, create call start → the \
         ADDED event received by the last of the {w} watchers"
    );
    let etcd_many = format!(
        "{w} etcd-client prefix watches ({WATCHERS_PER_CONNECTION} per connection), then {m} \
         puts with {CREATE_CONCURRENCY} in flight: per key, put call start → the event \
         received by the last of the {w} watches"
    );
    let g_create = "API create vs etcd put".to_string();
    let g_one = "watch, 1 watcher".to_string();
    let g_many = format!("watch, {w} watchers");
    let g_emb = "embedded vs etcd".to_string();
    let g_emb_one = "embedded vs etcd · watch, 1 watcher".to_string();
    let g_emb_many = format!("embedded vs etcd · watch, {w} watchers");
    let series = vec![
        create(
            "skiff API create (etcd)",
            Role::Skiff,
            &api_create,
            on_etcd,
            &g_create,
        )?,
        create("etcd put", Role::Baseline, &put, raw, &g_create)?,
        one("skiff watch (etcd)", Role::Skiff, api_one, on_etcd, &g_one)?,
        one("etcd watch", Role::Baseline, etcd_one, raw, &g_one)?,
        many(
            "skiff watch (etcd)",
            Role::Skiff,
            &api_many,
            on_etcd,
            &g_many,
        )?,
        many("etcd watch", Role::Baseline, &etcd_many, raw, &g_many)?,
        create(
            "skiff API create (embedded)",
            Role::Skiff,
            &api_create,
            embedded,
            &g_emb,
        )?,
        create(
            "skiff API create (etcd)",
            Role::Baseline,
            &api_create,
            on_etcd,
            &g_emb,
        )?,
        one(
            "skiff watch (embedded)",
            Role::Skiff,
            api_one,
            embedded,
            &g_emb_one,
        )?,
        one(
            "skiff watch (etcd)",
            Role::Baseline,
            api_one,
            on_etcd,
            &g_emb_one,
        )?,
        many(
            "skiff watch (embedded)",
            Role::Skiff,
            &api_many,
            embedded,
            &g_emb_many,
        )?,
        many(
            "skiff watch (etcd)",
            Role::Baseline,
            &api_many,
            on_etcd,
            &g_emb_many,
        )?,
    ];

    let sides = [
        ("skiff-apiserver on etcd", on_etcd, "API server + etcd"),
        ("etcd alone", raw, "etcd"),
        ("skiff-apiserver embedded", embedded, "API server"),
    ];
    let mut notes = vec![
        "All series ran in this one run on this machine, one side after the other: the API \
         server on a throwaway etcd; then that etcd alone (the API server stopped) driven with \
         etcd-client; then a fresh API server on its embedded redb store. The bench, the \
         servers and the watchers share the machine's CPUs."
            .to_string(),
        format!(
            "Each side: one watcher opened, a warm-up item created and seen, then {n} items \
             (throughput, call latency, 1-watcher delivery); then {w} watchers opened, a \
             warm-up item seen by all of them, then {m} items (fan-out). Watchers never share \
             a connection with the creates. Skiff's watchers decode every pod (the typed \
             client); etcd's get the raw value bytes."
        ),
        format!(
            "The whole measurement ran {runs} time(s), each on fresh servers; each side's \
             series come from its median run by create throughput (every run below and in \
             the JSON's details.runs)."
        ),
        "Roles: in the first three groups the API server on etcd is Skiff and etcd alone the \
         baseline (the limit of an API server on etcd); in the \"embedded vs etcd\" groups the \
         API server on its embedded store is Skiff and the same API server on etcd the \
         baseline. Percentiles are nearest-rank."
            .into(),
    ];
    let mut details = BTreeMap::new();
    let mut per_run = Vec::new();
    for (i, (name, _, _)) in sides.iter().enumerate() {
        let line: Vec<String> = all[i]
            .iter()
            .enumerate()
            .map(|(r, s)| {
                let fan = Summary::of(&s.fanout_last);
                per_run.push(json!({
                    "side": name,
                    "run": r + 1,
                    "creates_per_s": s.create_throughput().round(),
                    "fanout_last_p50_ms": fan.map(|f| (f.p50 * 100.0).round() / 100.0),
                    "fanout_last_p99_ms": fan.map(|f| (f.p99 * 100.0).round() / 100.0),
                }));
                format!(
                    "run {}: {:.0}/s, {w}-watcher fan-out p50 {} ms",
                    r + 1,
                    s.create_throughput(),
                    fan.map_or_else(|| "–".into(), |f| fmt_ms(f.p50))
                )
            })
            .collect();
        notes.push(format!("{name}, every run: {}.", line.join("; ")));
    }
    details.insert("runs".to_string(), json!(per_run));
    for (name, s, procs) in sides {
        if let Some(p) = &s.fanout_pairs {
            notes.push(format!(
                "{name}: every one of the {} (item, watcher) deliveries with {w} watchers: p50 \
                 {} ms, p99 {} ms; {:.0} deliveries/s over the fan-out wall time.",
                p.n,
                fmt_ms(p.p50),
                fmt_ms(p.p99),
                p.n as f64 / s.fanout_wall.as_secs_f64().max(f64::EPSILON)
            ));
        }
        notes.push(format!(
            "{name}: the server processes ({procs}) used {:.2} CPU s for the side's {} creates \
             and their deliveries ({:.2} ms CPU per create); RSS {} MiB afterwards.",
            s.cpu.as_secs_f64(),
            n + m + 2,
            s.cpu.as_secs_f64() * 1e3 / (n + m + 2) as f64,
            procfs::mib(s.rss_bytes)
        ));
        details.insert(
            name.to_string(),
            json!({
                "fanout_pairs": s.fanout_pairs,
                "server_cpu_s": s.cpu.as_secs_f64(),
                "server_rss_mib": procfs::mib(s.rss_bytes),
                "server_processes": procs,
            }),
        );
    }
    let params = BTreeMap::from([
        ("creates".to_string(), json!(n)),
        ("fanout_creates".to_string(), json!(m)),
        ("watchers".to_string(), json!(w)),
        ("create_concurrency".to_string(), json!(CREATE_CONCURRENCY)),
        ("runs".to_string(), json!(runs)),
        (
            "watchers_per_connection".to_string(),
            json!(WATCHERS_PER_CONNECTION),
        ),
        ("stored_pod_bytes".to_string(), json!(value_bytes)),
        (
            "cluster".to_string(),
            json!(
                "etcd 3.4 (one member, loopback), skiff-apiserver on it; skiff-apiserver on \
                   its embedded redb store"
            ),
        ),
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

    fn side(creates: usize) -> ControlPlaneSide {
        ControlPlaneSide {
            create_calls: vec![Duration::from_millis(1); creates],
            create_wall: Duration::from_secs(1),
            one_watcher: vec![Duration::from_millis(1)],
            one_wall: Duration::from_secs(1),
            fanout_last: vec![Duration::from_millis(1)],
            fanout_wall: Duration::from_secs(1),
            fanout_pairs: None,
            cpu: Duration::ZERO,
            rss_bytes: 0,
        }
    }

    #[test]
    fn median_run_by_create_throughput() {
        let runs = vec![side(30), side(10), side(20)];
        assert_eq!(median_run(&runs).unwrap().create_calls.len(), 20);
        assert_eq!(median_run(&runs[..2]).unwrap().create_calls.len(), 10);
        assert!(median_run(&[]).is_none());
    }

    #[test]
    fn sizes_default_and_quick() {
        let full = ControlPlaneSizes::of(&Options::default()).unwrap();
        assert_eq!(
            (full.creates, full.fanout_creates, full.watchers),
            (2000, 500, 1000)
        );
        let quick = ControlPlaneSizes::of(&Options {
            quick: true,
            ..Default::default()
        })
        .unwrap();
        assert_eq!((quick.creates, quick.watchers), (50, 10));
        assert!(
            ControlPlaneSizes::of(&Options {
                pods: Some(0),
                ..Default::default()
            })
            .is_err()
        );
    }
}
