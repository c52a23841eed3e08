//! The desired state of the Service load balancer (pure): which frontends a Service wants on
//! this node and which backends each gets, from the Service and its Endpoints.

use std::net::{IpAddr, Ipv4Addr};

use skiff_api::api::{Endpoints, Service};
use skiff_datapath::lb::{BackendAddr, Frontend, Protocol, ServiceParams};

/// Kubernetes' default ClientIP affinity timeout (3 h).
const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10800;
/// One frontend a Service wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredPort {
    pub frontend: Frontend,
    pub port_name: String,
    pub params: ServiceParams,
    pub backends: Vec<BackendAddr>,
}

/// The frontends `svc` wants, with their ready backends from `eps` (pure; `None` = absent),
/// without NodePort frontends: [`desired_on`] for a node without addresses.
pub fn desired(svc: Option<&Service>, eps: Option<&Endpoints>) -> Vec<DesiredPort> {
    desired_on(svc, eps, "", &[])
}

/// A Service served on this node by the agent itself: every frontend of the family of
/// `local` (TCP and UDP alike) is sent there instead of to the Endpoints' addresses (the
/// `kubernetes` Service to the API server passthrough, [`crate::apiproxy`]; `kube-dns` to
/// the cluster DNS, [`crate::dns`]). Frontends of the other family keep theirs.
pub fn to_local(ports: &mut [DesiredPort], local: BackendAddr) {
    for p in ports {
        if p.frontend.ip.is_ipv4() == local.ip.is_ipv4() {
            p.backends = vec![local];
        }
    }
}

/// Whether a Service of this `type` gets node ports (`LoadBalancer` includes `NodePort`).
fn has_node_ports(service_type: &str) -> bool {
    matches!(service_type, "NodePort" | "LoadBalancer")
}

/// The frontends `svc` wants on a node with addresses `node_ips`: one per ServicePort and
/// cluster IP, plus, for a Service of type NodePort (or LoadBalancer), one per ServicePort
/// with a `nodePort` and IPv4 node address, `<node IP>:<nodePort>` with
/// [`ServiceParams::node_port`] set (the tc NodePort program serves only IPv4). NodePort
/// frontends balance over every ready backend of the cluster (externalTrafficPolicy
/// `Cluster`), or with `externalTrafficPolicy: Local` over the ready backends whose
/// Endpoints address has `nodeName` = `node` only, without SNAT ([`ServiceParams::local`];
/// no local backend: the frontend drops new flows, as kube-proxy does). Each such `Local`
/// frontend also gets its in-cluster view ([`Frontend::in_cluster_view`]) over every ready
/// backend: connections made on the node (pods, the host) are balanced over the cluster, as
/// kube-proxy sends traffic from inside the cluster to a `Local` Service's external
/// addresses.
///
/// A Service of type LoadBalancer also gets, for each IPv4 address of its
/// `status.loadBalancer.ingress` ([`load_balancer_ips`]) and each ServicePort, the frontend
/// `<ingress IP>:<port>`, programmed like a NodePort frontend (the tc program serves it from
/// outside, Maglev, the same externalTrafficPolicy), on every node: whichever node the
/// address's L2 announcement draws traffic to serves it.
pub fn desired_on(
    svc: Option<&Service>,
    eps: Option<&Endpoints>,
    node: &str,
    node_ips: &[IpAddr],
) -> Vec<DesiredPort> {
    let Some(spec) = svc.and_then(|s| s.spec.as_ref()) else {
        return Vec::new();
    };
    let ips = cluster_ips(spec);
    let params = ServiceParams {
        affinity_timeout_s: (spec.session_affinity == "ClientIP").then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .filter(|t| *t > 0)
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_S)
        }),
        node_port: false,
        local: false,
    };
    let node_ports = has_node_ports(&spec.r#type);
    let lb_ips = svc.map(load_balancer_ips).unwrap_or_default();
    let local = spec.external_traffic_policy == "Local";
    let mut out = Vec::new();
    for sp in &spec.ports {
        let protocol = if sp.protocol.is_empty() {
            Some(Protocol::Tcp)
        } else {
            Protocol::parse(&sp.protocol)
        };
        let (Some(protocol), Ok(port)) = (protocol, u16::try_from(sp.port)) else {
            continue;
        };
        if port == 0 {
            continue;
        }
        let (backends, local_backends) = backends_of(eps, &sp.name, protocol, node);
        for ip in &ips {
            out.push(DesiredPort {
                frontend: Frontend::new(*ip, port, protocol),
                port_name: sp.name.clone(),
                params,
                // A frontend gets the backends of its own family.
                backends: backends
                    .iter()
                    .filter(|b| b.ip.is_ipv4() == ip.is_ipv4())
                    .copied()
                    .collect(),
            });
        }
        let node_port = u16::try_from(sp.node_port).unwrap_or(0);
        let from_outside = node_ips
            .iter()
            .filter(|ip| ip.is_ipv4() && node_ports && node_port != 0)
            .map(|ip| (*ip, node_port))
            .chain(lb_ips.iter().map(|ip| (IpAddr::V4(*ip), port)));
        let v4 = |bs: &[BackendAddr]| bs.iter().filter(|b| b.ip.is_ipv4()).copied().collect();
        for (ip, port) in from_outside {
            let frontend = Frontend::new(ip, port, protocol);
            out.push(DesiredPort {
                frontend,
                port_name: sp.name.clone(),
                params: ServiceParams {
                    node_port: true,
                    local,
                    ..params
                },
                backends: v4(if local { &local_backends } else { &backends }),
            });
            if local {
                // Connections made inside the cluster go to every ready backend.
                out.push(DesiredPort {
                    frontend: frontend.in_cluster_view(),
                    port_name: sp.name.clone(),
                    params,
                    backends: v4(&backends),
                });
            }
        }
    }
    out
}

/// The IPv4 addresses of a LoadBalancer Service's `status.loadBalancer.ingress`, once each
/// (hostnames, IPv6 and anything unparsable are skipped; other types have none).
pub fn load_balancer_ips(svc: &Service) -> Vec<Ipv4Addr> {
    if svc.spec.as_ref().is_none_or(|s| s.r#type != "LoadBalancer") {
        return Vec::new();
    }
    let mut ips = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .map(|lb| lb.ingress.as_slice())
        .unwrap_or_default();
    for i in ingress {
        if let Ok(ip) = i.ip.parse::<Ipv4Addr>()
            && !ips.contains(&ip)
        {
            ips.push(ip);
        }
    }
    ips
}

/// The Service's cluster IPs, once each: `""` (not allocated yet), `"None"` (headless) and
/// anything unparsable get no frontend.
fn cluster_ips(spec: &skiff_api::api::ServiceSpec) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = Vec::new();
    let listed = if spec.cluster_ips.is_empty() {
        std::slice::from_ref(&spec.cluster_ip)
    } else {
        spec.cluster_ips.as_slice()
    };
    for ip in listed {
        if let Ok(ip) = ip.parse::<IpAddr>()
            && !ips.contains(&ip)
        {
            ips.push(ip);
        }
    }
    ips
}

/// The ready backends of the ServicePort named `port_name` (Endpoints ports match
/// ServicePorts by name and protocol), and those of them on node `node`.
fn backends_of(
    eps: Option<&Endpoints>,
    port_name: &str,
    protocol: Protocol,
    node: &str,
) -> (Vec<BackendAddr>, Vec<BackendAddr>) {
    let mut backends = Vec::new();
    let mut local_backends = Vec::new();
    for subset in eps.map(|e| e.subsets.as_slice()).unwrap_or_default() {
        let Some(target) = subset.ports.iter().find(|p| {
            p.name == port_name
                && (if p.protocol.is_empty() {
                    protocol == Protocol::Tcp
                } else {
                    Protocol::parse(&p.protocol) == Some(protocol)
                })
        }) else {
            continue;
        };
        let Ok(target_port) = u16::try_from(target.port) else {
            continue;
        };
        if target_port == 0 {
            continue;
        }
        for a in &subset.addresses {
            if let Ok(ip) = a.ip.parse::<IpAddr>() {
                let b = BackendAddr {
                    ip,
                    port: target_port,
                };
                if !backends.contains(&b) {
                    backends.push(b);
                }
                if a.node_name.as_deref() == Some(node) && !local_backends.contains(&b) {
                    local_backends.push(b);
                }
            }
        }
    }
    (backends, local_backends)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        ClientIpConfig, EndpointAddress, EndpointPort, EndpointSubset, ObjectMeta, ServicePort,
        ServiceSpec, SessionAffinityConfig,
    };

    fn svc(cluster_ip: &str, ports: &[(&str, i32, &str)]) -> Service {
        Service {
            metadata: Some(ObjectMeta {
                name: "web".into(),
                namespace: "default".into(),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                cluster_ip: cluster_ip.into(),
                ports: ports
                    .iter()
                    .map(|(name, port, proto)| ServicePort {
                        name: name.to_string(),
                        port: *port,
                        protocol: proto.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn subset(ready: &[&str], not_ready: &[&str], ports: &[(&str, i32, &str)]) -> EndpointSubset {
        let addr = |ip: &&str| EndpointAddress {
            ip: ip.to_string(),
            ..Default::default()
        };
        EndpointSubset {
            addresses: ready.iter().map(addr).collect(),
            not_ready_addresses: not_ready.iter().map(addr).collect(),
            ports: ports
                .iter()
                .map(|(name, port, proto)| EndpointPort {
                    name: name.to_string(),
                    port: *port,
                    protocol: proto.to_string(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn eps(subsets: Vec<EndpointSubset>) -> Endpoints {
        Endpoints {
            subsets,
            ..Default::default()
        }
    }

    fn b(ip: &str, port: u16) -> BackendAddr {
        BackendAddr {
            ip: ip.parse().unwrap(),
            port,
        }
    }

    #[test]
    fn the_api_server_goes_through_the_nodes_passthrough() {
        let s = svc("10.96.0.1", &[("https", 443, "TCP")]);
        let e = eps(vec![subset(&["127.0.0.1"], &[], &[("https", 7443, "TCP")])]);
        let mut ports = desired(Some(&s), Some(&e));
        assert_eq!(ports[0].backends, [b("127.0.0.1", 7443)]);
        to_local(&mut ports, b("192.168.100.1", 6444));
        assert_eq!(ports[0].backends, [b("192.168.100.1", 6444)]);
        assert_eq!(ports[0].frontend.port, 443);
        // An IPv6 frontend keeps its own backends (the passthrough is IPv4 here).
        let mut v6 = desired(Some(&svc("fd00::1", &[("https", 443, "TCP")])), None);
        to_local(&mut v6, b("192.168.100.1", 6444));
        assert!(v6[0].backends.is_empty());
    }

    #[test]
    fn node_port_services_get_a_frontend_per_node_address() {
        let mut s = svc("10.96.0.20", &[("http", 80, "TCP"), ("dns", 53, "UDP")]);
        let spec = s.spec.as_mut().unwrap();
        spec.r#type = "NodePort".into();
        spec.ports[0].node_port = 30080;
        // No nodePort allocated yet for "dns": no NodePort frontend for it.
        let e = eps(vec![subset(
            &["10.244.0.5", "10.244.1.6"],
            &[],
            &[("http", 8080, "TCP"), ("dns", 5353, "UDP")],
        )]);
        let nodes: Vec<IpAddr> = vec!["192.168.100.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        let d = desired_on(Some(&s), Some(&e), "node-1", &nodes);
        let names: Vec<String> = d.iter().map(|d| d.frontend.to_string()).collect();
        assert_eq!(
            names,
            [
                "10.96.0.20:80/TCP",
                "192.168.100.2:30080/TCP",
                "10.96.0.20:53/UDP"
            ]
        );
        assert!(d[1].params.node_port && !d[0].params.node_port);
        assert_eq!(
            d[1].backends,
            [b("10.244.0.5", 8080), b("10.244.1.6", 8080)]
        );
        // ClusterIP Services, and nodes without addresses, get none.
        s.spec.as_mut().unwrap().r#type = "ClusterIP".into();
        assert_eq!(desired_on(Some(&s), Some(&e), "node-1", &nodes).len(), 2);
        s.spec.as_mut().unwrap().r#type = "LoadBalancer".into();
        assert_eq!(desired_on(Some(&s), Some(&e), "node-1", &nodes).len(), 3);
        assert_eq!(desired(Some(&s), Some(&e)).len(), 2);
    }

    #[test]
    fn external_traffic_policy_local_keeps_this_nodes_backends_only() {
        let mut s = svc("10.96.0.21", &[("http", 80, "TCP")]);
        let spec = s.spec.as_mut().unwrap();
        spec.r#type = "NodePort".into();
        spec.ports[0].node_port = 30081;
        spec.external_traffic_policy = "Local".into();
        let mut sub = subset(
            &["10.244.0.5", "10.244.1.6", "10.244.0.7"],
            &[],
            &[("http", 8080, "TCP")],
        );
        for (a, node) in sub.addresses.iter_mut().zip(["node-1", "node-2", "node-1"]) {
            a.node_name = Some(node.to_string());
        }
        let e = eps(vec![sub]);
        let nodes: Vec<IpAddr> = vec!["192.168.100.2".parse().unwrap()];
        let d = desired_on(Some(&s), Some(&e), "node-1", &nodes);
        assert_eq!(
            d.len(),
            3,
            "clusterIP, nodePort and the nodePort's in-cluster view"
        );
        assert_eq!(d[0].backends.len(), 3, "the clusterIP keeps every backend");
        assert!(d[2].frontend.in_cluster && !d[2].params.local);
        assert_eq!(
            d[2].backends.len(),
            3,
            "connections from inside: every backend"
        );
        assert!(d[1].params.node_port && d[1].params.local);
        assert_eq!(
            d[1].backends,
            [b("10.244.0.5", 8080), b("10.244.0.7", 8080)],
            "the nodePort only this node's"
        );
        let other = desired_on(Some(&s), Some(&e), "node-3", &nodes);
        assert!(other[1].backends.is_empty(), "no local backend: none");
        s.spec.as_mut().unwrap().external_traffic_policy = "Cluster".into();
        let d = desired_on(Some(&s), Some(&e), "node-1", &nodes);
        assert!(!d[1].params.local);
        assert_eq!(d[1].backends.len(), 3);
        assert_eq!(d.len(), 2, "Cluster: no in-cluster view");
    }

    #[test]
    fn load_balancer_addresses_are_served_like_node_ports() {
        use skiff_api::api::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};
        let mut s = svc("10.96.0.22", &[("http", 80, "TCP")]);
        let spec = s.spec.as_mut().unwrap();
        spec.r#type = "LoadBalancer".into();
        spec.ports[0].node_port = 30082;
        s.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: ["192.168.100.240", "fd00::240", "192.168.100.240", ""]
                    .iter()
                    .map(|ip| LoadBalancerIngress {
                        ip: ip.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            }),
            ..Default::default()
        });
        assert_eq!(load_balancer_ips(&s), [Ipv4Addr::new(192, 168, 100, 240)]);
        let mut sub = subset(&["10.244.0.5", "10.244.1.6"], &[], &[("http", 8080, "TCP")]);
        sub.addresses[0].node_name = Some("node-1".into());
        sub.addresses[1].node_name = Some("node-2".into());
        let e = eps(vec![sub]);
        let nodes: Vec<IpAddr> = vec!["192.168.100.2".parse().unwrap()];
        let d = desired_on(Some(&s), Some(&e), "node-1", &nodes);
        let names: Vec<String> = d.iter().map(|d| d.frontend.to_string()).collect();
        assert_eq!(
            names,
            [
                "10.96.0.22:80/TCP",
                "192.168.100.2:30082/TCP",
                "192.168.100.240:80/TCP"
            ]
        );
        assert!(d[2].params.node_port && !d[2].params.local);
        assert_eq!(d[2].backends.len(), 2);
        // Local: this node's backends only, no SNAT; connections made inside the cluster
        // (the in-cluster view of each outside frontend) go to every backend, as kube-proxy
        // sends them.
        s.spec.as_mut().unwrap().external_traffic_policy = "Local".into();
        let d = desired_on(Some(&s), Some(&e), "node-2", &nodes);
        let names: Vec<String> = d.iter().map(|d| d.frontend.to_string()).collect();
        assert_eq!(
            names,
            [
                "10.96.0.22:80/TCP",
                "192.168.100.2:30082/TCP",
                "192.168.100.2:30082/TCP (in-cluster)",
                "192.168.100.240:80/TCP",
                "192.168.100.240:80/TCP (in-cluster)"
            ]
        );
        assert!(d[3].params.local && d[3].params.node_port);
        assert_eq!(d[3].backends, [b("10.244.1.6", 8080)]);
        assert!(!d[4].params.local && !d[4].params.node_port);
        assert_eq!(d[4].backends.len(), 2);
        assert_eq!(
            d[4].frontend.key().family,
            d[3].frontend.key().family | 0x80
        );
        // Also on a node without addresses; not for another type.
        assert_eq!(desired_on(Some(&s), Some(&e), "node-1", &[]).len(), 3);
        s.spec.as_mut().unwrap().r#type = "NodePort".into();
        assert!(load_balancer_ips(&s).is_empty());
        assert_eq!(desired_on(Some(&s), Some(&e), "node-1", &nodes).len(), 3);
    }

    #[test]
    fn ready_addresses_per_named_port() {
        let s = svc("10.96.0.10", &[("http", 80, "TCP"), ("dns", 53, "UDP")]);
        let e = eps(vec![
            subset(
                &["10.244.0.5", "10.244.0.6"],
                &["10.244.0.7"],
                &[("http", 8080, "TCP"), ("dns", 5353, "UDP")],
            ),
            // Another subset where the pods listen elsewhere.
            subset(&["10.244.1.9"], &[], &[("http", 9090, "TCP")]),
        ]);
        let d = desired(Some(&s), Some(&e));
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].frontend.to_string(), "10.96.0.10:80/TCP");
        assert_eq!(d[0].port_name, "http");
        assert_eq!(
            d[0].backends,
            [
                b("10.244.0.5", 8080),
                b("10.244.0.6", 8080),
                b("10.244.1.9", 9090)
            ]
        );
        assert_eq!(d[1].frontend.to_string(), "10.96.0.10:53/UDP");
        assert_eq!(
            d[1].backends,
            [b("10.244.0.5", 5353), b("10.244.0.6", 5353)],
            "not-ready addresses get no traffic"
        );
        assert_eq!(d[0].params, ServiceParams::default());
    }

    #[test]
    fn ports_match_by_name_and_protocol() {
        // A single unnamed port matches the unnamed Endpoints port.
        let s = svc("10.96.0.11", &[("", 80, "TCP")]);
        let e = eps(vec![subset(&["10.244.0.5"], &[], &[("", 8080, "")])]);
        assert_eq!(
            desired(Some(&s), Some(&e))[0].backends,
            [b("10.244.0.5", 8080)]
        );
        // Same name, other protocol: no backend.
        let e = eps(vec![subset(&["10.244.0.5"], &[], &[("", 8080, "UDP")])]);
        assert!(desired(Some(&s), Some(&e))[0].backends.is_empty());
        // No Endpoints yet: the frontend exists (and refuses connections).
        let d = desired(Some(&s), None);
        assert_eq!(d.len(), 1);
        assert!(d[0].backends.is_empty());
    }

    #[test]
    fn headless_unallocated_and_missing_services_have_no_frontends() {
        let e = eps(vec![subset(&["10.244.0.5"], &[], &[("", 80, "TCP")])]);
        for ip in ["None", "", "not-an-ip"] {
            assert!(desired(Some(&svc(ip, &[("", 80, "TCP")])), Some(&e)).is_empty());
        }
        assert!(desired(None, Some(&e)).is_empty());
        // An unsupported protocol or a bad port is skipped, the rest stays.
        let s = svc(
            "10.96.0.12",
            &[("a", 80, "QUIC"), ("b", 70000, "TCP"), ("c", 81, "")],
        );
        let d = desired(Some(&s), None);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].frontend.to_string(), "10.96.0.12:81/TCP");
    }

    #[test]
    fn client_ip_affinity_and_dual_stack() {
        let mut s = svc("10.96.0.13", &[("", 80, "TCP")]);
        let spec = s.spec.as_mut().unwrap();
        spec.session_affinity = "ClientIP".into();
        spec.cluster_ips = vec!["10.96.0.13".into(), "fd00::13".into()];
        let e = eps(vec![subset(
            &["10.244.0.5", "fd00:244::5"],
            &[],
            &[("", 8080, "TCP")],
        )]);
        let d = desired(Some(&s), Some(&e));
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].params.affinity_timeout_s, Some(10800), "default 3 h");
        assert_eq!(d[0].backends, [b("10.244.0.5", 8080)]);
        assert_eq!(d[1].frontend.to_string(), "[fd00::13]:80/TCP");
        assert_eq!(d[1].backends, [b("fd00:244::5", 8080)]);
        s.spec.as_mut().unwrap().session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIpConfig {
                timeout_seconds: Some(60),
            }),
        });
        assert_eq!(
            desired(Some(&s), None)[0].params.affinity_timeout_s,
            Some(60)
        );
    }
}
