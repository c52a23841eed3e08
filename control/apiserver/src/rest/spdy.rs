//! SPDY/3.1 frames, as much of them as Kubernetes' streaming subresources use: exec, attach
//! and port forwarding over `Upgrade: SPDY/3.1`, and kubectl 1.32's port forwarding, which
//! tunnels a SPDY/3.1 session inside a WebSocket (`SPDY/3.1+portforward.k8s.io`). What
//! sits on top (negotiation, the streams a session opens, the transports) is in
//! [`super::spdy_streams`].
//!
//! A frame is either a control frame (`SYN_STREAM`, `SYN_REPLY`, `RST_STREAM`, `SETTINGS`,
//! `PING`, `GOAWAY`, `HEADERS`, `WINDOW_UPDATE`) or a data frame for a stream. Header blocks
//! are compressed with one zlib stream per direction for the whole session, primed with the
//! dictionary of the SPDY/3 specification. Flow control windows are not enforced: the
//! Kubernetes clients (moby/spdystream) do not enforce them either.
//!
//! Written here because no maintained Rust crate speaks SPDY, which HTTP/2 replaced in 2015;
//! Kubernetes keeps it for clients of its streaming subresources. zlib is flate2's.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

/// SPDY's version in control frames.
const VERSION: u16 = 3;
/// The largest decompressed header block read (a guard against compression bombs).
const MAX_HEADER_BLOCK: usize = 256 * 1024;
/// The largest frame payload read (SPDY allows 16 MiB; Kubernetes' clients send 32 KiB).
const MAX_FRAME: usize = 1024 * 1024;

const FLAG_FIN: u8 = 0x01;

/// `RST_STREAM` status: the stream was refused (its headers name nothing we serve).
pub(crate) const REFUSED_STREAM: u32 = 3;

/// The zlib dictionary of SPDY/3 (section 2.6.10.1 of the draft): these words, each
/// preceded by its length as four bytes, then the tail as it is.
const DICTIONARY_WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];
const DICTIONARY_TAIL: &str = "100101201202205206300302303304305306307402405406407408409410411\
    412413414415416417502504505203 Non-Authoritative Information204 No Content301 Moved \
    Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server \
    Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct \
    Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,\
    image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,\
    publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

fn dictionary() -> Vec<u8> {
    let mut d = Vec::with_capacity(1423);
    for w in DICTIONARY_WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    d
}

/// What went wrong reading a session; it ends the session.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpdyError {
    #[error("SPDY version {0} is not supported (want 3)")]
    Version(u16),
    #[error("a SPDY frame of {0} bytes is larger than the {MAX_FRAME} read")]
    TooLarge(usize),
    #[error("malformed SPDY {0}")]
    Malformed(&'static str),
    #[error("SPDY header compression: {0}")]
    Zlib(String),
}

/// Headers of a stream (names are lower case in SPDY).
pub(crate) type Headers = Vec<(String, String)>;

/// A frame, read or to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    SynStream {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    SynReply {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Ping(u32),
    GoAway {
        last: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        headers: Headers,
    },
    Data {
        stream: u32,
        fin: bool,
        data: Bytes,
    },
    /// SETTINGS, WINDOW_UPDATE and control frames of unknown types: read and ignored.
    Other,
}

/// The value of header `name` (SPDY names are lower case).
pub(crate) fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Reads frames from the bytes of a session, in order.
pub(crate) struct Reader {
    buf: BytesMut,
    inflate: Decompress,
    dictionary: Vec<u8>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("buffered", &self.buf.len())
            .finish_non_exhaustive()
    }
}

impl Reader {
    pub(crate) fn new() -> Self {
        Reader {
            buf: BytesMut::new(),
            inflate: Decompress::new(true),
            dictionary: dictionary(),
        }
    }

    /// Adds bytes received from the peer.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `None` until one is buffered.
    pub(crate) fn next(&mut self) -> Result<Option<Frame>, SpdyError> {
        if self.buf.len() < 8 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([0, self.buf[5], self.buf[6], self.buf[7]]) as usize;
        if len > MAX_FRAME {
            return Err(SpdyError::TooLarge(len));
        }
        if self.buf.len() < 8 + len {
            return Ok(None);
        }
        let head = self.buf.split_to(8);
        let mut body = self.buf.split_to(len).freeze();
        let flags = head[4];
        let fin = flags & FLAG_FIN != 0;
        if head[0] & 0x80 == 0 {
            let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            return Ok(Some(Frame::Data {
                stream,
                fin,
                data: body,
            }));
        }
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(SpdyError::Version(version));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        let stream_id = |b: &mut Bytes| -> Result<u32, SpdyError> {
            if b.remaining() < 4 {
                return Err(SpdyError::Malformed("frame: too short for a stream id"));
            }
            Ok(b.get_u32() & 0x7fff_ffff)
        };
        Ok(Some(match kind {
            1 => {
                let stream = stream_id(&mut body)?;
                if body.remaining() < 6 {
                    return Err(SpdyError::Malformed("SYN_STREAM"));
                }
                body.advance(6); // associated stream, priority, slot
                let headers = self.headers(&body)?;
                Frame::SynStream {
                    stream,
                    fin,
                    headers,
                }
            }
            2 => {
                let stream = stream_id(&mut body)?;
                let headers = self.headers(&body)?;
                Frame::SynReply {
                    stream,
                    fin,
                    headers,
                }
            }
            3 => {
                let stream = stream_id(&mut body)?;
                if body.remaining() < 4 {
                    return Err(SpdyError::Malformed("RST_STREAM"));
                }
                Frame::RstStream {
                    stream,
                    status: body.get_u32(),
                }
            }
            6 => {
                if body.remaining() < 4 {
                    return Err(SpdyError::Malformed("PING"));
                }
                Frame::Ping(body.get_u32())
            }
            7 => {
                let last = stream_id(&mut body)?;
                let status = if body.remaining() >= 4 {
                    body.get_u32()
                } else {
                    0
                };
                Frame::GoAway { last, status }
            }
            8 => {
                let stream = stream_id(&mut body)?;
                let headers = self.headers(&body)?;
                Frame::Headers { stream, headers }
            }
            _ => Frame::Other,
        }))
    }

    /// Decompresses and parses one header block.
    fn headers(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let raw = self.inflate_block(block)?;
        parse_header_block(&raw)
    }

    fn inflate_block(&mut self, mut input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out: Vec<u8> = Vec::with_capacity(input.len() * 4 + 64);
        loop {
            if out.capacity() - out.len() < 1024 {
                out.reserve(4096);
            }
            let (before_in, before_out) = (self.inflate.total_in(), self.inflate.total_out());
            match self
                .inflate
                .decompress_vec(input, &mut out, FlushDecompress::Sync)
            {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    let consumed = (self.inflate.total_in() - before_in) as usize;
                    input = input.get(consumed..).unwrap_or_default();
                    self.inflate
                        .set_dictionary(&self.dictionary)
                        .map_err(|e| SpdyError::Zlib(e.to_string()))?;
                    continue;
                }
                Err(e) => return Err(SpdyError::Zlib(e.to_string())),
            }
            let consumed = (self.inflate.total_in() - before_in) as usize;
            let produced = (self.inflate.total_out() - before_out) as usize;
            input = input.get(consumed..).unwrap_or_default();
            if out.len() > MAX_HEADER_BLOCK {
                return Err(SpdyError::Malformed("header block: too large"));
            }
            if consumed == 0 && produced == 0 {
                break;
            }
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
        }
        Ok(out)
    }
}

fn parse_header_block(raw: &[u8]) -> Result<Headers, SpdyError> {
    let mut b = raw;
    let bad = || SpdyError::Malformed("header block");
    let take = |b: &mut &[u8]| -> Result<String, SpdyError> {
        if b.remaining() < 4 {
            return Err(bad());
        }
        let n = b.get_u32() as usize;
        if b.remaining() < n {
            return Err(bad());
        }
        let s = String::from_utf8_lossy(&b[..n]).into_owned();
        b.advance(n);
        Ok(s)
    };
    if b.remaining() < 4 {
        return Err(bad());
    }
    let count = b.get_u32() as usize;
    let mut headers = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let name = take(&mut b)?;
        let value = take(&mut b)?;
        headers.push((name.to_ascii_lowercase(), value));
    }
    Ok(headers)
}

/// Writes frames (owning the compressor of this direction's header blocks).
pub(crate) struct FrameWriter {
    deflate: Compress,
}

impl std::fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameWriter").finish_non_exhaustive()
    }
}

impl FrameWriter {
    pub(crate) fn new() -> Result<Self, SpdyError> {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(&dictionary())
            .map_err(|e| SpdyError::Zlib(e.to_string()))?;
        Ok(FrameWriter { deflate })
    }

    /// The bytes of `frame`.
    pub(crate) fn encode(&mut self, frame: &Frame) -> Result<Vec<u8>, SpdyError> {
        let control = |kind: u16, flags: u8, body: &[u8]| {
            let mut out = Vec::with_capacity(8 + body.len());
            out.put_u16(0x8000 | VERSION);
            out.put_u16(kind);
            out.put_u32((u32::from(flags) << 24) | body.len() as u32);
            out.extend_from_slice(body);
            out
        };
        let fin = |f: bool| if f { FLAG_FIN } else { 0 };
        Ok(match frame {
            Frame::SynStream {
                stream,
                fin: f,
                headers,
            } => {
                let mut body = Vec::new();
                body.put_u32(*stream);
                body.put_u32(0);
                body.put_u16(0);
                body.extend(self.header_block(headers)?);
                control(1, fin(*f), &body)
            }
            Frame::SynReply {
                stream,
                fin: f,
                headers,
            } => {
                let mut body = Vec::new();
                body.put_u32(*stream);
                body.extend(self.header_block(headers)?);
                control(2, fin(*f), &body)
            }
            Frame::Headers { stream, headers } => {
                let mut body = Vec::new();
                body.put_u32(*stream);
                body.extend(self.header_block(headers)?);
                control(8, 0, &body)
            }
            Frame::RstStream { stream, status } => {
                let mut body = Vec::new();
                body.put_u32(*stream);
                body.put_u32(*status);
                control(3, 0, &body)
            }
            Frame::Ping(id) => control(6, 0, &id.to_be_bytes()),
            Frame::GoAway { last, status } => {
                let mut body = Vec::new();
                body.put_u32(*last);
                body.put_u32(*status);
                control(7, 0, &body)
            }
            Frame::Data {
                stream,
                fin: f,
                data,
            } => {
                let mut out = Vec::with_capacity(8 + data.len());
                out.put_u32(stream & 0x7fff_ffff);
                out.put_u32((u32::from(fin(*f)) << 24) | data.len() as u32);
                out.extend_from_slice(data);
                out
            }
            Frame::Other => Vec::new(),
        })
    }

    fn header_block(&mut self, headers: &Headers) -> Result<Vec<u8>, SpdyError> {
        let mut raw = Vec::new();
        raw.put_u32(headers.len() as u32);
        for (k, v) in headers {
            raw.put_u32(k.len() as u32);
            raw.extend_from_slice(k.as_bytes());
            raw.put_u32(v.len() as u32);
            raw.extend_from_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input: &[u8] = &raw;
        loop {
            if out.capacity() - out.len() < 256 {
                out.reserve(1024);
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Zlib(e.to_string()))?;
            let consumed = (self.deflate.total_in() - before) as usize;
            input = input.get(consumed..).unwrap_or_default();
            // A sync flush is complete when the output did not fill the buffer.
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_dictionary_is_spdy3s() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        // Its Adler-32, which every SPDY/3 zlib stream names in its header.
        let (mut a, mut b) = (1u32, 0u32);
        for x in &d {
            a = (a + u32::from(*x)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    }

    #[test]
    fn frames_round_trip_through_one_compression_context() {
        let mut w = FrameWriter::new().unwrap();
        let mut r = Reader::new();
        let frames = [
            Frame::SynStream {
                stream: 1,
                fin: false,
                headers: h(&[
                    ("streamtype", "error"),
                    ("port", "8080"),
                    ("requestid", "0"),
                ]),
            },
            Frame::SynStream {
                stream: 3,
                fin: false,
                headers: h(&[("streamtype", "data"), ("port", "8080"), ("requestid", "0")]),
            },
            Frame::Data {
                stream: 3,
                fin: false,
                data: Bytes::from_static(b"GET / HTTP/1.0\r\n\r\n"),
            },
            Frame::Ping(7),
            Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::new(),
            },
            Frame::SynReply {
                stream: 1,
                fin: false,
                headers: Vec::new(),
            },
            Frame::RstStream {
                stream: 3,
                status: REFUSED_STREAM,
            },
            Frame::GoAway { last: 3, status: 0 },
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(w.encode(f).unwrap());
        }
        // Delivered in odd pieces, as WebSocket messages may cut them.
        let mut got = Vec::new();
        for chunk in wire.chunks(5) {
            r.push(chunk);
            while let Some(f) = r.next().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
        assert_eq!(header(&got[0].headers_of(), "streamType"), Some("error"));
    }

    impl Frame {
        fn headers_of(&self) -> Headers {
            match self {
                Frame::SynStream { headers, .. } => headers.clone(),
                _ => Vec::new(),
            }
        }
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let mut r = Reader::new();
        r.push(&[0x80, 0x02, 0, 1, 0, 0, 0, 0]);
        assert!(matches!(r.next(), Err(SpdyError::Version(2))));
        let mut r = Reader::new();
        r.push(&[0x80, 0x03, 0, 1, 0, 0, 0, 4, 0, 0, 0, 1]);
        assert!(r.next().is_err());
        let mut r = Reader::new();
        r.push(&[0x80, 0x03, 0, 1, 0, 0xff, 0xff, 0xff]);
        assert!(matches!(r.next(), Err(SpdyError::TooLarge(_))));
        // A SYN_STREAM whose header block is not zlib.
        let mut r = Reader::new();
        r.push(&[
            0x80, 0x03, 0, 1, 0, 0, 0, 14, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4,
        ]);
        assert!(r.next().is_err());
    }
}
