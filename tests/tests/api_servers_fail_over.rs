//! High availability: two API servers over a real 3-member etcd cluster (real etcd
//! processes on loopback). A client that lists both servers goes on when one is killed with
//! SIGKILL, and a watch (the client's reflector, what agents and controller informers run)
//! opened before the kill sees every change exactly once, in order, across it and an etcd
//! compaction, without relisting; so does real kubectl's `get -w` on the other server. Losing one etcd member changes
//! nothing; losing two makes writes fail with a server error within a bounded time (not a
//! hang) while the API server still answers; the cluster writes again by itself once a
//! member returns.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::ConfigMap;
use skiff_client::reflector::{Event, reflector};
use skiff_client::{Api, ListParams};
use skiff_tests::{ApiServer, Backend, Client, EtcdCluster, Streaming};

fn config_map(i: usize) -> ConfigMap {
    skiff_api::manifest::decode(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("ha-{i:03}"), "namespace": "default"},
        "data": {"i": i.to_string()},
    }))
    .unwrap()
}

/// Creates `ha-<i>`, retrying what failed for up to 60 s (a failed attempt may have been
/// applied: AlreadyExists then means done).
async fn create(api: &Api<ConfigMap>, i: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut failures = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(40), api.create(&config_map(i))).await {
            Ok(Ok(_)) => return failures,
            Ok(Err(e)) if e.is_already_exists() => return failures,
            other => {
                failures += 1;
                assert!(
                    Instant::now() < deadline,
                    "ha-{i:03} not created within 60 s: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_servers_fail_over_on_an_etcd_cluster() {
    let mut etcd = EtcdCluster::start(3).unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    let endpoints = etcd.endpoints().join(",");
    let mut a = ApiServer::start(Backend::Etcd(endpoints.clone()));
    let b = a.start_beside(Backend::Etcd(endpoints.clone()));
    let mut config = a.client_config();
    config.server = a.endpoint.clone();
    config.servers = vec![a.endpoint.clone(), b.endpoint.clone()];
    let client = Client::connect_with(&config).await.unwrap();
    let api = client.namespaced::<ConfigMap>("default");

    let mut events = Box::pin(reflector(api.clone(), ListParams::default()));
    match tokio::time::timeout(Duration::from_secs(30), events.next()).await {
        Ok(Some(Event::Restarted(_))) => {}
        other => panic!("the reflector's first event: {other:?}"),
    }
    // Real kubectl watching through the second server.
    let kubectl = Streaming::spawn(b.kubectl_cmd(&[
        "get",
        "configmaps",
        "-w",
        "--output-watch-events",
        "-o",
        "jsonpath={.type} {.object.metadata.name} {.object.metadata.resourceVersion}{\"\\n\"}",
    ]));
    // kubectl's watch is open once its initial list is done: wait for an event of it.
    create(&api, 0).await;
    let first_line = kubectl
        .wait_for(&["ADDED ha-000"], Duration::from_secs(30))
        .unwrap_or_else(|seen| panic!("kubectl get -w saw {seen:?}"));
    for i in 1..20 {
        create(&api, i).await;
    }
    a.kill();
    // etcd compacts its history up to now: watches must not need it.
    // (The first request after the kill may fail: it finds the dead server.)
    let mut revision = 0i64;
    for _ in 0..50 {
        if let Ok(cm) = api.get("ha-019").await {
            revision = cm.resource_version().parse().unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(revision > 0, "ha-019 not read through the second server");
    let compacted = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(["compact", &revision.to_string()])
        .output()
        .unwrap();
    assert!(compacted.status.success(), "{compacted:?}");
    let mut retried = 0;
    for i in 20..40 {
        retried += create(&api, i).await;
    }
    // Every change exactly once, in order, no relist.
    let mut seen: BTreeMap<String, i64> = BTreeMap::new();
    let mut last = 0i64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < 40 {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, events.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of 40 changes seen: {seen:?}", seen.len()))
            .expect("the reflector ended");
        let cm = match event {
            Event::Applied(cm) => cm,
            other => panic!("a relist or delete across the failover: {other:?}"),
        };
        let rv: i64 = cm.resource_version().parse().unwrap();
        assert!(rv > last, "resourceVersion {rv} after {last}");
        last = rv;
        assert!(
            seen.insert(cm.name().to_string(), rv).is_none(),
            "{} seen twice",
            cm.name()
        );
    }
    println!(
        "reflector: 40 changes seen once each, in order, across the kill and an etcd compaction \
         at revision {revision} ({retried} requests retried)"
    );
    // kubectl saw each change once, in order, with the store's resourceVersions.
    let mut lines = vec![first_line];
    lines.extend(
        kubectl
            .lines_until("ha-039", Duration::from_secs(30))
            .unwrap_or_else(|seen| panic!("kubectl get -w stopped at {seen:?}")),
    );
    let watched: Vec<(String, i64)> = lines
        .iter()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("ADDED"), Some(name), Some(rv)) if name.starts_with("ha-") => {
                    Some((name.to_string(), rv.parse().unwrap()))
                }
                _ => None,
            }
        })
        .collect();
    let mut want: Vec<(String, i64)> = seen.iter().map(|(n, rv)| (n.clone(), *rv)).collect();
    want.sort_by_key(|(_, rv)| *rv);
    assert_eq!(watched, want, "kubectl get -w: {lines:?}");

    // One etcd member down: nothing changes.
    etcd.members[1].kill();
    for i in 40..45 {
        create(&api, i).await;
    }
    // Two down: no quorum. A write fails with a server error in bounded time.
    etcd.members[2].kill();
    let started = Instant::now();
    let refused = tokio::time::timeout(Duration::from_secs(90), api.create(&config_map(99)))
        .await
        .expect("a write without etcd quorum must fail, not hang")
        .expect_err("a write without etcd quorum must fail");
    println!(
        "without quorum: refused after {:?}: {refused}",
        started.elapsed()
    );
    assert!(
        !refused.is_already_exists() && !refused.is_not_found(),
        "{refused}"
    );
    // The same through real kubectl: Kubernetes' server error, not a client-side one.
    let out = b.kubectl_stdin(
        &["create", "-f", "-", "--request-timeout=90s"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: no-quorum\n  namespace: default\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("Error from server"), "{stderr}");
    println!("kubectl without quorum: {}", stderr.trim());
    // The API server still answers (health, discovery) meanwhile.
    let version = b.kubectl_cmd(&["version", "-o", "json"]).output().unwrap();
    assert!(
        version.status.success(),
        "{}",
        String::from_utf8_lossy(&version.stderr)
    );

    // A member back: writes go through again by themselves.
    etcd.members[1].restart().unwrap();
    create(&api, 46).await;
    let there = api.get("ha-046").await.unwrap();
    assert_eq!(there.name(), "ha-046");
}
