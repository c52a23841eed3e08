//! `skiff observe`: the flow records of every node (what the eBPF policy programs saw: flows
//! pods started or accepted, packets NetworkPolicy dropped), merged, filtered by namespace,
//! pod, Service and verdict, as a table or JSON lines, and with `-f` followed live (like
//! `hubble observe`). Read from each node's agent (`GET /flows`); the nodes come from the API.

use std::process::ExitCode;

use anyhow::{Result, bail};
use futures::StreamExt as _;
use skiff_api::Resource as _;
use skiff_client::Client;
use skiff_client::node_api::{AgentEndpoint, FlowQuery, FlowRecord};

use crate::{bpf, print_out, top};

/// What `skiff observe` was asked for.
#[derive(Debug, Clone, Default)]
pub struct ObserveOpts {
    pub query: FlowQuery,
    pub node: Option<String>,
    pub output: Option<top::JsonOutput>,
}

/// The table's columns.
const HEADERS: [&str; 8] = [
    "TIME",
    "NODE",
    "VERDICT",
    "SOURCE",
    "DESTINATION",
    "PROTO",
    "SERVICE",
    "POLICY",
];

/// One table line (fixed widths, so followed lines line up without seeing them all).
pub fn line(r: &FlowRecord) -> String {
    let time = r.time.get(11..23).unwrap_or(&r.time);
    let ep = |e: &skiff_client::node_api::FlowEndpoint| format!("{}:{}", e.name(), e.port);
    let or_dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    format!(
        "{time:<13} {:<16} {:<8} {:<28} {:<28} {:<5} {:<22} {}",
        r.node,
        r.verdict.to_uppercase(),
        ep(&r.source),
        ep(&r.destination),
        r.protocol,
        or_dash(&r.service),
        or_dash(&r.policy),
    )
}

fn header() -> String {
    format!(
        "{:<13} {:<16} {:<8} {:<28} {:<28} {:<5} {:<22} {}",
        HEADERS[0],
        HEADERS[1],
        HEADERS[2],
        HEADERS[3],
        HEADERS[4],
        HEADERS[5],
        HEADERS[6],
        HEADERS[7]
    )
}

/// Streams every selected node's records, as they come, until each agent ends its answer
/// (at once without `follow`) or the command is interrupted. A node that cannot answer is
/// reported on stderr; the others go on, and the command fails at the end.
pub async fn run(client: &Client, opts: &ObserveOpts) -> Result<ExitCode> {
    let nodes = bpf::nodes(client, opts.node.as_deref()).await?;
    if nodes.is_empty() {
        bail!("no nodes");
    }
    let mut failed = false;
    let mut streams = Vec::new();
    for n in &nodes {
        let name = n.name().to_string();
        let opened = async {
            let agent = AgentEndpoint::of_node_as(
                n,
                &skiff_client::node_api::AgentAccess::of_client(client),
            )?;
            agent.flows(&opts.query).await
        }
        .await;
        match opened {
            Ok(s) => streams.push(lines(name, s)),
            Err(e) => {
                eprintln!("error: node {name}: {e}");
                failed = true;
            }
        }
    }
    if opts.output.is_none() {
        print_out(&header())?;
    }
    let mut all = futures::stream::select_all(streams);
    while let Some(item) = all.next().await {
        match item {
            Ok(text) => {
                let Ok(record) = serde_json::from_str::<FlowRecord>(&text) else {
                    eprintln!("error: an agent sent a line that is no flow record: {text}");
                    failed = true;
                    continue;
                };
                // The agents filter too; this keeps the output right against an older one.
                if !opts.query.matches(&record) {
                    continue;
                }
                match opts.output {
                    Some(top::JsonOutput::Json) => print_out(&text)?,
                    None => print_out(&line(&record))?,
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A node's body chunks as whole lines (a line may span chunks).
fn lines(
    node: String,
    chunks: futures::stream::BoxStream<
        'static,
        Result<bytes::Bytes, skiff_client::node_api::NodeApiError>,
    >,
) -> futures::stream::BoxStream<'static, Result<String, String>> {
    futures::stream::unfold(
        (
            chunks,
            Vec::<u8>::new(),
            std::collections::VecDeque::<String>::new(),
            node,
        ),
        |(mut chunks, mut buf, mut ready, node)| async move {
            loop {
                if let Some(l) = ready.pop_front() {
                    return Some((Ok(l), (chunks, buf, ready, node)));
                }
                match chunks.next().await {
                    Some(Ok(b)) => {
                        buf.extend_from_slice(&b);
                        while let Some(i) = buf.iter().position(|c| *c == b'\n') {
                            let l: Vec<u8> = buf.drain(..=i).collect();
                            let l = String::from_utf8_lossy(&l[..l.len() - 1]).into_owned();
                            if !l.trim().is_empty() {
                                ready.push_back(l);
                            }
                        }
                    }
                    Some(Err(e)) => {
                        return Some((
                            Err(format!("node {node}: {e}")),
                            (chunks, Vec::new(), ready, node),
                        ));
                    }
                    None => return None,
                }
            }
        },
    )
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_client::node_api::FlowEndpoint;

    #[test]
    fn a_line_names_both_ends_the_service_and_the_policy() {
        let r = FlowRecord {
            time: "2026-11-26T18:00:01.123456Z".into(),
            node: "n1".into(),
            direction: "ingress".into(),
            verdict: "denied".into(),
            protocol: "TCP".into(),
            source: FlowEndpoint {
                ip: "10.244.1.2".into(),
                port: 40000,
                namespace: "y".into(),
                pod: "a".into(),
                ..Default::default()
            },
            destination: FlowEndpoint {
                ip: "10.244.0.2".into(),
                port: 80,
                namespace: "x".into(),
                pod: "a".into(),
                ..Default::default()
            },
            policy: "x/deny".into(),
            ..Default::default()
        };
        let l = line(&r);
        assert!(l.starts_with("18:00:01.123 "), "{l}");
        assert!(l.contains("DENIED"), "{l}");
        assert!(l.contains("y/a:40000"), "{l}");
        assert!(l.contains("x/a:80"), "{l}");
        assert!(l.ends_with("x/deny"), "{l}");
        assert!(l.contains(" - "), "no service shows a dash: {l}");
        assert!(header().starts_with("TIME"));
    }

    #[tokio::test]
    async fn lines_are_reassembled_across_chunks() {
        let chunks = futures::stream::iter(vec![
            Ok(bytes::Bytes::from_static(b"{\"a\":1}\n{\"b\"")),
            Ok(bytes::Bytes::from_static(b":2}\n")),
        ])
        .boxed();
        let got: Vec<_> = lines("n".into(), chunks).collect().await;
        assert_eq!(
            got,
            vec![Ok("{\"a\":1}".to_string()), Ok("{\"b\":2}".to_string())]
        );
    }
}
