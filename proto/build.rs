//! Compiles proto/skiff/*.proto. The resource messages (package skiff.api) get serde derives
//! so the same Rust types read and write Kubernetes-style JSON/YAML (camelCase, strict).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

/// Kubernetes spells these with capitalised initialisms, which camelCase can't derive.
const RENAMES: [(&str, &str); 26] = [
    ("NodeSpec.pod_cidr", "podCIDR"),
    ("NodeSpec.pod_cidrs", "podCIDRs"),
    ("NodeSpec.provider_id", "providerID"),
    ("NodeSystemInfo.machine_id", "machineID"),
    ("NodeSystemInfo.boot_id", "bootID"),
    ("NodeSystemInfo.system_uuid", "systemUUID"),
    ("PodSpec.host_pid", "hostPID"),
    ("PodStatus.host_ip", "hostIP"),
    ("PodStatus.host_ips", "hostIPs"),
    ("PodStatus.pod_ip", "podIP"),
    ("PodStatus.pod_ips", "podIPs"),
    ("ContainerPort.host_ip", "hostIP"),
    ("ContainerStatus.image_id", "imageID"),
    ("ContainerStatus.container_id", "containerID"),
    ("ContainerStateTerminated.container_id", "containerID"),
    ("ServiceSpec.cluster_ip", "clusterIP"),
    ("ServiceSpec.cluster_ips", "clusterIPs"),
    ("ServiceSpec.external_ips", "externalIPs"),
    ("ServiceSpec.load_balancer_ip", "loadBalancerIP"),
    ("SessionAffinityConfig.client_ip", "clientIP"),
    // Kubernetes' DaemonEndpoint is the one type that spells a field capitalised.
    ("DaemonEndpoint.port", "Port"),
    ("Volume.downward_api", "downwardAPI"),
    ("VolumeProjection.downward_api", "downwardAPI"),
    ("PolicyRule.non_resource_urls", "nonResourceURLs"),
    (
        "APIServiceSpec.insecure_skip_tls_verify",
        "insecureSkipTLSVerify",
    ),
    (
        "CustomResourceValidation.open_api_v3_schema",
        "openAPIV3Schema",
    ),
];

/// IntOrString: a port number or a name, a count or a percentage.
const INT_OR_STRING: [&str; 11] = [
    "NetworkPolicyPort.port",
    "ServicePort.target_port",
    "HTTPGetAction.port",
    "TCPSocketAction.port",
    "RollingUpdateDeployment.max_unavailable",
    "RollingUpdateDeployment.max_surge",
    "RollingUpdateDaemonSet.max_unavailable",
    "RollingUpdateDaemonSet.max_surge",
    "PodDisruptionBudgetSpec.min_available",
    "PodDisruptionBudgetSpec.max_unavailable",
    "RollingUpdateStatefulSetStrategy.max_unavailable",
];

/// Quantities may be written as YAML numbers (cpu: 1).
const QUANTITY_MAPS: [&str; 8] = [
    "PersistentVolumeSpec.capacity",
    "VolumeResourceRequirements.limits",
    "VolumeResourceRequirements.requests",
    "PersistentVolumeClaimStatus.capacity",
    "ResourceRequirements.limits",
    "ResourceRequirements.requests",
    "NodeStatus.capacity",
    "NodeStatus.allocatable",
];

/// Plain numbers and booleans that Kubernetes declares `omitempty`, so they are left out of
/// the JSON when zero or false, as kube-apiserver writes them. Clients act on their presence
/// (`kubectl wait` compares a condition's observedGeneration with the object's generation).
/// Fields without `omitempty` in Kubernetes (restartCount, ready, exitCode, ports,
/// ReplicaSetStatus.replicas, weights) stay, and `optional` fields are `None` when unset.
const OMIT_ZERO: [&str; 47] = [
    "APIServiceSpec.insecure_skip_tls_verify",
    "CustomResourceDefinitionVersion.deprecated",
    "CustomResourceColumnDefinition.priority",
    "CustomResourceDefinitionSpec.preserve_unknown_fields",
    "ObjectMeta.generation",
    "StatefulSetSpec.min_ready_seconds",
    "StatefulSetStatus.observed_generation",
    "StatefulSetStatus.ready_replicas",
    "StatefulSetStatus.current_replicas",
    "StatefulSetStatus.updated_replicas",
    "StatefulSetStatus.available_replicas",
    "StatefulSetOrdinals.start",
    "JobStatus.active",
    "JobStatus.succeeded",
    "JobStatus.failed",
    "PodDisruptionBudgetStatus.observed_generation",
    "DaemonSetSpec.min_ready_seconds",
    "DaemonSetStatus.observed_generation",
    "DaemonSetStatus.updated_number_scheduled",
    "DaemonSetStatus.number_available",
    "DaemonSetStatus.number_unavailable",
    "Condition.observed_generation",
    "ReplicaSetSpec.min_ready_seconds",
    "ReplicationControllerSpec.min_ready_seconds",
    "ReplicaSetStatus.fully_labeled_replicas",
    "ReplicaSetStatus.ready_replicas",
    "ReplicaSetStatus.available_replicas",
    "ReplicaSetStatus.observed_generation",
    "DeploymentSpec.min_ready_seconds",
    "DeploymentSpec.paused",
    "DeploymentStatus.observed_generation",
    "DeploymentStatus.replicas",
    "DeploymentStatus.updated_replicas",
    "DeploymentStatus.ready_replicas",
    "DeploymentStatus.available_replicas",
    "DeploymentStatus.unavailable_replicas",
    "NodeSpec.unschedulable",
    "PodSpec.host_network",
    "PodSpec.host_pid",
    "Probe.initial_delay_seconds",
    "Probe.timeout_seconds",
    "Probe.period_seconds",
    "Probe.success_threshold",
    "Probe.failure_threshold",
    "ContainerStateTerminated.signal",
    "VolumeMount.read_only",
    "PersistentVolumeClaimVolumeSource.read_only",
];

/// Fields Kubernetes always writes, empty or not: Go fields without `omitempty` (strings
/// written as "") and struct-valued fields (written as `{}` with their own such fields).
/// Clients with strict models (the Python client) refuse an object where one is missing.
const ALWAYS: [&str; 17] = [
    "ContainerStatus.name",
    "ContainerStatus.image",
    "ContainerStatus.image_id",
    "NodeSystemInfo.machine_id",
    "NodeSystemInfo.boot_id",
    "NodeSystemInfo.kernel_version",
    "NodeSystemInfo.os_image",
    "NodeSystemInfo.operating_system",
    "NodeSystemInfo.architecture",
    "NodeSystemInfo.kubelet_version",
    "NodeSystemInfo.container_runtime_version",
    "NodeSystemInfo.system_uuid",
    "NodeSystemInfo.kube_proxy_version",
    "Service.status",
    "ServiceStatus.load_balancer",
    "NodeAddress.type",
    "NodeAddress.address",
];

/// Opaque JSON kept as its text in protobuf and written as JSON (FieldsV1).
const RAW_JSON: [&str; 2] = [
    "ManagedFieldsEntry.fields_v1",
    "CustomResourceValidation.open_api_v3_schema",
];

/// Maps of bytes, written as base64 strings in JSON (Secret.data).
const BASE64_MAPS: [&str; 2] = ["Secret.data", "ConfigMap.binary_data"];

/// Bytes written as base64 strings in JSON (PEM blocks of certificate requests).
const BASE64_BYTES: [&str; 4] = [
    "WebhookClientConfig.ca_bundle",
    "APIServiceSpec.ca_bundle",
    "CertificateSigningRequestSpec.request",
    "CertificateSigningRequestStatus.certificate",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/skiff/meta.proto",
        "proto/skiff/core.proto",
        "proto/skiff/apps.proto",
        "proto/skiff/rbac.proto",
        "proto/skiff/certificates.proto",
        "proto/skiff/policy.proto",
        "proto/skiff/batch.proto",
        "proto/skiff/autoscaling.proto",
        "proto/skiff/networking.proto",
        "proto/skiff/storage.proto",
        "proto/skiff/loadbalancer.proto",
        "proto/skiff/apiextensions.proto",
        "proto/skiff/admissionregistration.proto",
        "proto/skiff/apiregistration.proto",
        "proto/skiff/rpc.proto",
    ];
    let mut builder = tonic_prost_build::configure()
        .btree_map(".skiff.api")
        .type_attribute(
            ".skiff.api",
            "#[derive(serde::Serialize, serde::Deserialize)] \
             #[serde(rename_all = \"camelCase\", default, deny_unknown_fields)]",
        );
    for (field, json) in RENAMES {
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            format!("#[serde(rename = \"{json}\")]"),
        );
    }
    for field in INT_OR_STRING {
        // `optional string` fields (the rest are plain strings).
        let with = if field.starts_with("RollingUpdate")
            || field.starts_with("PodDisruptionBudgetSpec.")
            || field.starts_with("NetworkPolicyPort.")
        {
            "opt_int_or_string"
        } else {
            "int_or_string"
        };
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            format!("#[serde(with = \"crate::serde_util::{with}\")]"),
        );
    }
    for field in QUANTITY_MAPS {
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            "#[serde(deserialize_with = \"crate::serde_util::quantity_map\")]",
        );
    }
    for field in RAW_JSON {
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            "#[serde(with = \"crate::serde_util::raw_json\")]",
        );
    }
    for field in BASE64_MAPS {
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            "#[serde(with = \"crate::serde_util::base64_map\")]",
        );
    }
    for field in BASE64_BYTES {
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            "#[serde(with = \"crate::serde_util::base64_bytes\")]",
        );
    }
    for field in OMIT_ZERO {
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            "#[serde(skip_serializing_if = \"crate::serde_util::is_default\")]",
        );
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("skiff_descriptors.bin");
    builder
        .file_descriptor_set_path(&descriptors)
        .compile_protos(&protos, &["proto"])?;
    let set = FileDescriptorSet::decode(std::fs::read(&descriptors)?.as_slice())?;
    std::fs::write(out.join("schema_data.rs"), schema(&set))?;
    Ok(())
}

/// `snake_case` → `camelCase`, as serde's `rename_all = "camelCase"` does.
fn camel(s: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for c in s.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The comment above the element at `path` of a file.
fn doc_of(file: &prost_types::FileDescriptorProto, path: &[i32]) -> String {
    file.source_code_info
        .as_ref()
        .and_then(|i| i.location.iter().find(|l| l.path == path))
        .and_then(|l| l.leading_comments.clone())
        .map(|c| {
            c.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// The scalar or message type of a field, as `schema::Ty` source.
fn ty(f: &prost_types::FieldDescriptorProto) -> String {
    match f.r#type() {
        Type::String => "Ty::String".into(),
        Type::Bool => "Ty::Bool".into(),
        Type::Int32 | Type::Sint32 | Type::Sfixed32 | Type::Uint32 | Type::Fixed32 => {
            "Ty::Int32".into()
        }
        Type::Int64 | Type::Sint64 | Type::Sfixed64 | Type::Uint64 | Type::Fixed64 => {
            "Ty::Int64".into()
        }
        Type::Double | Type::Float => "Ty::Double".into(),
        Type::Bytes => "Ty::Bytes".into(),
        Type::Message | Type::Enum | Type::Group => format!(
            "Ty::Message({:?})",
            f.type_name().rsplit('.').next().unwrap_or_default()
        ),
    }
}

/// Rust source of the `MESSAGES` table (package `skiff.api` only).
fn schema(set: &FileDescriptorSet) -> String {
    let renames: BTreeMap<&str, &str> = RENAMES.into_iter().collect();
    let mut out = String::from("// Generated by proto/build.rs from the .proto files.\n");
    out.push_str("pub static MESSAGES: &[Message] = &[\n");
    for file in set.file.iter().filter(|f| f.package() == "skiff.api") {
        for (mi, m) in file.message_type.iter().enumerate() {
            let entries: BTreeMap<String, &DescriptorProto> = m
                .nested_type
                .iter()
                .filter(|n| n.options.as_ref().is_some_and(|o| o.map_entry()))
                .map(|n| (n.name().to_string(), n))
                .collect();
            let _ = writeln!(
                out,
                "    Message {{ name: {:?}, doc: {:?}, fields: &[",
                m.name(),
                doc_of(file, &[4, mi as i32])
            );
            for (fi, f) in m.field.iter().enumerate() {
                let qualified = format!("{}.{}", m.name(), f.name());
                let json = renames
                    .get(qualified.as_str())
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| camel(f.name()));
                let repeated = f.label() == Label::Repeated;
                let entry = f
                    .type_name()
                    .rsplit('.')
                    .next()
                    .and_then(|n| entries.get(n));
                let (ty, list, map) = match entry {
                    Some(e) => {
                        let value = e.field.iter().find(|v| v.name() == "value");
                        let t = if QUANTITY_MAPS.contains(&qualified.as_str()) {
                            "Ty::Quantity".to_string()
                        } else {
                            value.map(ty).unwrap_or_else(|| "Ty::String".into())
                        };
                        (t, false, true)
                    }
                    None if INT_OR_STRING.contains(&qualified.as_str()) => {
                        ("Ty::IntOrString".into(), repeated, false)
                    }
                    None if RAW_JSON.contains(&qualified.as_str()) => {
                        ("Ty::Json".into(), repeated, false)
                    }
                    None => (ty(f), repeated, false),
                };
                let _ = writeln!(
                    out,
                    "        Field {{ json: {json:?}, ty: {ty}, list: {list}, map: {map}, optional: {}, always: {}, doc: {:?} }},",
                    f.proto3_optional(),
                    ALWAYS.contains(&qualified.as_str()),
                    doc_of(file, &[4, mi as i32, 2, fi as i32])
                );
            }
            out.push_str("    ] },\n");
        }
    }
    out.push_str("];\n");
    out
}
