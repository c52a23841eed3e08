//! Node IPAM: gives every Node without one a `spec.podCIDR` (and `podCIDRs`), a block of the
//! cluster CIDR, as Kubernetes' node-ipam-controller does (range allocator), on the shared
//! [`Allocator`].
//!
//! A Node that already has pod CIDRs inside the cluster CIDR (an agent started with
//! `--pod-cidr` registers its Node with one) keeps them and they count as used, block by
//! block. Blocks are handed out in rolling order and freed when their Node is deleted. When
//! every block is used the Node gets a Warning `CIDRNotAvailable` and is tried again once a
//! block is freed.

use std::collections::BTreeSet;

use skiff_api::api::Node;
use skiff_client::controller::{CancelToken, EventRecorder, EventType, Informers, ObjectKey};

use crate::allocator::{Allocation, Allocator, Claim, Ledger, Policy};
use crate::ranges::{CidrBlocks, Ipv4Cidr, RangeAllocator};

const BLOCKS: usize = 0;

/// The pod CIDRs handed to Nodes: blocks of the cluster CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCidrs(pub CidrBlocks);

impl Policy for PodCidrs {
    type Object = Node;

    const NAME: &'static str = "nodeipam";

    fn pools(&self) -> Vec<RangeAllocator> {
        vec![RangeAllocator::new(self.0.count())]
    }

    fn claims(&self, node: &Node) -> BTreeSet<Claim> {
        let Some(spec) = node.spec.as_ref() else {
            return BTreeSet::new();
        };
        std::iter::once(&spec.pod_cidr)
            .chain(&spec.pod_cidrs)
            .filter_map(|c| c.parse::<Ipv4Cidr>().ok())
            .filter_map(|c| self.0.overlapping(c))
            .flatten()
            .map(|b| (BLOCKS, b))
            .collect()
    }

    fn plan(&self, ledger: &mut Ledger<Node>, key: &ObjectKey, node: &Node) -> Allocation<Node> {
        let mut plan = Allocation::default();
        let has_cidr = node
            .spec
            .as_ref()
            .is_some_and(|s| !s.pod_cidr.is_empty() || !s.pod_cidrs.is_empty());
        if has_cidr {
            return plan;
        }
        match ledger.allocate(key, BLOCKS).and_then(|b| self.0.block(b)) {
            Some(block) => {
                let mut updated = node.clone();
                let spec = updated.spec.get_or_insert_with(Default::default);
                spec.pod_cidr = block.to_string();
                spec.pod_cidrs = vec![block.to_string()];
                plan.update = Some(updated);
            }
            None => {
                ledger.abort(key);
                ledger.park(key);
                plan.events.push((
                    EventType::Warning,
                    "CIDRNotAvailable",
                    format!(
                        "Node {} status is now: CIDRNotAvailable (no free /{} block in the \
                         cluster CIDR {})",
                        key.name,
                        self.0.mask(),
                        self.0.cidr()
                    ),
                ));
            }
        }
        plan
    }
}

/// Runs node IPAM with `workers` workers until `stop` is cancelled.
pub async fn run(
    informers: &Informers,
    recorder: EventRecorder,
    blocks: CidrBlocks,
    workers: usize,
    stop: CancelToken,
) {
    Allocator::run(informers, recorder, PodCidrs(blocks), workers, stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{NodeSpec, ObjectMeta};
    use skiff_client::controller::Change;
    use std::sync::Arc;

    fn node(name: &str, cidr: &str) -> Node {
        Node {
            metadata: Some(ObjectMeta {
                name: name.into(),
                resource_version: "1".into(),
                ..Default::default()
            }),
            spec: Some(NodeSpec {
                pod_cidr: cidr.into(),
                pod_cidrs: (!cidr.is_empty())
                    .then(|| cidr.to_string())
                    .into_iter()
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn plan(l: &mut Ledger<Node>, p: PodCidrs, n: &Node) -> Allocation<Node> {
        l.apply(&Change::Added(Arc::new(n.clone())), &mut BTreeSet::new());
        p.plan(l, &ObjectKey::of(n), n)
    }

    #[test]
    fn hands_out_free_blocks_around_preset_ones() {
        let p = PodCidrs(CidrBlocks::new("10.244.0.0/22".parse().unwrap(), 24).unwrap());
        let mut l = Ledger::new(p.pools(), move |n: &Node| p.claims(n));
        assert!(
            plan(&mut l, p, &node("preset", "10.244.0.0/24"))
                .update
                .is_none()
        );
        // Outside the cluster CIDR: kept, not tracked.
        assert!(
            plan(&mut l, p, &node("outside", "10.0.0.0/24"))
                .update
                .is_none()
        );
        let cidr = |pl: Allocation<Node>| {
            pl.update
                .and_then(|n| n.spec)
                .map(|s| (s.pod_cidr, s.pod_cidrs))
        };
        assert_eq!(
            cidr(plan(&mut l, p, &node("a", ""))),
            Some(("10.244.1.0/24".into(), vec!["10.244.1.0/24".into()]))
        );
        // A /23 preset in the middle takes two blocks.
        assert!(
            plan(&mut l, p, &node("wide", "10.244.2.0/23"))
                .update
                .is_none()
        );
        let full = plan(&mut l, p, &node("b", ""));
        assert!(full.update.is_none());
        assert_eq!(full.events[0].1, "CIDRNotAvailable");
        assert!(
            full.events[0]
                .2
                .contains("no free /24 block in the cluster CIDR 10.244.0.0/22")
        );
        // Deleting a Node frees its blocks; the parked one is queued again.
        let mut requeue = BTreeSet::new();
        l.apply(
            &Change::Deleted(Arc::new(node("wide", "10.244.2.0/23"))),
            &mut requeue,
        );
        assert_eq!(requeue, [ObjectKey::cluster("b")].into());
        assert_eq!(
            cidr(plan(&mut l, p, &node("b", ""))).map(|c| c.0),
            Some("10.244.2.0/24".into())
        );
    }
}
