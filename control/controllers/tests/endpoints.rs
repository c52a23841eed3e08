//! The Endpoints controller against a real API server.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use skiff_testkit::build;
use std::time::Duration;

use common::*;
use skiff_api::Resource;
use skiff_api::api::{
    Condition, ContainerPort, EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectMeta,
    Pod, PodStatus, Service, ServicePort, ServiceSpec,
};
use skiff_client::{Client, DeleteParams, ListParams};
use skiff_controllers::endpoints::endpoints_update;

/// A pod `name` with labels `app=<app>` and a container port named `http` on 8080.
fn pod(name: &str, app: &str) -> Pod {
    let mut p = build::labeled_pod(build::pod(name), &[("app", app)]);
    build::spec_mut(&mut p).containers[0].ports = vec![ContainerPort {
        name: "http".into(),
        container_port: 8080,
        protocol: "TCP".into(),
        ..Default::default()
    }];
    p
}

/// Writes the pod's status as its node agent would: Running, `ip`, Ready or not.
async fn set_status(client: &Client, name: &str, ip: &str, ready: bool) {
    let api = client.namespaced::<Pod>("default");
    for _ in 0..10 {
        let mut p = api.get(name).await.expect("get pod");
        p.status = Some(PodStatus {
            phase: "Running".into(),
            pod_ip: ip.into(),
            conditions: vec![Condition {
                r#type: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        match api.update_status(&p).await {
            Ok(_) => return,
            Err(e) if e.is_conflict() => continue,
            Err(e) => panic!("pod status: {e}"),
        }
    }
    panic!("pod status: too many conflicts");
}

/// Creates pod `name` bound to node-1 with status `ip`/`ready`.
async fn running_pod(client: &Client, name: &str, app: &str, ip: &str, ready: bool) {
    let api = client.namespaced::<Pod>("default");
    api.create(&pod(name, app)).await.expect("create pod");
    api.bind(name, "node-1").await.expect("bind");
    set_status(client, name, ip, ready).await;
}

/// Changes pod `name` with `f` (retrying conflicts).
async fn edit_pod(client: &Client, name: &str, f: impl Fn(&mut Pod)) {
    let api = client.namespaced::<Pod>("default");
    for _ in 0..10 {
        let mut p = api.get(name).await.expect("get pod");
        f(&mut p);
        match api.update(&p).await {
            Ok(_) => return,
            Err(e) if e.is_conflict() => continue,
            Err(e) => panic!("update pod: {e}"),
        }
    }
    panic!("update pod: too many conflicts");
}

fn service(name: &str, selector: &[(&str, &str)]) -> Service {
    Service {
        metadata: Some(ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            labels: labels(&[("tier", "frontend")]),
            ..Default::default()
        }),
        spec: Some(ServiceSpec {
            selector: labels(selector),
            ports: vec![
                ServicePort {
                    name: "http".into(),
                    port: 80,
                    target_port: "http".into(),
                    ..Default::default()
                },
                ServicePort {
                    name: "metrics".into(),
                    port: 9090,
                    target_port: "9100".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ips(addrs: &[EndpointAddress]) -> Vec<&str> {
    addrs.iter().map(|a| a.ip.as_str()).collect()
}

/// Waits until Endpoints `name` has one subset with exactly these ready and not-ready IPs.
async fn wait_addresses(
    client: &Client,
    name: &str,
    ready: &[&str],
    not_ready: &[&str],
) -> Endpoints {
    eventually(
        &format!("endpoints {name} with {ready:?} / {not_ready:?}"),
        || async {
            let ep = client
                .namespaced::<Endpoints>("default")
                .get_opt(name)
                .await
                .ok()??;
            let ok = match ep.subsets.as_slice() {
                [s] => ips(&s.addresses) == ready && ips(&s.not_ready_addresses) == not_ready,
                [] => ready.is_empty() && not_ready.is_empty(),
                _ => false,
            };
            ok.then_some(ep)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn endpoints_follow_the_selected_pods() {
    let c = cluster().await;
    let _manager = start_manager(&c.client, "ep-test", None);
    for (i, name) in ["web-0", "web-1", "web-2"].iter().enumerate() {
        running_pod(&c.client, name, "web", &format!("10.1.0.{}", i + 1), true).await;
    }
    running_pod(&c.client, "db-0", "db", "10.1.0.9", true).await;
    let svc = c
        .client
        .namespaced::<Service>("default")
        .create(&service("web", &[("app", "web")]))
        .await
        .expect("create service");

    let ep = wait_addresses(&c.client, "web", &["10.1.0.1", "10.1.0.2", "10.1.0.3"], &[]).await;
    let subset = &ep.subsets[0];
    let ports: Vec<(&str, i32, &str)> = subset
        .ports
        .iter()
        .map(|p| (p.name.as_str(), p.port, p.protocol.as_str()))
        .collect();
    // The named targetPort resolved through the pods' container port.
    assert_eq!(ports, [("http", 8080, "TCP"), ("metrics", 9100, "TCP")]);
    let a = &subset.addresses[0];
    assert_eq!(a.node_name.as_deref(), Some("node-1"));
    let r = a.target_ref.as_ref().expect("targetRef");
    let pod0 = c
        .client
        .namespaced::<Pod>("default")
        .get("web-0")
        .await
        .expect("pod");
    assert_eq!(
        (
            r.kind.as_str(),
            r.namespace.as_str(),
            r.name.as_str(),
            r.uid.as_str()
        ),
        (
            "Pod",
            "default",
            "web-0",
            pod0.metadata.as_ref().map(|m| m.uid.as_str()).unwrap_or("")
        )
    );
    let meta = ep.metadata.clone().expect("metadata");
    assert_eq!(meta.labels, labels(&[("tier", "frontend")]));
    let owner = &meta.owner_references[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Service", "web")
    );
    assert_eq!(owner.uid, svc.metadata.as_ref().expect("meta").uid);

    // A change that does not affect the endpoints does not rewrite them.
    edit_pod(&c.client, "web-0", |p| {
        p.metadata_mut()
            .annotations
            .insert("note".into(), "unrelated".into());
    })
    .await;
    set_status(&c.client, "db-0", "10.1.0.9", false).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = c
        .client
        .namespaced::<Endpoints>("default")
        .get("web")
        .await
        .expect("get");
    assert_eq!(
        again.resource_version(),
        ep.resource_version(),
        "rewritten without a change"
    );
    // The API server drops updates that change nothing, so check the decision itself: the
    // stored object, as the server defaulted it, is what the controller wants.
    let pods = c
        .client
        .namespaced::<Pod>("default")
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("list pods")
        .items;
    let svc = c
        .client
        .namespaced::<Service>("default")
        .get("web")
        .await
        .expect("get");
    assert_eq!(endpoints_update(&svc, &pods, Some(&again)), None);

    // Not ready: moves to notReadyAddresses.
    set_status(&c.client, "web-1", "10.1.0.2", false).await;
    wait_addresses(&c.client, "web", &["10.1.0.1", "10.1.0.3"], &["10.1.0.2"]).await;

    // Relabelled out of the selector: removed.
    edit_pod(&c.client, "web-2", |p| {
        p.metadata_mut().labels.insert("app".into(), "other".into());
    })
    .await;
    wait_addresses(&c.client, "web", &["10.1.0.1"], &["10.1.0.2"]).await;

    // Deleted: removed.
    c.client
        .namespaced::<Pod>("default")
        .delete(
            "web-0",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .expect("delete pod");
    let ep = wait_addresses(&c.client, "web", &[], &["10.1.0.2"]).await;

    // A user edit of the managed Endpoints is reverted.
    let mut edited = ep.clone();
    edited.subsets = vec![EndpointSubset {
        addresses: vec![EndpointAddress {
            ip: "192.0.2.1".into(),
            ..Default::default()
        }],
        ports: vec![EndpointPort {
            port: 1234,
            ..Default::default()
        }],
        ..Default::default()
    }];
    c.client
        .namespaced::<Endpoints>("default")
        .update(&edited)
        .await
        .expect("edit endpoints");
    let reverted = wait_addresses(&c.client, "web", &[], &["10.1.0.2"]).await;
    assert_eq!(reverted.subsets[0].ports.len(), 2);

    // Deleting the Service deletes its Endpoints.
    c.client
        .namespaced::<Service>("default")
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete service");
    eventually("the endpoints of the deleted service to go", || async {
        c.client
            .namespaced::<Endpoints>("default")
            .get_opt("web")
            .await
            .ok()
            .and_then(|ep| ep.is_none().then_some(()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_resolving_different_ports_get_different_subsets() {
    let c = cluster().await;
    let _manager = start_manager(&c.client, "ep-ports", None);
    running_pod(&c.client, "named", "api", "10.2.0.1", true).await;
    // No container port named http: listed for the numeric targetPort only.
    let mut bare = pod("bare", "api");
    if let Some(spec) = bare.spec.as_mut() {
        spec.containers[0].ports.clear();
    }
    let api = c.client.namespaced::<Pod>("default");
    api.create(&bare).await.expect("create pod");
    set_status(&c.client, "bare", "10.2.0.2", true).await;
    c.client
        .namespaced::<Service>("default")
        .create(&service("api", &[("app", "api")]))
        .await
        .expect("create service");
    eventually("two subsets", || async {
        let ep = c
            .client
            .namespaced::<Endpoints>("default")
            .get_opt("api")
            .await
            .ok()??;
        let summary: Vec<(Vec<i32>, Vec<String>)> = ep
            .subsets
            .iter()
            .map(|s| {
                (
                    s.ports.iter().map(|p| p.port).collect(),
                    s.addresses.iter().map(|a| a.ip.clone()).collect(),
                )
            })
            .collect();
        (summary
            == [
                (vec![8080, 9100], vec!["10.2.0.1".to_string()]),
                (vec![9100], vec!["10.2.0.2".to_string()]),
            ])
        .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn endpoints_of_services_without_selector_are_left_alone() {
    let c = cluster().await;
    let _manager = start_manager(&c.client, "ep-manual", None);
    running_pod(&c.client, "web-0", "web", "10.1.0.1", true).await;
    let mut svc = service("external", &[]);
    if let Some(spec) = svc.spec.as_mut() {
        spec.ports.truncate(1);
        spec.ports[0].target_port = "80".into();
    }
    c.client
        .namespaced::<Service>("default")
        .create(&svc)
        .await
        .expect("create service");
    let manual = Endpoints {
        metadata: Some(ObjectMeta {
            name: "external".into(),
            namespace: "default".into(),
            ..Default::default()
        }),
        subsets: vec![EndpointSubset {
            addresses: vec![EndpointAddress {
                ip: "192.0.2.10".into(),
                ..Default::default()
            }],
            ports: vec![EndpointPort {
                name: "http".into(),
                port: 80,
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let created = c
        .client
        .namespaced::<Endpoints>("default")
        .create(&manual)
        .await
        .expect("create endpoints");
    // Pod changes and time pass; the user's object stays as it is.
    set_status(&c.client, "web-0", "10.1.0.1", false).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ep = c
        .client
        .namespaced::<Endpoints>("default")
        .get("external")
        .await
        .expect("get");
    assert_eq!(ep, created);
    // Not managed: deleting the Service leaves it too.
    c.client
        .namespaced::<Service>("default")
        .delete("external", &DeleteParams::default())
        .await
        .expect("delete service");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        c.client
            .namespaced::<Endpoints>("default")
            .get_opt("external")
            .await
            .expect("get")
            .is_some()
    );
}
