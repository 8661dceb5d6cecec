//! What the termination message costs at exit: its size for 1, 10 and 150 hung
//! reconciles (printed, always at most 4096 bytes), and the time writing it adds to the
//! shutdown (a criterion bench of the write: a thread of its own, a temporary file
//! renamed over the path, and the wait for it).
//!
//! `cargo bench --bench termination_message`; the figures are in docs/performance.md.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::{Guard, ObjectKey};
use reconcile_watchdog::internals::restart::{termination_message, write};

/// `n` reconciles hung past a short deadline, and the message the watchdog would write.
fn hung(n: usize) -> (Watchdog, Vec<Guard>, String) {
    let watchdog = Watchdog::builder()
        .deadlines(Duration::from_millis(20))
        .interval(Duration::from_millis(10))
        .stack_capture_after(None)
        .start()
        .expect("the watchdog starts");
    let controller = watchdog
        .registry()
        .controller("configtemplates", "ConfigTemplate");
    let guards: Vec<Guard> = (0..n)
        .map(|i| controller.register(ObjectKey::namespaced("shop", &format!("app-config-{i:03}"))))
        .collect();
    let started = Instant::now();
    let message = loop {
        if let Some(message) = termination_message(&watchdog)
            && message.contains(&format!("; {n} reconcile"))
        {
            break message;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "liveness never failed"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    (watchdog, guards, message)
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("termination-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

fn bench(c: &mut Criterion) {
    let dir = scratch();
    let path = dir.join("termination-log");
    let mut group = c.benchmark_group("termination_message");
    for n in [1, 10, 150] {
        let (_watchdog, _guards, message) = hung(n);
        let named = message
            .lines()
            .filter(|l| l.starts_with("configtemplates "))
            .count();
        println!(
            "termination message for {n} hung reconciles: {} bytes, {named} named{}",
            message.len(),
            if named < n { ", the rest counted" } else { "" }
        );
        assert!(message.len() <= 4096);
        group.bench_function(format!("write/{n}"), |b| {
            b.iter(|| write(&path, message.clone()));
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
