//! `pods/<name>/portforward`: kubectl's port forwarding, a SPDY/3.1 session
//! ([`super::spdy`], [`super::spdy_streams`]) either tunnelled in a WebSocket (subprotocol
//! `SPDY/3.1+portforward.k8s.io`, kubectl 1.32's default) or on the connection itself
//! (`Upgrade: SPDY/3.1` with `X-Stream-Protocol-Version: portforward.k8s.io`: older kubectl,
//! `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`, client-go's `portforward.New`). Only the
//! transport differs; the session is [`session`]'s.
//!
//! For each local connection kubectl opens two streams with the same `requestID` header: an
//! error stream and a data stream, both naming the pod's `port`. Each data stream becomes a
//! tunnel to `localhost:<port>` in the pod's network namespace through the pod's node agent
//! (`skiff_client::node_api::AgentEndpoint::port_forward`); bytes go both ways as DATA frames,
//! a FIN from either side half-closes, and when the pod's side ends both streams are closed
//! (kubectl waits for the error stream to close). A failure to connect is written on the
//! error stream, as the kubelet writes it, so kubectl reports it and keeps listening. A
//! session holds at most [`spdy_streams::MAX_OPEN_STREAMS`] streams open; more are refused.

use std::collections::HashMap;

use axum::extract::FromRequestParts as _;
use axum::extract::ws::{WebSocket, WebSocketUpgrade};
use axum::http::request::Parts;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt as _;
use prost::Message as _;
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::node_api::AgentEndpoint;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::debug;

use super::context::Rest;
use super::node_proxy;
use super::path::ResourcePath;
use super::query::Query;
use super::spdy::{self, Frame};
use super::spdy_streams::{
    self, ByteReader, ByteWriter, FrameSource, Inbound, Outbound, PORT_FORWARD_PROTOCOL,
    StreamTable, Upgraded,
};
use crate::ApiError;
use crate::status::plain_failure;

/// The WebSocket subprotocol kubectl asks for.
const PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// Bytes read from the pod per DATA frame.
const CHUNK: usize = 32 * 1024;

/// `GET|POST /api/v1/namespaces/<ns>/pods/<name>/portforward` (a WebSocket or SPDY/3.1
/// upgrade).
pub(crate) async fn serve(rest: &Rest, mut parts: Parts, p: ResourcePath, _q: Query) -> Response {
    let namespace = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let target = match target(rest, &namespace, &name).await {
        Ok(t) => t,
        Err(e) => return node_proxy::pod_failure(&e, &name),
    };
    if spdy_streams::wants_spdy(&parts) {
        let offered = spdy_streams::offered(&parts);
        let supported = [PORT_FORWARD_PROTOCOL];
        let Some(protocol) = spdy_streams::negotiate(&offered, &supported) else {
            return spdy_streams::no_common_protocol(&offered, &supported);
        };
        return spdy_streams::upgrade(
            &mut parts,
            "portforward",
            protocol,
            move |conn: Upgraded| {
                let (rd, wr) = tokio::io::split(conn);
                session(ByteReader(rd), ByteWriter(wr), target)
            },
        );
    }
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(u) => u,
        Err(_) => {
            return plain_failure(
                400,
                "BadRequest",
                "Upgrade request required: pods/portforward is served over WebSocket \
                 (SPDY/3.1+portforward.k8s.io) or SPDY/3.1 (portforward.k8s.io)",
            );
        }
    };
    upgrade
        .protocols([PROTOCOL])
        .on_upgrade(move |socket: WebSocket| {
            let (sink, source) = socket.split();
            session(source, sink, target)
        })
}

/// The pod to forward to and its node's agent.
#[derive(Debug, Clone)]
struct ForwardTarget {
    agent: AgentEndpoint,
    namespace: String,
    pod: String,
}

async fn target(rest: &Rest, namespace: &str, name: &str) -> Result<ForwardTarget, ApiError> {
    let pods = rest.registry.handler(Pod::INFO.plural)?;
    let pod = Pod::decode(pods.get(namespace, name).await?.as_slice())
        .map_err(|e| ApiError::Internal(format!("decoding pod {name}: {e}")))?;
    let phase = pod.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("");
    if phase != "Running" {
        return Err(ApiError::BadRequest(format!(
            "unable to forward ports to pod {name}: it is {phase}, not Running"
        )));
    }
    let agent = node_proxy::node_agent(rest, &pod)
        .await?
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(ForwardTarget {
        agent,
        namespace: namespace.to_string(),
        pod: name.to_string(),
    })
}

/// Runs one SPDY session until the client goes away.
async fn session(inbound: impl Inbound, outbound: impl Outbound, t: ForwardTarget) {
    let mut source = FrameSource::new(inbound);
    let (out, writer) = spdy_streams::frame_sink(outbound);
    // Data stream id → where its client bytes go (`None`: the client half-closed); an entry
    // whose forward has ended (its receiver dropped) is freed at the next admission.
    let mut data: StreamTable<mpsc::Sender<Option<Bytes>>> = StreamTable::default();
    // requestID → error stream id, until the pair's data stream comes.
    let mut errors: HashMap<String, u32> = HashMap::new();
    // The forwards running, aborted when the session ends (the client is gone: their
    // tunnels to the pod close).
    let mut forwards = JoinSet::new();
    while let Some(frame) = source.next().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                debug!(error = %e, "port forward: reading the session");
                break;
            }
        };
        match frame {
            Frame::SynStream {
                stream, headers, ..
            } => {
                let kind = spdy::header(&headers, "streamtype").unwrap_or("");
                let request = spdy::header(&headers, "requestid")
                    .unwrap_or("")
                    .to_string();
                let port = spdy::header(&headers, "port")
                    .and_then(|p| p.parse::<u16>().ok())
                    .filter(|p| *p > 0);
                let accepted = match (kind, port) {
                    ("error", Some(_)) => {
                        let open = data.prune(|tx| tx.is_closed()) + errors.len();
                        if open < spdy_streams::MAX_OPEN_STREAMS || errors.contains_key(&request) {
                            errors.insert(request, stream);
                            true
                        } else {
                            false
                        }
                    }
                    ("data", Some(port)) => {
                        let (tx, rx) = mpsc::channel(16);
                        let error = errors.remove(&request);
                        let admitted = data.admit(stream, tx, errors.len(), |tx| tx.is_closed());
                        if admitted {
                            let streams = Streams {
                                data: stream,
                                error,
                            };
                            while forwards.try_join_next().is_some() {}
                            forwards.spawn(forward(t.clone(), port, streams, rx, out.clone()));
                        }
                        admitted
                    }
                    _ => false,
                };
                let reply = if accepted {
                    Frame::SynReply {
                        stream,
                        fin: false,
                        headers: Vec::new(),
                    }
                } else {
                    Frame::RstStream {
                        stream,
                        status: spdy::REFUSED_STREAM,
                    }
                };
                if out.send(reply).await.is_err() {
                    break;
                }
            }
            Frame::Data {
                stream,
                fin,
                data: bytes,
            } => {
                if let Some(tx) = data.get(stream) {
                    if !bytes.is_empty() && tx.send(Some(bytes)).await.is_err() {
                        data.remove(stream);
                        continue;
                    }
                    if fin {
                        let _ = tx.send(None).await;
                    }
                }
            }
            Frame::RstStream { stream, .. } => {
                data.remove(stream);
            }
            Frame::Ping(id) => {
                if out.send(Frame::Ping(id)).await.is_err() {
                    break;
                }
            }
            Frame::GoAway { .. } => break,
            Frame::SynReply { .. } | Frame::Headers { .. } | Frame::Other => {}
        }
    }
    forwards.abort_all();
    drop(data);
    drop(out);
    // The writer drains what is queued, then closes the connection.
    let _ = writer.await;
}

/// The streams of one forwarded connection.
#[derive(Debug, Clone, Copy)]
struct Streams {
    data: u32,
    error: Option<u32>,
}

/// Carries one connection between its data stream and the pod's port.
async fn forward(
    t: ForwardTarget,
    port: u16,
    streams: Streams,
    mut from_client: mpsc::Receiver<Option<Bytes>>,
    out: mpsc::Sender<Frame>,
) {
    let fin = |stream: u32| Frame::Data {
        stream,
        fin: true,
        data: Bytes::new(),
    };
    let tunnel = match t.agent.port_forward(&t.namespace, &t.pod, port).await {
        Ok(tunnel) => tunnel,
        Err(e) => {
            if let Some(id) = streams.error {
                let message = format!(
                    "error forwarding port {port} to pod {}/{}: {e}",
                    t.namespace, t.pod
                );
                let _ = out
                    .send(Frame::Data {
                        stream: id,
                        fin: true,
                        data: Bytes::from(message),
                    })
                    .await;
            }
            let _ = out.send(fin(streams.data)).await;
            return;
        }
    };
    let (mut down, mut up) = tokio::io::split(tunnel);
    let upload = async {
        while let Some(chunk) = from_client.recv().await {
            match chunk {
                Some(bytes) => {
                    if up.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                None => {
                    let _ = up.shutdown().await;
                    break;
                }
            }
        }
    };
    let download = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match down.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let frame = Frame::Data {
                        stream: streams.data,
                        fin: false,
                        data: Bytes::copy_from_slice(&buf[..n]),
                    };
                    if out.send(frame).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = out.send(fin(streams.data)).await;
        if let Some(id) = streams.error {
            let _ = out.send(fin(id)).await;
        }
    };
    // The pod's side ending ends the connection (the client is told by the FINs); the
    // upload half ends with it.
    tokio::select! {
        () = download => {}
        () = async { upload.await; std::future::pending::<()>().await } => {}
    }
}
