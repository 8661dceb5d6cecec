//! One registry observer that tells several: metrics and the deadline advisor, say.

use std::sync::Arc;
use std::time::Duration;

use super::observer::{ControllerObserver, LateEnd, Observer};
use super::reconcile::Outcome;

/// Tells every observer it holds, in order, of every end.
#[derive(Clone, Default)]
pub struct Fanout {
    observers: Vec<Arc<dyn Observer>>,
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("observers", &self.observers.len())
            .finish()
    }
}

impl Fanout {
    /// No observer yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `observer`.
    #[must_use]
    pub fn with(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observers.push(observer);
        self
    }

    pub(super) fn into_observers(self) -> Vec<Arc<dyn Observer>> {
        self.observers
    }
}

impl Observer for Fanout {
    fn controller(&self, controller: &str, kind: &str) -> Option<Arc<dyn ControllerObserver>> {
        // One alone is told directly; several are told in pairs (two calls, no loop):
        // the advisor and the metrics are the usual two.
        self.observers
            .iter()
            .filter_map(|o| o.controller(controller, kind))
            .reduce(|first, then| Arc::new(Both(first, then)))
    }
}

/// Two observers of one controller, told in order.
pub(super) struct Both(
    pub(super) Arc<dyn ControllerObserver>,
    pub(super) Arc<dyn ControllerObserver>,
);

impl ControllerObserver for Both {
    fn finished(&self, outcome: Outcome, elapsed: Duration) {
        self.0.finished(outcome, elapsed);
        self.1.finished(outcome, elapsed);
    }

    fn ended_late(&self, end: &LateEnd<'_>) {
        self.0.ended_late(end);
        self.1.ended_late(end);
    }
}
