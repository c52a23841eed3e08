//! Controllers: what every controller (and the scheduler) is built from. Level-triggered
//! reconcilers over reflectors: a reconciler gets only an object's key and reads the current
//! state from informer caches, which reflectors keep current.
//!
//! - [`Informer`] / [`Informers`]: the shared, indexed cache of one resource type, kept
//!   current by the [`crate::reflector`] (list, watch, relist on "too old"), with change
//!   notifications. One informer per type per process, shared by every controller.
//! - [`WorkQueue`]: deduplicated keys, delayed and rate-limited re-adds, one key never
//!   processed twice at the same time.
//! - [`Controller`] + [`Reconciler`]: the reconcile loop. Watches feed keys (the primary
//!   objects, and the owners of the objects they control); workers reconcile them; errors
//!   are retried with per-key exponential back-off.
//! - [`LeaderElector`]: run controllers in one replica at a time, through a Lease.
//! - [`EventRecorder`]: core/v1 Events about the objects controllers act on.
//! - [`CancelToken`]: how long-running parts are told to stop.
//!
//! ```no_run
//! use std::sync::Arc;
//! use skiff_api::api::{Pod, ReplicaSet};
//! use skiff_client::Client;
//! use skiff_client::controller::{Action, Controller, Informers, ObjectKey, Reconciler};
//!
//! struct Noop;
//! impl Reconciler for Noop {
//!     type Error = skiff_client::ClientError;
//!     async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Self::Error> {
//!         println!("reconcile {key}");
//!         Ok(Action::Done)
//!     }
//! }
//!
//! # async fn demo(client: Client) {
//! let informers = Informers::new(client);
//! Controller::<ReplicaSet>::new(&informers)
//!     .watches_owned::<Pod>()
//!     .run(Arc::new(Noop), 4)
//!     .await;
//! # }
//! ```

mod cancel;
mod events;
mod informer;
mod key;
mod leader;
mod queue;
mod reconcile;
pub(crate) mod time;

pub use cancel::{CancelToken, cancelled_on_termination, default_identity, terminated};
pub use events::{EventRecorder, EventType, object_reference};
pub use informer::{
    Change, IndexFn, Informer, Informers, LABEL_INDEX, NAMESPACE_INDEX, NODE_INDEX, OWNER_INDEX,
    OWNER_REF_INDEX, Subscription, controller_of,
};
pub use key::ObjectKey;
pub use leader::{LeaderElectionConfig, LeaderElectionError, LeaderElector};
pub use queue::{RateLimiter, WorkQueue};
pub use reconcile::{Action, Controller, Reconciler, owner_key, run_workers};
