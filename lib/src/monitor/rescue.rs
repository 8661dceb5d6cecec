//! The runtime rescue between scans: samples the watched runtime's workers and wakes an
//! idle one when a worker publishes nothing for a while.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::heartbeat::RuntimeHeartbeat;
use super::observer::DriverWakes;
use super::report;
use super::sched::{self, SchedStat};
use super::verdict::driver::{
    Ask, Cause, Culprit, DriverWatch, Found, LookupBudget, PollSeen, RescueReports, Wake,
    WakeCause, WorkerSample,
};
use super::waker::Waker;
use crate::guard::{InFlight, PollState, Registry};

/// Wakes by cause, the rescues among them, since the previous scan.
#[derive(Debug, Default)]
pub(super) struct WakeCounts {
    pub(super) rescues: u64,
    pub(super) others: DriverWakes,
}

/// The thread that runs worker `worker` of the runtime of `handle` now, where tokio tells
/// it (`--cfg tokio_unstable`). tokio keeps it under a mutex that a thread takes when it
/// picks up a worker (at start, and after a `block_in_place`): a few instructions, rare.
#[cfg(tokio_unstable)]
fn worker_thread(handle: &tokio::runtime::Handle, worker: usize) -> Option<std::thread::ThreadId> {
    let metrics = handle.metrics();
    (worker < metrics.num_workers())
        .then(|| metrics.worker_thread_id(worker))
        .flatten()
}

/// Without `--cfg tokio_unstable`, tokio does not tell which thread runs a worker.
#[cfg(not(tokio_unstable))]
fn worker_thread(_: &tokio::runtime::Handle, _: usize) -> Option<std::thread::ThreadId> {
    None
}

/// The rescue's threshold, if `after` asks for one and `runtime` has a worker to spare:
/// a current-thread runtime, or one of a single worker, has nobody to wake.
pub(super) fn rescue_after(
    runtime: &RuntimeHeartbeat,
    after: Option<Duration>,
) -> Option<Duration> {
    after.filter(|_| runtime.handle.metrics().num_workers() > 1)
}

/// The monitor as the runtime's sysmon: between scans, a cheap check of the watched
/// runtime's workers wakes an idle one when a worker publishes nothing for a while and
/// may have left tokio's timers and I/O to nobody, and counts the wake as a rescue only
/// when a guarded reconcile holds that worker (see [`verdict::driver`](super::verdict::driver)).
pub(super) struct Rescuer<'a> {
    runtime: &'a RuntimeHeartbeat,
    /// The watched runtime's id, which its threads carry (`ThreadInfo::runtime`).
    runtime_id: tokio::runtime::Id,
    waker: &'a Waker,
    watch: DriverWatch,
    reports: RescueReports,
    budget: LookupBudget,
    samples: Vec<WorkerSample>,
    /// The reconciles inside a long poll at an ask (reused).
    in_poll: Vec<InFlight>,
    next_check: Instant,
    /// Wakes since the previous scan, by cause.
    wakes: WakeCounts,
    /// The scheduler's counts of the watched runtime's threads at the latest check that
    /// saw a worker silent: what a culprit's poll is judged against (preempted or not).
    sched: Vec<(u32, SchedStat)>,
    /// When `sched` was read.
    sched_at: Option<Instant>,
    /// The watched runtime's threads (reused).
    tids: Vec<u32>,
}

impl WakeCounts {
    fn count(&mut self, cause: WakeCause) {
        let counter = match cause {
            WakeCause::Rescue => &mut self.rescues,
            WakeCause::BusyWorker => &mut self.others.busy_worker,
            WakeCause::Preempted => &mut self.others.preempted,
            WakeCause::HeartbeatLate => &mut self.others.heartbeat_late,
            WakeCause::NotLookedUp => &mut self.others.not_looked_up,
        };
        *counter += 1;
    }
}

impl<'a> Rescuer<'a> {
    /// A rescuer when `after` asks for one and the runtime has a worker to spare (see
    /// [`rescue_after`]), waking workers through `waker`.
    pub(super) fn new(
        runtime: &'a RuntimeHeartbeat,
        after: Option<Duration>,
        waker: &'a Waker,
    ) -> Option<Self> {
        let after = rescue_after(runtime, after)?;
        Some(Self {
            runtime,
            runtime_id: runtime.handle.id(),
            waker,
            watch: DriverWatch::new(after, Some(runtime.period))
                .with_coarse_tick(crate::guard::clock::coarse_tick()),
            reports: RescueReports::default(),
            budget: LookupBudget::default(),
            samples: Vec::new(),
            in_poll: Vec::new(),
            next_check: Instant::now(),
            wakes: WakeCounts::default(),
            sched: Vec::new(),
            sched_at: None,
            tids: Vec::new(),
        })
    }

    /// Checks if a check is due at `now`; returns when the next one is.
    pub(super) fn check_if_due(&mut self, now: Instant, registry: &Registry) -> Instant {
        if now >= self.next_check {
            self.check(now, registry);
            self.next_check = now + self.watch.check_every();
        }
        self.next_check
    }

    fn check(&mut self, now: Instant, registry: &Registry) {
        self.runtime.workers(&mut self.samples);
        let age = self.runtime.heartbeat.age(now);
        if let Some(ask) = self.watch.check(now, &self.samples, Some(age)) {
            let found = self.look_up(now, &ask, registry);
            if let Some(wake) = self.watch.settle(now, &ask, found) {
                // The wake first, the report after.
                self.waker.wake_worker();
                self.wakes.count(wake.cause);
                self.report(&wake, now);
            }
        }
        self.sample_sched(now);
        // The rescues held since the previous WARN get theirs once its minute has
        // passed, whether or not another rescue comes.
        if let Some(held) = self.reports.flush(now) {
            report::emit_held_rescues(&held);
        }
    }

    /// Looks for the guarded reconcile that holds the silent worker of `ask`, leaving it
    /// (with any guard nested in it on the same thread) in `in_poll`.
    fn look_up(&mut self, now: Instant, ask: &Ask, registry: &Registry) -> Found {
        self.in_poll.clear();
        let Cause::WorkerSilent { worker, .. } = ask.cause else {
            return Found::NotAsked;
        };
        if !self.budget.allows(now) {
            return Found::NotLookedUp;
        }
        self.budget
            .spend(registry.in_poll_into(now, self.watch.after(), &mut self.in_poll));
        let worker_thread = worker_thread(&self.runtime.handle, worker);
        let (watch, runtime_id) = (&self.watch, self.runtime_id);
        self.in_poll.retain(|r| {
            let PollState::InPoll { since } = r.poll else {
                return false;
            };
            let thread = r.thread.as_ref();
            let on_worker = match (worker_thread, thread) {
                // tokio names the thread that runs the worker now: only a poll on it
                // holds the worker (not one on a thread that left it for
                // `block_in_place`, nor the thread of a `block_on`).
                (Some(worker), Some(thread)) => thread.id == worker,
                // Otherwise a worker is assumed to be any thread of the watched runtime
                // that polls inside a task: that leaves out the thread of a
                // `block_on` (its future is no task), not one in `block_in_place`
                // (whose poll began before its worker last published, unless the
                // worker went silent since; see docs/runtime-rescue.md).
                _ => r.task_id.is_some() && thread.and_then(|t| t.runtime) == Some(runtime_id),
            };
            watch.holds(
                ask,
                now,
                &PollSeen {
                    began: since,
                    on_worker,
                    tid: thread.and_then(|t| t.tid),
                },
            )
        });
        // One worker is one thread: the one in the longest poll (a guard nested in
        // another is on the same thread, and named with it).
        let Some(longest) = self.in_poll.iter().max_by_key(|r| r.last_poll_ago(now)) else {
            return Found::Nobody;
        };
        let tid = longest.thread.as_ref().and_then(|t| t.tid);
        let name = longest.thread.as_ref().map(|t| Arc::clone(&t.name));
        let began = longest.last_poll_began;
        self.in_poll.retain(|r| {
            r.thread.as_ref().and_then(|t| t.tid) == tid
                && r.thread.as_ref().map(|t| &t.name) == name.as_ref()
        });
        // In a long poll, but waiting for a CPU: the node is contended, the reconcile
        // holds the worker no more than any thread the kernel put aside would.
        if tid.is_some_and(|tid| self.preempted(tid, began)) {
            return Found::Preempted { tid };
        }
        Found::Culprit { tid }
    }

    /// Whether thread `tid`, in a poll that began at `began`, waited for a CPU more than
    /// it ran since the previous check's reading (when that was taken inside the poll),
    /// or else over a short window now ([`sched::is_preempted`]).
    fn preempted(&self, tid: u32, began: Option<Instant>) -> bool {
        let before = self
            .sched_at
            .filter(|at| began.is_some_and(|began| *at >= began))
            .and_then(|_| self.sched.iter().find(|(t, _)| *t == tid))
            .map(|(_, stat)| *stat);
        match (before, SchedStat::read(tid)) {
            (Some(before), Some(now)) => sched::waited_more_than_ran(before, now),
            _ => sched::is_preempted(tid),
        }
    }

    /// Reads the scheduler's counts of the watched runtime's threads while a worker is
    /// silent (a poll may be holding it), so that the next check's lookup can tell a
    /// preempted poll from a blocking one over the time between; forgets them otherwise.
    fn sample_sched(&mut self, now: Instant) {
        self.sched.clear();
        self.sched_at = None;
        if !self
            .watch
            .sees_a_worker_silent_for(self.watch.check_every())
        {
            return;
        }
        crate::guard::tids_of_runtime(self.runtime_id, &mut self.tids);
        self.sched.extend(
            self.tids
                .iter()
                .filter_map(|&tid| Some((tid, SchedStat::read(tid)?))),
        );
        self.sched_at = Some(now);
    }

    fn report(&mut self, wake: &Wake, now: Instant) {
        if wake.cause != WakeCause::Rescue {
            // It kept timers going, and names nobody: a busy worker, or a late
            // heartbeat, is no fault of a reconcile.
            tracing::debug!(
                target: report::RUNTIME_TARGET,
                cause = wake.cause.label(),
                timers_late_up_to = ?wake.unattended,
                idle_workers = wake.idle,
                workers = wake.workers,
                "woke an idle worker to drive timers and I/O; no guarded reconcile held a worker in one poll"
            );
            return;
        }
        let culprits = self.in_poll.iter().map(|r| Culprit {
            controller: Arc::clone(&r.controller),
            object: r.object.clone(),
            in_poll_for: r.last_poll_ago(now).unwrap_or_default(),
        });
        if let Some(held) = self.reports.rescue(now, culprits) {
            report::emit_driver_rescue(wake, &self.in_poll, now, &held);
        }
    }

    /// Whether, at the latest check, a worker had published nothing for the rescue's
    /// threshold (see [`DriverWatch::sees_a_worker_silent_for`]).
    pub(super) fn sees_a_silent_worker(&self) -> bool {
        self.watch.sees_a_worker_silent_for(self.watch.after())
    }

    /// The wakes counted since the previous call, for the scan's observer.
    pub(super) fn take_wakes(&mut self) -> WakeCounts {
        std::mem::take(&mut self.wakes)
    }

    /// The monitor stops: the rescues held are reported now, not lost.
    pub(super) fn flush_all(&mut self) {
        if let Some(held) = self.reports.take() {
            report::emit_held_rescues(&held);
        }
    }
}
