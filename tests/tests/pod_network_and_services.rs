//! Pod networking and Services, end to end: nodes in network namespaces of their own,
//! joined by a bridge in another namespace; pods reach pods on other nodes by their own
//! addresses, and nothing on the way translates them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::time::Duration;

use skiff_api::api::{Endpoints, Pod, Service};
use skiff_tests::cluster::Cluster;
use skiff_tests::eventually_within;

const T: Duration = Duration::from_secs(60);

/// A TCP server that tells each client the address it sees it from, then closes.
const ECHO_PEER: &str = "import socket\n\
s = socket.socket()\n\
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
s.bind(('0.0.0.0', 8080))\n\
s.listen(16)\n\
while True:\n    \
    c, a = s.accept()\n    \
    c.sendall(('seen-as ' + a[0] + '\\n').encode())\n    \
    c.close()\n";

/// A client that asks `ip:8080` (bounded retries) and prints the answer.
fn ask(ip: &str) -> String {
    format!(
        "import socket, time, sys\n\
         for _ in range(120):\n    \
             try:\n        \
                 c = socket.create_connection(('{ip}', 8080), timeout=1)\n        \
                 print(c.recv(100).decode().strip(), flush=True)\n        \
                 break\n    \
             except Exception as e:\n        \
                 print('retry', e, flush=True); time.sleep(0.25)\n\
         time.sleep(3600)\n"
    )
}

fn pod(name: &str, node: &str, script: &str) -> String {
    let script = serde_json::to_string(script).expect("a JSON string");
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: host
      command: ["python3", "-c", {script}]
"#
    )
}

async fn running_ip(c: &Cluster, name: &str) -> (String, String) {
    let pods = c.client.namespaced::<Pod>("default");
    eventually_within(&format!("{name} running"), T, || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        let s = p.status.clone().unwrap_or_default();
        let node = p.spec.map(|s| s.node_name).unwrap_or_default();
        if s.phase == "Running" && !s.pod_ip.is_empty() {
            Ok((s.pod_ip, node))
        } else {
            Err(format!("{s:?}; {}", c.logs()))
        }
    })
    .await
}

/// A pod on one node reaches a pod on another by its pod IP, through the nodes' direct routes
/// over the shared segment, and the server sees the client's own pod IP (no NAT); the eBPF
/// fast path's counters show it carried the traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_reach_pods_on_other_nodes_without_nat() {
    let c = Cluster::start(2).await;
    let (n0, n1) = (c.nodes[0].name.clone(), c.nodes[1].name.clone());
    // Each node routes the other's pod CIDR through the other's fabric address.
    for (node, other) in [(&c.nodes[0], &c.nodes[1]), (&c.nodes[1], &c.nodes[0])] {
        let via = format!("via {}", other.node_ip);
        eventually_within("a route to the other node's pods", T, || async {
            let routes = node.ip(&["route", "show"]);
            routes
                .lines()
                .any(|l| l.starts_with("10.244.") && l.contains(&via))
                .then_some(())
                .ok_or(routes)
        })
        .await;
    }

    c.server
        .skiff_stdin(&["apply", "-f", "-"], &pod("server", &n0, ECHO_PEER));
    let (server_ip, server_node) = running_ip(&c, "server").await;
    assert_eq!(server_node, n0);
    c.server
        .skiff_stdin(&["apply", "-f", "-"], &pod("client", &n1, &ask(&server_ip)));
    let (client_ip, client_node) = running_ip(&c, "client").await;
    assert_eq!(client_node, n1);
    assert_ne!(
        server_ip.rsplit_once('.').map(|p| p.0),
        client_ip.rsplit_once('.').map(|p| p.0),
        "the pods are in different node CIDRs"
    );
    let seen = eventually_within("the client got an answer", T, || async {
        let out = c.server.skiff(&["logs", "client"]);
        let log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.lines()
            .find_map(|l| l.strip_prefix("seen-as "))
            .map(str::to_string)
            .ok_or(log)
    })
    .await;
    assert_eq!(seen, client_ip, "the server saw the client's own pod IP");

    // The eBPF fast path carried it: out of the client's node with fib + redirect_neigh, into
    // the server with redirect_peer; `skiff bpf pods` lists the server on its node.
    let out = c.skiff(&["bpf", "pods", "-o", "json"]);
    let dumps: serde_json::Value = serde_json::from_str(&out).expect("JSON from skiff bpf pods");
    let dump = |node: &str| {
        dumps
            .as_array()
            .and_then(|a| a.iter().find(|d| d["node"] == node))
            .cloned()
            .unwrap_or_else(|| panic!("no dump of {node}: {out}"))
    };
    let (d0, d1) = (dump(&n0), dump(&n1));
    assert!(
        d0["pods"].as_array().is_some_and(|p| p.iter().any(|p| {
            p["ip"] == server_ip
                && p["name"] == "server"
                && p["network"]["rx_bytes"].as_u64() > Some(0)
        })),
        "the server's endpoint on {n0}, with the traffic it received: {out}"
    );
    assert!(
        d1["fastPath"]["redirectNeigh"].as_u64() > Some(0),
        "the client's node forwarded with redirect_neigh: {out}"
    );
    assert!(
        d0["fastPath"]["redirectPeer"].as_u64() > Some(0),
        "the server's node delivered with redirect_peer: {out}"
    );
    let table = c.skiff(&["bpf", "pods", "--node", &n0]);
    assert!(
        table.contains("default/server") && table.contains("REDIRECT PEER"),
        "{table}"
    );
    c.skiff(&["bpf", "conntrack"]);

    // Nothing of this went through (or created) an iptables or nftables rule.
    for node in &c.nodes {
        assert_eq!(
            node.firewall_rules(),
            "",
            "firewall rules in {}",
            node.netns
        );
    }
}

/// Backend: answers every TCP connection on 8080 and every UDP datagram on 8081 with its own
/// address (as the server sees it), so a client can tell the backends apart.
const BACKEND: &str = "import socket, threading\n\
def udp():\n    \
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    \
    u.bind(('0.0.0.0', 8081))\n    \
    while True:\n        \
        d, a = u.recvfrom(100)\n        \
        u.sendto(b'udp', a)\n\
threading.Thread(target=udp, daemon=True).start()\n\
def echo(c):\n    \
    while True:\n        \
        d = c.recv(100)\n        \
        if not d: break\n        \
        c.sendall(d)\n\
def streams():\n    \
    e = socket.socket()\n    \
    e.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n    \
    e.bind(('0.0.0.0', 8082))\n    \
    e.listen(16)\n    \
    while True:\n        \
        c, a = e.accept()\n        \
        threading.Thread(target=echo, args=(c,), daemon=True).start()\n\
threading.Thread(target=streams, daemon=True).start()\n\
s = socket.socket()\n\
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
s.bind(('0.0.0.0', 8080))\n\
s.listen(64)\n\
while True:\n    \
    c, a = s.accept()\n    \
    c.sendall(c.getsockname()[0].encode())\n    \
    c.close()\n";

/// A Service of type `ty` in front of the `echo` Deployment: TCP 80 → 8080 and UDP 53 →
/// 8081, and with `stream` TCP 81 → 8082.
fn echo_service(name: &str, ty: &str, stream: bool) -> String {
    let stream = if stream {
        "    - name: stream\n      port: 81\n      targetPort: stream\n      protocol: TCP\n"
    } else {
        ""
    };
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: {name}
spec:
  type: {ty}
  selector:
    app: echo
  ports:
    - name: tcp
      port: 80
      targetPort: tcp
      protocol: TCP
    - name: udp
      port: 53
      targetPort: udp
      protocol: UDP
{stream}"#
    )
}

fn echo_app(replicas: i32) -> String {
    let script = serde_json::to_string(BACKEND).expect("a JSON string");
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: echo
spec:
  replicas: {replicas}
  selector:
    matchLabels:
      app: echo
  template:
    metadata:
      labels:
        app: echo
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: main
          image: host
          command: ["python3", "-c", {script}]
          ports:
            - name: tcp
              containerPort: 8080
              protocol: TCP
            - name: udp
              containerPort: 8081
              protocol: UDP
            - name: stream
              containerPort: 8082
              protocol: TCP
---
{service}"#,
        service = echo_service("echo", "ClusterIP", true)
    )
}

/// A client pod that runs `script` once (its result on one line starting `RESULT `), then
/// sleeps; on node `node` if given.
fn client_pod_on(name: &str, node: Option<&str>, script: &str) -> String {
    let selector = node
        .map(|n| format!("  nodeSelector:\n    kubernetes.io/hostname: {n}\n"))
        .unwrap_or_default();
    let script = serde_json::to_string(&format!("{script}\nimport time\ntime.sleep(3600)\n"))
        .expect("a JSON string");
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
{selector}  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: host
      command: ["python3", "-c", {script}]
"#
    )
}

/// Runs a client pod and returns the JSON it printed after `RESULT `.
async fn client_result(c: &Cluster, name: &str, script: &str) -> serde_json::Value {
    client_result_on(c, name, None, script).await
}

async fn client_result_on(
    c: &Cluster,
    name: &str,
    node: Option<&str>,
    script: &str,
) -> serde_json::Value {
    c.server
        .skiff_stdin(&["apply", "-f", "-"], &client_pod_on(name, node, script));
    eventually_within(&format!("{name}'s result"), T, || async {
        let out = c.server.skiff(&["logs", name]);
        let log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .and_then(|j| serde_json::from_str(j).ok())
            .ok_or_else(|| format!("log: {log}; {}", String::from_utf8_lossy(&out.stderr)))
    })
    .await
}

async fn ready_backends(c: &Cluster, n: usize) -> Vec<String> {
    let eps = c.client.namespaced::<Endpoints>("default");
    eventually_within(&format!("{n} ready endpoints"), T, || async {
        let e = eps.get_opt("echo").await.map_err(|e| e.to_string())?;
        let ips: Vec<String> = e
            .iter()
            .flat_map(|e| e.subsets.iter())
            .flat_map(|s| s.addresses.iter())
            .map(|a| a.ip.clone())
            .collect();
        (ips.len() == n)
            .then_some(ips.clone())
            .ok_or(format!("{ips:?}"))
    })
    .await
}

/// ClusterIP Services through the eBPF socket load balancer: 300 TCP connects from a pod to
/// clusterIP:port spread over all three backends, getpeername() says the clusterIP, UDP
/// answers through the VIP; with no backends a connect fails at once; scaled back up it
/// works again; no firewall rule anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_ip_services_balance_over_all_backends() {
    let c = Cluster::start(3).await;
    c.server.skiff_stdin(&["apply", "-f", "-"], &echo_app(3));
    let backends = ready_backends(&c, 3).await;
    let svc = c.client.namespaced::<Service>("default");
    let vip = eventually_within("a clusterIP", T, || async {
        let s = svc.get("echo").await.map_err(|e| e.to_string())?;
        s.spec
            .map(|s| s.cluster_ip)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| "none yet".to_string())
    })
    .await;

    let result = client_result(
        &c,
        "c1",
        &format!(
            "import socket, json, collections, time\n\
             vip = '{vip}'\n\
             seen = collections.Counter(); peer = None; errors = 0\n\
             deadline = time.time() + 30\n\
             while sum(seen.values()) < 300 and time.time() < deadline:\n    \
                 try:\n        \
                     s = socket.create_connection((vip, 80), timeout=2)\n        \
                     peer = s.getpeername()\n        \
                     seen[s.recv(64).decode()] += 1\n        \
                     s.close()\n    \
                 except Exception:\n        \
                     errors += 1; time.sleep(0.1)\n\
             u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)\n\
             u.sendto(b'x', (vip, 53)); udp_reply, udp_from = u.recvfrom(100)\n\
             uc = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); uc.settimeout(2)\n\
             uc.connect((vip, 53)); uc.send(b'x'); uc.recv(100); udp_peer = uc.getpeername()\n\
             print('RESULT ' + json.dumps({{'seen': seen, 'peer': list(peer), 'errors': errors, \
             'udp_from': list(udp_from), 'udp_peer': list(udp_peer)}}), flush=True)\n"
        ),
    )
    .await;
    let seen = result["seen"].as_object().cloned().unwrap_or_default();
    let total: u64 = seen.values().filter_map(|v| v.as_u64()).sum();
    assert_eq!(total, 300, "300 connections answered: {result}");
    for b in &backends {
        let n = seen.get(b).and_then(|v| v.as_u64()).unwrap_or(0);
        assert!(n >= 60, "backend {b} got {n} of 300 (< 20 %): {result}");
    }
    assert_eq!(
        result["peer"],
        serde_json::json!([vip, 80]),
        "getpeername: {result}"
    );
    assert_eq!(result["udp_from"], serde_json::json!([vip, 53]), "{result}");
    assert_eq!(result["udp_peer"], serde_json::json!([vip, 53]), "{result}");
    assert_eq!(result["errors"], 0, "{result}");

    // The load balancer's per-backend counters (summed over the nodes: only the client's
    // node translated anything) match what the client saw.
    let out = c.skiff(&["bpf", "services", "-o", "json"]);
    let dumps: serde_json::Value = serde_json::from_str(&out).expect("JSON from skiff bpf");
    let frontend = format!("{vip}:80/TCP");
    let mut counted = std::collections::BTreeMap::<String, u64>::new();
    for svc in dumps
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["services"].as_array().cloned().unwrap_or_default())
    {
        if svc["frontend"] != frontend.as_str() {
            continue;
        }
        for b in svc["backends"].as_array().into_iter().flatten() {
            let ip = b["address"]
                .as_str()
                .unwrap_or("")
                .split(':')
                .next()
                .unwrap_or("");
            *counted.entry(ip.to_string()).or_default() += b["connects"].as_u64().unwrap_or(0);
        }
    }
    let sent: std::collections::BTreeMap<String, u64> = seen
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(counted, sent, "skiff bpf services counters: {out}");
    let table = c.skiff(&["bpf", "services"]);
    assert!(
        table.contains(&frontend) && table.contains("default/echo"),
        "{table}"
    );

    // No backends: refused at once.
    c.skiff(&["scale", "deploy/echo", "--replicas=0"]);
    ready_backends(&c, 0).await;
    let refused = client_result(
        &c,
        "c2",
        &format!(
            "import socket, json, time, errno\n\
             t = time.time(); err = None\n\
             try:\n    \
                 socket.create_connection(('{vip}', 80), timeout=5)\n\
             except OSError as e:\n    \
                 err = errno.errorcode.get(e.errno, str(e))\n\
             print('RESULT ' + json.dumps({{'err': err, 'ms': (time.time() - t) * 1000}}), flush=True)\n"
        ),
    )
    .await;
    assert_eq!(refused["err"], "ECONNREFUSED", "{refused}");
    assert!(
        refused["ms"].as_f64().unwrap_or(f64::MAX) < 500.0,
        "refused at once: {refused}"
    );

    // Back up: works again, nothing restarted.
    c.skiff(&["scale", "deploy/echo", "--replicas=3"]);
    ready_backends(&c, 3).await;
    let again = client_result(
        &c,
        "c3",
        &format!(
            "import socket, json\n\
             s = socket.create_connection(('{vip}', 80), timeout=5)\n\
             print('RESULT ' + json.dumps({{'from': s.recv(64).decode()}}), flush=True)\n"
        ),
    )
    .await;
    assert!(
        again["from"]
            .as_str()
            .is_some_and(|s| s.starts_with("10.244.")),
        "{again}"
    );

    for node in &c.nodes {
        assert_eq!(
            node.firewall_rules(),
            "",
            "firewall rules in {}",
            node.netns
        );
    }
}

/// kill -9 of the agent of a client's node while the client streams over a TCP connection to
/// a clusterIP: the stream goes on (the programs and maps stay in the kernel), and once the
/// agent is back, Service changes reach the maps again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn established_streams_survive_an_agent_kill_9() {
    let mut c = Cluster::start(2).await;
    c.server.skiff_stdin(&["apply", "-f", "-"], &echo_app(2));
    ready_backends(&c, 2).await;
    let vip = c
        .client
        .namespaced::<Service>("default")
        .get("echo")
        .await
        .expect("service")
        .spec
        .map(|s| s.cluster_ip)
        .unwrap_or_default();
    assert!(!vip.is_empty());
    let node = c.nodes[1].name.clone();
    // 200 round trips over one connection, 50 ms apart (10 s), counting failures.
    let script = format!(
        "import socket, json, time\n\
         s = socket.create_connection(('{vip}', 81), timeout=5)\n\
         ok = 0; errors = []\n\
         for i in range(200):\n    \
             try:\n        \
                 m = ('ping %d' % i).encode(); s.sendall(m)\n        \
                 if s.recv(100) == m: ok += 1\n        \
                 else: errors.append(i)\n    \
             except Exception as e:\n        \
                 errors.append(str(e)); break\n    \
             if i % 20 == 0: print('progress', i, flush=True)\n    \
             time.sleep(0.05)\n\
         print('RESULT ' + json.dumps({{'ok': ok, 'errors': errors}}), flush=True)\n"
    );
    c.server.skiff_stdin(
        &["apply", "-f", "-"],
        &client_pod_on("streamer", Some(&node), &script),
    );
    eventually_within("the stream is flowing", T, || async {
        let out = c.server.skiff(&["logs", "streamer"]);
        let log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.contains("progress 20").then_some(()).ok_or(log)
    })
    .await;
    c.node(&node).kill_agent();
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.node(&node).start_agent();
    let result = eventually_within("the stream finished", T, || async {
        let out = c.server.skiff(&["logs", "streamer"]);
        let log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
            .ok_or(log)
    })
    .await;
    assert_eq!(result["ok"], 200, "every round trip answered: {result}");
    assert_eq!(result["errors"], serde_json::json!([]), "{result}");

    // The restarted agent still programs changes: no backends → refused on that node.
    c.skiff(&["scale", "deploy/echo", "--replicas=0"]);
    ready_backends(&c, 0).await;
    let refused = eventually_within("connects refused on the restarted node", T, || async {
        let name = format!("probe-{}", skiff_tests::unique());
        let r = client_result_on(
            &c,
            &name,
            Some(&node),
            &format!(
                "import socket, json, errno\n\
                 err = None\n\
                 try:\n    \
                     socket.create_connection(('{vip}', 80), timeout=5)\n\
                 except OSError as e:\n    \
                     err = errno.errorcode.get(e.errno, str(e))\n\
                 print('RESULT ' + json.dumps({{'err': err}}), flush=True)\n"
            ),
        )
        .await;
        (r["err"] == "ECONNREFUSED")
            .then_some(r.clone())
            .ok_or(r.to_string())
    })
    .await;
    assert_eq!(refused["err"], "ECONNREFUSED");
}

/// NodePort from outside the cluster with no firewall rule: a client in a namespace on the
/// nodes' segment connects 50 times to `<node IP>:<nodePort>` of each node; the tc program on
/// the node's uplink balances over every backend of the cluster (so each node serves both
/// its own and the other node's pods), SNATs to the node address and translates the replies
/// back (the client sees them from `<node IP>:<nodePort>`); UDP too. The per-backend
/// counters in `skiff bpf services` match; NodePort keeps working while an agent is killed,
/// and its successor takes the pinned uplink link over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_port_services_are_reachable_from_outside_on_every_node() {
    let mut c = Cluster::start(2).await;
    c.server.skiff_stdin(&["apply", "-f", "-"], &echo_app(4));
    c.server.skiff_stdin(
        &["apply", "-f", "-"],
        &echo_service("echo-np", "NodePort", false),
    );
    ready_backends(&c, 4).await;
    let pods = c.client.namespaced::<Pod>("default");
    // Backend pod IP → node, with backends on both nodes.
    let placement = eventually_within("echo pods on both nodes", T, || async {
        let list = pods
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut by_ip = std::collections::BTreeMap::new();
        for p in list
            .items
            .iter()
            .filter(|p| skiff_api::Resource::name(*p).starts_with("echo-"))
        {
            let ip = p
                .status
                .as_ref()
                .map(|s| s.pod_ip.clone())
                .unwrap_or_default();
            let node = p
                .spec
                .as_ref()
                .map(|s| s.node_name.clone())
                .unwrap_or_default();
            if !ip.is_empty() {
                by_ip.insert(ip, node);
            }
        }
        let nodes: std::collections::BTreeSet<&String> = by_ip.values().collect();
        (by_ip.len() == 4 && nodes.len() == 2)
            .then(|| by_ip.clone())
            .ok_or(format!("{by_ip:?}"))
    })
    .await;
    let svc = c.client.namespaced::<Service>("default");
    let ports = eventually_within("node ports", T, || async {
        let s = svc.get("echo-np").await.map_err(|e| e.to_string())?;
        let ports = s.spec.map(|s| s.ports).unwrap_or_default();
        let np = |name: &str| ports.iter().find(|p| p.name == name).map(|p| p.node_port);
        match (np("tcp"), np("udp")) {
            (Some(t), Some(u)) if t > 0 && u > 0 => Ok((t, u)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let outside = skiff_tests::outside(&c.fabric);

    for node in &c.nodes {
        let node_ip = node.node_ip.clone();
        let result = node_port_round(&c, &outside, &node_ip, ports, &placement).await;
        // Every NodePort flow is counted on its backend, under the node's frontend.
        let out = c.skiff(&["bpf", "services", "-o", "json"]);
        let dumps: serde_json::Value = serde_json::from_str(&out).expect("JSON from skiff bpf");
        let frontend = format!("{node_ip}:{}/TCP", ports.0);
        let mut counted = std::collections::BTreeMap::<String, u64>::new();
        for svc in dumps
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|d| d["services"].as_array().cloned().unwrap_or_default())
            .filter(|s| s["frontend"] == frontend.as_str())
        {
            assert_eq!(svc["service"], "default/echo-np", "{svc}");
            for b in svc["backends"].as_array().into_iter().flatten() {
                let address = b["address"].as_str().unwrap_or_default();
                let ip = address.split(':').next().unwrap_or_default().to_string();
                let n = b["connects"].as_u64().unwrap_or(0);
                if n > 0 {
                    *counted.entry(ip).or_default() += n;
                }
            }
        }
        let sent: std::collections::BTreeMap<String, u64> = result["seen"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
            .collect();
        assert_eq!(
            counted, sent,
            "NodePort counters in skiff bpf services: {out}"
        );
    }

    // NodePort keeps working while an agent is away (pinned links and maps), and a restarted
    // agent takes the uplink's link over instead of attaching a second program.
    let (n0, n0_ip) = (c.nodes[0].name.clone(), c.nodes[0].node_ip.clone());
    c.node(&n0).kill_agent();
    node_port_round(&c, &outside, &n0_ip, ports, &placement).await;
    c.node(&n0).start_agent();
    eventually_within("the restarted agent took the uplink over", T, || async {
        let log = c.nodes[0].agent_log();
        log.lines()
            .any(|l| l.contains("NodePort served on the uplink") && l.contains("Adopted"))
            .then_some(())
            .ok_or(log)
    })
    .await;
    node_port_round(&c, &outside, &n0_ip, ports, &placement).await;

    for node in &c.nodes {
        assert_eq!(
            node.firewall_rules(),
            "",
            "firewall rules in {}",
            node.netns
        );
    }
}

/// One round of the outside client (in netns `outside`) against `<node_ip>:<nodePort>`: 50
/// TCP connects and 10 UDP datagrams, checked: all TCP connects answered, by backends on both
/// nodes (`placement`: pod IP → node), replies from the node port. Returns the client's
/// result (`seen`: answers per backend pod IP).
async fn node_port_round(
    c: &Cluster,
    outside: &str,
    node_ip: &str,
    (tcp_port, udp_port): (i32, i32),
    placement: &std::collections::BTreeMap<String, String>,
) -> serde_json::Value {
    let script = format!(
        "import socket, json, collections, time\n\
         ip, tport, uport = '{node_ip}', {tcp_port}, {udp_port}\n\
         seen = collections.Counter(); peers = set(); errors = 0\n\
         deadline = time.time() + 40\n\
         while sum(seen.values()) < 50 and time.time() < deadline:\n    \
             try:\n        \
                 s = socket.create_connection((ip, tport), timeout=2)\n        \
                 peers.add('%s:%d' % s.getpeername())\n        \
                 seen[s.recv(64).decode()] += 1\n        \
                 s.close()\n    \
             except Exception:\n        \
                 errors += 1; time.sleep(0.2)\n\
         udp = []\n\
         for _ in range(10):\n    \
             u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)\n    \
             try:\n        \
                 u.sendto(b'x', (ip, uport)); d, a = u.recvfrom(100)\n        \
                 udp.append('%s:%d' % a)\n    \
             except Exception:\n        \
                 pass\n    \
             u.close()\n\
         print(json.dumps({{'seen': seen, 'peers': sorted(peers), 'errors': errors, 'udp': udp}}), flush=True)\n"
    );
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new("nsenter")
            .arg(format!("--net=/run/netns/{outside}"))
            .args(["python3", "-c", &script])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the outside client finished in time")
    .expect("run the outside client");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let result: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "{text:?}: {e}: {}; {}",
            String::from_utf8_lossy(&out.stderr),
            c.logs()
        )
    });
    let seen = result["seen"].as_object().cloned().unwrap_or_default();
    let total: u64 = seen.values().filter_map(|v| v.as_u64()).sum();
    assert_eq!(total, 50, "50 connections through {node_ip}: {result}");
    assert_eq!(
        result["peers"],
        serde_json::json!([format!("{node_ip}:{tcp_port}")]),
        "replies come from the node port"
    );
    let hit_nodes: std::collections::BTreeSet<&String> =
        seen.keys().filter_map(|ip| placement.get(ip)).collect();
    assert_eq!(
        hit_nodes.len(),
        2,
        "{node_ip} sent connections to local and remote backends: {result}, {placement:?}"
    );
    let udp = result["udp"].as_array().cloned().unwrap_or_default();
    assert!(udp.len() >= 8, "UDP answered through {node_ip}: {result}");
    assert!(
        udp.iter().all(|a| *a == format!("{node_ip}:{udp_port}")),
        "UDP replies from the node port: {result}"
    );
    result
}
