//! Resource usage from the kernel's files, for `/stats/summary` and the metrics API: a
//! cgroup's CPU time (`cpu.stat`, present without the cpu controller) and memory working set
//! (`memory.current` less `inactive_file` where the memory controller is enabled, as the
//! kubelet computes it; else the resident memory of the cgroup's processes, read from
//! `/proc/<pid>/status`, since these machines' cgroup v2 has no memory controller), and the
//! node's (`/proc/stat`, `/proc/meminfo`).

use std::path::Path;

use skiff_client::node_api::Usage;

/// `usage_usec` from a cgroup's `cpu.stat` (covers its descendants).
pub fn cpu_usage_usec(cgroup_dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(cgroup_dir.join("cpu.stat")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

/// A value of a `key value` file (`memory.stat`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The pids of a cgroup and all its descendants.
fn pids(cgroup_dir: &Path, out: &mut Vec<u32>) {
    if let Ok(text) = std::fs::read_to_string(cgroup_dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(cgroup_dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                pids(&e.path(), out);
            }
        }
    }
}

/// `VmRSS` of a process, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// A cgroup's memory working set, in bytes.
pub fn memory_working_set(cgroup_dir: &Path) -> u64 {
    if let Some(current) = std::fs::read_to_string(cgroup_dir.join("memory.current"))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
    {
        let inactive = std::fs::read_to_string(cgroup_dir.join("memory.stat"))
            .ok()
            .and_then(|t| keyed(&t, "inactive_file"))
            .unwrap_or(0);
        return current.saturating_sub(inactive);
    }
    let mut all = Vec::new();
    pids(cgroup_dir, &mut all);
    all.sort_unstable();
    all.dedup();
    all.into_iter().map(rss_bytes).sum()
}

/// A cgroup's usage.
pub fn cgroup(cgroup_dir: &Path) -> Usage {
    Usage {
        cpu_usage_usec: cpu_usage_usec(cgroup_dir).unwrap_or(0),
        memory_working_set_bytes: memory_working_set(cgroup_dir),
    }
}

/// The node's: busy CPU time of all CPUs (`/proc/stat`, USER_HZ = 100 on Linux) and memory
/// in use (MemTotal − MemAvailable).
pub fn node() -> Option<Usage> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu: Vec<u64> = stat
        .lines()
        .find(|l| l.starts_with("cpu "))?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
    let busy: u64 = cpu
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum();
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = |key: &str| {
        meminfo.lines().find_map(|l| {
            l.strip_prefix(key)
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
    };
    let used = kb("MemTotal:")?.saturating_sub(kb("MemAvailable:")?) * 1024;
    Some(Usage {
        cpu_usage_usec: busy * 10_000,
        memory_working_set_bytes: used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_values_and_the_node() {
        assert_eq!(
            keyed("anon 10\ninactive_file 42\n", "inactive_file"),
            Some(42)
        );
        assert_eq!(keyed("anon 10\n", "inactive_file"), None);
        let n = node().expect("/proc/stat and /proc/meminfo");
        assert!(n.cpu_usage_usec > 0 && n.memory_working_set_bytes > 0);
        // This test process's own cgroup: some memory, by one way or the other.
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let path = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
        assert!(memory_working_set(&dir) > 0, "{}", dir.display());
    }
}
