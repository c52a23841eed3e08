//! A CustomResourceDefinition with two served versions whose objects differ in shape (v1's
//! `spec.size` is a string, v2's `spec.replicas` an integer) and a conversion webhook written
//! here, running in a pod behind a Service with the test's CA: objects written in either
//! version are read in both, lists are converted in one call, and a watch on each version
//! sees the same events, each in its own shape (kube-rs watches, kubectl writes). The
//! converter's answer is held to Kubernetes' rules: what the target schema does not specify
//! is pruned, metadata other than labels and annotations is restored, a renamed object or a
//! failed conversion is a 500 with Kubernetes' message, and a write whose conversion fails
//! stores nothing. The storage version is read without the webhook, also when it is down.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use skiff_tests::cluster::Cluster;
use skiff_tests::extension::{TLS_SERVER, serve_in_pod};

/// The converter. `/convert` converts between v1 (`spec.size`, a string) and v2
/// (`spec.replicas`, an integer); towards v2 it labels each object with the number of
/// objects in its review (`batch`), adds a field v2's schema does not have
/// (`spec.unspecified`) and tries to change metadata it may not (`resourceVersion`,
/// `finalizers`). `/rename` renames the object; `/fail` answers a Failure.
const CONVERTER: &str = r#"
import json
from http.server import BaseHTTPRequestHandler
def convert(o, want, n):
    spec = dict(o.get('spec') or {})
    meta = o.setdefault('metadata', {})
    labels = dict(meta.get('labels') or {})
    if want.endswith('/v2'):
        if 'size' in spec:
            spec['replicas'] = int(spec.pop('size'))
        spec['unspecified'] = 'pruned'
        labels['batch'] = str(n)
        meta['resourceVersion'] = '1'
        meta['finalizers'] = ['converter.example.com/evil']
    else:
        if 'replicas' in spec:
            spec['size'] = str(spec.pop('replicas'))
        labels.pop('batch', None)
    meta['labels'] = labels
    o['spec'] = spec
    o['apiVersion'] = want
    return o
class H(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers.get('Content-Length', 0))))
        req = review['request']
        want = req['desiredAPIVersion']
        objs = req['objects']
        path = self.path.split('?')[0]
        result = {'status': 'Success'}
        out = [convert(o, want, len(objs)) for o in objs]
        if path == '/rename':
            for o in out:
                o['metadata']['name'] = 'renamed'
        elif path == '/fail':
            result = {'status': 'Failure', 'message': 'the converter refuses today'}
            out = []
        body = json.dumps({'apiVersion': review['apiVersion'], 'kind': 'ConversionReview',
                           'response': {'uid': req['uid'], 'result': result,
                                        'convertedObjects': out}}).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
"#;

fn crd(ca_bundle: &str, service: &str, path: &str) -> String {
    format!(
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: crontabs.stable.example.com
spec:
  group: stable.example.com
  scope: Namespaced
  names: {{plural: crontabs, singular: crontab, kind: CronTab}}
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: [v1]
      clientConfig:
        caBundle: {ca_bundle}
        service: {{namespace: convert, name: {service}, path: {path}}}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {{type: string}}
    - name: v2
      served: true
      storage: false
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                replicas: {{type: integer}}
"#
    )
}

fn resource(version: &str) -> ApiResource {
    ApiResource {
        group: "stable.example.com".into(),
        version: version.into(),
        api_version: format!("stable.example.com/{version}"),
        kind: "CronTab".into(),
        plural: "crontabs".into(),
    }
}

/// `kubectl <args>` with `stdin`, on the laptop: success and stdout, or stderr.
fn kubectl(c: &Cluster, args: &[&str], stdin: &str) -> Result<String, String> {
    let out = skiff_tests::run_with_stdin(c.laptop_kubectl_cmd(args), stdin);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn get(c: &Cluster, version: &str, name: &str) -> Result<Value, String> {
    let what = format!("crontabs.{version}.stable.example.com");
    kubectl(c, &["get", &what, name, "-n", "default", "-o", "json"], "")
        .map(|s| serde_json::from_str(&s).expect("kubectl's JSON"))
}

/// Points the definition's webhook at `service` and `path`, and waits until reads through it
/// show it (the definition's change reaches the server through its watch).
async fn point_webhook_at(c: &Cluster, ca_bundle: &str, service: &str, path: &str) {
    kubectl(c, &["apply", "-f", "-"], &crd(ca_bundle, service, path)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversion_webhook_serves_two_versions_of_a_custom_kind() {
    let c = Cluster::start(1).await;
    c.route_pods_from_control().await;
    let nothing = "---\napiVersion: v1\nkind: Service\nmetadata: {name: nothing, namespace: \
                   convert}\nspec:\n  selector: {app: nobody}\n  ports: [{port: 443, \
                   targetPort: 8443}]\n";
    let server = serve_in_pod(
        &c,
        "convert",
        "converter",
        &format!("{CONVERTER}{TLS_SERVER}"),
        &[],
        nothing,
    )
    .await;
    let ca = server.ca_bundle.as_str();
    point_webhook_at(&c, ca, "converter", "/convert").await;
    kubectl(
        &c,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/crontabs.stable.example.com",
        ],
        "",
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", c.logs()));

    let kubeconfig = kube::config::Kubeconfig::read_from(&c.server.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let v1: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource("v1"));
    let v2: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource("v2"));

    // A watch on each version, from the same revision.
    let rv = skiff_tests::eventually_within(
        "the kind is served at both versions",
        Duration::from_secs(30),
        || async {
            let a = v1
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            v2.list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            a.metadata
                .resource_version
                .ok_or("no resourceVersion".to_string())
        },
    )
    .await;
    let watch = |api: Api<DynamicObject>, rv: String, version: &str| {
        let want = format!("stable.example.com/{version}");
        tokio::spawn(async move {
            let stream = api
                .watch(&WatchParams::default().timeout(60), &rv)
                .await
                .unwrap();
            let mut stream = stream.boxed();
            let mut seen: Vec<(String, String, Value)> = Vec::new();
            while let Ok(Some(ev)) = stream.try_next().await {
                if let WatchEvent::Added(o) | WatchEvent::Modified(o) = ev {
                    let spec = o.data["spec"].clone();
                    assert_eq!(
                        o.types.as_ref().map(|t| t.api_version.as_str()),
                        Some(want.as_str()),
                        "an object in the watched version"
                    );
                    seen.push((
                        o.metadata.name.clone().unwrap_or_default(),
                        o.metadata.resource_version.clone().unwrap_or_default(),
                        spec,
                    ));
                    if seen.len() == 3 {
                        break;
                    }
                }
            }
            seen
        })
    };
    let watch_v1 = watch(v1.clone(), rv.clone(), "v1");
    let watch_v2 = watch(v2.clone(), rv, "v2");

    // Written at v1, read at v2; written at v2, stored at v1 and read at both.
    let a = "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata: {name: a, namespace: \
             default}\nspec: {size: \"3\"}\n";
    kubectl(&c, &["create", "-f", "-"], a).unwrap_or_else(|e| panic!("{e}\n{}", c.logs()));
    let b = "apiVersion: stable.example.com/v2\nkind: CronTab\nmetadata: {name: b, namespace: \
             default}\nspec: {replicas: 5}\n";
    kubectl(&c, &["create", "-f", "-"], b).unwrap_or_else(|e| panic!("{e}\n{}", c.logs()));
    let a2 = get(&c, "v2", "a").unwrap_or_else(|e| panic!("{e}\n{}", c.logs()));
    assert_eq!(a2["apiVersion"], "stable.example.com/v2");
    assert_eq!(
        a2["spec"],
        json!({"replicas": 3}),
        "converted, and pruned by v2's schema"
    );
    assert_eq!(a2["metadata"]["labels"]["batch"], "1", "{a2}");
    let a1 = get(&c, "v1", "a").unwrap();
    assert_eq!(a1["spec"], json!({"size": "3"}));
    assert_eq!(
        a2["metadata"]["resourceVersion"], a1["metadata"]["resourceVersion"],
        "metadata other than labels and annotations comes from the stored object"
    );
    assert!(a2["metadata"].get("finalizers").is_none(), "{a2}");
    let b1 = get(&c, "v1", "b").unwrap();
    assert_eq!(b1["apiVersion"], "stable.example.com/v1");
    assert_eq!(
        b1["spec"],
        json!({"size": "5"}),
        "stored at v1 through the webhook"
    );
    assert!(b1["metadata"].get("finalizers").is_none(), "{b1}");

    // A list is converted in one review.
    let list = v2.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2);
    for o in &list.items {
        assert_eq!(o.metadata.labels.as_ref().unwrap()["batch"], "2", "{o:?}");
        assert!(o.data["spec"]["replicas"].is_i64(), "{o:?}");
    }
    let list = v1.list(&ListParams::default()).await.unwrap();
    assert!(
        list.items
            .iter()
            .all(|o| o.data["spec"]["size"].is_string())
    );

    // An update at v2, read at v1.
    kubectl(
        &c,
        &[
            "patch",
            "crontabs.v2.stable.example.com",
            "b",
            "-n",
            "default",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":7}}"#,
        ],
        "",
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", c.logs()));
    assert_eq!(get(&c, "v1", "b").unwrap()["spec"], json!({"size": "7"}));

    // Both watches saw the same events, each in its version's shape.
    let within = Duration::from_secs(30);
    let seen1 = tokio::time::timeout(within, watch_v1)
        .await
        .unwrap()
        .unwrap();
    let seen2 = tokio::time::timeout(within, watch_v2)
        .await
        .unwrap()
        .unwrap();
    let ids = |s: &[(String, String, Value)]| {
        s.iter()
            .map(|(n, rv, _)| format!("{n}@{rv}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&seen1), ids(&seen2), "{seen1:?}\n{seen2:?}");
    let specs = |s: &[(String, String, Value)]| s.iter().map(|e| e.2.clone()).collect::<Vec<_>>();
    assert_eq!(
        specs(&seen1),
        vec![
            json!({"size": "3"}),
            json!({"size": "5"}),
            json!({"size": "7"})
        ]
    );
    assert_eq!(
        specs(&seen2),
        vec![
            json!({"replicas": 3}),
            json!({"replicas": 5}),
            json!({"replicas": 7})
        ]
    );

    // A converter that renames the object, or fails: a 500 with Kubernetes' message; a write
    // through it stores nothing; the storage version is still read.
    point_webhook_at(&c, ca, "converter", "/rename").await;
    let renamed = skiff_tests::eventually_within(
        "reads through the renaming converter fail",
        Duration::from_secs(30),
        || async {
            get(&c, "v2", "a")
                .err()
                .ok_or_else(|| "still converted".to_string())
        },
    )
    .await;
    assert!(
        renamed.contains(
            "Error from server (InternalError): Internal error occurred: conversion webhook for \
             stable.example.com/v1, Kind=CronTab returned invalid object: must have the same \
             name: a != renamed"
        ),
        "{renamed}"
    );
    point_webhook_at(&c, ca, "converter", "/fail").await;
    let failed = skiff_tests::eventually_within(
        "reads through the failing converter say why",
        Duration::from_secs(30),
        || async {
            let e = get(&c, "v2", "a").err().unwrap_or_default();
            e.contains("the converter refuses today")
                .then_some(e.clone())
                .ok_or(e)
        },
    )
    .await;
    assert!(
        failed.contains(
            "conversion webhook for stable.example.com/v1, Kind=CronTab failed: the converter \
             refuses today"
        ),
        "{failed}"
    );
    let lost = "apiVersion: stable.example.com/v2\nkind: CronTab\nmetadata: {name: lost, \
                namespace: default}\nspec: {replicas: 1}\n";
    let refused = kubectl(&c, &["create", "-f", "-"], lost).unwrap_err();
    assert!(refused.contains("the converter refuses today"), "{refused}");
    let missing = get(&c, "v1", "lost").unwrap_err();
    assert!(missing.contains("NotFound"), "{missing}");
    assert_eq!(get(&c, "v1", "a").unwrap()["spec"], json!({"size": "3"}));

    // The converter's Service without endpoints.
    point_webhook_at(&c, ca, "nothing", "/convert").await;
    let down = skiff_tests::eventually_within(
        "reads through a converter without endpoints fail",
        Duration::from_secs(30),
        || async {
            let e = get(&c, "v2", "a").err().unwrap_or_default();
            e.contains("no endpoints").then_some(e.clone()).ok_or(e)
        },
    )
    .await;
    assert!(
        down.contains("conversion webhook for stable.example.com/v1, Kind=CronTab failed"),
        "{down}"
    );
    assert_eq!(get(&c, "v1", "b").unwrap()["spec"], json!({"size": "7"}));
}
