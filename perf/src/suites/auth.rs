//! `auth`: what TLS, authentication and RBAC cost the API server, and whether a storm of
//! failed logins slows the clients that do log in.
//!
//! One run, three sides measured the same way, one after the other, each on a fresh etcd and
//! a fresh API server in this process (`skiff_apiserver::spawn`, the code the binary runs):
//!
//! 1. **off**: plain HTTP, no authentication, no authorization (Skiff before M2-C);
//! 2. **on**: TLS, a client certificate, and RBAC evaluated for a user bound to `edit` in the
//!    namespace (not `system:masters`, which skips RBAC);
//! 3. **on + failed logins**: as 2, while other connections send requests with a wrong
//!    bearer token (each a 401) as fast as the server answers them, for as long as the
//!    creates run; then, alone, 10,000 failed logins from that address are timed (the
//!    attacker's view of the per-source throttle).
//!
//! Each side: warm-up creates, then N pod creates through the typed gRPC client with 16 in
//! flight; creates/s and per-call latency. Targets (M2-C): "on" at most 10% fewer creates/s
//! and 10% more p99 than "off"; the storm at most 10% slower than "on".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use hyper::{Method, StatusCode};
use serde_json::json;
use skiff_api::api::{Pod, RoleBinding};
use skiff_client::{Api, Client, ClientConfig, ListParams};
use skiff_tests::EtcdServer;
use tracing::info;

use super::Options;
use super::control_plane::bench_pod;
use crate::apiload::{CREATE_CONCURRENCY, timed_all};
use crate::host;
use crate::http1::{Conn, Tls};
use crate::report::{Measured, Role, Series, SuiteReport};

pub const NAME: &str = "auth";
pub const TITLE: &str = "TLS, authentication and RBAC on against off, and a failed-login storm";

const NAMESPACE: &str = "default";
const DEFAULT_CREATES: usize = 2000;
const QUICK_CREATES: usize = 40;
const WARMUP: usize = 20;
const DEFAULT_FAILED_LOGINS: usize = 10_000;
const QUICK_FAILED_LOGINS: usize = 300;
/// Connections sending the failed logins, one request in flight on each.
const STORM_CONNECTIONS: usize = 8;
/// The user whose creates are measured with RBAC on.
const EDITOR: &str = "bench-editor";

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// What one side measured.
#[derive(Debug, Clone)]
struct Side {
    calls: Vec<Duration>,
    wall: Duration,
    /// Failed logins answered (401) while the creates ran, and in all.
    storm_during: usize,
    storm_total: usize,
    storm_wall: Duration,
    /// How long `failed_logins` failed logins from one address took, after the creates.
    attack_wall: Duration,
}

/// A server of one side, with the client whose creates are measured.
struct Running {
    _etcd: EtcdServer,
    server: Option<skiff_apiserver::ServerHandle>,
    pods: Api<Pod>,
    /// For the storm: the address and TLS without credentials.
    addr: std::net::SocketAddr,
    tls: Option<Tls>,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        // Dropping the handle stops the server at once.
        self.server.take();
    }
}

async fn start(secure: bool) -> Result<Running> {
    let etcd = EtcdServer::start().map_err(|e| anyhow::anyhow!("starting etcd: {}", e.0))?;
    let store = skiff_store::EtcdStore::connect(&etcd.endpoints())
        .await
        .context("connecting to etcd")?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding a loopback port")?;
    let addr = listener.local_addr()?;
    let dir = tempfile::tempdir()?;
    let pki_dir = dir.path().join("pki");
    let security = if secure {
        Some(skiff_apiserver::Security::bootstrap(
            &skiff_apiserver::SecurityOptions {
                pki_dir: pki_dir.clone(),
                server_url: format!("https://{addr}"),
                sans: vec!["127.0.0.1".into(), "localhost".into()],
                token_auth_file: None,
                audit: None,
                renew_every: None,
            },
        )?)
    } else {
        None
    };
    let server = skiff_apiserver::spawn(
        Arc::new(store),
        listener,
        skiff_apiserver::ApiServerOptions {
            security,
            ..Default::default()
        },
    )
    .await
    .context("starting the API server")?;
    let (pods, tls) = if secure {
        let pki = skiff_pki::ClusterPki::new(&pki_dir);
        let admin = Client::connect_with(&ClientConfig::from_kubeconfig(&pki.admin_kubeconfig())?)
            .await
            .context("connecting as the administrator")?;
        let binding: RoleBinding = skiff_api::manifest::decode(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "bench-editor", "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "User", "name": EDITOR}],
        }))?;
        admin
            .namespaced::<RoleBinding>(NAMESPACE)
            .create(&binding)
            .await
            .context("binding the editor")?;
        let ca = pki.load_ca()?;
        let path = dir.path().join("editor.kubeconfig");
        pki.write_kubeconfig(&ca, &path, &format!("https://{addr}"), EDITOR, &[])?;
        let config = ClientConfig::from_kubeconfig(&path)?;
        let editor = Client::connect_with(&config)
            .await
            .context("connecting as the editor")?;
        let pods = editor.namespaced::<Pod>(NAMESPACE);
        // The binding reaches the authorizer through a watch.
        let deadline = Instant::now() + Duration::from_secs(10);
        while pods.list(&ListParams::default()).await.is_err() {
            if Instant::now() > deadline {
                bail!("the editor's RoleBinding did not take effect within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut anonymous = config.clone();
        anonymous.identity = None;
        (pods, Tls::for_config(&anonymous)?)
    } else {
        let client = Client::connect(&format!("http://{addr}")).await?;
        (client.namespaced::<Pod>(NAMESPACE), None)
    };
    Ok(Running {
        _etcd: etcd,
        server: Some(server),
        pods,
        addr,
        tls,
        _dir: dir,
    })
}

/// Requests with wrong bearer tokens over [`STORM_CONNECTIONS`] connections, at least
/// `total` and until `stop` is set (so the storm lasts as long as the measured creates); each
/// must be answered 401. Counts answers in `done`.
async fn storm(
    addr: std::net::SocketAddr,
    tls: Option<Tls>,
    total: usize,
    done: Arc<AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Result<Duration> {
    let start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..STORM_CONNECTIONS {
        let (tls, next, done, stop) = (
            tls.clone(),
            Arc::clone(&next),
            Arc::clone(&done),
            Arc::clone(&stop),
        );
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::connect(addr, tls.as_ref())
                .await?
                .with_bearer(&format!("wrong-token-{c}"));
            while next.fetch_add(1, Ordering::Relaxed) < total || !stop.load(Ordering::Relaxed) {
                let (status, _) = conn
                    .request(Method::GET, "/api/v1/namespaces/default/pods", None)
                    .await?;
                if status != StatusCode::UNAUTHORIZED {
                    bail!("a wrong token got {status}, not 401");
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await.context("a storm connection panicked")??;
    }
    Ok(start.elapsed())
}

async fn measure_side(
    secure: bool,
    failed_logins: usize,
    creates: usize,
    tag: &str,
) -> Result<Side> {
    let r = start(secure).await?;
    let run_id = skiff_tests::unique();
    let make = |n: usize, prefix: &str| -> Result<Vec<Pod>> {
        (0..n)
            .map(|i| bench_pod(&format!("{tag}-{prefix}-{i}"), &run_id, tag))
            .collect()
    };
    let pods = &r.pods;
    timed_all(make(WARMUP, "warm")?, CREATE_CONCURRENCY, |p| async move {
        pods.create(&p)
            .await
            .map(|_| ())
            .map_err(anyhow::Error::from)
    })
    .await
    .context("warm-up creates")?;
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let storm_task = (failed_logins > 0).then(|| {
        tokio::spawn(storm(
            r.addr,
            r.tls.clone(),
            0,
            Arc::clone(&done),
            Arc::clone(&stop),
        ))
    });
    if storm_task.is_some() {
        // Let the storm reach full speed first.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    info!(side = tag, creates, failed_logins, "measuring creates");
    let times = timed_all(make(creates, "m")?, CREATE_CONCURRENCY, |p| async move {
        pods.create(&p)
            .await
            .map(|_| ())
            .map_err(anyhow::Error::from)
    })
    .await
    .context("measured creates")?;
    let storm_during = done.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let storm_wall = match storm_task {
        Some(t) => t.await.context("the storm panicked")??,
        None => Duration::ZERO,
    };
    // The attacker's view: `failed_logins` wrong tokens from one address, alone.
    let attack_wall = if failed_logins > 0 {
        storm(
            r.addr,
            r.tls.clone(),
            failed_logins,
            Arc::new(AtomicUsize::new(0)),
            Arc::new(std::sync::atomic::AtomicBool::new(true)),
        )
        .await?
    } else {
        Duration::ZERO
    };
    let first = times.first().map(|t| t.0).context("no creates")?;
    let last = times.iter().map(|t| t.1).max().context("no creates")?;
    Ok(Side {
        calls: times.iter().map(|(s, e)| *e - *s).collect(),
        wall: last.saturating_duration_since(first),
        storm_during,
        storm_total: done.load(Ordering::Relaxed),
        storm_wall,
        attack_wall,
    })
}

async fn measure(opts: &Options) -> Result<SuiteReport> {
    host::check_binaries(&[])?;
    let creates = opts.pods.unwrap_or(if opts.quick {
        QUICK_CREATES
    } else {
        DEFAULT_CREATES
    });
    let logins = if opts.quick {
        QUICK_FAILED_LOGINS
    } else {
        DEFAULT_FAILED_LOGINS
    };
    if creates == 0 {
        bail!("--pods must be at least 1");
    }
    let started_at = chrono::Utc::now();
    let env = host::environment();
    info!(suite = NAME, creates, "auth off");
    let off = measure_side(false, 0, creates, "off")
        .await
        .context("auth off")?;
    info!(suite = NAME, creates, "auth on");
    let on = measure_side(true, 0, creates, "on")
        .await
        .context("auth on")?;
    info!(suite = NAME, creates, logins, "auth on with failed logins");
    let storm = measure_side(true, logins, creates, "storm")
        .await
        .context("auth on with failed logins")?;

    let what = format!(
        "Pod create call through skiff-client (gRPC), {creates} creates with \
         {CREATE_CONCURRENCY} in flight after {WARMUP} warm-up creates; pods/s over first call \
         start → last response"
    );
    let series_of = |name: &str, role, s: &Side, group: &str, how: &str| -> Result<Series> {
        Ok(Series::new(
            name,
            role,
            &format!("{what}; {how}"),
            &s.calls,
            Some(s.wall),
        )?
        .with_throughput(s.calls.len(), s.wall)
        .in_group(group))
    };
    let g_on = "auth and RBAC on vs off";
    let g_storm = "failed-login flood vs none".to_string();
    let on_how = format!(
        "TLS, client certificate of user {EDITOR} bound to `edit` in {NAMESPACE} (RBAC \
         evaluated on every call)"
    );
    let series = vec![
        series_of("skiff, auth + RBAC on", Role::Skiff, &on, g_on, &on_how)?,
        series_of(
            "skiff, auth off",
            Role::Baseline,
            &off,
            g_on,
            "plain HTTP, no authentication or authorization",
        )?,
        series_of(
            "skiff, on, failed-login storm",
            Role::Skiff,
            &storm,
            &g_storm,
            &format!(
                "{on_how}; meanwhile {STORM_CONNECTIONS} other TLS connections from the same \
                 address send requests with wrong bearer tokens (each a 401), one in flight on \
                 each, as fast as they are answered, until the creates end"
            ),
        )?,
        series_of(
            "skiff, on, no storm",
            Role::Baseline,
            &on,
            &g_storm,
            &on_how,
        )?,
    ];
    let rate = |s: &Side| s.calls.len() as f64 / s.wall.as_secs_f64().max(1e-9);
    let p99 = |s: &Side| {
        crate::stats::Summary::of(&s.calls)
            .map(|x| x.p99)
            .unwrap_or(0.0)
    };
    let pct = |a: f64, b: f64| if b > 0.0 { (a / b - 1.0) * 100.0 } else { 0.0 };
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let fewer = -pct(rate(&on), rate(&off));
    let more = pct(p99(&on), p99(&off));
    let storm_fewer = -pct(rate(&storm), rate(&on));
    let storm_more = pct(p99(&storm), p99(&on));
    let notes = vec![
        "All sides ran in this one run on this machine, one after the other, each on a fresh \
         etcd and a fresh API server in the bench's process (the binary's code: \
         skiff_apiserver::spawn and Security::bootstrap); the bench, the server and etcd share \
         the machine's CPUs."
            .to_string(),
        format!(
            "Target: with auth and RBAC on, at most 10% fewer creates/s and at most 10% more \
             p99 than off. Measured: {fewer:.1}% fewer creates/s ({}), p99 {more:+.1}% ({}). \
             \"Off\" is also plain HTTP, so the difference includes TLS.",
            verdict(fewer <= 10.0),
            verdict(more <= 10.0)
        ),
        format!(
            "Target: {logins} failed logins slow other clients by at most 10%. Measured: a flood \
             of failed logins during the creates cost {storm_fewer:.1}% of the creates/s ({}) \
             and p99 {storm_more:+.1}% ({}); {} failed logins were answered while the \
             {creates} creates ran ({:.0}/s: failures from one address are slowed down, \
             1 ms more for each beyond 20 a second, at most 250 ms). {logins} failed logins \
             from one address then took {:.1} s ({:.0}/s), every one a 401.",
            verdict(storm_fewer <= 10.0),
            verdict(storm_more <= 10.0),
            storm.storm_during,
            storm.storm_total as f64 / storm.storm_wall.as_secs_f64().max(1e-9),
            storm.attack_wall.as_secs_f64(),
            logins as f64 / storm.attack_wall.as_secs_f64().max(1e-9),
        ),
    ];
    let mut details = BTreeMap::new();
    details.insert(
        "failed_logins".into(),
        json!({"during_creates": storm.storm_during,
               "flood_seconds": storm.storm_wall.as_secs_f64(),
               "attack_count": logins,
               "attack_seconds": storm.attack_wall.as_secs_f64()}),
    );
    let params = BTreeMap::from([
        ("creates".to_string(), json!(creates)),
        ("in_flight".to_string(), json!(CREATE_CONCURRENCY)),
        ("failed_logins".to_string(), json!(logins)),
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
