//! `POST /exec/{namespace}/{pod}/{container}` with `Upgrade: skiff-exec`: starts an
//! [`ExecRequest`]'s command in the container (on pipes, or on a pseudo-terminal with
//! `tty`) through the runtime's streaming exec, answers 101, then carries the session's
//! channels ([`skiff_client::node_api::exec`]): stdin, close-stdin and resize frames in,
//! stdout and stderr frames out as the command writes them, then its end.
//!
//! Errors come before the upgrade, as plain-text answers the API server turns into
//! Kubernetes' `Status`: a container that is not running (409), a pod not on this node
//! (404), a bad request (400). A resize on a session without a terminal is ignored, as
//! Kubernetes ignores it. When the connection goes away the session is dropped, which kills
//! every process of it (`skiff_runtime::exec::SessionGuard`). After the command exits its
//! output is drained for at most [`DRAIN`]; what a background process of the session still
//! holds open then is cut off with the session.

use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use skiff_client::node_api::exec::{
    self as channel, ExecEnd, TerminalSize, read_frame, write_frame,
};
use skiff_client::node_api::{EXEC_UPGRADE, ExecRequest, MAX_EXEC_REQUEST};
use skiff_runtime::exec::{ExecOptions, ExecReader, ExecSession};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tracing::debug;

use super::routes::{ApiState, error, find_container};

/// How long output is still read after the command has exited.
const DRAIN: Duration = Duration::from_secs(2);
/// Bytes read from the command per output frame.
const CHUNK: usize = 32 * 1024;

pub(super) async fn exec(
    State(st): State<ApiState>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    mut req: axum::extract::Request,
) -> Response {
    let (on_upgrade, exec): (_, ExecRequest) = match session_request(&mut req, "exec").await {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    if exec.command.is_empty() {
        return error(StatusCode::BAD_REQUEST, "exec: empty command".into());
    }
    let sandbox = match running_sandbox(&st, &namespace, &pod, &container) {
        Ok(s) => s,
        Err(resp) => return *resp,
    };
    let opts = ExecOptions {
        stdin: exec.stdin,
        tty: exec.tty,
    };
    // The command itself is not logged: it may carry secrets.
    debug!(pod = %format!("{namespace}/{pod}"), %container, stdin = opts.stdin, tty = opts.tty, "exec");
    let session = match st
        .ctx
        .runtime
        .exec_stream(&sandbox, &container, &exec.command, opts)
        .await
    {
        Ok(s) => s,
        Err(e) => return session_error(e, &container),
    };
    upgrade(on_upgrade, session)
}

/// Reads a session request (exec's or attach's): checks the upgrade, decodes the body.
pub(super) async fn session_request<T: serde::de::DeserializeOwned>(
    req: &mut axum::extract::Request,
    what: &str,
) -> Result<(hyper::upgrade::OnUpgrade, T), Box<Response>> {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !upgrade.eq_ignore_ascii_case(EXEC_UPGRADE) {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            format!("{what} needs `Upgrade: {EXEC_UPGRADE}`"),
        )));
    }
    let on_upgrade = hyper::upgrade::on(&mut *req);
    let body = std::mem::take(req.body_mut());
    let body = match axum::body::to_bytes(body, MAX_EXEC_REQUEST).await {
        Ok(b) => b,
        Err(e) => {
            return Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                format!("{what} request: {e}"),
            )));
        }
    };
    match serde_json::from_slice(&body) {
        Ok(r) => Ok((on_upgrade, r)),
        Err(e) => Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            format!("{what} request: {e}"),
        ))),
    }
}

/// The sandbox of pod `namespace/pod` of this node, which has `container`; else the answer.
pub(super) fn running_sandbox(
    st: &ApiState,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Result<skiff_runtime::Sandbox, Box<Response>> {
    let info = find_container(st, namespace, pod, container)?;
    info.sandbox.ok_or_else(|| {
        Box::new(error(
            StatusCode::CONFLICT,
            format!("pod {namespace}/{pod} has no sandbox yet: it is not running"),
        ))
    })
}

/// The runtime's refusal to start a session, as an answer before the upgrade.
pub(super) fn session_error(e: skiff_runtime::RuntimeError, container: &str) -> Response {
    match e {
        skiff_runtime::RuntimeError::NotRunning(_) => error(
            StatusCode::CONFLICT,
            format!("container {container:?} is not running: it has exited"),
        ),
        skiff_runtime::RuntimeError::InvalidSpec(m) => error(StatusCode::BAD_REQUEST, m),
        e => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Answers 101 and carries `session` over the upgraded connection ([`serve`]); if the
/// upgrade fails, the session is dropped (an exec's command is killed, an attach detaches).
pub(super) fn upgrade(on_upgrade: hyper::upgrade::OnUpgrade, session: ExecSession) -> Response {
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => serve(hyper_util::rt::TokioIo::new(upgraded), session).await,
            Err(e) => debug!(error = %e, "session upgrade"),
        }
    });
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, "Upgrade"),
            (header::UPGRADE, EXEC_UPGRADE),
        ],
    )
        .into_response()
}

/// Carries one session over `conn` until the command (or, attached, the container) ends
/// (then its end is written) or the connection does (then the session is dropped: an exec's
/// processes are killed, an attach detaches).
async fn serve<C: AsyncRead + AsyncWrite + Send + Unpin>(conn: C, session: ExecSession) {
    let ExecSession {
        stdin,
        stdout,
        stderr,
        terminal,
        exit,
        session: guard,
    } = session;
    let (mut rd, mut wr) = tokio::io::split(conn);
    let input = async move {
        let mut stdin = stdin;
        loop {
            match read_frame(&mut rd).await {
                Ok(Some((channel::STDIN, data))) => {
                    if let Some(w) = stdin.as_mut()
                        && (w.write_all(&data).await.is_err() || w.flush().await.is_err())
                    {
                        // The command closed its input; later bytes have nowhere to go.
                        stdin = None;
                    }
                }
                Ok(Some((channel::CLOSE, data))) if data.first() == Some(&channel::STDIN) => {
                    if let Some(mut w) = stdin.take() {
                        let _ = w.shutdown().await;
                    }
                }
                Ok(Some((channel::RESIZE, data))) => {
                    let size = serde_json::from_slice::<TerminalSize>(&data);
                    match (&terminal, size) {
                        (Some(t), Ok(s)) if s.width > 0 && s.height > 0 => {
                            if let Err(e) = t.resize(s.width, s.height) {
                                debug!(error = %e, "exec resize");
                            }
                        }
                        // No terminal, or a size that is none: ignored, as the kubelet does.
                        _ => {}
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    };
    let output = async move {
        let end = pump_output(&mut wr, stdout, stderr, exit).await;
        if let Ok(end) = end {
            let json = serde_json::to_vec(&end).unwrap_or_default();
            let _ = write_frame(&mut wr, channel::ERROR, &json).await;
            let _ = wr.shutdown().await;
        }
    };
    tokio::select! {
        () = input => debug!("session connection closed: ending the session"),
        () = output => {}
    }
    drop(guard);
}

/// Copies the command's output to frames until it has exited and its output is drained (or
/// [`DRAIN`] has passed since its exit); its end, or the connection's error.
async fn pump_output<W: AsyncWrite + Unpin>(
    wr: &mut W,
    mut stdout: ExecReader,
    mut stderr: Option<ExecReader>,
    mut exit: std::pin::Pin<
        Box<dyn Future<Output = Result<i32, skiff_runtime::RuntimeError>> + Send>,
    >,
) -> std::io::Result<ExecEnd> {
    let mut out_buf = vec![0u8; CHUNK];
    let mut err_buf = vec![0u8; CHUNK];
    let mut out_open = true;
    let mut ended: Option<ExecEnd> = None;
    let drain = tokio::time::sleep(Duration::from_secs(u64::MAX >> 2));
    tokio::pin!(drain);
    loop {
        if let Some(end) = &ended
            && !out_open
            && stderr.is_none()
        {
            return Ok(end.clone());
        }
        let err_read = async {
            match stderr.as_mut() {
                Some(r) => r.read(&mut err_buf).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = stdout.read(&mut out_buf), if out_open => match r {
                Ok(n) if n > 0 => write_frame(wr, channel::STDOUT, &out_buf[..n]).await?,
                _ => out_open = false,
            },
            r = err_read => match r {
                Ok(n) if n > 0 => write_frame(wr, channel::STDERR, &err_buf[..n]).await?,
                _ => stderr = None,
            },
            code = &mut exit, if ended.is_none() => {
                ended = Some(match code {
                    Ok(c) => ExecEnd { exit_code: Some(c), error: None },
                    Err(e) => ExecEnd { exit_code: None, error: Some(e.to_string()) },
                });
                drain.as_mut().reset(tokio::time::Instant::now() + DRAIN);
            }
            () = &mut drain, if ended.is_some() => {
                return Ok(ended.unwrap_or(ExecEnd { exit_code: None, error: None }));
            }
        }
    }
}
