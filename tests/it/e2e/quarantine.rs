//! Quarantine across restarts: an object whose reconcile hangs every time fails liveness
//! once, is recorded in the ConfigMap, and the next process does not reconcile it (with
//! `--quarantine-after 1`), while everything else is reconciled; re-created, it is
//! reconciled again. With the default (2), the first restart quarantines nothing.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::harness::{Cluster, Operator, SETTLE, eventually, is};

const DEADLINE: Duration = Duration::from_secs(2);
const CONFIGMAP: &str = "reconcile-watchdog-quarantine";

fn start(cluster: &Cluster, after: Option<&str>) -> Operator {
    let namespace = cluster.namespace.clone();
    let mut flags = vec![
        "--enable-fault-injection",
        "--shutdown-grace=2s",
        "--quarantine-namespace",
        &namespace,
    ];
    if let Some(after) = after {
        flags.extend(["--quarantine-after", after]);
    }
    Operator::start(cluster, DEADLINE, &flags)
}

/// The ledger the ConfigMap holds, if any.
fn ledger(cluster: &Cluster) -> Option<Value> {
    let configmap = cluster
        .runtime
        .block_on(cluster.configmaps().get_opt(CONFIGMAP))
        .ok()??;
    let text = configmap.data?.remove("ledger.json")?;
    serde_json::from_str(&text).ok()
}

/// The ledger's count of liveness failures of `object`.
fn failures(cluster: &Cluster, object: &str) -> u64 {
    ledger(cluster)
        .and_then(|l| {
            l["entries"]
                .as_array()?
                .iter()
                .find(|e| e["object"] == object)
                .and_then(|e| e["count"].as_u64())
        })
        .unwrap_or(0)
}

/// The stack's first own frame the ledger keeps for `object`'s latest hang.
fn frame(cluster: &Cluster, object: &str) -> Option<String> {
    let ledger = ledger(cluster)?;
    let entry = ledger["entries"]
        .as_array()?
        .iter()
        .find(|e| e["object"] == object)?;
    entry["hang"]["frame"].as_str().map(str::to_owned)
}

/// Runs `operator` until its hang of `object` failed liveness and was recorded (`count`
/// failures in all), and, when `blocked_in` is given and stacks are captured, until the
/// record names that function as the stack's first own frame; then stops it as the
/// kubelet would (SIGTERM).
fn hang_until_recorded(
    cluster: &Cluster,
    mut operator: Operator,
    object: &str,
    count: u64,
    blocked_in: Option<&str>,
) {
    assert!(
        eventually(SETTLE, || operator.status("/healthz") == 500),
        "/healthz never failed on the hang of {object}"
    );
    let failing = Instant::now();
    assert!(
        eventually(SETTLE, || failures(cluster, object) >= count),
        "the liveness failure of {object} was never recorded ({} of {count})",
        failures(cluster, object)
    );
    eprintln!(
        "recorded {:?} after the probe was seen failing",
        failing.elapsed()
    );
    if let Some(function) = blocked_in
        && cfg!(all(feature = "stack-capture", target_os = "linux"))
    {
        // The stack is captured once the poll has lasted `--stack-capture-after` (2 s):
        // at the failing scan, or at a later report, which completes the record.
        assert!(
            eventually(SETTLE, || frame(cluster, object)
                .is_some_and(|f| f.contains(function))),
            "the record never named {function}: {:?}",
            frame(cluster, object)
        );
        eprintln!(
            "the record's frame after {:?}: {:?}",
            failing.elapsed(),
            frame(cluster, object)
        );
    }
    let recorded = operator
        .logged(|e| is(e, "INFO", "recorded the liveness failure") && e["object"] == object);
    assert_eq!(recorded.len(), 1, "one record per hang: {recorded:?}");
    // From the scan that failed liveness to the write landing, as the process saw it.
    eprintln!(
        "the record took {} from the failing scan",
        recorded[0]["took"]
    );
    operator.signal("TERM");
    operator
        .wait_exit(Duration::from_secs(15))
        .expect("the operator did not exit after SIGTERM");
}

#[test]
fn emulator_a_poison_object_is_quarantined_after_the_restart_it_caused() {
    let cluster = Cluster::start("quarantine");
    cluster.create("healthy", None);
    cluster.create("q-poison", Some("block"));
    let poison = format!("{}/q-poison", cluster.namespace);

    // Run 1: the poison object blocks its worker; liveness fails, and is recorded.
    let first = start(&cluster, Some("1"));
    hang_until_recorded(&cluster, first, &poison, 1, Some("block_forever"));
    let entry = ledger(&cluster).unwrap()["entries"][0].clone();
    assert_eq!(entry["controller"], "configtemplates", "{entry}");
    assert_eq!(entry["kind"], "ConfigTemplate", "{entry}");
    assert_eq!(entry["hang"]["state"], "in-poll", "{entry}");
    assert!(
        entry["uid"].as_str().is_some_and(|u| !u.is_empty()),
        "{entry}"
    );
    assert_eq!(entry["generation"], 1, "{entry}");

    // Run 2, the same flags: the poison object is not reconciled; liveness holds.
    let second = start(&cluster, Some("1"));
    assert!(
        second.eventually_logged(
            |e| is(e, "WARN", "reconcile quarantined") && e["object"] == poison.as_str()
        ),
        "the poison object was not quarantined"
    );
    cluster.create("after-restart", None);
    let mut unhealthy = Vec::new();
    let reconciled = eventually(SETTLE, || {
        if let Some((status, body)) = second.get("/healthz?verbose")
            && status != 200
        {
            unhealthy.push(body);
        }
        cluster.reconciled("healthy") && cluster.reconciled("after-restart")
    });
    assert!(reconciled, "the other objects were not reconciled");
    // Past a deadline and a few scans, liveness still holds.
    let until = Instant::now() + DEADLINE * 2;
    while Instant::now() < until {
        if let Some((status, body)) = second.get("/healthz?verbose")
            && status != 200
        {
            unhealthy.push(body);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(unhealthy.is_empty(), "/healthz failed: {unhealthy:?}");
    assert!(
        second
            .logged(|e| is(e, "ERROR", "reconcile hung:") && e["object"] == poison.as_str())
            .is_empty(),
        "the quarantined object was reconciled and hung again"
    );
    assert!(
        eventually(SETTLE, || cluster
            .events_about("q-poison")
            .iter()
            .any(|e| e.reason.as_deref() == Some("ReconcileQuarantined"))),
        "no ReconcileQuarantined Event on the poison object"
    );
    let event = cluster
        .events_about("q-poison")
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("ReconcileQuarantined"))
        .unwrap();
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("quarantined since") && note.contains("until"),
        "{note}"
    );

    // Re-created (fixed), it is another object: reconciled at once.
    cluster.delete("q-poison");
    cluster.create("q-poison", None);
    assert!(
        eventually(SETTLE, || cluster.reconciled("q-poison")),
        "the re-created object was not reconciled"
    );
    assert!(
        second.eventually_logged(|e| is(e, "INFO", "quarantine lifted")
            && e["object"] == poison.as_str()
            && e["why"].as_str().is_some_and(|w| w.contains("re-created"))),
        "no lift was logged"
    );
    assert_eq!(second.status("/healthz"), 200);
}

#[test]
fn emulator_with_the_default_the_first_restart_quarantines_nothing() {
    let cluster = Cluster::start("quarantine_default");
    cluster.create("healthy", None);
    cluster.create("q-hangs", Some("hang"));
    let hangs = format!("{}/q-hangs", cluster.namespace);

    hang_until_recorded(&cluster, start(&cluster, None), &hangs, 1, None);
    // The second run reconciles it again: it hangs again, and fails liveness again.
    let second = start(&cluster, None);
    assert!(
        second.eventually_logged(
            |e| is(e, "ERROR", "reconcile hung:") && e["object"] == hangs.as_str()
        ),
        "the object was not reconciled after the first restart"
    );
    assert!(
        second
            .logged(|e| is(e, "WARN", "reconcile quarantined"))
            .is_empty(),
        "quarantined after one restart under the default"
    );
    hang_until_recorded(&cluster, second, &hangs, 2, None);
    // An await has no thread, so no stack: no frame.
    assert_eq!(frame(&cluster, &hangs), None);
}

fn leads(operator: &Operator) -> bool {
    !operator
        .logged(|e| is(e, "INFO", "acquired the lease"))
        .is_empty()
}

#[test]
fn emulator_a_new_leader_honours_the_record_the_old_one_wrote() {
    let cluster = Cluster::start("quarantine_ha");
    cluster.create("healthy", None);
    let namespace = cluster.namespace.clone();
    let flags = [
        "--enable-fault-injection",
        "--shutdown-grace=2s",
        "--quarantine-after=1",
        "--quarantine-namespace",
        &namespace,
        "--leader-elect",
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=3s",
        "--leader-elect-retry-period=1s",
        "--leader-elect-resource-name=quarantine-lease",
        "--leader-elect-resource-namespace",
        &namespace,
    ];
    let a = Operator::start(&cluster, DEADLINE, &flags);
    let b = Operator::start(&cluster, DEADLINE, &flags);
    assert!(
        eventually(SETTLE, || leads(&a) || leads(&b)),
        "nobody acquired the lease"
    );
    let (leader, follower) = if leads(&a) { (a, b) } else { (b, a) };
    assert!(eventually(SETTLE, || cluster.reconciled("healthy")));
    // The follower has read the ledger (empty) before the leader records into it.
    cluster.create("q-poison", Some("block"));
    let poison = format!("{namespace}/q-poison");
    hang_until_recorded(&cluster, leader, &poison, 1, None);

    assert!(
        eventually(SETTLE, || leads(&follower)),
        "the follower never took the lease over"
    );
    assert!(
        follower.eventually_logged(
            |e| is(e, "WARN", "reconcile quarantined") && e["object"] == poison.as_str()
        ),
        "the new leader did not honour the record"
    );
    cluster.create("after-takeover", None);
    assert!(
        eventually(SETTLE, || cluster.reconciled("after-takeover")),
        "the new leader does not reconcile"
    );
    assert!(
        follower
            .logged(|e| is(e, "ERROR", "reconcile hung:") && e["object"] == poison.as_str())
            .is_empty(),
        "the new leader reconciled the quarantined object"
    );
    assert_eq!(follower.status("/healthz"), 200);
}
