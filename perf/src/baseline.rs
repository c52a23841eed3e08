//! Baselines without Skiff: starting the same command directly, with bounded concurrency.
//!
//! - [`Baseline::ForkExec`]: `fork`+`exec` of the command, the physical limit of starting a
//!   process.
//! - [`Baseline::Isolated`]: the same plus the isolation primitives a Skiff pod gets from the
//!   kernel: a fresh cgroup v2 directory the process is moved into and new network, UTS and
//!   IPC namespaces (`unshare --net --uts --ipc`), without an API, veth or pod IP.
//!
//! Every process started is killed and reaped and every cgroup removed when the [`Procs`]
//! guard is dropped, also on error or panic.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long one start may take before the baseline fails.
const START_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    ForkExec,
    Isolated,
}

impl Baseline {
    pub fn name(self) -> &'static str {
        match self {
            Baseline::ForkExec => "baseline fork+exec",
            Baseline::Isolated => "baseline cgroup+netns",
        }
    }

    pub fn measures(self, command: &[&str]) -> String {
        let cmd = command.join(" ");
        match self {
            Baseline::ForkExec => format!(
                "spawning `{cmd}` directly (std::process::Command) → /proc/<pid>/comm shows \
                 the command: bare fork+exec, the physical limit"
            ),
            Baseline::Isolated => format!(
                "mkdir of a fresh cgroup v2 directory → spawning `unshare --net --uts --ipc \
                 {cmd}` → moving the pid into the cgroup → /proc/<pid>/comm shows the \
                 command: the kernel isolation a pod gets, without API, agent, veth or IP"
            ),
        }
    }
}

/// Processes and cgroups a baseline started; dropping it kills and removes them.
#[derive(Debug)]
pub struct Procs {
    children: Mutex<Vec<Child>>,
    /// Parent of the per-process cgroups ([`Baseline::Isolated`] only).
    cgroup_parent: Option<PathBuf>,
}

impl Procs {
    /// `cgroup_parent` is created now (and removed on drop) when given.
    pub fn new(cgroup_parent: Option<PathBuf>) -> Result<Procs> {
        if let Some(p) = &cgroup_parent {
            std::fs::create_dir(p).with_context(|| format!("creating cgroup {}", p.display()))?;
        }
        Ok(Procs {
            children: Mutex::new(Vec::new()),
            cgroup_parent,
        })
    }

    pub fn len(&self) -> usize {
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts one process the way `baseline` does; returns how long until it runs `command`.
    pub fn start(&self, baseline: Baseline, index: usize, command: &[&str]) -> Result<Duration> {
        let comm = Path::new(command[0])
            .file_name()
            .context("empty command")?
            .to_string_lossy()
            .into_owned();
        let t0 = Instant::now();
        let pid = match baseline {
            Baseline::ForkExec => self.spawn(Command::new(command[0]).args(&command[1..]))?,
            Baseline::Isolated => {
                let parent = self
                    .cgroup_parent
                    .as_ref()
                    .context("the isolated baseline needs a cgroup parent")?;
                let cg = parent.join(format!("p{index}"));
                std::fs::create_dir(&cg)
                    .with_context(|| format!("creating cgroup {}", cg.display()))?;
                let pid = self.spawn(
                    Command::new("unshare")
                        .args(["--net", "--uts", "--ipc", "--"])
                        .args(command),
                )?;
                std::fs::write(cg.join("cgroup.procs"), pid.to_string())
                    .with_context(|| format!("moving {pid} into {}", cg.display()))?;
                pid
            }
        };
        wait_for_comm(pid, &comm, t0 + START_TIMEOUT)?;
        Ok(t0.elapsed())
    }

    /// Spawns `cmd` (stdio to /dev/null) and keeps it, to be killed by pid on drop.
    pub fn spawn(&self, cmd: &mut Command) -> Result<u32> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {:?}", cmd.get_program()))?;
        let pid = child.id();
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child);
        Ok(pid)
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        let children = std::mem::take(self.children.get_mut().unwrap_or_else(|e| e.into_inner()));
        for mut c in children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(parent) = &self.cgroup_parent {
            let _ = std::fs::write(parent.join("cgroup.kill"), "1");
            let deadline = Instant::now() + Duration::from_secs(5);
            while skiff_runtime::remove_cgroup_tree(parent).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Polls `/proc/<pid>/comm` until the process runs `comm` (it has exec'd the command).
fn wait_for_comm(pid: u32, comm: &str, deadline: Instant) -> Result<()> {
    let path = format!("/proc/{pid}/comm");
    loop {
        let now = std::fs::read_to_string(&path).unwrap_or_default();
        if now.trim_end() == comm {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "pid {pid} did not run {comm} in time (comm {:?})",
                now.trim_end()
            );
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Starts `n` processes, `concurrency` at a time (one thread each pulling the next index);
/// returns the per-process start latencies in index order and the wall time of the whole
/// batch. The processes keep running until `procs` is dropped.
pub fn run(
    procs: &Procs,
    baseline: Baseline,
    first_index: usize,
    n: usize,
    concurrency: usize,
    command: &[&str],
) -> Result<(Vec<Duration>, Duration)> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(vec![None; n]);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..concurrency.clamp(1, n.max(1)))
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        let d = procs.start(baseline, first_index + i, command)?;
                        results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(d);
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a baseline worker panicked")))
        })
    })?;
    let wall = t0.elapsed();
    let samples = results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .context("a baseline start left no sample")?;
    Ok((samples, wall))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_exec_starts_and_cleans_up() {
        let procs = Procs::new(None).unwrap();
        let (samples, _) = run(&procs, Baseline::ForkExec, 0, 3, 2, &["sleep", "30"]).unwrap();
        assert_eq!(samples.len(), 3);
        let pids: Vec<u32> = procs
            .children
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.id())
            .collect();
        assert_eq!(pids.len(), 3);
        drop(procs);
        for pid in pids {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            assert_ne!(comm.trim_end(), "sleep", "{pid} still runs");
        }
    }
}
