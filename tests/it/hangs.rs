//! Every kind of hang against the real monitor: classified, reported once with its
//! diagnostics, cancelled where it can be, escalated where it cannot, and the registry
//! and health state clean afterwards.

mod rig;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use reconcile_watchdog::guard::{self, Guarded, ObjectKey};
use reconcile_watchdog::internals::{Config, RuntimeHeartbeat};
use reconcile_watchdog::monitor::HangPolicy;
use rig::{
    DEADLINE, INTERVAL, NOT_INTERRUPTED, Report, Rig, SIGNALLED_RUNNING, assert_captured_once,
    assert_stack_shows, dump, eventually, report_of, reports, reports_of, runtime,
};
use tracing::Level;

fn object(name: &str) -> ObjectKey {
    ObjectKey::namespaced("test", name)
}

/// `reconcile` of `object(name)` under a guard of `controller`.
fn guarded<F, T, E>(rig: &Rig, controller: &str, name: &str, reconcile: F) -> Guarded<F>
where
    F: Future<Output = Result<T, E>>,
{
    rig.registry
        .controller(controller, "ConfigMap")
        .guard(object(name), reconcile)
}

/// Whether `r` announces a new hang (ERROR, once per hang).
fn is_hang_report(r: &Report) -> bool {
    r.is(Level::ERROR, "reconcile hung:")
}

/// The reports about `controller` that announce a new hang.
fn hung_reports(controller: &str) -> usize {
    reports_of(controller)
        .iter()
        .filter(|r| is_hang_report(r))
        .count()
}

/// The first hang report about `controller`, once it is written.
fn hang_report(controller: &str) -> Report {
    report_of(controller, "the hang report", is_hang_report)
}

/// The report that a hung reconcile of `controller` ended, once it is written.
fn end_report(controller: &str) -> Report {
    report_of(controller, "the end report", |r| {
        r.message.starts_with("reconcile ended")
    })
}

/// Sets its flag when dropped, a panic included.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[inline(never)]
fn lock_b_while_holding_a(a: &Mutex<()>, b: &Mutex<()>) {
    let _a = a.lock().unwrap();
    drop(b.lock().unwrap());
}

#[inline(never)]
fn sleep_through_the_deadline(woken: &AtomicBool) {
    // Blocking sleeps, as long as the test needs: one long sleep could end before a
    // slow machine has looked. Each lasts a second, so that the thread is almost never
    // caught between two (running, or waiting for a core on a loaded machine), where
    // it is neither asleep nor in `nanosleep`.
    while !woken.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[inline(never)]
fn spin_without_yielding(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        std::hint::spin_loop();
    }
}

#[inline(never)]
fn block_worker_on(lock: &Mutex<()>) {
    drop(lock.lock().unwrap());
}

#[test]
fn a_future_pending_forever_is_awaiting_and_fails_liveness_under_restart() {
    const C: &str = "pending-forever";
    let rig = Rig::new(HangPolicy::Restart);
    let rt = runtime(2);
    let task = rt.spawn(guarded(
        &rig,
        C,
        "a",
        std::future::pending::<Result<(), ()>>(),
    ));

    let hung = hang_report(C);
    assert_eq!(hung.field("state"), Some("awaiting"), "{}", dump(C));
    assert_eq!(hung.field("object"), Some("test/a"));
    assert_eq!(hung.field("action"), Some("failing liveness (restart)"));
    // Not stuck on a thread: nothing to capture.
    assert_eq!(hung.field("stack"), None);
    let failure = eventually("reconcilers to fail", || rig.check("reconcilers").err());
    assert!(
        failure.contains("test/a") && failure.contains("awaiting"),
        "{failure}"
    );

    // Reminders come each further deadline, but the hang is announced once.
    report_of(C, "a reminder", |r| {
        r.is(Level::WARN, "reconcile still hung:")
    });
    assert_eq!(hung_reports(C), 1, "{}", dump(C));

    task.abort();
    let ended = end_report(C);
    assert_eq!(ended.field("outcome"), Some("dropped"));
    rig.wait_clean();
}

#[test]
fn a_future_that_drops_its_waker_is_reported_never_wakeable_at_its_deadline() {
    const C: &str = "waker-dropped";
    const KEPT: &str = "waker-kept";
    let rig = Rig::new(HangPolicy::Restart);
    let rt = runtime(2);
    // Returns pending and keeps no clone of its waker: nothing can ever wake it.
    let dropped = std::future::poll_fn(|_| std::task::Poll::<Result<(), ()>>::Pending);
    let dropped = rt.spawn(guarded(&rig, C, "a", dropped));
    // Waits on a channel whose sender lives: its waker is held there.
    let (_sender, receiver) = tokio::sync::oneshot::channel::<()>();
    let kept = rt.spawn(guarded(&rig, KEPT, "b", async move {
        receiver.await.map_err(|_| ())
    }));

    let hung = hang_report(C);
    assert_eq!(hung.field("state"), Some("awaiting"), "{}", dump(C));
    assert_eq!(hung.field("waker"), Some("none"), "{}", dump(C));
    assert!(
        hung.message.ends_with("no waker alive: it can never wake"),
        "{}",
        hung.message
    );
    // At its deadline like any other hang, not before.
    let elapsed = humantime::parse_duration(hung.field("elapsed").unwrap()).unwrap();
    assert!(elapsed >= DEADLINE, "reported after {elapsed:?}");

    let other = hang_report(KEPT);
    assert_eq!(other.field("waker"), None, "{}", dump(KEPT));
    assert!(
        other
            .message
            .ends_with("waiting on an await that never woke"),
        "{}",
        other.message
    );
    dropped.abort();
    kept.abort();
    rig.wait_clean();
}

#[test]
fn a_labelled_await_that_never_completes_is_named() {
    const C: &str = "labelled";
    let rig = Rig::new(HangPolicy::Restart);
    let rt = runtime(2);
    let (_sender, receiver) = tokio::sync::oneshot::channel::<()>();
    let reconcile = async move {
        reconcile_watchdog::label("waiting for the cert issuer", receiver)
            .await
            .map_err(|_| ())
    };
    let task = rt.spawn(guarded(&rig, C, "a", reconcile));
    let hung = hang_report(C);
    assert_eq!(
        hung.field("label"),
        Some("waiting for the cert issuer"),
        "{}",
        dump(C)
    );
    assert!(
        hung.message
            .ends_with("waiting in the await labelled \"waiting for the cert issuer\""),
        "{}",
        hung.message
    );
    task.abort();
    rig.wait_clean();
}

#[test]
fn a_tokio_mutex_never_released_is_cancelled_within_an_interval_and_liveness_stays_green() {
    const C: &str = "tokio-mutex";
    let rig = Rig::new(HangPolicy::Cancel);
    let rt = runtime(2);
    let lock = Arc::new(tokio::sync::Mutex::new(()));
    let held = rt.block_on(Arc::clone(&lock).lock_owned());
    let reconcile = {
        let lock = Arc::clone(&lock);
        async move {
            let _guard = lock.lock().await;
            Ok::<_, String>("reconciled")
        }
    };
    let task = rt.spawn(guarded(&rig, C, "b", reconcile));

    // Liveness is sampled all along: the cancel must land before escalation would.
    let mut liveness_failures = Vec::new();
    eventually("the reconcile to be cancelled", || {
        if let Err(e) = rig.check("reconcilers") {
            liveness_failures.push(e);
        }
        task.is_finished().then_some(())
    });
    let outcome = rt.block_on(task).expect("the task did not panic");
    match outcome {
        Err(guard::Error::Cancelled { after }) => assert!(after >= DEADLINE, "{after:?}"),
        other => panic!("expected guard::Error::Cancelled, got {other:?}"),
    }
    assert!(
        liveness_failures.is_empty(),
        "liveness failed: {liveness_failures:?}"
    );

    let hung = hang_report(C);
    assert_eq!(hung.field("state"), Some("awaiting"));
    assert_eq!(
        hung.field("action"),
        Some("cancel requested; the controller will requeue it")
    );
    let ended = end_report(C);
    assert_eq!(ended.field("outcome"), Some("cancelled"));
    assert_eq!(hung_reports(C), 1, "{}", dump(C));
    assert!(
        reports_of(C)
            .iter()
            .all(|r| !r.message.contains("escalated")),
        "{}",
        dump(C)
    );
    drop(held);
    rig.wait_clean();
}

#[test]
fn a_std_mutex_deadlock_is_in_poll_shows_its_stack_and_escalates_under_cancel() {
    const C: &str = "std-deadlock";
    let rig = Rig::new(HangPolicy::Cancel);
    let rt = runtime(2);
    let a = Arc::new(Mutex::new(()));
    let b = Arc::new(Mutex::new(()));
    let released = Arc::new(AtomicBool::new(false));
    // A failed assertion must not leave the worker deadlocked: the runtime's drop
    // would wait for it forever.
    let _release_on_failure = SetOnDrop(Arc::clone(&released));
    // The other side of the deadlock: holds B and wants A, until the test releases it.
    let both_locked = Arc::new(Barrier::new(2));
    let other = {
        let (a, b, released, both_locked) = (
            Arc::clone(&a),
            Arc::clone(&b),
            Arc::clone(&released),
            Arc::clone(&both_locked),
        );
        std::thread::spawn(move || {
            let b = b.lock().unwrap();
            both_locked.wait();
            while !released.load(Ordering::SeqCst) {
                if let Ok(a) = a.try_lock() {
                    drop(a);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            drop(b);
        })
    };
    both_locked.wait();
    let task = {
        let (a, b) = (Arc::clone(&a), Arc::clone(&b));
        rt.spawn(guarded(&rig, C, "c", async move {
            lock_b_while_holding_a(&a, &b);
            Ok::<_, String>(())
        }))
    };

    let hung = hang_report(C);
    assert_eq!(hung.field("state"), Some("in-poll"), "{}", dump(C));
    assert!(
        hung.field("action").unwrap().contains("cannot see it"),
        "{}",
        dump(C)
    );
    assert_stack_shows(
        hung.field("stack"),
        &["lock_b_while_holding_a", "Mutex<T>::lock", NOT_INTERRUPTED],
    );
    let kernel = hung.field("kernel_state").expect("kernel state");
    assert!(kernel.starts_with("state S"), "{kernel}");
    assert!(hung.field("thread").unwrap().contains("hang-test-worker"));

    // It cannot see the cancel: one interval later liveness fails, and the report
    // says so.
    let escalated = report_of(C, "the escalation", |r| {
        r.is(Level::ERROR, "reconcile hang escalated:")
    });
    assert!(
        escalated
            .field("reason")
            .unwrap()
            .contains("after the cancel request"),
        "{}",
        dump(C)
    );
    assert_captured_once(escalated.field("stack"));
    assert!(escalated.field("kernel_state").is_some(), "{}", dump(C));
    let failure = eventually("reconcilers to fail", || rig.check("reconcilers").err());
    assert!(failure.contains("test/c"), "{failure}");
    assert_eq!(hung_reports(C), 1, "{}", dump(C));

    released.store(true, Ordering::SeqCst);
    other.join().unwrap();
    // The poll that was stuck finishes the reconcile: it returns its own result.
    assert!(matches!(rt.block_on(task).unwrap(), Ok(Ok(()))));
    let ended = end_report(C);
    assert_eq!(ended.field("outcome"), Some("ok"));
    rig.wait_clean();
}

#[test]
fn a_long_blocking_sleep_is_in_poll_with_its_stack_and_fails_liveness_until_it_ends() {
    const C: &str = "blocking-sleep";
    let rig = Rig::new(HangPolicy::Restart);
    let rt = runtime(2);
    let woken = Arc::new(AtomicBool::new(false));
    let _wake_on_failure = SetOnDrop(Arc::clone(&woken));
    let task = {
        let woken = Arc::clone(&woken);
        rt.spawn(guarded(&rig, C, "d", async move {
            sleep_through_the_deadline(&woken);
            Ok::<_, String>(())
        }))
    };

    let failure = eventually("reconcilers to fail", || rig.check("reconcilers").err());
    assert!(
        failure.contains("test/d") && failure.contains("in-poll"),
        "{failure}"
    );
    let hung = hang_report(C);
    assert_eq!(hung.field("state"), Some("in-poll"), "{}", dump(C));
    assert_stack_shows(
        hung.field("stack"),
        &["sleep_through_the_deadline", "nanosleep", NOT_INTERRUPTED],
    );
    let kernel = hung.field("kernel_state").expect("kernel state");
    assert!(kernel.starts_with("state S"), "{kernel}");
    assert!(
        !kernel.contains("syscall futex"),
        "a sleep is not a lock: {kernel}"
    );

    woken.store(true, Ordering::SeqCst);
    assert!(matches!(rt.block_on(task).unwrap(), Ok(Ok(()))));
    let ended = end_report(C);
    assert_eq!(ended.field("outcome"), Some("ok"));
    assert_eq!(hung_reports(C), 1, "{}", dump(C));
    rig.wait_clean();
}

#[test]
fn a_busy_loop_is_in_poll_running_and_only_reported_under_report() {
    const C: &str = "busy-loop";
    let rig = Rig::new(HangPolicy::Report);
    let rt = runtime(2);
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_failure = SetOnDrop(Arc::clone(&stop));
    let task = {
        let stop = Arc::clone(&stop);
        rt.spawn(guarded(&rig, C, "e", async move {
            spin_without_yielding(&stop);
            Ok::<_, String>(())
        }))
    };

    let mut liveness_failures = Vec::new();
    let hung = eventually("the hang report", || {
        if let Err(e) = rig.check("reconcilers") {
            liveness_failures.push(e);
        }
        reports_of(C).into_iter().find(is_hang_report)
    });
    assert_eq!(hung.field("state"), Some("in-poll"), "{}", dump(C));
    assert_eq!(hung.field("action"), Some("reported only"));
    assert_stack_shows(
        hung.field("stack"),
        &["spin_without_yielding", SIGNALLED_RUNNING],
    );
    let kernel = hung.field("kernel_state").expect("kernel state");
    assert!(kernel.contains("running"), "{kernel}");

    stop.store(true, Ordering::Relaxed);
    assert!(matches!(rt.block_on(task).unwrap(), Ok(Ok(()))));
    assert!(liveness_failures.is_empty(), "{liveness_failures:?}");
    assert_eq!(hung_reports(C), 1, "{}", dump(C));
    rig.wait_clean();
}

#[test]
fn an_object_cancelled_n_times_within_the_window_fails_liveness_until_the_window_passes() {
    const C: &str = "cancelled-often";
    let window = Duration::from_secs(3);
    let rig = Rig::with(
        Config {
            interval: INTERVAL,
            policy: HangPolicy::Cancel,
            cancel_limit: 2,
            cancel_window: window,
            ..Config::default()
        },
        DEADLINE,
        None,
    );
    let rt = runtime(2);
    let handle = rig.registry.controller(C, "ConfigMap");
    // The controller requeues the object after each cancellation, and it hangs again.
    for attempt in 1..=2 {
        let outcome =
            rt.block_on(handle.guard(object("f"), std::future::pending::<Result<(), ()>>()));
        assert!(
            matches!(outcome, Err(guard::Error::Cancelled { .. })),
            "attempt {attempt}: {outcome:?}"
        );
    }
    let failure = eventually("reconcilers to fail", || rig.check("reconcilers").err());
    assert!(
        failure.contains("test/f cancelled 2 times within 3s"),
        "{failure}"
    );
    let escalated = report_of(C, "the escalation", |r| {
        r.is(Level::ERROR, "reconcile hang escalated:")
    });
    assert!(
        escalated
            .field("reason")
            .unwrap()
            .contains("cancelled 2 times"),
        "{}",
        dump(C)
    );
    assert_eq!(hung_reports(C), 2, "{}", dump(C));
    // Once the window has passed, the object is forgiven.
    rig.wait_clean();
}

#[test]
fn a_wedged_runtime_fails_the_runtime_check_and_reports_every_stuck_worker_once() {
    let rt = runtime(2);
    let threshold = Duration::from_millis(300);
    let heartbeat = RuntimeHeartbeat::spawn(rt.handle(), INTERVAL / 2);
    let rig = Rig::with(
        Config {
            interval: INTERVAL,
            runtime_stall_threshold: threshold,
            ..Config::default()
        },
        // Long enough that only the runtime check speaks.
        Duration::from_secs(600),
        Some(heartbeat),
    );
    eventually("a fresh heartbeat", || rig.check("runtime").ok());
    let stalled_reports = || reports(|r| r.message.starts_with("async runtime stalled"));
    let before = stalled_reports().len();

    let lock = Arc::new(Mutex::new(()));
    let held = lock.lock().unwrap();
    let tasks: Vec<_> = (0..2)
        .map(|n| {
            let lock = Arc::clone(&lock);
            rt.spawn(rig.registry.controller("wedge", "ConfigMap").guard(
                object(&format!("w{n}")),
                async move {
                    block_worker_on(&lock);
                    Ok::<_, String>(())
                },
            ))
        })
        .collect();

    let failure = eventually("the runtime check to fail", || rig.check("runtime").err());
    assert!(failure.contains("async runtime heartbeat is"), "{failure}");
    let stalled = eventually("the stall report", || {
        stalled_reports().into_iter().nth(before)
    });
    assert_eq!(stalled.level, Level::ERROR);
    assert_eq!(stalled.field("workers"), Some("2"));
    let in_poll = stalled.field("in_poll").unwrap();
    assert!(
        in_poll.contains("test/w0") && in_poll.contains("test/w1"),
        "{in_poll}"
    );
    let stack = stalled.field("stack").expect("stacks");
    assert_eq!(
        stack.matches("thread hang-test-worker").count(),
        2,
        "{stack}"
    );
    if cfg!(all(feature = "stack-capture", target_os = "linux")) {
        assert_eq!(stack.matches("block_worker_on").count(), 2, "{stack}");
        assert_eq!(stack.matches(NOT_INTERRUPTED).count(), 2, "{stack}");
    }
    assert!(stalled.field("kernel_state").unwrap().contains("state S"));
    // While it stays wedged, there is no second report.
    std::thread::sleep(INTERVAL * 4);
    assert_eq!(stalled_reports().len(), before + 1);

    drop(held);
    for task in tasks {
        assert!(matches!(rt.block_on(task).unwrap(), Ok(Ok(()))));
    }
    eventually("the recovery report", || {
        reports(|r| r.message.starts_with("async runtime recovered"))
            .into_iter()
            .next()
    });
    rig.wait_clean();
}
