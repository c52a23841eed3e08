//! The Service load balancer's controller end to end: a real in-process API server, the real
//! programs on a test cgroup, a client in its own network namespace, backends in another (the
//! fixture and its safety rules are `skiff_datapath::testing`'s). Needs root.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use skiff_api::api::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectMeta, Service, ServicePort,
    ServiceSpec,
};
use skiff_apiserver::ApiServerOptions;
use skiff_client::controller::{CancelToken, Informers};
use skiff_client::{Client, DeleteParams};
use skiff_testkit::server::TestServer;
use skiff_testkit::{WAIT, eventually};

use super::Proxy;
use skiff_datapath::lb::Frontend;
use skiff_datapath::testing::{
    BACKEND_TCP_PORT, BACKEND_UDP_PORT, LbFixture, TCP_PORT, UDP_PORT, VIP, backend_ip,
    backend_name, tcp_frontend, udp_frontend,
};

fn meta(name: &str) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: name.into(),
        namespace: "default".into(),
        ..Default::default()
    })
}

/// A Service without selector (its Endpoints are the test's) with a chosen clusterIP.
fn service(name: &str, ip: &str, ports: &[(&str, u16, &str)]) -> Service {
    Service {
        metadata: meta(name),
        spec: Some(ServiceSpec {
            cluster_ip: ip.into(),
            ports: ports
                .iter()
                .map(|(n, port, proto)| ServicePort {
                    name: n.to_string(),
                    port: i32::from(*port),
                    protocol: proto.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Endpoints of `web`: backends `ready` and `not_ready` (indexes of the fixture's backends).
fn web_endpoints(ready: &[usize], not_ready: &[usize]) -> Endpoints {
    let addrs = |which: &[usize]| {
        which
            .iter()
            .map(|i| EndpointAddress {
                ip: backend_ip(*i).to_string(),
                ..Default::default()
            })
            .collect()
    };
    Endpoints {
        metadata: meta("web"),
        subsets: vec![EndpointSubset {
            addresses: addrs(ready),
            not_ready_addresses: addrs(not_ready),
            ports: vec![
                EndpointPort {
                    name: "http".into(),
                    port: i32::from(BACKEND_TCP_PORT),
                    protocol: "TCP".into(),
                    ..Default::default()
                },
                EndpointPort {
                    name: "dns".into(),
                    port: i32::from(BACKEND_UDP_PORT),
                    protocol: "UDP".into(),
                    ..Default::default()
                },
            ],
        }],
        ..Default::default()
    }
}

/// The backend names programmed for `frontend`, with their ids.
fn programmed(proxy: &Proxy, frontend: &Frontend) -> Option<BTreeMap<String, u32>> {
    let report = proxy.services_report("n").expect("report");
    report
        .services
        .iter()
        .find(|s| s.frontend == frontend.to_string())
        .map(|s| {
            s.backends
                .iter()
                .filter_map(|b| Some((backend_name(b.ip.parse().ok()?), b.id)))
                .collect()
        })
}

fn names(which: &[&str]) -> BTreeSet<String> {
    which.iter().map(|s| s.to_string()).collect()
}

/// Serves the agent's `/bpf` routes and `/metrics` (no pods) on a loopback port and GETs
/// `path` (HTTP/1.1).
async fn http_get(proxy: Result<std::sync::Arc<Proxy>, String>, path: &str) -> (u16, String) {
    use crate::api::{Sources, bpf_router, metrics_router, test_http};
    let sources = Sources {
        node: "node-x".into(),
        pods: Default::default(),
        accounting: None,
        proxy,
        network_policy: None,
    };
    let app = bpf_router(sources.clone()).merge(metrics_router(sources));
    let (status, _, body) = test_http::get(app, path).await;
    (status, body)
}

struct RunningProxy {
    proxy: std::sync::Arc<Proxy>,
    stop: CancelToken,
    task: tokio::task::JoinHandle<()>,
}

fn start(fx: &LbFixture, client: &Client) -> RunningProxy {
    let proxy = Proxy::new(fx.load_attached(), "node-1", Vec::new());
    let stop = CancelToken::new();
    let task = tokio::spawn(
        proxy
            .clone()
            .run(Informers::new(client.clone()), stop.clone()),
    );
    RunningProxy { proxy, stop, task }
}

impl RunningProxy {
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the proxy stops")
            .expect("the proxy task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_services_and_endpoints_incrementally_and_across_restarts() {
    let mut fx = LbFixture::new();
    let server = TestServer::start(ApiServerOptions::default()).await;
    let client = Client::connect(&server.endpoint()).await.expect("connect");
    let services = client.namespaced::<Service>("default");
    let endpoints = client.namespaced::<Endpoints>("default");
    let vip = VIP.to_string();
    services
        .create(&service(
            "web",
            &vip,
            &[("http", TCP_PORT, "TCP"), ("dns", UDP_PORT, "UDP")],
        ))
        .await
        .expect("create web");
    endpoints
        .create(&web_endpoints(&[1, 2], &[3]))
        .await
        .expect("create endpoints");

    let run = start(&fx, &client);
    let p = run.proxy.clone();
    let first = eventually("web:80 programmed with b1, b2", || async {
        programmed(&p, &tcp_frontend())
            .filter(|b| b.keys().cloned().collect::<BTreeSet<_>>() == names(&["b1", "b2"]))
    })
    .await;
    eventually("web:53 programmed", || async {
        programmed(&p, &udp_frontend()).filter(|b| b.len() == 2)
    })
    .await;

    assert_report_shapes(&p, &vip);

    assert_http_reports(&p).await;

    // Traffic goes to the ready backends only.
    let (seen, _) = tokio::task::block_in_place(|| fx.connects(40));
    assert_eq!(
        seen.keys().cloned().collect::<BTreeSet<_>>(),
        names(&["b1", "b2"])
    );
    let udp = tokio::task::block_in_place(|| fx.client(&["udp", &vip, &UDP_PORT.to_string()]));
    assert_eq!(udp["unconnected"]["from"], format!("{vip}:{UDP_PORT}"));

    assert_metrics_match_backends(&p).await;

    let second = replace_b1_with_b3(&mut fx, &p, &endpoints, &first).await;

    let gone = create_service_without_backends(&mut fx, &p, &services).await;

    // Restart: the old proxy goes (its programs stay attached), the Service goes meanwhile.
    let (mut held, held_on) = tokio::task::block_in_place(|| fx.hold());
    run.stop().await;
    drop(p);
    services
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    let run = start(&fx, &client);
    let p = run.proxy.clone();
    eventually("gone removed after the restart", || async {
        programmed(&p, &gone).is_none().then_some(())
    })
    .await;
    let restarted = programmed(&p, &tcp_frontend()).expect("web:80 still programmed");
    assert_eq!(restarted, second, "same backends and ids after the restart");
    // Let the controller reconcile everything once; nothing but the removal was written.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(p.writes(), 1, "only the DeleteService of the gone frontend");
    let (echo, peer) = tokio::task::block_in_place(|| held.echo("hello"));
    assert_eq!(
        echo, "hello",
        "connection to {held_on} survived the restart"
    );
    assert_eq!(peer, format!("{vip}:{TCP_PORT}"));

    // Deleting the Service removes both frontends.
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("web removed", || async {
        let r = p.services_report("n").unwrap();
        r.services.is_empty().then_some(())
    })
    .await;
    let unroutable = tokio::task::block_in_place(|| fx.client(&["refused", &vip, "80"]));
    assert_eq!(unroutable["errno"], libc::ENETUNREACH);
    run.stop().await;
}

/// The report carries the owner and the documented JSON shape.
fn assert_report_shapes(p: &Proxy, vip: &str) {
    let report = serde_json::to_value(p.services_report("node-x").unwrap()).unwrap();
    assert_eq!(report["node"], "node-x");
    let http = report["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["portName"] == "http")
        .expect("http frontend");
    assert_eq!(http["service"], "default/web");
    assert_eq!(http["frontend"], format!("{vip}:{TCP_PORT}/TCP"));
    for key in [
        "id",
        "ip",
        "port",
        "protocol",
        "sessionAffinity",
        "affinityTimeoutSeconds",
        "connects",
        "sends",
        "backends",
    ] {
        assert!(http.get(key).is_some(), "no {key} in {http}");
    }
    for key in ["id", "slot", "ip", "port", "address", "connects", "sends"] {
        assert!(http["backends"][0].get(key).is_some(), "no {key} in {http}");
    }
    assert!(report["maps"][0]["maxEntries"].is_u64());
    assert!(
        report["programming"]["latencyMicros"]["count"]
            .as_u64()
            .unwrap()
            >= 1
    );
    let backends = serde_json::to_value(p.backends_report("node-x").unwrap()).unwrap();
    let list = backends["backends"].as_array().unwrap();
    assert_eq!(list.len(), 4, "2 TCP + 2 UDP backends: {backends}");
    for key in [
        "id",
        "ip",
        "port",
        "address",
        "protocol",
        "serviceId",
        "frontend",
        "service",
        "portName",
        "slot",
        "connects",
        "sends",
    ] {
        assert!(list[0].get(key).is_some(), "no {key} in {backends}");
    }
}

/// The same through the agent's HTTP API, and a 503 where the LB does not run.
async fn assert_http_reports(p: &Arc<Proxy>) {
    let (status, body) = http_get(Ok(p.clone()), "/bpf/services").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["services"].as_array().map(Vec::len), Some(2), "{v}");
    let (status, body) = http_get(Ok(p.clone()), "/bpf/backends").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["backends"].as_array().map(Vec::len), Some(4), "{v}");
    let (status, body) = http_get(Err("disabled (--no-service-lb)".into()), "/bpf/services").await;
    assert_eq!(status, 503);
    assert!(body.contains("disabled (--no-service-lb)"), "{body}");
}

/// /metrics shows the same per-backend counters as /bpf/backends.
async fn assert_metrics_match_backends(p: &Arc<Proxy>) {
    let (_, body) = http_get(Ok(p.clone()), "/bpf/backends").await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let (status, metrics) = http_get(Ok(p.clone()), "/metrics").await;
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.lines().any(|l| l == "skiff_lb_up 1"), "{metrics}");
    let mut compared = 0;
    for b in v["backends"].as_array().unwrap() {
        let line = format!(
            "skiff_lb_backend_connects_total{{service=\"default/web\",port_name={},frontend={},backend={}}} {}",
            b["portName"], b["frontend"], b["address"], b["connects"]
        );
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in\n{metrics}"
        );
        compared += b["connects"].as_u64().unwrap();
    }
    assert!(compared >= 40, "the connects were counted: {v}");
    let (status, metrics) = http_get(Err("disabled".into()), "/metrics").await;
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.lines().any(|l| l == "skiff_lb_up 0"), "{metrics}");
}

/// b1 goes, b3 becomes ready: only those entries change. Returns web:80's backends.
async fn replace_b1_with_b3(
    fx: &mut LbFixture,
    p: &Proxy,
    endpoints: &skiff_client::Api<Endpoints>,
    first: &BTreeMap<String, u32>,
) -> BTreeMap<String, u32> {
    let writes = p.writes();
    let mut eps = endpoints.get("web").await.unwrap();
    eps.subsets = web_endpoints(&[2, 3], &[]).subsets;
    endpoints.update(&eps).await.expect("update endpoints");
    let second = eventually("web:80 moved to b2, b3", || async {
        programmed(p, &tcp_frontend())
            .filter(|b| b.keys().cloned().collect::<BTreeSet<_>>() == names(&["b2", "b3"]))
    })
    .await;
    assert_eq!(second["b2"], first["b2"], "b2 kept its backend id");
    eventually("both ports reprogrammed", || async {
        programmed(p, &udp_frontend())
            .filter(|b| b.contains_key("b3"))
            .map(|_| ())
    })
    .await;
    // Per port: add b3 (counters, backend, slot, count) and remove b1 (move, count, slot,
    // backend, counters) at most: 9 writes each, not a rewrite of everything.
    let delta = p.writes() - writes;
    let latency = p.latency();
    eprintln!(
        "programming: {} reconciles with writes, mean {} µs",
        latency.count,
        latency.sum / latency.count.max(1)
    );
    assert!(
        delta <= 18,
        "{delta} writes for a one-backend change per port"
    );
    let (seen, _) = tokio::task::block_in_place(|| fx.connects(30));
    assert!(!seen.contains_key("b1"), "{seen:?}");
    second
}

/// A second Service, without backends (connections refused), that will be deleted while the
/// agent is away. Returns its frontend.
async fn create_service_without_backends(
    fx: &mut LbFixture,
    p: &Proxy,
    services: &skiff_client::Api<Service>,
) -> Frontend {
    services
        .create(&service("gone", "10.96.0.20", &[("", 80, "TCP")]))
        .await
        .unwrap();
    let gone = Frontend::new(
        "10.96.0.20".parse().unwrap(),
        80,
        skiff_datapath::lb::Protocol::Tcp,
    );
    eventually("gone programmed (no backends)", || async {
        programmed(p, &gone)
    })
    .await;
    let refused = tokio::task::block_in_place(|| fx.client(&["refused", "10.96.0.20", "80"]));
    assert_eq!(refused["errno"], libc::ECONNREFUSED);
    gone
}
