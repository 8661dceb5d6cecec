//! One reconcile blocking a worker does not freeze the operator: with the library as an
//! embedder uses it, a reconcile woken by a timer that then blocks its worker leaves
//! an unrelated interval ticking, because the watchdog wakes an idle worker to drive
//! timers and I/O; on a current-thread runtime nobody can, and the stall is reported.

mod support;

use support::blocked_worker;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::{ControllerHandle, ObjectKey};
use reconcile_watchdog::monitor::report;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// How long any eventual outcome may take: generous, for a busy two-core machine.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long the blocking reconcile holds its worker.
const BLOCK: Duration = Duration::from_millis(800);
/// The longest gap between its ticks a round may show: timers kept going.
const LONGEST_GAP: Duration = Duration::from_millis(500);
const RESCUE_WARN: &str = "a reconcile blocked a runtime worker in one poll";

/// One report, as written.
#[derive(Clone, Debug)]
struct Report {
    level: tracing::Level,
    message: String,
    fields: BTreeMap<String, String>,
}

impl Report {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

static REPORTS: Mutex<Vec<Report>> = Mutex::new(Vec::new());

struct Capture;

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let target = event.metadata().target();
        if target != report::TARGET && target != report::RUNTIME_TARGET {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        REPORTS.lock().unwrap().push(Report {
            level: *event.metadata().level(),
            message,
            fields,
        });
    }
}

/// The monitor logs from its own thread: the capture is the global subscriber.
fn capture_reports() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
            .expect("the only global subscriber of this test binary");
    });
}

fn reports(matches: impl Fn(&Report) -> bool) -> Vec<Report> {
    REPORTS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| matches(r))
        .cloned()
        .collect()
}

/// A multi-thread runtime of 4 workers, and a watchdog watching it with its defaults.
fn watched_runtime() -> (tokio::runtime::Runtime, Watchdog) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    let watchdog = Watchdog::builder()
        .watch_runtime(runtime.handle().clone())
        .start()
        .expect("the watchdog starts");
    (runtime, watchdog)
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
