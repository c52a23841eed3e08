//! The network `--nodes N` puts its machines on: a bridge in namespace [`FABRIC_NETNS`]
//! (their shared L2 segment), an outside client namespace [`OUTSIDE_NETNS`], the control
//! machine [`CONTROL_NETNS`], and a namespace per node attached to the bridge. Nothing is created in the root namespace; dropping the
//! [`Fabric`] and [`Netns`] handles removes them.

use anyhow::Result;
use skiff_testnet::{Fabric, Netns};

use super::plan::NodePlan;

/// The namespace holding the bridge that joins the nodes (their shared L2 segment).
pub const FABRIC_NETNS: &str = "skiff-up-fabric";
/// A client namespace on the fabric, outside the cluster (for NodePort and the like).
pub const OUTSIDE_NETNS: &str = "skiff-up-outside";
/// The control machine: the control plane's processes run inside this namespace.
pub const CONTROL_NETNS: &str = "skiff-up-control";
/// The control machine's host number on the fabric.
const CONTROL_HOST: u8 = 250;

/// The control machine's address on the fabric.
pub fn control_ip() -> std::net::IpAddr {
    format!("{FABRIC_PREFIX}.{CONTROL_HOST}")
        .parse()
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
}

/// A fresh namespace for the control machine (a stale one is replaced), on the fabric at
/// [`control_ip`].
pub fn prepare_control_netns(fabric: &Fabric) -> Result<Netns> {
    let ns = Netns::create(CONTROL_NETNS)?;
    fabric.attach_as(ns.name(), CONTROL_HOST, "ctl")?;
    Ok(ns)
}
/// The fabric's subnet; nodes are .1 .. .N, the outside namespace .254.
pub use skiff_testnet::FABRIC_PREFIX;

/// The fabric with the outside client namespace attached to it as `.254` (stale ones from
/// an earlier crash are replaced).
pub fn prepare_fabric() -> Result<Fabric> {
    let fabric = Fabric::create(FABRIC_NETNS)?;
    fabric.outside(OUTSIDE_NETNS, Some(254))?;
    Ok(fabric)
}

/// A fresh network namespace for a node (a stale one from an earlier crash is replaced),
/// attached to the fabric as host `.host`.
pub fn prepare_node_netns(fabric: &Fabric, node: &NodePlan, host: u8) -> Result<Netns> {
    let ns = Netns::create(&node.netns)?;
    let peer = node.name.replace("node-", "n");
    fabric.attach_as(ns.name(), host, &peer)?;
    Ok(ns)
}
