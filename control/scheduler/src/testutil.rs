//! Object builders for unit tests.

use skiff_api::api::{
    Container, Node, NodeSelectorRequirement, NodeSelectorTerm, ObjectMeta, OwnerReference, Pod,
    PodSpec, ResourceRequirements, Taint,
};

use crate::hollow;

pub fn node(name: &str, cpu: &str, memory: &str) -> Node {
    hollow::node_object(
        name,
        &hollow::NodeShape {
            cpu: cpu.into(),
            memory: memory.into(),
            ..Default::default()
        },
        None,
    )
}

pub fn labeled(mut n: Node, labels: &[(&str, &str)]) -> Node {
    let m = n.metadata.get_or_insert_with(Default::default);
    for (k, v) in labels {
        m.labels.insert(k.to_string(), v.to_string());
    }
    n
}

pub fn taint(key: &str, value: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: value.into(),
        effect: effect.into(),
        ..Default::default()
    }
}

pub fn pod(name: &str) -> Pod {
    Pod {
        metadata: Some(ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            uid: format!("uid-{name}"),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: "host".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn spec_mut(p: &mut Pod) -> &mut PodSpec {
    p.spec.get_or_insert_with(Default::default)
}

pub fn with_requests(mut p: Pod, requests: &[(&str, &str)]) -> Pod {
    let c = &mut spec_mut(&mut p).containers[0];
    c.resources = Some(ResourceRequirements {
        requests: requests
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    });
    p
}

pub fn pod_with_cpu(name: &str, cpu: &str) -> Pod {
    with_requests(pod(name), &[("cpu", cpu)])
}

pub fn bound(mut p: Pod, node: &str) -> Pod {
    spec_mut(&mut p).node_name = node.into();
    p
}

pub fn labeled_pod(mut p: Pod, labels: &[(&str, &str)]) -> Pod {
    let m = p.metadata.get_or_insert_with(Default::default);
    for (k, v) in labels {
        m.labels.insert(k.to_string(), v.to_string());
    }
    p
}

pub fn owned(mut p: Pod, owner_uid: &str) -> Pod {
    let m = p.metadata.get_or_insert_with(Default::default);
    m.owner_references.push(OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: owner_uid.into(),
        uid: owner_uid.into(),
        controller: Some(true),
        ..Default::default()
    });
    p
}

pub fn expr_term(key: &str, op: &str, values: &[&str]) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: vec![NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }],
        ..Default::default()
    }
}
