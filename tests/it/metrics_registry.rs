//! The watchdog's metrics in a prometheus-client registry that the operator made and
//! filled first, and the metric names the shipped alerts and dashboard
//! (manifests/monitoring/) query against what that registry exposes: unprefixed when
//! the watchdog is registered on an unprefixed root, and with the documented one-line
//! change to the rules when the operator's registry prefixes everything.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use reconcile_watchdog::Watchdog;
use reconcile_watchdog::health::Health;
use reconcile_watchdog::internals::MetricsInternals;
use reconcile_watchdog::monitor::ApiServerStatus;
use reconcile_watchdog::plug::{ApiServerReachability, WatchAge, WatchAges};
use reconcile_watchdog::prometheus_client;

/// An API server check that has found the server answering.
#[derive(Debug, Default)]
struct Answering(Arc<ApiServerStatus>);

impl ApiServerReachability for Answering {
    fn status(&self) -> Arc<ApiServerStatus> {
        Arc::clone(&self.0)
    }

    fn answer_within(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// One watch of `configmaps`, a second old.
#[derive(Debug)]
struct OneWatch;

impl WatchAges for OneWatch {
    fn attach(&self, _: &Arc<Health>) {}

    fn ages(&self, _: Instant) -> Vec<WatchAge> {
        vec![WatchAge {
            controllers: vec!["configmaps".into()],
            resource: "configmaps".into(),
            age: Duration::from_secs(1),
        }]
    }
}

/// A watchdog whose every series shows: a controller, an answering API server, a watch
/// and a leader.
fn watchdog() -> Watchdog {
    let api_server = Answering::default();
    api_server.0.record(Ok(()), Instant::now());
    let watchdog = Watchdog::builder()
        .collect_metrics()
        .api_server(Arc::new(api_server))
        .watches(OneWatch)
        .start()
        .expect("the watchdog starts");
    let metrics = watchdog.metrics().expect("collected");
    metrics.add_controller("configmaps");
    metrics.set_leader("operator-0", true);
    metrics.lease_renewal(true);
    metrics.watch_lease_renewal_age(|| Some(Duration::from_secs(1)));
    watchdog
}

/// The operator fills its registry (here, under `registry`) before the watchdog's
/// metrics join it.
fn fill(registry: &mut Registry) {
    registry.register(
        "configmaps_synced",
        "ConfigMaps the operator synced",
        Counter::<u64>::default(),
    );
}

/// The metric names (samples and families) of an exposition.
fn exposed(registry: &Registry) -> BTreeSet<String> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("it encodes");
    text.lines()
        .filter_map(|line| match line.strip_prefix("# TYPE ") {
            Some(family) => family.split_whitespace().next(),
            None if line.starts_with('#') => None,
            None => line.split(['{', ' ']).next(),
        })
        .map(str::to_owned)
        .collect()
}

/// Every alert rule and dashboard query of the repository, as text.
fn rules_and_dashboard() -> String {
    let monitoring = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/monitoring");
    let mut text = String::new();
    for file in [
        "prometheusrule.yaml",
        "api-and-leader/prometheusrule.yaml",
        "dashboard.json",
    ] {
        text.push_str(
            &std::fs::read_to_string(monitoring.join(file))
                .unwrap_or_else(|e| panic!("{file}: {e}")),
        );
    }
    text
}

/// The metric names `text` queries that start with `prefix`.
fn named(text: &str, prefix: &str) -> BTreeSet<String> {
    text.match_indices(prefix)
        .filter(|(at, _)| {
            // Whole names only: not the middle of a longer one.
            text[..*at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
        })
        .map(|(at, _)| {
            text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

fn assert_all_exposed(queried: &BTreeSet<String>, exposed: &BTreeSet<String>) {
    assert!(queried.len() >= 15, "too few names found: {queried:?}");
    let missing: Vec<&String> = queried.difference(exposed).collect();
    assert!(
        missing.is_empty(),
        "queried but not exposed: {missing:?}\nexposed: {exposed:?}"
    );
}

#[test]
fn on_an_unprefixed_root_the_shipped_rules_match_as_they_are() {
    let watchdog = watchdog();
    // The operator's own series under its prefix, the watchdog's on the root.
    let mut registry = Registry::default();
    fill(registry.sub_registry_with_prefix("myop"));
    watchdog
        .metrics()
        .expect("collected")
        .register(&mut registry);

    let exposed = exposed(&registry);
    assert!(
        exposed.contains("myop_configmaps_synced_total"),
        "{exposed:?}"
    );
    assert!(
        exposed.contains("reconcile_watchdog_reconciles_in_flight"),
        "{exposed:?}"
    );
    assert_all_exposed(
        &named(&rules_and_dashboard(), "reconcile_watchdog_"),
        &exposed,
    );
}

#[test]
fn under_a_prefixed_registry_the_rules_match_after_one_substitution() {
    let watchdog = watchdog();
    let mut registry = Registry::with_prefix("myop");
    fill(&mut registry);
    watchdog
        .metrics()
        .expect("collected")
        .register(&mut registry);

    let exposed = exposed(&registry);
    assert!(
        exposed.contains("myop_configmaps_synced_total"),
        "{exposed:?}"
    );
    assert!(
        !exposed
            .iter()
            .any(|name| name.starts_with("reconcile_watchdog_")),
        "{exposed:?}"
    );
    // The change docs/embedding.md gives:
    //   sed -i 's/reconcile_watchdog_/myop_reconcile_watchdog_/g' prometheusrule.yaml
    let rules = rules_and_dashboard().replace("reconcile_watchdog_", "myop_reconcile_watchdog_");
    assert!(named(&rules, "reconcile_watchdog_").is_empty());
    assert_all_exposed(&named(&rules, "myop_reconcile_watchdog_"), &exposed);
}
