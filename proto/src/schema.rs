//! The shape of every resource message, generated at build time from the `.proto` files
//! (`build.rs`): field names as they appear in JSON (the serde renames included), types,
//! lists and maps, and the comments. The one source for what needs the types' structure at
//! run time: strategic merge patch ([`crate::strategic`]) and the OpenAPI documents the API
//! server serves.
//!
//! [`patch_strategy`] adds Kubernetes' patch strategies and merge keys, which `.proto` files
//! cannot say.

/// A field's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    String,
    Bool,
    Int32,
    Int64,
    Double,
    Bytes,
    /// A number or a string (`targetPort: 8080` or `targetPort: http`).
    IntOrString,
    /// A resource quantity (`cpu: "500m"`, `memory: 1Gi`), a string or a number.
    Quantity,
    /// Arbitrary JSON (an object), kept opaque (`managedFields[].fieldsV1`).
    Json,
    /// Another message, by name.
    Message(&'static str),
}

/// One field of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// The JSON name (`podCIDR`, `clusterIP`, `containers`).
    pub json: &'static str,
    /// The element type for lists, the value type for maps (keys are strings).
    pub ty: Ty,
    pub list: bool,
    pub map: bool,
    /// A `proto3 optional` scalar (absent and zero differ).
    pub optional: bool,
    /// Kubernetes always writes it: empty, it is "" (a string) or `{}` (a message).
    pub always: bool,
    pub doc: &'static str,
}

/// A message: its name, comment and fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    pub name: &'static str,
    pub doc: &'static str,
    pub fields: &'static [Field],
}

impl Message {
    pub fn field(&self, json: &str) -> Option<&'static Field> {
        self.fields.iter().find(|f| f.json == json)
    }
}

include!(concat!(env!("OUT_DIR"), "/schema_data.rs"));

/// The message called `name`.
pub fn message(name: &str) -> Option<&'static Message> {
    MESSAGES.iter().find(|m| m.name == name)
}

/// How a list field is merged by a strategic merge patch (Kubernetes' `patchStrategy` and
/// `patchMergeKey` struct tags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchStrategy {
    /// Objects with the same value of this key are merged; others are added.
    MergeByKey(&'static str),
    /// A list of scalars whose patch values are added (a set union).
    MergePrimitives,
}

/// The patch strategy of `message.field` (JSON name); `None` means the list is replaced.
pub fn patch_strategy(message: &str, field: &str) -> Option<PatchStrategy> {
    use PatchStrategy::*;
    Some(match (message, field) {
        ("ObjectMeta", "finalizers") => MergePrimitives,
        ("ObjectMeta", "ownerReferences") => MergeByKey("uid"),
        ("PodSpec", "containers" | "initContainers" | "ephemeralContainers") => MergeByKey("name"),
        ("PodSpec", "volumes" | "imagePullSecrets") => MergeByKey("name"),
        ("Container", "ports") => MergeByKey("containerPort"),
        ("Container", "env") => MergeByKey("name"),
        ("Container", "volumeMounts") => MergeByKey("mountPath"),
        ("PodStatus" | "NodeStatus" | "DeploymentStatus" | "ReplicaSetStatus", "conditions") => {
            MergeByKey("type")
        }
        ("NodeStatus", "addresses") => MergeByKey("type"),
        ("ServiceSpec", "ports") => MergeByKey("port"),
        ("NamespaceStatus" | "PersistentVolumeClaimStatus", "conditions") => MergeByKey("type"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_from_the_protos_with_kubernetes_names() {
        let pod = message("PodSpec").expect("PodSpec");
        let containers = pod.field("containers").expect("containers");
        assert_eq!(
            (containers.ty, containers.list),
            (Ty::Message("Container"), true)
        );
        let node = message("NodeSpec").expect("NodeSpec");
        assert!(node.field("podCIDR").is_some(), "renamed like Kubernetes");
        let meta = message("ObjectMeta").expect("ObjectMeta");
        assert!(meta.field("labels").expect("labels").map);
        let port = message("ServicePort").expect("ServicePort");
        assert_eq!(
            port.field("targetPort").map(|f| f.ty),
            Some(Ty::IntOrString)
        );
        let res = message("ResourceRequirements").expect("ResourceRequirements");
        assert_eq!(
            res.field("limits").map(|f| (f.ty, f.map)),
            Some((Ty::Quantity, true))
        );
        // Every message a field names exists.
        for m in MESSAGES {
            for f in m.fields {
                if let Ty::Message(n) = f.ty {
                    assert!(message(n).is_some(), "{}.{} names {n}", m.name, f.json);
                }
            }
        }
    }

    #[test]
    fn strategies_name_real_fields() {
        for (m, f) in [
            ("PodSpec", "containers"),
            ("Container", "ports"),
            ("Container", "env"),
            ("ServiceSpec", "ports"),
            ("ObjectMeta", "finalizers"),
        ] {
            assert!(message(m).and_then(|msg| msg.field(f)).is_some(), "{m}.{f}");
            assert!(patch_strategy(m, f).is_some());
        }
        assert_eq!(patch_strategy("Container", "args"), None);
    }
}
