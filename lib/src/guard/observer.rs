//! What is told of reconciles' ends: the observer traits and the late end they are told
//! of, and the end of a reconcile reported hung that the monitor takes.

use std::sync::Arc;
use std::time::Duration;

use super::reconcile::{InFlight, ObjectKey, Outcome};

/// A reconcile that ended after the monitor had reported it hung; the monitor drains
/// these to write the "ended after hang" event.
#[derive(Clone, Debug)]
pub struct Ended {
    /// The reconcile as it was last seen.
    pub reconcile: InFlight,
    /// How long it ran in all.
    pub elapsed: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

/// Told of every reconcile that ends (metrics, the deadline advisor). It is asked once
/// per controller handle for that controller's [`ControllerObserver`], which each end
/// then goes to straight: no lookup by name on the reconcile's thread.
pub trait Observer: Send + Sync + 'static {
    /// The observer of the ends of `controller`'s reconciles of `kind`, or `None` to be
    /// told nothing of them (then an end costs the guard no clock read and no call).
    fn controller(&self, controller: &str, kind: &str) -> Option<Arc<dyn ControllerObserver>>;
}

/// Told of each end of one controller's reconciles. It runs on the reconcile's own
/// thread as the guard drops, so it must be quick and must not block.
pub trait ControllerObserver: Send + Sync + 'static {
    /// A reconcile ended with `outcome` after `elapsed`.
    fn finished(&self, outcome: Outcome, elapsed: Duration);

    /// A reconcile ended after more than its controller's near-miss share of its
    /// deadline (see [`Deadlines::near_miss_share`](super::Deadlines::near_miss_share)),
    /// or past the deadline itself. Told after [`finished`](Self::finished), on the same
    /// thread; the common end costs the guard one comparison and no call.
    fn ended_late(&self, end: &LateEnd<'_>) {
        let _ = end;
    }
}

/// A reconcile that ended late: past its near-miss threshold or past its deadline.
#[derive(Clone, Copy, Debug)]
pub struct LateEnd<'a> {
    /// The controller that ran it.
    pub controller: &'a str,
    /// The kind of the object reconciled.
    pub kind: &'a str,
    /// The object reconciled.
    pub object: &'a ObjectKey,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it ran.
    pub elapsed: Duration,
    /// Its deadline.
    pub deadline: Duration,
    /// The monitor had reported it hung.
    pub reported_hung: bool,
}

impl LateEnd<'_> {
    /// Ended on time (within its deadline, never reported hung): a near miss.
    #[must_use]
    pub fn is_near_miss(&self) -> bool {
        self.elapsed <= self.deadline && !self.reported_hung
    }
}
