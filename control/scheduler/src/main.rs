//! `skiff-scheduler`: the scheduler process. Several replicas can run: with `--leader-elect`
//! (the default) only the holder of the `skiff-scheduler` Lease schedules, through
//! `skiff_client::controller::LeaderElector`, as the controller manager does.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use skiff_client::controller::{CancelToken, LeaderElectionConfig, LeaderElector};
use skiff_scheduler::{DEFAULT_SCHEDULER_NAME, Scheduler, SchedulerConfig, watch_cluster};

#[derive(Parser, Debug)]
#[command(
    name = "skiff-scheduler",
    about = "Skiff scheduler: binds pending pods to nodes"
)]
struct Cli {
    /// The API server URL, or a comma-separated list of API servers to fail over between
    /// (default: SKIFF_SERVER, then the kubeconfig's).
    #[arg(long)]
    server: Option<String>,
    /// The kubeconfig to use (default: $SKIFF_CONFIG, then ~/.config/skiff/config.yaml):
    /// the server, the CA to trust and the client certificate or token.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<std::path::PathBuf>,
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
    /// Schedule only while holding the leader Lease (kube-system/<lease-name>).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, default_value = "skiff-scheduler")]
    lease_name: String,
    /// Lease duration in seconds (renewal every third of it); a standby takes over this
    /// long after the leader stops renewing.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    lease_duration: u64,
    /// This replica's identity in the Lease (default: host name and pid).
    #[arg(long)]
    identity: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    skiff_client::init_logging();
    let cli = Cli::parse();
    let config = skiff_client::ClientConfig::load(cli.server.as_deref(), cli.kubeconfig.as_deref())
        .context("finding the API server")?;
    let client =
        skiff_client::Client::connect_lazy_with(&config).context("connecting to the API server")?;
    tracing::info!(server = %config.endpoint(), scheduler_name = %cli.scheduler_name,
        leader_elect = cli.leader_elect, "skiff-scheduler starting");
    let identity = cli.identity.clone().unwrap_or_else(|| {
        skiff_client::controller::default_identity("skiff-scheduler", std::process::id())
    });
    let scheduler_config = SchedulerConfig {
        scheduler_name: cli.scheduler_name.clone(),
        percentage_of_nodes_to_score: cli.percentage_of_nodes_to_score,
        unschedulable_timeout: Duration::from_secs(cli.unschedulable_timeout_seconds),
        bind_concurrency: cli.bind_concurrency,
        instance: identity.clone(),
        ..Default::default()
    };
    // Schedules until `stop` is cancelled (leadership lost, or shutting down).
    let schedule = |stop: CancelToken| {
        let scheduler = Scheduler::new(client.clone(), scheduler_config.clone());
        let events = watch_cluster(&client);
        async move {
            tokio::select! {
                r = scheduler.run(events) => {
                    if let Err(e) = r {
                        tracing::error!(error = %e, "scheduler stopped");
                    }
                }
                () = stop.cancelled() => tracing::info!("stopped scheduling"),
            }
        }
    };
    let shutdown = skiff_client::controller::cancelled_on_termination();
    if cli.leader_elect {
        let elector = LeaderElector::new(
            &client,
            LeaderElectionConfig::new(&cli.lease_name, &identity)
                .with_lease_duration(Duration::from_secs(cli.lease_duration)),
        )
        .with_shutdown(shutdown);
        elector.run(schedule).await.context("leader election")?;
    } else {
        schedule(shutdown).await;
    }
    Ok(())
}
