//! Secrets: `stringData` merged into `data` on every write (never stored), `type` defaulted
//! to `Opaque`, Kubernetes' key, size and per-type checks, and `immutable`. No message ever
//! shows a value: where Kubernetes would show one it says `<secret contents redacted>`.
//!
//! ConfigMaps are here too: the same key rule and 1 MiB limit over `data` and `binaryData`
//! together, a key in only one of them, and `immutable`.

use skiff_api::api::{ConfigMap, Secret};

use super::Strategy;
use crate::error::FieldError;

/// The largest total size of a Secret's data, as Kubernetes limits it.
const MAX_SECRET_BYTES: usize = 1024 * 1024;
const REDACTED: &str = "<secret contents redacted>";

/// Kubernetes' config key rule (`[-._a-zA-Z0-9]+`, not `.` or `..`, at most 253).
fn check_key(out: &mut Vec<FieldError>, path: &str, key: &str) {
    let valid = !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !valid {
        out.push(FieldError::invalid(
            path,
            key,
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' \
             (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is \
             '[-._a-zA-Z0-9]+')",
        ));
    }
}

impl Strategy for Secret {
    fn default(&mut self) {
        let string_data = std::mem::take(&mut self.string_data);
        for (k, v) in string_data {
            self.data.insert(k, v.into_bytes());
        }
        if self.r#type.is_empty() {
            self.r#type = "Opaque".into();
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let mut total = 0;
        for (k, v) in &self.data {
            check_key(&mut out, &format!("data[{k}]"), k);
            total += v.len();
        }
        if total > MAX_SECRET_BYTES {
            out.push(FieldError::too_long("data", MAX_SECRET_BYTES));
        }
        let need = |out: &mut Vec<FieldError>, key: &str| {
            if !self.data.contains_key(key) {
                out.push(FieldError::required(format!("data[{key}]"), ""));
            }
        };
        match self.r#type.as_str() {
            "kubernetes.io/dockerconfigjson" => {
                need(&mut out, ".dockerconfigjson");
                if let Some(v) = self.data.get(".dockerconfigjson")
                    && let Err(e) = serde_json::from_slice::<serde_json::Value>(v)
                {
                    out.push(FieldError::invalid(
                        "data[.dockerconfigjson]",
                        REDACTED,
                        format!("not JSON: {}", e.classify_message()),
                    ));
                }
            }
            "kubernetes.io/dockercfg" => need(&mut out, ".dockercfg"),
            "kubernetes.io/basic-auth"
                if !self.data.contains_key("username") && !self.data.contains_key("password") =>
            {
                out.push(FieldError::required(
                    "data[username]",
                    "either username or password is required",
                ));
            }
            "kubernetes.io/ssh-auth" => need(&mut out, "ssh-privatekey"),
            "kubernetes.io/tls" => {
                need(&mut out, "tls.crt");
                need(&mut out, "tls.key");
            }
            _ => {}
        }
        out
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        if self.r#type != old.r#type {
            out.push(FieldError::immutable("type", &self.r#type));
        }
        check_immutable(
            &mut out,
            old.immutable,
            self.immutable,
            &[("data", self.data != old.data)],
        );
        out
    }
}

/// `immutable: true` holds: it stays set and the fields named (with whether they changed)
/// keep their values.
fn check_immutable(
    out: &mut Vec<FieldError>,
    old: Option<bool>,
    new: Option<bool>,
    fields: &[(&str, bool)],
) {
    if old != Some(true) {
        return;
    }
    const WHY: &str = "field is immutable when `immutable` is set";
    if new != Some(true) {
        out.push(FieldError::forbidden("immutable", WHY));
    }
    for (field, changed) in fields {
        if *changed {
            out.push(FieldError::forbidden(*field, WHY));
        }
    }
}

/// ConfigMaps: the same key rule and 1 MiB limit as Secrets over `data` and `binaryData`
/// together, a key in only one of them, and `immutable` (values may be shown: ConfigMaps are
/// not secret).
impl Strategy for ConfigMap {
    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let mut total = 0;
        for (k, v) in &self.data {
            check_key(&mut out, &format!("data[{k}]"), k);
            total += k.len() + v.len();
        }
        for (k, v) in &self.binary_data {
            check_key(&mut out, &format!("binaryData[{k}]"), k);
            if self.data.contains_key(k) {
                out.push(FieldError::invalid(
                    format!("binaryData[{k}]"),
                    k,
                    "duplicate of key present in data",
                ));
            }
            total += k.len() + v.len();
        }
        if total > MAX_SECRET_BYTES {
            out.push(FieldError::too_long("", MAX_SECRET_BYTES));
        }
        out
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        check_immutable(
            &mut out,
            old.immutable,
            self.immutable,
            &[
                ("data", self.data != old.data),
                ("binaryData", self.binary_data != old.binary_data),
            ],
        );
        out
    }
}

/// A serde_json error's category, without the input it quotes.
trait Classify {
    fn classify_message(&self) -> String;
}

impl Classify for serde_json::Error {
    fn classify_message(&self) -> String {
        format!(
            "{:?} error at line {} column {}",
            self.classify(),
            self.line(),
            self.column()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(ty: &str, data: &[(&str, &[u8])]) -> Secret {
        Secret {
            r#type: ty.into(),
            data: data
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
            ..Default::default()
        }
    }

    fn messages(v: Vec<FieldError>) -> Vec<String> {
        v.into_iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn string_data_merges_and_type_defaults() {
        let mut s = secret("", &[("a", b"1")]);
        s.string_data.insert("b".into(), "two".into());
        s.string_data.insert("a".into(), "one".into());
        s.default();
        assert!(s.string_data.is_empty());
        assert_eq!(s.data["a"], b"one");
        assert_eq!(s.data["b"], b"two");
        assert_eq!(s.r#type, "Opaque");
    }

    #[test]
    fn keys_types_and_sizes_are_checked_without_showing_values() {
        let m = messages(secret("Opaque", &[("bad key", b"s3cret")]).validate());
        assert!(
            m[0].starts_with("data[bad key]: Invalid value: \"bad key\": a valid config key"),
            "{m:?}"
        );
        let m = messages(
            secret(
                "kubernetes.io/dockerconfigjson",
                &[(".dockerconfigjson", b"{s3cret")],
            )
            .validate(),
        );
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].starts_with(
                "data[.dockerconfigjson]: Invalid value: \"<secret contents redacted>\": not JSON"
            ),
            "{m:?}"
        );
        assert!(!m[0].contains("s3cret"));
        let m = messages(secret("kubernetes.io/tls", &[("tls.crt", b"x")]).validate());
        assert_eq!(m, ["data[tls.key]: Required value"]);
        let big = vec![0u8; MAX_SECRET_BYTES + 1];
        let m = messages(secret("Opaque", &[("big", &big)]).validate());
        assert_eq!(m, ["data: Too long: must have at most 1048576 bytes"]);
    }

    #[test]
    fn immutable_secrets_stay_as_they_are() {
        let mut old = secret("Opaque", &[("a", b"1")]);
        old.immutable = Some(true);
        let mut new = old.clone();
        new.data.insert("a".into(), b"2".to_vec());
        assert_eq!(
            messages(new.validate_update(&old)),
            ["data: Forbidden: field is immutable when `immutable` is set"]
        );
        let mut retyped = old.clone();
        retyped.r#type = "kubernetes.io/tls".into();
        assert!(messages(retyped.validate_update(&old))[0].starts_with("type: Invalid value"));
    }
}
