//! The watchdog's decision: a pure function of (snapshot, now, config) plus the memory
//! of what has already been reported.
//!
//! Read this file top to bottom to know when the watchdog reports, cancels, escalates
//! and fails liveness. The monitor thread only drives it: it takes a snapshot of the
//! registry, calls [`Verdict::step`], and carries out the [`Decision`]. Tests drive it
//! the same way with an injected clock.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::guard::{Ended, InFlight, ObjectKey, Outcome, PollState};

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
}

impl Default for Config {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            policy: HangPolicy::Restart,
            runtime_stall_threshold: Duration::from_secs(10),
            cancel_limit: 3,
            cancel_window: Duration::from_secs(600),
        }
    }
}

/// Where an overdue reconcile is stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HangState {
    /// Not inside a poll: it awaits a wake-up that has not come.
    Awaiting,
    /// Inside one poll that has not returned: a blocking call, a lock, a busy loop.
    InPoll,
}

impl HangState {
    /// `awaiting` or `in-poll`, as in the report.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Awaiting => "awaiting",
            Self::InPoll => "in-poll",
        }
    }

    fn of(reconcile: &InFlight) -> Self {
        match reconcile.poll {
            PollState::Awaiting => Self::Awaiting,
            PollState::InPoll { .. } => Self::InPoll,
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
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
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
}

/// One overdue reconcile, as the checks and the metrics see it.
#[derive(Clone, Debug)]
pub struct Overdue {
    /// The reconcile at the scan.
    pub reconcile: InFlight,
    /// Where it is stuck.
    pub state: HangState,
    /// How long it had run at the scan.
    pub elapsed: Duration,
    /// Whether, under the policy, it fails liveness.
    pub fails_liveness: bool,
}

/// What one scan decided.
#[derive(Clone, Debug, Default)]
pub struct Decision {
    /// Events to log, in order.
    pub events: Vec<Event>,
    /// Every reconcile past its deadline.
    pub overdue: Vec<Overdue>,
    /// Reconciles newly reported hung: the registry must remember so their end is
    /// reported.
    pub mark_hung: Vec<u64>,
    /// Reconciles to cancel now.
    pub cancel: Vec<u64>,
    /// Why the `reconcilers` liveness check fails, if it does.
    pub reconcilers_failure: Option<String>,
    /// Why the `runtime` liveness check fails, if it does.
    pub runtime_failure: Option<String>,
}

/// What the verdict remembers of one reported reconcile.
#[derive(Debug)]
struct Tracked {
    /// The highest multiple of the deadline already reported.
    deadlines: u32,
    /// When the cancel policy asked it to stop.
    cancel_requested_at: Option<Instant>,
    escalated: bool,
}

/// The decision, with the memory it needs between scans.
#[derive(Debug)]
pub struct Verdict {
    config: Config,
    tracked: HashMap<u64, Tracked>,
    /// Recent cancellations per (controller, object), oldest first.
    cancels: HashMap<(Arc<str>, ObjectKey), VecDeque<Instant>>,
    /// Since when the runtime's heartbeat has been stale, as far as the scans saw.
    runtime_stalled_since: Option<Instant>,
}

impl Verdict {
    /// A verdict with nothing reported yet.
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self {
            config,
            tracked: HashMap::new(),
            cancels: HashMap::new(),
            runtime_stalled_since: None,
        }
    }

    /// The configuration it decides by.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// One scan: `in_flight` is the registry's snapshot, `ended` the reconciles that
    /// finished after being reported hung, `runtime_heartbeat_age` the age of the async
    /// runtime's heartbeat (None when no runtime is watched), and `now` the clock.
    pub fn step(
        &mut self,
        in_flight: &[InFlight],
        ended: Vec<Ended>,
        runtime_heartbeat_age: Option<Duration>,
        now: Instant,
    ) -> Decision {
        let mut decision = Decision::default();

        // 1. Reconciles that ended since the last scan: report them, count cancellations.
        let mut cancelled_now = Vec::new();
        for end in ended {
            self.tracked.remove(&end.reconcile.id);
            if end.outcome == Outcome::Cancelled {
                let key = (
                    Arc::clone(&end.reconcile.controller),
                    end.reconcile.object.clone(),
                );
                self.cancels.entry(key.clone()).or_default().push_back(now);
                cancelled_now.push(key);
            }
            decision.events.push(Event::Ended(end));
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

        // 2. Every in-flight reconcile: on time, newly overdue, or still overdue.
        let mut seen = Vec::new();
        for reconcile in in_flight {
            if !reconcile.is_overdue(now) {
                continue;
            }
            seen.push(reconcile.id);
            self.judge_overdue(reconcile, now, &mut decision);
        }
        // Whatever we tracked that is gone ended without us hearing of it (it finished
        // between the snapshot and its marking): nothing left to remember.
        self.tracked.retain(|id, _| seen.contains(id));

        // 3. Objects cancelled too often: a restart is the honest answer.
        let mut failures: Vec<String> = decision
            .overdue
            .iter()
            .filter(|o| o.fails_liveness)
            .map(describe_overdue)
            .collect();
        if self.config.policy == HangPolicy::Cancel {
            for ((controller, object), times) in &self.cancels {
                if times.len() >= self.config.cancel_limit as usize {
                    failures.push(format!(
                        "{controller} {object} cancelled {} times within {}",
                        times.len(),
                        fmt_duration(self.config.cancel_window)
                    ));
                }
            }
        }
        failures.sort();
        if !failures.is_empty() {
            decision.reconcilers_failure = Some(failures.join("; "));
        }

        // 4. The async runtime's heartbeat.
        self.judge_runtime(in_flight, runtime_heartbeat_age, now, &mut decision);
        decision
    }

    fn judge_overdue(&mut self, reconcile: &InFlight, now: Instant, decision: &mut Decision) {
        let elapsed = reconcile.elapsed(now);
        let state = HangState::of(reconcile);
        let deadlines = deadlines_crossed(elapsed, reconcile.deadline);
        let policy = self.config.policy;
        let interval = self.config.interval;

        let tracked = self.tracked.entry(reconcile.id);
        let first = matches!(tracked, std::collections::hash_map::Entry::Vacant(_));
        let tracked = tracked.or_insert(Tracked {
            deadlines: 0,
            cancel_requested_at: None,
            escalated: false,
        });

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

        if first {
            decision.mark_hung.push(reconcile.id);
            decision.events.push(Event::Hung {
                reconcile: reconcile.clone(),
                state,
                action,
            });
            tracked.deadlines = deadlines;
        } else if deadlines > tracked.deadlines {
            tracked.deadlines = deadlines;
            decision.events.push(Event::StillHung {
                reconcile: reconcile.clone(),
                state,
                deadlines,
                action,
            });
        }

        let fails_liveness = matches!(action, Action::FailLiveness | Action::Escalated);
        decision.overdue.push(Overdue {
            reconcile: reconcile.clone(),
            state,
            elapsed,
            fails_liveness,
        });
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
        decision: &mut Decision,
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
}

fn cancel_action(state: HangState) -> Action {
    match state {
        HangState::Awaiting => Action::CancelRequested,
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

fn describe_overdue(overdue: &Overdue) -> String {
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
pub fn fmt_duration(d: Duration) -> String {
    let millis = Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    if millis.is_zero() && !d.is_zero() {
        return humantime::format_duration(Duration::from_micros(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
        ))
        .to_string();
    }
    humantime::format_duration(millis).to_string()
}
