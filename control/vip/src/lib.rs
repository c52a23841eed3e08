//! The API servers' registration address on a highly available control plane: a virtual
//! IPv4 address that exactly one control machine holds at a time, as kube-vip's ARP mode
//! does. Every control machine runs this beside its API server; the holder is the leader of
//! the `kube-system/skiff-apiserver-vip` Lease (`skiff_client::controller::LeaderElector`,
//! through the public API like every other component).
//!
//! A machine campaigns only while its own API server accepts connections. The leader adds
//! the address to its interface, sends gratuitous ARPs so the segment's caches move to it
//! at once, and checks its API server every [`HEALTH_PERIOD`]: after [`HEALTH_FAILURES`]
//! failures in a row it removes the address and gives the Lease up, so a standby whose
//! server is healthy takes over within its retry period. A leader that cannot renew (its
//! machine cut off) stops within the Lease's renew deadline and removes the address; the
//! others take over when the Lease expires. Losing leadership for any reason removes the
//! address before anything else.
//!
//! What it cannot prevent: a holder killed with SIGKILL leaves the address on its interface
//! until it runs again (the new holder's gratuitous ARPs move the clients; kube-vip has the
//! same window).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use skiff_client::Client;
use skiff_client::controller::{CancelToken, LeaderElectionConfig, LeaderElector};
use tracing::{info, warn};

/// The Lease the holders elect through.
pub const LEASE_NAME: &str = "skiff-apiserver-vip";
/// How often the holder checks its API server.
pub const HEALTH_PERIOD: Duration = Duration::from_millis(100);
/// Failed checks in a row after which the holder gives the address up.
pub const HEALTH_FAILURES: u32 = 2;
/// Gratuitous ARPs sent when the address is taken, this far apart.
const GARP_COUNT: u32 = 3;
const GARP_GAP: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum VipError {
    #[error("{op}: {source}")]
    Net {
        op: String,
        #[source]
        source: skiff_hostnet::NetError,
    },
    #[error("gratuitous ARP for {ip} on {interface}: {source}")]
    Garp {
        ip: Ipv4Addr,
        interface: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Election(#[from] skiff_client::controller::LeaderElectionError),
}

/// What to hold and how.
#[derive(Debug, Clone)]
pub struct VipConfig {
    /// The virtual address and its prefix length on the interface.
    pub address: Ipv4Addr,
    pub prefix: u8,
    /// The interface it goes on (the machine's uplink).
    pub interface: String,
    /// This machine's API server: the holder must be able to connect to it.
    pub health: SocketAddr,
    /// This machine's identity in the Lease.
    pub identity: String,
    /// The Lease's duration (whole seconds, at least 1).
    pub lease_duration: Duration,
}

/// Whether something accepts TCP connections at `addr` within `timeout`.
async fn accepts(addr: SocketAddr, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// Campaigns while this machine's API server is healthy, holds the address while leading,
/// until `shutdown` is cancelled (the address is then removed and the Lease released).
pub async fn run(client: &Client, cfg: &VipConfig, shutdown: CancelToken) -> Result<(), VipError> {
    // A holder that died left the address behind: it is not ours until we lead.
    release(cfg).await?;
    loop {
        // Only a machine whose API server answers may hold the address.
        while !accepts(cfg.health, HEALTH_PERIOD).await {
            tokio::select! {
                () = tokio::time::sleep(HEALTH_PERIOD) => {}
                () = shutdown.cancelled() => return Ok(()),
            }
        }
        let elector = LeaderElector::new(
            client,
            LeaderElectionConfig::new(LEASE_NAME, &cfg.identity)
                .with_lease_duration(cfg.lease_duration),
        )
        .with_shutdown(shutdown.child());
        let outcome = std::sync::Mutex::new(Ok(()));
        elector
            .run(|stop| async {
                // Leadership lost, shutting down or unhealthy: the address goes first.
                let held = hold(cfg, stop).await;
                let released = release(cfg).await;
                if let Err(e) = held.and(released) {
                    *outcome.lock().unwrap_or_else(|p| p.into_inner()) = Err(e);
                }
            })
            .await?;
        outcome.into_inner().unwrap_or_else(|p| p.into_inner())?;
        if shutdown.is_cancelled() {
            return Ok(());
        }
    }
}

/// While leading: the address on the interface, announced, until `stop` (leadership lost
/// or shutting down) or this machine's API server stops answering (then returns, which
/// gives the Lease up).
async fn hold(cfg: &VipConfig, stop: CancelToken) -> Result<(), VipError> {
    skiff_hostnet::add_address(&cfg.interface, cfg.address, cfg.prefix)
        .await
        .map_err(|source| VipError::Net {
            op: format!("adding {}/{} to {}", cfg.address, cfg.prefix, cfg.interface),
            source,
        })?;
    info!(address = %cfg.address, interface = %cfg.interface, "holding the virtual address");
    let (ip, interface) = (cfg.address, cfg.interface.clone());
    let sent = tokio::task::spawn_blocking(move || {
        let (index, mac) = skiff_hostnet::garp::link(&interface)?;
        skiff_hostnet::garp::announce(index, mac, ip, GARP_COUNT, GARP_GAP)
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    if let Err(source) = sent {
        return Err(VipError::Garp {
            ip,
            interface: cfg.interface.clone(),
            source,
        });
    }
    let mut failures = 0;
    loop {
        tokio::select! {
            () = tokio::time::sleep(HEALTH_PERIOD) => {}
            () = stop.cancelled() => return Ok(()),
        }
        if accepts(cfg.health, HEALTH_PERIOD).await {
            failures = 0;
            continue;
        }
        failures += 1;
        if failures >= HEALTH_FAILURES {
            warn!(api_server = %cfg.health, "this machine's API server does not answer: giving the virtual address up");
            return Ok(());
        }
    }
}

/// The address off the interface (nothing to do when it is not there).
async fn release(cfg: &VipConfig) -> Result<(), VipError> {
    match skiff_hostnet::remove_address(&cfg.interface, cfg.address).await {
        Ok(true) => {
            info!(address = %cfg.address, interface = %cfg.interface, "released the virtual address");
            Ok(())
        }
        Ok(false) => Ok(()),
        Err(source) => Err(VipError::Net {
            op: format!("removing {} from {}", cfg.address, cfg.interface),
            source,
        }),
    }
}
