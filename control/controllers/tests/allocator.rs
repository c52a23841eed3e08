//! The Service allocator (clusterIPs, nodePorts) against a real API server.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use common::*;
use futures::future::join_all;
use skiff_api::api::{ObjectMeta, Service, ServicePort, ServiceSpec};
use skiff_client::{Client, DeleteParams, ListParams};
use skiff_controllers::manager::{ControllerName, ManagerConfig};

fn service(name: &str, ty: &str, ports: &[i32]) -> Service {
    Service {
        metadata: Some(ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            ..Default::default()
        }),
        spec: Some(ServiceSpec {
            r#type: ty.into(),
            selector: labels(&[("app", name)]),
            ports: ports
                .iter()
                .map(|p| ServicePort {
                    name: format!("p{p}"),
                    port: *p,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn spec(s: &Service) -> ServiceSpec {
    s.spec.clone().unwrap_or_default()
}

async fn get(client: &Client, name: &str) -> Service {
    client
        .namespaced::<Service>("default")
        .get(name)
        .await
        .expect("get service")
}

/// Waits until Service `name` has a clusterIP (and its nodePorts when it is a NodePort one).
async fn allocated(client: &Client, name: &str) -> Service {
    eventually(&format!("service {name} allocated"), || async {
        let s = client
            .namespaced::<Service>("default")
            .get(name)
            .await
            .ok()?;
        let sp = spec(&s);
        let ports_done = sp.r#type != "NodePort" || sp.ports.iter().all(|p| p.node_port != 0);
        (!sp.cluster_ip.is_empty() && ports_done).then_some(s)
    })
    .await
}

/// A manager running only the Service allocator, with `ips` and `ports` as its ranges.
fn allocator_only(client: &Client, ips: &str, ports: &str) -> Manager {
    let mut config = ManagerConfig::new("alloc-test");
    config.leader_election = None;
    config.controllers = [ControllerName::ServiceAllocator].into();
    config.service_cluster_ip_range = ips.parse().expect("cidr");
    config.service_node_port_range = ports.parse().expect("ports");
    start_manager_with(client, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_services_get_distinct_cluster_ips() {
    let c = cluster().await;
    let _manager = start_manager(&c.client, "alloc-ips", None);
    let api = c.client.namespaced::<Service>("default");
    let names: Vec<String> = (0..60).map(|i| format!("svc-{i}")).collect();
    let services: Vec<Service> = names
        .iter()
        .map(|n| service(n, "ClusterIP", &[80]))
        .collect();
    let created = join_all(services.iter().map(|s| api.create(s))).await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let range: skiff_controllers::ranges::Ipv4Cidr = "10.96.0.0/16".parse().expect("cidr");
    let mut seen = BTreeSet::new();
    for n in &names {
        let s = allocated(&c.client, n).await;
        let sp = spec(&s);
        let ip: Ipv4Addr = sp.cluster_ip.parse().expect("an IPv4 address");
        assert!(
            range.host_index(ip).is_some(),
            "{ip} is not a host of {range}"
        );
        assert_eq!(sp.cluster_ips, std::slice::from_ref(&sp.cluster_ip));
        assert!(seen.insert(ip), "{ip} handed out twice");
    }
    assert_eq!(seen.len(), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_node_port_services_get_distinct_ports() {
    let c = cluster().await;
    let _manager = start_manager(&c.client, "alloc-ports", None);
    let api = c.client.namespaced::<Service>("default");
    let names: Vec<String> = (0..30).map(|i| format!("np-{i}")).collect();
    let services: Vec<Service> = names
        .iter()
        .map(|n| service(n, "NodePort", &[80, 443]))
        .collect();
    let created = join_all(services.iter().map(|s| api.create(s))).await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let mut ports = BTreeSet::new();
    let mut ips = BTreeSet::new();
    for n in &names {
        let sp = spec(&allocated(&c.client, n).await);
        assert!(ips.insert(sp.cluster_ip.clone()));
        for p in &sp.ports {
            assert!((30000..=32767).contains(&p.node_port), "{}", p.node_port);
            assert!(
                ports.insert(p.node_port),
                "{} handed out twice",
                p.node_port
            );
        }
    }
    assert_eq!(ports.len(), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn user_chosen_values_are_kept_and_duplicates_reported() {
    let c = cluster().await;
    // Six host addresses; the user takes one, the allocator must not hand it out.
    let _manager = allocator_only(&c.client, "10.96.100.0/29", "30000-30009");
    let api = c.client.namespaced::<Service>("default");
    let mut mine = service("mine", "NodePort", &[80]);
    if let Some(s) = mine.spec.as_mut() {
        s.cluster_ip = "10.96.100.1".into();
        s.ports[0].node_port = 30000;
    }
    api.create(&mine).await.expect("create");
    let sp = spec(&allocated(&c.client, "mine").await);
    assert_eq!(sp.cluster_ip, "10.96.100.1");
    assert_eq!(sp.ports[0].node_port, 30000);

    let names: Vec<String> = (0..5).map(|i| format!("auto-{i}")).collect();
    for n in &names {
        api.create(&service(n, "NodePort", &[80]))
            .await
            .expect("create");
    }
    let mut ips = BTreeSet::new();
    for n in &names {
        let sp = spec(&allocated(&c.client, n).await);
        assert_ne!(sp.cluster_ip, "10.96.100.1");
        assert_ne!(sp.ports[0].node_port, 30000);
        assert!(ips.insert(sp.cluster_ip));
    }

    // A later Service with the same values is told, and keeps them.
    let mut copy = service("copy", "NodePort", &[80]);
    if let Some(s) = copy.spec.as_mut() {
        s.cluster_ip = "10.96.100.1".into();
        s.ports[0].node_port = 30000;
    }
    api.create(&copy).await.expect("create");
    let e = wait_for_event(&c.client, "default", "copy", "ClusterIPAlreadyAllocated").await;
    assert_eq!(e.r#type, "Warning");
    assert!(e.message.contains("10.96.100.1"), "{}", e.message);
    assert!(e.message.contains("default/mine"), "{}", e.message);
    wait_for_event(&c.client, "default", "copy", "PortAlreadyAllocated").await;
    let sp = spec(&get(&c.client, "copy").await);
    assert_eq!(
        (sp.cluster_ip.as_str(), sp.ports[0].node_port),
        ("10.96.100.1", 30000)
    );
    // The first holder is not blamed.
    let events = c
        .client
        .namespaced::<skiff_api::api::Event>("default")
        .list(&ListParams::default())
        .await
        .expect("events");
    assert!(
        !events
            .items
            .iter()
            .any(|e| e.involved_object.as_ref().is_some_and(|o| o.name == "mine"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_range_waits_for_a_deleted_service() {
    let c = cluster().await;
    let _manager = allocator_only(&c.client, "10.96.100.0/29", "30000-32767");
    let api = c.client.namespaced::<Service>("default");
    // /29: six host addresses (.1 to .6), never .0 or .7.
    let names: Vec<String> = (0..6).map(|i| format!("s-{i}")).collect();
    let services: Vec<Service> = names
        .iter()
        .map(|n| service(n, "ClusterIP", &[80]))
        .collect();
    let created = join_all(services.iter().map(|s| api.create(s))).await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let mut ips = BTreeSet::new();
    for n in &names {
        ips.insert(spec(&allocated(&c.client, n).await).cluster_ip);
    }
    let want: BTreeSet<String> = (1..=6).map(|i| format!("10.96.100.{i}")).collect();
    assert_eq!(ips, want);

    api.create(&service("waiting", "ClusterIP", &[80]))
        .await
        .expect("create");
    let e = wait_for_event(&c.client, "default", "waiting", "ClusterIPAllocationFailed").await;
    assert_eq!(e.r#type, "Warning");
    assert!(e.message.contains("10.96.100.0/29"), "{}", e.message);
    assert!(spec(&get(&c.client, "waiting").await).cluster_ip.is_empty());

    // Deleting a Service frees its IP, and the waiting one gets it.
    let freed = spec(&get(&c.client, "s-3").await).cluster_ip;
    api.delete("s-3", &DeleteParams::default())
        .await
        .expect("delete");
    let sp = spec(&allocated(&c.client, "waiting").await);
    assert_eq!(sp.cluster_ip, freed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_node_port_range_allocates_nothing_until_ports_are_freed() {
    let c = cluster().await;
    let _manager = allocator_only(&c.client, "10.96.100.0/24", "30000-30002");
    let api = c.client.namespaced::<Service>("default");
    api.create(&service("first", "NodePort", &[80, 81]))
        .await
        .expect("create");
    allocated(&c.client, "first").await;
    api.create(&service("second", "NodePort", &[80, 81]))
        .await
        .expect("create");
    let e = wait_for_event(&c.client, "default", "second", "NodePortAllocationFailed").await;
    assert!(e.message.contains("30000-30002"), "{}", e.message);
    // All or nothing: no clusterIP either.
    let sp = spec(&get(&c.client, "second").await);
    assert!(sp.cluster_ip.is_empty());
    assert!(sp.ports.iter().all(|p| p.node_port == 0));

    api.delete("first", &DeleteParams::default())
        .await
        .expect("delete");
    let sp = spec(&allocated(&c.client, "second").await);
    let ports: BTreeSet<i32> = sp.ports.iter().map(|p| p.node_port).collect();
    assert_eq!(ports.len(), 2);
    assert!(ports.iter().all(|p| (30000..=30002).contains(p)));
}
