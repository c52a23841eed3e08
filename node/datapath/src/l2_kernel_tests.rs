//! ARP answering for announced LoadBalancer addresses against the real kernel: the
//! `skiff_np_ingress` tc program on a "node" namespace's uplink, asked by a "client"
//! namespace on the same link (a python `AF_PACKET` socket sends the request and reads the
//! replies). Needs root.
//!
//! ```text
//!  client ns  c0 10.203.0.2 ── n0 10.203.0.1   node ns
//! ```
//!
//! Safety: both namespaces and the veth are the test's own; nothing is configured in, or sent
//! from, the root namespace. The guard removes the pins (detaching the program, freeing the
//! maps) and the namespaces, also when a test fails.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::lb::l2::{L2_FLAG_ANNOUNCE, L2Announce, monotonic_ns};
use super::lb::{ServiceLb, TcAttach};
use super::*;
use crate::testing::{python, run, unique_name, wait_timeout};
use skiff_hostnet::garp;

const NODE_IP: &str = "10.203.0.1";
const CLIENT_IP: &str = "10.203.0.2";
const ANNOUNCED: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 240);

/// `tcp IP`: connects to IP port 9 (closed) and prints how it went. `ask ME IP`: sends one ARP request for IP from c0 and prints, as JSON, the sender MACs of
/// the replies for IP seen within 1 s. `listen SECONDS`: prints every gratuitous ARP seen.
const ARP: &str = r#"
import json, socket, struct, sys, time
if sys.argv[1] == "tcp":
    c = socket.socket()
    c.settimeout(2)
    try:
        c.connect((sys.argv[2], 9))
        print(json.dumps(["connected"]))
    except ConnectionRefusedError:
        print(json.dumps(["refused"]))
    except OSError as e:
        print(json.dumps([str(e)]))
    sys.exit(0)
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind(("c0", 0))
mac = s.getsockname()[4]
me = socket.inet_aton(sys.argv[2]) if len(sys.argv) > 2 else b""
out = []
if sys.argv[1] == "ask":
    ip = socket.inet_aton(sys.argv[3])
    req = b"\xff" * 6 + mac + b"\x08\x06" + bytes([0, 1, 8, 0, 6, 4, 0, 1]) + mac + me + b"\0" * 6 + ip
    s.send(req)
    end = time.time() + 1.0
    while time.time() < end:
        s.settimeout(max(0.01, end - time.time()))
        try:
            f = s.recv(100)
        except socket.timeout:
            break
        if len(f) >= 42 and f[20:22] == b"\0\2" and f[28:32] == ip and f[38:42] == me:
            out.append({"mac": f[22:28].hex(":"), "eth_src": f[6:12].hex(":"), "eth_dst": f[0:6].hex(":")})
else:
    print("ready", flush=True)
    end = time.time() + float(sys.argv[2])
    while time.time() < end:
        s.settimeout(max(0.01, end - time.time()))
        try:
            f = s.recv(100)
        except socket.timeout:
            break
        if len(f) >= 42 and f[28:32] == f[38:42]:
            out.append({"ip": socket.inet_ntoa(f[28:32]), "mac": f[22:28].hex(":")})
print(json.dumps(out), flush=True)
"#;

struct L2Fixture {
    client_ns: String,
    node_ns: String,
    pin_dir: PathBuf,
    created: Vec<String>,
}

impl L2Fixture {
    fn new() -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        assert_eq!(unsafe { libc::geteuid() }, 0, "needs root");
        let suffix = unique_name();
        let mut fx = L2Fixture {
            client_ns: format!("skiff-test-l2c-{suffix}"),
            node_ns: format!("skiff-test-l2n-{suffix}"),
            pin_dir: node_pin_dir(&format!("test-l2-{suffix}")),
            created: Vec::new(),
        };
        for ns in [fx.client_ns.clone(), fx.node_ns.clone()] {
            run("ip", &["netns", "add", &ns]);
            fx.created.push(ns.clone());
            run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        }
        let (c, n) = (fx.client_ns.clone(), fx.node_ns.clone());
        run(
            "ip",
            &[
                "-n", &c, "link", "add", "c0", "type", "veth", "peer", "name", "n0", "netns", &n,
            ],
        );
        run(
            "ip",
            &[
                "-n",
                &c,
                "addr",
                "add",
                &format!("{CLIENT_IP}/24"),
                "dev",
                "c0",
            ],
        );
        run("ip", &["-n", &c, "link", "set", "c0", "up"]);
        run(
            "ip",
            &[
                "-n",
                &n,
                "addr",
                "add",
                &format!("{NODE_IP}/24"),
                "dev",
                "n0",
            ],
        );
        run("ip", &["-n", &n, "link", "set", "n0", "up"]);
        fx
    }

    fn node_netns(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.node_ns)
    }

    /// Loads the LB object and attaches its tc program to n0; returns n0's ifindex and MAC.
    fn load(&self) -> (ServiceLb, u32, [u8; 6]) {
        let mut lb = crate::testing::load_small(&self.pin_dir);
        let (how, link) = skiff_hostnet::run_in_netns_scoped(Some(&self.node_netns()), || {
            (lb.attach_tc("n0").expect("attach tc"), garp::link("n0"))
        })
        .expect("node netns");
        assert_eq!(how, TcAttach::Attached);
        let (ifindex, mac) = link.expect("n0's ifindex and MAC");
        (lb, ifindex, mac)
    }

    fn arp(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.client_ns))
            .args([python(), "-c", ARP])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn arp client");
        let status = wait_timeout(&mut child, "arp client");
        let out = child.wait_with_output().expect("arp client output");
        assert!(
            status.success(),
            "arp {args:?}: {status}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let json = text.lines().last().unwrap_or_default();
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    /// The MACs that answered an ARP request for `ip`.
    fn ask(&self, ip: &str) -> Vec<String> {
        self.arp(&["ask", CLIENT_IP, ip])
            .iter()
            .map(|r| r["mac"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

impl Drop for L2Fixture {
    fn drop(&mut self) {
        if let Err(e) = ServiceLb::remove_pins(&self.pin_dir) {
            eprintln!("cleanup: {e}");
        }
        for ns in &self.created {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

fn hex(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn entry(ifindex: u32, mac: [u8; 6], deadline_ns: u64) -> L2Announce {
    L2Announce {
        deadline_ns,
        ifindex,
        flags: L2_FLAG_ANNOUNCE,
        mac,
        _pad: [0; 2],
    }
}

#[test]
fn announced_addresses_are_answered_until_their_deadline() {
    let fx = L2Fixture::new();
    let (mut lb, ifindex, mac) = fx.load();
    let announced = ANNOUNCED.to_string();

    // Not announced: nobody answers (the node does not own the address).
    assert_eq!(fx.ask(&announced), Vec::<String>::new());

    // Announced with a deadline ahead: the program answers with the entry's MAC, as a
    // unicast reply to the asker.
    let later = monotonic_ns() + Duration::from_secs(30).as_nanos() as u64;
    lb.set_l2_announcement(ANNOUNCED, entry(ifindex, mac, later))
        .expect("announce");
    let replies = fx.arp(&["ask", CLIENT_IP, &announced]);
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0]["mac"], hex(mac));
    assert_eq!(replies[0]["eth_src"], hex(mac));
    assert_ne!(replies[0]["eth_dst"], "ff:ff:ff:ff:ff:ff");

    // Another MAC in the entry is what the reply carries (the program does not ask the
    // device).
    let other = [0x02, 0x5f, 0, 0, 0, 0x42];
    lb.set_l2_announcement(ANNOUNCED, entry(ifindex, other, later))
        .expect("announce");
    assert_eq!(fx.ask(&announced), [hex(other)]);

    // Past its deadline (the agent is gone and its lease ran out): silence, with the entry
    // still in the map.
    let past = monotonic_ns().saturating_sub(1);
    lb.set_l2_announcement(ANNOUNCED, entry(ifindex, mac, past))
        .expect("expire");
    assert_eq!(fx.ask(&announced), Vec::<String>::new());
    assert_eq!(lb.l2_announcements().expect("entries").len(), 1);

    // An entry for another device is not answered on this one.
    lb.set_l2_announcement(ANNOUNCED, entry(ifindex + 1000, mac, later))
        .expect("announce");
    assert_eq!(fx.ask(&announced), Vec::<String>::new());

    // Removed: silence.
    lb.set_l2_announcement(ANNOUNCED, entry(ifindex, mac, later))
        .expect("announce");
    assert_eq!(fx.ask(&announced), [hex(mac)]);
    lb.remove_l2_announcement(ANNOUNCED).expect("remove");
    assert_eq!(fx.ask(&announced), Vec::<String>::new());
    assert!(lb.l2_announcements().expect("entries").is_empty());
}

#[test]
fn other_packets_pass_untouched() {
    let fx = L2Fixture::new();
    let (mut lb, ifindex, mac) = fx.load();
    let later = monotonic_ns() + Duration::from_secs(30).as_nanos() as u64;
    lb.set_l2_announcement(ANNOUNCED, entry(ifindex, mac, later))
        .expect("announce");
    // ARP for the node's own address reaches its stack, which answers it (once: the program
    // does not).
    assert_eq!(fx.ask(NODE_IP), [hex(mac)]);
    // An address next to the announced one: nobody.
    assert_eq!(fx.ask("10.203.0.241"), Vec::<String>::new());
    // IPv4 reaches the node's stack: a TCP SYN to a closed port is refused by it.
    assert_eq!(fx.arp(&["tcp", NODE_IP]), [serde_json::json!("refused")]);
}

#[test]
fn gratuitous_arp_is_seen_on_the_link() {
    let fx = L2Fixture::new();
    let (_lb, ifindex, mac) = fx.load();
    let mut listener = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", fx.client_ns))
        .args([python(), "-c", ARP, "listen", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn listener");
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(listener.stdout.as_mut().expect("stdout"), &mut ready)
        .expect("listener ready");
    skiff_hostnet::run_in_netns_scoped(Some(&fx.node_netns()), || {
        garp::announce(ifindex, mac, ANNOUNCED, 3, Duration::from_millis(50))
    })
    .expect("node netns")
    .expect("gratuitous ARP");
    let status = wait_timeout(&mut listener, "listener");
    assert!(status.success());
    let mut out = String::new();
    std::io::Read::read_to_string(listener.stdout.as_mut().expect("stdout"), &mut out)
        .expect("listener output");
    let seen: Vec<serde_json::Value> = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen.iter()
            .all(|s| s["ip"] == ANNOUNCED.to_string() && s["mac"] == hex(mac))
    );
}
