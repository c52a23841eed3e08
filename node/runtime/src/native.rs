//! [`NativeRuntime`]: pods as cgroup v2 groups and namespaces, containers as processes
//! started through the shim.
//!
//! State directory layout (every JSON file written atomically: temp file + rename):
//!
//! ```text
//! <state_dir>/pods/<uid>/sandbox.json                 the Sandbox (runtime)
//! <state_dir>/pods/<uid>/ns/uts, ns/ipc               bind mounts keeping the namespaces alive
//! <state_dir>/pods/<uid>/containers/<name>/spec.json  spec, env, leaf cgroup + id (runtime)
//!                                          pids.json  shim + container pid, start times (shim)
//!                                          exit.json  exit code/signal, times, reason (shim)
//!                                          shim.log   the shim's own diagnostics
//!                                          attach.sock  the shim's attach socket (0600)
//!                                          container.log[.1 …]  the container's output
//! /run/netns/skiff-<short uid>                        the pod's network namespace
//! <cgroup_parent>/shims                               cgroup of all shims
//! <cgroup_parent>/pod-<uid>/<name>                    a container's processes
//! ```

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use chrono::Utc;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::sync::broadcast;
use tracing::{debug, info, warn};

use super::shim::{self, ShimArgs};
use super::state::{
    self, ContainerRecord, ExitRecord, PidsRecord, SandboxRecord, container_dir, pod_dir,
    process_alive, read_json, write_state,
};
use super::{
    ContainerSpec, ContainerState, ExecOutput, Image, LimitReport, Limits, PidHolder, Runtime,
    RuntimeError, Sandbox, SandboxSpec, cgroup, ns, sys,
};
use crate::exec::{ExecOptions, ExecReader, ExecSession, ExecWriter, SessionGuard};
use std::os::fd::OwnedFd;

/// The leaf cgroup of a pod's shared-PID-namespace holder (not a DNS label, so no container
/// can be named so).
const PID_HOLDER_CGROUP: &str = "pid_ns";

/// Controllers enabled for pods and containers where the v2 tree offers them.
const WANTED_CONTROLLERS: [&str; 3] = [cgroup::CPU, cgroup::MEMORY, cgroup::PIDS];
/// How long the shim may take to report that the container started (or failed to).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// After `cgroup.kill`, how long to wait for the processes to be gone.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);
/// After the container exited, how long the shim may take to record it.
const SHIM_RECORD_TIMEOUT: Duration = Duration::from_secs(5);
/// Exec output beyond this is discarded (per stream).
const EXEC_OUTPUT_LIMIT: usize = 1024 * 1024;
const POLL: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeConfig {
    /// Where sandbox and container state, and container logs, live.
    pub state_dir: PathBuf,
    /// Parent cgroup of all pods, below the cgroup v2 mount, e.g.
    /// `<v2 root>/skiff/<node-name>`; created if missing.
    pub cgroup_parent: PathBuf,
    /// The `skiff-node` binary (run as `skiff-node shim …`).
    pub shim_path: PathBuf,
    /// A container log file is rotated when it would grow past this.
    pub log_max_bytes: u64,
    /// Log files kept per container, the current one included.
    pub log_max_files: usize,
}

impl NativeConfig {
    /// A configuration with 10 MiB × 5 log files.
    pub fn new(state_dir: PathBuf, cgroup_parent: PathBuf, shim_path: PathBuf) -> Self {
        Self {
            state_dir,
            cgroup_parent,
            shim_path,
            log_max_bytes: 10 * 1024 * 1024,
            log_max_files: 5,
        }
    }
}

/// The native pod runtime. Create it inside a Tokio runtime: it watches the shims of
/// running containers (adopting those a previous instance started) to report exits.
pub struct NativeRuntime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for NativeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeRuntime")
            .field("state_dir", &self.inner.cfg.state_dir)
            .field("cgroup_parent", &self.inner.cfg.cgroup_parent)
            .finish_non_exhaustive()
    }
}

struct Inner {
    cfg: NativeConfig,
    v2_root: PathBuf,
    shims_cgroup: PathBuf,
    shared: Arc<Shared>,
    pod_locks: Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
    container_locks: Mutex<HashMap<ContainerKey, Arc<tokio::sync::Mutex<()>>>>,
    starting: Mutex<HashSet<ContainerKey>>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    handle: tokio::runtime::Handle,
}

/// (pod uid, container name).
type ContainerKey = (String, String);

/// What exit watchers need.
struct Shared {
    exits: broadcast::Sender<(String, String)>,
    /// (pod uid, container, shim pid) being watched.
    watched: Mutex<HashSet<(String, String, u32)>>,
}

/// Locks a std mutex, recovering the data if a holder panicked (the sets stay consistent:
/// every update is a single insert or remove).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

async fn blocking<T, F>(f: F) -> Result<T, RuntimeError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, RuntimeError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RuntimeError::Sys {
            op: "runtime worker task".into(),
            source: io::Error::other(e.to_string()),
        })?
}

/// The shim of a container being watched.
enum ShimProc {
    /// Spawned by this runtime (reaped here).
    Child(tokio::process::Child),
    /// Started by an earlier agent; watched through a pidfd.
    Adopted { pid: u32, start_time: u64 },
}

impl NativeRuntime {
    /// Creates the state directory and the cgroup parent (plus its `shims` child), and
    /// adopts running containers found in the state directory. Must be called inside a
    /// Tokio runtime.
    pub fn new(config: NativeConfig) -> Result<Self, RuntimeError> {
        let handle =
            tokio::runtime::Handle::try_current().map_err(|_| RuntimeError::NoTokioRuntime)?;
        let v2_root = crate::host::cgroup2_mount()?;
        cgroup::check_inside(&v2_root, &config.cgroup_parent)?;
        if config.shim_path.as_os_str().is_empty() || !config.shim_path.is_absolute() {
            return Err(RuntimeError::InvalidConfig(format!(
                "shim_path {} must be an absolute path to the skiff-node binary",
                config.shim_path.display()
            )));
        }
        let pods = config.state_dir.join("pods");
        fs::create_dir_all(&pods).map_err(io_err("creating", &pods))?;
        let mut cfg = config;
        cfg.state_dir =
            fs::canonicalize(&cfg.state_dir).map_err(io_err("resolving", &cfg.state_dir))?;
        cgroup::create(&v2_root, &cfg.cgroup_parent, &WANTED_CONTROLLERS)?;
        cgroup::enable_controllers(&cfg.cgroup_parent, &WANTED_CONTROLLERS);
        let shims_cgroup = cfg.cgroup_parent.join("shims");
        cgroup::create(&v2_root, &shims_cgroup, &[])?;
        let (exits, _) = broadcast::channel(1024);
        let rt = NativeRuntime {
            inner: Arc::new(Inner {
                cfg,
                v2_root,
                shims_cgroup,
                shared: Arc::new(Shared {
                    exits,
                    watched: Mutex::new(HashSet::new()),
                }),
                pod_locks: Mutex::new(HashMap::new()),
                container_locks: Mutex::new(HashMap::new()),
                starting: Mutex::new(HashSet::new()),
                tasks: Mutex::new(Vec::new()),
                handle,
            }),
        };
        let adopted = rt.inner.adopt_all();
        info!(
            state_dir = %rt.inner.cfg.state_dir.display(),
            cgroup_parent = %rt.inner.cfg.cgroup_parent.display(),
            adopted,
            "native runtime ready"
        );
        Ok(rt)
    }

    pub fn config(&self) -> &NativeConfig {
        &self.inner.cfg
    }
}

impl Drop for NativeRuntime {
    fn drop(&mut self) {
        // Containers keep running (their shims are independent); only the watchers stop.
        for t in lock(&self.inner.tasks).drain(..) {
            t.abort();
        }
    }
}

// ---- validation ------------------------------------------------------------------------

fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 128
        && !uid.starts_with('.')
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn valid_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn validate_sandbox(spec: &SandboxSpec) -> Result<(), RuntimeError> {
    if !valid_uid(&spec.uid) {
        return Err(RuntimeError::InvalidSpec(format!(
            "metadata.uid {:?}: must be 1-128 characters of [A-Za-z0-9._-], not starting with '.'",
            spec.uid
        )));
    }
    let h = spec.hostname.as_bytes();
    if h.is_empty()
        || h.len() > 64
        || !h
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.'))
    {
        return Err(RuntimeError::InvalidSpec(format!(
            "hostname {:?}: must be 1-64 characters of [A-Za-z0-9.-]",
            spec.hostname
        )));
    }
    Ok(())
}

fn validate_container(spec: &ContainerSpec) -> Result<(), RuntimeError> {
    let name = &spec.name;
    let bad = |field: &str, msg: String| {
        Err(RuntimeError::InvalidSpec(format!(
            "containers[{name}].{field}: {msg}"
        )))
    };
    if !valid_dns_label(name) {
        return Err(RuntimeError::InvalidSpec(format!(
            "containers[{name}].name: must be a DNS-1123 label ([a-z0-9-], at most 63)"
        )));
    }
    match spec.argv.first() {
        None => return bad("command", "no command given".into()),
        Some(a) if a.is_empty() => return bad("command", "empty command".into()),
        _ => {}
    }
    if spec.argv.iter().any(|a| a.contains('\0')) {
        return bad("args", "contains a NUL byte".into());
    }
    for (k, v) in &spec.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return bad("env", format!("invalid variable {k:?}"));
        }
    }
    if let Some(wd) = &spec.working_dir
        && !wd.is_absolute()
    {
        return bad(
            "workingDir",
            format!("{} is not an absolute path", wd.display()),
        );
    }
    if !spec.mounts.is_empty() && spec.image == Image::Host {
        return bad(
            "volumeMounts",
            "volumes need a root filesystem image (not \"host\")".into(),
        );
    }
    for m in &spec.mounts {
        let d = &m.destination;
        if !d.is_absolute()
            || d.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return bad(
                "volumeMounts",
                format!("{}: must be an absolute path without '..'", d.display()),
            );
        }
    }
    if let Some(caps) = &spec.security.capabilities
        && let Err(m) = crate::capability_names(caps)
    {
        return bad("securityContext.capabilities", m);
    }
    if let Image::RootFs(root) = &spec.image {
        if !root.is_absolute() {
            return bad(
                "image",
                format!("root directory {} is not an absolute path", root.display()),
            );
        }
        match fs::metadata(root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return bad(
                    "image",
                    format!("root directory {} is not a directory", root.display()),
                );
            }
            Err(_) => {
                return bad(
                    "image",
                    format!("root directory {} does not exist", root.display()),
                );
            }
        }
    }
    Ok(())
}

/// `skiff-<first 8 of uid>-<8 hex of a hash of the uid>`: short, stable, unique enough.
fn netns_name(uid: &str) -> String {
    // FNV-1a, 32 bit: stable across releases (unlike std's hasher).
    let hash = uid.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let prefix: String = uid.chars().take(8).collect();
    format!("skiff-{prefix}-{hash:08x}")
}

fn container_env(spec: &ContainerSpec, hostname: &str) -> Vec<(String, String)> {
    let mut env = spec.env.clone();
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), shim::DEFAULT_PATH.into()));
    }
    if !env.iter().any(|(k, _)| k == "HOSTNAME") {
        env.push(("HOSTNAME".into(), hostname.into()));
    }
    env
}

fn exit_state(e: ExitRecord) -> ContainerState {
    ContainerState::Exited {
        exit_code: e.exit_code,
        signal: e.signal,
        started_at: SystemTime::from(e.started_at),
        finished_at: SystemTime::from(e.finished_at),
        reason: e.reason,
        message: e.message,
    }
}

/// Records an exit the shim could not record (it died, or never reported).
fn synthesize_exit(
    cdir: &Path,
    started_at: chrono::DateTime<Utc>,
    reason: &str,
    message: &str,
) -> ExitRecord {
    let rec = ExitRecord {
        exit_code: 255,
        signal: None,
        started_at,
        finished_at: Utc::now(),
        reason: reason.into(),
        message: message.into(),
    };
    if let Err(e) = state::write_json_atomic(&cdir.join(state::EXIT_FILE), &rec) {
        warn!(dir = %cdir.display(), error = %e, "cannot record a lost exit status");
    }
    rec
}

/// The last lines of a shim's diagnostics, for error messages.
fn shim_log_tail(cdir: &Path) -> String {
    let text = fs::read_to_string(cdir.join(state::SHIM_LOG_FILE)).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// Waits until process `pid` (started at `start_time`) has exited.
async fn wait_process_exit(pid: u32, start_time: u64) {
    let Ok(fd) = sys::pidfd_open(pid) else {
        return; // already gone
    };
    // The pidfd pins the process; if it is not the one we mean, it has exited already.
    if !process_alive(pid, start_time) {
        return;
    }
    match sys::async_readable(fd) {
        Ok(afd) => {
            // A pidfd becomes readable when the process exits.
            let _ = afd.readable().await;
        }
        Err(e) => {
            debug!(pid, error = %e, "cannot poll pidfd; polling /proc");
            while process_alive(pid, start_time) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Watches one container's shim and reports the container's exit.
async fn watch(shared: Arc<Shared>, key: (String, String, u32), cdir: PathBuf, shim: ShimProc) {
    match shim {
        ShimProc::Child(mut child) => {
            let _ = child.wait().await;
        }
        ShimProc::Adopted { pid, start_time } => wait_process_exit(pid, start_time).await,
    }
    let exit_path = cdir.join(state::EXIT_FILE);
    let pids: Option<PidsRecord> = read_json(&cdir.join(state::PIDS_FILE)).ok().flatten();
    if !exit_path.exists()
        && let Some(p) = &pids
    {
        if process_alive(p.pid, p.pid_start_time) {
            warn!(pod = %key.0, container = %key.1, pid = p.pid,
                "shim exited while the container runs; watching the container itself");
            wait_process_exit(p.pid, p.pid_start_time).await;
        }
        if !exit_path.exists() {
            synthesize_exit(
                &cdir,
                p.started_at,
                "Unknown",
                "the shim exited without recording the container's exit status",
            );
        }
    }
    lock(&shared.watched).remove(&key);
    if exit_path.exists() {
        debug!(pod = %key.0, container = %key.1, "container exited");
        // No receivers is fine.
        let _ = shared.exits.send((key.0, key.1));
    }
}

/// Reads up to `limit` bytes, then discards the rest (so the writer never blocks).
async fn read_capped<R: AsyncRead + Unpin>(reader: Option<R>, limit: usize) -> Vec<u8> {
    let Some(mut r) = reader else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = limit.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    out
}

/// Sends `signal` to every process in `pids` (gone ones are skipped).
fn signal_all(pids: &[u32], signal: Signal) {
    for &pid in pids {
        let Ok(raw) = i32::try_from(pid) else {
            continue;
        };
        if let Err(e) = nix::sys::signal::kill(Pid::from_raw(raw), signal)
            && e != nix::errno::Errno::ESRCH
        {
            warn!(pid, %signal, error = %e, "cannot signal process");
        }
    }
}

impl Inner {
    fn pod_lock(&self, uid: &str) -> Arc<tokio::sync::RwLock<()>> {
        lock(&self.pod_locks)
            .entry(uid.to_string())
            .or_default()
            .clone()
    }

    fn container_lock(&self, uid: &str, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.container_locks)
            .entry((uid.to_string(), name.to_string()))
            .or_default()
            .clone()
    }

    fn pod_dir(&self, uid: &str) -> PathBuf {
        pod_dir(&self.cfg.state_dir, uid)
    }

    fn container_dir(&self, uid: &str, name: &str) -> PathBuf {
        container_dir(&self.cfg.state_dir, uid, name)
    }

    fn load_sandbox(&self, uid: &str) -> Result<Sandbox, RuntimeError> {
        if !valid_uid(uid) {
            return Err(RuntimeError::NotFound(format!("sandbox {uid:?}")));
        }
        read_json::<SandboxRecord>(&self.pod_dir(uid).join(state::SANDBOX_FILE))?
            .map(|r| r.sandbox)
            .ok_or_else(|| RuntimeError::NotFound(format!("sandbox {uid}")))
    }

    fn track(&self, task: tokio::task::JoinHandle<()>) {
        let mut tasks = lock(&self.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task.abort_handle());
    }

    /// Starts watching a container's shim unless it is watched already.
    fn watch(&self, uid: &str, name: &str, shim_pid: u32, shim: ShimProc) {
        let key = (uid.to_string(), name.to_string(), shim_pid);
        if !lock(&self.shared.watched).insert(key.clone()) {
            return;
        }
        let cdir = self.container_dir(uid, name);
        let task = self
            .handle
            .spawn(watch(self.shared.clone(), key, cdir, shim));
        self.track(task);
    }

    /// Watches every started, not yet exited container in the state directory; returns how
    /// many.
    fn adopt_all(&self) -> usize {
        let mut n = 0;
        let pods = self.cfg.state_dir.join("pods");
        let Ok(rd) = fs::read_dir(&pods) else {
            return 0;
        };
        for pod in rd.filter_map(Result::ok) {
            let uid = pod.file_name().to_string_lossy().into_owned();
            let Ok(cs) = fs::read_dir(pod.path().join("containers")) else {
                continue;
            };
            for c in cs.filter_map(Result::ok) {
                let name = c.file_name().to_string_lossy().into_owned();
                let cdir = c.path();
                if cdir.join(state::EXIT_FILE).exists() {
                    continue;
                }
                match read_json::<PidsRecord>(&cdir.join(state::PIDS_FILE)) {
                    Ok(Some(p)) => {
                        self.watch(
                            &uid,
                            &name,
                            p.shim_pid,
                            ShimProc::Adopted {
                                pid: p.shim_pid,
                                start_time: p.shim_start_time,
                            },
                        );
                        n += 1;
                    }
                    Ok(None) => {}
                    Err(e) => warn!(error = %e, "skipping unreadable container state"),
                }
            }
        }
        n
    }

    // ---- sandboxes ----

    fn create_sandbox_sync(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        let pod_dir = self.pod_dir(&spec.uid);
        let record_path = pod_dir.join(state::SANDBOX_FILE);
        if let Some(rec) = read_json::<SandboxRecord>(&record_path)? {
            let sb = rec.sandbox;
            if ns::is_ns_mount(&sb.netns_path) && sb.cgroup_dir.is_dir() {
                return Ok(sb);
            }
            return Err(RuntimeError::State {
                path: record_path,
                message: "sandbox exists but its network namespace or cgroup is gone; remove it"
                    .into(),
            });
        }
        let cgroup_dir = self.cfg.cgroup_parent.join(format!("pod-{}", spec.uid));
        let paths = ns::PodNsPaths {
            net: Path::new(ns::NETNS_DIR).join(netns_name(&spec.uid)),
            uts: pod_dir.join("ns").join("uts"),
            ipc: pod_dir.join("ns").join("ipc"),
        };
        if pod_dir.exists() {
            warn!(pod = %spec.uid, "cleaning up an interrupted sandbox creation");
            self.teardown_sync(&pod_dir, &cgroup_dir, &paths)?;
        }
        let containers = pod_dir.join("containers");
        fs::create_dir_all(&containers).map_err(io_err("creating", &containers))?;
        let undo = |inner: &Inner| {
            let _ = inner.teardown_sync(&pod_dir, &cgroup_dir, &paths);
        };
        let result = (|| {
            cgroup::create(&self.v2_root, &cgroup_dir, &WANTED_CONTROLLERS)?;
            // Containers live in leaf cgroups below the pod: delegate what the pod has.
            cgroup::enable_controllers(&cgroup_dir, &WANTED_CONTROLLERS);
            let applied = cgroup::apply_limits(&cgroup_dir, &spec.limits);
            if applied != spec.limits {
                debug!(pod = %spec.uid, ?applied, requested = ?spec.limits,
                    "some pod limits are not enforced on this host");
            }
            let cgroup_id = cgroup::id(&cgroup_dir)?;
            match ns::ensure_netns_dir() {
                Ok(_) => {}
                Err(source) => {
                    return Err(RuntimeError::Sys {
                        op: format!("preparing {}", ns::NETNS_DIR),
                        source,
                    });
                }
            }
            ns::create(&paths, &spec.hostname).map_err(|source| RuntimeError::Sys {
                op: format!("creating namespaces of pod {}", spec.uid),
                source,
            })?;
            let pid_holder = if spec.share_pid_namespace {
                Some(self.start_pid_holder(&cgroup_dir, &pod_dir)?)
            } else {
                None
            };
            let sandbox = Sandbox {
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                name: spec.name.clone(),
                hostname: spec.hostname.clone(),
                cgroup_dir: cgroup_dir.clone(),
                cgroup_id,
                netns_path: paths.net.clone(),
                uts_path: paths.uts.clone(),
                ipc_path: paths.ipc.clone(),
                pid_namespace: spec.pid_namespace,
                mount_namespace: spec.mount_namespace,
                limits: spec.limits.clone(),
                created_at: SystemTime::now(),
                pid_holder,
            };
            write_state(
                &record_path,
                &SandboxRecord {
                    version: 1,
                    sandbox: sandbox.clone(),
                },
            )?;
            Ok(sandbox)
        })();
        match result {
            Ok(sb) => {
                info!(pod = %sb.uid, cgroup = %sb.cgroup_dir.display(),
                    netns = %sb.netns_path.display(), "sandbox created");
                Ok(sb)
            }
            Err(e) => {
                undo(self);
                Err(e)
            }
        }
    }

    /// Starts the PID 1 of a pod's shared PID namespace (`skiff-node shim --pause`) in the
    /// pod's leaf cgroup [`PID_HOLDER_CGROUP`], so the pod's teardown stops it with the rest.
    fn start_pid_holder(
        &self,
        cgroup_dir: &Path,
        pod_dir: &Path,
    ) -> Result<PidHolder, RuntimeError> {
        use std::io::BufRead as _;
        let leaf = cgroup_dir.join(PID_HOLDER_CGROUP);
        cgroup::create(&self.v2_root, &leaf, &WANTED_CONTROLLERS)?;
        let log_path = pod_dir.join("pid-holder.log");
        let log = fs::File::create(&log_path).map_err(io_err("creating", &log_path))?;
        let args = ShimArgs {
            pause: true,
            cgroup: Some(leaf),
            argv: vec!["pause".into()],
            ..Default::default()
        };
        let mut child = std::process::Command::new(&self.cfg.shim_path)
            .args(args.to_args())
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(io_err(
                "spawning the PID namespace holder",
                &self.cfg.shim_path,
            ))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = io::BufReader::new(out).read_line(&mut line);
        }
        let _ = child.wait();
        let pid = line
            .trim()
            .strip_prefix("started ")
            .and_then(|p| p.parse::<u32>().ok())
            .ok_or_else(|| RuntimeError::Sys {
                op: "starting the pod's PID namespace holder".into(),
                source: io::Error::other(format!(
                    "it reported {:?}; log: {}",
                    line.trim(),
                    fs::read_to_string(&log_path).unwrap_or_default().trim()
                )),
            })?;
        let start_time = state::proc_start_time(pid).ok_or_else(|| RuntimeError::Sys {
            op: "starting the pod's PID namespace holder".into(),
            source: io::Error::other(format!("process {pid} exited at once")),
        })?;
        Ok(PidHolder { pid, start_time })
    }

    /// Removes a pod's cgroups (which must be empty), namespace mounts and state.
    fn teardown_sync(
        &self,
        pod_dir: &Path,
        cgroup_dir: &Path,
        paths: &ns::PodNsPaths,
    ) -> Result<(), RuntimeError> {
        cgroup::remove_tree(cgroup_dir)?;
        let mut ok = true;
        for p in [&paths.net, &paths.uts, &paths.ipc] {
            ok &= ns::remove(p);
        }
        if !ok {
            return Err(RuntimeError::Sys {
                op: format!("removing the namespaces of {}", pod_dir.display()),
                source: io::Error::other("see the log for the failing unmount"),
            });
        }
        match fs::remove_dir_all(pod_dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(RuntimeError::Io {
                op: "removing",
                path: pod_dir.to_path_buf(),
                source,
            }),
        }
    }

    /// Only paths this runtime creates may be torn down (a forged Sandbox must not make
    /// it kill or unmount anything else).
    fn check_owned(&self, sb: &Sandbox) -> Result<(), RuntimeError> {
        let cg_ok = sb.cgroup_dir == self.cfg.cgroup_parent.join(format!("pod-{}", sb.uid));
        let ns_ok = sb.netns_path == Path::new(ns::NETNS_DIR).join(netns_name(&sb.uid));
        let pod_dir = self.pod_dir(&sb.uid);
        let files_ok = sb.uts_path.starts_with(&pod_dir) && sb.ipc_path.starts_with(&pod_dir);
        if valid_uid(&sb.uid) && cg_ok && ns_ok && files_ok {
            Ok(())
        } else {
            Err(RuntimeError::InvalidSpec(format!(
                "sandbox {} does not belong to this runtime",
                sb.uid
            )))
        }
    }

    // ---- containers ----

    /// The state of a container, from its state files.
    fn read_state(&self, uid: &str, name: &str) -> Result<Option<ContainerState>, RuntimeError> {
        if !valid_uid(uid) || !valid_dns_label(name) {
            return Ok(None);
        }
        let cdir = self.container_dir(uid, name);
        let Some(rec) = read_json::<ContainerRecord>(&cdir.join(state::SPEC_FILE))? else {
            return Ok(None);
        };
        let exit_path = cdir.join(state::EXIT_FILE);
        if let Some(e) = read_json::<ExitRecord>(&exit_path)? {
            return Ok(Some(exit_state(e)));
        }
        let Some(p) = read_json::<PidsRecord>(&cdir.join(state::PIDS_FILE))? else {
            if lock(&self.starting).contains(&(uid.to_string(), name.to_string())) {
                return Ok(None);
            }
            // Re-check: the shim may have recorded a start failure meanwhile.
            if let Some(e) = read_json::<ExitRecord>(&exit_path)? {
                return Ok(Some(exit_state(e)));
            }
            return Ok(Some(exit_state(synthesize_exit(
                &cdir,
                Utc::now(),
                "StartError",
                &format!(
                    "the shim exited before starting the container: {}",
                    shim_log_tail(&cdir)
                ),
            ))));
        };
        if process_alive(p.pid, p.pid_start_time) {
            return Ok(Some(ContainerState::Running {
                pid: p.pid,
                started_at: SystemTime::from(p.started_at),
                cgroup_id: rec.cgroup_id,
            }));
        }
        // The container is gone; its shim records that right away.
        let deadline = Instant::now() + SHIM_RECORD_TIMEOUT;
        while process_alive(p.shim_pid, p.shim_start_time) && Instant::now() < deadline {
            if exit_path.exists() {
                break;
            }
            std::thread::sleep(POLL);
        }
        if let Some(e) = read_json::<ExitRecord>(&exit_path)? {
            return Ok(Some(exit_state(e)));
        }
        Ok(Some(exit_state(synthesize_exit(
            &cdir,
            p.started_at,
            "Unknown",
            "the container exited while its shim was not running; exit status lost",
        ))))
    }

    /// Prepares the state directory and leaf cgroup of a container about to start.
    fn prepare_container_sync(
        &self,
        sb: &Sandbox,
        spec: &ContainerSpec,
    ) -> Result<ContainerRecord, RuntimeError> {
        let cdir = self.container_dir(&sb.uid, &spec.name);
        fs::create_dir_all(&cdir).map_err(io_err("creating", &cdir))?;
        // A restart: forget the previous run, whose log becomes the previous one.
        keep_previous_log(&cdir.join(state::CONTAINER_LOG_FILE))?;
        for f in [
            state::EXIT_FILE,
            state::PIDS_FILE,
            state::SPEC_FILE,
            crate::attach::SOCKET_FILE,
        ] {
            match fs::remove_file(cdir.join(f)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(RuntimeError::Io {
                        op: "removing",
                        path: cdir.join(f),
                        source: e,
                    });
                }
                _ => {}
            }
        }
        let leaf = sb.cgroup_dir.join(&spec.name);
        cgroup::create(&self.v2_root, &leaf, &WANTED_CONTROLLERS)?;
        if cgroup::populated(&leaf) {
            warn!(pod = %sb.uid, container = %spec.name,
                "leftover processes in the container cgroup; killing them");
            cgroup::kill(&leaf)?;
        }
        let applied = cgroup::apply_limits(&leaf, &spec.limits);
        let record = ContainerRecord {
            spec: spec.clone(),
            env: container_env(spec, &sb.hostname),
            cgroup_id: cgroup::id(&leaf)?,
            cgroup_dir: leaf,
            log_path: cdir.join(state::CONTAINER_LOG_FILE),
            limits_applied: applied,
        };
        write_state(&cdir.join(state::SPEC_FILE), &record)?;
        Ok(record)
    }

    /// [`Inner::read_state`] off the async threads (it may wait for a shim briefly).
    async fn state_of(
        self: &Arc<Self>,
        uid: &str,
        name: &str,
    ) -> Result<Option<ContainerState>, RuntimeError> {
        let me = self.clone();
        let (uid, name) = (uid.to_string(), name.to_string());
        blocking(move || me.read_state(&uid, &name)).await
    }

    async fn start_container(
        self: &Arc<Self>,
        sb: &Sandbox,
        spec: &ContainerSpec,
    ) -> Result<ContainerState, RuntimeError> {
        let qualified = format!("{}/{}", sb.uid, spec.name);
        if let Some(s) = self.state_of(&sb.uid, &spec.name).await?
            && s.is_running()
        {
            return Err(RuntimeError::AlreadyRunning(qualified));
        }
        let record = {
            let (me, sb, spec) = (self.clone(), sb.clone(), spec.clone());
            blocking(move || me.prepare_container_sync(&sb, &spec)).await?
        };
        let cdir = self.container_dir(&sb.uid, &spec.name);
        let args = ShimArgs {
            state: Some(cdir.clone()),
            cgroup: Some(record.cgroup_dir.clone()),
            shim_cgroup: Some(self.shims_cgroup.clone()),
            netns: Some(sb.netns_path.clone()),
            uts: Some(sb.uts_path.clone()),
            ipc: Some(sb.ipc_path.clone()),
            new_pidns: sb.pid_namespace || spec.security.pid_namespace,
            pidns: match &sb.pid_holder {
                _ if spec.target.is_some() => Some(self.target_pidns(sb, spec).await?),
                Some(h) if process_alive(h.pid, h.start_time) => {
                    Some(PathBuf::from(format!("/proc/{}/ns/pid", h.pid)))
                }
                Some(_) => {
                    return Err(RuntimeError::State {
                        path: self.pod_dir(&sb.uid),
                        message: "the pod's shared PID namespace is gone (its holder process \
                                  exited); recreate the pod"
                            .into(),
                    });
                }
                None => None,
            },
            // A /proc of the target's PID namespace needs a mount namespace of its own.
            new_mountns: sb.mount_namespace || spec.target.is_some(),
            spec: Some(cdir.join(state::SPEC_FILE)),
            rootfs: match &spec.image {
                Image::Host => None,
                Image::RootFs(p) => Some(p.clone()),
            },
            workdir: spec.working_dir.clone(),
            log: Some(record.log_path.clone()),
            log_max_bytes: self.cfg.log_max_bytes,
            log_max_files: self.cfg.log_max_files,
            argv: spec.argv.iter().map(Into::into).collect(),
            tty: spec.stdio.tty,
            stdin: spec.stdio.stdin,
            stdin_once: spec.stdio.stdin_once,
            ..Default::default()
        };
        let shim_log_path = cdir.join(state::SHIM_LOG_FILE);
        let shim_log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&shim_log_path)
            .map_err(io_err("opening", &shim_log_path))?;
        let mut cmd = tokio::process::Command::new(&self.cfg.shim_path);
        cmd.args(args.to_args())
            .env_clear()
            .envs(record.env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(shim_log))
            .kill_on_drop(false);
        sys::new_session_on_spawn(&mut cmd);

        let key = (sb.uid.clone(), spec.name.clone());
        lock(&self.starting).insert(key.clone());
        let result = self.spawn_and_wait_ready(cmd, sb, &spec.name, &cdir).await;
        lock(&self.starting).remove(&key);
        let child = match result {
            Ok(c) => c,
            Err(e) => {
                // Whatever started must not linger.
                let _ = cgroup::kill(&record.cgroup_dir);
                return Err(e);
            }
        };
        let state =
            self.state_of(&sb.uid, &spec.name)
                .await?
                .ok_or_else(|| RuntimeError::Shim {
                    container: qualified.clone(),
                    message: "no state after start".into(),
                })?;
        match &state {
            ContainerState::Running { pid, .. } => {
                info!(pod = %sb.uid, container = %spec.name, pid, "container started")
            }
            ContainerState::Exited {
                reason, message, ..
            } => {
                info!(pod = %sb.uid, container = %spec.name, reason, message, "container exited at start")
            }
        }
        Ok(match child {
            Some(c) => {
                let shim_pid = c.id().unwrap_or(0);
                self.watch(&sb.uid, &spec.name, shim_pid, ShimProc::Child(c));
                state
            }
            None => state,
        })
    }

    /// `/proc/<pid>/ns/pid` of the running container `spec.target` of the same pod.
    async fn target_pidns(
        self: &Arc<Self>,
        sb: &Sandbox,
        spec: &ContainerSpec,
    ) -> Result<PathBuf, RuntimeError> {
        let target = spec.target.as_deref().unwrap_or_default();
        let qualified = format!("{}/{target}", sb.uid);
        if target == spec.name || !valid_dns_label(target) {
            return Err(RuntimeError::InvalidSpec(format!(
                "containers[{}].targetContainerName: {target:?} is not another container of \
                 the pod",
                spec.name
            )));
        }
        let Some(ContainerState::Running { pid, .. }) = self.state_of(&sb.uid, target).await?
        else {
            return Err(RuntimeError::NotRunning(qualified));
        };
        Ok(PathBuf::from(format!("/proc/{pid}/ns/pid")))
    }

    /// Attaches to container `name`'s main process through its shim ([`crate::attach`]).
    async fn attach(
        self: &Arc<Self>,
        sb: &Sandbox,
        name: &str,
        opts: ExecOptions,
    ) -> Result<ExecSession, RuntimeError> {
        let qualified = format!("{}/{name}", sb.uid);
        let Some(ContainerState::Running { .. }) = self.state_of(&sb.uid, name).await? else {
            return Err(RuntimeError::NotRunning(qualified));
        };
        let cdir = self.container_dir(&sb.uid, name);
        let Some(rec) = read_json::<ContainerRecord>(&cdir.join(state::SPEC_FILE))? else {
            return Err(RuntimeError::NotRunning(qualified));
        };
        let opts = ExecOptions {
            stdin: opts.stdin && rec.spec.stdio.stdin,
            tty: rec.spec.stdio.tty,
        };
        crate::attach::connect(&cdir, opts, rec.spec.stdio.tty).await
    }

    /// Spawns the shim and waits for its `started`/`failed` report.
    async fn spawn_and_wait_ready(
        &self,
        mut cmd: tokio::process::Command,
        sb: &Sandbox,
        name: &str,
        cdir: &Path,
    ) -> Result<Option<tokio::process::Child>, RuntimeError> {
        let qualified = format!("{}/{}", sb.uid, name);
        let mut child = cmd
            .spawn()
            .map_err(io_err("spawning the shim", &self.cfg.shim_path))?;
        let Some(stdout) = child.stdout.take() else {
            return Err(RuntimeError::Shim {
                container: qualified,
                message: "no stdout pipe".into(),
            });
        };
        let mut line = String::new();
        let read =
            tokio::time::timeout(START_TIMEOUT, BufReader::new(stdout).read_line(&mut line)).await;
        let line = line.trim();
        match read {
            Ok(Ok(_)) if line == "failed" || line.starts_with("started ") => Ok(Some(child)),
            other => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                let why = match other {
                    Err(_) => format!("no report within {START_TIMEOUT:?}"),
                    Ok(Err(e)) => format!("reading its report: {e}"),
                    Ok(Ok(_)) => format!("unexpected report {line:?}"),
                };
                Err(RuntimeError::Shim {
                    container: qualified,
                    message: format!("{why}; shim log: {}", shim_log_tail(cdir)),
                })
            }
        }
    }

    /// Waits until the container's main process has exited and its exit is recorded.
    async fn wait_exited(&self, uid: &str, name: &str, timeout: Duration) -> bool {
        let cdir = self.container_dir(uid, name);
        let deadline = Instant::now() + timeout;
        loop {
            if cdir.join(state::EXIT_FILE).exists() {
                return true;
            }
            match read_json::<PidsRecord>(&cdir.join(state::PIDS_FILE)) {
                Ok(Some(p))
                    if process_alive(p.pid, p.pid_start_time)
                        || process_alive(p.shim_pid, p.shim_start_time) => {}
                // Neither the container nor its shim runs: nothing to wait for.
                _ => return true,
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn stop_container(
        self: &Arc<Self>,
        sb: &Sandbox,
        name: &str,
        grace: Duration,
    ) -> Result<(), RuntimeError> {
        let cdir = self.container_dir(&sb.uid, name);
        let Some(rec) = read_json::<ContainerRecord>(&cdir.join(state::SPEC_FILE))? else {
            return Err(RuntimeError::NotFound(format!(
                "container {}/{name}",
                sb.uid
            )));
        };
        let leaf = rec.cgroup_dir;
        if !leaf.starts_with(&sb.cgroup_dir) {
            return Err(RuntimeError::State {
                path: cdir.join(state::SPEC_FILE),
                message: "container cgroup outside its pod cgroup".into(),
            });
        }
        let running = self
            .state_of(&sb.uid, name)
            .await?
            .is_some_and(|s| s.is_running());
        if running {
            debug!(pod = %sb.uid, container = name, ?grace, "stopping container");
            signal_all(&cgroup::procs_recursive(&leaf), Signal::SIGTERM);
            if !self.wait_exited(&sb.uid, name, grace).await {
                info!(pod = %sb.uid, container = name, ?grace,
                    "container did not stop within its grace period; killing it");
                cgroup::kill(&leaf)?;
                if !self.wait_exited(&sb.uid, name, KILL_TIMEOUT).await {
                    warn!(pod = %sb.uid, container = name, "container survived cgroup.kill");
                }
            }
        }
        // The main process is gone; so must be everything it left behind.
        if cgroup::populated(&leaf) {
            cgroup::kill(&leaf)?;
            if !cgroup::wait_empty(&leaf, KILL_TIMEOUT).await {
                warn!(cgroup = %leaf.display(), "processes left after cgroup.kill");
            }
        }
        Ok(())
    }

    async fn remove_sandbox(
        self: &Arc<Self>,
        sandbox: &Sandbox,
        grace: Duration,
    ) -> Result<(), RuntimeError> {
        let sb = match self.load_sandbox(&sandbox.uid) {
            Ok(sb) => sb,
            Err(RuntimeError::NotFound(_)) => sandbox.clone(),
            Err(e) => return Err(e),
        };
        self.check_owned(&sb)?;
        let cg = sb.cgroup_dir.clone();
        if cgroup::populated(&cg) {
            signal_all(&cgroup::procs_recursive(&cg), Signal::SIGTERM);
            if !cgroup::wait_empty(&cg, grace).await {
                info!(pod = %sb.uid, ?grace, "pod did not stop within its grace period; killing it");
                cgroup::kill(&cg)?;
                if !cgroup::wait_empty(&cg, KILL_TIMEOUT).await {
                    return Err(RuntimeError::Sys {
                        op: format!("emptying cgroup {}", cg.display()),
                        source: io::Error::other("processes survived cgroup.kill"),
                    });
                }
            }
        }
        // Let the shims record the exits (and leave), so nothing of the pod is left running.
        let containers = self.pod_dir(&sb.uid).join("containers");
        let shims: Vec<PidsRecord> = fs::read_dir(&containers)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter_map(|c| read_json(&c.path().join(state::PIDS_FILE)).ok().flatten())
                    .collect()
            })
            .unwrap_or_default();
        let deadline = Instant::now() + SHIM_RECORD_TIMEOUT;
        for p in &shims {
            while process_alive(p.shim_pid, p.shim_start_time) && Instant::now() < deadline {
                tokio::time::sleep(POLL).await;
            }
            if process_alive(p.shim_pid, p.shim_start_time)
                && let Ok(fd) = sys::pidfd_open(p.shim_pid)
                && process_alive(p.shim_pid, p.shim_start_time)
            {
                warn!(pod = %sb.uid, shim = p.shim_pid, "shim still running; killing it");
                let _ = sys::pidfd_send_signal(std::os::fd::AsFd::as_fd(&fd), Signal::SIGKILL);
            }
        }
        let paths = ns::PodNsPaths {
            net: sb.netns_path.clone(),
            uts: sb.uts_path.clone(),
            ipc: sb.ipc_path.clone(),
        };
        let pod_dir = self.pod_dir(&sb.uid);
        {
            let me = self.clone();
            blocking(move || me.teardown_sync(&pod_dir, &cg, &paths)).await?;
        }
        lock(&self.container_locks).retain(|(uid, _), _| uid != &sb.uid);
        // Forget the pod's lock unless someone is queued on it (we hold one reference and
        // the map another).
        let mut pod_locks = lock(&self.pod_locks);
        if pod_locks
            .get(&sb.uid)
            .is_some_and(|l| Arc::strong_count(l) <= 2)
        {
            pod_locks.remove(&sb.uid);
        }
        info!(pod = %sb.uid, "sandbox removed");
        Ok(())
    }

    fn list_sandboxes_sync(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        let pods = self.cfg.state_dir.join("pods");
        let rd = fs::read_dir(&pods).map_err(io_err("reading", &pods))?;
        let mut out = Vec::new();
        for entry in rd.filter_map(Result::ok) {
            let path = entry.path().join(state::SANDBOX_FILE);
            match read_json::<SandboxRecord>(&path) {
                Ok(Some(r)) => out.push(r.sandbox),
                Ok(None) => {}
                Err(e) => warn!(error = %e, "skipping unreadable sandbox state"),
            }
        }
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.uid.cmp(&b.uid)));
        Ok(out)
    }

    /// The exec helper's command for `argv` in container `name` of `sb` (checked: the
    /// container runs, the argv is a command), with the container's environment, and the
    /// helper told to take its terminal when `tty`.
    async fn exec_command(
        self: &Arc<Self>,
        sb: &Sandbox,
        name: &str,
        argv: &[String],
        tty: bool,
    ) -> Result<tokio::process::Command, RuntimeError> {
        let qualified = format!("{}/{name}", sb.uid);
        if argv.first().is_none_or(|a| a.is_empty()) || argv.iter().any(|a| a.contains('\0')) {
            return Err(RuntimeError::InvalidSpec(format!(
                "exec in {qualified}: empty command or NUL byte"
            )));
        }
        let Some(ContainerState::Running { pid, .. }) = self.state_of(&sb.uid, name).await? else {
            return Err(RuntimeError::NotRunning(qualified));
        };
        let cdir = self.container_dir(&sb.uid, name);
        let (Some(rec), Some(pids)) = (
            read_json::<ContainerRecord>(&cdir.join(state::SPEC_FILE))?,
            read_json::<PidsRecord>(&cdir.join(state::PIDS_FILE))?,
        ) else {
            return Err(RuntimeError::NotRunning(qualified));
        };
        let args = ShimArgs {
            cgroup: Some(rec.cgroup_dir.clone()),
            join_pid: Some(pid),
            join_start_time: Some(pids.pid_start_time),
            workdir: rec.spec.working_dir.clone(),
            spec: Some(cdir.join(state::SPEC_FILE)),
            argv: argv.iter().map(Into::into).collect(),
            tty,
            ..Default::default()
        };
        let mut cmd = tokio::process::Command::new(&self.cfg.shim_path);
        cmd.args(args.to_args())
            .env_clear()
            .envs(rec.env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .kill_on_drop(true);
        Ok(cmd)
    }

    async fn exec(
        self: &Arc<Self>,
        sb: &Sandbox,
        name: &str,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, RuntimeError> {
        let qualified = format!("{}/{name}", sb.uid);
        let mut cmd = self.exec_command(sb, name, argv, false).await?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(io_err("spawning the exec helper", &self.cfg.shim_path))?;
        let pgid = child.id();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let run = async {
            let (out, err, status) = tokio::join!(
                read_capped(stdout, EXEC_OUTPUT_LIMIT),
                read_capped(stderr, EXEC_OUTPUT_LIMIT),
                child.wait()
            );
            (out, err, status)
        };
        match tokio::time::timeout(timeout, run).await {
            Ok((stdout, stderr, status)) => {
                let status = status.map_err(|source| RuntimeError::Sys {
                    op: format!("waiting for exec in {qualified}"),
                    source,
                })?;
                use std::os::unix::process::ExitStatusExt;
                let exit_code = status
                    .code()
                    .or_else(|| status.signal().map(|s| 128 + s))
                    .unwrap_or(255);
                Ok(ExecOutput {
                    exit_code,
                    stdout,
                    stderr,
                })
            }
            Err(_) => {
                // The helper leads a process group holding the command and its children.
                if let Some(pgid) = pgid.and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::killpg(Pid::from_raw(pgid), Signal::SIGKILL);
                }
                let _ = child.kill().await;
                Err(RuntimeError::ExecTimeout(timeout))
            }
        }
    }

    /// Starts `argv` in container `name` with its streams handed back ([`ExecSession`]).
    async fn exec_stream(
        self: &Arc<Self>,
        sb: &Sandbox,
        name: &str,
        argv: &[String],
        opts: ExecOptions,
    ) -> Result<ExecSession, RuntimeError> {
        let qualified = format!("{}/{name}", sb.uid);
        let mut cmd = self.exec_command(sb, name, argv, opts.tty).await?;
        let sys_err = |op: &str| {
            let op = format!("{op} for exec in {qualified}");
            move |source: std::io::Error| RuntimeError::Sys { op, source }
        };
        let mut pty = None;
        if opts.tty {
            let (master, slave) = crate::exec::open_pty().map_err(sys_err("opening a terminal"))?;
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(sys_err("duplicating the terminal"));
            let (a, b) = (dup(&slave)?, dup(&slave)?);
            cmd.stdin(if opts.stdin {
                Stdio::from(slave)
            } else {
                Stdio::null()
            })
            .stdout(Stdio::from(a))
            .stderr(Stdio::from(b));
            pty = Some(master);
        } else {
            cmd.stdin(if opts.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        }
        sys::new_session_on_spawn(&mut cmd);
        let mut child = cmd
            .spawn()
            .map_err(io_err("spawning the exec helper", &self.cfg.shim_path))?;
        // The command holds the terminal's slave now; ours must close, or the terminal
        // never hangs up.
        drop(cmd);
        let sid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| RuntimeError::Shim {
                container: qualified.clone(),
                message: "the exec helper exited at once".into(),
            })?;
        let session = SessionGuard::new(sid);
        let (stdin, stdout, stderr, terminal): (
            Option<ExecWriter>,
            ExecReader,
            Option<ExecReader>,
            _,
        ) = match pty {
            Some(master) => (
                opts.stdin.then(|| Box::pin(master.clone()) as ExecWriter),
                Box::pin(master.clone()),
                None,
                Some(master.terminal()),
            ),
            None => {
                let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
                    return Err(RuntimeError::Shim {
                        container: qualified,
                        message: "the exec helper's output pipes are missing".into(),
                    });
                };
                (
                    child.stdin.take().map(|w| Box::pin(w) as ExecWriter),
                    Box::pin(out),
                    Some(Box::pin(err) as ExecReader),
                    None,
                )
            }
        };
        let exit = Box::pin(async move {
            let status = child.wait().await.map_err(|source| RuntimeError::Sys {
                op: format!("waiting for exec in {qualified}"),
                source,
            })?;
            use std::os::unix::process::ExitStatusExt;
            Ok(status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(255))
        });
        Ok(ExecSession {
            stdin,
            stdout,
            stderr,
            terminal,
            exit,
            session,
        })
    }
}

#[async_trait]
impl Runtime for NativeRuntime {
    async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        validate_sandbox(spec)?;
        let pod = self.inner.pod_lock(&spec.uid);
        let _guard = pod.write().await;
        let inner = self.inner.clone();
        let spec = spec.clone();
        blocking(move || inner.create_sandbox_sync(&spec)).await
    }

    async fn start_container(
        &self,
        sandbox: &Sandbox,
        spec: &ContainerSpec,
    ) -> Result<ContainerState, RuntimeError> {
        validate_container(spec)?;
        let pod = self.inner.pod_lock(&sandbox.uid);
        let _pod_guard = pod.read().await;
        let ctr = self.inner.container_lock(&sandbox.uid, &spec.name);
        let _ctr_guard = ctr.lock().await;
        let sb = self.inner.load_sandbox(&sandbox.uid)?;
        self.inner.start_container(&sb, spec).await
    }

    async fn container_state(
        &self,
        sandbox: &Sandbox,
        name: &str,
    ) -> Result<Option<ContainerState>, RuntimeError> {
        let inner = self.inner.clone();
        let (uid, name) = (sandbox.uid.clone(), name.to_string());
        blocking(move || inner.read_state(&uid, &name)).await
    }

    async fn stop_container(
        &self,
        sandbox: &Sandbox,
        name: &str,
        grace: Duration,
    ) -> Result<(), RuntimeError> {
        if !valid_dns_label(name) {
            return Err(RuntimeError::NotFound(format!(
                "container {}/{name}",
                sandbox.uid
            )));
        }
        let pod = self.inner.pod_lock(&sandbox.uid);
        let _pod_guard = pod.read().await;
        let ctr = self.inner.container_lock(&sandbox.uid, name);
        let _ctr_guard = ctr.lock().await;
        let sb = self.inner.load_sandbox(&sandbox.uid)?;
        self.inner.stop_container(&sb, name, grace).await
    }

    async fn remove_sandbox(&self, sandbox: &Sandbox, grace: Duration) -> Result<(), RuntimeError> {
        let pod = self.inner.pod_lock(&sandbox.uid);
        let _guard = pod.write().await;
        self.inner.remove_sandbox(sandbox, grace).await
    }

    async fn list_sandboxes(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        let inner = self.inner.clone();
        let list = blocking(move || inner.list_sandboxes_sync()).await?;
        // Containers of pods found here are watched (adoption after an agent restart).
        self.inner.adopt_all();
        Ok(list)
    }

    async fn exec(
        &self,
        sandbox: &Sandbox,
        container: &str,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, RuntimeError> {
        let sb = self.inner.load_sandbox(&sandbox.uid)?;
        self.inner.exec(&sb, container, argv, timeout).await
    }

    async fn exec_stream(
        &self,
        sandbox: &Sandbox,
        container: &str,
        argv: &[String],
        opts: ExecOptions,
    ) -> Result<ExecSession, RuntimeError> {
        let sb = self.inner.load_sandbox(&sandbox.uid)?;
        self.inner.exec_stream(&sb, container, argv, opts).await
    }

    async fn attach(
        &self,
        sandbox: &Sandbox,
        container: &str,
        opts: ExecOptions,
    ) -> Result<ExecSession, RuntimeError> {
        if !valid_dns_label(container) {
            return Err(RuntimeError::NotFound(format!(
                "container {}/{container}",
                sandbox.uid
            )));
        }
        let sb = self.inner.load_sandbox(&sandbox.uid)?;
        self.inner.attach(&sb, container, opts).await
    }

    fn exits(&self) -> broadcast::Receiver<(String, String)> {
        self.inner.shared.exits.subscribe()
    }

    fn limit_report(&self, limits: &Limits) -> LimitReport {
        cgroup::limit_report(&self.inner.cfg.cgroup_parent, limits)
    }

    fn log_path(&self, sandbox_uid: &str, container: &str) -> PathBuf {
        self.inner
            .container_dir(sandbox_uid, container)
            .join(state::CONTAINER_LOG_FILE)
    }
}

/// Moves the log `current` and its rotated copies to [`crate::previous_log`]'s names,
/// replacing the run before's; nothing to do for a first run.
fn keep_previous_log(current: &Path) -> Result<(), RuntimeError> {
    if !current.exists() {
        return Ok(());
    }
    let previous = crate::previous_log(current);
    let rotated = |base: &Path, i: usize| {
        let mut p = base.as_os_str().to_owned();
        p.push(format!(".{i}"));
        PathBuf::from(p)
    };
    // Rotated copies are numbered from 1 without gaps; the run before's are removed first.
    let mut i = 1;
    while rotated(&previous, i).exists() {
        let p = rotated(&previous, i);
        fs::remove_file(&p).map_err(io_err("removing", &p))?;
        i += 1;
    }
    let mut i = 1;
    while rotated(current, i).exists() {
        let (from, to) = (rotated(current, i), rotated(&previous, i));
        fs::rename(&from, &to).map_err(io_err("renaming", &from))?;
        i += 1;
    }
    fs::rename(current, &previous).map_err(io_err("renaming", current))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_keeps_the_previous_runs_log_only() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("container.log");
        keep_previous_log(&log).unwrap();
        fs::write(&log, "run 1\n").unwrap();
        fs::write(dir.path().join("container.log.1"), "run 1, older\n").unwrap();
        keep_previous_log(&log).unwrap();
        assert!(!log.exists());
        let prev = dir.path().join("container.previous.log");
        assert_eq!(fs::read_to_string(&prev).unwrap(), "run 1\n");
        assert!(dir.path().join("container.previous.log.1").exists());
        fs::write(&log, "run 2\n").unwrap();
        keep_previous_log(&log).unwrap();
        assert_eq!(fs::read_to_string(&prev).unwrap(), "run 2\n");
        assert!(
            !dir.path().join("container.previous.log.1").exists(),
            "run 1's rotated copy is gone with it"
        );
    }

    #[test]
    fn the_trait_is_object_safe() {
        fn takes(_: &dyn Runtime) {}
        let _ = takes;
    }

    #[test]
    fn netns_names_are_short_and_stable() {
        let n = netns_name("0b7c9f2e-3d4a-4c1b-9e8f-123456789abc");
        assert_eq!(n.len(), "skiff-".len() + 8 + 1 + 8);
        assert_eq!(n, netns_name("0b7c9f2e-3d4a-4c1b-9e8f-123456789abc"));
        assert_ne!(n, netns_name("0b7c9f2e-3d4a-4c1b-9e8f-123456789abd"));
    }

    #[test]
    fn validates_container_specs() {
        let spec = ContainerSpec {
            name: "web".into(),
            image: Image::RootFs("/definitely/not/here".into()),
            argv: vec!["sh".into()],
            env: vec![],
            working_dir: None,
            limits: Limits::default(),
            mounts: vec![],
            security: Default::default(),
            stdio: Default::default(),
            target: None,
        };
        let err = validate_container(&spec).unwrap_err().to_string();
        assert!(
            err.contains(
                "containers[web].image: root directory /definitely/not/here does not exist"
            ),
            "{err}"
        );
        let bad_name = ContainerSpec {
            name: "Web_1".into(),
            image: Image::Host,
            ..spec.clone()
        };
        assert!(validate_container(&bad_name).is_err());
        let relative_wd = ContainerSpec {
            image: Image::Host,
            working_dir: Some("tmp".into()),
            ..spec
        };
        assert!(
            validate_container(&relative_wd)
                .unwrap_err()
                .to_string()
                .contains("workingDir")
        );
        assert!(valid_uid("0b7c9f2e-3d4a"));
        assert!(!valid_uid("../x"));
        assert!(!valid_uid(""));
    }
}
