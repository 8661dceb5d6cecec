//! Property tests of the verdict: random sequences of starts, polls, wakes, ends,
//! cancellations and clock steps, on the real registry and an injected clock, driven
//! as the monitor thread drives them.
//!
//! Invariants: exactly one ERROR (`Hung`) per hang episode; an `Ended` event for every
//! reported hang that ends, and only for those; under `restart`, liveness fails if and
//! only if some reconcile is overdue; under `report`, never; no tracked state outlives
//! its reconcile.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::verdict::{Config, Event, HangPolicy, Verdict};
use crate::guard::{ControllerCounts, Guard, InFlight, ObjectKey, Outcome, Registry};

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

/// The registry, the verdict and the clock, with what the invariants remember.
struct World {
    registry: Registry,
    verdict: Verdict,
    policy: HangPolicy,
    clock: Instant,
    guards: Vec<Guard>,
    /// `Hung` events per reconcile.
    hung: HashMap<u64, u32>,
    /// Reconciles a scan saw overdue.
    overdue_seen: HashSet<u64>,
    /// Reported hung, then ended: each owes one `Ended` event.
    owed_ended: HashSet<u64>,
    ended_reported: HashSet<u64>,
    snapshot: Vec<InFlight>,
    counts: ControllerCounts,
}

impl World {
    fn new(policy: HangPolicy) -> Self {
        // Deadlines of one and two ticks, so that hangs happen within a short sequence.
        let registry = Registry::new(
            crate::guard::Deadlines::new(TICK)
                .with("c0", TICK)
                .with("c1", 2 * TICK),
        );
        Self {
            registry,
            // A report budget no sequence exhausts: these invariants are about the
            // per-reconcile events; the budget's summaries have tests of their own
            // (`verdict::tests`).
            verdict: Verdict::new(Config {
                interval: TICK,
                policy,
                report_burst: 1_000_000,
                reports_per_minute: 1_000_000,
                ..Config::default()
            }),
            policy,
            clock: Instant::now(),
            guards: Vec::new(),
            hung: HashMap::new(),
            overdue_seen: HashSet::new(),
            owed_ended: HashSet::new(),
            ended_reported: HashSet::new(),
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
        if self.hung.contains_key(&id) {
            self.owed_ended.insert(id);
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
            self.registry.mark_reported_hung(*id);
        }
        for id in &decision.cancel {
            self.registry.request_cancel(*id);
        }

        let overdue_now: Vec<u64> = self
            .registry
            .snapshot()
            .iter()
            .filter(|r| r.is_overdue(now))
            .map(|r| r.id)
            .collect();
        self.overdue_seen.extend(&overdue_now);
        for event in &decision.events {
            match event {
                Event::Hung { reconcile, .. } => {
                    let n = self.hung.entry(reconcile.id).or_default();
                    *n += 1;
                    prop_assert_eq!(*n, 1, "a second ERROR for reconcile {}", reconcile.id);
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
                _ => {}
            }
        }
        // Every overdue reconcile has had its one ERROR by the end of this scan.
        for id in &overdue_now {
            prop_assert_eq!(
                self.hung.get(id).copied(),
                Some(1),
                "reconcile {} overdue",
                id
            );
        }
        match self.policy {
            HangPolicy::Restart => prop_assert_eq!(
                decision.reconcilers_failure.is_some(),
                !overdue_now.is_empty(),
                "restart: liveness fails iff some reconcile is overdue: {:?}",
                decision.reconcilers_failure
            ),
            HangPolicy::Report => prop_assert!(
                decision.reconcilers_failure.is_none(),
                "report never fails liveness: {:?}",
                decision.reconcilers_failure
            ),
            HangPolicy::Cancel => {}
        }
        Ok(())
    }

    /// Ends every reconcile, scans, and checks that nothing is left over.
    fn finish(mut self) -> Result<(), TestCaseError> {
        while !self.guards.is_empty() {
            self.end(0, Some(Outcome::Ok));
        }
        self.scan()?;
        prop_assert!(
            self.owed_ended.is_empty(),
            "hangs that ended without an Ended event: {:?}",
            self.owed_ended
        );
        for id in &self.overdue_seen {
            prop_assert_eq!(self.hung.get(id).copied(), Some(1), "reconcile {}", id);
        }
        prop_assert!(self.registry.is_empty());
        prop_assert!(self.registry.take_ended().is_empty());
        // The verdict's memory of reconciles is private; its Debug form shows it. (The
        // per-object cancellation history is kept on purpose, for the window.)
        let memory = format!("{:?}", self.verdict);
        prop_assert!(memory.contains("tracked: {}"), "{}", memory);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_verdict_keeps_its_invariants(
        policy in policy(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut world = World::new(policy);
        for op in &ops {
            world.apply(op)?;
        }
        world.finish()?;
    }
}
