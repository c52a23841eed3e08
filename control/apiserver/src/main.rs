//! `skiff-apiserver`: serves the Skiff API (gRPC and Kubernetes REST on one TLS port) from an
//! embedded (redb) store or etcd.
//!
//! ```text
//! skiff-apiserver --listen 127.0.0.1:7443 --store embedded --data-dir .skiff/data
//! skiff-apiserver --store etcd --etcd-endpoints http://127.0.0.1:2379 --pki-dir /etc/skiff/pki
//! skiff-apiserver --store etcd --etcd-endpoints https://127.0.0.1:2379 --etcd-cafile etcd/ca.crt \
//!     --etcd-certfile etcd/apiserver-etcd-client.crt --etcd-keyfile etcd/apiserver-etcd-client.key
//! skiff-apiserver etcd-certs --dir .skiff/pki/etcd --member etcd-1 --member etcd-2
//! skiff-apiserver kubeconfig --pki-dir .skiff/pki --user alice --group dev --out alice.kubeconfig
//! ```
//!
//! On first start the PKI directory is filled (CA, serving certificate, `admin.kubeconfig`
//! and one kubeconfig per control-plane component); later starts renew what is due.
//!
//! Secrets are encrypted at rest: with `--encryption-provider-config FILE` as it says, else
//! with a key generated once in the PKI directory (`encryption-config.yaml`, mode 0600; see
//! `skiff_apiserver::encryption::ensure_generated`). The PKI and data directories are mode
//! 0700 and every key, store and snapshot file in them 0600.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use skiff_apiserver::kubernetes_service::KubernetesService;
use skiff_apiserver::{ApiServerOptions, DEFAULT_WATCH_CACHE_CAPACITY, Security, SecurityOptions};
use skiff_pki::bootstrap::{self, ClusterPki};
use skiff_store::{EmbeddedOptions, EmbeddedStore, EtcdStore, Store};
use tracing::info;

/// The name of the redb file inside `--data-dir`.
const DB_FILE: &str = "skiff.redb";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    /// A redb file in --data-dir.
    Embedded,
    /// An etcd cluster at --etcd-endpoints.
    Etcd,
}

/// Skiff's API server.
#[derive(Debug, Parser)]
#[command(
    name = "skiff-apiserver",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address to serve the API on (TLS; gRPC and the Kubernetes REST API).
    #[arg(long, default_value = "127.0.0.1:7443", env = "SKIFF_APISERVER_LISTEN")]
    listen: SocketAddr,
    /// Storage backend.
    #[arg(long, value_enum, default_value = "embedded")]
    store: StoreKind,
    /// Directory of the embedded store (the redb file is created inside it).
    #[arg(long, default_value = ".skiff/data")]
    data_dir: PathBuf,
    /// etcd client URLs, comma separated (with --store etcd).
    #[arg(long, value_delimiter = ',')]
    etcd_endpoints: Vec<String>,
    /// The CA that signed the etcd members' certificates (TLS to etcd: with
    /// --etcd-certfile and --etcd-keyfile, and https:// endpoints).
    #[arg(long, value_name = "FILE", requires_all = ["etcd_certfile", "etcd_keyfile"])]
    etcd_cafile: Option<PathBuf>,
    /// The client certificate presented to etcd.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_cafile", "etcd_keyfile"])]
    etcd_certfile: Option<PathBuf>,
    /// The client certificate's key.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_cafile", "etcd_certfile"])]
    etcd_keyfile: Option<PathBuf>,
    /// Events kept per resource type for watches.
    #[arg(long, default_value_t = DEFAULT_WATCH_CACHE_CAPACITY)]
    watch_cache_capacity: usize,
    /// The cluster's PKI directory: the CA, the serving certificate and the kubeconfigs are
    /// created there on first start and renewed when due.
    #[arg(long, default_value = ".skiff/pki")]
    pki_dir: PathBuf,
    /// Extra names or addresses the serving certificate is valid for (repeatable or comma
    /// separated), besides localhost, the listen address, the host name and the
    /// `kubernetes.default.svc` names.
    #[arg(long = "tls-san", value_delimiter = ',')]
    tls_sans: Vec<String>,
    /// The URL written into the generated kubeconfigs (default: https://<listen address>,
    /// 127.0.0.1 for an unspecified one).
    #[arg(long)]
    advertise_url: Option<String>,
    /// kube-apiserver's static token file: CSV lines `token,user,uid,"group1,group2"`.
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// Write an audit event (JSON lines, audit.k8s.io/v1 at the Metadata level) for every
    /// request to this file.
    #[arg(long)]
    audit_log_path: Option<PathBuf>,
    /// Rotate the audit log before it exceeds this many megabytes.
    #[arg(long, default_value_t = 100)]
    audit_log_maxsize: u64,
    /// Rotated audit logs kept (PATH.1 is the newest).
    #[arg(long, default_value_t = 10)]
    audit_log_maxbackup: usize,
    /// Seconds between checks for certificates due for renewal while running.
    #[arg(long, default_value_t = 3600)]
    cert_check_seconds: u64,
    /// The Services' clusterIP range (the controller manager's flag of the same name): its
    /// first address is the `kubernetes` Service's clusterIP, and a SAN of the serving
    /// certificate.
    #[arg(long, default_value = "10.96.0.0/16", value_name = "CIDR")]
    service_cluster_ip_range: skiff_cidr::Ipv4Cidr,
    /// The pods' addresses (the controller manager's flag of the same name): no
    /// LoadBalancerIPPool may overlap them.
    #[arg(long, default_value = "10.244.0.0/16", value_name = "CIDR")]
    cluster_cidr: skiff_cidr::Ipv4Cidr,
    /// The Node address types dialled to reach a node's agent (logs, exec, port-forward,
    /// metrics), in order; the first whose value is an IP address is used. Its serving
    /// certificate is verified against the cluster CA.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "InternalIP,ExternalIP,Hostname",
        value_parser = address_type
    )]
    kubelet_preferred_address_types: Vec<String>,
    /// Non-mutating requests in flight at once; more wait in their user's queue (users take
    /// turns; up to 50 waiting per user, up to 15 s), then are answered 429 (0: no limit).
    /// `system:masters` is exempt; watches, exec, attach and port-forward do not count.
    #[arg(long, default_value_t = 400)]
    max_requests_inflight: usize,
    /// Mutating requests in flight at once; more wait as non-mutating ones do (0: no limit).
    #[arg(long, default_value_t = 200)]
    max_mutating_requests_inflight: usize,
    /// Watches one user may have open at once; more are answered 429 (0: no limit).
    #[arg(long, default_value_t = 500)]
    max_watches_per_user: usize,
    /// Seconds a client may take to send a request's headers before its connection is
    /// closed (slowloris).
    #[arg(long, default_value_t = 32)]
    request_header_timeout_seconds: u64,
    /// The address the `kubernetes` Service's Endpoints give for this server (default: the
    /// listen address; 127.0.0.1 for an unspecified one).
    #[arg(long, value_name = "IP")]
    advertise_address: Option<std::net::IpAddr>,
    /// Encrypt resources at rest as this EncryptionConfiguration
    /// (apiserver.config.k8s.io/v1; providers aesgcm and identity) says. Without it, Secrets
    /// are encrypted with a key generated once in --pki-dir (encryption-config.yaml, 0600).
    #[arg(long, value_name = "FILE")]
    encryption_provider_config: Option<PathBuf>,
    /// The client certificate the server presents to aggregated API servers (the front
    /// proxy's; `cargo xtask up` and the harness pass `<pki-dir>/front-proxy-client.crt`).
    /// Without it, aggregated APIs are proxied with no client certificate.
    #[arg(long, value_name = "FILE", requires = "proxy_client_key_file")]
    proxy_client_cert_file: Option<PathBuf>,
    /// The key of --proxy-client-cert-file.
    #[arg(long, value_name = "FILE", requires = "proxy_client_cert_file")]
    proxy_client_key_file: Option<PathBuf>,
    /// The CA that signed --proxy-client-cert-file, published to extension API servers in
    /// the ConfigMap kube-system/extension-apiserver-authentication.
    #[arg(long, value_name = "FILE")]
    requestheader_client_ca_file: Option<PathBuf>,
    /// The common names extension API servers accept from the front proxy (comma
    /// separated), published with the CA.
    #[arg(long, value_delimiter = ',', default_value = "front-proxy-client")]
    requestheader_allowed_names: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Writes a kubeconfig for a user with a client certificate the cluster CA signs (like
    /// `kubeadm kubeconfig user`).
    Kubeconfig {
        /// The PKI directory holding ca.crt and ca.key.
        #[arg(long, default_value = ".skiff/pki")]
        pki_dir: PathBuf,
        /// The user name (the certificate's CN).
        #[arg(long)]
        user: String,
        /// A group (the certificate's O; repeatable).
        #[arg(long = "group")]
        groups: Vec<String>,
        /// The API server URL.
        #[arg(long, default_value = "https://127.0.0.1:7443")]
        server: String,
        /// Where to write the kubeconfig (mode 0600).
        #[arg(long)]
        out: PathBuf,
    },
    /// Makes (once) or completes an etcd PKI of its own: a CA, a certificate per member for
    /// clients and peers (valid for the --san names), and the API server's client
    /// certificate (`apiserver-etcd-client.crt`/`.key`, for --etcd-certfile/--etcd-keyfile),
    /// keys 0600 in a 0700 directory (kubeadm's `pki/etcd`).
    EtcdCerts {
        /// The directory (e.g. `<pki-dir>/etcd`).
        #[arg(long)]
        dir: PathBuf,
        /// A member's name (repeatable): `<name>.crt` and `<name>.key`.
        #[arg(long = "member", required = true)]
        members: Vec<String>,
        /// Names and addresses the members' certificates are valid for (comma separated).
        #[arg(
            long = "san",
            value_delimiter = ',',
            default_value = "127.0.0.1,localhost"
        )]
        sans: Vec<String>,
    },
    /// Restores an embedded-store snapshot (from `skiff snapshot save`) as the store of
    /// --data-dir, with the API server stopped. An etcd snapshot is restored with etcd's own
    /// tools (`etcdutl snapshot restore`, or `etcdctl snapshot restore` before etcd 3.5).
    Restore {
        /// The snapshot file.
        snapshot: PathBuf,
        /// Directory of the embedded store to restore into.
        #[arg(long, default_value = ".skiff/data")]
        data_dir: PathBuf,
        /// Move an existing store file aside (to skiff.redb.before-restore-<unix time>)
        /// instead of refusing.
        #[arg(long)]
        force: bool,
    },
}

/// `skiff-apiserver restore`: the snapshot checked and renamed into place; an existing store
/// is kept aside with `--force`, else refused.
fn restore(snapshot: &std::path::Path, data_dir: &std::path::Path, force: bool) -> Result<()> {
    skiff_pki::files::private_dir(data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let dest = data_dir.join(DB_FILE);
    if dest.exists() {
        if !force {
            bail!(
                "{} exists: stop the API server and give --force to keep it aside and restore",
                dest.display()
            );
        }
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let aside = data_dir.join(format!("{DB_FILE}.before-restore-{secs}"));
        std::fs::rename(&dest, &aside)
            .with_context(|| format!("cannot move {} aside", dest.display()))?;
        println!("moved the old store to {}", aside.display());
    }
    let restored = skiff_store::restore_snapshot(snapshot, &dest).with_context(|| {
        format!(
            "cannot restore {} (an etcd snapshot is restored with `etcdutl snapshot restore`)",
            snapshot.display()
        )
    })?;
    println!(
        "restored {} at revision {} into {} ({} bytes); start the API server, then restart the \
         other components so their caches relist",
        snapshot.display(),
        restored
            .revision
            .map(|r| r.to_string())
            .unwrap_or_else(|| "?".into()),
        dest.display(),
        restored.bytes
    );
    Ok(())
}

/// The URL clients reach a server listening on `listen` at.
fn url_of(listen: SocketAddr) -> String {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    format!("https://{addr}")
}

/// Creates or renews the PKI and builds the TLS configuration and authenticators.
/// `--kubelet-preferred-address-types`: a Node address type Kubernetes defines.
fn address_type(s: &str) -> Result<String, String> {
    const TYPES: [&str; 5] = [
        "Hostname",
        "InternalDNS",
        "InternalIP",
        "ExternalDNS",
        "ExternalIP",
    ];
    if TYPES.contains(&s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "unsupported address type {s:?}: one of {}",
            TYPES.join(", ")
        ))
    }
}

fn security(args: &Args) -> Result<Security> {
    let mut sans = bootstrap::default_sans();
    if !args.listen.ip().is_unspecified() {
        sans.push(args.listen.ip().to_string());
    }
    // Pods reach the server at the `kubernetes` Service's clusterIP and name.
    let kubernetes = kubernetes_service(args)?;
    for s in [
        kubernetes.cluster_ip.to_string(),
        kubernetes.advertise.to_string(),
    ]
    .iter()
    .chain(&args.tls_sans)
    {
        if !s.is_empty() && !sans.contains(s) {
            sans.push(s.clone());
        }
    }
    let server_url = args
        .advertise_url
        .clone()
        .unwrap_or_else(|| url_of(args.listen));
    let audit = args
        .audit_log_path
        .as_ref()
        .map(|path| skiff_apiserver::audit::AuditOptions {
            path: path.clone(),
            max_bytes: args.audit_log_maxsize.max(1) * 1024 * 1024,
            max_backups: args.audit_log_maxbackup,
        });
    let mut security = Security::bootstrap(&SecurityOptions {
        pki_dir: args.pki_dir.clone(),
        server_url,
        sans,
        token_auth_file: args.token_auth_file.clone(),
        audit,
        renew_every: Some(std::time::Duration::from_secs(
            args.cert_check_seconds.max(1),
        )),
    })?;
    if let Some(agents) = &mut security.agent_client {
        agents.preferred_address_types = Arc::from(args.kubelet_preferred_address_types.clone());
    }
    security.front_proxy = front_proxy(args)?;
    Ok(security)
}

/// The front proxy's client certificate and CA from the flags, if given.
fn front_proxy(args: &Args) -> Result<Option<skiff_apiserver::aggregator::FrontProxy>> {
    let (Some(cert), Some(key)) = (&args.proxy_client_cert_file, &args.proxy_client_key_file)
    else {
        return Ok(None);
    };
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
    };
    let client = skiff_pki::Identity {
        cert_pem: read(cert)?,
        key_pem: read(key)?,
    };
    let ca = args
        .requestheader_client_ca_file
        .as_ref()
        .context("--proxy-client-cert-file needs --requestheader-client-ca-file (the CA that signed it, which extension API servers are told to trust)")?;
    Ok(Some(skiff_apiserver::aggregator::FrontProxy {
        client,
        client_ca_pem: read(ca)?,
        allowed_names: args.requestheader_allowed_names.clone(),
        files: Some((cert.clone(), key.clone())),
    }))
}

/// The `kubernetes` Service the flags describe.
fn kubernetes_service(args: &Args) -> Result<KubernetesService> {
    let range = args.service_cluster_ip_range;
    let cluster_ip = range.host(0).with_context(|| {
        format!("--service-cluster-ip-range {range}: the range has no host address")
    })?;
    let advertise = args.advertise_address.unwrap_or_else(|| {
        let ip = args.listen.ip();
        if ip.is_unspecified() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            ip
        }
    });
    if advertise.is_unspecified() {
        bail!("--advertise-address {advertise}: must be an address clients can reach");
    }
    Ok(KubernetesService {
        cluster_ip,
        advertise,
        port: args.listen.port(),
    })
}

fn write_user_kubeconfig(
    pki_dir: &std::path::Path,
    user: &str,
    groups: &[String],
    server: &str,
    out: &std::path::Path,
) -> Result<()> {
    let pki = ClusterPki::new(pki_dir);
    let ca = pki
        .load_ca()
        .with_context(|| format!("cannot load the CA from {}", pki_dir.display()))?;
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    pki.write_kubeconfig(&ca, out, server, user, &groups)
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("wrote {} for user {user}", out.display());
    Ok(())
}

async fn open_store(args: &Args) -> Result<Arc<dyn Store>> {
    match args.store {
        StoreKind::Embedded => {
            skiff_pki::files::private_dir(&args.data_dir).with_context(|| {
                format!(
                    "cannot create the data directory {}",
                    args.data_dir.display()
                )
            })?;
            let path = args.data_dir.join(DB_FILE);
            let store = EmbeddedStore::open(&path, EmbeddedOptions::default())
                .with_context(|| format!("cannot open the embedded store {}", path.display()))?;
            info!(path = %path.display(), "using the embedded store");
            Ok(Arc::new(store))
        }
        StoreKind::Etcd => {
            if args.etcd_endpoints.is_empty() {
                bail!("--store etcd needs --etcd-endpoints URL[,URL]");
            }
            let tls = match (&args.etcd_cafile, &args.etcd_certfile, &args.etcd_keyfile) {
                (Some(ca), Some(cert), Some(key)) => Some(
                    skiff_store::EtcdTls::read(ca, cert, key)
                        .context("--etcd-cafile, --etcd-certfile, --etcd-keyfile")?,
                ),
                _ => None,
            };
            let store = EtcdStore::connect_with(&args.etcd_endpoints, tls.as_ref())
                .await
                .with_context(|| {
                    format!(
                        "cannot connect to etcd at {}",
                        args.etcd_endpoints.join(",")
                    )
                })?;
            info!(endpoints = %args.etcd_endpoints.join(","), tls = tls.is_some(), "using etcd");
            Ok(Arc::new(store))
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn terminated() -> Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
        tokio::select! {
            _ = term.recv() => info!("SIGTERM received"),
            r = tokio::signal::ctrl_c() => { r.context("cannot watch Ctrl-C")?; info!("interrupt received") }
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c()
            .await
            .context("cannot watch Ctrl-C")?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    skiff_client::init_logging();
    let args = Args::parse();
    if let Some(Command::Kubeconfig {
        pki_dir,
        user,
        groups,
        server,
        out,
    }) = &args.command
    {
        return write_user_kubeconfig(pki_dir, user, groups, server, out);
    }
    if let Some(Command::EtcdCerts { dir, members, sans }) = &args.command {
        let members: Vec<&str> = members.iter().map(String::as_str).collect();
        let written = skiff_pki::etcd::EtcdPki::new(dir)
            .ensure(&members, sans)
            .with_context(|| format!("cannot make the etcd PKI in {}", dir.display()))?;
        println!(
            "etcd PKI in {}: {} files written",
            dir.display(),
            written.len()
        );
        return Ok(());
    }
    if let Some(Command::Restore {
        snapshot,
        data_dir,
        force,
    }) = &args.command
    {
        return restore(snapshot, data_dir, *force);
    }
    // The store first: a start that fails on its arguments writes no PKI.
    let mut store = open_store(&args).await?;
    let (config_path, what) = match &args.encryption_provider_config {
        Some(path) => (path.clone(), "--encryption-provider-config"),
        None => (
            skiff_apiserver::encryption::ensure_generated(&args.pki_dir)
                .context("the generated encryption configuration")?,
            "the generated encryption configuration",
        ),
    };
    let config = skiff_apiserver::encryption::EncryptionConfig::read(&config_path).context(what)?;
    tracing::info!(?config, path = %config_path.display(), "encrypting at rest");
    store = Arc::new(skiff_apiserver::encryption::EncryptingStore::new(
        store, config,
    ));
    let security = security(&args)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let opts = ApiServerOptions {
        watch_cache_capacity: args.watch_cache_capacity,
        security: Some(security),
        kubernetes_service: Some(kubernetes_service(&args)?),
        service_cluster_ip_range: args.service_cluster_ip_range,
        cluster_cidr: Some(args.cluster_cidr),
        limits: skiff_apiserver::limits::Limits {
            max_requests_inflight: args.max_requests_inflight,
            max_mutating_requests_inflight: args.max_mutating_requests_inflight,
            max_watches_per_user: args.max_watches_per_user,
            ..skiff_apiserver::limits::Limits::default()
        },
        header_read_timeout: std::time::Duration::from_secs(args.request_header_timeout_seconds),
        // Snapshots are staged in a private directory of this server's: the store's data
        // directory, or the PKI directory with etcd.
        snapshot_dir: Some(match args.store {
            StoreKind::Embedded => args.data_dir.clone(),
            StoreKind::Etcd => args.pki_dir.clone(),
        }),
        ..ApiServerOptions::default()
    };
    let mut server = skiff_apiserver::spawn(store, listener, opts)
        .await
        .context("cannot start the API server")?;
    tokio::select! {
        r = terminated() => {
            r?;
            info!("shutting down");
            server.shutdown().await;
            Ok(())
        }
        r = server.wait() => {
            r.context("the API server stopped")?;
            bail!("the API server stopped unexpectedly")
        }
    }
}
