//! Registration latency while the monitor scans a large registry, beside the same with no scan running.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reconcile_watchdog::guard::ObjectKey;

use crate::memory::status_field;
use crate::support::InFlightSet;

/// Registrations timed one by one, split by what the thread's context switches say
/// happened during each.
#[derive(Default)]
pub struct Registrations {
    /// No context switch: the thread ran the registration through.
    pub ran_through: Vec<Duration>,
    /// A voluntary switch and no involuntary one: the thread parked, which during a
    /// registration means it waited for a shard lock.
    pub parked: Vec<Duration>,
    /// An involuntary switch: the kernel gave the CPU to another thread meanwhile.
    pub preempted: Vec<Duration>,
}

impl Registrations {
    /// Every registration's time.
    pub fn all(&self) -> Vec<Duration> {
        self.ran_through
            .iter()
            .chain(&self.parked)
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
    /// How many times the kernel switched the scanning thread out involuntarily; as it
    /// scans back to back, it holds a shard's read lock almost all the time.
    pub scanner_preempted: u64,
}

/// The calling thread's counts of voluntary and involuntary context switches, from
/// `/proc/thread-self/status` (read with `pread`, so the file is opened once per thread).
pub struct Switches {
    status: File,
    buf: Vec<u8>,
}

impl Switches {
    pub fn for_this_thread() -> Self {
        Self {
            status: File::open("/proc/thread-self/status")
                .expect("/proc/thread-self/status: the registration bench needs Linux"),
            buf: vec![0; 4096],
        }
    }

    /// (voluntary, involuntary).
    pub fn count(&mut self) -> (u64, u64) {
        let n = self.status.read_at(&mut self.buf, 0).expect("read status");
        let text = std::str::from_utf8(&self.buf[..n]).expect("status is text");
        let field = |name: &str| {
            status_field(text, name).unwrap_or_else(|| panic!("{name} in /proc/thread-self/status"))
        };
        (
            field("voluntary_ctxt_switches"),
            field("nonvoluntary_ctxt_switches"),
        )
    }
}

/// Fills a registry with `in_flight` reconciles, then for `duration` registers and
/// ends reconciles back to back on this thread, timing each registration: first
/// alone, then while a second thread runs monitor scans (snapshot and verdict)
/// continuously. Each registration is classed by the thread's context switches during
/// it (read before and after, untimed).
///
/// Each registration goes through a controller handle of its own (made untimed), so that
/// no spare entry of the thread fits it and every one inserts into the map: the path
/// that can meet a shard a scan holds. (A registration that reuses a spare takes no
/// lock at all.)
pub fn run(in_flight: usize, duration: Duration) -> InsertLatency {
    let mut set = InFlightSet::new(in_flight);
    let registry = set.registry.clone();
    let object = ObjectKey::namespaced("default", "inserted");
    let register_for = |duration: Duration| {
        let mut switches = Switches::for_this_thread();
        let mut seen = Registrations::default();
        let end = Instant::now() + duration;
        let mut before = switches.count();
        while Instant::now() < end {
            let handle = registry.controller("inserter", "ConfigMap");
            let start = Instant::now();
            let guard = handle.register(object.clone());
            let took = start.elapsed();
            drop(guard);
            let after = switches.count();
            let class = if after.1 != before.1 {
                &mut seen.preempted
            } else if after.0 != before.0 {
                &mut seen.parked
            } else {
                &mut seen.ran_through
            };
            class.push(took);
            before = after;
        }
        seen
    };

    let idle = register_for(duration);
    let scanning = AtomicBool::new(true);
    let (during_scans, (scans, scanner_preempted)) = std::thread::scope(|s| {
        let scanner = s.spawn(|| {
            let mut switches = Switches::for_this_thread();
            let (_, preempted_before) = switches.count();
            let mut scans = 0;
            while scanning.load(Ordering::Relaxed) {
                assert!(set.scan() >= in_flight);
                scans += 1;
            }
            (scans, switches.count().1 - preempted_before)
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
        scanner_preempted,
    }
}
