//! Request attribution: a reconcile stuck on an API request that never gets
//! an answer is reported with the request it waits on, and its `/debug/reconciles` row
//! carries it; released, the entry is gone.

use std::time::Duration;

use super::harness::{Cluster, Operator, SETTLE, eventually, is};

const DEADLINE: Duration = Duration::from_secs(2);

#[test]
fn emulator_held_configmap_get_is_named_in_the_report_and_the_row() {
    let cluster = Cluster::start("request-in-flight");
    // Every request naming the object goes unanswered: the reconcile's first is the GET
    // of its ConfigMap.
    cluster.emulator().black_hole("held");
    cluster.create("held", None);
    let operator = Operator::start(&cluster, DEADLINE, &[]);
    let object = format!("{}/held", cluster.namespace);
    let path = format!("/api/v1/namespaces/{}/configmaps/held", cluster.namespace);

    assert!(
        operator.eventually_logged(
            |e| is(e, "ERROR", "reconcile hung:") && e["object"] == object.as_str()
        ),
        "no hang report"
    );
    let report = &operator
        .logged(|e| is(e, "ERROR", "reconcile hung:") && e["object"] == object.as_str())[0];
    assert_eq!(report["state"], "awaiting", "{report}");
    assert_eq!(
        report["waiting_on"],
        format!("GET {path}").as_str(),
        "{report}"
    );
    assert_eq!(report["response_head"], false, "{report}");
    assert!(report["sent_ago"].is_string(), "{report}");
    let message = report["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("waiting on GET {path}, sent "))
            && message.ends_with("ago, no response head"),
        "{message}"
    );

    let row = operator.in_flight(&object);
    assert_eq!(row.len(), 1, "{row:?}");
    assert_eq!(row[0]["request"]["method"], "GET", "{}", row[0]);
    assert_eq!(row[0]["request"]["path"], path.as_str(), "{}", row[0]);
    assert_eq!(row[0]["request"]["response_head"], false, "{}", row[0]);
    assert!(
        row[0]["waiting"]
            .as_str()
            .is_some_and(|w| w.starts_with(&format!("waiting on GET {path}"))),
        "{}",
        row[0]
    );

    cluster.emulator().release("held");
    assert!(
        eventually(SETTLE, || cluster.reconciled("held")),
        "the released reconcile did not finish"
    );
    assert!(
        eventually(SETTLE, || operator.in_flight(&object).is_empty()),
        "the reconcile stayed in flight after the release: {:?}",
        operator.in_flight(&object)
    );
}
