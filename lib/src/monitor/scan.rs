//! One scan: the registry's snapshot, the verdict's decision, and what it asks done
//! (cancels, reports, the observer told).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::api_server::ApiServerStatus;
use super::heartbeat::RuntimeHeartbeat;
use super::inspect::{Diagnostics, Inspector, StuckThread, is_guard_poll};
use super::observer::{Observer, Scan};
use super::rescue::Rescuer;
use super::status::{Published, Status};
use super::verdict::{Event, Verdict};
use super::waker::Waker;
use super::{cgroup, report, task_dump};
use crate::guard::{InFlight, Registry};
use crate::restart::{self, Cause};

/// What the monitor thread reads besides the registry, and whom it tells.
pub(super) struct Sources<'a> {
    pub(super) diagnostics: &'a Diagnostics,
    pub(super) runtime: Option<&'a RuntimeHeartbeat>,
    pub(super) api_server: Option<&'a ApiServerStatus>,
    pub(super) observer: Option<&'a dyn Observer>,
}

/// The scans' state across ticks: the verdict's memory, the buffers each scan reuses,
/// and what the previous scan left to compare against.
pub(super) struct Scanner<'a> {
    registry: &'a Registry,
    runtime: Option<&'a RuntimeHeartbeat>,
    api_server: Option<&'a ApiServerStatus>,
    observer: Option<&'a dyn Observer>,
    verdict: Verdict,
    snapshot: Vec<InFlight>,
    /// The reconciles in a long poll, when a task dump asks (reused).
    in_poll: Vec<InFlight>,
    counts: Vec<(Arc<str>, usize)>,
    inspector: Inspector,
    /// One small file read a scan, when cgroup v2 tells throttled time.
    cpu_stat: Option<cgroup::CpuStat>,
    throttled_before: Option<Duration>,
    task_traces: task_dump::TaskTraces,
    observer_panicked: bool,
    /// Where each reconcile in `attention` whose stack was captured is stuck: the
    /// innermost frame of the operator's own code, for the restart's [`Cause`] and the
    /// quarantine's record.
    places: Vec<(u64, String)>,
}

impl<'a> Scanner<'a> {
    pub(super) fn new(registry: &'a Registry, verdict: Verdict, sources: &Sources<'a>) -> Self {
        let Sources {
            diagnostics,
            runtime,
            api_server,
            observer,
        } = *sources;
        let inspector = Inspector::new(*diagnostics, registry.clone());
        let cpu_stat = cgroup::CpuStat::find().ok();
        let throttled_before = cpu_stat.as_ref().and_then(|c| c.throttled().ok());
        let task_traces = task_dump::TaskTraces::new(runtime.map(|r| r.handle.clone()));
        Self {
            registry,
            runtime,
            api_server,
            observer,
            verdict,
            snapshot: Vec::new(),
            in_poll: Vec::new(),
            counts: Vec::new(),
            inspector,
            cpu_stat,
            throttled_before,
            task_traces,
            observer_panicked: false,
            places: Vec::new(),
        }
    }

    pub(super) fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// Scans at `now`, planned for `planned`: decides, cancels, reports, tells the
    /// observer (with the wakes `rescuer` counted since the previous scan), and returns
    /// what to publish for the checks.
    pub(super) fn scan(
        &mut self,
        now: Instant,
        planned: Instant,
        status: &Status,
        waker: Option<&Waker>,
        rescuer: Option<&mut Rescuer<'_>>,
    ) -> Published {
        let registry = self.registry;
        let verdict = &mut self.verdict;

        // A scan later than planned: did the process not run meanwhile?
        let throttled_now = self.cpu_stat.as_ref().and_then(|c| c.throttled().ok());
        let throttled = throttled_now
            .zip(self.throttled_before)
            .map(|(after, before)| after.saturating_sub(before));
        self.throttled_before = throttled_now;
        verdict.observe_lateness(now, now.saturating_duration_since(planned), throttled);

        // Ended first: a guard leaves the map before it queues its end, so nothing taken
        // here can still be in the snapshot and be judged hung a second time.
        let ended = registry.take_ended();
        let heartbeat_age = self.runtime.map(|r| r.heartbeat.age(now));
        // The verdict acts only on overdue reconciles, and on those inside a poll when
        // the runtime stalls: copy just those (a scan of 100,000 on-time reconciles then
        // never touches their entries).
        let stalled =
            heartbeat_age.is_some_and(|age| age > verdict.config().runtime_stall_threshold);
        registry.scan_into(now, stalled, &mut self.snapshot, &mut self.counts);
        if let Some(api_server) = self.api_server {
            verdict.observe_api_server(api_server.state());
        }
        let decision = verdict.step(&self.snapshot, ended, heartbeat_age, now);
        if let Some(api_server) = self.api_server
            && decision.ask_api_server
        {
            // New awaits that never woke: is it the API server? Ask now, not at the
            // checker's next turn.
            api_server.ask();
        }

        // `scan_into` has marked every overdue reconcile as reported hung already, under
        // its shard's lock (a second lookup per hang here cost a tenth of a mass scan).
        for id in &decision.cancel {
            match waker {
                Some(waker) => waker.cancel(*id),
                // Not under the cancel policy: no cancel to make.
                None => {
                    registry.request_cancel(*id);
                }
            }
        }
        let sample = self.runtime.map(RuntimeHeartbeat::sample);
        let mut inspected = false;
        for event in &decision.events {
            let threads = self.inspector.inspect(event, now);
            remember_places(&mut self.places, event, &threads);
            let task_trace = self.task_traces.of(event, stalled, || {
                worker_blocked(registry, now, rescuer.as_deref(), &mut self.in_poll)
            });
            report::emit(event, now, sample, &threads, task_trace.as_deref());
            if !threads.is_empty() || task_trace.is_some() {
                inspected = true;
                // Capturing stacks or a task dump is work, not a stall: keep the
                // `watchdog` check from calling it one.
                status.beat.beat(Instant::now());
            }
        }
        if inspected {
            // Resolving freed what it read (symbol names, unwind tables): back to the
            // kernel, so that a pod's memory after a capture is near its rest.
            release_heap_off_thread();
        }
        self.inspector.forget_all_but(&self.snapshot);
        let snapshot = &self.snapshot;
        self.places
            .retain(|(id, _)| snapshot.iter().any(|r| r.id == *id));
        let places = &self.places;
        let cause = Cause::of(&decision, &self.snapshot, now, |r| {
            places
                .iter()
                .find(|(id, _)| *id == r.id)
                .map(|(_, place)| place.clone())
        })
        .map(Arc::new);
        if let Some(observer) = self.observer {
            let wakes = rescuer.map(Rescuer::take_wakes).unwrap_or_default();
            let scan = Scan {
                attention: &self.snapshot,
                in_flight_by_controller: &self.counts,
                decision: &decision,
                took: now.elapsed(),
                runtime_heartbeat_age: heartbeat_age,
                driver_rescues: wakes.rescues,
                driver_wakes: wakes.others,
                cause: cause.as_deref(),
                own_frames: &self.places,
            };
            // The observer is the user's code: its panic must not end the scans.
            let told = std::panic::catch_unwind(AssertUnwindSafe(|| observer.scanned(&scan)));
            if told.is_err() && !self.observer_panicked {
                self.observer_panicked = true;
                tracing::error!(
                    target: report::TARGET,
                    "the monitor's observer panicked; the monitor caught it and scans on (logged once)"
                );
            }
        }
        Published {
            reconcilers_failure: decision.reconcilers_failure,
            runtime_failure: decision.runtime_failure,
            cause,
            overdue: decision.overdue.len(),
        }
    }
}

/// A poll this long holds its worker as far as a task dump is concerned: a dump would
/// make the other workers wait for it.
const HELD_POLL: Duration = Duration::from_millis(10);

/// Whether a worker of the watched runtime is held in one poll now, as far as the
/// monitor can tell: a guarded reconcile inside one poll for [`HELD_POLL`], or a worker
/// the rescue sees silent (which may be in an unguarded poll).
fn worker_blocked(
    registry: &Registry,
    now: Instant,
    rescuer: Option<&Rescuer<'_>>,
    in_poll: &mut Vec<InFlight>,
) -> bool {
    if rescuer.is_some_and(Rescuer::sees_a_silent_worker) {
        return true;
    }
    registry.in_poll_into(now, HELD_POLL, in_poll);
    let held = !in_poll.is_empty();
    in_poll.clear();
    held
}

/// Whether a heap trim runs (see [`release_heap_off_thread`]).
static TRIMMING: AtomicBool = AtomicBool::new(false);

/// Returns the heap the captures' resolving freed to the kernel, on a short-lived thread
/// of its own: glibc's trim locks each arena in turn while it walks its free memory
/// (longer as the heap grows), and the monitor must not wait for workers allocating in
/// them, nor they for it. One trim at a time: one asked while another runs is skipped,
/// as the running one returns what it would.
fn release_heap_off_thread() {
    if TRIMMING.swap(true, Ordering::AcqRel) {
        return;
    }
    let trim = std::thread::Builder::new()
        .name("reconcile-watchdog-trim".into())
        .spawn(|| {
            crate::stack::release_symbols();
            TRIMMING.store(false, Ordering::Release);
        });
    if trim.is_err() {
        // No thread: no trim this time; the next capture's asks again.
        TRIMMING.store(false, Ordering::Release);
    }
}

/// Keeps where the reconciles `event` is about are stuck, from the stacks of `threads`
/// captured for it (a thread is matched to its reconcile by its kernel thread id).
fn remember_places(places: &mut Vec<(u64, String)>, event: &Event, threads: &[StuckThread]) {
    let reconciles: &[InFlight] = match event {
        Event::Hung { reconcile, .. }
        | Event::StillHung { reconcile, .. }
        | Event::Escalated {
            reconcile: Some(reconcile),
            ..
        } => std::slice::from_ref(reconcile),
        Event::RuntimeStalled { in_poll, .. } => in_poll,
        _ => return,
    };
    for thread in threads {
        let Ok(stack) = &thread.diagnostics.stack else {
            continue;
        };
        let Some(place) = restart::own_frame(stack, is_guard_poll) else {
            continue;
        };
        let tid = Some(thread.diagnostics.tid);
        for r in reconciles
            .iter()
            .filter(|r| r.thread.as_ref().and_then(|t| t.tid) == tid)
        {
            places.retain(|(id, _)| *id != r.id);
            places.push((r.id, place.clone()));
        }
    }
}
