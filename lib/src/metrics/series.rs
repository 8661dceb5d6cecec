//! Each controller's series, resolved once per controller so that a reconcile's end
//! neither allocates nor formats labels, and the bounded table of them.

use std::collections::HashMap;
use std::sync::Arc;
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
    /// Removes the series labelled `controller` from `families`: a scrape no longer
    /// shows them (a copy still held is written to unseen).
    fn remove(families: &Families, controller: &str) {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        for outcome in OUTCOMES {
            families.reconcile_duration.remove(&OutcomeLabels {
                controller: controller.to_owned(),
                outcome: outcome.as_str(),
            });
        }
        for state in [HangState::Awaiting, HangState::InPoll, HangState::Starved] {
            families.hangs.remove(&HangLabels {
                controller: controller.to_owned(),
                state: state.as_str(),
            });
        }
        for family in [&families.in_flight, &families.overdue] {
            family.remove(&labels);
        }
        for family in [
            &families.cancellations,
            &families.escalations,
            &families.near_misses,
        ] {
            family.remove(&labels);
        }
    }

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

/// How many controller names get series of their own; the others share the
/// [`OTHER`] set, so that the series stay bounded whatever names an operator makes.
pub(crate) const MAX_CONTROLLER_SERIES: usize = 64;

/// The `controller` label of the series shared by the controllers past
/// [`MAX_CONTROLLER_SERIES`] (and by one named `other`).
pub(crate) const OTHER: &str = "other";

/// The live controllers' series by name: at most [`MAX_CONTROLLER_SERIES`] sets of
/// their own, and the [`OTHER`] set.
#[derive(Debug, Default)]
pub(super) struct Controllers {
    names: HashMap<Arc<str>, Named>,
    /// How many names have series of their own.
    own: usize,
    /// The set the others share, while one does, and how many do.
    other: Option<(Arc<ControllerSeries>, usize)>,
}

#[derive(Debug)]
struct Named {
    series: Arc<ControllerSeries>,
    /// Labelled with its own name (not [`OTHER`]).
    own: bool,
    /// How many controllers of this name are live (one per deadline).
    live: usize,
}

impl Controllers {
    /// The series of a new controller `name`: its own, while there is room, or the
    /// shared set.
    pub(super) fn acquire(&mut self, families: &Families, name: &str) -> Arc<ControllerSeries> {
        if let Some(named) = self.names.get_mut(name) {
            named.live += 1;
            return Arc::clone(&named.series);
        }
        let own = self.own < MAX_CONTROLLER_SERIES && name != OTHER;
        let series = if own {
            self.own += 1;
            Arc::new(ControllerSeries::new(families, name))
        } else {
            let (series, names) = self
                .other
                .get_or_insert_with(|| (Arc::new(ControllerSeries::new(families, OTHER)), 0));
            *names += 1;
            Arc::clone(series)
        };
        self.names.insert(
            name.into(),
            Named {
                series: Arc::clone(&series),
                own,
                live: 1,
            },
        );
        series
    }

    /// A controller `name` is gone: with the last of its name, its own series leave the
    /// families (or, with the last of the names sharing it, the shared set).
    pub(super) fn release(&mut self, families: &Families, name: &str) {
        let Some(named) = self.names.get_mut(name) else {
            return;
        };
        named.live -= 1;
        if named.live > 0 {
            return;
        }
        let own = named.own;
        self.names.remove(name);
        if own {
            self.own -= 1;
            ControllerSeries::remove(families, name);
        } else if let Some((_, names)) = &mut self.other {
            *names -= 1;
            if *names == 0 {
                self.other = None;
                ControllerSeries::remove(families, OTHER);
            }
        }
    }

    /// The series `name`'s ends land in, if it is live.
    pub(super) fn get(&self, name: &str) -> Option<&Arc<ControllerSeries>> {
        self.names.get(name).map(|named| &named.series)
    }

    /// Every live name with series of its own, and its series.
    pub(super) fn own(&self) -> impl Iterator<Item = (&Arc<str>, &ControllerSeries)> {
        self.names
            .iter()
            .filter(|(_, named)| named.own)
            .map(|(name, named)| (name, &*named.series))
    }

    /// The shared set, while a name shares it, and those names.
    pub(super) fn other(&self) -> Option<(&ControllerSeries, impl Iterator<Item = &Arc<str>>)> {
        let (series, _) = self.other.as_ref()?;
        let names = self
            .names
            .iter()
            .filter(|(_, named)| !named.own)
            .map(|(name, _)| name);
        Some((&**series, names))
    }
}
