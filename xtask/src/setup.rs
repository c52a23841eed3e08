//! `cargo xtask setup`: install what a fresh Debian 12 machine lacks.
//!
//! Every item prints either `ok: X present` or `installing X...` followed by
//! `installed X`. Running it twice is cheap: the second run only checks.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util;

/// A Debian package the project needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AptPackage {
    pub name: &'static str,
    /// Only needed to build eBPF programs (skipped by `--skip-ebpf`).
    pub ebpf: bool,
    pub why: &'static str,
}

/// All apt packages, in install order. See /work/shared/platform.md.
pub const APT_PACKAGES: &[AptPackage] = &[
    AptPackage {
        name: "protobuf-compiler",
        ebpf: false,
        why: "protoc for prost/tonic/etcd-client builds",
    },
    AptPackage {
        name: "libprotobuf-dev",
        ebpf: false,
        why: "protobuf's well-known .proto files (google/protobuf/descriptor.proto) for etcd-client",
    },
    AptPackage {
        name: "etcd-server",
        ebpf: false,
        why: "etcd store backend",
    },
    AptPackage {
        name: "docker-registry",
        ebpf: false,
        why: "a real OCI distribution registry on loopback for the image pull tests",
    },
    AptPackage {
        name: "etcd-client",
        ebpf: false,
        why: "etcdctl",
    },
    AptPackage {
        name: "bpftool",
        ebpf: false,
        why: "inspecting loaded BPF programs and maps",
    },
    AptPackage {
        name: "iproute2",
        ebpf: false,
        why: "ip/tc for namespaces and veths",
    },
    AptPackage {
        name: "busybox-static",
        ebpf: false,
        why: "static binaries for test containers",
    },
    AptPackage {
        name: "llvm-22-dev",
        ebpf: true,
        why: "LLVM for bpf-linker",
    },
    AptPackage {
        name: "libpolly-22-dev",
        ebpf: true,
        why: "LLVM Polly for bpf-linker",
    },
    AptPackage {
        name: "zlib1g-dev",
        ebpf: false,
        why: "zlib (bpf-linker link)",
    },
    AptPackage {
        name: "libzstd-dev",
        ebpf: false,
        why: "zstd (bpf-linker link)",
    },
    AptPackage {
        name: "python3",
        ebpf: false,
        why: "scripts and test tooling",
    },
    AptPackage {
        name: "python3-venv",
        ebpf: false,
        why: "`python3 -m venv` for the tests' Python venv (the kubernetes client and kopf)",
    },
    AptPackage {
        name: "curl",
        ebpf: false,
        why: "a real HTTPS client inside test pods (they call the API server with their token)",
    },
    AptPackage {
        name: "iptables",
        ebpf: false,
        why: "tests check that Skiff leaves every node's iptables rules alone",
    },
    AptPackage {
        name: "nftables",
        ebpf: false,
        why: "tests check that Skiff leaves every node's nftables rule set alone",
    },
    AptPackage {
        name: "iperf3",
        ebpf: false,
        why: "pod-net benchmark: TCP stream throughput",
    },
    AptPackage {
        name: "skopeo",
        ebpf: false,
        why: "images benchmark baseline: skopeo copy from the registry",
    },
    AptPackage {
        name: "umoci",
        ebpf: false,
        why: "images benchmark baseline: umoci unpack",
    },
    AptPackage {
        name: "make",
        ebpf: false,
        why: "builds jemalloc, the API server's allocator (tikv-jemalloc-sys)",
    },
    AptPackage {
        name: "fonts-dejavu-core",
        ebpf: false,
        why: "a TTF for the benchmark plots' text",
    },
];

pub const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_BIN_DIR: &str = "/usr/lib/llvm-22/bin";
pub const NIGHTLY: &str = "nightly";
/// rust-src for `-Z build-std=core`; rustfmt and clippy for the `ebpf-fmt`/`ebpf-clippy` tiers.
pub const NIGHTLY_COMPONENTS: &[&str] = &["rust-src", "rustfmt", "clippy"];

#[derive(Debug, Clone, Copy, Default)]
pub struct SetupOptions {
    pub skip_ebpf: bool,
}

pub fn run(opts: SetupOptions) -> Result<()> {
    apt_packages(opts).context("setup: apt packages")?;
    cargo_tools().context("setup: cargo tools")?;
    python_venv().context("setup: python venv")?;
    if opts.skip_ebpf {
        println!("skip: nightly toolchain and bpf-linker (--skip-ebpf)");
    } else {
        nightly_toolchain().context("setup: nightly toolchain")?;
        bpf_linker().context("setup: bpf-linker")?;
    }
    Ok(())
}

/// Packages selected for this run.
pub fn selected_packages(opts: SetupOptions) -> Vec<&'static AptPackage> {
    APT_PACKAGES
        .iter()
        .filter(|p| !(opts.skip_ebpf && p.ebpf))
        .collect()
}

/// `dpkg-query -W -f='${Status}'` prints e.g. "install ok installed";
/// anything else ("deinstall ok config-files", "unknown ok not-installed", ...)
/// means the package is not usable.
pub fn dpkg_status_installed(status: &str) -> bool {
    status.trim() == "install ok installed"
}

fn dpkg_installed(pkg: &str) -> Result<bool> {
    let out = util::run_capture(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
        .context("dpkg-query is needed to check packages (is this a Debian/Ubuntu machine?)")?;
    // Exit status 1 with "no packages found matching" means simply absent.
    Ok(out.status.success() && dpkg_status_installed(&String::from_utf8_lossy(&out.stdout)))
}

/// How to run privileged commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    Root,
    Sudo,
    None,
}

pub fn privilege(is_root: bool, has_sudo: bool) -> Privilege {
    match (is_root, has_sudo) {
        (true, _) => Privilege::Root,
        (false, true) => Privilege::Sudo,
        (false, false) => Privilege::None,
    }
}

/// The commands that install `missing` (empty when nothing is missing).
pub fn apt_commands(missing: &[&str], privilege: Privilege) -> Vec<Vec<String>> {
    if missing.is_empty() {
        return Vec::new();
    }
    let prefix: Vec<String> = match privilege {
        Privilege::Sudo => vec![
            "sudo".into(),
            "env".into(),
            "DEBIAN_FRONTEND=noninteractive".into(),
        ],
        _ => Vec::new(),
    };
    let update: Vec<String> = prefix
        .iter()
        .cloned()
        .chain(["apt-get".into(), "update".into()])
        .collect();
    let install: Vec<String> = prefix
        .iter()
        .cloned()
        .chain(
            ["apt-get", "install", "-y", "--no-install-recommends"]
                .into_iter()
                .map(String::from),
        )
        .chain(missing.iter().map(|s| s.to_string()))
        .collect();
    vec![update, install]
}

fn apt_packages(opts: SetupOptions) -> Result<()> {
    let mut missing = Vec::new();
    for pkg in selected_packages(opts) {
        if dpkg_installed(pkg.name)? {
            println!("ok: {} present", pkg.name);
        } else {
            println!("installing {}... ({})", pkg.name, pkg.why);
            missing.push(pkg.name);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }

    let priv_ = privilege(util::is_root(), util::which("sudo").is_some());
    match priv_ {
        Privilege::Root => {}
        Privilege::Sudo => println!(
            "not running as root: using sudo for apt-get (missing: {})",
            missing.join(" ")
        ),
        Privilege::None => bail!(
            "missing apt packages: {}; not running as root and sudo is not installed.\n\
             Run as root:\n  apt-get update && DEBIAN_FRONTEND=noninteractive \
             apt-get install -y --no-install-recommends {}",
            missing.join(" "),
            missing.join(" ")
        ),
    }

    for argv in apt_commands(&missing, priv_) {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env("DEBIAN_FRONTEND", "noninteractive");
        util::run_streaming(&mut cmd)?;
    }

    for pkg in &missing {
        if !dpkg_installed(pkg)? {
            bail!("apt-get reported success but {pkg} is still not installed");
        }
        println!("installed {pkg}");
    }
    Ok(())
}

fn rustup() -> Result<PathBuf> {
    if let Some(p) = util::which("rustup") {
        return Ok(p);
    }
    util::cargo_bin_dirs()
        .into_iter()
        .map(|d| d.join("rustup"))
        .find(|p| util::is_executable(p))
        .context(
            "rustup not found on PATH or in ~/.cargo/bin; it is needed to manage the nightly \
             toolchain used for eBPF builds (install rustup, or use --skip-ebpf)",
        )
}

/// Does `rustup toolchain list` output contain the plain (undated) `nightly` channel?
pub fn has_toolchain(list: &str, channel: &str) -> bool {
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .any(|name| {
            name == channel
                || name.strip_prefix(channel).is_some_and(|rest| {
                    // "nightly-x86_64-..." is the channel; "nightly-2026-05-19-..." is a dated one.
                    rest.starts_with('-') && !rest[1..].starts_with(|c: char| c.is_ascii_digit())
                })
        })
}

/// Does `rustup component list --installed` output contain `component`?
/// Entries look like "rust-src" or "rust-std-x86_64-unknown-linux-gnu".
pub fn has_component(list: &str, component: &str) -> bool {
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .any(|name| name == component || name.starts_with(&format!("{component}-")))
}

fn nightly_toolchain() -> Result<()> {
    let rustup = rustup()?;
    let list = util::run_capture(Command::new(&rustup).args(["toolchain", "list"]))?;
    if !list.status.success() {
        bail!(
            "`rustup toolchain list` failed: {}",
            String::from_utf8_lossy(&list.stderr).trim()
        );
    }
    if has_toolchain(&String::from_utf8_lossy(&list.stdout), NIGHTLY) {
        println!("ok: {NIGHTLY} toolchain present");
    } else {
        println!("installing {NIGHTLY} toolchain...");
        let mut cmd = Command::new(&rustup);
        cmd.args([
            "toolchain",
            "install",
            NIGHTLY,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]);
        util::run_streaming(&mut cmd).context(
            "the nightly Rust toolchain is missing and could not be installed \
             (static.rust-lang.org may be unreachable from this machine: only package \
             registries are). Install `nightly` with rust-src by other means, or use --skip-ebpf",
        )?;
        println!("installed {NIGHTLY} toolchain");
    }

    let comps = util::run_capture(Command::new(&rustup).args([
        "component",
        "list",
        "--toolchain",
        NIGHTLY,
        "--installed",
    ]))?;
    if !comps.status.success() {
        bail!(
            "`rustup component list --toolchain {NIGHTLY} --installed` failed: {}",
            String::from_utf8_lossy(&comps.stderr).trim()
        );
    }
    let installed = String::from_utf8_lossy(&comps.stdout);
    for component in NIGHTLY_COMPONENTS {
        if has_component(&installed, component) {
            println!("ok: {component} ({NIGHTLY}) present");
            continue;
        }
        println!("installing {component} ({NIGHTLY})...");
        util::run_streaming(Command::new(&rustup).args([
            "component",
            "add",
            component,
            "--toolchain",
            NIGHTLY,
        ]))
        .with_context(|| format!("could not add {component} to the nightly toolchain"))?;
        println!("installed {component} ({NIGHTLY})");
    }
    Ok(())
}

/// Cargo subcommands the tiers run, installed from crates.io when `cargo <sub> --version`
/// fails: (subcommand, crate, why).
pub const CARGO_TOOLS: &[(&str, &str, &str)] = &[
    (
        "nextest",
        "cargo-nextest",
        "runs the test tier; these machines' image ships it",
    ),
    (
        "fuzz",
        "cargo-fuzz",
        "runs the fuzz tier (libFuzzer on the nightly toolchain); under a minute to build",
    ),
];

/// Installs each of [`CARGO_TOOLS`] that does not answer `--version`.
fn cargo_tools() -> Result<()> {
    let path = util::path_with_cargo_bin()?;
    for (sub, krate, why) in CARGO_TOOLS {
        let present = Command::new("cargo")
            .args([sub, "--version"])
            .env("PATH", &path)
            .output()
            .is_ok_and(|o| o.status.success());
        if present {
            println!("ok: {krate} present");
            continue;
        }
        println!("installing {krate} ({why})... (cargo install from crates.io)");
        let mut cmd = Command::new("cargo");
        cmd.args(["install", krate, "--locked"]).env("PATH", &path);
        util::run_streaming(&mut cmd)
            .with_context(|| format!("building {krate} from crates.io failed"))?;
        println!("installed {krate}");
    }
    Ok(())
}

/// The Python the pinned wheels are built for (`cp311`).
pub const PYTHON_VERSION: &str = "3.11";

/// `major.minor` from `python3 --version` output ("Python 3.11.7").
pub fn parse_python_version(output: &str) -> Option<String> {
    let v = output.trim().strip_prefix("Python ")?;
    let mut parts = v.split('.');
    let (major, minor) = (parts.next()?, parts.next()?);
    Some(format!("{major}.{minor}"))
}

/// The interpreter that makes the venv: `python3.11`, else `python3` when it is 3.11.
fn base_python() -> Result<PathBuf> {
    let mut found = Vec::new();
    for name in [format!("python{PYTHON_VERSION}"), "python3".to_string()] {
        let Some(path) = util::which(&name) else {
            continue;
        };
        let out = util::run_capture(Command::new(&path).arg("--version"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        match parse_python_version(&text) {
            Some(v) if v == PYTHON_VERSION => return Ok(path),
            other => found.push(format!(
                "{} is {}",
                path.display(),
                other.unwrap_or_else(|| "of unknown version".into())
            )),
        }
    }
    bail!(
        "no Python {PYTHON_VERSION} found ({}); the pinned wheels of {} are for CPython \
         {PYTHON_VERSION}: install python3 (Debian 12's is {PYTHON_VERSION})",
        if found.is_empty() {
            "neither python3.11 nor python3 is on PATH".to_string()
        } else {
            found.join(", ")
        },
        skiff_flags::python::REQUIREMENTS
    )
}

/// Makes the tests' venv (`skiff_flags::python::venv_dir`) from the pinned requirements,
/// unless it already holds exactly them.
fn python_venv() -> Result<()> {
    use skiff_flags::python::{self, VenvState};
    let root = util::repo_root();
    let venv = python::venv_dir();
    let requirements = python::requirements_in(&root);
    let state = python::venv_state_at(&venv, &root)
        .with_context(|| format!("reading {}", requirements.display()))?;
    if state == VenvState::Current {
        println!(
            "ok: python venv present ({}, pinned by {})",
            venv.display(),
            python::REQUIREMENTS
        );
        return Ok(());
    }
    println!(
        "installing python venv... ({}: the kubernetes client and kopf for the end-to-end \
         tests{})",
        venv.display(),
        if state == VenvState::Stale {
            "; the one there was made from other pins"
        } else {
            ""
        }
    );
    let base = base_python()?;
    // --clear: a venv made from other pins starts empty (pip would leave extra packages).
    util::run_streaming(
        Command::new(&base)
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
    )
    .context(
        "creating the venv failed (Debian's python3 needs python3-venv: \
             apt-get install python3-venv)",
    )?;
    let mut pip = Command::new(python::python_in(&venv));
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-input",
        "--disable-pip-version-check",
        "--require-hashes",
        "--only-binary",
        ":all:",
        "-r",
    ])
    .arg(&requirements);
    util::run_streaming(&mut pip)
        .context("installing the pinned Python packages from PyPI failed")?;
    let stamp = venv.join(python::STAMP);
    std::fs::copy(&requirements, &stamp).with_context(|| format!("writing {}", stamp.display()))?;
    println!(
        "installed python venv ({}, pinned by {})",
        venv.display(),
        python::REQUIREMENTS
    );
    Ok(())
}

/// Version from `bpf-linker --version` output ("bpf-linker 0.13.0").
pub fn parse_bpf_linker_version(output: &str) -> Option<&str> {
    output
        .lines()
        .find_map(|l| l.trim().strip_prefix("bpf-linker "))
        .map(|v| v.split_whitespace().next().unwrap_or(v))
}

/// Candidate bpf-linker paths: PATH first, then the cargo bin dirs.
fn bpf_linker_candidates() -> Vec<PathBuf> {
    let mut c: Vec<PathBuf> = util::which("bpf-linker").into_iter().collect();
    for dir in util::cargo_bin_dirs() {
        let p = dir.join("bpf-linker");
        if util::is_executable(&p) && !c.contains(&p) {
            c.push(p);
        }
    }
    c
}

fn bpf_linker_version(path: &Path) -> Option<String> {
    let out = Command::new(path).arg("--version").output().ok()?;
    parse_bpf_linker_version(&String::from_utf8_lossy(&out.stdout)).map(String::from)
}

fn bpf_linker() -> Result<()> {
    let mut found = Vec::new();
    for path in bpf_linker_candidates() {
        match bpf_linker_version(&path) {
            Some(v) if v == BPF_LINKER_VERSION => {
                println!("ok: bpf-linker {v} present ({})", path.display());
                return Ok(());
            }
            Some(v) => found.push(format!("{v} at {}", path.display())),
            None => found.push(format!("unreadable version at {}", path.display())),
        }
    }
    if found.is_empty() {
        println!(
            "installing bpf-linker {BPF_LINKER_VERSION}... (cargo install against the system LLVM, about a minute on 2 cores)"
        );
    } else {
        println!(
            "installing bpf-linker {BPF_LINKER_VERSION}... (found {}; about a minute on 2 cores)",
            found.join(", ")
        );
    }
    if !Path::new(LLVM_BIN_DIR).is_dir() {
        bail!(
            "{LLVM_BIN_DIR} is missing: bpf-linker needs llvm-22-dev (apt-get install llvm-22-dev)"
        );
    }
    let path = util::path_with_prefixes(&[PathBuf::from(LLVM_BIN_DIR)])?;
    let mut cmd = Command::new("cargo");
    cmd.args([
        "install",
        "bpf-linker",
        "--version",
        BPF_LINKER_VERSION,
        "--no-default-features",
        "--features",
        "llvm-22",
    ]);
    if !found.is_empty() {
        cmd.arg("--force");
    }
    cmd.env("PATH", path);
    util::run_streaming(&mut cmd).context("building bpf-linker from crates.io failed")?;

    match bpf_linker_candidates()
        .iter()
        .find(|p| bpf_linker_version(p).as_deref() == Some(BPF_LINKER_VERSION))
    {
        Some(p) => println!(
            "installed bpf-linker {BPF_LINKER_VERSION} ({})",
            p.display()
        ),
        None => bail!(
            "cargo install succeeded but bpf-linker {BPF_LINKER_VERSION} is not found afterwards"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpkg_status_parsing() {
        assert!(dpkg_status_installed("install ok installed"));
        assert!(dpkg_status_installed("install ok installed\n"));
        assert!(!dpkg_status_installed("deinstall ok config-files"));
        assert!(!dpkg_status_installed("unknown ok not-installed"));
        assert!(!dpkg_status_installed("install ok half-configured"));
        assert!(!dpkg_status_installed(""));
    }

    #[test]
    fn skip_ebpf_drops_llvm_only() {
        let all = selected_packages(SetupOptions { skip_ebpf: false });
        assert_eq!(all.len(), APT_PACKAGES.len());
        let names: Vec<_> = selected_packages(SetupOptions { skip_ebpf: true })
            .iter()
            .map(|p| p.name)
            .collect();
        assert!(!names.contains(&"llvm-22-dev"));
        assert!(!names.contains(&"libpolly-22-dev"));
        for needed in [
            "protobuf-compiler",
            "etcd-server",
            "etcd-client",
            "bpftool",
            "iproute2",
            "busybox-static",
            "python3",
            "curl",
        ] {
            assert!(names.contains(&needed), "{needed}");
        }
    }

    #[test]
    fn package_names_are_unique() {
        let mut names: Vec<_> = APT_PACKAGES.iter().map(|p| p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), APT_PACKAGES.len());
    }

    #[test]
    fn apt_commands_update_once_install_once() {
        assert!(apt_commands(&[], Privilege::Root).is_empty());
        let cmds = apt_commands(&["etcd-server", "bpftool"], Privilege::Root);
        assert_eq!(cmds.len(), 2);
        assert_eq!(cmds[0], ["apt-get", "update"]);
        assert_eq!(
            cmds[1],
            [
                "apt-get",
                "install",
                "-y",
                "--no-install-recommends",
                "etcd-server",
                "bpftool"
            ]
        );
        let sudo = apt_commands(&["bpftool"], Privilege::Sudo);
        assert_eq!(sudo[0][0], "sudo");
        assert!(sudo[1].contains(&"DEBIAN_FRONTEND=noninteractive".to_string()));
        assert_eq!(sudo[1].last().unwrap(), "bpftool");
    }

    #[test]
    fn privilege_choice() {
        assert_eq!(privilege(true, true), Privilege::Root);
        assert_eq!(privilege(true, false), Privilege::Root);
        assert_eq!(privilege(false, true), Privilege::Sudo);
        assert_eq!(privilege(false, false), Privilege::None);
    }

    #[test]
    fn toolchain_list_parsing() {
        let list = "stable-x86_64-unknown-linux-gnu (active, default)\n\
                    nightly-x86_64-unknown-linux-gnu\n\
                    1.95.0-x86_64-unknown-linux-gnu\n";
        assert!(has_toolchain(list, "nightly"));
        assert!(has_toolchain(list, "stable"));
        let dated_only = "stable-x86_64-unknown-linux-gnu (default)\n\
                          nightly-2026-05-19-x86_64-unknown-linux-gnu\n";
        assert!(!has_toolchain(dated_only, "nightly"));
        assert!(!has_toolchain("no installed toolchains\n", "nightly"));
    }

    #[test]
    fn component_list_parsing() {
        let list = "cargo-x86_64-unknown-linux-gnu\nrust-src\nrust-std-x86_64-unknown-linux-gnu\n";
        assert!(has_component(list, "rust-src"));
        assert!(has_component(list, "rust-std"));
        assert!(!has_component(
            "cargo-x86_64-unknown-linux-gnu\nrust-std-x86_64-unknown-linux-gnu\n",
            "rust-src"
        ));
        assert!(!has_component("rust-src-extra\n", "rust-s"));
    }

    #[test]
    fn python_version_parsing() {
        assert_eq!(
            parse_python_version("Python 3.11.7\n").as_deref(),
            Some("3.11")
        );
        assert_eq!(
            parse_python_version("Python 3.12.0rc1").as_deref(),
            Some("3.12")
        );
        assert_eq!(parse_python_version("python3: not found"), None);
    }

    #[test]
    fn bpf_linker_version_parsing() {
        assert_eq!(
            parse_bpf_linker_version("bpf-linker 0.13.0\n"),
            Some("0.13.0")
        );
        assert_eq!(
            parse_bpf_linker_version("bpf-linker 0.9.14 (abc)\n"),
            Some("0.9.14")
        );
        assert_eq!(parse_bpf_linker_version("something else"), None);
    }
}
