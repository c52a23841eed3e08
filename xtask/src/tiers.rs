//! `cargo xtask test`: setup, doctor, then each test tier in order, failing fast.
//!
//! The workspace tests run under cargo-nextest (one process per test, .config/nextest.toml):
//! a test that hangs is killed after its time bound and named in the report, instead of
//! running CI into its overall limit.
//!
//! To add a tier (for example benchmarks), append to [`TIERS`]; use
//! [`Quick::Args`] to run it differently under `--quick`, or
//! [`Quick::Skip`] to leave it out of quick runs.
//!
//! The tiers: fmt, clippy with the workspace lints, `ebpf-fmt` and `ebpf-clippy` (the nightly
//! rustfmt and clippy on `ebpf/skiff-ebpf` for the BPF target, through `util::nightly_cargo`,
//! the one place that strips the stable cargo's environment), the workspace tests under
//! nextest, doctests, `fuzz` (each cargo-fuzz target for a bounded time) and `bench --quick`.
//!
//! Every cargo command builds `--locked` (the committed lock files are the ones tested), and
//! a run fails when it leaves the working tree different from how it found it (`git status`
//! before and after): a test that writes into the repository, or a lock file a build
//! rewrote, is caught here rather than on the next machine.

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::doctor::{self, DoctorOptions};
use crate::setup::{self, SetupOptions};
use crate::util;

/// What a tier does under `--quick`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(
    dead_code,
    reason = "Skip is for later tiers; today's tiers all run in a quick run"
)]
pub enum Quick {
    /// Run exactly as in a full run.
    Same,
    /// Leave the tier out.
    Skip,
    /// Run with these arguments instead.
    Args(&'static [&'static str]),
}

#[derive(Debug, Clone, Copy)]
pub struct Tier {
    pub name: &'static str,
    pub program: &'static str,
    pub args: &'static [&'static str],
    pub quick: Quick,
    /// Where it runs, relative to the repository root ("" for the root).
    pub dir: &'static str,
    /// Run `program` (cargo) from the nightly toolchain, as the eBPF crate needs.
    pub nightly: bool,
}

/// The eBPF crate's directory, relative to the repository root.
const EBPF_DIR: &str = "ebpf/skiff-ebpf";

/// The tiers, in the order they run.
pub const TIERS: &[Tier] = &[
    Tier {
        name: "fmt",
        program: "cargo",
        args: &["fmt", "--all", "--", "--check"],
        quick: Quick::Same,
        dir: "",
        nightly: false,
    },
    Tier {
        name: "clippy",
        program: "cargo",
        args: &[
            "clippy",
            "--locked",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        quick: Quick::Same,
        dir: "",
        nightly: false,
    },
    // The eBPF programs are their own nightly workspace (ebpf/skiff-ebpf): formatted and
    // linted with the nightly rustfmt and clippy, for the BPF target, into target/ebpf-lint.
    Tier {
        name: "ebpf-fmt",
        program: "cargo",
        args: &["fmt", "--all", "--", "--check"],
        quick: Quick::Same,
        dir: EBPF_DIR,
        nightly: true,
    },
    Tier {
        name: "ebpf-clippy",
        program: "cargo",
        args: &[
            "clippy",
            "--locked",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--target-dir",
            "../../target/ebpf-lint",
            "--",
            "-D",
            "warnings",
        ],
        quick: Quick::Same,
        dir: EBPF_DIR,
        nightly: true,
    },
    Tier {
        name: "test",
        program: "cargo",
        args: &[
            "nextest",
            "run",
            "--locked",
            "--workspace",
            "--profile",
            "ci",
        ],
        quick: Quick::Same,
        dir: "",
        nightly: false,
    },
    // nextest does not run doctests.
    Tier {
        name: "doctest",
        program: "cargo",
        args: &["test", "--locked", "--workspace", "--doc"],
        quick: Quick::Same,
        dir: "",
        nightly: false,
    },
    // Every fuzz target under libFuzzer for fuzz::TIER_SECONDS (cargo-fuzz, nightly, ASan; an
    // unoptimized build, see fuzz.rs): reports the executions; a crash fails the run and leaves
    // the input under tests/fuzz/artifacts.
    Tier {
        name: "fuzz",
        program: "cargo",
        args: &["xtask", "fuzz", "--dev"],
        quick: Quick::Args(&["xtask", "fuzz", "--dev", "--seconds", "10"]),
        dir: "",
        nightly: false,
    },
    // Every benchmark suite at a tiny size on debug builds: checks that they work (no
    // timing is asserted anywhere); real numbers come from `cargo xtask bench`.
    Tier {
        name: "bench-quick",
        program: "cargo",
        args: &["xtask", "bench", "--quick"],
        quick: Quick::Same,
        dir: "",
        nightly: false,
    },
];

/// A tier resolved for this run: `argv` is `None` when it is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub name: &'static str,
    pub argv: Option<Vec<&'static str>>,
    pub dir: &'static str,
    pub nightly: bool,
}

pub fn plan(tiers: &[Tier], quick: bool) -> Vec<Planned> {
    tiers
        .iter()
        .map(|t| {
            let args = match (quick, t.quick) {
                (false, _) | (true, Quick::Same) => Some(t.args),
                (true, Quick::Skip) => None,
                (true, Quick::Args(a)) => Some(a),
            };
            Planned {
                name: t.name,
                argv: args.map(|a| {
                    std::iter::once(t.program)
                        .chain(a.iter().copied())
                        .collect()
                }),
                dir: t.dir,
                nightly: t.nightly,
            }
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass(Duration),
    Fail(Duration),
    /// Not run because an earlier tier failed.
    NotRun,
    /// Left out by `--quick`.
    Skipped,
}

pub fn summary(results: &[(&str, Outcome)]) -> String {
    let width = results.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let mut s = String::from("summary:\n");
    for (name, outcome) in results {
        let (label, time) = match outcome {
            Outcome::Pass(d) => ("PASS", util::fmt_duration(*d)),
            Outcome::Fail(d) => ("FAIL", util::fmt_duration(*d)),
            Outcome::NotRun => ("----", "not run".to_string()),
            Outcome::Skipped => ("SKIP", "--quick".to_string()),
        };
        let _ = writeln!(s, "  {label}  {name:<width$}  {time:>8}");
    }
    s
}

pub fn run(quick: bool) -> Result<()> {
    let root = util::repo_root();
    let path = util::path_with_cargo_bin()?;
    let mut results: Vec<(&str, Outcome)> = Vec::new();

    let planned = plan(TIERS, quick);
    // Setup installs what is missing; doctor then proves each prerequisite works, so a gap
    // stops the run here with one line naming it instead of as a compiler backtrace later.
    let steps: [(&str, &dyn Fn() -> Result<()>); 2] = [
        ("setup", &|| setup::run(SetupOptions { skip_ebpf: false })),
        ("doctor", &|| doctor::run(&DoctorOptions::default())),
    ];
    for (name, step) in steps {
        println!("==> {name}");
        let start = Instant::now();
        let result = step();
        let elapsed = start.elapsed();
        if let Err(e) = result {
            util::print_error(&e);
            println!("FAILED: {name}");
            results.push((name, Outcome::Fail(elapsed)));
            results.extend(planned.iter().map(|p| (p.name, Outcome::NotRun)));
            print!("{}", summary(&results));
            bail!("tier {name} failed");
        }
        results.push((name, Outcome::Pass(elapsed)));
    }

    // The tree as the run found it; `None` outside a git checkout (nothing to compare).
    let tree_before = tree_status(&root);
    let tree_before = (!tree_before.is_empty() || git_available(&root)).then_some(tree_before);
    let mut failed: Option<&str> = None;
    for tier in &planned {
        let Some(argv) = &tier.argv else {
            println!("==> {}: skipped (--quick)", tier.name);
            results.push((tier.name, Outcome::Skipped));
            continue;
        };
        if failed.is_some() {
            results.push((tier.name, Outcome::NotRun));
            continue;
        }
        let mut cmd = if tier.nightly {
            util::nightly_cargo(&argv[1..])
        } else {
            let mut cmd = Command::new(argv[0]);
            cmd.args(&argv[1..]);
            cmd
        };
        cmd.current_dir(root.join(tier.dir)).env("PATH", &path);
        println!("==> {}: {}", tier.name, util::display_cmd(&cmd));
        let start = Instant::now();
        // Output streams live: stdio is inherited, not captured.
        let ok = match cmd.status() {
            Ok(status) => status.success(),
            Err(e) => {
                eprintln!("could not start `{}`: {e}", util::display_cmd(&cmd));
                false
            }
        };
        let elapsed = start.elapsed();
        if ok {
            results.push((tier.name, Outcome::Pass(elapsed)));
        } else {
            println!("FAILED: {}", tier.name);
            results.push((tier.name, Outcome::Fail(elapsed)));
            failed = Some(tier.name);
        }
    }

    if failed.is_none()
        && let Some(before) = &tree_before
    {
        let start = Instant::now();
        match tree_changes(before, &tree_status(&root)) {
            None => results.push(("clean-tree", Outcome::Pass(start.elapsed()))),
            Some(changed) => {
                println!(
                    "FAILED: clean-tree: the run changed the working tree:\n{changed}\n(a test or \
                     build wrote into the repository; `git status` shows it)"
                );
                results.push(("clean-tree", Outcome::Fail(start.elapsed())));
                failed = Some("clean-tree");
            }
        }
    }

    print!("{}", summary(&results));
    match failed {
        Some(name) => bail!("tier {name} failed"),
        None => {
            println!("all tiers passed");
            Ok(())
        }
    }
}

/// `git status --porcelain` lines (untracked files included, ignored ones not).
fn tree_status(root: &std::path::Path) -> Vec<String> {
    Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=all"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn git_available(root: &std::path::Path) -> bool {
    Command::new("git")
        .args(["rev-parse", "--is-inside-work-tree"])
        .current_dir(root)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The status lines that are new after the run, or `None` when there are none.
fn tree_changes(before: &[String], after: &[String]) -> Option<String> {
    let new: Vec<&str> = after
        .iter()
        .filter(|l| !before.contains(l))
        .map(String::as_str)
        .collect();
    (!new.is_empty()).then(|| new.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_changes_the_tree_is_reported() {
        let before = vec![" M README.md".to_string()];
        assert_eq!(tree_changes(&before, &before), None);
        let after = vec![
            " M README.md".to_string(),
            " M tests/fuzz/Cargo.lock".to_string(),
            "?? stray.txt".to_string(),
        ];
        assert_eq!(
            tree_changes(&before, &after).as_deref(),
            Some(" M tests/fuzz/Cargo.lock\n?? stray.txt")
        );
    }

    #[test]
    fn default_tiers_in_order() {
        let names: Vec<_> = TIERS.iter().map(|t| t.name).collect();
        assert_eq!(
            names,
            [
                "fmt",
                "clippy",
                "ebpf-fmt",
                "ebpf-clippy",
                "test",
                "doctest",
                "fuzz",
                "bench-quick"
            ]
        );
        let full = plan(TIERS, false);
        assert_eq!(
            full[0].argv.as_deref(),
            Some(&["cargo", "fmt", "--all", "--", "--check"][..])
        );
        assert_eq!(
            full[1].argv.as_deref(),
            Some(
                &[
                    "cargo",
                    "clippy",
                    "--locked",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings"
                ][..]
            )
        );
        assert!(full[2].nightly && full[3].nightly);
        assert_eq!(full[2].dir, "ebpf/skiff-ebpf");
        assert!(
            util::repo_root()
                .join(full[3].dir)
                .join("Cargo.toml")
                .is_file()
        );
        assert!(!full[4].nightly && full[4].dir.is_empty());
        assert_eq!(
            full[4].argv.as_deref(),
            Some(
                &[
                    "cargo",
                    "nextest",
                    "run",
                    "--locked",
                    "--workspace",
                    "--profile",
                    "ci"
                ][..]
            )
        );
        assert_eq!(
            full[5].argv.as_deref(),
            Some(&["cargo", "test", "--locked", "--workspace", "--doc"][..])
        );
        assert_eq!(
            full[6].argv.as_deref(),
            Some(&["cargo", "xtask", "fuzz", "--dev"][..])
        );
        assert_eq!(
            plan(TIERS, true)[6].argv.as_deref(),
            Some(&["cargo", "xtask", "fuzz", "--dev", "--seconds", "10"][..])
        );
        assert_eq!(
            full[7].argv.as_deref(),
            Some(&["cargo", "xtask", "bench", "--quick"][..])
        );
    }

    #[test]
    fn quick_mode_variants() {
        let tiers = [
            Tier {
                name: "a",
                program: "cargo",
                args: &["a"],
                quick: Quick::Same,
                dir: "",
                nightly: false,
            },
            Tier {
                name: "b",
                program: "cargo",
                args: &["b"],
                quick: Quick::Skip,
                dir: "",
                nightly: false,
            },
            Tier {
                name: "c",
                program: "cargo",
                args: &["xtask", "bench"],
                quick: Quick::Args(&["xtask", "bench", "--quick"]),
                dir: "",
                nightly: false,
            },
        ];
        let full = plan(&tiers, false);
        assert!(full.iter().all(|p| p.argv.is_some()));
        assert_eq!(
            full[2].argv.as_deref(),
            Some(&["cargo", "xtask", "bench"][..])
        );

        let quick = plan(&tiers, true);
        assert_eq!(quick[0].argv.as_deref(), Some(&["cargo", "a"][..]));
        assert_eq!(quick[1].argv, None);
        assert_eq!(
            quick[2].argv.as_deref(),
            Some(&["cargo", "xtask", "bench", "--quick"][..])
        );
    }

    #[test]
    fn summary_lists_every_tier() {
        let s = summary(&[
            ("setup", Outcome::Pass(Duration::from_millis(300))),
            ("fmt", Outcome::Pass(Duration::from_secs(2))),
            ("clippy", Outcome::Fail(Duration::from_secs(75))),
            ("test", Outcome::NotRun),
            ("bench", Outcome::Skipped),
        ]);
        let lines: Vec<_> = s.lines().collect();
        assert_eq!(lines[0], "summary:");
        assert_eq!(lines[1], "  PASS  setup       0.3s");
        assert_eq!(lines[3], "  FAIL  clippy     1m15s");
        assert!(lines[4].starts_with("  ----  test"));
        assert!(lines[5].starts_with("  SKIP  bench"));
    }
}
