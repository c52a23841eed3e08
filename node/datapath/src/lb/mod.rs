//! The Service load balancer's kernel side: loads the `skiff-lb` object (a second object next
//! to accounting's, so each is loaded, pinned and sized on its own), pins its maps under the
//! agent's pin directory `/sys/fs/bpf/skiff/<node>/` (`LB_SERVICES`, `LB_SLOTS`,
//! `LB_BACKENDS`, `LB_COUNTERS`, `LB_REVNAT`, `LB_AFFINITY`), attaches its eight
//! `cgroup_sock_addr` programs (connect, sendmsg, recvmsg, getpeername for IPv4 and IPv6) to the node's pod cgroup parent through *pinned* BPF links
//! (`link_skiff_lb_connect4`, …), and programs the maps through a typed API.
//!
//! Restarts: maps already pinned are reused as they are (entries, counters, sizes), so the
//! data path and the sockets it translated keep working while the agent is away. The links
//! are pinned too, so the programs stay attached when the agent exits; a new agent finds a
//! link pin, checks with `BPF_OBJ_GET_INFO_BY_FD` that it is a cgroup link of the right hook
//! on the right cgroup, and swaps its own freshly loaded program into it with
//! `BPF_LINK_UPDATE` (atomic: the hook never runs without a program, and nothing is attached
//! twice). A pin for another or a removed cgroup is unpinned and a new link is made. The
//! in-memory mirror of the maps ([`state::LbState`]) is rebuilt from their contents, and what
//! a crash left half-written is repaired, before any change is made; unchanged services are
//! then not rewritten at all.
//!
//! NodePort from outside the node: the same object holds `skiff_np_ingress`, a tc program
//! (see its docs in `ebpf/skiff-ebpf/src/lb/`) sharing these maps plus the `NP_CT` LRU
//! conntrack map. [`ServiceLb::attach_tc`] attaches it as a TCX ingress link on one device
//! (the node's uplink at start, every pod host veth as pods attach), pinned as
//! `link_np_<ifname>`; an earlier agent's link for the same device is taken over with
//! `BPF_LINK_UPDATE` like the cgroup links, one for a device that is gone (the kernel already
//! detached it) is unpinned and replaced. TCX attaches to the network namespace of the
//! calling thread: the caller runs it inside the node namespace.
//!
//! Pod networking fast path: the same tc program then delivers packets for local pods with
//! `bpf_redirect_peer` and forwards pods' other packets with `bpf_fib_lookup` +
//! `bpf_redirect_neigh`, bypassing the node's IP stack. It reads `POD_ENDPOINTS` (pod address
//! → host veth ifindex and MACs, written through [`ServiceLb::set_pod_endpoint`] /
//! [`ServiceLb::remove_pod_endpoint`]) and counts into the per-CPU `FP_COUNTERS`
//! ([`ServiceLb::fast_path_counters`]); both are pinned with the other maps.
//!
//! Map sizes come from [`LbConfig`] when the maps are created; pinned maps keep the size they
//! were created with (remove the pins, e.g. `skiff-node purge`, to resize).

pub mod debug;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod maglev;
pub(crate) mod pod;
pub mod state;

use std::fmt;
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use aya::maps::{
    HashMap, IterableMap, MapData, MapError, MapInfo, PerCpuArray, PerCpuHashMap, PerCpuValues,
};
use aya::programs::tc::TcAttachOptions;
use aya::programs::{
    CgroupAttachMode, CgroupSockAddr, LinkOrder, Program, ProgramError, SchedClassifier,
    TcAttachType, links::FdLink,
};
use aya::{Ebpf, EbpfLoader};
use nix::errno::Errno;
use serde::Serialize;
use skiff_common::lb::{
    AF_INET, AF_INET6, LB_AFFINITY_MAP, LB_BACKENDS_MAP, LB_CONNECT4_PROG, LB_CONNECT6_PROG,
    LB_COUNTERS_MAP, LB_DEBUG_GLOBAL, LB_DEFAULT_MAX_AFFINITY, LB_DEFAULT_MAX_BACKENDS,
    LB_DEFAULT_MAX_NP_CT, LB_DEFAULT_MAX_REVNAT, LB_DEFAULT_MAX_SERVICES, LB_GETPEERNAME4_PROG,
    LB_GETPEERNAME6_PROG, LB_MAGLEV_DEFAULT_M, LB_MAGLEV_MAP, LB_MAGLEV_MAX_M, LB_MAPS,
    LB_RECVMSG4_PROG, LB_RECVMSG6_PROG, LB_REVNAT_MAP, LB_SENDMSG4_PROG, LB_SENDMSG6_PROG,
    LB_SERVICES_MAP, LB_SLOTS_MAP, LbAffinity, LbAffinityKey, LbBackend, LbCounters, LbMaglev,
    LbRevNat, LbRevNatKey, LbService, LbServiceKey, LbSlotKey, NP_CT_MAP, NP_INGRESS_PROG,
    NpCtEntry, NpCtKey,
};
use skiff_common::podnet::{FP_COUNTERS_MAP, POD_ENDPOINTS_MAP, PodEndpointKey};
pub use skiff_common::podnet::{FastPathCounters, PodEndpoint};

use super::{BpfError, cgroup_id, fs, is_cgroup2, sys};
use pod::P;
pub use state::{BackendAddr, Frontend, LbState, Op, PlanError, Protocol, ServiceParams};

/// The `skiff-lb` object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/skiff-lb"))
}

/// Sizes of the LB maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbConfig {
    /// Frontends (Service ports): `LB_SERVICES`.
    pub max_services: u32,
    /// Backends over all services: `LB_BACKENDS`, `LB_SLOTS`, `LB_COUNTERS`.
    pub max_backends: u32,
    /// Sockets remembered for reverse translation (LRU): `LB_REVNAT`.
    pub max_revnat: u32,
    /// (client netns, service) affinity entries (LRU): `LB_AFFINITY`.
    pub max_affinity: u32,
    /// NodePort conntrack entries, two per flow (LRU): `NP_CT`.
    pub max_np_ct: u32,
    /// Entries of each NodePort service's Maglev table (`LB_MAGLEV`): a prime up to
    /// `LB_MAGLEV_MAX_M` ([`maglev::check_table_size`]).
    pub maglev_table_size: u32,
    /// Whether the programs log every translation (aya-log debug records, see [`debug`]).
    /// Fixed when the programs are loaded; off costs nothing on the hot path.
    pub debug: bool,
}

impl Default for LbConfig {
    fn default() -> Self {
        LbConfig {
            max_services: LB_DEFAULT_MAX_SERVICES,
            max_backends: LB_DEFAULT_MAX_BACKENDS,
            max_revnat: LB_DEFAULT_MAX_REVNAT,
            max_affinity: LB_DEFAULT_MAX_AFFINITY,
            max_np_ct: LB_DEFAULT_MAX_NP_CT,
            maglev_table_size: LB_MAGLEV_DEFAULT_M,
            debug: false,
        }
    }
}

/// One program and the hook it runs at.
struct Hook {
    prog: &'static str,
    /// `enum bpf_attach_type`, to recognise an earlier agent's link.
    attach_type: u32,
}

/// Every socket-LB hook, IPv4 then IPv6; attach, takeover and detach all walk this list.
const HOOKS: [Hook; 8] = [
    Hook {
        prog: LB_CONNECT4_PROG,
        attach_type: sys::BPF_CGROUP_INET4_CONNECT,
    },
    Hook {
        prog: LB_SENDMSG4_PROG,
        attach_type: sys::BPF_CGROUP_UDP4_SENDMSG,
    },
    Hook {
        prog: LB_RECVMSG4_PROG,
        attach_type: sys::BPF_CGROUP_UDP4_RECVMSG,
    },
    Hook {
        prog: LB_GETPEERNAME4_PROG,
        attach_type: sys::BPF_CGROUP_INET4_GETPEERNAME,
    },
    Hook {
        prog: LB_CONNECT6_PROG,
        attach_type: sys::BPF_CGROUP_INET6_CONNECT,
    },
    Hook {
        prog: LB_SENDMSG6_PROG,
        attach_type: sys::BPF_CGROUP_UDP6_SENDMSG,
    },
    Hook {
        prog: LB_RECVMSG6_PROG,
        attach_type: sys::BPF_CGROUP_UDP6_RECVMSG,
    },
    Hook {
        prog: LB_GETPEERNAME6_PROG,
        attach_type: sys::BPF_CGROUP_INET6_GETPEERNAME,
    },
];

/// Where the link of `prog` is pinned.
pub(crate) fn link_pin(pin_dir: &Path, prog: &str) -> PathBuf {
    pin_dir.join(format!("link_{prog}"))
}

/// How [`ServiceLb::attach`] found each hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttachReport {
    /// Links made now.
    pub attached: u32,
    /// Links of an earlier agent on the same cgroup, now running this agent's programs.
    pub adopted: u32,
    /// Pinned links for another (or a removed) cgroup, unpinned and replaced.
    pub replaced: u32,
}

type ServicesMap = HashMap<MapData, P<LbServiceKey>, P<LbService>>;
type SlotsMap = HashMap<MapData, P<LbSlotKey>, u32>;
type BackendsMap = HashMap<MapData, u32, P<LbBackend>>;
type CountersMap = PerCpuHashMap<MapData, u32, P<LbCounters>>;
type RevNatMap = HashMap<MapData, P<LbRevNatKey>, P<LbRevNat>>;
type AffinityMap = HashMap<MapData, P<LbAffinityKey>, P<LbAffinity>>;
type NpCtMap = HashMap<MapData, P<NpCtKey>, P<NpCtEntry>>;
type MaglevMap = HashMap<MapData, u32, P<LbMaglev>>;
type PodEndpointsMap = HashMap<MapData, P<PodEndpointKey>, P<PodEndpoint>>;
type FpCountersMap = PerCpuArray<MapData, P<FastPathCounters>>;

/// Prefix of the pinned TCX links of the NodePort program (`link_np_<ifname>`).
const NP_LINK_PREFIX: &str = "link_np_";

/// Where the NodePort link of device `ifname` is pinned.
fn np_link_pin(pin_dir: &Path, ifname: &str) -> PathBuf {
    pin_dir.join(format!("{NP_LINK_PREFIX}{ifname}"))
}

/// How [`ServiceLb::attach_tc`] found a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcAttach {
    /// A new link.
    Attached,
    /// An earlier agent's link on this device, now running this agent's program.
    Adopted,
    /// A stale pin (device gone or another device of that name) replaced by a new link.
    Replaced,
}

/// What the node agent needs from the Service load balancer's kernel side: programming
/// frontends and backends, the pod fast path's endpoints and tc links, and reading it all
/// back. [`ServiceLb`] is the kernel implementation; `fake::FakeLb` (feature `testing`) an
/// in-memory one that records the planned map writes, so the agent's service reconciler and
/// pod worker are tested without root.
pub trait LbDatapath: Send {
    /// The mirror of the programmed maps.
    fn state(&self) -> &LbState;
    /// Makes `frontend` a service with `params` and exactly `backends`, writing only what
    /// differs; returns the number of map writes.
    fn sync_service(
        &mut self,
        frontend: Frontend,
        params: ServiceParams,
        backends: &[BackendAddr],
    ) -> Result<usize, BpfError>;
    /// Removes `frontend` and its backends; returns the number of map writes.
    fn remove_service(&mut self, frontend: &Frontend) -> Result<usize, BpfError>;
    /// Every programmed frontend with its backends and their counters.
    fn dump(&self) -> Result<Vec<ServiceDump>, BpfError>;
    /// Entries and capacity of every map.
    fn pressure(&self) -> Result<Vec<MapPressure>, BpfError>;
    /// Attaches the tc program to device `ifname` of the calling thread's network namespace.
    fn attach_tc(&mut self, ifname: &str) -> Result<TcAttach, BpfError>;
    /// Detaches the tc program from device `ifname` (missing is not an error).
    fn detach_tc(&mut self, ifname: &str) -> Result<(), BpfError>;
    /// Makes `ip` a local pod of the fast path.
    fn set_pod_endpoint(&mut self, ip: Ipv4Addr, ep: PodEndpoint) -> Result<(), BpfError>;
    /// Forgets the local pod `ip` (missing is not an error).
    fn remove_pod_endpoint(&mut self, ip: Ipv4Addr) -> Result<(), BpfError>;
    /// Every local pod of the fast path.
    fn pod_endpoints(&self) -> Result<Vec<(IpAddr, PodEndpoint)>, BpfError>;
    /// The fast path's counters, summed over CPUs.
    fn fast_path_counters(&self) -> Result<FastPathCounters, BpfError>;
    /// The NodePort conntrack entries (both directions of every flow).
    fn conntrack(&self) -> Result<Vec<(NpCtKey, NpCtEntry)>, BpfError>;
    /// The frontend (address and port) the socket with `cookie` asked for when the load
    /// balancer sent it to `backend:port`, while it remembers that socket (`LB_REVNAT`).
    fn frontend_of(&self, cookie: u64, backend: IpAddr, port: u16) -> Option<(IpAddr, u16)>;
}

impl LbDatapath for ServiceLb {
    fn state(&self) -> &LbState {
        ServiceLb::state(self)
    }
    fn sync_service(
        &mut self,
        frontend: Frontend,
        params: ServiceParams,
        backends: &[BackendAddr],
    ) -> Result<usize, BpfError> {
        ServiceLb::sync_service(self, frontend, params, backends)
    }
    fn remove_service(&mut self, frontend: &Frontend) -> Result<usize, BpfError> {
        ServiceLb::remove_service(self, frontend)
    }
    fn dump(&self) -> Result<Vec<ServiceDump>, BpfError> {
        ServiceLb::dump(self)
    }
    fn pressure(&self) -> Result<Vec<MapPressure>, BpfError> {
        ServiceLb::pressure(self)
    }
    fn attach_tc(&mut self, ifname: &str) -> Result<TcAttach, BpfError> {
        ServiceLb::attach_tc(self, ifname)
    }
    fn detach_tc(&mut self, ifname: &str) -> Result<(), BpfError> {
        ServiceLb::detach_tc(&self.pin_dir, ifname)
    }
    fn set_pod_endpoint(&mut self, ip: Ipv4Addr, ep: PodEndpoint) -> Result<(), BpfError> {
        ServiceLb::set_pod_endpoint(self, ip, ep)
    }
    fn remove_pod_endpoint(&mut self, ip: Ipv4Addr) -> Result<(), BpfError> {
        ServiceLb::remove_pod_endpoint(self, ip)
    }
    fn pod_endpoints(&self) -> Result<Vec<(IpAddr, PodEndpoint)>, BpfError> {
        ServiceLb::pod_endpoints(self)
    }
    fn fast_path_counters(&self) -> Result<FastPathCounters, BpfError> {
        ServiceLb::fast_path_counters(self)
    }
    fn conntrack(&self) -> Result<Vec<(NpCtKey, NpCtEntry)>, BpfError> {
        ServiceLb::conntrack(self)
    }
    fn frontend_of(&self, cookie: u64, backend: IpAddr, port: u16) -> Option<(IpAddr, u16)> {
        let (addr, family) = match backend {
            IpAddr::V4(ip) => (
                skiff_common::lb::v4_addr(u32::from_ne_bytes(ip.octets())),
                AF_INET,
            ),
            IpAddr::V6(ip) => (ip.octets(), AF_INET6),
        };
        let key = LbRevNatKey {
            cookie,
            addr,
            port,
            family,
            _pad: [0; 5],
        };
        let v = self.maps.revnat.get(&P(key), 0).ok()?.0;
        let ip = if v.family == AF_INET6 {
            IpAddr::V6(std::net::Ipv6Addr::from(v.addr))
        } else {
            IpAddr::V4(Ipv4Addr::new(v.addr[0], v.addr[1], v.addr[2], v.addr[3]))
        };
        Some((ip, v.port))
    }
}

struct Maps {
    services: ServicesMap,
    slots: SlotsMap,
    backends: BackendsMap,
    counters: CountersMap,
    revnat: RevNatMap,
    affinity: AffinityMap,
    np_ct: NpCtMap,
    maglev: MaglevMap,
    pod_endpoints: PodEndpointsMap,
    fp_counters: FpCountersMap,
    nr_cpus: usize,
}

/// The Service load balancer: loaded programs, pinned maps, the mirror of what is programmed.
/// Dropping it leaves programs attached (pinned links) and maps pinned: the data path keeps
/// running without the agent. [`ServiceLb::remove_pins`] takes it all down.
pub struct ServiceLb {
    ebpf: Ebpf,
    maps: Maps,
    state: LbState,
    pin_dir: PathBuf,
    attached_to: Option<u64>,
    /// Maglev tables of the NodePort services as written to `LB_MAGLEV` (service id →
    /// backend ids), and the size new tables get.
    maglev: std::collections::BTreeMap<u32, Vec<u32>>,
    maglev_m: u32,
    /// The programs were loaded with debug records on ([`LbConfig::debug`]), and the thread
    /// that reads them once started.
    debug: bool,
    debug_reader: Option<debug::Reader>,
}

impl fmt::Debug for ServiceLb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceLb")
            .field("pin_dir", &self.pin_dir)
            .field("attached_to", &self.attached_to)
            .field("services", &self.state.service_count())
            .field("backends", &self.state.backend_count())
            .finish_non_exhaustive()
    }
}

/// Summed counters of one backend.
pub type Counters = LbCounters;

/// A backend of a [`ServiceDump`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendDump {
    pub id: u32,
    pub slot: u32,
    pub ip: IpAddr,
    pub port: u16,
    /// `ip:port` (`[ip]:port` for IPv6).
    pub address: String,
    pub connects: u64,
    pub sends: u64,
}

/// One programmed frontend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceDump {
    pub id: u32,
    /// `ip:port/PROTOCOL`.
    pub frontend: String,
    pub ip: IpAddr,
    pub port: u16,
    pub protocol: &'static str,
    /// `None` or `ClientIP`.
    pub session_affinity: &'static str,
    pub affinity_timeout_seconds: Option<u32>,
    pub backends: Vec<BackendDump>,
    /// Sums over the backends.
    pub connects: u64,
    pub sends: u64,
}

/// How full one map is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MapPressure {
    pub map: &'static str,
    pub entries: u64,
    pub max_entries: u32,
}

impl ServiceLb {
    /// Loads the programs (verifying them), pinning the maps in `pin_dir` or reusing those an
    /// earlier agent pinned there, and rebuilds the mirror from them (repairing what a crash
    /// left half-written). Attaches nothing: see [`ServiceLb::attach`].
    pub fn load(pin_dir: &Path, cfg: LbConfig) -> Result<Self, BpfError> {
        let object = object();
        if object.is_empty() {
            return Err(BpfError::NotBuilt);
        }
        if cfg.max_services == 0
            || cfg.max_backends == 0
            || cfg.max_revnat == 0
            || cfg.max_affinity == 0
            || cfg.max_np_ct == 0
        {
            return Err(BpfError::ZeroCapacity);
        }
        maglev::check_table_size(cfg.maglev_table_size)?;
        fs::prepare_pin_dir(pin_dir)?;
        check_pins(pin_dir)?;
        let mut loader = EbpfLoader::new();
        for name in LB_MAPS {
            loader.map_pin_path(name, fs::pin_path(pin_dir, name));
        }
        loader
            .map_max_entries(LB_SERVICES_MAP, cfg.max_services)
            .map_max_entries(LB_SLOTS_MAP, cfg.max_backends)
            .map_max_entries(LB_BACKENDS_MAP, cfg.max_backends)
            .map_max_entries(LB_COUNTERS_MAP, cfg.max_backends)
            .map_max_entries(LB_REVNAT_MAP, cfg.max_revnat)
            .map_max_entries(LB_AFFINITY_MAP, cfg.max_affinity)
            .map_max_entries(NP_CT_MAP, cfg.max_np_ct)
            .map_max_entries(LB_MAGLEV_MAP, cfg.max_services);
        let debug = u8::from(cfg.debug);
        loader.override_global(LB_DEBUG_GLOBAL, &debug, true);
        let mut ebpf = loader
            .load(object)
            .map_err(|e| BpfError::Load(Box::new(e)))?;
        for hook in &HOOKS {
            program::<CgroupSockAddr>(&mut ebpf, hook.prog)?
                .load()
                .map_err(BpfError::program(hook.prog))?;
        }
        program::<SchedClassifier>(&mut ebpf, NP_INGRESS_PROG)?
            .load()
            .map_err(BpfError::program(NP_INGRESS_PROG))?;
        let nr_cpus = aya::util::nr_cpus().map_err(|(what, source)| BpfError::Io {
            path: PathBuf::from(what),
            source,
        })?;
        let maps = Maps {
            services: take_map(&mut ebpf, LB_SERVICES_MAP, ServicesMap::try_from)?,
            slots: take_map(&mut ebpf, LB_SLOTS_MAP, SlotsMap::try_from)?,
            backends: take_map(&mut ebpf, LB_BACKENDS_MAP, BackendsMap::try_from)?,
            counters: take_map(&mut ebpf, LB_COUNTERS_MAP, CountersMap::try_from)?,
            revnat: take_map(&mut ebpf, LB_REVNAT_MAP, RevNatMap::try_from)?,
            affinity: take_map(&mut ebpf, LB_AFFINITY_MAP, AffinityMap::try_from)?,
            np_ct: take_map(&mut ebpf, NP_CT_MAP, NpCtMap::try_from)?,
            maglev: take_map(&mut ebpf, LB_MAGLEV_MAP, MaglevMap::try_from)?,
            pod_endpoints: take_map(&mut ebpf, POD_ENDPOINTS_MAP, PodEndpointsMap::try_from)?,
            fp_counters: take_map(&mut ebpf, FP_COUNTERS_MAP, FpCountersMap::try_from)?,
            nr_cpus,
        };
        let max_services = max_entries(maps.services.map(), LB_SERVICES_MAP)?;
        let max_backends = max_entries(maps.backends.map(), LB_BACKENDS_MAP)?;
        let recovered = state::recover(
            max_services,
            max_backends,
            entries(&maps.services, LB_SERVICES_MAP)?
                .into_iter()
                .map(|(k, v)| (k.0, v.0))
                .collect(),
            entries(&maps.slots, LB_SLOTS_MAP)?
                .into_iter()
                .map(|(k, v)| (k.0, v))
                .collect(),
            entries(&maps.backends, LB_BACKENDS_MAP)?
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect(),
            keys(&maps.counters, LB_COUNTERS_MAP)?,
        );
        let mut lb = ServiceLb {
            ebpf,
            maps,
            state: recovered.state,
            pin_dir: pin_dir.to_path_buf(),
            attached_to: None,
            maglev: std::collections::BTreeMap::new(),
            maglev_m: cfg.maglev_table_size,
            debug: cfg.debug,
            debug_reader: None,
        };
        for key in &recovered.unreadable_services {
            remove(&mut lb.maps.services, LB_SERVICES_MAP, &P(*key))?;
        }
        // The mirror already reflects the repair; only the kernel needs the writes.
        for op in &recovered.repair {
            lb.maps.write(op)?;
        }
        if !recovered.repair.is_empty() || !recovered.unreadable_services.is_empty() {
            tracing::info!(
                writes = recovered.repair.len() + recovered.unreadable_services.len(),
                "repaired the pinned service maps"
            );
        }
        lb.recover_maglev()?;
        Ok(lb)
    }

    /// With [`LbConfig::debug`], starts handing the programs' debug records to `sink` (see
    /// [`debug`]) until this `ServiceLb` is dropped, and returns true; false (and nothing
    /// started) when debug records are off. Once: the ring buffer then belongs to the reader.
    pub fn start_debug_log<L: log::Log + Send + 'static>(
        &mut self,
        sink: L,
    ) -> Result<bool, BpfError> {
        if !self.debug || self.debug_reader.is_some() {
            return Ok(false);
        }
        let logger = aya_log::EbpfLogger::init_with_logger(&mut self.ebpf, sink)
            .map_err(|e| BpfError::DebugLog(e.to_string()))?;
        let reader = debug::Reader::start(logger).map_err(|e| BpfError::DebugLog(e.to_string()))?;
        self.debug_reader = Some(reader);
        Ok(true)
    }

    /// Where the maps and links are pinned.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// The mirror of the programmed maps.
    pub fn state(&self) -> &LbState {
        &self.state
    }

    /// Attaches the eight socket programs to the cgroup v2 directory `cgroup_dir` (normally the node's
    /// pod cgroup parent; programs on an ancestor run for the sockets of every descendant)
    /// through pinned links, or takes over the links an earlier agent pinned for that cgroup
    /// (swapping in this agent's programs). Returns the cgroup id and what it did.
    pub fn attach(&mut self, cgroup_dir: &Path) -> Result<(u64, AttachReport), BpfError> {
        let id = cgroup_id(cgroup_dir)?;
        if !is_cgroup2(cgroup_dir).map_err(BpfError::io(cgroup_dir))? {
            return Err(BpfError::NotCgroup2(cgroup_dir.to_path_buf()));
        }
        let mut report = AttachReport::default();
        let dir = File::open(cgroup_dir).map_err(BpfError::io(cgroup_dir))?;
        for hook in &HOOKS {
            let pin = link_pin(&self.pin_dir, hook.prog);
            let prog = program::<CgroupSockAddr>(&mut self.ebpf, hook.prog)?;
            let outcome = pinned_cgroup_link(&pin, id, hook.attach_type, hook.prog, prog, |p| {
                // A link always coexists with other programs on the cgroup; explicit flags
                // are rejected for links, hence `Single` (no flags).
                let link_id = p.attach(&dir, CgroupAttachMode::Single)?;
                p.take_link(link_id)
            })?;
            match outcome {
                TcAttach::Attached => report.attached += 1,
                TcAttach::Adopted => report.adopted += 1,
                TcAttach::Replaced => {
                    report.replaced += 1;
                    report.attached += 1;
                }
            }
        }
        self.attached_to = Some(id);
        Ok((id, report))
    }

    /// Attaches the NodePort program as a TCX ingress link on device `ifname` of the calling
    /// thread's network namespace, pinned as `link_np_<ifname>`, or takes over the link an
    /// earlier agent pinned for that very device.
    pub fn attach_tc(&mut self, ifname: &str) -> Result<TcAttach, BpfError> {
        let ifindex = ifindex(ifname)?;
        let pin = np_link_pin(&self.pin_dir, ifname);
        let prog = program::<SchedClassifier>(&mut self.ebpf, NP_INGRESS_PROG)?;
        let mut outcome = TcAttach::Attached;
        match sys::obj_get(&pin) {
            Ok(link) => {
                let same = sys::tcx_link_info(std::os::fd::AsFd::as_fd(&link))
                    .map(|i| i.ifindex == ifindex && i.attach_type == sys::BPF_TCX_INGRESS)
                    .unwrap_or(false);
                if same {
                    let prog_fd = prog.fd().map_err(BpfError::program(NP_INGRESS_PROG))?;
                    sys::link_update(
                        std::os::fd::AsFd::as_fd(&link),
                        std::os::fd::AsFd::as_fd(prog_fd),
                    )
                    .map_err(BpfError::io(&pin))?;
                    return Ok(TcAttach::Adopted);
                }
                remove_file(&pin)?;
                drop(link);
                outcome = TcAttach::Replaced;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(BpfError::io(&pin)(e)),
        }
        let link_id = prog
            .attach_with_options(
                ifname,
                TcAttachType::Ingress,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(BpfError::program(NP_INGRESS_PROG))?;
        let link = prog
            .take_link(link_id)
            .map_err(BpfError::program(NP_INGRESS_PROG))?;
        let link = FdLink::try_from(link).map_err(|e| BpfError::Link {
            name: NP_INGRESS_PROG,
            source: Box::new(e),
        })?;
        link.pin(&pin).map_err(|e| BpfError::Pin {
            path: pin.clone(),
            source: Box::new(e),
        })?;
        Ok(outcome)
    }

    /// Detaches the NodePort program from device `ifname` (removes its link pin; the kernel
    /// already detached it if the device is gone). Missing pins are not an error.
    pub fn detach_tc(pin_dir: &Path, ifname: &str) -> Result<(), BpfError> {
        remove_file(&np_link_pin(pin_dir, ifname))
    }

    /// The NodePort conntrack entries (both directions of every flow).
    pub fn conntrack(&self) -> Result<Vec<(NpCtKey, NpCtEntry)>, BpfError> {
        Ok(self
            .maps
            .np_ct
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k.0, v.0))
            .collect())
    }

    /// How many instructions the kernel kept of program `name` after verification (tests:
    /// the debug records' code is gone when they are off).
    #[cfg(test)]
    pub(crate) fn translated_size(&self, name: &str) -> Option<u32> {
        self.ebpf.program(name)?.info().ok()?.size_translated()
    }

    /// Deletes every NodePort conntrack entry (tests: replaying a 5-tuple as a new flow).
    #[cfg(test)]
    pub(crate) fn clear_conntrack(&mut self) -> Result<(), BpfError> {
        let keys: Vec<P<NpCtKey>> = self.maps.np_ct.keys().filter_map(Result::ok).collect();
        for k in keys {
            remove(&mut self.maps.np_ct, NP_CT_MAP, &k)?;
        }
        Ok(())
    }

    /// Makes `ip` a local pod for the fast path: packets to it are delivered into its
    /// namespace through its host veth `ep.ifindex` (IPv4 only: the program handles no IPv6).
    pub fn set_pod_endpoint(&mut self, ip: Ipv4Addr, ep: PodEndpoint) -> Result<(), BpfError> {
        self.maps
            .pod_endpoints
            .insert(P(pod_key(ip)), P(ep), 0)
            .map_err(BpfError::map(POD_ENDPOINTS_MAP))
    }

    /// Forgets the local pod `ip` (missing is not an error).
    pub fn remove_pod_endpoint(&mut self, ip: Ipv4Addr) -> Result<(), BpfError> {
        remove(
            &mut self.maps.pod_endpoints,
            POD_ENDPOINTS_MAP,
            &P(pod_key(ip)),
        )
    }

    /// Every local pod of the fast path, by address.
    pub fn pod_endpoints(&self) -> Result<Vec<(IpAddr, PodEndpoint)>, BpfError> {
        Ok(entries(&self.maps.pod_endpoints, POD_ENDPOINTS_MAP)?
            .into_iter()
            .filter_map(|(k, v)| {
                let k = k.0;
                let ip: IpAddr = match k.family {
                    skiff_common::lb::AF_INET => {
                        Ipv4Addr::new(k.addr[0], k.addr[1], k.addr[2], k.addr[3]).into()
                    }
                    skiff_common::lb::AF_INET6 => std::net::Ipv6Addr::from(k.addr).into(),
                    _ => return None,
                };
                Some((ip, v.0))
            })
            .collect())
    }

    /// The fast path's counters, summed over CPUs.
    pub fn fast_path_counters(&self) -> Result<FastPathCounters, BpfError> {
        let per_cpu = self
            .maps
            .fp_counters
            .get(&0, 0)
            .map_err(BpfError::map(FP_COUNTERS_MAP))?;
        Ok(FastPathCounters::sum(per_cpu.iter().map(|c| &c.0)))
    }

    /// The id of the cgroup [`ServiceLb::attach`] attached to.
    pub fn attached_to(&self) -> Option<u64> {
        self.attached_to
    }

    /// Makes `frontend` a service with `params` and exactly the backends `backends` (in the
    /// order given when new ids are handed out), changing only what differs. Returns the
    /// number of map writes (0: it was programmed so already).
    pub fn sync_service(
        &mut self,
        frontend: Frontend,
        params: ServiceParams,
        backends: &[BackendAddr],
    ) -> Result<usize, BpfError> {
        let ops = self.state.plan_set(frontend, params, backends)?;
        let writes = self.execute(&ops)?;
        Ok(writes + self.sync_maglev(&frontend)?)
    }

    /// Creates `frontend` (no backends: connections are refused) or changes its parameters,
    /// keeping its backends. Returns its service id.
    pub fn upsert_service(
        &mut self,
        frontend: Frontend,
        params: ServiceParams,
    ) -> Result<u32, BpfError> {
        let current = self.backends_of(&frontend);
        self.sync_service(frontend, params, &current)?;
        self.state
            .service(&frontend)
            .map(|s| s.id)
            .ok_or(BpfError::NoSuchService(frontend))
    }

    /// Sets the backends of the existing service `frontend`. Returns the number of writes.
    pub fn set_backends(
        &mut self,
        frontend: &Frontend,
        backends: &[BackendAddr],
    ) -> Result<usize, BpfError> {
        let params = self
            .state
            .service(frontend)
            .ok_or(BpfError::NoSuchService(*frontend))?
            .params;
        self.sync_service(*frontend, params, backends)
    }

    /// Removes `frontend` (its connections are no longer translated) and its backends.
    /// Returns the number of writes (0 if it was no service).
    pub fn remove_service(&mut self, frontend: &Frontend) -> Result<usize, BpfError> {
        let id = self.state.service(frontend).map(|s| s.id);
        let mut ops = self.state.plan_remove(frontend);
        ops.extend(self.state.plan_gc());
        let mut writes = self.execute(&ops)?;
        if let Some(id) = id {
            writes += self.write_maglev(id, None)?;
        }
        Ok(writes)
    }

    /// The backends of `frontend` in slot order.
    pub fn backends_of(&self, frontend: &Frontend) -> Vec<BackendAddr> {
        self.state
            .service(frontend)
            .map(|s| {
                s.slots
                    .iter()
                    .filter_map(|id| self.state.backend(*id).map(|b| b.addr))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn execute(&mut self, ops: &[Op]) -> Result<usize, BpfError> {
        for op in ops {
            self.maps.write(op)?;
            self.state.apply(op);
        }
        Ok(ops.len())
    }

    // -----------------------------------------------------------------------------------------
    // Maglev tables of the NodePort services (`LB_MAGLEV`)
    // -----------------------------------------------------------------------------------------

    /// The Maglev table `frontend` should have: for a NodePort service with backends, its
    /// service id and table; `None` otherwise (no table: the program picks at random).
    fn maglev_want(&self, frontend: &Frontend) -> Option<(u32, Vec<u32>)> {
        let view = self.state.service(frontend)?;
        if !view.params.node_port || view.slots.is_empty() {
            return None;
        }
        let backends: Vec<(u32, Vec<u8>)> = view
            .slots
            .iter()
            .filter_map(|id| {
                let b = self.state.backend(*id)?;
                let (addr, family) = state::lb_addr(b.addr.ip);
                let mut identity = vec![family];
                identity.extend_from_slice(&addr);
                identity.extend_from_slice(&b.addr.port.to_be_bytes());
                Some((*id, identity))
            })
            .collect();
        Some((view.id, maglev::table(&backends, self.maglev_m)))
    }

    /// Writes (or deletes, `None`) the Maglev table of service `id` if it differs from what
    /// the map holds: one map update. Returns the number of writes.
    fn write_maglev(&mut self, id: u32, table: Option<Vec<u32>>) -> Result<usize, BpfError> {
        if self.maglev.get(&id) == table.as_ref() {
            return Ok(0);
        }
        match table {
            Some(t) => {
                let mut value = Box::new(P(LbMaglev {
                    m: t.len() as u32,
                    _pad: 0,
                    table: [0; LB_MAGLEV_MAX_M as usize],
                }));
                value.0.table[..t.len()].copy_from_slice(&t);
                self.maps
                    .maglev
                    .insert(id, value.as_ref(), 0)
                    .map_err(BpfError::map(LB_MAGLEV_MAP))?;
                self.maglev.insert(id, t);
            }
            None => {
                match self.maps.maglev.remove(&id) {
                    Ok(()) | Err(MapError::KeyNotFound) => {}
                    Err(MapError::SyscallError(e))
                        if e.io_error.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(BpfError::map(LB_MAGLEV_MAP)(e)),
                }
                self.maglev.remove(&id);
            }
        }
        Ok(1)
    }

    /// Brings the Maglev table of `frontend`'s service up to date. Returns the writes.
    fn sync_maglev(&mut self, frontend: &Frontend) -> Result<usize, BpfError> {
        match self.maglev_want(frontend) {
            Some((id, table)) => self.write_maglev(id, Some(table)),
            None => match self.state.service(frontend) {
                Some(view) => self.write_maglev(view.id, None),
                None => Ok(0),
            },
        }
    }

    /// At load: reads the tables an earlier agent wrote, then rewrites those that are not
    /// what the services need now (a crash between a backend change and its table write,
    /// another table size) and deletes those of services that no longer have one.
    fn recover_maglev(&mut self) -> Result<(), BpfError> {
        let mut found = std::collections::BTreeMap::new();
        for entry in self.maps.maglev.iter() {
            let (id, value) = entry.map_err(BpfError::map(LB_MAGLEV_MAP))?;
            let m = (value.0.m as usize).min(LB_MAGLEV_MAX_M as usize);
            found.insert(id, value.0.table[..m].to_vec());
        }
        self.maglev = found;
        let mut want = std::collections::BTreeMap::new();
        let frontends: Vec<Frontend> = self.state.frontends().copied().collect();
        for f in &frontends {
            if let Some((id, table)) = self.maglev_want(f) {
                want.insert(id, table);
            }
        }
        let stale: Vec<u32> = self
            .maglev
            .keys()
            .filter(|id| !want.contains_key(id))
            .copied()
            .collect();
        let mut writes = 0;
        for id in stale {
            writes += self.write_maglev(id, None)?;
        }
        for (id, table) in want {
            writes += self.write_maglev(id, Some(table))?;
        }
        if writes > 0 {
            tracing::info!(writes, "repaired the pinned Maglev tables");
        }
        Ok(())
    }

    /// The Maglev table of `frontend` as written to `LB_MAGLEV` (backend ids), if any.
    pub fn maglev_table(&self, frontend: &Frontend) -> Option<&[u32]> {
        let id = self.state.service(frontend)?.id;
        self.maglev.get(&id).map(Vec::as_slice)
    }

    /// The counters of backend `id`, summed over CPUs (zero if it has none).
    pub fn counters(&self, id: u32) -> Result<Counters, BpfError> {
        match self.maps.counters.get(&id, 0) {
            Ok(per_cpu) => Ok(LbCounters::sum(per_cpu.iter().map(|c| &c.0))),
            Err(MapError::KeyNotFound) => Ok(Counters::default()),
            Err(e) => Err(BpfError::map(LB_COUNTERS_MAP)(e)),
        }
    }

    /// Every programmed frontend with its backends (slot order) and their counters.
    pub fn dump(&self) -> Result<Vec<ServiceDump>, BpfError> {
        self.state.dump(|id| self.counters(id))
    }

    /// Entries and capacity of every LB map (the LRU maps are counted by walking their keys).
    pub fn pressure(&self) -> Result<Vec<MapPressure>, BpfError> {
        let m = &self.maps;
        let count = |n: usize| n as u64;
        Ok(vec![
            MapPressure {
                map: LB_SERVICES_MAP,
                entries: count(self.state.service_count()),
                max_entries: max_entries(m.services.map(), LB_SERVICES_MAP)?,
            },
            MapPressure {
                map: LB_SLOTS_MAP,
                entries: count(self.state.slot_count()),
                max_entries: max_entries(m.slots.map(), LB_SLOTS_MAP)?,
            },
            MapPressure {
                map: LB_BACKENDS_MAP,
                entries: count(self.state.backend_count()),
                max_entries: max_entries(m.backends.map(), LB_BACKENDS_MAP)?,
            },
            MapPressure {
                map: LB_COUNTERS_MAP,
                entries: count(keys(&m.counters, LB_COUNTERS_MAP)?.len()),
                max_entries: max_entries(m.counters.map(), LB_COUNTERS_MAP)?,
            },
            MapPressure {
                map: LB_REVNAT_MAP,
                entries: count(m.revnat.keys().filter(Result::is_ok).count()),
                max_entries: max_entries(m.revnat.map(), LB_REVNAT_MAP)?,
            },
            MapPressure {
                map: LB_AFFINITY_MAP,
                entries: count(m.affinity.keys().filter(Result::is_ok).count()),
                max_entries: max_entries(m.affinity.map(), LB_AFFINITY_MAP)?,
            },
            MapPressure {
                map: LB_MAGLEV_MAP,
                entries: count(self.maglev.len()),
                max_entries: max_entries(m.maglev.map(), LB_MAGLEV_MAP)?,
            },
            MapPressure {
                map: NP_CT_MAP,
                entries: count(m.np_ct.keys().filter(Result::is_ok).count()),
                max_entries: max_entries(m.np_ct.map(), NP_CT_MAP)?,
            },
            MapPressure {
                map: POD_ENDPOINTS_MAP,
                entries: count(m.pod_endpoints.keys().filter(Result::is_ok).count()),
                max_entries: max_entries(m.pod_endpoints.map(), POD_ENDPOINTS_MAP)?,
            },
        ])
    }

    /// Detaches programs an earlier agent left attached through links pinned in `pin_dir` (by
    /// removing those pins; maps stay). For an agent that does not run the load balancer
    /// (switched off, or it failed to load): nobody would keep those programs' maps current,
    /// and stale translations are worse than none. Missing pins are not an error.
    pub fn detach_pinned(pin_dir: &Path) -> Result<(), BpfError> {
        for hook in &HOOKS {
            remove_file(&link_pin(pin_dir, hook.prog))?;
        }
        let entries = match std::fs::read_dir(pin_dir) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(BpfError::io(pin_dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(BpfError::io(pin_dir))?;
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(NP_LINK_PREFIX))
            {
                remove_file(&entry.path())?;
            }
        }
        Ok(())
    }

    /// Detaches the programs (removes the link pins) and removes the maps pinned in `pin_dir`,
    /// and `pin_dir` itself if that leaves it empty. For tearing a node down (`skiff-node
    /// purge`, tests). Missing pins are not an error.
    pub fn remove_pins(pin_dir: &Path) -> Result<(), BpfError> {
        Self::detach_pinned(pin_dir)?;
        for map in LB_MAPS {
            remove_file(&fs::pin_path(pin_dir, map))?;
        }
        fs::remove_dir_if_empty(pin_dir)
    }
}

/// How often a per-CPU counters insert that failed with ENOMEM is retried (pauses of 1, 2, 4,
/// … ms: at most about a quarter of a second in all).
const COUNTERS_ENOMEM_RETRIES: u32 = 8;

impl Maps {
    /// Performs one write. Deleting what is not there is not an error.
    fn write(&mut self, op: &Op) -> Result<(), BpfError> {
        match op {
            Op::PutService { frontend, value } => self
                .services
                .insert(P(frontend.key()), P(*value), 0)
                .map_err(BpfError::map(LB_SERVICES_MAP)),
            Op::DeleteService { frontend } => {
                remove(&mut self.services, LB_SERVICES_MAP, &P(frontend.key()))
            }
            Op::PutSlot { key, backend_id } => self
                .slots
                .insert(P(*key), *backend_id, 0)
                .map_err(BpfError::map(LB_SLOTS_MAP)),
            Op::DeleteSlot { key } => remove(&mut self.slots, LB_SLOTS_MAP, &P(*key)),
            Op::PutBackend { id, backend } => self
                .backends
                .insert(*id, P(backend.value()), 0)
                .map_err(BpfError::map(LB_BACKENDS_MAP)),
            Op::DeleteBackend { id } => remove(&mut self.backends, LB_BACKENDS_MAP, id),
            Op::PutCounters { id } => {
                let zeros = || {
                    PerCpuValues::try_from(vec![P(LbCounters::default()); self.nr_cpus]).map_err(
                        |e| BpfError::Io {
                            path: PathBuf::from(LB_COUNTERS_MAP),
                            source: e,
                        },
                    )
                };
                // Per-CPU values of a map created without preallocation come from the kernel's
                // per-CPU allocator in atomic context, which fails with ENOMEM while it grows
                // its pool (tens of thousands of inserts in a row; the pool is refilled
                // asynchronously): such an insert is retried after a short pause, bounded.
                let mut pause = Duration::from_millis(1);
                for _ in 0..COUNTERS_ENOMEM_RETRIES {
                    match self.counters.insert(*id, zeros()?, 0) {
                        Err(MapError::SyscallError(e))
                            if e.io_error.raw_os_error() == Some(Errno::ENOMEM as i32) =>
                        {
                            tracing::debug!(backend = id, "per-CPU counters: ENOMEM, retrying");
                            std::thread::sleep(pause);
                            pause *= 2;
                        }
                        r => return r.map_err(BpfError::map(LB_COUNTERS_MAP)),
                    }
                }
                self.counters
                    .insert(*id, zeros()?, 0)
                    .map_err(BpfError::map(LB_COUNTERS_MAP))
            }
            Op::DeleteCounters { id } => match self.counters.remove(id) {
                Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
                Err(MapError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => {
                    Ok(())
                }
                Err(e) => Err(BpfError::map(LB_COUNTERS_MAP)(e)),
            },
        }
    }
}

/// A program whose link can be pinned and taken over: both cgroup program types.
pub(crate) trait LinkedProgram {
    type Link: TryInto<FdLink, Error = aya::programs::links::LinkError>;
    fn prog_fd(&self) -> Result<&aya::programs::ProgramFd, ProgramError>;
}

impl LinkedProgram for CgroupSockAddr {
    type Link = aya::programs::cgroup_sock_addr::CgroupSockAddrLink;
    fn prog_fd(&self) -> Result<&aya::programs::ProgramFd, ProgramError> {
        self.fd()
    }
}

impl LinkedProgram for aya::programs::CgroupSkb {
    type Link = aya::programs::cgroup_skb::CgroupSkbLink;
    fn prog_fd(&self) -> Result<&aya::programs::ProgramFd, ProgramError> {
        self.fd()
    }
}

/// Makes `prog` run on cgroup `cgroup_id` at hook `attach_type` through the link pinned at
/// `pin`: an earlier agent's link for that very cgroup and hook gets this program swapped in
/// (`BPF_LINK_UPDATE`, atomic); a pin for another (or a removed) cgroup is unpinned, which
/// detaches it, and a new link is made with `attach` and pinned.
pub(crate) fn pinned_cgroup_link<T: LinkedProgram>(
    pin: &Path,
    cgroup_id: u64,
    attach_type: u32,
    name: &'static str,
    prog: &mut T,
    attach: impl FnOnce(&mut T) -> Result<T::Link, ProgramError>,
) -> Result<TcAttach, BpfError> {
    let mut outcome = TcAttach::Attached;
    match sys::obj_get(pin) {
        Ok(link) => {
            let info = sys::cgroup_link_info(std::os::fd::AsFd::as_fd(&link))
                .map_err(BpfError::io(pin))?;
            if info.cgroup_id == cgroup_id && info.attach_type == attach_type {
                let prog_fd = prog.prog_fd().map_err(BpfError::program(name))?;
                sys::link_update(
                    std::os::fd::AsFd::as_fd(&link),
                    std::os::fd::AsFd::as_fd(prog_fd),
                )
                .map_err(BpfError::io(pin))?;
                return Ok(TcAttach::Adopted);
            }
            // Another cgroup (or one that is gone): this pin is the only reference besides
            // `link`, so removing it and closing `link` detaches it.
            remove_file(pin)?;
            drop(link);
            outcome = TcAttach::Replaced;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(BpfError::io(pin)(e)),
    }
    let link = attach(prog).map_err(BpfError::program(name))?;
    let link: FdLink = link.try_into().map_err(|e| BpfError::Link {
        name,
        source: Box::new(e),
    })?;
    link.pin(pin).map_err(|e| BpfError::Pin {
        path: pin.to_path_buf(),
        source: Box::new(e),
    })?;
    Ok(outcome)
}

pub(crate) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, BpfError>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(BpfError::Missing {
            kind: "program",
            name,
        })?
        .try_into()
        .map_err(BpfError::program(name))
}

pub(crate) fn take_map<M>(
    ebpf: &mut Ebpf,
    name: &'static str,
    convert: impl FnOnce(aya::maps::Map) -> Result<M, MapError>,
) -> Result<M, BpfError> {
    let map = ebpf
        .take_map(name)
        .ok_or(BpfError::Missing { kind: "map", name })?;
    convert(map).map_err(BpfError::map(name))
}

pub(crate) fn max_entries(map: &MapData, name: &'static str) -> Result<u32, BpfError> {
    Ok(map.info().map_err(BpfError::map(name))?.max_entries())
}

fn entries<K: aya::Pod, V: aya::Pod>(
    map: &HashMap<MapData, K, V>,
    name: &'static str,
) -> Result<Vec<(K, V)>, BpfError> {
    map.iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(BpfError::map(name))
}

fn keys<V: aya::Pod>(
    map: &PerCpuHashMap<MapData, u32, V>,
    name: &'static str,
) -> Result<Vec<u32>, BpfError> {
    map.keys()
        .collect::<Result<Vec<_>, _>>()
        .map_err(BpfError::map(name))
}

fn remove<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    name: &'static str,
    key: &K,
) -> Result<(), BpfError> {
    match map.remove(key) {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BpfError::map(name)(e)),
    }
}

/// The fast path's key of pod address `ip`.
fn pod_key(ip: Ipv4Addr) -> PodEndpointKey {
    PodEndpointKey::v4(u32::from_ne_bytes(ip.octets()))
}

/// The index of device `ifname` in the calling thread's network namespace.
pub fn ifindex(ifname: &str) -> Result<u32, BpfError> {
    let c = std::ffi::CString::new(ifname).map_err(|e| {
        BpfError::io(Path::new(ifname))(io::Error::new(io::ErrorKind::InvalidInput, e))
    })?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(BpfError::io(Path::new(ifname))(io::Error::last_os_error()));
    }
    Ok(idx)
}

pub(crate) fn remove_file(path: &Path) -> Result<(), BpfError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BpfError::io(path)(e)),
    }
}

/// Key and value sizes each LB map must have.
fn expected_sizes(name: &str) -> Option<(u32, u32)> {
    use std::mem::size_of;
    let s = |k: usize, v: usize| Some((k as u32, v as u32));
    match name {
        LB_SERVICES_MAP => s(size_of::<LbServiceKey>(), size_of::<LbService>()),
        LB_SLOTS_MAP => s(size_of::<LbSlotKey>(), size_of::<u32>()),
        LB_BACKENDS_MAP => s(size_of::<u32>(), size_of::<LbBackend>()),
        LB_COUNTERS_MAP => s(size_of::<u32>(), size_of::<LbCounters>()),
        LB_REVNAT_MAP => s(size_of::<LbRevNatKey>(), size_of::<LbRevNat>()),
        LB_AFFINITY_MAP => s(size_of::<LbAffinityKey>(), size_of::<LbAffinity>()),
        NP_CT_MAP => s(size_of::<NpCtKey>(), size_of::<NpCtEntry>()),
        LB_MAGLEV_MAP => s(size_of::<u32>(), size_of::<LbMaglev>()),
        POD_ENDPOINTS_MAP => s(size_of::<PodEndpointKey>(), size_of::<PodEndpoint>()),
        FP_COUNTERS_MAP => s(size_of::<u32>(), size_of::<FastPathCounters>()),
        _ => None,
    }
}

/// Refuses pinned maps whose key or value size is not this agent's (aya would reuse them
/// blindly): an agent of another layout must not misread or corrupt them.
fn check_pins(pin_dir: &Path) -> Result<(), BpfError> {
    check_pin_sizes(pin_dir, &LB_MAPS, expected_sizes)
}

/// [`check_pins`] for any object: the maps `names` pinned in `pin_dir` must have the key and
/// value sizes `expected` gives.
pub(crate) fn check_pin_sizes(
    pin_dir: &Path,
    names: &[&'static str],
    expected: fn(&str) -> Option<(u32, u32)>,
) -> Result<(), BpfError> {
    for &name in names {
        let pin = fs::pin_path(pin_dir, name);
        if !pin.exists() {
            continue;
        }
        let info = MapInfo::from_pin(&pin).map_err(BpfError::map(name))?;
        let Some((key, value)) = expected(name) else {
            continue;
        };
        if info.key_size() != key || info.value_size() != value {
            return Err(BpfError::IncompatiblePin {
                path: pin,
                reason: format!(
                    "key/value sizes {}/{} where this agent uses {key}/{value}; remove the pins \
                     (skiff-node purge) to recreate the maps",
                    info.key_size(),
                    info.value_size()
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeds_the_lb_object_with_btf() {
        let mut names: Vec<&str> = LB_MAPS.to_vec();
        names.extend(HOOKS.iter().map(|h| h.prog));
        names.extend([
            NP_INGRESS_PROG,
            "LbServiceKey",
            "LbRevNatKey",
            "NpCtKey",
            "LbMaglev",
            "PodEndpointKey",
            "FastPathCounters",
        ]);
        crate::tests::assert_embedded(object(), &names);
    }

    #[test]
    fn every_map_has_expected_sizes() {
        for name in LB_MAPS {
            assert!(expected_sizes(name).is_some(), "{name}");
        }
    }
}
