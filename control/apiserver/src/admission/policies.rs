//! `ValidatingAdmissionPolicy`: CEL validations evaluated in process for the writes a
//! ValidatingAdmissionPolicyBinding binds a policy to, as kube-apiserver's plug-in of that
//! name does (it runs before the validating webhooks).
//!
//! - Policies and bindings are read from in-process mirrors and compiled once per
//!   resourceVersion. Bindings go in name order; a binding whose policy does not exist is
//!   ignored.
//! - A write is covered when the policy's matchConstraints match it (resourceRules with
//!   their resourceNames, not an excludeResourceRule, the namespace and object selectors),
//!   the binding's matchResources too when it has any, and every matchCondition holds.
//! - Expressions see `object`, `oldObject`, `request` (the admission request a webhook would
//!   get), `namespaceObject` and `variables` (the policy's variables, evaluated in order,
//!   each seeing those before it). `params` is always `null`: a policy with a paramKind
//!   cannot be evaluated here, which counts as an expression error.
//! - A validation that is false fails with its messageExpression's string, else its
//!   message, else `failed expression: <expression>`. An expression's error is a failure too
//!   under `failurePolicy: Fail` and is ignored under `Ignore`. What a failure does is the
//!   binding's validationActions: Deny refuses the write (`ValidatingAdmissionPolicy 'p' with
//!   binding 'b' denied request: ...`, code by the validation's reason, 422 Invalid by
//!   default), Warn returns a warning, Audit annotates the request's audit event.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use skiff_api::api::{
    MatchResources, RuleWithOperations, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use skiff_api::selector::Selector;
use skiff_schema::Expression;

use super::interface::{Operation, Plugin, Request};
use super::webhooks::{
    Webhooks, conditions_hold, exempt, new_uid, rule_matches, selector, selectors_match,
};
use crate::auth::mirror::Mirror;
use crate::error::{ApiError, known_reason};
use crate::strategy::admissionregistration::{POLICY_VARS, as_rule};

/// Every policy and binding, compiled.
#[derive(Default)]
pub struct Policies {
    sources: OnceLock<Sources>,
    /// Policy uid → (resourceVersion, compiled).
    compiled: Mutex<HashMap<String, (String, Arc<Policy>)>>,
}

impl std::fmt::Debug for Policies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policies").finish_non_exhaustive()
    }
}

struct Sources {
    policies: Arc<Mirror<ValidatingAdmissionPolicy>>,
    bindings: Arc<Mirror<ValidatingAdmissionPolicyBinding>>,
}

/// A policy's or a binding's match resources, compiled.
struct Matcher {
    rules: Vec<(RuleWithOperations, Vec<String>)>,
    exclude: Vec<(RuleWithOperations, Vec<String>)>,
    namespace_selector: Result<Selector, String>,
    object_selector: Result<Selector, String>,
}

impl Matcher {
    fn compile(m: &MatchResources) -> Matcher {
        let rules = |rs: &[skiff_api::api::NamedRuleWithOperations]| {
            rs.iter()
                .map(|r| (as_rule(r), r.resource_names.clone()))
                .collect()
        };
        Matcher {
            rules: rules(&m.resource_rules),
            exclude: rules(&m.exclude_resource_rules),
            namespace_selector: selector(m.namespace_selector.as_ref()),
            object_selector: selector(m.object_selector.as_ref()),
        }
    }

    /// Whether the rules cover the request (`None` rules: everything).
    fn rules_cover(&self, req: &Request<'_>) -> bool {
        let hit = |(rule, names): &(RuleWithOperations, Vec<String>)| {
            rule_matches(rule, req) && (names.is_empty() || names.iter().any(|n| n == req.name))
        };
        self.rules.iter().any(hit) && !self.exclude.iter().any(hit)
    }
}

/// One compiled expression (or why it did not compile).
type Compiled = Result<Expression, String>;

struct Validation {
    source: String,
    expression: Compiled,
    message: String,
    message_expression: Option<Compiled>,
    reason: String,
}

struct Policy {
    fail_closed: bool,
    has_params: bool,
    constraints: Option<Matcher>,
    conditions: Vec<(String, Compiled)>,
    variables: Vec<(String, Compiled)>,
    validations: Vec<Validation>,
}

impl Policy {
    fn compile(p: &ValidatingAdmissionPolicy) -> Policy {
        let spec = p.spec.clone().unwrap_or_default();
        let compile = |src: &str| Expression::compile(src, POLICY_VARS);
        Policy {
            fail_closed: spec.failure_policy.as_deref() != Some("Ignore"),
            has_params: spec.param_kind.is_some(),
            constraints: spec.match_constraints.as_ref().map(Matcher::compile),
            conditions: spec
                .match_conditions
                .iter()
                .map(|c| (c.name.clone(), compile(&c.expression)))
                .collect(),
            variables: spec
                .variables
                .iter()
                .map(|v| (v.name.clone(), compile(&v.expression)))
                .collect(),
            validations: spec
                .validations
                .iter()
                .map(|v| Validation {
                    source: v.expression.clone(),
                    expression: compile(&v.expression),
                    message: v.message.clone(),
                    message_expression: (!v.message_expression.is_empty())
                        .then(|| compile(&v.message_expression)),
                    reason: v.reason.clone().unwrap_or_else(|| "Invalid".into()),
                })
                .collect(),
        }
    }
}

/// Why a policy failed a write: its message and the reason its status carries.
struct Failure {
    message: String,
    reason: String,
}

impl Policies {
    /// Starts reading policies and bindings (once the registry runs).
    pub(crate) async fn start(&self, registry: &crate::registry::Registry) -> Result<(), ApiError> {
        let sources = Sources {
            policies: Mirror::start(registry).await?,
            bindings: Mirror::start(registry).await?,
        };
        let _ = self.sources.set(sources);
        Ok(())
    }

    /// The policy named `name`, compiled (cached by uid and resourceVersion).
    fn policy(&self, sources: &Sources, name: &str) -> Option<Arc<Policy>> {
        let p = sources.policies.get("", name)?;
        let meta = p.metadata.clone().unwrap_or_default();
        let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((rv, c)) = compiled.get(&meta.uid)
            && *rv == meta.resource_version
        {
            return Some(Arc::clone(c));
        }
        let c = Arc::new(Policy::compile(&p));
        compiled.insert(meta.uid, (meta.resource_version, Arc::clone(&c)));
        Some(c)
    }

    /// The bound policies whose rules cover `req`, with their bindings, in binding name order.
    fn for_request(&self, req: &Request<'_>) -> Vec<Bound> {
        let Some(sources) = self.sources.get() else {
            return Vec::new();
        };
        if exempt(req) {
            return Vec::new();
        }
        let mut bindings = sources.bindings.filter(|_| true);
        if bindings.is_empty() {
            return Vec::new();
        }
        bindings.sort_by(|a, b| name_of(a).cmp(name_of(b)));
        bindings
            .into_iter()
            .filter_map(|b| {
                let spec = b.spec.as_ref()?;
                let policy = self.policy(sources, &spec.policy_name)?;
                let matcher = spec.match_resources.as_ref().map(Matcher::compile);
                let covered = policy
                    .constraints
                    .as_ref()
                    .is_some_and(|m| m.rules_cover(req))
                    && matcher
                        .as_ref()
                        .filter(|m| !m.rules.is_empty())
                        .is_none_or(|m| m.rules_cover(req));
                covered.then_some(Bound {
                    binding: b,
                    policy,
                    matcher,
                })
            })
            .collect()
    }
}

/// A binding whose policy's rules cover the request, with its policy and its own
/// matchResources compiled (once per request).
struct Bound {
    binding: Arc<ValidatingAdmissionPolicyBinding>,
    policy: Arc<Policy>,
    matcher: Option<Matcher>,
}

fn name_of(b: &ValidatingAdmissionPolicyBinding) -> &str {
    b.metadata.as_ref().map_or("", |m| m.name.as_str())
}

/// The evaluation of one bound policy: `Ok(None)` it passes (or does not apply), else the
/// failure; `Err` is an error (the failure policy decides).
async fn evaluate(
    bound: &Bound,
    req: &Request<'_>,
    object: &Value,
    old: &Value,
) -> Result<Option<Failure>, String> {
    let policy = &bound.policy;
    let constraints = policy.constraints.as_ref().ok_or("no matchConstraints")?;
    if !selectors_match(
        &constraints.namespace_selector,
        &constraints.object_selector,
        req,
        object,
        old,
    )
    .await?
    {
        return Ok(None);
    }
    if let Some(m) = &bound.matcher
        && !selectors_match(&m.namespace_selector, &m.object_selector, req, object, old).await?
    {
        return Ok(None);
    }
    let request = Webhooks::review_request(req, &new_uid(), object, old);
    let namespace = req
        .namespace_object()
        .await
        .map_err(|e| e.to_string())?
        .map(skiff_api::Resource::to_json)
        .unwrap_or(Value::Null);
    // In POLICY_VARS' order; `params` is null, `variables` filled in as they are evaluated.
    let mut vals = [
        object.clone(),
        old.clone(),
        request,
        Value::Null,
        namespace,
        Value::Object(Map::new()),
    ];
    if !conditions_hold(&policy.conditions, &refs(&vals))? {
        return Ok(None);
    }
    if policy.has_params {
        return Err("policies with a paramKind are not supported by this server".into());
    }
    for (name, expr) in &policy.variables {
        let expr = expr
            .as_ref()
            .map_err(|e| format!("variable {name:?}: {e}"))?;
        let v = expr
            .eval_value(&refs(&vals))
            .map_err(|e| format!("variable {name:?} resulted in error: {e}"))?;
        vals[5][name.as_str()] = v;
    }
    for v in &policy.validations {
        let expr = v
            .expression
            .as_ref()
            .map_err(|e| format!("expression '{}': {e}", v.source))?;
        let ok = expr
            .eval_bool(&refs(&vals))
            .map_err(|e| format!("expression '{}' resulted in error: {e}", v.source))?;
        if ok {
            continue;
        }
        let from_expression = v
            .message_expression
            .as_ref()
            .and_then(|m| m.as_ref().ok())
            .and_then(|m| m.eval_value(&refs(&vals)).ok())
            .and_then(|m| m.as_str().map(str::to_string))
            .filter(|m| !m.trim().is_empty() && !m.contains('\n'));
        let message = from_expression.unwrap_or_else(|| {
            if v.message.is_empty() {
                format!("failed expression: {}", v.source)
            } else {
                v.message.clone()
            }
        });
        return Ok(Some(Failure {
            message,
            reason: v.reason.clone(),
        }));
    }
    Ok(None)
}

fn refs(v: &[Value; 6]) -> [&Value; 6] {
    [&v[0], &v[1], &v[2], &v[3], &v[4], &v[5]]
}

/// The HTTP code of a validation's reason.
fn code_of(reason: &str) -> u16 {
    match reason {
        "Unauthorized" => 401,
        "Forbidden" => 403,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    }
}

/// The policies, as an admission plug-in.
#[derive(Debug)]
pub struct ValidatingAdmissionPolicyPlugin(pub Arc<Policies>);

#[async_trait]
impl Plugin for ValidatingAdmissionPolicyPlugin {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionPolicy"
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        let bound = self.0.for_request(req);
        if bound.is_empty() {
            return Ok(());
        }
        let object = if req.operation == Operation::Delete {
            Value::Null
        } else {
            req.json.to_json(object).unwrap_or(Value::Null)
        };
        let old = req
            .old
            .and_then(|o| req.json.to_json(o))
            .unwrap_or(Value::Null);
        let mut warnings = Vec::new();
        let mut annotations = Vec::new();
        let mut refusal = None;
        for b in &bound {
            let (binding, policy) = (&b.binding, &b.policy);
            let (binding_name, spec) = (name_of(binding), binding.spec.clone().unwrap_or_default());
            let failure = match evaluate(b, req, &object, &old).await {
                Ok(f) => f,
                Err(e) if policy.fail_closed => Some(Failure {
                    message: e,
                    reason: "Invalid".into(),
                }),
                Err(e) => {
                    tracing::warn!(policy = %spec.policy_name, binding = binding_name,
                        "{e}; failurePolicy Ignore: admitted");
                    None
                }
            };
            let Some(f) = failure else {
                continue;
            };
            let who = format!(
                "ValidatingAdmissionPolicy '{}' with binding '{binding_name}'",
                spec.policy_name
            );
            for action in &spec.validation_actions {
                match action.as_str() {
                    "Deny" if refusal.is_none() => {
                        let group = req.info.group();
                        refusal = Some(ApiError::Denied {
                            code: code_of(&f.reason),
                            reason: known_reason(&f.reason),
                            resource: if group.is_empty() {
                                req.info.plural.to_string()
                            } else {
                                format!("{}.{group}", req.info.plural)
                            },
                            name: req.name.to_string(),
                            denial: format!("{who} denied request: {}", f.message),
                        });
                    }
                    "Warn" => warnings.push(format!("Validation failed for {who}: {}", f.message)),
                    "Audit" => annotations.push((
                        "validation.policy.admission.k8s.io/validation_failure".to_string(),
                        json!([{
                            "message": f.message,
                            "policy": spec.policy_name,
                            "binding": binding_name,
                            "expressionIndex": 0,
                            "validationActions": spec.validation_actions,
                        }])
                        .to_string(),
                    )),
                    _ => {}
                }
            }
        }
        crate::request::note_for_client(req.audit, warnings, annotations);
        match refusal {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_give_kubernetes_codes() {
        assert_eq!(code_of("Invalid"), 422);
        assert_eq!(code_of("Forbidden"), 403);
        assert_eq!(code_of("Unauthorized"), 401);
        assert_eq!(code_of("RequestEntityTooLarge"), 413);
    }
}
