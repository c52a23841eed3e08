//! The `skiff-apiserver` binary, run the way `cargo xtask up` runs it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;
use skiff_api::api::{Namespace, Pod};
use skiff_api::rpc::DiscoveryRequest;
use skiff_store::testutil::EtcdServer;

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

fn start(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_skiff-apiserver"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start skiff-apiserver")
}

/// A gRPC channel to `addr` over TLS as the kubeconfig `kubeconfig` says (CA, client
/// certificate).
async fn tls_channel(addr: &str, kubeconfig: &Path) -> Option<tonic::transport::Channel> {
    let kc = skiff_pki::kubeconfig::load(kubeconfig).ok()?;
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(kc.ca_pem?));
    if let Some(id) = kc.identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(
            id.cert_pem,
            id.key_pem,
        ));
    }
    tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .ok()?
        .tls_config(tls)
        .ok()?
        .connect()
        .await
        .ok()
}

/// Connects as the administrator of the PKI in `pki`, waiting for the server to come up.
async fn connect(addr: &str, pki: &Path) -> Api {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(channel) = tls_channel(addr, &pki.join("admin.kubeconfig")).await {
            return Api {
                client: skiff_api::rpc::api_client::ApiClient::new(channel),
            };
        }
        assert!(
            Instant::now() < deadline,
            "skiff-apiserver did not come up on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn terminate(child: &mut Child) -> ExitStatus {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("skiff-apiserver did not exit on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn exercise(api: &Api) {
    let d = api
        .client
        .clone()
        .discovery(DiscoveryRequest {})
        .await
        .expect("discovery")
        .into_inner();
    assert_eq!(d.resources.len(), skiff_api::kinds().len());
    assert_eq!(
        api.names::<Namespace>("", "", "").await,
        vec!["default", "kube-node-lease", "kube-system"]
    );
    api.create("default", &pod("p", "", &[]))
        .await
        .expect("create");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_binary_serves_persists_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data_arg = data.to_str().expect("utf-8 path");
    let pki = dir.path().join("pki");
    let addr = free_addr();
    let args = [
        "--listen",
        &addr,
        "--store",
        "embedded",
        "--data-dir",
        data_arg,
        "--pki-dir",
        pki.to_str().expect("utf-8 path"),
    ];
    let mut child = start(&args);
    let api = connect(&addr, &pki).await;
    exercise(&api).await;
    drop(api);
    let status = terminate(&mut child);
    assert!(status.success(), "exit status {status}");
    assert!(Path::new(&data).join("skiff.redb").exists());

    // Restarted on the same data and PKI directories, the pod is still there and the same
    // credentials work.
    let ca_before = std::fs::read(pki.join("ca.crt")).expect("ca.crt");
    let mut child = start(&args);
    let api = connect(&addr, &pki).await;
    assert_eq!(
        std::fs::read(pki.join("ca.crt")).expect("ca.crt"),
        ca_before
    );
    let p: Pod = api
        .get("default", "p")
        .await
        .expect("pod survived a restart");
    assert_eq!(p.spec.map(|s| s.restart_policy), Some("Always".to_string()));
    drop(api);
    assert!(terminate(&mut child).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_binary_serves_and_stops_on_sigterm() {
    let etcd = EtcdServer::start().expect("etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path().join("pki");
    let addr = free_addr();
    let mut child = start(&[
        "--pki-dir",
        pki.to_str().expect("utf-8 path"),
        "--listen",
        &addr,
        "--store",
        "etcd",
        "--etcd-endpoints",
        &etcd.endpoint,
        "--watch-cache-capacity",
        "100",
    ]);
    let api = connect(&addr, &pki).await;
    exercise(&api).await;
    drop(api);
    assert!(terminate(&mut child).success());
}

#[test]
fn etcd_without_endpoints_fails_with_a_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path().join("pki");
    let child = start(&[
        "--listen",
        &free_addr(),
        "--store",
        "etcd",
        "--pki-dir",
        pki.to_str().expect("utf-8 path"),
    ]);
    let out = child.wait_with_output().expect("wait");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--etcd-endpoints"), "{stderr}");
    // A start refused on its arguments writes nothing.
    assert!(!pki.exists());
}
