//! The pod loop: a reflector on the pods bound to this node feeds one [`Worker`] per pod;
//! the runtime's exit notifications wake the worker of the pod concerned, and pods deleted
//! while the agent was away, or sandboxes of pods that no longer exist, are torn down.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use skiff_api::api::Pod;
use skiff_client::ListParams;
use skiff_client::reflector::{Event, reflector};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::AgentError;
use crate::worker::{self, Ctx, Worker};

struct Workers {
    ctx: Arc<Ctx>,
    senders: HashMap<String, mpsc::UnboundedSender<worker::Msg>>,
    done_tx: mpsc::UnboundedSender<String>,
}

impl Workers {
    fn send(&mut self, uid: &str, pod: Option<&Pod>, msg: worker::Msg) {
        let msg = match self.senders.get(uid) {
            Some(tx) => match tx.send(msg) {
                Ok(()) => return,
                Err(mpsc::error::SendError(msg)) => msg,
            },
            None => msg,
        };
        drop(msg);
        // No live worker: start one (it reconciles at once, so the message is implied).
        let (tx, rx) = mpsc::unbounded_channel();
        let w = Worker::new(self.ctx.clone(), uid.to_string(), pod.cloned());
        let done = self.done_tx.clone();
        let uid_owned = uid.to_string();
        tokio::spawn(async move {
            w.run(rx).await;
            let _ = done.send(uid_owned);
        });
        self.senders.insert(uid.to_string(), tx);
    }

    fn update(&mut self, pod: &Pod) {
        let uid = pod
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        if uid.is_empty() {
            return;
        }
        self.send(&uid, Some(pod), worker::Msg::Update(Box::new(pod.clone())));
    }

    fn gone(&mut self, uid: &str) {
        self.send(uid, None, worker::Msg::Gone);
    }
}

pub(crate) async fn pod_loop(
    ctx: Arc<Ctx>,
    node: &str,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), AgentError> {
    let api = ctx.client.all::<Pod>();
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let mut pods = Box::pin(reflector(api, lp));
    let mut exits = ctx.runtime.exits();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut workers = Workers {
        ctx: ctx.clone(),
        senders: HashMap::new(),
        done_tx,
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => {
                info!("agent stopping; pods keep running");
                return Ok(());
            }
            ev = pods.next() => match ev {
                Some(Event::Restarted(list)) => {
                    let live: std::collections::HashSet<String> = list
                        .iter()
                        .filter_map(|p| p.metadata.as_ref().map(|m| m.uid.clone()))
                        .collect();
                    for p in &list {
                        workers.update(p);
                    }
                    // Pods deleted while we were not watching, and sandboxes left on disk
                    // for pods that no longer exist: tear them down.
                    let stale: Vec<String> = workers
                        .senders
                        .keys()
                        .filter(|u| !live.contains(*u))
                        .cloned()
                        .collect();
                    for uid in stale {
                        workers.gone(&uid);
                    }
                    match ctx.runtime.list_sandboxes().await {
                        Ok(sandboxes) => {
                            for sb in sandboxes.iter().filter(|s| !live.contains(&s.uid)) {
                                info!(pod = %format!("{}/{}", sb.namespace, sb.name), "removing orphaned pod");
                                workers.gone(&sb.uid);
                            }
                        }
                        Err(e) => warn!(error = %e, "listing sandboxes"),
                    }
                }
                Some(Event::Applied(p)) => workers.update(&p),
                Some(Event::Deleted(p)) => {
                    if let Some(m) = &p.metadata {
                        workers.gone(&m.uid);
                    }
                }
                None => return Ok(()),
            },
            exit = exits.recv() => match exit {
                Ok((uid, container)) => {
                    tracing::debug!(%uid, %container, "container exited");
                    if let Some(tx) = workers.senders.get(&uid) {
                        let _ = tx.send(worker::Msg::Wake);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    warn!(missed = n, "exit notifications lagged; waking every pod");
                    for tx in workers.senders.values() {
                        let _ = tx.send(worker::Msg::Wake);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    exits = ctx.runtime.exits();
                }
            },
            Some(uid) = done_rx.recv() => {
                if workers.senders.get(&uid).is_some_and(|tx| tx.is_closed()) {
                    workers.senders.remove(&uid);
                }
            }
        }
    }
}
