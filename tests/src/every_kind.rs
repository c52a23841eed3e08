//! Objects of every kind Skiff serves, for the tests that must see each kind: a namespace
//! emptied of every kind, the Python client reading every kind back.

/// One object of every namespaced kind Skiff serves, as a `List` to apply in one namespace
/// (the pods run `sleep` from the host image). Tests compare its kinds with the served ones,
/// so a kind added without an object here fails them.
pub const NAMESPACED: &str = r#"
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

/// One object of every cluster-scoped kind Skiff serves that a cluster does not make itself
/// (a cluster has Namespaces, its Nodes and their serving certificates'
/// CertificateSigningRequests), referring to [`NAMESPACED`]'s objects in namespace
/// `everything`: a volume the claim can bind, a storage class, a pool of load-balancer
/// addresses, RBAC, webhook configurations whose rules match no request, and a custom kind
/// (`Widget`, served once the definition is established; [`WIDGET`] is an object of it).
pub const CLUSTER_SCOPED: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: PersistentVolume
  metadata: {name: every-pv}
  spec:
    capacity: {storage: 1Gi}
    accessModes: [ReadWriteOnce]
    hostPath: {path: /var/lib/skiff-e2e/every-pv}
- {apiVersion: storage.k8s.io/v1, kind: StorageClass, metadata: {name: every-sc},
   provisioner: example.com/e2e, volumeBindingMode: WaitForFirstConsumer}
- apiVersion: skiff.io/v1
  kind: LoadBalancerIPPool
  metadata: {name: every-pool}
  spec:
    blocks: [{cidr: 192.0.2.0/28}]
    serviceSelector: {matchLabels: {lb: every}}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata: {name: every-reader}
  rules: [{apiGroups: [""], resources: [pods], verbs: [get, list, watch]}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: every-reader}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: every-reader}
  subjects: [{kind: User, apiGroup: rbac.authorization.k8s.io, name: someone}]
- apiVersion: admissionregistration.k8s.io/v1
  kind: ValidatingWebhookConfiguration
  metadata: {name: every-validating}
  webhooks:
  - name: nothing.every.skiff.io
    clientConfig: {service: {namespace: everything, name: s, path: /validate}}
    rules: [{apiGroups: [nothing.every.skiff.io], apiVersions: [v1], operations: [CREATE], resources: [nothing]}]
    failurePolicy: Ignore
    sideEffects: None
    admissionReviewVersions: [v1]
- apiVersion: admissionregistration.k8s.io/v1
  kind: MutatingWebhookConfiguration
  metadata: {name: every-mutating}
  webhooks:
  - name: nothing.every.skiff.io
    clientConfig: {service: {namespace: everything, name: s, path: /mutate}}
    rules: [{apiGroups: [nothing.every.skiff.io], apiVersions: [v1], operations: [CREATE], resources: [nothing]}]
    failurePolicy: Ignore
    sideEffects: None
    admissionReviewVersions: [v1]
- apiVersion: admissionregistration.k8s.io/v1
  kind: ValidatingAdmissionPolicy
  metadata: {name: every-policy}
  spec:
    failurePolicy: Fail
    matchConstraints:
      resourceRules: [{apiGroups: [nothing.every.skiff.io], apiVersions: [v1], operations: [CREATE], resources: [nothing]}]
    variables: [{name: size, expression: "object.spec.size"}]
    validations:
    - {expression: "variables.size < 10", messageExpression: "'size ' + string(variables.size)", reason: Forbidden}
- apiVersion: admissionregistration.k8s.io/v1
  kind: ValidatingAdmissionPolicyBinding
  metadata: {name: every-policy}
  spec:
    policyName: every-policy
    validationActions: [Deny]
- apiVersion: apiextensions.k8s.io/v1
  kind: CustomResourceDefinition
  metadata: {name: widgets.every.skiff.io}
  spec:
    group: every.skiff.io
    scope: Namespaced
    names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
    versions:
    - name: v1
      served: true
      storage: true
      subresources: {status: {}}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {type: integer}
            status:
              type: object
              properties:
                seen: {type: boolean}
"#;

/// An object of [`CLUSTER_SCOPED`]'s custom kind, in namespace `everything`.
pub const WIDGET: &str = r#"
apiVersion: every.skiff.io/v1
kind: Widget
metadata: {name: w}
spec: {size: 3}
"#;
