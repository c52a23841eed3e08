//! The client's error type, mapped from gRPC statuses and transport failures.

use std::error::Error as StdError;

use skiff_api::manifest::ManifestError;
use tonic::{Code, Status};

/// The metadata key in which the API server sends the reason of an error.
pub const REASON_KEY: &str = "skiff-reason";

/// Why a call to the API server failed.
///
/// Errors that come from the server keep the server's message verbatim (it names the object
/// and, for validation errors, the field), so `Display` can be shown to users as is.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The object (or its namespace) does not exist.
    #[error("{message}")]
    NotFound { message: String },
    /// An object with that name already exists.
    #[error("{message}")]
    AlreadyExists { message: String },
    /// The object's resourceVersion is stale (or a precondition failed): get it again and
    /// retry.
    #[error("{message}")]
    Conflict { message: String },
    /// The server rejected the object or the request (validation, bad selector, ...). The
    /// message names the offending field.
    #[error("{message}")]
    Invalid { message: String },
    /// The requested resourceVersion is too old (compacted away): list again and watch from
    /// the new list's resourceVersion.
    #[error("{message}")]
    Expired { message: String },
    /// The API server did not accept the credentials (none, an expired or unknown token, a
    /// certificate of another CA): kubectl's wording.
    #[error("You must be logged in to the server ({message})")]
    Unauthorized { message: String },
    /// The credentials are good but do not allow the request.
    #[error("{message}")]
    Forbidden { message: String },
    /// The API server could not be reached at all.
    #[error(
        "cannot reach the Skiff API server at {endpoint}: {reason} (is it running? start one with `cargo xtask up`)"
    )]
    Unreachable { endpoint: String, reason: String },
    /// The configured server address is not a valid URL.
    #[error("invalid API server address {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    /// The client configuration file could not be read or parsed.
    #[error("client config {path}: {message}")]
    Config { path: String, message: String },
    /// Any other error status from the server (FailedPrecondition, Internal, Unavailable
    /// store, ...).
    #[error("{message}")]
    Other { code: Code, message: String },
    /// The server sent bytes that do not decode as the expected type.
    #[error("cannot decode a {what} sent by the API server: {source}")]
    Decode {
        what: String,
        #[source]
        source: prost::DecodeError,
    },
    /// An object given to the dynamic API does not encode as its kind.
    #[error("{0}")]
    Encode(#[from] ManifestError),
}

impl ClientError {
    /// Maps a gRPC status from a call to the server at `endpoint` (with several servers, the
    /// one the call went to, when the status says).
    ///
    /// The `skiff-reason` metadata wins over the status code; a status without a reason that
    /// was produced by the transport (connection refused, reset, ...) is
    /// [`ClientError::Unreachable`].
    pub fn from_status(status: Status, endpoint: &str) -> ClientError {
        let endpoint = status
            .source()
            .and_then(crate::failover::server_of)
            .unwrap_or(endpoint);
        let reason = status
            .metadata()
            .get(REASON_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let message = if status.message().is_empty() {
            format!("the API server returned {:?}", status.code())
        } else {
            status.message().to_string()
        };
        match reason.as_deref() {
            Some("NotFound") => return ClientError::NotFound { message },
            Some("AlreadyExists") => return ClientError::AlreadyExists { message },
            Some("Conflict") => return ClientError::Conflict { message },
            Some("Invalid") | Some("BadRequest") => return ClientError::Invalid { message },
            Some("Expired") => return ClientError::Expired { message },
            Some(_) => {
                return ClientError::Other {
                    code: status.code(),
                    message,
                };
            }
            None => {}
        }
        // No reason: either a server that did not set one, or the transport.
        if let Some(io) = status.source().and_then(find_io_error) {
            return ClientError::Unreachable {
                endpoint: endpoint.to_string(),
                reason: io_reason(io),
            };
        }
        // A request the transport gave up on because the connection closed under it (the
        // server went away after the request was sent) is tonic's Cancelled with the
        // transport error as source; a server's own Cancelled has no source.
        if status.code() == Code::Cancelled && status.source().is_some() {
            return ClientError::Unreachable {
                endpoint: endpoint.to_string(),
                reason: "the connection closed during the request".to_string(),
            };
        }
        match status.code() {
            Code::NotFound => ClientError::NotFound { message },
            Code::AlreadyExists => ClientError::AlreadyExists { message },
            Code::Aborted => ClientError::Conflict { message },
            Code::InvalidArgument => ClientError::Invalid { message },
            Code::OutOfRange => ClientError::Expired { message },
            Code::Unauthenticated => ClientError::Unauthorized { message },
            Code::PermissionDenied => ClientError::Forbidden { message },
            Code::Unavailable => ClientError::Unreachable {
                endpoint: endpoint.to_string(),
                reason: transport_reason_from_message(status.message()),
            },
            code => ClientError::Other { code, message },
        }
    }

    /// An error from establishing a connection to `endpoint`.
    pub fn unreachable(endpoint: &str, err: &(dyn StdError + 'static)) -> ClientError {
        ClientError::Unreachable {
            endpoint: endpoint.to_string(),
            reason: transport_reason(err),
        }
    }

    /// None of several servers could be reached: `failures` holds each URL and why. One
    /// line naming them all, with their reason when it is the same for all.
    pub(crate) fn unreachable_all(failures: &[(String, String)]) -> ClientError {
        let endpoint = failures
            .iter()
            .map(|(u, _)| u.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let reason = match failures {
            [(_, first), rest @ ..] if rest.iter().all(|(_, r)| r == first) => first.clone(),
            _ => failures
                .iter()
                .map(|(u, r)| format!("{u}: {r}"))
                .collect::<Vec<_>>()
                .join("; "),
        };
        ClientError::Unreachable { endpoint, reason }
    }

    pub(crate) fn decode(what: impl Into<String>, source: prost::DecodeError) -> ClientError {
        ClientError::Decode {
            what: what.into(),
            source,
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::NotFound { .. })
    }

    pub fn is_already_exists(&self) -> bool {
        matches!(self, ClientError::AlreadyExists { .. })
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, ClientError::Conflict { .. })
    }

    pub fn is_expired(&self) -> bool {
        matches!(self, ClientError::Expired { .. })
    }

    pub fn is_unreachable(&self) -> bool {
        matches!(self, ClientError::Unreachable { .. })
    }

    /// The gRPC code this error corresponds to.
    pub fn code(&self) -> Code {
        match self {
            ClientError::NotFound { .. } => Code::NotFound,
            ClientError::AlreadyExists { .. } => Code::AlreadyExists,
            ClientError::Conflict { .. } => Code::Aborted,
            ClientError::Invalid { .. } | ClientError::Encode(_) => Code::InvalidArgument,
            ClientError::Expired { .. } => Code::OutOfRange,
            ClientError::Unauthorized { .. } => Code::Unauthenticated,
            ClientError::Forbidden { .. } => Code::PermissionDenied,
            ClientError::Unreachable { .. } => Code::Unavailable,
            ClientError::InvalidEndpoint { .. } | ClientError::Config { .. } => {
                Code::InvalidArgument
            }
            ClientError::Other { code, .. } => *code,
            ClientError::Decode { .. } => Code::Internal,
        }
    }
}

fn find_io_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a std::io::Error> {
    let mut cur: Option<&'a (dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        cur = e.source();
    }
    None
}

fn io_reason(io: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match io.kind() {
        ConnectionRefused => "connection refused".into(),
        ConnectionReset => "connection reset".into(),
        ConnectionAborted => "connection aborted".into(),
        TimedOut => "connection timed out".into(),
        NotConnected | BrokenPipe => "connection closed".into(),
        AddrNotAvailable => "address not available".into(),
        HostUnreachable => "host unreachable".into(),
        NetworkUnreachable => "network unreachable".into(),
        _ => strip_os_error(&io.to_string()),
    }
}

/// "Connection refused (os error 111)" → "connection refused".
fn strip_os_error(msg: &str) -> String {
    let msg = match msg.find(" (os error") {
        Some(i) => &msg[..i],
        None => msg,
    };
    let mut chars = msg.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => "unknown error".into(),
    }
}

/// A short reason for a transport error: the I/O error at the bottom of the chain if there is
/// one, else the innermost message.
pub(crate) fn transport_reason(err: &(dyn StdError + 'static)) -> String {
    if let Some(io) = find_io_error(err) {
        return io_reason(io);
    }
    let mut last = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !s.is_empty() {
            last = s;
        }
        cur = e.source();
    }
    if last.to_ascii_lowercase().contains("timed out") {
        return "connection timed out".into();
    }
    strip_os_error(&last)
}

fn transport_reason_from_message(msg: &str) -> String {
    let lower = msg.to_ascii_lowercase();
    if lower.contains("connection refused") {
        "connection refused".into()
    } else if lower.contains("timed out") {
        "connection timed out".into()
    } else if lower.contains("connection reset") {
        "connection reset".into()
    } else if msg.is_empty() {
        "unavailable".into()
    } else {
        strip_os_error(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn status(code: Code, msg: &str, reason: Option<&'static str>) -> Status {
        let mut s = Status::new(code, msg);
        if let Some(r) = reason {
            s.metadata_mut()
                .insert(REASON_KEY, MetadataValue::from_static(r));
        }
        s
    }

    const EP: &str = "http://127.0.0.1:7443";

    #[test]
    fn maps_reason_metadata_first() {
        let e = ClientError::from_status(status(Code::Aborted, "stale", Some("Conflict")), EP);
        assert!(e.is_conflict());
        assert_eq!(e.to_string(), "stale");
        let e = ClientError::from_status(
            status(
                Code::InvalidArgument,
                "spec.replicas: must be >= 0",
                Some("Invalid"),
            ),
            EP,
        );
        assert!(
            matches!(&e, ClientError::Invalid { message } if message.contains("spec.replicas"))
        );
        let e = ClientError::from_status(status(Code::OutOfRange, "too old", Some("Expired")), EP);
        assert!(e.is_expired());
        // A reason set by the server on Unavailable is a server error, not "unreachable".
        let e = ClientError::from_status(
            status(Code::Unavailable, "store down", Some("Internal")),
            EP,
        );
        assert!(matches!(
            e,
            ClientError::Other {
                code: Code::Unavailable,
                ..
            }
        ));
        let e = ClientError::from_status(
            status(Code::FailedPrecondition, "namespace x is terminating", None),
            EP,
        );
        assert!(matches!(
            e,
            ClientError::Other {
                code: Code::FailedPrecondition,
                ..
            }
        ));
    }

    #[test]
    fn maps_codes_without_reason() {
        for (code, check) in [
            (
                Code::NotFound,
                ClientError::is_not_found as fn(&ClientError) -> bool,
            ),
            (Code::AlreadyExists, ClientError::is_already_exists),
            (Code::Aborted, ClientError::is_conflict),
            (Code::OutOfRange, ClientError::is_expired),
            (Code::Unavailable, ClientError::is_unreachable),
        ] {
            let e = ClientError::from_status(
                status(
                    code,
                    "tcp connect error: Connection refused (os error 111)",
                    None,
                ),
                EP,
            );
            assert!(check(&e), "{code:?} → {e:?}");
            assert_eq!(e.code(), code);
        }
    }

    /// The connection closed under a request already sent: tonic reports Cancelled with
    /// the transport error as source. A server's own Cancelled (no source) stays Other.
    #[test]
    fn cancelled_by_the_transport_is_unreachable() {
        #[derive(Debug)]
        struct Closed;
        impl std::fmt::Display for Closed {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("connection closed")
            }
        }
        impl StdError for Closed {}
        let mut transport = Status::new(Code::Cancelled, "operation was canceled");
        transport.set_source(std::sync::Arc::new(Closed));
        let e = ClientError::from_status(transport, EP);
        assert!(e.is_unreachable(), "{e:?}");
        let server = ClientError::from_status(status(Code::Cancelled, "stop", None), EP);
        assert!(!server.is_unreachable(), "{server:?}");
    }

    #[test]
    fn unreachable_is_one_clear_line() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = ClientError::unreachable(EP, &io);
        assert_eq!(
            e.to_string(),
            "cannot reach the Skiff API server at http://127.0.0.1:7443: connection refused \
             (is it running? start one with `cargo xtask up`)"
        );
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn unreachable_all_names_every_server() {
        let f = |v: &[(&str, &str)]| {
            let v: Vec<(String, String)> = v
                .iter()
                .map(|(u, r)| (u.to_string(), r.to_string()))
                .collect();
            ClientError::unreachable_all(&v).to_string()
        };
        assert_eq!(
            f(&[(EP, "connection refused")]),
            ClientError::unreachable(
                EP,
                &std::io::Error::from(std::io::ErrorKind::ConnectionRefused)
            )
            .to_string()
        );
        assert_eq!(
            f(&[
                ("http://a:1", "connection refused"),
                ("http://b:1", "connection refused")
            ]),
            "cannot reach the Skiff API server at http://a:1, http://b:1: connection refused \
             (is it running? start one with `cargo xtask up`)"
        );
        assert!(
            f(&[
                ("http://a:1", "connection refused"),
                ("http://b:1", "connection timed out")
            ])
            .contains("http://a:1: connection refused; http://b:1: connection timed out")
        );
    }

    #[test]
    fn transport_reason_finds_nested_io_error() {
        #[derive(Debug)]
        struct Wrap(std::io::Error);
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("tcp connect error")
            }
        }
        impl StdError for Wrap {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let w = Wrap(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(transport_reason(&w), "connection refused");
        let other = std::io::Error::other("Name or service not known (os error -2)");
        assert_eq!(transport_reason(&other), "name or service not known");
    }
}
