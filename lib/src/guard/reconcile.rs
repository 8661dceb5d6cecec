//! What observers read of a reconcile: the object it works on, how it ended, and a
//! point-in-time copy of it in flight. Plain types, apart from the registry's entry that
//! fills them, so that what reads them does not import the entry.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::thread::ThreadInfo;
use super::waits::{RequestWait, Waiting};

/// The object a reconcile works on, rendered once as `namespace/name` (or `name` for
/// cluster-scoped objects) so that every later copy is a reference count.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey(Arc<str>);

impl ObjectKey {
    /// A namespaced object, shown as `namespace/name`.
    #[must_use]
    pub fn namespaced(namespace: &str, name: &str) -> Self {
        Self(format!("{namespace}/{name}").into())
    }

    /// A namespaced object when `namespace` is given, a cluster-scoped one otherwise.
    #[must_use]
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        match namespace {
            Some(namespace) => Self::namespaced(namespace, name),
            None => Self::cluster(name),
        }
    }

    /// A cluster-scoped object, shown as its name.
    #[must_use]
    pub fn cluster(name: &str) -> Self {
        Self(name.into())
    }

    /// `namespace/name`, or `name` for a cluster-scoped object.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// How a guarded reconcile ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The reconcile returned `Ok`.
    Ok,
    /// The reconcile returned `Err`.
    Error,
    /// The reconcile panicked; the panic was caught.
    Panic,
    /// The watchdog cancelled it (`--on-hang cancel`).
    Cancelled,
    /// Its future was dropped before it finished (the caller gave up on it).
    Dropped,
}

impl Outcome {
    /// The lowercase name used in logs and metric labels.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Panic => "panic",
            Self::Cancelled => "cancelled",
            Self::Dropped => "dropped",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a reconcile is inside a poll right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollState {
    /// Not being polled: it is waiting for a wake-up.
    Awaiting,
    /// Inside a poll that began at this instant.
    InPoll {
        /// When the current poll began.
        since: Instant,
    },
    /// Not being polled, but woken since its latest poll began: its executor has not
    /// polled it again (a blocked worker, a stalled runtime).
    Woken {
        /// When it was woken first since its latest poll began.
        since: Instant,
    },
}

/// A point-in-time copy of one in-flight reconcile.
#[derive(Clone, Debug)]
pub struct InFlight {
    /// Names this reconcile in the registry. Unique among the reconciles in flight, and
    /// for the registry's life until 2^42 entries have been made (a registration makes
    /// one only when its thread has no idle entry of the controller to reuse): then
    /// entry keys wrap, passing over those in use, and a new entry's ids may repeat
    /// those of an entry long gone.
    pub id: u64,
    /// The controller that runs the reconcile.
    pub controller: Arc<str>,
    /// The kind of the object reconciled.
    pub kind: Arc<str>,
    /// The object reconciled.
    pub object: ObjectKey,
    /// How long it may take.
    pub deadline: Duration,
    /// When it was registered (monotonic).
    pub started: Instant,
    /// When it was registered (wall clock, for reports).
    pub started_at: SystemTime,
    /// How many times it has been polled.
    pub polls: u64,
    /// Inside a poll right now, or waiting for a wake-up.
    pub poll: PollState,
    /// When the latest poll began, if it was ever polled. (Its end is not recorded: that
    /// would cost a clock read per poll, and for a reconcile that waits, the poll before
    /// the wait is short beside the wait.)
    pub last_poll_began: Option<Instant>,
    /// The OS thread of the latest poll.
    pub thread: Option<ThreadInfo>,
    /// The tokio task of the first poll, when it ran inside one.
    pub task_id: Option<u64>,
    /// The watchdog has asked it to stop.
    pub cancel_requested: bool,
    /// It returned pending and every clone of its waker has been dropped since: it can
    /// never be woken.
    pub no_waker: bool,
    /// The oldest API request it sent that is still in flight, when a client layer
    /// attributes requests (`kube::requests`).
    pub request: Option<RequestWait>,
    /// The innermost labelled await pending at the end of its latest poll
    /// ([`label`](crate::label())).
    pub label: Option<&'static str>,
}

impl InFlight {
    /// Where it waits, the most telling fact first: no waker alive, then an API request
    /// in flight, then the innermost named await. `None` when nothing is known.
    #[must_use]
    pub fn waiting(&self) -> Option<Waiting<'_>> {
        if self.no_waker {
            return Some(Waiting::NoWaker);
        }
        if let Some(request) = &self.request {
            return Some(Waiting::Request(request));
        }
        self.label.map(Waiting::Label)
    }

    /// How long it has run at `now`.
    #[must_use]
    pub fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// Whether it has outlived its deadline at `now`.
    #[must_use]
    pub fn is_overdue(&self, now: Instant) -> bool {
        self.elapsed(now) > self.deadline
    }

    /// How long ago the latest poll began, if it was ever polled: for a reconcile
    /// inside a poll, how long it has been in it; for one that waits, about how long
    /// it has waited.
    #[must_use]
    pub fn last_poll_ago(&self, now: Instant) -> Option<Duration> {
        self.last_poll_began
            .map(|at| now.saturating_duration_since(at))
    }
}
