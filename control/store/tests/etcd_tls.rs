//! The etcd backend over TLS with client certificates (kube-apiserver's `--etcd-cafile`,
//! `--etcd-certfile`, `--etcd-keyfile`), against a real etcd that requires them
//! (`--client-cert-auth`, its own CA): the right files work, a client certificate of another
//! CA or none at all is refused by etcd, a server certificate of another CA is refused by the store, and a
//! plain connection gets nothing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use skiff_store::testutil::EtcdServer;
use skiff_store::{EtcdStore, EtcdTls, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_takes_only_its_own_ca_both_ways() {
    let etcd = EtcdServer::start_tls().unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    assert!(etcd.endpoint.starts_with("https://"), "{}", etcd.endpoint);
    let tls = etcd.client_tls().unwrap();

    // The right CA and client certificate: a working store.
    let store = EtcdStore::connect_with(&etcd.endpoints(), Some(&tls))
        .await
        .unwrap();
    let kv = store.create("/tls/k", b"v".to_vec()).await.unwrap();
    assert_eq!(store.get("/tls/k").await.unwrap(), Some(kv));

    // Another CA's material (a second etcd PKI, as any other cluster's).
    let other_dir = tempfile::tempdir().unwrap();
    let other = skiff_pki::etcd::EtcdPki::new(other_dir.path());
    other.ensure(&["x"], &["127.0.0.1".to_string()]).unwrap();
    let o = other.client();
    let foreign = EtcdTls::read(&o.ca, &o.cert, &o.key).unwrap();

    // A client certificate etcd's CA did not sign: etcd refuses the handshake.
    let wrong_client = EtcdTls {
        ca_pem: tls.ca_pem.clone(),
        ..foreign.clone()
    };
    assert!(
        EtcdStore::connect_with(&etcd.endpoints(), Some(&wrong_client))
            .await
            .is_err(),
        "etcd took a client certificate of another CA"
    );
    // TLS without a client certificate: etcd serves nothing (`--client-cert-auth`).
    let anonymous = async {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(3))
            .with_timeout(std::time::Duration::from_secs(3))
            .with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(&tls.ca_pem)),
            );
        let mut client = etcd_client::Client::connect(etcd.endpoints(), Some(options)).await?;
        client.get("/tls/k", None).await
    };
    assert!(
        anonymous.await.is_err(),
        "etcd served a client without a certificate"
    );
    // A server the client's CA did not sign: the store refuses it.
    let wrong_ca = EtcdTls {
        ca_pem: foreign.ca_pem.clone(),
        ..tls.clone()
    };
    assert!(
        EtcdStore::connect_with(&etcd.endpoints(), Some(&wrong_ca))
            .await
            .is_err(),
        "the store trusted a server certificate of another CA"
    );
    // Without TLS: nothing.
    let plain = etcd.endpoint.replace("https://", "http://");
    assert!(
        EtcdStore::connect(std::slice::from_ref(&plain))
            .await
            .is_err(),
        "a plain connection was served"
    );
    // TLS files with a plain endpoint are a mistake, said as such.
    let e = EtcdStore::connect_with(&[plain], Some(&tls))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("must be https://"), "{e}");
    // The key is never shown.
    assert!(!format!("{tls:?}").contains("PRIVATE"));
}
