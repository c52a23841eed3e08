//! The pod runtime: what the agent needs to run a pod's containers, behind the narrow
//! [`Runtime`] trait, and [`NativeRuntime`], which runs them as plain processes in cgroup v2
//! groups and Linux namespaces (a kubelet without container images).
//!
//! Model (the pause-container model without a pause process):
//!
//! * A **sandbox** is a cgroup v2 directory `<cgroup_parent>/pod-<uid>` plus persistent
//!   network, UTS (hostname = pod hostname) and IPC namespaces, kept alive by bind mounts
//!   (`/run/netns/skiff-<short uid>` for the network namespace, so `ip netns list` shows it;
//!   the others under the state directory). All containers of a pod join them.
//! * Every **container** runs in its own leaf cgroup `<pod cgroup>/<container name>`; the pod
//!   cgroup itself holds no processes. eBPF accounting keys on the cgroup id of the socket's
//!   cgroup, so [`ContainerState::Running::cgroup_id`] is the id to account a container's
//!   traffic to, and [`Sandbox::cgroup_id`] is their common ancestor (attach point, and the
//!   id `bpf_skb_ancestor_cgroup_id` yields for the pod level).
//! * Containers are started through a **shim** (`skiff-node shim …`, see [`shim`]) that
//!   stays outside the pod cgroup, survives the agent, copies the container's output into a
//!   rotated log file and records the exit status in the state directory.
//! * State lives on disk (see [`NativeRuntime`] for the layout), so a restarted agent adopts
//!   running pods without restarting anything.
//!
//! Limits are applied only where the cgroup v2 tree offers the controller; the rest are
//! reported as not enforced ([`Runtime::limit_report`]).
//!
//! [`volume`] holds the filesystem code of pod volumes that containers must not turn against
//! the node: the AtomicWriter of secret, configMap, projected and downwardAPI volumes, and
//! the no-follow subPath walk whose descriptor the shim mounts from.
//!
//! A sandbox with `share_pid_namespace` starts `skiff-node shim --pause` in the pod's leaf
//! cgroup `pid_ns`: it unshares a PID namespace and forks its PID 1, which reaps orphans and
//! exits on SIGTERM; containers are forked into it and the pod's teardown stops it with the
//! rest of the cgroup. Containers are confined by the shim ([`Security`]:
//! `Security::default()` confines nothing, a `host` container; [`Security::restricted`] is
//! containerd's unprivileged default, with the RuntimeDefault seccomp filter refusing with
//! EPERM what Docker's and containerd's default profiles refuse).
//!
//! A container's standard streams stay with its shim: [`Runtime::attach`] reaches them through
//! the shim's socket ([`attach`]) for any number of clients at once, on a pipe or on a
//! terminal the shim holds (`stdin`, `stdinOnce`, `tty`: [`StdioSpec`]), and
//! [`ContainerSpec::target`] starts a container in another one's PID namespace (an ephemeral
//! container's `targetContainerName`). Exec and attach hand the caller the same
//! [`exec::ExecSession`].
//!
//! [`host`] finds the cgroup v2 mount and reports missing controllers (`skiff-node
//! check-host`); [`mountinfo`] is the one parser of the mount table; [`remove_cgroup_tree`] is
//! the one way a cgroup tree is removed (runtime, purge, tests, benchmarks). The shim also
//! ships as the `skiff-shim` binary. Feature `fake`: `fake::FakeRuntime`, an in-memory
//! [`Runtime`] recording its calls in a shared journal.
//!
//! The runtime knows nothing of the API's types, loads no BPF and configures no network beyond
//! creating the pod's namespace with its loopback up.

pub mod attach;
mod cgroup;
mod confine;
pub mod exec;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod host;
mod log;
pub mod mountinfo;
mod native;
mod ns;
pub mod shim;
mod state;
mod sys;
pub mod volume;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

pub use cgroup::remove_tree as remove_cgroup_tree;
pub use confine::{all_capabilities, capability_names, seccomp};
pub use native::{NativeConfig, NativeRuntime};

/// What a container runs from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Image {
    /// A host command, in the host's root filesystem.
    Host,
    /// An absolute directory that becomes the container's root filesystem (pivot_root).
    RootFs(PathBuf),
}

impl Image {
    /// Parses the image field of a pod spec: `host`, or an absolute directory.
    pub fn parse(image: &str) -> Result<Image, RuntimeError> {
        if image == "host" {
            Ok(Image::Host)
        } else if image.starts_with('/') {
            Ok(Image::RootFs(PathBuf::from(image)))
        } else {
            Err(RuntimeError::InvalidSpec(format!(
                "image {image:?}: expected \"host\" or an absolute root directory"
            )))
        }
    }
}

/// Where the log file `current` of a container's run goes when the container starts again
/// (`container.log` → `container.previous.log`).
pub fn previous_log(current: &std::path::Path) -> PathBuf {
    current.with_extension("previous.log")
}

/// Resource limits of a pod or a container. `None` = unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU in millicores (1000 = one core), enforced through `cpu.max`.
    pub cpu_millis: Option<u64>,
    /// `memory.max`.
    pub memory_bytes: Option<u64>,
    /// `pids.max`.
    pub pids: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Pod uid; names the cgroup, the network namespace and the state directory.
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The hostname set in the pod's UTS namespace (usually the pod name).
    pub hostname: String,
    /// Give every container its own PID namespace (the container's process is PID 1).
    pub pid_namespace: bool,
    /// One PID namespace for all the pod's containers (`shareProcessNamespace`): held by a
    /// small process of the pod that is its PID 1; overrides `pid_namespace`.
    #[serde(default)]
    pub share_pid_namespace: bool,
    /// Give every container its own (private) mount namespace. Containers with a root
    /// filesystem image always get one.
    pub mount_namespace: bool,
    /// Pod-level limits, on the pod cgroup.
    pub limits: Limits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// A DNS-1123 label; names the container's leaf cgroup and state directory.
    pub name: String,
    pub image: Image,
    /// Command and arguments, resolved (argv[0] is looked up in the container's `PATH`).
    pub argv: Vec<String>,
    /// Environment. `PATH` and `HOSTNAME` get defaults when missing.
    pub env: Vec<(String, String)>,
    /// Absolute working directory inside the container (default `/`).
    pub working_dir: Option<PathBuf>,
    /// Container-level limits, on the container's leaf cgroup.
    pub limits: Limits,
    /// Bind mounts into a root filesystem (volumes, the generated /etc files), in order.
    /// Only for [`Image::RootFs`] containers.
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// How the process is confined. The default confines nothing (a node command).
    #[serde(default)]
    pub security: Security,
    /// The container's standard input and terminal ([`attach`]).
    #[serde(default)]
    pub stdio: StdioSpec,
    /// Run in the PID namespace of this running container of the same pod, with a `/proc`
    /// that shows it (an ephemeral container's `targetContainerName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// A container's `stdin`, `stdinOnce` and `tty`: what [`Runtime::attach`] clients get.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StdioSpec {
    /// A standard input held open by the shim (else `/dev/null`), which attach clients write.
    pub stdin: bool,
    /// Close that input when the first attach client that wrote it disconnects.
    pub stdin_once: bool,
    /// Run on a pseudo-terminal (stdin, stdout and stderr), its master held by the shim.
    pub tty: bool,
}

/// A bind mount of a node path into a container's root filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// A directory or a file of the node.
    pub source: PathBuf,
    /// Absolute path inside the container; created (as a directory or an empty file, like
    /// the source) when missing.
    pub destination: PathBuf,
    pub read_only: bool,
    /// Mount this path beneath `source` instead (a volumeMount's subPath): walked from
    /// `source` without following a symlink right before the mount, and mounted from the
    /// descriptor the walk ends on ([`volume::subpath`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<volume::SubPath>,
}

/// A seccomp profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Seccomp {
    #[default]
    Unconfined,
    /// The runtime's default profile: the syscalls containerd's and Docker's default
    /// profiles refuse to unprivileged containers fail with `EPERM` (see [`seccomp`]).
    RuntimeDefault,
}

/// The confinement of a container's processes (its main process and every exec), the parts
/// of an OCI runtime spec Kubernetes' securityContext controls. [`Security::default`] is
/// no confinement at all: root with every capability, nothing masked, what a `host`
/// container has always had; [`Security::restricted`] is containerd's default for an
/// unprivileged container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Security {
    /// The user to run as; `None` keeps the runtime's (root).
    pub uid: Option<u32>,
    /// The primary group; `None` keeps the runtime's.
    pub gid: Option<u32>,
    /// Supplementary groups (set only when `uid` or `gid` is).
    #[serde(default)]
    pub groups: Vec<u32>,
    /// Exactly these capabilities (`CAP_CHOWN`, ...) in the bounding, permitted and effective
    /// sets (a non-root user loses them at `execve`, as in Kubernetes); `None` keeps all.
    pub capabilities: Option<Vec<String>>,
    /// `no_new_privs`: setuid binaries and file capabilities grant nothing
    /// (`allowPrivilegeEscalation: false`).
    #[serde(default)]
    pub no_new_privs: bool,
    /// The root filesystem is mounted read-only (`readOnlyRootFilesystem`).
    #[serde(default)]
    pub read_only_root: bool,
    /// Masks the kernel's sensitive /proc and /sys files and makes /proc/sys & co.
    /// read-only (root filesystem containers only).
    #[serde(default)]
    pub mask_paths: bool,
    /// Mounts /sys read-only (root filesystem containers only).
    #[serde(default)]
    pub read_only_sys: bool,
    #[serde(default)]
    pub seccomp: Seccomp,
    /// A PID namespace of the container's own (the process is PID 1 and sees only its
    /// descendants), whatever the sandbox says.
    #[serde(default)]
    pub pid_namespace: bool,
}

impl Security {
    /// containerd's default capability set for an unprivileged container.
    pub const DEFAULT_CAPABILITIES: [&'static str; 14] = [
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FSETID",
        "CAP_FOWNER",
        "CAP_MKNOD",
        "CAP_NET_RAW",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETFCAP",
        "CAP_SETPCAP",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",
        "CAP_KILL",
        "CAP_AUDIT_WRITE",
    ];

    /// containerd's default for an unprivileged container: root, the default capabilities,
    /// masked and read-only kernel paths, read-only /sys, its own PID namespace, no seccomp
    /// (Kubernetes' default profile is Unconfined).
    pub fn restricted() -> Security {
        Security {
            capabilities: Some(
                Self::DEFAULT_CAPABILITIES
                    .iter()
                    .map(|c| c.to_string())
                    .collect(),
            ),
            mask_paths: true,
            read_only_sys: true,
            pid_namespace: true,
            ..Security::default()
        }
    }
}

/// A pod sandbox as created (and persisted) by a runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sandbox {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub hostname: String,
    /// The pod cgroup (holds no processes itself; containers have leaf cgroups below it).
    pub cgroup_dir: PathBuf,
    /// Id of the pod cgroup (the inode number of its directory, as BPF sees it).
    pub cgroup_id: u64,
    /// Bind mount of the pod's network namespace (`/run/netns/skiff-…`).
    pub netns_path: PathBuf,
    /// Bind mount of the pod's UTS namespace.
    pub uts_path: PathBuf,
    /// Bind mount of the pod's IPC namespace.
    pub ipc_path: PathBuf,
    pub pid_namespace: bool,
    pub mount_namespace: bool,
    pub limits: Limits,
    pub created_at: SystemTime,
    /// The process holding the pod's shared PID namespace (`share_pid_namespace`).
    #[serde(default)]
    pub pid_holder: Option<PidHolder>,
}

/// The PID 1 of a pod's shared PID namespace: its host pid and start time (so a reused pid
/// is never mistaken for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidHolder {
    pub pid: u32,
    pub start_time: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    Running {
        /// Host pid of the container's main process.
        pid: u32,
        started_at: SystemTime,
        /// Id of the cgroup the container's processes live in (its leaf cgroup).
        cgroup_id: u64,
    },
    Exited {
        /// The exit code; `128 + signal` when killed by a signal; 127/126 when the command
        /// could not be started.
        exit_code: i32,
        signal: Option<i32>,
        started_at: SystemTime,
        finished_at: SystemTime,
        /// `Completed`, `Error`, `OOMKilled`, `StartError` or `Unknown`.
        reason: String,
        /// Human-readable detail, e.g. `exec "nosuchcmd": No such file or directory`.
        message: String,
    },
}

impl ContainerState {
    pub fn is_running(&self) -> bool {
        matches!(self, ContainerState::Running { .. })
    }

    /// The pid of a running container.
    pub fn pid(&self) -> Option<u32> {
        match self {
            ContainerState::Running { pid, .. } => Some(*pid),
            ContainerState::Exited { .. } => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit code of the command; `128 + signal` when killed by a signal.
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Which of the requested limits this host enforces, one entry per limit kind, e.g.
/// `memory: controller missing from cgroup v2 (…)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitReport {
    pub enforced: Vec<String>,
    pub not_enforced: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The spec cannot be run, e.g. `containers[web].image: root directory /x does not exist`.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    #[error("invalid runtime configuration: {0}")]
    InvalidConfig(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("container {0} is already running")]
    AlreadyRunning(String),
    #[error("container {0} is not running")]
    NotRunning(String),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}: {source}")]
    Sys {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("state file {path}: {message}")]
    State { path: PathBuf, message: String },
    #[error("shim for {container}: {message}")]
    Shim { container: String, message: String },
    #[error("exec timed out after {0:?}")]
    ExecTimeout(Duration),
    #[error("this runtime does not support {0}")]
    Unsupported(&'static str),
    #[error("the native runtime must be created inside a Tokio runtime")]
    NoTokioRuntime,
    #[error(transparent)]
    Host(#[from] crate::host::HostError),
}

/// The pod runtime the agent drives. Implementations: [`NativeRuntime`] (processes in
/// namespaces and cgroups); an OCI runtime (crun) can be another.
#[async_trait]
pub trait Runtime: Send + Sync {
    /// Creates the pod's cgroup and namespaces. Idempotent: returns the existing sandbox.
    async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError>;
    /// Starts a container (again, if an earlier run of it has exited) and returns its state:
    /// `Running`, or `Exited` with reason `StartError` when the command could not be run.
    async fn start_container(
        &self,
        sandbox: &Sandbox,
        spec: &ContainerSpec,
    ) -> Result<ContainerState, RuntimeError>;
    /// `None` when the container was never started in this sandbox.
    async fn container_state(
        &self,
        sandbox: &Sandbox,
        name: &str,
    ) -> Result<Option<ContainerState>, RuntimeError>;
    /// SIGTERM to the container's processes, wait up to `grace`, then kill them all.
    async fn stop_container(
        &self,
        sandbox: &Sandbox,
        name: &str,
        grace: Duration,
    ) -> Result<(), RuntimeError>;
    /// Stops every container (SIGTERM, `grace`, kill), then removes the cgroups, the
    /// namespaces and the state. Idempotent.
    async fn remove_sandbox(&self, sandbox: &Sandbox, grace: Duration) -> Result<(), RuntimeError>;
    /// The sandboxes on this node, from the state directory (adoption after a restart).
    async fn list_sandboxes(&self) -> Result<Vec<Sandbox>, RuntimeError>;
    /// Runs `argv` inside a running container (its namespaces, cgroup, environment and
    /// working directory), killing it after `timeout` ([`RuntimeError::ExecTimeout`]).
    async fn exec(
        &self,
        sandbox: &Sandbox,
        container: &str,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, RuntimeError>;
    /// Starts `argv` inside a running container with its standard streams (and a terminal,
    /// when asked) handed to the caller; dropping the session kills what is left of it.
    /// A runtime that cannot stream answers [`RuntimeError::Unsupported`].
    async fn exec_stream(
        &self,
        _sandbox: &Sandbox,
        _container: &str,
        _argv: &[String],
        _opts: exec::ExecOptions,
    ) -> Result<exec::ExecSession, RuntimeError> {
        Err(RuntimeError::Unsupported("streaming exec"))
    }
    /// Attaches to a running container's main process ([`attach`]): its output, its input
    /// when `opts.stdin` and the container has one, its terminal when it was started with one
    /// (`opts.tty` is the container's, not the caller's). Dropping the session detaches;
    /// the container keeps running.
    async fn attach(
        &self,
        _sandbox: &Sandbox,
        _container: &str,
        _opts: exec::ExecOptions,
    ) -> Result<exec::ExecSession, RuntimeError> {
        Err(RuntimeError::Unsupported("attach"))
    }
    /// `(pod uid, container name)` whenever a container's main process exits, for adopted
    /// containers too. Subscribe before starting what you want to hear about.
    fn exits(&self) -> broadcast::Receiver<(String, String)>;
    /// Which of `limits` this host can enforce.
    fn limit_report(&self, limits: &Limits) -> LimitReport;
    /// The container's log file (rotated copies get `.1`, `.2`, … appended).
    fn log_path(&self, sandbox_uid: &str, container: &str) -> PathBuf;
    /// The log file of the container's previous run: when a container starts again, its log
    /// (with its rotated copies) moves here, replacing the run before.
    fn previous_log_path(&self, sandbox_uid: &str, container: &str) -> PathBuf {
        previous_log(&self.log_path(sandbox_uid, container))
    }
}
