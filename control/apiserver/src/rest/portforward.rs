//! `pods/<name>/portforward`: kubectl 1.32's port forwarding, a SPDY/3.1 session tunnelled in
//! a WebSocket (subprotocol `SPDY/3.1+portforward.k8s.io`, [`super::spdy`]).
//!
//! For each local connection kubectl opens two streams with the same `requestID` header: an
//! error stream and a data stream, both naming the pod's `port`. Each data stream becomes a
//! tunnel to `localhost:<port>` in the pod's network namespace through the pod's node agent
//! (`skiff_client::node_api::AgentEndpoint::port_forward`); bytes go both ways as DATA frames,
//! a FIN from either side half-closes, and when the pod's side ends both streams are closed
//! (kubectl waits for the error stream to close). A failure to connect is written on the
//! error stream, as the kubelet writes it, so kubectl reports it and keeps listening.

use std::collections::HashMap;

use axum::extract::FromRequestParts as _;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::request::Parts;
use axum::response::Response;
use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::node_api::AgentEndpoint;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tracing::debug;

use super::context::Rest;
use super::node_proxy;
use super::path::ResourcePath;
use super::query::Query;
use super::spdy::{self, Frame};
use crate::ApiError;
use crate::status::plain_failure;

/// The WebSocket subprotocol kubectl asks for.
const PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// Bytes read from the pod per DATA frame.
const CHUNK: usize = 32 * 1024;

/// `GET /api/v1/namespaces/<ns>/pods/<name>/portforward` (a WebSocket upgrade).
pub(crate) async fn serve(rest: &Rest, mut parts: Parts, p: ResourcePath, _q: Query) -> Response {
    let namespace = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let target = match target(rest, &namespace, &name).await {
        Ok(t) => t,
        Err(e) => return node_proxy::pod_failure(&e, &name),
    };
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(u) => u,
        Err(_) => {
            return plain_failure(
                400,
                "BadRequest",
                "Upgrade request required: pods/portforward is served over WebSocket \
                 (SPDY/3.1+portforward.k8s.io)",
            );
        }
    };
    upgrade
        .protocols([PROTOCOL])
        .on_upgrade(move |socket| session(socket, target))
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
async fn session(socket: WebSocket, t: ForwardTarget) {
    let (mut sink, mut source) = socket.split();
    let (out, mut frames) = mpsc::channel::<Frame>(64);
    // One writer owns the compression context, so header blocks go out in order.
    let writer = tokio::spawn(async move {
        let mut w = match spdy::FrameWriter::new() {
            Ok(w) => w,
            Err(e) => {
                debug!(error = %e, "port forward: SPDY writer");
                return;
            }
        };
        while let Some(f) = frames.recv().await {
            let bytes = match w.encode(&f) {
                Ok(b) => b,
                Err(e) => {
                    debug!(error = %e, "port forward: encoding a frame");
                    break;
                }
            };
            if sink.send(Message::Binary(bytes.into())).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let mut reader = spdy::Reader::new();
    // Data stream id → where its client bytes go (`None`: the client half-closed).
    let mut data: HashMap<u32, mpsc::Sender<Option<Bytes>>> = HashMap::new();
    // requestID → error stream id.
    let mut errors: HashMap<String, u32> = HashMap::new();
    'session: while let Some(msg) = source.next().await {
        match msg {
            Ok(Message::Binary(b)) => reader.push(&b),
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        }
        loop {
            let frame = match reader.next() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    debug!(error = %e, "port forward: reading the session");
                    break 'session;
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
                    let port = spdy::header(&headers, "port").and_then(|p| p.parse::<u16>().ok());
                    let accepted = matches!(kind, "error" | "data") && port.is_some_and(|p| p > 0);
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
                        break 'session;
                    }
                    match (kind, port) {
                        ("error", Some(_)) => {
                            errors.insert(request, stream);
                        }
                        ("data", Some(port)) if port > 0 => {
                            let (tx, rx) = mpsc::channel(16);
                            data.insert(stream, tx);
                            let streams = Streams {
                                data: stream,
                                error: errors.get(&request).copied(),
                            };
                            tokio::spawn(forward(t.clone(), port, streams, rx, out.clone()));
                        }
                        _ => {}
                    }
                }
                Frame::Data {
                    stream,
                    fin,
                    data: bytes,
                } => {
                    if let Some(tx) = data.get(&stream) {
                        if !bytes.is_empty() && tx.send(Some(bytes)).await.is_err() {
                            data.remove(&stream);
                            continue;
                        }
                        if fin {
                            let _ = tx.send(None).await;
                        }
                    }
                }
                Frame::RstStream { stream, .. } => {
                    data.remove(&stream);
                }
                Frame::Ping(id) => {
                    if out.send(Frame::Ping(id)).await.is_err() {
                        break 'session;
                    }
                }
                Frame::GoAway { .. } => break 'session,
                Frame::SynReply { .. } | Frame::Headers { .. } | Frame::Other => {}
            }
        }
    }
    // Dropping the senders ends every forward's upload half; then the writer drains.
    drop(data);
    drop(out);
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
