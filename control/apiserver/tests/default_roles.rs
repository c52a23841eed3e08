//! A default ClusterRole stored by an older server gets the rules a newer server's default
//! has (kube-apiserver's default-role reconciliation at start), and keeps what an operator
//! added; one annotated `rbac.authorization.kubernetes.io/autoupdate: "false"` is left alone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use common::{Api, Backend, open_store, serve};
use skiff_api::api::{ClusterRole, PolicyRule};
use skiff_apiserver::ApiServerOptions;

fn rule(verb: &str, resource: &str) -> PolicyRule {
    PolicyRule {
        verbs: vec![verb.into()],
        api_groups: vec!["example.com".into()],
        resources: vec![resource.into()],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_roles_get_their_missing_rules_at_start() {
    let (store, _guard) = open_store(Backend::Embedded).await;
    let server = serve(std::sync::Arc::clone(&store), ApiServerOptions::default()).await;
    let api = Api::connect(&server.endpoint()).await;
    let role = "system:kube-controller-manager";
    // As an older server left it: the signer rules missing, and an operator's addition.
    let mut cm: ClusterRole = api.get("", role).await.unwrap();
    let full = cm.rules.clone();
    cm.rules
        .retain(|r| !r.resources.iter().any(|x| x == "signers"));
    assert!(cm.rules.len() < full.len());
    cm.rules.push(rule("get", "widgets"));
    api.update(&cm, "").await.unwrap();
    // Another default role the operator pinned.
    let mut view: ClusterRole = api.get("", "system:kube-scheduler").await.unwrap();
    view.rules.truncate(1);
    view.metadata
        .get_or_insert_with(Default::default)
        .annotations
        .insert(
            "rbac.authorization.kubernetes.io/autoupdate".into(),
            "false".into(),
        );
    api.update(&view, "").await.unwrap();
    server.shutdown().await;

    let server = serve(store, ApiServerOptions::default()).await;
    let api = Api::connect(&server.endpoint()).await;
    let cm: ClusterRole = api.get("", role).await.unwrap();
    for r in &full {
        assert!(cm.rules.contains(r), "missing after restart: {r:?}");
    }
    assert!(
        cm.rules.contains(&rule("get", "widgets")),
        "the operator's rule kept"
    );
    let pinned: ClusterRole = api.get("", "system:kube-scheduler").await.unwrap();
    assert_eq!(
        pinned.rules.len(),
        1,
        "an autoupdate=false role is left as it is"
    );
    server.shutdown().await;
}
