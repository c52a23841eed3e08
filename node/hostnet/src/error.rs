//! The error type of pod networking.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while setting up or tearing down pod networking. Each variant
/// names the object and the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A failure made up by `fake::FakeNetwork` (tests).
    #[cfg(any(test, feature = "fake"))]
    #[error("{0}")]
    Fake(String),

    /// The configured pod CIDR cannot be used.
    #[error("invalid pod CIDR {cidr:?}: {reason}")]
    PodCidrInvalid { cidr: String, reason: String },

    /// Every usable address of the pod CIDR is allocated.
    #[error("pod CIDR {cidr} has no free address left")]
    Exhausted { cidr: String },

    /// A pod uid that cannot be used as an IPAM owner or to derive interface names.
    #[error("invalid pod uid {uid:?}: {reason}")]
    PodUidInvalid { uid: String, reason: &'static str },

    /// [`super::NodeNetwork::new`] was not called on a tokio runtime.
    #[error("NodeNetwork must be created on a tokio runtime")]
    NoRuntime,

    /// A netlink request failed; `op` says which one and on what.
    #[error("netlink: {op}: {source}")]
    Netlink {
        op: String,
        #[source]
        source: rtnetlink::Error,
    },

    /// Entering (or opening) a network namespace failed, or its worker thread died.
    #[error("network namespace {}: {source}", path.display())]
    Netns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// Writing a per-namespace sysctl under /proc/sys/net failed.
    #[error("sysctl {} in {netns}: {source}", path.display())]
    Sysctl {
        path: PathBuf,
        netns: String,
        #[source]
        source: io::Error,
    },

    /// Reading or writing the on-disk IPAM state failed.
    #[error("IPAM state {}: {source}", path.display())]
    IpamState {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The host-side interface name derived from this pod's uid is held by another pod
    /// (a hash collision of the 32-bit name suffix).
    #[error("host interface {name} belongs to pod {owner}, not to pod {pod_uid}")]
    HostVethCollision {
        name: String,
        owner: String,
        pod_uid: String,
    },

    /// The pod's network namespace already holds an interface with the name Skiff wants to
    /// create there, and it is not the peer of this pod's host veth.
    #[error("{} already has an interface {name} that is not pod {pod_uid}'s veth", netns.display())]
    PodInterfaceConflict {
        netns: PathBuf,
        name: String,
        pod_uid: String,
    },

    /// An interface that was just created (or found) could not be read back.
    #[error("interface {name} not found in {netns} after {after}")]
    LinkMissing {
        name: String,
        netns: String,
        after: &'static str,
    },
}
