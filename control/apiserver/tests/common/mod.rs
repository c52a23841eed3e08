//! Shared test support: a real store backend (embedded redb in a tempdir or a throwaway
//! etcd), an API server on a loopback port, and a typed client over real gRPC.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::{
    Container, Deployment, DeploymentSpec, LabelSelector, ObjectMeta, Pod, PodSpec, PodTemplateSpec,
};
use skiff_api::rpc::api_client::ApiClient;
use skiff_api::rpc::{
    CreateRequest, DeleteRequest, GetRequest, ListRequest, UpdateRequest, WatchEvent, WatchRequest,
};
use skiff_apiserver::{ApiServerOptions, ServerHandle};
use skiff_store::testutil::EtcdServer;
use skiff_store::{EmbeddedOptions, EmbeddedStore, EtcdStore, Store};
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Etcd,
}

/// Keeps a backend alive (its directory or its etcd process).
pub enum BackendGuard {
    Embedded(tempfile::TempDir),
    Etcd(EtcdServer),
}

/// Opens a fresh, empty store of the given kind.
pub async fn open_store(backend: Backend) -> (Arc<dyn Store>, BackendGuard) {
    match backend {
        Backend::Embedded => {
            let dir = tempfile::tempdir().expect("tempdir");
            let store =
                EmbeddedStore::open(&dir.path().join("skiff.redb"), EmbeddedOptions::default())
                    .expect("open embedded store");
            (Arc::new(store), BackendGuard::Embedded(dir))
        }
        Backend::Etcd => {
            let etcd = EtcdServer::start().expect("start etcd");
            let store = EtcdStore::connect(&etcd.endpoints())
                .await
                .expect("connect to etcd");
            (Arc::new(store), BackendGuard::Etcd(etcd))
        }
    }
}

/// A running API server over a real store, with a connected client.
pub struct TestServer {
    pub api: Api,
    pub handle: ServerHandle,
    pub store: Arc<dyn Store>,
    pub guard: BackendGuard,
}

impl TestServer {
    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, ApiServerOptions::default()).await
    }

    pub async fn start_with(backend: Backend, opts: ApiServerOptions) -> Self {
        let (store, guard) = open_store(backend).await;
        let handle = serve(Arc::clone(&store), opts).await;
        let api = Api::connect(&handle.endpoint()).await;
        TestServer {
            api,
            handle,
            store,
            guard,
        }
    }
}

/// Spawns an API server on a free loopback port.
pub async fn serve(store: Arc<dyn Store>, opts: ApiServerOptions) -> ServerHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    skiff_apiserver::spawn(store, listener, opts)
        .await
        .expect("spawn API server")
}

/// A typed client over the generic gRPC API.
#[derive(Clone)]
pub struct Api {
    pub client: ApiClient<Channel>,
}

pub type R<T> = Result<T, Status>;

impl Api {
    pub async fn connect(endpoint: &str) -> Self {
        let client = ApiClient::connect(endpoint.to_string())
            .await
            .expect("connect to the API server");
        Api { client }
    }

    pub async fn create<T: Resource>(&self, namespace: &str, obj: &T) -> R<T> {
        let r = self
            .client
            .clone()
            .create(CreateRequest {
                resource: T::INFO.plural.into(),
                namespace: namespace.into(),
                object: obj.encode_to_vec(),
            })
            .await?;
        Ok(decode(&r.into_inner().object))
    }

    pub async fn get<T: Resource>(&self, namespace: &str, name: &str) -> R<T> {
        let r = self
            .client
            .clone()
            .get(GetRequest {
                resource: T::INFO.plural.into(),
                namespace: namespace.into(),
                name: name.into(),
            })
            .await?;
        Ok(decode(&r.into_inner().object))
    }

    /// Items and the list's resourceVersion.
    pub async fn list<T: Resource>(
        &self,
        namespace: &str,
        label_selector: &str,
        field_selector: &str,
    ) -> R<(Vec<T>, String)> {
        let r = self
            .client
            .clone()
            .list(ListRequest {
                resource: T::INFO.plural.into(),
                namespace: namespace.into(),
                label_selector: label_selector.into(),
                field_selector: field_selector.into(),
            })
            .await?
            .into_inner();
        Ok((
            r.items.iter().map(|b| decode(b)).collect(),
            r.resource_version,
        ))
    }

    /// Names of the listed objects, sorted.
    pub async fn names<T: Resource>(
        &self,
        namespace: &str,
        labels: &str,
        fields: &str,
    ) -> Vec<String> {
        let (items, _) = self
            .list::<T>(namespace, labels, fields)
            .await
            .expect("list");
        let mut names: Vec<String> = items.iter().map(|o| o.name().to_string()).collect();
        names.sort();
        names
    }

    pub async fn update<T: Resource>(&self, obj: &T, subresource: &str) -> R<T> {
        let r = self
            .client
            .clone()
            .update(UpdateRequest {
                resource: T::INFO.plural.into(),
                namespace: obj.namespace().into(),
                object: obj.encode_to_vec(),
                subresource: subresource.into(),
            })
            .await?;
        Ok(decode(&r.into_inner().object))
    }

    pub async fn delete<T: Resource>(&self, namespace: &str, name: &str) -> R<T> {
        self.delete_with::<T>(DeleteRequest {
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        })
        .await
    }

    /// `req.resource` is filled in from `T`.
    pub async fn delete_with<T: Resource>(&self, mut req: DeleteRequest) -> R<T> {
        req.resource = T::INFO.plural.into();
        let r = self.client.clone().delete(req).await?;
        Ok(decode(&r.into_inner().object))
    }

    pub async fn watch<T: Resource>(
        &self,
        namespace: &str,
        label_selector: &str,
        field_selector: &str,
        resource_version: &str,
    ) -> R<Streaming<WatchEvent>> {
        let r = self
            .client
            .clone()
            .watch(WatchRequest {
                resource: T::INFO.plural.into(),
                namespace: namespace.into(),
                label_selector: label_selector.into(),
                field_selector: field_selector.into(),
                resource_version: resource_version.into(),
            })
            .await?;
        Ok(r.into_inner())
    }
}

pub fn decode<T: Resource>(bytes: &[u8]) -> T {
    T::decode(bytes).expect("decode object")
}

/// The next event of a watch, failing the test after `secs` seconds.
pub async fn next_event(stream: &mut Streaming<WatchEvent>, secs: u64) -> R<WatchEvent> {
    match tokio::time::timeout(Duration::from_secs(secs), stream.message()).await {
        Err(_) => panic!("no watch event within {secs}s"),
        Ok(Ok(Some(ev))) => Ok(ev),
        Ok(Ok(None)) => panic!("watch ended"),
        Ok(Err(status)) => Err(status),
    }
}

/// Asserts that no event arrives within `ms` milliseconds.
pub async fn assert_quiet(stream: &mut Streaming<WatchEvent>, ms: u64) {
    if let Ok(r) = tokio::time::timeout(Duration::from_millis(ms), stream.message()).await {
        panic!("unexpected watch item: {r:?}");
    }
}

/// Asserts a gRPC error's code, `skiff-reason`, and that its message contains every needle.
#[track_caller]
pub fn assert_status<T: std::fmt::Debug>(r: R<T>, code: Code, reason: &str, needles: &[&str]) {
    let status = match r {
        Ok(v) => panic!("expected {code:?}, got Ok({v:?})"),
        Err(s) => s,
    };
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get(skiff_apiserver::REASON_KEY)
            .and_then(|v| v.to_str().ok()),
        Some(reason),
        "{status:?}"
    );
    for n in needles {
        assert!(
            status.message().contains(n),
            "{n:?} not in {:?}",
            status.message()
        );
    }
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn meta(name: &str, namespace: &str, label_pairs: &[(&str, &str)]) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: name.into(),
        namespace: namespace.into(),
        labels: labels(label_pairs),
        ..Default::default()
    })
}

pub fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        image: "host".into(),
        command: vec!["sleep".into(), "3600".into()],
        ..Default::default()
    }
}

pub fn pod(name: &str, namespace: &str, label_pairs: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: meta(name, namespace, label_pairs),
        spec: Some(PodSpec {
            containers: vec![container("main")],
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn deployment(name: &str, namespace: &str, replicas: i32) -> Deployment {
    let app = labels(&[("app", name)]);
    Deployment {
        metadata: meta(name, namespace, &[]),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: Some(LabelSelector {
                match_labels: app.clone(),
                ..Default::default()
            }),
            template: Some(PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: app,
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container("web")],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
