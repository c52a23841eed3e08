//! `skiff bpf services|backends|pods|conntrack [--node NODE] [-o json]`: the eBPF maps of
//! every node (or one), read from the agents' `/bpf/*` API: the socket load balancer printed
//! like `cilium bpf lb list` with the per-backend counters, the pod fast path's endpoints
//! with each pod's traffic and the fast path's counters, the NodePort conntrack entries.

use std::process::ExitCode;

use anyhow::{Result, bail};
use skiff_api::Resource;
use skiff_api::api::Node;
use skiff_client::node_api::{
    AgentEndpoint, BpfBackends, BpfConntrack, BpfDump, BpfPods, BpfServices, NodeApiError,
};
use skiff_client::{Client, ListParams};

use crate::{print_out, table, top};

/// Which dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    Services,
    Backends,
    Pods,
    Conntrack,
}

pub struct BpfOpts {
    pub what: What,
    pub node: Option<String>,
    pub output: Option<top::JsonOutput>,
}

/// `cilium bpf lb list`-style rows: one per backend, the frontend only on its first row.
pub fn render_services(dumps: &[BpfServices]) -> Vec<String> {
    let headers: Vec<String> = [
        "NODE",
        "SERVICE ADDRESS",
        "BACKEND ADDRESS (SLOT)",
        "CONNECTS",
        "SENDS",
        "SERVICE",
    ]
    .map(String::from)
    .to_vec();
    let mut rows = Vec::new();
    for d in dumps {
        for s in &d.services {
            let service = match (&s.service, &s.port_name) {
                (Some(svc), Some(port)) if !port.is_empty() => format!("{svc} ({port})"),
                (Some(svc), _) => svc.clone(),
                (None, _) => "<none>".into(),
            };
            if s.backends.is_empty() {
                rows.push(vec![
                    d.node.clone(),
                    s.frontend.clone(),
                    "<no backends: connects refused>".into(),
                    s.connects.to_string(),
                    s.sends.to_string(),
                    service,
                ]);
                continue;
            }
            for (i, b) in s.backends.iter().enumerate() {
                let first = i == 0;
                rows.push(vec![
                    if first { d.node.clone() } else { String::new() },
                    if first {
                        s.frontend.clone()
                    } else {
                        String::new()
                    },
                    format!("{} ({})", b.address, b.slot),
                    b.connects.to_string(),
                    b.sends.to_string(),
                    if first {
                        service.clone()
                    } else {
                        String::new()
                    },
                ]);
            }
        }
    }
    table::render(&headers, &rows)
}

pub fn render_backends(dumps: &[BpfBackends]) -> Vec<String> {
    let headers: Vec<String> = [
        "NODE", "ID", "ADDRESS", "PROTOCOL", "FRONTEND", "CONNECTS", "SENDS", "SERVICE",
    ]
    .map(String::from)
    .to_vec();
    let none = || "<none>".to_string();
    let rows: Vec<Vec<String>> = dumps
        .iter()
        .flat_map(|d| {
            d.backends.iter().map(|b| {
                vec![
                    d.node.clone(),
                    b.id.to_string(),
                    b.address.clone(),
                    b.protocol.clone().unwrap_or_else(none),
                    b.frontend.clone().unwrap_or_else(none),
                    b.connects.to_string(),
                    b.sends.to_string(),
                    b.service.clone().unwrap_or_else(none),
                ]
            })
        })
        .collect();
    table::render(&headers, &rows)
}

/// One row per local pod of the fast path, then one line of counters per node.
pub fn render_pods(dumps: &[BpfPods]) -> Vec<String> {
    let headers: Vec<String> = [
        "NODE", "POD IP", "POD", "IFINDEX", "POD MAC", "HOST MAC", "RX BYTES", "TX BYTES",
    ]
    .map(String::from)
    .to_vec();
    let none = || "<none>".to_string();
    let bytes = |n: Option<u64>| n.map_or_else(none, |n| n.to_string());
    let mut rows = Vec::new();
    for d in dumps {
        for p in &d.pods {
            let pod = match (&p.namespace, &p.name) {
                (Some(ns), Some(name)) => format!("{ns}/{name}"),
                _ => none(),
            };
            rows.push(vec![
                d.node.clone(),
                p.ip.clone(),
                pod,
                p.ifindex.to_string(),
                p.pod_mac.clone(),
                p.host_mac.clone(),
                bytes(p.network.map(|n| n.rx_bytes)),
                bytes(p.network.map(|n| n.tx_bytes)),
            ]);
        }
    }
    let mut lines = table::render(&headers, &rows);
    lines.push(String::new());
    let headers: Vec<String> = [
        "NODE",
        "REDIRECT PEER",
        "REDIRECT NEIGH",
        "PASS",
        "FIB FAIL",
    ]
    .map(String::from)
    .to_vec();
    let rows: Vec<Vec<String>> = dumps
        .iter()
        .map(|d| {
            let f = d.fast_path;
            vec![
                d.node.clone(),
                f.redirect_peer.to_string(),
                f.redirect_neigh.to_string(),
                f.pass.to_string(),
                f.fib_fail.to_string(),
            ]
        })
        .collect();
    lines.extend(table::render(&headers, &rows));
    lines
}

pub fn render_conntrack(dumps: &[BpfConntrack]) -> Vec<String> {
    let headers: Vec<String> = [
        "NODE",
        "DIRECTION",
        "PROTOCOL",
        "PACKET",
        "REWRITTEN TO",
        "SERVICE ID",
        "BACKEND ID",
    ]
    .map(String::from)
    .to_vec();
    let rows: Vec<Vec<String>> = dumps
        .iter()
        .flat_map(|d| {
            d.entries.iter().map(|e| {
                vec![
                    d.node.clone(),
                    e.direction.clone(),
                    e.protocol.clone(),
                    e.packet.clone(),
                    e.rewritten.clone(),
                    e.service_id.to_string(),
                    e.backend_id.to_string(),
                ]
            })
        })
        .collect();
    table::render(&headers, &rows)
}

pub async fn nodes(client: &Client, only: Option<&str>) -> Result<Vec<Node>> {
    Ok(match only {
        Some(n) => vec![client.cluster::<Node>().get(n).await?],
        None => {
            let mut all = client
                .cluster::<Node>()
                .list(&ListParams::default())
                .await?
                .items;
            all.sort_by(|a, b| a.name().cmp(b.name()));
            all
        }
    })
}

/// Asks every selected node's agent; a node that cannot answer is reported on stderr and the
/// command fails at the end (after printing what the others said).
pub async fn run(client: &Client, opts: &BpfOpts) -> Result<ExitCode> {
    let nodes = nodes(client, opts.node.as_deref()).await?;
    if nodes.is_empty() {
        bail!("no nodes");
    }
    match opts.what {
        What::Services => show(client, &nodes, opts.output, render_services).await,
        What::Backends => show(client, &nodes, opts.output, render_backends).await,
        What::Pods => show(client, &nodes, opts.output, render_pods).await,
        What::Conntrack => show(client, &nodes, opts.output, render_conntrack).await,
    }
}

/// Fetches dump `T` from every node's agent and prints it as a table (`render`) or JSON.
async fn show<T: BpfDump>(
    client: &Client,
    nodes: &[Node],
    output: Option<top::JsonOutput>,
    render: fn(&[T]) -> Vec<String>,
) -> Result<ExitCode> {
    let mut failed = false;
    let mut dumps = Vec::new();
    for n in nodes {
        let result: Result<T, NodeApiError> = async {
            let agent = AgentEndpoint::of_node_as(
                n,
                &skiff_client::node_api::AgentAccess::of_client(client),
            )?;
            agent.bpf::<T>().await
        }
        .await;
        match result {
            Ok(d) => dumps.push(d),
            Err(e) => {
                eprintln!("error: node {}: {e}", n.name());
                failed = true;
            }
        }
    }
    let lines = match output {
        Some(top::JsonOutput::Json) => vec![serde_json::to_string_pretty(&dumps)?],
        None => render(&dumps),
    };
    for l in lines {
        print_out(&l)?;
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
    use skiff_client::node_api::{BpfBackend, BpfService};

    fn backend(id: u32, slot: u32, addr: &str, connects: u64) -> BpfBackend {
        BpfBackend {
            id,
            slot,
            address: addr.into(),
            connects,
            ..Default::default()
        }
    }

    #[test]
    fn services_table_lists_every_backend_under_its_frontend() {
        let dump = BpfServices {
            node: "node-1".into(),
            services: vec![
                BpfService {
                    id: 1,
                    frontend: "10.96.0.10:80/TCP".into(),
                    service: Some("default/web".into()),
                    port_name: Some("http".into()),
                    backends: vec![
                        backend(3, 1, "10.244.1.5:8080", 7),
                        backend(4, 2, "10.244.2.3:8080", 5),
                    ],
                    connects: 12,
                    ..Default::default()
                },
                BpfService {
                    id: 2,
                    frontend: "10.96.0.11:53/UDP".into(),
                    service: Some("default/dns".into()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let lines = render_services(&[dump]);
        assert!(lines[0].starts_with("NODE"), "{lines:?}");
        assert!(lines[1].contains("10.96.0.10:80/TCP") && lines[1].contains("10.244.1.5:8080 (1)"));
        assert!(lines[1].contains("default/web (http)") && lines[1].contains(" 7 "));
        assert!(!lines[2].contains("10.96.0.10") && lines[2].contains("10.244.2.3:8080 (2)"));
        assert!(lines[3].contains("10.96.0.11:53/UDP") && lines[3].contains("no backends"));
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn pods_table_joins_traffic_and_shows_counters() {
        use skiff_client::node_api::{BpfFastPath, BpfPod, NetworkStats};
        let dump = BpfPods {
            node: "node-1".into(),
            pods: vec![
                BpfPod {
                    ip: "10.244.1.5".into(),
                    ifindex: 12,
                    namespace: Some("default".into()),
                    name: Some("web-1".into()),
                    network: Some(NetworkStats {
                        rx_bytes: 1200,
                        tx_bytes: 800,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                BpfPod {
                    ip: "10.244.1.6".into(),
                    ..Default::default()
                },
            ],
            fast_path: BpfFastPath {
                redirect_peer: 41,
                redirect_neigh: 17,
                pass: 3,
                fib_fail: 0,
            },
        };
        let lines = render_pods(&[dump]);
        assert!(
            lines[0].starts_with("NODE") && lines[0].contains("RX BYTES"),
            "{lines:?}"
        );
        assert!(lines[1].contains("default/web-1") && lines[1].contains(" 1200 "));
        assert!(lines[1].trim_end().ends_with("800"), "{lines:?}");
        assert!(lines[2].contains("10.244.1.6") && lines[2].contains("<none>"));
        assert!(lines[4].contains("REDIRECT PEER"), "{lines:?}");
        assert!(
            lines[5].contains(" 41 ") && lines[5].contains(" 17 "),
            "{lines:?}"
        );
    }

    #[test]
    fn conntrack_table_has_a_row_per_direction() {
        use skiff_client::node_api::BpfConntrackEntry;
        let dump = BpfConntrack {
            node: "node-1".into(),
            entries: vec![BpfConntrackEntry {
                direction: "forward".into(),
                protocol: "TCP".into(),
                packet: "10.0.0.9:40000 -> 192.168.100.2:30080".into(),
                rewritten: "192.168.100.2:40000 -> 10.244.1.5:8080".into(),
                backend_id: 3,
                service_id: 2,
            }],
        };
        let lines = render_conntrack(&[dump]);
        assert_eq!(lines.len(), 2);
        assert!(lines[1].contains("forward") && lines[1].contains("10.244.1.5:8080"));
    }

    #[test]
    fn backends_table_has_a_row_per_backend() {
        let dump = BpfBackends {
            node: "node-2".into(),
            backends: vec![BpfBackend {
                protocol: Some("TCP".into()),
                frontend: Some("10.96.0.10:80/TCP".into()),
                service: Some("default/web".into()),
                ..backend(3, 1, "10.244.1.5:8080", 9)
            }],
        };
        let lines = render_backends(&[dump]);
        assert_eq!(lines.len(), 2);
        assert!(lines[1].contains("node-2") && lines[1].contains("10.244.1.5:8080"));
        assert!(lines[1].contains("TCP") && lines[1].contains(" 9 "));
    }
}
