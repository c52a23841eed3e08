//! PersistentVolumeClaims and PersistentVolumes (kube-controller-manager's
//! `persistentvolume-binder`) with Skiff's local-path provisioner built in (what k3s ships as
//! `local-path-provisioner`): keyed by claim; a volume's change wakes the claim it names.
//!
//! - A claim bound to a volume (`spec.volumeName`) gets status Bound, the volume Bound; a
//!   claim whose volume is gone is Lost.
//! - An unbound claim is bound to the smallest Available volume that fits (same class, every
//!   access mode it asks for, enough capacity, its selector; a volume pre-bound to the claim
//!   first): the volume's `claimRef` first, then the claim's `volumeName`, then both
//!   statuses, so a crash in between leaves a reservation the next reconcile completes.
//! - Otherwise, when the claim's class is provisioned by [`LOCAL_PATH`]: with
//!   WaitForFirstConsumer, once the node is known (the scheduler's
//!   `volume.kubernetes.io/selected-node` annotation, else the node of a pod using the claim),
//!   a volume `pvc-<claim uid>` is made: a `hostPath` directory `<nodePath>/pvc-<uid>_<ns>_<name>`
//!   (created by the node agent on first use), node affinity to that node, the class's
//!   reclaim policy, pre-bound to the claim. Immediate classes cannot be served by local
//!   paths (a Warning event says so), as with k3s' provisioner.
//! - A claim that is gone releases its volumes: Delete removes the volume, Retain marks it
//!   Released.
//!
//! At start the manager makes the default StorageClass `local-path` (under `--local-path-root`)
//! when no class exists, as k3s ships one. Not built: removing a deleted volume's directory
//! from its node, the pvc-protection finalizer, volume expansion.

use std::collections::BTreeMap;
use std::sync::Arc;

use skiff_api::Resource;
use skiff_api::api::{
    HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectMeta,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimStatus,
    PersistentVolumeSpec, PersistentVolumeStatus, Pod, StorageClass, VolumeNodeAffinity,
};
use skiff_api::selector::Selector;
use skiff_client::Client;
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, EventType, Informer, Informers, ObjectKey,
    Reconciler,
};

use crate::util::is_terminating;
use crate::{Context, Error};

/// The provisioner name of Skiff's local-path volumes.
pub const LOCAL_PATH: &str = "skiff.io/local-path";
/// The default StorageClass the manager makes when there is none.
pub const DEFAULT_CLASS: &str = "local-path";
/// The annotation that marks the default StorageClass.
pub const IS_DEFAULT_CLASS: &str = skiff_api::wellknown::DEFAULT_STORAGE_CLASS_ANNOTATION;
/// The scheduler's choice of node for a WaitForFirstConsumer claim.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Who made a volume.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Where local-path volumes live on the nodes unless the class says (`nodePath`).
pub const DEFAULT_NODE_PATH: &str = "/var/lib/skiff/local-path";

#[derive(Debug)]
pub struct VolumeController {
    client: Client,
    recorder: EventRecorder,
    claims: Informer<PersistentVolumeClaim>,
    volumes: Informer<PersistentVolume>,
    classes: Informer<StorageClass>,
    pods: Informer<Pod>,
}

fn quantity(map: &BTreeMap<String, String>) -> i64 {
    map.get("storage")
        .and_then(|q| skiff_api::quantity::parse_value(q).ok())
        .unwrap_or(0)
}

fn phase_of_volume(pv: &PersistentVolume) -> &str {
    pv.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("")
}

/// Whether `pv` can serve `claim` (class, access modes, capacity, selector), ignoring
/// whether it is taken.
pub fn fits(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let (Some(vs), Some(cs)) = (pv.spec.as_ref(), claim.spec.as_ref()) else {
        return false;
    };
    let class = claim.storage_class();
    let want = cs
        .resources
        .as_ref()
        .map(|r| quantity(&r.requests))
        .unwrap_or(0);
    let labels = pv
        .metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    pv.storage_class() == class
        && cs.access_modes.iter().all(|m| vs.access_modes.contains(m))
        && quantity(&vs.capacity) >= want
        && cs
            .selector
            .as_ref()
            .is_none_or(|s| Selector::from_label_selector(s).is_ok_and(|sel| sel.matches(&labels)))
}

/// Whether `pv`'s claimRef names `claim` (by uid when it has one).
fn reserved_for(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| {
            r.namespace == claim.namespace()
                && r.name == claim.name()
                && (r.uid.is_empty() || r.uid == uid(claim))
        })
}

fn uid<T: Resource>(o: &T) -> String {
    o.metadata().map(|m| m.uid.clone()).unwrap_or_default()
}

/// The volume to bind `claim` to: one reserved for it, else the smallest Available one that
/// fits.
pub fn choose<'a>(
    claim: &PersistentVolumeClaim,
    volumes: impl Iterator<Item = &'a PersistentVolume>,
) -> Option<&'a PersistentVolume> {
    let mut best: Option<&PersistentVolume> = None;
    for pv in volumes {
        if is_terminating(pv) || !fits(pv, claim) {
            continue;
        }
        if reserved_for(pv, claim) {
            return Some(pv);
        }
        let free = pv.spec.as_ref().is_some_and(|s| s.claim_ref.is_none())
            && matches!(phase_of_volume(pv), "Available" | "Pending" | "");
        let size =
            |v: &PersistentVolume| v.spec.as_ref().map(|s| quantity(&s.capacity)).unwrap_or(0);
        if free && best.is_none_or(|b| size(pv) < size(b)) {
            best = Some(pv);
        }
    }
    best
}

/// The local-path volume for `claim` on `node` of `class`.
pub fn local_volume(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
) -> PersistentVolume {
    let spec = claim.spec.clone().unwrap_or_default();
    let root = class
        .parameters
        .get("nodePath")
        .map(String::as_str)
        .unwrap_or(DEFAULT_NODE_PATH);
    let name = format!("pvc-{}", uid(claim));
    let dir = format!(
        "{}/{name}_{}_{}",
        root.trim_end_matches('/'),
        claim.namespace(),
        claim.name()
    );
    PersistentVolume {
        metadata: Some(ObjectMeta {
            name,
            annotations: BTreeMap::from([(PROVISIONED_BY.to_string(), LOCAL_PATH.to_string())]),
            ..Default::default()
        }),
        spec: Some(PersistentVolumeSpec {
            capacity: spec.resources.map(|r| r.requests).unwrap_or_default(),
            access_modes: spec.access_modes,
            claim_ref: Some(ObjectReference {
                kind: "PersistentVolumeClaim".into(),
                api_version: "v1".into(),
                namespace: claim.namespace().to_string(),
                name: claim.name().to_string(),
                uid: uid(claim),
                ..Default::default()
            }),
            persistent_volume_reclaim_policy: class
                .reclaim_policy
                .clone()
                .unwrap_or_else(|| "Delete".into()),
            storage_class_name: class.name().to_string(),
            host_path: Some(HostPathVolumeSource {
                path: dir,
                r#type: Some("DirectoryOrCreate".into()),
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: vec![node.to_string()],
                        }],
                        ..Default::default()
                    }],
                }),
            }),
            volume_mode: Some("Filesystem".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The default StorageClass `local-path` (WaitForFirstConsumer, Delete).
pub fn default_class(node_path: &str) -> StorageClass {
    StorageClass {
        metadata: Some(ObjectMeta {
            name: DEFAULT_CLASS.into(),
            annotations: BTreeMap::from([(IS_DEFAULT_CLASS.to_string(), "true".to_string())]),
            ..Default::default()
        }),
        provisioner: LOCAL_PATH.into(),
        parameters: BTreeMap::from([("nodePath".to_string(), node_path.to_string())]),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..Default::default()
    }
}

impl VolumeController {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        VolumeController {
            client: informers.client().clone(),
            recorder,
            claims: informers.get::<PersistentVolumeClaim>(),
            volumes: informers.get::<PersistentVolume>(),
            classes: informers.get::<StorageClass>(),
            pods: informers.get::<Pod>(),
        }
    }

    /// Claims, woken by the volumes that name them and the pods that use them.
    pub fn controller(informers: &Informers) -> Controller<PersistentVolumeClaim> {
        let volumes = informers.get::<PersistentVolume>();
        let pods = informers.get::<Pod>();
        Controller::<PersistentVolumeClaim>::new(informers)
            .named("persistentvolume-binder")
            .watches(&volumes, |pv: &PersistentVolume| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .map(|r| vec![ObjectKey::new(&r.namespace, &r.name)])
                    .unwrap_or_default()
            })
            .watches(&pods, |p: &Pod| {
                p.spec
                    .iter()
                    .flat_map(|s| s.volumes.iter())
                    .filter_map(|v| v.persistent_volume_claim.as_ref())
                    .map(|c| ObjectKey::new(p.namespace(), &c.claim_name))
                    .collect()
            })
    }

    /// Makes the default StorageClass when the cluster has no class, then runs until `stop`.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        node_path: String,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(VolumeController::new(informers, recorder));
        let classes = informers.get::<StorageClass>();
        tokio::select! {
            () = classes.wait_synced() => {}
            () = stop.cancelled() => return,
        }
        if classes.is_empty() {
            match reconciler
                .client
                .cluster::<StorageClass>()
                .create(&default_class(&node_path))
                .await
            {
                Ok(_) => tracing::info!(class = DEFAULT_CLASS, "made the default StorageClass"),
                Err(e) if e.is_already_exists() => {}
                Err(e) => tracing::warn!(error = %e, "making the default StorageClass"),
            }
        }
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    /// The claim is gone: its volumes are released (Delete: removed).
    async fn release(&self, key: &ObjectKey) -> Result<Action, Error> {
        for pv in self.volumes.list() {
            let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
                continue;
            };
            if r.namespace != key.namespace || r.name != key.name {
                continue;
            }
            // A claim of that name with another uid is a new claim, not this volume's.
            if let Some(c) = self.claims.get(key)
                && (r.uid.is_empty() || r.uid == uid(&*c))
            {
                continue;
            }
            let policy = pv
                .spec
                .as_ref()
                .map(|s| s.persistent_volume_reclaim_policy.as_str())
                .unwrap_or("");
            if policy == "Delete" {
                match self
                    .client
                    .cluster::<PersistentVolume>()
                    .delete(pv.name(), &Default::default())
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e).during(|| format!("deleting volume {}", pv.name())),
                }
            } else if phase_of_volume(&pv) != "Released" {
                self.set_volume_phase(&pv, "Released").await?;
            }
        }
        Ok(Action::Done)
    }

    async fn set_volume_phase(&self, pv: &PersistentVolume, phase: &str) -> Result<(), Error> {
        let mut updated = pv.clone();
        let st = updated
            .status
            .get_or_insert_with(PersistentVolumeStatus::default);
        st.phase = phase.into();
        st.last_phase_transition_time = Some(crate::util::format_time(chrono::Utc::now()));
        self.client
            .cluster::<PersistentVolume>()
            .update_status(&updated)
            .await
            .map(|_| ())
            .during(|| format!("updating the status of volume {}", pv.name()))
    }

    /// The node whose pod waits for `claim`.
    fn consumer_node(&self, claim: &PersistentVolumeClaim) -> Option<String> {
        if let Some(n) = claim
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.get(SELECTED_NODE))
            .filter(|n| !n.is_empty())
        {
            return Some(n.clone());
        }
        self.pods
            .by_namespace(claim.namespace())
            .into_iter()
            .filter(|p| !is_terminating(&**p))
            .filter(|p| {
                p.spec.iter().flat_map(|s| s.volumes.iter()).any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == claim.name())
                })
            })
            .find_map(|p| p.spec.as_ref().map(|s| s.node_name.clone()))
            .filter(|n| !n.is_empty())
    }
}

impl Reconciler for VolumeController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(claim) = self.claims.get(key) else {
            return self.release(key).await;
        };
        if is_terminating(&*claim) {
            return Ok(Action::Done);
        }
        let api = self
            .client
            .namespaced::<PersistentVolumeClaim>(&key.namespace);
        let spec = claim.spec.clone().unwrap_or_default();
        if !spec.volume_name.is_empty() {
            // Bound (or being bound): statuses follow.
            let Some(pv) = self.volumes.get(&ObjectKey::cluster(&spec.volume_name)) else {
                if claim.status.as_ref().map(|s| s.phase.as_str()) == Some("Bound") {
                    let mut lost = (*claim).clone();
                    lost.status.get_or_insert_with(Default::default).phase = "Lost".into();
                    api.update_status(&lost)
                        .await
                        .during(|| format!("updating the status of claim {key}"))?;
                    self.recorder
                        .publish(
                            &*claim,
                            EventType::Warning,
                            "ClaimLost",
                            "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
                        )
                        .await;
                }
                return Ok(Action::Done);
            };
            if !reserved_for(&pv, &claim) {
                return Ok(Action::Done);
            }
            if phase_of_volume(&pv) != "Bound" {
                self.set_volume_phase(&pv, "Bound").await?;
            }
            let vs = pv.spec.clone().unwrap_or_default();
            let want = PersistentVolumeClaimStatus {
                phase: "Bound".into(),
                access_modes: vs.access_modes.clone(),
                capacity: vs.capacity.clone(),
                conditions: claim
                    .status
                    .as_ref()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default(),
            };
            if claim.status.as_ref() != Some(&want) {
                let mut bound = (*claim).clone();
                bound.status = Some(want);
                api.update_status(&bound)
                    .await
                    .during(|| format!("updating the status of claim {key}"))?;
            }
            return Ok(Action::Done);
        }
        let volumes = self.volumes.list();
        if let Some(pv) = choose(&claim, volumes.iter().map(|v| &**v)) {
            // The volume first: a reservation the claim's update then completes.
            if !reserved_for(pv, &claim) {
                let mut reserved = pv.clone();
                reserved.spec.get_or_insert_with(Default::default).claim_ref =
                    Some(ObjectReference {
                        kind: "PersistentVolumeClaim".into(),
                        api_version: "v1".into(),
                        namespace: claim.namespace().to_string(),
                        name: claim.name().to_string(),
                        uid: uid(&*claim),
                        resource_version: claim
                            .metadata
                            .as_ref()
                            .map(|m| m.resource_version.clone())
                            .unwrap_or_default(),
                        ..Default::default()
                    });
                self.client
                    .cluster::<PersistentVolume>()
                    .update(&reserved)
                    .await
                    .during(|| format!("reserving volume {} for claim {key}", pv.name()))?;
            }
            let mut bound = (*claim).clone();
            bound.spec.get_or_insert_with(Default::default).volume_name = pv.name().to_string();
            bound
                .metadata
                .get_or_insert_with(Default::default)
                .annotations
                .insert("pv.kubernetes.io/bind-completed".into(), "yes".into());
            api.update(&bound)
                .await
                .during(|| format!("binding claim {key} to volume {}", pv.name()))?;
            return Ok(Action::Done);
        }
        // Nothing fits: provision, if the class is ours.
        let class_name = claim.storage_class().to_string();
        let Some(class) = self.classes.get(&ObjectKey::cluster(&class_name)) else {
            return Ok(Action::Done);
        };
        if class.provisioner != LOCAL_PATH {
            return Ok(Action::Done);
        }
        if class.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") {
            self.recorder
                .publish(
                    &*claim,
                    EventType::Warning,
                    "ProvisioningFailed",
                    &format!(
                        "storageclass {class_name:?}: {LOCAL_PATH} only serves \
                         volumeBindingMode WaitForFirstConsumer (a local directory needs \
                         the node of the pod)"
                    ),
                )
                .await;
            return Ok(Action::Done);
        }
        let Some(node) = self.consumer_node(&claim) else {
            return Ok(Action::Done);
        };
        let pv = local_volume(&claim, &class, &node);
        match self.client.cluster::<PersistentVolume>().create(&pv).await {
            Ok(_) => {
                self.recorder
                    .publish(
                        &*claim,
                        EventType::Normal,
                        "ProvisioningSucceeded",
                        &format!(
                            "Successfully provisioned volume {} on node {node}",
                            pv.name()
                        ),
                    )
                    .await;
                Ok(Action::Done)
            }
            Err(e) if e.is_already_exists() => Ok(Action::Done),
            Err(e) => Err(e).during(|| format!("provisioning a volume for claim {key}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{PersistentVolumeClaimSpec, VolumeResourceRequirements};

    fn claim(size: &str, class: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: Some(ObjectMeta {
                name: "data-db-0".into(),
                namespace: "default".into(),
                uid: "u1".into(),
                ..Default::default()
            }),
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: vec!["ReadWriteOnce".into()],
                resources: Some(VolumeResourceRequirements {
                    requests: BTreeMap::from([("storage".into(), size.into())]),
                    ..Default::default()
                }),
                storage_class_name: Some(class.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn volume(name: &str, size: &str, class: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: Some(ObjectMeta {
                name: name.into(),
                ..Default::default()
            }),
            spec: Some(PersistentVolumeSpec {
                capacity: BTreeMap::from([("storage".into(), size.into())]),
                access_modes: vec!["ReadWriteOnce".into(), "ReadOnlyMany".into()],
                storage_class_name: class.into(),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: "Available".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_smallest_fitting_volume_is_chosen_reservations_first() {
        let c = claim("1Gi", "manual");
        let vols = [
            volume("big", "10Gi", "manual"),
            volume("small", "2Gi", "manual"),
            volume("tiny", "512Mi", "manual"),
            volume("other-class", "1Gi", "fast"),
        ];
        assert_eq!(choose(&c, vols.iter()).map(|v| v.name()), Some("small"));
        let mut reserved = volume("reserved", "10Gi", "manual");
        reserved.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: "default".into(),
            name: "data-db-0".into(),
            uid: "u1".into(),
            ..Default::default()
        });
        let with = [vols[0].clone(), reserved];
        assert_eq!(choose(&c, with.iter()).map(|v| v.name()), Some("reserved"));
        // Taken by another claim: not a candidate.
        let mut taken = volume("taken", "2Gi", "manual");
        taken.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: "default".into(),
            name: "other".into(),
            ..Default::default()
        });
        assert!(choose(&c, [taken].iter()).is_none());
        // An access mode the volume lacks.
        let mut rwx = claim("1Gi", "manual");
        rwx.spec.as_mut().unwrap().access_modes = vec!["ReadWriteMany".into()];
        assert!(choose(&rwx, vols.iter()).is_none());
    }

    #[test]
    fn local_volumes_are_pinned_to_the_node_and_reserved() {
        let class = default_class("/srv/lp/");
        let pv = local_volume(&claim("1Gi", "local-path"), &class, "node-1");
        assert_eq!(pv.name(), "pvc-u1");
        let spec = pv.spec.unwrap();
        assert_eq!(
            spec.host_path.unwrap().path,
            "/srv/lp/pvc-u1_default_data-db-0"
        );
        assert_eq!(spec.persistent_volume_reclaim_policy, "Delete");
        assert_eq!(spec.claim_ref.unwrap().uid, "u1");
        let term = &spec
            .node_affinity
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms[0];
        assert_eq!(term.match_fields[0].values, ["node-1"]);
        assert_eq!(spec.capacity["storage"], "1Gi");
    }
}
