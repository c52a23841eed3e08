//! API aggregation, end to end: an extension API server written here (Python's
//! `http.server` behind TLS with a certificate of the test's own CA, requiring a client
//! certificate of the front-proxy CA it reads from the ConfigMap
//! `kube-system/extension-apiserver-authentication`) runs in a pod behind a Service, and an
//! `apiregistration.k8s.io/v1` APIService hands it `wardle.example.com/v1alpha1`. Through
//! kubectl 1.32 on the laptop: the group is in discovery (`kubectl api-resources`), the
//! APIService is Available (Passed), `kubectl get flunders` reaches the server with the
//! caller's identity in `X-Remote-User`/`X-Remote-Group`, a user without RBAC on flunders is
//! refused 403 by the API server before anything reaches the server, a watch streams.
//! Attacks: a client's own `X-Remote-User: system:admin` and `X-Remote-Group` are never
//! forwarded, nor a caller's bearer token, and a connection upgrade is refused. A caBundle
//! that did not sign the server makes an APIService FailedDiscoveryCheck; once the pod is
//! gone the APIService is MissingEndpoints and requests answer 503.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use skiff_api::api::ConfigMap;
use skiff_tests::cluster::Cluster;
use skiff_tests::eventually_within;
use skiff_tests::extension::serve_in_pod;

const T: Duration = Duration::from_secs(30);
const GV: &str = "wardle.example.com/v1alpha1";

/// The extension server: `/apis/<group>/<version>` answers an APIResourceList (of flunders
/// for wardle.example.com, of gadgets for the other groups pointed at it), and
/// `/openapi/v3/apis/<group>/<version>` a document with the Flunder's schema;
/// a flunders list answers one item echoing who the front proxy said the caller is (and
/// whether any `Authorization` header reached it), plus one listing every user that listed
/// flunders so far; `?watch=true` streams two events. Every request must present a client
/// certificate of the front-proxy CA with an allowed common name.
const SERVER: &str = r#"
import json, os, ssl, tempfile, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
d = tempfile.mkdtemp()
for n in ('TLS_CERT', 'TLS_KEY', 'CLIENT_CA'):
    open(d + '/' + n, 'w').write(os.environ[n])
ALLOWED = json.loads(os.environ['ALLOWED_NAMES'])
SEEN = []
class H(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def reply(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        cert = self.connection.getpeercert() or {}
        cn = [v for rdn in cert.get('subject', ()) for (k, v) in rdn if k == 'commonName']
        if not cn or cn[0] not in ALLOWED:
            return self.reply(401, {'kind': 'Status', 'apiVersion': 'v1', 'status': 'Failure', 'code': 401, 'reason': 'Unauthorized', 'message': 'not the front proxy'})
        path, _, query = self.path.partition('?')
        parts = path.strip('/').split('/')
        if parts[:3] == ['openapi', 'v3', 'apis'] and len(parts) == 5:
            gvk = {'group': parts[3], 'version': parts[4], 'kind': 'Flunder'}
            spec = {'type': 'object', 'description': 'What the flunder wants.',
                    'properties': {'reference': {'type': 'string', 'description': 'Another flunder.'}}}
            flunder = {'type': 'object', 'description': 'A flunder, explained by its own server.',
                       'properties': {'apiVersion': {'type': 'string'}, 'kind': {'type': 'string'},
                                      'metadata': {'type': 'object'}, 'spec': spec},
                       'x-kubernetes-group-version-kind': [gvk]}
            path = '/apis/%s/%s/namespaces/{namespace}/flunders' % (parts[3], parts[4])
            get = {'x-kubernetes-group-version-kind': gvk, 'responses': {'200': {'description': 'OK'}}}
            return self.reply(200, {'openapi': '3.0.0', 'info': {'title': 'wardle', 'version': parts[4]}, 'paths': {path: {'get': get}},
                                    'components': {'schemas': {'com.example.wardle.%s.Flunder' % parts[4]: flunder}}})
        if len(parts) == 3 and parts[0] == 'apis':
            flunders = {'name': 'flunders', 'singularName': 'flunder', 'namespaced': True, 'kind': 'Flunder', 'verbs': ['get', 'list', 'watch'], 'shortNames': ['fl']}
            gadgets = {'name': 'gadgets', 'singularName': 'gadget', 'namespaced': True, 'kind': 'Gadget', 'verbs': ['get', 'list']}
            return self.reply(200, {'kind': 'APIResourceList', 'apiVersion': 'v1', 'groupVersion': parts[1] + '/' + parts[2],
                                    'resources': [flunders if parts[1] == 'wardle.example.com' else gadgets]})
        if parts[-1] != 'flunders':
            return self.reply(404, {'kind': 'Status', 'apiVersion': 'v1', 'status': 'Failure', 'code': 404, 'reason': 'NotFound', 'message': 'no such thing'})
        user = self.headers.get('X-Remote-User')
        SEEN.append(user)
        seen = {'users': self.headers.get_all('X-Remote-User') or [], 'groups': self.headers.get_all('X-Remote-Group') or [],
                'authorization': self.headers.get('Authorization'), 'frontProxy': cn[0]}
        gv = parts[1] + '/' + parts[2]
        item = lambda name, spec: {'kind': 'Flunder', 'apiVersion': gv, 'metadata': {'name': name, 'namespace': 'default', 'creationTimestamp': '2026-01-01T00:00:00Z'}, 'spec': spec}
        if 'watch=true' in query or 'watch=1' in query:
            self.send_response(200)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Transfer-Encoding', 'chunked')
            self.end_headers()
            for i in range(2):
                event = (json.dumps({'type': 'ADDED', 'object': item('event-%d' % i, seen)}) + '\n').encode()
                self.wfile.write(b'%x\r\n%s\r\n' % (len(event), event))
                self.wfile.flush()
                time.sleep(0.3)
            self.wfile.write(b'0\r\n\r\n')
            return
        self.reply(200, {'kind': 'FlunderList', 'apiVersion': gv, 'metadata': {'resourceVersion': str(len(SEEN))},
                         'items': [item('echo', seen), item('history', {'users': SEEN})]})
    def log_message(self, *args):
        pass
s = ThreadingHTTPServer(('0.0.0.0', 8443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(d + '/TLS_CERT', d + '/TLS_KEY')
ctx.verify_mode = ssl.CERT_REQUIRED
ctx.load_verify_locations(d + '/CLIENT_CA')
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print('serving', flush=True)
s.serve_forever()
"#;

/// A raw HTTPS request from the laptop (what kubectl cannot send: chosen headers, a bearer
/// token alone). Reads a JSON request on stdin, prints `{status, body, spread}` (`spread`:
/// seconds between the first and the last line of the body, as they arrived).
const RAW: &str = r#"
import http.client, json, ssl, sys, time
r = json.load(sys.stdin)
ctx = ssl.create_default_context(cafile=r['ca'])
ctx.check_hostname = False
if r.get('cert'):
    ctx.load_cert_chain(r['cert'], r['key'])
c = http.client.HTTPSConnection(r['host'], r['port'], context=ctx, timeout=20)
c.putrequest('GET', r['path'], skip_accept_encoding=True)
for k, v in r['headers']:
    c.putheader(k, v)
c.endheaders()
resp = c.getresponse()
lines, times = [], []
while True:
    line = resp.readline()
    if not line:
        break
    lines.append(line)
    times.append(time.monotonic())
spread = times[-1] - times[0] if times else 0
print(json.dumps({'status': resp.status, 'body': b''.join(lines).decode('utf-8', 'replace'), 'spread': spread}))
"#;

/// What the test needs beside the extension server: who may read flunders (a group, a
/// ServiceAccount).
const OTHERS: &str = r#"---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: flunder-reader
rules:
  - {apiGroups: [wardle.example.com], resources: [flunders], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: flunder-readers
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: flunder-reader}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: Group, name: wardle-readers}
  - {kind: ServiceAccount, name: reader, namespace: default}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: reader
  namespace: default
"#;

/// An APIService for `<group>/v1alpha1` with the `trust` line (`caBundle: ...` or
/// `insecureSkipTLSVerify: true`) and the `service` reference.
fn apiservice(group: &str, trust: &str, service: &str) -> String {
    format!(
        "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\n\
         metadata: {{name: v1alpha1.{group}}}\nspec:\n  group: {group}\n  version: v1alpha1\n  \
         groupPriorityMinimum: 1000\n  versionPriority: 15\n  {trust}\n  service: {service}\n"
    )
}

/// The APIService's Available condition (status, reason, message).
fn available(c: &Cluster, name: &str) -> Result<(String, String, String), String> {
    let out = c.laptop_kubectl(&["get", "apiservice", name, "-o", "json"]);
    let api: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stderr)))?;
    let cond = api["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Available").cloned())
        .ok_or_else(|| format!("no Available condition: {api}"))?;
    let s = |k: &str| cond[k].as_str().unwrap_or("").to_string();
    Ok((s("status"), s("reason"), s("message")))
}

/// Waits until `name`'s Available condition has `reason`; its message.
async fn wait_reason(c: &Cluster, name: &str, status: &str, reason: &str) -> String {
    eventually_within(&format!("{name} {status} {reason}"), T, || async {
        let (s, r, m) = available(c, name)?;
        (s == status && r == reason)
            .then(|| m.clone())
            .ok_or(format!("{s} {r}: {m}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiservice_proxies_to_a_server_in_a_pod_with_the_callers_identity() {
    let started = std::time::Instant::now();
    let c = Cluster::start(1).await;
    c.route_pods_from_control().await;
    let dir = tempfile::tempdir().expect("tempdir");

    // What the API server publishes for extension servers.
    let auth = c
        .client
        .namespaced::<ConfigMap>("kube-system")
        .get("extension-apiserver-authentication")
        .await
        .expect("the extension-apiserver-authentication ConfigMap");
    let front_proxy_ca = auth.data["requestheader-client-ca-file"].clone();
    let allowed = auth.data["requestheader-allowed-names"].clone();
    assert_eq!(allowed, r#"["front-proxy-client"]"#);
    assert_eq!(
        auth.data["requestheader-username-headers"],
        r#"["X-Remote-User"]"#
    );
    assert_eq!(
        auth.data["requestheader-group-headers"],
        r#"["X-Remote-Group"]"#
    );
    assert_eq!(
        auth.data["requestheader-extra-headers-prefix"],
        r#"["X-Remote-Extra-"]"#
    );
    assert!(auth.data["client-ca-file"].contains("BEGIN CERTIFICATE"));
    assert!(front_proxy_ca.contains("BEGIN CERTIFICATE"));

    let server = serve_in_pod(
        &c,
        "wardle",
        "wardle",
        SERVER,
        &[("CLIENT_CA", &front_proxy_ca), ("ALLOWED_NAMES", &allowed)],
        OTHERS,
    )
    .await;
    let other_ca = skiff_pki::Ca::generate("someone else's CA").expect("a CA");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let wardle = "{namespace: wardle, name: wardle}";
    let trusted = format!("caBundle: {}", server.ca_bundle);
    let untrusted = format!("caBundle: {}", b64(other_ca.cert_pem()));
    c.laptop_apply(&apiservice("wardle.example.com", &trusted, wardle));
    c.laptop_apply(&apiservice("bad.example.com", &untrusted, wardle));
    c.laptop_apply(&apiservice(
        "insecure.example.com",
        "insecureSkipTLSVerify: true",
        wardle,
    ));
    c.laptop_apply(&apiservice(
        "missing.example.com",
        &trusted,
        "{namespace: wardle, name: nothing}",
    ));
    c.laptop_apply(&apiservice(
        "port.example.com",
        &trusted,
        "{namespace: wardle, name: wardle, port: 8443}",
    ));

    // Available once the server answers its discovery check.
    let message = wait_reason(&c, "v1alpha1.wardle.example.com", "True", "Passed").await;
    assert_eq!(message, "all checks passed");
    let out = c.laptop_kubectl(&["get", "apiservices"]);
    let table = skiff_tests::ok(&out);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("v1alpha1.wardle.example.com")
                && l.contains("wardle/wardle")
                && l.contains("True")),
        "{table}"
    );
    // A caBundle that did not sign the server: the discovery check fails.
    let message = wait_reason(
        &c,
        "v1alpha1.bad.example.com",
        "False",
        "FailedDiscoveryCheck",
    )
    .await;
    assert!(
        message.starts_with("failing or missing response from https://")
            && message.contains("/apis/bad.example.com/v1alpha1")
            && message.contains("invalid peer certificate"),
        "{message}"
    );

    // insecureSkipTLSVerify is allowed, as in Kubernetes.
    wait_reason(&c, "v1alpha1.insecure.example.com", "True", "Passed").await;
    // A Service that is not there, or not on the port.
    let message = wait_reason(
        &c,
        "v1alpha1.missing.example.com",
        "False",
        "ServiceNotFound",
    )
    .await;
    assert_eq!(message, "service/nothing in \"wardle\" is not present");
    let message = wait_reason(&c, "v1alpha1.port.example.com", "False", "ServicePortError").await;
    assert_eq!(
        message,
        "service/wardle in \"wardle\" is not listening on port 8443"
    );
    // The built-in group-versions are local APIServices.
    let message = wait_reason(&c, "v1.apps", "True", "Local").await;
    assert_eq!(message, "Local APIServices are always available");
    let out = c.laptop_kubectl(&["get", "apiservice", "v1."]);
    let table = skiff_tests::ok(&out);
    assert!(table.contains("Local") && table.contains("True"), "{table}");

    // Discovery lists the group and its resources.
    let out = c.laptop_kubectl(&["api-resources", "--api-group=wardle.example.com"]);
    let resources = skiff_tests::ok(&out);
    assert!(
        resources.lines().any(|l| l.starts_with("flunders")
            && l.contains("fl ")
            && l.contains(GV)
            && l.contains("Flunder")),
        "{resources}"
    );
    let out = c.laptop_kubectl(&["get", "--raw", "/apis/wardle.example.com"]);
    let group: Value = serde_json::from_str(&skiff_tests::ok(&out)).expect("APIGroup");
    assert_eq!(group["kind"], "APIGroup");
    assert_eq!(group["preferredVersion"]["groupVersion"], GV, "{group}");
    let out = c.laptop_kubectl(&["get", "--raw", "/apis"]);
    let groups: Value = serde_json::from_str(&skiff_tests::ok(&out)).expect("APIGroupList");
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "wardle.example.com"
                && g["preferredVersion"]["groupVersion"] == GV),
        "{groups}"
    );

    // `kubectl explain` reads the kind's schema from its own server, through the OpenAPI v3
    // index.
    let out = c.laptop_kubectl(&["get", "--raw", "/openapi/v3"]);
    let index = skiff_tests::ok(&out);
    assert!(
        index.contains("apis/wardle.example.com/v1alpha1"),
        "{index}"
    );
    let out = c.laptop_kubectl(&[
        "get",
        "--raw",
        "/openapi/v3/apis/wardle.example.com/v1alpha1",
    ]);
    let doc = skiff_tests::ok(&out);
    assert!(
        doc.contains("A flunder, explained by its own server."),
        "{doc}"
    );
    let out = c.laptop_kubectl(&["explain", "flunders.spec"]);
    let explained = skiff_tests::ok(&out);
    assert!(
        explained.contains("Flunder")
            && explained.contains("What the flunder wants.")
            && explained.contains("Another flunder."),
        "{explained}"
    );

    // A user the RBAC role allows reaches the server, which sees who asked.
    let alice = c.laptop_kubeconfig_for("alice", &["wardle-readers"]);
    let out = c.laptop_kubectl_as(&alice, &["get", "flunders", "-o", "json"]);
    let list: Value = serde_json::from_str(&skiff_tests::ok(&out)).expect("a list");
    let echo = &list["items"][0]["spec"];
    assert_eq!(echo["users"], json!(["alice"]), "{list}");
    assert_eq!(
        echo["groups"],
        json!(["wardle-readers", "system:authenticated"]),
        "{list}"
    );
    assert_eq!(echo["authorization"], Value::Null);
    assert_eq!(echo["frontProxy"], "front-proxy-client");
    let out = c.laptop_kubectl_as(&alice, &["get", "fl"]);
    let table = skiff_tests::ok(&out);
    assert!(
        table.contains("echo") && table.contains("history"),
        "{table}"
    );

    // The server sees the user after impersonation, never the impersonator.
    let out = c.laptop_kubectl(&[
        "get",
        "flunders",
        "-o",
        "json",
        "--as=carol",
        "--as-group=wardle-readers",
    ]);
    let list: Value = serde_json::from_str(&skiff_tests::ok(&out)).expect("a list");
    let echo = &list["items"][0]["spec"];
    assert_eq!(echo["users"], json!(["carol"]), "{list}");
    assert_eq!(
        echo["groups"],
        json!(["wardle-readers", "system:authenticated"]),
        "{list}"
    );

    // A user without the role is refused by the API server, before the server sees it.
    let bob = c.laptop_kubeconfig_for("bob", &[]);
    let out = c.laptop_kubectl_as(&bob, &["get", "flunders"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains(
                "Error from server (Forbidden): flunders.wardle.example.com is forbidden: User \
                 \"bob\" cannot list resource \"flunders\" in API group \"wardle.example.com\" \
                 in the namespace \"default\""
            ),
        "{err}"
    );

    // Attacks, with requests kubectl would not send.
    let kc = skiff_pki::kubeconfig::load(&alice).expect("alice's kubeconfig");
    let (host, port) = kc
        .server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .rsplit_once(':')
        .map(|(h, p)| (h.to_string(), p.parse::<u16>().expect("a port")))
        .expect("https://HOST:PORT");
    let id = kc.identity.expect("alice's certificate");
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let (ca_file, cert_file, key_file) = (
        file("ca.crt", kc.ca_pem.as_deref().expect("a CA")),
        file("alice.crt", &id.cert_pem),
        file("alice.key", &id.key_pem),
    );
    let raw_timed = |path: &str, headers: &[(&str, &str)], cert: bool| -> (u16, String, f64) {
        let req = json!({
            "host": host,
            "port": port,
            "path": path,
            "headers": headers,
            "ca": ca_file,
            "cert": if cert { Some(&cert_file) } else { None },
            "key": key_file,
        });
        let mut cmd = c.laptop.command("python3");
        cmd.args(["-c", RAW]);
        let out = skiff_tests::run_with_stdin(cmd, &req.to_string());
        let v: Value = serde_json::from_str(&skiff_tests::ok(&out)).expect("the raw answer");
        (
            v["status"].as_u64().unwrap_or(0) as u16,
            v["body"].as_str().unwrap_or("").to_string(),
            v["spread"].as_f64().unwrap_or(0.0),
        )
    };
    let raw = |path: &str, headers: &[(&str, &str)], cert: bool| -> (u16, String) {
        let (code, body, _) = raw_timed(path, headers, cert);
        (code, body)
    };
    let flunders = format!("/apis/{GV}/namespaces/default/flunders");
    // A client's own X-Remote-* headers never reach the server.
    let (code, body) = raw(
        &flunders,
        &[
            ("X-Remote-User", "system:admin"),
            ("X-Remote-Group", "system:masters"),
            ("X-Remote-Extra-Scopes", "everything"),
        ],
        true,
    );
    assert_eq!(code, 200, "{body}");
    let list: Value = serde_json::from_str(&body).expect("a list");
    assert_eq!(
        list["items"][0]["spec"]["users"],
        json!(["alice"]),
        "{body}"
    );
    assert!(
        !body.contains("system:masters") && !body.contains("system:admin"),
        "{body}"
    );
    // A bearer token is not forwarded (a ServiceAccount's, bound to the role).
    let out = c.laptop_kubectl(&["create", "token", "reader", "-n", "default"]);
    let token = skiff_tests::ok(&out).trim().to_string();
    let bearer = format!("Bearer {token}");
    let (code, body) = raw(&flunders, &[("Authorization", bearer.as_str())], false);
    assert_eq!(code, 200, "{body}");
    let list: Value = serde_json::from_str(&body).expect("a list");
    let echo = &list["items"][0]["spec"];
    assert_eq!(
        echo["users"],
        json!(["system:serviceaccount:default:reader"]),
        "{body}"
    );
    assert_eq!(echo["authorization"], Value::Null, "{body}");
    assert!(!body.contains(&token));
    // A connection upgrade is refused before anything is dialled.
    let (code, body) = raw(
        &flunders,
        &[("Connection", "Upgrade"), ("Upgrade", "websocket")],
        true,
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("connection upgrades are not proxied"),
        "{body}"
    );
    // bob never reached the server: only alice and the ServiceAccount listed flunders.
    let (_, body) = raw(&flunders, &[], true);
    let list: Value = serde_json::from_str(&body).expect("a list");
    let users = &list["items"][1]["spec"]["users"];
    assert!(!users.to_string().contains("bob"), "{users}");
    // A watch streams through: its events arrive as the server sends them.
    let (code, body, spread) = raw_timed(&format!("{flunders}?watch=true"), &[], true);
    assert_eq!(code, 200, "{body}");
    assert!(
        spread >= 0.2,
        "the events arrived together ({spread} s apart): buffered"
    );
    let events: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).expect("an event"))
        .collect();
    assert_eq!(events.len(), 2, "{body}");
    assert_eq!(events[1]["object"]["metadata"]["name"], "event-1");

    // The server goes away: MissingEndpoints, and requests answer 503.
    let out = c.laptop_kubectl(&["delete", "pod", "wardle", "-n", "wardle", "--timeout=60s"]);
    skiff_tests::ok(&out);
    let message = wait_reason(
        &c,
        "v1alpha1.wardle.example.com",
        "False",
        "MissingEndpoints",
    )
    .await;
    assert_eq!(
        message,
        "endpoints for service/wardle in \"wardle\" have no addresses with port name \"\""
    );
    let out = c.laptop_kubectl_as(&alice, &["get", "flunders"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("ServiceUnavailable"),
        "{err}"
    );
    eprintln!("api aggregation test took {:?}", started.elapsed());
}
