//! Mass failure: thousands of reconciles overdue at once. How long the real monitor thread takes per scan (snapshot, verdict, marking, reports, then the metrics), and how long a registration takes meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reconcile_watchdog::guard::{ObjectKey, Registry};
use reconcile_watchdog::health::Health;
use reconcile_watchdog::metrics::Metrics;
use reconcile_watchdog::monitor::{self, Config, Monitor, Scan};

use crate::http::quantile;

/// What one run measured.
pub struct MassOverdue {
    /// Reconciles overdue at once.
    pub overdue: usize,
    /// The scan that found the most of them newly overdue (usually all).
    pub first_scan: Duration,
    /// How many that scan found newly overdue.
    pub first_scan_newly: usize,
    /// Every later scan (all still overdue; reminders due every deadline).
    pub later_scans: Vec<Duration>,
    /// Registrations timed one by one while the scans ran.
    pub registrations: Vec<Duration>,
}

impl MassOverdue {
    /// One line of figures.
    pub fn summary(&mut self) -> String {
        let scans = &mut self.later_scans;
        let regs = &mut self.registrations;
        format!(
            "{} overdue at once: first scan ({} newly hung) {:.2} ms, later scans median {:.2} ms, max {:.2} ms ({} scans); \
             registrations during them: {} timed, p99.9 {:.1} us, max {:.3} ms, over 1 ms: {}",
            self.overdue,
            self.first_scan_newly,
            ms(self.first_scan),
            ms(quantile(scans, 0.5)),
            ms(quantile(scans, 1.0)),
            scans.len(),
            regs.len(),
            quantile(regs, 0.999).as_secs_f64() * 1e6,
            ms(quantile(regs, 1.0)),
            regs.iter()
                .filter(|d| **d > Duration::from_millis(1))
                .count(),
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
    scans: Mutex<Vec<(usize, Duration)>>,
}

impl monitor::Observer for Timed {
    fn scanned(&self, scan: &Scan<'_>) {
        let began = Instant::now();
        monitor::Observer::scanned(&*self.metrics, scan);
        let took = scan.took + began.elapsed();
        let newly = scan.decision.newly_hung.len();
        self.scans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((newly, took));
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
        Some(Arc::clone(&timed) as Arc<dyn monitor::Observer>),
    )
    .expect("the monitor starts");

    let other = registry
        .controller("fresh", "Widget")
        .with_deadline(Duration::from_secs(3600));
    let key = ObjectKey::namespaced("ns", "fresh");
    let stop = AtomicBool::new(false);
    let mut registrations = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(deadline + for_how_long);
            stop.store(true, Ordering::Release);
        });
        while !stop.load(Ordering::Acquire) {
            let began = Instant::now();
            let guard = other.register(key.clone());
            registrations.push(began.elapsed());
            drop(guard);
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
        first_scan_newly: scans[first].0,
        later_scans: scans[first + 1..].iter().map(|(_, took)| *took).collect(),
        registrations,
    }
}
