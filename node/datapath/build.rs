//! Builds Skiff's eBPF programs (`ebpf/skiff-ebpf`) with aya-build and leaves one object per
//! binary of that crate in `$OUT_DIR`: `skiff-ebpf` (per-pod accounting), `skiff-lb` (the
//! Service load balancer), `skiff-policy` (NetworkPolicy) and `skiff-devices` (the pods'
//! device allow list), which `src/` embeds with `aya::include_bytes_aligned!`.
//!
//! aya-build runs `rustup run nightly cargo build -Z build-std=core --target bpfel-unknown-none
//! --release` with `-C debuginfo=2 -C link-arg=--btf` (so the object carries BTF and bpftool
//! shows named fields). That needs the nightly toolchain with `rust-src` and `bpf-linker`;
//! `cargo xtask setup` installs all three. Each is checked first so a missing one is reported
//! by name instead of as a linker error deep in the nested build.
//!
//! `AYA_BUILD_SKIP=1` skips the eBPF build (aya-build's own switch); the agent is then built
//! with empty objects and `Accounting::load` / `ServiceLb::load` report `BpfError::NotBuilt`.

use std::{env, ffi::OsString, path::PathBuf, process::Command};

/// The eBPF crate, relative to this package, and the names of its binaries (the object files).
const EBPF_DIR: &str = "../../ebpf/skiff-ebpf";
const EBPF_PACKAGE: &str = "skiff-ebpf";
const OBJECTS: [&str; 4] = ["skiff-ebpf", "skiff-lb", "skiff-policy", "skiff-devices"];
/// Shared `#[repr(C)]` types; the eBPF object must be rebuilt when they change.
const COMMON_DIR: &str = "../../ebpf/common";

const SETUP_HINT: &str = "run `cargo xtask setup` (installs the nightly toolchain with rust-src \
                          and bpf-linker), or set AYA_BUILD_SKIP=1 to build the agent without \
                          its eBPF programs";

fn main() {
    if let Err(msg) = run() {
        eprintln!("error: building Skiff's eBPF programs ({EBPF_DIR}) failed: {msg}");
        eprintln!("hint: {SETUP_HINT}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR not set")?);
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR not set")?);
    let ebpf_dir = manifest_dir.join(EBPF_DIR);
    let ebpf_dir = ebpf_dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", ebpf_dir.display()))?;

    // aya-build watches the eBPF crate's own directory; the shared types live next to it.
    println!("cargo:rerun-if-changed={COMMON_DIR}");

    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if !skip {
        put_cargo_bin_on_path();
        preflight()?;
        // aya-build relays every line the nested cargo prints to stderr as a `cargo:warning`,
        // which cargo then replays on every build of this package. Keep only real problems:
        // compiler diagnostics come through its JSON output regardless, errors still print.
        // SAFETY: build scripts are single-threaded; nothing reads the environment
        // concurrently, and the nested cargo spawned below inherits it.
        unsafe { env::set_var("CARGO_TERM_QUIET", "true") };
    }

    // aya-build runs `cargo build --package skiff-ebpf` in the current directory and offers
    // no way to set another one. The eBPF crate is its own workspace (excluded from the root
    // one, which builds for the host on stable), so the nested cargo must start there.
    env::set_current_dir(&ebpf_dir).map_err(|e| format!("cd {}: {e}", ebpf_dir.display()))?;
    let root_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", ebpf_dir.display()))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: EBPF_PACKAGE,
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
    .map_err(|e| format!("{e:#}"))?;

    for name in OBJECTS {
        let object = out_dir.join(name);
        if skip && !object.exists() {
            // Lets `include_bytes_aligned!` compile; the loader refuses an empty object.
            std::fs::write(&object, b"").map_err(|e| format!("{}: {e}", object.display()))?;
        }
        if !object.exists() {
            return Err(format!("aya-build produced no {}", object.display()));
        }
    }
    Ok(())
}

/// bpf-linker is installed by `cargo install`, i.e. into `$CARGO_HOME/bin`. Cargo's build
/// environment does not always have that on PATH (e.g. under an IDE or a CI runner that calls
/// `~/.cargo/bin/cargo` directly), and the nested nightly cargo inherits our environment.
fn put_cargo_bin_on_path() {
    let path = env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = env::split_paths(&path).collect();
    let candidates = [
        env::var_os("CARGO_HOME").map(|h| PathBuf::from(h).join("bin")),
        env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo").join("bin")),
    ];
    let mut changed = false;
    for dir in candidates.into_iter().flatten().rev() {
        if dir.is_dir() && !dirs.contains(&dir) {
            dirs.insert(0, dir);
            changed = true;
        }
    }
    if changed && let Ok(joined) = env::join_paths(dirs) {
        // SAFETY: build scripts are single-threaded; no other thread reads the environment
        // while it is changed here, before any child process is spawned.
        unsafe { env::set_var("PATH", joined) };
    }
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path: OsString = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Checks the three things the nested build needs, naming the one that is missing.
fn preflight() -> Result<(), String> {
    if find_on_path("rustup").is_none() {
        // aya-build then uses the current toolchain; let it try and report what it finds.
        println!(
            "cargo:warning=rustup not found on PATH; building eBPF with the current toolchain"
        );
    } else {
        let out = Command::new("rustup")
            .args(["run", "nightly", "rustc", "--print", "sysroot"])
            .output()
            .map_err(|e| format!("running `rustup run nightly rustc`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "the nightly Rust toolchain is missing (`rustup run nightly rustc` said: {})",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let core = sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml");
        if !core.is_file() {
            return Err(format!(
                "the nightly toolchain lacks the rust-src component ({} not found; \
                 `rustup component add rust-src --toolchain nightly`)",
                core.display()
            ));
        }
    }
    if find_on_path("bpf-linker").is_none() {
        return Err(
            "bpf-linker not found on PATH or in $CARGO_HOME/bin (`cargo install bpf-linker`)"
                .to_string(),
        );
    }
    Ok(())
}
