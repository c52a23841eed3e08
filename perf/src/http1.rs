//! A small HTTP/1.1 client for the REST benchmarks, on hyper's connection API: keep-alive
//! connections to one loopback address, one request in flight on each (as client-go and
//! kubectl do), over TLS with the client certificate of a kubeconfig ([`Tls`]) or plain TCP,
//! bodies read whole, and streamed answers (`?watch=true`) split into lines.

use std::net::SocketAddr;

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::sync::Mutex;

/// The longest line a streamed answer may carry (one watch event).
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// TLS to the API server as a kubeconfig says (its CA, its client certificate).
#[derive(Clone)]
pub struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("name", &self.name).finish()
    }
}

impl Tls {
    /// TLS for `config` (`None` for an `http://` server).
    pub fn for_config(config: &skiff_client::ClientConfig) -> Result<Option<Tls>> {
        if !config.server.starts_with("https://") {
            return Ok(None);
        }
        let ca = config
            .ca_pem
            .as_deref()
            .context("an https server needs a CA in the kubeconfig")?;
        let tls = skiff_pki::tls::client_config(ca, config.identity.as_ref())?;
        Ok(Some(Tls {
            connector: tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls)),
            // The API server's certificate always names 127.0.0.1 (the benchmarks' address).
            name: rustls::pki_types::ServerName::IpAddress(
                std::net::IpAddr::from([127, 0, 0, 1]).into(),
            ),
        }))
    }
}

impl Tls {
    /// The TLS handshake on `tcp`, for clients that write raw bytes (the slowloris of the
    /// `auth` suite).
    pub async fn handshake(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        self.connector
            .connect(self.name.clone(), tcp)
            .await
            .context("TLS handshake")
    }
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// One keep-alive HTTP/1.1 connection. Dropping it closes the connection.
#[derive(Debug)]
pub struct Conn {
    addr: SocketAddr,
    /// Sent as `Authorization: Bearer` on every request.
    bearer: Option<String>,
    sender: SendRequest<Full<Bytes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr, tls: Option<&Tls>) -> Result<Conn> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        // As the API server does: small requests must not wait for Nagle.
        stream.set_nodelay(true).context("setting TCP_NODELAY")?;
        let stream: Box<dyn Io> = match tls {
            None => Box::new(stream),
            Some(t) => Box::new(
                t.connector
                    .connect(t.name.clone(), stream)
                    .await
                    .with_context(|| format!("TLS handshake with {addr}"))?,
            ),
        };
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("HTTP/1.1 handshake with {addr}"))?;
        let task = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "HTTP/1.1 connection ended");
            }
        });
        Ok(Conn {
            addr,
            bearer: None,
            sender,
            task,
        })
    }

    /// Sends `token` as a bearer token with every request from now on.
    pub fn with_bearer(mut self, token: &str) -> Conn {
        self.bearer = Some(token.to_string());
        self
    }

    /// Sends one request (a JSON body when `body` is given) and returns the answer's head
    /// and its body unread.
    async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(header::HOST, self.addr.to_string())
            .header(header::ACCEPT, "application/json");
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(t) = &self.bearer {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .with_context(|| format!("building {method} {path}"))?;
        self.sender
            .ready()
            .await
            .with_context(|| format!("{method} {path}: the connection is closed"))?;
        self.sender
            .send_request(req)
            .await
            .with_context(|| format!("{method} {path}"))
    }

    /// One request; the status and the whole body.
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes)> {
        let resp = self.send(method.clone(), path, body).await?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .with_context(|| format!("reading the answer to {method} {path}"))?
            .to_bytes();
        Ok((status, body))
    }

    /// A GET whose answer is a stream of lines (a watch); fails unless it answers 200. The
    /// connection is used up: it closes when the stream is dropped.
    pub async fn lines(mut self, path: &str) -> Result<BoxStream<'static, Result<Bytes>>> {
        let resp = self.send(Method::GET, path, None).await?;
        if resp.status() != StatusCode::OK {
            let status = resp.status();
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            bail!(
                "GET {path}: {status}: {}",
                body.map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default()
            );
        }
        Ok(split_lines(resp.into_body(), self).boxed())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The lines of `body` (without their `\n`), the last one even without one. `keep` lives as
/// long as the stream (the connection the body arrives on).
fn split_lines<B, K>(body: B, keep: K) -> impl futures::Stream<Item = Result<Bytes>>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    futures::stream::unfold(Some((body, BytesMut::new(), keep)), |state| async move {
        let (mut body, mut buf, keep) = state?;
        loop {
            if let Some(i) = buf.iter().position(|b| *b == b'\n') {
                let mut line = buf.split_to(i + 1);
                line.truncate(i);
                return Some((Ok(line.freeze()), Some((body, buf, keep))));
            }
            if buf.len() > MAX_LINE_BYTES {
                let err = anyhow::anyhow!("a line longer than {MAX_LINE_BYTES} bytes");
                return Some((Err(err), None));
            }
            match body.frame().await {
                None if buf.is_empty() => return None,
                None => return Some((Ok(buf.split().freeze()), None)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    return Some((Err(anyhow::Error::new(e).context("reading a stream")), None));
                }
            }
        }
    })
}

/// Keep-alive connections used by concurrent callers, each call on a connection no other
/// call is using.
#[derive(Debug)]
pub struct Pool {
    conns: Vec<Mutex<Conn>>,
}

impl Pool {
    /// `size` connections to `addr`.
    pub async fn connect(addr: SocketAddr, tls: Option<&Tls>, size: usize) -> Result<Pool> {
        let mut conns = Vec::with_capacity(size.max(1));
        for _ in 0..size.max(1) {
            conns.push(Mutex::new(Conn::connect(addr, tls).await?));
        }
        Ok(Pool { conns })
    }

    pub fn size(&self) -> usize {
        self.conns.len()
    }

    /// [`Conn::request`] on a free connection (waiting for the first one when all are busy:
    /// with at most [`Pool::size`] callers at once, one is always free).
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes)> {
        let mut conn = match self.conns.iter().find_map(|c| c.try_lock().ok()) {
            Some(c) => c,
            None => self.conns[0].lock().await,
        };
        conn.request(method, path, body).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    fn body(
        chunks: &[&'static str],
    ) -> impl hyper::body::Body<Data = Bytes, Error = std::io::Error> + Unpin {
        StreamBody::new(futures::stream::iter(
            chunks
                .iter()
                .map(|c| Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(c.as_bytes()))))
                .collect::<Vec<_>>(),
        ))
    }

    #[tokio::test]
    async fn lines_across_and_within_chunks() {
        let lines: Vec<Bytes> = split_lines(
            body(&["{\"a\":1}\n{\"b\"", ":2}\n\n{\"c\":3}\n", "tail"]),
            (),
        )
        .map(|l| l.unwrap())
        .collect()
        .await;
        assert_eq!(
            lines,
            ["{\"a\":1}", "{\"b\":2}", "", "{\"c\":3}", "tail"].map(Bytes::from)
        );
        let none: Vec<_> = split_lines(body(&[]), ()).collect().await;
        assert!(none.is_empty());
    }

    #[tokio::test]
    async fn requests_on_a_keep_alive_connection() {
        // A tiny HTTP/1.1 server: two answers on one connection, then close.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            for answer in ["one", "two"] {
                loop {
                    let n = s.read(&mut buf).await.unwrap();
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                seen.clear();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{answer}",
                    answer.len()
                );
                s.write_all(resp.as_bytes()).await.unwrap();
            }
        });
        let mut c = Conn::connect(addr, None).await.unwrap();
        let (status, b) = c.request(Method::GET, "/a", None).await.unwrap();
        assert_eq!((status, &b[..]), (StatusCode::OK, &b"one"[..]));
        let (_, b) = c.request(Method::GET, "/b", None).await.unwrap();
        assert_eq!(&b[..], b"two");
        server.await.unwrap();
    }
}
