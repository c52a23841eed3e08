//! Kubernetes' `field.Error` and `field.Path`, as far as this crate needs them.

use std::fmt;

use crate::gofmt;

/// The kind of a [`FieldError`], as Kubernetes' `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `FieldValueRequired`: "Required value".
    Required,
    /// `FieldValueInvalid`: "Invalid value".
    Invalid,
    /// `FieldValueTypeInvalid`: printed as "Invalid value" too.
    TypeInvalid,
    /// `FieldValueNotSupported`: "Unsupported value".
    NotSupported,
    /// `FieldValueDuplicate`: "Duplicate value".
    Duplicate,
    /// `FieldValueForbidden`: "Forbidden".
    Forbidden,
    /// `FieldValueTooLong`: "Too long".
    TooLong,
    /// `FieldValueTooMany`: "Too many".
    TooMany,
    /// `FieldValueNotFound`: "Not found".
    NotFound,
}

impl ErrorKind {
    /// The `reason`/`type` string of a Kubernetes `StatusCause` (e.g. `FieldValueInvalid`).
    pub fn reason(self) -> &'static str {
        match self {
            ErrorKind::Required => "FieldValueRequired",
            ErrorKind::Invalid => "FieldValueInvalid",
            ErrorKind::TypeInvalid => "FieldValueTypeInvalid",
            ErrorKind::NotSupported => "FieldValueNotSupported",
            ErrorKind::Duplicate => "FieldValueDuplicate",
            ErrorKind::Forbidden => "FieldValueForbidden",
            ErrorKind::TooLong => "FieldValueTooLong",
            ErrorKind::TooMany => "FieldValueTooMany",
            ErrorKind::NotFound => "FieldValueNotFound",
        }
    }

    /// The words `field.ErrorType.String()` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Required => "Required value",
            ErrorKind::Invalid | ErrorKind::TypeInvalid => "Invalid value",
            ErrorKind::NotSupported => "Unsupported value",
            ErrorKind::Duplicate => "Duplicate value",
            ErrorKind::Forbidden => "Forbidden",
            ErrorKind::TooLong => "Too long",
            ErrorKind::TooMany => "Too many",
            ErrorKind::NotFound => "Not found",
        }
    }
}

/// One problem with a field, as Kubernetes' `field.Error`.
///
/// `Display` prints exactly what `field.Error.Error()` prints in Kubernetes
/// 1.32, e.g. `spec.replicas: Invalid value: "string": spec.replicas in body
/// must be of type integer: "string"` or `spec.name: Required value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field path, e.g. `spec.ports[1]`; `<nil>` for the object itself.
    pub path: String,
    /// The kind of error.
    pub kind: ErrorKind,
    /// The bad value, already formatted as Kubernetes prints it (strings
    /// quoted, numbers bare, objects in Go's `%#v`), or `None` where
    /// Kubernetes prints none (Required, Forbidden, Too long).
    pub value: Option<String>,
    /// The detail message, possibly empty.
    pub detail: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.kind.as_str())?;
        match self.kind {
            ErrorKind::Required | ErrorKind::Forbidden | ErrorKind::TooLong => {}
            _ => {
                if let Some(v) = &self.value {
                    write!(f, ": {v}")?;
                }
            }
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for FieldError {}

impl FieldError {
    fn new(
        path: &FPath,
        kind: ErrorKind,
        value: Option<String>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            path: path.render(),
            kind,
            value,
            detail: detail.into(),
        }
    }
    pub(crate) fn required(path: &FPath, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Required, None, detail)
    }
    pub(crate) fn forbidden(path: &FPath, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Forbidden, None, detail)
    }
    /// `field.Invalid` with a value already formatted.
    pub(crate) fn invalid(path: &FPath, value: String, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Invalid, Some(value), detail)
    }
    /// `field.Invalid` with a string value (printed quoted).
    pub(crate) fn invalid_str(path: &FPath, value: &str, detail: impl Into<String>) -> Self {
        Self::invalid(path, gofmt::quote(value), detail)
    }
    pub(crate) fn type_invalid(path: &FPath, value: String, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::TypeInvalid, Some(value), detail)
    }
    /// `field.NotSupported`: detail lists the supported values, each quoted.
    pub(crate) fn not_supported(path: &FPath, value: String, supported: &[String]) -> Self {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|s| gofmt::quote(s)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(path, ErrorKind::NotSupported, Some(value), detail)
    }
    pub(crate) fn duplicate(path: &FPath, value: String) -> Self {
        Self::new(path, ErrorKind::Duplicate, Some(value), "")
    }
    /// `field.TooLongMaxLength` (Kubernetes 1.32 wording).
    pub(crate) fn too_long(path: &FPath, max: i64) -> Self {
        let detail = if max >= 0 {
            format!("may not be longer than {max}")
        } else {
            "value is too long".to_string()
        };
        Self::new(path, ErrorKind::TooLong, None, detail)
    }
    /// `field.TooMany` (Kubernetes 1.32 wording).
    pub(crate) fn too_many(path: &FPath, actual: i64, max: i64) -> Self {
        let detail = if max >= 0 {
            format!("must have at most {max} items")
        } else {
            "has too many items".to_string()
        };
        let value = if actual >= 0 {
            Some(actual.to_string())
        } else {
            None
        };
        Self::new(path, ErrorKind::TooMany, value, detail)
    }
}

/// Kubernetes' `field.Path`: `None` is the nil path, printed `<nil>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FPath(Option<String>);

impl FPath {
    /// The nil path.
    pub(crate) fn root() -> Self {
        FPath(None)
    }
    /// A path from its printed form (`""` is the nil path).
    pub(crate) fn parse(s: &str) -> Self {
        if s.is_empty() {
            FPath(None)
        } else {
            FPath(Some(s.to_string()))
        }
    }
    pub(crate) fn child(&self, name: &str) -> Self {
        match &self.0 {
            None => FPath(Some(name.to_string())),
            Some(p) => FPath(Some(format!("{p}.{name}"))),
        }
    }
    pub(crate) fn index(&self, i: usize) -> Self {
        match &self.0 {
            None => FPath(Some(format!("[{i}]"))),
            Some(p) => FPath(Some(format!("{p}[{i}]"))),
        }
    }
    pub(crate) fn key(&self, k: &str) -> Self {
        match &self.0 {
            None => FPath(Some(format!("[{k}]"))),
            Some(p) => FPath(Some(format!("{p}[{k}]"))),
        }
    }
    pub(crate) fn render(&self) -> String {
        self.0.clone().unwrap_or_else(|| "<nil>".to_string())
    }
}

/// A kube-openapi name (`spec.items[0].name`; `.key` for a key of additionalProperties at
/// the root), written out only when an error needs it: validation and pruning visit every
/// field of every object, and formatting each field's name was a tenth of a custom-resource
/// create.
#[derive(Clone, Copy)]
pub(crate) enum Name<'a> {
    Root,
    /// `parent.field`, or `field` at the root.
    Field(&'a Name<'a>, &'a str),
    /// `parent.key`, `.key` at the root.
    Key(&'a Name<'a>, &'a str),
    Index(&'a Name<'a>, usize),
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Name::Root => Ok(()),
            Name::Field(Name::Root, k) => f.write_str(k),
            Name::Field(p, k) | Name::Key(p, k) => write!(f, "{p}.{k}"),
            Name::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
}

/// A field path built as a walk descends, made an [`FPath`] only for an error.
#[derive(Clone, Copy)]
pub(crate) enum At<'a> {
    Path(&'a FPath),
    Child(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
    Key(&'a At<'a>, &'a str),
}

impl At<'_> {
    pub(crate) fn path(&self) -> FPath {
        match self {
            At::Path(p) => (*p).clone(),
            At::Child(a, k) => a.path().child(k),
            At::Index(a, i) => a.path().index(*i),
            At::Key(a, k) => a.path().key(k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_matches_field_error() {
        let p = FPath::parse("spec.x");
        assert_eq!(
            FieldError::required(&p, "").to_string(),
            "spec.x: Required value"
        );
        assert_eq!(
            FieldError::invalid_str(&p, "x", "bad").to_string(),
            "spec.x: Invalid value: \"x\": bad"
        );
        assert_eq!(
            FieldError::not_supported(&p, "\"c\"".into(), &["a".into(), "b".into()]).to_string(),
            "spec.x: Unsupported value: \"c\": supported values: \"a\", \"b\""
        );
        assert_eq!(
            FieldError::too_long(&p, 3).to_string(),
            "spec.x: Too long: may not be longer than 3"
        );
        assert_eq!(
            FieldError::too_many(&p, 4, 3).to_string(),
            "spec.x: Too many: 4: must have at most 3 items"
        );
        assert_eq!(
            FieldError::forbidden(&p, "no").to_string(),
            "spec.x: Forbidden: no"
        );
        assert_eq!(
            FieldError::duplicate(&p, "\"a\"".into()).to_string(),
            "spec.x: Duplicate value: \"a\""
        );
        assert_eq!(
            FPath::root().child("a").index(1).key("k").render(),
            "a[1][k]"
        );
        assert_eq!(FPath::root().render(), "<nil>");
    }
}
