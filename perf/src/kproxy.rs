//! A synthetic set of ClusterIP Services and the rules kube-proxy would program for it, in
//! its iptables mode (an `iptables-restore` input) and in its nftables mode (an `nft -f`
//! input), for the load-balancing benchmarks. Pure text generation; applying it is
//! [`crate::lbnet`]'s job.
//!
//! The layouts follow kube-proxy (`pkg/proxy/iptables`, `pkg/proxy/nftables`):
//!
//! - iptables, table `nat`: `OUTPUT` and `PREROUTING` jump to `KUBE-SERVICES`, which holds
//!   one `-d VIP/32 -p tcp --dport P -j KUBE-SVC-<hash>` per service port (evaluated in
//!   order) and ends with the `KUBE-NODEPORTS` jump; each `KUBE-SVC-` chain marks traffic
//!   from outside the cluster CIDR for masquerade, then picks an endpoint with
//!   `-m statistic --mode random --probability 1/(n-i)` jumps to `KUBE-SEP-<hash>` chains,
//!   each marking hairpin traffic and doing `-j DNAT --to-destination ip:port`;
//!   `KUBE-MARK-MASQ`/`KUBE-POSTROUTING` as kube-proxy writes them. Like kube-proxy, comments
//!   are left out above 1000 endpoints ("large cluster mode"). Table `filter`: the
//!   `OUTPUT`/`FORWARD` jumps for new connections to kube-proxy's (here empty) chains.
//! - nftables, table `ip kube-proxy`: base chains on the output/prerouting nat hooks jump
//!   to `services`, one lookup in the `service-ips` verdict map
//!   (`ip daddr . meta l4proto . th dport`); per service a chain with the masquerade mark
//!   rule and `numgen random mod n vmap { 0 : goto endpoint-…, … }`; per endpoint a chain with
//!   the hairpin mark and `meta l4proto tcp dnat to ip:port`; the filter-hook chains that
//!   look new connections up in the (here empty) `no-endpoint-services` map.
//!
//! Chain names carry a 16-character base32 hash like kube-proxy's (FNV-1a here instead of
//! SHA-256: same length and alphabet, no extra dependency).

use std::fmt::Write as _;
use std::net::Ipv4Addr;

/// Where the virtual IPs come from: 10.96.0.0/12, service `i` at 10.96.0.0 + 1 + i.
const VIP_BASE: u32 = u32::from_be_bytes([10, 96, 0, 0]);
/// Endpoints of the services nobody connects to: 10.128.0.0 + k (inside the cluster CIDR,
/// never routed anywhere).
const FAKE_BACKEND_BASE: u32 = u32::from_be_bytes([10, 128, 0, 0]);
/// The cluster (pod) CIDR: the client (10.200.0.1) and every endpoint are inside it, so
/// traffic is not masqueraded, as for a pod talking to a Service.
pub const CLUSTER_CIDR: &str = "10.128.0.0/9";
pub const SERVICE_PORT: u16 = 80;
pub const BACKEND_PORT: u16 = 8080;
/// Backends per service, cycled (mean 3.6): most services have 2–3 replicas, a few more.
pub const BACKEND_PATTERN: [usize; 10] = [2, 3, 2, 4, 2, 3, 5, 2, 3, 10];
/// kube-proxy leaves out rule comments above this many endpoints.
const LARGE_CLUSTER_ENDPOINTS: usize = 1000;
const MASQ_MARK: &str = "0x4000";

/// One service: its VIP and its endpoints (all on [`BACKEND_PORT`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub index: usize,
    pub vip: Ipv4Addr,
    pub backends: Vec<Ipv4Addr>,
}

impl Service {
    /// `default/svc-<i>:http`, kube-proxy's service port name.
    pub fn port_name(&self) -> String {
        format!("default/svc-{}:http", self.index)
    }

    fn svc_chain(&self) -> String {
        format!("KUBE-SVC-{}", hash16(&format!("{}tcp", self.port_name())))
    }

    fn sep_chain(&self, backend: Ipv4Addr) -> String {
        format!(
            "KUBE-SEP-{}",
            hash16(&format!("{}tcp{backend}:{BACKEND_PORT}", self.port_name()))
        )
    }

    pub fn nft_service_chain(&self) -> String {
        format!(
            "service-{}-default/svc-{}/tcp/http",
            &hash16(&format!("{}tcp", self.port_name()))[..8],
            self.index
        )
    }

    fn nft_endpoint_chain(&self, backend: Ipv4Addr) -> String {
        format!(
            "endpoint-{}-default/svc-{}/tcp/http__{backend}/{BACKEND_PORT}",
            &hash16(&format!("{}tcp{backend}", self.port_name()))[..8],
            self.index
        )
    }
}

/// `n` services; service `measured` has exactly `measured_backends` as its endpoints, the
/// others [`BACKEND_PATTERN`] many distinct fake endpoints each.
#[derive(Debug, Clone)]
pub struct ServiceSet {
    pub services: Vec<Service>,
    pub measured: usize,
}

impl ServiceSet {
    pub fn new(n: usize, measured: usize, measured_backends: &[Ipv4Addr]) -> ServiceSet {
        let mut next_fake = 0u32;
        let services = (0..n)
            .map(|i| {
                let backends = if i == measured {
                    measured_backends.to_vec()
                } else {
                    let k = BACKEND_PATTERN[i % BACKEND_PATTERN.len()];
                    (0..k)
                        .map(|_| {
                            next_fake += 1;
                            Ipv4Addr::from(FAKE_BACKEND_BASE + next_fake)
                        })
                        .collect()
                };
                Service {
                    index: i,
                    vip: Ipv4Addr::from(VIP_BASE + 1 + i as u32),
                    backends,
                }
            })
            .collect();
        ServiceSet { services, measured }
    }

    pub fn measured(&self) -> &Service {
        &self.services[self.measured]
    }

    pub fn endpoint_count(&self) -> usize {
        self.services.iter().map(|s| s.backends.len()).sum()
    }

    /// A fresh endpoint for a service (for the one-change measurements): outside every
    /// existing one.
    pub fn extra_backend(&self, k: u32) -> Ipv4Addr {
        Ipv4Addr::from(FAKE_BACKEND_BASE + self.endpoint_count() as u32 + 1 + k)
    }

    fn comments(&self) -> bool {
        self.endpoint_count() <= LARGE_CLUSTER_ENDPOINTS
    }

    /// The complete `iptables-restore` input (tables `filter` and `nat`).
    pub fn iptables_restore(&self) -> String {
        let mut out = String::new();
        iptables_filter(&mut out, true);
        out.push_str("*nat\n");
        for c in NAT_FIXED_CHAINS {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
        for s in &self.services {
            let _ = writeln!(out, ":{} - [0:0]", s.svc_chain());
            for b in &s.backends {
                let _ = writeln!(out, ":{} - [0:0]", s.sep_chain(*b));
            }
        }
        out.push_str(
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n",
        );
        let comments = self.comments();
        self.nat_fixed_rules(&mut out, comments);
        for s in &self.services {
            service_rules(&mut out, s, comments);
        }
        out.push_str("COMMIT\n");
        out
    }

    /// What kube-proxy's partial sync hands `iptables-restore --noflush` after one service
    /// changed: the chains it always rewrites (whole `KUBE-SERVICES` included: declaring a
    /// chain flushes it), the changed service's `KUBE-SVC-` chain and its endpoints' chains.
    pub fn iptables_partial(&self, changed: &Service) -> String {
        let mut out = String::new();
        iptables_filter(&mut out, false);
        out.push_str("*nat\n");
        for c in NAT_FIXED_CHAINS {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
        let _ = writeln!(out, ":{} - [0:0]", changed.svc_chain());
        for b in &changed.backends {
            let _ = writeln!(out, ":{} - [0:0]", changed.sep_chain(*b));
        }
        let comments = self.comments();
        self.nat_fixed_rules(&mut out, comments);
        service_rules(&mut out, changed, comments);
        out.push_str("COMMIT\n");
        out
    }

    /// `KUBE-SERVICES` (every service's jump, then the node-port jump), `KUBE-MARK-MASQ`,
    /// `KUBE-POSTROUTING`.
    fn nat_fixed_rules(&self, out: &mut String, comments: bool) {
        for s in &self.services {
            let comment = if comments {
                format!(" -m comment --comment \"{} cluster IP\"", s.port_name())
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "-A KUBE-SERVICES -d {}/32 -p tcp{comment} -m tcp --dport {SERVICE_PORT} -j {}",
                s.vip,
                s.svc_chain()
            );
        }
        let _ = writeln!(
            out,
            "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this \
             must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
             -A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}\n\
             -A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN\n\
             -A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}\n\
             -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring \
             SNAT\" -j MASQUERADE --random-fully"
        );
    }

    /// The complete `nft -f` input: table `ip kube-proxy` (created, then flushed, then filled,
    /// in one transaction).
    pub fn nft_script(&self) -> String {
        let mut out = String::from(NFT_BASE);
        for s in &self.services {
            nft_service(&mut out, s);
        }
        for chunk in self.services.chunks(1000) {
            out.push_str("add element ip kube-proxy service-ips {");
            for (i, s) in chunk.iter().enumerate() {
                let sep = if i == 0 { " " } else { ", " };
                let _ = write!(
                    out,
                    "{sep}{} . tcp . {SERVICE_PORT} : goto {}",
                    s.vip,
                    nft_quote(&s.nft_service_chain())
                );
            }
            out.push_str(" }\n");
        }
        out
    }

    /// What kube-proxy's nftables mode sends after one service gained endpoints: the new
    /// endpoint chains, the service chain flushed and rewritten (the map element is
    /// unchanged).
    pub fn nft_partial(&self, changed: &Service, new_backends: &[Ipv4Addr]) -> String {
        let mut out = String::new();
        for b in new_backends {
            nft_endpoint(&mut out, changed, *b);
        }
        let chain = nft_quote(&changed.nft_service_chain());
        let _ = writeln!(out, "flush chain ip kube-proxy {chain}");
        nft_service_rules(&mut out, changed);
        out
    }
}

/// One service's `KUBE-SVC-` and `KUBE-SEP-` rules.
fn service_rules(out: &mut String, s: &Service, comments: bool) {
    let name = s.port_name();
    let c = |text: &str| {
        if comments {
            format!(" -m comment --comment \"{text}\"")
        } else {
            String::new()
        }
    };
    let svc = s.svc_chain();
    let _ = writeln!(
        out,
        "-A {svc} ! -s {CLUSTER_CIDR} -d {}/32 -p tcp{} -m tcp --dport {SERVICE_PORT} -j KUBE-MARK-MASQ",
        s.vip,
        c(&format!("{name} cluster IP"))
    );
    let n = s.backends.len();
    for (i, b) in s.backends.iter().enumerate() {
        let sep = s.sep_chain(*b);
        let comment = c(&format!("{name} -> {b}:{BACKEND_PORT}"));
        if i + 1 < n {
            let p = 1.0 / (n - i) as f64;
            let _ = writeln!(
                out,
                "-A {svc}{comment} -m statistic --mode random --probability {p:.10} -j {sep}"
            );
        } else {
            let _ = writeln!(out, "-A {svc}{comment} -j {sep}");
        }
    }
    for b in &s.backends {
        let sep = s.sep_chain(*b);
        let comment = c(&name);
        let _ = writeln!(out, "-A {sep} -s {b}/32{comment} -j KUBE-MARK-MASQ");
        let _ = writeln!(
            out,
            "-A {sep} -p tcp{comment} -m tcp -j DNAT --to-destination {b}:{BACKEND_PORT}"
        );
    }
}

const NAT_FIXED_CHAINS: [&str; 4] = [
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
];

/// kube-proxy's filter table: its chains (nothing in them for services with endpoints) and,
/// with `jumps` (a full restore, which flushes the built-in chains), the jumps to them. A
/// partial sync (`--noflush`) leaves the jumps alone: kube-proxy keeps those with
/// `iptables -C`/`-I`, outside the restore.
fn iptables_filter(out: &mut String, jumps: bool) {
    out.push_str(
        "*filter\n\
         :KUBE-SERVICES - [0:0]\n\
         :KUBE-EXTERNAL-SERVICES - [0:0]\n\
         :KUBE-FORWARD - [0:0]\n\
         :KUBE-PROXY-FIREWALL - [0:0]\n",
    );
    if jumps {
        out.push_str(
            "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
             -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
             -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
        );
    }
    out.push_str(
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
         -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
         COMMIT\n",
    );
}

/// The fixed part of kube-proxy's nftables table. `add table` + `flush table` makes the
/// script replace whatever an earlier one left.
const NFT_BASE: &str = "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }
flush table ip kube-proxy
add chain ip kube-proxy mark-for-masquerade
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add chain ip kube-proxy masquerading
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; }
add chain ip kube-proxy service-endpoints-check
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add chain ip kube-proxy firewall-check
add chain ip kube-proxy filter-output { type filter hook output priority -110 ; }
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump firewall-check
add chain ip kube-proxy filter-forward { type filter hook forward priority -110 ; }
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }
add chain ip kube-proxy services
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add rule ip kube-proxy nat-prerouting jump services
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add rule ip kube-proxy nat-output jump services
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add rule ip kube-proxy nat-postrouting jump masquerading
";

/// A chain name as nft's parser takes it: kube-proxy's names (letters, digits, `-`, `_`,
/// `.`, `/`) are plain nft strings, unquoted (nft 1.0 rejects quoted chain names).
fn nft_quote(name: &str) -> String {
    name.to_string()
}

fn nft_service(out: &mut String, s: &Service) {
    for b in &s.backends {
        nft_endpoint(out, s, *b);
    }
    let _ = writeln!(
        out,
        "add chain ip kube-proxy {}",
        nft_quote(&s.nft_service_chain())
    );
    nft_service_rules(out, s);
}

fn nft_service_rules(out: &mut String, s: &Service) {
    let chain = nft_quote(&s.nft_service_chain());
    let _ = writeln!(
        out,
        "add rule ip kube-proxy {chain} ip daddr {} tcp dport {SERVICE_PORT} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade",
        s.vip
    );
    let _ = write!(
        out,
        "add rule ip kube-proxy {chain} numgen random mod {} vmap {{",
        s.backends.len()
    );
    for (i, b) in s.backends.iter().enumerate() {
        let sep = if i == 0 { " " } else { ", " };
        let _ = write!(
            out,
            "{sep}{i} : goto {}",
            nft_quote(&s.nft_endpoint_chain(*b))
        );
    }
    out.push_str(" }\n");
}

fn nft_endpoint(out: &mut String, s: &Service, b: Ipv4Addr) {
    let chain = nft_quote(&s.nft_endpoint_chain(b));
    let _ = writeln!(
        out,
        "add chain ip kube-proxy {chain}\n\
         add rule ip kube-proxy {chain} ip saddr {b} jump mark-for-masquerade\n\
         add rule ip kube-proxy {chain} meta l4proto tcp dnat to {b}:{BACKEND_PORT}"
    );
}

/// 16 characters of base32 (RFC 4648 alphabet) from an 80-bit FNV-1a-based hash of `s`.
fn hash16(s: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let fnv = |seed: u64| {
        s.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let (a, b) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x8422_2325_cbf2_9ce4));
    let bits = (u128::from(a) << 16) | u128::from(b & 0xffff);
    (0..16)
        .map(|i| ALPHABET[((bits >> (75 - 5 * i)) & 31) as usize] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real() -> Vec<Ipv4Addr> {
        (11..=13).map(|i| Ipv4Addr::new(10, 200, 0, i)).collect()
    }

    #[test]
    fn services_have_distinct_vips_and_endpoints_by_pattern() {
        let set = ServiceSet::new(25, 12, &real());
        assert_eq!(set.services.len(), 25);
        assert_eq!(set.measured().backends, real());
        assert_eq!(set.services[0].vip, Ipv4Addr::new(10, 96, 0, 1));
        assert_eq!(set.services[24].vip, Ipv4Addr::new(10, 96, 0, 25));
        assert_eq!(set.services[9].backends.len(), 10);
        assert_eq!(set.services[0].backends.len(), 2);
        let mut all: Vec<Ipv4Addr> = set
            .services
            .iter()
            .flat_map(|s| s.backends.clone())
            .collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "endpoints are distinct");
        assert!(!all.contains(&set.extra_backend(0)));
        // 50k services stay inside their ranges.
        let big = ServiceSet::new(50_000, 25_000, &real());
        assert_eq!(big.services[49_999].vip, Ipv4Addr::new(10, 96, 195, 80));
        assert!(big.endpoint_count() < 200_000);
    }

    #[test]
    fn hashes_look_like_kube_proxys() {
        let h = hash16("default/svc-1:httptcp");
        assert_eq!(h.len(), 16);
        assert!(
            h.bytes()
                .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
        );
        assert_ne!(h, hash16("default/svc-2:httptcp"));
        assert_eq!(h, hash16("default/svc-1:httptcp"));
    }

    #[test]
    fn iptables_layout_is_kube_proxys() {
        let set = ServiceSet::new(3, 1, &real());
        let r = set.iptables_restore();
        let svc = set.measured().svc_chain();
        assert!(r.starts_with("*filter\n"));
        assert!(r.contains("\n*nat\n:KUBE-SERVICES - [0:0]\n"));
        assert!(r.contains(
            "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"
        ));
        assert!(r.contains(
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"
        ));
        assert!(r.contains(&format!(
            "-A KUBE-SERVICES -d 10.96.0.2/32 -p tcp -m comment --comment \"default/svc-1:http cluster IP\" -m tcp --dport 80 -j {svc}\n"
        )));
        // 1/3, 1/2, then the rest.
        let jumps: Vec<&str> = r
            .lines()
            .filter(|l| l.starts_with(&format!("-A {svc} -m comment")))
            .collect();
        assert_eq!(jumps.len(), 3, "{r}");
        assert!(jumps[0].contains("--probability 0.3333333333 -j KUBE-SEP-"));
        assert!(jumps[1].contains("--probability 0.5000000000 -j KUBE-SEP-"));
        assert!(!jumps[2].contains("statistic"));
        assert!(r.contains("-j DNAT --to-destination 10.200.0.12:8080\n"));
        assert!(r.contains("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n"));
        // The node-port jump comes after every service.
        let last_svc = r.rfind("-A KUBE-SERVICES -d ").unwrap();
        assert!(r.find("-j KUBE-NODEPORTS").unwrap() > last_svc);
        assert_eq!(r.matches("COMMIT\n").count(), 2);
        // Every chain used is declared.
        for l in r.lines().filter(|l| l.starts_with("-A ")) {
            let chain = l.split_whitespace().nth(1).unwrap();
            let builtin = ["OUTPUT", "PREROUTING", "POSTROUTING", "FORWARD"].contains(&chain);
            assert!(
                builtin || r.contains(&format!(":{chain} - [0:0]")),
                "{chain}"
            );
        }
    }

    #[test]
    fn large_sets_drop_comments_like_kube_proxy() {
        let set = ServiceSet::new(400, 0, &real());
        assert!(set.endpoint_count() > LARGE_CLUSTER_ENDPOINTS);
        let r = set.iptables_restore();
        assert!(!r.contains("cluster IP\""));
        assert!(
            r.contains("-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-")
        );
    }

    #[test]
    fn iptables_partial_rewrites_kube_services_and_the_changed_chains() {
        let mut set = ServiceSet::new(5, 2, &real());
        let extra = set.extra_backend(0);
        set.services[3].backends.push(extra);
        let changed = set.services[3].clone();
        let p = set.iptables_partial(&changed);
        assert_eq!(p.matches("-A KUBE-SERVICES -d ").count(), 5);
        assert!(p.contains(&format!(":{} - [0:0]", changed.svc_chain())));
        assert!(p.contains(&format!("-j DNAT --to-destination {extra}:8080")));
        assert!(!p.contains(&format!(":{} - [0:0]", set.services[2].svc_chain())));
        assert!(
            !p.contains("-A OUTPUT"),
            "the jumps from the built-in chains stay"
        );
    }

    #[test]
    fn nft_layout_is_kube_proxys() {
        let set = ServiceSet::new(3, 1, &real());
        let s = set.nft_script();
        assert!(s.starts_with("add table ip kube-proxy"));
        assert!(s.contains(
            "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n"
        ));
        assert!(s.contains("nat-output { type nat hook output priority -100 ; }"));
        let chain = set.measured().nft_service_chain();
        assert!(chain.starts_with("service-") && chain.ends_with("-default/svc-1/tcp/http"));
        assert!(s.contains(&format!("10.96.0.2 . tcp . 80 : goto {chain}")));
        assert!(s.contains(&format!(
            "add rule ip kube-proxy {chain} numgen random mod 3 vmap {{ 0 : goto endpoint-"
        )));
        assert!(s.contains("meta l4proto tcp dnat to 10.200.0.13:8080\n"));
        assert_eq!(
            s.matches("add element ip kube-proxy service-ips").count(),
            1
        );
        let big = ServiceSet::new(2500, 0, &real()).nft_script();
        assert_eq!(
            big.matches("add element ip kube-proxy service-ips").count(),
            3
        );
    }

    #[test]
    fn nft_partial_adds_the_endpoint_and_rewrites_the_service_chain() {
        let mut set = ServiceSet::new(4, 0, &real());
        let extra = set.extra_backend(0);
        set.services[0].backends.push(extra);
        let changed = set.services[0].clone();
        let p = set.nft_partial(&changed, &[extra]);
        assert!(p.contains(&format!("dnat to {extra}:8080")));
        assert!(p.contains("flush chain ip kube-proxy service-"));
        assert!(p.contains("numgen random mod 4 vmap"));
        assert!(!p.contains("add table"));
    }
}
