//! A pod's place in the node's data path: its network attachment, the eBPF fast path and
//! NodePort program, its device confinement and its traffic counters. The pod workers go
//! through [`PodDatapath`]; failures of the optional parts are logged (the pod still runs
//! through the node's stack), while a device confinement that cannot be applied keeps the
//! pod's containers from starting.

use std::path::Path;
use std::sync::{Arc, Mutex};

use skiff_datapath::Accounting;
use skiff_datapath::devices::DeviceConfinement;
use skiff_datapath::lb::TcAttach;
use skiff_hostnet::PodNetwork;
use tracing::{debug, info, warn};

use crate::proxy;

/// The data-path layers a pod worker touches.
pub(crate) struct PodDatapath {
    pub net: Arc<dyn PodNetwork>,
    /// The Service load balancer (whose object holds the fast path), or why it is not running.
    pub proxy: Result<Arc<proxy::Proxy>, String>,
    /// Device confinement of unprivileged pods, or why it is unavailable (such pods then do
    /// not start).
    pub devices: Result<Arc<Mutex<dyn DeviceConfinement>>, String>,
    pub accounting: Option<Arc<Mutex<Accounting>>>,
}

impl PodDatapath {
    fn netns(&self) -> Option<std::path::PathBuf> {
        self.net.netns_path().map(Path::to_path_buf)
    }

    /// Connects a pod whose network was just set up (`att`) to the eBPF data path
    /// ([`proxy::Proxy::attach_pod`]: the tc program on its host veth, NodePort replies and
    /// the fast path, and its endpoint entry). Failures are logged: the pod still runs,
    /// through the node's stack.
    pub async fn attach_pod(&self, uid: &str, att: &skiff_hostnet::PodAttachment) {
        let Ok(p) = &self.proxy else { return };
        let (p, netns, uid_owned, att_owned) =
            (p.clone(), self.netns(), uid.to_string(), att.clone());
        let attached = tokio::task::spawn_blocking(move || {
            p.attach_pod(netns.as_deref(), &uid_owned, &att_owned)
        })
        .await;
        match attached {
            Ok(Ok(how)) => debug!(device = %att.host_veth, ?how, "pod data path attached"),
            Ok(Err(e)) => warn!(device = %att.host_veth, error = %e, "attaching the pod data path"),
            Err(e) => warn!(device = %att.host_veth, error = %e, "attaching the pod data path"),
        }
    }

    /// Disconnects pod `uid` from the eBPF data path ([`proxy::Proxy::detach_pod`]); called
    /// before its network is torn down.
    pub fn detach_pod(&self, uid: &str) {
        if let Ok(p) = &self.proxy
            && let Err(e) = p.detach_pod(uid, self.net.pod_ip(uid))
        {
            warn!(pod_uid = %uid, error = %e, "detaching the pod data path");
        }
    }

    /// Attaches the NodePort tc program to device `ifname` of the node namespace (the
    /// uplink). Failures are logged: pods still run, only NodePort through it fails.
    pub async fn attach_nodeport(&self, ifname: &str) -> Option<TcAttach> {
        let Ok(p) = &self.proxy else { return None };
        let (p, netns, name) = (p.clone(), self.netns(), ifname.to_string());
        let attached =
            tokio::task::spawn_blocking(move || p.attach_tc(netns.as_deref(), &name)).await;
        match attached {
            Ok(Ok(how)) => {
                debug!(device = %ifname, ?how, "NodePort program attached");
                return Some(how);
            }
            Ok(Err(e)) => warn!(device = %ifname, error = %e, "attaching the NodePort program"),
            Err(e) => warn!(device = %ifname, error = %e, "attaching the NodePort program"),
        }
        None
    }

    /// The fast path's endpoint entries of an earlier agent: those of pods that are gone are
    /// removed; the running pods' workers rewrite theirs as they adopt them.
    pub async fn reconcile_pod_endpoints(&self) {
        let Ok(p) = &self.proxy else { return };
        let allocations = self.net.allocations().into_iter().collect();
        let (p, netns) = (p.clone(), self.netns());
        match tokio::task::spawn_blocking(move || {
            p.reconcile_pod_endpoints(netns.as_deref(), &allocations)
        })
        .await
        {
            Ok(Ok(removed)) => info!(removed, "pod fast path endpoints reconciled"),
            Ok(Err(e)) => warn!(error = %e, "reconciling the pod fast path endpoints"),
            Err(e) => warn!(error = %e, "reconciling the pod fast path endpoints"),
        }
    }

    /// Confines pod `uid`, whose cgroup is `cgroup_dir`, to the default device allow list,
    /// unless it is `privileged` (a privileged container gets every device, as with runc).
    /// Called once the pod cgroup exists and before any container of the pod starts; an
    /// error means its containers must not start.
    pub async fn confine_devices(
        &self,
        uid: &str,
        cgroup_dir: &Path,
        privileged: bool,
    ) -> Result<(), String> {
        if privileged {
            return Ok(());
        }
        let devices = self
            .devices
            .as_ref()
            .map_err(|why| format!("device confinement is unavailable: {why}"))?
            .clone();
        let (uid_owned, dir) = (uid.to_string(), cgroup_dir.to_path_buf());
        let confined = tokio::task::spawn_blocking(move || {
            let mut d = devices.lock().unwrap_or_else(|e| e.into_inner());
            d.confine(&uid_owned, &dir).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match confined {
            Ok(how) => {
                debug!(pod_uid = %uid, ?how, "pod confined to the default devices");
                Ok(())
            }
            Err(e) => Err(format!("confining the pod's device access: {e}")),
        }
    }

    /// Releases pod `uid`'s device confinement (its cgroup is gone). Failures are logged.
    pub fn release_devices(&self, uid: &str) {
        if let Ok(d) = &self.devices
            && let Err(e) = d.lock().unwrap_or_else(|e| e.into_inner()).release(uid)
        {
            warn!(pod_uid = %uid, error = %e, "releasing the pod's device confinement");
        }
    }

    /// Drops the traffic counters of cgroups that no longer exist.
    pub fn forget_counters(&self, ids: &[u64]) {
        if let Some(acc) = &self.accounting {
            let mut acc = acc.lock().unwrap_or_else(|e| e.into_inner());
            for id in ids {
                if let Err(e) = acc.forget(*id) {
                    warn!(cgroup_id = id, error = %e, "forgetting traffic counters");
                }
            }
        }
    }
}
