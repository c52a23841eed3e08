//! A streaming session (exec, attach) between a client and the pod's node agent,
//! independent of the client's transport: the client's side is a [`ClientInput`] and a
//! [`ClientOutput`] (WebSocket messages in [`super::exec`], SPDY streams in
//! [`super::spdy_streams`]), the agent's side its length-prefixed frames
//! (`skiff_client::node_api::exec`), and [`bridge`] carries one to the other until the
//! session ends, writing its end as the kubelet does ([`Session`]): `Success`, or
//! `NonZeroExitCode` with the code as a cause.

use std::future::Future;

use serde_json::json;
use skiff_client::node_api::exec::{self as channel, ExecEnd, read_frame, write_frame};
use tokio::io::{AsyncRead, AsyncWrite};

/// What a bridged session is, for the Status written at its end.
pub(super) enum Session {
    Exec { command: Vec<String> },
    Attach,
}

impl Session {
    /// The session ended: the command exited with `code` (attach: the container exited, or
    /// the client detached, which the kubelet reports as success).
    fn ended(&self, code: i32) -> serde_json::Value {
        match self {
            Session::Exec { command } => exec_status(command, code),
            Session::Attach => json!({"metadata": {}, "status": "Success"}),
        }
    }

    fn failed(&self, why: &str) -> serde_json::Value {
        match self {
            Session::Exec { command } => failure(command, why),
            Session::Attach => json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("error attaching to container: {why}"),
                "reason": "InternalError",
                "code": 500,
            }),
        }
    }

    /// The end of the session from the agent's end frame.
    fn end(&self, frame: &[u8]) -> serde_json::Value {
        match serde_json::from_slice::<ExecEnd>(frame) {
            Ok(ExecEnd {
                exit_code: Some(code),
                ..
            }) => self.ended(code),
            Ok(ExecEnd { error, .. }) => self.failed(
                error
                    .as_deref()
                    .unwrap_or("the session ended without an exit code"),
            ),
            Err(e) => self.failed(&format!("unreadable end of session: {e}")),
        }
    }
}

/// What the client sends for the agent, in the client's protocol.
pub(super) trait ClientInput: Send {
    /// The next frame for the agent (stdin, resize, close), `None` once the client is gone.
    fn next(&mut self) -> impl Future<Output = Option<(u8, Vec<u8>)>> + Send;
}

/// What goes to the client, in its protocol.
pub(super) trait ClientOutput: Send {
    /// The command's output on `channel` (stdout or stderr); false once the client is gone.
    fn output(&mut self, channel: u8, data: Vec<u8>) -> impl Future<Output = bool> + Send;
    /// The session's end, `status`, then the end of every stream.
    fn end(self, status: serde_json::Value) -> impl Future<Output = ()> + Send;
}

/// Carries a session between the client's transport and the agent's frames until the
/// session ends (its end written) or either side goes away; dropping the agent's
/// connection ends the session on the node.
pub(super) async fn bridge(
    mut input: impl ClientInput,
    mut output: impl ClientOutput,
    agent: impl AsyncRead + AsyncWrite + Send,
    session: Session,
) {
    let (mut rd, mut wr) = tokio::io::split(agent);
    let to_agent = async move {
        while let Some((ch, data)) = input.next().await {
            if matches!(ch, channel::STDIN | channel::RESIZE | channel::CLOSE)
                && write_frame(&mut wr, ch, &data).await.is_err()
            {
                return;
            }
        }
    };
    let from_agent = async move {
        let status = loop {
            match read_frame(&mut rd).await {
                Ok(Some((ch @ (channel::STDOUT | channel::STDERR), data))) => {
                    if !output.output(ch, data).await {
                        return;
                    }
                }
                Ok(Some((channel::ERROR, data))) => break session.end(&data),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    break session.failed("the node agent's connection was lost");
                }
            }
        };
        output.end(status).await;
    };
    tokio::select! {
        () = to_agent => {}
        () = from_agent => {}
    }
}

fn failure(command: &[String], why: &str) -> serde_json::Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("error executing command {command:?}: {why}"),
        "reason": "InternalError",
        "code": 500,
    })
}

/// The result on the error channel, as the kubelet writes it.
fn exec_status(command: &[String], exit_code: i32) -> serde_json::Value {
    if exit_code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "command terminated with non-zero exit code: error executing command [{}], exit code {exit_code}",
            command.join(" ")
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": exit_code.to_string()}]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_as_the_kubelet_reports_them() {
        assert_eq!(exec_status(&[], 0)["status"], "Success");
        let s = exec_status(&["sh".into(), "-c".into(), "exit 3".into()], 3);
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
        assert_eq!(
            s["message"],
            "command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3"
        );
    }
}
