//! LoadBalancerIPPools (`skiff.io/v1`, cluster-scoped): the addresses LoadBalancer Services
//! get from the controller manager's lbipam controller.
//!
//! What one pool can be checked for alone is checked here: at least one block, each a
//! canonical CIDR or a `start`-`stop` range of one family with `start` not after `stop`
//! (`skiff_api::lb_pool::block`, the parser the controller uses) without unspecified,
//! loopback, link-local, multicast or broadcast addresses, no two blocks of the pool
//! overlapping, and a well-formed `serviceSelector`. What needs the rest of the cluster (no
//! overlap with other pools, the service CIDR or the cluster CIDR) is the admission plug-in
//! `LoadBalancerIPPools`' ([`crate::admission`]).

use skiff_api::api::LoadBalancerIpPool;
use skiff_api::lb_pool::{self, BlockError};

use super::Strategy;
use crate::error::FieldError;
use crate::validation as v;

impl Strategy for LoadBalancerIpPool {
    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        if spec.blocks.is_empty() {
            out.push(FieldError::required(
                "spec.blocks",
                "at least one cidr or start-stop range",
            ));
        }
        let mut seen: Vec<(usize, lb_pool::AddrRange)> = Vec::new();
        for (i, b) in spec.blocks.iter().enumerate() {
            let p = format!("spec.blocks[{i}]");
            match lb_pool::block(b) {
                Ok(block) => {
                    if let Some((j, _)) = seen.iter().find(|(_, r)| r.overlaps(&block.full)) {
                        out.push(FieldError::invalid(
                            p,
                            block.full.to_string(),
                            format!("overlaps spec.blocks[{j}]"),
                        ));
                    }
                    seen.push((i, block.full));
                }
                Err(BlockError::Required(field)) => {
                    let detail = if field == "cidr" {
                        "either cidr, or start and stop"
                    } else {
                        ""
                    };
                    out.push(FieldError::required(format!("{p}.{field}"), detail));
                }
                Err(BlockError::Invalid {
                    field,
                    value,
                    reason,
                }) => out.push(FieldError::invalid(format!("{p}.{field}"), value, reason)),
            }
        }
        if let Some(sel) = &spec.service_selector {
            v::check_label_selector(&mut out, "spec.serviceSelector", sel);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        LabelSelector, LabelSelectorRequirement, LoadBalancerIpPoolBlock, LoadBalancerIpPoolSpec,
    };

    fn pool(blocks: &[(&str, &str, &str)]) -> LoadBalancerIpPool {
        LoadBalancerIpPool {
            spec: Some(LoadBalancerIpPoolSpec {
                blocks: blocks
                    .iter()
                    .map(|(cidr, start, stop)| LoadBalancerIpPoolBlock {
                        cidr: cidr.to_string(),
                        start: start.to_string(),
                        stop: stop.to_string(),
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn shown(p: &LoadBalancerIpPool) -> Vec<String> {
        p.validate().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn valid_pools() {
        let p = pool(&[
            ("192.168.100.200/29", "", ""),
            ("", "192.168.100.240", "192.168.100.250"),
            ("fd00:100::/120", "", ""),
        ]);
        assert!(shown(&p).is_empty(), "{:?}", shown(&p));
    }

    #[test]
    fn each_bad_block_is_named_with_kubernetes_wording() {
        let p = pool(&[
            ("192.168.100.201/29", "", ""),
            ("", "10.0.0.9", "10.0.0.1"),
            ("", "10.0.0.1", "fd00::1"),
            ("", "", ""),
            ("10.1.0.0/24", "", ""),
            ("", "10.1.0.200", "10.1.1.3"),
        ]);
        assert_eq!(
            shown(&p),
            [
                "spec.blocks[0].cidr: Invalid value: \"192.168.100.201/29\": must be a valid \
                 CIDR: host bits are set (the network is 192.168.100.200/29)",
                "spec.blocks[1].stop: Invalid value: \"10.0.0.1\": must not be before start \
                 (10.0.0.9)",
                "spec.blocks[2].stop: Invalid value: \"fd00::1\": must be of the same IP family \
                 as start (10.0.0.1 is IPv4)",
                "spec.blocks[3].cidr: Required value: either cidr, or start and stop",
                "spec.blocks[5]: Invalid value: \"10.1.0.200-10.1.1.3\": overlaps spec.blocks[4]",
            ]
        );
        assert_eq!(
            shown(&pool(&[])),
            ["spec.blocks: Required value: at least one cidr or start-stop range"]
        );
    }

    #[test]
    fn service_selectors_are_checked() {
        let mut p = pool(&[("10.1.0.0/24", "", "")]);
        if let Some(s) = p.spec.as_mut() {
            s.service_selector = Some(LabelSelector {
                match_expressions: vec![LabelSelectorRequirement {
                    key: "app".into(),
                    operator: "In".into(),
                    values: vec![],
                }],
                ..Default::default()
            });
        }
        assert_eq!(
            shown(&p),
            [
                "spec.serviceSelector.matchExpressions[0].values: Required value: must be \
                 specified when `operator` is 'In' or 'NotIn'"
            ]
        );
    }
}
