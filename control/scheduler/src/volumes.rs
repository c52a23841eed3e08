//! Volume binding (kube-scheduler's `VolumeBinding` plugin, the parts Skiff's volumes need):
//! a pod whose PersistentVolumeClaims are bound goes only to nodes its volumes' node affinity
//! allows (a local-path volume lives on one node); a claim not bound yet is fine when its
//! StorageClass waits for the first consumer (the provisioner follows the pod), and is
//! marked with the chosen node (`volume.kubernetes.io/selected-node`) before the pod is
//! bound; a missing claim or an unbound claim of an Immediate class makes the pod wait.
//! Claims, volumes and classes come from shared informers; their changes retry parked pods.

use skiff_api::Resource;
use skiff_api::api::{PersistentVolume, PersistentVolumeClaim, Pod, StorageClass};
use skiff_client::Client;
use skiff_client::controller::{Informer, Informers, ObjectKey};

use crate::cache::{NodeInfo, Snapshot};
use crate::framework::{FilterPlugin, PodContext, Unfit};

/// The annotation naming the node chosen for a claim that waits for its first consumer.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The plugin and the informers it reads.
#[derive(Debug, Clone)]
pub struct VolumeBinding {
    claims: Informer<PersistentVolumeClaim>,
    volumes: Informer<PersistentVolume>,
    classes: Informer<StorageClass>,
}

/// What a pod's claims need.
#[derive(Debug, Default, PartialEq, Eq)]
struct ClaimState {
    /// Volumes the pod's bound claims use.
    bound: Vec<String>,
    /// Claims waiting for their first consumer (to be marked with the node).
    waiting: Vec<String>,
}

impl VolumeBinding {
    pub fn new(informers: &Informers) -> Self {
        VolumeBinding {
            claims: informers.get::<PersistentVolumeClaim>(),
            volumes: informers.get::<PersistentVolume>(),
            classes: informers.get::<StorageClass>(),
        }
    }

    /// Waits until the three informers have listed.
    pub async fn wait_synced(&self) {
        self.claims.wait_synced().await;
        self.volumes.wait_synced().await;
        self.classes.wait_synced().await;
    }

    /// A future that ends at the next change of a claim, volume or class.
    pub fn changes(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        use futures::StreamExt as _;
        futures::stream::select(
            futures::stream::select(
                self.claims.subscribe().into_stream().map(|_| ()),
                self.volumes.subscribe().into_stream().map(|_| ()),
            ),
            self.classes.subscribe().into_stream().map(|_| ()),
        )
    }

    fn state(&self, pod: &Pod) -> Result<ClaimState, String> {
        let mut st = ClaimState::default();
        for name in pod.claim_names() {
            let Some(claim) = self.claims.get(&ObjectKey::new(pod.namespace(), &name)) else {
                return Err(format!("persistentvolumeclaim \"{name}\" not found"));
            };
            if claim
                .metadata
                .as_ref()
                .is_some_and(|m| !m.deletion_timestamp.is_empty())
            {
                return Err(format!("persistentvolumeclaim \"{name}\" is being deleted"));
            }
            let spec = claim.spec.clone().unwrap_or_default();
            if !spec.volume_name.is_empty() {
                st.bound.push(spec.volume_name);
                continue;
            }
            let class = claim.storage_class().to_string();
            let waits = self
                .classes
                .get(&ObjectKey::cluster(&class))
                .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
            if !waits {
                return Err("pod has unbound immediate PersistentVolumeClaims".into());
            }
            st.waiting.push(name);
        }
        Ok(st)
    }

    /// Before the pod is bound to `node`: its claims waiting for a first consumer are marked
    /// with the node, so the provisioner makes their volumes there.
    pub async fn pre_bind(&self, client: &Client, pod: &Pod, node: &str) -> Result<(), String> {
        let Ok(st) = self.state(pod) else {
            return Ok(());
        };
        let api = client.namespaced::<PersistentVolumeClaim>(pod.namespace());
        for name in st.waiting {
            for _ in 0..5 {
                let mut claim = api
                    .get(&name)
                    .await
                    .map_err(|e| format!("reading persistentvolumeclaim {name:?}: {e}"))?;
                let meta = claim.metadata.get_or_insert_with(Default::default);
                if meta.annotations.get(SELECTED_NODE).map(String::as_str) == Some(node)
                    || claim
                        .spec
                        .as_ref()
                        .is_some_and(|s| !s.volume_name.is_empty())
                {
                    break;
                }
                meta.annotations
                    .insert(SELECTED_NODE.to_string(), node.to_string());
                match api.update(&claim).await {
                    Ok(_) => break,
                    Err(e) if e.is_conflict() => continue,
                    Err(e) => {
                        return Err(format!("marking persistentvolumeclaim {name:?}: {e}"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The filter's state for one attempt: the bound volumes' node affinities.
#[derive(Debug, Clone, Default)]
pub struct VolumeState {
    affinities: Vec<skiff_api::api::NodeSelector>,
}

impl FilterPlugin for VolumeBinding {
    fn name(&self) -> &'static str {
        "VolumeBinding"
    }

    fn pre_filter(&self, cx: &mut PodContext, _snapshot: &Snapshot) -> Result<(), String> {
        let st = self.state(cx.pod())?;
        let mut affinities = Vec::new();
        for v in st.bound {
            let Some(pv) = self.volumes.get(&ObjectKey::cluster(&v)) else {
                return Err(format!("persistentvolume \"{v}\" not found"));
            };
            if let Some(sel) = pv
                .spec
                .as_ref()
                .and_then(|s| s.node_affinity.as_ref())
                .and_then(|a| a.required.clone())
            {
                affinities.push(sel);
            }
        }
        cx.volumes = VolumeState { affinities };
        Ok(())
    }

    fn filter(&self, cx: &PodContext, node: &NodeInfo) -> Result<(), Unfit> {
        let Some(n) = node.node.as_ref() else {
            return Ok(());
        };
        let labels = n
            .metadata
            .as_ref()
            .map(|m| m.labels.clone())
            .unwrap_or_default();
        let fits = cx
            .volumes
            .affinities
            .iter()
            .all(|sel| skiff_api::nodeaffinity::node_selector_matches(sel, n.name(), &labels));
        if fits {
            Ok(())
        } else {
            Err(Unfit::new("node(s) had volume node affinity conflict"))
        }
    }
}
