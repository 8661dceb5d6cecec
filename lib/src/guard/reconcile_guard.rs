//! The guard that keeps one reconcile in the registry and ends it on every path: it
//! tells the observers, queues the end of a reconcile reported hung for the monitor,
//! and keeps the entry as the thread's spare or takes it out of the map.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::clock;
use super::controller::Controller;
use super::entry::Entry;
use super::observer::{Ended, LateEnd};
use super::reconcile::Outcome;
use super::spares::{keep_as_spare, leave_map};

/// Keeps one reconcile in the registry for as long as it lives.
///
/// Dropping it ends the reconcile in the registry, whatever the path: a finished
/// reconcile, an error, a panic unwinding through it, or the future that owns it being
/// dropped.
#[must_use = "the reconcile leaves the registry as soon as the guard is dropped"]
pub struct Guard {
    pub(super) id: u64,
    /// Always there until the drop takes it (to keep it for the thread's next
    /// registration).
    pub(super) entry: Option<Arc<Entry>>,
    pub(super) outcome: Option<Outcome>,
}

/// Logs, once per controller, that an observer of its reconciles' ends panicked (the
/// guard caught it).
#[cold]
#[inline(never)]
fn observer_panicked(controller: &Controller) {
    if !controller.observer_panicked.swap(true, Ordering::Relaxed) {
        tracing::error!(
            controller = %controller.name,
            "an observer of reconcile ends panicked; the guard caught it and ended the reconcile as usual (logged once per controller)"
        );
    }
}

/// Queues the end of reconcile `id`, reported hung, for the monitor's
/// [`Registry::take_ended`](super::Registry::take_ended): off the common path.
#[cold]
#[inline(never)]
fn queue_end(entry: &Arc<Entry>, id: u64, outcome: Outcome) {
    let reconcile = entry.snapshot(id);
    let ended = Ended {
        elapsed: reconcile.started.elapsed(),
        reconcile,
        outcome,
    };
    // The receiver lives as long as the sender, in the same registry.
    let _ = entry.controller.map.ended.send(ended);
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("id", &self.id)
            .field("controller", &self.entry().controller.name)
            .field("object", &*self.entry().object())
            .finish()
    }
}

impl Guard {
    /// The registry id of this reconcile.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Records how the reconcile ended; without it, a dropped guard counts as
    /// [`Outcome::Dropped`] (or [`Outcome::Panic`] while unwinding).
    #[inline]
    pub fn finish(mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }

    #[inline]
    pub(crate) fn entry(&self) -> &Arc<Entry> {
        match &self.entry {
            Some(entry) => entry,
            None => unreachable!("the entry is only taken by the drop"),
        }
    }

    /// A second reference to the entry, for `Guarded` to lend to the thread during its
    /// polls; the entry counts it as held, not as a waker.
    pub(crate) fn lend(&self) -> Arc<Entry> {
        let entry = self.entry();
        entry.lent();
        Arc::clone(entry)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else {
            return;
        };
        // Told by `finish` on the common path: only a guard dropped without it asks
        // whether the thread is unwinding.
        let outcome = self.outcome.unwrap_or_else(|| {
            if std::thread::panicking() {
                Outcome::Panic
            } else {
                Outcome::Dropped
            }
        });
        let controller = &entry.controller;
        // Leave the in-flight set before queueing the end: the monitor takes ends before
        // it scans, so it never sees one reconcile both ended and in flight.
        let hung = entry.end().is_hung();
        controller.in_flight.fetch_sub(1, Ordering::Relaxed);
        // The second is only there with the first. Observers are the user's code: a
        // panic in one is caught here, so that the end below is queued and the entry
        // kept or taken out of the map whatever it does (and a panic while the
        // reconcile's own panic unwinds does not abort the process).
        if let [Some(first), second] = &controller.observers {
            let told = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let ran = clock::now().saturating_sub(entry.started());
                let elapsed = Duration::from_nanos(ran);
                first.finished(outcome, elapsed);
                if let Some(second) = second {
                    second.finished(outcome, elapsed);
                }
                if ran > controller.late_after {
                    let object = entry.object().clone();
                    let end = LateEnd {
                        controller: &controller.name,
                        kind: &controller.kind,
                        object: &object,
                        outcome,
                        elapsed,
                        deadline: controller.deadline,
                        reported_hung: hung,
                    };
                    first.ended_late(&end);
                    if let Some(second) = second {
                        second.ended_late(&end);
                    }
                }
            }));
            if told.is_err() {
                observer_panicked(controller);
            }
        }
        if hung {
            queue_end(&entry, self.id, outcome);
        }
        // Nobody else holds it (no waker clone, no request still in flight, no reader
        // that cloned it: the map's reference and this one), and it was not reported
        // hung (the monitor's copies of it stay this reconcile's): it stays in the map,
        // idle, as one of the thread's spares. A scan may be copying it through the
        // map's reference; its copy is checked against the state word.
        if !hung && Arc::strong_count(&entry) == 2 {
            // Whatever the last other holder wrote happened before this point.
            std::sync::atomic::fence(Ordering::Acquire);
            entry.clear();
            keep_as_spare(entry);
        } else {
            leave_map(&entry);
        }
    }
}
