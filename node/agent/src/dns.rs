//! The node's cluster DNS: [`skiff_dns::Handler`] served on the node's address in its
//! network namespace (UDP and TCP), answering from the agent's Service and Endpoints
//! informers. The Service load balancer sends the `kube-system/kube-dns` Service here, as it
//! sends `kubernetes` to the API server passthrough.
//!
//! Other names are forwarded to `--dns-upstream` (default the nameservers of the node's
//! /etc/resolv.conf); the port is `--dns-port`; the Service is routed with
//! `Proxy::route_locally`. Pods' resolv.conf is written by `volumes::resolv_conf` from their
//! dnsPolicy and dnsConfig, `--cluster-dns` and `--cluster-domain`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hickory_server::Server;
use skiff_api::api::{Endpoints, Service};
use skiff_client::controller::{Informer, ObjectKey};
pub use skiff_dns::{ClusterView, Handler, upstream_from_resolv_conf};
use tracing::{info, warn};

/// The agent's informers as the view.
pub struct Informed {
    pub services: Informer<Service>,
    pub endpoints: Informer<Endpoints>,
}

impl std::fmt::Debug for Informed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informed").finish_non_exhaustive()
    }
}

impl ClusterView for Informed {
    fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.get(&ObjectKey::new(namespace, name))
    }
    fn endpoints(&self, namespace: &str, name: &str) -> Option<Arc<Endpoints>> {
        self.endpoints.get(&ObjectKey::new(namespace, name))
    }
    fn services(&self) -> Vec<Arc<Service>> {
        self.services.list()
    }
    fn all_endpoints(&self) -> Vec<Arc<Endpoints>> {
        self.endpoints.list()
    }
}

/// A running cluster DNS server; stopped when dropped.
#[derive(Debug)]
pub struct ClusterDns {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ClusterDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ClusterDns {
    /// Serves `handler` on `addr` (UDP and TCP) in the network namespace `netns`.
    pub async fn start(
        netns: Option<&Path>,
        addr: SocketAddr,
        handler: Handler,
    ) -> Result<ClusterDns, String> {
        let udp = skiff_hostnet::bind_udp_in(netns, addr)
            .await
            .map_err(|e| format!("DNS on {addr}/udp: {e}"))?;
        let tcp = skiff_hostnet::listen_in(netns, addr)
            .await
            .map_err(|e| format!("DNS on {addr}/tcp: {e}"))?;
        let udp = tokio::net::UdpSocket::from_std(udp).map_err(|e| e.to_string())?;
        let tcp = tokio::net::TcpListener::from_std(tcp).map_err(|e| e.to_string())?;
        let mut server = Server::new(handler);
        server.register_socket(udp);
        server.register_listener(tcp, Duration::from_secs(5), 65535);
        info!(%addr, "cluster DNS listening for pods");
        let task = tokio::spawn(async move {
            if let Err(e) = server.block_until_done().await {
                warn!(error = %e, "cluster DNS stopped");
            }
        });
        Ok(ClusterDns { addr, task })
    }
}
