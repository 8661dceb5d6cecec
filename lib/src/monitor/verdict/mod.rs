//! The watchdog's decision: a pure function of (snapshot, now, config) plus the memory
//! of what has already been reported.
//!
//! Read this file top to bottom to know when the watchdog reports, cancels, escalates,
//! holds back for an API outage and fails liveness. The monitor thread only drives it:
//! it takes a snapshot of the registry, tells it whether the API server answers
//! ([`Verdict::observe_api_server`]), calls [`Verdict::step`], and carries out the
//! [`Decision`]. Tests drive it the same way with an injected clock.
//!
//! Mass failure is the normal case here, not an edge: an API outage hangs every
//! reconcile at once. So every step is linear in the reconciles in flight, the
//! liveness reason names the oldest few and counts the rest, and per-reconcile log
//! lines spend a budget (`budget.rs`); what is over it is counted into one summary.

mod budget;
// The runtime rescue's decision: the monitor's alone; this repository's benchmarks
// reach it through `crate::internals`.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod driver;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::guard::{BuildIdHasher, Ended, InFlight, ObjectKey, Outcome, PollState};
use crate::monitor::summary::{NAMED, name_few};

use budget::{Budget, Pending};

/// What the watchdog does when a reconcile outlives its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HangPolicy {
    /// Fail liveness while any reconcile is overdue, so the kubelet restarts the pod.
    #[default]
    Restart,
    /// Cancel the reconcile at its next poll so the controller requeues it; fail
    /// liveness only when that cannot work (stuck inside a poll) or keeps recurring.
    Cancel,
    /// Log the hang report only; probes stay green.
    Report,
}

impl HangPolicy {
    /// The flag value naming this policy.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restart => "restart",
            Self::Cancel => "cancel",
            Self::Report => "report",
        }
    }
}

impl fmt::Display for HangPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long a worker of the watched runtime may sit in one poll, while another is idle,
/// before the monitor wakes an idle one to drive timers and I/O (Go's sysmon retakes its
/// network poller after 10 ms; a reconcile decoding a large list can take that long).
pub const DRIVER_RESCUE_AFTER: Duration = Duration::from_millis(20);

/// The knobs of the decision.
#[derive(Clone, Debug)]
pub struct Config {
    /// How often the monitor scans.
    pub interval: Duration,
    /// What to do about an overdue reconcile.
    pub policy: HangPolicy,
    /// Heartbeat age of the async runtime past which liveness fails.
    pub runtime_stall_threshold: Duration,
    /// Under `cancel`: this many cancellations of one object within
    /// `cancel_window` fail liveness.
    pub cancel_limit: u32,
    /// The window `cancel_limit` counts in.
    pub cancel_window: Duration,
    /// Per-reconcile report lines (hung, still hung, ended) one scan may write.
    pub report_burst: u32,
    /// Per-reconcile report lines per minute across scans, once the burst is spent.
    pub reports_per_minute: u32,
    /// Lines over the budget are counted into one summary per kind, at most this often.
    pub summary_every: Duration,
    /// While liveness is held for an API outage, how often the report says so again.
    pub outage_reminder: Duration,
    /// Under `restart`, how long a reconcile newly overdue on an await waits to be
    /// judged for a reachability check sent after its deadline (asked for at once): an
    /// outage that began after the latest check must not fail liveness first.
    pub api_server_confirm_within: Duration,
    /// With a watched multi-thread runtime: how long a worker may sit in one poll while
    /// another is idle before the monitor wakes an idle one to drive timers and I/O
    /// (the decision is in `verdict/driver.rs`); `None` never wakes one.
    pub driver_rescue_after: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            policy: HangPolicy::Restart,
            runtime_stall_threshold: Duration::from_secs(10),
            cancel_limit: 3,
            cancel_window: Duration::from_secs(600),
            report_burst: 10,
            reports_per_minute: 6,
            summary_every: Duration::from_secs(15),
            outage_reminder: Duration::from_secs(60),
            api_server_confirm_within: Duration::from_secs(5),
            driver_rescue_after: Some(DRIVER_RESCUE_AFTER),
        }
    }
}

/// Whether the API server answers at all, as its reachability check last found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ApiServer {
    /// No check runs (none configured, or none finished yet).
    #[default]
    NotChecked,
    /// It gave an HTTP answer, whatever its status.
    Answers {
        /// When the check that answered was sent: the server answered at that moment.
        asked_at: Instant,
    },
    /// It gave none.
    Silent {
        /// Since when, at the latest.
        since: Instant,
        /// Why the check failed (a timeout, a refused connection).
        why: String,
    },
}

/// A time the process did not run, as the monitor found it: its scan came late by
/// more than the runtime stall threshold, or late while the cgroup was CPU-throttled.
/// Nothing stalled then (a node freeze, a VM pause, SIGSTOP, a long CFS throttle): no
/// deadline is judged on that time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pause {
    /// When the monitor ran again.
    pub ended: Instant,
    /// How long the process did not run: how late the scan came.
    pub length: Duration,
    /// The CPU throttling cgroup v2's `cpu.stat` counted over the gap, when it says.
    pub throttled: Option<Duration>,
}

impl Pause {
    /// How much of `since..ended` the pause covers.
    fn within(&self, since: Instant) -> Duration {
        self.length.min(self.ended.saturating_duration_since(since))
    }
}

/// The most pauses the verdict remembers, to credit the reconciles that ran through them.
const PAUSES: usize = 32;

/// Where an overdue reconcile is stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HangState {
    /// Not inside a poll: it awaits a wake-up that has not come.
    Awaiting,
    /// Inside one poll that has not returned: a blocking call, a lock, a busy loop.
    InPoll,
    /// Woken but not polled since, or waiting while the runtime is stalled: a victim
    /// of a blocked worker or a stalled runtime, not a hang of its own.
    Starved,
}

impl HangState {
    /// `awaiting`, `in-poll` or `starved`, as in the report.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Awaiting => "awaiting",
            Self::InPoll => "in-poll",
            Self::Starved => "starved",
        }
    }

    fn of(reconcile: &InFlight, runtime_stalled: bool) -> Self {
        match reconcile.poll {
            PollState::InPoll { .. } => Self::InPoll,
            PollState::Woken { .. } => Self::Starved,
            PollState::Awaiting if runtime_stalled => Self::Starved,
            PollState::Awaiting => Self::Awaiting,
        }
    }
}

impl fmt::Display for HangState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the policy did about a hang, as written in the report's `action` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `restart`: liveness fails until it ends.
    FailLiveness,
    /// `report`: nothing but this report.
    ReportOnly,
    /// `cancel`: asked to stop at its next poll; it will be requeued.
    CancelRequested,
    /// `cancel`, but it is stuck inside a poll and cannot see the request: liveness
    /// fails if it is still there one interval later.
    CancelPendingInPoll,
    /// `cancel` could not stop it within an interval: liveness fails.
    Escalated,
    /// It awaits while the API server does not answer: a restart cannot help, so
    /// liveness holds.
    HeldForApiServer,
}

impl Action {
    /// The words of the report's `action` field.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailLiveness => "failing liveness (restart)",
            Self::ReportOnly => "reported only",
            Self::CancelRequested => "cancel requested; the controller will requeue it",
            Self::CancelPendingInPoll => {
                "cancel requested, but it is stuck inside a poll and cannot see it; liveness fails if it has not returned within one interval"
            }
            Self::Escalated => "cancel did not stop it; failing liveness (restart)",
            Self::HeldForApiServer => "the API server does not answer: not restarting",
        }
    }

    fn fails_liveness(self) -> bool {
        matches!(self, Self::FailLiveness | Self::Escalated)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which per-reconcile lines a [`Summary`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SummaryKind {
    /// Reconciles newly hung (ERROR).
    Hung,
    /// Reminders of reconciles still hung (WARN).
    StillHung,
    /// Hung reconciles that ended (INFO).
    Ended,
}

/// The per-reconcile lines over the report budget, counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Which lines.
    pub kind: SummaryKind,
    /// How many.
    pub count: usize,
    /// How many per controller and state (or outcome), the largest first.
    pub by_group: String,
    /// The oldest of them as `controller object`, comma-separated (at most 20 names
    /// and 2 KiB): what was over the budget is still named once.
    pub named: String,
    /// How many of them `named` leaves out.
    pub unnamed: usize,
}

/// Something the monitor must write to the log.
#[derive(Clone, Debug)]
pub enum Event {
    /// A reconcile crossed its deadline (ERROR).
    Hung {
        /// The reconcile at the scan.
        reconcile: InFlight,
        /// Where it is stuck.
        state: HangState,
        /// What the policy did.
        action: Action,
    },
    /// A hung reconcile crossed one more multiple of its deadline (WARN).
    StillHung {
        /// The reconcile at the scan.
        reconcile: InFlight,
        /// Where it is stuck.
        state: HangState,
        /// Which multiple of the deadline it has crossed (2, 3, …).
        deadlines: u32,
        /// What the policy is doing now.
        action: Action,
    },
    /// The cancel policy gave up on a reconcile and fails liveness (ERROR).
    Escalated {
        /// The reconcile at the scan, when it is still in flight.
        reconcile: Option<InFlight>,
        /// The controller.
        controller: Arc<str>,
        /// The object.
        object: ObjectKey,
        /// Why.
        reason: String,
    },
    /// A reconcile that had been reported hung finished (INFO).
    Ended(Ended),
    /// The async runtime's heartbeat is older than the threshold (ERROR).
    RuntimeStalled {
        /// The heartbeat's age.
        age: Duration,
        /// Reconciles stuck inside a poll right now: the likely culprits.
        in_poll: Vec<InFlight>,
    },
    /// The runtime's heartbeat is fresh again (INFO).
    RuntimeRecovered {
        /// How long it was stalled, at the least.
        stalled_for: Duration,
    },
    /// Reconciles newly overdue while the runtime is stalled: victims of the stall,
    /// reported under it rather than one hang report each (ERROR).
    StallVictims {
        /// The oldest few of them (the report names them through `listed`).
        #[cfg_attr(not(any(test, feature = "internals")), allow(dead_code))]
        named: Vec<InFlight>,
        /// How many in all.
        count: usize,
        /// The named few and the count of the rest, as one line.
        listed: String,
    },
    /// The process did not run for a while: no verdict on that time (WARN).
    Paused(Pause),
    /// Per-reconcile lines over the report budget, counted (at the level of their kind).
    Summary(Summary),
    /// Overdue reconciles await while the API server does not answer: liveness holds
    /// (ERROR once, then a WARN reminder now and then).
    ApiServerSilent {
        /// How long it has not answered.
        silent_for: Duration,
        /// Why the reachability check failed.
        why: String,
        /// Overdue reconciles liveness holds for.
        held: usize,
        /// Whether this is a reminder.
        reminder: bool,
    },
    /// The API server answers again after liveness was held for it (INFO); overdue
    /// reconciles still stuck on their old requests fail liveness from now on.
    ApiServerAnswers {
        /// How long it did not answer, as far as the checks saw.
        silent_for: Duration,
        /// Overdue reconciles that now fail liveness.
        still_stuck: usize,
    },
}

/// One overdue reconcile, as the checks and the metrics see it.
#[derive(Clone, Copy, Debug)]
pub struct Overdue<'a> {
    /// The reconcile at the scan (borrowed from the scan's copy: a mass hang clones
    /// nothing here).
    pub reconcile: &'a InFlight,
    /// Where it is stuck.
    pub state: HangState,
    /// How long it had run at the scan.
    pub elapsed: Duration,
    /// Whether, under the policy, it fails liveness.
    pub fails_liveness: bool,
}

/// What one scan decided.
#[derive(Clone, Debug, Default)]
pub struct Decision<'a> {
    /// Events to log, in order.
    pub events: Vec<Event>,
    /// Every reconcile past its deadline.
    pub overdue: Vec<Overdue<'a>>,
    /// Reconciles newly found hung (the registry's scan has marked them, so that their
    /// end is reported).
    pub mark_hung: Vec<u64>,
    /// Every reconcile newly found past its deadline, by controller and state, whether
    /// or not its report fitted the budget: what the metrics count.
    pub newly_hung: Vec<(Arc<str>, HangState)>,
    /// Reconciles to cancel now.
    pub cancel: Vec<u64>,
    /// Why the `reconcilers` liveness check fails, if it does.
    pub reconcilers_failure: Option<String>,
    /// Why the `runtime` liveness check fails, if it does.
    pub runtime_failure: Option<String>,
    /// Reconciles newly overdue on an await: ask the API server now whether it answers.
    pub ask_api_server: bool,
    /// Hung reconciles their first report did not name: neither a report of their own
    /// nor the summary written now had room for them (a mass hang); the metrics count
    /// them. Later summaries name those never named first.
    pub hangs_unnamed: usize,
}

/// What the verdict remembers of one reported reconcile.
#[derive(Debug)]
struct Tracked {
    /// The latest scan that saw it overdue.
    seen: u64,
    /// The highest multiple of the deadline already reported.
    deadlines: u32,
    /// When the cancel policy asked it to stop.
    cancel_requested_at: Option<Instant>,
    escalated: bool,
    /// Named on some line already: its own, or among a summary's names. A summary over
    /// the budget names those never named first, so that a hang counted once without
    /// its name gets it on a later reminder or on its end.
    named: bool,
}

/// A per-reconcile line of one scan, before the budget decides whether it is written:
/// its event is made (and the reconcile copied) only if it is.
enum Line<'a> {
    Hung {
        reconcile: &'a InFlight,
        state: HangState,
        action: Action,
    },
    StillHung {
        reconcile: &'a InFlight,
        state: HangState,
        deadlines: u32,
        action: Action,
    },
    /// The end, and whether the hang was named on some line before.
    Ended(Box<Ended>, bool),
}

impl Line<'_> {
    fn into_event(self) -> Event {
        match self {
            Self::Hung {
                reconcile,
                state,
                action,
            } => Event::Hung {
                reconcile: reconcile.clone(),
                state,
                action,
            },
            Self::StillHung {
                reconcile,
                state,
                deadlines,
                action,
            } => Event::StillHung {
                reconcile: reconcile.clone(),
                state,
                deadlines,
                action,
            },
            Self::Ended(end, _) => Event::Ended(*end),
        }
    }

    /// The controller and state (or outcome) a summary counts it under.
    fn group(&self) -> (Arc<str>, &'static str) {
        match self {
            Self::Hung {
                reconcile, state, ..
            }
            | Self::StillHung {
                reconcile, state, ..
            } => (Arc::clone(&reconcile.controller), state.as_str()),
            Self::Ended(end, _) => (Arc::clone(&end.reconcile.controller), end.outcome.as_str()),
        }
    }

    /// When the reconcile started, and how a summary names it.
    fn started(&self) -> Instant {
        match self {
            Self::Hung { reconcile, .. } | Self::StillHung { reconcile, .. } => reconcile.started,
            Self::Ended(end, _) => end.reconcile.started,
        }
    }

    fn name(&self) -> String {
        match self {
            Self::Hung { reconcile, .. } | Self::StillHung { reconcile, .. } => {
                format!("{} {}", reconcile.controller, reconcile.object)
            }
            Self::Ended(end, _) => {
                format!("{} {}", end.reconcile.controller, end.reconcile.object)
            }
        }
    }

    /// The reconcile's registry id.
    fn id(&self) -> u64 {
        match self {
            Self::Hung { reconcile, .. } | Self::StillHung { reconcile, .. } => reconcile.id,
            Self::Ended(end, _) => end.reconcile.id,
        }
    }

    /// Who gets the budget first: hangs inside a poll, then awaits, then victims.
    fn rank(&self) -> usize {
        match self {
            Self::Hung {
                state: HangState::InPoll,
                ..
            } => 0,
            Self::Hung {
                state: HangState::Awaiting,
                ..
            } => 1,
            _ => 2,
        }
    }
}

/// Per-reconcile lines of one scan, by kind.
#[derive(Default)]
struct Lines<'a> {
    hung: Vec<Line<'a>>,
    ended: Vec<Line<'a>>,
    still_hung: Vec<Line<'a>>,
}

/// The decision, with the memory it needs between scans.
#[derive(Debug)]
pub struct Verdict {
    config: Config,
    /// Scans so far: what `Tracked::seen` counts in.
    scans: u64,
    tracked: HashMap<u64, Tracked, BuildIdHasher>,
    /// Overdue reconciles whose judgment waits (for the runtime's heartbeat or for an
    /// API server check): the registry's scan has marked them, so each one's end comes
    /// back, and is not reported, as no hang of theirs was.
    deferred: HashSet<u64, BuildIdHasher>,
    /// Recent cancellations per (controller, object), oldest first.
    cancels: HashMap<(Arc<str>, ObjectKey), VecDeque<Instant>>,
    /// Since when the runtime's heartbeat has been stale, as far as the scans saw.
    runtime_stalled_since: Option<Instant>,
    /// What the API server's reachability check last found.
    api_server: ApiServer,
    /// When the report last said that liveness holds for the API server, and since
    /// when the server has not answered.
    outage_reported: Option<(Instant, Instant)>,
    budget: Budget,
    /// Lines over the budget, per kind, until their summary.
    pending: [Pending; 3],
    /// Recent pauses, oldest first: a reconcile's elapsed time and the runtime's
    /// heartbeat age are judged without them.
    pauses: VecDeque<Pause>,
    /// A pause observed since the last step, to report.
    new_pause: Option<Pause>,
}

impl Verdict {
    /// A verdict with nothing reported yet.
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self {
            budget: Budget::new(config.report_burst, config.reports_per_minute),
            config,
            scans: 0,
            tracked: HashMap::default(),
            deferred: HashSet::default(),
            cancels: HashMap::new(),
            runtime_stalled_since: None,
            api_server: ApiServer::NotChecked,
            outage_reported: None,
            pending: Default::default(),
            pauses: VecDeque::new(),
            new_pause: None,
        }
    }

    /// The configuration it decides by.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Tells it what the API server's reachability check found, before a
    /// [`step`](Self::step).
    pub fn observe_api_server(&mut self, api_server: ApiServer) {
        self.api_server = api_server;
    }

    /// Tells it, before a [`step`](Self::step), how late the scan at `now` came after
    /// its planned time, and how long the cgroup was CPU-throttled meanwhile (when
    /// cgroup v2 says). Later than the runtime stall threshold, or later than an
    /// interval while throttled, the process did not run: that time counts toward no
    /// deadline and no heartbeat age, and the step reports it once. Returns the pause.
    pub fn observe_lateness(
        &mut self,
        now: Instant,
        late: Duration,
        throttled: Option<Duration>,
    ) -> Option<Pause> {
        let paused = late > self.config.runtime_stall_threshold
            || (late > self.config.interval && throttled.is_some_and(|t| !t.is_zero()));
        if !paused {
            return None;
        }
        let pause = Pause {
            ended: now,
            length: late,
            throttled,
        };
        self.observe_pause(pause);
        Some(pause)
    }

    fn observe_pause(&mut self, pause: Pause) {
        if self.pauses.len() == PAUSES {
            self.pauses.pop_front();
        }
        self.pauses.push_back(pause);
        self.new_pause = Some(pause);
    }

    /// How long the process did not run since `since`, as far as the pauses remembered
    /// tell.
    fn paused_since(&self, since: Instant) -> Duration {
        self.pauses
            .iter()
            .rev()
            .take_while(|p| p.ended > since)
            .map(|p| p.within(since))
            .sum()
    }

    /// One scan: `in_flight` is the registry's snapshot, `ended` the reconciles that
    /// finished after being reported hung, `runtime_heartbeat_age` the age of the async
    /// runtime's heartbeat (None when no runtime is watched), and `now` the clock.
    pub fn step<'a>(
        &mut self,
        in_flight: &'a [InFlight],
        ended: Vec<Ended>,
        runtime_heartbeat_age: Option<Duration>,
        now: Instant,
    ) -> Decision<'a> {
        let mut decision = Decision::default();
        let mut lines = Lines::default();
        if let Some(pause) = self.new_pause.take() {
            decision.events.push(Event::Paused(pause));
        }
        // The heartbeat could not beat while the process did not run either.
        let runtime_heartbeat_age = runtime_heartbeat_age
            .map(|age| age.saturating_sub(self.paused_since(now.checked_sub(age).unwrap_or(now))));

        // 1. Reconciles that ended since the last scan: report them, count cancellations.
        let mut cancelled_now = Vec::new();
        for end in ended {
            if self.deferred.remove(&end.reconcile.id) {
                continue;
            }
            let named = self
                .tracked
                .remove(&end.reconcile.id)
                .is_some_and(|t| t.named);
            if end.outcome == Outcome::Cancelled {
                let key = (
                    Arc::clone(&end.reconcile.controller),
                    end.reconcile.object.clone(),
                );
                self.cancels.entry(key.clone()).or_default().push_back(now);
                cancelled_now.push(key);
            }
            lines.ended.push(Line::Ended(Box::new(end), named));
        }
        self.forget_old_cancels(now);
        // The cancellation that reaches the limit escalates, once, in the log too.
        if self.config.policy == HangPolicy::Cancel {
            for (controller, object) in cancelled_now {
                let count = self.cancels.get(&(Arc::clone(&controller), object.clone()));
                if count.is_some_and(|t| t.len() == self.config.cancel_limit as usize) {
                    decision.events.push(Event::Escalated {
                        reconcile: None,
                        controller,
                        reason: format!(
                            "cancelled {} times within {}; a restart is the honest answer",
                            self.config.cancel_limit,
                            fmt_duration(self.config.cancel_window)
                        ),
                        object,
                    });
                }
            }
        }

        // 2. Every in-flight reconcile: on time, newly overdue, or still overdue. While
        // the runtime is stalled, those that wait are its victims, not hangs of their own.
        let runtime_stalled =
            runtime_heartbeat_age.is_some_and(|age| age > self.config.runtime_stall_threshold);
        // The heartbeat beats every half interval: two beats missed, and a wake that
        // never came may be the runtime's doing (its timers stopped), not the await's.
        let runtime_late =
            !runtime_stalled && runtime_heartbeat_age.is_some_and(|age| age > self.config.interval);
        self.scans += 1;
        // A mass hang tracks thousands at once: grow the map once, not by doubling.
        self.tracked
            .reserve(in_flight.len().saturating_sub(self.tracked.len()));
        let mut victims = Vec::new();
        for reconcile in in_flight {
            if !reconcile.is_overdue(now) {
                continue;
            }
            // A deadline is of running time: what the process did not run is not
            // counted. One overdue by the clock alone was marked by the registry's scan,
            // so its end comes back; it is not reported, as no hang of its was.
            let running = reconcile
                .elapsed(now)
                .saturating_sub(self.paused_since(reconcile.started));
            if running <= reconcile.deadline {
                if !self.tracked.contains_key(&reconcile.id) {
                    self.deferred.insert(reconcile.id);
                }
                continue;
            }
            self.judge_overdue(
                reconcile,
                running,
                (runtime_stalled, runtime_late),
                now,
                &mut decision,
                &mut lines,
                &mut victims,
            );
        }
        // Whatever we tracked that is gone ended without us hearing of it (it finished
        // between the snapshot and its marking): nothing left to remember.
        let scan = self.scans;
        self.tracked.retain(|_, tracked| tracked.seen == scan);

        // 3. Liveness: the oldest few that fail it named, the rest counted; objects
        // cancelled too often are named first (a restart is the honest answer).
        decision.reconcilers_failure = self.reconcilers_failure(&decision.overdue);

        // 4. The async runtime's heartbeat, and the victims of its stall.
        self.judge_runtime(in_flight, runtime_heartbeat_age, now, &mut decision);
        if !victims.is_empty() {
            decision.events.push(stall_victims(victims, now));
        }

        // 5. The API server: say once (then now and then) that liveness holds for it.
        self.judge_api_server(now, &mut decision);

        // 6. The budget: which per-reconcile lines are written, and what is counted.
        self.spend_budget(lines, now, &mut decision);
        decision
    }

    #[allow(clippy::too_many_arguments)] // the step's state, passed down as it is
    fn judge_overdue<'a>(
        &mut self,
        reconcile: &'a InFlight,
        elapsed: Duration,
        (runtime_stalled, runtime_late): (bool, bool),
        now: Instant,
        decision: &mut Decision<'a>,
        lines: &mut Lines<'a>,
        victims: &mut Vec<InFlight>,
    ) {
        let state = HangState::of(reconcile, runtime_stalled);
        // A new await that never woke, while the runtime's heartbeat is late: judged
        // once the runtime either stalls (then it is a victim) or beats again (then it
        // is a hang of its own), which the stall threshold bounds. Liveness meanwhile
        // is as for any hang.
        if runtime_late && state == HangState::Awaiting && !self.tracked.contains_key(&reconcile.id)
        {
            let fails_liveness = self.config.policy == HangPolicy::Restart;
            self.defer(
                reconcile,
                HangState::Starved,
                elapsed,
                fails_liveness,
                decision,
            );
            return;
        }
        // A new await overdue under `restart`, while the latest check that found the API
        // server answering was sent before this deadline passed: an outage may have
        // begun since. Judged once a check sent after the deadline tells (asked for now),
        // or after `api_server_confirm_within` whatever the checks do; liveness holds
        // meanwhile.
        if state == HangState::Awaiting
            && self.config.policy == HangPolicy::Restart
            && !self.tracked.contains_key(&reconcile.id)
            && let ApiServer::Answers { asked_at } = self.api_server
        {
            let overdue_at = reconcile.started + reconcile.deadline;
            decision.ask_api_server = true;
            if asked_at < overdue_at && now < overdue_at + self.config.api_server_confirm_within {
                self.defer(reconcile, state, elapsed, false, decision);
                return;
            }
        }
        let deadlines = deadlines_crossed(elapsed, reconcile.deadline);
        let policy = self.config.policy;
        let interval = self.config.interval;
        let api_server_silent = matches!(self.api_server, ApiServer::Silent { .. });

        let tracked = self.tracked.entry(reconcile.id);
        let first = matches!(tracked, std::collections::hash_map::Entry::Vacant(_));
        let tracked = tracked.or_insert(Tracked {
            seen: 0,
            deadlines: 0,
            cancel_requested_at: None,
            escalated: false,
            named: false,
        });
        tracked.seen = self.scans;

        let action = match policy {
            HangPolicy::Restart => Action::FailLiveness,
            HangPolicy::Report => Action::ReportOnly,
            HangPolicy::Cancel if tracked.escalated => Action::Escalated,
            HangPolicy::Cancel => match tracked.cancel_requested_at {
                // Asked before and still here a whole interval later: it cannot stop.
                Some(at) if now.saturating_duration_since(at) >= interval => {
                    tracked.escalated = true;
                    decision.events.push(Event::Escalated {
                        reconcile: Some(reconcile.clone()),
                        controller: Arc::clone(&reconcile.controller),
                        object: reconcile.object.clone(),
                        reason: format!(
                            "still running {} after the cancel request ({state})",
                            fmt_duration(now.saturating_duration_since(at))
                        ),
                    });
                    Action::Escalated
                }
                Some(_) => cancel_action(state),
                None => {
                    tracked.cancel_requested_at = Some(now);
                    decision.cancel.push(reconcile.id);
                    cancel_action(state)
                }
            },
        };
        // An await that never woke while the API server does not answer is most likely
        // a request to it: a restart cannot help, and every pod restarting at once would
        // re-list into a server just coming back. Hangs inside a poll are not its doing.
        let action = if action.fails_liveness() && state == HangState::Awaiting && api_server_silent
        {
            Action::HeldForApiServer
        } else {
            action
        };

        if first {
            self.deferred.remove(&reconcile.id);
            decision.ask_api_server |= state == HangState::Awaiting;
            decision.mark_hung.push(reconcile.id);
            decision
                .newly_hung
                .push((Arc::clone(&reconcile.controller), state));
            tracked.deadlines = deadlines;
            if state == HangState::Starved && runtime_stalled {
                victims.push(reconcile.clone());
            } else {
                lines.hung.push(Line::Hung {
                    reconcile,
                    state,
                    action,
                });
            }
        } else if deadlines > tracked.deadlines {
            tracked.deadlines = deadlines;
            lines.still_hung.push(Line::StillHung {
                reconcile,
                state,
                deadlines,
                action,
            });
        }

        decision.overdue.push(Overdue {
            reconcile,
            state,
            elapsed,
            fails_liveness: action.fails_liveness(),
        });
    }

    /// Leaves an overdue reconcile unjudged this scan: shown as overdue (failing liveness
    /// or not), not reported; its end, if it ends first, is not reported either.
    fn defer<'a>(
        &mut self,
        reconcile: &'a InFlight,
        state: HangState,
        elapsed: Duration,
        fails_liveness: bool,
        decision: &mut Decision<'a>,
    ) {
        self.deferred.insert(reconcile.id);
        decision.overdue.push(Overdue {
            reconcile,
            state,
            elapsed,
            fails_liveness,
        });
    }

    fn reconcilers_failure(&self, overdue: &[Overdue<'_>]) -> Option<String> {
        enum Failure<'a> {
            Overdue(&'a Overdue<'a>),
            CancelledTooOften(&'a Arc<str>, &'a ObjectKey, usize),
        }
        let mut failures: Vec<Failure<'_>> = overdue
            .iter()
            .filter(|o| o.fails_liveness)
            .map(Failure::Overdue)
            .collect();
        if self.config.policy == HangPolicy::Cancel {
            for ((controller, object), times) in &self.cancels {
                if times.len() >= self.config.cancel_limit as usize {
                    failures.push(Failure::CancelledTooOften(controller, object, times.len()));
                }
            }
        }
        if failures.is_empty() {
            return None;
        }
        let window = fmt_duration(self.config.cancel_window);
        Some(name_few(
            &failures,
            NAMED,
            "; ",
            |f| match f {
                Failure::Overdue(o) => o.elapsed,
                Failure::CancelledTooOften(..) => Duration::MAX,
            },
            |f| match f {
                Failure::Overdue(o) => describe_overdue(o),
                Failure::CancelledTooOften(controller, object, n) => {
                    format!("{controller} {object} cancelled {n} times within {window}")
                }
            },
            |f| match f {
                Failure::Overdue(o) => Group(&o.reconcile.controller, o.state.as_str()),
                Failure::CancelledTooOften(controller, ..) => {
                    Group(controller, "cancelled too often")
                }
            },
        ))
    }

    fn forget_old_cancels(&mut self, now: Instant) {
        let window = self.config.cancel_window;
        self.cancels.retain(|_, times| {
            while times
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) > window)
            {
                times.pop_front();
            }
            !times.is_empty()
        });
    }

    fn judge_runtime(
        &mut self,
        in_flight: &[InFlight],
        age: Option<Duration>,
        now: Instant,
        decision: &mut Decision<'_>,
    ) {
        let stalled = age.filter(|age| *age > self.config.runtime_stall_threshold);
        match (stalled, self.runtime_stalled_since) {
            (Some(age), None) => {
                self.runtime_stalled_since = Some(now.checked_sub(age).unwrap_or(now));
                let in_poll = in_flight
                    .iter()
                    .filter(|r| matches!(r.poll, PollState::InPoll { .. }))
                    .cloned()
                    .collect();
                decision.events.push(Event::RuntimeStalled { age, in_poll });
            }
            (None, Some(since)) => {
                self.runtime_stalled_since = None;
                decision.events.push(Event::RuntimeRecovered {
                    stalled_for: now.saturating_duration_since(since),
                });
            }
            _ => {}
        }
        if let Some(age) = stalled {
            decision.runtime_failure = Some(format!(
                "async runtime heartbeat is {} old (threshold {})",
                fmt_duration(age),
                fmt_duration(self.config.runtime_stall_threshold)
            ));
        }
    }

    fn judge_api_server(&mut self, now: Instant, decision: &mut Decision<'_>) {
        let held = decision
            .overdue
            .iter()
            .filter(|o| o.state == HangState::Awaiting && !o.fails_liveness)
            .count();
        match (&self.api_server, self.outage_reported) {
            (ApiServer::Silent { since, why }, reported) if held > 0 => {
                let due = reported.is_none_or(|(at, _)| {
                    now.saturating_duration_since(at) >= self.config.outage_reminder
                });
                if due {
                    self.outage_reported = Some((now, *since));
                    decision.events.push(Event::ApiServerSilent {
                        silent_for: now.saturating_duration_since(*since),
                        why: why.clone(),
                        held,
                        reminder: reported.is_some(),
                    });
                }
            }
            (ApiServer::Answers { .. } | ApiServer::NotChecked, Some((_, since))) => {
                self.outage_reported = None;
                decision.events.push(Event::ApiServerAnswers {
                    silent_for: now.saturating_duration_since(since),
                    still_stuck: decision
                        .overdue
                        .iter()
                        .filter(|o| o.state == HangState::Awaiting && o.fails_liveness)
                        .count(),
                });
            }
            _ => {}
        }
    }

    /// Writes the per-reconcile lines the budget allows (new hangs first, then ends,
    /// then reminders) and counts the rest into their kind's summary. New hangs are
    /// written up to the budget; ends and reminders only when all of a scan's fit,
    /// since a few of a thousand reminders tell nothing the summary does not.
    /// Remembers that the hang `id` was named on a line (if it is still tracked).
    fn mark_named(&mut self, id: u64) {
        if let Some(tracked) = self.tracked.get_mut(&id) {
            tracked.named = true;
        }
    }

    fn spend_budget(&mut self, lines: Lines<'_>, now: Instant, decision: &mut Decision<'_>) {
        let every = self.config.summary_every;
        let mut by_rank: [Vec<Line<'_>>; 3] = Default::default();
        for line in lines.hung {
            by_rank[line.rank()].push(line);
        }
        let hung: Vec<Line<'_>> = by_rank.into_iter().flatten().collect();
        let kinds = [
            (SummaryKind::Hung, hung),
            (SummaryKind::Ended, lines.ended),
            (SummaryKind::StillHung, lines.still_hung),
        ];
        for (index, (kind, kind_lines)) in kinds.into_iter().enumerate() {
            let written = match kind {
                SummaryKind::Hung => self.budget.take(kind_lines.len(), now),
                SummaryKind::Ended | SummaryKind::StillHung => {
                    self.budget.take_all(kind_lines.len(), now)
                }
            };
            let mut kind_lines = kind_lines.into_iter();
            for line in kind_lines.by_ref().take(written) {
                self.mark_named(line.id());
                decision.events.push(line.into_event());
            }
            for line in kind_lines {
                let named = match &line {
                    Line::Ended(_, named) => *named,
                    _ => self.tracked.get(&line.id()).is_some_and(|t| t.named),
                };
                self.pending[index].add(line.group(), line.started(), !named, line.id(), || {
                    line.name()
                });
            }
            if let Some((summary, named)) = self.pending[index].flush(kind, every, now) {
                for id in named {
                    self.mark_named(id);
                }
                if kind == SummaryKind::Hung {
                    decision.hangs_unnamed += summary.unnamed;
                }
                decision.events.push(Event::Summary(summary));
            }
        }
    }
}

/// A controller and a state (or outcome): what lists and summaries count by, compared
/// and shown without an allocation per reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Group<'a>(pub(crate) &'a str, pub(crate) &'static str);

impl fmt::Display for Group<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}

fn stall_victims(victims: Vec<InFlight>, now: Instant) -> Event {
    let listed = name_few(
        &victims,
        NAMED,
        "; ",
        |r| r.elapsed(now),
        |r| describe_starved(r, now),
        |r| Group(&r.controller, HangState::Starved.as_str()),
    );
    let count = victims.len();
    let mut named = victims;
    named.sort_unstable_by_key(|r| std::cmp::Reverse(r.elapsed(now)));
    named.truncate(NAMED);
    Event::StallVictims {
        named,
        count,
        listed,
    }
}

/// `controller object running 6s, woken 4s ago`: a victim of a stall.
#[must_use]
pub(crate) fn describe_starved(r: &InFlight, now: Instant) -> String {
    let woken = match r.poll {
        PollState::Woken { since } => format!(
            "woken {} ago, not polled since",
            fmt_duration(now.saturating_duration_since(since))
        ),
        _ => "waiting while the runtime is stalled".into(),
    };
    format!(
        "{} {} running {}, {woken}",
        r.controller,
        r.object,
        fmt_duration(r.elapsed(now))
    )
}

fn cancel_action(state: HangState) -> Action {
    match state {
        HangState::Awaiting | HangState::Starved => Action::CancelRequested,
        HangState::InPoll => Action::CancelPendingInPoll,
    }
}

/// How many whole deadlines `elapsed` spans (at least 1 once overdue).
fn deadlines_crossed(elapsed: Duration, deadline: Duration) -> u32 {
    if deadline.is_zero() {
        return 1;
    }
    u32::try_from(elapsed.as_nanos() / deadline.as_nanos())
        .unwrap_or(u32::MAX)
        .max(1)
}

fn describe_overdue(overdue: &Overdue<'_>) -> String {
    let r = &overdue.reconcile;
    format!(
        "{} {} running {}, deadline {} ({})",
        r.controller,
        r.object,
        fmt_duration(overdue.elapsed),
        fmt_duration(r.deadline),
        overdue.state
    )
}

/// A duration rounded to milliseconds, in humantime's words (`3s 12ms`).
#[must_use]
pub(crate) fn fmt_duration(d: Duration) -> String {
    let millis = Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    if millis.is_zero() && !d.is_zero() {
        return humantime::format_duration(Duration::from_micros(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
        ))
        .to_string();
    }
    humantime::format_duration(millis).to_string()
}

#[cfg(test)]
mod tests;
