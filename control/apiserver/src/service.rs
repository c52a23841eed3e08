//! The gRPC service: a thin layer that routes each call to the resource's handler and maps
//! errors through [`ApiError::to_status`].

use std::sync::Arc;

use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_api::rpc::api_server::Api;
use skiff_api::rpc::{
    BindRequest, CreateRequest, DeleteRequest, DiscoveryRequest, DiscoveryResponse, GetRequest,
    ListRequest, ListResponse, ObjectResponse, ResourceInfo, UpdateRequest, WatchEvent,
    WatchRequest,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, warn};

use crate::error::ApiError;
use crate::registry::{Registry, WriteOptions};

/// Implements `skiff.rpc.Api` over a [`Registry`].
pub(crate) struct ApiService {
    registry: Arc<Registry>,
}

impl ApiService {
    pub fn new(registry: Arc<Registry>) -> Self {
        ApiService { registry }
    }
}

/// Logs and converts an operation's result.
fn respond<T>(op: &str, resource: &str, r: Result<T, ApiError>) -> Result<Response<T>, Status> {
    match r {
        Ok(v) => Ok(Response::new(v)),
        Err(e) => {
            match &e {
                ApiError::Internal(_) | ApiError::Unavailable(_) => {
                    warn!(op, resource, error = %e, "request failed")
                }
                _ => debug!(op, resource, error = %e, "request rejected"),
            }
            Err(e.to_status())
        }
    }
}

fn object(object: Vec<u8>) -> ObjectResponse {
    ObjectResponse { object }
}

#[tonic::async_trait]
impl Api for ApiService {
    async fn create(
        &self,
        request: Request<CreateRequest>,
    ) -> Result<Response<ObjectResponse>, Status> {
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(&r.resource)?;
            h.create(&r.namespace, &r.object, WriteOptions::default())
                .await
                .map(object)
        }
        .await;
        respond("create", &r.resource, result)
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<ObjectResponse>, Status> {
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(&r.resource)?;
            h.get(&r.namespace, &r.name).await.map(object)
        }
        .await;
        respond("get", &r.resource, result)
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let r = request.into_inner();
        let result = async { self.registry.handler(&r.resource)?.list(&r, None).await }.await;
        respond("list", &r.resource, result)
    }

    async fn update(
        &self,
        request: Request<UpdateRequest>,
    ) -> Result<Response<ObjectResponse>, Status> {
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(&r.resource)?;
            h.update(
                &r.namespace,
                &r.object,
                &r.subresource,
                WriteOptions::default(),
            )
            .await
            .map(object)
        }
        .await;
        respond("update", &r.resource, result)
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<ObjectResponse>, Status> {
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(&r.resource)?;
            h.delete(&r, WriteOptions::default()).await.map(object)
        }
        .await;
        respond("delete", &r.resource, result)
    }

    type WatchStream = ReceiverStream<Result<WatchEvent, Status>>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(&r.resource)?;
            h.watch(&r).await.map(ReceiverStream::new)
        }
        .await;
        respond("watch", &r.resource, result)
    }

    async fn bind(
        &self,
        request: Request<BindRequest>,
    ) -> Result<Response<ObjectResponse>, Status> {
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(Pod::INFO.plural)?;
            h.bind(&r.namespace, &r.binding).await.map(object)
        }
        .await;
        respond("bind", "pods", result)
    }

    async fn discovery(
        &self,
        _request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let resources = self
            .registry
            .infos()
            .into_iter()
            .map(|i| ResourceInfo {
                api_version: i.api_version.to_string(),
                kind: i.kind.to_string(),
                plural: i.plural.to_string(),
                short_names: i.short_names.iter().map(|s| s.to_string()).collect(),
                namespaced: i.namespaced,
                has_status: i.has_status,
            })
            .collect();
        Ok(Response::new(DiscoveryResponse { resources }))
    }
}
