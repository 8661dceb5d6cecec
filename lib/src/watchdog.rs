//! One call to set up the whole watchdog: registry, monitor thread, health sets and the
//! probe, metrics and debug servers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::deadlines::Advisor;
use crate::guard::{Deadlines, Fanout, Registry};
use crate::health::{FnCheck, Health};
#[cfg(feature = "metrics")]
use crate::metrics::Metrics;
use crate::monitor::{self, HangPolicy, Monitor, RuntimeHeartbeat};
use crate::plug::{ApiServerReachability, HangReports, ReportsObserver, WatchAges};
use crate::probes::{self, DebugViews, HttpServer, Probes};
use crate::quarantine::Keeper;
use crate::restart::{self, Destination};

/// The runtime heartbeat's shortest period: tokio's timers count in milliseconds.
pub const MIN_HEARTBEAT_PERIOD: Duration = Duration::from_millis(1);

/// How often the watched runtime's heartbeat beats for a scan `interval`: every half
/// interval. The builder keeps it at [`MIN_HEARTBEAT_PERIOD`] or more (a zero period
/// would panic the beating task).
#[must_use]
pub fn heartbeat_period(interval: Duration) -> Duration {
    interval / 2
}

/// Errors of starting the watchdog.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The monitor thread did not start.
    #[error("failed to start the monitor")]
    Monitor(#[source] monitor::Error),
    /// The probe server did not start.
    #[error("failed to start the probe server")]
    Probes(#[source] probes::Error),
    /// The metrics server did not start.
    #[cfg(feature = "metrics")]
    #[error("failed to start the metrics server")]
    Metrics(#[source] probes::Error),
    /// The metrics server's address is taken: most often by the operator's own metrics
    /// server, on the port both default to.
    #[cfg(feature = "metrics")]
    #[error(
        "the metrics server's address {addr} is taken (by your own metrics server?): give the \
         watchdog another with --metrics-bind-address (Builder::metrics_address), or turn its \
         server off with --metrics-bind-address=0 and serve its series from your own /metrics \
         (Metrics::encode, or Metrics::register with prometheus-client 0.26)"
    )]
    MetricsAddressTaken {
        /// The address.
        addr: SocketAddr,
        /// The bind's error.
        #[source]
        source: std::io::Error,
    },
    /// The debug server did not start.
    #[error("failed to start the debug server")]
    Debug(#[source] probes::Error),
}

/// Configures and starts a [`Watchdog`].
#[derive(Debug, Clone)]
pub struct Builder {
    deadlines: Deadlines,
    monitor: monitor::Config,
    probe_address: Option<SocketAddr>,
    #[cfg(feature = "metrics")]
    metrics_address: Option<SocketAddr>,
    #[cfg(feature = "metrics")]
    collect_metrics: bool,
    runtime: Option<tokio::runtime::Handle>,
    diagnostics: monitor::Diagnostics,
    api_server: Option<Arc<dyn ApiServerReachability>>,
    watches: Option<Arc<dyn WatchAges>>,
    hang_reports: Option<Arc<dyn HangReports>>,
    debug_address: Option<SocketAddr>,
    reasons_to_all_peers: bool,
    near_miss_share: Option<f64>,
    quarantine: Option<Arc<Keeper>>,
    termination_message: Option<Destination>,
}

impl Builder {
    /// Deadlines per controller (default 5 minutes).
    #[must_use]
    pub fn deadlines(mut self, deadlines: impl Into<Deadlines>) -> Self {
        self.deadlines = deadlines.into();
        self
    }

    /// How often the monitor scans (default 1 second).
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.monitor.interval = interval;
        self
    }

    /// What to do about an overdue reconcile (default [`HangPolicy::Restart`]).
    #[must_use]
    pub fn on_hang(mut self, policy: HangPolicy) -> Self {
        self.monitor.policy = policy;
        self
    }

    /// Heartbeat age of the watched runtime that fails liveness (default 10 seconds).
    #[must_use]
    pub fn runtime_stall_threshold(mut self, threshold: Duration) -> Self {
        self.monitor.runtime_stall_threshold = threshold;
        self
    }

    /// Under `cancel`: how many cancellations of one object within `window` fail
    /// liveness (default 3 within 10 minutes).
    #[must_use]
    pub fn cancel_limit(mut self, limit: u32, window: Duration) -> Self {
        self.monitor.cancel_limit = limit;
        self.monitor.cancel_window = window;
        self
    }

    /// Serves the probes on `addr` (by default no probe server is started).
    #[must_use]
    pub fn probe_address(mut self, addr: SocketAddr) -> Self {
        self.probe_address = Some(addr);
        self
    }

    /// Serves Prometheus `/metrics` on `addr`; `None` (the default) serves none, and
    /// collects no metrics unless [`collect_metrics`](Self::collect_metrics) asks.
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn metrics_address(mut self, addr: impl Into<Option<SocketAddr>>) -> Self {
        self.metrics_address = addr.into();
        self
    }

    /// Collects the metrics even without a metrics address, for an operator that serves
    /// its own prometheus-client registry: register them into it with
    /// [`Metrics::register`] (from [`Watchdog::metrics`]).
    ///
    /// ```
    /// let mut registry = prometheus_client::registry::Registry::default();
    /// let watchdog = reconcile_watchdog::Watchdog::builder().collect_metrics().start()?;
    /// watchdog.metrics().expect("collected").register(&mut registry);
    /// let mut text = String::new();
    /// prometheus_client::encoding::text::encode(&mut text, &registry)?;
    /// assert!(text.contains("reconcile_watchdog_scan_duration_seconds_count"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn collect_metrics(mut self) -> Self {
        self.collect_metrics = true;
        self
    }

    /// Serves the debug views (`/debug/reconciles`) on `addr`; `None` (the default)
    /// serves none. Keep it on loopback: the views name objects.
    #[must_use]
    pub fn debug_address(mut self, addr: impl Into<Option<SocketAddr>>) -> Self {
        self.debug_address = addr.into();
        self
    }

    /// Probe failure reasons go to every peer, not only to loopback peers (by default
    /// others read `reason withheld`, and the log has the reason).
    #[must_use]
    pub fn failure_reasons_to_all_peers(mut self, yes: bool) -> Self {
        self.reasons_to_all_peers = yes;
        self
    }

    /// Watches the heartbeat of the runtime behind `handle` (the `runtime` check).
    #[must_use]
    pub fn watch_runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// With [`watch_runtime`](Self::watch_runtime) on a multi-thread runtime: once a
    /// worker has sat in one poll for `after` while another is idle, the monitor wakes
    /// an idle one, which takes over tokio's timers and I/O that the blocked worker left
    /// to nobody (default 20 ms; `None` never wakes one).
    #[must_use]
    pub fn driver_rescue_after(mut self, after: Option<Duration>) -> Self {
        self.monitor.driver_rescue_after = after;
        self
    }

    /// A report of a reconcile stuck inside one poll for at least `after` carries its
    /// thread's native stack and kernel state (default 2 seconds; `None` never looks).
    #[must_use]
    pub fn stack_capture_after(mut self, after: Option<Duration>) -> Self {
        self.diagnostics.stack_capture_after = after;
        self
    }

    /// Per-reconcile report lines (hung, still hung, ended): `burst` in one scan at
    /// most, `per_minute` across scans once the burst is spent; the rest are counted in
    /// one summary per kind (default 10 and 6).
    #[must_use]
    pub fn report_budget(mut self, burst: u32, per_minute: u32) -> Self {
        self.monitor.report_burst = burst;
        self.monitor.reports_per_minute = per_minute;
        self
    }

    /// Plugs in a check of whether the API server answers at all (the kube
    /// integration's `kube::ApiServerCheck`): while it finds the server silent, the
    /// `api-server` readiness check fails and overdue awaits hold liveness instead of
    /// failing it (an outage is not cured by a restart). Without one, every overdue
    /// reconcile is judged alone.
    #[must_use]
    pub fn api_server(mut self, check: Arc<dyn ApiServerReachability>) -> Self {
        self.api_server = Some(check);
        self
    }

    /// Plugs in the ages of the controllers' watches (the kube integration's
    /// `kube::watches::Watches`): a silent one fails the `watches` readiness check, and
    /// the metrics show each one's age.
    #[must_use]
    pub fn watches(mut self, watches: impl WatchAges) -> Self {
        self.watches = Some(Arc::new(watches));
        self
    }

    /// Plugs in where the hang report's per-reconcile lines go besides the log (the
    /// kube integration's `kube::events::HangEvents`: Events on the hung objects). It
    /// gets the lines the log gets, within the same budget
    /// ([`report_budget`](Self::report_budget)), on the monitor thread. Without one
    /// (the default), the log alone has them.
    #[must_use]
    pub fn hang_reports(mut self, reports: Arc<dyn HangReports>) -> Self {
        self.hang_reports = Some(reports);
        self
    }

    /// Records the objects whose hung reconciles fail liveness into `keeper`, which
    /// quarantines those that keep doing it ([`crate::quarantine`]); the kube
    /// integration's `Controllers` made from this watchdog then ask it before each
    /// reconcile. Without one (the default), nothing is recorded or quarantined.
    #[must_use]
    pub fn quarantine(mut self, keeper: Arc<Keeper>) -> Self {
        self.quarantine = Some(keeper);
        self
    }

    /// A reconcile that ends on time after more than `share` (between 0 and 1) of its
    /// deadline is a near miss: logged (rate-limited) and counted (default 0.8; `None`
    /// turns near misses off).
    #[must_use]
    pub fn near_miss_threshold(mut self, share: Option<f64>) -> Self {
        self.near_miss_share = share;
        self
    }

    /// When the watchdog is dropped (the process exits: after SIGTERM, SIGINT or its
    /// own end) while liveness fails because of hung reconciles, an escalation or a
    /// runtime stall, writes why to `path`, at most 4096 bytes in one write: the hung
    /// reconciles, the longest-running first, each with where it is stuck. Give the
    /// container's `terminationMessagePath` (Kubernetes' default is
    /// `/dev/termination-log`) and `kubectl describe pod` shows it as the last state's
    /// message. The file is created if need be; one that cannot be written is skipped
    /// with one log line. `None` (the default) writes none; nothing is written after a
    /// clean shutdown.
    #[must_use]
    pub fn termination_message_path(mut self, path: impl Into<Option<PathBuf>>) -> Self {
        self.termination_message = path.into().map(Destination::Path);
        self
    }

    /// Like [`termination_message_path`](Self::termination_message_path), but only if
    /// `path` exists when the watchdog starts (the kubelet creates Kubernetes' default).
    #[cfg(feature = "clap")]
    pub(crate) fn termination_message_path_if_exists(mut self, path: PathBuf) -> Self {
        self.termination_message = Some(Destination::IfExists(path));
        self
    }

    /// Starts the monitor thread and, if asked, the probe server.
    pub fn start(self) -> Result<Watchdog, Error> {
        let health = Arc::new(Health::new());
        let api_server = self.api_server.as_ref().map(|check| {
            let status = check.status();
            let check = Arc::clone(&status);
            health.readiness.add(Arc::new(FnCheck::new(
                monitor::api_server::CHECK,
                move || check.check(Instant::now()),
            )));
            status
        });
        #[cfg(feature = "metrics")]
        let metrics = (self.metrics_address.is_some() || self.collect_metrics).then(|| {
            let status = api_server.clone().unwrap_or_default();
            Metrics::with_api_server(Arc::clone(&health), status)
        });
        let advisor = Advisor::new();
        #[allow(unused_mut)]
        let mut observers = Fanout::new().with(advisor.clone());
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &metrics {
            observers = observers.with(metrics.clone());
        }
        let deadlines = self.deadlines.near_miss_share(self.near_miss_share);
        let registry = Registry::with_observers(deadlines, observers);
        let heartbeat = self.runtime.as_ref().map(|handle| {
            RuntimeHeartbeat::spawn(
                handle,
                heartbeat_period(self.monitor.interval).max(MIN_HEARTBEAT_PERIOD),
            )
        });
        let mut scan_observers: Vec<Arc<dyn monitor::Observer>> = Vec::new();
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &metrics {
            scan_observers.push(metrics.clone());
            if let Some(reports) = &self.hang_reports {
                metrics.serve_events_dropped(Arc::clone(reports));
            }
        }
        if let Some(reports) = &self.hang_reports {
            scan_observers.push(Arc::new(ReportsObserver::new(Arc::clone(reports))));
        }
        if let Some(keeper) = &self.quarantine {
            #[cfg(feature = "metrics")]
            if let Some(metrics) = &metrics {
                keeper.attach_metrics(Arc::clone(metrics));
            }
            scan_observers.push(keeper.clone());
        }
        let scan_observer: Option<Arc<dyn monitor::Observer>> = match scan_observers.len() {
            0 => None,
            1 => scan_observers.pop(),
            _ => Some(Arc::new(ScanObservers(scan_observers))),
        };
        let mut monitor_config = self.monitor;
        if let Some(check) = &self.api_server {
            monitor_config.api_server_confirm_within =
                check.answer_within() + 2 * monitor_config.interval;
        }
        let monitor = Monitor::spawn_watching_api_server(
            registry.clone(),
            &health,
            monitor_config,
            self.diagnostics,
            heartbeat,
            api_server,
            scan_observer,
        )
        .map_err(Error::Monitor)?;
        let probes = self
            .probe_address
            .map(|addr| {
                let probes = Probes::new(Arc::clone(&health))
                    .reasons_to_all_peers(self.reasons_to_all_peers);
                HttpServer::spawn("probe-server", addr, probes.routes())
            })
            .transpose()
            .map_err(Error::Probes)?;
        #[cfg(feature = "metrics")]
        let metrics_server = match (&metrics, self.metrics_address) {
            (Some(metrics), Some(addr)) => {
                let metrics = Arc::clone(metrics);
                let routes = crate::metrics::routes(move || metrics.encode());
                let server =
                    HttpServer::spawn("metrics-server", addr, routes).map_err(|e| match e {
                        probes::Error::Bind { addr, source }
                            if source.kind() == std::io::ErrorKind::AddrInUse =>
                        {
                            Error::MetricsAddressTaken { addr, source }
                        }
                        other => Error::Metrics(other),
                    })?;
                Some(server)
            }
            _ => None,
        };
        let debug_server = self
            .debug_address
            .map(|addr| {
                let mut views =
                    DebugViews::new(registry.clone()).with_advisor(Arc::clone(&advisor));
                if let Some(keeper) = &self.quarantine {
                    views = views.with_quarantine(Arc::clone(keeper));
                }
                HttpServer::spawn("debug-server", addr, views.routes())
            })
            .transpose()
            .map_err(Error::Debug)?;
        if let Some(watches) = &self.watches {
            watches.attach(&health);
            #[cfg(feature = "metrics")]
            if let Some(metrics) = &metrics {
                metrics.serve_watch_ages(Arc::clone(watches));
            }
        }
        let termination_message = self.termination_message.and_then(Destination::check);
        Ok(Watchdog {
            termination_message,
            _api_server: self.api_server,
            _watches: self.watches,
            _hang_reports: self.hang_reports,
            quarantine: self.quarantine,
            registry,
            health,
            monitor,
            probes,
            #[cfg(feature = "metrics")]
            metrics,
            #[cfg(feature = "metrics")]
            metrics_server,
            debug_server,
        })
    }
}

/// A running watchdog. Dropping it stops the monitor and the probe server.
#[derive(Debug)]
pub struct Watchdog {
    /// Where the cause of a liveness failure is written as the process exits.
    termination_message: Option<PathBuf>,
    /// What was plugged in lives as long as the watchdog: the API server check's thread
    /// stops when its last owner drops it.
    _api_server: Option<Arc<dyn ApiServerReachability>>,
    _watches: Option<Arc<dyn WatchAges>>,
    _hang_reports: Option<Arc<dyn HangReports>>,
    quarantine: Option<Arc<Keeper>>,
    registry: Registry,
    health: Arc<Health>,
    /// Its drop stops the monitor thread.
    monitor: Monitor,
    probes: Option<HttpServer>,
    #[cfg(feature = "metrics")]
    metrics: Option<Arc<Metrics>>,
    #[cfg(feature = "metrics")]
    metrics_server: Option<HttpServer>,
    debug_server: Option<HttpServer>,
}

impl Watchdog {
    /// A builder that starts the monitor thread alone: no probe, metrics or debug
    /// server, no runtime heartbeat, API server check, watch ages or Events unless you
    /// ask for them. Its deadline (5 minutes), interval (1 second), policy (restart),
    /// thresholds and report budget are the defaults of the flags (`WatchdogArgs`,
    /// feature `clap`, makes a builder from the flags, the addresses included).
    #[must_use]
    pub fn builder() -> Builder {
        Builder {
            deadlines: Deadlines::new(Duration::from_secs(300)),
            monitor: monitor::Config::default(),
            probe_address: None,
            #[cfg(feature = "metrics")]
            metrics_address: None,
            #[cfg(feature = "metrics")]
            collect_metrics: false,
            runtime: None,
            diagnostics: monitor::Diagnostics::default(),
            api_server: None,
            watches: None,
            hang_reports: None,
            debug_address: None,
            reasons_to_all_peers: false,
            near_miss_share: Some(crate::guard::NEAR_MISS_SHARE),
            quarantine: None,
            termination_message: None,
        }
    }

    /// The registry to guard reconciles with.
    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The liveness and readiness sets, to add checks and latches to.
    #[must_use]
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The quarantine it records liveness failures into, if it was given one.
    #[must_use]
    pub fn quarantine(&self) -> Option<&Arc<Keeper>> {
        self.quarantine.as_ref()
    }

    /// Where the probe server listens, if one was started.
    #[must_use]
    pub fn probe_address(&self) -> Option<SocketAddr> {
        self.probes.as_ref().map(HttpServer::local_addr)
    }

    /// The metrics, when a metrics address was given or
    /// [`collect_metrics`](Builder::collect_metrics) asked for them: register them into
    /// your own registry with [`Metrics::register`].
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_deref()
    }

    /// The metrics, shared (leader election keeps them).
    #[cfg(feature = "_kube")]
    pub(crate) fn shared_metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref()
    }

    /// Where `/metrics` is served, if it is.
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_server.as_ref().map(HttpServer::local_addr)
    }

    /// Where the debug views are served, if they are.
    #[must_use]
    pub fn debug_address(&self) -> Option<SocketAddr> {
        self.debug_server.as_ref().map(HttpServer::local_addr)
    }
}

impl Watchdog {
    /// Why liveness fails, as the latest scan found it; `None` while it passes.
    pub(crate) fn liveness_cause(&self) -> Option<Arc<restart::Cause>> {
        self.monitor.status().cause()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Read before the monitor stops: the latest scan says whether liveness fails.
        if let Some(path) = &self.termination_message
            && let Some(cause) = self.liveness_cause()
        {
            restart::write(
                path,
                cause.text(restart::MESSAGE_BYTES),
                restart::WRITE_PATIENCE,
            );
        }
    }
}

/// Every scan observer the builder set up, told in turn.
struct ScanObservers(Vec<Arc<dyn monitor::Observer>>);

impl monitor::Observer for ScanObservers {
    fn scanned(&self, scan: &monitor::Scan<'_>) {
        for observer in &self.0 {
            observer.scanned(scan);
        }
    }
}
