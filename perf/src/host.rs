//! The bench's surroundings: where the binaries it starts come from, which processes run which
//! executable, and facts about the machine for the report.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::report::Environment;

/// Name of the directory inside `target/<profile>/` the bench runs from (see
/// [`run_from_profile_subdir`]).
pub const SUBDIR: &str = "skiff-perf";

/// `release` or `debug`: how this bench (and so the binaries next to it) was built.
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// The harness (`skiff_tests::bin_dir`) takes the workspace binaries from the parent of the
/// running executable's directory, which is right for test executables in
/// `target/<profile>/deps/` but is `target/` for `target/<profile>/skiff-bench`. So the bench
/// re-executes itself from a hard link (or copy) in `target/<profile>/skiff-perf/`: then the
/// harness starts `target/<profile>/skiff-apiserver` and `skiff-node`, the binaries of the
/// bench's own profile. Does nothing when already running from there.
pub fn run_from_profile_subdir() -> Result<()> {
    let exe = std::env::current_exe().context("locating the running executable")?;
    let dir = exe.parent().context("executable without a directory")?;
    if dir.file_name().is_some_and(|n| n == SUBDIR) {
        return Ok(());
    }
    let name = exe.file_name().context("executable without a name")?;
    let sub = dir.join(SUBDIR);
    std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
    let copy = sub.join(name);
    // Replace it every time: cargo rebuilds by writing a new file, a stale link keeps the old.
    match std::fs::remove_file(&copy) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", copy.display())),
    }
    if std::fs::hard_link(&exe, &copy).is_err() {
        std::fs::copy(&exe, &copy)
            .with_context(|| format!("copying {} to {}", exe.display(), copy.display()))?;
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let err = Command::new(&copy).args(args).exec();
    Err(err).with_context(|| format!("re-executing {}", copy.display()))
}

/// Fails unless every binary in `names` is next to the bench, naming the build command:
/// the harness would otherwise build a missing one in the debug profile.
pub fn check_binaries(names: &[&str]) -> Result<PathBuf> {
    let dir = skiff_tests::bin_dir();
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !dir.join(n).is_file())
        .collect();
    if !missing.is_empty() {
        let flag = if profile() == "release" {
            " --release"
        } else {
            ""
        };
        // Every binary is named like its package.
        let packages: Vec<String> = names.iter().map(|n| format!("-p {n}")).collect();
        bail!(
            "missing in {}: {} — build them first: `cargo build{flag} {} --bins` (`cargo xtask \
             bench` does this)",
            dir.display(),
            missing.join(", "),
            packages.join(" ")
        );
    }
    Ok(dir)
}

/// The executables of the running processes whose command line contains every one of
/// `needles` as a separate argument, as `(pid, exe)`.
pub fn processes_with_args(needles: &[&str]) -> Vec<(u32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if needles.iter().all(|n| args.contains(&n.as_bytes()))
            && let Ok(exe) = std::fs::read_link(entry.path().join("exe"))
        {
            found.push((pid, exe));
        }
    }
    found.sort();
    found
}

/// The one process whose arguments include `needles`, checked to run an executable from
/// `bin_dir` (so a release bench measures release binaries). Returns its executable. Waits
/// up to 10 s for it to appear and to have exec'd: `spawn` may return before the child has,
/// and a process started on a machine runs `nsenter` until it execs the binary.
pub fn verify_process(what: &str, needles: &[&str], bin_dir: &Path) -> Result<PathBuf> {
    let canonical_dir = bin_dir
        .canonicalize()
        .unwrap_or_else(|_| bin_dir.to_path_buf());
    let deadline = Instant::now() + Duration::from_secs(10);
    let procs = loop {
        let procs = processes_with_args(needles);
        let settled =
            matches!(procs.as_slice(), [(_, exe)] if exe.parent() == Some(canonical_dir.as_path()));
        if settled || Instant::now() >= deadline {
            break procs;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let [(pid, exe)] = procs.as_slice() else {
        bail!(
            "expected one {what} process with arguments {needles:?}, found {}",
            procs.len()
        );
    };
    if exe.parent() != Some(canonical_dir.as_path()) {
        bail!(
            "{what} (pid {pid}) runs {}, not a binary from {}",
            exe.display(),
            canonical_dir.display()
        );
    }
    Ok(exe.clone())
}

/// The pid of the one `skiff-apiserver` listening on `server`'s address, checked to run a
/// binary from `bin_dir`, and its executable.
pub fn apiserver_pid(server: &skiff_tests::ApiServer, bin_dir: &Path) -> Result<(u32, String)> {
    let listen = server.listen().to_string();
    let exe = verify_process("skiff-apiserver", &["--listen", &listen], bin_dir)?;
    let pid = processes_with_args(&["--listen", &listen])
        .first()
        .map(|(pid, _)| *pid)
        .context("the API server process is gone")?;
    Ok((pid, exe.display().to_string()))
}

/// The soft limit on open files of this process (`Max open files` of `/proc/self/limits`),
/// which the processes it starts inherit; `None` when unlimited or unreadable.
pub fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    soft_open_files(&text)
}

/// The soft `Max open files` of a `/proc/<pid>/limits` text.
fn soft_open_files(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The type of the filesystem holding `path` (`ext4`, `tmpfs`, …), from `/proc/self/mounts`:
/// for etcd's data directories, it says what an fsync costs.
pub fn fs_type(path: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mount_fs_type(&mounts, &path)
}

/// The filesystem type of the innermost mount of a `/proc/self/mounts` text containing `path`
/// (of several on the same mount point, the last: it hides the others).
fn mount_fs_type(mounts: &str, path: &Path) -> Option<String> {
    mounts
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let (_device, mount_point, fs) = (fields.next()?, fields.next()?, fields.next()?);
            Some((mount_point, fs))
        })
        .filter(|(mount_point, _)| path.starts_with(mount_point))
        .max_by_key(|(mount_point, _)| mount_point.len())
        .map(|(_, fs)| fs.to_string())
}

/// Fails unless running as root (namespaces, cgroups and pods need it).
pub fn require_root() -> Result<()> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .context("no Uid line in /proc/self/status")?;
    if euid != "0" {
        bail!("the benchmarks start a node agent (network namespaces, cgroups): run them as root");
    }
    Ok(())
}

/// Facts about the machine and the checkout, for the report.
pub fn environment() -> Environment {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    Environment {
        commit: git_commit(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        loadavg: std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
        profile: profile().into(),
        binaries: Default::default(),
    }
}

/// `git rev-parse --short HEAD` of the repository, `+dirty` with local changes.
fn git_commit() -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."));
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(c) if git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty()) => {
            format!("{c}+dirty")
        }
        Some(c) => c,
        None => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_soft_open_files_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max processes             95553                95553                processes\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(soft_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_open_files(unlimited), None);
        assert!(open_files_limit().is_some_and(|n| n > 0));
    }

    #[test]
    fn finds_the_filesystem_of_a_path() {
        let mounts = "/dev/vda / ext4 rw,relatime 0 0\n\
                      proc /proc proc rw 0 0\n\
                      tmpfs /tmp tmpfs rw 0 0\n\
                      /dev/vdb /tmp xfs rw 0 0\n";
        let at = |p: &str| mount_fs_type(mounts, Path::new(p));
        assert_eq!(at("/tmp/skiff-etcd-1/data").as_deref(), Some("xfs"));
        assert_eq!(at("/tmpfoo").as_deref(), Some("ext4"));
        assert_eq!(at("/var/tmp").as_deref(), Some("ext4"));
        assert_eq!(mount_fs_type("", Path::new("/")), None);
        assert!(fs_type(&std::env::temp_dir()).is_some());
    }

    #[test]
    fn finds_own_process_by_arguments() {
        let mut child = Command::new("sleep")
            .arg("30.123456")
            .spawn()
            .expect("spawn sleep");
        // spawn may return before the child has exec'd: poll (bounded).
        let mut found = Vec::new();
        for _ in 0..250 {
            found = processes_with_args(&["30.123456"]);
            if !found.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, child.id());
        assert!(found[0].1.ends_with("sleep"), "{found:?}");
    }
}
