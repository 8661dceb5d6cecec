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
pub(crate) struct StuckThread {
    /// The thread's name.
    pub name: String,
    /// Its stack and kernel state.
    pub diagnostics: ThreadDiagnostics,
}

/// How many times one stuck poll's stack is tried when each try fails for a reason
/// that can pass (another capture, the deadline, a thread that kept waking or left the
/// handler early): once per report of the hang, at most this many.
const MAX_CAPTURE_TRIES: u32 = 3;

/// Captures one thread's stack and kernel state: [`ThreadDiagnostics::of`], but for
/// tests.
type Capture = fn(u32, Duration) -> ThreadDiagnostics;

/// Inspects stuck threads for the monitor, remembering which polls it has captured.
#[derive(Debug)]
pub(crate) struct Inspector {
    config: Diagnostics,
    registry: Registry,
    /// The reconciles whose stack has been captured, each with the poll it was in (its
    /// poll count): a later report of the same stuck poll does not signal again.
    captured: Vec<(u64, u64)>,
    /// The polls whose captures failed for a passing reason, and how many times.
    tried: Vec<((u64, u64), u32)>,
    capture: Capture,
}

impl Inspector {
    /// Inspects the reconciles of `registry` as `config` says.
    #[must_use]
    pub(crate) fn new(config: Diagnostics, registry: Registry) -> Self {
        Self {
            config,
            registry,
            captured: Vec::new(),
            tried: Vec::new(),
            capture: |tid, timeout| ThreadDiagnostics::of(tid, timeout, is_guard_poll),
        }
    }

    /// The stuck threads `event` is about, inspected now: for a hang report, the
    /// thread of a reconcile stuck inside a poll for at least `stack_capture_after`;
    /// for a runtime-stall report, the thread of every reconcile inside a poll however
    /// long (the runtime is wedged already: these are the suspects). Empty for other
    /// events. A poll whose stack an earlier report captured is not captured again.
    pub(crate) fn inspect(&mut self, event: &Event, now: Instant) -> Vec<StuckThread> {
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
        let mut diagnostics = (self.capture)(tid, self.config.capture_timeout);
        match &diagnostics.stack {
            Err(stack::Error::Unsupported(_)) => {}
            Err(error) if error.may_pass() => {
                let tries = match self.tried.iter_mut().find(|(poll, _)| *poll == this_poll) {
                    Some((_, tries)) => {
                        *tries += 1;
                        *tries
                    }
                    None => {
                        self.tried.push((this_poll, 1));
                        1
                    }
                };
                if tries >= MAX_CAPTURE_TRIES {
                    self.captured.push(this_poll);
                }
            }
            _ => self.captured.push(this_poll),
        }
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
    pub(crate) fn forget_all_but(&mut self, attention: &[InFlight]) {
        self.captured
            .retain(|(id, _)| attention.iter().any(|r| r.id == *id));
        self.tried
            .retain(|((id, _), _)| attention.iter().any(|r| r.id == *id));
    }
}

/// Whether `frame` is the guard's poll. The frames below it are the runtime's, the
/// same for every hang, so they are left unresolved. Optimised builds name inlined
/// frames without their module path, so the source file is the surer sign.
pub(crate) fn is_guard_poll(frame: &Frame) -> bool {
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

#[cfg(all(test, feature = "stack-capture", target_os = "linux"))]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::mpsc;
    use std::task::{Context, Poll};

    use super::*;
    use crate::guard::ObjectKey;
    use crate::monitor::verdict::{Action, HangState};

    /// Each poll blocks its thread until the test lets it go, then asks to be polled
    /// again: one stuck poll after another, on one thread.
    struct BlocksEachPoll(mpsc::Receiver<()>);

    impl Future for BlocksEachPoll {
        type Output = Result<(), ()>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            if self.0.recv().is_err() {
                return Poll::Ready(Ok(()));
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// The reconcile as a scan sees it once it is inside poll number `polls`.
    fn in_poll(registry: &Registry, polls: u64) -> InFlight {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(r) = registry.snapshot().pop()
                && r.polls == polls
                && matches!(r.poll, PollState::InPoll { .. })
                && r.thread.as_ref().is_some_and(|t| t.tid.is_some())
            {
                return r;
            }
            assert!(Instant::now() < deadline, "never in poll {polls}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn hung(reconcile: &InFlight) -> Event {
        Event::Hung {
            reconcile: reconcile.clone(),
            state: HangState::InPoll,
            action: Action::FailLiveness,
        }
    }

    fn stuck_reconcile() -> (Registry, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let registry = Registry::new(Duration::from_secs(60));
        let (release, released) = mpsc::channel();
        let guarded = registry
            .controller("web", "Widget")
            .guard(ObjectKey::cluster("a"), BlocksEachPoll(released));
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime.block_on(guarded).unwrap().unwrap();
        });
        (registry, release, thread)
    }

    fn config() -> Diagnostics {
        Diagnostics {
            stack_capture_after: Some(Duration::ZERO),
            capture_timeout: Duration::from_secs(5),
            max_threads: 8,
        }
    }

    #[test]
    fn a_stuck_poll_is_captured_once_until_its_hang_is_forgotten() {
        let (registry, release, thread) = stuck_reconcile();
        let mut inspector = Inspector::new(config(), registry.clone());
        let first = in_poll(&registry, 1);
        let now = Instant::now();

        let shown = inspector.inspect(&hung(&first), now);
        let stack = shown[0].diagnostics.stack.as_ref().expect("a stack");
        assert!(stack.mentions("BlocksEachPoll"), "{stack}");
        let again = inspector.inspect(&hung(&first), now);
        assert!(
            matches!(
                again[0].diagnostics.stack,
                Err(stack::Error::AlreadyCaptured)
            ),
            "{:?}",
            again[0].diagnostics.stack
        );
        assert!(
            again[0].diagnostics.kernel.is_ok(),
            "the kernel state is still read"
        );

        // The next stuck poll is another hang of its own.
        release.send(()).unwrap();
        let second = in_poll(&registry, 2);
        inspector.forget_all_but(std::slice::from_ref(&second));
        assert!(
            inspector.inspect(&hung(&second), now)[0]
                .diagnostics
                .stack
                .is_ok()
        );

        // A reconcile gone from the scan is forgotten: its hang is over.
        inspector.forget_all_but(&[]);
        assert!(
            inspector.inspect(&hung(&second), now)[0]
                .diagnostics
                .stack
                .is_ok()
        );
        drop(release);
        thread.join().unwrap();
    }

    /// A capture that fails as if another capture held the lock, then succeeds for real.
    fn busy_then_captured(tid: u32, timeout: Duration) -> ThreadDiagnostics {
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        if CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
            return ThreadDiagnostics {
                tid,
                stack: Err(stack::Error::Busy),
                kernel: stack::KernelState::read(tid),
            };
        }
        ThreadDiagnostics::of(tid, timeout, is_guard_poll)
    }

    fn always_busy(tid: u32, _: Duration) -> ThreadDiagnostics {
        ThreadDiagnostics {
            tid,
            stack: Err(stack::Error::Busy),
            kernel: stack::KernelState::read(tid),
        }
    }

    #[test]
    fn a_capture_that_failed_for_a_passing_reason_is_tried_at_the_next_report() {
        let (registry, release, thread) = stuck_reconcile();
        let mut inspector = Inspector::new(config(), registry.clone());
        inspector.capture = busy_then_captured;
        let first = in_poll(&registry, 1);
        let now = Instant::now();
        let busy = inspector.inspect(&hung(&first), now);
        assert!(
            matches!(busy[0].diagnostics.stack, Err(stack::Error::Busy)),
            "{:?}",
            busy[0].diagnostics.stack
        );
        let retried = inspector.inspect(&hung(&first), now);
        let stack = retried[0].diagnostics.stack.as_ref().expect("a stack");
        assert!(stack.mentions("BlocksEachPoll"), "{stack}");

        // A poll whose captures keep failing is tried a bounded number of times.
        release.send(()).unwrap();
        let second = in_poll(&registry, 2);
        inspector.capture = always_busy;
        for _ in 0..MAX_CAPTURE_TRIES {
            let shown = inspector.inspect(&hung(&second), now);
            assert!(matches!(
                shown[0].diagnostics.stack,
                Err(stack::Error::Busy)
            ));
        }
        let shown = inspector.inspect(&hung(&second), now);
        assert!(
            matches!(
                shown[0].diagnostics.stack,
                Err(stack::Error::AlreadyCaptured)
            ),
            "{:?}",
            shown[0].diagnostics.stack
        );
        drop(release);
        thread.join().unwrap();
    }

    #[test]
    fn a_stack_captured_after_the_poll_changed_is_discarded() {
        let (registry, release, thread) = stuck_reconcile();
        let mut inspector = Inspector::new(config(), registry.clone());
        let first = in_poll(&registry, 1);
        // The scan saw poll 1; by the capture, poll 2 runs on the same thread: its
        // stack must not be shown as poll 1's.
        release.send(()).unwrap();
        in_poll(&registry, 2);
        let shown = inspector.inspect(&hung(&first), Instant::now());
        assert!(
            matches!(shown[0].diagnostics.stack, Err(stack::Error::Stale)),
            "{:?}",
            shown[0].diagnostics.stack
        );
        drop(release);
        thread.join().unwrap();
    }
}
