//! Cluster DNS inside pods, with busybox's real `nslookup` and glibc's `getent` (short names
//! through the search path) in a pod of a registry image:
//! a ClusterIP Service's name, a headless Service (one address per ready pod) and its
//! StatefulSet pods' `<hostname>.<service>` names, SRV for a named port, PTR of a cluster IP,
//! a pod record, an ExternalName Service's CNAME, a name outside the cluster forwarded to the node's resolver (a stand-in on
//! loopback, so nothing leaves the machine), a new Service answering within a second of its
//! creation, the kubelet's resolv.conf (search path, ndots:5; dnsPolicy Default and None
//! with dnsConfig), and a malformed query answered FORMERR without disturbing the next one.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_proto::op::{Metadata, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use hickory_server::Server;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use skiff_testkit::registry::Registry;
use skiff_tests::Machine;
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(90);

/// The stand-in for the node's resolver: `outside.example.` is 192.0.2.7, the rest NXDOMAIN.
struct Upstream;

#[async_trait::async_trait]
impl RequestHandler for Upstream {
    async fn handle_request<R: ResponseHandler, Tm: hickory_server::net::runtime::Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let info = request.request_info().unwrap();
        let mut meta = Metadata::response_from_request(&request.metadata);
        let mut answers = Vec::new();
        // The name exists (A only: other types are NODATA); every other name does not.
        if info.query.name().to_string() == "outside.example." {
            if info.query.query_type() == RecordType::A {
                answers.push(Record::from_rdata(
                    info.query.name().into(),
                    60,
                    RData::A(A(Ipv4Addr::new(192, 0, 2, 7))),
                ));
            }
        } else {
            meta.response_code = ResponseCode::NXDomain;
        }
        let msg = MessageResponseBuilder::new(&request.queries, None).build(
            meta,
            answers.iter(),
            [],
            [],
            [],
        );
        response.send_response(msg).await.unwrap()
    }
}

/// The stand-in resolver on a machine of its own on the cluster's fabric.
async fn upstream(c: &Cluster) -> (SocketAddr, Server<Upstream>, Machine) {
    let machine = Machine::on(&c.fabric, "resolver");
    let udp = skiff_testnet::udp_bind_in(&machine.netns.path(), (machine.ip, 53).into()).unwrap();
    udp.set_nonblocking(true).unwrap();
    let udp = tokio::net::UdpSocket::from_std(udp).unwrap();
    let addr = udp.local_addr().unwrap();
    let mut server = Server::new(Upstream);
    server.register_socket(udp);
    (addr, server, machine)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_resolve_cluster_names_with_real_resolvers() {
    let registry = Registry::start();
    // busybox for nslookup, and glibc's getent (with its libraries) for the resolver most
    // programs use.
    let image = registry
        .push_busybox_with("demo/dns:v1", &["/usr/bin/getent"])
        .await;
    let mut c = Cluster::start(0).await;
    let (up, _upstream, _resolver) = upstream(&c).await;
    c.add_node_with("n0", &[], &["--dns-upstream", &up.to_string()]);
    c.wait_nodes_ready().await;
    let k = |args: &[&str], stdin: Option<&str>| {
        let (ok, out, err) = c.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}\n{}", c.logs());
        out
    };
    let manifests = format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: web}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 80}}]
---
apiVersion: v1
kind: Service
metadata: {{name: db}}
spec:
  clusterIP: None
  selector: {{app: db}}
  ports: [{{name: redis, port: 6379}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: db}}
spec:
  serviceName: db
  replicas: 2
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata: {{labels: {{app: db}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: db
        image: {image}
        args: ["exec sleep 3600"]
        ports: [{{name: redis, containerPort: 6379}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: client}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {image}, args: ["exec sleep 3600"]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: plain}}
spec:
  dnsPolicy: Default
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {image}, args: ["exec sleep 3600"]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: custom}}
spec:
  dnsPolicy: None
  dnsConfig:
    nameservers: [192.0.2.1]
    searches: [corp.example]
    options: [{{name: ndots, value: "2"}}]
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {image}, args: ["exec sleep 3600"]}}]
"#
    );
    k(&["apply", "-f", "-"], Some(&manifests));
    for p in ["client", "plain", "custom", "db-0", "db-1"] {
        k(
            &[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{p}"),
                "--timeout=90s",
            ],
            None,
        );
    }
    skiff_testkit::eventually_blocking("db endpoints with hostnames", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "get",
                "endpoints",
                "db",
                "-o",
                "jsonpath={.subsets[*].addresses[*].hostname}",
            ],
            None,
        );
        (out.split_whitespace().count() == 2).then_some(())
    });
    let exec = |pod: &str, script: &str| -> (bool, String) {
        let (ok, out, err) = c.kubectl(
            &["exec", pod, "--", "/bin/busybox", "sh", "-c", script],
            None,
        );
        (ok, format!("{out}{err}"))
    };
    let lookup = |args: &str| -> String {
        let (ok, out) = exec("client", &format!("nslookup {args}"));
        assert!(ok, "nslookup {args}: {out}");
        out
    };

    // The kubelet's resolv.conf.
    let conf = exec("client", "cat /etc/resolv.conf").1;
    assert!(conf.starts_with("nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local"), "{conf}");
    assert!(conf.ends_with("options ndots:5\n"), "{conf}");
    let plain = exec("plain", "cat /etc/resolv.conf").1;
    assert!(!plain.contains("10.96.0.10"), "dnsPolicy Default: {plain}");
    assert_eq!(
        exec("custom", "cat /etc/resolv.conf").1,
        "nameserver 192.0.2.1\nsearch corp.example\noptions ndots:2\n"
    );

    // glibc's resolver through the search path (ndots:5): a short name.
    let web_ip = k(
        &["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"],
        None,
    );
    let (ok, out) = exec("client", "getent hosts web");
    assert!(
        ok && out.starts_with(&web_ip) && out.contains("web.default.svc.cluster.local"),
        "{out}"
    );
    let (ok, out) = exec("client", "getent hosts db-0.db");
    let db0 = k(
        &["get", "pod", "db-0", "-o", "jsonpath={.status.podIP}"],
        None,
    );
    assert!(ok && out.starts_with(&db0), "{out}");

    // A ClusterIP Service, the headless one, its pods, SRV, PTR, a pod record.
    let web_ip = k(
        &["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"],
        None,
    );
    let out = lookup("web.default.svc.cluster.local");
    assert!(out.contains(&format!("Address: {web_ip}")), "{out}");
    let db_ips = k(
        &[
            "get",
            "pods",
            "-l",
            "app=db",
            "-o",
            "jsonpath={.items[*].status.podIP}",
        ],
        None,
    );
    let out = lookup("db.default.svc.cluster.local");
    for ip in db_ips.split_whitespace() {
        assert!(out.contains(&format!("Address: {ip}")), "{out}");
    }
    let db1 = k(
        &["get", "pod", "db-1", "-o", "jsonpath={.status.podIP}"],
        None,
    );
    let out = lookup("db-1.db.default.svc.cluster.local");
    assert!(out.contains(&format!("Address: {db1}")), "{out}");
    let out = lookup("-type=SRV _redis._tcp.db.default.svc.cluster.local");
    assert!(
        out.contains("db-0.db.default.svc.cluster.local") && out.contains("6379"),
        "{out}"
    );
    let out = lookup("-type=SRV _http._tcp.web.default.svc.cluster.local");
    assert!(
        out.contains("web.default.svc.cluster.local") && out.contains(" 80 "),
        "{out}"
    );
    let out = lookup(&web_ip);
    assert!(out.contains("web.default.svc.cluster.local"), "{out}");
    let out = lookup("10-244-9-9.default.pod.cluster.local");
    assert!(out.contains("Address: 10.244.9.9"), "{out}");
    let (ok, out) = exec("client", "nslookup nothing.default.svc.cluster.local");
    assert!(!ok || out.contains("NXDOMAIN"), "{out}");

    // Outside the cluster: forwarded to the node's resolver.
    let out = lookup("outside.example");
    assert!(out.contains("Address: 192.0.2.7"), "{out}");
    // An ExternalName Service is a CNAME.
    k(
        &[
            "create",
            "service",
            "externalname",
            "ext",
            "--external-name=outside.example",
        ],
        None,
    );
    skiff_testkit::eventually_blocking("the ExternalName CNAME", T, || {
        let (_, out) = exec(
            "client",
            "nslookup -type=CNAME ext.default.svc.cluster.local",
        );
        out.contains("canonical name = outside.example")
            .then_some(())
    });
    assert!(
        k(&["get", "svc", "ext"], None).contains("ExternalName   <none>       outside.example")
    );

    // A new Service answers at once.
    let started = Instant::now();
    k(
        &["create", "service", "clusterip", "fresh", "--tcp=8080:8080"],
        None,
    );
    let fresh_ip = loop {
        let ip = k(
            &["get", "svc", "fresh", "-o", "jsonpath={.spec.clusterIP}"],
            None,
        );
        if !ip.is_empty() {
            break ip;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    loop {
        let (_, out) = exec("client", "nslookup fresh.default.svc.cluster.local");
        if out.contains(&format!("Address: {fresh_ip}")) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "fresh not resolved: {out}"
        );
    }
    let took = started.elapsed();
    eprintln!("a new Service resolved {took:?} after its create (kubectl exec included)");
    assert!(took < Duration::from_secs(1), "{took:?}");

    // A malformed query: FORMERR, and the next query is answered as usual.
    let node = &c.nodes[0];
    let dns_addr = format!(
        "{}:10053",
        node.ip(&["-4", "-o", "addr", "show", "eth0"])
            .split_whitespace()
            .nth(3)
            .unwrap()
            .split('/')
            .next()
            .unwrap()
    );
    let script = format!(
        "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); \
         h,p='{dns_addr}'.split(':'); s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\xff\\xff', (h,int(p))); \
         r=s.recv(512); print(r[0]==0x12 and r[1]==0x34, r[3]&15)"
    );
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &node.netns, "python3", "-c", &script])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        printed.trim(),
        "True 1",
        "FORMERR expected: {printed} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = lookup("web.default.svc.cluster.local");
    assert!(out.contains(&format!("Address: {web_ip}")), "{out}");
}
