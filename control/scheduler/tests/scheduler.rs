//! The scheduler against a real API server: binding, the filters, spreading, retries when
//! the cluster changes, events.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use skiff_api::Resource;
use skiff_api::api::{
    Affinity, LabelSelector, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PodAffinity, PodAffinityTerm, Taint, Toleration,
};
use skiff_client::DeleteParams;

#[tokio::test]
async fn binds_pods_to_fitting_nodes_and_records_events() {
    let c = cluster().await;
    let nodes = c.hollow(3).await;
    let kubelet = nodes.run_pods(&c.client);
    for i in 0..6 {
        c.create(requesting(pod(&format!("p{i}")), "1", "1Gi"))
            .await;
    }
    let mut per_node = BTreeMap::new();
    for i in 0..6 {
        let node = c.bound_node(&format!("p{i}")).await;
        assert!(nodes.names().contains(&node), "{node}");
        *per_node.entry(node).or_insert(0) += 1;
    }
    // Least allocated + balanced: 2 per node.
    assert!(per_node.values().all(|&n| n == 2), "{per_node:?}");
    let p0 = c.get("p0").await;
    let cond = p0
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == "PodScheduled"))
        .expect("PodScheduled");
    assert_eq!(cond.status, "True");
    let msg = c.event("p0", "Scheduled").await;
    assert_eq!(
        msg,
        format!("Successfully assigned default/p0 to {}", node_of(&p0))
    );
    let ev = c
        .events_of("p0")
        .await
        .into_iter()
        .find(|e| e.reason == "Scheduled")
        .expect("event");
    assert_eq!(ev.r#type, "Normal");
    assert_eq!(
        ev.source.as_ref().map(|s| s.component.as_str()),
        Some("default-scheduler")
    );
    // The hollow kubelet "runs" them.
    let pods = c.pods();
    eventually_within("pods Running", Duration::from_secs(10), || async {
        let list = pods.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .all(|p| p.status.as_ref().is_some_and(|s| s.phase == "Running"))
            .then_some(())
    })
    .await;
    assert_eq!(kubelet.started(), 6);
    let stats = c.scheduler.as_ref().expect("scheduler").stats();
    assert_eq!(stats.scheduled, 6);
    assert_eq!(stats.unschedulable, 0);
}

#[tokio::test]
async fn too_big_pod_waits_then_lands_on_a_new_node() {
    let c = cluster().await;
    c.node("small-1", &shape("4", "8Gi"), |_| {}).await;
    c.node("small-2", &shape("4", "8Gi"), |_| {}).await;
    c.create(requesting(pod("big"), "8", "1Gi")).await;
    let msg = c.unschedulable_message("big").await;
    assert_eq!(msg, "0/2 nodes are available: 2 Insufficient cpu.");
    let ev = c.event("big", "FailedScheduling").await;
    assert_eq!(ev, msg);
    assert_eq!(
        c.get("big").await.status.map(|s| s.phase).as_deref(),
        Some("Pending")
    );
    // A node that fits appears: the pod is retried because of it (not the 60 s flush).
    let start = std::time::Instant::now();
    c.node("large", &shape("16", "64Gi"), |_| {}).await;
    assert_eq!(c.bound_node("big").await, "large");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    c.event("big", "Scheduled").await;
}

#[tokio::test]
async fn node_selector_and_required_node_affinity() {
    let c = cluster().await;
    let ssd = |n: &mut Node| {
        n.metadata_mut().labels.insert("disk".into(), "ssd".into());
    };
    c.node("ssd", &shape("4", "8Gi"), ssd).await;
    c.node("hdd", &shape("4", "8Gi"), |n| {
        n.metadata_mut().labels.insert("disk".into(), "hdd".into());
        n.metadata_mut().labels.insert("cores".into(), "64".into());
    })
    .await;
    for i in 0..3 {
        let mut p = pod(&format!("sel{i}"));
        spec_mut(&mut p).node_selector = [("disk".to_string(), "ssd".to_string())].into();
        c.create(p).await;
    }
    let term = |key: &str, op: &str, values: &[&str]| NodeSelectorTerm {
        match_expressions: vec![NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }],
        ..Default::default()
    };
    let with_affinity = |name: &str, terms: Vec<NodeSelectorTerm>| {
        let mut p = pod(name);
        spec_mut(&mut p).affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        p
    };
    c.create(with_affinity("gt", vec![term("cores", "Gt", &["32"])]))
        .await;
    c.create(with_affinity(
        "notin",
        vec![term("disk", "NotIn", &["hdd"])],
    ))
    .await;
    c.create(with_affinity("nowhere", vec![term("gpu", "Exists", &[])]))
        .await;
    let mut p = pod("nosuch");
    spec_mut(&mut p).node_selector = [("disk".to_string(), "nvme".to_string())].into();
    c.create(p).await;
    for i in 0..3 {
        assert_eq!(c.bound_node(&format!("sel{i}")).await, "ssd");
    }
    assert_eq!(c.bound_node("gt").await, "hdd");
    assert_eq!(c.bound_node("notin").await, "ssd");
    let expected = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.";
    assert_eq!(c.unschedulable_message("nowhere").await, expected);
    assert_eq!(c.unschedulable_message("nosuch").await, expected);
}

#[tokio::test]
async fn taints_cordons_and_not_ready_nodes_are_skipped() {
    let c = cluster().await;
    c.node("gpu", &shape("4", "8Gi"), |n| {
        n.spec
            .get_or_insert_with(Default::default)
            .taints
            .push(Taint {
                key: "dedicated".into(),
                value: "gpu".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            });
    })
    .await;
    c.node("cordoned", &shape("4", "8Gi"), |n| {
        n.spec.get_or_insert_with(Default::default).unschedulable = true;
    })
    .await;
    c.node("notready", &shape("4", "8Gi"), |n| {
        if let Some(s) = n.status.as_mut() {
            s.conditions[0].status = "False".into();
        }
    })
    .await;
    c.create(pod("plain")).await;
    let mut tolerant = pod("tolerant");
    spec_mut(&mut tolerant).tolerations.push(Toleration {
        key: "dedicated".into(),
        operator: "Equal".into(),
        value: "gpu".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    });
    c.create(tolerant).await;
    assert_eq!(c.bound_node("tolerant").await, "gpu");
    assert_eq!(
        c.unschedulable_message("plain").await,
        "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, \
         1 node(s) were not ready, 1 node(s) were unschedulable."
    );
    // Uncordoning is a node update: the pod is retried and lands there.
    let nodes = c.client.cluster::<Node>();
    let mut n = nodes.get("cordoned").await.expect("get");
    n.spec.get_or_insert_with(Default::default).unschedulable = false;
    nodes.update(&n).await.expect("uncordon");
    assert_eq!(c.bound_node("plain").await, "cordoned");
}

fn anti_affine(name: &str) -> skiff_api::api::Pod {
    let mut p = labeled_pod(pod(name), &[("app", "web")]);
    spec_mut(&mut p).affinity = Some(Affinity {
        pod_anti_affinity: Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: [("app".to_string(), "web".to_string())].into(),
                    ..Default::default()
                }),
                topology_key: "kubernetes.io/hostname".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    });
    p
}

#[tokio::test]
async fn pod_anti_affinity_by_hostname_spreads_pods() {
    let c = cluster().await;
    c.hollow(3).await;
    for i in 0..4 {
        c.create(anti_affine(&format!("web-{i}"))).await;
    }
    // Three land on three different nodes; the fourth has nowhere to go.
    let pods = c.pods();
    let placed = eventually_within("three web pods bound", Duration::from_secs(10), || async {
        let list = pods.list(&Default::default()).await.ok()?;
        let nodes: Vec<(String, String)> = list
            .items
            .iter()
            .filter(|p| !node_of(p).is_empty())
            .map(|p| (p.name().to_string(), node_of(p)))
            .collect();
        (nodes.len() == 3).then_some(nodes)
    })
    .await;
    let distinct: std::collections::BTreeSet<_> = placed.iter().map(|(_, n)| n).collect();
    assert_eq!(distinct.len(), 3, "{placed:?}");
    let waiting = ["web-0", "web-1", "web-2", "web-3"]
        .into_iter()
        .find(|n| placed.iter().all(|(p, _)| p != n))
        .expect("one waits");
    assert_eq!(
        c.unschedulable_message(waiting).await,
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules."
    );
    // Deleting one frees its node.
    let (gone, freed) = &placed[0];
    c.pods()
        .delete(
            gone,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .expect("delete");
    assert_eq!(&c.bound_node(waiting).await, freed);
}

#[tokio::test]
async fn pods_of_one_owner_spread_over_nodes() {
    let c = cluster().await;
    let nodes = c.hollow(3).await;
    // Another owner's pods fill one node partly: spreading is per owner.
    for i in 0..10 {
        c.create(owned(pod(&format!("rs-{i}")), "rs-uid-1")).await;
    }
    let mut per_node: BTreeMap<String, i32> = nodes.names().into_iter().map(|n| (n, 0)).collect();
    for i in 0..10 {
        *per_node
            .entry(c.bound_node(&format!("rs-{i}")).await)
            .or_insert(0) += 1;
    }
    let max = per_node.values().max().copied().unwrap_or(0);
    let min = per_node.values().min().copied().unwrap_or(0);
    assert!(max - min <= 1, "{per_node:?}");
}

#[tokio::test]
async fn other_schedulers_pods_and_bound_pods_are_left_alone() {
    let c = cluster().await;
    c.hollow(2).await;
    let mut other = pod("other");
    spec_mut(&mut other).scheduler_name = "my-scheduler".into();
    c.create(other).await;
    let mut preset = pod("preset");
    spec_mut(&mut preset).node_name = "hollow-node-1".into();
    let preset = c.create(preset).await;
    c.create(pod("mine")).await;
    c.bound_node("mine").await;
    // Give the scheduler time to (wrongly) act on the others.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let other = c.get("other").await;
    assert!(node_of(&other).is_empty());
    assert!(
        other
            .status
            .as_ref()
            .is_none_or(|s| s.conditions.iter().all(|c| c.r#type != "PodScheduled")),
        "{:?}",
        other.status
    );
    assert!(c.events_of("other").await.is_empty());
    let now = c.get("preset").await;
    assert_eq!(node_of(&now), "hollow-node-1");
    assert_eq!(
        now.resource_version(),
        preset.resource_version(),
        "untouched"
    );
    assert!(c.events_of("preset").await.is_empty());
}

#[tokio::test]
async fn a_second_scheduler_takes_its_own_pods() {
    let mut config = test_config();
    config.scheduler_name = "my-scheduler".into();
    let c = cluster_with(config).await;
    c.hollow(1).await;
    let mut mine = pod("mine");
    spec_mut(&mut mine).scheduler_name = "my-scheduler".into();
    c.create(mine).await;
    c.create(pod("default")).await;
    assert_eq!(c.bound_node("mine").await, "hollow-node-0");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(node_of(&c.get("default").await).is_empty());
    let ev = c
        .events_of("mine")
        .await
        .into_iter()
        .find(|e| e.reason == "Scheduled")
        .expect("event");
    assert_eq!(
        ev.source.map(|s| s.component).as_deref(),
        Some("my-scheduler")
    );
}

#[tokio::test]
async fn resources_already_requested_count() {
    let c = cluster().await;
    c.node("only", &shape("2", "4Gi"), |_| {}).await;
    // A pod bound by someone else uses most of the node.
    let mut taken = requesting(pod("taken"), "1500m", "1Gi");
    spec_mut(&mut taken).node_name = "only".into();
    c.create(taken).await;
    c.create(requesting(pod("fits"), "250m", "1Gi")).await;
    assert_eq!(c.bound_node("fits").await, "only");
    c.create(requesting(pod("nope"), "100m", "3Gi")).await;
    assert_eq!(
        c.unschedulable_message("nope").await,
        "0/1 nodes are available: 1 Insufficient memory."
    );
    // Freeing memory (the bound pod finishes and is deleted) lets it in.
    c.pods()
        .delete(
            "taken",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .expect("delete");
    assert_eq!(c.bound_node("nope").await, "only");
}
