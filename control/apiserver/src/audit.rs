//! The audit log: one JSON line per request, in kube-apiserver's `audit.k8s.io/v1` Event
//! shape at the `Metadata` level (who, from where, what verb on which object, the
//! authorization decision, the response code, and the latency), never a request or response
//! body, so Secrets and tokens never reach it.
//!
//! Written by one background task from a bounded queue (a full queue drops the event and
//! counts it, so auditing never slows requests down), to `--audit-log-path`, rotated when it
//! would exceed `--audit-log-maxsize` megabytes into `PATH.1` … `PATH.<maxbackup>` (the oldest
//! removed), as kube-apiserver's lumberjack rotation does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::warn;

use crate::request::AuditRecord;
use crate::request::UserInfo;

/// Events waiting to be written before new ones are dropped.
const QUEUE: usize = 8192;

/// Where and how big.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    pub path: PathBuf,
    /// Rotate before the file would exceed this many bytes.
    pub max_bytes: u64,
    /// Rotated files kept.
    pub max_backups: usize,
}

/// The sending half: cheap to clone.
#[derive(Debug, Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<Value>,
    dropped: Arc<AtomicU64>,
}

impl AuditLog {
    /// Opens (creating) the log and starts its writer.
    pub fn start(opts: AuditOptions) -> std::io::Result<AuditLog> {
        if let Some(dir) = opts.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = open(&opts.path)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        tokio::spawn(write_loop(opts, file, rx, Arc::clone(&dropped)));
        Ok(AuditLog { tx, dropped })
    }

    /// Events dropped because the writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Queues one request's event.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        method: &str,
        uri: &str,
        user: Option<&UserInfo>,
        impersonator: Option<&UserInfo>,
        source: Option<std::net::SocketAddr>,
        user_agent: &str,
        record: &AuditRecord,
        code: u16,
        received: chrono::DateTime<chrono::Utc>,
        latency: Duration,
    ) {
        let mut ev = json!({
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "auditID": uuid::Uuid::new_v4().to_string(),
            "stage": "ResponseComplete",
            "requestURI": uri,
            "verb": record.attributes.as_ref().map(|a| a.verb.clone())
                .unwrap_or_else(|| method.to_ascii_lowercase()),
            "user": user.map(user_json).unwrap_or_else(|| json!({})),
            "sourceIPs": source.map(|s| vec![s.ip().to_string()]).unwrap_or_default(),
            "userAgent": user_agent,
            "responseStatus": {"metadata": {}, "code": code},
            "requestReceivedTimestamp": received.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "stageTimestamp": (received + chrono::Duration::from_std(latency).unwrap_or_default())
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        });
        if let Some(imp) = impersonator {
            ev["impersonatedUser"] = ev["user"].take();
            ev["user"] = user_json(imp);
        }
        if let Some(a) = record.attributes.as_ref().filter(|a| a.path.is_none()) {
            let mut obj = json!({"resource": a.resource, "apiVersion": ""});
            for (k, v) in [
                ("namespace", &a.namespace),
                (
                    "name",
                    if a.name.is_empty() {
                        &a.object_name
                    } else {
                        &a.name
                    },
                ),
                ("apiGroup", &a.api_group),
                ("subresource", &a.subresource),
            ] {
                if !v.is_empty() {
                    obj[k] = json!(v);
                }
            }
            if let Some(o) = obj.as_object_mut() {
                o.remove("apiVersion");
            }
            ev["objectRef"] = obj;
        }
        let mut annotations = json!({
            "skiff.io/latency": format!("{:.3}ms", latency.as_secs_f64() * 1e3),
        });
        match &record.decision {
            Some((decision, reason)) => {
                annotations["authorization.k8s.io/decision"] = json!(decision);
                annotations["authorization.k8s.io/reason"] = json!(reason);
            }
            None if code == 401 => {
                annotations["authentication.k8s.io/decision"] = json!("reject");
            }
            None => {}
        }
        for (k, v) in &record.annotations {
            annotations[k.as_str()] = json!(v);
        }
        if let Some((plugin, message)) = &record.admission {
            annotations["admission.skiff.io/decision"] = json!("forbid");
            annotations["admission.skiff.io/plugin"] = json!(plugin);
            annotations["admission.skiff.io/reason"] = json!(message);
        }
        ev["annotations"] = annotations;
        if self.tx.try_send(ev).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn user_json(u: &UserInfo) -> Value {
    let mut v = json!({"username": u.name, "groups": u.groups});
    if !u.uid.is_empty() {
        v["uid"] = json!(u.uid);
    }
    v
}

fn open(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// `PATH.<i>`.
fn backup(path: &Path, i: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{i}"));
    PathBuf::from(s)
}

/// Shifts `PATH` → `PATH.1` → … → `PATH.<max>` (dropping the last) and reopens `PATH`.
fn rotate(opts: &AuditOptions) -> std::io::Result<std::fs::File> {
    if opts.max_backups == 0 {
        let _ = std::fs::remove_file(&opts.path);
    } else {
        let _ = std::fs::remove_file(backup(&opts.path, opts.max_backups));
        for i in (1..opts.max_backups).rev() {
            let from = backup(&opts.path, i);
            if from.exists() {
                std::fs::rename(&from, backup(&opts.path, i + 1))?;
            }
        }
        std::fs::rename(&opts.path, backup(&opts.path, 1))?;
    }
    open(&opts.path)
}

async fn write_loop(
    opts: AuditOptions,
    file: std::fs::File,
    mut rx: mpsc::Receiver<Value>,
    dropped: Arc<AtomicU64>,
) {
    let mut size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut out = std::io::BufWriter::new(file);
    let mut last_flush = Instant::now();
    let mut reported = 0;
    loop {
        let ev = match tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            Ok(Some(ev)) => Some(ev),
            Ok(None) => {
                let _ = out.flush();
                return;
            }
            Err(_) => None,
        };
        if let Some(ev) = ev {
            let mut line = ev.to_string();
            line.push('\n');
            let len = line.len() as u64;
            if size > 0 && size + len > opts.max_bytes {
                let _ = out.flush();
                match rotate(&opts) {
                    Ok(f) => {
                        out = std::io::BufWriter::new(f);
                        size = 0;
                    }
                    Err(e) => {
                        warn!(path = %opts.path.display(), error = %e, "cannot rotate the audit log")
                    }
                }
            }
            if let Err(e) = out.write_all(line.as_bytes()) {
                warn!(path = %opts.path.display(), error = %e, "cannot write the audit log");
            }
            size += len;
        }
        if last_flush.elapsed() >= Duration::from_millis(200) {
            let _ = out.flush();
            last_flush = Instant::now();
            let d = dropped.load(Ordering::Relaxed);
            if d > reported {
                warn!(
                    dropped = d - reported,
                    "audit events dropped: the writer fell behind"
                );
                reported = d;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Attributes;

    #[tokio::test]
    async fn events_are_json_lines_and_the_file_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::start(AuditOptions {
            path: path.clone(),
            max_bytes: 4096,
            max_backups: 2,
        })
        .unwrap();
        let user = UserInfo {
            name: "alice".into(),
            uid: String::new(),
            groups: vec!["dev".into()],
            ..UserInfo::default()
        };
        let rec = AuditRecord {
            attributes: Some(Attributes::resource(
                "get", "", "secrets", "", "default", "db",
            )),
            decision: Some(("forbid", String::new())),
            admission: None,
            warnings: vec!["not sent to the log".into()],
            annotations: vec![("deny.hooks.example.com/reason".into(), "policy 7".into())],
        };
        for _ in 0..100 {
            log.record(
                "GET",
                "/api/v1/namespaces/default/secrets/db",
                Some(&user),
                None,
                None,
                "kubectl/v1.32",
                &rec,
                403,
                chrono::Utc::now(),
                Duration::from_micros(1500),
            );
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        let text = std::fs::read_to_string(&path).unwrap();
        let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first["user"]["username"], "alice");
        assert_eq!(first["verb"], "get");
        assert_eq!(first["objectRef"]["resource"], "secrets");
        assert_eq!(first["objectRef"]["name"], "db");
        assert_eq!(first["responseStatus"]["code"], 403);
        assert_eq!(
            first["annotations"]["authorization.k8s.io/decision"],
            "forbid"
        );
        assert_eq!(first["annotations"]["skiff.io/latency"], "1.500ms");
        assert_eq!(
            first["annotations"]["deny.hooks.example.com/reason"], "policy 7",
            "a webhook's audit annotation"
        );
        assert!(!text.contains("not sent to the log"));
        // 100 lines of ~600 bytes: rotated, never more than the limit per file, at most two
        // backups.
        for p in [path.clone(), backup(&path, 1), backup(&path, 2)] {
            assert!(
                std::fs::metadata(&p).unwrap().len() <= 4096,
                "{}",
                p.display()
            );
        }
        assert!(!backup(&path, 3).exists());
    }
}
