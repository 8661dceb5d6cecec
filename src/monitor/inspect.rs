//! Looks at the threads a report is about: for a reconcile stuck inside one poll for
//! long enough, the native stack and kernel state of the thread it is stuck on.

use std::time::{Duration, Instant};

use crate::guard::{InFlight, PollState};
use crate::stack::{Frame, ThreadDiagnostics};

use super::verdict::Event;

/// What the hang reports carry about stuck threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Diagnostics {
    /// A report of a reconcile that has been inside one poll for at least this long
    /// carries its thread's native stack and kernel state; `None` never looks.
    pub stack_capture_after: Option<Duration>,
    /// How long the monitor waits for one thread's stack before reporting without it.
    pub capture_timeout: Duration,
    /// The most threads one runtime-stall report looks at.
    pub max_threads: usize,
}

impl Default for Diagnostics {
    fn default() -> Self {
        Self {
            stack_capture_after: Some(Duration::from_secs(2)),
            capture_timeout: Duration::from_millis(250),
            max_threads: 8,
        }
    }
}

/// One stuck thread as a report shows it.
#[derive(Debug)]
pub struct StuckThread {
    /// The thread's name.
    pub name: String,
    /// Its stack and kernel state.
    pub diagnostics: ThreadDiagnostics,
}

/// The stuck threads `event` is about, inspected now: for a hang report, the thread of
/// a reconcile stuck inside a poll for at least `stack_capture_after`; for a
/// runtime-stall report, the thread of every reconcile inside a poll however long (the
/// runtime is wedged already: these are the suspects). Empty for other events.
#[must_use]
pub fn inspect(event: &Event, now: Instant, config: &Diagnostics) -> Vec<StuckThread> {
    let Some(after) = config.stack_capture_after else {
        return Vec::new();
    };
    let (reconciles, after): (Vec<&InFlight>, Duration) = match event {
        Event::Hung { reconcile, .. } | Event::StillHung { reconcile, .. } => {
            (vec![reconcile], after)
        }
        Event::Escalated {
            reconcile: Some(reconcile),
            ..
        } => (vec![reconcile], after),
        Event::RuntimeStalled { in_poll, .. } => (in_poll.iter().collect(), Duration::ZERO),
        _ => return Vec::new(),
    };
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for reconcile in reconciles {
        let PollState::InPoll { since } = reconcile.poll else {
            continue;
        };
        let Some(thread) = &reconcile.thread else {
            continue;
        };
        let Some(tid) = thread.tid else {
            continue;
        };
        if now.saturating_duration_since(since) < after || seen.contains(&tid) {
            continue;
        }
        if out.len() >= config.max_threads {
            break;
        }
        seen.push(tid);
        out.push(StuckThread {
            name: thread.name.to_string(),
            diagnostics: ThreadDiagnostics::of(tid, config.capture_timeout, is_guard_poll),
        });
    }
    out
}

/// Whether `frame` is the guard's poll. The frames below it are the runtime's, the
/// same for every hang, so they are left unresolved. Optimised builds name inlined
/// frames without their module path, so the source file is the surer sign.
fn is_guard_poll(frame: &Frame) -> bool {
    frame
        .file
        .as_deref()
        .is_some_and(|file| file.ends_with(GUARDED_SOURCE))
        || frame
            .function
            .as_deref()
            .is_some_and(|f| f.starts_with("<reconcile_watchdog::guard::guarded::Guarded<"))
}

/// The source file of [`crate::guard::Guarded`], relative to the crate.
const GUARDED_SOURCE: &str = "src/guard/guarded.rs";
