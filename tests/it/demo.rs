//! Over real HTTP against the binary's `demo`: the probes flip when a reconcile hangs,
//! whichever way it hangs, and the hang report is written once.

use crate::support;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use support::{Process, eventually, field, get};

/// The demos run one at a time: a spinning hang burns a core, and CI has two.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

const DEADLINE: Duration = Duration::from_secs(1);
const INTERVAL: Duration = Duration::from_millis(250);

fn progress(process: &Process, controller: &str) -> Vec<u64> {
    process
        .events()
        .iter()
        .filter(|e| field(e, "message") == "progress" && field(e, "controller") == controller)
        .filter_map(|e| e["completed"].as_u64())
        .collect()
}

fn hang_reports(process: &Process, level: &str) -> Vec<serde_json::Value> {
    process
        .events()
        .into_iter()
        .filter(|e| {
            field(e, "target") == "reconcile_watchdog::hang"
                && field(e, "level") == level
                && field(e, "object") == "demo/cert-7"
        })
        .collect()
}

/// `demo` with JSON logs, a free probe port, the test's deadline and interval, and `extra`
/// (which sets `--duration`: the process is killed at the end of each test anyway).
fn start_demo(extra: &[&str]) -> Process {
    let mut args = vec!["--reconcile-deadline=1s", "--watchdog-interval=250ms"];
    args.extend_from_slice(extra);
    Process::demo(&args)
}

/// Runs a `kind` hang through its checks; its ERROR report and `/debug/reconciles` row.
fn demo_hang(kind: &str, expected_state: &str) -> (serde_json::Value, serde_json::Value) {
    let _serial = one_at_a_time();
    let mut process = start_demo(&[
        "--hang-after=2s",
        &format!("--hang-kind={kind}"),
        "--duration=60s",
    ]);
    let addr = process.probe_address();

    // Before the hang: healthy and ready.
    let healthz = get(addr, "/healthz");
    assert_eq!(
        (healthz.status, healthz.body.as_str()),
        (200, "ok"),
        "before the hang"
    );
    assert_eq!(get(addr, "/readyz").status, 200);

    // The hang begins (the log says so); liveness fails within deadline + 2 intervals.
    let began = eventually(Duration::from_secs(30), "the hang to begin", || {
        process
            .events()
            .iter()
            .any(|e| field(e, "message") == "injecting a hang")
            .then(Instant::now)
    });
    let verbose = eventually(
        DEADLINE + 2 * INTERVAL + Duration::from_secs(1),
        "/healthz to fail",
        || {
            let r = get(addr, "/healthz?verbose");
            (r.status == 500).then_some(r.body)
        },
    );
    let took = began.elapsed();
    assert!(
        took <= DEADLINE + 2 * INTERVAL,
        "liveness failed {took:?} after the hang began"
    );
    assert!(
        verbose.contains("[-]reconcilers failed: cert-renewer demo/cert-7 running")
            && verbose.contains(&format!("({expected_state})")),
        "{verbose}"
    );
    assert!(
        verbose.contains("[+]ping ok") && verbose.ends_with("healthz check failed\n"),
        "{verbose}"
    );
    assert_eq!(
        get(addr, "/readyz").status,
        200,
        "a hang is not a readiness matter"
    );

    // One ERROR report, with the state, while the other controllers keep reconciling.
    let before = progress(&process, "configmap-sync")
        .last()
        .copied()
        .unwrap_or(0);
    eventually(Duration::from_secs(20), "two more progress reports", || {
        let now = progress(&process, "configmap-sync");
        (now.iter().filter(|&&c| c > before).count() >= 2).then_some(())
    });
    let after = *progress(&process, "configmap-sync").last().unwrap();
    assert!(
        after > before + 10,
        "configmap-sync went from {before} to {after}"
    );
    let deployments = progress(&process, "deployment-scaler");
    assert!(deployments.last() > deployments.get(deployments.len() - 2));

    let errors = hang_reports(&process, "ERROR");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let report = errors[0].clone();
    let report = &report;
    assert_eq!(field(report, "controller"), "cert-renewer");
    assert_eq!(field(report, "kind"), "Certificate");
    assert_eq!(field(report, "state"), expected_state);
    assert_eq!(field(report, "deadline"), "1s");
    assert_eq!(field(report, "action"), "failing liveness (restart)");
    for key in [
        "elapsed",
        "started_at",
        "last_poll_ago",
        "thread",
        "task_id",
    ] {
        assert!(
            !field(report, key).is_empty(),
            "{key} missing from {report}"
        );
    }
    assert!(report["polls"].as_u64().unwrap() >= 1);
    // The reminder comes a deadline after the report; under load (a stack being
    // symbolized in a debug build, other builds on the machine) the scan that writes it
    // may come late, so it is awaited, not expected at once.
    eventually(
        Duration::from_secs(20),
        "a reminder after the second deadline",
        || (!hang_reports(&process, "WARN").is_empty()).then_some(()),
    );

    // The probe still answers promptly, and stays failing while the hang lasts.
    assert_eq!(get(addr, "/livez").status, 500);
    assert_eq!(
        get(addr, "/debug/reconciles").status,
        404,
        "not on the probe port"
    );
    let debug = get(
        process.debug_address().expect("a debug server"),
        "/debug/reconciles",
    );
    let rows: serde_json::Value = serde_json::from_str(&debug.body).unwrap();
    assert_eq!(rows[0]["object"], "demo/cert-7");
    assert_eq!(rows[0]["overdue"], true);
    assert_eq!(rows[0]["state"], expected_state);

    // In json format every log line is one JSON object.
    for line in process.logs() {
        assert!(
            serde_json::from_str::<serde_json::Value>(&line).is_ok_and(|v| v.is_object()),
            "{line}"
        );
    }
    process.child.kill().unwrap();
    (report.clone(), rows[0].clone())
}

#[test]
fn await_hang_fails_liveness_as_awaiting_in_its_labelled_await() {
    let (report, row) = demo_hang("await", "awaiting");
    // The demo names its await: the report and the row say it waits there.
    assert_eq!(
        field(&report, "label"),
        "waiting for the cert issuer",
        "{report}"
    );
    assert!(
        field(&report, "message")
            .ends_with("waiting in the await labelled \"waiting for the cert issuer\""),
        "{report}"
    );
    assert_eq!(row["label"], "waiting for the cert issuer", "{row}");
}

#[test]
fn blocking_hang_fails_liveness_as_in_poll() {
    let _ = demo_hang("block", "in-poll");
}

#[test]
fn busy_loop_fails_liveness_as_in_poll() {
    let _ = demo_hang("spin", "in-poll");
}

#[test]
fn a_released_hang_recovers_and_is_reported_ended() {
    let _serial = one_at_a_time();
    let mut process = start_demo(&["--hang-after=1s", "--hang-for=3s", "--duration=60s"]);
    let addr = process.probe_address();
    eventually(Duration::from_secs(30), "/healthz to fail", || {
        (get(addr, "/healthz").status == 500).then_some(())
    });
    eventually(Duration::from_secs(30), "/healthz to recover", || {
        (get(addr, "/healthz").status == 200).then_some(())
    });
    let ended = eventually(Duration::from_secs(10), "the ended event", || {
        hang_reports(&process, "INFO").into_iter().next()
    });
    assert_eq!(field(&ended, "outcome"), "ok");
    assert!(
        field(&ended, "message")
            .starts_with("reconcile ended after hang: cert-renewer demo/cert-7 finished (ok)")
    );
    process.child.kill().unwrap();
}

#[test]
fn duration_ends_the_demo_with_status_zero() {
    // A worker blocked for good must not keep the process from exiting.
    let _serial = one_at_a_time();
    let mut process = start_demo(&["--hang-kind=block", "--hang-after=500ms", "--duration=2s"]);
    let status = process
        .wait(Duration::from_secs(30))
        .expect("the demo exits after --duration");
    assert!(status.success(), "{status:?}");
}
