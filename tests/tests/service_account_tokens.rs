//! ServiceAccount tokens: the controller manager gives every namespace a `default`
//! ServiceAccount, `kubectl create token` gets a JWT the API server signed (TokenRequest,
//! optionally bound to a pod), the token authenticates as `system:serviceaccount:<ns>:<name>`
//! with RBAC applied, and it stops working (401) once it expires or its ServiceAccount or
//! pod is gone. The issuer's OIDC discovery documents are served. Real kubectl 1.32, the
//! `skiff-apiserver` and `skiff-controller-manager` binaries.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use skiff_pki::sa_token::{Claims, ISSUER, KubernetesClaim, Ref, SigningKey};
use skiff_tests::{ApiServer, Backend, Component, ok};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// kubectl with a CA-only kubeconfig and `--token`.
fn with_token(server: &ApiServer, anon: &Path, token: &str, args: &[&str]) -> Output {
    let mut all = vec![format!("--token={token}")];
    all.extend(args.iter().map(|a| a.to_string()));
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    server.kubectl_as(anon, &refs).output().unwrap()
}

fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

const UNAUTHORIZED: &str = "error: You must be logged in to the server";

#[test]
fn tokens_authenticate_until_expired_or_revoked() {
    let server = ApiServer::start(Backend::Embedded);
    let _cm = Component::start(
        &server,
        "skiff-controller-manager",
        &["--lease-duration", "4", "--identity", "cm-sa"],
    );
    let dir = tempfile::tempdir().unwrap();
    let ca = std::fs::read_to_string(server.pki_dir.join("ca.crt")).unwrap();
    let anon = dir.path().join("anon.kubeconfig");
    skiff_pki::Kubeconfig::single("skiff", &server.endpoint, &ca, "u", None, None)
        .write(&anon)
        .unwrap();

    // Every namespace gets its default ServiceAccount.
    ok(&server.kubectl(&["create", "namespace", "shop"]));
    until("the default ServiceAccount in shop", || {
        server
            .kubectl(&["get", "sa", "default", "-n", "shop"])
            .status
            .success()
    });

    // ...and the cluster CA as the ConfigMap kube-root-ca.crt, put back when deleted or
    // changed (the root CA publisher).
    let root_ca = |server: &ApiServer| {
        stdout(&server.kubectl(&[
            "get",
            "configmap",
            "kube-root-ca.crt",
            "-n",
            "shop",
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ]))
    };
    until("kube-root-ca.crt in shop", || root_ca(&server) == ca);
    ok(&server.kubectl(&["delete", "configmap", "kube-root-ca.crt", "-n", "shop"]));
    until("kube-root-ca.crt put back", || root_ca(&server) == ca);
    ok(&server.kubectl(&[
        "patch",
        "configmap",
        "kube-root-ca.crt",
        "-n",
        "shop",
        "--type=merge",
        "-p",
        "{\"data\":{\"ca.crt\":\"forged\"}}",
    ]));
    until("kube-root-ca.crt restored", || root_ca(&server) == ca);

    ok(&server.kubectl(&["create", "serviceaccount", "robot"]));
    ok(&server.kubectl(&[
        "create",
        "rolebinding",
        "robot-view",
        "--clusterrole=view",
        "--serviceaccount=default:robot",
    ]));
    let token = stdout(&server.kubectl(&["create", "token", "robot"]))
        .trim()
        .to_string();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");

    // Who it is, what it may do.
    let o = with_token(&server, &anon, &token, &["auth", "whoami", "-o", "json"]);
    let who: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(
        who["status"]["userInfo"]["username"],
        "system:serviceaccount:default:robot",
        "{}",
        stderr(&o)
    );
    let groups = who["status"]["userInfo"]["groups"].to_string();
    assert!(
        groups.contains("system:serviceaccounts:default")
            && groups.contains("system:authenticated"),
        "{groups}"
    );
    let mut listed = false;
    until("the robot's RoleBinding", || {
        listed = with_token(&server, &anon, &token, &["get", "pods"])
            .status
            .success();
        listed
    });
    let o = with_token(
        &server,
        &anon,
        &token,
        &["create", "deployment", "web", "--image=host"],
    );
    assert!(
        stderr(&o).contains(
            "deployments.apps is forbidden: User \"system:serviceaccount:default:robot\" cannot \
             create resource \"deployments\""
        ),
        "{}",
        stderr(&o)
    );

    // A token bound to a pod dies with the pod.
    ok(&server.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: holder}\nspec:\n  containers:\n  - {name: c, image: host, command: [sleep, '100']}\n",
    ));
    let bound = stdout(&server.kubectl(&[
        "create",
        "token",
        "robot",
        "--bound-object-kind=Pod",
        "--bound-object-name=holder",
    ]))
    .trim()
    .to_string();
    let o = with_token(&server, &anon, &bound, &["auth", "whoami", "-o", "json"]);
    assert!(
        stdout(&o).contains("authentication.kubernetes.io/pod-name"),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    ok(&server.kubectl(&["delete", "pod", "holder", "--grace-period=0", "--force"]));
    until("the bound token refused after its pod is gone", || {
        stderr(&with_token(&server, &anon, &bound, &["get", "pods"])).contains(UNAUTHORIZED)
    });
    // ...while the unbound one still works.
    assert!(
        with_token(&server, &anon, &token, &["get", "pods"])
            .status
            .success()
    );

    // Expired, or signed by another key: 401.
    let key = SigningKey::from_pem(
        &std::fs::read_to_string(server.pki_dir.join("service-account.key")).unwrap(),
    )
    .unwrap();
    let sa_uid = stdout(&server.kubectl(&["get", "sa", "robot", "-o", "jsonpath={.metadata.uid}"]));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let claims = |exp: i64| Claims {
        aud: vec![ISSUER.into()],
        exp,
        iat: now - 7200,
        nbf: now - 7200,
        iss: ISSUER.into(),
        sub: "system:serviceaccount:default:robot".into(),
        jti: "t".into(),
        kubernetes: KubernetesClaim {
            namespace: "default".into(),
            serviceaccount: Ref {
                name: "robot".into(),
                uid: sa_uid.clone(),
            },
            ..Default::default()
        },
    };
    // The same claims with a future expiry work: only the expiry differs below.
    let fresh = key.sign(&claims(now + 600)).unwrap();
    assert!(
        with_token(&server, &anon, &fresh, &["get", "pods"])
            .status
            .success()
    );
    let expired = key.sign(&claims(now - 60)).unwrap();
    assert!(stderr(&with_token(&server, &anon, &expired, &["get", "pods"])).contains(UNAUTHORIZED));
    let forged = SigningKey::from_pem(&SigningKey::generate_pem().unwrap())
        .unwrap()
        .sign(&claims(now + 600))
        .unwrap();
    assert!(stderr(&with_token(&server, &anon, &forged, &["get", "pods"])).contains(UNAUTHORIZED));

    // Deleting the ServiceAccount revokes its tokens.
    ok(&server.kubectl(&["delete", "serviceaccount", "robot"]));
    until("the token refused after its ServiceAccount is gone", || {
        stderr(&with_token(&server, &anon, &token, &["get", "pods"])).contains(UNAUTHORIZED)
    });

    // The issuer's discovery documents.
    let conf = ok(&server.kubectl(&["get", "--raw", "/.well-known/openid-configuration"]));
    assert!(conf.contains(&format!("\"issuer\":\"{ISSUER}\"")), "{conf}");
    let jwks = ok(&server.kubectl(&["get", "--raw", "/openid/v1/jwks"]));
    assert!(
        jwks.contains("\"alg\":\"ES256\"") && jwks.contains("\"kid\""),
        "{jwks}"
    );
    // Tokens never reach the server's log.
    assert!(!server.log().contains(&token));
}
