//! The heartbeats: the monitor's own, and the watched runtime's with its metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::report::RuntimeSample;
use super::verdict::driver::WorkerSample;

/// A timestamp that one side touches and another reads the age of, lock-free.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    epoch: Instant,
    /// Nanoseconds since `epoch` of the latest beat.
    pub(super) last_ns: AtomicU64,
}

impl Heartbeat {
    /// A heartbeat that beat just now.
    #[must_use]
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            last_ns: AtomicU64::new(0),
        })
    }

    /// Records a beat at `now`.
    pub(crate) fn beat(&self, now: Instant) {
        let ns =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.last_ns.fetch_max(ns, Ordering::Release);
    }

    /// How long before `now` the latest beat was.
    #[must_use]
    pub(crate) fn age(&self, now: Instant) -> Duration {
        let last = self.epoch + Duration::from_nanos(self.last_ns.load(Ordering::Acquire));
        now.saturating_duration_since(last)
    }
}

/// The async runtime's heartbeat: a task on that runtime beats it every `period`. If
/// every worker is blocked, the task cannot run and the beat grows old.
/// Dropping it stops the task (with the monitor that owns it, or with a failed start).
#[derive(Debug)]
pub struct RuntimeHeartbeat {
    pub(super) heartbeat: Arc<Heartbeat>,
    pub(super) period: Duration,
    pub(super) handle: tokio::runtime::Handle,
    task: tokio::task::AbortHandle,
}

impl Drop for RuntimeHeartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RuntimeHeartbeat {
    /// Spawns the beating task on `handle`'s runtime.
    #[must_use]
    pub fn spawn(handle: &tokio::runtime::Handle, period: Duration) -> Self {
        let heartbeat = Heartbeat::new();
        let beating = Arc::clone(&heartbeat);
        let task = handle.spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                beating.beat(Instant::now());
            }
        });
        Self {
            heartbeat,
            period,
            handle: handle.clone(),
            task: task.abort_handle(),
        }
    }

    /// Each worker's park count and busy time, from tokio's stable metrics, into `out`
    /// (a few atomic loads per worker, readable from any thread).
    pub(crate) fn workers(&self, out: &mut Vec<WorkerSample>) {
        let m = self.handle.metrics();
        out.clear();
        out.extend((0..m.num_workers()).map(|worker| WorkerSample {
            park_unpark: m.worker_park_unpark_count(worker),
            busy_ns:
                u64::try_from(m.worker_total_busy_duration(worker).as_nanos()).unwrap_or(u64::MAX),
        }));
    }

    /// The stable metrics of the runtime, readable from any thread.
    #[must_use]
    pub fn sample(&self) -> RuntimeSample {
        let m = self.handle.metrics();
        let idle_workers = (0..m.num_workers())
            .filter(|&worker| m.worker_park_unpark_count(worker) % 2 == 1)
            .count();
        RuntimeSample {
            workers: m.num_workers(),
            idle_workers,
            alive_tasks: m.num_alive_tasks(),
            global_queue_depth: m.global_queue_depth(),
        }
    }
}
