//! Skiff developer tasks: `cargo xtask <command>` (alias in .cargo/config.toml).
//!
//! - `setup`: install what a fresh Debian 12 machine lacks (idempotent).
//! - `doctor`: check every prerequisite by using it; one line per missing one, with its fix.
//! - `test`:  setup, doctor, then fmt / clippy / tests, failing fast, with a summary.
//! - `up`:    build and run a local control plane until Ctrl-C.
//! - `bench`: build in release and run the benchmarks (`perf/`), baseline and Skiff side by side.
//! - `install`: install the binaries and their systemd units on a machine (`deploy/systemd/`).
//! - `codegen`: regenerate `proto/src/k8s_wire/table.rs` from the vendored `proto/k8s/` files.

mod bench;
mod codegen;
#[cfg(test)]
mod docs;
mod doctor;
mod fuzz;
mod install;
#[cfg(test)]
mod layers;
#[cfg(test)]
mod modules;
#[cfg(test)]
mod readme;
mod setup;
mod tiers;
mod up;
mod util;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "Skiff developer tasks",
    version
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Install missing build/test prerequisites (apt packages, nightly rust-src, bpf-linker).
    Setup {
        /// Skip the eBPF toolchain: LLVM packages, nightly rust-src and bpf-linker.
        #[arg(long)]
        skip_ebpf: bool,
    },
    /// Check every prerequisite by using it (protoc, the eBPF toolchain, etcd, ...).
    Doctor {
        /// Run only these checks (repeatable), e.g. `--only protoc`.
        #[arg(long, value_name = "CHECK")]
        only: Vec<String>,
        /// List the checks, what each proves and what fixes it; run none.
        #[arg(long)]
        list: bool,
    },
    /// Run setup and doctor, then every test tier in order (fmt, clippy, test), failing fast.
    Test {
        /// Quick run: tiers marked as slow are skipped or run in their quick variant.
        #[arg(long)]
        quick: bool,
    },
    /// Build and run a local control plane (API server, ...) until Ctrl-C.
    Up(up::UpArgs),
    /// Build in release and run benchmark suites (perf/): baseline and Skiff side by side.
    Bench(bench::BenchArgs),
    /// Run the cargo-fuzz targets for a bounded time each and report their executions.
    Fuzz(fuzz::FuzzArgs),
    /// Install the binaries and their systemd units on this machine (or --uninstall them).
    Install(Box<install::InstallArgs>),
    /// Regenerate proto/src/k8s_wire/table.rs from the vendored Kubernetes .proto files
    /// (proto/k8s/).
    Codegen,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            util::print_error(&err);
            ExitCode::FAILURE
        }
    }
}

fn run(command: Cmd) -> Result<()> {
    match command {
        Cmd::Setup { skip_ebpf } => setup::run(setup::SetupOptions { skip_ebpf }),
        Cmd::Doctor { only, list } => doctor::run(&doctor::DoctorOptions { only, list }),
        Cmd::Test { quick } => tiers::run(quick),
        Cmd::Up(args) => up::run(args),
        Cmd::Bench(args) => bench::run(args),
        Cmd::Fuzz(args) => fuzz::run(&args),
        Cmd::Install(args) => install::run(&args),
        Cmd::Codegen => codegen::run(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn up_flags_parse() {
        let cli = Cli::try_parse_from([
            "xtask",
            "up",
            "--etcd",
            "http://127.0.0.1:2379",
            "--listen",
            "0.0.0.0:9000",
            "--data-dir",
            "/tmp/d",
            "--nodes",
            "2",
        ])
        .unwrap();
        let Cmd::Up(a) = cli.command else {
            panic!("not up")
        };
        assert_eq!(a.etcd.as_deref(), Some("http://127.0.0.1:2379"));
        assert_eq!(a.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(a.nodes, 2);

        let cli = Cli::try_parse_from(["xtask", "up"]).unwrap();
        let Cmd::Up(a) = cli.command else {
            panic!("not up")
        };
        assert_eq!(a.listen.to_string(), "127.0.0.1:7443");
        assert_eq!(a.data_dir, None);
        assert_eq!(a.nodes, 1, "one node by default");
    }

    #[test]
    fn setup_and_test_flags_parse() {
        let cli = Cli::try_parse_from(["xtask", "setup", "--skip-ebpf"]).unwrap();
        assert!(matches!(cli.command, Cmd::Setup { skip_ebpf: true }));
        let cli = Cli::try_parse_from(["xtask", "test", "--quick"]).unwrap();
        assert!(matches!(cli.command, Cmd::Test { quick: true }));
        assert!(Cli::try_parse_from(["xtask", "up", "--listen", "not-an-addr"]).is_err());
    }

    #[test]
    fn bench_flags_parse() {
        let cli = Cli::try_parse_from([
            "xtask",
            "bench",
            "pod-start",
            "--quick",
            "--",
            "--pods",
            "9",
        ])
        .unwrap();
        let Cmd::Bench(a) = cli.command else {
            panic!("not bench")
        };
        assert_eq!(a.suites, ["pod-start"]);
        assert!(a.quick);
        assert_eq!(a.extra, ["--pods", "9"]);
        let cli = Cli::try_parse_from(["xtask", "bench"]).unwrap();
        let Cmd::Bench(a) = cli.command else {
            panic!("not bench")
        };
        assert!(a.suites.is_empty() && !a.quick && a.extra.is_empty());
    }
}
