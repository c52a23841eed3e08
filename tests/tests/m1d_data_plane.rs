//! M1-D end to end (the parts that exist so far): nodes in network namespaces of their own,
//! joined by a bridge in another namespace; pods reach pods on other nodes by their own
//! addresses, and nothing on the way translates them.

use std::time::Duration;

use skiff_api::api::Pod;
use skiff_tests::cluster::Cluster;
use skiff_tests::eventually;

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
    eventually(&format!("{name} running"), T, || async {
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
/// over the shared segment, and the server sees the client's own pod IP (no NAT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_reach_pods_on_other_nodes_without_nat() {
    let c = Cluster::start(2).await;
    let (n0, n1) = (c.nodes[0].name.clone(), c.nodes[1].name.clone());
    // Each node routes the other's pod CIDR through the other's fabric address.
    for (node, other) in [(&c.nodes[0], &c.nodes[1]), (&c.nodes[1], &c.nodes[0])] {
        let via = format!("via {}", other.node_ip.clone().unwrap_or_default());
        eventually("a route to the other node's pods", T, || async {
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
    let seen = eventually("the client got an answer", T, || async {
        let out = c.server.skiff(&["logs", "client"]);
        let log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.lines()
            .find_map(|l| l.strip_prefix("seen-as "))
            .map(str::to_string)
            .ok_or(log)
    })
    .await;
    assert_eq!(seen, client_ip, "the server saw the client's own pod IP");

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
