//! `skiff bpf services|backends [--node NODE] [-o json]`: the eBPF socket load balancer's maps
//! of every node (or one), read from the agents' `/bpf/*` API, printed like
//! `cilium bpf lb list`, with the per-backend counters.

use std::process::ExitCode;

use anyhow::{Result, bail};
use skiff_api::Resource;
use skiff_api::api::Node;
use skiff_client::node_api::{AgentEndpoint, BpfBackends, BpfServices, NodeApiError};
use skiff_client::{Client, ListParams};

use crate::{print_out, table, top};

/// Which dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    Services,
    Backends,
}

pub struct BpfOpts {
    pub what: What,
    pub node: Option<String>,
    pub output: Option<top::Output>,
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

async fn nodes(client: &Client, only: Option<&str>) -> Result<Vec<Node>> {
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
    let mut failed = false;
    let mut services = Vec::new();
    let mut backends = Vec::new();
    for n in &nodes {
        let result: Result<(), NodeApiError> = async {
            let agent = AgentEndpoint::of_node(n)?;
            match opts.what {
                What::Services => services.push(agent.bpf_services().await?),
                What::Backends => backends.push(agent.bpf_backends().await?),
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            eprintln!("error: node {}: {e}", n.name());
            failed = true;
        }
    }
    let lines = match (opts.what, opts.output) {
        (What::Services, Some(top::Output::Json)) => {
            vec![serde_json::to_string_pretty(&services)?]
        }
        (What::Backends, Some(top::Output::Json)) => {
            vec![serde_json::to_string_pretty(&backends)?]
        }
        (What::Services, None) => render_services(&services),
        (What::Backends, None) => render_backends(&backends),
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
