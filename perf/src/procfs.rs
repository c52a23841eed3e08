//! What the kernel says a process costs: resident memory (`/proc/<pid>/status` VmRSS,
//! `smaps_rollup` Pss) and CPU time (`/proc/<pid>/stat` utime + stime), and what a cgroup v2
//! directory holds (its processes, their CPU time from `cpu.stat`).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

/// Clock ticks per second of `/proc/<pid>/stat` times (`USER_HZ`): 100 on every Linux ABI
/// the bench runs on (the kernel exports it as `AT_CLKTCK`; it is fixed at 100 for x86 and
/// arm64 userspace).
pub const USER_HZ: u64 = 100;

/// One reading of a process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// User plus system CPU time since the process started.
    pub cpu: Duration,
}

/// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`.
pub fn usage(pid: u32) -> Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    Ok(Usage {
        rss_bytes: vm_rss(&status).with_context(|| format!("/proc/{pid}/status: no VmRSS"))?,
        cpu: cpu_time(&stat).with_context(|| format!("/proc/{pid}/stat: no utime/stime"))?,
    })
}

/// The CPU time of processes `pids` together.
pub fn cpu_of(pids: &[u32]) -> Result<Duration> {
    pids.iter().map(|p| Ok(usage(*p)?.cpu)).sum()
}

/// `VmRSS` of a `/proc/<pid>/status` text, in bytes.
pub fn vm_rss(status: &str) -> Option<u64> {
    kib_field(status, "VmRSS:")
}

/// utime + stime of a `/proc/<pid>/stat` line (fields 14 and 15; the command name in field 2
/// may contain spaces and parentheses, so fields are counted after its last `)`).
pub fn cpu_time(stat: &str) -> Option<Duration> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0, so utime (14) is index 11, stime index 12.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 1000 / USER_HZ))
}

/// Every process in cgroup v2 directory `dir` and its descendants (`cgroup.procs`).
pub fn cgroup_pids(dir: &Path) -> Result<Vec<u32>> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let procs = d.join("cgroup.procs");
        let text = std::fs::read_to_string(&procs)
            .with_context(|| format!("reading {}", procs.display()))?;
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        for entry in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let entry = entry.with_context(|| format!("listing {}", d.display()))?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

/// CPU time of every process that ever ran in cgroup v2 directory `dir` and below
/// (`cpu.stat` `usage_usec`, present without the cpu controller).
pub fn cgroup_cpu(dir: &Path) -> Result<Duration> {
    let path = dir.join("cpu.stat");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    usage_usec(&text)
        .map(Duration::from_micros)
        .with_context(|| format!("{}: no usage_usec", path.display()))
}

/// `usage_usec` of a `cpu.stat` text.
pub fn usage_usec(cpu_stat: &str) -> Option<u64> {
    cpu_stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))?
        .trim()
        .parse()
        .ok()
}

/// Proportional set size of a process (`/proc/<pid>/smaps_rollup` `Pss`), bytes: its
/// private memory plus its share of pages shared with others, so the sum over processes
/// counts shared libraries once. `None` for a process that is gone (or a kernel thread).
pub fn pss(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    kib_field(&text, "Pss:")
}

/// The `<name> <n> kB` field of a `/proc` text, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.strip_prefix(name))?;
    let mut parts = rest.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    (parts.next()? == "kB").then_some(value * 1024)
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> f64 {
    (bytes as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vm_rss() {
        let status = "Name:\tskiff-node\nVmPeak:\t  9000 kB\nVmRSS:\t   20480 kB\nThreads:\t5\n";
        assert_eq!(vm_rss(status), Some(20480 * 1024));
        assert_eq!(vm_rss("Name:\tx\n"), None, "kernel threads have no VmRSS");
        assert_eq!(vm_rss("VmRSS:\t12 MB\n"), None);
    }

    #[test]
    fn parses_cpu_time_after_a_name_with_spaces() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime ...
        let stat = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0";
        assert_eq!(cpu_time(stat), Some(Duration::from_secs(3)));
        assert_eq!(cpu_time("4242 (x) S 1"), None);
        assert_eq!(cpu_time("no name"), None);
    }

    #[test]
    fn parses_cpu_stat_and_pss() {
        let stat = "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n";
        assert_eq!(usage_usec(stat), Some(1_500_000));
        assert_eq!(usage_usec("user_usec 1\n"), None);
        let rollup = "00400000-7ffd [rollup]\nRss:   2048 kB\nPss:   1024 kB\n";
        assert_eq!(kib_field(rollup, "Pss:"), Some(1024 * 1024));
        assert!(pss(std::process::id()).is_some_and(|p| p > 0));
    }

    #[test]
    fn reads_own_process() {
        let u = usage(std::process::id()).unwrap();
        assert!(u.rss_bytes > 0);
        assert!(usage(u32::MAX).is_err());
        assert_eq!(mib(3 * 1024 * 1024 / 2), 1.5);
    }
}
