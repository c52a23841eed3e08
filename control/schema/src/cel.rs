//! `x-kubernetes-validations`: CEL rules, compiled when the schema is built
//! and evaluated with a cost budget, following
//! staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go
//! (runtime messages) and .../pkg/apis/apiextensions/validation/validation.go
//! (checks when the CRD is written).
//!
//! Cost: the CEL interpreter (the `cel` crate) has no cost accounting, so
//! every compiled rule is rewritten: each function or operator call, each
//! variable reference and field selection, and each comprehension range is
//! wrapped in a hidden call that charges its size (1 + the list or map
//! length, or 1 + the string length / 8) to a counter, and cancels the
//! evaluation once the per-call limit is used up. Every iteration of a
//! comprehension evaluates at least one charged node or was charged with its
//! range, so the work done is bounded by a constant times the charged cost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, operators};
use cel::{Context, Env, ExecutionError, IdedExpr, Value as CelValue};
use serde_json::{Map, Value};

use crate::error::{FPath, FieldError};
use crate::gofmt::{self, quote};
use crate::node::Node;

/// celconfig.PerCallLimit: the cost one evaluation of one rule may use.
pub(crate) const PER_CALL_LIMIT: u64 = 1_000_000;
/// celconfig.RuntimeCELCostBudget: the cost all rules of one object may use.
pub(crate) const RUNTIME_BUDGET: u64 = 10_000_000;
/// Rules nested deeper than this (in their syntax tree) are refused.
const MAX_EXPR_DEPTH: usize = 100;
/// Rules longer than this are refused before parsing.
const MAX_RULE_LEN: usize = 100_000;
/// celconfig.MaxEvaluatedMessageExpressionSizeBytes.
const MAX_MESSAGE_EXPRESSION_BYTES: usize = 5 * 1024;
const COST_FN: &str = "@skiff_cost";
const REASONS: &[&str] = &[
    "FieldValueDuplicate",
    "FieldValueForbidden",
    "FieldValueInvalid",
    "FieldValueRequired",
];

/// One `x-kubernetes-validations` entry as written.
#[derive(Debug, Clone, Default)]
pub(crate) struct RuleSpec {
    pub rule: String,
    pub message: String,
    pub message_expression: String,
    pub reason: Option<String>,
    pub field_path: String,
    pub optional_old_self: Option<bool>,
}

impl RuleSpec {
    /// Go's `%#v` of an apiextensions.ValidationRule, the bad value of
    /// compilation errors.
    fn go_value(&self) -> String {
        let reason = match &self.reason {
            None => "(*apiextensions.FieldValueErrorReason)(nil)".to_string(),
            Some(r) => format!("&{}", quote(r)),
        };
        let oos = match self.optional_old_self {
            None => "(*bool)(nil)".to_string(),
            Some(b) => format!("&{b}"),
        };
        format!(
            "apiextensions.ValidationRule{{Rule:{}, Message:{}, MessageExpression:{}, Reason:{reason}, FieldPath:{}, OptionalOldSelf:{oos}}}",
            quote(&self.rule),
            quote(&self.message),
            quote(&self.message_expression),
            quote(&self.field_path)
        )
    }

    /// ruleErrorString: the message if any, else the rule.
    fn error_string(&self) -> String {
        if !self.message.is_empty() {
            self.message.trim().to_string()
        } else {
            self.rule.trim().to_string()
        }
    }
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    spec: RuleSpec,
    expr: Arc<IdedExpr>,
    message_expr: Option<Arc<IdedExpr>>,
    uses_old_self: bool,
    /// The normalized fieldPath, appended to the error path.
    field_path: Option<String>,
}

pub(crate) fn parse_rule_specs(
    v: &Value,
    path: &FPath,
    errs: &mut Vec<FieldError>,
) -> Vec<RuleSpec> {
    let Some(list) = v.as_array() else {
        errs.push(FieldError::invalid(
            path,
            gofmt::bad_value(v),
            "must be an array",
        ));
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let p = path.index(i);
        let Some(obj) = item.as_object() else {
            errs.push(FieldError::invalid(
                &p,
                gofmt::bad_value(item),
                "must be an object",
            ));
            continue;
        };
        let mut spec = RuleSpec::default();
        for (k, val) in obj {
            let bad = |errs: &mut Vec<FieldError>, what: &str| {
                errs.push(FieldError::invalid(
                    &p.child(k),
                    gofmt::bad_value(val),
                    format!("must be {what}"),
                ))
            };
            match (k.as_str(), val) {
                ("rule", Value::String(s)) => spec.rule = s.clone(),
                ("message", Value::String(s)) => spec.message = s.clone(),
                ("messageExpression", Value::String(s)) => spec.message_expression = s.clone(),
                ("reason", Value::String(s)) => spec.reason = Some(s.clone()),
                ("fieldPath", Value::String(s)) => spec.field_path = s.clone(),
                ("optionalOldSelf", Value::Bool(b)) => spec.optional_old_self = Some(*b),
                ("optionalOldSelf", _) => bad(errs, "a boolean"),
                ("rule" | "message" | "messageExpression" | "reason" | "fieldPath", _) => {
                    bad(errs, "a string")
                }
                _ => errs.push(FieldError::forbidden(&p.child(k), "unknown field")),
            }
        }
        out.push(spec);
    }
    out
}

fn has_newlines(s: &str) -> bool {
    s.contains('\n') || s.contains('\r')
}

/// The per-rule checks of ValidateCustomResourceDefinitionOpenAPISchema
/// (those that need no compilation).
pub(crate) fn check_rule_specs(v: Option<&Value>, path: &FPath, errs: &mut Vec<FieldError>) {
    let Some(v) = v else { return };
    let mut ignored = Vec::new();
    let specs = parse_rule_specs(v, &path.child("x-kubernetes-validations"), &mut ignored);
    for (i, r) in specs.iter().enumerate() {
        let p = path.child("x-kubernetes-validations").index(i);
        let rule = r.rule.trim();
        let msg = r.message.trim();
        if rule.is_empty() {
            errs.push(FieldError::required(
                &p.child("rule"),
                "rule is not specified",
            ));
        } else if !r.message.is_empty() && msg.is_empty() {
            errs.push(FieldError::invalid_str(
                &p.child("message"),
                &r.message,
                "message must be non-empty if specified",
            ));
        } else if has_newlines(msg) {
            errs.push(FieldError::invalid_str(
                &p.child("message"),
                &r.message,
                "message must not contain line breaks",
            ));
        } else if has_newlines(rule) && msg.is_empty() {
            errs.push(FieldError::required(
                &p.child("message"),
                "message must be specified if rule contains line breaks",
            ));
        }
        if !r.message_expression.is_empty() && r.message_expression.trim().is_empty() {
            errs.push(FieldError::required(
                &p.child("messageExpression"),
                "messageExpression must be non-empty if specified",
            ));
        }
        if let Some(reason) = &r.reason
            && !REASONS.contains(&reason.as_str())
        {
            let supported: Vec<String> = REASONS.iter().map(|s| s.to_string()).collect();
            errs.push(FieldError::not_supported(
                &p.child("reason"),
                quote(reason),
                &supported,
            ));
        }
        if !r.field_path.is_empty() && r.field_path.trim().is_empty() {
            errs.push(FieldError::invalid_str(
                &p.child("fieldPath"),
                &r.field_path,
                "fieldPath must be non-empty if specified",
            ));
        }
        if has_newlines(&r.field_path) {
            errs.push(FieldError::invalid_str(
                &p.child("fieldPath"),
                &r.field_path,
                "fieldPath must not contain line breaks",
            ));
        }
    }
}

// ---------------------------------------------------------------------------
// Compilation
// ---------------------------------------------------------------------------

fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // Kubernetes' CEL environment includes the strings and math extensions.
        let _ = env.add_extension(cel::extensions::strings);
        let _ = env.add_extension(cel::extensions::math);
        Arc::new(env)
    })
}

/// Compiles every node's rules (on a thread with a large stack: the parser
/// recurses). `forbid_old_self` is the first uncorrelatable ancestor path.
pub(crate) fn compile_all(root: &mut Node, path: &FPath) -> Vec<FieldError> {
    let result = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn_scoped(scope, || {
                let mut errs = Vec::new();
                compile_node(root, path, None, &mut errs);
                errs
            })
            .map(|h| h.join())
    });
    match result {
        Ok(Ok(errs)) => errs,
        _ => vec![FieldError::invalid(
            &path.child("x-kubernetes-validations"),
            quote(""),
            "internal error: rule compilation failed",
        )],
    }
}

fn compile_node(
    n: &mut Node,
    path: &FPath,
    forbid_old_self: Option<&FPath>,
    errs: &mut Vec<FieldError>,
) {
    let specs = n.rule_specs.clone();
    let mut rules = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let p = path.child("x-kubernetes-validations").index(i);
        if spec.rule.trim().is_empty() {
            continue;
        }
        let expr = match compile_expr(&spec.rule, RULE_VARS) {
            Ok(e) => e,
            Err(msg) => {
                errs.push(FieldError::invalid(
                    &p.child("rule"),
                    spec.go_value(),
                    format!("compilation failed: {msg}"),
                ));
                continue;
            }
        };
        let message_expr = if spec.message_expression.trim().is_empty() {
            None
        } else {
            match compile_expr(&spec.message_expression, RULE_VARS) {
                Ok(e) => Some(Arc::new(e.0)),
                Err(msg) => {
                    errs.push(FieldError::invalid(
                        &p.child("messageExpression"),
                        spec.go_value(),
                        format!("messageExpression compilation failed: {msg}"),
                    ));
                    continue;
                }
            }
        };
        let uses_old_self = expr.1;
        if uses_old_self {
            if let Some(up) = forbid_old_self {
                errs.push(FieldError::invalid_str(
                    &p.child("rule"),
                    &spec.rule,
                    format!("oldSelf cannot be used on the uncorrelatable portion of the schema within {}", up.render()),
                ));
            }
        } else if let Some(b) = spec.optional_old_self {
            errs.push(FieldError::invalid(
                &p.child("optionalOldSelf"),
                b.to_string(),
                "may not be set if oldSelf is not used in rule",
            ));
        }
        let field_path = if spec.field_path.is_empty() {
            None
        } else {
            match normalize_field_path(&spec.field_path, n) {
                Some(fp) => Some(fp),
                None => {
                    errs.push(FieldError::invalid_str(
                        &p.child("fieldPath"),
                        &spec.field_path,
                        "fieldPath must be a valid path",
                    ));
                    None
                }
            }
        };
        rules.push(Rule {
            spec: spec.clone(),
            expr: Arc::new(expr.0),
            message_expr,
            uses_old_self,
            field_path,
        });
    }
    n.rules = rules;
    let map_correlatable = n.map_type.as_deref().is_none_or(|t| t == "granular");
    let here = path.clone();
    for (k, sub) in n.properties.iter_mut() {
        let f = if map_correlatable {
            forbid_old_self.cloned()
        } else {
            forbid_old_self.cloned().or(Some(here.clone()))
        };
        compile_node(sub, &path.child("properties").key(k), f.as_ref(), errs);
    }
    if let Some(crate::node::AddProps::Schema(ap)) = n.additional_properties.as_mut() {
        compile_node(
            ap,
            &path.child("additionalProperties"),
            forbid_old_self,
            errs,
        );
    }
    let list_map = n.list_type.as_deref() == Some("map");
    if let Some(items) = n.items.as_mut() {
        let f = if list_map {
            forbid_old_self.cloned()
        } else {
            forbid_old_self.cloned().or(Some(here.clone()))
        };
        compile_node(items, &path.child("items"), f.as_ref(), errs);
    }
}

/// Parses, checks the variables, the depth, and rewrites for cost.
/// The variables of a schema's rules.
const RULE_VARS: &[&str] = &["self", "oldSelf"];

/// Compiles `src`, whose free variables must be among `vars`; returns the rewritten
/// (cost-charging) expression and whether it uses `vars[1]` (`oldSelf`).
fn compile_expr(src: &str, vars: &[&str]) -> Result<(IdedExpr, bool), String> {
    if src.len() > MAX_RULE_LEN {
        return Err(format!("expression longer than {MAX_RULE_LEN} bytes"));
    }
    let program = env().compile(src).map_err(|e| e.to_string())?;
    let refs = program.references();
    let expr = program.expression();
    if depth(expr) > MAX_EXPR_DEPTH {
        return Err(format!(
            "expression nesting exceeds the maximum depth of {MAX_EXPR_DEPTH}"
        ));
    }
    let bound = bound_names(expr);
    let mut undeclared: Vec<&str> = refs
        .variables()
        .into_iter()
        .filter(|v| !vars.contains(v) && !bound.iter().any(|b| b == v) && !TYPE_NAMES.contains(v))
        .collect();
    undeclared.sort();
    if let Some(v) = undeclared.first() {
        return Err(format!(
            "ERROR: <input>:1:1: undeclared reference to '{v}' (in container '')"
        ));
    }
    let uses_old_self = vars.get(1).is_some_and(|v| refs.has_variable(v));
    let mut ids = u64::MAX / 2;
    let vars: Vec<String> = vars.iter().map(|v| v.to_string()).collect();
    Ok((rewrite(expr, &vars, &mut ids), uses_old_self))
}

/// Identifiers CEL declares besides variables: type names and namespaces.
const TYPE_NAMES: &[&str] = &[
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "math",
    "strings",
    "optional",
];

/// The names comprehensions bind (iteration and accumulator variables).
fn bound_names(e: &IdedExpr) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![e];
    while let Some(n) = stack.pop() {
        if let Expr::Comprehension(c) = &n.expr {
            out.push(c.iter_var.clone());
            out.extend(c.iter_var2.clone());
            out.push(c.accu_var.clone());
        }
        stack.extend(children(n));
    }
    out
}

fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
    match &e.expr {
        Expr::Call(c) => c
            .target
            .iter()
            .map(|t| t.as_ref())
            .chain(c.args.iter())
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|en| match &en.expr {
                EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                EntryExpr::StructField(sf) => vec![&sf.value],
            })
            .collect(),
        Expr::Struct(s) => s
            .entries
            .iter()
            .flat_map(|en| match &en.expr {
                EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                EntryExpr::StructField(sf) => vec![&sf.value],
            })
            .collect(),
        Expr::Select(s) => vec![&s.operand],
        _ => Vec::new(),
    }
}

/// The depth of a syntax tree, without recursion.
fn depth(e: &IdedExpr) -> usize {
    let mut max = 0;
    let mut stack = vec![(e, 1usize)];
    while let Some((n, d)) = stack.pop() {
        max = max.max(d);
        if d > MAX_EXPR_DEPTH {
            return d;
        }
        for c in children(n) {
            stack.push((c, d + 1));
        }
    }
    max
}

fn wrap(e: IdedExpr, ids: &mut u64) -> IdedExpr {
    *ids += 1;
    IdedExpr {
        id: *ids,
        expr: Expr::Call(CallExpr {
            func_name: COST_FN.to_string(),
            target: None,
            args: vec![e],
        }),
    }
}

/// Rewrites for cost accounting (see the module docs).
fn rewrite(e: &IdedExpr, vars: &[String], ids: &mut u64) -> IdedExpr {
    let id = e.id;
    match &e.expr {
        Expr::Ident(name) if vars.contains(name) => wrap(e.clone(), ids),
        Expr::Select(s) => {
            let mut s2 = s.clone();
            s2.operand = Box::new(rewrite(&s.operand, vars, ids));
            let out = IdedExpr {
                id,
                expr: Expr::Select(s2),
            };
            if s.test { out } else { wrap(out, ids) }
        }
        Expr::Call(c) => wrap(
            IdedExpr {
                id,
                expr: Expr::Call(rewrite_call_args(c, vars, ids)),
            },
            ids,
        ),
        Expr::List(l) => {
            let mut l2 = l.clone();
            l2.elements = l.elements.iter().map(|x| rewrite(x, vars, ids)).collect();
            IdedExpr {
                id,
                expr: Expr::List(l2),
            }
        }
        Expr::Map(m) => {
            let mut m2 = m.clone();
            for en in m2.entries.iter_mut() {
                match &mut en.expr {
                    EntryExpr::MapEntry(me) => {
                        me.key = rewrite(&me.key, vars, ids);
                        me.value = rewrite(&me.value, vars, ids);
                    }
                    EntryExpr::StructField(sf) => sf.value = rewrite(&sf.value, vars, ids),
                }
            }
            IdedExpr {
                id,
                expr: Expr::Map(m2),
            }
        }
        Expr::Comprehension(c) => {
            let mut inner: Vec<String> = vars.to_vec();
            inner.push(c.iter_var.clone());
            if let Some(v2) = &c.iter_var2 {
                inner.push(v2.clone());
            }
            inner.retain(|v| *v != c.accu_var);
            let c2 = ComprehensionExpr {
                iter_range: wrap(rewrite(&c.iter_range, vars, ids), ids),
                iter_var: c.iter_var.clone(),
                iter_var2: c.iter_var2.clone(),
                accu_var: c.accu_var.clone(),
                accu_init: rewrite(&c.accu_init, vars, ids),
                loop_cond: rewrite_step(&c.loop_cond, &c.accu_var, &inner, ids),
                loop_step: rewrite_step(&c.loop_step, &c.accu_var, &inner, ids),
                result: rewrite_step(&c.result, &c.accu_var, &inner, ids),
            };
            IdedExpr {
                id,
                expr: Expr::Comprehension(Box::new(c2)),
            }
        }
        _ => e.clone(),
    }
}

fn rewrite_call_args(c: &CallExpr, vars: &[String], ids: &mut u64) -> CallExpr {
    CallExpr {
        func_name: c.func_name.clone(),
        target: c.target.as_ref().map(|t| Box::new(rewrite(t, vars, ids))),
        args: c.args.iter().map(|a| rewrite(a, vars, ids)).collect(),
    }
}

/// The loop condition, step and result of a comprehension keep the shape
/// the interpreter recognises (`@result && x`, `@result + [x]`,
/// `c ? @result + [x] : @result`): calls on the accumulator are not wrapped.
fn rewrite_step(e: &IdedExpr, accu: &str, vars: &[String], ids: &mut u64) -> IdedExpr {
    let Expr::Call(c) = &e.expr else {
        return rewrite(e, vars, ids);
    };
    let on_accu = c
        .args
        .iter()
        .any(|a| matches!(&a.expr, Expr::Ident(n) if n == accu));
    if !on_accu
        && c.func_name != operators::CONDITIONAL
        && c.func_name != operators::NOT_STRICTLY_FALSE
    {
        return rewrite(e, vars, ids);
    }
    let args = c
        .args
        .iter()
        .map(|a| match &a.expr {
            Expr::Call(_) => rewrite_step(a, accu, vars, ids),
            _ => rewrite(a, vars, ids),
        })
        .collect();
    IdedExpr {
        id: e.id,
        expr: Expr::Call(CallExpr {
            func_name: c.func_name.clone(),
            target: c.target.as_ref().map(|t| Box::new(rewrite(t, vars, ids))),
            args,
        }),
    }
}

/// ValidFieldPath: `.a.b`, `['a']` segments through properties and
/// additionalProperties; returns the field.Path string.
fn normalize_field_path(fp: &str, n: &Node) -> Option<String> {
    let mut path = FPath::root();
    let mut node = n;
    let mut rest = fp;
    while !rest.is_empty() {
        let (name, remaining) = if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']")?;
            (r[..end].to_string(), &r[end + 2..])
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return None;
            }
            (r[..end].to_string(), &r[end..])
        } else {
            return None;
        };
        if !node.properties.is_empty() {
            node = node.properties.get(&name)?;
            path = path.child(&name);
        } else if let Some(ap) = node.additional_schema() {
            node = ap;
            path = path.key(&name);
        } else {
            return None;
        }
        rest = remaining;
    }
    Some(path.render())
}

// ---------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------

/// JSON to CEL, guided by the schema: `number` fields are doubles,
/// `date-time` strings timestamps, `byte` strings bytes; at a resource root
/// metadata shows only name and generateName.
fn to_cel(v: &Value, n: Option<&Node>, resource_root: bool) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(num) => {
            if n.is_some_and(|n| n.ty == "number") {
                CelValue::Float(num.as_f64().unwrap_or(0.0))
            } else if let Some(i) = num.as_i64() {
                CelValue::Int(i)
            } else {
                CelValue::Float(num.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => {
            match n.map(|n| n.format.as_str()) {
                Some("date-time") => {
                    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
                        return CelValue::Timestamp(t);
                    }
                }
                Some("byte") => {
                    use base64::Engine;
                    if let Ok(b) = base64::engine::general_purpose::STANDARD.decode(s) {
                        return CelValue::Bytes(Arc::new(b));
                    }
                }
                _ => {}
            }
            CelValue::String(Arc::new(s.clone()))
        }
        Value::Array(items) => {
            let is = n.and_then(|n| n.items.as_deref());
            CelValue::List(Arc::new(
                items
                    .iter()
                    .map(|i| to_cel(i, is, is.is_some_and(|s| s.embedded)))
                    .collect(),
            ))
        }
        Value::Object(m) => {
            let mut out: HashMap<String, CelValue> = HashMap::with_capacity(m.len());
            for (k, val) in m {
                if resource_root && k == "metadata" {
                    let mut meta: HashMap<String, CelValue> = HashMap::new();
                    for f in ["name", "generateName"] {
                        if let Some(Value::String(s)) = val.get(f) {
                            meta.insert(f.to_string(), CelValue::String(Arc::new(s.clone())));
                        }
                    }
                    out.insert(k.clone(), CelValue::from(meta));
                    continue;
                }
                let fs = n.and_then(|n| n.field_schema(k));
                out.insert(k.clone(), to_cel(val, fs, fs.is_some_and(|s| s.embedded)));
            }
            CelValue::from(out)
        }
    }
}

fn charge(v: &CelValue) -> u64 {
    match v {
        CelValue::List(l) => 1 + l.len() as u64,
        CelValue::Map(m) => 1 + m.map.len() as u64,
        CelValue::String(s) => 1 + s.len() as u64 / 8,
        CelValue::Bytes(b) => 1 + b.len() as u64 / 8,
        _ => 1,
    }
}

/// The outcome of one evaluation.
struct Eval {
    result: Result<CelValue, ExecutionError>,
    cost: u64,
    cancelled: bool,
}

fn evaluate(expr: &IdedExpr, self_val: &CelValue, old: Option<&CelValue>, limit: u64) -> Eval {
    let mut vars = vec![("self", self_val.clone())];
    if let Some(o) = old {
        vars.push(("oldSelf", o.clone()));
    }
    evaluate_with(expr, vars, limit)
}

/// Evaluates `expr` with these variables, cancelled once it has cost `limit`.
fn evaluate_with(expr: &IdedExpr, vars: Vec<(&str, CelValue)>, limit: u64) -> Eval {
    let used = Arc::new(AtomicU64::new(0));
    let cancelled = Arc::new(AtomicBool::new(false));
    let mut ctx = Context::with_env(Arc::clone(env()));
    for (name, value) in vars {
        ctx.add_variable_from_value(name, value);
    }
    let (u, c) = (Arc::clone(&used), Arc::clone(&cancelled));
    let added = ctx.add_function(
        COST_FN,
        move |v: CelValue| -> Result<CelValue, ExecutionError> {
            let cost = charge(&v);
            let total = u.fetch_add(cost, Ordering::Relaxed).saturating_add(cost);
            if total > limit {
                c.store(true, Ordering::Relaxed);
                return Err(ExecutionError::function_error(
                    "cost",
                    "operation cancelled: actual cost limit exceeded",
                ));
            }
            Ok(v)
        },
    );
    if added.is_err() {
        return Eval {
            result: Err(ExecutionError::function_error("cost", "internal error")),
            cost: 0,
            cancelled: false,
        };
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        CelValue::resolve(expr, &ctx)
    }))
    .unwrap_or_else(|_| Err(ExecutionError::function_error("eval", "internal error")));
    Eval {
        result,
        cost: used.load(Ordering::Relaxed),
        cancelled: cancelled.load(Ordering::Relaxed),
    }
}

/// Evaluates the CEL rules of a schema over an object (and its old version).
pub(crate) struct Evaluator {
    remaining: u64,
    stopped: bool,
    pub errs: Vec<FieldError>,
}

impl Evaluator {
    pub(crate) fn new() -> Self {
        Evaluator {
            remaining: RUNTIME_BUDGET,
            stopped: false,
            errs: Vec::new(),
        }
    }

    /// Runs on a thread with a large stack: the interpreter recurses.
    pub(crate) fn run(
        root: &Node,
        obj: &Value,
        old: Option<&Value>,
        base: &FPath,
        data_is_root: bool,
    ) -> Vec<FieldError> {
        let result = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .stack_size(64 << 20)
                .spawn_scoped(scope, || {
                    let mut ev = Evaluator::new();
                    ev.walk(root, obj, old, base, data_is_root);
                    ev.errs
                })
                .map(|h| h.join())
        });
        match result {
            Ok(Ok(errs)) => errs,
            _ => vec![FieldError::invalid(
                base,
                quote(&root.ty),
                "internal error evaluating validation rules",
            )],
        }
    }

    fn walk(
        &mut self,
        n: &Node,
        data: &Value,
        old: Option<&Value>,
        path: &FPath,
        resource_root: bool,
    ) {
        if self.stopped || data.is_null() {
            return;
        }
        if !n.rules.is_empty() {
            self.rules(n, data, old, path, resource_root);
        }
        if self.stopped {
            return;
        }
        match data {
            Value::Array(items) => {
                let Some(is) = n.items.as_deref() else { return };
                if !has_rules(is) {
                    return;
                }
                let old_items = old.and_then(Value::as_array);
                for (i, item) in items.iter().enumerate() {
                    let old_item = if n.list_type.as_deref() == Some("map") {
                        old_items.and_then(|o| find_by_keys(o, item, &n.list_map_keys))
                    } else {
                        None
                    };
                    self.walk(is, item, old_item, &path.index(i), is.embedded);
                    if self.stopped {
                        return;
                    }
                }
            }
            Value::Object(m) => {
                let correlatable = n.map_type.as_deref().is_none_or(|t| t == "granular");
                let old_map = if correlatable {
                    old.and_then(Value::as_object)
                } else {
                    None
                };
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                for k in keys {
                    let Some(v) = m.get(k) else { continue };
                    let old_v = old_map.and_then(|o| o.get(k));
                    if let Some(ps) = n.properties.get(k) {
                        if has_rules(ps) {
                            self.walk(ps, v, old_v, &path.child(k), ps.embedded);
                        }
                    } else if let Some(ap) = n.additional_schema()
                        && has_rules(ap)
                    {
                        self.walk(ap, v, old_v, &path.key(k), ap.embedded);
                    }
                    if self.stopped {
                        return;
                    }
                }
            }
            _ => {}
        }
    }

    fn rules(
        &mut self,
        n: &Node,
        data: &Value,
        old: Option<&Value>,
        path: &FPath,
        resource_root: bool,
    ) {
        let ty = quote(&n.ty);
        let self_val = to_cel(data, Some(n), resource_root);
        let old_val = old
            .filter(|o| !o.is_null())
            .map(|o| to_cel(o, Some(n), resource_root));
        for rule in &n.rules {
            let optional = rule.spec.optional_old_self == Some(true);
            if rule.uses_old_self && old_val.is_none() && !optional {
                // Transition rules only run where there is an old value.
                continue;
            }
            if self.remaining == 0 {
                self.errs.push(FieldError::invalid(
                    path,
                    ty.clone(),
                    "validation failed due to running out of cost budget, no further validation rules will be run",
                ));
                self.stopped = true;
                return;
            }
            let old_arg = if optional {
                Some(optional_of(old_val.as_ref()))
            } else {
                old_val.clone()
            };
            let limit = PER_CALL_LIMIT.min(self.remaining);
            let ev = evaluate(&rule.expr, &self_val, old_arg.as_ref(), limit);
            self.remaining = self.remaining.saturating_sub(ev.cost);
            let err_str = rule.spec.error_string();
            if ev.cancelled {
                let msg = if limit < PER_CALL_LIMIT {
                    "validation failed due to running out of cost budget, no further validation rules will be run".to_string()
                } else {
                    format!(
                        "'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {err_str}"
                    )
                };
                self.errs.push(FieldError::invalid(path, ty.clone(), msg));
                self.stopped = true;
                return;
            }
            match ev.result {
                Err(e) => {
                    // cel-go spells this one in lower case.
                    let mut text = e.to_string();
                    if let Some(rest) = text.strip_prefix("No such key: ") {
                        text = format!("no such key: {rest}");
                    }
                    let msg = if matches!(e, ExecutionError::NoSuchOverload(_)) {
                        format!(
                            "'{text}': call arguments did not match a supported operator, function or macro signature for rule: {err_str}"
                        )
                    } else {
                        format!("{text} evaluating rule: {err_str}")
                    };
                    self.errs.push(FieldError::invalid(path, ty.clone(), msg));
                }
                Ok(CelValue::Bool(true)) => {}
                Ok(CelValue::Bool(false)) => {
                    let p = match &rule.field_path {
                        Some(fp) => path.child(fp),
                        None => path.clone(),
                    };
                    let detail = self.message(rule, &self_val, old_arg.as_ref());
                    if self.stopped {
                        return;
                    }
                    self.errs.push(match rule.spec.reason.as_deref() {
                        Some("FieldValueForbidden") => FieldError::forbidden(&p, detail),
                        Some("FieldValueRequired") => FieldError::required(&p, detail),
                        Some("FieldValueDuplicate") => FieldError::duplicate(&p, ty.clone()),
                        _ => FieldError::invalid(&p, ty.clone(), detail),
                    });
                }
                Ok(other) => {
                    self.errs.push(FieldError::invalid(
                        path,
                        ty.clone(),
                        format!(
                            "rule evaluated to {}, not bool evaluating rule: {err_str}",
                            other.type_of()
                        ),
                    ));
                }
            }
        }
    }

    /// The detail of a failed rule: messageExpression if it evaluates to a
    /// usable string, else message, else `failed rule: <rule>`.
    fn message(&mut self, rule: &Rule, self_val: &CelValue, old: Option<&CelValue>) -> String {
        if let Some(me) = &rule.message_expr {
            let limit = PER_CALL_LIMIT.min(self.remaining);
            let ev = evaluate(me, self_val, old, limit);
            self.remaining = self.remaining.saturating_sub(ev.cost);
            if ev.cancelled {
                self.stopped = true;
                return String::new();
            }
            if let Ok(CelValue::String(s)) = ev.result {
                let t = s.trim();
                if !t.is_empty() && t.len() <= MAX_MESSAGE_EXPRESSION_BYTES && !t.contains('\n') {
                    return t.to_string();
                }
            }
        }
        if rule.spec.message.is_empty() {
            format!("failed rule: {}", rule.spec.rule.trim())
        } else {
            rule.spec.message.trim().to_string()
        }
    }
}

fn has_rules(n: &Node) -> bool {
    // Cheap enough: bounded by the schema size, and evaluation is per object.
    !n.rules.is_empty()
        || n.properties.values().any(has_rules)
        || n.additional_schema().is_some_and(has_rules)
        || n.items.as_deref().is_some_and(has_rules)
}

fn find_by_keys<'a>(old: &'a [Value], item: &Value, keys: &[String]) -> Option<&'a Value> {
    let item = item.as_object()?;
    old.iter().find(|o| {
        o.as_object()
            .is_some_and(|o: &Map<String, Value>| keys.iter().all(|k| o.get(k) == item.get(k)))
    })
}

/// `optional.of(v)` or `optional.none()` as a CEL value.
fn optional_of(v: Option<&CelValue>) -> CelValue {
    let src = if v.is_some() {
        "optional.of(x)"
    } else {
        "optional.none()"
    };
    let Ok(program) = env().compile(src) else {
        return CelValue::Null;
    };
    let mut ctx = Context::with_env(Arc::clone(env()));
    if let Some(v) = v {
        ctx.add_variable_from_value("x", v.clone());
    }
    program.execute(&ctx).unwrap_or(CelValue::Null)
}

/// A CEL expression over JSON variables, outside any schema (an admission webhook's
/// matchConditions: `object`, `oldObject`, `request`), compiled once and evaluated with the
/// per-call cost limit.
#[derive(Debug, Clone)]
pub struct Expression {
    expr: Arc<IdedExpr>,
    vars: Vec<String>,
}

impl Expression {
    /// Compiles `src`; every free variable must be one of `vars`. The error is CEL's
    /// (`ERROR: <input>:1:1: undeclared reference to 'x' (in container '')`).
    pub fn compile(src: &str, vars: &[&str]) -> Result<Expression, String> {
        let compiled = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .stack_size(64 << 20)
                .spawn_scoped(scope, || compile_expr(src, vars))
                .map(|h| h.join())
        });
        match compiled {
            Ok(Ok(Ok((expr, _)))) => Ok(Expression {
                expr: Arc::new(expr),
                vars: vars.iter().map(|v| v.to_string()).collect(),
            }),
            Ok(Ok(Err(e))) => Err(e),
            _ => Err("internal error: compilation failed".into()),
        }
    }

    /// Evaluates to any value, as JSON (a ValidatingAdmissionPolicy's variables and message
    /// expressions), with `values` as for [`Expression::eval_bool`].
    pub fn eval_value(&self, values: &[&Value]) -> Result<Value, String> {
        self.run(values)?.json().map_err(|e| e.to_string())
    }

    /// Evaluates to a boolean with `values` (in the order of the compiled variables; a
    /// missing value is `null`).
    pub fn eval_bool(&self, values: &[&Value]) -> Result<bool, String> {
        match self.run(values)? {
            CelValue::Bool(b) => Ok(b),
            other => Err(format!("expected a boolean, got {:?}", other.type_of())),
        }
    }

    fn run(&self, values: &[&Value]) -> Result<CelValue, String> {
        let vars: Vec<(&str, CelValue)> = self
            .vars
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let v = values.get(i).copied().unwrap_or(&Value::Null);
                (name.as_str(), to_cel(v, None, false))
            })
            .collect();
        let ev = evaluate_with(&self.expr, vars, PER_CALL_LIMIT);
        if ev.cancelled {
            return Err("operation cancelled: actual cost limit exceeded".into());
        }
        ev.result.map_err(|e| e.to_string())
    }
}
