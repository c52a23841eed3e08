//! An in-memory [`LbDatapath`] for tests that run without root: it keeps the same mirror
//! ([`LbState`]) the kernel implementation keeps, plans every change with the same planner,
//! and instead of writing kernel maps records each planned write ([`Op`]) in order, so a test
//! can assert the exact write plan of a reconcile. Pod endpoints and tc attachments are kept
//! in maps; every call is also appended to a shared journal (when given) so a test can check
//! the order of operations across fakes (runtime, network, data path).
//!
//! Not modelled: Maglev tables (NodePort services get none), the per-CPU counters (always
//! zero), conntrack (always empty).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use skiff_common::lb::{NpCtEntry, NpCtKey};

use super::l2::L2Announce;
use super::{
    BackendAddr, Counters, FastPathCounters, Frontend, LbConfig, LbDatapath, LbState, MapPressure,
    Op, PodEndpoint, ServiceDump, ServiceParams, TcAttach,
};
use crate::BpfError;

/// A shared, ordered record of calls made on several fakes.
pub type Journal = Arc<Mutex<Vec<String>>>;

/// The in-memory load balancer.
#[derive(Debug)]
pub struct FakeLb {
    state: LbState,
    max_services: u32,
    max_backends: u32,
    writes: Arc<Mutex<Vec<Op>>>,
    endpoints: BTreeMap<Ipv4Addr, PodEndpoint>,
    tc: BTreeSet<String>,
    l2: BTreeMap<Ipv4Addr, L2Announce>,
    journal: Option<Journal>,
}

impl FakeLb {
    /// An empty load balancer with the map capacities of `cfg`.
    pub fn new(cfg: LbConfig) -> Self {
        FakeLb {
            state: LbState::new(cfg.max_services, cfg.max_backends),
            max_services: cfg.max_services,
            max_backends: cfg.max_backends,
            writes: Arc::default(),
            endpoints: BTreeMap::new(),
            tc: BTreeSet::new(),
            l2: BTreeMap::new(),
            journal: None,
        }
    }

    /// Also appends `datapath: <call>` lines to `journal`.
    pub fn with_journal(mut self, journal: Journal) -> Self {
        self.journal = Some(journal);
        self
    }

    /// Every map write planned so far, in order; the handle stays valid after the fake is
    /// moved into its user (a test keeps it to read the write plan).
    pub fn write_log(&self) -> Arc<Mutex<Vec<Op>>> {
        self.writes.clone()
    }

    /// The devices the tc program is attached to.
    pub fn tc_devices(&self) -> Vec<String> {
        self.tc.iter().cloned().collect()
    }

    fn note(&self, line: String) {
        if let Some(j) = &self.journal {
            j.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }

    fn execute(&mut self, ops: Vec<Op>) -> usize {
        let n = ops.len();
        let mut log = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        for op in ops {
            self.state.apply(&op);
            log.push(op);
        }
        n
    }
}

impl LbDatapath for FakeLb {
    fn state(&self) -> &LbState {
        &self.state
    }

    fn sync_service(
        &mut self,
        frontend: Frontend,
        params: ServiceParams,
        backends: &[BackendAddr],
    ) -> Result<usize, BpfError> {
        let ops = self.state.plan_set(frontend, params, backends)?;
        self.note(format!(
            "datapath: sync {frontend} ({} backends)",
            backends.len()
        ));
        Ok(self.execute(ops))
    }

    fn remove_service(&mut self, frontend: &Frontend) -> Result<usize, BpfError> {
        let mut ops = self.state.plan_remove(frontend);
        ops.extend(self.state.plan_gc());
        self.note(format!("datapath: remove {frontend}"));
        Ok(self.execute(ops))
    }

    fn dump(&self) -> Result<Vec<ServiceDump>, BpfError> {
        self.state
            .dump(|_| Ok::<Counters, BpfError>(Counters::default()))
    }

    fn pressure(&self) -> Result<Vec<MapPressure>, BpfError> {
        let count = |n: usize| n as u64;
        Ok(vec![
            MapPressure {
                map: skiff_common::lb::LB_SERVICES_MAP,
                entries: count(self.state.service_count()),
                max_entries: self.max_services,
            },
            MapPressure {
                map: skiff_common::lb::LB_SLOTS_MAP,
                entries: count(self.state.slot_count()),
                max_entries: self.max_backends,
            },
            MapPressure {
                map: skiff_common::lb::LB_BACKENDS_MAP,
                entries: count(self.state.backend_count()),
                max_entries: self.max_backends,
            },
        ])
    }

    fn attach_tc(&mut self, ifname: &str) -> Result<TcAttach, BpfError> {
        self.note(format!("datapath: attach tc {ifname}"));
        Ok(if self.tc.insert(ifname.to_string()) {
            TcAttach::Attached
        } else {
            TcAttach::Adopted
        })
    }

    fn detach_tc(&mut self, ifname: &str) -> Result<(), BpfError> {
        self.note(format!("datapath: detach tc {ifname}"));
        self.tc.remove(ifname);
        Ok(())
    }

    fn set_pod_endpoint(&mut self, ip: Ipv4Addr, ep: PodEndpoint) -> Result<(), BpfError> {
        self.note(format!("datapath: set endpoint {ip}"));
        self.endpoints.insert(ip, ep);
        Ok(())
    }

    fn remove_pod_endpoint(&mut self, ip: Ipv4Addr) -> Result<(), BpfError> {
        self.note(format!("datapath: remove endpoint {ip}"));
        self.endpoints.remove(&ip);
        Ok(())
    }

    fn pod_endpoints(&self) -> Result<Vec<(IpAddr, PodEndpoint)>, BpfError> {
        Ok(self
            .endpoints
            .iter()
            .map(|(ip, ep)| (IpAddr::V4(*ip), *ep))
            .collect())
    }

    fn fast_path_counters(&self) -> Result<FastPathCounters, BpfError> {
        Ok(FastPathCounters::default())
    }

    fn conntrack(&self) -> Result<Vec<(NpCtKey, NpCtEntry)>, BpfError> {
        Ok(Vec::new())
    }

    fn frontend_of(
        &self,
        _cookie: u64,
        _backend: std::net::IpAddr,
        _port: u16,
    ) -> Option<(std::net::IpAddr, u16)> {
        None
    }

    fn set_l2_announcement(&mut self, ip: Ipv4Addr, entry: L2Announce) -> Result<(), BpfError> {
        self.l2.insert(ip, entry);
        Ok(())
    }

    fn remove_l2_announcement(&mut self, ip: Ipv4Addr) -> Result<(), BpfError> {
        self.l2.remove(&ip);
        Ok(())
    }

    fn l2_announcements(&self) -> Result<Vec<(Ipv4Addr, L2Announce)>, BpfError> {
        Ok(self.l2.iter().map(|(ip, e)| (*ip, *e)).collect())
    }

    fn set_snat_address(&mut self, ip: Option<Ipv4Addr>) -> Result<(), BpfError> {
        self.note(format!("datapath: snat address {ip:?}"));
        Ok(())
    }
}
