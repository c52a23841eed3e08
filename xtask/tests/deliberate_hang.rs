//! A test that hangs on purpose, to prove that a hung test is terminated and named instead of
//! eating CI's time budget. It is ignored, so the default run never hangs, and refuses to run
//! without `XTASK_DELIBERATE_HANG=1`; `hang_is_reported.rs` sets the variable and runs it
//! (`--run-ignored only`) under cargo-nextest's `hang-check` profile.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::time::Duration;

#[test]
#[ignore = "hangs on purpose: run by hang_is_reported.rs"]
fn deliberately_hangs() {
    assert!(
        std::env::var_os("XTASK_DELIBERATE_HANG").is_some(),
        "hangs on purpose: only hang_is_reported.rs runs it, with XTASK_DELIBERATE_HANG=1"
    );
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
