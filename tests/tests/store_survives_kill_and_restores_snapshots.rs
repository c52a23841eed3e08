//! Store safety: the embedded store's API server killed with SIGKILL in the middle of
//! 10,000 writes keeps every write it acknowledged and opens again; a snapshot taken while
//! the writes ran (`GET /skiff/v1/snapshot`, fetched with real kubectl's `get --raw`)
//! restores with `skiff-apiserver restore` to a consistent cluster: exactly the writes up to
//! the snapshot's revision, none after. The kill point is drawn from a seed printed at the
//! start (`SKIFF_TEST_SEED=<n>` replays it).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skiff_api::Resource;
use skiff_api::api::ConfigMap;
use skiff_client::ListParams;
use skiff_tests::{ApiServer, Backend, ok};

const WRITES: usize = 10_000;
const WRITERS: usize = 16;

fn config_map(i: usize) -> ConfigMap {
    skiff_api::manifest::decode(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("cm-{i:05}"), "namespace": "default"},
        "data": {"i": i.to_string()},
    }))
    .unwrap()
}

/// Every ConfigMap of `default`: name → resourceVersion.
async fn config_maps(server: &ApiServer) -> BTreeMap<String, i64> {
    let client = server.client().await;
    let list = client
        .namespaced::<ConfigMap>("default")
        .list(&ListParams::default())
        .await
        .unwrap();
    list.items
        .iter()
        .filter(|c| c.name().starts_with("cm-"))
        .map(|c| (c.name().to_string(), c.resource_version().parse().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_store_keeps_acknowledged_writes_across_kill_and_restores_snapshots() {
    let seed = skiff_tests::seed("SKIFF_TEST_SEED");
    // Kill somewhere in the middle 60 % of the writes; snapshot at half that point.
    let kill_at = WRITES / 5 + (seed % (WRITES as u64 * 3 / 5)) as usize;
    let snapshot_at = kill_at / 2;
    println!(
        "seed {seed} (SKIFF_TEST_SEED={seed} replays): kill after {kill_at} acknowledged writes, snapshot after {snapshot_at}"
    );
    let mut server = ApiServer::start(Backend::Embedded);
    let client = server.client().await;
    let acked: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (client, acked, next) = (client.clone(), acked.clone(), next.clone());
            tokio::spawn(async move {
                let api = client.namespaced::<ConfigMap>("default");
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= WRITES {
                        return;
                    }
                    match tokio::time::timeout(Duration::from_secs(10), api.create(&config_map(i)))
                        .await
                    {
                        Ok(Ok(cm)) => acked.lock().unwrap().push((
                            cm.name().to_string(),
                            cm.resource_version().parse().unwrap(),
                        )),
                        // The server is gone: this write was not acknowledged.
                        _ => return,
                    }
                }
            })
        })
        .collect();
    let count = || acked.lock().unwrap().len();
    let wait_for = async |n: usize, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while count() < n {
            assert!(
                Instant::now() < deadline,
                "{what}: only {} writes acknowledged",
                count()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    wait_for(snapshot_at, "before the snapshot").await;
    let snapshot_dir = tempfile::tempdir().unwrap();
    let snapshot = snapshot_dir.path().join("snapshot.db");
    let mut kubectl = server.kubectl_cmd(&["get", "--raw", "/skiff/v1/snapshot"]);
    let out = tokio::task::spawn_blocking(move || kubectl.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl get --raw /skiff/v1/snapshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&snapshot, &out.stdout).unwrap();
    // Only cluster-admin holds the snapshot's URL: it carries every Secret.
    let users = tempfile::tempdir().unwrap();
    let someone = server.user_kubeconfig(users.path(), "someone", &[]);
    let mut kubectl = server.kubectl_as(&someone, &["get", "--raw", "/skiff/v1/snapshot"]);
    let denied = tokio::task::spawn_blocking(move || kubectl.output().unwrap())
        .await
        .unwrap();
    let denied = skiff_tests::fails(&denied);
    assert!(denied.contains("forbidden"), "{denied}");
    // The same through `skiff snapshot save`, which names format and revision; a file that
    // exists is not overwritten.
    let saved = snapshot_dir.path().join("saved.db");
    let path = saved.display().to_string();
    let save = || {
        let mut skiff = server.skiff_cmd(&["snapshot", "save", &path]);
        tokio::task::spawn_blocking(move || skiff.output().unwrap())
    };
    let said = ok(&save().await.unwrap());
    assert!(
        said.starts_with("saved a skiff-embedded snapshot at revision ") && said.contains(&path),
        "{said}"
    );
    assert!(std::fs::metadata(&saved).unwrap().len() > 0);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&saved).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600, "the saved snapshot holds every Secret");
    }
    let refused = skiff_tests::fails(&save().await.unwrap());
    assert!(refused.contains("exists"), "{refused}");
    let at_snapshot_end = count();
    wait_for(kill_at.max(at_snapshot_end + 1), "before the kill").await;
    server.kill();
    let acknowledged_before_kill = count();
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    println!(
        "{} writes acknowledged in {:?} ({} after the kill signal's moment), snapshot of {} bytes",
        acked.len(),
        started.elapsed(),
        acked.len() - acknowledged_before_kill,
        out.stdout.len()
    );
    assert!(acked.len() < WRITES, "the kill came after every write");

    // Started again on the same file: every acknowledged write is there, unchanged.
    server.restart();
    let present = config_maps(&server).await;
    let missing: Vec<&(String, i64)> = acked
        .iter()
        .filter(|(name, rv)| present.get(name) != Some(rv))
        .collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged writes lost or changed, e.g. {:?}; log:\n{}",
        missing.len(),
        &missing[..missing.len().min(5)],
        server.log()
    );
    // At most the writes in flight at the kill are there beyond the acknowledged ones.
    assert!(
        present.len() <= acked.len() + WRITERS,
        "{} objects",
        present.len()
    );

    // The snapshot restores to exactly the writes up to its revision.
    let restored_dir = tempfile::tempdir().unwrap();
    let data = restored_dir.path().join("data");
    let out = std::process::Command::new(skiff_tests::binary("skiff-apiserver"))
        .arg("restore")
        .arg(&snapshot)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    let said = ok(&out);
    let revision: i64 = said
        .split("at revision ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no revision in {said:?}"));
    // A second restore over it is refused, naming what to do.
    let again = std::process::Command::new(skiff_tests::binary("skiff-apiserver"))
        .arg("restore")
        .arg(&snapshot)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    let refused = skiff_tests::fails(&again);
    assert!(refused.contains("--force"), "{refused}");
    let restored = ApiServer::start(Backend::EmbeddedIn(data));
    let there = config_maps(&restored).await;
    let (before, after): (Vec<_>, Vec<_>) = acked.iter().partition(|(_, rv)| *rv <= revision);
    assert!(
        before.len() >= snapshot_at,
        "{} writes before revision {revision}",
        before.len()
    );
    assert!(!after.is_empty(), "the snapshot came after every write");
    for (name, rv) in &before {
        assert_eq!(
            there.get(name),
            Some(rv),
            "{name} (written before the snapshot)"
        );
    }
    for (name, _) in &after {
        assert!(
            !there.contains_key(name),
            "{name} was written after the snapshot"
        );
    }
    assert!(there.values().all(|rv| *rv <= revision));
    println!(
        "snapshot at revision {revision}: {} objects restored, {} later writes absent",
        there.len(),
        after.len()
    );
}
