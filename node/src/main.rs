//! `skiff-node`: the node agent. Only `check-host` works today; running pods arrives with
//! milestone M1-B.

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "skiff-node", about = "Skiff node agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reports what this host offers the agent: cgroup v2 mount and controllers, bpffs, BTF.
    CheckHost,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckHost => {
            let r = skiff_node::host::report().context("inspecting the host")?;
            println!("cgroup v2 root:      {}", r.cgroup2_root.display());
            println!("v2 controllers:      {}", r.controllers.join(" "));
            if r.missing_controllers.is_empty() {
                println!("missing controllers: none");
            } else {
                println!(
                    "missing controllers: {} (pod limits for these will be reported as not enforced)",
                    r.missing_controllers.join(" ")
                );
            }
            println!("bpffs mounted:       {}", r.bpffs_mounted);
            println!("kernel BTF:          {}", r.btf_available);
        }
    }
    Ok(())
}
