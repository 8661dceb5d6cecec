//! `/metrics` of the real binary: the exposition parses strictly as OpenMetrics, and
//! its values move as the demo's hang begins and ends.

use crate::support;

use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::{ObjectKey, Outcome};
use support::openmetrics::{self, Exposition};
use support::{Process, eventually, get};

const CERTS: (&str, &str) = ("controller", "cert-renewer");

/// Polls `f` until it returns Ok, like [`eventually`], and on time-out also says what
/// `f` saw last.
fn until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let mut last = String::new();
    let polled = catch_unwind(AssertUnwindSafe(|| {
        eventually(timeout, what, || f().map_err(|seen| last = seen).ok())
    }));
    polled.unwrap_or_else(|_| panic!("timed out waiting for {what}; last seen: {last}"))
}

/// `demo` on free loopback ports for the probes and metrics, with `extra`.
fn start_demo(extra: &[&str]) -> Process {
    let mut args = vec![
        "demo",
        "--health-probe-bind-address=127.0.0.1:0",
        "--metrics-bind-address=127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    Process::start(&args)
}

fn scrape(addr: SocketAddr) -> Result<Exposition, String> {
    let response = get(addr, "/metrics");
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(
        response.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    // A malformed exposition is a failure, not something to wait out.
    let exposition = openmetrics::parse(&response.body)
        .unwrap_or_else(|e| panic!("invalid OpenMetrics: {e}\n{}", response.body));
    for name in exposition.families.keys() {
        assert!(name.starts_with("reconcile_watchdog_"), "{name}");
    }
    Ok(exposition)
}

fn value(e: &Exposition, name: &str, labels: &[(&str, &str)]) -> Result<f64, String> {
    e.value(name, labels)
        .ok_or_else(|| format!("no sample {name} {labels:?}"))
}

fn check(e: &Exposition, check: &str) -> Result<f64, String> {
    value(
        e,
        "reconcile_watchdog_health_check_passing",
        &[("probe", "healthz"), ("check", check)],
    )
}

/// Reconciles of cert-renewer that took longer than 2.5 s: only the hung one does.
fn slow_certs(e: &Exposition) -> Result<f64, String> {
    let name = "reconcile_watchdog_reconcile_duration_seconds_bucket";
    let ok = ("outcome", "ok");
    Ok(
        value(e, name, &[CERTS, ok, ("le", "+Inf")])?
            - value(e, name, &[CERTS, ok, ("le", "2.5")])?,
    )
}

#[test]
fn metrics_follow_the_demo_hang() {
    // The hang starts 1 s in, is overdue from 2 s, and ends at about 7 s.
    let demo = start_demo(&[
        "--hang-after=1s",
        "--hang-for=6s",
        "--reconcile-deadline=1s",
        "--watchdog-interval=200ms",
        "--duration=120s",
    ]);
    let url = demo
        .metrics_address()
        .expect("the demo prints its metrics URL");
    let wait = Duration::from_secs(60);

    // Work flows and is counted for every controller.
    let before = until(wait, "reconciles of every controller", || {
        let e = scrape(url)?;
        for controller in ["configmap-sync", "deployment-scaler", "cert-renewer"] {
            let done = value(
                &e,
                "reconcile_watchdog_reconcile_duration_seconds_count",
                &[("controller", controller), ("outcome", "ok")],
            )?;
            if done < 1.0 {
                return Err(format!("{controller}: {done} reconciles"));
            }
        }
        Ok(e)
    });
    assert!(
        value(
            &before,
            "reconcile_watchdog_scan_duration_seconds_count",
            &[]
        )
        .unwrap()
            >= 1.0
    );
    assert!(
        value(
            &before,
            "reconcile_watchdog_runtime_heartbeat_age_seconds",
            &[]
        )
        .unwrap()
            < 3.0
    );
    assert_eq!(check(&before, "ping"), Ok(1.0));

    // The hang: counted once, overdue, liveness failing; the others stay clean.
    until(wait, "the hang to show", || {
        let e = scrape(url)?;
        let seen = (
            value(
                &e,
                "reconcile_watchdog_hangs_total",
                &[CERTS, ("state", "awaiting")],
            )?,
            value(&e, "reconcile_watchdog_reconciles_overdue", &[CERTS])?,
            check(&e, "reconcilers")?,
        );
        if seen != (1.0, 1.0, 0.0) {
            return Err(format!("(hangs, overdue, reconcilers check) = {seen:?}"));
        }
        assert!(value(&e, "reconcile_watchdog_reconciles_in_flight", &[CERTS])? >= 1.0);
        for controller in ["configmap-sync", "deployment-scaler"] {
            let c = ("controller", controller);
            assert_eq!(
                value(&e, "reconcile_watchdog_reconciles_overdue", &[c]),
                Ok(0.0)
            );
            for state in ["awaiting", "in-poll"] {
                let hangs = value(&e, "reconcile_watchdog_hangs_total", &[c, ("state", state)]);
                assert_eq!(hangs, Ok(0.0), "{controller} {state}");
            }
        }
        Ok(())
    });

    // The end: nothing overdue, liveness passes, the long reconcile is in the histogram.
    let after = until(wait, "the hang to end", || {
        let e = scrape(url)?;
        let seen = (
            value(&e, "reconcile_watchdog_reconciles_overdue", &[CERTS])?,
            check(&e, "reconcilers")?,
            slow_certs(&e)?,
        );
        if seen != (0.0, 1.0, 1.0) {
            return Err(format!(
                "(overdue, reconcilers check, slow reconciles) = {seen:?}"
            ));
        }
        Ok(e)
    });
    assert_eq!(
        value(
            &after,
            "reconcile_watchdog_hangs_total",
            &[CERTS, ("state", "awaiting")]
        ),
        Ok(1.0),
        "a hang is counted once, however long it lasts"
    );
    assert_eq!(
        value(&after, "reconcile_watchdog_escalations_total", &[CERTS]),
        Ok(0.0)
    );
    assert_eq!(
        value(&after, "reconcile_watchdog_cancellations_total", &[CERTS]),
        Ok(0.0)
    );
    let scans = |e: &Exposition| value(e, "reconcile_watchdog_scan_duration_seconds_count", &[]);
    assert!(scans(&after).unwrap() > scans(&before).unwrap());
}

#[test]
fn the_builder_serves_metrics_fed_by_its_registry() {
    let without = Watchdog::builder().start().unwrap();
    assert!(without.metrics().is_none() && without.metrics_address().is_none());

    let watchdog = Watchdog::builder()
        .interval(Duration::from_millis(20))
        .metrics_address("127.0.0.1:0".parse::<SocketAddr>().unwrap())
        .start()
        .unwrap();
    let addr = watchdog.metrics_address().expect("a metrics server");
    let jobs = watchdog.registry().controller("jobs", "Job");
    jobs.register(ObjectKey::cluster("a"))
        .finish(Outcome::Error);
    let _running = jobs.register(ObjectKey::cluster("b"));
    let e = until(
        Duration::from_secs(30),
        "a scan that sees the running job",
        || {
            let e = scrape(addr)?;
            match value(
                &e,
                "reconcile_watchdog_reconciles_in_flight",
                &[("controller", "jobs")],
            )? {
                1.0 => Ok(e),
                n => Err(format!("{n} in flight")),
            }
        },
    );
    let errors = [("controller", "jobs"), ("outcome", "error")];
    assert_eq!(
        value(
            &e,
            "reconcile_watchdog_reconcile_duration_seconds_count",
            &errors
        ),
        Ok(1.0)
    );
    assert_eq!(check(&e, "watchdog"), Ok(1.0));
    assert_eq!(get(addr, "/other").status, 404);
}

#[test]
fn zero_disables_the_metrics_server() {
    let demo = Process::start(&[
        "demo",
        "--health-probe-bind-address=127.0.0.1:0",
        "--metrics-bind-address=0",
        "--duration=60s",
    ]);
    assert_eq!(demo.metrics_address(), None);
    assert_eq!(get(demo.probe_address(), "/healthz").status, 200);
}

#[test]
fn rejects_what_the_format_forbids() {
    let ok = "# TYPE a counter\na_total 1\n# EOF\n";
    assert!(openmetrics::parse(ok).is_ok());
    for bad in [
        "# TYPE a counter\na_total 1\n",                // no EOF
        "# TYPE a counter\na 1\n# EOF\n",               // counter without _total
        "# TYPE a gauge\n# TYPE b gauge\na 1\n# EOF\n", // sample outside family
        "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\n# TYPE a gauge\n# EOF\n", // repeated family
        "# TYPE a_seconds gauge\n# UNIT a_seconds bytes\n# EOF\n", // unit not in name
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n# EOF\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_count 1\n# EOF\n", // no +Inf
        "# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n# EOF\n",                // repeated label
        "# TYPE a gauge\na 1\n# EOF\na 2\n",                            // after EOF
    ] {
        assert!(openmetrics::parse(bad).is_err(), "accepted {bad:?}");
    }
}
