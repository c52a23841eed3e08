//! A HorizontalPodAutoscaler (autoscaling/v2, CPU utilization) with the real kubectl: a
//! Deployment whose pods burn CPU is scaled up to maxReplicas, and back down to
//! minReplicas once the load stops and the scale-down stabilization window has passed;
//! `kubectl get hpa` shows the target and the measured utilization; bad specs are refused.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::Duration;

use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hpa_scales_up_under_load_and_down_after_the_window() {
    let c = Cluster::start(1).await;
    let k = |args: &[&str], stdin: Option<&str>| {
        let (ok, out, err) = c.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}\n{}", c.logs());
        out
    };
    // The pods burn a CPU until this file exists (host containers see the node's /tmp).
    let stop = std::env::temp_dir().join(format!("skiff-hpa-stop-{}", skiff_testkit::unique()));
    let manifests = format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: busy}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: busy}}}}
  template:
    metadata: {{labels: {{app: busy}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: burn
        image: host
        command: ["busybox", "sh", "-c", "while [ ! -e {stop} ]; do :; done; exec busybox sleep 3600"]
        resources: {{requests: {{cpu: 100m}}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: busy}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: busy}}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {{name: cpu, target: {{type: Utilization, averageUtilization: 50}}}}
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 5
      policies: [{{type: Pods, value: 1, periodSeconds: 5}}]
"#,
        stop = stop.display()
    );
    k(&["apply", "-f", "-"], Some(&manifests));
    let replicas = |c: &Cluster| {
        let (_, out, _) = c.kubectl(
            &["get", "deploy", "busy", "-o", "jsonpath={.spec.replicas}"],
            None,
        );
        out
    };
    let deadline = std::time::Instant::now() + T;
    while replicas(&c) != "3" {
        if std::time::Instant::now() > deadline {
            let (_, hpa, _) = c.kubectl(&["get", "hpa", "busy", "-o", "yaml"], None);
            let (_, ev, _) = c.kubectl(&["get", "events"], None);
            panic!("not scaled up:\n{hpa}\n{ev}\n{}", c.logs());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let table = k(&["get", "hpa", "busy"], None);
    assert!(
        table.starts_with("NAME   REFERENCE         TARGETS"),
        "{table}"
    );
    assert!(table.contains("Deployment/busy   cpu: "), "{table}");
    let events = k(
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=busy,reason=SuccessfulRescale",
            "-o",
            "jsonpath={.items[*].message}",
        ],
        None,
    );
    assert!(
        events.contains("New size: 3; reason: cpu resource utilization (percentage of request)"),
        "{events}"
    );

    // Load off: back to minReplicas after the window, one pod at a time (the scale-down
    // policy: 1 pod per 5 s), so 2 replicas are seen on the way.
    std::fs::write(&stop, b"").unwrap();
    let mut seen = Vec::new();
    skiff_testkit::eventually_blocking("scaled down to minReplicas", T, || {
        let r = replicas(&c);
        if seen.last() != Some(&r) {
            seen.push(r.clone());
        }
        std::thread::sleep(Duration::from_millis(200));
        (r == "1").then_some(())
    });
    assert_eq!(
        seen,
        ["3", "2", "1"],
        "the scale-down policy was not followed"
    );
    let _ = std::fs::remove_file(&stop);
    assert_eq!(
        k(
            &[
                "get",
                "hpa",
                "busy",
                "-o",
                "jsonpath={.status.desiredReplicas}"
            ],
            None
        ),
        "1"
    );

    // Bad input.
    let bad = r#"{"apiVersion":"autoscaling/v2","kind":"HorizontalPodAutoscaler","metadata":{"name":"bad"},
        "spec":{"scaleTargetRef":{"apiVersion":"apps/v1","kind":"Deployment","name":"busy"},"minReplicas":5,"maxReplicas":2}}"#;
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(bad));
    assert!(!ok);
    assert!(
        err.contains("The HorizontalPodAutoscaler \"bad\" is invalid")
            && err.contains(
                "spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`"
            ),
        "{err}"
    );
}
