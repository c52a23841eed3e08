//! `skiff top pods [-n NS | -A] [-o json]`: CPU and network use of pods, from the stats of the
//! agents of the nodes they run on.
//!
//! CPU is a rate: two samples of each node's `/stats/summary` [`SAMPLE_WINDOW`] apart, the
//! growth of the pod cgroup's CPU time over the agent-reported time between them, shown in
//! millicores like kubectl (`250m` = a quarter of a core). RX/TX are cumulative IP-level byte
//! counts of the pod's sockets since its containers' cgroups were created.

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use chrono::DateTime;
use serde::Serialize;
use skiff_api::api::Pod;
use skiff_client::node_api::{AgentEndpoint, NetworkStats, NodeApiError, PodStats, StatsSummary};
use skiff_client::{Client, ListParams};

use crate::{output, print_out, table};

/// Time between the two CPU samples.
pub const SAMPLE_WINDOW: Duration = Duration::from_secs(1);

/// `-o` of the commands that print a table by default (`top`, `bpf`, `images`, `observe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum JsonOutput {
    Json,
}

pub struct TopOpts {
    pub namespace: String,
    pub all_namespaces: bool,
    pub output: Option<JsonOutput>,
}

/// One row of `top pods`, and its JSON form.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodUsage {
    pub namespace: String,
    pub name: String,
    pub node: String,
    /// CPU use over the sampling window, in millicores.
    pub cpu_millicores: u64,
    /// Cumulative CPU time at the second sample.
    pub cpu_usage_usec: u64,
    /// Cumulative traffic (`None`: the node has no traffic accounting).
    pub network: Option<NetworkStats>,
}

fn micros(ts: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(ts)
        .ok()
        .map(|t| t.timestamp_micros())
}

/// Millicores used between two samples of a pod's CPU time.
pub fn millicores(first: (&str, u64), second: (&str, u64)) -> u64 {
    let (Some(t1), Some(t2)) = (micros(first.0), micros(second.0)) else {
        return 0;
    };
    let elapsed = t2 - t1;
    if elapsed <= 0 {
        return 0;
    }
    let used = second.1.saturating_sub(first.1);
    ((used as f64) * 1000.0 / (elapsed as f64)).round() as u64
}

/// Rows for the pods of one node from its two summaries, keyed by pod uid.
pub fn usage(node: &str, first: &StatsSummary, second: &StatsSummary) -> Vec<(String, PodUsage)> {
    let before: HashMap<&str, &PodStats> = first.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
    second
        .pods
        .iter()
        .map(|p| {
            let cpu_millicores = before
                .get(p.uid.as_str())
                .map(|b| {
                    millicores(
                        (&first.timestamp, b.cpu_usage_usec),
                        (&second.timestamp, p.cpu_usage_usec),
                    )
                })
                .unwrap_or(0);
            (
                p.uid.clone(),
                PodUsage {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    node: node.to_string(),
                    cpu_millicores,
                    cpu_usage_usec: p.cpu_usage_usec,
                    network: p.network,
                },
            )
        })
        .collect()
}

/// The table, kubectl style (NAMESPACE only with `-A`).
pub fn render(rows: &[PodUsage], all_namespaces: bool) -> Vec<String> {
    let mut headers: Vec<String> = Vec::new();
    if all_namespaces {
        headers.push("NAMESPACE".into());
    }
    headers.extend(["NAME", "CPU(cores)", "RX-BYTES", "TX-BYTES"].map(String::from));
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = Vec::new();
            if all_namespaces {
                row.push(r.namespace.clone());
            }
            let (rx, tx) = match r.network {
                Some(n) => (n.rx_bytes.to_string(), n.tx_bytes.to_string()),
                None => ("<unknown>".into(), "<unknown>".into()),
            };
            row.extend([r.name.clone(), format!("{}m", r.cpu_millicores), rx, tx]);
            row
        })
        .collect();
    table::render(&headers, &cells)
}

async fn sample(agent: &AgentEndpoint) -> Result<(StatsSummary, StatsSummary), NodeApiError> {
    let first = agent.stats_summary().await?;
    tokio::time::sleep(SAMPLE_WINDOW).await;
    let second = agent.stats_summary().await?;
    Ok((first, second))
}

async fn node_usage(client: &Client, node: &str) -> Result<Vec<(String, PodUsage)>, NodeApiError> {
    let agent = AgentEndpoint::for_node(client, node).await?;
    let (first, second) = sample(&agent).await?;
    Ok(usage(node, &first, &second))
}

pub async fn run(client: &Client, opts: &TopOpts) -> Result<ExitCode> {
    let api = if opts.all_namespaces {
        client.all::<Pod>()
    } else {
        client.namespaced::<Pod>(&opts.namespace)
    };
    let pods = api.list(&ListParams::default()).await?.items;
    // The pods to show, by uid, grouped by the node they run on.
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in &pods {
        let node = p
            .spec
            .as_ref()
            .map(|s| s.node_name.clone())
            .unwrap_or_default();
        let uid = p
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        if !node.is_empty() && !uid.is_empty() {
            by_node.entry(node).or_default().push(uid);
        }
    }
    let results = futures::future::join_all(
        by_node
            .keys()
            .map(|node| async move { (node.clone(), node_usage(client, node).await) }),
    )
    .await;
    let mut rows = Vec::new();
    let mut failed = false;
    for (node, result) in results {
        match result {
            Ok(usages) => {
                let wanted = &by_node[&node];
                rows.extend(
                    usages
                        .into_iter()
                        .filter(|(uid, _)| wanted.contains(uid))
                        .map(|(_, u)| u),
                );
            }
            Err(e) => {
                failed = true;
                eprintln!("error: {e}");
            }
        }
    }
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    match opts.output {
        Some(JsonOutput::Json) => {
            let v = serde_json::to_value(&rows)?;
            print_out(output::to_json(&v)?.trim_end())?;
        }
        None if rows.is_empty() && !failed => {
            if opts.all_namespaces {
                eprintln!("No resources found");
            } else {
                eprintln!("No resources found in {} namespace.", opts.namespace);
            }
        }
        None if rows.is_empty() => {}
        None => print_out(&render(&rows, opts.all_namespaces).join("\n"))?,
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(uid: &str, cpu: u64, net: Option<NetworkStats>) -> PodStats {
        PodStats {
            namespace: "default".into(),
            name: format!("pod-{uid}"),
            uid: uid.into(),
            cpu_usage_usec: cpu,
            network: net,
            ..Default::default()
        }
    }

    #[test]
    fn cpu_rate_in_millicores() {
        let t1 = "2026-11-22T05:00:00.000000Z";
        let t2 = "2026-11-22T05:00:01.000000Z";
        assert_eq!(millicores((t1, 0), (t2, 250_000)), 250);
        assert_eq!(millicores((t1, 0), (t2, 2_000_000)), 2000);
        assert_eq!(millicores((t1, 10), (t2, 5)), 0, "a reset counts as idle");
        assert_eq!(millicores((t2, 0), (t1, 100)), 0, "clock went backwards");
        assert_eq!(millicores(("bad", 0), (t2, 100)), 0);
    }

    #[test]
    fn usage_joins_samples_by_uid_and_renders() {
        let net = NetworkStats {
            rx_bytes: 10,
            rx_packets: 1,
            tx_bytes: 2_000_100,
            tx_packets: 40,
        };
        let first = StatsSummary {
            node_name: "n1".into(),
            timestamp: "2026-11-22T05:00:00Z".into(),
            pods: vec![stats("a", 1_000, Some(net))],
            node: None,
        };
        let second = StatsSummary {
            node_name: "n1".into(),
            timestamp: "2026-11-22T05:00:02Z".into(),
            pods: vec![stats("a", 101_000, Some(net)), stats("b", 7, None)],
            node: None,
        };
        let rows: Vec<PodUsage> = usage("n1", &first, &second)
            .into_iter()
            .map(|(_, u)| u)
            .collect();
        assert_eq!(rows[0].cpu_millicores, 50);
        assert_eq!(rows[1].cpu_millicores, 0, "no first sample");
        let lines = render(&rows, false);
        assert_eq!(lines[0], "NAME    CPU(cores)   RX-BYTES    TX-BYTES");
        assert_eq!(lines[1], "pod-a   50m          10          2000100");
        assert_eq!(lines[2], "pod-b   0m           <unknown>   <unknown>");
        assert!(render(&rows, true)[0].starts_with("NAMESPACE   NAME"));
    }
}
