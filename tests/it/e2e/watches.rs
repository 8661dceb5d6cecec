//! Watch freshness: watches that deliver nothing fail readiness, naming the
//! controller and the resource, while liveness holds; released, readiness recovers and a
//! new object is reconciled.

use std::time::Duration;

use super::harness::{Cluster, Operator, SETTLE, eventually, is};

#[test]
fn emulator_held_watches_fail_readiness_not_liveness_until_released() {
    let cluster = Cluster::start("held-watches");
    // Held from the start: the lists answer, the watches after them never do.
    cluster.emulator().hold_watches(true);
    let operator = Operator::start(
        &cluster,
        Duration::from_secs(30),
        &["--watch-stall-threshold", "3s"],
    );

    let mut body = String::new();
    let mut liveness = Vec::new();
    let failed = eventually(SETTLE, || {
        liveness.push(operator.status("/healthz"));
        match operator.get("/readyz?verbose") {
            Some((status, text)) if status != 200 && text.contains("[-]watches failed") => {
                body = text;
                true
            }
            _ => false,
        }
    });
    assert!(failed, "readiness never failed on the watches check");
    assert!(
        body.contains("configtemplates: watch of configtemplates.watchdog.example.com silent for")
            && body.contains("(threshold 3s)"),
        "{body}"
    );
    assert!(
        liveness.iter().all(|status| *status == 200),
        "liveness failed for a silent watch: {liveness:?}"
    );
    assert_eq!(operator.status("/livez"), 200);
    assert!(
        operator.eventually_logged(|e| is(e, "WARN", "watch silent")),
        "no WARN for the silent watch"
    );

    // Released: the held watches answer, a new object is reconciled, readiness recovers.
    cluster.emulator().hold_watches(false);
    cluster.create("after-release", None);
    assert!(
        eventually(SETTLE, || cluster.reconciled("after-release")),
        "the object created after the release was not reconciled"
    );
    assert!(
        eventually(SETTLE, || operator.status("/readyz") == 200),
        "readiness did not recover: {:?}",
        operator.get("/readyz?verbose")
    );
    assert!(
        operator.eventually_logged(|e| is(e, "INFO", "watch alive again")),
        "no INFO for the recovered watch"
    );
    // Each silence told once.
    let warnings = operator.logged(|e| is(e, "WARN", "watch silent"));
    assert!(
        warnings.len() <= 2,
        "one WARN per resource at most: {warnings:?}"
    );
}
