//! The gRPC service: a thin layer that routes each call to the resource's handler and maps
//! errors through [`ApiError::to_status`].

use skiff_api::Encoded;
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

use crate::auth::authz::Authorizer;
use crate::error::ApiError;
use crate::registry::{Registry, WriteOptions};
use crate::request::Attributes;
use crate::request::UserInfo;

/// Implements `skiff.rpc.Api` over a [`Registry`].
pub(crate) struct ApiService {
    registry: Arc<Registry>,
    /// `None`: every call is allowed (in-process servers without authentication).
    authorizer: Option<Arc<Authorizer>>,
}

/// The metadata of any resource message (field 3 in every kind), decoded without the rest.
#[derive(Clone, PartialEq, prost::Message)]
struct MetaOnly {
    #[prost(message, optional, tag = "3")]
    metadata: Option<skiff_api::api::ObjectMeta>,
}

fn name_in(object: &[u8]) -> String {
    <MetaOnly as prost::Message>::decode(object)
        .ok()
        .and_then(|m| m.metadata)
        .map(|m| m.name)
        .unwrap_or_default()
}

/// What a gRPC call asks for, before the group is looked up.
struct GrpcCall<'a> {
    verb: &'a str,
    resource: &'a str,
    subresource: &'a str,
    namespace: &'a str,
    name: String,
    field_selector: &'a str,
    object_name: String,
}

impl ApiService {
    pub fn new(registry: Arc<Registry>, authorizer: Option<Arc<Authorizer>>) -> Self {
        ApiService {
            registry,
            authorizer,
        }
    }

    /// Authorizes a call as the REST API would the same request; `PERMISSION_DENIED` with
    /// kube-apiserver's message otherwise.
    fn authorize<R>(&self, request: &Request<R>, call: GrpcCall<'_>) -> Result<(), Status> {
        if self.authorizer.is_none() {
            return Ok(());
        }
        // A custom kind is named `<plural>.<group>`; rules name its plural and group.
        let (group, resource) = self
            .registry
            .handler(call.resource)
            .map(|h| (h.info().group().to_string(), h.info().plural.to_string()))
            .unwrap_or_else(|_| (String::new(), call.resource.to_string()));
        let mut a = Attributes::resource(
            call.verb,
            &group,
            &resource,
            call.subresource,
            call.namespace,
            &call.name,
        )
        .selecting(call.field_selector);
        a.object_name = call.object_name;
        crate::pipeline::authorize(
            self.authorizer.as_deref(),
            request.extensions().get::<UserInfo>(),
            request.extensions().get::<crate::request::AuditSlot>(),
            &a,
        )
        .map_err(|d| match d {
            crate::pipeline::Denied::Unauthenticated => Status::unauthenticated("Unauthorized"),
            crate::pipeline::Denied::Forbidden(m) => Status::permission_denied(m),
        })
    }
}

/// How a call writes: as its authenticated user, noting admission refusals in its audit
/// record.
fn write_options<R>(request: &Request<R>) -> WriteOptions {
    WriteOptions {
        requester: request.extensions().get::<UserInfo>().cloned(),
        audit: request
            .extensions()
            .get::<crate::request::AuditSlot>()
            .cloned(),
        ..WriteOptions::default()
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
        self.authorize(
            &request,
            GrpcCall {
                verb: "create",
                resource: &request.get_ref().resource,
                subresource: "",
                namespace: &request.get_ref().namespace,
                name: String::new(),
                field_selector: "",
                object_name: name_in(&request.get_ref().object),
            },
        )?;
        let opts = write_options(&request);
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(&r.resource)?;
            h.create(&r.namespace, Encoded::Bytes(r.object), opts)
                .await
                .map(object)
        }
        .await;
        respond("create", &r.resource, result)
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<ObjectResponse>, Status> {
        let g = request.get_ref();
        self.authorize(
            &request,
            GrpcCall {
                verb: "get",
                resource: &g.resource,
                subresource: "",
                namespace: &g.namespace,
                name: g.name.clone(),
                field_selector: "",
                object_name: String::new(),
            },
        )?;
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(&r.resource)?;
            h.get(&r.namespace, &r.name).await.map(object)
        }
        .await;
        respond("get", &r.resource, result)
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let l = request.get_ref();
        self.authorize(
            &request,
            GrpcCall {
                verb: "list",
                resource: &l.resource,
                subresource: "",
                namespace: &l.namespace,
                name: String::new(),
                field_selector: &l.field_selector,
                object_name: String::new(),
            },
        )?;
        let r = request.into_inner();
        let result = async { self.registry.handler(&r.resource)?.list(&r, None).await }.await;
        respond("list", &r.resource, result)
    }

    async fn update(
        &self,
        request: Request<UpdateRequest>,
    ) -> Result<Response<ObjectResponse>, Status> {
        let u = request.get_ref();
        self.authorize(
            &request,
            GrpcCall {
                verb: "update",
                resource: &u.resource,
                subresource: &u.subresource,
                namespace: &u.namespace,
                name: name_in(&u.object),
                field_selector: "",
                object_name: String::new(),
            },
        )?;
        let opts = write_options(&request);
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(&r.resource)?;
            h.update(&r.namespace, Encoded::Bytes(r.object), &r.subresource, opts)
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
        let d = request.get_ref();
        self.authorize(
            &request,
            GrpcCall {
                verb: "delete",
                resource: &d.resource,
                subresource: "",
                namespace: &d.namespace,
                name: d.name.clone(),
                field_selector: "",
                object_name: String::new(),
            },
        )?;
        let opts = write_options(&request);
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(&r.resource)?;
            h.delete(&r, opts).await.map(object)
        }
        .await;
        respond("delete", &r.resource, result)
    }

    type WatchStream = ReceiverStream<Result<WatchEvent, Status>>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let w = request.get_ref();
        self.authorize(
            &request,
            GrpcCall {
                verb: "watch",
                resource: &w.resource,
                subresource: "",
                namespace: &w.namespace,
                name: String::new(),
                field_selector: &w.field_selector,
                object_name: String::new(),
            },
        )?;
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
        let b = request.get_ref();
        let pod = <skiff_api::api::Binding as prost::Message>::decode(b.binding.as_slice())
            .ok()
            .and_then(|b| b.metadata)
            .map(|m| m.name)
            .unwrap_or_default();
        self.authorize(
            &request,
            GrpcCall {
                verb: "create",
                resource: Pod::INFO.plural,
                subresource: "binding",
                namespace: &b.namespace,
                name: pod,
                field_selector: "",
                object_name: String::new(),
            },
        )?;
        let opts = write_options(&request);
        let r = request.into_inner();
        let result = async {
            let h = self.registry.handler(Pod::INFO.plural)?;
            h.bind(&r.namespace, &r.binding, opts).await.map(object)
        }
        .await;
        respond("bind", "pods", result)
    }

    async fn discovery(
        &self,
        _request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let custom = self.registry.custom_kinds();
        let resources = self
            .registry
            .infos()
            .into_iter()
            .chain(custom.iter().map(|k| k.info()))
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
