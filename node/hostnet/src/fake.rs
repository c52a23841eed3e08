//! An in-memory [`PodNetwork`] for tests that run without root: addresses are handed out
//! from a [`PodCidr`] in order (lowest free first, as the real IPAM), nothing touches the
//! kernel, and every call can be appended to a shared journal so a test can check the order
//! of operations across fakes (runtime, network, data path).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::{NetError, PodAttachment, PodCidr, PodNetwork, host_veth_name};

/// A shared, ordered record of calls made on several fakes.
pub type Journal = Arc<Mutex<Vec<String>>>;

/// The in-memory pod network.
#[derive(Debug)]
pub struct FakeNetwork {
    cidr: PodCidr,
    /// Pod address → uid.
    allocations: Mutex<BTreeMap<Ipv4Addr, String>>,
    journal: Option<Journal>,
    /// Makes the next `attach_pod` calls fail with this message (tests of retries).
    fail_attach: Mutex<Option<String>>,
}

impl FakeNetwork {
    /// A network handing out addresses of `cidr` (e.g. `10.244.1.0/24`).
    pub fn new(cidr: &str) -> Result<Self, NetError> {
        Ok(FakeNetwork {
            cidr: PodCidr::parse(cidr)?,
            allocations: Mutex::new(BTreeMap::new()),
            journal: None,
            fail_attach: Mutex::new(None),
        })
    }

    /// Also appends `net: <call>` lines to `journal`.
    pub fn with_journal(mut self, journal: Journal) -> Self {
        self.journal = Some(journal);
        self
    }

    /// `attach_pod` fails with `message` until called with `None`.
    pub fn fail_attach(&self, message: Option<&str>) {
        *self.fail_attach.lock().unwrap_or_else(|e| e.into_inner()) = message.map(String::from);
    }

    fn note(&self, line: String) {
        if let Some(j) = &self.journal {
            j.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }

    fn allocations_mut(&self) -> std::sync::MutexGuard<'_, BTreeMap<Ipv4Addr, String>> {
        self.allocations.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A made-up MAC that depends on `ip` and `side`, so entries are distinguishable.
fn mac(ip: Ipv4Addr, side: u8) -> [u8; 6] {
    let o = ip.octets();
    [0x02, side, o[0], o[1], o[2], o[3]]
}

#[async_trait::async_trait]
impl PodNetwork for FakeNetwork {
    async fn attach_pod(
        &self,
        pod_uid: &str,
        _pod_netns: &Path,
    ) -> Result<PodAttachment, NetError> {
        if let Some(msg) = self
            .fail_attach
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            self.note(format!("net: attach {pod_uid} failed"));
            return Err(NetError::Fake(msg));
        }
        let ip = {
            let mut allocs = self.allocations_mut();
            match allocs.iter().find(|(_, u)| *u == pod_uid) {
                Some((ip, _)) => *ip,
                None => {
                    let ip = self
                        .cidr
                        .pod_range_v4()
                        .map(Ipv4Addr::from)
                        .find(|ip| !allocs.contains_key(ip))
                        .ok_or_else(|| NetError::Fake(format!("{} is full", self.cidr)))?;
                    allocs.insert(ip, pod_uid.to_string());
                    ip
                }
            }
        };
        self.note(format!("net: attach {pod_uid} {ip}"));
        let index = u32::from(ip) & 0xffff;
        Ok(PodAttachment {
            pod_ip: IpAddr::V4(ip),
            host_veth: host_veth_name(pod_uid),
            host_ifindex: 1000 + index,
            pod_ifindex: 2,
            host_mac: Some(mac(ip, 1)),
            pod_mac: Some(mac(ip, 2)),
        })
    }

    async fn detach_pod(&self, pod_uid: &str) -> Result<(), NetError> {
        self.note(format!("net: detach {pod_uid}"));
        self.allocations_mut().retain(|_, u| u != pod_uid);
        Ok(())
    }

    fn pod_ip(&self, pod_uid: &str) -> Option<IpAddr> {
        self.allocations_mut()
            .iter()
            .find(|(_, u)| *u == pod_uid)
            .map(|(ip, _)| IpAddr::V4(*ip))
    }

    fn allocations(&self) -> Vec<(IpAddr, String)> {
        self.allocations_mut()
            .iter()
            .map(|(ip, u)| (IpAddr::V4(*ip), u.clone()))
            .collect()
    }

    fn netns_path(&self) -> Option<&Path> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hands_out_the_lowest_free_address_and_takes_it_back() {
        let net = FakeNetwork::new("10.244.1.0/24").unwrap();
        let a = net.attach_pod("a", Path::new("/x")).await.unwrap();
        let b = net.attach_pod("b", Path::new("/x")).await.unwrap();
        assert_eq!(a.pod_ip.to_string(), "10.244.1.2");
        assert_eq!(b.pod_ip.to_string(), "10.244.1.3");
        // Idempotent.
        assert_eq!(net.attach_pod("a", Path::new("/x")).await.unwrap(), a);
        net.detach_pod("a").await.unwrap();
        assert_eq!(net.pod_ip("a"), None);
        let c = net.attach_pod("c", Path::new("/x")).await.unwrap();
        assert_eq!(c.pod_ip.to_string(), "10.244.1.2");
        net.fail_attach(Some("no veth"));
        assert!(net.attach_pod("d", Path::new("/x")).await.is_err());
    }
}
