//! An OCI image layout with an index of two platforms, two gzip layers (the upper one with
//! a whiteout and an opaque directory) is imported, verified and unpacked; the kernel's
//! overlayfs over the layer directories shows exactly the merged image. A corrupt blob, and
//! a layer whose uncompressed content is not its configuration's diff ID, are refused and
//! leave nothing in the stores. Needs root (device nodes, trusted xattrs, mount).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::fs;
use std::path::Path;

use common::Overlay;
use serde_json::json;
use skiff_image::layout::{LayoutError, import_image};
use skiff_image::{BlobStore, Digest, LayerStore, StoreError};
use skiff_testkit::registry::{diff_id, gz_layer};

/// Writes `bytes` as a blob of the layout; its descriptor's digest and size.
fn blob(layout: &Path, bytes: &[u8]) -> (String, u64) {
    let d = Digest::of(bytes);
    let dir = layout.join("blobs/sha256");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(d.hex()), bytes).unwrap();
    (d.to_string(), bytes.len() as u64)
}

/// A layout tagged `v1` holding an index (linux/arm64 first, then linux/amd64); the top
/// layer's diff ID is `top_diff_id` when given (a wrong one), else its real one.
fn build_layout_with(dir: &Path, top_diff_id: Option<String>) -> (Vec<u8>, Vec<u8>) {
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let bottom = gz_layer(&[
        ("bin/", ""),
        ("bin/tool", "v1"),
        ("etc/", ""),
        ("etc/old.conf", "old"),
        ("data/", ""),
        ("data/a", "a"),
        ("data/b", "b"),
    ]);
    let top = gz_layer(&[
        ("bin/tool", "v2"),
        ("etc/.wh.old.conf", ""),
        ("data/.wh..wh..opq", ""),
        ("data/c", "c"),
    ]);
    let (bd, bs) = blob(dir, &bottom);
    let (td, ts) = blob(dir, &top);
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/tool"], "Env": ["PATH=/bin"], "WorkingDir": "/data"},
        "rootfs": {"type": "layers", "diff_ids": [
            diff_id(&bottom), top_diff_id.unwrap_or_else(|| diff_id(&top))]},
    });
    let (cd, cs) = blob(dir, config.to_string().as_bytes());
    let manifest = json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": bd, "size": bs},
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": td, "size": ts},
        ],
    });
    let (md, ms) = blob(dir, manifest.to_string().as_bytes());
    // The arm64 entry points at a manifest that is not there: choosing it would fail.
    let index = json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": Digest::of(b"arm64").to_string(), "size": 5,
             "platform": {"architecture": "arm64", "os": "linux"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms,
             "platform": {"architecture": "amd64", "os": "linux"}},
        ],
    });
    let (id, is) = blob(dir, index.to_string().as_bytes());
    let top_index = json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": id,
            "size": is, "annotations": {"org.opencontainers.image.ref.name": "v1"}}],
    });
    fs::write(dir.join("index.json"), top_index.to_string()).unwrap();
    (bottom, top)
}

fn build_layout(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    build_layout_with(dir, None)
}

#[test]
fn layers_merge_as_the_image_says() {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let layout = tempfile::tempdir().unwrap();
    build_layout(layout.path());
    let store = tempfile::tempdir().unwrap();
    let blobs = BlobStore::open(store.path()).unwrap();
    let layers = LayerStore::open(store.path()).unwrap();
    let image = import_image(layout.path(), Some("v1"), &blobs).unwrap();
    assert_eq!(image.layers.len(), 2);
    let cfg = image.config.config().as_ref().unwrap();
    assert_eq!(
        cfg.entrypoint().as_deref(),
        Some(&["/bin/tool".to_string()][..])
    );
    assert_eq!(cfg.working_dir().as_deref(), Some("/data"));
    let dirs = image.unpack(&blobs, &layers).unwrap();
    // Unpacking again reuses the layers.
    assert_eq!(image.unpack(&blobs, &layers).unwrap(), dirs);

    let merged = tempfile::tempdir().unwrap();
    let _mount = Overlay::mount(&dirs, merged.path());
    let m = merged.path();
    assert_eq!(fs::read_to_string(m.join("bin/tool")).unwrap(), "v2");
    assert!(
        !m.join("etc/old.conf").exists(),
        "the whiteout hides the lower file"
    );
    assert!(m.join("etc").is_dir());
    let mut data: Vec<String> = fs::read_dir(m.join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    data.sort();
    assert_eq!(
        data,
        ["c"],
        "the opaque directory hides the lower one's files"
    );
    // Writing into the merged read-only view fails.
    assert!(fs::write(m.join("data/new"), "x").is_err());
}

#[test]
fn a_corrupt_blob_is_refused_and_nothing_is_kept() {
    let layout = tempfile::tempdir().unwrap();
    let (_, top) = build_layout(layout.path());
    // Flip a byte of the top layer in the layout.
    let path = layout
        .path()
        .join("blobs/sha256")
        .join(Digest::of(&top).hex());
    let mut bytes = fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    let store = tempfile::tempdir().unwrap();
    let blobs = BlobStore::open(store.path()).unwrap();
    let err = import_image(layout.path(), Some("v1"), &blobs).unwrap_err();
    assert!(
        matches!(err, LayoutError::Store(StoreError::DigestMismatch { .. })),
        "{err}"
    );
    assert!(!blobs.contains(&Digest::of(&top)));
    let leftovers: Vec<_> = fs::read_dir(store.path().join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // An unknown tag names the ones there are.
    let err = import_image(layout.path(), Some("v9"), &blobs).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "no image tagged \"v9\" in {} (tags: v1)",
            layout.path().display()
        )
    );
}

#[test]
fn a_layer_that_is_not_its_diff_id_is_refused_and_nothing_is_kept() {
    let layout = tempfile::tempdir().unwrap();
    let wrong = Digest::of(b"not the top layer").to_string();
    let (_, top) = build_layout_with(layout.path(), Some(wrong.clone()));
    let store = tempfile::tempdir().unwrap();
    let blobs = BlobStore::open(store.path()).unwrap();
    let layers = LayerStore::open(store.path()).unwrap();
    let image = import_image(layout.path(), Some("v1"), &blobs).unwrap();
    let err = image.unpack(&blobs, &layers).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("not the diff ID {wrong}")) && msg.contains(&diff_id(&top)),
        "{msg}"
    );
    assert!(
        !layers.path(&Digest::of(&top)).exists(),
        "the layer is not kept"
    );
    let left: Vec<_> = fs::read_dir(store.path().join("layers/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
