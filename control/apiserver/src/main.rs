//! `skiff-apiserver`: serves the Skiff API over gRPC from an embedded (redb) store or etcd.
//!
//! ```text
//! skiff-apiserver --listen 127.0.0.1:7443 --store embedded --data-dir .skiff/data
//! skiff-apiserver --store etcd --etcd-endpoints http://127.0.0.1:2379
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use skiff_apiserver::{ApiServerOptions, DEFAULT_WATCH_CACHE_CAPACITY};
use skiff_store::{EmbeddedOptions, EmbeddedStore, EtcdStore, Store};
use tracing::info;
use tracing_subscriber::EnvFilter;

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
#[command(name = "skiff-apiserver", version, about)]
struct Args {
    /// Address to serve gRPC on.
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
    /// Events kept per resource type for watches.
    #[arg(long, default_value_t = DEFAULT_WATCH_CACHE_CAPACITY)]
    watch_cache_capacity: usize,
}

async fn open_store(args: &Args) -> Result<Arc<dyn Store>> {
    match args.store {
        StoreKind::Embedded => {
            std::fs::create_dir_all(&args.data_dir).with_context(|| {
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
            let store = EtcdStore::connect(&args.etcd_endpoints)
                .await
                .with_context(|| {
                    format!(
                        "cannot connect to etcd at {}",
                        args.etcd_endpoints.join(",")
                    )
                })?;
            info!(endpoints = %args.etcd_endpoints.join(","), "using etcd");
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
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let store = open_store(&args).await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let opts = ApiServerOptions {
        watch_cache_capacity: args.watch_cache_capacity,
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
