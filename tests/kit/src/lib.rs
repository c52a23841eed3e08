//! What Skiff's tests share, in one place, so no product crate carries test code:
//!
//! - [`server::TestServer`]: a real API server in this process, on an embedded store in a
//!   temporary directory (the unit of most control-plane tests).
//! - [`hollow`]: Node objects without an agent behind them, as Kubernetes' kubemark, for
//!   scheduler tests and benchmarks at a scale no machine could run.
//! - [`kubelet::FakeKubelet`]: the one stand-in for node agents, which makes pods Running and
//!   Ready (every pod, or the pods bound to a set of hollow nodes).
//! - [`build`]: object builders (pods, templates, selectors, labels).
//! - [`eventually`] and friends: the one bounded wait (also without the `api` feature).
//! - [`registry::Registry`]: a real OCI registry on loopback (also without `api`).
//!
//! The end-to-end harness that drives the real binaries lives in `tests/` (`skiff-tests`),
//! and the test network (namespaces, the fabric) in `skiff-testnet`, which `cargo xtask up`
//! uses too.
//!
//! Its feature `api` (default) holds everything that needs the API; without it only the waits
//! and the registry remain, which is how skiff-runtime's tests use it without building the
//! control plane. It is only ever a dev-dependency (or the bench's), never a normal dependency
//! of a product crate.

#[cfg(feature = "api")]
pub mod build;
#[cfg(feature = "api")]
pub mod hollow;
#[cfg(feature = "api")]
pub mod kubelet;
pub mod registry;
#[cfg(feature = "api")]
pub mod server;
mod wait;

pub use wait::{Attempt, WAIT, eventually, eventually_blocking, eventually_within};

/// Eight random hex digits, for names that must not collide between tests or runs.
pub fn unique() -> String {
    use rand::Rng as _;
    let n: u32 = rand::rng().random();
    format!("{n:08x}")
}

/// Logs to the test's output when `RUST_LOG` is set; once per test binary.
#[cfg(feature = "api")]
pub fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_none() {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
