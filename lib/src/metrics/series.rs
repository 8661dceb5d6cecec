//! Each controller's series, resolved once per controller so that a reconcile's end
//! neither allocates nor formats labels.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::histogram::DurationHistogram;
use crate::guard::{self, Outcome};
use crate::monitor::HangState;

/// Every [`Outcome`], in the order of [`outcome_index`].
const OUTCOMES: [Outcome; 5] = [
    Outcome::Ok,
    Outcome::Error,
    Outcome::Panic,
    Outcome::Cancelled,
    Outcome::Dropped,
];

fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Ok => 0,
        Outcome::Error => 1,
        Outcome::Panic => 2,
        Outcome::Cancelled => 3,
        Outcome::Dropped => 4,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ControllerLabels {
    pub(super) controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabels {
    controller: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HangLabels {
    controller: String,
    state: &'static str,
}

/// The labelled families, kept to create each controller's series from.
#[derive(Debug)]
pub(super) struct Families {
    pub(super) reconcile_duration: Family<OutcomeLabels, DurationHistogram>,
    pub(super) in_flight: Family<ControllerLabels, Gauge>,
    pub(super) overdue: Family<ControllerLabels, Gauge>,
    pub(super) hangs: Family<HangLabels, Counter>,
    pub(super) cancellations: Family<ControllerLabels, Counter>,
    pub(super) escalations: Family<ControllerLabels, Counter>,
    pub(super) near_misses: Family<ControllerLabels, Counter>,
}

/// One controller's series, resolved once so that the per-reconcile hook neither
/// allocates nor formats labels.
#[derive(Debug)]
pub(super) struct ControllerSeries {
    pub(super) durations: [DurationHistogram; OUTCOMES.len()],
    pub(super) in_flight: Gauge,
    pub(super) overdue: Gauge,
    pub(super) hangs_awaiting: Counter,
    pub(super) hangs_in_poll: Counter,
    pub(super) hangs_starved: Counter,
    pub(super) cancellations: Counter,
    pub(super) escalations: Counter,
    pub(super) near_misses: Counter,
}

impl ControllerSeries {
    pub(super) fn new(families: &Families, controller: &str) -> Self {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        let hangs = |state: HangState| {
            families.hangs.get_or_create_owned(&HangLabels {
                controller: controller.to_owned(),
                state: state.as_str(),
            })
        };
        Self {
            durations: OUTCOMES.map(|outcome| {
                families
                    .reconcile_duration
                    .get_or_create_owned(&OutcomeLabels {
                        controller: controller.to_owned(),
                        outcome: outcome.as_str(),
                    })
            }),
            in_flight: families.in_flight.get_or_create_owned(&labels),
            overdue: families.overdue.get_or_create_owned(&labels),
            hangs_awaiting: hangs(HangState::Awaiting),
            hangs_in_poll: hangs(HangState::InPoll),
            hangs_starved: hangs(HangState::Starved),
            cancellations: families.cancellations.get_or_create_owned(&labels),
            escalations: families.escalations.get_or_create_owned(&labels),
            near_misses: families.near_misses.get_or_create_owned(&labels),
        }
    }

    pub(super) fn hangs(&self, state: HangState) -> &Counter {
        match state {
            HangState::Awaiting => &self.hangs_awaiting,
            HangState::InPoll => &self.hangs_in_poll,
            HangState::Starved => &self.hangs_starved,
        }
    }
}

/// Each end lands in the controller's series resolved when its handle was made.
impl guard::ControllerObserver for ControllerSeries {
    fn finished(&self, outcome: Outcome, elapsed: Duration) {
        self.durations[outcome_index(outcome)].observe(elapsed);
    }

    fn ended_late(&self, end: &guard::LateEnd<'_>) {
        if end.is_near_miss() {
            self.near_misses.inc();
        }
    }
}
