//! An operator written with kube-rs runs unchanged against Skiff: a
//! `#[derive(CustomResource)]` kind with a status subresource, its definition applied from
//! `CustomResourceExt::crd()` and awaited with kube-rs' own `is_crd_established`, and a
//! `kube::runtime::Controller` that makes a Deployment per object (owned through a
//! controller reference), follows spec changes and writes the status through `/status`.
//! Deleting the custom object lets the garbage collector delete its Deployment (a custom
//! owner); Orphan and Foreground deletion of custom owners finish as Kubernetes' do, and
//! custom objects owned by a custom object or by a ConfigMap are collected with their owners.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{conditions, wait::await_condition, watcher};
use kube::{CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use skiff_tests::cluster::Cluster;

/// An echo service: a Deployment of `replicas` pods.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "demo.skiff.io",
    version = "v1",
    kind = "Echo",
    namespaced,
    status = "EchoStatus",
    shortname = "ec",
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#
)]
pub struct EchoSpec {
    replicas: i32,
    image: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema)]
pub struct EchoStatus {
    deployment: Option<String>,
    observed_replicas: Option<i32>,
}

/// The reconciler's error: a failed API call.
#[derive(Debug)]
struct Failure(kube::Error);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Failure {}

/// Makes the object's Deployment (server-side apply, owned by the Echo) and reports it in
/// the status.
async fn reconcile(echo: Arc<Echo>, client: Arc<kube::Client>) -> Result<Action, Failure> {
    let ns = echo.namespace().unwrap_or_default();
    let name = format!("echo-{}", echo.name_any());
    let owner = echo.controller_owner_ref(&()).expect("an owner reference");
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "ownerReferences": [owner]},
        "spec": {
            "replicas": echo.spec.replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "echo", "image": echo.spec.image}]},
            },
        },
    });
    let deployments: Api<Deployment> = Api::namespaced((*client).clone(), &ns);
    deployments
        .patch(
            &name,
            &PatchParams::apply("echo-operator").force(),
            &Patch::Apply(deployment),
        )
        .await
        .map_err(Failure)?;
    let echoes: Api<Echo> = Api::namespaced((*client).clone(), &ns);
    echoes
        .patch_status(
            &echo.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "deployment": name,
                "observed_replicas": echo.spec.replicas,
            }})),
        )
        .await
        .map_err(Failure)?;
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Echo>, _: &Failure, _: Arc<kube::Client>) -> Action {
    Action::requeue(Duration::from_millis(500))
}

async fn eventually<F, Fut>(c: &Cluster, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("timed out waiting for {what}\n{}", c.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_rs_operator_reconciles_its_custom_kind() {
    let c = Cluster::start(0).await;
    let kubeconfig = kube::config::Kubeconfig::read_from(&c.server.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();

    // The definition kube-rs derives, applied and awaited the kube-rs way.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Echo::crd())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.logs()));
    let established = await_condition(
        crds.clone(),
        Echo::crd_name(),
        conditions::is_crd_established(),
    );
    if tokio::time::timeout(Duration::from_secs(60), established)
        .await
        .is_err()
    {
        let (_, out, _) = c.kubectl(&["get", "crd", Echo::crd_name(), "-o", "yaml"], None);
        panic!("not established in time:\n{out}\n{}", c.logs());
    }

    // The operator.
    let echoes: Api<Echo> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let operator = tokio::spawn(
        Controller::new(echoes.clone(), watcher::Config::default())
            .owns(deployments.clone(), watcher::Config::default())
            .run(reconcile, error_policy, Arc::new(client.clone()))
            .for_each(|_| async {}),
    );

    let echo = Echo::new(
        "one",
        EchoSpec {
            replicas: 2,
            image: "127.0.0.1:5000/echo:v1".into(),
        },
    );
    echoes.create(&PostParams::default(), &echo).await.unwrap();
    eventually(&c, "the Deployment and the status", || async {
        let Ok(Some(d)) = deployments.get_opt("echo-one").await else {
            return false;
        };
        let owned = d.metadata.owner_references.as_ref().is_some_and(|o| {
            o.iter()
                .any(|r| r.kind == "Echo" && r.controller == Some(true))
        });
        let status = echoes
            .get_status("one")
            .await
            .ok()
            .and_then(|e| e.status)
            .and_then(|s| s.deployment);
        owned && status.as_deref() == Some("echo-one")
    })
    .await;

    // A spec change reaches the Deployment; the main endpoint left the status alone.
    echoes
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}, "status": {"deployment": "forged"}})),
        )
        .await
        .unwrap();
    eventually(&c, "the new replica count", || async {
        deployments
            .get("echo-one")
            .await
            .ok()
            .and_then(|d| d.spec)
            .and_then(|s| s.replicas)
            == Some(3)
    })
    .await;
    let e = echoes.get("one").await.unwrap();
    assert_eq!(e.meta().generation, Some(2));
    assert_ne!(
        e.status.and_then(|s| s.deployment).as_deref(),
        Some("forged")
    );

    // Deleting the custom object collects its Deployment.
    echoes.delete("one", &Default::default()).await.unwrap();
    eventually(
        &c,
        "the garbage collector to delete the Deployment",
        || async { matches!(deployments.get_opt("echo-one").await, Ok(None)) },
    )
    .await;

    // The other propagation policies, with a custom owner: Orphan leaves the Deployment
    // without the reference, Foreground deletes it before the owner.
    for name in ["orphaning", "foreground"] {
        let echo = Echo::new(
            name,
            EchoSpec {
                replicas: 1,
                image: "127.0.0.1:5000/echo:v1".into(),
            },
        );
        echoes.create(&PostParams::default(), &echo).await.unwrap();
        let deployment = format!("echo-{name}");
        eventually(&c, "the Deployment", || async {
            matches!(deployments.get_opt(&deployment).await, Ok(Some(_)))
        })
        .await;
    }
    echoes
        .delete("orphaning", &kube::api::DeleteParams::orphan())
        .await
        .unwrap();
    eventually(&c, "the orphaning owner to go", || async {
        matches!(echoes.get_opt("orphaning").await, Ok(None))
    })
    .await;
    let orphan = deployments.get("echo-orphaning").await.unwrap();
    assert!(
        orphan
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty(),
        "the orphan keeps no reference to its owner"
    );
    operator.abort();
    echoes
        .delete("foreground", &kube::api::DeleteParams::foreground())
        .await
        .unwrap();
    eventually(
        &c,
        "the foreground owner and its Deployment to go",
        || async {
            matches!(echoes.get_opt("foreground").await, Ok(None))
                && matches!(deployments.get_opt("echo-foreground").await, Ok(None))
        },
    )
    .await;

    // Custom objects are dependents too: one owned by another custom object, and one owned
    // by a ConfigMap, go with their owners.
    let spec = || EchoSpec {
        replicas: 0,
        image: "127.0.0.1:5000/echo:v1".into(),
    };
    let parent = echoes
        .create(&PostParams::default(), &Echo::new("parent", spec()))
        .await
        .unwrap();
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "default");
    let map = maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    for (name, owner) in [
        ("of-echo", parent.controller_owner_ref(&()).unwrap()),
        ("of-map", map.controller_owner_ref(&()).unwrap()),
    ] {
        let mut echo = Echo::new(name, spec());
        echo.metadata.owner_references = Some(vec![owner]);
        echoes.create(&PostParams::default(), &echo).await.unwrap();
    }
    echoes.delete("parent", &Default::default()).await.unwrap();
    maps.delete("owner", &Default::default()).await.unwrap();
    eventually(&c, "the custom dependents to be collected", || async {
        matches!(echoes.get_opt("of-echo").await, Ok(None))
            && matches!(echoes.get_opt("of-map").await, Ok(None))
    })
    .await;
}
