//! Registration latency while the monitor scans a large registry, beside the same with no scan running.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reconcile_watchdog::guard::ObjectKey;

use crate::support::InFlightSet;

/// Registration latencies with and without a scanner, and the scans that ran.
pub struct InsertLatency {
    /// Reconciles in flight throughout.
    pub in_flight: usize,
    /// One registration's time, no scan running.
    pub idle: Vec<Duration>,
    /// One registration's time while another thread scans back to back.
    pub during_scans: Vec<Duration>,
    /// How many scans ran meanwhile.
    pub scans: usize,
}

/// Fills a registry with `in_flight` reconciles, then for `duration` registers and
/// ends reconciles back to back on this thread, timing each registration: first
/// alone, then while a second thread runs monitor scans (snapshot and verdict)
/// continuously.
pub fn run(in_flight: usize, duration: Duration) -> InsertLatency {
    let mut set = InFlightSet::new(in_flight);
    let handle = set.registry.controller("inserter", "ConfigMap");
    let object = ObjectKey::namespaced("default", "inserted");
    let register_for = |duration: Duration| {
        let mut latencies = Vec::with_capacity(1 << 20);
        let end = Instant::now() + duration;
        while Instant::now() < end {
            let start = Instant::now();
            let guard = handle.register(object.clone());
            latencies.push(start.elapsed());
            drop(guard);
        }
        latencies
    };

    let idle = register_for(duration);
    let scanning = AtomicBool::new(true);
    let (during_scans, scans) = std::thread::scope(|s| {
        let scanner = s.spawn(|| {
            let mut scans = 0;
            while scanning.load(Ordering::Relaxed) {
                assert!(set.scan() >= in_flight);
                scans += 1;
            }
            scans
        });
        let latencies = register_for(duration);
        scanning.store(false, Ordering::Relaxed);
        (latencies, scanner.join().expect("the scanner panicked"))
    });
    InsertLatency {
        in_flight,
        idle,
        during_scans,
        scans,
    }
}
