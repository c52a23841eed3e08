//! `skiff logs POD [-c CONTAINER] [-f] [--tail N] [--timestamps] [-p]`: a container's output, from
//! the agent of the node the pod runs on (found through the API server: the pod's
//! `spec.nodeName`, then that Node's published agent port).

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use skiff_api::api::Pod;
use skiff_client::Client;
use skiff_client::node_api::{AgentEndpoint, LogOptions};

use crate::server_message;

pub struct LogsOpts {
    pub pod: String,
    pub container: Option<String>,
    pub follow: bool,
    /// Negative: every line.
    pub tail: i64,
    pub timestamps: bool,
    pub previous: bool,
    pub namespace: String,
}

/// The container to show: the one asked for, or the pod's only one (like kubectl, a pod
/// with several needs `-c`).
pub fn pick_container(pod: &Pod, requested: Option<&str>) -> Result<String> {
    let name = skiff_api::Resource::name(pod);
    let names: Vec<&str> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.as_str()).collect())
        .unwrap_or_default();
    match requested {
        Some(c) if names.contains(&c) => Ok(c.to_string()),
        Some(c) => bail!(
            "container {c} is not valid for pod {name}; choose one of: [{}]",
            names.join(" ")
        ),
        None => match names.as_slice() {
            [only] => Ok(only.to_string()),
            [] => bail!("pod {name} has no containers"),
            many => bail!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                many.join(" ")
            ),
        },
    }
}

pub async fn run(client: &Client, opts: &LogsOpts) -> Result<ExitCode> {
    let pod = client
        .namespaced::<Pod>(&opts.namespace)
        .get(&opts.pod)
        .await
        .map_err(|e| anyhow::anyhow!(server_message(&e, &opts.pod)))?;
    let container = pick_container(&pod, opts.container.as_deref())?;
    let agent = AgentEndpoint::for_pod(client, &pod).await?;
    let log_opts = LogOptions {
        tail: u64::try_from(opts.tail).ok(),
        follow: opts.follow,
        timestamps: opts.timestamps,
        previous: opts.previous,
    };
    let mut stream = agent
        .logs(&opts.namespace, &opts.pod, &container, &log_opts)
        .await?;
    let mut out = std::io::stdout();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        out.write_all(&chunk)
            .and_then(|_| out.flush())
            .context("writing to standard output")?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{Container, ObjectMeta, PodSpec};

    fn pod(containers: &[&str]) -> Pod {
        Pod {
            metadata: Some(ObjectMeta {
                name: "web".into(),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: containers
                    .iter()
                    .map(|c| Container {
                        name: c.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn one_container_needs_no_name() {
        assert_eq!(pick_container(&pod(&["app"]), None).unwrap(), "app");
        assert_eq!(pick_container(&pod(&["app"]), Some("app")).unwrap(), "app");
    }

    #[test]
    fn several_containers_need_a_name() {
        let p = pod(&["server", "sidecar"]);
        assert_eq!(
            pick_container(&p, None).unwrap_err().to_string(),
            "a container name must be specified for pod web, choose one of: [server sidecar]"
        );
        assert_eq!(pick_container(&p, Some("sidecar")).unwrap(), "sidecar");
        assert_eq!(
            pick_container(&p, Some("db")).unwrap_err().to_string(),
            "container db is not valid for pod web; choose one of: [server sidecar]"
        );
    }
}
