//! End-to-end: the real binary's `run` against the kmock emulator (or a real cluster,
//! with `RECONCILE_WATCHDOG_E2E_KUBECONFIG`), probed over HTTP and read from its logs.
//!
//! Tests named `emulator_*` need the emulator: they black-hole requests or start the
//! API server late. Against a real cluster, run with `-- --skip emulator_`.

mod events;
mod ha;
mod harness;
mod mass;
mod requests;
mod watches;

use std::time::{Duration, Instant};

use harness::{Cluster, Emulator, Operator, SETTLE, eventually, free_port, is};

const DEADLINE: Duration = Duration::from_secs(2);
const INTERVAL: Duration = Duration::from_millis(250);
/// For tests that must see no hang: the emulator is a single Python process and, on a
/// busy machine, twenty objects' requests queue up behind each other for seconds.
const RELAXED: Duration = Duration::from_secs(30);

fn object(cluster: &Cluster, name: &str) -> String {
    format!("{}/{name}", cluster.namespace)
}

#[test]
fn normal_objects_get_their_configmaps_and_status() {
    let cluster = Cluster::start("normal");
    let names: Vec<String> = (0..20).map(|i| format!("app-{i:02}")).collect();
    for name in &names[..10] {
        cluster.create(name, None);
    }
    // Without --enable-fault-injection the annotation is ignored, with a warning.
    cluster.create("ignored-fault", Some("hang"));
    let operator = Operator::start(&cluster, RELAXED, &[]);
    for name in &names[10..] {
        cluster.create(name, None);
    }

    let mut unhealthy = Vec::new();
    let all_done = eventually(SETTLE, || {
        if let Some((status, body)) = operator.get("/healthz?verbose")
            && status != 200
        {
            unhealthy.push(body);
        }
        names.iter().all(|n| cluster.reconciled(n)) && cluster.reconciled("ignored-fault")
    });
    assert!(
        all_done,
        "not every ConfigTemplate got its ConfigMap and status"
    );
    assert!(
        unhealthy.is_empty(),
        "/healthz failed meanwhile: {unhealthy:?}"
    );
    assert_eq!(operator.status("/readyz"), 200);
    assert_eq!(operator.status("/healthz"), 200);
    let ignored = object(&cluster, "ignored-fault");
    assert!(
        !operator
            .logged(|e| is(e, "WARN", "without --enable-fault-injection")
                && e["object"] == ignored.as_str())
            .is_empty(),
        "no warning about the ignored fault annotation"
    );
    assert!(
        operator
            .logged(|e| e["target"] == "reconcile_watchdog::hang")
            .is_empty(),
        "a hang was reported on a healthy run"
    );
}

#[test]
fn emulator_black_holed_request_fails_liveness_until_released() {
    let cluster = Cluster::start("black_hole");
    cluster.emulator().black_hole("stuck");
    for name in ["before-0", "before-1", "stuck"] {
        cluster.create(name, None);
    }
    let operator = Operator::start(&cluster, DEADLINE, &[]);
    let stuck = object(&cluster, "stuck");

    assert!(
        eventually(SETTLE, || !operator.in_flight(&stuck).is_empty()),
        "the black-holed reconcile never started"
    );
    assert!(
        eventually(SETTLE, || operator.status("/healthz") == 500),
        "/healthz never failed"
    );
    // How long the reconcile had run when liveness was seen failing: within the
    // deadline and two scans, with a second to spare for a busy machine.
    let elapsed = operator.in_flight(&stuck)[0]["elapsed_seconds"]
        .as_f64()
        .unwrap();
    let bound = (DEADLINE + 2 * INTERVAL + Duration::from_secs(1)).as_secs_f64();
    eprintln!("liveness seen failing {elapsed:.3}s into the black-holed reconcile");
    assert!(
        elapsed <= bound,
        "liveness failed {elapsed}s into the reconcile, later than {bound}s"
    );
    let (_, body) = operator.get("/healthz?verbose").unwrap();
    assert!(
        body.contains("[-]reconcilers failed") && body.contains(&stuck),
        "{body}"
    );

    // Others keep reconciling meanwhile.
    cluster.create("during", None);
    assert!(
        eventually(SETTLE, || ["before-0", "before-1", "during"]
            .iter()
            .all(|n| cluster.reconciled(n))),
        "other objects stopped reconciling"
    );
    let hung =
        operator.logged(|e| is(e, "ERROR", "reconcile hung:") && e["object"] == stuck.as_str());
    assert_eq!(hung.len(), 1, "expected one hang report: {hung:?}");
    assert_eq!(hung[0]["state"], "awaiting", "{:?}", hung[0]);
    assert_eq!(hung[0]["controller"], "configtemplates");
    assert_eq!(hung[0]["kind"], "ConfigTemplate");

    cluster.emulator().release("stuck");
    assert!(
        eventually(SETTLE, || cluster.reconciled("stuck")),
        "the released reconcile did not finish its work"
    );
    assert!(
        eventually(SETTLE, || operator.status("/healthz") == 200),
        "/healthz stayed failed after the release"
    );
    assert!(
        eventually(SETTLE, || {
            !operator
                .logged(|e| {
                    is(e, "INFO", "reconcile ended after hang") && e["object"] == stuck.as_str()
                })
                .is_empty()
        }),
        "no \"ended after hang\" event"
    );
    let hung =
        operator.logged(|e| is(e, "ERROR", "reconcile hung:") && e["object"] == stuck.as_str());
    assert_eq!(hung.len(), 1, "more than one hang report: {hung:?}");
}

#[test]
fn fault_injection_panic_is_an_error_and_hang_and_block_fail_liveness() {
    let cluster = Cluster::start("faults");
    cluster.create("plain", None);
    cluster.create("panicky", Some("panic"));
    let operator = Operator::start(&cluster, DEADLINE, &["--enable-fault-injection"]);
    let panicky = object(&cluster, "panicky");

    // A panic is a reconcile error the error policy retries: logged, guard removed.
    assert!(
        eventually(SETTLE, || operator
            .logged(|e| is(e, "WARN", "reconcile failed")
                && e["object"] == panicky.as_str()
                && e["error"].as_str().is_some_and(|m| m.contains("panicked")))
            .len()
            >= 2),
        "the panic was not reported (and retried) as a reconcile error"
    );
    assert!(eventually(SETTLE, || cluster.reconciled("plain")));
    // No false hang: well past the deadline, liveness never names it and it is never
    // in flight past its deadline. (Only the panicking object is asserted on: on a
    // busy machine another object's slow API call may legitimately be overdue.)
    let watch_until = Instant::now() + 2 * DEADLINE;
    while Instant::now() < watch_until {
        let (_, body) = operator.get("/healthz?verbose").unwrap_or_default();
        assert!(
            !body.contains(&panicky),
            "a panicking reconcile failed liveness: {body}"
        );
        for row in operator.in_flight(&panicky) {
            assert!(
                row["overdue"] == false,
                "a panicked reconcile stayed registered: {row}"
            );
        }
        std::thread::sleep(INTERVAL);
    }
    assert!(
        operator
            .logged(|e| e["target"] == "reconcile_watchdog::hang" && e["object"] == panicky.as_str())
            .is_empty(),
        "a hang was reported for the panicking reconcile"
    );

    // hang: waits on an await that never wakes; block: stuck inside a poll.
    cluster.create("hangs", Some("hang"));
    cluster.create("blocks", Some("block"));
    let (hangs, blocks) = (object(&cluster, "hangs"), object(&cluster, "blocks"));
    assert!(
        eventually(SETTLE, || {
            let body = operator
                .get("/healthz?verbose")
                .map(|(_, b)| b)
                .unwrap_or_default();
            body.contains(&hangs) && body.contains(&blocks)
        }),
        "/healthz does not name both hung reconciles"
    );
    assert_eq!(operator.status("/healthz"), 500);
    let state_of = |object: &str| {
        let reports =
            operator.logged(|e| is(e, "ERROR", "reconcile hung:") && e["object"] == object);
        assert_eq!(reports.len(), 1, "{reports:?}");
        reports[0]["state"].as_str().unwrap().to_owned()
    };
    assert_eq!(state_of(&hangs), "awaiting");
    assert_eq!(state_of(&blocks), "in-poll");
    // The other objects still reconcile with a worker blocked.
    cluster.create("after", None);
    assert!(eventually(SETTLE, || cluster.reconciled("after")));
}

#[test]
fn sigterm_fails_readiness_at_once_drains_and_exits_zero() {
    let cluster = Cluster::start("sigterm");
    cluster.create("plain", None);
    cluster.create("slow", Some("sleep=6s"));
    let mut operator = Operator::start(
        &cluster,
        RELAXED,
        &["--enable-fault-injection", "--shutdown-grace", "15s"],
    );
    let slow = object(&cluster, "slow");
    assert!(
        eventually(SETTLE, || !operator.in_flight(&slow).is_empty()),
        "the slow reconcile is not in flight"
    );
    // Its first reconcile: the sleep comes before any work.
    assert!(
        !cluster.reconciled("slow"),
        "the slow reconcile was not the first"
    );
    assert_eq!(operator.status("/readyz"), 200, "not ready");

    operator.signal("TERM");
    assert!(
        eventually(Duration::from_secs(2), || operator.status("/readyz") == 500),
        "/readyz did not fail at once"
    );
    let (_, body) = operator.get("/readyz?verbose").unwrap_or_default();
    assert!(body.contains("[-]shutdown failed"), "{body}");
    let status = operator
        .wait_exit(Duration::from_secs(15) + Duration::from_secs(10))
        .expect("the operator did not exit within the grace");
    assert!(status.success(), "exit status {status}");
    assert!(!operator.logged(|e| is(e, "INFO", "drained")).is_empty());
    // The slow reconcile finished its work before the exit.
    assert!(
        cluster.reconciled("slow"),
        "the in-flight reconcile did not drain"
    );
}

/// An operator with shutdown grace `grace` and one reconcile hung for good, seen in
/// flight; the hung object's name.
fn operator_with_a_stuck_reconcile(test: &str, grace: &str) -> (Cluster, Operator, String) {
    let cluster = Cluster::start(test);
    cluster.create("stuck", Some("hang"));
    let operator = Operator::start(
        &cluster,
        RELAXED,
        &["--enable-fault-injection", "--shutdown-grace", grace],
    );
    let stuck = object(&cluster, "stuck");
    assert!(eventually(SETTLE, || !operator
        .in_flight(&stuck)
        .is_empty()));
    (cluster, operator, stuck)
}

#[test]
fn sigterm_names_what_outlives_the_grace_and_fails() {
    let (_cluster, mut operator, stuck) = operator_with_a_stuck_reconcile("sigterm_grace", "1s");
    operator.signal("TERM");
    let status = operator
        .wait_exit(Duration::from_secs(20))
        .expect("the operator did not exit after the grace");
    assert!(
        !status.success(),
        "a reconcile outlived the grace, yet exit status {status}"
    );
    let named = operator.logged(|e| {
        is(e, "ERROR", "still running after the shutdown grace")
            && e["still_running"]
                .as_str()
                .is_some_and(|s| s.contains(&stuck))
    });
    assert_eq!(named.len(), 1, "the hung reconcile was not named");
}

#[test]
fn emulator_api_server_absent_at_start_then_ready_once_it_appears() {
    let port = free_port();
    let cluster = Cluster::emulated("absent", port);
    let operator = Operator::start(&cluster, DEADLINE, &[]);

    assert!(
        operator
            .eventually_logged(|e| is(e, "ERROR", "watch failed") && e["kind"] == "ConfigTemplate"),
        "no clear error while the API server is absent"
    );
    let (status, body) = operator.get("/readyz?verbose").unwrap();
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("[-]informer-sync failed"), "{body}");
    assert_eq!(
        operator.status("/healthz"),
        200,
        "the operator is not alive"
    );
    assert!(!operator.said("panicked at"), "the operator panicked");

    let _emulator = Emulator::start(port);
    cluster.create("late", None);
    assert!(
        eventually(SETTLE, || operator.status("/readyz") == 200),
        "never ready once the API server appeared"
    );
    assert!(eventually(SETTLE, || cluster.reconciled("late")));
}

#[test]
fn second_sigterm_exits_at_once() {
    let (_cluster, mut operator, stuck) = operator_with_a_stuck_reconcile("second_signal", "10m");
    operator.signal("TERM");
    assert!(
        eventually(SETTLE, || operator.status("/readyz") == 500),
        "not draining"
    );
    operator.signal("INT");
    // Well inside the ten-minute grace.
    let status = operator
        .wait_exit(SETTLE)
        .expect("a second signal did not end the drain");
    assert!(!status.success(), "exit status {status}");
    let named = operator.logged(|e| {
        is(e, "ERROR", "second signal")
            && e["still_running"]
                .as_str()
                .is_some_and(|s| s.contains(&stuck))
    });
    assert_eq!(
        named.len(),
        1,
        "the second signal was not logged with what still ran"
    );
}

#[test]
fn on_hang_cancel_turns_a_hang_into_a_reconcile_error() {
    let cluster = Cluster::start("cancel");
    cluster.create("hangs", Some("hang"));
    cluster.create("plain", None);
    let operator = Operator::start(
        &cluster,
        DEADLINE,
        &[
            "--enable-fault-injection",
            "--on-hang",
            "cancel",
            "--cancel-escalation-count",
            "1000",
        ],
    );
    let hangs = object(&cluster, "hangs");
    // Cancelled at its deadline, it comes back to the error policy, which requeues it.
    assert!(
        eventually(SETTLE, || operator
            .logged(|e| is(e, "WARN", "reconcile failed")
                && e["object"] == hangs.as_str()
                && e["error"]
                    .as_str()
                    .is_some_and(|m| m.contains("cancelled by the watchdog")))
            .len()
            >= 2),
        "the hung reconcile was not cancelled and retried"
    );
    assert!(eventually(SETTLE, || cluster.reconciled("plain")));
    let reports =
        operator.logged(|e| is(e, "ERROR", "reconcile hung:") && e["object"] == hangs.as_str());
    assert!(
        !reports.is_empty(),
        "no hang report before the cancellation"
    );
    assert!(
        reports
            .iter()
            .all(|r| r["action"].as_str().is_some_and(|a| a.contains("cancel"))),
        "{reports:?}"
    );
}
