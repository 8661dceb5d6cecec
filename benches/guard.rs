//! Criterion benches: a guarded reconcile beside its floor, the bare future and a timer per reconcile, on 1 and 2 threads; the monitor's scan, and a rescue's copy of the reconciles in a poll, at 1,000 to 100,000 in flight; what an end-of-reconcile observer (the deadline advisor, the metrics) adds; and a controller's handle asked for by name, and the scrape with 1,000 controllers.

mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use support::{FloorScan, InFlightSet, Ops, Shape, Variant, benchmarking, run_on_threads};

/// `guard_{1,2}_thread/{variant}/{shape}`: the time of one reconcile, enter to exit, on
/// each of `threads` threads running at once against the same map.
fn guard_overhead(c: &mut Criterion) {
    let ops = Ops::new();
    for threads in [1, 2] {
        let mut group = c.benchmark_group(format!("guard_{threads}_thread"));
        for shape in Shape::ALL {
            for variant in Variant::ALL.into_iter().chain(Variant::PARTS_OFF) {
                group.bench_with_input(
                    BenchmarkId::new(variant.name(), shape.name()),
                    &(variant, shape),
                    |b, &(variant, shape)| {
                        b.iter_custom(|iters| run_on_threads(&ops, threads, iters, variant, shape));
                    },
                );
            }
        }
        group.finish();
    }
    assert!(ops.is_idle(), "every reconcile left its map");
}

/// `scan/{len}`: one monitor scan (snapshot and verdict) with `len` reconciles in
/// flight; `scan/floor/{len}`: a pass that only checks each entry's deadline;
/// `scan/in_poll/{len}`: the copy a runtime rescue makes of the reconciles inside a poll.
fn scan(c: &mut Criterion) {
    let sizes: &[usize] = if benchmarking() {
        // 100: a small operator's scan, what most pay every interval.
        &[100, 1_000, 10_000, 100_000]
    } else {
        &[10, 100, 1_000]
    };
    let mut group = c.benchmark_group("scan");
    for &len in sizes {
        let mut set = InFlightSet::new(len);
        group.bench_function(BenchmarkId::from_parameter(len), |b| {
            b.iter(|| black_box(set.scan()));
        });
        assert_eq!(set.scan(), len);
        group.bench_function(BenchmarkId::new("in_poll", len), |b| {
            b.iter(|| black_box(set.in_poll()));
        });
        assert_eq!(set.in_poll(), 0);
        let floor = FloorScan::new(len);
        group.bench_function(BenchmarkId::new("floor", len), |b| {
            b.iter(|| black_box(floor.count_overdue(Instant::now())));
        });
        assert_eq!(floor.count_overdue(Instant::now()), 0);
    }
    group.finish();
}

/// `observed/{observer}`: one guarded `ready` reconcile on one thread, with the
/// registry's end-of-reconcile observer: none, the deadline advisor (a duration sketch
/// per controller), the metrics, or both as the watchdog wires them. Its difference from
/// `observed/none` is what an observer costs per reconcile (the deadline advisor's
/// figures in docs/performance.md are measured with it).
fn observed(c: &mut Criterion) {
    use std::sync::Arc;

    use reconcile_watchdog::guard::{Fanout, ObjectKey, Observer, Registry};
    use reconcile_watchdog::health::Health;
    use reconcile_watchdog::internals::MetricsInternals;
    use reconcile_watchdog::internals::deadlines::Advisor;
    use reconcile_watchdog::metrics::Metrics;

    let metrics = || Metrics::new(Arc::new(Health::new())) as Arc<dyn Observer>;
    let advisor = || Advisor::new() as Arc<dyn Observer>;
    let observers: [(&str, Option<Arc<dyn Observer>>); 4] = [
        ("none", None),
        ("advisor", Some(advisor())),
        ("metrics", Some(metrics())),
        (
            "advisor_and_metrics",
            Some(Arc::new(Fanout::new().with(advisor()).with(metrics()))),
        ),
    ];
    let mut group = c.benchmark_group("observed");
    for (name, observer) in observers {
        let registry = match observer {
            Some(observer) => Registry::with_observer(support::DEADLINE, observer),
            None => Registry::new(support::DEADLINE),
        };
        // Three controllers, as in the demo: the advisor finds the last one's sketch.
        for other in ["configmap-sync", "deployment-scaler"] {
            registry
                .controller(other, "Widget")
                .register(ObjectKey::cluster("warm-up"))
                .finish(reconcile_watchdog::guard::Outcome::Ok);
        }
        let handle = registry.controller("cert-renewer", "Certificate");
        let object = ObjectKey::namespaced("default", "object");
        group.bench_function(name, |b| {
            b.iter(|| {
                black_box(support::drive(
                    handle.guard(object.clone(), support::NoOp::new(Shape::Ready)),
                ))
            });
        });
        assert!(registry.is_empty());
    }
    group.finish();
}

/// `controllers/by_name`: a handle asked for by a name already live (a lock and a
/// look-up); `controllers/by_name_retired`: the same with no handle held between calls,
/// as a handle asked for per reconcile is (the retired controller taken back);
/// `controllers/scrape/{names}`: one encoding of the metrics with that many controllers
/// live (at most 64 have series of their own, the rest share `other`). Prints each
/// scrape's size.
fn controllers(c: &mut Criterion) {
    use std::sync::Arc;

    use reconcile_watchdog::guard::{Observer, Registry};
    use reconcile_watchdog::health::Health;
    use reconcile_watchdog::internals::MetricsInternals;
    use reconcile_watchdog::metrics::Metrics;

    let mut group = c.benchmark_group("controllers");
    let registry = Registry::new(support::DEADLINE);
    let held = registry.controller("docs", "Document");
    group.bench_function("by_name", |b| {
        b.iter(|| black_box(registry.controller(black_box("docs"), "Document")));
    });
    drop(held);
    group.bench_function("by_name_retired", |b| {
        b.iter(|| black_box(registry.controller(black_box("docs"), "Document")));
    });
    for names in [64, 1_000] {
        let metrics = Metrics::new(Arc::new(Health::new()));
        let registry =
            Registry::with_observer(support::DEADLINE, Arc::clone(&metrics) as Arc<dyn Observer>);
        let handles: Vec<_> = (0..names)
            .map(|i| registry.controller(&format!("controller-{i}"), "Widget"))
            .collect();
        let text = metrics.encode();
        println!(
            "controllers/scrape/{names}: {} bytes, {} lines",
            text.len(),
            text.lines().count()
        );
        group.bench_function(BenchmarkId::new("scrape", names), |b| {
            b.iter(|| black_box(metrics.encode()));
        });
        drop(handles);
    }
    group.finish();
}

/// `reference/instant_now`: one monotonic clock read, the unit the guard's cost is
/// mostly made of.
fn clock(c: &mut Criterion) {
    let mut group = c.benchmark_group("reference");
    group.bench_function("instant_now", |b| b.iter(Instant::now));
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = guard_overhead, scan, clock, observed, controllers
}
criterion_main!(benches);
