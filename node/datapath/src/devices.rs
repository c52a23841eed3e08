//! Device confinement of pods: loads the `skiff-devices` object (one `cgroup_device` program,
//! see `ebpf/skiff-ebpf/src/devices/`) and attaches it to the cgroup of every pod that is not
//! privileged, through a link pinned per pod at `<node pin dir>/devices/<pod uid>`. The policy
//! is runc's default device allow list (`skiff_common::devices`): creating device nodes is
//! allowed, reading and writing only null, zero, full, random, urandom, tty, ptmx and the
//! pseudo-terminals; every other open of a device node by a process of the pod (a block
//! device of the node's disk a container `mknod`ed, say) fails with `EPERM`.
//!
//! Attached to the pod cgroup, the program runs for every container's leaf cgroup below it
//! (the kernel runs a cgroup's effective programs and those of its ancestors, and an access
//! passes only if all of them allow it), so the agent attaches it once the sandbox exists and
//! before any container of the pod starts.
//!
//! The links are pinned so confinement outlives the agent: a restarted agent takes each pod's
//! link over ([`DeviceFilter::confine`] swaps its own program in, atomically) and the kernel
//! never runs the pod unconfined. Removing a pod's pin (after its cgroup is gone) releases the
//! link; [`DeviceFilter::remove_pins`] removes them all (`skiff-node purge`).

use std::fs::File;
use std::io;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};

use aya::programs::CgroupDevice;
use aya::{Ebpf, EbpfLoader};
use skiff_common::devices::DEVICES_PROG;

use super::lb::{TcAttach, program, remove_file};
use super::{BpfError, cgroup_id, fs, is_cgroup2, sys};

/// The `skiff-devices` object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/skiff-devices"))
}

/// The directory of the per-pod link pins below a node's pin directory.
const PIN_SUBDIR: &str = "devices";

/// Where the pods' device links of the node whose pin directory is `node_pin_dir` are pinned.
pub fn pin_dir(node_pin_dir: &Path) -> PathBuf {
    node_pin_dir.join(PIN_SUBDIR)
}

/// What the agent needs from device confinement.
pub trait DeviceConfinement: Send {
    /// Confines the processes of pod `pod` (its uid), whose cgroup is `cgroup_dir`, to the
    /// default device allow list. Idempotent; takes over an earlier agent's confinement.
    fn confine(&mut self, pod: &str, cgroup_dir: &Path) -> Result<TcAttach, BpfError>;
    /// Forgets pod `pod`'s confinement (its cgroup is gone, or about to go). Idempotent.
    fn release(&mut self, pod: &str) -> Result<(), BpfError>;
    /// The pods confined now (pinned), in no particular order.
    fn confined(&self) -> Result<Vec<String>, BpfError>;
}

/// The loaded program and the directory of its per-pod link pins. Dropping it leaves every
/// pod confined (the links are pinned).
#[derive(Debug)]
pub struct DeviceFilter {
    ebpf: Ebpf,
    pin_dir: PathBuf,
}

/// A pod uid as a pin name: a single, harmless path component.
fn check_pod(pod: &str) -> Result<(), BpfError> {
    let ok = !pod.is_empty()
        && pod.len() <= 128
        && pod
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(BpfError::InvalidPod(pod.to_string()))
    }
}

impl DeviceFilter {
    /// Loads the program; its links are pinned in [`pin_dir`]`(node_pin_dir)`, where an earlier
    /// agent's are found. Attaches nothing.
    pub fn load(node_pin_dir: &Path) -> Result<Self, BpfError> {
        let object = object();
        if object.is_empty() {
            return Err(BpfError::NotBuilt);
        }
        let pin_dir = pin_dir(node_pin_dir);
        fs::prepare_pin_dir(&pin_dir)?;
        let mut ebpf = EbpfLoader::new()
            .load(object)
            .map_err(|e| BpfError::Load(Box::new(e)))?;
        program::<CgroupDevice>(&mut ebpf, DEVICES_PROG)?
            .load()
            .map_err(BpfError::program(DEVICES_PROG))?;
        Ok(DeviceFilter { ebpf, pin_dir })
    }

    /// Where the links are pinned.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Removes every pod's link pin (which detaches the program from the pods still
    /// running) and the pin directory. Missing pins are fine.
    pub fn remove_pins(node_pin_dir: &Path) -> Result<(), BpfError> {
        let dir = pin_dir(node_pin_dir);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(BpfError::io(&dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(BpfError::io(&dir))?;
            remove_file(&entry.path())?;
        }
        fs::remove_dir_if_empty(&dir)
    }
}

impl DeviceConfinement for DeviceFilter {
    fn confine(&mut self, pod: &str, cgroup_dir: &Path) -> Result<TcAttach, BpfError> {
        check_pod(pod)?;
        let id = cgroup_id(cgroup_dir)?;
        if !is_cgroup2(cgroup_dir).map_err(BpfError::io(cgroup_dir))? {
            return Err(BpfError::NotCgroup2(cgroup_dir.to_path_buf()));
        }
        let dir = File::open(cgroup_dir).map_err(BpfError::io(cgroup_dir))?;
        let pin = self.pin_dir.join(pod);
        let prog = program::<CgroupDevice>(&mut self.ebpf, DEVICES_PROG)?;
        let prog_fd = prog.fd().map_err(BpfError::program(DEVICES_PROG))?.as_fd();
        let mut outcome = TcAttach::Attached;
        match sys::obj_get(&pin) {
            Ok(link) => {
                let info = sys::cgroup_link_info(link.as_fd()).map_err(BpfError::io(&pin))?;
                if info.cgroup_id == id && info.attach_type == sys::BPF_CGROUP_DEVICE {
                    // An earlier agent's link on this very cgroup: swap this agent's program
                    // in; the hook is never without one.
                    sys::link_update(link.as_fd(), prog_fd).map_err(BpfError::io(&pin))?;
                    outcome = TcAttach::Adopted;
                } else {
                    // A link of a removed cgroup (a pod uid is never reused): this pin is its
                    // only reference besides `link`, so removing it releases the link.
                    remove_file(&pin)?;
                    outcome = TcAttach::Replaced;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(BpfError::io(&pin)(e)),
        }
        if outcome != TcAttach::Adopted {
            let link = sys::cgroup_link_create(prog_fd, dir.as_fd(), sys::BPF_CGROUP_DEVICE)
                .map_err(BpfError::io(cgroup_dir))?;
            // Closing `link` after pinning leaves the pin as the link's only reference.
            sys::obj_pin(link.as_fd(), &pin).map_err(BpfError::io(&pin))?;
        }
        tracing::debug!(pod, cgroup = %cgroup_dir.display(), ?outcome, "device filter attached");
        Ok(outcome)
    }

    fn release(&mut self, pod: &str) -> Result<(), BpfError> {
        check_pod(pod)?;
        remove_file(&self.pin_dir.join(pod))
    }

    fn confined(&self) -> Result<Vec<String>, BpfError> {
        let entries = std::fs::read_dir(&self.pin_dir).map_err(BpfError::io(&self.pin_dir))?;
        let mut pods = Vec::new();
        for entry in entries {
            let entry = entry.map_err(BpfError::io(&self.pin_dir))?;
            if let Some(name) = entry.file_name().to_str() {
                pods.push(name.to_string());
            }
        }
        Ok(pods)
    }
}

/// An in-memory [`DeviceConfinement`] for the agent's tests (feature `testing`): remembers
/// the confined pods and appends `devices: confine <pod>` / `devices: release <pod>` to a
/// shared journal when given one.
#[cfg(any(test, feature = "testing"))]
pub mod fake {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use super::{BpfError, DeviceConfinement, TcAttach};

    pub use crate::lb::fake::Journal;

    #[derive(Debug, Default)]
    pub struct FakeDevices {
        /// Pod uid → the cgroup it was confined in.
        pub confined: BTreeMap<String, PathBuf>,
        journal: Option<Journal>,
    }

    impl FakeDevices {
        /// Also appends `devices: <call>` lines to `journal`.
        pub fn with_journal(mut self, journal: Journal) -> Self {
            self.journal = Some(journal);
            self
        }

        fn log(&self, line: String) {
            if let Some(j) = &self.journal {
                j.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        }
    }

    impl DeviceConfinement for FakeDevices {
        fn confine(&mut self, pod: &str, cgroup_dir: &Path) -> Result<TcAttach, BpfError> {
            self.log(format!("devices: confine {pod}"));
            let before = self
                .confined
                .insert(pod.to_string(), cgroup_dir.to_path_buf());
            Ok(if before.is_some() {
                TcAttach::Adopted
            } else {
                TcAttach::Attached
            })
        }

        fn release(&mut self, pod: &str) -> Result<(), BpfError> {
            self.log(format!("devices: release {pod}"));
            self.confined.remove(pod);
            Ok(())
        }

        fn confined(&self) -> Result<Vec<String>, BpfError> {
            Ok(self.confined.keys().cloned().collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeds_the_device_program() {
        crate::tests::assert_embedded(object(), &[DEVICES_PROG]);
    }

    #[test]
    fn pins_live_below_the_node_pin_dir() {
        assert_eq!(
            pin_dir(&crate::node_pin_dir("n1")),
            PathBuf::from("/sys/fs/bpf/skiff/n1/devices")
        );
    }

    #[test]
    fn pod_uids_are_single_path_components() {
        check_pod("0b5c3e8a-1f2d-4c5b-9a7e-123456789abc").unwrap();
        for bad in ["", ".", "..", "a/b", "../x", "a b", &"x".repeat(129)] {
            assert!(check_pod(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn remove_pins_tolerates_a_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        DeviceFilter::remove_pins(&dir.path().join("absent")).unwrap();
        let node = dir.path().join("node");
        std::fs::create_dir_all(pin_dir(&node)).unwrap();
        std::fs::write(pin_dir(&node).join("pod-a"), b"").unwrap();
        DeviceFilter::remove_pins(&node).unwrap();
        assert!(!pin_dir(&node).exists());
    }
}
