//! NetworkPolicy → the enforcement tables (pure): which local pods are isolated per
//! direction, and which (peer identity, protocol, port) each may talk to, as Kubernetes
//! defines it (`networking.k8s.io/v1`):
//!
//! - a pod is isolated for a direction once some policy of its namespace selects it
//!   (`podSelector`) with that direction in `policyTypes`; then only what some selecting
//!   policy's rules allow gets through (rules and policies add up);
//! - a rule's peers: `podSelector` alone (pods of the policy's namespace), `namespaceSelector`
//!   alone (every pod of matching namespaces), both in one peer (AND), `ipBlock` (`cidr`
//!   minus `except`); several peers OR; no peers: everyone, also outside the cluster;
//! - a rule's ports: protocol (TCP by default, UDP, SCTP), a number, a range (`endPort`) or a
//!   named container port (ingress: the selected pod's; egress: the peer pod's); no ports:
//!   every port of every protocol.
//!
//! Pods are grouped into *identities* by (namespace, labels): whether a peer selector picks a
//! pod depends only on those, so the rules are computed per identity and a pod's rules grow
//! with the number of distinct peers, not of pods. ipBlocks become CIDR identities, one per
//! distinct prefix named (cidr or except): the kernel's longest-prefix match gives an address
//! the smallest listed prefix holding it, and a block selects a prefix exactly when the prefix
//! lies inside `cidr` and inside no `except`, which is the block's meaning for every address
//! whose longest match it is.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use skiff_api::api::{
    LabelSelector, Namespace, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, Pod,
};
use skiff_api::selector::Selector;
use skiff_cidr::Cidr;
use skiff_datapath::policy::{
    DIR_EGRESS, DIR_INGRESS, EP_EGRESS_ISOLATED, EP_INGRESS_ISOLATED, ID_ANY, ID_FIRST_CIDR,
    ID_FIRST_LABELS, ID_HOST, PolEndpoint, PolHostPort, PolicyTables, PortMatch, rule_keys,
};

/// The label every namespace carries with its own name (Kubernetes sets it on every
/// Namespace; it is implied here as well, so selectors using it work on older objects).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A pod identity: its namespace and labels.
pub type LabelKey = (String, BTreeMap<String, String>);

/// Hands out stable numbers for keys, keeping them across compilations as long as the key is
/// used, so a change elsewhere does not renumber (and rewrite) everything.
#[derive(Debug)]
pub struct Numbers<K: Ord + Clone> {
    by_key: BTreeMap<K, u32>,
    first: u32,
    next: u32,
}

impl<K: Ord + Clone> Numbers<K> {
    pub fn new(first: u32) -> Self {
        Numbers {
            by_key: BTreeMap::new(),
            first,
            next: first,
        }
    }

    /// The number of `key`, assigned now if it has none.
    pub fn get(&mut self, key: &K) -> u32 {
        if let Some(n) = self.by_key.get(key) {
            return *n;
        }
        let used: BTreeSet<u32> = self.by_key.values().copied().collect();
        while used.contains(&self.next) || self.next < self.first {
            self.next = self.next.checked_add(1).unwrap_or(self.first);
        }
        let n = self.next;
        self.next = self.next.checked_add(1).unwrap_or(self.first);
        self.by_key.insert(key.clone(), n);
        n
    }

    /// Keeps the numbers of `keys` only.
    pub fn retain(&mut self, keys: &BTreeSet<K>) {
        self.by_key.retain(|k, _| keys.contains(k));
    }

    /// Takes over `key`'s number `n` (read back from the maps an earlier agent wrote), unless
    /// either is taken.
    pub fn seed(&mut self, key: K, n: u32) {
        if n >= self.first
            && !self.by_key.contains_key(&key)
            && !self.by_key.values().any(|v| *v == n)
        {
            self.by_key.insert(key, n);
        }
    }
}

/// The identities an agent keeps between compilations.
#[derive(Debug)]
pub struct Identities {
    pub labels: Numbers<LabelKey>,
    pub cidrs: Numbers<(Ipv4Addr, u8)>,
}

impl Default for Identities {
    fn default() -> Self {
        Identities {
            labels: Numbers::new(ID_FIRST_LABELS),
            cidrs: Numbers::new(ID_FIRST_CIDR),
        }
    }
}

/// A port of the node standing for the pods of a Service (the agent's cluster DNS for
/// kube-dns), so egress rules about those pods apply to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostService {
    /// The node port and protocol the pods' traffic really goes to.
    pub node_port: u16,
    pub protocol: u8,
    /// The port and the (namespace, labels) of the pods it stands for.
    pub port: u16,
    pub identity: LabelKey,
}

/// What the compiler reads.
#[derive(Debug)]
pub struct Inputs<'a> {
    pub node: &'a str,
    pub policies: &'a [std::sync::Arc<NetworkPolicy>],
    pub pods: &'a [std::sync::Arc<Pod>],
    pub namespaces: &'a [std::sync::Arc<Namespace>],
    /// This node's own addresses.
    pub host_ips: &'a [Ipv4Addr],
    pub host_services: &'a [HostService],
}

/// The tables, and the policy behind each index they name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    pub tables: PolicyTables,
    /// Policy index → `namespace/name`.
    pub policies: BTreeMap<u32, String>,
}

/// The IP protocol number of a Kubernetes protocol name (absent: TCP, as defaulted).
fn protocol_number(p: Option<&str>) -> Option<u8> {
    skiff_datapath::lb::Protocol::parse(p.unwrap_or("TCP")).map(|p| p.number())
}

/// The policy's index: a stable hash of `namespace/name` (FNV-1a), never 0, so counters
/// and flow records keep their meaning across agent restarts.
pub fn policy_index(namespace: &str, name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in namespace.bytes().chain([b'/']).chain(name.bytes()) {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.max(1)
}

/// A pod that takes part: has an IPv4 address of its own and is not finished.
fn pod_ip(p: &Pod) -> Option<Ipv4Addr> {
    let spec = p.spec.as_ref()?;
    if spec.host_network {
        return None;
    }
    let status = p.status.as_ref()?;
    if matches!(status.phase.as_str(), "Succeeded" | "Failed") {
        return None;
    }
    status.pod_ip.parse().ok()
}

fn labels_of(p: &Pod) -> BTreeMap<String, String> {
    p.metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default()
}

fn namespace_of(p: &Pod) -> &str {
    p.metadata
        .as_ref()
        .map(|m| m.namespace.as_str())
        .unwrap_or("")
}

/// A parsed selector; `None` when absent. The API server validated it, so one that does not
/// parse (an object written before validation existed) is `None` too and, where a selector
/// is required (podSelector of the policy), selects nothing.
fn selector(s: Option<&LabelSelector>) -> Option<Selector> {
    s.and_then(|s| Selector::from_label_selector(s).ok())
}

/// One compilation. Identities of `ids` are kept for the next one.
pub fn compile(input: &Inputs<'_>, ids: &mut Identities) -> Compiled {
    let ns_labels = namespace_labels(input.namespaces);
    let mut out = Compiled::default();
    let (members, label_ids) = label_identities(input, ids, &mut out);
    let cidr_ids = cidr_identities(input.policies, ids);
    out.tables.cidrs = cidr_ids.clone();

    let mut by_id: BTreeMap<u32, Vec<&Pod>> = BTreeMap::new();
    for (key, pods) in &members {
        by_id.insert(label_ids[key], pods.clone());
    }
    let ctx = CompileCtx {
        label_ids: &label_ids,
        cidr_ids: &cidr_ids,
        ns_labels: &ns_labels,
        by_id: &by_id,
    };

    // Policies in (namespace, name) order: the first isolating one is blamed for drops.
    let mut policies: Vec<&NetworkPolicy> = input.policies.iter().map(|p| p.as_ref()).collect();
    policies.sort_by_key(|p| meta(p));

    for pod in input.pods {
        let on_node = pod.spec.as_ref().is_some_and(|s| s.node_name == input.node);
        let Some(ip) = pod_ip(pod).filter(|_| on_node) else {
            continue;
        };
        let ep = endpoint(&ctx, &policies, pod, ip, &mut out);
        out.tables.endpoints.insert(ip, ep);
    }
    out
}

/// Namespaces' labels, with the name label implied.
fn namespace_labels(
    namespaces: &[std::sync::Arc<Namespace>],
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut ns_labels = BTreeMap::new();
    for ns in namespaces {
        let Some(m) = ns.metadata.as_ref() else {
            continue;
        };
        let mut labels = m.labels.clone();
        labels
            .entry(NAMESPACE_NAME_LABEL.to_string())
            .or_insert_with(|| m.name.clone());
        ns_labels.insert(m.name.clone(), labels);
    }
    ns_labels
}

/// The pods of each label set.
type Members<'a> = BTreeMap<LabelKey, Vec<&'a Pod>>;

/// Every identity: the pods' (their addresses go into the ipcache), and those the node's
/// host services stand for (their ports go into the host port table). Returns the members
/// of each label set and its identity.
fn label_identities<'a>(
    input: &Inputs<'a>,
    ids: &mut Identities,
    out: &mut Compiled,
) -> (Members<'a>, BTreeMap<LabelKey, u32>) {
    let mut members: BTreeMap<LabelKey, Vec<&Pod>> = BTreeMap::new();
    for pod in input.pods {
        let Some(ip) = pod_ip(pod) else { continue };
        let key = (namespace_of(pod).to_string(), labels_of(pod));
        let id = ids.labels.get(&key);
        out.tables.ipcache.insert(ip, id);
        members.entry(key).or_default().push(pod);
    }
    for hs in input.host_services {
        members.entry(hs.identity.clone()).or_default();
    }
    for ip in input.host_ips {
        out.tables.ipcache.insert(*ip, ID_HOST);
    }
    ids.labels.retain(&members.keys().cloned().collect());
    let label_ids: BTreeMap<LabelKey, u32> = members
        .keys()
        .map(|k| (k.clone(), ids.labels.get(k)))
        .collect();
    for hs in input.host_services {
        out.tables.host_ports.insert(
            (hs.node_port, hs.protocol),
            PolHostPort {
                identity: label_ids[&hs.identity],
                port: hs.port,
                _pad: [0; 2],
            },
        );
    }
    (members, label_ids)
}

/// Every ipBlock prefix (IPv4; pods have IPv4 addresses) is a CIDR identity.
fn cidr_identities(
    policies: &[std::sync::Arc<NetworkPolicy>],
    ids: &mut Identities,
) -> BTreeMap<(Ipv4Addr, u8), u32> {
    let mut prefixes: BTreeSet<(Ipv4Addr, u8)> = BTreeSet::new();
    for p in policies {
        for peer in all_peers(p) {
            if let Some(b) = &peer.ip_block {
                let named = std::iter::once(&b.cidr).chain(b.except.iter());
                prefixes.extend(named.filter_map(|c| v4_prefix(c)));
            }
        }
    }
    ids.cidrs.retain(&prefixes);
    prefixes.iter().map(|p| (*p, ids.cidrs.get(p))).collect()
}

/// The endpoint entry of local pod `pod` (address `ip`), with the rules of the policies
/// (sorted) that select it added to `out`.
fn endpoint(
    ctx: &CompileCtx<'_>,
    policies: &[&NetworkPolicy],
    pod: &Pod,
    ip: Ipv4Addr,
    out: &mut Compiled,
) -> PolEndpoint {
    let ns = namespace_of(pod);
    let labels = labels_of(pod);
    let mut ep = PolEndpoint {
        id: u32::from(ip),
        flags: 0,
        ingress_policy: 0,
        egress_policy: 0,
    };
    for policy in policies.iter().filter(|p| meta(p).0 == ns) {
        let Some(spec) = policy.spec.as_ref() else {
            continue;
        };
        let selected = match &spec.pod_selector {
            None => true,
            Some(s) => selector(Some(s)).is_some_and(|s| s.matches(&labels)),
        };
        if !selected {
            continue;
        }
        let (pns, pname) = meta(policy);
        let idx = policy_index(&pns, &pname);
        out.policies.insert(idx, format!("{pns}/{pname}"));
        let (ingress, egress) = policy_types(spec);
        if ingress {
            if ep.flags & EP_INGRESS_ISOLATED == 0 {
                ep.ingress_policy = idx;
            }
            ep.flags |= EP_INGRESS_ISOLATED;
            for rule in &spec.ingress {
                let peers = ctx.peers(ns, &rule.from);
                for port in port_specs(&rule.ports) {
                    // Named ports: the selected pod's own.
                    let resolved = port.resolve(std::slice::from_ref(&pod));
                    for id in peers.iter() {
                        add_rules(&mut out.tables, ep.id, DIR_INGRESS, id, &resolved, idx);
                    }
                }
            }
        }
        if egress {
            if ep.flags & EP_EGRESS_ISOLATED == 0 {
                ep.egress_policy = idx;
            }
            ep.flags |= EP_EGRESS_ISOLATED;
            for rule in &spec.egress {
                egress_rules(ctx, ns, &rule.to, &rule.ports, ep.id, idx, &mut out.tables);
            }
        }
    }
    ep
}

/// The rules of one egress rule of policy `idx` for endpoint `ep_id`.
fn egress_rules(
    ctx: &CompileCtx<'_>,
    ns: &str,
    to: &[NetworkPolicyPeer],
    ports: &[NetworkPolicyPort],
    ep_id: u32,
    idx: u32,
    tables: &mut PolicyTables,
) {
    let peers = ctx.peers(ns, to);
    for port in port_specs(ports) {
        for id in peers.iter() {
            // Named ports: the peer pods' (none for ipBlocks and "anyone" but the pods of
            // the cluster).
            let resolved = match (&port, id) {
                (PortSpec::Named { .. }, ID_ANY) => {
                    let all: Vec<&Pod> = ctx.by_id.values().flatten().copied().collect();
                    port.resolve(&all)
                }
                (PortSpec::Named { .. }, _) => {
                    port.resolve(ctx.by_id.get(&id).map(Vec::as_slice).unwrap_or(&[]))
                }
                _ => port.resolve(&[]),
            };
            add_rules(tables, ep_id, DIR_EGRESS, id, &resolved, idx);
        }
    }
}

/// What rules look peers up in.
struct CompileCtx<'a> {
    label_ids: &'a BTreeMap<LabelKey, u32>,
    cidr_ids: &'a BTreeMap<(Ipv4Addr, u8), u32>,
    ns_labels: &'a BTreeMap<String, BTreeMap<String, String>>,
    by_id: &'a BTreeMap<u32, Vec<&'a Pod>>,
}

/// The peers of one rule: identities, or everyone.
enum Peers {
    Anyone,
    Identities(BTreeSet<u32>),
}

impl Peers {
    fn iter(&self) -> Vec<u32> {
        match self {
            Peers::Anyone => vec![ID_ANY],
            Peers::Identities(ids) => ids.iter().copied().collect(),
        }
    }
}

impl CompileCtx<'_> {
    fn ns_labels(&self, ns: &str) -> BTreeMap<String, String> {
        self.ns_labels
            .get(ns)
            .cloned()
            .unwrap_or_else(|| BTreeMap::from([(NAMESPACE_NAME_LABEL.to_string(), ns.to_string())]))
    }

    fn peers(&self, policy_ns: &str, peers: &[NetworkPolicyPeer]) -> Peers {
        if peers.is_empty() {
            return Peers::Anyone;
        }
        let _ = self.by_id;
        let mut out = BTreeSet::new();
        for peer in peers {
            if let Some(block) = &peer.ip_block {
                let Some(cidr) = v4_prefix(&block.cidr) else {
                    continue;
                };
                let excepts: Vec<(Ipv4Addr, u8)> =
                    block.except.iter().filter_map(|e| v4_prefix(e)).collect();
                for (q, id) in self.cidr_ids {
                    if inside(*q, cidr) && !excepts.iter().any(|e| inside(*q, *e)) {
                        out.insert(*id);
                    }
                }
                continue;
            }
            let pods = selector(peer.pod_selector.as_ref());
            let nss = selector(peer.namespace_selector.as_ref());
            for ((ns, labels), id) in self.label_ids {
                let ns_ok = match &nss {
                    Some(sel) => sel.matches(&self.ns_labels(ns)),
                    None => ns == policy_ns,
                };
                if ns_ok && pods.as_ref().is_none_or(|sel| sel.matches(labels)) {
                    out.insert(*id);
                }
            }
        }
        Peers::Identities(out)
    }
}

/// One entry of a rule's `ports`.
enum PortSpec {
    /// No ports: every protocol and port.
    All,
    Numbers(PortMatch),
    Named {
        proto: u8,
        name: String,
    },
}

impl PortSpec {
    /// The port matches, named ports resolved against the container ports of `pods`.
    fn resolve(&self, pods: &[&Pod]) -> Vec<Option<PortMatch>> {
        match self {
            PortSpec::All => vec![None],
            PortSpec::Numbers(m) => vec![Some(*m)],
            PortSpec::Named { proto, name } => {
                let mut found = BTreeSet::new();
                for p in pods {
                    for c in p
                        .spec
                        .iter()
                        .flat_map(|s| s.containers.iter().chain(&s.init_containers))
                    {
                        for cp in &c.ports {
                            let cp_proto = protocol_number(
                                Some(cp.protocol.as_str()).filter(|s| !s.is_empty()),
                            );
                            if cp.name == *name
                                && cp_proto == Some(*proto)
                                && let Ok(n) = u16::try_from(cp.container_port)
                            {
                                found.insert(n);
                            }
                        }
                    }
                }
                found
                    .into_iter()
                    .map(|n| {
                        Some(PortMatch {
                            proto: *proto,
                            ports: Some((n, n)),
                        })
                    })
                    .collect()
            }
        }
    }
}

fn port_specs(ports: &[NetworkPolicyPort]) -> Vec<PortSpec> {
    if ports.is_empty() {
        return vec![PortSpec::All];
    }
    let mut out = Vec::new();
    for p in ports {
        let Some(proto) = protocol_number(p.protocol.as_deref()) else {
            continue;
        };
        match p.port.as_deref() {
            None => out.push(PortSpec::Numbers(PortMatch { proto, ports: None })),
            Some(text) => match text.parse::<u16>() {
                Ok(n) => {
                    let end = p
                        .end_port
                        .and_then(|e| u16::try_from(e).ok())
                        .unwrap_or(n)
                        .max(n);
                    out.push(PortSpec::Numbers(PortMatch {
                        proto,
                        ports: Some((n, end)),
                    }));
                }
                Err(_) => out.push(PortSpec::Named {
                    proto,
                    name: text.to_string(),
                }),
            },
        }
    }
    out
}

fn add_rules(
    t: &mut PolicyTables,
    endpoint: u32,
    dir: u8,
    identity: u32,
    ports: &[Option<PortMatch>],
    policy: u32,
) {
    for port in ports {
        for k in rule_keys(endpoint, dir, identity, *port) {
            t.rules.entry(k).or_insert(policy);
        }
    }
}

/// `policyTypes`, or Kubernetes' default when empty: Ingress, and Egress when there are
/// egress rules.
fn policy_types(spec: &skiff_api::api::NetworkPolicySpec) -> (bool, bool) {
    if spec.policy_types.is_empty() {
        return (true, !spec.egress.is_empty());
    }
    (
        spec.policy_types.iter().any(|t| t == "Ingress"),
        spec.policy_types.iter().any(|t| t == "Egress"),
    )
}

/// An IPv4 ipBlock prefix as its canonical network (IPv6 ones are left out: pods are IPv4).
fn v4_prefix(s: &str) -> Option<(Ipv4Addr, u8)> {
    let c = Cidr::parse_lenient(s).ok()?;
    match c.network() {
        IpAddr::V4(a) => Some((a, c.prefix_len())),
        IpAddr::V6(_) => None,
    }
}

fn meta(p: &NetworkPolicy) -> (String, String) {
    p.metadata
        .as_ref()
        .map(|m| (m.namespace.clone(), m.name.clone()))
        .unwrap_or_default()
}

fn all_peers(p: &NetworkPolicy) -> impl Iterator<Item = &NetworkPolicyPeer> {
    p.spec.iter().flat_map(|s| {
        s.ingress
            .iter()
            .flat_map(|r| r.from.iter())
            .chain(s.egress.iter().flat_map(|r| r.to.iter()))
    })
}

/// Whether prefix `q` lies inside prefix `outer`.
fn inside(q: (Ipv4Addr, u8), outer: (Ipv4Addr, u8)) -> bool {
    if q.1 < outer.1 {
        return false;
    }
    let mask = if outer.1 == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(outer.1))
    };
    u32::from(q.0) & mask == u32::from(outer.0) & mask
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use skiff_common::lb::{IPPROTO_SCTP as SCTP, IPPROTO_TCP as TCP, IPPROTO_UDP as UDP};

    use serde_json::json;
    use skiff_datapath::policy::{PolicyTables, RuleKey};

    use super::*;

    const NODE: &str = "n1";

    fn pod(ns: &str, name: &str, ip: &str, node: &str, labels: serde_json::Value) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": ns, "name": name, "labels": labels},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
                "status": {"phase": "Running", "podIP": ip},
            }))
            .expect("pod"),
        )
    }

    fn ns(name: &str, labels: serde_json::Value) -> Arc<Namespace> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("namespace"),
        )
    }

    fn policy(ns: &str, name: &str, spec: serde_json::Value) -> Arc<NetworkPolicy> {
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"namespace": ns, "name": name}, "spec": spec}),
            )
            .expect("policy"),
        )
    }

    /// x/a (local, app=a), x/b (local, app=b), y/a (remote, app=a), y/a2 (remote, app=a).
    fn world() -> (Vec<Arc<Pod>>, Vec<Arc<Namespace>>) {
        (
            vec![
                pod("x", "a", "10.244.0.2", NODE, json!({"app": "a"})),
                pod("x", "b", "10.244.0.3", NODE, json!({"app": "b"})),
                pod("y", "a", "10.244.1.2", "n2", json!({"app": "a"})),
                pod("y", "a2", "10.244.1.3", "n2", json!({"app": "a"})),
            ],
            vec![
                ns("x", json!({"team": "red"})),
                ns("y", json!({"team": "blue"})),
            ],
        )
    }

    fn run(policies: &[Arc<NetworkPolicy>], ids: &mut Identities) -> Compiled {
        let (pods, nss) = world();
        compile(
            &Inputs {
                node: NODE,
                policies,
                pods: &pods,
                namespaces: &nss,
                host_ips: &[Ipv4Addr::new(192, 168, 0, 1)],
                host_services: &[],
            },
            ids,
        )
    }

    fn ep(t: &PolicyTables, ip: &str) -> PolEndpoint {
        t.endpoints[&ip.parse::<Ipv4Addr>().expect("ip")]
    }

    fn id_of(t: &PolicyTables, ip: &str) -> u32 {
        t.ipcache[&ip.parse::<Ipv4Addr>().expect("ip")]
    }

    /// The (direction, identity, protocol, port, prefix) of every rule of endpoint `ip`.
    fn rules(t: &PolicyTables, ip: &str) -> Vec<(u8, u32, u8, u16, u32)> {
        let id = u32::from(ip.parse::<Ipv4Addr>().expect("ip"));
        t.rules
            .keys()
            .filter(|k: &&RuleKey| k.key.endpoint() == id)
            .map(|k| {
                (
                    k.key.dir(),
                    k.key.identity(),
                    k.key.proto(),
                    k.key.port(),
                    k.prefix_len,
                )
            })
            .collect()
    }

    #[test]
    fn without_policies_nothing_is_isolated_and_every_pod_has_an_identity() {
        let c = run(&[], &mut Identities::default());
        assert_eq!(c.tables.endpoints.len(), 2, "only local pods are endpoints");
        assert_eq!(ep(&c.tables, "10.244.0.2").flags, 0);
        assert_eq!(c.tables.ipcache.len(), 5, "four pods and the node");
        assert_eq!(c.tables.ipcache[&Ipv4Addr::new(192, 168, 0, 1)], ID_HOST);
        // Same namespace and labels: one identity.
        assert_eq!(
            id_of(&c.tables, "10.244.1.2"),
            id_of(&c.tables, "10.244.1.3")
        );
        assert_ne!(
            id_of(&c.tables, "10.244.0.2"),
            id_of(&c.tables, "10.244.1.2")
        );
        assert!(c.tables.rules.is_empty());
    }

    #[test]
    fn a_selecting_policy_isolates_per_direction_and_is_blamed() {
        let deny = policy(
            "x",
            "deny",
            json!({"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Ingress"]}),
        );
        let c = run(&[deny], &mut Identities::default());
        let a = ep(&c.tables, "10.244.0.2");
        assert_eq!(a.flags, EP_INGRESS_ISOLATED);
        assert_eq!(a.ingress_policy, policy_index("x", "deny"));
        assert_eq!(c.policies[&policy_index("x", "deny")], "x/deny");
        assert_eq!(ep(&c.tables, "10.244.0.3").flags, 0, "x/b is not selected");
        assert!(c.tables.rules.is_empty());
        // Egress rules imply Egress when policyTypes is empty.
        let both = policy("x", "both", json!({"podSelector": {}, "egress": [{}]}));
        let c = run(&[both], &mut Identities::default());
        assert_eq!(
            ep(&c.tables, "10.244.0.3").flags,
            EP_INGRESS_ISOLATED | EP_EGRESS_ISOLATED
        );
        assert_eq!(
            rules(&c.tables, "10.244.0.3"),
            vec![(DIR_EGRESS, ID_ANY, 0, 0, 72)]
        );
    }

    #[test]
    fn peers_and_or_and_namespaces() {
        let mut ids = Identities::default();
        // podSelector alone: the policy's namespace only.
        let same_ns = policy(
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "b"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}]}]}),
        );
        let c = run(&[same_ns], &mut ids);
        let xa = id_of(&c.tables, "10.244.0.2");
        let ya = id_of(&c.tables, "10.244.1.2");
        assert_eq!(
            rules(&c.tables, "10.244.0.3"),
            vec![(DIR_INGRESS, xa, 0, 0, 72)]
        );
        // Both in one peer: app=a in team=blue namespaces (AND).
        let and = policy(
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "b"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}},
                                   "podSelector": {"matchLabels": {"app": "a"}}}]}]}),
        );
        let c = run(&[and], &mut ids);
        assert_eq!(
            rules(&c.tables, "10.244.0.3"),
            vec![(DIR_INGRESS, ya, 0, 0, 72)]
        );
        // Separate peers (OR): every pod of team=blue, or app=a of x; by the implied name label.
        let or = policy(
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "b"}},
            "ingress": [{"from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}},
                {"podSelector": {"matchLabels": {"app": "a"}}}]}]}),
        );
        let c = run(&[or], &mut ids);
        let mut want = vec![(DIR_INGRESS, xa, 0, 0, 72), (DIR_INGRESS, ya, 0, 0, 72)];
        want.sort();
        assert_eq!(rules(&c.tables, "10.244.0.3"), want);
        // Identity numbers stay across compilations.
        assert_eq!(id_of(&c.tables, "10.244.1.2"), ya);
    }

    #[test]
    fn ip_blocks_become_prefix_identities_that_honour_except() {
        let p = policy(
            "x",
            "p",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/24"]}}]}]}),
        );
        let c = run(&[p], &mut Identities::default());
        let cidrs = &c.tables.cidrs;
        assert_eq!(cidrs.len(), 2);
        let wide = cidrs[&(Ipv4Addr::new(10, 244, 0, 0), 16)];
        let hole = cidrs[&(Ipv4Addr::new(10, 244, 1, 0), 24)];
        assert!(wide >= ID_FIRST_CIDR && hole >= ID_FIRST_CIDR);
        // The block selects the /16's identity, not the except's.
        assert_eq!(
            rules(&c.tables, "10.244.0.2"),
            vec![(DIR_EGRESS, wide, 0, 0, 72)]
        );
        assert!(inside(
            (Ipv4Addr::new(10, 244, 1, 0), 24),
            (Ipv4Addr::new(10, 244, 0, 0), 16)
        ));
        assert!(!inside(
            (Ipv4Addr::new(10, 0, 0, 0), 8),
            (Ipv4Addr::new(10, 244, 0, 0), 16)
        ));
        // Host bits set (Kubernetes 1.32 accepts 10.244.0.1/16): the network is meant.
        let p = policy(
            "x",
            "p",
            json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.244.0.1/16"}}]}]}),
        );
        let c = run(&[p], &mut Identities::default());
        assert!(
            c.tables
                .cidrs
                .contains_key(&(Ipv4Addr::new(10, 244, 0, 0), 16))
        );
    }

    #[test]
    fn ports_numbers_ranges_protocols_and_names() {
        let p = policy(
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "a"}},
            "ingress": [{"ports": [
                {"port": 80},
                {"protocol": "UDP", "port": 1024, "endPort": 2047},
                {"protocol": "SCTP"},
                {"port": "http"},
                {"port": "nope"}]}],
            "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "a"}}}],
                        "ports": [{"port": "http"}]}],
            "policyTypes": ["Ingress", "Egress"]}),
        );
        let c = run(&[p], &mut Identities::default());
        let ya = id_of(&c.tables, "10.244.1.2");
        let xa = id_of(&c.tables, "10.244.0.2");
        let mut want = vec![
            (DIR_INGRESS, ID_ANY, TCP, 80, 96),
            (DIR_INGRESS, ID_ANY, UDP, 1024, 86),
            (DIR_INGRESS, ID_ANY, SCTP, 0, 80),
            // The selected pod's own port named http.
            (DIR_INGRESS, ID_ANY, TCP, 8080, 96),
            // Egress: the peers' port named http.
            (DIR_EGRESS, xa, TCP, 8080, 96),
            (DIR_EGRESS, ya, TCP, 8080, 96),
        ];
        want.sort();
        assert_eq!(rules(&c.tables, "10.244.0.2"), want);
    }

    #[test]
    fn rules_grow_with_distinct_peers_not_pods() {
        let p = policy(
            "x",
            "p",
            json!({"podSelector": {},
            "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
        );
        let (mut pods, nss) = world();
        let small = compile(
            &Inputs {
                node: NODE,
                policies: std::slice::from_ref(&p),
                pods: &pods,
                namespaces: &nss,
                host_ips: &[],
                host_services: &[],
            },
            &mut Identities::default(),
        );
        // Fifty more remote pods with labels already seen.
        for i in 0..50 {
            pods.push(pod(
                "y",
                &format!("more{i}"),
                &format!("10.244.2.{}", i + 2),
                "n2",
                json!({"app": "a"}),
            ));
        }
        let big = compile(
            &Inputs {
                node: NODE,
                policies: &[p],
                pods: &pods,
                namespaces: &nss,
                host_ips: &[],
                host_services: &[],
            },
            &mut Identities::default(),
        );
        assert_eq!(big.tables.rules.len(), small.tables.rules.len());
        assert_eq!(big.tables.ipcache.len(), small.tables.ipcache.len() + 50);
    }

    #[test]
    fn the_nodes_dns_stands_for_kube_dns_pods() {
        let hs = HostService {
            node_port: 10053,
            protocol: UDP,
            port: 53,
            identity: (
                "kube-system".into(),
                BTreeMap::from([("k8s-app".into(), "kube-dns".into())]),
            ),
        };
        let p = policy(
            "x",
            "dns-only",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                        "ports": [{"protocol": "UDP", "port": 53}]}]}),
        );
        let (pods, nss) = world();
        let c = compile(
            &Inputs {
                node: NODE,
                policies: &[p],
                pods: &pods,
                namespaces: &nss,
                host_ips: &[],
                host_services: &[hs],
            },
            &mut Identities::default(),
        );
        let dns = c.tables.host_ports[&(10053, UDP)];
        assert_eq!(dns.port, 53);
        assert_eq!(
            rules(&c.tables, "10.244.0.2"),
            vec![(DIR_EGRESS, dns.identity, UDP, 53, 96)]
        );
    }

    #[test]
    fn policy_indexes_are_stable_and_never_zero() {
        assert_eq!(policy_index("x", "deny"), policy_index("x", "deny"));
        assert_ne!(policy_index("x", "deny"), policy_index("y", "deny"));
        assert_ne!(policy_index("", ""), 0);
    }
}
