//! The seams that the kube integration plugs into: the core knows no Kubernetes, only
//! these two traits.
//!
//! A [`Watchdog`](crate::Watchdog) takes an [`ApiServerCheck`] (so that an API outage
//! fails readiness, not liveness) and [`WatchAges`] (so that a silent watch fails
//! readiness and shows in the metrics) from its [`Builder`](crate::Builder). The kube
//! integration's `kube::ApiServerCheck` and `kube::watches::Watches` are the ones this
//! crate ships; anything else that can tell the same may be plugged in instead.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::health::Health;
use crate::monitor::ApiServerStatus;

/// Checks whether the API server answers at all and records each answer into its
/// [`ApiServerStatus`], which the monitor, the `api-server` readiness check and the
/// metrics read.
pub trait ApiServerCheck: Send + Sync + fmt::Debug + 'static {
    /// The status it records into.
    fn status(&self) -> Arc<ApiServerStatus>;

    /// How soon after [`ApiServerStatus::ask`] it has recorded an answer (or given up)
    /// at the latest: the monitor waits that long for a check sent after a deadline
    /// before it judges a new await past it.
    fn answer_within(&self) -> Duration;
}

/// One watched resource at a moment: what the `watches` check, its reports and the
/// `reconcile_watchdog_watch_age_seconds` gauge show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchAge {
    /// The controllers that watch it.
    pub controllers: Vec<String>,
    /// The resource, as its source names it (`plural.group` for Kubernetes).
    pub resource: String,
    /// How long since its last sign of life.
    pub age: Duration,
}

/// Knows when each watch the controllers run last showed a sign of life.
pub trait WatchAges: Send + Sync + fmt::Debug + 'static {
    /// Called once as the watchdog starts, with the health sets that its readiness
    /// check joins.
    fn attach(&self, health: &Arc<Health>);

    /// Every expected watch and its age at `now`.
    fn ages(&self, now: Instant) -> Vec<WatchAge>;
}
