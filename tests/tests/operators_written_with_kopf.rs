//! An operator written in Python with kopf (from PyPI, pinned in
//! `tests/python/requirements.txt`) runs unchanged against Skiff:
//! `tests/python/kopf_operator.py`, started as `kopf run --standalone --namespace NS` with
//! a kubeconfig of its own whose user has only the rights kopf's documentation lists (its
//! kind and the kind's status, events, ConfigMaps it writes, and list/watch of definitions
//! and namespaces). For a `Greeting` (a custom kind with a status subresource, defined by the
//! test) its create handler makes an owned ConfigMap (`kopf.adopt`) and writes the status, its
//! update handler follows spec changes, a timer counts in the status, and its delete handler
//! runs while kopf's finalizer holds the object, which goes only after; the garbage collector
//! then deletes the ConfigMap. Every step converges within a bound; the operator process is
//! killed by its pid at the end, also when the test fails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::{Duration, Instant};

use serde_json::Value;
use skiff_tests::cluster::Cluster;
use skiff_tests::python::{self, PythonProcess};

const NS: &str = "greetings";
/// The finalizer kopf puts on the objects it handles (its default).
const KOPF_FINALIZER: &str = "kopf.zalando.org/KopfFinalizerMarker";
/// How long each step may take to converge.
const BOUND: Duration = Duration::from_secs(60);

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: greetings.kopf.skiff.io}
spec:
  group: kopf.skiff.io
  scope: Namespaced
  names: {plural: greetings, singular: greeting, kind: Greeting, listKind: GreetingList}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              message: {type: string}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"#;

/// The operator's rights: kopf's documented needs for one namespace, and what its
/// handlers write.
const RBAC: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata: {name: kopf-greeter}
  rules:
  - {apiGroups: [apiextensions.k8s.io], resources: [customresourcedefinitions], verbs: [list, watch]}
  - {apiGroups: [""], resources: [namespaces], verbs: [list, watch]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: kopf-greeter}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kopf-greeter}
  subjects: [{kind: User, apiGroup: rbac.authorization.k8s.io, name: kopf-greeter}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: Role
  metadata: {name: kopf-greeter, namespace: greetings}
  rules:
  - {apiGroups: [kopf.skiff.io], resources: [greetings], verbs: [list, watch, patch]}
  - {apiGroups: [kopf.skiff.io], resources: [greetings/status], verbs: [patch]}
  - {apiGroups: [""], resources: [events], verbs: [create]}
  - {apiGroups: [""], resources: [configmaps], verbs: [create, patch]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: RoleBinding
  metadata: {name: kopf-greeter, namespace: greetings}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: kopf-greeter}
  subjects: [{kind: User, apiGroup: rbac.authorization.k8s.io, name: kopf-greeter}]
"#;

const GREETING: &str = r#"
apiVersion: kopf.skiff.io/v1
kind: Greeting
metadata: {name: hello, namespace: greetings}
spec: {message: hi}
"#;

fn kubectl(c: &Cluster, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, out, err) = c.kubectl(args, stdin);
    assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}\n{}", c.logs());
    out
}

/// The object `kind/name` in [`NS`] as JSON, or `None` when there is none.
fn get(c: &Cluster, what: &str) -> Option<Value> {
    let (ok, out, err) = c.kubectl(&["get", "-n", NS, what, "-o", "json"], None);
    if !ok {
        assert!(err.contains("NotFound"), "kubectl get {what}: {err}");
        return None;
    }
    Some(serde_json::from_str(&out).expect("kubectl's JSON"))
}

/// Waits up to [`BOUND`] for `check` to give a value; fails with the operator's log.
fn converges<T>(
    what: &str,
    c: &Cluster,
    operator: &mut PythonProcess,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + BOUND;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            operator.running(),
            "the operator exited while waiting for {what}:\n{}",
            operator.log()
        );
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {BOUND:?}\n--- operator ---\n{}\n{}",
            operator.log(),
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn ticks(greeting: &Value) -> i64 {
    greeting["status"]["ticks"].as_i64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kopf_operator_handles_its_kind_through_its_life() {
    python::interpreter();
    let c = Cluster::start(0).await;
    kubectl(&c, &["create", "namespace", NS], None);
    kubectl(&c, &["apply", "-f", "-"], Some(CRD));
    kubectl(
        &c,
        &[
            "wait",
            "--for=condition=Established",
            "crd/greetings.kopf.skiff.io",
            "--timeout=60s",
        ],
        None,
    );
    kubectl(&c, &["apply", "-f", "-"], Some(RBAC));

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = c.server.user_kubeconfig(dir.path(), "kopf-greeter", &[]);
    let mut cmd = python::command(&kubeconfig);
    cmd.args([
        "-m",
        "kopf",
        "run",
        "--standalone",
        "--verbose",
        "--namespace",
        NS,
    ])
    .arg(python::script("kopf_operator.py"));
    let mut operator = PythonProcess::spawn(cmd, &dir.path().join("operator.log"));
    let op = &mut operator;

    // Create: the owned child, kopf's finalizer and the status.
    let started = Instant::now();
    kubectl(&c, &["apply", "-f", "-"], Some(GREETING));
    let greeting = get(&c, "greeting/hello").expect("the greeting");
    let uid = greeting["metadata"]["uid"].as_str().unwrap().to_string();
    let child = converges("the child ConfigMap", &c, op, || {
        get(&c, "configmap/hello-greeting")
    });
    assert_eq!(child["data"]["message"], "hi", "{child}");
    let owner = &child["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            &owner["kind"],
            &owner["name"],
            &owner["uid"],
            &owner["controller"]
        ),
        (
            &Value::from("Greeting"),
            &Value::from("hello"),
            &Value::from(uid.as_str()),
            &Value::from(true)
        ),
        "kopf.adopt made the greeting the child's controller: {child}"
    );
    // The status lands only through the status subresource (the main endpoint of a kind
    // with one ignores it), where kopf writes it.
    let greeting = converges("the create handler's status", &c, op, || {
        get(&c, "greeting/hello")
            .filter(|g| g["status"]["child"] == "hello-greeting" && g["status"]["message"] == "hi")
    });
    let finalizers = &greeting["metadata"]["finalizers"];
    assert!(
        finalizers
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == KOPF_FINALIZER)),
        "kopf's finalizer is on the object: {greeting}"
    );
    eprintln!("created and reported in {:?}", started.elapsed());

    // The timer counts in the status, again and again.
    let first = converges("the timer's first ticks", &c, op, || {
        get(&c, "greeting/hello")
            .map(|g| ticks(&g))
            .filter(|t| *t >= 2)
    });
    converges("the timer to go on ticking", &c, op, || {
        get(&c, "greeting/hello").filter(|g| ticks(g) >= first + 2)
    });

    // Update: the child and the status follow the spec.
    kubectl(
        &c,
        &[
            "patch",
            "-n",
            NS,
            "greeting/hello",
            "--type=merge",
            "-p",
            r#"{"spec":{"message":"bye"}}"#,
        ],
        None,
    );
    converges("the child to follow the spec", &c, op, || {
        get(&c, "configmap/hello-greeting").filter(|cm| cm["data"]["message"] == "bye")
    });
    converges("the update handler's status", &c, op, || {
        get(&c, "greeting/hello").filter(|g| g["status"]["message"] == "bye")
    });

    // The create handler's event (kopf posts it in the background).
    converges("the create handler's event", &c, op, || {
        let (ok, events, _) = c.kubectl(
            &[
                "get",
                "events",
                "-n",
                NS,
                "--field-selector",
                "involvedObject.name=hello",
                "-o",
                "json",
            ],
            None,
        );
        (ok && events.contains("made ConfigMap hello-greeting")).then_some(())
    });

    // Delete: the delete handler runs while kopf's finalizer holds the object, which goes
    // only once kopf has removed it; the garbage collector deletes the child.
    kubectl(
        &c,
        &["delete", "-n", NS, "greeting/hello", "--wait=false"],
        None,
    );
    converges("the greeting to go", &c, op, || {
        get(&c, "greeting/hello").is_none().then_some(())
    });
    let farewell = get(&c, "configmap/hello-farewell").unwrap_or_else(|| {
        panic!(
            "the delete handler ran before the object went:\n{}",
            op.log()
        )
    });
    assert_eq!(farewell["data"]["uid"], uid.as_str(), "{farewell}");
    assert_ne!(
        farewell["data"]["deletionTimestamp"], "",
        "the handler saw the object being deleted, held by the finalizer: {farewell}"
    );
    converges("the garbage collector to delete the child", &c, op, || {
        get(&c, "configmap/hello-greeting").is_none().then_some(())
    });
    assert!(op.running(), "the operator still runs:\n{}", op.log());
    eprintln!("whole life in {:?}", started.elapsed());
    drop(operator);
}
