//! Mass failure: thousands of reconciles overdue at once. How long the real monitor thread takes per scan (snapshot, verdict, marking, reports, then the metrics), and how long a registration takes meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reconcile_watchdog::guard::{ObjectKey, Registry};
use reconcile_watchdog::health::Health;
use reconcile_watchdog::internals::{Config, MetricsInternals, Monitor, Observer, Scan};
use reconcile_watchdog::metrics::Metrics;

use crate::http::quantile;
use crate::insert_latency::{Registrations, Switches};

/// What one run measured.
pub struct MassOverdue {
    /// Reconciles overdue at once.
    pub overdue: usize,
    /// The scan that found the most of them newly overdue (usually all).
    pub first_scan: Duration,
    /// The CPU time the monitor thread spent on it (and its sleep's wake-up), from
    /// the kernel's schedstat: what the machine's other load does not inflate.
    pub first_scan_cpu: Duration,
    /// The CPU time of every later scan.
    pub later_scans_cpu: Vec<Duration>,
    /// How many that scan found newly overdue.
    pub first_scan_newly: usize,
    /// Every later scan (all still overdue; reminders due every deadline).
    pub later_scans: Vec<Duration>,
    /// Registrations timed one by one while the scans ran, by what the thread's
    /// context switches say happened during each.
    pub registrations: Registrations,
}

impl MassOverdue {
    /// One line of figures.
    pub fn summary(&mut self) -> String {
        let scans = &mut self.later_scans;
        let mut all = self.registrations.all();
        let worst = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
        let over = |v: &[Duration]| v.iter().filter(|d| **d > Duration::from_millis(1)).count();
        let r = &self.registrations;
        format!(
            "{} overdue at once: first scan ({} newly hung) {:.2} ms (CPU {:.2} ms), later scans median {:.2} ms (CPU {:.2} ms), max {:.2} ms (CPU {:.2} ms) ({} scans); \
             registrations during them: {} timed, p99.9 {:.1} us, max {:.3} ms; \
             ran through: worst {:.3} ms, {} over 1 ms of {}; parked (a lock wait): worst {:.3} ms, {} over 1 ms of {}; \
             preempted: worst {:.3} ms, {} over 1 ms of {}",
            self.overdue,
            self.first_scan_newly,
            ms(self.first_scan),
            ms(self.first_scan_cpu),
            ms(quantile(scans, 0.5)),
            ms(quantile(&mut self.later_scans_cpu, 0.5)),
            ms(quantile(scans, 1.0)),
            ms(quantile(&mut self.later_scans_cpu, 1.0)),
            scans.len(),
            all.len(),
            quantile(&mut all, 0.999).as_secs_f64() * 1e6,
            ms(quantile(&mut all, 1.0)),
            ms(worst(&r.ran_through)),
            over(&r.ran_through),
            r.ran_through.len(),
            ms(worst(&r.parked)),
            over(&r.parked),
            r.parked.len(),
            ms(worst(&r.preempted)),
            over(&r.preempted),
            r.preempted.len(),
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Times each scan: the monitor's own measure (snapshot, verdict, marking, reports) plus
/// the metrics' update, which the monitor makes after it.
struct Timed {
    metrics: Arc<Metrics>,
    /// Per scan: newly hung, wall time, CPU time.
    scans: Mutex<Vec<(usize, Duration, Duration)>>,
    /// The monitor thread's CPU time at the end of the previous scan.
    cpu_before: Mutex<Option<Duration>>,
}

/// The calling thread's CPU time so far: the first field of its schedstat, in
/// nanoseconds.
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("/proc/thread-self/schedstat: the mass bench needs Linux");
    let ns = text
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("schedstat starts with the CPU time in ns");
    Duration::from_nanos(ns)
}

impl Observer for Timed {
    fn scanned(&self, scan: &Scan<'_>) {
        let began = Instant::now();
        Observer::scanned(&*self.metrics, scan);
        let took = scan.took + began.elapsed();
        let cpu_now = thread_cpu();
        let mut before = self.cpu_before.lock().unwrap_or_else(|p| p.into_inner());
        // Between two scans the thread only sleeps: the difference is this scan's.
        let cpu = before.map_or(Duration::ZERO, |b| cpu_now.saturating_sub(b));
        *before = Some(cpu_now);
        let newly = scan.decision.newly_hung.len();
        self.scans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((newly, took, cpu));
    }
}

/// `overdue` reconciles of two controllers go past their deadline together; the real
/// monitor thread scans them every `interval` for `for_how_long` while this thread
/// registers and drops a reconcile of a third controller back to back.
pub fn run(overdue: usize, interval: Duration, for_how_long: Duration) -> MassOverdue {
    let deadline = Duration::from_millis(200);
    let health = Health::new();
    let metrics = Metrics::new(Arc::new(Health::new()));
    let registry = Registry::with_observer(deadline, metrics.clone());
    let timed = Arc::new(Timed {
        metrics,
        scans: Mutex::default(),
        cpu_before: Mutex::default(),
    });
    let controllers = [
        registry.controller("configtemplates", "ConfigTemplate"),
        registry.controller("secrets", "Secret"),
    ];
    let guards: Vec<_> = (0..overdue)
        .map(|i| controllers[i % 2].register(ObjectKey::namespaced("ns", &format!("o-{i}"))))
        .collect();
    let monitor = Monitor::spawn(
        registry.clone(),
        &health,
        Config {
            interval,
            ..Config::default()
        },
        None,
        Some(Arc::clone(&timed) as Arc<dyn Observer>),
    )
    .expect("the monitor starts");

    let other = registry
        .controller("fresh", "Widget")
        .with_deadline(Duration::from_secs(3600));
    let key = ObjectKey::namespaced("ns", "fresh");
    let stop = AtomicBool::new(false);
    let mut registrations = Registrations::default();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(deadline + for_how_long);
            stop.store(true, Ordering::Release);
        });
        let mut switches = Switches::for_this_thread();
        while !stop.load(Ordering::Acquire) {
            let (voluntary, involuntary) = switches.count();
            let began = Instant::now();
            let guard = other.register(key.clone());
            let took = began.elapsed();
            let (voluntary_after, involuntary_after) = switches.count();
            drop(guard);
            if involuntary_after > involuntary {
                registrations.preempted.push(took);
            } else if voluntary_after > voluntary {
                registrations.parked.push(took);
            } else {
                registrations.ran_through.push(took);
            }
        }
    });
    monitor.stop();
    drop(guards);

    let scans = std::mem::take(&mut *timed.scans.lock().unwrap_or_else(|p| p.into_inner()));
    let first = (0..scans.len())
        .max_by_key(|i| scans[*i].0)
        .expect("the monitor scanned");
    MassOverdue {
        overdue,
        first_scan: scans[first].1,
        first_scan_cpu: scans[first].2,
        first_scan_newly: scans[first].0,
        later_scans: scans[first + 1..].iter().map(|s| s.1).collect(),
        later_scans_cpu: scans[first + 1..].iter().map(|s| s.2).collect(),
        registrations,
    }
}
