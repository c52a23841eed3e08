//! The `skiff-vip` binary refuses bad flags before it touches the network: the error names
//! the flag and the reason, and the process exits with a failure status.
//!
//! (The address's failover between machines is proven end to end by
//! `tests/tests/api_servers_share_a_virtual_address.rs`, which starts this binary inside
//! each control machine's network namespace.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_skiff-vip"))
        .args(args)
        // No kubeconfig from the environment: a bad flag must be reported before any is read.
        .env_remove("KUBECONFIG")
        .output()
        .expect("skiff-vip runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_name_the_flag_and_the_reason() {
    for (args, flag, why) in [
        (
            &["--address", "192.168.100.240", "--health", "127.0.0.1:6443"][..],
            "--address",
            "expected IP/PREFIX",
        ),
        (
            &["--address", "127.0.0.1/8", "--health", "127.0.0.1:6443"][..],
            "--address",
            "other machines can reach",
        ),
        (
            &["--address", "192.168.100.240/24", "--health", "nowhere"][..],
            "--health",
            "invalid",
        ),
        (
            &[
                "--address",
                "192.168.100.240/24",
                "--health",
                "127.0.0.1:6443",
                "--lease-duration",
                "0",
            ][..],
            "--lease-duration",
            "not in 1..",
        ),
        (&["--health", "127.0.0.1:6443"][..], "--address", "required"),
    ] {
        let (ok, stderr) = run(args);
        assert!(!ok, "{args:?} must fail");
        assert!(
            stderr.contains(flag) && stderr.contains(why),
            "{args:?}: the error must name {flag} and say {why:?}:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}:\n{stderr}");
    }
}
