//! [`CancelToken`]: a cloneable "stop now" signal, with child tokens.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

#[derive(Debug, Default)]
struct Inner {
    cancelled: AtomicBool,
    notify: Notify,
    children: Mutex<Vec<Weak<Inner>>>,
}

impl Inner {
    fn cancel(&self) {
        if self.cancelled.swap(true, Ordering::SeqCst) {
            return;
        }
        self.notify.notify_waiters();
        let children =
            std::mem::take(&mut *self.children.lock().unwrap_or_else(|e| e.into_inner()));
        for c in children.iter().filter_map(Weak::upgrade) {
            c.cancel();
        }
    }
}

/// A signal that asks tasks to stop. Clones share the signal; [`CancelToken::child`] makes a
/// token that is cancelled with its parent but can also be cancelled alone (e.g. "leadership
/// lost" below "process shutting down").
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    inner: Arc<Inner>,
}

impl CancelToken {
    pub fn new() -> Self {
        CancelToken::default()
    }

    /// A token cancelled when this one is (or when cancelled itself).
    pub fn child(&self) -> CancelToken {
        let child = CancelToken::new();
        {
            let mut children = self
                .inner
                .children
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            children.retain(|w| w.strong_count() > 0);
            children.push(Arc::downgrade(&child.inner));
        }
        // Cancelled before the child was registered: the loop in cancel() may have missed it.
        if self.is_cancelled() {
            child.cancel();
        }
        child
    }

    pub fn cancel(&self) {
        self.inner.cancel();
    }

    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// Completes once the token is cancelled.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// Resolves when the process is asked to stop, by SIGTERM or Ctrl-C (SIGINT), with which of
/// them. The one way the components that run on the client library (scheduler, controller
/// manager, node agent) wait for it.
pub async fn terminated() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        r = tokio::signal::ctrl_c() => r.map(|()| "SIGINT"),
    }
}

/// A token cancelled when the process is asked to stop ([`terminated`]), which is logged:
/// what every long-running component's `main` waits on. Call inside a tokio runtime.
pub fn cancelled_on_termination() -> CancelToken {
    let shutdown = CancelToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move {
        match terminated().await {
            Ok(signal) => tracing::info!(signal, "exiting"),
            Err(e) => tracing::error!(error = %e, "cannot watch for SIGTERM/SIGINT; exiting"),
        }
        token.cancel();
    });
    shutdown
}

/// This instance's default identity in leader election: the host name (`fallback` when it
/// has none) and a suffix unique to this process (`suffix`, e.g. the pid).
pub fn default_identity(fallback: &str, suffix: impl std::fmt::Display) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| fallback.to_string());
    format!("{host}_{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn children_follow_parents_not_the_reverse() {
        let parent = CancelToken::new();
        let child = parent.child();
        let grandchild = child.child();
        child.cancel();
        assert!(grandchild.is_cancelled());
        assert!(!parent.is_cancelled());
        let other = parent.child();
        let waiter = tokio::spawn({
            let other = other.clone();
            async move { other.cancelled().await }
        });
        parent.cancel();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("task");
        assert!(parent.child().is_cancelled());
    }
}
