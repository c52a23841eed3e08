//! Containers from OCI images: the agent's use of the node's image store
//! ([`skiff_image::ImageStore`] under `<state>/images`). A container whose `image` is a
//! registry reference (not `host`, not an absolute directory) is pulled as its
//! `imagePullPolicy` says, and gets its own root filesystem: an overlay mount of the image's
//! layers with a writable upper directory, at `<state>/rootfs/<pod uid>/<container>`, which
//! the runtime then uses like any root directory. The mounts of a pod are undone when it is
//! torn down (and by `skiff-node purge`).
//!
//! A pull ends with the layers unpacked, as containerd's does, so an image that cannot be
//! unpacked is an ErrImagePull and is not recorded. Credentials are the pod's
//! `imagePullSecrets`, read through the API when a pull is due, then the node's
//! `config.json`. Images are pulled when a container starts, never while it runs; the upper
//! directory is fresh for every run; the worker combines the image's configuration with the
//! spec (`skiff_image::process`) and waits with ErrImagePull/ImagePullBackOff on failures.
//! Every pull posts the node status at once, whose `status.images` lists the store's images by
//! tag and digest.

use std::path::{Path, PathBuf};

use skiff_image::auth::RegistryAuths;
use skiff_image::gc::{GcPolicy, GcReport};
use skiff_image::pull::Puller;
use skiff_image::{Image, ImageStore};
use tracing::{info, warn};

/// The images of this node and the root filesystems made from them.
pub(crate) struct ImageService {
    store: ImageStore,
    puller: Puller,
    rootfs: PathBuf,
    /// Registry credentials (a Docker config.json), read at every pull.
    registry_config: PathBuf,
    /// Told after every pull (the node status lists the images).
    changed: std::sync::Arc<tokio::sync::Notify>,
    /// Pulls and root filesystem mounts share it; garbage collection takes it alone, so
    /// it never removes a blob a pull has written but not yet recorded.
    gc_lock: tokio::sync::RwLock<()>,
}

impl std::fmt::Debug for ImageService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageService")
            .field("rootfs", &self.rootfs)
            .finish_non_exhaustive()
    }
}

/// Where the image store of the agent with state directory `state` lives.
pub(crate) fn store_root(state: &Path) -> PathBuf {
    state.join("images")
}

/// Where the rootfs mounts of the agent with state directory `state` live.
pub(crate) fn rootfs_root(state: &Path) -> PathBuf {
    state.join("rootfs")
}

impl ImageService {
    pub fn open(
        state: &Path,
        plain_http: &[String],
        registry_config: PathBuf,
        changed: std::sync::Arc<tokio::sync::Notify>,
    ) -> Result<ImageService, String> {
        let store = ImageStore::open(&store_root(state)).map_err(|e| e.to_string())?;
        let puller = Puller::new(store.blobs.clone(), plain_http);
        Ok(ImageService {
            store,
            puller,
            rootfs: rootfs_root(state),
            registry_config,
            changed,
            gc_lock: tokio::sync::RwLock::new(()),
        })
    }

    /// Held while an image is pulled and mounted (garbage collection waits for it).
    pub async fn using(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.gc_lock.read().await
    }

    /// One garbage collection with `policy`, keeping the images in `in_use`. Tells the node
    /// status when something went.
    pub async fn collect(
        &self,
        policy: &GcPolicy,
        in_use: &std::collections::HashSet<String>,
    ) -> Result<GcReport, String> {
        let _alone = self.gc_lock.write().await;
        let root = self.store.root().to_path_buf();
        let report = self
            .store
            .gc(policy, in_use, || skiff_image::gc::disk_usage(&root))
            .map_err(|e| e.to_string())?;
        for (name, why) in &report.removed {
            info!(image = %name, reason = %why, "image garbage-collected");
        }
        if !report.removed.is_empty() {
            self.changed.notify_one();
        }
        Ok(report)
    }

    /// The image `name` if this node has it.
    pub fn present(&self, name: &str) -> Result<Option<Image>, String> {
        self.store.image(name).map_err(|e| e.to_string())
    }

    /// Pulls `name` with the credentials for its registry (the pod's `pod_auths` first, then
    /// the node's config.json) and records it. Errors are `(waiting reason, message)`.
    pub async fn pull(
        &self,
        name: &str,
        pod_auths: RegistryAuths,
    ) -> Result<Image, (&'static str, String)> {
        let node_auths = RegistryAuths::load(&self.registry_config)
            .map_err(|e| ("ErrImagePull", e.to_string()))?;
        let auths = pod_auths.or(&node_auths);
        let image = self
            .puller
            .pull_with(name, &auths)
            .await
            .map_err(|e| (e.reason(), e.to_string()))?;
        // As containerd does, a pull ends with the layers unpacked: an image whose layers
        // cannot be unpacked (escapes, truncation, a wrong diff ID) is a failed pull, and its
        // name is not recorded.
        image
            .unpack(&self.store.blobs, &self.store.layers)
            .map_err(|e| {
                (
                    "ErrImagePull",
                    format!("failed to unpack image \"{name}\": {e}"),
                )
            })?;
        self.store
            .remember(name, &image)
            .map_err(|e| ("ErrImagePull", e.to_string()))?;
        self.changed.notify_one();
        Ok(image)
    }

    /// A fresh root filesystem for a start of container `name` of pod `uid`: the image's
    /// layers (unpacked once) under a new, empty writable upper directory, as Kubernetes gives
    /// every run of a container a new writable layer (what a crashed run wrote is gone). Only
    /// called to start a container, never while it runs.
    pub fn rootfs(&self, uid: &str, name: &str, image: &Image) -> Result<PathBuf, String> {
        let base = self.rootfs.join(uid).join(name);
        let merged = base.join("merged");
        if base.exists() {
            release_under(&base);
        }
        let lowers = image
            .unpack(&self.store.blobs, &self.store.layers)
            .map_err(|e| format!("unpacking the image: {e}"))?;
        if let Err(e) = self.store.mark_used(&image.manifest) {
            warn!(error = %e, "recording the image's use");
        }
        let (upper, work) = (base.join("upper"), base.join("work"));
        for d in [&upper, &work, &merged] {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        // overlayfs lists the lower directories top first.
        let lower: Vec<String> = lowers
            .iter()
            .rev()
            .map(|p| p.display().to_string())
            .collect();
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.join(":"),
            upper.display(),
            work.display()
        );
        nix::mount::mount(
            Some("overlay"),
            &merged,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(opts.as_str()),
        )
        .map_err(|e| format!("mounting the root filesystem at {}: {e}", merged.display()))?;
        info!(pod_uid = %uid, container = %name, layers = lowers.len(), "root filesystem mounted");
        Ok(merged)
    }

    /// Unmounts and removes every root filesystem of pod `uid`.
    pub fn release_pod(&self, uid: &str) {
        release_under(&self.rootfs.join(uid));
    }
}

/// Unmounts every mount at or below `dir`, deepest first, then removes `dir`.
pub(crate) fn release_under(dir: &Path) {
    if let Ok(under) = skiff_runtime::mountinfo::under(dir) {
        for p in under {
            if let Err(e) = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH) {
                warn!(path = %p.display(), error = %e, "unmounting a container root filesystem");
            }
        }
    }
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        warn!(path = %dir.display(), error = %e, "removing container root filesystems");
    }
}
