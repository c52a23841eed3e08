//! A pod reads its ServiceAccount token where Kubernetes mounts it,
//! /var/run/secrets/kubernetes.io/serviceaccount (token, the cluster CA from
//! kube-root-ca.crt, the namespace): the ServiceAccount admission adds the
//! `kube-api-access-*` projected volume (unless `automountServiceAccountToken: false`), and
//! a projected volume written in the spec works the same. The token is the pod's identity:
//! it lists pods only where the ServiceAccount's role allows, and stops working once the pod
//! is gone. The node asks for the token (TokenRequest bound to the pod, which the Node
//! authorizer and NodeRestriction allow only for its own pods). A real cluster, real
//! kubectl, a busybox image from a registry on loopback.
//!
//! Inside the pod, curl (the host's, with its libraries, in the image) finds the API server
//! as in-cluster clients do, from KUBERNETES_SERVICE_HOST/_PORT (the `kubernetes` Service the
//! API server keeps; the node's load balancer sends it through the agent's passthrough),
//! verifies it with the mounted ca.crt and lists pods with the mounted token: 200 for a
//! ServiceAccount whose role allows it, 403 for one without.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use serde_json::json;
use skiff_testkit::registry::Registry;
use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(60);
const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A pod of `account` whose token volume is written in its spec.
fn pod(name: &str, account: &str, image: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"serviceAccountName": account,
            "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "containers": [{"name": "app", "image": image, "args": ["exec sleep 3600"],
                "volumeMounts": [{"name": "kube-api-access", "mountPath": MOUNT, "readOnly": true}]}]}})
}

/// A pod with nothing about tokens in its spec (`account` empty: no serviceAccountName).
fn plain_pod(name: &str, account: &str, image: &str, automount: Option<bool>) -> serde_json::Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": image, "args": ["exec sleep 3600"]}]}});
    if !account.is_empty() {
        p["spec"]["serviceAccountName"] = account.into();
    }
    if let Some(a) = automount {
        p["spec"]["automountServiceAccountToken"] = a.into();
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_read_their_token_and_it_is_their_identity() {
    let registry = Registry::start();
    let image = registry
        .push_busybox_with("demo/sa:v1", &["/usr/bin/curl"])
        .await;
    let c = Cluster::start(1).await;
    let k = |args: &[&str]| {
        let (ok, out, err) = c.kubectl(args, None);
        assert!(ok, "kubectl {args:?}: {err}");
        out
    };
    k(&["create", "serviceaccount", "robot"]);
    k(&["create", "serviceaccount", "nobody"]);
    k(&[
        "create",
        "rolebinding",
        "robot-view",
        "--clusterrole=view",
        "--serviceaccount=default:robot",
    ]);
    skiff_testkit::eventually_blocking("kube-root-ca.crt published", T, || {
        c.kubectl(&["get", "configmap", "kube-root-ca.crt"], None)
            .0
            .then_some(())
    });
    let docs = [
        plain_pod("reader", "robot", &image, None),
        pod("outsider", "nobody", &image),
        plain_pod("defaulted", "", &image, None),
        plain_pod("optout", "robot", &image, Some(false)),
    ]
    .iter()
    .map(|p| p.to_string())
    .collect::<Vec<_>>()
    .join("\n");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&docs));
    assert!(ok, "{err}");
    for name in ["reader", "outsider", "defaulted", "optout"] {
        let deadline = std::time::Instant::now() + T;
        loop {
            let (_, out, _) = c.kubectl(
                &["get", "pod", name, "-o", "jsonpath={.status.phase}"],
                None,
            );
            if out == "Running" {
                break;
            }
            if std::time::Instant::now() > deadline {
                let (_, events, _) = c.kubectl(&["get", "events"], None);
                let (_, status, _) =
                    c.kubectl(&["get", "pod", name, "-o", "jsonpath={.status}"], None);
                panic!("{name} is not running:\n{events}\n{status}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // The admission: a default ServiceAccount, the token volume unless opted out.
    let spec_of =
        |pod: &str, path: &str| k(&["get", "pod", pod, "-o", &format!("jsonpath={path}")]);
    assert_eq!(
        spec_of("defaulted", "{.spec.serviceAccountName}"),
        "default"
    );
    assert!(
        spec_of("reader", "{.spec.volumes[*].name}").starts_with("kube-api-access-"),
        "{}",
        spec_of("reader", "{.spec.volumes[*].name}")
    );
    assert_eq!(
        spec_of("reader", "{.spec.containers[0].volumeMounts[0].mountPath}"),
        MOUNT
    );
    assert_eq!(spec_of("optout", "{.spec.volumes}"), "");
    let (ok, _, _) = c.kubectl(&["exec", "optout", "--", "/bin/busybox", "ls", MOUNT], None);
    assert!(!ok, "no token where the pod opted out");
    assert_eq!(
        k(&[
            "exec",
            "defaulted",
            "--",
            "/bin/busybox",
            "cat",
            &format!("{MOUNT}/namespace")
        ]),
        "default"
    );

    // A ServiceAccount that does not exist: refused, as Kubernetes refuses it.
    let ghost = plain_pod("haunted", "ghost", &image, None).to_string();
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&ghost));
    assert!(!ok);
    assert!(
        err.contains(
            "pods \"haunted\" is forbidden: error looking up service account default/ghost: \
             serviceaccount \"ghost\" not found"
        ),
        "{err}"
    );

    // The files, as a pod's client library reads them.
    let read = |pod: &str, file: &str| {
        k(&[
            "exec",
            pod,
            "--",
            "/bin/busybox",
            "cat",
            &format!("{MOUNT}/{file}"),
        ])
    };
    assert_eq!(read("reader", "namespace"), "default");
    let ca = std::fs::read_to_string(c.server.pki_dir.join("ca.crt")).unwrap();
    assert_eq!(read("reader", "ca.crt"), ca);
    let token = read("reader", "token");
    let outsider_token = read("outsider", "token");
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");

    // The token is the pod's identity: RBAC decides, per ServiceAccount.
    let dir = tempfile::tempdir().unwrap();
    let as_token = |t: &str, args: &[&str]| {
        let path = dir.path().join(format!("{}.kubeconfig", t.len()));
        skiff_pki::Kubeconfig::single("skiff", &c.server.endpoint, &ca, "sa", None, Some(t))
            .write(&path)
            .unwrap();
        c.server.kubectl_as(&path, args).output().unwrap()
    };
    let out = as_token(&token, &["get", "pods", "-o", "name"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("pod/reader"));
    let out = as_token(
        &token,
        &["auth", "whoami", "-o", "jsonpath={.status.userInfo}"],
    );
    let who = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(who.contains("system:serviceaccount:default:robot"), "{who}");
    assert!(
        who.contains("reader"),
        "the token is bound to the pod: {who}"
    );
    let out = as_token(&token, &["get", "secrets"]);
    assert!(!out.status.success());
    let out = as_token(&outsider_token, &["get", "pods"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "User \"system:serviceaccount:default:nobody\" cannot list resource \"pods\""
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // From inside the pods, as an in-cluster client: the Service's variables, the mounted
    // CA and token, TLS verified against the clusterIP.
    let (_, svc, _) = c.kubectl(
        &[
            "get",
            "service",
            "kubernetes",
            "-o",
            "jsonpath={.spec.clusterIP}:{.spec.ports[0].port}",
        ],
        None,
    );
    assert_eq!(svc, "10.96.0.1:443");
    let (_, ep, _) = c.kubectl(
        &[
            "get",
            "endpoints",
            "kubernetes",
            "-o",
            "jsonpath={.subsets[0].ports[0].port}",
        ],
        None,
    );
    assert_eq!(ep, c.server.cluster_endpoint().rsplit(':').next().unwrap());
    let env = k(&["exec", "reader", "--", "/bin/busybox", "env"]);
    assert!(env.contains("KUBERNETES_SERVICE_HOST=10.96.0.1"), "{env}");
    assert!(env.contains("KUBERNETES_SERVICE_PORT=443"), "{env}");
    assert!(
        env.contains("KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443"),
        "{env}"
    );
    let list_pods = format!(
        "curl -sS --max-time 10 --cacert {MOUNT}/ca.crt \
           -H \"Authorization: Bearer $(cat {MOUNT}/token)\" \
           -o /tmp/body -w '%{{http_code}}' \
           https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/default/pods \
         && echo && cat /tmp/body"
    );
    let in_pod = |pod: &str| {
        let (ok, out, err) = c.kubectl(
            &["exec", pod, "--", "/bin/busybox", "sh", "-c", &list_pods],
            None,
        );
        assert!(ok, "curl in {pod}: {out}\n{err}");
        let (code, body) = out.split_once('\n').unwrap_or((out.as_str(), ""));
        (code.to_string(), body.to_string())
    };
    let (code, body) = in_pod("reader");
    assert_eq!(code, "200", "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["kind"], "PodList");
    assert!(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["metadata"]["name"] == "reader"),
        "{body}"
    );
    let (code, body) = in_pod("outsider");
    assert_eq!(code, "403", "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["reason"], "Forbidden");
    assert!(
        status["message"].as_str().unwrap().contains(
            "User \"system:serviceaccount:default:nobody\" cannot list resource \"pods\""
        ),
        "{body}"
    );

    // The API server keeps its Service: deleted, it comes back (level-triggered, 10 s).
    k(&["delete", "service", "kubernetes"]);
    skiff_testkit::eventually_blocking("the kubernetes Service back", T, || {
        let (_, out, _) = c.kubectl(
            &[
                "get",
                "service",
                "kubernetes",
                "-o",
                "jsonpath={.spec.clusterIP}",
            ],
            None,
        );
        (out == "10.96.0.1").then_some(())
    });

    // Gone with its pod.
    k(&["delete", "pod", "reader", "--grace-period=1", "--wait=true"]);
    skiff_testkit::eventually_blocking("the token refused once its pod is gone", T, || {
        let out = as_token(&token, &["get", "pods"]);
        String::from_utf8_lossy(&out.stderr)
            .contains("You must be logged in to the server")
            .then_some(())
    });
}
