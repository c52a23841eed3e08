//! Admission webhooks, end to end: a webhook server written here (Python's `http.server`
//! behind TLS with a certificate of the test's own CA) runs in a pod behind a Service, and
//! the API server calls it for the writes its Validating- and MutatingWebhookConfigurations
//! select, through kubectl 1.32 on the laptop: a validating webhook refuses pods with
//! Kubernetes' message and a mutating one labels them (dry runs included); namespace and
//! object selectors pick what is sent; `failurePolicy: Fail` with no endpoints, a CA bundle
//! that is not PEM or a CA that did not sign the server refuses, `Ignore` admits; a slow
//! webhook is cut at its timeout while other requests go through; invalid configurations are
//! refused with Kubernetes' field messages. Attacks: a mutating webhook that makes a pod
//! privileged is still refused by Pod Security (webhooks mutate before the built-in
//! validation), a patch may not rename the object, and a webhook that would refuse every
//! change to webhook configurations cannot lock the cluster: its own configuration is
//! deleted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::{Duration, Instant};

use base64::Engine;
use skiff_tests::cluster::Cluster;
use skiff_tests::eventually_within;
use skiff_tests::extension::{TLS_SERVER, serve_in_pod};

const T: Duration = Duration::from_secs(90);

/// The webhook server's handler (served by [`TLS_SERVER`]): `/validate` refuses pods
/// labelled deny=yes, `/mutate` labels pods mutated=yes (with a warning and an audit
/// annotation), `/privileged` makes the first container privileged, `/rename` renames the
/// object, `/slow` answers after 10 s; every other path allows.
const SERVER: &str = r#"
import base64, json, time
from http.server import BaseHTTPRequestHandler
def patch(ops):
    return {'patchType': 'JSONPatch', 'patch': base64.b64encode(json.dumps(ops).encode()).decode()}
class H(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers.get('Content-Length', 0))))
        req = review['request']
        labels = ((req.get('object') or {}).get('metadata') or {}).get('labels') or {}
        resp = {'uid': req['uid'], 'allowed': True}
        path = self.path.split('?')[0]
        if path == '/validate' and labels.get('deny') == 'yes':
            resp = {'uid': req['uid'], 'allowed': False, 'status': {'code': 403, 'reason': 'Forbidden', 'message': 'pods labelled deny=yes are not welcome'}}
        elif path == '/mutate':
            resp.update(patch([{'op': 'add', 'path': '/metadata/labels', 'value': dict(labels, mutated='yes')}]))
            resp['warnings'] = ['labelled by the mutating webhook']
            resp['auditAnnotations'] = {'labelled': 'yes'}
        elif path == '/privileged':
            resp.update(patch([{'op': 'add', 'path': '/spec/containers/0/securityContext', 'value': {'privileged': True}}]))
        elif path == '/rename':
            resp.update(patch([{'op': 'replace', 'path': '/metadata/name', 'value': 'renamed'}]))
        elif path == '/slow':
            time.sleep(10)
        body = json.dumps({'apiVersion': review['apiVersion'], 'kind': 'AdmissionReview', 'response': resp}).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
"#;

/// What the test needs beside the webhook server: a Service without endpoints and the
/// namespaces the selectors pick from.
const OTHERS: &str = r#"---
apiVersion: v1
kind: Service
metadata:
  name: nothing
  namespace: hooks
spec:
  selector: {app: nobody}
  ports: [{port: 443, targetPort: 8443}]
---
apiVersion: v1
kind: Namespace
metadata:
  name: guarded
  labels: {webhooks: "on"}
---
apiVersion: v1
kind: Namespace
metadata:
  name: guarded-baseline
  labels:
    webhooks: "on"
    pod-security.kubernetes.io/enforce: baseline
---
apiVersion: v1
kind: Namespace
metadata:
  name: plain
"#;

/// One webhook of `kind` (`validating`/`mutating`) on pod creates, called at `path` of the
/// `service`, with `extra` YAML lines (selectors, policies) at the webhook's level.
fn webhook(name: &str, service: &str, path: &str, ca: &str, extra: &str) -> String {
    format!(
        r#"  - name: {name}.hooks.skiff.test
    admissionReviewVersions: [v1]
    sideEffects: None
    clientConfig:
      caBundle: {ca}
      service: {{namespace: hooks, name: {service}, path: {path}}}
    rules:
      - {{operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}}
{extra}"#
    )
}

fn pod(name: &str, namespace: &str, labels: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
  labels: {{{labels}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: host
      command: ["sleep", "3600"]
"#
    )
}

fn create(c: &Cluster, manifest: &str, dry: bool) -> (bool, String, String) {
    c.laptop_create(manifest, dry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_in_pods_validate_and_mutate_writes() {
    let c = Cluster::start(1).await;
    c.route_pods_from_control().await;

    let server = serve_in_pod(
        &c,
        "hooks",
        "hooks",
        &format!("{SERVER}{TLS_SERVER}"),
        &[],
        OTHERS,
    )
    .await;
    let other_ca = skiff_pki::Ca::generate("someone else's CA").expect("a CA");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let (ca_bundle, wrong_ca, not_pem) = (
        server.ca_bundle.clone(),
        b64(other_ca.cert_pem()),
        b64("not a certificate"),
    );

    let guarded = "namespaceSelector: {matchLabels: {webhooks: \"on\"}}";
    let probe = |p: &str| format!("    objectSelector: {{matchLabels: {{probe: {p}}}}}\n");
    let validating = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\n\
         metadata: {{name: guard}}\nwebhooks:\n{}{}{}{}{}{}",
        webhook(
            "deny",
            "hooks",
            "/validate",
            &ca_bundle,
            &format!("    {guarded}\n")
        ),
        webhook("down-fail", "nothing", "/", &ca_bundle, &probe("down-fail")),
        webhook(
            "down-ignore",
            "nothing",
            "/",
            &ca_bundle,
            &format!("{}    failurePolicy: Ignore\n", probe("down-ignore"))
        ),
        webhook("bad-ca", "hooks", "/", &not_pem, &probe("bad-ca")),
        webhook("wrong-ca", "hooks", "/", &wrong_ca, &probe("wrong-ca")),
        webhook(
            "slow",
            "hooks",
            "/slow",
            &ca_bundle,
            &format!("{}    timeoutSeconds: 2\n", probe("slow"))
        ),
    );
    let mutating = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\n\
         metadata: {{name: label}}\nwebhooks:\n{}{}{}",
        webhook(
            "label",
            "hooks",
            "/mutate",
            &ca_bundle,
            &format!("    {guarded}\n")
        ),
        webhook(
            "escalate",
            "hooks",
            "/privileged",
            &ca_bundle,
            &probe("escalate")
        ),
        webhook("rename", "hooks", "/rename", &ca_bundle, &probe("rename")),
    );
    c.laptop_apply(&validating);
    c.laptop_apply(&mutating);
    let (ok, out, _) = c.kubectl(&["get", "validatingwebhookconfigurations"], None);
    assert!(
        ok && out.contains("guard") && out.contains("WEBHOOKS"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("guard") && l.split_whitespace().nth(1) == Some("6")),
        "{out}"
    );

    // The validating webhook refuses with its own status; dry runs are sent too.
    let denied = pod("denied", "guarded", "deny: \"yes\"");
    let refusal = eventually_within("the webhook refuses deny=yes", T, || async {
        let (ok, _, err) = create(&c, &denied, true);
        (!ok && err.contains("denied the request"))
            .then_some(err.clone())
            .ok_or(format!("ok={ok} {err}\n{}", c.logs()))
    })
    .await;
    assert!(
        refusal.contains(
            "Error from server (Forbidden): error when creating \"STDIN\": admission webhook \
             \"deny.hooks.skiff.test\" denied the request: pods labelled deny=yes are not welcome"
        ),
        "{refusal}"
    );
    let (ok, _, err) = create(&c, &denied, false);
    assert!(!ok && err.contains("pods labelled deny=yes"), "{err}");

    // The mutating webhook labels what it admits, in selected namespaces only.
    let (ok, out, err) = create(&c, &pod("welcome", "guarded", "app: web"), false);
    assert!(ok, "{err}");
    assert!(
        err.contains("Warning: labelled by the mutating webhook"),
        "the webhook's warning reaches kubectl: {err}"
    );
    let created: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(created["metadata"]["labels"]["mutated"], "yes", "{out}");
    assert_eq!(created["metadata"]["labels"]["app"], "web", "{out}");
    let (ok, out, err) = create(&c, &pod("elsewhere", "plain", "deny: \"yes\""), false);
    assert!(ok, "a namespace the selectors leave out is not sent: {err}");
    assert!(!out.contains("mutated"), "{out}");

    // failurePolicy: Fail refuses when the webhook cannot be called, Ignore admits.
    let (ok, _, err) = create(&c, &pod("p1", "plain", "probe: down-fail"), true);
    assert!(!ok, "no endpoints and Fail must refuse");
    assert!(
        err.contains(
            "Internal error occurred: failed calling webhook \"down-fail.hooks.skiff.test\": \
             failed to call webhook: no endpoints available for service \"nothing\""
        ),
        "{err}"
    );
    let (ok, _, err) = create(&c, &pod("p2", "plain", "probe: down-ignore"), true);
    assert!(ok, "Ignore admits: {err}");
    let (ok, _, err) = create(&c, &pod("p3", "plain", "probe: bad-ca"), true);
    assert!(
        !ok && err.contains(
            "failed calling webhook \"bad-ca.hooks.skiff.test\": could not get REST client: \
             unable to load root certificates: unable to parse bytes as PEM block"
        ),
        "{err}"
    );
    let (ok, _, err) = create(&c, &pod("p4", "plain", "probe: wrong-ca"), true);
    assert!(
        !ok && err.contains("failed calling webhook \"wrong-ca.hooks.skiff.test\"")
            && err.contains("invalid peer certificate"),
        "a server the CA bundle did not sign is not trusted: {err}"
    );

    // A slow webhook is cut at its timeout; other requests do not wait for it.
    let started = Instant::now();
    let slow = std::thread::spawn({
        let manifest = pod("p5", "plain", "probe: slow");
        let kubectl = c.laptop_kubectl_cmd(&[
            "create",
            "-f",
            "-",
            "--dry-run=server",
            "--request-timeout=30s",
        ]);
        move || {
            (
                skiff_tests::run_with_stdin(kubectl, &manifest),
                started.elapsed(),
            )
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    // Beside it, a pod that two webhooks of the same server are called for.
    let quick = Instant::now();
    let (ok, _, err) = create(&c, &pod("p6", "guarded", "app: quick"), true);
    let quick = quick.elapsed();
    assert!(ok, "{err}");
    let (out, slow_took) = slow.join().expect("the slow request");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("context deadline exceeded"),
        "{err}"
    );
    assert!(
        slow_took >= Duration::from_secs(2) && slow_took < Duration::from_secs(8),
        "the slow webhook took {slow_took:?} against a 2 s timeout"
    );
    assert!(
        quick < Duration::from_millis(1800),
        "a request beside the slow webhook took {quick:?}"
    );

    // Attack: a webhook that makes pods privileged does so where Pod Security allows it...
    let (ok, out, err) = create(&c, &pod("esc", "guarded", "probe: escalate"), true);
    assert!(ok, "{err}");
    assert!(out.contains("\"privileged\": true"), "{out}");
    // ...and is refused where it does not: Pod Security sees the mutated pod.
    // (An image of a registry: the node's own commands are not baseline. Dry runs: never
    // pulled.)
    let baseline_pod = |name: &str, labels: &str| {
        pod(name, "guarded-baseline", labels).replace("image: host", "image: registry.test/app:1")
    };
    let (ok, _, err) = create(&c, &baseline_pod("esc", "probe: escalate"), true);
    assert!(
        !ok,
        "a webhook must not slip a privileged pod past Pod Security"
    );
    assert!(
        err.contains(
            "violates PodSecurity \"baseline:latest\": privileged (container \"main\" must not \
             set securityContext.privileged=true)"
        ),
        "{err}"
    );
    let (ok, _, err) = create(&c, &baseline_pod("plainpod", "app: x"), true);
    assert!(ok, "the same pod without the webhook is admitted: {err}");
    // Attack: a patch may not rename what is written.
    let (ok, _, err) = create(&c, &pod("named", "plain", "probe: rename"), true);
    assert!(
        !ok && err.contains("may not change apiVersion, kind, metadata.name"),
        "{err}"
    );

    // Invalid configurations are refused with Kubernetes' field messages.
    let bad = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\n\
               metadata: {name: bad}\nwebhooks:\n  - name: bad\n    sideEffects: Some\n    \
               timeoutSeconds: 60\n    admissionReviewVersions: [v2]\n    clientConfig:\n      \
               url: http://example.com/x\n    rules:\n      - {operations: [\"*\", CREATE], \
               apiGroups: [\"\"], apiVersions: [v1], resources: [pods]}\n";
    let out = skiff_tests::run_with_stdin(c.laptop_kubectl_cmd(&["apply", "-f", "-"]), bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    for want in [
        "The ValidatingWebhookConfiguration \"bad\" is invalid",
        "webhooks[0].name: Invalid value: \"bad\": should be a domain with at least three segments separated by dots",
        "webhooks[0].sideEffects: Unsupported value: \"Some\": supported values: \"None\", \"NoneOnDryRun\"",
        "webhooks[0].timeoutSeconds: Invalid value: 60: the timeout value must be between 1 and 30 seconds",
        "webhooks[0].admissionReviewVersions: Invalid value: []string{\"v2\"}: must include at least one of v1, v1beta1",
        "webhooks[0].clientConfig.url: Invalid value: \"http\": 'https' is the only allowed URL scheme",
        "webhooks[0].rules[0].operations: Invalid value: []string{\"*\", \"CREATE\"}: if '*' is present, must not specify other operations",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }

    // Attack: a webhook refusing every change to webhook configurations cannot lock the
    // cluster, because those are never sent to webhooks.
    let lockout = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\n\
         metadata: {{name: lockout}}\nwebhooks:\n  - name: lockout.hooks.skiff.test\n    \
         admissionReviewVersions: [v1]\n    sideEffects: None\n    clientConfig:\n      \
         caBundle: {ca_bundle}\n      service: {{namespace: hooks, name: nothing}}\n    \
         rules:\n      - {{operations: [\"*\"], apiGroups: [admissionregistration.k8s.io], \
         apiVersions: [\"*\"], resources: [\"*\"]}}\n"
    );
    c.laptop_apply(&lockout);
    let out = c.laptop_kubectl(&[
        "delete",
        "validatingwebhookconfiguration",
        "lockout",
        "guard",
    ]);
    skiff_tests::ok(&out);

    // Without the configuration, nothing is refused any more.
    eventually_within("deny=yes admitted once the webhook is gone", T, || async {
        let (ok, _, err) = create(&c, &denied, true);
        ok.then_some(()).ok_or(err)
    })
    .await;
}
