//! Every file a cluster keeps is private and no Secret is readable in it: a real
//! `skiff-apiserver` started as `cargo xtask up` starts it (embedded store, `--pki-dir` and
//! `--data-dir`, no encryption flag: the server's default encryption at rest with a key it
//! generates in its PKI directory), under the most permissive umask (000). kubectl 1.32
//! creates a Secret holding a random marker; then a snapshot is taken both ways
//! (`GET /skiff/v1/snapshot` and `skiff snapshot save`), and every file under the cluster's
//! state directory (store, snapshots, logs, PKI, kubectl's cache) is searched for the marker,
//! plain or base64: it is in none. Every store, key and snapshot file is mode 0600 and every
//! directory the cluster made is 0700; no temporary is left behind.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use skiff_tests::{ApiServer, Backend, ok, unique};

/// Every file under `dir`, recursively (symbolic links not followed).
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.is_dir() {
            files_under(&p, out);
        } else if meta.is_file() {
            out.push(p);
        }
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn secrets_are_in_no_state_file_and_every_state_file_is_private() {
    // The harshest umask: whatever a file's mode is, the code set it.
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    let server = ApiServer::start(Backend::Embedded);
    let state = server.pki_dir.parent().unwrap().to_path_buf();
    let (pki, data) = (server.pki_dir.clone(), state.join("data"));

    let marker = format!("marker-{}-{}", unique(), std::process::id());
    ok(&server.kubectl(&[
        "create",
        "secret",
        "generic",
        "private",
        &format!("--from-literal=k={marker}"),
    ]));
    // Read back as written.
    let b64 = ok(&server.kubectl(&["get", "secret", "private", "-o", "jsonpath={.data.k}"]));
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .unwrap(),
        marker.as_bytes()
    );

    // A snapshot through the REST API (staged in the server's data directory) ...
    let raw = server
        .kubectl_cmd(&["get", "--raw", "/skiff/v1/snapshot"])
        .output()
        .unwrap();
    assert!(
        raw.status.success() && !raw.stdout.is_empty(),
        "kubectl get --raw /skiff/v1/snapshot: {}",
        String::from_utf8_lossy(&raw.stderr)
    );
    assert!(
        !contains(&raw.stdout, marker.as_bytes()),
        "the snapshot holds the Secret in plain"
    );
    // ... and `skiff snapshot save` into a directory anyone may read: the file is 0600.
    let snapshots = state.join("snapshots");
    std::fs::create_dir(&snapshots).unwrap();
    std::fs::set_permissions(&snapshots, std::fs::Permissions::from_mode(0o755)).unwrap();
    let saved = snapshots.join("saved.db");
    ok(&server.skiff(&["snapshot", "save", saved.to_str().unwrap()]));
    assert_eq!(mode(&saved), 0o600, "`skiff snapshot save` output");
    let names: Vec<_> = std::fs::read_dir(&snapshots)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["saved.db"], "temporaries left beside the snapshot");

    // The marker is in no file, plain or base64.
    let encoded = base64::engine::general_purpose::STANDARD.encode(&marker);
    let mut files = Vec::new();
    files_under(&state, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("data/skiff.redb")),
        "{files:?}"
    );
    let mut ciphertext = false;
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        assert!(
            !contains(&bytes, marker.as_bytes()),
            "the Secret's value is readable in {}",
            f.display()
        );
        assert!(
            !contains(&bytes, encoded.as_bytes()),
            "the Secret's value is readable (base64) in {}",
            f.display()
        );
        ciphertext |= contains(&bytes, b"k8s:enc:aesgcm:v1:");
    }
    assert!(ciphertext, "no encrypted value in any state file");

    // Modes: the store, the key files, the kubeconfigs and the encryption configuration are
    // 0600 (certificates may be read by anyone); the directories the server made are 0700.
    for dir in [&pki, &data] {
        assert_eq!(mode(dir), 0o700, "{}", dir.display());
        let mut files = Vec::new();
        files_under(dir, &mut files);
        assert!(!files.is_empty());
        for f in files {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                !name.starts_with('.') && !name.ends_with(".tmp"),
                "a temporary left: {}",
                f.display()
            );
            if name.ends_with(".crt") {
                assert_eq!(mode(&f) & 0o022, 0, "{}", f.display());
            } else {
                assert_eq!(mode(&f), 0o600, "{}", f.display());
            }
        }
    }
    assert!(pki.join("encryption-config.yaml").exists());
    let data_files: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        data_files,
        ["skiff.redb"],
        "the REST snapshot's temporary is removed once sent"
    );
}

/// With etcd as the store (as `cargo xtask up --ha` runs it: TLS for clients and peers,
/// client certificates of an etcd CA of its own), the API server connects with
/// `--etcd-cafile`, `--etcd-certfile` and `--etcd-keyfile`; without them it does not start.
/// The Secret is encrypted in etcd's files too, and the REST snapshot's temporary (staged in
/// the PKI directory) is gone once sent.
#[test]
fn etcd_over_tls_with_client_certificates_holds_secrets_encrypted() {
    let etcd = skiff_tests::EtcdServer::start_tls().expect("a real etcd (run `cargo xtask setup`)");
    let files = etcd.client_files().unwrap();
    let server = ApiServer::start_with(
        Backend::Etcd(etcd.endpoint.clone()),
        &[
            "--etcd-cafile",
            files.ca.to_str().unwrap(),
            "--etcd-certfile",
            files.cert.to_str().unwrap(),
            "--etcd-keyfile",
            files.key.to_str().unwrap(),
        ],
    );
    let marker = format!("marker-{}-{}", unique(), std::process::id());
    ok(&server.kubectl(&[
        "create",
        "secret",
        "generic",
        "private",
        &format!("--from-literal=k={marker}"),
    ]));
    let raw = server
        .kubectl_cmd(&["get", "--raw", "/skiff/v1/snapshot"])
        .output()
        .unwrap();
    assert!(raw.status.success() && !raw.stdout.is_empty());
    assert!(!contains(&raw.stdout, marker.as_bytes()));
    let etcd_dir = etcd.log_path().parent().unwrap().to_path_buf();
    let mut files_seen = Vec::new();
    files_under(&etcd_dir, &mut files_seen);
    let encoded = base64::engine::general_purpose::STANDARD.encode(&marker);
    let mut ciphertext = false;
    for f in &files_seen {
        let bytes = std::fs::read(f).unwrap();
        assert!(!contains(&bytes, marker.as_bytes()), "{}", f.display());
        assert!(!contains(&bytes, encoded.as_bytes()), "{}", f.display());
        ciphertext |= contains(&bytes, b"k8s:enc:aesgcm:v1:");
    }
    assert!(ciphertext, "no encrypted value in etcd's files");
    let left: Vec<_> = std::fs::read_dir(&server.pki_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "snapshot temporaries left: {left:?}");

    // Without the client certificate, etcd does not serve the API server.
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(skiff_tests::binary("skiff-apiserver"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--store",
            "etcd",
            "--etcd-endpoints",
        ])
        .arg(&etcd.endpoint)
        .arg("--pki-dir")
        .arg(dir.path().join("pki"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "started without etcd client files");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to etcd"), "{err}");
}
