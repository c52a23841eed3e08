//! `skiff-scheduler`: the scheduler process.
//!
//! Leader election is not done yet: run one instance. (It will come from the shared
//! controller runtime in skiff-client.)

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use skiff_scheduler::{DEFAULT_SCHEDULER_NAME, Scheduler, SchedulerConfig, watch_cluster};

#[derive(Parser, Debug)]
#[command(
    name = "skiff-scheduler",
    about = "Skiff scheduler: binds pending pods to nodes"
)]
struct Cli {
    /// The API server (default: SKIFF_SERVER, then the skiff config file, then
    /// http://127.0.0.1:7443).
    #[arg(long)]
    server: Option<String>,
    /// Schedule the pods whose spec.schedulerName is this.
    #[arg(long, default_value = DEFAULT_SCHEDULER_NAME)]
    scheduler_name: String,
    /// Percentage of nodes to find feasible before scoring (0: adaptive).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    percentage_of_nodes_to_score: u32,
    /// Seconds after which pods parked as unschedulable are retried without a cluster change.
    #[arg(long, default_value_t = 60)]
    unschedulable_timeout_seconds: u64,
    /// Binding and status calls in flight at once.
    #[arg(long, default_value_t = 64)]
    bind_concurrency: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let config = skiff_client::ClientConfig::load(cli.server.as_deref())
        .context("finding the API server")?;
    let client = skiff_client::Client::connect_lazy(config.endpoint())
        .context("connecting to the API server")?;
    tracing::info!(server = %config.endpoint(), scheduler_name = %cli.scheduler_name,
        "skiff-scheduler starting (single instance: no leader election yet)");
    let instance = std::env::var("HOSTNAME").unwrap_or_else(|_| "skiff-scheduler".into());
    let scheduler = Scheduler::new(
        client.clone(),
        SchedulerConfig {
            scheduler_name: cli.scheduler_name,
            percentage_of_nodes_to_score: cli.percentage_of_nodes_to_score,
            unschedulable_timeout: Duration::from_secs(cli.unschedulable_timeout_seconds),
            bind_concurrency: cli.bind_concurrency,
            instance,
            ..Default::default()
        },
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = scheduler.run(watch_cluster(&client)) => r.context("scheduler stopped")?,
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted, exiting"),
        _ = term.recv() => tracing::info!("terminated, exiting"),
    }
    Ok(())
}
