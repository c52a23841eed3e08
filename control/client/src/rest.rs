//! The few REST calls Skiff's own components make (the gRPC API carries everything else):
//! a JSON GET or POST over HTTPS (HTTP/1.1, hyper over rustls) with the client configuration's
//! CA, client certificate or bearer token. An error answer becomes the [`ClientError`] its
//! `Status` code names, with the server's message. With several API servers, one that cannot
//! be reached is skipped for the next, in the order the gRPC calls use.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use crate::api::CONNECT_TIMEOUT;
use crate::failover::Failover;
use crate::{ClientConfig, ClientError};

/// The largest answer read (a TokenRequest is a few kilobytes).
const MAX_ANSWER: usize = 1 << 20;

fn unreachable(server: &str, reason: String) -> ClientError {
    ClientError::Unreachable {
        endpoint: server.to_string(),
        reason,
    }
}

/// `POST path` with `body` as JSON; the answer's JSON when it is a 2xx.
pub(crate) async fn post_json(
    config: &ClientConfig,
    servers: &Failover,
    path: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value, ClientError> {
    request_json(config, servers, hyper::Method::POST, path, Some(body)).await
}

/// `GET path`; the answer's JSON when it is a 2xx.
pub(crate) async fn get_json(
    config: &ClientConfig,
    servers: &Failover,
    path: &str,
) -> Result<serde_json::Value, ClientError> {
    request_json(config, servers, hyper::Method::GET, path, None).await
}

/// The first answer of a server, trying them in the failover's order (the current one
/// first): a server that cannot be reached is marked and the next one tried; an answer, even
/// an error status, is final.
async fn first_answer(
    config: &ClientConfig,
    servers: &Failover,
    method: hyper::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<(String, hyper::Response<hyper::body::Incoming>), ClientError> {
    let mut failures = Vec::new();
    for i in servers.order() {
        let server = servers.url(i);
        match send(config, server, method.clone(), path, body).await {
            Err(ClientError::Unreachable { endpoint, reason }) => {
                servers.failed(i, &reason);
                failures.push((endpoint, reason));
            }
            // Not about this server: the same for all.
            Err(e) => return Err(e),
            Ok(resp) => {
                servers.succeeded(i);
                return Ok((server.to_string(), resp));
            }
        }
    }
    // (With one server, its own error.)
    Err(ClientError::unreachable_all(&failures))
}

/// A whole (bounded) answer: its status and its body as JSON (`Null` when it is none).
async fn read_json(
    server: &str,
    resp: hyper::Response<hyper::body::Incoming>,
) -> Result<(hyper::StatusCode, serde_json::Value), ClientError> {
    let status = resp.status();
    let bytes = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| unreachable(server, format!("reading the answer: {e}")))?
        .to_bytes();
    Ok((status, serde_json::from_slice(&bytes).unwrap_or_default()))
}

/// `method path` with `body` as JSON: the answer's JSON when it is a 2xx, else its error.
async fn request_json(
    config: &ClientConfig,
    servers: &Failover,
    method: hyper::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<serde_json::Value, ClientError> {
    let (server, resp) = first_answer(config, servers, method, path, body).await?;
    let (status, json) = read_json(&server, resp).await?;
    if status.is_success() {
        Ok(json)
    } else {
        Err(status_error(status, &json))
    }
}

/// The error an answer that is not a 2xx stands for, with the server's message.
fn status_error(status: hyper::StatusCode, json: &serde_json::Value) -> ClientError {
    let message = json["message"]
        .as_str()
        .map(String::from)
        .unwrap_or_else(|| status.to_string());
    match status.as_u16() {
        401 => ClientError::Unauthorized { message },
        403 => ClientError::Forbidden { message },
        404 => ClientError::NotFound { message },
        409 => ClientError::Conflict { message },
        422 => ClientError::Invalid { message },
        _ => ClientError::Other {
            code: tonic::Code::Unknown,
            message,
        },
    }
}

/// `GET path` from the first server that answers (in the failover's order), its body
/// streamed into the new file `dest` (mode 0600, written beside it and renamed, so a failed
/// transfer leaves nothing at `dest`): the answer's headers. For answers too large to hold (a store snapshot).
pub(crate) async fn download(
    config: &ClientConfig,
    servers: &Failover,
    path: &str,
    dest: &std::path::Path,
) -> Result<hyper::HeaderMap, ClientError> {
    let (server, resp) = first_answer(config, servers, hyper::Method::GET, path, None).await?;
    if !resp.status().is_success() {
        let (status, json) = read_json(&server, resp).await?;
        return Err(status_error(status, &json));
    }
    let headers = resp.headers().clone();
    let io = |e: std::io::Error| ClientError::Other {
        code: tonic::Code::Internal,
        message: format!("writing {}: {e}", dest.display()),
    };
    // A private temporary beside `dest` (random name, O_EXCL, mode 0600: a snapshot holds
    // every Secret), renamed to `dest` once complete; `dest` must not exist.
    if dest.exists() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "the file exists (a snapshot is saved to a new file)",
        )));
    }
    let tmp = skiff_pki::files::temp_beside(dest).map_err(io)?;
    let mut file = tokio::fs::File::from_std(tmp.as_file().try_clone().map_err(io)?);
    let mut body = resp.into_body();
    let copied: Result<(), ClientError> = async {
        use tokio::io::AsyncWriteExt;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| unreachable(&server, format!("reading: {e}")))?;
            if let Ok(data) = frame.into_data() {
                file.write_all(&data).await.map_err(io)?;
            }
        }
        file.sync_all().await.map_err(io)
    }
    .await;
    copied?;
    drop(file);
    skiff_pki::files::persist_new(tmp, dest).map_err(io)?;
    Ok(headers)
}

/// Sends one request to `server` (TLS as `config` says, its token if any).
async fn send(
    config: &ClientConfig,
    server: &str,
    method: hyper::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
    let uri: hyper::Uri = server.parse().map_err(|e| ClientError::InvalidEndpoint {
        endpoint: server.to_string(),
        reason: format!("{e}"),
    })?;
    let host = uri
        .host()
        .unwrap_or("")
        .trim_matches(['[', ']'])
        .to_string();
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .map_err(|_| unreachable(server, "connection timed out".into()))?
    .map_err(|e| unreachable(server, e.to_string()))?;
    let mut sender = if https {
        let ca = config
            .ca_pem
            .as_deref()
            .ok_or_else(|| ClientError::InvalidEndpoint {
                endpoint: server.to_string(),
                reason: "no CA to verify the server with".into(),
            })?;
        let tls = skiff_pki::tls::client_config(ca, config.identity.as_ref())
            .map_err(|e| unreachable(server, e.to_string()))?;
        let name = config
            .tls_server_name
            .clone()
            .unwrap_or_else(|| host.clone());
        let name = rustls::pki_types::ServerName::try_from(name)
            .map_err(|e| unreachable(server, e.to_string()))?;
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio_rustls::TlsConnector::from(Arc::new(tls)).connect(name, tcp),
        )
        .await
        .map_err(|_| unreachable(server, "TLS: handshake timed out".into()))?
        .map_err(|e| unreachable(server, format!("TLS: {e}")))?;
        let (s, c) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(server, e.to_string()))?;
        // Drives the connection until the answer is read.
        tokio::spawn(c);
        s
    } else {
        let (s, c) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| unreachable(server, e.to_string()))?;
        tokio::spawn(c);
        s
    };
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(
            hyper::header::HOST,
            uri.authority().map(|a| a.as_str()).unwrap_or(""),
        )
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::ACCEPT, "application/json");
    if let Some(t) = &config.token {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req
        .body(http_body_util::Full::new(Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .map_err(|e| unreachable(server, e.to_string()))?;
    sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(server, e.to_string()))
}
