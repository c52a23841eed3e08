//! Harness for the end-to-end tests in `tests/tests/`: starts the real `skiff-apiserver`
//! binary (embedded store or a real etcd) on a free loopback port and runs the real `skiff`
//! CLI against it. Processes are killed by pid when the harness is dropped, also when a test
//! fails.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub use skiff_store::testutil::EtcdServer;

/// The directory holding the workspace's built binaries (`target/debug`).
pub fn bin_dir() -> PathBuf {
    // Test executables live in target/<profile>/deps/.
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary is inside target/<profile>/deps")
        .to_path_buf()
}

/// Path of a workspace binary, building it first if it is missing.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    if !path.exists() {
        let package = match name {
            "skiff" => "skiff-cli",
            other => other,
        };
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", package, "--bin", name])
            .status()
            .expect("running cargo build");
        assert!(status.success(), "building {name} failed");
    }
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral loopback port")
}

/// Which store the API server runs on.
pub enum Backend {
    Embedded,
    Etcd(String),
}

/// A running `skiff-apiserver` process.
pub struct ApiServer {
    child: Child,
    pub endpoint: String,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl ApiServer {
    pub fn start(backend: Backend) -> ApiServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut cmd = Command::new(binary("skiff-apiserver"));
        cmd.arg("--listen").arg(addr.to_string());
        match &backend {
            Backend::Embedded => {
                cmd.args(["--store", "embedded", "--data-dir"])
                    .arg(dir.path().join("data"));
            }
            Backend::Etcd(endpoint) => {
                cmd.args(["--store", "etcd", "--etcd-endpoints", endpoint]);
            }
        }
        let log = std::fs::File::create(dir.path().join("apiserver.log")).expect("log file");
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting skiff-apiserver");
        let server = ApiServer {
            child,
            endpoint: format!("http://{addr}"),
            addr,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "skiff-apiserver did not listen on {addr} within 30 s; log:\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("apiserver.log")).unwrap_or_default()
    }

    /// Runs `skiff ARGS` against this server and waits for it.
    pub fn skiff(&self, args: &[&str]) -> Output {
        self.skiff_cmd(args).output().expect("running skiff")
    }

    /// Like [`ApiServer::skiff`] but feeds `stdin`.
    pub fn skiff_stdin(&self, args: &[&str], stdin: &str) -> Output {
        use std::io::Write;
        let mut child = self
            .skiff_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running skiff");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("writing stdin");
        child.wait_with_output().expect("waiting for skiff")
    }

    /// A `skiff` command with the server address set, for tests that stream its output.
    pub fn skiff_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(binary("skiff"));
        cmd.arg("--server").arg(&self.endpoint).args(args);
        // Never pick up a developer's config file.
        cmd.env("SKIFF_CONFIG", "/nonexistent/skiff-config.yaml");
        cmd.env_remove("SKIFF_SERVER");
        cmd
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process whose stdout is read line by line in the background.
pub struct Streaming {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Streaming {
    pub fn spawn(mut cmd: Command) -> Streaming {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning streaming command");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Streaming { child, lines }
    }

    /// Waits up to `timeout` for a line containing all of `needles`; returns it.
    pub fn wait_for(&self, needles: &[&str], timeout: Duration) -> Result<String, Vec<String>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if needles.iter().all(|n| line.contains(n)) => return Ok(line),
                Ok(line) => seen.push(line),
                Err(_) => return Err(seen),
            }
        }
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// stdout of a finished command, asserting it succeeded.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "command failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// stderr of a finished command, asserting it failed.
pub fn fails(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "command unexpectedly succeeded:\nstdout:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The repository root (for examples/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repo")
        .to_path_buf()
}
