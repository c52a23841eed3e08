//! The Service load balancer against the real kernel: the `skiff-lb` programs attached to a
//! cgroup created for the test, a client process in that cgroup and in a network namespace of
//! its own, backends in a second namespace reached over a veth pair. Needs root.
//!
//! Safety: both namespaces, the veth pair and every address (10.200.0.0/24 on the veth, the
//! "virtual IPs" 10.96.0.x that only exist as map keys) live inside namespaces the test
//! created; nothing is configured in, or sent from, the root namespace. The fixture's guard
//! stops the backend threads, kills the clients by pid, removes the pins (which detaches the
//! programs), the cgroup and the namespaces (with the veths in them), also when a test fails.

use std::net::IpAddr;

use std::process::Command;

use crate::lb::{Frontend, LbConfig, Protocol, ServiceLb, ServiceParams};
use crate::testing::*;
use crate::*;

#[test]
fn spreads_tcp_connects_over_every_backend_and_counts_them() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    let writes = lb
        .sync_service(
            tcp_frontend(),
            ServiceParams::default(),
            &tcp_backends(&[1, 2, 3]),
        )
        .expect("program");
    assert!(writes > 0);
    assert_eq!(
        lb.sync_service(
            tcp_frontend(),
            ServiceParams::default(),
            &tcp_backends(&[3, 2, 1])
        )
        .unwrap(),
        0,
        "unchanged: no writes"
    );

    const N: u64 = 300;
    let (names, peers) = fx.connects(N as usize);
    eprintln!("{N} connects: {names:?}");
    assert_eq!(
        peers,
        [format!("{VIP}:{TCP_PORT}")],
        "getpeername shows the VIP"
    );
    assert_eq!(names.values().sum::<u64>(), N);
    for b in ["b1", "b2", "b3"] {
        let got = names.get(b).copied().unwrap_or(0);
        assert!(got * 5 >= N, "{b} got {got} of {N} (< 20 %): {names:?}");
    }
    // The backends saw exactly those connections, and so did the counters.
    let accepted = fx.servers().accepted();
    let dump = lb.dump().expect("dump");
    assert_eq!(dump.len(), 1);
    let svc = &dump[0];
    assert_eq!(svc.frontend, format!("{VIP}:{TCP_PORT}/TCP"));
    assert_eq!(svc.connects, N);
    for b in &svc.backends {
        let name = backend_name(b.ip);
        let i: usize = name[1..].parse().unwrap();
        assert_eq!(b.connects, names[&name], "counter of {name}");
        assert_eq!(
            u64::from(accepted[i - 1]),
            names[&name],
            "accepted by {name}"
        );
        assert_eq!(b.sends, 0);
    }
    let pressure = lb.pressure().expect("pressure");
    let of = |m: &str| pressure.iter().find(|p| p.map == m).unwrap().clone();
    assert_eq!(of("LB_SERVICES").entries, 1);
    assert_eq!(of("LB_SERVICES").max_entries, 64);
    assert_eq!(of("LB_BACKENDS").entries, 3);
    assert_eq!(of("LB_COUNTERS").entries, 3);
    assert!(of("LB_REVNAT").entries >= 1 && of("LB_REVNAT").max_entries == 1024);
}

/// (c) UDP through the VIP, connected and unconnected: replies come from the VIP.
#[test]
fn udp_replies_come_from_the_vip() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    lb.sync_service(
        udp_frontend(),
        ServiceParams::default(),
        &udp_backends(&[1, 2, 3]),
    )
    .expect("program");
    let v = fx.client(&["udp", &VIP.to_string(), &UDP_PORT.to_string()]);
    eprintln!("udp: {v}");
    let vip = format!("{VIP}:{UDP_PORT}");
    assert_eq!(v["connected"]["from"], vip.as_str());
    assert_eq!(v["connected"]["peer"], vip.as_str());
    assert_eq!(v["unconnected"]["from"], vip.as_str());
    for mode in ["connected", "unconnected"] {
        assert!(
            v[mode]["name"].as_str().is_some_and(|n| n.starts_with('b')),
            "{v}"
        );
    }
    let dump = lb.dump().unwrap();
    let (connects, sends): (u64, u64) = (dump[0].connects, dump[0].sends);
    assert_eq!(
        (connects, sends),
        (1, 1),
        "one connected socket, one datagram"
    );
}

/// (d) no backends: connect (and a UDP send) fails at once with ECONNREFUSED; a removed
/// service is plain unroutable again.
#[test]
fn a_service_without_backends_refuses_at_once() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    lb.upsert_service(tcp_frontend(), ServiceParams::default())
        .expect("program");
    for _ in 0..3 {
        let v = fx.client(&["refused", &VIP.to_string(), &TCP_PORT.to_string()]);
        eprintln!("refused: {v}");
        assert_eq!(v["errno"], libc::ECONNREFUSED, "{v}");
        assert!(v["ms"].as_f64().unwrap() < 100.0, "took {v}");
    }
    // UDP: unconnected datagrams (sendmsg4) and connected sockets (connect4) alike.
    lb.upsert_service(udp_frontend(), ServiceParams::default())
        .expect("program");
    let v = fx.client(&["udp-refused", &VIP.to_string(), &UDP_PORT.to_string()]);
    assert_eq!(v["sendto"], libc::ECONNREFUSED, "{v}");
    assert_eq!(v["connect"], libc::ECONNREFUSED, "{v}");
    lb.remove_service(&udp_frontend()).expect("remove");
    lb.remove_service(&tcp_frontend()).expect("remove");
    let v = fx.client(&["refused", &VIP.to_string(), &TCP_PORT.to_string()]);
    assert_eq!(
        v["errno"],
        libc::ENETUNREACH,
        "no service: the VIP is just an address nobody routes: {v}"
    );
    assert!(lb.dump().unwrap().is_empty());
    assert_eq!(lb.state().backend_count(), 0);
}

/// A `Local` frontend (no backend on this node) refuses connections made on the node until
/// its in-cluster view exists; then they go to the view's backends, and getpeername still
/// shows the frontend.
#[test]
fn a_local_frontend_balances_connections_made_on_the_node_over_its_in_cluster_view() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    let local = ServiceParams {
        node_port: true,
        local: true,
        ..ServiceParams::default()
    };
    lb.sync_service(tcp_frontend(), local, &[])
        .expect("program");
    let v = fx.client(&["refused", &VIP.to_string(), &TCP_PORT.to_string()]);
    assert_eq!(v["errno"], libc::ECONNREFUSED, "no view yet: {v}");
    lb.sync_service(
        tcp_frontend().in_cluster_view(),
        ServiceParams::default(),
        &tcp_backends(&[1, 2]),
    )
    .expect("program the view");
    let (names, peers) = fx.connects(40);
    assert_eq!(names.values().sum::<u64>(), 40, "{names:?}");
    assert!(names.keys().all(|b| b == "b1" || b == "b2"), "{names:?}");
    assert_eq!(
        peers,
        [format!("{VIP}:{TCP_PORT}")],
        "getpeername shows the frontend"
    );
    let dump = lb.dump().expect("dump");
    let view = dump
        .iter()
        .find(|s| s.in_cluster)
        .expect("the view in the dump");
    assert_eq!(view.frontend, format!("{VIP}:{TCP_PORT}/TCP (in-cluster)"));
    assert_eq!(view.connects, 40);
    // A reload from the pins recovers the view as a view.
    drop(lb);
    let lb = fx.load();
    assert!(
        lb.dump()
            .unwrap()
            .iter()
            .any(|s| s.in_cluster && s.backends.len() == 2)
    );
}

/// (e) a removed backend gets no new connections; its established one keeps working.
#[test]
fn a_removed_backend_keeps_its_connections_and_gets_no_new_ones() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    lb.sync_service(
        tcp_frontend(),
        ServiceParams::default(),
        &tcp_backends(&[1, 2, 3]),
    )
    .unwrap();
    let (mut held, name) = fx.hold();
    let gone: usize = name[1..].parse().unwrap();
    let rest: Vec<usize> = (1..=BACKENDS).filter(|i| *i != gone).collect();
    lb.set_backends(&tcp_frontend(), &tcp_backends(&rest))
        .expect("remove one");
    let before = fx.servers().accepted()[gone - 1];

    let (names, _) = fx.connects(60);
    eprintln!("after removing {name}: {names:?}");
    assert!(!names.contains_key(&name), "{name} got new connections");
    assert_eq!(fx.servers().accepted()[gone - 1], before);
    let (echo, peer) = held.echo("still-there");
    assert_eq!(echo, "still-there");
    assert_eq!(peer, format!("{VIP}:{TCP_PORT}"));
    let dump = lb.dump().unwrap();
    assert_eq!(dump[0].backends.len(), 2);
    assert_eq!(
        dump[0].connects, 60,
        "removed backend's counters went with it"
    );
}

/// (f) an agent restart: the data path runs without the agent, a reload takes the pinned
/// maps and links over (nothing attached twice), established connections live on, and later
/// changes take effect.
#[test]
fn a_reload_from_the_pins_keeps_connections_and_programming() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    lb.sync_service(
        tcp_frontend(),
        ServiceParams::default(),
        &tcp_backends(&[1, 2, 3]),
    )
    .unwrap();
    let before = lb.dump().unwrap();
    let (mut held, name) = fx.hold();
    let old_prog = fx.attached_programs("cgroup_inet4_connect");
    assert_eq!(old_prog.len(), 1);
    drop(lb);

    // No agent: the pinned links keep translating.
    let (names, peers) = fx.connects(10);
    assert_eq!(names.values().sum::<u64>(), 10);
    assert_eq!(peers, [format!("{VIP}:{TCP_PORT}")]);

    let mut lb = fx.load();
    assert_eq!(
        lb.state().services().len(),
        1,
        "the mirror is rebuilt from the maps"
    );
    let (_, report) = lb.attach(&fx.cgroup).expect("attach again");
    assert_eq!(report.adopted, 8, "{report:?}");
    assert_eq!(report.attached, 0, "{report:?}");
    for hook in [
        "cgroup_inet4_connect",
        "cgroup_udp4_sendmsg",
        "cgroup_udp4_recvmsg",
        "cgroup_inet4_getpeername",
        "cgroup_inet6_connect",
        "cgroup_udp6_sendmsg",
        "cgroup_udp6_recvmsg",
        "cgroup_inet6_getpeername",
    ] {
        assert_eq!(fx.attached_programs(hook).len(), 1, "{hook} attached once");
    }
    let new_prog = fx.attached_programs("cgroup_inet4_connect");
    assert_ne!(new_prog, old_prog, "the link now runs this agent's program");
    let after = lb.dump().unwrap();
    assert_eq!(after[0].id, before[0].id);
    let ids = |d: &[lb::ServiceDump]| {
        d[0].backends
            .iter()
            .map(|b| (b.id, b.ip))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&after), ids(&before), "same ids and slots");
    assert_eq!(
        after[0].connects, 11,
        "counters survived (10 + the held one)"
    );
    assert_eq!(
        lb.sync_service(
            tcp_frontend(),
            ServiceParams::default(),
            &tcp_backends(&[1, 2, 3])
        )
        .unwrap(),
        0,
        "nothing rewritten"
    );

    let (echo, peer) = held.echo("across-restart");
    assert_eq!(echo, "across-restart");
    assert_eq!(peer, format!("{VIP}:{TCP_PORT}"), "reverse NAT survived");

    // Later changes take effect through the adopted links.
    let gone: usize = name[1..].parse().unwrap();
    let rest: Vec<usize> = (1..=BACKENDS).filter(|i| *i != gone).collect();
    lb.set_backends(&tcp_frontend(), &tcp_backends(&rest))
        .unwrap();
    let (names, _) = fx.connects(40);
    assert!(!names.contains_key(&name), "{names:?}");
    assert_eq!(held.echo("still").0, "still");
}

/// (g) ClientIP affinity: one client netns sticks to one backend, until that backend goes.
#[test]
fn client_ip_affinity_sticks_to_one_backend() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    let sticky = ServiceParams {
        affinity_timeout_s: Some(60),
        ..Default::default()
    };
    lb.sync_service(tcp_frontend(), sticky, &tcp_backends(&[1, 2, 3]))
        .unwrap();
    let (names, _) = fx.connects(30);
    eprintln!("sticky: {names:?}");
    assert_eq!(names.len(), 1, "one backend for one client: {names:?}");
    let (first, n) = names.iter().next().map(|(k, v)| (k.clone(), *v)).unwrap();
    assert_eq!(n, 30);
    // Another process of the same netns sticks too.
    let (again, _) = fx.connects(5);
    assert_eq!(again.keys().collect::<Vec<_>>(), [&first]);

    let gone: usize = first[1..].parse().unwrap();
    let rest: Vec<usize> = (1..=BACKENDS).filter(|i| *i != gone).collect();
    lb.set_backends(&tcp_frontend(), &tcp_backends(&rest))
        .unwrap();
    let (moved, _) = fx.connects(20);
    eprintln!("after removing {first}: {moved:?}");
    assert_eq!(moved.len(), 1, "sticks to the new choice: {moved:?}");
    assert!(!moved.contains_key(&first));
    let dump = lb.dump().unwrap();
    assert_eq!(dump[0].session_affinity, "ClientIP");
    assert_eq!(dump[0].affinity_timeout_seconds, Some(60));
}

#[test]
fn bpftool_shows_named_fields_of_the_lb_maps() {
    let fx = LbFixture::new();
    let mut lb = fx.load();
    lb.sync_service(
        tcp_frontend(),
        ServiceParams {
            affinity_timeout_s: Some(7),
            ..Default::default()
        },
        &tcp_backends(&[1]),
    )
    .unwrap();
    for (map, fields) in [
        (
            "LB_SERVICES",
            &["\"addr\"", "\"count\"", "\"affinity_timeout_s\""][..],
        ),
        ("LB_BACKENDS", &["\"service_id\"", "\"port\": 8080"][..]),
        ("LB_SLOTS", &["\"slot\""][..]),
    ] {
        let pin = fx.pin_dir.join(map);
        let out = Command::new("bpftool")
            .args(["map", "dump", "pinned"])
            .arg(&pin)
            .output()
            .expect("run bpftool");
        let dump = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for f in fields {
            assert!(dump.contains(f), "{map}: no {f} in\n{dump}");
        }
    }
}

#[test]
fn refuses_pins_of_another_layout_and_cleans_up() {
    let fx = LbFixture::new();
    // A map of another layout where LB_SLOTS should be.
    std::fs::create_dir_all(&fx.pin_dir).unwrap();
    let acct = Accounting::load_with_capacity(&fx.pin_dir, 4).expect("load accounting");
    std::fs::rename(
        fx.pin_dir.join(skiff_common::POD_INGRESS_MAP),
        fx.pin_dir.join("LB_SLOTS"),
    )
    .unwrap();
    let err = ServiceLb::load(&fx.pin_dir, LbConfig::default()).unwrap_err();
    assert!(matches!(err, BpfError::IncompatiblePin { .. }), "{err}");
    drop(acct);
    std::fs::remove_file(fx.pin_dir.join("LB_SLOTS")).unwrap();
    Accounting::remove_pins(&fx.pin_dir).unwrap();

    let mut lb = fx.load_attached();
    lb.upsert_service(tcp_frontend(), ServiceParams::default())
        .unwrap();
    drop(lb);
    assert_eq!(fx.attached_programs("cgroup_inet4_connect").len(), 1);
    ServiceLb::detach_pinned(&fx.pin_dir).unwrap();
    assert!(fx.detached_soon("cgroup_inet4_connect"), "detached");
    assert!(fx.pin_dir.join("LB_SERVICES").exists(), "maps stay");
    ServiceLb::remove_pins(&fx.pin_dir).unwrap();
    assert!(!fx.pin_dir.exists());
    assert!(
        fx.detached_soon("cgroup_inet4_connect"),
        "unpinned links detach"
    );
}

/// IPv6: connect6 spreads over the backends and getpeername6 shows the VIP; UDP through
/// sendmsg6/recvmsg6 (and connected UDP) answers from the VIP; a frontend without backends
/// refuses at once; the IPv4 programs leave IPv6 alone and vice versa (same maps).
#[test]
fn ipv6_frontends_are_balanced_reverse_translated_and_refused() {
    let mut fx = LbFixture::new();
    let mut lb = fx.load_attached();
    let tcp6 = frontend6(TCP_PORT, Protocol::Tcp);
    let udp6 = frontend6(UDP_PORT, Protocol::Udp);
    lb.sync_service(
        tcp6,
        ServiceParams::default(),
        &backends6(&[1, 2, 3], BACKEND_TCP_PORT),
    )
    .expect("program tcp6");
    lb.sync_service(
        udp6,
        ServiceParams::default(),
        &backends6(&[1, 2, 3], BACKEND_UDP_PORT),
    )
    .expect("program udp6");
    // An IPv4 service with one backend next to it: its translations stay IPv4.
    lb.sync_service(
        tcp_frontend(),
        ServiceParams::default(),
        &tcp_backends(&[2]),
    )
    .expect("program tcp4");

    const N: u64 = 150;
    let (names, peers) = fx.connects_to(IpAddr::V6(VIP6), N as usize);
    eprintln!("{N} connects over IPv6: {names:?}");
    assert_eq!(
        peers,
        [format!("[{VIP6}]:{TCP_PORT}")],
        "getpeername6 shows the VIP"
    );
    assert_eq!(names.values().sum::<u64>(), N);
    for b in ["b1", "b2", "b3"] {
        let got = names.get(b).copied().unwrap_or(0);
        assert!(got * 5 >= N, "{b} got {got} of {N} (< 20 %): {names:?}");
    }
    let (names4, _) = fx.connects(5);
    assert_eq!(names4.keys().collect::<Vec<_>>(), ["b2"], "IPv4 untouched");
    let of = |lb: &ServiceLb, f: &Frontend| {
        let dump = lb.dump().expect("dump");
        dump.iter()
            .find(|d| d.frontend == f.to_string())
            .unwrap_or_else(|| panic!("{f} not in {dump:?}"))
            .clone()
    };
    let d = of(&lb, &tcp6);
    assert_eq!(d.connects, N, "per-backend counters of the IPv6 frontend");
    assert!(d.backends.iter().all(|b| b.ip.is_ipv6()), "{d:?}");

    let v = fx.client(&["udp", &VIP6.to_string(), &UDP_PORT.to_string()]);
    eprintln!("udp6: {v}");
    let vip = format!("[{VIP6}]:{UDP_PORT}");
    assert_eq!(v["connected"]["from"], vip.as_str(), "recvmsg6 (connected)");
    assert_eq!(v["connected"]["peer"], vip.as_str(), "getpeername6 (UDP)");
    assert_eq!(
        v["unconnected"]["from"],
        vip.as_str(),
        "recvmsg6 (sendmsg6)"
    );
    for mode in ["connected", "unconnected"] {
        assert!(
            v[mode]["name"].as_str().is_some_and(|n| n.starts_with('b')),
            "{v}"
        );
    }
    let d = of(&lb, &udp6);
    assert_eq!((d.connects, d.sends), (1, 1), "one connect6, one sendmsg6");

    // No backends: refused at once, TCP and UDP alike.
    lb.set_backends(&tcp6, &[]).expect("empty tcp6");
    lb.set_backends(&udp6, &[]).expect("empty udp6");
    let v = fx.client(&["refused", &VIP6.to_string(), &TCP_PORT.to_string()]);
    assert_eq!(v["errno"], libc::ECONNREFUSED, "{v}");
    assert!(v["ms"].as_f64().unwrap() < 100.0, "took {v}");
    let v = fx.client(&["udp-refused", &VIP6.to_string(), &UDP_PORT.to_string()]);
    assert_eq!(v["sendto"], libc::ECONNREFUSED, "sendmsg6: {v}");
    assert_eq!(v["connect"], libc::ECONNREFUSED, "connect6: {v}");
    // Removed: the VIP is just an address nobody routes.
    lb.remove_service(&tcp6).expect("remove");
    let v = fx.client(&["refused", &VIP6.to_string(), &TCP_PORT.to_string()]);
    assert_eq!(v["errno"], libc::ENETUNREACH, "{v}");
}

/// `--bpf-debug`: a translated connect (and sendmsg) leaves a debug record naming the VIP
/// and the backend, read by the reader thread into the sink (the agent's sink forwards to
/// tracing, see `debug::tests`). Without the flag nothing is started.
#[test]
fn debug_records_name_the_vip_and_the_backend() {
    let mut fx = LbFixture::new();
    assert!(
        !fx.load().start_debug_log(Records::default()).unwrap(),
        "off by default"
    );
    let mut lb = ServiceLb::load(
        &fx.pin_dir,
        LbConfig {
            debug: true,
            ..small_config()
        },
    )
    .expect("load with debug records");
    lb.attach(&fx.cgroup).expect("attach");
    lb.sync_service(
        tcp_frontend(),
        ServiceParams::default(),
        &tcp_backends(&[2]),
    )
    .expect("program");
    lb.sync_service(
        udp_frontend(),
        ServiceParams::default(),
        &udp_backends(&[3]),
    )
    .expect("program");
    let records = Records::default();
    assert!(lb.start_debug_log(records.clone()).expect("reader"));
    let (names, _) = fx.connects(2);
    assert_eq!(names.get("b2"), Some(&2));
    let v = fx.client(&["udp", &VIP.to_string(), &UDP_PORT.to_string()]);
    assert_eq!(v["unconnected"]["name"], "b3", "{v}");

    let connect = format!(
        "socket lb connect: {VIP}:{TCP_PORT} -> backend {}:{BACKEND_TCP_PORT}",
        backend_ip(2)
    );
    let sendmsg = format!(
        "socket lb sendmsg: {VIP}:{UDP_PORT} -> backend {}:{BACKEND_UDP_PORT}",
        backend_ip(3)
    );
    let all = records.wait_for(&[&connect, &sendmsg]);
    eprintln!("{all:#?}");
    let connects: Vec<&String> = all.iter().filter(|r| r.contains(&connect)).collect();
    assert_eq!(connects.len(), 2, "one per TCP connect: {all:#?}");
    assert!(connects.iter().all(|r| r.starts_with("DEBUG")), "{all:#?}");
    assert!(all.iter().any(|r| r.contains(&sendmsg)), "{all:#?}");

    // Off, the verifier removed the logging code (DEBUG is a read-only global it knows):
    // the hot path is what it was before debug records existed.
    let off = fx.load();
    for prog in [
        skiff_common::lb::LB_CONNECT4_PROG,
        skiff_common::lb::LB_SENDMSG6_PROG,
        skiff_common::lb::NP_INGRESS_PROG,
    ] {
        let (without, with) = (off.translated_size(prog), lb.translated_size(prog));
        eprintln!("{prog}: {without:?} bytes translated without debug, {with:?} with");
        assert!(
            matches!((without, with), (Some(a), Some(b)) if a < b),
            "{prog}: {without:?} vs {with:?}"
        );
    }
    drop(lb);
}
