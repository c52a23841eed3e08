//! A real OCI distribution registry (Debian's `docker-registry`, installed by `cargo xtask
//! setup`) on a free loopback port, with its storage in a temporary directory; killed (by its
//! pid) and removed on drop. Optionally behind htpasswd basic auth.
#![allow(
    clippy::expect_used,
    reason = "test support: a registry that cannot start is the test's failure, said loudly"
)]

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running registry.
#[derive(Debug)]
pub struct Registry {
    child: Child,
    dir: PathBuf,
    pub addr: SocketAddr,
}

impl Registry {
    /// Anonymous pulls and pushes.
    pub fn start() -> Registry {
        Registry::start_with(None)
    }

    /// Requires the users of `htpasswd` (bcrypt lines, `user:$2y$...`) for everything.
    pub fn start_with(htpasswd: Option<&str>) -> Registry {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        let dir = std::env::temp_dir().join(format!(
            "skiff-registry-{}-{}",
            std::process::id(),
            crate::unique()
        ));
        std::fs::create_dir_all(&dir).expect("registry directory");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("storage").display()
        );
        if let Some(lines) = htpasswd {
            let file = dir.join("htpasswd");
            std::fs::write(&file, lines).expect("htpasswd");
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: skiff-test\n    path: {}\n",
                file.display()
            ));
        }
        let config_path = dir.join("config.yml");
        std::fs::write(&config_path, config).expect("registry config");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting docker-registry (run `cargo xtask setup`)");
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let registry = Registry { child, dir, addr };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !registry.answers() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not answer on {addr} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if write!(s, "GET /v2/ HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).is_err() {
            return false;
        }
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text.starts_with("HTTP/")
    }

    /// `127.0.0.1:<port>`, the registry part of an image reference.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Where the registry keeps its blobs (`docker/registry/v2/...`), for tests that
    /// tamper with them.
    pub fn storage(&self) -> PathBuf {
        self.dir.join("storage")
    }

    /// The path of a stored blob, by its hex digest.
    pub fn blob_path(&self, hex: &str) -> PathBuf {
        self.storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
