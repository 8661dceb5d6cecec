//! When to wake an idle worker so that tokio's timers and I/O are driven again.
//!
//! tokio's multi-thread runtime has one I/O-and-timer driver, driven by whichever idle
//! worker parks on it. A worker that leaves the driver to run a task and then blocks
//! inside that task's poll leaves it to nobody: the other workers sleep on condition
//! variables, and every timer and socket of the process waits for the poll to return.
//! The monitor plays the part of Go's sysmon: from its own thread it reads each worker's
//! stable tokio metrics and, when one worker has sat in one poll for
//! [`DriverWatch::after`] while another is idle, or when the runtime's heartbeat is
//! late, it wakes an idle worker (a spawned no-op task is enough: with no more work, the
//! woken worker parks on the free driver). This module decides when; it reads no clock
//! and no runtime of its own, so tests drive it with an injected clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::guard::ObjectKey;
use crate::monitor::summary::{NAMED, same_name};

/// One worker of the runtime, as its stable metrics show it at one check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerSample {
    /// tokio's `worker_park_unpark_count`: odd while the worker is parked (idle), even
    /// while it runs; it changes at each park and each wake.
    pub park_unpark: u64,
    /// tokio's `worker_total_busy_duration` in nanoseconds: a worker running many tasks
    /// publishes it every 61 polls, a worker inside one poll never does.
    pub busy_ns: u64,
}

impl WorkerSample {
    /// Whether the worker is parked (idle).
    #[must_use]
    pub fn is_idle(self) -> bool {
        self.park_unpark % 2 == 1
    }
}

/// Why the watch wakes an idle worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A worker has run without parking and without publishing any progress for this
    /// long: it is inside one poll, and it may have left the driver to nobody.
    WorkerInOnePoll {
        /// The worker's index in tokio's metrics.
        worker: usize,
    },
    /// The runtime's heartbeat (a tokio interval) is late by more than two periods.
    HeartbeatLate {
        /// The heartbeat's age.
        age: Duration,
    },
}

/// A decision to wake an idle worker now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rescue {
    /// Why.
    pub cause: Cause,
    /// How long timers and I/O may have gone undriven: since the stuck worker was first
    /// seen in its poll, or the heartbeat's age.
    pub unattended: Duration,
    /// Workers parked at the check.
    pub idle: usize,
    /// Workers of the runtime.
    pub workers: usize,
}

/// What the watch remembers of one worker between checks.
#[derive(Clone, Copy, Debug)]
struct Seen {
    sample: WorkerSample,
    /// The first check that saw `sample`.
    since: Instant,
    /// Whether this stretch of the worker has had its rescue.
    rescued: bool,
}

/// A check this much later than the previous one (or two `after`s, if longer) follows
/// a pause of the monitor: long enough that a loaded node's late wake-ups are not
/// taken for one.
const PAUSE: Duration = Duration::from_millis(250);

/// The decision, with the memory it needs between checks.
#[derive(Debug)]
pub struct DriverWatch {
    after: Duration,
    heartbeat_period: Option<Duration>,
    workers: Vec<Seen>,
    /// Whether the current late stretch of the heartbeat has had its rescue.
    heartbeat_rescued: bool,
    last_rescue: Option<Instant>,
    last_check: Option<Instant>,
}

impl DriverWatch {
    /// A watch that wakes an idle worker once a worker has sat in one poll for `after`
    /// (checked every [`check_every`](Self::check_every)), or once the heartbeat beating
    /// every `heartbeat_period` is two periods late.
    #[must_use]
    pub fn new(after: Duration, heartbeat_period: Option<Duration>) -> Self {
        Self {
            after,
            heartbeat_period,
            workers: Vec::new(),
            heartbeat_rescued: false,
            last_rescue: None,
            last_check: None,
        }
    }

    /// How often to check: half of how long a worker may sit in one poll, so that a worker is rescued
    /// between `after` and one and a half times `after` into its poll.
    #[must_use]
    pub fn check_every(&self) -> Duration {
        (self.after / 2).max(Duration::from_millis(1))
    }

    /// One check at `now` of the runtime's `workers` (in tokio's worker order) and its
    /// heartbeat's `heartbeat_age`. Wakes at most once per stretch of a worker in one
    /// poll and once per late stretch of the heartbeat, never twice within `after`, and
    /// never when no worker is idle (then nobody can take the driver; a stall that
    /// lasts is the stall verdict's to report).
    pub fn check(
        &mut self,
        now: Instant,
        workers: &[WorkerSample],
        heartbeat_age: Option<Duration>,
    ) -> Option<Rescue> {
        // A check far later than planned: the monitor itself did not run (the process
        // was paused, or a scan took long). What the workers did meanwhile is unknown,
        // and the heartbeat's age counts the pause: start afresh, and let a late
        // heartbeat ask only once it has been on time again.
        let gap = self
            .last_check
            .replace(now)
            .map(|at| now.saturating_duration_since(at));
        if gap.is_some_and(|gap| gap > (self.after * 2).max(PAUSE)) {
            self.workers.clear();
            self.heartbeat_rescued = true;
        }
        if self.workers.len() != workers.len() {
            self.workers = workers
                .iter()
                .map(|&sample| Seen {
                    sample,
                    since: now,
                    rescued: false,
                })
                .collect();
        }
        let mut idle = 0;
        // The worker longest in one poll, not rescued yet.
        let mut stuck: Option<(usize, Duration)> = None;
        for (index, (seen, &sample)) in self.workers.iter_mut().zip(workers).enumerate() {
            if seen.sample != sample {
                *seen = Seen {
                    sample,
                    since: now,
                    rescued: false,
                };
            }
            if sample.is_idle() {
                idle += 1;
                continue;
            }
            let in_poll_for = now.saturating_duration_since(seen.since);
            if !seen.rescued
                && in_poll_for >= self.after
                && stuck.is_none_or(|(_, d)| in_poll_for > d)
            {
                stuck = Some((index, in_poll_for));
            }
        }
        let late = match (heartbeat_age, self.heartbeat_period) {
            (Some(age), Some(period)) if age > period * 2 => Some(age),
            _ => None,
        };
        if late.is_none() {
            self.heartbeat_rescued = false;
        }
        if idle == 0
            || self
                .last_rescue
                .is_some_and(|at| now.saturating_duration_since(at) < self.after)
        {
            return None;
        }
        let (cause, unattended) = match (stuck, late) {
            (Some((worker, in_poll_for)), _) => {
                self.workers[worker].rescued = true;
                (Cause::WorkerInOnePoll { worker }, in_poll_for)
            }
            (None, Some(age)) if !self.heartbeat_rescued => (Cause::HeartbeatLate { age }, age),
            _ => return None,
        };
        // One wake serves both: a late heartbeat does not ask again in this stretch.
        self.heartbeat_rescued |= late.is_some();
        self.last_rescue = Some(now);
        Some(Rescue {
            cause,
            unattended,
            idle,
            workers: workers.len(),
        })
    }
}

/// How often the rescue WARN is written at most; rescues in between are held for the
/// next one, their culprits named or counted (and each one counted in the metrics).
pub const RESCUE_REPORT_EVERY: Duration = Duration::from_secs(60);

/// A reconcile inside a poll at a rescue: what the WARN names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Culprit {
    pub(crate) controller: Arc<str>,
    pub(crate) object: ObjectKey,
    /// How long it had been inside its poll (the longest, over the rescues that found it).
    pub(crate) in_poll_for: Duration,
}

/// The rescues not reported at once since the previous WARN, for the next one: the
/// first few culprits named, the others counted per controller, so that the WARN stays
/// bounded and every rescue is in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    /// Rescues held.
    pub(crate) rescues: u64,
    /// The first few culprits, each with how many of the held rescues found it.
    pub(crate) named: Vec<(Culprit, u64)>,
    /// The culprits past the first few, per controller.
    pub(crate) counted: Vec<(Arc<str>, u64)>,
    /// Held rescues counted without looking up their reconciles: the period's lookups
    /// were spent ([`LOOKUPS_PER_REPORT`]).
    pub(crate) unnamed: u64,
    /// Held rescues that warrant a WARN: the others (a worker in one poll with no
    /// reconcile inside one) only ride along in the next one's count.
    reportable: u64,
    /// Held rescues whose reconciles were looked up.
    lookups: u32,
}

/// How many held rescues of one report period may look up the reconciles inside a poll:
/// a lookup reads every entry of the registry (milliseconds at 100,000 in flight), and a
/// storm of blocking polls must not make the monitor do it every 20 ms. Later rescues of
/// the period are counted, unnamed.
pub(crate) const LOOKUPS_PER_REPORT: u32 = 16;

impl Held {
    fn add(&mut self, culprits: impl IntoIterator<Item = Culprit>, reportable: bool) {
        self.rescues += 1;
        self.reportable += u64::from(reportable);
        for culprit in culprits {
            let same = |c: &Culprit| {
                same_name(&c.controller, &culprit.controller) && c.object == culprit.object
            };
            if let Some((named, n)) = self.named.iter_mut().find(|(c, _)| same(c)) {
                named.in_poll_for = named.in_poll_for.max(culprit.in_poll_for);
                *n += 1;
            } else if self.named.len() < NAMED {
                self.named.push((culprit, 1));
            } else if let Some((_, n)) = self
                .counted
                .iter_mut()
                .find(|(c, _)| same_name(c, &culprit.controller))
            {
                *n += 1;
            } else {
                // One per controller: as many as the operator has, whatever its load.
                self.counted.push((culprit.controller, 1));
            }
        }
    }
}

/// Which rescues get a WARN: the first, then at most one per [`RESCUE_REPORT_EVERY`];
/// the others are held for the next WARN, which comes with the next rescue or, if none
/// comes, once the period has passed.
#[derive(Debug, Default)]
pub(crate) struct RescueReports {
    last: Option<Instant>,
    held: Held,
}

impl RescueReports {
    /// Whether a WARN at `now` keeps to the rate.
    fn due(&self, now: Instant) -> bool {
        self.last
            .is_none_or(|at| now.saturating_duration_since(at) >= RESCUE_REPORT_EVERY)
    }

    /// A rescue at `now` that found `culprits` inside a poll; `reportable` unless it is a
    /// worker in one poll with no reconcile inside one (a preempted worker looks the
    /// same). `Some` to report it now, with the rescues held since the previous report;
    /// `None` when it is held.
    pub(crate) fn rescue(
        &mut self,
        now: Instant,
        culprits: impl IntoIterator<Item = Culprit>,
        reportable: bool,
    ) -> Option<Held> {
        if reportable && self.due(now) {
            self.last = Some(now);
            return Some(std::mem::take(&mut self.held));
        }
        self.held.add(culprits, reportable);
        self.held.lookups += 1;
        None
    }

    /// Whether a rescue at `now` should look up the reconciles inside a poll: when a
    /// report is due, or while the period's lookups last.
    pub(crate) fn wants_culprits(&self, now: Instant) -> bool {
        self.due(now) || self.held.lookups < LOOKUPS_PER_REPORT
    }

    /// A rescue held without a lookup (the period's are spent): counted into the next
    /// report's rescues, never a WARN by itself.
    pub(crate) fn hold_unnamed(&mut self) {
        self.held.rescues += 1;
        self.held.unnamed += 1;
    }

    /// The rescues held, once the period since the previous report has passed and one of
    /// them warrants a WARN: reported even if no further rescue comes.
    pub(crate) fn flush(&mut self, now: Instant) -> Option<Held> {
        if self.held.reportable == 0 || !self.due(now) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }

    /// The rescues held that warrant a WARN, whatever the rate: the monitor stops.
    pub(crate) fn take(&mut self) -> Option<Held> {
        (self.held.reportable > 0).then(|| std::mem::take(&mut self.held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn idle(n: u64) -> WorkerSample {
        WorkerSample {
            park_unpark: 2 * n + 1,
            busy_ns: n,
        }
    }

    fn running(n: u64, busy_ns: u64) -> WorkerSample {
        WorkerSample {
            park_unpark: 2 * n,
            busy_ns,
        }
    }

    fn watch() -> DriverWatch {
        DriverWatch::new(20 * MS, Some(500 * MS))
    }

    #[test]
    fn a_worker_in_one_poll_with_another_idle_is_rescued_once() {
        let mut w = watch();
        let t0 = Instant::now();
        let fresh = Some(10 * MS);
        // Worker 0 leaves the driver to run a task; 1 and 2 sleep.
        let workers = [running(5, 100), idle(3), idle(4)];
        assert_eq!(w.check(t0, &workers, fresh), None);
        assert_eq!(w.check(t0 + 10 * MS, &workers, fresh), None);
        let rescue = w.check(t0 + 20 * MS, &workers, fresh).expect("a rescue");
        assert_eq!(
            rescue,
            Rescue {
                cause: Cause::WorkerInOnePoll { worker: 0 },
                unattended: 20 * MS,
                idle: 2,
                workers: 3,
            }
        );
        // The same poll goes on: no second wake, however long.
        for n in 3..100 {
            assert_eq!(w.check(t0 + n * 10 * MS, &workers, fresh), None);
        }
        // The poll returns and the worker parks; a later poll of its own is a new stretch.
        let later = [running(6, 900), idle(3), idle(4)];
        let t1 = t0 + 2 * Duration::from_secs(1);
        assert_eq!(w.check(t1, &later, fresh), None);
        assert!(w.check(t1 + 20 * MS, &later, fresh).is_some());
    }

    #[test]
    fn a_busy_worker_that_publishes_progress_is_left_alone() {
        let mut w = watch();
        let t0 = Instant::now();
        // It never parks, but its busy time moves: it runs many tasks, and drives the
        // driver between them.
        for n in 0..50u32 {
            let workers = [running(5, 1_000 * u64::from(n)), idle(3)];
            assert_eq!(w.check(t0 + n * 10 * MS, &workers, Some(MS)), None);
        }
    }

    #[test]
    fn nobody_is_woken_when_no_worker_is_idle() {
        let mut w = watch();
        let t0 = Instant::now();
        let workers = [running(5, 100), running(7, 200)];
        for n in 0..50 {
            assert_eq!(w.check(t0 + n * 10 * MS, &workers, Some(n * 10 * MS)), None);
        }
        // One worker comes free while the other is still in its poll: it is woken.
        let workers = [running(5, 100), idle(8)];
        let rescue = w.check(t0 + 500 * MS, &workers, Some(500 * MS)).unwrap();
        assert_eq!(rescue.cause, Cause::WorkerInOnePoll { worker: 0 });
        assert_eq!(rescue.unattended, 500 * MS);
    }

    #[test]
    fn a_late_heartbeat_wakes_once_per_late_stretch() {
        let mut w = watch();
        let t0 = Instant::now();
        // Every worker looks idle (a poll too short to see, say), yet timers are late.
        let workers = [idle(1), idle(2)];
        assert_eq!(w.check(t0, &workers, Some(1000 * MS)), None, "two periods");
        let rescue = w.check(t0 + 10 * MS, &workers, Some(1001 * MS)).unwrap();
        assert_eq!(rescue.cause, Cause::HeartbeatLate { age: 1001 * MS });
        assert_eq!(rescue.unattended, 1001 * MS);
        assert_eq!(w.check(t0 + 900 * MS, &workers, Some(1900 * MS)), None);
        // On time again, then late again: a new stretch.
        assert_eq!(
            w.check(t0 + Duration::from_secs(1), &workers, Some(MS)),
            None
        );
        let t1 = t0 + Duration::from_secs(3);
        assert_eq!(w.check(t1 - 10 * MS, &workers, Some(MS)), None);
        assert!(w.check(t1, &workers, Some(2000 * MS)).is_some());
    }

    #[test]
    fn a_rescue_for_a_worker_serves_the_late_heartbeat_too() {
        let mut w = watch();
        let t0 = Instant::now();
        let workers = [running(5, 100), idle(3)];
        assert_eq!(w.check(t0, &workers, Some(MS)), None);
        let rescue = w.check(t0 + 30 * MS, &workers, Some(1200 * MS)).unwrap();
        assert_eq!(rescue.cause, Cause::WorkerInOnePoll { worker: 0 });
        assert_eq!(w.check(t0 + 60 * MS, &workers, Some(1230 * MS)), None);
    }

    #[test]
    fn wakes_are_bounded_in_rate() {
        let mut w = watch();
        let t0 = Instant::now();
        let workers = [running(5, 100), running(6, 100), idle(3)];
        assert_eq!(w.check(t0, &workers, None), None);
        let first = w.check(t0 + 25 * MS, &workers, None).unwrap();
        assert_eq!(first.cause, Cause::WorkerInOnePoll { worker: 0 });
        // Worker 1 is stuck as long, but one wake per `after` at most.
        assert_eq!(w.check(t0 + 30 * MS, &workers, None), None);
        let second = w.check(t0 + 45 * MS, &workers, None).unwrap();
        assert_eq!(second.cause, Cause::WorkerInOnePoll { worker: 1 });
        assert_eq!(second.idle, 1);
    }

    #[test]
    fn the_longest_stuck_worker_is_named() {
        let mut w = watch();
        let t0 = Instant::now();
        assert_eq!(w.check(t0, &[idle(1), running(2, 5), idle(4)], None), None);
        let workers = [running(1, 9), running(2, 5), idle(4)];
        assert_eq!(w.check(t0 + 10 * MS, &workers, None), None);
        let rescue = w.check(t0 + 35 * MS, &workers, None).unwrap();
        assert_eq!(rescue.cause, Cause::WorkerInOnePoll { worker: 1 });
        assert_eq!(rescue.unattended, 35 * MS);
    }

    #[test]
    fn a_pause_of_the_monitor_is_not_taken_for_a_blocked_worker_or_late_timers() {
        let mut w = watch();
        let t0 = Instant::now();
        let workers = [running(5, 100), idle(3)];
        assert_eq!(w.check(t0, &workers, Some(MS)), None);
        // The process stopped for 8 s: every worker looks stuck, the heartbeat old.
        let t1 = t0 + Duration::from_secs(8);
        assert_eq!(w.check(t1, &workers, Some(Duration::from_secs(8))), None);
        assert_eq!(
            w.check(t1 + 10 * MS, &workers, Some(Duration::from_secs(8))),
            None
        );
        // On time again: the heartbeat beats; a worker that then sits in a poll is seen.
        assert_eq!(
            w.check(t1 + 20 * MS, &[running(6, 100), idle(3)], Some(MS)),
            None
        );
        assert_eq!(
            w.check(t1 + 30 * MS, &[running(6, 100), idle(3)], Some(MS)),
            None
        );
        let rescue = w.check(t1 + 40 * MS, &[running(6, 100), idle(3)], Some(MS));
        assert_eq!(
            rescue.map(|r| r.cause),
            Some(Cause::WorkerInOnePoll { worker: 0 })
        );
    }

    fn culprit(controller: &str, object: &str, in_poll_ms: u32) -> Culprit {
        Culprit {
            controller: controller.into(),
            object: ObjectKey::namespaced("ns", object),
            in_poll_for: in_poll_ms * MS,
        }
    }

    #[test]
    fn one_rescue_report_a_minute_holds_the_rest_for_the_next() {
        let mut reports = RescueReports::default();
        let t0 = Instant::now();
        assert_eq!(
            reports.rescue(t0, [culprit("web", "a", 30)], true),
            Some(Held::default())
        );
        assert_eq!(
            reports.rescue(t0 + MS, [culprit("web", "b", 25)], true),
            None
        );
        assert_eq!(
            reports.rescue(t0 + 59 * 1000 * MS, [culprit("db", "c", 40)], true),
            None
        );
        let held = reports
            .rescue(t0 + RESCUE_REPORT_EVERY, [culprit("web", "d", 20)], true)
            .expect("a minute later, a report");
        assert_eq!(held.rescues, 2);
        assert_eq!(
            held.named,
            [(culprit("web", "b", 25), 1), (culprit("db", "c", 40), 1)]
        );
        assert!(held.counted.is_empty());
        // The report took them: the next holds afresh.
        assert_eq!(
            reports.rescue(t0 + RESCUE_REPORT_EVERY + MS, [], true),
            None
        );
        assert_eq!(
            reports.rescue(t0 + 2 * RESCUE_REPORT_EVERY, [], true),
            Some(Held {
                rescues: 1,
                reportable: 1,
                lookups: 1,
                ..Held::default()
            })
        );
    }

    #[test]
    fn held_rescues_are_reported_once_the_period_passes_without_another() {
        let mut reports = RescueReports::default();
        let t0 = Instant::now();
        assert!(
            reports
                .rescue(t0, [culprit("web", "a", 30)], true)
                .is_some()
        );
        assert_eq!(reports.flush(t0 + MS), None, "nothing held");
        assert_eq!(
            reports.rescue(t0 + MS, [culprit("web", "b", 25)], true),
            None
        );
        assert_eq!(
            reports.flush(t0 + RESCUE_REPORT_EVERY - MS),
            None,
            "too soon"
        );
        let held = reports.flush(t0 + RESCUE_REPORT_EVERY).expect("flushed");
        assert_eq!(held.rescues, 1);
        assert_eq!(held.named, [(culprit("web", "b", 25), 1)]);
        assert_eq!(reports.flush(t0 + 2 * RESCUE_REPORT_EVERY), None, "taken");
        // The flush was a report: the next rescue within its minute is held.
        assert_eq!(
            reports.rescue(
                t0 + RESCUE_REPORT_EVERY + MS,
                [culprit("web", "c", 25)],
                true
            ),
            None
        );
        assert_eq!(reports.take().map(|h| h.rescues), Some(1));
        assert_eq!(reports.take(), None);
    }

    #[test]
    fn rescues_without_a_reconcile_in_a_poll_are_counted_but_never_warned_alone() {
        let mut reports = RescueReports::default();
        let t0 = Instant::now();
        // Quiet even when due, and it does not use up the report.
        assert_eq!(reports.rescue(t0, [], false), None);
        assert_eq!(reports.flush(t0 + 2 * RESCUE_REPORT_EVERY), None);
        assert_eq!(reports.take(), None);
        let held = reports
            .rescue(t0 + MS, [culprit("web", "a", 30)], true)
            .expect("the first report");
        assert_eq!(held.rescues, 1, "the quiet one rides along in its count");
        assert!(held.named.is_empty());
    }

    #[test]
    fn held_culprits_are_named_a_few_and_counted_per_controller() {
        let mut reports = RescueReports::default();
        let t0 = Instant::now();
        assert!(reports.rescue(t0, [], true).is_some());
        // One object blocking again and again is named once, with its count.
        for n in 1..=3 {
            let at = t0 + n * MS;
            assert_eq!(
                reports.rescue(at, [culprit("web", "again", 20 + n)], true),
                None
            );
        }
        for i in 0..1000 {
            let controller = if i % 4 == 0 { "db" } else { "web" };
            let at = t0 + 10 * MS;
            let found = [culprit(controller, &format!("o-{i}"), 25)];
            assert_eq!(reports.rescue(at, found, true), None);
        }
        let held = reports.flush(t0 + RESCUE_REPORT_EVERY).expect("flushed");
        assert_eq!(held.rescues, 1003);
        assert_eq!(held.named.len(), NAMED);
        assert_eq!(held.named[0], (culprit("web", "again", 23), 3));
        assert_eq!(held.named[1], (culprit("db", "o-0", 25), 1));
        assert_eq!(held.named[4], (culprit("web", "o-3", 25), 1));
        assert_eq!(
            held.counted,
            [(Arc::from("db"), 249), (Arc::from("web"), 747)]
        );
    }

    #[test]
    fn held_rescues_past_the_lookup_budget_are_counted_without_a_lookup() {
        let mut reports = RescueReports::default();
        let t0 = Instant::now();
        assert!(reports.wants_culprits(t0));
        assert!(
            reports
                .rescue(t0, [culprit("web", "a", 30)], true)
                .is_some()
        );
        for i in 0..LOOKUPS_PER_REPORT {
            assert!(reports.wants_culprits(t0 + MS), "lookup {i}");
            let found = [culprit("web", &format!("o-{i}"), 25)];
            assert_eq!(reports.rescue(t0 + MS, found, true), None);
        }
        assert!(
            !reports.wants_culprits(t0 + MS),
            "the period's lookups are spent"
        );
        reports.hold_unnamed();
        reports.hold_unnamed();
        assert!(
            reports.wants_culprits(t0 + RESCUE_REPORT_EVERY),
            "a report is due: it names what it reports"
        );
        let held = reports.flush(t0 + RESCUE_REPORT_EVERY).expect("flushed");
        assert_eq!(held.rescues, u64::from(LOOKUPS_PER_REPORT) + 2);
        assert_eq!(held.unnamed, 2);
        assert_eq!(held.named.len(), NAMED);
        // The budget is per report period.
        assert!(reports.wants_culprits(t0 + RESCUE_REPORT_EVERY + MS));
    }

    #[test]
    fn a_watch_without_heartbeat_judges_workers_alone() {
        let mut w = DriverWatch::new(20 * MS, None);
        let t0 = Instant::now();
        let workers = [idle(1), idle(2)];
        assert_eq!(w.check(t0, &workers, Some(Duration::from_secs(60))), None);
        assert_eq!(w.check_every(), 10 * MS);
    }
}
