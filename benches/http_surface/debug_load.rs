//! `/healthz` latency while `/debug/reconciles` is fetched in a loop with many
//! reconciles in flight: the two are served on separate threads, so the heavy view
//! must not show in the probe's latency. Turns with and without the debug loop
//! alternate, so that drift in the machine's load hits both.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::{Deadlines, ObjectKey};

use crate::http::{Client, Samples, constant_rate};
use crate::summary;

pub struct Plan {
    in_flight: usize,
    requests_per_sec: u32,
    turn: Duration,
    turns: usize,
    /// The `?limit=` of each debug fetch: every row.
    rows: usize,
}

impl Plan {
    pub fn full() -> Self {
        Self {
            in_flight: 100_000,
            requests_per_sec: 200,
            turn: Duration::from_secs(10),
            turns: 3,
            rows: 100_000,
        }
    }

    pub fn quick() -> Self {
        Self {
            in_flight: 1_000,
            requests_per_sec: 100,
            turn: Duration::from_millis(300),
            turns: 1,
            rows: 1_000,
        }
    }
}

pub struct DebugLoad {
    in_flight: usize,
    quiet: Samples,
    loaded: Samples,
    debug_fetches: u64,
    debug_seconds: f64,
}

impl DebugLoad {
    pub fn render(mut self) -> String {
        #[allow(clippy::cast_precision_loss)]
        let per_fetch = self.debug_seconds / self.debug_fetches.max(1) as f64;
        format!(
            "/healthz with {} reconciles in flight\n  debug views idle:    {} (not 200: {}, late: {})\n  /debug/reconciles in a loop: {} (not 200: {}, late: {}); {} debug fetches, {:.0} ms each",
            self.in_flight,
            summary(&mut self.quiet.latencies),
            self.quiet.not_ok,
            self.quiet.late,
            summary(&mut self.loaded.latencies),
            self.loaded.not_ok,
            self.loaded.late,
            self.debug_fetches,
            per_fetch * 1000.0,
        )
    }
}

pub fn run(plan: &Plan) -> DebugLoad {
    let watchdog = Watchdog::builder()
        .deadlines(Deadlines::new(Duration::from_secs(3600)))
        .probe_address(([127, 0, 0, 1], 0).into())
        .debug_address(Some(([127, 0, 0, 1], 0).into()))
        .start()
        .expect("the watchdog starts");
    let probe = watchdog.probe_address().expect("a probe server");
    let debug = watchdog.debug_address().expect("a debug server");
    let handle = watchdog.registry().controller("load", "ConfigMap");
    let _guards: Vec<_> = (0..plan.in_flight)
        .map(|i| handle.register(ObjectKey::namespaced("default", &format!("object-{i}"))))
        .collect();

    let mut quiet = Samples::default();
    let mut loaded = Samples::default();
    let fetches = AtomicU64::new(0);
    let fetch_nanos = AtomicU64::new(0);
    let path = format!("/debug/reconciles?limit={}", plan.rows);
    for _ in 0..plan.turns {
        quiet.merge(
            constant_rate(probe, "/healthz", plan.requests_per_sec, 1, plan.turn)
                .expect("the probe answers"),
        );
        let stop = Arc::new(AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut client = Client::connect(debug).expect("the debug server answers");
                while !stop.load(Ordering::Relaxed) {
                    let started = std::time::Instant::now();
                    assert_eq!(client.get(&path).expect("a debug fetch"), 200);
                    fetch_nanos.fetch_add(
                        u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
                        Ordering::Relaxed,
                    );
                    fetches.fetch_add(1, Ordering::Relaxed);
                }
            });
            loaded.merge(
                constant_rate(probe, "/healthz", plan.requests_per_sec, 1, plan.turn)
                    .expect("the probe answers"),
            );
            stop.store(true, Ordering::Relaxed);
        });
    }
    #[allow(clippy::cast_precision_loss)]
    let debug_seconds = fetch_nanos.load(Ordering::Relaxed) as f64 / 1e9;
    DebugLoad {
        in_flight: plan.in_flight,
        quiet,
        loaded,
        debug_fetches: fetches.load(Ordering::Relaxed),
        debug_seconds,
    }
}
