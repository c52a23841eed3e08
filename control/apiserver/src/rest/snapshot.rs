//! `GET /skiff/v1/snapshot`: a consistent snapshot of the whole store, taken while writes go
//! on (the embedded store's redb file at one revision, or etcd's own snapshot of the member
//! the server talks to), streamed as `application/octet-stream`. The headers name it:
//! `Skiff-Snapshot-Format` (`skiff-embedded` or `etcd`) and, when the store says,
//! `Skiff-Snapshot-Revision`. Authorization is RBAC's for the non-resource URL (`get` on
//! `/skiff/v1/snapshot`): the default policy gives it to `cluster-admin` only, since a
//! snapshot holds every Secret (encrypted as they are at rest).
//!
//! The snapshot is written first to a file of its own in the server's snapshot directory
//! ([`crate::ApiServerOptions::snapshot_dir`], private: mode 0700, the store's data directory
//! or the PKI directory; never the shared temporary directory), mode 0600 with a random name
//! made with `O_EXCL`, and removed once sent or when the client goes away.
//!
//! `skiff-apiserver restore SNAPSHOT --data-dir DIR [--force]` puts an embedded snapshot in
//! place with the server stopped (an existing store is refused, or kept aside with
//! `--force`).

use std::path::{Path, PathBuf};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::io::AsyncReadExt;
use tracing::{info, warn};

use super::context::Rest;

/// Bytes read per chunk sent.
const CHUNK: usize = 256 * 1024;

/// Removes the temporary snapshot file when dropped (sent, failed or abandoned).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A new, unused path for a snapshot in `dir` (made private first): a random name reserved
/// with `O_EXCL` and mode 0600 then removed again, since a store writes a snapshot only to a
/// file that does not exist yet. The directory is the server's own (0700), so nobody else
/// can take the name in between.
fn temp_path(dir: &Path) -> std::io::Result<TempFile> {
    skiff_pki::files::private_dir(dir)?;
    let reserved = skiff_pki::files::temp_beside(&dir.join("snapshot"))?;
    let path = reserved.path().to_path_buf();
    drop(reserved);
    Ok(TempFile(path))
}

fn failure(message: &str) -> Response {
    let (code, body) = crate::status::plain(500, "InternalError", message);
    super::respond(code, &body, super::Format::Json, &[])
}

pub(super) async fn serve(rest: &Rest) -> Response {
    let Some(dir) = &rest.snapshot_dir else {
        return failure("this server has no snapshot directory");
    };
    let guard = match temp_path(dir) {
        Ok(g) => g,
        Err(e) => {
            warn!(error = %e, dir = %dir.display(), "snapshot failed");
            return failure(&format!("preparing the snapshot file: {e}"));
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn snapshot_temporaries_are_random_in_the_private_directory() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("data");
        let a = temp_path(&dir).unwrap();
        let b = temp_path(&dir).unwrap();
        assert_ne!(a.0, b.0);
        assert_eq!(a.0.parent(), Some(dir.as_path()));
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        std::fs::write(&a.0, b"x").unwrap();
        drop(a);
        drop(b);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "removed when dropped"
        );
    }
}
