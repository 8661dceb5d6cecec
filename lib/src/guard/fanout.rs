//! One registry observer that tells several: metrics and the deadline advisor, say.

use std::sync::Arc;
use std::time::Duration;

use super::entry::Outcome;
use super::registry::{ControllerObserver, LateEnd, Observer};

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
}

impl Observer for Fanout {
    fn controller(&self, controller: &str, kind: &str) -> Option<Arc<dyn ControllerObserver>> {
        let mut each: Vec<Arc<dyn ControllerObserver>> = self
            .observers
            .iter()
            .filter_map(|o| o.controller(controller, kind))
            .collect();
        // One alone is told directly: no loop, no second dynamic call per end.
        match each.len() {
            0 => None,
            1 => each.pop(),
            _ => Some(Arc::new(Each(each))),
        }
    }
}

/// Several observers of one controller, told in order.
struct Each(Vec<Arc<dyn ControllerObserver>>);

impl ControllerObserver for Each {
    fn finished(&self, outcome: Outcome, elapsed: Duration) {
        for observer in &self.0 {
            observer.finished(outcome, elapsed);
        }
    }

    fn ended_late(&self, end: &LateEnd<'_>) {
        for observer in &self.0 {
            observer.ended_late(end);
        }
    }
}
