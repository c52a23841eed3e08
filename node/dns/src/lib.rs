//! Cluster DNS in the node agent, answering from its informer caches as CoreDNS'
//! `kubernetes` plugin does (the Kubernetes DNS specification), with hickory for the wire
//! format and the server, and hickory's resolver for names outside the cluster.
//!
//! - `<svc>.<ns>.svc.<domain>`: A/AAAA of a ClusterIP Service's cluster IPs; of every ready
//!   endpoint address for a headless one (`clusterIP: None`); a CNAME to `externalName` for an
//!   ExternalName one.
//! - `<hostname>.<svc>.<ns>.svc.<domain>`: an endpoint with that hostname (StatefulSet pods
//!   under their governing Service) or that dashed address (`10-244-1-5`).
//! - `_<port>._<proto>.<svc>.<ns>.svc.<domain>`: SRV for a named port (ClusterIP: the
//!   Service's name; headless: one per endpoint).
//! - `<a-b-c-d>.<ns>.pod.<domain>`: A of the address (CoreDNS' `pods insecure`).
//! - PTR under `in-addr.arpa` for cluster IPs and endpoint addresses.
//! - Other names are forwarded to the node's resolvers (`--dns-upstream`, default the
//!   nameservers of /etc/resolv.conf); a name in the cluster domain that does not exist is
//!   NXDOMAIN with the zone's SOA, TTL 30 everywhere (kubeadm's CoreDNS). A malformed query
//!   gets FORMERR from hickory's server without reaching this code.
//!
//! The node agent serves [`Handler`] on the node's address (UDP and TCP) over its informers
//! ([`ClusterView`]); this crate knows neither the agent nor the network. Fuzzed by
//! `tests/fuzz/fuzz_targets/dns_queries.rs` (feature `fuzzing`: `fuzzing::answer_bytes`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use hickory_proto::op::{MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_resolver::Resolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
pub use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use skiff_api::api::{Endpoints, Service};
use tracing::{debug, warn};

/// The TTL of every answer and of the negative-answer SOA (kubeadm's CoreDNS: `ttl 30`).
pub const TTL: u32 = 30;

/// What the DNS answers from: Services and Endpoints by namespace and name.
pub trait ClusterView: Send + Sync + 'static {
    fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>>;
    fn endpoints(&self, namespace: &str, name: &str) -> Option<Arc<Endpoints>>;
    fn services(&self) -> Vec<Arc<Service>>;
    fn all_endpoints(&self) -> Vec<Arc<Endpoints>>;
}

/// The answer to one question.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Records (possibly none: NODATA) for a name that exists in the cluster.
    Answer(Vec<Record>),
    /// A cluster name that does not exist.
    NxDomain,
    /// Not a cluster name: forward it.
    Forward,
}

fn name(s: &str) -> Option<Name> {
    Name::from_ascii(format!("{}.", s.trim_end_matches('.'))).ok()
}

fn address_records(owner: &str, ips: &[IpAddr], qtype: RecordType) -> Vec<Record> {
    let Some(n) = name(owner) else {
        return Vec::new();
    };
    ips.iter()
        .filter_map(|ip| match (ip, qtype) {
            (IpAddr::V4(v4), RecordType::A) => {
                Some(Record::from_rdata(n.clone(), TTL, RData::A(A(*v4))))
            }
            (IpAddr::V6(v6), RecordType::AAAA) => {
                Some(Record::from_rdata(n.clone(), TTL, RData::AAAA(AAAA(*v6))))
            }
            _ => None,
        })
        .collect()
}

/// `10-244-1-5` for an address.
fn dashed(ip: &str) -> String {
    ip.replace(['.', ':'], "-")
}

fn cluster_ips(svc: &Service) -> Vec<IpAddr> {
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let listed = if spec.cluster_ips.is_empty() {
        std::slice::from_ref(&spec.cluster_ip)
    } else {
        spec.cluster_ips.as_slice()
    };
    listed.iter().filter_map(|ip| ip.parse().ok()).collect()
}

fn is_headless(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|s| s.cluster_ip == "None")
}

/// Ready endpoint addresses of a Service: (ip, hostname).
fn ready_addresses(eps: Option<&Endpoints>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for subset in eps.map(|e| e.subsets.as_slice()).unwrap_or_default() {
        for a in &subset.addresses {
            if !out.iter().any(|(ip, _)| *ip == a.ip) {
                out.push((a.ip.clone(), a.hostname.clone()));
            }
        }
    }
    out
}

/// Answers `qname`/`qtype` from `view` for the cluster `domain` (pure).
pub fn resolve(view: &dyn ClusterView, domain: &str, qname: &str, qtype: RecordType) -> Outcome {
    let q = qname.trim_end_matches('.').to_ascii_lowercase();
    if let Some(rev) = q.strip_suffix(".in-addr.arpa") {
        return reverse(view, domain, rev, qtype);
    }
    let Some(local) = q
        .strip_suffix(domain)
        .and_then(|l| l.strip_suffix('.'))
        .map(str::to_string)
        .or_else(|| (q == domain).then(String::new))
    else {
        return Outcome::Forward;
    };
    let labels: Vec<&str> = if local.is_empty() {
        Vec::new()
    } else {
        local.split('.').collect()
    };
    match labels.as_slice() {
        // The zone apex, `svc`, `<ns>.svc`, `pod`, `<ns>.pod` exist but hold nothing here.
        [] | ["svc"] | [_, "svc"] | ["pod"] | [_, "pod"] => Outcome::Answer(Vec::new()),
        [ip, _ns, "pod"] => {
            let Ok(addr) = ip.replace('-', ".").parse::<Ipv4Addr>() else {
                return Outcome::NxDomain;
            };
            Outcome::Answer(address_records(&q, &[IpAddr::V4(addr)], qtype))
        }
        [svc, ns, "svc"] => {
            let Some(s) = view.service(ns, svc) else {
                return Outcome::NxDomain;
            };
            if let Some(target) = s
                .spec
                .as_ref()
                .filter(|sp| sp.r#type == "ExternalName")
                .and_then(|sp| name(&sp.external_name))
            {
                // A CNAME whatever was asked (the client follows it), as CoreDNS answers.
                return Outcome::Answer(match name(&q) {
                    Some(owner) => {
                        vec![Record::from_rdata(owner, TTL, RData::CNAME(CNAME(target)))]
                    }
                    None => Vec::new(),
                });
            }
            let ips: Vec<IpAddr> = if is_headless(&s) {
                ready_addresses(view.endpoints(ns, svc).as_deref())
                    .iter()
                    .filter_map(|(ip, _)| ip.parse().ok())
                    .collect()
            } else {
                cluster_ips(&s)
            };
            Outcome::Answer(address_records(&q, &ips, qtype))
        }
        [port, proto, svc, ns, "svc"] if port.starts_with('_') && proto.starts_with('_') => {
            srv(view, domain, &q, &port[1..], &proto[1..], ns, svc, qtype)
        }
        [host, svc, ns, "svc"] => {
            if view.service(ns, svc).is_none() {
                return Outcome::NxDomain;
            }
            let found: Vec<IpAddr> = ready_addresses(view.endpoints(ns, svc).as_deref())
                .into_iter()
                .filter(|(ip, hostname)| hostname == host || dashed(ip) == *host)
                .filter_map(|(ip, _)| ip.parse().ok())
                .collect();
            if found.is_empty() {
                Outcome::NxDomain
            } else {
                Outcome::Answer(address_records(&q, &found, qtype))
            }
        }
        _ => Outcome::NxDomain,
    }
}

#[allow(clippy::too_many_arguments)]
fn srv(
    view: &dyn ClusterView,
    domain: &str,
    q: &str,
    port: &str,
    proto: &str,
    ns: &str,
    svc: &str,
    qtype: RecordType,
) -> Outcome {
    let Some(s) = view.service(ns, svc) else {
        return Outcome::NxDomain;
    };
    let Some(sp) = s.spec.as_ref().and_then(|spec| {
        spec.ports.iter().find(|p| {
            p.name == port
                && (if p.protocol.is_empty() {
                    "tcp"
                } else {
                    p.protocol.as_str()
                })
                .eq_ignore_ascii_case(proto)
        })
    }) else {
        return Outcome::NxDomain;
    };
    if qtype != RecordType::SRV {
        return Outcome::Answer(Vec::new());
    }
    let Some(owner) = name(q) else {
        return Outcome::NxDomain;
    };
    let base = format!("{svc}.{ns}.svc.{domain}");
    let mut out = Vec::new();
    if is_headless(&s) {
        let eps = view.endpoints(ns, svc);
        for subset in eps
            .as_deref()
            .map(|e| e.subsets.as_slice())
            .unwrap_or_default()
        {
            let Some(target_port) = subset.ports.iter().find(|p| p.name == sp.name) else {
                continue;
            };
            let count = subset.addresses.len().max(1);
            let weight = u16::try_from(100 / count).unwrap_or(1);
            for a in &subset.addresses {
                let host = if a.hostname.is_empty() {
                    dashed(&a.ip)
                } else {
                    a.hostname.clone()
                };
                if let (Some(target), Ok(p)) = (
                    name(&format!("{host}.{base}")),
                    u16::try_from(target_port.port),
                ) {
                    out.push(Record::from_rdata(
                        owner.clone(),
                        TTL,
                        RData::SRV(SRV::new(0, weight, p, target)),
                    ));
                }
            }
        }
    } else if let (Some(target), Ok(p)) = (name(&base), u16::try_from(sp.port)) {
        out.push(Record::from_rdata(
            owner,
            TTL,
            RData::SRV(SRV::new(0, 100, p, target)),
        ));
    }
    Outcome::Answer(out)
}

/// PTR of a cluster IP (`<svc>.<ns>.svc.<domain>`) or endpoint address
/// (`<hostname or dashed ip>.<svc>.<ns>.svc.<domain>`); other addresses are forwarded.
fn reverse(view: &dyn ClusterView, domain: &str, rev: &str, qtype: RecordType) -> Outcome {
    let parts: Vec<&str> = rev.split('.').collect();
    if parts.len() != 4 {
        return Outcome::Forward;
    }
    let ip = format!("{}.{}.{}.{}", parts[3], parts[2], parts[1], parts[0]);
    let owner = format!("{rev}.in-addr.arpa");
    let mut targets: Vec<String> = Vec::new();
    for s in view.services() {
        if cluster_ips(&s).iter().any(|c| c.to_string() == ip) {
            let m = s.metadata.as_ref();
            let (n, ns) = m
                .map(|m| (m.name.as_str(), m.namespace.as_str()))
                .unwrap_or_default();
            targets.push(format!("{n}.{ns}.svc.{domain}"));
        }
    }
    for e in view.all_endpoints() {
        let m = e.metadata.as_ref();
        let (n, ns) = m
            .map(|m| (m.name.as_str(), m.namespace.as_str()))
            .unwrap_or_default();
        for (addr, hostname) in ready_addresses(Some(&e)) {
            if addr == ip {
                let host = if hostname.is_empty() {
                    dashed(&addr)
                } else {
                    hostname
                };
                targets.push(format!("{host}.{n}.{ns}.svc.{domain}"));
            }
        }
    }
    if targets.is_empty() {
        return Outcome::Forward;
    }
    if qtype != RecordType::PTR {
        return Outcome::Answer(Vec::new());
    }
    let Some(owner) = name(&owner) else {
        return Outcome::NxDomain;
    };
    targets.sort();
    targets.dedup();
    Outcome::Answer(
        targets
            .iter()
            .filter_map(|t| name(t))
            .map(|t| Record::from_rdata(owner.clone(), TTL, RData::PTR(PTR(t))))
            .collect(),
    )
}

/// The DNS request handler: cluster names from the view, the rest forwarded.
pub struct Handler {
    view: Box<dyn ClusterView>,
    domain: String,
    upstream: Option<Resolver<TokioRuntimeProvider>>,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl Handler {
    pub fn new(view: Box<dyn ClusterView>, domain: &str, upstream: &[SocketAddr]) -> Handler {
        let upstream = (!upstream.is_empty()).then(|| {
            let servers = upstream
                .iter()
                .map(|a| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = a.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = a.port();
                    NameServerConfig::new(a.ip(), true, vec![udp, tcp])
                })
                .collect();
            Resolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), servers),
                TokioRuntimeProvider::default(),
            )
            .build()
        });
        let upstream = match upstream {
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => {
                warn!(error = %e, "the DNS upstream resolver: names outside the cluster fail");
                None
            }
            None => None,
        };
        Handler {
            view,
            domain: domain.trim_matches('.').to_ascii_lowercase(),
            upstream,
        }
    }

    fn soa(&self) -> Option<Record> {
        let zone = name(&self.domain)?;
        let mname = name(&format!("ns.dns.{}", self.domain))?;
        let rname = name(&format!("hostmaster.{}", self.domain))?;
        let serial = u32::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
                % u64::from(u32::MAX),
        )
        .unwrap_or(0);
        Some(Record::from_rdata(
            zone,
            TTL,
            RData::SOA(SOA::new(mname, rname, serial, 7200, 1800, 86400, TTL)),
        ))
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: hickory_server::net::runtime::Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let builder = MessageResponseBuilder::new(&request.queries, request.edns.as_ref());
        let fail = |code| {
            MessageResponseBuilder::new(&request.queries, request.edns.as_ref())
                .error_msg(&request.metadata, code)
        };
        if request.metadata.message_type != MessageType::Query
            || request.metadata.op_code != OpCode::Query
        {
            return send(
                response.send_response(fail(ResponseCode::NotImp)).await,
                request,
            );
        }
        let Ok(info) = request.request_info() else {
            return send(
                response.send_response(fail(ResponseCode::FormErr)).await,
                request,
            );
        };
        let qname = info.query.name().to_string();
        let qtype = info.query.query_type();
        let mut meta = Metadata::response_from_request(&request.metadata);
        meta.recursion_available = true;
        let outcome = resolve(self.view.as_ref(), &self.domain, &qname, qtype);
        debug!(%qname, ?qtype, ?outcome, "dns");
        let (answers, soa): (Vec<Record>, Vec<Record>) = match outcome {
            Outcome::Answer(records) => {
                meta.authoritative = true;
                let soa = if records.is_empty() {
                    self.soa().into_iter().collect()
                } else {
                    Vec::new()
                };
                (records, soa)
            }
            Outcome::NxDomain => {
                meta.authoritative = true;
                meta.response_code = ResponseCode::NXDomain;
                (Vec::new(), self.soa().into_iter().collect())
            }
            Outcome::Forward => match &self.upstream {
                None => {
                    return send(
                        response.send_response(fail(ResponseCode::ServFail)).await,
                        request,
                    );
                }
                Some(r) => match r.lookup(qname.as_str(), qtype).await {
                    Ok(l) => (l.answers().to_vec(), Vec::new()),
                    Err(e) if e.is_nx_domain() => {
                        meta.response_code = ResponseCode::NXDomain;
                        (Vec::new(), Vec::new())
                    }
                    Err(e) if e.is_no_records_found() => (Vec::new(), Vec::new()),
                    Err(e) => {
                        debug!(%qname, error = %e, "forwarding");
                        return send(
                            response.send_response(fail(ResponseCode::ServFail)).await,
                            request,
                        );
                    }
                },
            },
        };
        let msg = builder.build(meta, answers.iter(), [], soa.iter(), []);
        send(response.send_response(msg).await, request)
    }
}

fn send<E: std::fmt::Display>(r: Result<ResponseInfo, E>, request: &Request) -> ResponseInfo {
    match r {
        Ok(info) => info,
        Err(e) => {
            debug!(error = %e, "sending a DNS response");
            let mut meta = Metadata::response_from_request(&request.metadata);
            meta.response_code = ResponseCode::ServFail;
            ResponseInfo::from(hickory_proto::op::Header {
                metadata: meta,
                counts: Default::default(),
            })
        }
    }
}

/// The nameservers of a resolv.conf (port 53), skipping loopback stub resolvers a pod or
/// node namespace cannot reach.
pub fn upstream_from_resolv_conf(path: &Path) -> Vec<SocketAddr> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|ip| ip.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// The query path on arbitrary bytes, for `cargo fuzz` (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use std::sync::Arc;

    use hickory_proto::op::Message;
    use skiff_api::api::{
        EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectMeta, Service, ServicePort,
        ServiceSpec,
    };

    use super::{ClusterView, resolve};

    struct Fixed {
        services: Vec<Arc<Service>>,
        endpoints: Vec<Arc<Endpoints>>,
    }

    impl ClusterView for Fixed {
        fn service(&self, ns: &str, n: &str) -> Option<Arc<Service>> {
            self.services
                .iter()
                .find(|s| {
                    s.metadata
                        .as_ref()
                        .is_some_and(|m| m.namespace == ns && m.name == n)
                })
                .cloned()
        }
        fn endpoints(&self, ns: &str, n: &str) -> Option<Arc<Endpoints>> {
            self.endpoints
                .iter()
                .find(|s| {
                    s.metadata
                        .as_ref()
                        .is_some_and(|m| m.namespace == ns && m.name == n)
                })
                .cloned()
        }
        fn services(&self) -> Vec<Arc<Service>> {
            self.services.clone()
        }
        fn all_endpoints(&self) -> Vec<Arc<Endpoints>> {
            self.endpoints.clone()
        }
    }

    fn meta(n: &str) -> Option<ObjectMeta> {
        Some(ObjectMeta {
            name: n.into(),
            namespace: "default".into(),
            ..Default::default()
        })
    }

    /// Decodes `data` as a DNS message (as the server does before a handler sees it) and
    /// answers each of its questions from a fixed cluster (a ClusterIP, a headless and an
    /// ExternalName Service): nothing may panic.
    pub fn answer_bytes(data: &[u8]) {
        let Ok(msg) = Message::from_vec(data) else {
            return;
        };
        let port = ServicePort {
            name: "http".into(),
            port: 80,
            protocol: "TCP".into(),
            ..Default::default()
        };
        let svc = |n: &str, ty: &str, ip: &str| {
            Arc::new(Service {
                metadata: meta(n),
                spec: Some(ServiceSpec {
                    r#type: ty.into(),
                    cluster_ip: ip.into(),
                    external_name: "example.org".into(),
                    ports: vec![port.clone()],
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        let view = Fixed {
            services: vec![
                svc("web", "ClusterIP", "10.96.0.20"),
                svc("db", "ClusterIP", "None"),
                svc("ext", "ExternalName", ""),
            ],
            endpoints: vec![Arc::new(Endpoints {
                metadata: meta("db"),
                subsets: vec![EndpointSubset {
                    addresses: vec![EndpointAddress {
                        ip: "10.244.1.5".into(),
                        hostname: "db-0".into(),
                        ..Default::default()
                    }],
                    ports: vec![EndpointPort {
                        name: "http".into(),
                        port: 80,
                        protocol: "TCP".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            })],
        };
        for q in &msg.queries {
            let _ = resolve(
                &view,
                "cluster.local",
                &q.name().to_string(),
                q.query_type(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        EndpointAddress, EndpointPort, EndpointSubset, ObjectMeta, ServicePort, ServiceSpec,
    };

    #[derive(Default)]
    struct View {
        services: Vec<Arc<Service>>,
        endpoints: Vec<Arc<Endpoints>>,
    }

    fn key<T: skiff_api::Resource>(o: &T) -> (String, String) {
        (o.namespace().to_string(), o.name().to_string())
    }

    impl ClusterView for View {
        fn service(&self, ns: &str, n: &str) -> Option<Arc<Service>> {
            self.services
                .iter()
                .find(|s| key(&***s) == (ns.into(), n.into()))
                .cloned()
        }
        fn endpoints(&self, ns: &str, n: &str) -> Option<Arc<Endpoints>> {
            self.endpoints
                .iter()
                .find(|s| key(&***s) == (ns.into(), n.into()))
                .cloned()
        }
        fn services(&self) -> Vec<Arc<Service>> {
            self.services.clone()
        }
        fn all_endpoints(&self) -> Vec<Arc<Endpoints>> {
            self.endpoints.clone()
        }
    }

    fn meta(ns: &str, n: &str) -> Option<ObjectMeta> {
        Some(ObjectMeta {
            name: n.into(),
            namespace: ns.into(),
            ..Default::default()
        })
    }

    fn view() -> View {
        let svc = |n: &str, ip: &str, port: (&str, i32)| {
            Arc::new(Service {
                metadata: meta("shop", n),
                spec: Some(ServiceSpec {
                    cluster_ip: ip.into(),
                    ports: vec![ServicePort {
                        name: port.0.into(),
                        port: port.1,
                        protocol: "TCP".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        let eps = |n: &str, addrs: &[(&str, &str)]| {
            Arc::new(Endpoints {
                metadata: meta("shop", n),
                subsets: vec![EndpointSubset {
                    addresses: addrs
                        .iter()
                        .map(|(ip, h)| EndpointAddress {
                            ip: ip.to_string(),
                            hostname: h.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                    ports: vec![EndpointPort {
                        name: "redis".into(),
                        port: 6379,
                        protocol: "TCP".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            })
        };
        View {
            services: vec![
                svc("web", "10.96.0.20", ("http", 80)),
                svc("db", "None", ("redis", 6379)),
            ],
            endpoints: vec![eps("db", &[("10.244.1.5", "db-0"), ("10.244.2.6", "db-1")])],
        }
    }

    fn ips(o: Outcome) -> Vec<String> {
        match o {
            Outcome::Answer(r) => r.iter().map(|r| r.data.to_string()).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn services_headless_hostnames_and_pods() {
        let v = view();
        let d = "cluster.local";
        assert_eq!(
            ips(resolve(&v, d, "web.shop.svc.cluster.local.", RecordType::A)),
            ["10.96.0.20"]
        );
        assert_eq!(
            ips(resolve(&v, d, "WEB.shop.svc.cluster.local", RecordType::A)),
            ["10.96.0.20"]
        );
        assert!(
            ips(resolve(
                &v,
                d,
                "web.shop.svc.cluster.local.",
                RecordType::AAAA
            ))
            .is_empty()
        );
        assert_eq!(
            ips(resolve(&v, d, "db.shop.svc.cluster.local.", RecordType::A)),
            ["10.244.1.5", "10.244.2.6"]
        );
        assert_eq!(
            ips(resolve(
                &v,
                d,
                "db-1.db.shop.svc.cluster.local.",
                RecordType::A
            )),
            ["10.244.2.6"]
        );
        assert_eq!(
            ips(resolve(
                &v,
                d,
                "10-244-1-5.db.shop.svc.cluster.local.",
                RecordType::A
            )),
            ["10.244.1.5"]
        );
        assert_eq!(
            ips(resolve(
                &v,
                d,
                "10-1-2-3.shop.pod.cluster.local.",
                RecordType::A
            )),
            ["10.1.2.3"]
        );
        assert_eq!(
            resolve(&v, d, "nope.shop.svc.cluster.local.", RecordType::A),
            Outcome::NxDomain
        );
        assert_eq!(
            resolve(&v, d, "example.org.", RecordType::A),
            Outcome::Forward
        );
        let mut v = v;
        v.services.push(Arc::new(Service {
            metadata: meta("shop", "ext"),
            spec: Some(ServiceSpec {
                r#type: "ExternalName".into(),
                external_name: "db.example.org".into(),
                ..Default::default()
            }),
            ..Default::default()
        }));
        assert_eq!(
            ips(resolve(&v, d, "ext.shop.svc.cluster.local.", RecordType::A)),
            ["db.example.org."]
        );
    }

    #[test]
    fn srv_and_ptr() {
        let v = view();
        let d = "cluster.local";
        assert_eq!(
            ips(resolve(
                &v,
                d,
                "_http._tcp.web.shop.svc.cluster.local.",
                RecordType::SRV
            )),
            ["0 100 80 web.shop.svc.cluster.local."]
        );
        assert_eq!(
            ips(resolve(
                &v,
                d,
                "_redis._tcp.db.shop.svc.cluster.local.",
                RecordType::SRV
            )),
            [
                "0 50 6379 db-0.db.shop.svc.cluster.local.",
                "0 50 6379 db-1.db.shop.svc.cluster.local."
            ]
        );
        assert_eq!(
            resolve(
                &v,
                d,
                "_nope._tcp.web.shop.svc.cluster.local.",
                RecordType::SRV
            ),
            Outcome::NxDomain
        );
        assert_eq!(
            ips(resolve(&v, d, "20.0.96.10.in-addr.arpa.", RecordType::PTR)),
            ["web.shop.svc.cluster.local."]
        );
        assert_eq!(
            ips(resolve(&v, d, "6.2.244.10.in-addr.arpa.", RecordType::PTR)),
            ["db-1.db.shop.svc.cluster.local."]
        );
        assert_eq!(
            resolve(&v, d, "8.8.8.8.in-addr.arpa.", RecordType::PTR),
            Outcome::Forward
        );
    }
}
