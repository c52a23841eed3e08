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
/// The control machine: the control plane's processes run inside this namespace (with
/// several, `-1`, `-2`, ... appended).
pub const CONTROL_NETNS: &str = "skiff-up-control";
/// The virtual address of several control machines' API servers.
const VIP_HOST: u8 = 240;

fn fabric_ip(host: u8) -> std::net::IpAddr {
    format!("{FABRIC_PREFIX}.{host}")
        .parse()
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
}

/// Control machine `i` of `of`: its namespace's name.
pub fn control_netns(i: usize, of: usize) -> String {
    if of <= 1 {
        CONTROL_NETNS.to_string()
    } else {
        format!("{CONTROL_NETNS}-{}", i + 1)
    }
}

/// Control machine `i` of `of`: its host number (`.250` alone, `.251` ... with others).
fn control_host(i: usize, of: usize) -> u8 {
    if of <= 1 {
        250
    } else {
        251u8.saturating_add(u8::try_from(i).unwrap_or(u8::MAX))
    }
}

/// The addresses of `of` control machines on the fabric.
pub fn control_ips(of: usize) -> Vec<std::net::IpAddr> {
    (0..of).map(|i| fabric_ip(control_host(i, of))).collect()
}

/// Several control machines' virtual address.
pub fn vip() -> std::net::IpAddr {
    fabric_ip(VIP_HOST)
}

/// A fresh namespace for control machine `i` of `of` (a stale one is replaced), on the
/// fabric at its [`control_ips`] address.
pub fn prepare_control_netns(fabric: &Fabric, i: usize, of: usize) -> Result<Netns> {
    let ns = Netns::create(&control_netns(i, of))?;
    fabric.attach_as(ns.name(), control_host(i, of), &format!("ctl{i}"))?;
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
