//! A hanging test fails fast and the report names it.
//!
//! Runs `deliberate_hang.rs` with `XTASK_DELIBERATE_HANG=1` under cargo-nextest's `hang-check`
//! profile (.config/nextest.toml: the same slow-timeout mechanism as the default profile, with
//! a bound of 2 × 2 s instead of 4 × 60 s) and checks that nextest kills it within the bound,
//! fails the run, and names the test in its report.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_hanging_test_is_terminated_and_named() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is one level below the workspace root");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(root)
        .args([
            "nextest",
            "run",
            "--profile",
            "hang-check",
            // The whole workspace, as the test tier builds it: the same feature set, so
            // nothing is rebuilt; the filter picks the one test.
            "--workspace",
            "-E",
            "package(xtask) & binary(deliberate_hang)",
            "--run-ignored",
            "only",
            "--no-tests=fail",
        ])
        .env("XTASK_DELIBERATE_HANG", "1");
    // Under nextest no cargo process holds the build directory's lock while tests run, so the
    // nested run reuses the workspace's target directory (its test binary is already built).
    // Under plain `cargo test` the outer cargo holds that lock: use a directory of our own.
    if std::env::var_os("NEXTEST").is_none() {
        cmd.env(
            "CARGO_TARGET_DIR",
            root.join("target").join("xtask-hang-check"),
        );
    }
    let started = Instant::now();
    let out = cmd
        .output()
        .expect("cargo nextest runs (cargo xtask setup installs it)");
    let took = started.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    assert!(
        !out.status.success(),
        "a hung test must fail the run:\n{text}"
    );
    let timeout_line = text
        .lines()
        .find(|l| l.contains("TIMEOUT") && l.contains("deliberately_hangs"))
        .unwrap_or_else(|| panic!("no TIMEOUT line naming the test:\n{text}"));
    assert!(timeout_line.contains("deliberate_hang"), "{timeout_line}");
    // 2 periods of 2 s, 1 s of grace; the rest is cargo and nextest starting. A build from
    // scratch (plain `cargo test`) takes longer, so only the nextest case is held to seconds.
    let bound = if std::env::var_os("NEXTEST").is_some() {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(600)
    };
    assert!(took < bound, "took {took:?}:\n{text}");
}
