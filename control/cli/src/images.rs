//! `skiff images [--node NODE] [-o json]`: the images every node has pulled, like `crictl
//! images` across the cluster: repository, tag, digest, size, and how many of the node's
//! pods use the image. Read from the API only (`Node.status.images`, which each agent posts
//! after every pull, and the pods bound to the node).

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;
use skiff_api::Resource;
use skiff_api::api::{Node, Pod};
use skiff_client::{Client, ListParams};

use crate::{print_out, table, top};

/// One image of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRow {
    pub node: String,
    pub repository: String,
    pub tag: String,
    pub digest: String,
    pub size_bytes: i64,
    /// Pods on the node whose containers name this image (by tag or digest).
    pub in_use: usize,
}

/// `registry/repo:tag` → (`registry/repo`, `tag`); a port's colon is not a tag's.
fn split_tag(name: &str) -> Option<(&str, &str)> {
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    name[slash..]
        .rfind(':')
        .map(|i| (&name[..slash + i], &name[slash + i + 1..]))
}

/// The rows of one node: one per tag (an image pulled only by digest has tag `<none>`).
pub fn rows_of(node: &Node, pods: &[Pod]) -> Vec<ImageRow> {
    let images = node
        .status
        .as_ref()
        .map(|s| s.images.clone())
        .unwrap_or_default();
    let mut rows = Vec::new();
    for img in images {
        let digest_name = img.names.iter().find(|n| n.contains("@sha256:"));
        let (digest_repo, digest) = digest_name
            .and_then(|n| n.split_once('@'))
            .map(|(r, d)| (r.to_string(), d.to_string()))
            .unwrap_or_default();
        let in_use = pods
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name == node.name()))
            .filter(|p| {
                p.spec.iter().any(|s| {
                    s.containers
                        .iter()
                        .chain(&s.init_containers)
                        .any(|c| img.names.contains(&c.image))
                })
            })
            .count();
        let tags: Vec<(&str, &str)> = img
            .names
            .iter()
            .filter(|n| !n.contains('@'))
            .filter_map(|n| split_tag(n))
            .collect();
        if tags.is_empty() {
            rows.push(ImageRow {
                node: node.name().to_string(),
                repository: digest_repo.clone(),
                tag: "<none>".into(),
                digest: digest.clone(),
                size_bytes: img.size_bytes,
                in_use,
            });
        }
        for (repo, tag) in tags {
            rows.push(ImageRow {
                node: node.name().to_string(),
                repository: repo.to_string(),
                tag: tag.to_string(),
                digest: digest.clone(),
                size_bytes: img.size_bytes,
                in_use,
            });
        }
    }
    rows.sort_by(|a, b| (&a.repository, &a.tag).cmp(&(&b.repository, &b.tag)));
    rows
}

/// crictl's sizes: `1.23MB`, decimal units.
fn human(bytes: i64) -> String {
    let b = bytes.max(0) as f64;
    for (unit, scale) in [("GB", 1e9), ("MB", 1e6), ("kB", 1e3)] {
        if b >= scale {
            return format!("{:.3}{unit}", b / scale)
                .replace(".000", "")
                .to_string();
        }
    }
    format!("{bytes}B")
}

pub fn render(rows: &[ImageRow]) -> Vec<String> {
    let headers: Vec<String> = ["NODE", "IMAGE", "TAG", "DIGEST", "SIZE", "IN USE"]
        .map(String::from)
        .to_vec();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let short = r.digest.trim_start_matches("sha256:");
            vec![
                r.node.clone(),
                r.repository.clone(),
                r.tag.clone(),
                short.chars().take(13).collect(),
                human(r.size_bytes),
                if r.in_use == 0 {
                    "no".into()
                } else {
                    format!("yes ({} pods)", r.in_use)
                },
            ]
        })
        .collect();
    table::render(&headers, &cells)
}

pub async fn run(
    client: &Client,
    node: Option<&str>,
    output: Option<top::JsonOutput>,
) -> Result<ExitCode> {
    let nodes = crate::bpf::nodes(client, node).await?;
    let pods = client
        .all::<Pod>()
        .list(&ListParams::default())
        .await?
        .items;
    let mut by_node: BTreeMap<String, Vec<ImageRow>> = BTreeMap::new();
    for n in &nodes {
        by_node.insert(n.name().to_string(), rows_of(n, &pods));
    }
    let rows: Vec<ImageRow> = by_node.into_values().flatten().collect();
    let lines = match output {
        Some(top::JsonOutput::Json) => vec![serde_json::to_string_pretty(&rows)?],
        None if rows.is_empty() => vec!["No images found.".to_string()],
        None => render(&rows),
    };
    for l in lines {
        print_out(&l)?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{Container, ContainerImage, NodeStatus, ObjectMeta, PodSpec};

    #[test]
    fn rows_split_names_and_count_the_pods_using_them() {
        let node = Node {
            metadata: Some(ObjectMeta {
                name: "n1".into(),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                images: vec![
                    ContainerImage {
                        names: vec![
                            "127.0.0.1:5000/web:v2".into(),
                            "127.0.0.1:5000/web@sha256:abcdef0123456789".into(),
                        ],
                        size_bytes: 1_234_567,
                    },
                    ContainerImage {
                        names: vec!["r.example/tool@sha256:99887766554433".into()],
                        size_bytes: 999,
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = |name: &str, node: &str, image: &str| Pod {
            metadata: Some(ObjectMeta {
                name: name.into(),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                node_name: node.into(),
                containers: vec![Container {
                    name: "c".into(),
                    image: image.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let pods = [
            pod("a", "n1", "127.0.0.1:5000/web:v2"),
            pod("b", "n1", "127.0.0.1:5000/web@sha256:abcdef0123456789"),
            pod("c", "n2", "127.0.0.1:5000/web:v2"),
        ];
        let rows = rows_of(&node, &pods);
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (
                rows[0].repository.as_str(),
                rows[0].tag.as_str(),
                rows[0].in_use
            ),
            ("127.0.0.1:5000/web", "v2", 2)
        );
        assert_eq!(rows[0].digest, "sha256:abcdef0123456789");
        assert_eq!(
            (
                rows[1].repository.as_str(),
                rows[1].tag.as_str(),
                rows[1].in_use
            ),
            ("r.example/tool", "<none>", 0)
        );
        let lines = render(&rows);
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["NODE", "IMAGE", "TAG", "DIGEST", "SIZE", "IN", "USE"]
        );
        assert!(
            lines[1].contains("abcdef0123456") && lines[1].contains("1.235MB"),
            "{}",
            lines[1]
        );
        assert!(lines[1].ends_with("yes (2 pods)"), "{}", lines[1]);
        assert!(lines[2].ends_with("no"), "{}", lines[2]);
        assert_eq!(split_tag("localhost:5000/a/b"), None);
        assert_eq!(human(999), "999B");
        assert_eq!(human(2_000_000), "2MB");
    }
}
