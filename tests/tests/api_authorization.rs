//! Who may do what: RBAC with Kubernetes' default roles, the Node authorizer with
//! NodeRestriction, and `kubectl auth can-i`, checked with the real kubectl 1.32 and the
//! `skiff` CLI against the `skiff-apiserver` binary. Every refusal is a 403 with
//! kube-apiserver's message.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use skiff_testkit::eventually_blocking;
use skiff_tests::cluster::{start_manager, tail};
use skiff_tests::{ApiServer, Backend, ok};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn kubectl_as(server: &ApiServer, kubeconfig: &Path, args: &[&str]) -> Output {
    server.kubectl_as(kubeconfig, args).output().unwrap()
}

/// Runs `kubectl` as `kubeconfig` until `check` holds on its output (RBAC objects reach the
/// authorizer through a watch), at most 10 s.
fn until(
    server: &ApiServer,
    kubeconfig: &Path,
    args: &[&str],
    check: impl Fn(&Output) -> bool,
) -> Output {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = kubectl_as(server, kubeconfig, args);
        if check(&o) || Instant::now() > deadline {
            return o;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// kubectl failed with kube-apiserver's 403 `message` (kubectl prefixes it with `Error from
/// server (Forbidden): `, or `error: failed to create <kind>: ` for `kubectl create <kind>`).
fn forbidden(o: &Output, message: &str) {
    assert!(!o.status.success(), "succeeded: {o:?}");
    let err = stderr(o);
    assert!(
        err.contains(&format!("Error from server (Forbidden): {message}"))
            || err.contains(&format!(": {message}")),
        "want {message}\ngot {err}"
    );
}

const OBJECTS: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: n-a}
- apiVersion: v1
  kind: Node
  metadata: {name: n-b}
- apiVersion: v1
  kind: Secret
  metadata: {name: secret-a}
  stringData: {k: s3cr3t-value-a}
- apiVersion: v1
  kind: Secret
  metadata: {name: secret-b}
  stringData: {k: b}
- apiVersion: v1
  kind: ServiceAccount
  metadata: {name: default}
- apiVersion: v1
  kind: ServiceAccount
  metadata: {name: robot}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: config-a}
  data: {k: a}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: config-b}
  data: {k: b}
- apiVersion: v1
  kind: Pod
  metadata: {name: pod-a}
  spec:
    nodeName: n-a
    containers:
    - name: c
      image: host
      command: ["true"]
      env:
      - name: K
        valueFrom: {secretKeyRef: {name: secret-a, key: k}}
      envFrom:
      - configMapRef: {name: config-a}
- apiVersion: v1
  kind: Pod
  metadata: {name: pod-b}
  spec:
    nodeName: n-b
    volumes:
    - name: s
      secret: {secretName: secret-b}
    containers:
    - name: c
      image: host
      command: ["true"]
"#;

#[test]
fn rbac_roles_bindings_and_can_i() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let server = ApiServer::start_with(
        Backend::Embedded,
        &["--audit-log-path", audit.to_str().unwrap()],
    );
    ok(&server.kubectl_stdin(&["apply", "-f", "-"], OBJECTS));
    let viewer = server.user_kubeconfig(dir.path(), "viewer", &[]);
    let nobody = server.user_kubeconfig(dir.path(), "nobody", &["staff"]);

    // No role: every request is a 403 naming the user, the verb, the resource and scope.
    forbidden(
        &kubectl_as(&server, &nobody, &["get", "pods"]),
        "pods is forbidden: User \"nobody\" cannot list resource \"pods\" in API group \"\" \
         in the namespace \"default\"",
    );
    forbidden(
        &kubectl_as(&server, &nobody, &["get", "deployments", "-A"]),
        "deployments.apps is forbidden: User \"nobody\" cannot list resource \"deployments\" \
         in API group \"apps\" at the cluster scope",
    );
    // Discovery and can-i work for anyone authenticated (system:discovery, system:basic-user).
    let o = kubectl_as(&server, &nobody, &["auth", "can-i", "list", "pods"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "no",
        "{}",
        stderr(&o)
    );
    assert_eq!(o.status.code(), Some(1));

    // view in default: read there, nothing else.
    ok(&server.kubectl(&[
        "create",
        "rolebinding",
        "viewer-view",
        "--clusterrole=view",
        "--user=viewer",
        "-n",
        "default",
    ]));
    let o = until(&server, &viewer, &["get", "pods", "-o", "name"], |o| {
        o.status.success()
    });
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "pod/pod-a\npod/pod-b\n",
        "{}",
        stderr(&o)
    );
    let can = |args: &[&str]| {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        let o = kubectl_as(&server, &viewer, &all);
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(can(&["list", "pods"]), "yes");
    assert_eq!(can(&["watch", "deployments.apps"]), "yes");
    assert_eq!(can(&["create", "pods"]), "no");
    assert_eq!(can(&["create", "pods/exec"]), "no");
    assert_eq!(can(&["get", "secrets"]), "no");
    assert_eq!(can(&["list", "pods", "-n", "kube-system"]), "no");
    forbidden(
        &kubectl_as(
            &server,
            &viewer,
            &["create", "deployment", "web", "--image=host"],
        ),
        "deployments.apps is forbidden: User \"viewer\" cannot create resource \"deployments\" \
         in API group \"apps\" in the namespace \"default\"",
    );
    forbidden(
        &kubectl_as(&server, &viewer, &["delete", "pod", "pod-a"]),
        "pods \"pod-a\" is forbidden: User \"viewer\" cannot delete resource \"pods\" in API \
         group \"\" in the namespace \"default\"",
    );
    forbidden(
        &kubectl_as(&server, &viewer, &["exec", "pod-a", "--", "true"]),
        "pods \"pod-a\" is forbidden: User \"viewer\" cannot create resource \"pods/exec\" in \
         API group \"\" in the namespace \"default\"",
    );
    forbidden(
        &kubectl_as(&server, &viewer, &["get", "secret", "secret-a"]),
        "secrets \"secret-a\" is forbidden: User \"viewer\" cannot get resource \"secrets\" in \
         API group \"\" in the namespace \"default\"",
    );
    // The same refusal over gRPC (the skiff CLI).
    let o = std::process::Command::new(skiff_tests::binary("skiff"))
        .arg("--kubeconfig")
        .arg(&viewer)
        .args(["create", "namespace", "mine"])
        .env("SKIFF_CONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(
        stderr(&o).contains(
            "namespaces is forbidden: User \"viewer\" cannot create resource \"namespaces\" in \
             API group \"\" at the cluster scope"
        ),
        "{}",
        stderr(&o)
    );

    // The administrator can do anything; can-i says so.
    let o = server.kubectl(&["auth", "can-i", "*", "*"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "yes");

    // Impersonation: `kubectl --as` runs a request as another user when the requester may
    // `impersonate` that user; the administrator may, nobody may not.
    let o = server.kubectl(&["--as=viewer", "auth", "can-i", "create", "pods"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "no",
        "{}",
        stderr(&o)
    );
    let o = server.kubectl(&["--as=viewer", "get", "pods", "-o", "name"]);
    assert!(o.status.success(), "{}", stderr(&o));
    forbidden(
        &server.kubectl(&["--as=viewer", "delete", "pod", "pod-a"]),
        "pods \"pod-a\" is forbidden: User \"viewer\" cannot delete resource \"pods\" in API \
         group \"\" in the namespace \"default\"",
    );
    forbidden(
        &kubectl_as(&server, &nobody, &["--as=viewer", "get", "pods"]),
        "users \"viewer\" is forbidden: User \"nobody\" cannot impersonate resource \"users\" \
         in API group \"\" at the cluster scope",
    );

    // A Role of its own: resourceNames limit it to one object.
    ok(&server.kubectl_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: one-secret, namespace: default}
rules:
- apiGroups: [""]
  resources: [secrets]
  resourceNames: [secret-a]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: nobody-one-secret, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: one-secret}
subjects:
- {kind: Group, name: staff}
"#,
    ));
    let o = until(
        &server,
        &nobody,
        &["get", "secret", "secret-a", "-o", "name"],
        |o| o.status.success(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    forbidden(
        &kubectl_as(&server, &nobody, &["get", "secret", "secret-b"]),
        "secrets \"secret-b\" is forbidden: User \"nobody\" cannot get resource \"secrets\" in \
         API group \"\" in the namespace \"default\"",
    );
    // The audit log has a line per request: who, verb, object, decision, code, latency; and
    // no Secret's value.
    std::thread::sleep(Duration::from_millis(500));
    let log = std::fs::read_to_string(&audit).unwrap();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let refused_delete = events.iter().find(|e| {
        e["user"]["username"] == "viewer"
            && e["verb"] == "delete"
            && e["objectRef"]["resource"] == "pods"
            && e["objectRef"]["name"] == "pod-a"
    });
    let e = refused_delete.unwrap_or_else(|| panic!("no audit event for viewer's delete:\n{log}"));
    assert_eq!(e["responseStatus"]["code"], 403);
    assert_eq!(e["annotations"]["authorization.k8s.io/decision"], "forbid");
    assert!(
        e["annotations"]["skiff.io/latency"]
            .as_str()
            .unwrap()
            .ends_with("ms")
    );
    assert!(
        events
            .iter()
            .any(|e| e["impersonatedUser"]["username"] == "viewer"
                && e["user"]["username"] == "system:admin"),
        "impersonated requests name both users"
    );
    assert!(
        !log.contains("s3cr3t-value-a"),
        "a Secret's value reached the audit log"
    );

    // Escalation: a user who may write RBAC objects may grant only what it holds.
    ok(&server.kubectl_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: rbac-writer, namespace: default}
rules:
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create, get, list]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: delegate-rbac-writer, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: rbac-writer}
subjects:
- {kind: User, name: delegate}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: clusterrole-writer}
rules:
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: delegate-clusterrole-writer}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: clusterrole-writer}
subjects:
- {kind: User, name: delegate}
"#,
    ));
    let delegate = server.user_kubeconfig(dir.path(), "delegate", &[]);
    let o = until(
        &server,
        &delegate,
        &[
            "create",
            "role",
            "pod-reader",
            "--verb=get",
            "--resource=pods",
        ],
        |o| o.status.success(),
    );
    assert!(
        o.status.success(),
        "holding get pods, it may grant it: {}",
        stderr(&o)
    );
    let o = kubectl_as(
        &server,
        &delegate,
        &[
            "create",
            "role",
            "secret-reader",
            "--verb=get",
            "--resource=secrets",
        ],
    );
    forbidden(
        &o,
        "roles.rbac.authorization.k8s.io \"secret-reader\" is forbidden: user \"delegate\" \
         (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not \
         currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\"]}",
    );
    let o = kubectl_as(
        &server,
        &delegate,
        &[
            "create",
            "rolebinding",
            "self-edit",
            "--clusterrole=edit",
            "--user=delegate",
        ],
    );
    assert!(
        stderr(&o).contains(
            "rolebindings.rbac.authorization.k8s.io \"self-edit\" is forbidden: user \
             \"delegate\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC \
             permissions not currently held"
        ),
        "{}",
        stderr(&o)
    );

    // An aggregationRule could lend any role's rules (cluster-admin's included): only a
    // writer holding `escalate` may use one, as in Kubernetes.
    let o = server
        .kubectl_as(&delegate, &["create", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(
                br#"{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                     "metadata": {"name": "borrowed"}, "rules": [],
                     "aggregationRule": {"clusterRoleSelectors": [
                       {"matchLabels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}]}}"#,
            )?;
            child.wait_with_output()
        })
        .unwrap();
    forbidden(
        &o,
        "clusterroles.rbac.authorization.k8s.io \"borrowed\" is forbidden: must have \
         cluster-admin privileges to use the aggregationRule",
    );

    // Bad RBAC objects are refused with the field and the reason.
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: broken}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: x}
subjects:
- {kind: ServiceAccount, name: robot}
"#,
    );
    let err = stderr(&o);
    assert!(
        err.contains(
            "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\""
        ) && err.contains("subjects[0].namespace: Required value"),
        "{err}"
    );
}

#[test]
fn nodes_reach_only_their_own_pods_secrets_and_node() {
    let server = ApiServer::start(Backend::Embedded);
    let dir = tempfile::tempdir().unwrap();
    ok(&server.kubectl_stdin(&["apply", "-f", "-"], OBJECTS));
    let node_a = server.user_kubeconfig(dir.path(), "system:node:n-a", &["system:nodes"]);

    let o = kubectl_as(&server, &node_a, &["get", "pod", "pod-a", "-o", "name"]);
    assert!(o.status.success(), "{}", stderr(&o));
    forbidden(
        &kubectl_as(&server, &node_a, &["get", "pod", "pod-b"]),
        "pods \"pod-b\" is forbidden: User \"system:node:n-a\" cannot get resource \"pods\" in \
         API group \"\" in the namespace \"default\": no relationship found between node 'n-a' \
         and this object",
    );
    // Its pods, listed the way its agent lists them; not everyone's.
    let o = kubectl_as(
        &server,
        &node_a,
        &[
            "get",
            "pods",
            "--field-selector",
            "spec.nodeName=n-a",
            "-o",
            "name",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "pod/pod-a\n",
        "{}",
        stderr(&o)
    );
    // Every pod's address and labels, for NetworkPolicy enforcement, by the default policy's
    // binding; without it, only the node authorizer's narrower rule.
    let o = kubectl_as(&server, &node_a, &["get", "pods", "-o", "name"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "pod/pod-a\npod/pod-b\n",
        "{}",
        stderr(&o)
    );
    let o = server.kubectl(&[
        "delete",
        "clusterrolebinding",
        "system:skiff:network-policy-agent",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The authorizer's mirror of the bindings follows a watch.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while kubectl_as(&server, &node_a, &["get", "pods"])
        .status
        .success()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    forbidden(
        &kubectl_as(&server, &node_a, &["get", "pods"]),
        "pods is forbidden: User \"system:node:n-a\" cannot list resource \"pods\" in API \
         group \"\" in the namespace \"default\": node 'n-a' can only list/watch pods with \
         spec.nodeName=n-a field selector",
    );
    // Secrets: only those its pods name.
    let o = kubectl_as(
        &server,
        &node_a,
        &["get", "secret", "secret-a", "-o", "name"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    forbidden(
        &kubectl_as(&server, &node_a, &["get", "secret", "secret-b"]),
        "secrets \"secret-b\" is forbidden: User \"system:node:n-a\" cannot get resource \
         \"secrets\" in API group \"\" in the namespace \"default\": no relationship found \
         between node 'n-a' and this object",
    );
    // ConfigMaps likewise.
    let o = kubectl_as(
        &server,
        &node_a,
        &["get", "configmap", "config-a", "-o", "name"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    forbidden(
        &kubectl_as(&server, &node_a, &["get", "configmap", "config-b"]),
        "configmaps \"config-b\" is forbidden: User \"system:node:n-a\" cannot get resource \
         \"configmaps\" in API group \"\" in the namespace \"default\": no relationship found \
         between node 'n-a' and this object",
    );
    // ServiceAccount tokens: only for the accounts its pods run as, bound to such a pod.
    let o = kubectl_as(
        &server,
        &node_a,
        &[
            "create",
            "token",
            "default",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "pod-a",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    for (args, message) in [
        (
            &["create", "token", "default"][..],
            "serviceaccounts \"default\" is forbidden: node requested token not bound to a pod \
             scheduled on the same node and running as this service account",
        ),
        (
            &[
                "create",
                "token",
                "default",
                "--bound-object-kind",
                "Pod",
                "--bound-object-name",
                "pod-b",
            ][..],
            "serviceaccounts \"default\" is forbidden: node requested token not bound to a pod \
             scheduled on the same node and running as this service account",
        ),
        (
            &["create", "token", "robot"][..],
            "serviceaccounts \"robot\" is forbidden: User \"system:node:n-a\" cannot create \
             resource \"serviceaccounts/token\" in API group \"\" in the namespace \"default\": no \
             relationship found between node 'n-a' and this object",
        ),
    ] {
        forbidden(&kubectl_as(&server, &node_a, args), message);
    }
    // Writes: its own Node only.
    ok(&kubectl_as(
        &server,
        &node_a,
        &["label", "node", "n-a", "zone=a"],
    ));
    forbidden(
        &kubectl_as(&server, &node_a, &["label", "node", "n-b", "zone=a"]),
        "nodes \"n-b\" is forbidden: node \"n-a\" is not allowed to modify node \"n-b\"",
    );
    forbidden(
        &kubectl_as(&server, &node_a, &["delete", "pod", "pod-b"]),
        "pods \"pod-b\" is forbidden: User \"system:node:n-a\" cannot delete resource \"pods\" \
         in API group \"\" in the namespace \"default\": no relationship found between node \
         'n-a' and this object",
    );
    forbidden(
        &kubectl_as(&server, &node_a, &["create", "namespace", "x"]),
        "namespaces is forbidden: User \"system:node:n-a\" cannot create resource \
         \"namespaces\" in API group \"\" at the cluster scope",
    );
}

const MONITORING: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: monitoring}
aggregationRule:
  clusterRoleSelectors:
  - matchLabels: {rbac.example.com/aggregate-to-monitoring: "true"}
rules: []
"#;

/// A ClusterRole the aggregation rule of `monitoring` selects, with `extra` rules after its
/// read rule.
fn monitoring_source(extra: &str) -> String {
    format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: monitoring-endpoints
  labels: {{rbac.example.com/aggregate-to-monitoring: "true"}}
rules:
- apiGroups: [""]
  resources: [services, endpoints, pods]
  verbs: [get, list, watch]
{extra}"#
    )
}

#[test]
fn aggregated_cluster_roles_have_their_rules_filled() {
    let server = ApiServer::start(Backend::Embedded);
    // The controller manager, as its own least-privilege user.
    let manager = start_manager(&server, "cm-1");
    ok(&server.kubectl_stdin(&["apply", "-f", "-"], MONITORING));
    let read = serde_json::json!({
        "apiGroups": [""],
        "resources": ["services", "endpoints", "pods"],
        "verbs": ["get", "list", "watch"],
    });
    let rules_become = |what: &str, want: serde_json::Value| {
        eventually_blocking(what, Duration::from_secs(20), || {
            let out = ok(&server.kubectl(&["get", "clusterrole", "monitoring", "-o", "json"]));
            let role: serde_json::Value = serde_json::from_str(&out).unwrap();
            let rules = match &role["rules"] {
                serde_json::Value::Null => serde_json::json!([]),
                r => r.clone(),
            };
            if rules == want {
                Ok(())
            } else {
                Err(format!(
                    "rules {rules}; controller manager log:\n{}",
                    tail(&manager.log())
                ))
            }
        })
    };

    ok(&server.kubectl_stdin(&["apply", "-f", "-"], &monitoring_source("")));
    rules_become("the source's rule aggregated", serde_json::json!([read]));
    let described = ok(&server.kubectl(&["describe", "clusterrole", "monitoring"]));
    assert!(
        described.contains("pods") && described.contains("[get list watch]"),
        "{described}"
    );

    // A rule added to the source is aggregated too (after the first, in the source's order).
    let config_map_rule = "- apiGroups: [\"\"]\n  resources: [configmaps]\n  verbs: [get]\n";
    ok(&server.kubectl_stdin(&["apply", "-f", "-"], &monitoring_source(config_map_rule)));
    let config_maps = serde_json::json!({
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get"],
    });
    rules_become(
        "the added rule aggregated",
        serde_json::json!([read, config_maps]),
    );

    // The source gone, its rules go too: the rules are exactly the union.
    ok(&server.kubectl(&["delete", "clusterrole", "monitoring-endpoints"]));
    rules_become("the rules emptied", serde_json::json!([]));
}
