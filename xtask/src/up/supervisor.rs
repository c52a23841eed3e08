//! The processes of the local cluster: spawning each with its log, restarting one that
//! crashed (with back-off), waiting for a port, and stopping them all (SIGTERM, then SIGKILL)
//! when xtask gets SIGINT or SIGTERM.

use std::ffi::OsString;
use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use skiff_flags::NodePurgeFlags;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::files::log_tail;
use super::plan::NodePlan;

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
pub const POLL: Duration = Duration::from_millis(100);

/// A started process.
pub struct Running {
    pub name: String,
    pub child: tokio::process::Child,
    pub pid: u32,
    pub log: PathBuf,
    /// How it was started, to start it again after a crash.
    spec: SpawnSpec,
    /// Crash restarts with back-off.
    pub restarts: Restarts,
}

/// A process's command line, environment and log, as `spawn_process` got them.
#[derive(Debug, Clone)]
struct SpawnSpec {
    root: PathBuf,
    bin: PathBuf,
    args: Vec<OsString>,
    env: Vec<(String, String)>,
}

/// When a crashed component is started again: after 1 s, doubling up to 30 s while it keeps
/// crashing; a run of a minute or more starts the back-off over (systemd's and k3s'
/// supervisors behave alike).
#[derive(Debug, Clone, Default)]
pub struct Restarts {
    pub count: u32,
    delay: Duration,
    started: Option<Instant>,
    due: Option<Instant>,
}

const RESTART_FIRST: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(30);
const RESTART_RESET_AFTER: Duration = Duration::from_secs(60);

impl Restarts {
    /// The process exited at `now`: when to start it again.
    fn exited(&mut self, now: Instant) -> Duration {
        let ran = self.started.map(|s| now.saturating_duration_since(s));
        self.delay = match ran {
            Some(r) if r >= RESTART_RESET_AFTER => RESTART_FIRST,
            _ if self.delay.is_zero() => RESTART_FIRST,
            _ => (self.delay * 2).min(RESTART_MAX),
        };
        self.due = Some(now + self.delay);
        self.delay
    }

    fn started(&mut self, now: Instant) {
        self.started = Some(now);
        self.due = None;
    }
}

/// Starts `bin ARGS` in `root` as `name`, stdout and stderr to `log` (appended when
/// `append`), in a process group of its own.
pub fn spawn_process(
    root: &Path,
    bin: &Path,
    name: String,
    args: &[OsString],
    env: &[(&str, &str)],
    log: &Path,
    append: bool,
) -> Result<Running> {
    // A restart appends to the log of the run that crashed.
    let out = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(args)
        .envs(env.iter().copied())
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Own process group: a terminal Ctrl-C reaches only xtask, which then
        // stops the children in order.
        .process_group(0)
        // Safety net if xtask itself errors out before shutdown.
        .kill_on_drop(true);
    // RUST_LOG and the rest of the environment are inherited.
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {} {}", bin.display(), skiff_flags::display(args)))?;
    let pid = child.id().context("child has no pid")?;
    let mut restarts = Restarts::default();
    restarts.started(Instant::now());
    Ok(Running {
        name,
        child,
        pid,
        log: log.to_path_buf(),
        spec: SpawnSpec {
            root: root.to_path_buf(),
            bin: bin.to_path_buf(),
            args: args.to_vec(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
        restarts,
    })
}

/// Starts `r` again with its command line, its log appended.
fn respawn(r: &Running) -> Result<Running> {
    let env: Vec<(&str, &str)> = r
        .spec
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    spawn_process(
        &r.spec.root,
        &r.spec.bin,
        r.name.clone(),
        &r.spec.args,
        &env,
        &r.log,
        true,
    )
}

/// Restarts the components that exited, each after its back-off, saying so. Errors only
/// when a process cannot be checked; a start that fails is tried again later.
pub fn restart_crashed(running: &mut [Running]) -> Result<()> {
    let now = Instant::now();
    for r in running.iter_mut() {
        if let Some(due) = r.restarts.due {
            if now < due {
                continue;
            }
            match respawn(r) {
                Ok(fresh) => {
                    r.restarts.count += 1;
                    println!(
                        "restarted {} (pid {}, restart {}), log: {}",
                        r.name,
                        fresh.pid,
                        r.restarts.count,
                        r.log.display()
                    );
                    r.child = fresh.child;
                    r.pid = fresh.pid;
                    r.restarts.started(now);
                }
                Err(e) => {
                    let d = r.restarts.exited(now);
                    println!("starting {} again failed: {e:#}; next try in {d:?}", r.name);
                }
            }
            continue;
        }
        match r.child.try_wait() {
            Ok(Some(status)) => {
                let d = r.restarts.exited(now);
                println!(
                    "{} exited unexpectedly ({status}); restarting in {d:?}\n{}",
                    r.name,
                    log_tail(&r.log)
                );
            }
            Ok(None) => {}
            Err(e) => bail!("checking {}: {e}", r.name),
        }
    }
    Ok(())
}

/// SIGINT or SIGTERM delivered to xtask.
pub struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    pub fn new() -> Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
        })
    }

    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

pub fn port_open(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Whether `addr` accepts connections from inside the namespace at `netns` (from the
/// host's own when `None`).
pub fn port_open_in(netns: Option<&Path>, addr: SocketAddr) -> bool {
    match netns {
        Some(ns) => skiff_testnet::connect_in(ns, addr, Duration::from_millis(200)).is_ok(),
        None => port_open(addr),
    }
}

/// Waits until `addr` accepts connections (dialled from inside `netns` when given); fails
/// when `r` exits first or after [`READY_TIMEOUT`].
pub async fn wait_port(r: &mut Running, addr: SocketAddr, netns: Option<&Path>) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = r.child.try_wait()? {
            bail!(
                "{} exited during startup ({status})\n{}",
                r.name,
                log_tail(&r.log)
            );
        }
        let ns = netns.map(Path::to_path_buf);
        let open = tokio::task::spawn_blocking(move || port_open_in(ns.as_deref(), addr)).await?;
        if open {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "{} did not accept connections on {addr} within {}s\n{}",
                r.name,
                READY_TIMEOUT.as_secs(),
                log_tail(&r.log)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

fn send_signal(pid: u32, sig: &str) {
    // `kill` is a shell builtin in dash, so this works without procps.
    let res = Command::new("sh")
        .args(["-c", &format!("kill -{sig} {pid}")])
        .stderr(Stdio::null())
        .status();
    if let Err(e) = res {
        eprintln!("could not send SIG{sig} to {pid}: {e}");
    }
}

/// SIGTERM every running child (in reverse start order), wait up to
/// [`STOP_TIMEOUT`] (a second Ctrl-C cuts this short), then SIGKILL the rest.
pub async fn shutdown(running: &mut [Running], signals: &mut Signals) {
    for r in running.iter_mut().rev() {
        // try_wait reaps; until we reap, the pid cannot be reused.
        if let Ok(None) = r.child.try_wait() {
            println!("stopping {} (pid {})", r.name, r.pid);
            send_signal(r.pid, "TERM");
        }
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        let mut alive = 0;
        for r in running.iter_mut() {
            if matches!(r.child.try_wait(), Ok(None)) {
                alive += 1;
            }
        }
        if alive == 0 || Instant::now() >= deadline {
            break;
        }
        tokio::select! {
            _ = signals.recv() => {
                println!("second signal: killing now");
                break;
            }
            _ = tokio::time::sleep(POLL) => {}
        }
    }
    for r in running.iter_mut() {
        match r.child.try_wait() {
            Ok(Some(status)) => println!("{} exited ({status})", r.name),
            _ => {
                println!("{} did not stop: sending SIGKILL", r.name);
                let _ = r.child.start_kill();
                match r.child.wait().await {
                    Ok(status) => println!("{} killed ({status})", r.name),
                    Err(e) => eprintln!("waiting for {}: {e}", r.name),
                }
            }
        }
    }
}

/// Removes everything a node ran (`skiff-node purge`); its namespace goes when its netns
/// handle is dropped.
pub fn purge_node(bin_dir: &Path, node: &NodePlan) {
    let args = NodePurgeFlags {
        node_name: node.name.clone(),
        state_dir: node.state_dir.clone(),
    }
    .args();
    let out = Command::new(bin_dir.join("skiff-node")).args(args).output();
    match out {
        Ok(o) if o.status.success() => println!("removed {}'s pods", node.name),
        Ok(o) => eprintln!(
            "purging {}: {}",
            node.name,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => eprintln!("purging {}: {e}", node.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_back_off_doubles_and_starts_over_after_a_good_run() {
        let t0 = Instant::now();
        let mut r = Restarts::default();
        r.started(t0);
        assert_eq!(
            r.exited(t0 + Duration::from_secs(2)),
            Duration::from_secs(1)
        );
        r.started(t0 + Duration::from_secs(3));
        assert_eq!(
            r.exited(t0 + Duration::from_secs(4)),
            Duration::from_secs(2)
        );
        r.started(t0 + Duration::from_secs(6));
        assert_eq!(
            r.exited(t0 + Duration::from_secs(7)),
            Duration::from_secs(4)
        );
        for _ in 0..10 {
            r.exited(t0 + Duration::from_secs(8));
        }
        assert_eq!(r.delay, RESTART_MAX);
        // A minute of running: the next crash waits one second again.
        r.started(t0 + Duration::from_secs(10));
        assert_eq!(r.exited(t0 + Duration::from_secs(75)), RESTART_FIRST);
    }

    /// Real processes: one killed with SIGKILL is started again (new pid, same command, its
    /// log appended), the other keeps running untouched.
    #[tokio::test]
    async fn a_killed_component_is_restarted_and_the_others_keep_running() {
        let dir = std::env::temp_dir().join(format!("skiff-up-restart-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let start = |name: &str| {
            spawn_process(
                &dir,
                Path::new("/bin/sh"),
                name.into(),
                &["-c".into(), format!("echo {name} up; exec sleep 60").into()],
                &[],
                &dir.join(format!("{name}.log")),
                false,
            )
            .unwrap()
        };
        let mut running = vec![start("victim"), start("bystander")];
        let (victim, bystander) = (running[0].pid, running[1].pid);
        // The first run has spoken before it is killed (else its line would be missing).
        let log = dir.join("victim.log");
        let deadline = Instant::now() + Duration::from_secs(20);
        while fs::read_to_string(&log).unwrap_or_default() != "victim up\n"
            && Instant::now() < deadline
        {
            tokio::time::sleep(POLL).await;
        }
        // SIGKILL to the pid this test started (not reaped yet, so not reused).
        let killed = Command::new("kill")
            .args(["-9", &victim.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        while running[0].restarts.count == 0 && Instant::now() < deadline {
            restart_crashed(&mut running).unwrap();
            tokio::time::sleep(POLL).await;
        }
        assert_eq!(running[0].restarts.count, 1, "not restarted");
        assert_ne!(running[0].pid, victim);
        assert_eq!(running[1].pid, bystander);
        assert!(
            matches!(running[1].child.try_wait(), Ok(None)),
            "bystander stopped"
        );
        // Both runs are in the log (a loaded machine may take a while to start `sh`).
        let deadline = Instant::now() + Duration::from_secs(20);
        while fs::read_to_string(&log).unwrap_or_default() != "victim up\nvictim up\n"
            && Instant::now() < deadline
        {
            tokio::time::sleep(POLL).await;
        }
        assert_eq!(fs::read_to_string(&log).unwrap(), "victim up\nvictim up\n");
        for r in &mut running {
            let _ = r.child.start_kill();
            let _ = r.child.wait().await;
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
