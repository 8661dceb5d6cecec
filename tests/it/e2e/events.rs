//! Hang reports as Events on the hung objects: one series per hang, its end,
//! none when turned off, and none that slows a reconcile during an API outage.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use serde_json::Value;

use super::harness::{Cluster, Operator, SETTLE, eventually, free_port, is};
use crate::support;

const DEADLINE: Duration = Duration::from_secs(2);

/// The Events about `name` with `reason`.
fn events(cluster: &Cluster, name: &str, reason: &str) -> Vec<Event> {
    cluster
        .events_about(name)
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// How many times an Event has been seen: its series' count, else once.
fn seen(event: &Event) -> i32 {
    event.series.as_ref().map_or(1, |s| s.count)
}

/// The log's per-reconcile lines about `object` whose message contains `text`.
fn lines(operator: &Operator, object: &str, text: &str) -> Vec<Value> {
    operator.logged(|e| {
        e["target"] == "reconcile_watchdog::hang"
            && e["object"] == object
            && e["message"].as_str().is_some_and(|m| m.contains(text))
    })
}

#[test]
fn emulator_a_black_holed_object_gets_one_hang_event_series_then_its_end() {
    let cluster = Cluster::start("events");
    cluster.emulator().black_hole("stuck");
    cluster.create("calm", None);
    let template = cluster.create("stuck", None);
    let operator = Operator::start(&cluster, DEADLINE, &[]);
    let stuck = format!("{}/stuck", cluster.namespace);

    assert!(
        eventually(SETTLE, || !events(&cluster, "stuck", "ReconcileHung")
            .is_empty()),
        "no ReconcileHung Event on the black-holed object"
    );
    let hung = events(&cluster, "stuck", "ReconcileHung").remove(0);
    assert_eq!(hung.type_.as_deref(), Some("Warning"));
    assert_eq!(hung.action.as_deref(), Some("Reconcile"));
    assert_eq!(
        hung.reporting_controller.as_deref(),
        Some("reconcile-watchdog")
    );
    assert!(
        hung.reporting_instance
            .as_deref()
            .is_some_and(|i| !i.is_empty()),
        "{hung:?}"
    );
    let regarding = hung.regarding.clone().expect("regarding");
    assert_eq!(regarding.kind.as_deref(), Some("ConfigTemplate"));
    assert_eq!(
        regarding.api_version.as_deref(),
        Some("watchdog.example.com/v1")
    );
    assert_eq!(
        regarding.namespace.as_deref(),
        Some(cluster.namespace.as_str())
    );
    // The uid from the controller's cache: `kubectl describe` looks for it.
    assert_eq!(regarding.uid, template.metadata.uid);
    let note = hung.note.clone().unwrap_or_default();
    assert!(
        note.contains("configtemplates") && note.contains("past its 2s deadline"),
        "{note}"
    );

    // Each further deadline brings a reminder to the log, and one more to the series,
    // never a new Event; the series never counts more than the log wrote.
    assert!(
        eventually(SETTLE, || events(&cluster, "stuck", "ReconcileHung")
            .first()
            .is_some_and(|e| seen(e) >= 2)),
        "the reminders never counted up the series: {:?}",
        events(&cluster, "stuck", "ReconcileHung")
    );
    let series = events(&cluster, "stuck", "ReconcileHung");
    assert_eq!(series.len(), 1, "one Event per hang: {series:?}");
    let logged = lines(&operator, &stuck, "reconcile hung:").len()
        + lines(&operator, &stuck, "reconcile still hung:").len();
    assert!(
        usize::try_from(seen(&series[0])).unwrap() <= logged,
        "the series counts {} but the log has {logged} lines",
        seen(&series[0])
    );
    assert_eq!(series[0].metadata.name, hung.metadata.name);

    cluster.emulator().release("stuck");
    assert!(
        eventually(SETTLE, || !events(&cluster, "stuck", "ReconcileHangEnded")
            .is_empty()),
        "no ReconcileHangEnded Event after the release"
    );
    let ended = events(&cluster, "stuck", "ReconcileHangEnded").remove(0);
    assert_eq!(ended.type_.as_deref(), Some("Normal"));
    let note = ended.note.unwrap_or_default();
    assert!(note.contains("configtemplates ended ("), "{note}");
    assert!(
        cluster.events_about("calm").is_empty(),
        "an object that never hung got Events"
    );
}

#[test]
fn emulator_hang_events_false_publishes_none() {
    let cluster = Cluster::start("events_off");
    cluster.emulator().black_hole("quiet");
    cluster.create("quiet", None);
    let operator = Operator::start(&cluster, DEADLINE, &["--hang-events=false"]);
    let quiet = format!("{}/quiet", cluster.namespace);
    // The hang and its first reminder are logged: Events, were they on, would be out.
    assert!(
        eventually(SETTLE, || !lines(
            &operator,
            &quiet,
            "reconcile still hung:"
        )
        .is_empty()),
        "the black-holed reconcile was never reported still hung"
    );
    assert!(
        !eventually(Duration::from_secs(3), || cluster.emulator().event_writes()
            > 0),
        "Events were written with --hang-events=false: {:?}",
        cluster.events_about("quiet")
    );
}

/// `reconcile_watchdog_events_dropped_total` from `metrics`, if it is served.
fn events_dropped(metrics: SocketAddr) -> Option<u64> {
    let body = support::request(metrics, "GET", "/metrics").ok()?.body;
    body.lines()
        .find_map(|l| l.strip_prefix("reconcile_watchdog_events_dropped_total "))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn emulator_an_api_outage_drops_events_and_slows_no_reconcile() {
    let cluster = Cluster::start("events_outage");
    cluster.emulator().hold_prefix("held-");
    for name in ["held-0", "held-1"] {
        cluster.create(name, None);
    }
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let metrics_flag = metrics.to_string();
    let operator = Operator::start(
        &cluster,
        DEADLINE,
        &[
            "--metrics-bind-address",
            &metrics_flag,
            "--api-server-check-interval",
            "500ms",
        ],
    );
    let held = format!("{}/held-0", cluster.namespace);
    assert!(
        eventually(SETTLE, || !operator.in_flight(&held).is_empty()),
        "the held reconciles never started"
    );
    assert_eq!(events_dropped(metrics), Some(0), "nothing dropped yet");

    // The whole server stops answering before they are past their deadline: their
    // Events cannot be written, and are dropped within the write timeout.
    cluster.emulator().outage(true);
    assert!(
        eventually(SETTLE, || events_dropped(metrics).is_some_and(|d| d > 0)),
        "the drop counter never rose during the outage: {:?}",
        events_dropped(metrics)
    );
    assert!(
        operator.eventually_logged(|e| is(e, "WARN", "hang Events dropped")),
        "no WARN about the dropped Events"
    );
    assert_eq!(
        operator
            .logged(|e| is(e, "WARN", "hang Events dropped"))
            .len(),
        1,
        "the WARN about dropped Events is rate-limited"
    );

    // It answers again: everything converges, and the reconciles that start now, while
    // the Events of the outage are still being dropped or written, are not slowed past
    // their deadline.
    cluster.emulator().release_prefix("held-");
    cluster.emulator().outage(false);
    let fresh: Vec<String> = (0..5).map(|i| format!("after-{i}")).collect();
    for name in &fresh {
        cluster.create(name, None);
    }
    assert!(
        eventually(SETTLE, || ["held-0", "held-1"]
            .iter()
            .map(|n| (*n).to_owned())
            .chain(fresh.iter().cloned())
            .all(|n| cluster.reconciled(&n))),
        "the operator did not converge after the outage"
    );
    let late = operator.logged(|e| {
        is(e, "ERROR", "reconcile hung:")
            && e["object"].as_str().is_some_and(|o| o.contains("/after-"))
    });
    assert!(
        late.is_empty(),
        "a reconcile after the outage hung: {late:#?}"
    );
}

#[test]
fn a_liveness_failure_gets_one_event_on_the_operators_own_pod_per_episode() {
    const POD: &str = "reconcile-watchdog-5d8f7c9b4-x2x7q";
    let cluster = Cluster::start("pod-event");
    cluster.create("calm", None);
    let operator = Operator::start_with_env(
        &cluster,
        DEADLINE,
        &["--enable-fault-injection", "--stack-capture-after", "300ms"],
        &[
            ("POD_NAME", POD),
            ("POD_NAMESPACE", &cluster.namespace),
            ("POD_UID", "0a1b2c3d-0000-4000-8000-000000000001"),
        ],
    );
    assert!(
        eventually(SETTLE, || cluster.reconciled("calm")),
        "the healthy object was not reconciled"
    );
    assert!(
        events(&cluster, POD, "LivenessFailing").is_empty(),
        "an Event on the Pod while liveness passes"
    );
    cluster.create("blocked-a", Some("block"));
    assert!(
        eventually(SETTLE, || !events(&cluster, POD, "LivenessFailing")
            .is_empty()),
        "no LivenessFailing Event on the operator's Pod"
    );
    let event = events(&cluster, POD, "LivenessFailing").remove(0);
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let regarding = event.regarding.clone().unwrap_or_default();
    assert_eq!(
        (
            regarding.api_version.as_deref(),
            regarding.kind.as_deref(),
            regarding.namespace.as_deref(),
            regarding.uid.as_deref()
        ),
        (
            Some("v1"),
            Some("Pod"),
            Some(cluster.namespace.as_str()),
            Some("0a1b2c3d-0000-4000-8000-000000000001")
        )
    );
    let note = event.note.clone().unwrap_or_default();
    assert!(note.len() <= 1024, "{} bytes", note.len());
    assert!(
        note.starts_with("reconcile-watchdog: liveness failed (reconcilers)")
            && note.contains(&format!(
                "configtemplates {}/blocked-a: ran ",
                cluster.namespace
            )),
        "{note}"
    );
    if cfg!(all(feature = "stack-capture", target_os = "linux")) {
        assert!(note.contains("block_forever"), "{note}");
    }

    // A second hang within the same failing episode adds no Event, and the first
    // is not repeated.
    cluster.create("blocked-b", Some("block"));
    let blocked_b = format!("{}/blocked-b", cluster.namespace);
    assert!(
        operator.eventually_logged(
            |e| is(e, "ERROR", "reconcile hung:") && e["object"] == blocked_b.as_str()
        ),
        "the second hang was not reported"
    );
    // Several scans (250 ms apart) and an Event write's time later.
    std::thread::sleep(Duration::from_secs(3));
    let all = events(&cluster, POD, "LivenessFailing");
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(seen(&all[0]), 1, "{all:#?}");
    assert_eq!(operator.status("/healthz"), 500);
}
