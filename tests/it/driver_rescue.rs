//! One reconcile blocking a worker does not freeze the operator: with the library as an
//! embedder uses it, a reconcile woken by a timer that then blocks its worker leaves
//! an unrelated interval ticking, because the watchdog wakes an idle worker to drive
//! timers and I/O; on a current-thread runtime nobody can, and the stall is reported.
//! A wake is counted and named as a rescue only for a reconcile that held a worker of
//! the watched runtime: not for a busy healthy one, nor one on another runtime.

use crate::support;

use support::blocked_worker;
use support::reports::{capture as capture_reports, reports};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::{ControllerHandle, Deadlines, ObjectKey};
use reconcile_watchdog::monitor::HangPolicy;

/// How long any eventual outcome may take: generous, for a busy two-core machine.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long the blocking reconcile holds its worker.
const BLOCK: Duration = Duration::from_millis(800);
/// The longest gap between its ticks a round may show: timers kept going.
const LONGEST_GAP: Duration = Duration::from_millis(500);
const RESCUE_WARN: &str = "a reconcile blocked a runtime worker in one poll";

/// A multi-thread runtime of `workers` workers.
fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A multi-thread runtime of 4 workers, and a watchdog watching it with its defaults.
fn watched_runtime() -> (tokio::runtime::Runtime, Watchdog) {
    let runtime = runtime(4);
    let watchdog = Watchdog::builder()
        .watch_runtime(runtime.handle().clone())
        .start()
        .expect("the watchdog starts");
    (runtime, watchdog)
}

/// The same, with its metrics collected and a scan (which updates them) every 100 ms.
fn watched_runtime_with_metrics() -> (tokio::runtime::Runtime, Watchdog) {
    let runtime = runtime(4);
    let watchdog = Watchdog::builder()
        .interval(Duration::from_millis(100))
        .collect_metrics()
        .watch_runtime(runtime.handle().clone())
        .start()
        .expect("the watchdog starts");
    (runtime, watchdog)
}

/// The value of the sample `name` (with its labels, as written) in the metrics.
fn sample(watchdog: &Watchdog, name: &str) -> Option<f64> {
    let text = watchdog.metrics().expect("collected").encode();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The rescue series once the scans after `now` have taken every wake so far.
fn rescues_after_a_scan(watchdog: &Watchdog) -> f64 {
    std::thread::sleep(Duration::from_millis(400));
    sample(watchdog, "reconcile_watchdog_driver_rescues_total").expect("the rescue series")
}

/// One round: a multi-thread runtime of 4 workers under the watchdog, and the rescue's
/// scenario ([`blocked_worker::longest_tick_gap`]) with a block of [`BLOCK`].
fn one_round(object: &ObjectKey) -> Duration {
    let (runtime, watchdog) = watched_runtime();
    let controller = watchdog.registry().controller("blocker", "Widget");
    blocked_worker::longest_tick_gap(&runtime, &controller, object, BLOCK)
}

#[test]
fn a_reconcile_blocking_its_worker_leaves_timers_ticking_and_is_named_once() {
    capture_reports();
    let mut gaps = Vec::new();
    for round in 0..10 {
        let object = ObjectKey::namespaced("rounds", &format!("r{round}"));
        let gap = one_round(&object);
        gaps.push(gap);
        assert!(
            gap < LONGEST_GAP,
            "round {round}: timers stopped for {gap:?} (gaps so far {gaps:?})"
        );
        let warns = reports(|r| {
            r.message.starts_with(RESCUE_WARN) && r.field("object") == Some(object.as_str())
        });
        assert_eq!(
            warns.len(),
            1,
            "round {round}: {:#?}",
            reports(|r| r.message.contains("idle worker"))
        );
        let warn = &warns[0];
        assert_eq!(warn.level, tracing::Level::WARN);
        assert_eq!(warn.field("controller"), Some("blocker"), "{warn:?}");
        assert!(
            warn.message
                .contains(&format!("blocker {} in a poll for", object.as_str())),
            "{warn:?}"
        );
        assert!(warn.field("timers_late_up_to").is_some(), "{warn:?}");
    }
    eprintln!("longest tick gaps: {gaps:?}");
    let stalls = reports(|r| {
        r.message.starts_with("async runtime stalled")
            && !r
                .field("in_poll")
                .is_some_and(|p| p.contains("current-thread"))
    });
    assert!(stalls.is_empty(), "{stalls:#?}");
}

/// Runs a guarded reconcile of `object` on `runtime` that sleeps 10 ms and then blocks
/// its worker for `block`, and waits for it to end.
fn block_a_worker(
    runtime: &tokio::runtime::Runtime,
    controller: &ControllerHandle,
    object: &ObjectKey,
    block: Duration,
) {
    let lock = Arc::new(Mutex::new(()));
    let held = lock.lock().unwrap();
    let blocked = Arc::new(Mutex::new(false));
    let reconcile = {
        let (lock, blocked) = (Arc::clone(&lock), Arc::clone(&blocked));
        controller.guard(object.clone(), async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            *blocked.lock().unwrap() = true;
            drop(lock.lock().unwrap());
            Ok::<(), ()>(())
        })
    };
    let reconcile = runtime.spawn(reconcile);
    support::eventually(PATIENCE, "the reconcile to block", || {
        blocked.lock().unwrap().then_some(())
    });
    std::thread::sleep(block);
    drop(held);
    runtime
        .block_on(reconcile)
        .expect("the reconcile task ends")
        .expect("the guard lets it finish")
        .expect("the reconcile ends well");
}

#[test]
fn two_reconciles_blocking_workers_within_the_report_minute_are_both_named() {
    capture_reports();
    let (runtime, watchdog) = watched_runtime();
    let controller = watchdog.registry().controller("twice", "Widget");
    let (first, second) = (
        ObjectKey::namespaced("twice", "first"),
        ObjectKey::namespaced("twice", "second"),
    );
    let names = |object: &ObjectKey| {
        let name = format!("twice {}", object.as_str());
        reports(move |r| {
            r.field("action") == Some("woke an idle worker") && r.message.contains(&name)
        })
    };
    block_a_worker(&runtime, &controller, &first, BLOCK);
    support::eventually(PATIENCE, "the first rescue's WARN", || names(&first).pop());
    // Well within the minute after the first WARN: its rescue is held for the next one.
    block_a_worker(&runtime, &controller, &second, BLOCK);
    // No further rescue comes: the held ones are reported when their minute has passed,
    // or, as here, when the watchdog stops.
    drop(watchdog);
    let held = names(&second);
    assert_eq!(
        held.len(),
        1,
        "{:#?}",
        reports(|r| r.message.contains("twice"))
    );
    let held = &held[0];
    assert_eq!(held.level, tracing::Level::WARN);
    assert!(
        held.message
            .contains("more rescues since the previous report"),
        "{held:?}"
    );
    assert_eq!(held.field("object"), Some(second.as_str()), "{held:?}");
    assert_ne!(held.field("unreported"), Some("0"), "{held:?}");
}

#[test]
fn a_current_thread_runtime_has_nobody_to_wake_and_its_stall_is_reported() {
    capture_reports();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let watchdog = Watchdog::builder()
        .interval(Duration::from_millis(50))
        .runtime_stall_threshold(Duration::from_millis(300))
        .watch_runtime(runtime.handle().clone())
        .start()
        .expect("the watchdog starts");
    let object = ObjectKey::namespaced("current-thread", "blocked");
    let lock = Arc::new(Mutex::new(()));
    let held = lock.lock().unwrap();
    let reconcile = {
        let lock = Arc::clone(&lock);
        watchdog
            .registry()
            .controller("current-thread-blocker", "Widget")
            .guard(object.clone(), async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(lock.lock().unwrap());
                Ok::<(), ()>(())
            })
    };
    let driver = std::thread::spawn(move || runtime.block_on(reconcile));

    let stalled = support::eventually(PATIENCE, "the stall report", || {
        reports(|r| {
            r.message.starts_with("async runtime stalled")
                && r.field("in_poll")
                    .is_some_and(|p| p.contains("current-thread-blocker"))
        })
        .pop()
    });
    assert_eq!(stalled.level, tracing::Level::ERROR);
    assert_eq!(stalled.field("workers"), Some("1"), "{stalled:?}");
    assert_eq!(stalled.field("idle_workers"), Some("0"), "{stalled:?}");
    assert!(
        stalled
            .message
            .contains("0 of 1 workers idle (none to take over timers and I/O)"),
        "{stalled:?}"
    );
    drop(held);
    driver
        .join()
        .expect("the runtime's thread")
        .expect("the guard lets it finish")
        .expect("the reconcile ends well");
    let rescues = reports(|r| {
        r.field("controller") == Some("current-thread-blocker")
            && r.field("action") == Some("woke an idle worker")
    });
    assert!(rescues.is_empty(), "{rescues:#?}");
}

/// A guarded reconcile that computes for `total` in slices of `slice` of CPU with a
/// `yield_now` between them: busy and healthy, never long in one poll.
async fn compute(total: Duration, slice: Duration) -> Result<u32, ()> {
    let started = Instant::now();
    let mut slices = 0;
    while started.elapsed() < total {
        let from = Instant::now();
        while from.elapsed() < slice {
            std::hint::spin_loop();
        }
        slices += 1;
        tokio::task::yield_now().await;
    }
    Ok(slices)
}

#[test]
fn a_busy_healthy_reconcile_is_no_rescue() {
    capture_reports();
    let (runtime, watchdog) = watched_runtime_with_metrics();
    let object = ObjectKey::namespaced("busy", "decoding");
    let reconcile = watchdog.registry().controller("busy", "Widget").guard(
        object.clone(),
        compute(Duration::from_secs(3), Duration::from_millis(2)),
    );
    let slices = runtime
        .block_on(runtime.spawn(reconcile))
        .expect("the reconcile task ends")
        .expect("the guard lets it finish")
        .expect("the reconcile ends well");
    assert!(slices > 100, "{slices} slices");
    let rescues = rescues_after_a_scan(&watchdog);
    let busy = sample(
        &watchdog,
        "reconcile_watchdog_driver_wakes_total{cause=\"busy_worker\"}",
    );
    eprintln!("wakes for a busy worker: {busy:?}");
    assert_eq!(rescues, 0.0, "busy-worker wakes: {busy:?}");
    let named = reports(|r| r.field("object") == Some(object.as_str()));
    assert!(named.is_empty(), "{named:#?}");
}

#[test]
fn a_reconcile_blocking_its_worker_moves_the_rescue_series_and_is_named() {
    capture_reports();
    let (runtime, watchdog) = watched_runtime_with_metrics();
    let controller = watchdog.registry().controller("counted", "Widget");
    let object = ObjectKey::namespaced("counted", "blocker");
    block_a_worker(&runtime, &controller, &object, Duration::from_secs(1));
    let rescues = rescues_after_a_scan(&watchdog);
    assert!(rescues >= 1.0, "{rescues}");
    let warns = reports(|r| {
        r.message.starts_with(RESCUE_WARN) && r.field("object") == Some(object.as_str())
    });
    assert_eq!(warns.len(), 1, "{warns:#?}");
    assert_eq!(warns[0].field("controller"), Some("counted"));
}

/// The controller of the reconciles that block on another runtime.
const ELSEWHERE: &str = "elsewhere";

#[test]
fn a_long_poll_on_an_unwatched_runtime_is_not_named() {
    capture_reports();
    let (watched, watchdog) = watched_runtime();
    let unwatched = runtime(2);
    let lock = Arc::new(Mutex::new(()));
    let held = lock.lock().unwrap();
    // The watched reconcile wakes from a timer, tells the other to block too, and
    // blocks: both polls begin after the watched worker last published, and both are
    // long at the watchdog's look; only the runtime tells them apart.
    let go = Arc::new(tokio::sync::Notify::new());
    let blocking = Arc::new(AtomicBool::new(false));
    let watched_object = ObjectKey::namespaced("watched", "blocker");
    let other_object = ObjectKey::namespaced("unwatched", "blocker");
    let watched_reconcile = {
        let (lock, go) = (Arc::clone(&lock), Arc::clone(&go));
        watchdog.registry().controller("watched", "Widget").guard(
            watched_object.clone(),
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                go.notify_one();
                drop(lock.lock().unwrap());
                Ok::<(), ()>(())
            },
        )
    };
    let other_reconcile = {
        let (lock, go, blocking) = (Arc::clone(&lock), Arc::clone(&go), Arc::clone(&blocking));
        watchdog.registry().controller(ELSEWHERE, "Widget").guard(
            other_object.clone(),
            async move {
                go.notified().await;
                blocking.store(true, Ordering::SeqCst);
                drop(lock.lock().unwrap());
                Ok::<(), ()>(())
            },
        )
    };
    let other = unwatched.spawn(other_reconcile);
    let first = watched.spawn(watched_reconcile);
    support::eventually(PATIENCE, "both reconciles to block", || {
        blocking.load(Ordering::SeqCst).then_some(())
    });
    let name = format!("watched {}", watched_object.as_str());
    support::eventually(PATIENCE, "the rescue's WARN", || {
        reports(|r| r.message.starts_with(RESCUE_WARN) && r.message.contains(&name)).pop()
    });
    std::thread::sleep(Duration::from_secs(1));
    drop(held);
    for task in [
        watched.block_on(first).expect("the watched reconcile ends"),
        unwatched.block_on(other).expect("the other reconcile ends"),
    ] {
        task.expect("the guard lets it finish")
            .expect("it ends well");
    }
    drop(watchdog);
    let wrongly = reports(|r| {
        r.field("action") == Some("woke an idle worker")
            && (r.message.contains(ELSEWHERE) || r.field("controller") == Some(ELSEWHERE))
    });
    assert!(wrongly.is_empty(), "{wrongly:#?}");
}

/// A task's waker that says it was entered, then waits for `gate` (as a waker taking
/// an executor's lock would while a worker holds it).
struct GatedWaker {
    gate: Arc<Mutex<()>>,
    entered: AtomicBool,
}

impl std::task::Wake for GatedWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.entered.store(true, Ordering::SeqCst);
        drop(self.gate.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

#[test]
fn a_cancel_whose_waker_blocks_delays_no_rescue() {
    capture_reports();
    let runtime = runtime(4);
    let watchdog = Watchdog::builder()
        .interval(Duration::from_millis(50))
        .on_hang(HangPolicy::Cancel)
        .deadlines(
            Deadlines::new(Duration::from_secs(3600)).with("victim", Duration::from_millis(100)),
        )
        .watch_runtime(runtime.handle().clone())
        .start()
        .expect("the watchdog starts");
    // A reconcile polled by hand, whose task's waker blocks on a held gate: the
    // watchdog cancels it once overdue, and that cancel's wake does not return.
    let gate = Arc::new(Mutex::new(()));
    let closed = gate.lock().unwrap();
    let task = Arc::new(GatedWaker {
        gate: Arc::clone(&gate),
        entered: AtomicBool::new(false),
    });
    let victim = std::future::pending::<Result<(), ()>>();
    let mut victim = std::pin::pin!(
        watchdog
            .registry()
            .controller("victim", "Widget")
            .guard(ObjectKey::namespaced("cancel", "victim"), victim)
    );
    let task_waker = std::task::Waker::from(Arc::clone(&task));
    let mut cx = std::task::Context::from_waker(&task_waker);
    assert!(victim.as_mut().poll(&mut cx).is_pending());
    support::eventually(PATIENCE, "the cancel to block in the task's waker", || {
        task.entered.load(Ordering::SeqCst).then_some(())
    });
    // Now a reconcile blocks a worker: its rescue still comes, within the bound the
    // rescue test allows, while the cancel is still blocked.
    let controller = watchdog.registry().controller("beside-cancel", "Widget");
    let object = ObjectKey::namespaced("cancel", "blocker");
    let gap = blocked_worker::longest_tick_gap(&runtime, &controller, &object, BLOCK);
    assert!(gap < LONGEST_GAP, "timers stopped for {gap:?}");
    let warns = reports(|r| {
        r.message.starts_with(RESCUE_WARN) && r.field("object") == Some(object.as_str())
    });
    assert_eq!(warns.len(), 1, "{warns:#?}");
    drop(closed);
    assert!(matches!(
        victim.as_mut().poll(&mut cx),
        std::task::Poll::Ready(Err(reconcile_watchdog::guard::Error::Cancelled { .. }))
    ));
}

/// Spins for `length` without yielding: CPU work inside one poll.
fn spin(length: Duration) {
    let from = Instant::now();
    while from.elapsed() < length {
        std::hint::spin_loop();
    }
}

/// How long each queued reconcile waits between being built and its first poll.
const QUEUED_FOR: Duration = Duration::from_millis(30);

/// As kube's runner does: one task builds a batch of guarded reconciles, goes on with
/// other work (short polls, a yield between them) while they wait, then polls them all
/// in one of its polls, each for half a millisecond. Its worker is busy and silent for
/// longer than the rescue's threshold, and each batch's reconciles are first polled
/// [`QUEUED_FOR`] after they were built; none is ever inside a poll for more than 1 ms.
async fn queued_batches(controller: ControllerHandle, stop: Arc<AtomicBool>) -> u64 {
    let mut batch = 0;
    while !stop.load(Ordering::SeqCst) {
        let reconciles: Vec<_> = (0..40)
            .map(|n| {
                let object = ObjectKey::namespaced("queued", &format!("q-{batch}-{n}"));
                controller.guard(object, async {
                    spin(Duration::from_micros(500));
                    Ok::<(), ()>(())
                })
            })
            .collect();
        let built = Instant::now();
        while built.elapsed() < QUEUED_FOR {
            spin(Duration::from_micros(500));
            tokio::task::yield_now().await;
        }
        for done in futures::future::join_all(reconciles).await {
            done.expect("the guard lets it finish")
                .expect("the reconcile ends well");
        }
        batch += 1;
    }
    batch
}

#[test]
fn reconciles_queued_before_their_first_poll_are_no_rescue_and_a_true_block_among_them_is() {
    capture_reports();
    let (runtime, watchdog) = watched_runtime_with_metrics();
    let stop = Arc::new(AtomicBool::new(false));
    let batches = runtime.spawn(queued_batches(
        watchdog.registry().controller("queued", "Widget"),
        Arc::clone(&stop),
    ));
    let named_queued = || {
        reports(|r| {
            r.field("controller") == Some("queued")
                || r.message.contains("queued queued/")
                || r.field("object").is_some_and(|o| o.starts_with("queued/"))
        })
    };
    // Long enough for many of the busy worker's silent stretches, each of which the
    // rescue looks into.
    std::thread::sleep(Duration::from_secs(3));
    let rescues = rescues_after_a_scan(&watchdog);
    let busy = sample(
        &watchdog,
        "reconcile_watchdog_driver_wakes_total{cause=\"busy_worker\"}",
    );
    eprintln!("wakes for the busy worker: {busy:?}");
    assert_eq!(rescues, 0.0, "{:#?}", named_queued());
    assert!(named_queued().is_empty(), "{:#?}", named_queued());

    // A reconcile that truly blocks its worker for a second, in its second poll, while
    // the batches go on beside it: counted, and the WARN names it.
    let object = ObjectKey::namespaced("among-queued", "blocker");
    let controller = watchdog.registry().controller("blocker", "Widget");
    block_a_worker(&runtime, &controller, &object, Duration::from_secs(1));
    let rescues = rescues_after_a_scan(&watchdog);
    stop.store(true, Ordering::SeqCst);
    let batches = runtime.block_on(batches).expect("the batches' task ends");
    assert!(batches > 20, "{batches} batches");
    assert!(rescues >= 1.0, "{rescues}");
    let warns = reports(|r| {
        r.message.starts_with(RESCUE_WARN) && r.field("object") == Some(object.as_str())
    });
    assert_eq!(warns.len(), 1, "{warns:#?}");
    assert_eq!(warns[0].field("controller"), Some("blocker"));
    drop(watchdog);
    assert!(named_queued().is_empty(), "{:#?}", named_queued());
}

/// Spawns on the current runtime an unguarded task that runs `length` in one poll: a
/// busy worker that publishes nothing meanwhile, which no guarded reconcile holds.
fn spawn_silent_worker(length: Duration, spun: &Arc<AtomicBool>) {
    let spun = Arc::clone(spun);
    tokio::spawn(async move {
        spin(length);
        spun.store(true, Ordering::SeqCst);
    });
}

/// How long the busy worker beside a long poll elsewhere stays silent: many times the
/// rescue's threshold.
const SILENT_FOR: Duration = Duration::from_millis(400);

#[test]
fn a_poll_on_the_block_on_thread_is_never_named_for_a_silent_worker() {
    capture_reports();
    let (runtime, watchdog) = watched_runtime_with_metrics();
    let object = ObjectKey::namespaced("block-on", "main");
    let spun = Arc::new(AtomicBool::new(false));
    // As `#[tokio::main]` awaiting a controller in `main` would: a guarded reconcile
    // polled by `block_on` itself, on the caller's thread, no task of the runtime's.
    // Once in its long poll, it makes a worker busy and silent.
    let reconcile = {
        let spun = Arc::clone(&spun);
        watchdog
            .registry()
            .controller("block-on", "Widget")
            .guard(object.clone(), async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                spawn_silent_worker(SILENT_FOR, &spun);
                std::thread::sleep(SILENT_FOR + Duration::from_millis(200));
                Ok::<(), ()>(())
            })
    };
    runtime
        .block_on(reconcile)
        .expect("the guard lets it finish")
        .expect("the reconcile ends well");
    support::eventually(PATIENCE, "the silent worker to finish", || {
        spun.load(Ordering::SeqCst).then_some(())
    });
    let rescues = rescues_after_a_scan(&watchdog);
    let busy = sample(
        &watchdog,
        "reconcile_watchdog_driver_wakes_total{cause=\"busy_worker\"}",
    );
    let named =
        reports(|r| r.message.contains("block-on ") || r.field("controller") == Some("block-on"));
    assert!(named.is_empty(), "{named:#?}");
    assert_eq!(rescues, 0.0, "busy-worker wakes: {busy:?}");
    assert!(
        busy.is_some_and(|n| n >= 1.0),
        "the silent worker was woken for: {busy:?}"
    );
}

/// Where tokio names each worker's thread: a reconcile inside `block_in_place` has
/// handed its worker to another thread, and is never named for a worker that is silent
/// meanwhile. (Without `--cfg tokio_unstable` only a poll that began before the worker
/// last published is told apart: docs/runtime-rescue.md.)
#[cfg(tokio_unstable)]
#[test]
fn a_poll_inside_block_in_place_is_never_named_for_a_silent_worker() {
    capture_reports();
    let (runtime, watchdog) = watched_runtime_with_metrics();
    let object = ObjectKey::namespaced("block-in-place", "moved");
    let spun = Arc::new(AtomicBool::new(false));
    let reconcile = {
        let spun = Arc::clone(&spun);
        watchdog
            .registry()
            .controller("block-in-place", "Widget")
            .guard(object.clone(), async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                tokio::task::block_in_place(|| {
                    spawn_silent_worker(SILENT_FOR, &spun);
                    std::thread::sleep(SILENT_FOR + Duration::from_millis(200));
                });
                Ok::<(), ()>(())
            })
    };
    runtime
        .block_on(runtime.spawn(reconcile))
        .expect("the reconcile task ends")
        .expect("the guard lets it finish")
        .expect("the reconcile ends well");
    support::eventually(PATIENCE, "the silent worker to finish", || {
        spun.load(Ordering::SeqCst).then_some(())
    });
    let rescues = rescues_after_a_scan(&watchdog);
    let named = reports(|r| {
        r.message.contains("block-in-place ") || r.field("controller") == Some("block-in-place")
    });
    assert!(named.is_empty(), "{named:#?}");
    assert_eq!(rescues, 0.0);
}
