//! The handle that registers one controller's reconciles: a spare entry of the thread
//! reused, or a new one put into the map. One controller per name and deadline: a
//! handle asked for again is a handle on the same controller, retired with its last
//! handle and forgotten after later ones.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use super::clock;
use super::controller::Controller;
use super::entry::Entry;
use super::guarded::Guarded;
use super::map::{Place, RETIRED_KEPT, Shared, Slot};
use super::reconcile::ObjectKey;
use super::reconcile_guard::Guard;
use super::spares::{SPARES, release};

/// Registers the reconciles of one controller.
///
/// Every handle of a registry for one name and deadline is a handle on the same
/// controller: asking for it again (even once per reconcile) finds it and creates
/// nothing. When its last handle is dropped, the controller is retired: the registry
/// keeps the latest 16 retired, so that asking for one again is the same controller;
/// an older one is forgotten, and its observers told (the metrics remove its series).
/// Reconciles still running end as usual.
#[derive(Clone)]
pub struct ControllerHandle {
    pub(super) controller: Arc<Controller>,
    /// Held by every handle of the controller: its drop, with the last handle's,
    /// retires the controller. Apart from `controller`, which entries also hold.
    _registration: Arc<Registration>,
}

/// Held by every handle of one controller: its drop, with the last handle's, retires
/// the controller (see [`RETIRED_KEPT`]).
pub(super) struct Registration {
    controller: Arc<Controller>,
}

/// Logs, once per controller, that it was asked for with a kind other than its own.
#[cold]
fn other_kind(controller: &Controller, kind: &str) {
    if !controller.other_kind_logged.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            controller = %controller.name,
            kind = %controller.kind,
            asked = %kind,
            "controller asked for with another kind: the handle is on the existing controller, which keeps its first kind (logged once per controller)"
        );
    }
}

/// Tells the observers that the controllers of `places` are gone, then drops them;
/// with no lock held (observers are the user's code). A panic in one is caught, so that
/// a handle's drop never unwinds (nor aborts, during an unwind).
pub(super) fn forget(map: &Shared, places: Vec<Place>) {
    for place in places {
        let controller = &place.controller;
        for observer in &map.observers {
            let told = std::panic::catch_unwind(AssertUnwindSafe(|| {
                observer.controller_forgotten(&controller.name, &controller.kind);
            }));
            if told.is_err() {
                tracing::error!(
                    controller = %controller.name,
                    "an observer panicked when told that a controller was dropped; caught"
                );
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let this: *const Self = self;
        let controller = &self.controller;
        let map = &controller.map;
        let forgotten = {
            let mut named = map.named.lock().unwrap_or_else(PoisonError::into_inner);
            // Ours unless a handle asked for since our last one dropped took the place.
            let ours = named
                .places
                .get(&*controller.name)
                .and_then(|places| places.iter().find(|p| p.deadline == controller.deadline))
                .is_some_and(|place| std::ptr::eq(place.live.as_ptr(), this));
            if !ours {
                Vec::new()
            } else if map.registries.load(Ordering::Acquire) == 0 && !named.any_live() {
                // Nothing can ask for a controller of this registry any more.
                named.take_all()
            } else {
                named
                    .retired
                    .push_back((Arc::clone(&controller.name), controller.deadline));
                let mut forgotten = Vec::new();
                while named.retired.len() > RETIRED_KEPT {
                    if let Some((name, deadline)) = named.retired.pop_front()
                        && let Some(place) = named.take(&name, deadline)
                    {
                        forgotten.push(place);
                    }
                }
                forgotten
            }
        };
        forget(map, forgotten);
    }
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
    /// A handle on `map`'s controller `name` with `deadline`: the one in its table
    /// (live, or retired and taken back), or a new one (its observers asked for theirs,
    /// once). A lock and a look-up by name: nothing grows for a name already there.
    pub(super) fn named(map: &Arc<Shared>, name: &str, kind: &str, deadline: Duration) -> Self {
        let mut named = map.named.lock().unwrap_or_else(PoisonError::into_inner);
        let found = named
            .places
            .get_mut(name)
            .and_then(|places| places.iter_mut().find(|p| p.deadline == deadline));
        if let Some(place) = found {
            let controller = Arc::clone(&place.controller);
            let (registration, taken_back) = match place.live.upgrade() {
                Some(registration) => (registration, false),
                None => {
                    // Retired, or its last handle is dropping (that drop then finds its
                    // place taken, and leaves it).
                    let registration = Arc::new(Registration {
                        controller: Arc::clone(&controller),
                    });
                    place.live = Arc::downgrade(&registration);
                    (registration, true)
                }
            };
            if taken_back {
                named
                    .retired
                    .retain(|(n, d)| !(**n == *name && *d == deadline));
            }
            drop(named);
            if *controller.kind != *kind {
                other_kind(&controller, kind);
            }
            return Self {
                controller,
                _registration: registration,
            };
        }
        let controller = Arc::new(Controller::new(map, name.into(), kind.into(), deadline));
        let registration = Arc::new(Registration {
            controller: Arc::clone(&controller),
        });
        named
            .places
            .entry(Arc::clone(&controller.name))
            .or_default()
            .push(Place {
                deadline,
                controller: Arc::clone(&controller),
                live: Arc::downgrade(&registration),
            });
        drop(named);
        Self {
            controller,
            _registration: registration,
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
    /// returned handle. One controller per name and deadline: asking for the same
    /// deadline again gives a handle on the same controller. Controllers of one name
    /// share their metrics series; each is told apart in a scan by its deadline.
    #[must_use]
    pub fn with_deadline(self, deadline: Duration) -> Self {
        if deadline == self.controller.deadline {
            return self;
        }
        let c = &self.controller;
        Self::named(&c.map, &c.name, &c.kind, deadline)
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
