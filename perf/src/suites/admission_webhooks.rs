//! `admission-webhooks`: what one validating admission webhook adds to a write. REST creates
//! of ConfigMaps that a ValidatingWebhookConfiguration selects (its objectSelector matches
//! their label, so the API server calls the webhook for each) against creates of the same
//! ConfigMaps without the label (not sent), in one run, on one API server over one etcd.
//!
//! The webhook server is this process's: HTTP/1.1 over TLS (a certificate of a throwaway CA
//! for 127.0.0.1, the configuration's `caBundle`), answering every AdmissionReview
//! "allowed" at once, so what is measured is the API server's side of the call (building the
//! review, the TLS connection pool, the round trip, reading the answer). Each create's answer
//! is decoded, as a client's would be. Latency is measured
//! one create at a time, throughput at [`CREATE_CONCURRENCY`] in flight; the two series take
//! turns going first, R runs (default 3), each series' median run reported. Every process
//! started is killed by pid when its guard drops, also on error.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use skiff_tests::{ApiServer, Backend, EtcdServer};
use tracing::info;

use super::Options;
use crate::apiload::{self, CREATE_CONCURRENCY, RestCreates as Creates, post_created as post};
use crate::host;
use crate::http1::{Pool, Tls};
use crate::report::{Measured, Role, Series, SuiteReport};
use crate::stats;

pub const NAME: &str = "admission-webhooks";
pub const TITLE: &str = "ConfigMap creates with one validating webhook against none";

const DEFAULT_CREATES: usize = 1000;
const QUICK_CREATES: usize = 20;
const DEFAULT_RUNS: usize = 3;
const QUICK_RUNS: usize = 1;

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// Serves AdmissionReviews (always allowed) on 127.0.0.1 until dropped; counts them.
struct WebhookServer {
    addr: SocketAddr,
    calls: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn allow(review: &[u8]) -> Result<Bytes> {
    let review: Value = serde_json::from_slice(review).context("an AdmissionReview")?;
    let answer = json!({
        "apiVersion": review["apiVersion"],
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": true},
    });
    Ok(serde_json::to_vec(&answer)?.into())
}

async fn serve_webhook(serving: &skiff_pki::Identity) -> Result<WebhookServer> {
    let mut config = skiff_pki::tls::server_config(serving, None)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let calls = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&calls);
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, calls) = (acceptor.clone(), Arc::clone(&counted));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let calls = Arc::clone(&calls);
                    async move {
                        let body = BodyExt::collect(req.into_body()).await?.to_bytes();
                        calls.fetch_add(1, Ordering::Relaxed);
                        let (status, body) = match allow(&body) {
                            Ok(b) => (StatusCode::OK, b),
                            Err(e) => (StatusCode::BAD_REQUEST, Bytes::from(e.to_string())),
                        };
                        let resp = hyper::Response::builder()
                            .status(status)
                            .header(hyper::header::CONTENT_TYPE, "application/json")
                            .body(Full::new(body))
                            .unwrap_or_default();
                        Ok::<_, hyper::Error>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Ok(WebhookServer { addr, calls, task })
}

fn configuration(addr: SocketAddr, ca_pem: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "bench"},
        "webhooks": [{
            "name": "configmaps.bench.skiff.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "clientConfig": {
                "url": format!("https://{addr}/validate"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem),
            },
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["configmaps"]}],
            "objectSelector": {"matchLabels": {"webhook": "on"}},
        }],
    })
}

fn config_map(name: &str, hooked: bool) -> Value {
    let mut cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "data": {"a": "b".repeat(512)},
    });
    if hooked {
        cm["metadata"]["labels"]["webhook"] = json!("on");
    }
    cm
}

async fn creates(
    pool: &Pool,
    path: &str,
    prefix: &str,
    hooked: bool,
    n: usize,
    in_flight: usize,
    api_pid: u32,
) -> Result<Creates> {
    let objects: Vec<Value> = (0..n)
        .map(|i| config_map(&format!("{prefix}-{i:05}"), hooked))
        .collect();
    apiload::rest_creates(pool, path, objects, in_flight, api_pid).await
}

/// Per run: (hooked, plain) at 1 in flight, then at [`CREATE_CONCURRENCY`].
type Run = [(Creates, Creates); 2];

async fn measure(opts: &Options) -> Result<SuiteReport> {
    let bin_dir = host::check_binaries(&["skiff-apiserver"])?;
    let n = opts.pods.unwrap_or(if opts.quick {
        QUICK_CREATES
    } else {
        DEFAULT_CREATES
    });
    let runs = opts
        .runs
        .unwrap_or(if opts.quick { QUICK_RUNS } else { DEFAULT_RUNS });
    if runs == 0 || n == 0 {
        bail!("--runs and the number of creates must be at least 1");
    }
    let started_at = chrono::Utc::now();
    let mut env = host::environment();
    let ca = skiff_pki::Ca::generate("bench webhook CA")?;
    let serving = ca.issue(&skiff_pki::LeafSpec::server(
        "127.0.0.1",
        &["127.0.0.1".to_string()],
    ))?;
    let webhook = serve_webhook(&serving).await?;
    let etcd = EtcdServer::start().map_err(|e| anyhow::anyhow!("starting etcd: {}", e.0))?;
    let server = ApiServer::start(Backend::Etcd(etcd.endpoint.clone()));
    let (api_pid, exe) = host::apiserver_pid(&server, &bin_dir)?;
    env.binaries.insert("skiff-apiserver".into(), exe);
    let tls = Tls::for_config(&server.client_config())?;
    let pool = Pool::connect(server.addr, tls.as_ref(), CREATE_CONCURRENCY).await?;
    post(
        &pool,
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        &configuration(webhook.addr, ca.cert_pem()),
    )
    .await
    .context("creating the webhook configuration")?;
    let ns = format!("perf-{}", skiff_tests::unique());
    post(
        &pool,
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await?;
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    // The configuration reaches admission through a watch: wait until a create is sent.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut probe = 0;
    while webhook.calls.load(Ordering::Relaxed) == 0 {
        if Instant::now() > deadline {
            bail!("the webhook was not called within 30 s of its configuration");
        }
        post(&pool, &path, &config_map(&format!("probe-{probe}"), true)).await?;
        probe += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut results: Vec<Run> = Vec::with_capacity(runs);
    for r in 0..runs {
        let mut run = Vec::with_capacity(2);
        for in_flight in [1, CREATE_CONCURRENCY] {
            let order = if r % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            let (mut hooked, mut plain) = (None, None);
            for with_hook in order {
                info!(run = r + 1, in_flight, with_hook, creates = n, "creates");
                let prefix = format!("r{r}-f{in_flight}-{}", u8::from(with_hook));
                let c = creates(&pool, &path, &prefix, with_hook, n, in_flight, api_pid).await?;
                if with_hook {
                    hooked = Some(c);
                } else {
                    plain = Some(c);
                }
            }
            run.push((hooked.context("hooked")?, plain.context("plain")?));
        }
        let [one, many]: [(Creates, Creates); 2] = run
            .try_into()
            .map_err(|_| anyhow::anyhow!("two concurrency levels"))?;
        results.push([one, many]);
    }
    let calls = webhook.calls.load(Ordering::Relaxed);
    drop(pool);
    drop(server);
    drop(etcd);
    drop(webhook);
    let expected = (runs * 2 * n) as u64;
    if calls < expected {
        bail!("the webhook answered {calls} reviews, fewer than the {expected} hooked creates");
    }

    let mut series = Vec::new();
    let mut notes = Vec::new();
    for (level, in_flight) in [(0usize, 1usize), (1, CREATE_CONCURRENCY)] {
        let pick_hooked = |r: &Run| -> f64 { -r[level].0.p50().as_secs_f64() };
        let pick_plain = |r: &Run| -> f64 { -r[level].1.p50().as_secs_f64() };
        let hooked = &stats::median_by(&results, pick_hooked).context("no runs")?[level].0;
        let plain = &stats::median_by(&results, pick_plain).context("no runs")?[level].1;
        let group = format!("create, {in_flight} in flight");
        series.push(
            Series::new(
                "with a validating webhook",
                Role::Skiff,
                &format!(
                    "POST {path} of a ConfigMap its objectSelector picks: one AdmissionReview \
                     to a TLS webhook on loopback per create; {n} creates"
                ),
                &hooked.calls,
                Some(hooked.wall),
            )?
            .with_throughput(hooked.calls.len(), hooked.wall)
            .in_group(&group),
        );
        series.push(
            Series::new(
                "no webhook called",
                Role::Baseline,
                &format!("POST {path} of the same ConfigMap without the label; {n} creates"),
                &plain.calls,
                Some(plain.wall),
            )?
            .with_throughput(plain.calls.len(), plain.wall)
            .in_group(&group),
        );
        notes.push(format!(
            "{in_flight} in flight: the webhook adds {:.3} ms at p50 ({:.3} vs {:.3} ms); \
             creates/s {:.0} vs {:.0}; API server CPU per create {:.3} vs {:.3} ms.",
            (hooked.p50().as_secs_f64() - plain.p50().as_secs_f64()) * 1e3,
            hooked.p50().as_secs_f64() * 1e3,
            plain.p50().as_secs_f64() * 1e3,
            hooked.throughput(),
            plain.throughput(),
            hooked.api_cpu.as_secs_f64() * 1e3 / n as f64,
            plain.api_cpu.as_secs_f64() * 1e3 / n as f64,
        ));
    }
    notes.push(format!(
        "One API server (skiff-apiserver --store etcd, one throwaway etcd on loopback) and the \
         webhook server (in the bench process, answering at once) share the machine's {} CPUs; \
         the series took turns creating first; {runs} run(s), each series' median run (by p50) \
         shown; the webhook answered {calls} reviews.",
        env.cpus
    ));
    Ok(SuiteReport::new(
        NAME,
        TITLE,
        started_at,
        env,
        Measured {
            quick: opts.quick,
            params: [
                ("creates".to_string(), json!(n)),
                ("runs".to_string(), json!(runs)),
                ("concurrency".to_string(), json!([1, CREATE_CONCURRENCY])),
            ]
            .into_iter()
            .collect(),
            series,
            notes,
            details: Default::default(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_is_one_the_api_server_accepts() {
        let c = configuration("127.0.0.1:8443".parse().expect("addr"), "PEM");
        let typed: skiff_api::api::ValidatingWebhookConfiguration =
            skiff_api::manifest::decode(c).expect("a configuration");
        assert_eq!(typed.webhooks.len(), 1);
        let review = json!({"apiVersion": "admission.k8s.io/v1", "request": {"uid": "u"}});
        let answer: Value =
            serde_json::from_slice(&allow(review.to_string().as_bytes()).expect("allowed"))
                .expect("JSON");
        assert_eq!(answer["response"], json!({"uid": "u", "allowed": true}));
    }
}
