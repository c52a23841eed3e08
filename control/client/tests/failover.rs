//! A client of two API servers over one store (in-process servers, one embedded store in a
//! tempdir): when the first stops, requests and a reflector's watch go on through the second.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_apiserver::{ApiServerOptions, ServerHandle};
use skiff_client::reflector::{Event, reflector};
use skiff_client::{Client, ClientConfig, ListParams};
use skiff_store::{EmbeddedOptions, EmbeddedStore, Store};
use skiff_testkit::build::pod;

/// Every wait of these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(20);

/// One store in a tempdir, kept as long as the returned directory lives.
fn store() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default())
        .expect("opening the store");
    (Arc::new(store), dir)
}

/// An API server over `store` on a free loopback port.
async fn serve(store: &Arc<dyn Store>) -> ServerHandle {
    skiff_testkit::init_tracing();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding a loopback port");
    skiff_apiserver::spawn(Arc::clone(store), listener, ApiServerOptions::default())
        .await
        .expect("starting the API server")
}

/// The next reflector event, within [`WAIT`].
async fn next(events: &mut (impl Stream<Item = Event<Pod>> + Unpin)) -> Event<Pod> {
    tokio::time::timeout(WAIT, events.next())
        .await
        .expect("no reflector event within the wait")
        .expect("the reflector never ends")
}

/// The resourceVersion of the object of an `Applied` event (anything else fails the test).
fn applied_rv(ev: Event<Pod>) -> String {
    match ev {
        Event::Applied(p) => p.resource_version().to_string(),
        other => panic!("expected an Applied event, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_watches_go_on_through_the_second_server() {
    let (store, _dir) = store();
    let first = serve(&store).await;
    let second = serve(&store).await;
    let (first_url, second_url) = (first.endpoint(), second.endpoint());
    let list = format!("{first_url},{second_url}");
    let client = tokio::time::timeout(WAIT, Client::connect(&list))
        .await
        .expect("connect in time")
        .expect("connect");
    assert_eq!(client.endpoint(), first_url);
    let pods = client.namespaced::<Pod>("default");

    let mut events = Box::pin(reflector(pods.clone(), ListParams::default()));
    match next(&mut events).await {
        Event::Restarted(items) => assert!(items.is_empty(), "{items:?}"),
        other => panic!("first event must be the list, got {other:?}"),
    }
    let mut created = Vec::new();
    let mut seen = Vec::new();
    for i in 0..3 {
        let p = pods
            .create(&pod(&format!("before-{i}")))
            .await
            .expect("create");
        created.push(p.resource_version().to_string());
        seen.push(applied_rv(next(&mut events).await));
    }

    tokio::time::timeout(WAIT, first.shutdown())
        .await
        .expect("the first server stops in time");

    // The request that finds the first server gone may fail (it cannot be replayed); the
    // next ones go to the second server. (The reflector's watch may find it first.)
    let mut failed = Vec::new();
    for i in 0..3 {
        let name = format!("after-{i}");
        let p = tokio::time::timeout(WAIT, async {
            loop {
                match pods.create(&pod(&name)).await {
                    Ok(p) => break p,
                    Err(e) if e.is_unreachable() && failed.is_empty() => failed.push(e),
                    Err(e) => panic!("create {name} after {failed:?}: {e}"),
                }
            }
        })
        .await
        .expect("create in time");
        created.push(p.resource_version().to_string());
    }
    assert!(failed.len() <= 1, "{failed:?}");
    if let Some(e) = failed.first() {
        // The error names the server that failed, not the one failed over to.
        assert!(e.to_string().contains(&first_url), "{e}");
    }
    assert_eq!(client.endpoint(), second_url);
    // A fresh list through the second server has everything.
    let listed = pods.list(&ListParams::default()).await.expect("list");
    assert_eq!(listed.items.len(), 6);
    // The REST calls follow.
    let version = client.get_json("/version").await.expect("GET /version");
    assert!(version.is_object(), "{version}");

    // The watch resumed on the second server from its last revision: the created objects,
    // each once, in order, and no relist.
    for _ in 0..3 {
        seen.push(applied_rv(next(&mut events).await));
    }
    assert_eq!(seen, created);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), events.next())
            .await
            .is_err(),
        "no more events after the created objects"
    );
    tokio::time::timeout(WAIT, second.shutdown())
        .await
        .expect("the second server stops in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_in_the_list_is_skipped() {
    let (store, _dir) = store();
    let live = serve(&store).await;
    // Port 1 on loopback: nothing listens there.
    let dead = "http://127.0.0.1:1";
    let list = format!("{dead},{}", live.endpoint());

    // Connecting takes the first server that answers.
    let client = Client::connect(&list).await.expect("connect");
    assert_eq!(client.endpoint(), live.endpoint());
    let ns = client
        .cluster::<skiff_api::api::Namespace>()
        .list(&ListParams::default())
        .await
        .expect("list namespaces");
    assert!(!ns.items.is_empty());

    // A lazy client finds out on its first call: a REST call goes on to the next server,
    // and the gRPC calls after it do not try the dead one again.
    let client = Client::connect_lazy_with(&ClientConfig::plain(&list)).expect("config");
    assert_eq!(client.endpoint(), dead);
    let version = tokio::time::timeout(WAIT, client.get_json("/version"))
        .await
        .expect("GET in time")
        .expect("GET /version through the live server");
    assert!(version.is_object(), "{version}");
    assert_eq!(client.endpoint(), live.endpoint());
    let pods = client.namespaced::<Pod>("default");
    tokio::time::timeout(WAIT, pods.list(&ListParams::default()))
        .await
        .expect("list in time")
        .expect("list through the live server");

    // A lazy client whose first call is gRPC: that call fails, the next goes on.
    let client = Client::connect_lazy(&list).expect("config");
    let err = pods_of(&client)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(err.is_unreachable(), "{err:?}");
    assert!(err.to_string().contains(dead), "{err}");
    pods_of(&client)
        .list(&ListParams::default())
        .await
        .expect("the next call goes to the live server");

    // None answers: one error naming them all.
    let err = Client::connect("http://127.0.0.1:1,http://127.0.0.1:2")
        .await
        .unwrap_err();
    assert!(err.is_unreachable(), "{err:?}");
    assert_eq!(
        err.to_string(),
        "cannot reach the Skiff API server at http://127.0.0.1:1, http://127.0.0.1:2: \
         connection refused (is it running? start one with `cargo xtask up`)"
    );
    // A bad list is refused before connecting.
    let err =
        Client::connect_lazy(&format!("{},{}", live.endpoint(), live.endpoint())).unwrap_err();
    assert!(err.to_string().contains("listed more than once"), "{err}");
    tokio::time::timeout(WAIT, live.shutdown())
        .await
        .expect("the server stops in time");
}

fn pods_of(client: &Client) -> skiff_client::Api<Pod> {
    client.namespaced::<Pod>("default")
}
