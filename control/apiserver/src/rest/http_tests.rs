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
    let registry = Arc::new(Registry::start(Arc::new(store), 1024).await.unwrap());
    super::super::bootstrap(&registry, &["default".to_string()])
        .await
        .unwrap();
    App {
        router: super::router(registry),
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
}
