//! Secrets are encrypted at rest with `--encryption-provider-config` (Kubernetes'
//! EncryptionConfiguration, aesgcm then identity): kubectl reads them back as written, the
//! store's files never hold the value, while a resource the configuration does not name (a
//! ConfigMap) is stored as it is, which shows the scan would have found it. A bad
//! configuration stops the server with the field named and the key not shown. The real
//! `skiff-apiserver` binary and kubectl 1.32.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::path::Path;
use std::process::Command;

use skiff_tests::{ApiServer, Backend, binary, ok};

const CONFIG: &str = "apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - aesgcm:
      keys:
      - name: key1
        secret: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=
  - identity: {}
";

/// Whether any file under `dir` contains `needle`.
fn found_in(dir: &Path, needle: &[u8]) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|e| {
        let p = e.path();
        if p.is_dir() {
            found_in(&p, needle)
        } else {
            std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
        }
    })
}

#[test]
fn secrets_are_not_readable_in_the_store_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("encryption.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let server = ApiServer::start_with(
        Backend::Embedded,
        &["--encryption-provider-config", config.to_str().unwrap()],
    );
    ok(&server.kubectl(&[
        "create",
        "secret",
        "generic",
        "db",
        "--from-literal=password=needle-secret-314159",
    ]));
    ok(&server.kubectl(&[
        "create",
        "configmap",
        "plain",
        "--from-literal=value=needle-config-271828",
    ]));
    let b64 = ok(&server.kubectl(&["get", "secret", "db", "-o", "jsonpath={.data.password}"]));
    let value =
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64.trim()).unwrap();
    assert_eq!(value, b"needle-secret-314159");
    let data = server.pki_dir.parent().unwrap().join("data");
    assert!(
        found_in(&data, b"needle-config-271828"),
        "the unencrypted ConfigMap should be visible in {}",
        data.display()
    );
    assert!(
        !found_in(&data, b"needle-secret-314159"),
        "the Secret's value is in the store's files"
    );
    assert!(
        found_in(&data, b"k8s:enc:aesgcm:v1:key1:"),
        "no ciphertext found"
    );

    // A bad configuration: the server does not start, the field is named, the key not shown.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        CONFIG.replace("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=", "c2hvcnQ="),
    )
    .unwrap();
    let out = Command::new(binary("skiff-apiserver"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--store",
            "embedded",
            "--data-dir",
        ])
        .arg(dir.path().join("data2"))
        .arg("--pki-dir")
        .arg(dir.path().join("pki2"))
        .arg("--encryption-provider-config")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("resources[0].providers[0].aesgcm.keys[0].secret: must be 16 or 32 bytes"),
        "{err}"
    );
    assert!(!err.contains("c2hvcnQ="), "{err}");
}
