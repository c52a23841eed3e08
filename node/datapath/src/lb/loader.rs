//! Loading the `skiff-lb` object: its programs verified, its maps pinned (or an earlier
//! agent's reused after checking their layout), the mirror rebuilt and repaired from them;
//! and removing it all.

use std::path::{Path, PathBuf};

use aya::maps::IterableMap;
use aya::programs::{CgroupSockAddr, SchedClassifier};
use aya::{Ebpf, EbpfLoader};
use skiff_common::l2::{L2_ANNOUNCE_MAP, L2Announce};
use skiff_common::lb::{
    LB_AFFINITY_MAP, LB_BACKENDS_MAP, LB_COUNTERS_MAP, LB_DEBUG_GLOBAL, LB_MAGLEV_MAP, LB_MAPS,
    LB_REVNAT_MAP, LB_SERVICES_MAP, LB_SLOTS_MAP, LbAffinity, LbAffinityKey, LbBackend, LbCounters,
    LbMaglev, LbRevNat, LbRevNatKey, LbService, LbServiceKey, LbSlotKey, NP_CT_MAP,
    NP_INGRESS_PROG, NP_SNAT_MAP, NpCtEntry, NpCtKey,
};
use skiff_common::podnet::{FP_COUNTERS_MAP, POD_ENDPOINTS_MAP, PodEndpointKey};

use super::bpf::{
    check_pin_sizes, entries, keys, max_entries, program, remove, remove_file, take_map,
};
use super::links::HOOKS;
use super::pod::P;
use super::{
    AffinityMap, BackendsMap, FastPathCounters, FpCountersMap, L2AnnounceMap, LbConfig,
    LbCountersMap, MaglevMap, Maps, NpCtMap, NpSnatMap, PodEndpoint, PodEndpointsMap, RevNatMap,
    ServiceLb, ServicesMap, SlotsMap, debug, maglev, state,
};
use crate::{BpfError, fs};

/// The `skiff-lb` object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/skiff-lb"))
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
        let maps = take_maps(&mut ebpf, nr_cpus)?;
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

/// The LB maps, taken out of the loaded object.
fn take_maps(ebpf: &mut Ebpf, nr_cpus: usize) -> Result<Maps, BpfError> {
    Ok(Maps {
        services: take_map(ebpf, LB_SERVICES_MAP, ServicesMap::try_from)?,
        slots: take_map(ebpf, LB_SLOTS_MAP, SlotsMap::try_from)?,
        backends: take_map(ebpf, LB_BACKENDS_MAP, BackendsMap::try_from)?,
        counters: take_map(ebpf, LB_COUNTERS_MAP, LbCountersMap::try_from)?,
        revnat: take_map(ebpf, LB_REVNAT_MAP, RevNatMap::try_from)?,
        affinity: take_map(ebpf, LB_AFFINITY_MAP, AffinityMap::try_from)?,
        np_ct: take_map(ebpf, NP_CT_MAP, NpCtMap::try_from)?,
        maglev: take_map(ebpf, LB_MAGLEV_MAP, MaglevMap::try_from)?,
        pod_endpoints: take_map(ebpf, POD_ENDPOINTS_MAP, PodEndpointsMap::try_from)?,
        fp_counters: take_map(ebpf, FP_COUNTERS_MAP, FpCountersMap::try_from)?,
        l2_announce: take_map(ebpf, L2_ANNOUNCE_MAP, L2AnnounceMap::try_from)?,
        np_snat: take_map(ebpf, NP_SNAT_MAP, NpSnatMap::try_from)?,
        nr_cpus,
    })
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
        L2_ANNOUNCE_MAP => s(size_of::<u32>(), size_of::<L2Announce>()),
        NP_SNAT_MAP => s(size_of::<u32>(), size_of::<u32>()),
        _ => None,
    }
}

/// Refuses pinned maps whose key or value size is not this agent's (aya would reuse them
/// blindly): an agent of another layout must not misread or corrupt them.
fn check_pins(pin_dir: &Path) -> Result<(), BpfError> {
    check_pin_sizes(pin_dir, &LB_MAPS, expected_sizes)
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
            "L2Announce",
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
