//! `iperf3`: the TCP stream throughput tool the pod-net suite runs (server `iperf3 -s`, client
//! `iperf3 -c … -J`), and the parser of the client's JSON report.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// The port every iperf3 server of the suite listens on.
pub const PORT: u16 = 5201;

/// `iperf3 -s` on [`PORT`].
pub fn server_command() -> Vec<String> {
    ["iperf3", "-s", "-p", &PORT.to_string()]
        .map(String::from)
        .to_vec()
}

/// `iperf3 -c <server> -t <seconds> -i <interval> -J`: one TCP stream, client sends. iperf3
/// reads `-t` as a whole number (and `0` as "forever"), so `seconds` is one, at least 1.
pub fn client_command(server: &str, seconds: u32, interval: f64) -> Vec<String> {
    [
        "iperf3",
        "-c",
        server,
        "-p",
        &PORT.to_string(),
        "-t",
        &seconds.max(1).to_string(),
        "-i",
        &format!("{interval}"),
        "--connect-timeout",
        "5000",
        "-J",
    ]
    .map(String::from)
    .to_vec()
}

/// One reporting interval, as the sender saw it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub seconds: f64,
    pub bytes: u64,
}

/// What one client run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamResult {
    pub intervals: Vec<Interval>,
    /// Bytes the server received, and over how long (the headline throughput).
    pub received_bytes: u64,
    pub received_seconds: f64,
    pub retransmits: u64,
    /// CPU use of the client ("host") and server ("remote") processes, percent of one run.
    pub cpu_client_percent: f64,
    pub cpu_server_percent: f64,
    /// The sender's TCP congestion control (the namespace's default, e.g. `cubic`, `bbr`).
    pub congestion: String,
}

#[derive(Deserialize)]
struct Report {
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    intervals: Vec<ReportInterval>,
    /// Decoded only without an `error` (a failed run has an empty `end`).
    #[serde(default)]
    end: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ReportInterval {
    sum: Interval,
}

#[derive(Deserialize)]
struct End {
    sum_sent: Sum,
    sum_received: Sum,
    #[serde(default)]
    cpu_utilization_percent: Option<Cpu>,
    #[serde(default)]
    sender_tcp_congestion: String,
}

#[derive(Deserialize)]
struct Sum {
    seconds: f64,
    bytes: u64,
    #[serde(default)]
    retransmits: u64,
}

#[derive(Deserialize)]
struct Cpu {
    host_total: f64,
    remote_total: f64,
}

impl StreamResult {
    /// Parses the output of `iperf3 -c … -J`; fails on a report with an `error`, or without
    /// intervals or end sums.
    pub fn parse(json: &str) -> Result<StreamResult> {
        let r: Report = serde_json::from_str(json).context("parsing iperf3 -J output")?;
        if let Some(e) = r.error {
            bail!("iperf3: {e}");
        }
        let end: End = serde_json::from_value(r.end.context("iperf3 report without `end`")?)
            .context("iperf3 report: `end` without the sums")?;
        if r.intervals.is_empty() {
            bail!("iperf3 report without intervals");
        }
        if end.sum_received.seconds <= 0.0 || end.sum_received.bytes == 0 {
            bail!("iperf3 report: the server received nothing");
        }
        let cpu = end.cpu_utilization_percent;
        Ok(StreamResult {
            intervals: r.intervals.into_iter().map(|i| i.sum).collect(),
            received_bytes: end.sum_received.bytes,
            received_seconds: end.sum_received.seconds,
            retransmits: end.sum_sent.retransmits,
            cpu_client_percent: cpu.as_ref().map_or(0.0, |c| c.host_total),
            cpu_server_percent: cpu.as_ref().map_or(0.0, |c| c.remote_total),
            congestion: end.sender_tcp_congestion,
        })
    }

    /// Received throughput in Gbit/s.
    pub fn gbit_per_s(&self) -> f64 {
        self.received_bytes as f64 * 8.0 / self.received_seconds / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_client_report() {
        let r = StreamResult::parse(include_str!("../testdata/iperf3-client.json")).unwrap();
        assert_eq!(r.intervals.len(), 2);
        assert_eq!(r.intervals[0].bytes, 1_136_263_168);
        assert!((r.intervals[1].seconds - 0.500086).abs() < 1e-6);
        assert_eq!(r.received_bytes, 2_233_335_808);
        assert_eq!(r.retransmits, 5);
        assert!(
            (r.gbit_per_s() - 17.736).abs() < 0.001,
            "{}",
            r.gbit_per_s()
        );
        assert!((r.cpu_server_percent - 36.517).abs() < 0.001);
        assert_eq!(r.congestion, "bbr");
    }

    #[test]
    fn an_error_report_is_an_error() {
        let err = StreamResult::parse(include_str!("../testdata/iperf3-error.json")).unwrap_err();
        assert!(err.to_string().contains("Connection refused"), "{err}");
        assert!(StreamResult::parse("not json").is_err());
        assert!(StreamResult::parse(r#"{"intervals": [], "end": {}}"#).is_err());
    }

    #[test]
    fn commands() {
        assert_eq!(server_command().join(" "), "iperf3 -s -p 5201");
        let c = client_command("10.0.0.2", 4, 0.5).join(" ");
        assert_eq!(
            c,
            "iperf3 -c 10.0.0.2 -p 5201 -t 4 -i 0.5 --connect-timeout 5000 -J"
        );
        assert!(client_command("x", 0, 0.5).join(" ").contains("-t 1 "));
    }
}
