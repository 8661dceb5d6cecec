//! When to wake an idle worker so that tokio's timers and I/O are driven again, and
//! which wakes are rescues of a reconcile that holds a worker.
//!
//! tokio's multi-thread runtime has one I/O-and-timer driver, driven by whichever idle
//! worker parks on it. A worker that leaves the driver to run a task and then blocks
//! inside that task's poll leaves it to nobody: the other workers sleep on condition
//! variables, and every timer and socket of the process waits for the poll to return.
//! The monitor plays the part of Go's sysmon: from its own thread it reads each worker's
//! stable tokio metrics and, when one worker has published nothing for
//! [`DriverWatch::after`] while another is idle, or when the runtime's heartbeat is
//! late, it wakes an idle worker (a spawned no-op task is enough: with no more work, the
//! woken worker parks on the free driver).
//!
//! A worker that publishes nothing is not always blocked: a busy worker publishes its
//! busy time only when it parks and at its maintenance, every `event_interval` (61)
//! scheduler ticks, and runs many short polls in between. So a wake is counted as a
//! rescue only once a guarded reconcile is confirmed to hold the worker: inside one poll
//! for at least `after`, on a thread of the watched runtime, in a poll that began after
//! the worker last published ([`DriverWatch::holds`]). Every other wake keeps timers
//! going and is counted by its cause ([`WakeCause`]). This module decides; it reads no
//! clock, no registry and no runtime of its own, so tests drive it with an injected
//! clock.

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
    /// tokio's `worker_total_busy_duration` in nanoseconds: published when the worker
    /// parks and at its maintenance (every `event_interval` scheduler ticks, 61 by
    /// default, each tick one task taken from a queue); a worker inside one poll never
    /// publishes it.
    pub busy_ns: u64,
}

impl WorkerSample {
    /// Whether the worker is parked (idle).
    #[must_use]
    pub fn is_idle(self) -> bool {
        self.park_unpark % 2 == 1
    }
}

/// Why the watch asks for a wake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A worker has run without parking and without publishing anything for at least
    /// `after`: inside one poll, or busy with many; it may have left the driver to
    /// nobody.
    WorkerSilent {
        /// The worker's index in tokio's metrics.
        worker: usize,
        /// The check before the first one that saw the worker's current metrics: it last
        /// published after this (`None` when the watch has no earlier check).
        published_after: Option<Instant>,
    },
    /// The runtime's heartbeat (a tokio interval) is late by more than two periods.
    HeartbeatLate {
        /// The heartbeat's age.
        age: Duration,
    },
}

/// A check's request: look for the reconcile that holds the silent worker (when the
/// cause is one), then [`DriverWatch::settle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// Why.
    pub cause: Cause,
    /// Whether a wake follows whatever the look finds: the first ask of a worker's
    /// silent stretch and a late heartbeat's. A later ask of the same stretch (a
    /// reconcile may have begun its blocking poll after the first) wakes only for a
    /// confirmed culprit.
    pub wakes_anyway: bool,
    /// How long timers and I/O may have gone undriven, if the silent worker was
    /// driving them: since the check before the worker was first seen silent (it
    /// published after it), or the heartbeat's age.
    pub unattended: Duration,
    /// Workers parked at the check.
    pub idle: usize,
    /// Workers of the runtime.
    pub workers: usize,
    /// Whether the heartbeat was late at the check too.
    heartbeat_late: bool,
}

/// What the monitor found for an [`Ask`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// A guarded reconcile holds the silent worker ([`DriverWatch::holds`]), polled on
    /// the thread of this kernel id.
    Culprit {
        /// The culprit's thread, so that another silent worker is not given it too.
        tid: Option<u32>,
    },
    /// A guarded reconcile is in one long poll on the silent worker, but its thread
    /// waits for a CPU rather than running or waiting in the kernel: preempted (a
    /// contended node), not blocking.
    Preempted {
        /// The preempted thread.
        tid: Option<u32>,
    },
    /// The reconciles were looked up, and none holds the worker.
    Nobody,
    /// Not looked up: the period's lookup budget is spent ([`LookupBudget`]).
    NotLookedUp,
    /// Nothing to look up (a late heartbeat).
    NotAsked,
}

/// Why an idle worker was woken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WakeCause {
    /// A guarded reconcile held a worker in one poll past `after`: a rescue.
    Rescue,
    /// A worker published nothing for `after` with no guarded reconcile holding it: busy
    /// with many polls, or blocked outside any guard.
    BusyWorker,
    /// The guarded reconcile in one long poll on the silent worker was not running: its
    /// thread waited for a CPU (a contended node).
    Preempted,
    /// The heartbeat was late, with no silent worker to look at.
    HeartbeatLate,
    /// A silent worker whose reconciles were not looked up (the lookup budget was
    /// spent).
    NotLookedUp,
}

impl WakeCause {
    /// The `cause` label of the wakes that are not rescues.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Rescue => "rescue",
            Self::BusyWorker => "busy_worker",
            Self::Preempted => "preempted",
            Self::HeartbeatLate => "heartbeat_late",
            Self::NotLookedUp => "not_looked_up",
        }
    }
}

/// A decision to wake an idle worker now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wake {
    /// What it is counted as.
    pub cause: WakeCause,
    /// See [`Ask::unattended`].
    pub unattended: Duration,
    /// Workers parked at the check.
    pub idle: usize,
    /// Workers of the runtime.
    pub workers: usize,
}

/// A reconcile inside a poll, as [`DriverWatch::holds`] judges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollSeen {
    /// When its poll began, as the guard dated it on the coarse clock (up to a tick
    /// before the poll's real start).
    pub began: Instant,
    /// Whether its thread runs the silent worker: known where tokio names each worker's
    /// thread (`--cfg tokio_unstable`), assumed otherwise of a poll inside a task on a
    /// thread of the watched runtime (see [`Rescuer`](crate::monitor)'s lookup). A poll
    /// on the thread of a `block_on`, outside any task, never is.
    pub on_worker: bool,
    /// Its thread's kernel id.
    pub tid: Option<u32>,
}

/// What the watch remembers of one worker between checks.
#[derive(Clone, Copy, Debug)]
struct Seen {
    sample: WorkerSample,
    /// The first check that saw `sample`.
    since: Instant,
    /// The check before `since`: the worker published `sample` after it.
    published_after: Option<Instant>,
    /// When this stretch asks again (`None`: at `after`, its first ask).
    next_ask: Option<Instant>,
    /// How long after an unconfirmed ask the next one comes (doubling each time).
    backoff: Duration,
    /// Whether this stretch has had its rescue.
    rescued: bool,
    /// The culprit's thread, once rescued.
    culprit_tid: Option<u32>,
}

impl Seen {
    fn new(sample: WorkerSample, since: Instant, published_after: Option<Instant>) -> Self {
        Self {
            sample,
            since,
            published_after,
            next_ask: None,
            backoff: Duration::ZERO,
            rescued: false,
            culprit_tid: None,
        }
    }
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
    /// How much earlier than the real start a later poll's date may be: the guard dates
    /// polls on the coarse clock, up to one kernel tick behind.
    coarse_tick: Duration,
    workers: Vec<Seen>,
    /// Whether the current late stretch of the heartbeat has had its wake.
    heartbeat_rescued: bool,
    last_wake: Option<Instant>,
    last_check: Option<Instant>,
}

impl DriverWatch {
    /// A watch that wakes an idle worker once a worker has published nothing for `after`
    /// (checked every [`check_every`](Self::check_every)), or once the heartbeat beating
    /// every `heartbeat_period` is two periods late.
    #[must_use]
    pub fn new(after: Duration, heartbeat_period: Option<Duration>) -> Self {
        Self {
            after,
            heartbeat_period,
            coarse_tick: Duration::ZERO,
            workers: Vec::new(),
            heartbeat_rescued: false,
            last_wake: None,
            last_check: None,
        }
    }

    /// The same, judging polls dated by a clock up to `tick` behind the real one (the
    /// guard's coarse clock: one kernel tick, 1 to 10 ms).
    #[must_use]
    pub fn with_coarse_tick(mut self, tick: Duration) -> Self {
        self.coarse_tick = tick;
        self
    }

    /// How long a worker may publish nothing, and a reconcile sit in one poll, before
    /// the watch acts.
    #[must_use]
    pub fn after(&self) -> Duration {
        self.after
    }

    /// Whether, at the latest check, a worker had run without publishing anything for
    /// at least `silent`: inside one poll, or busy with many.
    #[must_use]
    pub fn sees_a_worker_silent_for(&self, silent: Duration) -> bool {
        let Some(at) = self.last_check else {
            return false;
        };
        self.workers.iter().any(|seen| {
            !seen.sample.is_idle() && at.saturating_duration_since(seen.since) >= silent
        })
    }

    /// How often to check: half of `after`, so that a worker is woken between `after`
    /// and one and a half times `after` into its silence.
    #[must_use]
    pub fn check_every(&self) -> Duration {
        (self.after / 2).max(Duration::from_millis(1))
    }

    /// One check at `now` of the runtime's `workers` (in tokio's worker order) and its
    /// heartbeat's `heartbeat_age`. Asks at most once per `after`, and never when no
    /// worker is idle (then nobody can take the driver; a stall that lasts is the stall
    /// verdict's to report). A worker's silent stretch asks first at `after`, then, until
    /// a culprit is confirmed, again after `after`, `2 × after`, `4 × after`...; a late
    /// heartbeat asks once per late stretch. Answer with [`settle`](Self::settle).
    pub fn check(
        &mut self,
        now: Instant,
        workers: &[WorkerSample],
        heartbeat_age: Option<Duration>,
    ) -> Option<Ask> {
        // A check far later than planned: the monitor itself did not run (the process
        // was paused, or a scan took long). What the workers did meanwhile is unknown,
        // and the heartbeat's age counts the pause: start afresh, and let a late
        // heartbeat ask only once it has been on time again.
        let previous = self.last_check.replace(now);
        let gap = previous.map(|at| now.saturating_duration_since(at));
        if gap.is_some_and(|gap| gap > (self.after * 2).max(PAUSE)) {
            self.workers.clear();
            self.heartbeat_rescued = true;
        }
        if self.workers.len() != workers.len() {
            self.workers = workers
                .iter()
                .map(|&sample| Seen::new(sample, now, None))
                .collect();
        }
        let mut idle = 0;
        // The worker longest silent whose stretch asks now.
        let mut silent: Option<(usize, Duration)> = None;
        for (index, (seen, &sample)) in self.workers.iter_mut().zip(workers).enumerate() {
            if seen.sample != sample {
                *seen = Seen::new(sample, now, previous);
            }
            if sample.is_idle() {
                idle += 1;
                continue;
            }
            let silent_for = now.saturating_duration_since(seen.since);
            let due = seen
                .next_ask
                .map_or(silent_for >= self.after, |at| now >= at);
            if !seen.rescued && due && silent.is_none_or(|(_, d)| silent_for > d) {
                silent = Some((index, silent_for));
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
                .last_wake
                .is_some_and(|at| now.saturating_duration_since(at) < self.after)
        {
            return None;
        }
        let (cause, wakes_anyway, unattended) = match (silent, late) {
            (Some((worker, silent_for)), _) => {
                let seen = &self.workers[worker];
                let unattended = seen
                    .published_after
                    .map_or(silent_for, |at| now.saturating_duration_since(at));
                let cause = Cause::WorkerSilent {
                    worker,
                    published_after: seen.published_after,
                };
                (cause, seen.next_ask.is_none(), unattended)
            }
            (None, Some(age)) if !self.heartbeat_rescued => {
                (Cause::HeartbeatLate { age }, true, age)
            }
            _ => return None,
        };
        Some(Ask {
            cause,
            wakes_anyway,
            unattended,
            idle,
            workers: workers.len(),
            heartbeat_late: late.is_some(),
        })
    }

    /// Whether the reconcile in `poll` at `now` holds the worker that `ask` is about:
    /// inside one poll for at least `after`, on a thread of the watched runtime, in a
    /// poll that began after the worker last published (a reconcile whose worker moved
    /// on, as inside `block_in_place`, began before it), and on no thread already named
    /// for another worker still silent.
    #[must_use]
    pub fn holds(&self, ask: &Ask, now: Instant, poll: &PollSeen) -> bool {
        let Cause::WorkerSilent {
            worker,
            published_after,
        } = ask.cause
        else {
            return false;
        };
        // A poll began up to a tick after its date: long only if long from the latest
        // start it may have had.
        let tick = self.coarse_tick;
        let long = now.saturating_duration_since(poll.began + tick) >= self.after;
        let after_publication = published_after.is_none_or(|at| poll.began + tick >= at);
        let named_elsewhere = poll.tid.is_some()
            && self
                .workers
                .iter()
                .enumerate()
                .any(|(i, seen)| i != worker && seen.rescued && seen.culprit_tid == poll.tid);
        poll.on_worker && long && after_publication && !named_elsewhere
    }

    /// What `found` for `ask` (made at `now`) makes of it: a wake, counted by its cause,
    /// or, for a later ask of a stretch that found no culprit, none (the stretch asks
    /// again later).
    pub fn settle(&mut self, now: Instant, ask: &Ask, found: Found) -> Option<Wake> {
        let cause = match ask.cause {
            Cause::HeartbeatLate { .. } => WakeCause::HeartbeatLate,
            Cause::WorkerSilent { worker, .. } => {
                let after = self.after;
                let seen = &mut self.workers[worker];
                if let Found::Culprit { tid } = found {
                    seen.rescued = true;
                    seen.culprit_tid = tid;
                    WakeCause::Rescue
                } else {
                    seen.backoff = (seen.backoff * 2).max(after);
                    seen.next_ask = Some(now + seen.backoff);
                    if !ask.wakes_anyway {
                        return None;
                    }
                    match found {
                        Found::NotLookedUp => WakeCause::NotLookedUp,
                        Found::Preempted { .. } => WakeCause::Preempted,
                        _ => WakeCause::BusyWorker,
                    }
                }
            }
        };
        // One wake serves both: a late heartbeat does not ask again in this stretch.
        self.heartbeat_rescued |= ask.heartbeat_late;
        self.last_wake = Some(now);
        Some(Wake {
            cause,
            unattended: ask.unattended,
            idle: ask.idle,
            workers: ask.workers,
        })
    }
}

/// How many registry entries the rescue's lookups may read per [`LOOKUP_PERIOD`]: a
/// lookup reads one word of every entry (about 5 ms at 100,000 in flight), and a storm
/// of silent workers must not make the monitor do that every 20 ms. 1,600,000 entries
/// are 16 lookups at 100,000 in flight, and 1,600 at 1,000.
pub const LOOKUP_ENTRIES: u64 = 1_600_000;

/// The period of [`LOOKUP_ENTRIES`].
pub const LOOKUP_PERIOD: Duration = Duration::from_secs(60);

/// The rescue's lookup budget: entries read per period.
#[derive(Debug, Default)]
pub struct LookupBudget {
    period_began: Option<Instant>,
    read: u64,
}

impl LookupBudget {
    /// Whether a lookup at `now` keeps to the budget (the last one of a period may
    /// overshoot it by one registry's size).
    pub fn allows(&mut self, now: Instant) -> bool {
        if self
            .period_began
            .is_none_or(|at| now.saturating_duration_since(at) >= LOOKUP_PERIOD)
        {
            self.period_began = Some(now);
            self.read = 0;
        }
        self.read < LOOKUP_ENTRIES
    }

    /// A lookup read `entries`.
    pub fn spend(&mut self, entries: u64) {
        self.read = self.read.saturating_add(entries);
    }
}

/// How often the rescue WARN is written at most; rescues in between are held for the
/// next one, their culprits named or counted (and each one counted in the metrics).
pub const RESCUE_REPORT_EVERY: Duration = Duration::from_secs(60);

/// A reconcile that held a worker at a rescue: what the WARN names.
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
}

impl Held {
    fn add(&mut self, culprits: impl IntoIterator<Item = Culprit>) {
        self.rescues += 1;
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

    /// A rescue at `now` of `culprits`. `Some` to report it now, with the rescues held
    /// since the previous report; `None` when it is held.
    pub(crate) fn rescue(
        &mut self,
        now: Instant,
        culprits: impl IntoIterator<Item = Culprit>,
    ) -> Option<Held> {
        if self.due(now) {
            self.last = Some(now);
            return Some(std::mem::take(&mut self.held));
        }
        self.held.add(culprits);
        None
    }

    /// The rescues held, once the period since the previous report has passed: reported
    /// even if no further rescue comes.
    pub(crate) fn flush(&mut self, now: Instant) -> Option<Held> {
        if self.held.rescues == 0 || !self.due(now) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }

    /// The rescues held, whatever the rate: the monitor stops.
    pub(crate) fn take(&mut self) -> Option<Held> {
        (self.held.rescues > 0).then(|| std::mem::take(&mut self.held))
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

    /// A later poll on a watched worker thread that began at `began`.
    fn poll(began: Instant, tid: u32) -> PollSeen {
        PollSeen {
            began,
            on_worker: true,
            tid: Some(tid),
        }
    }

    /// Checks at `at`, and settles what it asks with `found`.
    fn step(
        w: &mut DriverWatch,
        at: Instant,
        workers: &[WorkerSample],
        age: Option<Duration>,
        found: Found,
    ) -> Option<Wake> {
        let ask = w.check(at, workers, age)?;
        w.settle(at, &ask, found)
    }

    fn culprit_on(tid: u32) -> Found {
        Found::Culprit { tid: Some(tid) }
    }

    #[test]
    fn a_reconcile_holding_its_worker_is_one_rescue() {
        let mut w = watch();
        let t0 = Instant::now();
        let fresh = Some(10 * MS);
        let parked = [idle(5), idle(3), idle(4)];
        assert_eq!(w.check(t0, &parked, fresh), None);
        // Worker 0 leaves the driver to run a task and blocks in its poll; 1 and 2
        // sleep.
        let workers = [running(6, 100), idle(3), idle(4)];
        assert_eq!(w.check(t0 + 10 * MS, &workers, fresh), None);
        assert_eq!(w.check(t0 + 20 * MS, &workers, fresh), None);
        let ask = w.check(t0 + 30 * MS, &workers, fresh).expect("an ask");
        assert_eq!(
            ask.cause,
            Cause::WorkerSilent {
                worker: 0,
                published_after: Some(t0),
            }
        );
        assert!(ask.wakes_anyway);
        // It published after the check at t0: timers may be late by up to 30 ms.
        assert_eq!(ask.unattended, 30 * MS);
        // The reconcile's poll began after the worker last published, 25 ms ago.
        assert!(w.holds(&ask, t0 + 30 * MS, &poll(t0 + 5 * MS, 7)));
        let wake = w.settle(t0 + 30 * MS, &ask, culprit_on(7)).unwrap();
        assert_eq!(
            wake,
            Wake {
                cause: WakeCause::Rescue,
                unattended: 30 * MS,
                idle: 2,
                workers: 3,
            }
        );
        // The same poll goes on: no second wake, however long.
        for n in 4..100 {
            assert_eq!(w.check(t0 + n * 10 * MS, &workers, fresh), None);
        }
        // The poll returns and the worker parks; a later poll of its own is a new stretch.
        let later = [running(7, 900), idle(3), idle(4)];
        let t1 = t0 + 2 * Duration::from_secs(1);
        assert_eq!(w.check(t1, &later, fresh), None);
        assert!(w.check(t1 + 20 * MS, &later, fresh).is_some());
    }

    #[test]
    fn a_busy_worker_is_woken_as_busy_never_as_a_rescue() {
        let mut w = watch();
        let t0 = Instant::now();
        let mut wakes = Vec::new();
        // A worker running many 2 ms polls publishes only at its maintenance, every
        // 120 ms or so; no guarded reconcile is ever inside a poll for 20 ms.
        for n in 0..300u32 {
            let at = t0 + n * 10 * MS;
            let published = u64::from(n / 12);
            let workers = [running(5, published), idle(3), idle(4), idle(6)];
            if let Some(ask) = w.check(at, &workers, Some(MS)) {
                let short = poll(at - 2 * MS, 9);
                assert!(!w.holds(&ask, at, &short));
                wakes.extend(w.settle(at, &ask, Found::Nobody));
            }
        }
        assert!(!wakes.is_empty(), "the wakes go on: they help timers");
        assert!(
            wakes.iter().all(|w| w.cause == WakeCause::BusyWorker),
            "{wakes:?}"
        );
        // One wake per silent stretch (the later asks of a stretch wake nobody).
        assert!(wakes.len() <= 25, "{}", wakes.len());
    }

    #[test]
    fn a_reconcile_that_blocks_late_in_a_silent_stretch_is_a_rescue_at_a_later_ask() {
        let mut w = watch();
        let t0 = Instant::now();
        let workers = [running(5, 100), idle(3)];
        assert_eq!(w.check(t0, &[idle(4), idle(3)], None), None);
        assert_eq!(w.check(t0 + 10 * MS, &workers, None), None);
        // At 30 ms the worker is silent, busy with short polls: woken as busy.
        let first = step(&mut w, t0 + 30 * MS, &workers, None, Found::Nobody).unwrap();
        assert_eq!(first.cause, WakeCause::BusyWorker);
        // Then a reconcile blocks (its poll began at 35 ms). The stretch asks again
        // 20 ms later, then 40 ms after that; nothing found wakes nobody.
        assert_eq!(w.check(t0 + 40 * MS, &workers, None), None);
        let ask = w.check(t0 + 50 * MS, &workers, None).expect("a second ask");
        assert!(!ask.wakes_anyway);
        assert!(
            !w.holds(&ask, t0 + 50 * MS, &poll(t0 + 35 * MS, 7)),
            "15 ms"
        );
        assert_eq!(w.settle(t0 + 50 * MS, &ask, Found::Nobody), None);
        assert_eq!(w.check(t0 + 80 * MS, &workers, None), None);
        let ask = w.check(t0 + 90 * MS, &workers, None).expect("a third ask");
        assert!(w.holds(&ask, t0 + 90 * MS, &poll(t0 + 35 * MS, 7)));
        let rescue = w.settle(t0 + 90 * MS, &ask, culprit_on(7)).unwrap();
        assert_eq!(rescue.cause, WakeCause::Rescue);
        assert_eq!(w.check(t0 + 500 * MS, &workers, None), None, "rescued");
    }

    #[test]
    fn only_a_long_poll_of_the_watched_runtime_that_began_after_the_worker_published_holds_it() {
        // Polls dated on a clock up to 10 ms behind.
        let w = watch().with_coarse_tick(10 * MS);
        let t0 = Instant::now();
        let ask = Ask {
            cause: Cause::WorkerSilent {
                worker: 0,
                published_after: Some(t0 + 100 * MS),
            },
            wakes_anyway: true,
            unattended: 40 * MS,
            idle: 3,
            workers: 4,
            heartbeat_late: false,
        };
        let now = t0 + 140 * MS;
        assert!(w.holds(&ask, now, &poll(t0 + 105 * MS, 1)));
        // Too short a poll, if it began up to a tick after its date.
        assert!(!w.holds(&ask, now, &poll(t0 + 115 * MS, 1)));
        // On a thread of another runtime, or of none.
        let elsewhere = PollSeen {
            on_worker: false,
            ..poll(t0 + 105 * MS, 1)
        };
        assert!(!w.holds(&ask, now, &elsewhere));
        // A poll that began before the worker last published: the worker moved on (as
        // from a reconcile inside `block_in_place`), so the poll does not hold it; the
        // coarse clock's tick is allowed for.
        assert!(!w.holds(&ask, now, &poll(t0 + 80 * MS, 1)));
        assert!(w.holds(&ask, now, &poll(t0 + 95 * MS, 1)));
        // A late heartbeat has no worker to hold.
        let late = Ask {
            cause: Cause::HeartbeatLate { age: MS * 1100 },
            ..ask
        };
        assert!(!w.holds(&late, now, &poll(t0 + 105 * MS, 1)));
    }

    #[test]
    fn a_thread_named_for_one_silent_worker_is_not_named_for_another() {
        let mut w = watch();
        let t0 = Instant::now();
        let workers = [running(5, 100), running(6, 100), idle(3)];
        assert_eq!(w.check(t0, &workers, None), None);
        let first = w.check(t0 + 25 * MS, &workers, None).unwrap();
        assert_eq!(
            first.cause,
            Cause::WorkerSilent {
                worker: 0,
                published_after: None
            }
        );
        let blocker = poll(t0 + MS, 7);
        assert!(w.holds(&first, t0 + 25 * MS, &blocker));
        assert!(w.settle(t0 + 25 * MS, &first, culprit_on(7)).is_some());
        // Worker 1 is as silent, but one wake per `after` at most; then thread 7 is
        // worker 0's, and only another thread can hold worker 1.
        assert_eq!(w.check(t0 + 30 * MS, &workers, None), None);
        let second = w.check(t0 + 45 * MS, &workers, None).unwrap();
        assert!(matches!(
            second.cause,
            Cause::WorkerSilent { worker: 1, .. }
        ));
        assert!(!w.holds(&second, t0 + 45 * MS, &blocker));
        assert!(w.holds(&second, t0 + 45 * MS, &poll(t0 + 2 * MS, 8)));
        let wake = w.settle(t0 + 45 * MS, &second, culprit_on(8)).unwrap();
        assert_eq!(wake.idle, 1);
        assert_eq!(wake.cause, WakeCause::Rescue);
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
        let ask = w.check(t0 + 500 * MS, &workers, Some(500 * MS)).unwrap();
        assert!(matches!(ask.cause, Cause::WorkerSilent { worker: 0, .. }));
        assert_eq!(ask.unattended, 500 * MS);
    }

    #[test]
    fn a_late_heartbeat_wakes_once_per_late_stretch() {
        let mut w = watch();
        let t0 = Instant::now();
        // Every worker looks idle (a poll too short to see, say), yet timers are late.
        let workers = [idle(1), idle(2)];
        assert_eq!(w.check(t0, &workers, Some(1000 * MS)), None, "two periods");
        let ask = w.check(t0 + 10 * MS, &workers, Some(1001 * MS)).unwrap();
        assert_eq!(ask.cause, Cause::HeartbeatLate { age: 1001 * MS });
        let wake = w.settle(t0 + 10 * MS, &ask, Found::NotAsked).unwrap();
        assert_eq!(wake.cause, WakeCause::HeartbeatLate);
        assert_eq!(wake.unattended, 1001 * MS);
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
    fn a_wake_for_a_worker_serves_the_late_heartbeat_too() {
        let mut w = watch();
        let t0 = Instant::now();
        let workers = [running(5, 100), idle(3)];
        assert_eq!(w.check(t0, &workers, Some(MS)), None);
        let wake = step(
            &mut w,
            t0 + 30 * MS,
            &workers,
            Some(1200 * MS),
            Found::Nobody,
        );
        assert_eq!(wake.map(|w| w.cause), Some(WakeCause::BusyWorker));
        // The stretch's later asks wake nobody without a culprit, and the heartbeat's
        // late stretch had its wake.
        for n in 4..20 {
            let at = t0 + n * 15 * MS;
            let age = Some(1200 * MS + n * 15 * MS);
            assert_eq!(step(&mut w, at, &workers, age, Found::Nobody), None);
        }
    }

    #[test]
    fn a_silent_worker_past_the_lookup_budget_is_woken_unlooked() {
        let mut w = watch();
        let t0 = Instant::now();
        let workers = [running(5, 100), idle(3)];
        assert_eq!(w.check(t0, &workers, None), None);
        let wake = step(&mut w, t0 + 20 * MS, &workers, None, Found::NotLookedUp);
        assert_eq!(wake.map(|w| w.cause), Some(WakeCause::NotLookedUp));
        // A later ask, with budget again, may still find the culprit.
        let ask = w.check(t0 + 40 * MS, &workers, None).unwrap();
        let wake = w.settle(t0 + 40 * MS, &ask, culprit_on(3)).unwrap();
        assert_eq!(wake.cause, WakeCause::Rescue);
    }

    #[test]
    fn a_preempted_poll_is_a_wake_of_its_own_and_a_later_block_still_a_rescue() {
        let mut w = watch();
        let t0 = Instant::now();
        let workers = [running(5, 100), idle(3)];
        assert_eq!(w.check(t0, &workers, None), None);
        let preempted = Found::Preempted { tid: Some(7) };
        let wake = step(&mut w, t0 + 20 * MS, &workers, None, preempted);
        assert_eq!(wake.map(|w| w.cause), Some(WakeCause::Preempted));
        assert_eq!(WakeCause::Preempted.label(), "preempted");
        // The stretch asks again; a later ask that finds the thread blocking rescues.
        let ask = w.check(t0 + 40 * MS, &workers, None).unwrap();
        assert!(!ask.wakes_anyway);
        assert_eq!(
            w.settle(t0 + 40 * MS, &ask, preempted),
            None,
            "no second wake"
        );
        let ask = w.check(t0 + 80 * MS, &workers, None).unwrap();
        let wake = w.settle(t0 + 80 * MS, &ask, culprit_on(7)).unwrap();
        assert_eq!(wake.cause, WakeCause::Rescue);
    }

    #[test]
    fn a_silent_worker_is_seen_from_after_on_and_no_longer_once_it_publishes() {
        let mut w = watch();
        let t0 = Instant::now();
        assert!(!w.sees_a_worker_silent_for(20 * MS), "no check yet");
        let workers = [running(5, 100), idle(3)];
        assert_eq!(w.check(t0, &workers, None), None);
        assert_eq!(w.check(t0 + 10 * MS, &workers, None), None);
        assert!(!w.sees_a_worker_silent_for(20 * MS), "10 ms");
        assert!(w.sees_a_worker_silent_for(10 * MS));
        let _ = w.check(t0 + 20 * MS, &workers, None);
        assert!(w.sees_a_worker_silent_for(20 * MS));
        let _ = w.check(t0 + 30 * MS, &[running(5, 200), idle(3)], None);
        assert!(!w.sees_a_worker_silent_for(MS), "it published");
    }

    #[test]
    fn the_lookup_budget_is_entries_read_per_period() {
        let mut budget = LookupBudget::default();
        let t0 = Instant::now();
        for _ in 0..16 {
            assert!(budget.allows(t0));
            budget.spend(100_000);
        }
        assert!(!budget.allows(t0 + 59 * 1000 * MS), "16 lookups of 100,000");
        assert!(budget.allows(t0 + LOOKUP_PERIOD), "a new period");
        for _ in 0..1_599 {
            budget.spend(1_000);
        }
        assert!(budget.allows(t0 + LOOKUP_PERIOD), "1,600 lookups of 1,000");
        budget.spend(1_000);
        assert!(!budget.allows(t0 + LOOKUP_PERIOD));
    }

    #[test]
    fn the_longest_silent_worker_is_asked_for() {
        let mut w = watch();
        let t0 = Instant::now();
        assert_eq!(w.check(t0, &[idle(1), running(2, 5), idle(4)], None), None);
        let workers = [running(1, 9), running(2, 5), idle(4)];
        assert_eq!(w.check(t0 + 10 * MS, &workers, None), None);
        let ask = w.check(t0 + 35 * MS, &workers, None).unwrap();
        assert_eq!(
            ask.cause,
            Cause::WorkerSilent {
                worker: 1,
                published_after: None
            }
        );
        assert_eq!(ask.unattended, 35 * MS);
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
        let ask = w.check(t1 + 40 * MS, &[running(6, 100), idle(3)], Some(MS));
        assert_eq!(
            ask.map(|a| a.cause),
            Some(Cause::WorkerSilent {
                worker: 0,
                published_after: Some(t1 + 10 * MS)
            })
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
            reports.rescue(t0, [culprit("web", "a", 30)]),
            Some(Held::default())
        );
        assert_eq!(reports.rescue(t0 + MS, [culprit("web", "b", 25)]), None);
        assert_eq!(
            reports.rescue(t0 + 59 * 1000 * MS, [culprit("db", "c", 40)]),
            None
        );
        let held = reports
            .rescue(t0 + RESCUE_REPORT_EVERY, [culprit("web", "d", 20)])
            .expect("a minute later, a report");
        assert_eq!(held.rescues, 2);
        assert_eq!(
            held.named,
            [(culprit("web", "b", 25), 1), (culprit("db", "c", 40), 1)]
        );
        assert!(held.counted.is_empty());
        // The report took them: the next holds afresh.
        assert_eq!(reports.rescue(t0 + RESCUE_REPORT_EVERY + MS, []), None);
        assert_eq!(
            reports.rescue(t0 + 2 * RESCUE_REPORT_EVERY, []),
            Some(Held {
                rescues: 1,
                ..Held::default()
            })
        );
    }

    #[test]
    fn held_rescues_are_reported_once_the_period_passes_without_another() {
        let mut reports = RescueReports::default();
        let t0 = Instant::now();
        assert!(reports.rescue(t0, [culprit("web", "a", 30)]).is_some());
        assert_eq!(reports.flush(t0 + MS), None, "nothing held");
        assert_eq!(reports.rescue(t0 + MS, [culprit("web", "b", 25)]), None);
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
            reports.rescue(t0 + RESCUE_REPORT_EVERY + MS, [culprit("web", "c", 25)]),
            None
        );
        assert_eq!(reports.take().map(|h| h.rescues), Some(1));
        assert_eq!(reports.take(), None);
    }

    #[test]
    fn held_culprits_are_named_a_few_and_counted_per_controller() {
        let mut reports = RescueReports::default();
        let t0 = Instant::now();
        assert!(reports.rescue(t0, []).is_some());
        // One object blocking again and again is named once, with its count.
        for n in 1..=3 {
            let at = t0 + n * MS;
            assert_eq!(reports.rescue(at, [culprit("web", "again", 20 + n)]), None);
        }
        for i in 0..1000 {
            let controller = if i % 4 == 0 { "db" } else { "web" };
            let at = t0 + 10 * MS;
            let found = [culprit(controller, &format!("o-{i}"), 25)];
            assert_eq!(reports.rescue(at, found), None);
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
    fn a_watch_without_heartbeat_judges_workers_alone() {
        let mut w = DriverWatch::new(20 * MS, None);
        let t0 = Instant::now();
        let workers = [idle(1), idle(2)];
        assert_eq!(w.check(t0, &workers, Some(Duration::from_secs(60))), None);
        assert_eq!(w.check_every(), 10 * MS);
    }
}
