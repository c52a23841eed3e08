//! Python programs against a test cluster: the interpreter of the venv `cargo xtask setup`
//! makes (the official `kubernetes` client and `kopf`, pinned by
//! `tests/python/requirements.txt`; the path is `skiff_flags::python`'s), the scripts in
//! `tests/python/`, and [`PythonProcess`], a long-running one (an operator) killed by pid
//! when dropped. A test that needs the venv fails, naming `cargo xtask setup`, when it is
//! missing or was made from other pins: it never skips.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use skiff_flags::python::{self, VenvState};

use crate::repo_root;

/// The venv's interpreter, after checking that the venv holds exactly the pinned packages.
pub fn interpreter() -> PathBuf {
    let venv = python::venv_dir();
    let state = python::venv_state_at(&venv, &repo_root())
        .unwrap_or_else(|e| panic!("reading {}: {e}", python::REQUIREMENTS));
    match state {
        VenvState::Current => python::python_in(&venv),
        VenvState::Missing => panic!(
            "no Python venv at {}: run cargo xtask setup (it installs the kubernetes client \
             and kopf pinned by {})",
            venv.display(),
            python::REQUIREMENTS
        ),
        VenvState::Stale => panic!(
            "the Python venv at {} was made from other pins than {}: run cargo xtask setup",
            venv.display(),
            python::REQUIREMENTS
        ),
    }
}

/// A script of `tests/python/`.
pub fn script(name: &str) -> PathBuf {
    repo_root().join("tests").join("python").join(name)
}

/// The venv's `python -u` (unbuffered) with `kubeconfig` as the only cluster it may reach
/// (`KUBECONFIG`, no proxy); the caller adds the script or module and its arguments. Like
/// kubectl run by the test process, the kubeconfig must name a loopback address. Its
/// directory (the test's own) is the process's `TMPDIR`: the client copies the kubeconfig's
/// certificate and key to temporary files, which a killed process leaves behind.
pub fn command(kubeconfig: &Path) -> Command {
    crate::assert_loopback_server(kubeconfig);
    let dir = kubeconfig
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut cmd = Command::new(interpreter());
    cmd.arg("-u")
        .env("KUBECONFIG", kubeconfig)
        .env("TMPDIR", dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("NO_PROXY", "*")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .stdin(Stdio::null());
    cmd
}

/// Runs a script of `tests/python/` to its end.
pub fn run(kubeconfig: &Path, script_name: &str, args: &[&str]) -> Output {
    command(kubeconfig)
        .arg(script(script_name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {script_name}: {e}"))
}

/// A Python process left running (an operator); its stdout and stderr go to a log file.
/// Killed by its pid (SIGKILL) and reaped when dropped, also when the test fails.
#[derive(Debug)]
pub struct PythonProcess {
    child: Child,
    log: PathBuf,
}

impl PythonProcess {
    /// Starts `cmd`, logging to `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> PythonProcess {
        let file = std::fs::File::create(log).expect("creating the log file");
        let child = cmd
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {:?}: {e}", cmd.get_program()));
        PythonProcess {
            child,
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What it wrote so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PythonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
