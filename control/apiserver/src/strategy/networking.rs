//! NetworkPolicies (networking.k8s.io/v1): kube-apiserver's defaults (each port's protocol
//! TCP; `policyTypes` Ingress, plus Egress when there are egress rules) and its validation
//! (`ValidateNetworkPolicySpec` of Kubernetes 1.32), with the same field paths and messages,
//! so that a policy kube-apiserver refuses is refused here with the same words and one it
//! accepts is accepted. The spec may change freely; there is no status.

use skiff_api::api::{
    IpBlock, LabelSelector, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use skiff_cidr::Cidr;

use super::Strategy;
use crate::error::{FieldError, FieldErrorKind};
use crate::validation as v;

/// The protocols a policy port may name, in the order kube-apiserver lists them.
const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const INGRESS: &str = "Ingress";
const EGRESS: &str = "Egress";
const POLICY_TYPES: &[&str] = &[INGRESS, EGRESS];

/// kube-apiserver's message for a text that its CIDR parser does not read.
const NOT_A_CIDR: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";

impl Strategy for NetworkPolicy {
    fn default(&mut self) {
        let spec = self.spec.get_or_insert_with(NetworkPolicySpec::default);
        // The spec's podSelector is not optional in Kubernetes (an empty one selects every
        // pod of the namespace); written out so that reads show `podSelector: {}` as there.
        spec.pod_selector.get_or_insert_with(LabelSelector::default);
        let ports = spec
            .ingress
            .iter_mut()
            .flat_map(|r| r.ports.iter_mut())
            .chain(spec.egress.iter_mut().flat_map(|r| r.ports.iter_mut()));
        for port in ports {
            // Only an absent protocol: an empty one is the client's and refused below.
            port.protocol.get_or_insert_with(|| "TCP".into());
        }
        // A policy that names no direction isolates ingress, and egress too when it has
        // egress rules: the node agents read policyTypes only, never guess.
        if spec.policy_types.is_empty() {
            spec.policy_types.push(INGRESS.into());
            if !spec.egress.is_empty() {
                spec.policy_types.push(EGRESS.into());
            }
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let default = NetworkPolicySpec::default();
        let spec = self.spec.as_ref().unwrap_or(&default);
        if let Some(sel) = &spec.pod_selector {
            v::check_label_selector(&mut out, "spec.podSelector", sel);
        }
        for (i, rule) in spec.ingress.iter().enumerate() {
            let path = format!("spec.ingress[{i}]");
            for (j, port) in rule.ports.iter().enumerate() {
                check_port(&mut out, &format!("{path}.ports[{j}]"), port);
            }
            for (j, peer) in rule.from.iter().enumerate() {
                check_peer(&mut out, &format!("{path}.from[{j}]"), peer);
            }
        }
        for (i, rule) in spec.egress.iter().enumerate() {
            let path = format!("spec.egress[{i}]");
            for (j, port) in rule.ports.iter().enumerate() {
                check_port(&mut out, &format!("{path}.ports[{j}]"), port);
            }
            for (j, peer) in rule.to.iter().enumerate() {
                check_peer(&mut out, &format!("{path}.to[{j}]"), peer);
            }
        }
        check_policy_types(&mut out, &spec.policy_types);
        out
    }
}

/// A port: a known protocol; a number in 1-65535 or an IANA service name; `endPort` only
/// after a numeric port, not below it, itself a port number.
fn check_port(out: &mut Vec<FieldError>, path: &str, port: &NetworkPolicyPort) {
    if let Some(p) = &port.protocol
        && !PROTOCOLS.contains(&p.as_str())
    {
        out.push(FieldError::not_supported(
            format!("{path}.protocol"),
            p,
            PROTOCOLS,
        ));
    }
    let end_path = format!("{path}.endPort");
    match (&port.port, port.end_port) {
        (None, Some(end)) => out.push(FieldError::invalid(
            end_path,
            end,
            "may not be specified when `port` is not specified",
        )),
        (None, None) => {}
        // The IntOrString arrives as text: a number is a port number, anything else a name
        // (kube-apiserver's int32 branch and string branch).
        (Some(p), end) => match p.parse::<i64>() {
            Ok(n) => {
                v::check_port_number(out, &format!("{path}.port"), n);
                if let Some(end) = end {
                    if i64::from(end) < n {
                        out.push(FieldError::invalid(
                            end_path.clone(),
                            end,
                            "must be greater than or equal to `port`",
                        ));
                    }
                    v::check_port_number(out, &end_path, end.into());
                }
            }
            Err(_) => {
                if let Some(end) = end {
                    out.push(FieldError::invalid(
                        end_path,
                        end,
                        "may not be specified when `port` is non-numeric",
                    ));
                }
                v::check_port_name(out, &format!("{path}.port"), p);
            }
        },
    }
}

/// A peer: at least one of podSelector, namespaceSelector, ipBlock, each well formed, and
/// an ipBlock alone (the two selectors together mean pods of those namespaces).
fn check_peer(out: &mut Vec<FieldError>, path: &str, peer: &NetworkPolicyPeer) {
    let mut kinds = 0;
    if let Some(sel) = &peer.pod_selector {
        kinds += 1;
        v::check_label_selector(out, &format!("{path}.podSelector"), sel);
    }
    if let Some(sel) = &peer.namespace_selector {
        kinds += 1;
        v::check_label_selector(out, &format!("{path}.namespaceSelector"), sel);
    }
    if let Some(block) = &peer.ip_block {
        kinds += 1;
        check_ip_block(out, &format!("{path}.ipBlock"), block);
    }
    if kinds == 0 {
        out.push(FieldError::required(path, "must specify a peer"));
    } else if kinds > 1 && peer.ip_block.is_some() {
        out.push(FieldError::forbidden(
            path,
            "may not specify both ipBlock and another peer",
        ));
    }
}

/// An ipBlock: `cidr` required and a CIDR; every `except` a CIDR strictly inside it.
/// Kubernetes 1.32 reads these with its sloppy parser, so a CIDR with host bits set
/// (`10.0.0.1/24`) is accepted as its network, and so it is here.
fn check_ip_block(out: &mut Vec<FieldError>, path: &str, block: &IpBlock) {
    let cidr_path = format!("{path}.cidr");
    if block.cidr.is_empty() {
        out.push(FieldError::required(cidr_path, ""));
        return;
    }
    let Ok(cidr) = Cidr::parse_lenient(&block.cidr) else {
        out.push(FieldError::invalid(cidr_path, &block.cidr, NOT_A_CIDR));
        return;
    };
    for (i, except) in block.except.iter().enumerate() {
        let except_path = format!("{path}.except[{i}]");
        match Cidr::parse_lenient(except) {
            Err(_) => out.push(FieldError::invalid(except_path, except, NOT_A_CIDR)),
            Ok(inner) if !cidr.strictly_contains(&inner) => out.push(FieldError::invalid(
                except_path,
                except,
                "must be a strict subset of `cidr`",
            )),
            Ok(_) => {}
        }
    }
}

/// At most two policyTypes (then nothing else is said about them), each Ingress or Egress.
fn check_policy_types(out: &mut Vec<FieldError>, types: &[String]) {
    if types.len() > POLICY_TYPES.len() {
        // kube-apiserver prints the whole list as Go's %#v of its internal type.
        let list: Vec<String> = types.iter().map(|t| format!("{t:?}")).collect();
        out.push(FieldError {
            path: "spec.policyTypes".into(),
            kind: FieldErrorKind::Invalid,
            value: Some(format!("[]networking.PolicyType{{{}}}", list.join(", "))),
            detail: "may not specify more than two policyTypes".into(),
        });
        return;
    }
    for (i, t) in types.iter().enumerate() {
        if !POLICY_TYPES.contains(&t.as_str()) {
            out.push(FieldError::not_supported(
                format!("spec.policyTypes[{i}]"),
                t,
                POLICY_TYPES,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A policy from its spec's JSON, defaulted as the registry does before validating.
    fn policy(spec: serde_json::Value) -> NetworkPolicy {
        let mut p: NetworkPolicy = serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": spec,
        }))
        .expect("a NetworkPolicy");
        Strategy::default(&mut p);
        p
    }

    fn errors(spec: serde_json::Value) -> Vec<String> {
        policy(spec)
            .validate()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The one error `spec` has.
    fn refusal(spec: serde_json::Value) -> String {
        let errs = errors(spec);
        assert_eq!(errs.len(), 1, "{errs:#?}");
        errs[0].clone()
    }

    fn from(peer: serde_json::Value) -> serde_json::Value {
        json!({"podSelector": {}, "ingress": [{"from": [peer]}]})
    }

    fn port(p: serde_json::Value) -> serde_json::Value {
        json!({"podSelector": {}, "ingress": [{"ports": [p]}]})
    }

    #[test]
    fn a_full_policy_is_accepted_and_defaulted() {
        let p = policy(json!({
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{
                "from": [
                    {"namespaceSelector": {"matchLabels": {"team": "a"}},
                     "podSelector": {"matchExpressions": [
                         {"key": "role", "operator": "In", "values": ["client"]}]}},
                    {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}},
                    {"podSelector": {}},
                ],
                "ports": [{"port": "http"}, {"protocol": "UDP", "port": 5000, "endPort": 5010}],
            }],
            "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"protocol": "SCTP"}]}],
        }));
        assert!(p.validate().is_empty(), "{:?}", p.validate());
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.policy_types, ["Ingress", "Egress"]);
        let ports = &spec.ingress[0].ports;
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(ports[1].protocol.as_deref(), Some("UDP"));
        assert_eq!(spec.egress[0].ports[0].protocol.as_deref(), Some("SCTP"));
    }

    #[test]
    fn defaults() {
        // No spec at all: every pod of the namespace, ingress isolated.
        let p = policy(json!(null));
        assert!(p.validate().is_empty());
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.policy_types, ["Ingress"]);
        assert_eq!(spec.pod_selector, Some(LabelSelector::default()));
        // Egress rules (even one empty rule) add Egress.
        let p = policy(json!({"egress": [{}]}));
        assert_eq!(p.spec.unwrap().policy_types, ["Ingress", "Egress"]);
        // Given types are kept as they are.
        let p = policy(json!({"egress": [{}], "policyTypes": ["Egress"]}));
        assert_eq!(p.spec.unwrap().policy_types, ["Egress"]);
        // A port without protocol becomes TCP, in both directions.
        let p = policy(json!({"ingress": [{"ports": [{"port": 80}]}],
                              "egress": [{"ports": [{}]}]}));
        let spec = p.spec.unwrap();
        assert_eq!(spec.ingress[0].ports[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(spec.egress[0].ports[0].protocol.as_deref(), Some("TCP"));
        // Defaulting twice changes nothing (it runs on every write).
        let mut again = policy(json!({"egress": [{}]}));
        let before = again.clone();
        Strategy::default(&mut again);
        assert_eq!(again, before);
    }

    #[test]
    fn pod_selector_is_checked_as_kubernetes_does() {
        assert_eq!(
            refusal(json!({"podSelector": {"matchExpressions": [
                {"key": "app", "operator": "Equals", "values": ["web"]}]}})),
            "spec.podSelector.matchExpressions[0].operator: Invalid value: \"Equals\": \
             not a valid selector operator"
        );
        assert!(
            refusal(json!({"podSelector": {"matchLabels": {"app": "web app"}}})).starts_with(
                "spec.podSelector.matchLabels: Invalid value: \"web app\": a valid label \
                     must be an empty string"
            )
        );
        assert_eq!(
            refusal(json!({"podSelector": {"matchExpressions": [
                {"key": "app", "operator": "In"}]}})),
            "spec.podSelector.matchExpressions[0].values: Required value: must be specified \
             when `operator` is 'In' or 'NotIn'"
        );
        assert!(
            refusal(json!({"podSelector": {"matchExpressions": [
                {"key": "app", "operator": "NotIn", "values": ["-x"]}]}}))
            .starts_with("spec.podSelector.matchExpressions[0].values[0]: Invalid value: \"-x\"")
        );
        assert!(
            errors(json!({"podSelector": {"matchExpressions": [
            {"key": "app", "operator": "Exists"}]}}))
            .is_empty()
        );
    }

    #[test]
    fn protocols() {
        assert_eq!(
            refusal(port(json!({"protocol": "ICMP"}))),
            "spec.ingress[0].ports[0].protocol: Unsupported value: \"ICMP\": supported values: \
             \"TCP\", \"UDP\", \"SCTP\""
        );
        // An explicit empty protocol is the client's, not defaulted.
        assert!(
            refusal(port(json!({"protocol": ""})))
                .starts_with("spec.ingress[0].ports[0].protocol: Unsupported value: \"\"")
        );
        // Protocols are case-sensitive, as in Kubernetes.
        assert!(refusal(port(json!({"protocol": "tcp"}))).contains("Unsupported value: \"tcp\""));
        for ok in ["TCP", "UDP", "SCTP"] {
            assert!(errors(port(json!({"protocol": ok}))).is_empty(), "{ok}");
        }
        assert_eq!(
            refusal(json!({"egress": [{"ports": [{"protocol": "ICMP"}]}]})),
            "spec.egress[0].ports[0].protocol: Unsupported value: \"ICMP\": supported values: \
             \"TCP\", \"UDP\", \"SCTP\""
        );
    }

    #[test]
    fn port_numbers_and_names() {
        for bad in [0, 65536, -1] {
            assert_eq!(
                refusal(port(json!({"port": bad}))),
                format!(
                    "spec.ingress[0].ports[0].port: Invalid value: {bad}: must be between 1 and \
                     65535, inclusive"
                )
            );
        }
        for ok in [json!(1), json!(65535), json!("http"), json!("web-8080")] {
            assert!(errors(port(json!({"port": ok}))).is_empty(), "{ok}");
        }
        assert_eq!(
            refusal(port(json!({"port": "HTTP"}))),
            "spec.ingress[0].ports[0].port: Invalid value: \"HTTP\": must contain only \
             alpha-numeric characters (a-z, 0-9), and hyphens (-)"
        );
        assert_eq!(
            refusal(port(json!({"port": "a-very-long-port-name"}))),
            "spec.ingress[0].ports[0].port: Invalid value: \"a-very-long-port-name\": must be \
             no more than 15 characters"
        );
        assert_eq!(
            errors(port(json!({"port": "-web--"}))),
            [
                "spec.ingress[0].ports[0].port: Invalid value: \"-web--\": must not contain \
                 consecutive hyphens",
                "spec.ingress[0].ports[0].port: Invalid value: \"-web--\": must not begin or \
                 end with a hyphen",
            ]
        );
    }

    #[test]
    fn end_ports() {
        assert!(errors(port(json!({"port": 8000, "endPort": 8000}))).is_empty());
        assert!(errors(port(json!({"port": 8000, "endPort": 9000}))).is_empty());
        assert_eq!(
            refusal(port(json!({"endPort": 9000}))),
            "spec.ingress[0].ports[0].endPort: Invalid value: 9000: may not be specified when \
             `port` is not specified"
        );
        assert_eq!(
            refusal(port(json!({"port": "http", "endPort": 9000}))),
            "spec.ingress[0].ports[0].endPort: Invalid value: 9000: may not be specified when \
             `port` is non-numeric"
        );
        assert_eq!(
            refusal(port(json!({"port": 9000, "endPort": 8000}))),
            "spec.ingress[0].ports[0].endPort: Invalid value: 8000: must be greater than or \
             equal to `port`"
        );
        assert_eq!(
            refusal(port(json!({"port": 9000, "endPort": 70000}))),
            "spec.ingress[0].ports[0].endPort: Invalid value: 70000: must be between 1 and \
             65535, inclusive"
        );
        // Both rules at once, as kube-apiserver reports them.
        assert_eq!(
            errors(port(json!({"port": 9000, "endPort": 0}))),
            [
                "spec.ingress[0].ports[0].endPort: Invalid value: 0: must be greater than or \
                 equal to `port`",
                "spec.ingress[0].ports[0].endPort: Invalid value: 0: must be between 1 and \
                 65535, inclusive",
            ]
        );
    }

    #[test]
    fn peers() {
        assert_eq!(
            refusal(from(json!({}))),
            "spec.ingress[0].from[0]: Required value: must specify a peer"
        );
        assert_eq!(
            refusal(from(
                json!({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}})
            )),
            "spec.ingress[0].from[0]: Forbidden: may not specify both ipBlock and another peer"
        );
        assert_eq!(
            refusal(json!({"egress": [{"to": [
                {"podSelector": {}},
                {"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}},
            ]}]})),
            "spec.egress[0].to[1]: Forbidden: may not specify both ipBlock and another peer"
        );
        // Both selectors in one peer is the AND of them: allowed.
        assert!(errors(from(json!({"podSelector": {}, "namespaceSelector": {}}))).is_empty());
        assert!(
            errors(from(
                json!({"namespaceSelector": {"matchLabels": {"a": "b"}}})
            ))
            .is_empty()
        );
        assert_eq!(
            refusal(from(json!({"namespaceSelector": {"matchExpressions": [
                {"key": "team", "operator": "Exists", "values": ["a"]}]}}))),
            "spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].values: Forbidden: \
             may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
        );
        // An empty rule (no ports, no peers) allows everything: valid.
        assert!(errors(json!({"ingress": [{}], "egress": [{}]})).is_empty());
    }

    #[test]
    fn ip_blocks() {
        let block = |b: serde_json::Value| from(json!({"ipBlock": b}));
        assert_eq!(
            refusal(block(json!({"except": ["10.0.0.0/24"]}))),
            "spec.ingress[0].from[0].ipBlock.cidr: Required value"
        );
        assert_eq!(
            refusal(block(json!({"cidr": "10.0.0.0/33"}))),
            "spec.ingress[0].from[0].ipBlock.cidr: Invalid value: \"10.0.0.0/33\": must be a \
             valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
        );
        assert_eq!(
            refusal(block(json!({"cidr": "10.0.0.0"}))),
            "spec.ingress[0].from[0].ipBlock.cidr: Invalid value: \"10.0.0.0\": must be a \
             valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
        );
        assert_eq!(
            refusal(block(
                json!({"cidr": "10.0.0.0/16", "except": ["192.168.0.0/24"]})
            )),
            "spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"192.168.0.0/24\": \
             must be a strict subset of `cidr`"
        );
        // Equal is not a strict subset; larger neither.
        assert_eq!(
            errors(block(json!({"cidr": "10.0.0.0/16",
                                "except": ["10.0.0.0/16", "10.0.0.0/8", "10.0.3.0/24"]}))),
            [
                "spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"10.0.0.0/16\": \
                 must be a strict subset of `cidr`",
                "spec.ingress[0].from[0].ipBlock.except[1]: Invalid value: \"10.0.0.0/8\": \
                 must be a strict subset of `cidr`",
            ]
        );
        assert_eq!(
            refusal(block(
                json!({"cidr": "10.0.0.0/16", "except": ["10.0.1.0"]})
            )),
            "spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"10.0.1.0\": must be a \
             valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
        );
        // Another family is outside.
        assert!(
            refusal(block(
                json!({"cidr": "10.0.0.0/8", "except": ["fd00::/64"]})
            ))
            .ends_with("must be a strict subset of `cidr`")
        );
        // Kubernetes 1.32 reads ipBlocks sloppily: host bits set and leading zeros are
        // accepted, as their networks.
        assert!(
            errors(block(
                json!({"cidr": "10.0.0.1/16", "except": ["10.0.1.7/24"]})
            ))
            .is_empty()
        );
        assert!(errors(block(json!({"cidr": "010.0.0.0/8"}))).is_empty());
        assert!(
            errors(block(
                json!({"cidr": "fd00::/48", "except": ["fd00:0:0:1::/64"]})
            ))
            .is_empty()
        );
        assert!(
            errors(block(
                json!({"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]})
            ))
            .is_empty()
        );
    }

    #[test]
    fn policy_types() {
        assert!(errors(json!({"policyTypes": ["Ingress", "Egress"]})).is_empty());
        assert!(errors(json!({"policyTypes": ["Egress"]})).is_empty());
        assert_eq!(
            refusal(json!({"policyTypes": ["Ingress", "Sideways"]})),
            "spec.policyTypes[1]: Unsupported value: \"Sideways\": supported values: \
             \"Ingress\", \"Egress\""
        );
        assert_eq!(
            refusal(json!({"policyTypes": ["Ingress", "Egress", "Ingress"]})),
            "spec.policyTypes: Invalid value: []networking.PolicyType{\"Ingress\", \"Egress\", \
             \"Ingress\"}: may not specify more than two policyTypes"
        );
        // Case matters.
        assert!(refusal(json!({"policyTypes": ["ingress"]})).contains("\"ingress\""));
    }

    #[test]
    fn every_error_is_reported_with_its_path() {
        let errs = errors(json!({
            "podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]},
            "ingress": [{"ports": [{"protocol": "ICMP", "endPort": 1}],
                         "from": [{}, {"ipBlock": {"cidr": "bad"}}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}]}],
            "policyTypes": ["Both"],
        }));
        let paths: Vec<&str> = errs
            .iter()
            .map(|e| e.split(':').next().unwrap_or_default())
            .collect();
        assert_eq!(
            paths,
            [
                "spec.podSelector.matchExpressions[0].operator",
                "spec.ingress[0].ports[0].protocol",
                "spec.ingress[0].ports[0].endPort",
                "spec.ingress[0].from[0]",
                "spec.ingress[0].from[1].ipBlock.cidr",
                "spec.egress[0].to[0].ipBlock.except[0]",
                "spec.policyTypes[0]",
            ]
        );
    }
}
