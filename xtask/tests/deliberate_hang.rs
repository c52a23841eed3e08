//! A test that hangs on purpose, to prove that a hung test is terminated and named instead of
//! eating CI's time budget. Without `XTASK_DELIBERATE_HANG=1` it returns at once, so the
//! default run never hangs; `hang_is_reported.rs` sets the variable and runs it under
//! cargo-nextest's `hang-check` profile.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::time::Duration;

#[test]
fn deliberately_hangs() {
    if std::env::var_os("XTASK_DELIBERATE_HANG").is_none() {
        return;
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
