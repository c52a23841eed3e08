//! `kubectl delete namespace` of a namespace holding an object of every namespaced kind the
//! API serves finishes, on a cluster whose controller manager runs with the identity and
//! role `cargo xtask up` and the install command give it (`system:kube-controller-manager`,
//! no administrator's shortcut): its role is derived from the served kinds, so a kind the
//! namespace controller may not delete would leave the namespace Terminating for ever.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use skiff_tests::cluster::Cluster;
use skiff_tests::every_kind::NAMESPACED as OBJECTS;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_removes_every_kind_and_finishes() {
    // Every namespaced kind the API serves has an object here: a kind added later without
    // one fails this check rather than passing unseen.
    let manifest: serde_json::Value = yaml_serde::from_str(OBJECTS).unwrap();
    let here: BTreeSet<String> = manifest["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect();
    let served: BTreeSet<String> = skiff_api::kinds()
        .iter()
        .map(|k| k.info())
        .filter(|i| i.namespaced)
        .map(|i| i.kind.to_string())
        .collect();
    assert_eq!(here, served, "one object of every namespaced kind");

    let cluster = Cluster::start(0).await;
    let (ok, _, err) = cluster.kubectl(&["create", "namespace", "everything"], None);
    assert!(ok, "{err}");
    let (ok, _, err) = cluster.kubectl(&["apply", "-n", "everything", "-f", "-"], Some(OBJECTS));
    assert!(ok, "{err}");
    let started = Instant::now();
    let (ok, _, err) =
        cluster.kubectl(&["delete", "namespace", "everything", "--wait=false"], None);
    assert!(ok, "{err}");
    loop {
        let (exists, out, _) = cluster.kubectl(
            &[
                "get",
                "namespace",
                "everything",
                "-o",
                "jsonpath={.status.conditions}",
            ],
            None,
        );
        if !exists {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the namespace is still there after 60 s: {out}\n{}",
            cluster.managers[0].log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("namespace deleted in {:?}", started.elapsed());
}
