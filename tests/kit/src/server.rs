//! A real API server, in process, on an embedded store in a temporary directory that is
//! removed when the server is dropped.
#![allow(
    clippy::expect_used,
    reason = "test support: a failed setup step is the calling test's failure"
)]

use std::sync::Arc;

use skiff_apiserver::{ApiServerOptions, ServerHandle};
use skiff_client::Client;
use skiff_store::{EmbeddedOptions, EmbeddedStore};

/// A running in-process API server and the directory of its store.
#[derive(Debug)]
pub struct TestServer {
    pub handle: ServerHandle,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Starts a server on 127.0.0.1 with a free port. Panics if it cannot.
    pub async fn start(opts: ApiServerOptions) -> TestServer {
        crate::init_tracing();
        let dir = tempfile::tempdir().expect("tempdir for the test store");
        let store = EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default())
            .expect("opening the test store");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let handle = skiff_apiserver::spawn(Arc::new(store), listener, opts)
            .await
            .expect("starting the API server");
        TestServer { handle, _dir: dir }
    }

    /// A server with the default options.
    pub async fn default_options() -> TestServer {
        TestServer::start(ApiServerOptions::default()).await
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.handle.endpoint()
    }

    /// A client of this server.
    pub async fn client(&self) -> Client {
        Client::connect(&self.endpoint())
            .await
            .expect("connecting to the test server")
    }
}
