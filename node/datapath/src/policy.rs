//! NetworkPolicy enforcement's kernel side: loads the `skiff-policy` object (two `cgroup_skb`
//! programs, see `ebpf/skiff-ebpf/src/policy/`), pins its maps under the agent's pin directory
//! (`POL_ENDPOINTS`, `POL_IPCACHE`, `POL_CIDRS`, `POL_RULES`, `POL_HOST_PORTS`, `POL_CT`,
//! `POL_COUNTERS`) and attaches the programs to the node's pod cgroup parent through pinned
//! links (`link_skiff_policy_ingress`, `link_skiff_policy_egress`), taken over by the next
//! agent like the load balancer's, so enforcement never stops while the agent restarts.
//!
//! The agent hands over whole desired [`PolicyTables`]; [`plan`] (pure) turns the difference
//! from what is programmed into ordered writes: rules before the identities and endpoints
//! that use them, removals last, so a change never denies for a moment what both the old and
//! the new tables allow. The mirror is read back from the pinned maps at load, so a restarted
//! agent writes only what changed.
//!
//! A failed write re-reads the maps, so the next plan starts from the truth. [`rule_keys`] and
//! [`port_blocks`] turn a port range into the fewest aligned prefix blocks. `start_flows`
//! hands every `POL_FLOWS` record to a sink on a thread of its own, through the one poll(2)
//! loop of the agent's BPF ring buffers (`lb::debug::Reader::poll`, which the LB's debug
//! records use too). The pinned links are made or taken over by the one pin-or-take-over path
//! both objects use (`lb::bpf::pinned_cgroup_link`).

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap, MapData, MapError, PerCpuHashMap};
use aya::programs::{CgroupAttachMode, CgroupSkb, CgroupSkbAttachType};
use aya::{Ebpf, EbpfLoader};
pub use skiff_common::policy::{
    DIR_EGRESS, DIR_INGRESS, EP_EGRESS_ISOLATED, EP_INGRESS_ISOLATED, ID_ANY, ID_FIRST_CIDR,
    ID_FIRST_LABELS, ID_HOST, ID_WORLD, PolCounterKey, PolCounters, PolCtEntry, PolCtKey,
    PolEndpoint, PolFlowEvent, PolHostPort, PolHostPortKey, PolRuleKey, REASON_ALLOWED_ESTABLISHED,
    REASON_ALLOWED_RULE, REASON_ALLOWED_UNISOLATED, REASON_DENIED,
};
use skiff_common::policy::{
    POL_CIDRS_MAP, POL_COUNTERS_MAP, POL_CT_MAP, POL_DEFAULT_MAX_CIDRS, POL_DEFAULT_MAX_CT,
    POL_DEFAULT_MAX_ENDPOINTS, POL_DEFAULT_MAX_IPCACHE, POL_DEFAULT_MAX_RULES, POL_EGRESS_PROG,
    POL_ENDPOINTS_MAP, POL_FLOWS_MAP, POL_HOST_PORTS_MAP, POL_INGRESS_PROG, POL_IPCACHE_MAP,
    POL_MAPS, POL_RULES_MAP, RULE_PREFIX_ANY_PORT, RULE_PREFIX_ANY_PORT_OF_PROTO,
};

use super::lb::pod::P;
use super::lb::{TcAttach, link_pin, pinned_cgroup_link, program, remove_file, take_map};
use super::{BpfError, cgroup_id, fs, is_cgroup2, sys};

/// The `skiff-policy` object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/skiff-policy"))
}

/// Sizes of the policy maps (used when they are created; pinned maps keep theirs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyConfig {
    pub max_endpoints: u32,
    pub max_ipcache: u32,
    pub max_cidrs: u32,
    pub max_rules: u32,
    pub max_ct: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            max_endpoints: POL_DEFAULT_MAX_ENDPOINTS,
            max_ipcache: POL_DEFAULT_MAX_IPCACHE,
            max_cidrs: POL_DEFAULT_MAX_CIDRS,
            max_rules: POL_DEFAULT_MAX_RULES,
            max_ct: POL_DEFAULT_MAX_CT,
        }
    }
}

/// One `POL_RULES` entry's key: the key data and how many of its leading bits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleKey {
    pub key: PolRuleKey,
    pub prefix_len: u32,
}

/// A protocol and a port range of a rule (`None`: every protocol, every port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortMatch {
    pub proto: u8,
    /// Inclusive range; `None`: every port of `proto`.
    pub ports: Option<(u16, u16)>,
}

/// The `POL_RULES` keys allowing endpoint `endpoint`, direction `dir`, peer identity
/// `identity` on `port` (`None`: every protocol and port). A port range becomes the fewest
/// aligned power-of-two blocks that cover it exactly, each a key whose prefix ends inside
/// the port field.
pub fn rule_keys(endpoint: u32, dir: u8, identity: u32, port: Option<PortMatch>) -> Vec<RuleKey> {
    let Some(pm) = port else {
        return vec![RuleKey {
            key: PolRuleKey::new(endpoint, dir, identity, 0, 0),
            prefix_len: RULE_PREFIX_ANY_PORT,
        }];
    };
    let Some((lo, hi)) = pm.ports else {
        return vec![RuleKey {
            key: PolRuleKey::new(endpoint, dir, identity, pm.proto, 0),
            prefix_len: RULE_PREFIX_ANY_PORT_OF_PROTO,
        }];
    };
    port_blocks(lo, hi)
        .into_iter()
        .map(|(start, fixed_bits)| RuleKey {
            key: PolRuleKey::new(endpoint, dir, identity, pm.proto, start),
            prefix_len: RULE_PREFIX_ANY_PORT_OF_PROTO + u32::from(fixed_bits),
        })
        .collect()
}

/// `lo..=hi` as aligned blocks `(start, fixed high bits)`: a block of `16 - bits` free low
/// bits covers `start..start + 2^(16 - bits)`. At most 30 blocks for any range.
pub fn port_blocks(lo: u16, hi: u16) -> Vec<(u16, u8)> {
    let mut out = Vec::new();
    if lo > hi {
        return out;
    }
    let (mut cur, hi) = (u32::from(lo), u32::from(hi));
    while cur <= hi {
        // The largest block aligned at `cur` that stays within `hi`.
        let mut size = if cur == 0 {
            1 << 16
        } else {
            1u32 << cur.trailing_zeros()
        };
        while cur + size - 1 > hi {
            size >>= 1;
        }
        let free_bits = size.trailing_zeros();
        out.push((cur as u16, (16 - free_bits) as u8));
        cur += size;
    }
    out
}

/// Everything the programs read, as the agent wants it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyTables {
    pub endpoints: BTreeMap<Ipv4Addr, PolEndpoint>,
    pub ipcache: BTreeMap<Ipv4Addr, u32>,
    /// (prefix address, prefix length) → CIDR identity.
    pub cidrs: BTreeMap<(Ipv4Addr, u8), u32>,
    /// Rule key → index of the allowing policy.
    pub rules: BTreeMap<RuleKey, u32>,
    /// (node port, protocol) → what it stands for.
    pub host_ports: BTreeMap<(u16, u8), PolHostPort>,
}

/// One map write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyOp {
    PutRule(RuleKey, u32),
    DeleteRule(RuleKey),
    PutIpcache(Ipv4Addr, u32),
    DeleteIpcache(Ipv4Addr),
    PutCidr((Ipv4Addr, u8), u32),
    DeleteCidr((Ipv4Addr, u8)),
    PutHostPort((u16, u8), PolHostPort),
    DeleteHostPort((u16, u8)),
    PutEndpoint(Ipv4Addr, PolEndpoint),
    DeleteEndpoint(Ipv4Addr),
}

/// The writes that turn `current` into `desired`, ordered so that no packet both tables allow
/// is denied in between: new rules first, then identities (ipcache, CIDRs, host ports), then
/// endpoints (isolation switches on only once its rules are there), then removals (endpoints
/// first, so isolation switches off before rules go).
pub fn plan(current: &PolicyTables, desired: &PolicyTables) -> Vec<PolicyOp> {
    fn puts<K: Ord + Copy, V: PartialEq + Copy>(
        cur: &BTreeMap<K, V>,
        want: &BTreeMap<K, V>,
        op: impl Fn(K, V) -> PolicyOp,
        out: &mut Vec<PolicyOp>,
    ) {
        for (k, v) in want {
            if cur.get(k) != Some(v) {
                out.push(op(*k, *v));
            }
        }
    }
    fn deletes<K: Ord + Copy, V>(
        cur: &BTreeMap<K, V>,
        want: &BTreeMap<K, V>,
        op: impl Fn(K) -> PolicyOp,
        out: &mut Vec<PolicyOp>,
    ) {
        for k in cur.keys() {
            if !want.contains_key(k) {
                out.push(op(*k));
            }
        }
    }
    let mut out = Vec::new();
    puts(&current.rules, &desired.rules, PolicyOp::PutRule, &mut out);
    puts(
        &current.ipcache,
        &desired.ipcache,
        PolicyOp::PutIpcache,
        &mut out,
    );
    puts(&current.cidrs, &desired.cidrs, PolicyOp::PutCidr, &mut out);
    puts(
        &current.host_ports,
        &desired.host_ports,
        PolicyOp::PutHostPort,
        &mut out,
    );
    puts(
        &current.endpoints,
        &desired.endpoints,
        PolicyOp::PutEndpoint,
        &mut out,
    );
    deletes(
        &current.endpoints,
        &desired.endpoints,
        PolicyOp::DeleteEndpoint,
        &mut out,
    );
    deletes(
        &current.rules,
        &desired.rules,
        PolicyOp::DeleteRule,
        &mut out,
    );
    deletes(
        &current.host_ports,
        &desired.host_ports,
        PolicyOp::DeleteHostPort,
        &mut out,
    );
    deletes(
        &current.cidrs,
        &desired.cidrs,
        PolicyOp::DeleteCidr,
        &mut out,
    );
    deletes(
        &current.ipcache,
        &desired.ipcache,
        PolicyOp::DeleteIpcache,
        &mut out,
    );
    out
}

/// What the agent needs from the enforcement side.
pub trait PolicyDatapath: Send {
    /// What is programmed.
    fn tables(&self) -> &PolicyTables;
    /// Programs exactly `desired`; returns the number of map writes.
    fn apply(&mut self, desired: &PolicyTables) -> Result<usize, BpfError>;
    /// Verdict counters, summed over CPUs.
    fn counters(&self) -> Result<Vec<(PolCounterKey, PolCounters)>, BpfError>;
}

type EndpointsMap = HashMap<MapData, u32, P<PolEndpoint>>;
type IpcacheMap = HashMap<MapData, u32, u32>;
type CidrsMap = LpmTrie<MapData, [u8; 4], u32>;
type RulesMap = LpmTrie<MapData, P<PolRuleKey>, u32>;
type HostPortsMap = HashMap<MapData, P<PolHostPortKey>, P<PolHostPort>>;
type CtMap = HashMap<MapData, P<PolCtKey>, P<PolCtEntry>>;
type PolCountersMap = PerCpuHashMap<MapData, P<PolCounterKey>, P<PolCounters>>;

/// Address as the programs see it (network order in memory).
fn be(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

fn from_be(v: u32) -> Ipv4Addr {
    Ipv4Addr::from(v.to_ne_bytes())
}

/// The loaded programs, their pinned maps and the mirror of what is programmed. Dropping it
/// leaves programs attached (pinned links) and maps pinned: enforcement goes on without the
/// agent. [`PolicyEnforcer::remove_pins`] takes it all down.
pub struct PolicyEnforcer {
    ebpf: Ebpf,
    endpoints: EndpointsMap,
    ipcache: IpcacheMap,
    cidrs: CidrsMap,
    rules: RulesMap,
    host_ports: HostPortsMap,
    ct: CtMap,
    counters: PolCountersMap,
    tables: PolicyTables,
    pin_dir: PathBuf,
}

impl fmt::Debug for PolicyEnforcer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyEnforcer")
            .field("pin_dir", &self.pin_dir)
            .field("endpoints", &self.tables.endpoints.len())
            .field("rules", &self.tables.rules.len())
            .finish_non_exhaustive()
    }
}

/// The two hooks: program name and `enum bpf_attach_type`.
const HOOKS: [(&str, u32, CgroupSkbAttachType); 2] = [
    (
        POL_INGRESS_PROG,
        sys::BPF_CGROUP_INET_INGRESS,
        CgroupSkbAttachType::Ingress,
    ),
    (
        POL_EGRESS_PROG,
        sys::BPF_CGROUP_INET_EGRESS,
        CgroupSkbAttachType::Egress,
    ),
];

impl PolicyEnforcer {
    /// Loads the programs, pinning the maps in `pin_dir` or reusing those an earlier agent
    /// pinned there, and reads what they hold into the mirror. Attaches nothing.
    pub fn load(pin_dir: &Path, cfg: PolicyConfig) -> Result<Self, BpfError> {
        let object = object();
        if object.is_empty() {
            return Err(BpfError::NotBuilt);
        }
        if cfg.max_endpoints == 0
            || cfg.max_ipcache == 0
            || cfg.max_cidrs == 0
            || cfg.max_rules == 0
            || cfg.max_ct == 0
        {
            return Err(BpfError::ZeroCapacity);
        }
        fs::prepare_pin_dir(pin_dir)?;
        super::lb::check_pin_sizes(pin_dir, &POL_MAPS, expected_sizes)?;
        let mut loader = EbpfLoader::new();
        for name in POL_MAPS {
            loader.map_pin_path(name, fs::pin_path(pin_dir, name));
        }
        loader
            .map_max_entries(POL_ENDPOINTS_MAP, cfg.max_endpoints)
            .map_max_entries(POL_IPCACHE_MAP, cfg.max_ipcache)
            .map_max_entries(POL_CIDRS_MAP, cfg.max_cidrs)
            .map_max_entries(POL_RULES_MAP, cfg.max_rules)
            .map_max_entries(POL_CT_MAP, cfg.max_ct);
        let mut ebpf = loader
            .load(object)
            .map_err(|e| BpfError::Load(Box::new(e)))?;
        for (name, _, _) in HOOKS {
            program::<CgroupSkb>(&mut ebpf, name)?
                .load()
                .map_err(BpfError::program(name))?;
        }
        let mut p = PolicyEnforcer {
            endpoints: take_map(&mut ebpf, POL_ENDPOINTS_MAP, EndpointsMap::try_from)?,
            ipcache: take_map(&mut ebpf, POL_IPCACHE_MAP, IpcacheMap::try_from)?,
            cidrs: take_map(&mut ebpf, POL_CIDRS_MAP, CidrsMap::try_from)?,
            rules: take_map(&mut ebpf, POL_RULES_MAP, RulesMap::try_from)?,
            host_ports: take_map(&mut ebpf, POL_HOST_PORTS_MAP, HostPortsMap::try_from)?,
            ct: take_map(&mut ebpf, POL_CT_MAP, CtMap::try_from)?,
            counters: take_map(&mut ebpf, POL_COUNTERS_MAP, PolCountersMap::try_from)?,
            ebpf,
            tables: PolicyTables::default(),
            pin_dir: pin_dir.to_path_buf(),
        };
        p.tables = p.read_back()?;
        Ok(p)
    }

    /// What the pinned maps hold.
    fn read_back(&self) -> Result<PolicyTables, BpfError> {
        let mut t = PolicyTables::default();
        for e in self.endpoints.iter() {
            let (k, v) = e.map_err(BpfError::map(POL_ENDPOINTS_MAP))?;
            t.endpoints.insert(from_be(k), v.0);
        }
        for e in self.ipcache.iter() {
            let (k, v) = e.map_err(BpfError::map(POL_IPCACHE_MAP))?;
            t.ipcache.insert(from_be(k), v);
        }
        for e in self.cidrs.iter() {
            let (k, v) = e.map_err(BpfError::map(POL_CIDRS_MAP))?;
            let len = k.prefix_len().min(32) as u8;
            t.cidrs.insert((Ipv4Addr::from(k.data()), len), v);
        }
        for e in self.rules.iter() {
            let (k, v) = e.map_err(BpfError::map(POL_RULES_MAP))?;
            t.rules.insert(
                RuleKey {
                    key: k.data().0,
                    prefix_len: k.prefix_len(),
                },
                v,
            );
        }
        for e in self.host_ports.iter() {
            let (k, v) = e.map_err(BpfError::map(POL_HOST_PORTS_MAP))?;
            t.host_ports.insert((k.0.port, k.0.proto), v.0);
        }
        Ok(t)
    }

    /// Attaches both programs to the cgroup v2 directory `cgroup_dir` (the node's pod cgroup
    /// parent) through pinned links, or takes over an earlier agent's links there.
    pub fn attach(&mut self, cgroup_dir: &Path) -> Result<u64, BpfError> {
        let id = cgroup_id(cgroup_dir)?;
        if !is_cgroup2(cgroup_dir).map_err(BpfError::io(cgroup_dir))? {
            return Err(BpfError::NotCgroup2(cgroup_dir.to_path_buf()));
        }
        let dir = File::open(cgroup_dir).map_err(BpfError::io(cgroup_dir))?;
        for (name, attach_type, hook) in HOOKS {
            let pin = link_pin(&self.pin_dir, name);
            let prog = program::<CgroupSkb>(&mut self.ebpf, name)?;
            let outcome: TcAttach = pinned_cgroup_link(&pin, id, attach_type, name, prog, |p| {
                let link_id = p.attach(&dir, hook, CgroupAttachMode::Single)?;
                p.take_link(link_id)
            })?;
            tracing::debug!(program = name, ?outcome, "policy program attached");
        }
        Ok(id)
    }

    /// Starts handing every flow record the programs write (see `skiff_common::policy`) to
    /// `sink`, on a thread of its own, until the returned reader is dropped. Once: the ring
    /// buffer then belongs to the reader.
    pub fn start_flows(
        &mut self,
        mut sink: impl FnMut(PolFlowEvent) + Send + 'static,
    ) -> Result<super::lb::debug::Reader, BpfError> {
        let ring = take_map(&mut self.ebpf, POL_FLOWS_MAP, aya::maps::RingBuf::try_from)?;
        super::lb::debug::Reader::poll("skiff-policy-flows", ring, move |ring| {
            while let Some(item) = ring.next() {
                if item.len() >= std::mem::size_of::<PolFlowEvent>() {
                    // SAFETY: the record is a `PolFlowEvent` the program wrote (checked
                    // length; every bit pattern is valid; read unaligned).
                    let ev =
                        unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<PolFlowEvent>()) };
                    sink(ev);
                }
            }
        })
        .map_err(BpfError::io(Path::new(POL_FLOWS_MAP)))
    }

    /// The flows enforcement remembers (both directions of each share an entry).
    pub fn conntrack(&self) -> Vec<(PolCtKey, PolCtEntry)> {
        self.ct
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k.0, v.0))
            .collect()
    }

    fn write(&mut self, op: &PolicyOp) -> Result<(), BpfError> {
        let gone = |r: Result<(), MapError>, name: &'static str| match r {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(MapError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => {
                Ok(())
            }
            Err(e) => Err(BpfError::map(name)(e)),
        };
        match *op {
            PolicyOp::PutRule(k, v) => self
                .rules
                .insert(&Key::new(k.prefix_len, P(k.key)), v, 0)
                .map_err(BpfError::map(POL_RULES_MAP)),
            PolicyOp::DeleteRule(k) => gone(
                self.rules.remove(&Key::new(k.prefix_len, P(k.key))),
                POL_RULES_MAP,
            ),
            PolicyOp::PutIpcache(ip, id) => self
                .ipcache
                .insert(be(ip), id, 0)
                .map_err(BpfError::map(POL_IPCACHE_MAP)),
            PolicyOp::DeleteIpcache(ip) => gone(self.ipcache.remove(&be(ip)), POL_IPCACHE_MAP),
            PolicyOp::PutCidr((ip, len), id) => self
                .cidrs
                .insert(&Key::new(u32::from(len), ip.octets()), id, 0)
                .map_err(BpfError::map(POL_CIDRS_MAP)),
            PolicyOp::DeleteCidr((ip, len)) => gone(
                self.cidrs.remove(&Key::new(u32::from(len), ip.octets())),
                POL_CIDRS_MAP,
            ),
            PolicyOp::PutHostPort((port, proto), v) => self
                .host_ports
                .insert(P(host_port_key(port, proto)), P(v), 0)
                .map_err(BpfError::map(POL_HOST_PORTS_MAP)),
            PolicyOp::DeleteHostPort((port, proto)) => gone(
                self.host_ports.remove(&P(host_port_key(port, proto))),
                POL_HOST_PORTS_MAP,
            ),
            PolicyOp::PutEndpoint(ip, ep) => self
                .endpoints
                .insert(be(ip), P(ep), 0)
                .map_err(BpfError::map(POL_ENDPOINTS_MAP)),
            PolicyOp::DeleteEndpoint(ip) => gone(self.endpoints.remove(&be(ip)), POL_ENDPOINTS_MAP),
        }
    }

    /// Detaches the programs (removes their link pins) and removes the maps pinned in
    /// `pin_dir`, and `pin_dir` itself if that leaves it empty. Missing pins are fine.
    pub fn remove_pins(pin_dir: &Path) -> Result<(), BpfError> {
        Self::detach_pinned(pin_dir)?;
        for map in POL_MAPS {
            remove_file(&fs::pin_path(pin_dir, map))?;
        }
        fs::remove_dir_if_empty(pin_dir)
    }

    /// Detaches programs an earlier agent left attached (removes the link pins; maps stay),
    /// for an agent that does not enforce policy: nobody would keep the maps current.
    pub fn detach_pinned(pin_dir: &Path) -> Result<(), BpfError> {
        for (name, _, _) in HOOKS {
            remove_file(&link_pin(pin_dir, name))?;
        }
        Ok(())
    }
}

fn host_port_key(port: u16, proto: u8) -> PolHostPortKey {
    PolHostPortKey {
        port,
        proto,
        _pad: 0,
    }
}

impl PolicyDatapath for PolicyEnforcer {
    fn tables(&self) -> &PolicyTables {
        &self.tables
    }

    fn apply(&mut self, desired: &PolicyTables) -> Result<usize, BpfError> {
        let ops = plan(&self.tables, desired);
        for (i, op) in ops.iter().enumerate() {
            if let Err(e) = self.write(op) {
                // The maps hold the first `i` writes; read them back so the next apply plans
                // from the truth.
                tracing::warn!(written = i, error = %e, "policy map write failed");
                self.tables = self.read_back()?;
                return Err(e);
            }
        }
        self.tables = desired.clone();
        Ok(ops.len())
    }

    fn counters(&self) -> Result<Vec<(PolCounterKey, PolCounters)>, BpfError> {
        let mut out = Vec::new();
        for e in self.counters.iter() {
            let (k, per_cpu) = e.map_err(BpfError::map(POL_COUNTERS_MAP))?;
            out.push((k.0, PolCounters::sum(per_cpu.iter().map(|c| &c.0))));
        }
        out.sort_by_key(|(k, _)| *k);
        Ok(out)
    }
}

/// Key and value sizes each policy map must have.
fn expected_sizes(name: &str) -> Option<(u32, u32)> {
    use std::mem::size_of;
    let s = |k: usize, v: usize| Some((k as u32, v as u32));
    match name {
        POL_ENDPOINTS_MAP => s(4, size_of::<PolEndpoint>()),
        POL_IPCACHE_MAP => s(4, 4),
        POL_CIDRS_MAP => s(4 + 4, 4),
        POL_RULES_MAP => s(4 + size_of::<PolRuleKey>(), 4),
        POL_HOST_PORTS_MAP => s(size_of::<PolHostPortKey>(), size_of::<PolHostPort>()),
        POL_CT_MAP => s(size_of::<PolCtKey>(), size_of::<PolCtEntry>()),
        POL_COUNTERS_MAP => s(size_of::<PolCounterKey>(), size_of::<PolCounters>()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeds_the_policy_object_with_btf() {
        let mut names: Vec<&str> = POL_MAPS.to_vec();
        names.extend([POL_INGRESS_PROG, POL_EGRESS_PROG, "PolRuleKey", "PolCtKey"]);
        crate::tests::assert_embedded(object(), &names);
    }

    #[test]
    fn every_map_has_expected_sizes() {
        for name in POL_MAPS {
            assert!(expected_sizes(name).is_some(), "{name}");
        }
    }

    /// Expands blocks back into ports.
    fn covered(blocks: &[(u16, u8)]) -> Vec<u32> {
        let mut ports = Vec::new();
        for &(start, bits) in blocks {
            let size = 1u32 << (16 - u32::from(bits));
            assert_eq!(
                u32::from(start) % size,
                0,
                "block {start}/{bits} not aligned"
            );
            ports.extend(u32::from(start)..u32::from(start) + size);
        }
        ports
    }

    #[test]
    fn port_ranges_become_exact_aligned_blocks() {
        for (lo, hi) in [
            (80, 80),
            (80, 81),
            (32000, 32768),
            (1, 65535),
            (0, 65535),
            (1024, 2047),
            (65535, 65535),
            (5000, 5003),
        ] {
            let blocks = port_blocks(lo, hi);
            assert_eq!(
                covered(&blocks),
                (u32::from(lo)..=u32::from(hi)).collect::<Vec<_>>(),
                "{lo}-{hi}"
            );
            assert!(blocks.len() <= 30, "{lo}-{hi}: {}", blocks.len());
        }
        assert_eq!(port_blocks(1024, 2047), vec![(1024, 6)]);
        assert_eq!(port_blocks(0, 65535), vec![(0, 0)]);
        assert!(port_blocks(9, 8).is_empty());
    }

    #[test]
    fn rule_keys_place_the_prefix_at_the_field_ends() {
        let any = rule_keys(7, DIR_INGRESS, ID_ANY, None);
        assert_eq!(any.len(), 1);
        assert_eq!(any[0].prefix_len, 72);
        let tcp = rule_keys(
            7,
            DIR_INGRESS,
            300,
            Some(PortMatch {
                proto: 6,
                ports: None,
            }),
        );
        assert_eq!(tcp[0].prefix_len, 80);
        assert_eq!(tcp[0].key.proto(), 6);
        let one = rule_keys(
            7,
            DIR_EGRESS,
            300,
            Some(PortMatch {
                proto: 17,
                ports: Some((53, 53)),
            }),
        );
        assert_eq!(one.len(), 1);
        assert_eq!((one[0].prefix_len, one[0].key.port()), (96, 53));
        // SCTP is planned like any protocol.
        let sctp = rule_keys(
            7,
            DIR_INGRESS,
            300,
            Some(PortMatch {
                proto: 132,
                ports: Some((5000, 5003)),
            }),
        );
        assert_eq!(sctp.len(), 1);
        assert_eq!(
            (sctp[0].prefix_len, sctp[0].key.port(), sctp[0].key.proto()),
            (94, 5000, 132)
        );
    }

    fn ep(id: u32, flags: u32) -> PolEndpoint {
        PolEndpoint {
            id,
            flags,
            ingress_policy: 9,
            egress_policy: 0,
        }
    }

    #[test]
    fn plans_rules_before_isolation_and_removals_after() {
        let ip = Ipv4Addr::new(10, 244, 0, 5);
        let peer = Ipv4Addr::new(10, 244, 1, 7);
        let rule = rule_keys(1, DIR_INGRESS, 300, None)[0];
        let mut desired = PolicyTables::default();
        desired.rules.insert(rule, 9);
        desired.ipcache.insert(peer, 300);
        desired.endpoints.insert(ip, ep(1, EP_INGRESS_ISOLATED));
        let ops = plan(&PolicyTables::default(), &desired);
        assert_eq!(
            ops,
            vec![
                PolicyOp::PutRule(rule, 9),
                PolicyOp::PutIpcache(peer, 300),
                PolicyOp::PutEndpoint(ip, ep(1, EP_INGRESS_ISOLATED)),
            ]
        );
        // Nothing changes: nothing written.
        assert!(plan(&desired, &desired).is_empty());
        // The policy goes: isolation off first, then the rule, then the identity.
        let mut after = PolicyTables::default();
        after.endpoints.insert(ip, ep(1, 0));
        assert_eq!(
            plan(&desired, &after),
            vec![
                PolicyOp::PutEndpoint(ip, ep(1, 0)),
                PolicyOp::DeleteRule(rule),
                PolicyOp::DeleteIpcache(peer),
            ]
        );
    }
}
