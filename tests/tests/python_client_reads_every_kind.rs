//! The official Kubernetes Python client (`kubernetes` from PyPI, pinned in
//! `tests/python/requirements.txt`, client-side validation on as by default) reads every
//! object kind Skiff serves back into its models, writes the models back and reads them
//! again (`tests/python/read_every_kind.py`), and watches pods: a cluster with one node holds
//! an object of every kind (`skiff_tests::every_kind`, running pods with real container
//! statuses, a bound volume, the node's own serving-certificate request, a custom kind, and
//! objects using the fields whose types strict models check hardest), and
//! the script, run as a user bound to `cluster-admin`, goes through what the API's discovery
//! lists. A served kind without an object, a field a model refuses (a required field left
//! null), drops or changes, and a kind discovery leaves out all fail the test, naming the
//! kind.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::BTreeSet;

use skiff_tests::cluster::Cluster;
use skiff_tests::every_kind::{CLUSTER_SCOPED, NAMESPACED, WIDGET};
use skiff_tests::python;

/// The namespace of the namespaced objects (its Event names it).
const NS: &str = "everything";

/// Objects with the fields whose types strict models check hardest: quantities,
/// int-or-string ports and percentages, probes, every common volume and env source,
/// selectors with expressions, affinity and tolerations, policy peers and ports. (The pod's
/// volumes are declared, not mounted: the `host` image has no root filesystem to mount them
/// in.)
const RICH: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: rich, labels: {app: rich}, annotations: {note: rich}}
  spec:
    replicas: 1
    revisionHistoryLimit: 3
    strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 25%, maxUnavailable: 0}}
    selector:
      matchLabels: {app: rich}
      matchExpressions: [{key: tier, operator: In, values: [web]}]
    template:
      metadata: {labels: {app: rich, tier: web}}
      spec:
        terminationGracePeriodSeconds: 5
        tolerations: [{key: k, operator: Exists, effect: NoSchedule}]
        affinity:
          podAntiAffinity:
            preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 10
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector: {matchLabels: {app: rich}}
        volumes:
        - {name: scratch, emptyDir: {sizeLimit: 64Mi}}
        - {name: conf, configMap: {name: cm, items: [{key: k, path: k.txt}]}}
        - {name: cred, secret: {secretName: sec, defaultMode: 0400}}
        - {name: info, downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}}
        containers:
        - name: c
          image: host
          command: [sleep, "3600"]
          ports: [{name: http, containerPort: 8080, protocol: TCP}]
          env:
          - {name: A, value: "1"}
          - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
          - {name: K, valueFrom: {configMapKeyRef: {name: cm, key: k}}}
          - {name: CPU, valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: 1m}}}
          envFrom: [{secretRef: {name: sec}, prefix: S_}]
          resources: {requests: {cpu: 10m, memory: 16Mi}, limits: {cpu: "1", memory: 64Mi}}
          readinessProbe: {exec: {command: ["true"]}, periodSeconds: 2}
          livenessProbe: {exec: {command: ["true"]}, initialDelaySeconds: 1, periodSeconds: 5}
- apiVersion: v1
  kind: Service
  metadata: {name: rich}
  spec:
    selector: {app: rich}
    ports:
    - {name: http, port: 80, targetPort: http}
    - {name: alt, port: 81, targetPort: 8080, protocol: TCP}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: rich}
  spec:
    podSelector: {matchLabels: {app: rich}}
    policyTypes: [Ingress, Egress]
    ingress:
    - from:
      - ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}
      - namespaceSelector: {matchLabels: {team: a}}
        podSelector: {matchExpressions: [{key: role, operator: Exists}]}
      ports: [{protocol: TCP, port: http}, {protocol: TCP, port: 9000, endPort: 9100}]
    egress:
    - to: [{podSelector: {}}]
      ports: [{protocol: UDP, port: 53}]
- apiVersion: autoscaling/v2
  kind: HorizontalPodAutoscaler
  metadata: {name: rich}
  spec:
    scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: rich}
    minReplicas: 1
    maxReplicas: 3
    metrics:
    - {type: Resource, resource: {name: memory, target: {type: AverageValue, averageValue: 32Mi}}}
    behavior:
      scaleDown:
        stabilizationWindowSeconds: 60
        policies: [{type: Percent, value: 50, periodSeconds: 30}]
"#;

fn kubectl(c: &Cluster, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, out, err) = c.kubectl(args, stdin);
    assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}\n{}", c.logs());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_reads_every_kind_back_into_its_models() {
    // Before anything starts: a missing venv is one clear failure naming the fix.
    python::interpreter();
    let c = Cluster::start(1).await;

    kubectl(&c, &["create", "namespace", NS], None);
    kubectl(&c, &["apply", "-n", NS, "-f", "-"], Some(NAMESPACED));
    kubectl(&c, &["apply", "-n", NS, "-f", "-"], Some(RICH));
    kubectl(&c, &["apply", "-f", "-"], Some(CLUSTER_SCOPED));
    kubectl(
        &c,
        &[
            "wait",
            "--for=condition=Established",
            "crd/widgets.every.skiff.io",
            "--timeout=60s",
        ],
        None,
    );
    kubectl(&c, &["apply", "-n", NS, "-f", "-"], Some(WIDGET));
    // Objects and lists come in Kubernetes' field order (its Go structs'), not by name.
    let raw = |path: &str| kubectl(&c, &["get", "--raw", path], None);
    let pod = raw(&format!("/api/v1/namespaces/{NS}/pods/p"));
    assert!(
        pod.starts_with(r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"#),
        "{pod}"
    );
    let at = |what: &str| {
        pod.find(what)
            .unwrap_or_else(|| panic!("no {what} in {pod}"))
    };
    assert!(at(r#""containers":[{"name":"c","image":"host","#) < at(r#""restartPolicy":"#));
    assert!(at(r#""spec":"#) < at(r#""status":"#));
    let list = raw(&format!("/apis/apps/v1/namespaces/{NS}/deployments"));
    assert!(
        list.starts_with(
            r#"{"kind":"DeploymentList","apiVersion":"apps/v1","metadata":{"resourceVersion":"#
        ),
        "{list}"
    );
    // Running pods carry container statuses (image, imageID, state) for the models to read.
    for pods in [&["pod/p"][..], &["pod", "-l", "app=rich"]] {
        let mut args = vec!["wait", "-n", NS, "--for=condition=Ready", "--timeout=90s"];
        args.extend_from_slice(pods);
        let (ok, out, err) = c.kubectl(&args, None);
        if !ok {
            let (_, states, _) = c.kubectl(&["get", "pods", "-n", NS, "-o", "yaml"], None);
            panic!("{out}{err}\n{states}\n{}\n{}", c.logs(), c.agent_logs());
        }
    }

    // A user of its own, with the rights of the role Kubernetes gives administrators.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = c.server.user_kubeconfig(dir.path(), "python-client", &[]);
    kubectl(
        &c,
        &[
            "create",
            "clusterrolebinding",
            "every-python-client",
            "--clusterrole=cluster-admin",
            "--user=python-client",
        ],
        None,
    );

    let started = std::time::Instant::now();
    let out = python::run(&kubeconfig, "read_every_kind.py", &[NS]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the Python client failed on some kinds ({:?}):\n{stdout}\n{stderr}\n{}",
        started.elapsed(),
        c.logs()
    );

    // Every kind Skiff serves was checked: discovery may not leave one out.
    let checked: BTreeSet<String> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("KINDS "))
        .map(|json| serde_json::from_str(json).expect("the KINDS line"))
        .expect("the script lists the kinds it checked");
    let mut served: BTreeSet<String> = skiff_api::kinds()
        .iter()
        .map(|k| k.info())
        .map(|i| format!("{}/{}", i.api_version, i.kind))
        .collect();
    served.insert("every.skiff.io/v1/Widget".into());
    let missing: Vec<_> = served.difference(&checked).collect();
    assert!(
        missing.is_empty(),
        "kinds Skiff serves that the client never read: {missing:?}\n{stdout}"
    );
}
