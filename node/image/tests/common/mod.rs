//! What the image tests share: an overlay mount that is undone on drop (also when a test
//! fails). Layers come from `skiff_testkit::registry::gz_layer`.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support shared by several test files"
)]

use std::path::{Path, PathBuf};

/// A read-only overlay mount of layer directories, unmounted on drop.
pub struct Overlay(PathBuf);

impl Overlay {
    pub fn mount(lowers_bottom_first: &[PathBuf], at: &Path) -> Overlay {
        assert!(
            nix::unistd::geteuid().is_root(),
            "an overlay mount needs root"
        );
        let lower: Vec<String> = lowers_bottom_first
            .iter()
            .rev()
            .map(|p| p.display().to_string())
            .collect();
        nix::mount::mount(
            Some("overlay"),
            at,
            Some("overlay"),
            nix::mount::MsFlags::MS_RDONLY,
            Some(format!("lowerdir={}", lower.join(":")).as_str()),
        )
        .expect("mounting the overlay");
        Overlay(at.to_path_buf())
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}
