//! The reflector against a real API server (in-process, embedded store in a tempdir).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::time::Duration;

use futures::StreamExt;
use skiff_api::api::{Container, ObjectMeta, Pod, PodSpec};
use skiff_apiserver::ApiServerOptions;
use skiff_client::reflector::{Event, Store, reflect, reflector};
use skiff_client::{Client, DeleteParams, ListParams};
use skiff_testkit::server::TestServer;

fn pod(name: &str) -> Pod {
    Pod {
        metadata: Some(ObjectMeta {
            name: name.into(),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: "host".into(),
                command: vec!["true".into()],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn server(cache: usize) -> TestServer {
    TestServer::start(ApiServerOptions {
        watch_cache_capacity: cache,
        ..Default::default()
    })
    .await
}

async fn until<T: skiff_api::Resource>(
    stream: &mut (impl futures::Stream<Item = Event<T>> + Unpin),
    store: &Store<T>,
    done: impl Fn(&Store<T>) -> bool,
) {
    tokio::time::timeout(Duration::from_secs(20), async {
        while !done(store) {
            stream.next().await.expect("reflector never ends");
        }
    })
    .await
    .expect("reflector did not converge within 20 s");
}

#[tokio::test]
async fn lists_then_follows_changes() {
    let server = server(10_000).await;
    let client = Client::connect(&server.endpoint()).await.expect("connect");
    let pods = client.namespaced::<Pod>("default");
    pods.create(&pod("before")).await.expect("create");

    let store = Store::default();
    let mut events = Box::pin(reflect(
        store.clone(),
        reflector(pods.clone(), ListParams::default()),
    ));
    match events.next().await {
        Some(Event::Restarted(items)) => assert_eq!(items.len(), 1),
        other => panic!("first event must be the list, got {other:?}"),
    }
    pods.create(&pod("after")).await.expect("create");
    pods.delete("before", &DeleteParams::default())
        .await
        .expect("delete");
    until(&mut events, &store, |s| {
        s.get("default/after").is_some() && s.get("default/before").is_none()
    })
    .await;
}

#[tokio::test]
async fn relists_when_the_watch_is_too_old() {
    // A tiny watch cache: a consumer that stops reading falls out of the window.
    let server = server(8).await;
    let client = Client::connect(&server.endpoint()).await.expect("connect");
    let pods = client.namespaced::<Pod>("default");
    let store = Store::default();
    let mut events = Box::pin(reflect(
        store.clone(),
        reflector(pods.clone(), ListParams::default()),
    ));
    assert!(matches!(events.next().await, Some(Event::Restarted(_))));
    // Start the watch, then stop reading while 60 writes go by.
    pods.create(&pod("p-first")).await.expect("create");
    assert!(matches!(events.next().await, Some(Event::Applied(_))));
    for i in 0..60 {
        pods.create(&pod(&format!("p-{i}"))).await.expect("create");
    }
    let mut restarts = 0;
    tokio::time::timeout(Duration::from_secs(20), async {
        while store.len() < 61 {
            if let Event::Restarted(_) = events.next().await.expect("never ends") {
                restarts += 1;
            }
        }
    })
    .await
    .expect("reflector converges");
    assert_eq!(store.len(), 61);
    // Whether it relisted depends on HTTP/2 buffering; what matters is that nothing is missed.
    tracing::info!(restarts, "relists");
}
