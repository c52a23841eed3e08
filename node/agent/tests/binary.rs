//! The `skiff-node` binary as an operator runs it: its subcommands exist, bad flags are
//! refused with the flag named and nothing started, and `check-host` reports this host.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::process::Command;

fn skiff_node(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_skiff-node"))
        .args(args)
        .output()
        .expect("running skiff-node")
}

#[test]
fn a_maglev_table_size_that_is_not_prime_is_refused_naming_the_flag() {
    let out = skiff_node(&["run", "--lb-maglev-table-size", "1000", "--node-name", "x"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--lb-maglev-table-size"), "{err}");
    assert!(err.contains("prime"), "{err}");
}

#[test]
fn check_host_finds_the_cgroup_v2_mount() {
    let out = skiff_node(&["check-host"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = skiff_runtime::host::cgroup2_mount().expect("cgroup v2 is mounted here");
    assert!(
        text.contains(&format!("cgroup v2 root:      {}", root.display())),
        "{text}"
    );
}

#[test]
fn the_shim_is_a_hidden_subcommand() {
    let out = skiff_node(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("run") && help.contains("purge"), "{help}");
    assert!(!help.contains("shim"), "{help}");
    // The runtime starts it as `<shim path> shim …`: it must parse.
    let out = skiff_node(&["shim", "--help"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
