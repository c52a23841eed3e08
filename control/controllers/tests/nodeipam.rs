//! Node IPAM (pod CIDRs of Nodes) against a real API server.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::collections::BTreeSet;

use common::*;
use futures::future::join_all;
use skiff_api::api::{Node, NodeSpec, ObjectMeta};
use skiff_client::{Client, DeleteParams};
use skiff_controllers::manager::{ControllerName, ManagerConfig};
use skiff_controllers::ranges::Ipv4Cidr;

fn node(name: &str, pod_cidr: &str) -> Node {
    Node {
        metadata: Some(ObjectMeta {
            name: name.into(),
            ..Default::default()
        }),
        spec: Some(NodeSpec {
            pod_cidr: pod_cidr.into(),
            pod_cidrs: (!pod_cidr.is_empty())
                .then(|| pod_cidr.to_string())
                .into_iter()
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Waits until Node `name` has a pod CIDR; returns it.
async fn pod_cidr(client: &Client, name: &str) -> String {
    eventually(&format!("a pod CIDR on node {name}"), || async {
        let n = client.cluster::<Node>().get(name).await.ok()?;
        let spec = n.spec.unwrap_or_default();
        (!spec.pod_cidr.is_empty()).then(|| {
            assert_eq!(spec.pod_cidrs, std::slice::from_ref(&spec.pod_cidr));
            spec.pod_cidr
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_get_distinct_blocks_around_preset_ones() {
    let c = cluster().await;
    let api = c.client.cluster::<Node>();
    // Registered with a pod CIDR (an agent started with --pod-cidr): the first block, which
    // the allocator would otherwise hand out first.
    api.create(&node("preset", "10.244.0.0/24"))
        .await
        .expect("create");
    let _manager = start_manager(&c.client, "ipam-test", None);
    let names: Vec<String> = (0..5).map(|i| format!("node-{i}")).collect();
    let nodes: Vec<Node> = names.iter().map(|n| node(n, "")).collect();
    let created = join_all(nodes.iter().map(|n| api.create(n))).await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let cluster: Ipv4Cidr = "10.244.0.0/16".parse().expect("cidr");
    let mut seen = BTreeSet::new();
    for n in &names {
        let cidr: Ipv4Cidr = pod_cidr(&c.client, n).await.parse().expect("a CIDR");
        assert_eq!(cidr.prefix_len(), 24);
        assert!(cluster.contains(cidr.network()), "{cidr} outside {cluster}");
        assert_ne!(
            cidr.to_string(),
            "10.244.0.0/24",
            "the preset block was handed out"
        );
        assert!(seen.insert(cidr), "{cidr} handed out twice");
    }
    assert_eq!(pod_cidr(&c.client, "preset").await, "10.244.0.0/24");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_cluster_cidr_waits_for_a_deleted_node() {
    let c = cluster().await;
    let mut config = ManagerConfig::new("ipam-full");
    config.leader_election = None;
    config.controllers = [ControllerName::NodeIpam].into();
    // Two /24 blocks.
    config.cluster_cidr = "10.250.0.0/23".parse().expect("cidr");
    config.node_cidr_mask_size = 24;
    let _manager = start_manager_with(&c.client, config);
    let api = c.client.cluster::<Node>();
    for n in ["a", "b"] {
        api.create(&node(n, "")).await.expect("create");
    }
    let got: BTreeSet<String> = [
        pod_cidr(&c.client, "a").await,
        pod_cidr(&c.client, "b").await,
    ]
    .into();
    assert_eq!(
        got,
        ["10.250.0.0/24".to_string(), "10.250.1.0/24".to_string()].into()
    );
    api.create(&node("c", "")).await.expect("create");
    // Events about cluster-scoped objects go to the default namespace.
    let e = wait_for_event(&c.client, "default", "c", "CIDRNotAvailable").await;
    assert_eq!(e.r#type, "Warning");
    assert!(e.message.contains("10.250.0.0/23"), "{}", e.message);
    let spec = api.get("c").await.expect("get").spec.unwrap_or_default();
    assert!(spec.pod_cidr.is_empty());

    let freed = pod_cidr(&c.client, "b").await;
    api.delete("b", &DeleteParams::default())
        .await
        .expect("delete");
    assert_eq!(pod_cidr(&c.client, "c").await, freed);
}
