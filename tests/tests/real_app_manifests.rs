//! A manifest set in the style of a real application, applied unchanged with the real
//! kubectl in one `kubectl apply`: a web Deployment reading a ConfigMap and a Secret from
//! environment variables and files, behind a Service; a Redis-like StatefulSet of 3 with
//! its headless Service and PersistentVolumeClaims from the default StorageClass; a
//! DaemonSet on every node; a CronJob every minute. Each object reaches the state Kubernetes
//! would give it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use skiff_testkit::registry::Registry;
use skiff_tests::cluster::Cluster;

/// The CronJob runs at the next full minute: up to a minute, plus its Job.
const T: Duration = Duration::from_secs(150);

const APP: &str = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: web-config}
data:
  GREETING: hello
  app.conf: |
    listen 8080
---
apiVersion: v1
kind: Secret
metadata: {name: web-secret}
type: Opaque
stringData:
  password: s3cret
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: IMAGE
        command: ["/bin/busybox", "sh", "-c", "exec /bin/busybox sleep 3600"]
        envFrom:
        - configMapRef: {name: web-config}
        env:
        - name: PASSWORD
          valueFrom: {secretKeyRef: {name: web-secret, key: password}}
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        volumeMounts:
        - {name: config, mountPath: /etc/web}
        - {name: secret, mountPath: /etc/secret, readOnly: true}
        readinessProbe:
          exec: {command: ["/bin/busybox", "cat", "/etc/web/app.conf"]}
          periodSeconds: 1
      volumes:
      - name: config
        configMap: {name: web-config, items: [{key: app.conf, path: app.conf}]}
      - name: secret
        secret: {secretName: web-secret}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: redis}
spec:
  clusterIP: None
  selector: {app: redis}
  ports: [{port: 6379}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: redis}
spec:
  serviceName: redis
  replicas: 3
  selector: {matchLabels: {app: redis}}
  template:
    metadata: {labels: {app: redis}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: redis
        image: IMAGE
        command: ["/bin/busybox", "sh", "-c", "hostname > /data/owner; exec /bin/busybox sleep 3600"]
        ports: [{containerPort: 6379, name: redis}]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 512Mi}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: log-shipper}
spec:
  selector: {matchLabels: {app: log-shipper}}
  template:
    metadata: {labels: {app: log-shipper}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: shipper
        image: IMAGE
        command: ["/bin/busybox", "sleep", "3600"]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: tick}
spec:
  schedule: "*/1 * * * *"
  successfulJobsHistoryLimit: 2
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
          - name: tick
            image: IMAGE
            command: ["/bin/busybox", "echo", "tick"]
"#;

fn get(c: &Cluster, args: &[&str]) -> String {
    c.kubectl(args, None).1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_app_manifest_set_applies_unchanged() {
    let registry = Registry::start();
    let image = registry.push_busybox("demo/app:v1").await;
    let c = Cluster::start(2).await;
    let (ok, out, err) = c.kubectl(&["apply", "-f", "-"], Some(&APP.replace("IMAGE", &image)));
    assert!(ok, "{err}");
    for created in [
        "configmap/web-config created",
        "secret/web-secret created",
        "deployment.apps/web created",
        "service/web created",
        "statefulset.apps/redis created",
        "daemonset.apps/log-shipper created",
        "cronjob.batch/tick created",
    ] {
        assert!(out.contains(created), "{out}");
    }
    let deadline = std::time::Instant::now() + T;
    let states = || {
        [
            get(
                &c,
                &[
                    "get",
                    "deploy",
                    "web",
                    "-o",
                    "jsonpath={.status.availableReplicas}",
                ],
            ) == "2",
            get(
                &c,
                &[
                    "get",
                    "sts",
                    "redis",
                    "-o",
                    "jsonpath={.status.readyReplicas}",
                ],
            ) == "3",
            get(
                &c,
                &["get", "pvc", "-o", "jsonpath={.items[*].status.phase}"],
            ) == "Bound Bound Bound",
            get(
                &c,
                &[
                    "get",
                    "ds",
                    "log-shipper",
                    "-o",
                    "jsonpath={.status.numberReady}",
                ],
            ) == "2",
            get(
                &c,
                &[
                    "get",
                    "jobs",
                    "-o",
                    "jsonpath={.items[*].status.conditions[?(@.type==\"Complete\")].status}",
                ],
            )
            .contains("True"),
            !get(
                &c,
                &[
                    "get",
                    "cronjob",
                    "tick",
                    "-o",
                    "jsonpath={.status.lastSuccessfulTime}",
                ],
            )
            .is_empty(),
        ]
    };
    loop {
        let s = states();
        if s.iter().all(|ok| *ok) {
            break;
        }
        if std::time::Instant::now() > deadline {
            let (_, all, _) = c.kubectl(&["get", "all,pvc,pv", "-o", "wide"], None);
            let (_, ev, _) = c.kubectl(&["get", "events"], None);
            panic!(
                "not every object reached its state (deploy, sts, pvc, ds, job, cronjob): \
                 {s:?}\n{all}\n{ev}\n{}",
                c.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // The web pods read the ConfigMap and the Secret from variables and files.
    let pod = get(
        &c,
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ],
    );
    let (ok, env, err) = c.kubectl(&["exec", &pod, "--", "/bin/busybox", "env"], None);
    assert!(ok, "{err}");
    assert!(env.contains("GREETING=hello\n"), "{env}");
    assert!(env.contains("PASSWORD=s3cret\n"), "{env}");
    assert!(env.contains(&format!("POD_NAME={pod}\n")), "{env}");
    let (ok, files, err) = c.kubectl(
        &[
            "exec",
            &pod,
            "--",
            "/bin/busybox",
            "cat",
            "/etc/web/app.conf",
            "/etc/secret/password",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(files, "listen 8080\ns3cret");
    // Each Redis pod writes its claim, which is its own.
    for i in 0..3 {
        let (ok, owner, err) = c.kubectl(
            &[
                "exec",
                &format!("redis-{i}"),
                "--",
                "/bin/busybox",
                "cat",
                "/data/owner",
            ],
            None,
        );
        assert!(ok, "{err}");
        assert_eq!(owner.trim(), format!("redis-{i}"));
    }
    // One shipper per node.
    let nodes = get(
        &c,
        &[
            "get",
            "pods",
            "-l",
            "app=log-shipper",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
    );
    let mut nodes: Vec<&str> = nodes.split_whitespace().collect();
    nodes.sort();
    let mut want: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
    want.sort();
    assert_eq!(nodes, want);
    // kubectl's overview lists them all.
    let all = get(&c, &["get", "all"]);
    for name in [
        "deployment.apps/web",
        "statefulset.apps/redis",
        "daemonset.apps/log-shipper",
        "cronjob.batch/tick",
        "service/web",
    ] {
        assert!(all.contains(name), "{all}");
    }
}
