//! Servers that extend the API, written by a test: a Python program in a pod (`image: host`)
//! behind a Service, serving TLS on port 8443 (the Service's 443) with a certificate for
//! `<service>.<namespace>.svc` from a CA the test makes. The program reads its certificate
//! and key from the environment (`TLS_CERT`, `TLS_KEY`); [`TLS_SERVER`] is the Python that
//! wraps an `http.server` handler class `H` in that TLS.

use std::time::Duration;

use base64::Engine;
use skiff_api::api::Endpoints;

use crate::cluster::Cluster;

/// Python that serves the handler class `H` (defined before it) over TLS on 0.0.0.0:8443
/// and prints `serving`.
pub const TLS_SERVER: &str = r#"
import os, ssl, tempfile
from http.server import ThreadingHTTPServer
_d = tempfile.mkdtemp()
open(_d + '/c', 'w').write(os.environ['TLS_CERT'])
open(_d + '/k', 'w').write(os.environ['TLS_KEY'])
_s = ThreadingHTTPServer(('0.0.0.0', 8443), H)
_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
_ctx.load_cert_chain(_d + '/c', _d + '/k')
_s.socket = _ctx.wrap_socket(_s.socket, server_side=True)
print('serving', flush=True)
_s.serve_forever()
"#;

/// A server running in the cluster.
#[derive(Debug, Clone)]
pub struct ExtensionServer {
    /// The certificate of the CA that signed the server's, base64 (a `caBundle` field's
    /// value).
    pub ca_bundle: String,
}

/// Runs `program` (Python; it ends with [`TLS_SERVER`] or serves on its own) as pod
/// `<name>` behind Service `<name>` in `namespace` (created), with `env` besides
/// `TLS_CERT` and `TLS_KEY`, and waits until the Service has a ready endpoint (the pod is
/// ready once its port accepts connections). `extra` is appended to the manifest (more
/// objects, `---` separated).
pub async fn serve_in_pod(
    c: &Cluster,
    namespace: &str,
    name: &str,
    program: &str,
    env: &[(&str, &str)],
    extra: &str,
) -> ExtensionServer {
    let ca = skiff_pki::Ca::generate("extension server test CA").expect("a CA");
    let host = format!("{name}.{namespace}.svc");
    let serving = ca
        .issue(&skiff_pki::LeafSpec::server(
            &host,
            std::slice::from_ref(&host),
        ))
        .expect("a serving certificate");
    let q = |s: &str| serde_json::to_string(s).expect("a JSON string");
    let manifest = format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {namespace}
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
  labels: {{app: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: server
      image: host
      command: ["python3", "-c", {program}]
      env:
        - {{name: TLS_CERT, value: {cert}}}
        - {{name: TLS_KEY, value: {key}}}{env}
      ports: [{{containerPort: 8443, name: https}}]
      readinessProbe:
        tcpSocket: {{port: 8443}}
        periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {namespace}
spec:
  selector: {{app: {name}}}
  ports: [{{port: 443, targetPort: https}}]
{extra}"#,
        program = q(program),
        cert = q(&serving.cert_pem),
        key = q(&serving.key_pem),
        env = env
            .iter()
            .map(|(k, v)| format!("\n        - {{name: {k}, value: {}}}", q(v)))
            .collect::<String>(),
    );
    let out = crate::run_with_stdin(c.laptop_kubectl_cmd(&["apply", "-f", "-"]), &manifest);
    crate::ok(&out);
    let endpoints = c.client.namespaced::<Endpoints>(namespace);
    crate::eventually_within(
        "the extension server's endpoints",
        Duration::from_secs(90),
        || async {
            let ep = endpoints.get(name).await.map_err(|e| e.to_string())?;
            ep.subsets
                .iter()
                .any(|s| !s.addresses.is_empty())
                .then_some(())
                .ok_or_else(|| format!("{ep:?}\n{}", c.logs()))
        },
    )
    .await;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca.cert_pem());
    ExtensionServer { ca_bundle }
}
