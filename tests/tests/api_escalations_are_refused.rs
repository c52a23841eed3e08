//! Attacks on the API by users with rights in one namespace, each refused by the API
//! server's one admission chain whatever the front end, checked with the real kubectl 1.32
//! against the `skiff-apiserver` binary (as the users `cargo xtask up` would have: client
//! certificates of the cluster CA, bound to Kubernetes' default roles):
//!
//! * a node directory as a container's root filesystem (`image: /`) and a `host` image set
//!   on an existing pod with `kubectl set image` are refused below `privileged` (Pod Security
//!   on create and on update);
//! * a Service's clusterIP outside the service CIDR, and any new `externalIPs`, are refused
//!   (traffic interception, CVE-2020-8554);
//! * a RoleBinding posted to the all-namespaces collection is checked for escalation in its
//!   own namespace, and the refusal is in the audit log as admission's;
//! * server-side apply of a missing object needs `create`, not only `patch`;
//! * a Binding naming another pod than its URL is refused;
//! * a user who may update CertificateSigningRequests' approval cannot approve for a signer
//!   it was not given, and no one can ask for a `system:masters` client certificate;
//! * the status a client sends with a new pod is not stored.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use skiff_tests::{ApiServer, Backend, ok};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits until `kubeconfig`'s user may `verb resource` in `namespace` (RBAC objects reach
/// the authorizer through a watch), at most 10 s.
fn wait_allowed(server: &ApiServer, kubeconfig: &Path, verb: &str, resource: &str, ns: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = run(
            server,
            kubeconfig,
            &["auth", "can-i", verb, resource, "-n", ns],
            None,
        );
        if String::from_utf8_lossy(&o.stdout).trim() == "yes" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{verb} {resource} never allowed: {o:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run(server: &ApiServer, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut cmd = server.kubectl_as(kubeconfig, args);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

/// kubectl failed and its error holds `want`.
fn refused(o: &Output, want: &str) {
    assert!(!o.status.success(), "succeeded: {o:?}");
    assert!(stderr(o).contains(want), "want {want}\ngot {}", stderr(o));
}

const SETUP: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata:
    name: tenant
    labels: {pod-security.kubernetes.io/enforce: baseline}
- apiVersion: v1
  kind: Namespace
  metadata: {name: victim}
- apiVersion: v1
  kind: Secret
  metadata: {name: db, namespace: victim}
  stringData: {password: not-for-tenants}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: Role
  metadata: {name: secret-reader, namespace: victim}
  rules:
  - {apiGroups: [""], resources: [secrets], verbs: [get, list]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: RoleBinding
  metadata: {name: mallory-admin, namespace: tenant}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}
  subjects: [{kind: User, name: mallory}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata: {name: binding-manager}
  rules:
  - {apiGroups: [rbac.authorization.k8s.io], resources: [rolebindings], verbs: [create, get, list]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: binder-manages-bindings}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: binding-manager}
  subjects: [{kind: User, name: binder}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata: {name: csr-approval}
  rules:
  - {apiGroups: [certificates.k8s.io], resources: [certificatesigningrequests], verbs: [create, get, list, watch]}
  - {apiGroups: [certificates.k8s.io], resources: [certificatesigningrequests/approval], verbs: [update]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: approver-approves}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: csr-approval}
  subjects: [{kind: User, name: approver}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: Role
  metadata: {name: patch-config, namespace: tenant}
  rules:
  - {apiGroups: [""], resources: [configmaps], verbs: [get, patch]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: RoleBinding
  metadata: {name: patcher-patches, namespace: tenant}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: patch-config}
  subjects: [{kind: User, name: patcher}]
"#;

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: app, namespace: tenant}
spec:
  containers:
  - {name: c, image: registry.invalid/busybox:1.36, command: [sleep, "3600"]}
"#;

/// A server with the objects of [`SETUP`], and the attackers' kubeconfigs once their
/// bindings are in force.
struct Setup {
    dir: tempfile::TempDir,
    audit: std::path::PathBuf,
    server: ApiServer,
    mallory: std::path::PathBuf,
    binder: std::path::PathBuf,
    patcher: std::path::PathBuf,
    approver: std::path::PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let server = ApiServer::start_with(
        Backend::Embedded,
        &["--audit-log-path", audit.to_str().unwrap()],
    );
    ok(&server.kubectl_stdin(&["apply", "-f", "-"], SETUP));
    let user = |name: &str| server.user_kubeconfig(dir.path(), name, &[]);
    let (mallory, binder, patcher, approver) = (
        user("mallory"),
        user("binder"),
        user("patcher"),
        user("approver"),
    );
    wait_allowed(&server, &mallory, "create", "pods", "tenant");
    wait_allowed(&server, &binder, "create", "rolebindings", "victim");
    wait_allowed(&server, &patcher, "patch", "configmaps", "tenant");
    wait_allowed(
        &server,
        &approver,
        "create",
        "certificatesigningrequests",
        "default",
    );
    Setup {
        dir,
        audit,
        server,
        mallory,
        binder,
        patcher,
        approver,
    }
}

/// The `svc` Service in tenant, with `extra` spec lines.
fn svc(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: tenant}}\n\
         spec:\n  ports: [{{port: 80}}]\n  selector: {{app: x}}\n{extra}"
    )
}

#[test]
fn directory_images_are_refused_below_privileged() {
    let Setup {
        server,
        mallory,
        dir: _dir,
        ..
    } = setup();
    // A node directory as the root filesystem, at baseline: refused, nothing stored.
    let o = run(
        &server,
        &mallory,
        &["create", "-f", "-"],
        Some(&POD.replace("registry.invalid/busybox:1.36", "/")),
    );
    refused(
        &o,
        "pods \"app\" is forbidden: violates PodSecurity \"baseline:latest\": node directory \
         image (container \"c\" must not use a directory of the node as its root filesystem",
    );
    assert!(
        !server
            .kubectl(&["get", "pod", "app", "-n", "tenant"])
            .status
            .success()
    );
}

#[test]
fn host_images_cannot_be_set_on_existing_pods() {
    let Setup {
        server,
        mallory,
        dir: _dir,
        ..
    } = setup();
    // An image pod is admitted; making it a node command (or a node directory) afterwards
    // is refused, and the stored image stays.
    ok(&run(&server, &mallory, &["create", "-f", "-"], Some(POD)));
    for image in ["host", "/var/lib"] {
        let o = run(
            &server,
            &mallory,
            &[
                "set",
                "image",
                "pod/app",
                &format!("c={image}"),
                "-n",
                "tenant",
            ],
            None,
        );
        refused(
            &o,
            "pods \"app\" is forbidden: violates PodSecurity \"baseline:latest\"",
        );
    }
    let image = ok(&server.kubectl(&[
        "get",
        "pod",
        "app",
        "-n",
        "tenant",
        "-o",
        "jsonpath={.spec.containers[0].image}",
    ]));
    assert_eq!(image, "registry.invalid/busybox:1.36");
}

#[test]
fn cluster_ips_outside_the_service_range_are_refused() {
    let Setup {
        server,
        mallory,
        dir: _dir,
        ..
    } = setup();
    // A clusterIP outside the service CIDR (another pod's address): refused with
    // kube-apiserver's allocator message; one inside it is fine.
    let o = run(
        &server,
        &mallory,
        &["create", "-f", "-"],
        Some(&svc("steal", "  clusterIP: 10.244.1.7\n")),
    );
    refused(
        &o,
        "The Service \"steal\" is invalid: spec.clusterIPs: Invalid value: \
         []string{\"10.244.1.7\"}: failed to allocate IP 10.244.1.7: the provided IP \
         (10.244.1.7) is not in the valid range. The range of valid IPs is 10.96.0.0/16",
    );
    ok(&run(
        &server,
        &mallory,
        &["create", "-f", "-"],
        Some(&svc("fine", "  clusterIP: 10.96.7.7\n")),
    ));
}

#[test]
fn new_external_ips_are_refused() {
    let Setup {
        server,
        mallory,
        dir: _dir,
        ..
    } = setup();
    // externalIPs: none may be added, on create or by a patch.
    ok(&run(
        &server,
        &mallory,
        &["create", "-f", "-"],
        Some(&svc("fine", "")),
    ));
    let o = run(
        &server,
        &mallory,
        &["create", "-f", "-"],
        Some(&svc("outside", "  externalIPs: [192.0.2.10]\n")),
    );
    refused(
        &o,
        "services \"outside\" is forbidden: Use of external IPs is denied by admission control",
    );
    let o = run(
        &server,
        &mallory,
        &[
            "patch",
            "service",
            "fine",
            "-n",
            "tenant",
            "-p",
            r#"{"spec":{"externalIPs":["10.96.0.1"]}}"#,
        ],
        None,
    );
    refused(&o, "Use of external IPs is denied by admission control");
}

#[test]
fn role_bindings_are_checked_in_their_own_namespace() {
    let Setup {
        dir,
        audit,
        server,
        binder,
        ..
    } = setup();
    // A RoleBinding posted to the all-namespaces collection is checked in its own
    // namespace: binder may create bindings but holds no right to read victim's Secrets.
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "steal", "namespace": "victim"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secret-reader"},
        "subjects": [{"kind": "User", "name": "binder"}],
    });
    let file = dir.path().join("binding.json");
    std::fs::write(&file, binding.to_string()).unwrap();
    let o = run(
        &server,
        &binder,
        &[
            "create",
            "--raw",
            "/apis/rbac.authorization.k8s.io/v1/rolebindings",
            "-f",
            file.to_str().unwrap(),
        ],
        None,
    );
    refused(
        &o,
        "is attempting to grant RBAC permissions not currently held",
    );
    assert!(
        !server
            .kubectl(&["get", "rolebinding", "steal", "-n", "victim"])
            .status
            .success()
    );
    refused(
        &run(
            &server,
            &binder,
            &["get", "secret", "db", "-n", "victim"],
            None,
        ),
        "cannot get resource \"secrets\"",
    );
    // The audit log has the refusal as admission's, not as an allowed request.
    let deadline = Instant::now() + Duration::from_secs(10);
    let event = loop {
        let log = std::fs::read_to_string(&audit).unwrap_or_default();
        let found = log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| {
                e["user"]["username"] == "binder"
                    && e["verb"] == "create"
                    && e["objectRef"]["resource"] == "rolebindings"
            });
        if let Some(e) = found {
            break e;
        }
        assert!(
            Instant::now() < deadline,
            "no audit event for binder's create:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(event["responseStatus"]["code"], 403, "{event}");
    assert_eq!(
        event["annotations"]["admission.skiff.io/decision"], "forbid",
        "{event}"
    );
    assert_eq!(
        event["annotations"]["admission.skiff.io/plugin"], "RBACEscalation",
        "{event}"
    );
}

#[test]
fn server_side_apply_needs_create_to_create() {
    let Setup {
        server,
        patcher,
        dir: _dir,
        ..
    } = setup();
    // Server-side apply of a missing object takes `create`: patcher may only patch.
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: planted, namespace: tenant}\n\
              data: {k: v}\n";
    let o = run(
        &server,
        &patcher,
        &["apply", "--server-side", "-f", "-"],
        Some(cm),
    );
    refused(
        &o,
        "configmaps \"planted\" is forbidden: User \"patcher\" cannot create resource \
         \"configmaps\" in API group \"\" in the namespace \"tenant\"",
    );
    assert!(
        !server
            .kubectl(&["get", "configmap", "planted", "-n", "tenant"])
            .status
            .success()
    );
    // ... while applying to an existing one is a patch, which it may do.
    ok(&server.kubectl_stdin(&["create", "-f", "-"], cm));
    ok(&run(
        &server,
        &patcher,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&cm.replace("k: v", "k: w")),
    ));
}

#[test]
fn bindings_bind_the_pod_their_url_names() {
    let Setup { dir, server, .. } = setup();
    // A Binding whose body names another pod than the URL (which authorization saw).
    ok(&server.kubectl_stdin(&["create", "-f", "-"], POD));
    ok(&server.kubectl_stdin(
        &["create", "-f", "-"],
        &POD.replace("name: app,", "name: other,"),
    ));
    let bind = serde_json::json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "other", "namespace": "tenant"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "attacker-node"},
    });
    let file = dir.path().join("bind.json");
    std::fs::write(&file, bind.to_string()).unwrap();
    let o = server.kubectl(&[
        "create",
        "--raw",
        "/api/v1/namespaces/tenant/pods/app/binding",
        "-f",
        file.to_str().unwrap(),
    ]);
    refused(&o, "name in URL does not match name in Binding object");
    let node = ok(&server.kubectl(&[
        "get",
        "pod",
        "other",
        "-n",
        "tenant",
        "-o",
        "jsonpath={.spec.nodeName}",
    ]));
    assert_eq!(node, "", "the other pod was bound");
}

#[test]
fn the_status_of_a_new_pod_is_not_the_clients() {
    let Setup {
        server,
        mallory,
        dir: _dir,
        ..
    } = setup();
    // A new pod's status is the server's: a claimed podIP and phase are not stored (they
    // would reach Endpoints and the nodes' policy maps).
    let forged = "apiVersion: v1\nkind: Pod\nmetadata: {name: forged, namespace: tenant}\n\
                  spec:\n  containers: [{name: c, image: registry.invalid/busybox:1.36}]\n\
                  status: {phase: Running, podIP: 10.244.1.7, podIPs: [{ip: 10.244.1.7}]}\n";
    ok(&run(
        &server,
        &mallory,
        &["create", "-f", "-"],
        Some(forged),
    ));
    let status = ok(&server.kubectl(&[
        "get",
        "pod",
        "forged",
        "-n",
        "tenant",
        "-o",
        "jsonpath={.status.phase}/{.status.podIP}",
    ]));
    assert_eq!(status, "Pending/");
}

#[test]
fn certificate_approval_needs_the_signer() {
    let Setup {
        server,
        approver,
        dir: _dir,
        ..
    } = setup();
    // Certificates: a request for system:masters of the API server's client signer is
    // refused whoever asks; approving another signer's request takes `approve` on it.
    let csr = |name: &str, signer: &str, cn: &str, org: &str| {
        let (_key, pem) = skiff_pki::new_request(cn, &[org.to_string()]).unwrap();
        use base64::Engine as _;
        serde_json::json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "signerName": signer,
                "request": base64::engine::general_purpose::STANDARD.encode(pem),
                "usages": ["digital signature", "client auth"],
            },
        })
        .to_string()
    };
    let o = run(
        &server,
        &approver,
        &["create", "-f", "-"],
        Some(&csr(
            "root",
            "kubernetes.io/kube-apiserver-client",
            "mallory",
            "system:masters",
        )),
    );
    refused(
        &o,
        "use of kubernetes.io/kube-apiserver-client signer with system:masters group is not \
         allowed",
    );
    ok(&run(
        &server,
        &approver,
        &["create", "-f", "-"],
        Some(&csr(
            "node-takeover",
            "kubernetes.io/kube-apiserver-client-kubelet",
            "system:node:victim",
            "system:nodes",
        )),
    ));
    let o = run(
        &server,
        &approver,
        &["certificate", "approve", "node-takeover"],
        None,
    );
    refused(
        &o,
        "certificatesigningrequests.certificates.k8s.io \"node-takeover\" is forbidden: user \
         not permitted to approve requests with signerName \
         \"kubernetes.io/kube-apiserver-client-kubelet\"",
    );
    let conditions = ok(&server.kubectl(&[
        "get",
        "csr",
        "node-takeover",
        "-o",
        "jsonpath={.status.conditions}",
    ]));
    assert_eq!(conditions, "", "the request was approved");
    // The administrator (every verb on every signer) may.
    ok(&server.kubectl(&["certificate", "approve", "node-takeover"]));
}

/// A Node object named `name` with `labels` (a YAML flow map) and pod CIDR `cidr`.
fn node_yaml(name: &str, labels: &str, cidr: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {labels}}}\n\
         spec: {{podCIDR: {cidr}}}\n"
    )
}

#[test]
fn nodes_change_only_what_the_kubelet_may() {
    let Setup { dir, server, .. } = setup();
    let n1 = server.user_kubeconfig(dir.path(), "system:node:n1", &["system:nodes"]);
    // A label that steers workloads (NodeRestriction's own prefix): refused at registration.
    let o = run(
        &server,
        &n1,
        &["create", "-f", "-"],
        Some(&node_yaml(
            "n1",
            "{node-restriction.kubernetes.io/pci: \"true\"}",
            "10.244.9.0/24",
        )),
    );
    refused(
        &o,
        "nodes \"n1\" is forbidden: is not allowed to set the following labels: \
         node-restriction.kubernetes.io/pci",
    );
    ok(&run(
        &server,
        &n1,
        &["create", "-f", "-"],
        Some(&node_yaml(
            "n1",
            "{kubernetes.io/hostname: n1, rack: r7}",
            "10.244.9.0/24",
        )),
    ));
    // Later: no role label, no taint changes (a node would steer workloads to itself).
    refused(
        &run(
            &server,
            &n1,
            &[
                "label",
                "node",
                "n1",
                "node-role.kubernetes.io/control-plane=",
            ],
            None,
        ),
        "is not allowed to modify labels: node-role.kubernetes.io/control-plane",
    );
    // Nor owners, which would let the garbage collector delete it (CVE-2025-5187).
    refused(
        &run(
            &server,
            &n1,
            &[
                "patch",
                "node",
                "n1",
                "--type=merge",
                "-p",
                r#"{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":"gone","uid":"0000"}]}}"#,
            ],
            None,
        ),
        "node \"n1\" is not allowed to set or change its own ownerReferences",
    );
    ok(&server.kubectl(&["taint", "node", "n1", "dedicated=db:NoSchedule"]));
    refused(
        &run(
            &server,
            &n1,
            &["taint", "node", "n1", "dedicated=db:NoSchedule-"],
            None,
        ),
        "node \"n1\" is not allowed to modify taints",
    );
    // Its pods: status only, never their labels or spec.
    ok(&server.kubectl_stdin(
        &["create", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: tenant}\n\
         spec:\n  nodeName: n1\n  containers: [{name: c, image: registry.invalid/busybox:1.36}]\n",
    ));
    refused(
        &run(
            &server,
            &n1,
            &["label", "pod", "p", "-n", "tenant", "app=admin-console"],
            None,
        ),
        "node \"n1\" can only delete pods and update their status",
    );
}

#[test]
fn node_pod_cidrs_do_not_overlap() {
    let Setup { dir, server, .. } = setup();
    ok(&server.kubectl_stdin(
        &["create", "-f", "-"],
        &node_yaml("n2", "{}", "10.244.2.0/24"),
    ));
    let n1 = server.user_kubeconfig(dir.path(), "system:node:n1", &["system:nodes"]);
    let o = run(
        &server,
        &n1,
        &["create", "-f", "-"],
        Some(&node_yaml("n1", "{}", "10.244.2.128/25")),
    );
    refused(
        &o,
        "spec.podCIDRs: Invalid value: \"10.244.2.128/25\": overlaps the pod CIDR \
         10.244.2.0/24 of node \"n2\"",
    );
    ok(&run(
        &server,
        &n1,
        &["create", "-f", "-"],
        Some(&node_yaml("n1", "{}", "10.244.1.0/24")),
    ));
}

#[test]
fn a_bootstrap_token_joins_only_new_nodes() {
    let Setup { dir, server, .. } = setup();
    ok(&server.kubectl_stdin(
        &["create", "-f", "-"],
        &node_yaml("victim", "{}", "10.244.3.0/24"),
    ));
    let out = server.skiff(&["token", "create", "--ttl", "1h"]);
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // A kubeconfig with only the CA and the token, as a joining machine has.
    let kubeconfig = dir.path().join("bootstrap.kubeconfig");
    let ca = server.pki_dir.join("ca.crt");
    let cfg = |args: &[&str]| {
        let mut all = vec!["config", "--kubeconfig", kubeconfig.to_str().unwrap()];
        all.extend_from_slice(args);
        ok(&std::process::Command::new(skiff_tests::KUBECTL)
            .args(&all)
            .output()
            .unwrap());
    };
    cfg(&[
        "set-cluster",
        "c",
        "--server",
        &server.endpoint,
        "--certificate-authority",
        ca.to_str().unwrap(),
    ]);
    cfg(&["set-credentials", "t", "--token", &token]);
    cfg(&["set-context", "c", "--cluster", "c", "--user", "t"]);
    cfg(&["use-context", "c"]);
    let request = |name: &str, cn: &str| {
        let (_key, pem) = skiff_pki::new_request(cn, &["system:nodes".to_string()]).unwrap();
        use base64::Engine as _;
        serde_json::json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                "request": base64::engine::general_purpose::STANDARD.encode(pem),
                "usages": ["digital signature", "client auth"],
            },
        })
        .to_string()
    };
    refused(
        &run(
            &server,
            &kubeconfig,
            &["create", "-f", "-"],
            Some(&request("take-victim", "system:node:victim")),
        ),
        "node \"victim\" is already registered: a bootstrap token may only join a new node",
    );
    ok(&run(
        &server,
        &kubeconfig,
        &["create", "-f", "-"],
        Some(&request("join-fresh", "system:node:fresh")),
    ));
}
