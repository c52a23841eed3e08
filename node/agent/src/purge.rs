//! Removing everything a node ran: every pod sandbox (processes, cgroups, namespaces) through
//! the runtime's own teardown, the shims, the node's cgroup parent, its pinned BPF maps and
//! its state directory. Used when a local cluster (`cargo xtask up`) stops, so nothing is left
//! on the machine; a node agent never does this on its own.
//!
//! The pins are the load balancer's, NetworkPolicy enforcement's, device confinement's and
//! accounting's (a kernel test checks that none is left); memory volumes and image root
//! filesystems are unmounted before the state directory goes.

use std::path::PathBuf;
use std::time::Duration;

use tracing::{info, warn};

use skiff_runtime::{NativeConfig, NativeRuntime, Runtime, remove_cgroup_tree};

#[derive(Debug, thiserror::Error)]
pub enum PurgeError {
    #[error("runtime: {0}")]
    Runtime(#[from] skiff_runtime::RuntimeError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What to purge; the same paths the agent ran with.
#[derive(Debug)]
pub struct PurgeConfig {
    pub node_name: String,
    pub state_dir: PathBuf,
    pub cgroup_parent: PathBuf,
    pub shim_path: PathBuf,
    pub grace: Duration,
}

/// Stops and removes every pod of the node, then the node's cgroups, pins and state.
/// Must run inside a Tokio runtime.
pub async fn purge(cfg: &PurgeConfig) -> Result<(), PurgeError> {
    if cfg.state_dir.join("runtime").exists() {
        let runtime = NativeRuntime::new(NativeConfig::new(
            cfg.state_dir.join("runtime"),
            cfg.cgroup_parent.clone(),
            cfg.shim_path.clone(),
        ))?;
        for sb in runtime.list_sandboxes().await? {
            info!(pod = %format!("{}/{}", sb.namespace, sb.name), "removing pod");
            if let Err(e) = runtime.remove_sandbox(&sb, cfg.grace).await {
                warn!(pod = %sb.name, error = %e, "removing pod");
            }
        }
    }
    // Whatever is still in the node's cgroups (shims finishing up) goes now.
    let kill = cfg.cgroup_parent.join("cgroup.kill");
    if kill.exists() {
        let _ = std::fs::write(&kill, "1");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match remove_cgroup_tree(&cfg.cgroup_parent) {
            Ok(()) => break,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    // The default parent `<v2 root>/skiff` is shared by the nodes of a machine: it goes with
    // the last of them (rmdir fails while other nodes' cgroups are in it).
    if let Some(parent) = cfg.cgroup_parent.parent()
        && parent.file_name().is_some_and(|n| n == "skiff")
    {
        let _ = std::fs::remove_dir(parent);
    }
    let pins = skiff_datapath::node_pin_dir(&cfg.node_name);
    if pins.exists() {
        // The Service LB's link pins (cgroup hooks and NodePort tc links) go first: that
        // detaches its programs.
        if let Err(e) = skiff_datapath::lb::ServiceLb::remove_pins(&pins) {
            warn!(error = %e, "removing the Service load balancer's pinned links and maps");
        }
        if let Err(e) = skiff_datapath::policy::PolicyEnforcer::remove_pins(&pins) {
            warn!(error = %e, "removing NetworkPolicy enforcement's pinned links and maps");
        }
        // The pods' device links (`devices/<pod uid>`); their cgroups are gone by now.
        if let Err(e) = skiff_datapath::devices::DeviceFilter::remove_pins(&pins) {
            warn!(error = %e, "removing the pods' pinned device links");
        }
        if let Err(e) = skiff_datapath::Accounting::remove_pins(&pins) {
            warn!(error = %e, "removing pinned maps");
        }
        // The shared parent goes when the last node's pins are gone.
        if let Some(parent) = pins.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
    // Container root filesystems are overlay mounts under the state directory: unmounted
    // first, so removing the directory never reaches through a mount.
    crate::images::release_under(&crate::images::rootfs_root(&cfg.state_dir));
    // Memory volumes are tmpfs mounts there too.
    crate::images::release_under(&crate::volumes::volumes_root(&cfg.state_dir));
    if cfg.state_dir.exists() {
        std::fs::remove_dir_all(&cfg.state_dir).map_err(|source| PurgeError::Io {
            what: "removing state directory",
            path: cfg.state_dir.clone(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real pins of all four objects (accounting, load balancer, policy, a pod's device
    /// link): purge leaves nothing under the node's pin directory (needs root, as the agent's
    /// kernel tests).
    #[tokio::test]
    async fn purge_removes_every_pin_of_the_node() {
        let node = format!("purge-test-{}", std::process::id());
        let pins = skiff_datapath::node_pin_dir(&node);
        // Whatever happens, the pins this test made go.
        struct Cleanup(PathBuf, PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let devices = skiff_datapath::devices::pin_dir(&self.0);
                for dir in [&devices, &self.0] {
                    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                        let _ = std::fs::remove_file(e.path());
                    }
                    let _ = std::fs::remove_dir(dir);
                }
                let _ = std::fs::remove_dir(&self.1);
            }
        }
        let pod_cgroup = skiff_runtime::host::cgroup2_mount()
            .expect("cgroup v2")
            .join(format!("skiff-{node}-pod"));
        std::fs::create_dir(&pod_cgroup).expect("pod cgroup");
        let _cleanup = Cleanup(pins.clone(), pod_cgroup.clone());
        let acc = skiff_datapath::Accounting::load(&pins).expect("accounting");
        let lb = skiff_datapath::lb::ServiceLb::load(&pins, Default::default()).expect("lb");
        let pol = skiff_datapath::policy::PolicyEnforcer::load(&pins, Default::default())
            .expect("policy");
        let mut devices =
            skiff_datapath::devices::DeviceFilter::load(&pins).expect("device filter");
        {
            use skiff_datapath::devices::DeviceConfinement as _;
            devices.confine("pod-1", &pod_cgroup).expect("confine");
        }
        drop((acc, lb, pol, devices));
        std::fs::remove_dir(&pod_cgroup).expect("remove the pod cgroup");
        assert!(std::fs::read_dir(&pins).expect("pins").next().is_some());
        let state = tempfile::tempdir().expect("tempdir");
        let cgroup_parent = skiff_runtime::host::cgroup2_mount()
            .expect("cgroup v2")
            .join(format!("skiff-{node}-absent"));
        purge(&PurgeConfig {
            node_name: node.clone(),
            state_dir: state.path().join("state"),
            cgroup_parent,
            shim_path: PathBuf::from("/nonexistent"),
            grace: Duration::from_secs(1),
        })
        .await
        .expect("purge");
        let left: Vec<_> = std::fs::read_dir(&pins)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left behind: {left:?}");
        assert!(!pins.exists());
    }
}
