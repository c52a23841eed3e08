//! Exec's channel frames between the API server and a node agent. After the agent answers
//! `101 Switching Protocols` to `POST /exec/...` with `Upgrade: skiff-exec`
//! ([`super::EXEC_UPGRADE`]), both sides write frames `[channel: u8][length: u32 BE][bytes]`
//! on the connection, with Kubernetes' channel numbers (`v5.channel.k8s.io`): so the API
//! server translates WebSocket messages to frames one for one.
//!
//! - to the agent: [`STDIN`] bytes, [`RESIZE`] a [`TerminalSize`] as JSON, [`CLOSE`] with
//!   one byte naming the channel to close (only [`STDIN`]: the command sees end of input);
//! - from the agent: [`STDOUT`] and [`STDERR`] bytes as the command writes them (a terminal
//!   session has only [`STDOUT`]), then one [`ERROR`] frame, an [`ExecEnd`] as JSON, after
//!   which the agent closes the connection.
//!
//! The connection's end is the session's: when the API server's side goes away (kubectl
//! disconnected), the agent kills every process of the exec's session.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The command's standard input.
pub const STDIN: u8 = 0;
/// The command's standard output (a terminal's output, with a TTY).
pub const STDOUT: u8 = 1;
/// The command's standard error (none with a TTY).
pub const STDERR: u8 = 2;
/// The end of the session ([`ExecEnd`]).
pub const ERROR: u8 = 3;
/// A new terminal size ([`TerminalSize`]).
pub const RESIZE: u8 = 4;
/// Closes the channel named by the frame's one byte.
pub const CLOSE: u8 = 255;

/// Largest frame either side accepts; a longer one is a protocol error.
pub const MAX_FRAME: usize = 1 << 20;

/// A terminal's size, as kubectl sends it on the resize channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TerminalSize {
    pub width: u16,
    pub height: u16,
}

/// How an exec session ended: the command's exit code (`128 + signal` when killed), or why
/// it could not run or was cut short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecEnd {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Writes one frame (and flushes it: sessions are interactive).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    channel: u8,
    data: &[u8],
) -> std::io::Result<()> {
    let len = u32::try_from(data.len())
        .ok()
        .filter(|&l| l as usize <= MAX_FRAME)
        .ok_or_else(|| std::io::Error::other(format!("frame of {} bytes", data.len())))?;
    let mut head = [0u8; 5];
    head[0] = channel;
    head[1..].copy_from_slice(&len.to_be_bytes());
    w.write_all(&head).await?;
    w.write_all(data).await?;
    w.flush().await
}

/// Reads one frame; `None` when the connection ended cleanly between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        let n = r.read(&mut head[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        got += n;
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes, more than {MAX_FRAME}"),
        ));
    }
    let mut data = vec![0u8; len];
    r.read_exact(&mut data).await?;
    Ok(Some((head[0], data)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_oversized_ones_are_refused() {
        let mut buf = Vec::new();
        write_frame(&mut buf, STDOUT, b"hello").await.unwrap();
        write_frame(&mut buf, CLOSE, &[STDIN]).await.unwrap();
        let mut r = buf.as_slice();
        assert_eq!(
            read_frame(&mut r).await.unwrap(),
            Some((STDOUT, b"hello".to_vec()))
        );
        assert_eq!(
            read_frame(&mut r).await.unwrap(),
            Some((CLOSE, vec![STDIN]))
        );
        assert_eq!(read_frame(&mut r).await.unwrap(), None);

        let mut huge = vec![STDIN];
        huge.extend_from_slice(&(MAX_FRAME as u32 + 1).to_be_bytes());
        let err = read_frame(&mut huge.as_slice()).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        // A frame cut in its header is an error, not a clean end.
        let err = read_frame(&mut &[STDOUT, 0][..]).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn terminal_size_is_kubectls_json() {
        let s: TerminalSize = serde_json::from_str(r#"{"Width":80,"Height":24}"#).unwrap();
        assert_eq!(
            s,
            TerminalSize {
                width: 80,
                height: 24
            }
        );
    }
}
