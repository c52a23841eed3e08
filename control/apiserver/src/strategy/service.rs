//! Services: type, ports, session affinity, and the immutable clusterIP.
//!
//! ClusterIPs and nodePorts are allocated by the controller manager's Service allocator
//! (`skiff-controllers`' `serviceip`), which writes them with an ordinary update; the API
//! server only validates them, keeps them when an update leaves them empty, and refuses to
//! change a clusterIP once set (`spec.clusterIP: field is immutable`). ExternalName Services
//! have no clusterIP (the cluster DNS answers their name with a CNAME to `externalName`).
//!
//! A LoadBalancer Service is a NodePort Service (nodePorts unless
//! `allocateLoadBalancerNodePorts: false`) whose `status.loadBalancer.ingress` the
//! controller manager's lbipam controller fills from LoadBalancerIPPools. The address it asks
//! for (`spec.loadBalancerIP` or the `skiff.io/lb-ips` annotation) must be a valid IP, one
//! per family; that it lies in a pool is the admission plug-in `LoadBalancerIPPools`' check.
//! `spec.loadBalancerClass` may not change while the Service stays a LoadBalancer.

use std::collections::BTreeSet;

use skiff_api::api::{ClientIpConfig, Service, ServiceSpec, SessionAffinityConfig};
use skiff_api::lb_pool;

use super::{PROTOCOLS, Strategy};
use crate::error::FieldError;
use crate::validation::{self as v, NameRule};

const TYPES: &[&str] = &["ClusterIP", "ExternalName", "NodePort", "LoadBalancer"];
const AFFINITIES: &[&str] = &["None", "ClientIP"];
/// `status.loadBalancer.ingress[].ipMode`.
const IP_MODES: &[&str] = &["VIP", "Proxy"];
/// Kubernetes' default node port range.
pub const NODE_PORT_RANGE: std::ops::RangeInclusive<i32> = 30000..=32767;

impl Strategy for Service {
    const NAME_RULE: NameRule = NameRule::Label;

    /// type ClusterIP, sessionAffinity None, port protocol TCP, targetPort = port,
    /// traffic policies Cluster, ClientIP affinity timeout 3 h; a LoadBalancer gets nodePorts
    /// (allocateLoadBalancerNodePorts true).
    fn default(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        if spec.r#type.is_empty() {
            spec.r#type = "ClusterIP".into();
        }
        if spec.session_affinity.is_empty() {
            spec.session_affinity = "None".into();
        }
        if spec.session_affinity == "ClientIP" {
            let cfg = spec
                .session_affinity_config
                .get_or_insert_with(SessionAffinityConfig::default)
                .client_ip
                .get_or_insert_with(ClientIpConfig::default);
            cfg.timeout_seconds.get_or_insert(10800);
        }
        if spec.internal_traffic_policy.is_empty() {
            spec.internal_traffic_policy = "Cluster".into();
        }
        let external = matches!(spec.r#type.as_str(), "NodePort" | "LoadBalancer");
        if external && spec.external_traffic_policy.is_empty() {
            spec.external_traffic_policy = "Cluster".into();
        }
        if spec.r#type == "LoadBalancer" {
            spec.allocate_load_balancer_node_ports.get_or_insert(true);
        }
        for p in &mut spec.ports {
            if p.protocol.is_empty() {
                p.protocol = "TCP".into();
            }
            if p.target_port.is_empty() || p.target_port == "0" {
                p.target_port = p.port.to_string();
            }
        }
    }

    /// An update that leaves clusterIP (or a nodePort) empty keeps the stored value.
    fn prepare_update(&mut self, old: &Self) {
        let (Some(new), Some(old)) = (self.spec.as_mut(), old.spec.as_ref()) else {
            return;
        };
        if new.cluster_ip.is_empty() {
            new.cluster_ip = old.cluster_ip.clone();
            if new.cluster_ips.is_empty() {
                new.cluster_ips = old.cluster_ips.clone();
            }
        }
        let node_ports = |t: &str| matches!(t, "NodePort" | "LoadBalancer");
        if node_ports(&new.r#type) && node_ports(&old.r#type) {
            for p in new.ports.iter_mut().filter(|p| p.node_port == 0) {
                if let Some(o) = old
                    .ports
                    .iter()
                    .find(|o| o.port == p.port && o.protocol == p.protocol)
                {
                    p.node_port = o.node_port;
                }
            }
        }
        drop_type_dependent_fields(new, old);
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        if !TYPES.contains(&spec.r#type.as_str()) {
            out.push(FieldError::not_supported("spec.type", &spec.r#type, TYPES));
        }
        if !AFFINITIES.contains(&spec.session_affinity.as_str()) {
            out.push(FieldError::not_supported(
                "spec.sessionAffinity",
                &spec.session_affinity,
                AFFINITIES,
            ));
        }
        if let Some(t) = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            && !(1..=86400).contains(&t)
        {
            out.push(FieldError::invalid(
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                t,
                "must be greater than 0 and less than 86400",
            ));
        }
        let headless = spec.cluster_ip == "None";
        if !spec.cluster_ip.is_empty()
            && !headless
            && spec.cluster_ip.parse::<std::net::IpAddr>().is_err()
        {
            out.push(FieldError::invalid(
                "spec.clusterIP",
                &spec.cluster_ip,
                "must be empty, 'None', or a valid IP address",
            ));
        }
        if headless && matches!(spec.r#type.as_str(), "NodePort" | "LoadBalancer") {
            out.push(FieldError::invalid(
                "spec.clusterIP",
                "None",
                format!("may not be set to 'None' for {} services", spec.r#type),
            ));
        }
        check_load_balancer_fields(&mut out, self);
        let external = spec.r#type == "ExternalName";
        if external {
            if spec.external_name.is_empty() {
                out.push(FieldError::required("spec.externalName", ""));
            } else {
                v::check_dns_subdomain(
                    &mut out,
                    "spec.externalName",
                    spec.external_name.trim_end_matches('.'),
                );
            }
            if !spec.cluster_ip.is_empty() && !headless {
                out.push(FieldError::forbidden(
                    "spec.clusterIPs",
                    "may not be set for ExternalName services",
                ));
            }
        }
        if spec.ports.is_empty() && !headless && !external {
            out.push(FieldError::required("spec.ports", ""));
        }
        let mut names = BTreeSet::new();
        let mut port_protocols = BTreeSet::new();
        let mut node_ports = BTreeSet::new();
        for (i, p) in spec.ports.iter().enumerate() {
            let pp = format!("spec.ports[{i}]");
            if spec.ports.len() > 1 && p.name.is_empty() {
                out.push(FieldError::required(format!("{pp}.name"), ""));
            } else if !p.name.is_empty() {
                v::check_dns_label(&mut out, &format!("{pp}.name"), &p.name);
                if !names.insert(p.name.as_str()) {
                    out.push(FieldError::duplicate(format!("{pp}.name"), &p.name));
                }
            }
            v::check_port_number(&mut out, &format!("{pp}.port"), p.port.into());
            if !PROTOCOLS.contains(&p.protocol.as_str()) {
                out.push(FieldError::not_supported(
                    format!("{pp}.protocol"),
                    &p.protocol,
                    PROTOCOLS,
                ));
            }
            if !port_protocols.insert((p.port, p.protocol.as_str())) {
                out.push(FieldError::duplicate(
                    pp.clone(),
                    format!("{}/{}", p.port, p.protocol),
                ));
            }
            v::check_port_or_name(&mut out, &format!("{pp}.targetPort"), &p.target_port);
            if p.node_port != 0 {
                if !matches!(spec.r#type.as_str(), "NodePort" | "LoadBalancer") {
                    out.push(FieldError::forbidden(
                        format!("{pp}.nodePort"),
                        format!("may not be used when `type` is '{}'", spec.r#type),
                    ));
                } else if !NODE_PORT_RANGE.contains(&p.node_port) {
                    out.push(FieldError::invalid(
                        format!("{pp}.nodePort"),
                        p.node_port,
                        "provided port is not in the valid range. The range of valid ports is \
                         30000-32767",
                    ));
                } else if !node_ports.insert((p.node_port, p.protocol.as_str())) {
                    out.push(FieldError::duplicate(format!("{pp}.nodePort"), p.node_port));
                }
            }
        }
        v::check_labels(&mut out, "spec.selector", &spec.selector);
        out
    }

    /// clusterIP is immutable once set; loadBalancerClass while the Service stays a
    /// LoadBalancer.
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let ip = |s: &Service| {
            s.spec
                .as_ref()
                .map(|s| s.cluster_ip.clone())
                .unwrap_or_default()
        };
        let (old_ip, new_ip) = (ip(old), ip(self));
        if !old_ip.is_empty() && old_ip != new_ip {
            out.push(FieldError::immutable("spec.clusterIP", new_ip));
        }
        if let (Some(new), Some(old)) = (&self.spec, &old.spec)
            && new.r#type == "LoadBalancer"
            && old.r#type == "LoadBalancer"
            && new.load_balancer_class != old.load_balancer_class
        {
            out.push(FieldError::invalid(
                "spec.loadBalancerClass",
                new.load_balancer_class.clone().unwrap_or_default(),
                "may not change once set",
            ));
        }
        out
    }
}

/// What only a LoadBalancer (or NodePort) Service has is dropped when an update changes the
/// type and leaves it as it was, as kube-apiserver's `dropTypeDependentFields` does, so
/// `kubectl apply` or a patch of `type` alone goes through: allocateLoadBalancerNodePorts
/// and loadBalancerClass off a LoadBalancer, nodePorts off a NodePort or LoadBalancer.
/// `loadBalancerIP` is the user's to remove, as in Kubernetes.
fn drop_type_dependent_fields(new: &mut ServiceSpec, old: &ServiceSpec) {
    if new.r#type == old.r#type {
        return;
    }
    if old.r#type == "LoadBalancer" && new.r#type != "LoadBalancer" {
        if new.allocate_load_balancer_node_ports == old.allocate_load_balancer_node_ports {
            new.allocate_load_balancer_node_ports = None;
        }
        if new.load_balancer_class == old.load_balancer_class {
            new.load_balancer_class = None;
        }
    }
    let node_ports = |t: &str| matches!(t, "NodePort" | "LoadBalancer");
    if node_ports(&old.r#type) && !node_ports(&new.r#type) {
        for p in new.ports.iter_mut() {
            let unchanged = old.ports.iter().any(|o| {
                o.port == p.port && o.protocol == p.protocol && o.node_port == p.node_port
            });
            if unchanged {
                p.node_port = 0;
            }
        }
    }
}

/// loadBalancerIP, loadBalancerClass and allocateLoadBalancerNodePorts only on LoadBalancer
/// Services (Kubernetes' words); the addresses asked for are IPs, one per family.
fn check_load_balancer_fields(out: &mut Vec<FieldError>, svc: &Service) {
    let Some(spec) = &svc.spec else {
        return;
    };
    let lb = spec.r#type == "LoadBalancer";
    let only_lb = |field: &str| {
        FieldError::forbidden(
            format!("spec.{field}"),
            "may only be used when `type` is 'LoadBalancer'",
        )
    };
    if !spec.load_balancer_ip.is_empty() {
        if !lb {
            out.push(only_lb("loadBalancerIP"));
        } else if spec.load_balancer_ip.parse::<std::net::IpAddr>().is_err() {
            out.push(FieldError::invalid(
                "spec.loadBalancerIP",
                &spec.load_balancer_ip,
                "must be a valid IP address",
            ));
        }
    }
    if let Some(class) = &spec.load_balancer_class {
        if !lb {
            out.push(only_lb("loadBalancerClass"));
        } else {
            v::check_qualified_name(out, "spec.loadBalancerClass", class);
        }
    }
    if spec.allocate_load_balancer_node_ports.is_some() && !lb {
        out.push(only_lb("allocateLoadBalancerNodePorts"));
    }
    let ingress = svc
        .status
        .iter()
        .flat_map(|s| &s.load_balancer)
        .flat_map(|l| &l.ingress);
    for (i, ing) in ingress.enumerate() {
        let p = format!("status.loadBalancer.ingress[{i}]");
        if !ing.ip.is_empty() && ing.ip.parse::<std::net::IpAddr>().is_err() {
            out.push(FieldError::invalid(
                format!("{p}.ip"),
                &ing.ip,
                "must be a valid IP address",
            ));
        }
        if let Some(mode) = &ing.ip_mode {
            if ing.ip.is_empty() {
                out.push(FieldError::forbidden(
                    format!("{p}.ipMode"),
                    "may not be set when `ip` is empty",
                ));
            } else if !IP_MODES.contains(&mode.as_str()) {
                out.push(FieldError::not_supported(
                    format!("{p}.ipMode"),
                    mode,
                    IP_MODES,
                ));
            }
        }
    }
    if lb && let Err(why) = lb_pool::requested(svc) {
        let field = lb_pool::request_field(svc);
        let value = if field == "spec.loadBalancerIP" {
            spec.load_balancer_ip.clone()
        } else {
            svc.metadata
                .as_ref()
                .and_then(|m| m.annotations.get(lb_pool::REQUEST_ANNOTATION))
                .cloned()
                .unwrap_or_default()
        };
        // spec.loadBalancerIP's own syntax error is reported above.
        if field != "spec.loadBalancerIP" {
            out.push(FieldError::invalid(field, value, why));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::Resource;
    use skiff_api::api::{ServicePort, ServiceSpec};

    fn svc(ports: Vec<ServicePort>) -> Service {
        let mut s = Service {
            spec: Some(ServiceSpec {
                ports,
                ..Default::default()
            }),
            ..Default::default()
        };
        Strategy::default(&mut s);
        s
    }

    fn port(name: &str, port: i32) -> ServicePort {
        ServicePort {
            name: name.into(),
            port,
            ..Default::default()
        }
    }

    #[test]
    fn defaults() {
        let s = svc(vec![port("", 80)]);
        let spec = s.spec.as_ref().expect("spec");
        assert_eq!(spec.r#type, "ClusterIP");
        assert_eq!(spec.session_affinity, "None");
        assert_eq!(spec.ports[0].protocol, "TCP");
        assert_eq!(spec.ports[0].target_port, "80");
        assert!(s.validate().is_empty(), "{:?}", s.validate());
    }

    #[test]
    fn port_rules() {
        let mut s = svc(vec![port("a", 80), port("a", 0), port("", 81)]);
        if let Some(spec) = s.spec.as_mut() {
            spec.ports[0].node_port = 80;
        }
        let errs: Vec<String> = s.validate().iter().map(ToString::to_string).collect();
        for want in [
            "spec.ports[0].nodePort: Forbidden",
            "spec.ports[1].name: Duplicate value",
            "spec.ports[1].port: Invalid value: 0",
            "spec.ports[2].name: Required value",
        ] {
            assert!(
                errs.iter().any(|e| e.starts_with(want)),
                "{want} not in {errs:#?}"
            );
        }
        let mut np = svc(vec![port("", 80)]);
        if let Some(spec) = np.spec.as_mut() {
            spec.r#type = "NodePort".into();
            spec.ports[0].node_port = 80;
        }
        assert!(np.validate()[0].to_string().contains("30000-32767"));
    }

    #[test]
    fn cluster_ip_is_kept_and_immutable() {
        let mut old = svc(vec![port("", 80)]);
        if let Some(spec) = old.spec.as_mut() {
            spec.cluster_ip = "10.96.0.10".into();
        }
        let mut new = svc(vec![port("", 80)]);
        new.prepare_update(&old);
        assert!(new.validate_update(&old).is_empty());
        if let Some(spec) = new.spec.as_mut() {
            spec.cluster_ip = "10.96.0.11".into();
        }
        let errs = new.validate_update(&old);
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0]
                .to_string()
                .starts_with("spec.clusterIP: Invalid value: \"10.96.0.11\": field is immutable"),
            "{}",
            errs[0]
        );
        // The allocator's write: from empty to an address.
        let empty = svc(vec![port("", 80)]);
        assert!(old.validate_update(&empty).is_empty());
        // Headless stays headless.
        let mut headless = svc(vec![port("", 80)]);
        if let Some(spec) = headless.spec.as_mut() {
            spec.cluster_ip = "None".into();
        }
        assert_eq!(old.validate_update(&headless).len(), 1);
    }

    #[test]
    fn load_balancer_fields() {
        let mut lb = svc(vec![port("", 80)]);
        if let Some(spec) = lb.spec.as_mut() {
            spec.r#type = "LoadBalancer".into();
            spec.load_balancer_ip = "192.168.100.240".into();
            spec.ports[0].node_port = 30080;
        }
        Strategy::default(&mut lb);
        let spec = lb.spec.as_ref().expect("spec");
        assert_eq!(spec.allocate_load_balancer_node_ports, Some(true));
        assert_eq!(spec.external_traffic_policy, "Cluster");
        assert!(lb.validate().is_empty(), "{:?}", lb.validate());

        let mut bad = lb.clone();
        if let Some(spec) = bad.spec.as_mut() {
            spec.load_balancer_ip = "192.168.100.x".into();
            spec.cluster_ip = "None".into();
            spec.load_balancer_class = Some("not a class".into());
        }
        let errs: Vec<String> = bad.validate().iter().map(ToString::to_string).collect();
        for want in [
            "spec.clusterIP: Invalid value: \"None\": may not be set to 'None' for LoadBalancer \
             services",
            "spec.loadBalancerIP: Invalid value: \"192.168.100.x\": must be a valid IP address",
            "spec.loadBalancerClass: Invalid value: \"not a class\"",
        ] {
            assert!(
                errs.iter().any(|e| e.starts_with(want)),
                "{want} not in {errs:#?}"
            );
        }

        let mut annotated = lb.clone();
        annotated.metadata_mut().annotations.insert(
            lb_pool::REQUEST_ANNOTATION.into(),
            "192.168.100.240,192.168.100.241".into(),
        );
        let errs: Vec<String> = annotated
            .validate()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errs,
            ["metadata.annotations[skiff.io/lb-ips]: Invalid value: \
              \"192.168.100.240,192.168.100.241\": at most one address per IP family \
              (192.168.100.241 is a second IPv4 address)"]
        );

        let mut cluster_ip = svc(vec![port("", 80)]);
        if let Some(spec) = cluster_ip.spec.as_mut() {
            spec.load_balancer_ip = "192.168.100.240".into();
            spec.load_balancer_class = Some(lb_pool::CLASS.into());
        }
        let errs: Vec<String> = cluster_ip
            .validate()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errs,
            [
                "spec.loadBalancerIP: Forbidden: may only be used when `type` is 'LoadBalancer'",
                "spec.loadBalancerClass: Forbidden: may only be used when `type` is \
                 'LoadBalancer'"
            ]
        );

        let mut status = lb.clone();
        status.status = Some(skiff_api::api::ServiceStatus {
            load_balancer: Some(skiff_api::api::LoadBalancerStatus {
                ingress: vec![
                    skiff_api::api::LoadBalancerIngress {
                        ip: "192.168.100.240".into(),
                        ip_mode: Some("VIP".into()),
                        ..Default::default()
                    },
                    skiff_api::api::LoadBalancerIngress {
                        ip: "not-an-ip".into(),
                        ip_mode: Some("Tunnel".into()),
                        ..Default::default()
                    },
                ],
            }),
            ..Default::default()
        });
        let errs: Vec<String> = status.validate().iter().map(ToString::to_string).collect();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].starts_with(
            "status.loadBalancer.ingress[1].ip: Invalid value: \"not-an-ip\": must be a valid IP"
        ));
        assert!(
            errs[1].starts_with(
                "status.loadBalancer.ingress[1].ipMode: Unsupported value: \"Tunnel\""
            )
        );

        // A change of type alone drops what only a LoadBalancer has (not loadBalancerIP).
        let mut to_cluster_ip = lb.clone();
        if let Some(spec) = to_cluster_ip.spec.as_mut() {
            spec.r#type = "ClusterIP".into();
            spec.load_balancer_ip.clear();
        }
        to_cluster_ip.prepare_update(&lb);
        Strategy::default(&mut to_cluster_ip);
        let spec = to_cluster_ip.spec.as_ref().expect("spec");
        assert_eq!(spec.allocate_load_balancer_node_ports, None);
        assert_eq!(spec.ports[0].node_port, 0);
        assert!(
            to_cluster_ip.validate().is_empty(),
            "{:?}",
            to_cluster_ip.validate()
        );

        let mut classed = lb.clone();
        if let Some(spec) = classed.spec.as_mut() {
            spec.load_balancer_class = Some("example.com/lb".into());
        }
        assert_eq!(
            classed.validate_update(&lb)[0].to_string(),
            "spec.loadBalancerClass: Invalid value: \"example.com/lb\": may not change once set"
        );
    }

    #[test]
    fn node_ports_are_kept_when_an_update_leaves_them_empty() {
        let mut old = svc(vec![port("a", 80), port("b", 81)]);
        if let Some(spec) = old.spec.as_mut() {
            spec.r#type = "NodePort".into();
            spec.ports[0].node_port = 30080;
            spec.ports[1].node_port = 30081;
        }
        let mut new = svc(vec![port("a", 80), port("b", 81)]);
        if let Some(spec) = new.spec.as_mut() {
            spec.r#type = "NodePort".into();
            spec.ports[1].node_port = 30099;
        }
        new.prepare_update(&old);
        let ports: Vec<i32> = new
            .spec
            .as_ref()
            .map(|s| s.ports.iter().map(|p| p.node_port).collect())
            .unwrap_or_default();
        assert_eq!(ports, [30080, 30099]);
    }
}
