//! Registration latency while the monitor scans a large registry, beside the same with no scan running.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reconcile_watchdog::guard::ObjectKey;

use crate::support::InFlightSet;

/// Registrations timed one by one, split by whether the kernel preempted the thread
/// during the registration.
#[derive(Default)]
pub struct Registrations {
    /// Registrations during which the thread kept its CPU.
    pub kept_cpu: Vec<Duration>,
    /// Registrations during which the kernel switched the thread out involuntarily:
    /// their time includes however long another thread ran in its place.
    pub preempted: Vec<Duration>,
}

impl Registrations {
    /// The slowest registration, preempted or not.
    pub fn worst(&self) -> Duration {
        self.kept_cpu
            .iter()
            .chain(&self.preempted)
            .copied()
            .max()
            .unwrap_or_default()
    }

    /// Every registration's time.
    pub fn all(&self) -> Vec<Duration> {
        self.kept_cpu
            .iter()
            .chain(&self.preempted)
            .copied()
            .collect()
    }
}

/// Registration latencies with and without a scanner, and the scans that ran.
pub struct InsertLatency {
    /// Reconciles in flight throughout.
    pub in_flight: usize,
    /// No scan running.
    pub idle: Registrations,
    /// While another thread scans back to back.
    pub during_scans: Registrations,
    /// How many scans ran meanwhile.
    pub scans: usize,
}

/// The calling thread's count of involuntary context switches, from
/// `/proc/thread-self/status` (read with `pread`, so the file is opened once per thread).
struct Preemptions {
    status: File,
    buf: Vec<u8>,
}

impl Preemptions {
    fn for_this_thread() -> Self {
        Self {
            status: File::open("/proc/thread-self/status")
                .expect("/proc/thread-self/status: the registration bench needs Linux"),
            buf: vec![0; 4096],
        }
    }

    fn count(&mut self) -> u64 {
        let n = self.status.read_at(&mut self.buf, 0).expect("read status");
        let text = std::str::from_utf8(&self.buf[..n]).expect("status is text");
        text.lines()
            .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("nonvoluntary_ctxt_switches in status")
    }
}

/// Fills a registry with `in_flight` reconciles, then for `duration` registers and
/// ends reconciles back to back on this thread, timing each registration: first
/// alone, then while a second thread runs monitor scans (snapshot and verdict)
/// continuously. Each registration is classed by whether the thread was preempted
/// during it (its involuntary switch count, read before and after, untimed).
pub fn run(in_flight: usize, duration: Duration) -> InsertLatency {
    let mut set = InFlightSet::new(in_flight);
    let handle = set.registry.controller("inserter", "ConfigMap");
    let object = ObjectKey::namespaced("default", "inserted");
    let register_for = |duration: Duration| {
        let mut preemptions = Preemptions::for_this_thread();
        let mut seen = Registrations::default();
        let end = Instant::now() + duration;
        let mut before = preemptions.count();
        while Instant::now() < end {
            let start = Instant::now();
            let guard = handle.register(object.clone());
            let took = start.elapsed();
            drop(guard);
            let after = preemptions.count();
            if after == before {
                seen.kept_cpu.push(took);
            } else {
                seen.preempted.push(took);
            }
            before = after;
        }
        seen
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
