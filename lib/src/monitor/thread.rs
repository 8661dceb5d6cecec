//! The monitor thread's loop: a scan each tick, its result published, and between
//! ticks the runtime rescue's checks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::HangPolicy;
use super::rescue::{Rescuer, rescue_after};
use super::scan::{Scanner, Sources};
use super::status::Status;
use super::verdict::Verdict;
use super::waker::Waker;
use crate::guard::Registry;

/// Clears `alive` however the thread ends, a panic included.
struct AliveFlag<'a>(&'a AtomicBool);

impl Drop for AliveFlag<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// How soon the monitor tries again to publish a scan's state that a check kept it
/// from publishing.
const PUBLISH_RETRY: Duration = Duration::from_millis(1);

pub(super) fn run(
    registry: &Registry,
    status: &Status,
    stop: &AtomicBool,
    verdict: Verdict,
    sources: &Sources<'_>,
) {
    let _alive = AliveFlag(&status.alive);
    let interval = verdict.config().interval;
    let mut next = Instant::now();
    let mut scanner = Scanner::new(registry, verdict, sources);
    let config = scanner.verdict().config();
    let rescue = config.driver_rescue_after;
    // Cancels and the rescue's wakes each go through a thread of their own: the monitor
    // waits on neither the runtime's locks nor a task's waker, and a rescue never waits
    // behind a cancel.
    let cancels = matches!(config.policy, HangPolicy::Cancel);
    let rescued = sources
        .runtime
        .filter(|r| rescue_after(r, rescue).is_some());
    let waker = (cancels || rescued.is_some())
        .then(|| Waker::start(registry, cancels, rescued.map(|r| &r.handle)));
    let mut rescuer = rescued
        .zip(waker.as_ref())
        .and_then(|(r, waker)| Rescuer::new(r, rescue, waker));
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        status.beat.beat(now);
        let scanned = scanner.scan(now, next, status, waker.as_ref(), rescuer.as_mut());
        // Kept while a check holds the lock it is published under.
        let mut unpublished = Some(Arc::new(scanned));
        status.try_publish(&mut unpublished);

        // Sleep to the next tick, checking the runtime's workers meanwhile; park so
        // that `stop` can wake us early. A thread that fell behind (suspended, starved)
        // starts afresh instead of scanning in a burst.
        next = (next + interval).max(Instant::now());
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= next {
                break;
            }
            let mut wake = rescuer
                .as_mut()
                .map_or(next, |r| r.check_if_due(now, registry).min(next));
            if unpublished.is_some() {
                status.try_publish(&mut unpublished);
                if unpublished.is_some() {
                    wake = wake.min(now + PUBLISH_RETRY);
                }
            }
            std::thread::park_timeout(wake.saturating_duration_since(now));
        }
    }
    if let Some(rescuer) = rescuer.as_mut() {
        rescuer.flush_all();
    }
}
