//! The `skiff` binary against a real API server, started in-process on an embedded store in a
//! tempdir.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use skiff_testkit::server::TestServer;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::{Container, Deployment, ObjectMeta, Pod, PodSpec, ReplicaSet};
use skiff_api::wellknown::{CHANGE_CAUSE, REVISION, templates_equal};
use skiff_apiserver::ApiServerOptions;
use skiff_client::controller::CancelToken;
use skiff_client::{Client, ListParams};
use skiff_controllers::manager::{self, ManagerConfig};
use skiff_testkit::kubelet::FakeKubelet;
use skiff_testkit::{WAIT, eventually_blocking};

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

    /// The controller manager (every controller, no leader election) in this process.
    fn start_controllers(&self) -> Controllers {
        let mut config = ManagerConfig::new("cli-test");
        config.leader_election = None;
        let stop = CancelToken::new();
        let task = self.rt.spawn({
            let (client, stop) = (self.client(), stop.clone());
            async move {
                if let Err(e) = manager::run(client, config, stop).await {
                    panic!("controller manager failed: {e}");
                }
            }
        });
        Controllers { stop, task }
    }

    /// A stand-in for node agents: pods become Running and Ready `delay` after they appear.
    fn start_kubelet(&self, delay: Duration) -> FakeKubelet {
        let client = self.client();
        let _in_runtime = self.rt.enter();
        FakeKubelet::all_pods(&client, delay)
    }

    fn deployment(&self, name: &str) -> Deployment {
        self.rt
            .block_on(self.client().namespaced::<Deployment>("default").get(name))
            .expect("get deployment")
    }

    fn replica_sets(&self) -> Vec<ReplicaSet> {
        self.rt
            .block_on(
                self.client()
                    .namespaced::<ReplicaSet>("default")
                    .list(&ListParams::default()),
            )
            .expect("list replica sets")
            .items
    }

    /// Polls `check` until it returns `Some`, at most [`WAIT`].
    fn eventually<T>(&self, what: &str, check: impl FnMut() -> Option<T>) -> T {
        eventually_blocking(what, WAIT, check)
    }
}

/// A controller manager running in a test's runtime; stopped when dropped.
struct Controllers {
    stop: CancelToken,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Controllers {
    fn drop(&mut self) {
        self.stop.cancel();
        self.task.abort();
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
    // A kubeconfig (this in-process server speaks plain HTTP, so no CA or credentials).
    let config = c.file(
        "config.yaml",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n\
             users:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    \
             cluster: c\n    user: u\ncurrent-context: c\n",
            c.endpoint
        ),
    );
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

/// A deployment `web` in `default` whose pods run `version` (an env var), with `cause` as its
/// change cause.
fn web(replicas: u32, version: &str, cause: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  annotations: {{kubernetes.io/change-cause: "{cause}"}}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
      - name: web
        image: host
        command: ["sleep", "3600"]
        env: [{{name: VERSION, value: "{version}"}}]
"#
    )
}

fn version_of(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.containers.first())
        .and_then(|c| c.env.first())
        .map(|e| e.value.clone())
        .unwrap_or_default()
}

fn replicas_of(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(-1)
}

fn annotation(o: &impl Resource, key: &str) -> Option<String> {
    o.metadata().and_then(|m| m.annotations.get(key).cloned())
}

#[test]
fn scale_deployments_and_replica_sets() {
    let c = Cluster::start();
    let file = c.file("web.yaml", &web(2, "v1", "create"));
    c.skiff(&["apply", "-f", path(&file)]).ok();
    let rs = c.file(
        "rs.yaml",
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: front}\nspec:\n  replicas: 2\n  \
         selector: {matchLabels: {app: front}}\n  template:\n    metadata: {labels: {app: front}}\n    \
         spec: {containers: [{name: c, image: host}]}\n",
    );
    c.skiff(&["apply", "-f", path(&rs)]).ok();

    let out = c.skiff(&["scale", "deploy/web", "--replicas=5"]).ok();
    assert_eq!(out, "deployment.apps/web scaled\n");
    assert_eq!(replicas_of(&c.deployment("web")), 5);
    let out = c
        .skiff(&["scale", "deployment", "web", "--replicas", "1"])
        .ok();
    assert_eq!(out, "deployment.apps/web scaled\n");
    assert_eq!(replicas_of(&c.deployment("web")), 1);

    // The precondition no longer holds: nothing is written.
    let generation = c.deployment("web").metadata.unwrap().generation;
    let err = c
        .skiff(&[
            "scale",
            "deploy/web",
            "--replicas=3",
            "--current-replicas=2",
        ])
        .fails();
    assert_eq!(
        err,
        "error: deployment.apps/web: expected replicas to be 2 (--current-replicas), but it is 1\n"
    );
    let d = c.deployment("web");
    assert_eq!(replicas_of(&d), 1);
    assert_eq!(d.metadata.unwrap().generation, generation);
    // It holds: scaled.
    c.skiff(&[
        "scale",
        "deploy/web",
        "--replicas=3",
        "--current-replicas=1",
    ])
    .ok();
    assert_eq!(replicas_of(&c.deployment("web")), 3);

    let out = c.skiff(&["scale", "rs/front", "--replicas=0"]).ok();
    assert_eq!(out, "replicaset.apps/front scaled\n");
    let front = c
        .replica_sets()
        .into_iter()
        .find(|r| r.name() == "front")
        .expect("replica set front");
    assert_eq!(front.spec.unwrap().replicas, Some(0));

    // Errors name the problem, one line each.
    for (args, want) in [
        (
            &["scale", "pods", "p", "--replicas=1"][..],
            "error: cannot scale pods: only deployments and replicasets have replicas\n",
        ),
        (
            &["scale", "deploy/web", "--replicas=-1"][..],
            "error: --replicas: must be greater than or equal to 0 (got -1)\n",
        ),
        (
            &["scale", "deploy/nope", "--replicas=1"][..],
            "error: deployments.apps \"nope\" not found\n",
        ),
        (
            &["scale", "widgets/x", "--replicas=1"][..],
            "error: the server doesn't have a resource type \"widgets\"\n",
        ),
    ] {
        assert_eq!(c.skiff(args).fails(), want, "{args:?}");
    }
    assert_eq!(replicas_of(&c.deployment("web")), 3);
}

#[test]
fn rollout_status_follows_an_update_to_success() {
    let c = Cluster::start();
    let _controllers = c.start_controllers();
    let _kubelet = c.start_kubelet(Duration::from_millis(300));
    let v1 = c.file("v1.yaml", &web(3, "v1", "create"));
    c.skiff(&["apply", "-f", path(&v1)]).ok();
    let out = c
        .skiff(&["rollout", "status", "deploy/web", "--timeout=20s"])
        .ok();
    assert!(
        out.ends_with("deployment \"web\" successfully rolled out\n"),
        "{out}"
    );

    // An update: status starts while it is under way and follows it to the end.
    let v2 = c.file("v2.yaml", &web(3, "v2", "bump"));
    c.skiff(&["apply", "-f", path(&v2)]).ok();
    let out = c
        .skiff(&["rollout", "status", "deployment", "web", "--timeout=20s"])
        .ok();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 2, "no progress shown:\n{out}");
    for l in &lines[..lines.len() - 1] {
        assert!(
            l.starts_with("Waiting for deployment \"web\" rollout to finish: ")
                || *l == "Waiting for deployment spec update to be observed...",
            "{out}"
        );
    }
    assert!(
        out.contains("new replicas have been updated...")
            || out.contains("old replicas are pending termination...")
            || out.contains("updated replicas are available..."),
        "{out}"
    );
    assert_eq!(
        lines.last(),
        Some(&"deployment \"web\" successfully rolled out")
    );
    let d = c.deployment("web");
    let s = d.status.clone().expect("status");
    assert_eq!(
        (s.updated_replicas, s.replicas, s.available_replicas),
        (3, 3, 3)
    );
    assert_eq!(annotation(&d, REVISION).as_deref(), Some("2"));

    // --watch=false prints the status once.
    let out = c
        .skiff(&["rollout", "status", "deploy/web", "--watch=false"])
        .ok();
    assert_eq!(out, "deployment \"web\" successfully rolled out\n");

    let err = c.skiff(&["rollout", "status", "deploy/nope"]).fails();
    assert_eq!(err, "error: deployments.apps \"nope\" not found\n");
    let err = c.skiff(&["rollout", "status", "rs/web"]).fails();
    assert_eq!(
        err,
        "error: rollout status works on deployments only, not replicasets\n"
    );
}

#[test]
fn rollout_status_fails_when_pods_never_become_ready() {
    let c = Cluster::start();
    let _controllers = c.start_controllers();
    // No kubelet: pods are created but never Ready.
    let v1 = c.file("v1.yaml", &web(2, "v1", "create"));
    c.skiff(&["apply", "-f", path(&v1)]).ok();
    let started = std::time::Instant::now();
    let run = c.skiff(&["rollout", "status", "deploy/web", "--timeout=2s"]);
    let elapsed = started.elapsed();
    let err = run.fails();
    assert!(
        err.starts_with(
            "error: timed out after 2s waiting for deployment \"web\" rollout to finish \
             (last status: Waiting for deployment \"web\" rollout to finish: "
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(15),
        "{elapsed:?}"
    );
    assert!(
        run.stdout().starts_with("Waiting for deployment "),
        "{}",
        run.stdout()
    );

    // With a progress deadline the controller gives up, and so does status, before the
    // timeout.
    let stuck = c.file(
        "stuck.yaml",
        &web(2, "v1", "stuck")
            .replace("name: web\n", "name: stuck\n")
            .replace("{app: web}", "{app: stuck}")
            .replace(
                "  replicas: 2\n",
                "  replicas: 2\n  progressDeadlineSeconds: 1\n",
            ),
    );
    c.skiff(&["apply", "-f", path(&stuck)]).ok();
    let started = std::time::Instant::now();
    let err = c
        .skiff(&["rollout", "status", "deploy/stuck", "--timeout=20s"])
        .fails();
    assert_eq!(
        err,
        "error: deployment \"stuck\" exceeded its progress deadline\n"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn rollout_history_undo_pause_resume_restart() {
    let c = Cluster::start();
    let _controllers = c.start_controllers();
    let _kubelet = c.start_kubelet(Duration::from_millis(20));
    let rolled_out = |c: &Cluster| {
        let out = c
            .skiff(&["rollout", "status", "deploy/web", "--timeout=20s"])
            .ok();
        assert!(out.ends_with("successfully rolled out\n"), "{out}");
    };
    let v1 = c.file("v1.yaml", &web(2, "v1", "create v1"));
    c.skiff(&["apply", "-f", path(&v1)]).ok();
    rolled_out(&c);

    // Only one revision: nothing to go back to.
    let err = c.skiff(&["rollout", "undo", "deploy/web"]).fails();
    assert_eq!(
        err,
        "error: no previous revision of deployment \"web\" to roll back to\n"
    );

    let v2 = c.file("v2.yaml", &web(2, "v2", "bump to v2"));
    c.skiff(&["apply", "-f", path(&v2)]).ok();
    rolled_out(&c);
    let out = c.skiff(&["rollout", "history", "deploy/web"]).ok();
    assert_eq!(
        out,
        "deployment.apps/web\nREVISION   CHANGE-CAUSE\n1          create v1\n2          bump to v2\n"
    );
    let out = c
        .skiff(&["rollout", "history", "deploy/web", "--revision=1"])
        .ok();
    assert!(
        out.starts_with(
            "deployment.apps/web with revision #1\nChange cause: create v1\nPod template:\n"
        ),
        "{out}"
    );
    assert!(out.contains("value: v1"), "{out}");
    assert!(!out.contains("value: v2"), "{out}");
    let err = c
        .skiff(&["rollout", "history", "deploy/web", "--revision=9"])
        .fails();
    assert_eq!(
        err,
        "error: deployment.apps/web: unable to find revision 9 in history\n"
    );

    // Undo: revision 1's template comes back and the controller makes it revision 3.
    let revision_1 = c
        .replica_sets()
        .into_iter()
        .find(|rs| annotation(rs, REVISION).as_deref() == Some("1"))
        .expect("the replica set of revision 1");
    let out = c.skiff(&["rollout", "undo", "deploy/web"]).ok();
    assert_eq!(out, "deployment.apps/web rolled back\n");
    rolled_out(&c);
    let d = c.deployment("web");
    assert_eq!(version_of(&d), "v1");
    assert!(templates_equal(
        d.spec.as_ref().and_then(|s| s.template.as_ref()),
        revision_1.spec.as_ref().and_then(|s| s.template.as_ref())
    ));
    assert_eq!(annotation(&d, CHANGE_CAUSE).as_deref(), Some("create v1"));
    let rs1 = c.eventually("revision 1 re-numbered 3", || {
        c.replica_sets()
            .into_iter()
            .find(|rs| rs.name() == revision_1.name())
            .filter(|rs| annotation(rs, REVISION).as_deref() == Some("3"))
    });
    assert_eq!(rs1.spec.unwrap().replicas, Some(2));
    assert_eq!(
        annotation(&c.deployment("web"), REVISION).as_deref(),
        Some("3")
    );
    let out = c.skiff(&["rollout", "history", "deploy/web"]).ok();
    assert_eq!(
        out,
        "deployment.apps/web\nREVISION   CHANGE-CAUSE\n2          bump to v2\n3          create v1\n"
    );
    let out = c
        .skiff(&["rollout", "undo", "deploy/web", "--to-revision=3"])
        .ok();
    assert_eq!(
        out,
        "deployment.apps/web skipped rollback (current template already matches revision 3)\n"
    );
    let err = c
        .skiff(&["rollout", "undo", "deploy/web", "--to-revision=1"])
        .fails();
    assert_eq!(
        err,
        "error: unable to find revision 1 in the history of deployment \"web\"\n"
    );

    // Pause: a template change is not rolled out.
    let out = c.skiff(&["rollout", "pause", "deploy/web"]).ok();
    assert_eq!(out, "deployment.apps/web paused\n");
    let out = c.skiff(&["rollout", "pause", "deploy/web"]).ok();
    assert_eq!(out, "deployment.apps/web already paused\n");
    let v4 = c.file("v4.yaml", &web(2, "v4", "v4"));
    c.skiff(&["apply", "-f", path(&v4)]).ok();
    let d = c.eventually("the paused change observed", || {
        let d = c.deployment("web");
        let generation = d.metadata.as_ref()?.generation;
        (d.status.as_ref()?.observed_generation == generation).then_some(d)
    });
    assert!(d.spec.as_ref().unwrap().paused);
    assert_eq!(
        c.replica_sets().len(),
        2,
        "no replica set for the paused change"
    );
    let out = c
        .skiff(&["rollout", "status", "deploy/web", "--watch=false"])
        .ok();
    assert_eq!(
        out,
        "Waiting for deployment \"web\" rollout to finish: 0 out of 2 new replicas have been \
         updated...\n"
    );
    let err = c.skiff(&["rollout", "undo", "deploy/web"]).fails();
    assert!(
        err.starts_with(
            "error: deployment \"web\" is paused: you cannot roll back a paused deployment"
        ),
        "{err}"
    );
    let err = c.skiff(&["rollout", "restart", "deploy/web"]).fails();
    assert!(err.contains("cannot restart a paused deployment"), "{err}");

    // Resume: it rolls out.
    let out = c.skiff(&["rollout", "resume", "deploy/web"]).ok();
    assert_eq!(out, "deployment.apps/web resumed\n");
    let out = c.skiff(&["rollout", "resume", "deploy/web"]).ok();
    assert_eq!(out, "deployment.apps/web already resumed\n");
    rolled_out(&c);
    let d = c.deployment("web");
    assert_eq!(version_of(&d), "v4");
    assert_eq!(annotation(&d, REVISION).as_deref(), Some("4"));

    // Restart: a new template (restartedAt), so a new revision.
    let out = c.skiff(&["rollout", "restart", "deploy/web"]).ok();
    assert_eq!(out, "deployment.apps/web restarted\n");
    rolled_out(&c);
    let d = c.deployment("web");
    let restarted_at = d
        .spec
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .and_then(|t| annotation_of_template(t, "kubectl.kubernetes.io/restartedAt"))
        .expect("restartedAt on the template");
    assert!(
        chrono::DateTime::parse_from_rfc3339(&restarted_at).is_ok(),
        "{restarted_at}"
    );
    assert_eq!(annotation(&d, REVISION).as_deref(), Some("5"));
}

fn annotation_of_template(t: &skiff_api::api::PodTemplateSpec, key: &str) -> Option<String> {
    t.metadata.as_ref()?.annotations.get(key).cloned()
}
