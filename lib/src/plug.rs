//! The seams that the kube integration plugs into: the core knows no Kubernetes, only
//! these three traits.
//!
//! A [`Watchdog`](crate::Watchdog) takes an [`ApiServerReachability`] (so that an API outage
//! fails readiness, not liveness), [`WatchAges`] (so that a silent watch fails
//! readiness and shows in the metrics) and [`HangReports`] (so that what the log says
//! of a hung reconcile also reaches where its users look) from its
//! [`Builder`](crate::Builder). The kube integration's `kube::ApiServerCheck`,
//! `kube::watches::Watches` and `kube::events::HangEvents` are the ones this crate
//! ships; anything else that can tell the same may be plugged in instead.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::guard::{ObjectKey, Outcome};
use crate::health::Health;
use crate::monitor::verdict::{Action, Event};
use crate::monitor::{ApiServerStatus, HangState, Observer, Scan};
use crate::restart::Cause;

/// Knows whether the API server answers at all: records each answer into its
/// [`ApiServerStatus`], which the monitor, the `api-server` readiness check and the
/// metrics read.
pub trait ApiServerReachability: Send + Sync + fmt::Debug + 'static {
    /// The status it records into.
    fn status(&self) -> Arc<ApiServerStatus>;

    /// How soon after the monitor asks for a check it has recorded an answer (or given
    /// up) at the latest: the monitor waits that long for a check sent after a deadline
    /// before it judges a new await past it.
    fn answer_within(&self) -> Duration;
}

/// One watched resource at a moment: what the `watches` check, its reports and the
/// `reconcile_watchdog_watch_age_seconds` gauge show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchAge {
    /// The controllers that watch it.
    pub controllers: Vec<String>,
    /// The resource, as its source names it (`plural.group` for Kubernetes).
    pub resource: String,
    /// How long since its last sign of life.
    pub age: Duration,
}

/// Knows when each watch the controllers run last showed a sign of life.
pub trait WatchAges: Send + Sync + fmt::Debug + 'static {
    /// Called once as the watchdog starts, with the health sets that its readiness
    /// check joins.
    fn attach(&self, health: &Arc<Health>);

    /// Every expected watch and its age at `now`.
    fn ages(&self, now: Instant) -> Vec<WatchAge>;
}

/// Which per-reconcile line of the hang report a [`HangReport`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reported {
    /// It crossed its deadline (the log's ERROR `reconcile hung`).
    Hung,
    /// It crossed one more multiple of its deadline (the WARN reminder).
    StillHung,
    /// It ended after it was reported hung.
    Ended,
    /// It ended after it was reported hung, cancelled by the watchdog (`--on-hang
    /// cancel`); its controller requeues it.
    Cancelled,
}

/// One per-reconcile line of the hang report, as the log got it.
#[derive(Clone, Copy, Debug)]
pub struct HangReport<'a> {
    /// Which line.
    pub reported: Reported,
    /// The controller that runs the reconcile.
    pub controller: &'a str,
    /// The kind of the object reconciled.
    pub kind: &'a str,
    /// The object reconciled.
    pub object: &'a ObjectKey,
    /// How long it had run (in all, once it ended).
    pub elapsed: Duration,
    /// Its deadline.
    pub deadline: Duration,
    /// Where it is stuck, while it is.
    pub state: Option<HangState>,
    /// What the policy did, while it is stuck.
    pub action: Option<Action>,
    /// How it ended, once it did.
    pub outcome: Option<Outcome>,
    /// Where it waits, while it is stuck awaiting and the guard knows (the request in
    /// flight, a labelled await, no waker alive).
    pub waiting: Option<crate::guard::Waiting<'a>>,
}

/// Told of every per-reconcile line of the hang report (hung, still hung, ended) that
/// the log got, so within the log's budget: a mass hang tells it no more than the log
/// writes. Called on the monitor thread, so it must neither block nor wait: hand the
/// report on (to a bounded queue) and return.
pub trait HangReports: Send + Sync + fmt::Debug + 'static {
    /// One line of the report.
    fn reported(&self, report: &HangReport<'_>);

    /// How many reports it could not pass on so far (a full queue, a destination that
    /// does not answer): `reconcile_watchdog_events_dropped_total`.
    fn dropped(&self) -> u64;

    /// Liveness began to fail because of hung reconciles, an escalation or a runtime
    /// stall, for `cause`: once per failing episode (until liveness passes again), on
    /// the monitor thread, so it must neither block nor wait. By default nothing.
    fn liveness_failing(&self, cause: &Cause) {
        let _ = cause;
    }
}

/// The per-reconcile lines among a scan's `events`, as reports at `now` (the scan's
/// moment, for the elapsed time of those still in flight).
pub(crate) fn hang_reports(events: &[Event], now: Instant) -> impl Iterator<Item = HangReport<'_>> {
    events.iter().filter_map(move |event| match event {
        Event::Hung {
            reconcile,
            state,
            action,
        }
        | Event::StillHung {
            reconcile,
            state,
            action,
            ..
        } => Some(HangReport {
            reported: if matches!(event, Event::Hung { .. }) {
                Reported::Hung
            } else {
                Reported::StillHung
            },
            controller: &reconcile.controller,
            kind: &reconcile.kind,
            object: &reconcile.object,
            elapsed: reconcile.elapsed(now),
            deadline: reconcile.deadline,
            state: Some(*state),
            action: Some(*action),
            outcome: None,
            waiting: reconcile.waiting(),
        }),
        Event::Ended(end) => Some(HangReport {
            reported: if end.outcome == Outcome::Cancelled {
                Reported::Cancelled
            } else {
                Reported::Ended
            },
            controller: &end.reconcile.controller,
            kind: &end.reconcile.kind,
            object: &end.reconcile.object,
            elapsed: end.elapsed,
            deadline: end.reconcile.deadline,
            state: None,
            action: None,
            outcome: Some(end.outcome),
            waiting: None,
        }),
        _ => None,
    })
}

/// Hands each scan's hang report lines to a [`HangReports`], and the start of each
/// liveness failure.
#[derive(Debug)]
pub(crate) struct ReportsObserver {
    reports: Arc<dyn HangReports>,
    /// Whether liveness failed after the previous scan.
    failing: AtomicBool,
}

impl ReportsObserver {
    pub(crate) fn new(reports: Arc<dyn HangReports>) -> Self {
        Self {
            reports,
            failing: AtomicBool::new(false),
        }
    }
}

impl Observer for ReportsObserver {
    fn scanned(&self, scan: &Scan<'_>) {
        let was_failing = self.failing.swap(scan.cause.is_some(), Ordering::Relaxed);
        if let Some(cause) = scan.cause
            && !was_failing
        {
            self.reports.liveness_failing(cause);
        }
        // The scan began `took` ago: its moment, as the log's lines have it.
        let now = Instant::now()
            .checked_sub(scan.took)
            .unwrap_or_else(Instant::now);
        for report in hang_reports(&scan.decision.events, now) {
            self.reports.reported(&report);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::SystemTime;

    use super::*;
    use crate::guard::{Ended, InFlight, PollState};
    use crate::monitor::verdict::{Summary, SummaryKind};

    fn reconcile(object: &str, started: Instant) -> InFlight {
        InFlight {
            id: 1,
            controller: "widgets".into(),
            kind: "Widget".into(),
            object: ObjectKey::namespaced("ns", object),
            deadline: Duration::from_secs(2),
            started,
            started_at: SystemTime::UNIX_EPOCH,
            polls: 1,
            poll: PollState::Awaiting,
            last_poll_began: Some(started),
            thread: None,
            task_id: None,
            cancel_requested: false,
            no_waker: false,
            request: None,
            label: None,
        }
    }

    #[test]
    fn the_per_reconcile_lines_become_reports_and_nothing_else_does() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(5);
        let ended = |object, outcome| {
            Event::Ended(Ended {
                reconcile: reconcile(object, t0),
                elapsed: Duration::from_secs(7),
                outcome,
            })
        };
        let events = [
            Event::Hung {
                reconcile: reconcile("a", t0),
                state: HangState::Awaiting,
                action: Action::FailLiveness,
            },
            Event::Summary(Summary {
                kind: SummaryKind::Hung,
                count: 140,
                by_group: "widgets awaiting 140".into(),
                named: "widgets ns/x".into(),
                unnamed: 139,
            }),
            Event::StillHung {
                reconcile: reconcile("b", t0),
                state: HangState::InPoll,
                deadlines: 2,
                action: Action::ReportOnly,
            },
            ended("c", Outcome::Ok),
            ended("d", Outcome::Cancelled),
            Event::RuntimeRecovered {
                stalled_for: Duration::from_secs(3),
            },
        ];
        let reports: Vec<_> = hang_reports(&events, now).collect();
        let what: Vec<_> = reports
            .iter()
            .map(|r| (r.reported, r.object.as_str(), r.elapsed))
            .collect();
        let (five, seven) = (Duration::from_secs(5), Duration::from_secs(7));
        assert_eq!(
            what,
            [
                (Reported::Hung, "ns/a", five),
                (Reported::StillHung, "ns/b", five),
                (Reported::Ended, "ns/c", seven),
                (Reported::Cancelled, "ns/d", seven),
            ]
        );
        assert_eq!(reports[1].state, Some(HangState::InPoll));
        assert_eq!(reports[1].action, Some(Action::ReportOnly));
        assert_eq!(
            (reports[0].controller, reports[0].kind),
            ("widgets", "Widget")
        );
        assert_eq!(reports[0].deadline, Duration::from_secs(2));
        assert_eq!(
            (reports[2].state, reports[2].outcome),
            (None, Some(Outcome::Ok))
        );
    }

    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<(Reported, String)>>);

    impl HangReports for Recorder {
        fn reported(&self, report: &HangReport<'_>) {
            let mut seen = self.0.lock().unwrap();
            seen.push((report.reported, report.object.to_string()));
        }

        fn dropped(&self) -> u64 {
            7
        }
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn a_watchdog_tells_what_it_plugged_in_of_a_hang_and_its_end_and_counts_its_drops() {
        let recorder = Arc::new(Recorder::default());
        let watchdog = crate::Watchdog::builder()
            .deadlines(Duration::from_millis(50))
            .interval(Duration::from_millis(10))
            .collect_metrics()
            .hang_reports(recorder.clone())
            .start()
            .unwrap();
        let reported = |what| {
            let seen = recorder.0.lock().unwrap();
            seen.contains(&(what, "ns/stuck".to_owned()))
        };
        let eventually = |what| {
            let start = Instant::now();
            while !reported(what) {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "never told {what:?}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let guard = watchdog
            .registry()
            .controller("widgets", "Widget")
            .register(ObjectKey::namespaced("ns", "stuck"));
        eventually(Reported::Hung);
        drop(guard);
        eventually(Reported::Ended);
        let text = watchdog.metrics().unwrap().encode();
        assert!(
            text.contains("\nreconcile_watchdog_events_dropped_total 7\n"),
            "{text}"
        );
    }
}
