//! `MutatingAdmissionWebhook` and `ValidatingAdmissionWebhook`: the writes that match a
//! webhook of a Mutating- or ValidatingWebhookConfiguration are sent to it as an
//! `admission.k8s.io/v1` AdmissionReview, as kube-apiserver does.
//!
//! - Configurations are read from in-process mirrors of the two kinds (no store read per
//!   write) and compiled once per resourceVersion. Configurations go in name order, and
//!   webhooks in their order within a configuration.
//! - A webhook is called when one of its rules matches (operation, group, version,
//!   resource and subresource with their wildcards, scope), its namespaceSelector matches the
//!   namespace's labels (for a Namespace: its own), its objectSelector matches the object's
//!   or the old object's labels, and every matchCondition (CEL over `object`, `oldObject`,
//!   `request`) holds. The two configuration kinds themselves are never sent to webhooks,
//!   so a broken webhook can always be removed.
//! - Mutating webhooks run one after another, after the built-in mutating plug-ins and before
//!   the kind's validation: each may answer a JSONPatch, applied to the object as the next
//!   webhook sees it; a patch may not change apiVersion, kind, name, namespace or uid. With
//!   `reinvocationPolicy: IfNeeded` a webhook is called once more when a later webhook
//!   changed the object. Validating webhooks run in parallel after the kind's validation
//!   and every built-in validating plug-in (Pod Security included) saw the mutated object,
//!   so a mutating webhook cannot slip past them.
//! - A refusal is the webhook's status with `admission webhook "<name>" denied the request:
//!   <message>` (code 400 unless it says otherwise). A call that fails (no endpoints, a bad
//!   CA bundle, TLS, a non-200 answer, an invalid review, the webhook's timeout) refuses the
//!   write with `Internal error occurred: failed calling webhook "<name>": ...` under
//!   `failurePolicy: Fail`, and is skipped under `Ignore`. Each call ends at the webhook's
//!   `timeoutSeconds`; other requests never wait for it.
//! - Nothing of a review (objects may be Secrets) is logged.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use serde_json::{Value, json};
use skiff_api::Resource;
use skiff_api::api::{
    LabelSelector, MutatingWebhookConfiguration, Namespace, RuleWithOperations,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use skiff_api::selector::Selector;
use skiff_schema::Expression;
use tracing::warn;

use super::interface::{Operation, Plugin, Request};
use crate::auth::mirror::Mirror;
use crate::error::{ApiError, known_reason};
use crate::outbound::{CallError, Outbound};
use crate::strategy::admissionregistration::{MATCH_CONDITION_VARS, Webhook, WebhookFields};

/// The webhooks of every configuration, and the client that calls them.
#[derive(Default)]
pub struct Webhooks {
    sources: OnceLock<Sources>,
    outbound: Outbound,
    /// Compiled webhooks per configuration uid, with the resourceVersion compiled
    /// (validating, mutating).
    compiled: [Mutex<Compiled>; 2],
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhooks").finish_non_exhaustive()
    }
}

/// Configuration uid → (resourceVersion, its webhooks compiled).
type Compiled = HashMap<String, (String, Arc<Vec<Arc<Hook>>>)>;

struct Sources {
    validating: Arc<Mirror<ValidatingWebhookConfiguration>>,
    mutating: Arc<Mirror<MutatingWebhookConfiguration>>,
}

/// One webhook, compiled.
struct Hook {
    name: String,
    client: WebhookClientConfig,
    rules: Vec<RuleWithOperations>,
    fail_closed: bool,
    namespace_selector: Result<Selector, String>,
    object_selector: Result<Selector, String>,
    timeout: Duration,
    conditions: Vec<(String, Result<Expression, String>)>,
    reinvoke: bool,
    /// The AdmissionReview version sent: v1 when the webhook takes it, else v1beta1.
    review_version: &'static str,
}

pub(super) fn selector(sel: Option<&LabelSelector>) -> Result<Selector, String> {
    match sel {
        None => Ok(Selector::everything()),
        Some(s) => Selector::from_label_selector(s).map_err(|e| e.to_string()),
    }
}

impl Hook {
    fn compile(w: Webhook<'_>) -> Hook {
        Hook {
            name: w.name.to_string(),
            client: w.client_config.cloned().unwrap_or_default(),
            rules: w.rules.to_vec(),
            fail_closed: w.failure_policy != Some("Ignore"),
            namespace_selector: selector(w.namespace_selector),
            object_selector: selector(w.object_selector),
            timeout: Duration::from_secs(w.timeout_seconds.unwrap_or(10).clamp(1, 30) as u64),
            conditions: w
                .match_conditions
                .iter()
                .map(|c| {
                    (
                        c.name.clone(),
                        Expression::compile(&c.expression, MATCH_CONDITION_VARS),
                    )
                })
                .collect(),
            reinvoke: w.reinvocation_policy == Some("IfNeeded"),
            review_version: if w.admission_review_versions.iter().any(|v| v == "v1") {
                "v1"
            } else {
                "v1beta1"
            },
        }
    }
}

/// What a webhook call came to.
enum Verdict {
    /// Allowed, with the patch a mutating webhook answered.
    Allowed(Option<json_patch::Patch>),
    Denied(ApiError),
}

impl Webhooks {
    /// Starts reading the configurations (once the registry runs).
    pub(crate) async fn start(&self, registry: &crate::registry::Registry) -> Result<(), ApiError> {
        let sources = Sources {
            validating: Mirror::start(registry).await?,
            mutating: Mirror::start(registry).await?,
        };
        let _ = self.sources.set(sources);
        Ok(())
    }

    /// The compiled webhooks of one kind of configuration, in calling order.
    fn hooks(&self, mutating: bool) -> Vec<Arc<Hook>> {
        let Some(sources) = self.sources.get() else {
            return Vec::new();
        };
        let (validating, mutating_configs);
        // (name, uid, resourceVersion, webhooks)
        let mut configs: Vec<(String, String, String, Vec<Webhook<'_>>)> = Vec::new();
        fn entry<'a>(
            meta: Option<&skiff_api::api::ObjectMeta>,
            hooks: Vec<Webhook<'a>>,
        ) -> (String, String, String, Vec<Webhook<'a>>) {
            let m = meta.cloned().unwrap_or_default();
            (m.name, m.uid, m.resource_version, hooks)
        }
        if mutating {
            mutating_configs = sources.mutating.filter(|_| true);
            for c in &mutating_configs {
                configs.push(entry(
                    c.metadata.as_ref(),
                    c.webhooks.iter().map(|w| w.view()).collect(),
                ));
            }
        } else {
            validating = sources.validating.filter(|_| true);
            for c in &validating {
                configs.push(entry(
                    c.metadata.as_ref(),
                    c.webhooks.iter().map(|w| w.view()).collect(),
                ));
            }
        }
        let mut compiled = self.compiled[usize::from(mutating)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        compiled.retain(|uid, _| configs.iter().any(|c| &c.1 == uid));
        if configs.is_empty() {
            return Vec::new();
        }
        configs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::new();
        for (_, uid, rv, views) in configs {
            let cached = compiled
                .get(&uid)
                .filter(|(at, _)| *at == rv)
                .map(|(_, h)| Arc::clone(h));
            let hooks = match cached {
                Some(h) => h,
                None => {
                    let h: Arc<Vec<Arc<Hook>>> = Arc::new(
                        views
                            .into_iter()
                            .map(|w| Arc::new(Hook::compile(w)))
                            .collect(),
                    );
                    compiled.insert(uid, (rv, Arc::clone(&h)));
                    h
                }
            };
            out.extend(hooks.iter().cloned());
        }
        out
    }

    /// The webhooks of one kind that may want `req`, and its old object's JSON; `None` when
    /// there are none (or the kind is never sent).
    fn for_request(&self, req: &Request<'_>, mutating: bool) -> Option<(Vec<Arc<Hook>>, Value)> {
        if exempt(req) {
            return None;
        }
        // Rules are checked first: they are cheap, and a write no rule covers is never
        // turned into JSON.
        let hooks: Vec<Arc<Hook>> = self
            .hooks(mutating)
            .into_iter()
            .filter(|h| h.rules.iter().any(|r| rule_matches(r, req)))
            .collect();
        if hooks.is_empty() {
            return None;
        }
        let old = req
            .old
            .and_then(|o| req.json.to_json(o))
            .unwrap_or(Value::Null);
        Some((hooks, old))
    }

    /// Whether `hook`, whose rules cover the request, wants it (selectors, match conditions). An error is a
    /// failure of the webhook (under its failure policy).
    async fn wants(
        &self,
        hook: &Hook,
        req: &Request<'_>,
        object: &Value,
        old: &Value,
        request: &Value,
    ) -> Result<bool, String> {
        if !selectors_match(
            &hook.namespace_selector,
            &hook.object_selector,
            req,
            object,
            old,
        )
        .await?
        {
            return Ok(false);
        }
        conditions_hold(&hook.conditions, &[object, old, request])
    }

    /// Calls `hook` with this review; the call's failure is a [`CallError`].
    async fn call(
        &self,
        hook: &Hook,
        req: &Request<'_>,
        request: &Value,
        uid: &str,
    ) -> Result<Verdict, CallError> {
        let review = json!({
            "apiVersion": format!("admission.k8s.io/{}", hook.review_version),
            "kind": "AdmissionReview",
            "request": request,
        });
        let body = serde_json::to_vec(&review).map_err(|e| CallError::Client(e.to_string()))?;
        let target = crate::outbound::resolve(req.store, &hook.client).await?;
        let answer = self
            .outbound
            .post(&target, &hook.client.ca_bundle, body.into(), hook.timeout)
            .await?;
        let invalid = |reason: String| CallError::Call {
            url: target.url.clone(),
            reason: format!("received invalid webhook response: {reason}"),
        };
        let review: Value = serde_json::from_slice(&answer).map_err(|e| invalid(e.to_string()))?;
        if review["kind"] != "AdmissionReview" {
            return Err(invalid(format!(
                "expected kind \"AdmissionReview\", got {}",
                review["kind"]
            )));
        }
        let response = &review["response"];
        if !response.is_object() {
            return Err(invalid("webhook response was absent".into()));
        }
        if response["uid"].as_str() != Some(uid) {
            return Err(invalid(format!(
                "expected response.uid=\"{uid}\", got {}",
                response["uid"]
            )));
        }
        note_for_client(req, hook, response);
        if response["allowed"].as_bool() != Some(true) {
            return Ok(Verdict::Denied(denial(&hook.name, &response["status"])));
        }
        let Some(patch) = response["patch"].as_str() else {
            return Ok(Verdict::Allowed(None));
        };
        match response["patchType"].as_str() {
            Some("JSONPatch") => {}
            other => {
                return Err(invalid(format!(
                    "expected patchType \"JSONPatch\", got {}",
                    other.unwrap_or("")
                )));
            }
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .map_err(|e| invalid(format!("patch: {e}")))?;
        let patch: json_patch::Patch =
            serde_json::from_slice(&bytes).map_err(|e| invalid(format!("patch: {e}")))?;
        Ok(Verdict::Allowed(Some(patch)))
    }

    /// The request part of the review of `req`.
    pub(super) fn review_request(
        req: &Request<'_>,
        uid: &str,
        object: &Value,
        old: &Value,
    ) -> Value {
        let (group, version) = match req.info.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", req.info.api_version),
        };
        let (operation, options) = match req.operation {
            Operation::Create => ("CREATE", "CreateOptions"),
            Operation::Update => ("UPDATE", "UpdateOptions"),
            Operation::Delete => ("DELETE", "DeleteOptions"),
        };
        let kind = json!({"group": group, "version": version, "kind": req.info.kind});
        let resource = json!({"group": group, "version": version, "resource": req.info.plural});
        let mut r = json!({
            "uid": uid,
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": req.name,
            "operation": operation,
            "object": object,
            "oldObject": old,
            "dryRun": req.dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": options},
        });
        if !req.subresource.is_empty() {
            r["subResource"] = json!(req.subresource);
        }
        if req.info.namespaced {
            r["namespace"] = json!(req.namespace);
        }
        if let Some(u) = req.user {
            r["userInfo"] = json!({
                "username": u.name,
                "uid": u.uid,
                "groups": u.groups,
                "extra": u.extra,
            });
        } else {
            r["userInfo"] = json!({});
        }
        r
    }

    /// A failed call under the webhook's policy: the refusal, or `None` to go on.
    fn failed(hook: &Hook, reason: &dyn std::fmt::Display) -> Option<ApiError> {
        let message = format!("failed calling webhook {:?}: {reason}", hook.name);
        if hook.fail_closed {
            Some(internal(message))
        } else {
            warn!(webhook = %hook.name, "{message}; failurePolicy Ignore: admitted");
            None
        }
    }
}

/// Whether the request's object (or old object) matches `object_selector` and its
/// namespace (a Namespace: itself) `namespace_selector`. An error (a selector that did not
/// compile, the namespace unreadable) is the caller's failure.
pub(super) async fn selectors_match(
    namespace_selector: &Result<Selector, String>,
    object_selector: &Result<Selector, String>,
    req: &Request<'_>,
    object: &Value,
    old: &Value,
) -> Result<bool, String> {
    let labels = |v: &Value| -> std::collections::BTreeMap<String, String> {
        serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default()
    };
    let objsel = object_selector.as_ref().map_err(Clone::clone)?;
    if !objsel.is_empty() && !objsel.matches(&labels(object)) && !objsel.matches(&labels(old)) {
        return Ok(false);
    }
    let nssel = namespace_selector.as_ref().map_err(Clone::clone)?;
    if !nssel.is_empty() {
        let ns_labels = if req.info.kind == Namespace::INFO.kind && req.info.group().is_empty() {
            let own = if object.is_null() { old } else { object };
            Some(labels(own))
        } else if req.info.namespaced {
            let ns = req.namespace_object().await.map_err(|e| e.to_string())?;
            Some(
                ns.and_then(|n| n.metadata.as_ref())
                    .map(|m| m.labels.clone())
                    .unwrap_or_default(),
            )
        } else {
            None
        };
        if let Some(l) = ns_labels
            && !nssel.matches(&l)
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether every matchCondition holds over `values`; an error names the condition.
pub(super) fn conditions_hold(
    conditions: &[(String, Result<Expression, String>)],
    values: &[&Value],
) -> Result<bool, String> {
    for (name, cond) in conditions {
        let expr = cond
            .as_ref()
            .map_err(|e| format!("matchCondition {name:?}: {e}"))?;
        match expr.eval_bool(values) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => return Err(format!("matchCondition {name:?}: {e}")),
        }
    }
    Ok(true)
}

/// kube-apiserver's ToStatusErr: the webhook's status, never below 400, its message
/// prefixed with who denied.
fn denial(name: &str, status: &Value) -> ApiError {
    let denied_by = format!("admission webhook {name:?} denied the request");
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..600).contains(c))
        .unwrap_or(400);
    let message = status["message"].as_str().unwrap_or("");
    let reason = status["reason"].as_str().unwrap_or("");
    let message = if !message.is_empty() {
        format!("{denied_by}: {message}")
    } else if !reason.is_empty() {
        format!("{denied_by}: {reason}")
    } else {
        format!("{denied_by} without explanation")
    };
    ApiError::Status {
        code,
        reason: known_reason(reason),
        message,
    }
}

/// Whether a rule covers the request's operation, group, version, resource/subresource
/// and scope.
pub(super) fn rule_matches(rule: &RuleWithOperations, req: &Request<'_>) -> bool {
    let op = match req.operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
    };
    let any = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
    let (group, version) = match req.info.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", req.info.api_version),
    };
    let scope_ok = match rule.scope.as_deref().unwrap_or("*") {
        "Cluster" => !req.info.namespaced,
        "Namespaced" => req.info.namespaced,
        _ => true,
    };
    scope_ok
        && any(&rule.operations, op)
        && any(&rule.api_groups, group)
        && any(&rule.api_versions, version)
        && rule
            .resources
            .iter()
            .any(|r| resource_matches(r, req.info.plural, req.subresource))
}

/// `pods`, `pods/status`, `pods/*`, `*/status`, `*` (no subresource), `*/*`.
fn resource_matches(pattern: &str, resource: &str, sub: &str) -> bool {
    let (res, want_sub) = match pattern.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (pattern, None),
    };
    let res_ok = res == "*" || res == resource;
    let sub_ok = match want_sub {
        None => sub.is_empty(),
        Some("*") => true,
        Some(s) => s == sub,
    };
    res_ok && sub_ok
}

/// Kinds never sent to webhooks or policies: their own configurations, so a broken one can
/// always be removed.
pub(super) fn exempt(req: &Request<'_>) -> bool {
    [
        ValidatingWebhookConfiguration::INFO.kind,
        MutatingWebhookConfiguration::INFO.kind,
        ValidatingAdmissionPolicy::INFO.kind,
        ValidatingAdmissionPolicyBinding::INFO.kind,
    ]
    .contains(&req.info.kind)
}

pub(super) fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The mutating webhooks, as an admission plug-in.
#[derive(Debug)]
pub struct MutatingAdmissionWebhook(pub Arc<Webhooks>);

/// The validating webhooks, as an admission plug-in.
#[derive(Debug)]
pub struct ValidatingAdmissionWebhook(pub Arc<Webhooks>);

/// Fields a patch may not change.
fn identity(v: &Value) -> [Value; 5] {
    [
        v["apiVersion"].clone(),
        v["kind"].clone(),
        v["metadata"]["name"].clone(),
        v["metadata"]["namespace"].clone(),
        v["metadata"]["uid"].clone(),
    ]
}

#[async_trait]
impl Plugin for MutatingAdmissionWebhook {
    fn name(&self) -> &'static str {
        "MutatingAdmissionWebhook"
    }

    async fn mutate(
        &self,
        req: &Request<'_>,
        object: &mut (dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        if req.operation == Operation::Delete {
            return Ok(());
        }
        let Some((hooks, old)) = self.0.for_request(req, true) else {
            return Ok(());
        };
        let Some(mut current) = req.json.to_json(object) else {
            return Ok(());
        };
        let mut changes = 0usize;
        // Per webhook: the change count when it last saw the object (None: not called).
        let mut seen: Vec<Option<usize>> = vec![None; hooks.len()];
        for pass in 0..2 {
            for (i, hook) in hooks.iter().enumerate() {
                if pass == 1 && !(hook.reinvoke && seen[i].is_some_and(|s| s < changes)) {
                    continue;
                }
                let uid = new_uid();
                let request = Webhooks::review_request(req, &uid, &current, &old);
                match self.0.wants(hook, req, &current, &old, &request).await {
                    Ok(false) => continue,
                    Ok(true) => {}
                    Err(e) => match Webhooks::failed(hook, &e) {
                        Some(refusal) => return Err(refusal),
                        None => continue,
                    },
                }
                let patch = match self.0.call(hook, req, &request, &uid).await {
                    Ok(Verdict::Denied(e)) => return Err(e),
                    Ok(Verdict::Allowed(p)) => p,
                    Err(e) => match Webhooks::failed(hook, &e) {
                        Some(refusal) => return Err(refusal),
                        None => continue,
                    },
                };
                if let Some(patch) = patch {
                    let mut patched = current.clone();
                    json_patch::patch(&mut patched, &patch).map_err(|e| {
                        internal(format!(
                            "applying the patch of webhook {:?}: {e}",
                            hook.name
                        ))
                    })?;
                    if identity(&patched) != identity(&current) {
                        return Err(internal(format!(
                            "webhook {:?} may not change apiVersion, kind, metadata.name, \
                             metadata.namespace or metadata.uid",
                            hook.name
                        )));
                    }
                    if patched != current {
                        req.json.replace_from_json(object, patched).map_err(|e| {
                            internal(format!(
                                "the object patched by webhook {:?} does not decode: {e}",
                                hook.name
                            ))
                        })?;
                        // What the next webhook sees is the object as decoded.
                        current = req.json.to_json(object).unwrap_or(Value::Null);
                        changes += 1;
                    }
                }
                seen[i] = Some(changes);
            }
        }
        Ok(())
    }
}

/// A webhook's `warnings` become the client's `Warning` headers and its `auditAnnotations`
/// the audit event's `<webhook name>/<key>` annotations, as kube-apiserver records them
/// (also when the webhook refuses); an annotation whose key is not a qualified name is
/// dropped.
fn note_for_client(req: &Request<'_>, hook: &Hook, response: &Value) {
    let warnings = response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string);
    let annotations = response["auditAnnotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            let key = format!("{}/{k}", hook.name);
            let mut errs = Vec::new();
            crate::validation::check_qualified_name(&mut errs, "", &key);
            (errs.is_empty()).then(|| (key, v.as_str().unwrap_or("").to_string()))
        });
    crate::request::note_for_client(req.audit, warnings, annotations);
}

fn internal(message: String) -> ApiError {
    ApiError::internal_error(message)
}

#[async_trait]
impl Plugin for ValidatingAdmissionWebhook {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionWebhook"
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        let Some((hooks, old)) = self.0.for_request(req, false) else {
            return Ok(());
        };
        let current = if req.operation == Operation::Delete {
            Value::Null
        } else {
            req.json.to_json(object).unwrap_or(Value::Null)
        };
        let calls = hooks.iter().map(|hook| {
            let (current, old) = (&current, &old);
            async move {
                let uid = new_uid();
                let request = Webhooks::review_request(req, &uid, current, old);
                match self.0.wants(hook, req, current, old, &request).await {
                    Ok(false) => return None,
                    Ok(true) => {}
                    Err(e) => return Webhooks::failed(hook, &e),
                }
                match self.0.call(hook, req, &request, &uid).await {
                    Ok(Verdict::Allowed(_)) => None,
                    Ok(Verdict::Denied(e)) => Some(e),
                    Err(e) => Webhooks::failed(hook, &e),
                }
            }
        });
        // Every webhook is called at once; the first refusal in order is the answer.
        match futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .next()
        {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_match_with_kubernetes_wildcards() {
        for (pattern, res, sub, want) in [
            ("pods", "pods", "", true),
            ("pods", "pods", "status", false),
            ("pods/status", "pods", "status", true),
            ("pods/*", "pods", "status", true),
            ("pods/*", "pods", "", true),
            ("*/status", "deployments", "status", true),
            ("*", "deployments", "", true),
            ("*", "deployments", "scale", false),
            ("*/*", "deployments", "scale", true),
            ("*/*", "deployments", "", true),
            ("services", "pods", "", false),
        ] {
            assert_eq!(
                resource_matches(pattern, res, sub),
                want,
                "{pattern} vs {res}/{sub}"
            );
        }
    }

    #[test]
    fn denials_read_as_kubernetes_writes_them() {
        let e = denial(
            "deny.example.com",
            &json!({"code": 403, "message": "no", "reason": "Forbidden"}),
        );
        assert_eq!(e.http(), (403, "Forbidden"));
        assert_eq!(
            e.to_string(),
            "admission webhook \"deny.example.com\" denied the request: no"
        );
        let e = denial("deny.example.com", &json!({"code": 200}));
        assert_eq!(e.http(), (400, ""));
        assert_eq!(
            e.to_string(),
            "admission webhook \"deny.example.com\" denied the request without explanation"
        );
        let e = denial("d.e.f", &json!({"reason": "made-up"}));
        assert_eq!(e.http(), (400, ""));
        assert!(e.to_string().ends_with("denied the request: made-up"));
    }

    /// The CVE-2021-25735 class: a webhook deciding on an update must see the whole stored
    /// object, not a copy with fields dropped.
    #[test]
    fn updates_send_the_whole_old_object() {
        use skiff_api::api::{Node, NodeSpec, ObjectMeta, Taint};
        let dir = tempfile::tempdir().expect("tempdir");
        let store = skiff_store::EmbeddedStore::open(
            &dir.path().join("s.redb"),
            skiff_store::EmbeddedOptions::default(),
        )
        .expect("store");
        let old = Node {
            metadata: Some(ObjectMeta {
                name: "n1".into(),
                labels: [("zone".to_string(), "a".to_string())].into(),
                ..Default::default()
            }),
            spec: Some(NodeSpec {
                taints: vec![Taint {
                    key: "dedicated".into(),
                    value: "db".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut new = old.clone();
        if let Some(s) = new.spec.as_mut() {
            s.taints.clear();
        }
        let json = super::super::interface::JsonOf::<Node>(Default::default());
        let req = Request::new(
            Operation::Update,
            &Node::INFO,
            "",
            "",
            "n1",
            Some(&old),
            None,
            false,
            &json,
            &store,
        );
        let object = req.json.to_json(&new).expect("a node");
        let old_json = req.json.to_json(&old).expect("a node");
        let r = Webhooks::review_request(&req, "u1", &object, &old_json);
        assert_eq!(r["operation"], "UPDATE");
        assert_eq!(
            r["oldObject"]["spec"]["taints"][0]["key"], "dedicated",
            "{r}"
        );
        assert_eq!(r["oldObject"]["metadata"]["labels"]["zone"], "a", "{r}");
        assert!(r["object"]["spec"].get("taints").is_none(), "{r}");
        assert!(
            r.get("namespace").is_none(),
            "a cluster-scoped kind has none: {r}"
        );
        assert_eq!(
            r["kind"],
            json!({"group": "", "version": "v1", "kind": "Node"})
        );
        assert_eq!(r["resource"]["resource"], "nodes");
    }

    #[test]
    fn patches_may_not_rename_an_object() {
        let a =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "n"}});
        let mut b = a.clone();
        b["metadata"]["labels"] = json!({"x": "y"});
        assert_eq!(identity(&a), identity(&b));
        b["metadata"]["name"] = json!("other");
        assert_ne!(identity(&a), identity(&b));
    }
}
