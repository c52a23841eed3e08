//! What the image tests share: a gzip layer builder and an overlay mount that is undone on
//! drop (also when a test fails).
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support shared by several test files"
)]

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// A tar+gzip layer of `(path, content)` entries; a path ending in `/` is a directory.
pub fn gz_layer(entries: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        if name.ends_with('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, name, &[][..]).unwrap();
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, name, data.as_bytes()).unwrap();
        }
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&b.into_inner().unwrap()).unwrap();
    gz.finish().unwrap()
}

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
