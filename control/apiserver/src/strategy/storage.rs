//! PersistentVolumes and PersistentVolumeClaims (v1) and StorageClasses (storage.k8s.io/v1):
//! kube-apiserver 1.32's defaults, its validation with the same field paths and messages
//! (`ValidatePersistentVolumeSpec`, `ValidatePersistentVolumeClaimSpec` and their update rules
//! in `pkg/apis/core/validation`; `ValidateStorageClass(Update)` in
//! `pkg/apis/storage/validation`), and the DefaultStorageClass admission plugin: a new claim
//! that names no class gets the default StorageClass.
//!
//! Skiff models two volume sources, `hostPath` and `local`; the claim validation is shared
//! with StatefulSets' `volumeClaimTemplates` ([`validate_claim_spec`]).
//!
//! Defaults: a volume's reclaim policy Retain and volumeMode Filesystem, a claim's volumeMode
//! Filesystem, phase Pending from creation (with a volume's `lastPhaseTransitionTime`, kept by
//! `Strategy::prepare_status_update` on status writes), a class's reclaim policy Delete and
//! binding mode Immediate. Validation covers the `hostPath` and `local` sources, node
//! affinities through `validation::check_node_selector`, and the update rules: a claim's spec
//! is fixed but for one `volumeName`, a class where there was none, and a bound claim's storage
//! request; a volume's source, volumeMode and node affinity are fixed; a class's provisioner,
//! parameters, reclaim policy and binding mode are fixed. The go-cmp diff kube-apiserver
//! appends to "immutable" messages is approximated.
//!
//! DefaultStorageClass (`default_storage_class`, run by the admission plug-in of that name,
//! reading StorageClasses through the admission request): a claim without
//! `storageClassName` gets the newest class annotated
//! `storageclass.kubernetes.io/is-default-class: "true"`; `""` means no class and stays.

use std::collections::BTreeMap;

use async_trait::async_trait;
use skiff_api::Resource;
use skiff_api::api::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PersistentVolumeSpec, PersistentVolumeStatus, StorageClass,
    VolumeNodeAffinity,
};
use skiff_api::wellknown::BETA_STORAGE_CLASS_ANNOTATION;

use super::Strategy;
use crate::error::{ApiError, FieldError};
use crate::validation as v;

/// The access modes, in the (sorted) order kube-apiserver lists them.
const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const READ_WRITE_ONCE_POD: &str = "ReadWriteOncePod";
/// A PersistentVolume's reclaim policies (Recycle is deprecated, still accepted).
const PV_RECLAIM_POLICIES: &[&str] = &["Delete", "Recycle", "Retain"];
/// A StorageClass's reclaim policies.
const CLASS_RECLAIM_POLICIES: &[&str] = &["Delete", "Retain"];
const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];
const BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];
const FILESYSTEM: &str = "Filesystem";
const PENDING: &str = "Pending";
const STORAGE: &str = "storage";

/// kube-apiserver's message for a quantity its parser refuses (a decoding error there).
const NOT_A_QUANTITY: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
/// `isNotPositiveErrorMsg`.
const NOT_POSITIVE: &str = "must be greater than zero";
/// `fieldImmutableErrorMsg`.
const IMMUTABLE: &str = "field is immutable";
/// The start of kube-apiserver's message for a change to a claim's fixed spec.
const CLAIM_SPEC_IMMUTABLE: &str = "spec is immutable after creation except resources.requests \
                                    and volumeAttributesClassName for bound claims";
/// The start of its message for a change to a volume's source.
const VOLUME_SOURCE_IMMUTABLE: &str = "spec.persistentvolumesource is immutable after creation";

/// A quantity read for validation.
enum Quantity {
    /// Its value in whole units (rounded up, as `Quantity.Value()`), negative when it is.
    Value(i64),
    /// Not a quantity.
    Malformed,
}

fn quantity(text: &str) -> Quantity {
    let t = text.trim();
    let (negative, magnitude) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    match skiff_api::quantity::parse_value(magnitude) {
        Ok(n) if negative => Quantity::Value(-n),
        Ok(n) => Quantity::Value(n),
        Err(_) => Quantity::Malformed,
    }
}

/// How kube-apiserver shows a quantity in a message (`Quantity.String()`): the text as
/// written, `0` for any zero.
fn shown(text: &str, value: i64) -> String {
    if value == 0 {
        "0".into()
    } else {
        text.trim().trim_start_matches('+').to_string()
    }
}

/// `ValidatePositiveQuantityValue` (after the decoding kube-apiserver does first); whether the
/// quantity is good.
fn check_positive(out: &mut Vec<FieldError>, path: &str, text: &str) -> bool {
    match quantity(text) {
        Quantity::Malformed => {
            out.push(FieldError::invalid(path, text, NOT_A_QUANTITY));
            false
        }
        Quantity::Value(n) if n <= 0 => {
            out.push(FieldError::invalid(path, shown(text, n), NOT_POSITIVE));
            false
        }
        Quantity::Value(_) => true,
    }
}

/// Access modes: each a known one, ReadWriteOncePod alone.
fn check_access_modes(out: &mut Vec<FieldError>, path: &str, modes: &[String]) {
    let (mut once_pod, mut others) = (false, false);
    for mode in modes {
        if !ACCESS_MODES.contains(&mode.as_str()) {
            out.push(FieldError::not_supported(path, mode, ACCESS_MODES));
        } else if mode == READ_WRITE_ONCE_POD {
            once_pod = true;
        } else {
            others = true;
        }
    }
    if once_pod && others {
        out.push(FieldError::forbidden(
            path,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
}

/// A class name (`ValidateClassName`: a DNS subdomain), when set.
fn check_class_name(out: &mut Vec<FieldError>, path: &str, name: &str) {
    if !name.is_empty() {
        v::check_dns_subdomain(out, path, name);
    }
}

fn check_volume_mode(out: &mut Vec<FieldError>, path: &str, mode: Option<&str>) {
    if let Some(m) = mode
        && !VOLUME_MODES.contains(&m)
    {
        out.push(FieldError::not_supported(path, m, VOLUME_MODES));
    }
}

/// Go's `%#v` of a `core.ResourceList`, as kube-apiserver shows a capacity without exactly
/// `storage` (quantities by their text: Go would show their internal fields).
fn resource_list(list: &BTreeMap<String, String>) -> String {
    if list.is_empty() {
        return "core.ResourceList(nil)".into();
    }
    let entries: Vec<String> = list.iter().map(|(k, q)| format!("{k:?}:{q:?}")).collect();
    format!("core.ResourceList{{{}}}", entries.join(", "))
}

/// A short diff of two values of the Go struct `ty` in the shape of go-cmp's (which
/// kube-apiserver appends to its "immutable" messages): the fields that differ, by their Go
/// names, old and new as JSON. go-cmp's own text (Go syntax, randomised spacing) is not
/// reproduced.
fn diff(ty: &str, old: &serde_json::Value, new: &serde_json::Value) -> String {
    let empty = serde_json::Map::new();
    let old = old.as_object().unwrap_or(&empty);
    let new = new.as_object().unwrap_or(&empty);
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut lines = vec![format!("  {ty}{{")];
    let go_name = |k: &str| {
        let mut c = k.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect::<String>())
            .unwrap_or_default()
    };
    for k in keys {
        let (a, b) = (old.get(k.as_str()), new.get(k.as_str()));
        if a == b {
            continue;
        }
        let name = go_name(k);
        if let Some(a) = a {
            lines.push(format!("- \t{name}: {a},"));
        }
        if let Some(b) = b {
            lines.push(format!("+ \t{name}: {b},"));
        }
    }
    lines.push("  }".into());
    lines.join("\n")
}

/// The JSON of a message with unset fields left out.
fn json_of<T: serde::Serialize>(value: &T) -> serde_json::Value {
    let mut v = serde_json::to_value(value).unwrap_or(serde_json::Value::Null);
    skiff_api::serde_util::prune(&mut v);
    v
}

/// `ValidateImmutableField` of an optional text: kube-apiserver shows an unset one as "null".
fn check_immutable(out: &mut Vec<FieldError>, path: &str, new: Option<&str>, old: Option<&str>) {
    if new != old {
        out.push(FieldError::invalid(path, new.unwrap_or("null"), IMMUTABLE));
    }
}

#[async_trait]
impl Strategy for PersistentVolume {
    /// A new volume is Pending since now (kube-apiserver's PrepareForCreate, with the
    /// `lastPhaseTransitionTime` of Kubernetes 1.31+); the client's status is dropped.
    fn prepare_create(&mut self) {
        self.status = Some(PersistentVolumeStatus {
            phase: PENDING.into(),
            last_phase_transition_time: Some(super::now_rfc3339()),
            ..Default::default()
        });
    }

    /// `lastPhaseTransitionTime` follows the phase: kept while the phase stays, now when it
    /// changes and the writer did not set a new time.
    fn prepare_status_update(&mut self, old: &Self) {
        let before = old.status.clone().unwrap_or_default();
        let status = self
            .status
            .get_or_insert_with(PersistentVolumeStatus::default);
        let time = status.last_phase_transition_time.clone();
        if status.phase == before.phase {
            if time.is_none() {
                status.last_phase_transition_time = before.last_phase_transition_time;
            }
        } else if time.is_none() || time == before.last_phase_transition_time {
            status.last_phase_transition_time = Some(super::now_rfc3339());
        }
    }

    /// Reclaim policy Retain, volumeMode Filesystem, phase Pending.
    fn default(&mut self) {
        let spec = self.spec.get_or_insert_with(PersistentVolumeSpec::default);
        if spec.persistent_volume_reclaim_policy.is_empty() {
            spec.persistent_volume_reclaim_policy = "Retain".into();
        }
        spec.volume_mode.get_or_insert_with(|| FILESYSTEM.into());
        let status = self
            .status
            .get_or_insert_with(PersistentVolumeStatus::default);
        if status.phase.is_empty() {
            status.phase = PENDING.into();
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let default = PersistentVolumeSpec::default();
        validate_volume_spec(&mut out, self.spec.as_ref().unwrap_or(&default));
        out
    }

    /// The source and volumeMode never change; a node affinity, once set, neither.
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let default = PersistentVolumeSpec::default();
        let new = self.spec.as_ref().unwrap_or(&default);
        let was = old.spec.as_ref().unwrap_or(&default);
        let source = |s: &PersistentVolumeSpec| {
            json_of(&serde_json::json!({"hostPath": s.host_path, "local": s.local}))
        };
        let (old_source, new_source) = (source(was), source(new));
        if old_source != new_source {
            out.push(FieldError::forbidden(
                "spec.persistentvolumesource",
                format!(
                    "{VOLUME_SOURCE_IMMUTABLE}\n{}",
                    diff("core.PersistentVolumeSource", &old_source, &new_source)
                ),
            ));
        }
        // kube-apiserver names these two without their `spec.`.
        check_immutable(
            &mut out,
            "volumeMode",
            new.volume_mode.as_deref(),
            was.volume_mode.as_deref(),
        );
        if let Some(before) = &was.node_affinity
            && !node_affinities_equal(new.node_affinity.as_ref(), before)
        {
            let shown = new
                .node_affinity
                .as_ref()
                .map(|a| json_of(a).to_string())
                .unwrap_or_else(|| "\"null\"".into());
            out.push(FieldError {
                path: "nodeAffinity".into(),
                kind: crate::error::FieldErrorKind::Invalid,
                value: Some(shown),
                detail: format!("{IMMUTABLE}, except for updating from beta label to GA"),
            });
        }
        out
    }
}

/// The beta topology labels a volume's node affinity may be moved from, and their GA names.
const BETA_TOPOLOGY_LABELS: &[(&str, &str)] = &[
    (
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/zone",
    ),
    (
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/region",
    ),
    ("beta.kubernetes.io/os", "kubernetes.io/os"),
    ("beta.kubernetes.io/arch", "kubernetes.io/arch"),
];

/// Whether an updated node affinity is the old one, up to beta topology labels replaced by
/// their GA names (kube-apiserver's `volumeNodeAffinitiesEqual`).
fn node_affinities_equal(new: Option<&VolumeNodeAffinity>, old: &VolumeNodeAffinity) -> bool {
    let Some(new) = new else { return false };
    let mut old = old.clone();
    for term in old
        .required
        .iter_mut()
        .flat_map(|r| r.node_selector_terms.iter_mut())
    {
        for req in &mut term.match_expressions {
            if let Some((_, ga)) = BETA_TOPOLOGY_LABELS.iter().find(|(b, _)| *b == req.key) {
                let upgraded = ga.to_string();
                // Only where the new affinity made that move.
                let moved = new
                    .required
                    .iter()
                    .flat_map(|r| r.node_selector_terms.iter())
                    .flat_map(|t| t.match_expressions.iter())
                    .any(|r| r.key == upgraded && r.values == req.values);
                if moved {
                    req.key = upgraded;
                }
            }
        }
    }
    *new == old
}

/// `ValidatePersistentVolumeSpec` for the fields and sources Skiff has.
fn validate_volume_spec(out: &mut Vec<FieldError>, spec: &PersistentVolumeSpec) {
    if spec.access_modes.is_empty() {
        out.push(FieldError::required("spec.accessModes", ""));
    }
    check_access_modes(out, "spec.accessModes", &spec.access_modes);
    if spec.capacity.is_empty() {
        out.push(FieldError::required("spec.capacity", ""));
    }
    if !spec.capacity.contains_key(STORAGE) || spec.capacity.len() > 1 {
        out.push(FieldError {
            path: "spec.capacity".into(),
            kind: crate::error::FieldErrorKind::NotSupported,
            value: Some(resource_list(&spec.capacity)),
            detail: format!("supported values: {STORAGE:?}"),
        });
    }
    for (name, text) in &spec.capacity {
        let path = format!("spec.capacity[{name}]");
        if let Quantity::Value(n) = quantity(text)
            && n < 0
        {
            out.push(FieldError::invalid(
                path.clone(),
                n,
                "must be a valid resource quantity",
            ));
        }
        check_positive(out, &path, text);
    }
    let policy = spec.persistent_volume_reclaim_policy.as_str();
    if !policy.is_empty() && !PV_RECLAIM_POLICIES.contains(&policy) {
        out.push(FieldError::not_supported(
            "spec.persistentVolumeReclaimPolicy",
            policy,
            PV_RECLAIM_POLICIES,
        ));
    }
    let affinity = spec.node_affinity.is_some();
    if let Some(a) = &spec.node_affinity {
        match &a.required {
            Some(sel) => v::check_node_selector(out, "spec.nodeAffinity.required", sel),
            None => out.push(FieldError::required(
                "spec.nodeAffinity.required",
                "must specify required node constraints",
            )),
        }
    }
    let mut sources = 0;
    if let Some(h) = &spec.host_path {
        sources += 1;
        super::pod_volumes::check_host_path(out, "spec.hostPath", h);
    }
    if let Some(l) = &spec.local {
        if sources > 0 {
            out.push(FieldError::forbidden(
                "spec.local",
                "may not specify more than 1 volume type",
            ));
        } else {
            sources += 1;
            if l.path.is_empty() {
                out.push(FieldError::required("spec.local.path", ""));
            } else if std::path::Path::new(&l.path)
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                out.push(FieldError::invalid(
                    "spec.local.path",
                    &l.path,
                    "must not contain '..'",
                ));
            }
            if !affinity {
                out.push(FieldError::required(
                    "spec.nodeAffinity",
                    "Local volume requires node affinity",
                ));
            }
        }
    }
    if sources == 0 {
        out.push(FieldError::required("spec", "must specify a volume type"));
    }
    // Go's `path.Clean(p) == "/"`: only the root, `.` and `..` under it.
    let cleans_to_root = |p: &str| {
        p.starts_with('/')
            && std::path::Path::new(p).components().all(|c| {
                use std::path::Component::{CurDir, ParentDir, RootDir};
                matches!(c, RootDir | CurDir | ParentDir)
            })
    };
    if let Some(h) = &spec.host_path
        && spec.persistent_volume_reclaim_policy == "Recycle"
        && cleans_to_root(&h.path)
    {
        out.push(FieldError::forbidden(
            "spec.persistentVolumeReclaimPolicy",
            "may not be 'recycle' for a hostPath mount of '/'",
        ));
    }
    check_class_name(out, "spec.storageClassName", &spec.storage_class_name);
    check_volume_mode(out, "spec.volumeMode", spec.volume_mode.as_deref());
}

/// `ValidatePersistentVolumeClaimSpec` at `path` (`spec`, or a StatefulSet's
/// `spec.volumeClaimTemplates[i].spec`): access modes, the selector, a positive storage
/// request, the class name and volumeMode.
pub(crate) fn validate_claim_spec(
    out: &mut Vec<FieldError>,
    path: &str,
    spec: Option<&PersistentVolumeClaimSpec>,
) {
    let default = PersistentVolumeClaimSpec::default();
    let spec = spec.unwrap_or(&default);
    let modes = format!("{path}.accessModes");
    if spec.access_modes.is_empty() {
        out.push(FieldError::required(
            modes.clone(),
            "at least 1 access mode is required",
        ));
    }
    if let Some(sel) = &spec.selector {
        v::check_label_selector(out, &format!("{path}.selector"), sel);
    }
    check_access_modes(out, &modes, &spec.access_modes);
    let storage_path = format!("{path}.resources[{STORAGE}]");
    match spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.get(STORAGE))
    {
        None => out.push(FieldError::required(storage_path, "")),
        Some(text) => {
            check_positive(out, &storage_path, text);
        }
    }
    if let Some(class) = &spec.storage_class_name {
        check_class_name(out, &format!("{path}.storageClassName"), class);
    }
    check_volume_mode(
        out,
        &format!("{path}.volumeMode"),
        spec.volume_mode.as_deref(),
    );
}

/// A claim's spec defaults (`SetDefaults_PersistentVolumeClaimSpec`): volumeMode Filesystem.
pub(crate) fn default_claim_spec(spec: &mut PersistentVolumeClaimSpec) {
    spec.volume_mode.get_or_insert_with(|| FILESYSTEM.into());
}

/// A claim's defaults (`SetDefaults_PersistentVolumeClaim`, also applied to StatefulSets'
/// templates): its spec's, and phase Pending.
pub(crate) fn default_claim(claim: &mut PersistentVolumeClaim) {
    default_claim_spec(
        claim
            .spec
            .get_or_insert_with(PersistentVolumeClaimSpec::default),
    );
    let status = claim
        .status
        .get_or_insert_with(PersistentVolumeClaimStatus::default);
    if status.phase.is_empty() {
        status.phase = PENDING.into();
    }
}

/// The `storage` request of a claim, in bytes (0 when absent or malformed).
fn storage_request(spec: &PersistentVolumeClaimSpec) -> i64 {
    spec.resources
        .as_ref()
        .and_then(|r| r.requests.get(STORAGE))
        .map(|t| match quantity(t) {
            Quantity::Value(n) => n,
            Quantity::Malformed => 0,
        })
        .unwrap_or(0)
}

fn annotation<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a String> {
    claim.metadata.as_ref().and_then(|m| m.annotations.get(key))
}

/// The newest StorageClass annotated as the default (by creation time, then the first name),
/// as Kubernetes' `GetDefaultClass` picks it.
fn default_class(classes: &[StorageClass]) -> Option<&StorageClass> {
    let created = |c: &StorageClass| {
        c.metadata
            .as_ref()
            .and_then(|m| chrono::DateTime::parse_from_rfc3339(&m.creation_timestamp).ok())
    };
    classes.iter().filter(|c| c.is_default()).max_by(|a, b| {
        created(a)
            .cmp(&created(b))
            // Same time: the first name wins, so it must compare greatest.
            .then_with(|| b.name().cmp(a.name()))
    })
}

/// The DefaultStorageClass admission: a claim that names no class (no `storageClassName`,
/// not even "", and no beta class annotation) gets the default StorageClass, the newest when
/// several are marked; none marked, it stays without one.
/// `classes` lists the StorageClasses as the store has them now (only called when needed).
pub(crate) async fn default_storage_class(
    claim: &mut PersistentVolumeClaim,
    classes: impl AsyncFnOnce() -> Result<Vec<StorageClass>, ApiError>,
) -> Result<(), ApiError> {
    let named = annotation(claim, BETA_STORAGE_CLASS_ANNOTATION).is_some()
        || claim
            .spec
            .as_ref()
            .is_some_and(|s| s.storage_class_name.is_some());
    if named {
        return Ok(());
    }
    let classes = classes().await?;
    if let Some(class) = default_class(&classes) {
        claim
            .spec
            .get_or_insert_with(PersistentVolumeClaimSpec::default)
            .storage_class_name = Some(class.name().to_string());
    }
    Ok(())
}

#[async_trait]
impl Strategy for PersistentVolumeClaim {
    /// The client's status is dropped; the claim starts Pending.
    fn prepare_create(&mut self) {
        self.status = None;
    }

    fn default(&mut self) {
        default_claim(self);
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        validate_claim_spec(&mut out, "spec", self.spec.as_ref());
        out
    }

    /// kube-apiserver's `ValidatePersistentVolumeClaimUpdate`: the spec is fixed, except
    /// that `volumeName` may be set once, a claim without a class may get one (not a
    /// different one than its beta annotation), and a bound claim's storage request may
    /// change, not below what its volume already has (`status.capacity`, Kubernetes 1.32's
    /// RecoverVolumeExpansionFailure).
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let empty = PersistentVolumeClaimSpec::default();
        let new_spec = self.spec.as_ref().unwrap_or(&empty);
        let old_spec = old.spec.as_ref().unwrap_or(&empty);
        let mut new_clone = new_spec.clone();
        let mut old_clone = old_spec.clone();
        if old_spec.volume_name.is_empty() {
            old_clone.volume_name = new_spec.volume_name.clone();
        }
        let old_beta = annotation(old, BETA_STORAGE_CLASS_ANNOTATION);
        let new_beta = annotation(self, BETA_STORAGE_CLASS_ANNOTATION);
        let from_annotation = old_beta.is_some_and(|class| {
            old_spec.storage_class_name.is_none()
                && new_spec.storage_class_name.as_ref() == Some(class)
                && new_beta.is_none_or(|n| n == class)
        });
        if from_annotation {
            new_clone.storage_class_name = None;
        } else {
            if new_beta != old_beta {
                out.push(FieldError::invalid(
                    format!("metadata.annotations[{BETA_STORAGE_CLASS_ANNOTATION}]"),
                    new_beta.map(String::as_str).unwrap_or(""),
                    IMMUTABLE,
                ));
            }
            let from_nil = new_spec.storage_class_name.as_ref().is_some_and(|class| {
                old_spec.storage_class_name.is_none() && old_beta.is_none_or(|b| b == class)
            });
            if from_nil {
                new_clone.storage_class_name = old_clone.storage_class_name.clone();
            }
        }
        let bound = self.status.as_ref().is_some_and(|s| s.phase == "Bound");
        if bound && let Some(r) = new_clone.resources.as_mut() {
            let old_storage = old_spec
                .resources
                .as_ref()
                .and_then(|r| r.requests.get(STORAGE).cloned())
                .unwrap_or_else(|| "0".into());
            r.requests.insert(STORAGE.into(), old_storage);
        }
        if new_clone != old_clone {
            out.push(FieldError::forbidden(
                "spec",
                format!(
                    "{CLAIM_SPEC_IMMUTABLE}\n{}",
                    diff(
                        "core.PersistentVolumeClaimSpec",
                        &json_of(&old_clone),
                        &json_of(&new_clone)
                    )
                ),
            ));
        }
        let (old_size, new_size) = (storage_request(old_spec), storage_request(new_spec));
        let status_size = old
            .status
            .as_ref()
            .and_then(|s| s.capacity.get(STORAGE))
            .map(|t| match quantity(t) {
                Quantity::Value(n) => n,
                Quantity::Malformed => 0,
            })
            .unwrap_or(0);
        if new_size < old_size && new_size <= status_size {
            out.push(FieldError::forbidden(
                "spec.resources.requests.storage",
                "field can not be less than status.capacity",
            ));
        }
        check_immutable(
            &mut out,
            "volumeMode",
            new_spec.volume_mode.as_deref(),
            old_spec.volume_mode.as_deref(),
        );
        out
    }
}

impl Strategy for StorageClass {
    /// reclaimPolicy Delete, volumeBindingMode Immediate.
    fn default(&mut self) {
        self.reclaim_policy.get_or_insert_with(|| "Delete".into());
        self.volume_binding_mode
            .get_or_insert_with(|| "Immediate".into());
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        if self.provisioner.is_empty() {
            out.push(FieldError::required("provisioner", ""));
        } else {
            // kube-apiserver checks the lower-cased name and shows it.
            v::check_qualified_name(&mut out, "provisioner", &self.provisioner.to_lowercase());
        }
        check_parameters(&mut out, &self.parameters);
        if let Some(policy) = &self.reclaim_policy
            && !policy.is_empty()
            && !CLASS_RECLAIM_POLICIES.contains(&policy.as_str())
        {
            out.push(FieldError::not_supported(
                "reclaimPolicy",
                policy,
                CLASS_RECLAIM_POLICIES,
            ));
        }
        match &self.volume_binding_mode {
            None => out.push(FieldError::required("volumeBindingMode", "")),
            Some(mode) if !BINDING_MODES.contains(&mode.as_str()) => out.push(
                FieldError::not_supported("volumeBindingMode", mode, BINDING_MODES),
            ),
            Some(_) => {}
        }
        out
    }

    /// The provisioner, its parameters, the reclaim policy and the binding mode are fixed.
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        if self.parameters != old.parameters {
            out.push(FieldError::forbidden(
                "parameters",
                "updates to parameters are forbidden.",
            ));
        }
        if self.provisioner != old.provisioner {
            out.push(FieldError::forbidden(
                "provisioner",
                "updates to provisioner are forbidden.",
            ));
        }
        if self.reclaim_policy != old.reclaim_policy {
            out.push(FieldError::forbidden(
                "reclaimPolicy",
                "updates to reclaimPolicy are forbidden.",
            ));
        }
        check_immutable(
            &mut out,
            "volumeBindingMode",
            self.volume_binding_mode.as_deref(),
            old.volume_binding_mode.as_deref(),
        );
        out
    }
}

/// At most 512 provisioner parameters, no empty key, 256 KiB in all.
fn check_parameters(out: &mut Vec<FieldError>, params: &BTreeMap<String, String>) {
    const MAX_PARAMETERS: usize = 512;
    const MAX_SIZE: usize = 256 * 1024;
    if params.len() > MAX_PARAMETERS {
        out.push(FieldError::too_long("parameters", MAX_PARAMETERS));
        return;
    }
    if params.contains_key("") {
        out.push(FieldError::invalid(
            "parameters",
            "",
            "field can not be empty.",
        ));
    }
    let size: usize = params.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_SIZE {
        out.push(FieldError::too_long("parameters", MAX_SIZE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use skiff_api::api::ObjectMeta;

    fn decode<T: Strategy + skiff_api::Resource>(v: serde_json::Value) -> T {
        match serde_json::from_value(v) {
            Ok(t) => t,
            Err(e) => panic!("not a {}: {e}", T::INFO.kind),
        }
    }

    /// A volume from its spec, created and defaulted as the registry does.
    fn volume(spec: serde_json::Value) -> PersistentVolume {
        let mut pv: PersistentVolume = decode(json!({"metadata": {"name": "pv"}, "spec": spec}));
        pv.prepare_create();
        Strategy::default(&mut pv);
        pv
    }

    fn claim(spec: serde_json::Value) -> PersistentVolumeClaim {
        let mut pvc: PersistentVolumeClaim =
            decode(json!({"metadata": {"name": "data", "namespace": "default"}, "spec": spec}));
        pvc.prepare_create();
        Strategy::default(&mut pvc);
        pvc
    }

    fn class(body: serde_json::Value) -> StorageClass {
        let mut sc: StorageClass = decode(body);
        Strategy::default(&mut sc);
        sc
    }

    fn shown(errors: Vec<FieldError>) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    fn host_path_spec() -> serde_json::Value {
        json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
               "hostPath": {"path": "/srv/pv"}})
    }

    #[test]
    fn volumes_are_defaulted_and_pending_from_creation() {
        let pv = volume(host_path_spec());
        let spec = pv.spec.as_ref().expect("spec");
        assert_eq!(spec.persistent_volume_reclaim_policy, "Retain");
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        let status = pv.status.as_ref().expect("status");
        assert_eq!(status.phase, "Pending");
        assert!(status.last_phase_transition_time.is_some());
        assert!(pv.validate().is_empty(), "{:?}", pv.validate());
        // What the client says about status on create is dropped.
        let mut pv: PersistentVolume = decode(json!({"metadata": {"name": "pv"},
            "spec": host_path_spec(), "status": {"phase": "Bound"}}));
        pv.prepare_create();
        assert_eq!(pv.status.map(|s| s.phase).as_deref(), Some("Pending"));
    }

    #[test]
    fn volume_status_transition_time_follows_the_phase() {
        let old = volume(host_path_spec());
        let then = Some("2024-01-01T00:00:00Z".to_string());
        let mut same = old.clone();
        if let Some(s) = same.status.as_mut() {
            s.last_phase_transition_time = None;
            s.message = "m".into();
        }
        same.prepare_status_update(&old);
        assert_eq!(
            same.status
                .as_ref()
                .and_then(|s| s.last_phase_transition_time.clone()),
            old.status
                .as_ref()
                .and_then(|s| s.last_phase_transition_time.clone())
        );
        let mut bound = old.clone();
        if let Some(s) = bound.status.as_mut() {
            s.phase = "Bound".into();
            s.last_phase_transition_time = then.clone();
        }
        let mut old_then = old.clone();
        if let Some(s) = old_then.status.as_mut() {
            s.last_phase_transition_time = then.clone();
        }
        // The phase changed and the writer kept the old time: now.
        bound.prepare_status_update(&old_then);
        let t = bound.status.and_then(|s| s.last_phase_transition_time);
        assert!(t.is_some() && t != then, "{t:?}");
        // The writer's own new time stays.
        let mut explicit = old_then.clone();
        if let Some(s) = explicit.status.as_mut() {
            s.phase = "Available".into();
            s.last_phase_transition_time = Some("2025-01-01T00:00:00Z".into());
        }
        explicit.prepare_status_update(&old_then);
        assert_eq!(
            explicit
                .status
                .and_then(|s| s.last_phase_transition_time)
                .as_deref(),
            Some("2025-01-01T00:00:00Z")
        );
    }

    #[test]
    fn volumes_need_capacity_access_modes_and_one_source() {
        assert_eq!(
            shown(volume(json!({})).validate()),
            [
                "spec.accessModes: Required value",
                "spec.capacity: Required value",
                "spec.capacity: Unsupported value: core.ResourceList(nil): supported values: \"storage\"",
                "spec: Required value: must specify a volume type",
            ]
        );
        let errs = shown(
            volume(json!({"capacity": {"storage": "1Gi", "cpu": "1"},
                          "accessModes": ["ReadWriteOnce", "WriteSometimes"],
                          "hostPath": {"path": "/a"}}))
            .validate(),
        );
        assert_eq!(
            errs,
            [
                "spec.accessModes: Unsupported value: \"WriteSometimes\": supported values: \
                 \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\"",
                "spec.capacity: Unsupported value: core.ResourceList{\"cpu\":\"1\", \
                 \"storage\":\"1Gi\"}: supported values: \"storage\"",
            ]
        );
        let errs = shown(
            volume(json!({"capacity": {"storage": "0"},
                          "accessModes": ["ReadWriteOncePod", "ReadOnlyMany"],
                          "hostPath": {"path": "/a"}, "local": {"path": "/b"}}))
            .validate(),
        );
        assert_eq!(
            errs,
            [
                "spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes",
                "spec.capacity[storage]: Invalid value: \"0\": must be greater than zero",
                "spec.local: Forbidden: may not specify more than 1 volume type",
            ]
        );
        let errs = shown(
            volume(
                json!({"capacity": {"storage": "-1Ki"}, "accessModes": ["ReadWriteOnce"],
                          "hostPath": {"path": "/a"}}),
            )
            .validate(),
        );
        assert_eq!(
            errs,
            [
                "spec.capacity[storage]: Invalid value: -1024: must be a valid resource quantity",
                "spec.capacity[storage]: Invalid value: \"-1Ki\": must be greater than zero",
            ]
        );
    }

    #[test]
    fn volume_sources_policies_classes_and_modes() {
        let errs = shown(
            volume(
                json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                          "local": {"path": "/mnt/disk"}}),
            )
            .validate(),
        );
        assert_eq!(
            errs,
            ["spec.nodeAffinity: Required value: Local volume requires node affinity"]
        );
        let local = json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "local": {"path": "/mnt/disk"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}});
        assert!(volume(local).validate().is_empty());
        let errs = shown(
            volume(
                json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                          "hostPath": {"path": ""}, "nodeAffinity": {},
                          "persistentVolumeReclaimPolicy": "Keep",
                          "storageClassName": "Fast_Disks", "volumeMode": "Raw"}),
            )
            .validate(),
        );
        assert_eq!(errs.len(), 5, "{errs:#?}");
        assert_eq!(
            errs[0],
            "spec.persistentVolumeReclaimPolicy: Unsupported value: \"Keep\": supported \
             values: \"Delete\", \"Recycle\", \"Retain\""
        );
        assert_eq!(
            errs[1],
            "spec.nodeAffinity.required: Required value: must specify required node constraints"
        );
        assert_eq!(errs[2], "spec.hostPath.path: Required value");
        assert!(
            errs[3].starts_with("spec.storageClassName: Invalid value: \"Fast_Disks\": a lowercase RFC 1123 subdomain"),
            "{errs:#?}"
        );
        assert_eq!(
            errs[4],
            "spec.volumeMode: Unsupported value: \"Raw\": supported values: \"Block\", \"Filesystem\""
        );
        let errs = shown(
            volume(
                json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                          "hostPath": {"path": "/"}, "persistentVolumeReclaimPolicy": "Recycle"}),
            )
            .validate(),
        );
        assert_eq!(
            errs,
            [
                "spec.persistentVolumeReclaimPolicy: Forbidden: may not be 'recycle' for a hostPath mount of '/'"
            ]
        );
        let errs = shown(
            volume(
                json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                          "hostPath": {"path": "/srv/../etc", "type": "Folder"}}),
            )
            .validate(),
        );
        assert_eq!(errs.len(), 2, "{errs:#?}");
        assert_eq!(
            errs[0],
            "spec.hostPath.path: Invalid value: \"/srv/../etc\": must not contain '..'"
        );
        assert!(errs[1].starts_with("spec.hostPath.type: Unsupported value: \"Folder\""));
    }

    #[test]
    fn volume_updates_keep_source_mode_and_affinity() {
        let old = volume(
            json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "local": {"path": "/mnt/a"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "failure-domain.beta.kubernetes.io/zone", "operator": "In",
                 "values": ["z1"]}]}]}}}),
        );
        // Capacity, claimRef, the reclaim policy and the class may change.
        let mut ok = old.clone();
        if let Some(s) = ok.spec.as_mut() {
            s.capacity.insert("storage".into(), "2Gi".into());
            s.persistent_volume_reclaim_policy = "Delete".into();
            s.storage_class_name = "local".into();
            // The beta zone label may become the GA one.
            if let Some(req) = s
                .node_affinity
                .as_mut()
                .and_then(|a| a.required.as_mut())
                .and_then(|r| r.node_selector_terms.first_mut())
                .and_then(|t| t.match_expressions.first_mut())
            {
                req.key = "topology.kubernetes.io/zone".into();
            }
        }
        assert!(
            ok.validate_update(&old).is_empty(),
            "{:?}",
            ok.validate_update(&old)
        );
        let mut bad = old.clone();
        if let Some(s) = bad.spec.as_mut() {
            s.local = None;
            s.host_path = Some(skiff_api::api::HostPathVolumeSource {
                path: "/srv".into(),
                r#type: None,
            });
            s.volume_mode = Some("Block".into());
            s.node_affinity = None;
        }
        let errs = shown(bad.validate_update(&old));
        assert_eq!(errs.len(), 3, "{errs:#?}");
        assert!(
            errs[0].starts_with(
                "spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is \
                 immutable after creation\n  core.PersistentVolumeSource{\n+ \tHostPath: \
                 {\"path\":\"/srv\"},\n- \tLocal: {\"path\":\"/mnt/a\"},"
            ),
            "{errs:#?}"
        );
        assert_eq!(
            errs[1],
            "volumeMode: Invalid value: \"Block\": field is immutable"
        );
        assert_eq!(
            errs[2],
            "nodeAffinity: Invalid value: \"null\": field is immutable, except for updating \
             from beta label to GA"
        );
    }

    #[test]
    fn claims_are_defaulted_and_validated() {
        let pvc = claim(json!({"accessModes": ["ReadWriteOnce"],
                               "resources": {"requests": {"storage": "1Gi"}}}));
        assert_eq!(
            pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref()),
            Some("Filesystem")
        );
        assert_eq!(
            pvc.status.as_ref().map(|s| s.phase.as_str()),
            Some("Pending")
        );
        // Defaulting leaves the class alone: absent and "" mean different things.
        assert_eq!(
            pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()),
            None
        );
        assert!(pvc.validate().is_empty(), "{:?}", pvc.validate());
        assert_eq!(
            shown(claim(json!({})).validate()),
            [
                "spec.accessModes: Required value: at least 1 access mode is required",
                "spec.resources[storage]: Required value",
            ]
        );
        let errs = shown(
            claim(json!({"accessModes": ["ReadWriteOncePod", "ReadWriteOnce"],
                         "selector": {"matchLabels": {"app": "-x"}},
                         "resources": {"requests": {"storage": "0Gi"}},
                         "storageClassName": "Bad", "volumeMode": "Raw"}))
            .validate(),
        );
        assert_eq!(errs.len(), 5, "{errs:#?}");
        assert!(errs[0].starts_with("spec.selector.matchLabels: Invalid value: \"-x\""));
        assert_eq!(
            errs[1],
            "spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes"
        );
        assert_eq!(
            errs[2],
            "spec.resources[storage]: Invalid value: \"0\": must be greater than zero"
        );
        assert!(errs[3].starts_with("spec.storageClassName: Invalid value: \"Bad\""));
        assert!(errs[4].starts_with("spec.volumeMode: Unsupported value: \"Raw\""));
        let errs = shown(
            claim(json!({"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "-2Gi"}}}))
            .validate(),
        );
        assert_eq!(
            errs,
            ["spec.resources[storage]: Invalid value: \"-2Gi\": must be greater than zero"]
        );
        let errs = shown(
            claim(json!({"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "lots"}}}))
            .validate(),
        );
        assert!(
            errs[0].starts_with(
                "spec.resources[storage]: Invalid value: \"lots\": quantities must match"
            ),
            "{errs:?}"
        );
        // An empty class name is "no class", valid.
        assert!(
            claim(
                json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                         "resources": {"requests": {"storage": "1"}}})
            )
            .validate()
            .is_empty()
        );
    }

    #[test]
    fn claim_specs_are_fixed_but_for_binding_class_and_bound_resizes() {
        let old = claim(json!({"accessModes": ["ReadWriteOnce"],
                               "resources": {"requests": {"storage": "1Gi"}}}));
        // volumeName once; a class where there was none.
        let mut new = old.clone();
        if let Some(s) = new.spec.as_mut() {
            s.volume_name = "pv1".into();
            s.storage_class_name = Some("standard".into());
        }
        assert!(
            new.validate_update(&old).is_empty(),
            "{:?}",
            new.validate_update(&old)
        );
        // Not twice, not another class.
        let mut again = new.clone();
        if let Some(s) = again.spec.as_mut() {
            s.volume_name = "pv2".into();
            s.storage_class_name = Some("fast".into());
        }
        let errs = shown(again.validate_update(&new));
        assert_eq!(errs.len(), 1, "{errs:#?}");
        assert!(
            errs[0].starts_with(
                "spec: Forbidden: spec is immutable after creation except resources.requests \
                 and volumeAttributesClassName for bound claims\n  core.PersistentVolumeClaimSpec{\n"
            ),
            "{errs:#?}"
        );
        assert!(errs[0].contains("- \tVolumeName: \"pv1\",\n+ \tVolumeName: \"pv2\","));
        assert!(errs[0].contains("- \tStorageClassName: \"standard\","));
        // A pending claim's request is fixed; a bound claim's may grow, or shrink while
        // above what its volume has.
        let mut grow = new.clone();
        if let Some(r) = grow.spec.as_mut().and_then(|s| s.resources.as_mut()) {
            r.requests.insert("storage".into(), "2Gi".into());
        }
        assert_eq!(grow.validate_update(&new).len(), 1);
        let mut bound = new.clone();
        bound.status = Some(PersistentVolumeClaimStatus {
            phase: "Bound".into(),
            capacity: [("storage".to_string(), "1Gi".to_string())].into(),
            ..Default::default()
        });
        let mut grow = bound.clone();
        if let Some(r) = grow.spec.as_mut().and_then(|s| s.resources.as_mut()) {
            r.requests.insert("storage".into(), "3Gi".into());
        }
        assert!(grow.validate_update(&bound).is_empty());
        let mut shrink = grow.clone();
        if let Some(r) = shrink.spec.as_mut().and_then(|s| s.resources.as_mut()) {
            r.requests.insert("storage".into(), "2Gi".into());
        }
        assert!(shrink.validate_update(&grow).is_empty());
        let mut too_small = grow.clone();
        if let Some(r) = too_small.spec.as_mut().and_then(|s| s.resources.as_mut()) {
            r.requests.insert("storage".into(), "1Gi".into());
        }
        assert_eq!(
            shown(too_small.validate_update(&grow)),
            [
                "spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"
            ]
        );
        // volumeMode is reported on its own too.
        let mut block = new.clone();
        if let Some(s) = block.spec.as_mut() {
            s.volume_mode = Some("Block".into());
        }
        let errs = shown(block.validate_update(&new));
        assert_eq!(errs.len(), 2, "{errs:#?}");
        assert_eq!(
            errs[1],
            "volumeMode: Invalid value: \"Block\": field is immutable"
        );
    }

    #[test]
    fn claims_move_from_the_beta_class_annotation() {
        let mut old = claim(json!({"accessModes": ["ReadWriteOnce"],
                                   "resources": {"requests": {"storage": "1Gi"}}}));
        old.metadata_mut()
            .annotations
            .insert(BETA_STORAGE_CLASS_ANNOTATION.into(), "gold".into());
        let mut new = old.clone();
        if let Some(s) = new.spec.as_mut() {
            s.storage_class_name = Some("gold".into());
        }
        assert!(new.validate_update(&old).is_empty());
        if let Some(s) = new.spec.as_mut() {
            s.storage_class_name = Some("silver".into());
        }
        assert_eq!(new.validate_update(&old).len(), 1);
        let mut dropped = old.clone();
        dropped.metadata_mut().annotations.clear();
        assert_eq!(
            shown(dropped.validate_update(&old)),
            [
                "metadata.annotations[volume.beta.kubernetes.io/storage-class]: Invalid value: \
              \"\": field is immutable"
            ]
        );
    }

    fn marked(name: &str, created: &str, default: &str) -> StorageClass {
        StorageClass {
            metadata: Some(ObjectMeta {
                name: name.into(),
                creation_timestamp: created.into(),
                annotations: [(
                    skiff_api::wellknown::DEFAULT_STORAGE_CLASS_ANNOTATION.to_string(),
                    default.to_string(),
                )]
                .into(),
                ..Default::default()
            }),
            provisioner: "p".into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_default_class_is_the_newest_marked_one() {
        let classes = [
            marked("old", "2024-01-01T00:00:00Z", "true"),
            marked("newer-but-not", "2024-03-01T00:00:00Z", "false"),
            marked("b-new", "2024-02-01T00:00:00Z", "true"),
            marked("a-new", "2024-02-01T00:00:00Z", "true"),
        ];
        assert_eq!(default_class(&classes).map(|c| c.name()), Some("a-new"));
        let mut beta = marked("beta", "2025-01-01T00:00:00Z", "");
        if let Some(m) = beta.metadata.as_mut() {
            m.annotations.clear();
            m.annotations.insert(
                skiff_api::wellknown::BETA_DEFAULT_STORAGE_CLASS_ANNOTATION.into(),
                "true".into(),
            );
        }
        assert_eq!(default_class(&[beta]).map(|c| c.name()), Some("beta"));
        assert!(default_class(&classes[1..2]).is_none());
    }

    #[tokio::test]
    async fn new_claims_without_a_class_get_the_default_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = skiff_store::EmbeddedStore::open(
            &dir.path().join("s.redb"),
            skiff_store::EmbeddedOptions::default(),
        )
        .expect("store");
        let json = crate::admission::interface::JsonOf::<PersistentVolumeClaim>(Default::default());
        let req = crate::admission::Request::new(
            crate::admission::Operation::Create,
            &PersistentVolumeClaim::INFO,
            "",
            "default",
            "",
            None,
            None,
            false,
            &json,
            &store,
        );
        let mut pvc = claim(json!({"accessModes": ["ReadWriteOnce"],
                                   "resources": {"requests": {"storage": "1Gi"}}}));
        // No class marked: nothing changes.
        default_storage_class(&mut pvc, async || req.list::<StorageClass>("").await)
            .await
            .expect("admitted");
        assert_eq!(
            pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()),
            None
        );
        for sc in [
            marked("standard", "2024-01-01T00:00:00Z", "true"),
            marked("fast", "2024-01-02T00:00:00Z", "false"),
        ] {
            let key = format!("/registry/storageclasses/{}", sc.name());
            skiff_store::Store::create(&store, &key, prost::Message::encode_to_vec(&sc))
                .await
                .expect("stored");
        }
        default_storage_class(&mut pvc, async || req.list::<StorageClass>("").await)
            .await
            .expect("admitted");
        assert_eq!(
            pvc.spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref()),
            Some("standard")
        );
        // "" (no class) and a named class stay; so does the beta annotation.
        for named in [json!(""), json!("fast")] {
            let mut pvc = claim(json!({"accessModes": ["ReadWriteOnce"],
                "storageClassName": named, "resources": {"requests": {"storage": "1Gi"}}}));
            default_storage_class(&mut pvc, async || req.list::<StorageClass>("").await)
                .await
                .expect("admitted");
            assert_eq!(
                pvc.spec
                    .and_then(|s| s.storage_class_name)
                    .map(serde_json::Value::from),
                Some(named)
            );
        }
        let mut annotated = claim(json!({"accessModes": ["ReadWriteOnce"],
                                         "resources": {"requests": {"storage": "1Gi"}}}));
        annotated
            .metadata_mut()
            .annotations
            .insert(BETA_STORAGE_CLASS_ANNOTATION.into(), "gold".into());
        default_storage_class(&mut annotated, async || req.list::<StorageClass>("").await)
            .await
            .expect("admitted");
        assert_eq!(annotated.spec.and_then(|s| s.storage_class_name), None);
        assert_eq!(
            annotated.status.map(|s| s.phase).as_deref(),
            Some("Pending")
        );
    }

    #[test]
    fn storage_classes_are_defaulted_and_validated() {
        let sc =
            class(json!({"metadata": {"name": "local"}, "provisioner": "skiff.io/local-path"}));
        assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"));
        assert_eq!(sc.volume_binding_mode.as_deref(), Some("Immediate"));
        assert!(sc.validate().is_empty());
        let errs = shown(class(json!({"metadata": {"name": "x"}})).validate());
        assert_eq!(errs, ["provisioner: Required value"]);
        let errs = shown(
            class(
                json!({"metadata": {"name": "x"}, "provisioner": "Example.com/Bad Name",
                         "parameters": {"": "v"}, "reclaimPolicy": "Recycle",
                         "volumeBindingMode": "Later"}),
            )
            .validate(),
        );
        assert_eq!(errs.len(), 4, "{errs:#?}");
        assert!(
            errs[0].starts_with(
                "provisioner: Invalid value: \"example.com/bad name\": name part must consist of"
            ),
            "{errs:#?}"
        );
        assert_eq!(
            errs[1],
            "parameters: Invalid value: \"\": field can not be empty."
        );
        assert_eq!(
            errs[2],
            "reclaimPolicy: Unsupported value: \"Recycle\": supported values: \"Delete\", \"Retain\""
        );
        assert_eq!(
            errs[3],
            "volumeBindingMode: Unsupported value: \"Later\": supported values: \"Immediate\", \"WaitForFirstConsumer\""
        );
        let many: BTreeMap<String, String> =
            (0..513).map(|i| (format!("k{i}"), String::new())).collect();
        let mut big = sc.clone();
        big.parameters = many;
        assert_eq!(
            shown(big.validate()),
            ["parameters: Too long: must have at most 512 bytes"]
        );
    }

    #[test]
    fn storage_class_updates_keep_what_volumes_were_made_with() {
        let old = class(
            json!({"metadata": {"name": "local"}, "provisioner": "a.io/x",
                               "parameters": {"k": "v"}}),
        );
        let mut ok = old.clone();
        ok.allow_volume_expansion = Some(true);
        ok.mount_options = vec!["ro".into()];
        ok.metadata_mut().annotations.insert(
            "storageclass.kubernetes.io/is-default-class".into(),
            "true".into(),
        );
        assert!(ok.validate_update(&old).is_empty());
        let mut bad = old.clone();
        bad.provisioner = "b.io/y".into();
        bad.parameters.insert("k".into(), "w".into());
        bad.reclaim_policy = Some("Retain".into());
        bad.volume_binding_mode = Some("WaitForFirstConsumer".into());
        assert_eq!(
            shown(bad.validate_update(&old)),
            [
                "parameters: Forbidden: updates to parameters are forbidden.",
                "provisioner: Forbidden: updates to provisioner are forbidden.",
                "reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden.",
                "volumeBindingMode: Invalid value: \"WaitForFirstConsumer\": field is immutable",
            ]
        );
    }
}
