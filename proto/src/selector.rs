//! Label and field selectors, with Kubernetes' string syntax.
//!
//! Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a` (exists),
//! `!a` (does not exist), joined by commas (AND). Field selectors: `path=value`, `path==value`,
//! `path!=value`, joined by commas.

use std::collections::BTreeMap;

use crate::api::LabelSelector;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid selector {selector:?}: {reason}")]
pub struct SelectorError {
    pub selector: String,
    pub reason: String,
}

fn err(selector: &str, reason: impl Into<String>) -> SelectorError {
    SelectorError {
        selector: selector.to_string(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A parsed label selector. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub requirements: Vec<Requirement>,
}

impl Selector {
    pub fn everything() -> Self {
        Selector::default()
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Parses the string syntax.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_terms(text).map_err(|r| err(text, r))? {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let req = parse_term(term).map_err(|r| err(text, r))?;
            check_requirement(&req).map_err(|r| err(text, r))?;
            requirements.push(req);
        }
        Ok(Selector { requirements })
    }

    /// Converts a `LabelSelector` (matchLabels + matchExpressions). Kubernetes treats a
    /// missing selector as matching nothing in some places and everything in others; this
    /// converts only the present one.
    pub fn from_label_selector(sel: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements: Vec<Requirement> = sel
            .match_labels
            .iter()
            .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
            .collect();
        for (i, e) in sel.match_expressions.iter().enumerate() {
            let at = |r: &str| err(&format!("matchExpressions[{i}]"), r.to_string());
            let values = e.values.clone();
            requirements.push(match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(at("operator In and NotIn need at least one value"));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(at("operator Exists and DoesNotExist take no values"));
                }
                "In" => Requirement::In(e.key.clone(), values),
                "NotIn" => Requirement::NotIn(e.key.clone(), values),
                "Exists" => Requirement::Exists(e.key.clone()),
                "DoesNotExist" => Requirement::DoesNotExist(e.key.clone()),
                other => {
                    return Err(at(&format!(
                        "unknown operator {other:?} (want In, NotIn, Exists or DoesNotExist)"
                    )));
                }
            });
        }
        Ok(Selector { requirements })
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Splits on commas that are not inside parentheses.
fn split_terms(text: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced ')'".into());
                }
            }
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '('".into());
    }
    terms.push(&text[start..]);
    Ok(terms)
}

fn check_key(key: &str) -> Result<String, String> {
    let key = key.trim();
    if key.is_empty() {
        return Err("empty label key".into());
    }
    if key.contains(char::is_whitespace) {
        return Err(format!("label key {key:?} contains whitespace"));
    }
    Ok(key.to_string())
}

fn parse_term(term: &str) -> Result<Requirement, String> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(check_key(key)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(check_key(k)?, v.trim().to_string()));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Requirement::Equals(check_key(k)?, v.trim().to_string()));
    }
    if let Some(open) = term.find('(') {
        let head = term[..open].trim();
        let close = term
            .rfind(')')
            .filter(|c| *c > open && term[c + 1..].trim().is_empty())
            .ok_or_else(|| format!("expected ')' at the end of {term:?}"))?;
        let values: Vec<String> = term[open + 1..close]
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Err(format!("{term:?} needs at least one value"));
        }
        let mut words = head.split_whitespace();
        let (key, op) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        if words.next().is_some() {
            return Err(format!("unexpected words in {term:?}"));
        }
        return match op {
            "in" => Ok(Requirement::In(check_key(key)?, values)),
            "notin" => Ok(Requirement::NotIn(check_key(key)?, values)),
            _ => Err(format!("expected 'in' or 'notin' in {term:?}")),
        };
    }
    Ok(Requirement::Exists(check_key(term)?))
}

/// Kubernetes' checks of a requirement's key and values (`labels.NewRequirement`), with its
/// message: `unable to parse requirement: values[0][app]: Invalid value: "-x": ...`.
fn check_requirement(req: &Requirement) -> Result<(), String> {
    let (key, values): (&str, &[String]) = match req {
        Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => (k, std::slice::from_ref(v)),
        Requirement::In(k, vs) | Requirement::NotIn(k, vs) => (k, vs),
        Requirement::Exists(k) | Requirement::DoesNotExist(k) => (k, &[]),
    };
    let key_errors = crate::names::qualified_name(key);
    if !key_errors.is_empty() {
        return Err(format!(
            "unable to parse requirement: key: Invalid value: {key:?}: {}",
            key_errors.join("; ")
        ));
    }
    for (i, v) in values.iter().enumerate() {
        let errors = crate::names::label_value(v);
        if !errors.is_empty() {
            return Err(format!(
                "unable to parse requirement: values[{i}][{key}]: Invalid value: {v:?}: {}",
                errors.join("; ")
            ));
        }
    }
    Ok(())
}

/// A parsed field selector: equality requirements on field paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// (path, value, equal): `equal` false for `!=`.
    pub requirements: Vec<(String, String, bool)>,
}

impl FieldSelector {
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (path, value, equal) = if let Some((p, v)) = term.split_once("!=") {
                (p, v, false)
            } else if let Some((p, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (p, v, true)
            } else {
                return Err(err(
                    text,
                    format!("{term:?} is not path=value or path!=value"),
                ));
            };
            requirements.push((path.trim().to_string(), value.trim().to_string(), equal));
        }
        Ok(FieldSelector { requirements })
    }

    /// The field paths this selector uses, to check them against a resource type.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.requirements.iter().map(|(p, _, _)| p.as_str())
    }

    /// Whether an object matches; `field` returns the value of a path (`None`: no such field,
    /// which never matches).
    pub fn matches(&self, field: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|(path, value, equal)| {
            field(path).is_some_and(|actual| (actual == *value) == *equal)
        })
    }

    /// The value the selector pins a path to with `=`, if any (e.g. `spec.nodeName`).
    pub fn equality(&self, path: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|(p, _, eq)| p == path && *eq)
            .map(|(_, v, _)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_operators() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web,db)", false),
            ("app notin (db)", true),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("missing notin (x)", true),
            ("missing in (x)", false),
            ("app=web,tier in (front,back),!canary", true),
            ("app=web,tier=back", false),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
    }

    #[test]
    fn bad_label_selectors_are_errors() {
        for sel in [
            "app in (",
            "app in ()",
            "app foo (x)",
            "a b",
            "=x",
            "app in (x) y",
        ] {
            assert!(Selector::parse(sel).is_err(), "{sel}");
        }
        // Keys and values follow the label rules, as kube-apiserver checks them.
        let e = Selector::parse("app=-web").unwrap_err();
        assert!(
            e.reason.starts_with(
                "unable to parse requirement: values[0][app]: Invalid value: \"-web\": a valid \
                 label must be"
            ),
            "{e}"
        );
        let e = Selector::parse("tier in (web, b@d)").unwrap_err();
        assert!(
            e.reason.contains("values[1][tier]: Invalid value: \"b@d\""),
            "{e}"
        );
        let e = Selector::parse("Bad_-/x").unwrap_err();
        assert!(e.reason.contains("key: Invalid value: \"Bad_-/x\""), "{e}");
        assert!(Selector::parse("example.com/app=Web_1,!x,y notin (a.b)").is_ok());
    }

    #[test]
    fn selector_display_round_trips() {
        let s = Selector::parse("a=b,c!=d,e in (f,g),h notin (i),j,!k").unwrap();
        assert_eq!(Selector::parse(&s.to_string()).unwrap(), s);
    }

    #[test]
    fn label_selector_message() {
        let sel = LabelSelector {
            match_labels: labels(&[("app", "web")]),
            match_expressions: vec![crate::api::LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: vec!["front".into()],
            }],
        };
        let s = Selector::from_label_selector(&sel).unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "front")])));
        assert!(!s.matches(&labels(&[("app", "web")])));
    }

    #[test]
    fn field_selectors() {
        let f = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed").unwrap();
        let get = |phase: &'static str| {
            move |p: &str| match p {
                "spec.nodeName" => Some("n1".to_string()),
                "status.phase" => Some(phase.to_string()),
                _ => None,
            }
        };
        assert!(f.matches(get("Running")));
        assert!(!f.matches(get("Failed")));
        assert_eq!(f.equality("spec.nodeName"), Some("n1"));
        assert!(FieldSelector::parse("nonsense").is_err());
        assert!(
            !FieldSelector::parse("spec.bogus=x")
                .unwrap()
                .matches(get("x"))
        );
    }
}
