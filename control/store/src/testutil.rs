//! Test support: a throwaway, real etcd server (feature `testutil`).
//!
//! ```no_run
//! # async fn demo() {
//! use skiff_store::{EtcdStore, Store, testutil::EtcdServer};
//! let etcd = EtcdServer::start().expect("etcd");
//! let store = EtcdStore::connect(&[etcd.endpoint.clone()]).await.unwrap();
//! store.create("/k", b"v".to_vec()).await.unwrap();
//! // Dropping `etcd` kills the server and deletes its data.
//! # }
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a failed setup step is the calling test's failure"
)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tracing::{debug, warn};

/// How long [`EtcdServer::start`] waits for etcd to become healthy.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How often [`EtcdServer::start`] picks new ports when the chosen ones were taken meanwhile.
const START_ATTEMPTS: usize = 3;

/// Why an [`EtcdServer`] could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EtcdServerError(pub String);

/// A real `etcd` child process with its own temporary data directory, listening only on
/// 127.0.0.1 on free ports. Dropping it kills the process and deletes the directory.
///
/// etcd's output goes to [`EtcdServer::log_path`], which is worth reading when a test fails.
pub struct EtcdServer {
    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub endpoint: String,
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    /// Its name and cluster, when a member of an [`EtcdCluster`].
    membership: Option<Membership>,
    /// With [`EtcdServer::start_tls`]: its own etcd PKI (in its directory); clients and
    /// peers speak TLS and must present a certificate of that CA.
    tls: Option<skiff_pki::etcd::EtcdPki>,
    /// Dropped last (after the child is killed).
    dir: TempDir,
}

/// A member's place in a multi-member cluster.
#[derive(Debug, Clone)]
struct Membership {
    name: String,
    /// `name=peer-url,...` of every member.
    initial_cluster: String,
    token: String,
}

impl std::fmt::Debug for EtcdServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdServer")
            .field("endpoint", &self.endpoint)
            .field("pid", &self.pid())
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl EtcdServer {
    /// Starts etcd and waits (up to 20 s) until it reports healthy.
    ///
    /// This blocks the calling thread for about a second; calling it at the start of an async
    /// test is fine. Fails if no `etcd` binary is on `PATH`.
    pub fn start() -> Result<Self, EtcdServerError> {
        EtcdServer::start_inner(false)
    }

    /// Like [`EtcdServer::start`], with TLS for clients and peers and client certificates
    /// required (`--client-cert-auth`), from an etcd CA of its own ([`skiff_pki::etcd`]):
    /// [`EtcdServer::client_files`] names the CA and the API server's client certificate.
    pub fn start_tls() -> Result<Self, EtcdServerError> {
        EtcdServer::start_inner(true)
    }

    /// The CA and client certificate files to reach a TLS server with, if it is one.
    pub fn client_files(&self) -> Option<skiff_pki::etcd::EtcdFiles> {
        self.tls.as_ref().map(skiff_pki::etcd::EtcdPki::client)
    }

    /// The PEM material of [`EtcdServer::client_files`].
    pub fn client_tls(&self) -> Option<crate::EtcdTls> {
        let f = self.client_files()?;
        Some(crate::EtcdTls::read(&f.ca, &f.cert, &f.key).unwrap())
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    fn start_inner(tls: bool) -> Result<Self, EtcdServerError> {
        let binary = find_etcd()?;
        let mut server = EtcdServer::unstarted()?;
        if tls {
            let pki = skiff_pki::etcd::EtcdPki::new(server.dir.path().join("pki"));
            pki.ensure(
                &["skiff-test"],
                &["127.0.0.1".to_string(), "localhost".to_string()],
            )
            .map_err(|e| EtcdServerError(format!("cannot make the etcd PKI: {e}")))?;
            server.tls = Some(pki);
            server.endpoint = format!("https://127.0.0.1:{}", server.client_port);
        }
        let mut attempt = 1;
        loop {
            match server.launch(&binary) {
                Ok(()) => return Ok(server),
                Err(e) if attempt < START_ATTEMPTS => {
                    // Most likely another process took a port between our check and etcd's
                    // bind: start over on new ports with an empty data directory.
                    warn!(attempt, error = %e, "etcd did not start; retrying on other ports");
                    server.stop();
                    let _ = std::fs::remove_dir_all(server.data_dir());
                    let (client_port, peer_port) = free_ports()?;
                    server.client_port = client_port;
                    server.peer_port = peer_port;
                    server.endpoint = format!("{}://127.0.0.1:{client_port}", server.scheme());
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A server not started yet: its temporary directory and two free ports.
    fn unstarted() -> Result<Self, EtcdServerError> {
        let dir = tempfile::Builder::new()
            .prefix("skiff-etcd-")
            .tempdir()
            .map_err(|e| EtcdServerError(format!("cannot create a temporary directory: {e}")))?;
        let (client_port, peer_port) = free_ports()?;
        Ok(EtcdServer {
            endpoint: format!("http://127.0.0.1:{client_port}"),
            child: None,
            client_port,
            peer_port,
            membership: None,
            tls: None,
            dir,
        })
    }

    /// Client URLs, in the form [`crate::EtcdStore::connect`] takes.
    pub fn endpoints(&self) -> Vec<String> {
        vec![self.endpoint.clone()]
    }

    /// The file holding etcd's output.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// The process id of the running etcd, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills etcd and starts it again on the same data directory and ports (to test restarts).
    pub fn restart(&mut self) -> Result<(), EtcdServerError> {
        self.stop();
        let binary = find_etcd()?;
        self.launch(&binary)
    }

    /// Kills etcd, replaces its data with the etcd snapshot `snapshot` (`etcdctl snapshot
    /// restore`, as an operator restores one) and starts it again on the same ports.
    pub fn restore(&mut self, snapshot: &Path) -> Result<(), EtcdServerError> {
        self.stop();
        let data = self.data_dir();
        let _ = std::fs::remove_dir_all(&data);
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg("snapshot")
            .arg("restore")
            .arg(snapshot)
            .arg(format!("--data-dir={}", data.display()))
            .arg("--name=skiff-test")
            .arg(format!("--initial-cluster=skiff-test={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!(
                "--initial-cluster-token=skiff-test-{}",
                self.peer_port
            ))
            .output()
            .map_err(|e| EtcdServerError(format!("cannot run etcdctl: {e}")))?;
        if !out.status.success() {
            return Err(EtcdServerError(format!(
                "etcdctl snapshot restore failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let binary = find_etcd()?;
        self.launch(&binary)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Kills this etcd with SIGKILL (it stays down until [`EtcdServer::restart`]).
    pub fn kill(&mut self) {
        self.stop();
    }

    fn launch(&mut self, binary: &Path) -> Result<(), EtcdServerError> {
        self.spawn(binary)?;
        self.wait_healthy()
    }

    fn spawn(&mut self, binary: &Path) -> Result<(), EtcdServerError> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| EtcdServerError(format!("cannot create the etcd log file: {e}")))?;
        let log_err = log
            .try_clone()
            .map_err(|e| EtcdServerError(format!("cannot duplicate the log file: {e}")))?;
        let client_url = format!("{}://127.0.0.1:{}", self.scheme(), self.client_port);
        let peer_url = format!("{}://127.0.0.1:{}", self.scheme(), self.peer_port);
        let mut command = Command::new(binary);
        // etcd refuses to start when an ETCD_* variable shadows a flag.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("ETCD_") {
                command.env_remove(name);
            }
        }
        let membership = self.membership.clone().unwrap_or_else(|| Membership {
            name: "skiff-test".into(),
            initial_cluster: format!("skiff-test={peer_url}"),
            token: format!("skiff-test-{}", self.peer_port),
        });
        let flags = skiff_flags::EtcdFlags {
            name: membership.name,
            data_dir: self.data_dir(),
            client_url,
            peer_url,
            initial_cluster: membership.initial_cluster,
            initial_cluster_token: membership.token,
            tls: self.tls.as_ref().map(|pki| {
                let m = pki.member("skiff-test");
                skiff_flags::EtcdMemberTls {
                    cert: m.cert,
                    key: m.key,
                    ca: m.ca,
                }
            }),
            log_to_stderr: true,
        };
        command
            .args(flags.args())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        let child = command
            .spawn()
            .map_err(|e| EtcdServerError(format!("cannot run {}: {e}", binary.display())))?;
        debug!(pid = child.id(), endpoint = %self.endpoint, "started etcd");
        self.child = Some(child);
        Ok(())
    }

    fn wait_healthy(&mut self) -> Result<(), EtcdServerError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let address = SocketAddr::from(([127, 0, 0, 1], self.client_port));
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(EtcdServerError(format!(
                    "etcd exited with {status} before becoming healthy; its log:\n{}",
                    self.log_tail()
                )));
            }
            // A TLS server's /health is behind a client certificate: its port accepting
            // connections is enough (a lone member elects itself at once).
            let up = if self.tls.is_some() {
                TcpStream::connect_timeout(&address, Duration::from_millis(500)).is_ok()
            } else {
                healthy(address)
            };
            if up {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(EtcdServerError(format!(
                    "etcd did not become healthy within {START_TIMEOUT:?}; its log:\n{}",
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Kills the process (by its pid) and waits for it.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id();
            if let Err(e) = child.kill() {
                debug!(pid, error = %e, "killing etcd");
            }
            if let Err(e) = child.wait() {
                warn!(pid, error = %e, "waiting for etcd");
            }
        }
    }
}

/// A real etcd cluster of several members (each an [`EtcdServer`] with its own data directory
/// and ports on 127.0.0.1), for tests of member loss, quorum loss and leader changes.
#[derive(Debug)]
pub struct EtcdCluster {
    pub members: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Starts `n` members and waits (up to 20 s each) until every one reports healthy.
    pub fn start(n: usize) -> Result<Self, EtcdServerError> {
        let binary = find_etcd()?;
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            members.push(EtcdServer::unstarted()?);
        }
        let initial_cluster = members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("m{i}=http://127.0.0.1:{}", m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!(
            "skiff-cluster-{}",
            members.first().map(|m| m.peer_port).unwrap_or(0)
        );
        for (i, m) in members.iter_mut().enumerate() {
            m.membership = Some(Membership {
                name: format!("m{i}"),
                initial_cluster: initial_cluster.clone(),
                token: token.clone(),
            });
        }
        // All first: a member alone has no quorum to become healthy with.
        for m in &mut members {
            m.spawn(&binary)?;
        }
        for m in &mut members {
            m.wait_healthy()?;
        }
        Ok(EtcdCluster { members })
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint.clone()).collect()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
        // `dir` is removed when the field is dropped, after this.
    }
}

fn find_etcd() -> Result<PathBuf, EtcdServerError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            EtcdServerError("etcd binary not found: run `cargo xtask setup`".to_string())
        })
}

/// Two distinct free ports on 127.0.0.1 (both listeners are open at once, so they differ).
fn free_ports() -> Result<(u16, u16), EtcdServerError> {
    let bind = || {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| Ok((l.local_addr()?.port(), l)))
            .map_err(|e| EtcdServerError(format!("cannot find a free port: {e}")))
    };
    let (client, _client_listener) = bind()?;
    let (peer, _peer_listener) = bind()?;
    Ok((client, peer))
}

/// Whether etcd answers `GET /health` with `"health":"true"`.
fn healthy(address: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /health HTTP/1.0\r\nHost: {address}\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.contains("\"health\":\"true\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_and_cleans_up() {
        let server = EtcdServer::start().expect("etcd must be installed for these tests");
        let pid = server.pid().unwrap();
        let dir = server.dir.path().to_path_buf();
        assert!(server.endpoint.starts_with("http://127.0.0.1:"));
        assert!(healthy(SocketAddr::from((
            [127, 0, 0, 1],
            server.client_port
        ))));
        assert!(server.log_path().exists());
        drop(server);
        assert!(!dir.exists(), "data directory was not removed");
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| s.contains(") Z "))
                    .unwrap_or(true),
            "etcd process {pid} still runs"
        );
    }
}
