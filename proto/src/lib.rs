//! Skiff's cluster API.
//!
//! - [`api`]: the resource types (Kubernetes core/v1, apps/v1, coordination/v1 shaped),
//!   generated from `proto/skiff/*.proto` by prost, with serde derives so the same types read
//!   and write Kubernetes-style JSON and YAML.
//! - [`rpc`]: the generic gRPC service of the API server (client and server stubs).
//! - [`Resource`] and [`kinds`]: what the API server and clients need to handle any resource
//!   type generically.
//! - [`manifest`]: strict decoding of YAML/JSON manifests, with the path of a bad field.
//! - [`selector`]: label and field selectors.
//! - [`quantity`]: Kubernetes resource quantities (`500m`, `64Mi`) as integers.
//! - [`FOREGROUND_FINALIZER`], [`ORPHAN_FINALIZER`]: the finalizers of a delete's propagation
//!   policy, shared by the API server (which adds them) and the garbage collector (which acts
//!   on them and removes them).
//! - [`schema`]: every message's fields as JSON sees them, generated from the `.proto` files,
//!   and Kubernetes' patch strategies; [`strategic`]: strategic merge patch on top of it.
//! - [`columns`]: the table columns kubectl shows per kind (the API server's Tables and
//!   `skiff get`), and kubectl-style ages.
//! - [`lb_pool`]: LoadBalancer address pools: blocks, which Services a pool serves, the
//!   addresses a Service asks for (the API server's validation and the lbipam controller).
//! - [`taints`]: taint/toleration matching (shared by the scheduler and the node lifecycle
//!   controller).
//!
//! - [`names`]: Kubernetes' rules and messages for names, label keys and values (the API
//!   server's validation uses them too); [`nodeaffinity`]: the one node selector matcher (the
//!   scheduler and the DaemonSet controller); `schedule` (feature `schedule`): CronJob
//!   schedules, parsed the same way by the API server and the CronJob controller.
//! - [`k8s_wire`]: Kubernetes' protobuf encoding (what kubectl's typed commands send) read into
//!   the JSON the REST API decodes, and JSON written in Kubernetes' field order, through a
//!   table generated from Kubernetes' `.proto` files (`proto/k8s/`) by `cargo xtask codegen`
//!   (regenerate it, never edit it).
//!
//! One Rust type is both the wire format and the manifest format: `build.rs` derives serde on
//! the resource messages (camelCase, `deny_unknown_fields`, Kubernetes spellings such as
//! `podCIDR`; IntOrString and Quantity helpers in `serde_util`).
//!
//! This crate does no I/O, knows nothing about storage, and holds no per-kind copy of generic
//! logic.

pub mod api {
    #![allow(clippy::all)]
    tonic::include_proto!("skiff.api");
}

pub mod rpc {
    #![allow(clippy::all)]
    tonic::include_proto!("skiff.rpc");
}

pub mod columns;
mod ephemeral;
pub mod k8s_wire;
pub mod lb_pool;
pub mod manifest;
pub mod names;
pub mod nodeaffinity;
pub mod quantity;
mod resource;
#[cfg(feature = "schedule")]
pub mod schedule;
pub mod schema;
pub mod selector;
pub mod serde_util;
pub mod strategic;
pub mod taints;
pub mod wellknown;

pub use resource::{
    DynKind, Encoded, KindInfo, KindOf, Resource, find_kind, intern_kind, is_typed, json_kind,
    kinds,
};

/// The finalizer a delete with propagation policy Foreground adds: the object stays (with its
/// `deletionTimestamp`) until the garbage collector has deleted every dependent that has
/// `blockOwnerDeletion` and removed the finalizer.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// The finalizer a delete with propagation policy Orphan adds: the garbage collector removes
/// the ownerReferences to the object from its dependents, then the finalizer.
pub const ORPHAN_FINALIZER: &str = "orphan";

impl api::Pod {
    /// Whether the pod's `Ready` condition is `True`: what Endpoints, ReplicaSets' ready
    /// counts and `kubectl wait --for=condition=Ready` go by.
    pub fn is_ready(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.r#type == "Ready" && c.status == "True")
        })
    }

    /// The PersistentVolumeClaims the pod's `persistentVolumeClaim` volumes name.
    pub fn claim_names(&self) -> Vec<String> {
        self.spec
            .iter()
            .flat_map(|s| s.volumes.iter())
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone())
            .collect()
    }
}

/// The StorageClass the beta annotation names, which Kubernetes reads before the field.
fn beta_storage_class(meta: Option<&api::ObjectMeta>) -> Option<&str> {
    meta.and_then(|m| m.annotations.get(wellknown::BETA_STORAGE_CLASS_ANNOTATION))
        .map(String::as_str)
}

impl api::PersistentVolumeClaim {
    /// The claim's StorageClass as Kubernetes reads it (`GetPersistentVolumeClaimClass`): the
    /// beta annotation when present, else `spec.storageClassName`, else "" (no class).
    pub fn storage_class(&self) -> &str {
        beta_storage_class(self.metadata.as_ref()).unwrap_or_else(|| {
            self.spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
                .unwrap_or("")
        })
    }
}

impl api::PersistentVolume {
    /// The volume's StorageClass as Kubernetes reads it (`GetPersistentVolumeClass`): the beta
    /// annotation when present, else `spec.storageClassName`.
    pub fn storage_class(&self) -> &str {
        beta_storage_class(self.metadata.as_ref()).unwrap_or_else(|| {
            self.spec
                .as_ref()
                .map(|s| s.storage_class_name.as_str())
                .unwrap_or("")
        })
    }
}

impl api::StorageClass {
    /// Whether the class is annotated as the cluster's default.
    pub fn is_default(&self) -> bool {
        self.metadata
            .as_ref()
            .is_some_and(|m| wellknown::is_default_storage_class(&m.annotations))
    }
}
