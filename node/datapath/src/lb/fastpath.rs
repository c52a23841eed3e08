//! The pod networking fast path's maps: the local pods' endpoints (`POD_ENDPOINTS`) and
//! the per-CPU counters (`FP_COUNTERS`) the tc program keeps.

use std::net::{IpAddr, Ipv4Addr};

use skiff_common::podnet::{FP_COUNTERS_MAP, POD_ENDPOINTS_MAP, PodEndpointKey};

use super::bpf::{entries, remove};
use super::pod::P;
use super::{FastPathCounters, PodEndpoint, ServiceLb};
use crate::BpfError;

impl ServiceLb {
    /// Makes `ip` a local pod for the fast path: packets to it are delivered into its
    /// namespace through its host veth `ep.ifindex` (IPv4 only: the program handles no IPv6).
    pub fn set_pod_endpoint(&mut self, ip: Ipv4Addr, ep: PodEndpoint) -> Result<(), BpfError> {
        self.maps
            .pod_endpoints
            .insert(P(pod_key(ip)), P(ep), 0)
            .map_err(BpfError::map(POD_ENDPOINTS_MAP))
    }

    /// Forgets the local pod `ip` (missing is not an error).
    pub fn remove_pod_endpoint(&mut self, ip: Ipv4Addr) -> Result<(), BpfError> {
        remove(
            &mut self.maps.pod_endpoints,
            POD_ENDPOINTS_MAP,
            &P(pod_key(ip)),
        )
    }

    /// Every local pod of the fast path, by address.
    pub fn pod_endpoints(&self) -> Result<Vec<(IpAddr, PodEndpoint)>, BpfError> {
        Ok(entries(&self.maps.pod_endpoints, POD_ENDPOINTS_MAP)?
            .into_iter()
            .filter_map(|(k, v)| {
                let k = k.0;
                let ip: IpAddr = match k.family {
                    skiff_common::lb::AF_INET => {
                        Ipv4Addr::new(k.addr[0], k.addr[1], k.addr[2], k.addr[3]).into()
                    }
                    skiff_common::lb::AF_INET6 => std::net::Ipv6Addr::from(k.addr).into(),
                    _ => return None,
                };
                Some((ip, v.0))
            })
            .collect())
    }

    /// The fast path's counters, summed over CPUs.
    pub fn fast_path_counters(&self) -> Result<FastPathCounters, BpfError> {
        let per_cpu = self
            .maps
            .fp_counters
            .get(&0, 0)
            .map_err(BpfError::map(FP_COUNTERS_MAP))?;
        Ok(FastPathCounters::sum(per_cpu.iter().map(|c| &c.0)))
    }
}

/// The fast path's key of pod address `ip`.
fn pod_key(ip: Ipv4Addr) -> PodEndpointKey {
    PodEndpointKey::v4(u32::from_ne_bytes(ip.octets()))
}
