//! The watchdog: an OS thread that scans the registry and publishes the verdict.
//!
//! It uses `std::thread` and `std::time` only. tokio timers cannot fire when every
//! worker of the runtime is blocked, and that is exactly when the watchdog must speak.
//! The decision itself lives in `verdict/`; `report.rs` writes it to the log. The
//! thread's loop is `thread.rs`, one scan `scan.rs`, the runtime rescue's sampling
//! between scans `rescue.rs`, the state the health checks read `status.rs`, and
//! `start.rs` starts and stops the thread.

// Only the API server's status is public (its seam, `plug::ApiServerReachability`,
// records into it); the rest of the monitor is this crate's, and what this
// repository's tests and benchmarks drive is re-exported by `crate::internals`.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod api_server;
pub(crate) mod cgroup;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod heartbeat;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod inspect;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod observer;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod report;
mod rescue;
mod scan;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod start;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
mod status;
pub(crate) mod summary;
#[cfg(all(feature = "task-dump", tokio_unstable, target_os = "linux"))]
mod task_dump;
#[cfg(not(all(feature = "task-dump", tokio_unstable, target_os = "linux")))]
mod task_dump {
    //! Without the `task-dump` feature and `--cfg tokio_unstable`: no task traces.

    /// Gives no trace.
    #[derive(Debug)]
    pub(crate) struct TaskTraces;

    impl TaskTraces {
        pub(crate) fn new(_: Option<tokio::runtime::Handle>) -> Self {
            Self
        }

        pub(crate) fn of(&self, _: &super::verdict::Event, _: bool) -> Option<String> {
            None
        }
    }
}
mod task_trace;
mod thread;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod verdict;
#[cfg(test)]
mod verdict_props;
mod waker;

pub use api_server::ApiServerStatus;
pub use verdict::{Action, HangPolicy, HangState};

pub(crate) use heartbeat::RuntimeHeartbeat;
pub(crate) use inspect::Diagnostics;
pub(crate) use observer::{Observer, Scan};
pub(crate) use start::Monitor;
pub(crate) use verdict::Config;

/// Errors of the monitor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OS refused to start the monitor thread.
    #[error("failed to start the watchdog thread")]
    Spawn(#[source] std::io::Error),
    /// The interval is zero.
    #[error("the watchdog interval must be greater than zero")]
    ZeroInterval,
}
