//! `GET /skiff/v1/snapshot`: a consistent snapshot of the whole store, taken while writes go
//! on (the embedded store's redb file at one revision, or etcd's own snapshot of the member
//! the server talks to), streamed as `application/octet-stream`. The headers name it:
//! `Skiff-Snapshot-Format` (`skiff-embedded` or `etcd`) and, when the store says,
//! `Skiff-Snapshot-Revision`. Authorization is RBAC's for the non-resource URL (`get` on
//! `/skiff/v1/snapshot`): the default policy gives it to `cluster-admin` only, since a
//! snapshot holds every Secret (encrypted as they are at rest).
//!
//! The snapshot is written to a temporary file first (the store's snapshot is a file) and
//! removed once sent or when the client goes away.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::io::AsyncReadExt;
use tracing::{info, warn};

use super::Rest;

/// Bytes read per chunk sent.
const CHUNK: usize = 256 * 1024;

/// Removes the temporary snapshot file when dropped (sent, failed or abandoned).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp_path() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "skiff-snapshot-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

fn failure(message: &str) -> Response {
    let (code, body) = super::status::plain(500, "InternalError", message);
    super::respond(code, &body, super::Format::Json, &[])
}

pub(super) async fn serve(rest: &Rest) -> Response {
    let guard = TempFile(temp_path());
    let snapshot = match rest.registry.snapshot(&guard.0).await {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "snapshot failed");
            return failure(&format!("taking a snapshot of the store: {e}"));
        }
    };
    let file = match tokio::fs::File::open(&guard.0).await {
        Ok(f) => f,
        Err(e) => return failure(&format!("reading the snapshot: {e}")),
    };
    info!(revision = ?snapshot.revision, format = snapshot.format, bytes = snapshot.bytes, "snapshot taken");
    let chunks = futures::stream::unfold(
        (file, guard, vec![0u8; CHUNK]),
        |(mut file, guard, mut buf)| async move {
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => Some((Ok(Bytes::copy_from_slice(&buf[..n])), (file, guard, buf))),
                Err(e) => Some((Err(e), (file, guard, buf))),
            }
        },
    );
    let mut resp = (StatusCode::OK, Body::from_stream(chunks)).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(snapshot.bytes));
    headers.insert(
        "skiff-snapshot-format",
        HeaderValue::from_static(snapshot.format),
    );
    if let Some(r) = snapshot.revision {
        headers.insert("skiff-snapshot-revision", HeaderValue::from(r));
    }
    resp
}
