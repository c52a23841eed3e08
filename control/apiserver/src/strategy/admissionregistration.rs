//! admissionregistration.k8s.io/v1: ValidatingWebhookConfiguration and
//! MutatingWebhookConfiguration, defaulted and validated as kube-apiserver does
//! (pkg/apis/admissionregistration/validation), with its messages: fully qualified, unique
//! webhook names; exactly one of `url` (https, no query, fragment or user) or `service`;
//! rules with their wildcard exclusions; `sideEffects` None or NoneOnDryRun; timeouts of 1 to
//! 30 seconds; `admissionReviewVersions` including v1 or v1beta1; matchConditions that
//! compile as CEL over `object`, `oldObject` and `request`.
//!
//! Both kinds' webhooks are read through one view, [`Webhook`], which the admission plug-ins
//! (`crate::admission`) use too.
//!
//! ValidatingAdmissionPolicy and its binding are checked as kube-apiserver does too: a policy
//! needs matchConstraints with resourceRules, and validations or auditAnnotations whose
//! expressions (and messageExpressions, variables, matchConditions) compile as CEL over
//! [`POLICY_VARS`]; a binding names its policy and its validationActions (Deny, Warn, Audit;
//! never Deny with Warn).

use skiff_api::api::{
    LabelSelector, MatchCondition, MatchResources, MutatingWebhook, MutatingWebhookConfiguration,
    NamedRuleWithOperations, RuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingWebhook, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};

use super::Strategy;
use crate::error::FieldError;
use crate::validation as v;

/// The variables a matchCondition may use.
pub const MATCH_CONDITION_VARS: &[&str] = &["object", "oldObject", "request"];
/// The variables a ValidatingAdmissionPolicy's expressions may use (`authorizer` is not
/// offered).
pub const POLICY_VARS: &[&str] = &[
    "object",
    "oldObject",
    "request",
    "params",
    "namespaceObject",
    "variables",
];
/// At most this many matchConditions per webhook.
const MAX_MATCH_CONDITIONS: usize = 64;

/// A webhook of either kind, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Webhook<'a> {
    pub name: &'a str,
    pub client_config: Option<&'a WebhookClientConfig>,
    pub rules: &'a [RuleWithOperations],
    pub failure_policy: Option<&'a str>,
    pub match_policy: Option<&'a str>,
    pub namespace_selector: Option<&'a LabelSelector>,
    pub object_selector: Option<&'a LabelSelector>,
    pub side_effects: Option<&'a str>,
    pub timeout_seconds: Option<i32>,
    pub admission_review_versions: &'a [String],
    pub match_conditions: &'a [MatchCondition],
    /// `None` for validating webhooks.
    pub reinvocation_policy: Option<&'a str>,
}

/// What both webhook types offer.
pub trait WebhookFields {
    /// This webhook through the common view.
    fn view(&self) -> Webhook<'_>;
    /// kube-apiserver's defaults (SetDefaults_*Webhook and SetDefaults_Rule).
    fn set_defaults(&mut self);
}

/// The fields both webhook types have, read and defaulted in one place.
macro_rules! webhook_fields {
    ($ty:ty $(, $reinvocation:ident)?) => {
        impl WebhookFields for $ty {
            fn view(&self) -> Webhook<'_> {
                let reinvocation_policy = None$(.or(self.$reinvocation.as_deref()))?;
                Webhook {
                    name: &self.name,
                    client_config: self.client_config.as_ref(),
                    rules: &self.rules,
                    failure_policy: self.failure_policy.as_deref(),
                    match_policy: self.match_policy.as_deref(),
                    namespace_selector: self.namespace_selector.as_ref(),
                    object_selector: self.object_selector.as_ref(),
                    side_effects: self.side_effects.as_deref(),
                    timeout_seconds: self.timeout_seconds,
                    admission_review_versions: &self.admission_review_versions,
                    match_conditions: &self.match_conditions,
                    reinvocation_policy,
                }
            }

            fn set_defaults(&mut self) {
                self.failure_policy.get_or_insert_with(|| "Fail".into());
                self.match_policy.get_or_insert_with(|| "Equivalent".into());
                self.namespace_selector.get_or_insert_with(Default::default);
                self.object_selector.get_or_insert_with(Default::default);
                self.timeout_seconds.get_or_insert(10);
                for r in &mut self.rules {
                    r.scope.get_or_insert_with(|| "*".into());
                }
                $(self.$reinvocation.get_or_insert_with(|| "Never".into());)?
            }
        }
    };
}

webhook_fields!(ValidatingWebhook);
webhook_fields!(MutatingWebhook, reinvocation_policy);

impl Strategy for ValidatingWebhookConfiguration {
    fn default(&mut self) {
        self.webhooks
            .iter_mut()
            .for_each(ValidatingWebhook::set_defaults);
    }

    fn validate(&self) -> Vec<FieldError> {
        check_webhooks(self.webhooks.iter().map(ValidatingWebhook::view))
    }
}

impl Strategy for MutatingWebhookConfiguration {
    fn default(&mut self) {
        self.webhooks
            .iter_mut()
            .for_each(MutatingWebhook::set_defaults);
    }

    fn validate(&self) -> Vec<FieldError> {
        check_webhooks(self.webhooks.iter().map(MutatingWebhook::view))
    }
}

/// Go's `%#v` of a `[]string`, the value Kubernetes shows for a bad list.
struct GoStrings<'a>(&'a [String]);

impl std::fmt::Debug for GoStrings<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let items: Vec<String> = self.0.iter().map(|s| format!("{s:?}")).collect();
        write!(f, "[]string{{{}}}", items.join(", "))
    }
}

fn check_webhooks<'a>(hooks: impl Iterator<Item = Webhook<'a>>) -> Vec<FieldError> {
    let mut out = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (i, hook) in hooks.enumerate() {
        let p = format!("webhooks[{i}]");
        check_webhook(&mut out, &hook, &p);
        if !names.insert(hook.name) {
            out.push(FieldError::duplicate(format!("{p}.name"), hook.name));
        }
    }
    out
}

fn check_webhook(out: &mut Vec<FieldError>, hook: &Webhook<'_>, p: &str) {
    check_fully_qualified(out, &format!("{p}.name"), hook.name);
    for (i, rule) in hook.rules.iter().enumerate() {
        check_rule(out, rule, &format!("{p}.rules[{i}]"));
    }
    let one_of = |out: &mut Vec<FieldError>, field: &str, value: Option<&str>, allowed: &[&str]| {
        if let Some(value) = value
            && !allowed.contains(&value)
        {
            out.push(FieldError::not_supported(
                format!("{p}.{field}"),
                value,
                allowed,
            ));
        }
    };
    one_of(
        out,
        "failurePolicy",
        hook.failure_policy,
        &["Fail", "Ignore"],
    );
    one_of(
        out,
        "matchPolicy",
        hook.match_policy,
        &["Equivalent", "Exact"],
    );
    one_of(
        out,
        "reinvocationPolicy",
        hook.reinvocation_policy,
        &["IfNeeded", "Never"],
    );
    match hook.side_effects {
        None => out.push(FieldError::required(
            format!("{p}.sideEffects"),
            "must specify one of None, NoneOnDryRun",
        )),
        side_effects => one_of(out, "sideEffects", side_effects, &["None", "NoneOnDryRun"]),
    }
    if let Some(t) = hook.timeout_seconds
        && !(1..=30).contains(&t)
    {
        out.push(FieldError::invalid(
            format!("{p}.timeoutSeconds"),
            t,
            "the timeout value must be between 1 and 30 seconds",
        ));
    }
    if let Some(sel) = hook.namespace_selector {
        v::check_label_selector(out, &format!("{p}.namespaceSelector"), sel);
    }
    if let Some(sel) = hook.object_selector {
        v::check_label_selector(out, &format!("{p}.objectSelector"), sel);
    }
    check_review_versions(out, hook.admission_review_versions, p);
    match hook.client_config {
        Some(cc) => check_client_config(out, cc, &format!("{p}.clientConfig")),
        None => out.push(FieldError::required(
            format!("{p}.clientConfig"),
            "exactly one of url or service is required",
        )),
    }
    check_match_conditions(
        out,
        hook.match_conditions,
        &format!("{p}.matchConditions"),
        MATCH_CONDITION_VARS,
    );
}

/// IsFullyQualifiedName: a DNS subdomain of at least three labels.
fn check_fully_qualified(out: &mut Vec<FieldError>, path: &str, name: &str) {
    if name.is_empty() {
        out.push(FieldError::required(path, ""));
        return;
    }
    let errs = skiff_api::names::dns1123_subdomain(name);
    if !errs.is_empty() {
        out.push(FieldError::invalid(path, name, errs.join(",")));
    } else if name.split('.').count() < 3 {
        out.push(FieldError::invalid(
            path,
            name,
            "should be a domain with at least three segments separated by dots",
        ));
    }
}

fn check_review_versions(out: &mut Vec<FieldError>, versions: &[String], p: &str) {
    let path = format!("{p}.admissionReviewVersions");
    if versions.is_empty() {
        out.push(FieldError::required(
            path,
            "must specify one of v1, v1beta1",
        ));
        return;
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, version) in versions.iter().enumerate() {
        for e in skiff_api::names::dns1035_label(version) {
            out.push(FieldError::invalid(format!("{path}[{i}]"), version, e));
        }
        if !seen.insert(version) {
            out.push(FieldError::invalid(
                format!("{path}[{i}]"),
                version,
                "duplicate version",
            ));
        }
    }
    if !versions.iter().any(|v| v == "v1" || v == "v1beta1") {
        out.push(FieldError::invalid(
            path,
            GoStrings(versions),
            "must include at least one of v1, v1beta1",
        ));
    }
}

fn check_rule(out: &mut Vec<FieldError>, rule: &RuleWithOperations, p: &str) {
    let wild = |l: &[String]| l.len() > 1 && l.iter().any(|s| s == "*");
    if rule.operations.is_empty() {
        out.push(FieldError::required(format!("{p}.operations"), ""));
    }
    if wild(&rule.operations) {
        out.push(FieldError::invalid(
            format!("{p}.operations"),
            GoStrings(&rule.operations),
            "if '*' is present, must not specify other operations",
        ));
    }
    for (i, op) in rule.operations.iter().enumerate() {
        const OPERATIONS: &[&str] = &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
        if !OPERATIONS.contains(&op.as_str()) {
            out.push(FieldError::not_supported(
                format!("{p}.operations[{i}]"),
                op,
                OPERATIONS,
            ));
        }
    }
    if rule.api_groups.is_empty() {
        out.push(FieldError::required(format!("{p}.apiGroups"), ""));
    }
    if wild(&rule.api_groups) {
        out.push(FieldError::invalid(
            format!("{p}.apiGroups"),
            GoStrings(&rule.api_groups),
            "if '*' is present, must not specify other API groups",
        ));
    }
    if rule.api_versions.is_empty() {
        out.push(FieldError::required(format!("{p}.apiVersions"), ""));
    }
    if wild(&rule.api_versions) {
        out.push(FieldError::invalid(
            format!("{p}.apiVersions"),
            GoStrings(&rule.api_versions),
            "if '*' is present, must not specify other API versions",
        ));
    }
    for (i, version) in rule.api_versions.iter().enumerate() {
        if version.is_empty() {
            out.push(FieldError::required(format!("{p}.apiVersions[{i}]"), ""));
        }
    }
    check_resources(out, &rule.resources, &format!("{p}.resources"));
    if let Some(scope) = rule.scope.as_deref() {
        const SCOPES: &[&str] = &["*", "Cluster", "Namespaced"];
        if !SCOPES.contains(&scope) {
            out.push(FieldError::not_supported(
                format!("{p}.scope"),
                scope,
                SCOPES,
            ));
        }
    }
}

/// validateResources: `x`, `x/y`, `x/*`, `*/y`, `*`, `*/*` without overlaps.
fn check_resources(out: &mut Vec<FieldError>, resources: &[String], path: &str) {
    if resources.is_empty() {
        out.push(FieldError::required(path, ""));
    }
    let mut wildcard_subresources = std::collections::BTreeSet::new();
    let mut wildcard_resources = std::collections::BTreeSet::new();
    let (mut double, mut single, mut plain) = (false, false, false);
    for (i, rs) in resources.iter().enumerate() {
        if rs.is_empty() {
            out.push(FieldError::required(format!("{path}[{i}]"), ""));
            continue;
        }
        double |= rs == "*/*";
        single |= rs == "*";
        let Some((res, sub)) = rs.split_once('/') else {
            plain = rs != "*";
            continue;
        };
        if wildcard_subresources.contains(res) {
            out.push(FieldError::invalid(
                format!("{path}[{i}]"),
                rs,
                format!("if '{res}/*' is present, must not specify {rs}"),
            ));
        }
        if wildcard_resources.contains(sub) {
            out.push(FieldError::invalid(
                format!("{path}[{i}]"),
                rs,
                format!("if '*/{sub}' is present, must not specify {rs}"),
            ));
        }
        if sub == "*" {
            wildcard_subresources.insert(res);
        }
        if res == "*" {
            wildcard_resources.insert(sub);
        }
    }
    if resources.len() > 1 && double {
        out.push(FieldError::invalid(
            path,
            GoStrings(resources),
            "if '*/*' is present, must not specify other resources",
        ));
    }
    if single && plain {
        out.push(FieldError::invalid(
            path,
            GoStrings(resources),
            "if '*' is present, must not specify other resources without subresources",
        ));
    }
}

/// ValidateWebhookURL / ValidateWebhookService: exactly one of an https URL (no user, query
/// or fragment) and a Service reference (name, namespace, a valid port, an absolute path).
pub(crate) fn check_client_config(out: &mut Vec<FieldError>, cc: &WebhookClientConfig, p: &str) {
    const FORM: &str = "; desired format: https://host[/path]";
    match (&cc.url, &cc.service) {
        (Some(_), Some(_)) | (None, None) => out.push(FieldError::required(
            p,
            "exactly one of url or service is required",
        )),
        (Some(url), None) => {
            let path = format!("{p}.url");
            match url::Url::parse(url) {
                Err(e) => out.push(FieldError::required(
                    path,
                    format!("url must be a valid URL: {e}{FORM}"),
                )),
                Ok(u) => {
                    if u.scheme() != "https" {
                        out.push(FieldError::invalid(
                            &path,
                            u.scheme(),
                            format!("'https' is the only allowed URL scheme{FORM}"),
                        ));
                    }
                    if u.host_str().is_none_or(str::is_empty) {
                        out.push(FieldError::invalid(
                            &path,
                            "",
                            format!("host must be specified{FORM}"),
                        ));
                    }
                    if !u.username().is_empty() || u.password().is_some() {
                        out.push(FieldError::invalid(
                            &path,
                            u.username(),
                            "user information is not permitted in the URL",
                        ));
                    }
                    if let Some(f) = u.fragment() {
                        out.push(FieldError::invalid(
                            &path,
                            f,
                            "fragments are not permitted in the URL",
                        ));
                    }
                    if let Some(q) = u.query() {
                        out.push(FieldError::invalid(
                            &path,
                            q,
                            "query parameters are not permitted in the URL",
                        ));
                    }
                }
            }
        }
        (None, Some(svc)) => {
            let sp = format!("{p}.service");
            if svc.name.is_empty() {
                out.push(FieldError::required(
                    format!("{sp}.name"),
                    "service name is required",
                ));
            }
            if svc.namespace.is_empty() {
                out.push(FieldError::required(
                    format!("{sp}.namespace"),
                    "service namespace is required",
                ));
            }
            if let Some(port) = svc.port
                && !(1..=65535).contains(&port)
            {
                out.push(FieldError::invalid(
                    format!("{sp}.port"),
                    port,
                    "port is not valid: must be between 1 and 65535, inclusive",
                ));
            }
            if let Some(path) = svc.path.as_deref()
                && !path.is_empty()
            {
                if !path.starts_with('/') {
                    out.push(FieldError::invalid(
                        format!("{sp}.path"),
                        path,
                        "must start with a '/'",
                    ));
                } else if path.contains(['?', '#']) || path.split('/').any(|s| s == "..") {
                    out.push(FieldError::invalid(
                        format!("{sp}.path"),
                        path,
                        "must be a path without '..' segments, a query or a fragment",
                    ));
                }
            }
        }
    }
}

fn check_match_conditions(
    out: &mut Vec<FieldError>,
    conditions: &[MatchCondition],
    p: &str,
    vars: &[&str],
) {
    if conditions.len() > MAX_MATCH_CONDITIONS {
        out.push(FieldError {
            path: p.to_string(),
            kind: crate::error::FieldErrorKind::TooMany,
            value: Some(conditions.len().to_string()),
            detail: format!("must have at most {MAX_MATCH_CONDITIONS} items"),
        });
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, c) in conditions.iter().enumerate() {
        let cp = format!("{p}[{i}]");
        if c.name.is_empty() {
            out.push(FieldError::required(format!("{cp}.name"), ""));
        } else {
            v::check_qualified_name(out, &format!("{cp}.name"), &c.name);
            if !names.insert(c.name.as_str()) {
                out.push(FieldError::duplicate(format!("{cp}.name"), &c.name));
            }
        }
        if c.expression.is_empty() {
            out.push(FieldError::required(format!("{cp}.expression"), ""));
        } else {
            check_expression(out, &format!("{cp}.expression"), &c.expression, vars);
        }
    }
}

/// A CEL expression that must compile over `vars`.
fn check_expression(out: &mut Vec<FieldError>, path: &str, expression: &str, vars: &[&str]) {
    if let Err(e) = skiff_schema::Expression::compile(expression, vars) {
        out.push(FieldError::invalid(
            path,
            expression,
            format!("compilation failed: {e}"),
        ));
    }
}

/// A policy's or a binding's rule, as the webhooks' rule (for its checks and matching).
pub(crate) fn as_rule(r: &NamedRuleWithOperations) -> RuleWithOperations {
    RuleWithOperations {
        operations: r.operations.clone(),
        api_groups: r.api_groups.clone(),
        api_versions: r.api_versions.clone(),
        resources: r.resources.clone(),
        scope: r.scope.clone(),
    }
}

fn default_match_resources(m: &mut MatchResources) {
    m.namespace_selector
        .get_or_insert_with(LabelSelector::default);
    m.object_selector.get_or_insert_with(LabelSelector::default);
    m.match_policy.get_or_insert_with(|| "Equivalent".into());
    for r in m
        .resource_rules
        .iter_mut()
        .chain(m.exclude_resource_rules.iter_mut())
    {
        r.scope.get_or_insert_with(|| "*".into());
    }
}

/// matchConstraints or a binding's matchResources; `rules_required`: a policy's need
/// resourceRules.
fn check_match_resources(
    out: &mut Vec<FieldError>,
    m: &MatchResources,
    p: &str,
    rules_required: bool,
) {
    if rules_required && m.resource_rules.is_empty() {
        out.push(FieldError::required(format!("{p}.resourceRules"), ""));
    }
    for (field, rules) in [
        ("resourceRules", &m.resource_rules),
        ("excludeResourceRules", &m.exclude_resource_rules),
    ] {
        for (i, r) in rules.iter().enumerate() {
            check_rule(out, &as_rule(r), &format!("{p}.{field}[{i}]"));
            for (j, name) in r.resource_names.iter().enumerate() {
                if name.is_empty() {
                    out.push(FieldError::required(
                        format!("{p}.{field}[{i}].resourceNames[{j}]"),
                        "",
                    ));
                }
            }
        }
    }
    if let Some(mp) = m.match_policy.as_deref() {
        const POLICIES: &[&str] = &["Equivalent", "Exact"];
        if !POLICIES.contains(&mp) {
            out.push(FieldError::not_supported(
                format!("{p}.matchPolicy"),
                mp,
                POLICIES,
            ));
        }
    }
}

impl Strategy for ValidatingAdmissionPolicy {
    fn default(&mut self) {
        if let Some(spec) = self.spec.as_mut() {
            spec.failure_policy.get_or_insert_with(|| "Fail".into());
            if let Some(m) = spec.match_constraints.as_mut() {
                default_match_resources(m);
            }
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let Some(spec) = self.spec.as_ref() else {
            return vec![FieldError::required("spec", "")];
        };
        let mut out = Vec::new();
        if let Some(fp) = spec.failure_policy.as_deref() {
            const POLICIES: &[&str] = &["Fail", "Ignore"];
            if !POLICIES.contains(&fp) {
                out.push(FieldError::not_supported(
                    "spec.failurePolicy",
                    fp,
                    POLICIES,
                ));
            }
        }
        if let Some(pk) = spec.param_kind.as_ref() {
            if pk.api_version.is_empty() {
                out.push(FieldError::required("spec.paramKind.apiVersion", ""));
            }
            if pk.kind.is_empty() {
                out.push(FieldError::required("spec.paramKind.kind", ""));
            }
        }
        match spec.match_constraints.as_ref() {
            None => out.push(FieldError::required("spec.matchConstraints", "")),
            Some(m) => check_match_resources(&mut out, m, "spec.matchConstraints", true),
        }
        if spec.validations.is_empty() && spec.audit_annotations.is_empty() {
            out.push(FieldError::required(
                "spec.validations",
                "validations or auditAnnotations must contain at least one item",
            ));
        }
        for (i, val) in spec.validations.iter().enumerate() {
            let p = format!("spec.validations[{i}]");
            if val.expression.trim().is_empty() {
                out.push(FieldError::required(
                    format!("{p}.expression"),
                    "expression is not specified",
                ));
            } else {
                check_expression(
                    &mut out,
                    &format!("{p}.expression"),
                    &val.expression,
                    POLICY_VARS,
                );
            }
            if !val.message_expression.is_empty() {
                check_expression(
                    &mut out,
                    &format!("{p}.messageExpression"),
                    &val.message_expression,
                    POLICY_VARS,
                );
            }
            if let Some(reason) = val.reason.as_deref() {
                const REASONS: &[&str] = &[
                    "Forbidden",
                    "Invalid",
                    "RequestEntityTooLarge",
                    "Unauthorized",
                ];
                if !REASONS.contains(&reason) {
                    out.push(FieldError::not_supported(
                        format!("{p}.reason"),
                        reason,
                        REASONS,
                    ));
                }
            }
        }
        for (i, a) in spec.audit_annotations.iter().enumerate() {
            let p = format!("spec.auditAnnotations[{i}]");
            if a.key.is_empty() {
                out.push(FieldError::required(format!("{p}.key"), ""));
            }
            if a.value_expression.is_empty() {
                out.push(FieldError::required(format!("{p}.valueExpression"), ""));
            } else {
                check_expression(
                    &mut out,
                    &format!("{p}.valueExpression"),
                    &a.value_expression,
                    POLICY_VARS,
                );
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, var) in spec.variables.iter().enumerate() {
            let p = format!("spec.variables[{i}]");
            let identifier = var
                .name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && var
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_');
            if var.name.is_empty() {
                out.push(FieldError::required(
                    format!("{p}.name"),
                    "name is not specified",
                ));
            } else if !identifier {
                out.push(FieldError::invalid(
                    format!("{p}.name"),
                    &var.name,
                    "name is not a valid CEL identifier",
                ));
            } else if !names.insert(var.name.as_str()) {
                out.push(FieldError::duplicate(format!("{p}.name"), &var.name));
            }
            if var.expression.is_empty() {
                out.push(FieldError::required(
                    format!("{p}.expression"),
                    "expression is not specified",
                ));
            } else {
                check_expression(
                    &mut out,
                    &format!("{p}.expression"),
                    &var.expression,
                    POLICY_VARS,
                );
            }
        }
        check_match_conditions(
            &mut out,
            &spec.match_conditions,
            "spec.matchConditions",
            POLICY_VARS,
        );
        out
    }
}

impl Strategy for ValidatingAdmissionPolicyBinding {
    fn default(&mut self) {
        if let Some(m) = self.spec.as_mut().and_then(|s| s.match_resources.as_mut()) {
            default_match_resources(m);
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let Some(spec) = self.spec.as_ref() else {
            return vec![FieldError::required("spec", "")];
        };
        let mut out = Vec::new();
        if spec.policy_name.is_empty() {
            out.push(FieldError::required("spec.policyName", ""));
        }
        const ACTIONS: &[&str] = &["Audit", "Deny", "Warn"];
        if spec.validation_actions.is_empty() {
            out.push(FieldError::required(
                "spec.validationActions",
                "at least one validation action is required",
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, a) in spec.validation_actions.iter().enumerate() {
            let p = format!("spec.validationActions[{i}]");
            if !ACTIONS.contains(&a.as_str()) {
                out.push(FieldError::not_supported(p, a, ACTIONS));
            } else if !seen.insert(a.as_str()) {
                out.push(FieldError::duplicate(p, a));
            }
        }
        if seen.contains("Deny") && seen.contains("Warn") {
            out.push(FieldError::invalid(
                "spec.validationActions",
                GoStrings(&spec.validation_actions),
                "must not contain both Deny and Warn (repeating the same validation failure \
                 information in the API response and headers serves no purpose)",
            ));
        }
        if let Some(m) = spec.match_resources.as_ref() {
            check_match_resources(&mut out, m, "spec.matchResources", false);
        }
        if let Some(r) = spec.param_ref.as_ref()
            && !r.name.is_empty()
            && r.selector.is_some()
        {
            out.push(FieldError::forbidden(
                "spec.paramRef.name",
                "name and selector are mutually exclusive",
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::ServiceReference;

    fn hook(name: &str) -> ValidatingWebhook {
        let mut h = ValidatingWebhook {
            name: name.into(),
            client_config: Some(WebhookClientConfig {
                service: Some(ServiceReference {
                    namespace: "default".into(),
                    name: "hooks".into(),
                    path: Some("/validate".into()),
                    port: Some(443),
                }),
                ..Default::default()
            }),
            rules: vec![RuleWithOperations {
                operations: vec!["CREATE".into()],
                api_groups: vec!["".into()],
                api_versions: vec!["v1".into()],
                resources: vec!["pods".into()],
                scope: None,
            }],
            side_effects: Some("None".into()),
            admission_review_versions: vec!["v1".into()],
            ..Default::default()
        };
        h.set_defaults();
        h
    }

    fn shown(c: &ValidatingWebhookConfiguration) -> Vec<String> {
        Strategy::validate(c)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn defaults_are_kubernetes() {
        let h = hook("pods.validate.example.com");
        assert_eq!(h.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(h.match_policy.as_deref(), Some("Equivalent"));
        assert_eq!(h.timeout_seconds, Some(10));
        assert_eq!(h.rules[0].scope.as_deref(), Some("*"));
        assert!(h.namespace_selector.is_some() && h.object_selector.is_some());
        let mut m = MutatingWebhook::default();
        m.set_defaults();
        assert_eq!(m.reinvocation_policy.as_deref(), Some("Never"));
    }

    #[test]
    fn a_good_configuration_passes() {
        let c = ValidatingWebhookConfiguration {
            webhooks: vec![hook("pods.validate.example.com")],
            ..Default::default()
        };
        assert_eq!(shown(&c), Vec::<String>::new());
    }

    #[test]
    fn bad_webhooks_get_kubernetes_messages() {
        let mut bad = hook("short.name");
        bad.side_effects = Some("Some".into());
        bad.timeout_seconds = Some(31);
        bad.admission_review_versions = vec!["v2".into()];
        bad.rules[0].operations = vec!["*".into(), "CREATE".into()];
        bad.rules[0].resources = vec!["*/*".into(), "pods".into()];
        bad.client_config = Some(WebhookClientConfig {
            url: Some("http://user@example.com/x?q=1".into()),
            ..Default::default()
        });
        bad.match_conditions = vec![MatchCondition {
            name: "c".into(),
            expression: "nope == 1".into(),
        }];
        let dup = hook("pods.validate.example.com");
        let c = ValidatingWebhookConfiguration {
            webhooks: vec![bad, dup.clone(), dup],
            ..Default::default()
        };
        let got = shown(&c).join("\n");
        for want in [
            "webhooks[0].name: Invalid value: \"short.name\": should be a domain with at least three segments separated by dots",
            "webhooks[0].rules[0].operations: Invalid value: []string{\"*\", \"CREATE\"}: if '*' is present, must not specify other operations",
            "webhooks[0].rules[0].resources: Invalid value: []string{\"*/*\", \"pods\"}: if '*/*' is present, must not specify other resources",
            "webhooks[0].sideEffects: Unsupported value: \"Some\": supported values: \"None\", \"NoneOnDryRun\"",
            "webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds",
            "webhooks[0].admissionReviewVersions: Invalid value: []string{\"v2\"}: must include at least one of v1, v1beta1",
            "webhooks[0].clientConfig.url: Invalid value: \"http\": 'https' is the only allowed URL scheme; desired format: https://host[/path]",
            "webhooks[0].clientConfig.url: Invalid value: \"user\": user information is not permitted in the URL",
            "webhooks[0].clientConfig.url: Invalid value: \"q=1\": query parameters are not permitted in the URL",
            "webhooks[0].matchConditions[0].expression: Invalid value: \"nope == 1\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'nope'",
            "webhooks[2].name: Duplicate value: \"pods.validate.example.com\"",
        ] {
            assert!(got.contains(want), "missing {want:?} in\n{got}");
        }
        let mut none = hook("a.b.c");
        none.side_effects = None;
        none.client_config = None;
        let got = shown(&ValidatingWebhookConfiguration {
            webhooks: vec![none],
            ..Default::default()
        })
        .join("\n");
        assert!(
            got.contains(
                "webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun"
            ),
            "{got}"
        );
        assert!(got.contains("webhooks[0].clientConfig: Required value: exactly one of url or service is required"), "{got}");
    }

    #[test]
    fn match_conditions_see_object_old_object_and_request() {
        let mut h = hook("a.b.c");
        h.match_conditions = vec![MatchCondition {
            name: "not-kube-system".into(),
            expression: "request.namespace != 'kube-system' && object.metadata.name != '' && oldObject == null".into(),
        }];
        let c = ValidatingWebhookConfiguration {
            webhooks: vec![h],
            ..Default::default()
        };
        assert_eq!(shown(&c), Vec::<String>::new());
    }
}
