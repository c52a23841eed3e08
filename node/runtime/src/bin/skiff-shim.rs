//! `skiff-shim shim ARGS…`: the runtime's container shim as a program of its own, so the
//! runtime can be used (and is tested) without the agent. The agent ships the same code as
//! `skiff-node shim`; `NativeConfig::shim_path` names whichever binary is used, and the
//! runtime always passes `shim` as the first argument.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "skiff-shim", about = "Skiff's container shim")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Supervises one container, or runs one command inside a running container.
    Shim(Box<skiff_runtime::shim::ShimArgs>),
}

fn main() {
    let Command::Shim(args) = Cli::parse().command;
    std::process::exit(skiff_runtime::shim::run(*args));
}
