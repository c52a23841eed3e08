//! The `skiff` binary against a real API server, started in-process on an embedded store in a
//! tempdir.

use skiff_apiserver::testing::TestServer;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use skiff_api::api::{Container, ObjectMeta, Pod, PodSpec};
use skiff_apiserver::ApiServerOptions;
use skiff_client::Client;

const MANIFEST: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: host
        command: ["python3", "-m", "http.server", "8080"]
        ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {port: 80, targetPort: 8080, nodePort: 30080}
---
# The namespace comes last in the file; apply creates it first.
apiVersion: v1
kind: Namespace
metadata:
  name: shop
"#;

struct Cluster {
    rt: tokio::runtime::Runtime,
    server: Option<TestServer>,
    endpoint: String,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let server = rt.block_on(TestServer::start(ApiServerOptions::default()));
        let endpoint = server.endpoint();
        Cluster {
            rt,
            server: Some(server),
            endpoint,
            dir: tempfile::tempdir().expect("tempdir for manifests"),
        }
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write manifest");
        p
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_skiff"));
        c.arg("--server")
            .arg(&self.endpoint)
            .args(args)
            .env_remove("SKIFF_SERVER")
            .env("SKIFF_CONFIG", self.dir.path().join("no-config.yaml"))
            .env_remove("SKIFF_LOG");
        c
    }

    fn skiff(&self, args: &[&str]) -> Run {
        Run(self.command(args).output().expect("run skiff"))
    }

    fn skiff_stdin(&self, args: &[&str], stdin: &str) -> Run {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn skiff");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        Run(child.wait_with_output().expect("wait skiff"))
    }

    fn client(&self) -> Client {
        self.rt
            .block_on(Client::connect(&self.endpoint))
            .expect("connect")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.rt.block_on(s.handle.shutdown());
        }
    }
}

struct Run(Output);

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }

    #[track_caller]
    fn ok(&self) -> String {
        assert!(
            self.0.status.success(),
            "skiff failed ({:?})\nstdout:\n{}\nstderr:\n{}",
            self.0.status,
            self.stdout(),
            self.stderr()
        );
        self.stdout()
    }

    #[track_caller]
    fn fails(&self) -> String {
        assert_eq!(
            self.0.status.code(),
            Some(1),
            "expected exit code 1\nstdout:\n{}\nstderr:\n{}",
            self.stdout(),
            self.stderr()
        );
        self.stderr()
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn apply_get_reapply_describe_delete() {
    let c = Cluster::start();
    let file = c.file("app.yaml", MANIFEST);

    let out = c.skiff(&["apply", "-f", path(&file)]).ok();
    assert_eq!(
        out,
        "namespace/shop created\ndeployment.apps/web created\nservice/web created\n"
    );

    // Both kinds, wide, in their own tables with kind-prefixed names.
    let out = c
        .skiff(&["get", "deploy,svc", "-n", "shop", "-o", "wide"])
        .ok();
    let blocks: Vec<&str> = out.trim_end().split("\n\n").collect();
    assert_eq!(blocks.len(), 2, "{out}");
    let deploy: Vec<&str> = blocks[0].lines().collect();
    assert!(
        deploy[0].starts_with("NAME                  READY   UP-TO-DATE   AVAILABLE   AGE"),
        "{out}"
    );
    assert!(
        deploy[0].ends_with("CONTAINERS   IMAGES   SELECTOR"),
        "{out}"
    );
    assert!(
        deploy[1].starts_with("deployment.apps/web   0/2     0            0"),
        "{out}"
    );
    assert!(
        deploy[1].ends_with("web          host     app=web"),
        "{out}"
    );
    let svc: Vec<&str> = blocks[1].lines().collect();
    assert!(
        svc[0].starts_with("NAME          TYPE       CLUSTER-IP   EXTERNAL-IP   PORT(S)"),
        "{out}"
    );
    assert!(svc[1].starts_with("service/web   NodePort"), "{out}");
    assert!(svc[1].contains("80:30080/TCP"), "{out}");
    assert!(svc[1].ends_with("app=web"), "{out}");

    // Re-applying the same file changes nothing; a changed spec is configured.
    let out = c.skiff(&["apply", "-f", path(&file)]).ok();
    assert_eq!(
        out,
        "namespace/shop unchanged\ndeployment.apps/web unchanged\nservice/web unchanged\n"
    );
    let changed = c.file(
        "changed.yaml",
        &MANIFEST.replace("replicas: 2", "replicas: 3"),
    );
    let out = c.skiff(&["apply", "-f", path(&changed)]).ok();
    assert_eq!(
        out,
        "namespace/shop unchanged\ndeployment.apps/web configured\nservice/web unchanged\n"
    );
    // The server kept what it defaulted (the nodePort, the strategy) and took the change.
    let json = c
        .skiff(&["get", "deploy", "web", "-n", "shop", "-o", "json"])
        .ok();
    let d: serde_json::Value = serde_json::from_str(&json).expect("JSON output");
    assert_eq!(d["kind"], "Deployment");
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(d["metadata"]["generation"], 2);

    // Standard input, YAML list output.
    let out = c.skiff_stdin(&["apply", "-f", "-"], MANIFEST).ok();
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    let yaml = c
        .skiff(&["get", "svc,deploy", "-n", "shop", "-o", "yaml"])
        .ok();
    assert!(yaml.starts_with("apiVersion: v1\nitems:\n"), "{yaml}");
    assert!(yaml.contains("kind: List"), "{yaml}");
    assert!(yaml.contains("  kind: Service"), "{yaml}");
    let names = c
        .skiff(&["get", "svc,deploy", "-n", "shop", "-o", "name"])
        .ok();
    assert_eq!(names, "service/web\ndeployment.apps/web\n");

    let out = c.skiff(&["describe", "deploy", "web", "-n", "shop"]).ok();
    for want in [
        "Name:               web",
        "Namespace:          shop",
        "Labels:             app=web",
        "Annotations:        <none>",
        "Replicas:           2 desired | 0 updated | 0 total | 0 available | 0 unavailable",
        "Spec:",
        "Events:",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }

    // Empty results and missing objects.
    let none = c.skiff(&["get", "pods", "-n", "shop"]);
    assert_eq!(none.ok(), "");
    assert_eq!(none.stderr(), "No resources found in shop namespace.\n");
    let missing = c.skiff(&["get", "deploy", "nope", "-n", "shop"]);
    assert_eq!(
        missing.fails(),
        "error: deployments.apps \"nope\" not found\n"
    );
    let unknown = c.skiff(&["get", "widgets"]);
    assert_eq!(
        unknown.fails(),
        "error: the server doesn't have a resource type \"widgets\"\n"
    );

    // -A adds a NAMESPACE column.
    let out = c.skiff(&["get", "svc", "-A"]).ok();
    assert!(out.starts_with("NAMESPACE   NAME   TYPE"), "{out}");
    assert!(out.contains("\nshop        web    NodePort"), "{out}");

    let out = c.skiff(&["delete", "-f", path(&file)]).ok();
    assert_eq!(
        out,
        "deployment.apps \"web\" deleted\nservice \"web\" deleted\nnamespace \"shop\" deleted\n"
    );
    let gone = c.skiff(&["get", "deploy,svc", "-n", "shop"]);
    assert_eq!(gone.ok(), "");
    let again = c.skiff(&["delete", "-f", path(&file), "--ignore-not-found"]);
    again.ok();
}

#[test]
fn bad_manifest_is_refused_whole() {
    let c = Cluster::start();
    let bad = MANIFEST
        .replace("namespace: shop", "namespace: strict")
        .replace("name: shop", "name: strict")
        .replace("image: host", "imagee: host");
    let file = c.file("bad.yaml", &bad);
    let err = c.skiff(&["apply", "-f", path(&file)]).fails();
    assert_eq!(
        err,
        format!(
            "error: {}: document 1: spec.template.spec.containers[0].imagee: unknown field\n",
            path(&file)
        )
    );
    // Nothing was applied, not even the namespace from the same file.
    let err = c.skiff(&["get", "ns", "strict"]).fails();
    assert_eq!(err, "error: namespaces \"strict\" not found\n");

    // A document the server rejects: its message names the field.
    let invalid = c.file(
        "invalid.yaml",
        &MANIFEST.replace("replicas: 2", "replicas: -1"),
    );
    let run = c.skiff(&["apply", "-f", path(&invalid)]);
    let err = run.fails();
    assert!(
        err.contains("error: Deployment.apps \"web\" is invalid: spec.replicas"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // The others were applied.
    assert!(
        run.stdout().contains("service/web created"),
        "{}",
        run.stdout()
    );
}

#[test]
fn get_pods_watch_streams_new_pods() {
    let c = Cluster::start();
    let mut child: Child = c
        .command(&["get", "pods", "-w", "-n", "default"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff get -w");
    let (tx, rx) = mpsc::channel::<(&'static str, String)>();
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    for (name, pipe) in [
        ("out", Box::new(stdout) as Box<dyn std::io::Read + Send>),
        ("err", Box::new(stderr)),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send((name, line)).is_err() {
                    break;
                }
            }
        });
    }
    let wait_for = |want: &dyn Fn(&str, &str) -> bool| -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok((stream, line)) if want(stream, &line) => return line,
                Ok(_) => {}
                Err(e) => panic!("no expected line from `skiff get pods -w`: {e}"),
            }
        }
    };
    // The list is done (and the watch starts from its revision) once this is printed.
    wait_for(&|s, l| s == "err" && l == "No resources found in default namespace.");

    let client = c.client();
    let pods = client.namespaced::<Pod>("default");
    let pod = Pod {
        metadata: Some(ObjectMeta {
            name: "watched".into(),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: "host".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    c.rt.block_on(pods.create(&pod)).expect("create pod");
    let header = wait_for(&|s, _| s == "out");
    assert!(
        header.starts_with("NAME      READY   STATUS    RESTARTS   AGE"),
        "{header:?}"
    );
    let row = wait_for(&|s, _| s == "out");
    assert!(row.starts_with("watched   0/1     Pending   0"), "{row:?}");

    // A change shows as another row, without a header.
    c.rt.block_on(pods.bind("watched", "node-1")).expect("bind");
    let row = wait_for(&|s, _| s == "out");
    assert!(row.starts_with("watched   0/1"), "{row:?}");

    child.kill().expect("kill skiff");
    child.wait().expect("reap skiff");
}

#[test]
fn unreachable_server_is_one_line() {
    // Nothing listens on port 1.
    let out = Command::new(env!("CARGO_BIN_EXE_skiff"))
        .args(["--server", "http://127.0.0.1:1", "get", "pods"])
        .env_remove("SKIFF_SERVER")
        .output()
        .expect("run skiff");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: cannot reach the Skiff API server at http://127.0.0.1:1: connection refused \
         (is it running? start one with `cargo xtask up`)\n"
    );
}

#[test]
fn server_comes_from_the_config_file() {
    let c = Cluster::start();
    let config = c.file("config.yaml", &format!("server: {}\n", c.endpoint));
    let out = Command::new(env!("CARGO_BIN_EXE_skiff"))
        .args(["create", "namespace", "from-config"])
        .env_remove("SKIFF_SERVER")
        .env("SKIFF_CONFIG", &config)
        .output()
        .expect("run skiff");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "namespace/from-config created\n"
    );
    let out = c.skiff(&["get", "ns"]).ok();
    let lines: Vec<&str> = out.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["NAME", "STATUS", "AGE"], "{out}");
    assert!(
        lines
            .iter()
            .any(|l| l.split_whitespace().take(2).eq(["from-config", "Active"])),
        "{out}"
    );
    let err = c.skiff(&["create", "namespace", "from-config"]).fails();
    assert_eq!(err, "error: namespaces \"from-config\" already exists\n");
}
