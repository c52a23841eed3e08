//! Small helpers shared by the subcommands: locating the repository and
//! tools, building PATH values, running commands with good error messages.

use std::env;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

/// Root of the workspace (the directory holding the top-level Cargo.toml).
pub fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // xtask lives one level below the workspace root.
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// Where `cargo install` puts binaries: `$CARGO_HOME/bin`, else `$HOME/.cargo/bin`.
pub fn cargo_bin_dir() -> Option<PathBuf> {
    cargo_bin_dir_from(env::var_os("CARGO_HOME"), env::var_os("HOME"))
}

pub fn cargo_bin_dir_from(cargo_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    match cargo_home.filter(|v| !v.is_empty()) {
        Some(ch) => Some(PathBuf::from(ch).join("bin")),
        None => home
            .filter(|v| !v.is_empty())
            .map(|h| PathBuf::from(h).join(".cargo").join("bin")),
    }
}

/// Directories `cargo install` may have used, most specific first, without duplicates.
pub fn cargo_bin_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = cargo_bin_dir() {
        dirs.push(d);
    }
    if let Some(home) = env::var_os("HOME").filter(|h| !h.is_empty()) {
        let d = PathBuf::from(home).join(".cargo").join("bin");
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// `prefixes` followed by the current PATH (duplicates are harmless and kept).
pub fn path_with_prefixes(prefixes: &[PathBuf]) -> Result<OsString> {
    let current = env::var_os("PATH").unwrap_or_default();
    join_path_prefixes(prefixes, &current)
}

pub fn join_path_prefixes(prefixes: &[PathBuf], current: &OsStr) -> Result<OsString> {
    let mut parts: Vec<PathBuf> = prefixes.to_vec();
    parts.extend(env::split_paths(current));
    env::join_paths(parts).context("building PATH")
}

/// PATH with the cargo bin dir(s) in front, so children find bpf-linker etc.
pub fn path_with_cargo_bin() -> Result<OsString> {
    path_with_prefixes(&cargo_bin_dirs())
}

/// Find an executable by name on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Render a command line for messages.
/// Variables the stable `cargo xtask` exports to its children that would make a nested
/// `rustup run nightly cargo` use the stable toolchain's pieces or the root's target dir.
const STABLE_CARGO_ENV: &[&str] = &[
    "RUSTUP_TOOLCHAIN",
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTDOC",
    "CARGO",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_MAKEFLAGS",
];

/// `rustup run nightly cargo <args>`, cleaned of the stable cargo's environment: the one way
/// xtask runs the nightly toolchain (doctor's BPF build, the eBPF fmt and clippy tiers).
pub fn nightly_cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", crate::setup::NIGHTLY, "cargo"]).args(args);
    for var in STABLE_CARGO_ENV {
        cmd.env_remove(var);
    }
    cmd
}

pub fn display_cmd(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        let a = arg.to_string_lossy();
        if a.is_empty() || a.contains(char::is_whitespace) {
            s.push_str(&format!("'{a}'"));
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// Run a command with inherited stdio; error if it cannot start or fails.
pub fn run_streaming(cmd: &mut Command) -> Result<()> {
    let shown = display_cmd(cmd);
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// Run a command capturing its output; error only if it cannot be started.
pub fn run_capture(cmd: &mut Command) -> Result<Output> {
    let shown = display_cmd(cmd);
    cmd.output()
        .with_context(|| format!("could not start `{shown}`"))
}

/// Effective uid from the text of `/proc/self/status` ("Uid: real effective ...").
pub fn parse_euid(proc_status: &str) -> Option<u32> {
    proc_status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Whether we run as root (uid 0), without libc: /proc first, `id -u` as fallback.
pub fn is_root() -> bool {
    if let Some(uid) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .as_deref()
        .and_then(parse_euid)
    {
        return uid == 0;
    }
    Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Print an error and its causes, without the backtrace anyhow's Debug
/// output adds when RUST_BACKTRACE is set: these errors are for humans.
pub fn print_error(err: &anyhow::Error) {
    eprintln!("error: {err}");
    for cause in err.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
}

/// Human-friendly duration: "0.4s", "12.3s", "3m07s".
pub fn fmt_duration(d: std::time::Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        let whole = d.as_secs();
        format!("{}m{:02}s", whole / 60, whole % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn cargo_bin_dir_prefers_cargo_home() {
        assert_eq!(
            cargo_bin_dir_from(Some("/opt/cargo".into()), Some("/root".into())),
            Some(PathBuf::from("/opt/cargo/bin"))
        );
        assert_eq!(
            cargo_bin_dir_from(None, Some("/home/u".into())),
            Some(PathBuf::from("/home/u/.cargo/bin"))
        );
        assert_eq!(
            cargo_bin_dir_from(Some("".into()), Some("/home/u".into())),
            Some(PathBuf::from("/home/u/.cargo/bin"))
        );
        assert_eq!(cargo_bin_dir_from(None, None), None);
    }

    #[test]
    fn path_prefixes_go_first() {
        let p = join_path_prefixes(
            &[PathBuf::from("/a/bin"), PathBuf::from("/b")],
            OsStr::new("/usr/bin:/bin"),
        )
        .unwrap();
        assert_eq!(p, OsString::from("/a/bin:/b:/usr/bin:/bin"));
    }

    #[test]
    fn euid_parsing() {
        let status = "Name:\tcat\nUmask:\t0022\nUid:\t1000\t0\t0\t0\nGid:\t0\t0\t0\t0\n";
        assert_eq!(parse_euid(status), Some(0));
        let status = "Uid:\t0\t1000\t1000\t1000\n";
        assert_eq!(parse_euid(status), Some(1000));
        assert_eq!(parse_euid("Name:\tx\n"), None);
    }

    #[test]
    fn display_cmd_quotes_spaces() {
        let mut c = Command::new("cargo");
        c.args(["fmt", "--all", "a b"]);
        assert_eq!(display_cmd(&c), "cargo fmt --all 'a b'");
    }

    #[test]
    fn durations() {
        assert_eq!(fmt_duration(Duration::from_millis(400)), "0.4s");
        assert_eq!(fmt_duration(Duration::from_secs(187)), "3m07s");
    }
}
