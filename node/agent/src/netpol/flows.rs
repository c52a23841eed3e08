//! Flow records: what the policy programs write to their ring buffer (the first packet of
//! every flow a pod starts or accepts, every dropped packet), named (pods, the node, the
//! Service a socket-balanced flow was sent to, the policy) and kept in a bounded log that
//! `GET /flows` serves and follows (`skiff observe`).
//!
//! The reader thread hands records over through a bounded queue (dropped when full); the last
//! [`KEPT`] named records are kept and fed to followers.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;

use skiff_client::node_api::{FlowEndpoint, FlowQuery, FlowRecord};
use skiff_datapath::policy::{DIR_INGRESS, PolFlowEvent, REASON_DENIED};
use tokio::sync::broadcast;

/// Records kept for clients that connect later.
pub const KEPT: usize = 4096;

/// The node's recent flow records and the live feed of new ones.
#[derive(Debug)]
pub struct FlowLog {
    kept: Mutex<VecDeque<FlowRecord>>,
    live: broadcast::Sender<FlowRecord>,
}

impl Default for FlowLog {
    fn default() -> Self {
        FlowLog {
            kept: Mutex::new(VecDeque::with_capacity(KEPT)),
            live: broadcast::channel(KEPT).0,
        }
    }
}

impl FlowLog {
    pub fn push(&self, r: FlowRecord) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back(r.clone());
        // Nobody following is fine.
        let _ = self.live.send(r);
    }

    /// The kept records `q` selects, oldest first, and a receiver of every later one (taken
    /// together, so none falls between).
    pub fn read(&self, q: &FlowQuery) -> (Vec<FlowRecord>, broadcast::Receiver<FlowRecord>) {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let rx = self.live.subscribe();
        (kept.iter().filter(|r| q.matches(r)).cloned().collect(), rx)
    }
}

/// What a record's addresses are.
#[derive(Debug, Default)]
pub struct Names {
    /// Pod address → (namespace, name).
    pub pods: HashMap<Ipv4Addr, (String, String)>,
    /// Policy index → `namespace/name`.
    pub policies: HashMap<u32, String>,
    /// This node's own addresses.
    pub host: Vec<Ipv4Addr>,
}

fn protocol(p: u8) -> String {
    match skiff_datapath::lb::Protocol::from_number(p) {
        Some(known) => known.as_str().into(),
        None if p == 1 => "ICMP".into(),
        None => p.to_string(),
    }
}

fn endpoint(names: &Names, ip: u32, port: u16) -> FlowEndpoint {
    let ip = Ipv4Addr::from(ip.to_ne_bytes());
    let mut e = FlowEndpoint {
        ip: ip.to_string(),
        port,
        ..Default::default()
    };
    if let Some((ns, pod)) = names.pods.get(&ip) {
        e.namespace = ns.clone();
        e.pod = pod.clone();
    } else if names.host.contains(&ip) {
        e.identity = "host".into();
    } else {
        e.identity = "world".into();
    }
    e
}

/// Names one record. `service` finds the Service a socket was balanced to (egress only:
/// the record of the connecting socket).
pub fn describe(
    node: &str,
    names: &Names,
    ev: &PolFlowEvent,
    time: chrono::DateTime<chrono::Utc>,
    service: impl FnOnce(u64, IpAddr, u16, u8) -> Option<String>,
) -> FlowRecord {
    let local = endpoint(names, ev.local, ev.local_port);
    let peer = endpoint(names, ev.peer, ev.peer_port);
    let ingress = ev.dir == DIR_INGRESS;
    let service = if ingress || ev.cookie == 0 {
        None
    } else {
        service(
            ev.cookie,
            IpAddr::V4(Ipv4Addr::from(ev.peer.to_ne_bytes())),
            ev.peer_port,
            ev.proto,
        )
    };
    let (source, destination) = if ingress {
        (peer, local)
    } else {
        (local, peer)
    };
    FlowRecord {
        time: time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        node: node.to_string(),
        direction: if ingress { "ingress" } else { "egress" }.into(),
        verdict: if ev.reason == REASON_DENIED {
            "denied"
        } else {
            "allowed"
        }
        .into(),
        reason: super::reason_name(ev.reason).into(),
        protocol: protocol(ev.proto),
        source,
        destination,
        service: service.unwrap_or_default(),
        policy: names.policies.get(&ev.policy).cloned().unwrap_or_default(),
        bytes: u64::from(ev.bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_datapath::policy::{DIR_EGRESS, REASON_ALLOWED_UNISOLATED};

    fn ip(a: [u8; 4]) -> u32 {
        u32::from_ne_bytes(a)
    }

    fn names() -> Names {
        Names {
            pods: HashMap::from([
                (Ipv4Addr::new(10, 244, 0, 2), ("x".into(), "a".into())),
                (Ipv4Addr::new(10, 244, 1, 2), ("y".into(), "b".into())),
            ]),
            policies: HashMap::from([(7, "x/deny".into())]),
            host: vec![Ipv4Addr::new(192, 168, 0, 1)],
        }
    }

    #[test]
    fn a_drop_is_named_from_the_receivers_side() {
        let ev = PolFlowEvent {
            local: ip([10, 244, 0, 2]),
            peer: ip([10, 244, 1, 2]),
            local_port: 80,
            peer_port: 40000,
            policy: 7,
            bytes: 60,
            proto: 6,
            dir: DIR_INGRESS,
            reason: REASON_DENIED,
            cookie: 99,
            ..Default::default()
        };
        let r = describe("n1", &names(), &ev, chrono::Utc::now(), |_, _, _, _| {
            panic!("ingress records have no service")
        });
        assert_eq!(r.verdict, "denied");
        assert_eq!(r.direction, "ingress");
        assert_eq!(r.source.name(), "y/b");
        assert_eq!(
            (r.destination.name(), r.destination.port),
            ("x/a".into(), 80)
        );
        assert_eq!(r.policy, "x/deny");
        assert_eq!(r.protocol, "TCP");
    }

    #[test]
    fn an_egress_flow_names_its_service_and_unknown_peers() {
        let ev = PolFlowEvent {
            local: ip([10, 244, 0, 2]),
            peer: ip([10, 244, 9, 9]),
            local_port: 40000,
            peer_port: 8080,
            proto: 17,
            dir: DIR_EGRESS,
            reason: REASON_ALLOWED_UNISOLATED,
            cookie: 42,
            ..Default::default()
        };
        let r = describe(
            "n1",
            &names(),
            &ev,
            chrono::Utc::now(),
            |cookie, backend, port, proto| {
                assert_eq!((cookie, port, proto), (42, 8080, 17));
                assert_eq!(backend, IpAddr::V4(Ipv4Addr::new(10, 244, 9, 9)));
                Some("z/web:80".into())
            },
        );
        assert_eq!(r.service, "z/web:80");
        assert_eq!(r.source.name(), "x/a");
        assert_eq!(r.destination.name(), "10.244.9.9 (world)");
        assert_eq!(r.verdict, "allowed");
        assert!(r.policy.is_empty());
        let q = FlowQuery {
            service: Some("z/web".into()),
            ..Default::default()
        };
        assert!(q.matches(&r));
    }

    #[test]
    fn the_log_keeps_the_newest_and_feeds_followers() {
        let log = FlowLog::default();
        for i in 0..(KEPT + 10) {
            log.push(FlowRecord {
                bytes: i as u64,
                verdict: "allowed".into(),
                ..Default::default()
            });
        }
        let (kept, mut rx) = log.read(&FlowQuery::default());
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].bytes, 10);
        log.push(FlowRecord {
            bytes: 1,
            verdict: "denied".into(),
            ..Default::default()
        });
        assert_eq!(
            rx.try_recv().map(|r| r.verdict).ok().as_deref(),
            Some("denied")
        );
        let denied = FlowQuery {
            verdict: Some("denied".into()),
            ..Default::default()
        };
        assert_eq!(log.read(&denied).0.len(), 1);
    }
}
