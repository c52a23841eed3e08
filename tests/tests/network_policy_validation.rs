//! NetworkPolicy (networking.k8s.io/v1) as a served kind, driven with the real kubectl 1.32:
//! a full policy (selectors ANDed in one peer, an ipBlock with except, a named port, a port
//! range, egress) is applied, listed with kubectl's NAME/POD-SELECTOR/AGE columns and read
//! back with Kubernetes' defaults (TCP, policyTypes); applied again, it survives the
//! client-side apply patch with its empty selectors and empty label values intact. Invalid
//! policies are each refused with kube-apiserver's message and field path. The node agent's
//! identity may read policies (it enforces them) but not write them. `kubectl explain`
//! reads the schema.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use skiff_tests::cluster::Cluster;

const VALID: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: web-policy
  labels: {rev: "1"}
spec:
  podSelector:
    matchLabels: {app: web}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {team: frontend}
      podSelector:
        matchLabels: {role: client}
    - ipBlock:
        cidr: 10.0.0.0/16
        except: [10.0.1.0/24]
    ports:
    - port: http
    - port: 8000
      endPort: 8080
  egress:
  - to:
    - podSelector: {}
    - podSelector:
        matchLabels: {tier: ""}
    ports:
    - protocol: UDP
      port: 53
"#;

/// Every pod of the namespace, no rule: denies all ingress.
const DENY_ALL: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all}
spec:
  podSelector: {}
"#;

/// A policy whose spec is `spec` (YAML flow style).
fn policy(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {name}}}\n\
         spec: {spec}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_policies_are_defaulted_validated_and_listed() {
    let c = Cluster::start(1).await;
    let k = |args: &[&str], stdin: Option<&str>| {
        let (ok, out, err) = c.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}");
        out
    };

    k(&["apply", "-f", "-"], Some(VALID));
    k(&["apply", "-f", "-"], Some(DENY_ALL));

    // kubectl's columns, the selector as kubectl prints it.
    let table = k(&["get", "netpol"], None);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["NAME", "POD-SELECTOR", "AGE"], "{table}");
    assert_eq!(lines[1][..2], ["deny-all", "<none>"], "{table}");
    assert_eq!(lines[2][..2], ["web-policy", "app=web"], "{table}");
    assert_eq!(lines.len(), 3, "{table}");

    // Kubernetes' defaults: TCP for ports without a protocol, policyTypes from the rules;
    // the present empty selectors stay.
    let yaml = k(&["get", "networkpolicy", "web-policy", "-o", "yaml"], None);
    for want in [
        "  policyTypes:\n  - Ingress\n  - Egress\n",
        "    - port: http\n      protocol: TCP\n",
        "    - endPort: 8080\n      port: 8000\n      protocol: TCP\n",
        "    - port: 53\n      protocol: UDP\n",
        "    to:\n    - podSelector: {}\n",
        "    - ipBlock:\n        cidr: 10.0.0.0/16\n        except:\n        - 10.0.1.0/24\n",
    ] {
        assert!(yaml.contains(want), "missing {want:?} in\n{yaml}");
    }
    let yaml = k(&["get", "networkpolicy", "deny-all", "-o", "yaml"], None);
    assert!(
        yaml.contains("spec:\n  podSelector: {}\n  policyTypes:\n  - Ingress\n"),
        "{yaml}"
    );

    // Applied again with a change: kubectl patches (strategic merge) from the stored JSON,
    // which must keep `podSelector: {}` in the egress peer (or the peer would be empty) and
    // the label with an empty value (or the peer would select every pod).
    k(
        &["apply", "-f", "-"],
        Some(&VALID.replace("rev: \"1\"", "rev: \"2\"")),
    );
    let peer = k(
        &[
            "get",
            "netpol",
            "web-policy",
            "-o",
            "jsonpath={.metadata.labels.rev} {.spec.egress[0].to}",
        ],
        None,
    );
    assert_eq!(
        peer,
        r#"2 [{"podSelector":{}},{"podSelector":{"matchLabels":{"tier":""}}}]"#
    );

    // Refusals, each with kube-apiserver's message and the field's path.
    let refused = [
        (
            policy(
                "no-port",
                "{podSelector: {}, ingress: [{ports: [{endPort: 8080}]}]}",
            ),
            "The NetworkPolicy \"no-port\" is invalid: spec.ingress[0].ports[0].endPort: \
             Invalid value: 8080: may not be specified when `port` is not specified",
        ),
        (
            policy(
                "named-range",
                "{podSelector: {}, egress: [{ports: [{port: dns, endPort: 60}]}]}",
            ),
            "spec.egress[0].ports[0].endPort: Invalid value: 60: may not be specified when \
             `port` is non-numeric",
        ),
        (
            policy(
                "backwards",
                "{podSelector: {}, ingress: [{ports: [{port: 9000, endPort: 8000}]}]}",
            ),
            "spec.ingress[0].ports[0].endPort: Invalid value: 8000: must be greater than or \
             equal to `port`",
        ),
        (
            policy(
                "outside",
                "{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/16, \
                 except: [192.168.0.0/24]}}]}]}",
            ),
            "The NetworkPolicy \"outside\" is invalid: spec.ingress[0].from[0].ipBlock.except[0]: \
             Invalid value: \"192.168.0.0/24\": must be a strict subset of `cidr`",
        ),
        (
            policy(
                "not-a-cidr",
                "{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/33}}]}]}",
            ),
            "spec.egress[0].to[0].ipBlock.cidr: Invalid value: \"10.0.0.0/33\": must be a \
             valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
        ),
        (
            policy(
                "bad-operator",
                "{podSelector: {matchExpressions: [{key: app, operator: Equals, \
                 values: [web]}]}}",
            ),
            "spec.podSelector.matchExpressions[0].operator: Invalid value: \"Equals\": not a \
             valid selector operator",
        ),
        (
            policy(
                "bad-value",
                "{podSelector: {}, ingress: [{from: [{namespaceSelector: \
                 {matchLabels: {team: \"front end\"}}}]}]}",
            ),
            "spec.ingress[0].from[0].namespaceSelector.matchLabels: Invalid value: \
             \"front end\": a valid label must be an empty string or consist of alphanumeric \
             characters",
        ),
        (
            policy(
                "icmp",
                "{podSelector: {}, ingress: [{ports: [{protocol: ICMP, port: 80}]}]}",
            ),
            "spec.ingress[0].ports[0].protocol: Unsupported value: \"ICMP\": supported \
             values: \"TCP\", \"UDP\", \"SCTP\"",
        ),
        (
            policy(
                "both",
                "{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}, \
                 podSelector: {}}]}]}",
            ),
            "The NetworkPolicy \"both\" is invalid: spec.ingress[0].from[0]: Forbidden: may \
             not specify both ipBlock and another peer",
        ),
        (
            policy("nobody", "{podSelector: {}, ingress: [{from: [{}]}]}"),
            "spec.ingress[0].from[0]: Required value: must specify a peer",
        ),
        (
            policy("sideways", "{podSelector: {}, policyTypes: [Sideways]}"),
            "spec.policyTypes[0]: Unsupported value: \"Sideways\": supported values: \
             \"Ingress\", \"Egress\"",
        ),
        (
            policy(
                "big-port",
                "{podSelector: {}, ingress: [{ports: [{port: 70000}]}]}",
            ),
            "spec.ingress[0].ports[0].port: Invalid value: 70000: must be between 1 and \
             65535, inclusive",
        ),
    ];
    for (manifest, message) in &refused {
        let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(manifest));
        assert!(!ok, "accepted:\n{manifest}");
        assert!(err.contains(message), "want {message:?}, got:\n{err}");
    }
    // None of them was stored.
    let names = k(&["get", "netpol", "-o", "name"], None);
    assert_eq!(
        names,
        "networkpolicy.networking.k8s.io/deny-all\nnetworkpolicy.networking.k8s.io/web-policy\n"
    );

    // Kubernetes 1.32 reads ipBlocks with its lenient parser: host bits set are accepted.
    k(
        &["apply", "-f", "-"],
        Some(&policy(
            "host-bits",
            "{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.1/16, \
             except: [10.0.1.1/24]}}]}]}",
        )),
    );

    // The node agent (system:node:<name>) reads policies, to enforce them; it writes none.
    let dir = tempfile::tempdir().unwrap();
    let node = c.server.user_kubeconfig(
        dir.path(),
        &format!("system:node:{}", c.nodes[0].name),
        &["system:nodes"],
    );
    let o = c
        .server
        .kubectl_as(&node, &["get", "netpol", "-A", "-o", "name"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("networkpolicy.networking.k8s.io/web-policy")
    );
    let o = c
        .server
        .kubectl_as(&node, &["delete", "netpol", "web-policy"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains(&format!(
                "networkpolicies.networking.k8s.io \"web-policy\" is forbidden: User \
                 \"system:node:{}\" cannot delete resource \"networkpolicies\" in API group \
                 \"networking.k8s.io\"",
                c.nodes[0].name
            )),
        "{err}"
    );

    // The schema kubectl explain reads.
    let explain = k(&["explain", "networkpolicy.spec"], None);
    for want in [
        "KIND:",
        "NetworkPolicy",
        "podSelector",
        "policyTypes",
        "ingress",
        "egress",
    ] {
        assert!(explain.contains(want), "missing {want} in\n{explain}");
    }
    let explain = k(
        &["explain", "networkpolicy.spec.ingress.ports.endPort"],
        None,
    );
    assert!(explain.contains("FIELD: endPort <integer>"), "{explain}");
}
