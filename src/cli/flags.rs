//! The flags of the process that `demo` and `run` share besides the watchdog's own
//! (those are the library's [`WatchdogArgs`]), and `demo`'s defaults for them.

use std::time::Duration;

use clap::{Args, ValueEnum};

pub use reconcile_watchdog::WatchdogArgs;
pub use reconcile_watchdog::args::{duration, positive_duration};

/// The flags of the process around the watchdog: its drain on SIGTERM and its logs.
#[derive(Args, Debug, Clone)]
pub struct ProcessArgs {
    /// Drain time for in-flight reconciles on SIGTERM
    #[arg(long, env = "RECONCILE_WATCHDOG_SHUTDOWN_GRACE", value_name = "DURATION", default_value = "30s", value_parser = duration)]
    pub shutdown_grace: Duration,

    /// Log format; the level comes from RUST_LOG (default info)
    #[arg(long, env = "RECONCILE_WATCHDOG_LOG_FORMAT", value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// `--log-format`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `demo`'s defaults for the watchdog's flags, short so that a hang shows within
/// seconds: (the flag's id, its default).
pub const DEMO_DEFAULTS: [(&str, &str); 3] = [
    ("reconcile_deadline", "3s"),
    ("watchdog_interval", "500ms"),
    ("runtime_stall_threshold", "3s"),
];

/// `demo`'s command with [`DEMO_DEFAULTS`].
#[must_use]
pub fn with_demo_defaults(demo: clap::Command) -> clap::Command {
    DEMO_DEFAULTS.iter().fold(demo, |command, (id, default)| {
        command.mut_arg(*id, |arg| arg.default_value(*default))
    })
}
