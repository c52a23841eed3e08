//! The typed Rust client of the Skiff API server, used by every component and the CLI.
//!
//! ```no_run
//! # async fn demo() -> Result<(), skiff_client::ClientError> {
//! use skiff_api::api::Deployment;
//! use skiff_client::{Client, ClientConfig, ListParams};
//!
//! let config = ClientConfig::load(None, None)?; // --server, --kubeconfig
//! let client = Client::connect_with(&config).await?;
//! let deployments = client.namespaced::<Deployment>("default");
//! for d in deployments.list(&ListParams::default()).await?.items {
//!     println!("{}", skiff_api::Resource::name(&d));
//! }
//! # Ok(())
//! # }
//! ```
//!
//! - [`api`]: [`Client`], the typed [`Api`] and the [`DynamicApi`] for types known at run time.
//! - [`error`]: [`ClientError`], mapped from gRPC statuses and the `skiff-reason` metadata.
//! - [`config`]: where the API server is and who to be: a kubeconfig
//!   ([`ClientConfig::load`]); several API servers as a comma-separated list, which the
//!   client fails over between (the private `failover` module, also used by the REST calls).
//! - [`node_lease`]: node heartbeats as Leases in `kube-node-lease`.
//! - [`reflector`]: list + watch (resumed from its revision after a failure) + relist when
//!   expired, the one way components observe the cluster.
//! - [`node_api`]: the node agents' HTTP API (logs, stats, exec, BPF maps), found through
//!   the API server ([`node_api::AgentEndpoint`]).
//! - [`controller`]: what every controller and the scheduler are built from: level-triggered
//!   reconcilers over reflectors (informers, work queue, reconcile loop, leader election,
//!   events), modelled on kube-rs' `runtime`; [`controller::terminated`] is the one way
//!   components wait for SIGTERM or SIGINT.
//! - `rest`: the few REST calls gRPC does not carry (TokenRequest for projected token
//!   volumes, the metrics API, snapshot downloads streamed to a file).
//!
//! The client reaches only the API server, and the node agents' API for logs, stats, exec,
//! port forwarding and BPF maps; never the Store.

pub mod api;
pub mod config;
pub mod controller;
pub mod error;
mod failover;
pub mod node_api;
pub mod node_lease;
pub mod reflector;
mod rest;

pub use api::{
    Api, Client, DeleteParams, DynamicApi, ListParams, ObjectList, Preconditions,
    PropagationPolicy, ResourceAttributes, WatchEvent, WatchStream,
};
pub use config::{ClientConfig, ConfigSource, DEFAULT_SERVER};
pub use error::ClientError;

/// Sets up logging as every Skiff binary does: `RUST_LOG` (default `info`), written to
/// stderr (stdout is for what a command prints; supervisors and the test harness collect
/// stderr). A second call keeps the first set-up.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}
