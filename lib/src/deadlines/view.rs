//! The JSON of `/debug/deadlines`: per controller, its deadline and where it came from,
//! its observed durations, near misses and hangs, and a suggested deadline with the
//! flag line to paste. The same types read it back in `reconcile-watchdog deadlines`.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use warp::http::{Response, header};

use super::sketch::Summary;
use super::suggest::{Suggestion, flag_value, suggest};
use super::{Advisor, MIN_RECONCILES, Stats, threshold_text};
use crate::guard::Registry;
use crate::quarantine::Keeper;

/// The whole view.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The near-miss threshold: a share of the deadline (`80%`), or `off`.
    pub near_miss_threshold: String,
    /// Reconciles a controller needs before a deadline is suggested for it.
    pub min_reconciles: u64,
    /// One row per controller, by name.
    pub controllers: Vec<ControllerReport>,
    /// Reconciles of controllers past the advisor's cap, not in any row.
    pub untracked_reconciles: u64,
    /// Objects not reconciled while quarantined (absent from a watchdog without a
    /// quarantine).
    #[serde(default)]
    pub quarantined: QuarantinedReport,
}

/// The objects the process found quarantined: counted, the first few named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantinedReport {
    /// How many, in all.
    pub count: u64,
    /// The first ten by controller and name, as `controller namespace/name`.
    pub first: Vec<String>,
}

impl QuarantinedReport {
    /// What `keeper` found quarantined.
    #[must_use]
    pub(crate) fn of(keeper: &Keeper) -> Self {
        let (count, first) = keeper.quarantined_named();
        Self {
            count: count as u64,
            first,
        }
    }
}

/// Where a controller's deadline came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadlineSource {
    /// `--reconcile-deadline` (or its default).
    Default,
    /// `--reconcile-deadline-for NAME=DURATION`.
    Flag,
}

/// One controller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControllerReport {
    /// Its name.
    pub controller: String,
    /// Its current deadline, as a flag value (`3s`).
    pub deadline: String,
    /// The same, in seconds.
    pub deadline_seconds: f64,
    /// Where the deadline came from.
    pub deadline_source: DeadlineSource,
    /// Reconciles that ran to their end (ok, error or panic) so far.
    pub reconciles: u64,
    /// Median duration, in seconds (null before the first).
    pub p50_seconds: Option<f64>,
    /// 99th percentile, in seconds.
    pub p99_seconds: Option<f64>,
    /// 99.9th percentile, in seconds.
    pub p999_seconds: Option<f64>,
    /// The longest, in seconds.
    pub max_seconds: Option<f64>,
    /// Reconciles that ended on time past the near-miss threshold.
    pub near_misses: u64,
    /// Reconciles reported hung that have ended, plus those in flight past their
    /// deadline now.
    pub hangs: u64,
    /// The suggested deadline as a flag value (`45s`); null with too few reconciles.
    pub suggested_deadline: Option<String>,
    /// The same, in seconds.
    pub suggested_deadline_seconds: Option<f64>,
    /// The line to paste: `--reconcile-deadline-for NAME=45s`.
    pub flag: Option<String>,
    /// How the suggestion was reached, or why there is none.
    pub reasoning: String,
}

/// Builds the view of `advisor` over `registry`.
pub(super) fn report(advisor: &Advisor, registry: &Registry) -> Report {
    let deadlines = registry.deadlines();
    // Overdue reconciles in flight now, and which controllers have any in flight.
    let (mut overdue, mut in_flight) = (Vec::new(), Vec::new());
    registry.scan_into(Instant::now(), false, &mut overdue, &mut in_flight);

    let mut names: Vec<String> = advisor.all().map(|s| s.name.to_string()).collect();
    names.extend(deadlines.overridden().map(str::to_owned));
    names.extend(in_flight.iter().map(|(name, _)| name.to_string()));
    names.sort_unstable();
    names.dedup();

    let controllers = names
        .into_iter()
        .map(|name| {
            let stats = advisor.get(&name);
            let summary = stats.map_or_else(|| Summary::of([]), |s| s.sketch.summary());
            let load = |f: fn(&Stats) -> &AtomicU64| stats.map_or(0, |s| f(s).load(Relaxed));
            let overdue_now = overdue.iter().filter(|r| *r.controller == *name).count() as u64;
            let deadline = deadlines.for_controller(&name);
            let seconds = |q: f64| summary.quantile(q).map(|d| d.as_secs_f64());
            let hangs_ended = load(|s| &s.hangs_ended);
            let (suggested, mut reasoning) = match suggest(&summary, deadline) {
                Suggestion::Deadline {
                    deadline,
                    reasoning,
                } => (Some(deadline), reasoning),
                Suggestion::TooFew { observed } => (
                    None,
                    format!(
                        "too few reconciles to suggest a deadline: {observed} ended, {MIN_RECONCILES} needed"
                    ),
                ),
            };
            if hangs_ended > 0 {
                reasoning.push_str(&format!(
                    "; left out of the durations: {hangs_ended} reported hung"
                ));
            }
            ControllerReport {
                deadline: flag_value(deadline),
                deadline_seconds: deadline.as_secs_f64(),
                deadline_source: if deadlines.override_for(&name).is_some() {
                    DeadlineSource::Flag
                } else {
                    DeadlineSource::Default
                },
                reconciles: summary.count(),
                p50_seconds: seconds(0.5),
                p99_seconds: seconds(0.99),
                p999_seconds: seconds(0.999),
                max_seconds: (summary.count() > 0).then(|| summary.max().as_secs_f64()),
                near_misses: load(|s| &s.near_misses),
                hangs: hangs_ended + overdue_now,
                suggested_deadline: suggested.map(flag_value),
                suggested_deadline_seconds: suggested.map(|d| d.as_secs_f64()),
                flag: suggested.map(|d| flag_line(&name, d)),
                reasoning,
                controller: name,
            }
        })
        .collect();
    Report {
        near_miss_threshold: threshold_text(deadlines),
        min_reconciles: MIN_RECONCILES,
        controllers,
        untracked_reconciles: advisor.untracked.load(Relaxed),
        quarantined: QuarantinedReport::default(),
    }
}

/// `--reconcile-deadline-for NAME=VALUE`.
#[must_use]
pub(crate) fn flag_line(controller: &str, deadline: Duration) -> String {
    format!(
        "--reconcile-deadline-for {controller}={}",
        flag_value(deadline)
    )
}

/// The response to `GET /debug/deadlines`: the report as pretty JSON.
#[must_use]
pub(crate) fn respond(
    advisor: &Advisor,
    registry: &Registry,
    quarantine: Option<&Keeper>,
) -> Response<String> {
    let mut report = advisor.report(registry);
    if let Some(keeper) = quarantine {
        report.quarantined = QuarantinedReport::of(keeper);
    }
    let body = serde_json::to_string_pretty(&report).unwrap_or_else(|_| "{}".into());
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::guard::{Deadlines, ObjectKey, Observer, Outcome};

    #[test]
    fn lists_seen_configured_and_in_flight_controllers_with_their_figures() {
        let advisor = Advisor::new();
        let registry = Registry::with_observer(
            Deadlines::new(Duration::from_secs(3)).with("pinned", Duration::from_secs(45)),
            Arc::clone(&advisor) as Arc<dyn Observer>,
        );
        let busy = advisor.controller("busy", "K").unwrap();
        for i in 0..200_u64 {
            busy.finished(Outcome::Ok, Duration::from_millis(100 + i));
        }
        busy.finished(Outcome::Cancelled, Duration::from_secs(9));
        let _stuck = registry
            .controller("stuck", "K")
            .with_deadline(Duration::ZERO)
            .register(ObjectKey::cluster("x"));

        let report = advisor.report(&registry);
        assert_eq!(report.near_miss_threshold, "80%");
        let names: Vec<&str> = report
            .controllers
            .iter()
            .map(|c| c.controller.as_str())
            .collect();
        assert_eq!(names, ["busy", "pinned", "stuck"]);
        let (busy, pinned, stuck) = (
            &report.controllers[0],
            &report.controllers[1],
            &report.controllers[2],
        );

        assert_eq!(busy.reconciles, 200, "the cancelled one is not a duration");
        assert_eq!(busy.deadline, "3s");
        assert_eq!(busy.deadline_source, DeadlineSource::Default);
        assert_eq!(busy.max_seconds, Some(0.299));
        // 3 x p99.9 (299 ms) = 897 ms, raised to the 1 s floor.
        assert_eq!(busy.suggested_deadline.as_deref(), Some("1s"));
        assert_eq!(
            busy.flag.as_deref(),
            Some("--reconcile-deadline-for busy=1s")
        );

        assert_eq!(pinned.deadline, "45s");
        assert_eq!(pinned.deadline_source, DeadlineSource::Flag);
        assert_eq!(pinned.reconciles, 0);
        assert_eq!(pinned.p50_seconds, None);
        assert_eq!(pinned.flag, None);
        assert!(
            pinned.reasoning.starts_with("too few reconciles"),
            "{}",
            pinned.reasoning
        );

        assert_eq!(stuck.hangs, 1, "in flight past its deadline");

        let json = respond(&advisor, &registry, None);
        assert_eq!(json.headers()[header::CONTENT_TYPE], "application/json");
        let back: Report = serde_json::from_str(json.body()).unwrap();
        assert_eq!(back.controllers.len(), 3);
        assert_eq!(back.quarantined, QuarantinedReport::default());
    }

    #[test]
    fn quarantined_objects_are_counted_and_the_first_ten_named() {
        use crate::quarantine::{Keeper, Quarantine};

        let advisor = Advisor::new();
        let registry = Registry::new(Duration::from_secs(3));
        let keeper = Keeper::new(Quarantine::default());
        for i in 0..25 {
            keeper.announce_for_test("widgets", &format!("ns/w-{i:02}"));
        }
        let json = respond(&advisor, &registry, Some(&keeper));
        let back: Report = serde_json::from_str(json.body()).unwrap();
        assert_eq!(back.quarantined.count, 25);
        assert_eq!(back.quarantined.first.len(), 10);
        assert_eq!(back.quarantined.first[0], "widgets ns/w-00");
        assert_eq!(back.quarantined.first[9], "widgets ns/w-09");
        // A report of an older watchdog, without the field, still reads.
        let mut old: serde_json::Value = serde_json::from_str(json.body()).unwrap();
        old.as_object_mut().unwrap().remove("quarantined");
        let back: Report = serde_json::from_value(old).unwrap();
        assert_eq!(back.quarantined, QuarantinedReport::default());
    }
}
