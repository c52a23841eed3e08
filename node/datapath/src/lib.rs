//! The node agent's eBPF programs: loading the object that `build.rs` compiles from
//! `ebpf/skiff-ebpf`, pinning its maps, attaching programs to pod cgroups, reading the maps.
//!
//! Four objects: per-pod traffic accounting (this module), the Service load balancer
//! ([`lb`]: socket-level translation of ClusterIP Services), NetworkPolicy enforcement
//! ([`policy`]) and the pods' device confinement ([`devices`]: runc's default device allow
//! list, a `cgroup_device` program on every unprivileged pod's cgroup). The load balancer's
//! tc program also answers ARP for the LoadBalancer addresses this node announces
//! ([`lb::l2`]); the gratuitous ARP that starts an announcement is `skiff_hostnet::garp`'s.
//!
//! Accounting: two `cgroup_skb` programs (ingress, egress) count
//! packets and bytes per cgroup v2 id in per-CPU hash maps pinned under the agent's pin
//! directory (`/sys/fs/bpf/skiff/<node>/POD_INGRESS` and `.../POD_EGRESS`), so counters survive
//! an agent restart and `bpftool map dump pinned ...` shows them with named fields (BTF).
//!
//! Packets are keyed by the cgroup of the *socket* (`bpf_skb_cgroup_id`), which is the cgroup
//! of the process that created it, not by the cgroup the programs are attached to. Programs
//! attached to an ancestor run for every descendant (BPF links are multi-attach), so the agent
//! attaches once, to the node's pod cgroup parent, and a pod's traffic is the sum of the
//! counters of its containers' leaf cgroup ids; the pod cgroup's own id holds nothing (it has
//! no processes). `kernel_tests` checks both.
//! Byte counts are IP-level (`skb->len`: IP header onwards, no link-layer header); on egress a
//! GSO packet is counted once with its full length.
//!
//! This is the one crate that talks to the kernel's BPF side and the only one whose build needs
//! the nightly toolchain and bpf-linker (`build.rs` builds `ebpf/skiff-ebpf` with aya-build,
//! naming what is missing; `AYA_BUILD_SKIP=1` builds without the objects). The agent programs
//! it through narrow interfaces: [`lb::LbDatapath`] (implemented by [`lb::ServiceLb`]),
//! [`policy::PolicyDatapath`] and [`devices::DeviceConfinement`]; feature `testing` adds the
//! fakes (`lb::fake::FakeLb`: the same mirror and planner, recording planned writes instead of
//! making them; `devices::fake::FakeDevices`) and `testing`, the kernel-test fixtures shared
//! with the agent's kernel tests. Every pin lives under `/sys/fs/bpf/skiff/<node>/` and is
//! reused across agent restarts.
//!
//! The crate knows nothing of the API's types, never touches netfilter, and translates no
//! packet that is not to a frontend or of a recorded flow.

pub mod devices;
#[cfg(test)]
mod devices_kernel_tests;
mod fs;
#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod l2_kernel_tests;
pub mod lb;
#[cfg(test)]
mod lb_kernel_tests;
#[cfg(test)]
mod np_kernel_tests;
pub mod policy;
#[cfg(test)]
mod policy_kernel_tests;
mod sys;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::{
    collections::HashMap,
    fmt,
    fs::File,
    io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, MapError, PerCpuHashMap},
    programs::{
        CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, ProgramError, cgroup_skb::CgroupSkbLinkId,
    },
};
pub use fs::{BPFFS_ROOT, ensure_bpffs, is_bpffs, is_cgroup2};
pub use skiff_common::{MAX_PODS, TrafficCounters};
use skiff_common::{POD_EGRESS_MAP, POD_EGRESS_PROG, POD_INGRESS_MAP, POD_INGRESS_PROG};

/// The eBPF object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/skiff-ebpf"))
}

/// The agent's pin directory for node `node`: `/sys/fs/bpf/skiff/<node>`.
pub fn node_pin_dir(node: &str) -> PathBuf {
    Path::new(BPFFS_ROOT).join("skiff").join(node)
}

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error(
        "the node agent was built without its eBPF programs (AYA_BUILD_SKIP); \
         run `cargo xtask setup` and rebuild"
    )]
    NotBuilt,
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mounting a BPF filesystem at {path}: {source}")]
    MountBpffs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0} is not on a BPF filesystem (mount one: `mount -t bpf bpf <dir>`)")]
    NotBpffs(PathBuf),
    #[error("{0} is not a cgroup v2 directory")]
    NotCgroup2(PathBuf),
    #[error("max pods must be at least 1")]
    ZeroCapacity,
    #[error("loading the eBPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("the eBPF object has no {kind} named {name}")]
    Missing {
        kind: &'static str,
        name: &'static str,
    },
    #[error("eBPF program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<MapError>,
    },
    #[error("{0:?} is not a valid pod uid")]
    InvalidPod(String),
    #[error("the accounting programs are not attached to cgroup {0}")]
    NotAttached(u64),
    #[error("eBPF link of {name}: {source}")]
    Link {
        name: &'static str,
        #[source]
        source: Box<aya::programs::links::LinkError>,
    },
    #[error("pinning {path}: {source}")]
    Pin {
        path: PathBuf,
        #[source]
        source: Box<aya::pin::PinError>,
    },
    #[error("pinned map {path} cannot be reused: {reason}")]
    IncompatiblePin { path: PathBuf, reason: String },
    #[error("--lb-maglev-table-size: {0}")]
    MaglevTableSize(#[from] lb::maglev::TableSizeError),
    #[error("reading the LB programs' debug records: {0}")]
    DebugLog(String),
    #[error("{0} is not a programmed service")]
    NoSuchService(lb::Frontend),
    #[error(transparent)]
    Plan(#[from] lb::PlanError),
}

impl BpfError {
    fn program(name: &'static str) -> impl FnOnce(ProgramError) -> Self {
        move |source| Self::Program {
            name,
            source: Box::new(source),
        }
    }

    fn map(name: &'static str) -> impl FnOnce(MapError) -> Self {
        move |source| Self::Map {
            name,
            source: Box::new(source),
        }
    }

    fn io(path: &Path) -> impl FnOnce(io::Error) -> Self + use<> {
        let path = path.to_path_buf();
        move |source| Self::Io { path, source }
    }
}

/// The cgroup id of a cgroup v2 directory: its inode number, the value the kernel's
/// `bpf_skb_cgroup_id` / `bpf_get_current_cgroup_id` return for it.
pub fn cgroup_id(cgroup_dir: &Path) -> Result<u64, BpfError> {
    Ok(std::fs::metadata(cgroup_dir)
        .map_err(BpfError::io(cgroup_dir))?
        .ino())
}

/// Map values as aya reads them: [`TrafficCounters`] is defined in the `no_std` shared crate,
/// which does not depend on aya, so it gets its `Pod` impl through this wrapper.
#[repr(transparent)]
#[derive(Clone, Copy)]
struct AyaTrafficCounters(TrafficCounters);

// SAFETY: `TrafficCounters` is `#[repr(C)]`, two `u64`s with no padding, and every bit pattern is
// a valid value; `AyaTrafficCounters` is a transparent wrapper around it.
unsafe impl aya::Pod for AyaTrafficCounters {}

type CounterMap = PerCpuHashMap<MapData, u64, AyaTrafficCounters>;

/// The two links that attach the accounting programs to one cgroup.
struct Attachment {
    ingress: CgroupSkbLinkId,
    egress: CgroupSkbLinkId,
}

/// Per-pod traffic accounting: the loaded programs, their pinned maps and the cgroups they are
/// attached to. Dropping it detaches the programs from every cgroup and unloads them; the
/// pinned maps (and the counters in them) stay until [`Accounting::unpin`] or
/// [`Accounting::remove_pins`].
pub struct Accounting {
    ebpf: Ebpf,
    ingress: CounterMap,
    egress: CounterMap,
    pin_dir: PathBuf,
    attached: HashMap<u64, Attachment>,
}

impl fmt::Debug for Accounting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut attached: Vec<_> = self.attached.keys().collect();
        attached.sort();
        f.debug_struct("Accounting")
            .field("pin_dir", &self.pin_dir)
            .field("attached", &attached)
            .finish_non_exhaustive()
    }
}

impl Accounting {
    /// Loads the programs with room for [`MAX_PODS`] pods, pinning (or reusing already pinned)
    /// maps in `pin_dir`. See [`Accounting::load_with_capacity`].
    pub fn load(pin_dir: &Path) -> Result<Self, BpfError> {
        Self::load_with_capacity(pin_dir, MAX_PODS)
    }

    /// Loads the programs, with maps sized for `max_pods` cgroups each, pinned in `pin_dir`
    /// (e.g. [`node_pin_dir`]). If `pin_dir` is below [`BPFFS_ROOT`] and no BPF filesystem is
    /// mounted there, one is mounted. Maps already pinned in `pin_dir` (by an earlier run of
    /// the agent) are reused as they are, counters and size included.
    pub fn load_with_capacity(pin_dir: &Path, max_pods: u32) -> Result<Self, BpfError> {
        let object = object();
        if object.is_empty() {
            return Err(BpfError::NotBuilt);
        }
        if max_pods == 0 {
            return Err(BpfError::ZeroCapacity);
        }
        fs::prepare_pin_dir(pin_dir)?;
        let mut ebpf = EbpfLoader::new()
            // Applies to maps declared pin-by-name; aya-ebpf 0.2's BTF maps cannot declare
            // that, so the accounting maps are pinned explicitly below.
            .default_map_pin_directory(pin_dir)
            .map_pin_path(POD_INGRESS_MAP, fs::pin_path(pin_dir, POD_INGRESS_MAP))
            .map_pin_path(POD_EGRESS_MAP, fs::pin_path(pin_dir, POD_EGRESS_MAP))
            .map_max_entries(POD_INGRESS_MAP, max_pods)
            .map_max_entries(POD_EGRESS_MAP, max_pods)
            .load(object)
            .map_err(|e| BpfError::Load(Box::new(e)))?;
        for name in [POD_INGRESS_PROG, POD_EGRESS_PROG] {
            program(&mut ebpf, name)?
                .load()
                .map_err(BpfError::program(name))?;
        }
        let ingress = take_map(&mut ebpf, POD_INGRESS_MAP)?;
        let egress = take_map(&mut ebpf, POD_EGRESS_MAP)?;
        Ok(Self {
            ebpf,
            ingress,
            egress,
            pin_dir: pin_dir.to_path_buf(),
            attached: HashMap::new(),
        })
    }

    /// Where the maps are pinned.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Attaches the ingress and egress programs to the cgroup v2 directory `cgroup_dir` and
    /// returns its cgroup id. Attaching an already attached cgroup is a no-op. Other programs
    /// attached to the same cgroup (or its ancestors) keep running: the attachment is a BPF
    /// link, which the kernel always adds in multi-attach mode.
    pub fn attach(&mut self, cgroup_dir: &Path) -> Result<u64, BpfError> {
        let id = cgroup_id(cgroup_dir)?;
        if self.attached.contains_key(&id) {
            return Ok(id);
        }
        if !is_cgroup2(cgroup_dir).map_err(BpfError::io(cgroup_dir))? {
            return Err(BpfError::NotCgroup2(cgroup_dir.to_path_buf()));
        }
        let dir = File::open(cgroup_dir).map_err(BpfError::io(cgroup_dir))?;
        // aya attaches with a BPF link (kernel >= 5.7). Links always coexist with other
        // programs on the cgroup (the kernel treats them as BPF_F_ALLOW_MULTI) and reject any
        // explicit flag with EINVAL, so the mode must be `Single` (no flags) here.
        let mode = CgroupAttachMode::Single;
        let ingress = program(&mut self.ebpf, POD_INGRESS_PROG)?
            .attach(&dir, CgroupSkbAttachType::Ingress, mode)
            .map_err(BpfError::program(POD_INGRESS_PROG))?;
        let egress = match program(&mut self.ebpf, POD_EGRESS_PROG)?.attach(
            &dir,
            CgroupSkbAttachType::Egress,
            mode,
        ) {
            Ok(link) => link,
            Err(e) => {
                // Best effort: the ingress link would otherwise stay until drop.
                if let Ok(prog) = program(&mut self.ebpf, POD_INGRESS_PROG) {
                    let _ = prog.detach(ingress);
                }
                return Err(BpfError::program(POD_EGRESS_PROG)(e));
            }
        };
        self.attached.insert(id, Attachment { ingress, egress });
        Ok(id)
    }

    /// Detaches both programs from the cgroup with id `cgroup_id` (as returned by
    /// [`Accounting::attach`]). Its counters stay in the maps until [`Accounting::forget`].
    /// Works after the cgroup was removed, too (the kernel already dropped the attachment).
    pub fn detach(&mut self, cgroup_id: u64) -> Result<(), BpfError> {
        let Attachment { ingress, egress } = self
            .attached
            .remove(&cgroup_id)
            .ok_or(BpfError::NotAttached(cgroup_id))?;
        let ingress = program(&mut self.ebpf, POD_INGRESS_PROG)?
            .detach(ingress)
            .map_err(BpfError::program(POD_INGRESS_PROG));
        let egress = program(&mut self.ebpf, POD_EGRESS_PROG)?
            .detach(egress)
            .map_err(BpfError::program(POD_EGRESS_PROG));
        ingress.and(egress)
    }

    /// Whether the programs are attached to the cgroup with id `cgroup_id`.
    pub fn is_attached(&self, cgroup_id: u64) -> bool {
        self.attached.contains_key(&cgroup_id)
    }

    /// The ids of the cgroups the programs are attached to, in no particular order.
    pub fn attached(&self) -> impl Iterator<Item = u64> + '_ {
        self.attached.keys().copied()
    }

    /// The `(ingress, egress)` traffic of the cgroup with id `cgroup_id`, summed over CPUs.
    /// A cgroup without traffic (or never attached) has zero counters.
    pub fn counters(&self, cgroup_id: u64) -> Result<(TrafficCounters, TrafficCounters), BpfError> {
        Ok((
            read(&self.ingress, POD_INGRESS_MAP, cgroup_id)?,
            read(&self.egress, POD_EGRESS_MAP, cgroup_id)?,
        ))
    }

    /// The cgroup ids that have counters in either map (sorted, deduplicated).
    pub fn cgroup_ids(&self) -> Result<Vec<u64>, BpfError> {
        let mut ids = Vec::new();
        for (map, name) in [
            (&self.ingress, POD_INGRESS_MAP),
            (&self.egress, POD_EGRESS_MAP),
        ] {
            for key in map.keys() {
                ids.push(key.map_err(BpfError::map(name))?);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// Removes the counters of the cgroup with id `cgroup_id` from both maps (e.g. once its pod
    /// is gone). Missing entries are not an error.
    pub fn forget(&mut self, cgroup_id: u64) -> Result<(), BpfError> {
        let ingress = remove(&mut self.ingress, POD_INGRESS_MAP, cgroup_id);
        let egress = remove(&mut self.egress, POD_EGRESS_MAP, cgroup_id);
        ingress.and(egress)
    }

    /// Detaches and unloads everything, then removes the pinned maps and the (then empty) pin
    /// directory: the counters are gone for good.
    pub fn unpin(self) -> Result<(), BpfError> {
        let pin_dir = self.pin_dir.clone();
        drop(self);
        Self::remove_pins(&pin_dir)
    }

    /// Removes the accounting maps pinned in `pin_dir`, and `pin_dir` itself if that leaves it
    /// empty. For cleaning up after a run whose [`Accounting`] is gone (tests, uninstall).
    /// Missing pins are not an error.
    pub fn remove_pins(pin_dir: &Path) -> Result<(), BpfError> {
        for map in [POD_INGRESS_MAP, POD_EGRESS_MAP] {
            let pin = fs::pin_path(pin_dir, map);
            match std::fs::remove_file(&pin) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(BpfError::io(&pin)(e)),
            }
        }
        fs::remove_dir_if_empty(pin_dir)
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut CgroupSkb, BpfError> {
    lb::bpf::program(ebpf, name)
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<CounterMap, BpfError> {
    let map = ebpf
        .take_map(name)
        .ok_or(BpfError::Missing { kind: "map", name })?;
    CounterMap::try_from(map).map_err(BpfError::map(name))
}

fn read(map: &CounterMap, name: &'static str, cgroup_id: u64) -> Result<TrafficCounters, BpfError> {
    match map.get(&cgroup_id, 0) {
        Ok(per_cpu) => Ok(TrafficCounters::sum(per_cpu.iter().map(|c| &c.0))),
        Err(MapError::KeyNotFound) => Ok(TrafficCounters::default()),
        Err(e) => Err(BpfError::map(name)(e)),
    }
}

fn remove(map: &mut CounterMap, name: &'static str, cgroup_id: u64) -> Result<(), BpfError> {
    match map.remove(&cgroup_id) {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BpfError::map(name)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks an embedded eBPF object: an ELF with BTF that names every one of `names` (maps,
    /// programs, BTF types). An empty object (built with `AYA_BUILD_SKIP=1`) is skipped.
    pub(crate) fn assert_embedded(obj: &[u8], names: &[&str]) {
        if obj.is_empty() {
            return;
        }
        assert_eq!(&obj[..4], b"\x7fELF");
        let has = |needle: &[u8]| obj.windows(needle.len()).any(|w| w == needle);
        assert!(has(b".BTF"), "object lacks BTF");
        for name in names {
            assert!(has(name.as_bytes()), "the object has no {name}");
        }
    }

    #[test]
    fn embeds_an_elf_object_with_btf() {
        assert_embedded(
            object(),
            &["TrafficCounters", POD_INGRESS_PROG, POD_EGRESS_MAP],
        );
    }

    #[test]
    fn node_pin_dir_is_under_bpffs() {
        assert_eq!(node_pin_dir("n1"), PathBuf::from("/sys/fs/bpf/skiff/n1"));
    }

    #[test]
    fn cgroup_id_is_the_inode_number() {
        let dir = tempfile::tempdir().unwrap();
        let ino = std::fs::metadata(dir.path()).unwrap().ino();
        assert_eq!(cgroup_id(dir.path()).unwrap(), ino);
        assert!(matches!(
            cgroup_id(&dir.path().join("absent")),
            Err(BpfError::Io { .. })
        ));
    }

    #[test]
    fn refuses_to_attach_outside_cgroup2() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_cgroup2(dir.path()).unwrap());
    }

    #[test]
    fn remove_pins_tolerates_missing_pins() {
        let dir = tempfile::tempdir().unwrap();
        let pins = dir.path().join("pins");
        std::fs::create_dir(&pins).unwrap();
        std::fs::write(pins.join(POD_INGRESS_MAP), b"").unwrap();
        Accounting::remove_pins(&pins).unwrap();
        assert!(!pins.exists());
        Accounting::remove_pins(&pins).unwrap();
    }
}
