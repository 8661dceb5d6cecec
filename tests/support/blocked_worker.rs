//! The runtime rescue's scenario, shared by its test (`tests/driver_rescue.rs`) and its
//! benchmark (`benches/load/rescue.rs`): a guarded reconcile woken by a timer that then
//! blocks its worker, beside an unrelated interval.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reconcile_watchdog::guard::{ControllerHandle, ObjectKey};

/// The unrelated interval's period.
pub const TICK: Duration = Duration::from_millis(25);

/// How long a step of the scenario may take to happen: generous, for a busy machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// On `runtime`, an interval ticking every [`TICK`], and a reconcile of `object` under
/// `controller` that sleeps 10 ms (woken by the time driver) and then blocks its worker
/// on a std lock for `block`. Returns the longest gap between ticks meanwhile.
pub fn longest_tick_gap(
    runtime: &tokio::runtime::Runtime,
    controller: &ControllerHandle,
    object: &ObjectKey,
    block: Duration,
) -> Duration {
    let ticks = Arc::new(Mutex::new(Vec::new()));
    let ticker = {
        let ticks = Arc::clone(&ticks);
        runtime.spawn(async move {
            let mut interval = tokio::time::interval(TICK);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                ticks.lock().unwrap().push(Instant::now());
            }
        })
    };
    wait_for("the ticker to tick", || {
        (ticks.lock().unwrap().len() >= 4).then_some(())
    });

    let lock = Arc::new(Mutex::new(()));
    let held = lock.lock().unwrap();
    let blocked_at = Arc::new(Mutex::new(None));
    let reconcile = {
        let (lock, blocked_at) = (Arc::clone(&lock), Arc::clone(&blocked_at));
        controller.guard(object.clone(), async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            *blocked_at.lock().unwrap() = Some(Instant::now());
            drop(lock.lock().unwrap());
            Ok::<(), ()>(())
        })
    };
    let reconcile = runtime.spawn(reconcile);
    let from = wait_for("the reconcile to block", || *blocked_at.lock().unwrap());
    std::thread::sleep(block);
    drop(held);
    let to = Instant::now();
    runtime
        .block_on(reconcile)
        .expect("the reconcile task ends")
        .expect("the guard lets it finish")
        .expect("the reconcile ends well");
    ticker.abort();
    let ticks = ticks.lock().unwrap().clone();
    longest_gap(&ticks, from, to)
}

/// The longest time between consecutive `ticks` around `from..to` (`to` counts as a
/// tick).
fn longest_gap(ticks: &[Instant], from: Instant, to: Instant) -> Duration {
    // The last tick before `from`, every tick up to `to`, and `to` itself: a ticker
    // stopped for good shows up as a gap up to `to`.
    let mut around: Vec<Instant> = ticks
        .iter()
        .copied()
        .filter(|t| *t <= from)
        .max()
        .into_iter()
        .collect();
    around.extend(ticks.iter().copied().filter(|t| *t > from && *t <= to));
    around.push(to);
    around
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .max()
        .unwrap_or_default()
}

/// Polls `f` every millisecond until it returns Some; panics after [`PATIENCE`].
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = f() {
            return value;
        }
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
