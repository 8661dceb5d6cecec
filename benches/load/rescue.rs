//! The watchdog as the runtime's sysmon: how long timers stop while one worker of four is blocked in a poll, with and without the rescue, and what the rescue's check costs the monitor thread.

use std::time::{Duration, Instant};

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::ObjectKey;
use reconcile_watchdog::internals::driver::DriverWatch;
use reconcile_watchdog::internals::{DRIVER_RESCUE_AFTER, HeartbeatInternals, RuntimeHeartbeat};

#[path = "../../tests/support/blocked_worker.rs"]
mod blocked_worker;

/// What one run measured.
pub struct Rescue {
    /// How long the blocking reconcile held its worker each round.
    pub block: Duration,
    /// The longest gap between an interval's ticks per round, with the rescue.
    pub with: Vec<Duration>,
    /// The same without it.
    pub without: Vec<Duration>,
    /// One check (4 workers' metrics read, and the decision), on average.
    pub check: Duration,
    /// The monitor thread's CPU time per second beside an idle runtime, with the
    /// rescue's checks and without.
    pub idle_cpu_with: Duration,
    pub idle_cpu_without: Duration,
}

impl Rescue {
    /// One line of figures.
    pub fn summary(&self) -> String {
        let fmt = |v: &[Duration]| {
            let max = v.iter().max().copied().unwrap_or_default();
            let stopped = v.iter().filter(|d| **d > self.block / 2).count();
            format!(
                "longest {:.0} ms, {stopped} of {} rounds with timers stopped for more than half the block; per round {:?} ms",
                ms(max),
                v.len(),
                v.iter().map(|d| ms(*d).round()).collect::<Vec<_>>()
            )
        };
        format!(
            "one worker of 4 blocked {:.0} ms in a poll woken by a timer, a 25 ms interval beside it: \
             without the rescue {}; with it {}; \
             one check {:.0} ns; monitor thread CPU beside an idle runtime (scans every 1 s) {:.1} us/s with the checks, {:.1} us/s without",
            ms(self.block),
            fmt(&self.without),
            fmt(&self.with),
            self.check.as_secs_f64() * 1e9,
            self.idle_cpu_with.as_secs_f64() * 1e6,
            self.idle_cpu_without.as_secs_f64() * 1e6,
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `rounds` rounds with the rescue and as many without, each blocking a worker for
/// `block`; then the check's cost, and the monitor thread's CPU over `idle_for` each way.
pub fn run(rounds: usize, block: Duration, idle_for: Duration) -> Rescue {
    let without = (0..rounds).map(|_| one_round(None, block)).collect();
    let with = (0..rounds)
        .map(|_| one_round(Some(DRIVER_RESCUE_AFTER), block))
        .collect();
    Rescue {
        block,
        with,
        without,
        check: check_cost(),
        idle_cpu_with: idle_cpu(Some(DRIVER_RESCUE_AFTER), idle_for),
        idle_cpu_without: idle_cpu(None, idle_for),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The rescue's scenario ([`blocked_worker::longest_tick_gap`]) on a runtime of 4
/// workers, under a watchdog rescuing after `rescue_after` (or not at all).
fn one_round(rescue_after: Option<Duration>, block: Duration) -> Duration {
    let runtime = runtime();
    let watchdog = Watchdog::builder()
        .watch_runtime(runtime.handle().clone())
        .driver_rescue_after(rescue_after)
        .start()
        .expect("the watchdog starts");
    let controller = watchdog.registry().controller("bench-blocker", "Widget");
    let object = ObjectKey::namespaced("bench", "blocked");
    blocked_worker::longest_tick_gap(&runtime, &controller, &object, block)
}

/// One check as the monitor makes it: 4 workers' metrics read, and the decision.
fn check_cost() -> Duration {
    const CHECKS: u32 = 200_000;
    let runtime = runtime();
    let heartbeat = RuntimeHeartbeat::spawn(runtime.handle(), Duration::from_millis(500));
    let mut watch = DriverWatch::new(DRIVER_RESCUE_AFTER, Some(Duration::from_millis(500)));
    let mut samples = Vec::new();
    let started = Instant::now();
    for _ in 0..CHECKS {
        heartbeat.workers(&mut samples);
        std::hint::black_box(watch.check(Instant::now(), &samples, Some(Duration::ZERO)));
    }
    started.elapsed() / CHECKS
}

/// The monitor thread's CPU time per second over `idle_for`, beside an idle runtime.
fn idle_cpu(rescue_after: Option<Duration>, idle_for: Duration) -> Duration {
    let runtime = runtime();
    let watchdog = Watchdog::builder()
        .watch_runtime(runtime.handle().clone())
        .driver_rescue_after(rescue_after)
        .start()
        .expect("the watchdog starts");
    std::thread::sleep(Duration::from_millis(100));
    let before = monitor_cpu();
    std::thread::sleep(idle_for);
    let spent = monitor_cpu().saturating_sub(before);
    drop(watchdog);
    spent.div_f64(idle_for.as_secs_f64())
}

/// The CPU time so far of the monitor thread (`reconcile-watchdog`, the only one).
fn monitor_cpu() -> Duration {
    let tasks = std::fs::read_dir("/proc/self/task").expect("Linux's /proc");
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        // The kernel keeps 15 bytes of a thread's name.
        if comm.trim_end() == "reconcile-watch" {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).expect("schedstat");
            let ns = stat
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .expect("schedstat starts with the CPU time in ns");
            return Duration::from_nanos(ns);
        }
    }
    panic!("no monitor thread");
}
