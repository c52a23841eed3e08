//! For other crates' tests: a real API server, in process, on an embedded store in a
//! temporary directory that is removed when the server is dropped. (Feature `testing`.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a failed setup step is the calling test's failure"
)]

use std::sync::Arc;

use skiff_store::{EmbeddedOptions, EmbeddedStore};

use crate::{ApiServerOptions, ServerHandle};

/// A running in-process API server and the directory of its store.
#[derive(Debug)]
pub struct TestServer {
    pub handle: ServerHandle,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Starts a server on 127.0.0.1 with a free port. Panics if it cannot: it is a test helper.
    pub async fn start(opts: ApiServerOptions) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir for the test store");
        let store = EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default())
            .expect("opening the test store");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let handle = crate::spawn(Arc::new(store), listener, opts)
            .await
            .expect("starting the API server");
        TestServer { handle, _dir: dir }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.handle.endpoint()
    }
}
