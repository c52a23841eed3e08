//! ValidatingAdmissionPolicy, through kubectl as the Kubernetes documentation walks it: a
//! policy of CEL validations, bound to the namespaces a binding's selector picks, denies
//! writes with kube-apiserver's words (kubectl prints `The deployments "x" is invalid: :
//! ValidatingAdmissionPolicy '...' with binding '...' denied request: ...`), a Warn binding
//! admits with a warning, variables and messageExpressions and a validation's reason shape
//! the answer, an expression's error follows the failure policy, and policies and bindings
//! that cannot work are refused when written, naming the field.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use skiff_tests::cluster::Cluster;

const POLICY: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: "demo-policy.example.com"
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups:   ["apps"]
      apiVersions: ["v1"]
      operations:  ["CREATE", "UPDATE"]
      resources:   ["deployments"]
  validations:
    - expression: "object.spec.replicas <= 5"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: "demo-binding-test.example.com"
spec:
  policyName: "demo-policy.example.com"
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels:
        environment: test
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: "demo-binding-warn.example.com"
spec:
  policyName: "demo-policy.example.com"
  validationActions: [Warn]
  matchResources:
    namespaceSelector:
      matchLabels:
        environment: staging
"#;

/// `attempt` until it gives `Some` (policies reach the API server's admission through a
/// watch: a write right after a policy's may come before it), at most 20 s.
fn until<T>(what: &str, mut attempt: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Some(v) = attempt() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

fn deployment(name: &str, namespace: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: {namespace}}}\n\
         spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  \
         template:\n    metadata: {{labels: {{app: {name}}}}}\n    \
         spec: {{containers: [{{name: c, image: host}}]}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validating_admission_policies_deny_warn_and_explain() {
    let c = Cluster::start(0).await;
    let kubectl = |args: &[&str], stdin: Option<&str>| c.kubectl(args, stdin);
    let apply = |yaml: &str| kubectl(&["apply", "-f", "-"], Some(yaml));

    let (ok, _, err) = apply(POLICY);
    assert!(ok, "{err}\n{}", c.logs());
    for (ns, env) in [("test", "test"), ("staging", "staging"), ("other", "none")] {
        let (ok, _, err) = kubectl(&["create", "namespace", ns], None);
        assert!(ok, "{err}");
        let label = format!("environment={env}");
        let (ok, _, err) = kubectl(&["label", "namespace", ns, &label], None);
        assert!(ok, "{err}");
    }
    let (_, out, _) = kubectl(&["get", "validatingadmissionpolicies"], None);
    assert!(
        out.contains("NAME")
            && out.contains("VALIDATIONS")
            && out.contains("demo-policy.example.com"),
        "{out}"
    );

    // Deny, in the namespaces the binding selects, with Kubernetes' words.
    let err = until("the policy to deny", || {
        let (ok, _, err) = apply(&deployment("nginx", "test", 6));
        (!ok).then_some(err)
    });
    assert!(
        err.contains(
            "The deployments \"nginx\" is invalid: : ValidatingAdmissionPolicy \
             'demo-policy.example.com' with binding 'demo-binding-test.example.com' denied \
             request: failed expression: object.spec.replicas <= 5"
        ),
        "{err}"
    );
    let (ok, _, err) = apply(&deployment("nginx", "test", 3));
    assert!(ok, "{err}");
    // Updates are validated too.
    let (ok, _, err) = kubectl(
        &["scale", "deployment", "nginx", "-n", "test", "--replicas=7"],
        None,
    );
    assert!(!ok && err.contains("denied request"), "{err}");
    // Outside the selected namespaces nothing is checked.
    let (ok, _, err) = apply(&deployment("nginx", "other", 6));
    assert!(ok, "{err}");
    // Warn admits, with a warning.
    let (ok, _, err) = apply(&deployment("nginx", "staging", 6));
    assert!(ok, "{err}");
    assert!(
        err.contains(
            "Warning: Validation failed for ValidatingAdmissionPolicy \
             'demo-policy.example.com' with binding 'demo-binding-warn.example.com': failed \
             expression: object.spec.replicas <= 5"
        ),
        "{err}"
    );

    // Variables, a messageExpression and a reason (Forbidden: 403).
    let keys = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: few-keys}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [configmaps]}]
  matchConditions: [{name: labelled, expression: "has(object.metadata.labels) && 'checked' in object.metadata.labels"}]
  variables: [{name: keys, expression: "has(object.data) ? object.data.size() : 0"}]
  validations:
  - expression: "variables.keys <= 2"
    messageExpression: "'too many keys: ' + string(variables.keys)"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: few-keys}
spec: {policyName: few-keys, validationActions: [Deny]}
"#;
    let (ok, _, err) = apply(keys);
    assert!(ok, "{err}");
    let map = |name: &str, labels: &str, n: usize| {
        let data: Vec<String> = (0..n).map(|i| format!("k{i}: v")).collect();
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: other, labels: {{{labels}}}}}\n\
             data: {{{}}}\n",
            data.join(", ")
        )
    };
    let err = until("the configmap policy to deny", || {
        let (ok, _, err) = apply(&map("big", "checked: \"yes\"", 3));
        (!ok).then_some(err)
    });
    assert!(
        err.contains("Error from server (Forbidden)")
            && err.contains(
                "configmaps \"big\" is forbidden: ValidatingAdmissionPolicy 'few-keys' with \
                 binding 'few-keys' denied request: too many keys: 3"
            ),
        "{err}"
    );
    // A matchCondition that does not hold: not checked.
    let (ok, _, err) = apply(&map("unlabelled", "other: x", 3));
    assert!(ok, "{err}");

    // An expression's error: Ignore admits, Fail refuses.
    let erring = |policy: &str| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\n\
             metadata: {{name: erring}}\nspec:\n  failurePolicy: {policy}\n  matchConstraints:\n    \
             resourceRules: [{{apiGroups: [\"\"], apiVersions: [v1], operations: [CREATE], resources: [secrets]}}]\n  \
             validations: [{{expression: \"object.data.missing == 'x'\"}}]\n---\n\
             apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\n\
             metadata: {{name: erring}}\nspec: {{policyName: erring, validationActions: [Deny]}}\n"
        )
    };
    let secret = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: other}}\ndata: {{a: YQ==}}\n"
        )
    };
    let (ok, _, err) = apply(&erring("Ignore"));
    assert!(ok, "{err}");
    let (ok, _, err) = apply(&secret("admitted"));
    assert!(ok, "an erring policy under Ignore refused: {err}");
    let (ok, _, err) = apply(&erring("Fail"));
    assert!(ok, "{err}");
    let mut n = 0;
    let err = until("the erring policy under Fail to refuse", || {
        n += 1;
        let (ok, _, err) = apply(&secret(&format!("refused-{n}")));
        (!ok).then_some(err)
    });
    assert!(err.contains("resulted in error"), "{err}");
    // The secret's value never appears in the answer.
    assert!(!err.contains("YQ=="), "{err}");

    // What cannot work is refused when written.
    let bad = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: bad}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}]
  validations: [{expression: "object.spec.replicas <="}]
"#;
    let (ok, _, err) = apply(bad);
    assert!(!ok);
    assert!(
        err.contains("spec.validations[0].expression: Invalid value: \"object.spec.replicas <=\": compilation failed"),
        "{err}"
    );
    let no_rules = bad
        .replace("  matchConstraints:\n    resourceRules: [{apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}]\n", "")
        .replace("object.spec.replicas <=", "true");
    let (ok, _, err) = apply(&no_rules);
    assert!(!ok);
    assert!(
        err.contains("spec.matchConstraints: Required value"),
        "{err}"
    );
    let both = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\n\
                metadata: {name: both}\nspec: {policyName: few-keys, validationActions: [Deny, Warn]}\n";
    let (ok, _, err) = apply(both);
    assert!(!ok);
    assert!(err.contains("must not contain both Deny and Warn"), "{err}");

    // Deleting the binding lifts the policy.
    let (ok, _, err) = kubectl(
        &["delete", "validatingadmissionpolicybinding", "few-keys"],
        None,
    );
    assert!(ok, "{err}");
    until("the policy to be lifted", || {
        apply(&map("big", "checked: \"yes\"", 3)).0.then_some(())
    });

    // A policy that refuses everything cannot lock itself in: policies and bindings are
    // never checked by policies, so it can be removed.
    let lockout = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: lockout}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: ["*"], apiVersions: ["*"], operations: ["*"], resources: ["*"]}]
  validations: [{expression: "false", message: everything refused}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: lockout}
spec: {policyName: lockout, validationActions: [Deny]}
"#;
    let (ok, _, err) = apply(lockout);
    assert!(ok, "{err}");
    until("the lockout to refuse", || {
        let (ok, _, err) = apply(&map("locked", "a: b", 1));
        (!ok && err.contains("everything refused")).then_some(())
    });
    let (ok, _, err) = kubectl(
        &[
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            "lockout",
        ],
        None,
    );
    assert!(ok, "the lockout could not be removed: {err}");
    until("writes to be admitted again", || {
        apply(&map("locked", "a: b", 1)).0.then_some(())
    });
}
