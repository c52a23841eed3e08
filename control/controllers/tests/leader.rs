//! Leader election between two controller managers in one process: only the leader acts; a
//! killed leader is replaced within the lease duration; a stopped one hands over at once.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use skiff_api::Resource;
use skiff_api::api::{Event, Lease, Pod, ReplicaSet, ReplicaSetSpec};
use skiff_client::controller::LeaderElectionConfig;
use skiff_client::{Client, DeleteParams, ListParams};

const LEASE: &str = "skiff-controller-manager";

fn lease_config(identity: &str) -> LeaderElectionConfig {
    LeaderElectionConfig::new(LEASE, identity).with_lease_duration(Duration::from_secs(2))
}

async fn holder(client: &Client) -> Option<String> {
    client
        .namespaced::<Lease>("kube-system")
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

/// The instances that reported creating pods of replica set `rs`.
async fn creators(client: &Client, rs: &str) -> Vec<String> {
    let mut who: Vec<String> = client
        .namespaced::<Event>("default")
        .list(
            &ListParams::default()
                .fields(&format!("involvedObject.name={rs},reason=SuccessfulCreate")),
        )
        .await
        .expect("events")
        .items
        .into_iter()
        .map(|e| e.reporting_instance)
        .collect();
    who.sort();
    who.dedup();
    who
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_leader_acts_and_a_standby_takes_over() {
    let c = cluster().await;
    let a = start_manager(&c.client, "manager-a", Some(lease_config("manager-a")));
    eventually("manager-a leads", || async {
        (holder(&c.client).await.as_deref() == Some("manager-a")).then_some(())
    })
    .await;
    let b = start_manager(&c.client, "manager-b", Some(lease_config("manager-b")));

    let rs = ReplicaSet {
        metadata: meta("ha"),
        spec: Some(ReplicaSetSpec {
            replicas: Some(3),
            selector: selector(&[("app", "ha")]),
            template: template(&[("app", "ha")], "1"),
            ..Default::default()
        }),
        ..Default::default()
    };
    c.client
        .namespaced::<ReplicaSet>("default")
        .create(&rs)
        .await
        .expect("create");
    eventually("3 pods", || async {
        (active_pods(&c.client, "app=ha").await.len() == 3).then_some(())
    })
    .await;
    // Two lease periods: the standby must stay a standby while the leader renews.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(holder(&c.client).await.as_deref(), Some("manager-a"));
    assert_eq!(
        active_pods(&c.client, "app=ha").await.len(),
        3,
        "no duplicates"
    );
    assert_eq!(creators(&c.client, "ha").await, ["manager-a"]);

    // Kill the leader: no release, the lease must expire.
    let killed = Instant::now();
    a.kill().await;
    eventually("manager-b takes over", || async {
        (holder(&c.client).await.as_deref() == Some("manager-b")).then_some(())
    })
    .await;
    let took = killed.elapsed();
    // Lease duration plus at most one retry period (and some slack for slow machines).
    assert!(took < Duration::from_secs(5), "takeover took {took:?}");

    // The new leader replaces a deleted pod.
    let pods = active_pods(&c.client, "app=ha").await;
    c.client
        .namespaced::<Pod>("default")
        .delete(pods[0].name(), &DeleteParams::default())
        .await
        .expect("delete");
    eventually("manager-b replaced the pod", || async {
        let n = active_pods(&c.client, "app=ha").await.len();
        (n == 3
            && creators(&c.client, "ha")
                .await
                .contains(&"manager-b".to_string()))
        .then_some(())
    })
    .await;

    // A graceful stop releases the lease at once.
    b.shutdown().await;
    let lease = c
        .client
        .namespaced::<Lease>("kube-system")
        .get(LEASE)
        .await
        .expect("lease");
    let spec = lease.spec.expect("spec");
    assert_eq!(spec.holder_identity, None, "released");
    assert!(spec.lease_transitions.unwrap_or(0) >= 1);
}
