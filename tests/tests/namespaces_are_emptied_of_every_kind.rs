//! `kubectl delete namespace` of a namespace holding an object of every namespaced kind the
//! API serves finishes, on a cluster whose controller manager runs with the identity and
//! role `cargo xtask up` and the install command give it (`system:kube-controller-manager`,
//! no administrator's shortcut): its role is derived from the served kinds, so a kind the
//! namespace controller may not delete would leave the namespace Terminating for ever.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use skiff_tests::cluster::Cluster;

/// One object of every namespaced kind, in namespace `everything`.
const OBJECTS: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Pod, metadata: {name: p},
   spec: {containers: [{name: c, image: host, command: [sleep, "3600"]}]}}
- {apiVersion: v1, kind: Service, metadata: {name: s}, spec: {ports: [{port: 80}], selector: {app: a}}}
- {apiVersion: v1, kind: Endpoints, metadata: {name: manual}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: cm}, data: {k: v}}
- {apiVersion: v1, kind: Secret, metadata: {name: sec}, stringData: {k: v}}
- {apiVersion: v1, kind: ServiceAccount, metadata: {name: robot}}
- {apiVersion: v1, kind: Event, metadata: {name: ev},
   involvedObject: {kind: Pod, name: p, namespace: everything}, reason: Test, message: m, type: Normal}
- {apiVersion: v1, kind: PersistentVolumeClaim, metadata: {name: claim},
   spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}
- apiVersion: apps/v1
  kind: ReplicaSet
  metadata: {name: rs}
  spec:
    replicas: 0
    selector: {matchLabels: {app: rs}}
    template:
      metadata: {labels: {app: rs}}
      spec: {containers: [{name: c, image: host, command: [sleep, "3600"]}]}
- apiVersion: v1
  kind: ReplicationController
  metadata: {name: rc}
  spec:
    replicas: 0
    selector: {app: rc}
    template:
      metadata: {labels: {app: rc}}
      spec: {containers: [{name: c, image: host, command: [sleep, "3600"]}]}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: d}
  spec:
    replicas: 1
    selector: {matchLabels: {app: d}}
    template:
      metadata: {labels: {app: d}}
      spec: {containers: [{name: c, image: host, command: [sleep, "3600"]}]}
- apiVersion: apps/v1
  kind: DaemonSet
  metadata: {name: ds}
  spec:
    selector: {matchLabels: {app: ds}}
    template:
      metadata: {labels: {app: ds}}
      spec: {containers: [{name: c, image: host, command: [sleep, "3600"]}]}
- apiVersion: apps/v1
  kind: StatefulSet
  metadata: {name: sts}
  spec:
    serviceName: s
    replicas: 1
    selector: {matchLabels: {app: sts}}
    template:
      metadata: {labels: {app: sts}}
      spec: {containers: [{name: c, image: host, command: [sleep, "3600"]}]}
- {apiVersion: policy/v1, kind: PodDisruptionBudget, metadata: {name: pdb},
   spec: {minAvailable: 1, selector: {matchLabels: {app: d}}}}
- apiVersion: batch/v1
  kind: Job
  metadata: {name: job}
  spec:
    template:
      spec:
        restartPolicy: Never
        containers: [{name: c, image: host, command: ["true"]}]
- apiVersion: batch/v1
  kind: CronJob
  metadata: {name: cron}
  spec:
    schedule: "0 0 1 1 *"
    jobTemplate:
      spec:
        template:
          spec:
            restartPolicy: Never
            containers: [{name: c, image: host, command: ["true"]}]
- apiVersion: autoscaling/v2
  kind: HorizontalPodAutoscaler
  metadata: {name: hpa}
  spec:
    scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: d}
    minReplicas: 1
    maxReplicas: 2
    metrics: [{type: Resource, resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}}]
- {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: deny}, spec: {podSelector: {}}}
- {apiVersion: coordination.k8s.io/v1, kind: Lease, metadata: {name: lease}, spec: {holderIdentity: me}}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: Role
  metadata: {name: role}
  rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: RoleBinding
  metadata: {name: binding}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: role}
  subjects: [{kind: User, name: someone}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_removes_every_kind_and_finishes() {
    // Every namespaced kind the API serves has an object here: a kind added later without
    // one fails this check rather than passing unseen.
    let manifest: serde_json::Value = yaml_serde::from_str(OBJECTS).unwrap();
    let here: BTreeSet<String> = manifest["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect();
    let served: BTreeSet<String> = skiff_api::kinds()
        .iter()
        .map(|k| k.info())
        .filter(|i| i.namespaced)
        .map(|i| i.kind.to_string())
        .collect();
    assert_eq!(here, served, "one object of every namespaced kind");

    let cluster = Cluster::start(0).await;
    let (ok, _, err) = cluster.kubectl(&["create", "namespace", "everything"], None);
    assert!(ok, "{err}");
    let (ok, _, err) = cluster.kubectl(&["apply", "-n", "everything", "-f", "-"], Some(OBJECTS));
    assert!(ok, "{err}");
    let started = Instant::now();
    let (ok, _, err) =
        cluster.kubectl(&["delete", "namespace", "everything", "--wait=false"], None);
    assert!(ok, "{err}");
    loop {
        let (exists, out, _) = cluster.kubectl(
            &[
                "get",
                "namespace",
                "everything",
                "-o",
                "jsonpath={.status.conditions}",
            ],
            None,
        );
        if !exists {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the namespace is still there after 60 s: {out}\n{}",
            cluster.managers[0].log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("namespace deleted in {:?}", started.elapsed());
}
