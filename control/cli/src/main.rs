//! `skiff`: the command line of a Skiff cluster, in the style of kubectl.

mod apply;
mod columns;
mod delete;
mod describe;
mod get;
mod logs;
mod output;
mod resources;
mod table;
mod top;

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use skiff_api::api::{Namespace, ObjectMeta};
use skiff_client::{Client, ClientConfig, ClientError, PropagationPolicy};

#[derive(Debug, Parser)]
#[command(
    name = "skiff",
    version,
    about = "Control a Skiff cluster (kubectl-style)",
    propagate_version = true
)]
struct Cli {
    /// API server URL [default: from $SKIFF_CONFIG or ~/.config/skiff/config.yaml, else
    /// http://127.0.0.1:7443].
    #[arg(long, global = true, env = "SKIFF_SERVER", value_name = "URL")]
    server: Option<String>,
    /// Namespace to work in [default: default].
    #[arg(short = 'n', long, global = true, value_name = "NS")]
    namespace: Option<String>,
    /// Work across every namespace.
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or update objects from manifest files (YAML or JSON).
    Apply(ApplyArgs),
    /// Show objects as a table, YAML, JSON or names; -w follows changes.
    Get(GetArgs),
    /// Show a readable description of objects, with their events.
    Describe(DescribeArgs),
    /// Delete objects by type and name, selector, or manifest files.
    Delete(DeleteArgs),
    /// Create an object from the command line.
    #[command(subcommand)]
    Create(CreateCommand),
    /// List the resource types the server serves.
    ApiResources,
    /// Print the logs of a container in a pod (from the agent of the pod's node).
    Logs(LogsArgs),
    /// Show resource usage (CPU, network) of pods.
    #[command(subcommand)]
    Top(TopCommand),
}

#[derive(Debug, Args)]
struct LogsArgs {
    /// The pod.
    pod: String,
    /// The container (needed when the pod has several).
    #[arg(short = 'c', long)]
    container: Option<String>,
    /// Keep streaming new lines (until Ctrl-C or the pod is deleted).
    #[arg(short = 'f', long)]
    follow: bool,
    /// Only the last N lines; -1 shows all.
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    tail: i64,
    /// Prefix every line with the time it was written (RFC 3339).
    #[arg(long)]
    timestamps: bool,
}

#[derive(Debug, Subcommand)]
enum TopCommand {
    /// CPU (millicores, sampled over 1 s) and cumulative network bytes of pods.
    #[command(visible_alias = "pod", alias = "po")]
    Pods {
        /// Output format (default: a table).
        #[arg(short = 'o', long, value_enum)]
        output: Option<top::Output>,
    },
}

#[derive(Debug, Args)]
struct ApplyArgs {
    /// A manifest file, a directory of them, or - for standard input. Repeatable.
    #[arg(
        short = 'f',
        long = "filename",
        required = true,
        value_name = "FILE|DIR|-"
    )]
    files: Vec<String>,
}

#[derive(Debug, Args)]
struct GetArgs {
    /// TYPE[,TYPE...] [NAME...] or TYPE/NAME...
    #[arg(required = true, value_name = "RESOURCE")]
    resources: Vec<String>,
    /// Label selector, e.g. app=web,tier!=db.
    #[arg(short = 'l', long, value_name = "SELECTOR", default_value = "")]
    selector: String,
    /// Field selector, e.g. spec.nodeName=n1.
    #[arg(long, value_name = "SELECTOR", default_value = "")]
    field_selector: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum)]
    output: Option<get::Output>,
    /// After listing, watch for changes (until Ctrl-C).
    #[arg(short = 'w', long)]
    watch: bool,
    /// Show every object's labels as the last column.
    #[arg(long)]
    show_labels: bool,
}

#[derive(Debug, Args)]
struct DescribeArgs {
    /// TYPE [NAME...] or TYPE/NAME...
    #[arg(required = true, value_name = "RESOURCE")]
    resources: Vec<String>,
    /// Label selector.
    #[arg(short = 'l', long, value_name = "SELECTOR", default_value = "")]
    selector: String,
}

#[derive(Debug, Args)]
struct DeleteArgs {
    /// TYPE NAME... or TYPE/NAME...
    #[arg(value_name = "RESOURCE")]
    resources: Vec<String>,
    /// Delete the objects in these manifest files (FILE, DIR or -). Repeatable.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-")]
    files: Vec<String>,
    /// Delete the objects matching this label selector.
    #[arg(short = 'l', long, value_name = "SELECTOR", default_value = "")]
    selector: String,
    /// Delete every object of the type(s) in the namespace.
    #[arg(long)]
    all: bool,
    /// Seconds objects get to terminate; negative uses each object's default.
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    grace_period: i64,
    /// What happens to dependents: background, foreground or orphan.
    #[arg(long, value_name = "POLICY", value_parser = delete::parse_cascade)]
    cascade: Option<PropagationPolicy>,
    /// Treat objects that do not exist as deleted.
    #[arg(long)]
    ignore_not_found: bool,
}

#[derive(Debug, Subcommand)]
enum CreateCommand {
    /// Create a namespace.
    #[command(visible_alias = "ns")]
    Namespace {
        /// The namespace's name.
        name: String,
    },
}

/// Writes a line to stdout, reporting (instead of panicking on) a closed pipe.
pub fn print_out(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|_| out.flush())
        .context("writing to standard output")
}

/// The server's message for a failed call about `name`, prefixed with the name when the
/// message does not mention it.
pub fn server_message(e: &ClientError, name: &str) -> String {
    let msg = e.to_string();
    if name.is_empty() || msg.contains(name) {
        msg
    } else {
        format!("{name}: {msg}")
    }
}

/// One line for an error: an unreachable server is reported alone, without what led to it.
fn error_line(e: &anyhow::Error) -> String {
    for cause in e.chain() {
        if let Some(ce) = cause.downcast_ref::<ClientError>()
            && ce.is_unreachable()
        {
            return ce.to_string();
        }
    }
    format!("{e:#}")
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

async fn connect(cli: &Cli) -> Result<Client> {
    let config = ClientConfig::load(cli.server.as_deref())?;
    tracing::debug!(server = %config.server, source = ?config.source, "API server");
    Ok(Client::connect(config.endpoint()).await?)
}

async fn run(cli: Cli) -> Result<ExitCode> {
    // Check what can be checked before talking to the server.
    match &cli.command {
        Command::Get(GetArgs { resources, .. })
        | Command::Describe(DescribeArgs { resources, .. }) => {
            resources::parse_targets(resources)?;
        }
        Command::Delete(d) if d.files.is_empty() && !d.resources.is_empty() => {
            resources::parse_targets(&d.resources)?;
        }
        _ => {}
    }
    let client = connect(&cli).await?;
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    match cli.command {
        Command::Apply(a) => apply::run(&client, &a.files, cli.namespace.as_deref()).await,
        Command::Get(g) => {
            let opts = get::GetOpts {
                targets: resources::parse_targets(&g.resources)?,
                label_selector: g.selector,
                field_selector: g.field_selector,
                output: g.output,
                watch: g.watch,
                show_labels: g.show_labels,
                namespace,
                all_namespaces: cli.all_namespaces,
            };
            get::run(&client, &opts).await
        }
        Command::Describe(d) => {
            let targets = resources::parse_targets(&d.resources)?;
            describe::run(
                &client,
                &targets,
                &d.selector,
                &namespace,
                cli.all_namespaces,
            )
            .await
        }
        Command::Delete(d) => {
            let opts = delete::DeleteOpts {
                resources: d.resources,
                files: d.files,
                label_selector: d.selector,
                all: d.all,
                grace_period: Some(d.grace_period),
                cascade: d.cascade,
                ignore_not_found: d.ignore_not_found,
                namespace: cli.namespace.clone(),
                all_namespaces: cli.all_namespaces,
            };
            if opts.resources.is_empty() && opts.files.is_empty() {
                anyhow::bail!("you must specify a resource type and name(s), or -f FILE");
            }
            delete::run(&client, &opts).await
        }
        Command::Create(CreateCommand::Namespace { name }) => {
            let ns = Namespace {
                metadata: Some(ObjectMeta {
                    name: name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let mut ns = ns;
            skiff_api::Resource::set_type_meta(&mut ns);
            client.cluster::<Namespace>().create(&ns).await?;
            print_out(&format!("namespace/{name} created"))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Logs(l) => {
            let opts = logs::LogsOpts {
                pod: l.pod,
                container: l.container,
                follow: l.follow,
                tail: l.tail,
                timestamps: l.timestamps,
                namespace,
            };
            logs::run(&client, &opts).await
        }
        Command::Top(TopCommand::Pods { output }) => {
            let opts = top::TopOpts {
                namespace,
                all_namespaces: cli.all_namespaces,
                output,
            };
            top::run(&client, &opts).await
        }
        Command::ApiResources => {
            let mut infos = client.discovery().await?;
            infos.sort_by(|a, b| a.plural.cmp(&b.plural));
            let headers: Vec<String> = ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
                .map(String::from)
                .to_vec();
            let rows: Vec<Vec<String>> = infos
                .into_iter()
                .map(|i| {
                    vec![
                        i.plural,
                        i.short_names.join(","),
                        i.api_version,
                        i.namespaced.to_string(),
                        i.kind,
                    ]
                })
                .collect();
            print_out(&table::render(&headers, &rows).join("\n"))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SKIFF_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_is_reported_alone() {
        let e = anyhow::Error::new(ClientError::Unreachable {
            endpoint: "http://127.0.0.1:7443".into(),
            reason: "connection refused".into(),
        })
        .context("listing pods");
        assert_eq!(
            error_line(&e),
            "cannot reach the Skiff API server at http://127.0.0.1:7443: connection refused \
             (is it running? start one with `cargo xtask up`)"
        );
        let e = anyhow::anyhow!("boom").context("doing x");
        assert_eq!(error_line(&e), "doing x: boom");
    }

    #[test]
    fn server_messages_name_the_object() {
        let e = ClientError::NotFound {
            message: "pods \"x\" not found".into(),
        };
        assert_eq!(server_message(&e, "x"), "pods \"x\" not found");
        let e = ClientError::Invalid {
            message: "spec.replicas: must be >= 0".into(),
        };
        assert_eq!(
            server_message(&e, "web"),
            "web: spec.replicas: must be >= 0"
        );
    }

    #[test]
    fn cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["skiff", "get", "pods", "-n", "shop", "-o", "wide", "-w"])
            .unwrap();
        assert_eq!(c.namespace.as_deref(), Some("shop"));
        assert!(matches!(
            c.command,
            Command::Get(GetArgs { watch: true, .. })
        ));
        let c = Cli::try_parse_from([
            "skiff",
            "delete",
            "deploy",
            "web",
            "--cascade=orphan",
            "--grace-period",
            "0",
        ])
        .unwrap();
        let Command::Delete(d) = c.command else {
            panic!("not delete");
        };
        assert_eq!(d.cascade, Some(PropagationPolicy::Orphan));
        assert_eq!(d.grace_period, 0);
        assert!(Cli::try_parse_from(["skiff", "apply"]).is_err());
        let c = Cli::try_parse_from(["skiff", "logs", "web", "-c", "app", "-f", "--tail", "2"])
            .unwrap();
        let Command::Logs(l) = c.command else {
            panic!("not logs");
        };
        assert_eq!(
            (l.container.as_deref(), l.follow, l.tail),
            (Some("app"), true, 2)
        );
        assert_eq!(
            Cli::try_parse_from(["skiff", "logs", "web"])
                .map(|c| matches!(c.command, Command::Logs(LogsArgs { tail: -1, .. })))
                .ok(),
            Some(true)
        );
        let c = Cli::try_parse_from(["skiff", "top", "pods", "-A", "-o", "json"]).unwrap();
        assert!(c.all_namespaces);
        assert!(matches!(
            c.command,
            Command::Top(TopCommand::Pods {
                output: Some(top::Output::Json)
            })
        ));
    }
}
