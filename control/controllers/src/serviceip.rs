//! The Service allocator: gives Services their `spec.clusterIP` (and `clusterIPs`) and the
//! `nodePort`s of NodePort Services, as the Kubernetes API server's allocators do (here they
//! run in the controller manager, on the shared [`Allocator`]).
//!
//! - A ClusterIP, NodePort or LoadBalancer Service without a clusterIP gets the next free
//!   host address of the service CIDR (never its network or broadcast address); `None`
//!   (headless) gets none.
//! - Every port of a NodePort Service, or of a LoadBalancer Service unless
//!   `allocateLoadBalancerNodePorts: false`, without a nodePort gets one from the node port
//!   range; ports with the same port number (TCP and UDP) share one, as in Kubernetes.
//! - Values users chose are kept and count as used when they lie inside the range. One that
//!   an earlier Service (by creationTimestamp) already holds gets a Warning
//!   (`ClusterIPAlreadyAllocated`, `PortAlreadyAllocated`) on the later Service, which keeps
//!   it.
//! - A Service gets all its values at once or none: when a range is full it gets a Warning
//!   (`ClusterIPAllocationFailed`, `NodePortAllocationFailed`) naming the range, and is tried
//!   again when a value is freed (a Service is deleted or gives its values up).
//!
//! The API server keeps an allocated clusterIP and nodePorts when an update leaves them
//! empty, and refuses to change a clusterIP once set.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;

use skiff_api::api::Service;
use skiff_client::controller::{CancelToken, EventRecorder, EventType, Informers, ObjectKey};

use crate::allocator::{Allocation, Allocator, Claim, Ledger, Policy};
use crate::ranges::{CidrError, Ipv4Cidr, PortRange, RangeAllocator, RangeError};

const IPS: usize = 0;
const NODE_PORTS: usize = 1;

/// The ranges Services' values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceRanges {
    /// clusterIPs: the host addresses of this CIDR.
    cluster_ips: Ipv4Cidr,
    node_ports: PortRange,
}

impl ServiceRanges {
    /// The service CIDR needs host addresses (a prefix length of at most 30).
    pub fn new(cluster_ips: Ipv4Cidr, node_ports: PortRange) -> Result<Self, RangeError> {
        if cluster_ips.hosts() == 0 {
            return Err(RangeError::Cidr(CidrError {
                value: cluster_ips.to_string(),
                reason: "has no host addresses (the prefix length must be at most 30)".into(),
            }));
        }
        Ok(ServiceRanges {
            cluster_ips,
            node_ports,
        })
    }
}

impl Policy for ServiceRanges {
    type Object = Service;

    const NAME: &'static str = "service-allocator";

    fn pools(&self) -> Vec<RangeAllocator> {
        vec![
            RangeAllocator::new(self.cluster_ips.hosts()),
            RangeAllocator::new(self.node_ports.size()),
        ]
    }

    fn claims(&self, svc: &Service) -> BTreeSet<Claim> {
        let Some(spec) = svc.spec.as_ref() else {
            return BTreeSet::new();
        };
        let ip = spec
            .cluster_ip
            .parse::<Ipv4Addr>()
            .ok()
            .and_then(|ip| self.cluster_ips.host_index(ip))
            .map(|i| (IPS, i));
        let ports = spec
            .ports
            .iter()
            .filter_map(|p| self.node_ports.offset_of(p.node_port))
            .map(|o| (NODE_PORTS, o));
        ip.into_iter().chain(ports).collect()
    }

    fn plan(
        &self,
        ledger: &mut Ledger<Service>,
        key: &ObjectKey,
        svc: &Service,
    ) -> Allocation<Service> {
        let mut plan = Allocation::default();
        for claim in self.claims(svc) {
            if let Some(other) = ledger.earlier_holder(key, claim) {
                plan.events.push(match claim {
                    (IPS, i) => (
                        EventType::Warning,
                        "ClusterIPAlreadyAllocated",
                        format!(
                            "clusterIP {} is already allocated to service {other}",
                            self.cluster_ips
                                .host(i)
                                .map(|ip| ip.to_string())
                                .unwrap_or_default()
                        ),
                    ),
                    (_, o) => (
                        EventType::Warning,
                        "PortAlreadyAllocated",
                        format!(
                            "nodePort {} is already allocated to service {other}",
                            self.node_ports.nth(o).unwrap_or(0)
                        ),
                    ),
                });
            }
        }
        let mut updated = svc.clone();
        let Some(spec) = updated.spec.as_mut() else {
            return plan;
        };
        let ty = spec.r#type.as_str();
        let wants_ip = matches!(ty, "ClusterIP" | "NodePort" | "LoadBalancer" | "")
            && spec.cluster_ip.is_empty();
        let node_ports = ty == "NodePort"
            || (ty == "LoadBalancer" && spec.allocate_load_balancer_node_ports != Some(false));
        let wants_ports = node_ports && spec.ports.iter().any(|p| p.node_port == 0);
        if !wants_ip && !wants_ports {
            return plan;
        }
        let mut failure = None;
        if wants_ip {
            match ledger
                .allocate(key, IPS)
                .and_then(|i| self.cluster_ips.host(i))
            {
                Some(ip) => {
                    spec.cluster_ip = ip.to_string();
                    spec.cluster_ips = vec![ip.to_string()];
                }
                None => {
                    failure = Some((
                        "ClusterIPAllocationFailed",
                        format!(
                            "failed to allocate a clusterIP: no free address in the service \
                             range {}",
                            self.cluster_ips
                        ),
                    ));
                }
            }
        }
        if wants_ports && failure.is_none() {
            // A port number the Service already has a nodePort for (another protocol) reuses
            // it.
            let mut by_port: HashMap<i32, i32> = HashMap::new();
            for p in spec.ports.iter().filter(|p| p.node_port != 0) {
                by_port.entry(p.port).or_insert(p.node_port);
            }
            for p in spec.ports.iter_mut().filter(|p| p.node_port == 0) {
                if let Some(np) = by_port.get(&p.port) {
                    p.node_port = *np;
                    continue;
                }
                match ledger
                    .allocate(key, NODE_PORTS)
                    .and_then(|o| self.node_ports.nth(o))
                {
                    Some(np) => {
                        p.node_port = i32::from(np);
                        by_port.insert(p.port, p.node_port);
                    }
                    None => {
                        failure = Some((
                            "NodePortAllocationFailed",
                            format!(
                                "failed to allocate a nodePort: no free port in the range {}",
                                self.node_ports
                            ),
                        ));
                        break;
                    }
                }
            }
        }
        match failure {
            Some((reason, message)) => {
                ledger.abort(key);
                ledger.park(key);
                plan.events.push((EventType::Warning, reason, message));
            }
            None => plan.update = Some(updated),
        }
        plan
    }
}

/// Runs the Service allocator with `workers` workers until `stop` is cancelled.
pub async fn run(
    informers: &Informers,
    recorder: EventRecorder,
    ranges: ServiceRanges,
    workers: usize,
    stop: CancelToken,
) {
    Allocator::run(informers, recorder, ranges, workers, stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ObjectMeta, ServicePort, ServiceSpec};
    use skiff_client::controller::Change;
    use std::sync::Arc;

    fn ranges() -> ServiceRanges {
        ServiceRanges::new(
            "10.96.0.0/29".parse().unwrap(),
            "30000-30002".parse().unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn the_service_cidr_needs_hosts() {
        let err = ServiceRanges::new("10.96.0.0/31".parse().unwrap(), "1-2".parse().unwrap());
        assert!(
            err.unwrap_err()
                .to_string()
                .contains("has no host addresses")
        );
    }

    fn svc(name: &str, ty: &str, ip: &str, ports: &[(i32, &str, i32)]) -> Service {
        Service {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: "ns".into(),
                resource_version: "1".into(),
                creation_timestamp: format!("2024-01-01T00:00:0{}Z", name.len()),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                r#type: ty.into(),
                cluster_ip: ip.into(),
                ports: ports
                    .iter()
                    .map(|(port, protocol, node_port)| ServicePort {
                        name: format!("p{port}-{}", protocol.to_lowercase()),
                        port: *port,
                        protocol: protocol.to_string(),
                        node_port: *node_port,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn plan(l: &mut Ledger<Service>, s: &Service) -> Allocation<Service> {
        let mut requeue = BTreeSet::new();
        l.apply(&Change::Added(Arc::new(s.clone())), &mut requeue);
        ranges().plan(l, &ObjectKey::of(s), s)
    }

    fn spec(p: &Allocation<Service>) -> ServiceSpec {
        p.update
            .as_ref()
            .and_then(|s| s.spec.clone())
            .expect("an update")
    }

    #[test]
    fn allocates_ips_and_shared_node_ports() {
        let r = ranges();
        let mut l = Ledger::new(r.pools(), move |s: &Service| r.claims(s));
        let p = plan(
            &mut l,
            &svc(
                "a",
                "NodePort",
                "",
                &[(53, "TCP", 0), (53, "UDP", 0), (80, "TCP", 0)],
            ),
        );
        let s = spec(&p);
        assert_eq!(s.cluster_ip, "10.96.0.1");
        assert_eq!(s.cluster_ips, ["10.96.0.1"]);
        let ports: Vec<i32> = s.ports.iter().map(|p| p.node_port).collect();
        assert_eq!(ports, [30000, 30000, 30001]);
        // Headless Services get no IP, services with one keep it.
        assert!(
            plan(&mut l, &svc("h", "ClusterIP", "None", &[(80, "TCP", 0)]))
                .update
                .is_none()
        );
        assert!(
            plan(
                &mut l,
                &svc("k", "ClusterIP", "10.96.0.5", &[(80, "TCP", 0)])
            )
            .update
            .is_none()
        );
        // A user-chosen port for 53/TCP is reused for 53/UDP.
        let s = spec(&plan(
            &mut l,
            &svc("bb", "NodePort", "", &[(53, "TCP", 30002), (53, "UDP", 0)]),
        ));
        assert_eq!(s.cluster_ip, "10.96.0.2");
        assert_eq!(s.ports[1].node_port, 30002);
    }

    #[test]
    fn load_balancers_get_node_ports_unless_they_opt_out() {
        let r = ranges();
        let mut l = Ledger::new(r.pools(), move |s: &Service| r.claims(s));
        let s = spec(&plan(
            &mut l,
            &svc("lb", "LoadBalancer", "", &[(80, "TCP", 0)]),
        ));
        assert_eq!(
            (s.cluster_ip.as_str(), s.ports[0].node_port),
            ("10.96.0.1", 30000)
        );
        let mut opt_out = svc("lb2", "LoadBalancer", "", &[(80, "TCP", 0)]);
        if let Some(spec) = opt_out.spec.as_mut() {
            spec.allocate_load_balancer_node_ports = Some(false);
        }
        let s = spec(&plan(&mut l, &opt_out));
        assert_eq!(
            (s.cluster_ip.as_str(), s.ports[0].node_port),
            ("10.96.0.2", 0)
        );
    }

    #[test]
    fn full_ranges_and_duplicates_are_reported() {
        let r = ranges();
        let mut l = Ledger::new(r.pools(), move |s: &Service| r.claims(s));
        plan(
            &mut l,
            &svc(
                "a",
                "NodePort",
                "10.96.0.1",
                &[(80, "TCP", 30000), (81, "TCP", 30001)],
            ),
        );
        // Only 30002 is left: the second port fails, and the IP is not taken either.
        let p = plan(
            &mut l,
            &svc("bb", "NodePort", "", &[(80, "TCP", 0), (81, "TCP", 0)]),
        );
        assert!(p.update.is_none());
        assert_eq!(p.events.len(), 1);
        assert_eq!(p.events[0].1, "NodePortAllocationFailed");
        assert!(p.events[0].2.contains("30000-30002"), "{}", p.events[0].2);
        assert_eq!((l.used(IPS), l.used(NODE_PORTS)), (1, 2));
        // A later Service with the same user-chosen values is told, and keeps them.
        let p = plan(
            &mut l,
            &svc("ccc", "NodePort", "10.96.0.1", &[(80, "TCP", 30000)]),
        );
        assert!(p.update.is_none());
        let reasons: Vec<&str> = p.events.iter().map(|e| e.1).collect();
        assert_eq!(
            reasons,
            ["ClusterIPAlreadyAllocated", "PortAlreadyAllocated"]
        );
        assert!(
            p.events[0]
                .2
                .contains("10.96.0.1 is already allocated to service ns/a")
        );
        // Values outside the ranges are not tracked.
        let p = plan(
            &mut l,
            &svc("dddd", "ClusterIP", "10.1.0.1", &[(80, "TCP", 0)]),
        );
        assert!(p.update.is_none() && p.events.is_empty());
        assert_eq!(l.used(IPS), 1);
        // Exhaust the IPs: 10.96.0.1 is used, 5 more hosts, then a failure.
        for name in ["e1", "e2", "e3", "e4", "e5"] {
            assert!(
                plan(&mut l, &svc(name, "ClusterIP", "", &[(80, "TCP", 0)]))
                    .update
                    .is_some()
            );
        }
        let p = plan(&mut l, &svc("e6", "ClusterIP", "", &[(80, "TCP", 0)]));
        assert_eq!(p.events[0].1, "ClusterIPAllocationFailed");
        assert!(p.events[0].2.contains("10.96.0.0/29"));
    }
}
