//! The ReplicaSet controller against a real API server.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::time::Duration;

use common::*;
use skiff_api::Resource;
use skiff_api::api::{Event, Pod, ReplicaSet, ReplicaSetSpec};
use skiff_client::{DeleteParams, ListParams};

fn replica_set(name: &str, app: &str, replicas: i32) -> ReplicaSet {
    ReplicaSet {
        metadata: meta(name),
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            selector: selector(&[("app", app)]),
            template: template(&[("app", app)], "1"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn scale(client: &skiff_client::Client, name: &str, replicas: i32) {
    let api = client.namespaced::<ReplicaSet>("default");
    for _ in 0..10 {
        let mut rs = api.get(name).await.expect("get");
        if let Some(s) = rs.spec.as_mut() {
            s.replicas = Some(replicas);
        }
        match api.update(&rs).await {
            Ok(_) => return,
            Err(e) if e.is_conflict() => continue,
            Err(e) => panic!("scale: {e}"),
        }
    }
    panic!("scale: too many conflicts");
}

/// Waits until exactly `n` active pods with `app=<app>` exist, all owned by replica set `rs`.
async fn wait_pods(
    client: &skiff_client::Client,
    app: &str,
    rs: &ReplicaSet,
    n: usize,
) -> Vec<Pod> {
    let uid = rs.metadata().map(|m| m.uid.clone()).unwrap_or_default();
    eventually(&format!("{n} pods of {app}"), || async {
        let pods = active_pods(client, &format!("app={app}")).await;
        let owned = pods.iter().all(|p| {
            p.metadata().is_some_and(|m| {
                m.owner_references
                    .iter()
                    .any(|o| o.uid == uid && o.controller == Some(true))
            })
        });
        (pods.len() == n && owned).then_some(pods)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_scales_and_replaces_pods() {
    let c = cluster().await;
    let _kubelet = fake_kubelet(&c.client, Duration::from_millis(20));
    let _manager = start_manager(&c.client, "rs-test", None);
    let api = c.client.namespaced::<ReplicaSet>("default");
    let rs = api
        .create(&replica_set("web", "web", 3))
        .await
        .expect("create");

    let pods = wait_pods(&c.client, "web", &rs, 3).await;
    for p in &pods {
        let m = p.metadata().expect("metadata");
        assert!(m.name.starts_with("web-"), "{}", m.name);
        assert_eq!(m.generate_name, "web-");
        let owner = &m.owner_references[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.block_owner_deletion
            ),
            ("ReplicaSet", "web", Some(true))
        );
        assert_eq!(m.labels.get("app").map(String::as_str), Some("web"));
    }
    // Status follows the (fake) kubelet.
    eventually("status 3/3 ready", || async {
        let s = api.get("web").await.ok()?.status?;
        (s.replicas == 3
            && s.ready_replicas == 3
            && s.available_replicas == 3
            && s.fully_labeled_replicas == 3
            && s.observed_generation == 1)
            .then_some(())
    })
    .await;

    scale(&c.client, "web", 6).await;
    wait_pods(&c.client, "web", &rs, 6).await;
    scale(&c.client, "web", 2).await;
    let pods = wait_pods(&c.client, "web", &rs, 2).await;

    // A deleted pod is replaced by a new one.
    let victim = pods[0].name().to_string();
    c.client
        .namespaced::<Pod>("default")
        .delete(&victim, &DeleteParams::default())
        .await
        .expect("delete");
    let pods = eventually("a replacement pod", || async {
        let pods = wait_pods(&c.client, "web", &rs, 2).await;
        pods.iter().all(|p| p.name() != victim).then_some(pods)
    })
    .await;
    assert_eq!(pods.len(), 2);
    eventually("status after the replacement", || async {
        let s = api.get("web").await.ok()?.status?;
        (s.replicas == 2 && s.ready_replicas == 2 && s.observed_generation == 3).then_some(())
    })
    .await;

    // Events name what happened.
    let events = c
        .client
        .namespaced::<Event>("default")
        .list(&ListParams::default().fields("involvedObject.name=web"))
        .await
        .expect("events")
        .items;
    let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
    assert!(reasons.contains(&"SuccessfulCreate"), "{reasons:?}");
    assert!(reasons.contains(&"SuccessfulDelete"), "{reasons:?}");
    let create = events
        .iter()
        .find(|e| e.reason == "SuccessfulCreate")
        .expect("create event");
    assert_eq!(create.r#type, "Normal");
    assert_eq!(
        create.source.as_ref().map(|s| s.component.as_str()),
        Some("replicaset-controller")
    );
    assert_eq!(
        create.involved_object.as_ref().map(|o| o.kind.as_str()),
        Some("ReplicaSet")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adopts_orphans_releases_strays_and_waits_for_min_ready() {
    let c = cluster().await;
    let pods_api = c.client.namespaced::<Pod>("default");
    // An orphan that the replica set's selector matches.
    let orphan = Pod {
        metadata: Some(skiff_api::api::ObjectMeta {
            name: "orphan".into(),
            labels: labels(&[("app", "db")]),
            ..Default::default()
        }),
        spec: template(&[], "1").and_then(|t| t.spec),
        ..Default::default()
    };
    pods_api.create(&orphan).await.expect("orphan");
    let _kubelet = fake_kubelet(&c.client, Duration::from_millis(20));
    let _manager = start_manager(&c.client, "rs-test", None);
    let api = c.client.namespaced::<ReplicaSet>("default");
    let mut rs = replica_set("db", "db", 2);
    if let Some(s) = rs.spec.as_mut() {
        s.min_ready_seconds = 1;
    }
    let rs = api.create(&rs).await.expect("create");

    let pods = wait_pods(&c.client, "db", &rs, 2).await;
    assert!(
        pods.iter().any(|p| p.name() == "orphan"),
        "the orphan was adopted: {:?}",
        pods.iter().map(|p| p.name()).collect::<Vec<_>>()
    );
    // Ready at once, available only after minReadySeconds.
    eventually("2 available after minReadySeconds", || async {
        let s = api.get("db").await.ok()?.status?;
        (s.ready_replicas == 2 && s.available_replicas == 2).then_some(())
    })
    .await;

    // A pod relabelled out of the selector is released and replaced.
    let mut stray = pods_api.get("orphan").await.expect("get");
    stray
        .metadata_mut()
        .labels
        .insert("app".into(), "elsewhere".into());
    pods_api.update(&stray).await.expect("relabel");
    eventually("the stray released", || async {
        let p = pods_api.get("orphan").await.ok()?;
        p.metadata()?.owner_references.is_empty().then_some(())
    })
    .await;
    let pods = wait_pods(&c.client, "db", &rs, 2).await;
    assert!(pods.iter().all(|p| p.name() != "orphan"));
}
