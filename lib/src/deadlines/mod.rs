//! Evidence for tuning deadlines: near misses, and a deadline advisor per controller.
//!
//! The [`Advisor`] is a registry [`Observer`]: every reconcile that ends lands in its
//! controller's duration sketch (bounded memory, no lock, no
//! allocation), and a reconcile that ends on time after more than the near-miss share of
//! its deadline (see [`Deadlines::near_miss_share`]) is a near miss: counted, and logged
//! as one WARN naming the controller, the object, the duration and the deadline, at most
//! once per controller per [`NEAR_MISS_LOG_PERIOD`] (the next WARN counts those not
//! logged). [`Advisor::report`] turns the sketches into the JSON of `/debug/deadlines`,
//! with a suggested deadline per controller. Reconciles the monitor
//! reported hung are counted as hangs and left out of the durations.

mod sketch;
mod suggest;
pub(crate) mod view;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::guard::{ControllerObserver, Deadlines, LateEnd, Observer, Outcome};

pub(crate) use suggest::MIN_RECONCILES;
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use view::{ControllerReport, DeadlineSource, QuarantinedReport, Report};

/// At most one near-miss WARN per controller in this period; the next one says how
/// many were not logged meanwhile.
pub(crate) const NEAR_MISS_LOG_PERIOD: Duration = Duration::from_secs(60);

/// Controllers the advisor keeps a sketch for (7.8 KiB each); the reconciles of any
/// further one are only counted, as `untracked_reconciles`.
pub(crate) const MAX_CONTROLLERS: usize = 64;

/// The log target of near-miss WARNs.
pub(crate) const TARGET: &str = "reconcile_watchdog::near_miss";

/// What the advisor knows of one controller.
#[derive(Debug)]
struct Stats {
    name: Box<str>,
    sketch: sketch::Sketch,
    near_misses: AtomicU64,
    /// Ended after the monitor had reported them hung.
    hangs_ended: AtomicU64,
    log: LogLimit,
    /// The advisor's epoch, which near-miss log times count from.
    epoch: Instant,
}

/// Collects reconcile durations and near misses per controller. Share it as an `Arc`
/// and hand it to the registry as its observer (with [`Fanout`](crate::guard::Fanout)
/// beside the metrics).
pub struct Advisor {
    epoch: Instant,
    /// Filled in order; `len` says how many are set, so a lookup reads without a lock.
    controllers: [OnceLock<Arc<Stats>>; MAX_CONTROLLERS],
    len: AtomicUsize,
    adding: Mutex<()>,
    untracked: Arc<AtomicU64>,
}

impl std::fmt::Debug for Advisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Advisor")
            .field("controllers", &self.len.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Advisor {
    /// An advisor that has seen nothing yet.
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            controllers: std::array::from_fn(|_| OnceLock::new()),
            len: AtomicUsize::new(0),
            adding: Mutex::new(()),
            untracked: Arc::default(),
        })
    }

    /// The stats of `controller`, added on first sight; `None` past [`MAX_CONTROLLERS`].
    /// Controllers are few: a linear search of their names costs less than hashing one.
    fn stats(&self, controller: &str) -> Option<&Arc<Stats>> {
        let len = self.len.load(Ordering::Acquire);
        if let Some(found) = self.find(controller, len) {
            return Some(found);
        }
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let len = self.len.load(Ordering::Acquire);
        if let Some(found) = self.find(controller, len) {
            return Some(found);
        }
        let slot = self.controllers.get(len)?;
        let stats = slot.get_or_init(|| {
            Arc::new(Stats {
                name: controller.into(),
                sketch: sketch::Sketch::default(),
                near_misses: AtomicU64::new(0),
                hangs_ended: AtomicU64::new(0),
                log: LogLimit::default(),
                epoch: self.epoch,
            })
        });
        self.len.store(len + 1, Ordering::Release);
        Some(stats)
    }

    /// The stats of `controller`, if it has any.
    fn get(&self, controller: &str) -> Option<&Stats> {
        self.find(controller, self.len.load(Ordering::Acquire))
            .map(|s| &**s)
    }

    fn find(&self, controller: &str, len: usize) -> Option<&Arc<Stats>> {
        self.controllers[..len]
            .iter()
            .filter_map(OnceLock::get)
            .find(|s| &*s.name == controller)
    }

    /// Every tracked controller's stats, in the order first seen.
    fn all(&self) -> impl Iterator<Item = &Stats> {
        let len = self.len.load(Ordering::Acquire);
        self.controllers[..len]
            .iter()
            .filter_map(OnceLock::get)
            .map(|s| &**s)
    }

    /// The JSON view of `/debug/deadlines`: every controller seen, configured or in
    /// flight in `registry`, with its figures and a suggested deadline.
    #[must_use]
    pub fn report(&self, registry: &crate::guard::Registry) -> Report {
        view::report(self, registry)
    }
}

impl Stats {
    fn near_miss(&self, end: &LateEnd<'_>) {
        self.near_misses.fetch_add(1, Ordering::Relaxed);
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let period = u64::try_from(NEAR_MISS_LOG_PERIOD.as_nanos()).unwrap_or(u64::MAX);
        if let Some(unlogged) = self.log.admit(now, period) {
            warn_near_miss(end, unlogged);
        }
    }
}

impl Observer for Advisor {
    fn controller(&self, controller: &str, _kind: &str) -> Option<Arc<dyn ControllerObserver>> {
        Some(match self.stats(controller) {
            Some(stats) => Arc::clone(stats) as Arc<dyn ControllerObserver>,
            None => Arc::new(Untracked(Arc::clone(&self.untracked))),
        })
    }
}

/// Each end of a tracked controller lands in its own stats, resolved with its handle.
impl ControllerObserver for Stats {
    fn finished(&self, outcome: Outcome, elapsed: Duration) {
        // A cancelled or dropped reconcile did not run to its end: its duration says
        // only when it was stopped, not how long it would have taken.
        if matches!(outcome, Outcome::Ok | Outcome::Error | Outcome::Panic) {
            self.sketch.record(elapsed);
        }
    }

    fn ended_late(&self, end: &LateEnd<'_>) {
        if end.reported_hung {
            self.hangs_ended.fetch_add(1, Ordering::Relaxed);
            // A hang says nothing of how long honest work takes: one released after an
            // hour would make the advisor suggest hours. `finished` sketched it just now.
            if matches!(end.outcome, Outcome::Ok | Outcome::Error | Outcome::Panic) {
                self.sketch.forget(end.elapsed);
            }
        }
        if end.is_near_miss() {
            self.near_miss(end);
        }
    }
}

/// The ends of a controller beyond [`MAX_CONTROLLERS`]: counted only.
struct Untracked(Arc<AtomicU64>);

impl ControllerObserver for Untracked {
    fn finished(&self, _: Outcome, _: Duration) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Lets one near-miss WARN through per period, and counts the others.
#[derive(Debug, Default)]
struct LogLimit {
    /// When the last WARN was let through, in nanoseconds since the advisor's epoch
    /// plus one (0: never).
    last: AtomicU64,
    unlogged: AtomicU64,
}

impl LogLimit {
    /// Whether a near miss at `now` (nanoseconds since the epoch) is logged and, if
    /// so, how many were not logged since the previous one.
    fn admit(&self, now: u64, period: u64) -> Option<u64> {
        let last = self.last.load(Ordering::Relaxed);
        let recent = last != 0 && now.saturating_sub(last - 1) < period;
        if recent
            || self
                .last
                .compare_exchange(
                    last,
                    now.saturating_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.unlogged.swap(0, Ordering::Relaxed))
    }
}

fn warn_near_miss(end: &LateEnd<'_>, unlogged: u64) {
    let share = end.elapsed.as_secs_f64() / end.deadline.as_secs_f64().max(f64::MIN_POSITIVE);
    let elapsed = suggest::show(end.elapsed);
    let deadline = suggest::show(end.deadline);
    tracing::warn!(
        target: TARGET,
        controller = end.controller,
        object = %end.object,
        kind = end.kind,
        elapsed = %elapsed,
        deadline = %deadline,
        share = %format!("{:.0}%", share * 100.0),
        outcome = %end.outcome,
        unlogged,
        "reconcile near miss: {} {} took {elapsed}, {:.0}% of its {deadline} deadline; \
         see /debug/deadlines for a suggested deadline",
        end.controller,
        end.object,
        share * 100.0,
    );
}

/// The share of `deadlines` as a flag value: `80%`, or `off`.
#[must_use]
pub(crate) fn threshold_text(deadlines: &Deadlines) -> String {
    deadlines
        .near_miss()
        .map_or_else(|| "off".to_owned(), |share| format!("{}%", share * 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::{ObjectKey, Registry};

    #[test]
    fn the_report_counts_each_controllers_reconciles() {
        let advisor = Advisor::new();
        let registry = Registry::with_observer(Duration::from_secs(60), advisor.clone());
        let web = registry.controller("web", "Deployment");
        web.register(ObjectKey::namespaced("default", "app"))
            .finish(Outcome::Ok);
        let report = advisor.report(&registry);
        assert_eq!(report.controllers[0].controller, "web");
        assert_eq!(report.controllers[0].reconciles, 1);
        assert_eq!(report.controllers[0].flag, None); // too few reconciles to suggest one
    }

    #[test]
    fn the_log_limit_lets_one_through_per_period_and_counts_the_rest() {
        let limit = LogLimit::default();
        assert_eq!(limit.admit(0, 100), Some(0));
        assert_eq!(limit.admit(50, 100), None);
        assert_eq!(limit.admit(99, 100), None);
        assert_eq!(limit.admit(100, 100), Some(2));
        assert_eq!(limit.admit(150, 100), None);
        assert_eq!(limit.admit(1_000, 100), Some(1));
        assert_eq!(limit.admit(1_001, 100), None);
    }

    #[test]
    fn ends_are_sketched_and_near_misses_counted_per_controller() {
        let advisor = Advisor::new();
        let registry = Registry::with_observer(
            Deadlines::new(Duration::from_secs(60)).with("quick", Duration::from_millis(10)),
            advisor.clone(),
        );
        let quick = registry.controller("quick", "Widget");
        let guard = quick.register(ObjectKey::cluster("a"));
        std::thread::sleep(Duration::from_millis(9));
        guard.finish(Outcome::Ok);
        quick
            .register(ObjectKey::cluster("b"))
            .finish(Outcome::Error);
        drop(quick.register(ObjectKey::cluster("c")));
        registry
            .controller("slow", "Widget")
            .register(ObjectKey::cluster("d"))
            .finish(Outcome::Ok);

        let quick = advisor.stats("quick").unwrap();
        // The dropped one is not sketched; the 9 ms one is a near miss, unless the
        // machine was slow enough to make it late (past 10 ms), which is no near miss.
        assert_eq!(quick.sketch.summary().count(), 2);
        let elapsed = quick.sketch.summary().max();
        let want =
            u64::from(elapsed > Duration::from_millis(8) && elapsed <= Duration::from_millis(10));
        assert_eq!(
            quick.near_misses.load(Ordering::Relaxed),
            want,
            "{elapsed:?}"
        );
        assert_eq!(
            advisor
                .stats("slow")
                .unwrap()
                .near_misses
                .load(Ordering::Relaxed),
            0
        );
        assert_eq!(advisor.all().count(), 2);
    }

    #[test]
    fn a_near_miss_is_an_on_time_end_never_reported_hung() {
        let advisor = Advisor::new();
        let object = ObjectKey::namespaced("ns", "a");
        let end = |elapsed_ms, reported_hung| LateEnd {
            controller: "jobs",
            kind: "Job",
            object: &object,
            outcome: Outcome::Ok,
            elapsed: Duration::from_millis(elapsed_ms),
            deadline: Duration::from_millis(1_000),
            reported_hung,
        };
        let observer = advisor.controller("jobs", "Job").unwrap();
        observer.ended_late(&end(850, false));
        observer.ended_late(&end(1_000, false));
        observer.ended_late(&end(1_001, false));
        observer.finished(Outcome::Ok, Duration::from_millis(5_000));
        observer.ended_late(&end(5_000, true));
        let jobs = advisor.stats("jobs").unwrap();
        assert_eq!(jobs.sketch.summary().count(), 0, "the hang is left out");
        assert_eq!(jobs.near_misses.load(Ordering::Relaxed), 2);
        assert_eq!(jobs.hangs_ended.load(Ordering::Relaxed), 1);
        // The first near miss was logged, the second counted for the next WARN.
        assert_eq!(jobs.log.unlogged.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn past_the_cap_controllers_are_only_counted() {
        let advisor = Advisor::new();
        let end = |controller: &str| {
            advisor
                .controller(controller, "K")
                .unwrap()
                .finished(Outcome::Ok, Duration::from_millis(1));
        };
        for i in 0..=MAX_CONTROLLERS {
            end(&format!("c{i}"));
        }
        end("c0");
        assert_eq!(advisor.all().count(), MAX_CONTROLLERS);
        assert_eq!(advisor.untracked.load(Ordering::Relaxed), 1);
        assert_eq!(advisor.stats("c0").unwrap().sketch.summary().count(), 2);
    }
}
