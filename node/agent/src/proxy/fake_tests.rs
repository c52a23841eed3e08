//! The Service reconciler against a real in-process API server and the in-memory data path
//! (`FakeLb`): the exact map write plan of each change, without root or a kernel.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use skiff_api::api::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectMeta, Service, ServicePort,
    ServiceSpec,
};
use skiff_apiserver::ApiServerOptions;
use skiff_client::controller::{CancelToken, Informers};
use skiff_client::{Client, DeleteParams};
use skiff_datapath::lb::fake::FakeLb;
use skiff_datapath::lb::{LbConfig, Op};
use skiff_testkit::server::TestServer;

use super::Proxy;

use skiff_testkit::WAIT;

fn meta(name: &str) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: name.into(),
        namespace: "default".into(),
        ..Default::default()
    })
}

fn service(name: &str, ip: &str, node_port: Option<i32>) -> Service {
    Service {
        metadata: meta(name),
        spec: Some(ServiceSpec {
            cluster_ip: ip.into(),
            r#type: if node_port.is_some() {
                "NodePort"
            } else {
                "ClusterIP"
            }
            .into(),
            ports: vec![ServicePort {
                name: "http".into(),
                port: 80,
                protocol: "TCP".into(),
                node_port: node_port.unwrap_or(0),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn endpoints(name: &str, ready: &[&str]) -> Endpoints {
    Endpoints {
        metadata: meta(name),
        subsets: vec![EndpointSubset {
            addresses: ready
                .iter()
                .map(|ip| EndpointAddress {
                    ip: ip.to_string(),
                    ..Default::default()
                })
                .collect(),
            ports: vec![EndpointPort {
                name: "http".into(),
                port: 8080,
                protocol: "TCP".into(),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The writes made since the last call, each as a short string (`put-service 10.96.0.10:80/TCP`,
/// `put-slot 1/0 -> 2`, ...), once `wanted` of them have arrived and nothing more came for
/// 200 ms.
async fn take_writes(log: &Arc<Mutex<Vec<Op>>>, wanted: usize) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut seen = 0;
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        let n = log.lock().map(|l| l.len()).unwrap_or(0);
        if n != seen {
            seen = n;
            quiet_since = tokio::time::Instant::now();
        }
        if n >= wanted && quiet_since.elapsed() >= Duration::from_millis(200) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {WAIT:?} for {wanted} writes, have {n}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ops: Vec<Op> = log
        .lock()
        .map(|mut l| l.drain(..).collect())
        .unwrap_or_default();
    ops.iter().map(show).collect()
}

fn show(op: &Op) -> String {
    match op {
        Op::PutService { frontend, value } => {
            format!("put-service {frontend} count={}", value.count)
        }
        Op::DeleteService { frontend } => format!("delete-service {frontend}"),
        Op::PutSlot { key, backend_id } => {
            format!("put-slot {}/{} -> {backend_id}", key.service_id, key.slot)
        }
        Op::DeleteSlot { key } => format!("delete-slot {}/{}", key.service_id, key.slot),
        Op::PutBackend { id, backend } => format!("put-backend {id} {}", backend.addr),
        Op::DeleteBackend { id } => format!("delete-backend {id}"),
        Op::PutCounters { id } => format!("put-counters {id}"),
        Op::DeleteCounters { id } => format!("delete-counters {id}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_writes_exactly_the_difference() {
    let server = TestServer::start(ApiServerOptions::default()).await;
    let client = Client::connect(&server.endpoint()).await.expect("connect");
    let services = client.namespaced::<Service>("default");
    let eps = client.namespaced::<Endpoints>("default");
    let lb = FakeLb::new(LbConfig::default());
    let log = lb.write_log();
    let proxy = Proxy::new(lb, "node-1", vec!["192.168.100.1".parse().expect("ip")]);
    let stop = CancelToken::new();
    let task = tokio::spawn(
        proxy
            .clone()
            .run(Informers::new(client.clone()), stop.clone()),
    );

    // A new Service with two ready backends (its Endpoints exist first, so one reconcile sees
    // both): the service entry is created empty (connections refused, its id taken), then
    // the backends (with their counters), the slots, and last the count that makes them
    // visible.
    eps.create(&endpoints("web", &["10.244.1.5", "10.244.1.6"]))
        .await
        .expect("create endpoints");
    tokio::time::sleep(Duration::from_millis(100)).await;
    services
        .create(&service("web", "10.96.0.10", None))
        .await
        .expect("create service");
    let writes = take_writes(&log, 8).await;
    assert_eq!(
        writes,
        [
            "put-service 10.96.0.10:80/TCP count=0",
            "put-counters 1",
            "put-backend 1 10.244.1.5:8080",
            "put-counters 2",
            "put-backend 2 10.244.1.6:8080",
            "put-slot 1/0 -> 1",
            "put-slot 1/1 -> 2",
            "put-service 10.96.0.10:80/TCP count=2",
        ],
        "{writes:?}"
    );

    an_unrelated_change_writes_nothing(&services, &log).await;

    // One backend goes: the count drops first (no new connection picks it), then its slot
    // and entries go.
    let mut one = eps.get("web").await.expect("get endpoints");
    one.subsets = endpoints("web", &["10.244.1.5"]).subsets;
    eps.update(&one).await.expect("update endpoints");
    let writes = take_writes(&log, 4).await;
    assert_eq!(
        writes,
        [
            "put-service 10.96.0.10:80/TCP count=1",
            "delete-slot 1/1",
            "delete-backend 2",
            "delete-counters 2",
        ],
        "{writes:?}"
    );

    nodeport_gets_a_frontend_per_node_address(&client, &log, &proxy).await;

    // Deleting a Service removes its frontend first, then what only it used.
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    let writes = take_writes(&log, 4).await;
    assert_eq!(
        writes,
        [
            "delete-service 10.96.0.10:80/TCP",
            "delete-slot 1/0",
            "delete-backend 1",
            "delete-counters 1",
        ],
        "{writes:?}"
    );
    assert!(proxy.writes() >= 23, "writes counted: {}", proxy.writes());
    assert!(proxy.latency().count >= 4, "latency observed per reconcile");

    stop.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the proxy stops")
        .expect("the proxy task");
}

/// A NodePort Service gets its clusterIP frontend and one per node address, owned by it in
/// the report.
async fn nodeport_gets_a_frontend_per_node_address(
    client: &Client,
    log: &Arc<Mutex<Vec<Op>>>,
    proxy: &Proxy,
) {
    let services = client.namespaced::<Service>("default");
    let eps = client.namespaced::<Endpoints>("default");
    eps.create(&endpoints("np", &["10.244.1.7"]))
        .await
        .expect("create np endpoints");
    tokio::time::sleep(Duration::from_millis(100)).await;
    services
        .create(&service("np", "10.96.0.20", Some(30080)))
        .await
        .expect("create nodeport");
    let writes = take_writes(log, 10).await;
    for frontend in ["10.96.0.20:80/TCP", "192.168.100.1:30080/TCP"] {
        assert!(
            writes
                .iter()
                .any(|w| w == &format!("put-service {frontend} count=1")),
            "{frontend} programmed: {writes:?}"
        );
    }
    let report = proxy.services_report("node-1").expect("report");
    let owned: Vec<(String, Option<String>)> = report
        .services
        .iter()
        .map(|s| (s.frontend.clone(), s.service.clone()))
        .collect();
    assert_eq!(
        owned,
        [
            (
                "10.96.0.10:80/TCP".to_string(),
                Some("default/web".to_string())
            ),
            (
                "10.96.0.20:80/TCP".to_string(),
                Some("default/np".to_string())
            ),
            (
                "192.168.100.1:30080/TCP".to_string(),
                Some("default/np".to_string())
            ),
        ]
    );
}

/// An update that changes nothing the data path uses writes nothing.
async fn an_unrelated_change_writes_nothing(
    services: &skiff_client::Api<Service>,
    log: &Arc<Mutex<Vec<Op>>>,
) {
    let mut same = services.get("web").await.expect("get");
    same.metadata
        .get_or_insert_with(Default::default)
        .annotations
        .insert("note".into(), "unrelated".into());
    services.update(&same).await.expect("annotate");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        log.lock().map(|l| l.is_empty()).unwrap_or(false),
        "no write for an unrelated change: {:?}",
        log.lock().map(|l| l.iter().map(show).collect::<Vec<_>>())
    );
}
