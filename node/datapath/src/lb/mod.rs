//! The Service load balancer's kernel side: loads the `skiff-lb` object (a second object next
//! to accounting's, so each is loaded, pinned and sized on its own), pins its maps under the
//! agent's pin directory `/sys/fs/bpf/skiff/<node>/` (`LB_SERVICES`, `LB_SLOTS`,
//! `LB_BACKENDS`, `LB_COUNTERS`, `LB_REVNAT`, `LB_AFFINITY`, `NP_CT`, `LB_MAGLEV`; IPv4 and
//! IPv6 frontends and backends share them, and a frontend only gets backends of its family),
//! attaches its eight `cgroup_sock_addr` programs (connect, sendmsg, recvmsg, getpeername for
//! IPv4 and IPv6) to the node's pod cgroup parent through *pinned* BPF links
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
//! LoadBalancer addresses: the same tc program answers ARP on the uplink for the addresses in
//! `L2_ANNOUNCE` (pinned with the other maps) until each entry's deadline; the agent writes
//! them while it holds an address's lease ([`l2`]).
//!
//! SNATed flows (externalTrafficPolicy Cluster) get the node address in `NP_SNAT`
//! ([`ServiceLb::set_snat_address`]; unset: the frontend's own address, which a NodePort
//! frontend's is), so a LoadBalancer address's replies come back to the node that took the
//! flow.
//!
//! NodePort frontends get a Maglev table ([`maglev`]: a pure builder over the backends'
//! stable identities, so every node builds the same table; prime size
//! `--lb-maglev-table-size`, default 1021, at most 16381), written whole with one map update
//! per change of the backends, after the backend entries it names exist. A per-CPU
//! `LB_COUNTERS` insert that fails with ENOMEM (the kernel's per-CPU pool growing under tens of
//! thousands of inserts in a row) is retried after pauses of 1, 2, 4 … ms, about 0.25 s in
//! all. [`debug`]: with `--bpf-debug` the programs log each translation, forwarded to tracing.
//!
//! Map sizes come from [`LbConfig`] when the maps are created (`--lb-max-services`,
//! `--lb-max-backends`); pinned maps keep the size they were created with (remove the pins,
//! e.g. `skiff-node purge`, to resize).

pub(crate) mod bpf;
pub mod debug;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
mod fastpath;
pub mod l2;
mod links;
mod loader;
pub mod maglev;
pub(crate) mod pod;
pub mod state;

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use aya::Ebpf;
use aya::maps::{
    Array, HashMap, IterableMap, MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues,
};
use nix::errno::Errno;
use serde::Serialize;
use skiff_common::lb::{
    AF_INET, AF_INET6, LB_AFFINITY_MAP, LB_BACKENDS_MAP, LB_COUNTERS_MAP, LB_DEFAULT_MAX_AFFINITY,
    LB_DEFAULT_MAX_BACKENDS, LB_DEFAULT_MAX_NP_CT, LB_DEFAULT_MAX_REVNAT, LB_DEFAULT_MAX_SERVICES,
    LB_MAGLEV_DEFAULT_M, LB_MAGLEV_MAP, LB_MAGLEV_MAX_M, LB_REVNAT_MAP, LB_SERVICES_MAP,
    LB_SLOTS_MAP, LbAffinity, LbAffinityKey, LbBackend, LbCounters, LbMaglev, LbRevNat,
    LbRevNatKey, LbService, LbServiceKey, LbSlotKey, NP_CT_MAP, NpCtEntry, NpCtKey,
};
pub use skiff_common::podnet::{FastPathCounters, PodEndpoint};
use skiff_common::podnet::{POD_ENDPOINTS_MAP, PodEndpointKey};

use super::BpfError;
pub(crate) use bpf::{
    check_pin_sizes, link_pin, pinned_cgroup_link, program, remove_file, take_map,
};
use bpf::{keys, max_entries, remove};
pub use links::ifindex;
use pod::P;
pub use state::{BackendAddr, Frontend, LbState, Op, PlanError, Protocol, ServiceParams};

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
type LbCountersMap = PerCpuHashMap<MapData, u32, P<LbCounters>>;
type RevNatMap = HashMap<MapData, P<LbRevNatKey>, P<LbRevNat>>;
type AffinityMap = HashMap<MapData, P<LbAffinityKey>, P<LbAffinity>>;
type NpCtMap = HashMap<MapData, P<NpCtKey>, P<NpCtEntry>>;
type MaglevMap = HashMap<MapData, u32, P<LbMaglev>>;
type PodEndpointsMap = HashMap<MapData, P<PodEndpointKey>, P<PodEndpoint>>;
type FpCountersMap = PerCpuArray<MapData, P<FastPathCounters>>;
type L2AnnounceMap = HashMap<MapData, u32, P<l2::L2Announce>>;
type NpSnatMap = Array<MapData, u32>;
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
    /// Answers ARP for `ip` on the uplink as `entry` says ([`l2`]).
    fn set_l2_announcement(&mut self, ip: Ipv4Addr, entry: l2::L2Announce) -> Result<(), BpfError>;
    /// Stops answering ARP for `ip` (missing is not an error).
    fn remove_l2_announcement(&mut self, ip: Ipv4Addr) -> Result<(), BpfError>;
    /// Every L2 announcement entry, expired ones included.
    fn l2_announcements(&self) -> Result<Vec<(Ipv4Addr, l2::L2Announce)>, BpfError>;
    /// The node address SNATed NodePort and LoadBalancer flows get (`None`: each frontend's
    /// own address).
    fn set_snat_address(&mut self, ip: Option<Ipv4Addr>) -> Result<(), BpfError>;
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
    fn set_l2_announcement(&mut self, ip: Ipv4Addr, entry: l2::L2Announce) -> Result<(), BpfError> {
        ServiceLb::set_l2_announcement(self, ip, entry)
    }
    fn remove_l2_announcement(&mut self, ip: Ipv4Addr) -> Result<(), BpfError> {
        ServiceLb::remove_l2_announcement(self, ip)
    }
    fn l2_announcements(&self) -> Result<Vec<(Ipv4Addr, l2::L2Announce)>, BpfError> {
        ServiceLb::l2_announcements(self)
    }
    fn set_snat_address(&mut self, ip: Option<Ipv4Addr>) -> Result<(), BpfError> {
        ServiceLb::set_snat_address(self, ip)
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
    counters: LbCountersMap,
    revnat: RevNatMap,
    affinity: AffinityMap,
    np_ct: NpCtMap,
    maglev: MaglevMap,
    pod_endpoints: PodEndpointsMap,
    fp_counters: FpCountersMap,
    l2_announce: L2AnnounceMap,
    np_snat: NpSnatMap,
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
    /// The in-cluster view of an externalTrafficPolicy `Local` frontend
    /// ([`Frontend::in_cluster`]).
    pub in_cluster: bool,
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
    /// Where the maps and links are pinned.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// The mirror of the programmed maps.
    pub fn state(&self) -> &LbState {
        &self.state
    }

    /// The node address SNATed NodePort and LoadBalancer flows get (`NP_SNAT`; `None`: each
    /// frontend's own address, which for a NodePort frontend is a node address already).
    pub fn set_snat_address(&mut self, ip: Option<Ipv4Addr>) -> Result<(), BpfError> {
        let v = ip.map_or(0, |ip| u32::from_ne_bytes(ip.octets()));
        self.maps
            .np_snat
            .set(0, v, 0)
            .map_err(BpfError::map(skiff_common::lb::NP_SNAT_MAP))
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
            MapPressure {
                map: skiff_common::l2::L2_ANNOUNCE_MAP,
                entries: count(m.l2_announce.keys().filter(Result::is_ok).count()),
                max_entries: max_entries(m.l2_announce.map(), skiff_common::l2::L2_ANNOUNCE_MAP)?,
            },
        ])
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
