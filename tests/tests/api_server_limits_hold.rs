//! The API server's denial-of-service limits, with the real kubectl 1.32 against the
//! `skiff-apiserver` binary: a user past its open-watch limit gets kube-apiserver's 429
//! ("Too many requests") with `Retry-After: 1`, which kubectl retries ten times and then
//! reports, while its other requests, and other users, are served; a closed watch frees its
//! place. (The inflight limits and the header timeout are tested in `skiff-apiserver`'s
//! `limits` and `slow_clients` tests.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::{Duration, Instant};

use skiff_tests::{ApiServer, Backend, Streaming, ok};

#[test]
fn a_user_past_its_watch_limit_is_refused_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServer::start_with(Backend::Embedded, &["--max-watches-per-user", "2"]);
    ok(&server.kubectl(&[
        "create",
        "clusterrolebinding",
        "watcher-view",
        "--clusterrole=view",
        "--user=watcher",
    ]));
    let watcher = server.user_kubeconfig(dir.path(), "watcher", &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .kubectl_as(&watcher, &["get", "pods"])
        .output()
        .unwrap()
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "the binding never took effect");
        std::thread::sleep(Duration::from_millis(100));
    }
    let watch = || Streaming::spawn(server.kubectl_as(&watcher, &["get", "namespaces", "-w"]));
    let first = watch();
    let second = watch();
    // Both are open once their lists arrive (kube-system is always there).
    for w in [&first, &second] {
        w.wait_for(&["kube-system"], Duration::from_secs(10))
            .expect("the watch's first events");
    }
    let mut third = watch();
    let (status, err) = third
        .wait_exit(Duration::from_secs(30))
        .expect("the third watch is refused (kubectl retries a 429 with Retry-After ten times)");
    assert!(!status.success());
    assert!(
        err.contains("Too many requests, please try again later"),
        "{err}"
    );
    // Plain requests of the same user, and other users' watches, go on.
    ok(&server
        .kubectl_as(&watcher, &["get", "pods", "-A"])
        .output()
        .unwrap());
    let admin = Streaming::spawn(server.kubectl_cmd(&["get", "namespaces", "-w"]));
    admin
        .wait_for(&["kube-system"], Duration::from_secs(10))
        .expect("another user's watch");
    // A closed watch frees its place.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = watch();
        if again
            .wait_for(&["kube-system"], Duration::from_secs(5))
            .is_ok()
        {
            break;
        }
        let _ = again.wait_exit(Duration::from_secs(1));
        assert!(
            Instant::now() < deadline,
            "the closed watch's place was never freed"
        );
    }
    drop(second);
}
