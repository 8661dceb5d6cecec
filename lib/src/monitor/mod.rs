//! The watchdog: an OS thread that scans the registry and publishes the verdict.
//!
//! It uses `std::thread` and `std::time` only. tokio timers cannot fire when every
//! worker of the runtime is blocked, and that is exactly when the watchdog must speak.
//! The decision itself lives in [`verdict`]; [`report`] writes it to the log; this
//! module drives the two and holds the state the health checks read.

pub mod api_server;
pub(crate) mod cgroup;
mod inspect;
pub mod report;
pub mod summary;
#[cfg(all(feature = "task-dump", tokio_unstable, target_os = "linux"))]
mod task_dump;
#[cfg(not(all(feature = "task-dump", tokio_unstable, target_os = "linux")))]
mod task_dump {
    //! Without the `task-dump` feature and `--cfg tokio_unstable`: no task traces.

    /// Gives no trace.
    #[derive(Debug)]
    pub(crate) struct TaskTraces;

    impl TaskTraces {
        pub(crate) fn new(_: Option<tokio::runtime::Handle>) -> Self {
            Self
        }

        pub(crate) fn of(&self, _: &super::verdict::Event, _: bool) -> Option<String> {
            None
        }
    }
}
pub mod verdict;
#[cfg(test)]
mod verdict_props;
mod waker;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::guard::{InFlight, PollState, Registry};
use crate::health::{Check, Health};

pub use api_server::ApiServerStatus;
pub use inspect::Diagnostics;
pub use report::RuntimeSample;
pub use verdict::{ApiServer, Config, Decision, HangPolicy, HangState, Overdue, Pause, Verdict};

use verdict::driver::{
    Ask, Cause, Culprit, DriverWatch, Found, LookupBudget, PollSeen, RescueReports, Wake,
    WakeCause, WorkerSample,
};
use waker::Waker;

/// Errors of the monitor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OS refused to start the monitor thread.
    #[error("failed to start the watchdog thread")]
    Spawn(#[source] std::io::Error),
    /// The interval is zero.
    #[error("the watchdog interval must be greater than zero")]
    ZeroInterval,
}

/// A timestamp that one side touches and another reads the age of, lock-free.
#[derive(Debug)]
pub struct Heartbeat {
    epoch: Instant,
    /// Nanoseconds since `epoch` of the latest beat.
    last_ns: AtomicU64,
}

impl Heartbeat {
    /// A heartbeat that beat just now.
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            last_ns: AtomicU64::new(0),
        })
    }

    /// Records a beat at `now`.
    pub fn beat(&self, now: Instant) {
        let ns =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.last_ns.fetch_max(ns, Ordering::Release);
    }

    /// How long before `now` the latest beat was.
    #[must_use]
    pub fn age(&self, now: Instant) -> Duration {
        let last = self.epoch + Duration::from_nanos(self.last_ns.load(Ordering::Acquire));
        now.saturating_duration_since(last)
    }
}

/// The async runtime's heartbeat: a task on that runtime beats it every `period`. If
/// every worker is blocked, the task cannot run and the beat grows old.
/// Dropping it stops the task (with the monitor that owns it, or with a failed start).
#[derive(Debug)]
pub struct RuntimeHeartbeat {
    heartbeat: Arc<Heartbeat>,
    period: Duration,
    handle: tokio::runtime::Handle,
    task: tokio::task::AbortHandle,
}

impl Drop for RuntimeHeartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RuntimeHeartbeat {
    /// Spawns the beating task on `handle`'s runtime.
    #[must_use]
    pub fn spawn(handle: &tokio::runtime::Handle, period: Duration) -> Self {
        let heartbeat = Heartbeat::new();
        let beating = Arc::clone(&heartbeat);
        let task = handle.spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                beating.beat(Instant::now());
            }
        });
        Self {
            heartbeat,
            period,
            handle: handle.clone(),
            task: task.abort_handle(),
        }
    }

    /// Each worker's park count and busy time, from tokio's stable metrics, into `out`
    /// (a few atomic loads per worker, readable from any thread).
    pub(crate) fn workers(&self, out: &mut Vec<WorkerSample>) {
        let m = self.handle.metrics();
        out.clear();
        out.extend((0..m.num_workers()).map(|worker| WorkerSample {
            park_unpark: m.worker_park_unpark_count(worker),
            busy_ns:
                u64::try_from(m.worker_total_busy_duration(worker).as_nanos()).unwrap_or(u64::MAX),
        }));
    }

    /// The stable metrics of the runtime, readable from any thread.
    #[must_use]
    pub fn sample(&self) -> RuntimeSample {
        let m = self.handle.metrics();
        let idle_workers = (0..m.num_workers())
            .filter(|&worker| m.worker_park_unpark_count(worker) % 2 == 1)
            .count();
        RuntimeSample {
            workers: m.num_workers(),
            idle_workers,
            alive_tasks: m.num_alive_tasks(),
            global_queue_depth: m.global_queue_depth(),
        }
    }
}

/// One finished scan, as an [`Observer`] sees it.
#[derive(Debug)]
pub struct Scan<'a> {
    /// The reconciles the verdict looked at: those past their deadline, and during a
    /// runtime stall those inside a poll. On-time reconciles are only counted.
    pub attention: &'a [InFlight],
    /// Every reconcile in flight, counted per controller.
    pub in_flight_by_controller: &'a [(Arc<str>, usize)],
    /// What the verdict decided.
    pub decision: &'a Decision<'a>,
    /// How long the scan took (snapshot, decision and reports).
    pub took: Duration,
    /// The watched runtime's heartbeat age, when one is watched.
    pub runtime_heartbeat_age: Option<Duration>,
    /// Idle workers the monitor woke since the previous scan because a guarded
    /// reconcile held a worker in one poll: rescues (their culprits are in the WARN).
    pub driver_rescues: u64,
    /// The other wakes since the previous scan, by cause: they kept timers and I/O
    /// going, and no guarded reconcile held a worker.
    pub driver_wakes: DriverWakes,
}

/// Wakes of an idle worker that were not rescues, by cause (see [`Scan::driver_wakes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverWakes {
    /// A worker published nothing for the rescue's threshold, and no guarded reconcile
    /// was in one poll on it: busy with many short polls, preempted, or blocked outside
    /// any guard.
    pub busy_worker: u64,
    /// The runtime's heartbeat was late, and no silent worker was left to look at.
    pub heartbeat_late: u64,
    /// A silent worker whose reconciles were not looked up: the lookups' budget was
    /// spent.
    pub not_looked_up: u64,
}

impl DriverWakes {
    /// Each cause with its count, by the `cause` label of the metric.
    #[must_use]
    pub fn by_cause(&self) -> [(&'static str, u64); 3] {
        [
            (WakeCause::BusyWorker.label(), self.busy_worker),
            (WakeCause::HeartbeatLate.label(), self.heartbeat_late),
            (WakeCause::NotLookedUp.label(), self.not_looked_up),
        ]
    }
}

/// Wakes by cause, the rescues among them, since the previous scan.
#[derive(Debug, Default)]
struct WakeCounts {
    rescues: u64,
    others: DriverWakes,
}

/// Told of every scan (metrics, for instance), on the monitor thread.
pub trait Observer: Send + Sync + 'static {
    /// A scan finished.
    fn scanned(&self, scan: &Scan<'_>);
}

/// What the latest scan decided, for the health checks.
#[derive(Debug, Default)]
struct Published {
    reconcilers_failure: Option<String>,
    runtime_failure: Option<String>,
    /// How many reconciles were overdue.
    overdue: usize,
}

/// The state the monitor publishes and the checks read.
#[derive(Debug)]
pub struct Status {
    interval: Duration,
    beat: Arc<Heartbeat>,
    alive: AtomicBool,
    published: Mutex<Arc<Published>>,
}

impl Status {
    fn latest(&self) -> Arc<Published> {
        Arc::clone(&self.published.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Publishes `unpublished`, unless a check holds the lock right now (cloning the
    /// previous state, or preempted while it does): then it stays for the next try, as
    /// the monitor never waits on a reader.
    fn try_publish(&self, unpublished: &mut Option<Arc<Published>>) {
        let Some(published) = unpublished.take() else {
            return;
        };
        let mut slot = match self.published.try_lock() {
            Ok(slot) => slot,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                *unpublished = Some(published);
                return;
            }
        };
        let previous = std::mem::replace(&mut *slot, published);
        drop(slot);
        drop(previous);
    }

    /// How many reconciles the latest scan found overdue.
    #[must_use]
    pub fn overdue(&self) -> usize {
        self.latest().overdue
    }

    /// `watchdog`: the monitor thread lives and has scanned within 3 intervals.
    pub fn watchdog_check(&self, now: Instant) -> Result<(), String> {
        if !self.alive.load(Ordering::Acquire) {
            return Err("the watchdog thread has stopped".into());
        }
        let age = self.beat.age(now);
        if age > self.interval * 3 {
            return Err(format!(
                "the watchdog has not scanned for {} (interval {})",
                verdict::fmt_duration(age),
                verdict::fmt_duration(self.interval)
            ));
        }
        Ok(())
    }

    /// [`watchdog_check`](Self::watchdog_check) now; when it finds the scans late,
    /// the monitor gets up to one interval (at most a second) to scan before it fails:
    /// after a pause of the whole process (SIGSTOP, a VM pause, a CFS throttle) the
    /// probe server's thread may run before the monitor's.
    fn watchdog_check_waiting(&self) -> Result<(), String> {
        let first = self.watchdog_check(Instant::now());
        if first.is_ok() || !self.alive.load(Ordering::Acquire) {
            return first;
        }
        let until = Instant::now() + self.interval.min(Duration::from_secs(1));
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
            if self.watchdog_check(Instant::now()).is_ok() {
                return Ok(());
            }
        }
        self.watchdog_check(Instant::now())
    }
}

/// Reads one check's answer from the published status.
type ReadStatus = fn(&Status) -> Result<(), String>;

struct StatusCheck {
    name: &'static str,
    status: Arc<Status>,
    read: ReadStatus,
}

impl Check for StatusCheck {
    fn name(&self) -> &str {
        self.name
    }

    fn check(&self) -> Result<(), String> {
        (self.read)(&self.status)
    }
}

/// The running watchdog thread. Dropping it stops the thread.
#[derive(Debug)]
pub struct Monitor {
    status: Arc<Status>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts the watchdog over `registry`, adds its liveness checks (`watchdog`,
    /// `reconcilers`, and `runtime` when `runtime` is given) to `health`, and returns.
    /// Its reports carry the default [`Diagnostics`].
    pub fn spawn(
        registry: Registry,
        health: &Health,
        config: Config,
        runtime: Option<RuntimeHeartbeat>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Result<Self, Error> {
        Self::spawn_with_diagnostics(
            registry,
            health,
            config,
            Diagnostics::default(),
            runtime,
            observer,
        )
    }

    /// Like [`spawn`](Self::spawn), with the stuck-thread diagnostics of its reports.
    pub fn spawn_with_diagnostics(
        registry: Registry,
        health: &Health,
        config: Config,
        diagnostics: Diagnostics,
        runtime: Option<RuntimeHeartbeat>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Result<Self, Error> {
        Self::spawn_watching_api_server(
            registry,
            health,
            config,
            diagnostics,
            runtime,
            None,
            observer,
        )
    }

    /// Like [`spawn_with_diagnostics`](Self::spawn_with_diagnostics), and overdue
    /// reconciles that await while `api_server` says the API server does not answer
    /// hold liveness instead of failing it (a restart cannot help then).
    pub fn spawn_watching_api_server(
        registry: Registry,
        health: &Health,
        config: Config,
        diagnostics: Diagnostics,
        runtime: Option<RuntimeHeartbeat>,
        api_server: Option<Arc<ApiServerStatus>>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Result<Self, Error> {
        if config.interval.is_zero() {
            return Err(Error::ZeroInterval);
        }
        let status = Arc::new(Status {
            interval: config.interval,
            beat: Heartbeat::new(),
            alive: AtomicBool::new(true),
            published: Mutex::new(Arc::default()),
        });
        let checks: [(&'static str, ReadStatus); 2] = [
            ("watchdog", Status::watchdog_check_waiting),
            ("reconcilers", |s| {
                s.latest().reconcilers_failure.clone().map_or(Ok(()), Err)
            }),
        ];
        for (name, read) in checks {
            health.liveness.add(Arc::new(StatusCheck {
                name,
                status: Arc::clone(&status),
                read,
            }));
        }
        if runtime.is_some() {
            health.liveness.add(Arc::new(StatusCheck {
                name: "runtime",
                status: Arc::clone(&status),
                read: |s| s.latest().runtime_failure.clone().map_or(Ok(()), Err),
            }));
        }

        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let status = Arc::clone(&status);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("reconcile-watchdog".into())
                .spawn(move || {
                    run(
                        &registry,
                        &status,
                        &stop,
                        Verdict::new(config),
                        &Sources {
                            diagnostics: &diagnostics,
                            runtime: runtime.as_ref(),
                            api_server: api_server.as_deref(),
                            observer: observer.as_deref(),
                        },
                    )
                })
                .map_err(Error::Spawn)?
        };
        Ok(Self {
            status,
            stop,
            thread: Some(thread),
        })
    }

    /// The state the checks read.
    #[must_use]
    pub fn status(&self) -> &Arc<Status> {
        &self.status
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Clears `alive` however the thread ends, a panic included.
struct AliveFlag<'a>(&'a AtomicBool);

impl Drop for AliveFlag<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// What the monitor thread reads besides the registry, and whom it tells.
struct Sources<'a> {
    diagnostics: &'a Diagnostics,
    runtime: Option<&'a RuntimeHeartbeat>,
    api_server: Option<&'a ApiServerStatus>,
    observer: Option<&'a dyn Observer>,
}

/// The rescue's threshold, if `after` asks for one and `runtime` has a worker to spare:
/// a current-thread runtime, or one of a single worker, has nobody to wake.
fn rescue_after(runtime: &RuntimeHeartbeat, after: Option<Duration>) -> Option<Duration> {
    after.filter(|_| runtime.handle.metrics().num_workers() > 1)
}

/// The monitor as the runtime's sysmon: between scans, a cheap check of the watched
/// runtime's workers wakes an idle one when a worker publishes nothing for a while and
/// may have left tokio's timers and I/O to nobody, and counts the wake as a rescue only
/// when a guarded reconcile holds that worker (see [`verdict::driver`]).
struct Rescuer<'a> {
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
}

impl WakeCounts {
    fn count(&mut self, cause: WakeCause) {
        let counter = match cause {
            WakeCause::Rescue => &mut self.rescues,
            WakeCause::BusyWorker => &mut self.others.busy_worker,
            WakeCause::HeartbeatLate => &mut self.others.heartbeat_late,
            WakeCause::NotLookedUp => &mut self.others.not_looked_up,
        };
        *counter += 1;
    }
}

impl<'a> Rescuer<'a> {
    /// A rescuer when `after` asks for one and the runtime has a worker to spare (see
    /// [`rescue_after`]), waking workers through `waker`.
    fn new(
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
        })
    }

    /// Checks if a check is due at `now`; returns when the next one is.
    fn check_if_due(&mut self, now: Instant, registry: &Registry) -> Instant {
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
        if !matches!(ask.cause, Cause::WorkerSilent { .. }) {
            return Found::NotAsked;
        }
        if !self.budget.allows(now) {
            return Found::NotLookedUp;
        }
        self.budget
            .spend(registry.in_poll_into(now, self.watch.after(), &mut self.in_poll));
        let (watch, runtime_id) = (&self.watch, self.runtime_id);
        self.in_poll.retain(|r| {
            let PollState::InPoll { since } = r.poll else {
                return false;
            };
            let thread = r.thread.as_ref();
            watch.holds(
                ask,
                now,
                &PollSeen {
                    began: since,
                    first: r.polls <= 1,
                    on_watched_runtime: thread.and_then(|t| t.runtime) == Some(runtime_id),
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
        self.in_poll.retain(|r| {
            r.thread.as_ref().and_then(|t| t.tid) == tid
                && r.thread.as_ref().map(|t| &t.name) == name.as_ref()
        });
        Found::Culprit { tid }
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

    /// The monitor stops: the rescues held are reported now, not lost.
    fn flush_all(&mut self) {
        if let Some(held) = self.reports.take() {
            report::emit_held_rescues(&held);
        }
    }
}

/// How soon the monitor tries again to publish a scan's state that a check kept it
/// from publishing.
const PUBLISH_RETRY: Duration = Duration::from_millis(1);

fn run(
    registry: &Registry,
    status: &Status,
    stop: &AtomicBool,
    mut verdict: Verdict,
    sources: &Sources<'_>,
) {
    let Sources {
        diagnostics,
        runtime,
        api_server,
        observer,
    } = *sources;
    let _alive = AliveFlag(&status.alive);
    let interval = verdict.config().interval;
    let mut snapshot = Vec::new();
    let mut counts = Vec::new();
    let mut next = Instant::now();
    let mut inspector = inspect::Inspector::new(*diagnostics, registry.clone());
    // One small file read a scan, when cgroup v2 tells throttled time.
    let cpu_stat = cgroup::CpuStat::find().ok();
    let mut throttled_before = cpu_stat.as_ref().and_then(|c| c.throttled().ok());
    let task_traces = task_dump::TaskTraces::new(runtime.map(|r| r.handle.clone()));
    let rescue = verdict.config().driver_rescue_after;
    // Cancels and the rescue's wakes each go through a thread of their own: the monitor
    // waits on neither the runtime's locks nor a task's waker, and a rescue never waits
    // behind a cancel.
    let cancels = matches!(verdict.config().policy, HangPolicy::Cancel);
    let rescued = runtime.filter(|r| rescue_after(r, rescue).is_some());
    let waker = (cancels || rescued.is_some())
        .then(|| Waker::start(registry, cancels, rescued.map(|r| &r.handle)));
    let mut rescuer = rescued
        .zip(waker.as_ref())
        .and_then(|(r, waker)| Rescuer::new(r, rescue, waker));
    let mut observer_panicked = false;
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        status.beat.beat(now);

        // A scan later than planned: did the process not run meanwhile?
        let throttled_now = cpu_stat.as_ref().and_then(|c| c.throttled().ok());
        let throttled = throttled_now
            .zip(throttled_before)
            .map(|(after, before)| after.saturating_sub(before));
        throttled_before = throttled_now;
        verdict.observe_lateness(now, now.saturating_duration_since(next), throttled);

        // Ended first: a guard leaves the map before it queues its end, so nothing taken
        // here can still be in the snapshot and be judged hung a second time.
        let ended = registry.take_ended();
        let heartbeat_age = runtime.map(|r| r.heartbeat.age(now));
        // The verdict acts only on overdue reconciles, and on those inside a poll when
        // the runtime stalls: copy just those (a scan of 100,000 on-time reconciles then
        // never touches their entries).
        let stalled =
            heartbeat_age.is_some_and(|age| age > verdict.config().runtime_stall_threshold);
        registry.scan_into(now, stalled, &mut snapshot, &mut counts);
        if let Some(api_server) = api_server {
            verdict.observe_api_server(api_server.state());
        }
        let decision = verdict.step(&snapshot, ended, heartbeat_age, now);
        if let Some(api_server) = api_server
            && decision.ask_api_server
        {
            // New awaits that never woke: is it the API server? Ask now, not at the
            // checker's next turn.
            api_server.ask();
        }

        // `scan_into` has marked every overdue reconcile as reported hung already, under
        // its shard's lock (a second lookup per hang here cost a tenth of a mass scan).
        for id in &decision.cancel {
            match &waker {
                Some(waker) => waker.cancel(*id),
                // Not under the cancel policy: no cancel to make.
                None => {
                    registry.request_cancel(*id);
                }
            }
        }
        let sample = runtime.map(RuntimeHeartbeat::sample);
        let mut inspected = false;
        for event in &decision.events {
            let threads = inspector.inspect(event, now);
            let task_trace = task_traces.of(event, stalled);
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
            crate::stack::release_symbols();
        }
        inspector.forget_all_but(&snapshot);
        if let Some(observer) = observer {
            let wakes = rescuer
                .as_mut()
                .map(|r| std::mem::take(&mut r.wakes))
                .unwrap_or_default();
            let scan = Scan {
                attention: &snapshot,
                in_flight_by_controller: &counts,
                decision: &decision,
                took: now.elapsed(),
                runtime_heartbeat_age: heartbeat_age,
                driver_rescues: wakes.rescues,
                driver_wakes: wakes.others,
            };
            // The observer is the user's code: its panic must not end the scans.
            let told = std::panic::catch_unwind(AssertUnwindSafe(|| observer.scanned(&scan)));
            if told.is_err() && !observer_panicked {
                observer_panicked = true;
                tracing::error!(
                    target: report::TARGET,
                    "the monitor's observer panicked; the monitor caught it and scans on (logged once)"
                );
            }
        }
        // Kept while a check holds the lock it is published under.
        let mut unpublished = Some(Arc::new(Published {
            reconcilers_failure: decision.reconcilers_failure,
            runtime_failure: decision.runtime_failure,
            overdue: decision.overdue.len(),
        }));
        status.try_publish(&mut unpublished);

        // Sleep to the next tick, checking the runtime's workers meanwhile; park so
        // that `stop` can wake us early. A thread that fell behind (suspended, starved)
        // starts afresh instead of scanning in a burst.
        next = (next + interval).max(Instant::now());
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= next {
                break;
            }
            let mut wake = rescuer
                .as_mut()
                .map_or(next, |r| r.check_if_due(now, registry).min(next));
            if unpublished.is_some() {
                status.try_publish(&mut unpublished);
                if unpublished.is_some() {
                    wake = wake.min(now + PUBLISH_RETRY);
                }
            }
            std::thread::park_timeout(wake.saturating_duration_since(now));
        }
    }
    if let Some(rescuer) = rescuer.as_mut() {
        rescuer.flush_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::ObjectKey;

    fn eventually(what: &str, mut f: impl FnMut() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_watchdog_check_fails_when_scans_stop() {
        let status = Status {
            interval: Duration::from_secs(1),
            beat: Heartbeat::new(),
            alive: AtomicBool::new(true),
            published: Mutex::default(),
        };
        let t0 = Instant::now();
        status.beat.beat(t0);
        assert!(status.watchdog_check(t0 + Duration::from_secs(3)).is_ok());
        let err = status
            .watchdog_check(t0 + Duration::from_secs(4))
            .unwrap_err();
        assert!(
            err.starts_with("the watchdog has not scanned for 4s"),
            "{err}"
        );
        status.alive.store(false, Ordering::Release);
        assert_eq!(
            status.watchdog_check(t0).unwrap_err(),
            "the watchdog thread has stopped"
        );
    }

    #[test]
    fn the_watchdog_check_gives_a_late_monitor_one_interval_to_scan() {
        let status = Arc::new(Status {
            interval: Duration::from_millis(500),
            beat: Heartbeat::new(),
            alive: AtomicBool::new(true),
            published: Mutex::default(),
        });
        // Scans stopped long ago, as across a pause of the whole process.
        std::thread::sleep(Duration::from_millis(1600));
        assert!(status.watchdog_check(Instant::now()).is_err());
        let beating = {
            let status = Arc::clone(&status);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                status.beat.beat(Instant::now());
            })
        };
        assert_eq!(status.watchdog_check_waiting(), Ok(()));
        beating.join().unwrap();

        // A monitor that does not scan within the interval still fails the check.
        std::thread::sleep(Duration::from_millis(1600));
        let err = status.watchdog_check_waiting().unwrap_err();
        assert!(err.starts_with("the watchdog has not scanned for"), "{err}");
    }

    /// A monitor scanning every 10 ms a registry whose deadline is 50 ms.
    fn fast_monitor() -> (Registry, Health, Monitor) {
        let registry = Registry::new(Duration::from_millis(50));
        let health = Health::new();
        let config = Config {
            interval: Duration::from_millis(10),
            ..Config::default()
        };
        let monitor = Monitor::spawn(registry.clone(), &health, config, None, None).unwrap();
        (registry, health, monitor)
    }

    #[test]
    fn a_live_monitor_fails_and_recovers_liveness() {
        let (registry, health, monitor) = fast_monitor();
        assert_eq!(health.liveness.names(), ["ping", "watchdog", "reconcilers"]);

        let guard = registry
            .controller("web", "Widget")
            .register(ObjectKey::namespaced("ns", "a"));
        eventually("liveness to fail", || !health.liveness.run(&[]).passed());
        let reason = health.liveness.run_one("reconcilers").unwrap().unwrap_err();
        assert!(reason.starts_with("web ns/a running"), "{reason}");
        assert_eq!(monitor.status().overdue(), 1);

        drop(guard);
        eventually("liveness to recover", || health.liveness.run(&[]).passed());

        monitor.stop();
        assert_eq!(
            health.liveness.run_one("watchdog"),
            Some(Err("the watchdog thread has stopped".into()))
        );
    }

    #[test]
    fn a_check_holding_the_published_state_does_not_hold_up_the_scans() {
        let (registry, _health, monitor) = fast_monitor();
        let status = Arc::clone(monitor.status());
        let guard = registry
            .controller("web", "Widget")
            .register(ObjectKey::namespaced("ns", "a"));
        // As a check preempted while it clones the published state would hold it.
        let held = status.published.lock().unwrap();
        let scanned = |status: &Status| status.beat.last_ns.load(Ordering::Acquire);
        let before = scanned(&status);
        eventually("scans while a check holds the lock", || {
            scanned(&status) > before + 100_000_000
        });
        assert_eq!(held.overdue, 0, "nothing published meanwhile");
        drop(held);
        eventually("the held-back state to be published", || {
            status.overdue() == 1
        });
        drop(guard);
        monitor.stop();
    }

    /// A task's waker that waits for `gate` (as a waker taking an executor's lock would
    /// while a worker holds it), then counts the wake.
    struct GatedWaker {
        gate: Arc<Mutex<()>>,
        wakes: AtomicU64,
    }

    impl std::task::Wake for GatedWaker {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            drop(self.gate.lock().unwrap_or_else(|p| p.into_inner()));
            self.wakes.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_cancelled_reconciles_waker_that_blocks_does_not_hold_up_the_scans() {
        let registry = Registry::new(Duration::from_millis(50));
        let health = Health::new();
        let config = Config {
            interval: Duration::from_millis(10),
            policy: HangPolicy::Cancel,
            ..Config::default()
        };
        let monitor = Monitor::spawn(registry.clone(), &health, config, None, None).unwrap();
        let status = Arc::clone(monitor.status());
        let gate = Arc::new(Mutex::new(()));
        let task = Arc::new(GatedWaker {
            gate: Arc::clone(&gate),
            wakes: AtomicU64::new(0),
        });
        let held = gate.lock().unwrap();
        let reconcile = std::future::pending::<Result<(), ()>>();
        let mut guarded = std::pin::pin!(
            registry
                .controller("web", "Widget")
                .guard(ObjectKey::namespaced("ns", "a"), reconcile)
        );
        let task_waker = std::task::Waker::from(Arc::clone(&task));
        let mut cx = std::task::Context::from_waker(&task_waker);
        assert!(guarded.as_mut().poll(&mut cx).is_pending());
        // Overdue at 50 ms and cancelled at the next scan; its waker waits for the gate.
        // A monitor that woke it itself would stop scanning there.
        let scanned = |status: &Status| status.beat.last_ns.load(Ordering::Acquire);
        let before = scanned(&status);
        eventually("scans long after the cancel", || {
            scanned(&status) > before + 500_000_000
        });
        assert_eq!(task.wakes.load(Ordering::SeqCst), 0, "the gate is held");
        drop(held);
        eventually("the cancel to wake the task", || {
            task.wakes.load(Ordering::SeqCst) == 1
        });
        assert!(matches!(
            guarded.as_mut().poll(&mut cx),
            std::task::Poll::Ready(Err(crate::guard::Error::Cancelled { .. }))
        ));
        monitor.stop();
    }

    /// Panics at every scan it is told of.
    struct Panicking(std::sync::atomic::AtomicUsize);

    impl Observer for Panicking {
        fn scanned(&self, _: &Scan<'_>) {
            self.0.fetch_add(1, Ordering::Relaxed);
            panic!("an observer's bug");
        }
    }

    #[test]
    fn a_panicking_observer_does_not_stop_the_scans() {
        let registry = Registry::new(Duration::from_millis(50));
        let health = Health::new();
        let config = Config {
            interval: Duration::from_millis(10),
            ..Config::default()
        };
        let observer = Arc::new(Panicking(Default::default()));
        let told = Arc::clone(&observer);
        let monitor =
            Monitor::spawn(registry.clone(), &health, config, None, Some(observer)).unwrap();
        let guard = registry
            .controller("web", "Widget")
            .register(ObjectKey::namespaced("ns", "a"));
        eventually("the hang to fail liveness", || {
            health
                .liveness
                .run_one("reconcilers")
                .is_some_and(|r| r.is_err())
        });
        eventually("more scans", || told.0.load(Ordering::Relaxed) >= 5);
        assert_eq!(health.liveness.run_one("watchdog"), Some(Ok(())));
        drop(guard);
        eventually("liveness to recover", || health.liveness.run(&[]).passed());
        monitor.stop();
    }

    #[test]
    fn the_runtime_heartbeat_task_ends_with_a_failed_start_and_with_the_monitor() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let alive = || runtime.handle().metrics().num_alive_tasks();
        let period = Duration::from_millis(5);

        let heartbeat = RuntimeHeartbeat::spawn(runtime.handle(), period);
        assert_eq!(alive(), 1);
        let refused = Config {
            interval: Duration::ZERO,
            ..Config::default()
        };
        let registry = Registry::new(Duration::from_secs(60));
        let health = Health::new();
        assert!(Monitor::spawn(registry.clone(), &health, refused, Some(heartbeat), None).is_err());
        eventually("the failed start's heartbeat task to end", || alive() == 0);

        let heartbeat = RuntimeHeartbeat::spawn(runtime.handle(), period);
        let config = Config {
            interval: Duration::from_millis(10),
            ..Config::default()
        };
        let monitor = Monitor::spawn(registry, &health, config, Some(heartbeat), None).unwrap();
        assert_eq!(alive(), 1);
        drop(monitor);
        eventually("the stopped monitor's heartbeat task to end", || {
            alive() == 0
        });
    }

    #[test]
    fn a_zero_interval_is_refused() {
        let config = Config {
            interval: Duration::ZERO,
            ..Config::default()
        };
        let err = Monitor::spawn(
            Registry::new(Duration::from_secs(1)),
            &Health::new(),
            config,
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the watchdog interval must be greater than zero"
        );
    }
}
