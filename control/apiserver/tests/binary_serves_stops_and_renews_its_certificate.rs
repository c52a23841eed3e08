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

/// The serving certificate the server presents to a new connection (DER), trusting `ca`.
fn served_certificate(addr: &str, ca: &str) -> Vec<u8> {
    use std::io::Write;
    let config = skiff_pki::tls::client_config(ca, None).expect("client config");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let mut conn =
        rustls::ClientConnection::new(std::sync::Arc::new(config), name).expect("connection");
    let mut tcp = std::net::TcpStream::connect(addr).expect("connect");
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("handshake");
    conn.peer_certificates().expect("a certificate")[0].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_certificate_is_renewed_while_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path().join("pki");
    let addr = free_addr();
    let mut child = start(&[
        "--listen",
        &addr,
        "--data-dir",
        dir.path().join("data").to_str().expect("utf-8"),
        "--pki-dir",
        pki.to_str().expect("utf-8"),
        "--cert-check-seconds",
        "1",
    ]);
    drop(connect(&addr, &pki).await);
    let ca = std::fs::read_to_string(pki.join("ca.crt")).expect("ca.crt");
    let first = served_certificate(&addr, &ca);
    // The certificate on disk is now one that expires tomorrow (as if a year had passed).
    let authority = skiff_pki::ClusterPki::new(&pki).load_ca().expect("CA");
    let info = skiff_pki::parse(&first, "served").expect("parse");
    let mut spec = skiff_pki::LeafSpec::server("skiff-apiserver", &info.sans);
    spec.validity = Duration::from_secs(24 * 3600);
    let due = authority.issue(&spec).expect("issue");
    std::fs::write(pki.join("apiserver.crt"), &due.cert_pem).expect("write");
    std::fs::write(pki.join("apiserver.key"), &due.key_pem).expect("write");
    // Within a few checks the server has renewed it and presents the new one.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let served = served_certificate(&addr, &ca);
        let on_disk = skiff_pki::pem_certificates(
            &std::fs::read_to_string(pki.join("apiserver.crt")).expect("read"),
            "disk",
        )
        .expect("pem")
        .remove(0);
        if served != first && served == on_disk {
            let info = skiff_pki::parse(&served, "renewed").expect("parse");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_secs() as i64;
            assert!(info.not_after - now > 300 * 24 * 3600, "renewed for a year");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the serving certificate was not renewed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(terminate(&mut child).success());
}
