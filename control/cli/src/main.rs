//! `skiff`: the command line of a Skiff cluster, in the style of kubectl.
//!
//! Commands: `apply` (every document of every file checked before anything is sent; a
//! client-side three-way merge through the `skiff.io/last-applied-configuration` annotation,
//! lists merged by position), `get` (tables, `-o wide|yaml|json|name`, `-w`), `describe`,
//! `delete`, `create namespace`, `api-resources`, `scale` (compare-and-swap on
//! `spec.replicas`, retried on conflict; `--current-replicas` checked on every read),
//! `rollout`, `token`, `images`, and, read from the node agents (found through the API;
//! cluster state still comes only from the API server): `logs`, `top pods`, `observe` and
//! `bpf`. Pure formatting functions are unit-tested; the commands are tested against a real
//! API server (`control/cli/tests/`).

mod apply;
mod bpf;
mod delete;
mod describe;
mod get;
mod images;
mod logs;
mod observe;
mod output;
mod resources;
mod rollout;
mod scale;
mod table;
mod token;
mod top;
mod update;

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
    /// API server URL, or a comma-separated list of API servers to fail over between
    /// [default: the kubeconfig's].
    #[arg(long, global = true, env = "SKIFF_SERVER", value_name = "URL")]
    server: Option<String>,
    /// The kubeconfig to use [default: $SKIFF_CONFIG, then ~/.config/skiff/config.yaml]:
    /// the server, the CA to trust and the client certificate or token.
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<std::path::PathBuf>,
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
    /// Set a new size for deployments or replica sets.
    Scale(ScaleArgs),
    /// Manage the rollout of deployments: status, history, undo, pause, resume, restart.
    #[command(subcommand)]
    Rollout(RolloutCommand),
    /// Show the nodes' eBPF maps: Service load balancer, pod fast path, NodePort conntrack
    /// (from their agents).
    #[command(subcommand)]
    Bpf(BpfCommand),
    /// List the images the nodes have pulled, with the pods using them (like `crictl
    /// images`, for every node).
    Images(ImagesArgs),
    /// Show the flows the nodes' eBPF policy programs saw: flows pods started or accepted
    /// and packets NetworkPolicy dropped, with pods, Services and policies named (like
    /// `hubble observe`). `-n` filters by namespace (either end).
    Observe(ObserveArgs),
    /// Bootstrap tokens with which new nodes join (`skiff-node join`), like `kubeadm token`.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Snapshots of the cluster's store, like `k3s etcd-snapshot`.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Saves a consistent snapshot of the store, taken by the API server while the cluster
    /// runs (needs `cluster-admin`: it holds every Secret, encrypted as at rest), to a new
    /// file. Restore an embedded-store snapshot with `skiff-apiserver restore FILE
    /// --data-dir DIR` (the API server stopped), an etcd one with `etcdutl snapshot restore`.
    Save {
        /// The file to write (it must not exist).
        file: std::path::PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Creates a bootstrap token and prints it.
    Create {
        /// How long the token is valid: `30m`, `24h`, `7d`; `0` for ever.
        #[arg(long, default_value = "24h", value_parser = ttl)]
        ttl: Ttl,
        /// A note kept with the token.
        #[arg(long, default_value = "")]
        description: String,
        /// Print the whole `skiff-node join` command (server, token, CA hash).
        #[arg(long)]
        print_join_command: bool,
    },
    /// Deletes a bootstrap token (by its id or the whole token): nodes can no longer join
    /// with it.
    Delete {
        /// The token id (the 6 characters before the dot) or the token.
        token: String,
    },
}

/// A token's lifetime; `None`: no expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ttl(Option<std::time::Duration>);

/// `--ttl`: a number with s, m, h or d; 0 means no expiry.
fn ttl(s: &str) -> Result<Ttl, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30m, 24h or 7d"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use s, m, h or d)")),
    };
    Ok(Ttl((secs > 0).then(|| std::time::Duration::from_secs(secs))))
}

#[derive(Debug, Args)]
struct ImagesArgs {
    /// Only this node (default: every node).
    #[arg(long, value_name = "NODE")]
    node: Option<String>,
    /// Output format (default: a table).
    #[arg(short = 'o', long, value_enum)]
    output: Option<top::JsonOutput>,
}

#[derive(Debug, Subcommand)]
enum BpfCommand {
    /// Frontends (clusterIP:port/protocol) with their backends and connection counters, like
    /// `cilium bpf lb list`.
    #[command(visible_alias = "lb")]
    Services(BpfArgs),
    /// Every backend with its frontend and counters.
    Backends(BpfArgs),
    /// The pod fast path's local pods (address, host veth, MACs) with their traffic, and its
    /// packet counters.
    Pods(BpfArgs),
    /// The NodePort conntrack entries (both directions of every flow).
    #[command(visible_alias = "ct")]
    Conntrack(BpfArgs),
}

#[derive(Debug, Args)]
struct ObserveArgs {
    /// Keep printing new flows as they happen.
    #[arg(short = 'f', long)]
    follow: bool,
    /// Only flows from or to this pod (`NAME` in any namespace, or `NAMESPACE/NAME`).
    #[arg(long)]
    pod: Option<String>,
    /// Only flows sent to this Service's ClusterIP (`NAMESPACE/NAME`).
    #[arg(long)]
    service: Option<String>,
    /// Only allowed or only denied flows.
    #[arg(long, value_parser = ["allowed", "denied"])]
    verdict: Option<String>,
    /// Only this node (default: every node).
    #[arg(long, value_name = "NODE")]
    node: Option<String>,
    /// Output format (default: a table; json: one JSON object per line).
    #[arg(short = 'o', long, value_enum)]
    output: Option<top::JsonOutput>,
}

#[derive(Debug, Args)]
struct BpfArgs {
    /// Only this node (default: every node).
    #[arg(long, value_name = "NODE")]
    node: Option<String>,
    /// Output format (default: a table).
    #[arg(short = 'o', long, value_enum)]
    output: Option<top::JsonOutput>,
}

#[derive(Debug, Args)]
struct ScaleArgs {
    /// TYPE NAME... or TYPE/NAME... (deployments, replicasets).
    #[arg(required = true, value_name = "RESOURCE")]
    resources: Vec<String>,
    /// The new number of replicas.
    #[arg(long, value_name = "N", required = true, allow_negative_numbers = true)]
    replicas: i32,
    /// Scale only if the object has this many replicas now.
    #[arg(long, value_name = "M", allow_negative_numbers = true)]
    current_replicas: Option<i32>,
}

/// The deployment a rollout command is about.
#[derive(Debug, Args)]
struct RolloutTarget {
    /// deploy/NAME, or deployment NAME.
    #[arg(required = true, value_name = "RESOURCE")]
    resources: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum RolloutCommand {
    /// Follow a deployment's rollout until it is done.
    Status {
        #[command(flatten)]
        target: RolloutTarget,
        /// Give up after this long (e.g. 30s, 5m; 0: wait forever).
        #[arg(long, value_name = "DURATION", default_value = "0", value_parser = rollout::parse_duration)]
        timeout: std::time::Duration,
        /// Keep watching until the rollout is done; false: print the status once.
        #[arg(short = 'w', long, value_name = "BOOL", default_value_t = true,
              num_args = 0..=1, require_equals = true, default_missing_value = "true",
              action = clap::ArgAction::Set)]
        watch: bool,
    },
    /// List a deployment's revisions, or show one revision's pod template.
    History {
        #[command(flatten)]
        target: RolloutTarget,
        /// Show the pod template of this revision.
        #[arg(long, value_name = "N", default_value_t = 0)]
        revision: i64,
    },
    /// Roll a deployment back to its previous revision (or --to-revision).
    Undo {
        #[command(flatten)]
        target: RolloutTarget,
        /// The revision to go back to (0: the previous one).
        #[arg(long, value_name = "N", default_value_t = 0)]
        to_revision: i64,
    },
    /// Pause a deployment: template changes are not rolled out until it is resumed.
    Pause(RolloutTarget),
    /// Resume a paused deployment.
    Resume(RolloutTarget),
    /// Replace every pod of a deployment through a rollout.
    Restart(RolloutTarget),
}

impl RolloutCommand {
    fn name(&self) -> &'static str {
        match self {
            RolloutCommand::Status { .. } => "status",
            RolloutCommand::History { .. } => "history",
            RolloutCommand::Undo { .. } => "undo",
            RolloutCommand::Pause(_) => "pause",
            RolloutCommand::Resume(_) => "resume",
            RolloutCommand::Restart(_) => "restart",
        }
    }

    fn target(&self) -> &RolloutTarget {
        match self {
            RolloutCommand::Status { target, .. }
            | RolloutCommand::History { target, .. }
            | RolloutCommand::Undo { target, .. }
            | RolloutCommand::Pause(target)
            | RolloutCommand::Resume(target)
            | RolloutCommand::Restart(target) => target,
        }
    }

    /// The deployments named, checked.
    fn names(&self) -> Result<Vec<String>> {
        rollout::deployment_names(self.name(), &self.target().resources)
    }
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
    /// The container's previous run (before its last restart).
    #[arg(short = 'p', long)]
    previous: bool,
}

#[derive(Debug, Subcommand)]
enum TopCommand {
    /// CPU (millicores, sampled over 1 s) and cumulative network bytes of pods.
    #[command(visible_alias = "pod", alias = "po")]
    Pods {
        /// Output format (default: a table).
        #[arg(short = 'o', long, value_enum)]
        output: Option<top::JsonOutput>,
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
    output: Option<get::GetOutput>,
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
    let config = ClientConfig::load(cli.server.as_deref(), cli.kubeconfig.as_deref())?;
    tracing::debug!(server = %config.server, source = ?config.source, "API server");
    Ok(Client::connect_with(&config).await?)
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
        Command::Scale(s) => scale::check(&scale_opts(s, "")?)?,
        Command::Rollout(r) => {
            let names = r.names()?;
            let single = matches!(
                r,
                RolloutCommand::Status { .. } | RolloutCommand::History { .. }
            );
            if single && names.len() > 1 {
                anyhow::bail!(
                    "rollout {} takes one deployment, got {}",
                    r.name(),
                    names.len()
                );
            }
            if let RolloutCommand::History { revision, .. }
            | RolloutCommand::Undo {
                to_revision: revision,
                ..
            } = r
                && *revision < 0
            {
                anyhow::bail!("the revision must be a positive number (got {revision})");
            }
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
                previous: l.previous,
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
        Command::Scale(s) => scale::run(&client, &scale_opts(&s, &namespace)?).await,
        Command::Images(a) => images::run(&client, a.node.as_deref(), a.output).await,
        Command::Observe(a) => {
            let opts = observe::ObserveOpts {
                query: skiff_client::node_api::FlowQuery {
                    follow: a.follow,
                    // Only an explicit -n filters (no default namespace here).
                    namespace: cli.namespace.clone(),
                    pod: a.pod,
                    service: a.service,
                    verdict: a.verdict,
                },
                node: a.node,
                output: a.output,
            };
            observe::run(&client, &opts).await
        }
        Command::Token(TokenCommand::Create {
            ttl,
            description,
            print_join_command,
        }) => {
            let config = ClientConfig::load(cli.server.as_deref(), cli.kubeconfig.as_deref())?;
            token::create(&client, &config, ttl.0, &description, print_join_command)
                .await
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Token(TokenCommand::Delete { token }) => token::delete(&client, &token)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Snapshot(SnapshotCommand::Save { file }) => {
            let (format, revision) = client
                .snapshot(&file)
                .await
                .with_context(|| format!("saving a snapshot to {}", file.display()))?;
            let bytes = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
            let at = revision
                .map(|r| format!(" at revision {r}"))
                .unwrap_or_default();
            println!(
                "saved a {format} snapshot{at} to {} ({bytes} bytes)",
                file.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Bpf(b) => {
            let (what, args) = match b {
                BpfCommand::Services(a) => (bpf::What::Services, a),
                BpfCommand::Backends(a) => (bpf::What::Backends, a),
                BpfCommand::Pods(a) => (bpf::What::Pods, a),
                BpfCommand::Conntrack(a) => (bpf::What::Conntrack, a),
            };
            let opts = bpf::BpfOpts {
                what,
                node: args.node,
                output: args.output,
            };
            bpf::run(&client, &opts).await
        }
        Command::Rollout(r) => {
            let names = r.names()?;
            match r {
                RolloutCommand::Status { timeout, watch, .. } => {
                    rollout::status(&client, &namespace, &names[0], Some(timeout), watch).await
                }
                RolloutCommand::History { revision, .. } => {
                    rollout::history(&client, &namespace, &names[0], revision).await
                }
                RolloutCommand::Undo { to_revision, .. } => {
                    rollout::change(
                        &client,
                        &namespace,
                        &names,
                        rollout::Op::Undo { to_revision },
                    )
                    .await
                }
                RolloutCommand::Pause(_) => {
                    let op = rollout::Op::Edit(rollout::Edit::Pause);
                    rollout::change(&client, &namespace, &names, op).await
                }
                RolloutCommand::Resume(_) => {
                    let op = rollout::Op::Edit(rollout::Edit::Resume);
                    rollout::change(&client, &namespace, &names, op).await
                }
                RolloutCommand::Restart(_) => {
                    let op = rollout::Op::Edit(rollout::Edit::Restart);
                    rollout::change(&client, &namespace, &names, op).await
                }
            }
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

fn scale_opts(s: &ScaleArgs, namespace: &str) -> Result<scale::ScaleOpts> {
    Ok(scale::ScaleOpts {
        targets: resources::parse_targets(&s.resources)?,
        replicas: s.replicas,
        current_replicas: s.current_replicas,
        namespace: namespace.to_string(),
    })
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
        let c = Cli::try_parse_from([
            "skiff",
            "scale",
            "deploy/web",
            "--replicas=-1",
            "--current-replicas",
            "2",
        ])
        .unwrap();
        let Command::Scale(s) = c.command else {
            panic!("not scale");
        };
        assert_eq!((s.replicas, s.current_replicas), (-1, Some(2)));
        assert!(Cli::try_parse_from(["skiff", "scale", "deploy/web"]).is_err());
        let status = |args: &[&str]| {
            let c = Cli::try_parse_from(args).unwrap();
            match c.command {
                Command::Rollout(RolloutCommand::Status {
                    target,
                    timeout,
                    watch,
                }) => (target.resources, timeout, watch),
                other => panic!("not rollout status: {other:?}"),
            }
        };
        assert_eq!(
            status(&["skiff", "rollout", "status", "-w", "deploy/web"]),
            (
                vec!["deploy/web".to_string()],
                std::time::Duration::ZERO,
                true
            )
        );
        assert_eq!(
            status(&[
                "skiff",
                "rollout",
                "status",
                "deploy/web",
                "--watch=false",
                "--timeout=1m"
            ]),
            (
                vec!["deploy/web".to_string()],
                std::time::Duration::from_secs(60),
                false
            )
        );
        let c = Cli::try_parse_from([
            "skiff",
            "rollout",
            "undo",
            "deployment",
            "web",
            "--to-revision=2",
        ])
        .unwrap();
        assert!(matches!(
            c.command,
            Command::Rollout(RolloutCommand::Undo { to_revision: 2, .. })
        ));
        let c = Cli::try_parse_from(["skiff", "top", "pods", "-A", "-o", "json"]).unwrap();
        assert!(c.all_namespaces);
        assert!(matches!(
            c.command,
            Command::Top(TopCommand::Pods {
                output: Some(top::JsonOutput::Json)
            })
        ));
    }

    #[test]
    fn token_lifetimes() {
        let ttl_of = |args: &[&str]| {
            let mut all = vec!["skiff", "token", "create"];
            all.extend(args);
            match Cli::try_parse_from(all).map(|c| c.command) {
                Ok(Command::Token(TokenCommand::Create { ttl, .. })) => Ok(ttl.0),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(ttl_of(&[]), Ok(Some(std::time::Duration::from_secs(86400))));
        assert_eq!(
            ttl_of(&["--ttl", "30m"]),
            Ok(Some(std::time::Duration::from_secs(1800)))
        );
        assert_eq!(ttl_of(&["--ttl", "0"]), Ok(None));
        assert!(
            ttl_of(&["--ttl", "3w"])
                .unwrap_err()
                .contains("unknown unit")
        );
    }
}
