//! `cargo xtask fuzz`: runs the cargo-fuzz targets for a bounded time and reports how many
//! inputs each executed. The `fuzz` test tier runs it for [`TIER_SECONDS`] per target, so
//! every CI run fuzzes the REST decoders a little further from the checked-in seeds.
//!
//! Every target lives in one crate, `tests/fuzz/` (its own nightly workspace, so its
//! dependencies are built with the sanitizer once for all targets); its lock file follows the
//! workspace's and is checked before a run (`cargo fetch --locked`), so a run never rewrites
//! it. Seeds are checked in under `tests/fuzz/seeds/<target>`; libFuzzer writes the inputs it
//! finds to `tests/fuzz/corpus/<target>` (not checked in) and a crashing input to
//! `tests/fuzz/artifacts/<target>`, whose path it prints; the tier then fails.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::util;

/// Seconds per target in the test tier: a smoke run from the seeds on every CI run (a fresh
/// clone has no corpus), on an unoptimized build (`--dev`: built in about half the time of
/// cargo-fuzz's optimized build, at a fraction of its executions per second). Campaigns run
/// `cargo xtask fuzz --seconds N`, optimized.
pub const TIER_SECONDS: u64 = 20;

/// The fuzz crate, from the repository root.
pub const FUZZ_DIR: &str = "tests/fuzz";

/// Every fuzz target (a `[[bin]]` of the fuzz crate) and what it exercises.
pub const TARGETS: &[(&str, &str)] = &[
    ("rest_decoders", "the API server's REST request decoders"),
    (
        "auth_parsers",
        "the API server's credential and kubeconfig parsers",
    ),
    ("dns_queries", "the cluster DNS server's query path"),
    ("image_layers", "the image store's layer unpacker"),
    ("volume_paths", "the agent's volume writer"),
];

#[derive(Debug, Clone, clap::Args)]
pub struct FuzzArgs {
    /// Only this target (default: all of them).
    #[arg(long, value_name = "TARGET")]
    pub target: Option<String>,
    /// How long to fuzz each target, in seconds.
    #[arg(long, default_value_t = TIER_SECONDS, value_name = "N")]
    pub seconds: u64,
    /// Build without optimizations (still with ASan and coverage): quicker to build, slower
    /// to run; what the test tier does.
    #[arg(long)]
    pub dev: bool,
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
    let targets: Vec<&str> = match &args.target {
        None => TARGETS.iter().map(|(t, _)| *t).collect(),
        Some(name) => match TARGETS.iter().find(|(t, _)| t == name) {
            Some((t, _)) => vec![*t],
            None => bail!(
                "unknown fuzz target {name:?}; the targets are: {}",
                TARGETS
                    .iter()
                    .map(|(t, _)| *t)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    };
    if args.seconds == 0 {
        bail!("--seconds must be at least 1");
    }
    let root = util::repo_root();
    check_lock(&root.join(FUZZ_DIR))?;
    for target in targets {
        fuzz_one(&root, target, args.seconds, args.dev)?;
    }
    Ok(())
}

/// Fails when the fuzz crate's lock file is not current (a run would rewrite it): the
/// committed lock file is the one every run builds with.
fn check_lock(fuzz_dir: &Path) -> Result<()> {
    let status = util::nightly_cargo(&["fetch", "--locked", "--quiet"])
        .current_dir(fuzz_dir)
        .env("PATH", util::path_with_cargo_bin()?)
        .status()
        .context("running `cargo +nightly fetch --locked` for the fuzz crate")?;
    if !status.success() {
        bail!(
            "{}/Cargo.lock is not current: update it (`cargo +nightly update --workspace` in \
             {}) and commit it",
            FUZZ_DIR,
            FUZZ_DIR
        );
    }
    Ok(())
}

fn fuzz_one(root: &Path, target: &str, seconds: u64, dev: bool) -> Result<()> {
    let fuzz_dir = root.join(FUZZ_DIR);
    let corpus = fuzz_dir.join("corpus").join(target);
    let seeds = fuzz_dir.join("seeds").join(target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let max_time = format!("-max_total_time={seconds}");
    let corpus_arg = corpus.to_string_lossy().into_owned();
    let seeds_arg = seeds.to_string_lossy().into_owned();
    let target_dir = root.join("target").join("fuzz");
    let target_dir_arg = target_dir.to_string_lossy().into_owned();
    let profile = if dev { "--dev" } else { "--release" };
    let mut cmd = util::nightly_cargo(&[
        "fuzz",
        "run",
        profile,
        "--target-dir",
        &target_dir_arg,
        target,
        &corpus_arg,
        &seeds_arg,
        "--",
        &max_time,
        "-print_final_stats=1",
    ]);
    cmd.current_dir(&fuzz_dir)
        .env("PATH", util::path_with_cargo_bin()?)
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    println!(
        "fuzz {}: building (nightly, {} with ASan; a few minutes the first time), then \
         {seconds} s of inputs",
        target,
        if dev { "unoptimized" } else { "optimized" }
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
             above names it; rerun it with `cargo +nightly fuzz run {} <file>` in {FUZZ_DIR})",
            target,
            util::fmt_duration(started.elapsed()),
            fuzz_dir.join("artifacts").join(target).display(),
            target,
        );
    }
    let Some(executions) = stats.executions else {
        bail!(
            "fuzz {}: cargo fuzz succeeded but printed no execution count (no libFuzzer \
             statistics in its output)",
            target
        );
    };
    let secs = stats.seconds.unwrap_or(seconds).max(1);
    println!(
        "fuzz {}: {executions} executions in {secs} s ({}/s), {} new corpus inputs, peak RSS \
         {} MB, no crash",
        target,
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
    fn every_target_is_a_bin_of_the_fuzz_crate_with_seeds() {
        let fuzz = util::repo_root().join(FUZZ_DIR);
        let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap_or_default();
        for (name, _) in TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{name}\"")),
                "{} names no [[bin]] {name}",
                fuzz.display()
            );
            let seeds = std::fs::read_dir(fuzz.join("seeds").join(name))
                .map(|d| d.count())
                .unwrap_or(0);
            assert!(seeds > 0, "{name} has no seeds");
        }
        assert_eq!(
            manifest.matches("[[bin]]").count(),
            TARGETS.len(),
            "every [[bin]] of the fuzz crate is a target `cargo xtask fuzz` runs"
        );
    }
}
