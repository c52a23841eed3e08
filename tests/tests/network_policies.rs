//! NetworkPolicy enforced by the agents' eBPF programs, checked the way Kubernetes' own
//! network-policy conformance tests do (test/e2e/network/netpol): pods a, b and c in
//! namespaces x, y and z (on two nodes, so half the pairs cross nodes), every pair probed on
//! TCP and UDP ports 80 and 81 from inside the source pod, and the whole reachability matrix
//! compared with the expected one, for each of more than twenty policies covering each rule
//! kind: default deny per direction, pod and namespace selectors alone, together (AND) and
//! as separate peers (OR), ipBlock with except, ports, named ports, endPort, protocols,
//! egress to DNS only, several policies adding up, and removal restoring access. Policies are
//! applied with the real kubectl. All traffic stays inside the test's namespaces.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(120);
const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];

/// Serves TCP (echo) and UDP (echo) on ports 80 and 81.
const SERVER: &str = r#"
import socket, threading
def tcp(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(128)
    while True:
        c, _ = s.accept()
        def echo(c=c):
            try:
                c.settimeout(30)
                while True:
                    b = c.recv(64)
                    if not b: break
                    c.sendall(b)
            except Exception:
                pass
            c.close()
        threading.Thread(target=echo, daemon=True).start()
def udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port))
    while True:
        b, a = s.recvfrom(64); s.sendto(b, a)
for p in (80, 81):
    threading.Thread(target=tcp, args=(p,), daemon=True).start()
    threading.Thread(target=udp, args=(p,), daemon=True).start()
threading.Event().wait()
"#;

/// Probes every `ip:port/proto` argument at once (1 s each) and prints one 1/0 per target.
/// `dns` probes kube-dns (10.96.0.10:53, UDP) with a real query.
const PROBE: &str = r#"
import socket, struct, sys, threading
res = {}
def probe(i, t):
    ok = False
    try:
        if t == "dns":
            q = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"".join(
                bytes([len(p)]) + p.encode() for p in "kubernetes.default.svc.cluster.local".split(".")
            ) + b"\0" + struct.pack(">HH", 1, 1)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
            s.sendto(q, ("10.96.0.10", 53)); ok = s.recvfrom(512)[0][:2] == q[:2]
        else:
            addr, proto = t.split("/"); ip, port = addr.split(":")
            if proto == "tcp":
                s = socket.create_connection((ip, int(port)), timeout=1)
                s.settimeout(1); s.sendall(b"p"); ok = s.recv(8) == b"p"
            else:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
                s.sendto(b"p", (ip, int(port))); ok = s.recvfrom(8)[0] == b"p"
            s.close()
    except Exception:
        ok = False
    res[i] = ok
ts = [threading.Thread(target=probe, args=(i, t)) for i, t in enumerate(sys.argv[1:])]
for t in ts: t.start()
for t in ts: t.join()
print("".join("1" if res[i] else "0" for i in range(len(ts))))
"#;

/// Sends a UDP datagram to argv[1]:80 every 2 ms (waiting 3 ms for the echo) for at most
/// argv[2] seconds; prints the wall-clock time it started and that of the first answer (or
/// "none"). Started while the pod is denied, it tells when an allowing policy took effect.
const FIRST_ANSWER: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.003)
end = time.time() + float(sys.argv[2])
print("%.6f" % time.time(), flush=True)
while time.time() < end:
    try:
        s.sendto(b"q", (sys.argv[1], 80)); s.recvfrom(8)
        print("%.6f" % time.time(), flush=True); sys.exit(0)
    except socket.timeout:
        time.sleep(0.002)
print("none", flush=True)
"#;

/// Holds one TCP connection to argv[1]:80 for argv[2] seconds, a round trip every 50 ms;
/// prints "<round trips> <failures>".
const HOLD: &str = r#"
import socket, sys, time
c = socket.create_connection((sys.argv[1], 80), timeout=1)
end = time.time() + float(sys.argv[2]); n = f = 0
while time.time() < end:
    try:
        c.sendall(b"h"); ok = c.recv(8) == b"h"
    except Exception:
        ok = False
    n += 1; f += 0 if ok else 1
    time.sleep(0.05)
print(n, f, flush=True)
"#;

/// A pod of the matrix: (namespace, name).
type P = (&'static str, &'static str);

/// One probe target kind: protocol and port.
const TARGETS: [(&str, u16); 4] = [("tcp", 80), ("tcp", 81), ("udp", 80), ("udp", 81)];

fn all_pods() -> Vec<P> {
    NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |p| (*ns, *p)))
        .collect()
}

fn pod_manifest(ns: &str, name: &str, node: &str) -> serde_json::Value {
    let port = |n: u16, proto: &str| json!({"name": format!("serve-{n}-{}", proto.to_lowercase()), "containerPort": n, "protocol": proto});
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "labels": {"pod": name}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "cont-80-81", "image": "host",
                "command": ["python3", "-c", SERVER],
                "ports": [port(80, "TCP"), port(81, "TCP"), port(80, "UDP"), port(81, "UDP")],
            }],
        },
    })
}

struct Matrix<'a> {
    c: &'a Cluster,
    ips: BTreeMap<P, String>,
}

/// Reachability: (from, to, proto, port) → allowed.
type Reach = BTreeMap<(P, P, &'static str, u16), bool>;

impl Matrix<'_> {
    /// Probes every pair from inside each source pod (all sources at once).
    fn probe(&self) -> Reach {
        let targets: Vec<(P, &str, u16)> = all_pods()
            .into_iter()
            .flat_map(|to| TARGETS.iter().map(move |(proto, port)| (to, *proto, *port)))
            .collect();
        let args: Vec<String> = targets
            .iter()
            .map(|(to, proto, port)| format!("{}:{port}/{proto}", self.ips[to]))
            .collect();
        let rows: Vec<(P, String)> = std::thread::scope(|s| {
            let handles: Vec<_> = all_pods()
                .into_iter()
                .map(|from| {
                    let args = &args;
                    s.spawn(move || {
                        let mut cmd: Vec<&str> =
                            vec!["exec", "-n", from.0, from.1, "--", "python3", "-c", PROBE];
                        cmd.extend(args.iter().map(String::as_str));
                        let (ok, out, err) = self.c.kubectl(&cmd, None);
                        assert!(ok, "probe from {}/{}: {err}", from.0, from.1);
                        (from, out.trim().to_string())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut reach = Reach::new();
        for (from, row) in rows {
            assert_eq!(row.len(), targets.len(), "probe output {row:?}");
            for ((to, proto, port), bit) in targets.iter().zip(row.chars()) {
                reach.insert((from, *to, proto_static(proto), *port), bit == '1');
            }
        }
        reach
    }

    /// Probes until the matrix is `expect`'s (policies apply within milliseconds; probes
    /// are retried, as Kubernetes' tests do, only for slow machines), else fails with the
    /// truth table of the differences.
    fn check(&self, case: &str, expect: impl Fn(P, P, &str, u16) -> bool) {
        let mut last = String::new();
        for attempt in 0..3 {
            let got = self.probe();
            let wrong: Vec<String> = got
                .iter()
                .filter(|((from, to, proto, port), ok)| {
                    **ok != (from == to || expect(*from, *to, proto, *port))
                })
                .map(|((from, to, proto, port), ok)| {
                    format!(
                        "{}/{} -> {}/{} {proto}/{port}: got {}, want {}",
                        from.0,
                        from.1,
                        to.0,
                        to.1,
                        if *ok { "allowed" } else { "denied" },
                        if *ok { "denied" } else { "allowed" },
                    )
                })
                .collect();
            if wrong.is_empty() {
                eprintln!(
                    "{case}: all {} probes as expected (attempt {attempt})",
                    got.len()
                );
                return;
            }
            last = wrong.join("\n");
            std::thread::sleep(Duration::from_secs(1));
        }
        panic!(
            "{case}: the reachability matrix differs:\n{last}\n{}\n{}",
            self.c.logs(),
            self.c.agent_logs()
        );
    }

    /// From `from`, whether kube-dns answers.
    fn dns(&self, from: P) -> bool {
        let (ok, out, err) = self.c.kubectl(
            &[
                "exec", "-n", from.0, from.1, "--", "python3", "-c", PROBE, "dns",
            ],
            None,
        );
        assert!(ok, "{err}");
        out.trim() == "1"
    }
}

fn proto_static(p: &str) -> &'static str {
    if p == "tcp" { "tcp" } else { "udp" }
}

fn apply(c: &Cluster, doc: serde_json::Value) {
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&doc.to_string()));
    assert!(ok, "{err}");
}

fn policy(ns: &str, name: &str, spec: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

fn clear(c: &Cluster) {
    for ns in NAMESPACES {
        let (ok, _, err) = c.kubectl(&["delete", "networkpolicy", "--all", "-n", ns], None);
        assert!(ok, "{err}");
    }
}

/// One case: apply `policies` (after removing every earlier one) and compare.
fn case(
    m: &Matrix<'_>,
    name: &str,
    policies: &[serde_json::Value],
    expect: impl Fn(P, P, &str, u16) -> bool,
) {
    clear(m.c);
    for p in policies {
        apply(m.c, p.clone());
    }
    m.check(name, expect);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_policies_match_the_kubernetes_reachability_matrix() {
    let c = Cluster::start(2).await;
    for ns in NAMESPACES {
        apply(
            &c,
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": ns, "labels": {"ns": ns}}}),
        );
    }
    for (i, (ns, pod)) in all_pods().into_iter().enumerate() {
        apply(&c, pod_manifest(ns, pod, &c.nodes[i % 2].name));
    }
    for ns in NAMESPACES {
        let (ok, _, err) = c.kubectl(
            &[
                "wait",
                "--for=condition=Ready",
                "pod",
                "--all",
                "-n",
                ns,
                "--timeout=120s",
            ],
            None,
        );
        assert!(ok, "{err}\n{}", c.logs());
    }
    let mut ips = BTreeMap::new();
    for (ns, pod) in all_pods() {
        let (ok, ip, err) = c.kubectl(
            &[
                "get",
                "pod",
                "-n",
                ns,
                pod,
                "-o",
                "jsonpath={.status.podIP}",
            ],
            None,
        );
        assert!(ok && !ip.is_empty(), "{err}");
        ips.insert((ns, pod), ip);
    }
    let m = Matrix { c: &c, ips };
    // The servers listen before Ready is reported? Not necessarily: wait for full reach.
    skiff_testkit::eventually_blocking("every server reachable", T, || {
        m.probe().values().all(|ok| *ok).then_some(())
    });
    let xa: P = ("x", "a");
    let cidr_of = |p: P| format!("{}/32", m.ips[&p]);
    let started = Instant::now();

    // 1-3: default deny per direction and both.
    case(
        &m,
        "default-deny ingress in x",
        &[policy(
            "x",
            "deny-in",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        )],
        |_, to, _, _| to.0 != "x",
    );
    case(
        &m,
        "default-deny egress in x",
        &[policy(
            "x",
            "deny-out",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        )],
        |from, _, _, _| from.0 != "x",
    );
    case(
        &m,
        "default-deny both in x",
        &[policy(
            "x",
            "deny-all",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        )],
        |from, to, _, _| from.0 != "x" && to.0 != "x",
    );
    // 4: allow by pod label (the policy's namespace only).
    case(
        &m,
        "x/a from pod=b",
        &[policy(
            "x",
            "allow-b",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        )],
        |from, to, _, _| to != xa || from == ("x", "b"),
    );
    // 5: by namespace label.
    case(
        &m,
        "x/a from ns=y",
        &[policy(
            "x",
            "allow-y",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
        )],
        |from, to, _, _| to != xa || from.0 == "y",
    );
    // 6: both in one peer (AND).
    case(
        &m,
        "x/a from ns=y AND pod=c",
        &[policy(
            "x",
            "allow-yc",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "c"}}}]}]}),
        )],
        |from, to, _, _| to != xa || from == ("y", "c"),
    );
    // 7: separate peers (OR).
    case(
        &m,
        "x/a from ns=y OR pod=c",
        &[policy(
            "x",
            "allow-y-or-c",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}, {"podSelector": {"matchLabels": {"pod": "c"}}}]}]}),
        )],
        |from, to, _, _| to != xa || from.0 == "y" || from == ("x", "c"),
    );
    // 8: the namespace name label every namespace carries, with matchExpressions.
    case(
        &m,
        "x/a from namespaces not y",
        &[policy(
            "x",
            "not-y",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["y"]}]}}]}]}),
        )],
        |from, to, _, _| to != xa || from.0 != "y",
    );
    // 9: one port.
    case(
        &m,
        "x/a on TCP 80 only",
        &[policy(
            "x",
            "tcp80",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": 80}]}]}),
        )],
        |_, to, proto, port| to != xa || (proto == "tcp" && port == 80),
    );
    // 10: UDP.
    case(
        &m,
        "x/a on UDP 81 only",
        &[policy(
            "x",
            "udp81",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"protocol": "UDP", "port": 81}]}]}),
        )],
        |_, to, proto, port| to != xa || (proto == "udp" && port == 81),
    );
    // 11: a named port (the selected pod's container port).
    case(
        &m,
        "x/a on named port serve-81-tcp",
        &[policy(
            "x",
            "named",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": "serve-81-tcp"}]}]}),
        )],
        |_, to, proto, port| to != xa || (proto == "tcp" && port == 81),
    );
    // 12: endPort, from pod=b of every namespace.
    case(
        &m,
        "x/a TCP 80-81 from any pod=b",
        &[policy(
            "x",
            "range",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}],
                         "ports": [{"port": 80, "endPort": 81}]}]}),
        )],
        |from, to, proto, _| to != xa || (from.1 == "b" && proto == "tcp"),
    );
    // 13: ipBlock with except (pod addresses are in the block).
    let except = cidr_of(("y", "b"));
    case(
        &m,
        "x/a from 10.244.0.0/16 except y/b",
        &[policy(
            "x",
            "block",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": [except]}}]}]}),
        )],
        |from, to, _, _| to != xa || from != ("y", "b"),
    );
    // 14: egress to a namespace.
    case(
        &m,
        "x/a egress to ns=z",
        &[policy(
            "x",
            "to-z",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}]}]}),
        )],
        |from, to, _, _| from != xa || to.0 == "z",
    );
    // 15: egress to a named port of the peers (UDP 80 on pod=b pods).
    case(
        &m,
        "x/a egress to pod=b on serve-80-udp",
        &[policy(
            "x",
            "to-b-udp",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}], "ports": [{"protocol": "UDP", "port": "serve-80-udp"}]}]}),
        )],
        |from, to, proto, port| from != xa || (to.1 == "b" && proto == "udp" && port == 80),
    );
    // 16: egress ipBlock with except.
    let except_zc = cidr_of(("z", "c"));
    case(
        &m,
        "x/a egress to 10.244.0.0/16 except z/c",
        &[policy(
            "x",
            "to-block",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": [except_zc]}}]}]}),
        )],
        |from, to, _, _| from != xa || to != ("z", "c"),
    );
    // 17: egress to DNS only: nothing of the matrix, but kube-dns answers.
    case(
        &m,
        "x/a egress to DNS only",
        &[policy(
            "x",
            "dns-only",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
            "egress": [{"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]}),
        )],
        |from, _, _, _| from != xa,
    );
    assert!(m.dns(xa), "DNS was not allowed by the egress-to-DNS policy");
    // 18: the usual DNS rule, by kube-dns' namespace and labels.
    case(
        &m,
        "x/a egress to kube-dns pods only",
        &[policy(
            "x",
            "kube-dns",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                        "ports": [{"protocol": "UDP", "port": 53}]}]}),
        )],
        |from, _, _, _| from != xa,
    );
    assert!(
        m.dns(xa),
        "DNS was not allowed by the kube-dns egress policy"
    );
    // ... and a default deny of egress denies DNS too.
    clear(&c);
    apply(
        &c,
        policy(
            "x",
            "deny-out",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        ),
    );
    skiff_testkit::eventually_blocking("DNS denied by default-deny egress", T, || {
        (!m.dns(xa)).then_some(())
    });
    // 19: policies add up.
    case(
        &m,
        "x/a from x/b plus from y/c",
        &[
            policy(
                "x",
                "from-b",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
            ),
            policy(
                "x",
                "from-yc",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "c"}}}]}]}),
            ),
        ],
        |from, to, _, _| to != xa || from == ("x", "b") || from == ("y", "c"),
    );
    // 20: allow-all next to deny-all: allowed.
    case(
        &m,
        "deny-all plus allow-all ingress in x",
        &[
            policy(
                "x",
                "deny-in",
                json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
            ),
            policy(
                "x",
                "allow-all",
                json!({"podSelector": {}, "ingress": [{}]}),
            ),
        ],
        |_, _, _, _| true,
    );
    // 21: both directions must allow: x/b egress only to x/a, x/a ingress only from x/b.
    case(
        &m,
        "x/b egress to x/a and x/a ingress from x/b",
        &[
            policy(
                "x",
                "b-out",
                json!({"podSelector": {"matchLabels": {"pod": "b"}}, "policyTypes": ["Egress"],
                "egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
            ),
            policy(
                "x",
                "a-in",
                json!({"podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
            ),
        ],
        |from, to, _, _| {
            let b_ok = from != ("x", "b") || to == xa;
            let a_ok = to != xa || from == ("x", "b");
            b_ok && a_ok
        },
    );
    // 22: policyTypes Ingress only: its egress rules are ignored.
    case(
        &m,
        "Ingress-only policy with egress rules",
        &[policy(
            "y",
            "in-only",
            json!({"podSelector": {"matchLabels": {"pod": "c"}}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}]}],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "nobody"}}}]}]}),
        )],
        |from, to, _, _| to != ("y", "c") || from.0 == "z",
    );
    // 23: SCTP only: every TCP and UDP probe to x/a is denied (SCTP itself is unit-tested:
    // this kernel has no SCTP sockets).
    case(
        &m,
        "x/a on SCTP 80 only",
        &[policy(
            "x",
            "sctp",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"protocol": "SCTP", "port": 80}]}]}),
        )],
        |_, to, _, _| to != xa,
    );
    // 24: removal restores access.
    case(&m, "every policy removed", &[], |_, _, _, _| true);
    eprintln!("24 cases in {:?}", started.elapsed());

    observe_names_denied_and_balanced_flows(&m);

    // How soon a policy applies after the API acknowledged its write, and an established
    // connection that stays allowed survives its pod becoming isolated.
    let latencies = apply_latencies(&m).await;
    let mut sorted = latencies.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    eprintln!("policy write acknowledged -> new flows allowed: {latencies:?} (median {median:?})");
    assert!(
        median <= Duration::from_millis(100),
        "policies applied in {latencies:?}, median {median:?} > 100 ms"
    );
    assert!(
        sorted.iter().all(|d| *d < Duration::from_secs(1)),
        "{latencies:?}"
    );
}

/// `skiff observe -f -o json` across both nodes: a connection a policy denies shows with the
/// policy's name, one to a ClusterIP with its Service's name, each on the user's terminal
/// within a second of the kernel seeing it; filters select.
fn observe_names_denied_and_balanced_flows(m: &Matrix<'_>) {
    use std::io::BufRead as _;
    let c = m.c;
    clear(c);
    apply(
        c,
        policy(
            "x",
            "deny-in",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        ),
    );
    apply(
        c,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "z", "name": "web"},
               "spec": {"selector": {"pod": "c"}, "ports": [{"port": 8080, "targetPort": 80}]}}),
    );
    let (ok, vip, err) = c.kubectl(
        &[
            "get",
            "svc",
            "-n",
            "z",
            "web",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
        None,
    );
    assert!(ok && !vip.is_empty(), "{err}");
    let target = format!("{vip}:8080/tcp");
    let probe = |from: P, target: &str| {
        let (ok, out, err) = c.kubectl(
            &[
                "exec", "-n", from.0, from.1, "--", "python3", "-c", PROBE, target,
            ],
            None,
        );
        assert!(ok, "{err}");
        out.trim() == "1"
    };
    skiff_testkit::eventually_blocking("the Service reachable", T, || {
        probe(("y", "b"), &target).then_some(())
    });
    let denied_at = |r: &serde_json::Value| {
        r["verdict"] == "denied"
            && r["destination"]["namespace"] == "x"
            && r["destination"]["pod"] == "a"
            && r["destination"]["port"] == 80
            && r["source"]["pod"] == "a"
            && r["source"]["namespace"] == "y"
    };
    let mut observe = c.server.skiff_cmd(&["observe", "-f", "-o", "json"]);
    observe.stdout(std::process::Stdio::piped());
    let mut observe = observe.spawn().unwrap();
    let out = observe.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<(std::time::SystemTime, serde_json::Value)>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str(&line)
                && tx.send((std::time::SystemTime::now(), v)).is_err()
            {
                break;
            }
        }
    });
    // Denied by x's default deny; allowed to z/web through its ClusterIP. (Records of the
    // cases before are in the agents' logs too: only later ones count.)
    let since = std::time::SystemTime::now();
    assert!(!probe(
        ("y", "a"),
        &format!("{}:80/tcp", m.ips[&("x", "a")])
    ));
    assert!(probe(("y", "b"), &target));
    let mut seen_denied = None;
    let mut seen_service = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while (seen_denied.is_none() || seen_service.is_none()) && Instant::now() < deadline {
        let Ok((arrived, r)) = rx.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        let at: chrono::DateTime<chrono::Utc> = r["time"].as_str().unwrap().parse().unwrap();
        if std::time::SystemTime::from(at) < since {
            continue;
        }
        let delay = arrived
            .duration_since(std::time::SystemTime::from(at))
            .unwrap_or_default();
        if seen_denied.is_none() && denied_at(&r) {
            assert_eq!(r["policy"], "x/deny-in", "{r}");
            seen_denied = Some(delay);
        }
        if seen_service.is_none()
            && r["service"] == "z/web:8080"
            && r["source"]["pod"] == "b"
            && r["source"]["namespace"] == "y"
        {
            assert_eq!(r["verdict"], "allowed", "{r}");
            assert_eq!(r["destination"]["pod"], "c", "{r}");
            seen_service = Some(delay);
        }
    }
    let _ = observe.kill();
    let _ = observe.wait();
    let (Some(denied), Some(service)) = (seen_denied, seen_service) else {
        panic!(
            "skiff observe did not show both flows (denied: {seen_denied:?}, service: \
             {seen_service:?})\n{}",
            c.agent_logs()
        );
    };
    eprintln!("skiff observe: the denied flow after {denied:?}, the Service's after {service:?}");
    assert!(denied < Duration::from_secs(1) && service < Duration::from_secs(1));
    // Filters: only denied flows of namespace x.
    let out = c
        .server
        .skiff(&["observe", "-n", "x", "--verdict", "denied", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.iter().any(denied_at), "{lines:?}");
    assert!(lines.iter().all(|r| r["verdict"] == "denied"), "{lines:?}");
    // The table names both ends and the policy.
    let out = c
        .server
        .skiff(&["observe", "--pod", "x/a", "--verdict", "denied"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("TIME"), "{table}");
    assert!(
        table.lines().any(|l| l.contains("DENIED")
            && l.contains("y/a:")
            && l.contains("x/a:80")
            && l.ends_with("x/deny-in")),
        "{table}"
    );
    let (ok, _, err) = c.kubectl(&["delete", "svc", "-n", "z", "web"], None);
    assert!(ok, "{err}");
}

/// Five times: x/a denied by default-deny ingress, a prober in x/b sending to it, then an
/// allowing policy written through the API; the time from the write's acknowledgement to the
/// first answer the prober gets. Meanwhile z/b holds a TCP connection to x/a that the
/// policies allow throughout: it must never fail.
async fn apply_latencies(m: &Matrix<'_>) -> Vec<Duration> {
    use skiff_api::api::NetworkPolicy;
    clear(m.c);
    let allow_z: NetworkPolicy = serde_json::from_value(policy(
        "x",
        "from-z",
        json!({
        "podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}]}]}),
    ))
    .unwrap();
    let api = m.c.client.namespaced::<NetworkPolicy>("x");
    api.create(&allow_z).await.unwrap();
    let xa_ip = m.ips[&("x", "a")].clone();
    let hold = {
        let (c, ip) = (m.c.server.kubectl_cmd(&[]), xa_ip.clone());
        drop(c);
        let mut cmd = m.c.server.kubectl_cmd(&[
            "exec", "-n", "z", "b", "--", "python3", "-c", HOLD, &ip, "12",
        ]);
        cmd.stdout(std::process::Stdio::piped());
        cmd.spawn().unwrap()
    };
    let allow_b: NetworkPolicy = serde_json::from_value(policy(
        "x",
        "from-b",
        json!({
        "podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ))
    .unwrap();
    let mut out = Vec::new();
    for _ in 0..5 {
        // Denied: only z may reach x/a.
        let mut prober = m.c.server.kubectl_cmd(&[
            "exec",
            "-n",
            "x",
            "b",
            "--",
            "python3",
            "-c",
            FIRST_ANSWER,
            &xa_ip,
            "5",
        ]);
        prober.stdout(std::process::Stdio::piped());
        let prober = prober.spawn().unwrap();
        // Exec output may arrive only when the command ends: the prober prints when it
        // started, so the measurement is only taken when it was already sending (denied)
        // before the write.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        api.create(&allow_b).await.unwrap();
        let acked = std::time::SystemTime::now();
        let output = prober.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        let times: Vec<f64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        let [started, first] = times[..] else {
            let log = m.c.server.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            panic!(
                "no answer: {text}\n{}\n--- server ---\n{tail}",
                m.c.agent_logs()
            )
        };
        let at = |t: f64| std::time::UNIX_EPOCH + Duration::from_secs_f64(t);
        assert!(at(started) < acked, "the prober started after the write");
        let first = at(first);
        out.push(first.duration_since(acked).unwrap_or_default());
        api.delete("from-b", &Default::default()).await.unwrap();
        // Denied again before the next round.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let held = hold.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&held.stdout);
    let (trips, failures) = text.trim().split_once(' ').unwrap_or(("0", "?"));
    eprintln!("held connection z/b -> x/a: {trips} round trips, {failures} failures");
    assert_eq!(
        failures, "0",
        "the established, allowed connection broke: {text}"
    );
    assert!(trips.parse::<u32>().unwrap_or(0) > 20, "{text}");
    api.delete("from-z", &Default::default()).await.unwrap();
    out
}
