//! `cargo xtask bench [SUITE…] [--quick] [-- ARGS…]`: builds the benchmark (`skiff-perf`'s
//! `skiff-bench`) and the binaries it starts in release, then runs it. `--quick` (a smoke
//! check that every suite works, run by CI) uses the debug builds the test tier already made:
//! its numbers are never reported.
//!
//! The suites start `skiff-apiserver`, `skiff-node` and `skiff-scheduler` from the bench's own
//! `target/<profile>/` directory (the harness would build missing ones in debug), so they and
//! the bench are built in one `cargo build --release` first; `cargo run --release` then finds
//! nothing to rebuild.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util;

/// Packages whose binaries a bench run needs.
pub const PACKAGES: &[&str] = &[
    "skiff-apiserver",
    "skiff-node",
    "skiff-scheduler",
    "skiff-perf",
];

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Suites to run (default: all; `cargo xtask bench -- --list` names them).
    pub suites: Vec<String>,
    /// Smoke check that the benchmarks work: small sizes, results outside the repository.
    #[arg(long)]
    pub quick: bool,
    /// More arguments for skiff-bench, e.g. `-- --pods 100 --concurrency 5`.
    #[arg(last = true, value_name = "ARGS")]
    pub extra: Vec<String>,
}

/// `cargo build [--release] -p … --bins` (debug for `--quick`).
pub fn build_command(root: &Path, quick: bool) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root).args(["build", "--locked"]);
    if !quick {
        cmd.arg("--release");
    }
    for p in PACKAGES {
        cmd.args(["-p", p]);
    }
    cmd.arg("--bins");
    cmd
}

/// `cargo run [--release] -p skiff-perf --bin skiff-bench -- …` (debug for `--quick`).
pub fn run_command(root: &Path, args: &BenchArgs) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root).args(["run", "--locked"]);
    if !args.quick {
        cmd.arg("--release");
    }
    cmd.args(["--quiet", "-p", "skiff-perf", "--bin", "skiff-bench", "--"]);
    cmd.args(&args.suites);
    if args.quick {
        cmd.arg("--quick");
    }
    cmd.args(&args.extra);
    cmd
}

pub fn run(args: BenchArgs) -> Result<()> {
    if !util::is_root() {
        bail!("the benchmarks start a node agent (network namespaces, cgroups): run as root");
    }
    let root = util::repo_root();
    let mut build = build_command(&root, args.quick);
    println!("==> {}", util::display_cmd(&build));
    util::run_streaming(&mut build).context("building the benchmark in release failed")?;
    let mut bench = run_command(&root, &args);
    println!("==> {}", util::display_cmd(&bench));
    util::run_streaming(&mut bench)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn builds_every_started_binary_in_release() {
        let a = argv(&build_command(Path::new("/r"), false));
        assert_eq!(
            a,
            [
                "build",
                "--locked",
                "--release",
                "-p",
                "skiff-apiserver",
                "-p",
                "skiff-node",
                "-p",
                "skiff-scheduler",
                "-p",
                "skiff-perf",
                "--bins"
            ]
        );
    }

    #[test]
    fn passes_suites_quick_and_extra_arguments() {
        let args = BenchArgs {
            suites: vec!["pod-start".into()],
            quick: true,
            extra: vec!["--pods".into(), "7".into()],
        };
        let a = argv(&run_command(Path::new("/r"), &args));
        let tail = &a[a.iter().position(|x| x == "--").unwrap() + 1..];
        assert_eq!(tail, ["pod-start", "--quick", "--pods", "7"]);
        assert!(
            !a.contains(&"--release".to_string()),
            "quick runs use debug builds"
        );
        let full = BenchArgs {
            quick: false,
            ..args
        };
        assert!(argv(&run_command(Path::new("/r"), &full)).contains(&"--release".to_string()));
        assert!(!argv(&build_command(Path::new("/r"), true)).contains(&"--release".to_string()));
    }
}
