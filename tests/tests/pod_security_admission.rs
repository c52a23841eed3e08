//! Pod Security admission, chosen per namespace by its labels: a pod that violates the
//! enforced level is refused naming every violated field, the warn level is reported to the
//! client (pods and workload templates), and `host` containers (the node's own commands) are
//! allowed only where the enforced level is `privileged`. Checked with the real kubectl 1.32
//! against the `skiff-apiserver` binary.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use skiff_tests::{ApiServer, Backend, ok};

const NAMESPACES: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata:
    name: locked
    labels: {pod-security.kubernetes.io/enforce: restricted}
- apiVersion: v1
  kind: Namespace
  metadata:
    name: base
    labels: {pod-security.kubernetes.io/enforce: baseline}
- apiVersion: v1
  kind: Namespace
  metadata:
    name: warned
    labels: {pod-security.kubernetes.io/warn: baseline}
"#;

const PRIVILEGED: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: priv}
spec:
  containers:
  - name: app
    image: registry.example/app:1
    securityContext: {privileged: true}
"#;

const RESTRICTED_OK: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: tidy}
spec:
  securityContext:
    runAsNonRoot: true
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: app
    image: registry.example/app:1
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
"#;

const HOST: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: node-shell}
spec:
  containers:
  - name: sh
    image: host
    command: [sleep, "1000"]
"#;

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      hostNetwork: true
      containers:
      - name: app
        image: registry.example/app:1
"#;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn namespaces_enforce_and_warn_their_levels() {
    let server = ApiServer::start(Backend::Embedded);
    ok(&server.kubectl_stdin(&["apply", "-f", "-"], NAMESPACES));

    // restricted: a privileged pod is refused, every violated field named.
    let o = server.kubectl_stdin(&["apply", "-n", "locked", "-f", "-"], PRIVILEGED);
    assert!(!o.status.success());
    let err = stderr(&o);
    for want in [
        "pods \"priv\" is forbidden: violates PodSecurity \"restricted:latest\": ",
        "privileged (container \"app\" must not set securityContext.privileged=true)",
        "allowPrivilegeEscalation != false (container \"app\" must set \
         securityContext.allowPrivilegeEscalation=false)",
        "unrestricted capabilities (container \"app\" must set \
         securityContext.capabilities.drop=[\"ALL\"])",
        "runAsNonRoot != true (pod or container \"app\" must set \
         securityContext.runAsNonRoot=true)",
        "seccompProfile (pod or container \"app\" must set securityContext.seccompProfile.type \
         to \"RuntimeDefault\" or \"Localhost\")",
    ] {
        assert!(err.contains(want), "{want}\nnot in\n{err}");
    }
    let o = server.kubectl(&["get", "pods", "-n", "locked", "-o", "name"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "",
        "nothing was written"
    );
    // A pod that meets the standard is admitted.
    ok(&server.kubectl_stdin(&["apply", "-n", "locked", "-f", "-"], RESTRICTED_OK));

    // baseline: host images are the node's own commands, refused; privileged too.
    let o = server.kubectl_stdin(&["apply", "-n", "base", "-f", "-"], HOST);
    let err = stderr(&o);
    assert!(
        err.contains(
            "pods \"node-shell\" is forbidden: violates PodSecurity \"baseline:latest\": host \
             image (container \"sh\" must not use image \"host\", which runs the node's own \
             commands; it needs pod-security.kubernetes.io/enforce=privileged)"
        ),
        "{err}"
    );
    let o = server.kubectl_stdin(&["apply", "-n", "base", "-f", "-"], PRIVILEGED);
    assert!(stderr(&o).contains("violates PodSecurity \"baseline:latest\": privileged"));
    // The default namespace has no label: privileged, host images allowed.
    ok(&server.kubectl_stdin(&["apply", "-f", "-"], HOST));

    // warn: admitted, with kube-apiserver's warning, for pods and workload templates.
    let o = server.kubectl_stdin(&["apply", "-n", "warned", "-f", "-"], PRIVILEGED);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "Warning: would violate PodSecurity \"baseline:latest\": privileged (container \
             \"app\" must not set securityContext.privileged=true)"
        ),
        "{}",
        stderr(&o)
    );
    let o = server.kubectl_stdin(&["apply", "-n", "warned", "-f", "-"], DEPLOYMENT);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "Warning: would violate PodSecurity \"baseline:latest\": host namespaces \
             (hostNetwork=true)"
        ),
        "{}",
        stderr(&o)
    );

    // A level that does not exist is refused on the namespace.
    let o = server.kubectl(&[
        "label",
        "namespace",
        "warned",
        "pod-security.kubernetes.io/enforce=strict",
    ]);
    assert!(
        stderr(&o).contains(
            "metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: \"strict\": \
             must be one of privileged, baseline, restricted"
        ),
        "{}",
        stderr(&o)
    );
}
