//! The HTTP surface under load (`probes`) and the soak (`soak DURATION`).
//!
//! `cargo bench --bench http_surface -- probes`: `/healthz` latency while
//! `/debug/reconciles` is fetched in a loop with 100,000 reconciles in flight, and
//! while 3,000 half-open connections flood the probe port.
//! `cargo bench --bench http_surface -- soak 30m`: 10,000 reconciles/s with hangs,
//! cancellations and panics, probes, metrics and debug views scraped throughout;
//! resident memory, descriptors and threads sampled every 10 seconds.
//! `cargo bench --bench http_surface -- probe-load`: `/healthz` at 2,000 requests a
//! second beside 10,000 guarded reconciles a second, and a server answering `ok` (the
//! load program's probe figure, alone).
//! `cargo test --all-targets` runs both once at toy sizes and asserts only that they
//! work; the soak is not part of CI.

mod debug_load;
mod flood;
#[path = "../load/http.rs"]
mod http;
#[path = "../load/memory.rs"]
#[allow(dead_code)]
mod memory;
#[path = "../load/probe_load.rs"]
mod probe_load;
mod soak;
#[path = "../support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::time::Duration;

use http::quantile;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let full = support::benchmarking();
    match args.first().map(String::as_str) {
        Some("soak") => {
            let duration = args
                .get(1)
                .map_or(Ok(Duration::from_secs(1800)), |d| {
                    humantime::parse_duration(d)
                })
                .expect("usage: soak DURATION (e.g. 30m)");
            soak::run(&soak::Plan::full(duration)).print();
        }
        Some("probe-load") => probe_load(),
        Some("probes") | None if full => probes(true),
        // `cargo test --all-targets`: everything once, small and short.
        _ => {
            probes(false);
            soak::run(&soak::Plan::quick()).print();
        }
    }
}

fn probes(full: bool) {
    let debug = debug_load::run(&if full {
        debug_load::Plan::full()
    } else {
        debug_load::Plan::quick()
    });
    println!("{}", debug.render());
    let flood = flood::run(&if full {
        flood::Plan::full()
    } else {
        flood::Plan::quick()
    });
    println!("{}", flood.render());
}

/// The load program's probe figure alone: `/healthz` of the real probe server and of a
/// server answering `ok`, in alternating turns, beside 10,000 guarded reconciles a second.
fn probe_load() {
    let run = probe_load::run(&probe_load::Plan {
        requests_per_sec: 2_000,
        connections: 2,
        reconciles_per_sec: 10_000,
        turn: Duration::from_secs(5),
        turns: 3,
    });
    for (name, mut samples) in [("/healthz", run.probe), ("server answering ok", run.bare)] {
        let mut us = |p| quantile(&mut samples.latencies, p).as_secs_f64() * 1e6;
        let (p50, p99) = (us(0.5), us(0.99));
        println!(
            "{name}: p50 {p50:.1} µs, p99 {p99:.1} µs ({} requests, {} not 200, {} sent late)",
            samples.latencies.len(),
            samples.not_ok,
            samples.late
        );
    }
    println!("reconciles completed: {:.0}/s", run.reconciles_per_sec);
}

/// `p50 / p99 / max` of `samples`, in milliseconds.
fn summary(samples: &mut [Duration]) -> String {
    if samples.is_empty() {
        return "no samples".into();
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} requests)",
        ms(quantile(samples, 0.5)),
        ms(quantile(samples, 0.99)),
        ms(quantile(samples, 1.0)),
        samples.len()
    )
}
