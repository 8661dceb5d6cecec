//! Graceful shutdown on SIGTERM or SIGINT, supervised from a plain thread, so that it
//! keeps its promise (not ready, no new work, a bounded drain) when the async runtime
//! is wedged.
//!
//! The kubelet stops a pod with SIGTERM, then SIGKILL after the pod's grace period; an
//! operator that waits only for Ctrl-C never flips readiness and never drains. The
//! [`Supervisor`] listens for both signals on a thread of its own from the moment it is
//! made, and [`Supervisor::wait`] blocks a plain thread (typically `main`) until the
//! first; then it fails the `shutdown` readiness check, cancels the shutdown token,
//! and waits for the operator to say it stopped, for at most the grace. A second signal,
//! or the grace running out, ends the wait with the reconciles still running named.
//!
//! ```no_run
//! use std::time::Duration;
//! use reconcile_watchdog::shutdown::Supervisor;
//! use tokio_util::sync::CancellationToken;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let supervisor = Supervisor::listen()?; // first: no early signal is lost
//! let runtime = tokio::runtime::Runtime::new()?;
//! let watchdog = reconcile_watchdog::Watchdog::builder()
//!     .watch_runtime(runtime.handle().clone())
//!     .start()?;
//! let shutdown = CancellationToken::new();
//! let stopped = supervisor.stopped();
//! let token = shutdown.clone();
//! runtime.spawn(async move {
//!     // Run your controllers until `token` is cancelled and they have drained, e.g.
//!     // `Controllers::new(&watchdog, token).add(...).run().await`.
//!     token.cancelled().await;
//!     stopped.send(());
//! });
//! let ending = supervisor.wait(&watchdog, &shutdown, Duration::from_secs(25));
//! // Reconciles still hung must not hold the process.
//! runtime.shutdown_background();
//! std::process::exit(if ending.is_clean() { 0 } else { 1 });
//! # }
//! ```

use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::Watchdog;
use crate::guard::Registry;
use crate::monitor::summary::{NAMED, name_few};

/// A termination request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (the kubelet stopping the pod).
    Terminate,
}

/// Starts listening for SIGINT and SIGTERM on a thread of its own; every signal
/// received is sent to the returned channel.
pub fn listen() -> std::io::Result<mpsc::Receiver<Signal>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (tx, rx) = mpsc::channel();
    // Register the handlers before returning, so no early signal kills the process.
    #[cfg(unix)]
    let (mut int, mut term) = {
        use tokio::signal::unix::{SignalKind, signal};
        let _guard = runtime.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        )
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            runtime.block_on(async move {
                loop {
                    #[cfg(unix)]
                    let received = tokio::select! {
                        _ = int.recv() => Signal::Interrupt,
                        _ = term.recv() => Signal::Terminate,
                    };
                    #[cfg(not(unix))]
                    let received = match tokio::signal::ctrl_c().await {
                        Ok(()) => Signal::Interrupt,
                        Err(_) => return,
                    };
                    if tx.send(received).is_err() {
                        return;
                    }
                }
            });
        })?;
    Ok(rx)
}

/// What the supervising thread waits for.
enum Event<T> {
    Signal(Signal),
    Stopped(T),
}

/// Supervises a graceful shutdown from a plain thread (see the [module](self)).
#[derive(Debug)]
pub struct Supervisor<T> {
    events: mpsc::Receiver<Event<T>>,
    sender: mpsc::Sender<Event<T>>,
}

/// Tells the [`Supervisor`] that the operator stopped (drained after the shutdown
/// token was cancelled, or ended on its own), with its result.
#[derive(Debug)]
pub struct Stopped<T>(mpsc::Sender<Event<T>>);

impl<T> Stopped<T> {
    /// The operator stopped with `result`.
    pub fn send(self, result: T) {
        // The supervisor may have given up waiting already: nothing left to tell.
        let _ = self.0.send(Event::Stopped(result));
    }
}

/// How a supervised run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending<T> {
    /// The operator stopped on its own, before any signal (it failed to start, say).
    Stopped(T),
    /// A signal, then the operator drained within the grace.
    Drained {
        /// The signal that began the shutdown.
        signal: Signal,
        /// What the operator said when it stopped.
        result: T,
    },
    /// A second signal arrived while the operator drained.
    SecondSignal {
        /// The signal that began the shutdown.
        first: Signal,
        /// The one that ended the wait.
        second: Signal,
    },
    /// The grace ran out with the operator still draining.
    GraceExpired {
        /// The signal that began the shutdown.
        signal: Signal,
    },
}

impl<T> Ending<T> {
    /// Whether the operator stopped by itself: on its own or drained within the grace.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        matches!(self, Self::Stopped(_) | Self::Drained { .. })
    }
}

impl<T: Send + 'static> Supervisor<T> {
    /// Starts listening for SIGTERM and SIGINT at once (on a thread of its own), so
    /// that a signal that comes while the operator starts is not lost.
    ///
    /// # Errors
    /// The signal handlers or their thread could not be set up.
    pub fn listen() -> std::io::Result<Self> {
        let signals = listen()?;
        let (sender, events) = mpsc::channel();
        let forward = sender.clone();
        // The thread ends with the process; nothing needs to join it.
        std::thread::Builder::new()
            .name("signal-forwarder".into())
            .spawn(move || {
                while let Ok(signal) = signals.recv() {
                    if forward.send(Event::Signal(signal)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self { events, sender })
    }

    /// The handle the operator's task tells that it stopped.
    #[must_use]
    pub fn stopped(&self) -> Stopped<T> {
        Stopped(self.sender.clone())
    }

    /// Blocks the calling thread until the first signal (or until the operator stops on
    /// its own); then fails `watchdog`'s `shutdown` readiness check, cancels
    /// `shutdown`, and waits for the operator to stop for at most `grace`. Each ending
    /// is logged; one that leaves reconciles running names the oldest few.
    pub fn wait(
        self,
        watchdog: &Watchdog,
        shutdown: &CancellationToken,
        grace: Duration,
    ) -> Ending<T> {
        let Self { events, sender } = self;
        // Only the operator's handles may keep the channel open from here on.
        drop(sender);
        let first = match events.recv() {
            Ok(Event::Signal(signal)) => signal,
            Ok(Event::Stopped(result)) => return Ending::Stopped(result),
            // Every handle dropped unsent: the operator is gone without a word.
            Err(mpsc::RecvError) => {
                tracing::error!("the operator stopped without saying so; exiting");
                return Ending::GraceExpired {
                    signal: Signal::Terminate,
                };
            }
        };
        watchdog.health().shutdown.begin();
        shutdown.cancel();
        tracing::info!(
            signal = ?first,
            in_flight = watchdog.registry().len(),
            grace = %humantime::format_duration(grace),
            "shutting down: not ready, taking no new work, draining reconciles in flight; a second signal exits at once"
        );
        match events.recv_timeout(grace) {
            Ok(Event::Stopped(result)) => {
                tracing::info!("drained; exiting");
                Ending::Drained {
                    signal: first,
                    result,
                }
            }
            Ok(Event::Signal(second)) => {
                tracing::error!(
                    signal = ?second,
                    still_running = %still_running(watchdog.registry()),
                    "second signal: exiting at once"
                );
                Ending::SecondSignal { first, second }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                tracing::error!("the operator stopped without saying so; exiting");
                Ending::GraceExpired { signal: first }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                tracing::error!(
                    grace = %humantime::format_duration(grace),
                    still_running = %still_running(watchdog.registry()),
                    "reconciles still running after the shutdown grace; exiting"
                );
                Ending::GraceExpired { signal: first }
            }
        }
    }
}

/// The reconciles in flight, as `controller object (elapsed)`: the longest running few,
/// then the rest counted per controller.
pub(crate) fn still_running(registry: &Registry) -> String {
    let now = Instant::now();
    let running = registry.snapshot();
    if running.is_empty() {
        return "none".into();
    }
    name_few(
        &running,
        NAMED,
        ", ",
        |r| r.elapsed(now),
        |r| {
            format!(
                "{} {} ({})",
                r.controller,
                r.object,
                humantime::format_duration(Duration::from_secs(r.elapsed(now).as_secs()))
            )
        },
        |r| r.controller.clone(),
    )
}
