//! A node joins with a bootstrap token only: `skiff token create --print-join-command`
//! makes the token and prints the command; `skiff-node join` pins the cluster CA by its
//! hash, asks for `system:node:<name>` with a CertificateSigningRequest that the controller
//! manager approves and signs, writes its kubeconfig and runs; the node registers and is
//! Ready. A wrong CA hash is refused before the token is sent (no request is made), a wrong
//! token gets 401, and the token itself can do nothing but ask for node certificates.
//! Real binaries (`skiff-apiserver`, `skiff-controller-manager`, `skiff-node`, `skiff`) and
//! real kubectl 1.32.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use skiff_api::api::{CertificateSigningRequest, Node as ApiNode};
use skiff_client::ListParams;
use skiff_tests::{ApiServer, Backend, Component, Machine, Node, binary, eventually_within, ok};

const T: Duration = Duration::from_secs(60);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `skiff-node join` that must fail before the agent starts; its output.
fn failed_join(server: &ApiServer, token: &str, hash: &str, dir: &std::path::Path) -> Output {
    let out = Command::new(binary("skiff-node"))
        .args(["join", "--server", &server.endpoint, "--ca-cert-hash", hash])
        .args(["--node-name", "intruder", "--join-timeout", "10s"])
        .arg("--state-dir")
        .arg(dir)
        .env("SKIFF_JOIN_TOKEN", token)
        .env("SKIFF_CONFIG", "/nonexistent")
        .stdin(Stdio::null())
        .output()
        .expect("running skiff-node join");
    assert!(!out.status.success(), "join should have failed: {out:?}");
    assert!(
        !dir.join("kubelet.kubeconfig").exists(),
        "a refused join must not write a kubeconfig"
    );
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_joins_with_a_bootstrap_token_only() {
    let fabric = skiff_tests::fabric();
    let control = Machine::on(&fabric, "control");
    let server = ApiServer::start_on(&control, Backend::Embedded, &[]);
    let _cm = Component::start(
        &server,
        "skiff-controller-manager",
        &["--lease-duration", "4", "--identity", "cm-join"],
    );
    let client = server.client().await;
    let csrs = client.cluster::<CertificateSigningRequest>();

    // The administrator makes a token and gets the join command.
    let out = server.skiff(&["token", "create", "--ttl", "1h", "--print-join-command"]);
    assert!(out.status.success(), "{out:?}");
    let line = text(&out.stdout);
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |flag: &str| {
        let i = words.iter().position(|w| *w == flag).expect(flag);
        words[i + 1].to_string()
    };
    assert_eq!(&words[..2], ["skiff-node", "join"], "{line}");
    // `skiff` runs on the control machine: the command names the server's machine address.
    assert_eq!(after("--server"), server.cluster_endpoint());
    let token = after("--token");
    let hash = after("--ca-cert-hash");
    let ca = std::fs::read_to_string(server.pki_dir.join("ca.crt")).unwrap();
    let ca_der = skiff_pki::pem_certificates(&ca, "ca").unwrap().remove(0);
    assert_eq!(hash, skiff_pki::spki_hash(&ca_der).unwrap());

    let scratch = tempfile::tempdir().unwrap();
    // A wrong CA hash: refused before anything is sent, so no request exists afterwards.
    let wrong_hash = format!("sha256:{}", "0".repeat(64));
    let out = failed_join(&server, &token, &wrong_hash, &scratch.path().join("a"));
    let err = text(&out.stderr);
    assert!(err.contains("does not match --ca-cert-hash"), "{err}");
    assert!(
        !err.contains(&token),
        "the token must not be printed: {err}"
    );
    // A wrong token (right form, wrong secret): 401.
    let (id, _) = token.split_once('.').unwrap();
    let wrong_token = format!("{id}.0000000000000000");
    let out = failed_join(&server, &wrong_token, &hash, &scratch.path().join("b"));
    let err = text(&out.stderr);
    assert!(err.contains("refused the bootstrap token"), "{err}");
    assert!(
        !err.contains("0000000000000000"),
        "the token must not be printed: {err}"
    );
    assert!(
        csrs.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "refused joins made no certificate request"
    );

    // The token may ask for node certificates and nothing else.
    let dir = tempfile::tempdir().unwrap();
    let as_token = dir.path().join("token.kubeconfig");
    skiff_pki::Kubeconfig::single("skiff", &server.endpoint, &ca, "boot", None, Some(&token))
        .write(&as_token)
        .unwrap();
    let out = server
        .kubectl_as(&as_token, &["get", "pods"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(&format!(
            "User \"system:bootstrap:{id}\" cannot list resource \"pods\""
        )),
        "{}",
        text(&out.stderr)
    );
    let out = server
        .kubectl_as(
            &as_token,
            &["auth", "can-i", "create", "certificatesigningrequests"],
        )
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), "yes");

    // The node joins with the token and the hash only, registers and becomes Ready.
    let node = Node::join(&server, &fabric, "joiner", "10.244.7.0/24", &token, &hash);
    let nodes = client.cluster::<ApiNode>();
    eventually_within("the joined node registered and Ready", T, || async {
        let n = nodes.get("joiner").await.map_err(|e| e.to_string())?;
        let ready = n.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.r#type == "Ready" && c.status == "True")
        });
        if ready {
            Ok(())
        } else {
            Err(format!("{:?}", n.status))
        }
    })
    .await;
    // Its credentials: a certificate of the cluster CA for system:node:joiner.
    let written = skiff_pki::kubeconfig::load(&node.kubeconfig).unwrap();
    let id_pem = written.identity.expect("a client certificate").cert_pem;
    let info = skiff_pki::parse_pem(&id_pem, "the node's certificate").unwrap();
    assert_eq!(info.common_name, "system:node:joiner");
    assert_eq!(info.organizations, ["system:nodes"]);
    assert_eq!(written.ca_pem.as_deref(), Some(ca.as_str()));
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&node.kubeconfig).unwrap().permissions(),
    );
    assert_eq!(mode & 0o077, 0, "the kubeconfig holds a key: {mode:o}");
    // The request, as kubectl shows it: asked by the token, approved and issued.
    let table = ok(&server.kubectl(&["get", "csr"]));
    let row = table
        .lines()
        .find(|l| l.starts_with("node-csr-"))
        .unwrap_or_else(|| panic!("no request in {table}"));
    assert!(row.contains(&format!("system:bootstrap:{id}")), "{row}");
    assert!(
        row.contains("kubernetes.io/kube-apiserver-client-kubelet"),
        "{row}"
    );
    assert!(row.trim_end().ends_with("Approved,Issued"), "{row}");
    // Who the node is now, as the API server sees it (kubectl on the node's machine, with
    // the kubeconfig the agent wrote).
    let out = skiff_tests::machines::kubectl_with(
        skiff_tests::on_machine(Some(&node.netns_path()), skiff_tests::KUBECTL),
        &node.kubeconfig,
        &scratch.path().join("kube-cache"),
        &["auth", "whoami", "-o", "jsonpath={.status.userInfo}"],
    )
    .output()
    .unwrap();
    let who = text(&out.stdout);
    assert!(
        who.contains("\"username\":\"system:node:joiner\""),
        "{who} {}",
        text(&out.stderr)
    );
    assert!(who.contains("system:nodes"), "{who}");
    drop(node);
}

/// A CertificateSigningRequest manifest for `cn` in `org` (a new key each time), with
/// `username` claimed in the spec (which the server must overwrite).
fn csr_manifest(name: &str, cn: &str, org: &str) -> (String, String) {
    let (key, request) = skiff_pki::new_request(cn, &[org.to_string()]).unwrap();
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, request);
    let manifest = format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: {name}\n\
         spec:\n  request: {b64}\n  signerName: kubernetes.io/kube-apiserver-client\n  \
         username: system:masters-wannabe\n  usages: [\"digital signature\", \"client auth\"]\n"
    );
    (key, manifest)
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_approves_and_denies_certificate_requests() {
    let server = ApiServer::start(Backend::Embedded);
    let _cm = Component::start(
        &server,
        "skiff-controller-manager",
        &["--lease-duration", "4", "--identity", "cm-csr"],
    );
    let (key, jane) = csr_manifest("jane", "jane", "dev");
    let (_, joe) = csr_manifest("joe", "joe", "dev");
    ok(&server.kubectl_stdin(&["create", "-f", "-"], &jane));
    ok(&server.kubectl_stdin(&["create", "-f", "-"], &joe));
    // The requester is who sent it, whatever the manifest claimed; a client request waits
    // for a person.
    let who = ok(&server.kubectl(&["get", "csr", "jane", "-o", "jsonpath={.spec.username}"]));
    assert_eq!(who, "system:admin");
    let table = ok(&server.kubectl(&["get", "csr"]));
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("jane") && l.trim_end().ends_with("Pending")),
        "{table}"
    );

    ok(&server.kubectl(&["certificate", "approve", "jane"]));
    ok(&server.kubectl(&["certificate", "deny", "joe"]));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let cert_b64 = loop {
        let c =
            ok(&server.kubectl(&["get", "csr", "jane", "-o", "jsonpath={.status.certificate}"]));
        if !c.is_empty() {
            break c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "jane's certificate was not issued"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let table = ok(&server.kubectl(&["get", "csr"]));
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("jane") && l.trim_end().ends_with("Approved,Issued")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("joe") && l.trim_end().ends_with("Denied")),
        "{table}"
    );
    let joe_cert =
        ok(&server.kubectl(&["get", "csr", "joe", "-o", "jsonpath={.status.certificate}"]));
    assert!(joe_cert.is_empty(), "a denied request gets no certificate");

    // The issued certificate logs jane in, in her group.
    let cert = String::from_utf8(
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, cert_b64.trim())
            .unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("jane.kubeconfig");
    let ca = std::fs::read_to_string(server.pki_dir.join("ca.crt")).unwrap();
    let id = skiff_pki::Identity {
        cert_pem: cert,
        key_pem: key,
    };
    skiff_pki::Kubeconfig::single("skiff", &server.endpoint, &ca, "jane", Some(&id), None)
        .write(&kubeconfig)
        .unwrap();
    let out = server
        .kubectl_as(
            &kubeconfig,
            &["auth", "whoami", "-o", "jsonpath={.status.userInfo}"],
        )
        .output()
        .unwrap();
    let who = text(&out.stdout);
    assert!(
        who.contains("\"username\":\"jane\"") && who.contains("dev"),
        "{who} {}",
        text(&out.stderr)
    );

    // The spec is immutable, and an approval is never taken back.
    let out = server.kubectl(&["label", "csr", "jane", "x=y"]);
    assert!(
        out.status.success(),
        "labels may change: {}",
        text(&out.stderr)
    );
    let out = server.kubectl(&[
        "patch",
        "csr",
        "jane",
        "--type=merge",
        "-p",
        "{\"spec\":{\"usages\":[\"server auth\"]}}",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("updates to certificatesigningrequest spec are forbidden"),
        "{}",
        text(&out.stderr)
    );
}

/// A running node renews its client certificate before it expires, as the kubelet rotates
/// its own: the agent, holding a certificate within 90 days of expiry, asks for a new one
/// with a CertificateSigningRequest as itself, the controller manager approves and signs it,
/// the kubeconfig is rewritten with the new certificate, and the agent starts again with it
/// (same pid) and keeps its Node Ready.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_node_renews_its_client_certificate() {
    let fabric = skiff_tests::fabric();
    let control = Machine::on(&fabric, "control");
    let server = ApiServer::start_on(&control, Backend::Embedded, &[]);
    let _cm = Component::start(
        &server,
        "skiff-controller-manager",
        &["--lease-duration", "4", "--identity", "cm-rotate"],
    );
    let client = server.client().await;
    let name = format!("rotate-{}", skiff_tests::unique());
    let mut node = Node::start(&server, &fabric, &name, "10.244.9.0/24");
    node.kill_agent();
    // A certificate valid one more hour: due for renewal.
    let ca = skiff_pki::ClusterPki::new(&server.pki_dir)
        .load_ca()
        .unwrap();
    let user = format!("system:node:{name}");
    let short = ca
        .issue(&skiff_pki::LeafSpec {
            validity: Duration::from_secs(3600),
            ..skiff_pki::LeafSpec::client(&user, &["system:nodes"])
        })
        .unwrap();
    skiff_pki::Kubeconfig::single(
        "skiff",
        server.cluster_endpoint(),
        ca.cert_pem(),
        &user,
        Some(&short),
        None,
    )
    .write(&node.kubeconfig)
    .unwrap();
    let expiry = |pem: &str| skiff_pki::parse_pem(pem, "cert").unwrap().not_after;
    let before = expiry(&short.cert_pem);
    node.agent_args = vec!["--cert-check-interval".into(), "1s".into()];
    node.start_agent();
    let renewed = eventually_within("the kubeconfig holds a renewed certificate", T, || async {
        let k = skiff_pki::kubeconfig::load(&node.kubeconfig).map_err(|e| e.to_string())?;
        let id = k.identity.ok_or("no client certificate")?;
        let info = skiff_pki::parse_pem(&id.cert_pem, "cert").map_err(|e| e.to_string())?;
        let expires = info.not_after;
        (expires > before + 180 * 24 * 3600
            && info.common_name == user
            && info.organizations == ["system:nodes"])
        .then_some(info)
        .ok_or_else(|| format!("still {expires}; agent log:\n{}", node.agent_log()))
    })
    .await;
    // Through a request of the node itself, approved.
    let csrs = client
        .cluster::<CertificateSigningRequest>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let mine = csrs
        .items
        .iter()
        .find(|r| r.spec.as_ref().is_some_and(|s| s.username == user))
        .unwrap_or_else(|| panic!("no request by {user}: {:?}", csrs.items));
    let approved = mine.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == "Approved" && c.status == "True")
    });
    assert!(approved, "{mine:?}");
    // The agent started again with it (registering anew after the renewal) and the node
    // stays Ready.
    eventually_within("the agent runs with the renewed certificate", T, || async {
        let log = node.agent_log();
        let after = log
            .split("starting again with the renewed certificate")
            .nth(1)
            .unwrap_or("");
        after.contains("node registered").then_some(()).ok_or(log)
    })
    .await;
    eventually_within("the node is Ready", T, || async {
        let n = client
            .cluster::<ApiNode>()
            .get(&name)
            .await
            .map_err(|e| e.to_string())?;
        let ready = n.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.r#type == "Ready" && c.status == "True")
        });
        ready.then_some(()).ok_or_else(|| node.agent_log())
    })
    .await;
    println!("renewed: {:?} → {:?}", before, renewed.not_after);
}
