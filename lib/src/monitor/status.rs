//! The state the monitor publishes after each scan, and the liveness checks that read it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use super::heartbeat::Heartbeat;
use super::verdict;
use crate::health::Check;
use crate::restart::Cause;

/// What the latest scan decided, for the health checks.
#[derive(Debug, Default)]
pub(super) struct Published {
    pub(super) reconcilers_failure: Option<String>,
    pub(super) runtime_failure: Option<String>,
    /// Why liveness fails, kept for the restart, while it does.
    pub(super) cause: Option<Arc<Cause>>,
    /// How many reconciles were overdue (for the tests and benchmarks).
    #[cfg_attr(not(any(test, feature = "internals")), allow(dead_code))]
    pub(super) overdue: usize,
}

/// The state the monitor publishes and the checks read.
#[derive(Debug)]
pub struct Status {
    pub(super) interval: Duration,
    pub(super) beat: Arc<Heartbeat>,
    pub(super) alive: AtomicBool,
    pub(super) published: Mutex<Arc<Published>>,
}

impl Status {
    pub(super) fn latest(&self) -> Arc<Published> {
        Arc::clone(&self.published.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Publishes `unpublished`, unless a check holds the lock right now (cloning the
    /// previous state, or preempted while it does): then it stays for the next try, as
    /// the monitor never waits on a reader.
    pub(super) fn try_publish(&self, unpublished: &mut Option<Arc<Published>>) {
        let Some(published) = unpublished.take() else {
            return;
        };
        let mut slot = match self.published.try_lock() {
            Ok(slot) => slot,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                *unpublished = Some(published);
                return;
            }
        };
        let previous = std::mem::replace(&mut *slot, published);
        drop(slot);
        drop(previous);
    }

    /// Why liveness fails, as the latest scan found it; `None` while it passes.
    pub(crate) fn cause(&self) -> Option<Arc<Cause>> {
        self.latest().cause.clone()
    }

    /// How many reconciles the latest scan found overdue.
    #[cfg(any(test, feature = "internals"))]
    #[must_use]
    pub fn overdue(&self) -> usize {
        self.latest().overdue
    }

    /// `watchdog`: the monitor thread lives and has scanned within 3 intervals.
    ///
    /// It reads the published state only and never waits for the monitor: a probe or a
    /// scrape that runs it (perhaps on the operator's runtime, when the metrics are in
    /// the operator's registry) returns at once, and a late monitor is reported late at
    /// once. After a pause of the whole process (SIGSTOP, a VM pause, a CFS throttle)
    /// the probe server's thread may run before the monitor's and see it late once: a
    /// single failure, which the kubelet's failure threshold absorbs.
    pub fn watchdog_check(&self, now: Instant) -> Result<(), String> {
        if !self.alive.load(Ordering::Acquire) {
            return Err("the watchdog thread has stopped".into());
        }
        let age = self.beat.age(now);
        if age > self.interval * 3 {
            return Err(format!(
                "the watchdog has not scanned for {} (interval {})",
                verdict::fmt_duration(age),
                verdict::fmt_duration(self.interval)
            ));
        }
        Ok(())
    }
}

/// Reads one check's answer from the published status.
pub(super) type ReadStatus = fn(&Status) -> Result<(), String>;

pub(super) struct StatusCheck {
    pub(super) name: &'static str,
    pub(super) status: Arc<Status>,
    pub(super) read: ReadStatus,
}

impl Check for StatusCheck {
    fn name(&self) -> &str {
        self.name
    }

    fn check(&self) -> Result<(), String> {
        (self.read)(&self.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_check_fails_when_scans_stop() {
        let status = Status {
            interval: Duration::from_secs(1),
            beat: Heartbeat::new(),
            alive: AtomicBool::new(true),
            published: Mutex::default(),
        };
        let t0 = Instant::now();
        status.beat.beat(t0);
        assert!(status.watchdog_check(t0 + Duration::from_secs(3)).is_ok());
        let err = status
            .watchdog_check(t0 + Duration::from_secs(4))
            .unwrap_err();
        assert!(
            err.starts_with("the watchdog has not scanned for 4s"),
            "{err}"
        );
        status.alive.store(false, Ordering::Release);
        assert_eq!(
            status.watchdog_check(t0).unwrap_err(),
            "the watchdog thread has stopped"
        );
    }

    #[test]
    fn a_late_monitor_is_reported_late_at_once() {
        let status = Status {
            interval: Duration::from_secs(1),
            beat: Heartbeat::new(),
            alive: AtomicBool::new(true),
            published: Mutex::default(),
        };
        let t0 = Instant::now();
        status.beat.beat(t0);
        // Read at the instant the scans are late: no grace, no wait for a scan.
        let late = t0 + Duration::from_millis(3001);
        let err = status.watchdog_check(late).unwrap_err();
        assert!(
            err.starts_with("the watchdog has not scanned for 3s"),
            "{err}"
        );
    }
}
