//! One registry observer that tells several: metrics and the deadline advisor, say.

use std::sync::Arc;
use std::time::Duration;

use super::entry::Outcome;
use super::registry::{LateEnd, Observer};

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
    fn finished(&self, controller: &str, kind: &str, outcome: Outcome, elapsed: Duration) {
        for observer in &self.observers {
            observer.finished(controller, kind, outcome, elapsed);
        }
    }

    fn ended_late(&self, end: &LateEnd<'_>) {
        for observer in &self.observers {
            observer.ended_late(end);
        }
    }
}
