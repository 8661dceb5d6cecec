//! The metrics' tests: each series as an exposition shows it.

use std::time::{Duration, Instant};

use warp::http::StatusCode;

use super::*;
use crate::guard::{ObjectKey, Outcome, Registry};
use crate::health::FnCheck;
use crate::monitor::observer::DriverWakes;
use crate::monitor::verdict::Verdict;
use crate::monitor::{Config, HangPolicy};
use series::MAX_CONTROLLER_SERIES;

fn line<'a>(exposition: &'a str, prefix: &str) -> Option<&'a str> {
    exposition
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(|l| l[prefix.len()..].trim())
}

#[test]
fn an_operators_own_registry_serves_the_same_series() {
    let metrics = Metrics::new(Arc::new(Health::new()));
    let mut theirs = prometheus_client::registry::Registry::with_prefix("shop_operator");
    let orders = Counter::<u64>::default();
    theirs.register("orders", "Orders placed", orders.clone());
    metrics.register(&mut theirs);

    let registry = Registry::with_observer(Duration::from_secs(60), metrics.clone());
    registry
        .controller("web", "Widget")
        .register(ObjectKey::cluster("a"))
        .finish(Outcome::Ok);
    orders.inc();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &theirs).unwrap();
    assert_eq!(
        line(&text, "shop_operator_orders_total "),
        Some("1"),
        "{text}"
    );
    let ours =
        "reconcile_watchdog_reconcile_duration_seconds_count{controller=\"web\",outcome=\"ok\"} ";
    assert_eq!(
        line(&text, &format!("shop_operator_{ours}")),
        Some("1"),
        "{text}"
    );
    assert_eq!(
        line(&metrics.encode(), ours),
        Some("1"),
        "the watchdog's own exposition"
    );
    assert!(
        text.contains("shop_operator_reconcile_watchdog_health_check_passing"),
        "{text}"
    );
}

#[test]
fn each_controller_of_a_watched_resource_has_its_watch_age() {
    /// Watches that a test fills by hand.
    #[derive(Debug, Default)]
    struct Fixed(std::sync::Mutex<Vec<crate::plug::WatchAge>>);
    impl crate::plug::WatchAges for Fixed {
        fn attach(&self, _: &Arc<Health>) {}
        fn ages(&self, _: std::time::Instant) -> Vec<crate::plug::WatchAge> {
            self.0.lock().expect("not poisoned").clone()
        }
    }

    let metrics = Metrics::new(Arc::new(Health::new()));
    let watches = Arc::new(Fixed::default());
    metrics.serve_watch_ages(Arc::clone(&watches) as Arc<dyn crate::plug::WatchAges>);
    assert!(
        !metrics.encode().contains("watch_age"),
        "none before any watch"
    );
    watches
        .0
        .lock()
        .expect("not poisoned")
        .push(crate::plug::WatchAge {
            controllers: vec!["configtemplates".into(), "secrets".into()],
            resource: "configmaps".into(),
            age: Duration::from_secs(7),
        });
    let text = metrics.encode();
    for controller in ["configtemplates", "secrets"] {
        let series = format!(
            "reconcile_watchdog_watch_age_seconds{{controller=\"{controller}\",resource=\"configmaps\"}} "
        );
        let age: f64 = line(&text, &series)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{series} in {text}"));
        assert!((age - 7.0).abs() < 1e-9, "{text}");
    }
}
#[test]
fn reconcile_ends_land_in_the_histogram_by_outcome() {
    let metrics = Metrics::new(Arc::new(Health::new()));
    let registry = Registry::with_observer(Duration::from_secs(60), metrics.clone());
    let web = registry.controller("web", "Deployment");
    web.register(ObjectKey::cluster("a")).finish(Outcome::Ok);
    web.register(ObjectKey::cluster("b")).finish(Outcome::Error);
    drop(web.register(ObjectKey::cluster("c")));
    let text = metrics.encode();
    for (outcome, count) in [
        ("ok", "1"),
        ("error", "1"),
        ("dropped", "1"),
        ("panic", "0"),
        ("cancelled", "0"),
    ] {
        let prefix = format!(
            "reconcile_watchdog_reconcile_duration_seconds_count{{controller=\"web\",outcome=\"{outcome}\"}}"
        );
        assert_eq!(line(&text, &prefix), Some(count), "{outcome}\n{text}");
    }
    assert!(text.contains("# UNIT reconcile_watchdog_reconcile_duration_seconds seconds\n"));
    assert!(
        text.contains(
            "reconcile_watchdog_reconcile_duration_seconds_bucket{le=\"3600.0\",controller=\"web\",outcome=\"ok\"} 1\n"
        ),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn scans_set_gauges_and_count_hangs_cancels_and_escalations() {
    let metrics = Metrics::new(Arc::new(Health::new()));
    // As the watchdog wires them: the handle's registration makes the series, which the
    // scans only update.
    let registry = Registry::with_observer(
        Duration::from_secs(60),
        Arc::clone(&metrics) as Arc<dyn crate::guard::Observer>,
    );
    let hung = registry
        .controller("jobs", "Job")
        .with_deadline(Duration::ZERO)
        .register(ObjectKey::namespaced("ns", "stuck"));
    let config = Config {
        interval: Duration::from_millis(100),
        policy: HangPolicy::Cancel,
        ..Config::default()
    };
    let mut verdict = Verdict::new(config);
    let scan = |now: Instant, verdict: &mut Verdict| {
        let (mut in_flight, mut counts) = (Vec::new(), Vec::new());
        registry.scan_into(now, true, &mut in_flight, &mut counts);
        let decision = verdict.step(
            &in_flight,
            registry.take_ended(),
            Some(Duration::from_millis(50)),
            now,
        );
        monitor::Observer::scanned(
            &*metrics,
            &Scan {
                attention: &in_flight,
                in_flight_by_controller: &counts,
                decision: &decision,
                took: Duration::from_micros(70),
                runtime_heartbeat_age: Some(Duration::from_millis(50)),
                driver_rescues: 1,
                driver_wakes: DriverWakes {
                    busy_worker: 3,
                    preempted: 2,
                    heartbeat_late: 0,
                    not_looked_up: 0,
                },
                cause: None,
                own_frames: &[],
            },
        );
    };
    let start = Instant::now();
    scan(start + Duration::from_millis(1), &mut verdict);
    let text = metrics.encode();
    let get = |text: &str, name: &str| line(text, name).map(str::to_owned);
    assert_eq!(
        get(&text, "reconcile_watchdog_driver_rescues_total").as_deref(),
        Some("1")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_driver_wakes_total{cause=\"busy_worker\"}"
        )
        .as_deref(),
        Some("3")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_driver_wakes_total{cause=\"preempted\"}"
        )
        .as_deref(),
        Some("2")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_driver_wakes_total{cause=\"heartbeat_late\"}"
        ),
        None,
        "a cause is shown once it has a wake"
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_reconciles_in_flight{controller=\"jobs\"}"
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_reconciles_overdue{controller=\"jobs\"}"
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_hangs_total{controller=\"jobs\",state=\"awaiting\"}"
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_hangs_total{controller=\"jobs\",state=\"in-poll\"}"
        )
        .as_deref(),
        Some("0")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_cancellations_total{controller=\"jobs\"}"
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_escalations_total{controller=\"jobs\"}"
        )
        .as_deref(),
        Some("0")
    );
    assert_eq!(
        get(&text, "reconcile_watchdog_runtime_heartbeat_age_seconds").as_deref(),
        Some("0.05")
    );
    assert_eq!(
        get(&text, "reconcile_watchdog_scan_duration_seconds_count").as_deref(),
        Some("1")
    );

    // Still there a whole interval after the cancel request: escalated, not re-counted.
    scan(start + Duration::from_millis(200), &mut verdict);
    let text = metrics.encode();
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_escalations_total{controller=\"jobs\"}"
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_hangs_total{controller=\"jobs\",state=\"awaiting\"}"
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_cancellations_total{controller=\"jobs\"}"
        )
        .as_deref(),
        Some("1")
    );

    drop(hung);
    scan(start + Duration::from_millis(300), &mut verdict);
    let text = metrics.encode();
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_reconciles_in_flight{controller=\"jobs\"}"
        )
        .as_deref(),
        Some("0")
    );
    assert_eq!(
        get(
            &text,
            "reconcile_watchdog_reconciles_overdue{controller=\"jobs\"}"
        )
        .as_deref(),
        Some("0")
    );
}

#[test]
fn health_checks_are_run_at_scrape_time() {
    let health = Arc::new(Health::new());
    let metrics = Metrics::new(Arc::clone(&health));
    let text = metrics.encode();
    assert!(
        text.contains("# TYPE reconcile_watchdog_health_check_passing gauge\n"),
        "{text}"
    );
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_health_check_passing{probe=\"readyz\",check=\"shutdown\"}"
        ),
        Some("1")
    );
    health.shutdown.begin();
    health
        .liveness
        .add(Arc::new(FnCheck::new("broken", || Err("no".into()))));
    let text = metrics.encode();
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_health_check_passing{probe=\"readyz\",check=\"shutdown\"}"
        ),
        Some("0")
    );
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_health_check_passing{probe=\"healthz\",check=\"broken\"}"
        ),
        Some("0")
    );
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_health_check_passing{probe=\"healthz\",check=\"ping\"}"
        ),
        Some("1")
    );
}

#[test]
fn leader_election_series() {
    let metrics = Metrics::new(Arc::new(Health::new()));
    assert!(
        !metrics.encode().contains("lease_renewal_age"),
        "no age before a lease is watched"
    );
    metrics.set_leader("pod-a_x1", false);
    metrics.lease_renewal(true);
    metrics.lease_renewal(true);
    metrics.lease_renewal(false);
    let age = Arc::new(std::sync::Mutex::new(Some(Duration::from_millis(1500))));
    let read = Arc::clone(&age);
    metrics.watch_lease_renewal_age(move || *read.lock().unwrap());
    let text = metrics.encode();
    assert_eq!(
        line(&text, "reconcile_watchdog_leader{identity=\"pod-a_x1\"}"),
        Some("0")
    );
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_lease_renewals_total{result=\"success\"}"
        ),
        Some("2")
    );
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_lease_renewals_total{result=\"failure\"}"
        ),
        Some("1")
    );
    assert!(
        text.contains("# TYPE reconcile_watchdog_lease_renewal_age_seconds gauge\n"),
        "{text}"
    );
    assert_eq!(
        line(&text, "reconcile_watchdog_lease_renewal_age_seconds "),
        Some("1.5")
    );
    metrics.set_leader("pod-a_x1", true);
    *age.lock().unwrap() = None;
    let text = metrics.encode();
    assert_eq!(
        line(&text, "reconcile_watchdog_leader{identity=\"pod-a_x1\"}"),
        Some("1")
    );
    assert!(!text.contains("lease_renewal_age_seconds "), "{text}");
}

#[test]
fn serves_only_get_and_head_of_metrics() {
    let metrics = Metrics::new(Arc::new(Health::new()));
    let r = metrics.respond(&Method::GET, "/metrics");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
    assert!(r.body().ends_with("# EOF\n"));
    let r = metrics.respond(&Method::HEAD, "/metrics");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.body().is_empty());
    assert_eq!(
        metrics.respond(&Method::POST, "/metrics").status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        metrics.respond(&Method::GET, "/healthz").status(),
        StatusCode::NOT_FOUND
    );
}

#[test]
fn api_server_reachability_is_shown_once_checked() {
    let status = Arc::new(ApiServerStatus::default());
    let metrics = Metrics::with_api_server(Arc::new(Health::new()), Arc::clone(&status));
    assert!(!metrics.encode().contains("api_server"));
    let t0 = Instant::now();
    status.record(Err("no answer".into()), t0 - Duration::from_secs(3));
    let text = metrics.encode();
    assert_eq!(
        line(&text, "reconcile_watchdog_api_server_reachable "),
        Some("0"),
        "{text}"
    );
    let outage: f64 = line(
        &text,
        "reconcile_watchdog_api_server_unreachable_seconds_total ",
    )
    .and_then(|v| v.parse().ok())
    .unwrap_or_else(|| panic!("{text}"));
    assert!(outage >= 3.0, "{text}");
    status.record(Ok(()), Instant::now());
    assert_eq!(
        line(
            &metrics.encode(),
            "reconcile_watchdog_api_server_reachable "
        ),
        Some("1")
    );
}

/// The distinct values of `label` on the lines of `family` (a name with its braces).
fn label_values(exposition: &str, family: &str, label: &str) -> std::collections::BTreeSet<String> {
    let key = format!("{label}=\"");
    exposition
        .lines()
        .filter(|l| l.starts_with(family))
        .filter_map(|l| {
            let rest = &l[l.find(&key)? + key.len()..];
            Some(rest[..rest.find('"')?].to_owned())
        })
        .collect()
}

/// Scans `registry` once at `now` into `metrics`, as the monitor does.
fn scan_once(metrics: &Metrics, registry: &Registry, now: Instant) {
    let (mut in_flight, mut counts) = (Vec::new(), Vec::new());
    registry.scan_into(now, false, &mut in_flight, &mut counts);
    let decision = Verdict::new(Config::default()).step(&in_flight, Vec::new(), None, now);
    monitor::Observer::scanned(
        metrics,
        &Scan {
            attention: &in_flight,
            in_flight_by_controller: &counts,
            decision: &decision,
            took: Duration::from_micros(70),
            runtime_heartbeat_age: None,
            driver_rescues: 0,
            driver_wakes: DriverWakes::default(),
            cause: None,
            own_frames: &[],
        },
    );
}

#[test]
fn controllers_past_the_bound_share_the_other_series() {
    let metrics = Metrics::new(Arc::new(Health::new()));
    let registry = Registry::with_observer(
        Duration::from_secs(60),
        Arc::clone(&metrics) as Arc<dyn crate::guard::Observer>,
    );
    let handles: Vec<_> = (0..1_000)
        .map(|i| registry.controller(&format!("c-{i}"), "Widget"))
        .collect();
    // Two reconciles in flight past the bound, one within it; one ended past it.
    let _running = [
        handles[0].register(ObjectKey::cluster("a")),
        handles[500].register(ObjectKey::cluster("b")),
        handles[999].register(ObjectKey::cluster("c")),
    ];
    handles[700]
        .register(ObjectKey::cluster("d"))
        .finish(Outcome::Ok);
    scan_once(&metrics, &registry, Instant::now());
    let text = metrics.encode();

    let in_flight = "reconcile_watchdog_reconciles_in_flight{";
    let controllers = label_values(&text, in_flight, "controller");
    assert_eq!(
        controllers.len(),
        MAX_CONTROLLER_SERIES + 1,
        "{controllers:?}"
    );
    assert!(controllers.contains("other") && controllers.contains("c-0"));
    assert!(!controllers.contains("c-999"));
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_reconciles_in_flight{controller=\"other\"} "
        ),
        Some("2"),
        "the others' in flight, summed"
    );
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_reconciles_in_flight{controller=\"c-0\"} "
        ),
        Some("1")
    );
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_reconcile_duration_seconds_count{controller=\"other\",outcome=\"ok\"} "
        ),
        Some("1")
    );
    // Every line that names a controller names one of those 65.
    let series = text.lines().filter(|l| l.contains("controller=\"")).count();
    let per_controller = series / (MAX_CONTROLLER_SERIES + 1);
    assert_eq!(series % (MAX_CONTROLLER_SERIES + 1), 0, "{text}");
    assert!(
        per_controller < 120,
        "{per_controller} lines per controller"
    );

    // The same name asked for 100,000 more times: not one line more.
    for _ in 0..100_000 {
        drop(registry.controller("c-0", "Widget"));
    }
    scan_once(&metrics, &registry, Instant::now());
    let again = metrics.encode();
    assert_eq!(
        again
            .lines()
            .filter(|l| l.contains("controller=\""))
            .count(),
        series
    );
}

#[test]
fn a_forgotten_controllers_series_leave_the_scrape() {
    let metrics = Metrics::new(Arc::new(Health::new()));
    let registry = Registry::with_observer(
        Duration::from_secs(60),
        Arc::clone(&metrics) as Arc<dyn crate::guard::Observer>,
    );
    let gone = registry.controller("gone", "Widget");
    gone.register(ObjectKey::cluster("a")).finish(Outcome::Ok);
    let kept = registry.controller("kept", "Widget");
    kept.register(ObjectKey::cluster("a")).finish(Outcome::Ok);
    let named = |text: &str| {
        label_values(
            text,
            "reconcile_watchdog_reconciles_in_flight{",
            "controller",
        )
    };
    assert!(named(&metrics.encode()).contains("gone"));

    // Dropped, it is retired: its series stay while it may be asked for again.
    drop(gone);
    assert!(named(&metrics.encode()).contains("gone"));
    // Pushed out of the retired by as many later ones: its series are gone, and so are
    // those of the thousand that came and went after it but the latest retired.
    for i in 0..1_000 {
        drop(registry.controller(&format!("c-{i}"), "Widget"));
    }
    let text = metrics.encode();
    let names = named(&text);
    assert!(!text.contains("controller=\"gone\""), "{text}");
    assert!(names.contains("kept"));
    assert!(!names.contains("other"), "{names:?}");
    assert_eq!(names.len(), 1 + 16, "{names:?}");

    // A name asked for again after it was forgotten starts from nothing.
    let back = registry.controller("gone", "Widget");
    let text = metrics.encode();
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_reconcile_duration_seconds_count{controller=\"gone\",outcome=\"ok\"} "
        ),
        Some("0")
    );

    // With the registry and every handle dropped, none is left.
    drop((registry, back, kept));
    let text = metrics.encode();
    assert!(named(&text).is_empty(), "{text}");
}

#[test]
fn watch_ages_past_the_bound_share_the_other_series() {
    #[derive(Debug)]
    struct Many;
    impl crate::plug::WatchAges for Many {
        fn attach(&self, _: &Arc<Health>) {}
        fn ages(&self, _: std::time::Instant) -> Vec<crate::plug::WatchAge> {
            vec![crate::plug::WatchAge {
                controllers: (0..1_000).map(|i| format!("c-{i}")).collect(),
                resource: "configmaps".into(),
                age: Duration::from_secs(3),
            }]
        }
    }
    let metrics = Metrics::new(Arc::new(Health::new()));
    metrics.serve_watch_ages(Arc::new(Many));
    let text = metrics.encode();
    let controllers = label_values(&text, "reconcile_watchdog_watch_age_seconds{", "controller");
    assert_eq!(
        controllers.len(),
        MAX_CONTROLLER_SERIES + 1,
        "{controllers:?}"
    );
    assert_eq!(
        line(
            &text,
            "reconcile_watchdog_watch_age_seconds{controller=\"other\",resource=\"configmaps\"} "
        ),
        Some("3.0")
    );
}
