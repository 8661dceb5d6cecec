//! Controllers by name, as an embedder sees them through a started watchdog: a name asked
//! for again adds nothing to the scrape, a thousand names stay within the bound (64 with
//! series of their own, the rest under `controller="other"`), and a controller forgotten
//! after its last handle is dropped (past the 16 latest retired) leaves the scrape.

use std::collections::BTreeSet;

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::{ObjectKey, Outcome};

/// The `controller` label values of the scrape's in-flight gauge.
fn controllers(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("reconcile_watchdog_reconciles_in_flight{controller=\""))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// Lines of the scrape that carry a `controller` label.
fn controller_lines(scrape: &str) -> usize {
    scrape
        .lines()
        .filter(|l| l.contains("controller=\""))
        .count()
}

#[test]
fn a_name_asked_for_per_reconcile_and_a_thousand_names_keep_the_scrape_bounded() {
    let watchdog = Watchdog::builder()
        .collect_metrics()
        .start()
        .expect("the watchdog starts");
    let registry = watchdog.registry();
    let metrics = watchdog.metrics().expect("collected");

    // One name asked for per reconcile, 100,000 times: one controller, its counts go on.
    for _ in 0..100_000 {
        registry
            .controller("docs", "Document")
            .register(ObjectKey::cluster("readme"))
            .finish(Outcome::Ok);
    }
    let scrape = metrics.encode();
    assert!(
        scrape.contains(
            "reconcile_watchdog_reconcile_duration_seconds_count{controller=\"docs\",outcome=\"ok\"} 100000"
        ),
        "{scrape}"
    );
    let one = controller_lines(&scrape);
    assert_eq!(controllers(&scrape), BTreeSet::from(["docs".to_owned()]));

    // A thousand names, held: 64 of their own (docs among them), the rest share `other`.
    let handles: Vec<_> = (0..1_000)
        .map(|i| registry.controller(&format!("tenant-{i}"), "Widget"))
        .collect();
    let scrape = metrics.encode();
    let names = controllers(&scrape);
    assert_eq!(names.len(), 65, "{names:?}");
    assert!(
        names.contains("docs") && names.contains("other"),
        "{names:?}"
    );
    assert_eq!(controller_lines(&scrape), 65 * one, "{scrape}");

    // Dropped, then pushed out of the 16 retired by later names: their series leave,
    // and so do those of `docs`, whose handle nothing holds between its reconciles.
    drop(handles);
    for i in 0..100 {
        drop(registry.controller(&format!("later-{i}"), "Widget"));
    }
    let scrape = metrics.encode();
    let latest: BTreeSet<String> = (84..100).map(|i| format!("later-{i}")).collect();
    assert_eq!(controllers(&scrape), latest);
    assert_eq!(controller_lines(&scrape), 16 * one, "{scrape}");
}
