//! The verdict's tests: the decision driven with an injected clock, scenario by scenario.

use std::time::SystemTime;

use super::*;
use crate::guard::ThreadInfo;

const SECOND: Duration = Duration::from_secs(1);

/// A reconcile of `controller` on `object` that started at `started`.
fn reconcile(
    id: u64,
    controller: &str,
    object: &str,
    deadline: Duration,
    started: Instant,
) -> InFlight {
    InFlight {
        id,
        controller: controller.into(),
        kind: "Widget".into(),
        object: ObjectKey::namespaced("ns", object),
        deadline,
        started,
        started_at: SystemTime::UNIX_EPOCH,
        polls: 1,
        poll: PollState::Awaiting,
        last_poll_began: Some(started),
        thread: Some(ThreadInfo {
            name: "worker".into(),
            tid: Some(42),
            id: std::thread::current().id(),
            runtime: None,
        }),
        task_id: Some(7),
        cancel_requested: false,
        no_waker: false,
        request: None,
        label: None,
    }
}

fn in_poll(mut r: InFlight, since: Instant) -> InFlight {
    r.poll = PollState::InPoll { since };
    r
}

fn verdict(policy: HangPolicy) -> Verdict {
    Verdict::new(Config {
        policy,
        interval: SECOND,
        ..Config::default()
    })
}

fn hung_ids(d: &Decision<'_>) -> Vec<u64> {
    d.events
        .iter()
        .filter_map(|e| match e {
            Event::Hung { reconcile, .. } => Some(reconcile.id),
            _ => None,
        })
        .collect()
}

fn ended(r: &InFlight, outcome: Outcome, elapsed: Duration) -> Ended {
    Ended {
        reconcile: r.clone(),
        elapsed,
        outcome,
    }
}

#[test]
fn on_time_reconciles_are_left_alone() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Restart);
    let r = reconcile(1, "web", "a", 5 * SECOND, t0);
    // Exactly at the deadline is still on time: "outlives" means strictly past it.
    for at in [t0, t0 + 4 * SECOND, t0 + 5 * SECOND] {
        let d = v.step(std::slice::from_ref(&r), vec![], None, at);
        assert!(d.events.is_empty() && d.overdue.is_empty() && d.reconcilers_failure.is_none());
    }
}

#[test]
fn crossing_the_deadline_reports_once_and_fails_liveness() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Restart);
    let r = reconcile(1, "web", "a", 5 * SECOND, t0);

    let d = v.step(std::slice::from_ref(&r), vec![], None, t0 + 6 * SECOND);
    assert_eq!(hung_ids(&d), vec![1]);
    assert_eq!(d.mark_hung, vec![1]);
    assert!(matches!(
        &d.events[0],
        Event::Hung {
            state: HangState::Awaiting,
            action: Action::FailLiveness,
            ..
        }
    ));
    let failure = d.reconcilers_failure.expect("liveness fails");
    assert_eq!(failure, "web ns/a running 6s, deadline 5s (awaiting)");
    assert!(d.cancel.is_empty());

    // The next scans within the same multiple of the deadline stay quiet but failing.
    let d = v.step(std::slice::from_ref(&r), vec![], None, t0 + 7 * SECOND);
    assert!(d.events.is_empty());
    assert!(d.mark_hung.is_empty());
    assert!(d.reconcilers_failure.is_some());
}

#[test]
fn a_reminder_for_each_further_deadline() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Restart);
    let r = reconcile(1, "web", "a", 5 * SECOND, t0);
    let mut reminders = Vec::new();
    for s in 6..=21 {
        let d = v.step(std::slice::from_ref(&r), vec![], None, t0 + s * SECOND);
        for e in d.events {
            if let Event::StillHung { deadlines, .. } = e {
                reminders.push((s, deadlines));
            }
        }
    }
    assert_eq!(reminders, vec![(10, 2), (15, 3), (20, 4)]);
}

#[test]
fn recovery_reports_the_end_and_clears_liveness() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Restart);
    let r = reconcile(1, "web", "a", 5 * SECOND, t0);
    v.step(std::slice::from_ref(&r), vec![], None, t0 + 6 * SECOND);

    let d = v.step(
        &[],
        vec![ended(&r, Outcome::Ok, 8 * SECOND)],
        None,
        t0 + 8 * SECOND,
    );
    assert!(d.reconcilers_failure.is_none());
    assert!(d.overdue.is_empty());
    assert!(matches!(&d.events[..], [Event::Ended(e)] if e.outcome == Outcome::Ok));

    // A new reconcile of the same object that hangs again is a new hang.
    let again = reconcile(2, "web", "a", 5 * SECOND, t0 + 9 * SECOND);
    let d = v.step(std::slice::from_ref(&again), vec![], None, t0 + 15 * SECOND);
    assert_eq!(hung_ids(&d), vec![2]);
}

#[test]
fn several_hung_reconciles_at_once() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Restart);
    let reconciles = [
        reconcile(1, "web", "a", 5 * SECOND, t0),
        in_poll(reconcile(2, "db", "b", 5 * SECOND, t0), t0 + SECOND),
        reconcile(3, "web", "c", 5 * SECOND, t0 + 4 * SECOND), // on time at 6s
    ];
    let d = v.step(&reconciles, vec![], None, t0 + 6 * SECOND);
    let mut ids = hung_ids(&d);
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2]);
    assert_eq!(d.overdue.len(), 2);
    let failure = d.reconcilers_failure.unwrap();
    assert!(
        failure.contains("web ns/a running 6s")
            && failure.contains("db ns/b running 6s, deadline 5s (in-poll)"),
        "{failure}"
    );
    assert!(!failure.contains("ns/c"));
}

#[test]
fn per_controller_deadlines() {
    let t0 = Instant::now();
    let deadlines = crate::guard::Deadlines::new(5 * SECOND).with("slow", 60 * SECOND);
    let mut v = verdict(HangPolicy::Restart);
    let reconciles = [
        reconcile(1, "fast", "a", deadlines.for_controller("fast"), t0),
        reconcile(2, "slow", "b", deadlines.for_controller("slow"), t0),
    ];
    let d = v.step(&reconciles, vec![], None, t0 + 30 * SECOND);
    assert_eq!(hung_ids(&d), vec![1]);
    let d = v.step(&reconciles, vec![], None, t0 + 61 * SECOND);
    assert_eq!(hung_ids(&d), vec![2]);
}

#[test]
fn report_policy_logs_but_stays_healthy() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Report);
    let r = reconcile(1, "web", "a", 5 * SECOND, t0);
    let d = v.step(std::slice::from_ref(&r), vec![], None, t0 + 6 * SECOND);
    assert!(matches!(
        &d.events[0],
        Event::Hung {
            action: Action::ReportOnly,
            ..
        }
    ));
    assert!(d.reconcilers_failure.is_none());
    assert!(d.cancel.is_empty());
    assert_eq!(d.overdue.len(), 1);
}

#[test]
fn cancel_policy_cancels_an_await_and_stays_healthy() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Cancel);
    let r = reconcile(1, "web", "a", 5 * SECOND, t0);
    let d = v.step(std::slice::from_ref(&r), vec![], None, t0 + 6 * SECOND);
    assert_eq!(d.cancel, vec![1]);
    assert!(matches!(
        &d.events[0],
        Event::Hung {
            action: Action::CancelRequested,
            ..
        }
    ));
    assert!(d.reconcilers_failure.is_none());
    // It ends cancelled before the next scan.
    let d = v.step(
        &[],
        vec![ended(&r, Outcome::Cancelled, 6 * SECOND)],
        None,
        t0 + 7 * SECOND,
    );
    assert!(d.reconcilers_failure.is_none());
}

#[test]
fn cancel_policy_escalates_a_hang_that_cannot_see_the_cancel() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Cancel);
    let r = in_poll(reconcile(1, "web", "a", 5 * SECOND, t0), t0 + SECOND);
    let d = v.step(std::slice::from_ref(&r), vec![], None, t0 + 6 * SECOND);
    assert_eq!(d.cancel, vec![1]);
    assert!(matches!(
        &d.events[0],
        Event::Hung {
            action: Action::CancelPendingInPoll,
            ..
        }
    ));
    assert!(
        d.reconcilers_failure.is_none(),
        "one interval of grace first"
    );

    let d = v.step(
        std::slice::from_ref(&r),
        vec![],
        None,
        t0 + 6 * SECOND + SECOND / 2,
    );
    assert!(d.reconcilers_failure.is_none() && d.cancel.is_empty());

    let d = v.step(std::slice::from_ref(&r), vec![], None, t0 + 7 * SECOND);
    assert!(d.cancel.is_empty(), "asked once is enough");
    assert!(matches!(&d.events[..], [Event::Escalated { .. }]));
    assert!(d.reconcilers_failure.unwrap().contains("web ns/a"));

    // Stays escalated, and its reminders say so.
    let d = v.step(std::slice::from_ref(&r), vec![], None, t0 + 10 * SECOND);
    assert!(matches!(
        &d.events[..],
        [Event::StillHung {
            action: Action::Escalated,
            ..
        }]
    ));
    assert!(d.reconcilers_failure.is_some());
}

#[test]
fn cancel_policy_escalates_an_object_cancelled_too_often() {
    let t0 = Instant::now();
    let mut v = Verdict::new(Config {
        policy: HangPolicy::Cancel,
        interval: SECOND,
        cancel_limit: 3,
        cancel_window: 60 * SECOND,
        ..Config::default()
    });
    let mut now = t0;
    for id in 1..=3 {
        let r = reconcile(id, "web", "a", 5 * SECOND, now);
        now += 6 * SECOND;
        let d = v.step(std::slice::from_ref(&r), vec![], None, now);
        assert_eq!(d.cancel, vec![id]);
        now += SECOND;
        let d = v.step(
            &[],
            vec![ended(&r, Outcome::Cancelled, 6 * SECOND)],
            None,
            now,
        );
        let failing = d.reconcilers_failure.is_some();
        assert_eq!(failing, id == 3, "cancellation {id}");
        // The cancellation that reaches the limit is logged as an escalation, once.
        let escalations = d
            .events
            .iter()
            .filter(|e| matches!(e, Event::Escalated { .. }))
            .count();
        assert_eq!(escalations, usize::from(id == 3), "cancellation {id}");
    }
    assert!(
        v.step(&[], vec![], None, now).events.is_empty(),
        "escalated once, not per scan"
    );
    let d = v.step(&[], vec![], None, now);
    assert_eq!(
        d.reconcilers_failure.unwrap(),
        "web ns/a cancelled 3 times within 1m"
    );
    // Once the window has passed, the count ages out and liveness recovers.
    let d = v.step(&[], vec![], None, now + 60 * SECOND);
    assert!(d.reconcilers_failure.is_none());
}

#[test]
fn a_stalled_runtime_fails_once_and_recovers() {
    let t0 = Instant::now();
    let mut v = Verdict::new(Config {
        runtime_stall_threshold: 10 * SECOND,
        ..Config::default()
    });
    let stuck = in_poll(reconcile(1, "web", "a", 600 * SECOND, t0), t0);
    let d = v.step(
        std::slice::from_ref(&stuck),
        vec![],
        Some(9 * SECOND),
        t0 + 9 * SECOND,
    );
    assert!(d.runtime_failure.is_none() && d.events.is_empty());

    let d = v.step(
        std::slice::from_ref(&stuck),
        vec![],
        Some(11 * SECOND),
        t0 + 11 * SECOND,
    );
    assert!(
        d.runtime_failure
            .unwrap()
            .starts_with("async runtime heartbeat is 11s old")
    );
    assert!(matches!(&d.events[..], [Event::RuntimeStalled { in_poll, .. }] if in_poll.len() == 1));

    let d = v.step(
        std::slice::from_ref(&stuck),
        vec![],
        Some(12 * SECOND),
        t0 + 12 * SECOND,
    );
    assert!(d.events.is_empty() && d.runtime_failure.is_some());

    let d = v.step(&[], vec![], Some(SECOND / 2), t0 + 13 * SECOND);
    assert!(d.runtime_failure.is_none());
    assert!(matches!(&d.events[..], [Event::RuntimeRecovered { .. }]));
}

/// Every log line a scan's events make (a summary is one line).
fn lines(d: &Decision<'_>) -> usize {
    d.events.len()
}

#[test]
fn a_mass_hang_reports_a_burst_then_one_summary_and_names_the_oldest_few() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Restart);
    let reconciles: Vec<InFlight> = (0..1000)
        .map(|i| {
            let started = t0 + Duration::from_millis(i);
            reconcile(i, "web", &format!("o-{i:04}"), 5 * SECOND, started)
        })
        .collect();
    let d = v.step(&reconciles, vec![], None, t0 + 6 * SECOND);
    assert_eq!(
        d.newly_hung.len(),
        1000,
        "every hang counted for the metrics"
    );
    assert_eq!(d.mark_hung.len(), 1000);
    assert_eq!(d.overdue.len(), 1000);
    assert_eq!(hung_ids(&d).len(), 10, "the burst");
    let summaries: Vec<&Summary> = d
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Summary(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(
        summaries,
        [&Summary {
            kind: SummaryKind::Hung,
            count: 990,
            by_group: "web awaiting 990".into(),
            named: (10..30)
                .map(|i| format!("web ns/o-{i:04}"))
                .collect::<Vec<_>>()
                .join(", "),
            unnamed: 970,
        }]
    );
    assert_eq!(d.hangs_unnamed, 970, "counted for the metrics");
    let failure = d.reconcilers_failure.unwrap();
    assert!(failure.len() < 1024, "{} bytes: {failure}", failure.len());
    assert!(
        failure.starts_with("web ns/o-0000 running 6s, deadline 5s (awaiting); web ns/o-0001"),
        "the oldest first: {failure}"
    );
    assert!(
        failure.ends_with("; and 995 more: web awaiting 995"),
        "{failure}"
    );
}

#[test]
fn a_thousand_hangs_write_few_lines_in_five_minutes() {
    // The default budget, a one-second interval, and deadlines short enough that
    // reminders come every 30 s: each scan's reminders spend the rate, the rest
    // wait for the summary period.
    for deadline in [300 * SECOND, 60 * SECOND, 30 * SECOND] {
        let t0 = Instant::now();
        let mut v = Verdict::new(Config::default());
        let reconciles: Vec<InFlight> = (0..1000)
            .map(|i| reconcile(i, "web", &format!("o-{i}"), deadline, t0))
            .collect();
        let first = t0 + deadline + SECOND;
        let mut total = 0;
        let mut named = HashSet::new();
        let mut unnamed = 0;
        for s in 0..300 {
            let d = v.step(&reconciles, vec![], None, first + s * SECOND);
            total += lines(&d);
            unnamed += d.hangs_unnamed;
            for event in &d.events {
                match event {
                    Event::Hung { reconcile, .. } => {
                        named.insert(format!("{} {}", reconcile.controller, reconcile.object));
                    }
                    Event::Summary(s) if s.kind == SummaryKind::Hung => {
                        named.extend(s.named.split(", ").map(str::to_owned));
                    }
                    _ => {}
                }
            }
        }
        eprintln!(
            "1000 hangs, deadline {deadline:?}: {total} lines in their first 5 minutes, {} hangs named, {unnamed} never",
            named.len()
        );
        assert_eq!(
            named.len() + unnamed,
            1000,
            "each hang named or counted as not"
        );
        assert!(
            total < 50,
            "{total} lines in 5 minutes for deadline {deadline:?}"
        );
    }
}

#[test]
fn reminders_name_the_hangs_no_line_has_named_yet() {
    // A thousand hangs that last: the first report names 30; each later summary
    // names hangs never named before, none twice, until every one has its name.
    let t0 = Instant::now();
    let deadline = 30 * SECOND;
    let mut v = Verdict::new(Config::default());
    let reconciles: Vec<InFlight> = (0..1000)
        .map(|i| reconcile(i, "web", &format!("o-{i}"), deadline, t0))
        .collect();
    let first = t0 + deadline + SECOND;
    let mut named = HashSet::new();
    let mut in_summaries = Vec::new();
    for s in 0..600 {
        let d = v.step(&reconciles, vec![], None, first + s * SECOND);
        for event in &d.events {
            match event {
                Event::Hung { reconcile, .. } | Event::StillHung { reconcile, .. } => {
                    named.insert(format!("{} {}", reconcile.controller, reconcile.object));
                }
                Event::Summary(s) if !s.named.is_empty() => {
                    let names: Vec<String> = s.named.split(", ").map(str::to_owned).collect();
                    in_summaries.extend(names.iter().cloned());
                    named.extend(names);
                }
                _ => {}
            }
        }
    }
    let distinct: HashSet<&String> = in_summaries.iter().collect();
    eprintln!(
        "1000 hangs, deadline 30s: {} named in their first 10 minutes",
        named.len()
    );
    assert_eq!(
        distinct.len(),
        in_summaries.len(),
        "a name repeated while others waited"
    );
    assert!(named.len() > 200, "{} named", named.len());
}

#[test]
fn a_late_scan_suspends_judgment_and_running_time_counts() {
    let t0 = Instant::now();
    let mut v = Verdict::new(Config {
        interval: SECOND / 2,
        runtime_stall_threshold: 3 * SECOND,
        ..Config::default()
    });
    let r = reconcile(1, "web", "a", 3 * SECOND, t0);
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    // The heartbeat beats every scan until the process stops at 1 s.
    let d = v.step(std::slice::from_ref(&r), vec![], Some(SECOND / 4), at(1000));
    assert!(d.events.is_empty());

    // Stopped 8 s 240 ms: the next scan, due at 1.5 s, comes at 9.74 s.
    let late = Duration::from_millis(8240);
    let pause = v.observe_lateness(at(9740), late, None).expect("a pause");
    assert_eq!(pause.length, late);
    let d = v.step(
        std::slice::from_ref(&r),
        vec![],
        Some(Duration::from_millis(8740)),
        at(9740),
    );
    assert!(
        matches!(&d.events[..], [Event::Paused(p)] if p.length == late),
        "one pause, no stall, no victims, no hang: {:?}",
        d.events
    );
    assert!(d.overdue.is_empty() && d.reconcilers_failure.is_none() && d.runtime_failure.is_none());
    assert!(d.mark_hung.is_empty());

    // The heartbeat beats again; the reconcile has run 1.5 s of its 3 s.
    let d = v.step(
        std::slice::from_ref(&r),
        vec![],
        Some(SECOND / 4),
        at(10_240),
    );
    assert!(
        d.events.is_empty() && d.overdue.is_empty(),
        "{:?}",
        d.events
    );
    // Past 3 s of running time (give or take the scan), it is a hang like any other.
    let d = v.step(
        std::slice::from_ref(&r),
        vec![],
        Some(SECOND / 4),
        at(11_800),
    );
    assert_eq!(hung_ids(&d), [1]);
    assert!(d.reconcilers_failure.is_some());
}

#[test]
fn a_wedge_after_a_pause_is_still_a_stall() {
    let t0 = Instant::now();
    let mut v = Verdict::new(Config {
        interval: SECOND / 2,
        runtime_stall_threshold: 3 * SECOND,
        ..Config::default()
    });
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    v.step(&[], vec![], Some(SECOND / 4), at(1000));
    assert!(v.observe_lateness(at(9500), 8 * SECOND, None).is_some());
    // The heartbeat last beat at 0.75 s and never again: 8 s of it were the pause,
    // and from 11.75 s on the rest is past the threshold.
    let d = v.step(&[], vec![], Some(Duration::from_millis(8750)), at(9500));
    assert!(d.runtime_failure.is_none(), "{:?}", d.events);
    let d = v.step(&[], vec![], Some(Duration::from_millis(10_750)), at(11_500));
    assert!(d.runtime_failure.is_none());
    let d = v.step(&[], vec![], Some(Duration::from_millis(11_250)), at(12_000));
    assert!(d.runtime_failure.is_some());
    assert!(
        matches!(&d.events[..], [Event::RuntimeStalled { .. }]),
        "{:?}",
        d.events
    );
}

#[test]
fn lateness_is_a_pause_past_the_stall_threshold_or_while_throttled() {
    let t0 = Instant::now();
    let mut v = Verdict::new(Config {
        interval: SECOND / 2,
        runtime_stall_threshold: 3 * SECOND,
        ..Config::default()
    });
    assert!(v.observe_lateness(t0, 2 * SECOND, None).is_none());
    assert!(
        v.observe_lateness(t0, 2 * SECOND, Some(Duration::ZERO))
            .is_none()
    );
    assert!(
        v.observe_lateness(t0, SECOND / 4, Some(SECOND)).is_none(),
        "on time"
    );
    let throttled = v
        .observe_lateness(t0, 2 * SECOND, Some(SECOND))
        .expect("late while throttled");
    assert_eq!(throttled.throttled, Some(SECOND));
    assert!(v.observe_lateness(t0, 4 * SECOND, None).is_some());
}

#[test]
fn twelve_hangs_a_minute_are_each_named_on_some_line() {
    // The default budget, with every reminder and end spending it too: one object
    // after another black-holed, each held for 3 s past its deadline and released.
    let t0 = Instant::now();
    let mut v = Verdict::new(Config::default());
    let deadline = 3 * SECOND;
    let mut named = HashSet::new();
    let mut in_flight: Vec<InFlight> = Vec::new();
    let mut unnamed = 0;
    for s in 0..120_u32 {
        let now = t0 + s * SECOND;
        // A new hang every 5 s during the first minute.
        if s % 5 == 0 && s < 60 {
            let i = u64::from(s / 5);
            in_flight.push(reconcile(
                i,
                "configtemplates",
                &format!("o-{i:02}"),
                deadline,
                now,
            ));
        }
        let (done, running): (Vec<InFlight>, Vec<InFlight>) = in_flight
            .drain(..)
            .partition(|r| r.elapsed(now) >= 2 * deadline);
        in_flight = running;
        let ended = done
            .iter()
            .map(|r| ended(r, Outcome::Ok, r.elapsed(now)))
            .collect();
        let d = v.step(&in_flight, ended, None, now);
        unnamed += d.hangs_unnamed;
        for event in &d.events {
            match event {
                Event::Hung { reconcile, .. } => {
                    named.insert(reconcile.object.to_string());
                }
                Event::Summary(s) if s.kind == SummaryKind::Hung => {
                    named.extend(
                        s.named
                            .split(", ")
                            .map(|n| n["configtemplates ".len()..].to_owned()),
                    );
                }
                _ => {}
            }
        }
    }
    let all: HashSet<String> = (0..12).map(|i| format!("ns/o-{i:02}")).collect();
    assert_eq!(named, all);
    assert_eq!(unnamed, 0);
}

#[test]
fn lines_over_the_budget_are_summarised_at_most_once_per_period() {
    let t0 = Instant::now();
    let mut v = Verdict::new(Config {
        report_burst: 2,
        reports_per_minute: 0,
        summary_every: 10 * SECOND,
        ..Config::default()
    });
    let mut in_flight = Vec::new();
    let mut summarised = 0;
    let mut reported = 0;
    for s in 0..30_u32 {
        // One new hang a second, two per scan from the third second on.
        in_flight.push(reconcile(
            2 * u64::from(s),
            "web",
            "a",
            SECOND,
            t0 + s * SECOND,
        ));
        in_flight.push(reconcile(
            2 * u64::from(s) + 1,
            "db",
            "b",
            SECOND,
            t0 + s * SECOND,
        ));
        let d = v.step(&in_flight, vec![], None, t0 + (s + 2) * SECOND);
        reported += hung_ids(&d).len();
        for e in &d.events {
            if let Event::Summary(summary) = e
                && summary.kind == SummaryKind::Hung
            {
                summarised += summary.count;
                assert!(
                    summary.by_group.contains("web awaiting")
                        && summary.by_group.contains("db awaiting"),
                    "{summary:?}"
                );
            }
        }
    }
    assert_eq!(reported, 2, "the burst, then no rate");
    // Summaries at 2 s, 12 s, 22 s of the run: the hangs of the last scans wait
    // for the next period, counted, not lost.
    let d = v.step(&in_flight, vec![], None, t0 + 60 * SECOND);
    for e in &d.events {
        if let Event::Summary(summary) = e
            && summary.kind == SummaryKind::Hung
        {
            summarised += summary.count;
        }
    }
    assert_eq!(reported + summarised, 60, "every hang reported or counted");
}

#[test]
fn liveness_holds_for_awaits_while_the_api_server_does_not_answer() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Restart);
    let awaiting = reconcile(1, "web", "a", 5 * SECOND, t0);
    let stuck = in_poll(reconcile(2, "web", "b", 5 * SECOND, t0), t0);
    let since = t0 + 2 * SECOND;
    v.observe_api_server(ApiServer::Silent {
        since,
        why: "no answer within 2s".into(),
    });

    let d = v.step(
        std::slice::from_ref(&awaiting),
        vec![],
        None,
        t0 + 6 * SECOND,
    );
    assert!(d.reconcilers_failure.is_none(), "a restart cannot help");
    assert!(
        matches!(
            &d.events[..],
            [
                Event::ApiServerSilent {
                    held: 1,
                    reminder: false,
                    ..
                },
                Event::Hung {
                    action: Action::HeldForApiServer,
                    ..
                },
            ]
        ),
        "{:?}",
        d.events
    );
    assert_eq!(d.newly_hung.len(), 1, "still counted");

    // Said once, then a reminder at the reminder rate.
    let d = v.step(
        std::slice::from_ref(&awaiting),
        vec![],
        None,
        t0 + 7 * SECOND,
    );
    assert!(d.events.is_empty(), "{:?}", d.events);
    let d = v.step(
        std::slice::from_ref(&awaiting),
        vec![],
        None,
        t0 + 66 * SECOND,
    );
    assert!(
        d.events
            .iter()
            .any(|e| matches!(e, Event::ApiServerSilent { reminder: true, .. })),
        "{:?}",
        d.events
    );

    // A hang inside a poll is not the API server's doing.
    let both = [awaiting.clone(), stuck];
    let d = v.step(&both, vec![], None, t0 + 67 * SECOND);
    let failure = d
        .reconcilers_failure
        .expect("the in-poll hang fails liveness");
    assert!(
        failure.contains("ns/b") && !failure.contains("ns/a"),
        "{failure}"
    );

    // It answers again and the await is still stuck on its old request: the normal
    // verdict (a restart is the cure for a stuck connection).
    v.observe_api_server(ApiServer::Answers {
        asked_at: t0 + 67 * SECOND,
    });
    let d = v.step(
        std::slice::from_ref(&awaiting),
        vec![],
        None,
        t0 + 68 * SECOND,
    );
    assert!(d.reconcilers_failure.unwrap().contains("ns/a"));
    assert!(
        matches!(
            &d.events[..],
            [Event::ApiServerAnswers { still_stuck: 1, silent_for }] if *silent_for == 66 * SECOND
        ),
        "{:?}",
        d.events
    );
}

#[test]
fn a_new_await_is_judged_once_a_check_sent_after_its_deadline_tells() {
    let t0 = Instant::now();
    // A verdict whose latest check answered a second after the start: before the
    // deadline of 5 s.
    let answered_early = || {
        let mut v = verdict(HangPolicy::Restart);
        v.observe_api_server(ApiServer::Answers {
            asked_at: t0 + SECOND,
        });
        v
    };
    let awaiting = reconcile(1, "web", "a", 5 * SECOND, t0);
    let stuck = in_poll(reconcile(2, "web", "b", 5 * SECOND, t0), t0);
    let both = [awaiting.clone(), stuck];
    let step = |v: &mut Verdict, at: Instant| {
        let d = v.step(std::slice::from_ref(&awaiting), vec![], None, at);
        (d.reconcilers_failure, d.events, d.mark_hung)
    };

    // Overdue: the await waits for a newer check (asked for), liveness holds for it
    // and nothing is reported of it yet; the hang inside a poll is judged at once.
    let mut v = answered_early();
    let d = v.step(&both, vec![], None, t0 + 6 * SECOND);
    assert!(d.ask_api_server);
    let failure = d
        .reconcilers_failure
        .expect("the in-poll hang fails liveness");
    assert!(!failure.contains("ns/a"), "{failure}");
    assert_eq!(d.mark_hung, vec![2]);
    assert_eq!(d.overdue.len(), 2, "both are overdue in the view");

    // A check sent after the deadline found the server silent: held, reported so.
    v.observe_api_server(ApiServer::Silent {
        since: t0 + 6 * SECOND,
        why: "no answer within 2s".into(),
    });
    let (failure, events, _) = step(&mut v, t0 + 7 * SECOND);
    assert!(failure.is_none());
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Hung {
                action: Action::HeldForApiServer,
                ..
            }
        )),
        "{events:?}"
    );

    // Another await: this time the check after its deadline answered.
    let mut v = answered_early();
    let (failure, events, _) = step(&mut v, t0 + 6 * SECOND);
    assert!(failure.is_none() && events.is_empty());
    v.observe_api_server(ApiServer::Answers {
        asked_at: t0 + 6 * SECOND,
    });
    let (failure, _, found) = step(&mut v, t0 + 7 * SECOND);
    assert!(failure.unwrap().contains("ns/a"));
    assert_eq!(found, vec![1]);

    // No newer check within `api_server_confirm_within`: judged all the same.
    let mut v = answered_early();
    let late = t0 + 5 * SECOND + v.config().api_server_confirm_within;
    let (failure, _, _) = step(&mut v, late);
    assert!(failure.unwrap().contains("ns/a"));

    // One that ends while it waits was never reported hung: its end is not either.
    let mut v = answered_early();
    let (_, events, _) = step(&mut v, t0 + 6 * SECOND);
    assert!(events.is_empty());
    let end = Ended {
        reconcile: awaiting.clone(),
        elapsed: 7 * SECOND,
        outcome: Outcome::Ok,
    };
    let d = v.step(&[], vec![end], None, t0 + 7 * SECOND);
    assert!(d.events.is_empty(), "{:?}", d.events);
    assert!(format!("{v:?}").contains("deferred: {}"));
}

#[test]
fn a_woken_reconcile_not_polled_since_is_starved() {
    let t0 = Instant::now();
    let mut v = verdict(HangPolicy::Restart);
    let mut victim = reconcile(1, "web", "a", 5 * SECOND, t0);
    victim.poll = PollState::Woken {
        since: t0 + 2 * SECOND,
    };
    let d = v.step(std::slice::from_ref(&victim), vec![], None, t0 + 6 * SECOND);
    assert!(matches!(
        &d.events[..],
        [Event::Hung {
            state: HangState::Starved,
            ..
        }]
    ));
    assert!(d.reconcilers_failure.unwrap().ends_with("(starved)"));
    assert_eq!(
        describe_starved(&victim, t0 + 6 * SECOND),
        "web ns/a running 6s, woken 4s ago, not polled since"
    );
}

#[test]
fn overdue_reconciles_of_a_stalled_runtime_are_its_victims() {
    let t0 = Instant::now();
    let mut v = Verdict::new(Config {
        runtime_stall_threshold: 2 * SECOND,
        ..Config::default()
    });
    let culprit = in_poll(reconcile(1, "web", "a", 5 * SECOND, t0), t0 + SECOND);
    let waiting: Vec<InFlight> = (2..40)
        .map(|i| reconcile(i, "web", &format!("w-{i}"), 5 * SECOND, t0))
        .collect();
    let mut all = vec![culprit];
    all.extend(waiting);
    let d = v.step(&all, vec![], Some(5 * SECOND), t0 + 6 * SECOND);
    // The culprit is reported on its own; its victims once, under the stall.
    assert_eq!(hung_ids(&d), vec![1]);
    let victims: Vec<_> = d
        .events
        .iter()
        .filter_map(|e| match e {
            Event::StallVictims {
                count,
                listed,
                named,
            } => Some((count, listed, named.len())),
            _ => None,
        })
        .collect();
    assert_eq!(victims.len(), 1, "{:?}", d.events);
    let (count, listed, named) = victims[0];
    assert_eq!((*count, named), (38, NAMED));
    assert!(
        listed.contains("waiting while the runtime is stalled")
            && listed.ends_with("and 33 more: web starved 33"),
        "{listed}"
    );
    assert!(
        d.events
            .iter()
            .any(|e| matches!(e, Event::RuntimeStalled { .. }))
    );
    assert_eq!(
        d.overdue
            .iter()
            .filter(|o| o.state == HangState::Starved)
            .count(),
        38
    );
    assert_eq!(d.newly_hung.len(), 39, "the victims are counted too");
}

#[test]
fn a_new_await_is_judged_once_a_late_heartbeat_stalls_or_beats_again() {
    let t0 = Instant::now();
    let mut v = Verdict::new(Config {
        interval: SECOND / 4,
        runtime_stall_threshold: 3 * SECOND,
        ..Config::default()
    });
    let a = reconcile(1, "web", "a", SECOND, t0);
    let b = reconcile(2, "web", "b", SECOND, t0);
    // The heartbeat is two beats late: no report yet, but liveness is as for a hang.
    let d = v.step(
        std::slice::from_ref(&a),
        vec![],
        Some(SECOND),
        t0 + 2 * SECOND,
    );
    assert!(
        d.events.is_empty() && d.newly_hung.is_empty(),
        "{:?}",
        d.events
    );
    assert_eq!(d.overdue[0].state, HangState::Starved);
    assert!(d.reconcilers_failure.is_some());
    // It beats again: a hang of its own.
    let d = v.step(
        std::slice::from_ref(&a),
        vec![],
        Some(SECOND / 10),
        t0 + 3 * SECOND,
    );
    assert!(matches!(
        &d.events[..],
        [Event::Hung {
            state: HangState::Awaiting,
            ..
        }]
    ));
    // Another, late again, then the runtime stalls: a victim.
    let both = [a, b];
    let d = v.step(&both, vec![], Some(2 * SECOND), t0 + 4 * SECOND);
    assert!(
        !d.events.iter().any(|e| matches!(e, Event::Hung { .. })),
        "{:?}",
        d.events
    );
    let d = v.step(&both, vec![], Some(4 * SECOND), t0 + 6 * SECOND);
    assert!(
        d.events.iter().any(
            |e| matches!(e, Event::StallVictims { count: 1, listed, .. } if listed.contains("ns/b"))
        ),
        "{:?}",
        d.events
    );
    assert!(!d.events.iter().any(|e| matches!(e, Event::Hung { .. })));
}

#[test]
fn the_burst_goes_to_hangs_inside_a_poll_first() {
    let t0 = Instant::now();
    let mut v = Verdict::new(Config {
        report_burst: 1,
        ..Config::default()
    });
    let mut all: Vec<InFlight> = (0..5)
        .map(|i| reconcile(i, "web", &format!("w-{i}"), SECOND, t0))
        .collect();
    all.push(in_poll(reconcile(9, "db", "stuck", SECOND, t0), t0));
    let d = v.step(&all, vec![], None, t0 + 2 * SECOND);
    assert_eq!(hung_ids(&d), vec![9]);
}

#[test]
fn durations_read_well() {
    assert_eq!(fmt_duration(Duration::from_micros(3_012_345)), "3s 12ms");
    assert_eq!(fmt_duration(Duration::from_micros(250)), "250us");
    assert_eq!(fmt_duration(Duration::ZERO), "0s");
    assert_eq!(
        deadlines_crossed(Duration::from_secs(11), Duration::from_secs(5)),
        2
    );
    assert_eq!(deadlines_crossed(Duration::from_secs(1), Duration::ZERO), 1);
}
