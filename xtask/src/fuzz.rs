//! `cargo xtask fuzz`: runs the cargo-fuzz targets for a bounded time and reports how many
//! inputs each executed. The `fuzz` test tier runs it for [`TIER_SECONDS`] per target, so
//! every CI run fuzzes the REST decoders a little further from the checked-in seeds.
//!
//! A target lives in a crate's `fuzz/` directory (its own nightly workspace); libFuzzer
//! writes the inputs it finds to `fuzz/corpus/<target>` (not checked in) and a crashing
//! input to `fuzz/artifacts/<target>`, whose path it prints; the tier then fails.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::util;

/// Seconds per target in the test tier.
pub const TIER_SECONDS: u64 = 60;

/// A fuzz target: the crate directory holding `fuzz/`, and the target's name.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub crate_dir: &'static str,
    pub name: &'static str,
}

/// Every fuzz target of the workspace.
pub const TARGETS: &[Target] = &[
    Target {
        crate_dir: "control/apiserver",
        name: "rest_decoders",
    },
    Target {
        crate_dir: "control/apiserver",
        name: "auth_parsers",
    },
    Target {
        crate_dir: "node/dns",
        name: "dns_queries",
    },
    Target {
        crate_dir: "node/image",
        name: "image_layers",
    },
    Target {
        crate_dir: "node/runtime",
        name: "volume_paths",
    },
];

#[derive(Debug, Clone, clap::Args)]
pub struct FuzzArgs {
    /// Only this target (default: all of them).
    #[arg(long, value_name = "TARGET")]
    pub target: Option<String>,
    /// How long to fuzz each target, in seconds.
    #[arg(long, default_value_t = TIER_SECONDS, value_name = "N")]
    pub seconds: u64,
}

/// libFuzzer's closing statistics (`-print_final_stats=1`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    pub executions: Option<u64>,
    pub seconds: Option<u64>,
    pub peak_rss_mb: Option<u64>,
    pub new_units: Option<u64>,
}

/// Reads libFuzzer's `stat::name: value` lines and its `Done N runs in T second(s)` line.
pub fn parse_stats(output: &str) -> Stats {
    let mut s = Stats::default();
    for line in output.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("stat::") {
            let Some((name, value)) = rest.split_once(':') else {
                continue;
            };
            let value = value.trim().parse().ok();
            match name.trim() {
                "number_of_executed_units" => s.executions = value,
                "peak_rss_mb" => s.peak_rss_mb = value,
                "new_units_added" => s.new_units = value,
                _ => {}
            }
        } else if let Some(rest) = line.strip_prefix("Done ") {
            // "Done 304147 runs in 31 second(s)"
            let words: Vec<&str> = rest.split_whitespace().collect();
            if let [runs, "runs", "in", secs, ..] = words.as_slice() {
                s.executions = s.executions.or(runs.parse().ok());
                s.seconds = secs.parse().ok();
            }
        }
    }
    s
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    let targets: Vec<&Target> = match &args.target {
        None => TARGETS.iter().collect(),
        Some(name) => match TARGETS.iter().find(|t| t.name == name) {
            Some(t) => vec![t],
            None => bail!(
                "unknown fuzz target {name:?}; the targets are: {}",
                TARGETS
                    .iter()
                    .map(|t| t.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    };
    if args.seconds == 0 {
        bail!("--seconds must be at least 1");
    }
    let root = util::repo_root();
    for target in targets {
        fuzz_one(&root, target, args.seconds)?;
    }
    Ok(())
}

fn fuzz_one(root: &Path, target: &Target, seconds: u64) -> Result<()> {
    let crate_dir = root.join(target.crate_dir);
    let fuzz_dir = crate_dir.join("fuzz");
    let corpus = fuzz_dir.join("corpus").join(target.name);
    let seeds = fuzz_dir.join("seeds").join(target.name);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let max_time = format!("-max_total_time={seconds}");
    let corpus_arg = corpus.to_string_lossy().into_owned();
    let seeds_arg = seeds.to_string_lossy().into_owned();
    // One target directory for every fuzz crate: their common dependencies (tokio, serde,
    // prost, ...) are built with ASan once, not once per crate.
    let target_dir = root.join("target").join("fuzz");
    let target_dir_arg = target_dir.to_string_lossy().into_owned();
    let mut cmd = util::nightly_cargo(&[
        "fuzz",
        "run",
        "--target-dir",
        &target_dir_arg,
        target.name,
        &corpus_arg,
        &seeds_arg,
        "--",
        &max_time,
        "-print_final_stats=1",
    ]);
    cmd.current_dir(&crate_dir)
        .env("PATH", util::path_with_cargo_bin()?)
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    println!(
        "fuzz {}: building (nightly, release with ASan; a few minutes the first time), then \
         {seconds} s of inputs",
        target.name
    );
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .context("starting `cargo fuzz` (cargo xtask setup installs it)")?;
    // Echo everything but libFuzzer's per-input progress lines ("#1234 NEW ...") and its
    // recommended-dictionary entries ("\"replicas\" # Uses: 8"), which
    // are thousands; keep the whole text for the statistics.
    let mut text = String::new();
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).lines() {
            let line = line.context("reading cargo fuzz's output")?;
            if !line.starts_with('#') && !line.starts_with('"') {
                eprintln!("{line}");
            }
            text.push_str(&line);
            text.push('\n');
        }
    }
    let status = child.wait().context("waiting for cargo fuzz")?;
    let stats = parse_stats(&text);
    if !status.success() {
        bail!(
            "fuzz {}: failed ({status}) after {}; a crashing input is under {} (the output \
             above names it; rerun it with `cargo +nightly fuzz run {} <file>` in {})",
            target.name,
            util::fmt_duration(started.elapsed()),
            fuzz_dir.join("artifacts").join(target.name).display(),
            target.name,
            target.crate_dir
        );
    }
    let Some(executions) = stats.executions else {
        bail!(
            "fuzz {}: cargo fuzz succeeded but printed no execution count (no libFuzzer \
             statistics in its output)",
            target.name
        );
    };
    let secs = stats.seconds.unwrap_or(seconds).max(1);
    println!(
        "fuzz {}: {executions} executions in {secs} s ({}/s), {} new corpus inputs, peak RSS \
         {} MB, no crash",
        target.name,
        executions / secs,
        stats.new_units.map_or("?".into(), |n| n.to_string()),
        stats.peak_rss_mb.map_or("?".into(), |n| n.to_string()),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libfuzzer_statistics_are_read() {
        let out = "#2\tINITED cov: 10 ft: 10 corp: 1/1b\n\
                   Done 304147 runs in 31 second(s)\n\
                   stat::number_of_executed_units: 304147\n\
                   stat::average_exec_per_sec:     9811\n\
                   stat::new_units_added:          1203\n\
                   stat::slowest_unit_time_sec:    0\n\
                   stat::peak_rss_mb:              412\n";
        assert_eq!(
            parse_stats(out),
            Stats {
                executions: Some(304147),
                seconds: Some(31),
                peak_rss_mb: Some(412),
                new_units: Some(1203),
            }
        );
        assert_eq!(parse_stats("no stats here"), Stats::default());
    }

    #[test]
    fn every_target_has_its_fuzz_crate_and_seeds() {
        let root = util::repo_root();
        for t in TARGETS {
            let fuzz = root.join(t.crate_dir).join("fuzz");
            let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap_or_default();
            assert!(
                manifest.contains(&format!("name = \"{}\"", t.name)),
                "{} names no [[bin]] {}",
                fuzz.display(),
                t.name
            );
            let seeds = std::fs::read_dir(fuzz.join("seeds").join(t.name))
                .map(|d| d.count())
                .unwrap_or(0);
            assert!(seeds > 0, "{} has no seeds", t.name);
        }
    }
}
