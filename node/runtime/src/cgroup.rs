//! cgroup v2 directories: creation below the v2 mount, controller delegation, limits,
//! membership, `cgroup.kill` and removal. Never touches a v1 hierarchy: every path is checked
//! to lie below the v2 mount point the runtime was given.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::{LimitReport, Limits, RuntimeError};

/// Controllers a limit kind needs, with the file that enforces it.
pub(crate) const CPU: &str = "cpu";
pub(crate) const MEMORY: &str = "memory";
pub(crate) const PIDS: &str = "pids";

/// `cpu.max` period in microseconds.
const CPU_PERIOD_US: u64 = 100_000;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Refuses paths outside the v2 mount (so a bad configuration can never reach v1).
pub(crate) fn check_inside(root: &Path, dir: &Path) -> Result<(), RuntimeError> {
    let ok = dir.is_absolute()
        && dir.starts_with(root)
        && dir != root
        && dir
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir));
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::InvalidConfig(format!(
            "cgroup {} is not below the cgroup v2 mount {}",
            dir.display(),
            root.display()
        )))
    }
}

/// The controllers listed in `<dir>/cgroup.controllers`.
pub(crate) fn controllers(dir: &Path) -> Vec<String> {
    fs::read_to_string(dir.join("cgroup.controllers"))
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Creates `dir` (and missing parents) below `root`, enabling in every ancestor's
/// `cgroup.subtree_control` those of `wanted` that the ancestor offers. Returns whether the
/// leaf directory was newly created.
pub(crate) fn create(root: &Path, dir: &Path, wanted: &[&str]) -> Result<bool, RuntimeError> {
    check_inside(root, dir)?;
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    let mut current = root.to_path_buf();
    let mut created = false;
    for component in rel.components() {
        enable_controllers(&current, wanted);
        current.push(component);
        match fs::create_dir(&current) {
            Ok(()) => created = true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => created = false,
            Err(source) => {
                return Err(RuntimeError::Io {
                    op: "creating cgroup",
                    path: current,
                    source,
                });
            }
        }
    }
    Ok(created)
}

/// Enables the `wanted` controllers that `dir` offers for its children. Best effort: a
/// failure (e.g. the no-internal-processes rule) only means the limit is not enforced.
pub(crate) fn enable_controllers(dir: &Path, wanted: &[&str]) {
    let offered = controllers(dir);
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    for c in wanted {
        if !offered.iter().any(|o| o == c) || enabled.split_whitespace().any(|e| e == *c) {
            continue;
        }
        let path = dir.join("cgroup.subtree_control");
        if let Err(e) = fs::write(&path, format!("+{c}")) {
            warn!(cgroup = %dir.display(), controller = c, error = %e,
                "cannot enable cgroup controller; its limits will not be enforced");
        }
    }
}

/// Which of `limits` a child of `parent` can enforce (the controllers `parent` offers).
pub(crate) fn limit_report(parent: &Path, limits: &Limits) -> LimitReport {
    let offered = controllers(parent);
    let mut report = LimitReport::default();
    let mut check = |kind: &str, file: &str, value: Option<String>| {
        let Some(value) = value else { return };
        if offered.iter().any(|o| o == kind) {
            report.enforced.push(format!("{kind}: {file} = {value}"));
        } else {
            report.not_enforced.push(format!(
                "{kind}: controller missing from cgroup v2 at {} (offers: {})",
                parent.display(),
                if offered.is_empty() {
                    "none".to_string()
                } else {
                    offered.join(" ")
                }
            ));
        }
    };
    check(CPU, "cpu.max", limits.cpu_millis.map(cpu_max));
    check(
        MEMORY,
        "memory.max",
        limits.memory_bytes.map(|b| b.to_string()),
    );
    check(PIDS, "pids.max", limits.pids.map(|p| p.to_string()));
    report
}

fn cpu_max(millis: u64) -> String {
    // 1000 millicores = one full period per period; the kernel's minimum quota is 1000us.
    let quota = millis.saturating_mul(CPU_PERIOD_US / 1000).max(1000);
    format!("{quota} {CPU_PERIOD_US}")
}

/// Writes the limit files that exist in `dir` (those whose controller is enabled). Returns
/// the limits actually applied.
pub(crate) fn apply_limits(dir: &Path, limits: &Limits) -> Limits {
    let mut applied = Limits::default();
    let write = |file: &str, value: String| -> bool {
        let path = dir.join(file);
        if !path.exists() {
            return false;
        }
        match fs::write(&path, &value) {
            Ok(()) => {
                debug!(file = %path.display(), value, "limit applied");
                true
            }
            Err(e) => {
                warn!(file = %path.display(), value, error = %e, "cannot apply limit");
                false
            }
        }
    };
    if let Some(m) = limits.cpu_millis
        && write("cpu.max", cpu_max(m))
    {
        applied.cpu_millis = Some(m);
    }
    if let Some(b) = limits.memory_bytes
        && write("memory.max", b.to_string())
    {
        applied.memory_bytes = Some(b);
    }
    if let Some(p) = limits.pids
        && write("pids.max", p.to_string())
    {
        applied.pids = Some(p);
    }
    applied
}

/// The cgroup id BPF sees (`bpf_get_current_cgroup_id`, `bpf_skb_cgroup_id`): the inode
/// number of the cgroup's directory.
pub(crate) fn id(dir: &Path) -> Result<u64, RuntimeError> {
    fs::metadata(dir)
        .map(|m| m.ino())
        .map_err(io_err("reading cgroup", dir))
}

/// Moves the calling process into `dir`.
pub(crate) fn join_self(dir: &Path) -> io::Result<()> {
    fs::write(dir.join("cgroup.procs"), "0")
}

/// The pids directly in `dir`.
pub(crate) fn procs(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The pids in `dir` and all its descendants.
pub(crate) fn procs_recursive(dir: &Path) -> Vec<u32> {
    let mut out = procs(dir);
    for child in children(dir) {
        out.extend(procs_recursive(&child));
    }
    out
}

/// Child cgroup directories of `dir`.
pub(crate) fn children(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `dir` or a descendant holds a process (`populated` in `cgroup.events`). A missing
/// cgroup counts as empty.
pub(crate) fn populated(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("cgroup.events")) {
        Ok(events) => events
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["populated", "1"]),
        Err(_) => false,
    }
}

/// SIGKILLs every process in `dir` and its descendants (`cgroup.kill`). A missing cgroup is
/// not an error.
pub(crate) fn kill(dir: &Path) -> Result<(), RuntimeError> {
    match fs::write(dir.join("cgroup.kill"), "1") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(RuntimeError::Io {
            op: "writing cgroup.kill in",
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Polls until `dir` holds no process or `timeout` passes; returns whether it is empty.
pub(crate) async fn wait_empty(dir: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !populated(dir) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Removes `dir` and its descendant cgroups (which must hold no processes), bottom-up. A
/// missing directory is not an error. The one way Skiff removes a cgroup tree (the runtime,
/// `skiff-node purge`, tests and benchmarks).
pub fn remove_tree(dir: &Path) -> Result<(), RuntimeError> {
    for child in children(dir) {
        remove_tree(&child)?;
    }
    // A cgroup whose last process just exited can stay busy for a moment.
    let mut attempts = 0;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempts < 50 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(source) => {
                return Err(RuntimeError::Io {
                    op: "removing cgroup",
                    path: dir.to_path_buf(),
                    source,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_paths_outside_the_v2_mount() {
        let root = Path::new("/sys/fs/cgroup/unified");
        assert!(check_inside(root, &root.join("skiff/node")).is_ok());
        assert!(check_inside(root, root).is_err());
        assert!(check_inside(root, Path::new("/sys/fs/cgroup/memory/x")).is_err());
        assert!(check_inside(root, &root.join("../memory")).is_err());
        assert!(check_inside(root, Path::new("skiff")).is_err());
    }

    #[test]
    fn reports_limits_by_offered_controllers() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("cgroup.controllers"), "cpu hugetlb\n").unwrap();
        let r = limit_report(
            dir.path(),
            &Limits {
                cpu_millis: Some(250),
                memory_bytes: Some(1 << 20),
                pids: None,
            },
        );
        assert_eq!(r.enforced, ["cpu: cpu.max = 25000 100000"]);
        assert_eq!(r.not_enforced.len(), 1);
        assert!(r.not_enforced[0].starts_with("memory: controller missing"));
    }
}
