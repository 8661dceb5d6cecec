//! Truthful liveness and readiness probes for Kubernetes operators built on kube-rs.
//!
//! Every reconcile runs inside a timed [`Guard`](guard::Guard) recorded in a
//! [`Registry`](guard::Registry). A monitor on its own OS thread
//! scans the registry, writes a hang report when a guard outlives its deadline and
//! publishes the verdict to the [`health`] checks, which the [`probes`] server answers
//! the kubelet from. Neither the monitor nor the probe server depend on the async
//! runtime that runs the reconciles, so they keep telling the truth when it is wedged.
//!
//! `unsafe` code is denied except in five modules, each block with its SAFETY comment:
//! the guard's clock (`clock_gettime`, `guard/clock.rs`) and, for the [`stack`] capture,
//! its signal handler and `tgkill` (`stack/signal.rs`), the threads' alternate signal
//! stacks (`stack/alt_stack.rs`), the read of a thread's poll-frame cell
//! (`stack/anchor.rs`) and the heap trim after symbolizing (`malloc_trim`,
//! `stack/symbols.rs`). docs/stack-capture.md lists what each block does.
//!
//! ```
//! use std::time::Duration;
//! use reconcile_watchdog::guard::{ObjectKey, Registry};
//!
//! # async fn example() {
//! let registry = Registry::new(Duration::from_secs(300));
//! let configmaps = registry.controller("configmaps", "ConfigMap");
//! let result = configmaps
//!     .guard(ObjectKey::namespaced("default", "app-config"), async { Ok::<_, ()>(()) })
//!     .await;
//! assert!(matches!(result, Ok(Ok(()))));
//! assert!(registry.is_empty());
//! # }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs, rust_2018_idioms, unreachable_pub, clippy::all)]

// The kube and k8s-openapi of the integration, whichever major the features chose (the
// newest when several are on), under one name each: the kube room is one source for
// every major. Crate-root `extern crate`s, so that `kube_rs::` and `k8s::` resolve in
// every module as a dependency's name does.
#[cfg(feature = "kube-5")]
extern crate k8s_openapi as k8s;
#[cfg(all(feature = "kube-3", not(any(feature = "kube-4", feature = "kube-5"))))]
extern crate k8s_openapi_027 as k8s;
#[cfg(all(feature = "kube-4", not(feature = "kube-5")))]
extern crate k8s_openapi_028 as k8s;
#[cfg(feature = "kube-5")]
extern crate kube as kube_rs;
#[cfg(all(feature = "kube-3", not(any(feature = "kube-4", feature = "kube-5"))))]
extern crate kube_3 as kube_rs;
#[cfg(all(feature = "kube-4", not(feature = "kube-5")))]
extern crate kube_4 as kube_rs;
#[cfg(all(
    feature = "_kube",
    not(any(feature = "kube-3", feature = "kube-4", feature = "kube-5"))
))]
compile_error!(
    "the feature `_kube` is what `kube-3`, `kube-4` and `kube-5` share: enable one of them"
);

#[cfg(feature = "clap")]
pub mod args;
mod block_on;
// The deadline advisor is the watchdog's own (`/debug/deadlines` serves it); this
// repository's binary reads its report through `internals`.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod deadlines;
pub mod guard;
pub mod health;
#[cfg(feature = "_kube")]
pub mod kube;
pub mod label;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod monitor;
pub mod plug;
pub mod probes;
pub mod quarantine;
pub mod restart;
pub mod shutdown;
pub mod stack;
pub mod watchdog;

#[cfg(feature = "clap")]
pub use args::WatchdogArgs;
pub use label::label;
/// The prometheus-client the [`metrics`] are made with: register them into a registry
/// of this version (`reconcile_watchdog::prometheus_client::registry::Registry`).
#[cfg(feature = "metrics")]
pub use prometheus_client;
pub use watchdog::{Builder, Watchdog};

/// The README's examples compile and run as doc tests.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The examples of `docs/embedding.md` compile as doc tests.
#[doc = include_str!("../../docs/embedding.md")]
#[cfg(doctest)]
pub struct EmbeddingDoctests;

/// The monitor's internals, public for this crate's own tests and benchmarks (feature
/// `internals`, which its dev-dependency on itself turns on): not API. The one way the
/// crate shows what is its own: the modules keep such items crate-private, and this
/// module re-exports them.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    #[cfg(feature = "metrics")]
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::guard::{Ended, InFlight, Registry};
    #[cfg(feature = "metrics")]
    use crate::health::Health;
    #[cfg(feature = "metrics")]
    use crate::metrics::Metrics;

    pub use crate::guard::deadlines::NEAR_MISS_SHARE;
    pub use crate::guard::map::{BuildIdHasher, IdHasher};
    pub use crate::guard::registry::ControllerCounts;
    pub use crate::monitor::heartbeat::RuntimeHeartbeat;
    pub use crate::monitor::inspect::Diagnostics;
    pub use crate::monitor::observer::{Observer, Scan};
    pub use crate::monitor::start::Monitor;
    pub use crate::monitor::verdict::{Config, DRIVER_RESCUE_AFTER, Verdict};

    /// The runtime rescue's decision.
    pub mod driver {
        pub use crate::monitor::verdict::driver::*;
    }

    /// The deadline advisor, whose report the binary's `deadlines` command reads.
    pub mod deadlines {
        pub use crate::deadlines::{
            Advisor, ControllerReport, DeadlineSource, QuarantinedReport, Report,
        };
    }

    /// The probe and debug servers' routes and connection loop.
    pub mod probes {
        pub use crate::probes::debug::DebugViews;
        pub use crate::probes::routes::Probes;
        pub use crate::probes::server::{HttpServer, Limits, Peer, Request};
    }

    /// What a process that exits while liveness fails writes, for its bench.
    pub mod restart {
        use std::path::Path;

        use crate::Watchdog;
        use crate::restart::{MESSAGE_BYTES, WRITE_PATIENCE};

        /// The termination message `watchdog` would write now: `None` while liveness
        /// passes.
        #[must_use]
        pub fn termination_message(watchdog: &Watchdog) -> Option<String> {
            watchdog
                .liveness_cause()
                .map(|cause| cause.text(MESSAGE_BYTES))
        }

        /// Writes `message` to `path` as the exiting process does.
        pub fn write(path: &Path, message: String) {
            crate::restart::write(path, message, WRITE_PATIENCE);
        }
    }

    /// The hang reports' log targets.
    pub mod report {
        pub use crate::monitor::report::{RUNTIME_TARGET, TARGET};
    }

    /// What the benchmarks and tests make or set of the metrics by hand, which an
    /// embedder gets from the builder.
    #[cfg(feature = "metrics")]
    pub trait MetricsInternals {
        /// See `Metrics::new`.
        fn new(health: Arc<Health>) -> Arc<Self>
        where
            Self: Sized;
        /// See `Metrics::add_controller`.
        fn add_controller(&self, controller: &str);
        /// See `Metrics::set_leader`.
        fn set_leader(&self, identity: &str, leading: bool);
        /// See `Metrics::lease_renewal`.
        fn lease_renewal(&self, success: bool);
        /// See `Metrics::watch_lease_renewal_age`.
        fn watch_lease_renewal_age(
            &self,
            age: impl Fn() -> Option<Duration> + Send + Sync + 'static,
        );
    }

    #[cfg(feature = "metrics")]
    impl MetricsInternals for Metrics {
        fn new(health: Arc<Health>) -> Arc<Self> {
            Metrics::new(health)
        }

        fn add_controller(&self, controller: &str) {
            Metrics::add_controller(self, controller);
        }

        fn set_leader(&self, identity: &str, leading: bool) {
            Metrics::set_leader(self, identity, leading);
        }

        fn lease_renewal(&self, success: bool) {
            Metrics::lease_renewal(self, success);
        }

        fn watch_lease_renewal_age(
            &self,
            age: impl Fn() -> Option<Duration> + Send + Sync + 'static,
        ) {
            Metrics::watch_lease_renewal_age(self, age);
        }
    }

    /// What the monitor thread alone calls on the registry.
    pub trait RegistryInternals {
        /// See `Registry::take_ended`.
        fn take_ended(&self) -> Vec<Ended>;
        /// See `Registry::scan_into`.
        fn scan_into(
            &self,
            now: Instant,
            in_poll: bool,
            out: &mut Vec<InFlight>,
            counts: &mut ControllerCounts,
        );
        /// See `Registry::in_poll_into`.
        fn in_poll_into(&self, now: Instant, for_at_least: Duration, out: &mut Vec<InFlight>);
        /// See `Registry::request_cancel`.
        fn request_cancel(&self, id: u64) -> bool;
    }

    /// What the monitor thread alone reads of the runtime's heartbeat.
    pub trait HeartbeatInternals {
        /// See `RuntimeHeartbeat::workers`.
        fn workers(&self, out: &mut Vec<crate::monitor::verdict::driver::WorkerSample>);
    }

    impl HeartbeatInternals for crate::monitor::RuntimeHeartbeat {
        fn workers(&self, out: &mut Vec<crate::monitor::verdict::driver::WorkerSample>) {
            crate::monitor::RuntimeHeartbeat::workers(self, out);
        }
    }

    impl RegistryInternals for Registry {
        fn take_ended(&self) -> Vec<Ended> {
            Registry::take_ended(self)
        }

        fn scan_into(
            &self,
            now: Instant,
            in_poll: bool,
            out: &mut Vec<InFlight>,
            counts: &mut ControllerCounts,
        ) {
            Registry::scan_into(self, now, in_poll, out, counts);
        }

        fn in_poll_into(&self, now: Instant, for_at_least: Duration, out: &mut Vec<InFlight>) {
            Registry::in_poll_into(self, now, for_at_least, out);
        }

        fn request_cancel(&self, id: u64) -> bool {
            Registry::request_cancel(self, id)
        }
    }
}
