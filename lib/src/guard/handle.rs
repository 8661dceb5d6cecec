//! The handle that registers one controller's reconciles: a spare entry of the thread
//! reused, or a new one put into the map.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::clock;
use super::controller::Controller;
use super::entry::Entry;
use super::guarded::Guarded;
use super::map::{Shared, Slot};
use super::reconcile::ObjectKey;
use super::reconcile_guard::Guard;
use super::spares::{SPARES, release};

/// Registers the reconciles of one controller.
#[derive(Clone)]
pub struct ControllerHandle {
    pub(super) controller: Arc<Controller>,
}

impl std::fmt::Debug for ControllerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerHandle")
            .field("name", &self.controller.name)
            .field("kind", &self.controller.kind)
            .field("deadline", &self.controller.deadline)
            .finish()
    }
}

impl ControllerHandle {
    /// A handle on a new controller of `map`.
    pub(super) fn new(
        map: &Arc<Shared>,
        name: Arc<str>,
        kind: Arc<str>,
        deadline: Duration,
    ) -> Self {
        Self {
            controller: Arc::new(Controller::new(map, name, kind, deadline)),
        }
    }

    /// The controller's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.controller.name
    }

    /// The controller's deadline.
    #[must_use]
    pub fn deadline(&self) -> Duration {
        self.controller.deadline
    }

    /// The same controller with another deadline than the registry's
    /// [`Deadlines`](super::Deadlines) give it, for the reconciles registered through the
    /// returned handle.
    #[must_use]
    pub fn with_deadline(self, deadline: Duration) -> Self {
        let c = &self.controller;
        Self::new(&c.map, Arc::clone(&c.name), Arc::clone(&c.kind), deadline)
    }

    /// Registers a reconcile of `object` by hand; prefer [`guard`](Self::guard).
    pub fn register(&self, object: ObjectKey) -> Guard {
        let controller = &self.controller;
        let started = clock::now();
        controller.in_flight.fetch_add(1, Ordering::Relaxed);
        // An entry a reconcile of this controller left idle in the map on this thread:
        // no allocation, no insertion.
        if let Some(spare) = SPARES.try_with(|s| s.take(controller)).ok().flatten() {
            // Held by the map and this thread only: no waker, no request, no reader that
            // cloned it. A scan may still be copying it through the map's reference; its
            // copy is checked against the state word and dropped (see `StateWord`).
            if Arc::strong_count(&spare) == 2
                && let Some(id) = spare.next_reconcile()
            {
                spare.reuse(id, object, started);
                return Guard {
                    id,
                    entry: Some(spare),
                    outcome: None,
                };
            }
            // Read right now: it stays a spare. (Its ids used up: it leaves the map.)
            release(spare);
        }
        let entry = Arc::new(Entry::new(
            Arc::clone(controller),
            object,
            controller.map.epoch,
            started,
        ));
        let id = controller.map.insert(Slot {
            started: AtomicU64::new(started),
            controller: Arc::as_ptr(controller) as usize,
            entry: Arc::clone(&entry),
        });
        entry.begin(id);
        Guard {
            id,
            entry: Some(entry),
            outcome: None,
        }
    }

    /// Runs `reconcile` for `object` under a guard that records its polls.
    pub fn guard<F, T, E>(&self, object: ObjectKey, reconcile: F) -> Guarded<F>
    where
        F: Future<Output = Result<T, E>>,
    {
        Guarded::new(self.register(object), reconcile)
    }
}
