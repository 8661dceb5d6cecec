//! Prometheus metrics of the watchdog, in the OpenMetrics text format.
//!
//! [`Metrics`] is fed by the hooks the core already has: it is the registry's
//! [`guard::Observer`] (every reconcile that ends) and the monitor's observer (every
//! scan, with its snapshot and decision). The health
//! checks are run at scrape time, so `/metrics` shows what `/healthz` would answer now.
//! Every name starts with `reconcile_watchdog_`; `docs/operations.md` lists them.
//!
//! Each controller's series are in `series.rs`, the series read at scrape time rather
//! than fed in `collectors.rs`, the reconcile duration histogram in `histogram.rs`.
//!
//! ```
//! use reconcile_watchdog::Watchdog;
//! use reconcile_watchdog::guard::ObjectKey;
//!
//! # async fn example() -> Result<(), reconcile_watchdog::watchdog::Error> {
//! let watchdog = Watchdog::builder().collect_metrics().start()?;
//! let _ = watchdog
//!     .registry()
//!     .controller("configmaps", "ConfigMap")
//!     .guard(ObjectKey::namespaced("default", "app"), async { Ok::<_, ()>(()) })
//!     .await;
//! let metrics = watchdog.metrics().expect("collected");
//! assert!(metrics.encode().contains(
//!     r#"reconcile_watchdog_reconcile_duration_seconds_count{controller="configmaps",outcome="ok"} 1"#
//! ));
//! # Ok(())
//! # }
//! ```

mod collectors;
mod histogram;
mod series;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;
use warp::Filter;
use warp::http::{Method, Response, header};

use crate::guard;
use crate::health::Health;
use crate::monitor::{self, ApiServerStatus, HangState, Scan, verdict::Event};
use crate::probes::routes::{get_or_head, no_trailing_slash, with_fallbacks};
use collectors::{
    ApiServerReachability, CpuThrottled, EventsDropped, HealthChecks, LeaseAgeCollector, WatchAges,
};
use series::{ControllerSeries, Controllers, Families};

/// The prefix of every metric name.
pub(crate) const PREFIX: &str = "reconcile_watchdog";

/// The content type of the OpenMetrics text format.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Reconcile duration buckets, in seconds: 10 ms to an hour, dense where deadlines are
/// usually chosen (seconds to minutes).
pub(crate) const RECONCILE_BUCKETS: [f64; 17] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];

/// Monitor scan duration buckets, in seconds: 50 µs to 1 s. A scan copies the registry
/// and decides; anything near the interval is a problem.
pub(crate) const SCAN_BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 0.25, 1.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IdentityLabels {
    identity: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WakeLabels {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RenewalLabels {
    result: &'static str,
}

/// The series of leader election (`--leader-elect`).
#[derive(Debug, Default)]
struct LeaderSeries {
    leader: Family<IdentityLabels, Gauge>,
    renewals: Family<RenewalLabels, Counter>,
    renewal_age: LeaseAgeCollector,
}

/// The watchdog's metrics, made by the builder (`collect_metrics`, or a metrics
/// address) and read from [`Watchdog::metrics`](crate::Watchdog::metrics): register
/// them into your own registry, or encode the exposition.
#[derive(Debug)]
pub struct Metrics {
    registry: prometheus_client::registry::Registry,
    families: Families,
    /// The live controllers' series; a new or forgotten controller takes the write lock,
    /// the monitor only tries the read lock.
    controllers: RwLock<Controllers>,
    scan_duration: Histogram,
    runtime_heartbeat_age: Gauge<f64, AtomicU64>,
    hangs_unnamed: Counter,
    pauses: Counter,
    paused: Counter<f64, AtomicU64>,
    driver_rescues: Counter,
    driver_wakes: Family<WakeLabels, Counter>,
    /// The monitor's updates left out because a scrape or a registration held the lock
    /// they need (the monitor only tries it).
    updates_skipped: Counter,
    leader: LeaderSeries,
    health: Arc<Health>,
    api_server: Arc<ApiServerStatus>,
    watch_ages: WatchAges,
    events_dropped: EventsDropped,
    quarantine: QuarantineSeries,
    last_hang_restart: Gauge<f64, AtomicU64>,
}

/// The series of the quarantine (`--quarantine-after`).
#[derive(Debug, Default)]
struct QuarantineSeries {
    quarantined: Family<series::ControllerLabels, Gauge>,
    quarantines: Family<series::ControllerLabels, Counter>,
    recorded: Gauge,
}

impl Metrics {
    /// Metrics whose health-check gauges run the checks of `health` at each scrape.
    #[cfg(any(test, feature = "internals"))]
    #[must_use]
    pub(crate) fn new(health: Arc<Health>) -> Arc<Self> {
        Self::with_api_server(health, Arc::default())
    }

    /// Like [`new`](Self::new), with the API server's reachability from `api_server`
    /// (shown once its check has run).
    #[must_use]
    pub(crate) fn with_api_server(
        health: Arc<Health>,
        api_server: Arc<ApiServerStatus>,
    ) -> Arc<Self> {
        let families = Families {
            reconcile_duration: Family::default(),
            in_flight: Family::default(),
            overdue: Family::default(),
            hangs: Family::default(),
            cancellations: Family::default(),
            escalations: Family::default(),
            near_misses: Family::default(),
        };
        let scan_duration = Histogram::new(SCAN_BUCKETS);
        let runtime_heartbeat_age = Gauge::<f64, AtomicU64>::default();

        let mut metrics = Self {
            registry: prometheus_client::registry::Registry::default(),
            families,
            controllers: RwLock::new(Controllers::default()),
            scan_duration,
            runtime_heartbeat_age,
            hangs_unnamed: Counter::default(),
            pauses: Counter::default(),
            paused: Counter::default(),
            driver_rescues: Counter::default(),
            driver_wakes: Family::default(),
            updates_skipped: Counter::default(),
            leader: LeaderSeries::default(),
            health,
            api_server,
            watch_ages: WatchAges::default(),
            events_dropped: EventsDropped::default(),
            quarantine: QuarantineSeries::default(),
            last_hang_restart: Gauge::default(),
        };
        let mut own = prometheus_client::registry::Registry::with_prefix(PREFIX);
        metrics.register_all(&mut own);
        metrics.registry = own;
        Arc::new(metrics)
    }

    /// Registers every metric of the watchdog into `registry` too, under the
    /// `reconcile_watchdog` prefix (after the registry's own), so that an operator that
    /// already serves a prometheus-client registry serves these from it. The series are
    /// shared: both expositions show the same values. Call it at any point before you
    /// share the registry, on the registry of the version the crate re-exports
    /// ([`crate::prometheus_client`]). On an unprefixed root, the names are those the
    /// shipped alerts and dashboard query; under a prefix `myop`, they are
    /// `myop_reconcile_watchdog_*` (`docs/embedding.md` has the rules' one-line change).
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        self.register_all(registry.sub_registry_with_prefix(PREFIX));
    }

    fn register_all(&self, registry: &mut prometheus_client::registry::Registry) {
        // Names without unit or `_total`: the encoder appends them.
        registry.register_with_unit(
            "reconcile_duration",
            "How long reconciles took, by controller and outcome (ok, error, panic, cancelled, dropped)",
            Unit::Seconds,
            self.families.reconcile_duration.clone(),
        );
        registry.register(
            "reconciles_in_flight",
            "Reconciles running at the latest watchdog scan, by controller",
            self.families.in_flight.clone(),
        );
        registry.register(
            "reconciles_overdue",
            "Reconciles past their deadline at the latest watchdog scan, by controller",
            self.families.overdue.clone(),
        );
        registry.register(
            "hangs",
            "Reconciles newly found past their deadline, by controller and state (awaiting, in-poll, starved)",
            self.families.hangs.clone(),
        );
        registry.register(
            "cancellations",
            "Overdue reconciles the watchdog asked to stop (--on-hang cancel), by controller",
            self.families.cancellations.clone(),
        );
        registry.register(
            "escalations",
            "Cancellations that did not stop a reconcile and now fail liveness, by controller",
            self.families.escalations.clone(),
        );
        registry.register(
            "near_misses",
            "Reconciles that ended on time but past the near-miss share of their deadline (--near-miss-threshold), by controller",
            self.families.near_misses.clone(),
        );
        registry.register_with_unit(
            "scan_duration",
            "How long one watchdog scan took (snapshot, decision and reports)",
            Unit::Seconds,
            self.scan_duration.clone(),
        );
        registry.register_with_unit(
            "runtime_heartbeat_age",
            "Age of the watched async runtime's heartbeat at the latest scan",
            Unit::Seconds,
            self.runtime_heartbeat_age.clone(),
        );
        registry.register(
            "hangs_unnamed",
            "Hung reconciles their first report did not name: over the report budget and over the names of its summary (a later reminder or end summary names those never named first)",
            self.hangs_unnamed.clone(),
        );
        registry.register(
            "pauses",
            "Times the process did not run (a late scan: paused or CPU-throttled); no verdict on that time",
            self.pauses.clone(),
        );
        registry.register_with_unit(
            "paused",
            "Time the process did not run, as the monitor's late scans found it",
            Unit::Seconds,
            self.paused.clone(),
        );
        registry.register(
            "driver_rescues",
            "Idle runtime workers the watchdog woke because a guarded reconcile held a worker of the watched runtime in one poll past --driver-rescue-after, leaving tokio's timers and I/O undriven",
            self.driver_rescues.clone(),
        );
        registry.register(
            "driver_wakes",
            "Idle runtime workers the watchdog woke to drive tokio's timers and I/O with no guarded reconcile holding a worker, by cause: busy_worker (a worker published no progress for --driver-rescue-after), preempted (the guarded reconcile in a long poll there was waiting for a CPU), heartbeat_late, not_looked_up (the lookup budget was spent)",
            self.driver_wakes.clone(),
        );
        registry.register(
            "metrics_updates_skipped",
            "Updates of these metrics the watchdog's monitor left out because a new or forgotten controller held the lock they need (the monitor never waits for one)",
            self.updates_skipped.clone(),
        );
        registry.register_collector(Box::new(CpuThrottled(
            crate::monitor::cgroup::CpuStat::find().ok(),
        )));
        registry.register_collector(Box::new(HealthChecks(Arc::clone(&self.health))));
        registry.register_collector(Box::new(ApiServerReachability(Arc::clone(
            &self.api_server,
        ))));
        registry.register(
            "leader",
            "Whether this process holds the leader-election lease (1) or not (0), by identity",
            self.leader.leader.clone(),
        );
        registry.register(
            "lease_renewals",
            "The leader's lease renewals, by result (success, failure)",
            self.leader.renewals.clone(),
        );
        registry.register_collector(Box::new(self.leader.renewal_age.clone()));
        registry.register_collector(Box::new(self.watch_ages.clone()));
        registry.register_collector(Box::new(self.events_dropped.clone()));
        registry.register(
            "quarantined_objects",
            "Objects this process does not reconcile because their hangs failed liveness --quarantine-after times, by controller",
            self.quarantine.quarantined.clone(),
        );
        registry.register(
            "quarantines",
            "Quarantines this process began honouring (one per object per process), by controller",
            self.quarantine.quarantines.clone(),
        );
        registry.register(
            "quarantine_recorded_failures",
            "Liveness failures caused by hung reconciles that the quarantine ledger has recorded, in all: it survives restarts, so its increase counts restarts a hang caused",
            self.quarantine.recorded.clone(),
        );
        registry.register_with_unit(
            "last_hang_restart_timestamp",
            "When the previous run of this container ended, as a Unix time, if it exited while liveness failed (its termination message, read from the Pod at start); 0 otherwise",
            Unit::Seconds,
            self.last_hang_restart.clone(),
        );
    }

    /// The whole exposition in the OpenMetrics text format, `# EOF` included.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; a collector cannot fail either.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            tracing::error!("metrics: encoding the exposition failed");
        }
        out
    }

    /// The response to `method path`: `GET|HEAD /metrics`, 404 elsewhere, 405 for
    /// other methods.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn respond(&self, method: &Method, path: &str) -> Response<String> {
        let request = crate::probes::server::Request {
            method,
            path,
            query: "",
            peer: ([127, 0, 0, 1], 0).into(),
        };
        crate::probes::server::answer(routes(|| self.encode()), &request)
    }

    /// Creates the series of `controller` up front, so that they read 0 before its
    /// first reconcile ends instead of being absent (the benches' and tests' metrics
    /// made by hand; a watchdog's registry does it as each controller registers).
    #[cfg(feature = "internals")]
    pub(crate) fn add_controller(&self, controller: &str) {
        self.with_series(controller, |_| ());
    }

    /// The previous run of this container, which ended at `at`, exited while liveness
    /// failed.
    #[cfg(feature = "_kube")]
    pub(crate) fn hang_restart(&self, at: std::time::SystemTime) {
        let seconds = at
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.last_hang_restart.set(seconds);
    }

    /// Sets `reconcile_watchdog_leader{identity}` to 1 (leading) or 0.
    #[cfg(any(test, feature = "_kube", feature = "internals"))]
    pub(crate) fn set_leader(&self, identity: &str, leading: bool) {
        self.leader
            .leader
            .get_or_create(&IdentityLabels {
                identity: identity.to_owned(),
            })
            .set(i64::from(leading));
    }

    /// Counts one renewal attempt of the leader in
    /// `reconcile_watchdog_lease_renewals_total{result}`.
    #[cfg(any(test, feature = "_kube", feature = "internals"))]
    pub(crate) fn lease_renewal(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.leader
            .renewals
            .get_or_create(&RenewalLabels { result })
            .inc();
    }

    /// Serves `reconcile_watchdog_lease_renewal_age_seconds` from `age`, read at each
    /// scrape (None: not leading, no sample). Only the first call counts.
    #[cfg(any(test, feature = "_kube", feature = "internals"))]
    pub(crate) fn watch_lease_renewal_age(
        &self,
        age: impl Fn() -> Option<std::time::Duration> + Send + Sync + 'static,
    ) {
        let _ = self.leader.renewal_age.0.set(Box::new(age));
    }

    /// Serves `reconcile_watchdog_watch_age_seconds` from `watches`, read at each scrape.
    /// Only the first call counts.
    pub(crate) fn serve_watch_ages(&self, watches: Arc<dyn crate::plug::WatchAges>) {
        let _ = self.watch_ages.0.set(watches);
    }

    /// Serves `reconcile_watchdog_events_dropped_total` from `reports`, read at each
    /// scrape. Only the first call counts.
    pub(crate) fn serve_events_dropped(&self, reports: Arc<dyn crate::plug::HangReports>) {
        let _ = self.events_dropped.0.set(reports);
    }

    /// Sets `reconcile_watchdog_quarantined_objects{controller}`.
    pub(crate) fn set_quarantined(&self, controller: &str, objects: usize) {
        let labels = series::ControllerLabels {
            controller: controller.to_owned(),
        };
        let objects = i64::try_from(objects).unwrap_or(i64::MAX);
        self.quarantine
            .quarantined
            .get_or_create(&labels)
            .set(objects);
    }

    /// Counts one quarantine of `controller` in `reconcile_watchdog_quarantines_total`.
    pub(crate) fn quarantine_started(&self, controller: &str) {
        let labels = series::ControllerLabels {
            controller: controller.to_owned(),
        };
        self.quarantine.quarantines.get_or_create(&labels).inc();
    }

    /// Sets `reconcile_watchdog_quarantine_recorded_failures` from the ledger.
    pub(crate) fn set_quarantine_recorded(&self, recorded: u64) {
        self.quarantine
            .recorded
            .set(i64::try_from(recorded).unwrap_or(i64::MAX));
    }

    /// Runs `f` on the series of `controller`, creating them on first sight. The common
    /// case takes one read lock and allocates nothing.
    #[cfg(feature = "internals")]
    fn with_series<R>(&self, controller: &str, f: impl FnOnce(&ControllerSeries) -> R) -> R {
        {
            let controllers = self.controllers.read().unwrap_or_else(|p| p.into_inner());
            if let Some(series) = controllers.get(controller) {
                return f(series);
            }
        }
        f(&self.series(controller))
    }

    /// Like [`with_series`](Self::with_series) for the monitor, which never waits on a
    /// lock a scrape or a registration may hold: it only tries the controllers' lock,
    /// and counts the update as skipped when it is held. A controller with no series
    /// (forgotten while its last reconciles run: see `Registry::controller`) has
    /// nothing to update.
    fn try_with_series(&self, controller: &str, f: impl FnOnce(&ControllerSeries)) {
        let controllers = match self.controllers.try_read() {
            Ok(controllers) => controllers,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                self.updates_skipped.inc();
                return;
            }
        };
        if let Some(series) = controllers.get(controller) {
            f(series);
        }
    }

    /// The series of a new controller `controller`, made on first sight of its name
    /// (or the shared set's, past the bound).
    fn series(&self, controller: &str) -> Arc<ControllerSeries> {
        self.controllers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .acquire(&self.families, controller)
    }
}

impl guard::Observer for Metrics {
    fn controller(
        &self,
        controller: &str,
        _kind: &str,
    ) -> Option<Arc<dyn guard::ControllerObserver>> {
        Some(self.series(controller))
    }

    fn controller_forgotten(&self, controller: &str, _kind: &str) {
        self.controllers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .release(&self.families, controller);
    }
}

impl monitor::Observer for Metrics {
    fn scanned(&self, scan: &Scan<'_>) {
        self.scan_duration.observe(scan.took.as_secs_f64());
        if let Some(age) = scan.runtime_heartbeat_age {
            self.runtime_heartbeat_age.set(age.as_secs_f64());
        }

        // In flight and overdue per controller; every known controller is set, so one
        // whose reconciles all ended reads 0 rather than its last count.
        let mut counts: HashMap<&str, (i64, i64)> = HashMap::new();
        for (controller, n) in scan.in_flight_by_controller {
            counts.entry(controller).or_default().0 += i64::try_from(*n).unwrap_or(i64::MAX);
        }
        // Controllers are few and their names shared: count overdue by the name's
        // address, then hash each name once (linear when thousands are overdue).
        let mut overdue_by: Vec<(&Arc<str>, i64)> = Vec::new();
        for overdue in &scan.decision.overdue {
            let controller = &overdue.reconcile.controller;
            match overdue_by
                .iter_mut()
                .find(|(c, _)| crate::monitor::summary::same_name(c, controller))
            {
                Some((_, n)) => *n += 1,
                None => overdue_by.push((controller, 1)),
            }
        }
        for (controller, n) in overdue_by {
            counts.entry(controller).or_default().1 += n;
        }
        // Tried, never waited for: the lock is the one a scrape and a new controller's
        // registration take.
        match self.controllers.try_read() {
            Ok(controllers) => {
                for (controller, series) in controllers.own() {
                    let (in_flight, overdue) =
                        counts.get(&**controller).copied().unwrap_or_default();
                    series.in_flight.set(in_flight);
                    series.overdue.set(overdue);
                }
                if let Some((series, names)) = controllers.other() {
                    let (in_flight, overdue) = names
                        .filter_map(|name| counts.get(&**name))
                        .fold((0, 0), |(i, o), (n, m)| (i + n, o + m));
                    series.in_flight.set(in_flight);
                    series.overdue.set(overdue);
                }
                // A controller counted that has no series is one forgotten while its
                // last reconciles run (or of a registry these metrics do not observe):
                // nothing to set.
            }
            Err(_) => {
                self.updates_skipped.inc();
            }
        }

        // Every new hang, whether or not its report fitted the report budget; counted
        // per series first, so that a mass hang takes one lookup per controller.
        let mut newly: Vec<(&Arc<str>, HangState, u64)> = Vec::new();
        for (controller, state) in &scan.decision.newly_hung {
            match newly
                .iter_mut()
                .find(|(c, s, _)| s == state && crate::monitor::summary::same_name(c, controller))
            {
                Some((_, _, n)) => *n += 1,
                None => newly.push((controller, *state, 1)),
            }
        }
        for (controller, state, n) in newly {
            self.try_with_series(controller, |s| {
                s.hangs(state).inc_by(n);
            });
        }
        self.driver_rescues.inc_by(scan.driver_rescues);
        for (cause, n) in scan.driver_wakes.by_cause() {
            if n > 0 {
                self.driver_wakes
                    .get_or_create(&WakeLabels { cause })
                    .inc_by(n);
            }
        }
        self.hangs_unnamed
            .inc_by(u64::try_from(scan.decision.hangs_unnamed).unwrap_or(u64::MAX));
        for event in &scan.decision.events {
            match event {
                Event::Escalated { controller, .. } => {
                    self.try_with_series(controller, |s| {
                        s.escalations.inc();
                    });
                }
                Event::Paused(pause) => {
                    self.pauses.inc();
                    self.paused.inc_by(pause.length.as_secs_f64());
                }
                _ => {}
            }
        }
        if !scan.decision.cancel.is_empty() {
            // By id, so that a mass cancellation stays linear.
            let controllers: HashMap<u64, &Arc<str>> = scan
                .attention
                .iter()
                .map(|r| (r.id, &r.controller))
                .collect();
            for id in &scan.decision.cancel {
                if let Some(controller) = controllers.get(id) {
                    self.try_with_series(controller, |s| {
                        s.cancellations.inc();
                    });
                }
            }
        }
    }
}

/// The metrics server's routes: `GET|HEAD /metrics`, the exposition made by `encode`
/// (not made for HEAD); 405 for other methods there, 404 everywhere else.
pub(crate) fn routes<E>(
    encode: E,
) -> impl Filter<Extract = (Response<String>,), Error = Infallible> + Clone + Send + Sync
where
    E: Fn() -> String + Clone + Send + Sync,
{
    let path = warp::path!("metrics").and(no_trailing_slash());
    let exposition = path
        .and(get_or_head())
        .and(warp::method())
        .map(move |method: Method| {
            let body = if method == Method::HEAD {
                String::new()
            } else {
                encode()
            };
            let mut response = Response::new(body);
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(CONTENT_TYPE),
            );
            response
        });
    with_fallbacks(exposition, path)
}

#[cfg(test)]
mod tests;
