//! Probe latency under load: `/healthz` beside a server that answers `ok` without checks, while guarded reconciles run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::Response;
use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::ObjectKey;
use reconcile_watchdog::internals::probes::HttpServer;

use warp::Filter;

use crate::http::{Samples, constant_rate};

/// The load to apply.
pub struct Plan {
    /// Requests per second to each server in its turn.
    pub requests_per_sec: u32,
    /// Client connections (each its own thread).
    pub connections: u32,
    /// Guarded reconciles started per second, throughout.
    pub reconciles_per_sec: u32,
    /// How long each turn lasts.
    pub turn: Duration,
    /// Turns per server; they alternate, so drift in the machine's load hits both.
    pub turns: usize,
}

/// What the run saw.
pub struct ProbeLoad {
    /// `/healthz` of the real probe server.
    pub probe: Samples,
    /// The reference server.
    pub bare: Samples,
    /// Guarded reconciles completed per second over the run.
    pub reconciles_per_sec: f64,
}

/// Runs `plan`: a two-worker runtime starts guarded reconciles at the planned rate
/// (each awaits once), the real watchdog watches it and serves `/healthz`, and a
/// reference server answers `ok`: the same warp server on its own thread, with a
/// handler that runs no check.
pub fn run(plan: &Plan) -> ProbeLoad {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the reconciles");
    let watchdog = Watchdog::builder()
        .probe_address(([127, 0, 0, 1], 0).into())
        .watch_runtime(runtime.handle().clone())
        .start()
        .expect("the watchdog starts");
    let probe_addr = watchdog.probe_address().expect("a probe server");
    let bare = HttpServer::spawn(
        "bare-server",
        ([127, 0, 0, 1], 0).into(),
        warp::any().map(|| Response::new("ok".to_owned())),
    )
    .expect("the reference server starts");

    let stop = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicU64::new(0));
    let handle = watchdog.registry().controller("load", "ConfigMap");
    let per_ms = plan.reconciles_per_sec.div_ceil(1000);
    runtime.spawn({
        let stop = Arc::clone(&stop);
        let completed = Arc::clone(&completed);
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..per_ms {
                    n += 1;
                    let object = ObjectKey::namespaced("default", &format!("object-{}", n % 1000));
                    let reconcile = handle.guard(object, async {
                        tokio::task::yield_now().await;
                        Ok::<_, ()>(())
                    });
                    let completed = Arc::clone(&completed);
                    tokio::spawn(async move {
                        if matches!(reconcile.await, Ok(Ok(()))) {
                            completed.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            }
        }
    });

    let started = Instant::now();
    let mut probe = Samples::default();
    let mut reference = Samples::default();
    for _ in 0..plan.turns {
        for (addr, samples) in [
            (probe_addr, &mut probe),
            (bare.local_addr(), &mut reference),
        ] {
            let turn = constant_rate(
                addr,
                "/healthz",
                plan.requests_per_sec,
                plan.connections,
                plan.turn,
            )
            .expect("the load run talks HTTP");
            samples.merge(turn);
        }
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    #[allow(clippy::cast_precision_loss)]
    let reconciles_per_sec = completed.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64();
    runtime.shutdown_timeout(Duration::from_secs(5));
    ProbeLoad {
        probe,
        bare: reference,
        reconciles_per_sec,
    }
}
