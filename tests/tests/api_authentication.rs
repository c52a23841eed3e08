//! Nobody gets in uninvited: the `skiff-apiserver` binary serves only TLS, with the cluster
//! CA it made on first start, and answers 401 to every request whose credentials it cannot
//! verify. Checked with the real kubectl 1.32 (REST) and the `skiff` CLI (gRPC), as a user
//! would meet it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use skiff_pki::{Ca, Kubeconfig, LeafSpec};
use skiff_tests::{ApiServer, Backend, fails, ok};

fn kubeconfig(
    dir: &Path,
    name: &str,
    server: &ApiServer,
    ca_pem: &str,
    identity: Option<&skiff_pki::Identity>,
    token: Option<&str>,
) -> PathBuf {
    let p = dir.join(name);
    Kubeconfig::single("skiff", &server.endpoint, ca_pem, "u", identity, token)
        .write(&p)
        .unwrap();
    p
}

fn cluster_ca(server: &ApiServer) -> String {
    std::fs::read_to_string(server.pki_dir.join("ca.crt")).unwrap()
}

fn kubectl_as(server: &ApiServer, kubeconfig: &Path, args: &[&str]) -> Output {
    server.kubectl_as(kubeconfig, args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn plain_http_is_refused_and_the_server_is_verified() {
    let server = ApiServer::start(Backend::Embedded);
    // A plain-text HTTP request gets no HTTP answer: the port speaks only TLS.
    let mut tcp = std::net::TcpStream::connect(server.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tcp.write_all(b"GET /api/v1/namespaces HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plain HTTP was answered: {}",
        String::from_utf8_lossy(&answer)
    );

    // The generated admin kubeconfig works as it is.
    let out = ok(&server.kubectl(&["get", "namespaces", "-o", "name"]));
    assert!(out.contains("namespace/default"), "{out}");
    assert_eq!(server.skiff(&["get", "ns"]).status.code(), Some(0));

    // A client trusting another CA refuses the server (kubectl checks the serving
    // certificate; nothing is sent).
    let dir = tempfile::tempdir().unwrap();
    let other = Ca::generate("not-the-cluster").unwrap();
    let admin = skiff_pki::kubeconfig::load(&server.kubeconfig).unwrap();
    let wrong_ca = kubeconfig(
        dir.path(),
        "wrong-ca",
        &server,
        other.cert_pem(),
        admin.identity.as_ref(),
        None,
    );
    let err = stderr(&kubectl_as(&server, &wrong_ca, &["get", "ns"]));
    assert!(
        err.contains("certificate signed by unknown authority"),
        "{err}"
    );
}

#[test]
fn unverifiable_credentials_get_401() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "good-token-1234,alice,uid-alice,\"dev,ops\"\n").unwrap();
    let server = ApiServer::start_with(
        Backend::Embedded,
        &["--token-auth-file", tokens.to_str().unwrap()],
    );
    let ca = cluster_ca(&server);
    // kubectl's words for a 401 (on discovery: "(the server has asked for the client to
    // provide credentials)").
    let unauthorized = "error: You must be logged in to the server";

    // No credentials at all: 401 on the API, with kube-apiserver's Status, while the health
    // and version endpoints stay open as kube-apiserver's system:public-info-viewer keeps
    // them. (kubectl prompts for a password rather than send a request without credentials,
    // so these are sent by hand.)
    let anonymous = kubeconfig(dir.path(), "anon", &server, &ca, None, None);
    let raw = https_get(&server, &ca, "/api/v1/namespaces");
    assert!(raw.starts_with("HTTP/1.1 401"), "{raw}");
    assert!(
        raw.contains(r#""kind":"Status""#)
            && raw.contains(r#""reason":"Unauthorized""#)
            && raw.contains(r#""code":401"#),
        "{raw}"
    );
    let health = https_get(&server, &ca, "/healthz");
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok"),
        "{health}"
    );
    let version = https_get(&server, &ca, "/version");
    assert!(version.contains("gitVersion"), "{version}");

    // A client certificate of another CA: 401, not a failed handshake.
    let other = Ca::generate("mallory-ca").unwrap();
    let forged = other
        .issue(&LeafSpec::client("system:admin", &["system:masters"]))
        .unwrap();
    let forged_cfg = kubeconfig(dir.path(), "forged", &server, &ca, Some(&forged), None);
    let o = kubectl_as(&server, &forged_cfg, &["get", "ns"]);
    assert!(stderr(&o).contains(unauthorized), "{}", stderr(&o));

    // Tokens: the file's token authenticates, any other is a 401.
    let o = kubectl_as(
        &server,
        &anonymous,
        &["--token=good-token-1234", "get", "ns"],
    );
    // Authenticated as the file says: alice, who has no role yet (403, not 401).
    assert!(
        stderr(&o).contains(
            "Error from server (Forbidden): namespaces is forbidden: User \"alice\" cannot list \
             resource \"namespaces\" in API group \"\" at the cluster scope"
        ),
        "{}",
        stderr(&o)
    );
    let o = kubectl_as(&server, &anonymous, &["--token=wrong-token", "get", "ns"]);
    assert!(stderr(&o).contains(unauthorized), "{}", stderr(&o));
    // The token never reaches the server's log.
    assert!(!server.log().contains("good-token-1234"));
    assert!(!server.log().contains("wrong-token"));

    // gRPC (the skiff CLI and every Skiff component) is refused the same way.
    let out = skiff_with(&server, &anonymous, &["get", "ns"]);
    let err = fails(&out);
    assert!(
        err.contains("You must be logged in to the server (Unauthorized)"),
        "{err}"
    );
    let forged_out = skiff_with(&server, &forged_cfg, &["get", "ns"]);
    assert!(fails(&forged_out).contains("Unauthorized"));
    let token_cfg = kubeconfig(
        dir.path(),
        "tok",
        &server,
        &ca,
        None,
        Some("good-token-1234"),
    );
    let err = fails(&skiff_with(&server, &token_cfg, &["get", "ns"]));
    assert!(err.contains("User \"alice\" cannot list"), "{err}");
    // Her groups came from the file: a binding to one of them lets her in.
    ok(&server.kubectl(&[
        "create",
        "clusterrolebinding",
        "ops-view",
        "--clusterrole=view",
        "--group=ops",
    ]));
    let out = eventually_ok(|| skiff_with(&server, &token_cfg, &["get", "ns"]));
    assert!(out.contains("default"), "{out}");
}

#[test]
fn kubeconfigs_for_new_users_come_from_the_binary() {
    let server = ApiServer::start(Backend::Embedded);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("carol.kubeconfig");
    let o = std::process::Command::new(skiff_tests::binary("skiff-apiserver"))
        .args(["kubeconfig", "--pki-dir"])
        .arg(&server.pki_dir)
        .args([
            "--user",
            "carol",
            "--group",
            "qa",
            "--server",
            &server.endpoint,
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    ok(&o);
    let kc = skiff_pki::kubeconfig::load(&out).unwrap();
    let info = skiff_pki::parse_pem(&kc.identity.unwrap().cert_pem, "carol").unwrap();
    assert_eq!(info.common_name, "carol");
    assert_eq!(info.organizations, vec!["qa"]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // carol is who the certificate says, in group qa.
    let o = kubectl_as(
        &server,
        &out,
        &["auth", "whoami", "-o", "jsonpath={.status.userInfo}"],
    );
    let who = String::from_utf8_lossy(&o.stdout);
    assert!(
        who.contains(r#""username":"carol""#) && who.contains(r#""qa""#),
        "{who}{}",
        stderr(&o)
    );
}

/// A plain HTTPS GET without credentials (rustls, verifying the server against `ca`): the
/// whole answer, head and body.
fn https_get(server: &ApiServer, ca: &str, path: &str) -> String {
    let config = skiff_pki::tls::client_config(ca, None).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let tcp = std::net::TcpStream::connect(server.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Runs `cmd` until it succeeds (RBAC changes reach the authorizer through a watch), at
/// most 10 s; its stdout.
fn eventually_ok(cmd: impl Fn() -> Output) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let o = cmd();
        if o.status.success() {
            return String::from_utf8_lossy(&o.stdout).into_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still failing: {}",
            stderr(&o)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn skiff_with(_server: &ApiServer, kubeconfig: &Path, args: &[&str]) -> Output {
    std::process::Command::new(skiff_tests::binary("skiff"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("SKIFF_CONFIG", "/nonexistent")
        .env_remove("SKIFF_SERVER")
        .output()
        .unwrap()
}
