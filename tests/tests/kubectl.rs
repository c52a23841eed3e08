//! The real kubectl (1.32, the one on every machine) against a real Skiff cluster: etcd, the
//! API server, scheduler, controller manager and one node agent running real pods. Each
//! command is checked for what it prints on a Kubernetes cluster.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::io::{BufRead, BufReader};
use std::process::{Output, Stdio};
use std::time::Duration;

use skiff_tests::cluster::Cluster;
use skiff_tests::{ApiServer, Backend, EtcdServer, Streaming, eventually_within};

const T: Duration = Duration::from_secs(60);

/// One test at a time: each starts its own cluster.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const WEB: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: REPLICAS
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: app
        image: host
        command: ["busybox", "sh", "-c", "echo hello from web; echo second line; while true; do sleep 1; done"]
"#;

fn web(replicas: u32) -> String {
    WEB.replace("REPLICAS", &replicas.to_string())
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Runs kubectl; returns stdout, failing the test (with stderr) if kubectl failed.
fn ok(server: &ApiServer, args: &[&str]) -> String {
    let out = server.kubectl(args);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

fn ok_stdin(server: &ApiServer, args: &[&str], stdin: &str) -> String {
    let out = server.kubectl_stdin(args, stdin);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

/// Runs kubectl expecting failure; returns stderr.
fn fails(server: &ApiServer, args: &[&str], stdin: Option<&str>) -> String {
    let out = match stdin {
        Some(s) => server.kubectl_stdin(args, s),
        None => server.kubectl(args),
    };
    let (stdout, stderr) = text(&out);
    assert!(
        !out.status.success(),
        "kubectl {args:?} should fail:\n{stdout}"
    );
    stderr
}

fn first_line(s: &str) -> Vec<&str> {
    s.lines().next().unwrap_or("").split_whitespace().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_manages_workloads_as_on_a_kubernetes_cluster() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(1).await;
    let s = &c.server;

    // Who is there.
    let version = ok(s, &["version", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert_eq!(v["serverVersion"]["major"], "1");
    assert_eq!(v["serverVersion"]["minor"], "32");
    let resources = ok(s, &["api-resources"]);
    assert!(
        resources
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["deployments", "deploy", "apps/v1", "true", "Deployment"]),
        "{resources}"
    );

    // apply: created, unchanged, configured.
    assert_eq!(
        ok_stdin(s, &["apply", "-f", "-"], &web(2)),
        "deployment.apps/web created\n"
    );
    assert_eq!(
        ok_stdin(s, &["apply", "-f", "-"], &web(2)),
        "deployment.apps/web unchanged\n"
    );
    assert_eq!(
        ok_stdin(s, &["apply", "-f", "-"], &web(3)),
        "deployment.apps/web configured\n"
    );
    let rollout = ok(s, &["rollout", "status", "deploy/web", "--timeout=60s"]);
    assert!(
        rollout.contains("deployment \"web\" successfully rolled out"),
        "{rollout}"
    );
    assert_eq!(
        ok(
            s,
            &[
                "wait",
                "--for=condition=Available",
                "deploy/web",
                "--timeout=60s"
            ]
        ),
        "deployment.apps/web condition met\n"
    );
    // kubectl diff: nothing to change (exit 0), then a change (exit 1, the diff shown).
    let same = s.kubectl_stdin(&["diff", "-f", "-"], &web(3));
    assert_eq!(same.status.code(), Some(0), "{:?}", text(&same));
    let changed = s.kubectl_stdin(&["diff", "-f", "-"], &web(4));
    assert_eq!(changed.status.code(), Some(1), "{:?}", text(&changed));
    assert!(
        text(&changed).0.contains("+  replicas: 4"),
        "{:?}",
        text(&changed)
    );

    // get, in each output format.
    let pods = ok(s, &["get", "pods"]);
    assert_eq!(
        first_line(&pods),
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    );
    assert_eq!(
        pods.lines().filter(|l| l.contains(" Running ")).count(),
        3,
        "{pods}"
    );
    let wide = ok(s, &["get", "pods", "-o", "wide"]);
    assert_eq!(
        &first_line(&wide)[..7],
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    );
    let node = &c.nodes[0].name;
    assert!(
        wide.lines().skip(1).all(|l| l.contains(node.as_str())),
        "{wide}"
    );
    let names = ok(s, &["get", "pods", "-l", "app=web", "-o", "name"]);
    assert_eq!(names.lines().count(), 3, "{names}");
    assert!(names.lines().all(|l| l.starts_with("pod/web-")), "{names}");
    let all = ok(s, &["get", "deploy", "-A"]);
    assert_eq!(first_line(&all)[..2], ["NAMESPACE", "NAME"]);
    let labels = ok(s, &["get", "deploy", "web", "--show-labels"]);
    assert!(labels.contains("app=web"), "{labels}");
    let running = ok(
        s,
        &[
            "get",
            "pods",
            "--field-selector",
            "status.phase=Running",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ],
    );
    assert_eq!(running, "Running Running Running");
    let json: serde_json::Value =
        serde_json::from_str(&ok(s, &["get", "deploy", "web", "-o", "json"])).unwrap();
    assert_eq!(json["kind"], "Deployment");
    assert_eq!(json["spec"]["replicas"], 3);
    let yaml = ok(s, &["get", "deploy", "web", "-o", "yaml"]);
    assert!(yaml.contains("kind: Deployment\n"), "{yaml}");

    // A watch prints a line per change.
    let mut watch = s
        .kubectl_cmd(&["get", "deploy", "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = {
        let stdout = watch.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        rx
    };
    let header = lines.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(
        first_line(&header),
        ["EVENT", "NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    );
    let first = lines.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(first.contains("ADDED") && first.contains("web"), "{first}");
    ok(s, &["label", "deploy", "web", "tier=frontend"]);
    let mut saw_modified = false;
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(20)) {
        if line.contains("MODIFIED") && line.contains("web") {
            saw_modified = true;
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(saw_modified, "kubectl get -w showed no MODIFIED line");

    // Metadata and patches of all three types, and scale.
    assert_eq!(
        ok(s, &["annotate", "deploy", "web", "team=edge"]),
        "deployment.apps/web annotated\n"
    );
    ok(
        s,
        &[
            "patch",
            "deploy",
            "web",
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"merge":"yes"}}}"#,
        ],
    );
    ok(
        s,
        &[
            "patch",
            "deploy",
            "web",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/metadata/labels/json","value":"yes"}]"#,
        ],
    );
    ok(
        s,
        &[
            "patch",
            "deploy",
            "web",
            "-p",
            r#"{"spec":{"template":{"spec":{"containers":[{"name":"app","env":[{"name":"PATCHED","value":"1"}]}]}}}}"#,
        ],
    );
    let patched: serde_json::Value =
        serde_json::from_str(&ok(s, &["get", "deploy", "web", "-o", "json"])).unwrap();
    let meta = &patched["metadata"];
    assert_eq!(
        (
            &meta["labels"]["tier"],
            &meta["labels"]["merge"],
            &meta["labels"]["json"],
            &meta["annotations"]["team"]
        ),
        (
            &serde_json::json!("frontend"),
            &serde_json::json!("yes"),
            &serde_json::json!("yes"),
            &serde_json::json!("edge")
        )
    );
    let container = &patched["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["env"][0]["name"], "PATCHED", "{container}");
    assert!(
        container["command"].is_array(),
        "strategic merge kept the command"
    );
    assert_eq!(
        ok(s, &["scale", "deploy", "web", "--replicas=2"]),
        "deployment.apps/web scaled\n"
    );
    ok(s, &["rollout", "status", "deploy/web", "--timeout=60s"]);

    // edit, through an editor that is a sed script.
    let mut edit = s.kubectl_cmd(&["edit", "deploy", "web"]);
    edit.env("KUBE_EDITOR", "sed -i s/team:\\ edge/team:\\ core/");
    let out = edit.output().unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(text(&out).0, "deployment.apps/web edited\n");
    assert_eq!(
        ok(
            s,
            &[
                "get",
                "deploy",
                "web",
                "-o",
                "jsonpath={.metadata.annotations.team}"
            ]
        ),
        "core"
    );

    // Rollouts: restart, history, undo.
    ok(s, &["rollout", "restart", "deploy/web"]);
    ok(s, &["rollout", "status", "deploy/web", "--timeout=60s"]);
    let history = ok(s, &["rollout", "history", "deploy/web"]);
    let revisions: Vec<&str> = history
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert!(revisions.len() >= 2, "{history}");
    assert_eq!(
        ok(s, &["rollout", "undo", "deploy/web"]),
        "deployment.apps/web rolled back\n"
    );
    ok(s, &["rollout", "status", "deploy/web", "--timeout=60s"]);

    // describe shows the controller's events.
    let describe = ok(s, &["describe", "deploy", "web"]);
    assert!(describe.contains("ScalingReplicaSet"), "{describe}");
    assert!(describe.contains("deployment-controller"), "{describe}");

    // logs: whole, --tail, -c, and -f.
    let pod = eventually_within("a running web pod", T, || async {
        let out = s.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "--field-selector",
            "status.phase=Running",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ]);
        let name = text(&out).0;
        if name.is_empty() {
            Err("none yet".to_string())
        } else {
            Ok(name)
        }
    })
    .await;
    let logs = eventually_within("the pod's log", T, || async {
        let out = s.kubectl(&["logs", &pod]);
        let (o, e) = text(&out);
        if o.contains("hello from web") {
            Ok(o)
        } else {
            Err(format!("{o}{e}"))
        }
    })
    .await;
    assert_eq!(logs, "hello from web\nsecond line\n");
    assert_eq!(ok(s, &["logs", &pod, "--tail=1"]), "second line\n");
    assert_eq!(
        ok(s, &["logs", &pod, "-c", "app", "--tail=1"]),
        "second line\n"
    );
    let wrong = fails(s, &["logs", &pod, "-c", "nope"], None);
    assert!(
        wrong.contains(&format!("container nope is not valid for pod {pod}")),
        "{wrong}"
    );
    let mut follow = s
        .kubectl_cmd(&["logs", "-f", &pod])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(follow.stdout.take().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "hello from web\n");
    // -f keeps the stream open: the process is still running.
    std::thread::sleep(Duration::from_millis(500));
    assert!(follow.try_wait().unwrap().is_none(), "logs -f ended");
    let _ = follow.kill();
    let _ = follow.wait();

    // exec: stdout, stderr and the exit code come back as kubectl reports them.
    assert_eq!(
        ok(s, &["exec", &pod, "--", "echo", "hi from exec"]),
        "hi from exec\n"
    );
    let out = s.kubectl(&[
        "exec",
        &pod,
        "-c",
        "app",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert_eq!(stdout, "out\n");
    assert!(stderr.starts_with("err\n"), "{stderr}");
    assert!(
        stderr.contains("command terminated with exit code 3"),
        "{stderr}"
    );

    // explain reads the OpenAPI document.
    let explain = ok(s, &["explain", "deployment.spec.replicas"]);
    assert!(explain.contains("FIELD: replicas <integer>"), "{explain}");

    // cordon / uncordon.
    assert_eq!(ok(s, &["cordon", node]), format!("node/{node} cordoned\n"));
    let nodes = ok(s, &["get", "nodes"]);
    assert!(nodes.contains("Ready,SchedulingDisabled"), "{nodes}");
    assert_eq!(
        ok(s, &["uncordon", node]),
        format!("node/{node} uncordoned\n")
    );

    // delete: orphaning keeps the ReplicaSets, the default cascade removes them.
    ok_stdin(
        s,
        &["apply", "-f", "-"],
        &web(1).replace("name: web\n", "name: orphaner\n"),
    );
    ok(
        s,
        &["rollout", "status", "deploy/orphaner", "--timeout=60s"],
    );
    assert_eq!(
        ok(s, &["delete", "deploy", "orphaner", "--cascade=orphan"]),
        "deployment.apps \"orphaner\" deleted\n"
    );
    let rs = ok(s, &["get", "rs", "-o", "name"]);
    assert!(rs.contains("replicaset.apps/orphaner-"), "{rs}");
    assert_eq!(
        ok(s, &["delete", "deploy", "web"]),
        "deployment.apps \"web\" deleted\n"
    );
    eventually_within("web's ReplicaSets collected", T, || async {
        let rs = text(&s.kubectl(&["get", "rs", "-o", "name"])).0;
        if rs.contains("replicaset.apps/web-") {
            Err(rs)
        } else {
            Ok(())
        }
    })
    .await;
    drop(c);
}

/// Errors as Kubernetes gives them, and nothing written by a refused request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_errors_are_kubernetes_errors() {
    let _serial = SERIAL.lock().await;
    let s = ApiServer::start(Backend::Embedded);

    // --validate=strict (kubectl's default) names the unknown field, and creates nothing.
    let bad = web(1).replace("  replicas: 1\n", "  replicas: 1\n  replicaz: 2\n");
    let err = fails(&s, &["apply", "-f", "-"], Some(&bad));
    assert!(
        err.contains("strict decoding error: unknown field \"spec.replicaz\""),
        "{err}"
    );
    let missing = fails(&s, &["get", "deploy", "web"], None);
    assert_eq!(
        missing,
        "Error from server (NotFound): deployments.apps \"web\" not found\n"
    );

    // A `kind: List` manifest (kubectl fetches /openapi/v2 for it, then sends its items each
    // with strict field validation): created; an unknown field in an item is still named.
    let list = r#"{"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "listed"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "listed"},
         "stringData": {"k": "v"}}]}"#;
    assert_eq!(
        ok_stdin(&s, &["apply", "-f", "-"], list),
        "namespace/listed created\nsecret/s created\n"
    );
    let bad_list = list.replace(
        "\"name\": \"listed\"}}",
        "\"name\": \"listed2\"}, \"spek\": {}}",
    );
    let err = fails(&s, &["apply", "-f", "-"], Some(&bad_list));
    assert!(err.contains("unknown field \"spek\""), "{err}");

    // Invalid objects: 422 with the field path.
    let invalid = web(1).replace("  replicas: 1\n", "  replicas: -1\n");
    let err = fails(&s, &["create", "-f", "-"], Some(&invalid));
    assert!(
        err.contains("The Deployment \"web\" is invalid: spec.replicas: Invalid value: -1"),
        "{err}"
    );

    // A stale resourceVersion: 409 with Kubernetes' message.
    ok_stdin(&s, &["create", "-f", "-"], &web(1));
    let live = ok(&s, &["get", "deploy", "web", "-o", "yaml"]);
    ok(&s, &["label", "deploy", "web", "moved=on"]);
    let err = fails(&s, &["replace", "-f", "-"], Some(&live));
    assert!(
        err.contains(
            "Operation cannot be fulfilled on deployments.apps \"web\": the object has been \
             modified; please apply your changes to the latest version and try again"
        ),
        "{err}"
    );
    // A malformed manifest is refused before anything is sent.
    let err = fails(&s, &["apply", "-f", "-"], Some("kind: [unclosed\n"));
    assert!(err.contains("error"), "{err}");
    // An invalid patch.
    let err = fails(
        &s,
        &[
            "patch",
            "deploy",
            "web",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/nope"}]"#,
        ],
        None,
    );
    assert!(err.contains("The request is invalid: "), "{err}");
    assert_eq!(
        ok(
            &s,
            &[
                "get",
                "deploy",
                "web",
                "-o",
                "jsonpath={.metadata.labels.moved}"
            ]
        ),
        "on"
    );
}

/// `kubectl apply --server-side`: creates, records the manager in managedFields, conflicts
/// with another manager's field (Kubernetes' message and exit), takes it with
/// `--force-conflicts`, and removes what the applier dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply() {
    let _serial = SERIAL.lock().await;
    let etcd = EtcdServer::start().expect("a real etcd (run `cargo xtask setup`)");
    let s = ApiServer::start(Backend::Etcd(etcd.endpoint.clone()));
    let ssa = ["apply", "--server-side", "-f", "-"];

    let tiered = web(2).replace(
        "  labels: {app: web}\n",
        "  labels: {app: web, tier: front}\n",
    );
    assert_eq!(
        ok_stdin(&s, &ssa, &tiered),
        "deployment.apps/web serverside-applied\n"
    );
    let managed = ok(
        &s,
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "json",
            "--show-managed-fields",
        ],
    );
    let obj: serde_json::Value = serde_json::from_str(&managed).unwrap();
    let entries = obj["metadata"]["managedFields"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{managed}");
    assert_eq!(entries[0]["manager"], "kubectl");
    assert_eq!(entries[0]["operation"], "Apply");
    assert_eq!(entries[0]["fieldsType"], "FieldsV1");
    assert_eq!(
        entries[0]["fieldsV1"]["f:spec"]["f:replicas"],
        serde_json::json!({})
    );
    // kubectl hides them unless asked.
    let plain = ok(&s, &["get", "deploy", "web", "-o", "yaml"]);
    assert!(!plain.contains("managedFields"), "{plain}");
    // Applying the same intent again changes nothing.
    assert_eq!(
        ok_stdin(&s, &ssa, &tiered),
        "deployment.apps/web serverside-applied\n"
    );

    // Another manager takes spec.replicas with a patch...
    ok(
        &s,
        &["patch", "deploy", "web", "-p", r#"{"spec":{"replicas":5}}"#],
    );
    let managers = ok(
        &s,
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
        ],
    );
    assert_eq!(managers, "kubectl kubectl-patch");
    // ...so applying another value conflicts, as on Kubernetes, and writes nothing.
    let err = fails(
        &s,
        &ssa,
        Some(&tiered.replace("replicas: 2", "replicas: 3")),
    );
    assert!(
        err.contains(
            "Apply failed with 1 conflict: conflict with \"kubectl-patch\" using apps/v1: \
             .spec.replicas"
        ),
        "{err}"
    );
    assert!(err.contains("--force-conflicts"), "kubectl's advice: {err}");
    let replicas = ["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"];
    assert_eq!(ok(&s, &replicas), "5");

    // Forced, the field moves to the applier; dropping the tier label removes it.
    let forced = ["apply", "--server-side", "--force-conflicts", "-f", "-"];
    assert_eq!(
        ok_stdin(&s, &forced, &web(3)),
        "deployment.apps/web serverside-applied\n"
    );
    assert_eq!(ok(&s, &replicas), "3");
    let labels = ok(
        &s,
        &["get", "deploy", "web", "-o", "jsonpath={.metadata.labels}"],
    );
    assert_eq!(labels, r#"{"app":"web"}"#);
    let managers = ok(
        &s,
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
        ],
    );
    assert_eq!(managers, "kubectl", "kubectl-patch owned nothing else");

    // A scale is an update by kubectl's scale manager; dry-run writes nothing.
    // kubectl scale sends no fieldManager: the manager is its User-Agent's product.
    ok(&s, &["scale", "deploy", "web", "--replicas=4"]);
    let err = fails(&s, &ssa, Some(&web(3)));
    assert!(err.contains("conflict with"), "{err}");
    let dry = [
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        "-f",
        "-",
    ];
    assert!(ok_stdin(&s, &dry, &web(3)).contains("serverside-applied (server dry run)"));
    assert_eq!(ok(&s, &replicas), "4");
}

/// kubectl's typed commands send Kubernetes protobuf (and do not fall back to JSON):
/// `create namespace|deployment|service`, and `drain`, whose evictions go through the
/// `pods/eviction` subresource; the drained node's pods are evicted and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_typed_commands_and_drain() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(2).await;
    let s = &c.server;
    let (a, b) = (&c.nodes[0].name, &c.nodes[1].name);

    assert_eq!(
        ok(s, &["create", "namespace", "shop"]),
        "namespace/shop created\n"
    );
    assert_eq!(
        ok(
            s,
            &[
                "create",
                "deployment",
                "web",
                "-n",
                "shop",
                "--image=host",
                "--replicas=2",
                "--port=8080",
                "--",
                "busybox",
                "sleep",
                "3600",
            ]
        ),
        "deployment.apps/web created\n"
    );
    assert_eq!(
        ok(
            s,
            &[
                "create",
                "service",
                "clusterip",
                "web",
                "-n",
                "shop",
                "--tcp=80:8080"
            ]
        ),
        "service/web created\n"
    );
    let svc = ok(
        s,
        &[
            "get",
            "svc",
            "web",
            "-n",
            "shop",
            "-o",
            "jsonpath={.spec.ports[0].targetPort} {.spec.clusterIP}",
        ],
    );
    let (target, ip) = svc.split_once(' ').unwrap();
    assert_eq!(target, "8080");
    assert!(ip.starts_with("10.96."), "{svc}");
    let rolled_out = || {
        let rollout = ok(
            s,
            &[
                "rollout",
                "status",
                "deploy/web",
                "-n",
                "shop",
                "--timeout=60s",
            ],
        );
        assert!(rollout.contains("successfully rolled out"), "{rollout}");
    };
    rolled_out();
    // An explicit zero survives the protobuf body.
    ok(
        s,
        &[
            "create",
            "deployment",
            "idle",
            "-n",
            "shop",
            "--image=host",
            "--replicas=0",
        ],
    );
    assert_eq!(
        ok(
            s,
            &[
                "get",
                "deploy",
                "idle",
                "-n",
                "shop",
                "-o",
                "jsonpath={.spec.replicas}"
            ]
        ),
        "0"
    );

    // Drain the node with pods on it: cordoned, each pod evicted, replacements elsewhere.
    let on = |node: &str| {
        ok(
            s,
            &[
                "get",
                "pods",
                "-n",
                "shop",
                "--field-selector",
                &format!("spec.nodeName={node}"),
                "-o",
                "name",
            ],
        )
    };
    let busy = if on(a).is_empty() { b } else { a };
    let drained = ok(s, &["drain", busy, "--timeout=60s", "--grace-period=1"]);
    assert!(
        drained.contains(&format!("node/{busy} cordoned")),
        "{drained}"
    );
    assert!(drained.contains("evicting pod shop/web-"), "{drained}");
    assert!(
        drained.contains(&format!("node/{busy} drained")),
        "{drained}"
    );
    assert_eq!(
        ok(
            s,
            &["get", "node", busy, "-o", "jsonpath={.spec.unschedulable}"]
        ),
        "true"
    );
    assert!(on(busy).is_empty(), "pods left on {busy}");
    rolled_out();
    assert_eq!(
        ok(s, &["uncordon", busy]),
        format!("node/{busy} uncordoned\n")
    );
    // An eviction of a pod that is not there is Kubernetes' 404.
    let err = fails(s, &["drain", "no-such-node", "--timeout=5s"], None);
    assert!(err.contains("nodes \"no-such-node\" not found"), "{err}");
}

/// `kubectl port-forward`: a real TCP round trip from a local port to a server listening on
/// the pod's localhost, through the API server's SPDY-in-WebSocket session and the node
/// agent; a port nothing listens on is reported by kubectl, which keeps forwarding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forward() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(1).await;
    let s = &c.server;
    let pod = r#"apiVersion: v1
kind: Pod
metadata: {name: echo}
spec:
  containers:
  - name: http
    image: host
    command: ["/usr/bin/python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"]
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
"#;
    ok_stdin(s, &["apply", "-f", "-"], pod);
    ok(
        s,
        &["wait", "--for=condition=Ready", "pod/echo", "--timeout=60s"],
    );
    let port_of = |line: &str| -> u16 {
        line.split("127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("a local port in {line:?}"))
    };
    let get = move |port: u16| {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
        conn.set_read_timeout(Some(Duration::from_secs(20)))?;
        conn.write_all(b"GET / HTTP/1.0\r\nHost: echo\r\n\r\n")?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)?;
        Ok::<String, std::io::Error>(answer)
    };
    let forward = Streaming::spawn(s.kubectl_cmd(&["port-forward", "pod/echo", ":8080"]));
    let line = forward
        .wait_for(&["Forwarding from 127.0.0.1:", "-> 8080"], T)
        .expect("kubectl port-forward listening");
    let local = port_of(&line);
    // Three round trips on three connections: each gets its own pair of streams.
    for _ in 0..3 {
        let answer = tokio::task::spawn_blocking(move || get(local))
            .await
            .unwrap()
            .expect("a round trip through the forward");
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
        assert!(answer.contains("Directory listing"), "{answer}");
    }
    drop(forward);

    // 2 MB each way on one connection, with a half-close in between: an echo server in a
    // second pod reads to EOF, then answers "<n>:" and the bytes.
    let sink = r#"apiVersion: v1
kind: Pod
metadata: {name: sink}
spec:
  containers:
  - name: echo
    image: host
    command:
    - /usr/bin/python3
    - -c
    - |
      import socket
      s = socket.socket()
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind(("0.0.0.0", 7000))
      s.listen()
      while True:
          c, _ = s.accept()
          data = b""
          while True:
              b = c.recv(65536)
              if not b:
                  break
              data += b
          c.sendall(b"%d:" % len(data) + data)
          c.close()
    readinessProbe:
      tcpSocket: {port: 7000}
      periodSeconds: 1
"#;
    ok_stdin(s, &["apply", "-f", "-"], sink);
    ok(
        s,
        &["wait", "--for=condition=Ready", "pod/sink", "--timeout=60s"],
    );
    let forward = Streaming::spawn(s.kubectl_cmd(&["port-forward", "pod/sink", ":7000"]));
    let line = forward
        .wait_for(&["Forwarding from 127.0.0.1:", "-> 7000"], T)
        .expect("kubectl port-forward listening");
    let sink_port = port_of(&line);
    let echoed = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let payload: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", sink_port))?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        conn.write_all(&payload)?;
        conn.shutdown(std::net::Shutdown::Write)?;
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer)?;
        Ok::<(Vec<u8>, Vec<u8>), std::io::Error>((payload, answer))
    })
    .await
    .unwrap()
    .expect("2 MB through the forward");
    let (payload, answer) = echoed;
    assert!(
        answer.starts_with(b"2000000:"),
        "{:?}",
        &answer[..answer.len().min(20)]
    );
    assert!(answer[8..] == payload[..], "the bytes came back intact");
    drop(forward);

    // Nothing listens on port 9 in the pod: the connection gets no data, and kubectl 1.32
    // reports the error from the error stream and stops, as on a Kubernetes cluster.
    let mut refused = Streaming::spawn(s.kubectl_cmd(&["port-forward", "pod/echo", ":9"]));
    let line = refused
        .wait_for(&["Forwarding from 127.0.0.1:", "-> 9"], T)
        .expect("kubectl port-forward listening");
    let port = port_of(&line);
    let nothing = tokio::task::spawn_blocking(move || get(port))
        .await
        .unwrap();
    assert!(nothing.map(|a| a.is_empty()).unwrap_or(true));
    let (status, stderr) = refused
        .wait_exit(T)
        .expect("kubectl port-forward stops after the pod refused");
    assert!(!status.success());
    assert!(
        stderr.contains("error forwarding port 9 to pod default/echo")
            && stderr.contains("Connection refused"),
        "{stderr}"
    );
    // A pod that does not exist: Kubernetes' 404.
    let err = fails(s, &["port-forward", "pod/nope", "8080"], None);
    assert!(err.contains("pods \"nope\" not found"), "{err}");
}
