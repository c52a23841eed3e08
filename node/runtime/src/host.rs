//! Host inspection: the cgroup v2 mount and its controllers, BPF filesystem and BTF.
//!
//! These machines run cgroups in hybrid mode (v2 at `/sys/fs/cgroup/unified`, v1 hierarchies
//! under `/sys/fs/cgroup`), so the v2 root is read from `/proc/self/mountinfo`, never assumed.

use std::path::{Path, PathBuf};

/// The cgroup controllers the agent wants for enforcing pod limits.
pub const WANTED_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("no cgroup2 filesystem is mounted (looked in {0})")]
    NoCgroup2(String),
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn read(path: &Path) -> Result<String, HostError> {
    std::fs::read_to_string(path).map_err(|source| HostError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Finds the mount point of the cgroup2 filesystem in the text of a mountinfo file.
pub fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    crate::mountinfo::parse(mountinfo)
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .map(|m| m.mount_point)
}

/// The cgroup v2 mount point of this machine.
pub fn cgroup2_mount() -> Result<PathBuf, HostError> {
    let path = Path::new(crate::mountinfo::PATH);
    cgroup2_mount_in(&read(path)?).ok_or_else(|| HostError::NoCgroup2(path.display().to_string()))
}

/// What the host offers the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostReport {
    pub cgroup2_root: PathBuf,
    /// Controllers listed in the root's `cgroup.controllers`.
    pub controllers: Vec<String>,
    /// Wanted controllers that the v2 tree does not offer (bound to v1, or not built).
    pub missing_controllers: Vec<String>,
    pub bpffs_mounted: bool,
    pub btf_available: bool,
}

/// Inspects a cgroup v2 root.
pub fn report_for(cgroup2_root: &Path, mountinfo: &str) -> Result<HostReport, HostError> {
    let controllers: Vec<String> = read(&cgroup2_root.join("cgroup.controllers"))?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let missing_controllers = WANTED_CONTROLLERS
        .iter()
        .filter(|c| !controllers.iter().any(|have| have == *c))
        .map(|c| c.to_string())
        .collect();
    let bpffs_mounted = crate::mountinfo::parse(mountinfo)
        .iter()
        .any(|m| m.fstype == "bpf");
    Ok(HostReport {
        cgroup2_root: cgroup2_root.to_path_buf(),
        controllers,
        missing_controllers,
        bpffs_mounted,
        btf_available: Path::new("/sys/kernel/btf/vmlinux").exists(),
    })
}

/// Inspects this machine.
pub fn report() -> Result<HostReport, HostError> {
    let mountinfo = read(Path::new(crate::mountinfo::PATH))?;
    let root = cgroup2_mount_in(&mountinfo)
        .ok_or_else(|| HostError::NoCgroup2(crate::mountinfo::PATH.into()))?;
    report_for(&root, &mountinfo)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
24 31 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
35 24 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
41 35 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 35 0:39 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
50 24 0:45 / /sys/fs/bpf rw,relatime - bpf bpf rw
";

    #[test]
    fn finds_v2_mount_in_hybrid_mode() {
        assert_eq!(
            cgroup2_mount_in(HYBRID),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount_in("1 0 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }

    #[test]
    fn unescapes_mount_points() {
        let line = "41 35 0:38 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount_in(line), Some(PathBuf::from("/mnt/my cg")));
    }

    #[test]
    fn reports_missing_controllers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), "cpuset io memory\n").unwrap();
        let r = report_for(dir.path(), HYBRID).unwrap();
        assert_eq!(r.controllers, ["cpuset", "io", "memory"]);
        assert_eq!(r.missing_controllers, ["cpu", "pids"]);
        assert!(r.bpffs_mounted);
    }

    #[test]
    fn this_machine_has_a_cgroup2_mount() {
        // Skiff requires cgroup v2 (pure or hybrid); every supported host has it.
        let r = report().expect("cgroup2 must be mounted on a Skiff host");
        assert!(r.cgroup2_root.join("cgroup.procs").exists());
    }
}
