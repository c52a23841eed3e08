//! `rest-api`: the API server's Kubernetes REST API (JSON over HTTP/1.1, as kubectl and
//! client libraries speak it) against its gRPC API (`skiff-client`, Skiff's own components)
//! and against raw etcd, in one run, on one etcd:
//!
//! 1. **creates**: the same object created C at a time ([`CREATE_CONCURRENCY`], the
//!    control-plane suite's) through `POST /api/v1/namespaces/{ns}/endpoints` on C keep-alive
//!    HTTP/1.1 connections, through the gRPC `Create` call on one HTTP/2 connection, and as
//!    etcd puts of the bytes the API server stored for it;
//! 2. **lists**: N objects of one namespace listed whole through REST (also in pages of
//!    `limit`, following `continue`, as client-go's informers do), through gRPC, and as one
//!    etcd range read of their keys;
//! 3. **watch fan-out**: W watchers through REST (`?watch=true`, one HTTP/1.1 connection
//!    each) or through gRPC (100 streams per HTTP/2 connection), each on a fresh API server;
//!    per write, the write call start → the event decoded by the last of the W watchers,
//!    one write at a time; and the API server's RSS before and with the watchers.
//!
//! Skiff serves no ConfigMap kind, so the object is an `Endpoints` (core/v1, like a ConfigMap
//! only metadata and data that nothing acts on) whose annotations carry a ConfigMap-sized
//! payload. Every client decodes what it receives into the typed object (REST clients from
//! JSON, as client-go and kube-rs do; the gRPC client from protobuf); etcd's get raw bytes.
//! The whole measurement runs R times (default 3); create throughput reports each path's
//! median run, lists and watch deliveries pool every run's samples. REST and gRPC take turns
//! going first. Every process started is killed by pid when its guard drops, also on error.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use futures::{StreamExt, TryStreamExt};
use hyper::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use skiff_api::Resource;
use skiff_api::api::{Endpoints, Namespace};
use skiff_client::{Api, Client, ListParams};
use skiff_tests::{ApiServer, Backend, EtcdServer};
use tracing::info;

use super::Options;
use crate::apiload::{
    self, CREATE_CONCURRENCY, Names, Receipts, WATCHERS_PER_CONNECTION, deliveries,
    delivery_timeout,
};
use crate::http1::{Conn, Pool, Tls};
use crate::report::{Measured, Role, Series, SuiteReport, fmt_ms, fmt_share};
use crate::stats::Summary;
use crate::{host, procfs};

pub const NAME: &str = "rest-api";
pub const TITLE: &str = "Kubernetes REST API (JSON, HTTP/1.1) against gRPC and etcd";

/// The kind every path creates, lists and watches (see the module docs).
const RESOURCE: &str = "endpoints";
/// Where the API server stores it; the raw etcd puts use [`ETCD_PREFIX`], as long, outside
/// the API server's watch.
const REGISTRY_PREFIX: &str = "/registry/endpoints/";
const ETCD_PREFIX: &str = "/skiff-bench/endpts/";
/// On every object of the run (value: the run id).
const RUN_LABEL: &str = "skiff-perf-run";
/// The payload: this many annotations of this many bytes (a small ConfigMap's data).
const DATA_KEYS: usize = 4;
const DATA_VALUE_BYTES: usize = 256;
/// The create target of the REST API: this share of the gRPC path's creates/s.
const TARGET_SHARE: f64 = 0.8;

const DEFAULT_CREATES: usize = 2000;
const QUICK_CREATES: usize = 50;
const DEFAULT_LIST_OBJECTS: usize = 1000;
const QUICK_LIST_OBJECTS: usize = 20;
/// Lists of each kind per run.
const DEFAULT_LISTS: usize = 30;
const QUICK_LISTS: usize = 3;
/// `limit` of the paged REST list: client-go's informer page size (8 with --quick, so it
/// pages too).
const DEFAULT_PAGE: usize = 500;
const QUICK_PAGE: usize = 8;
const DEFAULT_WATCHERS: usize = 1000;
const QUICK_WATCHERS: usize = 10;
/// Writes (one at a time) seen by every watcher, per run and protocol.
const DEFAULT_WRITES: usize = 50;
const QUICK_WRITES: usize = 3;
const DEFAULT_RUNS: usize = 3;
const QUICK_RUNS: usize = 1;
/// REST watch connections being opened at once.
const CONNECTS_IN_FLIGHT: usize = 64;
/// Open files the bench and the API server need besides one per REST watcher.
const FD_MARGIN: u64 = 256;

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// The sizes of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RestSizes {
    creates: usize,
    list_objects: usize,
    lists: usize,
    page: usize,
    watchers: usize,
    writes: usize,
}

impl RestSizes {
    fn of(opts: &Options) -> Result<RestSizes> {
        let q = opts.quick;
        let sizes = RestSizes {
            creates: opts
                .pods
                .unwrap_or(if q { QUICK_CREATES } else { DEFAULT_CREATES }),
            list_objects: if q {
                QUICK_LIST_OBJECTS
            } else {
                DEFAULT_LIST_OBJECTS
            },
            lists: if q { QUICK_LISTS } else { DEFAULT_LISTS },
            page: if q { QUICK_PAGE } else { DEFAULT_PAGE },
            watchers: if q { QUICK_WATCHERS } else { DEFAULT_WATCHERS },
            writes: if q { QUICK_WRITES } else { DEFAULT_WRITES },
        };
        if sizes.creates == 0 {
            bail!("--pods must be at least 1");
        }
        Ok(sizes)
    }
}

/// The two front ends of the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Front {
    Rest,
    Grpc,
}

impl Front {
    fn name(self) -> &'static str {
        match self {
            Front::Rest => "REST",
            Front::Grpc => "gRPC",
        }
    }

    /// The namespace suffix of its creates and of its watch; the same length for both, so
    /// keys and objects are the same size.
    fn tags(self) -> (&'static str, &'static str) {
        match self {
            Front::Rest => ("rest", "wrst"),
            Front::Grpc => ("grpc", "wgrp"),
        }
    }
}

/// One run's creates on one path.
#[derive(Debug, Clone)]
struct Creates {
    /// Call durations, in create order.
    calls: Vec<Duration>,
    /// First call start → last call end.
    wall: Duration,
    /// CPU of the API server, etcd and the bench (the clients) during the creates.
    api_cpu: Duration,
    etcd_cpu: Duration,
    bench_cpu: Duration,
}

impl Creates {
    fn throughput(&self) -> f64 {
        self.calls.len() as f64 / self.wall.as_secs_f64().max(f64::EPSILON)
    }
}

/// One run's lists: each call's duration per kind of list.
#[derive(Debug, Clone, Default)]
struct Lists {
    rest: Vec<Duration>,
    rest_paged: Vec<Duration>,
    grpc: Vec<Duration>,
    etcd: Vec<Duration>,
    /// Size of the REST list's answer, and pages of the paged one.
    rest_bytes: usize,
    pages: usize,
}

/// One run's watch fan-out through one front end.
#[derive(Debug, Clone)]
struct Fanout {
    /// Per write: write call start → the last watcher decoded the event.
    last: Vec<Duration>,
    /// Every (write, watcher) pair.
    pairs: Vec<Duration>,
    /// Sum over the writes of write call start → last delivery.
    wall: Duration,
    /// Opening every watch, until all saw a warm-up write.
    open: Duration,
    rss_before: u64,
    rss_open: u64,
    /// CPU of the API server during the writes and their deliveries.
    api_cpu: Duration,
}

/// What one run measured.
#[derive(Debug, Clone)]
struct RestRun {
    /// The front end that created first.
    first: Front,
    rest: Creates,
    grpc: Creates,
    etcd: Creates,
    lists: Lists,
    rest_watch: Fanout,
    grpc_watch: Fanout,
}

/// Sizes of the object on each wire, in bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Bytesizes {
    json: usize,
    proto: usize,
    stored: usize,
}

/// The name of the `i`th object (fixed width, so every object is the same size).
fn object_name(i: usize) -> String {
    format!("o-{i:05}")
}

/// The payload: [`DATA_KEYS`] annotations of [`DATA_VALUE_BYTES`] printable bytes.
fn payload() -> Value {
    let value: String = (0..DATA_VALUE_BYTES)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    (0..DATA_KEYS)
        .map(|k| (format!("skiff-perf/data-{k}"), Value::from(value.clone())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The benchmark object as Kubernetes JSON.
fn object_json(name: &str, run_id: &str, payload: &Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {
            "name": name,
            "labels": {RUN_LABEL: run_id},
            "annotations": payload,
        },
    })
}

fn typed(value: Value) -> Result<Endpoints> {
    skiff_api::manifest::decode(value).context("building the benchmark object")
}

fn collection(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/{RESOURCE}")
}

/// A failed answer as an error.
fn refused(what: &str, status: StatusCode, body: &[u8]) -> anyhow::Error {
    let text = String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned();
    anyhow::anyhow!("{what}: {status}: {text}")
}

/// A list answer, decoded as a typed client does.
#[derive(Debug, Deserialize)]
struct ListAnswer {
    metadata: ListMeta,
    items: Vec<Endpoints>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: String,
    #[serde(default, rename = "continue")]
    cont: String,
}

/// One line of a watch answer.
#[derive(Debug, Deserialize)]
struct WatchLine<T> {
    #[serde(rename = "type")]
    kind: String,
    object: T,
}

/// The names of the ADDED objects of one watch line (decoded into the typed object); an
/// ERROR event or an undecodable line fails.
fn watch_names(line: &[u8]) -> Result<Vec<String>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    match serde_json::from_slice::<WatchLine<Endpoints>>(line) {
        Ok(ev) if ev.kind == "ADDED" => Ok(vec![ev.object.name().to_string()]),
        Ok(_) => Ok(Vec::new()),
        Err(e) => match serde_json::from_slice::<WatchLine<Value>>(line) {
            Ok(ev) if ev.kind == "ERROR" => bail!("watch ERROR event: {}", ev.object),
            _ => Err(anyhow::Error::new(e).context(format!(
                "decoding the watch line {}",
                String::from_utf8_lossy(&line[..line.len().min(300)])
            ))),
        },
    }
}

/// Query-escapes `s` (RFC 3986 unreserved characters kept).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `POST` of `obj` into `ns`; the created object decoded.
async fn rest_create(pool: &Pool, ns: &str, obj: &Value) -> Result<()> {
    let path = collection(ns);
    let body = serde_json::to_vec(obj).context("encoding the object")?;
    let (status, answer) = pool.request(Method::POST, &path, Some(body.into())).await?;
    if status != StatusCode::CREATED {
        return Err(refused(&format!("POST {path}"), status, &answer));
    }
    let created: Endpoints =
        serde_json::from_slice(&answer).context("decoding the created object")?;
    if created
        .metadata
        .as_ref()
        .is_none_or(|m| m.resource_version.is_empty())
    {
        bail!("POST {path}: the answer has no resourceVersion");
    }
    Ok(())
}

/// One `GET` of the collection with `query`; the decoded answer and its size.
async fn rest_list(pool: &Pool, ns: &str, query: &str) -> Result<(ListAnswer, usize)> {
    let path = format!("{}{query}", collection(ns));
    let (status, answer) = pool.request(Method::GET, &path, None).await?;
    if status != StatusCode::OK {
        return Err(refused(&format!("GET {path}"), status, &answer));
    }
    let list = serde_json::from_slice(&answer).context("decoding the list")?;
    Ok((list, answer.len()))
}

/// Every object of `ns` in pages of `page`, following `continue`; (objects, pages).
async fn rest_list_paged(pool: &Pool, ns: &str, page: usize, expect: usize) -> Result<usize> {
    let mut items = 0;
    let mut cont = String::new();
    // One page more than needed, to see the end.
    for pages in 1..=expect / page.max(1) + 2 {
        let query = if cont.is_empty() {
            format!("?limit={page}")
        } else {
            format!("?limit={page}&continue={}", escape(&cont))
        };
        let (list, _) = rest_list(pool, ns, &query).await?;
        items += list.items.len();
        if list.metadata.cont.is_empty() {
            if items != expect {
                bail!("the paged list returned {items} objects, not {expect}");
            }
            return Ok(pages);
        }
        cont = list.metadata.cont;
    }
    bail!("the paged list of {expect} objects did not end")
}

/// Creates namespace `name` through gRPC.
async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let ns: Namespace = skiff_api::manifest::decode(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name},
    }))
    .context("building a namespace")?;
    client
        .cluster::<Namespace>()
        .create(&ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// CPU of `pid` now.
fn cpu(pid: u32) -> Result<Duration> {
    Ok(procfs::usage(pid)?.cpu)
}

/// What the create phases need of the API server and etcd.
struct Servers<'a> {
    api_pid: u32,
    etcd_pid: u32,
    pool: &'a Pool,
    client: &'a Client,
}

/// `n` creates through `front` into `ns` with [`CREATE_CONCURRENCY`] in flight, after one
/// unmeasured warm-up create.
async fn create_phase(
    s: &Servers<'_>,
    front: Front,
    ns: &str,
    run_id: &str,
    n: usize,
) -> Result<Creates> {
    let payload = payload();
    let objects: Vec<Value> = (0..n)
        .map(|i| object_json(&object_name(i), run_id, &payload))
        .collect();
    let warm = object_json("warmup", run_id, &payload);
    let api: Api<Endpoints> = s.client.namespaced(ns);
    let before = (cpu(s.api_pid)?, cpu(s.etcd_pid)?);
    let bench0 = cpu(std::process::id())?;
    let starts = match front {
        Front::Rest => {
            rest_create(s.pool, ns, &warm).await.context("warm-up")?;
            apiload::timed_all(objects, CREATE_CONCURRENCY, |o| async move {
                rest_create(s.pool, ns, &o).await
            })
            .await?
        }
        Front::Grpc => {
            api.create(&typed(warm)?).await.context("warm-up")?;
            let objects = objects.into_iter().map(typed).collect::<Result<Vec<_>>>()?;
            let api = &api;
            apiload::timed_all(objects, CREATE_CONCURRENCY, |o| async move {
                api.create(&o)
                    .await
                    .with_context(|| format!("creating {}", o.name()))?;
                Ok(())
            })
            .await?
        }
    };
    let bench_cpu = cpu(std::process::id())?.saturating_sub(bench0);
    creates_of(
        &starts,
        cpu(s.api_pid)?.saturating_sub(before.0),
        cpu(s.etcd_pid)?.saturating_sub(before.1),
        bench_cpu,
    )
}

fn creates_of(
    starts: &[(Instant, Instant)],
    api_cpu: Duration,
    etcd_cpu: Duration,
    bench_cpu: Duration,
) -> Result<Creates> {
    let (calls, wall) = crate::apiload::durations(starts)?;
    Ok(Creates {
        calls,
        wall,
        api_cpu,
        etcd_cpu,
        bench_cpu,
    })
}

/// `n` raw etcd puts of `value` under fresh keys below [`ETCD_PREFIX`]`{ns}/`.
async fn put_phase(
    kv: &etcd_client::Client,
    etcd_pid: u32,
    ns: &str,
    value: &[u8],
    n: usize,
) -> Result<Creates> {
    let put = |key: String| {
        let mut c = kv.kv_client();
        async move {
            c.put(key.clone(), value.to_vec(), None)
                .await
                .with_context(|| format!("etcd put {key}"))?;
            Ok(())
        }
    };
    put(format!("{ETCD_PREFIX}{ns}/warmup")).await?;
    let keys: Vec<String> = (0..n)
        .map(|i| format!("{ETCD_PREFIX}{ns}/{}", object_name(i)))
        .collect();
    let etcd0 = cpu(etcd_pid)?;
    let bench0 = cpu(std::process::id())?;
    let starts = apiload::timed_all(keys, CREATE_CONCURRENCY, put).await?;
    let bench_cpu = cpu(std::process::id())?.saturating_sub(bench0);
    creates_of(
        &starts,
        Duration::ZERO,
        cpu(etcd_pid)?.saturating_sub(etcd0),
        bench_cpu,
    )
}

/// The kinds of list, in the order they take turns.
#[derive(Debug, Clone, Copy)]
enum ListKind {
    Rest,
    RestPaged,
    Grpc,
    Etcd,
}

const LIST_KINDS: [ListKind; 4] = [
    ListKind::Rest,
    ListKind::RestPaged,
    ListKind::Grpc,
    ListKind::Etcd,
];

/// `sizes.list_objects` objects in `ns` (created through gRPC), then `sizes.lists` lists of
/// each kind, the kinds taking turns (after one unmeasured list of each).
async fn list_phase(
    s: &Servers<'_>,
    kv: &etcd_client::Client,
    ns: &str,
    run_id: &str,
    sizes: RestSizes,
) -> Result<Lists> {
    let n = sizes.list_objects;
    let payload = payload();
    let api: Api<Endpoints> = s.client.namespaced(ns);
    let objects = (0..n)
        .map(|i| typed(object_json(&object_name(i), run_id, &payload)))
        .collect::<Result<Vec<_>>>()?;
    let api_ref = &api;
    apiload::timed_all(objects, CREATE_CONCURRENCY, |o| async move {
        api_ref
            .create(&o)
            .await
            .context("creating the listed objects")?;
        Ok(())
    })
    .await?;
    let prefix = format!("{REGISTRY_PREFIX}{ns}/");
    let mut out = Lists::default();
    for round in 0..=sizes.lists {
        for k in 0..LIST_KINDS.len() {
            let kind = LIST_KINDS[(round + k) % LIST_KINDS.len()];
            let start = Instant::now();
            let got = match kind {
                ListKind::Rest => {
                    let (list, bytes) = rest_list(s.pool, ns, "").await?;
                    out.rest_bytes = bytes;
                    list.items.len()
                }
                ListKind::RestPaged => {
                    out.pages = rest_list_paged(s.pool, ns, sizes.page, n).await?;
                    n
                }
                ListKind::Grpc => api
                    .list(&ListParams::default())
                    .await
                    .context("gRPC list")?
                    .items
                    .len(),
                ListKind::Etcd => kv
                    .kv_client()
                    .get(
                        prefix.clone(),
                        Some(etcd_client::GetOptions::new().with_prefix()),
                    )
                    .await
                    .context("etcd range")?
                    .kvs()
                    .len(),
            };
            let took = start.elapsed();
            if got != n {
                bail!("{kind:?} list returned {got} objects, not {n}");
            }
            // Round 0 warms every path up.
            if round > 0 {
                match kind {
                    ListKind::Rest => out.rest.push(took),
                    ListKind::RestPaged => out.rest_paged.push(took),
                    ListKind::Grpc => out.grpc.push(took),
                    ListKind::Etcd => out.etcd.push(took),
                }
            }
        }
    }
    Ok(out)
}

/// `count` REST watchers of `ns`, one HTTP/1.1 connection each, from the revision of a list.
async fn rest_watchers(
    addr: SocketAddr,
    tls: Option<&Tls>,
    ns: &str,
    count: usize,
) -> Result<Vec<Names>> {
    let pool = Pool::connect(addr, tls, 1).await?;
    let (list, _) = rest_list(&pool, ns, "").await?;
    let rv = list.metadata.resource_version;
    if rv.is_empty() || !rv.bytes().all(|b| b.is_ascii_digit()) {
        bail!("the list's resourceVersion {rv:?} is not a revision");
    }
    let path = format!("{}?watch=true&resourceVersion={rv}", collection(ns));
    let path = &path;
    futures::stream::iter(0..count)
        .map(|_| async move {
            let lines = Conn::connect(addr, tls).await?.lines(path).await?;
            Ok::<Names, anyhow::Error>(lines.map(|l| watch_names(&l?)).boxed())
        })
        .buffered(CONNECTS_IN_FLIGHT)
        .try_collect()
        .await
        .context("opening the REST watches")
}

/// The watch fan-out through `front` on a fresh API server: `sizes.watchers` watchers of
/// `ns`, a warm-up write seen by all, then `sizes.writes` writes one at a time, each awaited
/// until every watcher decoded it. Writes go through gRPC for both front ends.
async fn fanout_phase(
    etcd: &EtcdServer,
    bin_dir: &std::path::Path,
    front: Front,
    ns: &str,
    run_id: &str,
    sizes: RestSizes,
) -> Result<Fanout> {
    let server = ApiServer::start(Backend::Etcd(etcd.endpoint.clone()));
    let (pid, _) = host::apiserver_pid(&server, bin_dir)?;
    let config = server.client_config();
    let tls = Tls::for_config(&config)?;
    let writer: Api<Endpoints> = Client::connect_with(&config)
        .await
        .context("connecting the writer")?
        .namespaced(ns);
    let payload = payload();
    let w = sizes.watchers;
    let rss_before = procfs::usage(pid)?.rss_bytes;
    let t0 = Instant::now();
    let streams = match front {
        Front::Rest => rest_watchers(server.addr, tls.as_ref(), ns, w).await?,
        Front::Grpc => {
            apiload::api_watchers::<Endpoints>(&config, ns, &ListParams::default(), w).await?
        }
    };
    let mut receipts = Receipts::spawn(streams);
    let warm = vec!["warmup".to_string()];
    writer
        .create(&typed(object_json("warmup", run_id, &payload))?)
        .await
        .context("the warm-up write")?;
    receipts
        .wait_all(&warm, Instant::now() + delivery_timeout(w))
        .await
        .context("the warm-up write's deliveries")?;
    let open = t0.elapsed();
    let rss_open = procfs::usage(pid)?.rss_bytes;
    let cpu0 = cpu(pid)?;
    let names: Vec<String> = (0..sizes.writes).map(object_name).collect();
    let mut starts = Vec::with_capacity(names.len());
    let mut wall = Duration::ZERO;
    for name in &names {
        let obj = typed(object_json(name, run_id, &payload))?;
        let start = Instant::now();
        writer
            .create(&obj)
            .await
            .with_context(|| format!("writing {name}"))?;
        let end = Instant::now();
        receipts
            .wait_all(std::slice::from_ref(name), end + delivery_timeout(w))
            .await
            .with_context(|| format!("{name} to {w} watchers"))?;
        wall += start.elapsed();
        starts.push((start, end));
    }
    let api_cpu = cpu(pid)?.saturating_sub(cpu0);
    let (last, pairs, _) = deliveries(&names, &starts, &receipts.got)?;
    drop(receipts);
    drop(server);
    Ok(Fanout {
        last,
        pairs,
        wall,
        open,
        rss_before,
        rss_open,
        api_cpu,
    })
}

async fn measure(opts: &Options) -> Result<SuiteReport> {
    let bin_dir = host::check_binaries(&["skiff-apiserver"])?;
    let sizes = RestSizes::of(opts)?;
    let runs = opts
        .runs
        .unwrap_or(if opts.quick { QUICK_RUNS } else { DEFAULT_RUNS });
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    // One connection per REST watcher, in the bench and in the API server (which inherits
    // the limit).
    if let Some(limit) = host::open_files_limit()
        && limit < sizes.watchers as u64 + FD_MARGIN
    {
        bail!(
            "{} REST watchers need about {} open files, the limit is {limit}: raise it \
             (`ulimit -n`)",
            sizes.watchers,
            sizes.watchers as u64 + FD_MARGIN
        );
    }
    let started_at = chrono::Utc::now();
    let mut env = host::environment();
    info!(suite = NAME, ?sizes, runs, "starting etcd");
    let etcd = EtcdServer::start().map_err(|e| anyhow::anyhow!("starting etcd: {}", e.0))?;
    let etcd_pid = etcd.pid().context("etcd is not running")?;
    if let Ok(exe) = std::fs::read_link(format!("/proc/{etcd_pid}/exe")) {
        env.binaries
            .insert("etcd".into(), exe.display().to_string());
    }
    let mut all = Vec::with_capacity(runs);
    let mut bytes = Bytesizes::default();
    for r in 0..runs {
        info!(run = r + 1, runs, "rest-api run");
        let (run, b) = measure_once(&etcd, etcd_pid, &bin_dir, sizes, r, &mut env)
            .await
            .with_context(|| format!("run {}", r + 1))?;
        all.push(run);
        bytes = b;
    }
    drop(etcd);
    report(opts, started_at, env, sizes, bytes, &all)
}

/// One run: creates and lists on one API server, then each front end's watch fan-out on a
/// fresh one; the front ends take turns going first (`r` even: REST).
async fn measure_once(
    etcd: &EtcdServer,
    etcd_pid: u32,
    bin_dir: &std::path::Path,
    sizes: RestSizes,
    r: usize,
    env: &mut crate::report::Environment,
) -> Result<(RestRun, Bytesizes)> {
    let run_id = skiff_tests::unique();
    let ns = |tag: &str| format!("perf-{run_id}-{tag}");
    let server = ApiServer::start(Backend::Etcd(etcd.endpoint.clone()));
    let (api_pid, exe) = host::apiserver_pid(&server, bin_dir)?;
    env.binaries.insert("skiff-apiserver".into(), exe);
    let config = server.client_config();
    let client = Client::connect_with(&config)
        .await
        .context("connecting to the API server")?;
    for tag in ["rest", "grpc", "list", "wrst", "wgrp"] {
        create_namespace(&client, &ns(tag)).await?;
    }
    let tls = Tls::for_config(&config)?;
    let pool = Pool::connect(server.addr, tls.as_ref(), CREATE_CONCURRENCY).await?;
    let servers = Servers {
        api_pid,
        etcd_pid,
        pool: &pool,
        client: &client,
    };
    let order = if r.is_multiple_of(2) {
        [Front::Rest, Front::Grpc]
    } else {
        [Front::Grpc, Front::Rest]
    };
    let mut created = BTreeMap::new();
    for front in order {
        info!(front = front.name(), creates = sizes.creates, "creates");
        let c = create_phase(&servers, front, &ns(front.tags().0), &run_id, sizes.creates)
            .await
            .with_context(|| format!("{} creates", front.name()))?;
        created.insert(front.name(), c);
    }

    // The bytes the API server stored for one object: what the raw puts write.
    let kv = etcd_client::Client::connect([etcd.endpoint.as_str()], None)
        .await
        .context("connecting to etcd")?;
    let stored_key = format!("{REGISTRY_PREFIX}{}/{}", ns("grpc"), object_name(0));
    let value = kv
        .kv_client()
        .get(stored_key.clone(), None)
        .await
        .context("reading a stored object from etcd")?
        .kvs()
        .first()
        .map(|kv| kv.value().to_vec())
        .with_context(|| format!("{stored_key} not in etcd"))?;
    info!(puts = sizes.creates, "etcd puts");
    let etcd_puts = put_phase(&kv, etcd_pid, &ns("etcd"), &value, sizes.creates)
        .await
        .context("etcd puts")?;

    info!(objects = sizes.list_objects, lists = sizes.lists, "lists");
    let lists = list_phase(&servers, &kv, &ns("list"), &run_id, sizes)
        .await
        .context("lists")?;
    let payload = payload();
    let sample = object_json(&object_name(0), &run_id, &payload);
    let bytes = Bytesizes {
        json: serde_json::to_vec(&sample).map(|v| v.len()).unwrap_or(0),
        proto: prost::Message::encoded_len(&typed(sample)?),
        stored: value.len(),
    };
    drop(pool);
    drop(server);

    let mut watched = BTreeMap::new();
    for front in order {
        info!(
            front = front.name(),
            watchers = sizes.watchers,
            writes = sizes.writes,
            "watch fan-out"
        );
        let f = fanout_phase(etcd, bin_dir, front, &ns(front.tags().1), &run_id, sizes)
            .await
            .with_context(|| format!("{} watch fan-out", front.name()))?;
        watched.insert(front.name(), f);
    }
    Ok((
        RestRun {
            first: order[0],
            rest: take(&mut created, Front::Rest)?,
            grpc: take(&mut created, Front::Grpc)?,
            etcd: etcd_puts,
            lists,
            rest_watch: take(&mut watched, Front::Rest)?,
            grpc_watch: take(&mut watched, Front::Grpc)?,
        },
        bytes,
    ))
}

/// The result of `front` in `m`.
fn take<T>(m: &mut BTreeMap<&str, T>, front: Front) -> Result<T> {
    m.remove(front.name())
        .with_context(|| format!("no {} result", front.name()))
}

/// The run with the median create throughput on one path (the lower middle one of an even
/// count).
fn median_creates(runs: &[RestRun], path: fn(&RestRun) -> &Creates) -> Option<&Creates> {
    crate::stats::median_by(runs, |r| path(r).throughput()).map(path)
}

/// Every run's samples of one kind, in run order.
fn pooled<T>(runs: &[RestRun], part: impl Fn(&RestRun) -> &[T]) -> Vec<T>
where
    T: Clone,
{
    runs.iter().flat_map(|r| part(r).to_vec()).collect()
}

/// CPU milliseconds per item.
fn ms_per(cpu: Duration, items: usize) -> f64 {
    cpu.as_secs_f64() * 1e3 / items.max(1) as f64
}

/// The median of `values` (the lower middle one of an even count); 0 for none.
fn median_of(values: impl IntoIterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.into_iter().collect();
    crate::stats::median_by(&v, |x| *x).copied().unwrap_or(0.0)
}

/// Whether the REST API reached its create target, as a sentence.
fn target_note(rest: f64, grpc: f64) -> (bool, String) {
    let share = rest / grpc.max(f64::EPSILON);
    let holds = share >= TARGET_SHARE;
    let verdict = if holds { "holds" } else { "does NOT hold" };
    (
        holds,
        format!(
            "Target: REST creates/s ≥ {} of gRPC's — {verdict}: REST {rest:.0}/s is {} of \
             gRPC's {grpc:.0}/s (each path's median run).",
            fmt_share(TARGET_SHARE),
            fmt_share(share)
        ),
    )
}

fn report(
    opts: &Options,
    started_at: chrono::DateTime<chrono::Utc>,
    env: crate::report::Environment,
    sizes: RestSizes,
    bytes: Bytesizes,
    runs: &[RestRun],
) -> Result<SuiteReport> {
    let (Some(rest), Some(grpc), Some(etcd)) = (
        median_creates(runs, |r| &r.rest),
        median_creates(runs, |r| &r.grpc),
        median_creates(runs, |r| &r.etcd),
    ) else {
        bail!("no runs");
    };
    let RestSizes {
        creates: n,
        list_objects: l,
        page,
        watchers: w,
        writes,
        ..
    } = sizes;
    let c = CREATE_CONCURRENCY;
    let g_create = format!("create, {c} in flight");
    let g_list = format!("list {l} objects");
    let g_watch = format!("watch, {w} watchers");
    let create = |name: &str, role, measures: &str, s: &Creates| -> Result<Series> {
        Ok(Series::new(name, role, measures, &s.calls, Some(s.wall))?
            .with_throughput(s.calls.len(), s.wall)
            .in_group(&g_create))
    };
    let list = |name: &str, role, measures: &str, part: fn(&Lists) -> &[Duration]| {
        let samples = pooled(runs, |r| part(&r.lists));
        let wall = samples.iter().sum();
        Ok::<_, anyhow::Error>(
            Series::new(name, role, measures, &samples, Some(wall))?.in_group(&g_list),
        )
    };
    let watch = |name: &str, role, measures: &str, part: fn(&RestRun) -> &Fanout| {
        let samples = pooled(runs, |r| &part(r).last);
        let wall = runs.iter().map(|r| part(r).wall).sum();
        Ok::<_, anyhow::Error>(
            Series::new(name, role, measures, &samples, Some(wall))?.in_group(&g_watch),
        )
    };
    let series = vec![
        create(
            "REST create",
            Role::Skiff,
            &format!(
                "POST {} of a {} B JSON object on {c} keep-alive HTTP/1.1 connections (one \
                 request in flight on each), the 201 answer decoded into the typed object; \
                 {n} creates, objects/s over first call start → last answer",
                collection("NS"),
                bytes.json
            ),
            rest,
        )?,
        create(
            "gRPC create",
            Role::Baseline,
            &format!(
                "the same object ({} B protobuf) created through skiff-client (Api::create, \
                 one HTTP/2 connection, {c} calls in flight), the answer decoded; {n} creates",
                bytes.proto
            ),
            grpc,
        )?,
        create(
            "etcd put",
            Role::Baseline,
            &format!(
                "etcd put through etcd-client of the bytes the API server stored for that \
                 object ({} B) under a fresh key of the same length, {c} in flight; {n} puts: \
                 the store's limit for the API server's writes",
                bytes.stored
            ),
            etcd,
        )?,
        list(
            "REST list",
            Role::Skiff,
            &format!(
                "GET {} of {l} objects ({} B of JSON), the answer decoded into typed objects",
                collection("NS"),
                runs.last().map_or(0, |r| r.lists.rest_bytes)
            ),
            |x| &x.rest,
        )?,
        list(
            &format!("REST list, pages of {page}"),
            Role::Skiff,
            &format!(
                "the same {l} objects in {} GETs with limit={page}, following continue (as \
                 client-go's informers list), every page decoded",
                runs.last().map_or(0, |r| r.lists.pages)
            ),
            |x| &x.rest_paged,
        )?,
        list(
            "gRPC list",
            Role::Baseline,
            &format!("skiff-client Api::list of the same {l} objects, decoded"),
            |x| &x.grpc,
        )?,
        list(
            "etcd range",
            Role::Baseline,
            &format!(
                "one etcd-client prefix get of the {l} objects' keys (raw bytes): what the API \
                 server reads for every list"
            ),
            |x| &x.etcd,
        )?,
        watch(
            "REST watch",
            Role::Skiff,
            &format!(
                "{w} watches GET {}?watch=true&resourceVersion=RV (one HTTP/1.1 connection \
                 each); per write (through gRPC, one at a time): write call start → the \
                 ADDED line decoded into the typed object by the last of the {w} watchers",
                collection("NS")
            ),
            |r| &r.rest_watch,
        )?,
        watch(
            "gRPC watch",
            Role::Baseline,
            &format!(
                "{w} skiff-client watches ({WATCHERS_PER_CONNECTION} per HTTP/2 connection) of \
                 the same namespace; per write: write call start → the ADDED event decoded by \
                 the last of the {w} watchers"
            ),
            |r| &r.grpc_watch,
        )?,
    ];

    let (holds, target) = target_note(rest.throughput(), grpc.throughput());
    let mut notes = vec![
        target,
        format!(
            "All series ran in this one run on this machine against one throwaway etcd 3.4 \
             (loopback) with skiff-apiserver --store etcd: creates and lists on one API \
             server; each front end's watch fan-out on a fresh one (so the RSS is that front end's). The bench, the \
             servers and the clients share the machine's {} CPUs.",
            env.cpus
        ),
        format!(
            "The object: Skiff serves no ConfigMap, so an Endpoints (core/v1, no subsets, \
             nothing acts on it) whose {DATA_KEYS} annotations of {DATA_VALUE_BYTES} B carry \
             a small ConfigMap's data: {} B as JSON, {} B as protobuf, {} B stored.",
            bytes.json, bytes.proto, bytes.stored
        ),
        format!(
            "The whole measurement ran {} time(s); REST and gRPC took turns creating first. \
             Create series come from each path's median run by throughput; list and watch \
             series pool every run's samples. Percentiles are nearest-rank.",
            runs.len()
        ),
        format!(
            "Roles: REST is Skiff, gRPC and etcd the baselines; ratios are REST / baseline \
             (gRPC / etcd is the control-plane suite's). gRPC / etcd creates here: {}.",
            fmt_share(grpc.throughput() / etcd.throughput().max(f64::EPSILON))
        ),
    ];
    for (name, s) in [("REST", rest), ("gRPC", grpc)] {
        notes.push(format!(
            "{name} creates (median run): CPU per create: API server {:.3} ms, etcd {:.3} ms, \
             bench (the clients) {:.3} ms.",
            ms_per(s.api_cpu, s.calls.len()),
            ms_per(s.etcd_cpu, s.calls.len()),
            ms_per(s.bench_cpu, s.calls.len()),
        ));
    }
    notes.push(format!(
        "etcd puts (median run): CPU per put: etcd {:.3} ms, bench (etcd-client) {:.3} ms.",
        ms_per(etcd.etcd_cpu, etcd.calls.len()),
        ms_per(etcd.bench_cpu, etcd.calls.len()),
    ));
    let per_run: Vec<String> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            format!(
                "run {} ({} first): REST {:.0}/s, gRPC {:.0}/s ({}), etcd {:.0}/s",
                i + 1,
                r.first.name(),
                r.rest.throughput(),
                r.grpc.throughput(),
                fmt_share(r.rest.throughput() / r.grpc.throughput().max(f64::EPSILON)),
                r.etcd.throughput()
            )
        })
        .collect();
    notes.push(format!("Creates, every run: {}.", per_run.join("; ")));
    for (name, part) in [
        (
            "REST",
            (|r: &RestRun| &r.rest_watch) as fn(&RestRun) -> &Fanout,
        ),
        ("gRPC", |r: &RestRun| &r.grpc_watch),
    ] {
        let pairs = pooled(runs, |r| &part(r).pairs);
        let kib_per_watcher = median_of(runs.iter().map(|r| {
            let f = part(r);
            f.rss_open.saturating_sub(f.rss_before) as f64 / 1024.0 / w.max(1) as f64
        }));
        let rss_open = median_of(runs.iter().map(|r| part(r).rss_open as f64)) as u64;
        let open_s = median_of(runs.iter().map(|r| part(r).open.as_secs_f64()));
        let cpu_per_write = median_of(runs.iter().map(|r| ms_per(part(r).api_cpu, writes)));
        if let Some(p) = Summary::of(&pairs) {
            notes.push(format!(
                "{name} watch: every one of the {} (write, watcher) deliveries: p50 {} ms, p99 \
                 {} ms. Opening the {w} watches until all saw a warm-up write: {:.2} s. API \
                 server RSS with them open {} MiB, {:.1} KiB per watcher over its RSS before; \
                 API server CPU {:.2} ms per write delivered to all (medians over runs).",
                p.n,
                fmt_ms(p.p50),
                fmt_ms(p.p99),
                open_s,
                procfs::mib(rss_open),
                kib_per_watcher,
                cpu_per_write
            ));
        }
    }

    let mut details = BTreeMap::new();
    details.insert(
        "create_target".to_string(),
        json!({
            "rest_over_grpc_creates": rest.throughput() / grpc.throughput().max(f64::EPSILON),
            "target": TARGET_SHARE,
            "holds": holds,
        }),
    );
    details.insert(
        "runs".to_string(),
        json!(
            runs.iter()
                .enumerate()
                .map(|(i, r)| {
                    let fan = |f: &Fanout| {
                        json!({
                            "last_p50_ms": Summary::of(&f.last).map(|s| s.p50),
                            "last_p99_ms": Summary::of(&f.last).map(|s| s.p99),
                            "open_s": f.open.as_secs_f64(),
                            "api_rss_before_mib": procfs::mib(f.rss_before),
                            "api_rss_open_mib": procfs::mib(f.rss_open),
                            "api_cpu_s": f.api_cpu.as_secs_f64(),
                        })
                    };
                    let creates = |c: &Creates| {
                        json!({
                            "per_s": c.throughput().round(),
                            "api_cpu_s": c.api_cpu.as_secs_f64(),
                            "etcd_cpu_s": c.etcd_cpu.as_secs_f64(),
                            "bench_cpu_s": c.bench_cpu.as_secs_f64(),
                        })
                    };
                    json!({
                        "run": i + 1,
                        "first": r.first.name(),
                        "rest_create": creates(&r.rest),
                        "grpc_create": creates(&r.grpc),
                        "etcd_put": creates(&r.etcd),
                        "rest_watch": fan(&r.rest_watch),
                        "grpc_watch": fan(&r.grpc_watch),
                    })
                })
                .collect::<Vec<_>>()
        ),
    );
    let params = BTreeMap::from([
        ("creates".to_string(), json!(n)),
        ("create_concurrency".to_string(), json!(c)),
        ("list_objects".to_string(), json!(l)),
        ("lists_per_run".to_string(), json!(sizes.lists)),
        ("list_page".to_string(), json!(page)),
        ("watchers".to_string(), json!(w)),
        ("writes_per_run".to_string(), json!(writes)),
        (
            "grpc_watchers_per_connection".to_string(),
            json!(WATCHERS_PER_CONNECTION),
        ),
        ("runs".to_string(), json!(runs.len())),
        (
            "object".to_string(),
            json!("v1 Endpoints + 4 × 256 B annotations"),
        ),
        ("object_json_bytes".to_string(), json!(bytes.json)),
        ("object_proto_bytes".to_string(), json!(bytes.proto)),
        ("object_stored_bytes".to_string(), json!(bytes.stored)),
        (
            "cluster".to_string(),
            json!("etcd 3.4 (one member, loopback), skiff-apiserver --store etcd on it"),
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

    #[test]
    fn sizes_default_and_quick() {
        let full = RestSizes::of(&Options::default()).unwrap();
        assert_eq!(
            (full.creates, full.list_objects, full.watchers, full.writes),
            (2000, 1000, 1000, 50)
        );
        let quick = RestSizes::of(&Options {
            quick: true,
            ..Default::default()
        })
        .unwrap();
        assert_eq!((quick.creates, quick.watchers), (50, 10));
        assert!(quick.page < quick.list_objects, "quick lists page too");
        assert!(
            RestSizes::of(&Options {
                pods: Some(0),
                ..Default::default()
            })
            .is_err()
        );
    }

    #[test]
    fn objects_are_the_same_size_on_every_path() {
        assert_eq!(ETCD_PREFIX.len(), REGISTRY_PREFIX.len());
        assert_eq!(Front::Rest.tags().0.len(), Front::Grpc.tags().0.len());
        assert_eq!(Front::Rest.tags().1.len(), Front::Grpc.tags().1.len());
        assert_eq!(object_name(7).len(), object_name(99_999).len());
        let p = payload();
        let a = object_json(&object_name(1), "run", &p);
        let obj = typed(a.clone()).unwrap();
        assert_eq!(obj.name(), "o-00001");
        let ann = &obj.metadata.as_ref().unwrap().annotations;
        assert_eq!(ann.len(), DATA_KEYS);
        assert!(ann.values().all(|v| v.len() == DATA_VALUE_BYTES));
        let b = object_json(&object_name(2), "run", &p);
        assert_eq!(
            serde_json::to_vec(&a).unwrap().len(),
            serde_json::to_vec(&b).unwrap().len()
        );
    }

    #[test]
    fn watch_lines_name_added_objects_and_fail_on_errors() {
        let added = br#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Endpoints","metadata":{"name":"o-00003","namespace":"ns","resourceVersion":"12"}}}"#;
        assert_eq!(watch_names(added).unwrap(), ["o-00003"]);
        let modified = br#"{"type":"MODIFIED","object":{"metadata":{"name":"x"}}}"#;
        assert!(watch_names(modified).unwrap().is_empty());
        assert!(watch_names(b"").unwrap().is_empty());
        let error = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}"#;
        let err = watch_names(error).unwrap_err();
        assert!(format!("{err:#}").contains("410"), "{err:#}");
        assert!(watch_names(b"{not json").is_err());
    }

    #[test]
    fn list_answers_decode_with_continue() {
        let list: ListAnswer = serde_json::from_slice(
            br#"{"kind":"EndpointsList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"abc","remainingItemCount":3},"items":[{"metadata":{"name":"a"}}]}"#,
        )
        .unwrap();
        assert_eq!(list.items.len(), 1);
        assert_eq!(list.metadata.cont, "abc");
        assert_eq!(list.metadata.resource_version, "9");
    }

    #[test]
    fn escapes_query_values() {
        assert_eq!(escape("eyJydiI6MX0"), "eyJydiI6MX0");
        assert_eq!(escape("a+b/c=d"), "a%2Bb%2Fc%3Dd");
    }

    #[test]
    fn target_verdict() {
        let (holds, note) = target_note(850.0, 1000.0);
        assert!(holds);
        assert!(
            note.contains("holds: REST 850/s is 85% of gRPC's 1000/s"),
            "{note}"
        );
        let (holds, note) = target_note(500.0, 1000.0);
        assert!(!holds);
        assert!(note.contains("does NOT hold"), "{note}");
    }
}
