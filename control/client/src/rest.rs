//! The few REST calls Skiff's own components make (the gRPC API carries everything else):
//! a JSON GET or POST over HTTPS (HTTP/1.1, hyper over rustls) with the client configuration's
//! CA, client certificate or bearer token. An error answer becomes the [`ClientError`] its
//! `Status` code names, with the server's message.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use crate::{ClientConfig, ClientError};

/// The largest answer read (a TokenRequest is a few kilobytes).
const MAX_ANSWER: usize = 1 << 20;

fn unreachable(config: &ClientConfig, reason: String) -> ClientError {
    ClientError::Unreachable {
        endpoint: config.server.clone(),
        reason,
    }
}

/// `POST path` with `body` as JSON; the answer's JSON when it is a 2xx.
pub(crate) async fn post_json(
    config: &ClientConfig,
    path: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value, ClientError> {
    request_json(config, hyper::Method::POST, path, Some(body)).await
}

/// `GET path`; the answer's JSON when it is a 2xx.
pub(crate) async fn get_json(
    config: &ClientConfig,
    path: &str,
) -> Result<serde_json::Value, ClientError> {
    request_json(config, hyper::Method::GET, path, None).await
}

async fn request_json(
    config: &ClientConfig,
    method: hyper::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<serde_json::Value, ClientError> {
    let uri: hyper::Uri = config
        .server
        .parse()
        .map_err(|e| ClientError::InvalidEndpoint {
            endpoint: config.server.clone(),
            reason: format!("{e}"),
        })?;
    let host = uri
        .host()
        .unwrap_or("")
        .trim_matches(['[', ']'])
        .to_string();
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| unreachable(config, e.to_string()))?;
    let mut sender = if https {
        let ca = config
            .ca_pem
            .as_deref()
            .ok_or_else(|| ClientError::InvalidEndpoint {
                endpoint: config.server.clone(),
                reason: "no CA to verify the server with".into(),
            })?;
        let tls = skiff_pki::tls::client_config(ca, config.identity.as_ref())
            .map_err(|e| unreachable(config, e.to_string()))?;
        let name = config
            .tls_server_name
            .clone()
            .unwrap_or_else(|| host.clone());
        let name = rustls::pki_types::ServerName::try_from(name)
            .map_err(|e| unreachable(config, e.to_string()))?;
        let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(name, tcp)
            .await
            .map_err(|e| unreachable(config, format!("TLS: {e}")))?;
        let (s, c) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(config, e.to_string()))?;
        // Drives the connection until the answer is read.
        tokio::spawn(c);
        s
    } else {
        let (s, c) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| unreachable(config, e.to_string()))?;
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
        .map_err(|e| unreachable(config, e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(config, e.to_string()))?;
    let status = resp.status();
    let bytes = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| unreachable(config, format!("reading the answer: {e}")))?
        .to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    if status.is_success() {
        return Ok(json);
    }
    let message = json["message"]
        .as_str()
        .map(String::from)
        .unwrap_or_else(|| status.to_string());
    Err(match status.as_u16() {
        401 => ClientError::Unauthorized { message },
        403 => ClientError::Forbidden { message },
        404 => ClientError::NotFound { message },
        409 => ClientError::Conflict { message },
        422 => ClientError::Invalid { message },
        _ => ClientError::Other {
            code: tonic::Code::Unknown,
            message,
        },
    })
}
