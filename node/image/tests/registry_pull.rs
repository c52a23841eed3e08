//! Pulls from a real OCI registry (Debian's docker-registry on loopback, started by the
//! test): an image pushed by the test, by tag, by digest and through a two-platform index;
//! a private repository that needs credentials; and the failures a user meets (unknown
//! tag, unreachable registry, invalid name, wrong credentials, a blob corrupted in the
//! registry), each a clear error that leaves nothing half-written. Needs root only for the
//! overlay mount.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::path::Path;

use common::Overlay;
use serde_json::json;
use skiff_image::pull::{Credentials, PullError, Puller};
use skiff_image::{BlobStore, Digest, LayerStore, StoreError};
use skiff_testkit::registry::Registry;
use skiff_testkit::registry::gz_layer;

/// A two-layer image for `arch`, pushed as `repository:tag`; its manifest digest and size
/// and its layers.
async fn push(
    registry: &Registry,
    repository_tag: &str,
    arch: &str,
    auth: Option<(&str, &str)>,
) -> (String, usize, Vec<Vec<u8>>) {
    let layers = vec![
        gz_layer(&[("bin/tool", "v1"), (&format!("arch/{arch}"), arch)]),
        gz_layer(&[("bin/tool", "v2")]),
    ];
    let config = json!({
        "architecture": arch, "os": "linux",
        "config": {"Cmd": ["/bin/tool"]},
        "rootfs": {"type": "layers", "diff_ids": [
            Digest::of(b"x").to_string(), Digest::of(b"y").to_string()]},
    });
    let (digest, size) = registry.push(repository_tag, &layers, &config, auth).await;
    (digest, size, layers)
}

fn no_temporaries(store: &Path) {
    let left: Vec<_> = std::fs::read_dir(store.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn pulls_by_tag_digest_and_index() {
    let registry = Registry::start();
    let host = registry.host();
    let (amd64, amd64_size, _) = push(&registry, "demo/tool:amd64", "amd64", None).await;
    let (arm64, arm64_size, _) = push(&registry, "demo/tool:arm64", "arm64", None).await;
    let index = json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": arm64,
             "size": arm64_size, "platform": {"architecture": "arm64", "os": "linux"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": amd64,
             "size": amd64_size, "platform": {"architecture": "amd64", "os": "linux"}},
        ],
    });
    registry
        .push_manifest(
            "demo/tool:multi",
            "application/vnd.oci.image.index.v1+json",
            index.to_string().as_bytes(),
        )
        .await;

    let store = tempfile::tempdir().unwrap();
    let blobs = BlobStore::open(store.path()).unwrap();
    let puller = Puller::new(blobs.clone(), std::slice::from_ref(&host));
    // Through the index: the amd64 image.
    let image = puller
        .pull(&format!("{host}/demo/tool:multi"), None)
        .await
        .unwrap();
    assert_eq!(image.manifest.to_string(), amd64);
    assert_eq!(image.layers.len(), 2);
    // By digest: exactly that manifest; twice at once: one download.
    let by_digest = format!("{host}/demo/tool@{amd64}");
    let (a, b) = tokio::join!(puller.pull(&by_digest, None), puller.pull(&by_digest, None));
    assert_eq!(a.unwrap().manifest, image.manifest);
    assert_eq!(b.unwrap().manifest, image.manifest);
    no_temporaries(store.path());

    assert!(
        nix::unistd::geteuid().is_root(),
        "the overlay mount needs root"
    );
    let layers = LayerStore::open(store.path()).unwrap();
    let dirs = image.unpack(&blobs, &layers).unwrap();
    let merged = tempfile::tempdir().unwrap();
    let _mount = Overlay::mount(&dirs, merged.path());
    assert_eq!(
        std::fs::read_to_string(merged.path().join("bin/tool")).unwrap(),
        "v2"
    );
    assert!(merged.path().join("arch/amd64").is_file());
    assert!(!merged.path().join("arch/arm64").exists());
}

#[tokio::test]
async fn failures_are_clear_and_write_nothing() {
    let registry = Registry::start();
    let host = registry.host();
    let (_, _, pushed_layers) = push(&registry, "demo/tool:v1", "amd64", None).await;
    let store = tempfile::tempdir().unwrap();
    let blobs = BlobStore::open(store.path()).unwrap();
    let puller = Puller::new(blobs.clone(), std::slice::from_ref(&host));

    let err = puller
        .pull(&format!("{host}/demo/tool:nope"), None)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::NotFound { .. }), "{err}");
    assert_eq!(err.reason(), "ErrImagePull");
    let err = puller.pull("Bad Name!", None).await.unwrap_err();
    assert_eq!(err.reason(), "InvalidImageName", "{err}");
    // Nothing listens on this port (bound and dropped): unreachable.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let refused = Puller::new(blobs.clone(), &[closed.to_string()]);
    let err = refused
        .pull(&format!("{closed}/demo/tool:v1"), None)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::Unreachable { .. }), "{err}");

    // A layer corrupted inside the registry: refused by digest, nothing kept.
    let top = &pushed_layers[1];
    let hex = Digest::of(top).hex().to_string();
    let path = registry.blob_path(&hex);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let err = puller
        .pull(&format!("{host}/demo/tool:v1"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            PullError::Store {
                source: StoreError::DigestMismatch { .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.reason(), "ErrImagePull");
    assert!(
        !blobs.contains(&Digest::of(top)),
        "the corrupt layer is not kept"
    );
    no_temporaries(store.path());
}

#[tokio::test]
async fn private_repositories_need_the_right_credentials() {
    let hash = bcrypt::hash("s3cret-pass", 4).unwrap();
    let registry = Registry::start_with(Some(&format!("ci:{hash}\n")));
    let host = registry.host();
    push(
        &registry,
        "private/tool:v1",
        "amd64",
        Some(("ci", "s3cret-pass")),
    )
    .await;
    let store = tempfile::tempdir().unwrap();
    let puller = Puller::new(
        BlobStore::open(store.path()).unwrap(),
        std::slice::from_ref(&host),
    );
    let name = format!("{host}/private/tool:v1");
    let err = puller.pull(&name, None).await.unwrap_err();
    assert!(matches!(err, PullError::Unauthorized { .. }), "{err}");
    let wrong = Credentials {
        username: "ci".into(),
        password: "wrong-password".into(),
    };
    let err = puller.pull(&name, Some(&wrong)).await.unwrap_err();
    assert!(matches!(err, PullError::Unauthorized { .. }), "{err}");
    assert!(!err.to_string().contains("wrong-password"), "{err}");
    assert!(!format!("{wrong:?}").contains("wrong-password"));
    let right = Credentials {
        username: "ci".into(),
        password: "s3cret-pass".into(),
    };
    let image = puller.pull(&name, Some(&right)).await.unwrap();
    assert_eq!(image.layers.len(), 2);
}
