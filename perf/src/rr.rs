//! A TCP request/response ("RR") benchmark, netperf `TCP_RR`-style: one connection, one
//! 1-byte request, one 1-byte response, the next request only after the response; the
//! transaction rate and the per-transaction round-trip times are the result.
//!
//! Both ends run as separate processes of the bench's own binary (`skiff-bench __rr server|
//! client …`, see [`helper_main`]), so the suites can start them inside other network
//! namespaces (a pod's, a baseline's) without the bench process ever changing namespace.
//! The client prints one JSON [`RrResult`] line on stdout.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};

/// The first argument of `skiff-bench` that selects the helper instead of the suites.
pub const HELPER_ARG: &str = "__rr";

/// Longest a client waits for one response before failing.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Most transactions one client run records (a bound on its memory).
const MAX_TRANSACTIONS: usize = 20_000_000;
/// Most connections one server accepts in its life.
const MAX_CONNECTIONS: usize = 100_000;

/// `skiff-bench __rr …`: the processes the pod-net suite starts in network namespaces.
#[derive(Debug, Parser)]
#[command(
    name = "skiff-bench __rr",
    about = "TCP request/response helper (internal)"
)]
pub struct HelperArgs {
    #[command(subcommand)]
    pub role: RrRole,
}

#[derive(Debug, Subcommand)]
pub enum RrRole {
    /// Answers every byte received with one byte, on every connection, until it has lived
    /// `--lifetime-secs`.
    Server {
        #[arg(long, value_name = "ADDR:PORT")]
        listen: SocketAddr,
        #[arg(long, value_name = "S", default_value_t = 3600)]
        lifetime_secs: u64,
    },
    /// Runs transactions for `--seconds` on one connection, prints an [`RrResult`] as JSON.
    Client {
        #[arg(long, value_name = "ADDR:PORT")]
        connect: SocketAddr,
        #[arg(long, value_name = "S")]
        seconds: f64,
        /// Round-trip times kept in the output (every k-th transaction, evenly spread).
        #[arg(long, value_name = "N", default_value_t = 1000)]
        max_samples: usize,
        /// How long to retry connecting (the server may still be starting).
        #[arg(long, value_name = "S", default_value_t = 30.0)]
        connect_timeout_secs: f64,
    },
}

/// What one client run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RrResult {
    pub transactions: usize,
    /// First request → last response.
    pub seconds: f64,
    /// Exact order statistics over every transaction, in nanoseconds (nearest rank).
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub mean_ns: f64,
    /// Every `stride`-th round-trip time (from the first), in nanoseconds, in order.
    pub samples_ns: Vec<u64>,
    pub stride: usize,
}

impl RrResult {
    /// The result of `rtts` (nanoseconds, in transaction order) over `seconds`; `None` if
    /// there was no transaction.
    pub fn of(rtts: &[u64], seconds: f64, max_samples: usize) -> Option<RrResult> {
        if rtts.is_empty() {
            return None;
        }
        let mut sorted = rtts.to_vec();
        sorted.sort_unstable();
        let rank = |p: f64| {
            let r = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
            sorted[r.clamp(1, sorted.len()) - 1]
        };
        let stride = rtts.len().div_ceil(max_samples.max(1));
        Some(RrResult {
            transactions: rtts.len(),
            seconds,
            p50_ns: rank(50.0),
            p90_ns: rank(90.0),
            p99_ns: rank(99.0),
            max_ns: sorted[sorted.len() - 1],
            mean_ns: rtts.iter().map(|&n| n as f64).sum::<f64>() / rtts.len() as f64,
            samples_ns: rtts.iter().step_by(stride).copied().collect(),
            stride,
        })
    }

    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.transactions as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Runs the helper named by `args` (everything after [`HELPER_ARG`]).
pub fn helper_main(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<()> {
    let parsed = HelperArgs::try_parse_from(
        std::iter::once(std::ffi::OsString::from("skiff-bench __rr")).chain(args),
    )?;
    match parsed.role {
        RrRole::Server {
            listen,
            lifetime_secs,
        } => serve(listen, Duration::from_secs(lifetime_secs)),
        RrRole::Client {
            connect,
            seconds,
            max_samples,
            connect_timeout_secs,
        } => {
            if !(seconds.is_finite() && seconds > 0.0) {
                bail!("--seconds must be a positive number, not {seconds}");
            }
            if !(connect_timeout_secs.is_finite() && connect_timeout_secs >= 0.0) {
                bail!("--connect-timeout-secs must be a non-negative number");
            }
            let r = client(
                connect,
                Duration::from_secs_f64(seconds),
                max_samples,
                Duration::from_secs_f64(connect_timeout_secs),
            )?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
    }
}

/// Serves until `lifetime` has passed (then the process exits) or [`MAX_CONNECTIONS`] were
/// accepted.
pub fn serve(listen: SocketAddr, lifetime: Duration) -> Result<()> {
    let listener = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    std::thread::spawn(move || {
        std::thread::sleep(lifetime);
        std::process::exit(0);
    });
    for conn in listener.incoming().take(MAX_CONNECTIONS) {
        let Ok(stream) = conn else { continue };
        std::thread::spawn(move || echo(stream));
    }
    Ok(())
}

/// Answers each read with as many bytes, until the peer closes or an error.
fn echo(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stream.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// Connects (retrying until `connect_timeout`), then runs transactions for `duration`.
pub fn client(
    addr: SocketAddr,
    duration: Duration,
    max_samples: usize,
    connect_timeout: Duration,
) -> Result<RrResult> {
    let deadline = Instant::now() + connect_timeout;
    let mut stream = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(e).with_context(|| format!("connecting to {addr}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    stream.set_nodelay(true).context("TCP_NODELAY")?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut rtts: Vec<u64> = Vec::with_capacity(1 << 16);
    let mut byte = [0u8; 1];
    let t0 = Instant::now();
    while t0.elapsed() < duration && rtts.len() < MAX_TRANSACTIONS {
        let t = Instant::now();
        stream.write_all(&[1]).context("sending a request")?;
        stream.read_exact(&mut byte).context("reading a response")?;
        rtts.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    let seconds = t0.elapsed().as_secs_f64();
    RrResult::of(&rtts, seconds, max_samples).context("no transaction completed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_statistics_and_stride() {
        let rtts: Vec<u64> = (1..=100).rev().collect();
        let r = RrResult::of(&rtts, 2.0, 30).unwrap();
        assert_eq!(r.transactions, 100);
        assert_eq!((r.p50_ns, r.p90_ns, r.p99_ns, r.max_ns), (50, 90, 99, 100));
        assert_eq!(r.mean_ns, 50.5);
        assert_eq!(r.rate(), 50.0);
        // 100 transactions, at most 30 samples: every 4th, from the first, in order.
        assert_eq!(r.stride, 4);
        assert_eq!(r.samples_ns.len(), 25);
        assert_eq!(&r.samples_ns[..3], &[100, 96, 92]);
        let all = RrResult::of(&rtts, 1.0, 1000).unwrap();
        assert_eq!((all.stride, all.samples_ns.len()), (1, 100));
        assert!(RrResult::of(&[], 1.0, 10).is_none());
    }

    #[test]
    fn client_and_server_on_loopback() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        std::thread::spawn(move || serve(addr, Duration::from_secs(30)));
        let r = client(
            addr,
            Duration::from_millis(200),
            50,
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(r.transactions >= 1, "{r:?}");
        assert!(r.samples_ns.len() <= 50);
        assert!(r.p50_ns <= r.p99_ns && r.p99_ns <= r.max_ns);
        let json = serde_json::to_string(&r).unwrap();
        let back = serde_json::from_str::<RrResult>(&json).unwrap();
        // serde_json's default float parser may be one ulp off the printed shortest form.
        assert!(
            (back.mean_ns - r.mean_ns).abs() <= r.mean_ns.abs() * 1e-12,
            "{back:?}"
        );
        assert_eq!(
            RrResult {
                mean_ns: r.mean_ns,
                ..back
            },
            r
        );
    }

    #[test]
    fn helper_arguments() {
        let a = HelperArgs::try_parse_from([
            "x",
            "client",
            "--connect",
            "10.0.0.1:5300",
            "--seconds",
            "1.5",
        ])
        .unwrap();
        assert!(matches!(
            a.role,
            RrRole::Client { seconds, max_samples: 1000, .. } if seconds == 1.5
        ));
        assert!(HelperArgs::try_parse_from(["x", "client", "--seconds", "1"]).is_err());
        let err =
            helper_main(["client", "--connect", "127.0.0.1:1", "--seconds", "0"].map(Into::into))
                .unwrap_err();
        assert!(err.to_string().contains("--seconds"), "{err}");
    }
}
