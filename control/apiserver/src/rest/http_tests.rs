//! The REST API over HTTP semantics, in process: a registry on a real embedded store, the
//! router called as a tower service. Status codes, reasons and messages are Kubernetes'
//! (checked against kube-apiserver 1.32's answers for the same requests), and a refused
//! request writes nothing.

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use crate::registry::Registry;

struct App {
    router: axum::Router,
    _dir: tempfile::TempDir,
}

async fn app() -> App {
    let dir = tempfile::tempdir().unwrap();
    let store = skiff_store::EmbeddedStore::open(
        &dir.path().join("s.redb"),
        skiff_store::EmbeddedOptions::default(),
    )
    .unwrap();
    let registry = Arc::new(
        Registry::start(
            Arc::new(store),
            1024,
            Arc::new(crate::admission::Chain::default()),
        )
        .await
        .unwrap(),
    );
    super::super::bootstrap(&registry, &["default".to_string()])
        .await
        .unwrap();
    App {
        router: super::router(registry, None, None, None, None, None),
        _dir: dir,
    }
}

struct Answer {
    code: u16,
    content_type: String,
    body: Value,
    text: String,
}

impl App {
    async fn call(&self, method: &str, uri: &str, content_type: &str, body: Vec<u8>) -> Answer {
        let mut req = Request::builder().method(method).uri(uri);
        if !content_type.is_empty() {
            req = req.header("content-type", content_type);
        }
        let resp = self
            .router
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let code = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Answer {
            code,
            content_type,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    async fn json(&self, method: &str, uri: &str, body: &Value) -> Answer {
        self.call(
            method,
            uri,
            "application/json",
            body.to_string().into_bytes(),
        )
        .await
    }

    async fn get(&self, uri: &str) -> Answer {
        self.call("GET", uri, "", Vec::new()).await
    }

    /// A GET with an Accept header.
    async fn get_as(&self, uri: &str, accept: &str) -> Answer {
        let req = Request::builder()
            .uri(uri)
            .header("accept", accept)
            .body(Body::empty())
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let code = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Answer {
            code,
            content_type: String::new(),
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    /// The first `n` events of a watch (`uri` has `watch=true`), with the Accept header
    /// `accept`; fails after 10 s.
    async fn watch_events(&self, uri: &str, accept: &str, n: usize) -> Vec<Value> {
        use futures::StreamExt as _;
        let req = Request::builder()
            .uri(uri)
            .header("accept", accept)
            .body(Body::empty())
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let mut body = resp.into_body().into_data_stream();
        let mut buf = String::new();
        let read = async {
            while buf.lines().count() < n {
                let chunk = body.next().await.expect("watch ended").unwrap();
                buf.push_str(&String::from_utf8_lossy(&chunk));
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), read)
            .await
            .unwrap_or_else(|_| panic!("fewer than {n} events: {buf}"));
        buf.lines()
            .take(n)
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    async fn lease_names(&self) -> Vec<String> {
        let list = self.get(LEASES).await;
        assert_eq!(list.code, 200, "{}", list.text);
        list.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";

/// Leases: the simplest kind Skiff serves (no defaulting or allocation on create).
fn lease(name: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
           "spec": {"holderIdentity": "v"}})
}

fn assert_status(a: &Answer, code: u16, reason: &str) {
    assert_eq!(a.code, code, "{}", a.text);
    assert_eq!(a.body["kind"], "Status", "{}", a.text);
    assert_eq!(a.body["apiVersion"], "v1");
    assert_eq!(a.body["status"], "Failure");
    assert_eq!(a.body["code"], code);
    assert_eq!(a.body["reason"], reason, "{}", a.text);
}

#[tokio::test]
async fn objects_are_written_as_kubernetes_writes_them() {
    let app = app().await;
    let a = app.json("POST", LEASES, &lease("one")).await;
    assert_eq!(a.code, 201, "{}", a.text);
    assert_eq!(a.content_type, "application/json");
    assert_eq!(a.body["kind"], "Lease");
    assert_eq!(a.body["apiVersion"], "coordination.k8s.io/v1");
    let meta = &a.body["metadata"];
    assert!(meta["resourceVersion"].is_string(), "{meta}");
    assert!(
        meta["uid"].as_str().is_some_and(|u| u.len() == 36),
        "{meta}"
    );
    let created = meta["creationTimestamp"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(created).is_ok() && created.ends_with('Z'),
        "{created}"
    );
    let list = app.get(LEASES).await;
    assert_eq!(list.body["kind"], "LeaseList");
    assert_eq!(list.body["apiVersion"], "coordination.k8s.io/v1");
    assert!(list.body["metadata"]["resourceVersion"].is_string());

    // YAML when asked for.
    let mut req = Request::builder()
        .uri(format!("{LEASES}/one"))
        .header("accept", "application/yaml");
    req = req.method("GET");
    let resp = app
        .router
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "application/yaml");
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let yaml: Value = yaml_serde::from_slice(&bytes).unwrap();
    assert_eq!(yaml["metadata"]["name"], "one");
}

#[tokio::test]
async fn errors_are_statuses_with_kubernetes_reasons_and_messages() {
    let app = app().await;
    let created = app.json("POST", LEASES, &lease("one")).await;
    assert_eq!(created.code, 201);

    let again = app.json("POST", LEASES, &lease("one")).await;
    assert_status(&again, 409, "AlreadyExists");
    assert_eq!(
        again.body["message"],
        "leases.coordination.k8s.io \"one\" already exists"
    );
    assert_eq!(again.body["details"]["name"], "one");
    assert_eq!(again.body["details"]["group"], "coordination.k8s.io");
    assert_eq!(again.body["details"]["kind"], "leases");

    let missing = app.get(&format!("{LEASES}/nope")).await;
    assert_status(&missing, 404, "NotFound");
    assert_eq!(
        missing.body["message"],
        "leases.coordination.k8s.io \"nope\" not found"
    );

    // A write from a stale read: optimistic concurrency, Kubernetes' message.
    let mut stale = created.body.clone();
    let mut fresh = created.body.clone();
    fresh["spec"]["holderIdentity"] = json!("new");
    let ok = app.json("PUT", &format!("{LEASES}/one"), &fresh).await;
    assert_eq!(ok.code, 200, "{}", ok.text);
    stale["spec"]["holderIdentity"] = json!("lost");
    let conflict = app.json("PUT", &format!("{LEASES}/one"), &stale).await;
    assert_status(&conflict, 409, "Conflict");
    assert_eq!(
        conflict.body["message"],
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"one\": the object has been modified; \
         please apply your changes to the latest version and try again"
    );
    let now = app.get(&format!("{LEASES}/one")).await;
    assert_eq!(now.body["spec"]["holderIdentity"], "new");

    // Invalid objects: 422 with the field paths.
    let bad = app
        .json(
            "POST",
            "/apis/apps/v1/namespaces/default/deployments",
            &json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "Bad_Name"},
                "spec": {"replicas": -1, "selector": {"matchLabels": {"a": "b"}},
                         "template": {"metadata": {"labels": {"a": "b"}},
                                      "spec": {"containers": [{"name": "c", "image": "host"}]}}}
            }),
        )
        .await;
    assert_status(&bad, 422, "Invalid");
    let fields: Vec<&str> = bad.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    assert!(fields.contains(&"metadata.name"), "{fields:?}");
    assert!(fields.contains(&"spec.replicas"), "{fields:?}");
    assert!(
        bad.body["message"]
            .as_str()
            .unwrap()
            .starts_with("Deployment.apps \"Bad_Name\" is invalid: "),
        "{}",
        bad.text
    );
}

#[tokio::test]
async fn malformed_requests_get_a_4xx_and_write_nothing() {
    let app = app().await;
    let before = app.lease_names().await;

    let broken = app
        .call(
            "POST",
            LEASES,
            "application/json",
            b"{\"metadata\": {".to_vec(),
        )
        .await;
    assert_status(&broken, 400, "BadRequest");

    let yaml = app
        .call(
            "POST",
            LEASES,
            "application/yaml",
            b"metadata:\n  name: [unclosed\n".to_vec(),
        )
        .await;
    assert_status(&yaml, 400, "BadRequest");

    let text = app
        .call(
            "POST",
            LEASES,
            "text/plain",
            lease("t").to_string().into_bytes(),
        )
        .await;
    assert_status(&text, 415, "UnsupportedMediaType");

    let mut huge = lease("huge");
    huge["spec"]["holderIdentity"] = json!("x".repeat(super::MAX_BODY_BYTES + 1));
    let too_big = app.json("POST", LEASES, &huge).await;
    assert_status(&too_big, 413, "RequestEntityTooLarge");

    let unknown = app
        .json(
            "POST",
            &format!("{LEASES}?fieldValidation=Strict"),
            &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": "strict"}, "specc": {}}),
        )
        .await;
    assert_status(&unknown, 400, "BadRequest");
    assert!(
        unknown.body["message"]
            .as_str()
            .unwrap()
            .contains("unknown field \"specc\""),
        "{}",
        unknown.text
    );

    // Patches: malformed, and well-formed but not applicable.
    assert_eq!(app.json("POST", LEASES, &lease("p")).await.code, 201);
    let garbage = app
        .call(
            "PATCH",
            &format!("{LEASES}/p"),
            "application/json-patch+json",
            b"[{\"op\": ".to_vec(),
        )
        .await;
    assert!(
        garbage.code == 400 || garbage.code == 422,
        "{}",
        garbage.text
    );
    let inapplicable = app
        .call(
            "PATCH",
            &format!("{LEASES}/p"),
            "application/json-patch+json",
            br#"[{"op": "remove", "path": "/spec/missing"}]"#.to_vec(),
        )
        .await;
    assert_status(&inapplicable, 422, "Invalid");
    let wrong_type = app
        .call(
            "PATCH",
            &format!("{LEASES}/p"),
            "application/json",
            br#"{"spec": {"holderIdentity": "w"}}"#.to_vec(),
        )
        .await;
    assert_status(&wrong_type, 415, "UnsupportedMediaType");
    let p = app.get(&format!("{LEASES}/p")).await;
    assert_eq!(
        p.body["spec"]["holderIdentity"], "v",
        "a refused patch changed the object"
    );

    // Nothing but "p" was written.
    let mut after = app.lease_names().await;
    after.retain(|n| n != "p");
    assert_eq!(after, before);
}

#[tokio::test]
async fn lists_paginate_and_refuse_bad_tokens_and_selectors() {
    let app = app().await;
    for i in 0..5 {
        let a = app.json("POST", LEASES, &lease(&format!("cm-{i}"))).await;
        assert_eq!(a.code, 201);
    }
    let mut names = Vec::new();
    let mut next = String::new();
    let mut pages = 0;
    loop {
        let uri = if next.is_empty() {
            format!("{LEASES}?limit=2")
        } else {
            format!("{LEASES}?limit=2&continue={next}")
        };
        let page = app.get(&uri).await;
        assert_eq!(page.code, 200, "{}", page.text);
        pages += 1;
        for item in page.body["items"].as_array().unwrap() {
            names.push(item["metadata"]["name"].as_str().unwrap().to_string());
        }
        match page.body["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => next = c.to_string(),
            _ => break,
        }
        assert!(pages < 10, "pagination does not end");
    }
    assert_eq!(pages, 3);
    assert_eq!(names, ["cm-0", "cm-1", "cm-2", "cm-3", "cm-4"]);

    let bad_continue = app.get(&format!("{LEASES}?limit=2&continue=garbage")).await;
    assert_status(&bad_continue, 400, "BadRequest");

    // A label selector that does not parse.
    let bad_selector = app.get(&format!("{LEASES}?labelSelector=a%20in%20(")).await;
    assert_status(&bad_selector, 400, "BadRequest");

    // List options kube-apiserver refuses: 422 on ListOptions.meta.k8s.io, with its text.
    for (query, message) in [
        (
            "resourceVersionMatch=NotOlderThan",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless \
             resourceVersion is provided",
        ),
        (
            "resourceVersion=0&resourceVersionMatch=Exact",
            "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for \
             resourceVersion \"0\"",
        ),
        (
            "resourceVersion=1&resourceVersionMatch=Newest",
            "resourceVersionMatch: Unsupported value: \"Newest\": supported values: \
             \"Exact\", \"NotOlderThan\", \"\"",
        ),
        (
            "sendInitialEvents=true",
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
        ),
    ] {
        let a = app.get(&format!("{LEASES}?{query}")).await;
        assert_status(&a, 422, "Invalid");
        assert_eq!(
            a.body["message"],
            format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
            "{query}"
        );
    }
    let first = app.get(&format!("{LEASES}?limit=2")).await;
    let token = first.body["metadata"]["continue"].as_str().unwrap();
    let both = app
        .get(&format!(
            "{LEASES}?limit=2&continue={token}&resourceVersion=5"
        ))
        .await;
    assert_status(&both, 400, "BadRequest");
    assert_eq!(
        both.body["message"],
        "specifying resource version is not allowed when using continue"
    );
    // resourceVersion "0" beside a continue token is allowed, as kube-apiserver allows it.
    let zero = app
        .get(&format!(
            "{LEASES}?limit=2&continue={token}&resourceVersion=0"
        ))
        .await;
    assert_eq!(zero.code, 200, "{}", zero.text);
}

const PARTIAL: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
const PARTIAL_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

#[tokio::test]
async fn metadata_only_answers_as_kube_apiserver_converts_them() {
    let app = app().await;
    let mut labelled = lease("one");
    labelled["metadata"]["labels"] = json!({"app": "a"});
    assert_eq!(app.json("POST", LEASES, &labelled).await.code, 201);
    assert_eq!(app.json("POST", LEASES, &lease("two")).await.code, 201);

    let one = app.get_as(&format!("{LEASES}/one"), PARTIAL).await;
    assert_eq!(one.code, 200, "{}", one.text);
    assert_eq!(one.body["kind"], "PartialObjectMetadata");
    assert_eq!(one.body["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(one.body["metadata"]["labels"]["app"], "a");
    assert!(one.body["metadata"]["uid"].is_string());
    assert!(one.body.get("spec").is_none(), "{}", one.text);

    let list = app.get_as(&format!("{LEASES}?limit=1"), PARTIAL_LIST).await;
    assert_eq!(list.code, 200, "{}", list.text);
    assert_eq!(list.body["kind"], "PartialObjectMetadataList");
    assert_eq!(list.body["apiVersion"], "meta.k8s.io/v1");
    assert!(
        list.body["metadata"]["continue"].is_string(),
        "{}",
        list.text
    );
    assert_eq!(list.body["metadata"]["remainingItemCount"], 1);
    assert_eq!(list.body["items"][0]["kind"], "PartialObjectMetadata");
    assert_eq!(list.body["items"][0]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(list.body["items"][0]["metadata"]["name"], "one");
    assert!(list.body["items"][0].get("spec").is_none());

    // v1beta1 too, with client-go's protobuf-first header.
    let beta = app
        .get_as(
            LEASES,
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1,application/json",
        )
        .await;
    assert_eq!(
        beta.body["apiVersion"], "meta.k8s.io/v1beta1",
        "{}",
        beta.text
    );

    // The object form for a list and the list form for an object: 406, kube-apiserver's text.
    let wrong = app.get_as(LEASES, PARTIAL).await;
    assert_status(&wrong, 406, "NotAcceptable");
    assert_eq!(
        wrong.body["message"],
        "you requested PartialObjectMetadata, but the requested object is a list \
         (*coordination.LeaseList)"
    );
    let wrong = app.get_as(&format!("{LEASES}/one"), PARTIAL_LIST).await;
    assert_status(&wrong, 406, "NotAcceptable");
    assert_eq!(
        wrong.body["message"],
        "you requested PartialObjectMetadataList, but the requested object is not a list \
         (*coordination.Lease)"
    );
    // A conversion Skiff does not serve, with no fallback.
    let widget = app
        .get_as(LEASES, "application/json;as=Widget;g=meta.k8s.io;v=v1")
        .await;
    assert_status(&widget, 406, "NotAcceptable");

    // A metadata watch: each object and the bookmarks as PartialObjectMetadata.
    let events = app
        .watch_events(
            &format!(
                "{LEASES}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
            ),
            PARTIAL,
            3,
        )
        .await;
    for ev in &events {
        assert_eq!(ev["object"]["kind"], "PartialObjectMetadata", "{ev}");
        assert!(ev["object"].get("spec").is_none(), "{ev}");
    }
    assert_eq!(events[2]["type"], "BOOKMARK");
}

#[tokio::test]
async fn watches_stream_initial_events_then_the_end_bookmark() {
    let app = app().await;
    for name in ["a", "b", "c"] {
        assert_eq!(app.json("POST", LEASES, &lease(name)).await.code, 201);
    }
    let list = app.get(LEASES).await;
    let revision = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let streaming = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan\
                     &allowWatchBookmarks=true";
    // From "" (a consistent read), "0" (any) and a revision the client saw: the same.
    for rv in [
        "",
        "&resourceVersion=0",
        &format!("&resourceVersion={revision}"),
    ] {
        let events = app
            .watch_events(&format!("{LEASES}?{streaming}{rv}"), "application/json", 4)
            .await;
        let names: Vec<&str> = events[..3]
            .iter()
            .map(|e| {
                assert_eq!(e["type"], "ADDED", "{e}");
                e["object"]["metadata"]["name"].as_str().unwrap()
            })
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        let end = &events[3];
        assert_eq!(end["type"], "BOOKMARK", "{end}");
        assert_eq!(end["object"]["kind"], "Lease");
        assert_eq!(end["object"]["apiVersion"], "coordination.k8s.io/v1");
        assert_eq!(
            end["object"]["metadata"]["resourceVersion"],
            revision.as_str()
        );
        assert_eq!(
            end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
    }
    // With a selector only the matching objects; then the changes after the bookmark.
    let uri = format!("{LEASES}?{streaming}&fieldSelector=metadata.name%3Db");
    let req = Request::builder().uri(&uri).body(Body::empty()).unwrap();
    let resp = app.router.clone().oneshot(req).await.unwrap();
    let mut body = resp.into_body().into_data_stream();
    let mut buf = String::new();
    let mut patched = false;
    let read = async {
        use futures::StreamExt as _;
        while buf.lines().count() < 3 {
            if buf.lines().count() == 2 && !patched {
                patched = true;
                let p = app
                    .call(
                        "PATCH",
                        &format!("{LEASES}/b"),
                        "application/merge-patch+json",
                        br#"{"spec": {"holderIdentity": "w"}}"#.to_vec(),
                    )
                    .await;
                assert_eq!(p.code, 200, "{}", p.text);
                continue;
            }
            let chunk = body.next().await.expect("watch ended").unwrap();
            buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .unwrap_or_else(|_| panic!("watch stalled: {buf}"));
    let events: Vec<Value> = buf
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "b");
    assert_eq!(events[1]["type"], "BOOKMARK");
    assert_eq!(events[2]["type"], "MODIFIED");
    assert_eq!(events[2]["object"]["spec"]["holderIdentity"], "w");

    // sendInitialEvents=false from "": no initial state, only what changes.
    let uri =
        format!("{LEASES}?watch=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan");
    let req = Request::builder().uri(&uri).body(Body::empty()).unwrap();
    let resp = app.router.clone().oneshot(req).await.unwrap();
    assert_eq!(app.json("POST", LEASES, &lease("d")).await.code, 201);
    let mut body = resp.into_body().into_data_stream();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        use futures::StreamExt as _;
        body.next().await.expect("watch ended").unwrap()
    })
    .await
    .unwrap();
    let first: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "d");

    // Watch options kube-apiserver refuses: 422 on ListOptions.meta.k8s.io.
    for (query, message) in [
        (
            "watch=true&sendInitialEvents=true",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
             sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ),
        (
            "watch=true&resourceVersionMatch=NotOlderThan",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
             resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ),
        (
            "watch=true&sendInitialEvents=true&resourceVersionMatch=Exact",
            "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: \
             sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, \
             resourceVersionMatch: Unsupported value: \"Exact\": supported values: \
             \"NotOlderThan\"]",
        ),
    ] {
        let a = app.get(&format!("{LEASES}?{query}")).await;
        assert_status(&a, 422, "Invalid");
        assert_eq!(a.body["message"], message, "{query}");
        assert_eq!(a.body["details"]["kind"], "ListOptions");
        assert_eq!(a.body["details"]["group"], "meta.k8s.io");
    }
}

#[tokio::test]
async fn deletes_answer_200_unless_orphan_dependents_is_false() {
    let app = app().await;
    for name in ["gone", "kept", "accepted"] {
        let mut l = lease(name);
        if name != "gone" {
            l["metadata"]["finalizers"] = json!(["example.com/hold"]);
        }
        assert_eq!(app.json("POST", LEASES, &l).await.code, 201);
    }
    let gone = app
        .call("DELETE", &format!("{LEASES}/gone"), "", Vec::new())
        .await;
    assert_eq!(gone.code, 200, "{}", gone.text);
    assert_eq!(gone.body["metadata"]["name"], "gone");
    // Marked, not removed (a finalizer): still 200, with the object.
    let kept = app
        .json(
            "DELETE",
            &format!("{LEASES}/kept"),
            &json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}),
        )
        .await;
    assert_eq!(kept.code, 200, "{}", kept.text);
    assert!(kept.body["metadata"]["deletionTimestamp"].is_string());
    // ... 202 only with the deprecated orphanDependents: false.
    let accepted = app
        .json(
            "DELETE",
            &format!("{LEASES}/accepted"),
            &json!({"orphanDependents": false}),
        )
        .await;
    assert_eq!(accepted.code, 202, "{}", accepted.text);
    assert!(accepted.body["metadata"]["deletionTimestamp"].is_string());
}

/// Server-side apply over HTTP: create by apply (201), Kubernetes' conflict Status (409 with
/// FieldManagerConflict causes) against a manager that scaled through `/scale`, force.
#[tokio::test]
async fn server_side_apply_and_field_managers() {
    let app = app().await;
    let deploy = |replicas: i64| {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "host"}]},
                },
            },
        })
    };
    let url = "/apis/apps/v1/namespaces/default/deployments/web";
    let apply = |body: Value, query: &'static str| {
        let app = &app;
        async move {
            app.call(
                "PATCH",
                &format!("{url}?{query}"),
                "application/apply-patch+yaml",
                body.to_string().into_bytes(),
            )
            .await
        }
    };
    // Apply needs a field manager.
    let a = apply(deploy(2), "").await;
    assert_eq!(
        (a.code, a.body["reason"].as_str()),
        (400, Some("BadRequest"))
    );
    assert_eq!(
        a.body["message"],
        "fieldManager is required for apply requests"
    );
    let a = apply(deploy(2), "fieldManager=ci").await;
    assert_eq!(a.code, 201, "{}", a.text);
    assert_eq!(a.body["metadata"]["managedFields"][0]["manager"], "ci");
    assert_eq!(a.body["metadata"]["managedFields"][0]["operation"], "Apply");
    // Scaling through the scale subresource makes the scaler own spec.replicas.
    let s = app
        .call(
            "PATCH",
            &format!("{url}/scale?fieldManager=scaler"),
            "application/merge-patch+json",
            br#"{"spec":{"replicas":4}}"#.to_vec(),
        )
        .await;
    assert_eq!(s.code, 200, "{}", s.text);
    let live = app.call("GET", url, "", Vec::new()).await;
    let managers: Vec<&str> = live.body["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["manager"].as_str())
        .collect();
    assert_eq!(managers, ["ci", "scaler"], "{}", live.text);
    let a = apply(deploy(3), "fieldManager=ci").await;
    assert_eq!(
        (a.code, a.body["reason"].as_str()),
        (409, Some("Conflict")),
        "{}",
        a.text
    );
    assert_eq!(
        a.body["message"],
        "Apply failed with 1 conflict: conflict with \"scaler\" using apps/v1: .spec.replicas"
    );
    assert_eq!(
        a.body["details"]["causes"][0]["reason"],
        "FieldManagerConflict"
    );
    assert_eq!(a.body["details"]["causes"][0]["field"], ".spec.replicas");
    assert_eq!(a.body["details"]["name"], "web");
    let still = app.call("GET", url, "", Vec::new()).await;
    assert_eq!(
        still.body["spec"]["replicas"], 4,
        "a conflict writes nothing"
    );
    // force=true takes the field; force on another patch type is refused.
    let a = apply(deploy(3), "fieldManager=ci&force=true").await;
    assert_eq!(a.code, 200, "{}", a.text);
    assert_eq!(a.body["spec"]["replicas"], 3);
    let m = app
        .call(
            "PATCH",
            &format!("{url}?force=true"),
            "application/merge-patch+json",
            br#"{"spec":{"replicas":1}}"#.to_vec(),
        )
        .await;
    assert_eq!(m.code, 422, "{}", m.text);
    assert_eq!(m.body["details"]["causes"][0]["field"], "force");
    // A body of another kind is refused.
    let mut lease = deploy(1);
    lease["kind"] = json!("Lease");
    let a = apply(lease, "fieldManager=ci").await;
    assert_eq!(a.code, 400, "{}", a.text);
}

/// An extension API server on loopback for `wardle.example.com/v1alpha1` (TLS for
/// `wardle.wardle.svc`): discovery, a 418 with a header of its own, a redirect, an 8 MiB
/// answer (beyond any cap the webhook client has) and an echo of the headers it got.
async fn extension_server(ca: &skiff_pki::Ca) -> std::net::SocketAddr {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let serving = ca
        .issue(&skiff_pki::LeafSpec::server(
            "wardle.wardle.svc",
            &["wardle.wardle.svc".to_string()],
        ))
        .unwrap();
    let tls = Arc::new(skiff_pki::tls::server_config(&serving, None).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = |req: hyper::Request<hyper::body::Incoming>| async move {
        let path = req.uri().path().to_string();
        let mut resp = hyper::Response::new(Full::new(Bytes::new()));
        match path.rsplit('/').next().unwrap_or("") {
            "v1alpha1" => {
                *resp.body_mut() = Full::new(Bytes::from(
                    json!({"kind": "APIResourceList", "apiVersion": "v1",
                           "groupVersion": "wardle.example.com/v1alpha1",
                           "resources": [{"name": "flunders", "singularName": "flunder",
                                          "namespaced": true, "kind": "Flunder",
                                          "verbs": ["get", "list"]}]})
                    .to_string(),
                ));
            }
            "teapot" => {
                *resp.status_mut() = hyper::StatusCode::IM_A_TEAPOT;
                resp.headers_mut()
                    .insert("x-extension", "kept".parse().unwrap());
                resp.headers_mut()
                    .insert("content-type", "text/x-tea".parse().unwrap());
                *resp.body_mut() = Full::new(Bytes::from_static(b"short and stout"));
            }
            "redirect" => {
                *resp.status_mut() = hyper::StatusCode::FOUND;
                resp.headers_mut()
                    .insert("location", "http://169.254.169.254/".parse().unwrap());
            }
            "big" => *resp.body_mut() = Full::new(Bytes::from(vec![b'x'; 8 << 20])),
            _ => {
                let names: Vec<String> = req
                    .headers()
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.to_str().unwrap_or("")))
                    .collect();
                *resp.body_mut() = Full::new(Bytes::from(json!(names).to_string()));
            }
        }
        Ok::<_, std::convert::Infallible>(resp)
    };
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls));
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(stream),
                        hyper::service::service_fn(handle),
                    )
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn aggregated_apis_are_proxied_streamed_and_never_upgraded() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let store = skiff_store::EmbeddedStore::open(
        &dir.path().join("s.redb"),
        skiff_store::EmbeddedOptions::default(),
    )
    .unwrap();
    let registry = Arc::new(
        Registry::start(
            Arc::new(store),
            1024,
            Arc::new(crate::admission::Chain::default()),
        )
        .await
        .unwrap(),
    );
    super::super::bootstrap(&registry, &["default".to_string(), "wardle".to_string()])
        .await
        .unwrap();
    let aggregator = crate::aggregator::Aggregator::start(Arc::clone(&registry), None)
        .await
        .unwrap();
    let _availability = aggregator.run();
    let app = App {
        router: super::router(registry, None, None, None, None, Some(aggregator)),
        _dir: dir,
    };
    let ca = skiff_pki::Ca::generate("extension test CA").unwrap();
    let addr = extension_server(&ca).await;
    let post = |url: &'static str, body: Value| {
        let app = &app;
        async move {
            let a = app
                .call(
                    "POST",
                    url,
                    "application/json",
                    body.to_string().into_bytes(),
                )
                .await;
            assert_eq!(a.code, 201, "{}", a.text);
        }
    };
    post(
        "/api/v1/namespaces/wardle/services",
        json!({"metadata": {"name": "wardle"}, "spec": {"ports": [{"port": 443, "targetPort": addr.port()}]}}),
    )
    .await;
    post(
        "/api/v1/namespaces/wardle/endpoints",
        json!({"metadata": {"name": "wardle"}, "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": addr.port()}]}]}),
    )
    .await;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca.cert_pem());
    post(
        "/apis/apiregistration.k8s.io/v1/apiservices",
        json!({"metadata": {"name": "v1alpha1.wardle.example.com"},
               "spec": {"group": "wardle.example.com", "version": "v1alpha1",
                        "groupPriorityMinimum": 1000, "versionPriority": 15, "caBundle": bundle,
                        "service": {"namespace": "wardle", "name": "wardle"}}}),
    )
    .await;
    let base = "/apis/wardle.example.com/v1alpha1";
    // Not Available before its first check passed: kube-aggregator's 503.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let a = app
            .call(
                "GET",
                "/apis/apiregistration.k8s.io/v1/apiservices/v1alpha1.wardle.example.com",
                "",
                Vec::new(),
            )
            .await;
        if a.body["status"]["conditions"][0]["reason"] == "Passed" {
            break;
        }
        let early = app
            .call("GET", &format!("{base}/echo"), "", Vec::new())
            .await;
        // (404 until the aggregator's mirror saw the new APIService.)
        assert!(
            early.code == 404 || (early.code == 503 && early.text == "service unavailable\n"),
            "{} {}",
            early.code,
            early.text
        );
        assert!(
            std::time::Instant::now() < deadline,
            "never Available: {}",
            a.text
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Discovery: the group-version's own document is the server's; /apis lists the group.
    let a = app.call("GET", base, "", Vec::new()).await;
    assert_eq!(a.body["resources"][0]["name"], "flunders", "{}", a.text);
    let a = app.call("GET", "/apis", "", Vec::new()).await;
    assert!(
        a.body["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "wardle.example.com"),
        "{}",
        a.text
    );
    // Status, headers and body pass through unchanged.
    let a = app
        .call("GET", &format!("{base}/teapot"), "", Vec::new())
        .await;
    assert_eq!((a.code, a.text.as_str()), (418, "short and stout"));
    assert_eq!(a.content_type, "text/x-tea");
    // No cap: 8 MiB arrive whole.
    let a = app
        .call("GET", &format!("{base}/big"), "", Vec::new())
        .await;
    assert_eq!((a.code, a.text.len()), (200, 8 << 20));
    // A redirect is not forwarded.
    let a = app
        .call("GET", &format!("{base}/redirect"), "", Vec::new())
        .await;
    assert_eq!(a.code, 502, "{}", a.text);
    assert!(!a.text.contains("169.254"), "{}", a.text);
    // Credentials and identity headers from the client never reach the server.
    let req = Request::builder()
        .uri(format!("{base}/echo"))
        .header("authorization", "Bearer secret")
        .header("x-remote-user", "system:admin")
        .header("impersonate-user", "system:admin")
        .header("accept", "application/json")
        .body(Body::empty())
        .unwrap();
    let resp = app.router.clone().oneshot(req).await.unwrap();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let seen = String::from_utf8_lossy(&bytes).to_lowercase();
    assert!(seen.contains("accept=application/json"), "{seen}");
    for gone in [
        "authorization",
        "x-remote-user",
        "impersonate-user",
        "secret",
    ] {
        assert!(!seen.contains(gone), "{gone} reached the server: {seen}");
    }
    // An upgrade is refused before anything is dialled.
    let req = Request::builder()
        .uri(format!("{base}/echo"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .body(Body::empty())
        .unwrap();
    let resp = app.router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 400);
    // Without endpoints: MissingEndpoints, and kube-aggregator's 503.
    let gone = app
        .call(
            "DELETE",
            "/api/v1/namespaces/wardle/endpoints/wardle",
            "",
            Vec::new(),
        )
        .await;
    assert_eq!(gone.code, 200, "{}", gone.text);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let a = app
            .call(
                "GET",
                "/apis/apiregistration.k8s.io/v1/apiservices/v1alpha1.wardle.example.com",
                "",
                Vec::new(),
            )
            .await;
        if a.body["status"]["conditions"][0]["reason"] == "EndpointsNotFound" {
            assert_eq!(
                a.body["status"]["conditions"][0]["message"],
                "cannot find endpoints for service/wardle in \"wardle\""
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {}", a.text);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let a = app
        .call("GET", &format!("{base}/echo"), "", Vec::new())
        .await;
    assert_eq!((a.code, a.text.as_str()), (503, "service unavailable\n"));
}
