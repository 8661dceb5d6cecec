//! The hang tests' rig: a capture of the hang reports, and a real monitor with short
//! intervals.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use reconcile_watchdog::guard::Registry;
use reconcile_watchdog::health::Health;
use reconcile_watchdog::internals::{Config, Diagnostics, Monitor, RuntimeHeartbeat, report};
use reconcile_watchdog::monitor::HangPolicy;

/// The scan period of every test monitor.
pub const INTERVAL: Duration = Duration::from_millis(50);
/// The deadline of every test reconcile.
pub const DEADLINE: Duration = Duration::from_millis(200);
/// How long any eventual outcome may take before a test fails: generous, for a busy
/// two-core machine.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub use crate::support::reports::Report;

/// Installs the capture of reports (shared with the other tests of this binary).
pub fn capture_reports() {
    crate::support::reports::capture();
}

/// The hang reports captured so far that `matches` selects.
pub fn reports(matches: impl Fn(&Report) -> bool) -> Vec<Report> {
    crate::support::reports::reports(|r| r.target == report::TARGET && matches(r))
}

/// The reports about `controller`.
pub fn reports_of(controller: &str) -> Vec<Report> {
    reports(|r| r.field("controller") == Some(controller))
}

/// Asserts that `stack` (a report's `stack` field) shows every one of `frames`; in a
/// build without stack capture, that it says why it has none instead.
pub fn assert_stack_shows(stack: Option<&str>, frames: &[&str]) {
    let stack = stack.expect("a stack field");
    if cfg!(all(feature = "stack-capture", target_os = "linux")) {
        for frame in frames {
            assert!(stack.contains(frame), "no {frame} in:\n{stack}");
        }
    } else {
        assert!(
            stack.starts_with("unavailable: stack capture is unavailable"),
            "{stack}"
        );
    }
}

/// How a stack unwound from a blocked thread's kernel registers ends: that thread was
/// not interrupted.
pub const NOT_INTERRUPTED: &str =
    "(unwound from the kernel's registers of the blocked thread; it was not interrupted)";

/// How a stack recorded by the signal ends: only a running thread is signalled.
pub const SIGNALLED_RUNNING: &str = "(recorded by a signal to the thread, which was running)";

/// Asserts that `stack` (a reminder's `stack` field) points to the first report of the
/// hang, which captured it: a stuck poll is captured once.
pub fn assert_captured_once(stack: Option<&str>) {
    let stack = stack.expect("a stack field");
    if cfg!(all(feature = "stack-capture", target_os = "linux")) {
        assert_eq!(
            stack,
            "unavailable: captured once per hang: see the first report of this hang"
        );
    } else {
        assert!(
            stack.starts_with("unavailable: stack capture is unavailable"),
            "{stack}"
        );
    }
}

/// Every report about `controller`, for a failure message.
pub fn dump(controller: &str) -> String {
    let mut out = String::new();
    for r in reports_of(controller) {
        let _ = writeln!(out, "{} {} {:?}", r.level, r.message, r.fields);
    }
    out
}

/// Waits until `condition` returns Some, failing with `what` after [`PATIENCE`].
pub fn eventually<T>(what: &str, condition: impl FnMut() -> Option<T>) -> T {
    crate::support::eventually(PATIENCE, what, condition)
}

/// The first report about `controller` that `matches`, once it is written.
pub fn report_of(controller: &str, what: &str, matches: impl Fn(&Report) -> bool) -> Report {
    eventually(what, || {
        reports_of(controller).into_iter().find(|r| matches(r))
    })
}

/// A real monitor over its own registry and health sets, scanning every [`INTERVAL`].
pub struct Rig {
    pub registry: Registry,
    pub health: Arc<Health>,
    pub monitor: Option<Monitor>,
}

impl Rig {
    pub fn new(policy: HangPolicy) -> Self {
        Self::with(
            Config {
                interval: INTERVAL,
                policy,
                ..Config::default()
            },
            DEADLINE,
            None,
        )
    }

    pub fn with(config: Config, deadline: Duration, runtime: Option<RuntimeHeartbeat>) -> Self {
        capture_reports();
        let registry = Registry::new(deadline);
        let health = Arc::new(Health::new());
        let diagnostics = Diagnostics {
            stack_capture_after: Some(Duration::from_millis(100)),
            // Generous: a loaded machine may be slow to schedule the stuck thread.
            capture_timeout: Duration::from_secs(2),
            ..Diagnostics::default()
        };
        let monitor = Monitor::spawn_with_diagnostics(
            registry.clone(),
            &health,
            config,
            diagnostics,
            runtime,
            None,
        )
        .expect("the monitor starts");
        Self {
            registry,
            health,
            monitor: Some(monitor),
        }
    }

    /// The liveness check `name`'s answer now.
    pub fn check(&self, name: &str) -> Result<(), String> {
        self.health
            .liveness
            .run_one(name)
            .unwrap_or_else(|| panic!("no liveness check {name}"))
    }

    /// Waits until the registry is empty and every liveness check passes.
    pub fn wait_clean(&self) {
        eventually("an empty registry and passing liveness", || {
            (self.registry.is_empty() && self.health.liveness.run(&[]).passed()).then_some(())
        });
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(monitor) = self.monitor.take() {
            monitor.stop();
        }
    }
}

/// A multi-thread runtime of `workers` workers, for the reconciles.
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("hang-test-worker")
        .enable_all()
        .build()
        .expect("a runtime")
}
