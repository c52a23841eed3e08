//! Cross-node pod routes: for every other Node with a `spec.podCIDR` and an `InternalIP`, a
//! route `<podCIDR> via <InternalIP>` in this node's network namespace, so pods reach pods on
//! other nodes by their own addresses (no NAT, no encapsulation: the nodes share an L2
//! segment). A [`Reconciler`] on the shared controller runtime, keyed by Node: level-triggered,
//! a Node that goes (or loses its CIDR or address) loses its route.
//!
//! Direct routing was chosen over VXLAN: no encapsulation and no MTU loss, at the price of
//! needing the nodes on one segment.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skiff_api::api::Node;
use skiff_client::controller::{
    Action, CancelToken, Controller, Informer, Informers, ObjectKey, Reconciler,
};
use tracing::{info, warn};

use skiff_hostnet::{NetError, NodeNetwork};

/// What a route needs from another Node: its pod CIDR and its address on the shared segment.
pub fn peer_of(node: &Node) -> Option<(String, Ipv4Addr)> {
    let cidr = node
        .spec
        .as_ref()
        .map(|s| s.pod_cidr.clone())
        .filter(|c| !c.is_empty())?;
    let ip = node
        .status
        .as_ref()?
        .addresses
        .iter()
        .find(|a| a.r#type == "InternalIP")
        .and_then(|a| a.address.parse::<Ipv4Addr>().ok())?;
    Some((cidr, ip))
}

/// Keeps this node's routes to the other nodes' pod CIDRs.
#[derive(Debug)]
pub struct PeerRoutes {
    own_name: String,
    net: Arc<NodeNetwork>,
    nodes: Informer<Node>,
    /// Node name → the route made for it (pod CIDR, gateway).
    installed: Mutex<HashMap<String, (String, Ipv4Addr)>>,
}

impl PeerRoutes {
    /// Runs until `stop` is cancelled.
    pub async fn run(
        own_name: &str,
        net: Arc<NodeNetwork>,
        informers: &Informers,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(PeerRoutes {
            own_name: own_name.to_string(),
            net,
            nodes: informers.get::<Node>(),
            installed: Mutex::new(HashMap::new()),
        });
        Controller::<Node>::new(informers)
            .named("peer-routes")
            .graceful_shutdown_on(stop)
            .run(reconciler, 1)
            .await;
    }

    fn installed(&self, name: &str) -> Option<(String, Ipv4Addr)> {
        self.installed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    fn remember(&self, name: &str, route: Option<(String, Ipv4Addr)>) {
        let mut map = self.installed.lock().unwrap_or_else(|e| e.into_inner());
        match route {
            Some(r) => map.insert(name.to_string(), r),
            None => map.remove(name),
        };
    }
}

impl Reconciler for PeerRoutes {
    type Error = NetError;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, NetError> {
        if key.name == self.own_name {
            return Ok(Action::Done);
        }
        let want = self.nodes.get(key).as_deref().and_then(peer_of);
        let have = self.installed(&key.name);
        if want == have {
            return Ok(Action::Done);
        }
        if let Some((cidr, _)) = &have
            && want.as_ref().is_none_or(|(c, _)| c != cidr)
        {
            self.net.remove_peer_route(cidr).await?;
            info!(node = %key.name, %cidr, "removed the route to a node's pods");
            self.remember(&key.name, None);
        }
        if let Some((cidr, via)) = &want {
            if let Err(e) = self.net.set_peer_route(cidr, *via).await {
                warn!(node = %key.name, %cidr, %via, error = %e, "cannot route to a node's pods (is it on this node's segment?)");
                return Err(e);
            }
            info!(node = %key.name, %cidr, %via, "routing a node's pods");
            self.remember(&key.name, want.clone());
        }
        // Look again now and then: a route deleted behind the agent's back comes back.
        Ok(Action::RequeueAfter(Duration::from_secs(60)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{NodeAddress, NodeSpec, NodeStatus};

    fn node(cidr: &str, addresses: &[(&str, &str)]) -> Node {
        Node {
            spec: Some(NodeSpec {
                pod_cidr: cidr.into(),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: addresses
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        r#type: (*t).into(),
                        address: (*a).into(),
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_peer_needs_a_cidr_and_an_internal_ipv4() {
        let ip: Ipv4Addr = "192.168.77.2".parse().unwrap();
        assert_eq!(
            peer_of(&node(
                "10.244.2.0/24",
                &[("Hostname", "n2"), ("InternalIP", "192.168.77.2")]
            )),
            Some(("10.244.2.0/24".to_string(), ip))
        );
        assert_eq!(peer_of(&node("", &[("InternalIP", "192.168.77.2")])), None);
        assert_eq!(peer_of(&node("10.244.2.0/24", &[("Hostname", "n2")])), None);
        assert_eq!(
            peer_of(&node("10.244.2.0/24", &[("InternalIP", "fd00::2")])),
            None
        );
    }
}
