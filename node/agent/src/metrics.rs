//! The agent's metrics in the Prometheus text exposition format (version 0.0.4), for
//! `GET /metrics` (see [`super::api`]).
//!
//! Nothing is counted here: a scrape reads the same sources as the JSON endpoints
//! (`/stats/summary`'s [`StatsSummary`], `/bpf/services`' [`ServicesReport`]) and renders
//! them. [`Exposition`] is the (small) text encoder: families sorted by name, series by
//! label values, so the same state always gives the same text.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use skiff_client::node_api::StatsSummary;

use super::proxy::{HistogramSnapshot, ServicesReport};
use skiff_datapath::lb::FastPathCounters;

/// `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Cumulative histogram: `(upper bound, observations at or below it)`, ascending; the
/// `+Inf` bucket is added from `count` when rendering.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramValue {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl HistogramValue {
    /// The proxy's microsecond histogram, in seconds.
    pub fn from_micros(h: &HistogramSnapshot) -> Self {
        HistogramValue {
            buckets: h
                .buckets
                .iter()
                .filter_map(|b| b.le.map(|le| (le as f64 / 1e6, b.count)))
                .collect(),
            sum: h.sum as f64 / 1e6,
            count: h.count,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Number(f64),
    Histogram(HistogramValue),
}

/// Label values in the family's label order (the key that sorts the series).
type LabelValues = Vec<String>;

#[derive(Debug)]
struct Family {
    help: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    series: BTreeMap<LabelValues, Value>,
}

/// Metric families being rendered. Names and label names are the code's own (checked in
/// debug builds); label values are escaped.
#[derive(Debug, Default)]
pub struct Exposition {
    families: BTreeMap<&'static str, Family>,
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

impl Exposition {
    fn family(
        &mut self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: &'static [&'static str],
    ) -> &mut Family {
        debug_assert!(valid_name(name), "metric name {name:?}");
        debug_assert!(
            labels
                .iter()
                .all(|l| valid_name(l) && !l.starts_with("__") && *l != "le"),
            "label names of {name}: {labels:?}"
        );
        debug_assert!(
            kind != Kind::Counter || name.ends_with("_total"),
            "counter {name} must end in _total"
        );
        let family = self.families.entry(name).or_insert(Family {
            help,
            kind,
            labels,
            series: BTreeMap::new(),
        });
        debug_assert!(
            family.kind == kind && family.labels == labels,
            "{name} declared twice differently"
        );
        family
    }

    fn values(labels: &[&'static str], values: &[&str]) -> LabelValues {
        debug_assert_eq!(labels.len(), values.len(), "label values for {labels:?}");
        values.iter().map(|v| v.to_string()).collect()
    }

    /// Adds `value` to the counter series (a series given twice is summed).
    pub fn counter(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        values: &[&str],
        value: u64,
    ) {
        let key = Self::values(labels, values);
        let series = &mut self.family(name, help, Kind::Counter, labels).series;
        let v = series.entry(key).or_insert(Value::Number(0.0));
        if let Value::Number(n) = v {
            *n += value as f64;
        }
    }

    /// Sets the gauge series (a series given twice keeps the last value).
    pub fn gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        values: &[&str],
        value: f64,
    ) {
        let key = Self::values(labels, values);
        self.family(name, help, Kind::Gauge, labels)
            .series
            .insert(key, Value::Number(value));
    }

    /// Sets the histogram series.
    pub fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        values: &[&str],
        value: HistogramValue,
    ) {
        let key = Self::values(labels, values);
        self.family(name, help, Kind::Histogram, labels)
            .series
            .insert(key, Value::Histogram(value));
    }

    /// The text exposition: `# HELP`, `# TYPE` and the samples of each family, by name.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, f) in &self.families {
            let _ = writeln!(out, "# HELP {name} {}", escape_help(f.help));
            let _ = writeln!(out, "# TYPE {name} {}", f.kind.as_str());
            for (values, value) in &f.series {
                let pairs: Vec<(&str, &str)> = f
                    .labels
                    .iter()
                    .copied()
                    .zip(values.iter().map(String::as_str))
                    .collect();
                match value {
                    Value::Number(n) => sample(&mut out, name, "", &pairs, *n),
                    Value::Histogram(h) => {
                        let bucket = |out: &mut String, le: &str, count: u64| {
                            let mut with_le = pairs.clone();
                            with_le.push(("le", le));
                            sample(out, name, "_bucket", &with_le, count as f64);
                        };
                        for (le, count) in &h.buckets {
                            bucket(&mut out, &number(*le), *count);
                        }
                        bucket(&mut out, "+Inf", h.count);
                        sample(&mut out, name, "_sum", &pairs, h.sum);
                        sample(&mut out, name, "_count", &pairs, h.count as f64);
                    }
                }
            }
        }
        out
    }
}

fn sample(out: &mut String, name: &str, suffix: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape_label(v));
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&number(value));
    out.push('\n');
}

/// A sample value or `le` as the format writes it (integers without a fraction).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        // Rust's shortest round-trip form, which Go's ParseFloat reads back exactly.
        format!("{v}")
    }
}

/// Label values escape `\`, `"` and line feeds.
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Help texts escape `\` and line feeds.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// What one scrape reads: the stats summary (`/stats/summary`), how many of its pods have a
/// sandbox, and the Service load balancer's report (`/bpf/services`) and the pod fast path's
/// counters (`/bpf/pods`) if it runs.
#[derive(Debug)]
pub struct Scrape {
    pub summary: StatsSummary,
    pub pods_running: usize,
    pub lb: Option<ServicesReport>,
    pub fast_path: Option<FastPathCounters>,
}

const POD: &[&str] = &["namespace", "pod"];
const BACKEND: &[&str] = &["service", "port_name", "frontend", "backend"];

/// The agent's metrics (names and meanings in [`super::api`]'s documentation).
pub fn render(s: &Scrape) -> String {
    let mut e = Exposition::default();
    e.gauge(
        "skiff_agent_info",
        "The node agent: its node name and version.",
        &["node", "version"],
        &[&s.summary.node_name, env!("CARGO_PKG_VERSION")],
        1.0,
    );
    e.gauge(
        "skiff_pods_running",
        "Pods this agent runs that have a sandbox.",
        &[],
        &[],
        s.pods_running as f64,
    );
    for p in &s.summary.pods {
        // Absent when the traffic accounting is not loaded.
        let Some(n) = &p.network else { continue };
        let pod = [p.namespace.as_str(), p.name.as_str()];
        e.counter(
            "skiff_pod_network_receive_bytes_total",
            "Bytes received by the pod's containers (eBPF cgroup accounting).",
            POD,
            &pod,
            n.rx_bytes,
        );
        e.counter(
            "skiff_pod_network_receive_packets_total",
            "Packets received by the pod's containers (eBPF cgroup accounting).",
            POD,
            &pod,
            n.rx_packets,
        );
        e.counter(
            "skiff_pod_network_transmit_bytes_total",
            "Bytes sent by the pod's containers (eBPF cgroup accounting).",
            POD,
            &pod,
            n.tx_bytes,
        );
        e.counter(
            "skiff_pod_network_transmit_packets_total",
            "Packets sent by the pod's containers (eBPF cgroup accounting).",
            POD,
            &pod,
            n.tx_packets,
        );
    }
    e.gauge(
        "skiff_lb_up",
        "1 if the eBPF Service load balancer runs on this node, else 0.",
        &[],
        &[],
        if s.lb.is_some() { 1.0 } else { 0.0 },
    );
    if let Some(lb) = &s.lb {
        render_lb(&mut e, lb);
    }
    if let Some(fp) = &s.fast_path {
        for (action, n) in [
            ("redirect_peer", fp.redirect_peer),
            ("redirect_neigh", fp.redirect_neigh),
            ("pass", fp.pass),
            ("fib_fail", fp.fib_fail),
        ] {
            e.counter(
                "skiff_fastpath_packets_total",
                "Packets of the eBPF pod networking fast path: delivered into a local pod \
                 (redirect_peer), forwarded to the FIB's next hop (redirect_neigh), handed to \
                 the node's stack (pass), or handed to it after a failed FIB lookup (fib_fail).",
                &["action"],
                &[action],
                n,
            );
        }
    }
    e.render()
}

fn render_lb(e: &mut Exposition, lb: &ServicesReport) {
    for m in &lb.maps {
        e.gauge(
            "skiff_lb_map_entries",
            "Entries in a Service load balancer map.",
            &["map"],
            &[m.map],
            m.entries as f64,
        );
        e.gauge(
            "skiff_lb_map_max_entries",
            "Capacity of a Service load balancer map.",
            &["map"],
            &[m.map],
            f64::from(m.max_entries),
        );
    }
    e.gauge(
        "skiff_lb_frontends",
        "Frontends (Service IP, port, protocol) programmed in the load balancer.",
        &[],
        &[],
        lb.services.len() as f64,
    );
    e.counter(
        "skiff_lb_map_writes_total",
        "Load balancer map writes since the agent started.",
        &[],
        &[],
        lb.programming.writes,
    );
    e.histogram(
        "skiff_lb_programming_latency_seconds",
        "Time from a Service or Endpoints change seen to the load balancer maps written.",
        &[],
        &[],
        HistogramValue::from_micros(&lb.programming.latency_micros),
    );
    for svc in &lb.services {
        let service = svc.service.as_deref().unwrap_or("");
        let port_name = svc.port_name.as_deref().unwrap_or("");
        for b in &svc.lb.backends {
            let labels = [
                service,
                port_name,
                svc.lb.frontend.as_str(),
                b.address.as_str(),
            ];
            e.counter(
                "skiff_lb_backend_connects_total",
                "connect() calls (TCP, connected UDP) sent to a backend since it was added.",
                BACKEND,
                &labels,
                b.connects,
            );
            e.counter(
                "skiff_lb_backend_sends_total",
                "Unconnected UDP datagrams sent to a backend since it was added.",
                BACKEND,
                &labels,
                b.sends,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use skiff_client::node_api::{NetworkStats, PodStats};

    use super::*;
    use crate::proxy::{Histogram, ProgrammingStats, ServiceEntry};
    use skiff_datapath::lb::{BackendDump, MapPressure, ServiceDump};

    #[test]
    fn escapes_label_values_and_help() {
        let mut e = Exposition::default();
        e.gauge(
            "x_info",
            "a \\ b\nc",
            &["v"],
            &["quote\" back\\slash\nnew line"],
            1.0,
        );
        assert_eq!(
            e.render(),
            "# HELP x_info a \\\\ b\\nc\n\
             # TYPE x_info gauge\n\
             x_info{v=\"quote\\\" back\\\\slash\\nnew line\"} 1\n"
        );
    }

    #[test]
    fn histogram_has_cumulative_buckets_inf_sum_and_count() {
        let mut h = Histogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(700));
        h.observe(Duration::from_secs(60));
        let mut e = Exposition::default();
        e.histogram(
            "lat_seconds",
            "Latency.",
            &["k"],
            &["a"],
            HistogramValue::from_micros(&h.snapshot()),
        );
        let text = e.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# HELP lat_seconds Latency.");
        assert_eq!(lines[1], "# TYPE lat_seconds histogram");
        assert_eq!(lines[2], "lat_seconds_bucket{k=\"a\",le=\"0.0001\"} 1");
        assert_eq!(lines[3], "lat_seconds_bucket{k=\"a\",le=\"0.00025\"} 1");
        assert!(lines.contains(&"lat_seconds_bucket{k=\"a\",le=\"0.001\"} 2"));
        assert!(lines.contains(&"lat_seconds_bucket{k=\"a\",le=\"10\"} 2"));
        let n = lines.len();
        assert_eq!(lines[n - 3], "lat_seconds_bucket{k=\"a\",le=\"+Inf\"} 3");
        assert_eq!(lines[n - 2], "lat_seconds_sum{k=\"a\"} 60.00075");
        assert_eq!(lines[n - 1], "lat_seconds_count{k=\"a\"} 3");
        // 16 finite bounds + Inf, then sum and count.
        assert_eq!(n, 2 + 17 + 2);
        // Bucket bounds ascend and counts never decrease.
        let buckets: Vec<(f64, f64)> = lines[2..n - 3]
            .iter()
            .map(|l| {
                let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
                let v = l.rsplit(' ').next().unwrap();
                (le.parse().unwrap(), v.parse().unwrap())
            })
            .collect();
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
        );
    }

    #[test]
    fn output_is_sorted_and_stable() {
        let fill = |order: &[usize]| {
            let mut e = Exposition::default();
            for i in order {
                let v = ["b", "a", "c"][*i];
                e.counter("z_total", "Z.", &["l"], &[v], *i as u64);
                e.gauge("a_gauge", "A.", &["l"], &[v], 0.5);
            }
            // Counters given twice add up.
            e.counter("z_total", "Z.", &["l"], &["a"], 10);
            e.render()
        };
        let text = fill(&[0, 1, 2]);
        assert_eq!(text, fill(&[2, 1, 0]), "independent of insertion order");
        assert_eq!(
            text,
            "# HELP a_gauge A.\n# TYPE a_gauge gauge\n\
             a_gauge{l=\"a\"} 0.5\na_gauge{l=\"b\"} 0.5\na_gauge{l=\"c\"} 0.5\n\
             # HELP z_total Z.\n# TYPE z_total counter\n\
             z_total{l=\"a\"} 11\nz_total{l=\"b\"} 0\nz_total{l=\"c\"} 2\n"
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(1e-4), "0.0001");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(
            number(u64::MAX as f64).parse::<f64>().unwrap(),
            u64::MAX as f64
        );
    }

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
            }],
        }
    }

    #[test]
    fn agent_metrics_without_lb_or_accounting() {
        let text = render(&Scrape {
            summary: summary(None),
            pods_running: 1,
            lb: None,
            fast_path: None,
        });
        let version = env!("CARGO_PKG_VERSION");
        assert!(text.contains(&format!(
            "skiff_agent_info{{node=\"node-1\",version=\"{version}\"}} 1\n"
        )));
        assert!(text.contains("\nskiff_pods_running 1\n"), "{text}");
        assert!(text.contains("\nskiff_lb_up 0\n"), "{text}");
        assert!(!text.contains("skiff_lb_map"), "{text}");
        assert!(!text.contains("skiff_pod_network"), "{text}");
    }

    #[test]
    fn agent_metrics_with_lb_and_accounting() {
        let mut latency = Histogram::default();
        latency.observe(Duration::from_micros(300));
        let backend = |id, address: &str, connects, sends| BackendDump {
            id,
            slot: id - 1,
            ip: "10.244.1.5".parse().unwrap(),
            port: 8080,
            address: address.into(),
            connects,
            sends,
        };
        let lb = ServicesReport {
            node: "node-1".into(),
            services: vec![ServiceEntry {
                lb: ServiceDump {
                    id: 1,
                    frontend: "10.96.0.10:80/TCP".into(),
                    ip: "10.96.0.10".parse().unwrap(),
                    port: 80,
                    protocol: "TCP",
                    session_affinity: "None",
                    affinity_timeout_seconds: None,
                    backends: vec![
                        backend(1, "10.244.1.5:8080", 7, 0),
                        backend(2, "10.244.1.6:8080", 3, 2),
                    ],
                    connects: 10,
                    sends: 2,
                },
                service: Some("default/web".into()),
                port_name: None,
            }],
            maps: vec![MapPressure {
                map: "LB_SERVICES",
                entries: 1,
                max_entries: 65536,
            }],
            programming: ProgrammingStats {
                writes: 42,
                latency_micros: latency.snapshot(),
            },
        };
        let text = render(&Scrape {
            summary: summary(Some(NetworkStats {
                rx_bytes: 100,
                rx_packets: 2,
                tx_bytes: 300,
                tx_packets: 4,
            })),
            pods_running: 1,
            lb: Some(lb),
            fast_path: Some(FastPathCounters {
                redirect_peer: 5,
                redirect_neigh: 3,
                pass: 1,
                fib_fail: 0,
            }),
        });
        for line in [
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
            "# TYPE skiff_lb_backend_connects_total counter",
            "# TYPE skiff_lb_frontends gauge",
            "skiff_pod_network_receive_bytes_total{namespace=\"default\",pod=\"web-1\"} 100",
            "skiff_pod_network_receive_packets_total{namespace=\"default\",pod=\"web-1\"} 2",
            "skiff_pod_network_transmit_bytes_total{namespace=\"default\",pod=\"web-1\"} 300",
            "skiff_pod_network_transmit_packets_total{namespace=\"default\",pod=\"web-1\"} 4",
            "skiff_fastpath_packets_total{action=\"redirect_peer\"} 5",
            "skiff_fastpath_packets_total{action=\"redirect_neigh\"} 3",
            "skiff_fastpath_packets_total{action=\"pass\"} 1",
            "skiff_fastpath_packets_total{action=\"fib_fail\"} 0",
            "# TYPE skiff_fastpath_packets_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        // Every family has exactly one HELP and one TYPE, before its samples.
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let mut sorted = families.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(families, sorted, "families sorted, each once");
        assert_eq!(
            text.lines().filter(|l| l.starts_with("# HELP ")).count(),
            families.len()
        );
    }
}
