//! `skiff-vip`: holds the API servers' virtual registration address on one control machine
//! at a time (see the library's docs). Run one on every control machine, inside its network
//! namespace, beside its API server.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "skiff-vip",
    about = "Holds the API servers' virtual address on one healthy control machine at a time"
)]
struct Cli {
    /// The API server URL, or a comma-separated list to fail over between.
    #[arg(long)]
    server: Option<String>,
    /// The kubeconfig (an identity allowed to hold the kube-system/skiff-apiserver-vip Lease).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<std::path::PathBuf>,
    /// The virtual address with its prefix length, e.g. 192.168.100.240/24.
    #[arg(long, value_name = "IP/PREFIX")]
    address: String,
    /// The interface the address goes on.
    #[arg(long, default_value = "eth0")]
    interface: String,
    /// This machine's API server (host:port): the address is held only while it answers.
    #[arg(long, value_name = "ADDR")]
    health: SocketAddr,
    /// This machine's identity in the Lease (default: host name and pid).
    #[arg(long)]
    identity: Option<String>,
    /// Lease duration in seconds: a cut-off holder is replaced this long after its last
    /// renewal.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    lease_duration: u64,
}

fn parse_address(s: &str) -> anyhow::Result<(Ipv4Addr, u8)> {
    let Some((ip, prefix)) = s.split_once('/') else {
        bail!("--address {s:?}: expected IP/PREFIX, e.g. 192.168.100.240/24");
    };
    let ip: Ipv4Addr = ip
        .parse()
        .with_context(|| format!("--address {s:?}: {ip:?} is not an IPv4 address"))?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| (1..=32).contains(p))
        .with_context(|| format!("--address {s:?}: the prefix length must be 1 to 32"))?;
    if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() {
        bail!("--address {s:?}: must be an address other machines can reach");
    }
    Ok((ip, prefix))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    skiff_client::init_logging();
    let cli = Cli::parse();
    let (address, prefix) = parse_address(&cli.address)?;
    let config = skiff_client::ClientConfig::load(cli.server.as_deref(), cli.kubeconfig.as_deref())
        .context("finding the API server")?;
    let client =
        skiff_client::Client::connect_lazy_with(&config).context("connecting to the API server")?;
    let cfg = skiff_vip::VipConfig {
        address,
        prefix,
        interface: cli.interface.clone(),
        health: cli.health,
        identity: cli.identity.clone().unwrap_or_else(|| {
            skiff_client::controller::default_identity("skiff-vip", std::process::id())
        }),
        lease_duration: Duration::from_secs(cli.lease_duration),
    };
    tracing::info!(%address, interface = %cfg.interface, identity = %cfg.identity, "skiff-vip starting");
    let shutdown = skiff_client::controller::cancelled_on_termination();
    skiff_vip::run(&client, &cfg, shutdown)
        .await
        .context("holding the virtual address")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_addresses_name_the_flag_and_the_reason() {
        assert_eq!(
            parse_address("192.168.100.240/24").unwrap(),
            (Ipv4Addr::new(192, 168, 100, 240), 24)
        );
        for (bad, why) in [
            ("192.168.100.240", "expected IP/PREFIX"),
            ("nope/24", "is not an IPv4 address"),
            ("10.0.0.1/33", "prefix length"),
            ("127.0.0.1/8", "other machines"),
        ] {
            let e = format!("{:#}", parse_address(bad).unwrap_err());
            assert!(e.contains("--address") && e.contains(why), "{bad}: {e}");
        }
    }
}
