//! On-disk state: file names, records and atomic writes. The shim writes `pids.json` and
//! `exit.json`; the runtime writes the rest.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::{ContainerSpec, Limits, RuntimeError, Sandbox};

pub(crate) const SANDBOX_FILE: &str = "sandbox.json";
pub(crate) const SPEC_FILE: &str = "spec.json";
pub(crate) const PIDS_FILE: &str = "pids.json";
pub(crate) const EXIT_FILE: &str = "exit.json";
pub(crate) const SHIM_LOG_FILE: &str = "shim.log";
pub(crate) const CONTAINER_LOG_FILE: &str = "container.log";

/// `<state>/pods/<uid>`.
pub(crate) fn pod_dir(state_dir: &Path, uid: &str) -> PathBuf {
    state_dir.join("pods").join(uid)
}

/// `<state>/pods/<uid>/containers/<name>`.
pub(crate) fn container_dir(state_dir: &Path, uid: &str, name: &str) -> PathBuf {
    pod_dir(state_dir, uid).join("containers").join(name)
}

/// `sandbox.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SandboxRecord {
    pub version: u32,
    pub sandbox: Sandbox,
}

/// `spec.json` of a container: what was started, and where it lives.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ContainerRecord {
    pub spec: ContainerSpec,
    /// The environment actually passed (the spec's, plus defaults).
    pub env: Vec<(String, String)>,
    pub cgroup_dir: PathBuf,
    pub cgroup_id: u64,
    pub log_path: PathBuf,
    pub limits_applied: Limits,
}

/// `pids.json`, written by the shim once the container's command has been exec'd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PidsRecord {
    pub shim_pid: u32,
    /// Start time of the shim (clock ticks since boot, `/proc/<pid>/stat` field 22), to tell
    /// it from a later process with the same pid.
    pub shim_start_time: u64,
    pub pid: u32,
    pub pid_start_time: u64,
    pub started_at: DateTime<Utc>,
}

/// `exit.json`, written by the shim when the container's main process has exited (or could
/// not be started).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExitRecord {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub reason: String,
    pub message: String,
}

/// Writes `value` as JSON to `path` atomically (temporary file in the same directory, then
/// rename), so readers never see a partial file.
pub(crate) fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let data = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("state path has no file name"))?
        .to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&data)?;
        f.write_all(b"\n")?;
        f.sync_data()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Reads a JSON state file; `Ok(None)` when it does not exist.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, RuntimeError> {
    match fs::read(path) {
        Ok(data) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(|e| RuntimeError::State {
                path: path.to_path_buf(),
                message: e.to_string(),
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(RuntimeError::Io {
            op: "reading",
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub(crate) fn write_state<T: Serialize>(path: &Path, value: &T) -> Result<(), RuntimeError> {
    write_json_atomic(path, value).map_err(|source| RuntimeError::Io {
        op: "writing",
        path: path.to_path_buf(),
        source,
    })
}

/// Start time of process `pid` in clock ticks since boot (`/proc/<pid>/stat` field 22), or
/// `None` if there is no such process (zombies count as gone).
pub(crate) fn proc_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    // Field 3 (state) is the first after the command.
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // Fields 4..=21 skipped, field 22 = starttime.
    fields.nth(18)?.parse().ok()
}

/// Whether the process `pid` that started at `start_time` still runs.
pub(crate) fn process_alive(pid: u32, start_time: u64) -> bool {
    pid != 0 && proc_start_time(pid) == Some(start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_is_readable() {
        let me = std::process::id();
        let t = proc_start_time(me).expect("own stat");
        assert!(process_alive(me, t));
        assert!(!process_alive(me, t + 1));
        assert!(!process_alive(0, t));
    }

    #[test]
    fn atomic_write_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        let rec = ExitRecord {
            exit_code: 3,
            signal: None,
            started_at: Utc::now(),
            finished_at: Utc::now(),
            reason: "Error".into(),
            message: String::new(),
        };
        write_json_atomic(&path, &rec).unwrap();
        let back: ExitRecord = read_json(&path).unwrap().unwrap();
        assert_eq!(back, rec);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
        assert!(
            read_json::<ExitRecord>(&dir.path().join("none"))
                .unwrap()
                .is_none()
        );
    }
}
