//! The generic view of a resource type, used by the API server's single registry and by
//! every client.
//!
//! [`Resource`] gives every kind its static [`KindInfo`] (apiVersion, kind, plural, short
//! names, scope, status subresource), metadata access, the split between spec and status, and
//! the fields a field selector may name; one macro implements it for every kind.
//! [`DynKind`], [`kinds`] and [`find_kind`] are for code that picks a kind by name at run
//! time.

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::*;
use crate::manifest::{self, ManifestError};

/// Static facts about a resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindInfo {
    /// `v1`, `apps/v1`, `coordination.k8s.io/v1`.
    pub api_version: &'static str,
    pub kind: &'static str,
    /// The resource name used in API calls and store keys, e.g. `deployments`.
    pub plural: &'static str,
    pub short_names: &'static [&'static str],
    pub namespaced: bool,
    /// Whether the type has a status that is written through the status subresource.
    pub has_status: bool,
}

impl KindInfo {
    /// The API group, empty for the core group.
    pub fn group(&self) -> &'static str {
        self.api_version
            .rsplit_once('/')
            .map(|(g, _)| g)
            .unwrap_or("")
    }

    /// `deployments.apps`-style name used in messages.
    pub fn qualified(&self) -> String {
        match self.group() {
            "" => self.plural.to_string(),
            g => format!("{}.{g}", self.plural),
        }
    }
}

/// A resource type: a protobuf message with Kubernetes-style JSON, metadata and (optionally)
/// a status that is kept apart from the desired state.
pub trait Resource:
    prost::Message + Default + Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static
{
    const INFO: KindInfo;

    fn metadata_slot(&mut self) -> &mut Option<ObjectMeta>;
    fn metadata(&self) -> Option<&ObjectMeta>;
    fn api_version(&self) -> &str;
    fn kind(&self) -> &str;
    /// Sets `apiVersion` and `kind` to this type's.
    fn set_type_meta(&mut self);
    /// Drops the status (no-op for types without one).
    fn clear_status(&mut self);
    /// Replaces this object's status with `other`'s (no-op for types without one).
    fn copy_status_from(&mut self, other: &Self);
    /// The value of a field for field selectors, e.g. `spec.nodeName`; `None` if the type has
    /// no such field.
    fn field(&self, path: &str) -> Option<String>;

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        self.metadata_slot().get_or_insert_with(ObjectMeta::default)
    }

    fn name(&self) -> &str {
        self.metadata().map(|m| m.name.as_str()).unwrap_or("")
    }

    fn namespace(&self) -> &str {
        self.metadata().map(|m| m.namespace.as_str()).unwrap_or("")
    }

    fn resource_version(&self) -> &str {
        self.metadata()
            .map(|m| m.resource_version.as_str())
            .unwrap_or("")
    }

    /// Whether two objects have the same desired state: everything but metadata, type meta
    /// and status is equal. The API server bumps `generation` when this is false.
    fn spec_eq(&self, other: &Self) -> bool {
        fn strip<T: Resource>(o: &T) -> T {
            let mut o = o.clone();
            *o.metadata_slot() = None;
            o.clear_status();
            o.set_type_meta();
            o
        }
        strip(self) == strip(other)
    }

    /// Kubernetes-style JSON with unset fields left out (present empty label selectors
    /// kept: [`crate::serde_util::prune_message`]).
    fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        crate::serde_util::prune_message(Self::INFO.kind, &mut v);
        v
    }
}

fn meta_field(meta: Option<&ObjectMeta>, path: &str) -> Option<String> {
    match path {
        "metadata.name" => Some(meta.map(|m| m.name.clone()).unwrap_or_default()),
        "metadata.namespace" => Some(meta.map(|m| m.namespace.clone()).unwrap_or_default()),
        _ => None,
    }
}

macro_rules! status_impl {
    (status) => {
        fn clear_status(&mut self) {
            self.status = None;
        }
        fn copy_status_from(&mut self, other: &Self) {
            self.status = other.status.clone();
        }
    };
    (no_status) => {
        fn clear_status(&mut self) {}
        fn copy_status_from(&mut self, _other: &Self) {}
    };
}

macro_rules! has_status {
    (status) => {
        true
    };
    (no_status) => {
        false
    };
}

/// The Kind of a type: its Rust name, or the name given when prost spells it otherwise
/// (`LoadBalancerIPPool` is the Rust type `LoadBalancerIpPool`).
macro_rules! kind_name {
    ($ty:ident) => {
        stringify!($ty)
    };
    ($ty:ident, $kind:literal) => {
        $kind
    };
}

macro_rules! resource {
    ($ty:ident $(as $kind:literal)?, $api:literal, $plural:literal, [$($short:literal),*],
     $namespaced:literal, $status:ident $(, $path:literal => |$o:ident| $get:expr)*) => {
        impl Resource for $ty {
            const INFO: KindInfo = KindInfo {
                api_version: $api,
                kind: kind_name!($ty $(, $kind)?),
                plural: $plural,
                short_names: &[$($short),*],
                namespaced: $namespaced,
                has_status: has_status!($status),
            };

            fn metadata_slot(&mut self) -> &mut Option<ObjectMeta> {
                &mut self.metadata
            }
            fn metadata(&self) -> Option<&ObjectMeta> {
                self.metadata.as_ref()
            }
            fn api_version(&self) -> &str {
                &self.api_version
            }
            fn kind(&self) -> &str {
                &self.kind
            }
            fn set_type_meta(&mut self) {
                self.api_version = $api.to_string();
                self.kind = kind_name!($ty $(, $kind)?).to_string();
            }
            status_impl!($status);
            fn field(&self, path: &str) -> Option<String> {
                match path {
                    $($path => {
                        let $o = self;
                        Some($get)
                    })*
                    _ => meta_field(self.metadata.as_ref(), path),
                }
            }
        }
    };
}

resource!(Namespace, "v1", "namespaces", ["ns"], false, status,
    "status.phase" => |o| o.status.as_ref().map(|s| s.phase.clone()).unwrap_or_default());
resource!(Node, "v1", "nodes", ["no"], false, status,
    "spec.unschedulable" => |o| o.spec.as_ref().map(|s| s.unschedulable).unwrap_or(false).to_string());
// The field selectors are kube-apiserver's for each kind (pkg/registry/*/strategy.go).
resource!(Pod, "v1", "pods", ["po"], true, status,
    "spec.nodeName" => |o| o.spec.as_ref().map(|s| s.node_name.clone()).unwrap_or_default(),
    "spec.restartPolicy" => |o| o.spec.as_ref().map(|s| s.restart_policy.clone()).unwrap_or_default(),
    "spec.schedulerName" => |o| o.spec.as_ref().map(|s| s.scheduler_name.clone()).unwrap_or_default(),
    "spec.serviceAccountName" => |o| o.spec.as_ref().map(|s| s.service_account_name.clone()).unwrap_or_default(),
    "spec.hostNetwork" => |o| o.spec.as_ref().map(|s| s.host_network).unwrap_or(false).to_string(),
    "status.phase" => |o| o.status.as_ref().map(|s| s.phase.clone()).unwrap_or_default(),
    "status.podIP" => |o| o.status.as_ref().map(|s| s.pod_ip.clone()).unwrap_or_default(),
    "status.nominatedNodeName" => |o| o.status.as_ref().map(|s| s.nominated_node_name.clone()).unwrap_or_default());
resource!(Service, "v1", "services", ["svc"], true, status,
    "spec.type" => |o| o.spec.as_ref().map(|s| s.r#type.clone()).unwrap_or_default(),
    "spec.clusterIP" => |o| o.spec.as_ref().map(|s| s.cluster_ip.clone()).unwrap_or_default());
resource!(Endpoints, "v1", "endpoints", ["ep"], true, no_status);
resource!(ConfigMap, "v1", "configmaps", ["cm"], true, no_status);
resource!(Secret, "v1", "secrets", [], true, no_status,
    "type" => |o| o.r#type.clone());
resource!(
    ServiceAccount,
    "v1",
    "serviceaccounts",
    ["sa"],
    true,
    no_status
);
resource!(Event, "v1", "events", ["ev"], true, no_status,
    "involvedObject.kind" => |o| o.involved_object.as_ref().map(|r| r.kind.clone()).unwrap_or_default(),
    "involvedObject.namespace" => |o| o.involved_object.as_ref().map(|r| r.namespace.clone()).unwrap_or_default(),
    "involvedObject.name" => |o| o.involved_object.as_ref().map(|r| r.name.clone()).unwrap_or_default(),
    "involvedObject.uid" => |o| o.involved_object.as_ref().map(|r| r.uid.clone()).unwrap_or_default(),
    "involvedObject.apiVersion" => |o| o.involved_object.as_ref().map(|r| r.api_version.clone()).unwrap_or_default(),
    "involvedObject.resourceVersion" => |o| o.involved_object.as_ref().map(|r| r.resource_version.clone()).unwrap_or_default(),
    "involvedObject.fieldPath" => |o| o.involved_object.as_ref().map(|r| r.field_path.clone()).unwrap_or_default(),
    "reason" => |o| o.reason.clone(),
    "reportingComponent" => |o| o.reporting_component.clone(),
    "source" => |o| o.source.as_ref().map(|s| s.component.clone()).unwrap_or_default(),
    "type" => |o| o.r#type.clone());
resource!(ReplicaSet, "apps/v1", "replicasets", ["rs"], true, status);
resource!(
    ReplicationController,
    "v1",
    "replicationcontrollers",
    ["rc"],
    true,
    status
);
resource!(
    Deployment,
    "apps/v1",
    "deployments",
    ["deploy"],
    true,
    status
);
resource!(DaemonSet, "apps/v1", "daemonsets", ["ds"], true, status);
resource!(
    StatefulSet,
    "apps/v1",
    "statefulsets",
    ["sts"],
    true,
    status
);
resource!(Job, "batch/v1", "jobs", [], true, status);
resource!(
    HorizontalPodAutoscaler,
    "autoscaling/v2",
    "horizontalpodautoscalers",
    ["hpa"],
    true,
    status
);
resource!(CronJob, "batch/v1", "cronjobs", ["cj"], true, status);
resource!(
    PodDisruptionBudget,
    "policy/v1",
    "poddisruptionbudgets",
    ["pdb"],
    true,
    status
);
resource!(
    PersistentVolume,
    "v1",
    "persistentvolumes",
    ["pv"],
    false,
    status
);
resource!(
    PersistentVolumeClaim,
    "v1",
    "persistentvolumeclaims",
    ["pvc"],
    true,
    status
);
resource!(
    StorageClass,
    "storage.k8s.io/v1",
    "storageclasses",
    ["sc"],
    false,
    no_status
);
resource!(
    NetworkPolicy,
    "networking.k8s.io/v1",
    "networkpolicies",
    ["netpol"],
    true,
    no_status
);
resource!(
    Lease,
    "coordination.k8s.io/v1",
    "leases",
    [],
    true,
    no_status
);

resource!(
    Role,
    "rbac.authorization.k8s.io/v1",
    "roles",
    [],
    true,
    no_status
);
resource!(
    ClusterRole,
    "rbac.authorization.k8s.io/v1",
    "clusterroles",
    [],
    false,
    no_status
);
resource!(
    RoleBinding,
    "rbac.authorization.k8s.io/v1",
    "rolebindings",
    [],
    true,
    no_status
);
resource!(
    ClusterRoleBinding,
    "rbac.authorization.k8s.io/v1",
    "clusterrolebindings",
    [],
    false,
    no_status
);
resource!(
    CertificateSigningRequest,
    "certificates.k8s.io/v1",
    "certificatesigningrequests",
    ["csr"],
    false,
    status,
    "spec.signerName" => |o| o.spec.as_ref().map(|s| s.signer_name.clone()).unwrap_or_default()
);
resource!(
    LoadBalancerIpPool as "LoadBalancerIPPool",
    "skiff.io/v1",
    "loadbalancerippools",
    ["lbippool"],
    false,
    status
);

resource!(
    CustomResourceDefinition,
    "apiextensions.k8s.io/v1",
    "customresourcedefinitions",
    ["crd", "crds"],
    false,
    status
);

resource!(
    ValidatingWebhookConfiguration,
    "admissionregistration.k8s.io/v1",
    "validatingwebhookconfigurations",
    [],
    false,
    no_status
);

resource!(
    MutatingWebhookConfiguration,
    "admissionregistration.k8s.io/v1",
    "mutatingwebhookconfigurations",
    [],
    false,
    no_status
);

resource!(
    ValidatingAdmissionPolicy,
    "admissionregistration.k8s.io/v1",
    "validatingadmissionpolicies",
    [],
    false,
    status
);

resource!(
    ValidatingAdmissionPolicyBinding,
    "admissionregistration.k8s.io/v1",
    "validatingadmissionpolicybindings",
    [],
    false,
    no_status
);

resource!(
    ApiService as "APIService",
    "apiregistration.k8s.io/v1",
    "apiservices",
    [],
    false,
    status
);

/// A resource type handled by name, for code that does not know the type statically
/// (the CLI reading manifests, the API server's discovery).
/// An object as a kind stores it, on its way to the registry: protobuf bytes for the typed
/// kinds; a kind stored as JSON may hand over the JSON value itself, which the registry then
/// reads in place rather than from its text.
#[derive(Debug, Clone, PartialEq)]
pub enum Encoded {
    Bytes(Vec<u8>),
    Json(serde_json::Value),
}

impl Encoded {
    /// A typed object's protobuf encoding.
    pub fn proto<M: prost::Message>(message: &M) -> Self {
        Encoded::Bytes(message.encode_to_vec())
    }

    /// The stored encoding (a JSON value is written out).
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            Encoded::Bytes(b) => b,
            Encoded::Json(v) => serde_json::to_vec(&v).unwrap_or_default(),
        }
    }

    /// The protobuf bytes, if that is the form.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Encoded::Bytes(b) => Some(b),
            Encoded::Json(_) => None,
        }
    }
}

pub trait DynKind: Send + Sync {
    fn info(&self) -> &'static KindInfo;
    /// Strictly decodes a manifest document of this kind and encodes it as protobuf.
    fn json_to_proto(&self, value: serde_json::Value) -> Result<Vec<u8>, ManifestError>;
    /// Whether [`DynKind::json_to_proto_pruning`] removes every unknown field at once (a
    /// custom kind prunes by its schema) rather than failing at the first.
    fn prunes_unknown(&self) -> bool {
        false
    }
    /// Encodes `value` with its unknown fields removed, and names them (sorted). Kinds that
    /// do not prune ([`DynKind::prunes_unknown`]) fail at the first unknown field instead.
    fn json_to_proto_pruning(
        &self,
        value: serde_json::Value,
    ) -> Result<(Vec<u8>, Vec<String>), ManifestError> {
        self.json_to_proto(value).map(|b| (b, Vec::new()))
    }
    /// As [`DynKind::json_to_proto_pruning`], in the form the registry takes: a kind stored
    /// as JSON hands over the pruned value rather than its text.
    fn json_to_stored_pruning(
        &self,
        value: serde_json::Value,
    ) -> Result<(Encoded, Vec<String>), ManifestError> {
        self.json_to_proto_pruning(value)
            .map(|(b, unknown)| (Encoded::Bytes(b), unknown))
    }
    /// Decodes a protobuf-encoded object into Kubernetes-style JSON (unset fields omitted).
    fn proto_to_json(&self, bytes: &[u8]) -> Result<serde_json::Value, prost::DecodeError>;
}

/// The [`DynKind`] of a typed kind.
pub struct KindOf<T>(PhantomData<fn() -> T>);

impl<T> Default for KindOf<T> {
    fn default() -> Self {
        KindOf(PhantomData)
    }
}

impl<T: Resource> std::fmt::Debug for KindOf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(T::INFO.kind)
    }
}

impl<T: Resource> DynKind for KindOf<T> {
    fn info(&self) -> &'static KindInfo {
        &T::INFO
    }

    fn json_to_proto(&self, value: serde_json::Value) -> Result<Vec<u8>, ManifestError> {
        let obj: T = manifest::decode(value)?;
        Ok(obj.encode_to_vec())
    }

    fn proto_to_json(&self, bytes: &[u8]) -> Result<serde_json::Value, prost::DecodeError> {
        let mut obj = T::decode(bytes)?;
        obj.set_type_meta();
        Ok(obj.to_json())
    }
}

static KINDS: [&dyn DynKind; 35] = [
    &KindOf::<Namespace>(PhantomData),
    &KindOf::<Node>(PhantomData),
    &KindOf::<Pod>(PhantomData),
    &KindOf::<Service>(PhantomData),
    &KindOf::<Endpoints>(PhantomData),
    &KindOf::<ConfigMap>(PhantomData),
    &KindOf::<Secret>(PhantomData),
    &KindOf::<ServiceAccount>(PhantomData),
    &KindOf::<Event>(PhantomData),
    &KindOf::<ReplicaSet>(PhantomData),
    &KindOf::<Deployment>(PhantomData),
    &KindOf::<DaemonSet>(PhantomData),
    &KindOf::<StatefulSet>(PhantomData),
    &KindOf::<PodDisruptionBudget>(PhantomData),
    &KindOf::<Job>(PhantomData),
    &KindOf::<CronJob>(PhantomData),
    &KindOf::<HorizontalPodAutoscaler>(PhantomData),
    &KindOf::<NetworkPolicy>(PhantomData),
    &KindOf::<PersistentVolume>(PhantomData),
    &KindOf::<PersistentVolumeClaim>(PhantomData),
    &KindOf::<StorageClass>(PhantomData),
    &KindOf::<Lease>(PhantomData),
    &KindOf::<Role>(PhantomData),
    &KindOf::<ClusterRole>(PhantomData),
    &KindOf::<RoleBinding>(PhantomData),
    &KindOf::<ClusterRoleBinding>(PhantomData),
    &KindOf::<CertificateSigningRequest>(PhantomData),
    &KindOf::<LoadBalancerIpPool>(PhantomData),
    &KindOf::<CustomResourceDefinition>(PhantomData),
    &KindOf::<ValidatingWebhookConfiguration>(PhantomData),
    &KindOf::<MutatingWebhookConfiguration>(PhantomData),
    &KindOf::<ValidatingAdmissionPolicy>(PhantomData),
    &KindOf::<ValidatingAdmissionPolicyBinding>(PhantomData),
    &KindOf::<ReplicationController>(PhantomData),
    &KindOf::<ApiService>(PhantomData),
];

/// Interns a kind known only at run time (a custom kind): the same facts give the same
/// `&'static`, so kinds that come and go leak at most one [`KindInfo`] per distinct shape.
pub fn intern_kind(
    api_version: &str,
    kind: &str,
    plural: &str,
    short_names: &[String],
    namespaced: bool,
    has_status: bool,
) -> &'static KindInfo {
    type Key = (String, String, String, Vec<String>, bool, bool);
    static TABLE: std::sync::OnceLock<
        std::sync::Mutex<std::collections::BTreeMap<Key, &'static KindInfo>>,
    > = std::sync::OnceLock::new();
    let key: Key = (
        api_version.to_string(),
        kind.to_string(),
        plural.to_string(),
        short_names.to_vec(),
        namespaced,
        has_status,
    );
    let mut table = TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(info) = table.get(&key) {
        return info;
    }
    let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
    let shorts: Vec<&'static str> = short_names.iter().map(|s| leak(s)).collect();
    let info: &'static KindInfo = Box::leak(Box::new(KindInfo {
        api_version: leak(api_version),
        kind: leak(kind),
        plural: leak(plural),
        short_names: Box::leak(shorts.into_boxed_slice()),
        namespaced,
        has_status,
    }));
    table.insert(key, info);
    info
}

/// The codec of a kind whose objects travel as JSON (custom kinds: the API server stores and
/// serves them as JSON over gRPC too).
#[derive(Debug)]
struct JsonKind(&'static KindInfo);

impl DynKind for JsonKind {
    fn info(&self) -> &'static KindInfo {
        self.0
    }

    fn json_to_proto(&self, value: serde_json::Value) -> Result<Vec<u8>, ManifestError> {
        serde_json::to_vec(&value).map_err(|e| ManifestError::new("", e.to_string()))
    }

    fn proto_to_json(&self, bytes: &[u8]) -> Result<serde_json::Value, prost::DecodeError> {
        #[allow(deprecated, reason = "prost offers no other way to make a DecodeError")]
        serde_json::from_slice(bytes).map_err(|e| prost::DecodeError::new(e.to_string()))
    }
}

/// The JSON codec of an interned kind ([`intern_kind`]); one per kind, kept for the process.
pub fn json_kind(info: &'static KindInfo) -> &'static dyn DynKind {
    static TABLE: std::sync::OnceLock<
        std::sync::Mutex<std::collections::BTreeMap<usize, &'static JsonKind>>,
    > = std::sync::OnceLock::new();
    let mut table = TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    *table
        .entry(info as *const KindInfo as usize)
        .or_insert_with(|| Box::leak(Box::new(JsonKind(info))))
}

/// Whether `info` is one of Skiff's typed kinds ([`kinds`]) rather than a custom kind.
pub fn is_typed(info: &KindInfo) -> bool {
    kinds().iter().any(|k| k.info() == info)
}

/// Every resource type Skiff serves.
pub fn kinds() -> &'static [&'static dyn DynKind] {
    &KINDS
}

/// Finds a resource type by plural, singular, short name or kind, case-insensitively
/// (`pods`, `pod`, `po`, `Pod`; `deployments.apps` also works).
pub fn find_kind(name: &str) -> Option<&'static dyn DynKind> {
    let name = name.to_ascii_lowercase();
    KINDS.iter().copied().find(|k| {
        let i = k.info();
        let kind = i.kind.to_ascii_lowercase();
        name == i.plural
            || name == kind
            || i.short_names.contains(&name.as_str())
            || name == i.qualified()
            || (!i.group().is_empty() && name == format!("{kind}.{}", i.group()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_kinds_by_any_name() {
        for (n, kind) in [
            ("po", "Pod"),
            ("pods", "Pod"),
            ("Pod", "Pod"),
            ("deploy", "Deployment"),
            ("deployments.apps", "Deployment"),
            ("svc", "Service"),
            ("ep", "Endpoints"),
            ("no", "Node"),
            ("ns", "Namespace"),
            ("rs", "ReplicaSet"),
            ("lease", "Lease"),
            ("lbippool", "LoadBalancerIPPool"),
            ("loadbalancerippools.skiff.io", "LoadBalancerIPPool"),
        ] {
            assert_eq!(find_kind(n).map(|k| k.info().kind), Some(kind), "{n}");
        }
        assert!(find_kind("widgets").is_none());
    }

    #[test]
    fn spec_eq_ignores_metadata_and_status() {
        let mut a = Pod::default();
        a.metadata_mut().name = "a".into();
        let mut b = a.clone();
        b.metadata_mut().resource_version = "7".into();
        b.status = Some(PodStatus {
            phase: "Running".into(),
            ..Default::default()
        });
        assert!(a.spec_eq(&b));
        b.spec = Some(PodSpec {
            node_name: "n1".into(),
            ..Default::default()
        });
        assert!(!a.spec_eq(&b));
        assert_eq!(b.field("spec.nodeName").as_deref(), Some("n1"));
        assert_eq!(b.field("metadata.name").as_deref(), Some("a"));
        assert_eq!(b.field("spec.bogus"), None);
    }

    /// The field selectors kubectl uses: `describe` asks for an object's events by
    /// involvedObject uid, name, namespace and kind.
    #[test]
    fn event_fields_cover_kubectl_describe() {
        let e = crate::api::Event {
            involved_object: Some(crate::api::ObjectReference {
                kind: "Deployment".into(),
                namespace: "default".into(),
                name: "web".into(),
                uid: "u1".into(),
                api_version: "apps/v1".into(),
                ..Default::default()
            }),
            source: Some(crate::api::EventSource {
                component: "deployment-controller".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        for (path, want) in [
            ("involvedObject.uid", "u1"),
            ("involvedObject.name", "web"),
            ("involvedObject.namespace", "default"),
            ("involvedObject.kind", "Deployment"),
            ("involvedObject.apiVersion", "apps/v1"),
            ("source", "deployment-controller"),
        ] {
            assert_eq!(e.field(path).as_deref(), Some(want), "{path}");
        }
    }
}
