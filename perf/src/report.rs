//! What a suite produces: series of samples (Skiff's and the baselines'), their percentiles,
//! the Skiff/baseline ratios, and how to print them (a table on stdout, a markdown report and
//! the raw numbers as JSON).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::plot::Plot;
use crate::stats::Summary;

/// Whose numbers a series holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Skiff,
    Baseline,
    /// A part of a Skiff measurement, shown for diagnosis; no ratio.
    Detail,
}

/// One measured series.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub name: String,
    pub role: Role,
    /// What one sample is, from which event to which.
    pub measures: String,
    pub summary: Summary,
    /// Every sample, in the order the items were started.
    pub samples_ms: Vec<f64>,
    /// Wall time of the whole measured phase (all items, with the run's concurrency); none
    /// for a [`Role::Detail`] series.
    pub wall_ms: Option<f64>,
    /// Items per second over the wall time, for suites that measure throughput.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput_per_s: Option<f64>,
    /// The comparison this series belongs to (e.g. `10k services, TCP_CRR`): ratios are taken
    /// only between series of the same group, and the report prints one table per group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Where the series sits on a numeric axis shared with other groups (e.g. 10000 on
    /// "services"): the report then also plots its percentiles against that axis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x: Option<XPoint>,
}

/// A series' place on a line chart (see [`Series::at_x`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct XPoint {
    /// The line chart (e.g. `TCP_CRR`): series with the same chart and axis share one, one
    /// line per series name.
    pub chart: String,
    /// What the axis counts (e.g. `services`).
    pub axis: String,
    pub value: f64,
}

impl Series {
    /// `samples` must not be empty.
    pub fn new(
        name: &str,
        role: Role,
        measures: &str,
        samples: &[Duration],
        wall: Option<Duration>,
    ) -> Result<Series> {
        let summary = Summary::of(samples).with_context(|| format!("series {name}: no samples"))?;
        Ok(Series {
            name: name.to_string(),
            role,
            measures: measures.to_string(),
            summary,
            samples_ms: samples.iter().map(|d| d.as_secs_f64() * 1e3).collect(),
            wall_ms: wall.map(|w| w.as_secs_f64() * 1e3),
            throughput_per_s: None,
            group: None,
            x: None,
        })
    }

    /// The series as part of comparison `group` (see [`Series::group`]).
    pub fn in_group(mut self, group: impl Into<String>) -> Series {
        self.group = Some(group.into());
        self
    }

    /// The series at `value` on axis `axis` of line chart `chart` (see [`XPoint`]).
    pub fn at_x(mut self, chart: impl Into<String>, axis: impl Into<String>, value: f64) -> Series {
        self.x = Some(XPoint {
            chart: chart.into(),
            axis: axis.into(),
            value,
        });
        self
    }

    /// The series with its throughput: `items` over `wall`.
    pub fn with_throughput(mut self, items: usize, wall: Duration) -> Series {
        let secs = wall.as_secs_f64();
        self.throughput_per_s = (secs > 0.0).then(|| items as f64 / secs);
        self
    }
}

/// Skiff's percentile divided by a baseline's (and, for throughput suites, Skiff's
/// throughput as a share of the baseline's).
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub skiff: String,
    pub baseline: String,
    pub p50: f64,
    pub p99: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput: Option<f64>,
}

/// Where and with what the numbers were taken.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Environment {
    pub commit: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub kernel: String,
    /// `/proc/loadavg` when the suite started: other work on a shared machine adds noise.
    pub loadavg: String,
    /// `release` or `debug`: how the bench and the binaries it runs were built.
    pub profile: String,
    /// Executable of each process the suite started, as the kernel reports it.
    pub binaries: BTreeMap<String, String>,
}

/// What a suite measured, for [`SuiteReport::new`].
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub quick: bool,
    pub params: BTreeMap<String, serde_json::Value>,
    pub series: Vec<Series>,
    pub notes: Vec<String>,
    pub details: BTreeMap<String, serde_json::Value>,
}

/// The outcome of one suite run.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteReport {
    pub suite: String,
    pub title: String,
    /// Day of the run (UTC), `YYYY-MM-DD`.
    pub date: String,
    /// Start of the run, RFC 3339 (UTC).
    pub started_at: String,
    pub quick: bool,
    pub environment: Environment,
    pub params: BTreeMap<String, serde_json::Value>,
    pub series: Vec<Series>,
    pub ratios: Vec<Ratio>,
    /// Method notes for the reader of the report.
    pub notes: Vec<String>,
    /// More raw numbers, for the JSON only (e.g. every repetition of a measurement whose
    /// median the series show).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, serde_json::Value>,
}

impl SuiteReport {
    /// A report of suite `suite` started at `started_at`, with what was measured and how, and
    /// the ratios of every Skiff series to every baseline series computed.
    pub fn new(
        suite: &str,
        title: &str,
        started_at: chrono::DateTime<chrono::Utc>,
        environment: Environment,
        measured: Measured,
    ) -> Self {
        let mut report = SuiteReport {
            suite: suite.into(),
            title: title.into(),
            date: started_at.format("%Y-%m-%d").to_string(),
            started_at: started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            quick: measured.quick,
            environment,
            params: measured.params,
            series: measured.series,
            ratios: Vec::new(),
            notes: measured.notes,
            details: measured.details,
        };
        report.compute_ratios();
        report
    }

    /// Fills in the ratios: every Skiff series against every baseline series of its group.
    pub fn compute_ratios(&mut self) {
        self.ratios.clear();
        for s in self.series.iter().filter(|s| s.role == Role::Skiff) {
            for b in self
                .series
                .iter()
                .filter(|b| b.role == Role::Baseline && b.group == s.group)
            {
                self.ratios.push(Ratio {
                    group: s.group.clone(),
                    skiff: s.name.clone(),
                    baseline: b.name.clone(),
                    p50: s.summary.p50 / b.summary.p50,
                    p99: s.summary.p99 / b.summary.p99,
                    throughput: s
                        .throughput_per_s
                        .zip(b.throughput_per_s)
                        .map(|(s, b)| s / b),
                });
            }
        }
    }

    /// The plain-text table printed at the end of a run.
    pub fn table(&self) -> String {
        let width = self
            .series
            .iter()
            .map(|s| s.name.len())
            .chain(["series".len()])
            .max()
            .unwrap_or(0);
        let suite_w = self.suite.len().max("suite".len());
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<suite_w$}  {:<width$}  {:>4}  {:>10}  {:>10}  {:>10}  {:>10}",
            "suite", "series", "N", "p50 ms", "p90 ms", "p99 ms", "max ms"
        );
        let mut group = None;
        for s in &self.series {
            if s.group.is_some() && s.group != group {
                let _ = writeln!(out, "-- {}", s.group.as_deref().unwrap_or_default());
                group = s.group.clone();
            }
            let m = &s.summary;
            let _ = writeln!(
                out,
                "{:<suite_w$}  {:<width$}  {:>4}  {:>10}  {:>10}  {:>10}  {:>10}",
                self.suite,
                s.name,
                m.n,
                fmt_ms(m.p50),
                fmt_ms(m.p90),
                fmt_ms(m.p99),
                fmt_ms(m.max)
            );
        }
        for s in &self.series {
            if let Some(t) = s.throughput_per_s {
                let _ = writeln!(out, "throughput {}{}: {t:.0}/s", s.name, in_group(&s.group));
            }
        }
        for r in &self.ratios {
            let _ = write!(
                out,
                "ratio {} / {}{}: p50 {}, p99 {}",
                r.skiff,
                r.baseline,
                in_group(&r.group),
                fmt_ratio(r.p50),
                fmt_ratio(r.p99)
            );
            if let Some(t) = r.throughput {
                let _ = write!(out, ", throughput {}", fmt_share(t));
            }
            out.push('\n');
        }
        out
    }

    fn has_throughput(&self) -> bool {
        self.series.iter().any(|s| s.throughput_per_s.is_some())
    }

    /// The groups of the series, in order of first appearance (`None`: series without one).
    pub fn groups(&self) -> Vec<Option<String>> {
        let mut out: Vec<Option<String>> = Vec::new();
        for s in &self.series {
            if !out.contains(&s.group) {
                out.push(s.group.clone());
            }
        }
        out
    }

    /// One group's series table and ratio table.
    fn tables(&self, md: &mut String, series: &[&Series], ratios: &[&Ratio]) {
        let throughput = self.has_throughput();
        let (t_head, t_rule) = if throughput {
            (" per s |", "---:|")
        } else {
            ("", "")
        };
        let _ = writeln!(
            md,
            "| series | N | p50 ms | p90 ms | p99 ms | max ms | mean ms | wall ms |{t_head}"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|{t_rule}");
        for s in series {
            let m = &s.summary;
            let _ = write!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                s.name,
                m.n,
                fmt_ms(m.p50),
                fmt_ms(m.p90),
                fmt_ms(m.p99),
                fmt_ms(m.max),
                fmt_ms(m.mean),
                s.wall_ms.map_or_else(|| "–".to_string(), fmt_ms)
            );
            if throughput {
                let _ = write!(
                    md,
                    " {} |",
                    s.throughput_per_s
                        .map_or_else(|| "–".to_string(), |t| format!("{t:.0}"))
                );
            }
            md.push('\n');
        }
        if !ratios.is_empty() {
            let (t_head, t_rule) = if throughput {
                (" throughput |", "---:|")
            } else {
                ("", "")
            };
            let _ = writeln!(
                md,
                "\n| ratio | p50 | p99 |{t_head}\n|---|---:|---:|{t_rule}"
            );
            for r in ratios {
                let _ = write!(
                    md,
                    "| {} / {} | {} | {} |",
                    r.skiff,
                    r.baseline,
                    fmt_ratio(r.p50),
                    fmt_ratio(r.p99)
                );
                if throughput {
                    let _ = write!(
                        md,
                        " {} |",
                        r.throughput.map_or_else(|| "–".into(), fmt_share)
                    );
                }
                md.push('\n');
            }
        }
    }

    /// The markdown report.
    pub fn markdown(&self, json_name: &str) -> String {
        self.markdown_with_plots(json_name, &[])
    }

    /// The markdown report, embedding the charts `plots` (files next to it).
    pub fn markdown_with_plots(&self, json_name: &str, plots: &[Plot]) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# {}: {} ({})\n", self.suite, self.title, self.date);
        if self.quick {
            let _ = writeln!(
                md,
                "**Quick run** (a smoke check of the benchmark, not a measurement).\n"
            );
        }
        for group in self.groups() {
            if let Some(g) = &group {
                let _ = writeln!(md, "### {g}\n");
            }
            let series: Vec<&Series> = self.series.iter().filter(|s| s.group == group).collect();
            let ratios: Vec<&Ratio> = self.ratios.iter().filter(|r| r.group == group).collect();
            self.tables(&mut md, &series, &ratios);
            md.push('\n');
        }
        if !plots.is_empty() {
            let _ = writeln!(md, "## Charts\n");
            for p in plots {
                let _ = writeln!(md, "![{}]({})\n", p.title, p.file);
            }
        }
        let _ = writeln!(md, "\n## What is measured\n");
        for s in &self.series {
            let _ = writeln!(md, "- **{}**: {}", s.name, s.measures);
        }
        for n in &self.notes {
            let _ = writeln!(md, "- {n}");
        }
        let _ = writeln!(md, "\n## Parameters\n");
        for (k, v) in &self.params {
            let _ = writeln!(md, "- {k}: {v}");
        }
        let e = &self.environment;
        let _ = writeln!(md, "\n## Environment\n");
        let _ = writeln!(md, "- started: {}", self.started_at);
        let _ = writeln!(md, "- commit: {}", e.commit);
        let _ = writeln!(md, "- host: {} CPUs, {}", e.cpus, e.cpu_model);
        let _ = writeln!(md, "- kernel: {}", e.kernel);
        let _ = writeln!(md, "- load average at start: {}", e.loadavg);
        let _ = writeln!(md, "- build profile: {}", e.profile);
        for (what, exe) in &e.binaries {
            let _ = writeln!(md, "- {what}: `{exe}`");
        }
        let _ = writeln!(
            md,
            "\nAbsolute times on a small shared machine are noise; compare the ratios. \
             Raw samples: `{json_name}`."
        );
        md
    }

    /// Writes `<dir>/<date>-<suite>.md` and `.json`, and the charts as
    /// `<date>-<suite>-<n>.png` (embedded in the markdown; none without a font, see
    /// [`crate::plot`]); returns the paths of the markdown and the JSON.
    pub fn write(&self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let stem = format!("{}-{}", self.date, self.suite);
        let json_path = dir.join(format!("{stem}.json"));
        let md_path = dir.join(format!("{stem}.md"));
        let json = serde_json::to_string_pretty(self).context("encoding the report")?;
        std::fs::write(&json_path, json + "\n")
            .with_context(|| format!("writing {}", json_path.display()))?;
        let plots = crate::plot::write_plots(self, dir, &stem)?;
        std::fs::write(
            &md_path,
            self.markdown_with_plots(&format!("{stem}.json"), &plots),
        )
        .with_context(|| format!("writing {}", md_path.display()))?;
        Ok((md_path, json_path))
    }
}

/// The sections of the whole benchmark report, in order: (number, title).
pub const SECTIONS: &[(u8, &str)] = &[
    (1, "Service load balancing versus number of services"),
    (2, "Programming time"),
    (3, "Pod networking"),
    (4, "Pods: start latency and density"),
    (5, "Control plane"),
];

/// One suite's entry in the whole report: its section, its report, and the file name of its
/// markdown (for the link).
#[derive(Debug)]
pub struct IndexEntry<'a> {
    pub section: u8,
    pub report: &'a SuiteReport,
    pub markdown: String,
}

/// `<date>-report.md`: every section with each suite's ratios (Skiff against each baseline,
/// per comparison) and a link to the suite's full report, tables and charts.
pub fn index_markdown(date: &str, entries: &[IndexEntry<'_>]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Skiff benchmarks ({date})
"
    );
    let _ = writeln!(
        md,
        "Every suite runs its baselines and Skiff in the same run on the same machine; the \
         ratios below are Skiff's value divided by the baseline's (below 1x: Skiff is faster \
         for latencies; for throughput the share of the baseline's rate). Reproduce with \
         `cargo xtask bench` (as root).\n"
    );
    for &(n, title) in SECTIONS {
        let _ = writeln!(md, "## {n}. {title}\n");
        let mut any = false;
        for e in entries.iter().filter(|e| e.section == n) {
            any = true;
            let r = e.report;
            let _ = writeln!(md, "### [{}: {}]({})\n", r.suite, r.title, e.markdown);
            if r.quick {
                let _ = writeln!(md, "**Quick run**: not a measurement.\n");
            }
            if r.ratios.is_empty() {
                let _ = writeln!(md, "(no ratios: see the suite's report)\n");
                continue;
            }
            let _ = writeln!(
                md,
                "| comparison | Skiff / baseline | p50 | p99 | throughput |\n|---|---|---:|---:|---:|"
            );
            for q in &r.ratios {
                let _ = writeln!(
                    md,
                    "| {} | {} / {} | {} | {} | {} |",
                    q.group.as_deref().unwrap_or("–"),
                    q.skiff,
                    q.baseline,
                    fmt_ratio(q.p50),
                    fmt_ratio(q.p99),
                    q.throughput.map_or_else(|| "–".into(), fmt_share)
                );
            }
            md.push('\n');
        }
        if !any {
            let _ = writeln!(md, "(not run)\n");
        }
    }
    md
}

/// ` (group)` for the plain-text table, or nothing.
fn in_group(group: &Option<String>) -> String {
    group
        .as_ref()
        .map(|g| format!(" ({g})"))
        .unwrap_or_default()
}

/// Milliseconds with a precision that suits their size.
pub fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.1}")
    } else if ms >= 1.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.3}")
    }
}

/// A ratio as a percentage: `0.85` → `85%`.
pub fn fmt_share(r: f64) -> String {
    if r.is_finite() {
        format!("{:.0}%", r * 100.0)
    } else {
        "n/a".into()
    }
}

pub fn fmt_ratio(r: f64) -> String {
    if !r.is_finite() {
        "n/a".into()
    } else if r >= 100.0 {
        format!("{r:.0}x")
    } else if r >= 0.095 || r <= 0.0 {
        format!("{r:.1}x")
    } else if r >= 0.01 {
        format!("{r:.3}x")
    } else {
        // 1/120482 reads better than 0.0000083x.
        format!("1/{:.0}", 1.0 / r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> SuiteReport {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        let mut r = SuiteReport {
            suite: "pod-start".into(),
            title: "pod start latency".into(),
            date: "2026-01-02".into(),
            started_at: "2026-01-02T03:04:05Z".into(),
            quick: false,
            environment: Environment::default(),
            params: BTreeMap::from([("pods".to_string(), serde_json::json!(3))]),
            series: vec![
                Series::new(
                    "skiff",
                    Role::Skiff,
                    "create → Running",
                    &ms(&[100, 200, 300]),
                    Some(Duration::from_millis(400)),
                )
                .unwrap(),
                Series::new(
                    "fork+exec",
                    Role::Baseline,
                    "spawn",
                    &ms(&[1, 2, 3]),
                    Some(Duration::from_millis(5)),
                )
                .unwrap(),
                Series::new("skiff part", Role::Detail, "a part", &ms(&[1]), None).unwrap(),
            ],
            ratios: vec![],
            notes: vec!["a note".into()],
            details: BTreeMap::new(),
        };
        r.compute_ratios();
        r
    }

    #[test]
    fn ratios_are_skiff_over_baseline() {
        let r = report();
        assert_eq!(r.ratios.len(), 1, "details get no ratio");
        assert_eq!(r.ratios[0].p50, 100.0);
        assert_eq!(r.ratios[0].p99, 100.0);
    }

    #[test]
    fn table_and_markdown_name_every_series() {
        let r = report();
        let t = r.table();
        assert!(t.contains("pod-start  skiff"), "{t}");
        assert!(
            t.contains("ratio skiff / fork+exec: p50 100x, p99 100x"),
            "{t}"
        );
        let md = r.markdown("x.json");
        assert!(md.contains("| skiff | 3 | 200.0 | 300.0 | 300.0 | 300.0 | 200.0 | 400.0 |"));
        assert!(md.contains("| skiff / fork+exec | 100x | 100x |"), "{md}");
        assert!(md.contains("| skiff part | 1 | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 | – |"));
        assert!(md.contains("- a note"));
        assert!(md.contains("`x.json`"));
    }

    #[test]
    fn throughput_series_and_share() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        let mut r = report();
        r.series[0] = r.series[0]
            .clone()
            .with_throughput(300, Duration::from_secs(2));
        r.series[1] = Series::new("binder", Role::Baseline, "x", &ms(&[1, 2]), None)
            .unwrap()
            .with_throughput(300, Duration::from_secs(1));
        r.compute_ratios();
        assert_eq!(r.series[0].throughput_per_s, Some(150.0));
        assert_eq!(r.ratios[0].throughput, Some(0.5));
        let t = r.table();
        assert!(t.contains("throughput skiff: 150/s"), "{t}");
        assert!(
            t.ends_with("ratio skiff / binder: p50 200x, p99 150x, throughput 50%\n"),
            "{t}"
        );
        let md = r.markdown("x.json");
        assert!(md.contains("| wall ms | per s |"), "{md}");
        assert!(md.contains("| 400.0 | 150 |"), "{md}");
        assert!(
            md.contains("| skiff / binder | 200x | 150x | 50% |"),
            "{md}"
        );
        assert!(
            md.contains("| 1.00 | – | – |"),
            "the detail has no wall time or throughput:\n{md}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["series"][0]["throughput_per_s"], 150.0);
        assert!(json["series"][2].get("throughput_per_s").is_none());
        // Latency-only reports look as before.
        assert!(!report().markdown("x.json").contains("per s"));
    }

    #[test]
    fn ratios_stay_within_a_group_and_each_group_gets_a_table() {
        let one = |name: &str, role, group: &str, v: u64| {
            Series::new(name, role, "x", &[Duration::from_millis(v)], None)
                .unwrap()
                .in_group(group)
        };
        let mut r = report();
        r.series = vec![
            one("skiff", Role::Skiff, "1 service", 2),
            one("iptables", Role::Baseline, "1 service", 4),
            one("skiff", Role::Skiff, "10k services", 3),
            one("iptables", Role::Baseline, "10k services", 30),
        ];
        r.compute_ratios();
        assert_eq!(r.ratios.len(), 2);
        assert_eq!(r.ratios[0].group.as_deref(), Some("1 service"));
        assert!((r.ratios[0].p50 - 0.5).abs() < 1e-9);
        assert!((r.ratios[1].p50 - 0.1).abs() < 1e-9);
        let md = r.markdown("x.json");
        let a = md.find("### 1 service").unwrap();
        let b = md.find("### 10k services").unwrap();
        assert!(a < b);
        assert_eq!(md.matches("| ratio |").count(), 2);
        let t = r.table();
        assert!(t.contains("-- 10k services\n"), "{t}");
        assert!(
            t.contains("ratio skiff / iptables (1 service): p50 0.5x"),
            "{t}"
        );
    }

    #[test]
    fn index_has_every_section_and_each_suites_ratios() {
        let r = report();
        let entries = [IndexEntry {
            section: 4,
            report: &r,
            markdown: "2026-01-02-pod-start.md".into(),
        }];
        let md = index_markdown("2026-01-02", &entries);
        for (n, title) in SECTIONS {
            assert!(md.contains(&format!("## {n}. {title}")), "{md}");
        }
        assert_eq!(md.matches("(not run)").count(), SECTIONS.len() - 1);
        assert!(md.contains("(2026-01-02-pod-start.md)"));
        assert!(
            md.contains("| – | skiff / fork+exec | 100x | 100x | – |"),
            "{md}"
        );
    }

    #[test]
    fn number_formats() {
        assert_eq!(fmt_ms(123.456), "123.5");
        assert_eq!(fmt_ms(12.345), "12.35");
        assert_eq!(fmt_ms(0.1234), "0.123");
        assert_eq!(fmt_ratio(181.4), "181x");
        assert_eq!(fmt_ratio(2.54), "2.5x");
        assert_eq!(fmt_ratio(0.5), "0.5x");
        assert_eq!(fmt_ratio(0.0123), "0.012x");
        assert_eq!(fmt_ratio(0.00079), "1/1266");
        assert_eq!(fmt_ratio(f64::INFINITY), "n/a");
        assert_eq!(fmt_share(0.854), "85%");
    }

    #[test]
    fn write_creates_both_files() {
        let dir = std::env::temp_dir().join(format!("skiff-perf-test-{}", std::process::id()));
        let (md, json) = report().write(&dir).unwrap();
        assert!(md.ends_with("2026-01-02-pod-start.md"));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["series"][0]["samples_ms"][2], 300.0);
        assert_eq!(v["series"][1]["role"], "baseline");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A PNG's width and height from its IHDR chunk, after checking the signature.
    fn png_size(bytes: &[u8]) -> (u32, u32) {
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
        assert_eq!(&bytes[12..16], b"IHDR");
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        (be(&bytes[16..20]), be(&bytes[20..24]))
    }

    #[test]
    fn write_draws_a_bar_chart_per_group_and_a_line_chart_and_embeds_them() {
        assert!(
            crate::plot::font().is_some(),
            "no font in {:?} or ${}: `cargo xtask setup` installs fonts-dejavu-core",
            crate::plot::FONT_CANDIDATES,
            crate::plot::FONT_ENV,
        );
        let one = |name: &str, role, n: u64, v: u64| {
            Series::new(
                name,
                role,
                "x",
                &[Duration::from_millis(v), Duration::from_millis(2 * v)],
                None,
            )
            .unwrap()
            .in_group(format!("{n} services"))
            .at_x("TCP_CRR", "services", n as f64)
        };
        let mut r = report();
        r.series = vec![
            one("skiff", Role::Skiff, 1, 2),
            one("iptables", Role::Baseline, 1, 3),
            one("skiff", Role::Skiff, 1000, 2),
            one("iptables", Role::Baseline, 1000, 300),
        ];
        r.compute_ratios();
        let dir = std::env::temp_dir().join(format!("skiff-perf-plot-{}", std::process::id()));
        let (md, _) = r.write(&dir).unwrap();
        let md = std::fs::read_to_string(md).unwrap();
        for n in 1..=3 {
            let file = format!("2026-01-02-pod-start-{n}.png");
            assert!(md.contains(&format!("]({file})")), "{file} embedded:\n{md}");
            let bytes = std::fs::read(dir.join(&file)).unwrap();
            assert!(bytes.len() > 5_000, "{file}: only {} bytes", bytes.len());
            let (w, h) = png_size(&bytes);
            assert!(w >= 800 && h >= 400, "{file}: {w}x{h}");
        }
        assert!(!dir.join("2026-01-02-pod-start-4.png").exists());
        assert!(md.contains("![pod-start: TCP_CRR vs services]"), "{md}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
