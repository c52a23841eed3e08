//! Throughput smoke test: 200 pending pods on 100 hollow nodes, all bound. Prints pods/s
//! from the scheduler's start to the last binding seen (no timing assertion: machines
//! differ).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_pods_on_a_hundred_hollow_nodes() {
    // SKIFF_SCHED_NODES / SKIFF_SCHED_PODS override the sizes for a bigger manual run.
    let size = |var: &str, default: usize| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (nodes_n, pods_n) = (
        size("SKIFF_SCHED_NODES", 100),
        size("SKIFF_SCHED_PODS", 200),
    );
    let mut c = api_server().await;
    let nodes = c.hollow(nodes_n).await;
    let names = nodes.names();
    let created = Instant::now();
    let pods = c.pods();
    futures::stream::iter(0..pods_n)
        .map(|i| {
            let pods = pods.clone();
            async move {
                pods.create(&requesting(pod(&format!("load-{i}")), "100m", "128Mi"))
                    .await
                    .expect("create")
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let created = created.elapsed();
    let start = Instant::now();
    c.start_scheduler(test_config());
    let list = eventually_within("all pods bound", Duration::from_secs(300), || async {
        let list = pods.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .all(|p| !node_of(p).is_empty())
            .then_some(list)
    })
    .await;
    let elapsed = start.elapsed();
    assert_eq!(list.items.len(), pods_n);
    assert!(list.items.iter().all(|p| names.contains(&node_of(p))));
    // A binding is visible in the list a moment before the scheduler has counted its answer.
    let scheduler = c.scheduler.as_ref().expect("scheduler");
    let stats = eventually_within("every binding counted", Duration::from_secs(10), || async {
        let stats = scheduler.stats();
        (stats.scheduled as usize == pods_n).then_some(stats)
    })
    .await;
    println!(
        "scheduler throughput: {pods_n} pods on {nodes_n} hollow nodes bound in {:.2}s \
         (created beforehand in {:.2}s) = {:.0} pods/s; algorithm {:.1} µs/pod",
        elapsed.as_secs_f64(),
        created.as_secs_f64(),
        pods_n as f64 / elapsed.as_secs_f64(),
        stats.algorithm_time.as_secs_f64() * 1e6 / stats.attempts.max(1) as f64
    );
}
