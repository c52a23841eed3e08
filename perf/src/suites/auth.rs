//! `auth`: what TLS, authentication and RBAC cost the API server, and whether a storm of
//! failed logins slows the clients that do log in.
//!
//! One run, three sides measured the same way, one after the other, each on a fresh etcd and
//! a fresh API server in this process (`skiff_apiserver::spawn`, the code the binary runs):
//!
//! 1. **off**: plain HTTP, no authentication, no authorization;
//! 2. **on**: TLS, a client certificate, and RBAC evaluated for a user bound to `edit` in the
//!    namespace (not `system:masters`, which skips RBAC);
//! 3. **on + failed logins**: as 2, while other connections send requests with a wrong
//!    bearer token (each a 401) as fast as the server answers them, for as long as the
//!    creates run; then, alone, 10,000 failed logins from that address are timed (the
//!    attacker's view of the per-source throttle);
//! 4. **on + slowloris + inflight flood**: as 2, on a server with a small
//!    `--max-requests-inflight` ([`FLOOD_INFLIGHT_LIMIT`]) and a short HTTP/1 header read
//!    timeout ([`SLOW_HEADER_TIMEOUT`]), while (a) [`SLOW_CLIENTS`] connections finish TLS
//!    and then trickle request header bytes, never ending the headers (each reconnects when
//!    the server closes it), and (b) another user floods reads over [`FLOOD_CONNECTIONS`]
//!    connections, many more than the limit, so most wait in the flooder's own queue (the
//!    server's fair queuing) or are answered 429.
//!
//! Each side: warm-up creates, then N pod creates through the typed gRPC client with 16 in
//! flight; creates/s and per-call latency. Targets: "on" at most 10% fewer creates/s
//! and 10% more p99 than "off"; the storm at most 10% slower than "on"; under slowloris and
//! the flood the well-behaved client keeps at least 90% of its creates/s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
pub const TITLE: &str = "TLS, authentication, RBAC and admission on against off, a failed-login \
                         storm, and slowloris with an inflight flood";

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
/// The user who floods reads (bound to `view` in the namespace).
const FLOODER: &str = "bench-flooder";
/// `--max-requests-inflight` of the slowloris + flood side.
const FLOOD_INFLIGHT_LIMIT: usize = 8;
/// Connections of the flooder, one request in flight on each: four times the limit.
const FLOOD_CONNECTIONS: usize = 4 * FLOOD_INFLIGHT_LIMIT;
/// The header read timeout of the slowloris + flood side.
const SLOW_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Slow clients at once (fewer with `--quick`).
const SLOW_CLIENTS: usize = 200;
const QUICK_SLOW_CLIENTS: usize = 20;
/// A slow client sends one header byte this often.
const TRICKLE_EVERY: Duration = Duration::from_millis(250);
/// A slow connection the server has not closed after this long is given up (and counted).
const SLOW_GIVE_UP: Duration = Duration::from_secs(10);
/// How long the probes after the creates wait for the server to close them.
const PROBE_WAIT: Duration = Duration::from_secs(8);
/// No attacker (slow client or flooder) runs longer than this, whatever the creates do.
const ATTACK_BOUND: Duration = Duration::from_secs(600);

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// What one side measured.
#[derive(Debug, Clone)]
struct AuthSide {
    calls: Vec<Duration>,
    wall: Duration,
    /// Failed logins answered (401) while the creates ran, and in all.
    storm_during: usize,
    storm_total: usize,
    storm_wall: Duration,
    /// How long `failed_logins` failed logins from one address took, after the creates.
    attack_wall: Duration,
    /// The slowloris + flood side's attackers.
    slow: SlowStats,
    flood: FloodStats,
    /// After the creates, alone: when the server closed a TLS connection that sent nothing,
    /// and one that trickled the HTTP/2 preface (`None`: open after [`PROBE_WAIT`]).
    silent_closed: Option<Duration>,
    h2_preface_closed: Option<Duration>,
}

/// What the slow clients saw.
#[derive(Debug, Clone, Default)]
struct SlowStats {
    /// Connections that completed TLS and began trickling.
    opened: usize,
    /// ... of which the server closed before their headers ended (they never end).
    closed_by_server: usize,
    /// ... still open when the creates ended (closed by the bench, not counted as either).
    open_at_end: usize,
    /// ... open for [`SLOW_GIVE_UP`] without the server closing them.
    given_up: usize,
    /// From the end of the TLS handshake to the server's close, per closed connection.
    time_to_close: Vec<Duration>,
    /// When the server closed each of them.
    closed_at: Vec<Instant>,
    /// ... of which while the measured creates ran.
    closed_during_creates: usize,
    /// Header bytes the slow clients sent in all.
    bytes_sent: usize,
}

/// What the flooder got.
#[derive(Debug, Clone, Default)]
struct FloodStats {
    requests: usize,
    too_many: usize,
    ok: usize,
    /// Any other status (none expected).
    other: usize,
    wall: Duration,
}

/// A server of one side, with the client whose creates are measured.
struct RunningServer {
    _etcd: EtcdServer,
    server: Option<skiff_apiserver::ServerHandle>,
    pods: Api<Pod>,
    /// For the storm: the address and TLS without credentials.
    addr: std::net::SocketAddr,
    tls: Option<Tls>,
    /// TLS with the flooder's client certificate (secure servers only).
    flooder: Option<Tls>,
    _dir: tempfile::TempDir,
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        // Dropping the handle stops the server at once.
        self.server.take();
    }
}

/// The server settings of a side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Plain HTTP, no authentication.
    Off,
    /// TLS, authentication, RBAC, the default limits.
    On,
    /// As `On`, with [`FLOOD_INFLIGHT_LIMIT`] and [`SLOW_HEADER_TIMEOUT`].
    Limited,
}

async fn start(mode: Mode) -> Result<RunningServer> {
    let secure = mode != Mode::Off;
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
    let server = skiff_apiserver::spawn(Arc::new(store), listener, {
        let mut o = skiff_apiserver::ApiServerOptions {
            security,
            ..Default::default()
        };
        if mode == Mode::Limited {
            o.limits.max_requests_inflight = FLOOD_INFLIGHT_LIMIT;
            o.header_read_timeout = SLOW_HEADER_TIMEOUT;
        }
        o
    })
    .await
    .context("starting the API server")?;
    let (pods, tls, flooder) = if secure {
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
        let flood_binding: RoleBinding = skiff_api::manifest::decode(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "bench-flooder", "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": FLOODER}],
        }))?;
        admin
            .namespaced::<RoleBinding>(NAMESPACE)
            .create(&flood_binding)
            .await
            .context("binding the flooder")?;
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
        let flood_path = dir.path().join("flooder.kubeconfig");
        pki.write_kubeconfig(&ca, &flood_path, &format!("https://{addr}"), FLOODER, &[])?;
        let flooder = Tls::for_config(&ClientConfig::from_kubeconfig(&flood_path)?)?;
        (pods, Tls::for_config(&anonymous)?, flooder)
    } else {
        let client = Client::connect(&format!("http://{addr}")).await?;
        (client.namespaced::<Pod>(NAMESPACE), None, None)
    };
    Ok(RunningServer {
        _etcd: etcd,
        server: Some(server),
        pods,
        addr,
        tls,
        flooder,
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
    stop: Arc<AtomicBool>,
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

/// How one slow connection ended.
enum SlowEnd {
    /// The server closed it (EOF, reset, or a failed write).
    Closed,
    /// The creates ended first.
    Stopped,
    /// Open for [`SLOW_GIVE_UP`].
    GaveUp,
}

/// One slowloris client: connects, finishes TLS, then sends a request's header one byte every
/// [`TRICKLE_EVERY`] without ever ending it, until the server closes the connection; then
/// again, until `stop` is set or `deadline` passes.
async fn slow_client(
    addr: std::net::SocketAddr,
    tls: Option<Tls>,
    first_after: Duration,
    stop: Arc<AtomicBool>,
    deadline: Instant,
) -> Result<SlowStats> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut st = SlowStats::default();
    tokio::time::sleep(first_after).await;
    let head =
        format!("GET /api/v1/namespaces/{NAMESPACE}/pods HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ");
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("a slow client connecting to {addr}"))?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn SlowIo> = match &tls {
            Some(t) => Box::new(t.handshake(tcp).await?),
            None => Box::new(tcp),
        };
        let opened = Instant::now();
        st.opened += 1;
        let (mut rd, mut wr) = tokio::io::split(stream);
        let mut tick = tokio::time::interval(TRICKLE_EVERY);
        let mut buf = [0u8; 1024];
        let mut sent = 0usize;
        let end = loop {
            tokio::select! {
                r = rd.read(&mut buf) => match r {
                    // An answer (e.g. 408) before the close: read on to the close.
                    Ok(n) if n > 0 => continue,
                    _ => break SlowEnd::Closed,
                },
                _ = tick.tick() => {
                    if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                        break SlowEnd::Stopped;
                    }
                    if opened.elapsed() >= SLOW_GIVE_UP {
                        break SlowEnd::GaveUp;
                    }
                    // The header never ends: after the request line, one long header value.
                    let byte = head.as_bytes().get(sent).copied().unwrap_or(b'a');
                    if wr.write_all(&[byte]).await.is_err() || wr.flush().await.is_err() {
                        break SlowEnd::Closed;
                    }
                    sent += 1;
                }
            }
        };
        st.bytes_sent += sent;
        match end {
            SlowEnd::Closed => {
                st.closed_by_server += 1;
                st.time_to_close.push(opened.elapsed());
                st.closed_at.push(Instant::now());
            }
            SlowEnd::Stopped => st.open_at_end += 1,
            SlowEnd::GaveUp => st.given_up += 1,
        }
    }
    Ok(st)
}

trait SlowIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> SlowIo for T {}

/// Slowloris: `n` slow clients at once until `stop`, their first connections spread over one
/// header read timeout (so that from then on the server closes and they reconnect evenly, not
/// all at once).
async fn slowloris(
    addr: std::net::SocketAddr,
    tls: Option<Tls>,
    n: usize,
    stop: Arc<AtomicBool>,
) -> Result<SlowStats> {
    let deadline = Instant::now() + ATTACK_BOUND;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let first_after = SLOW_HEADER_TIMEOUT.mul_f64(i as f64 / n.max(1) as f64);
            tokio::spawn(slow_client(
                addr,
                tls.clone(),
                first_after,
                Arc::clone(&stop),
                deadline,
            ))
        })
        .collect();
    let mut all = SlowStats::default();
    for t in tasks {
        let s = t.await.context("a slow client panicked")??;
        all.opened += s.opened;
        all.closed_by_server += s.closed_by_server;
        all.open_at_end += s.open_at_end;
        all.given_up += s.given_up;
        all.time_to_close.extend(s.time_to_close);
        all.closed_at.extend(s.closed_at);
        all.bytes_sent += s.bytes_sent;
    }
    Ok(all)
}

/// A slow client the header read timeout may not cover: connects, finishes TLS, sends
/// `bytes` one every [`TRICKLE_EVERY`] and then nothing; how long until the server closed the
/// connection (`None`: still open after `wait`).
async fn probe_close(
    addr: std::net::SocketAddr,
    tls: &Tls,
    bytes: &[u8],
    wait: Duration,
) -> Result<Option<Duration>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let stream = tls.handshake(tcp).await?;
    let opened = Instant::now();
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut tick = tokio::time::interval(TRICKLE_EVERY);
    let mut buf = [0u8; 1024];
    let mut sent = 0usize;
    loop {
        tokio::select! {
            r = rd.read(&mut buf) => match r {
                Ok(n) if n > 0 => continue,
                _ => return Ok(Some(opened.elapsed())),
            },
            _ = tick.tick() => {
                if opened.elapsed() >= wait {
                    return Ok(None);
                }
                if let Some(b) = bytes.get(sent) {
                    if wr.write_all(&[*b]).await.is_err() || wr.flush().await.is_err() {
                        return Ok(Some(opened.elapsed()));
                    }
                    sent += 1;
                }
            }
        }
    }
}

/// The HTTP/2 connection preface, which the server reads before it knows the protocol.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The path the flooder reads: the first page of the namespace's pods.
const FLOOD_PATH: &str = "/api/v1/namespaces/default/pods?limit=100";

/// Reads as [`FLOODER`] over [`FLOOD_CONNECTIONS`] connections, one in flight on each, as fast
/// as they are answered, until `stop`; counts 200s and 429s.
async fn flood(
    addr: std::net::SocketAddr,
    tls: Option<Tls>,
    stop: Arc<AtomicBool>,
) -> Result<FloodStats> {
    let start = Instant::now();
    let deadline = start + ATTACK_BOUND;
    let mut tasks = Vec::new();
    for _ in 0..FLOOD_CONNECTIONS {
        let (tls, stop) = (tls.clone(), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut st = FloodStats::default();
            let mut conn = Conn::connect(addr, tls.as_ref()).await?;
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let (status, _) = conn.request(Method::GET, FLOOD_PATH, None).await?;
                st.requests += 1;
                match status {
                    StatusCode::OK => st.ok += 1,
                    StatusCode::TOO_MANY_REQUESTS => st.too_many += 1,
                    _ => st.other += 1,
                }
            }
            Ok::<_, anyhow::Error>(st)
        }));
    }
    let mut all = FloodStats::default();
    for t in tasks {
        let s = t.await.context("a flood connection panicked")??;
        all.requests += s.requests;
        all.ok += s.ok;
        all.too_many += s.too_many;
        all.other += s.other;
    }
    all.wall = start.elapsed();
    Ok(all)
}

/// Runs `attack` on an OS thread of its own with a runtime of its own, as an attacker in
/// another process would: the kernel, not the server's runtime, shares the CPUs between them.
fn on_own_thread<T: Send + 'static>(
    name: &str,
    attack: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<tokio::sync::oneshot::Receiver<Result<T>>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let out = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(attack),
                Err(e) => Err(anyhow::Error::new(e).context("an attacker's runtime")),
            };
            let _ = tx.send(out);
        })
        .context("starting an attacker thread")?;
    Ok(rx)
}

/// The attacks of a side.
#[derive(Debug, Clone, Copy, Default)]
struct Attacks {
    /// Failed logins after the creates (and a storm of them during); 0: none.
    failed_logins: usize,
    /// Slow clients during the creates; 0: none.
    slow_clients: usize,
    /// A read flood from [`FLOODER`] during the creates.
    flood: bool,
}

async fn measure_side(mode: Mode, attacks: Attacks, creates: usize, tag: &str) -> Result<AuthSide> {
    let failed_logins = attacks.failed_logins;
    let r = start(mode).await?;
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
    let stop = Arc::new(AtomicBool::new(false));
    let storm_task = (failed_logins > 0).then(|| {
        tokio::spawn(storm(
            r.addr,
            r.tls.clone(),
            0,
            Arc::clone(&done),
            Arc::clone(&stop),
        ))
    });
    let slow_task = if attacks.slow_clients > 0 {
        Some(on_own_thread(
            "slowloris",
            slowloris(
                r.addr,
                r.tls.clone(),
                attacks.slow_clients,
                Arc::clone(&stop),
            ),
        )?)
    } else {
        None
    };
    let flood_task = if attacks.flood {
        let tls = r
            .flooder
            .clone()
            .context("the flood needs a secure server")?;
        Some(on_own_thread(
            "flood",
            flood(r.addr, Some(tls), Arc::clone(&stop)),
        )?)
    } else {
        None
    };
    if slow_task.is_some() {
        // Every slow client connected and the closes and reconnects in their steady state:
        // one header read timeout after the last first connection.
        tokio::time::sleep(2 * SLOW_HEADER_TIMEOUT + Duration::from_millis(200)).await;
    } else if storm_task.is_some() || flood_task.is_some() {
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
    let mut slow = match slow_task {
        Some(t) => t.await.context("the slowloris thread ended early")??,
        None => SlowStats::default(),
    };
    let flood = match flood_task {
        Some(t) => t.await.context("the flood thread ended early")??,
        None => FloodStats::default(),
    };
    // The attacker's view: `failed_logins` wrong tokens from one address, alone.
    let attack_wall = if failed_logins > 0 {
        storm(
            r.addr,
            r.tls.clone(),
            failed_logins,
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(true)),
        )
        .await?
    } else {
        Duration::ZERO
    };
    // Slow clients the HTTP/1 header timeout may not reach (the server reads the first bytes
    // to tell HTTP/1 from HTTP/2 before HTTP/1 starts).
    let (silent_closed, h2_preface_closed) = match (attacks.slow_clients > 0, &r.tls) {
        (true, Some(tls)) => {
            let (a, b) = tokio::join!(
                probe_close(r.addr, tls, b"", PROBE_WAIT),
                probe_close(r.addr, tls, H2_PREFACE, PROBE_WAIT)
            );
            (a?, b?)
        }
        _ => (None, None),
    };
    let first = times.first().map(|t| t.0).context("no creates")?;
    let last = times.iter().map(|t| t.1).max().context("no creates")?;
    slow.closed_during_creates = slow
        .closed_at
        .iter()
        .filter(|t| (first..=last).contains(*t))
        .count();
    Ok(AuthSide {
        calls: times.iter().map(|(s, e)| *e - *s).collect(),
        wall: last.saturating_duration_since(first),
        storm_during,
        storm_total: done.load(Ordering::Relaxed),
        storm_wall,
        attack_wall,
        slow,
        flood,
        silent_closed,
        h2_preface_closed,
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
    let slow_clients = if opts.quick {
        QUICK_SLOW_CLIENTS
    } else {
        SLOW_CLIENTS
    };
    if creates == 0 {
        bail!("--pods must be at least 1");
    }
    let started_at = chrono::Utc::now();
    let env = host::environment();
    info!(suite = NAME, creates, "auth off");
    let off = measure_side(Mode::Off, Attacks::default(), creates, "off")
        .await
        .context("auth off")?;
    info!(suite = NAME, creates, "auth on");
    let on = measure_side(Mode::On, Attacks::default(), creates, "on")
        .await
        .context("auth on")?;
    info!(suite = NAME, creates, logins, "auth on with failed logins");
    let storm_attacks = Attacks {
        failed_logins: logins,
        ..Attacks::default()
    };
    let storm = measure_side(Mode::On, storm_attacks, creates, "storm")
        .await
        .context("auth on with failed logins")?;
    info!(
        suite = NAME,
        creates, slow_clients, "auth on with slowloris and a read flood"
    );
    let dos_attacks = Attacks {
        slow_clients,
        flood: true,
        ..Attacks::default()
    };
    let dos = measure_side(Mode::Limited, dos_attacks, creates, "dos")
        .await
        .context("auth on with slowloris and a read flood")?;
    // Each attack alone, to tell which costs what.
    info!(
        suite = NAME,
        creates, slow_clients, "auth on with slowloris alone"
    );
    let slow_only = Attacks {
        slow_clients,
        ..Attacks::default()
    };
    let slow_alone = measure_side(Mode::Limited, slow_only, creates, "slow")
        .await
        .context("auth on with slowloris alone")?;
    info!(suite = NAME, creates, "auth on with a read flood alone");
    let flood_only = Attacks {
        flood: true,
        ..Attacks::default()
    };
    let flood_alone = measure_side(Mode::Limited, flood_only, creates, "flood")
        .await
        .context("auth on with a read flood alone")?;

    let what = format!(
        "Pod create call through skiff-client (gRPC), {creates} creates with \
         {CREATE_CONCURRENCY} in flight after {WARMUP} warm-up creates; pods/s over first call \
         start → last response"
    );
    let series_of = |name: &str, role, s: &AuthSide, group: &str, how: &str| -> Result<Series> {
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
    let g_dos = "slowloris and inflight flood vs none";
    let on_how = format!(
        "TLS, client certificate of user {EDITOR} bound to `edit` in {NAMESPACE} (RBAC \
         and the admission chain run on every call)"
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
        series_of(
            "skiff, on, slowloris + flood",
            Role::Skiff,
            &dos,
            g_dos,
            &format!(
                "{on_how}; server with --max-requests-inflight {FLOOD_INFLIGHT_LIMIT} and a \
                 {} s HTTP/1 header read timeout; meanwhile {slow_clients} TLS connections \
                 trickle a request header (one byte every {} ms, never ending it; each \
                 reconnects when closed) and user {FLOODER} (bound to `view`) sends \
                 `GET {FLOOD_PATH}` over {FLOOD_CONNECTIONS} connections, one in flight on \
                 each, as fast as they are answered, until the creates end",
                SLOW_HEADER_TIMEOUT.as_secs(),
                TRICKLE_EVERY.as_millis()
            ),
        )?,
        series_of(
            "skiff, on, slowloris alone",
            Role::Skiff,
            &slow_alone,
            g_dos,
            &format!("{on_how}; as \"slowloris + flood\" without the flood"),
        )?,
        series_of(
            "skiff, on, inflight flood alone",
            Role::Skiff,
            &flood_alone,
            g_dos,
            &format!("{on_how}; as \"slowloris + flood\" without the slow clients"),
        )?,
        series_of(
            "skiff, on, no attack",
            Role::Baseline,
            &on,
            g_dos,
            &format!("{on_how}; default limits"),
        )?,
    ];
    let rate = |s: &AuthSide| s.calls.len() as f64 / s.wall.as_secs_f64().max(1e-9);
    let p99 = |s: &AuthSide| {
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
    let dos_share = rate(&dos) / rate(&on).max(1e-9) * 100.0;
    let dos_p99 = p99(&dos) / p99(&on).max(1e-9);
    let (slow, fl) = (&dos.slow, &dos.flood);
    let close_summary = crate::stats::Summary::of(&slow.time_to_close);
    let (close_p50, close_max) = close_summary
        .as_ref()
        .map(|c| (c.p50 / 1000.0, c.max / 1000.0))
        .unwrap_or((0.0, 0.0));
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
        format!(
            "Target: under {slow_clients} slowloris connections and a read flood beyond \
             --max-requests-inflight ({FLOOD_INFLIGHT_LIMIT}; requests beyond it wait in their \
             user's queue, users take turns), the well-behaved client keeps at \
             least 90% of its creates/s. Measured: {dos_share:.1}% of the no-attack creates/s \
             ({}), p99 {dos_p99:.2}x the no-attack p99 (slowloris alone: {:.1}% and \
             {:.2}x; the flood alone: {:.1}% and {:.2}x, {} of its {} requests answered 429). \
             Each attack runs on an OS thread of its own, as another process would. With both, \
             the flooder ({FLOODER}) sent {} \
             requests in {:.1} s ({:.0}/s): {} answered 429 TooManyRequests, {} 200, {} \
             other. The slow clients opened {} TLS connections and sent {} header bytes; the \
             server closed {} of them ({} while the creates ran) before their headers ended, \
             {:.2} s after the handshake at the median and {:.2} s at most (header read \
             timeout {} s); {} were still \
             open when the creates ended (younger than the timeout) and {} were open \
             {} s without being closed.",
            verdict(dos_share >= 90.0),
            rate(&slow_alone) / rate(&on).max(1e-9) * 100.0,
            p99(&slow_alone) / p99(&on).max(1e-9),
            rate(&flood_alone) / rate(&on).max(1e-9) * 100.0,
            p99(&flood_alone) / p99(&on).max(1e-9),
            flood_alone.flood.too_many,
            flood_alone.flood.requests,
            fl.requests,
            fl.wall.as_secs_f64(),
            fl.requests as f64 / fl.wall.as_secs_f64().max(1e-9),
            fl.too_many,
            fl.ok,
            fl.other,
            slow.opened,
            slow.bytes_sent,
            slow.closed_by_server,
            slow.closed_during_creates,
            close_p50,
            close_max,
            SLOW_HEADER_TIMEOUT.as_secs(),
            slow.open_at_end,
            slow.given_up,
            SLOW_GIVE_UP.as_secs(),
        ),
        {
            let closed = |c: Option<Duration>| match c {
                Some(d) => format!("closed by the server after {:.2} s", d.as_secs_f64()),
                None => format!("still open after {} s", PROBE_WAIT.as_secs()),
            };
            format!(
                "Probes after the creates, same server: a TLS connection that sends nothing \
                 was {}; one that trickles the HTTP/2 connection preface was {}. (The header \
                 read timeout is HTTP/1's; before it starts, the server reads the first bytes to \
                 tell HTTP/1 from HTTP/2.)",
                closed(dos.silent_closed),
                closed(dos.h2_preface_closed)
            )
        },
    ];
    let mut details = BTreeMap::new();
    details.insert(
        "failed_logins".into(),
        json!({"during_creates": storm.storm_during,
               "flood_seconds": storm.storm_wall.as_secs_f64(),
               "attack_count": logins,
               "attack_seconds": storm.attack_wall.as_secs_f64()}),
    );
    details.insert(
        "slowloris_and_flood".into(),
        json!({"slow_clients": slow_clients,
               "slow_connections_opened": slow.opened,
               "slow_closed_by_server": slow.closed_by_server,
               "slow_closed_during_creates": slow.closed_during_creates,
               "slow_open_at_end": slow.open_at_end,
               "slow_not_closed_within_seconds": {"seconds": SLOW_GIVE_UP.as_secs(),
                                                   "count": slow.given_up},
               "slow_seconds_to_close_p50": close_p50,
               "slow_seconds_to_close_max": close_max,
               "slow_header_bytes_sent": slow.bytes_sent,
               "probe_silent_seconds_to_close": dos.silent_closed.map(|d| d.as_secs_f64()),
               "probe_h2_preface_seconds_to_close":
                   dos.h2_preface_closed.map(|d| d.as_secs_f64()),
               "header_read_timeout_seconds": SLOW_HEADER_TIMEOUT.as_secs(),
               "max_requests_inflight": FLOOD_INFLIGHT_LIMIT,
               "flood_connections": FLOOD_CONNECTIONS,
               "flood_requests": fl.requests,
               "flood_429": fl.too_many,
               "flood_200": fl.ok,
               "flood_other": fl.other,
               "flood_seconds": fl.wall.as_secs_f64(),
               "creates_per_s_share_of_no_attack": dos_share / 100.0,
               "p99_ratio_to_no_attack": dos_p99}),
    );
    let params = BTreeMap::from([
        ("creates".to_string(), json!(creates)),
        ("in_flight".to_string(), json!(CREATE_CONCURRENCY)),
        ("failed_logins".to_string(), json!(logins)),
        ("slow_clients".to_string(), json!(slow_clients)),
        (
            "max_requests_inflight_under_flood".to_string(),
            json!(FLOOD_INFLIGHT_LIMIT),
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
