//! Object builders for tests: small, composable, and the same in every crate's tests.

use std::collections::BTreeMap;

use skiff_api::api::{
    Container, EnvVar, LabelSelector, Node, NodeSelectorRequirement, NodeSelectorTerm, ObjectMeta,
    OwnerReference, Pod, PodSpec, PodTemplateSpec, ResourceRequirements, Taint,
};

use crate::hollow::{NodeShape, node_object};

/// A label map from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A selector matching exactly these labels.
pub fn selector(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: labels(pairs),
        ..Default::default()
    })
}

/// Metadata of `default/<name>`.
pub fn meta(name: &str) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: name.into(),
        namespace: "default".into(),
        ..Default::default()
    })
}

/// A pod template with `labels` and one container `app` (a host `sleep`) whose env holds
/// `VERSION=<version>`, so a changed version is a new template.
pub fn template(pairs: &[(&str, &str)], version: &str) -> Option<PodTemplateSpec> {
    Some(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: labels(pairs),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: "host".into(),
                command: vec!["sleep".into(), "3600".into()],
                env: vec![EnvVar {
                    name: "VERSION".into(),
                    value: version.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
    })
}

/// Pod `default/<name>` (uid `uid-<name>`, which the API server replaces on create) with one
/// container `c` running the host's `sleep 1000`.
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
                command: vec!["sleep".into(), "1000".into()],
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

/// `p` whose first container requests `requests` (`("cpu", "500m")`, ...).
pub fn with_requests(mut p: Pod, requests: &[(&str, &str)]) -> Pod {
    if let Some(c) = spec_mut(&mut p).containers.first_mut() {
        c.resources = Some(ResourceRequirements {
            requests: labels(requests),
            ..Default::default()
        });
    }
    p
}

pub fn pod_with_cpu(name: &str, cpu: &str) -> Pod {
    with_requests(pod(name), &[("cpu", cpu)])
}

/// `p` bound to `node`.
pub fn bound(mut p: Pod, node: &str) -> Pod {
    spec_mut(&mut p).node_name = node.into();
    p
}

/// `p` with these labels added.
pub fn labeled_pod(mut p: Pod, pairs: &[(&str, &str)]) -> Pod {
    p.metadata
        .get_or_insert_with(Default::default)
        .labels
        .extend(labels(pairs));
    p
}

/// `p` controlled by ReplicaSet `owner_uid` (named like its uid).
pub fn owned(mut p: Pod, owner_uid: &str) -> Pod {
    p.metadata
        .get_or_insert_with(Default::default)
        .owner_references
        .push(OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: owner_uid.into(),
            uid: owner_uid.into(),
            controller: Some(true),
            ..Default::default()
        });
    p
}

/// A Ready hollow node with this capacity, no zone.
pub fn node(name: &str, cpu: &str, memory: &str) -> Node {
    node_object(
        name,
        &NodeShape {
            cpu: cpu.into(),
            memory: memory.into(),
            ..Default::default()
        },
        None,
    )
}

/// `n` with these labels added.
pub fn labeled_node(mut n: Node, pairs: &[(&str, &str)]) -> Node {
    n.metadata
        .get_or_insert_with(Default::default)
        .labels
        .extend(labels(pairs));
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

/// A node selector term with one expression.
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
