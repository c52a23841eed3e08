//! `?watch=true`: newline-delimited `{"type":..., "object":...}` events from the watch
//! cache, as kube-apiserver streams them. A resourceVersion too old answers with an ERROR
//! event carrying a 410 `Status` (the client relists); `allowWatchBookmarks` adds BOOKMARK
//! events with the latest revision; `timeoutSeconds` ends the stream.

use std::time::Duration;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use skiff_api::rpc::WatchRequest;
use tokio::sync::mpsc;

use super::objects::Call;
use super::status;
use crate::error::ApiError;

/// How often a bookmark is sent when the client allows them.
const BOOKMARK_EVERY: Duration = Duration::from_secs(10);
/// The longest a watch runs without `timeoutSeconds` (kube-apiserver picks 30-60 min).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

fn line(v: &Value) -> axum::body::Bytes {
    let mut s = v.to_string();
    s.push('\n');
    s.into()
}

fn error_event(err: &ApiError, call: &Call<'_>) -> Value {
    let (_, s) = status::failure(err, &call.subject());
    json!({"type": "ERROR", "object": s})
}

/// Serves a watch of the call's collection.
pub(crate) async fn serve(call: &Call<'_>) -> Response {
    let q = call.query;
    let req = WatchRequest {
        resource: call.info.plural.to_string(),
        namespace: call.namespace.clone(),
        label_selector: q.get("labelSelector").unwrap_or("").to_string(),
        field_selector: q.get("fieldSelector").unwrap_or("").to_string(),
        resource_version: q.get("resourceVersion").unwrap_or("").to_string(),
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let bookmarks = q.flag("allowWatchBookmarks");
    let (tx, rx) = mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(64);
    match call.handler.watch(&req).await {
        // Selector errors and the like are plain failures; a too-old revision is an event.
        Err(e @ ApiError::Expired(_)) => {
            let _ = tx.try_send(Ok(line(&error_event(&e, call))));
        }
        Err(e) => return call.fail(&e),
        Ok(mut events) => {
            let kind = call.kind;
            let info = call.info;
            // `kubectl get -w` asks for Tables: each event's object is a one-row Table.
            let as_table = (call.format == super::Format::Table).then(|| call.query.clone());
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
                let deadline = tokio::time::sleep(timeout);
                tokio::pin!(deadline);
                let mut tick = tokio::time::interval(BOOKMARK_EVERY);
                tick.tick().await;
                loop {
                    let out = tokio::select! {
                        () = &mut deadline => break,
                        () = tx.closed() => break,
                        _ = tick.tick(), if bookmarks => {
                            json!({"type": "BOOKMARK", "object": {
                                "kind": info.kind,
                                "apiVersion": info.api_version,
                                "metadata": {"resourceVersion": last_rv},
                            }})
                        }
                        ev = events.recv() => match ev {
                            None => break,
                            Some(Ok(ev)) => {
                                last_rv = ev.resource_version.clone();
                                match kind.proto_to_json(&ev.object) {
                                    Ok(obj) => {
                                        let obj = match &as_table {
                                            Some(q) => super::table::of(info, &[obj], "", q),
                                            None => obj,
                                        };
                                        json!({"type": ev.r#type, "object": obj})
                                    }
                                    Err(e) => subject_err(&ApiError::Internal(e.to_string())),
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
