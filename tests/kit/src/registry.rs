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
        lock_running().push(addr);
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

impl Registry {
    /// Pushes an image of `layers` (tar+gzip blobs, bottom first) and `config` (an OCI image
    /// configuration; its `rootfs.diff_ids` are set to the layers' uncompressed digests, as
    /// a build tool writes them) as `repository:tag` with oci-client, with `auth` (user,
    /// password) or anonymously; returns the manifest's digest and size.
    pub async fn push(
        &self,
        repository_tag: &str,
        layers: &[Vec<u8>],
        config: &serde_json::Value,
        auth: Option<(&str, &str)>,
    ) -> (String, usize) {
        use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
        use oci_client::secrets::RegistryAuth;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = oci_client::Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(vec![self.host()]),
            ..Default::default()
        });
        let auth = match auth {
            Some((u, p)) => RegistryAuth::Basic(u.into(), p.into()),
            None => RegistryAuth::Anonymous,
        };
        let reference: oci_client::Reference = format!("{}/{repository_tag}", self.host())
            .parse()
            .expect("a reference");
        let mut config = config.clone();
        config["rootfs"] = serde_json::json!({
            "type": "layers",
            "diff_ids": layers.iter().map(|l| diff_id(l)).collect::<Vec<_>>(),
        });
        let layers: Vec<ImageLayer> = layers
            .iter()
            .map(|l| {
                ImageLayer::new(
                    l.clone(),
                    "application/vnd.oci.image.layer.v1.tar+gzip".into(),
                    None,
                )
            })
            .collect();
        let config = Config::new(
            config.to_string().into_bytes(),
            "application/vnd.oci.image.config.v1+json".into(),
            None,
        );
        client
            .push(&reference, &layers, config, &auth, None)
            .await
            .expect("pushing to the test registry");
        let (bytes, digest) = client
            .pull_manifest_raw(
                &reference,
                &auth,
                &["application/vnd.oci.image.manifest.v1+json"],
            )
            .await
            .expect("reading back the pushed manifest");
        (digest, bytes.len())
    }

    /// Pushes a raw manifest or index document as `repository:tag`.
    pub async fn push_manifest(&self, repository_tag: &str, media_type: &str, body: &[u8]) {
        use oci_client::client::{ClientConfig, ClientProtocol};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = oci_client::Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(vec![self.host()]),
            ..Default::default()
        });
        let reference: oci_client::Reference = format!("{}/{repository_tag}", self.host())
            .parse()
            .expect("a reference");
        client
            .push_manifest_raw(
                &reference,
                body.to_vec(),
                media_type.parse().expect("a media type"),
            )
            .await
            .expect("pushing a manifest");
    }
}

impl Registry {
    /// Pushes a busybox image (the host's busybox-static as `/bin/busybox`, entrypoint
    /// `busybox sh -c`, so a container's `args` is one shell script) as `repository:tag`
    /// and returns its reference.
    pub async fn push_busybox(&self, repository_tag: &str) -> String {
        self.push_busybox_with(repository_tag, &[]).await
    }

    /// [`Registry::push_busybox`] with host programs added at their own paths (`/usr/bin/curl`)
    /// together with the shared libraries `ldd` names for them: real tools of the host
    /// inside a pod.
    pub async fn push_busybox_with(&self, repository_tag: &str, programs: &[&str]) -> String {
        let busybox = std::fs::read("/bin/busybox").expect("busybox-static (cargo xtask setup)");
        let mut files: Vec<(String, Vec<u8>)> = vec![("bin/busybox".into(), busybox)];
        for program in programs {
            files.push((
                program.trim_start_matches('/').to_string(),
                std::fs::read(program).unwrap_or_else(|e| panic!("reading {program}: {e}")),
            ));
            let out = Command::new("ldd")
                .arg(program)
                .output()
                .expect("running ldd");
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                // `libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)` or
                // `/lib64/ld-linux-x86-64.so.2 (0x...)`.
                let path = match line.split_once("=>") {
                    Some((_, right)) => right.split_whitespace().next(),
                    None => line.split_whitespace().next(),
                };
                let Some(path) = path.filter(|p| p.starts_with('/')) else {
                    continue;
                };
                let name = path.trim_start_matches('/').to_string();
                if files.iter().any(|(n, _)| *n == name) {
                    continue;
                }
                let data = std::fs::read(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
                files.push((name, data));
            }
        }
        let mut dirs: Vec<String> = vec!["tmp/".into()];
        for (name, _) in &files {
            let mut at = String::new();
            for part in name
                .split('/')
                .collect::<Vec<_>>()
                .iter()
                .rev()
                .skip(1)
                .rev()
            {
                at.push_str(part);
                at.push('/');
                if !dirs.contains(&at) {
                    dirs.push(at.clone());
                }
            }
        }
        let mut entries: Vec<(&str, &[u8])> = dirs.iter().map(|d| (d.as_str(), &b""[..])).collect();
        entries.extend(files.iter().map(|(n, d)| (n.as_str(), d.as_slice())));
        let layer = gz_layer_bytes(&entries);
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": ["/bin/busybox", "sh", "-c"], "Env": ["PATH=/bin:/usr/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [
                "sha256:0000000000000000000000000000000000000000000000000000000000000000"]},
        });
        self.push(repository_tag, &[layer], &config, None).await;
        format!("{}/{repository_tag}", self.host())
    }
}

/// The diff ID of a tar+gzip layer: `sha256:` and the digest of the uncompressed tarball
/// (of what decompresses, for a deliberately truncated or corrupt layer).
pub fn diff_id(gz: &[u8]) -> String {
    use std::io::Read as _;
    let mut tar = Vec::new();
    let _ = flate2::read::GzDecoder::new(gz).read_to_end(&mut tar);
    format!("sha256:{}", sha256_hex(&tar))
}

/// The sha256 of `bytes` in hex (how the registry names a blob: [`Registry::blob_path`]).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A tar+gzip image layer of `(path, content)` entries, owned by root; a path ending in `/`
/// is a directory, files are mode 0755.
pub fn gz_layer(entries: &[(&str, &str)]) -> Vec<u8> {
    let bytes: Vec<(&str, &[u8])> = entries.iter().map(|(p, d)| (*p, d.as_bytes())).collect();
    gz_layer_bytes(&bytes)
}

/// [`gz_layer`] with binary contents (a static binary in an image).
pub fn gz_layer_bytes(entries: &[(&str, &[u8])]) -> Vec<u8> {
    use std::io::Write as _;
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        if name.ends_with('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, name, &[][..]).expect("a tar entry");
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o755);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, name, *data).expect("a tar entry");
        }
    }
    let tar = b.into_inner().expect("a tarball");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    gz.finish().expect("gzip")
}

/// The loopback addresses of this test process' running registries. A harness whose nodes
/// are machines of their own (their own loopback) forwards each of them onto every node's
/// loopback, so `127.0.0.1:<port>/...` references pull on every node as on the host.
pub fn running() -> Vec<SocketAddr> {
    lock_running().clone()
}

fn lock_running() -> std::sync::MutexGuard<'static, Vec<SocketAddr>> {
    static RUNNING: std::sync::Mutex<Vec<SocketAddr>> = std::sync::Mutex::new(Vec::new());
    RUNNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Drop for Registry {
    fn drop(&mut self) {
        lock_running().retain(|a| *a != self.addr);
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A tar+gzip layer carrying names as a hostile image would: written into the tar headers as
/// given (`../` climbs, absolute paths), which tar builders refuse to write. `(name, None)` is
/// a small file, `(name, Some(target))` a symlink to `target`.
pub fn hostile_gz_layer(entries: &[(&str, Option<&str>)]) -> Vec<u8> {
    use std::io::Write as _;
    let mut b = tar::Builder::new(Vec::new());
    for (name, link) in entries {
        let mut h = tar::Header::new_old();
        let raw = h.as_old_mut();
        raw.name[..name.len()].copy_from_slice(name.as_bytes());
        let data: &[u8] = match link {
            Some(target) => {
                raw.linkname[..target.len()].copy_from_slice(target.as_bytes());
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                &[]
            }
            None => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(7);
                b"planted"
            }
        };
        h.set_mode(0o644);
        // Well-formed but for the names: the unpacker's refusal is what a test sees.
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        b.append(&h, data).expect("a tar entry");
    }
    let tar = b.into_inner().expect("a tarball");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    gz.finish().expect("gzip")
}
