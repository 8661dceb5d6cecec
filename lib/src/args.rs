//! The watchdog's flags as a `clap::Args` struct, for your operator's own command line.
//!
//! Flatten [`WatchdogArgs`] into your command line (as kubert's `AdminArgs` and
//! `ClientArgs` are) and your operator takes the flags of this repository's `run`, with
//! the same names, defaults, environment variables and errors: a malformed value, or
//! values that cannot work together, exit with status 2 and a message naming the flag.
//! [`WatchdogArgs::builder`] turns them into a [`Builder`]. Feature `clap`.
//!
//! ```
//! use clap::Parser;
//!
//! /// My operator.
//! #[derive(Parser)]
//! struct Cli {
//!     /// Only this namespace
//!     #[arg(long)]
//!     namespace: Option<String>,
//!
//!     #[command(flatten)]
//!     watchdog: reconcile_watchdog::WatchdogArgs,
//! }
//!
//! let cli = Cli::parse_from([
//!     "my-operator",
//!     "--reconcile-deadline-for=configmaps=90s",
//!     "--health-probe-bind-address=127.0.0.1:0", // any free port, for this example
//!     "--metrics-bind-address=0",                // 0: off
//!     "--debug-bind-address=0",
//! ]);
//! let watchdog = cli.watchdog.builder().start()?;
//! let configmaps = watchdog.registry().controller("configmaps", "ConfigMap");
//! assert_eq!(configmaps.deadline(), std::time::Duration::from_secs(90));
//!
//! let error = Cli::try_parse_from(["my-operator", "--reconcile-deadline-for", "configmaps=soon"])
//!     .err()
//!     .expect("a malformed deadline is refused");
//! assert_eq!(error.exit_code(), 2);
//! assert!(error.to_string().contains("--reconcile-deadline-for"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Your own defaults for a flag go through clap: `Cli::command().mut_arg("reconcile_deadline",
//! |arg| arg.default_value("90s"))`, then `Cli::from_arg_matches` on its matches (the ids
//! are the flags' names with `_` for `-`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, FromArgMatches, ValueEnum};

use crate::guard::Deadlines;
use crate::monitor::HangPolicy;
use crate::quarantine::{Keeper, Quarantine};

use crate::restart;
use crate::watchdog::{Builder, MIN_HEARTBEAT_PERIOD, Watchdog, heartbeat_period};

/// The watchdog's flags; see the [module](self). Each flag is also read from the
/// environment variable `RECONCILE_WATCHDOG_<FLAG>` that `--help` names beside it.
#[derive(Debug, Clone)]
pub struct WatchdogArgs(Flags);

/// The flags as clap derives them; [`WatchdogArgs`] checks them together after parsing.
#[derive(clap::Args, Debug, Clone)]
#[group(id = "reconcile-watchdog")]
struct Flags {
    /// Probe server address (host:port, or Go-style :port)
    #[arg(long, env = "RECONCILE_WATCHDOG_HEALTH_PROBE_BIND_ADDRESS", value_name = "ADDR", default_value = "0.0.0.0:8081", value_parser = bind_address)]
    health_probe_bind_address: SocketAddr,

    /// Prometheus /metrics address (host:port, or :port); 0 disables
    #[cfg(feature = "metrics")]
    #[arg(long, env = "RECONCILE_WATCHDOG_METRICS_BIND_ADDRESS", value_name = "ADDR", default_value = "0.0.0.0:8080", value_parser = address_or_off)]
    metrics_bind_address: OrOff<SocketAddr>,

    /// Default deadline of one reconcile
    #[arg(long, env = "RECONCILE_WATCHDOG_RECONCILE_DEADLINE", value_name = "DURATION", default_value = "5m", value_parser = positive_duration)]
    reconcile_deadline: Duration,

    /// Deadline for one controller, as NAME=DURATION; repeatable
    #[arg(long, env = "RECONCILE_WATCHDOG_RECONCILE_DEADLINE_FOR", value_name = "NAME=DURATION", value_delimiter = ',', value_parser = deadline_override)]
    reconcile_deadline_for: Vec<(String, Duration)>,

    /// How often the watchdog scans in-flight reconciles
    #[arg(long, env = "RECONCILE_WATCHDOG_WATCHDOG_INTERVAL", value_name = "DURATION", default_value = "1s", value_parser = positive_duration)]
    watchdog_interval: Duration,

    /// On a hung reconcile: restart (fail liveness), cancel (cancel and requeue, escalate if that fails), report (log only)
    #[arg(long, env = "RECONCILE_WATCHDOG_ON_HANG", value_name = "POLICY", value_enum, default_value_t = OnHang::Restart)]
    on_hang: OnHang,

    /// Under --on-hang cancel: cancellations of one object, within --cancel-escalation-window, that fail liveness
    #[arg(long, env = "RECONCILE_WATCHDOG_CANCEL_ESCALATION_COUNT", value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    cancel_escalation_count: u32,

    /// The window --cancel-escalation-count counts in
    #[arg(long, env = "RECONCILE_WATCHDOG_CANCEL_ESCALATION_WINDOW", value_name = "DURATION", default_value = "10m", value_parser = positive_duration)]
    cancel_escalation_window: Duration,

    /// Async runtime heartbeat age that fails liveness
    #[arg(long, env = "RECONCILE_WATCHDOG_RUNTIME_STALL_THRESHOLD", value_name = "DURATION", default_value = "10s", value_parser = positive_duration)]
    runtime_stall_threshold: Duration,

    /// A runtime worker inside one poll this long, with another idle, gets an idle one woken to drive the timers and I/O it left; a WARN names the reconcile when a guarded one holds the worker; off disables
    #[arg(long, env = "RECONCILE_WATCHDOG_DRIVER_RESCUE_AFTER", value_name = "DURATION", default_value = "20ms", value_parser = positive_duration_or_off)]
    driver_rescue_after: OrOff<Duration>,

    /// Hang reports of a reconcile stuck inside one poll this long carry its thread's native stack and kernel state; off disables
    #[arg(long, env = "RECONCILE_WATCHDOG_STACK_CAPTURE_AFTER", value_name = "DURATION", default_value = "2s", value_parser = duration_or_off)]
    stack_capture_after: OrOff<Duration>,

    /// Per-reconcile hang report lines (hung, still hung, ended) one scan may write; beyond it, one summary per scan with counts
    #[arg(long, env = "RECONCILE_WATCHDOG_HANG_REPORT_BURST", value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    hang_report_burst: u32,

    /// Per-reconcile hang report lines per minute across scans, once the burst is spent
    #[arg(long, env = "RECONCILE_WATCHDOG_HANG_REPORTS_PER_MINUTE", value_name = "N", default_value_t = 6, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    hang_reports_per_minute: u32,

    /// How often to ask whether the API server answers at all (an overdue await during an outage does not fail liveness); off disables
    #[cfg(feature = "_kube")]
    #[arg(long, env = "RECONCILE_WATCHDOG_API_SERVER_CHECK_INTERVAL", value_name = "DURATION", default_value = "5s", value_parser = duration_or_off)]
    api_server_check_interval: OrOff<Duration>,

    /// A watch that shows no sign of life (event, bookmark, list) for this long fails readiness, check watches; off disables
    #[cfg(feature = "_kube")]
    #[arg(long, env = "RECONCILE_WATCHDOG_WATCH_STALL_THRESHOLD", value_name = "DURATION", default_value = "3m", value_parser = positive_duration_or_off)]
    watch_stall_threshold: OrOff<Duration>,

    /// Debug views address (/debug/reconciles; host:port, or :port); keep it on loopback and reach it with kubectl port-forward; 0 disables
    #[arg(long, env = "RECONCILE_WATCHDOG_DEBUG_BIND_ADDRESS", value_name = "ADDR", default_value = "127.0.0.1:8082", value_parser = address_or_off)]
    debug_bind_address: OrOff<SocketAddr>,

    /// Show probe failure reasons to every peer; by default only loopback peers read them and others read "reason withheld"
    #[arg(long, env = "RECONCILE_WATCHDOG_SHOW_FAILURE_REASONS_TO_ALL_PEERS")]
    show_failure_reasons_to_all_peers: bool,

    /// A reconcile that ends on time after more than this share of its deadline is a near miss: one WARN (at most one a minute per controller) and a count; off disables
    #[arg(long, env = "RECONCILE_WATCHDOG_NEAR_MISS_THRESHOLD", value_name = "PERCENT", default_value = "80%", value_parser = near_miss_threshold)]
    near_miss_threshold: OrOff<f64>,

    // The quarantine of objects whose hangs keep failing liveness (one block).
    /// An object whose hung reconciles failed liveness this many times within --quarantine-for is not reconciled for --quarantine-for from the latest; 0 disables
    #[arg(
        long,
        env = "RECONCILE_WATCHDOG_QUARANTINE_AFTER",
        value_name = "N",
        default_value_t = 2
    )]
    quarantine_after: u32,

    /// The window --quarantine-after counts in, and how long a quarantine lasts
    #[arg(long, env = "RECONCILE_WATCHDOG_QUARANTINE_FOR", value_name = "DURATION", default_value = "1h", value_parser = positive_duration)]
    quarantine_for: Duration,

    /// The ConfigMap that records those liveness failures across restarts, in --quarantine-namespace
    #[cfg(feature = "_kube")]
    #[arg(
        long,
        env = "RECONCILE_WATCHDOG_QUARANTINE_CONFIGMAP",
        value_name = "NAME",
        default_value = "reconcile-watchdog-quarantine"
    )]
    quarantine_configmap: String,

    /// The namespace of --quarantine-configmap; unset, POD_NAMESPACE, else the service account's (outside a cluster without either, they are remembered within the process only)
    #[cfg(feature = "_kube")]
    #[arg(
        long,
        env = "RECONCILE_WATCHDOG_QUARANTINE_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    quarantine_namespace: Option<String>,

    // What a restart leaves for the on-call engineer.
    /// On exit while liveness fails, why (the hung reconciles and where they are stuck) is written here, at most 4096 bytes, for the container's last state; the default is used only where it exists (in Kubernetes); off disables
    #[arg(long, env = "RECONCILE_WATCHDOG_TERMINATION_MESSAGE_PATH", value_name = "PATH", default_value = restart::KUBERNETES_PATH, value_parser = path_or_off)]
    termination_message_path: OrOff<PathBuf>,

    /// Whether `termination_message_path` is clap's default, not given.
    #[arg(skip)]
    termination_message_path_is_default: bool,
}

/// The value of a flag that `off` (or `0`, for an address) turns off. Not an `Option`:
/// clap would take the parser of an `Option<T>` field to parse a `T`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum OrOff<T> {
    On(T),
    Off,
}

impl<T> OrOff<T> {
    fn on(self) -> Option<T> {
        match self {
            Self::On(value) => Some(value),
            Self::Off => None,
        }
    }
}

impl WatchdogArgs {
    /// The watchdog builder these flags describe: deadlines, interval, policy,
    /// thresholds, report budget and the probe, metrics and debug addresses. Add what
    /// only your code knows (`watch_runtime`, the kube integration's plugs), then
    /// [`start`](Builder::start) it.
    #[must_use]
    pub fn builder(&self) -> Builder {
        let flags = &self.0;
        let deadlines = flags.reconcile_deadline_for.iter().fold(
            Deadlines::new(flags.reconcile_deadline),
            |d, (name, dur)| d.with(name.clone(), *dur),
        );
        let builder = Watchdog::builder()
            .deadlines(deadlines)
            .interval(flags.watchdog_interval)
            .on_hang(flags.on_hang.into())
            .cancel_limit(
                flags.cancel_escalation_count,
                flags.cancel_escalation_window,
            )
            .runtime_stall_threshold(flags.runtime_stall_threshold)
            .driver_rescue_after(flags.driver_rescue_after.on())
            .probe_address(flags.health_probe_bind_address)
            .debug_address(flags.debug_bind_address.on())
            .failure_reasons_to_all_peers(flags.show_failure_reasons_to_all_peers)
            .stack_capture_after(flags.stack_capture_after.on())
            .report_budget(flags.hang_report_burst, flags.hang_reports_per_minute)
            .near_miss_threshold(flags.near_miss_threshold.on());
        let builder = match flags.termination_message_path.clone() {
            OrOff::On(path) if flags.termination_message_path_is_default => {
                builder.termination_message_path_if_exists(path)
            }
            path => builder.termination_message_path(path.on()),
        };
        #[cfg(feature = "metrics")]
        let builder = builder.metrics_address(flags.metrics_bind_address.on());
        match self.quarantine() {
            Some(quarantine) => builder.quarantine(Keeper::new(quarantine)),
            None => builder,
        }
    }

    /// `--quarantine-after` and `--quarantine-for` (`None`: off). The
    /// [`builder`](Self::builder) plugs in a [`Keeper`] of it; start that with its
    /// store (`watchdog.quarantine()`).
    #[must_use]
    pub fn quarantine(&self) -> Option<Quarantine> {
        let quarantine = Quarantine::new(self.0.quarantine_after, self.0.quarantine_for);
        quarantine.is_on().then_some(quarantine)
    }

    /// Where the quarantine's ledger is kept: `(namespace, name)` of
    /// `--quarantine-namespace` (or the operator's own namespace) and
    /// `--quarantine-configmap`; `None` when no namespace is known.
    #[cfg(feature = "_kube")]
    #[must_use]
    pub fn quarantine_configmap(&self) -> Option<(String, String)> {
        let namespace = self
            .0
            .quarantine_namespace
            .clone()
            .filter(|ns| !ns.trim().is_empty())
            .or_else(crate::kube::quarantine::own_namespace)?;
        Some((namespace, self.0.quarantine_configmap.clone()))
    }

    /// `--api-server-check-interval`: how often the kube integration's
    /// [`ApiServerCheck`](crate::kube::ApiServerCheck) should ask (`None`: off).
    #[cfg(feature = "_kube")]
    #[must_use]
    pub fn api_server_check_interval(&self) -> Option<Duration> {
        self.0.api_server_check_interval.on()
    }

    /// `--watch-stall-threshold`, for the kube integration's
    /// [`Watches::new`](crate::kube::watches::Watches::new) (`None`: off).
    #[cfg(feature = "_kube")]
    #[must_use]
    pub fn watch_stall_threshold(&self) -> Option<Duration> {
        self.0.watch_stall_threshold.on()
    }
}

impl clap::Args for WatchdogArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        Flags::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Flags::augment_args_for_update(cmd)
    }

    fn group_id() -> Option<clap::Id> {
        Flags::group_id()
    }
}

impl FromArgMatches for WatchdogArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = Flags::from_arg_matches(matches)?;
        flags.sources(matches);
        flags.check().map_err(conflict)?;
        Ok(Self(flags))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        let mut flags = self.0.clone();
        flags.update_from_arg_matches(matches)?;
        flags.sources(matches);
        flags.check().map_err(conflict)?;
        self.0 = flags;
        Ok(())
    }
}

/// Flags that cannot work together, as clap reports a conflict: exit status 2, with
/// the usage when clap formats it against the command.
fn conflict(message: String) -> clap::Error {
    clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, message)
}

impl Flags {
    /// Notes which flags were left at their defaults, where that changes their meaning.
    fn sources(&mut self, matches: &ArgMatches) {
        self.termination_message_path_is_default =
            matches.value_source("termination_message_path") == Some(ValueSource::DefaultValue);
    }

    /// Refuses flags that cannot work together, naming both: the runtime's heartbeat
    /// beats every half interval, so a stall threshold must be above that period, and
    /// the period must not round to nothing; and an interval above half the smallest
    /// deadline would find a hang late by more than half that deadline.
    fn check(&self) -> Result<(), String> {
        let interval = self.watchdog_interval;
        let threshold = self.runtime_stall_threshold;
        let period = heartbeat_period(interval);
        if period < MIN_HEARTBEAT_PERIOD {
            return Err(format!(
                "--watchdog-interval {} is too short: the runtime's heartbeat beats every half interval, and {} is below the runtime timer's resolution of {}; use at least {}",
                fmt(interval),
                fmt(period),
                fmt(MIN_HEARTBEAT_PERIOD),
                fmt(MIN_HEARTBEAT_PERIOD * 2)
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
        let deadline = self.reconcile_deadline;
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
enum OnHang {
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

const DURATION_FORM: &str = "expected a duration such as 500ms, 90s, 5m or 1h30m";

/// Parses a humantime duration (`500ms`, `90s`, `1h30m`), with a message that shows
/// the form: a `value_parser` for your own duration flags.
pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e}; {DURATION_FORM}"))
}

/// Like [`duration`], refusing zero.
pub fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d.is_zero() {
        return Err(format!("must be greater than zero; {DURATION_FORM}"));
    }
    Ok(d)
}

/// A humantime duration, or `off`.
fn duration_or_off(s: &str) -> Result<OrOff<Duration>, String> {
    or_off(s, duration)
}

/// A duration greater than zero, or `off`.
fn positive_duration_or_off(s: &str) -> Result<OrOff<Duration>, String> {
    or_off(s, positive_duration)
}

fn or_off(s: &str, parse: fn(&str) -> Result<Duration, String>) -> Result<OrOff<Duration>, String> {
    if s.trim() == "off" {
        return Ok(OrOff::Off);
    }
    parse(s).map(OrOff::On).map_err(|e| format!("{e}, or off"))
}

/// A percentage strictly between 0 and 100 (`80%`, `92.5%`) as a share, or `off`.
fn near_miss_threshold(s: &str) -> Result<OrOff<f64>, String> {
    const FORM: &str =
        "expected a percentage of the deadline between 0% and 100%, such as 80%, or off";
    let s = s.trim();
    if s == "off" {
        return Ok(OrOff::Off);
    }
    let percent: f64 = s
        .strip_suffix('%')
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("{s:?}: {FORM}"))?;
    if !(percent > 0.0 && percent < 100.0) {
        return Err(format!("{s:?} is out of range: {FORM}"));
    }
    Ok(OrOff::On(percent / 100.0))
}

/// A path, or `off`.
fn path_or_off(s: &str) -> Result<OrOff<PathBuf>, String> {
    match s.trim() {
        "off" => Ok(OrOff::Off),
        "" => Err("expected a path, or off".into()),
        _ => Ok(OrOff::On(PathBuf::from(s))),
    }
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

/// A bind address, or `0` to disable.
fn address_or_off(s: &str) -> Result<OrOff<SocketAddr>, String> {
    if s.trim() == "0" {
        return Ok(OrOff::Off);
    }
    bind_address(s)
        .map(OrOff::On)
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
    use super::*;

    fn parse(flags: &[&str]) -> Result<WatchdogArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            watchdog: WatchdogArgs,
        }
        let mut argv = vec!["test"];
        argv.extend_from_slice(flags);
        <Cli as clap::Parser>::try_parse_from(argv).map(|cli| cli.watchdog)
    }

    fn refused(flags: &[&str]) -> String {
        let error = parse(flags).expect_err("refused");
        assert_eq!(error.exit_code(), 2, "{error}");
        error.to_string()
    }

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
        assert_eq!(address_or_off("0"), Ok(OrOff::Off));
        assert_eq!(
            address_or_off("0.0.0.0:0"),
            Ok(OrOff::On("0.0.0.0:0".parse().unwrap()))
        );
        assert!(
            address_or_off("nope")
                .unwrap_err()
                .contains("or 0 to disable")
        );
    }

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
        assert_eq!(duration_or_off("off"), Ok(OrOff::Off));
        assert_eq!(duration_or_off("2s"), Ok(OrOff::On(Duration::from_secs(2))));
        assert!(duration_or_off("never").unwrap_err().contains("or off"));
        assert!(positive_duration_or_off("0s").is_err());
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
    fn near_miss_thresholds() {
        assert_eq!(near_miss_threshold("off"), Ok(OrOff::Off));
        assert_eq!(near_miss_threshold("80%"), Ok(OrOff::On(0.8)));
        assert_eq!(near_miss_threshold(" 92.5% "), Ok(OrOff::On(0.925)));
        for bad in [
            "80", "0.8", "0%", "100%", "150%", "-5%", "NaN%", "inf%", "%", "",
        ] {
            let error = near_miss_threshold(bad).unwrap_err();
            assert!(error.contains("such as 80%, or off"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_defaults_are_those_of_a_real_operator() {
        let flags = parse(&[]).expect("no flag is required").0;
        assert_eq!(flags.reconcile_deadline, Duration::from_secs(300));
        assert_eq!(flags.watchdog_interval, Duration::from_secs(1));
        assert_eq!(flags.runtime_stall_threshold, Duration::from_secs(10));
        assert_eq!(
            flags.driver_rescue_after,
            OrOff::On(Duration::from_millis(20))
        );
        assert_eq!(flags.on_hang, OnHang::Restart);
        assert_eq!(flags.near_miss_threshold, OrOff::On(0.8));
        assert_eq!(
            flags.debug_bind_address,
            OrOff::On("127.0.0.1:8082".parse().unwrap())
        );
        let flags = parse(&[
            "--debug-bind-address=0",
            "--stack-capture-after=off",
            "--driver-rescue-after=off",
        ])
        .unwrap()
        .0;
        assert_eq!(flags.debug_bind_address, OrOff::Off);
        assert_eq!(flags.stack_capture_after, OrOff::Off);
        assert_eq!(flags.driver_rescue_after, OrOff::Off);
    }

    #[test]
    fn the_termination_message_path_is_kubernetes_default_only_where_it_exists() {
        let flags = parse(&[]).unwrap().0;
        assert_eq!(
            flags.termination_message_path,
            OrOff::On(PathBuf::from("/dev/termination-log"))
        );
        assert!(flags.termination_message_path_is_default);
        let flags = parse(&["--termination-message-path=/dev/termination-log"])
            .unwrap()
            .0;
        assert!(
            !flags.termination_message_path_is_default,
            "given, it is created"
        );
        let flags = parse(&["--termination-message-path", "off"]).unwrap().0;
        assert_eq!(flags.termination_message_path, OrOff::Off);
        let error = refused(&["--termination-message-path="]);
        assert!(error.contains("--termination-message-path"), "{error}");
    }

    #[test]
    fn a_malformed_value_exits_2_naming_its_flag() {
        let error = refused(&["--reconcile-deadline-for", "configmaps=soon"]);
        assert!(error.contains("--reconcile-deadline-for"), "{error}");
        let error = refused(&["--near-miss-threshold", "80"]);
        assert!(error.contains("--near-miss-threshold"), "{error}");
    }

    #[test]
    fn flags_that_cannot_work_together_exit_2_naming_both() {
        let error = refused(&[
            "--runtime-stall-threshold",
            "100ms",
            "--watchdog-interval",
            "500ms",
        ]);
        assert!(
            error.contains("--runtime-stall-threshold 100ms")
                && error.contains("--watchdog-interval 500ms")
                && error.contains("(250ms)"),
            "{error}"
        );
        let error = refused(&["--watchdog-interval", "1ns"]);
        assert!(
            error.contains("--watchdog-interval 1ns is too short"),
            "{error}"
        );
        assert!(
            parse(&[
                "--watchdog-interval",
                "2ms",
                "--runtime-stall-threshold",
                "3s"
            ])
            .is_ok()
        );

        let error = refused(&["--reconcile-deadline-for", "fast=1500ms"]);
        assert!(
            error.contains("--watchdog-interval 1s")
                && error.contains("--reconcile-deadline-for fast=1s 500ms")
                && error.contains("at most 750ms"),
            "{error}"
        );
        assert!(parse(&["--reconcile-deadline-for", "fast=2s"]).is_ok());
    }
}
