//! An in-memory [`Runtime`] for tests that run without root (the model: youki's `Syscall`
//! trait and its test double). Sandboxes and containers exist only in maps; a test makes a
//! container exit ([`FakeRuntime::exit`]), chooses what exec probes return
//! ([`FakeRuntime::set_exec`]) or makes starts fail ([`FakeRuntime::fail_start`]), and reads
//! the ordered journal of calls (shared with the other fakes when given) to check what the
//! agent did and in which order.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::broadcast;

use crate::{
    ContainerSpec, ContainerState, ExecOutput, LimitReport, Limits, Runtime, RuntimeError, Sandbox,
    SandboxSpec,
};

/// A shared, ordered record of calls made on several fakes.
pub type Journal = Arc<Mutex<Vec<String>>>;

#[derive(Debug, Default)]
struct State {
    sandboxes: BTreeMap<String, Sandbox>,
    /// (pod uid, container) → state.
    containers: BTreeMap<(String, String), ContainerState>,
    /// (pod uid, container) → how many times it was started.
    starts: BTreeMap<(String, String), u32>,
    /// container name → exit code its exec probes get (default 0).
    exec_codes: BTreeMap<String, i32>,
    /// container name → error its starts get.
    start_errors: BTreeMap<String, String>,
    next_pid: u32,
}

/// The in-memory runtime.
#[derive(Debug)]
pub struct FakeRuntime {
    state: Mutex<State>,
    exits: broadcast::Sender<(String, String)>,
    journal: Option<Journal>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        FakeRuntime {
            state: Mutex::new(State {
                next_pid: 1000,
                ..State::default()
            }),
            exits: broadcast::channel(1024).0,
            journal: None,
        }
    }
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    /// Also appends `runtime: <call>` lines to `journal`.
    pub fn with_journal(mut self, journal: Journal) -> Self {
        self.journal = Some(journal);
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn note(&self, line: String) {
        if let Some(j) = &self.journal {
            j.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }

    /// Makes the running container `name` of pod `uid` exit with `code` now, and notifies
    /// [`Runtime::exits`] subscribers.
    pub fn exit(&self, uid: &str, name: &str, code: i32) {
        let key = (uid.to_string(), name.to_string());
        {
            let mut st = self.lock();
            let Some(ContainerState::Running { started_at, .. }) = st.containers.get(&key).cloned()
            else {
                return;
            };
            st.containers.insert(key, exited(code, None, started_at));
        }
        self.note(format!("runtime: exit {uid}/{name} {code}"));
        let _ = self.exits.send((uid.to_string(), name.to_string()));
    }

    /// Exec commands in containers named `name` exit with `code` from now on.
    pub fn set_exec(&self, name: &str, code: i32) {
        self.lock().exec_codes.insert(name.to_string(), code);
    }

    /// Starting containers named `name` fails with `message` (`None`: starts work again).
    pub fn fail_start(&self, name: &str, message: Option<&str>) {
        let mut st = self.lock();
        match message {
            Some(m) => st.start_errors.insert(name.to_string(), m.to_string()),
            None => st.start_errors.remove(name),
        };
    }

    /// How many times container `name` of pod `uid` was started.
    pub fn starts(&self, uid: &str, name: &str) -> u32 {
        self.lock()
            .starts
            .get(&(uid.to_string(), name.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Whether pod `uid` has a sandbox.
    pub fn has_sandbox(&self, uid: &str) -> bool {
        self.lock().sandboxes.contains_key(uid)
    }
}

fn exited(code: i32, signal: Option<i32>, started_at: SystemTime) -> ContainerState {
    ContainerState::Exited {
        exit_code: code,
        signal,
        started_at,
        finished_at: SystemTime::now(),
        reason: if code == 0 { "Completed" } else { "Error" }.into(),
        message: String::new(),
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        let mut st = self.lock();
        if let Some(sb) = st.sandboxes.get(&spec.uid) {
            return Ok(sb.clone());
        }
        let fake = PathBuf::from("/nonexistent/skiff-fake").join(&spec.uid);
        let sb = Sandbox {
            uid: spec.uid.clone(),
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            hostname: spec.hostname.clone(),
            cgroup_dir: fake.join("cgroup"),
            cgroup_id: u64::from(st.next_pid),
            netns_path: fake.join("netns"),
            uts_path: fake.join("uts"),
            ipc_path: fake.join("ipc"),
            pid_namespace: spec.pid_namespace,
            mount_namespace: spec.mount_namespace,
            limits: spec.limits.clone(),
            created_at: SystemTime::now(),
            pid_holder: None,
        };
        st.next_pid += 1;
        st.sandboxes.insert(spec.uid.clone(), sb.clone());
        drop(st);
        self.note(format!("runtime: create sandbox {}", spec.uid));
        Ok(sb)
    }

    async fn start_container(
        &self,
        sandbox: &Sandbox,
        spec: &ContainerSpec,
    ) -> Result<ContainerState, RuntimeError> {
        let key = (sandbox.uid.clone(), spec.name.clone());
        let mut st = self.lock();
        if !st.sandboxes.contains_key(&sandbox.uid) {
            return Err(RuntimeError::NotFound(format!("sandbox {}", sandbox.uid)));
        }
        if let Some(msg) = st.start_errors.get(&spec.name).cloned() {
            drop(st);
            self.note(format!(
                "runtime: start {}/{} failed",
                sandbox.uid, spec.name
            ));
            return Err(RuntimeError::InvalidSpec(msg));
        }
        if st
            .containers
            .get(&key)
            .is_some_and(ContainerState::is_running)
        {
            return Err(RuntimeError::AlreadyRunning(spec.name.clone()));
        }
        let pid = st.next_pid;
        st.next_pid += 1;
        let state = ContainerState::Running {
            pid,
            started_at: SystemTime::now(),
            cgroup_id: u64::from(pid),
        };
        st.containers.insert(key.clone(), state.clone());
        *st.starts.entry(key).or_default() += 1;
        drop(st);
        self.note(format!("runtime: start {}/{}", sandbox.uid, spec.name));
        Ok(state)
    }

    async fn container_state(
        &self,
        sandbox: &Sandbox,
        name: &str,
    ) -> Result<Option<ContainerState>, RuntimeError> {
        Ok(self
            .lock()
            .containers
            .get(&(sandbox.uid.clone(), name.to_string()))
            .cloned())
    }

    async fn stop_container(
        &self,
        sandbox: &Sandbox,
        name: &str,
        _grace: Duration,
    ) -> Result<(), RuntimeError> {
        let key = (sandbox.uid.clone(), name.to_string());
        let stopped = {
            let mut st = self.lock();
            match st.containers.get(&key).cloned() {
                Some(ContainerState::Running { started_at, .. }) => {
                    st.containers.insert(key, exited(143, Some(15), started_at));
                    true
                }
                _ => false,
            }
        };
        self.note(format!("runtime: stop {}/{name}", sandbox.uid));
        if stopped {
            let _ = self.exits.send((sandbox.uid.clone(), name.to_string()));
        }
        Ok(())
    }

    async fn remove_sandbox(
        &self,
        sandbox: &Sandbox,
        _grace: Duration,
    ) -> Result<(), RuntimeError> {
        {
            let mut st = self.lock();
            st.containers.retain(|(uid, _), _| *uid != sandbox.uid);
            st.sandboxes.remove(&sandbox.uid);
        }
        self.note(format!("runtime: remove sandbox {}", sandbox.uid));
        Ok(())
    }

    async fn list_sandboxes(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        Ok(self.lock().sandboxes.values().cloned().collect())
    }

    async fn exec(
        &self,
        sandbox: &Sandbox,
        container: &str,
        argv: &[String],
        _timeout: Duration,
    ) -> Result<ExecOutput, RuntimeError> {
        let st = self.lock();
        let key = (sandbox.uid.clone(), container.to_string());
        if !st
            .containers
            .get(&key)
            .is_some_and(ContainerState::is_running)
        {
            return Err(RuntimeError::NotRunning(container.to_string()));
        }
        let code = st.exec_codes.get(container).copied().unwrap_or(0);
        Ok(ExecOutput {
            exit_code: code,
            stdout: Vec::new(),
            stderr: format!("{} exited with {code}", argv.join(" ")).into_bytes(),
        })
    }

    fn exits(&self) -> broadcast::Receiver<(String, String)> {
        self.exits.subscribe()
    }

    fn limit_report(&self, limits: &Limits) -> LimitReport {
        let mut enforced = Vec::new();
        for (set, what) in [
            (limits.cpu_millis.is_some(), "cpu"),
            (limits.memory_bytes.is_some(), "memory"),
            (limits.pids.is_some(), "pids"),
        ] {
            if set {
                enforced.push(what.to_string());
            }
        }
        LimitReport {
            enforced,
            not_enforced: Vec::new(),
        }
    }

    fn log_path(&self, sandbox_uid: &str, container: &str) -> PathBuf {
        PathBuf::from("/nonexistent/skiff-fake")
            .join(sandbox_uid)
            .join(format!("{container}.log"))
    }
}
