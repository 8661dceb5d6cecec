//! A scrape never waits on the monitor: with the monitor stalled in its log writer, a
//! scrape of the metrics (which runs every health check) returns at once and reports the
//! monitor late.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::{Deadlines, ObjectKey};
use reconcile_watchdog::internals::report;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// How long any eventual outcome may take: generous, for a busy two-core machine.
const PATIENCE: Duration = Duration::from_secs(30);
/// The monitor's interval: the old grace of the `watchdog` check waited up to this long.
const INTERVAL: Duration = Duration::from_secs(1);
/// Scrapes taken while the monitor is stalled.
const SCRAPES: u32 = 10;
/// What those scrapes may take together: generous per scrape (a few hundred
/// milliseconds each on a busy machine), and far below one interval each.
const SCRAPES_TAKE_AT_MOST: Duration = Duration::from_secs(4);

/// The log writer: a hang report waits while the gate is held, as a write to a full
/// pipe would.
struct BlockingWriter {
    gate: Arc<Mutex<()>>,
    entered: Arc<Mutex<bool>>,
}

impl<S: tracing::Subscriber> Layer<S> for BlockingWriter {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() == report::TARGET {
            *self.entered.lock().unwrap() = true;
            drop(self.gate.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }
}

fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_scrape_while_the_monitor_is_stalled_returns_at_once_and_says_it_is_late() {
    let gate = Arc::new(Mutex::new(()));
    let entered = Arc::new(Mutex::new(false));
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let writer = BlockingWriter {
            gate: Arc::clone(&gate),
            entered: Arc::clone(&entered),
        };
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(writer))
            .expect("the only global subscriber of this test's process");
    });
    let watchdog = Watchdog::builder()
        .interval(INTERVAL)
        .deadlines(Deadlines::new(Duration::from_millis(100)))
        .collect_metrics()
        .start()
        .expect("the watchdog starts");
    let metrics = watchdog.metrics().expect("collected");
    let watchdog_passing = |text: &str| {
        text.lines().find_map(|line| {
            line.strip_prefix(
                "reconcile_watchdog_health_check_passing{probe=\"healthz\",check=\"watchdog\"} ",
            )
            .map(str::to_owned)
        })
    };
    assert_eq!(watchdog_passing(&metrics.encode()).as_deref(), Some("1"));

    // Held after the watchdog is made, so dropped before it (whose drop waits for the
    // monitor) however the test ends.
    let closed = gate.lock().unwrap();
    // Overdue at 100 ms: the monitor's hang report waits in the log writer.
    let _hung = watchdog
        .registry()
        .controller("stalls-the-monitor", "Widget")
        .register(ObjectKey::namespaced("ns", "hung"));
    eventually("the monitor to block in its log writer", || {
        entered.lock().unwrap().then_some(())
    });
    // Past three intervals without a scan, the monitor is late: every scrape says so,
    // and none waits for it.
    eventually("the scrape to report the monitor late", || {
        (watchdog_passing(&metrics.encode()).as_deref() == Some("0")).then_some(())
    });
    let from = Instant::now();
    for _ in 0..SCRAPES {
        assert_eq!(watchdog_passing(&metrics.encode()).as_deref(), Some("0"));
    }
    let took = from.elapsed();
    assert!(
        took < SCRAPES_TAKE_AT_MOST,
        "{SCRAPES} scrapes of a stalled monitor took {took:?}"
    );
    assert_eq!(
        watchdog
            .health()
            .liveness
            .run_one("watchdog")
            .map(|r| r.is_err()),
        Some(true)
    );

    drop(closed);
    eventually("the monitor to scan again", || {
        (watchdog_passing(&metrics.encode()).as_deref() == Some("1")).then_some(())
    });
}
