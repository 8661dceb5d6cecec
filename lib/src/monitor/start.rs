//! The running monitor: starts the watchdog thread with its liveness checks, and stops
//! it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::heartbeat::{Heartbeat, RuntimeHeartbeat};
use super::inspect::Diagnostics;
use super::observer::Observer;
use super::scan::Sources;
use super::status::{ReadStatus, Status, StatusCheck};
use super::verdict::{Config, Verdict};
use super::{ApiServerStatus, Error, thread};
use crate::guard::Registry;
use crate::health::Health;

/// The running watchdog thread. Dropping it stops the thread.
#[derive(Debug)]
pub struct Monitor {
    // The checks hold their own; the watchdog reads the cause of a liveness failure.
    status: Arc<Status>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts the watchdog over `registry`, adds its liveness checks (`watchdog`,
    /// `reconcilers`, and `runtime` when `runtime` is given) to `health`, and returns.
    /// Its reports carry the default [`Diagnostics`].
    #[cfg(any(test, feature = "internals"))]
    pub fn spawn(
        registry: Registry,
        health: &Health,
        config: Config,
        runtime: Option<RuntimeHeartbeat>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Result<Self, Error> {
        Self::spawn_with_diagnostics(
            registry,
            health,
            config,
            Diagnostics::default(),
            runtime,
            observer,
        )
    }

    /// Like [`spawn`](Self::spawn), with the stuck-thread diagnostics of its reports.
    #[cfg(any(test, feature = "internals"))]
    pub fn spawn_with_diagnostics(
        registry: Registry,
        health: &Health,
        config: Config,
        diagnostics: Diagnostics,
        runtime: Option<RuntimeHeartbeat>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Result<Self, Error> {
        Self::spawn_watching_api_server(
            registry,
            health,
            config,
            diagnostics,
            runtime,
            None,
            observer,
        )
    }

    /// Like [`spawn_with_diagnostics`](Self::spawn_with_diagnostics), and overdue
    /// reconciles that await while `api_server` says the API server does not answer
    /// hold liveness instead of failing it (a restart cannot help then).
    pub fn spawn_watching_api_server(
        registry: Registry,
        health: &Health,
        config: Config,
        diagnostics: Diagnostics,
        runtime: Option<RuntimeHeartbeat>,
        api_server: Option<Arc<ApiServerStatus>>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Result<Self, Error> {
        if config.interval.is_zero() {
            return Err(Error::ZeroInterval);
        }
        let status = Arc::new(Status {
            interval: config.interval,
            beat: Heartbeat::new(),
            alive: AtomicBool::new(true),
            published: Mutex::new(Arc::default()),
        });
        let checks: [(&'static str, ReadStatus); 2] = [
            ("watchdog", |s| s.watchdog_check(Instant::now())),
            ("reconcilers", |s| {
                s.latest().reconcilers_failure.clone().map_or(Ok(()), Err)
            }),
        ];
        for (name, read) in checks {
            health.liveness.add(Arc::new(StatusCheck {
                name,
                status: Arc::clone(&status),
                read,
            }));
        }
        if runtime.is_some() {
            health.liveness.add(Arc::new(StatusCheck {
                name: "runtime",
                status: Arc::clone(&status),
                read: |s| s.latest().runtime_failure.clone().map_or(Ok(()), Err),
            }));
        }

        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let status = Arc::clone(&status);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("reconcile-watchdog".into())
                .spawn(move || {
                    thread::run(
                        &registry,
                        &status,
                        &stop,
                        Verdict::new(config),
                        &Sources {
                            diagnostics: &diagnostics,
                            runtime: runtime.as_ref(),
                            api_server: api_server.as_deref(),
                            observer: observer.as_deref(),
                        },
                    )
                })
                .map_err(Error::Spawn)?
        };
        Ok(Self {
            status,
            stop,
            thread: Some(thread),
        })
    }

    /// The state the checks read.
    #[must_use]
    pub fn status(&self) -> &Arc<Status> {
        &self.status
    }

    /// Stops the thread and waits for it.
    #[cfg(any(test, feature = "internals"))]
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::guard::ObjectKey;
    use crate::monitor::observer::Scan;
    use crate::monitor::verdict::HangPolicy;

    fn eventually(what: &str, mut f: impl FnMut() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A monitor scanning every 10 ms a registry whose deadline is 50 ms.
    fn fast_monitor() -> (Registry, Health, Monitor) {
        let registry = Registry::new(Duration::from_millis(50));
        let health = Health::new();
        let config = Config {
            interval: Duration::from_millis(10),
            ..Config::default()
        };
        let monitor = Monitor::spawn(registry.clone(), &health, config, None, None).unwrap();
        (registry, health, monitor)
    }

    #[test]
    fn a_live_monitor_fails_and_recovers_liveness() {
        let (registry, health, monitor) = fast_monitor();
        assert_eq!(health.liveness.names(), ["ping", "watchdog", "reconcilers"]);

        let guard = registry
            .controller("web", "Widget")
            .register(ObjectKey::namespaced("ns", "a"));
        eventually("liveness to fail", || !health.liveness.run(&[]).passed());
        let reason = health.liveness.run_one("reconcilers").unwrap().unwrap_err();
        assert!(reason.starts_with("web ns/a running"), "{reason}");
        assert_eq!(monitor.status().overdue(), 1);

        drop(guard);
        eventually("liveness to recover", || health.liveness.run(&[]).passed());

        monitor.stop();
        assert_eq!(
            health.liveness.run_one("watchdog"),
            Some(Err("the watchdog thread has stopped".into()))
        );
    }

    #[test]
    fn a_check_holding_the_published_state_does_not_hold_up_the_scans() {
        let (registry, _health, monitor) = fast_monitor();
        let status = Arc::clone(monitor.status());
        let guard = registry
            .controller("web", "Widget")
            .register(ObjectKey::namespaced("ns", "a"));
        // As a check preempted while it clones the published state would hold it.
        let held = status.published.lock().unwrap();
        let scanned = |status: &Status| status.beat.last_ns.load(Ordering::Acquire);
        let before = scanned(&status);
        eventually("scans while a check holds the lock", || {
            scanned(&status) > before + 100_000_000
        });
        assert_eq!(held.overdue, 0, "nothing published meanwhile");
        drop(held);
        eventually("the held-back state to be published", || {
            status.overdue() == 1
        });
        drop(guard);
        monitor.stop();
    }

    /// A task's waker that waits for `gate` (as a waker taking an executor's lock would
    /// while a worker holds it), then counts the wake.
    struct GatedWaker {
        gate: Arc<Mutex<()>>,
        wakes: AtomicU64,
    }

    impl std::task::Wake for GatedWaker {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            drop(self.gate.lock().unwrap_or_else(|p| p.into_inner()));
            self.wakes.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_cancelled_reconciles_waker_that_blocks_does_not_hold_up_the_scans() {
        let registry = Registry::new(Duration::from_millis(50));
        let health = Health::new();
        let config = Config {
            interval: Duration::from_millis(10),
            policy: HangPolicy::Cancel,
            ..Config::default()
        };
        let monitor = Monitor::spawn(registry.clone(), &health, config, None, None).unwrap();
        let status = Arc::clone(monitor.status());
        let gate = Arc::new(Mutex::new(()));
        let task = Arc::new(GatedWaker {
            gate: Arc::clone(&gate),
            wakes: AtomicU64::new(0),
        });
        let held = gate.lock().unwrap();
        let reconcile = std::future::pending::<Result<(), ()>>();
        let mut guarded = std::pin::pin!(
            registry
                .controller("web", "Widget")
                .guard(ObjectKey::namespaced("ns", "a"), reconcile)
        );
        let task_waker = std::task::Waker::from(Arc::clone(&task));
        let mut cx = std::task::Context::from_waker(&task_waker);
        assert!(guarded.as_mut().poll(&mut cx).is_pending());
        // Overdue at 50 ms and cancelled at the next scan; its waker waits for the gate.
        // A monitor that woke it itself would stop scanning there.
        let scanned = |status: &Status| status.beat.last_ns.load(Ordering::Acquire);
        let before = scanned(&status);
        eventually("scans long after the cancel", || {
            scanned(&status) > before + 500_000_000
        });
        assert_eq!(task.wakes.load(Ordering::SeqCst), 0, "the gate is held");
        drop(held);
        eventually("the cancel to wake the task", || {
            task.wakes.load(Ordering::SeqCst) == 1
        });
        assert!(matches!(
            guarded.as_mut().poll(&mut cx),
            std::task::Poll::Ready(Err(crate::guard::Error::Cancelled { .. }))
        ));
        monitor.stop();
    }

    /// Panics at every scan it is told of.
    struct Panicking(std::sync::atomic::AtomicUsize);

    impl Observer for Panicking {
        fn scanned(&self, _: &Scan<'_>) {
            self.0.fetch_add(1, Ordering::Relaxed);
            panic!("an observer's bug");
        }
    }

    #[test]
    fn a_panicking_observer_does_not_stop_the_scans() {
        let registry = Registry::new(Duration::from_millis(50));
        let health = Health::new();
        let config = Config {
            interval: Duration::from_millis(10),
            ..Config::default()
        };
        let observer = Arc::new(Panicking(Default::default()));
        let told = Arc::clone(&observer);
        let monitor =
            Monitor::spawn(registry.clone(), &health, config, None, Some(observer)).unwrap();
        let guard = registry
            .controller("web", "Widget")
            .register(ObjectKey::namespaced("ns", "a"));
        eventually("the hang to fail liveness", || {
            health
                .liveness
                .run_one("reconcilers")
                .is_some_and(|r| r.is_err())
        });
        eventually("more scans", || told.0.load(Ordering::Relaxed) >= 5);
        assert_eq!(health.liveness.run_one("watchdog"), Some(Ok(())));
        drop(guard);
        eventually("liveness to recover", || health.liveness.run(&[]).passed());
        monitor.stop();
    }

    #[test]
    fn the_runtime_heartbeat_task_ends_with_a_failed_start_and_with_the_monitor() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let alive = || runtime.handle().metrics().num_alive_tasks();
        let period = Duration::from_millis(5);

        let heartbeat = RuntimeHeartbeat::spawn(runtime.handle(), period);
        assert_eq!(alive(), 1);
        let refused = Config {
            interval: Duration::ZERO,
            ..Config::default()
        };
        let registry = Registry::new(Duration::from_secs(60));
        let health = Health::new();
        assert!(Monitor::spawn(registry.clone(), &health, refused, Some(heartbeat), None).is_err());
        eventually("the failed start's heartbeat task to end", || alive() == 0);

        let heartbeat = RuntimeHeartbeat::spawn(runtime.handle(), period);
        let config = Config {
            interval: Duration::from_millis(10),
            ..Config::default()
        };
        let monitor = Monitor::spawn(registry, &health, config, Some(heartbeat), None).unwrap();
        assert_eq!(alive(), 1);
        drop(monitor);
        eventually("the stopped monitor's heartbeat task to end", || {
            alive() == 0
        });
    }

    #[test]
    fn a_zero_interval_is_refused() {
        let config = Config {
            interval: Duration::ZERO,
            ..Config::default()
        };
        let err = Monitor::spawn(
            Registry::new(Duration::from_secs(1)),
            &Health::new(),
            config,
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the watchdog interval must be greater than zero"
        );
    }
}
