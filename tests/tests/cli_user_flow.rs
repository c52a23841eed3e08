//! The CLI as a new user tries it: a real `skiff-apiserver` process (embedded store, and a real
//! etcd) driven by the real `skiff` CLI with a Kubernetes-style manifest.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::time::Duration;

use skiff_tests::{ApiServer, Backend, EtcdServer, Streaming, fails, ok, repo_root};

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: probe
  namespace: shop
  labels: {app: probe}
spec:
  containers:
  - name: main
    image: host
    command: ["sleep", "3600"]
"#;

fn user_flow(server: &ApiServer) {
    let shop = repo_root().join("examples/shop.yaml");
    let shop = shop.to_str().expect("utf-8 path");

    let out = ok(&server.skiff(&["apply", "-f", shop]));
    for line in [
        "namespace/shop created",
        "deployment.apps/web created",
        "service/web created",
    ] {
        assert!(out.contains(line), "apply output lacks {line:?}:\n{out}");
    }

    let out = ok(&server.skiff(&["get", "deploy,svc", "-n", "shop", "-o", "wide"]));
    assert!(out.contains("deployment.apps/web"), "{out}");
    assert!(out.contains("service/web"), "{out}");
    assert!(
        out.contains("app=web"),
        "wide output shows the selector:\n{out}"
    );
    assert!(out.contains("80/TCP"), "service port shown:\n{out}");

    // Applying the same file again changes nothing.
    let out = ok(&server.skiff(&["apply", "-f", shop]));
    assert!(out.contains("deployment.apps/web unchanged"), "{out}");

    // get -w streams a pod created after the watch started.
    let watch = Streaming::spawn(server.skiff_cmd(&["get", "pods", "-n", "shop", "-w"]));
    std::thread::sleep(Duration::from_millis(500));
    ok(&server.skiff_stdin(&["apply", "-f", "-"], POD));
    if let Err(seen) = watch.wait_for(&["probe"], Duration::from_secs(10)) {
        panic!("get -w did not show the new pod within 10 s; it printed {seen:?}");
    }
    drop(watch);

    let out = ok(&server.skiff(&["get", "pods", "-n", "shop", "-o", "json"]));
    let json: serde_json::Value = serde_json::from_str(&out).expect("-o json is JSON");
    let pod = if json["kind"] == "List" {
        json["items"][0].clone()
    } else {
        json
    };
    assert_eq!(pod["metadata"]["name"], "probe");
    assert_eq!(pod["apiVersion"], "v1");
    assert!(
        pod["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );

    let out = ok(&server.skiff(&["delete", "-f", shop]));
    assert!(out.contains("deployment.apps \"web\" deleted"), "{out}");
    let out = server.skiff(&["get", "deploy", "-n", "shop"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("web"));
}

fn bad_input_writes_nothing(server: &ApiServer) {
    ok(&server.skiff(&["create", "namespace", "bad"]));
    let manifest = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: good, namespace: bad}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      containers: [{name: c, image: host, command: [sleep, "1"]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: typo, namespace: bad}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      containers: [{name: c, imagee: host}]
"#;
    let err = fails(&server.skiff_stdin(&["apply", "-f", "-"], manifest));
    assert!(
        err.contains("spec.template.spec.containers[0].imagee"),
        "error names the path: {err}"
    );
    // The good document of the same input was not applied either.
    let out = server.skiff(&["get", "deploy", "-n", "bad"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("good"));

    let negative = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: neg, namespace: bad}
spec:
  replicas: -1
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      containers: [{name: c, image: host, command: [sleep, "1"]}]
"#;
    let err = fails(&server.skiff_stdin(&["apply", "-f", "-"], negative));
    assert!(
        err.contains("spec.replicas"),
        "server names the field: {err}"
    );
    let out = server.skiff(&["get", "deploy", "-n", "bad"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("neg"));

    let wrong_kind = "apiVersion: v1\nkind: Deployment\nmetadata: {name: w, namespace: bad}\n";
    let err = fails(&server.skiff_stdin(&["apply", "-f", "-"], wrong_kind));
    assert!(err.contains("apiVersion"), "{err}");
}

#[test]
fn user_flow_on_embedded_store() {
    let server = ApiServer::start(Backend::Embedded);
    user_flow(&server);
    bad_input_writes_nothing(&server);
}

#[test]
fn user_flow_on_etcd() {
    let etcd = EtcdServer::start().expect("a real etcd (run `cargo xtask setup`)");
    let server = ApiServer::start(Backend::Etcd(etcd.endpoint.clone()));
    user_flow(&server);
}

#[test]
fn unreachable_server_is_one_clear_line() {
    // A port nothing listens on: bind and drop.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("ephemeral port");
    let out = std::process::Command::new(skiff_tests::binary("skiff"))
        .args([
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "get",
            "pods",
        ])
        .env("SKIFF_CONFIG", "/nonexistent")
        .output()
        .expect("running skiff");
    let err = fails(&out);
    assert_eq!(err.trim().lines().count(), 1, "one line, got:\n{err}");
    assert!(err.contains("cannot reach"), "{err}");
}
