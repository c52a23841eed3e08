//! `custom-resources`: REST creates of a custom resource whose schema is a Deployment's
//! against REST creates of a ConfigMap carrying the same bytes, in one run, on one API
//! server over one etcd.
//!
//! The definition's schema is a Deployment spec's, inlined from the same type definitions the
//! API server serves (`skiff_api::schema`: every field of `DeploymentSpec` down to the
//! containers' probes, a few hundred properties), so each create prunes, defaults and
//! validates against a schema of that size. Each custom object's `spec` is a realistic
//! Deployment spec (three containers with ports, env, resources and probes); the ConfigMap
//! holds that spec's JSON text as its one data value, so both bodies are about as long.
//! Creates run [`CREATE_CONCURRENCY`] at a time on keep-alive HTTP/1.1 connections, the
//! answers decoded as JSON; the kinds take turns going first; each run is repeated R times
//! (default 3) and each kind's median run reported. Every process started is killed by pid
//! when its guard drops, also on error.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use hyper::{Method, StatusCode};
use serde_json::{Map, Value, json};
use skiff_api::schema::{self, Ty};
use skiff_tests::{ApiServer, Backend, EtcdServer};
use tracing::info;

use super::Options;
use crate::apiload::{self, CREATE_CONCURRENCY, RestCreates as Creates, post_created as post};
use crate::host;
use crate::http1::{Pool, Tls};
use crate::report::{Measured, Role, Series, SuiteReport, fmt_share};

pub const NAME: &str = "custom-resources";
pub const TITLE: &str = "Custom resources (a Deployment-sized schema) against ConfigMaps";

const GROUP: &str = "bench.skiff.io";
const PLURAL: &str = "benchdeployments";
/// The target: custom resource creates/s at this share of ConfigMap creates/s.
const TARGET_SHARE: f64 = 0.8;
/// Creates per kind per run: runs of a few seconds each. With 2000 (under a second), the
/// connections' and allocator's warm-up swung one kind's throughput by ±10% between runs.
const DEFAULT_CREATES: usize = 10_000;
const QUICK_CREATES: usize = 30;
const DEFAULT_RUNS: usize = 5;
const QUICK_RUNS: usize = 1;
/// Nesting the inlined schema stops at (a Deployment's types go about 8 deep).
const MAX_DEPTH: usize = 12;

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// The structural schema of message `name`, inlined (every type spelled out: a definition's
/// schema has no references).
fn message_schema(name: &str, depth: usize) -> Value {
    let Some(m) = schema::message(name).filter(|_| depth < MAX_DEPTH) else {
        return json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    };
    let properties: Map<String, Value> = m
        .fields
        .iter()
        .map(|f| {
            let one = match f.ty {
                Ty::String => json!({"type": "string"}),
                Ty::Bool => json!({"type": "boolean"}),
                Ty::Int32 => json!({"type": "integer", "format": "int32"}),
                Ty::Int64 => json!({"type": "integer", "format": "int64"}),
                Ty::Double => json!({"type": "number"}),
                Ty::Bytes => json!({"type": "string", "format": "byte"}),
                Ty::IntOrString | Ty::Quantity => json!({"x-kubernetes-int-or-string": true}),
                Ty::Json => json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
                Ty::Message(inner) => message_schema(inner, depth + 1),
            };
            let value = if f.list {
                json!({"type": "array", "items": one})
            } else if f.map {
                json!({"type": "object", "additionalProperties": one})
            } else {
                one
            };
            (f.json.to_string(), value)
        })
        .collect();
    json!({"type": "object", "properties": properties})
}

fn definition() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{PLURAL}.{GROUP}")},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "benchdeployment", "kind": "BenchDeployment"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": message_schema("DeploymentSpec", 0)},
                }},
            }],
        },
    })
}

/// The spec every custom object carries (and every ConfigMap as text).
fn deployment_spec() -> Value {
    let container = |name: &str, port: u16| {
        json!({
            "name": name,
            "image": format!("registry.example.com/shop/{name}:1.4.2"),
            "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
            "env": [
                {"name": "LOG_LEVEL", "value": "info"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "resources": {
                "requests": {"cpu": "100m", "memory": "128Mi"},
                "limits": {"cpu": "500m", "memory": "256Mi"},
            },
            "readinessProbe": {"httpGet": {"path": "/ready", "port": port}, "periodSeconds": 5},
            "livenessProbe": {"tcpSocket": {"port": port}, "initialDelaySeconds": 10},
        })
    };
    json!({
        "replicas": 3,
        "selector": {"matchLabels": {"app": "shop"}},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
        "template": {
            "metadata": {"labels": {"app": "shop", "tier": "web"}},
            "spec": {
                "containers": [container("web", 8080), container("cart", 8081), container("search", 8082)],
                "terminationGracePeriodSeconds": 30,
            },
        },
    })
}

fn custom_object(name: &str, spec: &Value) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/v1"), "kind": "BenchDeployment",
        "metadata": {"name": name}, "spec": spec,
    })
}

fn config_map(name: &str, spec: &Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": {"spec": spec.to_string()},
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Custom,
    ConfigMap,
}

impl Kind {
    fn collection(self, ns: &str) -> String {
        match self {
            Kind::Custom => format!("/apis/{GROUP}/v1/namespaces/{ns}/{PLURAL}"),
            Kind::ConfigMap => format!("/api/v1/namespaces/{ns}/configmaps"),
        }
    }

    fn object(self, name: &str, spec: &Value) -> Value {
        match self {
            Kind::Custom => custom_object(name, spec),
            Kind::ConfigMap => config_map(name, spec),
        }
    }
}

async fn creates(pool: &Pool, kind: Kind, ns: &str, n: usize, api_pid: u32) -> Result<Creates> {
    let spec = deployment_spec();
    let path = kind.collection(ns);
    post(pool, &path, &kind.object("warmup", &spec))
        .await
        .context("warm-up")?;
    let objects: Vec<Value> = (0..n)
        .map(|i| kind.object(&format!("o-{i:05}"), &spec))
        .collect();
    apiload::rest_creates(pool, &path, objects, CREATE_CONCURRENCY, api_pid).await
}

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
    let etcd = EtcdServer::start().map_err(|e| anyhow::anyhow!("starting etcd: {}", e.0))?;
    let server = ApiServer::start(Backend::Etcd(etcd.endpoint.clone()));
    let (api_pid, exe) = host::apiserver_pid(&server, &bin_dir)?;
    env.binaries.insert("skiff-apiserver".into(), exe);
    let config = server.client_config();
    let tls = Tls::for_config(&config)?;
    let pool = Pool::connect(server.addr, tls.as_ref(), CREATE_CONCURRENCY).await?;

    post(
        &pool,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        &definition(),
    )
    .await
    .context("creating the definition")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = pool
            .request(Method::GET, &Kind::Custom.collection("default"), None)
            .await?;
        if status == StatusCode::OK {
            break;
        }
        if Instant::now() > deadline {
            bail!("the definition was not served within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let schema_bytes = definition().to_string().len();
    let body_bytes = |k: Kind| k.object("o-00000", &deployment_spec()).to_string().len();

    let run_id = skiff_tests::unique();
    let mut results: Vec<(Creates, Creates)> = Vec::with_capacity(runs);
    for r in 0..runs {
        let order = if r % 2 == 0 {
            [Kind::Custom, Kind::ConfigMap]
        } else {
            [Kind::ConfigMap, Kind::Custom]
        };
        let mut custom = None;
        let mut typed = None;
        for kind in order {
            let ns = format!("perf-{run_id}-{r}-{}", matches!(kind, Kind::Custom) as u8);
            post(
                &pool,
                "/api/v1/namespaces",
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .await
            .context("creating a namespace")?;
            info!(run = r + 1, ?kind, creates = n, "creates");
            let c = creates(&pool, kind, &ns, n, api_pid)
                .await
                .with_context(|| format!("{kind:?} creates"))?;
            match kind {
                Kind::Custom => custom = Some(c),
                Kind::ConfigMap => typed = Some(c),
            }
        }
        results.push((
            custom.context("no custom creates")?,
            typed.context("no ConfigMap creates")?,
        ));
    }
    drop(pool);
    drop(server);
    drop(etcd);

    let median = |pick: fn(&(Creates, Creates)) -> &Creates| {
        crate::stats::median_by(&results, |r| pick(r).throughput()).map(pick)
    };
    let (Some(custom), Some(typed)) = (median(|r| &r.0), median(|r| &r.1)) else {
        bail!("no runs");
    };
    let group = format!("create, {CREATE_CONCURRENCY} in flight");
    let series = vec![
        Series::new(
            "custom resource create",
            Role::Skiff,
            &format!(
                "POST {} of a {} B JSON object (a Deployment spec) checked against a \
                 Deployment-sized structural schema ({schema_bytes} B definition); {n} creates",
                Kind::Custom.collection("NS"),
                body_bytes(Kind::Custom)
            ),
            &custom.calls,
            Some(custom.wall),
        )?
        .with_throughput(custom.calls.len(), custom.wall)
        .in_group(&group),
        Series::new(
            "ConfigMap create",
            Role::Baseline,
            &format!(
                "POST {} of a {} B ConfigMap holding the same spec as text; {n} creates",
                Kind::ConfigMap.collection("NS"),
                body_bytes(Kind::ConfigMap)
            ),
            &typed.calls,
            Some(typed.wall),
        )?
        .with_throughput(typed.calls.len(), typed.wall)
        .in_group(&group),
    ];
    let share = custom.throughput() / typed.throughput().max(f64::EPSILON);
    let verdict = if share >= TARGET_SHARE {
        "holds"
    } else {
        "does NOT hold"
    };
    let per_run: Vec<String> = results
        .iter()
        .enumerate()
        .map(|(i, (c, t))| {
            format!(
                "run {}: custom {:.0}/s, ConfigMap {:.0}/s ({})",
                i + 1,
                c.throughput(),
                t.throughput(),
                fmt_share(c.throughput() / t.throughput().max(f64::EPSILON))
            )
        })
        .collect();
    let notes = vec![
        format!(
            "Target: custom resource creates/s ≥ {} of ConfigMap creates/s — {verdict}: {:.0}/s \
             is {} of {:.0}/s (each kind's median run).",
            fmt_share(TARGET_SHARE),
            custom.throughput(),
            fmt_share(share),
            typed.throughput()
        ),
        format!(
            "API server CPU per create (median runs): custom {:.3} ms, ConfigMap {:.3} ms.",
            custom.api_cpu.as_secs_f64() * 1e3 / n as f64,
            typed.api_cpu.as_secs_f64() * 1e3 / n as f64
        ),
        format!(
            "One API server (skiff-apiserver --store etcd, one throwaway etcd on loopback), \
             the bench and the servers sharing the machine's {} CPUs; the kinds took turns \
             creating first; {} run(s): {}.",
            env.cpus,
            runs,
            per_run.join("; ")
        ),
        "A webhook's added latency is the admission-webhooks suite's.".to_string(),
    ];
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
                ("concurrency".to_string(), json!(CREATE_CONCURRENCY)),
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
    fn the_schema_is_a_deployment_spec_s_and_structural() {
        let s = message_schema("DeploymentSpec", 0);
        let containers =
            &s["properties"]["template"]["properties"]["spec"]["properties"]["containers"];
        assert_eq!(containers["type"], "array");
        assert_eq!(
            containers["items"]["properties"]["resources"]["properties"]["limits"]["additionalProperties"]
                ["x-kubernetes-int-or-string"],
            true
        );
        let text = s.to_string();
        assert!(
            text.matches("\"properties\"").count() > 50,
            "{}",
            text.len()
        );
        // The API server's own check: structural, and the objects pass it.
        let raw = &definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let schema =
            skiff_schema::Schema::new(raw, "openAPIV3Schema").unwrap_or_else(|e| panic!("{e:?}"));
        let errors = schema.validate(&custom_object("o", &deployment_spec()), None);
        assert!(errors.is_empty(), "{errors:?}");
    }
}
