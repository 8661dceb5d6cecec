//! Property tests of the verdict: random sequences of starts, polls, wakes, ends,
//! cancellations, API server outages and clock steps, on the real registry and an
//! injected clock, with report budgets large and small, driven as the monitor thread
//! drives them.
//!
//! Invariants: each hang episode is found once, and reported by exactly one ERROR,
//! either its own (`Hung`) or counted in a summary when the budget is spent; every
//! reported hang that ends is reported ended (its own `Ended` or a summary's count),
//! and only those; under `restart`, liveness fails if and only if some reconcile is
//! overdue, except awaits held while the API server does not answer; under `report`,
//! never; the outage is announced once, reminded, and its end follows it; no tracked
//! state outlives its reconcile.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::verdict::{ApiServer, Config, Event, HangPolicy, HangState, SummaryKind, Verdict};
use crate::guard::{ControllerCounts, Guard, InFlight, ObjectKey, Outcome, PollState, Registry};

/// The scan interval and the unit of deadlines.
const TICK: Duration = Duration::from_millis(100);

#[derive(Clone, Debug)]
enum Op {
    /// A reconcile of controller `controller` on object `object` starts.
    Start { controller: u8, object: u8 },
    /// A poll begins (a wake-up); a reconcile asked to cancel ends there, cancelled.
    PollBegins(usize),
    /// The poll returns pending: the reconcile awaits again.
    PollEnds(usize),
    /// The reconcile returns (ok, error or a caught panic).
    Finishes(usize, Outcome),
    /// The caller drops the reconcile's future.
    Dropped(usize),
    /// Something wakes the reconcile (its executor has yet to poll it).
    Wake(usize),
    /// The API server's reachability check finds it answering, or silent.
    ApiServer { answers: bool },
    /// The clock moves on.
    Advance(Duration),
    /// The monitor scans.
    Scan,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2_u8, 0..3_u8).prop_map(|(controller, object)| Op::Start { controller, object }),
        2 => any::<usize>().prop_map(Op::PollBegins),
        2 => any::<usize>().prop_map(Op::PollEnds),
        2 => (
            any::<usize>(),
            prop_oneof![Just(Outcome::Ok), Just(Outcome::Error), Just(Outcome::Panic)]
        )
            .prop_map(|(i, outcome)| Op::Finishes(i, outcome)),
        1 => any::<usize>().prop_map(Op::Dropped),
        2 => any::<usize>().prop_map(Op::Wake),
        1 => any::<bool>().prop_map(|answers| Op::ApiServer { answers }),
        3 => (0..400_u64).prop_map(|ms| Op::Advance(Duration::from_millis(ms))),
        3 => Just(Op::Scan),
    ]
}

fn policy() -> impl Strategy<Value = HangPolicy> {
    prop_oneof![
        Just(HangPolicy::Restart),
        Just(HangPolicy::Cancel),
        Just(HangPolicy::Report)
    ]
}

/// The report budget: per scan, and per minute once a scan's burst is spent. Small
/// budgets are spent within a sequence, so that summaries carry the rest.
fn budget() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![
        1 => Just((1_000_000, 1_000_000)),
        2 => (0..3_u32, 0..3_u32),
    ]
}

/// The registry, the verdict and the clock, with what the invariants remember.
struct World {
    registry: Registry,
    verdict: Verdict,
    policy: HangPolicy,
    clock: Instant,
    guards: Vec<Guard>,
    api_server: ApiServer,
    /// Reconciles found hung (`mark_hung`), and how often.
    found: HashMap<u64, u32>,
    /// Reconciles with an ERROR of their own.
    hung: HashSet<u64>,
    /// ERRORs over the budget, counted in summaries.
    hung_summarized: usize,
    /// Reconciles a scan saw overdue.
    overdue_seen: HashSet<u64>,
    /// Found hung, then ended: each owes one `Ended` event (its own or counted).
    owed_ended: HashSet<u64>,
    owed_ended_total: usize,
    ended_reported: HashSet<u64>,
    ended_summarized: usize,
    /// The outage was announced and has not been reported over.
    outage_announced: bool,
    snapshot: Vec<InFlight>,
    counts: ControllerCounts,
}

impl World {
    fn new(policy: HangPolicy, (report_burst, reports_per_minute): (u32, u32)) -> Self {
        // Deadlines of one and two ticks, so that hangs happen within a short sequence.
        let registry = Registry::new(
            crate::guard::Deadlines::new(TICK)
                .with("c0", TICK)
                .with("c1", 2 * TICK),
        );
        Self {
            registry,
            verdict: Verdict::new(Config {
                interval: TICK,
                policy,
                report_burst,
                reports_per_minute,
                ..Config::default()
            }),
            policy,
            clock: Instant::now(),
            guards: Vec::new(),
            api_server: ApiServer::NotChecked,
            found: HashMap::new(),
            hung: HashSet::new(),
            hung_summarized: 0,
            overdue_seen: HashSet::new(),
            owed_ended: HashSet::new(),
            owed_ended_total: 0,
            ended_reported: HashSet::new(),
            ended_summarized: 0,
            outage_announced: false,
            snapshot: Vec::new(),
            counts: ControllerCounts::default(),
        }
    }

    fn pick(&self, i: usize) -> Option<usize> {
        (!self.guards.is_empty()).then(|| i % self.guards.len())
    }

    /// Ends guard `at` with `outcome` (None: dropped unfinished).
    fn end(&mut self, at: usize, outcome: Option<Outcome>) {
        let guard = self.guards.swap_remove(at);
        let id = guard.id();
        if self.found.contains_key(&id) {
            self.owed_ended.insert(id);
            self.owed_ended_total += 1;
        }
        match outcome {
            Some(outcome) => guard.finish(outcome),
            None => drop(guard),
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Start { controller, object } => {
                let guard = self
                    .registry
                    .controller(&format!("c{controller}"), "Widget")
                    .register(ObjectKey::namespaced("ns", &format!("o{object}")));
                self.guards.push(guard);
            }
            Op::PollBegins(i) => {
                if let Some(at) = self.pick(i) {
                    let entry = self.guards[at].entry();
                    if entry.cancel_requested() {
                        // What `Guarded` does: the cancelled reconcile ends at this poll.
                        self.end(at, Some(Outcome::Cancelled));
                    } else if !entry.in_poll() {
                        entry.poll_begins();
                    }
                }
            }
            Op::PollEnds(i) => {
                if let Some(at) = self.pick(i) {
                    let entry = self.guards[at].entry();
                    if entry.in_poll() {
                        entry.poll_ends();
                    }
                }
            }
            Op::Finishes(i, outcome) => {
                if let Some(at) = self.pick(i) {
                    self.end(at, Some(outcome));
                }
            }
            Op::Dropped(i) => {
                if let Some(at) = self.pick(i) {
                    self.end(at, None);
                }
            }
            Op::Wake(i) => {
                if let Some(at) = self.pick(i) {
                    futures::task::ArcWake::wake_by_ref(self.guards[at].entry());
                }
            }
            Op::ApiServer { answers } => {
                let silent = matches!(self.api_server, ApiServer::Silent { .. });
                if answers {
                    self.api_server = ApiServer::Answers {
                        asked_at: self.clock,
                    };
                } else if !silent {
                    self.api_server = ApiServer::Silent {
                        since: self.clock,
                        why: "timed out".to_owned(),
                    };
                }
                self.verdict.observe_api_server(self.api_server.clone());
            }
            Op::Advance(by) => {
                self.clock += by;
                self.scan()?;
            }
            Op::Scan => self.scan()?,
        }
        Ok(())
    }

    /// One scan as the monitor thread does it, then the per-scan invariants.
    fn scan(&mut self) -> Result<(), TestCaseError> {
        // The registry's start instants are real; the clock never runs behind them.
        self.clock = self.clock.max(Instant::now());
        let now = self.clock;
        let ended = self.registry.take_ended();
        self.registry
            .scan_into(now, true, &mut self.snapshot, &mut self.counts);
        let decision = self.verdict.step(&self.snapshot, ended, None, now);
        for id in &decision.mark_hung {
            let n = self.found.entry(*id).or_default();
            *n += 1;
            prop_assert_eq!(*n, 1, "reconcile {} found hung twice", id);
        }
        prop_assert_eq!(decision.mark_hung.len(), decision.newly_hung.len());
        for id in &decision.cancel {
            self.registry.request_cancel(*id);
        }

        let overdue_now: Vec<InFlight> = self
            .registry
            .snapshot()
            .into_iter()
            .filter(|r| r.is_overdue(now))
            .collect();
        self.overdue_seen.extend(overdue_now.iter().map(|r| r.id));
        for event in &decision.events {
            match event {
                Event::Hung { reconcile, .. } => {
                    let id = reconcile.id;
                    prop_assert!(self.found.contains_key(&id), "an ERROR for {} unfound", id);
                    prop_assert!(self.hung.insert(id), "a second ERROR for reconcile {}", id);
                }
                Event::Ended(end) => {
                    let id = end.reconcile.id;
                    prop_assert!(
                        self.owed_ended.remove(&id),
                        "an Ended event for {} that was not a reported hang that ended",
                        id
                    );
                    prop_assert!(self.ended_reported.insert(id), "{} ended twice", id);
                }
                Event::Summary(summary) => match summary.kind {
                    SummaryKind::Hung => self.hung_summarized += summary.count,
                    SummaryKind::Ended => self.ended_summarized += summary.count,
                    SummaryKind::StillHung => {}
                },
                Event::ApiServerSilent { reminder, .. } => {
                    prop_assert_eq!(*reminder, self.outage_announced, "{:?}", event);
                    let silent = matches!(self.api_server, ApiServer::Silent { .. });
                    prop_assert!(silent, "an outage announced while the server answers");
                    self.outage_announced = true;
                }
                Event::ApiServerAnswers { .. } => {
                    prop_assert!(self.outage_announced, "an end of an unannounced outage");
                    self.outage_announced = false;
                }
                _ => {}
            }
        }
        // Nothing is reported twice: own lines and summaries together stay within what
        // was found (the rest waits for the next summary).
        prop_assert!(self.hung.len() + self.hung_summarized <= self.found.len());
        prop_assert!(self.ended_reported.len() + self.ended_summarized <= self.owed_ended_total);
        // Every overdue reconcile is found hung by the end of this scan, except a new
        // await under `restart` that waits (a bounded time) for a check of the API
        // server sent after its deadline.
        let api_server_silent = matches!(self.api_server, ApiServer::Silent { .. });
        let confirm_within = self.verdict.config().api_server_confirm_within;
        let mut waiting = HashSet::new();
        for r in &overdue_now {
            let awaiting = matches!(r.poll, PollState::Awaiting);
            let overdue_at = r.started + r.deadline;
            let waits = self.policy == HangPolicy::Restart
                && awaiting
                && !self.found.contains_key(&r.id)
                && matches!(self.api_server, ApiServer::Answers { asked_at } if asked_at < overdue_at)
                && now < overdue_at + confirm_within;
            if waits {
                waiting.insert(r.id);
            } else {
                prop_assert_eq!(
                    self.found.get(&r.id).copied(),
                    Some(1),
                    "reconcile {} overdue",
                    r.id
                );
            }
        }
        let fails_liveness = overdue_now.iter().any(|r| {
            // Awaits are held while the API server does not answer; a woken reconcile
            // or one inside a poll is not waiting on it.
            let awaiting = matches!(r.poll, PollState::Awaiting);
            let held = (awaiting && api_server_silent) || waiting.contains(&r.id);
            !held
        });
        match self.policy {
            HangPolicy::Restart => prop_assert_eq!(
                decision.reconcilers_failure.is_some(),
                fails_liveness,
                "restart: liveness fails iff some reconcile is overdue (API server silent: {}): {:?}",
                api_server_silent,
                decision.reconcilers_failure
            ),
            HangPolicy::Report => prop_assert!(
                decision.reconcilers_failure.is_none(),
                "report never fails liveness: {:?}",
                decision.reconcilers_failure
            ),
            HangPolicy::Cancel => {}
        }
        for overdue in &decision.overdue {
            if overdue.state == HangState::Awaiting && api_server_silent {
                prop_assert!(!overdue.fails_liveness, "{:?}", overdue);
            }
        }
        Ok(())
    }

    /// Ends every reconcile, lets the summaries come due, scans, and checks that every
    /// hang and every end was reported once and that nothing is left over.
    fn finish(mut self) -> Result<(), TestCaseError> {
        while !self.guards.is_empty() {
            self.end(0, Some(Outcome::Ok));
        }
        self.clock += self.verdict.config().summary_every;
        self.scan()?;
        prop_assert_eq!(
            self.hung.len() + self.hung_summarized,
            self.found.len(),
            "hangs found but never reported ({} own, {} summarized)",
            self.hung.len(),
            self.hung_summarized
        );
        prop_assert_eq!(
            self.ended_reported.len() + self.ended_summarized,
            self.owed_ended_total,
            "hangs that ended without an Ended event ({} own, {} summarized)",
            self.ended_reported.len(),
            self.ended_summarized
        );
        // Overdue ones that ended while they waited for the API server check were never
        // found: the rest were, once.
        for id in &self.overdue_seen {
            prop_assert!(self.found.get(id).copied() <= Some(1), "reconcile {}", id);
        }
        prop_assert!(self.registry.is_empty());
        prop_assert!(self.registry.take_ended().is_empty());
        // The verdict's memory of reconciles is private; its Debug form shows it. (The
        // per-object cancellation history is kept on purpose, for the window.)
        let memory = format!("{:?}", self.verdict);
        prop_assert!(memory.contains("tracked: {}"), "{}", memory);
        prop_assert!(memory.contains("deferred: {}"), "{}", memory);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_verdict_keeps_its_invariants(
        policy in policy(),
        budget in budget(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut world = World::new(policy, budget);
        for op in &ops {
            world.apply(op)?;
        }
        world.finish()?;
    }
}
