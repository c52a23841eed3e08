//! SPDY/3.1 sessions of streams, as Kubernetes' streaming subresources use them: the
//! `Upgrade: SPDY/3.1` handshake of an HTTP/1.1 request (kubectl before the WebSocket
//! protocols, or with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false` or
//! `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`, and client-go's `remotecommand.NewSPDYExecutor`
//! and `portforward.New`), the transport a session's frames ([`super::spdy`]) travel on, and
//! exec's and attach's set of streams. `PING`s are answered; a `GOAWAY` ends the session.
//!
//! - Negotiation: the client names the protocols it speaks in `X-Stream-Protocol-Version`
//!   headers; the answer is `101 Switching Protocols` with the highest one both speak, or,
//!   as the kubelet answers, `403 Forbidden` naming the versions served
//!   (`X-Accepted-Stream-Protocol-Versions`).
//! - Transport: frames are read from an [`Inbound`] and written by one task that owns the
//!   header compressor ([`frame_sink`]) to an [`Outbound`]: the upgraded connection's bytes,
//!   or (port forwarding in kubectl 1.32) binary WebSocket messages.
//! - Exec and attach (`v4.channel.k8s.io`, `v3`, `v2`): the client opens one stream per
//!   `streamtype` (`error`, `stdin`, `stdout`, `stderr`, `resize`); each is answered with a
//!   `SYN_REPLY`, unknown or unasked ones with `RST_STREAM`, and the set the query asked for
//!   must be complete within 30 s, as the kubelet waits. Then [`SpdyInput`] and
//!   [`SpdyOutput`] carry the session for exec's bridge ([`super::exec::bridge`]): stdin's
//!   data and FIN, the resize stream's JSON sizes (back to back; one per frame to the
//!   agent) and the command's output. The end is a
//!   `Status` on the error stream (v4; v2 and v3 get its message on failure only), then a FIN
//!   on every stream and the connection closed, as the kubelet closes it.
//!
//! Everything the client sends is bounded: frames and header blocks by the codec, the
//! streams of a session by [`MAX_SYN_STREAMS`] (exec, attach) and [`MAX_OPEN_STREAMS`]
//! (port forwarding), the wait for the stream set by [`STREAM_SET_WAIT`].

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt as _};
use hyper_util::rt::TokioIo;
use serde_json::json;
use skiff_client::node_api::exec::{self as channel, TerminalSize};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::debug;

use super::session::{ClientInput, ClientOutput, Session};
use super::spdy::{self, Frame, Headers, SpdyError};
use crate::status::respond;

/// The `Upgrade` token.
pub(super) const SPDY_31: &str = "SPDY/3.1";
/// The header naming a stream protocol (offered by the client, chosen by the server).
const PROTOCOL_HEADER: &str = "x-stream-protocol-version";
/// The header listing the protocols served, when none offered is.
const ACCEPTED_HEADER: &str = "x-accepted-stream-protocol-versions";
/// Exec's and attach's protocols over SPDY, preferred first.
pub(super) const REMOTE_COMMAND_PROTOCOLS: [&str; 3] = [
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
];
/// Port forwarding's protocol over SPDY.
pub(super) const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";
/// How long the client has to open its streams (the kubelet's wait).
pub(super) const STREAM_SET_WAIT: Duration = Duration::from_secs(30);
/// The most `SYN_STREAM`s an exec or attach session takes (its set is five at most); the
/// session ends at the next one.
pub(super) const MAX_SYN_STREAMS: usize = 16;
/// The most streams a port-forward session holds open at once (two per forwarded
/// connection); a `SYN_STREAM` beyond is refused.
pub(super) const MAX_OPEN_STREAMS: usize = 256;
/// Bytes read from the connection at a time.
const READ_CHUNK: usize = 32 * 1024;
/// The longest JSON size the resize stream may hold unfinished.
const MAX_RESIZE_BUFFER: usize = 4096;

/// Whether the request asks for a SPDY/3.1 upgrade.
pub(super) fn wants_spdy(parts: &Parts) -> bool {
    parts
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(SPDY_31))
}

/// The protocols the client offers, in its order (one per header, or comma-separated).
pub(super) fn offered(parts: &Parts) -> Vec<String> {
    parts
        .headers
        .get_all(PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The highest protocol of `supported` (preferred first) that the client offers.
pub(super) fn negotiate(offered: &[String], supported: &[&'static str]) -> Option<&'static str> {
    supported
        .iter()
        .find(|s| offered.iter().any(|o| o == *s))
        .copied()
}

/// The kubelet's answer when no protocol offered is served: 403, naming the versions.
pub(super) fn no_common_protocol(offered: &[String], supported: &[&str]) -> Response {
    let message = format!(
        "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server \
         accepts {supported:?}"
    );
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "code": 403,
    });
    let mut resp = respond(403, &body, crate::status::Format::Json, &[]);
    for s in supported {
        if let Ok(v) = HeaderValue::from_str(s) {
            resp.headers_mut().append(ACCEPTED_HEADER, v);
        }
    }
    resp
}

/// The upgraded connection.
pub(super) type Upgraded = TokioIo<hyper::upgrade::Upgraded>;

/// Answers `101 Switching Protocols` with `protocol` and runs `run` on the connection once
/// hyper hands it over.
pub(super) fn upgrade<F, Fut>(
    parts: &mut Parts,
    subresource: &'static str,
    protocol: &'static str,
    run: F,
) -> Response
where
    F: FnOnce(Upgraded) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
        return crate::status::plain_failure(
            400,
            "BadRequest",
            "Upgrade request required: this connection cannot be upgraded to SPDY/3.1 (use \
             HTTP/1.1)",
        );
    };
    debug!(
        subresource,
        protocol,
        path = %parts.uri.path(),
        "SPDY/3.1 upgrade"
    );
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(conn) => run(TokioIo::new(conn)).await,
            Err(e) => debug!(error = %e, "SPDY/3.1 upgrade failed"),
        }
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static(SPDY_31));
    h.insert(PROTOCOL_HEADER, HeaderValue::from_static(protocol));
    resp
}

/// Where a session's bytes come from.
pub(super) trait Inbound: Send + 'static {
    /// The next bytes, `None` once the peer is gone.
    fn recv(&mut self) -> impl Future<Output = Option<Bytes>> + Send;
}

/// Where a session's bytes go.
pub(super) trait Outbound: Send + 'static {
    /// Writes `bytes`; false once the peer is gone.
    fn send(&mut self, bytes: Vec<u8>) -> impl Future<Output = bool> + Send;
    /// Ends the session's output.
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// The read half of a connection.
pub(super) struct ByteReader<R>(pub(super) R);

impl<R: AsyncRead + Unpin + Send + 'static> Inbound for ByteReader<R> {
    async fn recv(&mut self) -> Option<Bytes> {
        let mut buf = vec![0u8; READ_CHUNK];
        match self.0.read(&mut buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => {
                buf.truncate(n);
                Some(Bytes::from(buf))
            }
        }
    }
}

/// The write half of a connection.
pub(super) struct ByteWriter<W>(pub(super) W);

impl<W: AsyncWrite + Unpin + Send + 'static> Outbound for ByteWriter<W> {
    async fn send(&mut self, bytes: Vec<u8>) -> bool {
        self.0.write_all(&bytes).await.is_ok() && self.0.flush().await.is_ok()
    }
    async fn close(mut self) {
        let _ = self.0.shutdown().await;
    }
}

impl Inbound for SplitStream<WebSocket> {
    async fn recv(&mut self) -> Option<Bytes> {
        loop {
            match self.next().await? {
                Ok(Message::Binary(b)) => return Some(b),
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }
}

impl Outbound for SplitSink<WebSocket, Message> {
    async fn send(&mut self, bytes: Vec<u8>) -> bool {
        SinkExt::send(self, Message::Binary(bytes.into()))
            .await
            .is_ok()
    }
    async fn close(mut self) {
        let _ = SinkExt::close(&mut self).await;
    }
}

/// The frames a peer sends, read from an [`Inbound`].
pub(super) struct FrameSource<I> {
    inbound: I,
    reader: spdy::Reader,
}

impl<I: Inbound> FrameSource<I> {
    pub(super) fn new(inbound: I) -> Self {
        FrameSource {
            inbound,
            reader: spdy::Reader::new(),
        }
    }

    /// The next frame; `None` once the peer is gone.
    pub(super) async fn next(&mut self) -> Option<Result<Frame, SpdyError>> {
        loop {
            match self.reader.next() {
                Ok(Some(f)) => return Some(Ok(f)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
            let bytes = self.inbound.recv().await?;
            self.reader.push(&bytes);
        }
    }
}

/// Spawns the task that encodes frames in order (it owns the header compressor) and writes
/// them to `out`; it closes `out` once every sender is dropped.
pub(super) fn frame_sink<O: Outbound>(mut out: O) -> (mpsc::Sender<Frame>, JoinHandle<()>) {
    let (tx, mut frames) = mpsc::channel::<Frame>(64);
    let task = tokio::spawn(async move {
        let mut w = match spdy::FrameWriter::new() {
            Ok(w) => w,
            Err(e) => {
                debug!(error = %e, "SPDY writer");
                return;
            }
        };
        while let Some(f) = frames.recv().await {
            let bytes = match w.encode(&f) {
                Ok(b) => b,
                Err(e) => {
                    debug!(error = %e, "SPDY: encoding a frame");
                    break;
                }
            };
            if !out.send(bytes).await {
                break;
            }
        }
        out.close().await;
    });
    (tx, task)
}

/// A stream of exec's and attach's set, by its `streamtype` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StreamKind {
    Error,
    Stdin,
    Stdout,
    Stderr,
    Resize,
}

impl StreamKind {
    const ALL: [StreamKind; 5] = [
        StreamKind::Error,
        StreamKind::Stdin,
        StreamKind::Stdout,
        StreamKind::Stderr,
        StreamKind::Resize,
    ];

    fn parse(s: &str) -> Option<StreamKind> {
        Some(match s {
            "error" => StreamKind::Error,
            "stdin" => StreamKind::Stdin,
            "stdout" => StreamKind::Stdout,
            "stderr" => StreamKind::Stderr,
            "resize" => StreamKind::Resize,
            _ => return None,
        })
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Which streams an exec or attach session expects, from its query and protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Expected {
    pub(super) stdin: bool,
    pub(super) stdout: bool,
    pub(super) stderr: bool,
    /// A terminal's resize stream (v3 and later).
    pub(super) resize: bool,
}

impl Expected {
    /// The streams the kubelet waits for: error always, stdin/stdout/stderr as asked (no
    /// stderr on a terminal), resize with a terminal from v3 on.
    pub(super) fn of(
        protocol: &str,
        stdin: bool,
        stdout: bool,
        stderr: bool,
        tty: bool,
    ) -> Expected {
        Expected {
            stdin,
            stdout,
            stderr: stderr && !tty,
            resize: tty && protocol != "v2.channel.k8s.io",
        }
    }

    fn wants(self, kind: StreamKind) -> bool {
        match kind {
            StreamKind::Error => true,
            StreamKind::Stdin => self.stdin,
            StreamKind::Stdout => self.stdout,
            StreamKind::Stderr => self.stderr,
            StreamKind::Resize => self.resize,
        }
    }
}

/// What to do with a `SYN_STREAM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Offer {
    /// One of the set: answer with `SYN_REPLY`.
    Accept(StreamKind),
    /// Unknown, unasked or a second of its kind: `RST_STREAM`.
    Refuse,
    /// Past [`MAX_SYN_STREAMS`]: the session ends.
    TooMany,
}

/// Exec's and attach's streams as the client opens them.
#[derive(Debug, Clone)]
pub(super) struct StreamSet {
    expected: Expected,
    ids: [Option<u32>; 5],
    syns: usize,
}

impl StreamSet {
    pub(super) fn new(expected: Expected) -> StreamSet {
        StreamSet {
            expected,
            ids: [None; 5],
            syns: 0,
        }
    }

    /// Takes stream `stream`'s `SYN_STREAM`.
    pub(super) fn offer(&mut self, stream: u32, headers: &Headers) -> Offer {
        self.syns += 1;
        if self.syns > MAX_SYN_STREAMS {
            return Offer::TooMany;
        }
        let Some(kind) = spdy::header(headers, "streamtype").and_then(StreamKind::parse) else {
            return Offer::Refuse;
        };
        if !self.expected.wants(kind)
            || self.ids[kind.index()].is_some()
            || self.ids.contains(&Some(stream))
        {
            return Offer::Refuse;
        }
        self.ids[kind.index()] = Some(stream);
        Offer::Accept(kind)
    }

    /// Whether every expected stream is open.
    pub(super) fn complete(&self) -> bool {
        StreamKind::ALL
            .iter()
            .all(|k| !self.expected.wants(*k) || self.ids[k.index()].is_some())
    }

    pub(super) fn id(&self, kind: StreamKind) -> Option<u32> {
        self.ids[kind.index()]
    }

    fn kind_of(&self, stream: u32) -> Option<StreamKind> {
        StreamKind::ALL
            .into_iter()
            .find(|k| self.ids[k.index()] == Some(stream))
    }

    fn open(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().flatten().copied()
    }
}

/// Answers one `SYN_STREAM` of an exec or attach session; false when the session must end.
async fn answer_syn(
    set: &mut StreamSet,
    frames: &mpsc::Sender<Frame>,
    stream: u32,
    headers: &Headers,
) -> bool {
    let reply = match set.offer(stream, headers) {
        Offer::Accept(_) => Frame::SynReply {
            stream,
            fin: false,
            headers: Vec::new(),
        },
        Offer::Refuse => Frame::RstStream {
            stream,
            status: spdy::REFUSED_STREAM,
        },
        Offer::TooMany => {
            debug!("SPDY: too many streams, ending the session");
            return false;
        }
    };
    frames.send(reply).await.is_ok()
}

/// Runs an exec or attach session on an upgraded connection: waits for the client's
/// streams, then bridges them to the agent.
pub(super) async fn remote_command(
    conn: impl AsyncRead + AsyncWrite + Send + 'static,
    protocol: &'static str,
    expected: Expected,
    agent: impl AsyncRead + AsyncWrite + Send,
    session: Session,
) {
    remote_command_within(conn, protocol, expected, agent, session, STREAM_SET_WAIT).await;
}

/// [`remote_command`], with `wait` for the stream set.
async fn remote_command_within(
    conn: impl AsyncRead + AsyncWrite + Send + 'static,
    protocol: &'static str,
    expected: Expected,
    agent: impl AsyncRead + AsyncWrite + Send,
    session: Session,
    wait: Duration,
) {
    let (rd, wr) = tokio::io::split(conn);
    let mut source = FrameSource::new(ByteReader(rd));
    let (frames, writer) = frame_sink(ByteWriter(wr));
    let mut set = StreamSet::new(expected);
    let gathered = tokio::time::timeout(wait, async {
        while !set.complete() {
            match source.next().await {
                Some(Ok(Frame::SynStream {
                    stream, headers, ..
                })) => {
                    if !answer_syn(&mut set, &frames, stream, &headers).await {
                        return false;
                    }
                }
                Some(Ok(Frame::Ping(id))) => {
                    if frames.send(Frame::Ping(id)).await.is_err() {
                        return false;
                    }
                }
                Some(Ok(Frame::GoAway { .. })) | Some(Err(_)) | None => return false,
                // Data before the set is complete has nowhere to go yet: the client does
                // not write before its streams are answered.
                Some(Ok(_)) => {}
            }
        }
        true
    })
    .await;
    match gathered {
        Ok(true) => {
            let input = SpdyInput {
                source,
                frames: frames.clone(),
                set: set.clone(),
                pending: VecDeque::new(),
                resize: ResizeDecoder::default(),
            };
            let output = SpdyOutput {
                frames,
                set,
                v4: protocol == REMOTE_COMMAND_PROTOCOLS[0],
            };
            super::session::bridge(input, output, agent, session).await;
        }
        Ok(false) => {
            debug!("SPDY: the client left before opening its streams");
            drop(frames);
        }
        Err(_) => {
            debug!("SPDY: timed out waiting for the client's streams");
            drop(frames);
        }
    }
    let _ = writer.await;
}

/// The client's side of an exec or attach session over SPDY: stdin, its FIN, resizes.
pub(super) struct SpdyInput<I> {
    source: FrameSource<I>,
    frames: mpsc::Sender<Frame>,
    set: StreamSet,
    /// Agent frames read but not yet handed over (a DATA frame with FIN makes two).
    pending: VecDeque<(u8, Vec<u8>)>,
    resize: ResizeDecoder,
}

impl<I: Inbound> ClientInput for SpdyInput<I> {
    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if let Some(f) = self.pending.pop_front() {
                return Some(f);
            }
            match self.source.next().await? {
                Ok(Frame::Data { stream, fin, data }) => match self.set.kind_of(stream) {
                    Some(StreamKind::Stdin) => {
                        if !data.is_empty() {
                            self.pending.push_back((channel::STDIN, data.to_vec()));
                        }
                        if fin {
                            self.pending
                                .push_back((channel::CLOSE, vec![channel::STDIN]));
                        }
                    }
                    Some(StreamKind::Resize) => {
                        for size in self.resize.push(&data) {
                            if let Ok(json) = serde_json::to_vec(&size) {
                                self.pending.push_back((channel::RESIZE, json));
                            }
                        }
                    }
                    _ => {}
                },
                Ok(Frame::RstStream { stream, .. })
                    if self.set.kind_of(stream) == Some(StreamKind::Stdin) =>
                {
                    self.pending
                        .push_back((channel::CLOSE, vec![channel::STDIN]));
                }
                Ok(Frame::SynStream {
                    stream, headers, ..
                }) => {
                    if !answer_syn(&mut self.set, &self.frames, stream, &headers).await {
                        return None;
                    }
                }
                Ok(Frame::Ping(id)) => {
                    if self.frames.send(Frame::Ping(id)).await.is_err() {
                        return None;
                    }
                }
                Ok(Frame::GoAway { .. }) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }
}

/// The client's side of an exec or attach session over SPDY: output and the end.
pub(super) struct SpdyOutput {
    frames: mpsc::Sender<Frame>,
    set: StreamSet,
    /// v4 writes the end as a `Status`; v2 and v3 write a failure's message only.
    v4: bool,
}

impl ClientOutput for SpdyOutput {
    async fn output(&mut self, ch: u8, data: Vec<u8>) -> bool {
        let kind = match ch {
            channel::STDOUT => StreamKind::Stdout,
            channel::STDERR => StreamKind::Stderr,
            _ => return true,
        };
        let Some(stream) = self.set.id(kind) else {
            return true;
        };
        self.frames
            .send(Frame::Data {
                stream,
                fin: false,
                data: Bytes::from(data),
            })
            .await
            .is_ok()
    }

    async fn end(self, status: serde_json::Value) {
        let body = if self.v4 {
            status.to_string().into_bytes()
        } else if status["status"] == "Success" {
            Vec::new()
        } else {
            status["message"].as_str().unwrap_or("").as_bytes().to_vec()
        };
        if let Some(stream) = self.set.id(StreamKind::Error)
            && !body.is_empty()
        {
            let _ = self
                .frames
                .send(Frame::Data {
                    stream,
                    fin: false,
                    data: Bytes::from(body),
                })
                .await;
        }
        for stream in self.set.open() {
            let _ = self
                .frames
                .send(Frame::Data {
                    stream,
                    fin: true,
                    data: Bytes::new(),
                })
                .await;
        }
    }
}

/// The resize stream: JSON sizes (`{"Width":W,"Height":H}`) back to back, cut anywhere.
#[derive(Debug, Default)]
pub(super) struct ResizeDecoder {
    buf: Vec<u8>,
    /// A size that is not JSON ends the resizes (the kubelet stops reading them).
    broken: bool,
}

impl ResizeDecoder {
    /// The sizes completed by `bytes`.
    pub(super) fn push(&mut self, bytes: &[u8]) -> Vec<TerminalSize> {
        if self.broken {
            return Vec::new();
        }
        self.buf.extend_from_slice(bytes);
        let mut sizes = Vec::new();
        let mut used = 0;
        let mut stream =
            serde_json::Deserializer::from_slice(&self.buf).into_iter::<TerminalSize>();
        loop {
            match stream.next() {
                Some(Ok(size)) => {
                    sizes.push(size);
                    used = stream.byte_offset();
                }
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(_)) => {
                    self.broken = true;
                    break;
                }
                None => {
                    used = self.buf.len();
                    break;
                }
            }
        }
        self.buf.drain(..used);
        if self.broken || self.buf.len() > MAX_RESIZE_BUFFER {
            self.broken = true;
            self.buf = Vec::new();
        }
        sizes
    }
}

/// Port forwarding's open streams: a bounded table, entries dropped once their stream ends.
#[derive(Debug)]
pub(super) struct StreamTable<T> {
    streams: HashMap<u32, T>,
}

impl<T> Default for StreamTable<T> {
    fn default() -> Self {
        StreamTable {
            streams: HashMap::new(),
        }
    }
}

impl<T> StreamTable<T> {
    /// Admits stream `stream` unless [`MAX_OPEN_STREAMS`] are open (counting `also`, the
    /// caller's other streams); `ended` says which entries are done, and those are dropped
    /// first.
    pub(super) fn admit(
        &mut self,
        stream: u32,
        value: T,
        also: usize,
        ended: impl Fn(&T) -> bool,
    ) -> bool {
        if self.prune(ended) + also >= MAX_OPEN_STREAMS {
            return false;
        }
        self.streams.insert(stream, value);
        true
    }

    /// Drops the entries `ended` says are done; how many stay.
    pub(super) fn prune(&mut self, ended: impl Fn(&T) -> bool) -> usize {
        self.streams.retain(|_, v| !ended(v));
        self.streams.len()
    }

    pub(super) fn get(&self, stream: u32) -> Option<&T> {
        self.streams.get(&stream)
    }

    pub(super) fn remove(&mut self, stream: u32) -> Option<T> {
        self.streams.remove(&stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(kind: &str) -> Headers {
        vec![("streamtype".to_string(), kind.to_string())]
    }

    fn offers(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn negotiation_picks_the_highest_both_speak() {
        let kubectl = offers(&[
            "v5.channel.k8s.io",
            "v4.channel.k8s.io",
            "v3.channel.k8s.io",
            "v2.channel.k8s.io",
            "channel.k8s.io",
        ]);
        assert_eq!(
            negotiate(&kubectl, &REMOTE_COMMAND_PROTOCOLS),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(
            negotiate(
                &offers(&["v2.channel.k8s.io", "v3.channel.k8s.io"]),
                &REMOTE_COMMAND_PROTOCOLS
            ),
            Some("v3.channel.k8s.io")
        );
        assert_eq!(
            negotiate(&offers(&["channel.k8s.io"]), &REMOTE_COMMAND_PROTOCOLS),
            None
        );
        assert_eq!(negotiate(&[], &[PORT_FORWARD_PROTOCOL]), None);
        assert_eq!(
            negotiate(&offers(&[PORT_FORWARD_PROTOCOL]), &[PORT_FORWARD_PROTOCOL]),
            Some(PORT_FORWARD_PROTOCOL)
        );
    }

    #[test]
    fn offered_protocols_are_read_from_every_header() {
        let req = axum::http::Request::builder()
            .header("X-Stream-Protocol-Version", "v4.channel.k8s.io")
            .header(
                "X-Stream-Protocol-Version",
                "v3.channel.k8s.io, v2.channel.k8s.io",
            )
            .header("Upgrade", "SPDY/3.1")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        assert!(wants_spdy(&parts));
        assert_eq!(
            offered(&parts),
            [
                "v4.channel.k8s.io",
                "v3.channel.k8s.io",
                "v2.channel.k8s.io"
            ]
        );
    }

    #[test]
    fn no_common_protocol_is_a_403_naming_the_versions() {
        let resp = no_common_protocol(&offers(&["channel.k8s.io"]), &REMOTE_COMMAND_PROTOCOLS);
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        let accepted: Vec<_> = resp
            .headers()
            .get_all(ACCEPTED_HEADER)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        assert_eq!(accepted, REMOTE_COMMAND_PROTOCOLS);
    }

    #[test]
    fn the_stream_set_is_what_the_query_asked() {
        // exec -i: error, stdin, stdout, stderr; no resize.
        let e = Expected::of("v4.channel.k8s.io", true, true, true, false);
        let mut set = StreamSet::new(e);
        assert_eq!(set.offer(1, &h("error")), Offer::Accept(StreamKind::Error));
        assert_eq!(set.offer(3, &h("resize")), Offer::Refuse);
        assert_eq!(set.offer(5, &h("stdin")), Offer::Accept(StreamKind::Stdin));
        assert_eq!(set.offer(7, &h("stdin")), Offer::Refuse, "a second stdin");
        assert_eq!(
            set.offer(9, &h("stdout")),
            Offer::Accept(StreamKind::Stdout)
        );
        assert!(!set.complete());
        assert_eq!(set.offer(11, &h("bogus")), Offer::Refuse);
        assert_eq!(set.offer(13, &[].to_vec()), Offer::Refuse);
        assert_eq!(
            set.offer(9, &h("stderr")),
            Offer::Refuse,
            "a reused stream id"
        );
        assert_eq!(
            set.offer(15, &h("stderr")),
            Offer::Accept(StreamKind::Stderr)
        );
        assert!(set.complete());
        assert_eq!(set.id(StreamKind::Stdin), Some(5));
        assert_eq!(set.kind_of(15), Some(StreamKind::Stderr));
        assert_eq!(set.open().count(), 4);

        // exec -it: a terminal has no stderr but a resize stream (not in v2).
        let t = Expected::of("v4.channel.k8s.io", true, true, true, true);
        assert!(!t.stderr && t.resize);
        let mut set = StreamSet::new(t);
        for (id, k) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "resize")] {
            assert!(matches!(set.offer(id, &h(k)), Offer::Accept(_)));
        }
        assert!(set.complete());
        assert!(!Expected::of("v2.channel.k8s.io", true, true, false, true).resize);
    }

    #[test]
    fn a_client_opening_streams_without_end_is_cut_off() {
        let mut set = StreamSet::new(Expected::of("v4.channel.k8s.io", false, true, false, false));
        let verdicts: Vec<Offer> = (0..1000u32)
            .map(|i| set.offer(2 * i + 1, &h("stdin")))
            .collect();
        assert!(
            verdicts[..MAX_SYN_STREAMS]
                .iter()
                .all(|v| *v == Offer::Refuse)
        );
        assert!(
            verdicts[MAX_SYN_STREAMS..]
                .iter()
                .all(|v| *v == Offer::TooMany)
        );
    }

    #[test]
    fn port_forward_streams_are_bounded_and_freed_when_they_end() {
        let mut table: StreamTable<bool> = StreamTable::default();
        let ended = |done: &bool| *done;
        let admitted = (0..10_000u32)
            .filter(|i| table.admit(*i, false, 0, ended))
            .count();
        assert_eq!(admitted, MAX_OPEN_STREAMS);
        assert_eq!(table.prune(ended), MAX_OPEN_STREAMS);
        // The caller's other streams count too.
        let mut other: StreamTable<bool> = StreamTable::default();
        assert!(!other.admit(1, false, MAX_OPEN_STREAMS, ended));
        // Ended streams make room.
        let mut done: StreamTable<bool> = StreamTable::default();
        for i in 0..MAX_OPEN_STREAMS as u32 {
            assert!(done.admit(i, true, 0, ended));
        }
        assert!(done.admit(99_999, false, 0, ended));
        assert_eq!(done.prune(ended), 1);
        assert_eq!(done.get(99_999), Some(&false));
        assert_eq!(done.remove(99_999), Some(false));
    }

    #[test]
    fn resizes_are_json_sizes_back_to_back_cut_anywhere() {
        let wire = b"{\"Width\":80,\"Height\":24}\n{\"Width\":100,\"Height\":30}\n";
        let mut d = ResizeDecoder::default();
        let mut got = Vec::new();
        for chunk in wire.chunks(7) {
            got.extend(d.push(chunk));
        }
        assert_eq!(
            got,
            [
                TerminalSize {
                    width: 80,
                    height: 24
                },
                TerminalSize {
                    width: 100,
                    height: 30
                }
            ]
        );
        // Garbage ends the resizes; an endless value is not buffered without bound.
        let mut bad = ResizeDecoder::default();
        assert!(bad.push(b"nonsense").is_empty());
        assert!(bad.push(b"{\"Width\":1,\"Height\":1}").is_empty());
        let mut long = ResizeDecoder::default();
        assert!(long.push(b"{\"Width\":").is_empty());
        assert!(long.push(&[b' '; 8192]).is_empty());
        assert!(long.broken && long.buf.is_empty());
    }

    /// A SPDY client on one end of an in-memory connection.
    struct TestClient {
        rd: tokio::io::ReadHalf<tokio::io::DuplexStream>,
        wr: tokio::io::WriteHalf<tokio::io::DuplexStream>,
        writer: spdy::FrameWriter,
        reader: spdy::Reader,
    }

    impl TestClient {
        fn new(conn: tokio::io::DuplexStream) -> TestClient {
            let (rd, wr) = tokio::io::split(conn);
            TestClient {
                rd,
                wr,
                writer: spdy::FrameWriter::new().unwrap(),
                reader: spdy::Reader::new(),
            }
        }

        async fn send(&mut self, f: Frame) -> std::io::Result<()> {
            let bytes = self.writer.encode(&f).unwrap();
            self.wr.write_all(&bytes).await
        }

        async fn open(&mut self, stream: u32, kind: &str) {
            self.send(Frame::SynStream {
                stream,
                fin: false,
                headers: h(kind),
            })
            .await
            .unwrap();
        }

        /// The next frame from the server, `None` once it closed the connection.
        async fn recv(&mut self) -> Option<Frame> {
            loop {
                if let Some(f) = self.reader.next().unwrap() {
                    return Some(f);
                }
                let mut buf = [0u8; 4096];
                match self.rd.read(&mut buf).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.reader.push(&buf[..n]),
                }
            }
        }
    }

    /// A session of `exec -i` (error, stdin, stdout, stderr) between an in-memory client
    /// and an in-memory agent.
    fn session(
        wait: Duration,
    ) -> (
        TestClient,
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<()>,
    ) {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (agent, agent_side) = tokio::io::duplex(1 << 20);
        let expected = Expected::of("v4.channel.k8s.io", true, true, true, false);
        let session = Session::Exec {
            command: vec!["sh".into()],
        };
        let task = tokio::spawn(remote_command_within(
            server,
            "v4.channel.k8s.io",
            expected,
            agent_side,
            session,
            wait,
        ));
        (TestClient::new(client), agent, task)
    }

    #[tokio::test]
    async fn an_exec_session_over_spdy_streams() {
        let (mut client, mut agent, task) = session(STREAM_SET_WAIT);
        for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
            client.open(id, kind).await;
        }
        client.open(9, "bogus").await;
        client.send(Frame::Ping(42)).await.unwrap();
        let mut replies = Vec::new();
        for _ in 0..6 {
            replies.push(client.recv().await.unwrap());
        }
        for id in [1, 3, 5, 7] {
            assert!(
                replies
                    .iter()
                    .any(|f| matches!(f, Frame::SynReply { stream, .. } if *stream == id)),
                "{replies:?}"
            );
        }
        assert!(replies.contains(&Frame::RstStream {
            stream: 9,
            status: spdy::REFUSED_STREAM
        }));
        assert!(replies.contains(&Frame::Ping(42)));

        // stdin and its end reach the agent as its frames.
        client
            .send(Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::from_static(b"hi"),
            })
            .await
            .unwrap();
        let frame = channel::read_frame(&mut agent).await.unwrap();
        assert_eq!(frame, Some((channel::STDIN, b"hi".to_vec())));
        let frame = channel::read_frame(&mut agent).await.unwrap();
        assert_eq!(frame, Some((channel::CLOSE, vec![channel::STDIN])));

        // The agent's output and end come back on their streams, then every stream ends.
        channel::write_frame(&mut agent, channel::STDOUT, b"out")
            .await
            .unwrap();
        channel::write_frame(&mut agent, channel::STDERR, b"err")
            .await
            .unwrap();
        channel::write_frame(&mut agent, channel::ERROR, br#"{"exitCode":4}"#)
            .await
            .unwrap();
        let mut rest = Vec::new();
        while let Some(f) = client.recv().await {
            rest.push(f);
        }
        let data = |id: u32| -> Vec<u8> {
            rest.iter()
                .filter_map(|f| match f {
                    Frame::Data { stream, data, .. } if *stream == id => Some(data.to_vec()),
                    _ => None,
                })
                .flatten()
                .collect()
        };
        assert_eq!(data(5), b"out");
        assert_eq!(data(7), b"err");
        let status: serde_json::Value = serde_json::from_slice(&data(1)).unwrap();
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0]["message"], "4");
        for id in [1, 3, 5, 7] {
            assert!(
                rest.iter()
                    .any(|f| matches!(f, Frame::Data { stream, fin: true, .. } if *stream == id)),
                "a FIN on stream {id}: {rest:?}"
            );
        }
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_stream_flood_ends_the_session() {
        let (mut client, mut agent, task) = session(STREAM_SET_WAIT);
        let flood = async {
            for i in 0..10_000u32 {
                if client
                    .send(Frame::SynStream {
                        stream: 2 * i + 1,
                        fin: false,
                        headers: h("stdout"),
                    })
                    .await
                    .is_err()
                {
                    break;
                }
            }
            let mut answered = 0;
            while let Some(f) = client.recv().await {
                assert!(matches!(
                    f,
                    Frame::SynReply { .. } | Frame::RstStream { .. }
                ));
                answered += 1;
            }
            answered
        };
        let answered = tokio::time::timeout(Duration::from_secs(10), flood)
            .await
            .expect("the server closes the connection");
        assert_eq!(answered, MAX_SYN_STREAMS);
        // The agent's connection is dropped: the session ends on the node.
        assert_eq!(channel::read_frame(&mut agent).await.unwrap(), None);
        task.await.unwrap();
    }

    /// (The wait is the kubelet's 30 s in the server; 300 ms here.)
    #[tokio::test]
    async fn a_client_that_never_completes_its_streams_is_dropped_after_the_wait() {
        let wait = Duration::from_millis(300);
        let (mut client, mut agent, task) = session(wait);
        client.open(1, "error").await;
        assert!(matches!(client.recv().await, Some(Frame::SynReply { .. })));
        let start = std::time::Instant::now();
        let closed = tokio::time::timeout(Duration::from_secs(10), client.recv()).await;
        assert_eq!(closed, Ok(None), "the server closes the connection");
        assert!(start.elapsed() >= wait / 2);
        assert_eq!(channel::read_frame(&mut agent).await.unwrap(), None);
        task.await.unwrap();
    }
}
