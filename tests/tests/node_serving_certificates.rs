//! A node gets a serving certificate of the cluster CA (signer `kubernetes.io/kubelet-serving`)
//! for its own addresses only: the controller manager approves a node's request, made as the
//! node itself, when every IP SAN is one of that Node's InternalIP/ExternalIP addresses and
//! every DNS SAN one of its Hostname/InternalDNS/ExternalDNS ones, and signs it as a server
//! certificate with exactly those SANs. A request for another node's address or for loopback
//! stays pending; one for an address the Node lists later is approved once it does.
//! Real binaries (`skiff-apiserver`, `skiff-controller-manager`); the Nodes are registered by
//! the administrator, no agent runs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use skiff_api::api::{
    CertificateSigningRequest, CertificateSigningRequestSpec, Node, NodeAddress, NodeStatus,
    ObjectMeta,
};
use skiff_api::wellknown::KUBELET_SERVING_SIGNER;
use skiff_client::{Client, ClientConfig};
use skiff_tests::{ApiServer, Backend, Component, eventually_within, unique};

const T: Duration = Duration::from_secs(60);

/// Registers Node `name` with `addresses` (type, address), or sets them on it (read again
/// and retried when the controller manager wrote the Node in between: its node IPAM gives a
/// new Node a pod CIDR).
async fn set_node(admin: &Client, name: &str, addresses: &[(&str, &str)]) {
    let nodes = admin.cluster::<Node>();
    if nodes.get(name).await.is_err() {
        nodes
            .create(&Node {
                metadata: Some(ObjectMeta {
                    name: name.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("creating the Node");
    }
    let addresses: Vec<NodeAddress> = addresses
        .iter()
        .map(|(ty, a)| NodeAddress {
            r#type: ty.to_string(),
            address: a.to_string(),
        })
        .collect();
    eventually_within("the Node's addresses set", T, || async {
        let mut node = nodes.get(name).await.map_err(|e| e.to_string())?;
        node.status
            .get_or_insert_with(NodeStatus::default)
            .addresses = addresses.clone();
        nodes
            .update_status(&node)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
}

/// Asks, with `client`, for a serving certificate of `node` for `sans`.
async fn ask(client: &Client, name: &str, node: &str, sans: &[&str]) {
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let (_, pem) = skiff_pki::new_server_request(
        &format!("system:node:{node}"),
        &["system:nodes".to_string()],
        &sans,
    )
    .unwrap();
    let csr = CertificateSigningRequest {
        metadata: Some(ObjectMeta {
            name: name.into(),
            ..Default::default()
        }),
        spec: Some(CertificateSigningRequestSpec {
            request: pem.into_bytes(),
            signer_name: KUBELET_SERVING_SIGNER.into(),
            usages: ["digital signature", "key encipherment", "server auth"]
                .iter()
                .map(|u| u.to_string())
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    client
        .cluster::<CertificateSigningRequest>()
        .create(&csr)
        .await
        .expect("creating the request");
}

/// The request's certificate once it is issued (PEM), and whether it is approved.
async fn state(admin: &Client, name: &str) -> (Option<String>, bool) {
    let r = admin
        .cluster::<CertificateSigningRequest>()
        .get(name)
        .await
        .expect("reading the request");
    let status = r.status.unwrap_or_default();
    let approved = status
        .conditions
        .iter()
        .any(|c| c.r#type == "Approved" && c.status == "True");
    let cert = (!status.certificate.is_empty())
        .then(|| String::from_utf8(status.certificate).expect("PEM"));
    (cert, approved)
}

async fn issued(admin: &Client, name: &str) -> String {
    eventually_within(&format!("{name} is signed"), T, || async {
        state(admin, name).await.0.ok_or("not yet")
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn serving_certificates_are_approved_only_for_the_nodes_own_addresses() {
    let server = ApiServer::start(Backend::Embedded);
    let cm = Component::start(
        &server,
        "skiff-controller-manager",
        &["--lease-duration", "4", "--identity", "cm-serving"],
    );
    let admin = server.client().await;
    let id = unique();
    let (n1, n2) = (format!("serve-a-{id}"), format!("serve-b-{id}"));
    set_node(
        &admin,
        &n1,
        &[("InternalIP", "192.168.150.1"), ("Hostname", n1.as_str())],
    )
    .await;
    set_node(&admin, &n2, &[("InternalIP", "192.168.150.2")]).await;
    let dir = tempfile::tempdir().unwrap();
    let as_n1 = server.user_kubeconfig(dir.path(), &format!("system:node:{n1}"), &["system:nodes"]);
    let as_n1 = Client::connect_with(&ClientConfig::from_kubeconfig(&as_n1).unwrap())
        .await
        .unwrap();

    // Its own address and name: approved and signed, a server certificate with exactly them.
    ask(&as_n1, "own", &n1, &["192.168.150.1", &n1]).await;
    let pem = issued(&admin, "own").await;
    let info = skiff_pki::parse_pem(&pem, "issued").unwrap();
    assert_eq!(info.common_name, format!("system:node:{n1}"));
    assert_eq!(info.organizations, ["system:nodes"]);
    assert_eq!(info.sans, ["192.168.150.1", n1.as_str()]);
    let ca = std::fs::read_to_string(server.pki_dir.join("ca.crt")).unwrap();
    let der = skiff_pki::pem_certificates(&pem, "issued")
        .unwrap()
        .remove(0);
    skiff_pki::tls::verify_chain_for(&ca, &der, &[], skiff_pki::Usage::Server).unwrap();
    assert!(
        skiff_pki::tls::verify_chain_for(&ca, &der, &[], skiff_pki::Usage::Client).is_err(),
        "a serving certificate is not a client certificate"
    );

    // Another node's address, loopback, another node's name, an address n1 does not have
    // yet: pending, while a later request of its own is signed.
    ask(&as_n1, "theft", &n1, &["192.168.150.1", "192.168.150.2"]).await;
    ask(&as_n1, "loopback", &n1, &["127.0.0.1"]).await;
    ask(&as_n1, "name", &n1, &[&n2]).await;
    ask(&as_n1, "later", &n1, &["192.168.150.11"]).await;
    ask(&as_n1, "again", &n1, &["192.168.150.1"]).await;
    issued(&admin, "again").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["theft", "loopback", "name", "later"] {
        assert_eq!(
            state(&admin, name).await,
            (None, false),
            "{name}: controller manager log:\n{}",
            cm.log()
        );
    }

    // Once n1's Node lists the address, that request is approved and signed; the others stay
    // pending.
    set_node(
        &admin,
        &n1,
        &[
            ("InternalIP", "192.168.150.1"),
            ("InternalIP", "192.168.150.11"),
            ("Hostname", n1.as_str()),
        ],
    )
    .await;
    let pem = issued(&admin, "later").await;
    assert_eq!(
        skiff_pki::parse_pem(&pem, "later").unwrap().sans,
        ["192.168.150.11"]
    );
    for name in ["theft", "loopback", "name"] {
        assert_eq!(state(&admin, name).await, (None, false), "{name}");
    }
}
