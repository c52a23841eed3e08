//! The agent's metrics for `GET /metrics` (see [`super::api`]), in the OpenMetrics text
//! format written by the `prometheus-client` crate.
//!
//! Nothing is counted here: a scrape reads the same sources as the JSON endpoints
//! (`/stats/summary`'s [`StatsSummary`], `/bpf/services`' [`BpfServices`] and the fast path's
//! counters) into a [`Scrape`], which is registered as a `prometheus-client` collector and
//! encoded. Families come in a fixed order and each family's series sorted by their label
//! values, so the same state always gives the same text.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use skiff_client::node_api::{BpfServices, LatencyHistogram, StatsSummary};
use skiff_datapath::lb::FastPathCounters;

/// `Content-Type` of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What one scrape reads: the stats summary (`/stats/summary`), how many of its pods have a
/// sandbox, and the Service load balancer's report (`/bpf/services`) and the pod fast path's
/// counters (`/bpf/pods`) if it runs.
#[derive(Debug)]
pub struct Scrape {
    pub summary: StatsSummary,
    pub pods_running: usize,
    pub lb: Option<BpfServices>,
    pub fast_path: Option<FastPathCounters>,
    /// NetworkPolicy verdict counters, if enforcement runs.
    pub policy: Option<Vec<crate::netpol::VerdictCount>>,
    /// The load balancer's L2 announcement entries (LoadBalancer addresses this node answers
    /// ARP for) and whether each is answered now (its Lease's deadline not passed), if the
    /// load balancer runs.
    pub l2: Option<Vec<(std::net::Ipv4Addr, bool)>>,
}

/// Label pairs of one series, in the family's label order.
type Labels = Vec<(&'static str, String)>;

fn labels<const N: usize>(names: [&'static str; N], values: [&str; N]) -> Labels {
    names.into_iter().zip(values.map(str::to_string)).collect()
}

/// Writes one family of counters (names without `_total`: the format adds it).
fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, u64)>,
) -> fmt::Result {
    let mut series: Vec<(Labels, u64)> = series.into_iter().collect();
    series.sort();
    // Samples of one label set given twice add up.
    series.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 += later.1;
        }
        same
    });
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in &series {
        if labels.is_empty() {
            m.encode_counter::<NoLabelSet, _, u64>(v, None)?;
        } else {
            m.encode_family(labels)?
                .encode_counter::<NoLabelSet, _, u64>(v, None)?;
        }
    }
    Ok(())
}

/// Writes one family of integer gauges.
fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, i64)>,
) -> fmt::Result {
    let mut series: Vec<(Labels, i64)> = series.into_iter().collect();
    series.sort();
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in &series {
        if labels.is_empty() {
            m.encode_gauge(v)?;
        } else {
            m.encode_family(labels)?.encode_gauge(v)?;
        }
    }
    Ok(())
}

/// Writes the programming latency histogram (kept in microseconds, exposed in seconds).
fn latency_histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: &LatencyHistogram,
) -> fmt::Result {
    // prometheus-client takes per-bucket counts and makes them cumulative itself.
    let mut buckets = Vec::with_capacity(h.buckets.len());
    let mut below = 0;
    for b in &h.buckets {
        let le = b.le.map_or(f64::INFINITY, |us| us as f64 / 1e6);
        buckets.push((le, b.count.saturating_sub(below)));
        below = b.count;
    }
    enc.encode_descriptor(name, help, None, MetricType::Histogram)?
        .encode_histogram::<NoLabelSet>(h.sum as f64 / 1e6, h.count, &buckets, None)
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let e = &mut enc;
        gauges(
            e,
            "skiff_agent_info",
            "The node agent: its node name and version.",
            [(
                labels(
                    ["node", "version"],
                    [&self.summary.node_name, env!("CARGO_PKG_VERSION")],
                ),
                1,
            )],
        )?;
        gauges(
            e,
            "skiff_pods_running",
            "Pods this agent runs that have a sandbox.",
            [(Labels::new(), to_i64(self.pods_running as u64))],
        )?;
        encode_pod_traffic(e, &self.summary)?;
        gauges(
            e,
            "skiff_lb_up",
            "1 if the eBPF Service load balancer runs on this node, else 0.",
            [(Labels::new(), i64::from(self.lb.is_some()))],
        )?;
        if let Some(lb) = &self.lb {
            encode_lb(e, lb)?;
        }
        if let Some(fp) = &self.fast_path {
            encode_fast_path(e, fp)?;
        }
        if let Some(l2) = &self.l2 {
            gauges(
                e,
                "skiff_l2_announcing",
                "LoadBalancer addresses this node announces: 1 while it answers ARP for the \
                 address (its Lease held and not expired), 0 for an entry past its deadline.",
                l2.iter()
                    .map(|(ip, on)| (labels(["address"], [&ip.to_string()]), i64::from(*on))),
            )?;
        }
        gauges(
            e,
            "skiff_policy_up",
            "1 if eBPF NetworkPolicy enforcement runs on this node, else 0.",
            [(Labels::new(), i64::from(self.policy.is_some()))],
        )?;
        if let Some(verdicts) = &self.policy {
            encode_policy(e, verdicts)?;
        }
        Ok(())
    }
}

/// The pods' traffic (absent when the traffic accounting is not loaded).
fn encode_pod_traffic(e: &mut DescriptorEncoder, summary: &StatsSummary) -> fmt::Result {
    // Absent when the traffic accounting is not loaded.
    let pods: Vec<_> = summary
        .pods
        .iter()
        .filter_map(|p| {
            let n = p.network?;
            Some((labels(["namespace", "pod"], [&p.namespace, &p.name]), n))
        })
        .collect();
    if !pods.is_empty() {
        for (name, help, pick) in [
            (
                "skiff_pod_network_receive_bytes",
                "Bytes received by the pod's containers (eBPF cgroup accounting).",
                (|n| n.rx_bytes) as fn(&skiff_client::node_api::NetworkStats) -> u64,
            ),
            (
                "skiff_pod_network_receive_packets",
                "Packets received by the pod's containers (eBPF cgroup accounting).",
                |n| n.rx_packets,
            ),
            (
                "skiff_pod_network_transmit_bytes",
                "Bytes sent by the pod's containers (eBPF cgroup accounting).",
                |n| n.tx_bytes,
            ),
            (
                "skiff_pod_network_transmit_packets",
                "Packets sent by the pod's containers (eBPF cgroup accounting).",
                |n| n.tx_packets,
            ),
        ] {
            counters(
                e,
                name,
                help,
                pods.iter().map(|(l, n)| (l.clone(), pick(n))),
            )?;
        }
    }
    Ok(())
}

/// The pod fast path's counters.
fn encode_fast_path(e: &mut DescriptorEncoder, fp: &FastPathCounters) -> fmt::Result {
    counters(
        e,
        "skiff_fastpath_packets",
        "Packets of the eBPF pod networking fast path: delivered into a local pod \
         (redirect_peer), forwarded to the FIB's next hop (redirect_neigh), handed to \
         the node's stack (pass), or handed to it after a failed FIB lookup (fib_fail).",
        [
            ("redirect_peer", fp.redirect_peer),
            ("redirect_neigh", fp.redirect_neigh),
            ("pass", fp.pass),
            ("fib_fail", fp.fib_fail),
        ]
        .map(|(action, n)| (labels(["action"], [action]), n)),
    )?;
    Ok(())
}

/// NetworkPolicy verdict counters.
fn encode_policy(
    e: &mut DescriptorEncoder,
    verdicts: &[crate::netpol::VerdictCount],
) -> fmt::Result {
    let series = |pick: fn(&crate::netpol::VerdictCount) -> u64| {
        let v: Vec<(Labels, u64)> = verdicts
            .iter()
            .map(|c| {
                (
                    labels(
                        ["direction", "reason", "policy"],
                        [c.direction, c.reason, &c.policy],
                    ),
                    pick(c),
                )
            })
            .collect();
        v
    };
    counters(
        e,
        "skiff_policy_packets",
        "Packets of local pods by NetworkPolicy verdict: direction, reason \
         (allowed-by-rule, allowed-unisolated, allowed-established, denied) and the \
         policy that allowed them or, for drops, isolates the pod.",
        series(|c| c.packets),
    )?;
    counters(
        e,
        "skiff_policy_bytes",
        "Bytes of local pods by NetworkPolicy verdict (labels as skiff_policy_packets).",
        series(|c| c.bytes),
    )?;
    Ok(())
}

fn encode_lb(e: &mut DescriptorEncoder, lb: &BpfServices) -> fmt::Result {
    gauges(
        e,
        "skiff_lb_map_entries",
        "Entries in a Service load balancer map.",
        lb.maps
            .iter()
            .map(|m| (labels(["map"], [&m.map]), to_i64(m.entries))),
    )?;
    gauges(
        e,
        "skiff_lb_map_max_entries",
        "Capacity of a Service load balancer map.",
        lb.maps
            .iter()
            .map(|m| (labels(["map"], [&m.map]), to_i64(m.max_entries))),
    )?;
    gauges(
        e,
        "skiff_lb_frontends",
        "Frontends (Service IP, port, protocol) programmed in the load balancer.",
        [(Labels::new(), to_i64(lb.services.len() as u64))],
    )?;
    counters(
        e,
        "skiff_lb_map_writes",
        "Load balancer map writes since the agent started.",
        [(Labels::new(), lb.programming.writes)],
    )?;
    latency_histogram(
        e,
        "skiff_lb_programming_latency_seconds",
        "Time from a Service or Endpoints change seen to the load balancer maps written.",
        &lb.programming.latency_micros,
    )?;
    let backends: Vec<(Labels, u64, u64)> = lb
        .services
        .iter()
        .flat_map(|svc| {
            svc.backends.iter().map(move |b| {
                (
                    labels(
                        ["service", "port_name", "frontend", "backend"],
                        [
                            svc.service.as_deref().unwrap_or(""),
                            svc.port_name.as_deref().unwrap_or(""),
                            &svc.frontend,
                            &b.address,
                        ],
                    ),
                    b.connects,
                    b.sends,
                )
            })
        })
        .collect();
    counters(
        e,
        "skiff_lb_backend_connects",
        "connect() calls (TCP, connected UDP) sent to a backend since it was added.",
        backends.iter().map(|(l, c, _)| (l.clone(), *c)),
    )?;
    counters(
        e,
        "skiff_lb_backend_sends",
        "Unconnected UDP datagrams sent to a backend since it was added.",
        backends.iter().map(|(l, _, s)| (l.clone(), *s)),
    )
}

/// The text of one scrape.
pub fn render(s: Scrape) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(s));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        // Writing into a String fails only if an encoder refuses a value.
        out.push_str(&format!("# encoding the metrics failed: {e}\n# EOF\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use skiff_client::node_api::{
        BpfBackend, BpfMapPressure, BpfProgramming, BpfService, NetworkStats, PodStats,
    };

    use super::*;
    use crate::proxy::Histogram;

    fn summary(network: Option<NetworkStats>) -> StatsSummary {
        StatsSummary {
            node_name: "node-1".into(),
            timestamp: String::new(),
            pods: vec![PodStats {
                namespace: "default".into(),
                name: "web-1".into(),
                uid: "u1".into(),
                cpu_usage_usec: 0,
                network,
                ..Default::default()
            }],
            node: None,
        }
    }

    #[test]
    fn agent_metrics_without_lb_or_accounting() {
        let text = render(Scrape {
            summary: summary(None),
            pods_running: 1,
            lb: None,
            fast_path: None,
            policy: None,
            l2: None,
        });
        let version = env!("CARGO_PKG_VERSION");
        assert!(text.contains(&format!(
            "skiff_agent_info{{node=\"node-1\",version=\"{version}\"}} 1\n"
        )));
        assert!(text.contains("\nskiff_pods_running 1\n"), "{text}");
        assert!(text.contains("\nskiff_lb_up 0\n"), "{text}");
        assert!(!text.contains("skiff_lb_map"), "{text}");
        assert!(!text.contains("skiff_pod_network"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    fn lb_report(latency: &Histogram) -> BpfServices {
        let backend = |id: u32, address: &str, connects, sends| BpfBackend {
            id,
            slot: id - 1,
            ip: "10.244.1.5".into(),
            port: 8080,
            address: address.into(),
            connects,
            sends,
            ..BpfBackend::default()
        };
        BpfServices {
            node: "node-1".into(),
            services: vec![BpfService {
                id: 1,
                frontend: "10.96.0.10:80/TCP".into(),
                ip: "10.96.0.10".into(),
                port: 80,
                protocol: "TCP".into(),
                in_cluster: false,
                session_affinity: "None".into(),
                affinity_timeout_seconds: None,
                backends: vec![
                    backend(1, "10.244.1.5:8080", 7, 0),
                    backend(2, "10.244.1.6:8080", 3, 2),
                ],
                connects: 10,
                sends: 2,
                service: Some("default/web".into()),
                port_name: None,
            }],
            maps: vec![BpfMapPressure {
                map: "LB_SERVICES".into(),
                entries: 1,
                max_entries: 65536,
            }],
            programming: BpfProgramming {
                writes: 42,
                latency_micros: latency.snapshot(),
            },
        }
    }

    /// A scrape with every part running: traffic, the LB, the fast path and policies.
    fn full_scrape(latency: &Histogram) -> Scrape {
        Scrape {
            summary: summary(Some(NetworkStats {
                rx_bytes: 100,
                rx_packets: 2,
                tx_bytes: 300,
                tx_packets: 4,
            })),
            pods_running: 1,
            lb: Some(lb_report(latency)),
            fast_path: Some(FastPathCounters {
                redirect_peer: 5,
                redirect_neigh: 3,
                pass: 1,
                fib_fail: 0,
            }),
            policy: Some(vec![
                crate::netpol::VerdictCount {
                    policy: "x/deny-all".into(),
                    direction: "ingress",
                    reason: "denied",
                    packets: 3,
                    bytes: 180,
                },
                crate::netpol::VerdictCount {
                    policy: String::new(),
                    direction: "egress",
                    reason: "allowed-unisolated",
                    packets: 10,
                    bytes: 1000,
                },
            ]),
            l2: Some(vec![
                ("192.168.100.241".parse().unwrap(), true),
                ("192.168.100.242".parse().unwrap(), false),
            ]),
        }
    }

    #[test]
    fn agent_metrics_with_lb_and_accounting() {
        let mut latency = Histogram::default();
        latency.observe(Duration::from_micros(300));
        let text = render(full_scrape(&latency));
        for line in [
            "skiff_policy_up 1",
            "skiff_policy_packets_total{direction=\"ingress\",reason=\"denied\",policy=\"x/deny-all\"} 3",
            "skiff_policy_bytes_total{direction=\"egress\",reason=\"allowed-unisolated\",policy=\"\"} 1000",
            "skiff_lb_up 1",
            "skiff_lb_frontends 1",
            "skiff_lb_map_writes_total 42",
            "skiff_lb_map_entries{map=\"LB_SERVICES\"} 1",
            "skiff_lb_map_max_entries{map=\"LB_SERVICES\"} 65536",
            "skiff_lb_backend_connects_total{service=\"default/web\",port_name=\"\",\
             frontend=\"10.96.0.10:80/TCP\",backend=\"10.244.1.5:8080\"} 7",
            "skiff_lb_backend_sends_total{service=\"default/web\",port_name=\"\",\
             frontend=\"10.96.0.10:80/TCP\",backend=\"10.244.1.6:8080\"} 2",
            "skiff_lb_programming_latency_seconds_bucket{le=\"0.00025\"} 0",
            "skiff_lb_programming_latency_seconds_bucket{le=\"0.0005\"} 1",
            "skiff_lb_programming_latency_seconds_bucket{le=\"+Inf\"} 1",
            "skiff_lb_programming_latency_seconds_sum 0.0003",
            "skiff_lb_programming_latency_seconds_count 1",
            "# TYPE skiff_lb_programming_latency_seconds histogram",
            "# TYPE skiff_lb_backend_connects counter",
            "# TYPE skiff_lb_frontends gauge",
            "skiff_pod_network_receive_bytes_total{namespace=\"default\",pod=\"web-1\"} 100",
            "skiff_pod_network_receive_packets_total{namespace=\"default\",pod=\"web-1\"} 2",
            "skiff_pod_network_transmit_bytes_total{namespace=\"default\",pod=\"web-1\"} 300",
            "skiff_pod_network_transmit_packets_total{namespace=\"default\",pod=\"web-1\"} 4",
            "skiff_fastpath_packets_total{action=\"redirect_peer\"} 5",
            "skiff_fastpath_packets_total{action=\"redirect_neigh\"} 3",
            "skiff_fastpath_packets_total{action=\"pass\"} 1",
            "skiff_fastpath_packets_total{action=\"fib_fail\"} 0",
            "# TYPE skiff_fastpath_packets counter",
            "skiff_l2_announcing{address=\"192.168.100.241\"} 1",
            "skiff_l2_announcing{address=\"192.168.100.242\"} 0",
            "# TYPE skiff_l2_announcing gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert_well_formed(&text);
    }

    /// Every family has exactly one HELP and one TYPE; the latency histogram's buckets
    /// ascend and end with +Inf.
    fn assert_well_formed(text: &str) {
        // Every family has exactly one HELP and one TYPE, before its samples.
        let types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap_or_default())
            .collect();
        let mut unique = types.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(types.len(), unique.len(), "each family once: {types:?}");
        assert_eq!(
            text.lines().filter(|l| l.starts_with("# HELP ")).count(),
            types.len()
        );
        // Buckets ascend, counts never decrease, the last is +Inf with the count.
        let buckets: Vec<(f64, u64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("skiff_lb_programming_latency_seconds_bucket{le=\""))
            .map(|l| {
                let (le, rest) = l.split_once('"').unwrap_or_default();
                let n = rest.rsplit(' ').next().unwrap_or_default();
                (
                    if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().unwrap()
                    },
                    n.parse().unwrap(),
                )
            })
            .collect();
        assert_eq!(buckets.len(), 17, "16 bounds and +Inf");
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
        );
    }

    #[test]
    fn output_is_stable_and_escaped() {
        let mut s = summary(Some(NetworkStats::default()));
        s.pods.push(PodStats {
            namespace: "a\"b\\c\nd".into(),
            name: "x".into(),
            ..s.pods[0].clone()
        });
        let scrape = |pods: Vec<PodStats>| Scrape {
            summary: StatsSummary { pods, ..s.clone() },
            pods_running: 2,
            lb: None,
            fast_path: None,
            policy: None,
            l2: None,
        };
        let mut reversed = s.pods.clone();
        reversed.reverse();
        let text = render(scrape(s.pods.clone()));
        assert_eq!(text, render(scrape(reversed)), "independent of input order");
        assert!(
            text.contains("{namespace=\"a\\\"b\\\\c\\nd\",pod=\"x\"} 0"),
            "label values escaped:\n{text}"
        );
    }
}
