//! The soak: 10,000 guarded reconciles a second for a long time, with periodic hangs
//! (cancelled by the watchdog under `--on-hang cancel`), reconciles dropped by their
//! caller and panics, while probes, metrics and debug views are scraped throughout.
//! Resident memory, open descriptors and threads are sampled every interval: they must
//! stay flat.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::{Deadlines, ObjectKey};
use reconcile_watchdog::monitor::HangPolicy;

use crate::http::Client;
use crate::memory::{rss_bytes, status_field};

pub struct Plan {
    duration: Duration,
    reconciles_per_sec: u32,
    sample_every: Duration,
    deadline: Duration,
    /// Every Nth reconcile hangs (awaits three deadlines; the watchdog cancels it).
    hang_every: u64,
    /// Every Nth panics.
    panic_every: u64,
    /// Every Nth is dropped by its caller before it ends.
    drop_every: u64,
}

impl Plan {
    pub fn full(duration: Duration) -> Self {
        Self {
            duration,
            reconciles_per_sec: 10_000,
            sample_every: Duration::from_secs(10),
            deadline: Duration::from_millis(200),
            hang_every: 5_000,
            panic_every: 1_000,
            drop_every: 1_000,
        }
    }

    pub fn quick() -> Self {
        Self {
            duration: Duration::from_secs(2),
            reconciles_per_sec: 1_000,
            sample_every: Duration::from_millis(500),
            ..Self::full(Duration::ZERO)
        }
    }
}

/// One reading.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Duration,
    rss: u64,
    fds: usize,
    threads: u64,
    completed: u64,
    in_flight: usize,
}

pub struct Soak {
    samples: Vec<Sample>,
    scrapes: u64,
    scrape_failures: u64,
    hangs: u64,
    panics: u64,
    dropped: u64,
    elapsed: Duration,
}

fn sample(at: Duration, completed: u64, in_flight: usize) -> Sample {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    Sample {
        at,
        rss: rss_bytes(),
        fds: std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count),
        threads: status_field(&status, "Threads").unwrap_or(0),
        completed,
        in_flight,
    }
}

impl Soak {
    pub fn print(&self) {
        println!(
            "soak: {:.0} s, {} reconciles ({:.0}/s), {} hangs, {} panics, {} dropped; {} scrapes ({} failed)",
            self.elapsed.as_secs_f64(),
            self.samples.last().map_or(0, |s| s.completed),
            self.rate(),
            self.hangs,
            self.panics,
            self.dropped,
            self.scrapes,
            self.scrape_failures,
        );
        println!("| at | resident MiB | descriptors | threads | in flight |");
        println!("|---|---|---|---|---|");
        // The first, then about a dozen rows, then the last.
        let step = (self.samples.len() / 12).max(1);
        for (i, s) in self.samples.iter().enumerate() {
            if i % step == 0 || i + 1 == self.samples.len() {
                #[allow(clippy::cast_precision_loss)]
                let mib = s.rss as f64 / 1_048_576.0;
                println!(
                    "| {:.0} s | {mib:.1} | {} | {} | {} |",
                    s.at.as_secs_f64(),
                    s.fds,
                    s.threads,
                    s.in_flight
                );
            }
        }
        if let (Some(first), Some(last)) = (self.samples.get(1), self.samples.last()) {
            let max = |f: fn(&Sample) -> u64| self.samples[1..].iter().map(f).max().unwrap_or(0);
            #[allow(clippy::cast_precision_loss)]
            let mib = |b: u64| b as f64 / 1_048_576.0;
            println!(
                "after warm-up (from {:.0} s): resident {:.1} -> {:.1} MiB (max {:.1}); descriptors {} -> {} (max {}); threads {} -> {} (max {})",
                first.at.as_secs_f64(),
                mib(first.rss),
                mib(last.rss),
                mib(max(|s| s.rss)),
                first.fds,
                last.fds,
                max(|s| s.fds as u64),
                first.threads,
                last.threads,
                max(|s| s.threads),
            );
        }
    }

    fn rate(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let completed = self.samples.last().map_or(0, |s| s.completed) as f64;
        completed / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

pub fn run(plan: &Plan) -> Soak {
    // A panic per thousand reconciles is the point; their messages are not.
    std::panic::set_hook(Box::new(|_| {}));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the reconciles");
    let watchdog = Watchdog::builder()
        .deadlines(Deadlines::new(plan.deadline))
        .interval(Duration::from_millis(100))
        .on_hang(HangPolicy::Cancel)
        // Objects recur; the soak is about resources, not escalation.
        .cancel_limit(u32::MAX, Duration::from_secs(1))
        .probe_address(([127, 0, 0, 1], 0).into())
        .metrics_address(Some(([127, 0, 0, 1], 0).into()))
        .debug_address(Some(([127, 0, 0, 1], 0).into()))
        .watch_runtime(runtime.handle().clone())
        .start()
        .expect("the watchdog starts");
    let probe = watchdog.probe_address().expect("a probe server");
    let metrics = watchdog.metrics_address().expect("a metrics server");
    let debug = watchdog.debug_address().expect("a debug server");

    let stop = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicU64::new(0));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let handle = watchdog.registry().controller("soak", "ConfigMap");
    let per_sec = u64::from(plan.reconciles_per_sec);
    let (deadline, hang_every, panic_every, drop_every) = (
        plan.deadline,
        plan.hang_every,
        plan.panic_every,
        plan.drop_every,
    );
    runtime.spawn({
        let (stop, completed, counts) = (
            Arc::clone(&stop),
            Arc::clone(&completed),
            Arc::clone(&counts),
        );
        async move {
            // Every tick starts as many reconciles as are due by the clock, not a fixed
            // number per tick: ticks the timer misses under load (a skipped millisecond)
            // are made up by the next, so the offered rate is the planned one.
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let began = tokio::time::Instant::now();
            let mut n = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let elapsed_us = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
                let due = elapsed_us.saturating_mul(per_sec) / 1_000_000;
                while n < due {
                    n += 1;
                    let object = ObjectKey::namespaced("default", &format!("object-{}", n % 1000));
                    let kind: u8 = if n.is_multiple_of(hang_every) {
                        0
                    } else if n % panic_every == 1 {
                        1
                    } else if n % drop_every == 2 {
                        2
                    } else {
                        3
                    };
                    let reconcile = handle.guard(object, async move {
                        match kind {
                            0 => tokio::time::sleep(deadline * 3).await,
                            1 => panic!("soak: a panic on purpose"),
                            2 => tokio::time::sleep(Duration::from_millis(50)).await,
                            _ => tokio::task::yield_now().await,
                        }
                        Ok::<_, ()>(())
                    });
                    let (completed, counts) = (Arc::clone(&completed), Arc::clone(&counts));
                    tokio::spawn(async move {
                        if kind == 2 {
                            // The caller gives up first: the guard ends as dropped.
                            let _ =
                                tokio::time::timeout(Duration::from_millis(10), reconcile).await;
                        } else {
                            let _ = reconcile.await;
                        }
                        if kind < 3 {
                            counts[usize::from(kind)].fetch_add(1, Ordering::Relaxed);
                        }
                        completed.fetch_add(1, Ordering::Relaxed);
                    });
                }
            }
        }
    });

    let scrapes = AtomicU64::new(0);
    let failures = AtomicU64::new(0);
    let started = Instant::now();
    let mut samples = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            // Probes ten times a second, metrics every second, the debug view every
            // five: a new connection each, as the kubelet and Prometheus do.
            let mut round = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                let mut targets = vec![(probe, "/healthz"), (probe, "/readyz")];
                if round.is_multiple_of(10) {
                    targets.push((metrics, "/metrics"));
                }
                if round.is_multiple_of(50) {
                    targets.push((debug, "/debug/reconciles"));
                }
                for (addr, path) in targets {
                    let ok = Client::connect(addr)
                        .and_then(|mut c| c.get(path))
                        .is_ok_and(|status| status == 200 || status == 500);
                    scrapes.fetch_add(1, Ordering::Relaxed);
                    if !ok {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                round += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        while started.elapsed() < plan.duration {
            std::thread::sleep(plan.sample_every);
            let reading = sample(
                started.elapsed(),
                completed.load(Ordering::Relaxed),
                watchdog.registry().len(),
            );
            eprintln!("soak: {reading:?}");
            samples.push(reading);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = started.elapsed();
    runtime.shutdown_timeout(Duration::from_secs(5));
    let _ = std::panic::take_hook();
    Soak {
        samples,
        scrapes: scrapes.load(Ordering::Relaxed),
        scrape_failures: failures.load(Ordering::Relaxed),
        hangs: counts[0].load(Ordering::Relaxed),
        panics: counts[1].load(Ordering::Relaxed),
        dropped: counts[2].load(Ordering::Relaxed),
        elapsed,
    }
}
