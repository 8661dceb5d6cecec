//! What an observer of the scans is told: the scan and the runtime rescue's wakes.

use std::sync::Arc;
use std::time::Duration;

use super::verdict::Decision;
use super::verdict::driver::WakeCause;
use crate::guard::InFlight;
use crate::restart::Cause;

/// One finished scan, as an [`Observer`] sees it.
// Read by the metrics; the hang reports' observer reads the decision alone.
#[cfg_attr(not(any(feature = "metrics", feature = "internals")), allow(dead_code))]
#[derive(Debug)]
pub struct Scan<'a> {
    /// The reconciles the verdict looked at: those past their deadline, and during a
    /// runtime stall those inside a poll. On-time reconciles are only counted.
    pub attention: &'a [InFlight],
    /// Every reconcile in flight, counted per controller.
    pub in_flight_by_controller: &'a [(Arc<str>, usize)],
    /// What the verdict decided.
    pub decision: &'a Decision<'a>,
    /// How long the scan took (snapshot, decision and reports).
    pub took: Duration,
    /// The watched runtime's heartbeat age, when one is watched.
    pub runtime_heartbeat_age: Option<Duration>,
    /// Idle workers the monitor woke since the previous scan because a guarded
    /// reconcile held a worker in one poll: rescues (their culprits are in the WARN).
    pub driver_rescues: u64,
    /// The other wakes since the previous scan, by cause: they kept timers and I/O
    /// going, and no guarded reconcile held a worker.
    pub driver_wakes: DriverWakes,
    /// Why liveness fails after this scan, while it does.
    pub cause: Option<&'a Cause>,
    /// Where the reconciles in `attention` whose stack was captured are stuck, by
    /// reconcile id: the innermost frame of the operator's own code (the one the
    /// termination message names).
    pub own_frames: &'a [(u64, String)],
}

/// Wakes of an idle worker that were not rescues, by cause (see [`Scan::driver_wakes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverWakes {
    /// A worker published nothing for the rescue's threshold, and no guarded reconcile
    /// was in one poll on it: busy with many short polls, or blocked outside any guard.
    pub busy_worker: u64,
    /// A guarded reconcile was in one long poll on the silent worker, and its thread was
    /// waiting for a CPU: preempted on a contended node, not blocking.
    pub preempted: u64,
    /// The runtime's heartbeat was late, and no silent worker was left to look at.
    pub heartbeat_late: u64,
    /// A silent worker whose reconciles were not looked up: the lookups' budget was
    /// spent.
    pub not_looked_up: u64,
}

impl DriverWakes {
    /// Each cause with its count, by the `cause` label of the metric.
    #[cfg_attr(not(any(feature = "metrics", feature = "internals")), allow(dead_code))]
    #[must_use]
    pub fn by_cause(&self) -> [(&'static str, u64); 4] {
        [
            (WakeCause::BusyWorker.label(), self.busy_worker),
            (WakeCause::Preempted.label(), self.preempted),
            (WakeCause::HeartbeatLate.label(), self.heartbeat_late),
            (WakeCause::NotLookedUp.label(), self.not_looked_up),
        ]
    }
}

/// Told of every scan (metrics, for instance), on the monitor thread.
pub trait Observer: Send + Sync + 'static {
    /// A scan finished.
    fn scanned(&self, scan: &Scan<'_>);
}
