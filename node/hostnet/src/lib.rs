//! Pod networking: one routed veth per pod, no bridge, no NAT (the Calico model).
//!
//! Topology, for a node network namespace `N` (the agent's own, or a path such as
//! `/run/netns/skiff-node-1`) and a pod namespace `P`:
//!
//! ```text
//!  pod netns P                                   node netns N (net.ipv4.ip_forward=1)
//!  lo up                                         skv<8 hex of hash(uid)> up, alias=<pod uid>,
//!  eth0 up, <podIP>/32  <---- veth pair ---->      proxy_arp=1, proxy_delay=0
//!  default via 169.254.1.1 dev eth0 onlink       route <podIP>/32 dev skv… scope link
//!  neigh 169.254.1.1 lladdr <skv… MAC> permanent
//! ```
//!
//! Every pod address is a /32 with a host route in `N`, so pods reach each other and `N`
//! reaches them by their real addresses; nothing is translated. `169.254.1.1` exists nowhere:
//! the pod resolves it to the host end's MAC, through a permanent neighbour entry written at
//! attach time and, as a fallback if the pod flushes it, through `proxy_arp` on the host end
//! (which answers only when `N` has a route to 169.254.1.1, e.g. a default route).
//!
//! Netlink sockets are opened by short-lived threads that `setns(2)` into the target namespace
//! (see [`netns`]); the connection futures then run on the tokio runtime.
//!
//! Cross-node: `N`'s main table also has `<other node's pod CIDR> via <its node IP>` for every
//! other node ([`NodeNetwork::set_peer_route`], driven by the agent's `routes` controller), so
//! nodes on one L2 segment route pod traffic directly, unencapsulated and untranslated.
//!
//! The eBPF fast path (`skiff_datapath::lb`, programmed by the agent's `proxy`) bypasses the
//! node's IP stack for pod traffic: it delivers straight into a pod through
//! [`PodAttachment::host_ifindex`] with [`PodAttachment::host_mac`] /
//! [`PodAttachment::pod_mac`]; the routes above stay, for what it hands to the stack and for
//! when it is not loaded.
//!
//! IPAM allocates pod addresses from the node's [`PodCidr`] (at most a /30), one file per
//! address claimed with a hard link, so allocation is atomic and survives restarts.
//! [`PodNetwork`] is the narrow interface the agent uses (attach, detach, addresses);
//! [`NodeNetwork`] implements it, and feature `fake` gives `fake::FakeNetwork` (addresses from a
//! CIDR, no kernel). [`connect_in`], [`listen_in`] and [`bind_udp_in`] open sockets inside a
//! namespace (port forwarding into a pod; the agent's API server passthrough and DNS server on
//! the node). The crate knows nothing of the API's types or the data path.

mod cidr;
mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod garp;
mod ipam;
mod netns;
mod rtnl;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rtnetlink::packet_route::link::LinkMessage;
use tracing::{debug, info, warn};

pub use cidr::{MAX_POD_PREFIX_V4, PodCidr};
pub use error::NetError;
pub use netns::{bind_udp_in, connect_in, listen_in};

use ipam::Ipam;
use netns::{Netns, write_sysctl};
use rtnl::Rtnl;

/// The pod's default gateway: link-local, owned by nobody, answered for by the host end.
pub const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The name of the pod's interface inside its namespace.
pub const POD_IFNAME: &str = "eth0";
/// Prefix of host-side veth names: `skv` + 8 hex digits = 11 characters (limit: 15).
pub const HOST_VETH_PREFIX: &str = "skv";

/// Longest accepted pod uid (it is stored as the host veth's alias, limited to 255 bytes).
const MAX_POD_UID_LEN: usize = 253;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNetworkConfig {
    /// The node network namespace (a namespace file such as `/run/netns/skiff-node-1`);
    /// `None` means the namespace the agent runs in.
    pub node_netns: Option<PathBuf>,
    /// The node's pod CIDR, e.g. `10.244.1.0/24` (validated by [`NodeNetwork::new`]).
    pub pod_cidr: String,
    /// Where IPAM state lives (`<state_dir>/ipam/<ip>`). Must survive agent restarts.
    pub state_dir: PathBuf,
}

/// What [`NodeNetwork::attach_pod`] set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAttachment {
    pub pod_ip: IpAddr,
    /// Name of the host end in the node namespace (`skv<8 hex>`).
    pub host_veth: String,
    /// ifindex of the host end, in the node namespace.
    pub host_ifindex: u32,
    /// ifindex of `eth0`, in the pod namespace.
    pub pod_ifindex: u32,
    /// MAC of the host end (the pod's gateway), if the kernel reported one.
    pub host_mac: Option<[u8; 6]>,
    /// MAC of the pod's `eth0`, if the kernel reported one.
    pub pod_mac: Option<[u8; 6]>,
}

/// The name of the host-side veth of `pod_uid`: `skv` + 8 hex digits of the FNV-1a hash of
/// the uid. Stable across agent versions and restarts (unlike std's hasher).
pub fn host_veth_name(pod_uid: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for b in pod_uid.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("{HOST_VETH_PREFIX}{hash:08x}")
}

fn validate_pod_uid(uid: &str) -> Result<(), NetError> {
    let invalid = |reason| NetError::PodUidInvalid {
        uid: uid.to_string(),
        reason,
    };
    if uid.is_empty() {
        return Err(invalid("empty"));
    }
    if uid.len() > MAX_POD_UID_LEN {
        return Err(invalid("longer than 253 bytes"));
    }
    if !uid
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(invalid(
            "only ASCII letters, digits, '-', '_' and '.' are allowed",
        ));
    }
    Ok(())
}

/// The IPv4 network and prefix length of another node's pod CIDR.
fn peer_network(cidr: &str) -> Result<(Ipv4Addr, u8), NetError> {
    let peer = PodCidr::parse(cidr)?;
    match peer.network() {
        IpAddr::V4(v4) => Ok((v4, peer.prefix_len())),
        IpAddr::V6(_) => Err(NetError::PodCidrInvalid {
            cidr: cidr.to_string(),
            reason: "IPv6 pod CIDRs are not supported yet".into(),
        }),
    }
}

/// Pod networking of one node: IPAM over the node's pod CIDR plus the per-pod veths and routes.
pub struct NodeNetwork {
    node_netns: Netns,
    ipam: Ipam,
    /// Netlink connection inside the node namespace, kept for the agent's lifetime.
    node: Rtnl,
    rt: tokio::runtime::Handle,
    /// Serializes attach/detach: each is a read-check-write sequence on shared kernel state.
    ops: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for NodeNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeNetwork")
            .field("node_netns", &self.node_netns.to_string())
            .field("pod_cidr", &self.ipam.cidr().to_string())
            .finish_non_exhaustive()
    }
}

impl NodeNetwork {
    /// Validates the CIDR, loads the IPAM state and prepares the node namespace
    /// (`net.ipv4.ip_forward=1` there). Must be called on a tokio runtime, whose handle is kept
    /// to drive the netlink connections.
    pub async fn new(cfg: NodeNetworkConfig) -> Result<Self, NetError> {
        let cidr = PodCidr::parse(&cfg.pod_cidr)?;
        let rt = tokio::runtime::Handle::try_current().map_err(|_| NetError::NoRuntime)?;
        let ipam = Ipam::load(cidr, &cfg.state_dir)?;
        let node_netns = Netns::new(cfg.node_netns.as_deref());
        let node = Rtnl::connect(&node_netns, &rt).await?;
        write_sysctl(&node_netns, "ipv4/ip_forward", "1").await?;
        info!(%cidr, netns = %node_netns, "node network ready");
        Ok(Self {
            node_netns,
            ipam,
            node,
            rt,
            ops: tokio::sync::Mutex::new(()),
        })
    }

    pub fn pod_cidr(&self) -> &PodCidr {
        self.ipam.cidr()
    }

    /// The address allocated to `pod_uid`, if any (also after an agent restart).
    pub fn pod_ip(&self, pod_uid: &str) -> Option<IpAddr> {
        self.ipam.lookup(pod_uid).map(IpAddr::V4)
    }

    /// Every allocation, as (pod address, pod uid), ordered by address.
    pub fn allocations(&self) -> Vec<(IpAddr, String)> {
        self.ipam.allocations()
    }

    /// The first global IPv4 address of the node namespace, if any (for
    /// `Node.status.addresses`).
    pub async fn node_ip(&self) -> Option<IpAddr> {
        match self.node.first_global_ipv4().await {
            Ok(ip) => ip.map(IpAddr::V4),
            Err(e) => {
                warn!(error = %e, "cannot read the node's addresses");
                None
            }
        }
    }

    /// The node's uplink: the interface holding [`NodeNetwork::node_ip`], as (name, address).
    pub async fn uplink(&self) -> Result<Option<(String, Ipv4Addr)>, NetError> {
        let Some((ip, index)) = self.node.first_global_ipv4_link().await? else {
            return Ok(None);
        };
        Ok(self
            .node
            .link_by_index(index)
            .await?
            .and_then(|l| rtnl::name(&l).map(str::to_string))
            .map(|name| (name, ip)))
    }

    /// The node network namespace file (`None`: the agent's own namespace).
    pub fn netns_path(&self) -> Option<&Path> {
        self.node_netns.path()
    }

    /// Routes another node's pod CIDR through that node's address (`ip route replace <cidr>
    /// via <node_ip>` in the node namespace): pods on different nodes reach each other by
    /// their own addresses, without NAT or encapsulation, when the nodes share an L2 segment.
    pub async fn set_peer_route(&self, cidr: &str, node_ip: Ipv4Addr) -> Result<(), NetError> {
        let (network, len) = peer_network(cidr)?;
        self.node.replace_route_via(network, len, node_ip).await
    }

    /// Removes the route [`NodeNetwork::set_peer_route`] made for `cidr` (`Ok(false)`: none).
    pub async fn remove_peer_route(&self, cidr: &str) -> Result<bool, NetError> {
        let (network, len) = peer_network(cidr)?;
        self.node.delete_route(network, len).await
    }

    /// Connects the pod namespace `pod_netns` to the node: allocates the pod's address and
    /// sets up the veth pair, routes and neighbour entry described in the module docs.
    ///
    /// Idempotent: running it again (after a partial failure, or after an agent restart) keeps
    /// the address and a correctly paired veth and re-applies everything else; a host veth
    /// whose peer is not this namespace's `eth0` is deleted and recreated. If it fails, the
    /// address stays allocated to the pod so that a retry converges; [`Self::detach_pod`] gives
    /// it back.
    pub async fn attach_pod(
        &self,
        pod_uid: &str,
        pod_netns: &Path,
    ) -> Result<PodAttachment, NetError> {
        validate_pod_uid(pod_uid)?;
        let _serial = self.ops.lock().await;
        let ip = self.ipam.allocate(pod_uid)?;
        let host_name = host_veth_name(pod_uid);
        let pod_ns = Netns::new(Some(pod_netns));
        let pod = Rtnl::connect(&pod_ns, &self.rt).await?;

        let (host, peer) = self.ensure_veth(pod_uid, &host_name, &pod).await?;
        let (host_idx, peer_idx) = (host.header.index, peer.header.index);

        // Node side: host end up (alias = owner, for collision checks and humans), proxy ARP,
        // and the /32 route that makes the pod reachable.
        self.node
            .set_up(host_idx, &host_name, Some(pod_uid))
            .await?;
        write_sysctl(
            &self.node_netns,
            &format!("ipv4/conf/{host_name}/proxy_arp"),
            "1",
        )
        .await?;
        // Answer proxied ARP at once instead of after a random delay of up to 0.8 s.
        write_sysctl(
            &self.node_netns,
            &format!("ipv4/neigh/{host_name}/proxy_delay"),
            "0",
        )
        .await?;
        self.node
            .replace_host_route(ip, host_idx, &host_name)
            .await?;

        // Pod side (its loopback is up since the runtime created the namespace).
        pod.set_up(peer_idx, POD_IFNAME, None).await?;
        pod.set_only_ipv4(peer_idx, POD_IFNAME, ip, 32).await?;
        match rtnl::mac(&host) {
            Some(mac) => {
                pod.replace_permanent_neighbour(POD_GATEWAY, mac, peer_idx, POD_IFNAME)
                    .await?
            }
            None => warn!(host_veth = %host_name, "host veth has no MAC; relying on proxy ARP"),
        }
        pod.replace_default_route_onlink(POD_GATEWAY, peer_idx, POD_IFNAME)
            .await?;

        info!(pod_uid, %ip, host_veth = %host_name, netns = %pod_ns, "pod attached");
        Ok(PodAttachment {
            pod_ip: IpAddr::V4(ip),
            host_veth: host_name,
            host_ifindex: host_idx,
            pod_ifindex: peer_idx,
            host_mac: rtnl::mac(&host).and_then(|m| m.try_into().ok()),
            pod_mac: rtnl::mac(&peer).and_then(|m| m.try_into().ok()),
        })
    }

    /// Finds the pod's veth pair, or (re)creates it. Returns (host end, pod end).
    async fn ensure_veth(
        &self,
        pod_uid: &str,
        host_name: &str,
        pod: &Rtnl,
    ) -> Result<(LinkMessage, LinkMessage), NetError> {
        let mut pod_if = pod.link_by_name(POD_IFNAME).await?;
        if let Some(host) = self.node.link_by_name(host_name).await? {
            if let Some(owner) = rtnl::alias(&host)
                && owner != pod_uid
            {
                return Err(NetError::HostVethCollision {
                    name: host_name.to_string(),
                    owner: owner.to_string(),
                    pod_uid: pod_uid.to_string(),
                });
            }
            if let Some(peer) = &pod_if
                && rtnl::peer_index(&host) == Some(peer.header.index)
                && rtnl::peer_index(peer) == Some(host.header.index)
            {
                debug!(pod_uid, host_veth = host_name, "reusing existing veth pair");
                return Ok((host, peer.clone()));
            }
            warn!(pod_uid, host_veth = host_name, netns = %pod.netns(),
                "host veth exists but is not paired with the pod's eth0; recreating it");
            self.node.delete_link(host.header.index, host_name).await?;
            pod_if = pod.link_by_name(POD_IFNAME).await?;
        }
        if pod_if.is_some() {
            return Err(NetError::PodInterfaceConflict {
                netns: pod.netns().display_path(),
                name: POD_IFNAME.to_string(),
                pod_uid: pod_uid.to_string(),
            });
        }
        self.node
            .create_veth(host_name, POD_IFNAME, pod.netns())
            .await?;
        let missing = |name: &str, netns: &Netns| NetError::LinkMissing {
            name: name.to_string(),
            netns: netns.to_string(),
            after: "creating the veth pair",
        };
        let host = self
            .node
            .link_by_name(host_name)
            .await?
            .ok_or_else(|| missing(host_name, &self.node_netns))?;
        let peer = pod
            .link_by_name(POD_IFNAME)
            .await?
            .ok_or_else(|| missing(POD_IFNAME, pod.netns()))?;
        debug!(pod_uid, host_veth = host_name, "created veth pair");
        Ok((host, peer))
    }

    /// Disconnects a pod: deletes its host veth (the pod end goes with it), its /32 route and
    /// releases its address. Idempotent; does not need the pod namespace (it may be gone).
    pub async fn detach_pod(&self, pod_uid: &str) -> Result<(), NetError> {
        validate_pod_uid(pod_uid)?;
        let _serial = self.ops.lock().await;
        let host_name = host_veth_name(pod_uid);
        if let Some(host) = self.node.link_by_name(&host_name).await? {
            match rtnl::alias(&host) {
                Some(owner) if owner != pod_uid => {
                    warn!(pod_uid, host_veth = %host_name, owner,
                        "host veth belongs to another pod; leaving it");
                }
                _ => {
                    self.node.delete_link(host.header.index, &host_name).await?;
                }
            }
        }
        // Deleting the veth removed its routes; this catches a route left pointing elsewhere.
        let ips: Vec<Ipv4Addr> = self
            .ipam
            .allocations()
            .into_iter()
            .filter(|(_, uid)| uid == pod_uid)
            .filter_map(|(ip, _)| match ip {
                IpAddr::V4(v4) => Some(v4),
                IpAddr::V6(_) => None,
            })
            .collect();
        for ip in &ips {
            if self.node.delete_host_route(*ip).await? {
                debug!(pod_uid, %ip, "deleted leftover pod route");
            }
        }
        self.ipam.release(pod_uid)?;
        info!(pod_uid, host_veth = %host_name, "pod detached");
        Ok(())
    }
}

/// What the node agent's pod workers need from pod networking: the narrow interface over
/// [`NodeNetwork`] (and `fake::FakeNetwork`, feature `fake`, for tests without root).
#[async_trait::async_trait]
pub trait PodNetwork: Send + Sync {
    /// Connects the pod namespace `pod_netns` to the node and gives the pod its address
    /// (idempotent).
    async fn attach_pod(&self, pod_uid: &str, pod_netns: &Path) -> Result<PodAttachment, NetError>;
    /// Disconnects the pod and releases its address (idempotent).
    async fn detach_pod(&self, pod_uid: &str) -> Result<(), NetError>;
    /// The address allocated to `pod_uid`, if any.
    fn pod_ip(&self, pod_uid: &str) -> Option<IpAddr>;
    /// Every allocation, as (pod address, pod uid), ordered by address.
    fn allocations(&self) -> Vec<(IpAddr, String)>;
    /// The node network namespace file (`None`: the agent's own namespace).
    fn netns_path(&self) -> Option<&Path>;
}

#[async_trait::async_trait]
impl PodNetwork for NodeNetwork {
    async fn attach_pod(&self, pod_uid: &str, pod_netns: &Path) -> Result<PodAttachment, NetError> {
        NodeNetwork::attach_pod(self, pod_uid, pod_netns).await
    }
    async fn detach_pod(&self, pod_uid: &str) -> Result<(), NetError> {
        NodeNetwork::detach_pod(self, pod_uid).await
    }
    fn pod_ip(&self, pod_uid: &str) -> Option<IpAddr> {
        NodeNetwork::pod_ip(self, pod_uid)
    }
    fn allocations(&self) -> Vec<(IpAddr, String)> {
        NodeNetwork::allocations(self)
    }
    fn netns_path(&self) -> Option<&Path> {
        NodeNetwork::netns_path(self)
    }
}

/// Runs the blocking `f` on a short-lived thread inside the network namespace at `path`
/// (for example a probe's TCP connect to a pod IP). Tokio worker threads never move.
pub async fn run_in_netns<R, F>(path: &Path, f: F) -> Result<R, NetError>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    netns::Netns::new(Some(path)).run(f).await
}

/// Runs the blocking `f` on a scoped thread inside the network namespace at `path` (`None`:
/// the agent's own) and returns its result; `f` may borrow from the caller.
pub fn run_in_netns_scoped<R, F>(path: Option<&Path>, f: F) -> Result<R, NetError>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    netns::Netns::new(path).run_scoped(f)
}

/// The first global IPv4 address of the namespace `netns` (`None`: the caller's own), before
/// any [`NodeNetwork`] exists: the address the agent serves its API on and publishes as its
/// Node's InternalIP. Must be called on a tokio runtime.
pub async fn node_address(netns: Option<&Path>) -> Result<Option<Ipv4Addr>, NetError> {
    let rt = tokio::runtime::Handle::try_current().map_err(|_| NetError::NoRuntime)?;
    Rtnl::connect(&Netns::new(netns), &rt)
        .await?
        .first_global_ipv4()
        .await
}

/// Adds `ip/prefix` to link `ifname` of the caller's network namespace, beside its other
/// addresses (a virtual address taken over from another machine). Must be called on a tokio
/// runtime.
pub async fn add_address(ifname: &str, ip: Ipv4Addr, prefix: u8) -> Result<(), NetError> {
    let rt = tokio::runtime::Handle::try_current().map_err(|_| NetError::NoRuntime)?;
    Rtnl::connect(&Netns::new(None), &rt)
        .await?
        .add_ipv4(ifname, ip, prefix)
        .await
}

/// Removes `ip` from link `ifname` of the caller's network namespace; `Ok(false)` when the
/// link did not hold it.
pub async fn remove_address(ifname: &str, ip: Ipv4Addr) -> Result<bool, NetError> {
    let rt = tokio::runtime::Handle::try_current().map_err(|_| NetError::NoRuntime)?;
    Rtnl::connect(&Netns::new(None), &rt)
        .await?
        .remove_ipv4(ifname, ip)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent shares one `NodeNetwork` between tasks and spawns its futures.
    #[test]
    fn node_network_is_shareable_and_its_futures_are_send() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>(_: &T) {}
        send_sync::<NodeNetwork>();
        #[allow(dead_code)]
        fn futures_are_send(net: &NodeNetwork, path: &Path) {
            send(&net.attach_pod("uid", path));
            send(&net.detach_pod("uid"));
            send(&net.node_ip());
            send(&NodeNetwork::new(NodeNetworkConfig {
                node_netns: None,
                pod_cidr: String::new(),
                state_dir: PathBuf::new(),
            }));
        }
    }

    #[test]
    fn host_veth_names_are_stable_and_short() {
        let a = host_veth_name("0b6f5c7e-3c1d-4d55-9d8e-0a3f9f3b2a11");
        assert_eq!(a, host_veth_name("0b6f5c7e-3c1d-4d55-9d8e-0a3f9f3b2a11"));
        assert_ne!(a, host_veth_name("0b6f5c7e-3c1d-4d55-9d8e-0a3f9f3b2a12"));
        assert_eq!(a.len(), 11);
        assert!(a.starts_with("skv"));
        // FNV-1a of "" is the offset basis: a fixed value guards against accidental changes.
        assert_eq!(host_veth_name(""), "skv811c9dc5");
    }

    #[test]
    fn pod_uids_are_validated() {
        assert!(validate_pod_uid("0b6f5c7e-3c1d-4d55-9d8e-0a3f9f3b2a11").is_ok());
        for bad in ["", "a/b", "a b", "x\n", &"a".repeat(254)] {
            assert!(
                matches!(validate_pod_uid(bad), Err(NetError::PodUidInvalid { .. })),
                "{bad:?}"
            );
        }
    }
}
