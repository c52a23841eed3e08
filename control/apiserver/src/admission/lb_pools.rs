//! The `LoadBalancerIPPools` plug-in: what a LoadBalancerIPPool or a LoadBalancer Service
//! must agree on with the rest of the cluster (the kinds' own validation checks each object
//! alone, `crate::strategy`).
//!
//! - A pool's blocks overlap no other pool's, nor the service CIDR
//!   (`--service-cluster-ip-range`) nor the cluster (pod) CIDR (`--cluster-cidr`): an address
//!   handed out twice, or one the cluster already routes to a Service or a pod, would take
//!   their traffic. Checked when a pool is created or its blocks change.
//! - The addresses a LoadBalancer Service of Skiff's class asks for (`spec.loadBalancerIP`
//!   or the `skiff.io/lb-ips` annotation) lie in an enabled pool that selects the Service, so
//!   no Service can claim an address outside the pools (a node's, a gateway's) and have
//!   the nodes answer ARP for it. Checked on create, and on an update that changes the
//!   addresses asked for, the labels, the type or the class.
//!
//! - The addresses written into a Skiff-class Service's `status.loadBalancer.ingress` lie in
//!   an enabled pool that selects it too: every node serves and one announces each such
//!   address, so whoever may write `services/status` could otherwise make the cluster take
//!   any address's traffic, a node's or one outside the cluster (CVE-2020-8554's class).
//!
//! Two pools created at the same moment can both pass; the lbipam controller then marks the
//! newer one conflicting (`skiff.io/PoolConflict`) and hands out none of its addresses.

use std::any::Any;
use std::collections::BTreeMap;
use std::net::IpAddr;

use async_trait::async_trait;
use skiff_api::Resource;
use skiff_api::api::{Endpoints, LoadBalancerIpPool, Node, Service};
use skiff_api::lb_pool::{self, AddrRange};
use skiff_cidr::{Cidr, Ipv4Cidr};

use super::{Operation, Plugin, Request};
use crate::error::{ApiError, FieldError};

/// See the module documentation.
pub(super) struct LoadBalancerIpPools {
    /// `None` (in-process test servers): not checked.
    pub service_cluster_ip_range: Option<Ipv4Cidr>,
    /// `None` (in-process test servers): not checked.
    pub cluster_cidr: Option<Ipv4Cidr>,
}

#[async_trait]
impl Plugin for LoadBalancerIpPools {
    fn name(&self) -> &'static str {
        "LoadBalancerIPPools"
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        if req.operation == Operation::Delete {
            return Ok(());
        }
        if req.subresource == "status" {
            return match object.downcast_ref::<Service>() {
                Some(svc) if lb_pool::is_managed(svc) => {
                    let ingress = |s: &Service| -> Vec<String> {
                        s.status
                            .iter()
                            .flat_map(|st| st.load_balancer.iter())
                            .flat_map(|lb| lb.ingress.iter())
                            .map(|i| i.ip.clone())
                            .collect()
                    };
                    let now = ingress(svc);
                    if now.is_empty()
                        || req
                            .old_as::<Service>()
                            .is_some_and(|old| ingress(old) == now)
                    {
                        return Ok(());
                    }
                    let pools = req.list::<LoadBalancerIpPool>("").await?;
                    let reserved = reserved(req).await?;
                    refuse::<Service>(req, ingress_errors(svc, &now, &pools, &reserved))
                }
                _ => Ok(()),
            };
        }
        if !req.subresource.is_empty() {
            return Ok(());
        }
        if let Some(pool) = object.downcast_ref::<LoadBalancerIpPool>() {
            let blocks = |p: &LoadBalancerIpPool| p.spec.as_ref().map(|s| s.blocks.clone());
            if req
                .old_as::<LoadBalancerIpPool>()
                .is_some_and(|old| blocks(old) == blocks(pool))
            {
                return Ok(());
            }
            let others = req.list::<LoadBalancerIpPool>("").await?;
            let errors = self.pool_errors(pool, &others);
            return refuse::<LoadBalancerIpPool>(req, errors);
        }
        if let Some(svc) = object.downcast_ref::<Service>() {
            if !lb_pool::is_managed(svc) {
                return Ok(());
            }
            if req.old_as::<Service>().is_some_and(|old| {
                lb_pool::is_managed(old)
                    && lb_pool::requested(old) == lb_pool::requested(svc)
                    && old.metadata.as_ref().map(|m| &m.labels)
                        == svc.metadata.as_ref().map(|m| &m.labels)
            }) {
                return Ok(());
            }
            // An unreadable request is the kind's validation's to report.
            let Ok(requested) = lb_pool::requested(svc) else {
                return Ok(());
            };
            if requested.is_empty() {
                return Ok(());
            }
            let pools = req.list::<LoadBalancerIpPool>("").await?;
            let errors = request_errors(svc, &requested, &pools, &reserved(req).await?);
            return refuse::<Service>(req, errors);
        }
        Ok(())
    }
}

/// The nodes' and the API servers' addresses ([`lb_pool::reserved`]).
async fn reserved(req: &Request<'_>) -> Result<BTreeMap<IpAddr, String>, ApiError> {
    let nodes = req.list::<Node>("").await?;
    let endpoints = req.list::<Endpoints>("default").await?;
    let api = endpoints.iter().find(|e| e.name() == "kubernetes");
    Ok(lb_pool::reserved(&nodes.iter().collect::<Vec<_>>(), api))
}

fn refuse<T: Resource>(req: &Request<'_>, errors: Vec<FieldError>) -> Result<(), ApiError> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&T::INFO, req.name, errors))
    }
}

/// Where a block's errors are reported: `spec.blocks[i].cidr` with the CIDR, or
/// `spec.blocks[i]` with `start-stop`.
fn block_field(i: usize, b: &skiff_api::api::LoadBalancerIpPoolBlock) -> (String, String) {
    if b.cidr.is_empty() {
        (
            format!("spec.blocks[{i}]"),
            format!("{}-{}", b.start, b.stop),
        )
    } else {
        (format!("spec.blocks[{i}].cidr"), b.cidr.clone())
    }
}

impl LoadBalancerIpPools {
    /// Each block of `pool` that overlaps the service CIDR, the cluster CIDR or a block of
    /// another of `pools`.
    fn pool_errors(
        &self,
        pool: &LoadBalancerIpPool,
        pools: &[LoadBalancerIpPool],
    ) -> Vec<FieldError> {
        let cluster_ranges = [
            (self.service_cluster_ip_range, "the service CIDR"),
            (self.cluster_cidr, "the cluster (pod) CIDR"),
        ];
        let mut out = Vec::new();
        let blocks = pool.spec.iter().flat_map(|s| s.blocks.iter()).enumerate();
        for (i, b) in blocks {
            // An invalid block is the kind's validation's to report.
            let Ok(block) = lb_pool::block(b) else {
                continue;
            };
            let (field, value) = block_field(i, b);
            for (range, what) in cluster_ranges {
                if let Some(c) = range
                    && block.full.overlaps(&AddrRange::of_cidr(&Cidr::V4(c)))
                {
                    out.push(FieldError::invalid(
                        &field,
                        &value,
                        format!("overlaps {what} {c}"),
                    ));
                }
            }
            let other = pools
                .iter()
                .filter(|p| p.name() != pool.name())
                .find_map(|p| {
                    p.spec.iter().flat_map(|s| &s.blocks).find_map(|ob| {
                        lb_pool::block(ob)
                            .ok()
                            .filter(|o| o.full.overlaps(&block.full))
                            .map(|o| (p.name().to_string(), o.full))
                    })
                });
            if let Some((name, range)) = other {
                out.push(FieldError::invalid(
                    &field,
                    &value,
                    format!("overlaps LoadBalancerIPPool {name:?} ({range})"),
                ));
            }
        }
        out
    }
}

/// Why each address in `svc`'s `status.loadBalancer.ingress` (`ips`, in order) is not one
/// it can have.
fn ingress_errors(
    svc: &Service,
    ips: &[String],
    pools: &[LoadBalancerIpPool],
    reserved: &BTreeMap<IpAddr, String>,
) -> Vec<FieldError> {
    let mut out = Vec::new();
    for (i, text) in ips.iter().enumerate() {
        let field = format!("status.loadBalancer.ingress[{i}].ip");
        let Ok(ip) = text.parse::<IpAddr>() else {
            // The kind's validation reports what is not an address.
            continue;
        };
        out.extend(
            request_errors(svc, &[ip], pools, reserved)
                .into_iter()
                .map(|e| FieldError::invalid(&field, text, e.detail)),
        );
    }
    out
}

/// Why each address `svc` asks for is not one it can have: in no pool's usable addresses,
/// or only in pools that are disabled or do not select it.
fn request_errors(
    svc: &Service,
    requested: &[IpAddr],
    pools: &[LoadBalancerIpPool],
    reserved: &BTreeMap<IpAddr, String>,
) -> Vec<FieldError> {
    let field = lb_pool::request_field(svc);
    let value = if field == "spec.loadBalancerIP" {
        svc.spec
            .as_ref()
            .map(|s| s.load_balancer_ip.clone())
            .unwrap_or_default()
    } else {
        svc.metadata
            .as_ref()
            .and_then(|m| m.annotations.get(lb_pool::REQUEST_ANNOTATION))
            .cloned()
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for ip in requested {
        if let Some(whose) = reserved.get(ip) {
            out.push(FieldError::invalid(
                &field,
                &value,
                format!("{ip} is {whose}: no Service may have it"),
            ));
            continue;
        }
        let holding: Vec<&LoadBalancerIpPool> = pools
            .iter()
            .filter(|p| lb_pool::blocks(p).iter().any(|b| b.usable.contains(*ip)))
            .collect();
        let usable = holding
            .iter()
            .any(|p| lb_pool::selects(p, svc) && !p.spec.as_ref().is_some_and(|s| s.disabled));
        if usable {
            continue;
        }
        let reason = match holding.first() {
            None => format!("{ip} is not in any LoadBalancerIPPool's addresses"),
            Some(p) if p.spec.as_ref().is_some_and(|s| s.disabled) => {
                format!(
                    "{ip} is in LoadBalancerIPPool {:?}, which is disabled",
                    p.name()
                )
            }
            Some(p) => format!(
                "{ip} is in LoadBalancerIPPool {:?}, whose serviceSelector does not select \
                 this Service",
                p.name()
            ),
        };
        out.push(FieldError::invalid(&field, &value, reason));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        LabelSelector, LoadBalancerIpPoolBlock, LoadBalancerIpPoolSpec, ObjectMeta, ServiceSpec,
    };

    fn pool(name: &str, cidr: &str) -> LoadBalancerIpPool {
        LoadBalancerIpPool {
            metadata: Some(ObjectMeta {
                name: name.into(),
                ..Default::default()
            }),
            spec: Some(LoadBalancerIpPoolSpec {
                blocks: vec![LoadBalancerIpPoolBlock {
                    cidr: cidr.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn plugin() -> LoadBalancerIpPools {
        LoadBalancerIpPools {
            service_cluster_ip_range: Some("10.96.0.0/16".parse().unwrap()),
            cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
        }
    }

    fn shown(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn pools_overlapping_the_cluster_or_each_other_are_named() {
        let others = [pool("lan", "192.168.100.240/29")];
        let p = plugin();
        assert!(
            p.pool_errors(&pool("new", "192.168.100.248/29"), &others)
                .is_empty()
        );
        // A pool may be written again with its own blocks.
        assert!(
            p.pool_errors(&pool("lan", "192.168.100.240/29"), &others)
                .is_empty()
        );
        assert_eq!(
            shown(&p.pool_errors(&pool("new", "192.168.100.244/30"), &others)),
            [
                "spec.blocks[0].cidr: Invalid value: \"192.168.100.244/30\": overlaps \
              LoadBalancerIPPool \"lan\" (192.168.100.240-192.168.100.247)"
            ]
        );
        assert_eq!(
            shown(&p.pool_errors(&pool("new", "10.0.0.0/8"), &others)),
            [
                "spec.blocks[0].cidr: Invalid value: \"10.0.0.0/8\": overlaps the service \
                 CIDR 10.96.0.0/16",
                "spec.blocks[0].cidr: Invalid value: \"10.0.0.0/8\": overlaps the cluster \
                 (pod) CIDR 10.244.0.0/16"
            ]
        );
        let mut range = pool("r", "");
        if let Some(s) = range.spec.as_mut() {
            s.blocks[0].start = "10.244.9.1".into();
            s.blocks[0].stop = "10.244.9.9".into();
        }
        assert_eq!(
            shown(&p.pool_errors(&range, &others)),
            [
                "spec.blocks[0]: Invalid value: \"10.244.9.1-10.244.9.9\": overlaps the cluster \
              (pod) CIDR 10.244.0.0/16"
            ]
        );
    }

    fn svc(lb_ip: &str, labels: &[(&str, &str)]) -> Service {
        Service {
            metadata: Some(ObjectMeta {
                name: "web".into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                r#type: "LoadBalancer".into(),
                load_balancer_ip: lb_ip.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// An address written into the status is held to the same pools: whoever may write
    /// `services/status` cannot make the nodes take 8.8.8.8's traffic.
    #[test]
    fn ingress_addresses_in_the_status_must_be_in_a_pool_that_serves_the_service() {
        let pools = [pool("lan", "192.168.100.240/29")];
        let s = svc("", &[]);
        let ips = ["192.168.100.241".to_string(), "8.8.8.8".to_string()];
        assert_eq!(
            shown(&ingress_errors(&s, &ips, &pools, &BTreeMap::new())),
            [
                "status.loadBalancer.ingress[1].ip: Invalid value: \"8.8.8.8\": 8.8.8.8 is not in \
              any LoadBalancerIPPool's addresses"
            ]
        );
        assert!(ingress_errors(&s, &ips[..1], &pools, &BTreeMap::new()).is_empty());
    }

    /// A pool over the whole LAN does not make a node's or an API server's address a
    /// Service's: asked for, or written into the status, it is refused with whose it is.
    #[test]
    fn nodes_and_api_servers_addresses_are_refused_whatever_the_pools() {
        let pools = [pool("lan", "192.168.100.0/24")];
        let reserved: BTreeMap<IpAddr, String> = [(
            "192.168.100.2".parse().unwrap(),
            "node node-2's address (InternalIP)".to_string(),
        )]
        .into();
        let s = svc("192.168.100.2", &[]);
        let req = lb_pool::requested(&s).unwrap();
        assert_eq!(
            shown(&request_errors(&s, &req, &pools, &reserved)),
            [
                "spec.loadBalancerIP: Invalid value: \"192.168.100.2\": 192.168.100.2 is node \
              node-2's address (InternalIP): no Service may have it"
            ]
        );
        let ips = ["192.168.100.2".to_string()];
        assert_eq!(
            shown(&ingress_errors(&svc("", &[]), &ips, &pools, &reserved)).len(),
            1
        );
        assert!(request_errors(&s, &req, &pools, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn requested_addresses_must_be_in_a_pool_that_serves_the_service() {
        let mut selective = pool("lan", "192.168.100.240/29");
        if let Some(s) = selective.spec.as_mut() {
            s.service_selector = Some(LabelSelector {
                match_labels: [("lb".to_string(), "lan".to_string())].into(),
                ..Default::default()
            });
        }
        let pools = [selective];
        let check = |s: &Service| {
            let req = lb_pool::requested(s).unwrap();
            shown(&request_errors(s, &req, &pools, &BTreeMap::new()))
        };
        assert!(check(&svc("192.168.100.241", &[("lb", "lan")])).is_empty());
        assert_eq!(
            check(&svc("192.168.100.241", &[])),
            [
                "spec.loadBalancerIP: Invalid value: \"192.168.100.241\": 192.168.100.241 is in \
              LoadBalancerIPPool \"lan\", whose serviceSelector does not select this Service"
            ]
        );
        // The network address of the CIDR is not one of its addresses.
        assert_eq!(
            check(&svc("192.168.100.240", &[("lb", "lan")])),
            [
                "spec.loadBalancerIP: Invalid value: \"192.168.100.240\": 192.168.100.240 is not \
              in any LoadBalancerIPPool's addresses"
            ]
        );
        let mut annotated = svc("", &[("lb", "lan")]);
        annotated.metadata_mut().annotations.insert(
            lb_pool::REQUEST_ANNOTATION.into(),
            "192.168.100.242,fd00::1".into(),
        );
        assert_eq!(
            check(&annotated),
            [
                "metadata.annotations[skiff.io/lb-ips]: Invalid value: \"192.168.100.242,fd00::1\": \
              fd00::1 is not in any LoadBalancerIPPool's addresses"
            ]
        );
        let mut disabled = pools[0].clone();
        if let Some(s) = disabled.spec.as_mut() {
            s.disabled = true;
        }
        let s = svc("192.168.100.241", &[("lb", "lan")]);
        let req = lb_pool::requested(&s).unwrap();
        assert!(
            shown(&request_errors(&s, &req, &[disabled], &BTreeMap::new()))[0]
                .ends_with("which is disabled")
        );
    }
}
