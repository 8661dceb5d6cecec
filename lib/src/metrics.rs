//! Prometheus metrics of the watchdog, in the OpenMetrics text format.
//!
//! [`Metrics`] is fed by the hooks the core already has: it is the registry's
//! [`guard::Observer`] (every reconcile that ends) and the monitor's
//! [`monitor::Observer`] (every scan, with its snapshot and decision). The health
//! checks are run at scrape time, so `/metrics` shows what `/healthz` would answer now.
//! Every name starts with `reconcile_watchdog_`; `docs/operations.md` lists them.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use reconcile_watchdog::guard::{ObjectKey, Registry};
//! use reconcile_watchdog::health::Health;
//! use reconcile_watchdog::metrics::Metrics;
//!
//! # async fn example() {
//! let metrics = Metrics::new(Arc::new(Health::new()));
//! let registry = Registry::with_observer(Duration::from_secs(300), metrics.clone());
//! let _ = registry
//!     .controller("configmaps", "ConfigMap")
//!     .guard(ObjectKey::namespaced("default", "app"), async { Ok::<_, ()>(()) })
//!     .await;
//! assert!(metrics.encode().contains(
//!     r#"reconcile_watchdog_reconcile_duration_seconds_count{controller="configmaps",outcome="ok"} 1"#
//! ));
//! # }
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;
use warp::Filter;
use warp::http::{Method, Response, header};

use crate::guard::{self, Outcome};
use crate::health::Health;
use crate::monitor::{self, ApiServerStatus, HangState, Scan, verdict::Event};
use crate::probes::routes::{get_or_head, no_trailing_slash, with_fallbacks};

/// The prefix of every metric name.
pub const PREFIX: &str = "reconcile_watchdog";

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Reconcile duration buckets, in seconds: 10 ms to an hour, dense where deadlines are
/// usually chosen (seconds to minutes).
pub const RECONCILE_BUCKETS: [f64; 17] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];

/// Monitor scan duration buckets, in seconds: 50 µs to 1 s. A scan copies the registry
/// and decides; anything near the interval is a problem.
pub const SCAN_BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 0.25, 1.0,
];

/// Every [`Outcome`], in the order of [`outcome_index`].
const OUTCOMES: [Outcome; 5] = [
    Outcome::Ok,
    Outcome::Error,
    Outcome::Panic,
    Outcome::Cancelled,
    Outcome::Dropped,
];

fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Ok => 0,
        Outcome::Error => 1,
        Outcome::Panic => 2,
        Outcome::Cancelled => 3,
        Outcome::Dropped => 4,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    controller: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HangLabels {
    controller: String,
    state: &'static str,
}

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

/// Reads the age of the leader's last lease renewal; None when not leading.
type LeaseAge = Box<dyn Fn() -> Option<Duration> + Send + Sync>;

/// The series of leader election (`--leader-elect`).
#[derive(Debug, Default)]
struct LeaderSeries {
    leader: Family<IdentityLabels, Gauge>,
    renewals: Family<RenewalLabels, Counter>,
    renewal_age: LeaseAgeCollector,
}

/// `reconcile_watchdog_lease_renewal_age_seconds`, read at scrape time so that it keeps
/// growing while a renewal hangs.
#[derive(Clone, Default)]
struct LeaseAgeCollector(Arc<OnceLock<LeaseAge>>);

impl std::fmt::Debug for LeaseAgeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseAgeCollector")
            .field("watched", &self.0.get().is_some())
            .finish()
    }
}

impl Collector for LeaseAgeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(age) = self.0.get().and_then(|age| age()) else {
            return Ok(());
        };
        let metric = encoder.encode_descriptor(
            "lease_renewal_age",
            "Age of the leader's last successful lease renewal; absent when not leading",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        ConstGauge::new(age.as_secs_f64()).encode(metric)
    }
}

/// `reconcile_watchdog_watch_age_seconds{controller,resource}`, read at scrape time from
/// the watches (one series per controller of a watched resource).
#[derive(Clone, Debug, Default)]
struct WatchAges(Arc<OnceLock<Arc<dyn crate::plug::WatchAges>>>);

impl Collector for WatchAges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(watches) = self.0.get() else {
            return Ok(());
        };
        let ages = watches.ages(std::time::Instant::now());
        if ages.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            "watch_age",
            "Time since a watched resource last showed a sign of life (an event, a bookmark, a list), by controller and resource",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        for watch in &ages {
            for controller in &watch.controllers {
                let labels = [
                    ("controller", controller.as_str()),
                    ("resource", watch.resource.as_str()),
                ];
                ConstGauge::new(watch.age.as_secs_f64()).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// [`RECONCILE_BUCKETS`] in nanoseconds, for [`DurationHistogram`]: computed at compile
/// time, so an observation reads no lazy cell.
const RECONCILE_BUCKET_NANOS: [u64; RECONCILE_BUCKETS.len()] = {
    let mut nanos = [0; RECONCILE_BUCKETS.len()];
    let mut i = 0;
    while i < nanos.len() {
        // Rounded to the nearest nanosecond (`f64::round` is not const).
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        {
            nanos[i] = (RECONCILE_BUCKETS[i] * 1e9 + 0.5) as u64;
        }
        i += 1;
    }
    nanos
};

/// A histogram of reconcile durations over [`RECONCILE_BUCKETS`] on atomics: every
/// reconcile's end records into one, so it takes no lock (prometheus-client's
/// `Histogram` locks a mutex per observation) and sums whole nanoseconds.
#[derive(Clone, Debug, Default)]
struct DurationHistogram(Arc<DurationCounts>);

#[derive(Debug, Default)]
struct DurationCounts {
    /// Per bucket, not cumulative; the last one is `+Inf`.
    buckets: [AtomicU64; RECONCILE_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl DurationHistogram {
    fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        // The first bucket whose bound is at or above it (`le`).
        let bucket = RECONCILE_BUCKET_NANOS.partition_point(|&bound| bound < nanos);
        let counts = &self.0;
        counts.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        counts.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl prometheus_client::metrics::TypedMetric for DurationHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DurationHistogram {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        // Per bucket: the encoder adds them up into the cumulative `le` counts.
        let buckets: Vec<(f64, u64)> = RECONCILE_BUCKETS
            .iter()
            .chain(&[f64::INFINITY])
            .zip(&self.0.buckets)
            .map(|(&bound, n)| (bound, n.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        #[allow(clippy::cast_precision_loss)]
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// `reconcile_watchdog_events_dropped_total`, read at scrape time from what the hang
/// reports are plugged into; absent when nothing is.
#[derive(Clone, Debug, Default)]
struct EventsDropped(Arc<OnceLock<Arc<dyn crate::plug::HangReports>>>);

impl Collector for EventsDropped {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(reports) = self.0.get() else {
            return Ok(());
        };
        let metric = ConstCounter::new(reports.dropped());
        let family = encoder.encode_descriptor(
            "events_dropped",
            "Hang reports not published as Events (their queue was full, or the API server did not take them in time)",
            None,
            metric.metric_type(),
        )?;
        metric.encode(family)
    }
}

/// The labelled families, kept to create each controller's series from.
#[derive(Debug)]
struct Families {
    reconcile_duration: Family<OutcomeLabels, DurationHistogram>,
    in_flight: Family<ControllerLabels, Gauge>,
    overdue: Family<ControllerLabels, Gauge>,
    hangs: Family<HangLabels, Counter>,
    cancellations: Family<ControllerLabels, Counter>,
    escalations: Family<ControllerLabels, Counter>,
    near_misses: Family<ControllerLabels, Counter>,
}

/// One controller's series, resolved once so that the per-reconcile hook neither
/// allocates nor formats labels.
#[derive(Debug)]
struct ControllerSeries {
    durations: [DurationHistogram; OUTCOMES.len()],
    in_flight: Gauge,
    overdue: Gauge,
    hangs_awaiting: Counter,
    hangs_in_poll: Counter,
    hangs_starved: Counter,
    cancellations: Counter,
    escalations: Counter,
    near_misses: Counter,
}

impl ControllerSeries {
    fn new(families: &Families, controller: &str) -> Self {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        let hangs = |state: HangState| {
            families.hangs.get_or_create_owned(&HangLabels {
                controller: controller.to_owned(),
                state: state.as_str(),
            })
        };
        Self {
            durations: OUTCOMES.map(|outcome| {
                families
                    .reconcile_duration
                    .get_or_create_owned(&OutcomeLabels {
                        controller: controller.to_owned(),
                        outcome: outcome.as_str(),
                    })
            }),
            in_flight: families.in_flight.get_or_create_owned(&labels),
            overdue: families.overdue.get_or_create_owned(&labels),
            hangs_awaiting: hangs(HangState::Awaiting),
            hangs_in_poll: hangs(HangState::InPoll),
            hangs_starved: hangs(HangState::Starved),
            cancellations: families.cancellations.get_or_create_owned(&labels),
            escalations: families.escalations.get_or_create_owned(&labels),
            near_misses: families.near_misses.get_or_create_owned(&labels),
        }
    }

    fn hangs(&self, state: HangState) -> &Counter {
        match state {
            HangState::Awaiting => &self.hangs_awaiting,
            HangState::InPoll => &self.hangs_in_poll,
            HangState::Starved => &self.hangs_starved,
        }
    }
}

/// The watchdog's metrics. Share it as an `Arc`: hand it to
/// [`Registry::with_observer`](guard::Registry::with_observer) and
/// [`Monitor::spawn`](monitor::Monitor::spawn), and serve [`respond`](Self::respond).
#[derive(Debug)]
pub struct Metrics {
    registry: prometheus_client::registry::Registry,
    families: Families,
    controllers: RwLock<HashMap<Arc<str>, Arc<ControllerSeries>>>,
    scan_duration: Histogram,
    runtime_heartbeat_age: Gauge<f64, AtomicU64>,
    hangs_unnamed: Counter,
    pauses: Counter,
    paused: Counter<f64, AtomicU64>,
    driver_rescues: Counter,
    driver_wakes: Family<WakeLabels, Counter>,
    leader: LeaderSeries,
    health: Arc<Health>,
    api_server: Arc<ApiServerStatus>,
    watch_ages: WatchAges,
    events_dropped: EventsDropped,
}

impl Metrics {
    /// Metrics whose health-check gauges run the checks of `health` at each scrape.
    #[must_use]
    pub fn new(health: Arc<Health>) -> Arc<Self> {
        Self::with_api_server(health, Arc::default())
    }

    /// Like [`new`](Self::new), with the API server's reachability from `api_server`
    /// (shown once its check has run).
    #[must_use]
    pub fn with_api_server(health: Arc<Health>, api_server: Arc<ApiServerStatus>) -> Arc<Self> {
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
            controllers: RwLock::new(HashMap::new()),
            scan_duration,
            runtime_heartbeat_age,
            hangs_unnamed: Counter::default(),
            pauses: Counter::default(),
            paused: Counter::default(),
            driver_rescues: Counter::default(),
            driver_wakes: Family::default(),
            leader: LeaderSeries::default(),
            health,
            api_server,
            watch_ages: WatchAges::default(),
            events_dropped: EventsDropped::default(),
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
            "Idle runtime workers the watchdog woke to drive tokio's timers and I/O with no guarded reconcile holding a worker, by cause: busy_worker (a worker published no progress for --driver-rescue-after), heartbeat_late, not_looked_up (the lookup budget was spent)",
            self.driver_wakes.clone(),
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
    #[must_use]
    pub fn respond(&self, method: &Method, path: &str) -> Response<String> {
        let request = crate::probes::Request {
            method,
            path,
            query: "",
            peer: ([127, 0, 0, 1], 0).into(),
        };
        crate::probes::server::answer(routes(|| self.encode()), &request)
    }

    /// Creates the series of `controller` up front, so that they read 0 before its
    /// first reconcile ends instead of being absent.
    pub fn add_controller(&self, controller: &str) {
        self.with_series(controller, |_| ());
    }

    /// Sets `reconcile_watchdog_leader{identity}` to 1 (leading) or 0.
    pub fn set_leader(&self, identity: &str, leading: bool) {
        self.leader
            .leader
            .get_or_create(&IdentityLabels {
                identity: identity.to_owned(),
            })
            .set(i64::from(leading));
    }

    /// Counts one renewal attempt of the leader in
    /// `reconcile_watchdog_lease_renewals_total{result}`.
    pub fn lease_renewal(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.leader
            .renewals
            .get_or_create(&RenewalLabels { result })
            .inc();
    }

    /// Serves `reconcile_watchdog_lease_renewal_age_seconds` from `age`, read at each
    /// scrape (None: not leading, no sample). Only the first call counts.
    pub fn watch_lease_renewal_age(
        &self,
        age: impl Fn() -> Option<Duration> + Send + Sync + 'static,
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

    /// Runs `f` on the series of `controller`, creating them on first sight. The common
    /// case takes one read lock and allocates nothing.
    fn with_series<R>(&self, controller: &str, f: impl FnOnce(&ControllerSeries) -> R) -> R {
        {
            let controllers = self.controllers.read().unwrap_or_else(|p| p.into_inner());
            if let Some(series) = controllers.get(controller) {
                return f(series);
            }
        }
        f(&self.series(controller))
    }

    /// `controller`'s series, made on first sight.
    fn series(&self, controller: &str) -> Arc<ControllerSeries> {
        let mut controllers = self.controllers.write().unwrap_or_else(|p| p.into_inner());
        Arc::clone(
            controllers
                .entry(controller.into())
                .or_insert_with(|| Arc::new(ControllerSeries::new(&self.families, controller))),
        )
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
}

/// Each end lands in the controller's series resolved when its handle was made.
impl guard::ControllerObserver for ControllerSeries {
    fn finished(&self, outcome: Outcome, elapsed: Duration) {
        self.durations[outcome_index(outcome)].observe(elapsed);
    }

    fn ended_late(&self, end: &guard::LateEnd<'_>) {
        if end.is_near_miss() {
            self.near_misses.inc();
        }
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
        for controller in counts.keys() {
            self.add_controller(controller);
        }
        {
            let controllers = self.controllers.read().unwrap_or_else(|p| p.into_inner());
            for (controller, series) in controllers.iter() {
                let (in_flight, overdue) = counts.get(&**controller).copied().unwrap_or_default();
                series.in_flight.set(in_flight);
                series.overdue.set(overdue);
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
            self.with_series(controller, |s| {
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
                    self.with_series(controller, |s| {
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
                    self.with_series(controller, |s| {
                        s.cancellations.inc();
                    });
                }
            }
        }
    }
}

/// `reconcile_watchdog_health_check_passing{probe, check}`: runs every check of both
/// sets at scrape time.
#[derive(Debug)]
struct HealthChecks(Arc<Health>);

impl Collector for HealthChecks {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "health_check_passing",
            "Whether a health check passes now (1) or fails (0), by probe (healthz, readyz) and check.",
            None,
            MetricType::Gauge,
        )?;
        for checks in [&self.0.liveness, &self.0.readiness] {
            for check in checks.run(&[]).checks {
                let labels = [("probe", checks.endpoint()), ("check", check.name.as_str())];
                ConstGauge::new(i64::from(check.result.is_ok()))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// `reconcile_watchdog_api_server_reachable` (1/0) and
/// `reconcile_watchdog_api_server_unreachable_seconds_total`, read at scrape time from
/// the API server check; absent until it has run.
#[derive(Debug)]
struct ApiServerReachability(Arc<ApiServerStatus>);

impl Collector for ApiServerReachability {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(reachable) = self.0.reachable() else {
            return Ok(());
        };
        let gauge = encoder.encode_descriptor(
            "api_server_reachable",
            "Whether the API server gave any HTTP answer at the latest reachability check (1) or none (0)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(reachable)).encode(gauge)?;
        let counter = encoder.encode_descriptor(
            "api_server_unreachable_seconds",
            "Time the API server has not answered the reachability check, in all",
            None,
            MetricType::Counter,
        )?;
        prometheus_client::metrics::counter::ConstCounter::new(
            self.0
                .unreachable_for(std::time::Instant::now())
                .as_secs_f64(),
        )
        .encode(counter)?;
        Ok(())
    }
}

/// `reconcile_watchdog_cpu_throttled_seconds_total`: the time cgroup v2 has throttled
/// this process's cgroup, read at scrape time; absent without cgroup v2's cpu controller.
#[derive(Debug)]
struct CpuThrottled(Option<crate::monitor::cgroup::CpuStat>);

impl Collector for CpuThrottled {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(throttled) = self.0.as_ref().and_then(|c| c.throttled().ok()) else {
            return Ok(());
        };
        let metric = ConstCounter::new(throttled.as_secs_f64());
        let family = encoder.encode_descriptor(
            "cpu_throttled_seconds",
            "Time cgroup v2 has CPU-throttled this process's cgroup (cpu.stat throttled_usec): it explains slow reconciles",
            None,
            metric.metric_type(),
        )?;
        metric.encode(family)
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
mod tests {
    use std::time::Instant;

    use warp::http::StatusCode;

    use super::*;
    use crate::guard::{ObjectKey, Registry};
    use crate::health::FnCheck;
    use crate::monitor::{Config, HangPolicy, Verdict};

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
        let ours = "reconcile_watchdog_reconcile_duration_seconds_count{controller=\"web\",outcome=\"ok\"} ";
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
    fn a_duration_lands_in_the_first_bucket_at_or_above_it() {
        let histogram = DurationHistogram::default();
        for millis in [30, 50, 51, 7_200_000] {
            histogram.observe(Duration::from_millis(millis));
        }
        let counts: Vec<u64> = histogram
            .0
            .buckets
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect();
        // le 0.05 holds 30 ms and exactly 50 ms; 51 ms is in le 0.1; two hours in +Inf.
        assert_eq!(counts[2], 2, "{counts:?}");
        assert_eq!(counts[3], 1, "{counts:?}");
        assert_eq!(counts[RECONCILE_BUCKETS.len()], 1, "{counts:?}");
        assert_eq!(counts.iter().sum::<u64>(), 4);
        assert_eq!(
            histogram.0.sum_nanos.load(Ordering::Relaxed),
            (30 + 50 + 51 + 7_200_000) * 1_000_000
        );
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
        let registry = Registry::new(Duration::from_secs(60));
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
                    driver_wakes: monitor::DriverWakes {
                        busy_worker: 3,
                        heartbeat_late: 0,
                        not_looked_up: 0,
                    },
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
}
