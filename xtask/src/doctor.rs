//! `cargo xtask doctor`: checks every prerequisite of building, testing, benchmarking and
//! `up` by *using* it, never by asking dpkg whether a package is present (a package can be
//! installed and still not do the job: `protobuf-compiler` without `libprotobuf-dev` has no
//! well-known types).
//!
//! Each check prints one line: `ok   <what>` or `FAIL <what>: <why>; fix: <command>`.
//! `cargo xtask test` and `cargo xtask up` run the doctor after setup and stop with those
//! lines instead of a compiler backtrace.
//!
//! Checks that need root (loading and attaching a BPF program, creating a cgroup) are skipped
//! with a `skip` line when not running as root; everything that needs them (`up`'s agents,
//! the kernel tests) needs root anyway.
//!
//! Among the checks: protoc compiles a file importing `google/protobuf/descriptor.proto`; the
//! nightly toolchain with rust-src and bpf-linker links a tiny BPF object (no registry crate);
//! bpftool loads it and attaches it to a fresh child of the cgroup v2 mount (pinned in a
//! private bpffs, everything removed again); etcd starts on free loopback ports and answers
//! `/health`; the target directory's disk has [`DISK_NEEDED_GIB`] free. Unit tests prove that
//! every apt package and cargo tool `setup` installs is used by some check.

use std::fmt;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::util;

/// What to run to get a missing prerequisite back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fix {
    /// An apt package (`cargo xtask setup` installs it).
    Apt(&'static str),
    /// A rustup command (`cargo xtask setup` runs it).
    Rustup(&'static str),
    /// A `cargo install` (`cargo xtask setup` runs it).
    CargoInstall(&'static str),
    /// Something setup cannot do; the text says what to do.
    Manual(&'static str),
}

impl fmt::Display for Fix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fix::Apt(pkg) => write!(
                f,
                "apt-get install -y --no-install-recommends {pkg} (or: cargo xtask setup)"
            ),
            Fix::Rustup(args) => write!(f, "rustup {args} (or: cargo xtask setup)"),
            Fix::CargoInstall(args) => write!(f, "cargo install {args} (or: cargo xtask setup)"),
            Fix::Manual(text) => f.write_str(text),
        }
    }
}

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok(String),
    Fail { why: String, fix: Fix },
    Skip(String),
}

/// One prerequisite, checked by use.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    /// Short name, also accepted by `cargo xtask doctor --only NAME`.
    pub name: &'static str,
    /// What it is for, shown with `--verbose` style output and in failures.
    pub what: &'static str,
    /// The fixes this check can ask for (used to prove every package setup installs has a
    /// check; the verdict names the one that applies).
    pub fixes: &'static [Fix],
    pub needs_root: bool,
    pub run: fn(&Context) -> Verdict,
}

/// Where the checks run: a scratch directory and the PATH children get.
#[derive(Debug)]
pub struct Context {
    pub scratch: PathBuf,
    pub path: std::ffi::OsString,
}

/// The nightly toolchain used for eBPF builds, and the packages it needs.
use crate::setup::NIGHTLY;
/// kubectl as the tests call it (`/usr/bin/kubectl` is a version dispatcher).
pub const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.32";
/// The TTF the benchmark charts load (perf/src/plot.rs tries this one first).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Every check, in the order they print.
pub const CHECKS: &[Check] = &[
    Check {
        name: "protoc",
        what: "protoc with protobuf's well-known types (prost, tonic and etcd-client builds)",
        fixes: &[Fix::Apt("protobuf-compiler"), Fix::Apt("libprotobuf-dev")],
        needs_root: false,
        run: check_protoc,
    },
    Check {
        name: "ebpf-toolchain",
        what: "nightly Rust with rust-src and bpf-linker (the eBPF programs)",
        fixes: &[
            Fix::Rustup("toolchain install nightly --profile minimal --component rust-src"),
            Fix::Rustup("component add rust-src --toolchain nightly"),
            Fix::CargoInstall(
                "bpf-linker --version 0.13.0 --no-default-features --features llvm-22",
            ),
            Fix::Apt("llvm-22-dev"),
            Fix::Apt("libpolly-22-dev"),
            Fix::Apt("libzstd-dev"),
            Fix::Apt("zlib1g-dev"),
        ],
        needs_root: false,
        run: check_ebpf_toolchain,
    },
    Check {
        name: "ebpf-lint",
        what: "rustfmt and clippy of the nightly toolchain (the ebpf-fmt and ebpf-clippy tiers)",
        fixes: &[
            Fix::Rustup("component add rustfmt --toolchain nightly"),
            Fix::Rustup("component add clippy --toolchain nightly"),
        ],
        needs_root: false,
        run: check_ebpf_lint,
    },
    Check {
        name: "bpftool",
        what: "bpftool (inspecting and, here, loading BPF programs)",
        fixes: &[Fix::Apt("bpftool")],
        needs_root: false,
        run: check_bpftool,
    },
    Check {
        name: "bpf-load",
        what: "the cgroup v2 mount, and loading and attaching a BPF program to a cgroup",
        fixes: &[
            Fix::Apt("bpftool"),
            Fix::Manual(
                "run as root on a kernel with BPF and cgroup v2 (see ../shared/platform.md)",
            ),
        ],
        needs_root: true,
        run: check_bpf_load,
    },
    Check {
        name: "etcd",
        what: "etcd answering on a loopback port (the etcd store backend and its tests)",
        fixes: &[Fix::Apt("etcd-server")],
        needs_root: false,
        run: check_etcd,
    },
    Check {
        name: "registry",
        what: "docker-registry (the OCI distribution registry) answering /v2/ on a loopback port",
        fixes: &[Fix::Apt("docker-registry")],
        needs_root: false,
        run: check_registry,
    },
    Check {
        name: "etcdctl",
        what: "etcdctl",
        fixes: &[Fix::Apt("etcd-client")],
        needs_root: false,
        run: check_etcdctl,
    },
    Check {
        name: "cargo-nextest",
        what: "cargo-nextest (runs the tests with per-test time limits)",
        fixes: &[Fix::CargoInstall("cargo-nextest --locked")],
        needs_root: false,
        run: check_nextest,
    },
    Check {
        name: "cargo-fuzz",
        what: "cargo-fuzz (the fuzz tier: libFuzzer targets on the nightly toolchain)",
        fixes: &[Fix::CargoInstall("cargo-fuzz --locked")],
        needs_root: false,
        run: check_cargo_fuzz,
    },
    Check {
        name: "iproute2",
        what: "ip (network namespaces, veths, routes in tests and `up`)",
        fixes: &[Fix::Apt("iproute2")],
        needs_root: false,
        run: check_ip,
    },
    Check {
        name: "iptables",
        what: "iptables, iptables-save and iptables-restore (rule checks, kube-proxy baselines)",
        fixes: &[Fix::Apt("iptables")],
        needs_root: false,
        run: check_iptables,
    },
    Check {
        name: "nft",
        what: "nft (rule checks, the nftables baseline)",
        fixes: &[Fix::Apt("nftables")],
        needs_root: false,
        run: check_nft,
    },
    Check {
        name: "skopeo+umoci",
        what: "umoci makes an OCI image layout and skopeo copies it (images benchmark baseline)",
        fixes: &[Fix::Apt("skopeo"), Fix::Apt("umoci")],
        needs_root: false,
        run: check_skopeo_umoci,
    },
    Check {
        name: "iperf3",
        what: "iperf3 (pod-net benchmark)",
        fixes: &[Fix::Apt("iperf3")],
        needs_root: false,
        run: check_iperf3,
    },
    Check {
        name: "busybox",
        what: "busybox (static binaries inside test containers)",
        fixes: &[Fix::Apt("busybox-static")],
        needs_root: false,
        run: check_busybox,
    },
    Check {
        name: "python3",
        what: "/usr/bin/python3 (test servers and clients inside pods)",
        fixes: &[Fix::Apt("python3")],
        needs_root: false,
        run: check_python3,
    },
    Check {
        name: "python-venv",
        what: "the tests' Python venv: the official kubernetes client and kopf at their pins",
        fixes: &[PYTHON_VENV_FIX, Fix::Apt("python3-venv")],
        needs_root: false,
        run: check_python_venv,
    },
    Check {
        name: "curl",
        what: "/usr/bin/curl (copied with its libraries into test pods, which call the API server)",
        fixes: &[Fix::Apt("curl")],
        needs_root: false,
        run: check_curl,
    },
    Check {
        name: "kubectl",
        what: "kubectl 1.32 (the real client the API tests drive)",
        fixes: &[Fix::Manual(
            "kubectl ships with this machine's image at /usr/lib/google-cloud-sdk/bin; \
             install the Google Cloud SDK's kubectl 1.32 there",
        )],
        needs_root: false,
        run: check_kubectl,
    },
    Check {
        name: "disk",
        what: "free space where the build goes (a clean build and test run needs 10 GiB)",
        fixes: &[Fix::Manual(
            "free space on that filesystem (`cargo clean` in old checkouts and worktrees \
             removes their target directories), or point CARGO_TARGET_DIR at a larger one",
        )],
        needs_root: false,
        run: check_disk,
    },
    Check {
        name: "make",
        what: "GNU make (the build of jemalloc, the API server's allocator)",
        fixes: &[Fix::Apt("make")],
        needs_root: false,
        run: check_make,
    },
    Check {
        name: "font",
        what: "a TTF for the benchmark charts",
        fixes: &[Fix::Apt("fonts-dejavu-core")],
        needs_root: false,
        run: check_font,
    },
];

/// Options of `cargo xtask doctor`.
#[derive(Debug, Clone, Default)]
pub struct DoctorOptions {
    /// Run only these checks (by name).
    pub only: Vec<String>,
    /// Print the checks and what each proves, run none.
    pub list: bool,
}

/// `--list`: each check, what it proves, and what fixes it.
pub fn list() -> String {
    let mut out = String::new();
    for c in CHECKS {
        let fixes: Vec<String> = c
            .fixes
            .iter()
            .map(|f| match f {
                Fix::Apt(p) => format!("apt {p}"),
                Fix::Rustup(a) => format!("rustup {a}"),
                Fix::CargoInstall(a) => format!("cargo install {a}"),
                Fix::Manual(_) => "by hand".to_string(),
            })
            .collect();
        let root = if c.needs_root { " (root)" } else { "" };
        out.push_str(&format!(
            "{:<15} {}{root}\n{:<15} fixed by: {}\n",
            c.name,
            c.what,
            "",
            fixes.join("; ")
        ));
    }
    out
}

/// Runs the checks, printing one line each; fails with the number of failures.
pub fn run(opts: &DoctorOptions) -> Result<()> {
    if opts.list {
        print!("{}", list());
        return Ok(());
    }
    let selected: Vec<&Check> = if opts.only.is_empty() {
        CHECKS.iter().collect()
    } else {
        let mut v = Vec::new();
        for name in &opts.only {
            match CHECKS.iter().find(|c| c.name == name) {
                Some(c) => v.push(c),
                None => bail!(
                    "unknown check {name:?}; the checks are: {}",
                    CHECKS.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
                ),
            }
        }
        v
    };
    let scratch = util::repo_root().join("target").join("xtask-doctor");
    std::fs::create_dir_all(&scratch)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", scratch.display()))?;
    let ctx = Context {
        scratch,
        path: util::path_with_cargo_bin()?,
    };
    let root = util::is_root();
    let mut failed = Vec::new();
    for check in selected {
        let verdict = if check.needs_root && !root {
            Verdict::Skip("needs root".into())
        } else {
            (check.run)(&ctx)
        };
        println!("{}", line(check, &verdict));
        if matches!(verdict, Verdict::Fail { .. }) {
            failed.push(check.name);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!(
            "doctor: {} prerequisite(s) missing or broken: {} (each FAIL line above names the fix)",
            failed.len(),
            failed.join(", ")
        )
    }
}

/// The one line printed for a check.
pub fn line(check: &Check, verdict: &Verdict) -> String {
    match verdict {
        Verdict::Ok(detail) => format!("ok   {}: {detail}", check.name),
        Verdict::Skip(why) => format!("skip {}: {why}", check.name),
        Verdict::Fail { why, fix } => {
            let why = why.replace('\n', " ");
            format!("FAIL {}: {why}; fix: {fix}", check.name)
        }
    }
}

fn fail(why: impl Into<String>, fix: Fix) -> Verdict {
    Verdict::Fail {
        why: why.into(),
        fix,
    }
}

/// The first line of a command's stderr (or stdout), for one-line failure reasons.
fn first_line(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let text = if err.trim().is_empty() {
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        err.into_owned()
    };
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(no output)")
        .to_string()
}

/// Runs `program args`; `Ok(output)` when it ran and succeeded, else a one-line reason.
fn run_ok(ctx: &Context, program: &str, args: &[&str]) -> Result<std::process::Output, String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    run_cmd_ok(ctx, cmd)
}

fn run_cmd_ok(ctx: &Context, mut cmd: Command) -> Result<std::process::Output, String> {
    cmd.env("PATH", &ctx.path).stdin(Stdio::null());
    let program = cmd.get_program().to_string_lossy().into_owned();
    match cmd.output() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!("{program} not found")),
        Err(e) => Err(format!("{program} could not start: {e}")),
        Ok(out) if !out.status.success() => Err(format!(
            "`{}` failed ({}): {}",
            util::display_cmd(&cmd),
            out.status,
            first_line(&out)
        )),
        Ok(out) => Ok(out),
    }
}

/// A simple "runs and prints a version" check.
fn version_check(ctx: &Context, program: &str, args: &[&str], fix: Fix) -> Verdict {
    match run_ok(ctx, program, args) {
        Ok(out) => Verdict::Ok(first_line(&out)),
        Err(why) => fail(why, fix),
    }
}

// ---- protoc ----------------------------------------------------------------------------

/// The protoc that prost-build and tonic-build use: `$PROTOC`, else `protoc` on PATH.
fn protoc_program() -> String {
    std::env::var("PROTOC")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "protoc".into())
}

fn check_protoc(ctx: &Context) -> Verdict {
    check_protoc_with(ctx, &protoc_program())
}

/// Compiles a file that imports `google/protobuf/descriptor.proto` (what etcd-client's build
/// script needs) with `protoc`.
pub fn check_protoc_with(ctx: &Context, protoc: &str) -> Verdict {
    let version = match run_ok(ctx, protoc, &["--version"]) {
        Ok(out) => first_line(&out),
        Err(why) => return fail(why, Fix::Apt("protobuf-compiler")),
    };
    let dir = ctx.scratch.join("protoc");
    let file = dir.join("doctor_wkt.proto");
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::write(
            &file,
            "syntax = \"proto3\";\n\
             package doctor;\n\
             import \"google/protobuf/descriptor.proto\";\n\
             import \"google/protobuf/timestamp.proto\";\n\
             message Probe { google.protobuf.FileDescriptorProto file = 1; \
             google.protobuf.Timestamp at = 2; }\n",
        )
    });
    if let Err(e) = written {
        return fail(
            format!("cannot write {}: {e}", file.display()),
            Fix::Manual("make target/ writable"),
        );
    }
    let proto_path = format!("--proto_path={}", dir.display());
    let out_file = dir.join("doctor_wkt.pb");
    let out_arg = format!("--descriptor_set_out={}", out_file.display());
    match run_ok(
        ctx,
        protoc,
        &[
            &proto_path,
            &out_arg,
            "--include_imports",
            "doctor_wkt.proto",
        ],
    ) {
        Ok(_) => Verdict::Ok(format!(
            "{version} compiles a file importing google/protobuf/descriptor.proto"
        )),
        Err(why) if why.contains("descriptor.proto") || why.contains("timestamp.proto") => fail(
            format!(
                "{protoc} ({version}) cannot find google/protobuf/descriptor.proto, protobuf's \
                 well-known types"
            ),
            Fix::Apt("libprotobuf-dev"),
        ),
        Err(why) => fail(why, Fix::Apt("libprotobuf-dev")),
    }
}

// ---- the eBPF toolchain ----------------------------------------------------------------

/// A tiny eBPF program: a `cgroup_skb/ingress` program that lets every packet through. Built
/// the way aya-build builds Skiff's programs (nightly, `-Z build-std=core`, bpf-linker with
/// BTF), without any crate from the registry.
const PROBE_MAIN: &str = r#"#![no_std]
#![no_main]

#[unsafe(no_mangle)]
#[unsafe(link_section = "cgroup_skb/ingress")]
pub extern "C" fn xtask_doctor(_skb: *mut u8) -> i32 {
    1
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "license")]
pub static LICENSE: [u8; 4] = *b"GPL\0";

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
"#;

const PROBE_MANIFEST: &str = r#"[package]
name = "xtask-doctor-bpf"
version = "0.0.0"
edition = "2024"
publish = false

[[bin]]
name = "xtask-doctor-bpf"
path = "src/main.rs"

[profile.release]
panic = "abort"
debug = 2

[profile.dev]
panic = "abort"

[workspace]
"#;

/// ELF `e_machine` of BPF objects.
const EM_BPF: u16 = 247;

/// Path of the probe object once built.
fn probe_object(ctx: &Context) -> PathBuf {
    ctx.scratch
        .join("bpf-probe")
        .join("target")
        .join("bpfel-unknown-none")
        .join("release")
        .join("xtask-doctor-bpf")
}

/// Does this look like an ELF BPF object (little-endian, `e_machine == EM_BPF`)?
pub fn is_bpf_elf(bytes: &[u8]) -> bool {
    bytes.len() > 20
        && bytes.starts_with(b"\x7fELF")
        && bytes[5] == 1
        && u16::from_le_bytes([bytes[18], bytes[19]]) == EM_BPF
}

fn check_ebpf_toolchain(ctx: &Context) -> Verdict {
    // The toolchain first, so each missing piece gets its own message.
    let nightly = match run_ok(ctx, "rustup", &["run", NIGHTLY, "rustc", "--version"]) {
        Ok(out) => first_line(&out),
        Err(why) => {
            return fail(
                format!("the {NIGHTLY} toolchain does not run: {why}"),
                Fix::Rustup("toolchain install nightly --profile minimal --component rust-src"),
            );
        }
    };
    let sysroot = match run_ok(
        ctx,
        "rustup",
        &["run", NIGHTLY, "rustc", "--print", "sysroot"],
    ) {
        Ok(out) => PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        Err(why) => {
            return fail(
                why,
                Fix::Rustup("toolchain install nightly --profile minimal --component rust-src"),
            );
        }
    };
    if !sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return fail(
            format!("{nightly} has no rust-src (needed for -Z build-std=core)"),
            Fix::Rustup("component add rust-src --toolchain nightly"),
        );
    }
    let linker = match run_ok(ctx, "bpf-linker", &["--version"]) {
        Ok(out) => first_line(&out),
        Err(why) => {
            return fail(
                why,
                Fix::CargoInstall(
                    "bpf-linker --version 0.13.0 --no-default-features --features llvm-22",
                ),
            );
        }
    };

    // Then use them: build and link a tiny BPF object.
    let dir = ctx.scratch.join("bpf-probe");
    let written = std::fs::create_dir_all(dir.join("src"))
        .and_then(|()| std::fs::write(dir.join("Cargo.toml"), PROBE_MANIFEST))
        .and_then(|()| std::fs::write(dir.join("src/main.rs"), PROBE_MAIN));
    if let Err(e) = written {
        return fail(
            format!("cannot write the probe crate in {}: {e}", dir.display()),
            Fix::Manual("make target/ writable"),
        );
    }
    let mut cmd = util::nightly_cargo(&[
        "build",
        "--quiet",
        "--release",
        "-Z",
        "build-std=core",
        "--target",
        "bpfel-unknown-none",
    ]);
    cmd.current_dir(&dir)
        .env("PATH", &ctx.path)
        .env("RUSTFLAGS", "-C debuginfo=2 -C link-arg=--btf")
        .stdin(Stdio::null());
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => {
            return fail(
                format!("rustup could not start: {e}"),
                Fix::Rustup("toolchain install nightly --profile minimal --component rust-src"),
            );
        }
    };
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stderr);
        let reason = text
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("error"))
            .unwrap_or_else(|| text.lines().next().unwrap_or("(no output)"))
            .to_string();
        let fix = if text.contains("LLVM") || text.contains("libLLVM") {
            Fix::Apt("llvm-22-dev")
        } else {
            Fix::CargoInstall(
                "bpf-linker --version 0.13.0 --no-default-features --features llvm-22 --force",
            )
        };
        return fail(
            format!("building a tiny BPF object with {nightly} and {linker} failed: {reason}"),
            fix,
        );
    }
    match std::fs::read(probe_object(ctx)) {
        Ok(bytes) if is_bpf_elf(&bytes) => Verdict::Ok(format!(
            "{nightly} with rust-src and {linker} link a BPF object ({} bytes)",
            bytes.len()
        )),
        Ok(_) => fail(
            format!(
                "{} is not a BPF ELF object (is bpf-linker the linker?)",
                probe_object(ctx).display()
            ),
            Fix::CargoInstall(
                "bpf-linker --version 0.13.0 --no-default-features --features llvm-22 --force",
            ),
        ),
        Err(e) => fail(
            format!(
                "the build left no object at {}: {e}",
                probe_object(ctx).display()
            ),
            Fix::CargoInstall(
                "bpf-linker --version 0.13.0 --no-default-features --features llvm-22 --force",
            ),
        ),
    }
}

// ---- bpftool, cgroup v2 and loading a program ------------------------------------------

fn check_ebpf_lint(ctx: &Context) -> Verdict {
    let mut found = Vec::new();
    for (tool, fix) in [
        (
            "fmt",
            Fix::Rustup("component add rustfmt --toolchain nightly"),
        ),
        (
            "clippy",
            Fix::Rustup("component add clippy --toolchain nightly"),
        ),
    ] {
        match run_cmd_ok(ctx, util::nightly_cargo(&[tool, "--version"])) {
            Ok(out) => found.push(first_line(&out)),
            Err(why) => return fail(format!("{NIGHTLY} cargo {tool}: {why}"), fix),
        }
    }
    Verdict::Ok(found.join(", "))
}

fn check_bpftool(ctx: &Context) -> Verdict {
    version_check(ctx, "bpftool", &["version"], Fix::Apt("bpftool"))
}

/// The cgroup v2 mount point, read with findmnt (util-linux, on every image).
fn cgroup2_mount(ctx: &Context) -> Result<PathBuf, String> {
    let out = run_ok(ctx, "findmnt", &["-n", "-t", "cgroup2", "-o", "TARGET"])
        .map_err(|_| "no cgroup2 file system is mounted".to_string())?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| "no cgroup2 file system is mounted".to_string())
}

/// Loads the probe object (built by the ebpf-toolchain check) with bpftool and attaches it to
/// a fresh child cgroup of the v2 mount; removes everything again whatever happens.
fn check_bpf_load(ctx: &Context) -> Verdict {
    let manual =
        Fix::Manual("run as root on a kernel with BPF and cgroup v2 (see ../shared/platform.md)");
    let cg_root = match cgroup2_mount(ctx) {
        Ok(p) => p,
        Err(why) => return fail(why, manual),
    };
    let object = probe_object(ctx);
    if !object.exists() {
        // Built by the ebpf-toolchain check; build it now when run alone.
        if let Verdict::Fail { why, fix } = check_ebpf_toolchain(ctx) {
            return fail(format!("no BPF object to load: {why}"), fix);
        }
    }
    let mut cleanup = Cleanup::default();
    let tag = format!("xtask-doctor-{}", std::process::id());

    // A private bpffs to pin in, so the machine's /sys/fs/bpf is never touched.
    let bpffs = ctx.scratch.join(format!("bpffs-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&bpffs) {
        return fail(format!("creating {}: {e}", bpffs.display()), manual);
    }
    cleanup.dirs.push(bpffs.clone());
    let bpffs_s = bpffs.display().to_string();
    if let Err(why) = run_ok(ctx, "mount", &["-t", "bpf", "bpf", &bpffs_s]) {
        return fail(format!("cannot mount a bpf file system: {why}"), manual);
    }
    cleanup.mounts.push(bpffs.clone());

    if let Err(why) = run_ok(ctx, "bpftool", &["version"]) {
        return fail(
            format!("{why} (it loads the probe program)"),
            Fix::Apt("bpftool"),
        );
    }
    let pin = bpffs.join("prog").display().to_string();
    let obj = object.display().to_string();
    if let Err(why) = run_ok(
        ctx,
        "bpftool",
        &["prog", "load", &obj, &pin, "type", "cgroup/skb"],
    ) {
        return fail(
            format!("the kernel refused a cgroup_skb program: {why}"),
            manual,
        );
    }
    let cg = cg_root.join(&tag);
    if let Err(e) = std::fs::create_dir(&cg) {
        return fail(
            format!("cannot create a cgroup under {}: {e}", cg_root.display()),
            manual,
        );
    }
    cleanup.cgroups.push(cg.clone());
    let cg_s = cg.display().to_string();
    if let Err(why) = run_ok(
        ctx,
        "bpftool",
        &["cgroup", "attach", &cg_s, "ingress", "pinned", &pin],
    ) {
        return fail(
            format!("cannot attach a BPF program to a v2 cgroup: {why}"),
            manual,
        );
    }
    let detached = run_ok(
        ctx,
        "bpftool",
        &["cgroup", "detach", &cg_s, "ingress", "pinned", &pin],
    );
    drop(cleanup);
    match detached {
        Ok(_) => Verdict::Ok(format!(
            "cgroup v2 at {}; a cgroup_skb program loads and attaches",
            cg_root.display()
        )),
        Err(why) => fail(format!("detaching the probe program: {why}"), manual),
    }
}

/// Undoes what the BPF check made, in reverse order, also on early return.
#[derive(Debug, Default)]
struct Cleanup {
    dirs: Vec<PathBuf>,
    mounts: Vec<PathBuf>,
    cgroups: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for cg in self.cgroups.drain(..) {
            let _ = std::fs::remove_dir(&cg);
        }
        for m in self.mounts.drain(..) {
            let _ = Command::new("umount").arg(&m).status();
        }
        for d in self.dirs.drain(..) {
            let _ = std::fs::remove_dir(&d);
        }
    }
}

// ---- etcd --------------------------------------------------------------------------------

fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// Kills and reaps the child on drop (only this process's own child, by its pid).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET /health` over plain HTTP/1.0 on loopback; the body.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}

fn check_etcd(ctx: &Context) -> Verdict {
    let fix = Fix::Apt("etcd-server");
    let version = match run_ok(ctx, "etcd", &["--version"]) {
        Ok(out) => first_line(&out),
        Err(why) => return fail(why, fix),
    };
    let (client, peer) = match (free_port(), free_port()) {
        (Ok(c), Ok(p)) if c != p => (c, p),
        (Err(e), _) | (_, Err(e)) => return fail(e, Fix::Manual("free a loopback port")),
        _ => {
            return fail(
                "no two free loopback ports",
                Fix::Manual("free loopback ports"),
            );
        }
    };
    let data = ctx.scratch.join(format!("etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .env("PATH", &ctx.path)
        .args([
            "--name=doctor".to_string(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=doctor={peer_url}"),
            "--initial-cluster-state=new".into(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => Reaped(c),
        Err(e) => return fail(format!("etcd could not start: {e}"), fix),
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, client));
    let deadline = Instant::now() + Duration::from_secs(15);
    let verdict = loop {
        if let Ok(Some(status)) = child.0.try_wait() {
            break fail(format!("etcd exited at start ({status})"), fix);
        }
        if let Ok(body) = http_get(addr, "/health")
            && body.contains("\"health\":\"true\"")
        {
            break Verdict::Ok(format!("{version} answers /health on {client_url}"));
        }
        if Instant::now() > deadline {
            break fail(
                format!("etcd did not answer on {client_url} within 15 s"),
                fix,
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(child);
    let _ = std::fs::remove_dir_all(&data);
    verdict
}

fn check_registry(ctx: &Context) -> Verdict {
    let fix = Fix::Apt("docker-registry");
    let port = match free_port() {
        Ok(p) => p,
        Err(why) => return fail(why, fix),
    };
    let data = ctx.scratch.join(format!("registry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    if let Err(e) = std::fs::create_dir_all(&data) {
        return fail(format!("creating {}: {e}", data.display()), fix);
    }
    let config = data.join("config.yml");
    let text = format!(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
        data.join("storage").display()
    );
    if let Err(e) = std::fs::write(&config, text) {
        return fail(format!("writing {}: {e}", config.display()), fix);
    }
    let mut cmd = Command::new("docker-registry");
    cmd.arg("serve")
        .arg(&config)
        .env("PATH", &ctx.path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = match cmd.spawn() {
        Ok(c) => Reaped(c),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return fail("docker-registry not found", fix);
        }
        Err(e) => return fail(format!("docker-registry could not start: {e}"), fix),
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + Duration::from_secs(10);
    let verdict = loop {
        match http_get(addr, "/v2/") {
            Ok(resp) if resp.lines().next().is_some_and(|l| l.contains(" 200 ")) => {
                break Verdict::Ok(format!("docker-registry answers /v2/ on {addr}"));
            }
            _ if Instant::now() > deadline => {
                break fail(
                    format!("docker-registry did not answer /v2/ on {addr} within 10 s"),
                    fix,
                );
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    drop(child);
    let _ = std::fs::remove_dir_all(&data);
    verdict
}

fn check_etcdctl(ctx: &Context) -> Verdict {
    version_check(ctx, "etcdctl", &["version"], Fix::Apt("etcd-client"))
}

// ---- the rest: each program runs ---------------------------------------------------------

fn check_nextest(ctx: &Context) -> Verdict {
    version_check(
        ctx,
        "cargo",
        &["nextest", "--version"],
        Fix::CargoInstall("cargo-nextest --locked"),
    )
}

fn check_cargo_fuzz(ctx: &Context) -> Verdict {
    version_check(
        ctx,
        "cargo",
        &["fuzz", "--version"],
        Fix::CargoInstall("cargo-fuzz --locked"),
    )
}

fn check_ip(ctx: &Context) -> Verdict {
    version_check(ctx, "ip", &["-V"], Fix::Apt("iproute2"))
}

fn check_iptables(ctx: &Context) -> Verdict {
    for program in ["iptables-save", "iptables-restore"] {
        if let Err(why) = run_ok(ctx, program, &["--version"]) {
            return fail(why, Fix::Apt("iptables"));
        }
    }
    version_check(ctx, "iptables", &["--version"], Fix::Apt("iptables"))
}

fn check_nft(ctx: &Context) -> Verdict {
    version_check(ctx, "nft", &["--version"], Fix::Apt("nftables"))
}

/// `umoci init` + `umoci new` make a layout, `skopeo copy` copies it to another (which also
/// proves skopeo's signature policy file is there).
fn check_skopeo_umoci(ctx: &Context) -> Verdict {
    let dir = ctx.scratch.join(format!("oci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (a, b) = (dir.join("a"), dir.join("b"));
    let a_s = a.display().to_string();
    let verdict = (|| {
        run_ok(ctx, "umoci", &["init", "--layout", &a_s]).map_err(|e| (e, Fix::Apt("umoci")))?;
        run_ok(ctx, "umoci", &["new", "--image", &format!("{a_s}:t")])
            .map_err(|e| (e, Fix::Apt("umoci")))?;
        run_ok(
            ctx,
            "skopeo",
            &[
                "copy",
                "--quiet",
                &format!("oci:{a_s}:t"),
                &format!("oci:{}:t", b.display()),
            ],
        )
        .map_err(|e| (e, Fix::Apt("skopeo")))?;
        let version = run_ok(ctx, "skopeo", &["--version"])
            .map(|o| first_line(&o))
            .unwrap_or_default();
        Ok::<_, (String, Fix)>(format!("{version}; umoci layout copied"))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    match verdict {
        Ok(msg) => Verdict::Ok(msg),
        Err((why, fix)) => fail(why, fix),
    }
}

fn check_iperf3(ctx: &Context) -> Verdict {
    version_check(ctx, "iperf3", &["--version"], Fix::Apt("iperf3"))
}

fn check_busybox(ctx: &Context) -> Verdict {
    match run_ok(ctx, "busybox", &["true"]) {
        Ok(_) => match run_ok(ctx, "busybox", &["--help"]) {
            Ok(out) => Verdict::Ok(first_line(&out)),
            Err(_) => Verdict::Ok("busybox runs".into()),
        },
        Err(why) => fail(why, Fix::Apt("busybox-static")),
    }
}

fn check_python3(ctx: &Context) -> Verdict {
    // The tests run this exact path inside pods (a pyenv shim on PATH is not enough).
    version_check(ctx, "/usr/bin/python3", &["--version"], Fix::Apt("python3"))
}

/// What brings the tests' venv back.
const PYTHON_VENV_FIX: Fix =
    Fix::Manual("run cargo xtask setup (it makes the venv from tests/python/requirements.txt)");

fn check_python_venv(ctx: &Context) -> Verdict {
    use skiff_flags::python;
    let venv = python::venv_dir();
    let root = util::repo_root();
    let requirements = python::requirements_in(&root);
    let text = match std::fs::read_to_string(&requirements) {
        Ok(t) => t,
        Err(e) => {
            return fail(
                format!("{}: {e}", requirements.display()),
                Fix::Manual("restore tests/python/requirements.txt from git"),
            );
        }
    };
    let interpreter = python::python_in(&venv);
    if !interpreter.exists() {
        return fail(format!("no venv at {}", venv.display()), PYTHON_VENV_FIX);
    }
    let stamp = std::fs::read_to_string(venv.join(python::STAMP)).ok();
    if python::venv_state(true, stamp.as_deref(), &text) != python::VenvState::Current {
        return fail(
            format!(
                "the venv at {} was not installed from the current {}",
                venv.display(),
                python::REQUIREMENTS
            ),
            PYTHON_VENV_FIX,
        );
    }
    let mut cmd = Command::new(&interpreter);
    cmd.args(["-c", &python::import_check_script()]);
    let out = match run_cmd_ok(ctx, cmd) {
        Ok(out) => out,
        Err(why) => return fail(why, PYTHON_VENV_FIX),
    };
    let printed = String::from_utf8_lossy(&out.stdout);
    python_venv_verdict(&venv, &printed, &python::pins(&text))
}

/// The verdict on what the venv's import check printed against the pins.
pub fn python_venv_verdict(
    venv: &std::path::Path,
    printed: &str,
    pins: &[(String, String)],
) -> Verdict {
    let wrong = skiff_flags::python::version_mismatches(printed, pins);
    if wrong.is_empty() {
        let found: Vec<&str> = printed.lines().map(str::trim).collect();
        Verdict::Ok(format!("{} ({})", found.join(", "), venv.display()))
    } else {
        let why: Vec<String> = wrong
            .iter()
            .map(|(p, found, want)| {
                let found = if found.is_empty() { "missing" } else { found };
                format!("{p} {found}, pinned {want}")
            })
            .collect();
        fail(
            format!("{}: {}", venv.display(), why.join("; ")),
            PYTHON_VENV_FIX,
        )
    }
}

fn check_curl(ctx: &Context) -> Verdict {
    // The tests copy this exact path (and what `ldd` names for it) into an image.
    version_check(ctx, "/usr/bin/curl", &["--version"], Fix::Apt("curl"))
}

fn check_kubectl(ctx: &Context) -> Verdict {
    let fix = Fix::Manual(
        "kubectl ships with this machine's image at /usr/lib/google-cloud-sdk/bin; install \
         the Google Cloud SDK's kubectl 1.32 there",
    );
    match run_ok(ctx, KUBECTL, &["version", "--client"]) {
        Ok(out) => Verdict::Ok(first_line(&out)),
        Err(why) => fail(why, fix),
    }
}

/// Free space a clean `cargo xtask test` needs, in GiB: a clean clone run as CI runs it
/// (`CARGO_INCREMENTAL=0`) filled 4.8 GiB of target/ and ~1.5 GiB of the fuzz target's;
/// incremental builds of a working checkout take about twice that. CI once died with
/// "No space left on device" linking the agent, after 1 m 37 s of the test tier.
pub const DISK_NEEDED_GIB: u64 = 10;

/// Where cargo writes: `$CARGO_TARGET_DIR`, else `<repo>/target`; the nearest existing
/// ancestor, since a fresh clone has no target directory yet.
fn build_dir() -> PathBuf {
    let mut dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| util::repo_root().join("target"));
    while !dir.exists() {
        match dir.parent() {
            Some(parent) => dir = parent.to_path_buf(),
            None => break,
        }
    }
    dir
}

/// The "Available" column of `df -Pk` (POSIX format), in KiB.
pub fn parse_df_available_kib(output: &str) -> Option<u64> {
    let mut lines = output.lines();
    let header = lines.next()?;
    let col = header
        .split_whitespace()
        .position(|h| h.eq_ignore_ascii_case("available"))?;
    // A long device name can wrap the data line in non-POSIX dfs; -P forbids that, but
    // join the rest anyway so the column count holds.
    let data: Vec<&str> = lines.flat_map(str::split_whitespace).collect();
    data.get(col)?.parse().ok()
}

fn check_disk(ctx: &Context) -> Verdict {
    let dir = build_dir();
    let fix = CHECKS
        .iter()
        .find(|c| c.name == "disk")
        .map(|c| c.fixes[0])
        .unwrap_or(Fix::Manual("free disk space"));
    let dir_arg = dir.to_string_lossy().into_owned();
    let out = match run_ok(ctx, "df", &["-Pk", &dir_arg]) {
        Ok(out) => out,
        Err(why) => return fail(why, fix),
    };
    let Some(kib) = parse_df_available_kib(&String::from_utf8_lossy(&out.stdout)) else {
        return fail(format!("could not read `df -Pk {dir_arg}`"), fix);
    };
    disk_verdict(&dir_arg, kib, fix)
}

/// The verdict for `kib` free at `dir`.
pub fn disk_verdict(dir: &str, kib: u64, fix: Fix) -> Verdict {
    let gib = kib as f64 / (1024.0 * 1024.0);
    if kib < DISK_NEEDED_GIB * 1024 * 1024 {
        fail(
            format!(
                "{gib:.1} GiB free at {dir}; a clean build and test run needs about \
                 {DISK_NEEDED_GIB} GiB"
            ),
            fix,
        )
    } else {
        Verdict::Ok(format!("{gib:.1} GiB free at {dir}"))
    }
}

fn check_make(ctx: &Context) -> Verdict {
    match run_ok(ctx, "make", &["--version"]) {
        Ok(out) => Verdict::Ok(first_line(&out)),
        Err(why) => fail(why, Fix::Apt("make")),
    }
}

fn check_font(_ctx: &Context) -> Verdict {
    match std::fs::read(FONT) {
        Ok(bytes) if bytes.starts_with(&[0, 1, 0, 0]) || bytes.starts_with(b"true") => {
            Verdict::Ok(format!("{FONT} ({} bytes)", bytes.len()))
        }
        Ok(_) => fail(
            format!("{FONT} is not a TrueType font"),
            Fix::Apt("fonts-dejavu-core"),
        ),
        Err(e) => fail(format!("{FONT}: {e}"), Fix::Apt("fonts-dejavu-core")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::APT_PACKAGES;

    #[test]
    fn every_package_setup_installs_has_a_check_that_uses_it() {
        for pkg in APT_PACKAGES {
            let covered = CHECKS
                .iter()
                .flat_map(|c| c.fixes.iter())
                .any(|f| *f == Fix::Apt(pkg.name));
            assert!(
                covered,
                "{} is installed by setup but no doctor check uses it",
                pkg.name
            );
        }
    }

    #[test]
    fn every_cargo_tool_setup_installs_has_a_check() {
        for (_, krate, _) in crate::setup::CARGO_TOOLS {
            let fix = format!("{krate} --locked");
            let covered = CHECKS
                .iter()
                .flat_map(|c| c.fixes.iter())
                .any(|f| matches!(f, Fix::CargoInstall(a) if *a == fix));
            assert!(
                covered,
                "{krate} is installed by setup but no doctor check uses it"
            );
        }
    }

    #[test]
    fn a_venv_at_other_pins_fails_naming_setup() {
        let pins = skiff_flags::python::pins("kubernetes==37.0.2\nkopf==1.45.2\n");
        let venv = std::path::Path::new("/v");
        assert!(matches!(
            python_venv_verdict(venv, "kubernetes 37.0.2\nkopf 1.45.2\n", &pins),
            Verdict::Ok(_)
        ));
        let verdict = python_venv_verdict(venv, "kubernetes 31.0.0\n", &pins);
        let check = CHECKS.iter().find(|c| c.name == "python-venv").unwrap();
        let shown = line(check, &verdict);
        assert!(
            shown.contains("kubernetes 31.0.0, pinned 37.0.2; kopf missing, pinned 1.45.2"),
            "{shown}"
        );
        assert!(shown.contains("run cargo xtask setup"), "{shown}");
    }

    #[test]
    fn check_names_are_unique() {
        let mut names: Vec<_> = CHECKS.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CHECKS.len());
    }

    #[test]
    fn a_failure_is_one_line_with_the_fix() {
        let check = &CHECKS[0];
        let l = line(
            check,
            &Verdict::Fail {
                why: "protoc cannot find\ngoogle/protobuf/descriptor.proto".into(),
                fix: Fix::Apt("libprotobuf-dev"),
            },
        );
        assert_eq!(l.lines().count(), 1, "{l}");
        assert!(l.starts_with("FAIL protoc: "), "{l}");
        assert!(
            l.ends_with(
                "fix: apt-get install -y --no-install-recommends libprotobuf-dev \
                 (or: cargo xtask setup)"
            ),
            "{l}"
        );
    }

    /// Protoc without the well-known types next to it is reported in
    /// one line naming what is missing and the package that fixes it. A copy of the real
    /// protoc in a directory of its own looks for its include files beside itself, finds
    /// none, and is in exactly the state `protobuf-compiler` without `libprotobuf-dev` leaves.
    #[test]
    fn protoc_without_well_known_types_is_one_clear_line() {
        let real = util::which("protoc").expect("protoc (cargo xtask setup installs it)");
        let tmp = std::env::temp_dir().join(format!("xtask-doctor-protoc-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("bin")).unwrap();
        let lonely = tmp.join("bin").join("protoc");
        std::fs::copy(&real, &lonely).unwrap();
        let ctx = Context {
            scratch: tmp.join("scratch"),
            path: util::path_with_cargo_bin().unwrap(),
        };
        let verdict = check_protoc_with(&ctx, lonely.to_str().unwrap());
        let check = CHECKS.iter().find(|c| c.name == "protoc").unwrap();
        let shown = line(check, &verdict);
        let ok = check_protoc_with(&ctx, real.to_str().unwrap());
        let _ = std::fs::remove_dir_all(&tmp);

        assert!(
            matches!(
                &verdict,
                Verdict::Fail {
                    fix: Fix::Apt("libprotobuf-dev"),
                    ..
                }
            ),
            "{verdict:?}"
        );
        assert_eq!(shown.lines().count(), 1, "{shown}");
        assert!(shown.starts_with("FAIL protoc: "), "{shown}");
        assert!(
            shown.contains("google/protobuf/descriptor.proto"),
            "{shown}"
        );
        assert!(shown.contains("libprotobuf-dev"), "{shown}");
        // The installed protoc passes the same check.
        assert!(matches!(ok, Verdict::Ok(_)), "{ok:?}");
    }

    #[test]
    fn a_missing_program_is_named() {
        let ctx = Context {
            scratch: std::env::temp_dir(),
            path: "/nonexistent".into(),
        };
        let v = version_check(&ctx, "xtask-no-such-program", &["--version"], Fix::Apt("x"));
        assert_eq!(
            v,
            Verdict::Fail {
                why: "xtask-no-such-program not found".into(),
                fix: Fix::Apt("x")
            }
        );
    }

    #[test]
    fn df_available_column_is_read() {
        let out = "Filesystem     1024-blocks     Used Available Capacity Mounted on\n\
                   /dev/vda         264082764 19922944  76532448      21% /\n";
        assert_eq!(parse_df_available_kib(out), Some(76532448));
        assert_eq!(parse_df_available_kib("garbage"), None);
        assert_eq!(parse_df_available_kib(""), None);
    }

    #[test]
    fn too_little_disk_is_one_line_naming_the_space() {
        let fix = Fix::Manual("free space");
        let low = disk_verdict("/x/target", 5 * 1024 * 1024, fix);
        let Verdict::Fail { why, .. } = &low else {
            panic!("5 GiB passed: {low:?}")
        };
        assert!(why.contains("5.0 GiB free at /x/target"), "{why}");
        assert!(why.contains(&format!("{DISK_NEEDED_GIB} GiB")), "{why}");
        assert!(matches!(
            disk_verdict("/x", (DISK_NEEDED_GIB + 1) * 1024 * 1024, fix),
            Verdict::Ok(_)
        ));
        let disk = CHECKS
            .iter()
            .find(|c| c.name == "disk")
            .expect("disk check");
        assert!(disk.what.contains(&format!("{DISK_NEEDED_GIB} GiB")));
    }

    #[test]
    fn bpf_elf_detection() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[5] = 1;
        elf[18..20].copy_from_slice(&EM_BPF.to_le_bytes());
        assert!(is_bpf_elf(&elf));
        elf[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
        assert!(!is_bpf_elf(&elf));
        assert!(!is_bpf_elf(b"\x7fELF"));
    }
}
