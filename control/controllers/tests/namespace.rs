//! The namespace controller against a real API server, with the other controllers and a fake
//! kubelet running too.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::time::Duration;

use common::*;
use skiff_api::Resource;
use skiff_api::api::{
    Deployment, DeploymentSpec, Endpoints, Event, Lease, Namespace, ObjectMeta, ObjectReference,
    Pod, ReplicaSet, Service, ServicePort, ServiceSpec,
};
use skiff_client::{Client, DeleteParams, ListParams};
use skiff_controllers::namespace::CONTENT_REMAINING;

fn in_ns(ns: &str, name: &str) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: name.into(),
        namespace: ns.into(),
        ..Default::default()
    })
}

async fn count<T: Resource>(client: &Client, ns: &str) -> usize {
    client
        .namespaced::<T>(ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items.len())
        .unwrap_or(0)
}

/// How many objects of each kind the namespace holds.
async fn content(client: &Client, ns: &str) -> [usize; 7] {
    [
        count::<Deployment>(client, ns).await,
        count::<ReplicaSet>(client, ns).await,
        count::<Pod>(client, ns).await,
        count::<Service>(client, ns).await,
        count::<Endpoints>(client, ns).await,
        count::<Event>(client, ns).await,
        count::<Lease>(client, ns).await,
    ]
}

async fn fill(client: &Client, ns: &str) {
    client
        .cluster::<Namespace>()
        .create(&Namespace {
            metadata: in_ns("", ns),
            ..Default::default()
        })
        .await
        .expect("create namespace");
    client
        .namespaced::<Deployment>(ns)
        .create(&Deployment {
            metadata: in_ns(ns, "web"),
            spec: Some(DeploymentSpec {
                replicas: Some(2),
                selector: selector(&[("app", "web")]),
                template: template(&[("app", "web")], "1"),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("create deployment");
    client
        .namespaced::<Service>(ns)
        .create(&Service {
            metadata: in_ns(ns, "web"),
            spec: Some(ServiceSpec {
                ports: vec![ServicePort {
                    port: 80,
                    ..Default::default()
                }],
                selector: labels(&[("app", "web")]),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("create service");
    client
        .namespaced::<Endpoints>(ns)
        .create(&Endpoints {
            // Not "web": the Endpoints controller manages that one (it may exist already).
            metadata: in_ns(ns, "manual"),
            ..Default::default()
        })
        .await
        .expect("create endpoints");
    client
        .namespaced::<Event>(ns)
        .create(&Event {
            metadata: in_ns(ns, "web.1"),
            involved_object: Some(ObjectReference {
                kind: "Service".into(),
                namespace: ns.into(),
                name: "web".into(),
                ..Default::default()
            }),
            reason: "Test".into(),
            message: "hello".into(),
            r#type: "Normal".into(),
            count: 1,
            ..Default::default()
        })
        .await
        .expect("create event");
    client
        .namespaced::<Lease>(ns)
        .create(&Lease {
            metadata: in_ns(ns, "lock"),
            ..Default::default()
        })
        .await
        .expect("create lease");
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_content_then_the_namespace() {
    let c = cluster().await;
    let _m = start_manager(&c.client, "ns-test", None);
    let _k = fake_kubelet(&c.client, Duration::from_millis(20));
    fill(&c.client, "shop").await;
    fill(&c.client, "keep").await;
    // A pod on a node: deleted gracefully, it stays until its kubelet finishes the delete.
    let pods = c.client.namespaced::<Pod>("shop");
    let mut solo = Pod {
        metadata: in_ns("shop", "solo"),
        spec: template(&[("app", "solo")], "1").and_then(|t| t.spec),
        ..Default::default()
    };
    if let Some(s) = solo.spec.as_mut() {
        s.node_name = "node-a".into();
    }
    pods.create(&solo).await.expect("create solo pod");
    eventually("deployment pods ready in both namespaces", || async {
        let mut ok = true;
        for ns in ["shop", "keep"] {
            let ready = c
                .client
                .namespaced::<Pod>(ns)
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()?
                .items
                .iter()
                .filter(|p| p.is_ready())
                .count();
            ok &= ready == 2;
        }
        ok.then_some(())
    })
    .await;
    let before_keep = content(&c.client, "keep").await;
    assert!(before_keep.iter().all(|n| *n > 0), "{before_keep:?}");

    let namespaces = c.client.cluster::<Namespace>();
    let marked = namespaces
        .delete("shop", &DeleteParams::default())
        .await
        .expect("delete namespace");
    assert_eq!(
        marked.status.as_ref().map(|s| s.phase.as_str()),
        Some("Terminating")
    );
    let refused = c
        .client
        .namespaced::<Endpoints>("shop")
        .create(&Endpoints {
            metadata: in_ns("shop", "late"),
            ..Default::default()
        })
        .await
        .expect_err("no creates in a terminating namespace");
    assert!(
        refused.to_string().contains("being terminated"),
        "{refused}"
    );

    // Everything goes but the terminating pod, which keeps the namespace.
    eventually("content deleted but the terminating pod", || async {
        let left = content(&c.client, "shop").await;
        let solo = pods.get_opt("solo").await.ok()??;
        let terminating = solo
            .metadata
            .as_ref()
            .is_some_and(|m| !m.deletion_timestamp.is_empty());
        (left == [0, 0, 1, 0, 0, 0, 0] && terminating).then_some(())
    })
    .await;
    let ns = eventually("namespace reports the remaining pod", || async {
        let ns = namespaces.get("shop").await.ok()?;
        let remaining = ns
            .status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.r#type == CONTENT_REMAINING)?
            .clone();
        (remaining.status == "True" && remaining.message.contains("pods has 1")).then_some(ns)
    })
    .await;
    assert!(
        ns.metadata
            .as_ref()
            .is_some_and(|m| !m.deletion_timestamp.is_empty())
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        namespaces.get_opt("shop").await.unwrap().is_some(),
        "the namespace stays while a pod terminates"
    );

    // The kubelet finishes the pod; the namespace goes.
    pods.delete(
        "solo",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("finish the pod");
    eventually("namespace gone", || async {
        namespaces
            .get_opt("shop")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(content(&c.client, "shop").await, [0; 7]);

    // The other namespace is untouched.
    let keep = namespaces.get("keep").await.expect("other namespace kept");
    assert!(
        keep.metadata
            .as_ref()
            .is_some_and(|m| m.deletion_timestamp.is_empty())
    );
    let after_keep = content(&c.client, "keep").await;
    assert_eq!(after_keep[..5], before_keep[..5], "{after_keep:?}");
}
