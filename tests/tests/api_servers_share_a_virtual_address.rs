//! The API servers' registration address survives the loss of any of them, on a cluster
//! started by `cargo xtask up --ha --nodes 1` (`skiff_tests::up`): three `control` machines,
//! each an etcd member, an API server, a scheduler, a controller manager and a `skiff-vip`,
//! and kubectl on the laptop (`up`'s client namespace outside the cluster) using only the
//! virtual address. One kubectl request every 100 ms keeps being answered (at least 99%,
//! over 60 s) while the API server holding the address is killed, and again while the
//! holder's whole machine loses its link to the network; each time another machine takes
//! the address (its gratuitous ARPs move the laptop) and exactly one machine holds it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use skiff_tests::eventually_within;
use skiff_tests::up::UpCluster;

const T: Duration = Duration::from_secs(60);
/// How long each fault's window of requests lasts (the fault at its third).
const WINDOW: Duration = Duration::from_secs(30);
const PERIOD: Duration = Duration::from_millis(100);

/// One `kubectl get --raw /readyz` every [`PERIOD`] for [`WINDOW`], `fault` run a third of
/// the way in; returns (answered, sent).
fn requests_through(c: &UpCluster, fault: impl FnOnce()) -> (usize, usize) {
    let start = Instant::now();
    let mut fault = Some(fault);
    let mut running: Vec<Child> = Vec::new();
    let mut done: Vec<bool> = Vec::new();
    let mut next = start;
    while start.elapsed() < WINDOW {
        if start.elapsed() >= WINDOW / 3
            && let Some(f) = fault.take()
        {
            f();
        }
        running.push(
            c.kubectl_cmd(&["get", "--raw", "/readyz", "--request-timeout=5s"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        // Reap what has finished, so no more than a few are in flight.
        running.retain_mut(|ch| match ch.try_wait().unwrap() {
            Some(status) => {
                done.push(status.success());
                false
            }
            None => true,
        });
        next += PERIOD;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    for mut ch in running {
        done.push(ch.wait().unwrap().success());
    }
    (done.iter().filter(|ok| **ok).count(), done.len())
}

/// Whether control machine `i` has the virtual address on its fabric interface.
fn holds(c: &UpCluster, i: usize) -> bool {
    let wanted = format!("{}/24", c.api_ip);
    UpCluster::on(&c.control_netns(i), "ip")
        .args(["-4", "-o", "addr", "show", "dev", "eth0"])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .any(|w| w == wanted)
        })
}

/// The (first) control machine holding the address.
fn holder(c: &UpCluster) -> Option<usize> {
    (0..c.controls).find(|i| holds(c, *i))
}

/// How many control machines hold it.
fn holders(c: &UpCluster) -> usize {
    (0..c.controls).filter(|i| holds(c, *i)).count()
}

/// Waits until exactly one control machine, other than `old`, holds the address.
async fn moved_from(c: &UpCluster, old: usize) -> usize {
    eventually_within(
        "another control machine holds the virtual address alone",
        T,
        || async {
            match (holders(c), holder(c)) {
                (1, Some(h)) if h != old => Ok(h),
                (n, h) => Err(format!("{n} holders (first {h:?})\n{}", c.logs())),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn api_servers_share_a_virtual_address() {
    let c = UpCluster::start(1, true).await;
    eventually_within(
        "one control machine holds the virtual address",
        T,
        || async {
            match holders(&c) {
                1 => Ok(()),
                n => Err(format!("{n} holders\n{}", c.logs())),
            }
        },
    )
    .await;
    let out = c
        .kubectl_cmd(&["get", "--raw", "/readyz"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}\n{}", c.logs());

    // The holder's API server is killed (SIGKILL; `up` starts it again a second later, as
    // systemd would).
    let first = holder(&c).unwrap();
    let server = UpCluster::pids_on(&c.control_netns(first), "skiff-apiserver");
    assert_eq!(server.len(), 1, "{server:?}");
    let (ok, sent) = requests_through(&c, || {
        let out = std::process::Command::new("kill")
            .args(["-KILL", &server[0].to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    });
    let second = moved_from(&c, first).await;
    println!(
        "API server killed: {ok}/{sent} requests answered; the address moved from control {first} to {second}"
    );
    assert!(ok * 100 >= sent * 99, "{ok}/{sent} answered\n{}", c.logs());

    // The new holder's whole machine loses its link to the network.
    let (ok, sent) = requests_through(&c, || {
        let out = UpCluster::on(&c.control_netns(second), "ip")
            .args(["link", "set", "eth0", "down"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    });
    let third = moved_from(&c, second).await;
    println!(
        "machine cut off: {ok}/{sent} requests answered; the address moved from control {second} to {third}"
    );
    assert!(ok * 100 >= sent * 99, "{ok}/{sent} answered\n{}", c.logs());
}
