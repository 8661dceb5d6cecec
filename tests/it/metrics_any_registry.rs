//! The watchdog's series for an operator on any prometheus-client: appended to the
//! operator's own exposition (docs/embedding.md, "Metrics for any registry"), and on a
//! port of their own, whose default the operator's server may already hold.

use std::net::TcpListener;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use reconcile_watchdog::guard::ObjectKey;
use reconcile_watchdog::prometheus_client;
use reconcile_watchdog::{Watchdog, watchdog};

use crate::support::openmetrics;

/// What `examples/kube-3-operator` serves: the operator's text without its `# EOF`, then
/// the watchdog's (the example's `exposition`, on this workspace's prometheus-client).
fn joined(operator: &Registry, watchdog: &Watchdog) -> String {
    let mut text = String::new();
    encode(&mut text, operator).expect("it encodes");
    let mut text = text.replace("# EOF\n", "");
    text.push_str(&watchdog.metrics().expect("collected").encode());
    text
}

#[tokio::test]
async fn appended_to_an_operators_exposition_it_parses_strictly_with_both_families() {
    let watchdog = Watchdog::builder()
        .collect_metrics()
        .start()
        .expect("the watchdog starts");
    let configmaps = watchdog.registry().controller("configmaps", "ConfigMap");
    configmaps
        .guard(ObjectKey::namespaced("default", "app"), async {
            Ok::<_, ()>(())
        })
        .await
        .expect("not cancelled")
        .expect("ok");
    let mut operator = Registry::default();
    let reconciled = Counter::<u64>::default();
    operator.register(
        "myop_reconciled",
        "ConfigMaps reconciled",
        reconciled.clone(),
    );
    reconciled.inc();

    let text = joined(&operator, &watchdog);
    let exposition = openmetrics::parse(&text)
        .unwrap_or_else(|e| panic!("the joined exposition is not OpenMetrics: {e}\n{text}"));
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    assert_eq!(exposition.value("myop_reconciled_total", &[]), Some(1.0));
    assert_eq!(
        exposition.value(
            "reconcile_watchdog_reconcile_duration_seconds_count",
            &[("controller", "configmaps"), ("outcome", "ok")]
        ),
        Some(1.0),
        "{text}"
    );
    // Every family of the watchdog's own exposition is in the joined one.
    let own = openmetrics::parse(&watchdog.metrics().expect("collected").encode())
        .expect("the watchdog's exposition parses");
    let missing: Vec<&String> = own
        .families
        .keys()
        .filter(|family| !exposition.families.contains_key(*family))
        .collect();
    assert!(missing.is_empty(), "left out when joined: {missing:?}");
}

#[test]
fn a_taken_metrics_address_fails_start_naming_the_flag_and_the_way_out() {
    // The operator's own metrics server, first on the port.
    let taken = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = taken.local_addr().expect("bound");
    let error = Watchdog::builder()
        .metrics_address(addr)
        .start()
        .expect_err("the address is taken");
    assert!(
        matches!(error, watchdog::Error::MetricsAddressTaken { addr: at, .. } if at == addr),
        "{error:?}"
    );
    let message = error.to_string();
    for says in [
        &addr.to_string()[..],
        "--metrics-bind-address",
        "--metrics-bind-address=0",
        "Metrics::encode",
    ] {
        assert!(message.contains(says), "{message:?} does not say {says:?}");
    }
}
