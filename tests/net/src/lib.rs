//! The test network: named network namespaces and the nodes' shared L2 segment, built with
//! `ip` (iproute2) the way an operator would, for the end-to-end tests and `cargo xtask up`.
//!
//! Nothing here creates anything in the root network namespace: a [`Fabric`] is a bridge
//! `br0` inside a namespace of its own, and every namespace attached to it gets an `eth0`
//! whose veth peer is on that bridge, with an address in [`FABRIC_PREFIX`]`.0/24`. Every
//! [`Netns`] (and with it every veth end inside it) is deleted when dropped, also when a test
//! panics.

use std::process::Command;
use std::sync::Mutex;

mod forward;
pub use forward::{Forwarder, connect_in, run_in, udp_bind_in};
use std::sync::atomic::{AtomicU8, Ordering};

/// The fabric's subnet (it exists inside the fabric's namespaces only).
pub const FABRIC_PREFIX: &str = "192.168.100";

/// The highest host number [`Fabric::attach`] hands out; `.251`–`.254` are left for callers
/// that pick fixed addresses with [`Fabric::attach_as`].
const LAST_DYNAMIC_HOST: u8 = 250;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("`ip {args}` failed: {stderr}")]
    Ip { args: String, stderr: String },
    #[error("could not run `ip` (iproute2; `cargo xtask setup` installs it): {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the fabric {0} has no free address left")]
    Full(String),
}

/// Runs `ip ARGS`; a failure carries ip's own message.
pub fn ip(args: &[&str]) -> Result<(), NetError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(NetError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError::Ip {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// `ip -n NETNS ARGS`.
pub fn ip_in(netns: &str, args: &[&str]) -> Result<(), NetError> {
    let mut full = vec!["-n", netns];
    full.extend_from_slice(args);
    ip(&full)
}

/// A named network namespace (`/run/netns/<name>`) with `lo` up; deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name`. A stale one of that name (left by a crash) is replaced.
    pub fn create(name: &str) -> Result<Netns, NetError> {
        let _ = ip(&["netns", "del", name]);
        ip(&["netns", "add", name])?;
        // From here on, dropping `ns` removes it again if a later step fails.
        let ns = Netns {
            name: name.to_string(),
        };
        ip_in(name, &["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs `program` inside this namespace (`nsenter --net=<path> --
    /// program`: only the network namespace changes; mounts, cgroups and the BPF file system
    /// stay the caller's, as on a machine of its own). nsenter execs the program, so the
    /// child's pid is the program's.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        command_in(&self.path(), program)
    }

    /// `/run/netns/<name>`, what `--node-netns` and `nsenter --net=` take.
    pub fn path(&self) -> std::path::PathBuf {
        std::path::Path::new("/run/netns").join(&self.name)
    }

    /// `ip -n <name> ARGS`.
    pub fn ip(&self, args: &[&str]) -> Result<(), NetError> {
        ip_in(&self.name, args)
    }
}

/// `program` run inside the network namespace bind-mounted at `netns` (see
/// [`Netns::command`]).
pub fn command_in(netns: &std::path::Path, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", netns.display()))
        .arg("--")
        .arg(program);
    cmd
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// The nodes' shared L2 segment: a bridge `br0` in a network namespace of its own, to which
/// node namespaces (and "outside" client namespaces) are attached by veths. Dropping it
/// deletes its namespace (and with it every veth end on the bridge) and the outside
/// namespaces it made.
#[derive(Debug)]
pub struct Fabric {
    netns: Netns,
    next_host: AtomicU8,
    outside: Mutex<Vec<Netns>>,
}

impl Fabric {
    /// Creates the fabric in namespace `netns` (a stale one of that name is replaced).
    pub fn create(netns: &str) -> Result<Fabric, NetError> {
        let netns = Netns::create(netns)?;
        netns.ip(&["link", "add", "br0", "type", "bridge"])?;
        netns.ip(&["link", "set", "br0", "up"])?;
        Ok(Fabric {
            netns,
            next_host: AtomicU8::new(1),
            outside: Mutex::new(Vec::new()),
        })
    }

    /// The fabric's own namespace.
    pub fn netns(&self) -> &str {
        self.netns.name()
    }

    /// Connects namespace `netns` to the bridge with the next free address
    /// (`192.168.100.<n>/24` on its `eth0`, up). Returns the address.
    pub fn attach(&self, netns: &str) -> Result<String, NetError> {
        let n = self.next_host.fetch_add(1, Ordering::Relaxed);
        if n == 0 || n > LAST_DYNAMIC_HOST {
            return Err(NetError::Full(self.netns().to_string()));
        }
        self.attach_as(netns, n, &format!("fab{n}"))
    }

    /// Connects namespace `netns` to the bridge as host `host` (`192.168.100.<host>/24` on its
    /// `eth0`); `peer` names the veth end on the bridge. Returns the address.
    pub fn attach_as(&self, netns: &str, host: u8, peer: &str) -> Result<String, NetError> {
        let addr = format!("{FABRIC_PREFIX}.{host}");
        ip(&[
            "link",
            "add",
            "eth0",
            "netns",
            netns,
            "type",
            "veth",
            "peer",
            "name",
            peer,
            "netns",
            self.netns(),
        ])?;
        self.netns
            .ip(&["link", "set", peer, "master", "br0", "up"])?;
        ip_in(
            netns,
            &["addr", "add", &format!("{addr}/24"), "dev", "eth0"],
        )?;
        ip_in(netns, &["link", "set", "eth0", "up"])?;
        Ok(addr)
    }

    /// A client namespace `name` outside the cluster on the same segment (to reach
    /// NodePorts, say), as host `host` or the next free one. Returns its address; the
    /// namespace is removed with the fabric.
    pub fn outside(&self, name: &str, host: Option<u8>) -> Result<String, NetError> {
        let ns = Netns::create(name)?;
        let addr = match host {
            Some(h) => self.attach_as(name, h, &format!("out{h}"))?,
            None => self.attach(name)?,
        };
        self.outside
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ns);
        Ok(addr)
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // Outside namespaces first; the fabric's own `Netns` field goes after this body.
        self.outside
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_ip_names_the_command() {
        let err = ip(&["link", "show", "dev", "skiff-no-such-link"]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("`ip link show dev skiff-no-such-link` failed: "),
            "{text}"
        );
    }

    fn exists(name: &str) -> bool {
        std::path::Path::new("/run/netns").join(name).exists()
    }

    /// Two namespaces on one fabric reach each other; dropping removes every namespace.
    #[test]
    fn fabric_connects_namespaces_and_drop_removes_them() {
        let tag = std::process::id();
        let (fab, a, out) = (
            format!("skiff-tn-fab-{tag}"),
            format!("skiff-tn-a-{tag}"),
            format!("skiff-tn-out-{tag}"),
        );
        {
            let fabric = Fabric::create(&fab).unwrap();
            let node = Netns::create(&a).unwrap();
            let node_ip = fabric.attach(node.name()).unwrap();
            assert_eq!(node_ip, format!("{FABRIC_PREFIX}.1"));
            let out_ip = fabric.outside(&out, Some(254)).unwrap();
            assert_eq!(out_ip, format!("{FABRIC_PREFIX}.254"));
            // One bounded ping inside the namespaces this test made (busybox: `cargo xtask
            // setup` installs it).
            let ping = Command::new("ip")
                .args([
                    "netns", "exec", &out, "busybox", "ping", "-c", "1", "-W", "2", &node_ip,
                ])
                .output()
                .unwrap();
            assert!(ping.status.success(), "{ping:?}");
            assert!(exists(&fab) && exists(&a) && exists(&out));
        }
        assert!(!exists(&fab) && !exists(&a) && !exists(&out));
    }
}
