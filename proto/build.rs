//! Compiles proto/skiff/*.proto. The resource messages (package skiff.api) get serde derives
//! so the same Rust types read and write Kubernetes-style JSON/YAML (camelCase, strict).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/skiff/meta.proto",
        "proto/skiff/core.proto",
        "proto/skiff/apps.proto",
        "proto/skiff/rpc.proto",
    ];
    let mut builder = tonic_prost_build::configure()
        .btree_map(".skiff.api")
        .type_attribute(
            ".skiff.api",
            "#[derive(serde::Serialize, serde::Deserialize)] \
             #[serde(rename_all = \"camelCase\", default, deny_unknown_fields)]",
        );
    // Kubernetes spells these with capitalised initialisms, which camelCase can't derive.
    for (field, json) in [
        ("NodeSpec.pod_cidr", "podCIDR"),
        ("NodeSpec.pod_cidrs", "podCIDRs"),
        ("NodeSpec.provider_id", "providerID"),
        ("NodeSystemInfo.machine_id", "machineID"),
        ("NodeSystemInfo.boot_id", "bootID"),
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
        ("SessionAffinityConfig.client_ip", "clientIP"),
        // Kubernetes' DaemonEndpoint is the one type that spells a field capitalised.
        ("DaemonEndpoint.port", "Port"),
    ] {
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            format!("#[serde(rename = \"{json}\")]"),
        );
    }
    // IntOrString: a port number or a name, a count or a percentage.
    for field in [
        "ServicePort.target_port",
        "HTTPGetAction.port",
        "TCPSocketAction.port",
    ] {
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            "#[serde(with = \"crate::serde_util::int_or_string\")]",
        );
    }
    for field in [
        "RollingUpdateDeployment.max_unavailable",
        "RollingUpdateDeployment.max_surge",
    ] {
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            "#[serde(with = \"crate::serde_util::opt_int_or_string\")]",
        );
    }
    // Quantities may be written as YAML numbers (cpu: 1).
    for field in [
        "ResourceRequirements.limits",
        "ResourceRequirements.requests",
        "NodeStatus.capacity",
        "NodeStatus.allocatable",
    ] {
        builder = builder.field_attribute(
            format!(".skiff.api.{field}"),
            "#[serde(deserialize_with = \"crate::serde_util::quantity_map\")]",
        );
    }
    builder.compile_protos(&protos, &["proto"])?;
    Ok(())
}
