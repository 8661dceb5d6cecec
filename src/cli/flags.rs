//! The flags shared by `demo` and `run`, and the parsers behind them.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use reconcile_watchdog::guard::Deadlines;
use reconcile_watchdog::monitor::HangPolicy;

/// The watchdog's flags. Durations are humantime (`90s`, `5m`, `1h30m`); each flag is
/// also read from the environment variable named beside it in `--help`.
#[derive(Args, Debug, Clone)]
pub struct WatchdogArgs {
    /// Probe server address (host:port, or Go-style :port)
    #[arg(long, env = "RECONCILE_WATCHDOG_HEALTH_PROBE_BIND_ADDRESS", value_name = "ADDR", default_value = "0.0.0.0:8081", value_parser = bind_address)]
    pub health_probe_bind_address: SocketAddr,

    /// Prometheus /metrics address (host:port, or :port); 0 disables
    #[arg(long, env = "RECONCILE_WATCHDOG_METRICS_BIND_ADDRESS", value_name = "ADDR", default_value = "0.0.0.0:8080", value_parser = metrics_address)]
    pub metrics_bind_address: MetricsAddress,

    /// Default deadline of one reconcile [default: 5m; demo: 3s]
    #[arg(long, env = "RECONCILE_WATCHDOG_RECONCILE_DEADLINE", value_name = "DURATION", value_parser = positive_duration)]
    pub reconcile_deadline: Option<Duration>,

    /// Deadline for one controller, as NAME=DURATION; repeatable
    #[arg(long, env = "RECONCILE_WATCHDOG_RECONCILE_DEADLINE_FOR", value_name = "NAME=DURATION", value_delimiter = ',', value_parser = deadline_override)]
    pub reconcile_deadline_for: Vec<(String, Duration)>,

    /// How often the watchdog scans in-flight reconciles [default: 1s; demo: 500ms]
    #[arg(long, env = "RECONCILE_WATCHDOG_WATCHDOG_INTERVAL", value_name = "DURATION", value_parser = positive_duration)]
    pub watchdog_interval: Option<Duration>,

    /// On a hung reconcile: restart (fail liveness), cancel (cancel and requeue, escalate if that fails), report (log only)
    #[arg(long, env = "RECONCILE_WATCHDOG_ON_HANG", value_name = "POLICY", value_enum, default_value_t = OnHang::Restart)]
    pub on_hang: OnHang,

    /// Under --on-hang cancel: cancellations of one object, within --cancel-escalation-window, that fail liveness
    #[arg(long, env = "RECONCILE_WATCHDOG_CANCEL_ESCALATION_COUNT", value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub cancel_escalation_count: u32,

    /// The window --cancel-escalation-count counts in
    #[arg(long, env = "RECONCILE_WATCHDOG_CANCEL_ESCALATION_WINDOW", value_name = "DURATION", default_value = "10m", value_parser = positive_duration)]
    pub cancel_escalation_window: Duration,

    /// Async runtime heartbeat age that fails liveness [default: 10s; demo: 3s]
    #[arg(long, env = "RECONCILE_WATCHDOG_RUNTIME_STALL_THRESHOLD", value_name = "DURATION", value_parser = positive_duration)]
    pub runtime_stall_threshold: Option<Duration>,

    /// Hang reports of a reconcile stuck inside one poll this long carry its thread's native stack and kernel state; off disables
    #[arg(long, env = "RECONCILE_WATCHDOG_STACK_CAPTURE_AFTER", value_name = "DURATION", default_value = "2s", value_parser = duration_or_off)]
    pub stack_capture_after: StackCaptureAfter,

    /// Drain time for in-flight reconciles on SIGTERM
    #[arg(long, env = "RECONCILE_WATCHDOG_SHUTDOWN_GRACE", value_name = "DURATION", default_value = "30s", value_parser = duration)]
    pub shutdown_grace: Duration,

    /// Per-reconcile hang report lines (hung, still hung, ended) one scan may write; beyond it, one summary per scan with counts
    #[arg(long, env = "RECONCILE_WATCHDOG_HANG_REPORT_BURST", value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub hang_report_burst: u32,

    /// Per-reconcile hang report lines per minute across scans, once the burst is spent
    #[arg(long, env = "RECONCILE_WATCHDOG_HANG_REPORTS_PER_MINUTE", value_name = "N", default_value_t = 6, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub hang_reports_per_minute: u32,

    /// How often to ask whether the API server answers at all (run only; an overdue await during an outage does not fail liveness); off disables
    #[arg(long, env = "RECONCILE_WATCHDOG_API_SERVER_CHECK_INTERVAL", value_name = "DURATION", default_value = "5s", value_parser = duration_or_off)]
    pub api_server_check_interval: StackCaptureAfter,

    /// A watch that shows no sign of life (event, bookmark, list) for this long fails readiness, check watches (run only); off disables
    #[arg(long, env = "RECONCILE_WATCHDOG_WATCH_STALL_THRESHOLD", value_name = "DURATION", default_value = "3m", value_parser = positive_duration_or_off)]
    pub watch_stall_threshold: StackCaptureAfter,
    /// Debug views address (/debug/reconciles; host:port, or :port); keep it on loopback and reach it with kubectl port-forward; 0 disables
    #[arg(long, env = "RECONCILE_WATCHDOG_DEBUG_BIND_ADDRESS", value_name = "ADDR", default_value = "127.0.0.1:8082", value_parser = metrics_address)]
    pub debug_bind_address: DebugAddress,

    /// Show probe failure reasons to every peer; by default only loopback peers read them and others read "reason withheld"
    #[arg(long, env = "RECONCILE_WATCHDOG_SHOW_FAILURE_REASONS_TO_ALL_PEERS")]
    pub show_failure_reasons_to_all_peers: bool,

    /// A reconcile that ends on time after more than this share of its deadline is a near miss: one WARN (at most one a minute per controller) and a count; off disables
    #[arg(long, env = "RECONCILE_WATCHDOG_NEAR_MISS_THRESHOLD", value_name = "PERCENT", default_value = "80%", value_parser = near_miss_threshold)]
    pub near_miss_threshold: NearMissThreshold,

    /// Log format; the level comes from RUST_LOG (default info)
    #[arg(long, env = "RECONCILE_WATCHDOG_LOG_FORMAT", value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The defaults that differ between `run` and `demo`.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    /// `--reconcile-deadline`.
    pub reconcile_deadline: Duration,
    /// `--watchdog-interval`.
    pub watchdog_interval: Duration,
    /// `--runtime-stall-threshold`.
    pub runtime_stall_threshold: Duration,
}

impl Defaults {
    /// Those of `run`, for a real operator.
    pub const RUN: Self = Self {
        reconcile_deadline: Duration::from_secs(300),
        watchdog_interval: Duration::from_secs(1),
        runtime_stall_threshold: Duration::from_secs(10),
    };
    /// Those of `demo`, short so that a hang shows within seconds.
    pub const DEMO: Self = Self {
        reconcile_deadline: Duration::from_secs(3),
        watchdog_interval: Duration::from_millis(500),
        runtime_stall_threshold: Duration::from_secs(3),
    };
}

impl WatchdogArgs {
    /// The watchdog builder these flags describe.
    #[must_use]
    pub fn builder(&self, defaults: Defaults) -> reconcile_watchdog::Builder {
        let deadline = self
            .reconcile_deadline
            .unwrap_or(defaults.reconcile_deadline);
        let deadlines = self
            .reconcile_deadline_for
            .iter()
            .fold(Deadlines::new(deadline), |d, (name, dur)| {
                d.with(name.clone(), *dur)
            });
        reconcile_watchdog::Watchdog::builder()
            .deadlines(deadlines)
            .interval(self.watchdog_interval.unwrap_or(defaults.watchdog_interval))
            .on_hang(self.on_hang.into())
            .cancel_limit(self.cancel_escalation_count, self.cancel_escalation_window)
            .runtime_stall_threshold(
                self.runtime_stall_threshold
                    .unwrap_or(defaults.runtime_stall_threshold),
            )
            .probe_address(self.health_probe_bind_address)
            .metrics_address(self.metrics_bind_address.socket_addr())
            .debug_address(self.debug_bind_address.socket_addr())
            .failure_reasons_to_all_peers(self.show_failure_reasons_to_all_peers)
            .stack_capture_after(match self.stack_capture_after {
                StackCaptureAfter::After(after) => Some(after),
                StackCaptureAfter::Off => None,
            })
            .report_budget(self.hang_report_burst, self.hang_reports_per_minute)
            .near_miss_threshold(self.near_miss_threshold.share())
    }

    /// `--api-server-check-interval`: how often to ask whether the API server answers
    /// (`None`: never).
    #[must_use]
    pub fn api_server_check(&self) -> Option<Duration> {
        match self.api_server_check_interval {
            StackCaptureAfter::After(every) => Some(every),
            StackCaptureAfter::Off => None,
        }
    }

    /// `--watch-stall-threshold` (`None`: off).
    #[must_use]
    pub fn watch_stall(&self) -> Option<Duration> {
        match self.watch_stall_threshold {
            StackCaptureAfter::After(threshold) => Some(threshold),
            StackCaptureAfter::Off => None,
        }
    }

    /// Refuses flags that cannot work together, naming both (exit status 2 from the
    /// caller): the runtime's heartbeat beats every half interval, so a stall threshold
    /// must be above that period, and the period must not round to nothing; and an
    /// interval above half the smallest deadline would find a hang late by more than
    /// half that deadline.
    pub fn check(&self, defaults: Defaults) -> Result<(), String> {
        let interval = self.watchdog_interval.unwrap_or(defaults.watchdog_interval);
        let threshold = self
            .runtime_stall_threshold
            .unwrap_or(defaults.runtime_stall_threshold);
        let period = reconcile_watchdog::watchdog::heartbeat_period(interval);
        if period < reconcile_watchdog::watchdog::MIN_HEARTBEAT_PERIOD {
            return Err(format!(
                "--watchdog-interval {} is too short: the runtime's heartbeat beats every half interval, and {} is below the runtime timer's resolution of {}; use at least {}",
                fmt(interval),
                fmt(period),
                fmt(reconcile_watchdog::watchdog::MIN_HEARTBEAT_PERIOD),
                fmt(reconcile_watchdog::watchdog::MIN_HEARTBEAT_PERIOD * 2)
            ));
        }
        if threshold <= period {
            return Err(format!(
                "--runtime-stall-threshold {} must be above the runtime heartbeat's period, half of --watchdog-interval {} ({}): a heartbeat that beats on time would look stalled",
                fmt(threshold),
                fmt(interval),
                fmt(period)
            ));
        }
        let deadline = self
            .reconcile_deadline
            .unwrap_or(defaults.reconcile_deadline);
        let (name, smallest) = self
            .reconcile_deadline_for
            .iter()
            .map(|(name, d)| (format!("--reconcile-deadline-for {name}={}", fmt(*d)), *d))
            .chain(std::iter::once((
                format!("--reconcile-deadline {}", fmt(deadline)),
                deadline,
            )))
            .min_by_key(|(_, d)| *d)
            .unwrap_or_default();
        if interval > smallest / 2 {
            return Err(format!(
                "--watchdog-interval {} is above half the smallest deadline ({name}): a hang would be found up to {} after its deadline; use an interval of at most {}",
                fmt(interval),
                fmt(interval),
                fmt(smallest / 2)
            ));
        }
        Ok(())
    }
}

/// A flag's duration as given (exact: `1ns` stays `1ns`).
fn fmt(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// `--on-hang`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnHang {
    /// Fail liveness so the kubelet restarts the pod.
    Restart,
    /// Cancel the reconcile and requeue it; escalate to restart when that fails.
    Cancel,
    /// Log the hang report only.
    Report,
}

impl From<OnHang> for HangPolicy {
    fn from(value: OnHang) -> Self {
        match value {
            OnHang::Restart => Self::Restart,
            OnHang::Cancel => Self::Cancel,
            OnHang::Report => Self::Report,
        }
    }
}

/// `--log-format`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `--metrics-bind-address`: an address, or disabled by `0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsAddress {
    /// Serve /metrics here.
    Enabled(SocketAddr),
    /// No metrics server.
    Disabled,
}

impl MetricsAddress {
    /// The address to serve on, None when disabled.
    #[must_use]
    pub fn socket_addr(self) -> Option<SocketAddr> {
        match self {
            Self::Enabled(addr) => Some(addr),
            Self::Disabled => None,
        }
    }
}

/// `--debug-bind-address`: an address, or disabled by `0`, as the metrics address.
pub type DebugAddress = MetricsAddress;

const DURATION_FORM: &str = "expected a duration such as 500ms, 90s, 5m or 1h30m";

/// A humantime duration.
pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e}; {DURATION_FORM}"))
}

/// A humantime duration greater than zero.
pub fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d.is_zero() {
        return Err(format!("must be greater than zero; {DURATION_FORM}"));
    }
    Ok(d)
}

/// `--stack-capture-after`: a threshold, or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackCaptureAfter {
    /// Capture for a poll stuck this long.
    After(Duration),
    /// Never capture.
    Off,
}

/// A humantime duration, or `off`.
fn duration_or_off(s: &str) -> Result<StackCaptureAfter, String> {
    or_off(s, duration)
}

/// A duration greater than zero, or `off`.
fn positive_duration_or_off(s: &str) -> Result<StackCaptureAfter, String> {
    or_off(s, positive_duration)
}

fn or_off(
    s: &str,
    parse: fn(&str) -> Result<Duration, String>,
) -> Result<StackCaptureAfter, String> {
    if s.trim() == "off" {
        return Ok(StackCaptureAfter::Off);
    }
    parse(s)
        .map(StackCaptureAfter::After)
        .map_err(|e| format!("{e}, or off"))
}

/// `--near-miss-threshold`: a share of the deadline, or off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NearMissThreshold {
    /// Past this share (between 0 and 1, exclusive) of the deadline.
    Share(f64),
    /// No near misses.
    Off,
}

impl NearMissThreshold {
    /// The share, `None` when off.
    #[must_use]
    pub fn share(self) -> Option<f64> {
        match self {
            Self::Share(share) => Some(share),
            Self::Off => None,
        }
    }
}

/// A percentage strictly between 0 and 100 (`80%`, `92.5%`), or `off`.
fn near_miss_threshold(s: &str) -> Result<NearMissThreshold, String> {
    const FORM: &str =
        "expected a percentage of the deadline between 0% and 100%, such as 80%, or off";
    let s = s.trim();
    if s == "off" {
        return Ok(NearMissThreshold::Off);
    }
    let percent: f64 = s
        .strip_suffix('%')
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("{s:?}: {FORM}"))?;
    if !(percent > 0.0 && percent < 100.0) {
        return Err(format!("{s:?} is out of range: {FORM}"));
    }
    Ok(NearMissThreshold::Share(percent / 100.0))
}

/// A bind address: `host:port`, `[::]:port`, or Go's `:port` (all interfaces).
fn bind_address(s: &str) -> Result<SocketAddr, String> {
    let candidate = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_owned(),
    };
    candidate.parse().map_err(|_| {
        format!("invalid bind address {s:?}: expected host:port, [ipv6]:port or :port")
    })
}

fn metrics_address(s: &str) -> Result<MetricsAddress, String> {
    if s.trim() == "0" {
        return Ok(MetricsAddress::Disabled);
    }
    bind_address(s)
        .map(MetricsAddress::Enabled)
        .map_err(|e| format!("{e}, or 0 to disable"))
}

fn deadline_override(s: &str) -> Result<(String, Duration), String> {
    let (name, dur) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=DURATION, such as configmaps=90s, got {s:?}"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!(
            "the controller name is empty; expected NAME=DURATION, got {s:?}"
        ));
    }
    Ok((name.to_owned(), positive_duration(dur)?))
}

#[cfg(test)]
mod tests {

    #[test]
    fn bind_addresses() {
        assert_eq!(
            bind_address(":8081").unwrap(),
            "0.0.0.0:8081".parse().unwrap()
        );
        assert_eq!(
            bind_address("127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert_eq!(bind_address("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        for bad in ["", ":", "8081", "localhost:80", ":99999", "1.2.3.4"] {
            assert!(bind_address(bad).is_err(), "{bad}");
        }
    }

    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(
            positive_duration("0s")
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(
            duration("5 parsecs")
                .unwrap_err()
                .contains("expected a duration")
        );
    }

    #[test]
    fn overrides() {
        assert_eq!(
            deadline_override("web=90s"),
            Ok(("web".into(), Duration::from_secs(90)))
        );
        assert!(deadline_override("web").is_err());
        assert!(deadline_override("=90s").is_err());
        assert!(deadline_override("web=soon").is_err());
    }

    #[test]
    fn stack_capture_thresholds() {
        assert_eq!(duration_or_off("off"), Ok(StackCaptureAfter::Off));
        assert_eq!(
            duration_or_off("2s"),
            Ok(StackCaptureAfter::After(Duration::from_secs(2)))
        );
        assert!(duration_or_off("never").unwrap_err().contains("or off"));
    }

    #[test]
    fn metrics_addresses() {
        assert_eq!(metrics_address("0"), Ok(MetricsAddress::Disabled));
        assert_eq!(
            metrics_address(":8080"),
            Ok(MetricsAddress::Enabled("0.0.0.0:8080".parse().unwrap()))
        );
        assert!(
            metrics_address("nope")
                .unwrap_err()
                .contains("or 0 to disable")
        );
    }

    fn args(flags: &[&str]) -> WatchdogArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            watchdog: WatchdogArgs,
        }
        let mut argv = vec!["test"];
        argv.extend_from_slice(flags);
        <Cli as clap::Parser>::try_parse_from(argv)
            .expect("the flags parse")
            .watchdog
    }

    #[test]
    fn flags_that_cannot_work_together_are_refused_naming_both() {
        let demo = Defaults::DEMO;
        assert_eq!(args(&[]).check(demo), Ok(()));
        assert_eq!(args(&[]).check(Defaults::RUN), Ok(()));

        let err = args(&["--runtime-stall-threshold", "100ms"])
            .check(demo)
            .unwrap_err();
        assert!(
            err.contains("--runtime-stall-threshold 100ms")
                && err.contains("--watchdog-interval 500ms")
                && err.contains("(250ms)"),
            "{err}"
        );
        let err = args(&["--watchdog-interval", "1ns"])
            .check(demo)
            .unwrap_err();
        assert!(
            err.starts_with("--watchdog-interval 1ns is too short"),
            "{err}"
        );
        assert!(
            args(&[
                "--watchdog-interval",
                "2ms",
                "--runtime-stall-threshold",
                "3s"
            ])
            .check(demo)
            .is_ok()
        );

        let err = args(&["--reconcile-deadline-for", "fast=600ms"])
            .check(demo)
            .unwrap_err();
        assert!(
            err.contains("--watchdog-interval 500ms")
                && err.contains("--reconcile-deadline-for fast=600ms")
                && err.contains("at most 300ms"),
            "{err}"
        );
        assert!(
            args(&["--reconcile-deadline-for", "fast=1s"])
                .check(demo)
                .is_ok()
        );
    }

    #[test]
    fn near_miss_thresholds() {
        assert_eq!(near_miss_threshold("off"), Ok(NearMissThreshold::Off));
        assert_eq!(
            near_miss_threshold("80%"),
            Ok(NearMissThreshold::Share(0.8))
        );
        assert_eq!(
            near_miss_threshold(" 92.5% "),
            Ok(NearMissThreshold::Share(0.925))
        );
        for bad in [
            "80", "0.8", "0%", "100%", "150%", "-5%", "NaN%", "inf%", "%", "",
        ] {
            let error = near_miss_threshold(bad).unwrap_err();
            assert!(error.contains("such as 80%, or off"), "{bad}: {error}");
        }
    }
}
