//! What the Service load balancer reports over the agent's HTTP API (`GET /bpf/services`,
//! `/bpf/backends`, `/bpf/pods`, `/bpf/conntrack`) and to `/metrics`: the data path's dumps
//! turned into the API's types ([`skiff_client::node_api`], the one definition the agent and
//! its clients share), with the Service that owns each frontend.

use std::net::Ipv4Addr;

use skiff_client::node_api::{
    BpfBackend, BpfBackends, BpfConntrack, BpfConntrackEntry, BpfFastPath, BpfMapPressure, BpfPod,
    BpfProgramming, BpfService, BpfServices,
};
use skiff_common::lb::{IPPROTO_TCP, IPPROTO_UDP, NP_CT_REPLY, NpCtEntry, NpCtKey};
use skiff_datapath::BpfError;
use skiff_datapath::lb::{BackendDump, FastPathCounters, Frontend, Protocol, ServiceDump};

use super::{Owner, Proxy};

impl Proxy {
    /// The programmed services and map pressure, for `GET /bpf/services`.
    pub fn services_report(&self, node: &str) -> Result<BpfServices, BpfError> {
        let inner = self.lock();
        let services = inner
            .lb
            .dump()?
            .into_iter()
            .map(|d| {
                let owner = inner.owners.get(&frontend_of(&d));
                service_entry(d, owner)
            })
            .collect();
        Ok(BpfServices {
            node: node.to_string(),
            services,
            maps: inner
                .lb
                .pressure()?
                .into_iter()
                .map(|m| BpfMapPressure {
                    map: m.map.to_string(),
                    entries: m.entries,
                    max_entries: u64::from(m.max_entries),
                })
                .collect(),
            programming: BpfProgramming {
                writes: inner.writes,
                latency_micros: inner.latency.snapshot(),
            },
        })
    }

    /// Every backend, with its frontend and Service, for `GET /bpf/backends`.
    pub fn backends_report(&self, node: &str) -> Result<BpfBackends, BpfError> {
        let inner = self.lock();
        let mut backends = Vec::new();
        for svc in inner.lb.dump()? {
            let owner = inner.owners.get(&frontend_of(&svc));
            for b in &svc.backends {
                backends.push(BpfBackend {
                    protocol: Some(svc.protocol.to_string()),
                    service_id: Some(svc.id),
                    frontend: Some(svc.frontend.clone()),
                    service: owner.map(|o| o.key.to_string()),
                    port_name: owner.map(|o| o.port_name.clone()),
                    ..backend_entry(b)
                });
            }
        }
        backends.sort_by_key(|b| b.id);
        Ok(BpfBackends {
            node: node.to_string(),
            backends,
        })
    }

    /// The fast path's endpoints with the pod (uid) each was written for; the pods' names and
    /// traffic are joined in by the caller (`GET /bpf/pods`).
    pub fn pod_endpoints(&self) -> Result<Vec<BpfPod>, BpfError> {
        let inner = self.lock();
        Ok(inner
            .lb
            .pod_endpoints()?
            .into_iter()
            .map(|(ip, ep)| BpfPod {
                ip: ip.to_string(),
                ifindex: ep.ifindex,
                pod_mac: mac_string(&ep.pod_mac),
                host_mac: mac_string(&ep.host_mac),
                uid: inner.pods.get(&ip).cloned(),
                namespace: None,
                name: None,
                network: None,
            })
            .collect())
    }

    /// The NodePort conntrack entries, for `GET /bpf/conntrack`.
    pub fn conntrack_report(&self, node: &str) -> Result<BpfConntrack, BpfError> {
        let mut entries: Vec<BpfConntrackEntry> = self
            .lock()
            .lb
            .conntrack()?
            .into_iter()
            .map(|(k, e)| conntrack_entry(&k, &e))
            .collect();
        entries.sort_by(|a, b| (&a.direction, &a.packet).cmp(&(&b.direction, &b.packet)));
        Ok(BpfConntrack {
            node: node.to_string(),
            entries,
        })
    }
}

/// The fast path's counters as the API reports them.
pub fn fast_path(c: FastPathCounters) -> BpfFastPath {
    BpfFastPath {
        redirect_peer: c.redirect_peer,
        redirect_neigh: c.redirect_neigh,
        pass: c.pass,
        fib_fail: c.fib_fail,
    }
}

fn service_entry(d: ServiceDump, owner: Option<&Owner>) -> BpfService {
    BpfService {
        id: d.id,
        frontend: d.frontend,
        ip: d.ip.to_string(),
        port: d.port,
        protocol: d.protocol.to_string(),
        in_cluster: d.in_cluster,
        session_affinity: d.session_affinity.to_string(),
        affinity_timeout_seconds: d.affinity_timeout_seconds,
        service: owner.map(|o| o.key.to_string()),
        port_name: owner.map(|o| o.port_name.clone()),
        backends: d.backends.iter().map(backend_entry).collect(),
        connects: d.connects,
        sends: d.sends,
    }
}

/// A backend as listed inside its service (without the service's fields).
fn backend_entry(b: &BackendDump) -> BpfBackend {
    BpfBackend {
        id: b.id,
        slot: b.slot,
        ip: b.ip.to_string(),
        port: b.port,
        address: b.address.clone(),
        connects: b.connects,
        sends: b.sends,
        ..BpfBackend::default()
    }
}

fn frontend_of(d: &ServiceDump) -> Frontend {
    Frontend {
        ip: d.ip,
        port: d.port,
        protocol: Protocol::parse(d.protocol).unwrap_or(Protocol::Tcp),
        in_cluster: d.in_cluster,
    }
}

/// One direction of a NodePort flow, with addresses written out.
fn conntrack_entry(k: &NpCtKey, e: &NpCtEntry) -> BpfConntrackEntry {
    let ip = |be: u32| Ipv4Addr::from(be.to_ne_bytes());
    BpfConntrackEntry {
        direction: if k.dir == NP_CT_REPLY {
            "reply"
        } else {
            "forward"
        }
        .into(),
        protocol: match k.proto {
            IPPROTO_TCP => "TCP",
            IPPROTO_UDP => "UDP",
            _ => "?",
        }
        .into(),
        packet: format!("{}:{} -> {}:{}", ip(k.saddr), k.sport, ip(k.daddr), k.dport),
        rewritten: format!("{}:{} -> {}:{}", ip(e.saddr), e.sport, ip(e.daddr), e.dport),
        backend_id: e.backend_id,
        service_id: e.service_id,
    }
}

fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_entries_read_as_addresses() {
        let be = |a: [u8; 4]| u32::from_ne_bytes(a);
        let k = skiff_common::lb::NpCtKey {
            saddr: be([10, 201, 0, 2]),
            daddr: be([10, 201, 0, 1]),
            sport: 40000,
            dport: 30080,
            proto: skiff_common::lb::IPPROTO_TCP,
            dir: skiff_common::lb::NP_CT_FORWARD,
            _pad: [0; 2],
        };
        let e = skiff_common::lb::NpCtEntry {
            saddr: be([10, 201, 0, 1]),
            daddr: be([10, 202, 1, 11]),
            sport: 40000,
            dport: 8080,
            backend_id: 3,
            service_id: 1,
        };
        let c = conntrack_entry(&k, &e);
        assert_eq!(c.direction, "forward");
        assert_eq!(c.protocol, "TCP");
        assert_eq!(c.packet, "10.201.0.2:40000 -> 10.201.0.1:30080");
        assert_eq!(c.rewritten, "10.201.0.1:40000 -> 10.202.1.11:8080");
        assert_eq!(mac_string(&[0, 0x1b, 2, 3, 4, 0xff]), "00:1b:02:03:04:ff");
    }
}
