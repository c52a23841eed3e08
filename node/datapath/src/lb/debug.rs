//! The LB programs' debug records (`--bpf-debug`): with [`super::LbConfig::debug`] the
//! `skiff-lb` programs log every translation (socket connect/sendmsg rewrites, NodePort new
//! flows) with aya-log-ebpf into their `AYA_LOGS` ring buffer.
//! [`super::ServiceLb::start_debug_log`] starts a [`Reader`]: a thread that waits for the ring
//! buffer with poll(2) and hands every record to a `log` sink; the agent's sink is
//! [`TracingLog`], which re-emits them as `tracing` events at debug level (target
//! `skiff_lb`).
//!
//! The reader owns the aya-log [`EbpfLogger`] (the ring buffer's descriptor in the agent) for
//! as long as records are wanted, as aya-log requires; dropping the [`Reader`] stops the
//! thread after at most one poll interval.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use aya_log::EbpfLogger;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};

/// How long the reader waits for records before checking whether it should stop.
const POLL_MS: u16 = 200;

/// A `log` sink that re-emits aya-log records as `tracing` debug events.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        tracing::debug!(target: "skiff_lb", "{}", record.args());
    }

    fn flush(&self) {}
}

/// The thread that drains the debug ring buffer into a sink. Stops when dropped.
#[derive(Debug)]
pub struct Reader {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    /// Starts draining `logger` on a thread of its own.
    pub(super) fn start<T: log::Log + Send + 'static>(logger: EbpfLogger<T>) -> io::Result<Self> {
        Self::poll("skiff-lb-debug", logger, |l| l.flush())
    }

    /// Starts a thread that waits (poll(2), at most [`POLL_MS`] at a time so it notices a
    /// stop) for `source`'s descriptor to be readable and then calls `drain`, once more
    /// when stopped. The one reader loop of the agent's BPF ring buffers (debug records,
    /// flow records).
    pub(crate) fn poll<S: std::os::fd::AsFd + Send + 'static>(
        name: &str,
        mut source: S,
        mut drain: impl FnMut(&mut S) + Send + 'static,
    ) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_t = stop.clone();
        let what = name.to_string();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while !stop_t.load(Ordering::Relaxed) {
                    let ready = {
                        let mut fds = [PollFd::new(source.as_fd(), PollFlags::POLLIN)];
                        nix::poll::poll(&mut fds, PollTimeout::from(POLL_MS))
                    };
                    match ready {
                        Ok(0) | Err(Errno::EINTR) => {}
                        Ok(_) => drain(&mut source),
                        Err(e) => {
                            tracing::warn!(error = %e, reader = %what, "waiting for BPF ring buffer records");
                            return;
                        }
                    }
                }
                // What arrived since the last wake-up.
                drain(&mut source);
            })?;
        Ok(Reader {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::Log as _;

    #[test]
    fn tracing_log_forwards_records_at_debug_level() {
        let out = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            TracingLog.log(
                &log::Record::builder()
                    .args(format_args!(
                        "socket lb connect: 10.96.0.10:80 -> backend x"
                    ))
                    .level(log::Level::Debug)
                    .build(),
            );
        });
        let text = String::from_utf8_lossy(&out.lock().unwrap()).into_owned();
        assert!(text.contains("DEBUG"), "{text}");
        assert!(text.contains("skiff_lb"), "{text}");
        assert!(text.contains("10.96.0.10:80 -> backend x"), "{text}");
    }

    struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);

    impl io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
}
