//! The container shim: `skiff-node shim [OPTIONS] -- ARGV…`.
//!
//! **Container mode** (`--state DIR`). The agent spawns one shim per container, detached in
//! a session of its own, with the container's environment as the shim's environment. The
//! shim moves itself into `--shim-cgroup` (outside the pod cgroup, so killing the pod's
//! processes cannot kill it before it has recorded the exit), then forks the container
//! process, which before `execve`:
//!
//! 1. joins the container cgroup (`--cgroup`, writes `0` to `cgroup.procs`);
//! 2. `setns`es into the pod's network, UTS and IPC namespaces (`--netns/--uts/--ipc`);
//!    a PID namespace (`--new-pidns`) was unshared by the shim just before the fork, so the
//!    container process is PID 1 in it;
//! 3. with `--rootfs` or `--new-mountns`: unshares a private mount namespace; with a root
//!    filesystem it `pivot_root`s into it and mounts what the container sees there (`proc`,
//!    a minimal `/dev`, `sysfs`, the spec's bind mounts, masked paths: see [`confine`]);
//! 4. takes the identity and privileges of the spec's [`Security`] (`--spec`, the
//!    container's `spec.json`): groups, user, capabilities, `no_new_privs`, seccomp;
//! 5. `chdir`s to `--workdir` (default `/`; created in a root filesystem when missing) and
//!    execs `ARGV` (`argv[0]` looked up in `PATH`).
//!
//! A failure in any step travels back over a close-on-exec pipe; the shim then records an
//! exit with code 127 (command not found) or 126 (anything else) and reason `StartError`.
//!
//! The shim reports on its stdout, exactly once, `started <pid>` or `failed`, then points its
//! stdout at `/dev/null`; `<state>/pids.json` holds both pids (and their start times) from
//! then on. It copies the container's stdout and stderr (pipes) into `--log` as
//! `<RFC 3339 UTC ms> <stdout|stderr> <line>`, rotating at `--log-max-bytes` and keeping
//! `--log-max-files` files in total. When the container's main process exits (seen through a
//! pidfd, so a daemonised grandchild holding the pipes cannot delay it) the shim drains what
//! is buffered, writes `<state>/exit.json` atomically and exits.
//!
//! The container's stdin is `/dev/null`, or with `--stdin` a pipe whose writing end the shim
//! keeps open; with `--tty` stdin, stdout and stderr are one pseudo-terminal's slave (the
//! container leads a session of its own with it as controlling terminal) and the shim holds
//! the master, logging what it reads as stdout. Meanwhile the shim serves attach clients on
//! `<state>/attach.sock` ([`crate::attach`]): output fanned out as it is logged,
//! their input to the container's stdin (`--stdin-once`: closed when the first writer
//! leaves), their resizes to the terminal.
//!
//! **Exec mode** (`--join-pid PID`, no `--state`): a one-shot helper for exec probes. It
//! joins `--cgroup`, then all namespaces of the container process `PID` (one `setns` on a
//! pidfd, which also makes the container's root its root), forks, takes the container's
//! identity and privileges (`--spec`), and runs `ARGV` with inherited stdio in `--workdir`;
//! its exit code is the command's (128 + signal if killed).
//!
//! [`confine`]: super::confine

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag};
use nix::mount::MsFlags;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sched::CloneFlags;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

use super::attach;
use super::cgroup;
use super::confine::{self, ConfineError};
use super::log::{LineSplitter, RotatingLog};
use super::state::{self, ExitRecord, PidsRecord};
use super::sys;
use super::{Mount, Security};

/// `PATH` when the container's environment has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Exit code when the command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit code when the container could not be set up or the command not executed.
pub const EXIT_CANNOT_RUN: i32 = 126;

/// Arguments of `skiff-node shim`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ShimArgs {
    /// Container state directory (`pids.json`, `exit.json`); selects container mode.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// The cgroup the container's (or exec'd) process joins.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// The cgroup the shim itself moves into (outside the pod cgroup).
    #[arg(long)]
    pub shim_cgroup: Option<PathBuf>,
    /// Network namespace file to join.
    #[arg(long)]
    pub netns: Option<PathBuf>,
    /// UTS namespace file to join.
    #[arg(long)]
    pub uts: Option<PathBuf>,
    /// IPC namespace file to join.
    #[arg(long)]
    pub ipc: Option<PathBuf>,
    /// Run the container in a new PID namespace.
    #[arg(long)]
    pub new_pidns: bool,
    /// Run the container in this (the pod's shared) PID namespace: `/proc/<holder>/ns/pid`.
    #[arg(long)]
    pub pidns: Option<PathBuf>,
    /// Pause mode: become the PID 1 of a new PID namespace (a pod's shared one) and reap
    /// orphans until SIGTERM; reports `started <host pid>`.
    #[arg(long)]
    pub pause: bool,
    /// Run the container in a new private mount namespace.
    #[arg(long)]
    pub new_mountns: bool,
    /// Root filesystem directory to pivot_root into.
    #[arg(long)]
    pub rootfs: Option<PathBuf>,
    /// Working directory (inside the container), default `/`.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// The container's `spec.json`: its bind mounts and [`Security`].
    #[arg(long)]
    pub spec: Option<PathBuf>,
    /// Log file for the container's stdout and stderr.
    #[arg(long)]
    pub log: Option<PathBuf>,
    #[arg(long, default_value_t = 10 * 1024 * 1024)]
    pub log_max_bytes: u64,
    #[arg(long, default_value_t = 5)]
    pub log_max_files: usize,
    /// Exec mode: join the namespaces of this (container) process.
    #[arg(long)]
    pub join_pid: Option<u32>,
    /// With `--join-pid`: the process's start time, to refuse a reused pid.
    #[arg(long)]
    pub join_start_time: Option<u64>,
    /// With `--join-pid`: stdin is a terminal to take as the controlling terminal of this
    /// process's session (the caller made it a session leader) before the command starts.
    /// In container mode: the container runs on a pseudo-terminal whose master the shim
    /// holds (its output is logged as stdout and served to attach clients).
    #[arg(long)]
    pub tty: bool,
    /// Container mode: the container's stdin is a pipe the shim keeps open and attach
    /// clients write (else `/dev/null`).
    #[arg(long)]
    pub stdin: bool,
    /// Container mode, with `--stdin`: the container's stdin closes when the first attach
    /// client that wrote it disconnects.
    #[arg(long)]
    pub stdin_once: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub argv: Vec<OsString>,
}

impl ShimArgs {
    /// The command line (after the binary) that `skiff-node` parses back into `self`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["shim".into()];
        let mut path = |flag: &str, v: &Option<PathBuf>| {
            if let Some(v) = v {
                a.push(flag.into());
                a.push(v.into());
            }
        };
        path("--state", &self.state);
        path("--cgroup", &self.cgroup);
        path("--shim-cgroup", &self.shim_cgroup);
        path("--netns", &self.netns);
        path("--uts", &self.uts);
        path("--ipc", &self.ipc);
        path("--pidns", &self.pidns);
        path("--rootfs", &self.rootfs);
        path("--workdir", &self.workdir);
        path("--spec", &self.spec);
        path("--log", &self.log);
        if self.new_pidns {
            a.push("--new-pidns".into());
        }
        if self.pause {
            a.push("--pause".into());
        }
        if self.new_mountns {
            a.push("--new-mountns".into());
        }
        a.push("--log-max-bytes".into());
        a.push(self.log_max_bytes.to_string().into());
        a.push("--log-max-files".into());
        a.push(self.log_max_files.to_string().into());
        if let Some(pid) = self.join_pid {
            a.push("--join-pid".into());
            a.push(pid.to_string().into());
        }
        if let Some(t) = self.join_start_time {
            a.push("--join-start-time".into());
            a.push(t.to_string().into());
        }
        if self.tty {
            a.push("--tty".into());
        }
        if self.stdin {
            a.push("--stdin".into());
        }
        if self.stdin_once {
            a.push("--stdin-once".into());
        }
        a.push("--".into());
        a.extend(self.argv.iter().cloned());
        a
    }
}

/// Runs the shim; returns the process exit code.
pub fn run(args: ShimArgs) -> i32 {
    if args.pause {
        return pause_mode(&args);
    }
    if args.join_pid.is_some() {
        exec_mode(&args)
    } else {
        container_mode(&args)
    }
}

/// Diagnostics go to the shim's stderr (`shim.log` in the container state directory).
fn diag(msg: impl std::fmt::Display) {
    let ts = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    eprintln!("{ts} shim[{}]: {msg}", std::process::id());
}

/// Why a container could not be started.
#[derive(Debug)]
struct StartFailure {
    code: i32,
    message: String,
}

impl StartFailure {
    fn new(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_CANNOT_RUN,
            message: message.into(),
        }
    }

    fn confine(e: ConfineError) -> Self {
        Self::errno(e.what, e.source)
    }

    fn errno(what: impl std::fmt::Display, e: impl Into<io::Error>) -> Self {
        let e: io::Error = e.into();
        let desc = e
            .raw_os_error()
            .map(|n| Errno::from_raw(n).desc().to_string())
            .unwrap_or_else(|| e.to_string());
        Self::new(format!("{what}: {desc}"))
    }

    /// Wire format over the error pipe: 4 bytes exit code (LE), then the message.
    fn encode(&self) -> Vec<u8> {
        let mut v = self.code.to_le_bytes().to_vec();
        v.extend_from_slice(self.message.as_bytes());
        v
    }

    fn decode(data: &[u8]) -> Self {
        match data.split_first_chunk::<4>() {
            Some((code, msg)) => Self {
                code: i32::from_le_bytes(*code),
                message: String::from_utf8_lossy(msg).into_owned(),
            },
            None => Self::new("container setup failed (truncated report)"),
        }
    }
}

/// A started container process.
struct Started {
    pid: Pid,
    /// Its stdout pipe, or the terminal's master.
    stdout: OwnedFd,
    /// Its stderr pipe; `None` on a terminal.
    stderr: Option<OwnedFd>,
    /// What its input is written to.
    input: attach::Input,
}

fn report_ready(line: &str) {
    let mut out = io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        // The agent went away while we started; the state files tell the next one.
        diag(format_args!("cannot report {line:?} to the agent: {e}"));
    }
}

fn container_mode(args: &ShimArgs) -> i32 {
    let Some(state_dir) = args.state.as_deref() else {
        diag("--state or --join-pid is required");
        return 2;
    };
    // Our stdout is a pipe to the agent, which may die at any time: never die of SIGPIPE.
    for s in [Signal::SIGPIPE, Signal::SIGHUP] {
        if let Err(e) = sys::ignore_signal(s) {
            diag(format_args!("ignoring {s}: {e}"));
        }
    }
    if let Some(sc) = &args.shim_cgroup
        && let Err(e) = cgroup::join_self(sc)
    {
        diag(format_args!("cannot move into {}: {e}", sc.display()));
    }
    let attempt = Utc::now();
    let oom_before = args.cgroup.as_deref().map(oom_kills).unwrap_or(0);
    let mut started = match start(args) {
        Ok(s) => s,
        Err(f) => {
            diag(format_args!("container did not start: {}", f.message));
            let rec = ExitRecord {
                exit_code: f.code,
                signal: None,
                started_at: attempt,
                finished_at: Utc::now(),
                reason: "StartError".into(),
                message: f.message,
            };
            if let Err(e) = state::write_json_atomic(&state_dir.join(state::EXIT_FILE), &rec) {
                diag(format_args!("cannot write exit status: {e}"));
            }
            report_ready("failed");
            return 0;
        }
    };
    let started_at = Utc::now();
    let pid = started.pid.as_raw().unsigned_abs();
    let me = std::process::id();
    let pids = PidsRecord {
        shim_pid: me,
        shim_start_time: state::proc_start_time(me).unwrap_or(0),
        pid,
        pid_start_time: state::proc_start_time(pid).unwrap_or(0),
        started_at,
    };
    if let Err(e) = state::write_json_atomic(&state_dir.join(state::PIDS_FILE), &pids) {
        diag(format_args!("cannot write pids: {e}"));
    }
    // Listening before the start is reported: a running container can be attached to.
    let input = std::mem::replace(&mut started.input, attach::Input::None);
    let attach = attach::Server::bind(state_dir, input, args.stdin, args.stdin_once)
        .map_err(|e| diag(format_args!("serving attach: {e}")))
        .ok();
    report_ready(&format!("started {pid}"));
    detach_stdout();

    let status = supervise(args, started, attach);
    let finished_at = Utc::now();
    let rec = exit_record(status, started_at, finished_at, || {
        args.cgroup.as_deref().map(oom_kills).unwrap_or(0) > oom_before
    });
    diag(format_args!(
        "container {pid} exited: code {} ({})",
        rec.exit_code, rec.reason
    ));
    if let Err(e) = state::write_json_atomic(&state_dir.join(state::EXIT_FILE), &rec) {
        diag(format_args!("cannot write exit status: {e}"));
        return 1;
    }
    0
}

/// Pause mode (see [`ShimArgs::pause`]): a new session, the `--cgroup`, a new PID namespace
/// whose PID 1 is a forked child that reaps orphans; the parent reports the child's pid and
/// exits.
fn pause_mode(args: &ShimArgs) -> i32 {
    let _ = nix::unistd::setsid();
    if let Some(cg) = &args.cgroup
        && let Err(e) = cgroup::join_self(cg)
    {
        diag(format_args!("cannot move into {}: {e}", cg.display()));
        report_ready("failed");
        return 1;
    }
    if let Err(e) = nix::sched::unshare(CloneFlags::CLONE_NEWPID) {
        diag(format_args!("unshare(CLONE_NEWPID): {e}"));
        report_ready("failed");
        return 1;
    }
    let forked = sys::SingleThreaded::check().and_then(|single| sys::fork(&single));
    match forked {
        Ok(ForkResult::Child) => sys::exit_now(pause_loop()),
        Ok(ForkResult::Parent { child }) => {
            report_ready(&format!("started {child}"));
            0
        }
        Err(e) => {
            diag(format_args!("fork: {e}"));
            report_ready("failed");
            1
        }
    }
}

/// PID 1 of a pod's shared PID namespace: reaps every orphan, exits on SIGTERM/SIGINT.
fn pause_loop() -> i32 {
    if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
    }
    let _ = sys::cloexec_from(3);
    let _ = nix::unistd::chdir("/");
    let signals = [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ];
    let mut set = nix::sys::signal::SigSet::empty();
    for s in signals {
        set.add(s);
    }
    if sys::install_noop_handlers(&signals).is_err()
        || nix::sys::signal::sigprocmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, Some(&set), None)
            .is_err()
    {
        return 1;
    }
    loop {
        match set.wait() {
            Ok(Signal::SIGCHLD) => loop {
                match waitpid(
                    Pid::from_raw(-1),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                ) {
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => continue,
                }
            },
            Ok(_) => return 0,
            Err(_) => continue,
        }
    }
}

/// Points stdout (the pipe to the agent) at /dev/null once the start has been reported.
fn detach_stdout() {
    match File::options().write(true).open("/dev/null") {
        Ok(null) => {
            if let Err(e) = nix::unistd::dup2_stdout(&null) {
                diag(format_args!("dup2 /dev/null onto stdout: {e}"));
            }
        }
        Err(e) => diag(format_args!("opening /dev/null: {e}")),
    }
}

/// `oom_kill` from the cgroup's `memory.events` (0 without a memory controller).
fn oom_kills(cgroup: &Path) -> u64 {
    std::fs::read_to_string(cgroup.join("memory.events"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|n| n.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

fn exit_record(
    status: Option<WaitStatus>,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
    oom: impl FnOnce() -> bool,
) -> ExitRecord {
    let (exit_code, signal, reason, message) = match status {
        Some(WaitStatus::Exited(_, 0)) => (0, None, "Completed", String::new()),
        Some(WaitStatus::Exited(_, code)) => (code, None, "Error", format!("exit code {code}")),
        Some(WaitStatus::Signaled(_, sig, _)) => {
            let n = sig as i32;
            let reason = if sig == Signal::SIGKILL && oom() {
                "OOMKilled"
            } else {
                "Error"
            };
            (
                128 + n,
                Some(n),
                reason,
                format!("killed by signal {n} ({sig})"),
            )
        }
        other => (
            255,
            None,
            "Unknown",
            format!("unexpected wait status {other:?}"),
        ),
    };
    ExitRecord {
        exit_code,
        signal,
        started_at,
        finished_at,
        reason: reason.into(),
        message,
    }
}

fn open_ns(what: &str, path: &Option<PathBuf>) -> Result<Option<File>, StartFailure> {
    path.as_ref()
        .map(|p| {
            File::open(p)
                .map_err(|e| StartFailure::errno(format!("opening {what} {}", p.display()), e))
        })
        .transpose()
}

/// The bind mounts and confinement of `--spec` (none without it).
fn confinement(args: &ShimArgs) -> Result<(Vec<Mount>, Security), StartFailure> {
    let Some(path) = &args.spec else {
        return Ok((Vec::new(), Security::default()));
    };
    match state::read_json::<state::ContainerRecord>(path) {
        Ok(Some(rec)) => Ok((rec.spec.mounts, rec.spec.security)),
        Ok(None) => Err(StartFailure::new(format!("{} is missing", path.display()))),
        Err(e) => Err(StartFailure::new(e.to_string())),
    }
}

/// Forks the container process and waits until it has exec'd (or failed to).
fn start(args: &ShimArgs) -> Result<Started, StartFailure> {
    if args.argv.is_empty() {
        return Err(StartFailure::new("empty command"));
    }
    let (mounts, security) = confinement(args)?;
    if !mounts.is_empty() && args.rootfs.is_none() {
        return Err(StartFailure::new(
            "volume mounts need a root filesystem image (not \"host\")",
        ));
    }
    let namespaces = [
        (
            open_ns("netns", &args.netns)?,
            CloneFlags::CLONE_NEWNET,
            "netns",
        ),
        (
            open_ns("uts namespace", &args.uts)?,
            CloneFlags::CLONE_NEWUTS,
            "uts",
        ),
        (
            open_ns("ipc namespace", &args.ipc)?,
            CloneFlags::CLONE_NEWIPC,
            "ipc",
        ),
    ];
    let (child_io, stdout, stderr, input) = container_stdio(args)?;
    let (report_r, report_w) = pipe2_cloexec()?;
    if let Some(pidns) = &args.pidns {
        // The pod's shared PID namespace: the next child is born in it.
        let f = File::open(pidns)
            .map_err(|e| StartFailure::errno(format!("opening {}", pidns.display()), e))?;
        nix::sched::setns(f.as_fd(), CloneFlags::CLONE_NEWPID)
            .map_err(|e| StartFailure::errno("joining the pod's PID namespace", e))?;
    } else if args.new_pidns {
        // The shim is single-threaded; its next child becomes PID 1 of a new namespace.
        nix::sched::unshare(CloneFlags::CLONE_NEWPID)
            .map_err(|e| StartFailure::errno("unshare(CLONE_NEWPID)", e))?;
    }
    let single = sys::SingleThreaded::check().map_err(|e| StartFailure::errno("fork", e))?;
    match sys::fork(&single).map_err(|e| StartFailure::errno("fork", e))? {
        ForkResult::Child => {
            drop((stdout, stderr, input, report_r));
            let failure = container_child(args, &namespaces, (&mounts, &security), child_io);
            // Best effort: the parent treats a short report as a generic failure.
            let _ = nix::unistd::write(&report_w, &failure.encode());
            sys::exit_now(failure.code)
        }
        ForkResult::Parent { child } => {
            drop((child_io, report_w));
            let mut report = Vec::new();
            let read = File::from(report_r).read_to_end(&mut report);
            if report.is_empty() && read.is_ok() {
                return Ok(Started {
                    pid: child,
                    stdout,
                    stderr,
                    input,
                });
            }
            let _ = waitpid(child, None);
            Err(match read {
                Ok(_) => StartFailure::decode(&report),
                Err(e) => StartFailure::errno("reading the container's start report", e),
            })
        }
    }
}

fn pipe2_cloexec() -> Result<(OwnedFd, OwnedFd), StartFailure> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| StartFailure::errno("pipe2", e))
}

fn set_nonblocking(fd: &OwnedFd) -> Result<(), StartFailure> {
    let flags =
        nix::fcntl::fcntl(fd, FcntlArg::F_GETFL).map_err(|e| StartFailure::errno("fcntl", e))?;
    nix::fcntl::fcntl(
        fd,
        FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
    )
    .map(drop)
    .map_err(|e| StartFailure::errno("fcntl", e))
}

/// The container's end of its standard streams.
struct ChildStdio {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// The three are a terminal's slave, to become the controlling terminal of the
    /// container's session.
    terminal: bool,
}

/// The container's standard streams: pipes (its stdin `/dev/null`, or with `--stdin` a pipe
/// whose writing end the shim keeps), or with `--tty` a pseudo-terminal's slave for all three
/// (the shim keeps the master). Returns the container's ends, then the shim's: stdout, stderr
/// and the input.
fn container_stdio(
    args: &ShimArgs,
) -> Result<(ChildStdio, OwnedFd, Option<OwnedFd>, attach::Input), StartFailure> {
    if args.tty {
        let pair = nix::pty::openpty(None, None)
            .map_err(|e| StartFailure::errno("opening a terminal", e))?;
        let master = pair.master;
        set_nonblocking(&master)?;
        nix::fcntl::fcntl(&master, FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
            .map_err(|e| StartFailure::errno("fcntl", e))?;
        let dup = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| StartFailure::errno("duplicating the terminal", e))
        };
        let out = dup(&master)?;
        let (a, b) = (dup(&pair.slave)?, dup(&pair.slave)?);
        return Ok((
            ChildStdio {
                stdin: pair.slave,
                stdout: a,
                stderr: b,
                terminal: true,
            },
            out,
            None,
            attach::Input::Terminal(master),
        ));
    }
    let (out_r, out_w) = pipe2_cloexec()?;
    let (err_r, err_w) = pipe2_cloexec()?;
    let (stdin, input) = if args.stdin {
        let (r, w) = pipe2_cloexec()?;
        set_nonblocking(&w)?;
        (r, attach::Input::Pipe(w))
    } else {
        let null =
            File::open("/dev/null").map_err(|e| StartFailure::errno("opening /dev/null", e))?;
        (OwnedFd::from(null), attach::Input::None)
    };
    Ok((
        ChildStdio {
            stdin,
            stdout: out_w,
            stderr: err_w,
            terminal: false,
        },
        out_r,
        Some(err_r),
        input,
    ))
}

/// Runs in the forked child; returns only on failure (success ends in `execve`).
fn container_child(
    args: &ShimArgs,
    namespaces: &[(Option<File>, CloneFlags, &str)],
    confinement: (&[Mount], &Security),
    stdio: ChildStdio,
) -> StartFailure {
    match container_child_setup(args, namespaces, confinement, stdio) {
        Ok(()) => exec_argv(&args.argv),
        Err(f) => f,
    }
}

fn container_child_setup(
    args: &ShimArgs,
    namespaces: &[(Option<File>, CloneFlags, &str)],
    (mounts, security): (&[Mount], &Security),
    stdio: ChildStdio,
) -> Result<(), StartFailure> {
    sys::reset_signals().map_err(|e| StartFailure::errno("resetting signals", e))?;
    nix::unistd::dup2_stdin(&stdio.stdin).map_err(|e| StartFailure::errno("dup2 stdin", e))?;
    nix::unistd::dup2_stdout(&stdio.stdout).map_err(|e| StartFailure::errno("dup2 stdout", e))?;
    nix::unistd::dup2_stderr(&stdio.stderr).map_err(|e| StartFailure::errno("dup2 stderr", e))?;
    if stdio.terminal {
        // A session of its own whose controlling terminal this is: job control, ^C, SIGWINCH.
        nix::unistd::setsid().map_err(|e| StartFailure::errno("setsid", e))?;
        sys::take_controlling_terminal(std::io::stdin().as_fd())
            .map_err(|e| StartFailure::errno("taking the terminal", e))?;
    }
    drop(stdio);
    if let Some(cg) = &args.cgroup {
        cgroup::join_self(cg)
            .map_err(|e| StartFailure::errno(format!("joining cgroup {}", cg.display()), e))?;
    }
    for (file, flag, what) in namespaces {
        if let Some(f) = file {
            nix::sched::setns(f.as_fd(), *flag)
                .map_err(|e| StartFailure::errno(format!("setns({what})"), e))?;
        }
    }
    if args.rootfs.is_some() || args.new_mountns {
        nix::sched::unshare(CloneFlags::CLONE_NEWNS)
            .map_err(|e| StartFailure::errno("unshare(CLONE_NEWNS)", e))?;
        // Nothing mounted in here may propagate back to the host.
        nix::mount::mount(
            None::<&str>,
            Path::new("/"),
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(|e| StartFailure::errno("making / private", e))?;
    }
    let workdir = args.workdir.as_deref().unwrap_or(Path::new("/"));
    if let Some(rootfs) = &args.rootfs {
        let sources = confine::open_sources(mounts).map_err(StartFailure::confine)?;
        confine::enter_rootfs(rootfs, security, &sources, workdir)
            .map_err(StartFailure::confine)?;
    } else if args.new_mountns && (args.new_pidns || args.pidns.is_some()) {
        // A /proc that shows the container's PID namespace.
        nix::mount::mount(
            Some("proc"),
            Path::new("/proc"),
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(|e| StartFailure::errno("mounting /proc", e))?;
    }
    confine::drop_privileges(security).map_err(StartFailure::confine)?;
    nix::unistd::chdir(workdir)
        .map_err(|e| StartFailure::errno(format!("chdir \"{}\"", workdir.display()), e))?;
    sys::cloexec_from(3).map_err(|e| StartFailure::errno("close_range", e))?;
    Ok(())
}

/// `execve`s `argv` with this process's environment, looking `argv[0]` up in `PATH` when it
/// has no slash (like execvp). Returns only on failure.
fn exec_argv(argv: &[OsString]) -> StartFailure {
    let Some(prog) = argv.first() else {
        return StartFailure::new("empty command");
    };
    let shown = prog.to_string_lossy().into_owned();
    let to_c = |s: &[u8]| CString::new(s).ok();
    let Some(cargs) = argv
        .iter()
        .map(|a| to_c(a.as_bytes()))
        .collect::<Option<Vec<_>>>()
    else {
        return StartFailure::new(format!("exec \"{shown}\": argument contains a NUL byte"));
    };
    let env: Vec<CString> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            to_c(&kv)
        })
        .collect();
    let candidates: Vec<PathBuf> = if prog.as_bytes().contains(&b'/') {
        vec![PathBuf::from(prog)]
    } else {
        let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
        std::env::split_paths(&path)
            .map(|d| {
                if d.as_os_str().is_empty() {
                    PathBuf::from(".").join(prog)
                } else {
                    d.join(prog)
                }
            })
            .collect()
    };
    let mut errno = Errno::ENOENT;
    let mut saw_eacces = false;
    for candidate in candidates {
        let Some(c) = to_c(candidate.as_os_str().as_bytes()) else {
            continue;
        };
        let Err(e) = nix::unistd::execve(&c, &cargs, &env);
        match e {
            Errno::EACCES => saw_eacces = true,
            Errno::ENOENT | Errno::ENOTDIR => {}
            other => {
                errno = other;
                break;
            }
        }
    }
    if errno == Errno::ENOENT && saw_eacces {
        errno = Errno::EACCES;
    }
    StartFailure {
        code: if errno == Errno::ENOENT {
            EXIT_NOT_FOUND
        } else {
            EXIT_CANNOT_RUN
        },
        message: format!("exec \"{shown}\": {}", errno.desc()),
    }
}

/// Bytes read from a pipe per wakeup, to stay fair between the streams.
const READ_CHUNK: usize = 64 * 1024;
/// After the container exited, at most this much buffered output is still copied.
const DRAIN_LIMIT: usize = 8 * 1024 * 1024;

struct Stream {
    name: &'static str,
    /// The attach channel its bytes go out on.
    channel: u8,
    fd: Option<OwnedFd>,
    lines: LineSplitter,
}

struct Sink {
    log: Option<RotatingLog>,
    failed: bool,
    /// The attach clients.
    attach: Option<attach::Server>,
}

impl Sink {
    fn line(&mut self, stream: &str, line: &[u8]) {
        if let Some(log) = &mut self.log
            && let Err(e) = log.write_line(stream, line)
            && !self.failed
        {
            self.failed = true;
            diag(format_args!("writing the container log: {e}"));
        }
    }
}

impl Stream {
    /// Reads what is available (up to `budget` bytes) into the log and to the attach
    /// clients; returns bytes read.
    fn pump(&mut self, sink: &mut Sink, budget: usize) -> usize {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut total = 0;
        while total < budget {
            let Some(fd) = &self.fd else { break };
            match nix::unistd::read(fd, &mut buf) {
                // EIO: a terminal whose every slave is closed, its end.
                Ok(0) | Err(Errno::EIO) => {
                    self.fd = None;
                    let name = self.name;
                    self.lines.finish(|l| sink.line(name, l));
                }
                Ok(n) => {
                    total += n;
                    if let Some(a) = &mut sink.attach {
                        a.broadcast(self.channel, &buf[..n]);
                    }
                    let name = self.name;
                    self.lines.feed(&buf[..n], |l| sink.line(name, l));
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break,
                Err(e) => {
                    diag(format_args!("reading container {}: {e}", self.name));
                    self.fd = None;
                }
            }
        }
        total
    }
}

/// What one poll round found ready.
enum Ready {
    Stream(usize),
    Exited,
    Attach(attach::Slot, PollFlags),
}

/// Copies output into the log (and to attach clients, whose input goes to the container)
/// until the container's main process exits; returns its wait status.
fn supervise(
    args: &ShimArgs,
    started: Started,
    attach: Option<attach::Server>,
) -> Option<WaitStatus> {
    let log = args.log.as_deref().and_then(|p| {
        RotatingLog::open(p, args.log_max_bytes, args.log_max_files)
            .map_err(|e| diag(format_args!("opening log {}: {e}", p.display())))
            .ok()
    });
    let mut sink = Sink {
        log,
        failed: false,
        attach,
    };
    let mut streams = vec![Stream {
        name: "stdout",
        channel: attach::STDOUT,
        fd: dup_nonblocking(&started.stdout),
        lines: LineSplitter::default(),
    }];
    if let Some(err) = &started.stderr {
        streams.push(Stream {
            name: "stderr",
            channel: attach::STDERR,
            fd: dup_nonblocking(err),
            lines: LineSplitter::default(),
        });
    }
    drop(started.stdout);
    drop(started.stderr);
    let pidfd = sys::pidfd_open(started.pid.as_raw().unsigned_abs())
        .map_err(|e| diag(format_args!("pidfd_open: {e}")))
        .ok();
    loop {
        let ready: Vec<Ready> = {
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(8);
            let mut which = Vec::with_capacity(8);
            for (i, s) in streams.iter().enumerate() {
                if let Some(fd) = &s.fd {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                    which.push(Some(Ready::Stream(i)));
                }
            }
            if let Some(p) = &pidfd {
                fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
                which.push(Some(Ready::Exited));
            } else if fds.is_empty() {
                // No pidfd and no pipes left: block in waitpid.
                break;
            }
            if let Some(a) = &sink.attach {
                for (fd, flags, slot) in a.interest() {
                    fds.push(PollFd::new(fd, flags));
                    which.push(Some(Ready::Attach(slot, PollFlags::empty())));
                }
            }
            match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    diag(format_args!("poll: {e}"));
                    break;
                }
            }
            fds.iter()
                .zip(which.iter_mut())
                .filter_map(|(f, w)| {
                    let r = f.revents().filter(|r| !r.is_empty())?;
                    match w.take()? {
                        Ready::Attach(slot, _) => Some(Ready::Attach(slot, r)),
                        other => Some(other),
                    }
                })
                .collect()
        };
        let mut exited = false;
        for w in ready {
            match w {
                Ready::Stream(i) => {
                    streams[i].pump(&mut sink, READ_CHUNK * 4);
                }
                Ready::Exited => exited = true,
                Ready::Attach(slot, r) => {
                    if let Some(a) = &mut sink.attach {
                        a.ready(slot, r);
                    }
                }
            }
        }
        if let Some(a) = &mut sink.attach {
            a.reap();
        }
        if exited {
            break;
        }
    }
    let status = loop {
        match waitpid(started.pid, None) {
            Err(Errno::EINTR) => continue,
            Ok(s) => break Some(s),
            Err(e) => {
                diag(format_args!("waitpid: {e}"));
                break None;
            }
        }
    };
    // Copy what the container wrote before exiting; a grandchild still holding the pipe
    // does not keep us waiting.
    for s in &mut streams {
        s.pump(&mut sink, DRAIN_LIMIT);
        let name = s.name;
        s.lines.finish(|l| sink.line(name, l));
    }
    if let Some(a) = sink.attach.take() {
        a.close();
    }
    status
}

/// A non-blocking duplicate of a pipe's read end.
fn dup_nonblocking(fd: &OwnedFd) -> Option<OwnedFd> {
    let dup = fd
        .try_clone()
        .map_err(|e| diag(format_args!("dup: {e}")))
        .ok()?;
    let flags = nix::fcntl::fcntl(&dup, FcntlArg::F_GETFL).ok()?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&dup, FcntlArg::F_SETFL(flags))
        .map_err(|e| diag(format_args!("O_NONBLOCK: {e}")))
        .ok()?;
    Some(dup)
}

/// Exec mode: one command inside a running container.
fn exec_mode(args: &ShimArgs) -> i32 {
    let fail = |msg: String| {
        eprintln!("skiff exec: {msg}");
        EXIT_CANNOT_RUN
    };
    let Some(pid) = args.join_pid else {
        return fail("--join-pid is required".into());
    };
    if let Some(cg) = &args.cgroup
        && let Err(e) = cgroup::join_self(cg)
    {
        return fail(format!("joining cgroup {}: {e}", cg.display()));
    }
    // Checked before joining the container's mount namespace: its /proc may show another
    // PID namespace, without this process in it.
    let single = match sys::SingleThreaded::check() {
        Ok(s) => s,
        Err(e) => return fail(format!("fork: {e}")),
    };
    let pidfd = match sys::pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) => return fail(format!("container process {pid}: {e}")),
    };
    if let Some(t) = args.join_start_time
        && state::proc_start_time(pid) != Some(t)
    {
        return fail(format!("container process {pid} has exited"));
    }
    let security = match confinement(args) {
        Ok((_, s)) => s,
        Err(f) => return fail(f.message),
    };
    let all = CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNS;
    if let Err(e) = nix::sched::setns(&pidfd, all) {
        return fail(format!("joining the namespaces of process {pid}: {e}"));
    }
    drop(pidfd);
    // The command and everything it starts share this session and its terminal, so the
    // agent can end them all together.
    if args.tty
        && let Err(e) = sys::take_controlling_terminal(std::io::stdin().as_fd())
    {
        return fail(format!("taking the terminal: {e}"));
    }
    match sys::fork(&single) {
        Err(e) => fail(format!("fork: {e}")),
        Ok(ForkResult::Child) => {
            let failure = (|| {
                sys::reset_signals().map_err(|e| StartFailure::errno("resetting signals", e))?;
                confine::drop_privileges(&security).map_err(StartFailure::confine)?;
                let workdir = args.workdir.as_deref().unwrap_or(Path::new("/"));
                nix::unistd::chdir(workdir).map_err(|e| {
                    StartFailure::errno(format!("chdir \"{}\"", workdir.display()), e)
                })?;
                sys::cloexec_from(3).map_err(|e| StartFailure::errno("close_range", e))?;
                Ok::<_, StartFailure>(exec_argv(&args.argv))
            })()
            .unwrap_or_else(|f| f);
            eprintln!("skiff exec: {}", failure.message);
            sys::exit_now(failure.code)
        }
        Ok(ForkResult::Parent { child }) => loop {
            match waitpid(child, None) {
                Err(Errno::EINTR) => continue,
                Ok(WaitStatus::Exited(_, code)) => break code,
                Ok(WaitStatus::Signaled(_, sig, _)) => break 128 + sig as i32,
                Ok(_) => continue,
                Err(e) => break fail(format!("waitpid: {e}")),
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct TestCli {
        #[command(subcommand)]
        cmd: Cmd,
    }
    #[derive(clap::Subcommand)]
    enum Cmd {
        Shim(ShimArgs),
    }

    #[test]
    fn arguments_round_trip_through_clap() {
        let args = ShimArgs {
            state: Some("/s".into()),
            cgroup: Some("/cg".into()),
            netns: Some("/run/netns/x".into()),
            new_pidns: true,
            rootfs: Some("/r".into()),
            log: Some("/l".into()),
            log_max_bytes: 100,
            log_max_files: 2,
            argv: vec!["sh".into(), "-c".into(), "--x".into()],
            ..Default::default()
        };
        let mut line: Vec<OsString> = vec!["skiff-node".into()];
        line.extend(args.to_args());
        let Cmd::Shim(back) = TestCli::try_parse_from(line).unwrap().cmd;
        assert_eq!(back.to_args(), args.to_args());
        assert_eq!(back.argv, args.argv);
    }

    #[test]
    fn start_failure_wire_format() {
        let f = StartFailure {
            code: 127,
            message: "exec \"x\": No such file or directory".into(),
        };
        let back = StartFailure::decode(&f.encode());
        assert_eq!((back.code, back.message), (f.code, f.message));
    }
}
