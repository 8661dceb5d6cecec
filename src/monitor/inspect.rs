//! Looks at the threads a report is about: for a reconcile stuck inside one poll for
//! long enough, the native stack and kernel state of the thread it is stuck on, once
//! per stuck poll, and only if that poll still runs when the capture is done.

use std::time::{Duration, Instant};

use crate::guard::{InFlight, PollState, Registry};
use crate::stack::{self, Frame, ThreadDiagnostics};

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

/// Inspects stuck threads for the monitor, remembering which polls it has captured.
#[derive(Debug)]
pub struct Inspector {
    config: Diagnostics,
    registry: Registry,
    /// The reconciles whose stack has been captured, each with the poll it was in (its
    /// poll count): a later report of the same stuck poll does not signal again.
    captured: Vec<(u64, u64)>,
}

impl Inspector {
    /// Inspects the reconciles of `registry` as `config` says.
    #[must_use]
    pub fn new(config: Diagnostics, registry: Registry) -> Self {
        Self {
            config,
            registry,
            captured: Vec::new(),
        }
    }

    /// The stuck threads `event` is about, inspected now: for a hang report, the
    /// thread of a reconcile stuck inside a poll for at least `stack_capture_after`;
    /// for a runtime-stall report, the thread of every reconcile inside a poll however
    /// long (the runtime is wedged already: these are the suspects). Empty for other
    /// events. A poll whose stack an earlier report captured is not captured again.
    pub fn inspect(&mut self, event: &Event, now: Instant) -> Vec<StuckThread> {
        let Some(after) = self.config.stack_capture_after else {
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
            if out.len() >= self.config.max_threads {
                break;
            }
            seen.push(tid);
            out.push(StuckThread {
                name: thread.name.to_string(),
                diagnostics: self.inspect_one(reconcile, tid),
            });
        }
        out
    }

    /// The kernel state of `tid`, and its stack unless this poll's was captured before;
    /// a stack captured while the poll ended is discarded.
    fn inspect_one(&mut self, reconcile: &InFlight, tid: u32) -> ThreadDiagnostics {
        let this_poll = (reconcile.id, reconcile.polls);
        if self.captured.contains(&this_poll) {
            return ThreadDiagnostics {
                tid,
                stack: Err(stack::Error::AlreadyCaptured),
                kernel: stack::KernelState::read(tid),
            };
        }
        self.captured.push(this_poll);
        let mut diagnostics =
            ThreadDiagnostics::of(tid, self.config.capture_timeout, is_guard_poll);
        if diagnostics.stack.is_ok() && !self.still_in(reconcile, tid) {
            diagnostics.stack = Err(stack::Error::Stale);
        }
        diagnostics
    }

    /// Whether `reconcile` is still inside the poll it was in at the scan, on `tid`: its
    /// poll count is the same and a poll runs (see `Entry::poll_begins` for why that
    /// pairs the thread with the poll).
    fn still_in(&self, reconcile: &InFlight, tid: u32) -> bool {
        self.registry.get(reconcile.id).is_some_and(|now| {
            now.polls == reconcile.polls
                && matches!(now.poll, PollState::InPoll { .. })
                && now.thread.and_then(|t| t.tid) == Some(tid)
        })
    }

    /// Forgets the captures of reconciles that are no longer in `attention` (the
    /// scan's overdue and stalled reconciles): their hang is over.
    pub fn forget_all_but(&mut self, attention: &[InFlight]) {
        self.captured
            .retain(|(id, _)| attention.iter().any(|r| r.id == *id));
    }
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
