//! `?watch=true`: newline-delimited `{"type":..., "object":...}` events from the watch
//! cache, as kube-apiserver streams them. A resourceVersion too old answers with an ERROR
//! event carrying a 410 `Status` (the client relists); `allowWatchBookmarks` adds BOOKMARK
//! events with the latest revision; `timeoutSeconds` ends the stream.
//!
//! Streaming lists (`sendInitialEvents=true&resourceVersionMatch=NotOlderThan`, the
//! `WatchList` feature, on by default in Kubernetes 1.32; client-go's and kube-rs'
//! `streaming_lists()` watchers use it): an ADDED event per object of a consistent list,
//! then, with `allowWatchBookmarks`, a BOOKMARK at the list's revision annotated
//! `k8s.io/initial-events-end: "true"`, then every change after that revision.
//! `sendInitialEvents=false` starts at the current revision without them. The watch options
//! are validated as kube-apiserver's `ValidateListOptions` does (422 `ListOptions`).

use std::time::Duration;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use skiff_api::rpc::{ListRequest, WatchRequest};
use tokio::sync::mpsc;

use super::call::{Call, partial_metadata};
use super::query::Query;
use crate::error::{ApiError, FieldError};
use crate::status;
use crate::status::Format;

/// The annotation of the bookmark that ends a streaming list's initial events.
pub(crate) const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How often a bookmark is sent when the client allows them.
const BOOKMARK_EVERY: Duration = Duration::from_secs(10);
/// The longest a watch runs without `timeoutSeconds` (kube-apiserver picks 30-60 min).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

fn line(v: &Value) -> axum::body::Bytes {
    let mut s = crate::status::json_in_order(v);
    s.push(b'\n');
    s.into()
}

fn error_event(err: &ApiError, call: &Call<'_>) -> Value {
    let (_, s) = status::failure(err, &call.subject());
    json!({"type": "ERROR", "object": s})
}

/// `sendInitialEvents`, validated with the rest of the watch options as kube-apiserver's
/// `validateWatchOptions` (a 422 naming `ListOptions.meta.k8s.io`).
pub(crate) fn send_initial_events(q: &Query) -> Result<Option<bool>, ApiError> {
    let send = match q.get("sendInitialEvents") {
        None => None,
        Some("true" | "1") => Some(true),
        Some("false" | "0") => Some(false),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "sendInitialEvents {other:?} is invalid: must be true or false"
            )));
        }
    };
    let matching = q.get("resourceVersionMatch").unwrap_or("");
    let mut errors = Vec::new();
    if send.is_some() && matching != "NotOlderThan" {
        errors.push(FieldError::forbidden(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if !matching.is_empty() {
        if send.is_none() {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if matching != "NotOlderThan" {
            errors.push(FieldError::not_supported(
                "resourceVersionMatch",
                matching,
                &["NotOlderThan"],
            ));
        }
        if q.get("continue").is_some_and(|c| !c.is_empty()) {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
    }
    if errors.is_empty() {
        Ok(send)
    } else {
        Err(ApiError::Invalid {
            kind: "ListOptions.meta.k8s.io".into(),
            name: String::new(),
            errors,
        })
    }
}

/// An object of a watch event in the asked representation.
fn shape(
    obj: Value,
    format: Format,
    info: &skiff_api::KindInfo,
    printer: Option<&[crate::custom::Column]>,
    table: &Query,
) -> Value {
    match format {
        Format::Table => super::table::of(info, printer, &[obj], table),
        Format::Metadata { v1beta1, .. } => partial_metadata(&obj, v1beta1),
        _ => obj,
    }
}

/// What a watch starts with: the events of a streaming list's initial state (and the
/// revision they reflect), or none.
struct Start {
    lines: Vec<axum::body::Bytes>,
    /// The revision to watch from; the request's when `None`.
    after: Option<String>,
}

/// For `sendInitialEvents`: a consistent list (the current state, at least as new as any
/// revision the client can name), as ADDED events and the end bookmark (`true`), or only its
/// revision to start from (`false` with resourceVersion "" or "0").
async fn initial_events(
    call: &Call<'_>,
    req: &WatchRequest,
    send: Option<bool>,
    bookmarks: bool,
) -> Result<Start, ApiError> {
    let from_now = matches!(req.resource_version.as_str(), "" | "0");
    match send {
        None => {
            return Ok(Start {
                lines: Vec::new(),
                after: None,
            });
        }
        Some(false) if !from_now => {
            return Ok(Start {
                lines: Vec::new(),
                after: None,
            });
        }
        Some(_) => {}
    }
    let listing = call
        .handler
        .list(
            &ListRequest {
                resource: req.resource.clone(),
                namespace: req.namespace.clone(),
                label_selector: req.label_selector.clone(),
                field_selector: req.field_selector.clone(),
            },
            None,
        )
        .await?;
    let revision = listing.resource_version;
    if !from_now
        && let (Ok(asked), Ok(listed)) =
            (req.resource_version.parse::<i64>(), revision.parse::<i64>())
        && asked > listed
    {
        return Err(ApiError::Expired(format!(
            "too large resource version: {asked}, current: {listed}"
        )));
    }
    let mut lines = Vec::new();
    if send == Some(true) {
        for obj in call.to_json_many(&listing.items).await? {
            let obj = shape(
                obj,
                call.format,
                call.info,
                call.printer_columns(),
                call.query,
            );
            lines.push(line(&json!({"type": "ADDED", "object": obj})));
        }
        if bookmarks {
            lines.push(line(&bookmark(call.info, call.format, &revision, true)));
        }
    }
    Ok(Start {
        lines,
        after: Some(revision),
    })
}

/// A BOOKMARK event at `revision`: an empty object of the kind (in the asked representation)
/// with only its resourceVersion, and the initial-events-end annotation when `end`.
fn bookmark(info: &skiff_api::KindInfo, format: Format, revision: &str, end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": revision});
    if end {
        metadata["annotations"] = json!({INITIAL_EVENTS_END: "true"});
    }
    let object = match format {
        Format::Metadata { v1beta1, .. } => {
            partial_metadata(&json!({"metadata": metadata}), v1beta1)
        }
        _ => json!({
            "kind": info.kind,
            "apiVersion": info.api_version,
            "metadata": metadata,
        }),
    };
    json!({"type": "BOOKMARK", "object": object})
}

/// Serves a watch of the call's collection.
pub(crate) async fn serve(call: &Call<'_>) -> Response {
    let q = call.query;
    let mut req = WatchRequest {
        resource: call.info.plural.to_string(),
        namespace: call.namespace.clone(),
        label_selector: q.get("labelSelector").unwrap_or("").to_string(),
        field_selector: q.get("fieldSelector").unwrap_or("").to_string(),
        resource_version: q.get("resourceVersion").unwrap_or("").to_string(),
    };
    let bookmarks = q.flag("allowWatchBookmarks");
    let start = match send_initial_events(q) {
        Ok(send) => initial_events(call, &req, send, bookmarks).await,
        Err(e) => Err(e),
    };
    let start = match start {
        Ok(start) => start,
        Err(e @ ApiError::Expired(_)) => return error_stream(&e, call),
        Err(e) => return call.fail(&e),
    };
    if let Some(after) = &start.after {
        req.resource_version.clone_from(after);
    }
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let (tx, rx) = mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(64);
    match call.handler.watch(&req).await {
        // Selector errors and the like are plain failures; a too-old revision is an event.
        Err(e @ ApiError::Expired(_)) => return error_stream(&e, call),
        Err(e) => return call.fail(&e),
        Ok(mut events) => {
            let codec = call.codec();
            let printer = call.printer_columns().map(<[_]>::to_vec);
            let info = call.info;
            // `kubectl get -w` asks for Tables (each event's object is a one-row Table),
            // metadata watchers for PartialObjectMetadata.
            let format = call.format;
            let query = call.query.clone();
            let initial = start.lines;
            let subject_err = |e: &ApiError| {
                let (_, s) = status::failure(
                    e,
                    &status::Subject {
                        name: "",
                        group: info.group(),
                        resource: info.plural,
                    },
                );
                json!({"type": "ERROR", "object": s})
            };
            let mut last_rv = req.resource_version.clone();
            tokio::spawn(async move {
                for l in initial {
                    if tx.send(Ok(l)).await.is_err() {
                        return;
                    }
                }
                let deadline = tokio::time::sleep(timeout);
                tokio::pin!(deadline);
                let mut tick = tokio::time::interval(BOOKMARK_EVERY);
                tick.tick().await;
                loop {
                    let out = tokio::select! {
                        () = &mut deadline => break,
                        () = tx.closed() => break,
                        _ = tick.tick(), if bookmarks => bookmark(info, format, &last_rv, false),
                        ev = events.recv() => match ev {
                            None => break,
                            Some(Ok(ev)) => {
                                last_rv = ev.resource_version.clone();
                                match codec.to_json(&ev.object).await {
                                    Ok(obj) => json!({
                                        "type": ev.r#type,
                                        "object": shape(obj, format, info, printer.as_deref(), &query),
                                    }),
                                    Err(e) => subject_err(&e),
                                }
                            }
                            Some(Err(status)) => {
                                // The cache ends a watcher that fell too far behind with
                                // OutOfRange; shutdown ends watches with Unavailable.
                                if status.code() == tonic::Code::OutOfRange {
                                    let e = ApiError::Expired(status.message().to_string());
                                    let _ = tx.send(Ok(line(&subject_err(&e)))).await;
                                }
                                break;
                            }
                        },
                    };
                    if tx.send(Ok(line(&out))).await.is_err() {
                        break;
                    }
                }
            });
        }
    }
    stream(rx)
}

type Lines = mpsc::Receiver<Result<axum::body::Bytes, std::io::Error>>;

/// A 200 answer streaming the lines `rx` receives.
fn stream(rx: Lines) -> Response {
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// A watch that is only an ERROR event (a revision too old or too new), which clients
/// answer by relisting.
fn error_stream(err: &ApiError, call: &Call<'_>) -> Response {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(Ok(line(&error_event(err, call))));
    stream(rx)
}
